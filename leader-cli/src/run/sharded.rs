//! `leader run --shards N`: lead a share of the shards of a key, one supervised command per led
//! shard.
//!
//! The instance joins the key through `leader_core::ShardedElector`, which balances the shards
//! over every instance of the key. Each shard term it hands out gets a task that runs the
//! command through its own supervisor process, by the rules of a single term
//! (`run::supervise`: not started past the deadline, the stop signal at `deadline - grace`,
//! SIGKILL at the deadline, every process it starts tracked). The task keeps the `ShardTerm`
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
use std::time::Duration;

use leader_core::backend::within;
use leader_core::{ConfigError, ErrorKind, HolderId, ShardTerm, ShardedElector, Timing};
use nix::sys::signal::Signal;
use tokio::sync::broadcast;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{Instrument, info, info_span, warn};

use crate::run::{
    Ctx, Inbox, Outcome, Received, Renewals, RunArgs, Signals, TermView, become_subreaper,
    campaign_failed, supervise,
};
use crate::store::{self, StoreUrl};
use crate::{Exit, exit};

/// What `leader run` worked out before it knew the run was sharded.
pub(crate) struct Plan {
    pub(crate) shards: u32,
    pub(crate) timing: Timing,
    pub(crate) grace: Duration,
    pub(crate) holder: Option<HolderId>,
    pub(crate) log_format: &'static str,
    /// `--metrics-addr`, if given.
    pub(crate) endpoint: Option<crate::run::Endpoint>,
}

/// The first pause before a command that exited is started again.
const RESTART_FIRST: Duration = Duration::from_secs(1);

/// The longest pause before a command that exited is started again; a run at least this long
/// resets the pause to [`RESTART_FIRST`].
const RESTART_MAX: Duration = Duration::from_secs(30);

/// How one shard's task ended.
#[derive(Debug, Default)]
struct ShardEnd {
    /// A term to hold until the instance has stopped: its supervisor died during a stop, so
    /// the shard is left to expire rather than released (DESIGN.md, "Supervising a command").
    keep: Option<ShardTerm>,
}

pub(crate) async fn run(args: &RunArgs, url: &StoreUrl, plan: Plan) -> Result<u8, Exit> {
    let config = |e: ConfigError| Exit::new(exit::CONFIG, e.to_string());
    let (store, key) = store::open(url, &args.store_options).await?;
    let mut builder =
        ShardedElector::builder(store.clone(), key.clone(), plan.shards).timing(plan.timing);
    if let Some(holder) = plan.holder {
        builder = builder.holder_id(holder);
    }
    let elector = builder.build().map_err(config)?;
    let timing = *elector.timing();
    become_subreaper()?;

    // Errors retrying cannot fix end the run now; others are retried by the elector.
    match within(
        timing.request_timeout * 2,
        leader_core::read_status(&*store, &key),
    )
    .await
    {
        Err(_) => warn!("the store did not answer yet; joining anyway (retrying)"),
        Ok(Err(e)) if e.kind() == ErrorKind::MalformedRecord => {
            warn!(error = %e, "a record of the sharded key is malformed; waiting for an operator");
        }
        Ok(Err(e)) if e.is_retryable() => warn!(error = %e, "the store is not usable yet"),
        Ok(Err(e)) => return Err(store::unavailable(&e)),
        Ok(Ok(_)) => {}
    }

    let mut signals = Signals::new()?;
    let handle = elector.spawn();
    if let Some(e) = plan.endpoint {
        let instance = crate::endpoints::Instance {
            key: key.clone(),
            holder: handle.holder_id().clone(),
            ttl: timing.ttl,
            contact: handle.store_contact(),
            source: crate::endpoints::Source::Sharded {
                assignment: handle.assignment(),
                shards: plan.shards,
            },
        };
        crate::endpoints::serve(e.listener, e.prometheus, instance);
    }
    let ctx = Arc::new(Ctx {
        command: args.command.clone(),
        store: args.store.clone(),
        log_format: plan.log_format,
        timing,
        grace: plan.grace,
        key: handle.key().clone(),
        holder: handle.holder_id().clone(),
        shards: Some(plan.shards),
    });
    info!(
        store = %args.store, holder = %ctx.holder, shards = plan.shards, ttl = ?timing.ttl,
        grace = ?plan.grace, "joining the sharded key"
    );
    // Every signal goes to every shard's run; a run started after a stop signal never is.
    let (relay, _) = broadcast::channel::<Received>(64);
    let terms = handle.terms();
    let mut tasks: JoinSet<Result<ShardEnd, Exit>> = JoinSet::new();
    let mut stop: Option<Signal> = None;
    let mut failure: Option<Exit> = None;
    let mut keep = Vec::new();
    loop {
        if (stop.is_some() || failure.is_some()) && tasks.is_empty() {
            break;
        }
        tokio::select! {
            biased;
            got = signals.recv() => {
                if let Received::Stop(sig) = got
                    && stop.is_none()
                {
                    info!(signal = %sig, running = tasks.len(), "stopping the command of every shard");
                    stop = Some(sig);
                }
                let _ = relay.send(got);
            }
            Some(joined) = tasks.join_next() => {
                let ended = joined.unwrap_or_else(|e| {
                    Err(Exit::new(exit::UNAVAILABLE, format!("a shard's task failed: {e}")))
                });
                match ended {
                    Ok(end) => keep.extend(end.keep),
                    Err(e) => {
                        if failure.is_none() && stop.is_none() {
                            warn!("stopping the command of every shard: {}", e.message);
                            let _ = relay.send(Received::Stop(Signal::SIGTERM));
                        }
                        failure.get_or_insert(e);
                    }
                }
            }
            next = terms.next(), if stop.is_none() && failure.is_none() => match next {
                Ok(term) => {
                    let span = info_span!("shard", shard = term.shard(), token = %term.token());
                    tasks.spawn(shard_task(ctx.clone(), term, relay.subscribe()).instrument(span));
                }
                // Its shard terms are over: their commands are being stopped.
                Err(stopped) => failure = Some(campaign_failed(stopped.problem())),
            },
        }
    }
    info!("every shard's command has stopped; leaving the sharded key");
    handle.shutdown().await;
    drop(keep);
    match (failure, stop) {
        (Some(e), _) => Err(e),
        (None, Some(sig)) => Ok(128 + sig as u8),
        (None, None) => Ok(exit::LOST),
    }
}

/// Runs the command for one shard term, again after a pause whenever it exits by itself while
/// the term lasts, and returns (dropping the term, unless it must be kept) only once nothing
/// it started is left.
async fn shard_task(
    ctx: Arc<Ctx>,
    term: ShardTerm,
    mut relay: broadcast::Receiver<Received>,
) -> Result<ShardEnd, Exit> {
    let mut pause = RESTART_FIRST;
    let mut runs = 0u64;
    loop {
        if runs == 0 {
            info!("leading the shard; starting its command");
        } else {
            info!("starting the shard's command again");
        }
        runs += 1;
        let started = Instant::now();
        let outcome = supervise(
            &ctx,
            TermView::Shard(&term),
            Renewals::Polled { sent: None },
            &mut Inbox::Relayed(&mut relay),
        )
        .await?;
        let why = match outcome {
            Outcome::Signalled(_) => return Ok(ShardEnd::default()),
            Outcome::SupervisorLost(Some(_)) => {
                warn!("the supervisor died during the stop; the shard is left to expire");
                return Ok(ShardEnd { keep: Some(term) });
            }
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
                    if let Received::Stop(_) = got {
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
