//! The fidelity canary of every backend over HTTPS, through the library as a cloud user builds
//! it (default features, the builders' normal credential paths, an explicit `https://`
//! endpoint), trusting the emulators' test CA through `SSL_CERT_FILE` - the standard mechanism.
//!
//! `SSL_CERT_FILE` is read by the TLS stacks of the process, so the test runs its body in a
//! child process (this test binary again, with the variable set): the parent only checks that
//! the child passed.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr,
    reason = "test code: a failure should fail the test"
)]

use std::sync::Arc;

use async_trait::async_trait;
use integration_tests::tls::{TlsSetup, require_tls};
use integration_tests::{Emulator, require, unique_name};
use leader_core::conformance::{ConformantStore, Harness, fidelity_canary, unique_key};
use leader_core::{Error, LeaseKey, Timing};

/// Set in the child: run the body instead of spawning.
const CHILD_VAR: &str = "LEADER_HTTPS_CANARY_CHILD";

/// Runs `test` (this binary's test of that name) in a child with `SSL_CERT_FILE` set to the
/// test CA and `env`; true in the child itself, where the caller then runs the body.
fn in_child_with_ca(test: &str, tls: &TlsSetup, env: &[(&str, String)]) -> bool {
    if std::env::var_os(CHILD_VAR).is_some() {
        return true;
    }
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_VAR, "1")
        .env("SSL_CERT_FILE", &tls.ca_file);
    for (name, value) in env {
        command.env(name, value);
    }
    let out = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the child run of {test} failed");
    // The child must really have run the test, not filtered it out.
    assert!(stdout.contains("1 passed"), "{stdout}");
    false
}

/// A store and keys for the canary; the canary needs nothing else of a harness.
struct Canary {
    store: Arc<dyn ConformantStore>,
    ttl: std::time::Duration,
}

#[async_trait]
impl Harness for Canary {
    async fn store(&self) -> Result<Arc<dyn ConformantStore>, Error> {
        Ok(self.store.clone())
    }
    fn unique_key(&self) -> LeaseKey {
        unique_key("canary").unwrap()
    }
    fn timing(&self) -> Timing {
        Timing::from_ttl(self.ttl)
    }
    async fn plant_malformed(&self, _: &LeaseKey) -> Result<(), Error> {
        unreachable!("the fidelity canary plants nothing")
    }
    async fn delete_record(&self, _: &LeaseKey) -> Result<(), Error> {
        unreachable!("the fidelity canary deletes nothing")
    }
}

async fn canary(store: Arc<dyn ConformantStore>) {
    let ttl = std::time::Duration::from_secs(15);
    fidelity_canary(&Canary { store, ttl }).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_canary_over_https() {
    let Some(tls) = require_tls() else { return };
    if !in_child_with_ca("azure_canary_over_https", &tls, &[]) {
        return;
    }
    let store = leader_azure::AzureLeaseStoreBuilder::new()
        .with_account(leader_azure::EMULATOR_ACCOUNT)
        .with_endpoint(&tls.azurite)
        .with_access_key(leader_azure::EMULATOR_KEY)
        .with_container(unique_name("https"))
        .with_create_container_if_missing(true)
        .build()
        .await
        .unwrap();
    canary(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_canary_over_https() {
    let Some(tls) = require_tls() else { return };
    if !in_child_with_ca("dynamodb_canary_over_https", &tls, &[]) {
        return;
    }
    // The default chain (the emulators' environment has static keys), moved to the HTTPS port.
    let store = leader_dynamo::DynamoBuilder::from_env()
        .unwrap()
        .with_endpoint(&tls.moto)
        .with_table(unique_name("https"))
        .with_create_table_if_missing(true)
        .build()
        .await
        .unwrap();
    canary(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcs_canary_over_https() {
    let Some(tls) = require_tls() else { return };
    let Some(gcs) = require(Emulator::Gcs).await else {
        return;
    };
    // A service-account key file, as on a machine outside Google Cloud (the JWT is signed
    // locally; fake-gcs-server takes any token).
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("sa.json");
    std::fs::write(&key_file, tls.service_account_json().unwrap()).unwrap();
    let bucket = std::env::var("LEADER_HTTPS_CANARY_BUCKET").unwrap_or_default();
    let bucket = if bucket.is_empty() {
        let bucket = unique_name("https");
        integration_tests::gcs::GcsClient::new(&gcs.url)
            .create_bucket(&bucket)
            .await
            .unwrap();
        bucket
    } else {
        bucket
    };
    let env = [
        (
            "GOOGLE_APPLICATION_CREDENTIALS",
            key_file.display().to_string(),
        ),
        ("LEADER_HTTPS_CANARY_BUCKET", bucket.clone()),
    ];
    if !in_child_with_ca("gcs_canary_over_https", &tls, &env) {
        return;
    }
    let store = leader_gcs::GcsBuilder::new()
        .with_bucket(bucket)
        .with_endpoint(&tls.gcs)
        .with_application_default_credentials()
        .build()
        .await
        .unwrap();
    canary(Arc::new(store)).await;
}
