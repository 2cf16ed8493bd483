//! The HTTPS endpoints and fake identity endpoints that `scripts/emulators` starts, for the
//! tests of the real-cloud paths (TLS, credential chains).
//!
//! `scripts/emulators` generates a throwaway test CA (`LEADER_TEST_CA_FILE`), serves moto,
//! fake-gcs-server and etcd on a second, HTTPS port, a second Azurite over HTTPS with OAuth and
//! a second etcd with auth enabled, and
//! starts `scripts/fake_identity.py`: a local *fake* of the identity endpoints (AWS instance
//! metadata, Entra ID token endpoint, App Service managed identity, GCE metadata server, Google
//! STS). The stores stay the real emulators. Nothing here sets `SSL_CERT_FILE` for the test
//! process: the tests set it in the environment of the processes they start, as a user would.

use std::path::PathBuf;

/// Set to `1` by `scripts/emulators`: the HTTPS setup must be there (Docker's `env.sh` lacks it).
pub const REQUIRED_VAR: &str = "LEADER_TLS_REQUIRED";

/// Everything the real-cloud-path tests need.
#[derive(Clone, Debug)]
pub struct TlsSetup {
    /// The test CA's certificate (PEM): what `SSL_CERT_FILE` points at.
    pub ca_file: PathBuf,
    /// Another CA, which signed nothing the tests talk to (for the untrusted-certificate case).
    pub other_ca_file: PathBuf,
    /// An RSA key (PKCS#8 PEM) for a fake Google service account.
    pub sa_key_file: PathBuf,
    /// Azurite over HTTPS with OAuth: `https://127.0.0.1:PORT/devstoreaccount1`.
    pub azurite: String,
    /// moto over HTTPS (same state as `AWS_ENDPOINT_URL`).
    pub moto: String,
    /// fake-gcs-server over HTTPS (same state as `STORAGE_EMULATOR_HOST`).
    pub gcs: String,
    /// The fake identity endpoints over plain HTTP: `http://127.0.0.1:PORT`.
    pub identity_http: String,
    /// The fake identity endpoints over HTTPS (same state).
    pub identity_https: String,
    /// etcd over HTTPS (same state as `LEADER_ETCD_ENDPOINT`).
    pub etcd: String,
    /// A second etcd with auth enabled: `http://127.0.0.1:PORT`.
    pub etcd_auth: String,
    /// The password of that etcd's `root` user (a throwaway credential of the test server).
    pub etcd_root_password: String,
}

impl TlsSetup {
    /// The setup from the environment; `None` if a variable is missing (the message names it).
    pub fn from_env() -> Result<Self, String> {
        let var = |name: &str| {
            std::env::var(name)
                .ok()
                .map(|v| v.trim().trim_end_matches('/').to_owned())
                .filter(|v| !v.is_empty())
                .ok_or_else(|| format!("{name} is not set"))
        };
        let ca_file = PathBuf::from(var("LEADER_TEST_CA_FILE")?);
        Ok(Self {
            other_ca_file: ca_file.with_file_name("other-ca.pem"),
            ca_file,
            sa_key_file: var("LEADER_TEST_SA_KEY_FILE")?.into(),
            azurite: var("LEADER_AZURITE_HTTPS_ENDPOINT")?,
            moto: var("LEADER_MOTO_HTTPS_ENDPOINT")?,
            gcs: var("LEADER_GCS_HTTPS_ENDPOINT")?,
            identity_http: var("LEADER_FAKE_IDENTITY_HTTP")?,
            identity_https: var("LEADER_FAKE_IDENTITY_HTTPS")?,
            etcd: var("LEADER_ETCD_HTTPS_ENDPOINT")?,
            etcd_auth: var("LEADER_ETCD_AUTH_ENDPOINT")?,
            etcd_root_password: var("LEADER_ETCD_AUTH_ROOT_PASSWORD")?,
        })
    }

    /// A Google service-account key file (JSON) for a fake account, with the test key
    /// ([`sa_key_file`](Self::sa_key_file)) and a `token_uri` on the fake identity endpoints
    /// (which the SDK never calls: it signs its own token).
    ///
    /// # Errors
    /// The test key cannot be read.
    pub fn service_account_json(&self) -> std::io::Result<String> {
        let key = std::fs::read_to_string(&self.sa_key_file)?;
        Ok(serde_json::json!({
            "type": "service_account",
            "project_id": "fake-project",
            "private_key_id": "fake-key-1",
            "private_key": key,
            "client_email": "leader-test@fake-project.iam.gserviceaccount.com",
            "client_id": "100000000000000000001",
            "token_uri": format!("{}/token", self.identity_https),
        })
        .to_string())
    }

    /// The fake identity endpoints' `host:port` (for `GCE_METADATA_HOST`).
    pub fn identity_authority(&self) -> &str {
        crate::proxy::authority(&self.identity_http).unwrap_or(&self.identity_http)
    }

    /// The requests the fake identity endpoints have seen (`GET /_calls`): method, path, query,
    /// headers (secrets redacted), form fields, status.
    ///
    /// # Errors
    /// The fake did not answer, or answered with something other than a JSON list.
    pub async fn identity_calls(&self) -> Result<Vec<serde_json::Value>, String> {
        let url = format!("{}/_calls", self.identity_http);
        let response = reqwest::get(&url)
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let value: serde_json::Value = response.json().await.map_err(|e| format!("{url}: {e}"))?;
        match value {
            serde_json::Value::Array(calls) => Ok(calls),
            other => Err(format!("{url} answered {other}")),
        }
    }
}

/// For tests: the setup, or `None` to skip (when `LEADER_TLS_REQUIRED` is not `1`, after saying
/// so on stderr). Fails the calling test when the setup is required but incomplete.
#[allow(
    clippy::panic,
    clippy::print_stderr,
    reason = "a test helper: failing the test with a message is its job"
)]
pub fn require_tls() -> Option<TlsSetup> {
    match TlsSetup::from_env() {
        Ok(setup) => Some(setup),
        Err(missing) if std::env::var(REQUIRED_VAR).is_ok_and(|v| v == "1") => {
            panic!("the HTTPS test setup is incomplete: {missing} (scripts/emulators sets it)")
        }
        Err(missing) => {
            eprintln!(
                "SKIPPED: {missing}; run under `scripts/emulators run --` for the HTTPS and \
                 credential-chain tests"
            );
            None
        }
    }
}
