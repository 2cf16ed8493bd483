//! Chaos drills on the File backend with real candidate processes (see `integration_tests::chaos`).

mod chaos_support;

use integration_tests::chaos::BackendKind;
use integration_tests::chaos::drill::Scenario;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill() {
    chaos_support::drill(BackendKind::File, Scenario::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop() {
    chaos_support::drill(BackendKind::File, Scenario::Stop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn term() {
    chaos_support::drill(BackendKind::File, Scenario::Term).await;
}
