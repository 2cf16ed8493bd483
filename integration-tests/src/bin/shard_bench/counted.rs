//! A store wrapper that counts the calls made to it, by trait method: the same count on every
//! backend and for both schemes (a sharded elector, or one single-key elector per shard), so
//! the two compare like for like. A call is not always one network request (an Azure write
//! can be two, a retried call is one); see `results/sharding.md`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use leader_core::backend::{
    Changes, ExpiryModel, FencedCas, FencedObject, FencedPut, IfChanged, ObjectWrite, Revision,
    Stored, TermId, WriteKind, WriteOutcome, WriteRequest,
};
use leader_core::{ConfigError, Error, LeaseBackend, LeaseKey, ObjectName, Timing};
use serde::{Deserialize, Serialize};

/// Calls so far, by method (writes also by why the core wrote).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Calls {
    /// `LeaseBackend::read`.
    pub(crate) read: u64,
    /// `LeaseBackend::read_if_changed`: the cheap read of a waiting follower or a member.
    pub(crate) read_if_changed: u64,
    /// `LeaseBackend::read_for_term`: the read after a write whose answer was lost.
    pub(crate) read_for_term: u64,
    /// `LeaseBackend::write` of an acquire.
    pub(crate) acquire: u64,
    /// `LeaseBackend::write` of a renew.
    pub(crate) renew: u64,
    /// `LeaseBackend::write` of a release.
    pub(crate) release: u64,
    /// `FencedCas::get_fenced`: the sharded elector's roster, shard records and token mark.
    pub(crate) get_fenced: u64,
    /// `FencedCas::put_fenced_if`.
    pub(crate) put_fenced_if: u64,
}

impl Calls {
    /// Every lease write.
    pub(crate) fn write(&self) -> u64 {
        self.acquire + self.renew + self.release
    }

    /// Every read (lease records and objects).
    pub(crate) fn reads(&self) -> u64 {
        self.read + self.read_if_changed + self.read_for_term + self.get_fenced
    }

    /// Every write (lease records and objects).
    pub(crate) fn writes(&self) -> u64 {
        self.write() + self.put_fenced_if
    }

    /// Every count with its name, in the order of the tables.
    pub(crate) fn fields(&self) -> [(&'static str, u64); 8] {
        [
            ("read", self.read),
            ("read_if_changed", self.read_if_changed),
            ("read_for_term", self.read_for_term),
            ("get_fenced", self.get_fenced),
            ("write (acquire)", self.acquire),
            ("write (renew)", self.renew),
            ("write (release)", self.release),
            ("put_fenced_if", self.put_fenced_if),
        ]
    }

    /// What was called between `earlier` and `self`.
    pub(crate) fn since(&self, earlier: &Calls) -> Calls {
        Calls {
            read: self.read.saturating_sub(earlier.read),
            read_if_changed: self.read_if_changed.saturating_sub(earlier.read_if_changed),
            read_for_term: self.read_for_term.saturating_sub(earlier.read_for_term),
            acquire: self.acquire.saturating_sub(earlier.acquire),
            renew: self.renew.saturating_sub(earlier.renew),
            release: self.release.saturating_sub(earlier.release),
            get_fenced: self.get_fenced.saturating_sub(earlier.get_fenced),
            put_fenced_if: self.put_fenced_if.saturating_sub(earlier.put_fenced_if),
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    read: AtomicU64,
    read_if_changed: AtomicU64,
    read_for_term: AtomicU64,
    acquire: AtomicU64,
    renew: AtomicU64,
    release: AtomicU64,
    get_fenced: AtomicU64,
    put_fenced_if: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A store (any `LeaseBackend + FencedCas`) that counts the calls made to it. Every method is
/// forwarded, the provided ones too, so that the store behaves exactly as it would unwrapped.
#[derive(Debug)]
pub(crate) struct Counted {
    leases: Arc<dyn LeaseBackend>,
    objects: Arc<dyn FencedCas>,
    counters: Counters,
}

impl Counted {
    /// Wraps `store`.
    pub(crate) fn new<S: LeaseBackend + FencedCas + 'static>(store: S) -> Self {
        let store = Arc::new(store);
        Self {
            leases: store.clone(),
            objects: store,
            counters: Counters::default(),
        }
    }

    /// The calls so far.
    pub(crate) fn calls(&self) -> Calls {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Calls {
            read: get(&c.read),
            read_if_changed: get(&c.read_if_changed),
            read_for_term: get(&c.read_for_term),
            acquire: get(&c.acquire),
            renew: get(&c.renew),
            release: get(&c.release),
            get_fenced: get(&c.get_fenced),
            put_fenced_if: get(&c.put_fenced_if),
        }
    }
}

#[async_trait]
impl LeaseBackend for Counted {
    fn expiry_model(&self) -> ExpiryModel {
        self.leases.expiry_model()
    }

    fn check_timing(&self, timing: &Timing) -> Result<(), ConfigError> {
        self.leases.check_timing(timing)
    }

    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        bump(&self.counters.read);
        self.leases.read(key).await
    }

    async fn read_for_term(&self, key: &LeaseKey, term: TermId) -> Result<Option<Stored>, Error> {
        bump(&self.counters.read_for_term);
        self.leases.read_for_term(key, term).await
    }

    async fn read_if_changed(
        &self,
        key: &LeaseKey,
        known: Option<&Revision>,
    ) -> Result<IfChanged, Error> {
        bump(&self.counters.read_if_changed);
        self.leases.read_if_changed(key, known).await
    }

    fn changes(&self, key: &LeaseKey) -> Option<Changes> {
        self.leases.changes(key)
    }

    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        bump(match request.kind {
            WriteKind::Acquire => &self.counters.acquire,
            WriteKind::Renew => &self.counters.renew,
            WriteKind::Release => &self.counters.release,
        });
        self.leases.write(request).await
    }
}

#[async_trait]
impl FencedCas for Counted {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        bump(&self.counters.get_fenced);
        self.objects.get_fenced(object).await
    }

    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        bump(&self.counters.put_fenced_if);
        self.objects.put_fenced_if(put).await
    }
}
