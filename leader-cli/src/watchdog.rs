//! The watchdog: a small process between `leader` and the command.
//!
//! It starts the command in a new process group and stops the whole group (SIGTERM, then
//! SIGKILL after the grace period) as soon as any of these happens:
//! - the term's deadline passes without an extension (`leader` writes each new deadline, on
//!   the host's monotonic clock, to a control file) — so a frozen or partitioned `leader`
//!   cannot leave its command running past the term;
//! - `leader` dies (the watchdog is re-parented) — so SIGKILL of `leader` does not orphan it;
//! - `leader` asks it to (a `stop` file naming the signal to send first).
//!
//! Its exit code is the command's (128+N if the command died of signal N).
#![allow(clippy::disallowed_methods)] // a synchronous supervisor: blocking sleeps are intended

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use clap::Args;
use nix::sys::signal::{Signal, killpg};
use nix::time::{ClockId, clock_gettime};
use nix::unistd::{Pid, getppid};

const POLL: Duration = Duration::from_millis(20);

#[derive(Debug, Args)]
pub(crate) struct WatchdogArgs {
    /// The control folder (`deadline`, `stop`).
    #[arg(long)]
    control: PathBuf,
    /// Time between SIGTERM and SIGKILL.
    #[arg(long, value_parser = crate::parse_duration)]
    grace: Duration,
    /// The command.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// Now on the host's monotonic clock, in nanoseconds (shared by all processes of the host).
pub(crate) fn monotonic_ns() -> u128 {
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map(|t| Duration::from(t).as_nanos())
        .unwrap_or(0)
}

pub(crate) fn deadline_path(control: &Path) -> PathBuf {
    control.join("deadline")
}

pub(crate) fn stop_path(control: &Path) -> PathBuf {
    control.join("stop")
}

fn read_deadline(control: &Path) -> Option<u128> {
    std::fs::read_to_string(deadline_path(control))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn read_stop(control: &Path) -> Option<Signal> {
    let text = std::fs::read_to_string(stop_path(control)).ok()?;
    let n: i32 = text.trim().parse().unwrap_or(15);
    Some(Signal::try_from(n).unwrap_or(Signal::SIGTERM))
}

pub(crate) fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(sig)) => u8::try_from((128 + sig) & 0xff).unwrap_or(1),
        _ => 1,
    }
}

fn group_alive(pgid: Pid) -> bool {
    killpg(pgid, None).is_ok()
}

/// Sends `first` to the group, waits up to `grace` for the group to be gone, then SIGKILLs
/// whatever is left (grandchildren included).
fn stop_group(child: &mut std::process::Child, pgid: Pid, first: Signal, grace: Duration) -> u8 {
    let _ = killpg(pgid, first);
    let until = Instant::now() + grace;
    let mut status = None;
    while Instant::now() < until {
        if status.is_none() {
            status = child.try_wait().ok().flatten();
        }
        if status.is_some() && !group_alive(pgid) {
            break;
        }
        std::thread::sleep(POLL);
    }
    let _ = killpg(pgid, Signal::SIGKILL);
    let status = match status {
        Some(s) => s,
        None => match child.wait() {
            Ok(s) => s,
            Err(_) => return 1,
        },
    };
    exit_code(status)
}

pub(crate) fn run(args: WatchdogArgs) -> u8 {
    let parent = getppid();
    let Some((program, rest)) = args.command.split_first() else {
        return crate::exit::USAGE;
    };
    let spawned = {
        use std::os::unix::process::CommandExt;
        Command::new(program).args(rest).process_group(0).spawn()
    };
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            eprintln!("leader: cannot start {program:?}: {e}");
            return if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
        }
    };
    let pgid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                // The command is done; nothing it started may go on acting after the term.
                if group_alive(pgid) {
                    stop_group(&mut child, pgid, Signal::SIGTERM, args.grace);
                }
                return exit_code(status);
            }
            Ok(None) => {}
            Err(_) => return stop_group(&mut child, pgid, Signal::SIGKILL, Duration::ZERO),
        }
        if getppid() != parent {
            eprintln!("leader: the supervising `leader` process died; stopping the command");
            return stop_group(&mut child, pgid, Signal::SIGTERM, args.grace);
        }
        if let Some(sig) = read_stop(&args.control) {
            return stop_group(&mut child, pgid, sig, args.grace);
        }
        match read_deadline(&args.control) {
            Some(deadline) if monotonic_ns() < deadline => {}
            _ => {
                eprintln!("leader: the term's deadline passed; stopping the command");
                return stop_group(&mut child, pgid, Signal::SIGTERM, args.grace);
            }
        }
        std::thread::sleep(POLL);
    }
}
