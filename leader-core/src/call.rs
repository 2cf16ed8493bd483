//! One retry loop for store calls, and the rule of what it may retry.
//!
//! A backend runs each call to its store through [`Call::run`]: attempts are retried with
//! capped, jittered backoff until one succeeds, an error says that trying again cannot help,
//! or the call's time is spent. The rule is the contract's: an error other than
//! [`Error::Indeterminate`] promises that the store changed nothing, so throttling and
//! unavailability are retried for reads and writes alike, and an ambiguous write is never
//! retried (the core re-reads to decide it). The SDK's own retries stay off, so this is the
//! only loop.
//!
//! How long a call may take is the caller's to say, per call: the core runs every store call
//! it makes [`within`] its request timeout ([`Timing::request_timeout`](crate::Timing), or
//! less when a renew must end by the term's deadline), and the backend's [`Call`]s inherit
//! that deadline ([`call_deadline`]). A call outside [`within`] (a user's fenced write, a
//! builder's check) gets [`DEFAULT_BUDGET`].

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tokio::time::error::Elapsed;
use tracing::debug;

use crate::error::{Error, ErrorKind};
use crate::rand::Rng;

/// Told of every attempt that a [`Call`] retries (the metrics count it as a request).
pub(crate) type RetryHook = std::sync::Arc<dyn Fn(&Error) + Send + Sync>;

tokio::task_local! {
    /// The deadline and the budget of the store call the current task is making, set by
    /// [`within`], and who is told of its retried attempts.
    static SCOPE: (Instant, Duration, Option<RetryHook>);
}

/// The time a store call may take when no caller said (outside [`within`]): 2 s, the
/// longest default request timeout.
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(2);

/// The instant by which the current store call must end: the deadline [`within`] set for it,
/// else [`DEFAULT_BUDGET`] from now.
pub fn call_deadline() -> Instant {
    SCOPE
        .try_with(|(deadline, _, _)| *deadline)
        .unwrap_or_else(|_| Instant::now() + DEFAULT_BUDGET)
}

/// Whether the current task runs inside [`within`].
pub(crate) fn in_scope() -> bool {
    SCOPE.try_with(|_| ()).is_ok()
}

/// The whole time the current store call was given (for messages): the budget of [`within`],
/// else [`DEFAULT_BUDGET`].
pub fn call_budget() -> Duration {
    SCOPE
        .try_with(|(_, budget, _)| *budget)
        .unwrap_or(DEFAULT_BUDGET)
}

/// Runs the store call `call` within `budget`: the backend's [`Call`]s (and
/// [`call_deadline`]) see the deadline, and the call is cut off there.
///
/// # Errors
/// [`Elapsed`] if the call had not finished by the deadline.
///
/// # Cancel safety
/// As cancel-safe as `call`.
pub async fn within<F: Future>(budget: Duration, call: F) -> Result<F::Output, Elapsed> {
    within_hooked(budget, None, call).await
}

/// [`within`], telling `hook` of every attempt the backend's [`Call`]s retry.
pub(crate) async fn within_hooked<F: Future>(
    budget: Duration,
    hook: Option<RetryHook>,
    call: F,
) -> Result<F::Output, Elapsed> {
    let deadline = Instant::now() + budget;
    SCOPE
        .scope(
            (deadline, budget, hook),
            tokio::time::timeout_at(deadline, call),
        )
        .await
}

/// Tells the hook of the current [`within_hooked`], if any, that an attempt failed with
/// `error` and will be retried.
fn retried(error: &Error) {
    let _ = SCOPE.try_with(|(_, _, hook)| {
        if let Some(hook) = hook {
            hook(error);
        }
    });
}

/// Exponential backoff with jitter: each pause is drawn from `[d/2, d]`, and `d` doubles from
/// `first` up to `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    max: Duration,
}

impl Backoff {
    /// The backoff between the attempts of one store call: 20 ms doubling to 250 ms.
    pub const DEFAULT: Backoff = Backoff {
        first: Duration::from_millis(20),
        max: Duration::from_millis(250),
    };

    /// Pauses that start at `first` (at least 1 ms) and double up to `max`.
    pub const fn new(first: Duration, max: Duration) -> Self {
        const fn at_least(d: Duration, floor: Duration) -> Duration {
            if d.as_nanos() < floor.as_nanos() {
                floor
            } else {
                d
            }
        }
        let max = at_least(max, Duration::from_millis(1));
        let first = at_least(first, Duration::from_millis(1));
        Self {
            first: if first.as_nanos() > max.as_nanos() {
                max
            } else {
                first
            },
            max,
        }
    }

    /// The first pause.
    pub fn first(&self) -> Duration {
        self.first
    }

    /// The longest pause.
    pub fn max(&self) -> Duration {
        self.max
    }

    pub(crate) fn pauses(self) -> Pauses {
        Pauses {
            backoff: self,
            next: self.first,
        }
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The pauses of one run of a [`Backoff`].
#[derive(Debug)]
pub(crate) struct Pauses {
    backoff: Backoff,
    next: Duration,
}

impl Pauses {
    /// The next pause, jittered over the upper half.
    pub(crate) fn next(&mut self, rng: &mut Rng) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.backoff.max);
        rng.duration(d / 2, d)
    }

    /// Back to the first pause.
    pub(crate) fn reset(&mut self) {
        self.next = self.backoff.first;
    }
}

/// Whether a call reads or writes, which decides what a timeout means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
}

/// One call to a store: what it does, by when it must end (retries included: the deadline of
/// [`within`], or [`with_budget`](Self::with_budget)), and the backoff between its attempts.
///
/// ```
/// # use leader_core::{Error, backend::Call};
/// # async fn example() -> Result<(), Error> {
/// let body = Call::read("reading the lease blob")
///     .run(|left| async move {
///         // One attempt, given the time left; an SDK call would use `left` as its timeout.
///         let _ = left;
///         Ok::<_, Error>(b"...".to_vec())
///     })
///     .await?;
/// # let _ = body; Ok(()) }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Call {
    kind: Kind,
    what: &'static str,
    deadline: Instant,
    backoff: Backoff,
}

impl Call {
    /// A call that changes nothing; `what` names it in errors ("reading the lease blob").
    pub fn read(what: &'static str) -> Self {
        Self::new(Kind::Read, what)
    }

    /// A conditional write: retried only while the store says it applied nothing, and
    /// [`Error::Indeterminate`] if its time runs out.
    pub fn write(what: &'static str) -> Self {
        Self::new(Kind::Write, what)
    }

    fn new(kind: Kind, what: &'static str) -> Self {
        Self {
            kind,
            what,
            deadline: call_deadline(),
            backoff: Backoff::DEFAULT,
        }
    }

    /// Gives the call `budget` from now instead of the caller's deadline: for calls that
    /// are not part of an election (a builder's table check may wait longer).
    pub fn with_budget(mut self, budget: Duration) -> Self {
        self.deadline = Instant::now() + budget;
        self
    }

    /// The backoff between attempts (default [`Backoff::DEFAULT`]).
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Runs `attempt`, given the time left, until it succeeds, fails with an error that
    /// [`may_retry`] refuses, or the next attempt would not fit in the budget. Each attempt is
    /// also cut off when the budget ends.
    ///
    /// # Errors
    /// The last attempt's error; if the budget ran out during an attempt, [`Error::Timeout`]
    /// for a read and [`Error::Indeterminate`] for a write.
    ///
    /// # Cancel safety
    /// As cancel-safe as `attempt`: a cancelled write may still be applied.
    pub async fn run<T, F, Fut>(self, mut attempt: F) -> Result<T, Error>
    where
        F: FnMut(Duration) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let deadline = self.deadline;
        let budget = deadline.saturating_duration_since(Instant::now());
        // An attempt with less time than this is not worth starting.
        let least = budget / 4;
        let mut pauses = self.backoff.pauses();
        let mut rng = Rng::from_entropy();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // At the deadline itself, not `left` from now: a timer computed from a later `now`
            // can fall a tick after the caller's `within`, which then cuts the call off
            // before it can say how it ended.
            let error = match tokio::time::timeout_at(deadline, attempt(left)).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(error)) => error,
                Err(_) => return Err(self.out_of_time(budget)),
            };
            let resume = Instant::now() + pauses.next(&mut rng);
            if !may_retry(&error) || resume + least >= deadline {
                return Err(error);
            }
            debug!(what = self.what, error = %error, "retrying within the call's time");
            retried(&error);
            tokio::time::sleep_until(resume).await;
        }
    }

    fn out_of_time(&self, budget: Duration) -> Error {
        match self.kind {
            Kind::Read => Error::Timeout {
                operation: self.what,
                after: budget,
            },
            Kind::Write => {
                Error::indeterminate(format!("{} did not finish within {budget:?}", self.what))
            }
        }
    }
}

/// Whether a failed attempt may be tried again within the same call: only when the error
/// promises that the store applied nothing and another attempt may fare better (throttled,
/// unavailable, a read that timed out). Never an [`Error::Indeterminate`] write.
pub fn may_retry(error: &Error) -> bool {
    matches!(
        error.kind(),
        ErrorKind::Throttled | ErrorKind::Unavailable | ErrorKind::Timeout
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn throttled() -> Error {
        Error::Throttled {
            message: "slow down".to_owned(),
            source: None,
        }
    }

    async fn count<T: std::fmt::Debug>(
        call: Call,
        mut answer: impl FnMut(u32) -> Result<T, Error>,
    ) -> (Result<T, Error>, u32) {
        let attempts = AtomicU32::new(0);
        let result = call
            .run(|_| {
                let n = attempts.fetch_add(1, Ordering::SeqCst);
                let out = answer(n);
                async move { out }
            })
            .await;
        (result, attempts.load(Ordering::SeqCst))
    }

    #[tokio::test(start_paused = true)]
    async fn throttled_attempts_are_retried_within_the_budget() {
        let call = Call::write("w").with_budget(Duration::from_secs(2));
        let (result, attempts) =
            count(call, |n| if n < 3 { Err(throttled()) } else { Ok(n) }).await;
        assert_eq!(result.ok(), Some(3));
        assert_eq!(attempts, 4);
    }

    #[tokio::test(start_paused = true)]
    async fn endless_throttling_gives_up_before_the_deadline() {
        let started = Instant::now();
        let call = Call::read("r").with_budget(Duration::from_secs(1));
        let (result, attempts) = count(call, |_| Err::<(), _>(throttled())).await;
        assert_eq!(result.err().map(|e| e.kind()), Some(ErrorKind::Throttled));
        assert!(attempts > 2, "{attempts}");
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn ambiguous_and_permanent_failures_are_never_retried() {
        for error in [
            Error::indeterminate("lost"),
            Error::Unauthenticated {
                message: "no".to_owned(),
                source: None,
            },
            Error::backend("odd", "odd"),
        ] {
            let kind = error.kind();
            let mut error = Some(error);
            let call = Call::write("w").with_budget(Duration::from_secs(2));
            let (result, attempts) = count(call, |_| {
                Err::<(), _>(error.take().unwrap_or_else(|| Error::unavailable("again")))
            })
            .await;
            assert_eq!(result.err().map(|e| e.kind()), Some(kind));
            assert_eq!(attempts, 1, "{kind:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_cut_off_by_the_budget_is_indeterminate_for_a_write_only() {
        for (call, kind) in [
            (Call::write("w"), ErrorKind::Indeterminate),
            (Call::read("r"), ErrorKind::Timeout),
        ] {
            let result = call
                .run(|_| async {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    Ok(())
                })
                .await;
            assert_eq!(result.err().map(|e| e.kind()), Some(kind));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_inherits_the_deadline_of_within_and_defaults_outside_it() {
        let started = Instant::now();
        assert_eq!(call_deadline() - started, DEFAULT_BUDGET);
        let seen = within(Duration::from_millis(300), async {
            call_deadline() - started
        })
        .await
        .unwrap();
        assert_eq!(seen, Duration::from_millis(300));
        let budget = within(Duration::from_millis(300), async { call_budget() }).await;
        assert_eq!(budget.ok(), Some(Duration::from_millis(300)));
        assert_eq!(call_budget(), DEFAULT_BUDGET);
        // A backend's call (made inside, as a backend method's body is) ends at that deadline
        // with its own error, before it is cut off.
        let r = within(Duration::from_millis(300), async {
            Call::write("w")
                .run(|_| std::future::pending::<Result<(), Error>>())
                .await
        })
        .await;
        assert!(started.elapsed() <= Duration::from_millis(300));
        let inner = r.expect("the call ends by the deadline with its own answer");
        assert_eq!(
            inner.err().map(|e| e.kind()),
            Some(ErrorKind::Indeterminate)
        );
    }

    #[test]
    fn pauses_double_up_to_the_cap_with_jitter_in_the_upper_half() {
        let mut rng = Rng::seeded(7);
        let mut pauses =
            Backoff::new(Duration::from_millis(100), Duration::from_millis(300)).pauses();
        let got: Vec<_> = (0..4).map(|_| pauses.next(&mut rng)).collect();
        for (pause, d) in got.iter().zip([100, 200, 300, 300]) {
            let d = Duration::from_millis(d);
            assert!(*pause >= d / 2 && *pause <= d, "{pause:?} for {d:?}");
        }
        pauses.reset();
        assert!(pauses.next(&mut rng) <= Duration::from_millis(100));
    }
}
