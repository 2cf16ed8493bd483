//! Shared by the chaos tests: one round of a scenario, asserted clean.
#![allow(clippy::unwrap_used, clippy::panic, clippy::print_stdout, dead_code)]

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
