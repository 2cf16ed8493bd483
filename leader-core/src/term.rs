//! A term of leadership as the work it allows sees it: one type for a single key's term and a
//! shard's, with the one check of whether it still allows acting.

use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::backend::Fence;
use crate::clock::Anchor;
use crate::token::FencingToken;

/// A term's deadline as the lease client computed it (tokio's clock), with the anchor taken
/// before the write it comes from, so that a host suspend since then moves it earlier.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TermDeadline {
    pub(crate) at: Instant,
    pub(crate) anchor: Anchor,
}

impl TermDeadline {
    /// The deadline, earlier by however long the host has been suspended since the write.
    pub(crate) fn effective(&self) -> Instant {
        self.at
            .checked_sub(self.anchor.suspended())
            .unwrap_or(self.at)
            .min(self.at)
    }
}

/// Whether a term still allows acting: not cancelled, and before its deadline (earlier by a
/// host suspend) on the local clock. The one check behind [`Term::is_valid`] and what the
/// handles hand out.
pub(crate) fn term_live(
    cancel: &CancellationToken,
    deadline: &watch::Receiver<TermDeadline>,
) -> bool {
    !cancel.is_cancelled() && Instant::now() < deadline.borrow().effective()
}

/// Completes when the term is cancelled, or its deadline passes on the local clock (checked
/// at least every `tick`, so that a suspend is noticed), whichever is first; then the term is
/// cancelled. Needs nothing from the elector's task.
pub(crate) async fn term_over(
    cancel: &CancellationToken,
    deadline: &watch::Receiver<TermDeadline>,
    tick: Duration,
) {
    let mut deadline = deadline.clone();
    let mut watching = true;
    loop {
        let at = deadline.borrow_and_update().effective();
        let now = Instant::now();
        if now >= at {
            cancel.cancel();
            return;
        }
        let wake = at.min(now + tick);
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            changed = deadline.changed(), if watching => {
                if changed.is_err() {
                    watching = false;
                }
            }
            _ = sleep_until(wake) => {}
        }
    }
}

/// One term as its elector and the handle share it, until it ends: what [`Term`]s are made
/// of, and whether one has been handed out.
#[derive(Debug)]
pub(crate) struct TermSlot {
    pub(crate) fence: Fence,
    pub(crate) cancel: CancellationToken,
    pub(crate) deadline: watch::Receiver<TermDeadline>,
    /// Cloned into every `Term`: the elector learns that the work stopped when all are gone.
    pub(crate) alive: mpsc::Sender<()>,
    /// Handed out already: it is not handed out again.
    pub(crate) handed_out: bool,
}

impl TermSlot {
    /// Whether the term still allows acting.
    pub(crate) fn live(&self) -> bool {
        term_live(&self.cancel, &self.deadline)
    }

    /// The term for its work, once: `None` if it was handed out already or is over.
    /// `shard` names the shard of a sharded term; `tick` is how often [`Term::cancelled`]
    /// looks at the deadline itself (`None`: the elector's watchdog cancels the term at its
    /// deadline, and `cancelled` only waits for that).
    pub(crate) fn hand_out(&mut self, shard: Option<u32>, tick: Option<Duration>) -> Option<Term> {
        if self.handed_out || !self.live() {
            return None;
        }
        self.handed_out = true;
        Some(Term {
            fence: self.fence.clone(),
            shard,
            cancel: self.cancel.clone(),
            deadline: self.deadline.clone(),
            tick,
            _alive: self.alive.clone(),
        })
    }
}

/// One term of leadership, handed to the work it allows: of a single key
/// ([`ElectorHandle::wait_for_term`](crate::ElectorHandle::wait_for_term)) or of one shard
/// ([`ShardedHandle::next_term`](crate::ShardedHandle::next_term)).
///
/// Check [`is_valid`](Term::is_valid) before each action, or run the work until
/// [`cancelled`](Term::cancelled): the term is cancelled when it ends (deadline, lost lease,
/// resign, release, shutdown). `is_valid` also checks the deadline on the local clock, so a
/// process that was paused past its deadline sees the term as over even before the elector's
/// task has run. Pass [`fence`](Term::fence) with writes to protected resources. Drop the
/// `Term` when the work has stopped: a release waits for that (up to the deadline).
#[derive(Debug)]
pub struct Term {
    fence: Fence,
    shard: Option<u32>,
    cancel: CancellationToken,
    deadline: watch::Receiver<TermDeadline>,
    tick: Option<Duration>,
    _alive: mpsc::Sender<()>,
}

impl Term {
    /// The term's fencing token: higher than every earlier term's of its key (or shard).
    pub fn token(&self) -> FencingToken {
        self.fence.token
    }

    /// The shard this term leads, `0..shards`, in a sharded election; `None` for a single key.
    pub fn shard(&self) -> Option<u32> {
        self.shard
    }

    /// The key, holder and token, for fenced writes. A shard's fence also names the
    /// instance's membership lease as the lease that must be live (checked in the same write
    /// on the stores that can).
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// The deadline as of the last successful renew: the term is over at this instant unless
    /// a renew succeeds before. If the host was suspended since that renew was sent, the
    /// deadline is earlier by the time it was suspended.
    pub fn deadline(&self) -> Instant {
        self.deadline.borrow().effective()
    }

    /// Whether the term still allows acting: not cancelled and before the deadline.
    pub fn is_valid(&self) -> bool {
        term_live(&self.cancel, &self.deadline)
    }

    /// Completes when the term ends: cancelled, or its deadline reached on the local clock.
    /// It does not depend on the elector's task running: a single key's term watches its
    /// deadline itself; a sharded instance has one watchdog task per membership term (not
    /// one per shard, which would cost 10,000 timers) that cancels every shard term at the
    /// deadline, also after a host suspend.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn cancelled(&self) {
        match self.tick {
            Some(tick) => term_over(&self.cancel, &self.deadline, tick).await,
            None => self.cancel.cancelled().await,
        }
    }

    /// Runs `work` until it completes or the term ends, whichever is first: `Some` of its
    /// output, or `None` if the term ended first (the work is dropped then).
    ///
    /// # Cancel safety
    /// As cancel-safe as `work`.
    pub async fn run_until_over<F: Future>(&self, work: F) -> Option<F::Output> {
        tokio::select! {
            biased;
            () = self.cancelled() => None,
            out = work => Some(out),
        }
    }

    /// The term's cancellation token, for work spawned elsewhere. It is cancelled when the
    /// term ends: by the elector, by a watchdog task at the deadline (even if the elector's
    /// task has died), or when the elector's task is dropped or panics.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// The renews of this term from now on, each as the deadline it gives: for work that
    /// passes the deadline on (to a child process, say) without polling
    /// [`deadline`](Self::deadline). Take it *before* reading the deadline to pass on first,
    /// so that a renew in between is not missed (it is then also reported by the stream,
    /// which does no harm).
    pub fn renewals(&self) -> Renewals {
        let mut deadline = self.deadline.clone();
        deadline.borrow_and_update();
        Renewals {
            deadline,
            cancel: self.cancel.clone(),
            tick: self.tick,
        }
    }
}

/// The renews of one [`Term`]; see [`Term::renewals`].
#[derive(Debug)]
pub struct Renewals {
    deadline: watch::Receiver<TermDeadline>,
    cancel: CancellationToken,
    /// As [`Term`]'s: how often to look at the deadline itself, if at all.
    tick: Option<Duration>,
}

impl Renewals {
    /// Waits for the next successful renew of the term and returns the deadline it gives
    /// (earlier by a host suspend since it was sent); `None` once no renew can come: the term
    /// has ended (cancelled, or its deadline reached on the local clock, as
    /// [`Term::cancelled`] sees it).
    ///
    /// # Cancel safety
    /// Cancel-safe: a renew that happens meanwhile is returned by the next call.
    pub async fn next(&mut self) -> Option<Instant> {
        let deadline = self.deadline.clone();
        let over = async {
            match self.tick {
                Some(tick) => term_over(&self.cancel, &deadline, tick).await,
                None => self.cancel.cancelled().await,
            }
        };
        tokio::select! {
            biased;
            () = over => None,
            changed = self.deadline.changed() => match changed {
                Ok(()) => Some(self.deadline.borrow_and_update().effective()),
                Err(_) => None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host suspended since the last renew was sent: the term is over at once, not when
    /// tokio's clock (which stood still while suspended) reaches the deadline.
    #[tokio::test(start_paused = true)]
    async fn a_suspend_since_the_last_renew_ends_the_term_at_once() {
        let cancel = CancellationToken::new();
        let ttl_left = Duration::from_secs(10);
        let (_tx, rx) = watch::channel(TermDeadline {
            at: Instant::now() + ttl_left,
            anchor: Anchor::before_suspend_of(Duration::from_secs(30)),
        });
        let start = Instant::now();
        term_over(&cancel, &rx, Duration::from_secs(1)).await;
        assert_eq!(Instant::now(), start, "over at once");
        assert!(cancel.is_cancelled());
        // Without a suspend it lasts until the deadline.
        let cancel = CancellationToken::new();
        let (_tx, rx) = watch::channel(TermDeadline {
            at: Instant::now() + ttl_left,
            anchor: Anchor::now(),
        });
        let start = Instant::now();
        term_over(&cancel, &rx, Duration::from_secs(1)).await;
        assert_eq!(Instant::now() - start, ttl_left);
    }
}
