//! Chaos drills on GCS (fake-gcs-server), with real candidate processes (see
//! `integration_tests::chaos`): one round of every scenario that applies, three side by side
//! (as the soak runs them; a round mostly waits out a ttl or two).

mod chaos_support;

use integration_tests::chaos::BackendKind;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario() {
    chaos_support::every_scenario(BackendKind::Gcs, 10, 3).await;
}
