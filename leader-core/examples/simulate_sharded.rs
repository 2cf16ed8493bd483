//! Runs the sharded simulation over many seeds, or replays one.
//!
//! ```text
//! cargo run --release -p leader-core --features simulation --example simulate_sharded -- --seeds 10000
//! cargo run --release -p leader-core --features simulation --example simulate_sharded -- --seed 42 --verbose
//! cargo run --release -p leader-core --features simulation --example simulate_sharded -- --seeds 200 --flaw lagging-owner-read
//! ```
//!
//! Exits 1 if a seed broke an invariant, or, with `--flaw`, if no seed caught the flaw.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use leader_core::simulation::{ShardFlaw, ShardSimConfig, run_sharded};

fn flaw(name: &str) -> Option<ShardFlaw> {
    Some(match name {
        "none" => ShardFlaw::None,
        "lagging-owner-read" => ShardFlaw::LaggingOwnerRead,
        "ignore-claims" => ShardFlaw::IgnoreClaims,
        "no-reservation" => ShardFlaw::NoReservation,
        "owner-by-id" => ShardFlaw::OwnerById,
        "no-claims-recheck" => ShardFlaw::NoClaimsRecheck,
        "no-token-recheck" => ShardFlaw::NoTokenRecheck,
        "prune-by-id" => ShardFlaw::PruneById,
        "no-unclaimed-net" => ShardFlaw::NoUnclaimedNet,
        "observer-ttl" => ShardFlaw::ObserverTtl,
        "trust-the-plan" => ShardFlaw::TrustThePlan,
        "claims-for-absent-only" => ShardFlaw::ClaimsForAbsentOnly,
        "roster-from-mark" => ShardFlaw::RosterFromMark,
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

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut first = 0u64;
    let mut seeds = 100u64;
    let mut verbose = false;
    let mut planted = ShardFlaw::None;
    let mut ignore_deadline = false;
    let mut threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--seed" => {
                first = value.parse().unwrap_or(0);
                seeds = 1;
                i += 1;
            }
            "--first" => {
                first = value.parse().unwrap_or(0);
                i += 1;
            }
            "--seeds" => {
                seeds = value.parse().unwrap_or(100);
                i += 1;
            }
            "--threads" => {
                threads = value.parse().unwrap_or(1);
                i += 1;
            }
            "--flaw" => {
                let Some(f) = flaw(&value) else {
                    eprintln!(
                        "unknown flaw {value}: none|lagging-owner-read|ignore-claims|no-reservation|\
                         owner-by-id|no-claims-recheck|no-token-recheck|prune-by-id|no-unclaimed-net|observer-ttl|\
                         trust-the-plan|claims-for-absent-only|roster-from-mark"
                    );
                    return ExitCode::from(64);
                };
                planted = f;
                i += 1;
            }
            "--ignore-deadline" => ignore_deadline = true,
            "--verbose" => verbose = true,
            other => {
                eprintln!("unknown argument {other}");
                return ExitCode::from(64);
            }
        }
        i += 1;
    }
    if verbose && std::env::var_os("SIM_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(std::env::var("SIM_LOG").unwrap_or_default())
            .with_timer(SimTime)
            .with_ansi(false)
            .init();
    }
    let next = Arc::new(AtomicU64::new(first));
    let failing = Arc::new(Mutex::new(Vec::new()));
    let terms = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (next, failing, terms) = (next.clone(), failing.clone(), terms.clone());
            std::thread::spawn(move || {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= first + seeds {
                        break;
                    }
                    let mut config = ShardSimConfig::new(seed).with_flaw(planted);
                    config.ignore_deadline = ignore_deadline;
                    let report = run_sharded(&config);
                    terms.fetch_add(report.terms as u64, Ordering::Relaxed);
                    if verbose {
                        for e in &report.events {
                            println!("{e:?}");
                        }
                    }
                    if !report.violations.is_empty() {
                        for v in &report.violations {
                            println!("seed {seed}: {}: {}", v.checker, v.detail);
                        }
                        if let Ok(mut f) = failing.lock() {
                            f.push(seed);
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    let failing = failing.lock().map(|f| f.clone()).unwrap_or_default();
    println!(
        "sharded simulation: {seeds} seeds from {first}, flaw {planted:?}: {} failing, {} shard terms",
        failing.len(),
        terms.load(Ordering::Relaxed)
    );
    let caught = !failing.is_empty();
    if (planted == ShardFlaw::None && !ignore_deadline) == caught {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
