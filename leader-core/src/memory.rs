//! A store in memory, for tests, documentation and the simulation.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;

use crate::backend::{
    ChangeNotifier, Changes, FencedCas, FencedObject, FencedPut, LeaseBackend, ObjectWrite, Stored,
    WriteKind, WriteOutcome, WriteRequest,
};
use crate::error::Error;
use crate::model::{LeaseKey, LeaseRecord, ObjectName, Revision};
use crate::token::FencingToken;

#[derive(Debug, Default)]
struct State {
    next_revision: u64,
    leases: HashMap<String, (Vec<u8>, Revision)>,
    /// The highest token ever written per key; kept when a record is deleted.
    high_water: HashMap<String, FencingToken>,
    objects: HashMap<String, FencedObject>,
}

impl State {
    fn revision(&mut self) -> Revision {
        self.next_revision += 1;
        Revision::new(self.next_revision.to_string())
    }
}

/// A linearizable store in process memory. Clones share the same data, like several clients of
/// one cloud store.
///
/// Records are kept encoded as JSON, exactly as blob and file stores keep them, so that a
/// malformed record behaves as it would in a real store. Revisions come from a counter and are
/// never reused. Tokens survive deletion: the highest token of each key is kept apart from
/// its record.
///
/// It tells waiting followers of every change ([`LeaseBackend::changes`]), as a watch of a
/// coordination service would.
#[derive(Clone, Debug)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
    notifier: ChangeNotifier,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self {
            state: Arc::default(),
            notifier: Changes::channel().0,
        }
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated (every update is
        // a single insert), so a poisoned lock is safe to use.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stores raw bytes as the record of `key`, bypassing every check (to plant a malformed
    /// record in a test).
    pub fn put_raw(&self, key: &LeaseKey, bytes: Vec<u8>) {
        let mut state = self.lock();
        let revision = state.revision();
        state
            .leases
            .insert(key.as_str().to_owned(), (bytes, revision));
        drop(state);
        self.notifier.notify();
    }

    /// Deletes the record of `key`, as an operator might. The key's highest token is kept, so
    /// the next term's token is still above every earlier one.
    pub fn delete(&self, key: &LeaseKey) {
        self.lock().leases.remove(key.as_str());
        self.notifier.notify();
    }

    /// Deletes the protected object `name`, as an operator might.
    pub fn delete_object(&self, name: &ObjectName) {
        self.lock().objects.remove(name.as_str());
    }

    fn decode(key: &str, bytes: &[u8], revision: &Revision) -> Result<Stored, Error> {
        Ok(Stored {
            record: LeaseRecord::from_json(key, bytes)?,
            revision: revision.clone(),
        })
    }
}

#[async_trait]
impl LeaseBackend for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        let state = self.lock();
        state
            .leases
            .get(key.as_str())
            .map(|(bytes, rev)| Self::decode(key.as_str(), bytes, rev))
            .transpose()
    }

    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        let mut state = self.lock();
        let key = request.key.as_str();
        let current = state.leases.get(key);
        if !request.expected.matches(current.map(|(_, rev)| rev)) {
            let current = current.and_then(|(bytes, rev)| Self::decode(key, bytes, rev).ok());
            return Ok(WriteOutcome::Conflict { current });
        }
        let mut record = request.record;
        let high = state
            .high_water
            .get(key)
            .copied()
            .unwrap_or(FencingToken(0));
        if request.kind == WriteKind::Acquire && record.token <= high {
            // The record was deleted since the candidate's last read: mint above every token
            // this key ever had.
            record.token = FencingToken(high.get().saturating_add(1));
        }
        let revision = state.revision();
        state
            .high_water
            .insert(key.to_owned(), high.max(record.token));
        state
            .leases
            .insert(key.to_owned(), (record.to_json(), revision.clone()));
        drop(state);
        self.notifier.notify();
        Ok(WriteOutcome::Written(Stored { record, revision }))
    }

    fn changes(&self, _key: &LeaseKey) -> Option<Changes> {
        Some(self.notifier.subscribe())
    }
}

#[async_trait]
impl FencedCas for MemoryStore {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        Ok(self.lock().objects.get(object.as_str()).cloned())
    }

    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        let mut state = self.lock();
        let current = state.objects.get(put.object.as_str());
        if !put.expected.matches(current.map(|o| &o.revision)) {
            return Ok(ObjectWrite::Conflict);
        }
        let revision = state.revision();
        state.objects.insert(
            put.object.as_str().to_owned(),
            FencedObject {
                fence: put.fence.token,
                value: put.value.to_vec(),
                revision: revision.clone(),
            },
        );
        Ok(ObjectWrite::Written(revision))
    }
}
