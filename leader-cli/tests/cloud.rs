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
mod s3;

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

/// The flags that point `leader` at the S3 emulator at `url`.
fn s3_flags(url: &str) -> [&str; 3] {
    ["--emulator", "--endpoint", url]
}

/// `leader` without the AWS endpoint variables, so that only `--endpoint` names the emulator.
fn only_the_endpoint_flag(command: &mut Command) {
    command
        .env_remove("AWS_ENDPOINT_URL")
        .env_remove("AWS_ENDPOINT_URL_S3");
}

/// Two terms and `status` on `s3://BUCKET/team/job` (a fresh bucket of `emu`), then the
/// objects where the URL says: the lease `team/job` and its token mark `team/.job.token`.
async fn run_twice_on_s3(emu: Emulator) {
    let Some(url) = s3::url(emu).await else {
        return;
    };
    let bucket = s3::new_bucket(&url, "cli").await;
    common::run_twice_with(
        &format!("s3://{bucket}/team/job"),
        &s3_flags(&url),
        only_the_endpoint_flag,
    );
    let client = s3::client(&url);
    for key in ["team/job", "team/.job.token"] {
        let found = client.head_object().bucket(&bucket).key(key).send().await;
        assert!(
            found.is_ok(),
            "{emu:?}: no object {key} in {bucket}: {found:?}"
        );
    }
}

#[tokio::test]
async fn leader_run_on_s3_moto() {
    run_twice_on_s3(Emulator::MotoS3).await;
}

#[tokio::test]
async fn leader_run_on_s3_localstack() {
    run_twice_on_s3(Emulator::LocalStackS3).await;
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
    let mut command = Command::new(LEADER);
    command
        .args(args)
        .env("LEADER_LOG", "warn")
        .stdin(Stdio::null());
    only_the_endpoint_flag_if_given(&mut command, args);
    let out = command.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        start.elapsed(),
    )
}

/// With `--endpoint` in `args`, the AWS endpoint variables are left out (see
/// [`only_the_endpoint_flag`]).
fn only_the_endpoint_flag_if_given(command: &mut Command, args: &[&str]) {
    if args.contains(&"--endpoint") {
        only_the_endpoint_flag(command);
    }
}

/// A missing container/table/bucket ends `run` (and `status`) with exit 69 and a message
/// naming it, at once and without "retrying". `extra`: flags after the store's.
fn missing_place_is_permanent(store: &str, name: &str, check_status: bool, extra: &[&str]) {
    let mut cases = vec![[&["run", "--store", store][..], extra, &["--", "true"]].concat()];
    if check_status {
        cases.push([&["status", "--store", store][..], extra].concat());
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
    missing_place_is_permanent(&format!("azblob://{container}/job"), &container, true, &[]);
}

#[tokio::test]
async fn a_missing_table_is_an_error() {
    let Some(_) = require(Emulator::DynamoDb).await else {
        return;
    };
    let table = unique_name("missing");
    missing_place_is_permanent(&format!("dynamodb://{table}/job"), &table, true, &[]);
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
    missing_place_is_permanent(&store, &bucket, false, &[]);
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
        &[],
    );
}

/// A missing S3 bucket: `run` and `status` end at once with 69 and a message naming it (S3
/// says `NoSuchBucket` to reads and writes alike); `--create-if-missing` is a configuration
/// error (78) that says how to create one, since `leader` never creates a bucket.
async fn a_missing_s3_bucket_is_an_error(emu: Emulator) {
    let Some(url) = s3::url(emu).await else {
        return;
    };
    let bucket = unique_name("missing");
    for store in [
        format!("s3://{bucket}/job"),
        format!("s3://{bucket}/team/job"),
    ] {
        missing_place_is_permanent(&store, &bucket, true, &s3_flags(&url));
        let args = [&["run", "--store", &store][..], &s3_flags(&url)].concat();
        let (code, err, _) =
            run_to_end(&[&args[..], &["--create-if-missing", "--", "true"]].concat());
        assert_eq!(code, 78, "{emu:?}: {err}");
        assert!(
            err.contains(&format!("aws s3 mb s3://{bucket}")),
            "{emu:?}: {err}"
        );
    }
}

#[tokio::test]
async fn a_missing_s3_bucket_is_an_error_on_moto() {
    a_missing_s3_bucket_is_an_error(Emulator::MotoS3).await;
}

#[tokio::test]
async fn a_missing_s3_bucket_is_an_error_on_localstack() {
    a_missing_s3_bucket_is_an_error(Emulator::LocalStackS3).await;
}
