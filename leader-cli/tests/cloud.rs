//! `leader run` and `leader status` against each emulator backend.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods // real processes need real time
)]

use std::process::{Command, Stdio};

use integration_tests::{Emulator, require, unique_name};

const LEADER: &str = env!("CARGO_BIN_EXE_leader");

mod common;

/// Two terms and `status` on `store`, in the test's environment (the emulators').
fn run_twice(store: &str, extra: &[&str]) {
    common::run_twice_with(store, extra, |_| {});
}

#[tokio::test]
async fn leader_run_on_azurite() {
    let Some(_) = require(Emulator::Azurite).await else {
        return;
    };
    let container = unique_name("cli");
    run_twice(
        &format!("azblob://{container}/job"),
        &["--create-if-missing"],
    );
}

#[tokio::test]
async fn leader_run_on_dynamodb() {
    let Some(_) = require(Emulator::DynamoDb).await else {
        return;
    };
    let table = unique_name("cli");
    run_twice(&format!("dynamodb://{table}/job"), &["--create-if-missing"]);
}

#[tokio::test]
async fn leader_run_on_gcs() {
    let Some(ep) = require(Emulator::Gcs).await else {
        return;
    };
    let bucket = unique_name("cli");
    integration_tests::gcs::GcsClient::new(&ep.url)
        .create_bucket(&bucket)
        .await
        .unwrap();
    run_twice(&format!("gs://{bucket}/job"), &[]);
}

/// The `HOST:PORT` of a server whose endpoint is `http://HOST:PORT` or `HOST:PORT`.
fn host_of(url: &str) -> &str {
    url.rsplit("://").next().unwrap_or(url)
}

#[tokio::test]
async fn leader_run_on_etcd() {
    let Some(ep) = require(Emulator::Etcd).await else {
        return;
    };
    let folder = unique_name("cli");
    run_twice(&format!("etcd://{}/{folder}/job", host_of(&ep.url)), &[]);
}

/// `etcds://` talks TLS; the test CA is trusted through `LEADER_ETCD_CA_FILE`.
#[tokio::test]
async fn leader_run_on_etcd_over_tls() {
    let Some(tls) = integration_tests::tls::require_tls() else {
        return;
    };
    let (https, ca) = (tls.etcd, tls.ca_file);
    let folder = unique_name("cli");
    common::run_twice_with(
        &format!("etcds://{}/{folder}/job", host_of(&https)),
        &[],
        |c| {
            c.env("LEADER_ETCD_CA_FILE", &ca);
        },
    );
}

#[tokio::test]
async fn leader_run_on_zookeeper() {
    let Some(ep) = require(Emulator::ZooKeeper).await else {
        return;
    };
    let path = unique_name("cli");
    run_twice(
        &format!("zk://{}/{path}/job", host_of(&ep.url)),
        &["--create-if-missing"],
    );
}

/// `leader` with `args`: (exit code, stderr, time taken).
fn run_to_end(args: &[&str]) -> (i32, String, std::time::Duration) {
    let start = std::time::Instant::now();
    let out = Command::new(LEADER)
        .args(args)
        .env("LEADER_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        start.elapsed(),
    )
}

/// A missing container/table/bucket ends `run` (and `status`) with exit 69 and a message
/// naming it, at once and without "retrying".
fn missing_place_is_permanent(store: &str, name: &str, check_status: bool) {
    let mut cases = vec![vec!["run", "--store", store, "--", "true"]];
    if check_status {
        cases.push(vec!["status", "--store", store]);
    }
    for args in cases {
        let (code, err, took) = run_to_end(&args);
        assert_eq!(code, 69, "{args:?}: {err}");
        assert!(
            err.contains(name) && err.contains("does not exist"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("retrying"), "{err}");
        assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    }
}

#[tokio::test]
async fn a_missing_container_is_an_error() {
    let Some(_) = require(Emulator::Azurite).await else {
        return;
    };
    let container = unique_name("missing");
    missing_place_is_permanent(&format!("azblob://{container}/job"), &container, true);
}

#[tokio::test]
async fn a_missing_table_is_an_error() {
    let Some(_) = require(Emulator::DynamoDb).await else {
        return;
    };
    let table = unique_name("missing");
    missing_place_is_permanent(&format!("dynamodb://{table}/job"), &table, true);
}

#[tokio::test]
async fn a_missing_bucket_is_an_error() {
    let Some(_) = require(Emulator::Gcs).await else {
        return;
    };
    let bucket = unique_name("missing");
    let store = format!("gs://{bucket}/job");
    // fake-gcs-server answers a read in a missing bucket like a read of a missing object (real
    // GCS says "bucket does not exist", mapped in leader-gcs), so only `run`, whose first
    // write meets the missing bucket, can tell here.
    missing_place_is_permanent(&store, &bucket, false);
    let (code, err, _) = run_to_end(&[
        "run",
        "--store",
        &store,
        "--create-if-missing",
        "--",
        "true",
    ]);
    assert_eq!(code, 78, "{err}");
    assert!(err.contains("gcloud storage buckets create"), "{err}");
}

#[tokio::test]
async fn a_missing_zookeeper_path_is_an_error() {
    let Some(ep) = require(Emulator::ZooKeeper).await else {
        return;
    };
    let path = unique_name("missing");
    missing_place_is_permanent(
        &format!("zk://{}/{path}/job", host_of(&ep.url)),
        &path,
        true,
    );
}
