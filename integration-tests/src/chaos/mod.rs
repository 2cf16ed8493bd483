//! Chaos drills: real candidate processes, each behind its own [`FaultProxy`](crate::proxy::FaultProxy),
//! killed, paused, partitioned, stalled and throttled, with an independent check of what they
//! did.
//!
//! - [`candidate`]: the program each candidate process runs (`chaos_candidate`): an
//!   [`Elector`] on one backend, fenced writes while its term is valid,
//!   and one JSON [`Event`] per line on stdout, stamped with the host's monotonic clock.
//! - [`checker`]: reads every candidate's events (and the protected object at the end) and
//!   lists the violated invariants.
//! - [`drill`]: the scenarios, one round at a time, and the summary of many rounds. Behind it,
//!   in private modules: the scenarios and their bounds (`scenario`), the candidate processes
//!   and what their logs say (`process`), the driver that injects a round's fault (`drive`), and
//!   the summary (`summary`).
//! - [`raft`]: the Raft group of a `raft://` round, whose members are the candidates
//!   themselves.

pub mod candidate;
pub mod checker;
pub mod drill;
mod drive;
mod measure;
mod place;
mod process;
pub mod raft;
mod restart;
mod scenario;
mod summary;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use leader::{OpenOptions, StoreUrl};
use leader_core::quorum::Quorum;
use leader_core::{Elector, ElectorBuilder, Error, FencedStore, LeaseBackend, LeaseKey, Timing};
use serde::{Deserialize, Serialize};

/// The host's monotonic clock (`CLOCK_MONOTONIC`) in microseconds: the same clock in every
/// process, so that events of different candidates can be compared.
pub fn mono_us() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |ts| {
        let secs = u64::try_from(ts.tv_sec()).unwrap_or(0);
        let nanos = u64::try_from(ts.tv_nsec()).unwrap_or(0);
        secs * 1_000_000 + nanos / 1_000
    })
}

/// A `tokio` instant (the same monotonic clock on Linux) on the [`mono_us`] scale.
pub fn instant_us(at: tokio::time::Instant) -> u64 {
    let now_us = mono_us();
    let now = tokio::time::Instant::now();
    if at >= now {
        now_us.saturating_add(duration_us(at - now))
    } else {
        now_us.saturating_sub(duration_us(now - at))
    }
}

/// A duration in whole microseconds.
pub fn duration_us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The store a drill runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum BackendKind {
    /// The local file store (no proxy: it cannot be partitioned or throttled).
    File,
    /// Azure Blob Storage on Azurite.
    Azure,
    /// DynamoDB on its emulator.
    Dynamo,
    /// Google Cloud Storage on fake-gcs-server.
    Gcs,
    /// Amazon S3 on moto (the DynamoDB emulator's server, requests one at a time).
    S3,
    /// Amazon S3 on LocalStack's S3 provider.
    S3LocalStack,
    /// etcd (a real server), behind a TCP-level proxy.
    Etcd,
    /// ZooKeeper (a real server), behind a TCP-level proxy.
    ZooKeeper,
    /// A quorum of three file stores (three folders, see [`quorum_folders`]), opened with
    /// [`leader::quorum_from_urls`]: the election over a majority (`docs/quorum.md`), its fenced
    /// objects on the first member. No proxy; a member goes away by renaming its folder.
    QuorumFile,
    /// A Raft group of the candidates themselves (`raft://`, `docs/raft.md`): each candidate
    /// process runs one member, behind a TCP proxy of its own and with its own data folder
    /// (see [`raft`]); no proxy between a candidate and its member (one process), but one
    /// between the members, so a member can be cut from the others. A member goes away with
    /// its candidate.
    Raft,
}

impl BackendKind {
    /// Every backend.
    pub const ALL: [BackendKind; 10] = [
        BackendKind::File,
        BackendKind::Azure,
        BackendKind::Dynamo,
        BackendKind::Gcs,
        BackendKind::S3,
        BackendKind::S3LocalStack,
        BackendKind::Etcd,
        BackendKind::ZooKeeper,
        BackendKind::QuorumFile,
        BackendKind::Raft,
    ];

    /// The name used on command lines and in summaries.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::File => "file",
            BackendKind::Azure => "azure",
            BackendKind::Dynamo => "dynamo",
            BackendKind::Gcs => "gcs",
            BackendKind::S3 => "s3",
            BackendKind::S3LocalStack => "s3-localstack",
            BackendKind::Etcd => "etcd",
            BackendKind::ZooKeeper => "zookeeper",
            BackendKind::QuorumFile => "quorum-file",
            BackendKind::Raft => "raft",
        }
    }

    /// The backend of a [`name`](Self::name).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The emulator it needs, if any.
    pub fn emulator(self) -> Option<crate::Emulator> {
        match self {
            BackendKind::File | BackendKind::QuorumFile | BackendKind::Raft => None,
            BackendKind::Azure => Some(crate::Emulator::Azurite),
            BackendKind::Dynamo => Some(crate::Emulator::DynamoDb),
            BackendKind::Gcs => Some(crate::Emulator::Gcs),
            BackendKind::S3 => Some(crate::Emulator::MotoS3),
            BackendKind::S3LocalStack => Some(crate::Emulator::LocalStackS3),
            BackendKind::Etcd => Some(crate::Emulator::Etcd),
            BackendKind::ZooKeeper => Some(crate::Emulator::ZooKeeper),
        }
    }

    /// The shortest timing the store copes with in these drills: Azure grants leases of 15 s at
    /// least; GCS allows one write per second to an object; the DynamoDB emulator serialises
    /// requests, and so does moto's S3 (the same server; a takeover there is three requests, a
    /// fenced write two); etcd's leases last whole seconds (2 s at least with its default election
    /// timeout); ZooKeeper's sessions here last 400 ms at least; a quorum's renew writes
    /// every member; a Raft group's write is stored on disk by a majority of the candidates'
    /// own members, through the Raft leader (forwarded by any other member).
    pub fn timing(self) -> Timing {
        match self {
            BackendKind::File => Timing::from_ttl(Duration::from_secs(2)),
            BackendKind::QuorumFile => {
                // Room for slow file writes on a loaded machine: a renew that times out but
                // lands makes the next one conflict with the term's own write, which drops
                // that member (docs/quorum.md, rule 4), and with one member away ends the term.
                let mut t = Timing::from_ttl(Duration::from_secs(2));
                t.request_timeout = Duration::from_millis(400);
                t.margin = Duration::from_millis(800);
                t.renew_every = Duration::from_millis(500);
                t
            }
            BackendKind::Raft => {
                // Room for the fsyncs of a write (on the Raft leader and one more member) and
                // a forward, with the three candidates, each a member, on a loaded machine.
                let mut t = Timing::from_ttl(Duration::from_secs(2));
                t.request_timeout = Duration::from_millis(400);
                t.margin = Duration::from_millis(800);
                t.renew_every = Duration::from_millis(500);
                t
            }
            BackendKind::Azure => Timing::from_ttl(Duration::from_secs(15)),
            BackendKind::Dynamo => {
                let mut t = Timing::from_ttl(Duration::from_millis(2500));
                t.request_timeout = Duration::from_millis(300);
                t.margin = Duration::from_millis(600);
                t.retry_every = Duration::from_millis(500);
                t
            }
            BackendKind::Etcd | BackendKind::ZooKeeper => {
                let mut t = Timing::from_ttl(Duration::from_secs(2));
                t.request_timeout = Duration::from_millis(300);
                t.margin = Duration::from_millis(600);
                t.renew_every = Duration::from_millis(500);
                t.retry_every = Duration::from_millis(400);
                t
            }
            // The timing of leader-s3's conformance tests on both emulators.
            BackendKind::S3 | BackendKind::S3LocalStack => {
                let mut t = Timing::from_ttl(Duration::from_secs(3));
                t.request_timeout = Duration::from_millis(500);
                t.margin = Duration::from_secs(1);
                t.renew_every = Duration::from_secs(1);
                t.retry_every = Duration::from_millis(500);
                t
            }
            BackendKind::Gcs => {
                let mut t = Timing::from_ttl(Duration::from_millis(3500));
                t.renew_every = Duration::from_secs(1);
                t.retry_every = Duration::from_millis(500);
                t.request_timeout = Duration::from_millis(600);
                t.margin = Duration::from_millis(1200);
                t
            }
        }
    }

    /// Whether it can sit behind a proxy (every backend but the file store, the quorum of
    /// folders and the Raft group, whose members dial each other's own addresses).
    pub fn proxied(self) -> bool {
        !matches!(
            self,
            BackendKind::File | BackendKind::QuorumFile | BackendKind::Raft
        )
    }

    /// How much longer than one store's an acquisition may take once the lease is free: none
    /// for one store; over a quorum, a round of reads and two of writes (the first member
    /// alone, then the others side by side), each bounded by the request timeout; in a Raft
    /// group, the election of a new Raft leader when the old one left with its candidate (up
    /// to 600 ms after its last heartbeat, and the vote: [`RAFT_ELECTION`]), and a request
    /// lost to the old leader meanwhile.
    pub fn acquisition(self, t: &Timing) -> Duration {
        match self {
            BackendKind::QuorumFile => t.request_timeout * 3,
            BackendKind::Raft => RAFT_ELECTION + t.request_timeout,
            _ => Duration::ZERO,
        }
    }

    /// Whether it speaks HTTP, so that its proxy can answer or drop single requests
    /// (throttling, lost answers); etcd's gRPC streams and ZooKeeper's protocol sit behind a
    /// byte-level proxy that can partition, stall and hold bytes (late delivery).
    pub fn http(self) -> bool {
        matches!(
            self,
            BackendKind::Azure
                | BackendKind::Dynamo
                | BackendKind::Gcs
                | BackendKind::S3
                | BackendKind::S3LocalStack
        )
    }

    /// Whether it is S3 (on either emulator): its throttling answer is S3's 503 `SlowDown`.
    pub fn s3(self) -> bool {
        matches!(self, BackendKind::S3 | BackendKind::S3LocalStack)
    }
}

/// The longest a Raft group of the default timing (`leader-raft`'s `RaftTiming`: heartbeats
/// every 100 ms, election timeouts of 300 to 600 ms) goes without a leader after losing it:
/// the longest election timeout after the last heartbeat, and the vote.
pub const RAFT_ELECTION: Duration = Duration::from_millis(700);

/// The fault proxy in front of one candidate's store: HTTP for the cloud stores, TCP for etcd
/// and ZooKeeper.
pub enum Proxy {
    /// Request-level faults.
    Http(crate::proxy::FaultProxy),
    /// Byte-level faults: partition (a blackhole), refused connections and late delivery of
    /// the client's bytes.
    Tcp(crate::tcp_proxy::TcpFaultProxy),
    /// A Raft member's cut from the other members (a blackhole, both ways), see [`raft`].
    Member(raft::MemberCut),
}

impl Proxy {
    /// Puts `faults` in force. A TCP proxy honours `blackhole` (as a partition),
    /// `refuse_new` and `late_fraction`/`late_by` (as chunks of the client's bytes held, see
    /// [`TcpFaultProxy::late`](crate::tcp_proxy::TcpFaultProxy::late)); the other
    /// request-level faults need [`BackendKind::http`].
    pub fn set(&self, faults: crate::proxy::ProxyFaults) {
        match self {
            Proxy::Http(p) => p.set(faults),
            Proxy::Tcp(p) => {
                p.refuse_new(faults.refuse_new);
                p.partition(faults.blackhole);
                p.late(faults.late_fraction, faults.late_by);
            }
            Proxy::Member(m) => m.isolate(faults.blackhole),
        }
    }

    /// Ends every fault.
    pub fn heal(&self) {
        match self {
            Proxy::Http(p) => p.heal(),
            Proxy::Tcp(p) => p.heal(),
            Proxy::Member(m) => m.isolate(false),
        }
    }

    /// Requests (HTTP) or chunks of bytes (TCP) the proxy held past their sender's timeout
    /// and then delivered.
    pub fn late_deliveries(&self) -> u64 {
        match self {
            Proxy::Http(p) => p.counts().late.load(std::sync::atomic::Ordering::Relaxed),
            Proxy::Tcp(p) => p.counters().late,
            Proxy::Member(_) => 0,
        }
    }

    /// The HTTP proxy, which counts requests by kind.
    pub fn http(&self) -> Option<&crate::proxy::FaultProxy> {
        match self {
            Proxy::Http(p) => Some(p),
            Proxy::Tcp(_) | Proxy::Member(_) => None,
        }
    }
}

/// A store opened both as a lease backend and as a fenced store (the same client).
pub type OpenedStore = (Arc<dyn LeaseBackend>, Arc<dyn FencedStore>);

/// Opens `kind` at `endpoint` (the emulator's or a proxy's base URL; the directory for the file
/// store; for a Raft group, the candidate's member, see [`raft`]) in `place` (container, table
/// or bucket; ignored by the file store; a Raft group's member list). With `create`,
/// the container or table is created if missing (buckets are created with
/// [`GcsClient`](crate::gcs::GcsClient) and [`s3::create_bucket`](crate::s3::create_bucket)).
///
/// # Errors
/// The store's error when it cannot be configured or reached.
pub async fn open_store(
    kind: BackendKind,
    endpoint: &str,
    place: &str,
    create: bool,
) -> Result<OpenedStore, Error> {
    // Opened the way `leader run` opens it (the `leader` crate), in emulator mode. The key in
    // the URL does not matter here: the candidates pass theirs to the elector.
    let key = LeaseKey::new("chaos").map_err(|e| Error::InvalidConfig {
        message: e.to_string(),
        source: None,
    })?;
    let url = match kind {
        BackendKind::File => StoreUrl::File {
            dir: endpoint.into(),
            key,
        },
        BackendKind::Azure => StoreUrl::Azure {
            container: place.to_owned(),
            folder: String::new(),
            key,
        },
        BackendKind::Dynamo => StoreUrl::Dynamo {
            table: place.to_owned(),
            key,
        },
        BackendKind::Gcs => StoreUrl::Gcs {
            bucket: place.to_owned(),
            folder: String::new(),
            key,
        },
        BackendKind::S3 | BackendKind::S3LocalStack => StoreUrl::S3 {
            bucket: place.to_owned(),
            folder: String::new(),
            key,
        },
        // The endpoint (below) names the server or the proxy in front of it; the place is the
        // key prefix (etcd) or the parent node (ZooKeeper) of this round.
        BackendKind::Etcd => StoreUrl::Etcd {
            hosts: vec!["placeholder:1".to_owned()],
            tls: false,
            folder: format!("{place}/"),
            key,
        },
        BackendKind::ZooKeeper => StoreUrl::ZooKeeper {
            hosts: vec!["placeholder:1".to_owned()],
            path: format!("/{place}"),
            key,
        },
        BackendKind::QuorumFile => {
            return Err(Error::InvalidConfig {
                message: "a quorum is no one store: open it with open_election or open_fenced"
                    .to_owned(),
                source: None,
            });
        }
        // This process becomes the member; `create` has nothing to create.
        BackendKind::Raft => return raft::open(endpoint, place, key).await,
    };
    let options = OpenOptions::new()
        .with_emulator(true)
        .with_endpoint(endpoint)
        // Buckets are created by `place::create_place`; `leader` cannot create them.
        .with_create_if_missing(create && kind != BackendKind::Gcs && !kind.s3());
    let store = leader::open(&url, &options).await?;
    Ok((store.clone(), store))
}

/// The member folders of a quorum round in `dir` (the round's store directory), in member
/// order: the protected objects live in the first.
pub fn quorum_folders(dir: &Path) -> Vec<PathBuf> {
    (0..3).map(|i| dir.join(format!("member{i}"))).collect()
}

/// The quorum of the folders in `dir` ([`quorum_folders`]), each named by a `file://` URL
/// ending with `key`, opened the way `leader run --store ... --store ...` opens it.
async fn open_quorum(dir: &str, key: &LeaseKey) -> Result<(Quorum, LeaseKey), Error> {
    let urls: Vec<String> = quorum_folders(Path::new(dir))
        .iter()
        .map(|f| format!("file://{}/{key}", f.display()))
        .collect();
    leader::quorum_from_urls(&urls, &OpenOptions::new()).await
}

/// Whether one read of every member of the quorum of folders in `dir` shows the term of
/// `token` held on each (the library's own status read, as `leader status` prints it).
pub(crate) async fn quorum_carries_everywhere(dir: &Path, key: &str, token: u64) -> bool {
    let Ok(key) = LeaseKey::new(key) else {
        return false;
    };
    let Some(dir) = dir.to_str() else {
        return false;
    };
    let Ok((quorum, key)) = open_quorum(dir, &key).await else {
        return false;
    };
    let timeout = BackendKind::QuorumFile.timing().request_timeout;
    match leader_core::quorum::read_status(&quorum, &key, timeout).await {
        Ok(status) => status
            .members
            .iter()
            .all(|m| m.error.is_none() && m.held && m.token == Some(token)),
        Err(_) => false,
    }
}

/// A candidate's election for `key` on `kind` at `endpoint` in `place` (as [`open_store`]),
/// and the fenced store its protected object is written through: one store's elector and
/// the store itself, or the quorum's elector and the quorum (objects on its first member).
///
/// # Errors
/// The store's error when it cannot be configured or reached.
pub async fn open_election(
    kind: BackendKind,
    endpoint: &str,
    place: &str,
    key: LeaseKey,
) -> Result<(ElectorBuilder, Arc<dyn FencedStore>), Error> {
    if kind == BackendKind::QuorumFile {
        let (quorum, key) = open_quorum(endpoint, &key).await?;
        let fenced: Arc<dyn FencedStore> = Arc::new(quorum.clone());
        return Ok((Elector::quorum_builder(quorum, key), fenced));
    }
    let (backend, fenced) = open_store(kind, endpoint, place, false).await?;
    Ok((Elector::builder(backend, key), fenced))
}

/// The fenced store the candidates of `kind` write their protected object through (see
/// [`open_election`]), for reading it at the end of a round (a Raft group's, once its
/// candidates are gone: [`RaftGroup::final_object`](raft::RaftGroup::final_object)).
///
/// # Errors
/// The store's error when it cannot be configured or reached.
pub async fn open_fenced(
    kind: BackendKind,
    endpoint: &str,
    place: &str,
) -> Result<Arc<dyn FencedStore>, Error> {
    let key = LeaseKey::new("chaos").map_err(|e| Error::InvalidConfig {
        message: e.to_string(),
        source: None,
    })?;
    Ok(open_election(kind, endpoint, place, key).await?.1)
}

/// [`open_store`] for the drill's own setup and checks, not a candidate's: an emulator busy
/// with several rounds may answer a check late, and the round should not be lost to it. A
/// transient error is tried again, up to three attempts half a second apart.
///
/// # Errors
/// As [`open_store`]: the last error, or the first that needs a person.
pub async fn open_store_patiently(
    kind: BackendKind,
    endpoint: &str,
    place: &str,
    create: bool,
) -> Result<OpenedStore, Error> {
    let mut attempt = 1;
    loop {
        match open_store(kind, endpoint, place, create).await {
            Err(e) if e.is_retryable() && attempt < 3 => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            opened => return opened,
        }
    }
}

/// What a candidate did, one JSON object per line of its stdout. Times are [`mono_us`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// One of the `EV_*` constants.
    pub ev: String,
    /// When it was logged (for a write: when its answer came).
    pub t: u64,
    /// The candidate's holder id.
    pub id: String,
    /// The term's fencing token (0 outside a term).
    #[serde(default)]
    pub token: u64,
    /// The term's deadline as known when logged (0 outside a term).
    #[serde(default)]
    pub deadline: u64,
    /// Writes: the candidate's sequence number of the write.
    #[serde(default)]
    pub seq: u64,
    /// Writes: when the write was decided (after the term was checked valid).
    #[serde(default)]
    pub t0: u64,
    /// Writes: when the write was sent (after the candidate's act delay, in which it may be
    /// paused: the case fencing is for).
    #[serde(default)]
    pub t1: u64,
    /// Writes: one of the `OUT_*` constants; term ends: why.
    #[serde(default)]
    pub outcome: String,
}

/// The candidate is up and campaigning.
pub const EV_READY: &str = "ready";
/// A term began (the candidate acts from now on).
pub const EV_TERM_STARTED: &str = "term_started";
/// The term's deadline moved (a renew succeeded).
pub const EV_RENEWED: &str = "renewed";
/// A fenced write was answered.
pub const EV_WRITE: &str = "write";
/// The term ended; `t` is `min(now, deadline)`.
pub const EV_TERM_ENDED: &str = "term_ended";
/// The candidate is shutting down: its work has stopped, and its elector now releases the
/// lease (the release is sent right after).
pub const EV_RELEASING: &str = "releasing";
/// The candidate shut down.
pub const EV_EXIT: &str = "exit";

/// The write was applied and acknowledged.
pub const OUT_ACCEPTED: &str = "accepted";
/// The store rejected the write's token (a newer term exists).
pub const OUT_FENCED: &str = "fenced";
/// The outcome is unknown: the write may have been applied.
pub const OUT_UNKNOWN: &str = "unknown";
/// The store failed the write without applying it.
pub const OUT_FAILED: &str = "failed";

/// A term's end (`outcome` of [`EV_TERM_ENDED`]) asked for by the drive's SIGTERM; any other
/// end (the term cancelled, lost) was not asked for.
pub const END_SIGTERM: &str = "sigterm";

/// The protected object's value of one write: `id/token/seq`.
pub fn write_value(id: &str, token: u64, seq: u64) -> String {
    format!("{id}/{token}/{seq}")
}
