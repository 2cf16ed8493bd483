//! `leader run`: campaign, run the command while leader, stop it when leadership ends.
//!
//! This process (the *elector*) keeps the lease; a separate supervisor process
//! (`supervisor.rs`) starts the command and stops it. See `supervisor.rs` for why the two are
//! separate and how each way of stopping `leader` is handled.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use clap::Args;
use leader_core::backend::within;
use leader_core::{
    ConfigError, Elector, ErrorKind, FencingToken, HolderId, Leadership, LeaseKey, MAX_SHARDS,
    Metadata, ShardTerm, Term, Timing, TimingOverrides,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use tokio::signal::unix::{Signal as UnixSignal, SignalKind, signal};
use tokio::sync::{broadcast, oneshot, watch};
use tokio::time::Instant;
use tracing::{error, info, warn};

use crate::process_tree::{boottime_ns, descendants_outside};
use crate::supervisor::{Ended, Report, Request};
use crate::{Exit, endpoints, exit, store};

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// Where the lease lives: file:///dir/KEY, azblob://CONTAINER/BLOB, dynamodb://TABLE/KEY,
    /// gs://BUCKET/OBJECT, etcd://HOST:PORT/[FOLDER/]KEY, zk://HOST:PORT/[PATH/]KEY.
    #[arg(long, env = "LEADER_STORE")]
    pub(crate) store: String,
    #[command(flatten)]
    pub(crate) store_options: store::StoreOptions,
    /// Lease duration.
    #[arg(long, env = "LEADER_TTL", value_parser = crate::parse_duration, default_value = "15s")]
    ttl: Duration,
    /// How often the leader renews (default: ttl/2, or less where that leaves room for fewer
    /// than three failed renews before the deadline, or for less than --grace).
    #[arg(long, env = "LEADER_RENEW_EVERY", value_parser = crate::parse_duration)]
    renew_every: Option<Duration>,
    /// How long a follower waits at most between attempts while the store fails (default
    /// ttl/5).
    #[arg(long, env = "LEADER_RETRY_EVERY", value_parser = crate::parse_duration)]
    retry_every: Option<Duration>,
    /// How often a follower reads the lease while the store answers: a graceful handover
    /// takes up to one poll (default 500ms, at most ttl/5).
    #[arg(long, env = "LEADER_POLL_EVERY", value_parser = crate::parse_duration)]
    poll_every: Option<Duration>,
    /// This instance's id (default: hostname-pid-random).
    #[arg(long = "id", env = "LEADER_ID")]
    id: Option<String>,
    /// Metadata followers can read, KEY=VALUE (repeatable; comma-separated in LEADER_META).
    #[arg(long = "meta", env = "LEADER_META", value_delimiter = ',')]
    meta: Vec<String>,
    /// Time between the stop signal and SIGKILL. At the end of a term the command gets SIGTERM
    /// at deadline - grace and SIGKILL at the deadline. Default: half the room a healthy term
    /// leaves (ttl - margin - renew_every - request_timeout - 50ms), at most 10s.
    #[arg(long, env = "LEADER_GRACE", value_parser = crate::parse_duration)]
    grace: Option<Duration>,
    /// Give up (exit 73) if not leader within this time.
    #[arg(long, env = "LEADER_WAIT", value_parser = crate::parse_duration)]
    wait: Option<Duration>,
    /// Keep campaigning after the command exits or leadership is lost, and run it again when
    /// leader again. (Implied by --shards.)
    #[arg(long, env = "LEADER_SUPERVISE")]
    supervise: bool,
    /// Lead a share of the N shards of the key, with the other instances of the same key and
    /// N: one command per led shard, with LEADER_SHARD and the shard's LEADER_FENCING_TOKEN
    /// (see "Sharded runs" below). Every instance must give the same N.
    /// (No environment variable: LEADER_SHARDS is what the command gets.)
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_SHARDS)))]
    pub(crate) shards: Option<u32>,
    /// Serve Prometheus metrics at /metrics, and /healthz, /readyz and /leader, on HOST:PORT
    /// (an IP address; 0.0.0.0 for every interface), or on a port alone (9464) of the
    /// loopback address. Port 0 picks a free port (logged as metrics_addr=).
    #[arg(long, env = "LEADER_METRICS_ADDR", value_name = "HOST:PORT",
          value_parser = crate::endpoints::parse_addr)]
    pub(crate) metrics_addr: Option<SocketAddr>,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub(crate) command: Vec<String>,
}

/// What the supervisor needs beyond the grace period: for this process to pass a renewed
/// deadline on, and for the supervisor to wake up and signal.
pub(crate) const SUPERVISOR_SLACK: Duration = Duration::from_millis(50);

/// A stop signal this long after the first kills the command at once.
const REPEAT_TO_KILL: Duration = Duration::from_secs(1);

/// What a `--grace` given without `--renew-every` leaves between a healthy renew's answer and
/// the command's signal, beyond [`SUPERVISOR_SLACK`].
const GRACE_ROOM_SPARE: Duration = Duration::from_millis(50);

/// The longest default grace period.
const MAX_DEFAULT_GRACE: Duration = Duration::from_secs(10);

/// The room a healthy term leaves before its deadline: a renew is sent `renew_every` after
/// the last one, answers within `request_timeout`, and must reach the supervisor before the
/// command is signalled at `deadline - grace`.
fn grace_room(t: &Timing) -> Duration {
    t.ttl
        .saturating_sub(t.margin + t.renew_every + t.request_timeout + SUPERVISOR_SLACK)
}

fn check_grace(grace: Option<Duration>, t: &Timing) -> Result<Duration, Exit> {
    let room = grace_room(t);
    if room.is_zero() {
        return Err(Exit::new(
            exit::CONFIG,
            format!(
                "no room for a grace period: ttl {:?} - margin {:?} - renew_every {:?} - request_timeout {:?} - {SUPERVISOR_SLACK:?} is not positive; raise --ttl or lower --renew-every",
                t.ttl, t.margin, t.renew_every, t.request_timeout
            ),
        ));
    }
    let grace = grace.unwrap_or_else(|| (room / 2).min(MAX_DEFAULT_GRACE));
    if grace >= room {
        return Err(Exit::new(
            exit::CONFIG,
            format!(
                "--grace {grace:?} is too long for this timing: the command would be signalled even while renewals succeed. It must be below ttl - margin - renew_every - request_timeout - {SUPERVISOR_SLACK:?} = {room:?}; lower --grace or raise --ttl"
            ),
        ));
    }
    Ok(grace)
}

/// How a supervised run of the command ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The command exited by itself with this code.
    Exited(u8),
    /// The term ended (deadline, lost lease, or the supervisor was lost); the command was
    /// stopped.
    Lost,
    /// `leader` was asked to stop by this signal; the command was stopped.
    Signalled(Signal),
    /// The supervisor died (after a stop signal, if `Some`); the kernel killed the command and
    /// this process what it had started. The lease is left to expire (DESIGN.md).
    SupervisorLost(Option<Signal>),
}

/// What `leader` does with the signals it receives.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Received {
    /// Stop the command (second time: kill it), release, exit 128+N.
    Stop(Signal),
    /// Pass on to the command.
    Forward(Signal),
}

pub(crate) struct Signals {
    term: UnixSignal,
    int: UnixSignal,
    hup: UnixSignal,
    quit: UnixSignal,
    usr1: UnixSignal,
    usr2: UnixSignal,
}

impl Signals {
    pub(crate) fn new() -> Result<Self, Exit> {
        let make = |s: Signal| {
            signal(SignalKind::from_raw(s as i32))
                .map_err(|e| Exit::new(exit::UNAVAILABLE, format!("signal handler for {s}: {e}")))
        };
        Ok(Self {
            term: make(Signal::SIGTERM)?,
            int: make(Signal::SIGINT)?,
            hup: make(Signal::SIGHUP)?,
            quit: make(Signal::SIGQUIT)?,
            usr1: make(Signal::SIGUSR1)?,
            usr2: make(Signal::SIGUSR2)?,
        })
    }

    /// The next signal.
    pub(crate) async fn recv(&mut self) -> Received {
        tokio::select! {
            biased;
            _ = self.term.recv() => Received::Stop(Signal::SIGTERM),
            _ = self.int.recv() => Received::Stop(Signal::SIGINT),
            _ = self.hup.recv() => Received::Stop(Signal::SIGHUP),
            _ = self.quit.recv() => Received::Stop(Signal::SIGQUIT),
            _ = self.usr1.recv() => Received::Forward(Signal::SIGUSR1),
            _ = self.usr2.recv() => Received::Forward(Signal::SIGUSR2),
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

/// Where a supervised run gets `leader`'s signals: from the signal handlers (a single key),
/// or relayed by the task that reads them (one run per shard).
pub(crate) enum Inbox<'a> {
    Signals(&'a mut Signals),
    Relayed(&'a mut broadcast::Receiver<Received>),
}

impl Inbox<'_> {
    /// The next signal.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub(crate) async fn recv(&mut self) -> Received {
        match self {
            Inbox::Signals(s) => s.recv().await,
            Inbox::Relayed(rx) => loop {
                match rx.recv().await {
                    Ok(r) => return r,
                    // Signals are few and every run reads them at once; should some be lost,
                    // the next one still arrives.
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
                }
            },
        }
    }
}

/// The exit for a campaign that ended on an error retrying cannot fix.
pub(crate) fn campaign_failed(problem: Option<&leader_core::Problem>) -> Exit {
    match problem {
        Some(p) => {
            let code = match p.kind {
                ErrorKind::InvalidConfig => exit::CONFIG,
                _ => exit::UNAVAILABLE,
            };
            Exit::new(code, format!("giving up: {}", p.message))
        }
        None => Exit::new(exit::UNAVAILABLE, "the elector stopped"),
    }
}

/// The flags a sharded run cannot honour, as a usage error.
fn check_sharded_flags(args: &RunArgs) -> Result<(), Exit> {
    let refuse = |flag: &str, why: &str| {
        Err(Exit::new(
            exit::USAGE,
            format!("{flag} cannot be used with --shards: {why}"),
        ))
    };
    if args.wait.is_some() {
        return refuse(
            "--wait",
            "an instance that leads no shard is a standby, not a failure",
        );
    }
    if args.meta.iter().any(|m| !m.is_empty()) {
        return refuse(
            "--meta",
            "a member's record carries its claimed shards, not metadata",
        );
    }
    Ok(())
}

pub(crate) async fn run(args: RunArgs, log_format: &'static str) -> Result<u8, Exit> {
    if args.shards.is_some() {
        check_sharded_flags(&args)?;
    }
    let url = store::parse(&args.store)?;
    let config = |e: ConfigError| Exit::new(exit::CONFIG, e.to_string());
    // The timing rules first, so that a bad --ttl is reported as such.
    let mut set = TimingOverrides::default();
    set.renew_every = args.renew_every;
    set.retry_every = args.retry_every;
    set.poll_every = args.poll_every;
    let mut planned = Timing::resolve(args.ttl, &set);
    if let (Some(grace), None) = (args.grace, args.renew_every) {
        // Renew often enough that a healthy renew reaches the supervisor before the command
        // is signalled at deadline - grace, if the default would not.
        let room = planned.renew_every + grace_room(&planned);
        let fits = room.saturating_sub(grace + GRACE_ROOM_SPARE);
        if fits < planned.renew_every && fits >= planned.ttl / 10 {
            planned.renew_every = fits;
        }
    }
    planned.validate().map_err(config)?;
    let grace = check_grace(args.grace, &planned)?;
    let meta = metadata(&args.meta)?;
    let holder = args
        .id
        .clone()
        .map(HolderId::new)
        .transpose()
        .map_err(config)?;
    // Before the elector is built (its metrics register then) and before campaigning (a
    // taken port ends the run before it leads).
    let endpoint = match args.metrics_addr {
        Some(addr) => Some(Endpoint {
            listener: endpoints::bind(addr).await?,
            prometheus: endpoints::install_recorder()?,
        }),
        None => None,
    };
    if let Some(shards) = args.shards {
        let plan = crate::sharded::Plan {
            shards,
            timing: planned,
            grace,
            holder,
            log_format,
            endpoint,
        };
        return crate::sharded::run(&args, &url, plan).await;
    }
    let (backend, key) = store::open(&url, &args.store_options).await?;
    let mut builder = Elector::builder(backend.clone(), key.clone())
        .timing(planned)
        .metadata(meta.clone());
    if let Some(holder) = holder {
        builder = builder.holder_id(holder);
    }
    let elector = builder.build().map_err(config)?;
    let timing = *elector.timing();

    become_subreaper()?;

    // Errors retrying cannot fix end the run now; others are retried by the elector.
    match within(timing.request_timeout * 2, backend.read(&key)).await {
        Err(_) => warn!("the store did not answer yet; campaigning anyway (retrying)"),
        Ok(Err(e)) if e.kind() == ErrorKind::MalformedRecord => {
            warn!(error = %e, "the lease record is malformed; waiting for an operator");
        }
        Ok(Err(e)) if e.is_retryable() => warn!(error = %e, "the store is not usable yet"),
        Ok(Err(e)) => return Err(store::unavailable(&e)),
        Ok(Ok(_)) => {}
    }

    let mut signals = Signals::new()?;
    let handle = elector.spawn();
    let holder = handle.holder_id().clone();
    if let Some(e) = endpoint {
        let instance = endpoints::Instance {
            key: key.clone(),
            holder: holder.clone(),
            ttl: timing.ttl,
            contact: handle.store_contact(),
            source: endpoints::Source::Single {
                leadership: handle.leadership(),
                metadata: meta,
            },
        };
        endpoints::serve(e.listener, e.prometheus, instance);
    }
    info!(store = %args.store, holder = %holder, ttl = ?timing.ttl, ?grace, "campaigning");
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
        store: args.store.clone(),
        log_format,
        timing,
        grace,
        key: handle.key().clone(),
        holder: holder.clone(),
        shards: None,
    };
    loop {
        let term = tokio::select! {
            biased;
            got = signals.recv() => match got {
                Received::Stop(sig) => {
                    info!(signal = %sig, "signal while waiting for the lease; stopping");
                    handle.shutdown().await;
                    return Ok(128 + sig as u8);
                }
                Received::Forward(_) => continue,
            },
            _ = sleep_until_opt(wait_until) => {
                let problem = match handle.current() {
                    Leadership::Unknown { problem: Some(p) } => format!(" (last store error: {})", p.message),
                    _ => String::new(),
                };
                handle.shutdown().await;
                return Err(Exit::new(exit::NOT_LEADER_IN_TIME, format!("not leader within --wait{problem}")));
            }
            t = handle.wait_for_term() => match t {
                Ok(t) => t,
                Err(stopped) => return Err(campaign_failed(stopped.problem())),
            },
        };
        info!(token = %term.token(), "became leader; starting the command");
        let outcome = supervise(
            &ctx,
            TermView::Lease(&term),
            Renewals::Published(handle.leadership()),
            &mut Inbox::Signals(&mut signals),
        )
        .await?;
        if let Outcome::SupervisorLost(signalled) = outcome {
            // DESIGN.md: with the supervisor gone, the lease is left to expire. Holding the
            // term through the step-down keeps the elector from releasing it (it stops
            // renewing and waits for the term's work until the deadline).
            warn!("the supervisor died; the lease is left to expire");
            if args.supervise && signalled.is_none() {
                let _ = handle.resign().await;
                drop(term);
                continue;
            }
            handle.shutdown().await;
            drop(term);
            return Ok(signalled.map_or(exit::LOST, |sig| 128 + sig as u8));
        }
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
                    // Everything is gone; do not reuse what may be left of the term.
                    let _ = handle.resign().await;
                    continue;
                }
                handle.shutdown().await;
                return Ok(exit::LOST);
            }
            Outcome::Signalled(sig) => {
                info!("the command and everything it started are gone; releasing the lease");
                handle.shutdown().await;
                return Ok(128 + sig as u8);
            }
            Outcome::SupervisorLost(_) => return Ok(exit::LOST),
        }
    }
}

/// `--metrics-addr`, bound, with the recorder installed.
pub(crate) struct Endpoint {
    pub(crate) listener: tokio::net::TcpListener,
    pub(crate) prometheus: metrics_exporter_prometheus::PrometheusHandle,
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Whatever a supervisor leaves behind if it is killed is re-parented to this process, which
/// kills it (see `kill_leftovers`).
pub(crate) fn become_subreaper() -> Result<(), Exit> {
    nix::sys::prctl::set_child_subreaper(true).map_err(|e| {
        Exit::new(
            exit::UNAVAILABLE,
            format!("cannot become a child subreaper: {e}"),
        )
    })
}

/// What every supervised run of the command shares.
pub(crate) struct Ctx {
    pub(crate) command: Vec<String>,
    pub(crate) store: String,
    pub(crate) log_format: &'static str,
    pub(crate) timing: Timing,
    pub(crate) grace: Duration,
    pub(crate) key: LeaseKey,
    pub(crate) holder: HolderId,
    /// The number of shards, in a sharded run.
    pub(crate) shards: Option<u32>,
}

/// The term one run of the command belongs to: the lease's, or one shard's.
#[derive(Clone, Copy, Debug)]
pub(crate) enum TermView<'a> {
    Lease(&'a Term),
    Shard(&'a ShardTerm),
}

impl TermView<'_> {
    fn token(self) -> FencingToken {
        match self {
            TermView::Lease(t) => t.token(),
            TermView::Shard(t) => t.token(),
        }
    }

    fn deadline(self) -> Instant {
        match self {
            TermView::Lease(t) => t.deadline(),
            TermView::Shard(t) => t.deadline(),
        }
    }

    async fn cancelled(self) {
        match self {
            TermView::Lease(t) => t.cancelled().await,
            TermView::Shard(t) => t.cancelled().await,
        }
    }
}

/// A shard term's deadline is read this long before the command would be signalled, and
/// then every [`RENEW_POLL`] until then, to pass a renew on.
const RENEW_WATCH: Duration = Duration::from_millis(250);

/// See [`RENEW_WATCH`]: well within [`SUPERVISOR_SLACK`].
const RENEW_POLL: Duration = Duration::from_millis(10);

/// How a run learns that its term was renewed (its deadline moved later).
pub(crate) enum Renewals {
    /// The elector publishes each renew of the lease.
    Published(watch::Receiver<Leadership>),
    /// A shard term's deadline is read (the renews of the membership are not published): at
    /// [`RENEW_WATCH`] before the command's stop signal is due, then every [`RENEW_POLL`].
    /// A healthy renew is answered by `deadline - grace - SUPERVISOR_SLACK` (`check_grace`).
    Polled {
        /// The deadline last passed to the supervisor.
        sent: Option<Instant>,
    },
}

impl Renewals {
    /// Completes when the term's deadline has moved and should be passed on.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    async fn moved(&mut self, term: TermView<'_>, grace: Duration) {
        match self {
            Renewals::Published(rx) => loop {
                if rx.changed().await.is_err() {
                    // The elector is gone: no renew will come.
                    std::future::pending::<()>().await;
                }
                let renewed = matches!(
                    &*rx.borrow_and_update(),
                    Leadership::Leader { token, .. } if *token == term.token()
                );
                if renewed {
                    return;
                }
            },
            Renewals::Polled { sent } => loop {
                let now = Instant::now();
                let deadline = term.deadline();
                let last = *sent.get_or_insert(deadline);
                if deadline > last {
                    *sent = Some(deadline);
                    return;
                }
                // The supervisor acts on its own at `last - grace`; after that, a new
                // deadline changes nothing.
                let Some(act) = last.checked_sub(grace).filter(|at| *at > now) else {
                    std::future::pending::<()>().await;
                    return;
                };
                let wake = match act.checked_sub(RENEW_WATCH) {
                    Some(at) if at > now => at,
                    _ => now + RENEW_POLL,
                };
                tokio::time::sleep_until(wake.min(act)).await;
            },
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A term's deadline on CLOCK_BOOTTIME, the clock the supervisor keeps. `Term::deadline`
/// already counts any host suspend since the renew was sent (leader-core), so a suspend never
/// moves this later than the truth.
fn boottime_at(deadline: Instant) -> u64 {
    boottime_ns().saturating_add(nanos(deadline.saturating_duration_since(Instant::now())))
}

/// The supervisors this process runs (one per shard term in a sharded run), by pid, from
/// their start until they are reaped: `kill_leftovers` spares them and what they run.
static SUPERVISORS: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

fn supervisors() -> MutexGuard<'static, BTreeSet<i32>> {
    SUPERVISORS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Kills everything a dead supervisor left behind (re-parented to this process, a child
/// subreaper; this may include helpers a cloud SDK started) and reaps it, sparing the live
/// supervisors of other shards and their commands. Returns only when nothing is left: until
/// then, the lease must be neither released nor campaigned for.
fn kill_leftovers() {
    let me = Pid::this();
    let mut rounds = 0u64;
    loop {
        {
            // Held while killing, so that no supervisor starts unregistered meanwhile.
            let live = supervisors();
            let left = descendants_outside(me, &live);
            if left.is_empty() {
                break;
            }
            for pid in &left {
                let _ = kill(*pid, Signal::SIGKILL);
            }
            for pid in left {
                let _ = nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG));
            }
        }
        rounds += 1;
        if rounds.is_multiple_of(1000) {
            error!(
                "processes the command started are still alive after SIGKILL (uninterruptible sleep?); waiting for them"
            );
        }
        #[allow(clippy::disallowed_methods)] // on a blocking thread
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How long a supervisor may take to finish a requested stop before this process kills it.
const STOP_SLACK: Duration = Duration::from_secs(1);

/// Runs the command for one term, through a supervisor process, until it and everything it
/// started have exited. An error means that nothing was started.
pub(crate) async fn supervise(
    ctx: &Ctx,
    term: TermView<'_>,
    mut renewals: Renewals,
    inbox: &mut Inbox<'_>,
) -> Result<Outcome, Exit> {
    let io = |what: &str| {
        let what = what.to_owned();
        move |e: std::io::Error| Exit::new(exit::UNAVAILABLE, format!("{what}: {e}"))
    };
    let control_dir = tempfile::Builder::new()
        .prefix("leader-")
        .tempdir()
        .map_err(io("cannot create the control folder"))?;
    let socket = control_dir.path().join("control");
    let listener = UnixListener::bind(&socket).map_err(io("cannot create the control socket"))?;
    let deadline = term.deadline();
    if let Renewals::Polled { sent } = &mut renewals {
        *sent = Some(deadline);
    }
    // Reaped below with waitpid, only once nothing will signal it any more (no pid reuse).
    let pid = spawn_supervisor(ctx, term, &socket, boottime_at(deadline))?;
    let (exited_tx, mut exited) = oneshot::channel();
    std::thread::spawn(move || {
        use nix::sys::wait::{Id, WaitPidFlag, waitid};
        let _ = exited_tx.send(waitid(
            Id::Pid(pid),
            WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT,
        ));
    });

    // Requests go through a queue and a writer task, so that a supervisor that does not read
    // (frozen) never blocks this loop; requests made before it connects wait in the queue.
    let (requests, mut queue) = tokio::sync::mpsc::unbounded_channel::<Request>();
    let mut writer_task = None;
    let mut reader = None;
    let mut stopping: Option<Outcome> = None;
    let mut stop_requested: Option<Instant> = None;
    let mut done: Option<(Ended, u8)> = None;
    let mut started = false;
    let mut backstop_fired = false;
    let backstop_after = ctx.timing.margin / 2;
    let send = |r: Request| {
        let _ = requests.send(r);
    };
    loop {
        // The supervisor enforces the deadline and the grace period; if it does not (frozen),
        // this process kills it (and with it the command) halfway through the margin, or a
        // little after the grace period of a requested stop.
        let mut backstop = term.deadline() + backstop_after;
        if let Some(at) = stop_requested {
            backstop = backstop.min(at + ctx.grace + STOP_SLACK);
        }
        tokio::select! {
            biased;
            got = inbox.recv() => match got {
                Received::Stop(sig) => {
                    if let Some(Outcome::Signalled(_)) = stopping {
                        // `timeout` and systemd may deliver one stop twice (to the process,
                        // then to its group); only a later, deliberate second signal kills.
                        if stop_requested.is_some_and(|t| t.elapsed() >= REPEAT_TO_KILL) {
                            send(Request::Kill);
                            warn!(signal = %sig, "second signal: killing the command now");
                        }
                    } else {
                        send(Request::Stop(sig));
                        stop_requested = Some(Instant::now());
                        stopping = Some(Outcome::Signalled(sig));
                        info!(signal = %sig, "stopping the command (SIGKILL after the grace period)");
                    }
                }
                Received::Forward(sig) => send(Request::Forward(sig)),
            },
            _ = &mut exited => break,
            conn = listener.accept(), if writer_task.is_none() && !backstop_fired => {
                let stream = match conn {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Without the socket the command cannot be stopped on time: end it
                        // now (the supervisor's death kills it), as the backstop does.
                        error!("control socket: {e}; killing the supervisor");
                        let _ = kill(pid, Signal::SIGKILL);
                        backstop_fired = true;
                        continue;
                    }
                };
                let (r, mut w) = stream.into_split();
                reader = Some(BufReader::new(r).lines());
                let mut queue = std::mem::replace(&mut queue, tokio::sync::mpsc::unbounded_channel().1);
                writer_task = Some(tokio::spawn(async move {
                    while let Some(r) = queue.recv().await {
                        if w.write_all(r.encode().as_bytes()).await.is_err() {
                            break;
                        }
                    }
                }));
            }
            line = next_line(&mut reader) => match line.as_deref().and_then(Report::parse) {
                Some(Report::Started(child)) => {
                    started = true;
                    info!(pid = child, "the command started");
                }
                Some(Report::Done(why, code)) => done = Some((why, code)),
                None => {
                    if line.is_none() {
                        reader = None;
                    }
                }
            },
            _ = term.cancelled(), if stopping.is_none() => {
                send(Request::Stop(Signal::SIGTERM));
                stop_requested = Some(Instant::now());
                stopping = Some(Outcome::Lost);
            }
            // A renew of this term moved its deadline.
            _ = renewals.moved(term, ctx.grace) => {
                send(Request::Deadline(boottime_at(term.deadline())));
            }
            _ = tokio::time::sleep_until(backstop), if !backstop_fired => {
                // Still unreaped (WNOWAIT above), so the pid is still the supervisor's.
                let _ = kill(pid, Signal::SIGKILL);
                backstop_fired = true;
                error!("the supervisor did not stop the command in time; killed it");
            }
        }
    }
    if let Some(t) = writer_task {
        t.abort();
    } else if !backstop_fired {
        // A short command on a busy machine: the supervisor connected, reported and exited
        // before this loop accepted its connection. Its reports wait in the socket.
        if let Ok(Ok((stream, _))) =
            tokio::time::timeout(Duration::from_millis(200), listener.accept()).await
        {
            reader = Some(BufReader::new(stream.into_split().0).lines());
        }
    }
    // Reports written just before the supervisor exited.
    while let (None, Some(r)) = (done, reader.as_mut()) {
        match r.next_line().await {
            Ok(Some(line)) => match Report::parse(&line) {
                Some(Report::Done(why, code)) => done = Some((why, code)),
                Some(Report::Started(_)) => started = true,
                None => {}
            },
            Ok(None) | Err(_) => break,
        }
    }
    let status = tokio::task::spawn_blocking(move || {
        // Exited already (above); reaped and unregistered at once, so that
        // `kill_leftovers` never takes the pid for a leftover nor spares another process
        // that reuses it.
        let mut live = supervisors();
        let status = nix::sys::wait::waitpid(pid, None);
        live.remove(&pid.as_raw());
        status
    })
    .await
    .ok()
    .and_then(Result::ok);
    let outcome = match done {
        Some((Ended::Exited, code)) => match stopping {
            Some(s) => s,
            None => Outcome::Exited(code),
        },
        Some((Ended::Stopped, code)) => stopping.unwrap_or(Outcome::Exited(code)),
        Some((Ended::Deadline | Ended::Orphaned | Ended::NotStarted, _)) => match stopping {
            Some(Outcome::Signalled(sig)) => Outcome::Signalled(sig),
            _ => Outcome::Lost,
        },
        None => {
            // The supervisor died (SIGKILL, or a crash): the kernel killed the command
            // (PR_SET_PDEATHSIG); whatever else it started is now ours to kill.
            let killed = matches!(status, Some(nix::sys::wait::WaitStatus::Signaled(..)));
            if !started && !killed && !backstop_fired {
                return Err(Exit::new(
                    exit::UNAVAILABLE,
                    "the supervisor could not start (see the error above)",
                ));
            }
            warn!("the supervisor died; killing whatever the command left behind");
            tokio::task::spawn_blocking(kill_leftovers)
                .await
                .map_err(|e| Exit::new(exit::UNAVAILABLE, format!("cleanup: {e}")))?;
            Outcome::SupervisorLost(match stopping {
                Some(Outcome::Signalled(sig)) => Some(sig),
                _ => None,
            })
        }
    };
    Ok(outcome)
}

async fn next_line(
    reader: &mut Option<tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>>,
) -> Option<String> {
    match reader {
        Some(r) => r.next_line().await.ok().flatten(),
        None => std::future::pending().await,
    }
}

/// Starts the supervisor for `term` and registers it (see [`SUPERVISORS`]); returns its pid.
fn spawn_supervisor(
    ctx: &Ctx,
    term: TermView<'_>,
    socket: &Path,
    deadline: u64,
) -> Result<Pid, Exit> {
    let exe = std::env::current_exe()
        .map_err(|e| Exit::new(exit::UNAVAILABLE, format!("own executable: {e}")))?;
    let mut command = std::process::Command::new(exe);
    command
        .arg("--log-format")
        .arg(ctx.log_format)
        .arg("__supervise")
        .arg("--control")
        .arg(socket)
        .arg("--grace")
        .arg(format!("{}ns", ctx.grace.as_nanos()))
        .arg("--deadline")
        .arg(deadline.to_string());
    if let (TermView::Shard(t), Some(shards)) = (term, ctx.shards) {
        command
            .arg("--shard")
            .arg(t.shard().to_string())
            .env("LEADER_SHARD", t.shard().to_string())
            .env("LEADER_SHARDS", shards.to_string());
    } else {
        // Not inherited from a sharded run this one runs under.
        command
            .env_remove("LEADER_SHARD")
            .env_remove("LEADER_SHARDS");
    }
    let mut live = supervisors();
    let child = command
        .arg("--")
        .args(&ctx.command)
        .env("LEADER_FENCING_TOKEN", term.token().to_string())
        .env("LEADER_STORE", &ctx.store)
        .env("LEADER_KEY", ctx.key.as_str())
        .env("LEADER_HOLDER_ID", ctx.holder.as_str())
        .env("LEADER_TTL_MS", ctx.timing.ttl.as_millis().to_string())
        .env("LEADER_GRACE_MS", ctx.grace.as_millis().to_string())
        .stdin(Stdio::inherit())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| {
            Exit::new(
                exit::UNAVAILABLE,
                format!("cannot start the supervisor: {e}"),
            )
        })?;
    let pid = i32::try_from(child.id()).unwrap_or(i32::MAX);
    live.insert(pid);
    Ok(Pid::from_raw(pid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grace_must_leave_room_for_a_healthy_renew() {
        let t = Timing::from_ttl(Duration::from_secs(2));
        // 2000 - 400 (margin) - 1000 (renew) - 200 (request) - 50 = 350 ms.
        let room = grace_room(&t);
        assert_eq!(room, Duration::from_millis(350));
        assert_eq!(check_grace(None, &t).unwrap(), grace_room(&t) / 2);
        assert!(check_grace(Some(Duration::from_millis(300)), &t).is_ok());
        let e = check_grace(Some(Duration::from_millis(400)), &t).unwrap_err();
        assert_eq!(e.code, exit::CONFIG);
        assert!(e.message.contains("--grace"), "{}", e.message);
        let long = Timing::from_ttl(Duration::from_secs(600));
        assert_eq!(check_grace(None, &long).unwrap(), MAX_DEFAULT_GRACE);
    }

    #[test]
    fn no_room_names_the_timing_not_grace() {
        let mut t = Timing::from_ttl(Duration::from_secs(2));
        t.renew_every = Duration::from_millis(1350);
        assert!(t.validate().is_ok());
        let e = check_grace(None, &t).unwrap_err();
        assert!(e.message.contains("no room"), "{}", e.message);
    }
}
