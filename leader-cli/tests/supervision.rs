//! Every way operators stop `leader run`, on real processes with real signals: the old command
//! and the next leader's command never overlap in time, and nothing the old command started
//! survives.
//!
//! Each case runs two `leader run` instances, `a` and `b`, on one file store (ttl 3 s, renew
//! every 500 ms, grace 1.3 s). Their command is `tests/worker.py`: it takes 0.9 s to finish
//! after SIGTERM/SIGINT/SIGHUP, and starts a daemon (double fork, `setsid`) that ignores those
//! signals. Both write timestamped lines on CLOCK_BOOTTIME; the checks use those timestamps.
//!
//! `leader run` puts the command in a PID namespace of its own where the kernel allows it (the
//! default, `--pid-namespace auto`; as root here, everywhere): the cases that do not say
//! otherwise run in one. The pids the tests compare are the ones this process sees.
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
        self.args_for(id, &[], &self.worker())
    }

    /// The command `python3 worker.py LOG`.
    fn worker(&self) -> Vec<String> {
        vec![
            "python3".to_owned(),
            worker().display().to_string(),
            self.log().display().to_string(),
        ]
    }

    /// The arguments of `leader run ... EXTRA -- COMMAND`.
    fn args_for(&self, id: &str, extra: &[&str], command: &[String]) -> Vec<String> {
        let mut v: Vec<String> = ["run", "--store", &self.store(), "--id", id]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.extend(TIMING.iter().map(|s| s.to_string()));
        v.extend(extra.iter().map(|s| s.to_string()));
        v.push("--".to_owned());
        v.extend(command.iter().cloned());
        v
    }

    /// `program ARGS` as a shell would start it: in a process group of its own, stderr kept.
    fn spawn(&self, id: &str, program: &str, prefix: &[&str]) -> Child {
        self.spawn_args(id, program, prefix, self.args(id))
    }

    /// `program PREFIX ARGS`, as [`Case::spawn`].
    fn spawn_args(&self, id: &str, program: &str, prefix: &[&str], args: Vec<String>) -> Child {
        let child = Command::new(program)
            .args(prefix)
            .args(args)
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

    /// `leader run ... EXTRA -- python3 worker.py LOG`.
    fn leader_with(&self, id: &str, extra: &[&str]) -> Child {
        self.spawn_args(id, LEADER, &[], self.args_for(id, extra, &self.worker()))
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
        self.assert_protection_as_said("a");
        let b = self.leader("b");
        std::thread::sleep(Duration::from_millis(700));
        assert!(!self.has(2, "start"), "b must wait while a leads");
        (a, b)
    }

    fn stderr(&self, id: &str) -> String {
        std::fs::read_to_string(self.path().join(format!("{id}.stderr"))).unwrap_or_default()
    }

    /// The start-up line of `id` says whether the command runs in a PID namespace of its own,
    /// and the first term's command and daemon do as it says.
    fn assert_protection_as_said(&self, id: &str) {
        let log = self.stderr(id);
        let said = log.contains(IN_A_NAMESPACE);
        assert!(said || log.contains(UNCOVERED), "no start-up line:\n{log}");
        for kind in ["start", "daemon"] {
            let pid = self.pid_of(kind);
            assert_eq!(
                in_own_pid_namespace(pid),
                said,
                "the {kind} process {pid} vs the start-up line:\n{log}"
            );
        }
        if !said {
            eprintln!("NOTE: no PID namespace here; this case ran without one");
        }
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

/// The start-up line of `leader run` in a PID namespace of its own (as root, or in a user
/// namespace, which adds a few words before the colon).
const IN_A_NAMESPACE: &str = "the command runs in a PID namespace of its own";

/// The end of the start-up line without a PID namespace, whether refused or declined.
const UNCOVERED: &str = "what the command starts survives SIGKILL of leader and its supervisor \
                         at once (pkill -9 leader); run it under systemd or unshare";

/// Whether `pid` is in another PID namespace than this process.
fn in_own_pid_namespace(pid: i32) -> bool {
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/pid")).unwrap();
    ns(&pid.to_string()) != ns("self")
}

/// What `pkill -9 leader` kills: every process of `leader`'s tree that runs the `leader`
/// binary (`leader`, its supervisor, and the init of the command's PID namespace, if any).
fn leader_processes(leader: &Child, binary: &Path) -> Vec<i32> {
    let binary = std::fs::canonicalize(binary).unwrap();
    let mut all = descendants(leader.id() as i32);
    all.insert(0, leader.id() as i32);
    all.into_iter()
        .filter(|p| std::fs::read_link(format!("/proc/{p}/exe")).is_ok_and(|e| e == binary))
        .collect()
}

/// SIGKILL to each of `pids`, one right after the other, as `pkill -9` does.
fn sigkill_all(pids: &[i32]) {
    for pid in pids {
        let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
    }
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

/// `pkill -9 leader`: SIGKILL of every process of ours at once, `leader`, its supervisor and
/// the init of the command's PID namespace (`--pid-namespace on`). The kernel kills everything
/// in the namespace with its init: the command and its daemon (double fork, `setsid`, SIGTERM
/// ignored) are gone at once.
#[test]
fn sigkill_of_every_leader_process_leaves_nothing_of_the_command() {
    let case = Case::new();
    let mut a = case.leader_with("a", &["--pid-namespace", "on"]);
    case.wait_for_first_term();
    let log = case.stderr("a");
    assert!(
        log.contains(
            "the command runs in a PID namespace of its own: nothing it starts outlives its \
             supervisor"
        ),
        "{log}"
    );
    case.assert_protection_as_said("a");
    let (command, daemon) = (case.pid_of("start"), case.pid_of("daemon"));
    let ours = leader_processes(&a, Path::new(LEADER));
    assert_eq!(ours.len(), 3, "leader, supervisor, init: {ours:?}");
    sigkill_all(&ours);
    assert_eq!(exit_status(&mut a, Duration::from_secs(5)), Err(9));
    let took = wait_for(
        "the command and its daemon to die with the namespace's init",
        Duration::from_secs(2),
        || !alive(command) && !alive(daemon),
    );
    eprintln!("MEASURED pkill -9 leader: the command's tree gone {took:?} after the exit");
}

/// SIGKILL of `leader` and its supervisor at once, not of the namespace's init: the kernel
/// kills the init (`PR_SET_PDEATHSIG`), and with it everything in the namespace.
#[test]
fn sigkill_of_leader_and_its_supervisor_leaves_nothing_of_the_command() {
    let case = Case::new();
    let mut a = case.leader("a");
    case.wait_for_first_term();
    case.assert_protection_as_said("a");
    let supervisor = supervisor_of(&a);
    let ours = leader_processes(&a, Path::new(LEADER));
    let (command, daemon) = (case.pid_of("start"), case.pid_of("daemon"));
    sigkill_all(&[a.id() as i32, supervisor]);
    assert_eq!(exit_status(&mut a, Duration::from_secs(5)), Err(9));
    wait_for(
        "the init, the command and its daemon to die",
        Duration::from_secs(2),
        || ours.iter().chain([&command, &daemon]).all(|p| !alive(*p)),
    );
}

/// The escape where there is no PID namespace (`--pid-namespace off`, or where the kernel
/// refuses one), as the start-up line says: SIGKILL of `leader` *and* its supervisor at once
/// (`pkill -9 leader`) kills the command itself (PR_SET_PDEATHSIG), but nothing is left to stop
/// what the command started: the daemon survives. This test pins that, so that the docs'
/// wording stays true.
#[test]
fn without_a_pid_namespace_sigkill_of_every_leader_process_leaves_the_daemon() {
    let case = Case::new();
    let mut a = case.leader_with("a", &["--pid-namespace", "off"]);
    case.wait_for_first_term();
    let log = case.stderr("a");
    assert!(
        log.contains(&format!("--pid-namespace off: {UNCOVERED}")),
        "{log}"
    );
    case.assert_protection_as_said("a");
    let command = case.pid_of("start");
    let daemon = case.pid_of("daemon");
    let ours = leader_processes(&a, Path::new(LEADER));
    assert_eq!(ours, vec![a.id() as i32, supervisor_of(&a)]);
    sigkill_all(&ours);
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
        "the daemon was stopped after all: update the docs' escape paragraph"
    );
}

/// The recipe the start-up line gives where `leader run` has no PID namespace: the command
/// under `unshare --pid --fork --kill-child`. When the supervisor dies, unshare dies with it,
/// the namespace's first process gets its kill-child signal, and the kernel kills everything
/// in the namespace, the daemon included.
#[test]
fn without_a_pid_namespace_the_unshare_recipe_closes_the_escape() {
    let case = Case::new();
    let mut args = case.args_for("a", &["--pid-namespace", "off"], &case.worker());
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
            "trap '' TERM; read -r me _ < /proc/self/stat; echo $me > {}; \
             while :; do echo filling the pipe >&2; done",
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

/// Whether this test runs as root (the cases that change user or drop capabilities need it).
fn root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    eprintln!("SKIPPED: needs root, to run leader as another user or without CAP_SYS_ADMIN");
    false
}

/// Where the kernel refuses a PID namespace (here: root without CAP_SYS_ADMIN, as in a
/// container, where a user namespace would take the command's capabilities): `on` refuses to
/// start (78) and says why; `auto` says so at start-up and runs the command without one, and
/// the escape stays open.
#[test]
fn where_the_kernel_refuses_a_pid_namespace_on_refuses_and_auto_says_so() {
    if !root() {
        return;
    }
    let case = Case::new();
    let no_sys_admin = ["--bounding-set", "-sys_admin", LEADER];
    let on = case.args_for("on", &["--pid-namespace", "on"], &case.worker());
    let mut refused = case.spawn_args("on", "setpriv", &no_sys_admin, on);
    assert_eq!(exit_code(&mut refused, Duration::from_secs(10)), 78);
    let log = case.stderr("on");
    assert!(
        log.contains("--pid-namespace on: the kernel refuses this process a PID namespace"),
        "{log}"
    );
    assert!(log.contains("EPERM"), "{log}");
    assert!(
        case.events().is_empty(),
        "a command ran: {:?}",
        case.events()
    );

    let mut a = case.spawn("a", "setpriv", &no_sys_admin);
    case.wait_for_first_term();
    let log = case.stderr("a");
    assert!(
        log.contains("PID namespaces are refused here (unshare(CLONE_NEWPID): EPERM"),
        "{log}"
    );
    case.assert_protection_as_said("a");
    let (command, daemon) = (case.pid_of("start"), case.pid_of("daemon"));
    sigkill_all(&leader_processes(&a, Path::new(LEADER)));
    assert_eq!(exit_status(&mut a, Duration::from_secs(5)), Err(9));
    wait_for("the command to die", Duration::from_secs(2), || {
        !alive(command)
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        alive(daemon),
        "the daemon is stopped after all: update the docs"
    );
}

/// An unprivileged user: the command runs in a PID namespace inside a user namespace that
/// maps the user to itself (same uid, no capability), and `pkill -9 leader` leaves nothing of
/// it either. (`leader` runs as nobody, from a copy it can read; the command is a shell.)
#[test]
fn as_an_unprivileged_user_the_command_runs_in_a_user_and_pid_namespace() {
    if !root() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let case = Case::new();
    let open = std::fs::Permissions::from_mode(0o777);
    std::fs::set_permissions(case.path(), open.clone()).unwrap();
    let binary = case.path().join("leader");
    std::fs::copy(LEADER, &binary).unwrap();
    std::fs::set_permissions(&binary, open).unwrap();
    let log = case.log().display().to_string();
    let uid = case.path().join("uid");
    // Lines as the worker's: KIND TOKEN PID TIME.
    let script = format!(
        "id -u > {uid}; read -r me _ < /proc/self/stat; \
         echo \"start $LEADER_FENCING_TOKEN $me 0\" >> {log}; \
         setsid sh -c 'trap \"\" TERM INT HUP; read -r me _ < /proc/self/stat; \
         echo \"daemon $LEADER_FENCING_TOKEN $me 0\" >> {log}; exec sleep 60' & \
         while :; do sleep 0.1; done",
        uid = uid.display()
    );
    let command = ["sh".to_owned(), "-c".to_owned(), script];
    let nobody = ["--reuid=65534", "--regid=65534", "--clear-groups"];
    let mut prefix = nobody.to_vec();
    prefix.push(binary.to_str().unwrap());
    let mut a = case.spawn_args("a", "setpriv", &prefix, case.args_for("a", &[], &command));
    case.wait_for_first_term();
    let stderr = case.stderr("a");
    assert!(
        stderr.contains(
            "the command runs in a PID namespace of its own, in a user namespace that maps \
             this user to itself: nothing it starts outlives its supervisor"
        ),
        "{stderr}"
    );
    case.assert_protection_as_said("a");
    let uid = std::fs::read_to_string(&uid).unwrap();
    assert_eq!(uid.trim(), "65534", "the command keeps its uid");
    let (command, daemon) = (case.pid_of("start"), case.pid_of("daemon"));
    let ours = leader_processes(&a, &binary);
    assert_eq!(ours.len(), 3, "leader, supervisor, init: {ours:?}");
    sigkill_all(&ours);
    assert_eq!(exit_status(&mut a, Duration::from_secs(5)), Err(9));
    wait_for(
        "the command and its daemon to die with the namespace's init",
        Duration::from_secs(2),
        || !alive(command) && !alive(daemon),
    );
}

/// A command that exits by itself while a process it started runs on: what it left gets the
/// stop signal and its grace period, as at the end of a term (SIGKILL only for what is still
/// there after it), and `leader` exits with the command's own code. In a PID namespace, the
/// namespace's init reports the code and waits for the rest rather than ending the namespace.
#[test]
fn what_an_exited_command_left_gets_its_grace_period() {
    let case = Case::new();
    let worker = case.worker().join(" ");
    let command = [
        "sh".to_owned(),
        "-c".to_owned(),
        format!("{worker} & sleep 0.5; exit 3"),
    ];
    let mut a = case.spawn_args("a", LEADER, &[], case.args_for("a", &[], &command));
    case.wait_for_first_term();
    case.assert_protection_as_said("a");
    assert_eq!(
        exit_code(&mut a, Duration::from_secs(10)),
        3,
        "{}",
        case.stderr("a")
    );
    let events = case.events();
    let signalled = events.iter().find(|e| e.kind.starts_with("signal"));
    let stop = events.iter().find(|e| e.kind == "stop");
    let (Some(signalled), Some(stop)) = (signalled, stop) else {
        panic!("the worker was not stopped gracefully: {events:?}");
    };
    assert_eq!(signalled.kind, "signal15", "SIGTERM first");
    assert!(stop.t - signalled.t >= 900_000_000, "{events:?}");
    for e in &events {
        assert!(!alive(e.pid), "process {} survived", e.pid);
    }
}

/// SIGUSR1 to `leader` is passed on to the command's process group, in its PID namespace as
/// without: the worker has no handler for it and dies of it, and `leader` exits with its code,
/// 128+10 (what its daemon left is killed after the grace period).
#[test]
fn sigusr1_reaches_the_command_and_its_code_comes_back() {
    let case = Case::new();
    let mut a = case.leader("a");
    case.wait_for_first_term();
    case.assert_protection_as_said("a");
    signal(&a, Signal::SIGUSR1);
    assert_eq!(
        exit_code(&mut a, Duration::from_secs(10)),
        128 + 10,
        "{}",
        case.stderr("a")
    );
    for e in case.events() {
        assert!(!alive(e.pid), "process {} survived", e.pid);
    }
}
