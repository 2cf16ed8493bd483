//! Leader election with fencing tokens on the storage you already have.
//!
//! The one dependency a program needs: name the store with a URL, get a store that the
//! [`Elector`] (or the [`ShardedElector`]) campaigns on and that takes fenced writes. The
//! whole API of `leader-core` is re-exported here, and each store's crate as a module
//! ([`azure`], [`dynamo`], [`s3`], [`gcs`], [`etcd`], [`zookeeper`], [`raft`]) for its builder and settings. The
//! protocol, its timing rules and defaults: the repository's `docs/protocol.md`.
//!
//! | URL | store | the lease record | beside it |
//! |---|---|---|---|
//! | `file:///var/lib/leases/KEY` | [`FileStore`], for processes on one host | file `/var/lib/leases/KEY.lease` | token mark `KEY.lease.high-water`, lock files `*.lock`; protected objects `NAME.fenced` |
//! | `azblob://CONTAINER/[FOLDER/]KEY` | Azure Blob leases (feature `azure`) | blob `[FOLDER/]KEY` | token mark `[FOLDER/].KEY.token`; protected objects `[FOLDER/].NAME.fenced` |
//! | `s3://BUCKET/[FOLDER/]KEY` | Amazon S3 conditional writes (feature `s3`) | object `[FOLDER/]KEY` | token mark `[FOLDER/].KEY.token`; protected objects `[FOLDER/].NAME.fenced` |
//! | `gs://BUCKET/[FOLDER/]KEY` | GCS generation preconditions (feature `gcs`) | object `[FOLDER/]KEY` | protected objects `[FOLDER/].NAME.fenced` |
//! | `dynamodb://TABLE/KEY` | DynamoDB conditional writes (feature `dynamo`) | item `lease#KEY` | token mark `mark#KEY`; protected objects `fenced#NAME` |
//! | `etcd://HOST:PORT[,HOST:PORT...]/[FOLDER/]KEY` (`etcds://`: TLS) | etcd leases and transactions (feature `etcd`) | key `[FOLDER/]KEY`, attached to the term's etcd lease | protected objects `[FOLDER/].NAME.fenced` |
//! | `zk://HOST:PORT[,HOST:PORT...]/[PATH/]KEY` | ZooKeeper ephemeral nodes (feature `zookeeper`) | node `/[PATH/]KEY`, owned by the term's session | protected objects `/[PATH/].NAME.fenced` |
//! | `raft://HOST:PORT,HOST:PORT,HOST:PORT/KEY` (`rafts://`: mutual TLS) | a Raft group of the instances themselves (feature `raft`; [`OpenOptions::with_raft_member`]) | record `KEY` in the group's replicated state | protected objects `NAME` beside it |
//!
//! In a blob or object store, the URL's path is the lease blob's or object's name as the
//! console shows it; the token high-water mark and protected objects sit beside it under
//! names that start with `.` (no lease key or object name does, so they never meet). A
//! DynamoDB table keeps leases, marks and protected objects as items of one partition key,
//! told apart by their `lease#`, `mark#` and `fenced#` prefixes.
//!
//! Credentials come from each cloud's usual chain, over HTTPS; [`OpenOptions`] moves the
//! endpoint or talks to a local emulator. The suite's TLS crypto provider is installed on the
//! way ([`tls`]).
//!
//! The stores of the suite: a local folder and memory (`leader-core`), Azure Blob
//! (`leader-azure`), DynamoDB (`leader-dynamo`), Amazon S3 (`leader-s3`), Google Cloud Storage
//! (`leader-gcs`), etcd (`leader-etcd`), ZooKeeper (`leader-zookeeper`)
//! and a Raft group of the instances themselves (`leader-raft`); the `leader`
//! command (crate `leader-cli`) runs a program under any of them.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use leader::{Elector, FencedStore, ObjectName, OpenOptions};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let url = format!("file://{}/scheduler", dir.path().display());
//! // e.g. "gs://my-leases/scheduler" or "dynamodb://leases/scheduler" in the cloud
//! let (store, key) = leader::from_url(&url, &OpenOptions::new()).await?;
//!
//! let handle = Elector::builder(store.clone(), key)
//!     .ttl(Duration::from_secs(15))
//!     .build()?
//!     .spawn();
//! let term = handle.wait_for_term().await?;
//! // Only this term's leader can write; a deposed one gets `Error::Fenced`.
//! store
//!     .fenced_write(term.fence(), &ObjectName::new("daily-report")?, b"done")
//!     .await?;
//! drop(term);
//! handle.shutdown().await; // releases the lease: a follower takes over at once
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use backend::FencedCas;

mod quorum_open;
pub use quorum_open::quorum_from_urls;

/// The backend crates, for their builders and store-specific settings.
#[cfg(feature = "azure")]
pub use leader_azure as azure;
/// The whole user API of `leader-core`: the elector and the sharded elector, terms, fencing,
/// the model, the file and memory stores, timing, errors, metrics, and (in [`backend`]) the
/// contract a store implements.
pub use leader_core::*;
/// The backend crates, for their builders and store-specific settings.
#[cfg(feature = "dynamo")]
pub use leader_dynamo as dynamo;
/// The backend crates, for their builders and store-specific settings.
#[cfg(feature = "etcd")]
pub use leader_etcd as etcd;
/// The backend crates, for their builders and store-specific settings.
#[cfg(feature = "gcs")]
pub use leader_gcs as gcs;
/// Scale-in and preemption notices, and scale-in protection while leading.
#[cfg(feature = "notices")]
pub use leader_notice as notice;
/// The backend crates, for their builders and store-specific settings.
#[cfg(feature = "raft")]
pub use leader_raft as raft;
/// The backend crates, for their builders and store-specific settings.
#[cfg(feature = "s3")]
pub use leader_s3 as s3;
/// The backend crates, for their builders and store-specific settings.
#[cfg(feature = "zookeeper")]
pub use leader_zookeeper as zookeeper;

/// A store that leases and takes fenced writes: what [`open`] and [`from_url`] return. Pass
/// it as it is to [`Elector::builder`] (it is a [`LeaseBackend`]) and to
/// [`ShardedElector::builder`] (it is a [`ShardStore`]):
///
/// ```
/// use leader::OpenOptions;
/// use leader::ShardedElector;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let url = format!("file://{}/queues", dir.path().display());
/// let (store, key) = leader::from_url(&url, &OpenOptions::new()).await?;
/// let handle = ShardedElector::builder(store, key, 4).build()?.spawn();
/// handle.shutdown().await;
/// # Ok(())
/// # }
/// ```
pub trait Store: LeaseBackend + FencedStore + ShardStore {}
impl<T: LeaseBackend + FencedCas + 'static> Store for T {}

/// A parsed store URL: which backend, where, and the lease key.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreUrl {
    /// `file:///DIR/KEY`: the record is `DIR/KEY.lease`.
    File {
        /// The folder.
        dir: PathBuf,
        /// The lease key.
        key: LeaseKey,
    },
    /// `azblob://CONTAINER/[FOLDER/]KEY`: the lease is the blob `[FOLDER/]KEY`.
    Azure {
        /// The blob container.
        container: String,
        /// The folder of the blobs: empty, or segments each ending with `/`.
        folder: String,
        /// The lease key.
        key: LeaseKey,
    },
    /// `dynamodb://TABLE/KEY`.
    Dynamo {
        /// The table.
        table: String,
        /// The lease key.
        key: LeaseKey,
    },
    /// `s3://BUCKET/[FOLDER/]KEY`: the lease is the object `[FOLDER/]KEY`.
    S3 {
        /// The bucket.
        bucket: String,
        /// The folder of the objects: empty, or segments each ending with `/`.
        folder: String,
        /// The lease key.
        key: LeaseKey,
    },
    /// `gs://BUCKET/[FOLDER/]KEY`: the lease is the object `[FOLDER/]KEY`.
    Gcs {
        /// The bucket.
        bucket: String,
        /// The folder of the objects: empty, or segments each ending with `/`.
        folder: String,
        /// The lease key.
        key: LeaseKey,
    },
    /// `etcd://HOST:PORT[,HOST:PORT...]/[FOLDER/]KEY` (or `etcds://` for TLS): the lease is
    /// the etcd key `[FOLDER/]KEY`.
    Etcd {
        /// The cluster's members, `host:port` each.
        hosts: Vec<String>,
        /// Whether to talk TLS (`etcds://`).
        tls: bool,
        /// The folder of the keys: empty, or segments each ending with `/`.
        folder: String,
        /// The lease key.
        key: LeaseKey,
    },
    /// `raft://HOST:PORT,HOST:PORT,HOST:PORT/KEY` (or `rafts://` for mutual TLS): a Raft group
    /// of the instances themselves, whose members are the URL's addresses; the lease is the
    /// record `KEY` in its replicated state.
    Raft {
        /// The group's members, `host:port` each, as given.
        members: Vec<String>,
        /// Whether the members talk mutual TLS (`rafts://`).
        tls: bool,
        /// The lease key.
        key: LeaseKey,
    },
    /// `zk://HOST:PORT[,HOST:PORT...]/[PATH/]KEY`: the lease is the node `/[PATH/]KEY`.
    ZooKeeper {
        /// The ensemble's servers, `host:port` each.
        hosts: Vec<String>,
        /// The parent node of the lease node: `/`, or `/PATH`.
        path: String,
        /// The lease key.
        key: LeaseKey,
    },
}

/// The `host:port` list of an `etcd://` or `zk://` URL.
fn hosts_of(authority: &str) -> Result<Vec<String>, String> {
    let hosts: Vec<String> = authority.split(',').map(|h| h.trim().to_owned()).collect();
    for host in &hosts {
        let Some((name, port)) = host.rsplit_once(':') else {
            return Err(format!("{host:?} has no port; give HOST:PORT"));
        };
        if name.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(format!("{host:?} is not HOST:PORT"));
        }
        if host.contains('@') {
            return Err("credentials go in the environment, not the URL".to_owned());
        }
    }
    Ok(hosts)
}

fn invalid(message: String) -> Error {
    Error::InvalidConfig {
        message,
        source: None,
    }
}

/// A URL path (without its leading `/`) as a folder (empty, or segments each ending with `/`)
/// and the last segment.
fn split_folder(path: &str) -> Result<(String, &str), String> {
    let (folder, key) = match path.rsplit_once('/') {
        Some((folder, key)) => (format!("{folder}/"), key),
        None => (String::new(), path),
    };
    for segment in folder.split_terminator('/') {
        LeaseKey::new(segment).map_err(|e| {
            format!(
                "folder segment {segment:?}: {}",
                e.to_string().replace("lease key", "name")
            )
        })?;
    }
    Ok((folder, key))
}

impl StoreUrl {
    /// Parses `file:///DIR/KEY`, `azblob://CONTAINER/[FOLDER/]KEY`, `dynamodb://TABLE/KEY`,
    /// `s3://BUCKET/[FOLDER/]KEY`, `gs://BUCKET/[FOLDER/]KEY`, `etcd://HOST:PORT[,...]/[FOLDER/]KEY` (`etcds://` for TLS)
    /// or `zk://HOST:PORT[,...]/[PATH/]KEY`. Whether the backend is compiled in is checked by
    /// [`open`].
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] saying what is wrong with the URL.
    pub fn parse(input: &str) -> Result<Self, Error> {
        let bad = |why: &str| invalid(format!("store URL {input:?}: {why}"));
        if let Some((scheme, rest)) = input.trim().split_once("://")
            && matches!(scheme, "etcd" | "etcds" | "zk" | "raft" | "rafts")
        {
            // Several hosts with ports: not a URL the `url` crate parses.
            let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
            if authority.is_empty() {
                return Err(bad(&format!(
                    "expected {scheme}://HOST:PORT[,HOST:PORT...]/[FOLDER/]KEY"
                )));
            }
            let hosts = hosts_of(authority).map_err(|e| bad(&e))?;
            if path.contains(['?', '#']) {
                return Err(bad("a store URL has no '?query' or '#fragment'"));
            }
            let (folder, key) = split_folder(path).map_err(|e| bad(&e))?;
            if key.is_empty() {
                return Err(bad(&format!("expected {scheme}://HOST:PORT/[FOLDER/]KEY")));
            }
            let key = LeaseKey::new(key.to_owned()).map_err(|e| bad(&e.to_string()))?;
            if scheme.starts_with("raft") {
                if !folder.is_empty() {
                    return Err(bad(&format!(
                        "a Raft group's keys have no folders: {scheme}://HOST:PORT,.../KEY"
                    )));
                }
                return Ok(StoreUrl::Raft {
                    members: hosts,
                    tls: scheme == "rafts",
                    key,
                });
            }
            return Ok(if scheme == "zk" {
                StoreUrl::ZooKeeper {
                    hosts,
                    path: format!("/{}", folder.trim_end_matches('/')),
                    key,
                }
            } else {
                StoreUrl::Etcd {
                    hosts,
                    tls: scheme == "etcds",
                    folder,
                    key,
                }
            });
        }
        let url = url::Url::parse(input.trim()).map_err(|e| {
            bad(&format!(
                "{e}; expected SCHEME://..., e.g. file:///var/lib/leases/KEY"
            ))
        })?;
        if url.query().is_some() || url.fragment().is_some() {
            return Err(bad("a store URL has no '?query' or '#fragment'"));
        }
        if !url.username().is_empty() || url.password().is_some() || url.port().is_some() {
            return Err(bad(
                "a store URL names no user, password or port (pass the endpoint separately)",
            ));
        }
        let key_of = |name: &str| LeaseKey::new(name.to_owned()).map_err(|e| bad(&e.to_string()));
        let scheme = url.scheme();
        if scheme == "file" {
            if input.trim().ends_with('/') {
                return Err(bad(
                    "the path must end with the lease key, not with '/': file:///dir/KEY",
                ));
            }
            let path = url
                .to_file_path()
                .map_err(|()| bad("a file URL needs an absolute local path: file:///dir/KEY"))?;
            let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
                return Err(bad("the path must end with the lease key"));
            };
            return Ok(StoreUrl::File {
                dir: dir.to_path_buf(),
                key: key_of(&name.to_string_lossy())?,
            });
        }
        let place = url.host_str().unwrap_or_default().to_owned();
        let path = url.path().strip_prefix('/').unwrap_or_default();
        let (folder, key) = split_folder(path).map_err(|e| bad(&e))?;
        if place.is_empty() || key.is_empty() {
            return Err(bad(&format!("expected {scheme}://PLACE/[FOLDER/]KEY")));
        }
        let key = key_of(key)?;
        Self::of_object_store(scheme, place, folder, key).map_err(|why| bad(&why))
    }

    /// The URL of an object or blob store (or DynamoDB) from its parts; `Err` says why not.
    fn of_object_store(
        scheme: &str,
        place: String,
        folder: String,
        key: LeaseKey,
    ) -> Result<Self, String> {
        match scheme {
            "azblob" => Ok(StoreUrl::Azure {
                container: place,
                folder,
                key,
            }),
            "dynamodb" if !folder.is_empty() => {
                Err("a DynamoDB table has no folders: dynamodb://TABLE/KEY".to_owned())
            }
            "dynamodb" => Ok(StoreUrl::Dynamo { table: place, key }),
            "s3" => Ok(StoreUrl::S3 {
                bucket: place,
                folder,
                key,
            }),
            "gs" => Ok(StoreUrl::Gcs {
                bucket: place,
                folder,
                key,
            }),
            other => Err(format!(
                "unknown scheme {other:?}; use file://, azblob://, dynamodb://, s3://, gs://, \
                 etcd://, zk:// or raft://"
            )),
        }
    }

    /// The lease key.
    pub fn key(&self) -> &LeaseKey {
        match self {
            StoreUrl::File { key, .. }
            | StoreUrl::Azure { key, .. }
            | StoreUrl::Dynamo { key, .. }
            | StoreUrl::S3 { key, .. }
            | StoreUrl::Gcs { key, .. }
            | StoreUrl::Etcd { key, .. }
            | StoreUrl::Raft { key, .. }
            | StoreUrl::ZooKeeper { key, .. } => key,
        }
    }
}

impl FromStr for StoreUrl {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Self::parse(s)
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::File { dir, key } => write!(f, "file://{}/{key}", dir.display()),
            StoreUrl::Azure {
                container,
                folder,
                key,
            } => write!(f, "azblob://{container}/{folder}{key}"),
            StoreUrl::Dynamo { table, key } => write!(f, "dynamodb://{table}/{key}"),
            StoreUrl::S3 {
                bucket,
                folder,
                key,
            } => write!(f, "s3://{bucket}/{folder}{key}"),
            StoreUrl::Gcs {
                bucket,
                folder,
                key,
            } => write!(f, "gs://{bucket}/{folder}{key}"),
            StoreUrl::Etcd {
                hosts,
                tls,
                folder,
                key,
            } => {
                let scheme = if *tls { "etcds" } else { "etcd" };
                write!(f, "{scheme}://{}/{folder}{key}", hosts.join(","))
            }
            StoreUrl::Raft { members, tls, key } => {
                let scheme = if *tls { "rafts" } else { "raft" };
                write!(f, "{scheme}://{}/{key}", members.join(","))
            }
            StoreUrl::ZooKeeper { hosts, path, key } => {
                let parent = path.trim_end_matches('/');
                write!(f, "zk://{}{parent}/{key}", hosts.join(","))
            }
        }
    }
}

/// How [`open`] reaches the store. The defaults: the cloud's public endpoint, its usual
/// credential chain, nothing created. (How long each store call may take is the elector's
/// [`Timing::request_timeout`], per call.)
#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    endpoint: Option<String>,
    emulator: bool,
    create_if_missing: bool,
    raft: RaftMember,
}

/// This instance's place in a `raft://` group: see [`OpenOptions::with_raft_member`].
#[derive(Clone, Debug, Default)]
struct RaftMember {
    listen: Option<String>,
    bind: Option<String>,
    dir: Option<PathBuf>,
    tls: Option<[PathBuf; 3]>,
    rejoin: bool,
}

impl OpenOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sends every call to `url` (a private, regional or VPC endpoint; `https://` uses TLS,
    /// `http://` does not). The credentials stay the cloud's usual chain.
    pub fn with_endpoint(mut self, url: impl Into<String>) -> Self {
        self.endpoint = Some(url.into());
        self
    }

    /// Talks to a local emulator with its conventions: Azurite's development account and key,
    /// DynamoDB and S3 with dummy keys in `us-east-1` (S3 path-style), GCS without
    /// credentials. Its address is the [endpoint](Self::with_endpoint), else the emulator's
    /// own variable (`AWS_ENDPOINT_URL`, `STORAGE_EMULATOR_HOST`) or Azurite's default port.
    pub fn with_emulator(mut self, emulator: bool) -> Self {
        self.emulator = emulator;
        self
    }

    /// For a `raft://` store: this instance is the group's member at `listen` (one of the URL's
    /// addresses, bound exactly) and keeps its Raft log, vote and snapshots in `dir` (created
    /// with mode `0700`; keep it across restarts, and never wipe it while the group runs).
    pub fn with_raft_member(mut self, listen: impl Into<String>, dir: impl Into<PathBuf>) -> Self {
        self.raft.listen = Some(listen.into());
        self.raft.dir = Some(dir.into());
        self
    }

    /// For a `raft://` store: bind `address` (`host:port`) instead of the member's own address
    /// of [`with_raft_member`](Self::with_raft_member), which stays the one the other members
    /// dial: for a member behind a proxy, NAT or a container's published port.
    pub fn with_raft_bind(mut self, address: impl Into<String>) -> Self {
        self.raft.bind = Some(address.into());
        self
    }

    /// For a `raft://` store: this member's folder was emptied (its data lost) while the group
    /// ran; join anyway, taking no part in elections until it has caught up. Without it such a
    /// member is refused: a member that forgot what it acknowledged weakens the majority's
    /// memory.
    pub fn with_raft_rejoin(mut self, rejoin: bool) -> Self {
        self.raft.rejoin = rejoin;
        self
    }

    /// For a `rafts://` store: the PEM files of the CA that signed every member's certificate,
    /// and of this member's certificate (naming its host) and private key.
    pub fn with_raft_tls(
        mut self,
        ca: impl Into<PathBuf>,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Self {
        self.raft.tls = Some([ca.into(), cert.into(), key.into()]);
        self
    }

    /// Creates the folder, container or table if it is missing (a bucket cannot be: it needs a
    /// project, a location and a storage class). Off by default: a missing one is an error.
    pub fn with_create_if_missing(mut self, create: bool) -> Self {
        self.create_if_missing = create;
        self
    }
}

/// Parses `url` and [opens](open) its store; returns the store and the URL's lease key.
///
/// # Errors
/// As [`StoreUrl::parse`] and [`open`].
///
/// # Cancel safety
/// As [`open`].
pub async fn from_url(
    url: &str,
    options: &OpenOptions,
) -> Result<(Arc<dyn Store>, LeaseKey), Error> {
    let url = StoreUrl::parse(url)?;
    let store = open(&url, options).await?;
    Ok((store, url.key().clone()))
}

/// Opens the store of `url`, checking that its folder, container, table or bucket can be used
/// (creating it only if [asked](OpenOptions::with_create_if_missing)).
///
/// # Errors
/// [`Error::InvalidConfig`] for a backend not compiled in, a bad option or a missing emulator
/// address; [`Error::NotFound`] for a missing folder, container or table; the store's error if
/// it cannot be reached or the credentials are refused.
///
/// # Cancel safety
/// Cancel-safe, except that a container or table being created may still be created.
pub async fn open(url: &StoreUrl, options: &OpenOptions) -> Result<Arc<dyn Store>, Error> {
    tls::install_crypto_provider();
    match url {
        StoreUrl::File { dir, .. } => Ok(Arc::new(if options.create_if_missing {
            FileStore::create(dir)?
        } else {
            FileStore::open(dir)?
        })),
        #[cfg(feature = "azure")]
        StoreUrl::Azure {
            container, folder, ..
        } => open_azure(container, folder, options).await,
        #[cfg(feature = "dynamo")]
        StoreUrl::Dynamo { table, .. } => open_dynamo(table, options).await,
        #[cfg(feature = "s3")]
        StoreUrl::S3 { bucket, folder, .. } => open_s3(bucket, folder, options).await,
        #[cfg(feature = "gcs")]
        StoreUrl::Gcs { bucket, folder, .. } => open_gcs(bucket, folder, options).await,
        #[cfg(feature = "etcd")]
        StoreUrl::Etcd {
            hosts, tls, folder, ..
        } => {
            let scheme = if *tls { "https" } else { "http" };
            let mut b =
                leader_etcd::EtcdBuilder::from_env_credentials()?.with_prefix(folder.clone());
            b = match &options.endpoint {
                Some(endpoint) => b.with_endpoints(endpoint.split(',')),
                None => b.with_endpoints(hosts.iter().map(|h| format!("{scheme}://{h}"))),
            };
            Ok(Arc::new(b.build().await?))
        }
        #[cfg(feature = "raft")]
        StoreUrl::Raft { members, tls, .. } => open_raft(members, *tls, &options.raft).await,
        #[cfg(feature = "zookeeper")]
        StoreUrl::ZooKeeper { hosts, path, .. } => {
            let hosts = options.endpoint.clone().unwrap_or_else(|| hosts.join(","));
            let store = leader_zookeeper::ZooKeeperStore::builder()
                .with_hosts(hosts)
                .with_path(path.clone())
                .with_create_path(options.create_if_missing)
                .build()
                .await?;
            Ok(Arc::new(store))
        }
        #[allow(unreachable_patterns, reason = "when every backend is compiled in")]
        other => Err(invalid(format!(
            "{other}: this backend is not compiled in (enable the `leader` crate's feature \
             for it)"
        ))),
    }
}

/// Starts this instance's member of the `raft://` group of `members`.
#[cfg(feature = "raft")]
async fn open_raft(
    members: &[String],
    tls: bool,
    member: &RaftMember,
) -> Result<Arc<dyn Store>, Error> {
    let (Some(listen), Some(dir)) = (&member.listen, &member.dir) else {
        return Err(invalid(
            "a raft:// store is a group of the instances themselves: give this instance's own \
             address among the URL's (--raft-listen) and its data folder (--raft-dir)"
                .to_owned(),
        ));
    };
    let mut config = leader_raft::RaftConfig::new(members.iter().cloned(), listen.clone(), dir)
        .with_rejoin(member.rejoin);
    if let Some(bind) = &member.bind {
        config = config.with_bind(bind.clone());
    }
    match (tls, &member.tls) {
        (true, Some([ca, cert, key])) => {
            let material = leader_raft::TlsConfig::from_files(ca, cert, key).map_err(raft_error)?;
            config = config.with_tls(material);
        }
        (true, None) => {
            return Err(invalid(
                "rafts:// talks mutual TLS: give the CA, this member's certificate and its key \
                 (--raft-ca, --raft-cert, --raft-key)"
                    .to_owned(),
            ));
        }
        (false, Some(_)) => {
            return Err(invalid(
                "TLS files were given for a plaintext raft:// group: use rafts:// (or drop them)"
                    .to_owned(),
            ));
        }
        (false, None) => {}
    }
    let store = leader_raft::RaftStore::start(config)
        .await
        .map_err(raft_error)?;
    Ok(Arc::new(store))
}

#[cfg(feature = "raft")]
fn raft_error(e: leader_raft::RaftError) -> Error {
    Error::InvalidConfig {
        message: e.to_string(),
        source: Some(Box::new(e)),
    }
}

#[cfg(feature = "azure")]
async fn open_azure(
    container: &str,
    folder: &str,
    options: &OpenOptions,
) -> Result<Arc<dyn Store>, Error> {
    use leader_azure::AzureLeaseStoreBuilder as Builder;
    let mut b = if options.emulator {
        let endpoint = options.endpoint.as_deref();
        Builder::new().with_emulator(endpoint.unwrap_or(leader_azure::EMULATOR_ENDPOINT))
    } else {
        let b = Builder::from_env()?;
        match &options.endpoint {
            Some(endpoint) => b.with_endpoint(endpoint.clone()),
            None => b,
        }
    };
    b = b
        .with_container(container.to_owned())
        .with_prefix(folder.to_owned())
        .with_create_container_if_missing(options.create_if_missing);
    Ok(Arc::new(b.build().await?))
}

#[cfg(feature = "dynamo")]
async fn open_dynamo(table: &str, options: &OpenOptions) -> Result<Arc<dyn Store>, Error> {
    let b = if options.emulator {
        let endpoint = aws_emulator_endpoint(options, "AWS_ENDPOINT_URL_DYNAMODB")?;
        leader_dynamo::DynamoBuilder::new().with_emulator(endpoint)
    } else {
        let b = leader_dynamo::DynamoBuilder::from_env()?;
        match &options.endpoint {
            Some(endpoint) => b.with_endpoint(endpoint.clone()),
            None => b,
        }
    };
    let store = b
        .with_table(table.to_owned())
        .with_create_table_if_missing(options.create_if_missing)
        .build()
        .await?;
    Ok(Arc::new(store))
}

#[cfg(feature = "s3")]
async fn open_s3(
    bucket: &str,
    folder: &str,
    options: &OpenOptions,
) -> Result<Arc<dyn Store>, Error> {
    if options.create_if_missing {
        return Err(invalid(format!(
            "creating a missing bucket is not supported for s3:// (a bucket has a region, an \
             owner and policies of its own); create it first, e.g. `aws s3 mb s3://{bucket}`"
        )));
    }
    let b = if options.emulator {
        let endpoint = aws_emulator_endpoint(options, "AWS_ENDPOINT_URL_S3")?;
        leader_s3::S3Builder::new().with_emulator(endpoint)
    } else {
        let b = leader_s3::S3Builder::from_env()?;
        match &options.endpoint {
            Some(endpoint) => b.with_endpoint(endpoint.clone()),
            None => b,
        }
    };
    let store = b
        .with_bucket(bucket.to_owned())
        .with_prefix(folder.to_owned())
        .build()
        .await?;
    Ok(Arc::new(store))
}

#[cfg(feature = "gcs")]
async fn open_gcs(
    bucket: &str,
    folder: &str,
    options: &OpenOptions,
) -> Result<Arc<dyn Store>, Error> {
    if options.create_if_missing {
        return Err(invalid(format!(
            "creating a missing bucket is not supported for gs:// (a bucket needs a project, a \
             location and a storage class); create it first, e.g. `gcloud storage buckets \
             create gs://{bucket}`"
        )));
    }
    let mut b = leader_gcs::GcsBuilder::from_env()?
        .with_bucket(bucket.to_owned())
        .with_prefix(folder.to_owned());
    if options.emulator {
        let endpoint = options
            .endpoint
            .clone()
            .or_else(|| env_var(leader_gcs::EMULATOR_VAR))
            .ok_or_else(|| needs_endpoint(leader_gcs::EMULATOR_VAR))?;
        b = b.with_emulator(endpoint);
    } else if let Some(endpoint) = &options.endpoint {
        // An explicit endpoint means the usual credentials, even if STORAGE_EMULATOR_HOST is
        // set too.
        b = b
            .with_endpoint(endpoint.clone())
            .with_application_default_credentials();
    }
    Ok(Arc::new(b.build().await?))
}

/// The address of an AWS emulator: the endpoint option, else the service's own variable
/// (`service_var`, e.g. `AWS_ENDPOINT_URL_S3`), else `AWS_ENDPOINT_URL`.
#[cfg(any(feature = "dynamo", feature = "s3"))]
fn aws_emulator_endpoint(options: &OpenOptions, service_var: &str) -> Result<String, Error> {
    options
        .endpoint
        .clone()
        .or_else(|| env_var(service_var))
        .or_else(|| env_var("AWS_ENDPOINT_URL"))
        .ok_or_else(|| needs_endpoint("AWS_ENDPOINT_URL"))
}

/// A non-empty environment variable.
#[cfg(any(feature = "dynamo", feature = "s3", feature = "gcs"))]
fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

#[cfg(any(feature = "dynamo", feature = "s3", feature = "gcs"))]
fn needs_endpoint(variable: &str) -> Error {
    invalid(format!(
        "the emulator mode needs the emulator's address: pass --endpoint URL \
         (OpenOptions::with_endpoint) or set {variable}"
    ))
}

/// The Rust examples of the repository's READMEs and docs, compiled against this crate alone
/// (with every store feature, the default), so that what a user copies builds with `leader`
/// as the one dependency.
#[cfg(all(
    doctest,
    feature = "azure",
    feature = "dynamo",
    feature = "s3",
    feature = "gcs",
    feature = "etcd",
    feature = "zookeeper",
    feature = "raft",
    feature = "notices"
))]
mod readme_doctests {
    #[doc = include_str!("../../README.md")]
    struct Repository;
    #[doc = include_str!("../README.md")]
    struct Leader;
    #[doc = include_str!("../../leader-core/README.md")]
    struct Core;
    #[doc = include_str!("../../leader-azure/README.md")]
    struct Azure;
    #[doc = include_str!("../../leader-dynamo/README.md")]
    struct Dynamo;
    #[doc = include_str!("../../leader-s3/README.md")]
    struct S3;
    #[doc = include_str!("../../leader-gcs/README.md")]
    struct Gcs;
    #[doc = include_str!("../../leader-etcd/README.md")]
    struct Etcd;
    #[doc = include_str!("../../leader-zookeeper/README.md")]
    struct ZooKeeper;
    #[doc = include_str!("../../leader-raft/README.md")]
    struct Raft;
    #[doc = include_str!("../../leader-notice/README.md")]
    struct Notice;
    #[doc = include_str!("../../docs/sharding.md")]
    struct Sharding;
    #[doc = include_str!("../../docs/quorum.md")]
    struct Quorum;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn urls_parse_and_print_back() {
        for (text, want) in [
            (
                "file:///var/lib/leases/jobs",
                StoreUrl::File {
                    dir: PathBuf::from("/var/lib/leases"),
                    key: LeaseKey::new("jobs").unwrap(),
                },
            ),
            (
                "dynamodb://Leases.prod/jobs",
                StoreUrl::Dynamo {
                    table: "Leases.prod".into(),
                    key: LeaseKey::new("jobs").unwrap(),
                },
            ),
            (
                "azblob://c1/k",
                StoreUrl::Azure {
                    container: "c1".into(),
                    folder: String::new(),
                    key: LeaseKey::new("k").unwrap(),
                },
            ),
            (
                "azblob://c1/prod/leases/k",
                StoreUrl::Azure {
                    container: "c1".into(),
                    folder: "prod/leases/".into(),
                    key: LeaseKey::new("k").unwrap(),
                },
            ),
            (
                "gs://b_1/k",
                StoreUrl::Gcs {
                    bucket: "b_1".into(),
                    folder: String::new(),
                    key: LeaseKey::new("k").unwrap(),
                },
            ),
            (
                "gs://b_1/a/b/k",
                StoreUrl::Gcs {
                    bucket: "b_1".into(),
                    folder: "a/b/".into(),
                    key: LeaseKey::new("k").unwrap(),
                },
            ),
            (
                "s3://my-leases/prod/k",
                StoreUrl::S3 {
                    bucket: "my-leases".into(),
                    folder: "prod/".into(),
                    key: LeaseKey::new("k").unwrap(),
                },
            ),
            (
                "etcd://10.0.0.1:2379,10.0.0.2:2379/prod/k",
                StoreUrl::Etcd {
                    hosts: vec!["10.0.0.1:2379".into(), "10.0.0.2:2379".into()],
                    tls: false,
                    folder: "prod/".into(),
                    key: LeaseKey::new("k").unwrap(),
                },
            ),
            (
                "etcds://etcd:2379/k",
                StoreUrl::Etcd {
                    hosts: vec!["etcd:2379".into()],
                    tls: true,
                    folder: String::new(),
                    key: LeaseKey::new("k").unwrap(),
                },
            ),
            (
                "zk://zk1:2181,zk2:2181/services/leases/k",
                StoreUrl::ZooKeeper {
                    hosts: vec!["zk1:2181".into(), "zk2:2181".into()],
                    path: "/services/leases".into(),
                    key: LeaseKey::new("k").unwrap(),
                },
            ),
            (
                "zk://127.0.0.1:2181/k",
                StoreUrl::ZooKeeper {
                    hosts: vec!["127.0.0.1:2181".into()],
                    path: "/".into(),
                    key: LeaseKey::new("k").unwrap(),
                },
            ),
        ] {
            let parsed: StoreUrl = text.parse().unwrap();
            assert_eq!(parsed, want, "{text}");
            assert_eq!(parsed.to_string(), text);
        }
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        for (bad, says) in [
            ("file://relative/jobs", "absolute"),
            ("/no/scheme", "SCHEME://"),
            ("ftp://x/y", "unknown scheme"),
            ("gs://bucket-only", "gs://PLACE/[FOLDER/]KEY"),
            ("dynamodb:///key", "dynamodb://PLACE/[FOLDER/]KEY"),
            ("dynamodb://t/a/k", "no folders"),
            ("gs://b/a//k", "folder segment"),
            ("gs://b/.hidden/k", "folder segment"),
            ("azblob://c/a/", "PLACE/[FOLDER/]KEY"),
            ("file:///var/lib/bad key", "lease key"),
            ("file:///var/lib/leases/jobs/", "not with '/'"),
            ("file:///", "not with '/'"),
            ("gs://b/a/b c", "lease key"),
            ("gs://b/k?x=1", "query"),
            ("azblob://c:10000/k", "port"),
            ("etcd://host/k", "no port"),
            ("etcd://h:99999/k", "not HOST:PORT"),
            ("etcd://h:2379", "HOST:PORT/[FOLDER/]KEY"),
            ("etcd:///k", "HOST:PORT[,HOST:PORT...]"),
            ("zk://u@h:2181/k", "environment"),
            ("zk://h:2181/a//k", "folder segment"),
            ("zk://h:2181/k?x", "query"),
        ] {
            let e = StoreUrl::parse(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{bad}");
            assert!(e.to_string().contains(says), "{bad}: {e}");
        }
    }

    #[tokio::test]
    async fn a_file_store_opens_only_if_its_folder_exists_unless_asked() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}/new/job", dir.path().display());
        let missing = from_url(&url, &OpenOptions::new()).await.err().unwrap();
        assert_eq!(missing.kind(), ErrorKind::NotFound, "{missing}");
        let (_, key) = from_url(&url, &OpenOptions::new().with_create_if_missing(true))
            .await
            .unwrap();
        assert_eq!(key.as_str(), "job");
        assert!(dir.path().join("new").is_dir());
    }
}
