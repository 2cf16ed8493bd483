//! Deterministic simulation: several candidates on a fault-injecting in-memory store, with
//! frozen processes, crashes, partitions, outages, storms, writes delivered late and clock
//! drift, under paused tokio time.
//!
//! [`run`] plays one seed on a fresh current-thread runtime with paused time and returns the
//! history of what every candidate did and believed, and what the store and the protected
//! resource applied, checked by four independent checkers:
//! 1. [`check_one_leader`]: no two candidates believe they lead at the same instant;
//! 2. [`check_tokens`]: terms' tokens strictly increase and none is issued twice;
//! 3. [`check_fencing`]: the fenced resource never accepts a token below one it accepted
//!    (fenced writes travel through the fault store, with latency, and some arrive late);
//! 4. [`check_liveness`]: no gap without a leader holds a healthy stretch longer than
//!    [`liveness_bound`].
//!
//! # Determinism
//! The same seed plays the same history, event for event ([`Report::history_hash`]): every
//! random choice comes from generators seeded by the seed; time is tokio's paused clock; one
//! thread runs everything; the elector's `select!`s are `biased`. The one source of randomness
//! left in tokio is the order in which a `watch` channel wakes several waiters (it files each
//! in one of eight lists, chosen by the runtime's generator, which is seeded from the OS and
//! cannot be seeded without `tokio_unstable`). So the simulation never has two tasks waiting
//! on one candidate's `Leadership` channel: the observer waits on it and hands each new term
//! to the worker through a `Notify`; the worker then takes the term with `wait_for_term`
//! without waiting (the term is there).
//!
//! A [`NegativeControl`] plants a known bug so that a test can show the checkers catch it.

mod candidate;
mod check;
mod faults;
mod quorum;
mod sharded;
mod world;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, sleep_until, timeout};

pub use crate::quorum::flaw::QuorumFlaw;
pub use crate::shard::ShardFlaw;
pub use check::{
    Gap, Span, check_fencing, check_liveness, check_one_leader, check_tokens, liveness_bound, spans,
};
pub use faults::{FaultControl, Faults, FaultyStore, Late};
pub use quorum::{
    Deletion, QuorumEvent, QuorumReport, QuorumSimConfig, Recovery, check_quorum_liveness,
    check_store_chains, quorum_liveness_bound, run_quorum,
};
pub use sharded::{
    Inst, ShardEvent, ShardReport, ShardSimConfig, check_one_owner, check_settled,
    check_shard_tokens, run_sharded, settle_bound,
};

use candidate::*;
use world::*;

use crate::FencingToken;
use crate::backend::ExpiryModel;
use crate::backend::{
    Changes, Expected, FencedCas, FencedObject, FencedPut, FencedStore, IfChanged, LeaseBackend,
    ObjectWrite, Revision, Stored, WriteKind, WriteOutcome, WriteRequest,
};
use crate::config::Timing;
use crate::elector::{Elector, ElectorHandle, Leadership};
use crate::error::{ConfigError, Error};
use crate::memory::MemoryStore;
use crate::model::{HolderId, LeaseKey, ObjectName};
use crate::rand::Rng;
use crate::term::Term;

/// A deliberate bug, to show that the checkers catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NegativeControl {
    /// No bug: every candidate follows the rules.
    None,
    /// Candidates go on acting for a ttl past their term's deadline, whatever the elector
    /// says (work that trusts a cached term and checks neither the deadline nor the
    /// cancellation).
    IgnoreDeadline,
    /// Candidate 0's clock runs at half speed, far beyond what `margin` covers.
    ExcessiveDrift,
    /// The protected resource ignores fencing tokens: it accepts every write that reaches
    /// it, so a deposed leader's write that arrives late overwrites its successor's.
    UnfencedResource,
    /// Followers poll every `2 x ttl` instead of `poll_every`: leadership is taken over
    /// late.
    LazyFollowers,
    /// The replica that answers followers' reads ([`LeaseBackend::read_if_changed`]) stops
    /// catching up a quarter into the run: followers keep seeing an old record, so a release
    /// or an expiry is not taken over. Caught only if followers really read through it.
    FrozenReplica,
}

impl NegativeControl {
    /// Every planted bug.
    pub const ALL: [NegativeControl; 5] = [
        NegativeControl::IgnoreDeadline,
        NegativeControl::ExcessiveDrift,
        NegativeControl::UnfencedResource,
        NegativeControl::LazyFollowers,
        NegativeControl::FrozenReplica,
    ];
}

/// What to simulate.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SimConfig {
    /// The seed: the same seed plays the same history.
    pub seed: u64,
    /// How many candidates run at once.
    pub candidates: usize,
    /// Simulated time.
    pub duration: Duration,
    /// The lease timing.
    pub timing: Timing,
    /// Each candidate's clock rate is drawn from `1 ± max_drift`.
    pub max_drift: f64,
    /// Latency of a healthy store (uniform up to this, each way).
    pub base_latency: Duration,
    /// Probability that a lease write is delivered late (see [`Faults::late`]); twice that
    /// in a storm.
    pub late_writes: f64,
    /// Probability that a fenced write is delivered late.
    pub late_fenced_writes: f64,
    /// Late writes are held for a time uniform in this range (the low end above the request
    /// timeout plus a re-read).
    pub hold: (Duration, Duration),
    /// Followers' reads ([`LeaseBackend::read_if_changed`]) are answered by a replica that
    /// lags: each read shows the record as it was at an instant drawn uniformly from the last
    /// `replica_lag` (so successive reads may even go back in time), like an eventually
    /// consistent read of DynamoDB. Writes and the reads of a writer stay linearizable.
    pub replica_lag: Duration,
    /// The store hints followers of every change ([`LeaseBackend::changes`]), as the memory
    /// and file stores do; otherwise followers only poll.
    pub change_hints: bool,
    /// A planted bug, or none.
    pub negative: NegativeControl,
}

impl SimConfig {
    /// Three candidates for 60 simulated seconds with a 2 s ttl, 1 % drift, up to 10 ms
    /// latency each way, 3 % of lease writes and 10 % of fenced writes delivered 0.5 s to 3 s
    /// late, followers reading a replica up to 300 ms behind, and change hints on odd seeds.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            candidates: 3,
            duration: Duration::from_secs(60),
            timing: Timing::from_ttl(Duration::from_secs(2)),
            max_drift: 0.01,
            base_latency: Duration::from_millis(10),
            late_writes: 0.03,
            late_fenced_writes: 0.1,
            hold: (Duration::from_millis(500), Duration::from_secs(3)),
            replica_lag: Duration::from_millis(300),
            change_hints: seed % 2 == 1,
            negative: NegativeControl::None,
        }
    }

    /// With a planted bug.
    pub fn with_negative(mut self, negative: NegativeControl) -> Self {
        self.negative = negative;
        self
    }
}

/// A candidate's number in one run (restarted processes get new numbers).
pub type Cand = usize;

/// One entry of the history; `at` is simulated time since the start.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Event {
    Started {
        cand: Cand,
        at: Duration,
    },
    TermStarted {
        cand: Cand,
        token: u64,
        at: Duration,
    },
    /// The candidate stopped believing it leads (its deadline, or the cancellation).
    TermEnded {
        cand: Cand,
        token: u64,
        at: Duration,
    },
    /// The protected resource decided on a fenced write from `cand` as it reached it.
    Write {
        cand: Cand,
        token: u64,
        at: Duration,
        accepted: bool,
    },
    Crashed {
        cand: Cand,
        at: Duration,
    },
    Frozen {
        cand: Cand,
        at: Duration,
        until: Duration,
    },
    /// The process was paused after the store applied its write and answered, before it read
    /// the answer (which it reads when it resumes).
    PausedInFlight {
        cand: Cand,
        at: Duration,
        until: Duration,
    },
    Partitioned {
        cand: Cand,
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
    /// The store holds a write of `cand` and applies it at `until` (the sender times out).
    Held {
        cand: Cand,
        at: Duration,
        until: Duration,
        fenced: bool,
    },
    /// The store applies a write it held (what follows in the log is what it did).
    Delivered {
        cand: Cand,
        at: Duration,
        fenced: bool,
    },
    Resigned {
        cand: Cand,
        at: Duration,
    },
    /// The elector granted a term (seen from outside the process, so even if the process is
    /// frozen before its work starts).
    Granted {
        cand: Cand,
        token: u64,
        at: Duration,
    },
    /// The elector's term ended (seen from outside the process).
    Revoked {
        cand: Cand,
        token: u64,
        at: Duration,
    },
    /// The store applied a write that begins a term (whether or not its writer heard back).
    Applied {
        cand: Cand,
        token: u64,
        at: Duration,
    },
}

/// A broken invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Which checker found it.
    pub checker: &'static str,
    /// What it found.
    pub detail: String,
}

/// The result of one seed.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// Everything that happened, in the order it happened.
    pub events: Vec<Event>,
    /// What the checkers found (empty if all invariants held).
    pub violations: Vec<Violation>,
    /// How many terms began.
    pub terms: usize,
    /// Every gap without a leader, each judged by the liveness checker.
    pub gaps: Vec<Gap>,
}

impl Report {
    /// A hash of the whole history (every event, in order): equal for two runs of one seed.
    pub fn history_hash(&self) -> u64 {
        history_hash(&self.events)
    }

    /// How many writes were delivered late (lease writes, fenced writes).
    pub fn late_writes(&self) -> (usize, usize) {
        let count = |f: bool| {
            self.events
                .iter()
                .filter(|e| matches!(e, Event::Held { fenced, .. } if *fenced == f))
                .count()
        };
        (count(false), count(true))
    }

    /// How many terms began in the store with an acquire delivered late, after its sender
    /// had timed out and re-read.
    pub fn late_acquires(&self) -> usize {
        self.events
            .windows(2)
            .filter(|w| {
                matches!(
                    (&w[0], &w[1]),
                    (
                        Event::Delivered { cand: a, fenced: false, .. },
                        Event::Applied { cand: b, .. },
                    ) if a == b
                )
            })
            .count()
    }
}

/// FNV-1a over the events' debug forms: stable across runs and processes.
pub fn history_hash(events: &[Event]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for e in events {
        for b in format!("{e:?}\n").bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// Plays one seed and checks its history.
pub fn run(config: &SimConfig) -> Report {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build();
    let events = match runtime {
        Ok(rt) => rt.block_on(simulate(config.clone())),
        Err(e) => {
            return Report {
                seed: config.seed,
                events: Vec::new(),
                violations: vec![Violation {
                    checker: "runtime",
                    detail: e.to_string(),
                }],
                terms: 0,
                gaps: Vec::new(),
            };
        }
    };
    let mut violations = Vec::new();
    violations.extend(check_one_leader(&events, config.duration));
    violations.extend(check_tokens(&events));
    violations.extend(check_fencing(&events));
    let (gaps, liveness) = check_liveness(config, &events);
    violations.extend(liveness);
    Report {
        seed: config.seed,
        terms: events
            .iter()
            .filter(|e| matches!(e, Event::TermStarted { .. }))
            .count(),
        events,
        violations,
        gaps,
    }
}

enum Action {
    FreezeLeader(Duration),
    FreezeAnyone(Duration),
    CrashLeader(Duration),
    PartitionLeader(Duration, bool),
    Outage(Duration),
    Storm(Duration),
    ResignLeader,
    /// Pause the leader once its next write (a renew) has been answered.
    PauseLeaderInFlight(Duration),
    /// Pause a follower once its next write (an acquire) has been answered.
    PauseFollowerInFlight(Duration),
    /// Pause the leader briefly once its next renew has been answered (it resumes before
    /// its previous deadline), then cut it off the store.
    PauseLeaderThenCut(Duration, Duration),
}

fn pick_action(rng: &mut Rng, ttl: Duration) -> Action {
    let d = |rng: &mut Rng, lo: f64, hi: f64| rng.duration(ttl.mul_f64(lo), ttl.mul_f64(hi));
    match rng.range_u64(0, 15) {
        0..=2 => Action::FreezeLeader(d(rng, 1.2, 3.0)),
        3 => Action::FreezeAnyone(d(rng, 0.2, 2.0)),
        4 | 5 => Action::CrashLeader(d(rng, 0.2, 1.5)),
        6 | 7 => {
            let hang = rng.chance(0.5);
            Action::PartitionLeader(d(rng, 0.3, 2.0), hang)
        }
        8 => Action::Outage(d(rng, 0.2, 2.0)),
        9 | 10 => Action::Storm(d(rng, 0.5, 3.0)),
        11 => Action::ResignLeader,
        12 => Action::PauseLeaderInFlight(d(rng, 1.2, 3.0)),
        13 | 14 => Action::PauseFollowerInFlight(d(rng, 1.2, 3.0)),
        _ => {
            let pause = d(rng, 0.22, 0.45);
            Action::PauseLeaderThenCut(pause, d(rng, 1.0, 2.0))
        }
    }
}

fn healthy_faults(config: &SimConfig) -> Faults {
    Faults {
        latency: config.base_latency,
        late: config.late_writes,
        hold_min: config.hold.0,
        hold_max: config.hold.1,
        ..Faults::default()
    }
}

/// Where an action aims: the leader (if any), the target (the leader, else anyone), and the
/// simulated time.
#[derive(Clone, Copy)]
struct Aim {
    leader: Option<Cand>,
    target: Option<Cand>,
    now: Duration,
}

/// Plays one action; for a crash, when to start a new candidate.
async fn play(
    world: &Arc<World>,
    running: &mut BTreeMap<Cand, Running>,
    rng: &mut Rng,
    action: Action,
    Aim {
        leader,
        target,
        now,
    }: Aim,
) -> Option<Instant> {
    match action {
        Action::FreezeLeader(d) | Action::FreezeAnyone(d) => {
            if let Some((cand, r)) = target.and_then(|t| running.get(&t).map(|r| (t, r))) {
                freeze(world, cand, &r.gate, d, false);
            }
        }
        Action::PauseLeaderInFlight(_)
        | Action::PauseLeaderThenCut(..)
        | Action::PauseFollowerInFlight(_) => pause(running, rng, action, leader, target),
        Action::CrashLeader(restart_after) => {
            if let Some(target) = target
                && let Some(r) = running.remove(&target)
            {
                r.driver.abort();
                r.worker.abort();
                let _ = r.driver.await;
                let _ = r.worker.await;
                let _ = r.observer.await;
                world.log(Event::Crashed {
                    cand: target,
                    at: now,
                });
                return Some(Instant::now() + restart_after);
            }
        }
        Action::PartitionLeader(..) | Action::Outage(_) | Action::Storm(_) => {
            disturb(world, running, action, target, now);
        }
        Action::ResignLeader => {
            if let Some(r) = leader.and_then(|t| running.get(&t)) {
                let _ = r.resign.try_send(());
            }
        }
    }
    None
}

/// A process paused with an answer in flight (the leader, perhaps then cut off; or a follower).
fn pause(
    running: &BTreeMap<Cand, Running>,
    rng: &mut Rng,
    action: Action,
    leader: Option<Cand>,
    target: Option<Cand>,
) {
    match action {
        Action::PauseLeaderInFlight(d) => {
            if let Some(r) = target.and_then(|t| running.get(&t))
                && !r.gate.is_frozen()
            {
                r.process.arm(Pause {
                    frozen: d,
                    then_cut: None,
                });
            }
        }
        Action::PauseLeaderThenCut(d, cut) => {
            if let Some(r) = leader.and_then(|t| running.get(&t))
                && !r.gate.is_frozen()
            {
                r.process.arm(Pause {
                    frozen: d,
                    then_cut: Some(cut),
                });
            }
        }
        Action::PauseFollowerInFlight(d) => {
            let followers: Vec<&Running> = running
                .iter()
                .filter(|(c, r)| Some(**c) != leader && !r.gate.is_frozen())
                .map(|(_, r)| r)
                .collect();
            let i = rng.range_u64(0, followers.len().saturating_sub(1) as u64) as usize;
            if let Some(r) = followers.get(i) {
                r.process.arm(Pause {
                    frozen: d,
                    then_cut: None,
                });
            }
        }
        _ => {}
    }
}

/// A partition of the target, an outage of the store, or a storm of faults on it.
fn disturb(
    world: &Arc<World>,
    running: &BTreeMap<Cand, Running>,
    action: Action,
    target: Option<Cand>,
    now: Duration,
) {
    match action {
        Action::PartitionLeader(d, hang) => {
            if let Some((cand, r)) = target.and_then(|t| running.get(&t).map(|r| (t, r))) {
                r.control.update(|f| {
                    f.down = !hang;
                    f.hang = hang;
                });
                world.log(Event::Partitioned {
                    cand,
                    at: now,
                    until: now + d,
                });
                let control = r.control.clone();
                tokio::spawn(async move {
                    sleep(d).await;
                    control.set(Faults::default());
                });
            }
        }
        Action::Outage(d) => {
            world.global.update(|f| f.down = true);
            world.log(Event::Outage {
                at: now,
                until: now + d,
            });
            let g = world.global.clone();
            tokio::spawn(async move {
                sleep(d).await;
                g.update(|f| f.down = false);
            });
        }
        Action::Storm(d) => {
            world.global.update(|f| {
                f.latency = Duration::from_millis(150);
                f.fail_before = 0.15;
                f.lose_response = 0.1;
                f.late = world.config.late_writes * 2.0;
            });
            world.log(Event::Storm {
                at: now,
                until: now + d,
            });
            let g = world.global.clone();
            let healthy = healthy_faults(&world.config);
            tokio::spawn(async move {
                sleep(d).await;
                g.update(|f| {
                    f.latency = healthy.latency;
                    f.fail_before = healthy.fail_before;
                    f.lose_response = healthy.lose_response;
                    f.late = healthy.late;
                });
            });
        }
        _ => {}
    }
}

async fn simulate(config: SimConfig) -> Vec<Event> {
    let mut rng = Rng::seeded(config.seed);
    let global = FaultControl::new();
    global.set(healthy_faults(&config));
    let resource = FaultControl::new();
    resource.update(|f| f.late = config.late_fenced_writes);
    let world = Arc::new(World {
        start: Instant::now(),
        events: Mutex::new(Vec::new()),
        store: MemoryStore::new(),
        global: global.clone(),
        resource,
        leaders: Mutex::new(BTreeMap::new()),
        replica: Mutex::new(Replica::new(config.seed)),
        config: config.clone(),
    });
    let ttl = config.timing.ttl;
    let mut running: BTreeMap<Cand, Running> = BTreeMap::new();
    let mut next_cand = 0;
    for _ in 0..config.candidates {
        if let Some(r) = start(&world, next_cand, &mut rng) {
            running.insert(next_cand, r);
        }
        next_cand += 1;
        sleep(rng.duration(Duration::ZERO, Duration::from_millis(100))).await;
    }
    let end = world.start + config.duration;
    let last_action = end.checked_sub(ttl * 4).unwrap_or(world.start);
    let mut restarts: Vec<Instant> = Vec::new();
    let mut next_action = Instant::now() + rng.duration(ttl, ttl * 3);
    loop {
        restarts.sort();
        let next_restart = restarts.first().copied();
        let wake = next_restart.map_or(next_action, |r| r.min(next_action));
        if wake >= end {
            break;
        }
        sleep_until(wake).await;
        if next_restart.is_some_and(|r| r <= Instant::now()) {
            restarts.remove(0);
            if let Some(r) = start(&world, next_cand, &mut rng) {
                running.insert(next_cand, r);
            }
            next_cand += 1;
            continue;
        }
        next_action = Instant::now() + rng.duration(ttl, ttl * 3);
        if Instant::now() >= last_action {
            next_action = end;
            continue;
        }
        let leader = lock(&world.leaders).keys().next().copied();
        let any = {
            let keys: Vec<Cand> = running.keys().copied().collect();
            let i = rng.range_u64(0, keys.len().saturating_sub(1) as u64) as usize;
            keys.get(i).copied()
        };
        let target = leader.or(any);
        let now = world.now();
        let action = pick_action(&mut rng, ttl);
        let at = Aim {
            leader,
            target,
            now,
        };
        if let Some(restart) = play(&world, &mut running, &mut rng, action, at).await {
            restarts.push(restart);
        }
    }
    sleep_until(end).await;
    for r in running.into_values() {
        r.driver.abort();
        r.worker.abort();
        let _ = r.driver.await;
        let _ = r.worker.await;
        r.observer.abort();
        let _ = r.observer.await;
    }

    lock(&world.events).clone()
}
