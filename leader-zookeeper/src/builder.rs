//! Configuration of a [`ZooKeeperStore`]: the ensemble, the parent node of the leases, and
//! whether to create that node; `build()` validates it, connects, and checks the node.

use std::time::Duration;

use leader_core::Error;
use leader_core::backend::Call;
use tracing::info;
use zookeeper_client::{Acls, CreateMode, Error as ZkError};

use crate::client::ZooKeeperStore;
use crate::error::{Request, map_error, parent_missing};
use crate::session::SharedSession;

/// Environment variable with the ensemble's hosts (`zk1:2181,zk2:2181`), read by
/// [`ZooKeeperBuilder::from_env`].
pub const HOSTS_VAR: &str = "LEADER_ZOOKEEPER_HOSTS";
/// Environment variable with the parent node of the lease nodes, read by
/// [`ZooKeeperBuilder::from_env`].
pub const PATH_VAR: &str = "LEADER_ZOOKEEPER_PATH";
/// The default parent node of the lease nodes.
pub const DEFAULT_PATH: &str = "/leader-lease";
/// How long [`ZooKeeperBuilder::build`] waits for a server of the ensemble by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Builds a [`ZooKeeperStore`].
///
/// ```no_run
/// # async fn f() -> Result<(), leader_core::Error> {
/// use leader_zookeeper::ZooKeeperBuilder;
///
/// let store = ZooKeeperBuilder::new()
///     .with_hosts("zk1:2181,zk2:2181,zk3:2181")
///     .with_path("/prod/leases")
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct ZooKeeperBuilder {
    hosts: Option<String>,
    path: String,
    create_path: bool,
    connect_timeout: Duration,
}

impl ZooKeeperStore {
    /// A builder; see [`ZooKeeperBuilder`].
    pub fn builder() -> ZooKeeperBuilder {
        ZooKeeperBuilder::new()
    }
}

impl Default for ZooKeeperBuilder {
    fn default() -> Self {
        Self {
            hosts: None,
            path: DEFAULT_PATH.to_owned(),
            create_path: false,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }
}

impl ZooKeeperBuilder {
    /// A builder with the default parent node ([`DEFAULT_PATH`]); set the ensemble with
    /// [`with_hosts`](Self::with_hosts).
    pub fn new() -> Self {
        Self::default()
    }

    /// A builder from the environment: the hosts from `LEADER_ZOOKEEPER_HOSTS`, the parent
    /// node from `LEADER_ZOOKEEPER_PATH` (if set). `build()` reports missing hosts.
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
            hosts: var(HOSTS_VAR),
            ..Self::default()
        };
        if let Some(path) = var(PATH_VAR) {
            builder.path = path;
        }
        builder
    }

    /// Sets the ensemble: one or more `host:port` separated by commas, as ZooKeeper's own
    /// clients take it (`zk1:2181,zk2:2181,zk3:2181`; a chroot suffix such as
    /// `zk1:2181,zk2:2181/app` is allowed). A session moves to another server of the list
    /// when its server fails.
    pub fn with_hosts(mut self, hosts: impl Into<String>) -> Self {
        self.hosts = Some(hosts.into());
        self
    }

    /// Sets the parent node of the lease nodes (default [`DEFAULT_PATH`]). The lease of key
    /// `k` is the node `{path}/k`, a protected object `name` is `{path}/.name.fenced`.
    pub fn with_path(mut self, path: impl Into<String>) -> Self {
        self.path = path.into();
        self
    }

    /// Whether `build()` creates the parent node (and its missing ancestors) as persistent
    /// nodes open to everyone (`world:anyone` ALL). Off by default: a missing parent is then
    /// [`Error::NotFound`] naming it.
    pub fn with_create_path(mut self, create: bool) -> Self {
        self.create_path = create;
        self
    }

    /// How long `build()` waits for a server of the ensemble to answer (default
    /// [`DEFAULT_CONNECT_TIMEOUT`]); the check of the parent node gets as long again.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Validates the configuration, opens the store's shared session, checks (or creates) the
    /// parent node, and builds the store.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for missing hosts, an unparsable host list or an invalid
    /// path; [`Error::Unavailable`] if no server of the ensemble answers within the connect
    /// timeout; [`Error::NotFound`] naming a missing parent node (unless
    /// [`with_create_path`](Self::with_create_path)); [`Error::PermissionDenied`] if its
    /// ACL does not allow reading it (or creating it).
    ///
    /// # Cancel safety
    /// Cancel-safe: at most the parent node is created, which a later call sees.
    pub async fn build(self) -> Result<ZooKeeperStore, Error> {
        let hosts = self
            .hosts
            .clone()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .ok_or_else(|| {
                invalid(format!(
                    "no ZooKeeper hosts configured; set {HOSTS_VAR} (e.g. zk1:2181,zk2:2181) \
                     or call with_hosts"
                ))
            })?;
        check_hosts(&hosts).map_err(invalid)?;
        let path = normalize_path(&self.path).map_err(invalid)?;
        if self.connect_timeout.is_zero() {
            return Err(invalid(
                "the connect timeout must be greater than zero".to_owned(),
            ));
        }
        let shared = SharedSession::connect(hosts.clone(), self.connect_timeout).await?;
        check_parent(&shared, &path, self.create_path, self.connect_timeout).await?;
        Ok(ZooKeeperStore::new(path, shared))
    }
}

fn invalid(message: String) -> Error {
    Error::InvalidConfig {
        message,
        source: None,
    }
}

/// Checks that `path` exists and can hold children, creating it if `create` is set.
async fn check_parent(
    shared: &SharedSession,
    path: &str,
    create: bool,
    budget: Duration,
) -> Result<(), Error> {
    let read = Request::read("checking the parent node", path);
    let stat = Call::read("checking the parent node")
        .with_budget(budget)
        .run(|_| async {
            let client = shared.client().await?;
            client
                .check_stat(path)
                .await
                .map_err(|e| map_error(e, read))
        })
        .await?;
    match stat {
        Some(stat) if stat.ephemeral_owner != 0 => Err(invalid(format!(
            "the ZooKeeper node {path} is ephemeral and cannot have children; use a \
             persistent node as the parent of the lease nodes"
        ))),
        Some(_) => Ok(()),
        None if !create => Err(parent_missing(path, None)),
        None => {
            let write = Request::write("creating the parent node", path);
            Call::read("creating the parent node")
                .with_budget(budget)
                .run(|_| async {
                    let client = shared.client().await?;
                    let options = CreateMode::Persistent.with_acls(Acls::anyone_all());
                    match client.mkdir(path, &options).await {
                        Ok(()) => Ok(()),
                        Err(ZkError::NoAuth) => Err(Error::PermissionDenied {
                            message: format!(
                                "creating {path}: an ancestor's ACL does not allow CREATE to \
                                 an unauthenticated client; create the node yourself"
                            ),
                            source: Some(Box::new(ZkError::NoAuth)),
                        }),
                        // `mkdir` retries nothing: a lost answer may have created part of the
                        // path, which the next attempt finds.
                        Err(e) => Err(map_error(e, write)),
                    }
                })
                .await?;
            info!(path, "created the parent node of the lease nodes");
            Ok(())
        }
    }
}

/// Checks the shape of a host list: `host[:port]` entries separated by commas (an optional
/// `tcp://` before each, an optional chroot `/path` after the last), without spaces, ports
/// numbers. Whether the hosts exist is for the connection to tell.
pub(crate) fn check_hosts(hosts: &str) -> Result<(), String> {
    let bad = |why: String| {
        Err(format!(
            "invalid ZooKeeper host list {hosts:?}: {why} (expected host:port[,host:port...], \
             e.g. zk1:2181,zk2:2181)"
        ))
    };
    for entry in hosts.split(',') {
        let entry = entry.strip_prefix("tcp://").unwrap_or(entry);
        let address = entry.split('/').next().unwrap_or(entry);
        if address.is_empty() {
            return bad("an entry is empty".to_owned());
        }
        if address.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return bad(format!("{address:?} contains spaces"));
        }
        let port = match address.rsplit_once(':') {
            // An IPv6 address without a port: `[::1]`.
            Some((host, _)) if host.starts_with('[') && !host.ends_with(']') => None,
            Some((host, port)) if !host.is_empty() => Some(port),
            Some(_) => return bad(format!("{address:?} has no host")),
            None => None,
        };
        if port.is_some_and(|p| p.parse::<u16>().is_err()) {
            return bad(format!("the port of {address:?} is not a number"));
        }
    }
    Ok(())
}

/// Checks a parent path and removes a trailing `/`: absolute, segments of printable
/// characters other than `.` and `..`, `/` for the root.
pub(crate) fn normalize_path(path: &str) -> Result<String, String> {
    let bad = |why: &str| Err(format!("invalid ZooKeeper path {path:?}: {why}"));
    if !path.starts_with('/') {
        return bad("it must start with '/' (e.g. /leader-lease)");
    }
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() {
        return Ok("/".to_owned());
    }
    for segment in trimmed[1..].split('/') {
        if segment.is_empty() {
            return bad("it has an empty segment ('//')");
        }
        if segment == "." || segment == ".." {
            return bad("'.' and '..' are not allowed as segments");
        }
        if segment.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return bad("it contains spaces or control characters");
        }
    }
    Ok(trimmed.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use leader_core::ErrorKind;

    #[test]
    fn from_env_reads_hosts_and_path() {
        let vars = |name: &str| match name {
            HOSTS_VAR => Some(" zk1:2181,zk2:2181 ".to_owned()),
            PATH_VAR => Some("/prod/leases".to_owned()),
            _ => None,
        };
        let b = ZooKeeperBuilder::from_vars(vars);
        assert_eq!(b.hosts.as_deref(), Some("zk1:2181,zk2:2181"));
        assert_eq!(b.path, "/prod/leases");
        let plain = ZooKeeperBuilder::from_vars(|_| None);
        assert_eq!(plain.hosts, None);
        assert_eq!(plain.path, DEFAULT_PATH);
        assert!(!plain.create_path);
    }

    #[test]
    fn host_lists_are_checked() {
        for ok in [
            "zk1:2181",
            "zk1:2181,zk2:2181,zk3",
            "10.0.0.1:2181/app",
            "tcp://zk1:2181,tcp://zk2:2181",
            "[::1]:2181",
            "[::1]",
        ] {
            assert!(check_hosts(ok).is_ok(), "{ok}");
        }
        for bad in [
            "not a host list",
            "zk1:2181,",
            ",zk1",
            "zk1:port",
            ":2181",
            "zk1:99999",
        ] {
            let err = check_hosts(bad).unwrap_err();
            assert!(err.contains("invalid ZooKeeper host list"), "{bad}: {err}");
        }
    }

    #[test]
    fn paths_are_checked_and_normalized() {
        assert_eq!(
            normalize_path("/leader-lease/").as_deref(),
            Ok("/leader-lease")
        );
        assert_eq!(normalize_path("/a/b").as_deref(), Ok("/a/b"));
        assert_eq!(normalize_path("/").as_deref(), Ok("/"));
        for bad in ["", "leases", "/a//b", "/a/./b", "/a/../b", "/a b"] {
            let err = normalize_path(bad).unwrap_err();
            assert!(err.contains("invalid ZooKeeper path"), "{bad}: {err}");
        }
    }

    #[tokio::test]
    async fn build_rejects_bad_config_before_connecting() {
        let no_hosts = ZooKeeperBuilder::new().build().await.unwrap_err();
        assert_eq!(no_hosts.kind(), ErrorKind::InvalidConfig);
        assert!(no_hosts.to_string().contains(HOSTS_VAR), "{no_hosts}");
        let bad_path = ZooKeeperBuilder::new()
            .with_hosts("127.0.0.1:1")
            .with_path("leases")
            .build()
            .await
            .unwrap_err();
        assert_eq!(bad_path.kind(), ErrorKind::InvalidConfig);
        assert!(bad_path.to_string().contains("leases"), "{bad_path}");
    }
}
