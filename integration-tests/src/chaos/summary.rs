//! The summary of many rounds: counts, and the spread of the measured times, per backend and
//! scenario.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::BackendKind;
use super::drill::RoundReport;
use super::scenario::Scenario;

/// Rounds of many scenarios, summarised.
#[derive(Debug, Default)]
pub struct Summary {
    rows: BTreeMap<(BackendKind, Scenario), Row>,
}

#[derive(Debug, Default)]
struct Row {
    rounds: usize,
    violations: usize,
    setup_errors: usize,
    measured: Vec<f64>,
    step_downs: usize,
    accepted: usize,
    fenced: usize,
    examples: Vec<String>,
}

impl Summary {
    /// Adds one round (or its setup error).
    pub fn add(
        &mut self,
        kind: BackendKind,
        scenario: Scenario,
        round: &Result<RoundReport, String>,
    ) {
        let row = self.rows.entry((kind, scenario)).or_default();
        row.rounds += 1;
        match round {
            Ok(r) => {
                row.violations += r.violations.len();
                if let Some(m) = r.measured_ms {
                    row.measured.push(m);
                }
                row.step_downs += r.step_downs;
                row.accepted += r.accepted;
                row.fenced += r.fenced;
                for v in r.violations.iter().take(2) {
                    if row.examples.len() < 6 {
                        row.examples.push(format!("{}: {v}", r.dir.display()));
                    }
                }
            }
            Err(e) => {
                row.setup_errors += 1;
                if row.examples.len() < 6 {
                    row.examples.push(format!("setup: {e}"));
                }
            }
        }
    }

    /// Total violations and setup errors.
    pub fn failures(&self) -> usize {
        self.rows
            .values()
            .map(|r| r.violations + r.setup_errors)
            .sum()
    }

    /// A table: rounds, violations, and min / median / p99 of the measured time per backend
    /// and scenario, then example violations.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<7} {:<10} {:>6} {:>10} {:>6} {:>9} {:>9} {:>9} {:>10} {:>9} {:>7}",
            "backend",
            "scenario",
            "rounds",
            "violations",
            "setup",
            "min_ms",
            "median_ms",
            "p99_ms",
            "stepdowns",
            "accepted",
            "fenced"
        );
        for ((kind, scenario), row) in &self.rows {
            let mut m = row.measured.clone();
            m.sort_by(f64::total_cmp);
            let pick = |q: f64| -> String {
                if m.is_empty() {
                    "-".to_owned()
                } else {
                    let i = ((m.len() as f64 - 1.0) * q).round() as usize;
                    format!("{:.0}", m[i.min(m.len() - 1)])
                }
            };
            let _ = writeln!(
                out,
                "{:<7} {:<10} {:>6} {:>10} {:>6} {:>9} {:>9} {:>9} {:>10} {:>9} {:>7}",
                kind.name(),
                scenario.name(),
                row.rounds,
                row.violations,
                row.setup_errors,
                pick(0.0),
                pick(0.5),
                pick(0.99),
                row.step_downs,
                row.accepted,
                row.fenced
            );
        }
        for ((kind, scenario), row) in &self.rows {
            for e in &row.examples {
                let _ = writeln!(out, "{} {}: {e}", kind.name(), scenario.name());
            }
        }
        out
    }
}
