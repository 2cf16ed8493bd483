//! Configuration of an [`EtcdStore`]: endpoints, key prefix, user and TLS; `build()` connects
//! and proves that the cluster answers and the user may read under the prefix.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use leader_core::Error;
use leader_core::backend::Call;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::error::{Effect, to_error};
use crate::rpc::{Auth, Rpc};
use crate::store::EtcdStore;
use tracing::{debug, warn};

/// Environment variable with the endpoints, comma-separated, read by [`EtcdBuilder::from_env`].
pub const ENDPOINTS_VAR: &str = "LEADER_ETCD_ENDPOINTS";
/// Environment variable with the key prefix, read by [`EtcdBuilder::from_env`].
pub const PREFIX_VAR: &str = "LEADER_ETCD_PREFIX";
/// Environment variable with the user name, read by [`EtcdBuilder::from_env`].
pub const USER_VAR: &str = "LEADER_ETCD_USER";
/// Environment variable with the password, read by [`EtcdBuilder::from_env`].
pub const PASSWORD_VAR: &str = "LEADER_ETCD_PASSWORD";
/// Environment variable with a PEM file of CA certificates to trust besides the system's,
/// read by [`EtcdBuilder::from_env`].
pub const CA_FILE_VAR: &str = "LEADER_ETCD_CA_FILE";

/// The default key prefix: the lease of key `k` is the etcd key `leader-lease/k`.
pub const DEFAULT_PREFIX: &str = "leader-lease/";
/// How long `build()` waits for the cluster by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Builds an [`EtcdStore`].
///
/// ```no_run
/// # async fn f() -> Result<(), leader_core::Error> {
/// use leader_etcd::EtcdStore;
///
/// let store = EtcdStore::builder()
///     .with_endpoints(["https://etcd-0:2379", "https://etcd-1:2379", "https://etcd-2:2379"])
///     .with_user("scheduler", "secret")
///     .with_prefix("prod/leases/")
///     .build()
///     .await?;
/// # let _ = store; Ok(()) }
/// ```
#[derive(Clone)]
pub struct EtcdBuilder {
    endpoints: Vec<String>,
    prefix: String,
    user: Option<(String, String)>,
    ca_file: Option<PathBuf>,
    connect_timeout: Duration,
}

impl fmt::Debug for EtcdBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the password.
        f.debug_struct("EtcdBuilder")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("ca_file", &self.ca_file)
            .finish_non_exhaustive()
    }
}

impl Default for EtcdBuilder {
    fn default() -> Self {
        Self {
            endpoints: Vec::new(),
            prefix: DEFAULT_PREFIX.to_owned(),
            user: None,
            ca_file: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }
}

/// A non-empty environment variable.
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// `http://` in front of a bare `host:port`.
fn normalized(endpoint: &str) -> String {
    let endpoint = endpoint.trim().trim_end_matches('/');
    if endpoint.contains("://") {
        endpoint.to_owned()
    } else {
        format!("http://{endpoint}")
    }
}

fn invalid(message: String) -> Error {
    Error::InvalidConfig {
        message,
        source: None,
    }
}

impl EtcdBuilder {
    /// A builder with no endpoint yet and the default prefix.
    pub fn new() -> Self {
        Self::default()
    }

    /// A builder from the environment: [`ENDPOINTS_VAR`] (required), [`PREFIX_VAR`], and
    /// the credentials of [`from_env_credentials`](Self::from_env_credentials).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if the endpoints are not set, or a user without a password.
    pub fn from_env() -> Result<Self, Error> {
        let endpoints = var(ENDPOINTS_VAR).ok_or_else(|| {
            invalid(format!(
                "set {ENDPOINTS_VAR} to the etcd endpoints, e.g. http://127.0.0.1:2379"
            ))
        })?;
        let mut builder = Self::from_env_credentials()?.with_endpoints(endpoints.split(','));
        if let Some(prefix) = var(PREFIX_VAR) {
            builder = builder.with_prefix(prefix);
        }
        Ok(builder)
    }

    /// A builder with only the credentials from the environment: [`USER_VAR`] with
    /// [`PASSWORD_VAR`], and [`CA_FILE_VAR`]; the endpoints and prefix are the caller's.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a user without a password.
    pub fn from_env_credentials() -> Result<Self, Error> {
        let mut builder = Self::new();
        match (var(USER_VAR), std::env::var(PASSWORD_VAR).ok()) {
            (Some(user), Some(password)) => builder = builder.with_user(user, password),
            (Some(_), None) => {
                return Err(invalid(format!(
                    "{USER_VAR} is set but {PASSWORD_VAR} is not"
                )));
            }
            (None, _) => {}
        }
        if let Some(ca) = var(CA_FILE_VAR) {
            builder = builder.with_ca_file(ca);
        }
        Ok(builder)
    }

    /// Adds one endpoint: `http://host:port`, `https://host:port`, or `host:port` (plain
    /// HTTP/2). Give every member of the cluster: requests go to those that answer.
    #[must_use]
    pub fn with_endpoint(mut self, endpoint: impl AsRef<str>) -> Self {
        let endpoint = endpoint.as_ref();
        if !endpoint.trim().is_empty() {
            self.endpoints.push(normalized(endpoint));
        }
        self
    }

    /// Adds several endpoints (see [`with_endpoint`](Self::with_endpoint)).
    #[must_use]
    pub fn with_endpoints<I, S>(self, endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        endpoints.into_iter().fold(self, Self::with_endpoint)
    }

    /// Puts every key of the store under `prefix` (default [`DEFAULT_PREFIX`]).
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Authenticates as `user` (etcd's RBAC); the user needs a role with `readwrite` on the
    /// prefix's range.
    #[must_use]
    pub fn with_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((user.into(), password.into()));
        self
    }

    /// Trusts the CA certificates in this PEM file for `https://` endpoints, besides the
    /// system's roots.
    #[must_use]
    pub fn with_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// How long [`build`](Self::build) waits for the cluster (default 5 s).
    #[must_use]
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    fn tls(&self) -> Result<ClientTlsConfig, Error> {
        let mut tls = ClientTlsConfig::new().with_native_roots();
        if let Some(path) = &self.ca_file {
            let pem = std::fs::read(path).map_err(|e| Error::InvalidConfig {
                message: format!("cannot read the CA file {}: {e}", path.display()),
                source: Some(Box::new(e)),
            })?;
            tls = tls.ca_certificate(Certificate::from_pem(pem));
        }
        Ok(tls)
    }

    fn endpoint(&self, url: &str) -> Result<Endpoint, Error> {
        let mut endpoint = Endpoint::from_shared(url.to_owned())
            .map_err(|e| invalid(format!("{url:?} is not an etcd endpoint URL: {e}")))?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            // Notice a dead connection (a partition, a member that hangs) within seconds, also
            // on an idle watch.
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true);
        if url.starts_with("https://") {
            leader_core::tls::install_crypto_provider();
            endpoint = endpoint
                .tls_config(self.tls()?)
                .map_err(|e| invalid(format!("TLS settings for {url}: {e}")))?;
        } else if !url.starts_with("http://") {
            return Err(invalid(format!(
                "{url:?}: an etcd endpoint is http://host:port or https://host:port"
            )));
        }
        Ok(endpoint)
    }

    /// Connects, authenticates if a user is set, and reads under the prefix once.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for no or a malformed endpoint, a bad prefix or CA file;
    /// [`Error::Unauthenticated`] for a wrong user or password; [`Error::PermissionDenied`]
    /// if the user may not read under the prefix; [`Error::Unavailable`] if no endpoint
    /// answers within the connect timeout.
    pub async fn build(self) -> Result<EtcdStore, Error> {
        if self.endpoints.is_empty() {
            return Err(invalid(
                "no etcd endpoint given; add one (http://host:2379)".to_owned(),
            ));
        }
        // etcd keys are bytes; keep prefixes to what reads well in `etcdctl get --prefix`.
        if self.prefix.len() > 512 || !self.prefix.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid(format!(
                "the key prefix {:?} must be at most 512 bytes of printable ASCII without spaces",
                self.prefix
            )));
        }
        let endpoints = self
            .endpoints
            .iter()
            .map(|url| self.endpoint(url))
            .collect::<Result<Vec<_>, _>>()?;
        let channel = Channel::balance_list(endpoints.clone().into_iter());
        let auth = self.user.clone().map(|(u, p)| Auth::new(u, p));
        let rpc = Rpc::new(channel, auth);
        let probe = &rpc;
        let prefix = self.prefix.as_bytes();
        let joined = self.endpoints.join(", ");
        let probed = Call::read("reading under the key prefix")
            .with_budget(self.connect_timeout)
            .run(|left| async move {
                probe
                    .probe(prefix, left)
                    .await
                    .map_err(|s| to_error(s, "reading under the key prefix", Effect::None))
            })
            .await;
        match probed {
            Ok(()) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    leader_core::ErrorKind::Unavailable | leader_core::ErrorKind::Timeout
                ) =>
            {
                // The balanced channel only says that no endpoint is ready: ask one directly
                // why, so that a certificate nobody trusts is told apart from a cluster that
                // is down.
                let why = match endpoints.first() {
                    Some(first) => connect_error(first, self.connect_timeout).await,
                    None => None,
                };
                if let Some(why) = why.as_deref().filter(|w| w.contains("certificate")) {
                    return Err(invalid(format!(
                        "the TLS certificate of {joined} is not trusted ({why}); trust its CA \
                         with with_ca_file or {CA_FILE_VAR} (a PEM file), or SSL_CERT_FILE"
                    )));
                }
                return Err(Error::Unavailable {
                    message: format!(
                        "no etcd endpoint answered within {:?} ({joined}{}); is the cluster up \
                         and the address right?",
                        self.connect_timeout,
                        why.map(|w| format!(": {w}")).unwrap_or_default()
                    ),
                    source: Some(Box::new(e)),
                });
            }
            Err(e) => return Err(e),
        }
        match tokio::time::timeout(self.connect_timeout, rpc.version(self.connect_timeout)).await {
            Ok(Ok(version)) if !revokes_safely(&version) => warn!(
                version,
                "this etcd release can revoke a lease early after a leader change while the old \
                 leader is stuck (etcd-io/etcd#15247, fixed in 3.4.31, 3.5.13 and 3.6): a \
                 holder could then act past the moment a follower takes over; upgrade the \
                 cluster (a single-member cluster is not affected)"
            ),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => debug!(error = %e, "could not read etcd's version"),
            Err(_) => debug!("reading etcd's version timed out"),
        }
        Ok(EtcdStore::new(rpc, self.prefix, self.endpoints))
    }
}

/// Why a direct connection to `endpoint` fails within `timeout` (the error and its causes),
/// or `None` if it connects.
async fn connect_error(endpoint: &Endpoint, timeout: Duration) -> Option<String> {
    let error = match tokio::time::timeout(timeout, endpoint.connect()).await {
        Ok(Ok(_)) => return None,
        Ok(Err(e)) => e,
        Err(_) => return Some(format!("no connection within {timeout:?}")),
    };
    let mut text = error.to_string();
    let mut cause = std::error::Error::source(&error);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    Some(text)
}

/// Whether an etcd server version has the fix for etcd-io/etcd#15247: a stuck old leader no
/// longer revokes leases that the new leader kept alive.
fn revokes_safely(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| {
        p.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse::<u32>()
            .unwrap_or(0)
    });
    let (major, minor, patch) = (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    );
    match (major, minor) {
        (3, 4) => patch >= 31,
        (3, 5) => patch >= 13,
        (3, m) => m >= 6,
        (m, _) => m > 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_get_a_scheme_and_lose_a_trailing_slash() {
        let b = EtcdBuilder::new().with_endpoints(["127.0.0.1:2379", "https://e:2379/", " "]);
        assert_eq!(b.endpoints, ["http://127.0.0.1:2379", "https://e:2379"]);
    }

    #[test]
    fn releases_with_the_early_revoke_are_told_apart() {
        for old in ["3.4.23", "3.4.30", "3.5.0", "3.5.12", "3.3.27", "2.3.8"] {
            assert!(!revokes_safely(old), "{old}");
        }
        for fixed in ["3.4.31", "3.5.13", "3.5.17", "3.6.0", "3.6.0-rc.1", "4.0.0"] {
            assert!(revokes_safely(fixed), "{fixed}");
        }
    }

    #[test]
    fn the_password_is_never_printed() {
        let b = EtcdBuilder::new().with_user("u", "hunter2");
        assert!(!format!("{b:?}").contains("hunter2"));
    }

    #[tokio::test]
    async fn bad_settings_are_refused_before_connecting() {
        let none = EtcdBuilder::new().build().await.unwrap_err();
        assert!(none.to_string().contains("no etcd endpoint"), "{none}");
        let scheme = EtcdBuilder::new()
            .with_endpoint("ftp://x:1")
            .build()
            .await
            .unwrap_err();
        assert!(scheme.to_string().contains("http://host:port"), "{scheme}");
        let prefix = EtcdBuilder::new()
            .with_endpoint("127.0.0.1:1")
            .with_prefix("a b")
            .build()
            .await
            .unwrap_err();
        assert_eq!(
            prefix.kind(),
            leader_core::ErrorKind::InvalidConfig,
            "{prefix}"
        );
    }

    #[tokio::test]
    async fn an_unreachable_cluster_fails_fast_and_says_where() {
        let err = EtcdBuilder::new()
            .with_endpoint("127.0.0.1:1")
            .with_connect_timeout(Duration::from_millis(500))
            .build()
            .await
            .unwrap_err();
        assert_eq!(err.kind(), leader_core::ErrorKind::Unavailable, "{err}");
        assert!(err.to_string().contains("127.0.0.1:1"), "{err}");
    }
}
