//! `leader run` over a quorum of three stores (`--store` given three times), on real processes
//! with real signals: the outage of one store costs the leader nothing (same term, same token,
//! no stop), the outage of two ends its term by its deadline and nobody leads while they are
//! away, their return gives a new term with a higher token, and with one store away a killed
//! leader is replaced by the other candidate, and a candidate started again during that
//! outage opens the missing store once it is back. `leader status` over the quorum in those
//! states, and the member sets that are refused.
//!
//! Two candidates, `a` and `b`, run `leader run --supervise` with ttl 2 s, renewing every
//! 500 ms, and the timing that derives from those (a term lasts 1.6 s after its last renew was
//! sent, poll and retry every 400 ms, request timeout 200 ms, grace 425 ms). The default renew
//! period, half the ttl, leaves a term 600 ms of failed renews; on a busy two-core host the
//! renews of both remaining members once took longer than that (a write and its read-back
//! timed out on each) and the term ended with one store down, which is the timing's limit,
//! not the quorum's. A quarter of the ttl leaves 1.1 s. Their command is
//! `tests/worker.py`: it starts a daemon that only SIGKILL ends, and both append timestamped
//! lines (CLOCK_BOOTTIME) to one log; every check is made from those lines, the exit codes and
//! the commands' logs.
//!
//! The stores:
//! - three dedicated emulator instances (`scripts/emulators instance`): Azurite,
//!   fake-gcs-server and etcd, each with its data kept across a restart and its endpoint given
//!   its own way (an Azurite connection string, `STORAGE_EMULATOR_HOST`, the etcd URL's
//!   host:port). A store is taken down by stopping its instance the way the script stops it:
//!   SIGKILL for fake-gcs-server and etcd, which have written every acknowledged write by
//!   then; SIGTERM for Azurite, which saves its data only on the way out (a SIGKILL would lose
//!   acknowledged writes: a store that forgets is outside what a quorum survives). The shared
//!   emulators are not touched.
//! - three folders, taken down by renaming each away (and back): the file store's calls then
//!   fail with "lease folder ... not found", and it never creates its folder again (checked).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr,
    clippy::disallowed_methods // real processes need real time
)]

mod common;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use integration_tests::{ALLOW_SKIP_VAR, REQUIRED_VAR};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

const TTL: Duration = Duration::from_secs(2);
/// `TTL` and the renew period on the command line; the other timings derive from them.
const TIMING: [&str; 4] = ["--ttl", "2s", "--renew-every", "500ms"];

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

fn ns(d: Duration) -> u64 {
    d.as_nanos() as u64
}

/// Seconds from `from` to `t` (CLOCK_BOOTTIME), negative if `t` came first.
fn secs_from(from: u64, t: u64) -> f64 {
    (i128::from(t) - i128::from(from)) as f64 / 1e9
}

/// The candidates and stores of one test, and the worker's log.
struct Case {
    dir: tempfile::TempDir,
    /// The `--store` URLs, in this order on every command line.
    stores: Vec<String>,
    /// Each command's environment besides the test's (the stores' endpoints).
    env: Vec<(String, String)>,
    /// Every `leader run` started, killed with all its descendants when the case ends, so
    /// that a failing test leaves nothing behind.
    spawned: RefCell<Vec<i32>>,
}

impl Drop for Case {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let keep = format!("/tmp/qfail-{}", std::process::id());
            let _ = std::fs::create_dir_all(&keep);
            for e in std::fs::read_dir(self.path()).unwrap().flatten() {
                let _ = std::fs::copy(
                    e.path(),
                    format!("{keep}/{}", e.file_name().to_string_lossy()),
                );
            }
            for id in ["a", "b", "a-again", "b-again"] {
                let log = self.stderr(id);
                if log.is_empty() {
                    continue;
                }
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                eprintln!("--- the last lines of {id}'s log:");
                for line in tail.iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
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
    fn new(dir: tempfile::TempDir, stores: Vec<String>, env: Vec<(String, String)>) -> Self {
        Self {
            dir,
            stores,
            env,
            spawned: RefCell::default(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn log(&self) -> PathBuf {
        self.path().join("worker.log")
    }

    /// `leader SUBCOMMAND --store ... --store ...` in the stores' environment.
    fn command(&self, subcommand: &str) -> Command {
        let mut c = Command::new(LEADER);
        c.arg(subcommand);
        for store in &self.stores {
            c.args(["--store", store]);
        }
        c.envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        c
    }

    /// `leader run --id ID --supervise TIMING -- python3 worker.py LOG`, in a process group
    /// of its own (as a shell starts it), its stderr kept in `ID.stderr`.
    fn candidate(&self, id: &str) -> Child {
        self.candidate_logged(id, id)
    }

    /// As [`candidate`](Self::candidate), its stderr kept in `LOG.stderr`.
    fn candidate_logged(&self, id: &str, log: &str) -> Child {
        let child = self
            .command("run")
            .args(["--id", id, "--supervise"])
            .args(TIMING)
            .arg("--")
            .arg("python3")
            .arg(worker())
            .arg(self.log())
            .env("LEADER_LOG", "info,leader_core=debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.path().join(format!("{log}.stderr"))).unwrap())
            .process_group(0)
            .spawn()
            .unwrap();
        self.spawned.borrow_mut().push(child.id() as i32);
        child
    }

    fn stderr(&self, id: &str) -> String {
        std::fs::read_to_string(self.path().join(format!("{id}.stderr"))).unwrap_or_default()
    }

    /// `leader status` over the quorum (text, or `--json`), started now.
    fn status(&self, json: bool) -> Status {
        let mut c = self.command("status");
        if json {
            c.arg("--json");
        }
        let child = c
            .env("LEADER_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Status {
            child,
            started: Instant::now(),
        }
    }

    fn events(&self) -> Vec<Event> {
        events(&self.log())
    }

    fn terms(&self) -> BTreeMap<u64, TermActivity> {
        by_term(&self.events())
    }

    fn has(&self, token: u64, kind: &str) -> bool {
        self.events()
            .iter()
            .any(|e| e.token == token && e.kind == kind)
    }

    /// The pid that wrote the first line of `kind` in the term of `token`.
    fn pid_of(&self, token: u64, kind: &str) -> i32 {
        self.events()
            .iter()
            .find(|e| e.token == token && e.kind == kind)
            .unwrap_or_else(|| panic!("no {kind} line of term {token}"))
            .pid
    }

    /// Waits for the command of a term with a token above `above` (and its daemon), and
    /// returns that token and when its command started (CLOCK_BOOTTIME).
    fn wait_for_term_above(&self, above: u64, limit: Duration, what: &str) -> (u64, u64) {
        let mut found = None;
        wait_for(what, limit, || {
            let events = self.events();
            found = events
                .iter()
                .filter(|e| e.kind == "start" && e.token > above)
                .min_by_key(|e| e.t)
                .map(|e| (e.token, e.t));
            found.is_some_and(|(t, _)| events.iter().any(|e| e.token == t && e.kind == "daemon"))
        });
        found.unwrap()
    }

    /// Which of `candidates` runs the command of the term of `token`.
    fn leader_of(&self, candidates: &[Child], token: u64) -> usize {
        let command = self.pid_of(token, "start");
        candidates
            .iter()
            .position(|c| descendants(c.id() as i32).contains(&command))
            .unwrap_or_else(|| panic!("no candidate runs the command of term {token}"))
    }
}

/// A `leader status` that runs.
struct Status {
    child: Child,
    started: Instant,
}

impl Status {
    /// Its exit code, stdout, stderr, and how long it took.
    fn finish(self) -> (i32, String, String, Duration) {
        let out: Output = self.child.wait_with_output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            self.started.elapsed(),
        )
    }
}

/// What the flow does to the member stores, and the checks that depend on them.
trait Stores {
    /// Takes member `i` down.
    fn take_down(&mut self, i: usize);
    /// Brings `members` back, side by side; returns once each answers again, with the time
    /// (CLOCK_BOOTTIME) the first of them answered.
    fn bring_back(&mut self, members: &[usize]) -> u64;
    /// Checks made while the first member is down and the term of `token`, held by `holder`,
    /// leads on the other two.
    fn while_one_is_down(&mut self, case: &Case, holder: &str, token: u64);
    /// Checks made while two members are down and nobody leads.
    fn while_two_are_down(&mut self, case: &Case);
}

/// What the core flow leaves: the candidates, and the tokens of its two terms.
struct Flow {
    candidates: Vec<Child>,
    first: u64,
    second: u64,
}

/// The core flow on a quorum of three: `a` leads, `b` follows; (a) member 2 down: `a` keeps
/// its term and token for several ttls; (b) member 1 down too: `a`'s command is stopped by
/// the term's deadline, and nobody leads while they are down; (c) both back: a new term, with
/// a higher token, within a bound.
fn core_flow(case: &Case, stores: &mut impl Stores, label: &str) -> Flow {
    let a = case.candidate("a");
    let (first, _) = case.wait_for_term_above(0, Duration::from_secs(20), "a's first term");
    let b = case.candidate("b");
    wait_for("b to campaign", Duration::from_secs(20), || {
        case.stderr("b").contains("campaigning")
    });
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        case.terms().keys().copied().collect::<Vec<_>>(),
        vec![first],
        "b must follow while a leads"
    );
    let candidates = vec![a, b];

    // (a) One store down: nothing changes for several ttls.
    stores.take_down(2);
    let down = boottime_ns();
    stores.while_one_is_down(case, "a", first);
    let held_for = ns(3 * TTL);
    let elapsed = boottime_ns() - down;
    if elapsed < held_for {
        std::thread::sleep(Duration::from_nanos(held_for - elapsed));
    }
    keeps_its_term(case, first, down, "a", "b");
    eprintln!(
        "MEASURED {label} (a): one store down {:.3} s, a kept term {first} without a stop",
        secs(boottime_ns() - down)
    );

    // (b) A second store down: the term ends by its deadline.
    let pids = case.terms()[&first].pids.clone();
    stores.take_down(1);
    let down2 = boottime_ns();
    wait_for(
        "the term's command and daemon to be stopped by its deadline (two stores of three down)",
        Duration::from_secs(10),
        || pids.iter().all(|p| !alive(*p)),
    );
    let stopped = boottime_ns();
    let old = &case.terms()[&first];
    assert!(
        case.has(first, "signal15"),
        "the command got SIGTERM before the deadline"
    );
    eprintln!(
        "MEASURED {label} (b): second store down; the term's last action {:.3} s after it \
         (deadline at most 1.6 s after it), all its processes gone {:.3} s after it",
        secs(old.last.saturating_sub(down2)),
        secs(stopped - down2)
    );
    // The deadline is at most ttl - margin = 1.6 s after the stop (no later write reached a
    // second member: `down2` is taken once the store is down); the rest is room for the
    // supervisor's SIGKILL to land on a busy host.
    assert!(
        old.last < down2 + ns(TTL) + 500_000_000,
        "the term's processes acted {:.3} s after the second store went down",
        secs(old.last - down2)
    );
    stores.while_two_are_down(case);
    let quiet = ns(2 * TTL);
    let elapsed = boottime_ns() - stopped;
    if elapsed < quiet {
        std::thread::sleep(Duration::from_nanos(quiet - elapsed));
    }
    let after: Vec<u64> = case
        .terms()
        .keys()
        .copied()
        .filter(|t| *t > first)
        .collect();
    assert!(
        after.is_empty(),
        "a term began with two stores of three down: {after:?}"
    );
    let mut candidates = candidates;
    for (c, id) in candidates.iter_mut().zip(["a", "b"]) {
        assert!(
            c.try_wait().unwrap().is_none(),
            "{id} exited: {}",
            case.stderr(id)
        );
    }
    eprintln!(
        "MEASURED {label} (b): nobody led for {:.3} s with two stores down",
        secs(boottime_ns() - stopped)
    );

    // (c) Both back: a new term with a higher token, as soon as the first of them is back
    // (with it, two of three answer again).
    let back = stores.bring_back(&[2, 1]);
    let all_back = boottime_ns();
    let (second, started) = case.wait_for_term_above(
        first,
        Duration::from_secs(20),
        "a new term after the stores came back",
    );
    let took = secs_from(back, started);
    let holder = ["a", "b"][case.leader_of(&candidates, second)];
    assert!(second > first, "tokens {first} then {second}");
    // The records on the stores that come back are the old term's, unchanged since before the
    // outage: free at once (the old holder's own last write; a record the follower has seen
    // unchanged for over a ttl). The rest is reconnecting, a retry and a round of requests.
    assert!(
        took < secs(ns(3 * TTL)),
        "a new term began only {took:.3} s after the first store came back"
    );
    assert_no_overlap(&case.events());
    // Both stores came back with their data (the old term's records), and the new term takes
    // the one it was begun without back into it once free: all three carry it.
    wait_for(
        "all three stores to carry the new term",
        Duration::from_secs(15),
        || carried_by_all(case, second),
    );
    eprintln!(
        "MEASURED {label} (c): term {second} ({holder}) began {took:.3} s after the first \
         store answered again ({:.3} s after the second); on all three {:.3} s after it began",
        secs_from(all_back, started),
        secs_from(started, boottime_ns())
    );
    Flow {
        candidates,
        first,
        second,
    }
}

/// Whether `leader status --json` shows the term of `token` held on every member.
fn carried_by_all(case: &Case, token: u64) -> bool {
    let (code, out, _, _) = case.status(true).finish();
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&out) else {
        return false;
    };
    code == 0
        && (0..case.stores.len())
            .all(|i| v["members"][i]["state"] == "held" && v["members"][i]["token"] == token)
}

/// Checks that the term of `token` went on since `since` as if nothing happened: no other
/// term, no stop of its command (no signal line), its command and daemon alive and working,
/// and no step-down in the logs.
fn keeps_its_term(case: &Case, token: u64, since: u64, leader: &str, follower: &str) {
    let events = case.events();
    let others: Vec<&Event> = events.iter().filter(|e| e.token != token).collect();
    assert!(others.is_empty(), "another term began: {:?}", others[0]);
    let stops: Vec<&Event> = events
        .iter()
        .filter(|e| !matches!(e.kind.as_str(), "start" | "daemon" | "beat"))
        .collect();
    assert!(stops.is_empty(), "the command was stopped: {stops:?}");
    let now = boottime_ns();
    for kind in ["start", "daemon"] {
        let pid = case.pid_of(token, kind);
        assert!(alive(pid), "the term's {kind} process {pid} is gone");
        let last = events
            .iter()
            .filter(|e| e.pid == pid)
            .map(|e| e.t)
            .max()
            .unwrap();
        assert!(
            last > since && now - last < 1_000_000_000,
            "the term's {kind} process stopped working {:.3} s ago",
            secs(now - last)
        );
    }
    let log = case.stderr(leader);
    for line in ["stepped down", "leadership lost", "term ended"] {
        assert!(!log.contains(line), "{leader} logged {line:?}:\n{log}");
    }
    let log = case.stderr(follower);
    assert!(
        !log.contains("became leader"),
        "{follower} became leader:\n{log}"
    );
}

/// The instances that `scripts/emulators instance` runs for the emulator test.
#[derive(Debug)]
struct Instance {
    name: &'static str,
    dir: PathBuf,
    endpoint: String,
    running: bool,
}

/// `scripts/emulators ARGS`: its stdout, or a message with its stderr.
fn emulators(args: &[&str]) -> Result<String, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/emulators");
    let out = Command::new(&script)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(format!(
            "`scripts/emulators {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Instance {
    /// Starts a dedicated instance of `name` (keeping its data) with its state in `dir`,
    /// killed with this test process if the test dies without stopping it.
    fn start(name: &'static str, dir: PathBuf) -> Result<Self, String> {
        let mut instance = Self {
            name,
            dir,
            endpoint: String::new(),
            running: false,
        };
        instance.endpoint = instance.launch()?;
        Ok(instance)
    }

    fn launch(&mut self) -> Result<String, String> {
        let owner = std::process::id().to_string();
        let dir = self.dir.display().to_string();
        let endpoint = emulators(&["instance", "start", self.name, &dir, "--owner", &owner])?;
        self.running = true;
        Ok(endpoint)
    }

    /// Its `HOST:PORT`.
    fn host_port(&self) -> &str {
        let rest = self.endpoint.trim_start_matches("http://");
        rest.split('/').next().unwrap_or(rest)
    }

    /// Stops it as the script does (see the module docs).
    fn stop(&mut self) {
        emulators(&["instance", "stop", &self.dir.display().to_string()]).unwrap();
        self.running = false;
    }

    /// Starts it again, with its data, on its port.
    fn start_again(&mut self) {
        let endpoint = self.launch().unwrap();
        assert_eq!(endpoint, self.endpoint, "{} came back elsewhere", self.name);
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if self.running {
            let dir = self.dir.display().to_string();
            let _ = emulators(&["instance", "stop", &dir, "--signal", "KILL"]);
        }
    }
}

/// The quorum of the emulator test: members 0, 1, 2 are Azurite, fake-gcs-server, etcd.
struct Emulators(Vec<Instance>);

impl Stores for Emulators {
    fn take_down(&mut self, i: usize) {
        self.0[i].stop();
    }

    fn bring_back(&mut self, members: &[usize]) -> u64 {
        std::thread::scope(|s| {
            let mut back = Vec::new();
            for (i, instance) in self.0.iter_mut().enumerate() {
                if members.contains(&i) {
                    back.push(s.spawn(move || {
                        instance.start_again();
                        boottime_ns()
                    }));
                }
            }
            back.into_iter().map(|h| h.join().unwrap()).min().unwrap()
        })
    }

    /// `leader status`: the term a majority carries, the etcd member unknown, exit 0.
    fn while_one_is_down(&mut self, case: &Case, holder: &str, token: u64) {
        let (text, json) = (case.status(false), case.status(true));
        let (code, out, err, took) = text.finish();
        assert_eq!(code, 0, "status with one store down: {out}{err}");
        assert!(
            out.starts_with(&format!(
                "job: held by {holder} with token {token} on 2 of 3 members (a majority is 2)\n"
            )),
            "{out}"
        );
        let etcd = format!("  {}: unknown (", case.stores[2]);
        assert!(
            out.lines().any(|l| l.starts_with(&etcd)),
            "the etcd member is unknown: {out}"
        );
        for store in &case.stores[..2] {
            let line = format!("  {store}: held by {holder} with token {token}");
            assert!(out.lines().any(|l| l == line), "{line:?} in {out}");
        }
        let (code, out, err, took_json) = json.finish();
        assert_eq!(code, 0, "status --json with one store down: {out}{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["state"], "held", "{v}");
        assert_eq!(v["holder"], holder, "{v}");
        assert_eq!(v["token"], token, "{v}");
        let states: Vec<&str> = (0..3)
            .map(|i| v["members"][i]["state"].as_str().unwrap())
            .collect();
        assert_eq!(states, ["held", "held", "unknown"], "{v}");
        eprintln!(
            "MEASURED status with one store (etcd) down: exit 0 in {:.3} s (text), {:.3} s \
             (json)",
            took.as_secs_f64(),
            took_json.as_secs_f64()
        );
    }

    /// `leader status`: no term on a majority, two members unknown, exit 69.
    fn while_two_are_down(&mut self, case: &Case) {
        let (text, json) = (case.status(false), case.status(true));
        let (code, out, err, took) = text.finish();
        assert_eq!(code, 69, "status with two stores down: {out}{err}");
        assert!(
            out.starts_with("job: no term is carried by a majority of the 3 members"),
            "{out}"
        );
        assert!(
            err.contains("only 1 of 3 quorum members answered; a majority is 2"),
            "{err}"
        );
        let (code, out, err, _) = json.finish();
        assert_eq!(code, 69, "status --json with two stores down: {out}{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["state"], "none", "{v}");
        for i in [1, 2] {
            assert_eq!(v["members"][i]["state"], "unknown", "{v}");
        }
        eprintln!(
            "MEASURED status with two stores down: exit 69 in {:.3} s",
            took.as_secs_f64()
        );
    }
}

/// Starts the three instances side by side; `None` if they cannot run and skipping is
/// allowed (as `integration_tests::require` decides for the shared emulators).
fn start_instances(dir: &Path) -> Option<Emulators> {
    let started: Vec<Result<Instance, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = ["azurite", "gcs", "etcd"]
            .into_iter()
            .map(|name| s.spawn(move || Instance::start(name, dir.join(name))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let errors: Vec<&String> = started.iter().filter_map(|r| r.as_ref().err()).collect();
    if errors.is_empty() {
        return Some(Emulators(started.into_iter().map(Result::unwrap).collect()));
    }
    let var = |v: &str| std::env::var(v).is_ok_and(|s| s == "1");
    if var(ALLOW_SKIP_VAR) && !var(REQUIRED_VAR) {
        eprintln!("SKIPPED: the dedicated emulator instances did not start: {errors:?}");
        return None;
    }
    panic!(
        "the dedicated emulator instances did not start (run `scripts/emulators install`, or \
         set {ALLOW_SKIP_VAR}=1 to skip): {errors:?}"
    );
}

/// Three dedicated instances, Azurite, fake-gcs-server and etcd: the core flow, `leader
/// status` during it; then, with Azurite down, (d) a SIGKILL of the leader: the other
/// candidate takes over once the lease has expired; (e) the killed candidate started again
/// while Azurite is down campaigns, and leads on all three after Azurite's return and a
/// handover.
#[tokio::test]
async fn a_quorum_of_three_emulators_survives_one_outage_and_not_two() {
    let t0 = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let Some(instances) = start_instances(dir.path()) else {
        return;
    };
    let [azurite, gcs, etcd] = [0, 1, 2].map(|i| &instances.0[i]);
    integration_tests::azure::BlobClient::dev(&azurite.endpoint)
        .unwrap()
        .create_container("quorum")
        .await
        .unwrap();
    integration_tests::gcs::GcsClient::new(&gcs.endpoint)
        .create_bucket("quorum")
        .await
        .unwrap();
    let stores = vec![
        "azblob://quorum/job".to_owned(),
        "gs://quorum/job".to_owned(),
        format!("etcd://{}/quorum/job", etcd.host_port()),
    ];
    let env = vec![
        (
            "AZURE_STORAGE_CONNECTION_STRING".to_owned(),
            format!(
                "DefaultEndpointsProtocol=http;AccountName={};AccountKey={};BlobEndpoint={};",
                integration_tests::azure::DEV_ACCOUNT,
                integration_tests::azure::DEV_KEY,
                azurite.endpoint
            ),
        ),
        ("STORAGE_EMULATOR_HOST".to_owned(), gcs.endpoint.clone()),
    ];
    eprintln!(
        "MEASURED emulators: three instances up in {:.3} s",
        t0.elapsed().as_secs_f64()
    );
    let case = Case::new(tempfile::tempdir().unwrap(), stores, env);
    let mut instances = instances;
    let Flow {
        mut candidates,
        first,
        second,
    } = core_flow(&case, &mut instances, "emulators");

    // (d) Azurite down, then SIGKILL of the leader's process group: its supervisor (in a
    // session of its own) stops the command, the lease is left to expire, and the other
    // candidate takes over on the two stores that answer.
    let leader = case.leader_of(&candidates, second);
    let (leader_id, other_id) = [("a", "b"), ("b", "a")][leader];
    instances.take_down(0);
    let down = boottime_ns();
    // One renew on the two others first: the outage costs the term nothing here either.
    std::thread::sleep(TTL / 2 + Duration::from_millis(300));
    assert!(
        !case.terms().keys().any(|t| *t > second),
        "a term began with one store down"
    );
    assert!(alive(case.pid_of(second, "start")), "the command stopped");
    let sent = boottime_ns();
    killpg(
        Pid::from_raw(candidates[leader].id() as i32),
        Signal::SIGKILL,
    )
    .unwrap();
    assert_eq!(
        exit_status(&mut candidates[leader], Duration::from_secs(5)),
        Err(9)
    );
    let (third, started) =
        case.wait_for_term_above(second, Duration::from_secs(20), "the takeover");
    let took = secs(started.saturating_sub(sent));
    let terms = case.terms();
    let old = &terms[&second];
    eprintln!(
        "MEASURED emulators (d): Azurite down {:.3} s before; after SIGKILL of {leader_id} \
         its term's last action at {:.3} s, {other_id}'s command (term {third}) started at \
         {took:.3} s",
        secs(sent - down),
        secs(old.last.saturating_sub(sent))
    );
    assert!(third > second, "tokens {second} then {third}");
    assert!(
        case.leader_of(&candidates, third) != leader,
        "the killed candidate cannot lead"
    );
    for pid in &old.pids {
        assert!(
            !alive(*pid),
            "process {pid} of the killed leader's term survived"
        );
    }
    // The follower saw the last renew (sent before the kill) within a poll, takes over at
    // its first poll a ttl later, after a round of requests (reads, then mark and record
    // writes): about 2.8 s and the requests at most; more for a round that took only a
    // minority and backed off (up to two polls), or a busy host.
    assert!(
        took < secs(ns(2 * TTL + Duration::from_secs(1))),
        "the takeover took {took:.3} s after the kill"
    );

    // (e) The killed candidate is started again while Azurite is still down: it opens Azurite
    // later (at its first call that reaches it) and follows. Azurite back: the leader takes
    // it back into its term; the leader stops (SIGTERM) and releases, and the restarted
    // candidate's term is on all three stores, Azurite through the member opened late.
    let survivor = 1 - leader;
    let again_log = format!("{leader_id}-again");
    candidates[leader] = case.candidate_logged(leader_id, &again_log);
    let campaigns = wait_for(
        "the restarted candidate to campaign or exit",
        Duration::from_secs(30),
        || {
            case.stderr(&again_log).contains("campaigning")
                || candidates[leader].try_wait().unwrap().is_some()
        },
    );
    let log = case.stderr(&again_log);
    assert!(
        candidates[leader].try_wait().unwrap().is_none(),
        "the candidate restarted with Azurite down exited:\n{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("a quorum member cannot be reached now")
                && l.contains(&case.stores[0])),
        "the restarted candidate opens Azurite later:\n{log}"
    );
    std::thread::sleep(TTL / 2);
    assert!(
        !case.terms().keys().any(|t| *t > third),
        "a new term began while {other_id} led"
    );
    let back = instances.bring_back(&[0]);
    wait_for(
        "Azurite to carry the leader's term again",
        Duration::from_secs(15),
        || carried_by_all(&case, third),
    );
    eprintln!(
        "MEASURED emulators (e): restarted with Azurite down, {leader_id} campaigned after \
         {:.3} s; Azurite carried term {third} again {:.3} s after it answered",
        campaigns.as_secs_f64(),
        secs_from(back, boottime_ns())
    );
    let sent = boottime_ns();
    signal(&candidates[survivor], Signal::SIGTERM);
    assert_eq!(
        exit_code(&mut candidates[survivor], Duration::from_secs(10)),
        128 + 15,
        "{}",
        case.stderr(other_id)
    );
    let (fourth, started) =
        case.wait_for_term_above(third, Duration::from_secs(20), "the handover");
    let took = secs_from(sent, started);
    assert_eq!(
        case.leader_of(&candidates, fourth),
        leader,
        "the restarted candidate leads"
    );
    wait_for(
        "all three stores to carry the restarted candidate's term",
        Duration::from_secs(15),
        || carried_by_all(&case, fourth),
    );
    eprintln!(
        "MEASURED emulators (e): SIGTERM of {other_id}; the restarted {leader_id}'s command \
         (term {fourth}) started {took:.3} s after it, its term on all three {:.3} s after it",
        secs_from(sent, boottime_ns())
    );
    // A release is taken over within a poll: the grace period (425 ms), the release, a poll
    // (400 ms) and a round; not an expiry.
    assert!(
        took < secs(ns(TTL)),
        "the handover took {took:.3} s: the lease was not released"
    );
    signal(&candidates[leader], Signal::SIGTERM);
    assert_eq!(
        exit_code(&mut candidates[leader], Duration::from_secs(10)),
        128 + 15,
        "{}",
        case.stderr(&again_log)
    );
    let events = case.events();
    assert_no_overlap(&events);
    assert_eq!(
        by_term(&events).keys().copied().collect::<Vec<_>>(),
        vec![first, second, third, fourth],
        "exactly four terms, in token order"
    );
    for e in &events {
        assert!(!alive(e.pid), "process {} survived its term", e.pid);
    }
    eprintln!(
        "MEASURED emulators: the whole test took {:.3} s",
        t0.elapsed().as_secs_f64()
    );
}

/// The quorum of the folder test: three folders, each taken down by renaming it away.
struct Folders(Vec<PathBuf>);

impl Folders {
    fn away(&self, i: usize) -> PathBuf {
        self.0[i].with_extension("away")
    }

    /// The folders taken down were not made again by the file store.
    fn not_recreated(&self, members: &[usize]) {
        for i in members {
            assert!(
                !self.0[*i].exists(),
                "the file store made the folder {} again",
                self.0[*i].display()
            );
            assert!(self.away(*i).is_dir());
        }
    }
}

impl Stores for Folders {
    fn take_down(&mut self, i: usize) {
        std::fs::rename(&self.0[i], self.away(i)).unwrap();
    }

    fn bring_back(&mut self, members: &[usize]) -> u64 {
        let mut first = None;
        for i in members {
            std::fs::rename(self.away(*i), &self.0[*i]).unwrap();
            first.get_or_insert_with(boottime_ns);
        }
        first.unwrap()
    }

    fn while_one_is_down(&mut self, _case: &Case, _holder: &str, _token: u64) {
        // Renews and reads have failed on it for a while by now.
        std::thread::sleep(TTL);
        self.not_recreated(&[2]);
    }

    fn while_two_are_down(&mut self, _case: &Case) {
        self.not_recreated(&[1, 2]);
    }
}

/// Three folders: the core flow, a folder taken down by renaming it away.
#[test]
fn a_quorum_of_three_folders_survives_one_outage_and_not_two() {
    let t0 = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let folders: Vec<PathBuf> = (0..3)
        .map(|i| dir.path().join(format!("store{i}")))
        .collect();
    for f in &folders {
        std::fs::create_dir(f).unwrap();
    }
    let stores = folders
        .iter()
        .map(|f| format!("file://{}/job", f.display()))
        .collect();
    let case = Case::new(dir, stores, Vec::new());
    let mut folders = Folders(folders);
    let Flow {
        mut candidates,
        first,
        second,
    } = core_flow(&case, &mut folders, "folders");
    for (c, id) in candidates.iter_mut().zip(["a", "b"]) {
        signal(c, Signal::SIGTERM);
        assert_eq!(
            exit_code(c, Duration::from_secs(10)),
            128 + 15,
            "{}",
            case.stderr(id)
        );
    }
    let events = case.events();
    assert_no_overlap(&events);
    assert_eq!(
        by_term(&events).keys().copied().collect::<Vec<_>>(),
        vec![first, second]
    );
    eprintln!(
        "MEASURED folders: the whole test took {:.3} s",
        t0.elapsed().as_secs_f64()
    );
}

/// Member sets that cannot make a quorum, and flags that do not apply to one, are refused
/// with 64 by `run` and `status` before anything is opened: the command never runs and no
/// store gets a record.
#[test]
fn member_sets_that_cannot_work_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let folders: Vec<PathBuf> = (0..4)
        .map(|i| dir.path().join(format!("store{i}")))
        .collect();
    for f in &folders {
        std::fs::create_dir(f).unwrap();
    }
    let url = |i: usize, key: &str| format!("file://{}/{key}", folders[i].display());
    let three: Vec<String> = (0..3).map(|i| url(i, "job")).collect();
    let ran = dir.path().join("ran");
    let touch = format!("touch {}", ran.display());
    let twice = format!(
        "the member {} is given twice; each store may count once",
        url(0, "job")
    );
    // (what, stores, run's extra flags, status's extra flags, what run says, what status says)
    type Case<'a> = (
        &'a str,
        Vec<String>,
        &'a [&'a str],
        &'a [&'a str],
        &'a str,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            "two stores",
            vec![url(0, "job"), url(1, "job")],
            &[],
            &[],
            "2 members; an election over a quorum needs an odd number from 3 to 9",
            "2 members; an election over a quorum needs an odd number from 3 to 9",
        ),
        (
            "four stores",
            (0..4).map(|i| url(i, "job")).collect(),
            &[],
            &[],
            "4 members; an election over a quorum needs an odd number from 3 to 9",
            "4 members; an election over a quorum needs an odd number from 3 to 9",
        ),
        (
            "a store given twice",
            vec![url(0, "job"), url(1, "job"), url(0, "job")],
            &[],
            &[],
            &twice,
            &twice,
        ),
        (
            "different keys",
            vec![url(0, "job"), url(1, "job"), url(2, "other")],
            &[],
            &[],
            "every --store of a quorum must end with the same lease key",
            "every --store of a quorum must end with the same lease key",
        ),
        (
            "--shards",
            three.clone(),
            &["--shards", "2"],
            &["--shards"],
            "--shards works on one store",
            "--shards reads one store",
        ),
        (
            "--endpoint",
            three,
            &["--endpoint", "http://127.0.0.1:9"],
            &["--endpoint", "http://127.0.0.1:9"],
            "--endpoint moves one store",
            "--endpoint moves one store",
        ),
    ];
    for (what, stores, run_flags, status_flags, run_says, status_says) in &cases {
        for (subcommand, flags, says) in [
            ("run", run_flags, run_says),
            ("status", status_flags, status_says),
        ] {
            let mut c = Command::new(LEADER);
            c.arg(subcommand);
            for s in stores {
                c.args(["--store", s]);
            }
            c.args(*flags);
            if subcommand == "run" {
                c.args(["--ttl", "2s", "--", "sh", "-c", &touch]);
            }
            let out = c
                .env("LEADER_LOG", "warn")
                .stdin(Stdio::null())
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                out.status.code(),
                Some(64),
                "{subcommand} with {what}: {err}"
            );
            assert!(err.contains(*says), "{subcommand} with {what}: {err}");
        }
    }
    assert!(!ran.exists(), "a refused run started its command");
    for f in &folders {
        let left: Vec<_> = std::fs::read_dir(f).unwrap().collect();
        assert!(left.is_empty(), "{} holds {left:?}", f.display());
    }
}
