//! What a round measures: the time until the first term after a fault, against the
//! scenario's bound.

use std::time::Duration;

use super::duration_us;
use super::process::{Proc, term_after};

/// The first term after `after` (not by `not_by`); records how long it took in `measured`.
/// A time over `bound` is recorded in `late`.
pub(super) fn expect_term(
    procs: &[Proc],
    after: u64,
    not_by: Option<usize>,
    what: &str,
    bound: Option<Duration>,
    measured: &mut Measured,
) -> Option<(usize, u64, u64)> {
    let found = term_after(procs, after, not_by);
    if let Some((_, _, t)) = found {
        let took = t.saturating_sub(after);
        measured.value = Some(ms(took));
        if let Some(b) = bound
            && took > duration_us(b)
        {
            measured
                .late
                .push(format!("{what} took {:.0} ms, more than {b:?}", ms(took)));
        }
    }
    found
}

/// The failover, handover or recovery time of a round.
#[derive(Debug, Default)]
pub(super) struct Measured {
    /// The time, in milliseconds.
    pub(super) value: Option<f64>,
    /// How it broke the scenario's bound, if it did.
    pub(super) late: Vec<String>,
}

pub(super) fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}
