//! One measurement of the members part (`shard_bench members scheme=sharded|single n=N
//! shards=S ttl_ms=T settle_ms=S window_ms=W`), in a process of its own so that its CPU time
//! and memory are its own: `n` instances in this one process, on one shared in-memory store
//! ([`MemoryStore`]), each behind its own counting wrapper ([`Counted`]), in real time with the
//! default timing for the ttl. Prints one JSON [`MembersRun`] line on stdout.
//!
//! - **sharded**: `n` sharded electors share `shards` shards. Once they have converged and
//!   settled, each instance's store calls over the window, the coordinator's apart (the holder
//!   of the `<key>.coord` lease, where the code has one); then one more instance joins, one
//!   member that is not the coordinator crashes, then the coordinator crashes, each time until
//!   every shard is led again with counts within one. A crash aborts the instance's task where
//!   it stands, as a SIGKILL would: no release, and no store call afterwards (checked).
//! - **single**: `n` instances hold `shards / n` single-key electors each (one lease per
//!   shard); their store calls over the window.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use leader_core::backend::LeaseState;
use leader_core::{
    Elector, ElectorHandle, HolderId, LeaseBackend, LeaseKey, MemoryStore, ShardTerms,
    ShardedElector, ShardedHandle, Timing,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{Instant, sleep, timeout};

use crate::counted::{Calls, Counted};
use crate::member::single_key;
use crate::usage::{cpu_us, rss_kib};

/// The key of the sharded electors.
const KEY: &str = "members";

/// Checks for convergence this often.
const CHECK: Duration = Duration::from_millis(20);

/// Which scheme a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scheme {
    /// Sharded electors.
    Sharded,
    /// One single-key elector per shard.
    Single,
}

impl Scheme {
    /// Its name on the command line and in [`MembersRun::scheme`].
    pub(crate) fn name(self) -> &'static str {
        match self {
            Scheme::Sharded => "sharded",
            Scheme::Single => "single",
        }
    }
}

/// The arguments of `shard_bench members`.
#[derive(Clone, Debug)]
pub(crate) struct MembersArgs {
    /// The scheme.
    pub(crate) scheme: Scheme,
    /// Instances at the start.
    pub(crate) n: usize,
    /// Shards (keys, in the single scheme).
    pub(crate) shards: u32,
    /// Lease duration.
    pub(crate) ttl: Duration,
    /// Wait after convergence before the window.
    pub(crate) settle: Duration,
    /// The window.
    pub(crate) window: Duration,
}

impl MembersArgs {
    /// The command-line arguments that [`parse`](Self::parse) reads back.
    pub(crate) fn to_args(&self) -> Vec<String> {
        vec![
            format!("scheme={}", self.scheme.name()),
            format!("n={}", self.n),
            format!("shards={}", self.shards),
            format!("ttl_ms={}", self.ttl.as_millis()),
            format!("settle_ms={}", self.settle.as_millis()),
            format!("window_ms={}", self.window.as_millis()),
        ]
    }

    /// Parses `name=value` arguments.
    ///
    /// # Errors
    /// A message naming a bad argument.
    pub(crate) fn parse(args: impl IntoIterator<Item = String>) -> Result<Self, String> {
        let mut a = MembersArgs {
            scheme: Scheme::Sharded,
            n: 4,
            shards: 1024,
            ttl: Duration::from_secs(15),
            settle: Duration::from_secs(10),
            window: Duration::from_secs(60),
        };
        for arg in args {
            let Some((name, value)) = arg.split_once('=') else {
                return Err(format!("argument {arg:?} is not name=value"));
            };
            let number = || {
                value
                    .parse::<u64>()
                    .ok()
                    .filter(|v| *v > 0)
                    .ok_or_else(|| format!("{name}={value:?} is not a positive whole number"))
            };
            match name {
                "scheme" => {
                    a.scheme = match value {
                        "sharded" => Scheme::Sharded,
                        "single" => Scheme::Single,
                        _ => return Err(format!("unknown scheme {value:?}")),
                    }
                }
                "n" => a.n = usize::try_from(number()?).map_err(|e| e.to_string())?,
                "shards" => a.shards = u32::try_from(number()?).map_err(|e| e.to_string())?,
                "ttl_ms" => a.ttl = Duration::from_millis(number()?),
                "settle_ms" => a.settle = Duration::from_millis(number()?),
                "window_ms" => a.window = Duration::from_millis(number()?),
                _ => return Err(format!("unknown argument {name:?}")),
            }
        }
        Ok(a)
    }
}

/// Store calls per hour of one instance (or a mean of several).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct PerHour {
    /// By method, in the order of [`Calls::fields`].
    pub(crate) by_method: [f64; 8],
    /// Every read.
    pub(crate) reads: f64,
    /// Every write.
    pub(crate) writes: f64,
}

impl PerHour {
    fn of(c: &Calls, secs: f64) -> Self {
        let scale = if secs > 0.0 { 3600.0 / secs } else { 0.0 };
        Self {
            by_method: c.fields().map(|(_, v)| v as f64 * scale),
            reads: c.reads() as f64 * scale,
            writes: c.writes() as f64 * scale,
        }
    }

    fn mean<'a>(all: impl IntoIterator<Item = &'a PerHour>) -> Self {
        let mut out = PerHour::default();
        let mut k = 0.0;
        for r in all {
            for (sum, v) in out.by_method.iter_mut().zip(r.by_method) {
                *sum += v;
            }
            out.reads += r.reads;
            out.writes += r.writes;
            k += 1.0;
        }
        if k > 0.0 {
            out.by_method = out.by_method.map(|v| v / k);
            out.reads /= k;
            out.writes /= k;
        }
        out
    }
}

/// Calls per hour of a group of instances: the mean and the spread.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Group {
    /// Instances in the group.
    pub(crate) count: usize,
    /// The mean of one instance.
    pub(crate) mean: PerHour,
    /// The fewest and most reads per hour of one instance.
    pub(crate) reads_min: f64,
    /// See [`reads_min`](Self::reads_min).
    pub(crate) reads_max: f64,
    /// The fewest and most writes per hour of one instance.
    pub(crate) writes_min: f64,
    /// See [`writes_min`](Self::writes_min).
    pub(crate) writes_max: f64,
}

impl Group {
    fn of(rates: &[&PerHour]) -> Self {
        let fold = |f: fn(&PerHour) -> f64, pick: fn(f64, f64) -> f64| {
            rates.iter().map(|r| f(r)).reduce(pick).unwrap_or(0.0)
        };
        Self {
            count: rates.len(),
            mean: PerHour::mean(rates.iter().copied()),
            reads_min: fold(|r| r.reads, f64::min),
            reads_max: fold(|r| r.reads, f64::max),
            writes_min: fold(|r| r.writes, f64::min),
            writes_max: fold(|r| r.writes, f64::max),
        }
    }
}

/// A convergence: how long, how many shard terms began meanwhile, the counts at the end.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Conv {
    /// From the event to every shard led by one live instance, counts within one, s.
    pub(crate) secs: f64,
    /// Shard terms that began meanwhile.
    pub(crate) moved: u64,
    /// The fewest and most shards an instance led at the end.
    pub(crate) lo: usize,
    /// See [`lo`](Self::lo).
    pub(crate) hi: usize,
}

/// What one members run measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct MembersRun {
    /// `sharded` or `single`.
    pub(crate) scheme: String,
    /// Instances at the start.
    pub(crate) n: usize,
    /// Shards (keys).
    pub(crate) shards: u32,
    /// The timing in force: poll period, renew period, ttl, s.
    pub(crate) poll_s: f64,
    /// See [`poll_s`](Self::poll_s).
    pub(crate) renew_s: f64,
    /// See [`poll_s`](Self::poll_s).
    pub(crate) ttl_s: f64,
    /// Waited after the take before the window, s.
    pub(crate) settle_s: f64,
    /// The window as measured, s.
    pub(crate) window_s: f64,
    /// From the start to every shard (key) led, counts within one.
    pub(crate) take: Option<Conv>,
    /// The coordinator in the window (the holder of `<key>.coord`); `None` if there is none.
    pub(crate) coordinator: Option<String>,
    /// The coordinator's calls per hour.
    pub(crate) coord: Option<PerHour>,
    /// The other instances (every instance if there is no coordinator).
    pub(crate) members: Group,
    /// Every instance.
    pub(crate) fleet: Group,
    /// Shard terms that began or ended in the window (0: nothing changed hands).
    pub(crate) changes: u64,
    /// CPU time of the whole process in the window, % of one core.
    pub(crate) cpu_pct: f64,
    /// Resident set before the instances started, and at the window's end, KiB.
    pub(crate) rss_before_kib: u64,
    /// See [`rss_before_kib`](Self::rss_before_kib).
    pub(crate) rss_end_kib: u64,
    /// One more instance joins.
    pub(crate) join: Option<Conv>,
    /// A member that is not the coordinator crashes.
    pub(crate) crash_member: Option<Conv>,
    /// The coordinator crashes (until a new one holds the lease, too).
    pub(crate) crash_coord: Option<Conv>,
    /// Store calls the crashed instances made after their crash (must be 0).
    pub(crate) calls_after_crash: u64,
    /// What else was seen.
    pub(crate) notes: Vec<String>,
    /// Set if something failed.
    pub(crate) error: String,
}

/// Runs one measurement.
pub(crate) async fn run(a: &MembersArgs) -> MembersRun {
    let timing = Timing::from_ttl(a.ttl);
    let mut out = MembersRun {
        scheme: a.scheme.name().to_owned(),
        n: a.n,
        shards: a.shards,
        poll_s: timing.poll_every.as_secs_f64(),
        renew_s: timing.renew_every.as_secs_f64(),
        ttl_s: a.ttl.as_secs_f64(),
        settle_s: a.settle.as_secs_f64(),
        ..MembersRun::default()
    };
    let result = match a.scheme {
        Scheme::Sharded => sharded(a, &mut out).await,
        Scheme::Single => single(a, &mut out).await,
    };
    if let Err(e) = result {
        out.error = e;
    }
    out
}

/// Shard terms handed out and ended, over every instance.
#[derive(Debug, Default)]
struct TermCount {
    begun: AtomicU64,
    ended: AtomicU64,
}

impl TermCount {
    fn begun(&self) -> u64 {
        self.begun.load(Ordering::Relaxed)
    }

    fn changes(&self) -> u64 {
        self.begun() + self.ended.load(Ordering::Relaxed)
    }
}

/// Takes every term handed out and drops it when it ends, like well-behaved work.
async fn hold(terms: ShardTerms, count: Arc<TermCount>) {
    while let Ok(term) = terms.next().await {
        count.begun.fetch_add(1, Ordering::Relaxed);
        let count = count.clone();
        tokio::spawn(async move {
            term.cancelled().await;
            count.ended.fetch_add(1, Ordering::Relaxed);
            drop(term);
        });
    }
}

/// One sharded instance: its own counted store, its handle, and its task.
struct Instance {
    id: String,
    store: Arc<Counted>,
    handle: ShardedHandle,
    task: JoinHandle<()>,
}

impl Instance {
    fn start(
        shared: &MemoryStore,
        a: &MembersArgs,
        id: String,
        count: &Arc<TermCount>,
    ) -> Result<Self, String> {
        let store = Arc::new(Counted::new(shared.clone()));
        let key = LeaseKey::new(KEY).map_err(|e| e.to_string())?;
        let (handle, task) = ShardedElector::builder(store.clone(), key, a.shards)
            .ttl(a.ttl)
            .holder_id(HolderId::new(id.clone()).map_err(|e| e.to_string())?)
            .build()
            .map_err(|e| e.to_string())?
            .into_parts();
        let task = tokio::spawn(task);
        tokio::spawn(hold(handle.terms(), count.clone()));
        Ok(Self {
            id,
            store,
            handle,
            task,
        })
    }

    /// Crashes it, as a SIGKILL would: its task is dropped where it stands (no release, no
    /// shutdown). Returns its store and the calls it had made, to check that none follows.
    async fn crash(self) -> (Arc<Counted>, Calls) {
        self.task.abort();
        let _ = self.task.await;
        let calls = self.store.calls();
        drop(self.handle); // its task is gone: nothing left to shut down
        (self.store, calls)
    }
}

/// The holder of the coordinator lease, if it is held (there is none in the first design).
async fn coordinator(shared: &MemoryStore) -> Option<String> {
    let key = LeaseKey::new(format!("{KEY}.coord")).ok()?;
    let stored = shared.read(&key).await.ok()??;
    (stored.record.state == LeaseState::Held).then(|| stored.record.holder.as_str().to_owned())
}

/// The shard counts of `live` if every shard is led by exactly one of them, the counts within
/// one of each other.
fn converged(live: &[Instance], shards: u32) -> Option<(usize, usize)> {
    let mut seen = BTreeSet::new();
    let mut counts = Vec::with_capacity(live.len());
    for inst in live {
        let led = inst.handle.led();
        counts.push(led.len());
        for s in led.into_keys() {
            if !seen.insert(s) {
                return None;
            }
        }
    }
    let (lo, hi) = (*counts.iter().min()?, *counts.iter().max()?);
    (seen.len() == shards as usize && hi - lo <= 1).then_some((lo, hi))
}

/// What the members of a sharded run share.
struct Fleet {
    shared: MemoryStore,
    count: Arc<TermCount>,
    live: Vec<Instance>,
    crashed: Vec<(String, Arc<Counted>, Calls)>,
    shards: u32,
}

impl Fleet {
    /// Waits until the live instances have converged (and, if `dead_coord` is set, a live
    /// instance other than it holds the coordinator lease); timed from `since`.
    async fn converge(
        &self,
        since: Instant,
        within: Duration,
        what: &str,
        dead_coord: Option<&str>,
    ) -> Result<Conv, String> {
        let begun = self.count.begun();
        loop {
            if let Some((lo, hi)) = converged(&self.live, self.shards) {
                let coord_ok = match dead_coord {
                    None => true,
                    Some(dead) => coordinator(&self.shared)
                        .await
                        .is_some_and(|c| c != dead && self.live.iter().any(|i| i.id == c)),
                };
                if coord_ok {
                    return Ok(Conv {
                        secs: since.elapsed().as_secs_f64(),
                        moved: self.count.begun() - begun,
                        lo,
                        hi,
                    });
                }
            }
            if since.elapsed() >= within {
                let counts: Vec<usize> = self.live.iter().map(|i| i.handle.led().len()).collect();
                return Err(format!(
                    "{what}: not converged within {} s (led: {counts:?}, coordinator: {:?})",
                    within.as_secs(),
                    coordinator(&self.shared).await
                ));
            }
            sleep(CHECK).await;
        }
    }

    /// Crashes the live instance `id` right after its next membership renew; waits until the
    /// others have converged.
    async fn crash(
        &mut self,
        id: &str,
        is_coord: bool,
        renew_every: Duration,
    ) -> Result<Conv, String> {
        let at = self
            .live
            .iter()
            .position(|i| i.id == id)
            .ok_or_else(|| format!("no live instance {id}"))?;
        after_renew(&self.live[at], renew_every + Duration::from_secs(5)).await?;
        let victim = self.live.remove(at);
        let since = Instant::now();
        let (store, calls) = victim.crash().await;
        self.crashed.push((id.to_owned(), store, calls));
        let what = format!("after the crash of {id}");
        self.converge(
            since,
            Duration::from_secs(180),
            &what,
            is_coord.then_some(id),
        )
        .await
    }

    /// Shuts every live instance down, all at once.
    async fn shutdown(&mut self) {
        let mut set = JoinSet::new();
        for inst in self.live.drain(..) {
            set.spawn(inst.handle.shutdown());
        }
        let all = async { while set.join_next().await.is_some() {} };
        let _ = timeout(Duration::from_secs(60), all).await;
    }
}

/// Waits for the next membership renew of `inst`, and a moment more for what follows it (a
/// coordinator renews its lease right after its membership): a crash then leaves its records
/// a whole ttl to run, so that crash times compare across runs and designs.
async fn after_renew(inst: &Instance, within: Duration) -> Result<(), String> {
    let (before, since) = (inst.store.calls().renew, Instant::now());
    while inst.store.calls().renew == before {
        if since.elapsed() >= within {
            return Err(format!(
                "{} did not renew within {} s",
                inst.id,
                within.as_secs()
            ));
        }
        sleep(Duration::from_millis(2)).await;
    }
    sleep(Duration::from_millis(20)).await;
    Ok(())
}

/// The store calls of every instance in a window, and the process's CPU time.
struct Window {
    secs: f64,
    calls: Vec<Calls>,
    cpu_pct: f64,
    changes: u64,
}

async fn window(stores: &[Arc<Counted>], count: &TermCount, length: Duration) -> Window {
    let (w0, cpu0, changes0) = (Instant::now(), cpu_us(), count.changes());
    let calls0: Vec<Calls> = stores.iter().map(|s| s.calls()).collect();
    sleep(length).await;
    let calls1: Vec<Calls> = stores.iter().map(|s| s.calls()).collect();
    let (cpu1, elapsed_us) = (cpu_us(), w0.elapsed().as_micros() as f64);
    Window {
        secs: elapsed_us / 1e6,
        calls: calls1
            .iter()
            .zip(&calls0)
            .map(|(b, a)| b.since(a))
            .collect(),
        cpu_pct: cpu1.saturating_sub(cpu0) as f64 / elapsed_us * 100.0,
        changes: count.changes() - changes0,
    }
}

/// Fills the window's figures into `out`; `coord` is the coordinator's index, if any.
fn fill(out: &mut MembersRun, w: &Window, coord: Option<usize>) {
    let rates: Vec<PerHour> = w.calls.iter().map(|c| PerHour::of(c, w.secs)).collect();
    out.window_s = w.secs;
    out.cpu_pct = w.cpu_pct;
    out.changes = w.changes;
    out.rss_end_kib = rss_kib();
    out.coord = coord.map(|i| rates[i].clone());
    let others: Vec<&PerHour> = rates
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != coord)
        .map(|(_, r)| r)
        .collect();
    out.members = Group::of(&others);
    out.fleet = Group::of(&rates.iter().collect::<Vec<_>>());
}

async fn sharded(a: &MembersArgs, out: &mut MembersRun) -> Result<(), String> {
    out.rss_before_kib = rss_kib();
    let mut fleet = Fleet {
        shared: MemoryStore::new(),
        count: Arc::new(TermCount::default()),
        live: Vec::new(),
        crashed: Vec::new(),
        shards: a.shards,
    };
    let result = sharded_phases(a, out, &mut fleet).await;
    for (id, store, calls) in &fleet.crashed {
        let after = store.calls().since(calls);
        let late = after.reads() + after.writes();
        out.calls_after_crash += late;
        if late > 0 {
            out.notes.push(format!(
                "{id} made {late} store calls after its crash ({} writes)",
                after.writes()
            ));
        }
    }
    fleet.shutdown().await;
    result
}

async fn sharded_phases(
    a: &MembersArgs,
    out: &mut MembersRun,
    fleet: &mut Fleet,
) -> Result<(), String> {
    let start = Instant::now();
    for i in 0..a.n {
        let inst = Instance::start(&fleet.shared, a, format!("m{i}"), &fleet.count)?;
        fleet.live.push(inst);
    }
    progress(a, "take");
    out.take = Some(
        fleet
            .converge(start, Duration::from_secs(600), "the take", None)
            .await?,
    );
    sleep(a.settle).await;
    progress(a, "window");
    let before = coordinator(&fleet.shared).await;
    let stores: Vec<Arc<Counted>> = fleet.live.iter().map(|i| i.store.clone()).collect();
    let w = window(&stores, &fleet.count, a.window).await;
    let coord = coordinator(&fleet.shared).await;
    if before != coord {
        out.notes.push(format!(
            "the coordinator changed in the window: {before:?} -> {coord:?}"
        ));
    }
    let at = coord
        .as_ref()
        .and_then(|c| fleet.live.iter().position(|i| i.id == *c));
    fill(out, &w, at);
    out.coordinator = coord;

    progress(a, "join");
    let since = Instant::now();
    let inst = Instance::start(&fleet.shared, a, format!("m{}", a.n), &fleet.count)?;
    fleet.live.push(inst);
    let within = Duration::from_secs(180);
    out.join = Some(
        fleet
            .converge(since, within, "after the join", None)
            .await?,
    );
    sleep(Duration::from_secs(2)).await;

    progress(a, "crash of a member");
    let coord = coordinator(&fleet.shared).await;
    let victim = fleet
        .live
        .iter()
        .map(|i| i.id.clone())
        .find(|id| Some(id) != coord.as_ref())
        .ok_or("no member to crash")?;
    let renew_every = Timing::from_ttl(a.ttl).renew_every;
    out.crash_member = Some(fleet.crash(&victim, false, renew_every).await?);
    sleep(Duration::from_secs(2)).await;

    let coord = coordinator(&fleet.shared).await;
    match coord {
        Some(c) if fleet.live.len() > 1 && fleet.live.iter().any(|i| i.id == c) => {
            progress(a, "crash of the coordinator");
            out.crash_coord = Some(fleet.crash(&c, true, renew_every).await?);
            sleep(Duration::from_secs(2)).await;
        }
        _ => out.notes.push(
            "no coordinator lease held (the first design has none): no coordinator crash"
                .to_owned(),
        ),
    }
    Ok(())
}

/// Takes every term of one single-key elector, holds it until it ends; on `stop`, drops the
/// term and shuts the elector down (releasing the lease).
async fn hold_single(
    handle: ElectorHandle,
    count: Arc<TermCount>,
    held: Arc<AtomicU64>,
    mut stop: watch::Receiver<bool>,
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
        count.begun.fetch_add(1, Ordering::Relaxed);
        held.fetch_add(1, Ordering::Relaxed);
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => {}
            _ = term.cancelled() => {}
        }
        held.fetch_sub(1, Ordering::Relaxed);
        count.ended.fetch_add(1, Ordering::Relaxed);
        drop(term);
        if *stop.borrow() {
            break;
        }
    }
    handle.shutdown().await;
}

async fn single(a: &MembersArgs, out: &mut MembersRun) -> Result<(), String> {
    out.rss_before_kib = rss_kib();
    let shared = MemoryStore::new();
    let count = Arc::new(TermCount::default());
    let held = Arc::new(AtomicU64::new(0));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let mut stores = Vec::new();
    // Started one after the other over one renew period, as in the fleet part, so that their
    // renews spread out.
    let spread = Timing::from_ttl(a.ttl).renew_every;
    let n = u32::try_from(a.n).map_err(|e| e.to_string())?;
    let start = Instant::now();
    for i in 0..n {
        let store = Arc::new(Counted::new(shared.clone()));
        let holder = HolderId::new(format!("k{i}")).map_err(|e| e.to_string())?;
        let (first, next) = (a.shards * i / n, a.shards * (i + 1) / n);
        for k in first..next {
            let key = LeaseKey::new(single_key(k)).map_err(|e| e.to_string())?;
            let leases: Arc<dyn LeaseBackend> = store.clone();
            let elector = Elector::builder(leases, key)
                .ttl(a.ttl)
                .holder_id(holder.clone())
                .build()
                .map_err(|e| e.to_string())?;
            let delay = spread.mul_f64(f64::from(k - first) / f64::from((next - first).max(1)));
            let (count, held, stop) = (count.clone(), held.clone(), stop_rx.clone());
            tasks.spawn(async move {
                sleep(delay).await;
                hold_single(elector.spawn(), count, held, stop).await;
            });
        }
        stores.push(store);
    }
    progress(a, "take");
    let all = u64::from(a.shards);
    let result = async {
        while held.load(Ordering::Relaxed) < all {
            if start.elapsed() > Duration::from_secs(300) {
                return Err(format!(
                    "{} of {all} keys led after 300 s",
                    held.load(Ordering::Relaxed)
                ));
            }
            sleep(CHECK).await;
        }
        out.take = Some(Conv {
            secs: start.elapsed().as_secs_f64(),
            moved: count.begun(),
            ..Conv::default()
        });
        sleep(a.settle).await;
        progress(a, "window");
        let w = window(&stores, &count, a.window).await;
        fill(out, &w, None);
        Ok(())
    }
    .await;
    let _ = stop_tx.send(true);
    let stopped = async { while tasks.join_next().await.is_some() {} };
    let _ = timeout(Duration::from_secs(60), stopped).await;
    result
}

fn progress(a: &MembersArgs, what: &str) {
    #[allow(clippy::print_stderr, reason = "progress of a long benchmark")]
    {
        eprintln!(
            "[shard_bench] members, {} x {}: {what}",
            a.n,
            a.scheme.name()
        );
    }
}
