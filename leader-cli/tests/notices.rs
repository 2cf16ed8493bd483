//! `leader run` and the autoscaler, with real processes: scale-in and preemption notices
//! (`--watch-notices`), the Auto Scaling lifecycle hook completed after the handover
//! (`--complete-lifecycle-hook`), scale-in protection while leading (`--protect-leader aws`),
//! and the step-down signal (`--step-down-on`).
//!
//! Every instance is a `leader run` on one file store (`file://TMPDIR/job`, `--ttl 3s`,
//! `--poll-every 200ms`, `--notice-poll 200ms`) whose environment points at a metadata fake of
//! its own (`integration_tests::metadata::FakeMetadata`: one simulated machine per process),
//! with every inherited variable removed so that nothing of the host's cloud leaks in. The
//! command is a small shell script that appends `start|stop|usr1 HOLDER TOKEN PID REALTIME_NS`
//! to one log (O_APPEND: the order of the lines is the order of the events) and runs until
//! SIGTERM. The Auto Scaling cases use a dedicated moto (`scripts/emulators instance`) behind
//! the fakes (`--autoscaling-upstream`): moto keeps the group, its instances, protection and
//! scale-in; the fake records `CompleteLifecycleAction` (moto answers it with 500).
//!
//! The checks are on order, tokens, who runs, what the fakes and moto recorded and what
//! `leader` logged; times are only printed (MEASURED lines, `results/notices.md`) and bounded
//! by generous limits that only end a broken run.
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
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{LEADER, alive, descendants, exit_status, signal, wait_for};
use integration_tests::autoscaling::DedicatedMoto;
use integration_tests::metadata::{FakeMetadata, Machine};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

/// The lease timing of every instance: a short ttl, and followers that read often, so that a
/// handover shows within a fraction of a second and an expiry within a few.
const TIMING: [&str; 4] = ["--ttl", "3s", "--poll-every", "200ms"];
const TTL: Duration = Duration::from_secs(3);
/// `--notice-poll` of every watching instance (AWS and Azure; GCE's waiting request answers
/// at once).
const NOTICE_POLL: &str = "200ms";

/// Far above what each step takes (a few polls and requests, or a ttl and a poll): only there
/// so that a broken run ends.
const LIMIT: Duration = Duration::from_secs(30);
const EXIT_LIMIT: Duration = Duration::from_secs(15);
/// How long a follower is watched to show that it does not do something: several polls.
const SEVERAL_POLLS: Duration = Duration::from_millis(1200);

/// What `leader` logs (at info) when it takes over a lease by expiry. A released record is
/// taken without it.
const EXPIRY_TAKEOVER: &str = "record unchanged for a full ttl; taking over";
/// What `leader run` logs (at warn) when its notice watcher reports a notice.
const NOTICE_SEEN: &str = "a notice for this instance";
/// What the notice watcher logs when a look fails.
const LOOK_FAILED: &str = "could not look for a notice";

/// One line of the commands' log.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Line {
    kind: String,
    holder: String,
    token: u64,
    pid: i32,
    unix_ns: u128,
    /// `LEADER_SHARD`, in sharded runs (a sixth field).
    shard: Option<u32>,
}

fn now_unix_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// A pause of up to 1.5 s (the renew period at `--ttl 3s`), different at each run, before a
/// measured step: so that the measured step falls at any phase of the renewals and polls,
/// not at the one the test's fixed waits happen to give.
fn random_phase() {
    let ms = (now_unix_ns() / 1_000_000 * 7919 % 1500) as u64;
    std::thread::sleep(Duration::from_millis(ms));
}

fn seconds_since(since_ns: u128, line: &Line) -> f64 {
    line.unix_ns.saturating_sub(since_ns) as f64 / 1e9
}

/// The `leader run` instances of one test on one fresh file store.
struct Case {
    dir: tempfile::TempDir,
    store: String,
    /// The `leader` processes started: killed with all they started when the case ends, so
    /// that a failing test leaves nothing behind.
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

/// One running `leader run`.
struct Instance {
    id: String,
    child: Child,
}

impl Instance {
    fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Case {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = format!("file://{}/job", dir.path().display());
        Self {
            dir,
            store,
            spawned: Vec::new(),
        }
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

    /// A clean environment: only PATH, a HOME of the case's own, no AWS profile, and (with a
    /// fake) every cloud endpoint at that fake.
    fn environment(&self, command: &mut Command, fake: Option<&FakeMetadata>) {
        let none = self.dir.path().join("no-aws-config");
        command
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.dir.path())
            .env("AWS_CONFIG_FILE", &none)
            .env("AWS_SHARED_CREDENTIALS_FILE", &none)
            .env("LEADER_LOG", "info");
        if let Some(fake) = fake {
            command
                .env("AWS_EC2_METADATA_SERVICE_ENDPOINT", fake.http_url())
                .env("LEADER_AZURE_IMDS_ENDPOINT", fake.http_url())
                .env("LEADER_AZURE_ARM_ENDPOINT", fake.https_url())
                .env("GCE_METADATA_HOST", fake.authority())
                .env("AWS_ENDPOINT_URL_AUTO_SCALING", fake.http_url())
                .env("AWS_REGION", "us-east-1")
                .env("AWS_ACCESS_KEY_ID", "test")
                .env("AWS_SECRET_ACCESS_KEY", "test");
        }
    }

    /// `leader run --id ID ARGS` on the case's store, its environment pointing at `fake`: the
    /// command notes its start, each SIGUSR1, and its stop at SIGTERM. Its own process group,
    /// as a shell starts it.
    fn spawn(&mut self, id: &str, fake: Option<&FakeMetadata>, args: &[&str]) -> Instance {
        let note = |kind: &str| self.note(kind, "");
        let script = format!(
            "trap '{stop}; exit 0' TERM; trap '{usr1}' USR1; {start}; \
             while :; do sleep 0.05; done",
            stop = note("stop"),
            usr1 = note("usr1"),
            start = note("start"),
        );
        self.spawn_script(id, fake, args, &script)
    }

    /// A shell line that appends `KIND HOLDER TOKEN PID REALTIME_NS` and `extra` to the log.
    fn note(&self, kind: &str, extra: &str) -> String {
        format!(
            "echo \"{kind} $LEADER_HOLDER_ID $LEADER_FENCING_TOKEN $me $(date +%s%N){extra}\" >> {}",
            self.log().display()
        )
    }

    /// `leader run --id ID ARGS -- sh -c SCRIPT` on the case's store, as [`spawn`](Self::spawn).
    fn spawn_script(
        &mut self,
        id: &str,
        fake: Option<&FakeMetadata>,
        args: &[&str],
        script: &str,
    ) -> Instance {
        let mut command = Command::new(LEADER);
        command
            .args(["run", "--store", &self.store, "--id", id])
            .args(TIMING)
            .args(args)
            // `me`: the pid this process sees (in the command's PID namespace `$$` is another).
            .args([
                "--",
                "sh",
                "-c",
                &format!("read -r me _ < /proc/self/stat; {script}"),
            ]);
        self.environment(&mut command, fake);
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.stderr_path(id)).unwrap())
            .process_group(0)
            .spawn()
            .unwrap();
        self.spawned.push(child.id() as i32);
        Instance {
            id: id.to_owned(),
            child,
        }
    }

    /// Waits until `id` has logged `text`.
    fn wait_logged(&self, id: &str, text: &str) {
        wait_for(&format!("{id} to log {text:?}"), LIMIT, || {
            self.stderr(id).contains(text)
        });
    }

    /// `leader status --json` on the case's store.
    fn status(&self) -> Value {
        let mut command = Command::new(LEADER);
        command.args(["status", "--store", &self.store, "--json"]);
        self.environment(&mut command, None);
        let out = command.env("LEADER_LOG", "warn").output().unwrap();
        assert!(
            out.status.success(),
            "leader status: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Asserts that the lease is held by `line`'s holder at `line`'s token, and that its
    /// command is the only one that started since.
    fn assert_still_leads(&self, line: &Line) {
        let status = self.status();
        assert_eq!(status["state"], "held", "{status}");
        assert_eq!(status["holder"], line.holder.as_str(), "{status}");
        assert_eq!(status["token"], line.token, "{status}");
        let lines = self.lines();
        let last_start = lines.iter().rev().find(|l| l.kind == "start");
        assert_eq!(last_start, Some(line), "{lines:?}");
        assert!(
            !lines.iter().any(|l| l.kind == "stop" && l.pid == line.pid),
            "{}'s command stopped: {lines:?}",
            line.holder
        );
        assert!(alive(line.pid), "{}'s command is gone", line.holder);
    }

    /// Starts `a`, waits until it runs its command, then starts `b` and lets it follow for
    /// several polls (its notice watcher running, if `watching`): `a` leads, alone. Returns
    /// both and the leader's start line.
    fn elect(
        &mut self,
        a: (&str, Option<&FakeMetadata>),
        b: (&str, Option<&FakeMetadata>),
        args: &[&str],
    ) -> (Instance, Instance, Line) {
        let leader = self.spawn(a.0, a.1, args);
        wait_for("the first term", LIMIT, || !self.starts().is_empty());
        let follower = self.spawn(b.0, b.1, args);
        self.wait_logged(b.0, "campaigning");
        if args.contains(&"--watch-notices") {
            for id in [a.0, b.0] {
                self.wait_logged(id, "watching for scale-in and preemption notices");
            }
        }
        std::thread::sleep(SEVERAL_POLLS);
        let starts = self.starts();
        assert_eq!(starts.len(), 1, "one command at a time: {starts:?}");
        let first = starts[0].clone();
        assert_eq!(first.holder, a.0, "{starts:?}");
        assert!(first.token >= 1, "{first:?}");
        self.assert_still_leads(&first);
        (leader, follower, first)
    }

    /// Waits for the next term's command after `previous`: it must be `to`'s, at a higher
    /// token, and start after `previous`'s command stopped (its `stop` line comes first and
    /// it is gone). Returns the new start.
    fn next_term(&self, previous: &Line, to: &str) -> Line {
        self.next_term_after(previous, to, true)
    }

    /// [`next_term`](Self::next_term); `stopped`: whether the old command had the time to
    /// note its stop (not when it was killed with its supervisor).
    fn next_term_after(&self, previous: &Line, to: &str, stopped_line: bool) -> Line {
        wait_for(&format!("{to}'s command"), LIMIT, || {
            self.starts().iter().any(|l| l.token > previous.token)
        });
        let lines = self.lines();
        let next = lines
            .iter()
            .find(|l| l.kind == "start" && l.token > previous.token)
            .unwrap()
            .clone();
        assert_eq!(next.holder, to, "{lines:?}");
        let stopped = lines
            .iter()
            .position(|l| l.kind == "stop" && l.pid == previous.pid);
        let started = lines.iter().position(|l| *l == next).unwrap();
        assert!(
            stopped.is_some_and(|s| s < started) || (!stopped_line && stopped.is_none()),
            "the old command must stop before the new one starts: {lines:?}"
        );
        assert!(
            !alive(previous.pid),
            "the old command {} survives",
            previous.pid
        );
        assert_no_overlap(&lines);
        next
    }

    /// A takeover through a release: `id` took a released record, not an expired one.
    fn assert_by_release(&self, id: &str) {
        let log = self.stderr(id);
        assert!(
            !log.contains(EXPIRY_TAKEOVER),
            "{id} took over by expiry, not by a release:\n{log}"
        );
    }

    /// SIGTERM to `instance`: it exits 128+15 (having stopped its command, if it ran one).
    fn stop(&self, mut instance: Instance) {
        signal(&instance.child, Signal::SIGTERM);
        let id = &instance.id;
        assert_eq!(
            exit_status(&mut instance.child, EXIT_LIMIT),
            Ok(128 + 15),
            "{id}: {}",
            self.stderr(id)
        );
        let lines = self.lines();
        for l in lines
            .iter()
            .filter(|l| l.holder == *id && l.kind == "start")
        {
            assert!(
                lines.iter().any(|s| s.kind == "stop" && s.pid == l.pid),
                "{id}'s command {} did not get SIGTERM: {lines:?}",
                l.pid
            );
        }
    }

    /// `doomed` (which got a notice) never leads again: after `leader` (the only other
    /// instance) is stopped and has released, `doomed` does not take the free lease in more
    /// than a ttl; it is still running, and exits 128+15 on SIGTERM.
    fn assert_never_leads_again(&self, doomed: Instance, leader: Instance) {
        let before = self.starts().len();
        self.stop(leader);
        std::thread::sleep(TTL + Duration::from_secs(1));
        let starts = self.starts();
        assert_eq!(
            starts.len(),
            before,
            "{} led again after its notice: {starts:?}",
            doomed.id
        );
        assert!(alive(doomed.pid()), "{} exited after its notice", doomed.id);
        self.stop(doomed);
    }
}

fn parse_log(log: &Path) -> Vec<Line> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let p: Vec<&str> = l.split(' ').collect();
            assert!(p.len() == 5 || p.len() == 6, "malformed line {l:?}");
            Line {
                kind: p[0].to_owned(),
                holder: p[1].to_owned(),
                token: p[2].parse().unwrap(),
                pid: p[3].parse().unwrap(),
                unix_ns: p[4].parse().unwrap(),
                shard: p.get(5).map(|s| s.parse().unwrap()),
            }
        })
        .collect()
}

/// No command of a term wrote a line after the next term's command started (the lines are in
/// the order of the events).
fn assert_no_overlap(lines: &[Line]) {
    let mut tokens: Vec<u64> = lines.iter().map(|l| l.token).collect();
    tokens.sort_unstable();
    tokens.dedup();
    for pair in tokens.windows(2) {
        let last = lines.iter().rposition(|l| l.token == pair[0]).unwrap();
        let first = lines.iter().position(|l| l.token == pair[1]).unwrap();
        assert!(
            last < first,
            "term {} was still acting after term {} started: {lines:?}",
            pair[0],
            pair[1]
        );
    }
}

/// The flags of an instance that watches `cloud`'s notices.
fn watching(cloud: &str) -> Vec<&str> {
    vec!["--watch-notices", cloud, "--notice-poll", NOTICE_POLL]
}

/// A notice raised on the leader's machine: the follower leads with a higher token, after the
/// old command stopped, through the release; the doomed instance never leads again. Returns
/// the case, the leader's fake and the seconds from the raise to the new leader's command.
fn handover_on_notice(
    cloud: &str,
    machine: Machine,
    notice: Value,
    before: impl FnOnce(&Case, &FakeMetadata, &Line),
) -> (f64, FakeMetadata, FakeMetadata, Case) {
    let mut case = Case::new();
    let fake_a = FakeMetadata::start(&machine);
    let fake_b = FakeMetadata::start(&Machine::default());
    let args = watching(cloud);
    let (a, b, first) = case.elect(("a", Some(&fake_a)), ("b", Some(&fake_b)), &args);
    before(&case, &fake_a, &first);

    random_phase();
    let raised = now_unix_ns();
    fake_a.raise(notice.clone());
    let second = case.next_term(&first, "b");
    let took = seconds_since(raised, &second);
    eprintln!("MEASURED notice {notice} -> new leader's first act: {took:.3} s");
    case.assert_by_release("b");
    let log = case.stderr("a");
    assert!(log.contains(NOTICE_SEEN), "{log}");
    assert!(
        log.contains("handed over (the lease is released) after the notice"),
        "{log}"
    );
    assert!(alive(a.pid()), "a exited after its notice:\n{log}");
    case.assert_never_leads_again(a, b);
    (took, fake_a, fake_b, case)
}

#[test]
fn aws_spot_notice_on_the_leader_hands_over() {
    handover_on_notice(
        "aws",
        Machine::default(),
        json!({"cloud": "aws", "kind": "spot"}),
        |_, _, _| {},
    );
}

/// An Azure event for this VM: handover, then this VM's event approved, once, and no other.
fn azure_event_on_the_leader_hands_over(kind: &str) {
    let mut other_id = String::new();
    let (_, fake_a, fake_b, case) = handover_on_notice(
        "azure",
        Machine::default(),
        json!({"cloud": "azure", "type": kind}),
        |case, fake, first| {
            // Another VM's event first: not a notice for this one (several polls pass).
            let other = fake.raise(json!({"cloud": "azure", "type": "Preempt",
                                          "resources": ["other_vm"]}));
            other_id = other["event_id"].as_str().unwrap().to_owned();
            std::thread::sleep(SEVERAL_POLLS);
            case.assert_still_leads(first);
            assert!(
                !case.stderr("a").contains(NOTICE_SEEN),
                "{}",
                case.stderr("a")
            );
        },
    );
    // The handover is done (and the doomed instance stopped): the approval came after it.
    let state = fake_a.state();
    let events = state["azure"]["events"].as_array().unwrap();
    let own = events
        .iter()
        .find(|e| e["EventType"] == kind && e["Resources"] == json!(["vmss_0"]))
        .unwrap_or_else(|| panic!("{state}"));
    let own_id = own["EventId"].as_str().unwrap();
    assert_eq!(state["azure_approvals"], json!([own_id]), "{state}");
    let other = events.iter().find(|e| e["EventId"] == other_id.as_str());
    assert_eq!(other.unwrap()["EventStatus"], "Scheduled", "{state}");
    assert_eq!(fake_b.state()["azure_approvals"], json!([]));
    let log = case.stderr("a");
    assert!(log.contains("approved this VM's scheduled event"), "{log}");
}

#[test]
fn azure_preempt_on_the_leader_hands_over_and_approves_its_own_event() {
    azure_event_on_the_leader_hands_over("Preempt");
}

#[test]
fn azure_terminate_on_the_leader_hands_over_and_approves_its_own_event() {
    azure_event_on_the_leader_hands_over("Terminate");
}

#[test]
fn gce_preemption_on_the_leader_hands_over() {
    handover_on_notice(
        "gcp",
        Machine::default(),
        json!({"cloud": "gcp", "kind": "preempted"}),
        |_, _, _| {},
    );
}

/// A notice on a follower's machine: the follower stops campaigning, the leader keeps its
/// term; once the leader is gone, nobody leads. With `--watch-notices auto` (the fake answers
/// as all three clouds; the notice is AWS's).
#[test]
fn a_notice_on_a_follower_stops_its_campaign_and_leaves_the_leader_alone() {
    let mut case = Case::new();
    let fake_a = FakeMetadata::start(&Machine::default());
    let fake_b = FakeMetadata::start(&Machine::default());
    let args = watching("auto");
    let (a, b, first) = case.elect(("a", Some(&fake_a)), ("b", Some(&fake_b)), &args);

    fake_b.raise(json!({"cloud": "aws", "kind": "spot"}));
    case.wait_logged("b", NOTICE_SEEN);
    std::thread::sleep(SEVERAL_POLLS);
    case.assert_still_leads(&first);
    assert!(!case.stderr("a").contains(NOTICE_SEEN));

    // The leader goes: the doomed follower must not take the released lease.
    case.assert_never_leads_again(b, a);
    assert_eq!(case.starts().len(), 1);
}

/// A process started on a machine whose notice is already out (a restart there, say by
/// systemd) never takes the lease, not even for a moment: it looks at the metadata service
/// before it campaigns. Alone on the key, it would otherwise win at once.
#[test]
fn an_instance_started_on_a_doomed_machine_never_takes_the_lease() {
    let mut case = Case::new();
    let fake = FakeMetadata::start(&Machine::default());
    fake.raise(json!({"cloud": "aws", "kind": "spot"}));
    let a = case.spawn("a", Some(&fake), &watching("aws"));
    case.wait_logged("a", NOTICE_SEEN);
    std::thread::sleep(TTL);
    let log = case.stderr("a");
    assert!(!log.contains("acquired the lease"), "{log}");
    assert!(case.starts().is_empty(), "{:?}", case.lines());
    assert!(alive(a.pid()), "{log}");
    case.stop(a);
}

/// A notice path that hangs, then answers garbage, on the leader's machine: for about four
/// ttls the leader keeps its one term (a follower is ready to take over should a renewal be
/// late), no garbage is taken for a notice; cleared, a real notice still hands over.
#[test]
fn a_hanging_or_garbage_notice_endpoint_does_not_delay_renewals() {
    let mut case = Case::new();
    let fake_a = FakeMetadata::start(&Machine::default());
    let fake_b = FakeMetadata::start(&Machine::default());
    let args = watching("aws");
    let (a, b, first) = case.elect(("a", Some(&fake_a)), ("b", Some(&fake_b)), &args);

    let spot = "/latest/meta-data/spot";
    let lifecycle = "/latest/meta-data/autoscaling";
    fake_a.fault(json!({"prefix": spot, "mode": "hang"}));
    std::thread::sleep(TTL * 2);
    case.assert_still_leads(&first);
    let log = case.stderr("a");
    assert!(log.contains(LOOK_FAILED), "the hang was not seen:\n{log}");

    let spot_calls = |fake: &FakeMetadata| {
        fake.calls()
            .iter()
            .filter(|c| c["path"].as_str().is_some_and(|p| p.starts_with(spot)))
            .filter(|c| c["status"] == 200)
            .count()
    };
    fake_a.fault(json!({"prefix": spot, "mode": "garbage"}));
    fake_a.fault(json!({"prefix": lifecycle, "mode": "garbage"}));
    let before = spot_calls(&fake_a);
    std::thread::sleep(TTL * 2);
    case.assert_still_leads(&first);
    let garbage = spot_calls(&fake_a) - before;
    assert!(garbage >= 3, "the garbage was read {garbage} times");
    for id in ["a", "b"] {
        let log = case.stderr(id);
        assert!(!log.contains("leadership lost"), "{id}:\n{log}");
        assert!(!log.contains(NOTICE_SEEN), "{id}:\n{log}");
    }

    fake_a.fault(json!({"prefix": spot, "mode": "none"}));
    fake_a.fault(json!({"prefix": lifecycle, "mode": "none"}));
    let raised = now_unix_ns();
    fake_a.raise(json!({"cloud": "aws", "kind": "spot"}));
    let second = case.next_term(&first, "b");
    eprintln!(
        "MEASURED notice after faults -> new leader's first act: {:.3} s",
        seconds_since(raised, &second)
    );
    case.assert_by_release("b");
    case.assert_never_leads_again(a, b);
}

/// The same setup without a notice: SIGTERM of the leader's `leader` (a release), for the
/// numbers next to the notices'.
#[test]
fn measured_sigterm_handover() {
    let mut case = Case::new();
    let fake_a = FakeMetadata::start(&Machine::default());
    let fake_b = FakeMetadata::start(&Machine::default());
    let args = watching("aws");
    let (a, b, first) = case.elect(("a", Some(&fake_a)), ("b", Some(&fake_b)), &args);
    random_phase();
    let sent = now_unix_ns();
    case.stop(a);
    let second = case.next_term(&first, "b");
    eprintln!(
        "MEASURED sigterm -> new leader's first act: {:.3} s",
        seconds_since(sent, &second)
    );
    case.assert_by_release("b");
    case.stop(b);
}

/// The same setup: SIGKILL of the leader's `leader` (no release; its supervisor stops the
/// command), taken over by expiry.
#[test]
fn measured_sigkill_failover() {
    let mut case = Case::new();
    let fake_a = FakeMetadata::start(&Machine::default());
    let fake_b = FakeMetadata::start(&Machine::default());
    let args = watching("aws");
    let (mut a, b, first) = case.elect(("a", Some(&fake_a)), ("b", Some(&fake_b)), &args);
    random_phase();
    let sent = now_unix_ns();
    a.child.kill().unwrap();
    assert_eq!(exit_status(&mut a.child, EXIT_LIMIT), Err(9));
    let second = case.next_term(&first, "b");
    eprintln!(
        "MEASURED sigkill -> new leader's first act: {:.3} s",
        seconds_since(sent, &second)
    );
    let log = case.stderr("b");
    assert!(log.contains(EXPIRY_TAKEOVER), "{log}");
    case.stop(b);
}

/// `--step-down-on USR1`: the leader hands over and keeps following; it leads again once the
/// other instance is stopped.
#[test]
fn step_down_signal_hands_over_and_keeps_following() {
    let mut case = Case::new();
    let args = ["--step-down-on", "USR1"];
    let (a, b, first) = case.elect(("a", None), ("b", None), &args);
    let sent = now_unix_ns();
    signal(&a.child, Signal::SIGUSR1);
    let second = case.next_term(&first, "b");
    eprintln!(
        "MEASURED step-down -> new leader's first act: {:.3} s",
        seconds_since(sent, &second)
    );
    case.assert_by_release("b");
    assert!(alive(a.pid()), "a exited on its step-down signal");
    assert!(
        !case.lines().iter().any(|l| l.kind == "usr1"),
        "the step-down signal reached the command"
    );
    std::thread::sleep(SEVERAL_POLLS);
    case.assert_still_leads(&second);

    case.stop(b);
    let third = case.next_term(&second, "a");
    assert!(third.token > second.token);
    case.stop(a);
}

/// Without `--step-down-on`, SIGUSR1 is passed on to the command; the term goes on.
#[test]
fn without_the_flag_sigusr1_is_passed_on_to_the_command() {
    let mut case = Case::new();
    let a = case.spawn("a", None, &[]);
    wait_for("a's command", LIMIT, || !case.starts().is_empty());
    let first = case.starts()[0].clone();
    signal(&a.child, Signal::SIGUSR1);
    wait_for("the command's SIGUSR1", LIMIT, || {
        case.lines()
            .iter()
            .any(|l| l.kind == "usr1" && l.pid == first.pid)
    });
    std::thread::sleep(SEVERAL_POLLS);
    case.assert_still_leads(&first);
    case.stop(a);
}

// -- Auto Scaling, with moto --------------------------------------------------------------

/// The fake machine of one instance of a moto group: its instance id, Auto Scaling forwarded
/// to moto.
fn group_machine(moto: &DedicatedMoto, instance: &str) -> Machine {
    Machine {
        aws_instance_id: instance.to_owned(),
        autoscaling_upstream: Some(moto.url().to_owned()),
        ..Machine::default()
    }
}

/// An Auto Scaling scale-in (`target-lifecycle-state` = `Terminated`) with
/// `--complete-lifecycle-hook`: handover, then the leader's own lifecycle action completed
/// with CONTINUE, once.
#[test]
fn a_scale_in_notice_hands_over_and_completes_the_lifecycle_hook() {
    let Some(dedicated) = DedicatedMoto::start() else {
        return;
    };
    let moto = dedicated.api();
    let ids = moto.group("workers", 2);
    let mut case = Case::new();
    let fake_a = FakeMetadata::start(&group_machine(&dedicated, &ids[0]));
    let fake_b = FakeMetadata::start(&group_machine(&dedicated, &ids[1]));
    let mut args = watching("aws");
    args.extend(["--complete-lifecycle-hook", "drain"]);
    let (a, b, first) = case.elect(("a", Some(&fake_a)), ("b", Some(&fake_b)), &args);

    random_phase();
    let raised = now_unix_ns();
    fake_a.raise(json!({"cloud": "aws", "kind": "lifecycle"}));
    let second = case.next_term(&first, "b");
    eprintln!(
        "MEASURED notice {} -> new leader's first act: {:.3} s",
        json!({"cloud": "aws", "kind": "lifecycle"}),
        seconds_since(raised, &second)
    );
    case.assert_by_release("b");
    wait_for("the lifecycle action's completion", LIMIT, || {
        !fake_a.state()["lifecycle_completions"]
            .as_array()
            .unwrap()
            .is_empty()
    });
    case.assert_never_leads_again(a, b);
    let expected = json!([{
        "AutoScalingGroupName": "workers",
        "LifecycleHookName": "drain",
        "InstanceId": ids[0],
        "LifecycleActionResult": "CONTINUE",
    }]);
    assert_eq!(fake_a.state()["lifecycle_completions"], expected);
    assert_eq!(fake_b.state()["lifecycle_completions"], json!([]));
    let log = case.stderr("a");
    assert!(
        log.contains("lifecycle action completed (CONTINUE)"),
        "{log}"
    );
}

/// The supervisor of a running command: the parent of the command's process.
fn parent_of(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 1..];
    after.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The supervisor of the command `pid`: its parent, or in a PID namespace its grandparent
/// (the parent is the namespace's init).
fn supervisor_of(pid: i32) -> i32 {
    let mut p = parent_of(pid);
    for _ in 0..2 {
        let cmdline = std::fs::read_to_string(format!("/proc/{p}/cmdline")).unwrap_or_default();
        if cmdline.contains("__supervise") {
            break;
        }
        p = parent_of(p);
    }
    p
}

/// `--protect-leader aws` on a group of three in moto: the leader's instance is protected, the
/// followers' not (a stale mark is cleared at start-up); a step-down moves the mark; a
/// scale-in to 1 keeps the leader's instance; after a crash of `leader` and its supervisor the
/// mark stays until `leader run` comes back on that machine, which clears it while following,
/// sets it once it leads, and clears it at exit.
#[test]
fn protection_follows_the_leader_through_step_down_scale_in_and_a_crash() {
    let Some(dedicated) = DedicatedMoto::start() else {
        return;
    };
    let moto = dedicated.api();
    let group = "leaders";
    let ids = moto.group(group, 3);
    let mut case = Case::new();
    let fakes: Vec<FakeMetadata> = ids
        .iter()
        .map(|id| FakeMetadata::start(&group_machine(&dedicated, id)))
        .collect();
    let args = [
        "--protect-leader",
        "aws",
        "--protect-every",
        "1s",
        "--step-down-on",
        "USR1",
    ];
    let names = ["a", "b", "c"];
    // A stale mark on c's instance, as an earlier leader there would leave it.
    moto.set_protected(group, &ids[2], true);

    let (a, b, first) = case.elect(("a", Some(&fakes[0])), ("b", Some(&fakes[1])), &args);
    let c = case.spawn("c", Some(&fakes[2]), &args);
    for id in names {
        case.wait_logged(id, "scale-in protection while leading");
    }
    wait_for("a's instance protected", LIMIT, || moto.protected(&ids[0]));
    wait_for("c's stale mark cleared", LIMIT, || !moto.protected(&ids[2]));
    // Two protection periods: the followers write their marks again, and leave them off.
    std::thread::sleep(Duration::from_secs(2));
    assert!(moto.protected(&ids[0]));
    assert!(!moto.protected(&ids[1]) && !moto.protected(&ids[2]));
    case.assert_still_leads(&first);

    // Step-down: the mark moves to the new leader.
    signal(&a.child, Signal::SIGUSR1);
    wait_for("a new term", LIMIT, || {
        case.starts().iter().any(|l| l.token > first.token)
    });
    let new_holder = case.starts().last().unwrap().holder.clone();
    let second = case.next_term(&first, &new_holder);
    let x = names.iter().position(|n| *n == new_holder).unwrap();
    assert!(x == 1 || x == 2, "{second:?}");
    let y = 3 - x;
    wait_for("the mark moved to the new leader", LIMIT, || {
        !moto.protected(&ids[0]) && moto.protected(&ids[x])
    });
    assert!(!moto.protected(&ids[y]));
    assert!(alive(a.pid()));

    // Scale-in to 1: moto removes the two unprotected instances, the followers'.
    moto.set_desired_capacity(group, 1);
    wait_for("the scale-in", LIMIT, || moto.instances(group).len() == 1);
    assert_eq!(moto.instances(group), vec![ids[x].clone()]);
    // Their machines shut down: SIGTERM, as a real scale-in sends.
    let (mut leader, mut others) = (None, Vec::new());
    for instance in [a, b, c] {
        if instance.id == new_holder {
            leader = Some(instance);
        } else {
            others.push(instance);
        }
    }
    for instance in others {
        case.stop(instance);
    }
    let mut leader = leader.unwrap();
    case.assert_still_leads(&second);
    assert!(moto.protected(&ids[x]));

    // A crash of the leading `leader` and its supervisor together: the mark stays.
    let supervisor = supervisor_of(second.pid);
    assert_ne!(supervisor, leader.pid());
    leader.child.kill().unwrap();
    let _ = kill(Pid::from_raw(supervisor), Signal::SIGKILL);
    assert_eq!(exit_status(&mut leader.child, EXIT_LIMIT), Err(9));
    wait_for("the crashed leader's command gone", LIMIT, || {
        !alive(second.pid) && !alive(supervisor)
    });
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        moto.protected(&ids[x]),
        "the mark of the crashed leader went without its process"
    );

    // `leader run` back on that machine: the lease is held until the ttl, so it follows
    // first, and clears the mark while following; then it takes over and sets it.
    let restarted = format!("{new_holder}-restarted");
    let again = case.spawn(&restarted, Some(&fakes[x]), &args);
    wait_for("the stale mark cleared after the restart", LIMIT, || {
        !moto.protected(&ids[x])
    });
    assert_eq!(
        case.starts().last(),
        Some(&second),
        "the mark was cleared only once the restarted instance led"
    );
    let third = case.next_term_after(&second, &restarted, false);
    let log = case.stderr(&restarted);
    assert!(log.contains(EXPIRY_TAKEOVER), "{log}");
    wait_for("the restarted leader's mark", LIMIT, || {
        moto.protected(&ids[x])
    });
    case.assert_still_leads(&third);
    // Stopped, it clears the mark at exit.
    case.stop(again);
    assert!(!moto.protected(&ids[x]), "the mark outlived the run");
}

// -- Sharded runs, and the fixes of the safety review ----------------------------------------

impl Case {
    /// `leader run --id ID ARGS` (with `--shards` in `args`) whose command notes its shard too:
    /// its start, and its stop at SIGTERM.
    fn spawn_sharded(&mut self, id: &str, fake: Option<&FakeMetadata>, args: &[&str]) -> Instance {
        let note = |kind: &str| self.note(kind, " $LEADER_SHARD");
        let script = format!(
            "trap '{stop}; exit 0' TERM; {start}; while :; do sleep 0.05; done",
            stop = note("stop"),
            start = note("start"),
        );
        self.spawn_script(id, fake, args, &script)
    }

    /// As [`spawn_sharded`](Self::spawn_sharded), with a command that notes SIGTERM (`term`)
    /// and runs on: only SIGKILL ends it.
    fn spawn_stubborn(&mut self, id: &str, fake: Option<&FakeMetadata>, args: &[&str]) -> Instance {
        let note = |kind: &str| self.note(kind, " $LEADER_SHARD");
        let script = format!(
            "trap '{term}' TERM; {start}; while :; do sleep 0.05; done",
            term = note("term"),
            start = note("start"),
        );
        self.spawn_script(id, fake, args, &script)
    }

    /// The commands that run now (started, not stopped, alive), checking that no shard has
    /// two.
    fn running(&self) -> Vec<Line> {
        let lines = self.lines();
        let running: Vec<Line> = lines
            .iter()
            .filter(|l| l.kind == "start" && alive(l.pid))
            .filter(|l| !lines.iter().any(|s| s.kind == "stop" && s.pid == l.pid))
            .cloned()
            .collect();
        let mut shards: Vec<Option<u32>> = running.iter().map(|l| l.shard).collect();
        shards.sort_unstable();
        shards.dedup();
        assert_eq!(
            shards.len(),
            running.len(),
            "two commands run for one shard: {running:?}"
        );
        running
    }

    /// Each shard's lines on their own have no overlap of terms (tokens are per shard).
    fn assert_no_overlap_per_shard(&self, shards: u32) {
        let lines = self.lines();
        for shard in 0..shards {
            let of_shard: Vec<Line> = lines
                .iter()
                .filter(|l| l.shard == Some(shard))
                .cloned()
                .collect();
            assert_no_overlap(&of_shard);
        }
    }

    /// How many commands `id` has started.
    fn starts_of(&self, id: &str) -> usize {
        self.starts().iter().filter(|l| l.holder == id).count()
    }
}

/// `--shards` and the notice flags of a sharded instance.
fn sharded_watching(shards: &'static str) -> Vec<&'static str> {
    let mut args = vec!["--shards", shards];
    args.extend(watching("aws"));
    args
}

/// Two instances share two shards; a Spot notice on one of them: each shard it led is led by
/// the other soon after, at a higher token, once its command had stopped; the doomed
/// instance never starts a command again (it runs on, and exits 128+15 on SIGTERM), and the
/// other instance's own shard is left alone.
#[test]
fn a_notice_hands_every_shard_over_and_no_command_starts_again() {
    let mut case = Case::new();
    let fake_a = FakeMetadata::start(&Machine::default());
    let fake_b = FakeMetadata::start(&Machine::default());
    let args = sharded_watching("2");
    let a = case.spawn_sharded("a", Some(&fake_a), &args);
    wait_for("a leads both shards", LIMIT, || case.running().len() == 2);
    let b = case.spawn_sharded("b", Some(&fake_b), &args);
    for id in ["a", "b"] {
        case.wait_logged(id, "watching for scale-in and preemption notices");
    }
    // Whatever the balancing gives within a generous limit (normally one shard each); a
    // leads at least one, having led both first.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::time::Instant::now() < deadline && !case.running().iter().any(|l| l.holder == "b") {
        std::thread::sleep(Duration::from_millis(50));
    }
    wait_for("both shards led", LIMIT, || case.running().len() == 2);
    std::thread::sleep(SEVERAL_POLLS);
    let before = case.running();
    assert_eq!(before.len(), 2, "{before:?}");
    let (doomed, kept): (Vec<Line>, Vec<Line>) = before.into_iter().partition(|l| l.holder == "a");
    assert!(!doomed.is_empty(), "a leads no shard: {kept:?}");
    eprintln!(
        "a leads {:?}, b {:?}",
        doomed.iter().map(|l| l.shard).collect::<Vec<_>>(),
        kept.iter().map(|l| l.shard).collect::<Vec<_>>()
    );
    let a_starts = case.starts_of("a");

    random_phase();
    let raised = now_unix_ns();
    fake_a.raise(json!({"cloud": "aws", "kind": "spot"}));
    wait_for("b leads every shard", LIMIT, || {
        let running = case.running();
        running.len() == 2 && running.iter().all(|l| l.holder == "b")
    });
    let lines = case.lines();
    for old in &doomed {
        let new = lines
            .iter()
            .find(|l| l.kind == "start" && l.shard == old.shard && l.token > old.token)
            .unwrap_or_else(|| panic!("shard {:?} not taken over: {lines:?}", old.shard));
        assert_eq!(new.holder, "b", "{lines:?}");
        let stopped = lines
            .iter()
            .position(|l| l.kind == "stop" && l.pid == old.pid);
        let started = lines.iter().position(|l| l == new).unwrap();
        assert!(
            stopped.is_some_and(|s| s < started),
            "a's command of shard {:?} must stop before b's starts: {lines:?}",
            old.shard
        );
        assert!(!alive(old.pid), "a's command {} survives", old.pid);
        eprintln!(
            "MEASURED sharded notice -> shard {:?} led by b: {:.3} s",
            old.shard,
            seconds_since(raised, new)
        );
    }
    for own in &kept {
        assert!(
            case.running().contains(own),
            "b's own shard was disturbed: {:?}",
            case.lines()
        );
    }
    case.assert_no_overlap_per_shard(2);
    case.wait_logged("a", "handed over every shard after the notice");
    let log = case.stderr("a");
    assert!(log.contains(NOTICE_SEEN), "{log}");

    // a never starts a command again: over more than a ttl, while b leads both shards.
    std::thread::sleep(TTL + Duration::from_secs(1));
    assert_eq!(
        case.starts_of("a"),
        a_starts,
        "a started a command after its notice: {:?}",
        case.lines()
    );
    assert!(alive(a.pid()), "a exited after its notice:\n{log}");
    assert!(case.running().iter().all(|l| l.holder == "b"));
    case.stop(a);
    case.stop(b);
    case.assert_no_overlap_per_shard(2);
}

/// SIGTERM to `instance`, whose commands may ignore it: it exits 128+15 (within the grace).
fn stop_ignoring(case: &Case, mut instance: Instance) {
    signal(&instance.child, Signal::SIGTERM);
    assert_eq!(
        exit_status(&mut instance.child, EXIT_LIMIT),
        Ok(128 + 15),
        "{}: {}",
        instance.id,
        case.stderr(&instance.id)
    );
}

/// A notice's stop of a shard's command that ignores SIGTERM, and the shard's supervisor
/// SIGKILLed during that stop: the command is not started again (the notice stands), and
/// the shard is left to expire, not released: another instance takes it by expiry.
#[test]
fn after_a_notice_a_supervisor_killed_during_the_stop_does_not_restart_the_command() {
    let mut case = Case::new();
    let fake_a = FakeMetadata::start(&Machine::default());
    let fake_b = FakeMetadata::start(&Machine::default());
    let mut args = sharded_watching("1");
    // The stop of a command that ignores SIGTERM lasts the grace: time to kill the supervisor.
    args.extend(["--grace", "1500ms"]);
    let a = case.spawn_stubborn("a", Some(&fake_a), &args);
    wait_for("a leads shard 0", LIMIT, || !case.starts().is_empty());
    case.wait_logged("a", "watching for scale-in and preemption notices");
    let first = case.starts()[0].clone();
    assert_eq!((first.holder.as_str(), first.shard), ("a", Some(0)));
    let supervisor = supervisor_of(first.pid);
    assert!(descendants(a.pid()).contains(&supervisor));
    let cmdline = std::fs::read_to_string(format!("/proc/{supervisor}/cmdline")).unwrap();
    assert!(cmdline.contains("__supervise"), "{cmdline:?}");

    fake_a.raise(json!({"cloud": "aws", "kind": "spot"}));
    wait_for("the command's SIGTERM", LIMIT, || {
        case.lines()
            .iter()
            .any(|l| l.kind == "term" && l.pid == first.pid)
    });
    kill(Pid::from_raw(supervisor), Signal::SIGKILL).unwrap();
    let killed = now_unix_ns();
    wait_for("a's command gone with its supervisor", LIMIT, || {
        !alive(first.pid) && !alive(supervisor)
    });
    // The other instance may campaign meanwhile: a keeps the shard until its term expires.
    let b = case.spawn_stubborn("b", Some(&fake_b), &args);

    // Several restart pauses (1 s, then 2 s): no command of a's again.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        case.starts_of("a"),
        1,
        "a started the command again after its notice: {:?}\n{}",
        case.lines(),
        case.stderr("a")
    );
    let log = case.stderr("a");
    assert!(
        log.contains("the supervisor died during the step-down; the shard is left to expire"),
        "{log}"
    );
    assert!(alive(a.pid()), "a exited after its notice:\n{log}");

    wait_for("b leads shard 0", LIMIT, || {
        case.starts().iter().any(|l| l.holder == "b")
    });
    let lines = case.lines();
    let second = lines
        .iter()
        .find(|l| l.kind == "start" && l.holder == "b")
        .unwrap();
    assert_eq!(second.shard, Some(0));
    assert!(second.token > first.token, "{lines:?}");
    assert!(second.unix_ns > killed);
    case.assert_no_overlap_per_shard(1);
    // Left to expire: b took a's records over by expiry, not after a release.
    let log_b = case.stderr("b");
    assert!(log_b.contains(EXPIRY_TAKEOVER), "{log_b}");
    eprintln!(
        "MEASURED supervisor killed during the notice's stop -> shard led by b: {:.3} s",
        seconds_since(killed, second)
    );
    case.wait_logged("a", "handed over every shard after the notice");
    assert_eq!(case.starts_of("a"), 1, "{:?}", case.lines());
    stop_ignoring(&case, a);
    stop_ignoring(&case, b);
}

/// `--wait` is about the first term: after a step-down, the instance follows without it (it
/// does not exit 73 as though it had waited too long) and leads again once the other
/// instance is gone.
#[test]
fn step_down_with_wait_keeps_following() {
    let mut case = Case::new();
    let spawned = std::time::Instant::now();
    let mut a = case.spawn("a", None, &["--wait", "2s", "--step-down-on", "USR1"]);
    wait_for("a's command", LIMIT, || !case.starts().is_empty());
    let b = case.spawn("b", None, &[]);
    case.wait_logged("b", "campaigning");
    // Past the --wait of a (which it met).
    let past_wait = Duration::from_secs(3);
    std::thread::sleep(
        past_wait
            .saturating_sub(spawned.elapsed())
            .max(SEVERAL_POLLS),
    );
    let first = case.starts()[0].clone();
    assert_eq!(first.holder, "a");
    case.assert_still_leads(&first);

    signal(&a.child, Signal::SIGUSR1);
    let second = case.next_term(&first, "b");
    case.assert_by_release("b");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        a.child.try_wait().unwrap(),
        None,
        "a exited after its step-down:\n{}",
        case.stderr("a")
    );
    case.assert_still_leads(&second);

    case.stop(b);
    let third = case.next_term(&second, "a");
    assert!(third.token > second.token);
    case.stop(a);
}
