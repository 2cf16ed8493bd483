//! Runs the simulation of the election over a quorum of stores over many seeds, or replays
//! one.
//!
//! ```text
//! cargo run --release -p leader-core --features simulation --example simulate_quorum -- --seeds 100000
//! cargo run --release -p leader-core --features simulation --example simulate_quorum -- --members 5 --seeds 10000
//! SIM_LOG=leader_core=debug cargo run --release -p leader-core --features simulation --example simulate_quorum -- --seed 42 --verbose
//! cargo run --release -p leader-core --features simulation --example simulate_quorum -- --seeds 200 --flaw token-from-one
//! ```
//!
//! Exits 1 if a seed broke an invariant, or, with `--flaw`, if no seed caught the flaw.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leader_core::simulation::{QuorumFlaw, QuorumReport, QuorumSimConfig, run_quorum};

const FLAWS: &str = "none|deadline-from-largest|absent-taken-at-once|released-by-minority|\
                     token-from-one|majority-of-one|even-halves|blind-renew|ignore-deadline";

/// A flaw by name, and whether the work ignores its deadline.
fn flaw(name: &str) -> Option<(QuorumFlaw, bool)> {
    Some(match name {
        "none" => (QuorumFlaw::None, false),
        "deadline-from-largest" => (QuorumFlaw::DeadlineFromLargest, false),
        "absent-taken-at-once" => (QuorumFlaw::AbsentTakenAtOnce, false),
        "released-by-minority" => (QuorumFlaw::ReleasedByMinority, false),
        "token-from-one" => (QuorumFlaw::TokenFromOne, false),
        "majority-of-one" => (QuorumFlaw::MajorityOfOne, false),
        "even-halves" => (QuorumFlaw::EvenHalves, false),
        "blind-renew" => (QuorumFlaw::BlindRenew, false),
        "ignore-deadline" => (QuorumFlaw::None, true),
        _ => return None,
    })
}

/// Log lines stamped with the simulated time since the first line (the run's paused clock).
struct SimTime;

impl tracing_subscriber::fmt::time::FormatTime for SimTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        static START: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();
        let now = tokio::time::Instant::now();
        let start = *START.get_or_init(|| now);
        write!(w, "{:>9.3}", (now - start).as_secs_f64())
    }
}

struct Args {
    first: u64,
    seeds: u64,
    verbose: bool,
    members: usize,
    planted: QuorumFlaw,
    ignore_deadline: bool,
    threads: usize,
}

fn parse() -> Result<Args, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut a = Args {
        first: 0,
        seeds: 100,
        verbose: false,
        members: 3,
        planted: QuorumFlaw::None,
        ignore_deadline: false,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1).cloned().unwrap_or_default();
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{}: not a number", args[i]))
        };
        match args[i].as_str() {
            "--seed" => {
                a.first = number()?;
                a.seeds = 1;
                i += 1;
            }
            "--first" => {
                a.first = number()?;
                i += 1;
            }
            "--seeds" => {
                a.seeds = number()?;
                i += 1;
            }
            "--threads" => {
                a.threads = number()?.max(1) as usize;
                i += 1;
            }
            "--members" => {
                a.members = number()? as usize;
                i += 1;
            }
            "--flaw" => {
                (a.planted, a.ignore_deadline) =
                    flaw(&value).ok_or_else(|| format!("unknown flaw {value}: {FLAWS}"))?;
                i += 1;
            }
            "--verbose" => a.verbose = true,
            other => return Err(format!("unknown argument {other}")),
        }
        i += 1;
    }
    Ok(a)
}

/// The machine's clock, for the run's wall time (outside the simulated time of each seed).
#[allow(
    clippy::disallowed_methods,
    reason = "the wall time of the whole run, not of a simulated process"
)]
fn wall_clock() -> std::time::Instant {
    std::time::Instant::now()
}

/// What the seeds gave.
#[derive(Default)]
struct Tally {
    failing: Vec<u64>,
    /// Seeds whose history broke a safety invariant (all but liveness).
    unsafe_seeds: Vec<u64>,
    terms: u64,
    /// The longest time to a leader after faults stopped, and its seed.
    slowest: Option<(Duration, u64)>,
    /// The longest stretch without a leader after faults stopped, and its seed.
    longest_gap: Option<(Duration, u64)>,
}

impl Tally {
    fn add(&mut self, report: &QuorumReport) {
        let seed = report.seed;
        self.terms += report.terms as u64;
        if !report.violations.is_empty() {
            self.failing.push(seed);
        }
        if report.unsafe_history() {
            self.unsafe_seeds.push(seed);
        }
        let r = report.recovery;
        if let Some(d) = r.to_leader
            && self.slowest.is_none_or(|(s, _)| d > s)
        {
            self.slowest = Some((d, seed));
        }
        if self.longest_gap.is_none_or(|(g, _)| r.longest_gap > g) {
            self.longest_gap = Some((r.longest_gap, seed));
        }
    }
}

/// The first few of `seeds`, for a summary line.
fn first(seeds: &[u64]) -> String {
    let shown: Vec<String> = seeds.iter().take(10).map(u64::to_string).collect();
    let more = if seeds.len() > 10 { ", ..." } else { "" };
    format!("[{}{more}]", shown.join(", "))
}

fn main() -> ExitCode {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(64);
        }
    };
    if a.verbose && std::env::var_os("SIM_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(std::env::var("SIM_LOG").unwrap_or_default())
            .with_timer(SimTime)
            .with_ansi(false)
            .init();
    }
    let mut base = QuorumSimConfig::new(a.first)
        .with_members(a.members)
        .with_flaw(a.planted);
    base.ignore_deadline = a.ignore_deadline;
    let next = Arc::new(AtomicU64::new(a.first));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let started = wall_clock();
    let workers: Vec<_> = (0..a.threads)
        .map(|_| {
            let (next, tally, base) = (next.clone(), tally.clone(), base.clone());
            let (first, seeds, verbose) = (a.first, a.seeds, a.verbose);
            std::thread::spawn(move || {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= first + seeds {
                        break;
                    }
                    let mut config = base.clone();
                    config.seed = seed;
                    let report = run_quorum(&config);
                    if verbose {
                        for e in &report.events {
                            println!("{e:?}");
                        }
                        println!("seed {seed}: history hash {:016x}", report.history_hash());
                    }
                    for v in &report.violations {
                        println!("seed {seed}: {}: {}", v.checker, v.detail);
                    }
                    if let Ok(mut t) = tally.lock() {
                        t.add(&report);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    let Ok(mut t) = tally.lock() else {
        return ExitCode::from(1);
    };
    t.failing.sort_unstable();
    t.unsafe_seeds.sort_unstable();
    let flaw = if a.ignore_deadline {
        "work ignoring its deadline".to_owned()
    } else {
        format!("{:?}", a.planted)
    };
    println!(
        "quorum simulation: {} members, {} seeds from {}, flaw {flaw}: {} failing {}, of which \
         {} unsafe {}; {} terms; after the faults stopped: slowest leader {:?}, \
         longest gap {:?}; {:.1} s",
        base.members,
        a.seeds,
        a.first,
        t.failing.len(),
        first(&t.failing),
        t.unsafe_seeds.len(),
        first(&t.unsafe_seeds),
        t.terms,
        t.slowest,
        t.longest_gap,
        started.elapsed().as_secs_f64(),
    );
    // A planted flaw is caught by a safety checker; without one, nothing may fail.
    let planted = a.planted != QuorumFlaw::None || a.ignore_deadline;
    let failed = if planted {
        t.unsafe_seeds.is_empty()
    } else {
        !t.failing.is_empty()
    };
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
