//! The benchmark of latency and store cost, next to a peer crate:
//! `bench [backends=file,azure,dynamo,dynamo-peer,gcs,s3,s3-localstack,etcd,zookeeper] [ttl=15]
//! [rounds=10] [window=60] [stop_rounds=3] [out=FILE] [dir=DIR]`. Usually run by
//! `scripts/bench`, which builds it with `--release`, starts the emulators and writes
//! `results/bench.md`.
//!
//! Not a test: nothing asserts on a time, and neither `cargo test` nor CI runs it. Every
//! backend runs in parallel with the others. On each of ours, real `chaos_candidate` processes
//! campaign for a fresh key per round, with the elector's default timing for `ttl` seconds; on
//! `dynamo-peer`, `peer_candidate` processes do the same with the `dynamodb-lease` crate (its
//! defaults, `ttl` in whole seconds) on the same DynamoDB emulator, measured by the same code:
//!
//! - **acquire**: one candidate on an empty key, from its spawn (and from its elector's start,
//!   the candidate's `ready` event) to its first term;
//! - **handover**: two more candidates wait; at a random point of their poll cycle the leader
//!   gets SIGTERM (it releases the lease); the time until the first of them begins its term;
//! - **failover**: at a random point of its renew cycle the new leader gets SIGKILL; the time
//!   until the last one's term begins (about a ttl: the lease has to expire).
//!
//! Then, once per backend, a holder and one waiting follower, each behind its own
//! [`FaultProxy`](integration_tests::proxy::FaultProxy), are left alone for `window` seconds: the store requests each sent, by kind
//! (the AWS operation, else `METHOD /path`, with the container, table or bucket written
//! `{place}`), by what their price depends on (a DynamoDB read's consistency, Azure's
//! operation, the answer's status), scaled to an hour and priced with each cloud's published
//! prices ([`cost`]). The file store has no network, so no counts.
//!
//! Last, `stop_rounds` times per backend of ours: a leader doing fenced writes (each sent half
//! a second after its validity check) is SIGSTOPped for longer than the ttl while a second
//! candidate takes over, then SIGCONTed: the writes of its old term it sent after the new
//! term began, how many the store accepted, and how long it took to see that its term was
//! over ([`stale`]). The peer does no fenced writes: n/a.
//!
//! The tables go to stdout (markdown) and to `out` if given, progress to stderr. Exits 2 on a
//! bad argument, 1 if a round or a count could not be completed (the tables still show what
//! was measured).
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command-line program reports on its streams"
)]

mod cost;
mod stale;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Duration;

use aws_sdk_dynamodb::error::DisplayErrorContext;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    TimeToLiveSpecification,
};
use integration_tests::Emulator;
use integration_tests::chaos::candidate::CandidateArgs;
use integration_tests::chaos::checker::{CandidateLog, FinalObject, check, parse_log};
use integration_tests::chaos::drill::{prepare, proxied};
use integration_tests::chaos::{
    BackendKind, EV_READY, EV_RELEASING, EV_TERM_ENDED, EV_TERM_STARTED, EV_WRITE, Event, Proxy,
    mono_us, open_store,
};
use integration_tests::proxy::Exchange;
use leader_core::backend::Rng;
use leader_core::{ObjectName, Timing};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use cost::{Cloud, PRICES, PRICES_READ_ON, SOURCES};
use stale::{Stale, stale_writes};

/// What the bench measures: one of our backends, or the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    /// `chaos_candidate` on one of our stores.
    Ours(BackendKind),
    /// `peer_candidate` (the `dynamodb-lease` crate) on the DynamoDB emulator.
    Peer,
}

impl Backend {
    /// The default run, in the order of the tables: the peer right after our DynamoDB.
    const ALL: [Backend; 9] = [
        Backend::Ours(BackendKind::File),
        Backend::Ours(BackendKind::Azure),
        Backend::Ours(BackendKind::Dynamo),
        Backend::Peer,
        Backend::Ours(BackendKind::Gcs),
        Backend::Ours(BackendKind::S3),
        Backend::Ours(BackendKind::S3LocalStack),
        Backend::Ours(BackendKind::Etcd),
        Backend::Ours(BackendKind::ZooKeeper),
    ];

    fn name(self) -> &'static str {
        match self {
            Backend::Ours(kind) => kind.name(),
            Backend::Peer => "dynamo-peer",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|b| b.name() == name)
    }

    /// The store it runs on.
    fn kind(self) -> BackendKind {
        match self {
            Backend::Ours(kind) => kind,
            Backend::Peer => BackendKind::Dynamo,
        }
    }

    /// Whose prices apply (none for the file store).
    fn cloud(self) -> Option<Cloud> {
        match self.kind() {
            BackendKind::File
            | BackendKind::QuorumFile
            | BackendKind::Raft
            | BackendKind::Etcd
            | BackendKind::ZooKeeper => None,
            BackendKind::Azure => Some(Cloud::Azure),
            BackendKind::Dynamo => Some(Cloud::Aws),
            BackendKind::S3 | BackendKind::S3LocalStack => Some(Cloud::AwsS3),
            BackendKind::Gcs => Some(Cloud::Gcp),
        }
    }
}

/// What the command line asked for.
struct Settings {
    backends: Vec<Backend>,
    ttl: Duration,
    rounds: usize,
    window: Duration,
    stop_rounds: usize,
    out: Option<PathBuf>,
    dir: PathBuf,
}

fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Settings, String> {
    let mut s = Settings {
        backends: Backend::ALL.to_vec(),
        ttl: Duration::from_secs(15),
        rounds: 10,
        window: Duration::from_secs(60),
        stop_rounds: 3,
        out: None,
        dir: std::env::temp_dir().join(integration_tests::unique_name("bench")),
    };
    let seconds = |name: &str, value: &str| match value.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(Duration::from_secs_f64(v)),
        _ => Err(format!(
            "{name}={value:?} is not a positive number of seconds"
        )),
    };
    for arg in args {
        let Some((name, value)) = arg.split_once('=') else {
            return Err(format!("argument {arg:?} is not name=value"));
        };
        match name {
            "backends" => {
                s.backends = value
                    .split(',')
                    .map(|b| Backend::parse(b).ok_or_else(|| format!("unknown backend {b:?}")))
                    .collect::<Result<_, _>>()?;
            }
            "ttl" => s.ttl = seconds(name, value)?,
            "window" => s.window = seconds(name, value)?,
            "rounds" => match value.parse() {
                Ok(n) if n > 0 => s.rounds = n,
                _ => return Err(format!("rounds={value:?} is not a positive whole number")),
            },
            "stop_rounds" => match value.parse() {
                Ok(n) => s.stop_rounds = n,
                _ => return Err(format!("stop_rounds={value:?} is not a whole number")),
            },
            "out" => s.out = Some(PathBuf::from(value)),
            "dir" => s.dir = PathBuf::from(value),
            _ => return Err(format!("unknown argument {name:?}")),
        }
    }
    Ok(s)
}

/// The peer's ttl: `dynamodb-lease` takes whole seconds, at least 2.
fn peer_ttl_s(ttl: Duration) -> u32 {
    (ttl.as_secs_f64().round() as u32).max(2)
}

/// The peer's pause between acquire attempts (the crate's default `acquire_cooldown`).
const PEER_ACQUIRE_COOLDOWN: Duration = Duration::from_secs(1);

/// The candidate programs, next to this one.
#[derive(Clone)]
struct Bins {
    candidate: PathBuf,
    peer: PathBuf,
}

/// Where one backend's candidates go.
struct Site {
    backend: Backend,
    /// The emulator's URL, or the file store's directory.
    url: String,
    /// Container, table or bucket (empty for the file store).
    place: String,
    /// Our candidates' timing.
    timing: Timing,
    /// The peer's ttl.
    peer_ttl_s: u32,
    bins: Bins,
    /// The candidates' logs.
    dir: PathBuf,
}

/// What a candidate does besides campaigning.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Nothing: only the elector's requests go to the store.
    Quiet,
    /// Fenced writes every [`WRITE_EVERY`], each sent [`ACT_DELAY`] after its validity check.
    Writer,
}

/// A writer's pause between fenced writes (at least; up to twice that with jitter).
const WRITE_EVERY: Duration = Duration::from_millis(50);
/// A writer's time between its validity check and the send: most of its time, so that a
/// SIGSTOP usually lands between the decision and the act.
const ACT_DELAY: Duration = Duration::from_millis(500);

impl Site {
    /// Finds the emulator and creates a fresh container, table or bucket (a directory for the
    /// file store; for the peer, a table with its schema).
    async fn new(backend: Backend, settings: &Settings, bins: Bins) -> Result<Self, String> {
        let dir = settings.dir.join(backend.name());
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {dir:?}: {e}"))?;
        let (url, place) = match backend {
            Backend::Ours(kind) => prepare(kind, &dir).await?,
            Backend::Peer => prepare_peer_table().await?,
        };
        Ok(Self {
            backend,
            url,
            place,
            timing: Timing::from_ttl(settings.ttl),
            peer_ttl_s: peer_ttl_s(settings.ttl),
            bins,
            dir,
        })
    }

    fn ttl(&self) -> Duration {
        match self.backend {
            Backend::Ours(_) => self.timing.ttl,
            Backend::Peer => Duration::from_secs(self.peer_ttl_s.into()),
        }
    }

    /// A waiting follower's cycle: its longest poll (ours) or acquire cooldown (the peer).
    fn poll_cycle(&self) -> Duration {
        match self.backend {
            Backend::Ours(_) => self.timing.poll_every.mul_f64(1.1),
            Backend::Peer => PEER_ACQUIRE_COOLDOWN,
        }
    }

    /// A holder's cycle: its renew (ours) or extend (the peer) period.
    fn renew_cycle(&self) -> Duration {
        match self.backend {
            Backend::Ours(_) => self.timing.renew_every,
            Backend::Peer => self.ttl() / 2,
        }
    }

    /// How long a new follower takes to try once and settle into waiting.
    fn settle(&self) -> Duration {
        let poll = match self.backend {
            Backend::Ours(_) => self.timing.poll_every.mul_f64(1.1),
            Backend::Peer => PEER_ACQUIRE_COOLDOWN,
        };
        poll + Duration::from_millis(500)
    }

    /// How long to wait for a term that should come.
    fn patience(&self) -> Duration {
        self.ttl() * 2 + Duration::from_secs(15)
    }

    /// Starts candidate `id` for `key`, behind a proxy of its own unless on the file store.
    async fn spawn(&self, key: &str, id: &str, role: Role) -> Result<Candidate, String> {
        let (endpoint, proxy) = proxied(self.backend.kind(), &self.url, 0).await?;
        let (bin, args) = match self.backend {
            Backend::Ours(kind) => {
                let (write_every, act_delay) = match role {
                    // No fenced writes in practice: only the elector's requests are counted.
                    Role::Quiet => (Duration::from_secs(24 * 3600), Duration::ZERO),
                    Role::Writer => (WRITE_EVERY, ACT_DELAY),
                };
                let args = CandidateArgs {
                    backend: kind,
                    endpoint,
                    place: self.place.clone(),
                    key: key.to_owned(),
                    id: id.to_owned(),
                    timing: self.timing,
                    write_every,
                    act_delay,
                };
                (&self.bins.candidate, args.to_args())
            }
            Backend::Peer => (
                &self.bins.peer,
                vec![
                    format!("endpoint={endpoint}"),
                    format!("table={}", self.place),
                    format!("key={key}"),
                    format!("id={id}"),
                    format!("ttl_s={}", self.peer_ttl_s),
                ],
            ),
        };
        let log = self.dir.join(format!("{key}-{id}.jsonl"));
        let stdout = std::fs::File::create(&log).map_err(|e| format!("creating {log:?}: {e}"))?;
        let stderr_path = self.dir.join(format!("{key}-{id}.stderr"));
        let stderr = std::fs::File::create(&stderr_path)
            .map_err(|e| format!("creating {stderr_path:?}: {e}"))?;
        let spawned = mono_us();
        let child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("spawning {bin:?}: {e}"))?;
        Ok(Candidate {
            id: id.to_owned(),
            child,
            log,
            proxy,
            spawned,
            reaped: false,
            killed_at: None,
        })
    }
}

/// A fresh table for the peer on the DynamoDB emulator, with the schema `dynamodb-lease`
/// checks: a string hash key `key`, and time to live on `lease_expiry`. Returns (emulator URL,
/// table).
async fn prepare_peer_table() -> Result<(String, String), String> {
    let endpoint = integration_tests::endpoint(Emulator::DynamoDb)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("the DynamoDB emulator is not available")?;
    let table = integration_tests::unique_name("peer");
    let client = integration_tests::dynamodb::client(&endpoint);
    let sdk = |what: &str, e: &dyn std::error::Error| format!("{what} {table}: {e}");
    client
        .create_table()
        .table_name(&table)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("key")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .map_err(|e| sdk("defining", &e))?,
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("key")
                .key_type(KeyType::Hash)
                .build()
                .map_err(|e| sdk("defining", &e))?,
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .map_err(|e| format!("creating table {table}: {}", DisplayErrorContext(e)))?;
    client
        .update_time_to_live()
        .table_name(&table)
        .time_to_live_specification(
            TimeToLiveSpecification::builder()
                .attribute_name("lease_expiry")
                .enabled(true)
                .build()
                .map_err(|e| sdk("defining the time to live of", &e))?,
        )
        .send()
        .await
        .map_err(|e| {
            format!(
                "enabling time to live on {table}: {}",
                DisplayErrorContext(e)
            )
        })?;
    Ok((endpoint.url, table))
}

/// A running candidate process; killed and reaped when dropped.
struct Candidate {
    id: String,
    child: Child,
    log: PathBuf,
    proxy: Option<Proxy>,
    /// When it was spawned ([`mono_us`]).
    spawned: u64,
    reaped: bool,
    /// When it was sent SIGKILL, if it was ([`mono_us`]): its log's last line may be torn.
    killed_at: Option<u64>,
}

impl Candidate {
    fn read(&self) -> CandidateLog {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        parse_log(&self.id, &text, self.killed_at)
    }

    fn events(&self) -> Vec<Event> {
        self.read().events
    }

    /// When it first logged `ev` after `after` ([`mono_us`]).
    fn logged(&self, ev: &str, after: u64) -> Option<u64> {
        self.events()
            .iter()
            .find(|e| e.ev == ev && e.t > after)
            .map(|e| e.t)
    }

    fn signal(&self, signal: Signal) {
        if let (false, Ok(pid)) = (self.reaped, i32::try_from(self.child.id())) {
            let _ = kill(Pid::from_raw(pid), signal);
        }
    }

    fn exited(&mut self) -> bool {
        self.reaped = self.reaped || matches!(self.child.try_wait(), Ok(Some(_)));
        self.reaped
    }

    fn kill_now(&mut self) {
        if !self.reaped && self.killed_at.is_none() {
            self.killed_at = Some(mono_us());
        }
        self.signal(Signal::SIGKILL);
        if !self.reaped {
            let _ = self.child.wait();
            self.reaped = true;
        }
    }

    /// SIGTERM, then SIGKILL if it has not exited within `limit`.
    async fn stop(&mut self, limit: Duration) {
        self.signal(Signal::SIGCONT);
        self.signal(Signal::SIGTERM);
        if poll(limit, || self.exited().then_some(())).await.is_none() {
            eprintln!(
                "bench: {} did not exit within {limit:?} of SIGTERM",
                self.id
            );
            self.kill_now();
        }
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        self.kill_now();
    }
}

/// `f()` once it is `Some`, checked every `every`; `None` after `limit`.
async fn poll_every<T>(
    every: Duration,
    limit: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> Option<T> {
    tokio::time::timeout(limit, async {
        loop {
            if let Some(v) = f() {
                return v;
            }
            tokio::time::sleep(every).await;
        }
    })
    .await
    .ok()
}

/// `f()` once it is `Some`, checked every 20 ms; `None` after `limit`.
async fn poll<T>(limit: Duration, f: impl FnMut() -> Option<T>) -> Option<T> {
    poll_every(Duration::from_millis(20), limit, f).await
}

fn ms_between(from: u64, to: u64) -> f64 {
    to.saturating_sub(from) as f64 / 1000.0
}

/// Every round's times, in milliseconds.
#[derive(Default)]
struct Samples {
    acquire_from_spawn: Vec<f64>,
    acquire_from_ready: Vec<f64>,
    handover: Vec<f64>,
    release_to_acquire: Vec<f64>,
    failover: Vec<f64>,
}

/// One round on a fresh key: acquire, then handover (SIGTERM), then failover (SIGKILL). What
/// was measured before a failure stays in `samples`.
async fn round(site: &Site, n: usize, samples: &mut Samples, rng: &mut Rng) -> Result<(), String> {
    let key = format!("bench-{n}");
    let patience = site.patience();
    let mut first = site.spawn(&key, "a", Role::Quiet).await?;
    let began = poll(patience, || first.logged(EV_TERM_STARTED, 0))
        .await
        .ok_or_else(|| format!("the first candidate had no term within {patience:?}"))?;
    samples
        .acquire_from_spawn
        .push(ms_between(first.spawned, began));
    if let Some(ready) = first.logged(EV_READY, 0) {
        samples.acquire_from_ready.push(ms_between(ready, began));
    }
    let mut waiting = [
        site.spawn(&key, "b", Role::Quiet).await?,
        site.spawn(&key, "c", Role::Quiet).await?,
    ];
    poll(patience, || {
        waiting
            .iter()
            .all(|c| c.logged(EV_READY, 0).is_some())
            .then_some(())
    })
    .await
    .ok_or("the waiting candidates did not start")?;
    // Let both try once and settle into waiting, then signal at a random point of their
    // poll cycle: a fixed wait would always meet them at the same phase.
    tokio::time::sleep(site.settle()).await;
    tokio::time::sleep(rng.duration(Duration::ZERO, site.poll_cycle())).await;

    let sent = mono_us();
    first.signal(Signal::SIGTERM);
    let (next, took_over) = poll(patience, || {
        waiting
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.logged(EV_TERM_STARTED, sent).map(|t| (i, t)))
            .min_by_key(|&(_, t)| t)
    })
    .await
    .ok_or_else(|| format!("no new leader within {patience:?} of SIGTERM"))?;
    samples.handover.push(ms_between(sent, took_over));
    if let Some(releasing) = first.logged(EV_RELEASING, sent) {
        samples
            .release_to_acquire
            .push(ms_between(releasing, took_over));
    }
    first.stop(site.ttl() + Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    let [b, c] = &mut waiting;
    let (leader, last) = if next == 0 { (b, c) } else { (c, b) };
    // At a random point of the new leader's renew cycle: the failover depends on how long ago
    // its last write was.
    tokio::time::sleep(rng.duration(Duration::ZERO, site.renew_cycle())).await;
    let sent = mono_us();
    leader.kill_now();
    let took_over = poll(patience, || last.logged(EV_TERM_STARTED, sent))
        .await
        .ok_or_else(|| format!("no new leader within {patience:?} of SIGKILL"))?;
    samples.failover.push(ms_between(sent, took_over));
    last.stop(site.ttl() + Duration::from_secs(5)).await;
    Ok(())
}

/// Store requests in the measured window, of the holder and of one follower, by what their
/// price depends on.
struct Requests {
    window: Duration,
    holder: BTreeMap<Exchange, u64>,
    follower: BTreeMap<Exchange, u64>,
}

/// A holder and one waiting follower, left alone for `window`, counted by their proxies.
async fn count_requests(site: &Site, window: Duration) -> Result<Requests, String> {
    let key = "bench-requests";
    let patience = site.patience();
    let mut holder = site.spawn(key, "holder", Role::Quiet).await?;
    poll(patience, || holder.logged(EV_TERM_STARTED, 0))
        .await
        .ok_or_else(|| format!("the holder had no term within {patience:?}"))?;
    let mut follower = site.spawn(key, "follower", Role::Quiet).await?;
    poll(patience, || follower.logged(EV_READY, 0))
        .await
        .ok_or("the follower did not start")?;
    tokio::time::sleep(site.settle()).await;
    fn http(c: &Candidate) -> Option<&integration_tests::proxy::FaultProxy> {
        c.proxy.as_ref().and_then(Proxy::http)
    }
    let (Some(hp), Some(fp)) = (http(&holder), http(&follower)) else {
        return Err("no HTTP proxy to count requests through (file, etcd, ZooKeeper)".to_owned());
    };
    let from = mono_us();
    hp.reset_requests();
    fp.reset_requests();
    let started = tokio::time::Instant::now();
    tokio::time::sleep(window).await;
    let (h, f) = (hp.exchanges(), fp.exchanges());
    let window = started.elapsed();
    if follower.logged(EV_TERM_STARTED, 0).is_some()
        || holder.logged(EV_TERM_STARTED, from).is_some()
    {
        return Err("leadership changed during the window".to_owned());
    }
    let limit = site.ttl() + Duration::from_secs(5);
    follower.stop(limit).await;
    holder.stop(limit).await;
    let named = |counts: BTreeMap<Exchange, u64>| -> BTreeMap<Exchange, u64> {
        let mut out = BTreeMap::new();
        for (mut exchange, n) in counts {
            exchange.kind = exchange.kind.replace(&site.place, "{place}");
            *out.entry(exchange).or_default() += n;
        }
        out
    };
    Ok(Requests {
        window,
        holder: named(h),
        follower: named(f),
    })
}

/// When the leader is stopped: this long after one of its writes was answered (past the
/// pause before the next write, at most `2 * WRITE_EVERY`, inside its act delay).
const STOP_AFTER_WRITE: Duration = Duration::from_millis(250);
/// How long a stopped leader stays stopped beyond the ttl, at least.
const STOP_BEYOND_TTL: Duration = Duration::from_secs(3);
/// How long it stays stopped into the new term, at least: the new leader writes meanwhile, so
/// the protected object knows the new token when the old leader's writes arrive.
const STOP_INTO_NEW_TERM: Duration = Duration::from_secs(2);

/// One SIGSTOP round.
struct StopRound {
    stale: Stale,
    /// From SIGCONT to the old leader's log saying its term ended, ms.
    noticed_ms: Option<f64>,
    /// What the history checker found (the logs and the protected object).
    violations: Vec<String>,
}

/// A leader doing fenced writes is SIGSTOPped until a second candidate's term has begun and
/// longer than the ttl, then SIGCONTed; its writes of the old term sent after the new term
/// began are counted.
async fn stop_round(site: &Site, n: usize) -> Result<StopRound, String> {
    let Backend::Ours(kind) = site.backend else {
        return Err("the peer does no fenced writes".to_owned());
    };
    let key = format!("stop-{n}");
    let patience = site.patience();
    let mut old = site.spawn(&key, "old", Role::Writer).await?;
    let token = poll(patience, || {
        old.events()
            .iter()
            .find(|e| e.ev == EV_TERM_STARTED)
            .map(|e| e.token)
    })
    .await
    .ok_or_else(|| format!("the first candidate had no term within {patience:?}"))?;
    let mut new = site.spawn(&key, "new", Role::Writer).await?;
    poll(patience, || new.logged(EV_READY, 0))
        .await
        .ok_or("the second candidate did not start")?;
    tokio::time::sleep(site.settle()).await;
    // Stop it between a write's decision and its send: a little after one of its writes was
    // answered, past the pause between writes, inside the next write's act delay.
    let settled = mono_us();
    poll_every(Duration::from_millis(5), patience, || {
        old.logged(EV_WRITE, settled)
    })
    .await
    .ok_or("the first candidate did not write")?;
    tokio::time::sleep(STOP_AFTER_WRITE).await;
    let stopped = mono_us();
    old.signal(Signal::SIGSTOP);
    let new_term = poll(patience, || new.logged(EV_TERM_STARTED, stopped))
        .await
        .ok_or_else(|| format!("no new leader within {patience:?} of SIGSTOP"))?;
    let until = (stopped + duration_us(site.ttl() + STOP_BEYOND_TTL))
        .max(new_term + duration_us(STOP_INTO_NEW_TERM));
    tokio::time::sleep(Duration::from_micros(until.saturating_sub(mono_us()))).await;
    let resumed = mono_us();
    old.signal(Signal::SIGCONT);
    let noticed = poll_every(Duration::from_millis(5), patience, || {
        old.events()
            .iter()
            .any(|e| e.ev == EV_TERM_ENDED && e.token == token)
            .then(mono_us)
    })
    .await
    .map(|t| ms_between(resumed, t));
    // Let a write in flight be answered and logged.
    tokio::time::sleep(site.timing.request_timeout + Duration::from_millis(500)).await;
    let stale = stale_writes(&old.events(), token, new_term);
    let limit = site.ttl() + Duration::from_secs(5);
    old.stop(limit).await;
    new.stop(limit).await;
    // The protected object, read directly (no proxy), for the history check.
    let (_, fenced) = open_store(kind, &site.url, &site.place, false)
        .await
        .map_err(|e| format!("opening the store to read the object: {e}"))?;
    let name = ObjectName::new(format!("{key}-object")).map_err(|e| e.to_string())?;
    let object = fenced
        .fenced_read(&name)
        .await
        .map_err(|e| format!("reading the protected object: {e}"))?
        .map(|o| FinalObject {
            fence: o.fence.get(),
            value: String::from_utf8_lossy(&o.value).into_owned(),
        });
    let verdict = check(&[old.read(), new.read()], object.as_ref());
    Ok(StopRound {
        stale,
        noticed_ms: noticed,
        violations: verdict.violations,
    })
}

fn duration_us(d: Duration) -> u64 {
    integration_tests::chaos::duration_us(d)
}

/// Everything measured on one backend.
struct BackendReport {
    backend: Backend,
    rounds_ok: usize,
    samples: Samples,
    failures: Vec<String>,
    requests: Option<Result<Requests, String>>,
    stop_rounds_ok: usize,
    stale: Stale,
    noticed_ms: Vec<f64>,
    /// History-check violations of the stop rounds.
    violations: Vec<String>,
}

async fn bench_backend(backend: Backend, settings: &Settings, bins: Bins) -> BackendReport {
    let name = backend.name();
    let mut report = BackendReport {
        backend,
        rounds_ok: 0,
        samples: Samples::default(),
        failures: Vec::new(),
        requests: None,
        stop_rounds_ok: 0,
        stale: Stale::default(),
        noticed_ms: Vec::new(),
        violations: Vec::new(),
    };
    let site = match Site::new(backend, settings, bins).await {
        Ok(site) => site,
        Err(e) => {
            eprintln!("bench: {name}: {e}");
            report.failures.push(e);
            return report;
        }
    };
    // Where in the followers' and holder's cycles each signal lands.
    let mut rng = Rng::from_entropy();
    for n in 1..=settings.rounds {
        match round(&site, n, &mut report.samples, &mut rng).await {
            Ok(()) => report.rounds_ok += 1,
            Err(e) => report.failures.push(format!("round {n}: {e}")),
        }
        eprintln!(
            "bench: {name} round {n}/{}: {}",
            settings.rounds,
            report.failures.last().map_or("done", String::as_str)
        );
    }
    // Requests are counted by kind by the HTTP proxy; etcd's and ZooKeeper's TCP proxy
    // cannot tell requests apart.
    if backend.kind().http() {
        eprintln!("bench: {name} counting requests for {:?}", settings.window);
        let counted = count_requests(&site, settings.window).await;
        if let Err(e) = &counted {
            report.failures.push(format!("request count: {e}"));
        }
        report.requests = Some(counted);
    }
    if backend == Backend::Peer {
        return report;
    }
    for n in 1..=settings.stop_rounds {
        let outcome = match stop_round(&site, n).await {
            Ok(r) => {
                report.stop_rounds_ok += 1;
                report.stale += r.stale;
                report.noticed_ms.extend(r.noticed_ms);
                report
                    .violations
                    .extend(r.violations.iter().map(|v| format!("stop round {n}: {v}")));
                format!(
                    "{} stale writes, {} accepted",
                    r.stale.attempted, r.stale.accepted
                )
            }
            Err(e) => {
                report.failures.push(format!("stop round {n}: {e}"));
                e
            }
        };
        eprintln!(
            "bench: {name} stop round {n}/{}: {outcome}",
            settings.stop_rounds
        );
    }
    report
}

/// `min / median / max` of `values`, or `-`.
fn spread(values: &[f64]) -> String {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let (Some(min), Some(max)) = (v.first(), v.last()) else {
        return "-".to_owned();
    };
    let mid = v.len() / 2;
    let median = if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    };
    format!("{min:.0} / {median:.0} / {max:.0}")
}

/// A request kind as the tables show it: the kind, Azure's operation, the lease action, a
/// DynamoDB read's consistency, a transaction's size.
fn request_label(e: &Exchange) -> String {
    let mut s = format!("`{}", e.kind);
    if let Some(op) = &e.azure_op {
        let _ = write!(s, "?{op}");
    }
    s.push('`');
    if let Some(action) = &e.lease_action {
        let _ = write!(s, " ({action})");
    }
    match e.consistent_read {
        Some(true) => s.push_str(" (consistent)"),
        Some(false) => s.push_str(" (eventual)"),
        None => {}
    }
    if let Some(n) = e.items {
        let _ = write!(s, " ({n} items)");
    }
    s
}

/// The store's answer as the tables show it.
fn answer_label(e: &Exchange) -> String {
    match (e.status, &e.error) {
        (None, _) => "no answer".to_owned(),
        (Some(304), _) => "304 not modified (billed)".to_owned(),
        (Some(status), Some(code)) => format!("{status} {code}"),
        (Some(status), None) => status.to_string(),
    }
}

/// The cost per hour of one candidate's requests, USD.
fn usd_per_hour(cloud: Cloud, counts: &BTreeMap<Exchange, u64>, window: Duration) -> f64 {
    let hours = window.as_secs_f64() / 3600.0;
    counts
        .iter()
        .map(|(e, n)| cost::charge(cloud, e).usd(*n as f64 / hours))
        .sum()
}

fn usd(v: f64) -> String {
    format!("{v:.6}")
}

/// The target: a waiting follower's request cost at most a fifth of the peer's.
const TARGET_RATIO: f64 = 0.2;

fn render(settings: &Settings, reports: &[BackendReport]) -> String {
    let t = Timing::from_ttl(settings.ttl);
    let peer_ttl = peer_ttl_s(settings.ttl);
    let mut s = String::new();
    let secs = |d: Duration| format!("{:.2} s", d.as_secs_f64());
    let build = if cfg!(debug_assertions) {
        "debug builds"
    } else {
        "release builds"
    };
    let _ = writeln!(
        s,
        "Settings: ttl {} (renew every {}, followers poll every {} (jittered up to 1.1 x), \
         retry a failing store every {} at most, request timeout {}, margin {}: the \
         defaults for that ttl), {} rounds per backend, request window {}, {} stop rounds.\n\n\
         The peer (`dynamo-peer`): the `dynamodb-lease` crate 0.22.1 on the same DynamoDB \
         emulator, with its defaults for a ttl of {peer_ttl} s (whole seconds): extend every \
         {:.1} s, an acquire attempt every 1 s while the lease is held elsewhere; it releases \
         on SIGTERM (src/bin/peer_candidate.rs).\n\n\
         Measured on this machine against the emulators (Azurite, moto for DynamoDB and for \
         `s3`, fake-gcs-server, LocalStack's S3 for `s3-localstack`) and \
         single-member etcd and ZooKeeper servers, on loopback, and the local file store, \
         {build}, all backends at once: today's numbers to compare later work against, not \
         what a cloud region gives.\n",
        secs(t.ttl),
        secs(t.renew_every),
        secs(t.poll_every),
        secs(t.retry_every),
        secs(t.request_timeout),
        secs(t.margin),
        settings.rounds,
        secs(settings.window),
        settings.stop_rounds,
        f64::from(peer_ttl) / 2.0,
    );
    s.push_str(
        "## Latency, ms (min / median / max)\n\n\
         Acquire: one candidate on a free key, from its spawn and from its elector's start \
         (its `ready`) to its term. Handover: two more wait; at a random point of their poll \
         cycle the leader gets SIGTERM and releases; until the first of the two begins its \
         term; release to acquire: from the moment its elector starts to release (the \
         candidate's `releasing`, right before the release is sent) to that term. Failover: \
         at a random point of its renew cycle, that one gets SIGKILL; until the last one's \
         term begins (the lease has to expire).\n\n\
         | backend | rounds ok | acquire (spawn to leader) | acquire (elector start to leader) \
         | handover after SIGTERM | release to acquire | failover after SIGKILL |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for r in reports {
        let _ = writeln!(
            s,
            "| {} | {}/{} | {} | {} | {} | {} | {} |",
            r.backend.name(),
            r.rounds_ok,
            settings.rounds,
            spread(&r.samples.acquire_from_spawn),
            spread(&r.samples.acquire_from_ready),
            spread(&r.samples.handover),
            spread(&r.samples.release_to_acquire),
            spread(&r.samples.failover)
        );
    }
    render_requests(&mut s, reports);
    render_costs(&mut s, reports);
    render_stale(&mut s, settings, reports);
    render_prices(&mut s);
    let failures: Vec<String> = reports
        .iter()
        .flat_map(|r| {
            r.failures
                .iter()
                .chain(&r.violations)
                .map(|f| format!("- {}: {f}", r.backend.name()))
        })
        .collect();
    if !failures.is_empty() {
        s.push_str("\n## Failures\n\n");
        s.push_str(&failures.join("\n"));
        s.push('\n');
    }
    s
}

fn render_requests(s: &mut String, reports: &[BackendReport]) {
    s.push_str(
        "\n## Store requests per hour (one holder, one waiting follower)\n\n\
         Counted by each candidate's proxy over the window and scaled to an hour. A request is \
         the AWS operation, else `METHOD /path` with Azure's `restype`/`comp` and lease \
         action; a DynamoDB read says whether it asked for a strongly consistent read; the \
         answer is the store's status and error code. Each is priced with its cloud's price \
         class (see Prices).\n\n\
         | backend | who | request | answer | in window | per hour | price class \
         | cost per hour (USD) |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in reports {
        let name = r.backend.name();
        let (Some(cloud), Some(requests)) = (r.backend.cloud(), &r.requests) else {
            let why = if r.backend.kind().proxied() {
                "behind a byte-level proxy: not counted by kind"
            } else {
                "no network: not counted"
            };
            let _ = writeln!(s, "| {name} | - | {why} | - | - | - | - | - |");
            continue;
        };
        let req = match requests {
            Ok(req) => req,
            Err(e) => {
                let _ = writeln!(s, "| {name} | - | not counted: {e} | - | - | - | - | - |");
                continue;
            }
        };
        let hours = req.window.as_secs_f64() / 3600.0;
        for (who, counts) in [("holder", &req.holder), ("follower", &req.follower)] {
            for (e, n) in counts {
                let per_hour = *n as f64 / hours;
                let charge = cost::charge(cloud, e);
                let _ = writeln!(
                    s,
                    "| {name} | {who} | {} | {} | {n} | {per_hour:.0} | {} | {} |",
                    request_label(e),
                    answer_label(e),
                    charge.describe(),
                    usd(charge.usd(per_hour))
                );
            }
            let total: u64 = counts.values().sum();
            let _ = writeln!(
                s,
                "| {name} | {who} | **total** | | {total} | {:.0} | | **{}** |",
                total as f64 / hours,
                usd(usd_per_hour(cloud, counts, req.window))
            );
        }
    }
}

fn render_costs(s: &mut String, reports: &[BackendReport]) {
    let per_hour = |r: &BackendReport| -> Option<(f64, f64)> {
        let cloud = r.backend.cloud()?;
        let req = r.requests.as_ref()?.as_ref().ok()?;
        Some((
            usd_per_hour(cloud, &req.holder, req.window),
            usd_per_hour(cloud, &req.follower, req.window),
        ))
    };
    let peer_follower = reports
        .iter()
        .find(|r| r.backend == Backend::Peer)
        .and_then(per_hour)
        .map(|(_, f)| f);
    let _ = write!(
        s,
        "\n## Cost per hour of store requests, USD\n\n\
         The requests above at the prices below: a holder-hour and a follower-hour (one \
         waiting follower; every further follower costs as much again). The last column is \
         the follower's cost relative to the peer's follower on DynamoDB; the target \
         for `dynamo` is at most {TARGET_RATIO} (a fifth). For the others (`s3` too: another \
         service's prices) it compares across services, for scale only.\n\n\
         | backend | holder-hour | follower-hour | follower vs the peer's follower |\n\
         |---|---|---|---|\n"
    );
    for r in reports {
        let Some((holder, follower)) = per_hour(r) else {
            continue;
        };
        let ratio = match peer_follower {
            Some(peer) if peer > 0.0 => {
                let ratio = follower / peer;
                let verdict = match r.backend {
                    Backend::Ours(BackendKind::Dynamo) if ratio <= TARGET_RATIO => " (target met)",
                    Backend::Ours(BackendKind::Dynamo) => " (target missed)",
                    _ => "",
                };
                format!("{ratio:.2}{verdict}")
            }
            _ => "- (the peer was not counted)".to_owned(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {ratio} |",
            r.backend.name(),
            usd(holder),
            usd(follower)
        );
    }
}

fn render_stale(s: &mut String, settings: &Settings, reports: &[BackendReport]) {
    let _ = write!(
        s,
        "\n## Stale actions after SIGSTOP\n\n\
         Per round: a leader doing fenced writes (one every {} ms or so, each sent {} ms after \
         its validity check, like slow work between the decision and the act) is SIGSTOPped \
         {} ms after one of its writes was answered, that is between the next write's \
         decision and its send; a second candidate takes over; the first stays stopped for at least ttl + {} s and \
         {} s into the new term (the new leader writes meanwhile), then gets SIGCONT. Stale \
         writes: writes of the old term sent after the new term began; accepted: those the \
         store acknowledged (must be 0). Noticed: from SIGCONT until the old leader's log says \
         its term ended (its log polled every 5 ms). History check: the chaos checker on both \
         logs and the protected object.\n\n\
         | backend | rounds ok | stale writes attempted | stale writes accepted | fenced \
         | failed or unknown | noticed after SIGCONT, ms (min / median / max) | history check |\n\
         |---|---|---|---|---|---|---|---|\n",
        WRITE_EVERY.as_millis(),
        ACT_DELAY.as_millis(),
        STOP_AFTER_WRITE.as_millis(),
        STOP_BEYOND_TTL.as_secs(),
        STOP_INTO_NEW_TERM.as_secs(),
    );
    for r in reports {
        let name = r.backend.name();
        if r.backend == Backend::Peer {
            let _ = writeln!(
                s,
                "| {name} | n/a: no fenced writes (the crate has no fencing token) | n/a | n/a \
                 | n/a | n/a | n/a | n/a |"
            );
            continue;
        }
        let st = r.stale;
        let check = if r.stop_rounds_ok == 0 {
            "-".to_owned()
        } else if r.violations.is_empty() {
            "ok".to_owned()
        } else {
            format!("{} violations (see Failures)", r.violations.len())
        };
        let _ = writeln!(
            s,
            "| {name} | {}/{} | {} | {} | {} | {} | {} | {check} |",
            r.stop_rounds_ok,
            settings.stop_rounds,
            st.attempted,
            st.accepted,
            st.fenced,
            st.other,
            spread(&r.noticed_ms),
        );
    }
}

fn render_prices(s: &mut String) {
    let _ = write!(
        s,
        "\n## Prices\n\n\
         Published list prices, USD, looked up on {PRICES_READ_ON}; check them before quoting \
         a cost. Request sizes do not matter here (the lease records are far below 1 KB).\n\n\
         | cloud | price class | USD | per | source |\n|---|---|---|---|---|\n"
    );
    for p in &PRICES {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} |",
            p.cloud,
            p.name,
            p.usd,
            thousands(p.per),
            p.source + 1
        );
    }
    s.push_str("\nSources:\n\n");
    for (i, source) in SOURCES.iter().enumerate() {
        let _ = writeln!(s, "{}. {source}", i + 1);
    }
}

/// A whole number with thousands separators: `1,000,000`.
fn thousands(v: f64) -> String {
    let digits = format!("{v:.0}");
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `name`, next to this program.
fn bin_next_to_me(name: &str) -> Result<PathBuf, String> {
    let me = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
    let bin = me.with_file_name(name);
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!(
            "{bin:?} not found: build it with `cargo build -p integration-tests --bins` \
             (with --release for a release build of bench)"
        ))
    }
}

fn bins(settings: &Settings) -> Result<Bins, String> {
    let candidate = bin_next_to_me("chaos_candidate")?;
    let peer = if settings.backends.contains(&Backend::Peer) {
        bin_next_to_me("peer_candidate")?
    } else {
        PathBuf::new()
    };
    Ok(Bins { candidate, peer })
}

fn check_dir(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {dir:?}: {e}"))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let settings = match parse_args(std::env::args().skip(1)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::from(2);
        }
    };
    let setup = bins(&settings).and_then(|bins| check_dir(&settings.dir).map(|()| bins));
    let bins = match setup {
        Ok(bins) => bins,
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!("bench: candidates' logs in {:?}", settings.dir);
    let settings = std::sync::Arc::new(settings);
    let tasks: Vec<_> = settings
        .backends
        .iter()
        .map(|&backend| {
            let (settings, bins) = (settings.clone(), bins.clone());
            tokio::spawn(async move { bench_backend(backend, &settings, bins).await })
        })
        .collect();
    let mut reports = Vec::new();
    for task in tasks {
        match task.await {
            Ok(report) => reports.push(report),
            Err(e) => {
                eprintln!("bench: a backend's task failed: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let text = render(&settings, &reports);
    print!("{text}");
    if let Some(out) = &settings.out
        && let Err(e) = std::fs::write(out, &text)
    {
        eprintln!("bench: writing {out:?}: {e}");
        return ExitCode::FAILURE;
    }
    if reports
        .iter()
        .all(|r| r.failures.is_empty() && r.violations.is_empty())
    {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Result<Settings, String> {
        parse_args(list.iter().map(|s| (*s).to_owned()))
    }

    #[test]
    fn arguments_are_checked() {
        let s = args(&["ttl=15", "rounds=2", "backends=gcs,file"]).unwrap();
        assert_eq!(s.ttl, Duration::from_secs(15));
        assert_eq!(s.rounds, 2);
        assert_eq!(
            s.backends,
            [
                Backend::Ours(BackendKind::Gcs),
                Backend::Ours(BackendKind::File)
            ]
        );
        for bad in [
            "ttl=0",
            "ttl=x",
            "rounds=0",
            "rounds=-1",
            "backends=s4",
            "nope=1",
            "ttl",
            "stop_rounds=-1",
            "stop_rounds=x",
        ] {
            assert!(args(&[bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_peer_runs_right_after_our_dynamodb_by_default() {
        let s = args(&[]).unwrap();
        let names: Vec<_> = s.backends.iter().map(|b| b.name()).collect();
        assert_eq!(
            names,
            [
                "file",
                "azure",
                "dynamo",
                "dynamo-peer",
                "gcs",
                "s3",
                "s3-localstack",
                "etcd",
                "zookeeper"
            ]
        );
        assert_eq!(
            Backend::Ours(BackendKind::S3LocalStack).cloud(),
            Some(Cloud::AwsS3)
        );
        assert_eq!(s.stop_rounds, 3);
        assert_eq!(args(&["stop_rounds=0"]).unwrap().stop_rounds, 0);
        let s = args(&["backends=dynamo-peer"]).unwrap();
        assert_eq!(s.backends, [Backend::Peer]);
        assert_eq!(Backend::Peer.kind(), BackendKind::Dynamo);
        assert_eq!(Backend::Peer.cloud(), Some(Cloud::Aws));
        assert_eq!(Backend::Ours(BackendKind::File).cloud(), None);
    }

    #[test]
    fn the_peer_ttl_is_whole_seconds_of_at_least_two() {
        assert_eq!(peer_ttl_s(Duration::from_secs(15)), 15);
        assert_eq!(peer_ttl_s(Duration::from_millis(2600)), 3);
        assert_eq!(peer_ttl_s(Duration::from_millis(500)), 2);
    }

    #[test]
    fn spread_is_min_median_max() {
        assert_eq!(spread(&[]), "-");
        assert_eq!(spread(&[3.0, 1.0, 2.0]), "1 / 2 / 3");
        assert_eq!(spread(&[4.0, 1.0, 2.0, 10.0]), "1 / 3 / 10");
    }

    #[test]
    fn thousands_are_separated() {
        assert_eq!(thousands(1_000_000.0), "1,000,000");
        assert_eq!(thousands(10_000.0), "10,000");
        assert_eq!(thousands(100.0), "100");
    }

    #[test]
    fn requests_are_labelled_by_what_their_price_depends_on() {
        let get = Exchange {
            kind: "GetItem".to_owned(),
            consistent_read: Some(false),
            status: Some(200),
            ..Exchange::default()
        };
        assert_eq!(request_label(&get), "`GetItem` (eventual)");
        assert_eq!(answer_label(&get), "200");
        let lease = Exchange {
            kind: "PUT /devstoreaccount1/{place}/k".to_owned(),
            azure_op: Some("comp=lease".to_owned()),
            lease_action: Some("acquire".to_owned()),
            status: Some(409),
            error: Some("LeaseAlreadyPresent".to_owned()),
            ..Exchange::default()
        };
        assert_eq!(
            request_label(&lease),
            "`PUT /devstoreaccount1/{place}/k?comp=lease` (acquire)"
        );
        assert_eq!(answer_label(&lease), "409 LeaseAlreadyPresent");
        let lost = Exchange::default();
        assert_eq!(answer_label(&lost), "no answer");
        // One hour of 3600 eventually consistent reads: 1800 RRU at $0.125 per million.
        let counts = BTreeMap::from([(get, 3600)]);
        let v = usd_per_hour(Cloud::Aws, &counts, Duration::from_secs(3600));
        assert!((v - 0.000225).abs() < 1e-12, "{v}");
    }
}
