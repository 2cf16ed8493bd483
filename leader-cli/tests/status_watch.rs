//! `leader status --watch` on the file store: real processes, real signals, short ttl.
//!
//! The watcher reads every 100 ms; each test runs a few seconds and asserts what was printed
//! (one line per change, never one per renew), how the watch ends (signals, a closed stdout,
//! permanent errors) and how it rides out a transient error.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr,
    clippy::disallowed_methods // real processes need real time
)] // test code

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use common::{LEADER, exit_code, signal};
use nix::sys::signal::Signal;

/// How long a line may take to show up after the change that causes it.
const LINE: Duration = Duration::from_secs(10);

struct Dir(tempfile::TempDir);

impl Dir {
    fn new() -> Self {
        Self(tempfile::tempdir().unwrap())
    }
    fn path(&self) -> &Path {
        self.0.path()
    }
    fn store(&self, key: &str) -> String {
        format!("file://{}/{key}", self.path().display())
    }
    /// The file store's record of `key`.
    fn record(&self, key: &str) -> PathBuf {
        self.path().join(format!("{key}.lease"))
    }
}

/// A `leader status --watch` process whose stdout lines arrive on a channel and whose
/// stderr goes to a file. Killed when dropped, if it still runs.
struct Watch {
    child: Child,
    lines: Receiver<String>,
    stderr: tempfile::NamedTempFile,
}

impl Watch {
    /// Starts `leader status --store STORE --watch --interval 100ms EXTRA`. The reader of its
    /// stdout stops (closing the pipe) after `keep` lines, if given.
    fn start(store: &str, extra: &[&str], keep: Option<usize>) -> Self {
        let stderr = tempfile::NamedTempFile::new().unwrap();
        let mut child = Command::new(LEADER)
            .args(["status", "--store", store, "--watch", "--interval", "100ms"])
            .args(extra)
            .env("LEADER_LOG", "warn")
            .env_remove("LEADER_JSON")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr.reopen().unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let reader = BufReader::new(stdout);
            for line in reader.lines().take(keep.unwrap_or(usize::MAX)) {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
            // The pipe's read end closes here.
        });
        Self {
            child,
            lines,
            stderr,
        }
    }

    /// The next line, within `LINE`.
    fn next(&self, what: &str) -> String {
        match self.lines.recv_timeout(LINE) {
            Ok(line) => line,
            Err(e) => panic!(
                "no line ({what}) within {LINE:?}: {e:?}; stderr: {}",
                self.stderr()
            ),
        }
    }

    /// The next line as JSON.
    fn next_json(&self, what: &str) -> serde_json::Value {
        let line = self.next(what);
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?} is not JSON: {e}"))
    }

    /// Asserts that no line arrives for `quiet`.
    fn assert_quiet(&self, quiet: Duration, why: &str) {
        match self.lines.recv_timeout(quiet) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(line) => panic!("an unexpected line ({why}): {line}"),
            Err(RecvTimeoutError::Disconnected) => {
                panic!("stdout closed ({why}); stderr: {}", self.stderr())
            }
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.stderr.path()).unwrap()
    }

    /// Its exit code (within 10 s) and stderr.
    fn end(&mut self) -> (i32, String) {
        (
            exit_code(&mut self.child, Duration::from_secs(10)),
            self.stderr(),
        )
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `leader run --store STORE --ttl 2s --id ID -- sh -c SCRIPT` to its end; asserts exit 0.
fn run(store: &str, id: &str, script: &str) {
    let out = Command::new(LEADER)
        .args(["run", "--store", store, "--ttl", "2s", "--id", id])
        .args(["--", "sh", "-c", script])
        .env("LEADER_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "leader run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `leader status ARGS` to its end (killed after 10 s: a watch that should have refused to
/// start): exit code, stdout, stderr.
fn status(args: &[&str]) -> (i32, String, String) {
    let out = tempfile::NamedTempFile::new().unwrap();
    let err = tempfile::NamedTempFile::new().unwrap();
    let mut child = Command::new(LEADER)
        .arg("status")
        .args(args)
        .env("LEADER_LOG", "warn")
        .env_remove("LEADER_JSON")
        .stdin(Stdio::null())
        .stdout(out.reopen().unwrap())
        .stderr(err.reopen().unwrap())
        .spawn()
        .unwrap();
    let mut code = None;
    for _ in 0..500 {
        if let Some(status) = child.try_wait().unwrap() {
            code = Some(status.code().unwrap_or(-1));
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let Some(code) = code else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("`leader status {}` did not end within 10 s", args.join(" "));
    };
    (
        code,
        std::fs::read_to_string(out.path()).unwrap(),
        std::fs::read_to_string(err.path()).unwrap(),
    )
}

/// The field names of a JSON object.
fn fields(v: &serde_json::Value) -> BTreeSet<String> {
    v.as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .cloned()
        .collect()
}

/// The field names of `leader status --json EXTRA` on `store`.
fn status_fields(store: &str, extra: &[&str]) -> BTreeSet<String> {
    let (code, out, err) = status(&[&["--store", store, "--json"], extra].concat());
    assert_eq!(code, 0, "{err}");
    fields(&serde_json::from_str(&out).unwrap())
}

/// Asserts that `line` has the fields `expected` plus `at_unix_ms`, and the given state and
/// holder (none if empty).
fn assert_line(line: &serde_json::Value, expected: &BTreeSet<String>, state: &str, holder: &str) {
    let mut want = expected.clone();
    want.insert("at_unix_ms".to_owned());
    assert_eq!(fields(line), want, "{line}");
    assert!(line["at_unix_ms"].as_u64().unwrap() > 0, "{line}");
    assert_eq!(line["state"], state, "{line}");
    if holder.is_empty() {
        assert!(line["holder"].is_null(), "{line}");
    } else {
        assert_eq!(line["holder"], holder, "{line}");
    }
}

#[test]
fn one_json_line_per_change_of_holder_token_or_state() {
    let dir = Dir::new();
    let store = dir.store("job");
    let absent_fields = status_fields(&dir.store("never-used"), &[]);
    let mut watch = Watch::start(&store, &["--json"], None);
    let first = watch.next_json("the first state");
    assert_line(&first, &absent_fields, "absent", "");
    assert!(first["token"].is_null(), "{first}");

    // A term with renews (ttl 2 s: a renew well within the 2.5 s the command runs): the
    // record is rewritten several times, with one line for the acquire only.
    let record = dir.record("job");
    let versions = std::thread::scope(|s| {
        let versions = s.spawn(|| {
            let mut seen: Vec<Vec<u8>> = Vec::new();
            for _ in 0..200 {
                if let Ok(bytes) = std::fs::read(&record)
                    && seen.last() != Some(&bytes)
                {
                    seen.push(bytes);
                }
                std::thread::sleep(Duration::from_millis(20));
                if seen.len() > 1
                    && String::from_utf8_lossy(seen.last().unwrap()).contains("released")
                {
                    break;
                }
            }
            seen.len()
        });
        run(&store, "first", "sleep 2.5");
        versions.join().unwrap()
    });
    assert!(
        versions >= 3,
        "the record was written {versions} times: acquire, renews and release expected"
    );
    let held = watch.next_json("the first term");
    let released = watch.next_json("the first release");
    let second_run = std::thread::spawn({
        let store = store.clone();
        move || run(&store, "second", "sleep 1")
    });
    let held2 = watch.next_json("the second term");
    second_run.join().unwrap();
    let released2 = watch.next_json("the second release");
    watch.assert_quiet(Duration::from_millis(1500), "nothing changed");

    let record_fields = status_fields(&store, &[]);
    assert_line(&held, &record_fields, "held", "first");
    assert_line(&released, &record_fields, "released", "first");
    assert_line(&held2, &record_fields, "held", "second");
    assert_line(&released2, &record_fields, "released", "second");
    let token = held["token"].as_u64().unwrap();
    assert_eq!(released["token"], token, "{released}");
    assert!(held2["token"].as_u64().unwrap() > token, "{held2}");
    assert_eq!(released2["token"], held2["token"], "{released2}");

    signal(&watch.child, Signal::SIGINT);
    let (code, err) = watch.end();
    assert_eq!(code, 0, "{err}");
    assert!(
        watch.lines.recv_timeout(LINE).is_err(),
        "a line after the last change"
    );
}

#[test]
fn stop_signals_and_a_closed_stdout_end_the_watch_with_0() {
    let dir = Dir::new();
    let store = dir.store("job");
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        let mut watch = Watch::start(&store, &[], None);
        let line = watch.next("the first state");
        assert!(
            line.ends_with("Z job: nobody holds the lease (no record)"),
            "{line}"
        );
        humantime::parse_rfc3339(line.split(' ').next().unwrap()).unwrap();
        signal(&watch.child, sig);
        let (code, err) = watch.end();
        assert_eq!(code, 0, "{sig}: {err}");
    }

    // The reader goes away after the first line; the next change ends the watch quietly.
    let mut watch = Watch::start(&store, &[], Some(1));
    let line = watch.next("the first state");
    assert!(line.contains("nobody holds the lease"), "{line}");
    run(&store, "someone", "true");
    let (code, err) = watch.end();
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_intervals_are_usage_errors_and_permanent_store_errors_end_the_watch() {
    let dir = Dir::new();
    let store = dir.store("job");
    for interval in ["10ms", "2h", "soon"] {
        let (code, _, err) = status(&["--store", &store, "--watch", "--interval", interval]);
        assert_eq!(code, 64, "--interval {interval}: {err}");
        assert!(err.contains("--interval"), "{err}");
    }
    // --interval belongs to --watch.
    let (code, _, err) = status(&["--store", &store, "--interval", "1s"]);
    assert_eq!(code, 64, "{err}");

    // A missing folder, at the start: as `status` without --watch.
    let missing = format!("file://{}/nope/job", dir.path().display());
    let (plain, _, plain_err) = status(&["--store", &missing]);
    let (code, out, err) = status(&["--store", &missing, "--watch", "--json"]);
    assert_eq!((plain, code), (69, 69), "{plain_err}\n{err}");
    assert!(err.contains("does not exist"), "{err}");
    assert_eq!(out, "");

    // The folder removed while watching.
    let folder = dir.path().join("leases");
    std::fs::create_dir(&folder).unwrap();
    let mut watch = Watch::start(
        &format!("file://{}/job", folder.display()),
        &["--json"],
        None,
    );
    assert_eq!(watch.next_json("the first state")["state"], "absent");
    std::fs::remove_dir(&folder).unwrap();
    let (code, err) = watch.end();
    assert_eq!(code, 69, "{err}");
    assert!(err.contains("does not exist"), "{err}");
    assert!(
        watch.lines.recv_timeout(LINE).is_err(),
        "a line for a permanent error"
    );
}

#[test]
fn a_malformed_record_ends_the_watch_as_it_fails_plain_status() {
    let dir = Dir::new();
    let store = dir.store("job");
    run(&store, "first", "true");
    let mut watch = Watch::start(&store, &["--json"], None);
    assert_eq!(watch.next_json("the first state")["state"], "released");
    std::fs::write(dir.record("job"), b"{ not a lease record").unwrap();
    let (code, err) = watch.end();
    let (plain, _, plain_err) = status(&["--store", &store]);
    assert_eq!((code, plain), (69, 69), "{err}\n{plain_err}");
    assert!(err.contains("malformed"), "{err}");
    assert_eq!(err, plain_err, "the same error as plain status");
    assert!(
        watch.lines.recv_timeout(LINE).is_err(),
        "a line for a malformed record"
    );
}

/// The watcher's soft limit of open files, through `prlimit` (util-linux).
fn set_open_files(pid: u32, soft: &str) -> bool {
    Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &format!("--nofile={soft}:")])
        .status()
        .is_ok_and(|s| s.success())
}

/// A transient error, honestly: the watcher's limit of open files is lowered to 0 for a
/// while, so every read of the record fails with EMFILE (an I/O error the file store
/// reports as "unavailable", which may pass), then raised again.
#[test]
fn a_transient_error_prints_one_unknown_line_and_the_watch_goes_on() {
    let dir = Dir::new();
    let store = dir.store("job");
    run(&store, "first", "true");
    let mut watch = Watch::start(&store, &["--json"], None);
    let first = watch.next_json("the first state");
    assert_eq!(first["state"], "released", "{first}");
    let pid = watch.child.id();
    let before = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let soft = before
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .unwrap()
        .to_owned();
    // util-linux's prlimit is part of every Debian install; without it this test cannot make
    // the error happen, and says so by failing.
    assert!(
        set_open_files(pid, "0"),
        "`prlimit --pid` is needed to make the store's reads fail"
    );
    let unknown = watch.next_json("the error");
    // About ten failed reads at 100 ms: still one line, one warning.
    watch.assert_quiet(Duration::from_secs(1), "errors go on");
    assert!(set_open_files(pid, &soft), "restoring the limit");
    let again = watch.next_json("the state once reads succeed");
    watch.assert_quiet(Duration::from_millis(700), "nothing changed");
    signal(&watch.child, Signal::SIGTERM);
    let (code, err) = watch.end();
    assert_eq!(code, 0, "{err}");

    assert_eq!(
        fields(&unknown),
        ["at_unix_ms", "error", "holder", "key", "state", "token"]
            .map(str::to_owned)
            .into(),
        "{unknown}"
    );
    assert_eq!(unknown["state"], "unknown", "{unknown}");
    assert!(
        unknown["error"].as_str().unwrap().contains("open files"),
        "{unknown}"
    );
    let mut expected = first.clone();
    expected["at_unix_ms"] = again["at_unix_ms"].clone();
    expected["approx_age_ms"] = again["approx_age_ms"].clone();
    assert_eq!(
        again, expected,
        "the same record, printed again as a change"
    );
    assert_eq!(
        err.matches("cannot read the lease").count(),
        1,
        "one warning for the run of errors: {err}"
    );
}

/// A process killed (with SIGKILL) when dropped, if it still runs.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn shards_watch_prints_one_line_per_assignment_change() {
    let dir = Dir::new();
    let store = dir.store("queues");
    let mut watch = Watch::start(&store, &["--shards", "--json"], None);
    let first = watch.next_json("no roster yet");
    assert!(first["shards"].is_null(), "{first}");
    let mut lines = vec![first];
    let mut member = Killed(
        Command::new(LEADER)
            .args(["run", "--store", &store, "--shards", "2", "--ttl", "2s"])
            .args(["--id", "a", "--", "sleep", "30"])
            .env("LEADER_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Joined, then claiming the shards (one line per step the watcher happens to see).
    while lines.last().unwrap()["members"][0]["claims"] != serde_json::json!([0, 1]) {
        lines.push(watch.next_json("member a leading both shards"));
    }
    // Its membership and shard leases renew (ttl 2 s) without changing the assignment.
    watch.assert_quiet(Duration::from_millis(2500), "renews only");
    signal(&member.0, Signal::SIGTERM);
    assert_eq!(exit_code(&mut member.0, Duration::from_secs(10)), 128 + 15);
    while lines.last().unwrap()["members"] != serde_json::json!([]) {
        lines.push(watch.next_json("member a gone"));
    }
    watch.assert_quiet(Duration::from_millis(700), "nothing changed");
    signal(&watch.child, Signal::SIGINT);
    let (code, err) = watch.end();
    assert_eq!(code, 0, "{err}");

    let mut plain = status_fields(&store, &["--shards"]);
    plain.insert("at_unix_ms".to_owned());
    let mut before: Option<serde_json::Value> = None;
    for line in &mut lines {
        assert_eq!(fields(line), plain, "{line}");
        line.as_object_mut().unwrap().remove("at_unix_ms");
        assert_ne!(before.as_ref(), Some(&*line), "a line without a change");
        before = Some(line.clone());
    }
    let last = lines.last().unwrap();
    assert_eq!(last["unclaimed"], serde_json::json!([0, 1]), "{last}");
}
