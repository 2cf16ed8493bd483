//! Fidelity canary for fake-gcs-server: JSON API multipart uploads with `ifGenerationMatch`
//! (the path the GCS backend uses) must reject stale generations and have exactly one winner in
//! a concurrent create-only (`ifGenerationMatch=0`) race.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test helpers outside #[test] fns: a failure should fail the test"
)]

use std::sync::Arc;

use integration_tests::gcs::{GcsClient, UploadOutcome};
use integration_tests::{Emulator, require, unique_name};
use tokio::sync::Barrier;

const RACERS: usize = 8;
const ROUNDS: usize = 5;

async fn setup() -> Option<(GcsClient, String)> {
    let endpoint = require(Emulator::Gcs).await?;
    let client = GcsClient::new(&endpoint.url);
    let bucket = unique_name("canary");
    client.create_bucket(&bucket).await.unwrap();
    Some((client, bucket))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stale_generation_write_is_rejected() {
    let Some((client, bucket)) = setup().await else {
        return;
    };
    let UploadOutcome::Written(first) = client
        .upload(&bucket, "lease", b"v1", Some(0))
        .await
        .unwrap()
    else {
        panic!("create-only upload of a new object failed");
    };
    let UploadOutcome::Written(second) = client
        .upload(&bucket, "lease", b"v2", Some(first))
        .await
        .unwrap()
    else {
        panic!("upload with the current generation failed");
    };
    assert_ne!(first, second, "the generation must change on every write");

    let stale = client
        .upload(&bucket, "lease", b"stale", Some(first))
        .await
        .unwrap();
    assert_eq!(stale, UploadOutcome::ConditionFailed);
    let again = client
        .upload(&bucket, "lease", b"again", Some(0))
        .await
        .unwrap();
    assert_eq!(again, UploadOutcome::ConditionFailed);

    let (content, generation) = client.read(&bucket, "lease").await.unwrap();
    assert_eq!(content, b"v2");
    assert_eq!(generation, second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_create_has_exactly_one_winner() {
    let Some((client, bucket)) = setup().await else {
        return;
    };
    for round in 0..ROUNDS {
        let object = format!("race-{round}");
        let barrier = Arc::new(Barrier::new(RACERS));
        let mut tasks = Vec::new();
        for racer in 0..RACERS {
            let (client, bucket, object, barrier) = (
                client.clone(),
                bucket.clone(),
                object.clone(),
                barrier.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let body = format!("racer-{racer}").into_bytes();
                barrier.wait().await;
                let outcome = client
                    .upload(&bucket, &object, &body, Some(0))
                    .await
                    .unwrap();
                (racer, outcome)
            }));
        }
        let mut winners = Vec::new();
        for task in tasks {
            let (racer, outcome) = task.await.unwrap();
            if let UploadOutcome::Written(generation) = outcome {
                winners.push((racer, generation));
            }
        }
        assert_eq!(
            winners.len(),
            1,
            "round {round}: {} winners {winners:?} of a create-only race",
            winners.len()
        );
        let (content, generation) = client.read(&bucket, &object).await.unwrap();
        assert_eq!(content, format!("racer-{}", winners[0].0).into_bytes());
        assert_eq!(generation, winners[0].1);
    }
}
