//! One process of a fleet (`shard_bench member ...`): either one [`ShardedElector`] of
//! `shards` shards, or (`mode=single`) one single-key [`Elector`] for each of the keys
//! `lease-<first> .. lease-<first + count - 1>` (one lease per shard, the KCL / Event Hubs
//! scheme). Every term is taken, held until it ends, then dropped, like well-behaved work.
//!
//! Prints one JSON [`Line`] per event on stdout, stamped with the host's monotonic clock
//! ([`mono_us`]): `ready`, `start` and `end` of every term, `deadline` whenever the membership
//! deadline moves (sharded only), a `tick` every second with the store calls so far, CPU time
//! and memory, and `stopped`. SIGTERM shuts it down (releasing everything).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use integration_tests::chaos::{BackendKind, instant_us, mono_us};
use leader_core::{Elector, HolderId, LeaseBackend, LeaseKey, ShardedElector, Term, Timing};
use serde::{Deserialize, Serialize};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use crate::counted::{Calls, Counted};
use crate::usage::{cpu_us, rss_kib};

/// The key of the sharded elector.
pub(crate) const SHARDED_KEY: &str = "bench-shards";

/// The key of shard `i` in the one-lease-per-shard scheme.
pub(crate) fn single_key(i: u32) -> String {
    format!("bench-lease-{i}")
}

/// One event of a member, one JSON object per line.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Line {
    /// `ready`, `start`, `end`, `deadline`, `tick`, `stopped`, `error`.
    pub(crate) ev: String,
    /// When, [`mono_us`].
    pub(crate) t: u64,
    /// `start`/`end`: the shard (the key's index in the single scheme).
    #[serde(default)]
    pub(crate) s: u32,
    /// `start`/`end`: the term's token.
    #[serde(default)]
    pub(crate) tok: u64,
    /// `end`: whether the term ended at its deadline (not by a release).
    #[serde(default)]
    pub(crate) missed: bool,
    /// `deadline`: the membership deadline now, [`mono_us`].
    #[serde(default)]
    pub(crate) d: u64,
    /// `tick`: the store calls so far.
    #[serde(default)]
    pub(crate) calls: Calls,
    /// `tick`: CPU time so far, microseconds.
    #[serde(default)]
    pub(crate) cpu_us: u64,
    /// `tick`: resident set, KiB.
    #[serde(default)]
    pub(crate) rss_kib: u64,
    /// `tick`: terms held now.
    #[serde(default)]
    pub(crate) led: u64,
    /// `tick`: live members counted (sharded).
    #[serde(default)]
    pub(crate) members: u64,
    /// `tick`: terms that ended at their deadline so far.
    #[serde(default)]
    pub(crate) missed_total: u64,
    /// `tick`: membership terms (sharded) or terms (single) lost so far while not stopping.
    #[serde(default)]
    pub(crate) lost: u64,
    /// `error`: what went wrong.
    #[serde(default)]
    pub(crate) msg: String,
}

impl Line {
    fn new(ev: &str) -> Self {
        Self {
            ev: ev.to_owned(),
            t: mono_us(),
            ..Self::default()
        }
    }
}

/// Writes one line to stdout (ignoring a closed pipe: the driver is gone).
pub(crate) fn emit(line: &Line) {
    if let Ok(text) = serde_json::to_string(line) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{text}");
        let _ = out.flush();
    }
}

/// Which scheme a member runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// One sharded elector.
    Sharded,
    /// One single-key elector per shard.
    Single,
}

/// The arguments of `shard_bench member`.
#[derive(Clone, Debug)]
pub(crate) struct MemberArgs {
    /// The store.
    pub(crate) kind: BackendKind,
    /// The emulator's URL (the folder, for the file store).
    pub(crate) url: String,
    /// Container, table, bucket, etcd prefix or ZooKeeper node.
    pub(crate) place: String,
    /// The holder id.
    pub(crate) id: String,
    /// The scheme.
    pub(crate) mode: Mode,
    /// Sharded: the number of shards. Single: the first key's index.
    pub(crate) shards: u32,
    /// Single: how many keys.
    pub(crate) count: u32,
    /// The lease duration.
    pub(crate) ttl: Duration,
}

impl MemberArgs {
    /// The command-line arguments that [`parse`](Self::parse) reads back.
    pub(crate) fn to_args(&self) -> Vec<String> {
        vec![
            format!("backend={}", self.kind.name()),
            format!("url={}", self.url),
            format!("place={}", self.place),
            format!("id={}", self.id),
            format!(
                "mode={}",
                match self.mode {
                    Mode::Sharded => "sharded",
                    Mode::Single => "single",
                }
            ),
            format!("shards={}", self.shards),
            format!("count={}", self.count),
            format!("ttl_ms={}", self.ttl.as_millis()),
        ]
    }

    /// Parses `name=value` arguments.
    ///
    /// # Errors
    /// A message naming a bad or missing argument.
    pub(crate) fn parse(args: impl IntoIterator<Item = String>) -> Result<Self, String> {
        let mut a = MemberArgs {
            kind: BackendKind::File,
            url: String::new(),
            place: String::new(),
            id: String::new(),
            mode: Mode::Sharded,
            shards: 0,
            count: 0,
            ttl: Duration::from_secs(15),
        };
        let number = |name: &str, value: &str| {
            value
                .parse::<u64>()
                .map_err(|_| format!("{name}={value:?} is not a whole number"))
        };
        for arg in args {
            let Some((name, value)) = arg.split_once('=') else {
                return Err(format!("argument {arg:?} is not name=value"));
            };
            match name {
                "backend" => {
                    a.kind = BackendKind::parse(value)
                        .ok_or_else(|| format!("unknown backend {value:?}"))?;
                }
                "url" => a.url = value.to_owned(),
                "place" => a.place = value.to_owned(),
                "id" => a.id = value.to_owned(),
                "mode" => {
                    a.mode = match value {
                        "sharded" => Mode::Sharded,
                        "single" => Mode::Single,
                        _ => return Err(format!("unknown mode {value:?}")),
                    }
                }
                "shards" => {
                    a.shards = u32::try_from(number(name, value)?).map_err(|e| e.to_string())?;
                }
                "count" => {
                    a.count = u32::try_from(number(name, value)?).map_err(|e| e.to_string())?;
                }
                "ttl_ms" => a.ttl = Duration::from_millis(number(name, value)?),
                _ => return Err(format!("unknown argument {name:?}")),
            }
        }
        if a.id.is_empty() || a.url.is_empty() {
            return Err("id= and url= are required".to_owned());
        }
        Ok(a)
    }
}

/// Opens the store of `kind` at `url` (the emulator, or the file store's folder) in `place`,
/// wrapped to count calls. Built from each backend's own builder (as `leader::open` does in
/// emulator mode), because the sharded elector needs the concrete store's `FencedCas`.
///
/// # Errors
/// The store's error, as text.
pub(crate) async fn open(kind: BackendKind, url: &str, place: &str) -> Result<Counted, String> {
    leader_core::tls::install_crypto_provider();
    let fail = |e: leader_core::Error| format!("opening the {} store: {e}", kind.name());
    Ok(match kind {
        BackendKind::File => Counted::new(leader_core::FileStore::open(url).map_err(fail)?),
        BackendKind::QuorumFile => {
            return Err("sharded leadership is not offered over a quorum".to_owned());
        }
        BackendKind::Raft => {
            return Err(
                "the shard bench does not run a raft group (each member needs its own address \
                 and data folder): not supported"
                    .to_owned(),
            );
        }
        BackendKind::Azure => Counted::new(
            leader_azure::AzureLeaseStoreBuilder::new()
                .with_emulator(url)
                .with_container(place)
                .build()
                .await
                .map_err(fail)?,
        ),
        BackendKind::Dynamo => Counted::new(
            leader_dynamo::DynamoBuilder::new()
                .with_emulator(url)
                .with_table(place)
                .build()
                .await
                .map_err(fail)?,
        ),
        BackendKind::Gcs => Counted::new(
            leader_gcs::GcsBuilder::from_env()
                .map_err(fail)?
                .with_bucket(place)
                .with_emulator(url)
                .build()
                .await
                .map_err(fail)?,
        ),
        BackendKind::S3 | BackendKind::S3LocalStack => Counted::new(
            leader::s3::S3Builder::new()
                .with_emulator(url)
                .with_bucket(place)
                .build()
                .await
                .map_err(fail)?,
        ),
        BackendKind::Etcd => Counted::new(
            leader::etcd::EtcdBuilder::from_env_credentials()
                .map_err(fail)?
                .with_prefix(format!("{place}/"))
                .with_endpoints([url])
                .build()
                .await
                .map_err(fail)?,
        ),
        BackendKind::ZooKeeper => Counted::new(
            leader::zookeeper::ZooKeeperStore::builder()
                .with_hosts(url)
                .with_path(format!("/{place}"))
                .build()
                .await
                .map_err(fail)?,
        ),
    })
}

/// What the term holders have seen.
#[derive(Debug, Default)]
struct Held {
    /// Terms held now (a clone of each term's deadline source is not needed: the sharded
    /// terms share the membership deadline, so one held term tells it).
    terms: Mutex<BTreeMap<u32, Arc<Term>>>,
    count: AtomicU64,
    missed: AtomicU64,
    lost: AtomicU64,
    stopping: AtomicBool,
}

/// Runs a member until SIGTERM.
///
/// # Errors
/// A message if the store cannot be opened or the elector not built.
pub(crate) async fn run(args: MemberArgs) -> Result<(), String> {
    let mut term_signal = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let store = Arc::new(open(args.kind, &args.url, &args.place).await?);
    let held = Arc::new(Held::default());
    let holder = HolderId::new(args.id.clone()).map_err(|e| e.to_string())?;
    let members = Arc::new(AtomicU64::new(0));
    let stop: Box<dyn FnOnce() -> tokio::task::JoinHandle<()>> = match args.mode {
        Mode::Sharded => {
            let key = LeaseKey::new(SHARDED_KEY).map_err(|e| e.to_string())?;
            let handle = ShardedElector::builder(store.clone(), key, args.shards)
                .ttl(args.ttl)
                .holder_id(holder)
                .build()
                .map_err(|e| e.to_string())?
                .spawn();
            tokio::spawn(hold_shard_terms(handle.terms(), held.clone()));
            tokio::spawn(watch_deadline(held.clone()));
            let mut assignment = handle.assignment();
            let (held2, members2) = (held.clone(), members.clone());
            tokio::spawn(async move {
                let mut was_member = false;
                loop {
                    let (member, n) = {
                        let a = assignment.borrow_and_update();
                        (a.member, a.members)
                    };
                    members2.store(n as u64, Ordering::Relaxed);
                    if was_member && !member && !held2.stopping.load(Ordering::Relaxed) {
                        held2.lost.fetch_add(1, Ordering::Relaxed);
                    }
                    was_member = member;
                    if assignment.changed().await.is_err() {
                        break;
                    }
                }
            });
            Box::new(move || tokio::spawn(handle.shutdown()))
        }
        Mode::Single => {
            let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
            let mut tasks = tokio::task::JoinSet::new();
            // Started one after the other over one renew period, as leases taken at
            // different times would be: their renews spread out instead of coming at once,
            // so that a window of any length counts its share of them.
            let spread = Timing::from_ttl(args.ttl).renew_every;
            for (k, i) in (args.shards..args.shards.saturating_add(args.count)).enumerate() {
                let key = LeaseKey::new(single_key(i)).map_err(|e| e.to_string())?;
                let store: Arc<dyn LeaseBackend> = store.clone();
                let elector = Elector::builder(store, key)
                    .ttl(args.ttl)
                    .holder_id(holder.clone())
                    .build()
                    .map_err(|e| e.to_string())?;
                let delay = spread.mul_f64(k as f64 / f64::from(args.count.max(1)));
                let (held, stop) = (held.clone(), stop_rx.clone());
                tasks.spawn(async move {
                    tokio::time::sleep(delay).await;
                    hold_single_terms(i, elector.spawn(), held, stop).await;
                });
            }
            Box::new(move || {
                tokio::spawn(async move {
                    let _ = stop_tx.send(true);
                    while tasks.join_next().await.is_some() {}
                })
            })
        }
    };
    emit(&Line::new("ready"));
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = term_signal.recv() => break,
            _ = tick.tick() => {
                let mut line = Line::new("tick");
                line.calls = store.calls();
                line.cpu_us = cpu_us();
                line.rss_kib = rss_kib();
                line.led = held.count.load(Ordering::Relaxed);
                line.members = members.load(Ordering::Relaxed);
                line.missed_total = held.missed.load(Ordering::Relaxed);
                line.lost = held.lost.load(Ordering::Relaxed);
                emit(&line);
            }
        }
    }
    held.stopping.store(true, Ordering::Relaxed);
    let _ = stop().await;
    emit(&Line::new("stopped"));
    Ok(())
}

/// Takes every shard term, holds it until it ends, logs both, and drops it.
async fn hold_shard_terms(terms: leader_core::ShardTerms, held: Arc<Held>) {
    while let Ok(term) = terms.next().await {
        let Some(shard) = term.shard() else { continue };
        let term = Arc::new(term);
        let tok = term.token().get();
        held.terms
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(shard, term.clone());
        held.count.fetch_add(1, Ordering::Relaxed);
        emit(&Line {
            s: shard,
            tok,
            ..Line::new("start")
        });
        let held = held.clone();
        tokio::spawn(async move {
            term.cancelled().await;
            let missed = Instant::now() >= term.deadline();
            if missed && !held.stopping.load(Ordering::Relaxed) {
                held.missed.fetch_add(1, Ordering::Relaxed);
            }
            // Logged before the term is dropped, so before the release it allows: another
            // process's `start` of this shard comes later on the same clock.
            emit(&Line {
                s: shard,
                tok,
                missed,
                ..Line::new("end")
            });
            held.terms
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&shard);
            held.count.fetch_sub(1, Ordering::Relaxed);
            drop(term);
        });
    }
}

/// Logs the membership deadline (every shard term's) whenever it moves; checked every 20 ms.
async fn watch_deadline(held: Arc<Held>) {
    let mut last = 0;
    loop {
        let deadline = held
            .terms
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .next()
            .map(|t| t.deadline());
        if let Some(d) = deadline {
            let d = instant_us(d);
            // Ignore the microsecond wobble of converting an instant.
            if d.abs_diff(last) > 1_000 {
                last = d;
                emit(&Line {
                    d,
                    ..Line::new("deadline")
                });
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Takes every term of one single-key elector, holds it until it ends, logs both; on `stop`,
/// drops the term and shuts the elector down (releasing the lease).
async fn hold_single_terms(
    i: u32,
    handle: leader_core::ElectorHandle,
    held: Arc<Held>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let term = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => break,
            term = handle.wait_for_term() => match term {
                Ok(term) => term,
                Err(_) => break,
            },
        };
        let tok = term.token().get();
        held.count.fetch_add(1, Ordering::Relaxed);
        emit(&Line {
            s: i,
            tok,
            ..Line::new("start")
        });
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => {}
            _ = term.cancelled() => {}
        }
        let stopping = held.stopping.load(Ordering::Relaxed);
        let missed = Instant::now() >= term.deadline();
        if !stopping {
            if missed {
                held.missed.fetch_add(1, Ordering::Relaxed);
            }
            held.lost.fetch_add(1, Ordering::Relaxed);
        }
        emit(&Line {
            s: i,
            tok,
            missed,
            ..Line::new("end")
        });
        held.count.fetch_sub(1, Ordering::Relaxed);
        drop(term);
        if stopping {
            break;
        }
    }
    handle.shutdown().await;
}
