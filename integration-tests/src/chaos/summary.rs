//! The summary of many rounds: counts, and the spread of the measured times, per backend
//! (failover, recovery and handover pooled over the scenarios that measure them) and per
//! backend and scenario.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use super::BackendKind;
use super::scenario::Scenario;

/// The outcome of one round.
#[derive(Clone, Debug, Serialize)]
pub struct RoundReport {
    /// The backend.
    pub backend: BackendKind,
    /// The scenario.
    pub scenario: Scenario,
    /// Every violated invariant (empty: the round passed).
    pub violations: Vec<String>,
    /// Failover (kill, stop, partition), handover (sigterm) or recovery (stall) time.
    pub measured_ms: Option<f64>,
    /// Terms seen.
    pub terms: usize,
    /// Writes acknowledged.
    pub accepted: usize,
    /// Writes rejected for a stale token.
    pub fenced: usize,
    /// Writes failed or of unknown outcome.
    pub failed: usize,
    /// Step-downs while the fault was on (throttle: spurious ones).
    pub step_downs: usize,
    /// Terms that ended for a reason other than the drive's SIGTERM (in the whole round).
    pub ended_unasked: usize,
    /// Requests the proxies delivered late (applied after their sender gave up).
    pub late_deliveries: u64,
    /// The round's directory (logs).
    pub dir: PathBuf,
}

/// What a scenario's measured time is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Measure {
    /// A new term after the leader was killed, stopped or partitioned.
    Failover,
    /// A leader back after the whole store was away (stall, restart).
    Recovery,
    /// A new term after the leader was asked to stop (SIGTERM).
    Handover,
    /// The longest time without a leader's acknowledged write, from a member's fault until
    /// the cluster is whole and led again.
    Unled,
    /// Nothing is measured: a fault that needs no new term (throttle, lossy, late), where
    /// every step-down but a SIGTERM's is spurious.
    None,
}

impl Measure {
    fn of(scenario: Scenario) -> Self {
        match scenario {
            Scenario::Kill | Scenario::Stop | Scenario::Partition => Measure::Failover,
            Scenario::Stall | Scenario::Restart | Scenario::RestartEmpty => Measure::Recovery,
            Scenario::Term => Measure::Handover,
            Scenario::Throttle | Scenario::Lossy | Scenario::Late | Scenario::MemberAway => {
                Measure::None
            }
            Scenario::MemberKill
            | Scenario::MemberStop
            | Scenario::MemberPartition
            | Scenario::LeaderMinority
            | Scenario::FollowerMinority
            | Scenario::RollingRestart => Measure::Unled,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Measure::Failover => "failover",
            Measure::Recovery => "recovery",
            Measure::Handover => "handover",
            Measure::Unled => "unled",
            Measure::None => "-",
        }
    }
}

/// Rounds of many scenarios, summarised.
#[derive(Debug, Default)]
pub struct Summary {
    rows: BTreeMap<(BackendKind, Scenario), Row>,
    /// Per backend: the start of its first round and the end of its last one, in seconds
    /// since the soak began.
    spans: BTreeMap<BackendKind, (f64, f64)>,
}

#[derive(Debug, Default)]
struct Row {
    rounds: usize,
    violations: usize,
    /// Violations that are a broken time bound (failover, handover or recovery too slow):
    /// what an overloaded machine shows first.
    slow: usize,
    setup_errors: usize,
    measured: Vec<f64>,
    step_downs: usize,
    /// Step-downs other than a SIGTERM's in rounds whose fault needs none (throttle, lossy,
    /// late); `None` for the other scenarios.
    spurious: Option<usize>,
    late_deliveries: u64,
    accepted: usize,
    fenced: usize,
    failed: usize,
    /// The rounds' wall time, in seconds.
    seconds: f64,
    examples: Vec<String>,
}

impl Summary {
    /// Adds one round (or its setup error) that ran from `start` to `end` (both measured from
    /// the same origin, e.g. the start of the soak).
    pub fn add(
        &mut self,
        kind: BackendKind,
        scenario: Scenario,
        round: &Result<RoundReport, String>,
        start: Duration,
        end: Duration,
    ) {
        let (start, end) = (start.as_secs_f64(), end.as_secs_f64());
        let s = self.spans.entry(kind).or_insert((start, end));
        s.0 = s.0.min(start);
        s.1 = s.1.max(end);
        let row = self.rows.entry((kind, scenario)).or_default();
        row.rounds += 1;
        row.seconds += (end - start).max(0.0);
        match round {
            Ok(r) => {
                row.violations += r.violations.len();
                row.slow += r.violations.iter().filter(|v| is_slow(v)).count();
                if let Some(m) = r.measured_ms {
                    row.measured.push(m);
                }
                row.step_downs += r.step_downs;
                if Measure::of(scenario) == Measure::None {
                    *row.spurious.get_or_insert(0) += r.ended_unasked;
                }
                row.late_deliveries += r.late_deliveries;
                row.accepted += r.accepted;
                row.fenced += r.fenced;
                row.failed += r.failed;
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

    /// Rounds summarised so far (setup errors included).
    pub fn rounds(&self) -> usize {
        self.rows.values().map(|r| r.rounds).sum()
    }

    /// Rounds judged so far: those whose setup did not fail.
    pub fn judged(&self) -> usize {
        self.rows.values().map(|r| r.rounds - r.setup_errors).sum()
    }

    /// Two tables and the example violations:
    ///
    /// - per backend: rounds, violations (and how many of them are a broken time bound),
    ///   setup errors, min / median / p99 of failover (SIGKILL, SIGSTOP, partition),
    ///   recovery (stall, restart) and handover (SIGTERM), spurious step-downs, late
    ///   deliveries, and rounds per hour (over the backend's span: first round's start to
    ///   last round's end);
    /// - per backend and scenario: the same, with what the scenario measures, step-downs
    ///   while its fault was on, fenced-write outcomes and the mean round length.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "Per backend (times in ms: min / median / p99)");
        let mut t = Table::new(
            1,
            &[
                "backend",
                "rounds",
                "violations",
                "slow",
                "setup",
                "failover",
                "recovery",
                "handover",
                "spurious_stepdowns",
                "late_deliveries",
                "rounds/h",
            ],
        );
        for (&kind, &(start, end)) in &self.spans {
            let rows: Vec<(Scenario, &Row)> = self
                .rows
                .iter()
                .filter(|((k, _), _)| *k == kind)
                .map(|((_, s), r)| (*s, r))
                .collect();
            let sum = |f: fn(&Row) -> usize| rows.iter().map(|(_, r)| f(r)).sum::<usize>();
            let pooled = |m: Measure| {
                let mut v: Vec<f64> = rows
                    .iter()
                    .filter(|(s, _)| Measure::of(*s) == m)
                    .flat_map(|(_, r)| r.measured.iter().copied())
                    .collect();
                spread(&mut v)
            };
            let spurious: Option<usize> = rows
                .iter()
                .filter_map(|(_, r)| r.spurious)
                .reduce(|a, b| a + b);
            let rounds = sum(|r| r.rounds);
            let hours = (end - start) / 3600.0;
            t.row(vec![
                kind.name().to_owned(),
                rounds.to_string(),
                sum(|r| r.violations).to_string(),
                sum(|r| r.slow).to_string(),
                sum(|r| r.setup_errors).to_string(),
                pooled(Measure::Failover),
                pooled(Measure::Recovery),
                pooled(Measure::Handover),
                spurious.map_or_else(|| "-".to_owned(), |n| n.to_string()),
                rows.iter()
                    .map(|(_, r)| r.late_deliveries)
                    .sum::<u64>()
                    .to_string(),
                if hours > 0.0 {
                    format!("{:.0}", rounds as f64 / hours)
                } else {
                    "-".to_owned()
                },
            ]);
        }
        out.push_str(&t.render());
        let _ = writeln!(out);
        let _ = writeln!(out, "Per backend and scenario (times in ms)");
        let mut t = Table::new(
            3,
            &[
                "backend",
                "scenario",
                "measures",
                "rounds",
                "violations",
                "slow",
                "setup",
                "min",
                "median",
                "p99",
                "stepdowns",
                "spurious",
                "late_deliveries",
                "accepted",
                "fenced",
                "failed",
                "mean_round_s",
            ],
        );
        for ((kind, scenario), row) in &self.rows {
            let [min, median, p99] = min_median_p99(&mut row.measured.clone());
            t.row(vec![
                kind.name().to_owned(),
                scenario.name().to_owned(),
                Measure::of(*scenario).label().to_owned(),
                row.rounds.to_string(),
                row.violations.to_string(),
                row.slow.to_string(),
                row.setup_errors.to_string(),
                min,
                median,
                p99,
                row.step_downs.to_string(),
                row.spurious
                    .map_or_else(|| "-".to_owned(), |n| n.to_string()),
                row.late_deliveries.to_string(),
                row.accepted.to_string(),
                row.fenced.to_string(),
                row.failed.to_string(),
                format!("{:.1}", row.seconds / row.rounds.max(1) as f64),
            ]);
        }
        out.push_str(&t.render());
        let examples: Vec<String> = self
            .rows
            .iter()
            .flat_map(|((kind, scenario), row)| {
                row.examples
                    .iter()
                    .map(move |e| format!("{} {}: {e}", kind.name(), scenario.name()))
            })
            .collect();
        if !examples.is_empty() {
            let _ = writeln!(out);
            let _ = writeln!(out, "Violations and setup errors (at most 6 per row)");
            for e in examples {
                let _ = writeln!(out, "{e}");
            }
        }
        out
    }
}

/// Whether a violation is a broken time bound (see the driver's `expect_term`).
fn is_slow(violation: &str) -> bool {
    violation.contains(" took ") && violation.contains(" ms, more than ")
}

/// `q` of the sorted `m`, in whole ms (nearest rank), or `-`.
fn quantile(m: &[f64], q: f64) -> String {
    if m.is_empty() {
        return "-".to_owned();
    }
    let i = ((m.len() as f64 - 1.0) * q).round() as usize;
    format!("{:.0}", m[i.min(m.len() - 1)])
}

/// Min, median and p99 of `m` (sorted here), each `-` if it is empty.
fn min_median_p99(m: &mut [f64]) -> [String; 3] {
    m.sort_by(f64::total_cmp);
    [0.0, 0.5, 0.99].map(|q| quantile(m, q))
}

/// `min / median / p99` of `m`, or `-`.
fn spread(m: &mut [f64]) -> String {
    if m.is_empty() {
        return "-".to_owned();
    }
    min_median_p99(m).join(" / ")
}

/// A text table: the first `left` columns left-aligned, the others right-aligned, each as
/// wide as its widest cell.
struct Table {
    left: usize,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(left: usize, header: &[&str]) -> Self {
        Self {
            left,
            rows: vec![header.iter().map(|h| (*h).to_owned()).collect()],
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(|s| s.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                let w = widths.get(c).copied().unwrap_or(0);
                let gap = if c == 0 { "" } else { "  " };
                if c < self.left {
                    let _ = write!(line, "{gap}{cell:<w$}");
                } else {
                    let _ = write!(line, "{gap}{cell:>w$}");
                }
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_pick_the_nearest_rank() {
        let m: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&m, 0.0), "1");
        assert_eq!(quantile(&m, 0.5), "51");
        assert_eq!(quantile(&m, 0.99), "99");
        assert_eq!(quantile(&[], 0.5), "-");
        assert_eq!(spread(&mut [3.0, 1.0, 2.0]), "1 / 2 / 3");
    }

    #[test]
    fn only_broken_bounds_are_slow() {
        assert!(is_slow(
            "failover after SIGKILL took 3602 ms, more than 3.4s"
        ));
        assert!(!is_slow("c1 wrote with its old token 3 after SIGCONT"));
    }
}
