//! `leader run --shards N` and `leader status --shards` on real processes with real signals,
//! on the file store.
//!
//! The command of each shard is `tests/worker.py` (see its docstring: it finishes its work in
//! 0.9 s after SIGTERM and starts a daemon that only SIGKILL ends), started by a shell that
//! first appends `HOLDER SHARD SHARDS TOKEN PID` to `starts` from the variables `leader` gives
//! it; the worker logs to `shard.<SHARD>.log`, so each shard's terms can be checked for
//! overlap as a single key's are. Timing as in `supervision.rs`: ttl 3 s, renew every
//! 500 ms, grace 1.3 s.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr,
    clippy::disallowed_methods // real processes need real time
)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{Signal, kill};
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

/// A shell line for the command: note the variables and its pid as this process sees it (in
/// the command's PID namespace `$$` is another number), then become the worker.
const COMMAND: &str = r#"read -r me _ < /proc/self/stat; echo "$LEADER_HOLDER_ID $LEADER_SHARD $LEADER_SHARDS $LEADER_FENCING_TOKEN $me" >> "$0/starts"; exec python3 "$1" "$0/shard.$LEADER_SHARD.log""#;

/// One line of `starts`: a command started.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Start {
    holder: String,
    shard: u32,
    shards: u32,
    token: u64,
    pid: i32,
}

struct Drill {
    dir: tempfile::TempDir,
    /// Every `leader` started; each is killed with everything below it when the test ends,
    /// so that a failing test leaves nothing behind.
    spawned: std::cell::RefCell<Vec<i32>>,
}

impl Drop for Drill {
    fn drop(&mut self) {
        let mut all: Vec<i32> = Vec::new();
        for pid in self.spawned.borrow().iter() {
            all.extend(descendants(*pid));
            all.push(*pid);
        }
        // Not `starts()`: it may be what failed.
        let starts = std::fs::read_to_string(self.path().join("starts")).unwrap_or_default();
        all.extend(
            starts
                .lines()
                .filter_map(|l| l.rsplit(' ').next()?.parse::<i32>().ok()),
        );
        for shard in 0..64 {
            all.extend(events(&self.log(shard)).iter().map(|e| e.pid));
        }
        for pid in all {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

impl Drill {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            spawned: Default::default(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn store(&self) -> String {
        format!("file://{}/job", self.path().display())
    }

    fn log(&self, shard: u32) -> PathBuf {
        self.path().join(format!("shard.{shard}.log"))
    }

    /// `leader run --shards N` with id `id`, in a process group of its own.
    fn leader(&self, id: &str, shards: u32) -> Child {
        let child = Command::new(LEADER)
            .args(["run", "--store", &self.store(), "--id", id])
            .args(["--shards", &shards.to_string()])
            .args(TIMING)
            .args(["--", "sh", "-c", COMMAND])
            .arg(self.path())
            .arg(worker())
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

    fn stderr(&self, id: &str) -> String {
        std::fs::read_to_string(self.path().join(format!("{id}.stderr"))).unwrap_or_default()
    }

    /// Every line of `starts`; a line without one of the variables fails the test.
    fn starts(&self) -> Vec<Start> {
        std::fs::read_to_string(self.path().join("starts"))
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let p: Vec<&str> = l.split(' ').collect();
                let parsed = (p.len() == 5).then(|| {
                    Some(Start {
                        holder: p[0].to_owned(),
                        shard: p[1].parse().ok()?,
                        shards: p[2].parse().ok()?,
                        token: p[3].parse().ok()?,
                        pid: p[4].parse().ok()?,
                    })
                });
                parsed
                    .flatten()
                    .filter(|s| !s.holder.is_empty() && s.token > 0)
                    .unwrap_or_else(|| panic!("a command lacked a variable: {l:?}"))
            })
            .collect()
    }

    /// The commands that run now, checking that no shard has two.
    fn running(&self) -> Vec<Start> {
        let running: Vec<Start> = self.starts().into_iter().filter(|s| alive(s.pid)).collect();
        let mut shards = BTreeSet::new();
        for s in &running {
            assert!(
                shards.insert(s.shard),
                "two commands run for shard {}: {running:?}",
                s.shard
            );
        }
        running
    }

    fn has(&self, shard: u32, token: u64, kind: &str) -> bool {
        events(&self.log(shard))
            .iter()
            .any(|e| e.token == token && e.kind == kind)
    }

    /// Whether `shards` shards run, spread over `holders` as `want` (each holder's count).
    fn balanced(&self, shards: u32, want: &BTreeMap<&str, usize>) -> bool {
        let running = self.running();
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for s in &running {
            *counts.entry(s.holder.as_str()).or_default() += 1;
        }
        let all: BTreeSet<u32> = running.iter().map(|s| s.shard).collect();
        all == (0..shards).collect() && counts == *want
    }

    /// `leader status --shards --json`.
    fn status_json(&self) -> serde_json::Value {
        let out = Command::new(LEADER)
            .args(["status", "--store", &self.store(), "--shards", "--json"])
            .env("LEADER_LOG", "warn")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Each held member's claimed shards, from `leader status --shards --json`.
    fn claims(&self) -> BTreeMap<String, Vec<u64>> {
        let json = self.status_json();
        json["members"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["held"] == true)
            .map(|m| {
                let claims = m["claims"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s.as_u64().unwrap())
                    .collect();
                (m["id"].as_str().unwrap().to_owned(), claims)
            })
            .collect()
    }

    /// No shard's terms overlap in time, on each shard's worker log (every process of the
    /// command, its daemon included).
    fn assert_no_overlap(&self, shards: u32) {
        for shard in 0..shards {
            assert_no_overlap(&events(&self.log(shard)));
        }
    }

    /// Every process any term's command started (the worker and its daemon).
    fn all_pids(&self, shards: u32) -> BTreeSet<i32> {
        let mut pids: BTreeSet<i32> = self.starts().iter().map(|s| s.pid).collect();
        for shard in 0..shards {
            pids.extend(events(&self.log(shard)).iter().map(|e| e.pid));
        }
        pids
    }
}

fn stop(child: &mut Child, drill: &Drill, id: &str) {
    signal(child, Signal::SIGTERM);
    assert_eq!(
        exit_code(child, Duration::from_secs(15)),
        128 + 15,
        "{}",
        drill.stderr(id)
    );
}

/// Three instances share six shards two each; SIGKILL of one stops its commands (and their
/// daemons) and the other two take its shards with higher tokens once its membership
/// expired; SIGTERM of the rest stops every command and leaves no member holding.
#[test]
fn three_instances_share_six_shards_and_take_over_from_a_killed_one() {
    let d = Drill::new();
    let mut procs: Vec<Child> = (0..3).map(|i| d.leader(&format!("c{i}"), 6)).collect();
    let even = BTreeMap::from([("c0", 2), ("c1", 2), ("c2", 2)]);
    wait_for("two shards each", Duration::from_secs(30), || {
        d.balanced(6, &even)
    });
    for s in d.starts() {
        assert_eq!(s.shards, 6, "{s:?}");
        assert!(s.shard < 6, "{s:?}");
    }
    wait_for("the members' claims", Duration::from_secs(10), || {
        d.claims().values().map(Vec::len).collect::<Vec<_>>() == [2, 2, 2]
    });
    // Renews reach every supervisor: the commands run on, across several ttls.
    let before = d.running();
    std::thread::sleep(Duration::from_millis(4000));
    assert_eq!(d.running(), before, "the commands were stopped while led");

    // SIGKILL of c0 alone: no release. Its supervisors stop its commands and their daemons.
    let victim: Vec<Start> = before.into_iter().filter(|s| s.holder == "c0").collect();
    let mut victim_pids: Vec<i32> = victim.iter().map(|s| s.pid).collect();
    for s in &victim {
        wait_for("the daemon's line", Duration::from_secs(5), || {
            d.has(s.shard, s.token, "daemon")
        });
        victim_pids.extend(
            events(&d.log(s.shard))
                .iter()
                .filter(|e| e.token == s.token)
                .map(|e| e.pid),
        );
    }
    let killed_at = Instant::now();
    procs[0].kill().unwrap();
    procs[0].wait().unwrap();
    for pid in &victim_pids {
        wait_for("c0's commands to stop", Duration::from_secs(10), || {
            !alive(*pid)
        });
    }
    let stopped = killed_at.elapsed();

    // The others take its shards once its membership is over, with higher tokens.
    let split = BTreeMap::from([("c1", 3), ("c2", 3)]);
    wait_for("c0's shards taken over", Duration::from_secs(30), || {
        d.balanced(6, &split)
    });
    eprintln!(
        "MEASURED c0's commands gone {:.3} s after its SIGKILL; shards taken over {:.3} s after it",
        stopped.as_secs_f64(),
        killed_at.elapsed().as_secs_f64()
    );
    let now: BTreeMap<u32, Start> = d.running().into_iter().map(|s| (s.shard, s)).collect();
    for old in &victim {
        let new = &now[&old.shard];
        assert_ne!(new.holder, "c0");
        assert!(
            new.token > old.token,
            "shard {}: {old:?} then {new:?}",
            old.shard
        );
    }
    d.assert_no_overlap(6);

    // SIGTERM of the rest: every command stops, then the shards and memberships are released.
    for (i, p) in procs.iter_mut().enumerate().skip(1) {
        stop(p, &d, &format!("c{i}"));
    }
    for pid in d.all_pids(6) {
        assert!(!alive(pid), "process {pid} of a command survived");
    }
    d.assert_no_overlap(6);
    let json = d.status_json();
    let members = json["members"].as_array().unwrap();
    assert!(members.iter().all(|m| m["held"] == false), "{json}");
    assert_eq!(json["unclaimed_ranges"], "0-5", "{json}");
}

/// A shard that its instance hands to a newcomer (rebalancing) moves only once its command
/// and daemon are gone; so does a shard released at SIGTERM.
#[test]
fn a_shard_moves_only_after_its_command_exited() {
    let d = Drill::new();
    let mut a = d.leader("a", 2);
    wait_for("a leads both shards", Duration::from_secs(15), || {
        d.balanced(2, &BTreeMap::from([("a", 2)]))
    });
    for s in d.running() {
        wait_for("the daemons", Duration::from_secs(5), || {
            d.has(s.shard, s.token, "daemon")
        });
    }
    let mut b = d.leader("b", 2);
    wait_for("one shard each", Duration::from_secs(20), || {
        d.balanced(2, &BTreeMap::from([("a", 1), ("b", 1)]))
    });
    let moved = d.running().into_iter().find(|s| s.holder == "b").unwrap();
    // a's command of that shard got the signal and finished its work first.
    let events = events(&d.log(moved.shard));
    assert!(
        events
            .iter()
            .any(|e| e.kind == "stop" && e.token < moved.token),
        "{events:?}"
    );
    std::thread::sleep(Duration::from_millis(500));
    d.assert_no_overlap(2);

    // SIGTERM to a: b takes a's shard only after a's command stopped.
    stop(&mut a, &d, "a");
    wait_for("b leads both", Duration::from_secs(20), || {
        d.balanced(2, &BTreeMap::from([("b", 2)]))
    });
    std::thread::sleep(Duration::from_millis(500));
    d.assert_no_overlap(2);
    stop(&mut b, &d, "b");
    for pid in d.all_pids(2) {
        assert!(!alive(pid), "process {pid} of a command survived");
    }
}

/// A command that exits by itself while its shard is led is started again in the same term;
/// the instance keeps running.
#[test]
fn a_command_that_exits_is_started_again_in_the_same_term() {
    let dir = tempfile::tempdir().unwrap();
    let starts = dir.path().join("starts");
    let mut a = Command::new(LEADER)
        .args(["run", "--store"])
        .arg(format!("file://{}/job", dir.path().display()))
        .args(["--shards", "1", "--ttl", "2s", "--id", "a"])
        .args(["--", "sh", "-c"])
        .arg(format!(
            "echo \"$LEADER_SHARD $LEADER_FENCING_TOKEN\" >> {}; exit 3",
            starts.display()
        ))
        .env("LEADER_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = || -> Vec<String> {
        std::fs::read_to_string(&starts)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    };
    wait_for("a second run", Duration::from_secs(15), || {
        lines().len() >= 2
    });
    let runs = lines();
    assert!(runs.iter().all(|l| *l == runs[0]), "{runs:?}");
    assert!(runs[0].starts_with("0 "), "{runs:?}");
    assert_eq!(a.try_wait().unwrap(), None, "leader must keep running");
    signal(&a, Signal::SIGTERM);
    assert_eq!(exit_code(&mut a, Duration::from_secs(10)), 128 + 15);
}

/// SIGKILL of one shard's supervisor: the kernel kills its command, `leader` its daemon, and
/// the command is started again in the same term; the other shards' commands run on.
#[test]
fn sigkill_of_one_supervisor_spares_the_other_shards() {
    let d = Drill::new();
    let mut a = d.leader("a", 2);
    wait_for("a leads both shards", Duration::from_secs(15), || {
        d.balanced(2, &BTreeMap::from([("a", 2)]))
    });
    let running = d.running();
    for s in &running {
        wait_for("the daemons", Duration::from_secs(5), || {
            d.has(s.shard, s.token, "daemon")
        });
    }
    let (victim, other) = (&running[0], &running[1]);
    // The victim's supervisor: the parent of its command, or in a PID namespace the parent
    // of the namespace's init (`__exec`).
    let parent = |pid: i32| -> i32 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        stat[stat.rfind(')').unwrap() + 1..]
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap()
    };
    let mut supervisor = parent(victim.pid);
    if std::fs::read_to_string(format!("/proc/{supervisor}/cmdline"))
        .unwrap()
        .contains("__exec")
    {
        supervisor = parent(supervisor);
    }
    let cmdline = std::fs::read_to_string(format!("/proc/{supervisor}/cmdline")).unwrap();
    assert!(cmdline.contains("__supervise"), "{cmdline:?}");
    let victims: Vec<i32> = events(&d.log(victim.shard)).iter().map(|e| e.pid).collect();
    kill(Pid::from_raw(supervisor), Signal::SIGKILL).unwrap();
    for pid in &victims {
        wait_for("the victim's processes", Duration::from_secs(10), || {
            !alive(*pid)
        });
    }
    wait_for("the command again", Duration::from_secs(15), || {
        d.running().iter().any(|s| s.shard == victim.shard)
    });
    let again = d.running();
    let restarted = again.iter().find(|s| s.shard == victim.shard).unwrap();
    assert_eq!(restarted.token, victim.token, "the same term: {again:?}");
    assert_ne!(restarted.pid, victim.pid);
    assert!(
        again.contains(other),
        "the other shard's command: {again:?}"
    );
    let daemon = events(&d.log(other.shard))
        .iter()
        .find(|e| e.kind == "daemon")
        .unwrap()
        .pid;
    assert!(alive(daemon), "the other shard's daemon was killed");
    stop(&mut a, &d, "a");
    for pid in d.all_pids(2) {
        assert!(!alive(pid), "process {pid} of a command survived");
    }
}

/// `leader status --shards` shows who claims which shards, as text and as JSON.
#[test]
fn status_shows_the_assignment() {
    let d = Drill::new();
    let mut a = d.leader("a", 5);
    wait_for("a leads every shard", Duration::from_secs(15), || {
        d.balanced(5, &BTreeMap::from([("a", 5)]))
    });
    wait_for("a's claims", Duration::from_secs(10), || {
        d.claims() == BTreeMap::from([("a".to_owned(), vec![0, 1, 2, 3, 4])])
    });
    let alone = d.status_json();
    assert_eq!(alone["members"][0]["ranges"], "0-4", "{alone}");
    assert_eq!(alone["members"][0]["count"], 5, "{alone}");
    let mut b = d.leader("b", 5);
    wait_for("three and two", Duration::from_secs(20), || {
        let running = d.running();
        let n = |h: &str| running.iter().filter(|s| s.holder == h).count();
        running.len() == 5 && n("a").abs_diff(n("b")) == 1
    });
    // The claims catch up with the commands within a renew.
    let by_holder = || {
        let mut m: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for s in d.running() {
            m.entry(s.holder).or_default().push(u64::from(s.shard));
        }
        for v in m.values_mut() {
            v.sort();
        }
        m
    };
    // One snapshot in which the claims are those of the running commands and every shard is
    // claimed (a handover has a moment when neither side claims the shard it moves).
    let mut json = serde_json::Value::Null;
    wait_for("the claims", Duration::from_secs(10), || {
        json = d.status_json();
        let claims: BTreeMap<String, Vec<u64>> = json["members"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["held"] == true)
            .map(|m| {
                let ids = m["claims"].as_array().unwrap();
                let ids = ids.iter().map(|c| c.as_u64().unwrap()).collect();
                (m["id"].as_str().unwrap().to_owned(), ids)
            })
            .collect();
        claims == by_holder() && json["unclaimed"] == serde_json::json!([])
    });
    assert_eq!(json["key"], "job", "{json}");
    assert_eq!(json["shards"], 5, "{json}");
    assert_eq!(json["unclaimed"], serde_json::json!([]), "{json}");
    assert_eq!(json["unclaimed_ranges"], "", "{json}");
    let members = json["members"].as_array().unwrap();
    assert_eq!(members.len(), 2, "{json}");
    for m in members {
        assert_eq!(m["held"], true, "{json}");
        assert!(m["token"].as_u64().unwrap() >= 1, "{json}");
        let claims: Vec<u64> = m["claims"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_u64().unwrap())
            .collect();
        assert_eq!(m["count"], claims.len(), "{json}");
        assert_eq!(m["ranges"], ranges(&claims), "{json}");
    }

    let text = Command::new(LEADER)
        .args(["status", "--store", &d.store(), "--shards"])
        .env("LEADER_LOG", "warn")
        .output()
        .unwrap();
    assert!(text.status.success());
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.starts_with("job: 5 shards; 2 of 2 members hold their membership; 0 unclaimed\n"),
        "{text}"
    );
    for m in members {
        let line = format!(
            "  {}: held, membership token {}, {} shards: {}\n",
            m["id"].as_str().unwrap(),
            m["token"],
            m["count"],
            m["ranges"].as_str().unwrap()
        );
        assert!(text.contains(&line), "{line:?} in\n{text}");
    }
    // Without --shards: the key has no lease record of its own, and status says why.
    let plain = Command::new(LEADER)
        .args(["status", "--store", &d.store()])
        .env("LEADER_LOG", "warn")
        .output()
        .unwrap();
    let plain = String::from_utf8(plain.stdout).unwrap();
    assert!(
        plain.contains("job is a sharded key (5 shards): see `leader status --shards`"),
        "{plain}"
    );
    let plain = Command::new(LEADER)
        .args(["status", "--store", &d.store(), "--json"])
        .env("LEADER_LOG", "warn")
        .output()
        .unwrap();
    let plain: serde_json::Value = serde_json::from_slice(&plain.stdout).unwrap();
    assert_eq!(plain["state"], "absent", "{plain}");
    assert_eq!(plain["sharded"], true, "{plain}");

    stop(&mut a, &d, "a");
    stop(&mut b, &d, "b");
    let json = d.status_json();
    assert!(
        json["members"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["held"] == false),
        "{json}"
    );
    assert_eq!(json["unclaimed_ranges"], "0-4", "{json}");
}

/// Ascending shards as `leader status` prints them: `0-2,4`.
fn ranges(shards: &[u64]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < shards.len() {
        let mut j = i;
        while j + 1 < shards.len() && shards[j + 1] == shards[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            shards[i].to_string()
        } else {
            format!("{}-{}", shards[i], shards[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// `leader` with `args`, to its end: (exit code, stdout, stderr); killed, with code -1, if
/// it runs for more than 10 s.
fn run(args: &[&str]) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    let mut child = Command::new(LEADER)
        .args(args)
        .env("LEADER_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let start = Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code().unwrap_or(-1);
        }
        if start.elapsed() > Duration::from_secs(10) {
            let _ = nix::sys::signal::killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
            break -1;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    (code, read(&out), read(&err))
}

#[test]
fn absurd_shard_flags_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}/job", dir.path().display());
    let s = store.as_str();
    for (args, says) in [
        (vec!["--shards", "0", "--", "true"], "0 is not in 1..=16384"),
        (
            vec!["--shards", "16385", "--", "true"],
            "16385 is not in 1..=16384",
        ),
        (vec!["--shards=-3", "--", "true"], "-3 is not in 1..=16384"),
        (vec!["--shards", "many", "--", "true"], "many"),
        (vec!["--shards", "4"], "CMD"),
        (
            vec!["--shards", "4", "--wait", "1s", "--", "true"],
            "--wait cannot be used with --shards",
        ),
        (
            vec!["--shards", "4", "--meta", "a=b", "--", "true"],
            "--meta cannot be used with --shards",
        ),
    ] {
        let mut all = vec!["run", "--store", s];
        all.extend(&args);
        let (code, _, err) = run(&all);
        assert_eq!(code, 64, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // Nothing was created in the store by a refused run.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    // A timing error stays a configuration error (78), as without --shards.
    let (code, _, err) = run(&[
        "run", "--store", s, "--shards", "2", "--ttl", "0s", "--", "true",
    ]);
    assert_eq!(code, 78, "{err}");
    // A key nobody joined: status says so, exit 0.
    let (code, out, err) = run(&["status", "--store", s, "--shards"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("no instance has joined"), "{out}");
    let (code, out, _) = run(&["status", "--store", s, "--shards", "--json"]);
    assert_eq!(code, 0);
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["shards"], serde_json::Value::Null, "{json}");
    assert_eq!(json["members"], serde_json::json!([]), "{json}");
}

/// An instance started with another number of shards than the key's is refused (78) and
/// changes nothing.
#[test]
fn another_number_of_shards_is_refused() {
    let d = Drill::new();
    let mut a = d.leader("a", 3);
    wait_for("a leads every shard", Duration::from_secs(15), || {
        d.balanced(3, &BTreeMap::from([("a", 3)]))
    });
    let before = d.running();
    let store = d.store();
    let (code, _, err) = run(&["run", "--store", &store, "--shards", "4", "--", "true"]);
    assert_eq!(code, 78, "{err}");
    assert!(
        err.contains("the sharded key job has 3 shards, this instance was started with 4"),
        "{err}"
    );
    assert_eq!(d.running(), before);
    stop(&mut a, &d, "a");
}
