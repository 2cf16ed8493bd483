//! Chaos drills on the S3 backend on LocalStack's S3 with real candidate processes (see
//! `integration_tests::chaos`): the drills of `chaos_s3.rs` (moto) on the other S3 emulator, a
//! separate implementation of S3's conditional writes; its empty restart is a fresh LocalStack
//! instance with the bucket created again.

mod chaos_support;

use integration_tests::chaos::BackendKind;
use integration_tests::chaos::drill::Scenario;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill() {
    chaos_support::drill(BackendKind::S3LocalStack, Scenario::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop() {
    chaos_support::drill(BackendKind::S3LocalStack, Scenario::Stop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition() {
    chaos_support::drill(BackendKind::S3LocalStack, Scenario::Partition).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall() {
    chaos_support::drill(BackendKind::S3LocalStack, Scenario::Stall).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttle() {
    chaos_support::drill(BackendKind::S3LocalStack, Scenario::Throttle).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn term() {
    chaos_support::drill(BackendKind::S3LocalStack, Scenario::Term).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lossy() {
    chaos_support::drill(BackendKind::S3LocalStack, Scenario::Lossy).await;
}

/// Writes held past the sender's request timeout and then applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late() {
    chaos_support::drill(BackendKind::S3LocalStack, Scenario::Late).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_empty() {
    chaos_support::drill(BackendKind::S3LocalStack, Scenario::RestartEmpty).await;
}
