//! A PID namespace of its own for the command, where the kernel allows it.
//!
//! The supervisor's child, `leader __exec`, is then the namespace's init (PID 1), and starts
//! the command. When that init dies (SIGKILL, or `PR_SET_PDEATHSIG` because the supervisor
//! died) the kernel kills every process of the namespace: nothing the command starts outlives
//! its supervisor, even when `leader` and the supervisor are killed at once (`pkill -9
//! leader`). Where the kernel refuses a PID namespace to an unprivileged user, a user namespace
//! that maps the user and group to themselves makes one possible: the command keeps its uid
//! and gains no capability.
//!
//! `leader run` decides once, at start-up, by running `leader __probe-pid-namespace` (a
//! single-threaded child that attempts exactly what a supervisor will), says which protection
//! is in force, and passes the decision to every supervisor, so that the two cannot disagree.

use std::process::Stdio;

use clap::ValueEnum;
use nix::sched::{CloneFlags, unshare};
use nix::unistd::{getegid, geteuid};
use tracing::info;

use crate::{Exit, exit};

/// `leader run --pid-namespace`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum PidNamespaceMode {
    // Where the kernel allows it, else without (and `leader run` says so).
    Auto,
    // Always: `leader run` refuses to start (78) where the kernel does not allow it.
    On,
    // Never: what the command starts survives SIGKILL of `leader` and its supervisor at once.
    Off,
}

/// What keeps the command's descendants from outliving its supervisor: decided once by
/// `leader run` (`decide`), then used by every supervisor (`--isolation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Isolation {
    /// A PID namespace of its own (the kernel allows it to this user: root).
    Pid,
    /// A PID namespace in a user namespace that maps this user and group to themselves.
    UserPid,
    /// No namespace.
    None,
}

impl Isolation {
    /// The name `--isolation` and the probe use.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Isolation::Pid => "pid",
            Isolation::UserPid => "user-pid",
            Isolation::None => "none",
        }
    }
}

/// Why [`prepare`] or [`enter_pid`] failed.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) reason: String,
    /// The process is in a user namespace already (its maps could not be written): it cannot
    /// go back, and must not start the command.
    pub(crate) changed: bool,
}

/// The first step into `isolation`, taken before any thread starts: [`Isolation::UserPid`]
/// moves this process into a new user namespace that maps its user and group to themselves,
/// which the kernel allows only to a single-threaded process.
pub(crate) fn prepare(isolation: Isolation) -> Result<(), Failure> {
    if isolation != Isolation::UserPid {
        return Ok(());
    }
    // Read before: in the new user namespace they show as the overflow ids until mapped.
    let (uid, gid) = (geteuid(), getegid());
    unshare(CloneFlags::CLONE_NEWUSER).map_err(|e| Failure {
        reason: format!("unshare(CLONE_NEWUSER): {e}"),
        changed: false,
    })?;
    let write = |file: &str, text: String| {
        std::fs::write(format!("/proc/self/{file}"), text).map_err(|e| Failure {
            reason: format!("writing /proc/self/{file} in the new user namespace: {e}"),
            changed: true,
        })
    };
    // An unprivileged process may map its own gid only once setgroups is denied.
    write("setgroups", "deny".to_owned())?;
    write("uid_map", format!("{uid} {uid} 1"))?;
    write("gid_map", format!("{gid} {gid} 1"))?;
    Ok(())
}

/// The second step: the children this thread starts from now on are members of a new PID
/// namespace. The kernel lets this process start no thread after it, so take it once the
/// threads it needs run (the log writer).
pub(crate) fn enter_pid(isolation: Isolation) -> Result<(), Failure> {
    if isolation == Isolation::None {
        return Ok(());
    }
    unshare(CloneFlags::CLONE_NEWPID).map_err(|e| Failure {
        reason: format!("unshare(CLONE_NEWPID): {e}"),
        // In a user namespace already: the command would lose its privileges for nothing.
        changed: isolation == Isolation::UserPid,
    })
}

/// Why a user namespace is not tried: it would take from the command the capabilities this
/// process holds (root's, or a service's ambient ones).
fn holds_capabilities() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let effective = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok());
    match effective {
        Some(0) => None,
        Some(_) => Some(
            "this process holds capabilities, which the command would lose in a user namespace"
                .to_owned(),
        ),
        None => Some("its capabilities cannot be read from /proc/self/status".to_owned()),
    }
}

/// What a supervisor of this process will be able to enter: a PID namespace; else, for a
/// process without capabilities, a user namespace with one. Attempted on this process.
fn attempt() -> Result<Isolation, String> {
    let refused = match enter_pid(Isolation::Pid) {
        Ok(()) => return Ok(Isolation::Pid),
        Err(f) => f.reason,
    };
    if let Some(why) = holds_capabilities() {
        return Err(format!("{refused}; no user namespace tried: {why}"));
    }
    // Root without capabilities: before Linux 5.12 it could map uid 0 to itself and give the
    // command every capability inside.
    if nix::unistd::geteuid().is_root() {
        return Err(format!(
            "{refused}; no user namespace tried: this process runs as root, which the command \
             would stay inside one"
        ));
    }
    match prepare(Isolation::UserPid).and_then(|()| enter_pid(Isolation::UserPid)) {
        Ok(()) => Ok(Isolation::UserPid),
        Err(f) => Err(format!("{refused}; {}", f.reason)),
    }
}

/// `leader __probe-pid-namespace`: prints `pid`, `user-pid`, or `none REASON`, and exits.
pub(crate) fn probe() -> u8 {
    match attempt() {
        Ok(isolation) => println!("{}", isolation.as_str()),
        Err(why) => println!("none {why}"),
    }
    0
}

fn parse_probe(line: &str) -> Result<Isolation, String> {
    match line.split_once(' ').unwrap_or((line, "")) {
        ("pid", "") => Ok(Isolation::Pid),
        ("user-pid", "") => Ok(Isolation::UserPid),
        ("none", why) if !why.is_empty() => Err(why.to_owned()),
        _ => Err(format!("the probe answered {line:?}")),
    }
}

/// Runs the probe: this process is multithreaded, and a user namespace is only for a
/// single-threaded one.
async fn probe_child() -> Result<Isolation, String> {
    let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
    let out = tokio::process::Command::new(exe)
        .arg("__probe-pid-namespace")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("cannot run the probe: {e}"))?;
    parse_probe(String::from_utf8_lossy(&out.stdout).trim_end())
}

/// The text of the start-up line that says what a refused or declined namespace leaves open.
const UNCOVERED: &str = "what the command starts survives SIGKILL of leader and its supervisor \
                         at once (pkill -9 leader); run it under systemd or unshare";

/// The protection every term of this `leader run` gets, decided at start-up: `On` refuses
/// to start (78) where the kernel refuses the namespace. The returned [`Note`] says which
/// protection is in force, once the store has been checked (so that a permanent store error
/// stays the only line a failed start prints).
pub(crate) async fn decide(mode: PidNamespaceMode) -> Result<(Isolation, Note), Exit> {
    if mode == PidNamespaceMode::Off {
        return Ok((Isolation::None, Note::Off));
    }
    match (probe_child().await, mode) {
        (Ok(isolation), _) => Ok((isolation, Note::InForce(isolation))),
        (Err(why), PidNamespaceMode::On) => Err(Exit::new(
            exit::CONFIG,
            format!(
                "--pid-namespace on: the kernel refuses this process a PID namespace ({why}); \
                 give leader CAP_SYS_ADMIN (root has it), or run it as a user without \
                 capabilities where user namespaces are allowed, or use --pid-namespace auto \
                 or off"
            ),
        )),
        (Err(why), _) => Ok((Isolation::None, Note::Refused(why))),
    }
}

/// The start-up line on the protection in force; see [`decide`].
#[derive(Debug)]
pub(crate) enum Note {
    /// `--pid-namespace off`.
    Off,
    /// A namespace is used.
    InForce(Isolation),
    /// The kernel refused it (the reason) under `auto`.
    Refused(String),
}

impl Note {
    /// Logs the line, at the default level.
    pub(crate) fn say(&self) {
        match self {
            Note::Off => info!(pid_namespace = "off", "--pid-namespace off: {UNCOVERED}"),
            Note::InForce(isolation) => {
                let how = match isolation {
                    Isolation::UserPid => ", in a user namespace that maps this user to itself",
                    _ => "",
                };
                info!(
                    pid_namespace = isolation.as_str(),
                    "the command runs in a PID namespace of its own{how}: nothing it starts \
                     outlives its supervisor"
                );
            }
            Note::Refused(why) => info!(
                pid_namespace = "none",
                "PID namespaces are refused here ({why}): {UNCOVERED}"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_answer_is_read_back() {
        assert_eq!(parse_probe("pid"), Ok(Isolation::Pid));
        assert_eq!(parse_probe("user-pid"), Ok(Isolation::UserPid));
        assert_eq!(
            parse_probe("none unshare(CLONE_NEWPID): EPERM: Operation not permitted"),
            Err("unshare(CLONE_NEWPID): EPERM: Operation not permitted".to_owned())
        );
        assert!(parse_probe("").is_err());
        assert!(parse_probe("none").is_err());
        assert!(parse_probe("pid extra").is_err());
        for isolation in [Isolation::Pid, Isolation::UserPid, Isolation::None] {
            let parsed = Isolation::from_str(isolation.as_str(), false);
            assert_eq!(parsed, Ok(isolation), "--isolation {}", isolation.as_str());
        }
    }
}
