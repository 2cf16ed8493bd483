//! Chaos drills on DynamoDB (the moto server), with real candidate processes (see
//! `integration_tests::chaos`): one round of every scenario that applies, three side by side
//! (as the soak runs them; a round mostly waits out a ttl or two).

mod chaos_support;

use integration_tests::chaos::BackendKind;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario() {
    chaos_support::every_scenario(BackendKind::Dynamo, 9, 3).await;
}
