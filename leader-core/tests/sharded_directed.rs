//! The interleavings of the sharded elector's safety review, each played exactly (under paused
//! time, with writes held by a store that parks them on cue), once with the rule that closes
//! it, and once with the rule taken away (a planted flaw) to show that the case catches it.
//!
//! - F1: a take of an absent record, decided before an operator's delete, lands after another
//!   member took the shard and started acting: the late taker must not lead it.
//! - F2: a prune decided from an earlier look lands after the member came back in a new term:
//!   the member must stay in the roster.
//! - F3: a write whose answer was lost lands after a delete, naming a live term that does not
//!   claim the shard: the shard must still be led.
//! - F4: members with a longer ttl than the coordinator's must not flicker out of its plan.
//!
//! And those of the review of the coordinator's design, each seen failing on the code before
//! its fix:
//! - S1: the roster is deleted as the coordinator dies: a new instance must not take a shard
//!   that a live member, not listed again yet, claims and acts on.
//! - S2: after F1's late write, the record names a term that then ends: a taker must not take
//!   the shard while the member that acts on it still claims it.
//! - S3: a member with a longer ttl is deleted: a taker that never read its record must wait
//!   that member's ttl, not its own.
//! - L1: a new coordinator's failed first read, or a deleted roster, must not make members give
//!   up their shards.
//! - L2: a write whose answer was lost and that never lands must not leave its shard unled.
//! - L3: a deleted plan is written again, so that a member restarted under the same id leads.
//!
//! And those of its second review:
//! - R1: a take of an absent record that lands after another member took, led and released
//!   the shard (and an operator deleted the record) must not act with a lower token.
//! - R2: an absence of a member record is timed for the member's latest term.
//! - R3: a new coordinator that knows nobody must not take a record naming an ended term
//!   while a live member, not listed again yet, claims and acts on the shard.
//! - R4: two unknown outcomes of two members on one shard must not leave it unled.
//!
//! And of its third review: R5, a lagging read must not list a member back in an older term;
//! and one failed renew of the coordinator lease must not lose it.
//!
//! And of a fleet's start (the history mark names the key's first roster): K1, a coordinator
//! whose mark lost the race must trust the first roster at once; K2-K5, a first roster's
//! write that lands late must not pass for the first roster after a delete, its writer alive
//! (K2), crashed (K3), cut off (K4) or answered late (K5), nor for its writer (K4, K5); K6, a
//! winning mark whose answer was lost must still name the roster its writer creates.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leader_core::backend::{
    Expected, Fence, FencedCas, FencedObject, FencedPut, IfChanged, ObjectWrite, Revision, Stored,
    WriteOutcome, WriteRequest,
};
use leader_core::simulation::{FaultControl, FaultyStore, ShardFlaw};
use leader_core::{
    Acquisition, Error, FencingToken, HolderId, LeaseBackend, LeaseClient, LeaseKey, MemoryStore,
    Metadata, ObjectName, ShardedElector, ShardedHandle, Term, Timing, read_status,
};
use tokio::sync::Notify;
use tokio::time::{Instant, sleep, timeout};

const TTL: Duration = Duration::from_secs(15);

fn key() -> LeaseKey {
    LeaseKey::new("queues").unwrap()
}

fn object(name: &str) -> ObjectName {
    ObjectName::new(name).unwrap()
}

/// The memory store as one instance reaches it, holding that instance's next write of one
/// object on cue: until the test says go (the writer waits for it), or, with its answer lost,
/// in the background (the writer times out and re-reads; the write lands when the test says
/// go, on its own condition).
#[derive(Debug)]
struct Parking {
    store: MemoryStore,
    armed: Mutex<Option<(ObjectName, bool)>>,
    arrived: Notify,
    go: Arc<Notify>,
    /// Every call hangs while set (the instance is cut off from the store).
    frozen: Arc<AtomicBool>,
}

impl Parking {
    fn new(store: &MemoryStore) -> Arc<Self> {
        Arc::new(Self {
            store: store.clone(),
            armed: Mutex::new(None),
            arrived: Notify::new(),
            go: Arc::new(Notify::new()),
            frozen: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Until the instance is no longer cut off.
    async fn thawed(&self) {
        while self.frozen.load(Ordering::SeqCst) {
            sleep(Duration::from_millis(5)).await;
        }
    }

    /// Parks the next write of `name`; `lost`: its writer hears nothing back.
    fn arm(&self, name: &str, lost: bool) {
        *self.armed.lock().unwrap() = Some((object(name), lost));
    }

    async fn arrived(&self) {
        timeout(4 * TTL, self.arrived.notified())
            .await
            .expect("the parked write never came");
    }

    fn go(&self) {
        self.go.notify_one();
    }
}

#[async_trait]
impl LeaseBackend for Parking {
    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        self.thawed().await;
        self.store.read(key).await
    }
    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        self.thawed().await;
        self.store.write(request).await
    }
}

#[async_trait]
impl FencedCas for Parking {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        self.thawed().await;
        self.store.get_fenced(object).await
    }
    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        self.thawed().await;
        let parked = {
            let mut armed = self.armed.lock().unwrap();
            match armed.as_ref() {
                Some((name, lost)) if name == put.object => {
                    let lost = *lost;
                    *armed = None;
                    Some(lost)
                }
                _ => None,
            }
        };
        match parked {
            None => self.store.put_fenced_if(put).await,
            Some(false) => {
                self.arrived.notify_one();
                self.go.notified().await;
                self.store.put_fenced_if(put).await
            }
            Some(true) => {
                let (store, go) = (self.store.clone(), self.go.clone());
                let (fence, name) = (put.fence.clone(), put.object.clone());
                let (expected, value) = (put.expected.clone(), put.value.to_vec());
                tokio::spawn(async move {
                    go.notified().await;
                    let late = FencedPut::new(&fence, &name, &expected, &value);
                    let _ = store.put_fenced_if(late).await;
                });
                self.arrived.notify_one();
                std::future::pending().await
            }
        }
    }
}

fn builder<S: LeaseBackend + FencedCas + 'static>(
    store: &Arc<S>,
    id: &str,
    shards: u32,
) -> leader_core::ShardedElectorBuilder {
    ShardedElector::builder(store.clone(), key(), shards)
        .ttl(TTL)
        .holder_id(HolderId::new(id).unwrap())
        .jitter_seed(u64::from(id.as_bytes()[0]))
}

/// Takes every term handed out and drops it when it ends.
fn work(handle: &ShardedHandle) {
    let terms = handle.terms();
    tokio::spawn(async move {
        while let Ok(term) = terms.next().await {
            tokio::spawn(async move {
                term.cancelled().await;
                drop::<Term>(term);
            });
        }
    });
}

async fn until(what: &str, within: Duration, f: impl Fn() -> bool) {
    let end = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < end, "{what}: not within {within:?}");
        sleep(Duration::from_millis(5)).await;
    }
}

/// What every instance leads, checked: no shard led by two at once.
fn one_owner(handles: &[&ShardedHandle]) -> Result<Vec<BTreeMap<u32, FencingToken>>, String> {
    let led: Vec<_> = handles.iter().map(|h| h.led()).collect();
    let mut owner = BTreeMap::new();
    for (i, l) in led.iter().enumerate() {
        for s in l.keys() {
            if let Some(j) = owner.insert(*s, i) {
                return Err(format!("shard {s} led by instances {j} and {i} at once"));
            }
        }
    }
    Ok(led)
}

/// The key of `id`'s membership record (FNV-1a of the id, as the core names it).
fn member_key(id: &str) -> LeaseKey {
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    LeaseKey::new(format!("queues.m.{hash:016x}")).unwrap()
}

/// A member played by the test itself, through the store as a member writes it: its
/// membership lease publishing its claims, its roster entry, and the shard records it takes.
struct FakeMember {
    id: String,
    shards: u32,
    client: LeaseClient,
    token: FencingToken,
}

impl FakeMember {
    async fn join(store: &MemoryStore, id: &str, shards: u32, claims: &str) -> Self {
        let backend: Arc<dyn LeaseBackend> = Arc::new(store.clone());
        let holder = HolderId::new(id).unwrap();
        let client =
            LeaseClient::new(backend, member_key(id), holder, Timing::from_ttl(TTL)).unwrap();
        let mut member = Self {
            id: id.to_owned(),
            shards,
            client,
            token: FencingToken(0),
        };
        member.rejoin(store, claims).await;
        member
    }

    /// Takes a membership term (the record must be free) and lists it in the roster.
    async fn rejoin(&mut self, store: &MemoryStore, claims: &str) {
        self.set_claims(claims);
        let Ok(Acquisition::Acquired(grant)) = self.client.try_acquire().await else {
            panic!("the fake member {} could not take its membership", self.id);
        };
        self.token = grant.token;
        let roster = object("queues.roster");
        let found = store.get_fenced(&roster).await.unwrap().expect("a roster");
        let mut listed: serde_json::Value = serde_json::from_slice(&found.value).unwrap();
        let members = listed["members"].as_array_mut().unwrap();
        members.retain(|e| e["id"] != self.id.as_str());
        members.push(serde_json::json!({"id": self.id, "term": grant.token.get()}));
        let bytes = serde_json::to_vec(&listed).unwrap();
        let expected = Expected::Revision(found.revision);
        let fence = self.fence();
        let put = FencedPut::new(&fence, &roster, &expected, &bytes);
        assert!(matches!(
            store.put_fenced_if(put).await.unwrap(),
            ObjectWrite::Written(_)
        ));
    }

    /// Publishes `claims` with the next renew.
    fn set_claims(&mut self, claims: &str) {
        self.client
            .set_metadata(Metadata::from([
                ("shards".to_owned(), self.shards.to_string()),
                ("claims".to_owned(), claims.to_owned()),
            ]))
            .unwrap();
    }

    fn fence(&self) -> Fence {
        Fence::new(
            self.client.key().clone(),
            self.client.holder().clone(),
            self.token,
        )
    }

    /// Writes shard `s`'s record as held by this member, on `expected`, with `token`.
    async fn take(&self, store: &MemoryStore, s: u32, expected: Expected, token: u64) {
        self.write(store, s, expected, "held", token).await;
    }

    /// Writes shard `s`'s record as this member's, in `state`, on `expected`, with `token`.
    async fn write(
        &self,
        store: &MemoryStore,
        s: u32,
        expected: Expected,
        state: &str,
        token: u64,
    ) {
        let record = serde_json::json!({
            "v": 1, "owner": self.id, "member": self.token.get(),
            "state": state, "token": token, "nonce": 7,
        });
        let bytes = serde_json::to_vec(&record).unwrap();
        let name = object(&format!("queues.s.{s}"));
        let fence = self.fence();
        let put = FencedPut::new(&fence, &name, &expected, &bytes);
        assert!(matches!(
            store.put_fenced_if(put).await.unwrap(),
            ObjectWrite::Written(_)
        ));
    }
}

/// A token reserved as a member reserves one: a term of the token lease, released at once.
async fn reserve(store: &MemoryStore, id: &str) -> u64 {
    let mut tokens = LeaseClient::new(
        Arc::new(store.clone()),
        LeaseKey::new("queues.tokens").unwrap(),
        HolderId::new(id).unwrap(),
        Timing::from_ttl(TTL),
    )
    .unwrap();
    let Ok(Acquisition::Acquired(grant)) = tokens.try_acquire().await else {
        panic!("{id} could not reserve a token");
    };
    assert!(tokens.release().await.unwrap());
    grant.token.get()
}

/// Waits until shard `s`'s record is released (by whoever held it), renewing `x` meanwhile;
/// returns its revision as a condition.
async fn released(store: &MemoryStore, s: u32, x: &mut FakeMember) -> Expected {
    let end = Instant::now() + 2 * TTL;
    loop {
        let found = store
            .get_fenced(&object(&format!("queues.s.{s}")))
            .await
            .unwrap();
        if let Some(o) = found
            && String::from_utf8_lossy(&o.value).contains("released")
        {
            return Expected::Revision(o.revision);
        }
        assert!(Instant::now() < end, "shard {s} was never released");
        x.client.renew().await.unwrap();
        sleep(Duration::from_millis(5)).await;
    }
}

/// F1. T judges shard 0 absent and unclaimed and writes it, slowly. Meanwhile X takes it,
/// publishes its claim and acts; an operator deletes the record; T's write lands on the
/// absence. T must not lead shard 0 while X's term lives and claims it.
async fn f1(flaw: ShardFlaw) -> Result<(), String> {
    let store = MemoryStore::new();
    let t_side = Parking::new(&store);
    t_side.arm("queues.s.0", false);
    let t = builder(&t_side, "t", 1).flaw(flaw).build().unwrap().spawn();
    work(&t);
    t_side.arrived().await;
    let mut x = FakeMember::join(&store, "x", 1, "r:0").await;
    x.take(&store, 0, Expected::Absent, 1000).await;
    store.delete_object(&object("queues.s.0"));
    t_side.go();
    let end = Instant::now() + 3 * TTL;
    let mut next_renew = Instant::now() + Duration::from_secs(7);
    while Instant::now() < end {
        if t.led().contains_key(&0) {
            return Err("t leads shard 0 while x acts on it".to_owned());
        }
        if Instant::now() >= next_renew {
            x.client.renew().await.unwrap();
            next_renew += Duration::from_secs(7);
        }
        sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn f1_a_late_take_of_an_absent_record_is_not_led_beside_its_owner() {
    f1(ShardFlaw::None).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn f1_without_the_recheck_after_publishing_two_lead_at_once() {
    let found = f1(ShardFlaw::NoClaimsRecheck).await;
    eprintln!("caught: {found:?}");
    assert!(found.is_err(), "the planted flaw went unnoticed");
}

/// F2. The coordinator C ends the term of X (cut off for a ttl) and prunes it from the roster,
/// but its write is held. X comes back in a new term before the write lands. X must stay in
/// the roster throughout.
async fn f2(flaw: ShardFlaw) -> Result<(), String> {
    let store = MemoryStore::new();
    let c_side = Parking::new(&store);
    let c = builder(&c_side, "c", 2).flaw(flaw).build().unwrap().spawn();
    work(&c);
    until("c leads both", TTL, || c.led().len() == 2).await;
    let cut = FaultControl::new();
    let x_side = Arc::new(FaultyStore::new(store.clone(), 3, vec![cut.clone()]));
    let x = builder(&x_side, "x", 2).flaw(flaw).build().unwrap().spawn();
    work(&x);
    until("one each", TTL, || c.led().len() == 1 && x.led().len() == 1).await;
    let first = store
        .read(&member_key("x"))
        .await
        .unwrap()
        .unwrap()
        .record
        .token;
    // The next roster write of c is its prune of x: held, its answer lost.
    c_side.arm("queues.roster", true);
    cut.update(|f| f.down = true);
    c_side.arrived().await;
    cut.update(|f| f.down = false);
    // x takes a new membership term and has looked at the key since.
    let end = Instant::now() + 2 * TTL;
    loop {
        let record = store.read(&member_key("x")).await.unwrap();
        let again = record.is_some_and(|s| s.record.token > first && s.record.is_held());
        if again && x.assignment().borrow().member {
            break;
        }
        assert!(Instant::now() < end, "x never took a new membership term");
        sleep(Duration::from_millis(5)).await;
    }
    sleep(Duration::from_secs(2)).await;
    c_side.go();
    let end = Instant::now() + 2 * TTL;
    while Instant::now() < end {
        let status = read_status(&store, &key()).await.unwrap().unwrap();
        if !status.members.iter().any(|m| m.id.as_str() == "x") {
            return Err("x, back in a new term, was pruned from the roster".to_owned());
        }
        sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn f2_a_stale_prune_does_not_remove_a_member_back_in_a_new_term() {
    f2(ShardFlaw::None).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn f2_with_entries_by_id_a_stale_prune_removes_a_live_member() {
    let found = f2(ShardFlaw::PruneById).await;
    eprintln!("caught: {found:?}");
    assert!(found.is_err(), "the planted flaw went unnoticed");
}

/// F3. T's first write of shard 1 loses its answer and is held; T takes the shard with a
/// second write, then hands it to Y (who joined); before Y takes it, an operator deletes the
/// record and the first write lands: the record names T's live term, which claims nothing
/// of it, and Y may not end a live term. Every shard must still be led, once.
async fn f3(flaw: ShardFlaw) -> Result<(), String> {
    let store = MemoryStore::new();
    let t_side = Parking::new(&store);
    t_side.arm("queues.s.1", true);
    let t = builder(&t_side, "t", 2).flaw(flaw).build().unwrap().spawn();
    work(&t);
    t_side.arrived().await;
    until("t leads both", 2 * TTL, || t.led().len() == 2).await;
    let cut = FaultControl::new();
    let y_side = Arc::new(FaultyStore::new(store.clone(), 5, vec![cut.clone()]));
    let y = builder(&y_side, "y", 2).flaw(flaw).build().unwrap().spawn();
    work(&y);
    // y is listed: it is cut off before it can take what the next plan gives it.
    let end = Instant::now() + TTL;
    loop {
        let status = read_status(&store, &key()).await.unwrap().unwrap();
        if status.members.iter().any(|m| m.id.as_str() == "y") {
            break;
        }
        assert!(Instant::now() < end, "y never joined");
        sleep(Duration::from_millis(5)).await;
    }
    cut.update(|f| f.down = true);
    until("t hands shard 1 over", TTL, || !t.led().contains_key(&1)).await;
    let end = Instant::now() + TTL;
    loop {
        let found = store.get_fenced(&object("queues.s.1")).await.unwrap();
        if found.is_some_and(|o| String::from_utf8_lossy(&o.value).contains("released")) {
            break;
        }
        assert!(
            Instant::now() < end,
            "the record of shard 1 was never released"
        );
        sleep(Duration::from_millis(1)).await;
    }
    store.delete_object(&object("queues.s.1"));
    t_side.go();
    sleep(Duration::from_millis(1)).await;
    cut.update(|f| f.down = false);
    let end = Instant::now() + 4 * TTL;
    loop {
        let led = one_owner(&[&t, &y])?;
        if led.iter().map(BTreeMap::len).sum::<usize>() == 2 {
            return Ok(());
        }
        if Instant::now() >= end {
            return Err(format!("not every shard led 4 ttls later: {led:?}"));
        }
        sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn f3_a_shard_whose_record_names_a_live_term_that_does_not_claim_it_is_led() {
    f3(ShardFlaw::None).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn f3_without_the_unclaimed_shard_check_it_is_never_led() {
    let found = f3(ShardFlaw::NoUnclaimedNet).await;
    eprintln!("caught: {found:?}");
    assert!(found.is_err(), "the planted flaw went unnoticed");
}

/// The version of the plan in the store.
async fn plan_version(store: &MemoryStore) -> Option<u64> {
    let found = store.get_fenced(&object("queues.plan")).await.unwrap()?;
    let plan: serde_json::Value = serde_json::from_slice(&found.value).unwrap();
    plan["version"].as_u64()
}

/// F4. The coordinator runs with a ttl of 5 s, a member with 15 s (it renews every 7.5 s):
/// while nothing changes, the member stays in the plan (no new plan is written) and no shard
/// moves.
async fn f4(flaw: ShardFlaw) -> Result<(), String> {
    let store = Arc::new(MemoryStore::new());
    let c = builder(&store, "c", 4)
        .ttl(Duration::from_secs(5))
        .flaw(flaw)
        .build()
        .unwrap()
        .spawn();
    work(&c);
    until("c leads every shard", TTL, || c.led().len() == 4).await;
    let x = builder(&store, "x", 4).flaw(flaw).build().unwrap().spawn();
    work(&x);
    until("two each", TTL, || c.led().len() == 2 && x.led().len() == 2).await;
    sleep(Duration::from_secs(1)).await;
    let before = one_owner(&[&c, &x])?;
    let version = plan_version(&store).await;
    let end = Instant::now() + 4 * TTL;
    while Instant::now() < end {
        let now = one_owner(&[&c, &x])?;
        if now != before {
            return Err(format!(
                "shards moved while nothing changed: {before:?} -> {now:?}"
            ));
        }
        let again = plan_version(&store).await;
        if again != version {
            return Err(format!(
                "the plan changed while nothing did: version {version:?} -> {again:?}"
            ));
        }
        sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn f4_a_member_with_a_longer_ttl_keeps_its_shards() {
    f4(ShardFlaw::None).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn f4_judged_by_the_coordinators_ttl_it_flickers() {
    let found = f4(ShardFlaw::ObserverTtl).await;
    eprintln!("caught: {found:?}");
    assert!(found.is_err(), "the planted flaw went unnoticed");
}

// The review of the coordinator's design.

/// Takes every term handed out and drops it when it ends; the work of shard `slow` takes
/// `hold` to stop once its term is cancelled, and `running` is true while its `Term` lives.
fn work_slowly(handle: &ShardedHandle, slow: u32, hold: Duration, running: Arc<AtomicBool>) {
    let terms = handle.terms();
    tokio::spawn(async move {
        while let Ok(term) = terms.next().await {
            let running = running.clone();
            tokio::spawn(async move {
                let this = term.shard() == Some(slow);
                if this {
                    running.store(true, Ordering::SeqCst);
                }
                term.cancelled().await;
                if this {
                    sleep(hold).await;
                }
                drop::<Term>(term);
                if this {
                    running.store(false, Ordering::SeqCst);
                }
            });
        }
    });
}

async fn record_text(store: &MemoryStore, name: &str) -> Option<String> {
    let found = store.get_fenced(&object(name)).await.unwrap()?;
    Some(String::from_utf8_lossy(&found.value).into_owned())
}

/// S2. After F1's interleaving the record of shard 1 names t, which does not lead it, while x
/// does. t leaves (its term is over); the plan moves shard 1 from x to a joiner z. z must not
/// lead shard 1 while x's work on it still runs: x still claims it.
async fn s2(flaw: ShardFlaw) -> Result<(), String> {
    let store = MemoryStore::new();
    let t_side = Parking::new(&store);
    t_side.arm("queues.s.1", true);
    let t = builder(&t_side, "t", 2).flaw(flaw).build().unwrap().spawn();
    work(&t);
    t_side.arrived().await;
    until("t leads both", 2 * TTL, || t.led().len() == 2).await;
    let plain = Arc::new(store.clone());
    let x_running = Arc::new(AtomicBool::new(false));
    let x = builder(&plain, "x", 2).flaw(flaw).build().unwrap().spawn();
    work_slowly(&x, 1, Duration::from_secs(10), x_running.clone());
    until("x leads shard 1", 2 * TTL, || {
        x.led().contains_key(&1) && t.led().len() == 1
    })
    .await;
    store.delete_object(&object("queues.s.1"));
    t_side.go();
    let end = Instant::now() + TTL;
    loop {
        let text = record_text(&store, "queues.s.1").await.unwrap_or_default();
        if text.contains("\"owner\":\"t\"") && text.contains("held") {
            break;
        }
        assert!(Instant::now() < end, "t's late write never landed");
        sleep(Duration::from_millis(1)).await;
    }
    t.shutdown().await;
    until("x leads both", 4 * TTL, || x.led().len() == 2).await;
    let z = builder(&plain, "z", 2).flaw(flaw).build().unwrap().spawn();
    work(&z);
    let end = Instant::now() + 4 * TTL;
    while Instant::now() < end {
        if z.led().contains_key(&1) {
            if x_running.load(Ordering::SeqCst) {
                return Err("z leads shard 1 while x's work on it still runs".to_owned());
            }
            return Ok(());
        }
        sleep(Duration::from_millis(5)).await;
    }
    Err(format!(
        "z never led shard 1: x {:?} z {:?}",
        x.led(),
        z.led()
    ))
}

#[tokio::test(start_paused = true)]
async fn s2_a_shard_whose_record_names_an_ended_term_waits_for_its_claimant() {
    s2(ShardFlaw::None).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn s2_with_claims_for_absent_records_only_two_act_at_once() {
    let found = s2(ShardFlaw::ClaimsForAbsentOnly).await;
    eprintln!("caught: {found:?}");
    assert!(found.is_err(), "the planted flaw went unnoticed");
}

/// A member played by the test lists itself again, as a real member does, once the plan
/// names a roster that does not list it.
async fn list_again_if_planned_elsewhere(store: &MemoryStore, x: &FakeMember) {
    let Some(plan) = record_text(store, "queues.plan").await else {
        return;
    };
    let Some(roster) = store.get_fenced(&object("queues.roster")).await.unwrap() else {
        return;
    };
    let plan: serde_json::Value = serde_json::from_str(&plan).unwrap();
    let mut listed: serde_json::Value = serde_json::from_slice(&roster.value).unwrap();
    let has_x = listed["members"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["id"] == x.id.as_str());
    if plan["roster"] == listed["created"] && !has_x {
        listed["members"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"id": x.id, "term": x.token.get()}));
        let bytes = serde_json::to_vec(&listed).unwrap();
        let fence = x.fence();
        let expected = Expected::Revision(roster.revision);
        let name = object("queues.roster");
        let _ = store
            .put_fenced_if(FencedPut::new(&fence, &name, &expected, &bytes))
            .await;
    }
}

/// Waits for the next renew of `id`'s membership record.
async fn next_renew_of(store: &MemoryStore, id: &str) {
    let before = store.read(&member_key(id)).await.unwrap().unwrap().revision;
    loop {
        let now = store.read(&member_key(id)).await.unwrap().unwrap().revision;
        if now != before {
            return;
        }
        sleep(Duration::from_millis(1)).await;
    }
}

/// S1. x (played by the test: it renews and claims shard 1) leads shard 1. The coordinator c
/// is cut off right after a renew, and the operator deletes the roster, the plan and shard 1's
/// record. A new instance j writes a new roster and, a ttl later, takes the coordinator lease
/// and plans every shard to itself (it knows of nobody else). j must not lead shard 1 while x,
/// live, claims it: x lists itself again once it reads j's plan.
#[tokio::test(start_paused = true)]
async fn s1_a_roster_deleted_as_the_coordinator_dies_hides_no_live_claim() {
    let store = MemoryStore::new();
    let cut = FaultControl::new();
    let c_side = Arc::new(FaultyStore::new(store.clone(), 3, vec![cut.clone()]));
    let c = builder(&c_side, "c", 2).build().unwrap().spawn();
    work(&c);
    until("c leads both", TTL, || c.led().len() == 2).await;
    let mut x = FakeMember::join(&store, "x", 2, "r:1").await;
    // c's plan gives shard 1 to x: c releases it, x takes the released record.
    let revision = released(&store, 1, &mut x).await;
    let token = reserve(&store, "x").await;
    x.take(&store, 1, revision, token).await;
    x.client.renew().await.unwrap();
    let mut x_renewed = Instant::now();
    next_renew_of(&store, "c").await;
    cut.update(|f| f.down = true);
    store.delete_object(&object("queues.roster"));
    store.delete_object(&object("queues.plan"));
    store.delete_object(&object("queues.s.1"));
    let plain = Arc::new(store.clone());
    let j = builder(&plain, "j", 2).build().unwrap().spawn();
    work(&j);
    let end = Instant::now() + 4 * TTL;
    while Instant::now() < end {
        if x_renewed.elapsed() >= Duration::from_secs(5) {
            x.client.renew().await.unwrap();
            x_renewed = Instant::now();
        }
        list_again_if_planned_elsewhere(&store, &x).await;
        assert!(
            !j.led().contains_key(&1),
            "j leads shard 1 while x, live, claims it; roster: {:?}",
            record_text(&store, "queues.roster").await
        );
        sleep(Duration::from_millis(5)).await;
    }
}

/// S3. x runs with a ttl of `x_ttl`, the others with 15 s. x is cut off right after a renew
/// and the operator deletes its member record: nobody may lead x's shards before x's own
/// deadline has passed, not even y, which has never read x's record.
async fn s3(x_ttl: Duration) -> Result<(), String> {
    let store = Arc::new(MemoryStore::new());
    let c = builder(&store, "c", 6).build().unwrap().spawn();
    work(&c);
    until("c leads every shard", TTL, || c.led().len() == 6).await;
    // y first, so that it takes nothing once x is there and never reads x's record.
    let y = builder(&store, "y", 6).build().unwrap().spawn();
    work(&y);
    until("three each", 4 * TTL, || {
        c.led().len() == 3 && y.led().len() == 3
    })
    .await;
    let cut = FaultControl::new();
    let x_side = Arc::new(FaultyStore::new((*store).clone(), 5, vec![cut.clone()]));
    let x = builder(&x_side, "x", 6).ttl(x_ttl).build().unwrap().spawn();
    work(&x);
    until("two each", 4 * TTL, || {
        c.led().len() == 2 && x.led().len() == 2 && y.led().len() == 2
    })
    .await;
    next_renew_of(&store, "x").await;
    cut.update(|f| f.down = true);
    let deleted_at = Instant::now();
    store.delete(&member_key("x"));
    let end = Instant::now() + 2 * x_ttl.max(TTL);
    while Instant::now() < end {
        if let Err(e) = one_owner(&[&c, &x, &y]) {
            return Err(format!("{e}, {:?} after the delete", deleted_at.elapsed()));
        }
        sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn s3_a_deleted_member_with_a_longer_ttl_is_waited_for_by_its_own_ttl() {
    s3(Duration::from_secs(60)).await.unwrap();
    s3(TTL).await.unwrap();
}

/// The memory store, whose next follower read of one lease key fails once armed.
#[derive(Debug)]
struct FailOnce {
    store: MemoryStore,
    armed: Mutex<Option<LeaseKey>>,
}

#[async_trait]
impl LeaseBackend for FailOnce {
    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        self.store.read(key).await
    }
    async fn read_if_changed(
        &self,
        key: &LeaseKey,
        known: Option<&Revision>,
    ) -> Result<IfChanged, Error> {
        let fail = {
            let mut armed = self.armed.lock().unwrap();
            armed.take_if(|k| k == key).is_some()
        };
        if fail {
            return Err(Error::Backend {
                message: "a failed read, played by the test".to_owned(),
                source: None,
            });
        }
        Ok(IfChanged::compared(self.store.read(key).await?, known))
    }
    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        self.store.write(request).await
    }
}

#[async_trait]
impl FencedCas for FailOnce {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        self.store.get_fenced(object).await
    }
    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        self.store.put_fenced_if(put).await
    }
}

/// Every shard `handles` led at the start of a window that any of them stopped leading
/// during it.
async fn lost_during(handles: &[&ShardedHandle], window: Duration) -> Vec<(usize, u32)> {
    let before = one_owner(handles).unwrap();
    let end = Instant::now() + window;
    let mut lost = Vec::new();
    while Instant::now() < end {
        let now = one_owner(handles).unwrap();
        for (i, led) in before.iter().enumerate() {
            for s in led.keys() {
                if !now[i].contains_key(s) && !lost.contains(&(i, *s)) {
                    lost.push((i, *s));
                }
            }
        }
        sleep(Duration::from_millis(10)).await;
    }
    lost
}

/// L1. The coordinator leaves; the successor's first read of the other member fails once.
/// Neither gives up a shard.
#[tokio::test(start_paused = true)]
async fn l1_a_new_coordinators_failed_first_read_moves_no_shard() {
    let store = MemoryStore::new();
    let c = builder(&Arc::new(store.clone()), "c", 6)
        .build()
        .unwrap()
        .spawn();
    work(&c);
    until("c leads every shard", TTL, || c.led().len() == 6).await;
    let side = |_| {
        Arc::new(FailOnce {
            store: store.clone(),
            armed: Mutex::new(None),
        })
    };
    let (x_side, y_side) = (side(0), side(1));
    let x = builder(&x_side, "x", 6).build().unwrap().spawn();
    work(&x);
    let y = builder(&y_side, "y", 6).build().unwrap().spawn();
    work(&y);
    until("two each", 2 * TTL, || {
        c.led().len() == 2 && x.led().len() == 2 && y.led().len() == 2
    })
    .await;
    sleep(TTL).await;
    *x_side.armed.lock().unwrap() = Some(member_key("y"));
    *y_side.armed.lock().unwrap() = Some(member_key("x"));
    c.shutdown().await;
    let lost = lost_during(&[&x, &y], 4 * TTL).await;
    assert!(lost.is_empty(), "shards given up: {lost:?}");
}

/// L1. An operator deletes the roster; nothing else changes. No shard moves.
#[tokio::test(start_paused = true)]
async fn l1_a_deleted_roster_moves_no_shard() {
    let store = Arc::new(MemoryStore::new());
    let c = builder(&store, "c", 4).build().unwrap().spawn();
    work(&c);
    until("c leads every shard", TTL, || c.led().len() == 4).await;
    let x = builder(&store, "x", 4).build().unwrap().spawn();
    work(&x);
    until("two each", TTL, || c.led().len() == 2 && x.led().len() == 2).await;
    sleep(TTL).await;
    store.delete_object(&object("queues.roster"));
    let lost = lost_during(&[&c, &x], 4 * TTL).await;
    assert!(lost.is_empty(), "shards given up: {lost:?}");
    let status = read_status(&*store, &key()).await.unwrap().unwrap();
    assert_eq!(status.members.len(), 2, "{status:?}");
}

/// L2. t's write of shard 1 (on an absent record) gets no answer and never lands; y joins,
/// and the plan gives shard 1 to either. Both shards must be led.
#[tokio::test(start_paused = true)]
async fn l2_a_write_that_never_lands_leaves_no_shard_unled() {
    let store = MemoryStore::new();
    let t_side = Parking::new(&store);
    t_side.arm("queues.s.1", true);
    let t = builder(&t_side, "t", 2).build().unwrap().spawn();
    work(&t);
    t_side.arrived().await; // and never let go: the write was dropped
    let y = builder(&Arc::new(store.clone()), "y", 2)
        .build()
        .unwrap()
        .spawn();
    work(&y);
    let end = Instant::now() + 4 * TTL;
    loop {
        let led = one_owner(&[&t, &y]).unwrap();
        if led.iter().map(BTreeMap::len).sum::<usize>() == 2 {
            break;
        }
        assert!(Instant::now() < end, "not both led 4 ttls later: {led:?}");
        sleep(Duration::from_millis(10)).await;
    }
}

/// L3. The operator deletes the plan, and x crashes and restarts under the same id: the plan
/// is written again and x leads its share.
#[tokio::test(start_paused = true)]
async fn l3_a_deleted_plan_is_written_again() {
    let store = Arc::new(MemoryStore::new());
    let c = builder(&store, "c", 4).build().unwrap().spawn();
    work(&c);
    until("c leads every shard", TTL, || c.led().len() == 4).await;
    let (x, task) = builder(&store, "x", 4).build().unwrap().into_parts();
    let task = tokio::spawn(task);
    work(&x);
    until("two each", TTL, || c.led().len() == 2 && x.led().len() == 2).await;
    store.delete_object(&object("queues.plan"));
    task.abort(); // a crash: no release
    let x = builder(&store, "x", 4).build().unwrap().spawn();
    work(&x);
    until("two each again", 4 * TTL, || {
        c.led().len() == 2 && x.led().len() == 2
    })
    .await;
    one_owner(&[&c, &x]).unwrap();
}

/// Ownership by id alone. a leads shard 1 (c leads shard 0). The operator deletes a's member
/// record and the token lease, and a second process starts under the id `a`: it takes the
/// membership at once and sees no history. The shard record names a's earlier term: a new
/// process must not take it over before that term's deadline has passed, while the first
/// process may still act.
async fn same_id(flaw: ShardFlaw) -> Result<(), String> {
    let store = Arc::new(MemoryStore::new());
    let c = builder(&store, "c", 2).build().unwrap().spawn();
    work(&c);
    until("c leads both", TTL, || c.led().len() == 2).await;
    let first = builder(&store, "a", 2).flaw(flaw).build().unwrap().spawn();
    work(&first);
    until("one each", TTL, || {
        c.led().len() == 1 && first.led().len() == 1
    })
    .await;
    next_renew_of(&store, "a").await;
    store.delete(&member_key("a"));
    store.delete(&LeaseKey::new("queues.tokens").unwrap());
    let second = builder(&store, "a", 2).flaw(flaw).build().unwrap().spawn();
    work(&second);
    let end = Instant::now() + 2 * TTL;
    while Instant::now() < end {
        one_owner(&[&c, &first, &second])?;
        sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_second_process_under_the_same_id_inherits_no_term() {
    same_id(ShardFlaw::None).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn with_ownership_by_id_a_second_process_leads_beside_the_first() {
    let found = same_id(ShardFlaw::OwnerById).await;
    eprintln!("caught: {found:?}");
    assert!(found.is_err(), "the planted flaw went unnoticed");
}

// The second review of the coordinator's design.

/// The memory store as one instance reaches it; every write of an object named in `dropping`
/// is lost on the way (never applied, never answered).
#[derive(Debug)]
struct Dropping {
    store: MemoryStore,
    dropping: Mutex<Vec<ObjectName>>,
}

#[async_trait]
impl LeaseBackend for Dropping {
    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        self.store.read(key).await
    }
    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        self.store.write(request).await
    }
}

#[async_trait]
impl FencedCas for Dropping {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        self.store.get_fenced(object).await
    }
    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        if self.dropping.lock().unwrap().contains(put.object) {
            return std::future::pending().await;
        }
        self.store.put_fenced_if(put).await
    }
}

/// R1. a judges shard 0 absent, reserves k1 and writes, slowly (the answer still comes in
/// time). Meanwhile b reserves k2 > k1, takes the absent record, acts, and releases it; an
/// operator deletes the released record; a's write lands on the absence. a must not act with
/// a token below b's.
async fn r1(flaw: ShardFlaw) -> Result<(), String> {
    let store = MemoryStore::new();
    let a_side = Parking::new(&store);
    a_side.arm("queues.s.0", false);
    let a = builder(&a_side, "a", 1).flaw(flaw).build().unwrap().spawn();
    work(&a);
    a_side.arrived().await;
    let mut b = FakeMember::join(&store, "b", 1, "r:0").await;
    let k2 = reserve(&store, "b").await;
    b.take(&store, 0, Expected::Absent, k2).await;
    b.client.renew().await.unwrap(); // b reads back and acts with k2
    let found = store
        .get_fenced(&object("queues.s.0"))
        .await
        .unwrap()
        .unwrap();
    b.write(
        &store,
        0,
        Expected::Revision(found.revision),
        "released",
        k2,
    )
    .await;
    b.set_claims("r:");
    b.client.renew().await.unwrap();
    store.delete_object(&object("queues.s.0"));
    a_side.go();
    until("a leads shard 0", 2 * TTL, || a.led().contains_key(&0)).await;
    let k = a.led()[&0].get();
    if k < k2 {
        return Err(format!("b acted with token {k2}, then a with {k}"));
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn r1_a_late_absent_take_acts_with_a_token_above_the_owner_before() {
    r1(ShardFlaw::None).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn r1_without_the_token_recheck_the_token_goes_down() {
    let found = r1(ShardFlaw::NoTokenRecheck).await;
    eprintln!("caught: {found:?}");
    assert!(found.is_err(), "the planted flaw went unnoticed");
}

/// R2. b once read x's member record absent (x paused, its record deleted) and took x's
/// shard. x comes back in a new term and leads shard 1; b never reads x's record meanwhile.
/// Then the operator deletes x's record and shard 1's record, right after x's renew: nobody
/// may lead shard 1 before x's deadline (b's old absence timer is for x's old term).
#[tokio::test(start_paused = true)]
async fn r2_an_absence_is_timed_for_the_members_latest_term() {
    let store = MemoryStore::new();
    let plain = Arc::new(store.clone());
    let c = builder(&plain, "c", 3).build().unwrap().spawn();
    work(&c);
    until("c leads every shard", TTL, || c.led().len() == 3).await;
    let mut x = FakeMember::join(&store, "x", 3, "r:2").await;
    let revision = released(&store, 2, &mut x).await;
    let k = reserve(&store, "x").await;
    x.take(&store, 2, revision, k).await;
    x.client.renew().await.unwrap();
    // x is paused (no renew from now on) and the operator deletes its member record.
    store.delete(&member_key("x"));
    let b = builder(&plain, "b", 3).build().unwrap().spawn();
    work(&b);
    until("b leads shard 2", 4 * TTL, || b.led().contains_key(&2)).await;
    // x resumes: a new membership term, listed again; the plan gives it shard 1.
    x.rejoin(&store, "r:").await;
    let revision = released(&store, 1, &mut x).await;
    let k = reserve(&store, "x").await;
    x.take(&store, 1, revision, k).await;
    x.set_claims("r:1");
    x.client.renew().await.unwrap();
    let end = Instant::now() + 2 * TTL;
    while Instant::now() < end {
        sleep(Duration::from_secs(5)).await;
        x.client.renew().await.unwrap();
    }
    store.delete(&member_key("x"));
    store.delete_object(&object("queues.s.1"));
    // x acts until its next renew finds its record gone: 7.5 s at least.
    let x_stops = Instant::now() + Duration::from_millis(7_500);
    while Instant::now() < x_stops {
        assert!(
            !b.led().contains_key(&1) && !c.led().contains_key(&1),
            "shard 1 led while x, live, claims and acts on it"
        );
        sleep(Duration::from_millis(5)).await;
    }
}

/// R3's setting: c starts and leads both shards; x takes shard 1 from c's release and acts
/// on it; an operator deletes its record and a late write of t's names t, which then leaves;
/// c is cut off after its next renew, and the operator deletes the roster and the plan.
/// Returns x, when it last renewed, and c.
async fn r3_setting(store: &MemoryStore) -> (FakeMember, Instant, ShardedHandle) {
    let cut = FaultControl::new();
    let c_side = Arc::new(FaultyStore::new(store.clone(), 3, vec![cut.clone()]));
    let c = builder(&c_side, "c", 2).build().unwrap().spawn();
    work(&c);
    until("c leads both", 4 * TTL, || c.led().len() == 2).await;
    let mut x = FakeMember::join(store, "x", 2, "r:1").await;
    let revision = released(store, 1, &mut x).await;
    let k = reserve(store, "x").await;
    x.take(store, 1, revision, k).await;
    x.client.renew().await.unwrap(); // x acts on shard 1 from here on
    let mut t = FakeMember::join(store, "t", 2, "r:").await;
    store.delete_object(&object("queues.s.1"));
    let k = reserve(store, "t").await;
    t.take(store, 1, Expected::Absent, k).await;
    assert!(t.client.release().await.unwrap());
    let x_renewed = Instant::now();
    next_renew_of(store, "c").await;
    cut.update(|f| f.down = true);
    store.delete_object(&object("queues.roster"));
    store.delete_object(&object("queues.plan"));
    (x, x_renewed, c)
}

/// For `span`, keeps x live (and listed again when a plan names another roster); an error as
/// soon as `other` (named `name`) leads shard 1.
async fn x_keeps_shard_1(
    store: &MemoryStore,
    x: &mut FakeMember,
    mut x_renewed: Instant,
    other: &ShardedHandle,
    name: &str,
    span: Duration,
) -> Result<(), String> {
    let end = Instant::now() + span;
    while Instant::now() < end {
        if x_renewed.elapsed() >= Duration::from_secs(5) {
            x.client.renew().await.unwrap();
            x_renewed = Instant::now();
        }
        list_again_if_planned_elsewhere(store, x).await;
        if other.led().contains_key(&1) {
            return Err(format!("{name} leads shard 1 while x, live, claims it"));
        }
        sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// R3. S1's setting with the record in S2's state: x leads shard 1; after an operator's
/// delete a late write of t names t (which does not act) and t leaves. Then the coordinator
/// dies, and the operator deletes the roster and the plan. A new instance j, which knows
/// nobody, must not take shard 1 while x claims it, although the record names an ended term.
async fn r3(flaw: ShardFlaw) -> Result<(), String> {
    let store = MemoryStore::new();
    let (mut x, x_renewed, _c) = r3_setting(&store).await;
    let j = builder(&Arc::new(store.clone()), "j", 2)
        .flaw(flaw)
        .build()
        .unwrap()
        .spawn();
    work(&j);
    x_keeps_shard_1(&store, &mut x, x_renewed, &j, "j", 4 * TTL).await
}

#[tokio::test(start_paused = true)]
async fn r3_a_new_coordinator_knowing_nobody_takes_no_ended_term_record() {
    r3(ShardFlaw::None).await.unwrap();
}

/// With a roster written again that takes the creation mark of the key's first roster (which
/// the history mark names), j trusts it at once and takes shard 1 beside x.
#[tokio::test(start_paused = true)]
async fn r3_with_the_first_rosters_mark_reused_j_takes_beside_x() {
    let found = r3(ShardFlaw::RosterFromMark).await;
    assert!(
        found.is_err_and(|e| e.contains("while x, live, claims it")),
        "the planted flaw was not caught"
    );
}

/// R4. x's writes of shards 2 and 3 are lost on the way, and so is y's write of shard 3 (the
/// plan moved it to y meanwhile): both keep shard 3 as an unknown outcome. Once the network
/// heals, every shard must be led again.
#[tokio::test(start_paused = true)]
async fn r4_two_unknown_outcomes_on_one_shard_leave_it_led() {
    let store = MemoryStore::new();
    let c = builder(&Arc::new(store.clone()), "c", 4)
        .build()
        .unwrap()
        .spawn();
    work(&c);
    until("c leads every shard", TTL, || c.led().len() == 4).await;
    let dropping = |names: &[&str]| {
        Arc::new(Dropping {
            store: store.clone(),
            dropping: Mutex::new(names.iter().map(|n| object(n)).collect()),
        })
    };
    let x_side = dropping(&["queues.s.2", "queues.s.3"]);
    let y_side = dropping(&["queues.s.3"]);
    let x = builder(&x_side, "x", 4).build().unwrap().spawn();
    work(&x);
    let end = Instant::now() + 2 * TTL;
    while !record_text(&store, "queues.s.3")
        .await
        .is_some_and(|t| t.contains("released"))
    {
        assert!(Instant::now() < end, "c never released shard 3");
        sleep(Duration::from_millis(5)).await;
    }
    let y = builder(&y_side, "y", 4).build().unwrap().spawn();
    work(&y);
    sleep(2 * TTL).await;
    x_side.dropping.lock().unwrap().clear();
    y_side.dropping.lock().unwrap().clear();
    let end = Instant::now() + 4 * TTL;
    loop {
        let led = one_owner(&[&c, &x, &y]).unwrap();
        if led.iter().map(BTreeMap::len).sum::<usize>() == 4 {
            break;
        }
        assert!(
            Instant::now() < end,
            "not every shard led 4 ttls later: {led:?}"
        );
        sleep(Duration::from_millis(10)).await;
    }
}

// The third review of the coordinator's design, and the coordinator lease's renew.

/// The memory store as one instance reaches it: its follower read of one key may lag (it
/// returns an older record that was written, as the contract allows); and the next write of
/// one lease key fails once, when armed.
#[derive(Debug)]
struct Lagging {
    store: MemoryStore,
    frozen: Mutex<Option<(LeaseKey, Stored)>>,
    fail_next: Mutex<Option<LeaseKey>>,
}

impl Lagging {
    fn new(store: &MemoryStore) -> Arc<Self> {
        Arc::new(Self {
            store: store.clone(),
            frozen: Mutex::new(None),
            fail_next: Mutex::new(None),
        })
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
        let frozen = self.frozen.lock().unwrap().clone();
        if let Some((k, stale)) = frozen
            && k == *key
        {
            return Ok(IfChanged::compared(Some(stale), known));
        }
        Ok(IfChanged::compared(self.store.read(key).await?, known))
    }
    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        let fail = self
            .fail_next
            .lock()
            .unwrap()
            .take_if(|k| *k == request.key)
            .is_some();
        if fail {
            return Err(Error::unavailable("a failed write, played by the test"));
        }
        self.store.write(request).await
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

async fn roster_term_of(store: &MemoryStore, id: &str) -> Option<u64> {
    let found = store.get_fenced(&object("queues.roster")).await.unwrap()?;
    let roster: serde_json::Value = serde_json::from_slice(&found.value).unwrap();
    roster["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == id)
        .and_then(|e| e["term"].as_u64())
}

/// R5. x lists itself in term M1, then (a blip) in M2. The coordinator's follower read of x's
/// record still shows M1. The roster must not go back to listing x in M1 while x lives in M2.
#[tokio::test(start_paused = true)]
async fn r5_a_lagging_read_does_not_list_a_member_back_in_an_older_term() {
    let store = MemoryStore::new();
    let c_side = Lagging::new(&store);
    let c = builder(&c_side, "c", 2).build().unwrap().spawn();
    work(&c);
    until("c leads both", TTL, || c.led().len() == 2).await;
    let mut x = FakeMember::join(&store, "x", 2, "r:").await;
    let m1 = x.token;
    sleep(Duration::from_secs(2)).await; // the coordinator has looked at x
    x.client.renew().await.unwrap();
    let stale = store.read(&member_key("x")).await.unwrap().unwrap();
    *c_side.frozen.lock().unwrap() = Some((member_key("x"), stale));
    x.client.end_term("a blip, played by the test");
    x.rejoin(&store, "r:").await;
    let m2 = x.token;
    assert!(m2 > m1);
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        let listed = roster_term_of(&store, "x").await;
        assert_ne!(
            listed,
            Some(m1.get()),
            "x lives in term {m2} but was listed back in its ended term {m1}"
        );
        sleep(Duration::from_millis(10)).await;
    }
}

/// One failed renew of the coordinator lease: the coordinator keeps it (the same term), as
/// it keeps its membership through one failed renew.
#[tokio::test(start_paused = true)]
async fn one_failed_renew_keeps_the_coordinator_lease() {
    let store = MemoryStore::new();
    let c_side = Lagging::new(&store);
    let c = builder(&c_side, "c", 2).build().unwrap().spawn();
    work(&c);
    until("c leads both", TTL, || c.led().len() == 2).await;
    let coord = LeaseKey::new("queues.coord").unwrap();
    let before = store.read(&coord).await.unwrap().unwrap().record.token;
    *c_side.fail_next.lock().unwrap() = Some(coord.clone());
    sleep(2 * TTL).await;
    assert!(
        c_side.fail_next.lock().unwrap().is_none(),
        "no renew was tried"
    );
    let after = store.read(&coord).await.unwrap().unwrap();
    assert!(after.record.is_held());
    assert_eq!(
        after.record.token, before,
        "the coordinator lease changed term"
    );
}

/// G1 (from the review of the roster gap's reads). c crashes; an operator deletes its member
/// record and the roster. Nobody may take c's shards before a ttl of c's absence on its own
/// clock, nor before the roster can be trusted again (a ttl after a plan names it): the two
/// waits run side by side, so c's shards move about a ttl after the crash. A taker that looked
/// at no shard record while the roster could not be trusted started its clock on c's
/// absence only after that, and moved them a ttl later.
#[tokio::test(start_paused = true)]
async fn g1_a_dead_members_shards_move_within_a_ttl_when_the_roster_is_deleted_too() {
    let store = Arc::new(MemoryStore::new());
    let n = 30;
    let a = builder(&store, "a", n).build().unwrap().spawn();
    work(&a);
    sleep(Duration::from_secs(2)).await;
    let b = builder(&store, "b", n).build().unwrap().spawn();
    work(&b);
    let (c, task) = builder(&store, "c", n).build().unwrap().into_parts();
    let task = tokio::spawn(task);
    work(&c);
    until("a balanced fleet of three", 4 * TTL, || {
        one_owner(&[&a, &b, &c]).is_ok_and(|led| led.iter().all(|l| l.len() == 10))
    })
    .await;
    sleep(Duration::from_secs(5)).await;
    task.abort();
    store.delete(&member_key("c"));
    store.delete_object(&object("queues.roster"));
    let crashed = Instant::now();
    let mut took = None;
    while Instant::now() < crashed + 4 * TTL {
        let led = one_owner(&[&a, &b]).unwrap();
        if led.iter().map(BTreeMap::len).sum::<usize>() == n as usize {
            took = Some(crashed.elapsed());
            break;
        }
        sleep(Duration::from_millis(10)).await;
    }
    let took = took.expect("c's shards not led within four ttls");
    assert!(
        took < TTL + TTL / 2,
        "c's shards moved {took:?} after the crash; expected about a ttl"
    );
    drop(c);
}

/// G2 (seed 15149 of the sharded simulation). a leads shard s. The operator deletes a's
/// member record, a second process starts under the id `a` and takes the membership at once,
/// and the operator deletes s's record. The first process acts on s until its next renew
/// fails; its claim of s was in the record the second one replaced. A taker, the second
/// process included, must count that earlier term of `a` as claiming every shard until it is
/// over (a ttl after the later term was first seen), not read the later term's claims as all
/// of `a`'s.
async fn same_id_shard_deleted() -> Result<(), String> {
    let store = Arc::new(MemoryStore::new());
    let c = builder(&store, "c", 2).build().unwrap().spawn();
    work(&c);
    until("c leads both", TTL, || c.led().len() == 2).await;
    let first = builder(&store, "a", 2).build().unwrap().spawn();
    work(&first);
    until("one each", TTL, || {
        c.led().len() == 1 && first.led().len() == 1
    })
    .await;
    let s = *first.led().keys().next().unwrap();
    next_renew_of(&store, "a").await;
    store.delete(&member_key("a"));
    let second = builder(&store, "a", 2).build().unwrap().spawn();
    work(&second);
    sleep(Duration::from_millis(300)).await;
    store.delete_object(&object(&format!("queues.s.{s}")));
    let end = Instant::now() + 2 * TTL;
    while Instant::now() < end {
        one_owner(&[&c, &first, &second])?;
        sleep(Duration::from_millis(5)).await;
    }
    // Two live processes under one id take the membership from each other for as long as
    // both run (distinct ids are the remedy); once the first one is gone, the shard is led
    // again by a live process.
    first.shutdown().await;
    let end = Instant::now() + 4 * TTL;
    while !(c.led().contains_key(&s) || second.led().contains_key(&s)) {
        if Instant::now() >= end {
            return Err(format!("shard {s} not led again within four ttls"));
        }
        one_owner(&[&c, &second])?;
        sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn g2_an_earlier_term_of_our_own_id_claims_every_shard_until_it_is_over() {
    same_id_shard_deleted().await.unwrap();
}

/// G2 as the review of its fix played it: the shard record deleted before the second
/// process starts, or at once after, so that it never reads a record naming the first
/// process's term; only the later term seen in the roster or the member record tells it.
async fn same_id_shard_deleted_early(delete_before: bool) -> Result<(), String> {
    let store = Arc::new(MemoryStore::new());
    let c = builder(&store, "c", 2).build().unwrap().spawn();
    work(&c);
    until("c leads both", TTL, || c.led().len() == 2).await;
    let first = builder(&store, "a", 2).build().unwrap().spawn();
    work(&first);
    until("one each", TTL, || {
        c.led().len() == 1 && first.led().len() == 1
    })
    .await;
    let s = *first.led().keys().next().unwrap();
    next_renew_of(&store, "a").await;
    store.delete(&member_key("a"));
    if delete_before {
        store.delete_object(&object(&format!("queues.s.{s}")));
    }
    let second = builder(&store, "a", 2).build().unwrap().spawn();
    work(&second);
    if !delete_before {
        store.delete_object(&object(&format!("queues.s.{s}")));
    }
    let end = Instant::now() + 2 * TTL;
    while Instant::now() < end {
        one_owner(&[&c, &first, &second])?;
        sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn g2_with_the_shard_record_deleted_before_the_second_process_starts() {
    same_id_shard_deleted_early(true).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn g2_with_the_shard_record_deleted_as_the_second_process_starts() {
    same_id_shard_deleted_early(false).await.unwrap();
}

/// The memory store, with roster reads held while `slow` is set.
#[derive(Debug)]
struct SlowRoster {
    store: MemoryStore,
    slow: Arc<AtomicBool>,
}

#[async_trait]
impl LeaseBackend for SlowRoster {
    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        self.store.read(key).await
    }
    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        self.store.write(request).await
    }
}

#[async_trait]
impl FencedCas for SlowRoster {
    async fn get_fenced(&self, o: &ObjectName) -> Result<Option<FencedObject>, Error> {
        if *o == object("queues.roster") {
            while self.slow.load(Ordering::SeqCst) {
                sleep(Duration::from_millis(5)).await;
            }
        }
        self.store.get_fenced(o).await
    }
    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        self.store.put_fenced_if(put).await
    }
}

/// G3 (the third review of G2's fix). As G2, but the second process's first roster read is
/// slow. The coordinator must not replace `a`'s entry of the earlier term by the later one
/// meanwhile (that entry is how the second process learns of the earlier term, whose shard
/// record was deleted): it lists only ids the roster lists in no term, once the earlier term
/// is over and pruned.
#[tokio::test(start_paused = true)]
async fn g3_the_coordinator_does_not_hide_an_earlier_term_from_its_successor() {
    let store = Arc::new(MemoryStore::new());
    let c = builder(&store, "c", 2).build().unwrap().spawn();
    work(&c);
    until("c leads both", TTL, || c.led().len() == 2).await;
    let first = builder(&store, "a", 2).build().unwrap().spawn();
    work(&first);
    until("one each", TTL, || {
        c.led().len() == 1 && first.led().len() == 1
    })
    .await;
    let s = *first.led().keys().next().unwrap();
    let t1 = roster_term_of(&store, "a").await.unwrap();
    next_renew_of(&store, "a").await;
    store.delete(&member_key("a"));
    store.delete_object(&object(&format!("queues.s.{s}")));
    let slow = Arc::new(AtomicBool::new(true));
    let side = Arc::new(SlowRoster {
        store: (*store).clone(),
        slow: slow.clone(),
    });
    let second = builder(&side, "a", 2).build().unwrap().spawn();
    work(&second);
    // Until the roster lists a in a later term (the coordinator's doing: the second process
    // cannot read the roster yet), or for two ttls.
    let end = Instant::now() + 2 * TTL;
    while Instant::now() < end && roster_term_of(&store, "a").await.is_none_or(|t| t <= t1) {
        one_owner(&[&c, &first, &second]).unwrap();
        sleep(Duration::from_millis(5)).await;
    }
    slow.store(false, Ordering::SeqCst);
    let end = Instant::now() + 2 * TTL;
    while Instant::now() < end {
        one_owner(&[&c, &first, &second]).unwrap();
        sleep(Duration::from_millis(5)).await;
    }
}

/// Until a and b lead two shards each (within `within`), which must come less than half a
/// ttl after `started`: the fleet shared its shards without waiting a ttl.
async fn shared_without_a_wait(
    a: &ShardedHandle,
    b: &ShardedHandle,
    started: Instant,
    within: Duration,
) {
    until("both lead two shards each", within, || {
        one_owner(&[a, b]).is_ok_and(|led| led.iter().all(|l| l.len() == 2))
    })
    .await;
    let took = started.elapsed();
    assert!(
        took < TTL / 2,
        "the fleet took {took:?} to share the shards"
    );
}

/// K1, a fleet starting together on a new key. a holds the coordinator lease, but b's history
/// mark lands first (a's is held on its way), so b creates the key's first roster. a, the
/// coordinator, must trust that roster at its first look (the mark names it) and plan at once:
/// every shard led within a few polls, not after a wait of a ttl for members to list
/// themselves again (the wait of a roster written again after a delete, which a first look
/// could not tell from this one before the mark named the first roster).
#[tokio::test(start_paused = true)]
async fn k1_a_coordinator_that_lost_the_mark_race_trusts_the_first_roster() {
    let store = MemoryStore::new();
    let a_side = Parking::new(&store);
    a_side.arm("queues.history", false);
    let n = 4;
    let a = builder(&a_side, "a", n).build().unwrap().spawn();
    work(&a);
    a_side.arrived().await;
    let started = Instant::now();
    let b = builder(&Arc::new(store.clone()), "b", n)
        .build()
        .unwrap()
        .spawn();
    work(&b);
    while store
        .get_fenced(&object("queues.roster"))
        .await
        .unwrap()
        .is_none()
    {
        assert!(started.elapsed() < TTL, "b never created the roster");
        sleep(Duration::from_millis(5)).await;
    }
    a_side.go();
    shared_without_a_wait(&a, &b, started, TTL).await;
    let coord = store
        .read(&LeaseKey::new("queues.coord").unwrap())
        .await
        .unwrap()
        .expect("a coordinator");
    assert_eq!(coord.record.holder.as_str(), "a", "a coordinates");
}

/// K2. a's mark names the roster it creates next, but that roster's write is lost on its way
/// (it may still land). Before a writes another roster, its mark must name none: else the
/// lost write, landing after an operator deleted the roster written instead, would pass for
/// the key's first roster at every first look.
#[tokio::test(start_paused = true)]
async fn k2_a_first_roster_write_lost_on_its_way_voids_the_mark() {
    let store = MemoryStore::new();
    let a_side = Parking::new(&store);
    a_side.arm("queues.roster", true);
    let a = builder(&a_side, "a", 2).build().unwrap().spawn();
    work(&a);
    a_side.arrived().await;
    let mark = object("queues.history");
    let named = store.get_fenced(&mark).await.unwrap().expect("a's mark");
    assert!(
        String::from_utf8_lossy(&named.value).starts_with("first-roster "),
        "a's mark names no roster: {:?}",
        String::from_utf8_lossy(&named.value)
    );
    until("a leads both shards", 4 * TTL, || a.led().len() == 2).await;
    let now = store.get_fenced(&mark).await.unwrap().expect("the mark");
    assert!(
        now.value.is_empty(),
        "a wrote another roster while its mark still names the lost one: {:?}",
        String::from_utf8_lossy(&now.value)
    );
    // The lost write lands after an operator's delete, and names a roster nobody trusts.
    store.delete_object(&object("queues.roster"));
    a_side.go();
    sleep(Duration::from_millis(100)).await;
    let landed = store.get_fenced(&object("queues.roster")).await.unwrap();
    assert!(landed.is_some(), "the lost write did not land");
}

/// K3 (the review of the first-roster mark). a's mark names X, X's write is lost on its way,
/// and a crashes before it writes any other roster (so it never voids its own mark). c creates
/// Y a renew period later; R3's setting follows on Y. Then the operator deletes Y, the plan
/// and the token lease (on etcd and ZooKeeper a reserver that dies holding it removes it too),
/// and X lands. j, new, must not trust X at its first look: x, live, is not in it.
#[tokio::test(start_paused = true)]
async fn k3_a_first_roster_landing_after_its_creator_crashed_is_not_trusted() {
    let store = MemoryStore::new();
    let a_side = Parking::new(&store);
    a_side.arm("queues.roster", true);
    let (a, a_task) = builder(&a_side, "a", 2).build().unwrap().into_parts();
    let a_task = tokio::spawn(a_task);
    a_side.arrived().await;
    a_task.abort();
    let _ = a_task.await;
    drop(a);
    let (mut x, x_renewed, _c) = r3_setting(&store).await;
    store.delete(&LeaseKey::new("queues.tokens").unwrap());
    a_side.go(); // X, lost on its way, lands now
    sleep(Duration::from_millis(50)).await;
    assert!(
        store
            .get_fenced(&object("queues.roster"))
            .await
            .unwrap()
            .is_some(),
        "X did not land"
    );
    let j = builder(&Arc::new(store.clone()), "j", 2)
        .build()
        .unwrap()
        .spawn();
    work(&j);
    x_keeps_shard_1(&store, &mut x, x_renewed, &j, "j", 4 * TTL)
        .await
        .unwrap();
}

/// K4 (the same review). As K3, but a does not crash: it is cut off from the store from its
/// lost write of X until X lands after Y's time. a must not take X for the roster it last
/// saw (it never saw X there): it waits for every live member to list itself again, and so
/// does not take shard 1 while x, live, claims it.
#[tokio::test(start_paused = true)]
async fn k4_a_creators_own_roster_landing_late_is_not_trusted_by_it() {
    let store = MemoryStore::new();
    let a_side = Parking::new(&store);
    a_side.arm("queues.roster", true);
    let a = builder(&a_side, "a", 2).build().unwrap().spawn();
    work(&a);
    a_side.arrived().await;
    a_side.frozen.store(true, Ordering::SeqCst);
    let (mut x, x_renewed, _c) = r3_setting(&store).await;
    a_side.go(); // X, lost on its way, lands now
    sleep(Duration::from_millis(50)).await;
    a_side.frozen.store(false, Ordering::SeqCst);
    x_keeps_shard_1(&store, &mut x, x_renewed, &a, "a", 4 * TTL)
        .await
        .unwrap();
}

/// Refuses the coordinator-lease writes of one instance while `refuse` is set (another
/// instance must coordinate meanwhile).
#[derive(Debug)]
struct NoCoord {
    inner: Arc<Parking>,
    refuse: AtomicBool,
}

#[async_trait]
impl LeaseBackend for NoCoord {
    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        self.inner.read(key).await
    }
    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        if self.refuse.load(Ordering::SeqCst) && request.key.as_str() == "queues.coord" {
            return Ok(WriteOutcome::Conflict { current: None });
        }
        self.inner.write(request).await
    }
}

#[async_trait]
impl FencedCas for NoCoord {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        self.inner.get_fenced(object).await
    }
    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        self.inner.put_fenced_if(put).await
    }
}

/// K5 (the second review of the first-roster mark). As K4, but a's write of X is slow, not
/// lost: it lands after Y's time and a hears that it was written (a request timeout longer
/// than the others' renew period and ttl; a pause between the mark write and the roster write
/// does the same at any timing). a must not trust X: the mark no longer names it.
#[tokio::test(start_paused = true)]
async fn k5_a_creators_roster_landing_late_with_an_answer_is_not_trusted() {
    let store = MemoryStore::new();
    let parking = Parking::new(&store);
    parking.arm("queues.roster", false);
    let a_side = Arc::new(NoCoord {
        inner: parking.clone(),
        refuse: AtomicBool::new(true),
    });
    let a = builder(&a_side, "a", 2)
        .ttl(Duration::from_secs(300))
        .request_timeout(Duration::from_secs(90))
        .margin(Duration::from_secs(180))
        .renew_every(Duration::from_secs(20))
        .build()
        .unwrap()
        .spawn();
    work(&a);
    parking.arrived().await;
    let (mut x, x_renewed, _c) = r3_setting(&store).await;
    parking.go(); // X lands now, and a hears it landed
    sleep(Duration::from_millis(50)).await;
    a_side.refuse.store(false, Ordering::SeqCst);
    x_keeps_shard_1(&store, &mut x, x_renewed, &a, "a", 40 * TTL)
        .await
        .unwrap();
}

/// K6. At a fleet's start, the answer to a's winning mark write is lost (the mark landed).
/// a must read the mark back and create the roster it names, so that nobody waits: before,
/// a drew another creation mark, nobody ever wrote the one the mark named, and the fleet
/// waited a renew period and then a ttl.
#[tokio::test(start_paused = true)]
async fn k6_a_winning_mark_whose_answer_was_lost_still_names_the_first_roster() {
    let store = MemoryStore::new();
    let a_side = Parking::new(&store);
    a_side.arm("queues.history", true);
    let a = builder(&a_side, "a", 4).build().unwrap().spawn();
    work(&a);
    a_side.arrived().await;
    a_side.go();
    let started = Instant::now();
    let b = builder(&Arc::new(store.clone()), "b", 4)
        .build()
        .unwrap()
        .spawn();
    work(&b);
    shared_without_a_wait(&a, &b, started, 6 * TTL).await;
}
