//! The elector: campaigns, renews in the background, steps down, releases, and reports.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, sleep_until, timeout_at};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::backend::{Changes, Fence, LeaseBackend};
use crate::call::Backoff;
use crate::campaign::Campaign;
use crate::clock::Anchor;
use crate::config::{ClockRate, Timing, TimingOverrides};
use crate::error::{ConfigError, Error, ErrorKind};
use crate::lease::{Acquisition, Grant, LeaseClient, ObservedLeader, Renewal};
use crate::metrics::{ElectionMetrics, StoreContact, secs};
use crate::model::{HolderId, LeaseKey, Metadata};
use crate::quorum::{Quorum, QuorumClient};
use crate::rand::Rng;
use crate::term::{Term, TermDeadline, TermSlot, term_over};
use crate::token::FencingToken;

/// What this candidate knows about the leadership of its key, published on every change.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Leadership {
    /// Not known yet, or the store cannot be read; `problem` says why.
    Unknown {
        /// The last store error, if any.
        problem: Option<Problem>,
    },
    /// Another candidate leads, or nobody does (`leader` is `None`).
    Follower {
        /// The leader this candidate observed.
        leader: Option<ObservedLeader>,
    },
    /// This candidate leads until `deadline` unless it renews first.
    Leader {
        /// The term's fencing token.
        token: FencingToken,
        /// When this candidate stops acting unless a renew succeeds before.
        deadline: Instant,
    },
    /// This candidate is ending its term: the work has been told to stop and the lease will be
    /// released once it has.
    SteppingDown {
        /// The ending term's token.
        token: FencingToken,
    },
    /// The elector has shut down: on request, or because the store gave an error that retrying
    /// cannot fix (`problem`: missing container, table, bucket or folder, rejected credentials,
    /// permission denied, an invalid configuration).
    Stopped {
        /// Why the campaign ended, if not on request.
        problem: Option<Problem>,
    },
}

impl Leadership {
    /// The token, if this candidate leads.
    pub fn token(&self) -> Option<FencingToken> {
        match self {
            Leadership::Leader { token, .. } => Some(*token),
            _ => None,
        }
    }

    /// Whether this candidate leads.
    pub fn is_leader(&self) -> bool {
        matches!(self, Leadership::Leader { .. })
    }
}

/// A store error as a plain value, for [`Leadership::Unknown`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The kind of error.
    pub kind: ErrorKind,
    /// Its message.
    pub message: String,
}

impl From<&Error> for Problem {
    fn from(e: &Error) -> Self {
        Self {
            kind: e.kind(),
            message: e.to_string(),
        }
    }
}

/// The elector has stopped: no further term will begin.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the elector has stopped{}", .problem.as_ref().map(|p| format!(": {}", p.message)).unwrap_or_default())]
pub struct Stopped {
    pub(crate) problem: Option<Problem>,
}

impl Stopped {
    /// The store error that ended the campaign, if it did not end on request.
    pub fn problem(&self) -> Option<&Problem> {
        self.problem.as_ref()
    }
}

/// Configures an [`Elector`]. Durations left unset are derived from `ttl` as in
/// [`Timing::from_ttl`].
#[derive(Debug)]
#[must_use]
pub struct ElectorBuilder {
    source: Source,
    key: LeaseKey,
    holder: Option<HolderId>,
    metadata: Metadata,
    ttl: Duration,
    set: TimingOverrides,
    seed: Option<u64>,
    clock: ClockRate,
}

/// Where an elector campaigns.
#[derive(Debug)]
enum Source {
    /// One store's lease.
    One(Arc<dyn LeaseBackend>),
    /// A majority of independent stores.
    Quorum(Quorum),
}

impl ElectorBuilder {
    crate::config::timing_setters!("the election");

    /// This candidate's id (default [`HolderId::generate`]).
    pub fn holder_id(mut self, holder: HolderId) -> Self {
        self.holder = Some(holder);
        self
    }

    /// Metadata that followers can read while this candidate leads.
    pub fn metadata(mut self, metadata: Metadata) -> Self {
        self.metadata = metadata;
        self
    }

    /// Seeds the jitter of polls and backoff, for reproducible tests (default: random).
    pub fn jitter_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Simulation only: run this candidate's timers as if its clock ran at `rate` (1.0 is true
    /// time), to check that `margin` covers clock drift.
    #[cfg(feature = "simulation")]
    pub fn simulated_clock_rate(mut self, rate: f64) -> Self {
        self.clock = ClockRate(rate);
        self
    }

    /// The timing these settings give.
    pub fn resolved_timing(&self) -> Timing {
        Timing::resolve(self.ttl, &self.set)
    }

    /// Validates the settings and builds the elector.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first violated rule: a zero duration, a margin below twice
    /// the request timeout, no time to renew before the deadline, metadata a store cannot keep,
    /// or a timing the backend does not support.
    pub fn build(self) -> Result<Elector, ConfigError> {
        let timing = self.resolved_timing();
        if !(self.clock.0.is_finite() && self.clock.0 > 0.0) {
            return Err(ConfigError::ZeroDuration {
                field: "simulated clock rate",
            });
        }
        let holder = self.holder.unwrap_or_else(HolderId::generate);
        let seed = self.seed.map(|s| s ^ 0x5eed);
        let (client, metrics): (Box<dyn Campaign>, _) = match self.source {
            Source::One(backend) => {
                let metrics = ElectionMetrics::new(&self.key, &holder, backend.name());
                let mut client = LeaseClient::new(backend, self.key, holder, timing)?
                    .with_clock(self.clock, seed);
                client.set_metadata(self.metadata)?;
                (Box::new(client), metrics)
            }
            Source::Quorum(quorum) => {
                let metrics = ElectionMetrics::new(&self.key, &holder, "quorum");
                let mut client = QuorumClient::new(&quorum, self.key, holder, timing)?
                    .with_clock(self.clock, seed);
                client.set_metadata(self.metadata)?;
                (Box::new(client), metrics)
            }
        };
        Ok(Elector {
            client,
            metrics,
            timing,
            clock: self.clock,
            rng: self.seed.map_or_else(Rng::from_entropy, Rng::seeded),
        })
    }
}

/// Campaigns for one lease key and keeps the lease while it leads.
///
/// Build it with [`Elector::builder`], then [`spawn`](Elector::spawn) it (or run its task
/// yourself with [`into_parts`](Elector::into_parts)). The returned [`ElectorHandle`]
/// publishes [`Leadership`], hands out [`Term`]s, and resigns or shuts down.
///
/// The timing rules it keeps (`docs/protocol.md`):
/// - a term is valid until `t_sent + ttl - margin` of its last successful write; at that
///   instant the term's work is cancelled and leadership changes, whether or not the store
///   answered;
/// - a renew that meets a conflict ends the term at once;
/// - a follower takes over a record only after seeing it unchanged for a full ttl on its own
///   clock (unless the store enforces expiry), and a released record at once;
/// - a follower reads every `poll_every` (jittered) with the store's cheapest read
///   ([`LeaseBackend::read_if_changed`]), and at once when the store hints a change
///   ([`LeaseBackend::changes`]);
/// - every store call has its own timeout; errors back off with jitter, capped at
///   `retry_every` for followers and bounded by the deadline for the leader.
#[derive(Debug)]
pub struct Elector {
    client: Box<dyn Campaign>,
    metrics: ElectionMetrics,
    timing: Timing,
    clock: ClockRate,
    rng: Rng,
}

/// The elector's background work, for callers who run it on their own executor.
pub type ElectorTask = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

impl Elector {
    /// Starts configuring an elector for `key` on `backend`.
    pub fn builder(backend: Arc<dyn LeaseBackend>, key: LeaseKey) -> ElectorBuilder {
        Self::with_source(Source::One(backend), key)
    }

    /// Starts configuring an elector for `key` over a majority of the stores of `quorum`:
    /// it leads while a majority carries a live record of its term, so it survives the
    /// outage of any minority of them (`docs/quorum.md`). Everything else is as for
    /// [`builder`](Self::builder): the same timing, terms, fencing (with the quorum's token)
    /// and handle.
    pub fn quorum_builder(quorum: Quorum, key: LeaseKey) -> ElectorBuilder {
        Self::with_source(Source::Quorum(quorum), key)
    }

    fn with_source(source: Source, key: LeaseKey) -> ElectorBuilder {
        ElectorBuilder {
            source,
            key,
            holder: None,
            metadata: Metadata::new(),
            ttl: Timing::DEFAULT_TTL,
            set: TimingOverrides::default(),
            seed: None,
            clock: ClockRate(1.0),
        }
    }

    /// The timing in force.
    pub fn timing(&self) -> &Timing {
        &self.timing
    }

    /// Spawns the campaign on the current tokio runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime, like [`tokio::spawn`].
    pub fn spawn(self) -> ElectorHandle {
        let (mut handle, task) = self.into_parts();
        handle.task = Some(tokio::spawn(task));
        handle
    }

    /// The handle and the campaign's future, which the caller must run to completion.
    pub fn into_parts(self) -> (ElectorHandle, ElectorTask) {
        let (tx, rx) = watch::channel(Leadership::Unknown { problem: None });
        let (commands_tx, commands_rx) = mpsc::channel(4);
        let shared = Arc::new(Shared {
            tick: self
                .clock
                .real(self.timing.margin / 2)
                .max(Duration::from_millis(1)),
            tx,
            shutdown: CancellationToken::new(),
            term: Mutex::new(None),
            key: self.client.key().clone(),
            holder: self.client.holder().clone(),
            answered: self.client.store_contact(),
            metrics: self.metrics,
        });
        let span = info_span!("elector", key = %shared.key, holder = %shared.holder);
        let changes = self.client.changes();
        let driver = Driver {
            changes,
            client: self.client,
            timing: self.timing,
            clock: self.clock,
            rng: self.rng,
            shared: shared.clone(),
            commands: commands_rx,
            cooldown_until: None,
            last_term: None,
        };
        let handle = ElectorHandle {
            shared,
            rx,
            commands: commands_tx,
            task: None,
        };
        (handle, Box::pin(driver.run().instrument(span)))
    }
}

#[derive(Debug)]
struct Shared {
    /// How often a term's watchdog re-checks the deadline for a host suspend.
    tick: Duration,
    tx: watch::Sender<Leadership>,
    shutdown: CancellationToken,
    term: Mutex<Option<TermSlot>>,
    key: LeaseKey,
    holder: HolderId,
    answered: StoreContact,
    metrics: ElectionMetrics,
}

impl Shared {
    /// Sets the gauges from the leadership about to be published: leading only while
    /// [`Leadership::Leader`], and the token of this term or of the leader seen.
    fn gauges(&self, state: &Leadership) {
        let m = &self.metrics;
        m.is_leader.set(if state.is_leader() { 1.0 } else { 0.0 });
        match state {
            Leadership::Leader { token, .. } => m.token.set(token.get() as f64),
            Leadership::Follower {
                leader: Some(leader),
            } => m.token.set(leader.token.get() as f64),
            _ => {}
        }
    }

    fn term(&self) -> MutexGuard<'_, Option<TermSlot>> {
        self.term.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish(&self, state: Leadership) {
        self.tx.send_if_modified(|current| {
            if *current == state {
                false
            } else {
                // Under the channel's lock, so that the gauges follow the order of changes.
                self.gauges(&state);
                *current = state;
                true
            }
        });
    }
}

enum Command {
    Resign(oneshot::Sender<()>),
}

/// Controls a running [`Elector`]. Dropping it shuts the elector down (releasing the lease in
/// the background, if the runtime lives on).
#[derive(Debug)]
pub struct ElectorHandle {
    shared: Arc<Shared>,
    rx: watch::Receiver<Leadership>,
    commands: mpsc::Sender<Command>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl ElectorHandle {
    /// A receiver of every leadership change.
    pub fn leadership(&self) -> watch::Receiver<Leadership> {
        self.rx.clone()
    }

    /// The leadership now.
    pub fn current(&self) -> Leadership {
        let now = self.rx.borrow().clone();
        if let Leadership::Leader { token, .. } = &now {
            // Over at its deadline even if nothing has published it yet.
            let live = self
                .shared
                .term()
                .as_ref()
                .is_some_and(|t| t.fence.token == *token && t.live());
            if !live {
                return Leadership::Unknown { problem: None };
            }
        }
        now
    }

    /// This candidate's holder id.
    pub fn holder_id(&self) -> &HolderId {
        &self.shared.holder
    }

    /// When the store last answered this elector's calls (follows it as it runs): a
    /// readiness check can call the store reachable if it answered within the last ttl.
    pub fn store_contact(&self) -> StoreContact {
        self.shared.answered.clone()
    }

    /// The lease key.
    pub fn key(&self) -> &LeaseKey {
        &self.shared.key
    }

    /// Waits until this candidate leads and returns the term: its token, its cancellation, and
    /// its deadline. Each term is handed out once: called again, it waits for the next term
    /// (so a loop around it never spins). Drop the [`Term`] when the term's work has stopped:
    /// shutdown and resign wait for that (up to the deadline) before releasing the lease.
    ///
    /// # Errors
    /// [`Stopped`] if the elector stops first.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn wait_for_term(&self) -> Result<Term, Stopped> {
        let mut rx = self.rx.clone();
        loop {
            let state = rx.borrow_and_update().clone();
            match state {
                Leadership::Leader { token, .. } => {
                    // A term past its deadline is over even if the elector's task has not
                    // run yet (a resumed process); wait for it to say so. A term is handed
                    // out once: the next call waits for the next term.
                    let tick = Some(self.shared.tick);
                    let mut slot = self.shared.term();
                    if let Some(term) = slot
                        .as_mut()
                        .filter(|t| t.fence.token == token)
                        .and_then(|t| t.hand_out(None, tick))
                    {
                        return Ok(term);
                    }
                }
                Leadership::Stopped { problem } => return Err(Stopped { problem }),
                _ => {}
            }
            rx.changed().await.map_err(|_| Stopped { problem: None })?;
        }
    }

    /// Steps down if leading: cancels the term's work, waits for its [`Term`]s to be dropped
    /// (at most until the deadline), releases the lease so that a follower takes over at once,
    /// then keeps following without campaigning for one ttl. Does nothing if not leading.
    ///
    /// # Errors
    /// [`Stopped`] if the elector has stopped.
    ///
    /// # Cancel safety
    /// Cancel-safe; the step-down goes on.
    pub async fn resign(&self) -> Result<(), Stopped> {
        let (ack, done) = oneshot::channel();
        self.commands
            .send(Command::Resign(ack))
            .await
            .map_err(|_| Stopped { problem: None })?;
        done.await.map_err(|_| Stopped { problem: None })
    }

    /// Stops campaigning: cancels the term's work, waits for its [`Term`]s to be dropped (at
    /// most until the deadline), releases the lease if the work stopped in time, and returns
    /// when the elector has stopped.
    ///
    /// # Cancel safety
    /// Cancel-safe; the shutdown goes on.
    pub async fn shutdown(mut self) {
        self.shared.shutdown.cancel();
        let mut rx = self.rx.clone();
        let _ = rx
            .wait_for(|l| matches!(l, Leadership::Stopped { .. }))
            .await;
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for ElectorHandle {
    fn drop(&mut self) {
        self.shared.shutdown.cancel();
    }
}

/// Ends a term at its deadline without the elector's task: cancels it, stops handing it out,
/// and publishes that this candidate no longer leads (unless something newer was published).
async fn watchdog(
    shared: Arc<Shared>,
    token: FencingToken,
    cancel: CancellationToken,
    deadline: watch::Receiver<TermDeadline>,
) {
    term_over(&cancel, &deadline, shared.tick).await;
    let mut term = shared.term();
    if term.as_ref().is_some_and(|t| t.fence.token == token) {
        *term = None;
        drop(term);
        shared.tx.send_if_modified(|current| {
            let ours = matches!(current, Leadership::Leader { token: t, .. } if *t == token);
            if ours {
                shared.metrics.is_leader.set(0.0);
                *current = Leadership::Unknown { problem: None };
            }
            ours
        });
    }
}

/// Held by the elector's task: if the task panics or is dropped (its runtime shut down, the
/// future of [`Elector::into_parts`] dropped), the term in progress ends and readers learn that
/// the elector has stopped.
struct TaskGuard(Arc<Shared>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        if let Some(t) = self.0.term().take() {
            t.cancel.cancel();
        }
        self.0.metrics.is_leader.set(0.0);
        self.0.tx.send_if_modified(|current| {
            if matches!(current, Leadership::Stopped { .. }) {
                return false;
            }
            *current = Leadership::Stopped {
                problem: Some(Problem {
                    kind: ErrorKind::Backend,
                    message: "the elector's task ended unexpectedly (it panicked or was dropped)"
                        .to_owned(),
                }),
            };
            true
        });
    }
}

/// Whether `e` ends a campaign: an error that retrying cannot fix (a missing container,
/// rejected credentials, permission denied, bad configuration). A malformed record is not one:
/// the campaign waits for an operator to repair or delete it.
pub(crate) fn is_permanent(e: &Error) -> bool {
    !e.is_retryable() && e.kind() != ErrorKind::MalformedRecord
}

enum FollowEnd {
    /// The grant, and the anchor taken before the acquiring write was sent.
    Acquired(Grant, Anchor),
    Shutdown,
    /// A store error that retrying cannot fix.
    Failed(Problem),
}

enum LeadEnd {
    Shutdown,
    Resigned,
    Over,
}

struct Driver {
    client: Box<dyn Campaign>,
    timing: Timing,
    clock: ClockRate,
    rng: Rng,
    shared: Arc<Shared>,
    commands: mpsc::Receiver<Command>,
    cooldown_until: Option<Instant>,
    /// The store's change hints for the key, if it gives them.
    changes: Option<Changes>,
    /// The last term this candidate saw (its own included): where a time without a leader
    /// starts.
    last_term: Option<LastTerm>,
}

/// The last term a candidate saw, for the time without a leader.
#[derive(Clone, Copy, Debug)]
struct LastTerm {
    token: FencingToken,
    /// The first sight of its latest held record: its last sign of life.
    alive_at: Instant,
    /// The last read that showed it held.
    read_held_at: Instant,
    /// When it ended as far as this candidate can tell: the last read that still showed it
    /// held, once a read has shown it released.
    released_at: Option<Instant>,
    /// Whether this candidate saw it live (held, or its own): only then does a time without
    /// a leader begin when it ends.
    seen_held: bool,
}

/// The shortest time between two reads of a follower woken by change hints.
const HINT_FLOOR: Duration = Duration::from_millis(20);

/// The next change hint, or never if the store gives none.
async fn next_change(changes: &mut Option<Changes>) {
    match changes {
        Some(c) => c.changed().await,
        None => std::future::pending().await,
    }
}

impl Driver {
    async fn run(mut self) {
        // Ends the term and says so if this task panics or is dropped mid-term.
        let _guard = TaskGuard(self.shared.clone());
        let mut problem = None;
        loop {
            let (grant, anchor) = match self.follow().await {
                FollowEnd::Acquired(grant, anchor) => (grant, anchor),
                FollowEnd::Shutdown => break,
                FollowEnd::Failed(p) => {
                    problem = Some(p);
                    break;
                }
            };
            let token = grant.token;
            let started = Instant::now();
            let end = self.lead(grant, anchor).await;
            let now = Instant::now();
            self.shared
                .metrics
                .term_duration
                .record(secs(now - started));
            self.last_term = Some(LastTerm {
                token,
                alive_at: now,
                read_held_at: now,
                released_at: None,
                seen_held: true,
            });
            match end {
                LeadEnd::Shutdown => break,
                LeadEnd::Resigned => {
                    self.cooldown_until = Some(Instant::now() + self.clock.real(self.timing.ttl));
                }
                LeadEnd::Over => {}
            }
        }
        self.shared.publish(Leadership::Stopped { problem });
        info!("elector stopped");
    }

    fn real(&self, d: Duration) -> Duration {
        self.clock.real(d)
    }

    /// Notes a record of term `token` (`held` or released) read at `now`, whose revision was
    /// first seen at `first_seen`. A new held term ends the time without a leader, which
    /// began when the term before was last seen alive: at its release (as the last read that
    /// still showed it held), else at its last renew (the first sight of its latest record).
    /// Nothing is recorded for a term this candidate never saw live (it started on a released
    /// record), and an older token (a lagging read, an operator's rewrite) changes nothing.
    fn saw_term(&mut self, token: FencingToken, held: bool, first_seen: Instant, now: Instant) {
        if let Some(last) = self.last_term.as_mut().filter(|l| l.token >= token) {
            if last.token > token {
                return;
            }
            if held {
                last.alive_at = first_seen;
                last.read_held_at = now;
                last.released_at = None;
                last.seen_held = true;
            } else if last.released_at.is_none() {
                last.released_at = Some(last.read_held_at);
            }
            return;
        }
        if let Some(last) = self.last_term.filter(|l| held && l.seen_held) {
            let since = last.released_at.unwrap_or(last.alive_at);
            let gap = first_seen.saturating_duration_since(since);
            self.shared.metrics.leaderless.record(secs(gap));
        }
        self.last_term = Some(LastTerm {
            token,
            alive_at: first_seen,
            read_held_at: now,
            released_at: (!held).then_some(now),
            seen_held: held,
        });
    }

    /// Campaigns until this candidate holds the lease or shutdown begins.
    async fn follow(&mut self) -> FollowEnd {
        let retry = self.real(self.timing.retry_every);
        let poll = self.real(self.timing.poll_every);
        let mut backoff = Backoff::new(retry / 4, retry).pauses();
        let mut failing = false;
        // The first wait of a campaign starts at a random phase of the poll cycle, so that
        // followers started together (an autoscaling group) do not poll in lockstep; the
        // later ones are jittered up to 1.1 x.
        let mut shortest = Duration::ZERO;
        loop {
            if self.shared.shutdown.is_cancelled() {
                return FollowEnd::Shutdown;
            }
            let anchor_at = Instant::now();
            let anchor = Anchor::now();
            let next = match self.attempt().await {
                Ok(Acquisition::Acquired(grant)) => {
                    let now = Instant::now();
                    if let Some(seen) = self.client.replaced() {
                        self.saw_term(seen.token, seen.held, seen.since, now);
                    }
                    self.saw_term(grant.token, true, now, now);
                    if self.shared.shutdown.is_cancelled() {
                        let _ = self.client.release().await;
                        return FollowEnd::Shutdown;
                    }
                    return FollowEnd::Acquired(grant, anchor);
                }
                Ok(Acquisition::Following {
                    leader,
                    takeover_at,
                }) => {
                    if failing {
                        info!("store reachable again");
                        failing = false;
                    }
                    backoff.reset();
                    if let Some(seen) = self.client.seen() {
                        self.saw_term(seen.token, seen.held, seen.since, Instant::now());
                    }
                    self.shared.publish(Leadership::Follower { leader });
                    let wait = self.rng.duration(shortest, poll * 11 / 10);
                    shortest = poll;
                    let poll = Instant::now() + wait;
                    takeover_at.map_or(poll, |t| t.min(poll))
                }
                Err(e) if is_permanent(&e) => {
                    error!(error = %e, "campaign ended: this error needs a person (not retried)");
                    return FollowEnd::Failed(Problem::from(&e));
                }
                Err(e) => {
                    if failing {
                        debug!(error = %e, "campaign attempt failed");
                    } else {
                        warn!(error = %e, "campaign attempt failed; backing off");
                        failing = true;
                    }
                    self.shared.publish(Leadership::Unknown {
                        problem: Some(Problem::from(&e)),
                    });
                    Instant::now() + backoff.next(&mut self.rng)
                }
            };
            if !self.wait(next, anchor_at).await {
                return FollowEnd::Shutdown;
            }
        }
    }

    /// One try: to acquire, or only to look while sitting out after a resign.
    async fn attempt(&mut self) -> Result<Acquisition, Error> {
        let cooling = self.cooldown_until.is_some_and(|t| Instant::now() < t);
        if !cooling {
            return self.client.try_acquire().await;
        }
        self.client
            .observe()
            .await
            .map(|leader| Acquisition::Following {
                leader,
                takeover_at: None,
            })
    }

    /// Waits until `next`, or sooner if the store hints a change (not sooner than
    /// [`HINT_FLOOR`] after `attempt_at`, the last attempt); `false` if shutdown begins first.
    async fn wait(&mut self, mut next: Instant, attempt_at: Instant) -> bool {
        loop {
            tokio::select! {
                biased;
                _ = self.shared.shutdown.cancelled() => return false,
                cmd = self.commands.recv() => match cmd {
                    Some(Command::Resign(ack)) => { let _ = ack.send(()); }
                    None => return false,
                },
                _ = sleep_until(next) => return true,
                () = next_change(&mut self.changes) => {
                    // Read at once, but not more often than every HINT_FLOOR: hints only
                    // make a read sooner, whatever a store sends.
                    let soon = attempt_at + HINT_FLOOR;
                    if Instant::now() >= soon {
                        debug!("the store reports a change; reading now");
                        return true;
                    }
                    next = next.min(soon);
                }
            }
        }
    }

    /// Leads one term: renews until the term ends.
    async fn lead(&mut self, mut grant: Grant, anchor: Anchor) -> LeadEnd {
        let token = grant.token;
        let cancel = CancellationToken::new();
        let (alive, mut work_done) = mpsc::channel::<()>(1);
        let (deadline_tx, deadline) = watch::channel(TermDeadline {
            at: grant.deadline,
            anchor,
        });
        *self.shared.term() = Some(TermSlot {
            fence: Fence {
                key: self.shared.key.clone(),
                holder: self.shared.holder.clone(),
                token,
                lease_term: None,
            },
            cancel: cancel.clone(),
            deadline: deadline.clone(),
            alive,
            handed_out: false,
        });
        // The term ends at its deadline even if this task dies or starves.
        tokio::spawn(watchdog(
            self.shared.clone(),
            token,
            cancel.clone(),
            deadline,
        ));
        self.shared.metrics.terms_started.increment(1);
        self.shared.publish(Leadership::Leader {
            token,
            deadline: grant.deadline,
        });
        info!(%token, "became leader");
        let validity = self.real(self.timing.term_validity());
        let renew_every = self.real(self.timing.renew_every);
        loop {
            let next_renew = grant.deadline - validity + renew_every;
            tokio::select! {
                biased;
                _ = self.shared.shutdown.cancelled() => {
                    let deadline = deadline_tx.borrow().effective();
                    self.step_down(&cancel, &mut work_done, token, deadline).await;
                    return LeadEnd::Shutdown;
                }
                cmd = self.commands.recv() => {
                    let deadline = deadline_tx.borrow().effective();
                    let resign = matches!(cmd, Some(Command::Resign(_)));
                    if resign {
                        info!(%token, "resigning");
                    }
                    self.step_down(&cancel, &mut work_done, token, deadline).await;
                    return match cmd {
                        Some(Command::Resign(ack)) => {
                            let _ = ack.send(());
                            LeadEnd::Resigned
                        }
                        None => LeadEnd::Shutdown,
                    };
                }
                _ = sleep_until(grant.deadline) => {
                    self.end_term(&cancel, "deadline passed without a successful renew", None);
                    return LeadEnd::Over;
                }
                _ = cancel.cancelled() => {
                    self.end_term(&cancel, "deadline passed (the host was suspended)", None);
                    return LeadEnd::Over;
                }
                _ = sleep_until(next_renew) => {}
            }
            match self.renew(&grant, &cancel, &deadline_tx).await {
                Some(g) => grant = g,
                None => return LeadEnd::Over,
            }
        }
    }

    /// Renews the term of `grant`, retrying until its deadline: the new grant, or `None` once
    /// the term is over (and ended).
    async fn renew(
        &mut self,
        grant: &Grant,
        cancel: &CancellationToken,
        deadline_tx: &watch::Sender<TermDeadline>,
    ) -> Option<Grant> {
        let token = grant.token;
        // The renew is the leader's lifeline: retry often (at most half a request timeout
        // apart), so that a store throttling a share of requests does not cost the term;
        // every attempt is bounded by the deadline anyway.
        let rt = self.real(self.timing.request_timeout);
        let mut backoff = Backoff::new(rt / 8, rt / 2).pauses();
        let mut attempts = 0u32;
        // Taken before the first attempt: a grant may come from any attempt's write (one
        // whose answer was lost), and a host suspend since must shorten it.
        let anchor = Anchor::now();
        loop {
            attempts += 1;
            let sent = Instant::now();
            let renewal = tokio::select! {
                biased;
                _ = sleep_until(grant.deadline) => None,
                _ = cancel.cancelled() => None,
                r = self.client.renew() => Some(r),
            };
            if renewal.is_some() {
                self.shared
                    .metrics
                    .renew_duration
                    .record(secs(sent.elapsed()));
            }
            match renewal {
                None | Some(Ok(Renewal::Expired)) => {
                    self.end_term(cancel, "deadline passed before a renew succeeded", None);
                    return None;
                }
                Some(Ok(Renewal::Lost { leader })) => {
                    self.end_term(cancel, "lease lost to another holder", Some(leader));
                    return None;
                }
                Some(Ok(Renewal::Renewed(g))) => {
                    if attempts > 1 {
                        let left = grant.deadline.saturating_duration_since(Instant::now());
                        warn!(%token, attempts, ?left, "renewed late: it took several attempts; this much was left before the deadline");
                    }
                    // Against the deadline in force (earlier by a host suspend).
                    let effective = deadline_tx.borrow().effective();
                    let slack = effective.saturating_duration_since(Instant::now());
                    self.shared.metrics.renew_slack.record(secs(slack));
                    deadline_tx.send_replace(TermDeadline {
                        at: g.deadline,
                        anchor,
                    });
                    self.shared.publish(Leadership::Leader {
                        token,
                        deadline: g.deadline,
                    });
                    return Some(g);
                }
                Some(Err(e)) => {
                    warn!(%token, error = %e, "renew failed; retrying before the deadline");
                    let wait = Instant::now() + backoff.next(&mut self.rng);
                    tokio::select! {
                        biased;
                        _ = sleep_until(grant.deadline) => {}
                        _ = cancel.cancelled() => {}
                        _ = sleep_until(wait) => {}
                    }
                }
            }
        }
    }

    fn end_term(
        &mut self,
        cancel: &CancellationToken,
        why: &str,
        leader: Option<Option<ObservedLeader>>,
    ) {
        cancel.cancel();
        *self.shared.term() = None;
        self.client.end_term(why);
        warn!(why, "stepped down");
        self.shared.publish(match leader {
            Some(leader) => Leadership::Follower { leader },
            None => Leadership::Unknown { problem: None },
        });
    }

    /// Cancels the term's work, waits for its `Term`s to be dropped (until the deadline at
    /// most), then releases the lease if the work stopped in time.
    async fn step_down(
        &mut self,
        cancel: &CancellationToken,
        work_done: &mut mpsc::Receiver<()>,
        token: FencingToken,
        deadline: Instant,
    ) {
        cancel.cancel();
        *self.shared.term() = None;
        self.shared.publish(Leadership::SteppingDown { token });
        if timeout_at(deadline, work_done.recv()).await.is_err() {
            warn!(%token, "the term's work was not confirmed stopped by the deadline; not releasing, the lease will expire");
            self.client.end_term("work outlived the deadline");
            self.shared.publish(Leadership::Unknown { problem: None });
            return;
        }
        match self.client.release().await {
            Ok(_) => {}
            Err(e) => warn!(error = %e, "release failed; the lease will expire after its ttl"),
        }
        self.shared.publish(Leadership::Follower { leader: None });
    }
}
