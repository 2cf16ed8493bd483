//! Chaos drills on the S3 backend on moto with real candidate processes (see
//! `integration_tests::chaos`); throttling answers 503 `SlowDown`, as S3 does; the empty restart
//! is a fresh moto instance (it keeps nothing) with the bucket created again.

mod chaos_support;

use integration_tests::chaos::BackendKind;
use integration_tests::chaos::drill::Scenario;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill() {
    chaos_support::drill(BackendKind::S3, Scenario::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop() {
    chaos_support::drill(BackendKind::S3, Scenario::Stop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition() {
    chaos_support::drill(BackendKind::S3, Scenario::Partition).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall() {
    chaos_support::drill(BackendKind::S3, Scenario::Stall).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttle() {
    chaos_support::drill(BackendKind::S3, Scenario::Throttle).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn term() {
    chaos_support::drill(BackendKind::S3, Scenario::Term).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lossy() {
    chaos_support::drill(BackendKind::S3, Scenario::Lossy).await;
}

/// Writes held past the sender's request timeout and then applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late() {
    chaos_support::drill(BackendKind::S3, Scenario::Late).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_empty() {
    chaos_support::drill(BackendKind::S3, Scenario::RestartEmpty).await;
}
