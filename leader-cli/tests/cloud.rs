//! `leader run` and `leader status` against each emulator backend.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Stdio};

use integration_tests::{Emulator, require, unique_name};

const LEADER: &str = env!("CARGO_BIN_EXE_leader");

/// Runs the command twice under `leader run` on `store` and checks the tokens and `status`.
fn run_twice(store: &str, extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("token");
    let mut tokens = Vec::new();
    for _ in 0..2 {
        let script = format!("echo $LEADER_FENCING_TOKEN > {}", out.display());
        let status = Command::new(LEADER)
            .args(["run", "--store", store])
            .args(extra)
            .args(["--", "sh", "-c", &script])
            .env("LEADER_LOG", "warn")
            .stdin(Stdio::null())
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(0), "leader run on {store}");
        let token: u64 = std::fs::read_to_string(&out)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        tokens.push(token);
    }
    assert!(tokens[1] > tokens[0], "tokens {tokens:?} on {store}");
    let status = Command::new(LEADER)
        .args(["status", "--store", store, "--json"])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(json["state"], "released", "{json}");
    assert_eq!(json["token"], tokens[1], "{json}");
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
