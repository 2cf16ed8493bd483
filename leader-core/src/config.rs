//! Timing settings and their validation.

use std::time::Duration;

use crate::error::ConfigError;

/// The timing of a lease, per the protocol's timing rules (`docs/protocol.md`). Every duration
/// is measured on the local monotonic clock.
///
/// Build it with [`Timing::from_ttl`], which derives every other setting from the lease
/// duration, then adjust fields and call [`Timing::validate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Timing {
    /// How long a lease lasts after the holder's last successful write.
    pub ttl: Duration,
    /// How often the leader renews (default [`Timing::default_renew_every`]: `ttl / 2`, or
    /// less where that would leave room for fewer than three failed renews before the
    /// deadline).
    pub renew_every: Duration,
    /// How long a follower waits at most between attempts while the store fails: the cap of
    /// its jittered backoff (default `ttl / 5`).
    pub retry_every: Duration,
    /// How often a follower reads the record while the store answers (default
    /// [`Timing::DEFAULT_POLL_EVERY`], at most `ttl / 5`). Each wait is drawn from
    /// `[poll_every, 1.1 x poll_every]`, the first of a campaign from
    /// `[0, 1.1 x poll_every]`, so that followers do not poll in lockstep. A graceful
    /// release is seen within one poll; a store that tells of changes (the file and memory
    /// stores) wakes the follower sooner, and the poll is the safety net.
    pub poll_every: Duration,
    /// How long before its lease could expire a leader stops acting (default the larger of
    /// `ttl / 10` and `2 x request_timeout`).
    pub margin: Duration,
    /// The limit on each store request (default the smaller of `ttl / 10` and 2 s).
    pub request_timeout: Duration,
}

impl Timing {
    /// The default lease duration: 15 s, the shortest lease Azure grants.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(15);
    /// The longest default request timeout.
    pub const MAX_DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
    /// The default follower poll period, for a ttl of 2.5 s or more: a graceful handover takes
    /// about half of it on average. Measured in `results/bench.md`: on DynamoDB a waiting
    /// follower then costs about a fifth of what a follower of the `dynamodb-lease` crate
    /// costs (eventually consistent reads at half a read unit against failing conditional
    /// writes at a write unit each, 5 times the price).
    pub const DEFAULT_POLL_EVERY: Duration = Duration::from_millis(500);

    /// Every setting derived from `ttl` by the defaults above.
    pub fn from_ttl(ttl: Duration) -> Self {
        let request_timeout = (ttl / 10).min(Self::MAX_DEFAULT_REQUEST_TIMEOUT);
        let margin = (ttl / 10).max(request_timeout * 2);
        Self {
            ttl,
            renew_every: Self::default_renew_every(ttl, margin, request_timeout),
            retry_every: ttl / 5,
            poll_every: Self::DEFAULT_POLL_EVERY.min(ttl / 5),
            margin,
            request_timeout,
        }
    }

    /// The renew period the rules need, and no shorter: as long as possible while a renew
    /// that fails still leaves time for three more attempts (each up to a request timeout)
    /// before the deadline, and at most `ttl / 2`:
    /// `min(ttl / 2, ttl - margin - 3 x request_timeout)`.
    ///
    /// A term lasts `ttl - margin` after the send of its last successful renew; a renew sent
    /// `renew_every` after that one has `ttl - margin - renew_every` left to succeed. For the
    /// default ttl of 15 s (margin 3 s, request timeout 1.5 s): `min(7.5, 15 - 3 - 4.5)` =
    /// 7.5 s, so 480 renews an hour, and a store outage of up to 4.5 s costs no term.
    /// (Renewing every `ttl / 3` would cost 720 an hour for 7 s of outage tolerance; raise
    /// the ttl, or set `renew_every`, for more.) Never below a tenth of the ttl.
    pub fn default_renew_every(
        ttl: Duration,
        margin: Duration,
        request_timeout: Duration,
    ) -> Duration {
        ttl.saturating_sub(margin)
            .saturating_sub(request_timeout.saturating_mul(3))
            .min(ttl / 2)
            .max(ttl / 10)
    }

    /// [`Timing::from_ttl`] with the settings given in `set` in place of the defaults. A
    /// request timeout given without a margin moves the default margin to the larger of
    /// `ttl / 10` and twice that timeout; the default renew period follows the margin and
    /// request timeout in force ([`Timing::default_renew_every`]).
    pub fn resolve(ttl: Duration, set: &TimingOverrides) -> Self {
        let mut t = Self::from_ttl(ttl);
        if let Some(d) = set.request_timeout {
            t.request_timeout = d;
            t.margin = (ttl / 10).max(d.saturating_mul(2));
        }
        if let Some(d) = set.margin {
            t.margin = d;
        }
        t.renew_every = Self::default_renew_every(ttl, t.margin, t.request_timeout);
        for (value, field) in [
            (set.renew_every, &mut t.renew_every),
            (set.retry_every, &mut t.retry_every),
            (set.poll_every, &mut t.poll_every),
        ] {
            if let Some(d) = value {
                *field = d;
            }
        }
        t
    }

    /// Checks the timing rules; the first violated rule is returned.
    ///
    /// # Errors
    /// - [`ConfigError::ZeroDuration`] if any duration is zero;
    /// - [`ConfigError::MarginTooSmall`] if `margin < 2 x request_timeout`;
    /// - [`ConfigError::NoTimeToRenew`] if `renew_every + request_timeout + margin >= ttl`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, d) in [
            ("ttl", self.ttl),
            ("renew_every", self.renew_every),
            ("retry_every", self.retry_every),
            ("poll_every", self.poll_every),
            ("margin", self.margin),
            ("request_timeout", self.request_timeout),
        ] {
            if d.is_zero() {
                return Err(ConfigError::ZeroDuration { field });
            }
        }
        if self.margin < self.request_timeout.saturating_mul(2) {
            return Err(ConfigError::MarginTooSmall {
                margin: self.margin,
                request_timeout: self.request_timeout,
            });
        }
        if self.renew_every + self.request_timeout + self.margin >= self.ttl {
            return Err(ConfigError::NoTimeToRenew {
                ttl: self.ttl,
                renew_every: self.renew_every,
                request_timeout: self.request_timeout,
                margin: self.margin,
            });
        }
        Ok(())
    }

    /// How long after the last successful write was sent the leader may act: `ttl - margin`.
    pub fn term_validity(&self) -> Duration {
        self.ttl.saturating_sub(self.margin)
    }
}

/// The settings of a [`Timing`] given explicitly, for [`Timing::resolve`]; `None` takes the
/// default derived from ttl.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TimingOverrides {
    /// See [`Timing::renew_every`].
    pub renew_every: Option<Duration>,
    /// See [`Timing::retry_every`].
    pub retry_every: Option<Duration>,
    /// See [`Timing::poll_every`].
    pub poll_every: Option<Duration>,
    /// See [`Timing::margin`].
    pub margin: Option<Duration>,
    /// See [`Timing::request_timeout`].
    pub request_timeout: Option<Duration>,
}

impl Default for Timing {
    fn default() -> Self {
        Self::from_ttl(Self::DEFAULT_TTL)
    }
}

/// Converts durations of a candidate's own clock into durations of the runtime's clock.
///
/// A candidate whose clock runs at `rate` (1.0 = true time) measures `d` as `d / rate` of real
/// time. Only the simulation sets a rate other than 1.0, to check that `margin` covers drift.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClockRate(pub(crate) f64);

impl ClockRate {
    pub(crate) fn real(self, d: Duration) -> Duration {
        if self.0 == 1.0 { d } else { d.div_f64(self.0) }
    }
}

/// The timing setters of a builder with fields `ttl: Duration` and `set: TimingOverrides`:
/// written once for every builder of the crate.
macro_rules! timing_setters {
    ($what:literal) => {
        #[doc = concat!("The lease duration of ", $what, " (default 15 s).")]
        pub fn ttl(mut self, ttl: std::time::Duration) -> Self {
            self.ttl = ttl;
            self
        }

        /// How often the lease is renewed (default: see [`Timing::from_ttl`]).
        pub fn renew_every(mut self, d: std::time::Duration) -> Self {
            self.set.renew_every = Some(d);
            self
        }

        /// How long to wait at most between attempts while the store fails (default
        /// `ttl / 5`).
        pub fn retry_every(mut self, d: std::time::Duration) -> Self {
            self.set.retry_every = Some(d);
            self
        }

        /// How often waiting instances read the records they watch (default 500 ms, at most
        /// `ttl / 5`); see [`Timing::poll_every`].
        pub fn poll_every(mut self, d: std::time::Duration) -> Self {
            self.set.poll_every = Some(d);
            self
        }

        /// How long before its lease could expire the holder stops acting (default the larger
        /// of `ttl / 10` and `2 x request_timeout`).
        pub fn margin(mut self, d: std::time::Duration) -> Self {
            self.set.margin = Some(d);
            self
        }

        /// The limit on each store request (default the smaller of `ttl / 10` and 2 s).
        pub fn request_timeout(mut self, d: std::time::Duration) -> Self {
            self.set.request_timeout = Some(d);
            self
        }

        /// Sets every duration at once.
        pub fn timing(mut self, timing: Timing) -> Self {
            self.ttl = timing.ttl;
            self.set = TimingOverrides {
                renew_every: Some(timing.renew_every),
                retry_every: Some(timing.retry_every),
                poll_every: Some(timing.poll_every),
                margin: Some(timing.margin),
                request_timeout: Some(timing.request_timeout),
            };
            self
        }
    };
}
pub(crate) use timing_setters;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_for_common_ttls() {
        for secs in [1, 2, 5, 10, 15, 30, 60, 300] {
            let t = Timing::from_ttl(Duration::from_secs(secs));
            t.validate().unwrap();
        }
        let t = Timing::default();
        assert_eq!(t.ttl, Duration::from_secs(15));
        assert_eq!(t.renew_every, Duration::from_millis(7_500));
        assert_eq!(t.retry_every, Duration::from_secs(3));
        assert_eq!(t.poll_every, Duration::from_millis(500));
        assert_eq!(
            Timing::from_ttl(Duration::from_secs(1)).poll_every,
            Duration::from_millis(200)
        );
        assert_eq!(t.request_timeout, Duration::from_millis(1500));
        assert_eq!(t.margin, Duration::from_secs(3));
    }

    #[test]
    fn the_default_renew_leaves_room_for_three_failed_renews() {
        let secs = Duration::from_secs_f64;
        for (ttl, renew) in [(15.0, 7.5), (2.0, 1.0), (60.0, 30.0), (1.0, 0.5)] {
            assert_eq!(
                Timing::from_ttl(secs(ttl)).renew_every,
                secs(renew),
                "ttl {ttl}"
            );
        }
        // A longer request timeout shortens it: 15 - 4 - 3 x 2 = 5 s.
        let mut set = TimingOverrides {
            request_timeout: Some(secs(2.0)),
            margin: Some(secs(4.0)),
            ..TimingOverrides::default()
        };
        let t = Timing::resolve(secs(15.0), &set);
        assert_eq!(t.renew_every, secs(5.0));
        t.validate().unwrap();
        // Explicit wins.
        set.renew_every = Some(secs(3.0));
        assert_eq!(Timing::resolve(secs(15.0), &set).renew_every, secs(3.0));
    }

    #[test]
    fn each_rule_has_its_error() {
        let mut t = Timing::from_ttl(Duration::from_secs(15));
        t.retry_every = Duration::ZERO;
        assert_eq!(
            t.validate(),
            Err(ConfigError::ZeroDuration {
                field: "retry_every"
            })
        );

        let mut t = Timing::from_ttl(Duration::from_secs(15));
        t.margin = Duration::from_secs(2);
        assert!(matches!(
            t.validate(),
            Err(ConfigError::MarginTooSmall { .. })
        ));

        let mut t = Timing::from_ttl(Duration::from_secs(15));
        t.renew_every = Duration::from_millis(10_500);
        let err = t.validate().unwrap_err();
        assert!(matches!(err, ConfigError::NoTimeToRenew { .. }));
        assert!(err.to_string().contains("less than ttl"), "{err}");

        // Exactly at the limit is rejected too.
        let mut t = Timing::from_ttl(Duration::from_secs(15));
        t.renew_every = Duration::from_millis(10_500) - Duration::from_nanos(1);
        assert!(t.validate().is_ok());
    }

    #[test]
    fn clock_rate_scales() {
        assert_eq!(
            ClockRate(0.5).real(Duration::from_secs(1)),
            Duration::from_secs(2)
        );
        assert_eq!(
            ClockRate(1.0).real(Duration::from_secs(1)),
            Duration::from_secs(1)
        );
    }
}
