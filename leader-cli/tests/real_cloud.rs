//! The paths a cloud user takes, end to end: HTTPS with a CA trusted through `SSL_CERT_FILE`,
//! and every credential chain the suite documents, against the real emulators (moto,
//! Azurite, fake-gcs-server) and a local fake of the identity endpoints
//! (`scripts/fake_identity.py`: instance metadata, token endpoints; never a store).
//!
//! Each `leader` process starts from an EMPTY environment (`env_clear`) plus the variables of
//! one credential path and an empty `HOME`, so a run that succeeds can only have used that
//! path; the fake's request log shows that the SDK really went through it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods // real processes need real time
)]

mod common;

use std::path::Path;
use std::process::Command;

use integration_tests::tls::{TlsSetup, require_tls};
use integration_tests::{Emulator, require, unique_name};
use serde_json::{Value, json};

/// Azurite's published development key (not a secret).
const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// A process environment with nothing but `PATH`, an empty `HOME`, quiet logs and the test
/// CA as the only trusted root.
fn clean_env(command: &mut Command, home: &Path, tls: &TlsSetup) {
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("LEADER_LOG", "warn")
        .env("SSL_CERT_FILE", &tls.ca_file);
}

/// The fake identity endpoints' calls to `path` (exact) since the test began, with the status
/// each got.
async fn calls_to(tls: &TlsSetup, path: &str) -> Vec<Value> {
    tls.identity_calls()
        .await
        .unwrap()
        .into_iter()
        .filter(|c| c["path"] == path)
        .collect()
}

fn write(dir: &Path, name: &str, content: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    path.display().to_string()
}

// ---------------------------------------------------------------------------------------------
// HTTPS, with static credentials

#[tokio::test]
async fn dynamodb_over_https_with_keys_in_the_environment() {
    let Some(tls) = require_tls() else { return };
    let home = tempfile::tempdir().unwrap();
    let table = unique_name("https");
    common::run_twice_with(
        &format!("dynamodb://{table}/job"),
        &["--endpoint", &tls.moto, "--create-if-missing"],
        |c| {
            clean_env(c, home.path(), &tls);
            c.env("AWS_ACCESS_KEY_ID", "AKIAENVIRONMENT00001")
                .env("AWS_SECRET_ACCESS_KEY", "env-secret")
                .env("AWS_REGION", "us-east-1")
                .env("AWS_EC2_METADATA_DISABLED", "true");
        },
    );
}

/// A fresh bucket on an S3 emulator (created over its plain-HTTP port: the same state as its
/// HTTPS one); `leader` never creates buckets.
async fn s3_bucket(emulator: Emulator) -> Option<String> {
    let ep = require(emulator).await?;
    let bucket = unique_name("https");
    integration_tests::s3::create_bucket(&ep.url, &bucket)
        .await
        .unwrap();
    Some(bucket)
}

/// S3 over HTTPS on both emulators (moto's TLS port, LocalStack serving the test CA's
/// certificate), through the AWS chain's environment keys and a path-style `--endpoint`.
#[tokio::test]
async fn s3_over_https_with_keys_in_the_environment() {
    let Some(tls) = require_tls() else { return };
    let localstack = std::env::var("LEADER_LOCALSTACK_HTTPS_ENDPOINT")
        .expect("LEADER_LOCALSTACK_HTTPS_ENDPOINT (set by scripts/emulators)");
    let home = tempfile::tempdir().unwrap();
    for (emulator, endpoint) in [
        (Emulator::MotoS3, tls.moto.clone()),
        (Emulator::LocalStackS3, localstack),
    ] {
        let Some(bucket) = s3_bucket(emulator).await else {
            return;
        };
        assert!(endpoint.starts_with("https://"), "{endpoint}");
        common::run_twice_with(
            &format!("s3://{bucket}/team/job"),
            &["--endpoint", &endpoint],
            |c| {
                clean_env(c, home.path(), &tls);
                c.env("AWS_ACCESS_KEY_ID", "AKIAENVIRONMENT00001")
                    .env("AWS_SECRET_ACCESS_KEY", "env-secret")
                    .env("AWS_REGION", "us-east-1")
                    .env("AWS_EC2_METADATA_DISABLED", "true");
            },
        );
    }
}

#[tokio::test]
async fn azure_over_https_with_the_account_key() {
    let Some(tls) = require_tls() else { return };
    let home = tempfile::tempdir().unwrap();
    let container = unique_name("https");
    common::run_twice_with(
        &format!("azblob://{container}/job"),
        &["--endpoint", &tls.azurite, "--create-if-missing"],
        |c| {
            clean_env(c, home.path(), &tls);
            c.env("AZURE_STORAGE_ACCOUNT", "devstoreaccount1")
                .env("AZURE_STORAGE_KEY", AZURITE_KEY);
        },
    );
}

/// An https endpoint whose certificate the machine does not trust is a clear, permanent
/// error, not a retry loop (and, as before this suite had one crypto provider, no panic).
#[tokio::test]
async fn an_untrusted_certificate_is_a_clear_error() {
    let Some(tls) = require_tls() else { return };
    let Some(gcs) = require(Emulator::Gcs).await else {
        return;
    };
    let bucket = unique_name("untrusted");
    integration_tests::gcs::GcsClient::new(&gcs.url)
        .create_bucket(&bucket)
        .await
        .unwrap();
    let home = tempfile::tempdir().unwrap();
    for (store, endpoint) in [
        (format!("gs://{bucket}/job"), &tls.gcs),
        (
            format!("dynamodb://{}/job", unique_name("untrusted")),
            &tls.moto,
        ),
        (
            format!("azblob://{}/job", unique_name("untrusted")),
            &tls.azurite,
        ),
    ] {
        let started = std::time::Instant::now();
        let mut command = Command::new(common::LEADER);
        command.args([
            "run",
            "--store",
            &store,
            "--endpoint",
            endpoint,
            "--emulator",
        ]);
        // A regression (retrying the handshake) ends with --wait's 73 instead of hanging.
        command.args(["--wait", "15s", "--", "true"]);
        clean_env(&mut command, home.path(), &tls);
        command.env("SSL_CERT_FILE", &tls.other_ca_file);
        let out = command.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{store}: {err}");
        assert!(
            err.contains("certificate") && err.contains("SSL_CERT_FILE"),
            "{store}: {err}"
        );
        assert!(!err.contains("panicked"), "{store}: {err}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "{store}: not retried for long"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// AWS credential chain

#[tokio::test]
async fn aws_shared_profile_files() {
    let Some(tls) = require_tls() else { return };
    let home = tempfile::tempdir().unwrap();
    let credentials = write(
        home.path(),
        "credentials",
        "[leader-test]\naws_access_key_id = AKIAPROFILE000000001\naws_secret_access_key = profile-secret\n",
    );
    let config = write(
        home.path(),
        "config",
        "[profile leader-test]\nregion = us-east-1\n",
    );
    let table = unique_name("profile");
    let store = format!("dynamodb://{table}/job");
    let profile_env = |c: &mut Command, profile: &str| {
        clean_env(c, home.path(), &tls);
        c.env("AWS_SHARED_CREDENTIALS_FILE", &credentials)
            .env("AWS_CONFIG_FILE", &config)
            .env("AWS_PROFILE", profile)
            .env("AWS_EC2_METADATA_DISABLED", "true");
    };
    common::run_twice_with(
        &store,
        &["--endpoint", &tls.moto, "--create-if-missing"],
        |c| profile_env(c, "leader-test"),
    );
    // The control: the same environment with a profile that has no keys finds no credentials.
    let mut command = Command::new(common::LEADER);
    command.args(["status", "--store", &store, "--endpoint", &tls.moto]);
    profile_env(&mut command, "nobody");
    let out = command.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("nobody") || err.contains("credentials"),
        "{err}"
    );
}

/// A machine with no AWS credentials at all (no instance metadata service either): `leader`
/// ends at once with one line that says what to set, at the default log level - not the
/// SDK's multi-line warnings for every provider it tried, and not a retry loop.
#[tokio::test]
async fn aws_without_any_credentials_is_one_clear_line() {
    let Some(tls) = require_tls() else { return };
    let home = tempfile::tempdir().unwrap();
    let mut command = Command::new(common::LEADER);
    command.args([
        "run",
        "--store",
        "dynamodb://leases/job",
        "--endpoint",
        &tls.moto,
    ]);
    command.args(["--wait", "15s", "--", "true"]);
    clean_env(&mut command, home.path(), &tls);
    command
        .env_remove("LEADER_LOG")
        .env("AWS_REGION", "us-east-1")
        // Where no metadata service answers (connection refused), as off EC2.
        .env("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:1");
    let out = command.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("AWS_PROFILE") && err.contains("instance profile"),
        "{err}"
    );
}

#[tokio::test]
async fn aws_web_identity_through_sts() {
    let Some(tls) = require_tls() else { return };
    let home = tempfile::tempdir().unwrap();
    let token = write(
        home.path(),
        "token",
        "eyJhbGciOiJSUzI1NiJ9.e30.fake-web-identity",
    );
    let table = unique_name("webid");
    common::run_twice_with(
        &format!("dynamodb://{table}/job"),
        &["--endpoint", &tls.moto, "--create-if-missing"],
        |c| {
            clean_env(c, home.path(), &tls);
            c.env("AWS_WEB_IDENTITY_TOKEN_FILE", &token)
                .env("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/leader-test")
                .env("AWS_ROLE_SESSION_NAME", "leader-test")
                // STS is moto too (over HTTPS); the token file is all the pod has.
                .env("AWS_ENDPOINT_URL_STS", &tls.moto)
                .env("AWS_REGION", "us-east-1")
                .env("AWS_EC2_METADATA_DISABLED", "true");
        },
    );
}

/// The same two AWS paths for `s3://`: a shared profile, and web identity exchanged at STS.
#[tokio::test]
async fn s3_profile_and_web_identity() {
    let Some(tls) = require_tls() else { return };
    let home = tempfile::tempdir().unwrap();
    let credentials = write(
        home.path(),
        "credentials",
        "[s3-test]\naws_access_key_id = AKIAPROFILE000000002\naws_secret_access_key = profile-secret\n",
    );
    let config = write(
        home.path(),
        "config",
        "[profile s3-test]\nregion = us-east-1\n",
    );
    let token = write(
        home.path(),
        "token",
        "eyJhbGciOiJSUzI1NiJ9.e30.fake-web-identity",
    );
    let Some(bucket) = s3_bucket(Emulator::MotoS3).await else {
        return;
    };
    let store = format!("s3://{bucket}/job");
    common::run_twice_with(&store, &["--endpoint", &tls.moto], |c| {
        clean_env(c, home.path(), &tls);
        c.env("AWS_SHARED_CREDENTIALS_FILE", &credentials)
            .env("AWS_CONFIG_FILE", &config)
            .env("AWS_PROFILE", "s3-test")
            .env("AWS_EC2_METADATA_DISABLED", "true");
    });
    common::run_twice_with(&store, &["--endpoint", &tls.moto], |c| {
        clean_env(c, home.path(), &tls);
        c.env("AWS_WEB_IDENTITY_TOKEN_FILE", &token)
            .env("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/leader-test")
            .env("AWS_ROLE_SESSION_NAME", "leader-test")
            .env("AWS_ENDPOINT_URL_STS", &tls.moto)
            .env("AWS_REGION", "us-east-1")
            .env("AWS_EC2_METADATA_DISABLED", "true");
    });
    // The control: a profile without keys finds no credentials, and says so.
    let mut command = Command::new(common::LEADER);
    command.args(["status", "--store", &store, "--endpoint", &tls.moto]);
    clean_env(&mut command, home.path(), &tls);
    command
        .env("AWS_SHARED_CREDENTIALS_FILE", &credentials)
        .env("AWS_CONFIG_FILE", &config)
        .env("AWS_PROFILE", "nobody")
        .env("AWS_EC2_METADATA_DISABLED", "true");
    // Without a region S3 cannot be addressed: a configuration error (exit 78) that says so.
    let out = command.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(err.contains("AWS_REGION"), "{err}");
    // With one, the missing keys are what it says.
    command.env("AWS_REGION", "us-east-1");
    let out = command.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("nobody") || err.contains("credentials"),
        "{err}"
    );
}

#[tokio::test]
async fn aws_instance_metadata_imdsv2() {
    let Some(tls) = require_tls() else { return };
    let home = tempfile::tempdir().unwrap();
    let table = unique_name("imds");
    let before = calls_to(&tls, "/latest/api/token").await.len();
    common::run_twice_with(
        &format!("dynamodb://{table}/job"),
        &["--endpoint", &tls.moto, "--create-if-missing"],
        |c| {
            clean_env(c, home.path(), &tls);
            // No region either: it comes from the instance metadata too.
            c.env("AWS_EC2_METADATA_SERVICE_ENDPOINT", &tls.identity_http);
        },
    );
    let tokens = calls_to(&tls, "/latest/api/token").await;
    assert!(
        tokens.len() > before,
        "no IMDSv2 session token was asked for"
    );
    assert!(
        tokens
            .iter()
            .all(|c| c["method"] == "PUT" && c["status"] == 200)
    );
    let role = calls_to(
        &tls,
        "/latest/meta-data/iam/security-credentials/leader-test-role",
    )
    .await;
    assert!(
        role.iter().any(|c| c["status"] == 200),
        "the role's credentials were never fetched: {role:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Azure: Microsoft Entra ID, over HTTPS to Azurite in OAuth mode

#[tokio::test]
async fn azure_workload_identity() {
    let Some(tls) = require_tls() else { return };
    let home = tempfile::tempdir().unwrap();
    let client_id = unique_name("client");
    let assertion = format!("eyJhbGciOiJSUzI1NiJ9.{client_id}.federated");
    let token_file = write(home.path(), "federated-token", &assertion);
    let container = unique_name("workload");
    common::run_twice_with(
        &format!("azblob://{container}/job"),
        &["--endpoint", &tls.azurite, "--create-if-missing"],
        |c| {
            clean_env(c, home.path(), &tls);
            c.env("AZURE_STORAGE_ACCOUNT", "devstoreaccount1")
                .env("AZURE_TENANT_ID", "fake-tenant")
                .env("AZURE_CLIENT_ID", &client_id)
                .env("AZURE_FEDERATED_TOKEN_FILE", &token_file)
                .env("AZURE_AUTHORITY_HOST", &tls.identity_https);
        },
    );
    let ours: Vec<Value> = calls_to(&tls, "/fake-tenant/oauth2/v2.0/token")
        .await
        .into_iter()
        .filter(|c| c["form"]["client_id"] == client_id.as_str())
        .collect();
    assert!(!ours.is_empty(), "the token endpoint was never asked");
    for call in &ours {
        assert_eq!(call["status"], 200, "{call}");
        assert_eq!(
            call["form"]["client_assertion"],
            json!(format!("<{} chars>", assertion.len())),
            "the federated token file is the assertion: {call}"
        );
        assert_eq!(call["form"]["scope"], "https://storage.azure.com/.default");
    }
}

#[tokio::test]
async fn azure_managed_identity_app_service() {
    let Some(tls) = require_tls() else { return };
    let home = tempfile::tempdir().unwrap();
    let client_id = unique_name("msi");
    let container = unique_name("msi");
    common::run_twice_with(
        &format!("azblob://{container}/job"),
        &["--endpoint", &tls.azurite, "--create-if-missing"],
        |c| {
            clean_env(c, home.path(), &tls);
            c.env("AZURE_STORAGE_ACCOUNT", "devstoreaccount1")
                // A user-assigned identity, picked by its client id.
                .env("AZURE_CLIENT_ID", &client_id)
                .env(
                    "IDENTITY_ENDPOINT",
                    format!("{}/msi/token", tls.identity_http),
                )
                .env("IDENTITY_HEADER", "fake-identity-header");
        },
    );
    let ours: Vec<Value> = calls_to(&tls, "/msi/token")
        .await
        .into_iter()
        .filter(|c| c["query"]["client_id"] == client_id.as_str())
        .collect();
    assert!(
        !ours.is_empty(),
        "the managed identity endpoint was never asked"
    );
    assert!(ours.iter().all(|c| c["status"] == 200), "{ours:?}");
    assert_eq!(ours[0]["query"]["resource"], "https://storage.azure.com");
}

// ---------------------------------------------------------------------------------------------
// Google: Application Default Credentials, over HTTPS

async fn gcs_bucket(prefix: &str) -> Option<String> {
    let gcs = require(Emulator::Gcs).await?;
    let bucket = unique_name(prefix);
    integration_tests::gcs::GcsClient::new(&gcs.url)
        .create_bucket(&bucket)
        .await
        .unwrap();
    Some(bucket)
}

#[tokio::test]
async fn gcs_service_account_key_file() {
    let Some(tls) = require_tls() else { return };
    let Some(bucket) = gcs_bucket("sa").await else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let file = write(
        home.path(),
        "service-account.json",
        &tls.service_account_json().unwrap(),
    );
    common::run_twice_with(
        &format!("gs://{bucket}/job"),
        &["--endpoint", &tls.gcs],
        |c| {
            clean_env(c, home.path(), &tls);
            c.env("GOOGLE_APPLICATION_CREDENTIALS", &file);
        },
    );
}

#[tokio::test]
async fn gcs_metadata_server() {
    let Some(tls) = require_tls() else { return };
    let Some(bucket) = gcs_bucket("mds").await else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let path = "/computeMetadata/v1/instance/service-accounts/default/token";
    let before = calls_to(&tls, path).await.len();
    common::run_twice_with(
        &format!("gs://{bucket}/job"),
        &["--endpoint", &tls.gcs],
        |c| {
            clean_env(c, home.path(), &tls);
            c.env("GCE_METADATA_HOST", tls.identity_authority());
        },
    );
    let calls = calls_to(&tls, path).await;
    assert!(calls.len() > before, "the metadata server was never asked");
    assert!(
        calls[before..]
            .iter()
            .all(|c| c["status"] == 200 && c["headers"]["metadata-flavor"] == "Google"),
        "{calls:?}"
    );
}

#[tokio::test]
async fn gcs_workload_identity_federation() {
    let Some(tls) = require_tls() else { return };
    let Some(bucket) = gcs_bucket("wif").await else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let subject = format!("subject-token-{}", unique_name("wif"));
    let subject_file = write(home.path(), "subject-token", &subject);
    let audience = format!(
        "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/{}/providers/p",
        unique_name("pool")
    );
    let file = write(
        home.path(),
        "external-account.json",
        &json!({
            "type": "external_account",
            "audience": audience,
            "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
            "token_url": format!("{}/v1/token", tls.identity_https),
            "credential_source": { "file": subject_file, "format": { "type": "text" } },
        })
        .to_string(),
    );
    common::run_twice_with(
        &format!("gs://{bucket}/job"),
        &["--endpoint", &tls.gcs],
        |c| {
            clean_env(c, home.path(), &tls);
            c.env("GOOGLE_APPLICATION_CREDENTIALS", &file);
        },
    );
    let ours: Vec<Value> = calls_to(&tls, "/v1/token")
        .await
        .into_iter()
        .filter(|c| c["form"]["audience"] == audience.as_str())
        .collect();
    assert!(!ours.is_empty(), "the token exchange was never asked");
    assert!(
        ours.iter().all(|c| c["status"] == 200
            && c["form"]["subject_token"] == json!(format!("<{} chars>", subject.len()))),
        "{ours:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Flags

/// `--emulator` takes the emulator's address from `--endpoint` or the emulator's own variable;
/// with neither it is a configuration error that names both (not a silent public endpoint).
#[test]
fn emulator_mode_needs_an_address() {
    for (store, variable) in [
        ("dynamodb://leases/job", "AWS_ENDPOINT_URL"),
        ("gs://leases/job", "STORAGE_EMULATOR_HOST"),
    ] {
        let out = Command::new(common::LEADER)
            .args(["status", "--store", store, "--emulator"])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{store}: {err}");
        assert!(
            err.contains("--endpoint") && err.contains(variable),
            "{store}: {err}"
        );
    }
}
