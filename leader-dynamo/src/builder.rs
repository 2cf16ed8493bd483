//! Configuration of a [`DynamoStore`]: the client, the table, its partition key.

use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use leader_core::Error;

use leader_core::backend::Backoff;

use crate::client::DynamoStore;
use crate::error::Context;

/// Builds a [`DynamoStore`]: `new()` or [`from_env`](DynamoBuilder::from_env), typed `with_*`
/// setters, then [`build`](DynamoBuilder::build), which validates the settings and checks the
/// table.
#[derive(Clone, Debug)]
pub struct DynamoBuilder {
    client: Option<Client>,
    /// Load the default AWS configuration chain in `build` (set by `from_env`).
    #[cfg_attr(not(feature = "from-env"), allow(dead_code))]
    default_chain: bool,
    endpoint: Option<String>,
    table: Option<String>,
    partition_key: String,
    create_table_if_missing: bool,
    table_wait: Duration,
}

impl Default for DynamoBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl DynamoBuilder {
    /// The partition key attribute used unless [`with_partition_key`](Self::with_partition_key)
    /// says otherwise (a string attribute).
    pub const DEFAULT_PARTITION_KEY: &'static str = "pk";
    /// The environment variable [`from_env`](Self::from_env) reads the table name from.
    pub const TABLE_ENV: &'static str = "LEADER_DYNAMODB_TABLE";

    /// An empty builder: set a client and a table.
    pub fn new() -> Self {
        Self {
            client: None,
            default_chain: false,
            endpoint: None,
            table: None,
            partition_key: Self::DEFAULT_PARTITION_KEY.to_owned(),
            create_table_if_missing: false,
            table_wait: Duration::from_secs(60),
        }
    }

    /// Uses this SDK client (its credentials, region, endpoint and HTTP client). Its retry and
    /// timeout settings are overridden per call: no SDK retries, and each call ends by the
    /// elector's request timeout ([`leader_core::Timing`]).
    pub fn with_client(mut self, client: Client) -> Self {
        self.client = Some(client);
        self
    }

    /// Sends every call to `endpoint_url` (a VPC endpoint, a FIPS or local endpoint) instead of
    /// the client's own: the client's credentials, region and HTTP client stay, and TLS is used
    /// if the URL says `https`. For an emulator with dummy credentials use
    /// [`with_emulator`](Self::with_emulator).
    pub fn with_endpoint(mut self, endpoint_url: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint_url.into());
        self
    }

    /// The table that holds the lease items (required).
    pub fn with_table(mut self, table: impl Into<String>) -> Self {
        self.table = Some(table.into());
        self
    }

    /// The name of the table's partition key attribute (a string; default `pk`).
    pub fn with_partition_key(mut self, name: impl Into<String>) -> Self {
        self.partition_key = name.into();
        self
    }

    /// Creates the table (on-demand billing, string partition key) in
    /// [`build`](Self::build) if it does not exist. Off by default: a missing table is then
    /// an [`Error::NotFound`].
    pub fn with_create_table_if_missing(mut self, create: bool) -> Self {
        self.create_table_if_missing = create;
        self
    }

    /// How long [`build`](Self::build) waits for a table it created to become active
    /// (default 60 s).
    pub fn with_table_wait(mut self, wait: Duration) -> Self {
        self.table_wait = wait;
        self
    }

    /// Talks to a local emulator (moto, LocalStack, DynamoDB Local) at `endpoint_url` with the
    /// dummy credentials `test`/`test` and region `us-east-1`. Plain HTTP; an `https` URL needs
    /// the `from-env` feature (which brings the TLS client) and a certificate the machine trusts
    /// (`SSL_CERT_FILE`).
    pub fn with_emulator(self, endpoint_url: impl Into<String>) -> Self {
        let endpoint_url = endpoint_url.into();
        let config = aws_sdk_dynamodb::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .endpoint_url(&endpoint_url)
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new(
                "test",
                "test",
                None,
                None,
                "leader-dynamo-emulator",
            ))
            .http_client(emulator_http_client(&endpoint_url))
            .build();
        self.with_client(Client::from_conf(config))
    }

    /// A builder that takes its client from the default AWS configuration chain
    /// (`aws-config`, loaded in [`build`](Self::build)): environment, shared config and
    /// SSO-less profiles, web identity (EKS), ECS task roles and the EC2 instance profile
    /// (IMDSv2), with an HTTPS client on rustls (aws-lc-rs; see [`leader_core::tls`]).
    /// `AWS_ENDPOINT_URL` (or `AWS_ENDPOINT_URL_DYNAMODB`) moves the endpoint; the table name is
    /// read from `LEADER_DYNAMODB_TABLE` if set.
    ///
    /// Needs the `from-env` feature (on by default).
    ///
    /// # Errors
    /// None today (the chain is resolved in `build`, and credentials on the first call, whose
    /// failure is then an [`Error::Unauthenticated`] or [`Error::Unavailable`]); the `Result`
    /// keeps the builders of all backends alike.
    #[cfg(feature = "from-env")]
    pub fn from_env() -> Result<Self, Error> {
        let mut builder = Self::new();
        builder.default_chain = true;
        if let Some(table) = std::env::var(Self::TABLE_ENV)
            .ok()
            .filter(|t| !t.trim().is_empty())
        {
            builder = builder.with_table(table);
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
            return Some(Client::new(&config));
        }
        None
    }

    fn validate(&self, client: Option<Client>) -> Result<(Client, String), Error> {
        let invalid = |message: String| Error::InvalidConfig {
            message,
            source: None,
        };
        let Some(table) = self.table.clone() else {
            return Err(invalid(format!(
                "no DynamoDB table is configured; call with_table or set {}",
                Self::TABLE_ENV
            )));
        };
        if !(3..=255).contains(&table.len())
            || !table
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        {
            return Err(invalid(format!(
                "{table:?} is not a valid DynamoDB table name (3 to 255 of a-z, A-Z, 0-9, '_', \
                 '-', '.')"
            )));
        }
        if self.partition_key.is_empty() || self.partition_key.len() > 255 {
            return Err(invalid(format!(
                "partition key name {:?} must be 1 to 255 bytes",
                self.partition_key
            )));
        }
        let Some(mut client) = client else {
            return Err(invalid(
                "no DynamoDB client is configured; call with_client, with_emulator or from_env"
                    .to_owned(),
            ));
        };
        if let Some(endpoint) = &self.endpoint {
            if !(endpoint.starts_with("https://") || endpoint.starts_with("http://")) {
                return Err(invalid(format!(
                    "the endpoint {endpoint:?} must be an http:// or https:// URL"
                )));
            }
            let config = client.config().to_builder().endpoint_url(endpoint).build();
            client = Client::from_conf(config);
        }
        Ok((client, table))
    }

    /// Validates the settings, checks that the table exists with a single string partition key
    /// of the configured name (creating it if opted in), and returns the store.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a missing client or table name, a bad name, or a
    /// table with another key schema; [`Error::NotFound`] if the table does not exist (and
    /// creating it was not asked for); any other [`Error`] of the `DescribeTable` call.
    ///
    /// # Cancel safety
    /// Cancel-safe, except that a `CreateTable` in flight may still complete.
    pub async fn build(self) -> Result<DynamoStore, Error> {
        let client = self.client().await;
        let (client, table) = self.validate(client)?;
        let store = DynamoStore {
            client,
            partition_key: self.partition_key,
            ctx: Context { table },
            backoff: Backoff::DEFAULT,
        };
        store
            .ensure_table(self.create_table_if_missing, self.table_wait)
            .await?;
        Ok(store)
    }
}

/// The HTTP client of [`DynamoBuilder::from_env`]: HTTPS (and plain HTTP) on rustls with the
/// suite's crypto provider, trusting the machine's roots (`SSL_CERT_FILE` replaces them).
#[cfg(feature = "from-env")]
fn https_client() -> aws_sdk_dynamodb::config::SharedHttpClient {
    use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
    leader_core::tls::install_crypto_provider();
    aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::AwsLc))
        .build_https()
}

/// An emulator's HTTP client: the TLS one when this build has it, else plain HTTP only.
fn emulator_http_client(endpoint_url: &str) -> aws_sdk_dynamodb::config::SharedHttpClient {
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

    fn check(b: &DynamoBuilder) -> Result<(Client, String), Error> {
        b.validate(b.client.clone())
    }

    fn err(b: DynamoBuilder) -> String {
        let e = check(&b).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig);
        e.to_string()
    }

    #[test]
    fn build_validates_before_calling() {
        let emu = || DynamoBuilder::new().with_emulator("http://127.0.0.1:1");
        assert!(err(emu()).contains("with_table"));
        assert!(err(emu().with_table("a b")).contains("not a valid"));
        assert!(err(emu().with_table("ab")).contains("not a valid"));
        assert!(err(emu().with_table("leases").with_partition_key("")).contains("partition key"));
        assert!(err(DynamoBuilder::new().with_table("leases")).contains("with_client"));
        assert!(
            err(emu().with_table("leases").with_endpoint("127.0.0.1:8000")).contains("http://")
        );
        let moved = check(
            &emu()
                .with_table("leases")
                .with_endpoint("https://dynamodb.example.test"),
        )
        .unwrap()
        .0;
        assert_eq!(
            moved.config().region().map(|r| r.as_ref()),
            Some("us-east-1"),
            "with_endpoint keeps the client's settings"
        );
        assert!(check(&emu().with_table("leases")).is_ok());
    }
}
