//! `leader __exec --init-report PATH`: the init (PID 1) of the command's PID namespace.
//!
//! It starts the command (unless the supervisor is gone or the term is over), tells the
//! supervisor the command's pid and, when the command exits, its exit code; then it reaps
//! whatever else is left (every orphan of the namespace becomes its child) and exits, with the
//! command's code, only once the namespace is empty.
//!
//! It has no handler for the stop signals (Rust's runtime has its own only for SIGSEGV and
//! SIGBUS): the kernel delivers to a namespace's init only the signals it has a handler for, and SIGKILL (or SIGSTOP) from outside. So the supervisor's stop signals, which
//! it sends to every descendant through `/proc`, reach the command and everything it started
//! and never end this process; the command's process group is the command's own, as without a
//! namespace. SIGKILL, from the supervisor's kill sweep or from `PR_SET_PDEATHSIG` when the
//! supervisor dies, ends it, and the kernel then kills every process of the namespace.
#![allow(clippy::disallowed_methods)] // a synchronous process: no tokio here

use std::io::ErrorKind;
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use nix::errno::Errno;
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

use super::{FromInit, NOT_STARTED, code_of};
use crate::process_tree::{boottime_ns, outer_pid_of_child};

/// Runs as the namespace's init (`PR_SET_PDEATHSIG` is set and the signal mask cleared
/// already); returns the command's exit code once nothing is left in the namespace.
pub(super) fn run(report_to: &Path, not_after: u64, command: &[String]) -> u8 {
    let socket = match UnixDatagram::unbound() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("leader: cannot report to the supervisor: {e}");
            return crate::exit::UNAVAILABLE;
        }
    };
    let send = |m: FromInit| socket.send_to(m.encode().as_bytes(), report_to);
    // Only the supervisor holds the socket bound at `report_to`: if this gets through, the
    // supervisor was alive after PR_SET_PDEATHSIG was set, which covers its death from now on.
    // (The parent of a namespace's init is outside it: `getppid` says 0.)
    if send(FromInit::Ready).is_err() {
        return NOT_STARTED;
    }
    if boottime_ns() >= not_after {
        eprintln!("leader: the term ended before the command could start; not starting it");
        return NOT_STARTED;
    }
    let Some((program, rest)) = command.split_first() else {
        return crate::exit::USAGE;
    };
    let child = match Command::new(program).args(rest).process_group(0).spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("leader: cannot start {program:?}: {e}");
            return if e.kind() == ErrorKind::NotFound {
                127
            } else {
                126
            };
        }
    };
    let inner = i32::try_from(child.id()).unwrap_or(i32::MAX);
    // Reaped with waitpid below, not through `child`.
    drop(child);
    let outer = outer_pid_of_child(inner).map_or(0, Pid::as_raw);
    // Best effort from here on: a supervisor that is gone has killed this process.
    let _ = send(FromInit::Started(outer));
    reap_all(Pid::from_raw(inner), |code| {
        let _ = send(FromInit::Exited(code));
    })
}

/// Reaps every child until none is left; calls `exited` with the command's code when the
/// command is reaped, and returns that code.
fn reap_all(command: Pid, mut exited: impl FnMut(u8)) -> u8 {
    let mut code = None;
    loop {
        match waitpid(None, None) {
            Ok(status) => {
                if status.pid() == Some(command)
                    && let Some(c) = code_of(status)
                {
                    code = Some(c);
                    exited(c);
                }
            }
            Err(Errno::EINTR) => {}
            // ECHILD: no child left, hence nothing left in the namespace.
            Err(_) => return code.unwrap_or(1),
        }
    }
}
