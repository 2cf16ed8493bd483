//! Fidelity canary for Azurite: the conditional writes that the Azure backend relies on must
//! behave like the real service (a stale `If-Match` is rejected; `If-None-Match: *` creates have
//! exactly one winner under concurrency).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test helpers outside #[test] fns: a failure should fail the test"
)]

use std::sync::Arc;

use integration_tests::azure::{BlobClient, Condition, PutOutcome};
use integration_tests::{Emulator, require, unique_name};
use tokio::sync::Barrier;

const RACERS: usize = 8;
const ROUNDS: usize = 5;

async fn setup() -> Option<(BlobClient, String)> {
    let endpoint = require(Emulator::Azurite).await?;
    let client = BlobClient::dev(&endpoint.url).unwrap();
    let container = unique_name("canary");
    client.create_container(&container).await.unwrap();
    Some((client, container))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stale_if_match_write_is_rejected() {
    let Some((client, container)) = setup().await else {
        return;
    };
    let first = match client
        .put_blob(&container, "lease", b"v1".to_vec(), &Condition::Absent)
        .await
        .unwrap()
    {
        PutOutcome::Written(etag) => etag,
        other => panic!("create of a new blob failed: {other:?}"),
    };
    let second = client
        .put_blob(
            &container,
            "lease",
            b"v2".to_vec(),
            &Condition::Matches(first.clone()),
        )
        .await
        .unwrap();
    let PutOutcome::Written(second) = second else {
        panic!("write with the current ETag failed: {second:?}");
    };
    assert_ne!(first, second, "the ETag must change on every write");

    let stale = client
        .put_blob(
            &container,
            "lease",
            b"stale".to_vec(),
            &Condition::Matches(first),
        )
        .await
        .unwrap();
    assert_eq!(
        stale,
        PutOutcome::ConditionFailed(reqwest::StatusCode::PRECONDITION_FAILED)
    );
    let (content, etag) = client.get_blob(&container, "lease").await.unwrap();
    assert_eq!(content, b"v2");
    assert_eq!(etag, second);

    // A create-only write on an existing blob is rejected too.
    let again = client
        .put_blob(&container, "lease", b"again".to_vec(), &Condition::Absent)
        .await
        .unwrap();
    assert!(matches!(again, PutOutcome::ConditionFailed(_)), "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_create_has_exactly_one_winner() {
    let Some((client, container)) = setup().await else {
        return;
    };
    for round in 0..ROUNDS {
        let blob = format!("race-{round}");
        let barrier = Arc::new(Barrier::new(RACERS));
        let mut tasks = Vec::new();
        for racer in 0..RACERS {
            let (client, container, blob, barrier) = (
                client.clone(),
                container.clone(),
                blob.clone(),
                barrier.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let body = format!("racer-{racer}").into_bytes();
                barrier.wait().await;
                let outcome = client
                    .put_blob(&container, &blob, body, &Condition::Absent)
                    .await
                    .unwrap();
                (racer, outcome)
            }));
        }
        let mut winners = Vec::new();
        for task in tasks {
            let (racer, outcome) = task.await.unwrap();
            match outcome {
                PutOutcome::Written(_) => winners.push(racer),
                PutOutcome::ConditionFailed(_) => {}
            }
        }
        assert_eq!(
            winners.len(),
            1,
            "round {round}: {} winners {winners:?} of a create-only race",
            winners.len()
        );
        let (content, _) = client.get_blob(&container, &blob).await.unwrap();
        assert_eq!(content, format!("racer-{}", winners[0]).into_bytes());
    }
}
