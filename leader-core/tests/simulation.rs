//! The deterministic simulation: many seeds, negative controls, determinism, and checkers that
//! can fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use leader_core::simulation::{
    Event, NegativeControl, SimConfig, check_fencing, check_liveness, check_one_leader,
    check_tokens, run,
};

/// Runs `seeds` seeds from `first` on two threads; returns the failing seeds with details.
fn run_seeds(first: u64, seeds: u64, negative: NegativeControl) -> Vec<(u64, String)> {
    let half = seeds / 2;
    let ranges = [(first, first + half), (first + half, first + seeds)];
    let threads: Vec<_> = ranges
        .into_iter()
        .map(|(a, b)| {
            std::thread::spawn(move || {
                (a..b)
                    .filter_map(|seed| {
                        let r = run(&SimConfig::new(seed).with_negative(negative));
                        assert!(r.terms > 0, "seed {seed}: no term at all");
                        (!r.violations.is_empty()).then(|| (seed, format!("{:?}", r.violations)))
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

#[test]
fn a_thousand_seeds_keep_every_invariant() {
    let failed = run_seeds(0, 1000, NegativeControl::None);
    assert!(
        failed.is_empty(),
        "{} seeds broke invariants; replay with `cargo run -p leader-core --features simulation --example simulate -- --seed N --verbose`: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
}

#[test]
fn a_candidate_that_ignores_its_deadline_is_caught() {
    let failed = run_seeds(0, 60, NegativeControl::IgnoreDeadline);
    assert!(
        failed.len() >= 30,
        "only {} of 60 seeds caught it",
        failed.len()
    );
    assert!(failed.iter().any(|(_, v)| v.contains("one_leader")));
}

#[test]
fn clock_drift_beyond_the_margin_is_caught() {
    let failed = run_seeds(0, 60, NegativeControl::ExcessiveDrift);
    assert!(
        failed.len() >= 15,
        "only {} of 60 seeds caught it",
        failed.len()
    );
}

#[test]
fn the_same_seed_plays_the_same_history() {
    for seed in [3, 77, 1234] {
        let a = run(&SimConfig::new(seed));
        let b = run(&SimConfig::new(seed));
        assert!(a.events.len() > 100);
        assert_eq!(
            canonical(&a.events),
            canonical(&b.events),
            "seed {seed} is not deterministic"
        );
        assert_eq!(a.violations, b.violations);
    }
    assert_ne!(
        canonical(&run(&SimConfig::new(1)).events),
        canonical(&run(&SimConfig::new(2)).events)
    );
}

/// The history up to the order of events logged at the same instant by different tasks
/// (tokio's watch channel wakes its waiters in a random order, which only reorders the
/// outside observer's entries within one instant).
fn canonical(events: &[Event]) -> Vec<String> {
    let mut v: Vec<(Duration, String)> = events
        .iter()
        .map(|e| {
            let at = match *e {
                Event::Started { at, .. }
                | Event::TermStarted { at, .. }
                | Event::TermEnded { at, .. }
                | Event::Write { at, .. }
                | Event::Crashed { at, .. }
                | Event::Frozen { at, .. }
                | Event::Partitioned { at, .. }
                | Event::Outage { at, .. }
                | Event::Storm { at, .. }
                | Event::Resigned { at, .. }
                | Event::Granted { at, .. }
                | Event::Revoked { at, .. }
                | Event::Applied { at, .. } => at,
            };
            (at, format!("{e:?}"))
        })
        .collect();
    v.sort();
    v.into_iter().map(|(_, s)| s).collect()
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
fn checker_liveness_flags_a_long_gap_only_when_the_store_was_healthy() {
    let config = SimConfig::new(0);
    let base = [
        Event::Started { cand: 0, at: ms(0) },
        Event::Started { cand: 1, at: ms(0) },
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
    let (_, v) = check_liveness(&config, &base);
    assert_eq!(v.len(), 1, "{v:?}");
    let mut with_outage = base.to_vec();
    with_outage.push(Event::Outage {
        at: ms(9_000),
        until: ms(19_000),
    });
    let (_, v) = check_liveness(&config, &with_outage);
    assert!(v.is_empty(), "{v:?}");
}
