//! Chaos drills over a quorum of three file stores (three folders) with real candidate
//! processes (see `integration_tests::chaos`), a few rounds of each scenario.

mod chaos_support;

use integration_tests::chaos::BackendKind;
use integration_tests::chaos::drill::Scenario;

/// Rounds of each scenario.
const ROUNDS: usize = 3;

async fn rounds(scenario: Scenario, rounds: usize) {
    for _ in 0..rounds {
        chaos_support::drill(BackendKind::QuorumFile, scenario).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill() {
    rounds(Scenario::Kill, ROUNDS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop() {
    rounds(Scenario::Stop, ROUNDS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn term() {
    rounds(Scenario::Term, ROUNDS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_away() {
    rounds(Scenario::MemberAway, 2).await;
}
