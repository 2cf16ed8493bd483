//! Runs the deterministic simulation over many seeds, or replays one.
//!
//! ```text
//! cargo run --release -p leader-core --features simulation --example simulate -- --seeds 100000
//! cargo run --release -p leader-core --features simulation --example simulate -- --seed 4242 --verbose
//! cargo run --release -p leader-core --features simulation --example simulate -- --seeds 200 --negative ignore-deadline
//! ```
//!
//! Exits 1 if any seed broke an invariant (or, with `--negative`, if no seed was caught).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leader_core::simulation::{NegativeControl, SimConfig, run};

fn usage() -> ExitCode {
    eprintln!(
        "usage: simulate [--seeds N] [--first S] [--seed S] [--verbose] [--threads T]\n\
         \x20               [--negative none|ignore-deadline|drift] [--out FILE]"
    );
    ExitCode::from(64)
}

fn main() -> ExitCode {
    let mut seeds: u64 = 1000;
    let mut first: u64 = 0;
    let mut verbose = false;
    let mut negative = NegativeControl::None;
    let mut threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut out: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next();
        match arg.as_str() {
            "--seeds" => match value().and_then(|v| v.parse().ok()) {
                Some(n) => seeds = n,
                None => return usage(),
            },
            "--first" => match value().and_then(|v| v.parse().ok()) {
                Some(n) => first = n,
                None => return usage(),
            },
            "--seed" => match value().and_then(|v| v.parse().ok()) {
                Some(n) => {
                    first = n;
                    seeds = 1;
                }
                None => return usage(),
            },
            "--threads" => match value().and_then(|v| v.parse().ok()) {
                Some(n) => threads = n,
                None => return usage(),
            },
            "--negative" => {
                negative = match value().as_deref() {
                    Some("none") => NegativeControl::None,
                    Some("ignore-deadline") => NegativeControl::IgnoreDeadline,
                    Some("drift") => NegativeControl::ExcessiveDrift,
                    _ => return usage(),
                }
            }
            "--out" => out = value(),
            "--verbose" => verbose = true,
            _ => return usage(),
        }
    }

    let next = Arc::new(AtomicU64::new(first));
    let failed = Arc::new(Mutex::new(Vec::new()));
    let terms = Arc::new(AtomicU64::new(0));
    let worst_gap = Arc::new(Mutex::new(Duration::ZERO));
    #[allow(clippy::disallowed_methods)] // measuring the program's own wall time
    let started = std::time::Instant::now();
    let workers: Vec<_> = (0..threads.max(1))
        .map(|_| {
            let (next, failed, terms, worst_gap) = (
                next.clone(),
                failed.clone(),
                terms.clone(),
                worst_gap.clone(),
            );
            std::thread::spawn(move || {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= first + seeds {
                        break;
                    }
                    let report = run(&SimConfig::new(seed).with_negative(negative));
                    terms.fetch_add(report.terms as u64, Ordering::Relaxed);
                    if let Some(g) = report.judged_gaps.first() {
                        let mut w = worst_gap.lock().unwrap_or_else(|e| e.into_inner());
                        *w = (*w).max(*g);
                    }
                    if verbose {
                        for e in &report.events {
                            println!("{e:?}");
                        }
                    }
                    if !report.violations.is_empty() {
                        for v in &report.violations {
                            println!("seed {seed}: [{}] {}", v.checker, v.detail);
                        }
                        failed.lock().unwrap_or_else(|e| e.into_inner()).push(seed);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    let elapsed = started.elapsed();
    let failed = failed.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let summary = format!(
        "seeds {first}..{} negative={negative:?}: {} with violations, {} terms, worst judged gap {:?}, {:.1} s wall ({:.2} ms/seed, {threads} threads)",
        first + seeds,
        failed.len(),
        terms.load(Ordering::Relaxed),
        *worst_gap.lock().unwrap_or_else(|e| e.into_inner()),
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1000.0 / seeds.max(1) as f64,
    );
    println!("{summary}");
    if let Some(path) = out
        && let Err(e) = std::fs::write(&path, format!("{summary}\n"))
    {
        eprintln!("cannot write {path}: {e}");
    }
    if !failed.is_empty() {
        let mut sorted = failed.clone();
        sorted.sort();
        println!(
            "failing seeds (replay with --seed N --verbose): {:?}",
            &sorted[..sorted.len().min(20)]
        );
    }
    let ok = match negative {
        NegativeControl::None => failed.is_empty(),
        _ => !failed.is_empty(),
    };
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
