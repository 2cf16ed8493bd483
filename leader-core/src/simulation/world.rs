//! The simulated machinery: the shared world (clock, event log, store), frozen processes,
//! each candidate's view of the store, the protected resource, and a candidate's belief.

use super::*;

pub(super) struct World {
    pub(super) start: Instant,
    pub(super) events: Mutex<Vec<Event>>,
    pub(super) store: MemoryStore,
    /// Store-wide faults of lease requests and fenced writes (outages, storms, late writes).
    pub(super) global: Arc<FaultControl>,
    /// Store-wide faults of fenced writes only (their own rate of late delivery).
    pub(super) resource: Arc<FaultControl>,
    pub(super) leaders: Mutex<BTreeMap<Cand, u64>>,
    /// What followers' lagging reads see.
    pub(super) replica: Mutex<Replica>,
    pub(super) config: SimConfig,
}

/// The lease record's history, for reads answered by a lagging replica: each applied write,
/// with the instant it was applied.
pub(super) struct Replica {
    history: std::collections::VecDeque<(Instant, Option<Stored>)>,
    rng: Rng,
}

impl Replica {
    pub(super) fn new(seed: u64) -> Self {
        Self {
            history: std::collections::VecDeque::from([(Instant::now(), None)]),
            rng: Rng::seeded(seed ^ 0x7e91_1ca5),
        }
    }

    /// Records that `stored` was applied now; forgets what no read can show any more.
    fn applied(&mut self, stored: Stored, lag: Duration) {
        let now = Instant::now();
        self.history.push_back((now, Some(stored)));
        while self.history.len() > 1 && self.history[1].0 + lag < now {
            self.history.pop_front();
        }
    }

    /// The record as it was at an instant up to `lag` ago: never a write before it was
    /// applied.
    fn read(&mut self, lag: Duration) -> Option<Stored> {
        let at = Instant::now()
            .checked_sub(self.rng.duration(Duration::ZERO, lag))
            .unwrap_or_else(Instant::now);
        self.history
            .iter()
            .rev()
            .find(|(t, _)| *t <= at)
            .or(self.history.front())
            .and_then(|(_, s)| s.clone())
    }
}

impl World {
    pub(super) fn now(&self) -> Duration {
        Instant::now() - self.start
    }

    pub(super) fn since_start(&self, t: Instant) -> Duration {
        t.saturating_duration_since(self.start)
    }

    pub(super) fn log(&self, e: Event) {
        lock(&self.events).push(e);
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Freezes a group of tasks, like SIGSTOP: while frozen they are not polled; their timers
/// still run out, and they see that when thawed.
#[derive(Default)]
pub(super) struct Gate {
    pub(super) state: Mutex<GateState>,
}

#[derive(Default)]
pub(super) struct GateState {
    pub(super) frozen: bool,
    /// Counts freezes, so that the thaw of an earlier freeze does not end a later one.
    pub(super) generation: u64,
    pub(super) wakers: Vec<Waker>,
}

impl Gate {
    pub(super) fn is_frozen(&self) -> bool {
        lock(&self.state).frozen
    }

    /// Freezes the group unless it is frozen already; returns the freeze's generation.
    pub(super) fn freeze(&self) -> Option<u64> {
        let mut s = lock(&self.state);
        if s.frozen {
            return None;
        }
        s.frozen = true;
        s.generation += 1;
        Some(s.generation)
    }

    pub(super) fn thaw(&self, generation: u64) {
        let wakers = {
            let mut s = lock(&self.state);
            if !s.frozen || s.generation != generation {
                return;
            }
            s.frozen = false;
            std::mem::take(&mut s.wakers)
        };
        for w in wakers {
            w.wake();
        }
    }
}

pub(super) struct Freezable {
    pub(super) inner: Pin<Box<dyn Future<Output = ()> + Send>>,
    pub(super) gate: Arc<Gate>,
}

impl Future for Freezable {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        {
            let mut s = lock(&self.gate.state);
            if s.frozen {
                if !s.wakers.iter().any(|w| w.will_wake(cx.waker())) {
                    s.wakers.push(cx.waker().clone());
                }
                return Poll::Pending;
            }
        }
        self.inner.as_mut().poll(cx)
    }
}

/// Freezes `cand`'s process for `d` (unless it is frozen already) and logs it; returns
/// whether it froze.
pub(super) fn freeze(
    world: &Arc<World>,
    cand: Cand,
    gate: &Arc<Gate>,
    d: Duration,
    in_flight: bool,
) -> bool {
    let Some(generation) = gate.freeze() else {
        return false;
    };
    let (at, until) = (world.now(), world.now() + d);
    world.log(if in_flight {
        Event::PausedInFlight { cand, at, until }
    } else {
        Event::Frozen { cand, at, until }
    });
    let gate = gate.clone();
    tokio::spawn(async move {
        sleep(d).await;
        gate.thaw(generation);
    });
    true
}

/// The store as one candidate's process sees it: the fault store, and a pause that can be
/// armed to freeze the process once its next write has been applied and answered, before
/// it reads the answer (a GC pause or SIGSTOP with a response in flight). On resuming, the
/// process reads that answer, however late: the deadline of the term it grants must count
/// from when the write was sent. The pause may be followed by a partition: the process
/// resumes, reads the answer, and then cannot reach the store.
pub(super) struct Process {
    pub(super) store: FaultyStore<Recorder>,
    pub(super) world: Arc<World>,
    pub(super) cand: Cand,
    pub(super) gate: Arc<Gate>,
    /// The candidate's own faults (its partitions).
    pub(super) control: Arc<FaultControl>,
    pub(super) pause: Mutex<Option<Pause>>,
}

#[derive(Clone, Copy)]
pub(super) struct Pause {
    /// How long the process stays frozen.
    pub(super) frozen: Duration,
    /// How long it is partitioned after it resumes.
    pub(super) then_cut: Option<Duration>,
}

impl Process {
    pub(super) fn arm(&self, pause: Pause) {
        *lock(&self.pause) = Some(pause);
    }

    /// Cuts the process off the store from now until `d` after it resumes from a pause of
    /// `frozen` (it sends nothing while frozen anyway).
    pub(super) fn cut(&self, frozen: Duration, d: Duration) {
        let (at, until) = (self.world.now(), self.world.now() + frozen + d);
        self.control.update(|f| f.down = true);
        self.world.log(Event::Partitioned {
            cand: self.cand,
            at,
            until,
        });
        let control = self.control.clone();
        tokio::spawn(async move {
            sleep(frozen + d).await;
            control.set(Faults::default());
        });
    }
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Process(cand {})", self.cand)
    }
}

#[async_trait::async_trait]
impl LeaseBackend for Process {
    fn expiry_model(&self) -> ExpiryModel {
        self.store.expiry_model()
    }

    fn check_timing(&self, timing: &Timing) -> Result<(), ConfigError> {
        self.store.check_timing(timing)
    }

    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        self.store.read(key).await
    }

    async fn read_if_changed(
        &self,
        key: &LeaseKey,
        known: Option<&Revision>,
    ) -> Result<IfChanged, Error> {
        self.store.read_if_changed(key, known).await
    }

    fn changes(&self, key: &LeaseKey) -> Option<Changes> {
        self.store.changes(key)
    }

    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        let outcome = self.store.write(request).await;
        let pause = match outcome {
            Ok(WriteOutcome::Written(_)) => lock(&self.pause).take(),
            _ => None,
        };
        if let Some(pause) = pause
            && freeze(&self.world, self.cand, &self.gate, pause.frozen, true)
        {
            if let Some(d) = pause.then_cut {
                self.cut(pause.frozen, d);
            }
            // Give up the thread: the gate keeps the process from running until it thaws,
            // and only then does it read the answer.
            tokio::task::yield_now().await;
        }
        outcome
    }
}

/// The shared lease store, logging every write that begins a term when it is applied.
pub(super) struct Recorder(pub(super) Arc<World>);

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Recorder")
    }
}

#[async_trait::async_trait]
impl LeaseBackend for Recorder {
    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        self.0.store.read(key).await
    }

    /// Answered by the lagging replica (the simulation has one key).
    async fn read_if_changed(
        &self,
        _key: &LeaseKey,
        known: Option<&Revision>,
    ) -> Result<IfChanged, Error> {
        let seen = lock(&self.0.replica).read(self.0.config.replica_lag);
        Ok(IfChanged::compared(seen, known))
    }

    fn changes(&self, key: &LeaseKey) -> Option<Changes> {
        if self.0.config.change_hints {
            self.0.store.changes(key)
        } else {
            None
        }
    }

    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        let acquire = request.kind == WriteKind::Acquire;
        let cand = request
            .record
            .holder
            .as_str()
            .strip_prefix("cand-")
            .and_then(|c| c.parse().ok());
        let outcome = self.0.store.write(request).await;
        if let Ok(WriteOutcome::Written(stored)) = &outcome {
            let frozen = self.0.config.negative == NegativeControl::FrozenReplica
                && self.0.now() > self.0.config.duration / 4;
            if !frozen {
                lock(&self.0.replica).applied(stored.clone(), self.0.config.replica_lag);
            }
        }
        if let (true, Some(cand), Ok(WriteOutcome::Written(stored))) = (acquire, cand, &outcome) {
            self.0.log(Event::Applied {
                cand,
                token: stored.record.token.0,
                at: self.0.now(),
            });
        }
        outcome
    }
}

/// The protected resource (an object in the shared store), logging each fenced write it
/// decides on, at the instant it decides.
pub(super) struct Resource {
    pub(super) world: Arc<World>,
    pub(super) cand: Cand,
}

impl std::fmt::Debug for Resource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Resource(cand {})", self.cand)
    }
}

#[async_trait::async_trait]
impl FencedCas for Resource {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        let found = self.world.store.get_fenced(object).await?;
        if self.world.config.negative == NegativeControl::UnfencedResource {
            // The planted bug: the resource forgets its fence, so any token gets in ...
            return Ok(found.map(|o| FencedObject {
                fence: FencingToken(0),
                ..o
            }));
        }
        Ok(found)
    }

    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        let store = &self.world.store;
        let outcome = if self.world.config.negative == NegativeControl::UnfencedResource {
            // ... and writes whatever arrives, on no condition.
            let now = match store.get_fenced(put.object).await? {
                Some(o) => Expected::Revision(o.revision),
                None => Expected::Absent,
            };
            let mut blind = FencedPut::new(put.fence, put.object, &now, put.value);
            blind.lease_check = put.lease_check;
            store.put_fenced_if(blind).await
        } else {
            store.put_fenced_if(put).await
        };
        if let Ok(ObjectWrite::Written(_)) = outcome {
            self.world.log(Event::Write {
                cand: self.cand,
                token: put.fence.token.0,
                at: self.world.now(),
                accepted: true,
            });
        }
        outcome
    }
}

pub(super) struct Belief {
    pub(super) world: Arc<World>,
    pub(super) cand: Cand,
    pub(super) term: Term,
    pub(super) ignore_deadline: bool,
}

impl Drop for Belief {
    fn drop(&mut self) {
        let now = self.world.now();
        let at = if self.ignore_deadline {
            now
        } else {
            now.min(self.world.since_start(self.term.deadline()))
        };
        self.world.log(Event::TermEnded {
            cand: self.cand,
            token: self.term.token().0,
            at,
        });
        lock(&self.world.leaders).remove(&self.cand);
    }
}
