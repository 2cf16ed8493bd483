//! `leader run`: campaign, run the command while leader, stop it when leadership ends.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use clap::Args;
use leader_core::{Elector, ElectorHandle, HolderId, Leadership, Metadata, Term};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::watchdog::{deadline_path, exit_code, monotonic_ns, stop_path};
use crate::{Exit, exit, store};

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// Where the lease lives: file:///dir/KEY, azblob://CONTAINER/BLOB, dynamodb://TABLE/KEY,
    /// gs://BUCKET/OBJECT.
    #[arg(long, env = "LEADER_STORE")]
    store: String,
    #[command(flatten)]
    store_options: store::StoreOptions,
    /// Lease duration.
    #[arg(long, env = "LEADER_TTL", value_parser = crate::parse_duration, default_value = "15s")]
    ttl: Duration,
    /// How often the leader renews (default ttl/3).
    #[arg(long, env = "LEADER_RENEW_EVERY", value_parser = crate::parse_duration)]
    renew_every: Option<Duration>,
    /// How often a follower polls (default ttl/5).
    #[arg(long, env = "LEADER_RETRY_EVERY", value_parser = crate::parse_duration)]
    retry_every: Option<Duration>,
    /// This instance's id (default: hostname-pid-random).
    #[arg(long = "id", env = "LEADER_ID")]
    id: Option<String>,
    /// Metadata followers can read, KEY=VALUE (repeatable; comma-separated in LEADER_META).
    #[arg(long = "meta", env = "LEADER_META", value_delimiter = ',')]
    meta: Vec<String>,
    /// Time between SIGTERM and SIGKILL when the command must stop (default margin/2; must
    /// end before another instance can take over).
    #[arg(long, env = "LEADER_GRACE", value_parser = crate::parse_duration)]
    grace: Option<Duration>,
    /// Give up (exit 73) if not leader within this time.
    #[arg(long, env = "LEADER_WAIT", value_parser = crate::parse_duration)]
    wait: Option<Duration>,
    /// Keep campaigning after the command exits or leadership is lost, and run it again when
    /// leader again.
    #[arg(long, env = "LEADER_SUPERVISE")]
    supervise: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

enum Outcome {
    Exited(u8),
    Lost,
    Signalled(i32),
}

struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

impl Signals {
    fn new() -> Result<Self, Exit> {
        let make = |k: SignalKind| {
            signal(k).map_err(|e| Exit::new(exit::UNAVAILABLE, format!("signal handler: {e}")))
        };
        Ok(Self {
            term: make(SignalKind::terminate())?,
            int: make(SignalKind::interrupt())?,
            hup: make(SignalKind::hangup())?,
        })
    }

    /// The next signal's number.
    async fn recv(&mut self) -> i32 {
        tokio::select! {
            biased;
            _ = self.term.recv() => 15,
            _ = self.int.recv() => 2,
            _ = self.hup.recv() => 1,
        }
    }
}

fn metadata(pairs: &[String]) -> Result<Metadata, Exit> {
    let mut m = Metadata::new();
    for p in pairs.iter().filter(|p| !p.is_empty()) {
        let Some((k, v)) = p.split_once('=') else {
            return Err(Exit::new(
                exit::CONFIG,
                format!("--meta {p:?}: expected KEY=VALUE"),
            ));
        };
        m.insert(k.to_owned(), v.to_owned());
    }
    Ok(m)
}

pub(crate) async fn run(args: RunArgs) -> Result<u8, Exit> {
    let url = store::parse(&args.store)?;
    let config = |e: leader_core::ConfigError| Exit::new(exit::CONFIG, e.to_string());
    let planned =
        leader_core::Timing::resolve(args.ttl, args.renew_every, args.retry_every, None, None);
    let (backend, key) = store::open(&url, &args.store_options, planned.request_timeout).await?;
    let mut builder = Elector::builder(backend.clone(), key.clone())
        .ttl(args.ttl)
        .metadata(metadata(&args.meta)?);
    if let Some(d) = args.renew_every {
        builder = builder.renew_every(d);
    }
    if let Some(d) = args.retry_every {
        builder = builder.retry_every(d);
    }
    if let Some(id) = &args.id {
        builder = builder.holder_id(HolderId::new(id.clone()).map_err(config)?);
    }
    let timing = builder.resolved_timing();
    let grace = args.grace.unwrap_or(timing.margin / 2);
    // The command gets SIGTERM at the deadline and SIGKILL `grace` later; the earliest takeover
    // is a full ttl after the last write, `margin` after the deadline.
    let watchdog_slack = Duration::from_millis(100);
    if grace + watchdog_slack >= timing.margin {
        return Err(Exit::new(
            exit::CONFIG,
            format!(
                "--grace {grace:?} must be below margin {:?} minus {watchdog_slack:?}, so that the command is dead before another instance can take over; lower --grace or raise --ttl",
                timing.margin
            ),
        ));
    }
    let elector = builder.build().map_err(config)?;

    // Fail fast on a store we cannot use at all.
    match tokio::time::timeout(timing.request_timeout * 2, backend.read(&key)).await {
        Err(_) => {
            return Err(Exit::new(
                exit::UNAVAILABLE,
                format!(
                    "the store did not answer within {:?}",
                    timing.request_timeout * 2
                ),
            ));
        }
        Ok(Err(e)) if e.kind() != leader_core::ErrorKind::MalformedRecord => {
            return Err(store::unavailable(&e));
        }
        Ok(Err(e)) => warn!(error = %e, "the lease record is malformed; waiting for an operator"),
        Ok(Ok(_)) => {}
    }

    let mut signals = Signals::new()?;
    let handle = elector.spawn();
    let holder = handle.holder_id().clone();
    info!(store = %args.store, holder = %holder, ttl = ?timing.ttl, "campaigning");
    let wait_until = args.wait.map(|w| Instant::now() + w);
    loop {
        let term = tokio::select! {
            biased;
            sig = signals.recv() => {
                info!(signal = sig, "signal while waiting for the lease; stopping");
                handle.shutdown().await;
                return Ok(128 + sig as u8);
            }
            _ = sleep_until_opt(wait_until) => {
                handle.shutdown().await;
                return Err(Exit::new(exit::NOT_LEADER_IN_TIME, "not leader within --wait"));
            }
            t = handle.wait_for_term() => match t {
                Ok(t) => t,
                Err(_) => return Err(Exit::new(exit::UNAVAILABLE, "the elector stopped")),
            },
        };
        info!(token = %term.token(), "became leader; starting the command");
        let outcome = supervise(&args, &handle, &term, grace, &mut signals).await?;
        drop(term);
        match outcome {
            Outcome::Exited(code) => {
                info!(code, "the command exited; releasing the lease");
                if args.supervise {
                    let _ = handle.resign().await;
                    continue;
                }
                handle.shutdown().await;
                return Ok(code);
            }
            Outcome::Lost => {
                warn!("leadership lost; the command was stopped");
                if args.supervise {
                    continue;
                }
                handle.shutdown().await;
                return Ok(exit::LOST);
            }
            Outcome::Signalled(sig) => {
                handle.shutdown().await;
                return Ok(128 + sig as u8);
            }
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Writes the term's deadline for the watchdog, on the host's monotonic clock.
fn write_deadline(control: &Path, deadline: Instant) -> std::io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    let at = monotonic_ns() + left.as_nanos();
    replace_file(&deadline_path(control), &at.to_string())
}

fn request_stop(control: &Path, sig: i32) {
    let _ = replace_file(&stop_path(control), &sig.to_string());
}

/// Replaces `path` with `contents` at once (write beside it, then rename), so that the
/// watchdog never reads a half-written control file.
fn replace_file(path: &Path, contents: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, contents)?;
    std::fs::rename(tmp, path)
}

async fn supervise(
    args: &RunArgs,
    handle: &ElectorHandle,
    term: &Term,
    grace: Duration,
    signals: &mut Signals,
) -> Result<Outcome, Exit> {
    let io =
        |e: std::io::Error| Exit::new(exit::UNAVAILABLE, format!("cannot start the command: {e}"));
    let control = tempfile::Builder::new()
        .prefix("leader-")
        .tempdir()
        .map_err(io)?;
    write_deadline(control.path(), term.deadline()).map_err(io)?;
    let exe = std::env::current_exe().map_err(io)?;
    let mut child = tokio::process::Command::new(exe)
        .arg("__watchdog")
        .arg("--control")
        .arg(control.path())
        .arg("--grace")
        .arg(format!("{}ms", grace.as_millis()))
        .arg("--")
        .args(&args.command)
        .env("LEADER_FENCING_TOKEN", term.token().to_string())
        .env("LEADER_STORE", &args.store)
        .env("LEADER_HOLDER_ID", handle.holder_id().as_str())
        .env("LEADER_TTL_MS", args.ttl.as_millis().to_string())
        .stdin(Stdio::inherit())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .kill_on_drop(false)
        .spawn()
        .map_err(io)?;
    let mut leadership = handle.leadership();
    let mut stopping: Option<Outcome> = None;
    loop {
        tokio::select! {
            biased;
            status = child.wait() => {
                let code = status.map(exit_code).unwrap_or(1);
                if stopping.is_none() && !term.is_valid() {
                    // The watchdog stopped the command at the deadline (this process may have
                    // been frozen past it): leadership was lost, whatever the command's code.
                    return Ok(Outcome::Lost);
                }
                return Ok(stopping.unwrap_or(Outcome::Exited(code)));
            }
            sig = signals.recv(), if stopping.is_none() => {
                info!(signal = sig, "forwarding the signal to the command's process group");
                request_stop(control.path(), sig);
                stopping = Some(Outcome::Signalled(sig));
            }
            _ = term.cancelled(), if stopping.is_none() => {
                request_stop(control.path(), 15);
                stopping = Some(Outcome::Lost);
            }
            changed = leadership.changed(), if stopping.is_none() => {
                if changed.is_err() {
                    request_stop(control.path(), 15);
                    stopping = Some(Outcome::Lost);
                    continue;
                }
                let deadline = match &*leadership.borrow_and_update() {
                    Leadership::Leader { token, deadline } if *token == term.token() => Some(*deadline),
                    _ => None,
                };
                if let Some(Err(e)) = deadline.map(|d| write_deadline(control.path(), d)) {
                    warn!(error = %e, "cannot extend the command's deadline; it will be stopped");
                }
            }
        }
    }
}
