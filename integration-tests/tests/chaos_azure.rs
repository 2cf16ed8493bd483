//! Chaos drills on the Azure backend with real candidate processes (see `integration_tests::chaos`).

mod chaos_support;

use integration_tests::chaos::BackendKind;
use integration_tests::chaos::drill::Scenario;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill() {
    chaos_support::drill(BackendKind::Azure, Scenario::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn term() {
    chaos_support::drill(BackendKind::Azure, Scenario::Term).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop() {
    chaos_support::drill(BackendKind::Azure, Scenario::Stop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition() {
    chaos_support::drill(BackendKind::Azure, Scenario::Partition).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall() {
    chaos_support::drill(BackendKind::Azure, Scenario::Stall).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttle() {
    chaos_support::drill(BackendKind::Azure, Scenario::Throttle).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lossy() {
    chaos_support::drill(BackendKind::Azure, Scenario::Lossy).await;
}

/// Writes held past the sender's request timeout and then applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late() {
    chaos_support::drill(BackendKind::Azure, Scenario::Late).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart() {
    chaos_support::drill(BackendKind::Azure, Scenario::Restart).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_empty() {
    chaos_support::drill(BackendKind::Azure, Scenario::RestartEmpty).await;
}
