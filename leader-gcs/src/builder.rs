//! Configuration of a [`GcsStore`]: bucket, object prefix, endpoint and credentials;
//! `build()` validates it, proves that the credentials give a token, and checks the bucket.

use std::fmt;

use google_cloud_auth::credentials::{self, Credentials, anonymous};
use google_cloud_gax::retry_policy::NeverRetry;
use google_cloud_storage::client::Storage;
use google_cloud_storage::read_resume_policy::NeverResume;
use leader_core::Error;
use leader_core::backend::check_prefix;

use crate::client::GcsStore;

/// Environment variable with the bucket, read by [`GcsBuilder::from_env`].
pub const BUCKET_VAR: &str = "LEADER_GCS_BUCKET";
/// Environment variable with the object name prefix, read by [`GcsBuilder::from_env`].
pub const PREFIX_VAR: &str = "LEADER_GCS_PREFIX";
/// Environment variable with an emulator's endpoint (`host:port` or a URL). When set,
/// [`GcsBuilder::from_env`] talks to it with anonymous credentials. The SDK itself ignores it.
pub const EMULATOR_VAR: &str = "STORAGE_EMULATOR_HOST";

/// The default prefix of object names: none. The lease of key `k` is the object `k`, a
/// protected object `name` is `.name.fenced`, both at the bucket's root.
pub const DEFAULT_PREFIX: &str = "";

#[derive(Clone)]
enum Identity {
    /// Application Default Credentials: `GOOGLE_APPLICATION_CREDENTIALS`, the gcloud
    /// application-default login, or the metadata server (GCE, GKE workload identity, Cloud Run).
    ApplicationDefault,
    /// No credentials at all (emulators only).
    Anonymous,
    /// Credentials built by the caller.
    Given(Credentials),
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print credentials, even their debug form.
        f.write_str(match self {
            Identity::ApplicationDefault => "ApplicationDefault",
            Identity::Anonymous => "Anonymous",
            Identity::Given(_) => "Given(..)",
        })
    }
}

/// Builds a [`GcsStore`].
///
/// ```no_run
/// # async fn f() -> Result<(), leader_core::Error> {
/// use leader_gcs::GcsBuilder;
///
/// let store = GcsBuilder::new()
///     .with_bucket("my-leases")
///     .with_prefix("prod/leases/")
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct GcsBuilder {
    bucket: Option<String>,
    prefix: String,
    endpoint: Option<String>,
    identity: Identity,
}

impl GcsStore {
    /// A builder; see [`GcsBuilder`].
    pub fn builder() -> GcsBuilder {
        GcsBuilder::new()
    }
}

impl Default for GcsBuilder {
    fn default() -> Self {
        Self {
            bucket: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            endpoint: None,
            identity: Identity::ApplicationDefault,
        }
    }
}

impl GcsBuilder {
    /// A builder with Application Default Credentials and the public endpoint; set the
    /// bucket with [`with_bucket`](Self::with_bucket).
    pub fn new() -> Self {
        Self::default()
    }

    /// A builder from the environment: the bucket from `LEADER_GCS_BUCKET`, the prefix from
    /// `LEADER_GCS_PREFIX` (if set), and, if `STORAGE_EMULATOR_HOST` is set, that emulator
    /// with anonymous credentials (see [`GcsBuilder::with_emulator`]). `build()` reports a missing
    /// bucket.
    ///
    /// # Errors
    /// None today (everything is checked in `build`); the `Result` keeps the builders of all
    /// backends alike.
    pub fn from_env() -> Result<Self, Error> {
        Ok(Self::from_vars(|name| std::env::var(name).ok()))
    }

    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let var = |name| {
            var(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let mut builder = Self {
            bucket: var(BUCKET_VAR),
            ..Self::default()
        };
        if let Some(prefix) = var(PREFIX_VAR) {
            builder.prefix = prefix;
        }
        if let Some(host) = var(EMULATOR_VAR) {
            builder = builder.with_emulator(host);
        }
        builder
    }

    /// Sets the bucket.
    pub fn with_bucket(mut self, bucket: impl Into<String>) -> Self {
        self.bucket = Some(bucket.into());
        self
    }

    /// Sets the prefix of object names, such as a folder `prod/leases/` (default: none). The
    /// lease of key `k` is then `prod/leases/k`, a protected object `name` is
    /// `prod/leases/.name.fenced`.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sets the endpoint (default: the SDK's, `https://storage.googleapis.com`), e.g. a Private
    /// Service Connect endpoint. The credentials stay as configured; TLS is used if the URL
    /// says `https`.
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// Uses these credentials instead of Application Default Credentials (for example a
    /// service account key or impersonation, built with `google-cloud-auth`).
    pub fn with_credentials(mut self, credentials: Credentials) -> Self {
        self.identity = Identity::Given(credentials);
        self
    }

    /// Uses Application Default Credentials (the default; undoes
    /// [`with_anonymous_credentials`](Self::with_anonymous_credentials) or an emulator set by
    /// [`from_env`](Self::from_env)): `GOOGLE_APPLICATION_CREDENTIALS`, the gcloud
    /// application-default login, or the metadata server (`GCE_METADATA_HOST` moves it).
    pub fn with_application_default_credentials(mut self) -> Self {
        self.identity = Identity::ApplicationDefault;
        self
    }

    /// Sends no credentials. Only an emulator accepts that.
    pub fn with_anonymous_credentials(mut self) -> Self {
        self.identity = Identity::Anonymous;
        self
    }

    /// Talks to an emulator (fake-gcs-server) at `host` (`127.0.0.1:4443` or
    /// `http://127.0.0.1:4443`) with anonymous credentials. Without anonymous credentials the
    /// SDK would look for a metadata server.
    pub fn with_emulator(self, host: impl Into<String>) -> Self {
        let host = host.into();
        let host = host.trim().trim_end_matches('/');
        let endpoint = if host.contains("://") {
            host.to_owned()
        } else {
            format!("http://{host}")
        };
        self.with_endpoint(endpoint).with_anonymous_credentials()
    }

    /// Validates the configuration, obtains a first token from the credentials, checks the
    /// bucket with one read, and builds the store. Each step has the call's time
    /// ([`leader_core::backend::within`], else [`leader_core::backend::DEFAULT_BUDGET`]).
    /// GCS says on that read whether the bucket is missing; fake-gcs-server does not (it
    /// says so on the first write). This crate never creates buckets.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a missing or invalid bucket name or an invalid prefix;
    /// [`Error::Unauthenticated`] if the credentials give no token in time (no credentials
    /// file, no metadata server); [`Error::NotFound`] naming a missing bucket;
    /// [`Error::PermissionDenied`] if the credentials may not read the bucket.
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is written.
    pub async fn build(self) -> Result<GcsStore, Error> {
        let bucket = self
            .bucket
            .clone()
            .ok_or_else(|| invalid(format!("no bucket configured; set {BUCKET_VAR}")))?;
        check_bucket_name(&bucket).map_err(invalid)?;
        check_prefix(&self.prefix).map_err(|e| invalid(e.to_string()))?;
        leader_core::tls::install_crypto_provider();
        let credentials = match self.identity {
            Identity::ApplicationDefault => {
                credentials::Builder::default()
                    .build()
                    .map_err(|e| Error::Unauthenticated {
                        message: format!("no Application Default Credentials: {e}"),
                        source: Some(Box::new(e)),
                    })?
            }
            Identity::Anonymous => anonymous::Builder::new().build(),
            Identity::Given(credentials) => credentials,
        };
        probe(&credentials).await?;
        let mut storage = Storage::builder()
            .with_credentials(credentials)
            // Retries are ours (client.rs), inside the request timeout; the SDK's default
            // policy would retry for minutes and repeat conditional writes.
            .with_retry_policy(NeverRetry)
            .with_read_resume_policy(NeverResume);
        if let Some(endpoint) = &self.endpoint {
            storage = storage.with_endpoint(endpoint.clone());
        }
        let storage = storage.build().await.map_err(|e| Error::InvalidConfig {
            message: format!("cannot build the GCS client: {e}"),
            source: Some(Box::new(e)),
        })?;
        let store = GcsStore::new(storage, bucket, self.prefix);
        store.check_bucket().await?;
        Ok(store)
    }
}

fn invalid(message: String) -> Error {
    Error::InvalidConfig {
        message,
        source: None,
    }
}

/// Asks the credentials for request headers once, so that a machine without usable
/// credentials fails at startup with a clear error instead of at every request.
async fn probe(credentials: &Credentials) -> Result<(), Error> {
    let deadline = leader_core::backend::call_deadline();
    let limit = deadline.saturating_duration_since(tokio::time::Instant::now());
    match tokio::time::timeout_at(deadline, credentials.headers(http::Extensions::new())).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(Error::Unauthenticated {
            message: format!("the credentials gave no access token: {e}"),
            source: Some(Box::new(e)),
        }),
        Err(_) => Err(Error::Unauthenticated {
            message: format!(
                "the credentials gave no access token within {limit:?} (Application Default \
                 Credentials found no credentials file and no metadata server answered?); set \
                 GOOGLE_APPLICATION_CREDENTIALS, run with a service account, or use an emulator \
                 with anonymous credentials"
            ),
            source: None,
        }),
    }
}

/// GCS bucket names: 3 to 63 characters (222 with dots), lowercase letters, digits, `-`, `_`
/// and `.`, starting and ending with a letter or digit.
fn check_bucket_name(bucket: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("invalid bucket name {bucket:?}: {why}"));
    if bucket.len() < 3 || bucket.len() > 222 {
        return bad("it must have 3 to 63 characters");
    }
    if !bucket
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.'))
    {
        return bad("use lowercase letters, digits, '-', '_' and '.' (the name, not a gs:// URL)");
    }
    let edge_ok = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !edge_ok(bucket.bytes().next()) || !edge_ok(bucket.bytes().last()) {
        return bad("it must start and end with a letter or digit");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use leader_core::ErrorKind;

    #[test]
    fn bucket_names_are_checked() {
        for ok in ["abc", "my-leases", "a.b_c-1"] {
            assert!(check_bucket_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "ab", "My-Leases", "gs://x", "-abc", "abc-", "a b c"] {
            assert!(check_bucket_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn from_env_reads_bucket_prefix_and_emulator() {
        let vars = |name: &str| match name {
            BUCKET_VAR => Some("leases".to_owned()),
            PREFIX_VAR => Some("p/".to_owned()),
            EMULATOR_VAR => Some("127.0.0.1:4443".to_owned()),
            _ => None,
        };
        let b = GcsBuilder::from_vars(vars);
        assert_eq!(b.bucket.as_deref(), Some("leases"));
        assert_eq!(b.prefix, "p/");
        assert_eq!(b.endpoint.as_deref(), Some("http://127.0.0.1:4443"));
        assert!(matches!(b.identity, Identity::Anonymous));

        let plain = GcsBuilder::from_vars(|name| (name == BUCKET_VAR).then(|| "b1c".to_owned()));
        assert_eq!(plain.endpoint, None);
        assert_eq!(plain.prefix, DEFAULT_PREFIX);
        assert!(matches!(plain.identity, Identity::ApplicationDefault));
    }

    #[test]
    fn emulator_keeps_a_scheme() {
        let b = GcsBuilder::new()
            .with_bucket("b1c")
            .with_emulator("http://localhost:9000/");
        assert_eq!(b.endpoint.as_deref(), Some("http://localhost:9000"));
    }

    #[test]
    fn debug_never_shows_credentials() {
        let b = GcsBuilder::new()
            .with_bucket("b1c")
            .with_credentials(anonymous::Builder::new().build());
        assert!(format!("{b:?}").contains("Given(..)"));
    }

    #[tokio::test]
    async fn build_rejects_bad_config() {
        let no_bucket = GcsBuilder::default().build().await.unwrap_err();
        assert_eq!(no_bucket.kind(), ErrorKind::InvalidConfig);
        assert!(no_bucket.to_string().contains(BUCKET_VAR), "{no_bucket}");
        let bad = GcsBuilder::new()
            .with_bucket("Bad_Bucket")
            .build()
            .await
            .unwrap_err();
        assert!(bad.to_string().contains("Bad_Bucket"), "{bad}");
    }
}
