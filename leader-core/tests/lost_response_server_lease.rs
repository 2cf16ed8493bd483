//! A write whose answer is lost, on a store that enforces expiry itself: the core recognises
//! its own write only while the store still grants the term's server lease.
//!
//! The store here is [`ServerLeaseDouble`], a test double of the backend contract for stores
//! with server-side leases (contract item 5 and `read_for_term`): the in-memory store plus one
//! server lease per key, granted to a term id, that an "operator" can break and another
//! candidate can take. It is not a model of any cloud's API. Time is paused.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leader_core::backend::{
    Expected, ExpiryModel, LeaseState, Revision, Stored, TermId, WriteKind, WriteOutcome,
    WriteRequest,
};
use leader_core::{
    Acquisition, Error, FencingToken, HolderId, LeaseBackend, LeaseClient, LeaseKey, MemoryStore,
    Renewal, Timing,
};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(15);

/// What happens between a write that is applied but whose answer is lost and the writer's
/// re-read.
#[derive(Clone, Copy, Debug)]
enum Meanwhile {
    /// Nothing: the lease is still the writer's.
    Nothing,
    /// An operator breaks the lease.
    Break,
    /// An operator breaks the lease and another candidate (this term) takes the new one, but
    /// has not written its record yet.
    BreakAndSeize(TermId),
}

#[derive(Debug, Default)]
struct Lease {
    /// The term that holds the server lease and until when; `None` if nobody does.
    holder: Option<(TermId, Instant)>,
    /// The next write is applied, then `Meanwhile` happens, then its answer is lost.
    lose_next: Option<Meanwhile>,
}

/// A test double of a store that enforces expiry: an in-memory record plus a server lease.
#[derive(Debug, Default)]
struct ServerLeaseDouble {
    records: MemoryStore,
    lease: Mutex<Lease>,
    /// Every write asked for, applied or not.
    writes_asked: std::sync::atomic::AtomicUsize,
}

/// The revision of the underlying record, without what the double appends.
fn inner(revision: &Revision) -> Revision {
    let s = revision.as_str();
    Revision::new(s.rsplit_once('|').map_or(s, |(r, _)| r))
}

fn tagged(mut stored: Stored, held: bool, tag: &str) -> Stored {
    if !held {
        stored.record.state = LeaseState::Released;
    }
    stored.revision = Revision::new(format!("{}|{tag}", stored.revision));
    stored
}

impl ServerLeaseDouble {
    fn live_holder(&self) -> Option<TermId> {
        let lease = self.lease.lock().unwrap();
        lease
            .holder
            .filter(|(_, until)| Instant::now() < *until)
            .map(|(term, _)| term)
    }

    fn lose_next_answer(&self, meanwhile: Meanwhile) {
        self.lease.lock().unwrap().lose_next = Some(meanwhile);
    }
}

#[async_trait]
impl LeaseBackend for ServerLeaseDouble {
    fn expiry_model(&self) -> ExpiryModel {
        ExpiryModel::EnforcedByStore
    }

    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        let live = self.live_holder().is_some();
        let tag = if live { "leased" } else { "free" };
        Ok(self.records.read(key).await?.map(|s| tagged(s, live, tag)))
    }

    async fn read_for_term(&self, key: &LeaseKey, term: TermId) -> Result<Option<Stored>, Error> {
        let ours = self.live_holder() == Some(term);
        let tag = if ours { "leased" } else { "not-ours" };
        Ok(self.records.read(key).await?.map(|s| tagged(s, ours, tag)))
    }

    async fn write(&self, mut request: WriteRequest) -> Result<WriteOutcome, Error> {
        self.writes_asked
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let live = self.live_holder();
        let allowed = match request.kind {
            WriteKind::Acquire => live.is_none() || live == Some(request.term),
            WriteKind::Renew | WriteKind::Release => live == Some(request.term),
        };
        if !allowed {
            return Ok(WriteOutcome::Conflict { current: None });
        }
        if let Expected::Revision(r) = &request.expected {
            request.expected = Expected::Revision(inner(r));
        }
        let (kind, term) = (request.kind, request.term);
        let outcome = self.records.write(request).await?;
        let WriteOutcome::Written(stored) = outcome else {
            return Ok(outcome);
        };
        let mut lease = self.lease.lock().unwrap();
        let released = kind == WriteKind::Release;
        lease.holder = (!released).then(|| (term, Instant::now() + TTL));
        let written = tagged(stored, !released, if released { "free" } else { "leased" });
        match lease.lose_next.take() {
            None => Ok(WriteOutcome::Written(written)),
            Some(meanwhile) => {
                match meanwhile {
                    Meanwhile::Nothing => {}
                    Meanwhile::Break => lease.holder = None,
                    Meanwhile::BreakAndSeize(other) => {
                        lease.holder = Some((other, Instant::now() + TTL));
                    }
                }
                Err(Error::indeterminate(
                    "test double: write applied, answer lost",
                ))
            }
        }
    }
}

/// The double without its own `read_for_term`: what a store that enforces expiry gets from
/// the trait's default.
#[derive(Debug)]
struct WithoutLeaseCheck(Arc<ServerLeaseDouble>);

#[async_trait]
impl LeaseBackend for WithoutLeaseCheck {
    fn expiry_model(&self) -> ExpiryModel {
        ExpiryModel::EnforcedByStore
    }
    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        self.0.read(key).await
    }
    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        self.0.write(request).await
    }
}

fn key() -> LeaseKey {
    LeaseKey::new("k").unwrap()
}

fn client(store: Arc<dyn LeaseBackend>, who: &str) -> LeaseClient {
    LeaseClient::new(
        store,
        key(),
        HolderId::new(who).unwrap(),
        Timing::from_ttl(TTL),
    )
    .unwrap()
}

async fn acquired(c: &mut LeaseClient) -> FencingToken {
    match c.try_acquire().await.unwrap() {
        Acquisition::Acquired(g) => g.token,
        other => panic!("{} should hold a term: {other:?}", c.holder()),
    }
}

async fn no_term(c: &mut LeaseClient, why: &str) {
    match c.try_acquire().await {
        Ok(Acquisition::Following { .. }) | Err(_) => {}
        Ok(Acquisition::Acquired(g)) => panic!("{why}: reported a term {g:?}"),
    }
    assert!(c.grant().is_none(), "{why}: holds a grant");
}

#[tokio::test(start_paused = true)]
async fn a_lost_acquire_with_the_lease_still_ours_is_a_term() {
    // The positive control: recognition still works when nothing happened in between.
    let store = Arc::new(ServerLeaseDouble::default());
    let mut a = client(store.clone(), "a");
    store.lose_next_answer(Meanwhile::Nothing);
    assert_eq!(acquired(&mut a).await, FencingToken(1));
    let mut b = client(store.clone(), "b");
    no_term(&mut b, "b while a holds the lease").await;
}

/// A follower of a store that enforces expiry only reads while the server lease is live (a
/// write could not succeed), and takes the lease once the store reports it free.
#[tokio::test(start_paused = true)]
async fn a_follower_writes_nothing_while_the_server_lease_is_live() {
    use std::sync::atomic::Ordering::SeqCst;
    let store = Arc::new(ServerLeaseDouble::default());
    let mut a = client(store.clone(), "a");
    assert_eq!(acquired(&mut a).await, FencingToken(1));
    let asked = store.writes_asked.load(SeqCst);
    let mut b = client(store.clone(), "b");
    for _ in 0..20 {
        no_term(&mut b, "b while a holds the lease").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        store.writes_asked.load(SeqCst),
        asked,
        "b wrote while a's lease was live"
    );
    // a stops renewing: the server lease runs out and b takes it with its first write.
    tokio::time::sleep(TTL).await;
    assert_eq!(acquired(&mut b).await, FencingToken(2));
    assert_eq!(store.writes_asked.load(SeqCst), asked + 1);
}

#[tokio::test(start_paused = true)]
async fn a_lost_acquire_then_an_operator_break_is_no_term() {
    let store = Arc::new(ServerLeaseDouble::default());
    let mut a = client(store.clone(), "a");
    store.lose_next_answer(Meanwhile::Break);
    no_term(&mut a, "a after its lease was broken").await;
    // The lease is free: someone else takes it at once, with a higher token.
    let mut b = client(store.clone(), "b");
    assert_eq!(acquired(&mut b).await, FencingToken(2));
}

#[tokio::test(start_paused = true)]
async fn a_lost_acquire_then_a_break_and_another_lease_is_no_term() {
    // The record still carries a's nonce and the blob is leased, but not by a's term.
    let store = Arc::new(ServerLeaseDouble::default());
    let mut a = client(store.clone(), "a");
    store.lose_next_answer(Meanwhile::BreakAndSeize(TermId(7)));
    no_term(&mut a, "a while another term holds the lease").await;
}

#[tokio::test(start_paused = true)]
async fn a_lost_renew_then_a_break_and_another_lease_ends_the_term() {
    let store = Arc::new(ServerLeaseDouble::default());
    let mut a = client(store.clone(), "a");
    acquired(&mut a).await;
    store.lose_next_answer(Meanwhile::BreakAndSeize(TermId(7)));
    if let Ok(Renewal::Renewed(g)) = a.renew().await {
        panic!("a renewed a term whose lease is another's: {g:?}");
    }
    assert!(a.grant().is_none(), "a still holds a grant");
}

#[tokio::test(start_paused = true)]
async fn a_lost_renew_with_the_lease_still_ours_goes_on() {
    let store = Arc::new(ServerLeaseDouble::default());
    let mut a = client(store.clone(), "a");
    acquired(&mut a).await;
    store.lose_next_answer(Meanwhile::Nothing);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = a.grant().unwrap().deadline;
    match a.renew().await.unwrap() {
        Renewal::Renewed(g) => assert!(g.deadline > before),
        other => panic!("a lost renew that landed must be recognised: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn without_a_lease_check_a_lost_answer_is_never_a_term() {
    // A store that enforces expiry but does not implement `read_for_term` (a wrapper that
    // forgets to forward it): the default cannot confirm the lease, so it fails safe.
    let store = Arc::new(ServerLeaseDouble::default());
    let mut a = client(Arc::new(WithoutLeaseCheck(store.clone())), "a");
    store.lose_next_answer(Meanwhile::Nothing);
    no_term(&mut a, "a without a lease check").await;
}
