//! Today's numbers, to compare later work against: `bench [backends=file,azure,dynamo,gcs]
//! [ttl=15] [rounds=10] [window=60] [out=FILE] [dir=DIR]`. Usually run by `scripts/bench`, which starts
//! the emulators and writes `results/bench.md`.
//!
//! Not a test: nothing asserts on a time, and neither `cargo test` nor CI runs it. Every
//! backend runs in parallel with the others; on each, real `chaos_candidate` processes campaign
//! for a fresh key per round, with the elector's default timing for `ttl` seconds:
//!
//! - **acquire**: one candidate on an empty key, from its spawn (and from its elector's start,
//!   the candidate's `ready` event) to its first term;
//! - **handover**: two more candidates wait; the leader gets SIGTERM (it releases the lease);
//!   the time until another's term begins;
//! - **failover**: the new leader gets SIGKILL; the time until the last one's term begins
//!   (about a ttl: the lease has to expire).
//!
//! Then, once per backend, a holder and one waiting follower, each behind its own
//! [`FaultProxy`], are left alone for `window` seconds: the store requests each sent, by kind
//! (the AWS operation, else `METHOD /path`, with the container, table or bucket written
//! `{place}`), scaled to an hour. The file store has no network, so no counts.
//!
//! The tables go to stdout (markdown) and to `out` if given, progress to stderr. Exits 2 on a bad argument, 1 if a
//! round or a count could not be completed (the tables still show what was measured).
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command-line program reports on its streams"
)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Duration;

use integration_tests::chaos::candidate::CandidateArgs;
use integration_tests::chaos::checker::parse_log;
use integration_tests::chaos::drill::{prepare, proxied};
use integration_tests::chaos::{BackendKind, EV_READY, EV_TERM_STARTED, mono_us};
use integration_tests::proxy::FaultProxy;
use leader_core::Timing;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// What the command line asked for.
struct Settings {
    backends: Vec<BackendKind>,
    ttl: Duration,
    rounds: usize,
    window: Duration,
    out: Option<PathBuf>,
    dir: PathBuf,
}

fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Settings, String> {
    let mut s = Settings {
        backends: BackendKind::ALL.to_vec(),
        ttl: Duration::from_secs(15),
        rounds: 10,
        window: Duration::from_secs(60),
        out: None,
        dir: std::env::temp_dir().join(integration_tests::unique_name("bench")),
    };
    let seconds = |name: &str, value: &str| match value.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(Duration::from_secs_f64(v)),
        _ => Err(format!(
            "{name}={value:?} is not a positive number of seconds"
        )),
    };
    for arg in args {
        let Some((name, value)) = arg.split_once('=') else {
            return Err(format!("argument {arg:?} is not name=value"));
        };
        match name {
            "backends" => {
                s.backends = value
                    .split(',')
                    .map(|b| BackendKind::parse(b).ok_or_else(|| format!("unknown backend {b:?}")))
                    .collect::<Result<_, _>>()?;
            }
            "ttl" => s.ttl = seconds(name, value)?,
            "window" => s.window = seconds(name, value)?,
            "rounds" => match value.parse() {
                Ok(n) if n > 0 => s.rounds = n,
                _ => return Err(format!("rounds={value:?} is not a positive whole number")),
            },
            "out" => s.out = Some(PathBuf::from(value)),
            "dir" => s.dir = PathBuf::from(value),
            _ => return Err(format!("unknown argument {name:?}")),
        }
    }
    Ok(s)
}

/// Where one backend's candidates go.
#[derive(Clone)]
struct Site {
    kind: BackendKind,
    /// The emulator's URL, or the file store's directory.
    url: String,
    /// Container, table or bucket (empty for the file store).
    place: String,
    timing: Timing,
    candidate_bin: PathBuf,
    /// The candidates' logs.
    dir: PathBuf,
}

impl Site {
    /// Finds the emulator and creates a fresh container, table or bucket (a directory for the
    /// file store).
    async fn new(
        kind: BackendKind,
        settings: &Settings,
        candidate_bin: PathBuf,
    ) -> Result<Self, String> {
        let dir = settings.dir.join(kind.name());
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {dir:?}: {e}"))?;
        let (url, place) = prepare(kind, &dir).await?;
        Ok(Self {
            kind,
            url,
            place,
            timing: Timing::from_ttl(settings.ttl),
            candidate_bin,
            dir,
        })
    }

    /// Starts candidate `id` for `key`, behind a proxy of its own unless on the file store.
    async fn spawn(&self, key: &str, id: &str) -> Result<Candidate, String> {
        let (endpoint, proxy) = proxied(self.kind, &self.url, 0).await?;
        let args = CandidateArgs {
            backend: self.kind,
            endpoint,
            place: self.place.clone(),
            key: key.to_owned(),
            id: id.to_owned(),
            timing: self.timing,
            // No fenced writes in practice: only the elector's requests are counted.
            write_every: Duration::from_secs(24 * 3600),
            act_delay: Duration::ZERO,
        };
        let log = self.dir.join(format!("{key}-{id}.jsonl"));
        let stdout = std::fs::File::create(&log).map_err(|e| format!("creating {log:?}: {e}"))?;
        let stderr_path = self.dir.join(format!("{key}-{id}.stderr"));
        let stderr = std::fs::File::create(&stderr_path)
            .map_err(|e| format!("creating {stderr_path:?}: {e}"))?;
        let spawned = mono_us();
        let child = Command::new(&self.candidate_bin)
            .args(args.to_args())
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("spawning {:?}: {e}", self.candidate_bin))?;
        Ok(Candidate {
            id: id.to_owned(),
            child,
            log,
            proxy,
            spawned,
            reaped: false,
        })
    }

    /// How long to wait for a term that should come.
    fn patience(&self) -> Duration {
        self.timing.ttl * 2 + Duration::from_secs(15)
    }
}

/// A running `chaos_candidate`; killed and reaped when dropped.
struct Candidate {
    id: String,
    child: Child,
    log: PathBuf,
    proxy: Option<FaultProxy>,
    /// When it was spawned ([`mono_us`]).
    spawned: u64,
    reaped: bool,
}

impl Candidate {
    /// When it first logged `ev` after `after` ([`mono_us`]).
    fn logged(&self, ev: &str, after: u64) -> Option<u64> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        parse_log(&self.id, &text, None)
            .events
            .iter()
            .find(|e| e.ev == ev && e.t > after)
            .map(|e| e.t)
    }

    fn signal(&self, signal: Signal) {
        if let (false, Ok(pid)) = (self.reaped, i32::try_from(self.child.id())) {
            let _ = kill(Pid::from_raw(pid), signal);
        }
    }

    fn exited(&mut self) -> bool {
        self.reaped = self.reaped || matches!(self.child.try_wait(), Ok(Some(_)));
        self.reaped
    }

    fn kill_now(&mut self) {
        self.signal(Signal::SIGKILL);
        if !self.reaped {
            let _ = self.child.wait();
            self.reaped = true;
        }
    }

    /// SIGTERM, then SIGKILL if it has not exited within `limit`.
    async fn stop(&mut self, limit: Duration) {
        self.signal(Signal::SIGTERM);
        if poll(limit, || self.exited().then_some(())).await.is_none() {
            eprintln!(
                "bench: {} did not exit within {limit:?} of SIGTERM",
                self.id
            );
            self.kill_now();
        }
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        self.kill_now();
    }
}

/// `f()` once it is `Some`, checked every 20 ms; `None` after `limit`.
async fn poll<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    tokio::time::timeout(limit, async {
        loop {
            if let Some(v) = f() {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .ok()
}

fn ms_between(from: u64, to: u64) -> f64 {
    to.saturating_sub(from) as f64 / 1000.0
}

/// Every round's times, in milliseconds.
#[derive(Default)]
struct Samples {
    acquire_from_spawn: Vec<f64>,
    acquire_from_ready: Vec<f64>,
    handover: Vec<f64>,
    failover: Vec<f64>,
}

/// One round on a fresh key: acquire, then handover (SIGTERM), then failover (SIGKILL). What
/// was measured before a failure stays in `samples`.
async fn round(site: &Site, n: usize, samples: &mut Samples) -> Result<(), String> {
    let key = format!("bench-{n}");
    let patience = site.patience();
    let mut first = site.spawn(&key, "a").await?;
    let began = poll(patience, || first.logged(EV_TERM_STARTED, 0))
        .await
        .ok_or_else(|| format!("the first candidate had no term within {patience:?}"))?;
    samples
        .acquire_from_spawn
        .push(ms_between(first.spawned, began));
    if let Some(ready) = first.logged(EV_READY, 0) {
        samples.acquire_from_ready.push(ms_between(ready, began));
    }
    let mut waiting = [site.spawn(&key, "b").await?, site.spawn(&key, "c").await?];
    poll(patience, || {
        waiting
            .iter()
            .all(|c| c.logged(EV_READY, 0).is_some())
            .then_some(())
    })
    .await
    .ok_or("the waiting candidates did not start")?;
    // Let both try once and settle into waiting.
    tokio::time::sleep(site.timing.retry_every + Duration::from_millis(500)).await;

    let sent = mono_us();
    first.signal(Signal::SIGTERM);
    let (next, took_over) = poll(patience, || {
        waiting
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.logged(EV_TERM_STARTED, sent).map(|t| (i, t)))
            .min_by_key(|&(_, t)| t)
    })
    .await
    .ok_or_else(|| format!("no new leader within {patience:?} of SIGTERM"))?;
    samples.handover.push(ms_between(sent, took_over));
    first.stop(site.timing.ttl + Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    let [b, c] = &mut waiting;
    let (leader, last) = if next == 0 { (b, c) } else { (c, b) };
    let sent = mono_us();
    leader.kill_now();
    let took_over = poll(patience, || last.logged(EV_TERM_STARTED, sent))
        .await
        .ok_or_else(|| format!("no new leader within {patience:?} of SIGKILL"))?;
    samples.failover.push(ms_between(sent, took_over));
    last.stop(site.timing.ttl + Duration::from_secs(5)).await;
    Ok(())
}

/// Store requests by kind in the measured window, of the holder and of one follower.
struct Requests {
    window: Duration,
    holder: BTreeMap<String, u64>,
    follower: BTreeMap<String, u64>,
}

/// A holder and one waiting follower, left alone for `window`, counted by their proxies.
async fn count_requests(site: &Site, window: Duration) -> Result<Requests, String> {
    let key = "bench-requests";
    let patience = site.patience();
    let mut holder = site.spawn(key, "holder").await?;
    poll(patience, || holder.logged(EV_TERM_STARTED, 0))
        .await
        .ok_or_else(|| format!("the holder had no term within {patience:?}"))?;
    let mut follower = site.spawn(key, "follower").await?;
    poll(patience, || follower.logged(EV_READY, 0))
        .await
        .ok_or("the follower did not start")?;
    tokio::time::sleep(site.timing.retry_every + Duration::from_millis(500)).await;
    let (Some(hp), Some(fp)) = (&holder.proxy, &follower.proxy) else {
        return Err("no proxy to count through".to_owned());
    };
    let from = mono_us();
    hp.reset_requests();
    fp.reset_requests();
    let started = tokio::time::Instant::now();
    tokio::time::sleep(window).await;
    let (h, f) = (hp.requests(), fp.requests());
    let window = started.elapsed();
    if follower.logged(EV_TERM_STARTED, 0).is_some()
        || holder.logged(EV_TERM_STARTED, from).is_some()
    {
        return Err("leadership changed during the window".to_owned());
    }
    let limit = site.timing.ttl + Duration::from_secs(5);
    follower.stop(limit).await;
    holder.stop(limit).await;
    let named = |counts: BTreeMap<String, u64>| -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for (label, n) in counts {
            *out.entry(label.replace(&site.place, "{place}"))
                .or_default() += n;
        }
        out
    };
    Ok(Requests {
        window,
        holder: named(h),
        follower: named(f),
    })
}

/// Everything measured on one backend.
struct BackendReport {
    kind: BackendKind,
    rounds_ok: usize,
    samples: Samples,
    failures: Vec<String>,
    requests: Option<Result<Requests, String>>,
}

async fn bench_backend(
    kind: BackendKind,
    settings: &Settings,
    candidate_bin: PathBuf,
) -> BackendReport {
    let mut report = BackendReport {
        kind,
        rounds_ok: 0,
        samples: Samples::default(),
        failures: Vec::new(),
        requests: None,
    };
    let site = match Site::new(kind, settings, candidate_bin).await {
        Ok(site) => site,
        Err(e) => {
            eprintln!("bench: {}: {e}", kind.name());
            report.failures.push(e);
            return report;
        }
    };
    for n in 1..=settings.rounds {
        match round(&site, n, &mut report.samples).await {
            Ok(()) => report.rounds_ok += 1,
            Err(e) => report.failures.push(format!("round {n}: {e}")),
        }
        eprintln!(
            "bench: {} round {n}/{}: {}",
            kind.name(),
            settings.rounds,
            report.failures.last().map_or("done", String::as_str)
        );
    }
    if kind.proxied() {
        eprintln!(
            "bench: {} counting requests for {:?}",
            kind.name(),
            settings.window
        );
        let counted = count_requests(&site, settings.window).await;
        if let Err(e) = &counted {
            report.failures.push(format!("request count: {e}"));
        }
        report.requests = Some(counted);
    }
    report
}

/// `min / median / max` of `values`, or `-`.
fn spread(values: &[f64]) -> String {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let (Some(min), Some(max)) = (v.first(), v.last()) else {
        return "-".to_owned();
    };
    let mid = v.len() / 2;
    let median = if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    };
    format!("{min:.0} / {median:.0} / {max:.0}")
}

fn render(settings: &Settings, reports: &[BackendReport]) -> String {
    let t = Timing::from_ttl(settings.ttl);
    let mut s = String::new();
    let secs = |d: Duration| format!("{:.2} s", d.as_secs_f64());
    let _ = writeln!(
        s,
        "Settings: ttl {} (renew every {}, retry every {}, request timeout {}, margin {}: the \
         defaults for that ttl), {} rounds per backend, request window {}.\n\n\
         Measured on this machine against the emulators (Azurite, moto, fake-gcs-server, on \
         loopback) and the local file store, debug builds, all backends at once: today's \
         numbers to compare later work against, not what a cloud region gives.\n",
        secs(t.ttl),
        secs(t.renew_every),
        secs(t.retry_every),
        secs(t.request_timeout),
        secs(t.margin),
        settings.rounds,
        secs(settings.window)
    );
    s.push_str(
        "## Latency, ms (min / median / max)\n\n\
         | backend | rounds ok | acquire (spawn to leader) | acquire (elector start to leader) \
         | handover after SIGTERM | failover after SIGKILL |\n\
         |---|---|---|---|---|---|\n",
    );
    for r in reports {
        let _ = writeln!(
            s,
            "| {} | {}/{} | {} | {} | {} | {} |",
            r.kind.name(),
            r.rounds_ok,
            settings.rounds,
            spread(&r.samples.acquire_from_spawn),
            spread(&r.samples.acquire_from_ready),
            spread(&r.samples.handover),
            spread(&r.samples.failover)
        );
    }
    s.push_str(
        "\n## Store requests per hour (one holder, one waiting follower)\n\n\
         Counted by each candidate's proxy over the window and scaled to an hour. A kind is the \
         AWS operation, else `METHOD /path` (Azure's lease actions share one path: acquire, \
         renew and release are one row).\n\n\
         | backend | who | request | in window | per hour |\n|---|---|---|---|---|\n",
    );
    for r in reports {
        match &r.requests {
            None => {
                let _ = writeln!(
                    s,
                    "| {} | - | no network: not counted | - | - |",
                    r.kind.name()
                );
            }
            Some(Err(e)) => {
                let _ = writeln!(s, "| {} | - | not counted: {e} | - | - |", r.kind.name());
            }
            Some(Ok(req)) => {
                let hours = req.window.as_secs_f64() / 3600.0;
                for (who, counts) in [("holder", &req.holder), ("follower", &req.follower)] {
                    let total: u64 = counts.values().sum();
                    let rows = counts
                        .iter()
                        .map(|(k, v)| (format!("`{k}`"), *v))
                        .chain([("**total**".to_owned(), total)]);
                    for (label, n) in rows {
                        let _ = writeln!(
                            s,
                            "| {} | {who} | {label} | {n} | {:.0} |",
                            r.kind.name(),
                            n as f64 / hours
                        );
                    }
                }
            }
        }
    }
    let failures: Vec<String> = reports
        .iter()
        .flat_map(|r| {
            r.failures
                .iter()
                .map(|f| format!("- {}: {f}", r.kind.name()))
        })
        .collect();
    if !failures.is_empty() {
        s.push_str("\n## Failures\n\n");
        s.push_str(&failures.join("\n"));
        s.push('\n');
    }
    s
}

fn candidate_bin() -> Result<PathBuf, String> {
    let me = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
    let bin = me.with_file_name("chaos_candidate");
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!(
            "{bin:?} not found: build it with `cargo build -p integration-tests --bins`"
        ))
    }
}

fn check_dir(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {dir:?}: {e}"))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let settings = match parse_args(std::env::args().skip(1)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::from(2);
        }
    };
    let setup = candidate_bin().and_then(|bin| check_dir(&settings.dir).map(|()| bin));
    let bin = match setup {
        Ok(bin) => bin,
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!("bench: candidates' logs in {:?}", settings.dir);
    let settings = std::sync::Arc::new(settings);
    let tasks: Vec<_> = settings
        .backends
        .iter()
        .map(|&kind| {
            let (settings, bin) = (settings.clone(), bin.clone());
            tokio::spawn(async move { bench_backend(kind, &settings, bin).await })
        })
        .collect();
    let mut reports = Vec::new();
    for task in tasks {
        match task.await {
            Ok(report) => reports.push(report),
            Err(e) => {
                eprintln!("bench: a backend's task failed: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let text = render(&settings, &reports);
    print!("{text}");
    if let Some(out) = &settings.out
        && let Err(e) = std::fs::write(out, &text)
    {
        eprintln!("bench: writing {out:?}: {e}");
        return ExitCode::FAILURE;
    }
    if reports.iter().all(|r| r.failures.is_empty()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Result<Settings, String> {
        parse_args(list.iter().map(|s| (*s).to_owned()))
    }

    #[test]
    fn arguments_are_checked() {
        let s = args(&["ttl=15", "rounds=2", "backends=gcs,file"]).unwrap();
        assert_eq!(s.ttl, Duration::from_secs(15));
        assert_eq!(s.rounds, 2);
        assert_eq!(s.backends, [BackendKind::Gcs, BackendKind::File]);
        for bad in [
            "ttl=0",
            "ttl=x",
            "rounds=0",
            "rounds=-1",
            "backends=s3",
            "nope=1",
            "ttl",
        ] {
            assert!(args(&[bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn spread_is_min_median_max() {
        assert_eq!(spread(&[]), "-");
        assert_eq!(spread(&[3.0, 1.0, 2.0]), "1 / 2 / 3");
        assert_eq!(spread(&[4.0, 1.0, 2.0, 10.0]), "1 / 3 / 10");
    }
}
