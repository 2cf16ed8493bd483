//! Helpers shared by the process-level tests of `leader`.
#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::time::{ClockId, clock_gettime};
use nix::unistd::Pid;

pub const LEADER: &str = env!("CARGO_BIN_EXE_leader");

/// The worker that the supervision tests run as the command (see its docstring).
pub fn worker() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/worker.py")
}

pub fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
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

/// Whether the process exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
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

pub fn signal(child: &Child, sig: Signal) {
    kill(Pid::from_raw(child.id() as i32), sig).unwrap();
}

/// The exit status of `child` within `limit`: `Ok(code)` or `Err(signal)`.
pub fn exit_status(child: &mut Child, limit: Duration) -> Result<i32, i32> {
    use std::os::unix::process::ExitStatusExt;
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().ok_or_else(|| status.signal().unwrap_or(-1));
        }
        assert!(
            start.elapsed() < limit,
            "`leader` did not exit within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn exit_code(child: &mut Child, limit: Duration) -> i32 {
    exit_status(child, limit).unwrap_or(-1)
}

/// Now on CLOCK_BOOTTIME (the clock the worker writes), in nanoseconds.
pub fn boottime_ns() -> u64 {
    Duration::from(clock_gettime(ClockId::CLOCK_BOOTTIME).unwrap()).as_nanos() as u64
}

/// Every pid below `root`, from /proc.
pub fn descendants(root: i32) -> Vec<i32> {
    let Ok(root) = u32::try_from(root) else {
        return Vec::new();
    };
    integration_tests::descendants(root)
        .into_iter()
        .filter_map(|p| i32::try_from(p).ok())
        .collect()
}

/// One line of the worker's log.
#[derive(Clone, Debug)]
pub struct Event {
    pub kind: String,
    pub token: u64,
    pub pid: i32,
    pub t: u64,
}

pub fn events(log: &Path) -> Vec<Event> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let p: Vec<&str> = l.split(' ').collect();
            assert_eq!(p.len(), 4, "malformed worker line {l:?}");
            Event {
                kind: p[0].to_owned(),
                token: p[1].parse().unwrap(),
                pid: p[2].parse().unwrap(),
                t: p[3].parse().unwrap(),
            }
        })
        .collect()
}

/// What every process of one term did: first and last line, and the pids.
#[derive(Debug, Default)]
pub struct TermActivity {
    pub first: u64,
    pub last: u64,
    pub pids: Vec<i32>,
    pub started_at: Option<u64>,
}

pub fn by_term(events: &[Event]) -> BTreeMap<u64, TermActivity> {
    let mut terms: BTreeMap<u64, TermActivity> = BTreeMap::new();
    for e in events {
        let a = terms.entry(e.token).or_insert_with(|| TermActivity {
            first: e.t,
            last: e.t,
            ..Default::default()
        });
        a.first = a.first.min(e.t);
        a.last = a.last.max(e.t);
        if !a.pids.contains(&e.pid) {
            a.pids.push(e.pid);
        }
        if e.kind == "start" {
            a.started_at = Some(e.t);
        }
    }
    terms
}

/// Asserts that no process of a term acted after the next term's command started.
pub fn assert_no_overlap(events: &[Event]) {
    let terms = by_term(events);
    let list: Vec<(&u64, &TermActivity)> = terms.iter().collect();
    for pair in list.windows(2) {
        let (t1, a) = pair[0];
        let (t2, b) = pair[1];
        assert!(
            a.last < b.first,
            "term {t1} was still acting {:.3} s after term {t2} started",
            (a.last - b.first) as f64 / 1e9
        );
    }
}

/// Runs `leader run --store STORE EXTRA -- sh -c 'echo $LEADER_FENCING_TOKEN > FILE'` twice,
/// then `leader status --store STORE EXTRA --json`; each process is set up by `setup` (its
/// environment) after `LEADER_LOG=warn`. Checks that both runs exit 0, that the second term's
/// token is above the first's, and that status shows the lease released at that token.
/// Returns the two tokens.
pub fn run_twice_with(store: &str, extra: &[&str], setup: impl Fn(&mut Command)) -> [u64; 2] {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("token");
    let mut tokens = [0; 2];
    for token in &mut tokens {
        let script = format!("echo $LEADER_FENCING_TOKEN > {}", out.display());
        let mut command = Command::new(LEADER);
        command
            .args(["run", "--store", store])
            .args(extra)
            .args(["--", "sh", "-c", &script])
            .env("LEADER_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        setup(&mut command);
        let output = command.output().unwrap();
        assert_eq!(
            output.status.code(),
            Some(0),
            "leader run on {store}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        *token = std::fs::read_to_string(&out)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
    }
    assert!(tokens[1] > tokens[0], "tokens {tokens:?} on {store}");
    let mut command = Command::new(LEADER);
    command
        .args(["status", "--store", store, "--json"])
        .args(extra)
        .env("LEADER_LOG", "warn");
    setup(&mut command);
    let status = command.output().unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(json["state"], "released", "{json}");
    assert_eq!(json["token"], tokens[1], "{json}");
    tokens
}
