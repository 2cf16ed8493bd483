//! Chaos drills over a quorum of three file stores (three folders) with real candidate
//! processes (see `integration_tests::chaos`), a few rounds of each scenario.

mod chaos_support;

use integration_tests::chaos::BackendKind;
use integration_tests::chaos::drill::Scenario;

/// Rounds of each scenario.
const ROUNDS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill() {
    chaos_support::rounds(BackendKind::QuorumFile, Scenario::Kill, ROUNDS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop() {
    chaos_support::rounds(BackendKind::QuorumFile, Scenario::Stop, ROUNDS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn term() {
    chaos_support::rounds(BackendKind::QuorumFile, Scenario::Term, ROUNDS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_away() {
    chaos_support::rounds(BackendKind::QuorumFile, Scenario::MemberAway, 2).await;
}
