//! Process-level tests of `leader` on the file store: real processes, real signals, short ttl.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods // real processes need real time
)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const LEADER: &str = env!("CARGO_BIN_EXE_leader");

struct Dir(tempfile::TempDir);

impl Dir {
    fn new() -> Self {
        Self(tempfile::tempdir().unwrap())
    }
    fn path(&self) -> &Path {
        self.0.path()
    }
    fn store(&self) -> String {
        format!("file://{}/job", self.path().display())
    }
    fn file(&self, name: &str) -> PathBuf {
        self.path().join(name)
    }
    fn lines(&self, name: &str) -> Vec<String> {
        std::fs::read_to_string(self.file(name))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

/// `leader run` with ttl 2 s; the child appends "HOLDER TOKEN PID" to `starts`, then runs
/// `then`.
fn candidate(dir: &Dir, id: &str, extra: &[&str], then: &str) -> Child {
    let script = format!(
        "echo \"$LEADER_HOLDER_ID $LEADER_FENCING_TOKEN $$\" >> {starts}; {then}",
        starts = dir.file("starts").display()
    );
    Command::new(LEADER)
        .args(["run", "--store", &dir.store(), "--ttl", "2s", "--id", id])
        .args(extra)
        .args(["--", "sh", "-c", &script])
        .env("LEADER_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

/// Whether the process exists and is not a zombie (a killed orphan stays a zombie until the
/// init process reaps it).
fn alive(pid: i32) -> bool {
    if kill(Pid::from_raw(pid), None).is_err() {
        return false;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit(')')
        .next()
        .and_then(|s| s.split_whitespace().next());
    !matches!(state, Some("Z") | None)
}

fn signal(child: &Child, sig: Signal) {
    kill(Pid::from_raw(child.id() as i32), sig).unwrap();
}

fn exit_code(child: &mut Child, limit: Duration) -> i32 {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().unwrap_or(-1);
        }
        assert!(
            start.elapsed() < limit,
            "`leader` did not exit within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn parse(line: &str) -> (String, u64, i32) {
    let mut p = line.split(' ');
    (
        p.next().unwrap().to_owned(),
        p.next().unwrap().parse().unwrap(),
        p.next().unwrap().parse().unwrap(),
    )
}

fn run_to_end(args: &[&str]) -> i32 {
    Command::new(LEADER)
        .args(args)
        .env("LEADER_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .code()
        .unwrap_or(-1)
}

#[test]
fn exit_codes() {
    let dir = Dir::new();
    let store = dir.store();
    assert_eq!(
        run_to_end(&["run", "--store", "ftp://x/y", "--", "true"]),
        64
    );
    assert_eq!(
        run_to_end(&["run", "--store", "file://relative/k", "--", "true"]),
        64
    );
    assert_eq!(
        run_to_end(&["run", "--store", "gs://bucket-only", "--", "true"]),
        64
    );
    assert_eq!(run_to_end(&["run", "--store", &store]), 64, "no command");
    assert_eq!(
        run_to_end(&["run", "--store", "file:///no/such/folder/k", "--", "true"]),
        69
    );
    assert_eq!(
        run_to_end(&[
            "run", "--store", &store, "--ttl", "2s", "--grace", "2s", "--", "true"
        ]),
        78
    );
    assert_eq!(
        run_to_end(&[
            "run",
            "--store",
            &store,
            "--ttl",
            "2s",
            "--renew-every",
            "2s",
            "--",
            "true"
        ]),
        78
    );
    assert_eq!(
        run_to_end(&["run", "--store", &store, "--", "sh", "-c", "exit 7"]),
        7
    );
    assert_eq!(
        run_to_end(&["run", "--store", &store, "--", "sh", "-c", "kill -9 $$"]),
        128 + 9
    );
    assert_eq!(run_to_end(&["status", "--store", &store, "--json"]), 0);

    // --wait runs out while another instance leads.
    let mut holder = candidate(&dir, "holder", &[], "sleep 30");
    wait_for("the holder's child", Duration::from_secs(10), || {
        !dir.lines("starts").is_empty()
    });
    assert_eq!(
        run_to_end(&[
            "run", "--store", &store, "--ttl", "2s", "--wait", "1s", "--", "true"
        ]),
        73
    );
    signal(&holder, Signal::SIGTERM);
    assert_eq!(exit_code(&mut holder, Duration::from_secs(5)), 128 + 15);
}

#[test]
fn one_child_at_a_time_and_sigkill_fails_over_with_a_higher_token() {
    let dir = Dir::new();
    let mut procs: Vec<Child> = (0..3)
        .map(|i| candidate(&dir, &format!("c{i}"), &[], "sleep 60"))
        .collect();
    wait_for("a leader's child", Duration::from_secs(10), || {
        !dir.lines("starts").is_empty()
    });
    std::thread::sleep(Duration::from_millis(1500));
    let starts = dir.lines("starts");
    assert_eq!(starts.len(), 1, "only one child may run: {starts:?}");
    let (holder, token1, child_pid) = parse(&starts[0]);
    let index: usize = holder[1..].parse().unwrap();

    // SIGKILL the leader's `leader` process: no release.
    let killed_at = Instant::now();
    procs[index].kill().unwrap();
    procs[index].wait().unwrap();
    // Its orphaned child learns through the watchdog and is gone long before a takeover.
    let orphan_gone = wait_for("the orphaned child to stop", Duration::from_secs(3), || {
        !alive(child_pid)
    });
    assert!(orphan_gone < Duration::from_millis(1500), "{orphan_gone:?}");

    let took = wait_for("a new leader's child", Duration::from_secs(6), || {
        dir.lines("starts").len() == 2
    });
    let (holder2, token2, _) = parse(&dir.lines("starts")[1]);
    assert_ne!(holder2, holder);
    assert!(token2 > token1, "{token2} <= {token1}");
    // ttl (2 s) + retry_every (0.4 s) + a request, measured from the kill.
    assert!(
        took <= Duration::from_millis(2400 + 600),
        "failover took {took:?}"
    );
    let _ = killed_at;
    for (i, p) in procs.iter_mut().enumerate() {
        if i != index {
            signal(p, Signal::SIGTERM);
            exit_code(p, Duration::from_secs(5));
        }
    }
}

#[test]
fn sigterm_hands_over_within_a_retry_period() {
    let dir = Dir::new();
    let mut a = candidate(&dir, "a", &[], "sleep 60");
    wait_for("a's child", Duration::from_secs(10), || {
        !dir.lines("starts").is_empty()
    });
    let mut b = candidate(&dir, "b", &[], "sleep 60");
    std::thread::sleep(Duration::from_millis(800));
    let (_, token1, child_a) = parse(&dir.lines("starts")[0]);
    signal(&a, Signal::SIGTERM);
    let handover = wait_for("b's child", Duration::from_secs(5), || {
        dir.lines("starts").len() == 2
    });
    // retry_every (0.4 s) + a request + process start.
    assert!(
        handover <= Duration::from_millis(1500),
        "handover took {handover:?}"
    );
    assert!(
        !alive(child_a),
        "a's child must be stopped before b's starts"
    );
    assert_eq!(exit_code(&mut a, Duration::from_secs(5)), 128 + 15);
    let (holder2, token2, _) = parse(&dir.lines("starts")[1]);
    assert_eq!(holder2, "b");
    assert!(token2 > token1);
    signal(&b, Signal::SIGTERM);
    assert_eq!(exit_code(&mut b, Duration::from_secs(5)), 128 + 15);
}

#[test]
fn a_child_that_ignores_sigterm_is_killed_after_grace_with_its_grandchildren() {
    let dir = Dir::new();
    let grandchild = dir.file("grandchild");
    let then = format!(
        "trap '' TERM; sleep 60 & echo $! > {}; wait; wait",
        grandchild.display()
    );
    let mut a = candidate(&dir, "a", &["--grace", "250ms"], &then);
    wait_for("the grandchild", Duration::from_secs(10), || {
        std::fs::read_to_string(&grandchild).is_ok_and(|s| s.trim().parse::<i32>().is_ok())
    });
    let (_, _, child) = parse(&dir.lines("starts")[0]);
    let grand: i32 = std::fs::read_to_string(&grandchild)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(alive(child) && alive(grand));
    let sent = Instant::now();
    signal(&a, Signal::SIGTERM);
    let code = exit_code(&mut a, Duration::from_secs(5));
    assert_eq!(code, 128 + 15);
    let took = sent.elapsed();
    assert!(
        took >= Duration::from_millis(250),
        "killed before the grace: {took:?}"
    );
    assert!(
        !alive(child),
        "the child ignored SIGTERM and must have been killed"
    );
    assert!(!alive(grand), "the grandchild must have been killed too");
}

#[test]
fn a_signal_while_waiting_starts_no_child() {
    let dir = Dir::new();
    let mut a = candidate(&dir, "a", &[], "sleep 60");
    wait_for("a's child", Duration::from_secs(10), || {
        !dir.lines("starts").is_empty()
    });
    let mut b = candidate(&dir, "b", &[], "sleep 60");
    std::thread::sleep(Duration::from_millis(500));
    signal(&b, Signal::SIGTERM);
    assert_eq!(exit_code(&mut b, Duration::from_secs(3)), 128 + 15);
    // a releases; b is gone, so nobody starts a child any more.
    signal(&a, Signal::SIGTERM);
    assert_eq!(exit_code(&mut a, Duration::from_secs(5)), 128 + 15);
    std::thread::sleep(Duration::from_millis(800));
    let starts = dir.lines("starts");
    assert_eq!(starts.len(), 1, "{starts:?}");
    assert!(starts[0].starts_with("a "));
}

#[test]
fn the_demo_runs() {
    let out = Command::new(LEADER)
        .arg("demo")
        .env("LEADER_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("took over with token 2"), "{stdout}");
}

#[test]
fn a_frozen_leaders_child_is_stopped_at_the_deadline_before_anyone_takes_over() {
    let dir = Dir::new();
    let mut a = candidate(&dir, "a", &[], "sleep 60");
    wait_for("a's child", Duration::from_secs(10), || {
        !dir.lines("starts").is_empty()
    });
    let mut b = candidate(&dir, "b", &[], "sleep 60");
    std::thread::sleep(Duration::from_millis(700));
    let (_, token1, child_a) = parse(&dir.lines("starts")[0]);
    // Freeze `leader` itself (not its watchdog): renewals stop.
    signal(&a, Signal::SIGSTOP);
    let frozen = Instant::now();
    // Term validity is ttl - margin = 1.6 s after the last renew; then SIGTERM to the child.
    let stopped = wait_for("a's child to be stopped", Duration::from_secs(4), || {
        !alive(child_a)
    });
    assert!(stopped <= Duration::from_millis(1600 + 500), "{stopped:?}");
    wait_for("b's child", Duration::from_secs(6), || {
        dir.lines("starts").len() == 2
    });
    let took = frozen.elapsed();
    assert!(took >= stopped, "b started before a's child was stopped");
    let (holder2, token2, _) = parse(&dir.lines("starts")[1]);
    assert_eq!(holder2, "b");
    assert!(token2 > token1);
    // Resumed, a learns that its term is over and exits 75 without starting anything.
    signal(&a, Signal::SIGCONT);
    assert_eq!(exit_code(&mut a, Duration::from_secs(5)), 75);
    assert_eq!(dir.lines("starts").len(), 2);
    signal(&b, Signal::SIGTERM);
    assert_eq!(exit_code(&mut b, Duration::from_secs(5)), 128 + 15);
}

#[test]
fn supervise_runs_the_command_again_in_a_later_term() {
    let dir = Dir::new();
    // The command exits at once; with --supervise, `leader` releases, sits out one ttl, and
    // campaigns again (nobody else does), so the command runs again with a higher token.
    let mut a = candidate(&dir, "a", &["--supervise"], "exit 0");
    wait_for("two runs", Duration::from_secs(10), || {
        dir.lines("starts").len() >= 2
    });
    let starts = dir.lines("starts");
    let (_, t1, _) = parse(&starts[0]);
    let (_, t2, _) = parse(&starts[1]);
    assert!(t2 > t1, "{starts:?}");
    signal(&a, Signal::SIGTERM);
    assert_eq!(exit_code(&mut a, Duration::from_secs(5)), 128 + 15);
}
