//! The history checker: what every candidate logged, against the invariants of `docs/protocol.md`.
//!
//! It trusts nothing it cannot read. A line that is not a known event, an event out of place
//! in its candidate's log (out of time order, outside a term, a write answered before it was
//! sent) and a term that ends before it starts are violations in themselves, never skipped: a
//! history with holes in it passes checks that the whole history would fail.

use std::collections::BTreeMap;

use super::{
    EV_EXIT, EV_READY, EV_RELEASING, EV_RENEWED, EV_TERM_ENDED, EV_TERM_STARTED, EV_WRITE, Event,
    OUT_ACCEPTED, OUT_FAILED, OUT_FENCED, OUT_UNKNOWN,
};

/// Every event a candidate logs.
const EVENTS: [&str; 7] = [
    EV_READY,
    EV_TERM_STARTED,
    EV_RENEWED,
    EV_WRITE,
    EV_TERM_ENDED,
    EV_RELEASING,
    EV_EXIT,
];

/// Every outcome of a write.
const OUTCOMES: [&str; 4] = [OUT_ACCEPTED, OUT_FENCED, OUT_UNKNOWN, OUT_FAILED];

/// How much of a line that is not an event a violation quotes.
const QUOTE_CHARS: usize = 120;

/// One candidate's log, with what the drill did to it.
#[derive(Clone, Debug, Default)]
pub struct CandidateLog {
    /// Its holder id.
    pub id: String,
    /// Its events, in the order it logged them.
    pub events: Vec<Event>,
    /// The line (from 1) of each event, when read by [`parse_log`]; empty for a log built in
    /// code (violations then name events by their position).
    pub lines: Vec<usize>,
    /// Each line that is not an event the checker knows, described with its line number and
    /// text: each one is a violation.
    pub unreadable: Vec<String>,
    /// Whether a torn last line was skipped: the candidate was SIGKILLed while writing it.
    pub torn_tail: bool,
    /// When the drill SIGKILLed it, if it did ([`mono_us`](super::mono_us)).
    pub killed_at: Option<u64>,
}

/// Parses a candidate's stdout: one JSON [`Event`] per line, each with a known `ev` (and, for
/// a write, a known `outcome`). Every other line is kept in
/// [`unreadable`](CandidateLog::unreadable), for [`check`] to report, with one exception: the
/// last line of a killed candidate (`killed_at`) if it has no end of line and does not parse.
///
/// A candidate writes each event and flushes it before it goes on (its stdout, line-buffered,
/// makes one `write(2)` of the event's text, then one of its end of line), so a line can only
/// be torn or lack its end of line if it is the last one and the process died while writing
/// it: SIGKILL, which the caller says with `killed_at`. That last line is kept if it parses (a
/// whole event, killed before its end of line), and otherwise skipped, with
/// [`torn_tail`](CandidateLog::torn_tail) set: the event it began never reached the log, so
/// nothing that was logged goes unchecked. An unterminated last line of a candidate that was
/// not killed means the log was cut or written by something else: a violation, even if it
/// parses. Empty lines carry no event and are passed over.
///
/// Read while the candidates run (the driver polls the logs), the last line may be one being
/// written: callers that only look for events there can ignore `unreadable`.
pub fn parse_log(id: &str, text: &str, killed_at: Option<u64>) -> CandidateLog {
    let mut log = CandidateLog {
        id: id.to_owned(),
        killed_at,
        ..CandidateLog::default()
    };
    let unterminated = !text.is_empty() && !text.ends_with('\n');
    let count = text.lines().count();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.is_empty() {
            continue;
        }
        if unterminated && n == count {
            match (killed_at, read_event(line)) {
                (None, _) => log.unreadable.push(format!(
                    "line {n} has no end of line and the candidate was not killed (the log was cut): {}",
                    quote(line)
                )),
                // A whole event, only its end of line missing.
                (Some(_), Ok(event)) => {
                    log.events.push(event);
                    log.lines.push(n);
                }
                (Some(_), Err(_)) => log.torn_tail = true,
            }
            continue;
        }
        match read_event(line) {
            Ok(event) => {
                log.events.push(event);
                log.lines.push(n);
            }
            Err(why) => log
                .unreadable
                .push(format!("line {n} is not an event ({why}): {}", quote(line))),
        }
    }
    log
}

/// One line as an [`Event`] with a known `ev` and, for a write, a known `outcome`.
fn read_event(line: &str) -> Result<Event, String> {
    let event: Event = serde_json::from_str(line).map_err(|e| e.to_string())?;
    if !EVENTS.contains(&event.ev.as_str()) {
        return Err(format!("unknown event {:?}", event.ev));
    }
    if event.ev == EV_WRITE && !OUTCOMES.contains(&event.outcome.as_str()) {
        return Err(format!("unknown write outcome {:?}", event.outcome));
    }
    Ok(event)
}

/// `line`, quoted, cut after [`QUOTE_CHARS`] characters.
fn quote(line: &str) -> String {
    match line.char_indices().nth(QUOTE_CHARS) {
        Some((cut, _)) => format!("{:?}...", &line[..cut]),
        None => format!("{line:?}"),
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

/// The rules of one candidate's log on its own, as `candidate.rs` writes it: one task logs
/// every event in turn, each stamped when it is written, except a term's end, stamped
/// `min(now, deadline)`.
///
/// - every event is a known one, and its `id` is the log's holder;
/// - the events of a term (start, renewals, writes, end) carry a token, never 0;
/// - a term starts when no other term of the candidate is open; renewals and writes come
///   between the start and the end of their own term; a term ends once, after it started;
/// - times never go back from one line to the next, except at a term's end: stamped at the
///   deadline if that came first, it may be earlier than a write answered late, after the
///   deadline (see [`check`] for a term that ends before it starts);
/// - a write has a known outcome, a sequence number above the candidate's earlier writes', and
///   was decided, then sent, then answered, in that order (`0 < t0 <= t1 <= t`).
fn check_log(log: &CandidateLog, out: &mut Vec<String>) {
    let mut open: Option<u64> = None;
    let mut latest = 0;
    let mut last_seq = 0;
    for (i, e) in log.events.iter().enumerate() {
        let mut bad = |what: String| {
            let at = log
                .lines
                .get(i)
                .map_or_else(|| format!("event {}", i + 1), |n| format!("line {n}"));
            out.push(format!("{}'s log, {at}: {what}", log.id));
        };
        if !EVENTS.contains(&e.ev.as_str()) {
            bad(format!("unknown event {:?}", e.ev));
            continue;
        }
        if e.id != log.id {
            bad(format!("the event is {:?}'s", e.id));
        }
        let in_term =
            [EV_TERM_STARTED, EV_RENEWED, EV_WRITE, EV_TERM_ENDED].contains(&e.ev.as_str());
        if in_term && e.token == 0 {
            bad(format!("{} with token 0 (inside a term)", e.ev));
        }
        if e.ev != EV_TERM_ENDED && e.t < latest {
            bad(format!(
                "{} logged at {:.1} ms, before the {:.1} ms of an earlier line",
                e.ev,
                ms(e.t),
                ms(latest)
            ));
        }
        latest = latest.max(e.t);
        match e.ev.as_str() {
            EV_TERM_STARTED => {
                if let Some(token) = open {
                    bad(format!(
                        "term {} started while its term {token} had not ended",
                        e.token
                    ));
                }
                open = Some(e.token);
            }
            EV_TERM_ENDED if open == Some(e.token) => open = None,
            EV_TERM_ENDED => bad(format!(
                "ended term {} that it had not logged as started (or had ended already)",
                e.token
            )),
            EV_RENEWED | EV_WRITE if open != Some(e.token) => bad(format!(
                "acted ({}) with token {} outside a term of its own",
                e.ev, e.token
            )),
            _ => {}
        }
        if e.ev == EV_WRITE {
            if !OUTCOMES.contains(&e.outcome.as_str()) {
                bad(format!(
                    "write {} has the unknown outcome {:?}",
                    e.seq, e.outcome
                ));
            }
            if e.seq <= last_seq {
                bad(format!(
                    "write {} logged after write {last_seq}: sequence numbers go up",
                    e.seq
                ));
            }
            last_seq = last_seq.max(e.seq);
            if e.t0 == 0 || e.t1 < e.t0 || e.t < e.t1 {
                bad(format!(
                    "write {} decided at {:.1} ms, sent at {:.1} ms, answered at {:.1} ms: not in that order",
                    e.seq,
                    ms(e.t0),
                    ms(e.t1),
                    ms(e.t)
                ));
            }
        }
    }
}

/// Checks the logs of one round and the protected object read at its end.
///
/// - every line of every log is a known event ([`parse_log`]), in its place in its
///   candidate's log (see `check_log`: time order, token 0, writes inside their own term and
///   answered after they were sent, ...);
/// - a term's logged end (its `term_ended`, or its last deadline) is not before its start:
///   such a term could not be placed against the others;
/// - terms of different candidates never overlap (each ends at its logged end, its last
///   deadline, or its holder's death, whichever is first);
/// - tokens strictly increase in order of start, and none is issued twice;
/// - nobody writes outside a term of its own (before its start or after its end);
/// - the object never accepted a token lower than one it had accepted before (a write sent
///   after a higher-token write was acknowledged);
/// - the last acknowledged write is in the object (or a later write of unknown outcome), no
///   write reported as failed is, and the object's fence is the token of its content.
pub fn check(logs: &[CandidateLog], object: Option<&FinalObject>) -> Verdict {
    check_rules(logs, Some(object))
}

/// [`check`] when the protected object could not be read at the end of the round: every rule
/// but the last (nothing lost, nothing failed applied, the fence matches the content).
pub fn check_without_object(logs: &[CandidateLog]) -> Verdict {
    check_rules(logs, None)
}

/// The rules of [`check`]; the object's with `Some` (the object, or `None` if it is absent).
fn check_rules(logs: &[CandidateLog], object: Option<Option<&FinalObject>>) -> Verdict {
    let mut v = Verdict::default();
    let mut terms: Vec<TermSpan> = Vec::new();
    let mut starts: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for log in logs {
        for line in &log.unreadable {
            v.violations.push(format!("{}'s log: {line}", log.id));
        }
        check_log(log, &mut v.violations);
        let mut deadlines: BTreeMap<u64, u64> = BTreeMap::new();
        for e in &log.events {
            if e.token != 0 {
                let d = deadlines.entry(e.token).or_insert(0);
                *d = (*d).max(e.deadline);
            }
        }
        // The candidate was alive when it wrote its last line: the driver stamps a kill before
        // it sends SIGKILL, so lines logged after that stamp push its death later.
        let death = log
            .killed_at
            .map(|k| log.events.iter().map(|e| e.t).fold(k, u64::max));
        let mut own: BTreeMap<u64, TermSpan> = BTreeMap::new();
        for e in &log.events {
            match e.ev.as_str() {
                EV_TERM_STARTED => {
                    starts.entry(e.token).or_default().push(log.id.clone());
                    own.entry(e.token).or_insert_with(|| TermSpan {
                        id: log.id.clone(),
                        token: e.token,
                        start: e.t,
                        end: deadlines.get(&e.token).copied().unwrap_or(e.deadline),
                        ended: false,
                    });
                }
                EV_TERM_ENDED => {
                    if let Some(span) = own.get_mut(&e.token) {
                        span.end = span.end.min(e.t);
                        span.ended = true;
                    }
                }
                _ => {}
            }
        }
        for mut span in own.into_values() {
            // Its logged end: `term_ended` is stamped `min(now, deadline)`, and the deadline of
            // a term handed out is ahead of the moment it is handed out, so neither is before
            // the start unless the log is wrong. Such a term could never overlap another.
            if span.end < span.start {
                v.violations.push(format!(
                    "term {} of {} ends at {:.1} ms, before it starts at {:.1} ms",
                    span.token,
                    span.id,
                    ms(span.end),
                    ms(span.start)
                ));
            }
            if let Some(death) = death {
                span.end = span.end.min(death);
            }
            terms.push(span);
        }
    }
    for (token, holders) in &starts {
        if holders.len() > 1 {
            v.violations.push(format!(
                "token {token} was issued more than once: {holders:?}"
            ));
        }
    }
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
            if let Some(span) = terms.iter().find(|s| s.id == log.id && s.token == e.token) {
                if e.t0 > span.end {
                    v.violations.push(format!(
                        "{} wrote with token {} at {:.1} ms, after its term ended at {:.1} ms",
                        log.id,
                        e.token,
                        ms(e.t0),
                        ms(span.end)
                    ));
                }
                if e.t0 < span.start {
                    v.violations.push(format!(
                        "{} wrote with token {} at {:.1} ms, before its term started at {:.1} ms",
                        log.id,
                        e.token,
                        ms(e.t0),
                        ms(span.start)
                    ));
                }
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
    // Nothing lost (when the object was read).
    let last = accepted.iter().max_by_key(|w| (w.token, w.seq));
    match (last, object) {
        (None, _) | (_, None) => {}
        (Some(last), Some(None)) => v.violations.push(format!(
            "acknowledged write {}/{}/{} is lost: the object does not exist",
            last.id, last.token, last.seq
        )),
        (Some(last), Some(Some(obj))) => {
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

    /// `id`'s log of `events` (each stamped with `id`).
    fn log(id: &str, mut events: Vec<Event>) -> CandidateLog {
        for e in &mut events {
            e.id = id.into();
        }
        CandidateLog {
            id: id.into(),
            events,
            ..CandidateLog::default()
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

    /// a's term runs to its deadline 2000; b starts at 1500 with the same token, then takes
    /// a lower one, and its write is accepted after a's.
    fn tangled() -> [CandidateLog; 2] {
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
        [a, b]
    }

    #[test]
    fn overlap_repeat_stale_and_loss_are_caught() {
        // The object holds a's write, not the last one acknowledged.
        let v = check(&tangled(), Some(&obj("a/5/1")));
        let all = v.violations.join("\n");
        assert!(all.contains("terms overlap"), "{all}");
        assert!(all.contains("issued more than once"), "{all}");
        assert!(all.contains("tokens do not increase"), "{all}");
        assert!(all.contains("stale write accepted"), "{all}");
        assert!(all.contains("is lost"), "{all}");
    }

    #[test]
    fn a_killed_leader_stops_at_its_death() {
        let mut a = log(
            "a",
            vec![
                ev(EV_TERM_STARTED, 100, 1, 5000),
                write(200, 250, "a", 1, 1, OUT_ACCEPTED),
            ],
        );
        a.killed_at = Some(1000);
        let b = log("b", vec![ev(EV_TERM_STARTED, 1200, 2, 9000)]);
        let v = check(&[a.clone(), b.clone()], Some(&obj("a/1/1")));
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        assert_eq!(v.terms[0].end, 1000);
        // Killed at 1000 by the driver's stamp, it logged at 1300: it was alive until then.
        a.events
            .push(log("a", vec![write(1250, 1300, "a", 1, 2, OUT_FENCED)]).events[0].clone());
        let v = check(&[a, b], Some(&obj("a/1/1")));
        let all = v.violations.join("\n");
        assert!(all.contains("terms overlap"), "{all}");
    }

    #[test]
    fn late_writes_are_caught() {
        let a = log(
            "a",
            vec![
                ev(EV_TERM_STARTED, 100, 1, 5000),
                write(6000, 6100, "a", 1, 1, OUT_FENCED),
                ev(EV_TERM_ENDED, 5000, 1, 5000),
            ],
        );
        let b = log("b", vec![ev(EV_TERM_STARTED, 5200, 2, 9000)]);
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

    /// Without the object, every rule but the object's still holds: the overlap, the
    /// repeated and the lower token and the stale write are caught, and an acknowledged write
    /// is not called lost.
    #[test]
    fn without_the_object_only_its_rule_is_left_out() {
        let v = check_without_object(&tangled());
        let all = v.violations.join("\n");
        assert!(all.contains("terms overlap"), "{all}");
        assert!(all.contains("issued more than once"), "{all}");
        assert!(all.contains("tokens do not increase"), "{all}");
        assert!(all.contains("stale write accepted"), "{all}");
        assert!(!all.contains("is lost"), "{all}");
        assert_eq!(v.terms.len(), 3);
    }
}
