//! The benchmark of the metrics' overhead: `metrics_overhead [--all] [--rounds N]
//! [--secs S] [--warmup S]`, or `metrics_overhead --mode none|prometheus [--secs S]
//! [--warmup S]` for one round. Build it with `--release`; results are in
//! `results/metrics-overhead.md`.
//!
//! Not a test: nothing asserts on a time, and neither `cargo test` nor CI runs it.
//!
//! One round, in a process of its own (a global recorder cannot be uninstalled):
//!
//! - `--mode none`: no recorder, so every handle is the facade's no-op;
//! - `--mode prometheus`: the recorder of `metrics-exporter-prometheus`, set up as the CLI sets
//!   it up (`leader-cli/src/endpoints.rs`: buckets per histogram, descriptions), installed
//!   globally before the client is built.
//!
//! A [`LeaseClient`] on a [`MemoryStore`] acquires a key once (ttl 60 s), then renews it in a
//! tight loop on a current-thread runtime, in real time: `--warmup` seconds, then `--secs`
//! seconds measured. One iteration is what the elector's leader loop does for metrics around
//! one renew: `sent = Instant::now()`; `client.renew().await` (one conditional write to the
//! store, counted by the client's store metrics: a counter increment and a mutex-guarded
//! `Instant` of the last answer); record `sent.elapsed()` in `leader_renew_duration_seconds`;
//! record the time the previous grant still had in `leader_renew_slack_seconds`. The two
//! histograms are handles registered with the elector's names and labels. In prometheus mode,
//! every [`UPKEEP_EVERY`] renews the loop also folds the histogram samples into their buckets
//! (`run_upkeep`, which the CLI runs every 5 s on another task), inside the measured time.
//!
//! Then, in prometheus mode, a scrape (`render`) must show the renew counter and both
//! histograms' counts equal to the renews done (else the round fails), and the time of a
//! scrape is measured over [`SCRAPES`] renders of one elector's series (the client's 20
//! counters and the elector's 7 metrics). Last, in both modes, the metric operations of one
//! iteration alone (no renew) are timed for [`PARTS_SECS`] seconds.
//!
//! The driver (`--all`, the default) runs `--rounds` rounds of each mode, interleaved
//! (none, prometheus, none, ...), each a child process of this program, and prints a markdown
//! report on stdout, progress on stderr. Exits 2 on a bad argument, 1 if a round failed.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command-line program reports on its streams"
)]

use std::fmt::Write as _;
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leader_core::metrics as names;
use leader_core::{
    Acquisition, Grant, HolderId, LeaseBackend, LeaseClient, LeaseKey, MemoryStore, Renewal, Timing,
};
use metrics::{Counter, Gauge, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde_json::{Value, json};
use tokio::time::Instant;

/// In prometheus mode, histogram samples are folded into buckets every this many iterations
/// (2 samples each): it bounds the memory the samples take, and its cost is measured.
const UPKEEP_EVERY: u64 = 1 << 16;
/// The clock is read for the end of a loop every this many iterations.
const CHECK_EVERY: u64 = 256;
/// Renders timed for the scrape cost.
const SCRAPES: usize = 500;
/// Seconds of the metric operations alone.
const PARTS_SECS: f64 = 1.0;

const KEY: &str = "bench-key";
const HOLDER: &str = "bench-holder";
const BACKEND: &str = "memory";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    None,
    Prometheus,
}

impl Mode {
    const ALL: [Mode; 2] = [Mode::None, Mode::Prometheus];

    fn name(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Prometheus => "prometheus",
        }
    }

    fn parse(s: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.name() == s)
    }
}

/// What the command line asked for.
struct Settings {
    /// One round of this mode; `None`: the driver.
    mode: Option<Mode>,
    rounds: u32,
    secs: f64,
    warmup: f64,
}

fn positive(name: &str, value: Option<String>) -> Result<f64, String> {
    let value = value.ok_or_else(|| format!("{name} needs a value"))?;
    match value.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("{name} {value:?} is not a positive number")),
    }
}

fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Settings, String> {
    let mut s = Settings {
        mode: None,
        rounds: 5,
        secs: 3.0,
        warmup: 0.5,
    };
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--all" => s.mode = None,
            "--mode" => {
                let m = args.next().unwrap_or_default();
                s.mode = Some(
                    Mode::parse(&m)
                        .ok_or_else(|| format!("unknown mode {m:?} (none, prometheus)"))?,
                );
            }
            "--rounds" => {
                let r = args.next().unwrap_or_default();
                s.rounds = match r.parse::<u32>() {
                    Ok(n) if n > 0 => n,
                    _ => return Err(format!("--rounds {r:?} is not a positive whole number")),
                };
            }
            "--secs" => s.secs = positive("--secs", args.next())?,
            "--warmup" => s.warmup = positive("--warmup", args.next())?,
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }
    Ok(s)
}

/// Installs the Prometheus recorder globally and describes the metrics, as the CLI does.
fn install_recorder() -> Result<PrometheusHandle, String> {
    let mut builder = PrometheusBuilder::new();
    for (name, buckets) in leader_core::metrics::BUCKETS {
        builder = builder
            .set_buckets_for_metric(Matcher::Full(name.to_owned()), buckets)
            .map_err(|e| e.to_string())?;
    }
    let recorder = builder.build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|e| e.to_string())?;
    names::describe();
    Ok(handle)
}

/// The elector's metrics (`ElectionMetrics` in `leader-core/src/metrics.rs`): same names,
/// same labels.
struct Election {
    is_leader: Gauge,
    terms_started: Counter,
    renew_duration: Histogram,
    renew_slack: Histogram,
    token: Gauge,
    // Registered for the scrape's series; the leader loop records nothing in them.
    _term_duration: Histogram,
    _leaderless: Histogram,
}

impl Election {
    fn new() -> Self {
        macro_rules! labelled {
            ($kind:ident, $name:expr) => {
                metrics::$kind!($name, "key" => KEY, "holder" => HOLDER, "backend" => BACKEND)
            };
        }
        Self {
            is_leader: labelled!(gauge, names::IS_LEADER),
            terms_started: labelled!(counter, names::TERMS_STARTED),
            renew_duration: labelled!(histogram, names::RENEW_DURATION),
            renew_slack: labelled!(histogram, names::RENEW_SLACK),
            token: labelled!(gauge, names::FENCING_TOKEN),
            _term_duration: labelled!(histogram, names::TERM_DURATION),
            _leaderless: labelled!(histogram, names::LEADERLESS),
        }
    }
}

/// Folds histogram samples into buckets (prometheus mode), timing it.
struct Upkeep<'a> {
    handle: Option<&'a PrometheusHandle>,
    spent: Duration,
}

impl Upkeep<'_> {
    fn run(&mut self) {
        if let Some(h) = self.handle {
            let t = Instant::now();
            h.run_upkeep();
            self.spent += t.elapsed();
        }
    }
}

/// One measured loop: iterations and the time they took.
struct Spin {
    iterations: u64,
    elapsed: Duration,
}

/// Renews for `length`, recording the elector's two histograms per renew.
async fn renew_loop(
    client: &mut LeaseClient,
    m: &Election,
    grant: &mut Grant,
    upkeep: &mut Upkeep<'_>,
    length: Duration,
) -> Result<Spin, String> {
    let start = Instant::now();
    let end = start + length;
    let mut iterations = 0u64;
    loop {
        let sent = Instant::now();
        let renewal = client.renew().await;
        m.renew_duration.record(sent.elapsed().as_secs_f64());
        match renewal {
            Ok(Renewal::Renewed(g)) => {
                let slack = grant.deadline.saturating_duration_since(Instant::now());
                m.renew_slack.record(slack.as_secs_f64());
                *grant = g;
            }
            Ok(other) => return Err(format!("renew {iterations} ended the term: {other:?}")),
            Err(e) => return Err(format!("renew {iterations} failed: {e}")),
        }
        iterations += 1;
        if iterations.is_multiple_of(UPKEEP_EVERY) {
            upkeep.run();
        }
        if iterations.is_multiple_of(CHECK_EVERY) && Instant::now() >= end {
            return Ok(Spin {
                iterations,
                elapsed: start.elapsed(),
            });
        }
    }
}

/// The metric operations of one iteration without the renew: the client's count of the
/// store call (its counter and the mutex-guarded `Instant`) and the elector's two records.
fn parts_loop(
    m: &Election,
    counter: &Counter,
    deadline: Instant,
    upkeep: &mut Upkeep<'_>,
    length: Duration,
) -> Spin {
    let answered: Mutex<Option<Instant>> = Mutex::new(None);
    let start = Instant::now();
    let end = start + length;
    let mut iterations = 0u64;
    loop {
        let sent = Instant::now();
        *answered.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        counter.increment(1);
        m.renew_duration.record(sent.elapsed().as_secs_f64());
        let slack = deadline.saturating_duration_since(Instant::now());
        m.renew_slack.record(slack.as_secs_f64());
        iterations += 1;
        if iterations.is_multiple_of(UPKEEP_EVERY) {
            upkeep.run();
        }
        if iterations.is_multiple_of(CHECK_EVERY) && Instant::now() >= end {
            std::hint::black_box(&answered);
            return Spin {
                iterations,
                elapsed: start.elapsed(),
            };
        }
    }
}

/// The cost of one `Instant::now()`, in ns: the metric operations read the clock 4 times.
fn clock_ns() -> f64 {
    const READS: u32 = 1_000_000;
    let start = Instant::now();
    for _ in 0..READS {
        std::hint::black_box(Instant::now());
    }
    start.elapsed().as_secs_f64() * 1e9 / f64::from(READS)
}

/// The value of the series of `name` whose line has every one of `labels`.
fn scraped(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .find(|l| labels.iter().all(|label| l.contains(label)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Series in a scrape: counters, gauges and histograms (each counted once, by its `_count`).
fn series(text: &str) -> usize {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter(|l| {
            let name = l.split(['{', ' ']).next().unwrap_or_default();
            !name.ends_with("_bucket") && !name.ends_with("_sum")
        })
        .count()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// One round in this process: the figures as one JSON line.
async fn round(mode: Mode, secs: f64, warmup: f64) -> Result<Value, String> {
    let handle = match mode {
        Mode::Prometheus => Some(install_recorder()?),
        Mode::None => None,
    };
    let key = LeaseKey::new(KEY).map_err(|e| e.to_string())?;
    let holder = HolderId::new(HOLDER).map_err(|e| e.to_string())?;
    let store: Arc<dyn LeaseBackend> = Arc::new(MemoryStore::new());
    let mut client = LeaseClient::new(
        store,
        key,
        holder,
        Timing::from_ttl(Duration::from_secs(60)),
    )
    .map_err(|e| e.to_string())?;
    let m = Election::new();
    m.is_leader.set(0.0);
    let mut grant = match client.try_acquire().await.map_err(|e| e.to_string())? {
        Acquisition::Acquired(g) => g,
        other => return Err(format!("the empty key was not acquired: {other:?}")),
    };
    m.terms_started.increment(1);
    m.token.set(grant.token.get() as f64);
    m.is_leader.set(1.0);

    let mut upkeep = Upkeep {
        handle: handle.as_ref(),
        spent: Duration::ZERO,
    };
    let warm = renew_loop(
        &mut client,
        &m,
        &mut grant,
        &mut upkeep,
        Duration::from_secs_f64(warmup),
    )
    .await?;
    upkeep.spent = Duration::ZERO;
    let timed = renew_loop(
        &mut client,
        &m,
        &mut grant,
        &mut upkeep,
        Duration::from_secs_f64(secs),
    )
    .await?;
    let renew_upkeep = upkeep.spent;
    let renews = warm.iterations + timed.iterations;

    let mut out = json!({
        "mode": mode.name(),
        "renews": timed.iterations,
        "secs": timed.elapsed.as_secs_f64(),
        "renews_per_s": timed.iterations as f64 / timed.elapsed.as_secs_f64(),
        "upkeep_s": renew_upkeep.as_secs_f64(),
        "renews_total": renews,
    });

    if let Some(h) = &handle {
        let text = h.render();
        let labels = [
            "key=\"bench-key\"",
            "holder=\"bench-holder\"",
            "backend=\"memory\"",
        ];
        let counted = scraped(
            &text,
            names::STORE_REQUESTS,
            &[
                labels[0],
                labels[1],
                labels[2],
                "op=\"renew\"",
                "outcome=\"ok\"",
            ],
        );
        let durations = scraped(&text, &format!("{}_count", names::RENEW_DURATION), &labels);
        let slacks = scraped(&text, &format!("{}_count", names::RENEW_SLACK), &labels);
        let want = Some(renews as f64);
        if counted != want || durations != want || slacks != want {
            return Err(format!(
                "the scrape does not show the {renews} renews done: counter {counted:?}, \
                 {} count {durations:?}, {} count {slacks:?}",
                names::RENEW_DURATION,
                names::RENEW_SLACK
            ));
        }
        let mut times = Vec::with_capacity(SCRAPES);
        let mut bytes = 0;
        for _ in 0..SCRAPES {
            let t = Instant::now();
            let text = h.render();
            times.push(t.elapsed().as_secs_f64() * 1e6);
            bytes = std::hint::black_box(text).len();
        }
        let min = times.iter().copied().fold(f64::INFINITY, f64::min);
        let max = times.iter().copied().fold(0.0, f64::max);
        out["scraped_renews"] = json!(renews);
        out["scrape_us_median"] = json!(median(times));
        out["scrape_us_min"] = json!(min);
        out["scrape_us_max"] = json!(max);
        out["scrape_bytes"] = json!(bytes);
        out["scrape_lines"] = json!(text.lines().filter(|l| !l.starts_with('#')).count());
        out["scrape_series"] = json!(series(&text));
    }

    // The same series as the client's renew counter: the check above is done.
    let counter = metrics::counter!(
        names::STORE_REQUESTS,
        "key" => KEY, "holder" => HOLDER, "backend" => BACKEND,
        "op" => "renew", "outcome" => "ok"
    );
    upkeep.spent = Duration::ZERO;
    let parts = parts_loop(
        &m,
        &counter,
        grant.deadline,
        &mut upkeep,
        Duration::from_secs_f64(PARTS_SECS),
    );
    out["parts_ns"] = json!(parts.elapsed.as_secs_f64() * 1e9 / parts.iterations as f64);
    out["clock_ns"] = json!(clock_ns());
    out["parts_upkeep_ns"] = json!(upkeep.spent.as_secs_f64() * 1e9 / parts.iterations as f64);
    Ok(out)
}

/// Runs one round of `mode` in a child process.
fn child(exe: &std::path::Path, mode: Mode, s: &Settings) -> Result<Value, String> {
    let output = Command::new(exe)
        .args(["--mode", mode.name()])
        .args(["--secs", &s.secs.to_string()])
        .args(["--warmup", &s.warmup.to_string()])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("starting a {} round: {e}", mode.name()))?;
    if !output.status.success() {
        return Err(format!("a {} round failed: {}", mode.name(), output.status));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text.lines().last().unwrap_or_default();
    serde_json::from_str(line).map_err(|e| format!("the {} round said {line:?}: {e}", mode.name()))
}

fn num(v: &Value, field: &str) -> f64 {
    v[field].as_f64().unwrap_or(f64::NAN)
}

/// Runs the rounds and writes the report.
fn drive(s: &Settings) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
    let mut rounds: Vec<Value> = Vec::new();
    for r in 1..=s.rounds {
        for mode in Mode::ALL {
            let v = child(&exe, mode, s)?;
            eprintln!(
                "metrics_overhead: round {r}/{} {:<10} {:>10.0} renews/s",
                s.rounds,
                mode.name(),
                num(&v, "renews_per_s")
            );
            rounds.push(v);
        }
    }
    let of = |mode: Mode, field: &str| -> Vec<f64> {
        rounds
            .iter()
            .filter(|v| v["mode"] == mode.name())
            .map(|v| num(v, field))
            .collect()
    };
    let mut md = String::new();
    let _ = writeln!(
        md,
        "Rounds: {} per mode, interleaved, {} s measured each after {} s of warm-up.\n",
        s.rounds, s.secs, s.warmup
    );
    let _ = writeln!(
        md,
        "| mode | median renews/s | min | max | ns/renew (median) | upkeep, ns/renew | metric ops alone, ns/iteration (median) |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|");
    let mut ns = Vec::new();
    let mut parts = Vec::new();
    for mode in Mode::ALL {
        let rates = of(mode, "renews_per_s");
        let min = rates.iter().copied().fold(f64::INFINITY, f64::min);
        let max = rates.iter().copied().fold(0.0, f64::max);
        let med = median(rates);
        let upkeep: f64 =
            of(mode, "upkeep_s").iter().sum::<f64>() * 1e9 / of(mode, "renews").iter().sum::<f64>();
        let part = median(of(mode, "parts_ns"));
        ns.push(1e9 / med);
        parts.push(part);
        let _ = writeln!(
            md,
            "| {} | {med:.0} | {min:.0} | {max:.0} | {:.0} | {upkeep:.1} | {part:.1} |",
            mode.name(),
            1e9 / med
        );
    }
    let added = ns[1] - ns[0];
    let _ = writeln!(
        md,
        "\nOverhead of the prometheus recorder over no recorder: {added:+.0} ns per renew, \
         {:+.1} % of the time of a renew (medians of renews/s); metric operations alone: \
         {:+.1} ns per iteration.",
        added / ns[0] * 100.0,
        parts[1] - parts[0]
    );
    let prom: Vec<&Value> = rounds
        .iter()
        .filter(|v| v["mode"] == Mode::Prometheus.name())
        .collect();
    if let Some(first) = prom.first() {
        let _ = writeln!(
            md,
            "\nScrape (`PrometheusHandle::render`, {SCRAPES} per round, {} series, {} sample \
             lines, {} bytes): median of the rounds' medians {:.1} µs (rounds' medians {:.1} \
             to {:.1} µs; fastest render {:.1} µs, slowest {:.1} µs).",
            first["scrape_series"],
            first["scrape_lines"],
            first["scrape_bytes"],
            median(of(Mode::Prometheus, "scrape_us_median")),
            of(Mode::Prometheus, "scrape_us_median")
                .iter()
                .copied()
                .fold(f64::INFINITY, f64::min),
            of(Mode::Prometheus, "scrape_us_median")
                .iter()
                .copied()
                .fold(0.0, f64::max),
            of(Mode::Prometheus, "scrape_us_min")
                .iter()
                .copied()
                .fold(f64::INFINITY, f64::min),
            of(Mode::Prometheus, "scrape_us_max")
                .iter()
                .copied()
                .fold(0.0, f64::max),
        );
        let checks: Vec<String> = prom
            .iter()
            .map(|v| format!("{}", v["scraped_renews"]))
            .collect();
        let _ = writeln!(
            md,
            "\nRenew counter in each prometheus round's scrape (equal to the renews done, \
             warm-up included, checked): {}.",
            checks.join(", ")
        );
    }
    let _ = writeln!(
        md,
        "\nOne `tokio::time::Instant::now()` (the std clock): median {:.1} ns (the metric \
         operations of one iteration read it 4 times).",
        median(
            of(Mode::None, "clock_ns")
                .into_iter()
                .chain(of(Mode::Prometheus, "clock_ns"))
                .collect()
        )
    );
    let _ = writeln!(
        md,
        "\nEvery round:\n\n| round | mode | renews | s | renews/s |"
    );
    let _ = writeln!(md, "|---:|---|---:|---:|---:|");
    for (i, v) in rounds.iter().enumerate() {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.3} | {:.0} |",
            i / 2 + 1,
            v["mode"].as_str().unwrap_or_default(),
            v["renews"],
            num(v, "secs"),
            num(v, "renews_per_s")
        );
    }
    Ok(md)
}

fn main() -> ExitCode {
    let s = match parse_args(std::env::args().skip(1)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("metrics_overhead: {e}");
            return ExitCode::from(2);
        }
    };
    let Some(mode) = s.mode else {
        return match drive(&s) {
            Ok(md) => {
                print!("{md}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("metrics_overhead: {e}");
                ExitCode::FAILURE
            }
        };
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("metrics_overhead: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(round(mode, s.secs, s.warmup)) {
        Ok(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("metrics_overhead {}: {e}", mode.name());
            ExitCode::FAILURE
        }
    }
}
