//! Suspend detection: a term must not outlive a suspended and resumed host.
//!
//! Deadlines are scheduled on tokio's clock (so that tests run with paused time), which on
//! Linux is `CLOCK_MONOTONIC` and stands still while the machine is suspended. An [`Anchor`],
//! taken before a write is sent, measures how long the host has been suspended since: the time
//! `CLOCK_BOOTTIME` (which counts suspend) advanced beyond the real monotonic clock. A term's
//! effective deadline is its deadline minus that. Both clocks are real (not tokio's), so paused
//! time in tests neither hides nor invents a suspend.

#![allow(clippy::disallowed_methods)] // real clocks on purpose: see the module docs

use std::time::Duration;

/// Suspends shorter than this are not reported: the two clocks are read one after the other,
/// and the margin covers far more than this.
const TOLERANCE: Duration = Duration::from_millis(100);

/// Both real clocks at one instant (taken before a write is sent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Anchor {
    boot: Option<Duration>,
    real: std::time::Instant,
}

impl Anchor {
    /// Now.
    pub(crate) fn now() -> Self {
        Self {
            boot: boottime(),
            real: std::time::Instant::now(),
        }
    }

    /// How long the host has been suspended since this anchor (zero where the host has no
    /// suspend-counting clock, and for suspends under 100 ms).
    pub(crate) fn suspended(&self) -> Duration {
        let (Some(then), Some(now)) = (self.boot, boottime()) else {
            return Duration::ZERO;
        };
        let suspended = now.saturating_sub(then).saturating_sub(self.real.elapsed());
        if suspended < TOLERANCE {
            Duration::ZERO
        } else {
            suspended
        }
    }

    /// An anchor as if taken `suspended` before a suspend of that length (for tests).
    #[cfg(test)]
    pub(crate) fn before_suspend_of(suspended: Duration) -> Self {
        let now = Self::now();
        Self {
            boot: now.boot.map(|b| b.saturating_sub(suspended)),
            real: now.real,
        }
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn boottime() -> Option<Duration> {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .ok()
        .map(Duration::from)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn boottime() -> Option<Duration> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_suspend_reads_as_zero_and_a_suspend_reads_as_its_length() {
        assert_eq!(Anchor::now().suspended(), Duration::ZERO);
        let a = Anchor::before_suspend_of(Duration::from_secs(30));
        let s = a.suspended();
        assert!(
            // The two clocks are read nanoseconds apart: within a millisecond of 30 s.
            s > Duration::from_millis(29_999) && s < Duration::from_secs(31),
            "{s:?}"
        );
        assert_eq!(
            Anchor::before_suspend_of(Duration::from_millis(20)).suspended(),
            Duration::ZERO
        );
    }
}
