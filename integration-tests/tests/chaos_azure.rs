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

#[ignore = "long with Azure's 15 s ttl: run by chaos_soak"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop() {
    chaos_support::drill(BackendKind::Azure, Scenario::Stop).await;
}

#[ignore = "long with Azure's 15 s ttl: run by chaos_soak"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition() {
    chaos_support::drill(BackendKind::Azure, Scenario::Partition).await;
}

#[ignore = "long with Azure's 15 s ttl: run by chaos_soak"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall() {
    chaos_support::drill(BackendKind::Azure, Scenario::Stall).await;
}

#[ignore = "long with Azure's 15 s ttl: run by chaos_soak"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttle() {
    chaos_support::drill(BackendKind::Azure, Scenario::Throttle).await;
}

#[ignore = "long with Azure's 15 s ttl: run by chaos_soak"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lossy() {
    chaos_support::drill(BackendKind::Azure, Scenario::Lossy).await;
}

/// Writes held past the sender's request timeout and then applied (issue 12).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late() {
    chaos_support::drill(BackendKind::Azure, Scenario::Late).await;
}
