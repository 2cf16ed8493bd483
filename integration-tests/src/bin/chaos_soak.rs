//! The long form of the chaos drills: `chaos_soak [rounds=N] [parallel=P]
//! [parallel-BACKEND=P ...] [minutes=M]
//! [backends=file,azure,dynamo,gcs,s3,s3-localstack,etcd,zookeeper,quorum-file,raft]
//! [scenarios=sigkill,sigstop,partition,stall,throttle,sigterm,lossy,late,restart,restart-empty,
//!  member-away,member-kill,member-stop,member-partition,leader-minority,follower-minority,
//!  rolling-restart]
//! [out=FILE] [dir=DIR]`.
//!
//! - `rounds=N`: rounds **per backend** (not per scenario), spread round-robin over the
//!   scenarios of `scenarios=` that apply to the backend (round i runs scenario i mod k);
//!   default: 3 per applicable scenario. A round whose setup failed (nothing was judged: the
//!   emulator did not answer the round's setup) counts as a setup error and runs again, for
//!   at most a tenth of the rounds, so that N rounds are judged.
//! - `parallel=P` (default 3): up to P rounds of one backend at once; every backend runs
//!   beside the others. `parallel-azure=5` (any backend's name) overrides it for one backend.
//!   Each round has its own container, table, bucket or key prefix, its own three candidate
//!   processes and their proxies, so rounds of one backend do not meet. The drills' time
//!   bounds carry 1 s of slack; an overloaded machine shows up as `slow` violations (a
//!   broken bound) in the summary. Why 3, on 2 cores with the emulators on the same machine
//!   (2026-12-01): the rounds mostly wait (a ttl, a fault window), so throughput grows with P,
//!   but the one shared Azurite answers slowly under load. P=3 on all six backends: no
//!   failover, handover or recovery past its bound in 3100 rounds; P=4 (Azure) and P=6 (all):
//!   failovers past their bound, Azure candidates unable to open the store. 300 rounds per
//!   backend take about 20 min with `parallel=3 parallel-azure=5` (Azure, ~890 rounds/h, is
//!   last; the others take 10 min or less); Azure at P=5 has had no broken bound.
//! - `minutes=M`: no new round starts after M minutes (the running ones finish).
//! - `scenarios=`: default every scenario (those that do not apply to a backend are skipped).
//! - `keep-data=yes`: keep the data folder (`store/data`) of a restart round's dedicated store
//!   instance, and `cluster/data` of a member round's cluster, after a clean round too. By
//!   default it is deleted when the round had no violation: etcd preallocates 120 MB per
//!   instance (and per member), which over 300 rounds would fill a small disk. The candidates'
//!   logs and the instance's or the members' logs are always kept.
//!
//! Prints progress on stderr and writes the summary to `out` (default `chaos-summary.txt`)
//! after every round, and to stdout at the end: the command line, date, machine (cores),
//! wall time and parallelism, then per backend the rounds, violations, failover / recovery /
//! handover min, median and p99, spurious step-downs and late deliveries, then the same per
//! backend and scenario (see `Summary::render`). Candidate logs stay in `dir` (default a new
//! folder under the temporary directory). Exits 1 if any round had a violation or a setup
//! error.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command-line program reports on its streams"
)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use integration_tests::chaos::BackendKind;
use integration_tests::chaos::drill::{DrillConfig, Scenario, Summary, run_round};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// What the command line asks for.
struct Args {
    rounds: Option<usize>,
    parallel: usize,
    parallel_for: BTreeMap<BackendKind, usize>,
    minutes: Option<f64>,
    backends: Vec<BackendKind>,
    scenarios: Vec<Scenario>,
    out: PathBuf,
    dir: PathBuf,
    keep_data: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        rounds: None,
        parallel: 3,
        parallel_for: BTreeMap::new(),
        minutes: None,
        backends: BackendKind::ALL.to_vec(),
        scenarios: Scenario::ALL.to_vec(),
        out: PathBuf::from("chaos-summary.txt"),
        dir: std::env::temp_dir().join(integration_tests::unique_name("chaos-soak")),
        keep_data: false,
    };
    let count = |name: &str, value: &str| -> Result<usize, String> {
        value
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("{name}={value:?} is not a positive whole number"))
    };
    for arg in std::env::args().skip(1) {
        let Some((name, value)) = arg.split_once('=') else {
            return Err(format!("argument {arg:?} is not name=value"));
        };
        match name {
            "rounds" => args.rounds = Some(count(name, value)?),
            "parallel" => args.parallel = count(name, value)?,
            "minutes" => match value.parse::<f64>() {
                Ok(m) if m > 0.0 => args.minutes = Some(m),
                _ => return Err(format!("minutes={value:?} is not a positive number")),
            },
            "backends" => {
                args.backends = value
                    .split(',')
                    .map(|b| BackendKind::parse(b).ok_or_else(|| format!("unknown backend {b:?}")))
                    .collect::<Result<_, _>>()?;
            }
            "scenarios" => {
                args.scenarios = value
                    .split(',')
                    .map(|s| Scenario::parse(s).ok_or_else(|| format!("unknown scenario {s:?}")))
                    .collect::<Result<_, _>>()?;
            }
            "out" => args.out = PathBuf::from(value),
            "dir" => args.dir = PathBuf::from(value),
            "keep-data" => match value {
                "yes" => args.keep_data = true,
                "no" => args.keep_data = false,
                _ => return Err(format!("keep-data={value:?} is neither yes nor no")),
            },
            _ => match name.strip_prefix("parallel-").and_then(BackendKind::parse) {
                Some(kind) => {
                    args.parallel_for.insert(kind, count(name, value)?);
                }
                None => return Err(format!("unknown argument {name:?}")),
            },
        }
    }
    Ok(args)
}

/// One backend's share of the soak.
#[derive(Clone)]
struct Plan {
    kind: BackendKind,
    scenarios: Vec<Scenario>,
    rounds: usize,
    parallel: usize,
}

/// What the summary's header says about the run.
struct Run {
    command: String,
    date: String,
    cores: usize,
    origin: Instant,
    minutes: Option<f64>,
    plans: Vec<Plan>,
    out: PathBuf,
}

impl Run {
    /// The header and the summary's tables; `status` says whether the run is over.
    fn report(&self, summary: &Summary, status: &str) -> String {
        let wall = self.origin.elapsed().as_secs();
        let load = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|| "?".to_owned());
        let mut head = vec![
            format!("# Command: {}", self.command),
            format!(
                "# Started {}; machine: {} cores (nproc); load average at this update: {load}",
                self.date, self.cores
            ),
            format!(
                "# Wall time: {} min {} s ({status}); {} rounds judged, {} set up in vain{}",
                wall / 60,
                wall % 60,
                summary.judged(),
                summary.rounds() - summary.judged(),
                self.minutes
                    .map(|m| format!("; no new round after {m} min"))
                    .unwrap_or_default()
            ),
            "# Parallelism: each backend beside the others; per backend up to P rounds at once, \
             each with 3 candidate processes behind their own fault proxies:"
                .to_owned(),
        ];
        for plan in &self.plans {
            let names: Vec<&str> = plan.scenarios.iter().map(|s| s.name()).collect();
            head.push(format!(
                "#   {:<9} P={}, {} rounds round-robin over {}",
                plan.kind.name(),
                plan.parallel,
                plan.rounds,
                names.join(",")
            ));
        }
        let mut text = head.join("\n");
        text.push_str("\n\n");
        text.push_str(&summary.render());
        text
    }

    fn write(&self, text: &str) {
        if let Err(e) = std::fs::write(&self.out, text) {
            eprintln!("chaos_soak: writing {:?}: {e}", self.out);
        }
    }
}

/// The wall-clock date, for the summary's header only.
#[allow(
    clippy::disallowed_methods,
    reason = "the date a soak ran is a wall-clock fact, not a timer"
)]
fn now_date() -> String {
    httpdate::fmt_http_date(std::time::SystemTime::now())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("chaos_soak: {e}");
            return ExitCode::from(2);
        }
    };
    let candidate_bin = match std::env::current_exe() {
        Ok(me) => me.with_file_name("chaos_candidate"),
        Err(e) => {
            eprintln!("chaos_soak: {e}");
            return ExitCode::FAILURE;
        }
    };
    let plans: Vec<Plan> = args
        .backends
        .iter()
        .map(|&kind| {
            let scenarios: Vec<Scenario> = args
                .scenarios
                .iter()
                .copied()
                .filter(|s| s.applies_to(kind))
                .collect();
            Plan {
                kind,
                rounds: args.rounds.unwrap_or(3 * scenarios.len()),
                parallel: args
                    .parallel_for
                    .get(&kind)
                    .copied()
                    .unwrap_or(args.parallel),
                scenarios,
            }
        })
        .filter(|p| !p.scenarios.is_empty())
        .collect();
    let origin = Instant::now();
    let stop_at = args
        .minutes
        .map(|m| origin + Duration::from_secs_f64(m * 60.0));
    let run = Arc::new(Run {
        command: std::iter::once("chaos_soak".to_owned())
            .chain(std::env::args().skip(1))
            .collect::<Vec<_>>()
            .join(" "),
        date: now_date(),
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        origin,
        minutes: args.minutes,
        plans: plans.clone(),
        out: args.out.clone(),
    });
    let summary = Arc::new(Mutex::new(Summary::default()));
    let panicked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    run.write(&run.report(&Summary::default(), "running"));
    let mut backends = JoinSet::new();
    for plan in plans {
        let cfg = DrillConfig {
            candidate_bin: candidate_bin.clone(),
            work_dir: args.dir.clone(),
            candidates: 3,
            seed: 0x000c_4a05 ^ plan.kind as u64,
        };
        let summary = summary.clone();
        let run = run.clone();
        let panicked = panicked.clone();
        let keep_data = args.keep_data;
        backends.spawn(async move {
            let kind = plan.kind;
            let mut rounds = JoinSet::new();
            // The next planned round; rounds started so far (seeds); planned rounds to run
            // again because their setup failed, and how many were.
            let mut next = 0;
            let mut started: u64 = 0;
            let mut again = std::collections::VecDeque::new();
            let mut repeated = 0;
            loop {
                while rounds.len() < plan.parallel && stop_at.is_none_or(|t| Instant::now() < t) {
                    let i = if let Some(i) = again.pop_front() {
                        i
                    } else if next < plan.rounds {
                        next += 1;
                        next - 1
                    } else {
                        break;
                    };
                    let scenario = plan.scenarios[i % plan.scenarios.len()];
                    let mut cfg = cfg.clone();
                    cfg.seed = cfg.seed.wrapping_add(started * 97);
                    // The first rounds start a second apart, so that the backend's rounds do
                    // not all start (and inject their faults) at the same moment.
                    let delay = Duration::from_secs(if started < plan.parallel as u64 {
                        started
                    } else {
                        0
                    });
                    started += 1;
                    rounds.spawn(async move {
                        tokio::time::sleep(delay).await;
                        let start = origin.elapsed();
                        let report = run_round(kind, scenario, &cfg).await;
                        (i, scenario, start, origin.elapsed(), report)
                    });
                }
                let Some(done) = rounds.join_next().await else {
                    break;
                };
                let (i, scenario, start, end, report) = match done {
                    Ok(d) => d,
                    Err(e) => {
                        // Counted as a failure of the run (the exit code says so).
                        eprintln!("chaos_soak: a {} round panicked: {e}", kind.name());
                        panicked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        continue;
                    }
                };
                let took = (end - start).as_secs();
                match &report {
                    Ok(r) => eprintln!(
                        "[{:>4} s] {} {} round {}/{}: {} violations, measured {:?} ms, {} terms, \
                         {took} s",
                        end.as_secs(),
                        kind.name(),
                        scenario.name(),
                        i + 1,
                        plan.rounds,
                        r.violations.len(),
                        r.measured_ms.map(|m| m.round()),
                        r.terms
                    ),
                    Err(e) => {
                        // Nothing was judged: the round runs again (the setup error still
                        // counts), at most a tenth of the rounds, so that a store that cannot
                        // be set up at all does not loop.
                        let redo = repeated < plan.rounds.div_ceil(10);
                        if redo {
                            repeated += 1;
                            again.push_back(i);
                        }
                        eprintln!(
                            "[{:>4} s] {} {} round {}/{}: setup error {e}{}",
                            end.as_secs(),
                            kind.name(),
                            scenario.name(),
                            i + 1,
                            plan.rounds,
                            if redo { " (to run again)" } else { "" }
                        );
                    }
                }
                if let Ok(r) = &report
                    && r.violations.is_empty()
                    && !keep_data
                {
                    // A restart round's dedicated store instance, or a member round's
                    // cluster, has stopped by now.
                    for data in [r.dir.join("store/data"), r.dir.join("cluster/data")] {
                        if data.is_dir()
                            && let Err(e) = std::fs::remove_dir_all(&data)
                        {
                            eprintln!("chaos_soak: removing {data:?}: {e}");
                        }
                    }
                }
                let text = {
                    let mut summary = summary.lock().unwrap_or_else(|e| e.into_inner());
                    summary.add(kind, scenario, &report, start, end);
                    run.report(&summary, "running")
                };
                run.write(&text);
            }
        });
    }
    while backends.join_next().await.is_some() {}
    let summary = summary.lock().unwrap_or_else(|e| e.into_inner());
    let planned: usize = run.plans.iter().map(|p| p.rounds).sum();
    let panics = panicked.load(std::sync::atomic::Ordering::SeqCst);
    let mut status = if summary.judged() < planned {
        format!(
            "finished; {planned} rounds planned, {} judged (the rest not started in time, or \
             their setup failed)",
            summary.judged()
        )
    } else {
        "finished".to_owned()
    };
    if panics > 0 {
        status.push_str(&format!("; {panics} rounds panicked (see stderr)"));
    }
    let text = run.report(&summary, &status);
    println!("{text}");
    run.write(&text);
    if summary.failures() == 0 && panics == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
