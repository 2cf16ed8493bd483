//! The suite's metrics, through the [`metrics`] facade: the library records, the
//! application installs an exporter (the `leader` CLI serves Prometheus text with
//! `--metrics-addr`).
//!
//! Every metric carries the labels `key`, `holder` and `backend` ([`LeaseBackend::name`]).
//! The table, with what each metric means, is in `docs/metrics.md`; the names are the
//! constants below.
//!
//! Handles are registered once, when an elector (or a lease client) is built, so a recorder
//! must be installed before that; afterwards recording is an atomic update, and with no
//! recorder installed a no-op.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::metrics::{Counter, Gauge, Histogram, Label};
use tokio::time::Instant;
use tokio::time::error::Elapsed;

use crate::backend::{IfChanged, LeaseBackend, Stored, WriteOutcome};
use crate::call::{RetryHook, within_hooked};
use crate::error::{Error, ErrorKind};
use crate::model::{HolderId, LeaseKey};

/// Gauge: 1 while this instance leads the key, else 0.
pub const IS_LEADER: &str = "leader_is_leader";
/// Counter: terms this instance began (elections won).
pub const TERMS_STARTED: &str = "leader_terms_started_total";
/// Histogram, seconds: the length of each of this instance's terms, when it ends.
pub const TERM_DURATION: &str = "leader_term_duration_seconds";
/// Histogram, seconds: time without a leader as this instance saw it while following.
pub const LEADERLESS: &str = "leader_leaderless_seconds";
/// Histogram, seconds: how long each renew attempt took.
pub const RENEW_DURATION: &str = "leader_renew_duration_seconds";
/// Histogram, seconds: at each successful renew, the time the term still had before its
/// deadline.
pub const RENEW_SLACK: &str = "leader_renew_slack_seconds";
/// Counter: store requests of the protocol, by `op` and `outcome`: every attempt that a
/// store call retried (throttled, unavailable), and how every call ended.
pub const STORE_REQUESTS: &str = "leader_store_requests_total";
/// Gauge: the token of this instance's term, or of the leader it last saw.
pub const FENCING_TOKEN: &str = "leader_fencing_token";
/// Gauge: the shards this instance leads (sharded elections).
pub const SHARDS_LED: &str = "leader_shards_led";

/// Every metric name, for exporters that configure them (buckets) and for tests.
pub const ALL: [&str; 9] = [
    IS_LEADER,
    TERMS_STARTED,
    TERM_DURATION,
    LEADERLESS,
    RENEW_DURATION,
    RENEW_SLACK,
    STORE_REQUESTS,
    FENCING_TOKEN,
    SHARDS_LED,
];

/// Describes every metric (help text and unit) to the installed recorder; exporters print
/// the descriptions (Prometheus `# HELP`). Call it once, after installing the recorder.
pub fn describe() {
    use ::metrics::Unit::{Count, Seconds};
    ::metrics::describe_gauge!(IS_LEADER, "1 while this instance leads the key, else 0");
    ::metrics::describe_counter!(
        TERMS_STARTED,
        Count,
        "Terms this instance began (elections won)"
    );
    ::metrics::describe_histogram!(
        TERM_DURATION,
        Seconds,
        "Length of each of this instance's terms, recorded when it ends"
    );
    ::metrics::describe_histogram!(
        LEADERLESS,
        Seconds,
        "Time without a leader as this instance saw it while following: from the previous \
         term's last sign of life (its release, else its last renew) to the next term"
    );
    ::metrics::describe_histogram!(RENEW_DURATION, Seconds, "Time each renew attempt took");
    ::metrics::describe_histogram!(
        RENEW_SLACK,
        Seconds,
        "At each successful renew, the time the term still had before its deadline"
    );
    ::metrics::describe_counter!(
        STORE_REQUESTS,
        Count,
        "Store requests of the protocol by op (read, acquire, renew, release) and outcome \
         (ok, conflict, throttled, error, indeterminate): each retried attempt, and how each \
         call ended"
    );
    ::metrics::describe_gauge!(
        FENCING_TOKEN,
        "The fencing token of this instance's term, or of the leader it last saw"
    );
    ::metrics::describe_gauge!(SHARDS_LED, Count, "Shards this instance leads");
}

/// Histogram buckets that fit each histogram's range, in seconds, for exporters that take
/// buckets (the `leader` CLI's Prometheus exporter uses them).
pub const BUCKETS: [(&str, &[f64]); 4] = [
    (
        TERM_DURATION,
        &[1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0],
    ),
    (
        LEADERLESS,
        &[0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0],
    ),
    (
        RENEW_DURATION,
        &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0],
    ),
    (
        RENEW_SLACK,
        &[
            0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0,
        ],
    ),
];

/// A store call of the protocol, the `op` label of [`STORE_REQUESTS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Read,
    Acquire,
    Renew,
    Release,
}

impl Op {
    const ALL: [Op; 4] = [Op::Read, Op::Acquire, Op::Renew, Op::Release];

    fn label(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Acquire => "acquire",
            Op::Renew => "renew",
            Op::Release => "release",
        }
    }
}

/// How a store call ended, the `outcome` label of [`STORE_REQUESTS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// The store answered and did what was asked.
    Ok,
    /// The store answered that the condition of a write did not hold.
    Conflict,
    /// The store throttled the request.
    Throttled,
    /// Any other error that promises nothing was written (unavailable, a read's timeout,
    /// rejected credentials, a malformed record).
    Error,
    /// A write whose outcome is unknown (it may have been applied).
    Indeterminate,
}

impl Outcome {
    const ALL: [Outcome; 5] = [
        Outcome::Ok,
        Outcome::Conflict,
        Outcome::Throttled,
        Outcome::Error,
        Outcome::Indeterminate,
    ];

    fn of_error(e: &Error) -> Self {
        match e.kind() {
            ErrorKind::Throttled => Outcome::Throttled,
            ErrorKind::Indeterminate => Outcome::Indeterminate,
            _ => Outcome::Error,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Conflict => "conflict",
            Outcome::Throttled => "throttled",
            Outcome::Error => "error",
            Outcome::Indeterminate => "indeterminate",
        }
    }
}

/// A store's answer: whether it is a refused condition.
pub(crate) trait Answer {
    fn is_conflict(&self) -> bool {
        false
    }
}

impl Answer for Option<Stored> {}
impl Answer for IfChanged {}
impl Answer for Option<crate::backend::FencedObject> {}
impl Answer for crate::backend::ObjectWrite {
    fn is_conflict(&self) -> bool {
        matches!(self, crate::backend::ObjectWrite::Conflict)
    }
}
impl Answer for WriteOutcome {
    fn is_conflict(&self) -> bool {
        matches!(self, WriteOutcome::Conflict { .. })
    }
}

fn labels(key: &LeaseKey, holder: &HolderId, backend: &'static str) -> Vec<Label> {
    vec![
        Label::new("key", key.as_str().to_owned()),
        Label::new("holder", holder.as_str().to_owned()),
        Label::new("backend", backend),
    ]
}

/// The store calls of one lease client: counted by op and outcome, and when the store last
/// answered one.
#[derive(Clone)]
pub(crate) struct StoreMetrics {
    /// `requests[op][outcome]`.
    requests: Arc<[[Counter; 5]; 4]>,
    /// Per op: counts an attempt that the call retried.
    retried: [RetryHook; 4],
    answered: StoreContact,
}

impl StoreMetrics {
    /// The calls of one client of `key` as `holder` on `store` (the backend's name).
    pub(crate) fn new(key: &LeaseKey, holder: &HolderId, store: &'static str) -> Self {
        let base = labels(key, holder, store);
        let requests = Op::ALL.map(|op| {
            Outcome::ALL.map(|outcome| {
                let mut l = base.clone();
                l.push(Label::new("op", op.label()));
                l.push(Label::new("outcome", outcome.label()));
                ::metrics::counter!(STORE_REQUESTS, l)
            })
        });
        let requests = Arc::new(requests);
        let retried = Op::ALL.map(|op| {
            let requests = requests.clone();
            let hook: RetryHook = Arc::new(move |e: &Error| {
                requests[op as usize][Outcome::of_error(e) as usize].increment(1);
            });
            hook
        });
        Self {
            retried,
            requests,
            answered: StoreContact::default(),
        }
    }

    /// Makes the store call `call` of `op` [`within`](crate::call::within) `budget`, and
    /// counts it: each attempt its [`Call`](crate::backend::Call)s retried, then how it ended.
    pub(crate) async fn call<T: Answer>(
        &self,
        op: Op,
        budget: Duration,
        call: impl Future<Output = Result<T, Error>>,
    ) -> Result<Result<T, Error>, Elapsed> {
        let hook = Some(self.retried[op as usize].clone());
        let result = within_hooked(budget, hook, call).await;
        self.count(op, &result);
        result
    }

    /// Counts one store call of `op` that ended with `result` (cut off by its time limit if
    /// `Err(Elapsed)`), and notes the time if the store answered it.
    fn count<T: Answer>(&self, op: Op, result: &Result<Result<T, Error>, Elapsed>) {
        let outcome = match result {
            Ok(Ok(answer)) if answer.is_conflict() => Outcome::Conflict,
            Ok(Ok(_)) => Outcome::Ok,
            Ok(Err(e)) => Outcome::of_error(e),
            Err(_) if op == Op::Read => Outcome::Error,
            Err(_) => Outcome::Indeterminate,
        };
        if matches!(outcome, Outcome::Ok | Outcome::Conflict) {
            *self.answered.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        }
        self.requests[op as usize][outcome as usize].increment(1);
    }

    /// The shared cell of when the store last answered (a read, a write, or a refused
    /// condition).
    pub(crate) fn answered(&self) -> StoreContact {
        self.answered.clone()
    }
}

impl std::fmt::Debug for StoreMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreMetrics").finish_non_exhaustive()
    }
}

/// When the store last answered an elector's calls: the input of a readiness check.
/// Cheap to clone; see [`ElectorHandle::store_contact`](crate::ElectorHandle::store_contact).
#[derive(Clone, Debug, Default)]
pub struct StoreContact(Arc<Mutex<Option<Instant>>>);

impl StoreContact {
    /// Notes an answer now.
    pub(crate) fn note(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    /// When the store last answered one of the calls (a read, a write, or a refused
    /// condition; not an error or a timeout), on tokio's clock; `None` if it never has.
    pub fn last_answer(&self) -> Option<Instant> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The election's own metrics, kept by the elector's task.
#[derive(Clone, Debug)]
pub(crate) struct ElectionMetrics {
    pub(crate) is_leader: Gauge,
    pub(crate) terms_started: Counter,
    pub(crate) term_duration: Histogram,
    pub(crate) leaderless: Histogram,
    pub(crate) renew_duration: Histogram,
    pub(crate) renew_slack: Histogram,
    pub(crate) token: Gauge,
}

impl ElectionMetrics {
    /// The metrics of an election on `store` (the backend's name, or `quorum`).
    pub(crate) fn new(key: &LeaseKey, holder: &HolderId, store: &'static str) -> Self {
        let l = labels(key, holder, store);
        let m = Self {
            is_leader: ::metrics::gauge!(IS_LEADER, l.clone()),
            terms_started: ::metrics::counter!(TERMS_STARTED, l.clone()),
            term_duration: ::metrics::histogram!(TERM_DURATION, l.clone()),
            leaderless: ::metrics::histogram!(LEADERLESS, l.clone()),
            renew_duration: ::metrics::histogram!(RENEW_DURATION, l.clone()),
            renew_slack: ::metrics::histogram!(RENEW_SLACK, l.clone()),
            token: ::metrics::gauge!(FENCING_TOKEN, l),
        };
        m.is_leader.set(0.0);
        m
    }
}

/// The gauge of the shards a sharded member leads.
pub(crate) fn shards_led(key: &LeaseKey, holder: &HolderId, backend: &dyn LeaseBackend) -> Gauge {
    let g = ::metrics::gauge!(SHARDS_LED, labels(key, holder, backend.name()));
    g.set(0.0);
    g
}

/// Seconds, for histograms.
pub(crate) fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}
