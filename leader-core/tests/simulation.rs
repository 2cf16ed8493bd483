//! The deterministic simulation: many seeds, negative controls, determinism, and checkers that
//! can fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use leader_core::simulation::{
    Event, NegativeControl, Report, SimConfig, check_fencing, check_liveness, check_one_leader,
    check_tokens, liveness_bound, run,
};

/// What one seed gave, kept small.
struct Outcome {
    seed: u64,
    violations: String,
    checkers: Vec<&'static str>,
    late_lease: usize,
    late_fenced: usize,
    /// Acquires that the store applied after their sender had timed out (and re-read): each
    /// began a term in the store that its sender had given up on.
    late_acquires_applied: usize,
    paused_in_flight: usize,
    /// Of those, pauses followed by a partition as the process resumes.
    paused_then_cut: usize,
    gaps: usize,
    healthy_start_gaps: usize,
}

fn outcome(r: &Report) -> Outcome {
    let (late_lease, late_fenced) = r.late_writes();
    Outcome {
        seed: r.seed,
        violations: format!("{:?}", r.violations),
        checkers: r.violations.iter().map(|v| v.checker).collect(),
        late_lease,
        late_fenced,
        late_acquires_applied: r.late_acquires(),
        paused_in_flight: r
            .events
            .iter()
            .filter(|e| matches!(e, Event::PausedInFlight { .. }))
            .count(),
        paused_then_cut: r
            .events
            .windows(2)
            .filter(|w| {
                matches!(
                    (&w[0], &w[1]),
                    (Event::PausedInFlight { cand: a, .. }, Event::Partitioned { cand: b, .. })
                        if a == b
                )
            })
            .count(),
        gaps: r.gaps.len(),
        healthy_start_gaps: r.gaps.iter().filter(|g| g.healthy_start).count(),
    }
}

/// Runs `seeds` seeds from `first` on two threads.
fn run_seeds(first: u64, seeds: u64, negative: NegativeControl) -> Vec<Outcome> {
    let half = seeds / 2;
    let ranges = [(first, first + half), (first + half, first + seeds)];
    let threads: Vec<_> = ranges
        .into_iter()
        .map(|(a, b)| {
            std::thread::spawn(move || {
                (a..b)
                    .map(|seed| {
                        let r = run(&SimConfig::new(seed).with_negative(negative));
                        assert!(r.terms > 0, "seed {seed}: no term at all");
                        outcome(&r)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect()
}

fn caught<'a>(outcomes: &'a [Outcome], checker: &str) -> Vec<&'a Outcome> {
    outcomes
        .iter()
        .filter(|o| o.checkers.contains(&checker))
        .collect()
}

#[test]
fn a_thousand_seeds_keep_every_invariant() {
    let outcomes = run_seeds(0, 1000, NegativeControl::None);
    let failed: Vec<(u64, &str)> = outcomes
        .iter()
        .filter(|o| !o.checkers.is_empty())
        .map(|o| (o.seed, o.violations.as_str()))
        .collect();
    assert!(
        failed.is_empty(),
        "{} seeds broke invariants; replay with `cargo run -p leader-core --features simulation --example simulate -- --seed N --verbose`: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    // The faults that make the checkers able to fail did happen.
    let sum = |f: fn(&Outcome) -> usize| outcomes.iter().map(f).sum::<usize>();
    assert!(sum(|o| o.late_lease) > 1000, "lease writes delivered late");
    assert!(
        sum(|o| o.late_fenced) > 5000,
        "fenced writes delivered late"
    );
    assert!(
        sum(|o| o.late_acquires_applied) > 20,
        "late acquires that landed after their sender re-read: {}",
        sum(|o| o.late_acquires_applied)
    );
    assert!(sum(|o| o.paused_in_flight) > 500, "pauses in flight");
    assert!(
        sum(|o| o.paused_then_cut) > 200,
        "pauses in flight, then cut off"
    );
    // Every gap is judged; most start with a healthy store.
    assert!(sum(|o| o.healthy_start_gaps) * 10 > sum(|o| o.gaps) * 7);
}

#[test]
fn a_candidate_that_ignores_its_deadline_is_caught() {
    let outcomes = run_seeds(0, 60, NegativeControl::IgnoreDeadline);
    let n = caught(&outcomes, "one_leader").len();
    assert!(n >= 30, "only {n} of 60 seeds caught it");
}

#[test]
fn clock_drift_beyond_the_margin_is_caught() {
    let outcomes = run_seeds(0, 60, NegativeControl::ExcessiveDrift);
    let n = outcomes.iter().filter(|o| !o.checkers.is_empty()).count();
    assert!(n >= 15, "only {n} of 60 seeds caught it");
}

/// The fencing checker can fail: a resource that ignores tokens accepts a deposed leader's
/// write that arrives late, after its successor's.
#[test]
fn a_resource_that_ignores_tokens_is_caught() {
    let outcomes = run_seeds(0, 60, NegativeControl::UnfencedResource);
    let n = caught(&outcomes, "fencing").len();
    assert!(n >= 15, "only {n} of 60 seeds caught it");
    // The bug is in the resource alone: the candidates still keep one leader at a time.
    assert!(caught(&outcomes, "one_leader").is_empty());
}

/// The liveness checker can fail: followers that poll too rarely take over too late.
#[test]
fn followers_that_poll_too_rarely_are_caught() {
    let outcomes = run_seeds(0, 60, NegativeControl::LazyFollowers);
    let n = caught(&outcomes, "liveness").len();
    assert!(n >= 5, "only {n} of 60 seeds caught it");
    assert!(caught(&outcomes, "one_leader").is_empty());
}

/// The simulation really exercises followers' lagging reads: when the replica behind them
/// stops catching up, followers miss releases and expiries, and the liveness checker sees it.
/// (Followers that read the record some other way would not notice, and this would fail.)
#[test]
fn a_replica_that_stops_catching_up_is_caught() {
    let outcomes = run_seeds(0, 60, NegativeControl::FrozenReplica);
    let n = caught(&outcomes, "liveness").len();
    assert!(n >= 15, "only {n} of 60 seeds caught it");
    assert!(caught(&outcomes, "one_leader").is_empty());
    assert!(caught(&outcomes, "tokens").is_empty());
}

/// Event for event: two runs of a seed give the same history, in the same order. (tokio's
/// runtimes seed their own generators from the OS, so two runs in one process differ in
/// whatever that generator decides; the simulation must not let it decide anything.)
#[test]
fn the_same_seed_plays_the_same_history() {
    let seeds: Vec<u64> = (0..20).chain([77, 1234]).collect();
    let first: Vec<Report> = seeds.iter().map(|&s| run(&SimConfig::new(s))).collect();
    let second = std::thread::spawn(move || {
        seeds
            .iter()
            .map(|&s| run(&SimConfig::new(s)))
            .collect::<Vec<_>>()
    })
    .join()
    .unwrap();
    for (a, b) in first.iter().zip(&second) {
        assert!(a.events.len() > 100);
        assert_eq!(a.events, b.events, "seed {} is not deterministic", a.seed);
        assert_eq!(a.history_hash(), b.history_hash());
        assert_eq!(a.violations, b.violations);
    }
    assert_ne!(first[1].history_hash(), first[2].history_hash());
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn checker_one_leader_flags_overlapping_beliefs() {
    let h = [
        Event::TermStarted {
            cand: 0,
            token: 1,
            at: ms(0),
        },
        Event::TermStarted {
            cand: 1,
            token: 2,
            at: ms(500),
        },
        Event::TermEnded {
            cand: 0,
            token: 1,
            at: ms(600),
        },
        Event::TermEnded {
            cand: 1,
            token: 2,
            at: ms(900),
        },
    ];
    let v = check_one_leader(&h, ms(1000));
    assert_eq!(v.len(), 1, "{v:?}");
    // Back to back is fine.
    let ok = [
        Event::TermStarted {
            cand: 0,
            token: 1,
            at: ms(0),
        },
        Event::TermEnded {
            cand: 0,
            token: 1,
            at: ms(500),
        },
        Event::TermStarted {
            cand: 1,
            token: 2,
            at: ms(500),
        },
    ];
    assert!(check_one_leader(&ok, ms(1000)).is_empty());
    // A crash ends a belief.
    let crash = [
        Event::TermStarted {
            cand: 0,
            token: 1,
            at: ms(0),
        },
        Event::Crashed {
            cand: 0,
            at: ms(100),
        },
        Event::TermStarted {
            cand: 1,
            token: 2,
            at: ms(200),
        },
    ];
    assert!(check_one_leader(&crash, ms(1000)).is_empty());
}

#[test]
fn checker_tokens_flags_repeats_and_decreases() {
    let h = [
        Event::TermStarted {
            cand: 0,
            token: 5,
            at: ms(0),
        },
        Event::TermStarted {
            cand: 1,
            token: 5,
            at: ms(10),
        },
        Event::TermStarted {
            cand: 2,
            token: 4,
            at: ms(20),
        },
    ];
    assert_eq!(check_tokens(&h).len(), 2);
}

#[test]
fn checker_fencing_flags_a_lower_accepted_token() {
    let w = |cand, token, at, accepted| Event::Write {
        cand,
        token,
        at: ms(at),
        accepted,
    };
    let h = [
        w(0, 2, 0, true),
        w(1, 3, 10, true),
        w(0, 2, 20, false),
        w(0, 2, 30, true),
    ];
    let v = check_fencing(&h);
    assert_eq!(v.len(), 1, "{v:?}");
}

#[test]
fn checker_liveness_judges_healthy_stretches() {
    let config = SimConfig::new(0);
    // (ttl 2 s + poll 1.1 x 0.4 s + replica lag 0.3 s + 2 x 0.2 s + 4 x 10 ms) x 1.02 + 50 ms
    let bound = liveness_bound(&config);
    assert!(bound > ms(3_293) && bound < ms(3_294), "{bound:?}");
    // Two candidates; cand 0 leads until 10 s, cand 1 only from 20 s.
    let base = [
        Event::Started { cand: 0, at: ms(0) },
        Event::Started { cand: 1, at: ms(0) },
        Event::Applied {
            cand: 0,
            token: 1,
            at: ms(5),
        },
        Event::Granted {
            cand: 0,
            token: 1,
            at: ms(10),
        },
        Event::TermStarted {
            cand: 0,
            token: 1,
            at: ms(10),
        },
        Event::TermEnded {
            cand: 0,
            token: 1,
            at: ms(10_000),
        },
        Event::Revoked {
            cand: 0,
            token: 1,
            at: ms(10_000),
        },
        Event::Granted {
            cand: 1,
            token: 2,
            at: ms(20_000),
        },
        Event::TermStarted {
            cand: 1,
            token: 2,
            at: ms(20_000),
        },
    ];
    let judge = |extra: &[Event]| {
        let mut h = base.to_vec();
        h.extend_from_slice(extra);
        check_liveness(&config, &h)
    };
    let (gaps, v) = judge(&[]);
    assert_eq!(v.len(), 1, "{v:?}");
    // The run starts with a gap of 5 ms (to the store's applying cand 0's acquire).
    assert_eq!(gaps.len(), 2, "{gaps:?}");
    assert_eq!(gaps[0].len(), ms(5));
    assert!(gaps.iter().all(|g| g.healthy_start));
    assert_eq!(gaps[1].len(), ms(10_000));
    // An outage over most of the gap leaves a healthy second: fine.
    let outage = Event::Outage {
        at: ms(9_000),
        until: ms(19_000),
    };
    let (gaps, v) = judge(std::slice::from_ref(&outage));
    assert!(v.is_empty(), "{v:?}");
    assert!(!gaps[1].healthy_start);
    assert_eq!(gaps[1].longest_healthy, ms(1_000));
    // An outage in the middle leaves 4 s healthy on either side: too long.
    let (_, v) = judge(&[Event::Outage {
        at: ms(14_000),
        until: ms(16_000),
    }]);
    assert_eq!(v.len(), 1, "{v:?}");
    // Both candidates unable in turn: neither is able for a long stretch.
    let (_, v) = judge(&[
        Event::Frozen {
            cand: 1,
            at: ms(10_000),
            until: ms(19_000),
        },
        Event::Partitioned {
            cand: 0,
            at: ms(12_000),
            until: ms(20_000),
        },
    ]);
    assert!(v.is_empty(), "{v:?}");
    // A lease write held by the store makes it unhealthy; a held fenced write does not.
    let held = |fenced| Event::Held {
        cand: 1,
        at: ms(11_000),
        until: ms(18_000),
        fenced,
    };
    assert!(judge(&[held(false)]).1.is_empty());
    assert_eq!(judge(&[held(true)]).1.len(), 1);
    // A crashed candidate is not able.
    let (_, v) = judge(&[
        Event::Crashed {
            cand: 0,
            at: ms(10_000),
        },
        Event::Frozen {
            cand: 1,
            at: ms(11_000),
            until: ms(19_000),
        },
    ]);
    assert!(v.is_empty(), "{v:?}");
}
