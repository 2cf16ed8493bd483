//! A fault-injecting wrapper around any lease store (and any fenced store).

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::{Instant, sleep};

use crate::backend::ExpiryModel;
use crate::backend::{
    Changes, FencedCas, FencedObject, FencedPut, IfChanged, LeaseBackend, ObjectWrite, Revision,
    Stored, WriteOutcome, WriteRequest,
};
use crate::config::Timing;
use crate::error::{ConfigError, Error};
use crate::model::{LeaseKey, ObjectName};
use crate::rand::Rng;

/// Faults to inject, changeable while requests run. Several [`FaultyStore`]s may share one
/// control (a store-wide outage) besides their own (a partition of one candidate).
#[derive(Debug, Default)]
pub struct FaultControl {
    state: Mutex<Faults>,
}

/// The faults in force.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Faults {
    /// Added before a request reaches the store, and again before its answer: uniform in
    /// `[0, latency]`.
    pub latency: Duration,
    /// Probability that a request fails before it reaches the store (nothing applied).
    pub fail_before: f64,
    /// Probability that a request is applied but its response is lost (a write is then
    /// indeterminate).
    pub lose_response: f64,
    /// Every request fails at once: the store is down or unreachable.
    pub down: bool,
    /// Every request hangs until the caller's timeout: a blackholed connection.
    pub hang: bool,
    /// Probability that a write (conditional lease write or fenced write) is delivered late:
    /// the store holds it for a time drawn uniformly from `[hold_min, hold_max]` and only then
    /// applies it, conditionally as it would any write (a lease write whose expected revision
    /// has changed meanwhile is refused; a fenced write whose token is stale is rejected).
    /// The sender never hears back: its own timeout ends the call, as with [`hang`](Self::hang),
    /// and it re-reads and acts on what it finds, while the write is still on its way.
    pub late: f64,
    /// The shortest hold of a late write; choose it above the sender's request timeout plus a
    /// re-read, so that the write lands after the sender has looked.
    pub hold_min: Duration,
    /// The longest hold of a late write.
    pub hold_max: Duration,
}

impl FaultControl {
    /// A control with no faults.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock(&self) -> MutexGuard<'_, Faults> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The faults in force.
    pub fn get(&self) -> Faults {
        *self.lock()
    }

    /// Replaces the faults in force.
    pub fn set(&self, faults: Faults) {
        *self.lock() = faults;
    }

    /// Changes the faults in force.
    pub fn update(&self, f: impl FnOnce(&mut Faults)) {
        f(&mut self.lock());
    }
}

/// A write delivered late, as reported to [`FaultyStore::on_late`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Late {
    /// The store took the write and holds it; the sender will hear nothing.
    Held {
        /// A fenced write (`false`: a conditional lease write).
        fenced: bool,
        /// When the store will apply it (if the runtime still runs then).
        until: Instant,
    },
    /// The store is applying the held write now (conditionally, as any write).
    Applying {
        /// A fenced write (`false`: a conditional lease write).
        fenced: bool,
    },
}

type LateHook = Arc<dyn Fn(Late) + Send + Sync>;

/// Wraps a store and injects the faults of its [`FaultControl`]s: latency, failure before a
/// request is applied, a response lost after it was applied, an outage, a hang, and writes
/// delivered late (applied after their sender timed out and re-read).
///
/// Late delivery spawns the held write on the current tokio runtime; outside one, a write
/// chosen to be late fails before reaching the store instead.
pub struct FaultyStore<S> {
    inner: Arc<S>,
    controls: Vec<Arc<FaultControl>>,
    rng: Mutex<Rng>,
    counts: Mutex<Counts>,
    on_late: Option<LateHook>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    reads: u64,
    writes: u64,
    held: u64,
}

impl<S: fmt::Debug> fmt::Debug for FaultyStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyStore")
            .field("inner", &self.inner)
            .field("controls", &self.controls)
            .field("counts", &*lock(&self.counts))
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

enum Decision {
    Down,
    Hang,
    Go {
        before: Duration,
        after: Duration,
        fail: bool,
        lose: bool,
        /// Deliver late, after this hold.
        late: Option<Duration>,
    },
}

impl<S> FaultyStore<S> {
    /// Wraps `inner`, with jitter seeded by `seed`, obeying `controls` (all of them: a request
    /// fails if any says so; latencies, holds and probabilities take the largest).
    pub fn new(inner: S, seed: u64, controls: Vec<Arc<FaultControl>>) -> Self {
        Self {
            inner: Arc::new(inner),
            controls,
            rng: Mutex::new(Rng::seeded(seed)),
            counts: Mutex::new(Counts::default()),
            on_late: None,
        }
    }

    /// Calls `hook` when a write is held for late delivery, and again when the store applies
    /// it (to log both).
    #[must_use]
    pub fn on_late(mut self, hook: impl Fn(Late) + Send + Sync + 'static) -> Self {
        self.on_late = Some(Arc::new(hook));
        self
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// How many reads and writes were sent (including failed ones; fenced writes count as
    /// writes).
    pub fn counts(&self) -> (u64, u64) {
        let c = *lock(&self.counts);
        (c.reads, c.writes)
    }

    /// How many writes were held for late delivery.
    pub fn held(&self) -> u64 {
        lock(&self.counts).held
    }

    fn decide(&self, write: bool) -> Decision {
        {
            let mut c = lock(&self.counts);
            if write {
                c.writes += 1;
            } else {
                c.reads += 1;
            }
        }
        let mut f = Faults::default();
        for c in &self.controls {
            let g = c.get();
            f.latency = f.latency.max(g.latency);
            f.fail_before = f.fail_before.max(g.fail_before);
            f.lose_response = f.lose_response.max(g.lose_response);
            f.down |= g.down;
            f.hang |= g.hang;
            f.late = f.late.max(g.late);
            f.hold_min = f.hold_min.max(g.hold_min);
            f.hold_max = f.hold_max.max(g.hold_max);
        }
        if f.down {
            return Decision::Down;
        }
        if f.hang {
            return Decision::Hang;
        }
        let mut rng = lock(&self.rng);
        let before = rng.duration(Duration::ZERO, f.latency);
        let after = rng.duration(Duration::ZERO, f.latency);
        let fail = rng.chance(f.fail_before);
        let lose = rng.chance(f.lose_response);
        // Drawn only when late delivery is on, so that a store without it draws exactly as
        // before (seeded tests keep their histories).
        let late = (write && f.late > 0.0 && rng.chance(f.late))
            .then(|| rng.duration(f.hold_min, f.hold_max));
        Decision::Go {
            before,
            after,
            fail,
            lose,
            late,
        }
    }

    /// Applies `apply` after `hold` in a task of its own; `false` outside a tokio runtime.
    fn deliver_late(
        &self,
        hold: Duration,
        fenced: bool,
        apply: impl Future<Output = ()> + Send + 'static,
    ) -> bool {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        lock(&self.counts).held += 1;
        let hook = self.on_late.clone();
        if let Some(hook) = &hook {
            hook(Late::Held {
                fenced,
                until: Instant::now() + hold,
            });
        }
        // Detached: the sender has given up on it; the store still applies it.
        drop(runtime.spawn(async move {
            sleep(hold).await;
            if let Some(hook) = &hook {
                hook(Late::Applying { fenced });
            }
            apply.await;
        }));
        true
    }

    /// One read through the faults: `op` reaches the store unless the store is down, hangs or
    /// the request fails first; its answer may be lost.
    async fn read_through<T>(
        &self,
        op: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        match self.decide(false) {
            Decision::Down => Err(Error::unavailable("injected: store down")),
            Decision::Hang => std::future::pending().await,
            Decision::Go {
                before,
                after,
                fail,
                lose,
                late: _,
            } => {
                sleep(before).await;
                if fail {
                    return Err(Error::unavailable("injected: read failed"));
                }
                let r = op.await;
                sleep(after).await;
                if lose {
                    return Err(Error::unavailable("injected: read response lost"));
                }
                r
            }
        }
    }

    /// One conditional write (`what`: "write" or "fenced write") through the faults: `now`
    /// sends `request` to the store, or `later` builds its delivery after the sender has given
    /// up; its answer may be lost.
    async fn write_through<R, T, F, L>(
        &self,
        what: &str,
        fenced: bool,
        request: R,
        now: impl FnOnce(R) -> F,
        later: impl FnOnce(R) -> L,
    ) -> Result<T, Error>
    where
        F: Future<Output = Result<T, Error>>,
        L: Future<Output = ()> + Send + 'static,
    {
        match self.decide(true) {
            Decision::Down => Err(Error::unavailable("injected: store down")),
            Decision::Hang => std::future::pending().await,
            Decision::Go {
                before,
                after,
                fail,
                lose,
                late,
            } => {
                sleep(before).await;
                if fail {
                    return Err(Error::unavailable(format!(
                        "injected: {what} failed before the store"
                    )));
                }
                if let Some(hold) = late {
                    if self.deliver_late(hold, fenced, later(request)) {
                        return std::future::pending().await;
                    }
                    return Err(Error::unavailable(format!(
                        "injected: {what} lost before the store (no runtime to deliver it late)"
                    )));
                }
                let r = now(request).await;
                sleep(after).await;
                if lose {
                    return Err(Error::indeterminate(format!(
                        "injected: {what} applied, response lost"
                    )));
                }
                r
            }
        }
    }
}

#[async_trait]
impl<S: LeaseBackend + 'static> LeaseBackend for FaultyStore<S> {
    fn expiry_model(&self) -> ExpiryModel {
        self.inner.expiry_model()
    }

    fn check_timing(&self, timing: &Timing) -> Result<(), ConfigError> {
        self.inner.check_timing(timing)
    }

    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        self.read_through(self.inner.read(key)).await
    }

    async fn read_if_changed(
        &self,
        key: &LeaseKey,
        known: Option<&Revision>,
    ) -> Result<IfChanged, Error> {
        self.read_through(self.inner.read_if_changed(key, known))
            .await
    }

    fn changes(&self, key: &LeaseKey) -> Option<Changes> {
        self.inner.changes(key)
    }

    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        self.write_through(
            "write",
            false,
            request,
            |request| self.inner.write(request),
            // Conditional as ever: refused if the record changed meanwhile.
            |request| {
                let inner = self.inner.clone();
                async move {
                    let _ = inner.write(request).await;
                }
            },
        )
        .await
    }
}

#[async_trait]
impl<S: FencedCas + 'static> FencedCas for FaultyStore<S> {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        self.read_through(self.inner.get_fenced(object)).await
    }

    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        self.write_through(
            "fenced write",
            true,
            put,
            |put| self.inner.put_fenced_if(put),
            // Conditional as ever: refused if the object changed meanwhile.
            |put| {
                let inner = self.inner.clone();
                let (fence, object, expected, value) = (
                    put.fence.clone(),
                    put.object.clone(),
                    put.expected.clone(),
                    put.value.to_vec(),
                );
                let lease_check = put.lease_check;
                async move {
                    let mut put = FencedPut::new(&fence, &object, &expected, &value);
                    put.lease_check = lease_check;
                    let _ = inner.put_fenced_if(put).await;
                }
            },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Expected, Fence, FencedStore, WriteKind};
    use crate::memory::MemoryStore;
    use crate::model::{HolderId, LeaseRecord, Metadata, TermId, WriteNonce};
    use crate::token::FencingToken;
    use tokio::time::timeout;

    fn request(holder: &str, expected: Expected, nonce: u64) -> WriteRequest {
        WriteRequest::new(
            LeaseKey::new("k").unwrap(),
            expected,
            LeaseRecord::held(
                HolderId::new(holder).unwrap(),
                FencingToken(1),
                Duration::from_secs(2),
                Metadata::new(),
                WriteNonce(nonce),
            ),
            WriteKind::Acquire,
            TermId(nonce.into()),
        )
    }

    fn late_control() -> Arc<FaultControl> {
        let control = FaultControl::new();
        control.update(|f| {
            f.late = 1.0;
            f.hold_min = Duration::from_secs(1);
            f.hold_max = Duration::from_secs(1);
        });
        control
    }

    /// The sender times out and re-reads (nothing there yet); the write lands afterwards,
    /// still conditional on what it expected.
    #[tokio::test(start_paused = true)]
    async fn a_late_write_lands_after_its_sender_timed_out_and_re_read() {
        let memory = MemoryStore::new();
        let control = late_control();
        let store = FaultyStore::new(memory.clone(), 1, vec![control.clone()]);
        let key = LeaseKey::new("k").unwrap();
        let sent = timeout(
            Duration::from_millis(200),
            store.write(request("a", Expected::Absent, 7)),
        )
        .await;
        assert!(sent.is_err(), "the sender must hear nothing");
        control.set(Faults::default());
        assert_eq!(store.read(&key).await.unwrap(), None, "not applied yet");
        assert_eq!(store.held(), 1);
        sleep(Duration::from_secs(1)).await;
        let landed = memory.read(&key).await.unwrap().unwrap();
        assert_eq!(landed.record.nonce, WriteNonce(7));
    }

    /// A late write whose condition no longer holds when it lands changes nothing.
    #[tokio::test(start_paused = true)]
    async fn a_late_write_is_refused_if_the_record_changed_meanwhile() {
        let memory = MemoryStore::new();
        let store = FaultyStore::new(memory.clone(), 2, vec![late_control()]);
        let key = LeaseKey::new("k").unwrap();
        let _ = timeout(
            Duration::from_millis(200),
            store.write(request("a", Expected::Absent, 7)),
        )
        .await;
        // Someone else creates the record while the write is held.
        memory
            .write(request("b", Expected::Absent, 8))
            .await
            .unwrap();
        sleep(Duration::from_secs(2)).await;
        let now = memory.read(&key).await.unwrap().unwrap();
        assert_eq!(now.record.holder.as_str(), "b");
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_fenced_write_is_checked_when_it_lands() {
        let memory = MemoryStore::new();
        let store = FaultyStore::new(memory.clone(), 3, vec![late_control()]);
        let object = ObjectName::new("o").unwrap();
        let fence = |token| {
            Fence::new(
                LeaseKey::new("k").unwrap(),
                HolderId::new("a").unwrap(),
                FencingToken(token),
            )
        };
        let r = timeout(
            Duration::from_millis(200),
            store.fenced_write(&fence(1), &object, b"old"),
        )
        .await;
        assert!(r.is_err());
        memory
            .fenced_write(&fence(2), &object, b"new")
            .await
            .unwrap();
        sleep(Duration::from_secs(2)).await;
        let o = memory.fenced_read(&object).await.unwrap().unwrap();
        assert_eq!(
            (o.fence, o.value.as_slice()),
            (FencingToken(2), &b"new"[..])
        );
    }

    /// The lost-response case of fencing: a write that lands after a later write *of the
    /// same term* was acknowledged must not undo it (the fence alone cannot tell them apart;
    /// the object's revision can).
    #[tokio::test(start_paused = true)]
    async fn a_late_fenced_write_does_not_overwrite_a_later_one_of_its_own_term() {
        let memory = MemoryStore::new();
        let store = FaultyStore::new(memory.clone(), 3, vec![late_control()]);
        let object = ObjectName::new("o").unwrap();
        let fence = Fence::new(
            LeaseKey::new("k").unwrap(),
            HolderId::new("a").unwrap(),
            FencingToken(1),
        );
        let r = timeout(
            Duration::from_millis(200),
            store.fenced_write(&fence, &object, b"first"),
        )
        .await;
        assert!(r.is_err());
        memory
            .fenced_write(&fence, &object, b"second")
            .await
            .unwrap();
        sleep(Duration::from_secs(2)).await;
        let o = memory.fenced_read(&object).await.unwrap().unwrap();
        assert_eq!(o.value.as_slice(), &b"second"[..]);
    }

    /// Without late delivery the generator draws exactly as it did before late delivery
    /// existed, so seeded histories elsewhere do not move.
    #[test]
    fn no_late_delivery_draws_nothing_extra() {
        let store = FaultyStore::new(MemoryStore::new(), 9, vec![FaultControl::new()]);
        for _ in 0..3 {
            let _ = store.decide(true);
        }
        // Two draws each (fail, lose); zero latency draws nothing.
        let mut expected = Rng::seeded(9);
        for _ in 0..6 {
            expected.next_u64();
        }
        assert_eq!(lock(&store.rng).next_u64(), expected.next_u64());
    }
}
