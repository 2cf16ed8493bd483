//! A small seedable generator (SplitMix64) for jitter, nonces and simulation: the suite's one
//! source of randomness (the workspace's `clippy.toml` bans the others).
//!
//! Not for secrets: it only spreads retries and makes write nonces unique. Backends and test
//! harnesses reach it as [`backend::Rng`](crate::backend::Rng).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// SplitMix64's increment: the odd constant nearest `2^64 / phi`.
const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's finalizer: a bijection of `u64` that spreads every input bit over the output.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// SplitMix64: fast, seedable, good enough to spread retries.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator that gives the same sequence for the same seed.
    pub fn seeded(seed: u64) -> Self {
        Self(seed)
    }

    /// Seeded from the operating system's randomness (through `RandomState`), the process id
    /// and a process-wide counter, so that two generators never start alike.
    #[allow(
        clippy::disallowed_methods,
        reason = "the one place that takes the operating system's randomness"
    )]
    pub fn from_entropy() -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let mut h = RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        h.write_u32(std::process::id());
        Self(h.finish())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN_GAMMA);
        mix(self.0)
    }

    /// Uniform in `[0, 1)`.
    #[cfg_attr(
        not(any(feature = "simulation", feature = "conformance")),
        allow(dead_code)
    )]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[lo, hi]` (`lo` if `hi <= lo`).
    pub fn range_u64(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        let span = hi - lo;
        lo + self.next_u64() % (span.saturating_add(1)).max(1)
    }

    /// Uniform in `[lo, hi]`, to the microsecond.
    pub fn duration(&mut self, lo: Duration, hi: Duration) -> Duration {
        let lo_us = u64::try_from(lo.as_micros()).unwrap_or(u64::MAX);
        let hi_us = u64::try_from(hi.as_micros()).unwrap_or(u64::MAX);
        Duration::from_micros(self.range_u64(lo_us, hi_us))
    }

    #[cfg_attr(
        not(any(feature = "simulation", feature = "conformance")),
        allow(dead_code)
    )]
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.next_f64() < p
    }
}

/// FNV-1a, 64 bits: stable across processes and versions (sharded member keys and a
/// quorum's member set fingerprint depend on it).
pub(crate) fn stable_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_is_reproducible_and_ranges_hold() {
        let mut a = Rng::seeded(42);
        let mut b = Rng::seeded(42);
        for _ in 0..1000 {
            assert_eq!(a.next_u64(), b.next_u64());
            let x = a.range_u64(10, 20);
            b.range_u64(10, 20);
            assert!((10..=20).contains(&x));
            let f = a.next_f64();
            b.next_f64();
            assert!((0.0..1.0).contains(&f));
        }
        assert_ne!(
            Rng::from_entropy().next_u64(),
            Rng::from_entropy().next_u64()
        );
    }
}
