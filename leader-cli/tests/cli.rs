//! Process-level tests of `leader` on the file store: real processes, real signals, short ttl.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods // real processes need real time
)]

mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{LEADER, alive, exit_code, signal, wait_for};
use nix::sys::signal::Signal;

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
/// `then`. PID is the pid this process sees: in the command's PID namespace `$$` is another
/// number, but `/proc` is this one's.
fn candidate(dir: &Dir, id: &str, extra: &[&str], then: &str) -> Child {
    let script = format!(
        "read -r me _ < /proc/self/stat; \
         echo \"$LEADER_HOLDER_ID $LEADER_FENCING_TOKEN $me\" >> {starts}; {then}",
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
    // Its supervisor sees `leader` go and stops the child long before a takeover.
    wait_for("the orphaned child to stop", Duration::from_secs(3), || {
        !alive(child_pid)
    });
    let orphan_gone = killed_at.elapsed();
    assert!(orphan_gone < Duration::from_millis(1500), "{orphan_gone:?}");

    wait_for("a new leader's child", Duration::from_secs(6), || {
        dir.lines("starts").len() == 2
    });
    let took = killed_at.elapsed();
    let (holder2, token2, _) = parse(&dir.lines("starts")[1]);
    assert_ne!(holder2, holder);
    assert!(token2 > token1, "{token2} <= {token1}");
    // ttl (2 s) + retry_every (0.4 s) + a request, measured from the kill.
    assert!(
        took <= Duration::from_millis(2400 + 600),
        "failover took {took:?}"
    );
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
        "trap '' TERM; sh -c 'read -r me _ < /proc/self/stat; echo $me > {}; exec sleep 60' & \
         wait; wait",
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

/// `leader` with `args`, to its end: (exit code, stderr), within `limit`.
fn run_with_stderr(args: &[&str], limit: Duration) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let err = dir.path().join("stderr");
    let mut child = Command::new(LEADER)
        .args(args)
        .env("LEADER_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let code = exit_code(&mut child, limit);
    (code, std::fs::read_to_string(err).unwrap())
}

#[test]
fn bad_input_gets_a_clear_error_never_a_panic() {
    let dir = Dir::new();
    let store = dir.store();
    let ten = Duration::from_secs(10);
    // Timing problems are named as such, not as a --grace problem.
    let (code, err) = run_with_stderr(
        &["run", "--store", &store, "--ttl", "0s", "--", "true"],
        ten,
    );
    assert_eq!(code, 78, "{err}");
    assert!(err.contains("ttl must be greater than zero"), "{err}");
    assert!(!err.contains("grace"), "{err}");
    let (code, err) = run_with_stderr(
        &["run", "--store", &store, "--ttl", "100ms", "--", "true"],
        ten,
    );
    assert_eq!(code, 78, "{err}");
    assert!(err.contains("no room for a grace period"), "{err}");
    // A short ttl that the rules allow just works.
    let (code, err) = run_with_stderr(
        &["run", "--store", &store, "--ttl", "1s", "--", "true"],
        ten,
    );
    assert_eq!(code, 0, "{err}");
    // Absurd durations are rejected by the parser (64), not a panic (101).
    for flag in ["--wait", "--ttl", "--grace", "--renew-every"] {
        let (code, err) = run_with_stderr(
            &[
                "run",
                "--store",
                &store,
                flag,
                "500000000000y",
                "--",
                "true",
            ],
            ten,
        );
        assert_eq!(code, 64, "{flag}: {err}");
        assert!(
            err.contains("366d") || err.contains("overflow"),
            "{flag}: {err}"
        );
    }
    let (code, err) = run_with_stderr(
        &["run", "--store", &store, "--wait", "300d", "--", "true"],
        ten,
    );
    assert_eq!(code, 0, "a long but sane --wait: {err}");
    // A trailing slash does not silently name another lease.
    let slash = format!("{store}/");
    let (code, err) = run_with_stderr(&["run", "--store", &slash, "--", "true"], ten);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("must end with the lease key"), "{err}");
    // The command cannot be found (127) or run (126), as in a shell.
    let (code, err) = run_with_stderr(&["run", "--store", &store, "--", "/no/such/program"], ten);
    assert_eq!(code, 127, "{err}");
    let plain = dir.file("not-executable");
    std::fs::write(&plain, "data").unwrap();
    let plain = plain.display().to_string();
    let (code, err) = run_with_stderr(&["run", "--store", &store, "--", &plain], ten);
    assert_eq!(code, 126, "{err}");
    // No message of a run that gave up says it is retrying.
    assert!(!err.contains("retrying"), "{err}");
}

/// Runs `leader run` on `store` (as root, inside a private mount namespace where `ro_dir` is
/// bind-mounted read-only: root ignores file modes) and returns (code, stderr, time taken).
fn run_permanent(args: &[&str], ro_dir: Option<&Path>) -> (i32, String, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let err = dir.path().join("stderr");
    let mut cmd = match ro_dir {
        Some(ro) if nix::unistd::geteuid().is_root() => {
            let mut c = Command::new("unshare");
            c.args([
                "--mount",
                "sh",
                "-c",
                r#"mount --bind -o ro "$0" "$0" && exec "$@""#,
            ])
            .arg(ro)
            .arg(LEADER);
            c
        }
        Some(ro) => {
            let mut perms = std::fs::metadata(ro).unwrap().permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o555);
            std::fs::set_permissions(ro, perms).unwrap();
            Command::new(LEADER)
        }
        None => Command::new(LEADER),
    };
    let start = Instant::now();
    let mut child = cmd
        .args(args)
        .env("LEADER_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let code = exit_code(&mut child, Duration::from_secs(10));
    (code, std::fs::read_to_string(err).unwrap(), start.elapsed())
}

#[test]
fn permanent_store_errors_end_the_run_with_their_code() {
    let dir = Dir::new();
    let ro = dir.path().join("readonly");
    std::fs::create_dir(&ro).unwrap();
    let ro_store = format!("file://{}/job", ro.display());
    let (code, err, took) = run_permanent(&["run", "--store", &ro_store, "--", "true"], Some(&ro));
    assert_eq!(code, 69, "read-only folder: {err}");
    assert!(
        err.contains("permission denied") && err.contains("giving up"),
        "{err}"
    );
    assert!(!err.contains("retrying"), "{err}");
    eprintln!("read-only folder: exit 69 after {took:?}");

    // The record path is a folder.
    std::fs::create_dir(dir.path().join("job.lease")).unwrap();
    let store = dir.store();
    for args in [
        vec!["run", "--store", &store, "--", "true"],
        vec!["status", "--store", &store],
    ] {
        let (code, err, took) = run_permanent(&args, None);
        assert_eq!(code, 78, "{args:?}: {err}");
        assert!(err.contains("is a folder"), "{err}");
        assert!(!err.contains("retrying"), "{err}");
        assert!(took < Duration::from_secs(10));
    }

    // The folder is missing (status too: an error, not "nobody holds the lease").
    let missing = format!("file://{}/nope/job", dir.path().display());
    for args in [
        vec!["run", "--store", &missing, "--", "true"],
        vec!["status", "--store", &missing],
    ] {
        let (code, err, _) = run_permanent(&args, None);
        assert_eq!(code, 69, "{args:?}: {err}");
        assert!(err.contains("does not exist"), "{err}");
    }
}

#[test]
fn the_folder_removed_while_following_ends_the_campaign() {
    let dir = Dir::new();
    let lease_dir = dir.path().join("leases");
    std::fs::create_dir(&lease_dir).unwrap();
    let store = format!("file://{}/job", lease_dir.display());
    let mut holder = Command::new(LEADER)
        .args(["run", "--store", &store, "--ttl", "2s", "--", "sleep", "60"])
        .env("LEADER_LOG", "warn")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the lease", Duration::from_secs(10), || {
        lease_dir.join("job.lease").exists()
    });
    let mut follower = Command::new(LEADER)
        .args(["run", "--store", &store, "--ttl", "2s", "--", "true"])
        .env("LEADER_LOG", "warn")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(600));
    // The holder may create a file (a renew's temporary or lock file) while the folder is
    // being emptied; try again until the folder is gone.
    let mut attempts = 0;
    while let Err(e) = std::fs::remove_dir_all(&lease_dir) {
        attempts += 1;
        assert!(
            e.kind() == std::io::ErrorKind::DirectoryNotEmpty && attempts < 50,
            "removing {lease_dir:?}: {e}"
        );
    }
    let removed = Instant::now();
    assert_eq!(exit_code(&mut follower, Duration::from_secs(10)), 69);
    let mut err = String::new();
    std::io::Read::read_to_string(&mut follower.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("does not exist"), "{err}");
    eprintln!(
        "folder removed: the follower gave up after {:?}",
        removed.elapsed()
    );
    // The leader's term ends at its deadline (renewals fail), then its campaign ends too.
    assert_eq!(exit_code(&mut holder, Duration::from_secs(10)), 75);
}

/// `leader __exec`, the process that execs the command, checks the deadline and its
/// supervisor right before exec.
#[test]
fn the_command_is_not_started_after_the_deadline() {
    let dir = Dir::new();
    let marker = dir.file("ran");
    let exec = |supervisor: u32, not_after: u64| {
        Command::new(LEADER)
            .arg("__exec")
            .arg("--supervisor")
            .arg(supervisor.to_string())
            .arg("--not-after")
            .arg(not_after.to_string())
            .args(["--", "touch"])
            .arg(&marker)
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .code()
    };
    let me = std::process::id();
    let now = common::boottime_ns();
    assert_eq!(exec(me, now), Some(75), "deadline passed");
    assert!(!marker.exists());
    assert_eq!(
        exec(1, now + 60_000_000_000),
        Some(75),
        "not our supervisor"
    );
    assert!(!marker.exists());
    assert_eq!(exec(me, now + 60_000_000_000), Some(0));
    assert!(marker.exists(), "within the term the command runs");
}

/// The command starts with no signal blocked and none of the stop signals ignored, whatever
/// the supervisor does with its own.
#[test]
fn the_command_starts_with_a_clean_signal_state() {
    let dir = Dir::new();
    let out = Command::new(LEADER)
        .args([
            "run",
            "--store",
            &dir.store(),
            "--",
            "cat",
            "/proc/self/status",
        ])
        .env("LEADER_LOG", "warn")
        .output()
        .unwrap();
    assert!(out.status.success());
    let status = String::from_utf8_lossy(&out.stdout);
    let mask = |name: &str| {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
    };
    assert_eq!(
        mask("SigBlk:"),
        0,
        "blocked signals leaked into the command"
    );
    let ignored = mask("SigIgn:");
    for sig in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGPIPE,
    ] {
        assert_eq!(ignored & (1 << (sig as i32 - 1)), 0, "{sig} is ignored");
    }
}

/// Everything `leader run` gives the command.
#[test]
fn the_command_gets_its_environment() {
    let dir = Dir::new();
    let out = Command::new(LEADER)
        .args([
            "run",
            "--store",
            &dir.store(),
            "--id",
            "me",
            "--ttl",
            "3s",
            "--grace",
            "1s",
        ])
        .args(["--", "sh", "-c", "env | grep ^LEADER_ | sort"])
        .env("LEADER_LOG", "warn")
        .output()
        .unwrap();
    let env = String::from_utf8_lossy(&out.stdout);
    for want in [
        "LEADER_FENCING_TOKEN=1",
        "LEADER_HOLDER_ID=me",
        "LEADER_KEY=job",
        &format!("LEADER_STORE={}", dir.store()),
        "LEADER_TTL_MS=3000",
        "LEADER_GRACE_MS=1000",
    ] {
        assert!(env.lines().any(|l| l == want), "{want} missing in:\n{env}");
    }
}

/// A second stop signal a second or more after the first kills the command at once; the same
/// signal delivered twice in a row (as `timeout` does) is one stop.
#[test]
fn a_deliberate_second_signal_kills_at_once() {
    let dir = Dir::new();
    let stderr = dir.file("stderr");
    let mut a = Command::new(LEADER)
        .args([
            "run",
            "--store",
            &dir.store(),
            "--ttl",
            "4s",
            "--grace",
            "1400ms",
        ])
        .args(["--", "sh", "-c"])
        .arg(format!(
            "trap '' INT TERM; echo $$ > {}; while :; do sleep 0.1; done",
            dir.file("pid").display()
        ))
        .env("LEADER_LOG", "info")
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    wait_for("the command", Duration::from_secs(10), || {
        std::fs::read_to_string(dir.file("pid")).is_ok_and(|s| s.ends_with('\n'))
    });
    // Twice in quick succession (timeout signals the process, then its group): one stop.
    signal(&a, Signal::SIGINT);
    std::thread::sleep(Duration::from_millis(50));
    signal(&a, Signal::SIGINT);
    std::thread::sleep(Duration::from_millis(1050));
    let log = std::fs::read_to_string(&stderr).unwrap();
    assert!(!log.contains("second signal"), "{log}");
    // A second later: killed now, not at the end of the grace period.
    signal(&a, Signal::SIGINT);
    assert_eq!(exit_code(&mut a, Duration::from_secs(5)), 130);
    let log = std::fs::read_to_string(&stderr).unwrap();
    assert!(
        log.contains("second signal: killing the command now"),
        "{log}"
    );
}
