//! The library's metrics (`leader_core::metrics`), each shown to move when it should, under
//! paused time, through a recorder installed for the test's thread.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leader_core::backend::{
    Call, Expected, FencedCas, FencedObject, FencedPut, LeaseRecord, ObjectWrite, Stored,
    WriteKind, WriteNonce, WriteOutcome, WriteRequest,
};
use leader_core::metrics as m;
use leader_core::{
    Elector, ElectorHandle, Error, FencingToken, HolderId, Leadership, LeaseBackend, LeaseClient,
    LeaseKey, MemoryStore, Metadata, ObjectName, ShardedElector, Timing,
};
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata as Meta,
    Recorder, SharedString, Unit,
};
use tokio::time::{Instant, sleep};

const TTL: Duration = Duration::from_secs(10);

// ---- a recorder that keeps every value, for the test's thread --------------------------

#[derive(Debug, Default)]
struct Values(Mutex<Vec<f64>>);

impl HistogramFn for Values {
    fn record(&self, value: f64) {
        self.0.lock().unwrap().push(value);
    }
}

/// One series: its name and labels.
type Series = (String, BTreeMap<String, String>);

#[derive(Debug, Default)]
struct Recorded {
    counters: Mutex<BTreeMap<Series, Arc<AtomicU64>>>,
    gauges: Mutex<BTreeMap<Series, Arc<AtomicU64>>>,
    histograms: Mutex<BTreeMap<Series, Arc<Values>>>,
}

fn series(key: &Key) -> Series {
    let labels = key
        .labels()
        .map(|l| (l.key().to_owned(), l.value().to_owned()))
        .collect();
    (key.name().to_owned(), labels)
}

fn matches(s: &Series, name: &str, want: &[(&str, &str)]) -> bool {
    s.0 == name
        && want
            .iter()
            .all(|(k, v)| s.1.get(*k).map(String::as_str) == Some(*v))
}

impl Recorded {
    /// The sum of the counters `name` whose labels include `want`.
    fn counter(&self, name: &str, want: &[(&str, &str)]) -> u64 {
        let all = self.counters.lock().unwrap();
        all.iter()
            .filter(|(s, _)| matches(s, name, want))
            .map(|(_, c)| c.load(Ordering::SeqCst))
            .sum()
    }

    /// The gauge `name` with labels including `want` (exactly one series).
    fn gauge(&self, name: &str, want: &[(&str, &str)]) -> f64 {
        let all = self.gauges.lock().unwrap();
        let found: Vec<f64> = all
            .iter()
            .filter(|(s, _)| matches(s, name, want))
            .map(|(_, g)| f64::from_bits(g.load(Ordering::SeqCst)))
            .collect();
        assert_eq!(found.len(), 1, "one series of {name} {want:?}: {all:?}");
        found[0]
    }

    /// Every value recorded in the histograms `name` with labels including `want`.
    fn values(&self, name: &str, want: &[(&str, &str)]) -> Vec<f64> {
        let all = self.histograms.lock().unwrap();
        all.iter()
            .filter(|(s, _)| matches(s, name, want))
            .flat_map(|(_, h)| h.0.lock().unwrap().clone())
            .collect()
    }

    /// Every series registered, by name.
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = (self.counters.lock().unwrap().keys())
            .chain(self.gauges.lock().unwrap().keys())
            .chain(self.histograms.lock().unwrap().keys())
            .map(|s| s.0.clone())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    fn label_values(&self, label: &str) -> Vec<String> {
        let mut out: Vec<String> = (self.counters.lock().unwrap().keys())
            .chain(self.gauges.lock().unwrap().keys())
            .filter_map(|s| s.1.get(label).cloned())
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// A recorder over a shared [`Recorded`].
#[derive(Debug, Default, Clone)]
struct TestRecorder(Arc<Recorded>);

impl Recorder for TestRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Meta<'_>) -> Counter {
        let c = self.0.counters.lock().unwrap();
        let mut c = c;
        let cell = c.entry(series(key)).or_default().clone();
        Counter::from_arc(cell)
    }

    fn register_gauge(&self, key: &Key, _: &Meta<'_>) -> Gauge {
        let mut g = self.0.gauges.lock().unwrap();
        let cell = g.entry(series(key)).or_default().clone();
        Gauge::from_arc(cell)
    }

    fn register_histogram(&self, key: &Key, _: &Meta<'_>) -> Histogram {
        let mut h = self.0.histograms.lock().unwrap();
        let cell = h.entry(series(key)).or_default().clone();
        Histogram::from_arc(cell)
    }
}

// Make sure the std atomics are the handles' types (the facade implements the traits).
fn _assert_fns(c: Arc<AtomicU64>) {
    fn counter<T: CounterFn>(_: &T) {}
    fn gauge<T: GaugeFn>(_: &T) {}
    counter(&*c);
    gauge(&*c);
}

// ---- a store whose answers a test can script -------------------------------------------------

const NORMAL: u8 = 0;
const THROTTLE_WRITES: u8 = 1;
const READS_DOWN: u8 = 2;
const WRITES_UNKNOWN: u8 = 3;
/// The next write attempt is throttled; the call's retry goes through.
const THROTTLE_ONCE: u8 = 4;

/// The memory store, with writes throttled, reads failing, or writes of unknown outcome
/// (not applied) on demand.
#[derive(Debug, Default)]
struct Scripted {
    inner: MemoryStore,
    mode: AtomicU8,
}

impl Scripted {
    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }
}

#[async_trait]
impl LeaseBackend for Scripted {
    fn name(&self) -> &'static str {
        "scripted"
    }
    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        if self.mode.load(Ordering::SeqCst) == READS_DOWN {
            return Err(Error::unavailable("the test took the store down"));
        }
        self.inner.read(key).await
    }
    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        // As a real backend does: each request is an attempt of the one retry loop.
        Call::write("writing the lease (test)")
            .run(|_| {
                let request = request.clone();
                async move {
                    let throttled = Error::Throttled {
                        message: "slow down (test)".to_owned(),
                        source: None,
                    };
                    match self.mode.load(Ordering::SeqCst) {
                        THROTTLE_WRITES => Err(throttled),
                        THROTTLE_ONCE => {
                            self.set(NORMAL);
                            Err(throttled)
                        }
                        WRITES_UNKNOWN => {
                            Err(Error::indeterminate("answer lost (test; not applied)"))
                        }
                        _ => self.inner.write(request).await,
                    }
                }
            })
            .await
    }
}

#[async_trait]
impl FencedCas for Scripted {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        self.inner.get_fenced(object).await
    }
    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        self.inner.put_fenced_if(put).await
    }
}

fn key() -> LeaseKey {
    LeaseKey::new("jobs").unwrap()
}

fn elector(store: Arc<dyn LeaseBackend>, holder: &str) -> Elector {
    Elector::builder(store, key())
        .ttl(TTL)
        .holder_id(HolderId::new(holder).unwrap())
        .jitter_seed(11)
        .build()
        .unwrap()
}

async fn until(handle: &ElectorHandle, f: impl Fn(&Leadership) -> bool) {
    let mut rx = handle.leadership();
    tokio::time::timeout(Duration::from_secs(600), rx.wait_for(|l| f(l)))
        .await
        .expect("in time")
        .expect("the elector runs");
}

fn who(holder: &str) -> [(&'static str, &str); 3] {
    [("holder", holder), ("key", "jobs"), ("backend", "memory")]
}

// ---- the tests ------------------------------------------------------------------------------

/// A takeover after a crash: the new leader counts a term started and the time it saw
/// without a leader (at least a ttl: it waited that long on the crashed leader's record);
/// the gauges follow who leads and the token.
#[tokio::test(start_paused = true)]
async fn a_takeover_counts_a_term_and_the_time_without_a_leader() {
    let rec = TestRecorder::default();
    let _local = metrics::set_default_local_recorder(&rec);
    let r = &rec.0;
    let store = Arc::new(MemoryStore::new());
    let (a, a_task) = elector(store.clone(), "a").into_parts();
    let a_task = tokio::spawn(a_task);
    let term = a.wait_for_term().await.unwrap();
    let b = elector(store.clone(), "b").spawn();
    until(&b, |l| {
        matches!(l, Leadership::Follower { leader: Some(_) })
    })
    .await;

    assert_eq!(r.counter(m::TERMS_STARTED, &who("a")), 1);
    assert_eq!(r.gauge(m::IS_LEADER, &who("a")), 1.0);
    assert_eq!(r.gauge(m::IS_LEADER, &who("b")), 0.0);
    assert_eq!(r.gauge(m::FENCING_TOKEN, &who("a")), 1.0);
    assert_eq!(
        r.gauge(m::FENCING_TOKEN, &who("b")),
        1.0,
        "the leader b sees"
    );
    assert!(r.values(m::LEADERLESS, &who("b")).is_empty());

    // A crashes: its task is gone mid-term, the record stays held.
    a_task.abort();
    let crashed = Instant::now();
    drop(term);
    let t = b.wait_for_term().await.unwrap();
    assert_eq!(t.token(), FencingToken(2));
    assert_eq!(r.counter(m::TERMS_STARTED, &who("b")), 1);
    assert_eq!(r.gauge(m::IS_LEADER, &who("b")), 1.0);
    assert_eq!(r.gauge(m::FENCING_TOKEN, &who("b")), 2.0);
    assert_eq!(r.gauge(m::IS_LEADER, &who("a")), 0.0, "a's task is gone");
    let gaps = r.values(m::LEADERLESS, &who("b"));
    assert_eq!(gaps.len(), 1, "{gaps:?}");
    let failover = crashed.elapsed().as_secs_f64();
    // From a's last renew that b saw: at least a ttl, at most the failover plus one renew
    // interval (a renewed at most that long before it crashed).
    let renew = Timing::from_ttl(TTL).renew_every.as_secs_f64();
    assert!(
        gaps[0] >= TTL.as_secs_f64() && gaps[0] <= failover + renew + 0.01,
        "{gaps:?} vs failover {failover}"
    );
    assert!(r.values(m::TERM_DURATION, &who("b")).is_empty());
    drop(t);
    b.shutdown().await;
    let lasted = r.values(m::TERM_DURATION, &who("b"));
    assert_eq!(lasted.len(), 1, "one term ended: {lasted:?}");
    assert_eq!(r.gauge(m::IS_LEADER, &who("b")), 0.0);
}

/// A graceful handover: the follower's time without a leader runs from the release it saw
/// to its own term, under a poll; terms' durations are recorded when they end.
#[tokio::test(start_paused = true)]
async fn a_handover_is_a_short_time_without_a_leader_and_ends_a_term() {
    let rec = TestRecorder::default();
    let _local = metrics::set_default_local_recorder(&rec);
    let r = &rec.0;
    let store = Arc::new(MemoryStore::new());
    let a = elector(store.clone(), "a").spawn();
    let term = a.wait_for_term().await.unwrap();
    let b = elector(store.clone(), "b").spawn();
    until(&b, |l| {
        matches!(l, Leadership::Follower { leader: Some(_) })
    })
    .await;
    sleep(Duration::from_secs(60)).await;
    drop(term);
    a.resign().await.unwrap();
    assert_eq!(
        r.gauge(m::IS_LEADER, &who("a")),
        0.0,
        "a runs on, as a follower"
    );
    let t = b.wait_for_term().await.unwrap();
    assert_eq!(r.gauge(m::IS_LEADER, &who("b")), 1.0);
    let lasted = r.values(m::TERM_DURATION, &who("a"));
    assert_eq!(lasted.len(), 1);
    assert!(lasted[0] >= 60.0 && lasted[0] < 61.0, "{lasted:?}");
    let gaps = r.values(m::LEADERLESS, &who("b"));
    assert_eq!(gaps.len(), 1);
    let poll = Timing::from_ttl(TTL).poll_every.as_secs_f64();
    assert!(gaps[0] <= poll * 1.1 + 0.01, "{gaps:?} vs poll {poll}");
    assert_eq!(r.counter(m::TERMS_STARTED, &who("b")), 1);
    drop(t);
}

/// An instance that starts on a released record never saw that term live: it records no time
/// without a leader (the key may have been idle for an hour).
#[tokio::test(start_paused = true)]
async fn starting_on_a_released_record_records_no_time_without_a_leader() {
    let rec = TestRecorder::default();
    let _local = metrics::set_default_local_recorder(&rec);
    let r = &rec.0;
    let store = Arc::new(MemoryStore::new());
    let a = elector(store.clone(), "a").spawn();
    drop(a.wait_for_term().await.unwrap());
    a.shutdown().await;
    sleep(Duration::from_secs(3600)).await;
    let c = elector(store.clone(), "c").spawn();
    let t = c.wait_for_term().await.unwrap();
    assert_eq!(t.token(), FencingToken(2));
    assert_eq!(r.values(m::LEADERLESS, &who("c")), Vec::<f64>::new());
    drop(t);
    c.shutdown().await;
}

/// Each renew records how long it took and how much of the term was left: with a store that
/// answers in 300 ms, the latency is 300 ms and the slack is the term's validity less the renew
/// interval and the latency of the write that started it.
#[tokio::test(start_paused = true)]
async fn renews_record_their_latency_and_the_slack_before_the_deadline() {
    let rec = TestRecorder::default();
    let _local = metrics::set_default_local_recorder(&rec);
    let r = &rec.0;
    #[derive(Debug)]
    struct Slow(MemoryStore);
    #[async_trait]
    impl LeaseBackend for Slow {
        fn name(&self) -> &'static str {
            "memory"
        }
        async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
            self.0.read(key).await
        }
        async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
            sleep(Duration::from_millis(300)).await;
            self.0.write(request).await
        }
    }
    let a = elector(Arc::new(Slow(MemoryStore::new())), "a").spawn();
    let term = a.wait_for_term().await.unwrap();
    let timing = Timing::from_ttl(TTL);
    sleep(timing.renew_every * 4).await;
    let took = r.values(m::RENEW_DURATION, &who("a"));
    assert!(took.len() >= 3, "{took:?}");
    assert!(took.iter().all(|s| (*s - 0.3).abs() < 0.005), "{took:?}");
    let slack = r.values(m::RENEW_SLACK, &who("a"));
    assert_eq!(slack.len(), took.len());
    let expected = (timing.term_validity() - timing.renew_every).as_secs_f64() - 0.3;
    assert!(
        slack.iter().all(|s| (*s - expected).abs() < 0.01),
        "{slack:?} vs {expected}"
    );
    drop(term);
    a.shutdown().await;
}

/// Store calls are counted by operation and outcome: ok, conflict (a renew refused because
/// someone else wrote the record), throttled, error and indeterminate; and the handle says
/// when the store last answered.
#[tokio::test(start_paused = true)]
async fn store_calls_are_counted_by_operation_and_outcome() {
    let rec = TestRecorder::default();
    let _local = metrics::set_default_local_recorder(&rec);
    let r = &rec.0;
    let store = Arc::new(Scripted::default());
    let k = key();
    let timing = Timing::from_ttl(TTL);
    let mut client = LeaseClient::new(
        store.clone(),
        k.clone(),
        HolderId::new("a").unwrap(),
        timing,
    )
    .unwrap();
    let req = |op: &'static str, outcome: &'static str| {
        r.counter(
            m::STORE_REQUESTS,
            &[
                ("holder", "a"),
                ("backend", "scripted"),
                ("key", "jobs"),
                ("op", op),
                ("outcome", outcome),
            ],
        )
    };
    client.try_acquire().await.unwrap();
    assert_eq!((req("read", "ok"), req("acquire", "ok")), (1, 1));

    // Throttled once, then through on the call's retry: both requests count.
    store.set(THROTTLE_ONCE);
    assert!(matches!(
        client.renew().await.unwrap(),
        leader_core::Renewal::Renewed(_)
    ));
    assert_eq!((req("renew", "throttled"), req("renew", "ok")), (1, 1));
    // Throttled until the call's time is up: every attempt counts, the last one too.
    store.set(THROTTLE_WRITES);
    let e = client.renew().await.unwrap_err();
    assert_eq!(e.kind(), leader_core::ErrorKind::Throttled);
    let throttled = req("renew", "throttled");
    assert!(throttled > 3, "{throttled}");
    assert_eq!(req("renew", "ok"), 1);

    store.set(WRITES_UNKNOWN);
    // The renew's outcome is unknown; its re-read finds the record unchanged.
    assert!(client.renew().await.is_err());
    assert_eq!(req("renew", "indeterminate"), 1);
    assert_eq!(req("read", "ok"), 2, "the re-read");

    store.set(NORMAL);
    // Another writer overwrites the record: the next renew meets a conflict.
    let current = store.inner.read(&k).await.unwrap().unwrap();
    let mut record: LeaseRecord = current.record.clone();
    record.holder = HolderId::new("operator").unwrap();
    record.nonce = WriteNonce(99);
    let overwrite = WriteRequest::new(
        k.clone(),
        Expected::Revision(current.revision),
        record,
        WriteKind::Acquire,
        leader_core::backend::TermId(5),
    );
    assert!(matches!(
        store.inner.write(overwrite).await.unwrap(),
        WriteOutcome::Written(_)
    ));
    assert!(matches!(
        client.renew().await.unwrap(),
        leader_core::Renewal::Lost { .. }
    ));
    assert_eq!(req("renew", "conflict"), 1);
    assert_eq!(req("renew", "ok"), 1);

    store.set(READS_DOWN);
    assert!(client.observe().await.is_err());
    assert_eq!(req("read", "error"), 1);
    assert_eq!(req("release", "ok"), 0);

    // Every op and outcome has a series from the start (zero until it happens), and no other
    // label value appears.
    assert_eq!(
        r.label_values("outcome"),
        ["conflict", "error", "indeterminate", "ok", "throttled"]
    );
    assert_eq!(
        r.label_values("op"),
        ["acquire", "read", "release", "renew"]
    );
    let _ = Metadata::new();
}

/// The elector's handle says when the store last answered: a health check's input.
#[tokio::test(start_paused = true)]
async fn the_handle_says_when_the_store_last_answered() {
    let store = Arc::new(Scripted::default());
    let a = elector(store.clone(), "a").spawn();
    let term = a.wait_for_term().await.unwrap();
    let first = a.store_contact().last_answer().expect("answered");
    sleep(TTL).await;
    let later = a.store_contact().last_answer().unwrap();
    assert!(later > first, "renews are answers");
    store.set(READS_DOWN);
    drop(term);
    a.resign().await.unwrap();
    // As a follower with the store down, no answer comes.
    let since = a.store_contact().last_answer().unwrap();
    sleep(TTL * 2).await;
    assert_eq!(a.store_contact().last_answer(), Some(since));
    assert!(Instant::now() - since >= TTL * 2);
    store.set(NORMAL);
    sleep(TTL).await;
    assert!(a.store_contact().last_answer().unwrap() > since);
}

/// A sharded instance publishes how many shards it leads, and its store calls count under
/// the sharded key, not its records' names.
#[tokio::test(start_paused = true)]
async fn a_sharded_instance_counts_its_shards_under_the_sharded_key() {
    let rec = TestRecorder::default();
    let _local = metrics::set_default_local_recorder(&rec);
    let r = &rec.0;
    let store = Arc::new(MemoryStore::new());
    let start = |id: &str| {
        ShardedElector::builder(store.clone(), key(), 8)
            .ttl(TTL)
            .holder_id(HolderId::new(id).unwrap())
            .jitter_seed(3)
            .build()
            .unwrap()
            .spawn()
    };
    let a = start("a");
    let mut rx = a.assignment();
    rx.wait_for(|x| x.led.len() == 8).await.unwrap();
    assert_eq!(r.gauge(m::SHARDS_LED, &who("a")), 8.0);
    let b = start("b");
    let mut rx_b = b.assignment();
    tokio::time::timeout(
        Duration::from_secs(120),
        rx_b.wait_for(|x| x.led.len() == 4),
    )
    .await
    .unwrap()
    .unwrap();
    rx.wait_for(|x| x.led.len() == 4).await.unwrap();
    assert_eq!(r.gauge(m::SHARDS_LED, &who("a")), 4.0);
    assert_eq!(r.gauge(m::SHARDS_LED, &who("b")), 4.0);
    assert_eq!(r.label_values("key"), ["jobs"], "only the sharded key");
    assert!(r.counter(m::STORE_REQUESTS, &[("holder", "b"), ("op", "renew")]) > 0);
    b.shutdown().await;
    a.shutdown().await;
}

/// Every metric the library registers is one of `metrics::ALL` (the documented table), and
/// every name there is registered by an elector or a sharded instance.
#[tokio::test(start_paused = true)]
async fn the_registered_metrics_are_the_documented_ones() {
    let rec = TestRecorder::default();
    let _local = metrics::set_default_local_recorder(&rec);
    let store = Arc::new(MemoryStore::new());
    let _e = elector(store.clone(), "a");
    let _s = ShardedElector::builder(store, LeaseKey::new("other").unwrap(), 2)
        .build()
        .unwrap()
        .spawn();
    let mut documented: Vec<String> = m::ALL.iter().map(|s| (*s).to_owned()).collect();
    documented.sort();
    assert_eq!(rec.0.names(), documented);
}
