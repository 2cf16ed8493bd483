//! Shared by the chaos tests: one round of a scenario, asserted clean.
#![allow(clippy::unwrap_used, clippy::panic, clippy::print_stdout, dead_code)]

use std::sync::Arc;

use integration_tests::chaos::BackendKind;
use integration_tests::chaos::drill::{DrillConfig, Scenario, run_round};
use integration_tests::require;

/// Runs one round of `scenario` on `kind` with three candidates and fails on any violation.
pub(crate) async fn drill(kind: BackendKind, scenario: Scenario) {
    if let Some(emulator) = kind.emulator()
        && require(emulator).await.is_none()
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = DrillConfig {
        candidate_bin: env!("CARGO_BIN_EXE_chaos_candidate").into(),
        work_dir: dir.path().to_path_buf(),
        candidates: 3,
        seed: 8,
    };
    let report = run_round(kind, scenario, &cfg).await.unwrap();
    if !report.violations.is_empty() {
        // Keep the logs for the post-mortem.
        let kept = dir.keep();
        panic!(
            "{} {}: {} violation(s) (logs in {}):\n{}",
            kind.name(),
            scenario.name(),
            report.violations.len(),
            kept.display(),
            report.violations.join("\n")
        );
    }
    assert!(
        report.terms >= 2
            || matches!(
                scenario,
                Scenario::Throttle
                    | Scenario::Lossy
                    | Scenario::Late
                    | Scenario::MemberAway
                    // A member's fault ends the term only of a leader whose client talks to it.
                    | Scenario::MemberKill
                    | Scenario::MemberStop
                    | Scenario::MemberPartition
                    | Scenario::RollingRestart
            ),
        "{report:?}"
    );
    if scenario == Scenario::Late {
        assert!(
            report.late_deliveries > 0,
            "the late-delivery fault never fired: {report:?}"
        );
    }
    assert!(report.accepted > 0, "{report:?}");
    println!(
        "{} {}: measured {:?} ms, {} terms, {} accepted, {} fenced, {} step-downs, {} late deliveries",
        kind.name(),
        scenario.name(),
        report.measured_ms,
        report.terms,
        report.accepted,
        report.fenced,
        report.step_downs,
        report.late_deliveries
    );
}

/// `n` rounds of `scenario` on `kind`, one after the other.
pub(crate) async fn rounds(kind: BackendKind, scenario: Scenario, n: usize) {
    assert!(scenario.applies_to(kind), "{scenario:?} on {kind:?}");
    for _ in 0..n {
        drill(kind, scenario).await;
    }
}

/// One round of every scenario that applies to `kind` (those of a cluster's members aside:
/// `chaos_clusters.rs` plays them), `at_once` side by side; `expected` is how many there are,
/// so that a scenario that stops applying is noticed.
pub(crate) async fn every_scenario(kind: BackendKind, expected: usize, at_once: usize) {
    let scenarios: Vec<Scenario> = Scenario::ALL
        .into_iter()
        .filter(|s| s.applies_to(kind) && !Scenario::MEMBERS.contains(s))
        .collect();
    assert_eq!(scenarios.len(), expected, "{scenarios:?}");
    drills_side_by_side(kind, &scenarios, at_once).await;
}

/// Runs one round of each of `scenarios` on `kind`, `at_once` rounds side by side (a round
/// mostly waits out a ttl or two, so they share the machine well), and fails naming each
/// scenario that failed, with its message.
pub(crate) async fn drills_side_by_side(kind: BackendKind, scenarios: &[Scenario], at_once: usize) {
    let gate = Arc::new(tokio::sync::Semaphore::new(at_once));
    let mut rounds = tokio::task::JoinSet::new();
    for &scenario in scenarios {
        let gate = gate.clone();
        rounds.spawn(async move {
            let _turn = gate.acquire_owned().await.unwrap();
            // A task of its own: a round's failure is a panic, caught here.
            let round = tokio::spawn(drill(kind, scenario)).await;
            (scenario, round)
        });
    }
    let mut failed = Vec::new();
    while let Some(done) = rounds.join_next().await {
        let (scenario, round) = done.unwrap();
        if let Err(e) = round {
            let why = if e.is_panic() {
                let payload = e.into_panic();
                payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "a panic".to_owned())
            } else {
                e.to_string()
            };
            failed.push(format!("{}: {why}", scenario.name()));
        }
    }
    assert!(
        failed.is_empty(),
        "{} {} of {} scenario(s) failed:\n{}",
        kind.name(),
        failed.len(),
        scenarios.len(),
        failed.join("\n")
    );
}
