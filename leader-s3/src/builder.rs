//! Configuration of an [`S3Store`]: the client, the bucket, the prefix.

use aws_sdk_s3::Client;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use leader_core::Error;
use leader_core::backend::{Backoff, check_prefix};

use crate::client::S3Store;
use crate::error::Context;

/// Environment variable with the bucket, read by [`S3Builder::from_env`].
pub const BUCKET_VAR: &str = "LEADER_S3_BUCKET";
/// Environment variable with the object name prefix, read by [`S3Builder::from_env`].
pub const PREFIX_VAR: &str = "LEADER_S3_PREFIX";

/// Builds an [`S3Store`]: `new()` or [`from_env`](S3Builder::from_env), typed `with_*`
/// setters, then [`build`](S3Builder::build), which validates the settings and checks the
/// bucket.
///
/// ```no_run
/// # async fn f() -> Result<(), leader_core::Error> {
/// let store = leader_s3::S3Builder::new()
///     .with_emulator("http://127.0.0.1:4566")
///     .with_bucket("leases")
///     .with_prefix("prod/")
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct S3Builder {
    client: Option<Client>,
    /// Load the default AWS configuration chain in `build` (set by `from_env`).
    #[cfg_attr(not(feature = "from-env"), allow(dead_code))]
    default_chain: bool,
    endpoint: Option<String>,
    path_style: Option<bool>,
    bucket: Option<String>,
    prefix: String,
}

impl Default for S3Builder {
    fn default() -> Self {
        Self::new()
    }
}

impl S3Store {
    /// A builder; see [`S3Builder`].
    pub fn builder() -> S3Builder {
        S3Builder::new()
    }
}

impl S3Builder {
    /// An empty builder: set a client (or [`from_env`](Self::from_env)) and a bucket.
    pub fn new() -> Self {
        Self {
            client: None,
            default_chain: false,
            endpoint: None,
            path_style: None,
            bucket: None,
            prefix: String::new(),
        }
    }

    /// Uses this SDK client (its credentials, region, endpoint and HTTP client). Its retry and
    /// timeout settings are overridden per call: no SDK retries, and each call ends by the
    /// elector's request timeout ([`leader_core::Timing`]).
    pub fn with_client(mut self, client: Client) -> Self {
        self.client = Some(client);
        self
    }

    /// Sends every call to `endpoint_url` (a VPC or FIPS endpoint, an S3-compatible store)
    /// instead of the client's own, with path-style addressing (`endpoint/bucket/key`) unless
    /// [`with_path_style`](Self::with_path_style) says otherwise. The client's credentials,
    /// region and HTTP client stay. For an emulator with dummy credentials use
    /// [`with_emulator`](Self::with_emulator).
    pub fn with_endpoint(mut self, endpoint_url: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint_url.into());
        self
    }

    /// Path-style (`true`: `endpoint/bucket/key`) or virtual-hosted-style (`false`:
    /// `bucket.endpoint/key`) addressing. Default: virtual-hosted on AWS's own endpoints,
    /// path-style on an endpoint given with [`with_endpoint`](Self::with_endpoint) or
    /// [`with_emulator`](Self::with_emulator).
    pub fn with_path_style(mut self, path_style: bool) -> Self {
        self.path_style = Some(path_style);
        self
    }

    /// The bucket that holds the lease objects (required). This crate does not create buckets.
    pub fn with_bucket(mut self, bucket: impl Into<String>) -> Self {
        self.bucket = Some(bucket.into());
        self
    }

    /// A prefix for every object name, e.g. a folder `prod/leases/` (default: none). Checked
    /// by [`leader_core::backend::check_prefix`].
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Talks to a local emulator (LocalStack, moto) at `endpoint_url` with the dummy
    /// credentials `test`/`test`, region `us-east-1` and path-style addressing. Plain HTTP; an
    /// `https` URL needs the `from-env` feature (which brings the TLS client) and a certificate
    /// the machine trusts (`SSL_CERT_FILE`).
    pub fn with_emulator(self, endpoint_url: impl Into<String>) -> Self {
        let endpoint_url = endpoint_url.into();
        let config = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .endpoint_url(&endpoint_url)
            .region(Region::new("us-east-1"))
            .force_path_style(true)
            .credentials_provider(Credentials::new(
                "test",
                "test",
                None,
                None,
                "leader-s3-emulator",
            ))
            .http_client(emulator_http_client(&endpoint_url))
            .build();
        self.with_client(Client::from_conf(config))
    }

    /// A builder that takes its client from the default AWS configuration chain
    /// (`aws-config`, loaded in [`build`](Self::build)): environment, shared config and
    /// SSO-less profiles, web identity (EKS), ECS task roles and the EC2 instance profile
    /// (IMDSv2), with an HTTPS client on rustls (aws-lc-rs; see [`leader_core::tls`]).
    /// `AWS_ENDPOINT_URL` (or `AWS_ENDPOINT_URL_S3`) moves the endpoint (path-style then);
    /// the bucket and prefix are read from `LEADER_S3_BUCKET` and `LEADER_S3_PREFIX` if set.
    ///
    /// Needs the `from-env` feature (on by default).
    ///
    /// # Errors
    /// None today (the chain is resolved in `build`, and credentials on the first call); the
    /// `Result` keeps the builders of all backends alike.
    #[cfg(feature = "from-env")]
    pub fn from_env() -> Result<Self, Error> {
        let mut builder = Self::new();
        builder.default_chain = true;
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        if let Some(bucket) = var(BUCKET_VAR) {
            builder = builder.with_bucket(bucket);
        }
        if let Some(prefix) = var(PREFIX_VAR) {
            builder = builder.with_prefix(prefix);
        }
        Ok(builder)
    }

    /// The client: the one given, else the default chain's (with `from_env`).
    async fn client(&self) -> Option<Client> {
        if let Some(client) = &self.client {
            return Some(client.clone());
        }
        #[cfg(feature = "from-env")]
        if self.default_chain {
            let config = aws_config::defaults(BehaviorVersion::latest())
                .http_client(https_client())
                .load()
                .await;
            // An endpoint from the environment (AWS_ENDPOINT_URL) is an emulator or an
            // S3-compatible store: path-style, as with `with_endpoint`.
            let path_style = self.path_style.unwrap_or(config.endpoint_url().is_some());
            let s3 = aws_sdk_s3::config::Builder::from(&config)
                .force_path_style(path_style)
                .build();
            return Some(Client::from_conf(s3));
        }
        None
    }

    fn validate(&self, client: Option<Client>) -> Result<(Client, String), Error> {
        let invalid = |message: String| Error::InvalidConfig {
            message,
            source: None,
        };
        let Some(bucket) = self.bucket.clone() else {
            return Err(invalid(format!(
                "no S3 bucket is configured; call with_bucket or set {BUCKET_VAR}"
            )));
        };
        check_bucket_name(&bucket).map_err(|reason| {
            invalid(format!(
                "{bucket:?} is not a valid S3 bucket name: {reason}"
            ))
        })?;
        check_prefix(&self.prefix).map_err(|e| Error::InvalidConfig {
            message: e.to_string(),
            source: None,
        })?;
        let Some(mut client) = client else {
            return Err(invalid(
                "no S3 client is configured; call with_client, with_emulator or from_env"
                    .to_owned(),
            ));
        };
        if client.config().region().is_none() {
            // The SDK would fail every request with a connector error that reads as an outage.
            return Err(invalid(
                "no AWS region is configured for S3; set AWS_REGION (or the profile's region), \
                 or give the client one"
                    .to_owned(),
            ));
        }
        if self.endpoint.is_some() || self.path_style.is_some() {
            let mut config = client.config().to_builder();
            if let Some(endpoint) = &self.endpoint {
                if !(endpoint.starts_with("https://") || endpoint.starts_with("http://")) {
                    return Err(invalid(format!(
                        "the endpoint {endpoint:?} must be an http:// or https:// URL"
                    )));
                }
                config = config
                    .endpoint_url(endpoint)
                    .force_path_style(self.path_style.unwrap_or(true));
            } else if let Some(path_style) = self.path_style {
                config = config.force_path_style(path_style);
            }
            client = Client::from_conf(config.build());
        }
        Ok((client, bucket))
    }

    /// Validates the settings, reads one object that need not exist (so that a missing
    /// bucket, wrong region or missing permission shows now rather than at the first
    /// election), and returns the store.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a missing client or bucket, a bad name or prefix, or a
    /// bucket in another region; [`Error::NotFound`] if the bucket does not exist;
    /// [`Error::Unauthenticated`] or [`Error::PermissionDenied`] for credentials that S3
    /// refuses; any other [`Error`] of the read.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn build(self) -> Result<S3Store, Error> {
        let client = self.client().await;
        let (client, bucket) = self.validate(client)?;
        let store = S3Store::new(client, Context { bucket }, self.prefix, Backoff::DEFAULT);
        store.check_bucket().await?;
        Ok(store)
    }
}

/// S3's rules for (general purpose) bucket names: 3 to 63 of `a-z`, `0-9`, `.` and `-`,
/// starting and ending with a letter or digit, no `..`.
fn check_bucket_name(bucket: &str) -> Result<(), &'static str> {
    if !(3..=63).contains(&bucket.len()) {
        return Err("it must be 3 to 63 characters long");
    }
    if !bucket
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
    {
        return Err("use lowercase letters, digits, '.' and '-'");
    }
    let edge = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !edge(bucket.bytes().next()) || !edge(bucket.bytes().last()) {
        return Err("it must start and end with a letter or digit");
    }
    if bucket.contains("..") {
        return Err("it must not contain '..'");
    }
    Ok(())
}

/// The HTTP client of [`S3Builder::from_env`]: HTTPS (and plain HTTP) on rustls with the
/// suite's crypto provider, trusting the machine's roots (`SSL_CERT_FILE` replaces them).
#[cfg(feature = "from-env")]
fn https_client() -> aws_sdk_s3::config::SharedHttpClient {
    use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
    leader_core::tls::install_crypto_provider();
    aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::AwsLc))
        .build_https()
}

/// An emulator's HTTP client: the TLS one when this build has it, else plain HTTP only.
fn emulator_http_client(endpoint_url: &str) -> aws_sdk_s3::config::SharedHttpClient {
    #[cfg(feature = "from-env")]
    if endpoint_url.starts_with("https://") {
        return https_client();
    }
    let _ = endpoint_url;
    aws_smithy_http_client::Builder::new().build_http()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use leader_core::ErrorKind;

    fn check(b: &S3Builder) -> Result<(Client, String), Error> {
        b.validate(b.client.clone())
    }

    fn err(b: S3Builder) -> String {
        let e = check(&b).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig);
        e.to_string()
    }

    #[test]
    fn build_validates_before_calling() {
        let emu = || S3Builder::new().with_emulator("http://127.0.0.1:1");
        assert!(err(emu()).contains("with_bucket"));
        for bad in ["ab", "Leases", "a_b", "-ab", "ab-", "a..b", &"a".repeat(64)] {
            assert!(err(emu().with_bucket(bad)).contains("not a valid"), "{bad}");
        }
        assert!(err(emu().with_bucket("leases").with_prefix("/x")).contains("prefix"));
        assert!(err(S3Builder::new().with_bucket("leases")).contains("with_client"));
        assert!(
            err(emu().with_bucket("leases").with_endpoint("127.0.0.1:9000")).contains("http://")
        );
        let (moved, _) = check(
            &emu()
                .with_bucket("leases")
                .with_endpoint("https://s3.example.test"),
        )
        .unwrap();
        assert_eq!(
            moved.config().region().map(|r| r.as_ref()),
            Some("us-east-1"),
            "with_endpoint keeps the client's settings"
        );
        assert!(check(&emu().with_bucket("my.leases-1")).is_ok());
        let no_region = Client::from_conf(
            aws_sdk_s3::Config::builder()
                .behavior_version(BehaviorVersion::latest())
                .build(),
        );
        assert!(
            err(S3Builder::new()
                .with_client(no_region)
                .with_bucket("leases"))
            .contains("AWS_REGION")
        );
    }
}
