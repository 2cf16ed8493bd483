//! `leader run --store s3://BUCKET/job` on both S3 emulators (moto, LocalStack), with real
//! processes and real signals: two instances start at once and one leads; SIGKILL of the
//! leader's `leader` fails over to the other after the lease expires (a takeover of a record
//! unchanged for a full ttl), SIGTERM hands over through a release (no expiry involved).
//!
//! Each instance runs `--ttl 3s --renew-every 500ms` (renews often enough that a busy
//! serialised moto does not end a term) with a small shell command that appends
//! `start|stop HOLDER TOKEN PID REALTIME_NS` to one log (O_APPEND: the order of the lines is
//! the order of the events) and runs until SIGTERM. The checks are on order, tokens, who runs
//! and what `leader` logged; times are only printed (MEASURED lines) and bounded by generous
//! timeouts that keep a broken run from hanging.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr,
    clippy::disallowed_methods // real processes need real time
)]

mod common;
mod s3;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{LEADER, alive, descendants, exit_status, signal, wait_for};
use integration_tests::Emulator;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The lease timing of every instance (ttl 3 s as the S3 conformance tests use).
const TIMING: [&str; 4] = ["--ttl", "3s", "--renew-every", "500ms"];
const TTL: Duration = Duration::from_secs(3);

/// What the tests wait for at most: far above what each step takes (a few polls and requests,
/// or a ttl and a poll), only there so that a broken run ends.
const FIRST_TERM_LIMIT: Duration = Duration::from_secs(30);
const TAKEOVER_LIMIT: Duration = Duration::from_secs(30);
const EXIT_LIMIT: Duration = Duration::from_secs(15);

/// What `leader` logs (at info) when it takes over a lease by expiry: the follower's
/// staleness rule (`leader-core`'s lease.rs). A released record is taken without it.
const EXPIRY_TAKEOVER: &str = "record unchanged for a full ttl; taking over";
/// What `leader` logs (at info) after its release write landed.
const RELEASED: &str = "released the lease key=job token=";

/// One line of the command's log.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Line {
    kind: String,
    holder: String,
    token: u64,
    pid: i32,
    unix_ns: u128,
}

/// Two (or more) `leader run` instances on one fresh bucket of one emulator.
struct Case {
    emu: Emulator,
    url: String,
    store: String,
    dir: tempfile::TempDir,
    /// The pids of the `leader` processes started, killed with all their descendants when
    /// the case ends, so that a failing test leaves nothing behind.
    spawned: Vec<i32>,
}

impl Drop for Case {
    fn drop(&mut self) {
        let mut all: Vec<i32> = self.lines().iter().map(|l| l.pid).collect();
        for pid in &self.spawned {
            all.extend(descendants(*pid));
            all.push(*pid);
        }
        for pid in all {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

impl Case {
    /// A fresh bucket on `emu`; `None` when the test skips (see `integration_tests::require`).
    async fn new(emu: Emulator) -> Option<Self> {
        let url = s3::url(emu).await?;
        let bucket = s3::new_bucket(&url, "run").await;
        Some(Self {
            emu,
            store: format!("s3://{bucket}/job"),
            url,
            dir: tempfile::tempdir().unwrap(),
            spawned: Vec::new(),
        })
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("commands.log")
    }

    fn stderr_path(&self, id: &str) -> PathBuf {
        self.dir.path().join(format!("{id}.stderr"))
    }

    /// What `leader` `id` wrote to stderr (LEADER_LOG=info).
    fn stderr(&self, id: &str) -> String {
        std::fs::read_to_string(self.stderr_path(id)).unwrap_or_default()
    }

    fn lines(&self) -> Vec<Line> {
        parse_log(&self.log())
    }

    fn starts(&self) -> Vec<Line> {
        self.lines()
            .into_iter()
            .filter(|l| l.kind == "start")
            .collect()
    }

    /// `leader run --id ID` on the case's store: the command notes its start, and its stop
    /// when it gets SIGTERM. Its own process group, as a shell starts it; only `--endpoint`
    /// names the emulator (the AWS endpoint variables are removed).
    fn spawn(&mut self, id: &str) -> Child {
        let log = self.log().display().to_string();
        let note = |kind: &str| {
            format!(
                "echo \"{kind} $LEADER_HOLDER_ID $LEADER_FENCING_TOKEN $me $(date +%s%N)\" >> {log}"
            )
        };
        // `me`: the pid this process sees (in the command's PID namespace `$$` is another).
        let script = format!(
            "read -r me _ < /proc/self/stat; trap '{stop}; exit 0' TERM; {start}; \
             while :; do sleep 0.05; done",
            stop = note("stop"),
            start = note("start"),
        );
        let child = Command::new(LEADER)
            .args(["run", "--store", &self.store, "--id", id])
            .args(["--emulator", "--endpoint", &self.url])
            .args(TIMING)
            .args(["--", "sh", "-c", &script])
            .env("LEADER_LOG", "info")
            .env_remove("AWS_ENDPOINT_URL")
            .env_remove("AWS_ENDPOINT_URL_S3")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.stderr_path(id)).unwrap())
            .process_group(0)
            .spawn()
            .unwrap();
        self.spawned.push(child.id() as i32);
        child
    }

    /// `leader status --json` on the case's store.
    fn status(&self) -> serde_json::Value {
        let out = Command::new(LEADER)
            .args(["status", "--store", &self.store, "--json"])
            .args(["--emulator", "--endpoint", &self.url])
            .env("LEADER_LOG", "warn")
            .env_remove("AWS_ENDPOINT_URL")
            .env_remove("AWS_ENDPOINT_URL_S3")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{:?}: leader status: {}",
            self.emu,
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Starts `a` and `b` at once; waits until one runs its command, lets the other follow
    /// for a few polls, and checks that only one command ran, under the holder that `status`
    /// shows. Returns (leader, follower), each as (id, child), and the first start.
    fn elect(&mut self) -> ((String, Child), (String, Child), Line) {
        let a = self.spawn("a");
        let b = self.spawn("b");
        wait_for("a first term", FIRST_TERM_LIMIT, || {
            !self.starts().is_empty()
        });
        // Several polls of the follower (500 ms each): a second command would show here.
        std::thread::sleep(Duration::from_millis(1500));
        let starts = self.starts();
        assert_eq!(
            starts.len(),
            1,
            "{:?}: one command at a time: {starts:?}",
            self.emu
        );
        let first = starts[0].clone();
        assert!(first.token >= 1, "{first:?}");
        let status = self.status();
        assert_eq!(status["state"], "held", "{status}");
        assert_eq!(status["holder"], first.holder.as_str(), "{status}");
        assert_eq!(status["token"], first.token, "{status}");
        let (leader, follower) = match first.holder.as_str() {
            "a" => (("a".to_owned(), a), ("b".to_owned(), b)),
            "b" => (("b".to_owned(), b), ("a".to_owned(), a)),
            other => panic!("unknown holder {other:?}"),
        };
        (leader, follower, first)
    }

    /// Waits for the follower's command; checks its holder and token and that the old
    /// command had stopped (its `stop` line comes first, and it is gone). Returns the new
    /// start and the seconds from `sent_ns` (when the signal was sent) to it.
    fn takeover(&self, first: &Line, follower: &str, sent_ns: u128) -> (Line, f64) {
        wait_for("the follower's command", TAKEOVER_LIMIT, || {
            self.starts().len() >= 2
        });
        let lines = self.lines();
        let starts: Vec<&Line> = lines.iter().filter(|l| l.kind == "start").collect();
        assert_eq!(starts.len(), 2, "{:?}: {lines:?}", self.emu);
        let second = starts[1].clone();
        assert_eq!(second.holder, follower, "{:?}: {lines:?}", self.emu);
        assert!(
            second.token > first.token,
            "{:?}: tokens must rise: {} then {}",
            self.emu,
            first.token,
            second.token
        );
        let stopped = lines
            .iter()
            .position(|l| l.kind == "stop" && l.pid == first.pid);
        let started = lines.iter().position(|l| *l == second).unwrap();
        assert!(
            stopped.is_some_and(|s| s < started),
            "{:?}: the old command must stop before the new one starts: {lines:?}",
            self.emu
        );
        assert!(!alive(first.pid), "the old command {} survives", first.pid);
        let took = second.unix_ns.saturating_sub(sent_ns) as f64 / 1e9;
        (second, took)
    }

    /// SIGTERM to the last leader: it stops its command, releases and exits 128+15.
    fn stop(&self, id: &str, mut child: Child) {
        signal(&child, Signal::SIGTERM);
        assert_eq!(
            exit_status(&mut child, EXIT_LIMIT),
            Ok(128 + 15),
            "{id}: {}",
            self.stderr(id)
        );
        let lines = self.lines();
        for l in lines.iter().filter(|l| l.holder == id && l.kind == "start") {
            assert!(
                lines.iter().any(|s| s.kind == "stop" && s.pid == l.pid),
                "{id}'s command {} did not get SIGTERM: {lines:?}",
                l.pid
            );
        }
    }
}

fn parse_log(log: &Path) -> Vec<Line> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let p: Vec<&str> = l.split(' ').collect();
            assert_eq!(p.len(), 5, "malformed line {l:?}");
            Line {
                kind: p[0].to_owned(),
                holder: p[1].to_owned(),
                token: p[2].parse().unwrap(),
                pid: p[3].parse().unwrap(),
                unix_ns: p[4].parse().unwrap(),
            }
        })
        .collect()
}

fn now_unix_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// SIGKILL of the leader's `leader` process (no release): its supervisor stops the command,
/// and the follower takes over once it has seen the record unchanged for a full ttl, with a
/// higher token.
async fn sigkill_fails_over(emu: Emulator) {
    let Some(mut case) = Case::new(emu).await else {
        return;
    };
    let ((leader, mut leader_child), (follower, follower_child), first) = case.elect();

    let sent = now_unix_ns();
    leader_child.kill().unwrap();
    assert_eq!(
        exit_status(&mut leader_child, EXIT_LIMIT),
        Err(9),
        "{leader} died of SIGKILL"
    );
    // The supervisor sees `leader` go and stops the command (its `stop` line), long before
    // the lease could expire.
    wait_for("the orphaned command to stop", TAKEOVER_LIMIT, || {
        case.lines()
            .iter()
            .any(|l| l.kind == "stop" && l.pid == first.pid)
    });
    let stopped_after = now_unix_ns().saturating_sub(sent) as f64 / 1e9;
    let (second, took) = case.takeover(&first, &follower, sent);

    // No release: the follower took the record over by the staleness rule, from the leader.
    assert!(
        !case.stderr(&leader).contains("released the lease"),
        "{}",
        case.stderr(&leader)
    );
    let log = case.stderr(&follower);
    let takeover = log
        .lines()
        .find(|l| l.contains(EXPIRY_TAKEOVER))
        .unwrap_or_else(|| panic!("{emu:?}: {follower} did not take over by expiry: {log}"));
    assert!(
        takeover.contains(&format!("stale_holder={leader}"))
            && takeover.contains(&format!("stale_token={}", first.token)),
        "{takeover}"
    );
    eprintln!(
        "MEASURED {emu} failover after SIGKILL of the leader (ttl {TTL:?}): old command \
         stopped within {stopped_after:.3} s, new command (token {} -> {}) started {took:.3} s \
         after the kill",
        first.token, second.token
    );
    case.stop(&follower, follower_child);
}

/// SIGTERM of the leader: it stops its command and releases; the follower takes the released
/// record (not by expiry) with a higher token.
async fn sigterm_hands_over(emu: Emulator) {
    let Some(mut case) = Case::new(emu).await else {
        return;
    };
    let ((leader, mut leader_child), (follower, follower_child), first) = case.elect();

    let sent = now_unix_ns();
    signal(&leader_child, Signal::SIGTERM);
    let (second, took) = case.takeover(&first, &follower, sent);
    assert_eq!(
        exit_status(&mut leader_child, EXIT_LIMIT),
        Ok(128 + 15),
        "{}",
        case.stderr(&leader)
    );

    // The leader's release landed, and the follower took the released record: a takeover by
    // expiry would say so in its log.
    let leader_log = case.stderr(&leader);
    assert!(
        leader_log.contains(&format!("{RELEASED}{} released=true", first.token)),
        "{emu:?}: {leader} did not release: {leader_log}"
    );
    let log = case.stderr(&follower);
    assert!(
        !log.contains(EXPIRY_TAKEOVER),
        "{emu:?}: {follower} took over by expiry, not a handover: {log}"
    );
    eprintln!(
        "MEASURED {emu} handover after SIGTERM of the leader (ttl {TTL:?}): new command \
         (token {} -> {}) started {took:.3} s after the signal",
        first.token, second.token
    );
    case.stop(&follower, follower_child);
}

#[tokio::test]
async fn sigkill_fails_over_on_s3_moto() {
    sigkill_fails_over(Emulator::MotoS3).await;
}

#[tokio::test]
async fn sigterm_hands_over_on_s3_moto() {
    sigterm_hands_over(Emulator::MotoS3).await;
}

#[tokio::test]
async fn sigkill_fails_over_on_s3_localstack() {
    sigkill_fails_over(Emulator::LocalStackS3).await;
}

#[tokio::test]
async fn sigterm_hands_over_on_s3_localstack() {
    sigterm_hands_over(Emulator::LocalStackS3).await;
}
