#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code
//! Controls of the chaos history checker (`integration_tests::chaos::checker`): a clean
//! synthetic history passes, written out as the candidates write it and read back too; then
//! each rule of the checker, one test each, catches that history broken in its way (and only
//! that rule's words are looked for, so that each test fails if its rule is taken out).

use integration_tests::chaos::checker::{CandidateLog, FinalObject, Verdict, check, parse_log};
use integration_tests::chaos::{
    EV_EXIT, EV_READY, EV_RELEASING, EV_RENEWED, EV_TERM_ENDED, EV_TERM_STARTED, EV_WRITE, Event,
    OUT_ACCEPTED, OUT_FAILED, OUT_UNKNOWN,
};

/// The logs of a round and the protected object read at its end.
#[derive(Clone, Debug)]
struct History {
    logs: Vec<CandidateLog>,
    object: Option<FinalObject>,
}

impl History {
    fn log(&mut self, id: &str) -> &mut CandidateLog {
        self.logs.iter_mut().find(|l| l.id == id).unwrap()
    }

    /// `id`'s events of kind `ev`, to change.
    fn events<'a>(
        &'a mut self,
        id: &str,
        ev: &'a str,
    ) -> impl Iterator<Item = &'a mut Event> + use<'a> {
        self.log(id).events.iter_mut().filter(move |e| e.ev == ev)
    }

    /// `id`'s write number `seq`.
    fn write(&mut self, id: &str, seq: u64) -> &mut Event {
        self.events(id, EV_WRITE).find(|e| e.seq == seq).unwrap()
    }

    /// Gives every event of `id` that carries a token the token `to`.
    fn retoken(&mut self, id: &str, to: u64) {
        for e in &mut self.log(id).events {
            if e.token != 0 {
                e.token = to;
            }
        }
    }

    fn check(&self) -> Verdict {
        check(&self.logs, self.object.as_ref())
    }

    /// Each log written out as the candidate writes it (one JSON line per event).
    fn texts(&self) -> Vec<(String, String, Option<u64>)> {
        self.logs
            .iter()
            .map(|l| (l.id.clone(), text(&l.events), l.killed_at))
            .collect()
    }

    /// The history read back from `texts` (changed or not) by the checker's parser.
    fn from_texts(texts: &[(String, String, Option<u64>)], object: Option<FinalObject>) -> Self {
        History {
            logs: texts
                .iter()
                .map(|(id, text, killed_at)| parse_log(id, text, *killed_at))
                .collect(),
            object,
        }
    }
}

fn text(events: &[Event]) -> String {
    events
        .iter()
        .map(|e| serde_json::to_string(e).unwrap() + "\n")
        .collect()
}

fn ev(id: &str, ev: &str, t: u64, token: u64, deadline: u64) -> Event {
    Event {
        ev: ev.into(),
        t,
        id: id.into(),
        token,
        deadline,
        ..Event::default()
    }
}

fn ended(id: &str, t: u64, token: u64, deadline: u64, why: &str) -> Event {
    Event {
        outcome: why.into(),
        ..ev(id, EV_TERM_ENDED, t, token, deadline)
    }
}

/// Write `seq` of `id` with `token`: decided at `t0`, sent at `t1`, answered at `t`.
fn write(id: &str, token: u64, seq: u64, [t0, t1, t]: [u64; 3], deadline: u64, out: &str) -> Event {
    Event {
        seq,
        t0,
        t1,
        outcome: out.into(),
        ..ev(id, EV_WRITE, t, token, deadline)
    }
}

fn obj(value: &str) -> FinalObject {
    FinalObject {
        fence: value.split('/').nth(1).unwrap().parse().unwrap(),
        value: value.into(),
    }
}

fn plain(id: &str, events: Vec<Event>, killed_at: Option<u64>) -> CandidateLog {
    CandidateLog {
        id: id.into(),
        events,
        killed_at,
        ..CandidateLog::default()
    }
}

/// Three terms, one after the other (times in µs):
/// - c0 (token 10) from 100, renews, writes twice, ends at 1200 (SIGTERM) and exits;
/// - c1 (token 20) from 1400, writes twice and is SIGKILLed at 2500 (its term ends there);
/// - c2 (token 30) from 2600, writes once acknowledged, then once of unknown outcome, and
///   ends at 3600; the object holds that last write (it landed).
fn clean() -> History {
    let c0 = vec![
        ev("c0", EV_READY, 10, 0, 0),
        ev("c0", EV_TERM_STARTED, 100, 10, 1300),
        write("c0", 10, 1, [200, 350, 400], 1300, OUT_ACCEPTED),
        ev("c0", EV_RENEWED, 700, 10, 1350),
        write("c0", 10, 2, [800, 950, 1000], 1350, OUT_ACCEPTED),
        ended("c0", 1200, 10, 1350, "sigterm"),
        ev("c0", EV_RELEASING, 1210, 0, 0),
        ev("c0", EV_EXIT, 1300, 0, 0),
    ];
    let c1 = vec![
        ev("c1", EV_READY, 20, 0, 0),
        ev("c1", EV_TERM_STARTED, 1400, 20, 3400),
        write("c1", 20, 1, [1500, 1650, 1700], 3400, OUT_ACCEPTED),
        write("c1", 20, 2, [1800, 1950, 2000], 3400, OUT_ACCEPTED),
    ];
    let c2 = vec![
        ev("c2", EV_READY, 30, 0, 0),
        ev("c2", EV_TERM_STARTED, 2600, 30, 4600),
        write("c2", 30, 1, [2700, 2850, 2900], 4600, OUT_ACCEPTED),
        write("c2", 30, 2, [3000, 3150, 3500], 4600, OUT_UNKNOWN),
        ended("c2", 3600, 30, 4600, "sigterm"),
        ev("c2", EV_RELEASING, 3610, 0, 0),
        ev("c2", EV_EXIT, 3700, 0, 0),
    ];
    History {
        logs: vec![
            plain("c0", c0, None),
            plain("c1", c1, Some(2500)),
            plain("c2", c2, None),
        ],
        object: Some(obj("c2/30/2")),
    }
}

/// Asserts that the checker finds a violation containing `what` in `h`.
fn caught(h: &History, what: &str) -> Verdict {
    let v = h.check();
    assert!(
        v.violations.iter().any(|m| m.contains(what)),
        "no violation says {what:?}; the checker found: {:#?}",
        v.violations
    );
    v
}

// --- The positive controls.

#[test]
fn a_clean_history_passes() {
    let h = clean();
    let v = h.check();
    assert!(v.violations.is_empty(), "{:#?}", v.violations);
    let spans: Vec<_> = v.terms.iter().map(|s| (s.token, s.start, s.end)).collect();
    // c1's term ends at its death.
    assert_eq!(spans, [(10, 100, 1200), (20, 1400, 2500), (30, 2600, 3600)]);
    assert_eq!((v.accepted, v.fenced, v.failed), (5, 0, 1));
}

#[test]
fn a_clean_history_read_from_its_logs_passes() {
    let h = clean();
    let read = History::from_texts(&h.texts(), h.object.clone());
    for (a, b) in read.logs.iter().zip(&h.logs) {
        assert_eq!(a.events, b.events);
        assert!(a.unreadable.is_empty() && !a.torn_tail, "{a:?}");
    }
    assert_eq!(read.logs[1].lines, [1, 2, 3, 4]);
    let v = read.check();
    assert!(v.violations.is_empty(), "{:#?}", v.violations);
}

#[test]
fn a_torn_last_line_of_a_killed_candidate_is_passed_over() {
    let h = clean();
    let mut texts = h.texts();
    texts[1]
        .1
        .push_str(r#"{"ev":"write","t":2600,"id":"c1","tok"#);
    let read = History::from_texts(&texts, h.object.clone());
    assert!(read.logs[1].torn_tail);
    let v = read.check();
    assert!(v.violations.is_empty(), "{:#?}", v.violations);
    // A whole last line, only its end of line missing, is an event.
    let mut texts = h.texts();
    let line = serde_json::to_string(&ev("c1", EV_RENEWED, 2100, 20, 3500)).unwrap();
    texts[1].1.push_str(&line);
    let read = History::from_texts(&texts, h.object.clone());
    assert_eq!(read.logs[1].events.len(), 5);
    assert!(read.check().violations.is_empty());
}

// --- Unreadable logs.

/// `h`'s logs with `line` inserted into `id`'s as line `n` (from 1).
fn with_line(h: &History, id: &str, n: usize, line: &str) -> History {
    let mut texts = h.texts();
    let t = &mut texts.iter_mut().find(|t| t.0 == id).unwrap().1;
    let mut lines: Vec<&str> = t.lines().collect();
    lines.insert(n - 1, line);
    *t = lines.iter().map(|l| format!("{l}\n")).collect();
    History::from_texts(&texts, h.object.clone())
}

#[test]
fn a_line_that_is_not_json_is_caught() {
    let h = with_line(&clean(), "c1", 3, "{not json");
    caught(&h, r#"c1's log: line 3 is not an event"#);
    caught(&h, r#""{not json""#);
    // The lines after it are read, with their own line numbers.
    assert_eq!(h.logs[1].lines, [1, 2, 4, 5]);
}

#[test]
fn a_line_missing_a_field_is_caught() {
    let h = with_line(
        &clean(),
        "c1",
        3,
        r#"{"ev":"renewed","id":"c1","token":20}"#,
    );
    caught(&h, "line 3 is not an event (missing field `t`");
}

#[test]
fn a_line_of_an_unknown_event_is_caught() {
    let h = with_line(&clean(), "c1", 3, r#"{"ev":"leading","t":1450,"id":"c1"}"#);
    caught(&h, r#"line 3 is not an event (unknown event "leading")"#);
}

#[test]
fn a_write_line_of_an_unknown_outcome_is_caught() {
    let line = r#"{"ev":"write","t":1460,"id":"c1","token":20,"seq":9,"t0":1410,"t1":1420,"outcome":"maybe"}"#;
    let h = with_line(&clean(), "c1", 3, line);
    caught(
        &h,
        r#"line 3 is not an event (unknown write outcome "maybe")"#,
    );
}

#[test]
fn a_long_unreadable_line_is_quoted_cut() {
    let junk = "x".repeat(5000);
    let h = with_line(&clean(), "c0", 2, &junk);
    let v = caught(&h, "line 2 is not an event");
    let m = v.violations.iter().find(|m| m.contains("line 2")).unwrap();
    assert!(m.ends_with("...") && m.len() < 400, "{m}");
}

#[test]
fn an_unterminated_last_line_of_a_candidate_not_killed_is_caught() {
    let h = clean();
    // Torn.
    let mut texts = h.texts();
    texts[0].1.push_str(r#"{"ev":"ex"#);
    caught(
        &History::from_texts(&texts, h.object.clone()),
        "c0's log: line 9 has no end of line and the candidate was not killed",
    );
    // Whole, its end of line missing.
    let mut texts = h.texts();
    texts[0].1.pop();
    caught(
        &History::from_texts(&texts, h.object.clone()),
        "c0's log: line 8 has no end of line and the candidate was not killed",
    );
}

#[test]
fn a_torn_line_before_the_last_is_caught_even_if_killed() {
    let h = with_line(&clean(), "c1", 3, r#"{"ev":"write","t":16"#);
    caught(&h, "c1's log: line 3 is not an event");
}

// --- Out of place in a candidate's log.

#[test]
fn an_unknown_event_is_caught() {
    let mut h = clean();
    h.log("c1")
        .events
        .insert(2, ev("c1", "leading", 1450, 20, 3400));
    caught(&h, r#"c1's log, event 3: unknown event "leading""#);
}

#[test]
fn a_write_of_an_unknown_outcome_is_caught() {
    let mut h = clean();
    h.write("c1", 1).outcome = "maybe".into();
    caught(&h, r#"write 1 has the unknown outcome "maybe""#);
}

#[test]
fn an_event_of_another_candidate_is_caught() {
    let mut h = clean();
    h.write("c1", 2).id = "c2".into();
    caught(&h, r#"c1's log, event 4: the event is "c2"'s"#);
}

#[test]
fn token_0_inside_a_term_is_caught() {
    let mut h = clean();
    h.retoken("c2", 0);
    h.object = Some(obj("c2/0/2"));
    caught(&h, "term_started with token 0 (inside a term)");
}

#[test]
fn an_event_out_of_time_order_is_caught() {
    let mut h = clean();
    h.events("c0", EV_RENEWED).next().unwrap().t = 300; // before write 1 was answered (400)
    caught(
        &h,
        "renewed logged at 0.3 ms, before the 0.4 ms of an earlier line",
    );
}

#[test]
fn a_term_started_inside_another_is_caught() {
    let mut h = clean();
    let c0 = &mut h.log("c0").events;
    c0.insert(4, ev("c0", EV_TERM_STARTED, 750, 11, 1300));
    caught(&h, "term 11 started while its term 10 had not ended");
}

#[test]
fn ending_a_term_never_started_is_caught() {
    let mut h = clean();
    let c2 = &mut h.log("c2").events;
    c2.insert(5, ended("c2", 3605, 99, 4600, "sigterm"));
    caught(&h, "ended term 99 that it had not logged as started");
}

#[test]
fn acting_outside_a_term_is_caught() {
    let mut h = clean();
    let c0 = &mut h.log("c0").events;
    c0.insert(6, ev("c0", EV_RENEWED, 1205, 10, 1400)); // after its term ended
    caught(
        &h,
        "c0's log, event 7: acted (renewed) with token 10 outside a term of its own",
    );
}

#[test]
fn a_sequence_number_that_does_not_go_up_is_caught() {
    let mut h = clean();
    h.write("c2", 2).seq = 1;
    caught(&h, "write 1 logged after write 1: sequence numbers go up");
}

#[test]
fn a_write_sent_before_it_was_decided_is_caught() {
    let mut h = clean();
    h.write("c1", 1).t1 = 1490; // decided at 1500
    caught(
        &h,
        "write 1 decided at 1.5 ms, sent at 1.5 ms, answered at 1.7 ms: not in that order",
    );
}

#[test]
fn a_write_answered_before_it_was_sent_is_caught() {
    let mut h = clean();
    h.write("c1", 1).t = 1600; // sent at 1650
    caught(&h, "answered at 1.6 ms: not in that order");
}

// --- Terms.

#[test]
fn a_term_that_ends_before_it_starts_is_caught() {
    let mut h = clean();
    h.events("c0", EV_TERM_ENDED).next().unwrap().t = 20; // started at 100
    caught(
        &h,
        "term 10 of c0 ends at 0.0 ms, before it starts at 0.1 ms",
    );
}

#[test]
fn a_term_logged_as_started_after_its_deadline_is_caught() {
    let mut h = clean();
    for e in &mut h.log("c2").events {
        if e.token != 0 {
            e.deadline = 2520; // it started at 2600
        }
    }
    h.events("c2", EV_TERM_ENDED).next().unwrap().t = 2520;
    caught(
        &h,
        "term 30 of c2 ends at 2.5 ms, before it starts at 2.6 ms",
    );
}

#[test]
fn overlapping_terms_are_caught() {
    let mut h = clean();
    h.events("c2", EV_TERM_STARTED).next().unwrap().t = 2400; // c1 is alive until 2500
    caught(
        &h,
        "terms overlap: c1 (token 20) acted until 2.5 ms, c2 (token 30) began at 2.4 ms",
    );
}

#[test]
fn a_kill_stamped_before_the_last_line_does_not_end_the_term_there() {
    let mut h = clean();
    // The driver stamped the kill at 1450; c1 then logged writes until 2000.
    h.log("c1").killed_at = Some(1450);
    h.events("c2", EV_TERM_STARTED).next().unwrap().t = 1900;
    caught(
        &h,
        "terms overlap: c1 (token 20) acted until 2.0 ms, c2 (token 30) began at 1.9 ms",
    );
}

#[test]
fn a_token_issued_twice_is_caught() {
    let mut h = clean();
    h.retoken("c2", 20);
    h.object = Some(obj("c2/20/2"));
    caught(&h, r#"token 20 was issued more than once: ["c1", "c2"]"#);
}

#[test]
fn a_token_lower_than_the_last_is_caught() {
    let mut h = clean();
    h.retoken("c2", 15);
    h.object = Some(obj("c2/15/2"));
    caught(&h, "tokens do not increase: c1 held 20 before c2 held 15");
}

#[test]
fn a_write_after_its_term_ended_is_caught() {
    let mut h = clean();
    // c2's term ends at its deadline, 3600; its second write was decided after.
    for e in &mut h.log("c2").events {
        if e.token != 0 {
            e.deadline = 3600;
        }
    }
    *h.write("c2", 2) = write("c2", 30, 2, [3700, 3750, 3800], 3600, OUT_UNKNOWN);
    for e in &mut h.log("c2").events[5..] {
        e.t += 200; // releasing, exit
    }
    caught(
        &h,
        "c2 wrote with token 30 at 3.7 ms, after its term ended at 3.6 ms",
    );
}

#[test]
fn a_write_before_its_term_started_is_caught() {
    let mut h = clean();
    h.write("c2", 1).t0 = 2540; // it started at 2600
    caught(
        &h,
        "c2 wrote with token 30 at 2.5 ms, before its term started at 2.6 ms",
    );
}

// --- The protected object.

#[test]
fn a_stale_write_accepted_is_caught() {
    let mut h = clean();
    // c0 is paused between deciding its second write (1100, inside its term) and sending it
    // (1760): c1 has written with token 20 meanwhile (acknowledged at 1700), yet the store
    // accepts c0's token 10.
    h.log("c0").events = vec![
        ev("c0", EV_READY, 10, 0, 0),
        ev("c0", EV_TERM_STARTED, 100, 10, 1300),
        write("c0", 10, 1, [200, 350, 400], 1300, OUT_ACCEPTED),
        write("c0", 10, 2, [1100, 1760, 1800], 1300, OUT_ACCEPTED),
        ended("c0", 1300, 10, 1300, "invalid"),
        ev("c0", EV_RELEASING, 1810, 0, 0),
        ev("c0", EV_EXIT, 1900, 0, 0),
    ];
    let v = caught(
        &h,
        "stale write accepted: c0 wrote with token 10 at 1.8 ms after c1 had written with token 20 (acknowledged at 1.7 ms)",
    );
    assert_eq!(v.violations.len(), 1, "{:#?}", v.violations);
}

#[test]
fn a_lost_acknowledged_write_is_caught() {
    let mut h = clean();
    h.object = Some(obj("c1/20/2")); // c2's write 1 was acknowledged
    caught(
        &h,
        r#"acknowledged write c2/30/1 is lost: the object holds "c1/20/2" (fence 20)"#,
    );
}

#[test]
fn a_missing_object_after_acknowledged_writes_is_caught() {
    let mut h = clean();
    h.object = None;
    caught(
        &h,
        "acknowledged write c2/30/1 is lost: the object does not exist",
    );
}

#[test]
fn a_failed_write_in_the_object_is_caught() {
    let mut h = clean();
    h.write("c2", 2).outcome = OUT_FAILED.into();
    caught(
        &h,
        "a write reported as failed (not applied) is in the object: c2/30/2",
    );
}

#[test]
fn a_fence_that_is_not_the_content_token_is_caught() {
    let mut h = clean();
    h.object = Some(FinalObject {
        fence: 31,
        value: "c2/30/2".into(),
    });
    caught(
        &h,
        r#"the object's fence 31 is not the token of its content "c2/30/2""#,
    );
}
