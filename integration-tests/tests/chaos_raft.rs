//! Chaos drills on a Raft group of the candidates themselves (`raft://`, see
//! `integration_tests::chaos::raft`): three candidate processes, each one member of the
//! group, a few rounds of each scenario that applies. Each member sits behind a TCP proxy that
//! traces connections to their candidate, so a member can be cut from the others (partition,
//! stall); late delivery does not apply (no proxy between a candidate and its own member).

mod chaos_support;

use integration_tests::chaos::BackendKind;
use integration_tests::chaos::drill::Scenario;

/// Rounds of each scenario.
const ROUNDS: usize = 3;

/// SIGKILL of the leading candidate, and of its member (the Raft leader, or not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill() {
    chaos_support::rounds(BackendKind::Raft, Scenario::Kill, ROUNDS).await;
}

/// SIGSTOP of the leading candidate past its ttl, its member paused with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop() {
    chaos_support::rounds(BackendKind::Raft, Scenario::Stop, ROUNDS).await;
}

/// SIGTERM of the leading candidate: it releases, then its member leaves with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn term() {
    chaos_support::rounds(BackendKind::Raft, Scenario::Term, ROUNDS).await;
}

/// The leading candidate's member cut from the other members, both ways, past the ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition() {
    chaos_support::rounds(BackendKind::Raft, Scenario::Partition, ROUNDS).await;
}

/// Every member cut from every other past the ttl: nobody may lead, and one does after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall() {
    chaos_support::rounds(BackendKind::Raft, Scenario::Stall, 1).await;
}
