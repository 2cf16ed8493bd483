//! Chaos drills on the Etcd backend with real candidate processes (see `integration_tests::chaos`),
//! each candidate behind its own TCP-level fault proxy in front of the real server.

mod chaos_support;

use integration_tests::chaos::BackendKind;
use integration_tests::chaos::drill::Scenario;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill() {
    chaos_support::drill(BackendKind::Etcd, Scenario::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop() {
    chaos_support::drill(BackendKind::Etcd, Scenario::Stop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition() {
    chaos_support::drill(BackendKind::Etcd, Scenario::Partition).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall() {
    chaos_support::drill(BackendKind::Etcd, Scenario::Stall).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn term() {
    chaos_support::drill(BackendKind::Etcd, Scenario::Term).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late() {
    chaos_support::drill(BackendKind::Etcd, Scenario::Late).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart() {
    chaos_support::drill(BackendKind::Etcd, Scenario::Restart).await;
}
