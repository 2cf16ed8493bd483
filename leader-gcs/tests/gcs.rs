//! GCS-specific cases against fake-gcs-server: tokens across deletion, a lost response
//! followed by a 412, malformed bodies, a missing bucket, missing credentials, timing rules.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use google_cloud_auth::credentials::mds;
use integration_tests::proxy::{Fault, FaultProxy, Match, Rule};
use leader_core::backend::within;
use leader_core::backend::{Expected, TermId, WriteKind, WriteNonce, WriteRequest};
use leader_core::{
    Acquisition, ConfigError, Error, ErrorKind, HolderId, LeaseBackend, LeaseClient, Renewal,
    Timing,
};
use leader_gcs::GcsStore;
use support::Bucket;
use tokio::time::Instant;

fn client(store: &GcsStore, key: &leader_core::LeaseKey, who: &str) -> LeaseClient {
    LeaseClient::new(
        Arc::new(store.clone()),
        key.clone(),
        HolderId::new(who).unwrap(),
        support::timing(),
    )
    .unwrap()
}

async fn acquire(c: &mut LeaseClient) -> leader_core::Grant {
    match c.try_acquire().await.unwrap() {
        Acquisition::Acquired(g) => g,
        other => panic!("expected to acquire, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_and_recreated_object_still_yields_a_higher_token() {
    let bucket = Bucket::new();
    let store = bucket.store().await;
    let key = bucket.unique_key();
    let mut a = client(&store, &key, "a");
    let g1 = acquire(&mut a).await;
    // The token is above the generation of the placeholder that created the object.
    assert!(
        g1.token.get() > 1_000_000,
        "token {} is not generation-based",
        g1.token
    );

    bucket.delete(&store.lease_object(&key)).await;
    assert!(store.read(&key).await.unwrap().is_none());

    // A fresh candidate has seen no token: only the store can keep the order.
    let mut b = client(&store, &key, "b");
    let g2 = acquire(&mut b).await;
    assert!(g2.token > g1.token, "{} not above {}", g2.token, g1.token);

    // And once more, after a release and a deletion of the released record.
    assert!(b.release().await.unwrap());
    bucket.delete(&store.lease_object(&key)).await;
    let mut c = client(&store, &key, "c");
    let g3 = acquire(&mut c).await;
    assert!(g3.token > g2.token, "{} not above {}", g3.token, g2.token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_upload_response_is_indeterminate_and_reconciled() {
    let bucket = Bucket::new();
    let proxy = FaultProxy::in_front_of(bucket.endpoint().await, 1)
        .await
        .unwrap();
    let store = bucket.store_at(&proxy.url()).await;
    // Loses the response of the next upload: the emulator applies it, the client never hears.
    let lose_next_upload_response = || {
        proxy.inject(Rule::new(
            Match::path(reqwest::Method::POST, "/upload"),
            Fault::LoseResponse,
        ))
    };
    let lost = || proxy.counts().lost.load(Ordering::Relaxed);
    let key = bucket.unique_key();
    let mut a = client(&store, &key, "a");
    acquire(&mut a).await;

    // The store level: the upload lands and its answer is lost -> the outcome is
    // indeterminate (the write is never sent again, so never a conflict), and a re-read
    // shows the write landed.
    let current = store.read(&key).await.unwrap().unwrap();
    let mut record = current.record.clone();
    record.nonce = WriteNonce(0x10c7);
    lose_next_upload_response();
    let outcome = store
        .write(WriteRequest::new(
            key.clone(),
            Expected::Revision(current.revision.clone()),
            record,
            WriteKind::Renew,
            TermId(7),
        ))
        .await;
    assert_eq!(lost(), 1, "the proxy must have lost one response");
    assert!(
        matches!(outcome, Err(Error::Indeterminate { .. })),
        "expected an indeterminate write, got {outcome:?}"
    );
    let landed = store.read(&key).await.unwrap().unwrap();
    assert_eq!(landed.record.nonce, WriteNonce(0x10c7));
    assert_ne!(landed.revision, current.revision);

    // The core level: a renew whose answer is lost is recognised by its nonce.
    let key = bucket.unique_key();
    let mut a = client(&store, &key, "a");
    let g2 = acquire(&mut a).await;
    lose_next_upload_response();
    match a.renew().await.unwrap() {
        Renewal::Renewed(g) => assert_eq!(g.token, g2.token),
        other => panic!("the lost renew must be recognised, got {other:?}"),
    }
    assert_eq!(lost(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_body_names_the_bucket_and_object() {
    let bucket = Bucket::new();
    let store = bucket.store().await;
    let key = bucket.unique_key();
    let object = store.lease_object(&key);
    bucket
        .raw()
        .await
        .upload(&bucket.name, &object, b"\x00garbage", None)
        .await
        .unwrap();
    let err = store.read(&key).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::MalformedRecord);
    let text = err.to_string();
    assert!(text.contains(&bucket.name), "{text}");
    assert!(text.contains(&object), "{text}");
    assert!(text.contains("not JSON"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_bucket_is_a_clear_error() {
    let bucket = Bucket::new();
    let endpoint = bucket.endpoint().await.to_owned();
    let missing = GcsStore::builder()
        .with_bucket(format!("{}-missing", bucket.name))
        .with_emulator(endpoint)
        .build()
        .await
        .unwrap();
    let key = bucket.unique_key();
    let mut a = client(&missing, &key, "a");
    let err = a.try_acquire().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains("-missing"), "{err}");
    assert!(!err.is_retryable());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_usable_credentials_fail_clearly_within_the_request_timeout() {
    // A metadata server that never answers (a non-routable address), as on a machine that is
    // not on GCP and has no credentials file.
    let credentials = mds::Builder::default()
        .with_endpoint("http://10.255.255.1")
        .build()
        .unwrap();
    let started = Instant::now();
    let build = GcsStore::builder()
        .with_bucket("some-bucket")
        .with_credentials(credentials)
        .build();
    let err = within(Duration::from_millis(300), build)
        .await
        .expect("the build ends by the deadline with its own error")
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Unauthenticated, "{err}");
    assert!(err.to_string().contains("access token"), "{err}");
    assert!(took < Duration::from_millis(800), "took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timing_must_respect_the_write_rate() {
    let bucket = Bucket::new();
    let store = bucket.store().await;
    let mut fast = Timing::from_ttl(Duration::from_secs(2));
    fast.renew_every = Duration::from_millis(667);
    let err = store.check_timing(&fast).unwrap_err();
    assert!(
        matches!(&err, ConfigError::Unsupported { backend: "gcs", .. }),
        "{err}"
    );
    assert!(err.to_string().contains("one write per second"), "{err}");

    // Any request timeout is the store's: each call takes the one the elector gives it.
    let mut short = support::timing();
    short.request_timeout = Duration::from_millis(300);
    short.margin = Duration::from_millis(600);
    assert!(store.check_timing(&short).is_ok());
    assert!(store.check_timing(&support::timing()).is_ok());
    assert!(store.check_timing(&Timing::default()).is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn electors_hand_over_on_shutdown_with_a_higher_token() {
    let bucket = Bucket::new();
    let key = bucket.unique_key();
    let elector = |who: &str, store: GcsStore| {
        leader_core::Elector::builder(Arc::new(store), key.clone())
            .timing(support::timing())
            .holder_id(HolderId::new(who).unwrap())
            .build()
            .unwrap()
            .spawn()
    };
    let first = elector("first", bucket.store().await);
    let term = tokio::time::timeout(Duration::from_secs(3), first.wait_for_term())
        .await
        .unwrap()
        .unwrap();
    let t1 = term.token();
    drop(term);
    let second = elector("second", bucket.store().await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!second.current().is_leader(), "two leaders");

    let released = Instant::now();
    first.shutdown().await;
    let term = tokio::time::timeout(Duration::from_secs(3), second.wait_for_term())
        .await
        .unwrap()
        .unwrap();
    let took = released.elapsed();
    assert!(term.token() > t1, "{} not above {t1}", term.token());
    // Within retry_every (+ a request) of the release, not after a ttl.
    assert!(took < Duration::from_millis(1500), "took {took:?}");
    drop(term);
    second.shutdown().await;
}
