//! Chaos drills on the S3 backend on LocalStack's S3 with real candidate processes (see
//! `integration_tests::chaos`): the drills of `chaos_s3.rs` (moto) on the other S3 emulator, a
//! separate implementation of S3's conditional writes; its empty restart is a fresh LocalStack
//! instance with the bucket created again.
//!
//! One round of every scenario that applies, three side by side (as the soak runs them).

mod chaos_support;

use integration_tests::chaos::BackendKind;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario() {
    chaos_support::every_scenario(BackendKind::S3LocalStack, 9, 3).await;
}
