//! A fault-injecting wrapper around any lease store.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::sleep;

use crate::ExpiryModel;
use crate::backend::{LeaseBackend, Stored, WriteOutcome, WriteRequest};
use crate::config::Timing;
use crate::error::{ConfigError, Error};
use crate::model::LeaseKey;
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

/// Wraps a store and injects the faults of its [`FaultControl`]s: latency, failure before a
/// request is applied, a response lost after it was applied, an outage, a hang.
#[derive(Debug)]
pub struct FaultyStore<S> {
    inner: S,
    controls: Vec<Arc<FaultControl>>,
    rng: Mutex<Rng>,
    counts: Mutex<(u64, u64)>,
}

enum Decision {
    Down,
    Hang,
    Go {
        before: Duration,
        after: Duration,
        fail: bool,
        lose: bool,
    },
}

impl<S> FaultyStore<S> {
    /// Wraps `inner`, with jitter seeded by `seed`, obeying `controls` (all of them: a request
    /// fails if any says so; latencies and probabilities take the largest).
    pub fn new(inner: S, seed: u64, controls: Vec<Arc<FaultControl>>) -> Self {
        Self {
            inner,
            controls,
            rng: Mutex::new(Rng::seeded(seed)),
            counts: Mutex::new((0, 0)),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// How many reads and writes were sent (including failed ones).
    pub fn counts(&self) -> (u64, u64) {
        *self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn decide(&self, write: bool) -> Decision {
        {
            let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
            if write {
                c.1 += 1;
            } else {
                c.0 += 1;
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
        }
        if f.down {
            return Decision::Down;
        }
        if f.hang {
            return Decision::Hang;
        }
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        Decision::Go {
            before: rng.duration(Duration::ZERO, f.latency),
            after: rng.duration(Duration::ZERO, f.latency),
            fail: rng.chance(f.fail_before),
            lose: rng.chance(f.lose_response),
        }
    }
}

#[async_trait]
impl<S: LeaseBackend> LeaseBackend for FaultyStore<S> {
    fn expiry_model(&self) -> ExpiryModel {
        self.inner.expiry_model()
    }

    fn check_timing(&self, timing: &Timing) -> Result<(), ConfigError> {
        self.inner.check_timing(timing)
    }

    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        match self.decide(false) {
            Decision::Down => Err(Error::unavailable("injected: store down")),
            Decision::Hang => std::future::pending().await,
            Decision::Go {
                before,
                after,
                fail,
                lose,
            } => {
                sleep(before).await;
                if fail {
                    return Err(Error::unavailable("injected: read failed"));
                }
                let r = self.inner.read(key).await;
                sleep(after).await;
                if lose {
                    return Err(Error::unavailable("injected: read response lost"));
                }
                r
            }
        }
    }

    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        match self.decide(true) {
            Decision::Down => Err(Error::unavailable("injected: store down")),
            Decision::Hang => std::future::pending().await,
            Decision::Go {
                before,
                after,
                fail,
                lose,
            } => {
                sleep(before).await;
                if fail {
                    return Err(Error::unavailable(
                        "injected: write failed before the store",
                    ));
                }
                let r = self.inner.write(request).await;
                sleep(after).await;
                if lose {
                    return Err(Error::indeterminate(
                        "injected: write applied, response lost",
                    ));
                }
                r
            }
        }
    }
}
