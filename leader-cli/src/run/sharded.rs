//! `leader run --shards N`: lead a share of the shards of a key, one supervised command per led
//! shard.
//!
//! The instance joins the key through `leader::ShardedElector`, which balances the shards over
//! every instance of the key. Each shard term it hands out gets a task that runs the command
//! through its own supervisor process, by the rules of a single term (`crate::supervise`: not
//! started past the deadline, the stop signal at `deadline - grace`, SIGKILL at the deadline,
//! every process it starts tracked). The task keeps the shard's `Term`
//! until the command and everything it started have exited: only then may the elector release
//! the shard (to rebalance, or at shutdown).
//!
//! A command that exits by itself while its shard is still led is started again, in the same
//! term (same token), after a pause: 1 s, doubled after each run shorter than 30 s, at most
//! 30 s. The shard stays with this instance: the command is the shard's worker, and the
//! elector has no way to hand one shard back. The same goes for a command whose supervisor
//! was killed (the kernel kills the command with it; `leader` kills what it left), and for
//! one stopped at a deadline that a late renew has moved since.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use leader::{ShardedElector, ShardedHandle, Term};
use nix::sys::signal::Signal;
use tokio::sync::broadcast;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{Instrument, info, info_span, warn};

use super::{Plan, RunArgs, campaign_failed, config_error, first_read};
use crate::lifecycle::Lifecycle;
use crate::signals::{Inbox, Received, Signals, StepDown};
use crate::store::{self, StoreUrl};
use crate::supervise::client::{Ctx, Outcome, become_subreaper, supervise};
use crate::{Exit, endpoints, exit};

/// The first pause before a command that exited is started again.
const RESTART_FIRST: Duration = Duration::from_secs(1);

/// The longest pause before a command that exited is started again; a run at least this long
/// resets the pause to [`RESTART_FIRST`].
const RESTART_MAX: Duration = Duration::from_secs(30);

/// How one shard's task ended.
#[derive(Debug, Default)]
struct ShardEnd {
    /// A term to hold until the instance has stopped: its supervisor died during a stop, so
    /// the shard is left to expire rather than released (`docs/protocol.md`, "Supervising a command").
    keep: Option<Term>,
}

pub(super) async fn run(
    args: &RunArgs,
    url: &StoreUrl,
    shards: u32,
    plan: Plan,
) -> Result<u8, Exit> {
    // Before joining: on a machine whose notice is already out, no shard is taken.
    let mut signals = Signals::new()?;
    let lifecycle = Lifecycle::start(&args.lifecycle, &mut signals).await?;
    if lifecycle.doomed() {
        info!("a notice for this machine is already out: not joining the sharded key");
        let code = lifecycle.stand_down(&mut signals).await;
        lifecycle.finish().await;
        return Ok(code);
    }
    let (handle, ctx) = join(args, url, shards, plan).await?;
    let mut runs = ShardRuns::default();
    runs.until_stopped(&handle, &ctx, &mut signals).await;
    info!("every shard's command has stopped; leaving the sharded key");
    handle.shutdown().await;
    drop(runs.keep);
    let code = match (runs.failure, runs.stop) {
        (Some(e), _) => Err(e),
        (None, Some(sig)) => Ok(128 + sig as u8),
        (None, None) if runs.doomed.load(Ordering::Acquire) => {
            info!("handed over every shard after the notice");
            Ok(lifecycle.stand_down(&mut signals).await)
        }
        (None, None) => Ok(exit::LOST),
    };
    lifecycle.finish().await;
    code
}

/// Opens the store, joins the sharded key and serves the endpoints.
async fn join(
    args: &RunArgs,
    url: &StoreUrl,
    shards: u32,
    plan: Plan,
) -> Result<(ShardedHandle, Arc<Ctx>), Exit> {
    let (store, key) = store::open(url, &args.store_options).await?;
    let mut builder =
        ShardedElector::builder(store.clone(), key.clone(), shards).timing(plan.timing);
    if let Some(holder) = plan.holder {
        builder = builder.holder_id(holder);
    }
    let elector = builder.build().map_err(config_error)?;
    let timing = *elector.timing();
    become_subreaper()?;
    first_read(
        &timing,
        ("joining", "a record of the sharded key"),
        leader::read_status(&*store, &key),
    )
    .await?;
    plan.isolation_note.say();

    let handle = elector.spawn();
    if let Some(e) = plan.endpoint {
        let instance = endpoints::Instance {
            key: key.clone(),
            holder: handle.holder_id().clone(),
            ttl: timing.ttl,
            contact: handle.store_contact(),
            source: endpoints::Source::Sharded {
                assignment: handle.assignment(),
                shards,
            },
        };
        endpoints::serve(e.listener, e.prometheus, instance);
    }
    let ctx = Arc::new(Ctx {
        command: args.command.clone(),
        store: args.store_text(),
        log_format: plan.log_format,
        timing,
        grace: plan.grace,
        key: handle.key().clone(),
        holder: handle.holder_id().clone(),
        shards: Some(shards),
        isolation: plan.isolation,
        require_isolation: plan.require_isolation,
    });
    info!(
        store = %args.store_text(), holder = %ctx.holder, shards, ttl = ?timing.ttl,
        grace = ?plan.grace, "joining the sharded key"
    );
    Ok((handle, ctx))
}

/// The tasks of the led shards, one per shard term, and how the run is ending.
struct ShardRuns {
    /// Every signal goes to every shard's run; a run started after a stop signal never is.
    relay: broadcast::Sender<Received>,
    tasks: JoinSet<Result<ShardEnd, Exit>>,
    stop: Option<Signal>,
    /// A notice for this instance came: every shard is handed over, none is led again, and
    /// no shard's command is started again (its task reads it too).
    doomed: Arc<AtomicBool>,
    failure: Option<Exit>,
    /// Terms to hold until the instance has stopped (see [`ShardEnd::keep`]).
    keep: Vec<Term>,
}

impl Default for ShardRuns {
    fn default() -> Self {
        Self {
            relay: broadcast::channel(64).0,
            tasks: JoinSet::new(),
            stop: None,
            doomed: Arc::new(AtomicBool::new(false)),
            failure: None,
            keep: Vec::new(),
        }
    }
}

impl ShardRuns {
    /// Runs a task per shard term until a stop signal or a failure, and then until every
    /// task has ended.
    async fn until_stopped(
        &mut self,
        handle: &ShardedHandle,
        ctx: &Arc<Ctx>,
        signals: &mut Signals,
    ) {
        let terms = handle.terms();
        loop {
            let ending = self.stop.is_some()
                || self.failure.is_some()
                || self.doomed.load(Ordering::Acquire);
            if ending && self.tasks.is_empty() {
                return;
            }
            tokio::select! {
                biased;
                got = signals.recv() => self.on_signal(got),
                Some(joined) = self.tasks.join_next() => self.on_ended(joined),
                next = terms.next(), if !ending => match next {
                    Ok(term) => {
                        let span = info_span!("shard", shard = term.shard(), token = %term.token());
                        let task = shard_task(ctx.clone(), term, self.relay.subscribe(), self.doomed.clone());
                        self.tasks.spawn(task.instrument(span));
                    }
                    // Its shard terms are over: their commands are being stopped.
                    Err(stopped) => self.failure = Some(campaign_failed(stopped.problem())),
                },
            }
        }
    }

    fn on_signal(&mut self, got: Received) {
        if let Received::Stop(sig) = got
            && self.stop.is_none()
        {
            info!(signal = %sig, running = self.tasks.len(), "stopping the command of every shard");
            self.stop = Some(sig);
        }
        if let Received::StepDown(StepDown::Notice) = got
            && !self.doomed.swap(true, Ordering::AcqRel)
        {
            info!(
                running = self.tasks.len(),
                "a notice: stopping the command of every shard to hand the shards over"
            );
        }
        let _ = self.relay.send(got);
    }

    fn on_ended(&mut self, joined: Result<Result<ShardEnd, Exit>, tokio::task::JoinError>) {
        let ended = joined.unwrap_or_else(|e| {
            Err(Exit::new(
                exit::UNAVAILABLE,
                format!("a shard's task failed: {e}"),
            ))
        });
        match ended {
            Ok(end) => self.keep.extend(end.keep),
            Err(e) => {
                if self.failure.is_none() && self.stop.is_none() {
                    warn!("stopping the command of every shard: {}", e.message);
                    let _ = self.relay.send(Received::Stop(Signal::SIGTERM));
                }
                self.failure.get_or_insert(e);
            }
        }
    }
}

/// Runs the command for one shard term, again after a pause whenever it exits by itself while
/// the term lasts, and returns (dropping the term, unless it must be kept) only once nothing
/// it started is left.
async fn shard_task(
    ctx: Arc<Ctx>,
    term: Term,
    mut relay: broadcast::Receiver<Received>,
    doomed: Arc<AtomicBool>,
) -> Result<ShardEnd, Exit> {
    let mut pause = RESTART_FIRST;
    let mut runs = 0u64;
    loop {
        if doomed.load(Ordering::Acquire) {
            // A notice: never (again) a command on this machine; the shard is handed over.
            return Ok(ShardEnd::default());
        }
        if runs == 0 {
            info!("leading the shard; starting its command");
        } else {
            info!("starting the shard's command again");
        }
        runs += 1;
        let started = Instant::now();
        let outcome = supervise(&ctx, &term, &mut Inbox::Relayed(&mut relay)).await?;
        let why = match outcome {
            Outcome::Signalled(_) | Outcome::SteppedDown(_) => return Ok(ShardEnd::default()),
            Outcome::SupervisorLost(Some(_)) => {
                warn!("the supervisor died during the stop; the shard is left to expire");
                return Ok(ShardEnd { keep: Some(term) });
            }
            // A notice's stop, during which the supervisor died: as for a stop signal.
            Outcome::SupervisorLost(None) if doomed.load(Ordering::Acquire) => {
                warn!("the supervisor died during the step-down; the shard is left to expire");
                return Ok(ShardEnd { keep: Some(term) });
            }
            _ if doomed.load(Ordering::Acquire) => return Ok(ShardEnd::default()),
            _ if !term.is_valid() => {
                info!("the shard's term is over; its command has stopped");
                return Ok(ShardEnd::default());
            }
            Outcome::Exited(code) => format!("the command exited with code {code}"),
            // The kernel killed the command, `supervise` what it had left: nothing runs.
            Outcome::SupervisorLost(None) => "the supervisor died".to_owned(),
            // The supervisor stopped it at a deadline that a late renew has moved since.
            Outcome::Lost => "the command was stopped at a deadline since extended".to_owned(),
        };
        if started.elapsed() >= RESTART_MAX {
            pause = RESTART_FIRST;
        }
        warn!(
            ?pause,
            "{why} while the shard is still led; starting it again after a pause"
        );
        let until = Instant::now() + pause;
        let mut inbox = Inbox::Relayed(&mut relay);
        loop {
            tokio::select! {
                biased;
                got = inbox.recv() => {
                    if let Received::Stop(_) | Received::StepDown(_) = got {
                        return Ok(ShardEnd::default());
                    }
                }
                () = term.cancelled() => {
                    info!("the shard's term ended while its command was not running");
                    return Ok(ShardEnd::default());
                }
                () = tokio::time::sleep_until(until) => break,
            }
        }
        pause = (pause * 2).min(RESTART_MAX);
    }
}
