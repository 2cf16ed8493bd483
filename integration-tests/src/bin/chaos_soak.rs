//! The long form of the chaos drills: `chaos_soak [rounds=N] [minutes=M]
//! [backends=file,azure,dynamo,gcs,etcd,zookeeper]
//! [scenarios=sigkill,sigstop,partition,stall,throttle,sigterm,lossy]
//! [out=FILE] [dir=DIR]`.
//!
//! Runs N rounds of every scenario on every backend (the backends in parallel, each one's
//! rounds one after another; no new round starts after M minutes, if given), prints progress
//! on stderr, and writes the summary after every round (rounds,
//! violations, failover / handover / recovery min, median and p99 per backend and scenario) to
//! `out` (default `chaos-summary.txt`) and stdout. Exits 1 if any round had a violation.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command-line program reports on its streams"
)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use integration_tests::chaos::BackendKind;
use integration_tests::chaos::drill::{DrillConfig, Scenario, Summary, run_round};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let mut rounds = 3usize;
    let mut stop_at = None;
    let mut backends = BackendKind::ALL.to_vec();
    let mut scenarios = Scenario::ALL.to_vec();
    let mut out = PathBuf::from("chaos-summary.txt");
    let mut dir = std::env::temp_dir().join(integration_tests::unique_name("chaos-soak"));
    for arg in std::env::args().skip(1) {
        let Some((name, value)) = arg.split_once('=') else {
            eprintln!("chaos_soak: argument {arg:?} is not name=value");
            return ExitCode::from(2);
        };
        match name {
            "rounds" => match value.parse() {
                Ok(n) => rounds = n,
                Err(_) => {
                    eprintln!("chaos_soak: rounds={value:?} is not a number");
                    return ExitCode::from(2);
                }
            },
            "minutes" => match value.parse::<f64>() {
                Ok(m) if m > 0.0 => {
                    stop_at = Some(
                        tokio::time::Instant::now() + std::time::Duration::from_secs_f64(m * 60.0),
                    );
                }
                _ => {
                    eprintln!("chaos_soak: minutes={value:?} is not a positive number");
                    return ExitCode::from(2);
                }
            },
            "backends" => backends = value.split(',').filter_map(BackendKind::parse).collect(),
            "scenarios" => scenarios = value.split(',').filter_map(Scenario::parse).collect(),
            "out" => out = PathBuf::from(value),
            "dir" => dir = PathBuf::from(value),
            _ => {
                eprintln!("chaos_soak: unknown argument {name:?}");
                return ExitCode::from(2);
            }
        }
    }
    let candidate_bin = match std::env::current_exe() {
        Ok(me) => me.with_file_name("chaos_candidate"),
        Err(e) => {
            eprintln!("chaos_soak: {e}");
            return ExitCode::FAILURE;
        }
    };
    let summary = Arc::new(Mutex::new(Summary::default()));
    let mut tasks = Vec::new();
    for kind in backends {
        let cfg = DrillConfig {
            candidate_bin: candidate_bin.clone(),
            work_dir: dir.clone(),
            candidates: 3,
            seed: 0x000c_4a05 ^ kind as u64,
        };
        let scenarios = scenarios.clone();
        let summary = summary.clone();
        let out = out.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..rounds {
                for &scenario in scenarios.iter().filter(|s| s.applies_to(kind)) {
                    if stop_at.is_some_and(|t| tokio::time::Instant::now() >= t) {
                        return;
                    }
                    let mut cfg = cfg.clone();
                    cfg.seed = cfg.seed.wrapping_add(round as u64 * 97);
                    let report = run_round(kind, scenario, &cfg).await;
                    match &report {
                        Ok(r) => eprintln!(
                            "{} {} round {}: {} violations, measured {:?} ms, {} terms",
                            kind.name(),
                            scenario.name(),
                            round + 1,
                            r.violations.len(),
                            r.measured_ms.map(|m| m.round()),
                            r.terms
                        ),
                        Err(e) => eprintln!(
                            "{} {} round {}: setup error {e}",
                            kind.name(),
                            scenario.name(),
                            round + 1
                        ),
                    }
                    let text = {
                        let mut summary = summary.lock().unwrap_or_else(|e| e.into_inner());
                        summary.add(kind, scenario, &report);
                        summary.render()
                    };
                    let _ = std::fs::write(&out, text);
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let summary = summary.lock().unwrap_or_else(|e| e.into_inner());
    let text = summary.render();
    println!("{text}");
    if let Err(e) = std::fs::write(&out, &text) {
        eprintln!("chaos_soak: writing {out:?}: {e}");
    }
    if summary.failures() == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
