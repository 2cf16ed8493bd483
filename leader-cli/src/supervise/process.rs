//! The supervisor process (`leader __supervise`): it starts the command and makes sure it
//! never outlives its term, whatever happens to `leader`.
//!
//! `leader run` (the *elector* process) starts one supervisor per term. The supervisor
//! - leaves `leader`'s session and process group at once (`setsid`), so that Ctrl-C in a
//!   terminal, `kill -- -PGID`, `timeout` and SIGSTOP of `leader`'s group never reach it;
//! - is a child subreaper, so every process the command starts stays below it, even one that
//!   calls `setsid` or daemonizes (double fork);
//! - starts the command through `leader __exec`, which sets `PR_SET_PDEATHSIG` (SIGKILL) on
//!   itself, checks the deadline on `CLOCK_BOOTTIME` once more, and only then execs the
//!   command in a process group of its own;
//! - where `leader run` found the kernel to allow it (`--isolation`), enters a new PID
//!   namespace first, so that `leader __exec` is the namespace's init and starts the command
//!   instead of becoming it (`super::init`): when that init dies, of SIGKILL or because this
//!   process died, the kernel kills everything in the namespace;
//! - sends every descendant the stop signal at `deadline - grace` and SIGKILL at the deadline
//!   (both on `CLOCK_BOOTTIME`, from a timer, not a poll), unless `leader` extends the
//!   deadline before;
//! - on a stop request (from `leader`, or a signal sent to the supervisor itself, as systemd
//!   and `pkill leader` do), or when `leader` dies (its control socket closes), sends the
//!   signal at once and SIGKILL `grace` later, or at the deadline if that comes first;
//! - exits only when the command and all its descendants are gone, and tells `leader` why, so
//!   that `leader` releases the lease only then.
//!
//! `leader` talks to it over a Unix socket in a private folder, one line per message.
#![allow(clippy::disallowed_methods)] // a synchronous process: no tokio here

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use clap::Args;
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal, killpg};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getppid};
use tracing::{error, info, warn};

use super::namespace::{self, Isolation};
use super::{Ended, FromInit, NOT_STARTED, Report, Request, code_of};
use crate::process_tree::{boottime_ns, parent_of, signal_descendants};

/// How often the supervisor repeats SIGKILL while descendants are still being created.
const KILL_SWEEP: Duration = Duration::from_millis(20);

/// The signals the supervisor handles itself (through a signalfd) instead of dying of them.
const HANDLED: [Signal; 7] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGCHLD,
];

#[derive(Debug, Args)]
pub(crate) struct SuperviseArgs {
    /// The control socket of the `leader` process.
    #[arg(long)]
    control: PathBuf,
    /// Time between the stop signal and SIGKILL.
    #[arg(long, value_parser = crate::parse_duration)]
    grace: Duration,
    /// The term's deadline, in nanoseconds on CLOCK_BOOTTIME.
    #[arg(long)]
    deadline: u64,
    /// The shard whose term this is, in a sharded run (for the log).
    #[arg(long)]
    shard: Option<u32>,
    /// What keeps the command's descendants from outliving this process, as `leader run`
    /// found at start-up.
    #[arg(long, value_enum, default_value_t = Isolation::None)]
    isolation: Isolation,
    /// Do not start the command if that isolation is refused now (`--pid-namespace on`).
    #[arg(long)]
    require_isolation: bool,
    /// The command.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

#[derive(Debug, Args)]
pub(crate) struct ExecArgs {
    /// The supervisor's pid: if it is already gone, the command is not started.
    #[arg(long)]
    supervisor: i32,
    /// Do not start the command at or after this instant (nanoseconds on CLOCK_BOOTTIME).
    #[arg(long)]
    not_after: u64,
    /// Be the init of the command's PID namespace, and report to the supervisor through the
    /// datagram socket at this path.
    #[arg(long)]
    init_report: Option<PathBuf>,
    /// The command.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// `leader __exec`: the last step before the command. Returns only if the command cannot start.
pub(crate) fn exec(args: ExecArgs) -> u8 {
    // The command dies with its supervisor (kept across exec).
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        eprintln!("leader: cannot tie the command to its supervisor: {e}");
        return crate::exit::UNAVAILABLE;
    }
    // The supervisor blocks the signals it reads through a signalfd; a blocked mask survives
    // fork and exec, and the command must start with none blocked.
    if let Err(e) = SigSet::empty().thread_set_mask() {
        eprintln!("leader: cannot clear the signal mask for the command: {e}");
        return crate::exit::UNAVAILABLE;
    }
    if let Some(report) = &args.init_report {
        return super::init::run(report, args.not_after, &args.command);
    }
    if getppid().as_raw() != args.supervisor {
        return NOT_STARTED; // the supervisor died before the command could start
    }
    if boottime_ns() >= args.not_after {
        eprintln!("leader: the term ended before the command could start; not starting it");
        return NOT_STARTED;
    }
    let Some((program, rest)) = args.command.split_first() else {
        return crate::exit::USAGE;
    };
    let e = Command::new(program).args(rest).process_group(0).exec();
    eprintln!("leader: cannot start {program:?}: {e}");
    if e.kind() == ErrorKind::NotFound {
        127
    } else {
        126
    }
}

enum Phase {
    /// The command runs; the stop signal is due at `deadline - grace`.
    Running,
    /// The stop signal was sent; SIGKILL is due at `min(kill_by, deadline)`.
    Stopping { kill_by: u64, why: Ended },
    /// SIGKILL was sent; repeated until every descendant is gone.
    Killing { why: Ended },
}

struct Supervisor {
    grace: u64,
    deadline: u64,
    phase: Phase,
    /// The process this one started (`leader __exec`), until it is reaped: the command itself,
    /// or the init of the command's PID namespace, which starts the command.
    child: Option<Pid>,
    /// The command's pid (and process group), while it runs.
    command: Option<Pid>,
    /// In a PID namespace: the socket on which its init reports (`FromInit`).
    init: Option<UnixDatagram>,
    /// The command's exit code, once it has exited.
    code: Option<u8>,
    /// No child is left (so, being a subreaper, no descendant either).
    empty: bool,
    control: Option<UnixStream>,
    inbox: Vec<u8>,
    signals: SignalFd,
    timer: TimerFd,
}

/// `leader __supervise`. Its exit code is the command's.
pub(crate) fn run(args: SuperviseArgs, log_format: crate::LogFormat) -> u8 {
    match Supervisor::start(&args, log_format) {
        Ok((Some(mut s), _log)) => {
            let _shard = args
                .shard
                .map(|shard| tracing::info_span!("shard", shard).entered());
            s.run()
        }
        Ok((None, _log)) => NOT_STARTED,
        Err(e) => {
            eprintln!("leader: the supervisor cannot start: {e}");
            crate::exit::UNAVAILABLE
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The isolation this term gets: what `leader run` decided, unless the kernel refuses it now.
/// Then the command does not start if `--pid-namespace on` asked for it (or if this process
/// cannot go back); otherwise it runs without, and the log says so.
fn isolation_in_force(
    args: &SuperviseArgs,
    entered: Result<(), namespace::Failure>,
) -> Result<Isolation, String> {
    match entered {
        Ok(()) => Ok(args.isolation),
        Err(f) if args.require_isolation || f.changed => Err(format!(
            "no PID namespace for the command ({}); not starting it",
            f.reason
        )),
        Err(f) => {
            error!(
                reason = %f.reason,
                "the PID namespace found at start-up is refused now: this term's command runs \
                 without one (what it starts survives SIGKILL of leader and its supervisor at \
                 once)"
            );
            Ok(Isolation::None)
        }
    }
}

impl Supervisor {
    /// Sets up, then starts the command unless the deadline is too close. Returns the logging
    /// guard too (keep it until exit).
    fn start(
        args: &SuperviseArgs,
        log_format: crate::LogFormat,
    ) -> Result<(Option<Self>, tracing_appender::non_blocking::WorkerGuard), String> {
        let step = |what: &'static str| move |e: Errno| format!("{what}: {e}");
        nix::unistd::setsid().map_err(step("setsid"))?;
        nix::sys::prctl::set_child_subreaper(true).map_err(step("child subreaper"))?;
        let mut mask = SigSet::empty();
        for s in HANDLED {
            mask.add(s);
        }
        mask.thread_block().map_err(step("block signals"))?;
        // Before the log writer thread starts: only a single-threaded process may enter a user
        // namespace.
        let prepared = namespace::prepare(args.isolation);
        // After blocking: the log writer thread inherits the mask, so every signal reaches the
        // signalfd, never that thread.
        let log = crate::init_logging(log_format);
        // After the thread starts: once a PID namespace awaits its children, no thread can.
        let entered = prepared.and_then(|()| namespace::enter_pid(args.isolation));
        let isolation = isolation_in_force(args, entered)?;
        let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
            .map_err(step("signalfd"))?;
        let timer = TimerFd::new(
            ClockId::CLOCK_BOOTTIME,
            TimerFlags::TFD_CLOEXEC | TimerFlags::TFD_NONBLOCK,
        )
        .map_err(step("timerfd"))?;
        let control = match UnixStream::connect(&args.control) {
            Ok(c) => c,
            // `leader` is gone already: nothing may start.
            Err(_) => return Ok((None, log)),
        };
        control
            .set_nonblocking(true)
            .map_err(|e| format!("control socket: {e}"))?;
        let grace = nanos(args.grace);
        let not_after = args.deadline.saturating_sub(grace);
        let mut s = Self {
            grace,
            deadline: args.deadline,
            phase: Phase::Running,
            child: None,
            command: None,
            init: None,
            code: None,
            empty: false,
            control: Some(control),
            inbox: Vec::new(),
            signals,
            timer,
        };
        if boottime_ns() >= not_after {
            warn!("the term ended before the command could start; not starting it");
            s.report(Report::Done(Ended::NotStarted, NOT_STARTED));
            return Ok((None, log));
        }
        s.spawn(args, isolation, not_after)?;
        Ok((Some(s), log))
    }

    /// Starts `leader __exec`: the command, or in a PID namespace its init.
    fn spawn(
        &mut self,
        args: &SuperviseArgs,
        isolation: Isolation,
        not_after: u64,
    ) -> Result<(), String> {
        let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
        let mut command = Command::new(exe);
        command
            .arg("__exec")
            .arg("--supervisor")
            .arg(std::process::id().to_string())
            .arg("--not-after")
            .arg(not_after.to_string());
        if isolation != Isolation::None {
            // Beside the control socket, in `leader`'s private folder for this term.
            let path = args.control.with_file_name("init");
            let _ = std::fs::remove_file(&path);
            let socket = UnixDatagram::bind(&path)
                .and_then(|s| s.set_nonblocking(true).map(|()| s))
                .map_err(|e| format!("the socket of the namespace's init: {e}"))?;
            self.init = Some(socket);
            command.arg("--init-report").arg(&path);
        }
        let child = command
            .arg("--")
            .args(&args.command)
            .spawn()
            .map_err(|e| format!("cannot start the command: {e}"))?;
        let pid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
        // Reaped with waitpid below, not through `child`.
        drop(child);
        self.child = Some(pid);
        if self.init.is_none() {
            self.command = Some(pid);
            self.report(Report::Started(pid.as_raw()));
        }
        // In a namespace, `Started` waits for init to say the command's pid.
        Ok(())
    }

    fn report(&mut self, report: Report) {
        if let Some(c) = &mut self.control {
            // Best effort: if `leader` is gone nobody reads it.
            let _ = c.write_all(report.encode().as_bytes());
        }
    }

    fn run(&mut self) -> u8 {
        loop {
            if let Some(why) = self.finished() {
                let code = match why {
                    Ended::Exited | Ended::Deadline | Ended::Stopped | Ended::Orphaned => {
                        self.code.unwrap_or(1)
                    }
                    Ended::NotStarted => NOT_STARTED,
                };
                info!(
                    why = why.as_str(),
                    code, "the command and everything it started are gone"
                );
                self.report(Report::Done(why, code));
                return code;
            }
            let due = self.due();
            self.arm(due);
            if boottime_ns() >= due {
                self.act();
                continue;
            }
            let mut fds = vec![
                PollFd::new(self.signals.as_fd(), PollFlags::POLLIN),
                PollFd::new(self.timer.as_fd(), PollFlags::POLLIN),
            ];
            if let Some(c) = &self.control {
                fds.push(PollFd::new(c.as_fd(), PollFlags::POLLIN));
            }
            if let Some(i) = &self.init {
                fds.push(PollFd::new(i.as_fd(), PollFlags::POLLIN));
            }
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => {
                    // Cannot wait any more: end everything now rather than lose control.
                    self.kill_now(Ended::Stopped);
                    error!("poll failed ({e}); killed the command");
                    std::thread::sleep(KILL_SWEEP);
                }
            }
            self.read_signals();
            // A due action first: a deadline extension read after it (one delayed by a
            // suspend, say) must not save the command.
            if boottime_ns() >= self.due() {
                self.act();
            }
            self.read_control();
        }
    }

    /// `Some(why)` once the command (or its namespace's init) has been reaped and no
    /// descendant is left.
    fn finished(&self) -> Option<Ended> {
        if self.child.is_some() || !self.empty {
            return None;
        }
        Some(match self.phase {
            Phase::Running => Ended::Exited,
            Phase::Stopping { why, .. } | Phase::Killing { why } => why,
        })
    }

    /// When the next timed action is due, on CLOCK_BOOTTIME.
    fn due(&self) -> u64 {
        match self.phase {
            Phase::Running => self.deadline.saturating_sub(self.grace),
            Phase::Stopping { kill_by, .. } => kill_by.min(self.deadline),
            Phase::Killing { .. } => boottime_ns().saturating_add(nanos(KILL_SWEEP)),
        }
    }

    fn arm(&self, at: u64) {
        let at = TimeSpec::from_duration(Duration::from_nanos(at.max(1)));
        if let Err(e) = self.timer.set(
            Expiration::OneShot(at),
            TimerSetTimeFlags::TFD_TIMER_ABSTIME,
        ) {
            warn!("cannot arm the deadline timer ({e}); polling instead");
        }
    }

    /// The timed action that is due now.
    fn act(&mut self) {
        match self.phase {
            Phase::Running => {
                self.stop(Signal::SIGTERM, Ended::Deadline);
                warn!("the term's deadline is near and was not extended; stopping the command");
            }
            Phase::Stopping { why, .. } => self.kill_now(why),
            Phase::Killing { why } => self.kill_now(why),
        }
    }

    /// Sends `first` (and SIGCONT, so that stopped processes can act on it) to every
    /// descendant; SIGKILL follows after the grace period or at the deadline.
    fn stop(&mut self, first: Signal, why: Ended) {
        if !matches!(self.phase, Phase::Running) {
            return;
        }
        let kill_by = boottime_ns().saturating_add(self.grace);
        self.phase = Phase::Stopping { kill_by, why };
        // The namespace's init, if any, ignores them (it has no handler); everything it
        // started gets them.
        let n = signal_descendants(Pid::this(), first)
            .saturating_sub(usize::from(self.init.is_some() && self.child.is_some()));
        signal_descendants(Pid::this(), Signal::SIGCONT);
        info!(signal = %first, processes = n, why = why.as_str(), "stopping the command");
    }

    fn kill_now(&mut self, why: Ended) {
        let first = !matches!(self.phase, Phase::Killing { .. });
        self.phase = Phase::Killing { why };
        signal_descendants(Pid::this(), Signal::SIGKILL);
        if first {
            warn!("killed whatever was left of the command (SIGKILL)");
        }
        self.reap();
    }

    fn read_signals(&mut self) {
        while let Ok(Some(info)) = self.signals.read_signal() {
            let Ok(sig) = Signal::try_from(i32::try_from(info.ssi_signo).unwrap_or(0)) else {
                continue;
            };
            match sig {
                Signal::SIGCHLD => {}
                // `leader` forwards these over the socket; sent here directly they would
                // reach the command twice (systemd signals the whole cgroup).
                Signal::SIGUSR1 | Signal::SIGUSR2 => {}
                _ => {
                    info!(signal = %sig, "the supervisor was sent a signal");
                    self.stop(sig, Ended::Stopped);
                }
            }
        }
        self.reap();
    }

    fn reap(&mut self) {
        // First what init reported before it exited: the command's own exit code.
        self.read_init();
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => return,
                Ok(status) => {
                    if status.pid() == self.child {
                        self.child = None;
                        // An init that exited by itself exits with the command's code; one
                        // killed before it could report takes the command with it.
                        if self.code.is_none() {
                            // Its report may have come in just before it died (of the kill
                            // sweep, after the command exited by itself).
                            self.read_init();
                        }
                        if self.code.is_none() {
                            self.code = code_of(status);
                        }
                        self.command_exited();
                    }
                }
                Err(Errno::EINTR) => {}
                Err(_) => {
                    // ECHILD: no child left, hence (as a subreaper) no descendant; in a
                    // namespace, init has gone, and the kernel ends it only once it is empty.
                    self.empty = true;
                    self.child = None;
                    self.command = None;
                    return;
                }
            }
        }
    }

    /// The command has exited: whatever it left behind must not outlive it.
    fn command_exited(&mut self) {
        self.command = None;
        if matches!(self.phase, Phase::Running) {
            self.stop(Signal::SIGTERM, Ended::Exited);
        }
    }

    /// Reads what the namespace's init reported.
    fn read_init(&mut self) {
        let mut buf = [0u8; 64];
        loop {
            let Some(socket) = &self.init else { return };
            let n = match socket.recv(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            match FromInit::parse(&String::from_utf8_lossy(&buf[..n])) {
                Some(FromInit::Ready) => {}
                Some(FromInit::Started(pid)) => {
                    if pid > 0 {
                        self.command = Some(Pid::from_raw(pid));
                    } else {
                        warn!("the command's pid is unknown: USR1 and USR2 will not reach it");
                    }
                    let shown = if pid > 0 {
                        Some(pid)
                    } else {
                        self.child.map(Pid::as_raw)
                    };
                    self.report(Report::Started(shown.unwrap_or(0)));
                }
                Some(FromInit::Exited(code)) => {
                    self.code = Some(code);
                    self.command_exited();
                }
                None => warn!("an unknown message from the namespace's init"),
            }
        }
    }

    /// The command's process group, while the command is there (running, or not yet reaped).
    fn command_group(&self) -> Option<Pid> {
        let command = self.command?;
        if self.init.is_none() {
            // This process's own child: its pid is not reused before this process reaps it.
            return Some(command);
        }
        // Init's child: once init has reaped it, its pid may be another process's.
        (parent_of(command) == self.child).then_some(command)
    }

    fn read_control(&mut self) {
        let Some(c) = &mut self.control else { return };
        let mut buf = [0u8; 512];
        let gone = loop {
            match c.read(&mut buf) {
                Ok(0) => break true,
                Ok(n) => self.inbox.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break false,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break true,
            }
        };
        while let Some(end) = self.inbox.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.inbox.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line[..end]).into_owned();
            match Request::parse(&line) {
                Some(r) => self.handle(r),
                None => warn!(line, "unknown control message"),
            }
        }
        if gone {
            self.control = None;
            if matches!(self.phase, Phase::Running) {
                warn!("the `leader` process is gone; stopping the command (the lease will expire)");
                self.stop(Signal::SIGTERM, Ended::Orphaned);
            }
        }
    }

    fn handle(&mut self, request: Request) {
        match request {
            // Only a running command's deadline moves, and only while its stop is not due yet.
            Request::Deadline(ns) => {
                if matches!(self.phase, Phase::Running) && boottime_ns() < self.due() {
                    self.deadline = ns;
                }
            }
            Request::Stop(sig) => self.stop(sig, Ended::Stopped),
            Request::Kill => {
                let why = match self.phase {
                    Phase::Running => Ended::Stopped,
                    Phase::Stopping { why, .. } | Phase::Killing { why } => why,
                };
                self.kill_now(why);
            }
            Request::Forward(sig) => {
                if let Some(group) = self.command_group() {
                    let _ = killpg(group, sig);
                }
            }
        }
    }
}
