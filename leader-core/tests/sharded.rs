//! The sharded elector on the in-memory store, under paused time: balance, handover by
//! release, failover after a crash, tokens per shard, fencing, and writes that do not grow
//! with the number of shards.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use leader_core::backend::{
    FencedCas, FencedObject, FencedPut, ObjectWrite, Stored, WriteOutcome, WriteRequest,
};
use leader_core::simulation::{FaultControl, FaultyStore};
use leader_core::{
    Acquisition, Error, FencedStore, FencingToken, HolderId, LeaseBackend, LeaseClient, LeaseKey,
    MemoryStore, ObjectName, ShardedElector, ShardedHandle, Term, Timing, read_status,
};
use tokio::time::{Instant, sleep};

const TTL: Duration = Duration::from_secs(15);

/// The memory store, counting writes (lease records and objects).
#[derive(Debug, Default)]
struct Counting {
    store: MemoryStore,
    writes: AtomicU64,
    object_writes: AtomicU64,
}

#[async_trait]
impl LeaseBackend for Counting {
    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        self.store.read(key).await
    }
    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.store.write(request).await
    }
}

#[async_trait]
impl FencedCas for Counting {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        self.store.get_fenced(object).await
    }
    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        self.object_writes.fetch_add(1, Ordering::Relaxed);
        self.store.put_fenced_if(put).await
    }
}

fn key() -> LeaseKey {
    LeaseKey::new("queues").unwrap()
}

fn start<S: LeaseBackend + FencedCas + 'static>(
    store: &Arc<S>,
    id: &str,
    shards: u32,
) -> ShardedHandle {
    ShardedElector::builder(store.clone(), key(), shards)
        .ttl(TTL)
        .holder_id(HolderId::new(id).unwrap())
        .jitter_seed(id.len() as u64 * 7919 + u64::from(id.as_bytes()[id.len() - 1]))
        .build()
        .unwrap()
        .spawn()
}

/// Takes every term handed out and drops it when it ends, like well-behaved work.
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

fn counts(handles: &[&ShardedHandle]) -> Vec<usize> {
    handles.iter().map(|h| h.led().len()).collect()
}

/// Checks every 10 ms until `done` holds, that no shard is led by two instances at once;
/// returns how long it took.
async fn until_checked(
    handles: &[&ShardedHandle],
    within: Duration,
    done: impl Fn(&[BTreeMap<u32, FencingToken>]) -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        let led = one_owner(handles);
        if done(&led) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "not settled within {within:?}: {:?}",
            counts(handles)
        );
        sleep(Duration::from_millis(10)).await;
    }
}

/// What each instance leads now, checked: no shard led twice.
fn one_owner(handles: &[&ShardedHandle]) -> Vec<BTreeMap<u32, FencingToken>> {
    let led: Vec<_> = handles.iter().map(|h| h.led()).collect();
    let mut owner = BTreeMap::new();
    for (i, l) in led.iter().enumerate() {
        for s in l.keys() {
            if let Some(j) = owner.insert(*s, i) {
                panic!("shard {s} led by instances {j} and {i} at once");
            }
        }
    }
    led
}

/// Checks every 10 ms for `d` that no shard is led twice.
async fn hold(handles: &[&ShardedHandle], d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        one_owner(handles);
        sleep(Duration::from_millis(10)).await;
    }
}

fn all_led(n: u32) -> impl Fn(&[BTreeMap<u32, FencingToken>]) -> bool {
    move |led| led.iter().map(BTreeMap::len).sum::<usize>() == n as usize
}

fn balanced(n: u32) -> impl Fn(&[BTreeMap<u32, FencingToken>]) -> bool {
    move |led| {
        let c: Vec<usize> = led.iter().map(BTreeMap::len).collect();
        c.iter().sum::<usize>() == n as usize
            && c.iter().max().unwrap() - c.iter().min().unwrap() <= 1
    }
}

#[tokio::test(start_paused = true)]
async fn one_instance_leads_every_shard_and_hands_each_term_out_once() {
    let store = Arc::new(MemoryStore::new());
    let a = start(&store, "a", 8);
    let mut seen = BTreeMap::new();
    for _ in 0..8 {
        let term = a.next_term().await.unwrap();
        assert!(term.is_valid());
        assert!(
            seen.insert(term.shard().unwrap(), term).is_none(),
            "handed out twice"
        );
    }
    // Nothing more to hand out.
    assert!(tokio::time::timeout(TTL, a.next_term()).await.is_err());
    assert_eq!(a.led().len(), 8);
    let status = read_status(store.as_ref(), &key()).await.unwrap().unwrap();
    assert_eq!(status.members.len(), 1);
    assert_eq!(status.members[0].claims.len(), 8);
    assert!(status.unclaimed.is_empty());
    drop(seen);
    a.shutdown().await;
    let status = read_status(store.as_ref(), &key()).await.unwrap().unwrap();
    assert!(status.members.is_empty(), "left the roster: {status:?}");
    assert_eq!(status.unclaimed.len(), 8);
}

#[tokio::test(start_paused = true)]
async fn instances_balance_and_hand_over_by_release_not_expiry() {
    let store = Arc::new(MemoryStore::new());
    let n = 10;
    let a = start(&store, "a", n);
    work(&a);
    until_checked(&[&a], TTL, all_led(n)).await;
    let b = start(&store, "b", n);
    work(&b);
    // A handover by release: well within one ttl.
    let took = until_checked(&[&a, &b], TTL, balanced(n)).await;
    assert!(took < TTL / 2, "took {took:?}");
    let c = start(&store, "c", n);
    work(&c);
    until_checked(&[&a, &b, &c], TTL, balanced(n)).await;
    // It stays balanced, with no moves, while nothing changes.
    let before: Vec<_> = [&a, &b, &c].iter().map(|h| h.led()).collect();
    hold(&[&a, &b, &c], 3 * TTL).await;
    let after: Vec<_> = [&a, &b, &c].iter().map(|h| h.led()).collect();
    assert_eq!(before, after, "shards moved while nothing changed");
    // A graceful leave hands its shards over at once.
    c.shutdown().await;
    let took = until_checked(&[&a, &b], TTL, balanced(n)).await;
    assert!(took < TTL / 2, "took {took:?}");
}

/// The shared memory store as one instance reaches it: the simulation's fault store, whose
/// control cuts the instance off (a partition) or slows its calls.
fn through_faults(store: &MemoryStore) -> (Arc<FaultyStore<MemoryStore>>, Arc<FaultControl>) {
    let control = FaultControl::new();
    let faulty = FaultyStore::new(store.clone(), 7, vec![control.clone()]);
    (Arc::new(faulty), control)
}

#[tokio::test(start_paused = true)]
async fn a_partitioned_instance_stops_by_its_deadline_and_its_shards_move_after_a_ttl() {
    let store = MemoryStore::new();
    let (a_side, _) = through_faults(&store);
    let (b_side, cut_b) = through_faults(&store);
    let n = 12;
    let a = start(&a_side, "a", n);
    let b = start(&b_side, "b", n);
    work(&a);
    work(&b);
    until_checked(&[&a, &b], TTL, balanced(n)).await;
    let before = b.led();
    cut_b.update(|f| f.down = true);
    // b still leads until its deadline; a takes b's shards only after a ttl, and never while
    // b leads them.
    let took = until_checked(&[&a, &b], 3 * TTL, |led| led[0].len() == n as usize).await;
    assert!(b.led().is_empty());
    assert!(took > TTL * 2 / 3, "took over after only {took:?}");
    let after = a.led();
    for (s, old) in &before {
        assert!(after[s] > *old, "shard {s}: token {} after {old}", after[s]);
    }
    // Healed, b takes a new membership term and gets its share back, by release.
    cut_b.update(|f| f.down = false);
    until_checked(&[&a, &b], 2 * TTL, balanced(n)).await;
}

#[tokio::test(start_paused = true)]
async fn a_crashed_instance_shards_are_taken_after_a_ttl_with_higher_tokens() {
    let store = Arc::new(MemoryStore::new());
    let n = 6;
    let a = start(&store, "a", n);
    work(&a);
    let (b, task) = ShardedElector::builder(store.clone(), key(), n)
        .ttl(TTL)
        .holder_id(HolderId::new("b").unwrap())
        .build()
        .unwrap()
        .into_parts();
    let task = tokio::spawn(task);
    work(&b);
    until_checked(&[&a, &b], TTL, balanced(n)).await;
    let before = b.led();
    task.abort(); // no release: a crash
    let took = until_checked(&[&a], 3 * TTL, all_led(n)).await;
    assert!(took > TTL * 2 / 3, "took over after only {took:?}");
    assert!(took < TTL + Duration::from_secs(3), "took {took:?}");
    let after = a.led();
    for (s, old) in &before {
        assert!(after[s] > *old);
    }
    // The crashed member left the roster.
    sleep(Duration::from_secs(2)).await;
    let status = read_status(store.as_ref(), &key()).await.unwrap().unwrap();
    let ids: Vec<_> = status
        .members
        .iter()
        .map(|m| m.id.as_str().to_owned())
        .collect();
    assert_eq!(ids, ["a"]);
}

/// Steady state: store writes per hour do not depend on the number of shards (one membership
/// renew per instance per `renew_every`, no shard record written).
#[tokio::test(start_paused = true)]
async fn writes_per_hour_grow_with_instances_not_shards() {
    let mut per_hour = Vec::new();
    for n in [10u32, 1000] {
        let store = Arc::new(Counting::default());
        let a = start(&store, "a", n);
        let b = start(&store, "b", n);
        work(&a);
        work(&b);
        until_checked(&[&a, &b], 2 * TTL, balanced(n)).await;
        sleep(TTL).await;
        let (w0, o0) = (
            store.writes.load(Ordering::Relaxed),
            store.object_writes.load(Ordering::Relaxed),
        );
        sleep(Duration::from_secs(1800)).await;
        let writes = store.writes.load(Ordering::Relaxed) - w0;
        let objects = store.object_writes.load(Ordering::Relaxed) - o0;
        assert_eq!(
            objects, 0,
            "{n} shards: no shard record written while nothing moves"
        );
        per_hour.push(writes * 2);
        a.shutdown().await;
        b.shutdown().await;
    }
    // Two instances, one renew each per renew_every, and the coordinator's renew of its
    // lease: the same for 10 shards as for 1,000.
    assert_eq!(per_hour[0], per_hour[1], "{per_hour:?}");
    let renew_every = ShardedElector::builder(Arc::new(MemoryStore::new()), key(), 1)
        .ttl(TTL)
        .build()
        .unwrap()
        .timing()
        .renew_every;
    let expected = (3.0 * 3600.0 / renew_every.as_secs_f64()) as u64;
    assert!(
        per_hour[0].abs_diff(expected) <= 2,
        "{per_hour:?}, expected {expected}"
    );
}

/// The memory store as one instance reaches it, counting its reads of every kind, and of
/// shard records alone.
#[derive(Debug)]
struct CountingReads {
    store: MemoryStore,
    reads: AtomicU64,
    shard_reads: AtomicU64,
}

impl CountingReads {
    fn new(store: &MemoryStore) -> Arc<Self> {
        Arc::new(Self {
            store: store.clone(),
            reads: AtomicU64::new(0),
            shard_reads: AtomicU64::new(0),
        })
    }
}

#[async_trait]
impl LeaseBackend for CountingReads {
    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.store.read(key).await
    }
    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        self.store.write(request).await
    }
}

#[async_trait]
impl FencedCas for CountingReads {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        if object.as_str().contains(".s.") {
            self.shard_reads.fetch_add(1, Ordering::Relaxed);
        }
        self.store.get_fenced(object).await
    }
    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        self.store.put_fenced_if(put).await
    }
}

/// Steady state: a member that does not coordinate reads the coordinator lease and the
/// coordinator's member record each poll, however many members there are; the coordinator
/// reads the roster and every other member's record. So the fleet's reads grow with the
/// number of members, not with its square.
#[tokio::test(start_paused = true)]
async fn a_members_reads_do_not_grow_with_the_fleet() {
    let poll = ShardedElector::builder(Arc::new(MemoryStore::new()), key(), 1)
        .ttl(TTL)
        .build()
        .unwrap()
        .timing()
        .poll_every;
    let window = Duration::from_secs(600);
    let polls = window.as_secs_f64() / poll.as_secs_f64();
    for count in [3usize, 12] {
        let shared = MemoryStore::new();
        let sides: Vec<Arc<CountingReads>> =
            (0..count).map(|_| CountingReads::new(&shared)).collect();
        let n = 24;
        let handles: Vec<ShardedHandle> = sides
            .iter()
            .enumerate()
            .map(|(i, side)| start(side, &format!("m{i}"), n))
            .collect();
        for h in &handles {
            work(h);
        }
        let all: Vec<&ShardedHandle> = handles.iter().collect();
        until_checked(&all, 4 * TTL, balanced(n)).await;
        sleep(TTL).await;
        let before: Vec<u64> = sides
            .iter()
            .map(|s| s.reads.load(Ordering::Relaxed))
            .collect();
        sleep(window).await;
        let reads: Vec<f64> = sides
            .iter()
            .zip(&before)
            .map(|(s, b)| (s.reads.load(Ordering::Relaxed) - b) as f64 / polls)
            .collect();
        let coordinator = shared
            .read(&LeaseKey::new("queues.coord").unwrap())
            .await
            .unwrap()
            .unwrap()
            .record
            .holder;
        for (i, per_poll) in reads.iter().enumerate() {
            if coordinator.as_str() == format!("m{i}") {
                // The roster and every other member's record.
                assert!(
                    (*per_poll - count as f64).abs() < 0.2,
                    "{count} members: the coordinator read {per_poll:.2} a poll"
                );
            } else {
                assert!(
                    (*per_poll - 2.0).abs() < 0.1,
                    "{count} members: a member read {per_poll:.2} a poll: {reads:?}"
                );
            }
        }
        for h in handles {
            h.shutdown().await;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn tokens_rise_across_handovers_and_deletes_and_fence_stale_writes() {
    let store = Arc::new(MemoryStore::new());
    let n = 4;
    let a = start(&store, "a", n);
    let mut terms = BTreeMap::new();
    for _ in 0..n {
        let t = a.next_term().await.unwrap();
        terms.insert(t.shard().unwrap(), t);
    }
    let object = ObjectName::new("out").unwrap();
    store
        .fenced_write(terms[&0].fence(), &object, b"a")
        .await
        .unwrap();
    let first: BTreeMap<u32, FencingToken> = terms.iter().map(|(s, t)| (*s, t.token())).collect();
    let old_fence = terms[&0].fence().clone();
    drop(terms);
    a.shutdown().await;
    // The operator deletes the token lease and a shard record: tokens still rise.
    store.delete(&LeaseKey::new("queues.tokens").unwrap());
    store.delete_object(&ObjectName::new("queues.s.0").unwrap());
    let b = start(&store, "b", n);
    let mut second = BTreeMap::new();
    for _ in 0..n {
        let t = b.next_term().await.unwrap();
        assert!(
            t.token() > first[&t.shard().unwrap()],
            "shard {}",
            t.shard().unwrap()
        );
        second.insert(t.shard().unwrap(), t);
    }
    store
        .fenced_write(second[&0].fence(), &object, b"b")
        .await
        .unwrap();
    let stale = store.fenced_write(&old_fence, &object, b"late").await;
    assert!(matches!(stale, Err(Error::Fenced { .. })), "{stale:?}");
    // The operator deletes a shard record that b leads: nobody else may take it while b
    // claims it.
    store.delete_object(&ObjectName::new("queues.s.1").unwrap());
    let c = start(&store, "c", n);
    work(&c);
    // c gets its fair share (2) by b's release, never shard 1 while b leads it.
    let led_by_b: Vec<u32> = second.keys().copied().collect();
    drop(second);
    let _ = led_by_b;
    work(&b);
    until_checked(&[&b, &c], 2 * TTL, balanced(n)).await;
    hold(&[&b, &c], 2 * TTL).await;
}

#[tokio::test(start_paused = true)]
async fn an_instance_with_another_shard_count_stops_with_a_clear_error() {
    let store = Arc::new(MemoryStore::new());
    let a = start(&store, "a", 4);
    work(&a);
    until_checked(&[&a], TTL, all_led(4)).await;
    let b = start(&store, "b", 5);
    let err = b.next_term().await.unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("4 shards") && message.contains("5"),
        "{message}"
    );
    assert_eq!(a.led().len(), 4, "the running instance is not disturbed");
    for bad in [0, leader_core::MAX_SHARDS + 1] {
        let built = ShardedElector::builder(store.clone(), key(), bad).build();
        assert!(built.is_err(), "{bad} shards accepted");
    }
}

/// Taking 1,000 shards from a slow store takes many calls; the membership is renewed in the
/// middle of them, so it is never lost on the way.
#[tokio::test(start_paused = true)]
async fn a_slow_store_does_not_starve_the_membership_renew() {
    // Up to 30 ms before each call reaches the store and as long after: 30 ms a call on
    // average (a slow or busy store).
    let (store, slow) = through_faults(&MemoryStore::new());
    slow.update(|f| f.latency = Duration::from_millis(30));
    let n = 1000;
    let a = start(&store, "a", n);
    let b = start(&store, "b", n);
    work(&a);
    work(&b);
    let lost = Arc::new(AtomicU64::new(0));
    for h in [&a, &b] {
        let mut rx = h.assignment();
        let lost = lost.clone();
        tokio::spawn(async move {
            let mut was = false;
            while rx.changed().await.is_ok() {
                let member = rx.borrow().member;
                if was && !member {
                    lost.fetch_add(1, Ordering::Relaxed);
                }
                was = member;
            }
        });
    }
    until_checked(&[&a, &b], 20 * TTL, balanced(n)).await;
    assert_eq!(
        lost.load(Ordering::Relaxed),
        0,
        "a membership term was lost"
    );
}

/// At shutdown, work that takes two ttls to stop (a child given a long grace) keeps its
/// shards: the leaving instance renews meanwhile, and another takes them only once the work
/// has stopped.
#[tokio::test(start_paused = true)]
async fn a_shutdown_keeps_shards_until_their_slow_work_has_stopped() {
    let store = Arc::new(MemoryStore::new());
    let n = 4;
    let a = start(&store, "a", n);
    let acting = Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let terms = a.terms();
    let a_acting = acting.clone();
    tokio::spawn(async move {
        while let Ok(term) = terms.next().await {
            a_acting.lock().unwrap().insert(term.shard().unwrap());
            let a_acting = a_acting.clone();
            tokio::spawn(async move {
                term.cancelled().await;
                sleep(2 * TTL).await;
                a_acting.lock().unwrap().remove(&term.shard().unwrap());
                drop(term);
            });
        }
    });
    until_checked(&[&a], TTL, all_led(n)).await;
    let b = start(&store, "b", n);
    work(&b);
    // a's released shards go to b only once their work has stopped, two ttls later.
    until_checked(&[&a, &b], 4 * TTL, balanced(n)).await;
    let stopping = tokio::spawn(a.shutdown());
    let start = Instant::now();
    loop {
        let led = b.led();
        let still = acting.lock().unwrap().clone();
        for s in led.keys() {
            assert!(
                !still.contains(s),
                "b leads shard {s} while a's work still runs"
            );
        }
        if led.len() == n as usize {
            break;
        }
        assert!(start.elapsed() < 4 * TTL, "b never got every shard");
        sleep(Duration::from_millis(10)).await;
    }
    assert!(start.elapsed() >= 2 * TTL, "taken before the work stopped");
    stopping.await.unwrap();
}

/// The memory store as a store that expires leases itself (etcd, ZooKeeper): an expired
/// member record is deleted by the store (here, by the test).
#[derive(Debug, Default)]
struct Expiring {
    store: MemoryStore,
}

#[async_trait]
impl LeaseBackend for Expiring {
    fn expiry_model(&self) -> leader_core::backend::ExpiryModel {
        leader_core::backend::ExpiryModel::EnforcedByStore
    }
    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        self.store.read(key).await
    }
    async fn read_for_term(
        &self,
        key: &LeaseKey,
        _: leader_core::backend::TermId,
    ) -> Result<Option<Stored>, Error> {
        self.store.read(key).await
    }
    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        self.store.write(request).await
    }
}

#[async_trait]
impl FencedCas for Expiring {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        self.store.get_fenced(object).await
    }
    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        self.store.put_fenced_if(put).await
    }
}

/// Where the store expires a dead member's lease by deleting its record, the record's absence
/// ends its term: its shards move within a few polls of the expiry, not a ttl later.
#[tokio::test(start_paused = true)]
async fn where_the_store_expires_leases_an_expired_member_shards_move_at_once() {
    let store = Arc::new(Expiring::default());
    let n = 6;
    let a = start(&store, "a", n);
    work(&a);
    let (b, task) = ShardedElector::builder(store.clone(), key(), n)
        .ttl(TTL)
        .holder_id(HolderId::new("b").unwrap())
        .build()
        .unwrap()
        .into_parts();
    let task = tokio::spawn(task);
    work(&b);
    until_checked(&[&a, &b], TTL, balanced(n)).await;
    task.abort();
    drop(b);
    // The store expires b's lease a ttl later and deletes its record.
    sleep(TTL).await;
    let status = read_status(store.as_ref(), &key()).await.unwrap().unwrap();
    let b_record = status
        .members
        .iter()
        .find(|m| m.id.as_str() == "b")
        .map(|m| m.record.clone())
        .unwrap();
    store.store.delete(&b_record);
    let took = until_checked(&[&a], TTL, all_led(n)).await;
    assert!(
        took < Duration::from_secs(3),
        "took {took:?} after the expiry"
    );
}

/// A shard's term tells of each membership renew through `renewals`, as a single key's does,
/// and is a `Term` that names its shard.
#[tokio::test(start_paused = true)]
async fn a_shard_term_reports_each_membership_renew() {
    let store = Arc::new(MemoryStore::new());
    let handle = ShardedElector::builder(store, LeaseKey::new("queues").unwrap(), 2)
        .ttl(TTL)
        .holder_id(HolderId::new("a").unwrap())
        .jitter_seed(1)
        .build()
        .unwrap()
        .spawn();
    let term: Term = handle.next_term().await.unwrap();
    assert!(term.shard().is_some_and(|s| s < 2), "{:?}", term.shard());
    let mut renewals = term.renewals();
    let before = term.deadline();
    let renewed = renewals.next().await.unwrap();
    assert!(renewed > before, "{renewed:?} after {before:?}");
    assert_eq!(renewed, term.deadline());
    let again = renewals.next().await.unwrap();
    assert!(again > renewed);
    drop(term);
    handle.shutdown().await;
}

/// A fleet starting together on a new key trusts its first roster at once; one starting on a
/// key with a history whose roster and plan an operator deleted cannot trust the roster
/// written again (rule 3.2) until a plan has named it for a ttl. Meanwhile no take can be judged: an instance looks at the records of
/// its share once per renew period (to start its clocks on their owners), and reads each a few
/// times to take it (the take, the check after publishing), not once a poll for the length of
/// that wait (on a store that serialises its requests, such as moto, those reads starved the
/// membership renews of eight processes).
#[tokio::test(start_paused = true)]
async fn a_fleet_that_cannot_trust_its_roster_reads_few_shard_records_meanwhile() {
    let count = 6usize;
    let n = 600u32;
    let shared = MemoryStore::new();
    for round in 0..2 {
        let sides: Vec<Arc<CountingReads>> =
            (0..count).map(|_| CountingReads::new(&shared)).collect();
        let handles: Vec<ShardedHandle> = sides
            .iter()
            .enumerate()
            .map(|(i, side)| start(side, &format!("m{i}"), n))
            .collect();
        for h in &handles {
            work(h);
        }
        let all: Vec<&ShardedHandle> = handles.iter().collect();
        let took = until_checked(&all, 8 * TTL, balanced(n)).await;
        let reads: Vec<u64> = sides
            .iter()
            .map(|s| s.shard_reads.load(Ordering::Relaxed))
            .collect();
        for h in handles {
            h.shutdown().await;
        }
        if round == 0 {
            // A new key: the history mark names the roster its writer created, which every
            // other instance then trusts at its first look (nobody waits a ttl).
            assert!(took < TTL, "a new key's fleet waited {took:?}");
            shared.delete_object(&ObjectName::new("queues.roster").unwrap());
            shared.delete_object(&ObjectName::new("queues.plan").unwrap());
            continue;
        }
        assert!(took >= TTL, "the restart waited {took:?}, not a ttl");
        // The first plan may give one instance everything (two batches, each read twice).
        for r in &reads {
            assert!(
                *r <= 1100,
                "shard records read by each instance before the fleet settled ({took:?}): \
                 {reads:?}"
            );
        }
    }
}

/// The memory store as one instance reaches it, counting its shard-record reads; at its first,
/// another taker (`z`) takes the token lease, and releases it 100 ms later.
#[derive(Debug)]
struct TokensBusyAtFirstRead {
    store: MemoryStore,
    shard_reads: AtomicU64,
    other: tokio::sync::Mutex<Option<LeaseClient>>,
}

#[async_trait]
impl LeaseBackend for TokensBusyAtFirstRead {
    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        self.store.read(key).await
    }
    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        self.store.write(request).await
    }
}

#[async_trait]
impl FencedCas for TokensBusyAtFirstRead {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        if object.as_str().contains(".s.") {
            self.shard_reads.fetch_add(1, Ordering::Relaxed);
            if let Some(mut z) = self.other.lock().await.take() {
                assert!(matches!(
                    z.try_acquire().await.unwrap(),
                    Acquisition::Acquired(_)
                ));
                tokio::spawn(async move {
                    sleep(Duration::from_millis(100)).await;
                    assert!(z.release().await.unwrap());
                });
            }
        }
        self.store.get_fenced(object).await
    }
    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        self.store.put_fenced_if(put).await
    }
}

/// A batch whose token reservation meets another taker's (holding the token lease between its
/// take and its release) waits for it rather than dropping the records it has just read:
/// takers starting together on a slow store spent most of their looks reading records for
/// nothing.
#[tokio::test(start_paused = true)]
async fn a_batch_waits_a_moment_for_another_takers_reservation() {
    let store = MemoryStore::new();
    let z = LeaseClient::new(
        Arc::new(store.clone()),
        LeaseKey::new("queues.tokens").unwrap(),
        HolderId::new("z").unwrap(),
        Timing::from_ttl(TTL),
    )
    .unwrap();
    let side = Arc::new(TokensBusyAtFirstRead {
        store: store.clone(),
        shard_reads: AtomicU64::new(0),
        other: tokio::sync::Mutex::new(Some(z)),
    });
    let n = 20;
    let a = start(&side, "a", n);
    work(&a);
    until_checked(&[&a], TTL, |led| led[0].len() == n as usize).await;
    // Each record read to take it and once back after the renew: not read again for a
    // second look.
    let reads = side.shard_reads.load(Ordering::Relaxed);
    assert!(reads <= 2 * u64::from(n), "{reads} shard-record reads");
    a.shutdown().await;
}
