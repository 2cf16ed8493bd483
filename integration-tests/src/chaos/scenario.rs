//! The faults a round injects, and the time each one allows for a new term.

use std::time::Duration;

use leader_core::Timing;
use serde::Serialize;

use super::BackendKind;

/// Slack on every timing bound, for process scheduling on a loaded machine.
pub const SLACK: Duration = Duration::from_secs(1);

/// One fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Scenario {
    /// SIGKILL the leader: a new term within `ttl + retry_every` (+ slack).
    Kill,
    /// SIGSTOP the leader past its ttl, then SIGCONT: its later writes are rejected or not
    /// made, and it notices that its term ended.
    Stop,
    /// Blackhole the leader's proxy: it steps down by its deadline, and a follower takes over
    /// only after that, within `ttl + retry_every` (+ slack).
    Partition,
    /// Blackhole every proxy for longer than the ttl, then heal: nobody acts without a term,
    /// and a leader is back within `ttl + 2 x retry_every` (+ slack) of the heal.
    Stall,
    /// 30 % of requests answered 503 for a while: no invariant breaks, a leader afterwards.
    Throttle,
    /// SIGTERM the leader: handover within one poll, `1.1 x poll_every` (+ slack).
    Term,
    /// 20 % of requests applied by the store with their answer dropped, for a while: writes of
    /// unknown outcome everywhere; no invariant breaks, a leader afterwards.
    Lossy,
    /// 20 % of requests held past the sender's request timeout, then applied by the store (the
    /// sender has given up and re-read meanwhile), with a SIGTERM handover halfway through: no
    /// invariant breaks, a leader afterwards.
    Late,
    /// The store itself (a dedicated emulator or server instance of the round, its own port
    /// and data folder) is stopped mid-term and started again with its data: the leader
    /// steps down by its deadline if the store stays away, and a leader is back within
    /// `ttl + 2 x retry_every` (+ slack) of the restart.
    Restart,
    /// As [`Restart`](Self::Restart), but the store comes back empty (no persistence, or its
    /// data folder wiped; the container, table or bucket is created again, as an operator
    /// would): the lease record is gone, and tokens must still rise.
    RestartEmpty,
}

impl Scenario {
    /// Every scenario.
    pub const ALL: [Scenario; 10] = [
        Scenario::Kill,
        Scenario::Stop,
        Scenario::Partition,
        Scenario::Stall,
        Scenario::Throttle,
        Scenario::Term,
        Scenario::Lossy,
        Scenario::Late,
        Scenario::Restart,
        Scenario::RestartEmpty,
    ];

    /// The name used on command lines and in summaries.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Kill => "sigkill",
            Scenario::Stop => "sigstop",
            Scenario::Partition => "partition",
            Scenario::Stall => "stall",
            Scenario::Throttle => "throttle",
            Scenario::Term => "sigterm",
            Scenario::Lossy => "lossy",
            Scenario::Late => "late",
            Scenario::Restart => "restart",
            Scenario::RestartEmpty => "restart-empty",
        }
    }

    /// The scenario of a [`name`](Self::name).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Whether it applies to `kind`: the file store has no proxy to partition, throttle or
    /// delay, and no server to restart; a byte-level proxy (etcd, ZooKeeper) can partition,
    /// stall and hold bytes (late delivery) but not throttle or lose single answers; the
    /// DynamoDB emulator keeps nothing across a restart (only the empty restart applies); etcd
    /// and ZooKeeper take their tokens from the store's own counter (revision, zxid), which a
    /// wiped store starts again near zero: their backends refuse to go on below a token they
    /// have seen (an error that needs a person, by design), so the empty restart does not
    /// apply to them (the drill saw exactly that refusal, and no violation, in every run).
    pub fn applies_to(self, kind: BackendKind) -> bool {
        match self {
            Scenario::Kill | Scenario::Stop | Scenario::Term => true,
            Scenario::Partition | Scenario::Stall | Scenario::Late => kind.proxied(),
            Scenario::Throttle | Scenario::Lossy => kind.http(),
            Scenario::Restart => kind.proxied() && kind != BackendKind::Dynamo,
            Scenario::RestartEmpty => {
                kind.proxied() && !matches!(kind, BackendKind::Etcd | BackendKind::ZooKeeper)
            }
        }
    }

    /// The bound on the measured time: failover, handover or recovery.
    pub fn bound(self, t: &Timing) -> Option<Duration> {
        match self {
            Scenario::Kill | Scenario::Stop | Scenario::Partition => {
                Some(t.ttl + t.retry_every + SLACK)
            }
            Scenario::Stall | Scenario::Restart | Scenario::RestartEmpty => {
                Some(t.ttl + t.retry_every * 2 + SLACK)
            }
            Scenario::Term => Some(t.poll_every.mul_f64(1.1) + SLACK),
            Scenario::Throttle | Scenario::Lossy | Scenario::Late => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Request-level faults need an HTTP proxy; the file store has no proxy at all.
    #[test]
    fn each_backend_gets_the_faults_its_proxy_can_make() {
        for kind in BackendKind::ALL {
            for s in Scenario::ALL {
                let expected = match s {
                    Scenario::Kill | Scenario::Stop | Scenario::Term => true,
                    Scenario::Partition | Scenario::Stall | Scenario::Late => {
                        kind != BackendKind::File
                    }
                    Scenario::Throttle | Scenario::Lossy => matches!(
                        kind,
                        BackendKind::Azure | BackendKind::Dynamo | BackendKind::Gcs
                    ),
                    Scenario::Restart => !matches!(kind, BackendKind::File | BackendKind::Dynamo),
                    Scenario::RestartEmpty => matches!(
                        kind,
                        BackendKind::Azure | BackendKind::Dynamo | BackendKind::Gcs
                    ),
                };
                assert_eq!(s.applies_to(kind), expected, "{s:?} on {kind:?}");
            }
        }
    }
}
