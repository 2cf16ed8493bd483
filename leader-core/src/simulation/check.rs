//! The checkers: one per invariant of `docs/protocol.md`, each a pure function of a history.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Cand, Event, SimConfig, Violation};

/// One term as a candidate saw it: from the moment it learned it leads to the moment it
/// stopped believing so (or crashed, or the run ended).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// The candidate.
    pub cand: Cand,
    /// The term's token.
    pub token: u64,
    /// When it began to believe.
    pub start: Duration,
    /// When it stopped.
    pub end: Duration,
}

/// The belief intervals of every term in a history.
pub fn spans(events: &[Event], run_end: Duration) -> Vec<Span> {
    let mut open: BTreeMap<Cand, (u64, Duration)> = BTreeMap::new();
    let mut out = Vec::new();
    for e in events {
        match *e {
            Event::TermStarted { cand, token, at } => {
                open.insert(cand, (token, at));
            }
            // A crash ends the belief at once, unless the candidate's own record says it
            // ended earlier (a frozen process whose deadline passed before it was killed);
            // that record comes first in the log.
            Event::TermEnded { cand, at, .. } | Event::Crashed { cand, at } => {
                if let Some((token, start)) = open.remove(&cand) {
                    out.push(Span {
                        cand,
                        token,
                        start,
                        end: at.max(start),
                    });
                }
            }
            _ => {}
        }
    }
    out.extend(open.into_iter().map(|(cand, (token, start))| Span {
        cand,
        token,
        start,
        end: run_end.max(start),
    }));
    out.sort_by_key(|s| (s.start, s.end, s.cand));
    out
}

/// The intervals in which a candidate held a term: from the store's applying the write that
/// began it (or the elector's grant) to the end of its belief (or the revocation, if it never
/// began to act: a process frozen at the moment of the grant). A term that began in the store
/// but whose holder never heard of it (frozen or partitioned as the answer came, or a write
/// delivered late) failed at once: a zero-length interval.
fn leader_spans(events: &[Event], run_end: Duration) -> Vec<Span> {
    let beliefs = spans(events, run_end);
    let belief_end = |cand: Cand, token: u64| {
        beliefs
            .iter()
            .find(|b| b.cand == cand && b.token == token)
            .map(|b| b.end)
    };
    let mut out = Vec::new();
    let mut applied: BTreeMap<(Cand, u64), Duration> = BTreeMap::new();
    let mut open: BTreeMap<(Cand, u64), Duration> = BTreeMap::new();
    for e in events {
        match *e {
            Event::Applied { cand, token, at } => {
                applied.insert((cand, token), at);
            }
            Event::Granted { cand, token, at } => {
                let start = applied.remove(&(cand, token)).unwrap_or(at);
                open.insert((cand, token), start.min(at));
            }
            Event::Revoked { cand, token, at } => {
                if let Some(start) = open.remove(&(cand, token)) {
                    let end = belief_end(cand, token).unwrap_or(at);
                    out.push(Span {
                        cand,
                        token,
                        start,
                        end: end.max(start),
                    });
                }
            }
            _ => {}
        }
    }
    for ((cand, token), start) in open {
        let end = belief_end(cand, token).unwrap_or(run_end);
        out.push(Span {
            cand,
            token,
            start,
            end: end.max(start),
        });
    }
    out.extend(applied.into_iter().map(|((cand, token), at)| Span {
        cand,
        token,
        start: at,
        end: at,
    }));
    out.sort_by_key(|s| (s.start, s.end, s.cand));
    out
}

/// Checker 1: no two candidates believe they lead at the same instant.
pub fn check_one_leader(events: &[Event], run_end: Duration) -> Vec<Violation> {
    let spans = spans(events, run_end);
    let mut out = Vec::new();
    for (i, a) in spans.iter().enumerate() {
        for b in &spans[i + 1..] {
            if b.start >= a.end {
                break;
            }
            if b.cand != a.cand {
                out.push(Violation {
                    checker: "one_leader",
                    detail: format!(
                        "cand {} (token {}) led {:?}..{:?} while cand {} (token {}) led {:?}..{:?}",
                        a.cand, a.token, a.start, a.end, b.cand, b.token, b.start, b.end
                    ),
                });
            }
        }
    }
    out
}

/// Checker 2: tokens strictly increase from term to term, and none is issued twice.
pub fn check_tokens(events: &[Event]) -> Vec<Violation> {
    let mut starts: Vec<(Duration, usize, Cand, u64)> = events
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match *e {
            Event::TermStarted { cand, token, at } => Some((at, i, cand, token)),
            _ => None,
        })
        .collect();
    starts.sort();
    let mut out = Vec::new();
    for w in starts.windows(2) {
        let (at0, _, c0, t0) = w[0];
        let (at1, _, c1, t1) = w[1];
        if t1 <= t0 {
            out.push(Violation {
                checker: "tokens",
                detail: format!(
                    "term of cand {c1} at {at1:?} has token {t1}, not above cand {c0}'s {t0} at {at0:?}"
                ),
            });
        }
    }
    out
}

/// Checker 3: the fenced resource never accepts a token lower than one it accepted before.
///
/// [`Event::Write`]s are logged by the resource as it decides, so the log's order is the
/// order in which writes reached it (late ones included).
pub fn check_fencing(events: &[Event]) -> Vec<Violation> {
    let mut highest: Option<(u64, Cand, Duration)> = None;
    let mut out = Vec::new();
    for e in events {
        if let Event::Write {
            cand,
            token,
            at,
            accepted: true,
        } = *e
        {
            if let Some((h, hc, hat)) = highest
                && token < h
            {
                out.push(Violation {
                    checker: "fencing",
                    detail: format!(
                        "resource accepted token {token} from cand {cand} at {at:?} after token {h} from cand {hc} at {hat:?}"
                    ),
                });
                continue;
            }
            highest = Some((token, cand, at));
        }
    }
    out
}

/// A gap without a leader, as the liveness checker judged it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Gap {
    /// When the last leader's term ended (or the run began).
    pub start: Duration,
    /// When the next term began (or the run ended).
    pub end: Duration,
    /// Whether the store was healthy at `start` (see [`check_liveness`]).
    pub healthy_start: bool,
    /// The longest healthy stretch inside the gap: the checker requires it to stay within
    /// [`liveness_bound`].
    pub longest_healthy: Duration,
}

impl Gap {
    /// How long nobody led.
    pub fn len(&self) -> Duration {
        self.end.saturating_sub(self.start)
    }

    /// Whether the gap is empty.
    pub fn is_empty(&self) -> bool {
        self.len().is_zero()
    }
}

/// The longest healthy stretch a gap may contain: `ttl + max(retry_every, 1.1 x poll_every) +
/// replica_lag + 2 x request_timeout + 4 x latency`, scaled for drift, plus 50 ms.
///
/// Why it suffices: a candidate that is up, not frozen and not partitioned from instant `a`
/// has read the record by `a + request_timeout + retry_every` (+ latency) at the latest (a
/// request hung by a partition times out, then backoff is capped at `retry_every`); if the
/// record then stays unchanged it takes over `ttl` later on its own clock, with one read and
/// one write; followers read a replica that may lag by `replica_lag`, so the last write may be
/// seen that much later. A record that changes meanwhile is a new term (which ends the gap), a release
/// (taken over at once), a renew that left just before its sender's deadline (within a
/// request of the gap's start), or a write delivered late (the store is not healthy while it
/// holds one).
pub fn liveness_bound(config: &SimConfig) -> Duration {
    let t = config.timing;
    (t.ttl
        + t.retry_every.max(t.poll_every.mul_f64(1.1))
        + config.replica_lag
        + t.request_timeout * 2
        + config.base_latency * 4)
        .mul_f64(1.0 + 2.0 * config.max_drift)
        + Duration::from_millis(50)
}

/// The gaps in the union of the intervals in which some candidate held a granted term.
fn leaderless(events: &[Event], run_end: Duration) -> Vec<(Duration, Duration)> {
    let mut gaps = Vec::new();
    let mut covered_to = Duration::ZERO;
    for s in &leader_spans(events, run_end) {
        if s.start > covered_to {
            gaps.push((covered_to, s.start));
        }
        covered_to = covered_to.max(s.end);
    }
    if covered_to < run_end {
        gaps.push((covered_to, run_end));
    }
    gaps
}

/// Checker 4: liveness, judged on every gap without a leader.
///
/// Definitions:
/// - a candidate is **able** at an instant if it has started, has not crashed, and is neither
///   frozen (paused, including paused with a response in flight) nor partitioned;
/// - the store is **healthy** at an instant if no outage and no storm is in force and some
///   candidate is able, and the store is not holding a lease write for late delivery (from the
///   moment it takes the write to the moment it applies it: the sender times out, re-reads and
///   polls again, and the write, when it lands, changes the record so that followers must
///   watch the new revision for a full ttl).
///
/// A **healthy stretch** is an interval in which the store is healthy and one and the same
/// candidate is able throughout. Every gap is judged: it breaks liveness if it
/// contains a healthy stretch longer than [`liveness_bound`]. A gap that starts with a
/// healthy store is the case of the liveness invariant (`docs/protocol.md`); a gap that starts
/// in an outage is judged the same way from the moment health returns.
///
/// Returns every gap (with its verdict's inputs) and the violations.
pub fn check_liveness(config: &SimConfig, events: &[Event]) -> (Vec<Gap>, Vec<Violation>) {
    let bound = liveness_bound(config);
    let run_end = config.duration;
    let raw = leaderless(events, run_end);
    let mut store_faults: Vec<(Duration, Duration)> = Vec::new();
    let mut unable: BTreeMap<Cand, Vec<(Duration, Duration)>> = BTreeMap::new();
    let mut lives: BTreeMap<Cand, (Duration, Duration)> = BTreeMap::new();
    for e in events {
        match *e {
            Event::Outage { at, until }
            | Event::Storm { at, until }
            | Event::Held {
                at,
                until,
                fenced: false,
                ..
            } => store_faults.push((at, until)),
            Event::Partitioned { cand, at, until }
            | Event::Frozen { cand, at, until }
            | Event::PausedInFlight { cand, at, until } => {
                unable.entry(cand).or_default().push((at, until));
            }
            Event::Started { cand, at } => {
                lives.insert(cand, (at, run_end));
            }
            Event::Crashed { cand, at } => {
                if let Some(life) = lives.get_mut(&cand) {
                    life.1 = at;
                }
            }
            _ => {}
        }
    }
    let within = |t: Duration, &(a, b): &(Duration, Duration)| a <= t && t < b;
    let able = |c: Cand, t: Duration| {
        lives.get(&c).is_some_and(|life| within(t, life))
            && !unable
                .get(&c)
                .is_some_and(|v| v.iter().any(|i| within(t, i)))
    };
    let store_ok = |t: Duration| !store_faults.iter().any(|i| within(t, i));

    let mut gaps = Vec::new();
    let mut out = Vec::new();
    for (g0, g1) in raw {
        // Every instant at which health or ability may change inside the gap.
        let mut points = vec![g0, g1];
        let inside = |t: Duration| g0 < t && t < g1;
        for &(a, b) in store_faults.iter().chain(unable.values().flatten()) {
            points.extend([a, b].into_iter().filter(|&t| inside(t)));
        }
        for &(a, b) in lives.values() {
            points.extend([a, b].into_iter().filter(|&t| inside(t)));
        }
        points.sort();
        points.dedup();
        let healthy_start = store_ok(g0) && lives.keys().any(|&c| able(c, g0));
        // The longest run of consecutive segments, for one candidate, in which the store is
        // healthy and that candidate able.
        let mut longest = Duration::ZERO;
        for &c in lives.keys() {
            let mut run = Duration::ZERO;
            for w in points.windows(2) {
                let (a, b) = (w[0], w[1]);
                if store_ok(a) && able(c, a) {
                    run += b - a;
                    longest = longest.max(run);
                } else {
                    run = Duration::ZERO;
                }
            }
        }
        if longest > bound {
            out.push(Violation {
                checker: "liveness",
                detail: format!(
                    "no leader from {g0:?} to {g1:?}: {longest:?} of it healthy (bound {bound:?})"
                ),
            });
        }
        gaps.push(Gap {
            start: g0,
            end: g1,
            healthy_start,
            longest_healthy: longest,
        });
    }
    (gaps, out)
}
