//! `leader run --metrics-addr`: `/metrics`, `/healthz`, `/readyz` and `/leader` of real
//! processes, through a kill and a takeover, and while the store is unreachable.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods, // real processes need real time
    clippy::print_stderr
)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use integration_tests::proxy::{Canned, Fault, FaultProxy, Match, Rule};
use integration_tests::tcp_proxy::TcpFaultProxy;
use integration_tests::{Emulator, require, unique_name};
use nix::sys::signal::Signal;
use serde_json::Value;

mod common;
use common::{LEADER, exit_code, signal, wait_for};

/// A `leader run` with `--metrics-addr 127.0.0.1:0`, and the address it logged.
struct Run {
    child: Child,
    addr: String,
    /// Its stderr so far, printed if the test fails.
    log: Arc<Mutex<String>>,
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- leader's stderr ---\n{}", self.log.lock().unwrap());
        }
    }
}

fn start(store: &str, id: &str, extra: &[&str]) -> Run {
    let mut child = Command::new(LEADER)
        .args([
            "run",
            "--store",
            store,
            "--id",
            id,
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .args(extra)
        .args(["--", "sleep", "600"])
        .env("LEADER_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read stderr on a thread (until the process ends, so that it never blocks on a full pipe).
    let (tx, rx) = mpsc::channel();
    let err = child.stderr.take().unwrap();
    let log = Arc::new(Mutex::new(String::new()));
    let keep = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            keep.lock().unwrap().push_str(&format!("{line}\n"));
            if let Some(at) = line.find("metrics_addr=") {
                let addr = line[at + "metrics_addr=".len()..]
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                let _ = tx.send(addr);
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("no metrics_addr= in {}", log.lock().unwrap()));
    Run { child, addr, log }
}

/// `METHOD path` on `addr`: (status code, body).
fn http(addr: &str, method: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("a head and a body");
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .unwrap()
        .parse()
        .unwrap();
    if method != "HEAD" {
        assert_eq!(length, body.len(), "{head}");
    }
    (code, body.to_owned())
}

fn get(addr: &str, path: &str) -> (u16, String) {
    http(addr, "GET", path)
}

fn leader_json(addr: &str) -> Value {
    let (code, body) = get(addr, "/leader");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// The value of the sample `name` (with its labels after the name, e.g.
/// `leader_store_requests_total{` and a label that must appear) in a scrape of `addr`.
fn sample(addr: &str, name: &str, with: &[&str]) -> Option<f64> {
    let (code, body) = get(addr, "/metrics");
    assert_eq!(code, 200);
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name) && with.iter().all(|w| l.contains(w)))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .reduce(|a, b| a + b)
}

/// Two instances on a file store: who leads and the metrics follow a SIGKILL of the leader
/// and the takeover by the other; every endpoint answers as documented.
#[test]
fn endpoints_follow_a_kill_and_a_takeover() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}/job", dir.path().display());
    let ttl = ["--ttl", "2s"];
    let a = start(&store, "a", &ttl);
    wait_for("a leads", Duration::from_secs(20), || {
        leader_json(&a.addr)["state"] == "leader"
    });
    let mut b = start(&store, "b", &ttl);
    wait_for("b follows a", Duration::from_secs(20), || {
        let j = leader_json(&b.addr);
        j["state"] == "follower" && j["holder"] == "a"
    });
    let j = leader_json(&a.addr);
    assert_eq!(
        (&j["holder"], &j["token"], &j["self"]),
        (&"a".into(), &1.into(), &"a".into())
    );
    assert_eq!(j["key"], "job");
    assert!(j["since_unix_ms"].as_u64().unwrap() > 1_700_000_000_000);
    let a_is = |name, with: &[&str]| sample(&a.addr, name, with);
    assert_eq!(
        a_is("leader_is_leader", &[r#"holder="a""#, r#"backend="file""#]),
        Some(1.0)
    );
    assert_eq!(a_is("leader_terms_started_total", &[]), Some(1.0));
    assert_eq!(a_is("leader_fencing_token", &[]), Some(1.0));
    wait_for("a renews", Duration::from_secs(10), || {
        a_is("leader_renew_duration_seconds_count", &[]).unwrap() >= 1.0
    });
    assert!(a_is("leader_renew_slack_seconds_count", &[]).unwrap() >= 1.0);
    let b_is = |name, with: &[&str]| sample(&b.addr, name, with);
    assert_eq!(b_is("leader_is_leader", &[]), Some(0.0));
    assert_eq!(
        b_is("leader_fencing_token", &[]),
        Some(1.0),
        "the token b sees"
    );
    assert_eq!(b_is("leader_terms_started_total", &[]), Some(0.0));

    for addr in [&a.addr, &b.addr] {
        assert_eq!(get(addr, "/healthz").0, 200);
        let (code, body) = get(addr, "/readyz");
        assert_eq!(code, 200, "{body}");
        assert!(body.starts_with("ok: the store answered"), "{body}");
        assert_eq!(get(addr, "/nope").0, 404);
        assert_eq!(http(addr, "POST", "/metrics").0, 405);
        let (code, body) = http(addr, "HEAD", "/metrics");
        assert_eq!((code, body.as_str()), (200, ""));
    }

    // The leader dies without a word; b takes over after a ttl.
    let mut a = a;
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    wait_for("b leads", Duration::from_secs(20), || {
        leader_json(&b.addr)["state"] == "leader"
    });
    let j = leader_json(&b.addr);
    assert_eq!((&j["holder"], &j["token"]), (&"b".into(), &2.into()));
    assert_eq!(b_is("leader_is_leader", &[]), Some(1.0));
    assert_eq!(b_is("leader_terms_started_total", &[]), Some(1.0));
    assert_eq!(b_is("leader_fencing_token", &[]), Some(2.0));
    assert_eq!(b_is("leader_leaderless_seconds_count", &[]), Some(1.0));
    let gap = b_is("leader_leaderless_seconds_sum", &[]).unwrap();
    assert!(gap >= 2.0, "at least the ttl without a leader: {gap}");
    let acquired = [r#"op="acquire""#, r#"outcome="ok""#];
    assert_eq!(b_is("leader_store_requests_total", &acquired), Some(1.0));
    assert!(
        b_is(
            "leader_store_requests_total",
            &[r#"op="read""#, r#"outcome="ok""#]
        )
        .unwrap()
            > 1.0
    );

    // A stop: the command and the lease are let go, and the term's length is recorded on the
    // way out (not observable after exit; the exit code is).
    signal(&b.child, Signal::SIGTERM);
    assert_eq!(exit_code(&mut b.child, Duration::from_secs(20)), 128 + 15);
}

/// A sharded run's `/leader` lists the shards it leads with their tokens; its health and
/// readiness answer as a single key's do.
#[test]
fn a_sharded_run_reports_its_shards() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}/jobs", dir.path().display());
    let run = start(&store, "s", &["--shards", "3", "--ttl", "2s"]);
    wait_for("all 3 shards led", Duration::from_secs(30), || {
        leader_json(&run.addr)["led"].as_object().map(|m| m.len()) == Some(3)
    });
    let j = leader_json(&run.addr);
    assert_eq!(
        (&j["state"], &j["shards"], &j["self"]),
        (&"member".into(), &3.into(), &"s".into()),
        "{j}"
    );
    assert!(j["led"]["0"].as_u64().unwrap() >= 1, "{j}");
    assert_eq!(
        sample(&run.addr, "leader_shards_led", &[r#"key="jobs""#]),
        Some(3.0)
    );
    assert_eq!(get(&run.addr, "/healthz").0, 200);
    assert_eq!(get(&run.addr, "/readyz").0, 200);
}

/// Clients that connect and send nothing hold at most 16 slots, each for a couple of seconds:
/// a probe beyond them is answered at once (503, busy) instead of queueing behind them, and is
/// served again once the server has closed them.
#[test]
fn idle_connections_cannot_stall_a_probe() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}/job", dir.path().display());
    let run = start(&store, "i", &[]);
    assert_eq!(get(&run.addr, "/healthz").0, 200);
    let idle: Vec<TcpStream> = (0..16)
        .map(|_| TcpStream::connect(&run.addr).unwrap())
        .collect();
    // Let the server accept them all before the probe.
    std::thread::sleep(Duration::from_millis(300));
    let (code, body) = get(&run.addr, "/healthz");
    assert_eq!(
        (code, body.as_str()),
        (503, "busy: too many requests at once\n")
    );
    wait_for(
        "the idle clients to be dropped",
        Duration::from_secs(20),
        || get(&run.addr, "/healthz").0 == 200,
    );
    drop(idle);
}

/// `/readyz` fails once the store has not answered for a ttl, while `/healthz` stays fine,
/// and recovers when the store is back (etcd behind a proxy that partitions it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_fails_while_the_store_is_unreachable_and_healthz_does_not() {
    let Some(ep) = require(Emulator::Etcd).await else {
        return;
    };
    let host = ep
        .url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let proxy = TcpFaultProxy::start(host).await.unwrap();
    let store = format!("etcd://{}/{}/job", proxy.addr(), unique_name("ready"));
    let run =
        tokio::task::spawn_blocking(move || start(&store, "r", &["--ttl", "3s", "--supervise"]))
            .await
            .unwrap();
    let addr = run.addr.clone();
    let check = move |path: &'static str| {
        let addr = addr.clone();
        async move {
            tokio::task::spawn_blocking(move || get(&addr, path))
                .await
                .unwrap()
        }
    };
    let until = |path: &'static str, code: u16, limit: Duration| {
        let check = check.clone();
        async move {
            let start = tokio::time::Instant::now();
            loop {
                let (got, body) = check(path).await;
                if got == code {
                    return (start.elapsed(), body);
                }
                assert!(start.elapsed() < limit, "{path} never {code}: {got} {body}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    until("/readyz", 200, Duration::from_secs(30)).await;
    proxy.partition(true);
    let (took, body) = until("/readyz", 503, Duration::from_secs(30)).await;
    assert!(body.contains("has not answered"), "{body}");
    // Not before a ttl without an answer (renews answer every ttl/2 or less before).
    assert!(took >= Duration::from_secs(1), "{took:?}");
    let (code, body) = check("/healthz").await;
    assert_eq!(code, 200, "the elector still runs: {body}");
    proxy.heal();
    until("/readyz", 200, Duration::from_secs(30)).await;
    drop(run);
}

/// DynamoDB throttles two renews (its own `ThrottlingException`, from a proxy in front of
/// the emulator): the scrape counts them as throttled renew requests, the call's retry gets
/// through, and the term goes on with the same token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_renew_is_counted_as_throttled_and_the_term_goes_on() {
    let Some(ep) = require(Emulator::DynamoDb).await else {
        return;
    };
    let proxy = FaultProxy::in_front_of(&ep.url, 7).await.unwrap();
    let store = format!("dynamodb://{}/job", unique_name("metrics"));
    let endpoint = proxy.url();
    let run = tokio::task::spawn_blocking(move || {
        let args = [
            "--create-if-missing",
            "--endpoint",
            &endpoint,
            "--ttl",
            "5s",
        ];
        start(&store, "t", &args)
    })
    .await
    .unwrap();
    let addr = run.addr.clone();
    let renews = move |outcome: &'static str| {
        let addr = addr.clone();
        let with = format!(r#"outcome="{outcome}""#);
        sample(
            &addr,
            "leader_store_requests_total",
            &[r#"op="renew""#, &with],
        )
        .unwrap()
    };
    let scrape = |f: Box<dyn Fn() -> bool + Send>| {
        tokio::task::spawn_blocking(move || {
            wait_for("the scrape", Duration::from_secs(60), f);
        })
    };
    let addr = run.addr.clone();
    scrape(Box::new(move || leader_json(&addr)["state"] == "leader"))
        .await
        .unwrap();
    let r = renews.clone();
    scrape(Box::new(move || r("ok") >= 1.0)).await.unwrap();
    assert_eq!(renews("throttled"), 0.0);
    let ok_before = renews("ok");
    proxy.inject(
        Rule::new(
            Match::aws("UpdateItem"),
            Fault::Answer(Canned::aws_throttling()),
        )
        .times(2),
    );
    let r = renews.clone();
    scrape(Box::new(move || r("ok") > ok_before)).await.unwrap();
    assert_eq!(renews("throttled"), 2.0);
    assert_eq!(
        proxy
            .counts()
            .throttled
            .load(std::sync::atomic::Ordering::SeqCst),
        2
    );
    let j = leader_json(&run.addr);
    assert_eq!(
        (&j["state"], &j["token"]),
        (&"leader".into(), &1.into()),
        "{j}"
    );
    drop(run);
}

/// A bad address is a usage error naming the flag; a taken port ends the run before it
/// campaigns (no lease record is written).
#[test]
fn a_bad_or_taken_address_is_refused_before_campaigning() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}/job", dir.path().display());
    let out = Command::new(LEADER)
        .args([
            "run",
            "--store",
            &store,
            "--metrics-addr",
            "example.com:80",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.contains("--metrics-addr") && err.contains("IP address"),
        "{err}"
    );

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let out = Command::new(LEADER)
        .args([
            "run",
            "--store",
            &store,
            "--metrics-addr",
            &port,
            "--",
            "true",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(err.contains("cannot serve --metrics-addr"), "{err}");
    assert!(
        !dir.path().join("job").exists(),
        "no campaign: {:?}",
        std::fs::read_dir(dir.path()).unwrap().collect::<Vec<_>>()
    );
}
