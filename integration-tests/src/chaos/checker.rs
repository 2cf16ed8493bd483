//! The history checker: what every candidate logged, against the invariants of DESIGN.md.

use std::collections::BTreeMap;

use super::{
    EV_RENEWED, EV_TERM_ENDED, EV_TERM_STARTED, EV_WRITE, Event, OUT_ACCEPTED, OUT_FAILED,
    OUT_FENCED, OUT_UNKNOWN,
};

/// One candidate's log, with what the drill did to it.
#[derive(Clone, Debug, Default)]
pub struct CandidateLog {
    /// Its holder id.
    pub id: String,
    /// Its events, in the order it logged them.
    pub events: Vec<Event>,
    /// When the drill SIGKILLed it, if it did ([`mono_us`](super::mono_us)).
    pub killed_at: Option<u64>,
}

/// Parses a candidate's stdout (JSON lines); a torn last line (a killed process) is skipped.
pub fn parse_log(id: &str, text: &str, killed_at: Option<u64>) -> CandidateLog {
    CandidateLog {
        id: id.to_owned(),
        events: text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect(),
        killed_at,
    }
}

/// The protected object as read after the round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FinalObject {
    /// Its fence: the highest token that wrote it.
    pub fence: u64,
    /// Its content.
    pub value: String,
}

/// One term as the checker sees it: when its holder acted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TermSpan {
    /// The holder.
    pub id: String,
    /// The token.
    pub token: u64,
    /// When the holder logged that it leads.
    pub start: u64,
    /// When it stopped acting at the latest: its logged end, its last known deadline, or its
    /// death, whichever came first.
    pub end: u64,
    /// Whether it logged the end of the term.
    pub ended: bool,
}

/// What the checker found.
#[derive(Clone, Debug, Default)]
pub struct Verdict {
    /// Every violated invariant, in words.
    pub violations: Vec<String>,
    /// Every term, in order of start.
    pub terms: Vec<TermSpan>,
    /// Writes acknowledged by the store.
    pub accepted: usize,
    /// Writes rejected for a stale token.
    pub fenced: usize,
    /// Writes that failed or whose outcome is unknown.
    pub failed: usize,
}

impl Verdict {
    /// The first term that started after `t` (optionally held by someone else than `not_by`).
    pub fn first_term_after(&self, t: u64, not_by: Option<&str>) -> Option<&TermSpan> {
        self.terms
            .iter()
            .find(|s| s.start > t && not_by.is_none_or(|id| s.id != id))
    }
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// Checks the logs of one round and the protected object read at its end.
///
/// - terms of different candidates never overlap (each ends at its logged end, its last
///   deadline, or its holder's death, whichever is first);
/// - tokens strictly increase in order of start, and none is issued twice;
/// - nobody writes outside a term of its own (after the deadline, or with a token it never
///   held);
/// - the object never accepted a token lower than one it had accepted before (a write sent
///   after a higher-token write was acknowledged);
/// - the last acknowledged write is in the object (or a later write of unknown outcome).
pub fn check(logs: &[CandidateLog], object: Option<&FinalObject>) -> Verdict {
    let mut v = Verdict::default();
    let mut spans: BTreeMap<(String, u64), TermSpan> = BTreeMap::new();
    let mut starts: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for log in logs {
        let mut deadlines: BTreeMap<u64, u64> = BTreeMap::new();
        for e in &log.events {
            if e.token != 0 {
                let d = deadlines.entry(e.token).or_insert(0);
                *d = (*d).max(e.deadline);
            }
        }
        for e in &log.events {
            match e.ev.as_str() {
                EV_TERM_STARTED => {
                    starts.entry(e.token).or_default().push(log.id.clone());
                    let last_deadline = deadlines.get(&e.token).copied().unwrap_or(e.deadline);
                    let end = log
                        .killed_at
                        .map_or(last_deadline, |k| k.min(last_deadline));
                    spans.insert(
                        (log.id.clone(), e.token),
                        TermSpan {
                            id: log.id.clone(),
                            token: e.token,
                            start: e.t,
                            end,
                            ended: false,
                        },
                    );
                }
                EV_TERM_ENDED => match spans.get_mut(&(log.id.clone(), e.token)) {
                    Some(span) => {
                        span.end = span.end.min(e.t);
                        span.ended = true;
                    }
                    None => v.violations.push(format!(
                        "{} ended term {} that it never logged as started",
                        log.id, e.token
                    )),
                },
                EV_RENEWED | EV_WRITE if !spans.contains_key(&(log.id.clone(), e.token)) => {
                    v.violations.push(format!(
                        "{} acted ({}) with token {} outside a term of its own",
                        log.id, e.ev, e.token
                    ));
                }
                _ => {}
            }
        }
    }
    for (token, holders) in &starts {
        if holders.len() > 1 {
            v.violations.push(format!(
                "token {token} was issued more than once: {holders:?}"
            ));
        }
    }
    let mut terms: Vec<TermSpan> = spans.into_values().collect();
    terms.sort_by_key(|s| (s.start, s.token));
    // Overlap and token order.
    for (i, a) in terms.iter().enumerate() {
        for b in terms.iter().skip(i + 1) {
            if a.id != b.id && b.start < a.end && a.start < b.end {
                v.violations.push(format!(
                    "terms overlap: {} (token {}) acted until {:.1} ms, {} (token {}) began at {:.1} ms",
                    a.id,
                    a.token,
                    ms(a.end),
                    b.id,
                    b.token,
                    ms(b.start)
                ));
            }
        }
        if i > 0 && terms[i - 1].token >= a.token {
            v.violations.push(format!(
                "tokens do not increase: {} held {} before {} held {}",
                terms[i - 1].id,
                terms[i - 1].token,
                a.id,
                a.token
            ));
        }
    }
    // Writes.
    struct W<'a> {
        id: &'a str,
        token: u64,
        seq: u64,
        t1: u64,
        t: u64,
        outcome: &'a str,
    }
    let mut writes = Vec::new();
    for log in logs {
        for e in log.events.iter().filter(|e| e.ev == EV_WRITE) {
            if let Some(span) = terms.iter().find(|s| s.id == log.id && s.token == e.token)
                && e.t0 > span.end
            {
                v.violations.push(format!(
                    "{} wrote with token {} at {:.1} ms, after its term ended at {:.1} ms",
                    log.id,
                    e.token,
                    ms(e.t0),
                    ms(span.end)
                ));
            }
            match e.outcome.as_str() {
                OUT_ACCEPTED => v.accepted += 1,
                OUT_FENCED => v.fenced += 1,
                _ => v.failed += 1,
            }
            writes.push(W {
                id: &log.id,
                token: e.token,
                seq: e.seq,
                t1: e.t1.max(e.t0),
                t: e.t,
                outcome: &e.outcome,
            });
        }
    }
    let accepted: Vec<&W> = writes
        .iter()
        .filter(|w| w.outcome == OUT_ACCEPTED)
        .collect();
    for a in &accepted {
        for b in &accepted {
            if b.token < a.token && b.t1 > a.t {
                v.violations.push(format!(
                    "stale write accepted: {} wrote with token {} at {:.1} ms after {} had written with token {} (acknowledged at {:.1} ms)",
                    b.id,
                    b.token,
                    ms(b.t1),
                    a.id,
                    a.token,
                    ms(a.t)
                ));
            }
        }
    }
    // Nothing lost.
    let last = accepted.iter().max_by_key(|w| (w.token, w.seq));
    match (last, object) {
        (None, _) => {}
        (Some(last), None) => v.violations.push(format!(
            "acknowledged write {}/{}/{} is lost: the object does not exist",
            last.id, last.token, last.seq
        )),
        (Some(last), Some(obj)) => {
            let expected = super::write_value(last.id, last.token, last.seq);
            if obj.value != expected {
                let later_unknown = writes.iter().any(|w| {
                    w.outcome == OUT_UNKNOWN
                        && super::write_value(w.id, w.token, w.seq) == obj.value
                        && (w.token, w.seq) > (last.token, last.seq)
                });
                let failed = writes.iter().any(|w| {
                    w.outcome == OUT_FAILED && super::write_value(w.id, w.token, w.seq) == obj.value
                });
                if failed {
                    v.violations.push(format!(
                        "a write reported as failed (not applied) is in the object: {}",
                        obj.value
                    ));
                } else if !later_unknown {
                    v.violations.push(format!(
                        "acknowledged write {expected} is lost: the object holds {:?} (fence {})",
                        obj.value, obj.fence
                    ));
                }
            }
            let value_token = obj
                .value
                .split('/')
                .nth(1)
                .and_then(|t| t.parse::<u64>().ok());
            if value_token != Some(obj.fence) {
                v.violations.push(format!(
                    "the object's fence {} is not the token of its content {:?}",
                    obj.fence, obj.value
                ));
            }
        }
    }
    v.terms = terms;
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(ev: &str, t: u64, token: u64, deadline: u64) -> Event {
        Event {
            ev: ev.into(),
            t,
            token,
            deadline,
            ..Event::default()
        }
    }

    fn write(t0: u64, t: u64, id: &str, token: u64, seq: u64, outcome: &str) -> Event {
        Event {
            ev: EV_WRITE.into(),
            t,
            t0,
            id: id.into(),
            token,
            seq,
            t1: t0,
            deadline: t + 1000,
            outcome: outcome.into(),
        }
    }

    fn log(id: &str, events: Vec<Event>) -> CandidateLog {
        CandidateLog {
            id: id.into(),
            events,
            killed_at: None,
        }
    }

    fn obj(value: &str) -> FinalObject {
        FinalObject {
            fence: value.split('/').nth(1).unwrap().parse().unwrap(),
            value: value.into(),
        }
    }

    #[test]
    fn a_clean_handover_passes() {
        let a = log(
            "a",
            vec![
                ev(EV_TERM_STARTED, 100, 1, 2000),
                write(200, 250, "a", 1, 1, OUT_ACCEPTED),
                ev(EV_TERM_ENDED, 300, 1, 2000),
            ],
        );
        let b = log(
            "b",
            vec![
                ev(EV_TERM_STARTED, 400, 2, 3000),
                write(500, 550, "b", 2, 1, OUT_ACCEPTED),
            ],
        );
        let v = check(&[a, b], Some(&obj("b/2/1")));
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        assert_eq!(v.terms.len(), 2);
        assert_eq!(v.terms[1].end, 3000);
        assert_eq!(v.first_term_after(100, Some("a")).unwrap().token, 2);
    }

    #[test]
    fn overlap_repeat_stale_and_loss_are_caught() {
        // a's term runs to its deadline 2000; b starts at 1500 with a lower token, and its
        // write is accepted after a's; the object lost a's write.
        let a = log(
            "a",
            vec![
                ev(EV_TERM_STARTED, 100, 5, 2000),
                write(200, 250, "a", 5, 1, OUT_ACCEPTED),
            ],
        );
        let b = log(
            "b",
            vec![
                ev(EV_TERM_STARTED, 1500, 5, 4000),
                write(1600, 1650, "b", 5, 1, OUT_ACCEPTED),
                ev(EV_TERM_STARTED, 4100, 4, 6000),
                write(4200, 4250, "b", 4, 2, OUT_ACCEPTED),
            ],
        );
        let v = check(&[a, b], Some(&obj("a/5/1")));
        let all = v.violations.join("\n");
        assert!(all.contains("terms overlap"), "{all}");
        assert!(all.contains("issued more than once"), "{all}");
        assert!(all.contains("tokens do not increase"), "{all}");
        assert!(all.contains("stale write accepted"), "{all}");
        assert!(all.contains("is lost"), "{all}");
    }

    #[test]
    fn a_killed_leader_stops_at_its_death_and_late_writes_are_caught() {
        let mut a = log(
            "a",
            vec![
                ev(EV_TERM_STARTED, 100, 1, 5000),
                write(6000, 6100, "a", 1, 1, OUT_FENCED),
            ],
        );
        a.killed_at = Some(1000);
        let b = log("b", vec![ev(EV_TERM_STARTED, 1200, 2, 9000)]);
        let v = check(&[a, b], None);
        let all = v.violations.join("\n");
        assert!(!all.contains("overlap"), "{all}");
        assert!(all.contains("after its term ended"), "{all}");
    }

    #[test]
    fn a_later_write_of_unknown_outcome_may_be_the_content() {
        let a = log(
            "a",
            vec![
                ev(EV_TERM_STARTED, 100, 3, 5000),
                write(200, 250, "a", 3, 1, OUT_ACCEPTED),
                write(300, 900, "a", 3, 2, OUT_UNKNOWN),
            ],
        );
        assert!(
            check(std::slice::from_ref(&a), Some(&obj("a/3/2")))
                .violations
                .is_empty()
        );
        let v = check(&[a], Some(&obj("a/3/0")));
        assert_eq!(v.violations.len(), 1, "{:?}", v.violations);
    }
}
