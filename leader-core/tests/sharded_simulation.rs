//! The sharded simulation: seeds without a flaw break nothing; each planted flaw is caught.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use leader_core::simulation::ShardFlaw;
use leader_core::simulation::{ShardReport, ShardSimConfig, run_sharded};

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
/// guard.
#[test]
fn every_planted_flaw_is_caught() {
    let cases = [
        ("lagging owner read", ShardFlaw::LaggingOwnerRead, false, 40),
        ("no token reservation", ShardFlaw::NoReservation, false, 40),
        ("ownership by id alone", ShardFlaw::OwnerById, false, 300),
        (
            "absent records ignore claims",
            ShardFlaw::IgnoreClaims,
            false,
            400,
        ),
        ("work ignores the deadline", ShardFlaw::None, true, 10),
    ];
    for (name, flaw, ignore_deadline, budget) in cases {
        let caught = (0..budget).find(|s| !run(*s, flaw, ignore_deadline).violations.is_empty());
        assert!(caught.is_some(), "{name}: not caught in {budget} seeds");
    }
}

#[test]
fn one_seed_plays_the_same_history_twice() {
    let a = run(7, ShardFlaw::None, false);
    let b = run(7, ShardFlaw::None, false);
    assert_eq!(a.events, b.events);
}
