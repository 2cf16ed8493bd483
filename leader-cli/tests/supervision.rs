//! Every way operators stop `leader run`, on real processes with real signals: the old command
//! and the next leader's command never overlap in time, and nothing the old command started
//! survives.
//!
//! Each case runs two `leader run` instances, `a` and `b`, on one file store (ttl 3 s, renew
//! every 500 ms, grace 1.3 s). Their command is `tests/worker.py`: it takes 0.9 s to finish
//! after SIGTERM/SIGINT/SIGHUP, and starts a daemon (double fork, `setsid`) that ignores those
//! signals. Both write timestamped lines on CLOCK_BOOTTIME; the checks use those timestamps.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr,
    clippy::disallowed_methods // real processes need real time
)]

mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

const TIMING: [&str; 8] = [
    "--ttl",
    "3s",
    "--renew-every",
    "500ms",
    "--grace",
    "1300ms",
    "--retry-every",
    "600ms",
];

struct Case {
    dir: tempfile::TempDir,
    /// Every process a test started, killed with all its descendants when the case ends,
    /// so that a failing test leaves nothing behind.
    spawned: std::cell::RefCell<Vec<i32>>,
}

impl Drop for Case {
    fn drop(&mut self) {
        let mut all: Vec<i32> = self.events().iter().map(|e| e.pid).collect();
        for pid in self.spawned.borrow().iter() {
            all.extend(descendants(*pid));
            all.push(*pid);
        }
        for pid in all {
            let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

impl Case {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            spawned: Default::default(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn log(&self) -> PathBuf {
        self.path().join("worker.log")
    }

    fn store(&self) -> String {
        format!("file://{}/job", self.path().display())
    }

    /// The arguments of `leader run ... -- python3 worker.py LOG`.
    fn args(&self, id: &str) -> Vec<String> {
        let mut v: Vec<String> = ["run", "--store", &self.store(), "--id", id]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.extend(TIMING.iter().map(|s| s.to_string()));
        v.extend([
            "--".to_owned(),
            "python3".to_owned(),
            worker().display().to_string(),
            self.log().display().to_string(),
        ]);
        v
    }

    /// `program ARGS` as a shell would start it: in a process group of its own, stderr kept.
    fn spawn(&self, id: &str, program: &str, prefix: &[&str]) -> Child {
        let child = Command::new(program)
            .args(prefix)
            .args(self.args(id))
            .env("LEADER_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.path().join(format!("{id}.stderr"))).unwrap())
            .process_group(0)
            .spawn()
            .unwrap();
        self.spawned.borrow_mut().push(child.id() as i32);
        child
    }

    fn leader(&self, id: &str) -> Child {
        self.spawn(id, LEADER, &[])
    }

    fn events(&self) -> Vec<Event> {
        events(&self.log())
    }

    fn has(&self, token: u64, kind: &str) -> bool {
        self.events()
            .iter()
            .any(|e| e.token == token && e.kind == kind)
    }

    /// Waits until the first term's command and its daemon run.
    fn wait_for_first_term(&self) {
        wait_for("a's command and daemon", Duration::from_secs(10), || {
            self.has(1, "start") && self.has(1, "daemon")
        });
    }

    /// The pid that wrote the first line of `kind` (the command's `start`, the `daemon`).
    fn pid_of(&self, kind: &str) -> i32 {
        self.events()
            .iter()
            .find(|e| e.kind == kind)
            .unwrap_or_else(|| panic!("no {kind} line"))
            .pid
    }

    /// Starts `a`, waits until its command and daemon run, then starts `b` (a follower).
    fn two_leaders(&self) -> (Child, Child) {
        let a = self.leader("a");
        self.wait_for_first_term();
        let b = self.leader("b");
        std::thread::sleep(Duration::from_millis(700));
        assert!(!self.has(2, "start"), "b must wait while a leads");
        (a, b)
    }

    fn stderr(&self, id: &str) -> String {
        std::fs::read_to_string(self.path().join(format!("{id}.stderr"))).unwrap_or_default()
    }

    /// Waits for b's command, then checks the invariants and stops b. Returns the time from
    /// `sent` (CLOCK_BOOTTIME) to b's start. `a_exited`: when `a` was seen to exit, if it did.
    fn check_takeover(&self, mut b: Child, sent: u64, a_exited: Option<u64>, what: &str) -> f64 {
        wait_for("b's command", Duration::from_secs(15), || {
            self.has(2, "start")
        });
        // Let both terms' processes act for a while, so that an overlap would show.
        std::thread::sleep(Duration::from_millis(500));
        let events = self.events();
        assert_no_overlap(&events);
        let terms = by_term(&events);
        let old = &terms[&1];
        for pid in &old.pids {
            assert!(
                !alive(*pid),
                "{what}: process {pid} of the old term survived"
            );
        }
        assert!(
            old.pids.len() >= 2,
            "the old term's command and daemon both wrote: {old:?}"
        );
        let new = &terms[&2];
        let took = (new.started_at.unwrap() - sent) as f64 / 1e9;
        let gap = (new.first - old.last) as f64 / 1e9;
        let exited = a_exited.map_or("-".to_owned(), |t| {
            format!("{:.3}", t.saturating_sub(sent) as f64 / 1e9)
        });
        eprintln!(
            "MEASURED {what}: old term's last action {:.3} s after the signal, leader a exited {exited} s after it, new command started {took:.3} s after it (gap {gap:.3} s, overlap 0)",
            (old.last.saturating_sub(sent)) as f64 / 1e9
        );
        signal(&b, Signal::SIGTERM);
        assert_eq!(exit_code(&mut b, Duration::from_secs(10)), 128 + 15);
        for pid in &new.pids {
            assert!(!alive(*pid), "b's process {pid} survived b's SIGTERM");
        }
        took
    }
}

/// Ctrl-C, `kill -- -PGID`, a closed terminal: the signal reaches `leader`'s whole process
/// group; the command gets it, finishes its work, the daemon is killed after the grace
/// period, and only then is the lease released.
fn signal_to_the_group(sig: Signal) {
    let case = Case::new();
    let (mut a, b) = case.two_leaders();
    let sent = boottime_ns();
    killpg(Pid::from_raw(a.id() as i32), sig).unwrap();
    assert_eq!(
        exit_code(&mut a, Duration::from_secs(10)),
        128 + sig as i32,
        "{}",
        case.stderr("a")
    );
    let exited = boottime_ns();
    let events = case.events();
    assert!(
        events.iter().any(|e| e.token == 1 && e.kind == "stop"),
        "the command got the signal and finished its work: {events:?}"
    );
    let took = case.check_takeover(
        b,
        sent,
        Some(exited),
        &format!("{sig} to leader's process group"),
    );
    // Graceful: the release comes right after the daemon's SIGKILL at grace (1.3 s), not a
    // lease expiry (3 s).
    assert!(
        took < 2.8,
        "handover took {took:.3} s: the lease was not released"
    );
}

#[test]
fn sigint_to_the_group() {
    signal_to_the_group(Signal::SIGINT);
}

#[test]
fn sigterm_to_the_group() {
    signal_to_the_group(Signal::SIGTERM);
}

#[test]
fn sighup_to_the_group() {
    signal_to_the_group(Signal::SIGHUP);
}

/// SIGKILL of `leader`'s whole process group: `leader` dies without releasing; the supervisor,
/// in a session of its own, stops the command and the daemon, and the lease expires.
#[test]
fn sigkill_to_the_group() {
    let case = Case::new();
    let (mut a, b) = case.two_leaders();
    let sent = boottime_ns();
    killpg(Pid::from_raw(a.id() as i32), Signal::SIGKILL).unwrap();
    assert_eq!(exit_status(&mut a, Duration::from_secs(5)), Err(9));
    let took = case.check_takeover(b, sent, None, "SIGKILL to leader's process group");
    assert!(
        took > 1.5,
        "the lease was released although leader was killed"
    );
}

/// SIGKILL of the supervisor alone: the kernel kills the command (PR_SET_PDEATHSIG), `leader`
/// (a child subreaper) kills the re-parented daemon, leaves the lease to expire (`docs/protocol.md`)
/// and exits 75.
#[test]
fn sigkill_of_the_supervisor_alone() {
    let case = Case::new();
    let (mut a, b) = case.two_leaders();
    let supervisor = descendants(a.id() as i32)
        .into_iter()
        .find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                .unwrap_or_default()
                .contains("__supervise")
        })
        .expect("the supervisor process");
    let sent = boottime_ns();
    kill(Pid::from_raw(supervisor), Signal::SIGKILL).unwrap();
    assert_eq!(
        exit_code(&mut a, Duration::from_secs(10)),
        75,
        "{}",
        case.stderr("a")
    );
    let exited = boottime_ns();
    let took = case.check_takeover(b, sent, Some(exited), "SIGKILL of the supervisor alone");
    assert!(took > 1.5, "the lease was released, not left to expire");
}

/// systemd's stop (KillMode=control-group) and `pkill leader`: SIGTERM to every process at
/// once, `leader`, the supervisor, the command and the daemon. The supervisor must not die of
/// it; the release waits until everything is gone.
#[test]
fn sigterm_to_every_process_at_once() {
    let case = Case::new();
    let (mut a, b) = case.two_leaders();
    let mut all = descendants(a.id() as i32);
    all.push(a.id() as i32);
    // The daemon left the tree only in the session sense: it is still below the supervisor.
    let daemon = case.pid_of("daemon");
    assert!(all.contains(&daemon), "the daemon is below the supervisor");
    let sent = boottime_ns();
    for pid in &all {
        let _ = kill(Pid::from_raw(*pid), Signal::SIGTERM);
    }
    assert_eq!(
        exit_code(&mut a, Duration::from_secs(10)),
        128 + 15,
        "{}",
        case.stderr("a")
    );
    let exited = boottime_ns();
    assert!(case.has(1, "stop"), "the command finished its work");
    let took = case.check_takeover(
        b,
        sent,
        Some(exited),
        "SIGTERM to every process (systemd, pkill)",
    );
    assert!(
        took < 2.8,
        "handover took {took:.3} s: the lease was not released"
    );
}

/// `timeout 3 leader run ...`: timeout signals `leader`, then its own process group.
#[test]
fn timeout_stops_leader() {
    let case = Case::new();
    let start = boottime_ns();
    let mut a = case.spawn("a", "timeout", &["2.5", LEADER]);
    wait_for("a's command", Duration::from_secs(10), || {
        case.has(1, "daemon")
    });
    let b = case.leader("b");
    assert_eq!(
        exit_code(&mut a, Duration::from_secs(10)),
        124,
        "{}",
        case.stderr("a")
    );
    let exited = boottime_ns();
    // timeout signals leader and then its process group: one stop, not an escalation.
    assert!(case.has(1, "stop"), "the command finished its work");
    let sent = start + 2_500_000_000;
    case.check_takeover(b, sent, Some(exited), "timeout 2.5 leader run");
}

/// SIGSTOP of `leader`'s process group: renewals stop; the supervisor (not in that group)
/// stops the command at deadline - grace and kills the daemon at the deadline, before `b` can
/// take over. Resumed, `leader` learns that its term is over and exits 75.
#[test]
fn sigstop_of_the_group() {
    let case = Case::new();
    let (mut a, b) = case.two_leaders();
    let sent = boottime_ns();
    killpg(Pid::from_raw(a.id() as i32), Signal::SIGSTOP).unwrap();
    wait_for("b's command", Duration::from_secs(15), || {
        case.has(2, "start")
    });
    let daemon = case.pid_of("daemon");
    assert!(
        !alive(daemon),
        "the daemon outlived the frozen leader's term"
    );
    killpg(Pid::from_raw(a.id() as i32), Signal::SIGCONT).unwrap();
    assert_eq!(
        exit_code(&mut a, Duration::from_secs(10)),
        75,
        "{}",
        case.stderr("a")
    );
    case.check_takeover(b, sent, None, "SIGSTOP of leader's process group");
}

/// A real terminal: `leader run` typed into a shell under tmux, then Ctrl-C.
#[test]
fn ctrl_c_in_a_terminal() {
    let case = Case::new();
    let socket = case.path().join("tmux.sock");
    let tmux = |args: &[&str]| {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&socket)
            .args(args)
            .output()
            .expect("tmux is needed for this test; scripts/test provides it");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    tmux(&[
        "new-session",
        "-d",
        "-s",
        "t",
        "-x",
        "200",
        "-y",
        "50",
        "sh",
    ]);
    let exit_file = case.path().join("exit");
    let line = format!(
        "LEADER_LOG=info {LEADER} run --store {} --id a {} -- python3 {} {} 2> {}; echo $? > {}",
        case.store(),
        TIMING.join(" "),
        worker().display(),
        case.log().display(),
        case.path().join("a.stderr").display(),
        exit_file.display()
    );
    tmux(&["send-keys", "-t", "t", &line, "Enter"]);
    case.wait_for_first_term();
    let b = case.leader("b");
    std::thread::sleep(Duration::from_millis(700));
    let sent = boottime_ns();
    tmux(&["send-keys", "-t", "t", "C-c"]);
    wait_for(
        "leader's exit in the terminal",
        Duration::from_secs(10),
        || std::fs::read_to_string(&exit_file).is_ok_and(|s| !s.trim().is_empty()),
    );
    assert_eq!(
        std::fs::read_to_string(&exit_file).unwrap().trim(),
        "130",
        "{}",
        case.stderr("a")
    );
    let exited = boottime_ns();
    assert!(case.has(1, "stop"), "the command got SIGINT and finished");
    let took = case.check_takeover(b, sent, Some(exited), "Ctrl-C in tmux");
    assert!(
        took < 2.8,
        "handover took {took:.3} s: the lease was not released"
    );
    tmux(&["kill-server"]);
}

fn supervisor_of(leader: &Child) -> i32 {
    descendants(leader.id() as i32)
        .into_iter()
        .find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                .unwrap_or_default()
                .contains("__supervise")
        })
        .expect("the supervisor process")
}

/// The one documented escape: SIGKILL of `leader` *and* its supervisor at once (`pkill -9
/// leader`). The kernel kills the command itself (PR_SET_PDEATHSIG), but nothing is left to
/// stop what the command started: the daemon survives. This test pins that, so that the
/// README's wording stays true.
#[test]
fn sigkill_of_every_leader_process_kills_the_command_but_not_its_daemon() {
    let case = Case::new();
    let mut a = case.leader("a");
    case.wait_for_first_term();
    let supervisor = supervisor_of(&a);
    let command = case.pid_of("start");
    let daemon = case.pid_of("daemon");
    kill(Pid::from_raw(a.id() as i32), Signal::SIGKILL).unwrap();
    kill(Pid::from_raw(supervisor), Signal::SIGKILL).unwrap();
    assert_eq!(exit_status(&mut a, Duration::from_secs(5)), Err(9));
    wait_for(
        "the command to die with its supervisor",
        Duration::from_secs(2),
        || !alive(command),
    );
    std::thread::sleep(Duration::from_millis(300));
    let escaped = alive(daemon);
    let _ = kill(Pid::from_raw(daemon), Signal::SIGKILL);
    assert!(
        escaped,
        "the daemon was stopped after all: update the README's escape paragraph"
    );
}

/// The recipe the README gives for that escape: the command in a PID namespace of its own
/// (`unshare --pid --fork --kill-child`). When the supervisor dies, unshare dies with it, the
/// namespace's first process gets its kill-child signal, and the kernel kills everything in
/// the namespace, the daemon included.
#[test]
fn a_pid_namespace_closes_the_sigkill_everything_escape() {
    let case = Case::new();
    let mut args = case.args("a");
    let sep = args.iter().position(|x| x == "--").unwrap();
    args.splice(
        sep + 1..sep + 1,
        ["unshare", "--pid", "--fork", "--kill-child=SIGKILL"].map(String::from),
    );
    let mut a = Command::new(LEADER)
        .args(&args)
        .env("LEADER_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(case.path().join("a.stderr")).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    case.spawned.borrow_mut().push(a.id() as i32);
    case.wait_for_first_term();
    let below: Vec<i32> = descendants(a.id() as i32);
    let supervisor = supervisor_of(&a);
    kill(Pid::from_raw(a.id() as i32), Signal::SIGKILL).unwrap();
    kill(Pid::from_raw(supervisor), Signal::SIGKILL).unwrap();
    assert_eq!(exit_status(&mut a, Duration::from_secs(5)), Err(9));
    wait_for(
        "every process of the command to die",
        Duration::from_secs(3),
        || below.iter().all(|p| !alive(*p)),
    );
}

/// The supervisor frozen alone (SIGSTOP to its pid) cannot stop the command; when the term
/// ends, `leader` kills the supervisor itself halfway through the margin, the kernel kills the
/// command, and `leader` kills the re-parented daemon.
#[test]
fn a_frozen_supervisor_is_killed_by_leader_when_the_term_ends() {
    let case = Case::new();
    let mut a = case.leader("a");
    case.wait_for_first_term();
    let supervisor = supervisor_of(&a);
    kill(Pid::from_raw(supervisor), Signal::SIGSTOP).unwrap();
    // An operator deletes the lease: a's next renew finds it gone and the term ends at once.
    std::fs::remove_file(case.path().join("job.lease")).unwrap();
    let ended = boottime_ns();
    assert_eq!(
        exit_code(&mut a, Duration::from_secs(10)),
        75,
        "{}",
        case.stderr("a")
    );
    let events = case.events();
    let last = events.iter().map(|e| e.t).max().unwrap();
    for e in &events {
        assert!(!alive(e.pid), "process {} of the term survived", e.pid);
    }
    eprintln!(
        "MEASURED frozen supervisor: last action {:.3} s after the lease was deleted (ttl 3 s, margin 0.6 s)",
        (last.saturating_sub(ended)) as f64 / 1e9
    );
    // The term's deadline is at most ttl - margin = 2.4 s after the last renew; the backstop
    // acts 0.3 s later.
    assert!(
        last - ended < 3_000_000_000,
        "the command ran on past the term"
    );
    assert!(
        case.stderr("a")
            .contains("did not stop the command in time"),
        "{}",
        case.stderr("a")
    );
}

/// A supervisor frozen alone, then `leader` asked to stop: `leader` does not wait forever; a
/// little after the grace period it kills the supervisor (the kernel kills the command), kills
/// the rest itself, leaves the lease to expire and exits 128+15.
#[test]
fn a_stop_with_a_frozen_supervisor_ends_after_the_grace_period() {
    let case = Case::new();
    let (mut a, b) = case.two_leaders();
    let supervisor = supervisor_of(&a);
    kill(Pid::from_raw(supervisor), Signal::SIGSTOP).unwrap();
    let sent = boottime_ns();
    signal(&a, Signal::SIGTERM);
    assert_eq!(
        exit_code(&mut a, Duration::from_secs(10)),
        128 + 15,
        "{}",
        case.stderr("a")
    );
    let exited = boottime_ns();
    assert!(
        case.stderr("a")
            .contains("did not stop the command in time"),
        "{}",
        case.stderr("a")
    );
    let took = case.check_takeover(b, sent, Some(exited), "SIGTERM with the supervisor frozen");
    assert!(took > 1.5, "the lease was released, not left to expire");
}

/// A stderr that nobody reads (a pager waiting, a stuck log collector) must not stop the
/// supervisor: `leader` is frozen, the command fills the pipe, and the command is still
/// stopped at the deadline.
#[test]
fn a_blocked_stderr_does_not_stop_the_supervisor() {
    let case = Case::new();
    let (read_end, write_end) = std::io::pipe().unwrap();
    let pid_file = case.path().join("pid");
    let mut a = Command::new(LEADER)
        .args(["run", "--store", &case.store(), "--id", "a"])
        .args(TIMING)
        .args(["--", "sh", "-c"])
        .arg(format!(
            "trap '' TERM; echo $$ > {}; while :; do echo filling the pipe >&2; done",
            pid_file.display()
        ))
        .env("LEADER_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(write_end)
        .process_group(0)
        .spawn()
        .unwrap();
    case.spawned.borrow_mut().push(a.id() as i32);
    wait_for("the command", Duration::from_secs(10), || {
        std::fs::read_to_string(&pid_file).is_ok_and(|s| s.ends_with('\n'))
    });
    let command: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The pipe (64 KiB) is full within milliseconds; now renewals stop.
    std::thread::sleep(Duration::from_millis(300));
    killpg(Pid::from_raw(a.id() as i32), Signal::SIGSTOP).unwrap();
    let frozen = boottime_ns();
    // The deadline is at most ttl - margin = 2.4 s after the last renew.
    wait_for("the command to be stopped", Duration::from_secs(4), || {
        !alive(command)
    });
    eprintln!(
        "MEASURED blocked stderr: command stopped {:.3} s after leader froze",
        (boottime_ns() - frozen) as f64 / 1e9
    );
    killpg(Pid::from_raw(a.id() as i32), Signal::SIGKILL).unwrap();
    let _ = a.wait();
    drop(read_end);
}
