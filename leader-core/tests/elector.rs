//! The elector under paused time: cadence, deadlines, takeover, handover, errors, config.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leader_core::backend::{
    Expected, LeaseRecord, Stored, WriteKind, WriteNonce, WriteOutcome, WriteRequest,
};
use leader_core::simulation::{FaultControl, Faults, FaultyStore};
use leader_core::{
    ConfigError, Elector, ElectorHandle, Error, ErrorKind, FencingToken, HolderId, Leadership,
    LeaseBackend, LeaseKey, MemoryStore, Metadata,
};
use tokio::time::{Instant, sleep, timeout};

const TTL: Duration = Duration::from_secs(15);

fn key() -> LeaseKey {
    LeaseKey::new("jobs").unwrap()
}

/// Records when each applied write was sent.
#[derive(Debug, Default)]
struct Logged {
    inner: MemoryStore,
    writes: Mutex<Vec<(Instant, WriteKind, String)>>,
    /// Every read.
    reads: AtomicUsize,
    /// When each read arrived.
    read_at: Mutex<Vec<Instant>>,
}

/// Gives no change hints (the trait's default): followers poll.
#[async_trait]
impl LeaseBackend for Logged {
    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.read_at.lock().unwrap().push(Instant::now());
        self.inner.read(key).await
    }
    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        let entry = (
            Instant::now(),
            request.kind,
            request.record.holder.to_string(),
        );
        let outcome = self.inner.write(request).await?;
        if matches!(outcome, WriteOutcome::Written(_)) {
            self.writes.lock().unwrap().push(entry);
        }
        Ok(outcome)
    }
}

impl Logged {
    fn writes_by(&self, holder: &str) -> Vec<(Instant, WriteKind)> {
        self.writes
            .lock()
            .unwrap()
            .iter()
            .filter(|w| w.2 == holder)
            .map(|w| (w.0, w.1))
            .collect()
    }
}

fn elector(store: Arc<dyn LeaseBackend>, holder: &str) -> Elector {
    Elector::builder(store, key())
        .ttl(TTL)
        .holder_id(HolderId::new(holder).unwrap())
        .jitter_seed(7)
        .build()
        .unwrap()
}

/// A candidate that has seen the lease held by another and waits.
async fn follower(store: Arc<dyn LeaseBackend>, holder: &str) -> ElectorHandle {
    let handle = elector(store, holder).spawn();
    wait_until(&handle, |l| {
        matches!(l, Leadership::Follower { leader: Some(_) })
    })
    .await;
    handle
}

async fn wait_until(handle: &ElectorHandle, f: impl Fn(&Leadership) -> bool) -> Leadership {
    let mut rx = handle.leadership();
    timeout(Duration::from_secs(300), rx.wait_for(|l| f(l)))
        .await
        .expect("leadership did not change in time")
        .unwrap()
        .clone()
}

#[tokio::test(start_paused = true)]
async fn the_leader_renews_every_renew_every() {
    let store = Arc::new(Logged::default());
    let a = elector(store.clone(), "a").spawn();
    let term = a.wait_for_term().await.unwrap();
    assert_eq!(term.token(), FencingToken(1));
    sleep(Duration::from_secs(31)).await;
    let writes = store.writes_by("a");
    assert_eq!(writes[0].1, WriteKind::Acquire);
    let renews: Vec<_> = writes[1..].iter().map(|w| w.0 - writes[0].0).collect();
    // The default for a 15 s ttl: every 7.5 s (Timing::default_renew_every).
    assert_eq!(
        renews,
        (1..=4)
            .map(|i| Duration::from_millis(7_500 * i))
            .collect::<Vec<_>>()
    );
    assert!(writes[1..].iter().all(|w| w.1 == WriteKind::Renew));
    assert!(term.is_valid());
    assert_eq!(term.deadline(), writes[4].0 + TTL - Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn the_leader_steps_down_at_its_deadline_when_the_store_hangs() {
    let control = FaultControl::new();
    let store = Arc::new(FaultyStore::new(
        MemoryStore::new(),
        1,
        vec![control.clone()],
    ));
    let a = elector(store, "a").spawn();
    let term = a.wait_for_term().await.unwrap();
    let start = Instant::now();
    // The renew at 7.5 s succeeds; then every request hangs.
    sleep(Duration::from_secs(8)).await;
    control.update(|f: &mut Faults| f.hang = true);
    term.cancelled().await;
    // Deadline: last successful renew sent at 7.5 s, + ttl 15 s - margin 3 s.
    assert_eq!(Instant::now() - start, Duration::from_millis(19_500));
    assert!(!term.is_valid());
    assert!(!a.current().is_leader());
    // It keeps campaigning (and reports it cannot reach the store) without acting.
    sleep(Duration::from_secs(30)).await;
    assert!(!a.current().is_leader());
}

#[tokio::test(start_paused = true)]
async fn a_follower_takes_over_a_full_ttl_after_the_leaders_last_write() {
    let store = Arc::new(Logged::default());
    let (a, a_task) = elector(store.clone(), "a").into_parts();
    let a_task = tokio::spawn(a_task);
    let term_a = a.wait_for_term().await.unwrap();
    let b = follower(store.clone(), "b").await;
    sleep(Duration::from_secs(7)).await;
    // The leader's process dies: no release.
    a_task.abort();
    let _ = a_task.await;
    let last_write = store.writes_by("a").last().unwrap().0;
    let term_b = b.wait_for_term().await.unwrap();
    let took = Instant::now() - last_write;
    assert!(took >= TTL, "took over after {took:?}, before a full ttl");
    // One poll (0.5 to 0.55 s) plus nothing else: latency is zero here, and this store
    // gives no change hints.
    assert!(took <= TTL + Duration::from_millis(550), "took {took:?}");
    assert!(term_b.token() > term_a.token());
    drop(a);
}

/// On a store without change hints (here `Logged`), a follower learns of a release at its next
/// poll: within `1.1 x poll_every`, not a ttl or a retry later.
#[tokio::test(start_paused = true)]
async fn after_a_release_a_follower_takes_over_within_one_poll() {
    // Somewhere in b's poll cycle.
    let took = handover(Arc::new(Logged::default()), Duration::from_millis(1234)).await;
    assert!(took <= Duration::from_millis(550), "handover took {took:?}");
}

/// `a` leads and `b` follows on `store`; `pause` later `a` shuts down (releasing the lease).
/// Returns how long until `b`'s term began, having checked that its token is higher.
async fn handover(store: Arc<dyn LeaseBackend>, pause: Duration) -> Duration {
    let a = elector(store.clone(), "a").spawn();
    let term_a = a.wait_for_term().await.unwrap();
    let b = follower(store, "b").await;
    sleep(pause).await;
    let t_a = term_a.token();
    drop(term_a);
    let shutdown_at = Instant::now();
    a.shutdown().await;
    let term_b = b.wait_for_term().await.unwrap();
    assert!(term_b.token() > t_a);
    Instant::now() - shutdown_at
}

/// A waiting follower costs one read per poll (500 to 550 ms apart, jittered) and no write.
#[tokio::test(start_paused = true)]
async fn a_waiting_follower_reads_once_per_poll_and_never_writes() {
    let store = Arc::new(Logged::default());
    let a = elector(store.clone(), "a").spawn();
    let _term_a = a.wait_for_term().await.unwrap();
    let _b = follower(store.clone(), "b").await;
    let before = store.reads.load(Ordering::SeqCst);
    sleep(Duration::from_secs(60)).await;
    let reads = store.reads.load(Ordering::SeqCst) - before;
    // a's renews read nothing; all these reads are b's polls.
    assert!((109..=121).contains(&reads), "{reads} reads in a minute");
    assert!(store.writes_by("b").is_empty());
}

/// Followers started at the same instant (an autoscaling group) do not poll in lockstep: the
/// first wait of each is drawn from the whole poll cycle.
#[tokio::test(start_paused = true)]
async fn followers_started_together_poll_at_different_phases() {
    let memory = MemoryStore::new();
    let a = elector(Arc::new(memory.clone()), "a").spawn();
    let _term = a.wait_for_term().await.unwrap();
    let stores: Vec<Arc<Logged>> = (0..4)
        .map(|_| {
            Arc::new(Logged {
                inner: memory.clone(),
                ..Logged::default()
            })
        })
        .collect();
    let started = Instant::now();
    let _followers: Vec<ElectorHandle> = stores
        .iter()
        .enumerate()
        .map(|(i, s)| {
            Elector::builder(s.clone(), key())
                .ttl(TTL)
                .holder_id(HolderId::new(format!("f{i}")).unwrap())
                .jitter_seed(100 + i as u64)
                .build()
                .unwrap()
                .spawn()
        })
        .collect();
    sleep(Duration::from_secs(2)).await;
    let second_reads: Vec<Duration> = stores
        .iter()
        .map(|s| s.read_at.lock().unwrap()[1] - started)
        .collect();
    for d in &second_reads {
        assert!(*d <= Duration::from_millis(550), "{second_reads:?}");
    }
    let (min, max) = (
        second_reads.iter().min().unwrap(),
        second_reads.iter().max().unwrap(),
    );
    // Spread over the cycle, not within the 10 % jitter of one period.
    assert!(*max - *min > Duration::from_millis(100), "{second_reads:?}");
}

/// A store whose every read sends a change hint (a buggy watch).
#[derive(Debug)]
struct Chatty {
    inner: MemoryStore,
    notifier: leader_core::backend::ChangeNotifier,
    reads: AtomicUsize,
}

#[async_trait]
impl LeaseBackend for Chatty {
    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        // Stops after 5,000, so that a follower without a floor ends its loop here.
        if self.reads.fetch_add(1, Ordering::SeqCst) < 5_000 {
            self.notifier.notify();
        }
        self.inner.read(key).await
    }
    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        self.inner.write(request).await
    }
    fn changes(&self, _key: &LeaseKey) -> Option<leader_core::backend::Changes> {
        Some(self.notifier.subscribe())
    }
}

/// Hints only make a read sooner: a store that hints on every read gets at most one read per
/// 20 ms from a follower, not a loop.
#[tokio::test(start_paused = true)]
async fn a_chatty_store_cannot_make_a_follower_spin() {
    let memory = MemoryStore::new();
    let a = elector(Arc::new(memory.clone()), "a").spawn();
    let _term = a.wait_for_term().await.unwrap();
    let chatty = Arc::new(Chatty {
        inner: memory,
        notifier: leader_core::backend::Changes::channel().0,
        reads: AtomicUsize::new(0),
    });
    let _b = follower(chatty.clone(), "b").await;
    let before = chatty.reads.load(Ordering::SeqCst);
    sleep(Duration::from_secs(1)).await;
    let reads = chatty.reads.load(Ordering::SeqCst) - before;
    assert!(reads <= 51, "{reads} reads in a second");
}

/// A store that tells of changes (the memory store does) wakes a follower at once: the
/// handover takes no poll, only the wait that keeps hint-driven reads 20 ms apart at most.
#[tokio::test(start_paused = true)]
async fn a_change_hint_wakes_the_follower_at_once() {
    let took = handover(Arc::new(MemoryStore::new()), Duration::ZERO).await;
    assert!(took <= Duration::from_millis(20), "handover took {took:?}");
}

#[tokio::test(start_paused = true)]
async fn dropping_the_handle_releases_the_lease() {
    let store = Arc::new(MemoryStore::new());
    let a = elector(store.clone(), "a").spawn();
    drop(a.wait_for_term().await.unwrap());
    let b = follower(store.clone(), "b").await;
    let dropped_at = Instant::now();
    drop(a);
    b.wait_for_term().await.unwrap();
    assert!(Instant::now() - dropped_at <= Duration::from_millis(550));
}

#[tokio::test(start_paused = true)]
async fn a_conflict_on_renew_ends_the_term_at_once() {
    let store = Arc::new(MemoryStore::new());
    let a = elector(store.clone(), "a").spawn();
    let term = a.wait_for_term().await.unwrap();
    let start = Instant::now();
    sleep(Duration::from_secs(2)).await;
    // Someone else overwrites the record (an operator, or a buggy peer).
    let current = store.read(&key()).await.unwrap().unwrap();
    let intruder = LeaseRecord::held(
        HolderId::new("intruder").unwrap(),
        FencingToken(2),
        TTL,
        Metadata::new(),
        WriteNonce(9),
    );
    store
        .write(WriteRequest::new(
            key(),
            Expected::Revision(current.revision),
            intruder,
            WriteKind::Acquire,
            leader_core::backend::TermId(1),
        ))
        .await
        .unwrap();
    term.cancelled().await;
    // At the renew (7.5 s), not at the deadline (12 s).
    assert_eq!(Instant::now() - start, Duration::from_millis(7_500));
    match a.current() {
        Leadership::Follower {
            leader: Some(leader),
        } => assert_eq!(leader.holder.as_str(), "intruder"),
        other => panic!("expected to follow the intruder, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn shutdown_waits_for_the_work_then_releases() {
    let store = Arc::new(MemoryStore::new());
    let a = elector(store.clone(), "a").spawn();
    let term = a.wait_for_term().await.unwrap();
    let mut rx = a.leadership();
    let shutdown = tokio::spawn(a.shutdown());
    term.cancelled().await;
    rx.wait_for(|l| matches!(l, Leadership::SteppingDown { .. }))
        .await
        .unwrap();
    // The work takes one more second to wind down; the lease stays held meanwhile.
    sleep(Duration::from_secs(1)).await;
    assert!(store.read(&key()).await.unwrap().unwrap().record.is_held());
    drop(term);
    shutdown.await.unwrap();
    let record = store.read(&key()).await.unwrap().unwrap().record;
    assert!(!record.is_held(), "released after the work stopped");
    assert_eq!(record.token, FencingToken(1));
}

#[tokio::test(start_paused = true)]
async fn shutdown_does_not_release_if_the_work_outlives_the_deadline() {
    let store = Arc::new(MemoryStore::new());
    let a = elector(store.clone(), "a").spawn();
    let term = a.wait_for_term().await.unwrap();
    let deadline = term.deadline();
    a.shutdown().await;
    assert!(Instant::now() >= deadline);
    assert!(!term.is_valid());
    // The lease is left to expire, so that followers still wait a full ttl.
    assert!(store.read(&key()).await.unwrap().unwrap().record.is_held());
    drop(term);
}

#[tokio::test(start_paused = true)]
async fn resign_hands_over_and_sits_out_one_ttl() {
    let store = Arc::new(MemoryStore::new());
    let a = elector(store.clone(), "a").spawn();
    let term = a.wait_for_term().await.unwrap();
    let b = follower(store.clone(), "b").await;
    drop(term);
    let at = Instant::now();
    a.resign().await.unwrap();
    let term_b = b.wait_for_term().await.unwrap();
    assert!(Instant::now() - at <= Duration::from_secs(3));
    assert_eq!(term_b.token(), FencingToken(2));
    // a follows b and does not campaign back.
    let l = wait_until(&a, |l| {
        matches!(l, Leadership::Follower { leader: Some(_) })
    })
    .await;
    assert!(matches!(l, Leadership::Follower { leader: Some(ref x) } if x.holder.as_str() == "b"));
    // b goes away; a campaigns again.
    b.shutdown().await;
    drop(term_b);
    let term_a = a.wait_for_term().await.unwrap();
    assert_eq!(term_a.token(), FencingToken(3));
}

/// Applies the first `n` writes but loses their responses.
#[derive(Debug, Default)]
struct LosesResponses {
    inner: MemoryStore,
    lose: AtomicUsize,
}

#[async_trait]
impl LeaseBackend for LosesResponses {
    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        self.inner.read(key).await
    }
    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        let outcome = self.inner.write(request).await?;
        if self
            .lose
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(Error::indeterminate("test: response lost"));
        }
        Ok(outcome)
    }
}

#[tokio::test(start_paused = true)]
async fn a_write_whose_response_was_lost_is_recognised_as_our_own() {
    let store = Arc::new(LosesResponses {
        lose: AtomicUsize::new(1),
        ..Default::default()
    });
    let a = elector(store.clone(), "a").spawn();
    let term = a.wait_for_term().await.unwrap();
    // The first acquire landed; its response was lost; the re-read recognised it: token 1,
    // not a second term.
    assert_eq!(term.token(), FencingToken(1));
    // Renews with lost responses are recognised too: the term goes on.
    store.lose.store(3, Ordering::SeqCst);
    sleep(Duration::from_secs(30)).await;
    assert!(term.is_valid());
    assert_eq!(a.current().token(), Some(FencingToken(1)));
}

/// A store that fails every read with `make()`.
#[derive(Debug)]
struct Failing {
    reads: AtomicUsize,
    make: fn() -> Error,
}

impl Failing {
    fn new(make: fn() -> Error) -> Self {
        Self {
            reads: AtomicUsize::new(0),
            make,
        }
    }
}

#[async_trait]
impl LeaseBackend for Failing {
    async fn read(&self, _: &LeaseKey) -> Result<Option<Stored>, Error> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        Err((self.make)())
    }
    async fn write(&self, _: WriteRequest) -> Result<WriteOutcome, Error> {
        unreachable!("nothing is written without a successful read")
    }
}

#[tokio::test(start_paused = true)]
async fn transient_store_errors_are_published_and_retried_with_backoff() {
    let store = Arc::new(Failing::new(|| Error::unavailable("connection refused")));
    let a = elector(store.clone(), "a").spawn();
    let l = wait_until(&a, |l| {
        matches!(l, Leadership::Unknown { problem: Some(_) })
    })
    .await;
    let Leadership::Unknown { problem: Some(p) } = l else {
        unreachable!()
    };
    assert_eq!(p.kind, ErrorKind::Unavailable);
    sleep(Duration::from_secs(60)).await;
    let reads = store.reads.load(Ordering::SeqCst);
    // Backoff is capped at retry_every (3 s): at least 60 / 3 attempts, and not a hot loop.
    assert!((20..=80).contains(&reads), "{reads} reads in 60 s");
    assert!(matches!(a.current(), Leadership::Unknown { .. }));
}

#[tokio::test(start_paused = true)]
async fn an_error_retrying_cannot_fix_ends_the_campaign_with_the_problem() {
    let store = Arc::new(Failing::new(|| Error::Unauthenticated {
        message: "signature mismatch".into(),
        source: None,
    }));
    let a = elector(store.clone(), "a").spawn();
    let stopped = a.wait_for_term().await.unwrap_err();
    let p = stopped
        .problem()
        .expect("the campaign ended on the store error");
    assert_eq!(p.kind, ErrorKind::Unauthenticated);
    assert!(p.message.contains("credentials"), "{}", p.message);
    assert!(
        stopped.to_string().contains("signature mismatch"),
        "{stopped}"
    );
    assert!(matches!(
        a.current(),
        Leadership::Stopped { problem: Some(_) }
    ));
    sleep(Duration::from_secs(60)).await;
    assert_eq!(store.reads.load(Ordering::SeqCst), 1, "not retried");
}

#[tokio::test(start_paused = true)]
async fn a_malformed_record_is_waited_out_not_fatal() {
    let store = Arc::new(Failing::new(|| Error::MalformedRecord {
        key: "k".into(),
        detail: "not JSON".into(),
    }));
    let a = elector(store.clone(), "a").spawn();
    sleep(Duration::from_secs(30)).await;
    assert!(store.reads.load(Ordering::SeqCst) >= 5);
    assert!(matches!(
        a.current(),
        Leadership::Unknown { problem: Some(_) }
    ));
}

#[test]
fn each_timing_rule_has_its_own_error() {
    let store: Arc<dyn LeaseBackend> = Arc::new(MemoryStore::new());
    let b = || Elector::builder(store.clone(), key()).ttl(TTL);
    assert!(b().build().is_ok());
    assert!(matches!(
        b().margin(Duration::from_secs(1)).build(),
        Err(ConfigError::MarginTooSmall { .. })
    ));
    assert!(matches!(
        b().renew_every(Duration::from_secs(11)).build(),
        Err(ConfigError::NoTimeToRenew { .. })
    ));
    assert!(matches!(
        b().retry_every(Duration::ZERO).build(),
        Err(ConfigError::ZeroDuration {
            field: "retry_every"
        })
    ));
    assert!(matches!(
        b().request_timeout(Duration::from_secs(4))
            .renew_every(Duration::from_secs(5))
            .build(),
        Err(ConfigError::NoTimeToRenew { .. })
    ));
    let mut meta = Metadata::new();
    meta.insert("bad key".into(), "v".into());
    assert!(matches!(
        b().metadata(meta).build(),
        Err(ConfigError::InvalidMetadata(_))
    ));
    // A request timeout of 2 s moves the default margin to 4 s, which still fits.
    let t = b()
        .request_timeout(Duration::from_secs(2))
        .resolved_timing();
    assert_eq!(t.margin, Duration::from_secs(4));
    assert!(t.validate().is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_store_failing_30_percent_of_requests_costs_no_term_with_default_timing() {
    let control = FaultControl::new();
    control.update(|f: &mut Faults| {
        f.fail_before = 0.3;
        f.latency = Duration::from_millis(50);
    });
    let store = Arc::new(FaultyStore::new(MemoryStore::new(), 11, vec![control]));
    let a = Elector::builder(store, key())
        .holder_id(HolderId::new("a").unwrap())
        .jitter_seed(3)
        .build()
        .unwrap()
        .spawn();
    let term = a.wait_for_term().await.unwrap();
    // Ten minutes: 120 renew cycles, each retried until it goes through.
    tokio::select! {
        _ = term.cancelled() => panic!("stepped down under 30 % failures"),
        _ = sleep(Duration::from_secs(600)) => {}
    }
    assert!(term.is_valid());
}

/// Panics on every write after the first (the acquire).
#[derive(Debug, Default)]
struct PanicsOnRenew {
    inner: MemoryStore,
    writes: AtomicUsize,
}

#[async_trait]
impl LeaseBackend for PanicsOnRenew {
    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        self.inner.read(key).await
    }
    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        if self.writes.fetch_add(1, Ordering::SeqCst) > 0 {
            panic!("test: a backend bug");
        }
        self.inner.write(request).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_panicking_elector_task_ends_the_term() {
    let a = elector(Arc::new(PanicsOnRenew::default()), "a").spawn();
    let term = a.wait_for_term().await.unwrap();
    let start = Instant::now();
    // The first renew (7.5 s) panics the elector's task.
    timeout(Duration::from_secs(60), term.cancelled())
        .await
        .expect("cancelled() must fire without the elector's task");
    // At the panic (the first renew, 7.5 s in), not only at the deadline (12 s).
    assert!(
        Instant::now() - start <= Duration::from_secs(8),
        "{:?}",
        Instant::now() - start
    );
    assert!(!term.is_valid());
    match a.current() {
        Leadership::Stopped { problem: Some(p) } => {
            assert!(p.message.contains("ended unexpectedly"), "{}", p.message)
        }
        other => panic!("readers must learn that the elector stopped: {other:?}"),
    }
    assert!(a.wait_for_term().await.is_err());
}

#[tokio::test(start_paused = true)]
async fn an_aborted_elector_task_ends_the_term() {
    let (a, task) = elector(Arc::new(MemoryStore::new()), "a").into_parts();
    let running = tokio::spawn(task);
    let term = a.wait_for_term().await.unwrap();
    let token = term.cancellation_token();
    running.abort();
    timeout(Duration::from_secs(1), term.cancelled())
        .await
        .expect("the term ends when its task is dropped");
    assert!(
        token.is_cancelled(),
        "work spawned with the token stops too"
    );
    assert!(matches!(a.current(), Leadership::Stopped { .. }));
}

#[tokio::test(start_paused = true)]
async fn a_starved_elector_task_still_ends_the_term_at_its_deadline() {
    let (a, task) = elector(Arc::new(MemoryStore::new()), "a").into_parts();
    let mut task = Box::pin(task);
    // Poll the task only until the term starts; then never again (starved, not dropped).
    let term = tokio::select! {
        t = a.wait_for_term() => t.unwrap(),
        _ = &mut task => unreachable!("the elector task ended"),
    };
    let deadline = term.deadline();
    assert_eq!(deadline, Instant::now() + TTL - Duration::from_secs(3));
    let mut leadership = a.leadership();
    let token = term.cancellation_token();
    term.cancelled().await;
    assert_eq!(Instant::now(), deadline, "at the deadline, not later");
    assert!(token.is_cancelled());
    assert!(!term.is_valid());
    assert!(!a.current().is_leader());
    // Watchers learn it too, from the term's watchdog.
    timeout(
        Duration::from_secs(1),
        leadership.wait_for(|l| !l.is_leader()),
    )
    .await
    .expect("the watch must say so without the elector's task")
    .expect("leadership watch");
    drop(task);
}

#[tokio::test(start_paused = true)]
async fn each_term_is_handed_out_once() {
    let store = Arc::new(MemoryStore::new());
    let a = elector(store.clone(), "a").spawn();
    let first = a.wait_for_term().await.unwrap();
    // The obvious loop must not get the same term again: the next call waits for the next term.
    assert!(
        timeout(Duration::from_secs(60), a.wait_for_term())
            .await
            .is_err(),
        "the same live term was handed out twice"
    );
    assert!(first.is_valid());
    drop(first);
    a.resign().await.unwrap();
    let second = timeout(Duration::from_secs(60), a.wait_for_term())
        .await
        .expect("the next term is handed out")
        .unwrap();
    assert_eq!(second.token(), FencingToken(2));
}

/// Applies every write after `latency` (a slow store, not a failing one).
#[derive(Debug)]
struct Slow {
    inner: Logged,
    latency: Duration,
}

#[async_trait]
impl LeaseBackend for Slow {
    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        sleep(self.latency).await;
        self.inner.read(key).await
    }
    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        // `Logged` notes the time it receives the request: the sender's send time plus
        // nothing; the answer comes `latency` later.
        let sent = Instant::now();
        let outcome = self.inner.write(request).await;
        sleep_until_after(sent, self.latency).await;
        outcome
    }
}

async fn sleep_until_after(from: Instant, d: Duration) {
    tokio::time::sleep_until(from + d).await;
}

/// With latency, the deadline counts from when the write was sent, not when it was answered:
/// a deadline taken from the answer would be `latency` too late.
#[tokio::test(start_paused = true)]
async fn the_deadline_counts_from_the_send_time_not_the_answer() {
    let latency = Duration::from_millis(900);
    let store = Arc::new(Slow {
        inner: Logged::default(),
        latency,
    });
    let a = elector(store.clone(), "a").spawn();
    let term = a.wait_for_term().await.unwrap();
    let acquired = store.inner.writes_by("a")[0].0;
    assert_eq!(term.deadline(), acquired + TTL - Duration::from_secs(3));
    sleep(Duration::from_secs(16)).await;
    let writes = store.inner.writes_by("a");
    let last = writes.last().unwrap().0;
    assert!(writes.len() >= 3, "{writes:?}");
    assert_eq!(term.deadline(), last + TTL - Duration::from_secs(3));
}

/// `Term::renewals` reports each renew with the deadline it gives, also a renew made before
/// `next` is polled (the supervisor of `leader run` takes the stream, then reads the deadline
/// it starts with, then waits), and ends by the term's deadline on the local clock when no
/// renew comes, even though the elector's own task never said so.
#[tokio::test(start_paused = true)]
async fn renewals_report_each_renew_and_end_by_the_deadline() {
    let control = FaultControl::new();
    let store = Arc::new(FaultyStore::new(
        MemoryStore::new(),
        1,
        vec![control.clone()],
    ));
    let a = elector(store, "a").spawn();
    let term = a.wait_for_term().await.unwrap();
    let start = Instant::now();
    let mut renewals = term.renewals();
    let first = term.deadline();
    // The renew at 7.5 s happens while nobody waits on the stream: it is not lost.
    sleep(Duration::from_secs(8)).await;
    let renewed = timeout(Duration::ZERO, renewals.next())
        .await
        .expect("the renew made before `next` was called is reported at once")
        .expect("the term goes on");
    assert_eq!(renewed, term.deadline());
    assert_eq!(renewed, first + Duration::from_millis(7_500));
    // The next one when it happens, at 15 s.
    let second = renewals.next().await.unwrap();
    assert_eq!(Instant::now() - start, Duration::from_secs(15));
    assert_eq!(second, renewed + Duration::from_millis(7_500));
    // Then the store hangs: no renew, and the stream ends at the deadline.
    control.update(|f: &mut Faults| f.hang = true);
    assert_eq!(renewals.next().await, None);
    assert_eq!(Instant::now(), second);
    assert!(!term.is_valid());
}

/// `Term::run_until_over` gives the work's output if it finishes within the term, and drops
/// the work (`None`) at the term's end if it does not.
#[tokio::test(start_paused = true)]
async fn run_until_over_stops_the_work_when_the_term_ends() {
    let control = FaultControl::new();
    let store = Arc::new(FaultyStore::new(
        MemoryStore::new(),
        1,
        vec![control.clone()],
    ));
    let a = elector(store, "a").spawn();
    let term = a.wait_for_term().await.unwrap();
    let quick = term.run_until_over(async {
        sleep(Duration::from_secs(1)).await;
        7
    });
    assert_eq!(quick.await, Some(7));
    control.update(|f: &mut Faults| f.hang = true);
    let deadline = term.deadline();
    let endless = term.run_until_over(std::future::pending::<()>());
    assert_eq!(
        timeout(TTL * 2, endless).await,
        Ok(None),
        "the work ends with the term"
    );
    assert_eq!(
        Instant::now(),
        deadline,
        "stopped at the deadline, not later"
    );
}
