//! The sharded simulation: seeds without a flaw break nothing; each planted flaw is caught.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use leader_core::simulation::{ShardFlaw, ShardReport, ShardSimConfig, run_sharded};

fn run(seed: u64, flaw: ShardFlaw, ignore_deadline: bool) -> ShardReport {
    let mut config = ShardSimConfig::new(seed).with_flaw(flaw);
    config.ignore_deadline = ignore_deadline;
    run_sharded(&config)
}

#[test]
fn sharded_seeds_keep_every_invariant() {
    let count: u64 = std::env::var("SHARD_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let reports: Vec<_> = (0..count).map(|s| run(s, ShardFlaw::None, false)).collect();
    let broken: Vec<_> = reports
        .iter()
        .filter(|r| !r.violations.is_empty())
        .map(|r| (r.seed, r.violations.clone()))
        .collect();
    assert!(broken.is_empty(), "{broken:#?}");
    // Shards change hands many times in each seed.
    let terms: usize = reports.iter().map(|r| r.terms).sum();
    assert!(terms > reports.len() * 30, "only {terms} terms");
}

/// Each planted flaw breaks an invariant within a few seeds: the checkers see what they
/// guard. (The flaws of the reviews' findings, and ownership by id alone, which two rules now
/// close, need one exact interleaving each, which random seeds do not play:
/// `tests/sharded_directed.rs` plays them.) An absent record free despite claims is caught in
/// rarer seeds (found with `simulate_sharded --flaw ignore-claims`; since an earlier term of an
/// id claims every shard, the first at or after 510 is 727): its search starts at 720, to keep
/// the test short (from 510 it took 90 s of CI). The cases run side by side.
#[test]
fn every_planted_flaw_is_caught() {
    let cases = [
        (
            "lagging owner read",
            ShardFlaw::LaggingOwnerRead,
            false,
            0..40,
        ),
        (
            "no token reservation",
            ShardFlaw::NoReservation,
            false,
            0..40,
        ),
        (
            "a stale plan acted on",
            ShardFlaw::TrustThePlan,
            false,
            0..40,
        ),
        (
            "absent records ignore claims",
            ShardFlaw::IgnoreClaims,
            false,
            720..980,
        ),
        ("work ignores the deadline", ShardFlaw::None, true, 0..10),
    ];
    std::thread::scope(|scope| {
        let searches: Vec<_> = cases
            .into_iter()
            .map(|(name, flaw, ignore_deadline, seeds)| {
                let budget = seeds.clone();
                let found = scope.spawn(move || {
                    seeds
                        .into_iter()
                        .find(|s| !run(*s, flaw, ignore_deadline).violations.is_empty())
                });
                (name, budget, found)
            })
            .collect();
        for (name, budget, found) in searches {
            let caught = found.join().expect("a search panicked");
            assert!(caught.is_some(), "{name}: not caught in seeds {budget:?}");
        }
    });
}

#[test]
fn one_seed_plays_the_same_history_twice() {
    let a = run(7, ShardFlaw::None, false);
    let b = run(7, ShardFlaw::None, false);
    assert_eq!(a.events, b.events);
}
