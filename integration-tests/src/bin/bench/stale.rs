//! Stale actions after SIGSTOP: the fenced writes that a paused leader sent once the next term
//! had begun, and what the store made of them.

use integration_tests::chaos::{EV_WRITE, Event, OUT_ACCEPTED, OUT_FENCED};

/// The stale writes of one or more rounds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stale {
    /// Writes of the old term sent after the new term began.
    pub(crate) attempted: usize,
    /// Of those, acknowledged by the store (fencing failed if any).
    pub(crate) accepted: usize,
    /// Of those, rejected for their stale token.
    pub(crate) fenced: usize,
    /// Of those, failed otherwise or of unknown outcome.
    pub(crate) other: usize,
}

impl std::ops::AddAssign for Stale {
    fn add_assign(&mut self, rhs: Self) {
        self.attempted += rhs.attempted;
        self.accepted += rhs.accepted;
        self.fenced += rhs.fenced;
        self.other += rhs.other;
    }
}

/// The writes with `token` in `events` (the old leader's log) sent (`t1`) after `new_term`
/// began ([`mono_us`](integration_tests::chaos::mono_us)).
pub(crate) fn stale_writes(events: &[Event], token: u64, new_term: u64) -> Stale {
    let mut s = Stale::default();
    for e in events
        .iter()
        .filter(|e| e.ev == EV_WRITE && e.token == token && e.t1 > new_term)
    {
        s.attempted += 1;
        match e.outcome.as_str() {
            OUT_ACCEPTED => s.accepted += 1,
            OUT_FENCED => s.fenced += 1,
            _ => s.other += 1,
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use integration_tests::chaos::{EV_TERM_ENDED, OUT_UNKNOWN};

    fn write(token: u64, t1: u64, outcome: &str) -> Event {
        Event {
            ev: EV_WRITE.to_owned(),
            t: t1 + 5,
            token,
            t0: t1.saturating_sub(500),
            t1,
            outcome: outcome.to_owned(),
            ..Event::default()
        }
    }

    #[test]
    fn only_the_old_terms_writes_sent_after_the_new_term_count() {
        let events = [
            write(3, 900, OUT_ACCEPTED),   // sent before the new term: not stale
            write(3, 1_100, OUT_FENCED),   // decided before the pause, sent after: stale
            write(3, 1_200, OUT_UNKNOWN),  // stale, outcome unknown
            write(4, 1_300, OUT_ACCEPTED), // a later term of its own: not this one
            Event {
                ev: EV_TERM_ENDED.to_owned(),
                t: 1_400,
                token: 3,
                ..Event::default()
            },
        ];
        assert_eq!(
            stale_writes(&events, 3, 1_000),
            Stale {
                attempted: 2,
                accepted: 0,
                fenced: 1,
                other: 1,
            }
        );
        assert_eq!(stale_writes(&events, 3, 2_000), Stale::default());
        let mut total = stale_writes(&events, 3, 1_000);
        total += stale_writes(&[write(3, 1_500, OUT_ACCEPTED)], 3, 1_000);
        assert_eq!((total.attempted, total.accepted), (3, 1));
    }
}
