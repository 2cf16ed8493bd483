//! Runs the deterministic simulation over many seeds, or replays one.
//!
//! ```text
//! cargo run --release -p leader-core --features simulation --example simulate -- --seeds 100000
//! cargo run --release -p leader-core --features simulation --example simulate -- --seed 4242 --verbose
//! cargo run --release -p leader-core --features simulation --example simulate -- --seeds 200 --negative ignore-deadline
//! cargo run --release -p leader-core --features simulation --example simulate -- --seeds 1000 --hashes h.txt
//! ```
//!
//! `--hashes FILE` writes one line per seed, `seed hash`, in seed order: the hash of the
//! seed's whole history (two runs of one build must write the same file). `--controls N`
//! also runs every negative control on the first N seeds. `--out FILE` appends the summary
//! lines to FILE.
//!
//! Exits 1 if any seed broke an invariant (or, with `--negative` or `--controls`, if a planted
//! bug was caught by no seed).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leader_core::simulation::{Event, NegativeControl, SimConfig, liveness_bound, run};

fn usage() -> ExitCode {
    eprintln!(
        "usage: simulate [--seeds N] [--first S] [--seed S] [--verbose] [--dump-failing]\n\
         \x20               [--threads T] [--negative none|ignore-deadline|drift|unfenced|lazy-followers|frozen-replica]\n\
         \x20               [--controls N] [--hashes FILE] [--out FILE]"
    );
    ExitCode::from(64)
}

fn name(n: NegativeControl) -> &'static str {
    match n {
        NegativeControl::None => "none",
        NegativeControl::IgnoreDeadline => "ignore-deadline",
        NegativeControl::ExcessiveDrift => "drift",
        NegativeControl::UnfencedResource => "unfenced",
        NegativeControl::LazyFollowers => "lazy-followers",
        NegativeControl::FrozenReplica => "frozen-replica",
    }
}

struct Options {
    first: u64,
    seeds: u64,
    threads: usize,
    verbose: bool,
    dump_failing: bool,
}

/// What many seeds gave.
#[derive(Default)]
struct Totals {
    failed: Vec<u64>,
    /// Seeds whose violations came from each checker.
    by_checker: BTreeMap<&'static str, u64>,
    terms: u64,
    gaps: u64,
    healthy_start: u64,
    long_gaps: u64,
    long_healthy_start: u64,
    worst_gap: Duration,
    worst_stretch: Duration,
    late_lease: u64,
    late_fenced: u64,
    late_acquires: u64,
    paused: u64,
    paused_then_cut: u64,
    hashes: BTreeMap<u64, u64>,
}

fn run_many(opts: &Options, negative: NegativeControl) -> (Totals, Duration) {
    let next = Arc::new(AtomicU64::new(opts.first));
    let totals = Arc::new(Mutex::new(Totals::default()));
    let ttl = SimConfig::new(0).timing.ttl;
    #[allow(clippy::disallowed_methods)] // measuring the program's own wall time
    let started = std::time::Instant::now();
    let (first, seeds, verbose, dump) = (opts.first, opts.seeds, opts.verbose, opts.dump_failing);
    let workers: Vec<_> = (0..opts.threads.max(1))
        .map(|_| {
            let (next, totals) = (next.clone(), totals.clone());
            std::thread::spawn(move || {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= first + seeds {
                        break;
                    }
                    let report = run(&SimConfig::new(seed).with_negative(negative));
                    let (late_lease, late_fenced) = report.late_writes();
                    let mut out = String::new();
                    if verbose || (dump && !report.violations.is_empty()) {
                        for e in &report.events {
                            out.push_str(&format!("seed {seed}: {e:?}\n"));
                        }
                    }
                    for v in &report.violations {
                        out.push_str(&format!("seed {seed}: [{}] {}\n", v.checker, v.detail));
                    }
                    let mut t = totals.lock().unwrap_or_else(|e| e.into_inner());
                    print!("{out}");
                    t.terms += report.terms as u64;
                    t.gaps += report.gaps.len() as u64;
                    t.healthy_start +=
                        report.gaps.iter().filter(|g| g.healthy_start).count() as u64;
                    t.long_gaps += report.gaps.iter().filter(|g| g.len() > ttl).count() as u64;
                    t.long_healthy_start += report
                        .gaps
                        .iter()
                        .filter(|g| g.len() > ttl && g.healthy_start)
                        .count() as u64;
                    for g in &report.gaps {
                        t.worst_gap = t.worst_gap.max(g.len());
                        t.worst_stretch = t.worst_stretch.max(g.longest_healthy);
                    }
                    t.late_lease += late_lease as u64;
                    t.late_fenced += late_fenced as u64;
                    t.late_acquires += report.late_acquires() as u64;
                    for w in report.events.windows(2) {
                        if let Event::PausedInFlight { cand, .. } = w[0] {
                            t.paused += 1;
                            if matches!(w[1], Event::Partitioned { cand: c, .. } if c == cand) {
                                t.paused_then_cut += 1;
                            }
                        }
                    }
                    t.hashes.insert(seed, report.history_hash());
                    if !report.violations.is_empty() {
                        t.failed.push(seed);
                        let mut checkers: Vec<&'static str> =
                            report.violations.iter().map(|v| v.checker).collect();
                        checkers.dedup();
                        for c in checkers {
                            *t.by_checker.entry(c).or_default() += 1;
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    let elapsed = started.elapsed();
    let mut t = std::mem::take(&mut *totals.lock().unwrap_or_else(|e| e.into_inner()));
    t.failed.sort();
    (t, elapsed)
}

fn summary(opts: &Options, negative: NegativeControl, t: &Totals, elapsed: Duration) -> String {
    format!(
        "seeds {}..{} negative={}: {} with violations {:?}, {} terms, {} gaps judged ({} starting healthy; {} longer than the ttl, {} of them starting healthy), longest gap {:?}, longest healthy stretch in a gap {:?}, late deliveries {} lease ({} of them acquires that began a term) + {} fenced, {} pauses with an answer in flight ({} then cut off), {:.1} s wall ({:.2} ms/seed, {} threads)",
        opts.first,
        opts.first + opts.seeds,
        name(negative),
        t.failed.len(),
        t.by_checker,
        t.terms,
        t.gaps,
        t.healthy_start,
        t.long_gaps,
        t.long_healthy_start,
        t.worst_gap,
        t.worst_stretch,
        t.late_lease,
        t.late_acquires,
        t.late_fenced,
        t.paused,
        t.paused_then_cut,
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1000.0 / opts.seeds.max(1) as f64,
        opts.threads,
    )
}

fn main() -> ExitCode {
    let mut opts = Options {
        first: 0,
        seeds: 1000,
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        verbose: false,
        dump_failing: false,
    };
    let mut negative = NegativeControl::None;
    let mut controls: Option<u64> = None;
    let mut out: Option<String> = None;
    let mut hashes: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next();
        match arg.as_str() {
            "--seeds" => match value().and_then(|v| v.parse().ok()) {
                Some(n) => opts.seeds = n,
                None => return usage(),
            },
            "--first" => match value().and_then(|v| v.parse().ok()) {
                Some(n) => opts.first = n,
                None => return usage(),
            },
            "--seed" => match value().and_then(|v| v.parse().ok()) {
                Some(n) => {
                    opts.first = n;
                    opts.seeds = 1;
                }
                None => return usage(),
            },
            "--threads" => match value().and_then(|v| v.parse().ok()) {
                Some(n) => opts.threads = n,
                None => return usage(),
            },
            "--controls" => match value().and_then(|v| v.parse().ok()) {
                Some(n) => controls = Some(n),
                None => return usage(),
            },
            "--negative" => {
                let v = value();
                match std::iter::once(NegativeControl::None)
                    .chain(NegativeControl::ALL)
                    .find(|n| Some(name(*n)) == v.as_deref())
                {
                    Some(n) => negative = n,
                    None => return usage(),
                }
            }
            "--out" => out = value(),
            "--hashes" => hashes = value(),
            "--verbose" => opts.verbose = true,
            "--dump-failing" => opts.dump_failing = true,
            _ => return usage(),
        }
    }

    let mut lines = Vec::new();
    let (totals, elapsed) = run_many(&opts, negative);
    let line = summary(&opts, negative, &totals, elapsed);
    println!("{line}");
    lines.push(line);
    if !totals.failed.is_empty() {
        println!(
            "failing seeds (replay with --seed N --verbose): {:?}",
            &totals.failed[..totals.failed.len().min(20)]
        );
    }
    let mut ok = match negative {
        NegativeControl::None => totals.failed.is_empty(),
        _ => !totals.failed.is_empty(),
    };
    if let Some(path) = hashes {
        let text: String = totals
            .hashes
            .iter()
            .map(|(seed, h)| format!("{seed} {h:016x}\n"))
            .collect();
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("cannot write {path}: {e}");
            ok = false;
        }
    }
    if let Some(n) = controls {
        let control_opts = Options {
            seeds: n,
            verbose: false,
            dump_failing: false,
            ..opts
        };
        for control in NegativeControl::ALL {
            let (t, elapsed) = run_many(&control_opts, control);
            let line = summary(&control_opts, control, &t, elapsed);
            println!("{line}");
            lines.push(line);
            ok &= !t.failed.is_empty();
        }
    }
    let bound = liveness_bound(&SimConfig::new(0));
    lines.push(format!("# liveness bound on a healthy stretch: {bound:?}"));
    if let Some(path) = out {
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| lines.iter().try_for_each(|l| writeln!(f, "{l}")));
        if let Err(e) = written {
            eprintln!("cannot write {path}: {e}");
            ok = false;
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
