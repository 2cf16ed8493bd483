//! Chaos drills on the Dynamo backend with real candidate processes (see `integration_tests::chaos`).

mod chaos_support;

use integration_tests::chaos::BackendKind;
use integration_tests::chaos::drill::Scenario;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill() {
    chaos_support::drill(BackendKind::Dynamo, Scenario::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop() {
    chaos_support::drill(BackendKind::Dynamo, Scenario::Stop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition() {
    chaos_support::drill(BackendKind::Dynamo, Scenario::Partition).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall() {
    chaos_support::drill(BackendKind::Dynamo, Scenario::Stall).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttle() {
    chaos_support::drill(BackendKind::Dynamo, Scenario::Throttle).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn term() {
    chaos_support::drill(BackendKind::Dynamo, Scenario::Term).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lossy() {
    chaos_support::drill(BackendKind::Dynamo, Scenario::Lossy).await;
}

/// Writes held past the sender's request timeout and then applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late() {
    chaos_support::drill(BackendKind::Dynamo, Scenario::Late).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_empty() {
    chaos_support::drill(BackendKind::Dynamo, Scenario::RestartEmpty).await;
}
