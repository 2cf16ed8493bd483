//! A store URL names the lease object as the console shows it: `gs://BUCKET/FOLDER/KEY` and
//! `azblob://CONTAINER/FOLDER/KEY` keep the lease in the object or blob `FOLDER/KEY`, and a
//! protected object `NAME` beside it in `FOLDER/.NAME.fenced`; so does
//! `etcd://HOST:PORT/FOLDER/KEY` with etcd keys. Checked on the emulators and servers by
//! reading the raw objects and keys, not through the store.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failure should fail the test"
)]

use std::sync::Arc;

use integration_tests::azure::BlobClient;
use integration_tests::gcs::GcsClient;
use integration_tests::{Emulator, require, unique_name};
use leader::{ObjectName, OpenOptions, Timing};
use leader_core::{HolderId, LeaseClient};

/// Takes the lease of `url` and writes the protected object `report`; returns the term's
/// token.
async fn lead_and_write(url: &str, endpoint: &str) -> u64 {
    let options = OpenOptions::new()
        .with_emulator(true)
        .with_endpoint(endpoint)
        .with_create_if_missing(!url.starts_with("gs://") && !url.starts_with("etcd://"));
    let (store, key) = leader::from_url(url, &options).await.unwrap();
    let mut client = LeaseClient::new(
        store.clone() as Arc<dyn leader::LeaseBackend>,
        key.clone(),
        HolderId::new("url-test").unwrap(),
        Timing::default(),
    )
    .unwrap();
    let grant = match client.try_acquire().await.unwrap() {
        leader_core::Acquisition::Acquired(grant) => grant,
        other => panic!("a fresh key must be free, got {other:?}"),
    };
    let fence = leader_core::Fence::new(key, client.holder().clone(), grant.token);
    store
        .fenced_write(&fence, &ObjectName::new("report").unwrap(), b"done")
        .await
        .unwrap();
    grant.token.get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gs_url_names_the_object() {
    let Some(endpoint) = require(Emulator::Gcs).await else {
        return;
    };
    let gcs = GcsClient::new(&endpoint.url);
    let bucket = unique_name("urls");
    gcs.create_bucket(&bucket).await.unwrap();
    let token = lead_and_write(&format!("gs://{bucket}/team/jobs/nightly"), &endpoint.url).await;

    let (lease, _) = gcs.read(&bucket, "team/jobs/nightly").await.unwrap();
    let lease = String::from_utf8(lease).unwrap();
    assert!(lease.contains("url-test"), "the lease object: {lease}");
    assert!(
        lease.contains(&token.to_string()),
        "the lease object: {lease}"
    );
    let (report, _) = gcs.read(&bucket, "team/jobs/.report.fenced").await.unwrap();
    assert!(
        report.ends_with(b"\ndone"),
        "{}",
        String::from_utf8_lossy(&report)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_azblob_url_names_the_blob() {
    let Some(endpoint) = require(Emulator::Azurite).await else {
        return;
    };
    let container = unique_name("urls");
    let url = format!("azblob://{container}/team/jobs/nightly");
    lead_and_write(&url, &endpoint.url).await;

    let blobs = BlobClient::dev(&endpoint.url).unwrap();
    let (lease, _) = blobs
        .get_blob(&container, "team/jobs/nightly")
        .await
        .unwrap();
    let lease = String::from_utf8(lease).unwrap();
    assert!(lease.contains("url-test"), "the lease blob: {lease}");
    let (report, _) = blobs
        .get_blob(&container, "team/jobs/.report.fenced")
        .await
        .unwrap();
    assert_eq!(report, b"done");
    blobs
        .get_blob(&container, "team/jobs/.nightly.token")
        .await
        .expect("the token high-water mark sits beside the lease");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_url_names_the_key() {
    let Some(endpoint) = require(Emulator::Etcd).await else {
        return;
    };
    let team = unique_name("urls");
    let host = endpoint.url.trim_start_matches("http://");
    let url = format!("etcd://{host}/{team}/jobs/nightly");
    let token = lead_and_write(&url, &endpoint.url).await;

    let raw = integration_tests::etcd::EtcdRaw::new(&endpoint.url);
    let lease = raw
        .get(&format!("{team}/jobs/nightly"))
        .await
        .unwrap()
        .expect("the lease key is the URL's path");
    assert!(String::from_utf8_lossy(&lease.value).contains("url-test"));
    assert_eq!(u64::try_from(lease.create_revision).unwrap(), token);
    assert_ne!(lease.lease, 0, "attached to the term's etcd lease");
    let report = raw
        .get(&format!("{team}/jobs/.report.fenced"))
        .await
        .unwrap()
        .expect("the protected object sits beside the lease");
    assert!(report.value.ends_with(b"\ndone"));
}
