//! `leader run` on one lease: campaign, run the command in each term this instance wins (one
//! term with `--supervise`'s loop, or just one), and release when it is done.

use leader::quorum::Quorum;
use leader::{Elector, ElectorHandle, Leadership, LeaseKey, Term};
use nix::sys::signal::Signal;
use tokio::time::Instant;
use tracing::{info, warn};

use super::{Plan, RunArgs, campaign_failed, config_error, first_read};
use crate::lifecycle::{self, Lifecycle};
use crate::signals::{Inbox, Received, Signals, StepDown};
use crate::store::{self, StoreUrl};
use crate::supervise::client::{Ctx, Outcome, become_subreaper, supervise};
use crate::{Exit, endpoints, exit};

/// Where `leader run` campaigns: one store, or a majority of several.
pub(crate) enum Source {
    One(StoreUrl),
    Quorum(Quorum, LeaseKey),
}

/// Opens the store (or takes the quorum) and builds the elector; the first read of one
/// store.
async fn elector(args: &RunArgs, source: Source, plan: &Plan) -> Result<(Elector, LeaseKey), Exit> {
    let (builder, key, backend) = match source {
        Source::One(url) => {
            let (backend, key) = store::open(&url, &args.store_options).await?;
            let builder = Elector::builder(backend.clone(), key.clone());
            (builder, key, Some(backend))
        }
        Source::Quorum(quorum, key) => (Elector::quorum_builder(quorum, key.clone()), key, None),
    };
    let mut builder = builder.timing(plan.timing).metadata(plan.metadata.clone());
    if let Some(holder) = plan.holder.clone() {
        builder = builder.holder_id(holder);
    }
    let elector = builder.build().map_err(config_error)?;
    if let Some(backend) = backend {
        first_read(
            elector.timing(),
            ("campaigning", "the lease record"),
            backend.read(&key),
        )
        .await?;
    }
    Ok((elector, key))
}

pub(super) async fn run(args: &RunArgs, source: Source, plan: Plan) -> Result<u8, Exit> {
    let (elector, key) = elector(args, source, &plan).await?;
    let timing = *elector.timing();
    become_subreaper()?;

    let mut signals = Signals::new()?.step_down_on(args.lifecycle.step_down_on);
    let mut lifecycle = Lifecycle::start(&args.lifecycle, &mut signals).await?;
    if lifecycle.doomed() {
        // This machine's notice was out before campaigning (a restart on it): the elector
        // never starts, so the lease is not taken even for a moment.
        info!("a notice for this machine is already out: not campaigning");
        let code = lifecycle.stand_down(&mut signals).await;
        lifecycle.finish().await;
        return Ok(code);
    }
    let handle = elector.spawn();
    lifecycle.protect(lifecycle::leading(&handle));
    let holder = handle.holder_id().clone();
    if let Some(e) = plan.endpoint {
        let instance = endpoints::Instance {
            key: key.clone(),
            holder: holder.clone(),
            ttl: timing.ttl,
            contact: handle.store_contact(),
            source: endpoints::Source::Single {
                leadership: handle.leadership(),
                metadata: plan.metadata,
            },
        };
        endpoints::serve(e.listener, e.prometheus, instance);
    }
    plan.isolation_note.say();
    info!(store = %args.store_text(), holder = %holder, ttl = ?timing.ttl, grace = ?plan.grace, "campaigning");
    let wait_until = match args.wait {
        Some(w) => Some(
            Instant::now()
                .checked_add(w)
                .ok_or_else(|| Exit::new(exit::CONFIG, format!("--wait {w:?} is too long")))?,
        ),
        None => None,
    };
    let ctx = Ctx {
        command: args.command.clone(),
        store: args.store_text(),
        log_format: plan.log_format,
        timing,
        grace: plan.grace,
        key: handle.key().clone(),
        holder,
        shards: None,
        isolation: plan.isolation,
        require_isolation: plan.require_isolation,
    };
    let code = campaign(args, handle, &ctx, &mut signals, &lifecycle, wait_until).await;
    lifecycle.finish().await;
    code
}

/// Campaigns and runs the command in each term won, until the run ends.
async fn campaign(
    args: &RunArgs,
    mut handle: ElectorHandle,
    ctx: &Ctx,
    signals: &mut Signals,
    lifecycle: &Lifecycle,
    mut wait_until: Option<Instant>,
) -> Result<u8, Exit> {
    loop {
        let term = match next_term(&handle, signals, wait_until).await {
            // --wait is about the first term: a step-down or --supervise follows without it.
            Waited::Term(term) => {
                wait_until = None;
                term
            }
            Waited::Stop(sig) => {
                info!(signal = %sig, "signal while waiting for the lease; stopping");
                handle.shutdown().await;
                return Ok(128 + sig as u8);
            }
            Waited::Doomed => return Ok(doomed(handle, None, signals, lifecycle).await),
            Waited::TooLong(problem) => {
                handle.shutdown().await;
                return Err(Exit::new(
                    exit::NOT_LEADER_IN_TIME,
                    format!("not leader within --wait{problem}"),
                ));
            }
            Waited::Failed(e) => return Err(e),
        };
        if lifecycle.doomed() {
            // The notice came as the term began: the command is not started at all.
            drop(term);
            return Ok(doomed(handle, None, signals, lifecycle).await);
        }
        info!(token = %term.token(), "became leader; starting the command");
        let outcome = supervise(ctx, &term, &mut Inbox::Signals(signals)).await?;
        // A stop signal wins over the notice (exit 128+N at once, as without notices).
        let stopped = matches!(
            outcome,
            Outcome::Signalled(_) | Outcome::SupervisorLost(Some(_))
        );
        if lifecycle.doomed() && !stopped {
            // With the supervisor gone, the lease is left to expire (`docs/protocol.md`):
            // the term is held through the shutdown, which then does not release it.
            let held = matches!(outcome, Outcome::SupervisorLost(_)).then_some(term);
            return Ok(doomed(handle, held, signals, lifecycle).await);
        }
        if let Outcome::SteppedDown(StepDown::Asked(sig)) = outcome {
            drop(term);
            info!(signal = %sig, "the command has stopped; handing the lease over and following");
            if handle.resign().await.is_err() {
                return Err(Exit::new(exit::UNAVAILABLE, "the elector stopped"));
            }
            continue;
        }
        handle = match after_term(handle, term, outcome, args.supervise).await {
            Ok(handle) => handle,
            Err(code) => return Ok(code),
        };
    }
}

/// A notice came: the command has stopped (if this instance led); releases the lease, never
/// campaigns again, lets the platform go ahead, and waits for the stop signal.
async fn doomed(
    handle: ElectorHandle,
    held: Option<Term>,
    signals: &mut Signals,
    lifecycle: &Lifecycle,
) -> u8 {
    handle.shutdown().await;
    match held {
        Some(term) => {
            drop(term);
            warn!("the supervisor died; the lease is left to expire");
        }
        None => info!("handed over (the lease is released) after the notice"),
    }
    lifecycle.stand_down(signals).await
}

/// How waiting for a term ended.
enum Waited {
    Term(Term),
    /// A stop signal came first.
    Stop(Signal),
    /// A notice for this instance came first.
    Doomed,
    /// `--wait` ran out; the last store error, if any, as a suffix for the message.
    TooLong(String),
    /// The campaign ended on an error that retrying cannot fix.
    Failed(Exit),
}

/// Waits for the next term, a stop signal, or the end of `--wait`.
async fn next_term(
    handle: &ElectorHandle,
    signals: &mut Signals,
    wait_until: Option<Instant>,
) -> Waited {
    loop {
        return tokio::select! {
            biased;
            got = signals.recv() => match got {
                Received::Stop(sig) => Waited::Stop(sig),
                Received::StepDown(StepDown::Notice) => Waited::Doomed,
                Received::StepDown(StepDown::Asked(sig)) => {
                    info!(signal = %sig, "asked to step down, but not leading");
                    continue;
                }
                Received::Forward(_) => continue,
            },
            _ = sleep_until_opt(wait_until) => Waited::TooLong(match handle.current() {
                Leadership::Unknown { problem: Some(p) } => {
                    format!(" (last store error: {})", p.message)
                }
                _ => String::new(),
            }),
            t = handle.wait_for_term() => match t {
                Ok(t) => Waited::Term(t),
                Err(stopped) => Waited::Failed(campaign_failed(stopped.problem())),
            },
        };
    }
}

/// Ends a term whose command has stopped: the handle back to campaign again
/// (`--supervise`), else the exit code, after a shutdown.
async fn after_term(
    handle: ElectorHandle,
    term: Term,
    outcome: Outcome,
    supervised: bool,
) -> Result<ElectorHandle, u8> {
    if let Outcome::SupervisorLost(signalled) = outcome {
        // With the supervisor gone, the lease is left to expire (`docs/protocol.md`). Holding
        // the term through the step-down keeps the elector from releasing it (it stops
        // renewing and waits for the term's work until the deadline).
        warn!("the supervisor died; the lease is left to expire");
        if supervised && signalled.is_none() {
            let _ = handle.resign().await;
            drop(term);
            return Ok(handle);
        }
        handle.shutdown().await;
        drop(term);
        return Err(signalled.map_or(exit::LOST, |sig| 128 + sig as u8));
    }
    drop(term);
    let code = match outcome {
        Outcome::Exited(code) => {
            info!(code, "the command exited; releasing the lease");
            code
        }
        Outcome::Lost => {
            warn!("leadership lost; the command was stopped");
            exit::LOST
        }
        Outcome::Signalled(sig) => {
            info!("the command and everything it started are gone; releasing the lease");
            handle.shutdown().await;
            return Err(128 + sig as u8);
        }
        Outcome::SupervisorLost(_) => return Err(exit::LOST),
        // Handled by the caller (a notice, or `--step-down-on`).
        Outcome::SteppedDown(_) => exit::LOST,
    };
    if supervised {
        // Everything is gone; do not reuse what may be left of the term.
        let _ = handle.resign().await;
        return Ok(handle);
    }
    handle.shutdown().await;
    Err(code)
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
