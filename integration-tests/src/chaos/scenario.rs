//! The faults a round injects, and the time each one allows for a new term.

use std::time::Duration;

use leader_core::Timing;
use serde::Serialize;

use super::BackendKind;

/// Slack on every timing bound, for process scheduling on a loaded machine.
pub const SLACK: Duration = Duration::from_secs(1);

/// What one election inside an etcd cluster or a ZooKeeper ensemble may add to a failover:
/// the election timeout or sync limit (about 1 s here), the vote, and the lease's or
/// session's fresh timeout on the new store leader.
pub(super) const CLUSTER_ELECTION: Duration = Duration::from_secs(3);

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
    /// A quorum's members away one at a time, each for longer than the ttl (their folders
    /// renamed away and back): the last, then the second. The leader keeps its term
    /// throughout and no other term begins: one member of three away costs nothing, and the
    /// second outage holds only if the first member rejoined the term.
    MemberAway,
    /// The store's leader member (etcd's leader, ZooKeeper's leading server) SIGKILLed, and
    /// started again with its data a ttl later.
    MemberKill,
    /// The store's leader member SIGSTOPped for two ttls, then resumed (a stuck old leader
    /// that wakes up after a leader change: etcd-io/etcd#15247 is of that kind).
    MemberStop,
    /// The store's leader member cut from the other members and from every client for a
    /// ttl and 2 s, then healed.
    MemberPartition,
    /// The member that the leader's client talks to cut from the other members (the client
    /// still reaches it): the leader's term ends by its deadline, a candidate on the majority
    /// side takes over, and none begins on the cut member.
    LeaderMinority,
    /// A follower's member cut from the other members while the leader hands over: the
    /// follower, whose reads may be stale, never begins a term while cut off.
    FollowerMinority,
    /// Every member stopped and started again in turn, each time once the cluster is whole.
    RollingRestart,
}

impl Scenario {
    /// Every scenario.
    pub const ALL: [Scenario; 17] = [
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
        Scenario::MemberAway,
        Scenario::MemberKill,
        Scenario::MemberStop,
        Scenario::MemberPartition,
        Scenario::LeaderMinority,
        Scenario::FollowerMinority,
        Scenario::RollingRestart,
    ];

    /// The faults of a store's own members, played on a three-member cluster of the round's
    /// own (etcd and ZooKeeper only).
    pub const MEMBERS: [Scenario; 6] = [
        Scenario::MemberKill,
        Scenario::MemberStop,
        Scenario::MemberPartition,
        Scenario::LeaderMinority,
        Scenario::FollowerMinority,
        Scenario::RollingRestart,
    ];

    /// Whether the round runs on a three-member cluster of its own.
    pub fn on_cluster(self) -> bool {
        Self::MEMBERS.contains(&self)
    }

    /// The candidates' timing in a round of this scenario on `kind`: the backend's, except on a
    /// cluster, where a ttl of 4 s leaves room for one of the store's own elections (about
    /// 1 s of etcd's election timeout or of ZooKeeper's sync limit, and the vote) between two
    /// renews.
    pub fn timing(self, kind: BackendKind) -> Timing {
        if !self.on_cluster() {
            return kind.timing();
        }
        let mut t = Timing::from_ttl(Duration::from_secs(4));
        t.request_timeout = Duration::from_millis(500);
        t.margin = Duration::from_secs(1);
        t.renew_every = Duration::from_millis(700);
        t.retry_every = Duration::from_millis(500);
        t
    }

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
            Scenario::MemberAway => "member-away",
            Scenario::MemberKill => "member-kill",
            Scenario::MemberStop => "member-stop",
            Scenario::MemberPartition => "member-partition",
            Scenario::LeaderMinority => "leader-minority",
            Scenario::FollowerMinority => "follower-minority",
            Scenario::RollingRestart => "rolling-restart",
        }
    }

    /// The scenario of a [`name`](Self::name).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Whether it applies to `kind`: the file store has no proxy to partition, throttle or
    /// delay, and no server to restart; a byte-level proxy (etcd, ZooKeeper) can partition,
    /// stall and hold bytes (late delivery) but not throttle or lose single answers; the
    /// DynamoDB emulator and both S3 emulators (moto, LocalStack) keep nothing across a
    /// restart (only the empty restart applies); etcd
    /// and ZooKeeper take their tokens from the store's own counter (revision, zxid), which a
    /// wiped store starts again near zero: their backends refuse to go on below a token they
    /// have seen (an error that needs a person, by design), so the empty restart does not
    /// apply to them (the drill saw exactly that refusal, and no violation, in every run). Only
    /// a quorum has members to take away one at a time.
    pub fn applies_to(self, kind: BackendKind) -> bool {
        match self {
            Scenario::Kill | Scenario::Stop | Scenario::Term => true,
            // A Raft member is cut from the other members (the candidate is its member).
            Scenario::Partition | Scenario::Stall => kind.proxied() || kind == BackendKind::Raft,
            Scenario::Late => kind.proxied(),
            Scenario::Throttle | Scenario::Lossy => kind.http(),
            Scenario::Restart => kind.proxied() && kind != BackendKind::Dynamo && !kind.s3(),
            Scenario::RestartEmpty => {
                kind.proxied() && !matches!(kind, BackendKind::Etcd | BackendKind::ZooKeeper)
            }
            Scenario::MemberAway => kind == BackendKind::QuorumFile,
            Scenario::MemberKill
            | Scenario::MemberStop
            | Scenario::MemberPartition
            | Scenario::LeaderMinority
            | Scenario::FollowerMinority
            | Scenario::RollingRestart => {
                matches!(kind, BackendKind::Etcd | BackendKind::ZooKeeper)
            }
        }
    }

    /// The bound on the measured time on `kind`: failover, handover or recovery (plus what
    /// an acquisition over a quorum adds, [`BackendKind::acquisition`]).
    pub fn bound(self, kind: BackendKind, t: &Timing) -> Option<Duration> {
        let bound = match self {
            Scenario::Kill | Scenario::Stop | Scenario::Partition => t.ttl + t.retry_every,
            Scenario::Stall | Scenario::Restart | Scenario::RestartEmpty => {
                t.ttl + t.retry_every * 2
            }
            Scenario::Term => t.poll_every.mul_f64(1.1),
            // The longest time unled: a ttl after the leader's last renew, one election of
            // the store's own and the lease's extension at its promotion (etcd) or the
            // session's (ZooKeeper), then a follower's next look.
            Scenario::MemberKill
            | Scenario::MemberStop
            | Scenario::MemberPartition
            | Scenario::LeaderMinority => t.ttl + CLUSTER_ELECTION + t.retry_every * 2,
            // A handover by release, or members restarted one at a time under a live leader:
            // nothing waits for a lease to expire.
            Scenario::FollowerMinority | Scenario::RollingRestart => t.ttl,
            Scenario::Throttle | Scenario::Lossy | Scenario::Late | Scenario::MemberAway => {
                return None;
            }
        };
        Some(bound + kind.acquisition(t) + SLACK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Request-level faults need an HTTP proxy; the file store and the quorum of folders have
    /// no proxy at all; a Raft member can only be cut off whole; only a quorum has members to
    /// take away.
    #[test]
    fn each_backend_gets_the_faults_its_proxy_can_make() {
        for kind in BackendKind::ALL {
            for s in Scenario::ALL {
                let expected = match s {
                    Scenario::Kill | Scenario::Stop | Scenario::Term => true,
                    Scenario::Partition | Scenario::Stall => {
                        !matches!(kind, BackendKind::File | BackendKind::QuorumFile)
                    }
                    Scenario::Late => !matches!(
                        kind,
                        BackendKind::File | BackendKind::QuorumFile | BackendKind::Raft
                    ),
                    Scenario::Throttle | Scenario::Lossy => matches!(
                        kind,
                        BackendKind::Azure
                            | BackendKind::Dynamo
                            | BackendKind::Gcs
                            | BackendKind::S3
                            | BackendKind::S3LocalStack
                    ),
                    Scenario::Restart => !matches!(
                        kind,
                        BackendKind::File
                            | BackendKind::QuorumFile
                            | BackendKind::Raft
                            | BackendKind::Dynamo
                            | BackendKind::S3
                            | BackendKind::S3LocalStack
                    ),
                    Scenario::RestartEmpty => matches!(
                        kind,
                        BackendKind::Azure
                            | BackendKind::Dynamo
                            | BackendKind::Gcs
                            | BackendKind::S3
                            | BackendKind::S3LocalStack
                    ),
                    Scenario::MemberAway => kind == BackendKind::QuorumFile,
                    _ => matches!(kind, BackendKind::Etcd | BackendKind::ZooKeeper),
                };
                assert_eq!(s.applies_to(kind), expected, "{s:?} on {kind:?}");
            }
        }
    }
}
