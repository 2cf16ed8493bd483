//! Deterministic simulation of sharded leadership: several instances of one sharded key on a
//! fault-injecting store whose follower reads lag on every key, with crashes, restarts under
//! the same id, frozen processes, partitions, outages, storms, late writes, joins, graceful
//! leaves and an operator deleting records (shard records, member records, the roster, the
//! token lease, the coordinator lease, the plan), under paused tokio time.
//!
//! Every instance runs a worker per led shard that acts every few milliseconds while its
//! [`Term`](crate::Term) is valid, logging each act. The checkers:
//! 1. [`check_one_owner`]: no two terms of one shard acted in overlapping intervals;
//! 2. [`check_shard_tokens`]: per shard, terms' tokens strictly increase in the order they
//!    acted, and no token serves two terms;
//! 3. liveness and balance: once faults stop, within [`settle_bound`] every shard is led and
//!    the counts are within one of each other.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, sleep_until};

use super::Violation;
use super::faults::{FaultControl, Faults, FaultyStore};
use super::world::{Freezable, Gate, lock};
use crate::backend::{
    FencedCas, FencedObject, FencedPut, IfChanged, LeaseBackend, ObjectWrite, Revision, Stored,
    WriteOutcome, WriteRequest,
};
use crate::config::Timing;
use crate::error::Error;
use crate::fence::FenceGate;
use crate::memory::MemoryStore;
use crate::model::{HolderId, LeaseKey, ObjectName};
use crate::rand::Rng;
use crate::shard::{ShardFlaw, ShardedElector, ShardedHandle};

/// An instance's number in one run (a restart under the same id gets a new number).
pub type Inst = usize;

/// What to simulate.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ShardSimConfig {
    /// The seed: the same seed plays the same history.
    pub seed: u64,
    /// How many instances run at the start.
    pub instances: usize,
    /// How many shards the key has.
    pub shards: u32,
    /// Simulated time.
    pub duration: Duration,
    /// The timing of every instance.
    pub timing: Timing,
    /// Each instance's clock rate is drawn from `1 ± max_drift`.
    pub max_drift: f64,
    /// Latency of a healthy store (uniform up to this, each way).
    pub base_latency: Duration,
    /// Probability that a write (lease or object) is delivered late, held for a time in
    /// `hold`.
    pub late_writes: f64,
    /// The range of holds of late writes.
    pub hold: (Duration, Duration),
    /// Follower reads of every key show it as it was up to this long ago.
    pub replica_lag: Duration,
    /// A planted flaw, or none.
    pub flaw: ShardFlaw,
    /// Workers act for a ttl past their term's deadline, whatever the elector says (work that
    /// trusts a cached term): a planted bug.
    pub ignore_deadline: bool,
}

impl ShardSimConfig {
    /// Three instances of 12 shards for 60 simulated seconds with a 2 s ttl, 1 % drift, up to
    /// 10 ms latency each way, 3 % of writes delivered 0.5 s to 3 s late (until the quiet
    /// stretch at the end, where no fault is played), and follower reads up to 300 ms behind.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            instances: 3,
            shards: 12,
            duration: Duration::from_secs(60),
            timing: Timing::from_ttl(Duration::from_secs(2)),
            max_drift: 0.01,
            base_latency: Duration::from_millis(10),
            late_writes: 0.03,
            hold: (Duration::from_millis(500), Duration::from_secs(3)),
            replica_lag: Duration::from_millis(300),
            flaw: ShardFlaw::None,
            ignore_deadline: false,
        }
    }

    /// With a planted flaw.
    pub fn with_flaw(mut self, flaw: ShardFlaw) -> Self {
        self.flaw = flaw;
        self
    }
}

/// One entry of the history; `at` is simulated time since the start.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum ShardEvent {
    Started {
        inst: Inst,
        id: String,
        at: Duration,
    },
    /// A worker acted for `shard` with `token`, its term valid as it saw it; `admitted`: the
    /// shard's resource took the token.
    Act {
        inst: Inst,
        shard: u32,
        token: u64,
        at: Duration,
        admitted: bool,
    },
    Crashed {
        inst: Inst,
        at: Duration,
    },
    Left {
        inst: Inst,
        at: Duration,
    },
    Frozen {
        inst: Inst,
        at: Duration,
        until: Duration,
    },
    Partitioned {
        inst: Inst,
        at: Duration,
        until: Duration,
    },
    Outage {
        at: Duration,
        until: Duration,
    },
    Storm {
        at: Duration,
        until: Duration,
    },
    Deleted {
        name: String,
        at: Duration,
    },
    /// The led counts of the running instances at the end.
    Final {
        counts: Vec<usize>,
        led: usize,
    },
}

/// The result of one seed.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ShardReport {
    /// The seed.
    pub seed: u64,
    /// Everything that happened, in order.
    pub events: Vec<ShardEvent>,
    /// What the checkers found.
    pub violations: Vec<Violation>,
    /// How many shard terms acted.
    pub terms: usize,
    /// How many acts the shards' resources refused (a lower token after a higher one: fencing
    /// at work, for instance after an operator deleted records).
    pub refused: usize,
}

/// How long after the last fault every shard must be led and the counts balanced.
pub fn settle_bound(config: &ShardSimConfig) -> Duration {
    config.timing.ttl * 5
}

/// Plays one seed and checks its history.
pub fn run_sharded(config: &ShardSimConfig) -> ShardReport {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build();
    let events = match runtime {
        Ok(rt) => rt.block_on(simulate(config.clone())),
        Err(e) => {
            return ShardReport {
                seed: config.seed,
                events: Vec::new(),
                violations: vec![Violation {
                    checker: "runtime",
                    detail: e.to_string(),
                }],
                terms: 0,
                refused: 0,
            };
        }
    };
    let mut violations = check_one_owner(&events);
    violations.extend(check_shard_tokens(&events));
    violations.extend(check_settled(config, &events));
    let terms = terms_of(&events).len();
    let refused = events
        .iter()
        .filter(|e| {
            matches!(
                e,
                ShardEvent::Act {
                    admitted: false,
                    ..
                }
            )
        })
        .count();
    ShardReport {
        seed: config.seed,
        events,
        violations,
        terms,
        refused,
    }
}

/// One term as its acts show it: `(shard, inst, token) -> (first act, last act)`.
fn terms_of(events: &[ShardEvent]) -> BTreeMap<(u32, Inst, u64), (Duration, Duration)> {
    let mut terms: BTreeMap<(u32, Inst, u64), (Duration, Duration)> = BTreeMap::new();
    for e in events {
        if let ShardEvent::Act {
            inst,
            shard,
            token,
            at,
            ..
        } = e
        {
            terms
                .entry((*shard, *inst, *token))
                .and_modify(|t| t.1 = *at)
                .or_insert((*at, *at));
        }
    }
    terms
}

fn per_shard(events: &[ShardEvent]) -> BTreeMap<u32, Vec<(Duration, Duration, Inst, u64)>> {
    let mut by_shard: BTreeMap<u32, Vec<(Duration, Duration, Inst, u64)>> = BTreeMap::new();
    for ((shard, inst, token), (first, last)) in terms_of(events) {
        by_shard
            .entry(shard)
            .or_default()
            .push((first, last, inst, token));
    }
    for terms in by_shard.values_mut() {
        terms.sort();
    }
    by_shard
}

/// No two terms of one shard acted in overlapping intervals.
pub fn check_one_owner(events: &[ShardEvent]) -> Vec<Violation> {
    let mut out = Vec::new();
    for (shard, terms) in per_shard(events) {
        for pair in terms.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if b.0 <= a.1 {
                out.push(Violation {
                    checker: "one owner per shard",
                    detail: format!(
                        "shard {shard}: instance {} (token {}) acted {:?}..{:?}, instance {} \
                         (token {}) from {:?}",
                        a.2, a.3, a.0, a.1, b.2, b.3, b.0
                    ),
                });
            }
        }
    }
    out
}

/// Per shard, tokens strictly increase in the order terms acted; no token serves two terms.
pub fn check_shard_tokens(events: &[ShardEvent]) -> Vec<Violation> {
    let mut out = Vec::new();
    for (shard, terms) in per_shard(events) {
        let mut owners: HashMap<u64, Inst> = HashMap::new();
        for pair in terms.windows(2) {
            if pair[1].3 <= pair[0].3 {
                out.push(Violation {
                    checker: "shard tokens",
                    detail: format!(
                        "shard {shard}: token {} (instance {}) acted after token {} (instance {})",
                        pair[1].3, pair[1].2, pair[0].3, pair[0].2
                    ),
                });
            }
        }
        for t in &terms {
            if let Some(other) = owners.insert(t.3, t.2)
                && other != t.2
            {
                out.push(Violation {
                    checker: "shard tokens",
                    detail: format!(
                        "shard {shard}: token {} served instances {other} and {}",
                        t.3, t.2
                    ),
                });
            }
        }
    }
    out
}

/// At the end (faults stopped a settle bound before), every shard is led and the counts are
/// within one.
pub fn check_settled(config: &ShardSimConfig, events: &[ShardEvent]) -> Vec<Violation> {
    let Some((counts, led)) = events.iter().rev().find_map(|e| match e {
        ShardEvent::Final { counts, led } => Some((counts.clone(), *led)),
        _ => None,
    }) else {
        return vec![Violation {
            checker: "liveness",
            detail: "the run did not finish".to_owned(),
        }];
    };
    let mut out = Vec::new();
    if led != config.shards as usize {
        out.push(Violation {
            checker: "liveness",
            detail: format!(
                "{led} of {} shards led {:?} after the last fault",
                config.shards,
                settle_bound(config)
            ),
        });
    }
    let (max, min) = (
        counts.iter().max().copied().unwrap_or(0),
        counts.iter().min().copied().unwrap_or(0),
    );
    if max > min + 1 {
        out.push(Violation {
            checker: "balance",
            detail: format!("counts {counts:?} after the last fault"),
        });
    }
    out
}

/// One key's records as applied, with the instant each was applied.
type History = VecDeque<(Instant, Option<Stored>)>;

/// The shared store: linearizable reads and writes, and follower reads of every lease key
/// answered from its history up to `lag` ago.
#[derive(Clone, Debug)]
struct Lagging {
    store: MemoryStore,
    lag: Duration,
    history: Arc<Mutex<HashMap<String, History>>>,
    rng: Arc<Mutex<Rng>>,
}

impl Lagging {
    fn record(&self, key: &LeaseKey, stored: Option<Stored>) {
        let now = Instant::now();
        let mut history = lock(&self.history);
        let h = history.entry(key.as_str().to_owned()).or_default();
        h.push_back((now, stored));
        while h.len() > 1 && h[1].0 + self.lag < now {
            h.pop_front();
        }
    }
}

#[async_trait]
impl LeaseBackend for Lagging {
    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        self.store.read(key).await
    }

    async fn read_if_changed(
        &self,
        key: &LeaseKey,
        known: Option<&Revision>,
    ) -> Result<IfChanged, Error> {
        let back = {
            let mut rng = lock(&self.rng);
            rng.duration(Duration::ZERO, self.lag)
        };
        let at = Instant::now()
            .checked_sub(back)
            .unwrap_or_else(Instant::now);
        let seen = {
            let history = lock(&self.history);
            history.get(key.as_str()).map(|h| {
                h.iter()
                    .rev()
                    .find(|(t, _)| *t <= at)
                    .or(h.front())
                    .and_then(|(_, s)| s.clone())
            })
        };
        match seen {
            Some(seen) => Ok(IfChanged::compared(seen, known)),
            // Never written: absent on every replica.
            None => Ok(IfChanged::compared(self.store.read(key).await?, known)),
        }
    }

    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        let key = request.key.clone();
        let outcome = self.store.write(request).await;
        if let Ok(WriteOutcome::Written(stored)) = &outcome {
            self.record(&key, Some(stored.clone()));
        }
        outcome
    }
}

#[async_trait]
impl FencedCas for Lagging {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        self.store.get_fenced(object).await
    }

    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        self.store.put_fenced_if(put).await
    }
}

struct World {
    start: Instant,
    events: Mutex<Vec<ShardEvent>>,
    store: Lagging,
    global: Arc<FaultControl>,
    gates: Vec<FenceGate>,
    config: ShardSimConfig,
}

impl World {
    fn now(&self) -> Duration {
        Instant::now() - self.start
    }

    fn log(&self, e: ShardEvent) {
        lock(&self.events).push(e);
    }
}

struct Running {
    id: String,
    handle: Option<ShardedHandle>,
    gate: Arc<Gate>,
    control: Arc<FaultControl>,
    tasks: Vec<JoinHandle<()>>,
}

/// How often a worker acts while its term is valid.
const ACT_EVERY: Duration = Duration::from_millis(40);

fn healthy(config: &ShardSimConfig) -> Faults {
    Faults {
        latency: config.base_latency,
        late: config.late_writes,
        hold_min: config.hold.0,
        hold_max: config.hold.1,
        ..Faults::default()
    }
}

fn start(world: &Arc<World>, inst: Inst, id: &str, rng: &mut Rng) -> Option<Running> {
    let control = FaultControl::new();
    let gate = Arc::new(Gate::default());
    let store = Arc::new(FaultyStore::new(
        world.store.clone(),
        rng.next_u64(),
        vec![world.global.clone(), control.clone()],
    ));
    let rate = 1.0 + (rng.next_f64() * 2.0 - 1.0) * world.config.max_drift;
    let elector = ShardedElector::builder(store, LeaseKey::new("sim").ok()?, world.config.shards)
        .timing(world.config.timing)
        .holder_id(HolderId::new(id).ok()?)
        .jitter_seed(rng.next_u64())
        .simulated_clock_rate(rate)
        .flaw(world.config.flaw)
        .build()
        .ok()?;
    let (handle, task) = elector.into_parts();
    let driver = tokio::spawn(Freezable {
        inner: task,
        gate: gate.clone(),
    });
    let terms = handle.terms();
    let w = world.clone();
    let worker_gate = gate.clone();
    let workers = tokio::spawn(Freezable {
        inner: Box::pin(async move {
            while let Ok(term) = terms.next().await {
                let Some(shard) = term.shard() else { continue };
                let w = w.clone();
                tokio::spawn(Freezable {
                    inner: Box::pin(async move {
                        let ignore = w.config.ignore_deadline;
                        let ttl = w.config.timing.ttl;
                        loop {
                            // The planted bug: work that trusts a cached term acts for a ttl
                            // past its deadline, whatever the elector says.
                            let go = if ignore {
                                Instant::now() < term.deadline() + ttl
                            } else {
                                term.is_valid()
                            };
                            if !go {
                                break;
                            }
                            let admitted = w
                                .gates
                                .get(shard as usize)
                                .is_some_and(|g| g.admit(term.token()).is_ok());
                            w.log(ShardEvent::Act {
                                inst,
                                shard,
                                token: term.token().0,
                                at: w.now(),
                                admitted,
                            });
                            tokio::select! {
                                biased;
                                _ = term.cancelled(), if !ignore => {}
                                _ = sleep(ACT_EVERY) => {}
                            }
                        }
                    }),
                    gate: worker_gate.clone(),
                });
            }
        }),
        gate: gate.clone(),
    });
    world.log(ShardEvent::Started {
        inst,
        id: id.to_owned(),
        at: world.now(),
    });
    Some(Running {
        id: id.to_owned(),
        handle: Some(handle),
        gate,
        control,
        tasks: vec![driver, workers],
    })
}

async fn simulate(config: ShardSimConfig) -> Vec<ShardEvent> {
    let global = FaultControl::new();
    global.set(healthy(&config));
    let world = Arc::new(World {
        start: Instant::now(),
        events: Mutex::new(Vec::new()),
        store: Lagging {
            store: MemoryStore::new(),
            lag: config.replica_lag,
            history: Arc::default(),
            rng: Arc::new(Mutex::new(Rng::seeded(config.seed ^ 0x1a99))),
        },
        global,
        gates: (0..config.shards).map(|_| FenceGate::new()).collect(),
        config: config.clone(),
    });
    let mut fleet = Fleet {
        rng: Rng::seeded(config.seed),
        ttl: config.timing.ttl,
        world: world.clone(),
        running: BTreeMap::new(),
        next: 0,
        restarts: Vec::new(),
        left: Duration::ZERO,
    };
    for _ in 0..config.instances {
        let id = format!("i{}", fleet.next);
        fleet.start(&id);
        let pause = fleet
            .rng
            .duration(Duration::ZERO, Duration::from_millis(200));
        sleep(pause).await;
    }
    let end = world.start + config.duration;
    let quiet = end
        .checked_sub(settle_bound(&config))
        .unwrap_or(world.start);
    let ttl = fleet.ttl;
    let mut next_action = Instant::now() + fleet.rng.duration(ttl, ttl * 3);
    loop {
        fleet.restarts.sort();
        let wake = fleet
            .restarts
            .first()
            .map_or(next_action, |(t, _)| (*t).min(next_action));
        if wake >= quiet {
            break;
        }
        sleep_until(wake).await;
        if fleet
            .restarts
            .first()
            .is_some_and(|(t, _)| *t <= Instant::now())
        {
            let (_, id) = fleet.restarts.remove(0);
            fleet.start(&id);
            continue;
        }
        next_action = Instant::now() + fleet.rng.duration(ttl, ttl * 3);
        // Every fault ends before the quiet stretch at the end.
        fleet.left = quiet.saturating_duration_since(Instant::now());
        fleet.act().await;
    }
    // Late writes are a fault too: none is sent in the quiet stretch (those held already land
    // within the hold), so that the settle check judges a run whose faults have stopped.
    sleep_until(quiet).await;
    sleep(Duration::from_millis(1)).await; // after a storm ending at `quiet` restored them
    world.global.update(|f| f.late = 0.0);
    sleep_until(end).await;
    fleet.finish().await;
    lock(&world.events).clone()
}

/// The instances of one run, and the faults played on them.
struct Fleet {
    rng: Rng,
    ttl: Duration,
    world: Arc<World>,
    running: BTreeMap<Inst, Running>,
    /// The number of the next instance to start.
    next: Inst,
    /// Instances to start (an id) at an instant.
    restarts: Vec<(Instant, String)>,
    /// How long until the quiet stretch at the end: every fault ends before it.
    left: Duration,
}

impl Fleet {
    fn start(&mut self, id: &str) {
        if let Some(r) = start(&self.world, self.next, id, &mut self.rng) {
            self.running.insert(self.next, r);
        }
        self.next += 1;
    }

    /// A duration of `lo` to `hi` ttls, ending before the quiet stretch.
    fn span(&mut self, lo: f64, hi: f64) -> Duration {
        let ttl = self.ttl;
        self.rng
            .duration(ttl.mul_f64(lo), ttl.mul_f64(hi))
            .min(self.left)
    }

    /// One fault, or a join or leave, on a random instance.
    async fn act(&mut self) {
        let keys: Vec<Inst> = self.running.keys().copied().collect();
        let target = keys
            .get(self.rng.range_u64(0, keys.len().saturating_sub(1) as u64) as usize)
            .copied();
        let now = self.world.now();
        match self.rng.range_u64(0, 11) {
            0 | 1 => self.crash(target, now).await,
            2 | 3 => self.freeze(target, now),
            4 => self.partition(target, now),
            5 => self.outage(now),
            6 => self.storm(now),
            7 => self.leave(target, now).await,
            8 => {
                let id = format!("i{}", 3000 + self.next);
                self.start(&id);
            }
            _ => self.delete_record(target, now),
        }
    }

    /// A crash, restarting later under the same id or a new one.
    async fn crash(&mut self, target: Option<Inst>, now: Duration) {
        let Some(t) = target.filter(|_| self.running.len() > 1) else {
            return;
        };
        let Some(mut r) = self.running.remove(&t) else {
            return;
        };
        for task in r.tasks.drain(..) {
            task.abort();
            let _ = task.await;
        }
        drop(r.handle.take());
        self.world.log(ShardEvent::Crashed { inst: t, at: now });
        let id = if self.rng.chance(0.5) {
            r.id.clone()
        } else {
            format!("i{}", 1000 + self.next)
        };
        let at = Instant::now() + self.span(0.1, 1.5);
        self.restarts.push((at, id));
    }

    fn freeze(&mut self, target: Option<Inst>, now: Duration) {
        if target.and_then(|t| self.running.get(&t)).is_none() {
            return;
        }
        let frozen = self.span(0.3, 3.0);
        let Some(r) = target.and_then(|t| self.running.get(&t)) else {
            return;
        };
        if let Some(generation) = r.gate.freeze() {
            self.world.log(ShardEvent::Frozen {
                inst: target.unwrap_or(0),
                at: now,
                until: now + frozen,
            });
            let gate = r.gate.clone();
            tokio::spawn(async move {
                sleep(frozen).await;
                gate.thaw(generation);
            });
        }
    }

    fn partition(&mut self, target: Option<Inst>, now: Duration) {
        if target.and_then(|t| self.running.get(&t)).is_none() {
            return;
        }
        let cut = self.span(0.3, 2.0);
        let hang = self.rng.chance(0.5);
        let Some(r) = target.and_then(|t| self.running.get(&t)) else {
            return;
        };
        r.control.update(|f| {
            f.down = !hang;
            f.hang = hang;
        });
        self.world.log(ShardEvent::Partitioned {
            inst: target.unwrap_or(0),
            at: now,
            until: now + cut,
        });
        let control = r.control.clone();
        tokio::spawn(async move {
            sleep(cut).await;
            control.set(Faults::default());
        });
    }

    fn outage(&mut self, now: Duration) {
        let out = self.span(0.2, 1.5);
        let global = self.world.global.clone();
        global.update(|f| f.down = true);
        self.world.log(ShardEvent::Outage {
            at: now,
            until: now + out,
        });
        tokio::spawn(async move {
            sleep(out).await;
            global.update(|f| f.down = false);
        });
    }

    fn storm(&mut self, now: Duration) {
        let storm = self.span(0.5, 2.0);
        let config = &self.world.config;
        let late = config.late_writes * 2.0;
        let global = self.world.global.clone();
        global.update(|f| {
            f.latency = Duration::from_millis(150);
            f.fail_before = 0.15;
            f.lose_response = 0.1;
            f.late = late;
        });
        self.world.log(ShardEvent::Storm {
            at: now,
            until: now + storm,
        });
        let healthy = healthy(config);
        tokio::spawn(async move {
            sleep(storm).await;
            global.set(healthy);
        });
    }

    /// A graceful leave; a new instance joins later.
    async fn leave(&mut self, target: Option<Inst>, now: Duration) {
        let Some(t) = target.filter(|_| self.running.len() > 1) else {
            return;
        };
        let Some(mut r) = self.running.remove(&t) else {
            return;
        };
        self.world.log(ShardEvent::Left { inst: t, at: now });
        if let Some(h) = r.handle.take() {
            // Bounded: a frozen or cut instance cannot finish its leave.
            let _ = tokio::time::timeout(self.ttl * 2, h.shutdown()).await;
        }
        for task in r.tasks.drain(..) {
            task.abort();
            let _ = task.await;
        }
        let at = Instant::now() + self.span(0.5, 2.0);
        self.restarts.push((at, format!("i{}", 2000 + self.next)));
    }

    /// The operator deletes a record: a shard's, the token mark, the roster, the coordinator
    /// lease, the plan, or a member's.
    fn delete_record(&mut self, target: Option<Inst>, now: Duration) {
        let world = &self.world;
        let shards = u64::from(world.config.shards);
        let name = match self.rng.range_u64(0, 5) {
            0 => format!("sim.s.{}", self.rng.range_u64(0, shards - 1)),
            1 => "sim.tokens".to_owned(),
            2 => "sim.roster".to_owned(),
            3 => "sim.coord".to_owned(),
            4 => "sim.plan".to_owned(),
            _ => String::new(),
        };
        if (name == "sim.tokens" || name == "sim.coord")
            && let Ok(key) = LeaseKey::new(&name)
        {
            world.store.store.delete(&key);
            world.store.record(&key, None);
            world.log(ShardEvent::Deleted { name, at: now });
        } else if let Ok(object) = ObjectName::new(&name) {
            world.store.store.delete_object(&object);
            world.log(ShardEvent::Deleted { name, at: now });
        } else if let Some(r) = target.and_then(|t| self.running.get(&t)) {
            let key = LeaseKey::new("sim").ok().and_then(|k| {
                let names = crate::shard::records::Names::new(&k).ok()?;
                Some(names.member(&HolderId::new(&r.id).ok()?))
            });
            if let Some(key) = key {
                world.store.store.delete(&key);
                world.store.record(&key, None);
                world.log(ShardEvent::Deleted {
                    name: key.to_string(),
                    at: now,
                });
            }
        }
    }

    /// Logs what the members lead at the end, and stops every instance.
    async fn finish(self) {
        // Members only: a second process with the id of a running one waits, as it should.
        let handles = || self.running.values().filter_map(|r| r.handle.as_ref());
        let counts: Vec<usize> = handles()
            .filter(|h| h.assignment().borrow().member)
            .map(|h| h.led().len())
            .collect();
        let mut led: Vec<u32> = handles().flat_map(|h| h.led().into_keys()).collect();
        led.sort_unstable();
        led.dedup();
        self.world.log(ShardEvent::Final {
            counts,
            led: led.len(),
        });
        for mut r in self.running.into_values() {
            for task in r.tasks.drain(..) {
                task.abort();
                let _ = task.await;
            }
        }
    }
}
