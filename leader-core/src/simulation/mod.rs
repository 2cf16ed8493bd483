//! Deterministic simulation: several candidates on a fault-injecting in-memory store, with
//! frozen processes, crashes, partitions, outages and clock drift, under paused tokio time.
//!
//! [`run`] plays one seed on a fresh current-thread runtime with paused time and returns the
//! history of what every candidate did and believed, checked by four independent checkers:
//! 1. [`check_one_leader`]: no two candidates believe they lead at the same instant;
//! 2. [`check_tokens`]: terms' tokens strictly increase and none is issued twice;
//! 3. [`check_fencing`]: the fenced resource never accepts a token below one it accepted;
//! 4. [`check_liveness`]: with the store healthy, a new leader appears within
//!    `ttl + retry_every` (plus requests) of the previous term ending.
//!
//! The same seed gives the same history. A [`NegativeControl`] plants a known bug (a
//! candidate that ignores its deadline, or a clock drifting beyond what `margin` covers) so
//! that a test can show the checkers catch it.

mod faults;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, sleep_until};

pub use faults::{FaultControl, Faults, FaultyStore};

use crate::backend::FencedStore;
use crate::config::Timing;
use crate::elector::{Elector, ElectorHandle};
use crate::memory::MemoryStore;
use crate::model::{HolderId, LeaseKey, ObjectName};
use crate::rand::Rng;

/// A deliberate bug, to show that the checkers catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NegativeControl {
    /// No bug: every candidate follows the rules.
    None,
    /// Candidates act until their term is cancelled, ignoring the local deadline (so a
    /// process resumed after a long pause acts before its elector has noticed).
    IgnoreDeadline,
    /// Candidate 0's clock runs at half speed, far beyond what `margin` covers.
    ExcessiveDrift,
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
    /// A planted bug, or none.
    pub negative: NegativeControl,
}

impl SimConfig {
    /// Three candidates for 60 simulated seconds with a 2 s ttl, 1 % drift and up to 10 ms
    /// latency each way.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            candidates: 3,
            duration: Duration::from_secs(60),
            timing: Timing::from_ttl(Duration::from_secs(2)),
            max_drift: 0.01,
            base_latency: Duration::from_millis(10),
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
    /// Everything that happened.
    pub events: Vec<Event>,
    /// What the checkers found (empty if all invariants held).
    pub violations: Vec<Violation>,
    /// How many terms began.
    pub terms: usize,
    /// The gaps without a leader that the liveness checker judged, longest first.
    pub judged_gaps: Vec<Duration>,
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
                judged_gaps: Vec::new(),
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
        judged_gaps: gaps,
    }
}

struct World {
    start: Instant,
    events: Mutex<Vec<Event>>,
    store: MemoryStore,
    global: Arc<FaultControl>,
    leaders: Mutex<BTreeMap<Cand, u64>>,
    config: SimConfig,
}

impl World {
    fn now(&self) -> Duration {
        Instant::now() - self.start
    }

    fn log(&self, e: Event) {
        lock(&self.events).push(e);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Freezes a group of tasks, like SIGSTOP: while frozen they are not polled; their timers
/// still run out, and they see that when thawed.
#[derive(Default)]
struct Gate {
    frozen: AtomicBool,
    wakers: Mutex<Vec<Waker>>,
}

impl Gate {
    fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    fn thaw(&self) {
        self.frozen.store(false, Ordering::SeqCst);
        for w in lock(&self.wakers).drain(..) {
            w.wake();
        }
    }
}

struct Freezable {
    inner: Pin<Box<dyn Future<Output = ()> + Send>>,
    gate: Arc<Gate>,
}

impl Future for Freezable {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.gate.frozen.load(Ordering::SeqCst) {
            let mut wakers = lock(&self.gate.wakers);
            if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
                wakers.push(cx.waker().clone());
            }
            return Poll::Pending;
        }
        self.inner.as_mut().poll(cx)
    }
}

struct Running {
    gate: Arc<Gate>,
    control: Arc<FaultControl>,
    driver: JoinHandle<()>,
    worker: JoinHandle<()>,
    observer: JoinHandle<()>,
    resign: mpsc::Sender<()>,
}

const WORK_EVERY: Duration = Duration::from_millis(250);

fn start(world: &Arc<World>, cand: Cand, rng: &mut Rng) -> Option<Running> {
    let control = FaultControl::new();
    let store = Arc::new(FaultyStore::new(
        Recorder(world.clone()),
        rng.next_u64(),
        vec![world.global.clone(), control.clone()],
    ));
    let drift = (rng.next_f64() * 2.0 - 1.0) * world.config.max_drift;
    let rate = match world.config.negative {
        NegativeControl::ExcessiveDrift if cand == 0 => 0.5,
        _ => 1.0 + drift,
    };
    let elector = Elector::builder(store, LeaseKey::new("sim").ok()?)
        .timing(world.config.timing)
        .holder_id(HolderId::new(format!("cand-{cand}")).ok()?)
        .jitter_seed(rng.next_u64())
        .simulated_clock_rate(rate)
        .build()
        .ok()?;
    let (handle, task) = elector.into_parts();
    let observer = tokio::spawn(observe(world.clone(), cand, handle.leadership()));
    let gate = Arc::new(Gate::default());
    let (resign_tx, resign_rx) = mpsc::channel(1);
    let driver = tokio::spawn(Freezable {
        inner: task,
        gate: gate.clone(),
    });
    let worker = tokio::spawn(Freezable {
        inner: Box::pin(work(world.clone(), cand, handle, resign_rx)),
        gate: gate.clone(),
    });
    world.log(Event::Started {
        cand,
        at: world.now(),
    });
    Some(Running {
        gate,
        control,
        driver,
        worker,
        observer,
        resign: resign_tx,
    })
}

/// Records grants and revocations as the elector publishes them; runs outside the frozen
/// process, like a log shipper.
async fn observe(
    world: Arc<World>,
    cand: Cand,
    mut rx: tokio::sync::watch::Receiver<crate::elector::Leadership>,
) {
    let mut current: Option<u64> = None;
    loop {
        let token = rx.borrow_and_update().token().map(|t| t.0);
        if token != current {
            if let Some(old) = current {
                world.log(Event::Revoked {
                    cand,
                    token: old,
                    at: world.now(),
                });
            }
            if let Some(new) = token {
                world.log(Event::Granted {
                    cand,
                    token: new,
                    at: world.now(),
                });
            }
            current = token;
        }
        if rx.changed().await.is_err() {
            if let Some(old) = current {
                world.log(Event::Revoked {
                    cand,
                    token: old,
                    at: world.now(),
                });
            }
            return;
        }
    }
}

/// A candidate's work: whenever it leads, write to the protected resource every
/// `WORK_EVERY`, only while the term allows it.
async fn work(
    world: Arc<World>,
    cand: Cand,
    handle: ElectorHandle,
    mut resign: mpsc::Receiver<()>,
) {
    let Ok(object) = ObjectName::new("resource") else {
        return;
    };
    let ignore_deadline = world.config.negative == NegativeControl::IgnoreDeadline;
    loop {
        let term = tokio::select! {
            biased;
            Some(()) = resign.recv() => { let _ = handle.resign().await; continue; }
            t = handle.wait_for_term() => match t { Ok(t) => t, Err(_) => return },
        };
        let token = term.token().0;
        world.log(Event::TermStarted {
            cand,
            token,
            at: world.now(),
        });
        lock(&world.leaders).insert(cand, token);
        // Logs the end of the belief when dropped: normally, or when the task is aborted
        // (a crash).
        let belief = Belief {
            world: world.clone(),
            cand,
            term,
            ignore_deadline,
        };
        let mut resigning = false;
        loop {
            let acting = if ignore_deadline {
                !belief.term.cancellation_token().is_cancelled()
            } else {
                belief.term.is_valid()
            };
            if !acting {
                break;
            }
            let accepted = world
                .store
                .fenced_write(belief.term.fence(), &object, format!("{cand}").as_bytes())
                .await
                .is_ok();
            world.log(Event::Write {
                cand,
                token,
                at: world.now(),
                accepted,
            });
            tokio::select! {
                biased;
                _ = belief.term.cancelled() => break,
                Some(()) = resign.recv() => { resigning = true; break; }
                _ = sleep(WORK_EVERY) => {}
            }
        }
        drop(belief);
        if resigning {
            world.log(Event::Resigned {
                cand,
                at: world.now(),
            });
            let _ = handle.resign().await;
        }
    }
}

/// The shared store, logging every write that begins a term when it is applied.
struct Recorder(Arc<World>);

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Recorder")
    }
}

#[async_trait::async_trait]
impl crate::backend::LeaseBackend for Recorder {
    async fn read(
        &self,
        key: &LeaseKey,
    ) -> Result<Option<crate::backend::Stored>, crate::error::Error> {
        self.0.store.read(key).await
    }

    async fn write(
        &self,
        request: crate::backend::WriteRequest,
    ) -> Result<crate::backend::WriteOutcome, crate::error::Error> {
        let acquire = request.kind == crate::backend::WriteKind::Acquire;
        let cand = request
            .record
            .holder
            .as_str()
            .strip_prefix("cand-")
            .and_then(|c| c.parse().ok());
        let token = request.record.token.0;
        let outcome = self.0.store.write(request).await;
        if let (true, Some(cand), Ok(crate::backend::WriteOutcome::Written(_))) =
            (acquire, cand, &outcome)
        {
            self.0.log(Event::Applied {
                cand,
                token,
                at: self.0.now(),
            });
        }
        outcome
    }
}

struct Belief {
    world: Arc<World>,
    cand: Cand,
    term: crate::elector::Term,
    ignore_deadline: bool,
}

impl Drop for Belief {
    fn drop(&mut self) {
        let now = self.world.now();
        let at = if self.ignore_deadline {
            now
        } else {
            now.min(
                self.term
                    .deadline()
                    .saturating_duration_since(self.world.start),
            )
        };
        self.world.log(Event::TermEnded {
            cand: self.cand,
            token: self.term.token().0,
            at,
        });
        lock(&self.world.leaders).remove(&self.cand);
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
}

fn pick_action(rng: &mut Rng, ttl: Duration) -> Action {
    let d = |rng: &mut Rng, lo: f64, hi: f64| rng.duration(ttl.mul_f64(lo), ttl.mul_f64(hi));
    match rng.range_u64(0, 11) {
        0..=2 => Action::FreezeLeader(d(rng, 1.2, 3.0)),
        3 => Action::FreezeAnyone(d(rng, 0.2, 2.0)),
        4 | 5 => Action::CrashLeader(d(rng, 0.2, 1.5)),
        6 | 7 => {
            let hang = rng.chance(0.5);
            Action::PartitionLeader(d(rng, 0.3, 2.0), hang)
        }
        8 => Action::Outage(d(rng, 0.2, 2.0)),
        9 | 10 => Action::Storm(d(rng, 0.5, 3.0)),
        _ => Action::ResignLeader,
    }
}

async fn simulate(config: SimConfig) -> Vec<Event> {
    let mut rng = Rng::seeded(config.seed);
    let global = FaultControl::new();
    global.update(|f| f.latency = config.base_latency);
    let world = Arc::new(World {
        start: Instant::now(),
        events: Mutex::new(Vec::new()),
        store: MemoryStore::new(),
        global: global.clone(),
        leaders: Mutex::new(BTreeMap::new()),
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
        let now = world.now();
        match pick_action(&mut rng, ttl) {
            Action::FreezeLeader(d) | Action::FreezeAnyone(d) if leader.or(any).is_some() => {
                let target = leader.or(any).unwrap_or(0);
                if let Some(r) = running.get(&target)
                    && !r.gate.frozen.load(Ordering::SeqCst)
                {
                    r.gate.freeze();
                    world.log(Event::Frozen {
                        cand: target,
                        at: now,
                        until: now + d,
                    });
                    let gate = r.gate.clone();
                    tokio::spawn(async move {
                        sleep(d).await;
                        gate.thaw();
                    });
                }
            }
            Action::CrashLeader(restart_after) => {
                if let Some(target) = leader.or(any)
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
                    restarts.push(Instant::now() + restart_after);
                }
            }
            Action::PartitionLeader(d, hang) => {
                if let Some(r) = leader.or(any).and_then(|t| running.get(&t).map(|r| (t, r))) {
                    let (target, r) = r;
                    r.control.update(|f| {
                        f.down = !hang;
                        f.hang = hang;
                    });
                    world.log(Event::Partitioned {
                        cand: target,
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
                global.update(|f| f.down = true);
                world.log(Event::Outage {
                    at: now,
                    until: now + d,
                });
                let g = global.clone();
                tokio::spawn(async move {
                    sleep(d).await;
                    g.update(|f| f.down = false);
                });
            }
            Action::Storm(d) => {
                global.update(|f| {
                    f.latency = Duration::from_millis(150);
                    f.fail_before = 0.15;
                    f.lose_response = 0.1;
                });
                world.log(Event::Storm {
                    at: now,
                    until: now + d,
                });
                let g = global.clone();
                let base = config.base_latency;
                tokio::spawn(async move {
                    sleep(d).await;
                    g.update(|f| {
                        f.latency = base;
                        f.fail_before = 0.0;
                        f.lose_response = 0.0;
                    });
                });
            }
            Action::ResignLeader => {
                if let Some(r) = leader.and_then(|t| running.get(&t)) {
                    let _ = r.resign.try_send(());
                }
            }
            _ => {}
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

/// One term as a candidate saw it: from the moment it learned it leads to the moment it
/// stopped believing so (or crashed, or the run ended).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// The candidate.
    pub cand: Cand,
    /// The term's token.
    pub token: u64,
    /// When it began to believe.
    pub start: Duration,
    /// When it stopped.
    pub end: Duration,
}

/// The belief intervals of every term in a history.
pub fn spans(events: &[Event], run_end: Duration) -> Vec<Span> {
    let mut open: BTreeMap<Cand, (u64, Duration)> = BTreeMap::new();
    let mut out = Vec::new();
    for e in events {
        match *e {
            Event::TermStarted { cand, token, at } => {
                open.insert(cand, (token, at));
            }
            // A crash ends the belief at once, unless the candidate's own record says it
            // ended earlier (a frozen process whose deadline passed before it was killed);
            // that record comes first in the log.
            Event::TermEnded { cand, at, .. } | Event::Crashed { cand, at } => {
                if let Some((token, start)) = open.remove(&cand) {
                    out.push(Span {
                        cand,
                        token,
                        start,
                        end: at.max(start),
                    });
                }
            }
            _ => {}
        }
    }
    out.extend(open.into_iter().map(|(cand, (token, start))| Span {
        cand,
        token,
        start,
        end: run_end.max(start),
    }));
    out.sort_by_key(|s| (s.start, s.end, s.cand));
    out
}

/// The intervals in which a candidate held a term as its elector saw it: from the grant to
/// the end of its belief (or the revocation, if it never began to act: a process frozen at the
/// moment of the grant).
fn leader_spans(events: &[Event], run_end: Duration) -> Vec<Span> {
    let beliefs = spans(events, run_end);
    let mut out = Vec::new();
    let mut open: BTreeMap<(Cand, u64), Duration> = BTreeMap::new();
    for e in events {
        match *e {
            // A term that began in the store but whose holder never heard of it (frozen or
            // partitioned as the answer came) failed at once: a zero-length leader interval.
            Event::Applied { cand, token, at } => {
                out.push(Span {
                    cand,
                    token,
                    start: at,
                    end: at,
                });
            }
            Event::Granted { cand, token, at } => {
                open.insert((cand, token), at);
            }
            Event::Revoked { cand, token, at } => {
                if let Some(start) = open.remove(&(cand, token)) {
                    let end = beliefs
                        .iter()
                        .find(|b| b.cand == cand && b.token == token)
                        .map_or(at, |b| b.end);
                    out.push(Span {
                        cand,
                        token,
                        start,
                        end: end.max(start),
                    });
                }
            }
            _ => {}
        }
    }
    for ((cand, token), start) in open {
        let end = beliefs
            .iter()
            .find(|b| b.cand == cand && b.token == token)
            .map_or(run_end, |b| b.end);
        out.push(Span {
            cand,
            token,
            start,
            end: end.max(start),
        });
    }
    out.sort_by_key(|s| (s.start, s.end, s.cand));
    out
}

/// Checker 1: no two candidates believe they lead at the same instant.
pub fn check_one_leader(events: &[Event], run_end: Duration) -> Vec<Violation> {
    let spans = spans(events, run_end);
    let mut out = Vec::new();
    for (i, a) in spans.iter().enumerate() {
        for b in &spans[i + 1..] {
            if b.start >= a.end {
                break;
            }
            if b.cand != a.cand {
                out.push(Violation {
                    checker: "one_leader",
                    detail: format!(
                        "cand {} (token {}) led {:?}..{:?} while cand {} (token {}) led {:?}..{:?}",
                        a.cand, a.token, a.start, a.end, b.cand, b.token, b.start, b.end
                    ),
                });
            }
        }
    }
    out
}

/// Checker 2: tokens strictly increase from term to term, and none is issued twice.
pub fn check_tokens(events: &[Event]) -> Vec<Violation> {
    let mut starts: Vec<(Duration, usize, Cand, u64)> = events
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match *e {
            Event::TermStarted { cand, token, at } => Some((at, i, cand, token)),
            _ => None,
        })
        .collect();
    starts.sort();
    let mut out = Vec::new();
    for w in starts.windows(2) {
        let (at0, _, c0, t0) = w[0];
        let (at1, _, c1, t1) = w[1];
        if t1 <= t0 {
            out.push(Violation {
                checker: "tokens",
                detail: format!(
                    "term of cand {c1} at {at1:?} has token {t1}, not above cand {c0}'s {t0} at {at0:?}"
                ),
            });
        }
    }
    out
}

/// Checker 3: the fenced resource never accepts a token lower than one it accepted before.
pub fn check_fencing(events: &[Event]) -> Vec<Violation> {
    let mut highest: Option<(u64, Cand, Duration)> = None;
    let mut out = Vec::new();
    for e in events {
        if let Event::Write {
            cand,
            token,
            at,
            accepted: true,
        } = *e
        {
            if let Some((h, hc, hat)) = highest
                && token < h
            {
                out.push(Violation {
                        checker: "fencing",
                        detail: format!(
                            "resource accepted token {token} from cand {cand} at {at:?} after token {h} from cand {hc} at {hat:?}"
                        ),
                    });
                continue;
            }
            highest = Some((token, cand, at));
        }
    }
    out
}

/// Checker 4: whenever nobody leads, a leader appears within
/// `ttl + retry_every + 2 x request_timeout` (plus latency, scaled for drift) — unless a fault
/// (outage, storm, partition) touched the window, or no candidate was up throughout it.
/// Returns the judged gaps (longest first) and the violations.
pub fn check_liveness(config: &SimConfig, events: &[Event]) -> (Vec<Duration>, Vec<Violation>) {
    let t = config.timing;
    let bound = (t.ttl + t.retry_every + t.request_timeout * 2 + config.base_latency * 4)
        .mul_f64(1.0 + 2.0 * config.max_drift)
        + Duration::from_millis(50);
    let run_end = config.duration;
    let spans = leader_spans(events, run_end);
    // Gaps in the union of the intervals in which some candidate held a granted term.
    let mut gaps = Vec::new();
    let mut covered_to = Duration::ZERO;
    for s in &spans {
        if s.start > covered_to {
            gaps.push((covered_to, s.start));
        }
        covered_to = covered_to.max(s.end);
    }
    if covered_to < run_end {
        gaps.push((covered_to, run_end));
    }
    let mut faults = Vec::new();
    let mut frozen: Vec<(Cand, Duration, Duration)> = Vec::new();
    let mut started: BTreeMap<Cand, Duration> = BTreeMap::new();
    let mut crashed: BTreeMap<Cand, Duration> = BTreeMap::new();
    for e in events {
        match *e {
            Event::Outage { at, until } | Event::Storm { at, until } => faults.push((at, until)),
            Event::Partitioned { at, until, .. } => faults.push((at, until)),
            Event::Frozen { cand, at, until } => frozen.push((cand, at, until)),
            Event::Started { cand, at } => {
                started.insert(cand, at);
            }
            Event::Crashed { cand, at } => {
                crashed.insert(cand, at);
            }
            _ => {}
        }
    }
    let overlaps = |a0: Duration, a1: Duration, b0: Duration, b1: Duration| a0 < b1 && b0 < a1;
    let mut judged = Vec::new();
    let mut out = Vec::new();
    for (g0, g1) in gaps {
        let w0 = g0.saturating_sub(t.ttl + t.retry_every);
        let w1 = g0 + bound;
        if w1 > run_end {
            continue;
        }
        if faults.iter().any(|&(f0, f1)| overlaps(w0, w1, f0, f1)) {
            continue;
        }
        let someone_up = started.iter().any(|(&c, &s)| {
            s <= w0
                && crashed.get(&c).is_none_or(|&x| x >= w1)
                && !frozen
                    .iter()
                    .any(|&(fc, f0, f1)| fc == c && overlaps(w0, w1, f0, f1))
        });
        if !someone_up && g0 > Duration::ZERO {
            continue;
        }
        judged.push(g1 - g0);
        if g1 - g0 > bound {
            out.push(Violation {
                checker: "liveness",
                detail: format!(
                    "no leader from {g0:?} to {g1:?} ({:?}, bound {bound:?}) with the store healthy",
                    g1 - g0
                ),
            });
        }
    }
    judged.sort_by(|a, b| b.cmp(a));
    (judged, out)
}
