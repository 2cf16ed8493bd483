//! Chaos drills on the Azure backend with real candidate processes (see
//! `integration_tests::chaos`): one round of every scenario that applies to Azure, five side
//! by side (Azure's shortest lease is 15 s, so a round is mostly waiting; the soak runs Azure
//! rounds five at a time too).

mod chaos_support;

use integration_tests::chaos::BackendKind;

/// SIGKILL, SIGTERM, SIGSTOP, a partition, a stall, throttling, lost answers, late delivery,
/// and the store restarted with its data and empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario() {
    chaos_support::every_scenario(BackendKind::Azure, 10, 5).await;
}
