//! The elector's side of supervision: one supervisor process per term, told of each renew
//! and of every signal `leader` receives, watched until it and the command have exited, and
//! killed (with everything it left behind) if it does not do its job in time.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use leader::{HolderId, LeaseKey, Renewals, Term, Timing};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::UnixListener;
use tokio::net::unix::OwnedReadHalf;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::namespace::Isolation;
use super::{Ended, Report, Request};
use crate::process_tree::{boottime_ns, descendants_outside};
use crate::signals::{Inbox, Received, StepDown};
use crate::{Exit, exit};

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
    /// What keeps the command's descendants from outliving its supervisor (decided once).
    pub(crate) isolation: Isolation,
    /// `--pid-namespace on`: a supervisor that cannot have that isolation starts nothing.
    pub(crate) require_isolation: bool,
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
    /// `leader` was asked to step down (a signal or a notice); the command was stopped.
    SteppedDown(StepDown),
    /// The supervisor died (after a stop signal, if `Some`); the kernel killed the command and
    /// this process what it had started. The lease is left to expire (`docs/protocol.md`).
    SupervisorLost(Option<Signal>),
}

/// A stop signal this long after the first kills the command at once.
const REPEAT_TO_KILL: Duration = Duration::from_secs(1);

/// How long a supervisor may take to finish a requested stop before this process kills it.
const STOP_SLACK: Duration = Duration::from_secs(1);

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

/// Runs the command for one term, through a supervisor process, until it and everything it
/// started have exited. An error means that nothing was started.
pub(crate) async fn supervise(
    ctx: &Ctx,
    term: &Term,
    inbox: &mut Inbox<'_>,
) -> Result<Outcome, Exit> {
    // Before the deadline given at the start is read: a renew in between is passed on.
    let renewals = term.renewals();
    let mut run = Run::start(ctx, term)?;
    run.watch(ctx, term, renewals, inbox).await;
    run.finish().await
}

type ReportLines = Lines<BufReader<OwnedReadHalf>>;

/// One supervisor, from its start until it has exited and been reaped.
struct Run {
    pid: Pid,
    /// The private folder of the control socket: removed when the run ends.
    _control_dir: tempfile::TempDir,
    listener: UnixListener,
    /// Completes when the supervisor has exited (it is not reaped yet).
    exited: oneshot::Receiver<nix::Result<WaitStatus>>,
    /// Requests go through a queue and a writer task, so that a supervisor that does not
    /// read (frozen) never blocks the watch; requests made before it connects wait in it.
    requests: mpsc::UnboundedSender<Request>,
    queue: Option<mpsc::UnboundedReceiver<Request>>,
    writer: Option<JoinHandle<()>>,
    reports: Option<ReportLines>,
    /// What the run ends as if the supervisor confirms a stop: set when one is asked for.
    stopping: Option<Outcome>,
    stop_requested: Option<Instant>,
    done: Option<(Ended, u8)>,
    started: bool,
    /// This process killed the supervisor (it did not act in time, or could not be reached).
    backstop_fired: bool,
}

impl Run {
    /// Creates the control socket and starts the supervisor for `term`.
    fn start(ctx: &Ctx, term: &Term) -> Result<Self, Exit> {
        let io = |what: &str| {
            let what = what.to_owned();
            move |e: std::io::Error| Exit::new(exit::UNAVAILABLE, format!("{what}: {e}"))
        };
        let control_dir = tempfile::Builder::new()
            .prefix("leader-")
            .tempdir()
            .map_err(io("cannot create the control folder"))?;
        let socket = control_dir.path().join("control");
        let listener =
            UnixListener::bind(&socket).map_err(io("cannot create the control socket"))?;
        // Reaped in `finish` with waitpid, only once nothing will signal it any more (no pid
        // reuse).
        let pid = spawn_supervisor(ctx, term, &socket, boottime_at(term.deadline()))?;
        let (exited_tx, exited) = oneshot::channel();
        std::thread::spawn(move || {
            let _ = exited_tx.send(waitid(
                Id::Pid(pid),
                WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT,
            ));
        });
        let (requests, queue) = mpsc::unbounded_channel();
        Ok(Self {
            pid,
            _control_dir: control_dir,
            listener,
            exited,
            requests,
            queue: Some(queue),
            writer: None,
            reports: None,
            stopping: None,
            stop_requested: None,
            done: None,
            started: false,
            backstop_fired: false,
        })
    }

    fn send(&self, request: Request) {
        let _ = self.requests.send(request);
    }

    /// Passes on signals, renews and the end of the term until the supervisor exits.
    async fn watch(
        &mut self,
        ctx: &Ctx,
        term: &Term,
        mut renewals: Renewals,
        inbox: &mut Inbox<'_>,
    ) {
        let backstop_after = ctx.timing.margin / 2;
        loop {
            // The supervisor enforces the deadline and the grace period; if it does not
            // (frozen), this process kills it (and with it the command) halfway through the
            // margin, or a little after the grace period of a requested stop.
            let mut backstop = term.deadline() + backstop_after;
            if let Some(at) = self.stop_requested {
                backstop = backstop.min(at + ctx.grace + STOP_SLACK);
            }
            tokio::select! {
                biased;
                got = inbox.recv() => self.on_signal(got),
                _ = &mut self.exited => return,
                conn = self.listener.accept(), if self.writer.is_none() && !self.backstop_fired => {
                    match conn {
                        Ok((stream, _)) => self.connected(stream),
                        Err(e) => {
                            // Without the socket the command cannot be stopped on time: end
                            // it now (the supervisor's death kills it), as the backstop does.
                            error!("control socket: {e}; killing the supervisor");
                            self.kill_supervisor();
                        }
                    }
                }
                line = next_line(&mut self.reports) => match line {
                    Some(line) => self.on_report(&line),
                    None => self.reports = None,
                },
                _ = term.cancelled(), if self.stopping.is_none() => {
                    self.request_stop(Signal::SIGTERM, Outcome::Lost);
                }
                // A renew of this term moved its deadline.
                Some(_) = renewals.next() => {
                    self.send(Request::Deadline(boottime_at(term.deadline())));
                }
                _ = tokio::time::sleep_until(backstop), if !self.backstop_fired => {
                    self.kill_supervisor();
                    error!("the supervisor did not stop the command in time; killed it");
                }
            }
        }
    }

    fn on_signal(&mut self, got: Received) {
        match got {
            Received::Stop(sig) => {
                if let Some(Outcome::Signalled(_)) = self.stopping {
                    // `timeout` and systemd may deliver one stop twice (to the process, then
                    // to its group); only a later, deliberate second signal kills.
                    if self
                        .stop_requested
                        .is_some_and(|t| t.elapsed() >= REPEAT_TO_KILL)
                    {
                        self.send(Request::Kill);
                        warn!(signal = %sig, "second signal: killing the command now");
                    }
                } else {
                    self.request_stop(sig, Outcome::Signalled(sig));
                    info!(signal = %sig, "stopping the command (SIGKILL after the grace period)");
                }
            }
            Received::Forward(sig) => self.send(Request::Forward(sig)),
            Received::StepDown(why) => {
                if self.stopping.is_none() {
                    self.request_stop(Signal::SIGTERM, Outcome::SteppedDown(why));
                    info!(
                        ?why,
                        "stepping down: stopping the command (SIGKILL after the grace period)"
                    );
                }
            }
        }
    }

    fn request_stop(&mut self, sig: Signal, outcome: Outcome) {
        self.send(Request::Stop(sig));
        self.stop_requested = Some(Instant::now());
        self.stopping = Some(outcome);
    }

    /// The supervisor connected: its reports are read from now on, and the queued requests
    /// are written to it.
    fn connected(&mut self, stream: tokio::net::UnixStream) {
        let (r, mut w) = stream.into_split();
        self.reports = Some(BufReader::new(r).lines());
        let Some(mut queue) = self.queue.take() else {
            return;
        };
        self.writer = Some(tokio::spawn(async move {
            while let Some(r) = queue.recv().await {
                if w.write_all(r.encode().as_bytes()).await.is_err() {
                    break;
                }
            }
        }));
    }

    fn on_report(&mut self, line: &str) {
        match Report::parse(line) {
            Some(Report::Started(child)) => {
                self.started = true;
                info!(pid = child, "the command started");
            }
            Some(Report::Done(why, code)) => self.done = Some((why, code)),
            None => {}
        }
    }

    fn kill_supervisor(&mut self) {
        // Still unreaped (WNOWAIT), so the pid is still the supervisor's.
        let _ = kill(self.pid, Signal::SIGKILL);
        self.backstop_fired = true;
    }

    /// After the supervisor exited: reads its last reports, reaps it, and says how the run
    /// ended; if the supervisor died, kills whatever the command left behind first.
    async fn finish(mut self) -> Result<Outcome, Exit> {
        if let Some(t) = self.writer.take() {
            t.abort();
        } else if !self.backstop_fired {
            // A short command on a busy machine: the supervisor connected, reported and
            // exited before the watch accepted its connection. Its reports wait in the socket.
            if let Ok(Ok((stream, _))) =
                tokio::time::timeout(Duration::from_millis(200), self.listener.accept()).await
            {
                self.reports = Some(BufReader::new(stream.into_split().0).lines());
            }
        }
        // Reports written just before the supervisor exited.
        while self.done.is_none() {
            let Some(r) = self.reports.as_mut() else {
                break;
            };
            match r.next_line().await {
                Ok(Some(line)) => match Report::parse(&line) {
                    Some(Report::Done(why, code)) => self.done = Some((why, code)),
                    Some(Report::Started(_)) => self.started = true,
                    None => {}
                },
                Ok(None) | Err(_) => break,
            }
        }
        let pid = self.pid;
        let status = tokio::task::spawn_blocking(move || {
            // Exited already (above); reaped and unregistered at once, so that
            // `kill_leftovers` never takes the pid for a leftover nor spares another process
            // that reuses it.
            let mut live = supervisors();
            let status = waitpid(pid, None);
            live.remove(&pid.as_raw());
            status
        })
        .await
        .ok()
        .and_then(Result::ok);
        self.outcome(status).await
    }

    async fn outcome(self, status: Option<WaitStatus>) -> Result<Outcome, Exit> {
        Ok(match self.done {
            Some((Ended::Exited, code)) => self.stopping.unwrap_or(Outcome::Exited(code)),
            Some((Ended::Stopped, code)) => self.stopping.unwrap_or(Outcome::Exited(code)),
            Some((Ended::Deadline | Ended::Orphaned | Ended::NotStarted, _)) => {
                match self.stopping {
                    Some(Outcome::Signalled(sig)) => Outcome::Signalled(sig),
                    _ => Outcome::Lost,
                }
            }
            None => {
                // The supervisor died (SIGKILL, or a crash): the kernel killed the command
                // (PR_SET_PDEATHSIG); whatever else it started is now ours to kill.
                let killed = matches!(status, Some(WaitStatus::Signaled(..)));
                if !self.started && !killed && !self.backstop_fired {
                    // Nothing should be left; but the command may have started after all (its
                    // report comes from the namespace's init, later than the fork), and a
                    // namespace may still be going down: look, as after any death.
                    let _ = tokio::task::spawn_blocking(kill_leftovers).await;
                    return Err(Exit::new(
                        exit::UNAVAILABLE,
                        "the supervisor could not start (see the error above)",
                    ));
                }
                warn!("the supervisor died; killing whatever the command left behind");
                tokio::task::spawn_blocking(kill_leftovers)
                    .await
                    .map_err(|e| Exit::new(exit::UNAVAILABLE, format!("cleanup: {e}")))?;
                Outcome::SupervisorLost(match self.stopping {
                    Some(Outcome::Signalled(sig)) => Some(sig),
                    _ => None,
                })
            }
        })
    }
}

async fn next_line(reports: &mut Option<ReportLines>) -> Option<String> {
    match reports {
        Some(r) => r.next_line().await.ok().flatten(),
        None => std::future::pending().await,
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
                let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
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

/// Starts the supervisor for `term` and registers it (see [`SUPERVISORS`]); returns its pid.
fn spawn_supervisor(ctx: &Ctx, term: &Term, socket: &Path, deadline: u64) -> Result<Pid, Exit> {
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
        .arg(deadline.to_string())
        .arg("--isolation")
        .arg(ctx.isolation.as_str());
    if ctx.require_isolation {
        command.arg("--require-isolation");
    }
    if let (Some(shard), Some(shards)) = (term.shard(), ctx.shards) {
        command
            .arg("--shard")
            .arg(shard.to_string())
            .env("LEADER_SHARD", shard.to_string())
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
