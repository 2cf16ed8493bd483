//! Chaos drills on a Raft group of the candidates themselves (`raft://`, see
//! `integration_tests::chaos::raft`): three candidate processes, each one member of the
//! group, a few rounds of each scenario that applies (the members cannot be put behind the
//! fault proxy, so no partition, stall or late delivery).

mod chaos_support;

use integration_tests::chaos::BackendKind;
use integration_tests::chaos::drill::Scenario;

/// Rounds of each scenario.
const ROUNDS: usize = 3;

async fn rounds(scenario: Scenario, rounds: usize) {
    assert!(scenario.applies_to(BackendKind::Raft));
    for _ in 0..rounds {
        chaos_support::drill(BackendKind::Raft, scenario).await;
    }
}

/// SIGKILL of the leading candidate, and of its member (the Raft leader, or not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill() {
    rounds(Scenario::Kill, ROUNDS).await;
}

/// SIGSTOP of the leading candidate past its ttl, its member paused with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop() {
    rounds(Scenario::Stop, ROUNDS).await;
}

/// SIGTERM of the leading candidate: it releases, then its member leaves with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn term() {
    rounds(Scenario::Term, ROUNDS).await;
}
