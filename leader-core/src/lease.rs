//! The lease logic, once for every store: acquire, renew, release and observe.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::backend::{
    Expected, ExpiryModel, IfChanged, LeaseBackend, Stored, WriteKind, WriteOutcome, WriteRequest,
};
use crate::config::{ClockRate, Timing};
use crate::error::{ConfigError, Error};
use crate::metrics::{Op, StoreContact, StoreMetrics};
use crate::model::{
    HolderId, LeaseKey, LeaseRecord, LeaseState, Metadata, TermId, WriteNonce, validate_metadata,
    wall_clock_unix_ms,
};
use crate::rand::Rng;
use crate::token::FencingToken;

/// How many of its own recent writes a client remembers, to recognise them after a lost
/// response.
const OWN_WRITES: usize = 32;

/// A term this client holds: its token and the instant it must stop acting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The term's fencing token.
    pub token: FencingToken,
    /// `t_sent + ttl - margin` of the last successful write, on the local monotonic clock.
    pub deadline: Instant,
}

/// The holder of a lease as a follower sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedLeader {
    /// Who holds the lease.
    pub holder: HolderId,
    /// Its term's token.
    pub token: FencingToken,
    /// What it publishes.
    pub metadata: Metadata,
}

impl ObservedLeader {
    fn of(record: &LeaseRecord) -> Option<Self> {
        record.is_held().then(|| Self {
            holder: record.holder.clone(),
            token: record.token,
            metadata: record.metadata.clone(),
        })
    }
}

/// The outcome of [`LeaseClient::try_acquire`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquisition {
    /// This client holds the lease.
    Acquired(Grant),
    /// Someone else holds it, or won the race for it.
    Following {
        /// The holder, if known (`None`: the record is released, or a race was lost to an
        /// unknown writer).
        leader: Option<ObservedLeader>,
        /// For stores whose leases followers time: when the record will have been unchanged
        /// for a full ttl, so that a takeover may be tried. `None` otherwise.
        takeover_at: Option<Instant>,
    },
}

/// The outcome of [`LeaseClient::renew`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The term goes on until the new deadline.
    Renewed(Grant),
    /// Someone else wrote the record: the term is over.
    Lost {
        /// The new holder, if known.
        leader: Option<ObservedLeader>,
    },
    /// The deadline passed before a renew succeeded: the term is over.
    Expired,
}

/// The record a follower last saw, and when a response first showed its revision.
#[derive(Clone, Debug)]
struct Observation {
    stored: Stored,
    first_seen: Instant,
}

#[derive(Clone, Debug)]
struct HeldTerm {
    term: TermId,
    stored: Stored,
    last_sent: Instant,
}

#[derive(Clone, Copy, Debug)]
struct OwnWrite {
    nonce: WriteNonce,
    sent: Instant,
    term: TermId,
}

/// The lease protocol (`docs/protocol.md`) over any [`LeaseBackend`], for one key and one holder.
///
/// It keeps what the rules need: the revision a follower has seen and since when (on the local
/// monotonic clock), the term it holds and the instant its last successful write was sent, and
/// the nonces of its own recent writes so that it can recognise one whose response was lost.
/// The [`Elector`](crate::Elector) drives it; use it directly for one-shot jobs or tests.
///
/// Every store call is bounded by the request timeout.
#[derive(Debug)]
pub struct LeaseClient {
    backend: Arc<dyn LeaseBackend>,
    key: LeaseKey,
    holder: HolderId,
    metadata: Metadata,
    timing: Timing,
    clock: ClockRate,
    rng: Rng,
    observed: Option<Observation>,
    /// What was observed before the last successful acquire (the record it replaced).
    replaced: Option<Observation>,
    held: Option<HeldTerm>,
    own: VecDeque<OwnWrite>,
    highest_seen: FencingToken,
    metrics: StoreMetrics,
}

impl LeaseClient {
    /// A client for `key` as `holder`, with validated `timing`.
    ///
    /// # Errors
    /// A [`ConfigError`] if the timing breaks a rule or the backend cannot honour it.
    pub fn new(
        backend: Arc<dyn LeaseBackend>,
        key: LeaseKey,
        holder: HolderId,
        timing: Timing,
    ) -> Result<Self, ConfigError> {
        let count_as = key.clone();
        Self::counted_as(backend, key, holder, timing, &count_as)
    }

    /// [`new`](Self::new), with the store calls counted under the metric labels of
    /// `count_as` (a sharded member's calls count under the sharded key, not its membership
    /// record's).
    pub(crate) fn counted_as(
        backend: Arc<dyn LeaseBackend>,
        key: LeaseKey,
        holder: HolderId,
        timing: Timing,
        count_as: &LeaseKey,
    ) -> Result<Self, ConfigError> {
        timing.validate()?;
        backend.check_timing(&timing)?;
        let metrics = StoreMetrics::new(count_as, &holder, backend.name());
        Ok(Self {
            metrics,
            backend,
            key,
            holder,
            metadata: Metadata::new(),
            timing,
            clock: ClockRate(1.0),
            rng: Rng::from_entropy(),
            observed: None,
            replaced: None,
            held: None,
            own: VecDeque::with_capacity(OWN_WRITES),
            highest_seen: FencingToken(0),
        })
    }

    /// Publishes `metadata` with the next write.
    ///
    /// # Errors
    /// [`ConfigError::InvalidMetadata`] if a store could not keep it.
    pub fn set_metadata(&mut self, metadata: Metadata) -> Result<(), ConfigError> {
        validate_metadata(&metadata)?;
        self.metadata = metadata;
        Ok(())
    }

    pub(crate) fn with_clock(mut self, clock: ClockRate, seed: Option<u64>) -> Self {
        self.clock = clock;
        if let Some(seed) = seed {
            self.rng = Rng::seeded(seed);
        }
        self
    }

    /// The lease key.
    pub fn key(&self) -> &LeaseKey {
        &self.key
    }

    /// This client's holder id.
    pub fn holder(&self) -> &HolderId {
        &self.holder
    }

    /// When the store last answered one of this client's calls.
    pub(crate) fn store_contact(&self) -> StoreContact {
        self.metrics.answered()
    }

    /// The store's change hints for this key ([`LeaseBackend::changes`]).
    pub(crate) fn changes(&self) -> Option<crate::backend::Changes> {
        self.backend.changes(&self.key)
    }

    /// The record last seen and since when (local time of the first answer that showed its
    /// revision), as follower reads left it.
    pub(crate) fn observed(&self) -> Option<(&Stored, Instant)> {
        self.observed.as_ref().map(|o| (&o.stored, o.first_seen))
    }

    /// The record the last successful acquire replaced, as last observed, and since when
    /// its revision had been seen; `None` if there was none (or it was not read first).
    pub(crate) fn replaced(&self) -> Option<(&Stored, Instant)> {
        self.replaced.as_ref().map(|o| (&o.stored, o.first_seen))
    }

    /// The expiry model of the store.
    pub(crate) fn expiry_model(&self) -> ExpiryModel {
        self.backend.expiry_model()
    }

    /// The timing in force.
    pub fn timing(&self) -> &Timing {
        &self.timing
    }

    /// The term this client holds, if any and if its deadline has not passed.
    pub fn grant(&self) -> Option<Grant> {
        let grant = self.held.as_ref().map(|h| self.grant_of(h))?;
        (Instant::now() < grant.deadline).then_some(grant)
    }

    fn grant_of(&self, held: &HeldTerm) -> Grant {
        Grant {
            token: held.stored.record.token,
            deadline: held.last_sent + self.clock.real(self.timing.term_validity()),
        }
    }

    fn request_timeout(&self) -> Duration {
        self.clock.real(self.timing.request_timeout)
    }

    fn is_own(&self, stored: &Stored) -> Option<OwnWrite> {
        if stored.record.holder != self.holder {
            return None;
        }
        self.own
            .iter()
            .find(|w| w.nonce == stored.record.nonce)
            .copied()
    }

    fn remember(&mut self, write: OwnWrite) {
        if self.own.len() == OWN_WRITES {
            self.own.pop_front();
        }
        self.own.push_back(write);
    }

    fn note(&mut self, stored: &Stored) {
        self.highest_seen = self.highest_seen.max(stored.record.token);
    }

    /// Reads the record the cheap way ([`LeaseBackend::read_if_changed`], given the revision
    /// last seen) and notes what it shows. Returns the record and the local time the answer
    /// was received.
    async fn look(&mut self) -> Result<(Option<Stored>, Instant), Error> {
        let limit = self.request_timeout();
        let known = self.observed.as_ref().map(|o| o.stored.revision.clone());
        let found = self
            .metrics
            .call(
                Op::Read,
                limit,
                self.backend.read_if_changed(&self.key, known.as_ref()),
            )
            .await;
        let found = found.map_err(|_| Error::Timeout {
            operation: "reading the lease record",
            after: self.timing.request_timeout,
        })??;
        let received = Instant::now();
        let current = match found {
            IfChanged::Unchanged => match &self.observed {
                Some(o) => Some(o.stored.clone()),
                None => {
                    return Err(Error::Backend {
                        message: format!(
                            "the store answered 'unchanged' for {} although no revision was \
                             known (a bug in the backend's read_if_changed)",
                            self.key
                        ),
                        source: None,
                    });
                }
            },
            IfChanged::Changed(current) => current,
        };
        match &current {
            Some(stored) => {
                self.note(stored);
                self.observe_revision(stored, received);
            }
            None => self.observed = None,
        }
        Ok((current, received))
    }

    async fn read_for_term(&mut self, term: TermId) -> Result<Option<Stored>, Error> {
        let limit = self.request_timeout();
        let read = self.backend.read_for_term(&self.key, term);
        let result = self.metrics.call(Op::Read, limit, read).await;
        let result = result.map_err(|_| Error::Timeout {
            operation: "re-reading the lease record",
            after: self.timing.request_timeout,
        })??;
        if let Some(stored) = &result {
            self.note(stored);
        }
        Ok(result)
    }

    /// Reads the record as a follower does ([`LeaseBackend::read_if_changed`]: the store's
    /// cheapest read, which may lag its latest write by the store's replication lag),
    /// updating what this client has observed.
    ///
    /// # Errors
    /// Any [`Error`] of the read, [`Error::Timeout`] after the request timeout.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn observe(&mut self) -> Result<Option<Stored>, Error> {
        Ok(self.look().await?.0)
    }

    /// Records that `stored` was seen at `received`, and returns since when this revision has
    /// been seen unchanged.
    fn observe_revision(&mut self, stored: &Stored, received: Instant) -> Instant {
        match &mut self.observed {
            Some(o) if o.stored.revision == stored.revision => {
                o.stored = stored.clone();
                o.first_seen
            }
            _ => {
                self.observed = Some(Observation {
                    stored: stored.clone(),
                    first_seen: received,
                });
                received
            }
        }
    }

    fn next_token(&self, previous: Option<FencingToken>) -> Result<FencingToken, Error> {
        let floor = previous.unwrap_or(FencingToken(0)).max(self.highest_seen);
        floor.next().ok_or_else(|| Error::InvalidConfig {
            message: format!(
                "the fencing token of {} reached u64::MAX; delete the lease record's history",
                self.key
            ),
            source: None,
        })
    }

    /// Tries to become leader: reads the record, and writes a new term if it is absent,
    /// released, ours, or (for stores whose leases followers time) unchanged for a full ttl
    /// since this client first saw it.
    ///
    /// If this client already holds a live term, returns it without a request.
    ///
    /// # Errors
    /// Any store [`Error`]. [`Error::MalformedRecord`] if the record cannot be parsed (it is
    /// not overwritten); [`Error::Indeterminate`] if a write's outcome could not be resolved
    /// (the next call resolves it).
    ///
    /// # Cancel safety
    /// Not cancel-safe: a write may be in flight. If cancelled, a later call still recognises
    /// the write by its nonce.
    #[tracing::instrument(name = "try_acquire", level = "debug", skip(self), fields(key = %self.key, holder = %self.holder))]
    pub async fn try_acquire(&mut self) -> Result<Acquisition, Error> {
        if let Some(grant) = self.grant() {
            return Ok(Acquisition::Acquired(grant));
        }
        self.held = None;
        let (current, received) = self.look().await?;
        let Some(current) = current else {
            let token = self.next_token(None)?;
            return self.acquire_write(Expected::Absent, token).await;
        };
        let token = self.next_token(Some(current.record.token))?;
        let expected = Expected::Revision(current.revision.clone());
        if self.is_own(&current).is_some() && current.record.is_held() {
            // Our own record: a term that ended at its deadline, or a write whose response
            // was lost. Nobody else may act on it, so a new term (with a new token) may begin
            // at once.
            debug!(key = %self.key, "found our own record; starting a new term");
            return self.acquire_write(expected, token).await;
        }
        if !current.record.is_held() {
            return self.acquire_write(expected, token).await;
        }
        if self.backend.expiry_model() == ExpiryModel::EnforcedByStore {
            // The store reports the record held only while its server lease is active: no
            // write could succeed before the store reports it free.
            return Ok(Acquisition::Following {
                leader: ObservedLeader::of(&current.record),
                takeover_at: None,
            });
        }
        let first_seen = self.observed.as_ref().map_or(received, |o| o.first_seen);
        let takeover_at = first_seen + self.clock.real(current.record.ttl);
        if received >= takeover_at {
            info!(
                key = %self.key,
                stale_holder = %current.record.holder,
                stale_token = %current.record.token,
                "record unchanged for a full ttl; taking over"
            );
            return self.acquire_write(expected, token).await;
        }
        Ok(Acquisition::Following {
            leader: ObservedLeader::of(&current.record),
            takeover_at: Some(takeover_at),
        })
    }

    async fn acquire_write(
        &mut self,
        expected: Expected,
        token: FencingToken,
    ) -> Result<Acquisition, Error> {
        let term = TermId(u128::from(self.rng.next_u64()) << 64 | u128::from(self.rng.next_u64()));
        let nonce = WriteNonce(self.rng.next_u64());
        let record = LeaseRecord::held(
            self.holder.clone(),
            token,
            self.timing.ttl,
            self.metadata.clone(),
            nonce,
        );
        let request =
            WriteRequest::new(self.key.clone(), expected, record, WriteKind::Acquire, term);
        let sent = Instant::now();
        let own = OwnWrite { nonce, sent, term };
        self.remember(own);
        let write = self.backend.write(request);
        let outcome = self
            .metrics
            .call(Op::Acquire, self.request_timeout(), write)
            .await;
        let stored = match outcome {
            Ok(Ok(WriteOutcome::Written(stored))) => stored,
            Ok(Ok(WriteOutcome::Conflict { current })) => match current {
                Some(c) if c.record.nonce == nonce && c.record.holder == self.holder => c,
                Some(c) => {
                    self.note(&c);
                    let first_seen = self.observe_revision(&c, Instant::now());
                    let takeover_at = (self.backend.expiry_model()
                        == ExpiryModel::ObservedByFollowers
                        && c.record.is_held())
                    .then(|| first_seen + self.clock.real(c.record.ttl));
                    return Ok(Acquisition::Following {
                        leader: ObservedLeader::of(&c.record),
                        takeover_at,
                    });
                }
                None => {
                    return Ok(Acquisition::Following {
                        leader: None,
                        takeover_at: None,
                    });
                }
            },
            Ok(Err(e)) if e.kind() != crate::ErrorKind::Indeterminate => return Err(e),
            Ok(Err(_)) | Err(_) => match self.resolve(nonce, term).await? {
                // Our write, and (on a store that enforces expiry) its lease is still ours.
                Some(stored) if stored.record.is_held() => stored,
                found => {
                    if found.is_some() {
                        warn!(key = %self.key, "our acquire landed, but the store no longer grants its lease; no term");
                    }
                    return Ok(Acquisition::Following {
                        leader: None,
                        takeover_at: None,
                    });
                }
            },
        };
        self.note(&stored);
        let held = HeldTerm {
            term,
            stored,
            last_sent: sent,
        };
        let grant = self.grant_of(&held);
        if Instant::now() >= grant.deadline {
            // The answer came too late to act on. The record is ours; the next attempt starts
            // a fresh term on it at once.
            warn!(key = %self.key, "acquired, but the answer came after the term's deadline");
            return Ok(Acquisition::Following {
                leader: None,
                takeover_at: Some(Instant::now()),
            });
        }
        info!(key = %self.key, holder = %self.holder, token = %grant.token, "acquired the lease");
        self.held = Some(held);
        self.replaced = self.observed.take();
        Ok(Acquisition::Acquired(grant))
    }

    /// After a write of `term` with an unknown outcome: re-reads as the term's holder
    /// ([`LeaseBackend::read_for_term`]) and returns the record if it is exactly that write
    /// (`nonce`), `None` if it is anything else. On a store that enforces expiry the record
    /// reads as released unless the term still holds the server lease; a caller that wants a
    /// term checks that it is held.
    async fn resolve(&mut self, nonce: WriteNonce, term: TermId) -> Result<Option<Stored>, Error> {
        debug!(key = %self.key, "write outcome unknown; re-reading");
        match self.read_for_term(term).await {
            Ok(Some(s)) if s.record.holder == self.holder && s.record.nonce == nonce => Ok(Some(s)),
            Ok(other) => {
                if let Some(s) = &other {
                    self.observe_revision(s, Instant::now());
                }
                Ok(None)
            }
            Err(e) => Err(Error::Indeterminate {
                message: format!(
                    "a write to {} timed out and the re-read failed; will resolve on the next attempt",
                    self.key
                ),
                source: Some(Box::new(e)),
            }),
        }
    }

    /// Extends the held term with a write conditional on the last revision this client wrote.
    ///
    /// # Errors
    /// A retryable store [`Error`] if the renew did not go through and the term is still live:
    /// try again before the deadline. A conflict is not an error: it is [`Renewal::Lost`].
    ///
    /// # Cancel safety
    /// Not cancel-safe: a write may be in flight; the next call resolves it.
    #[tracing::instrument(name = "renew", level = "debug", skip(self), fields(key = %self.key, holder = %self.holder))]
    pub async fn renew(&mut self) -> Result<Renewal, Error> {
        let Some(held) = self.held.clone() else {
            return Ok(Renewal::Lost { leader: None });
        };
        let deadline = self.grant_of(&held).deadline;
        let now = Instant::now();
        if now >= deadline {
            self.end_term("deadline passed before renewing");
            return Ok(Renewal::Expired);
        }
        let budget = self.request_timeout().min(deadline - now);
        let nonce = WriteNonce(self.rng.next_u64());
        let mut record = held.stored.record.clone();
        record.nonce = nonce;
        record.state = LeaseState::Held;
        record.metadata = self.metadata.clone();
        record.written_unix_ms = wall_clock_unix_ms();
        let request = WriteRequest::new(
            self.key.clone(),
            Expected::Revision(held.stored.revision.clone()),
            record,
            WriteKind::Renew,
            held.term,
        );
        let sent = Instant::now();
        self.remember(OwnWrite {
            nonce,
            sent,
            term: held.term,
        });
        // `refused`: the store answered with a conflict, so this write was not applied.
        let write = self.backend.write(request);
        let outcome = self.metrics.call(Op::Renew, budget, write).await;
        let (current, refused) = match outcome {
            Ok(Ok(WriteOutcome::Written(stored))) => {
                return Ok(self.renewed(held.term, stored, sent));
            }
            Ok(Ok(WriteOutcome::Conflict { current: Some(c) })) => (c, true),
            Ok(Ok(WriteOutcome::Conflict { current: None })) => {
                // Our own earlier write with a lost response may be what changed the record.
                match self.read_before(deadline, held.term).await? {
                    Some(c) => (c, true),
                    None => return Ok(self.lost(None)),
                }
            }
            Ok(Err(e)) if e.kind() != crate::ErrorKind::Indeterminate => return Err(e),
            Ok(Err(_)) | Err(_) => {
                if Instant::now() >= deadline {
                    self.end_term("deadline passed while renewing");
                    return Ok(Renewal::Expired);
                }
                match self.read_before(deadline, held.term).await? {
                    Some(c) => (c, false),
                    None => return Ok(self.lost(None)),
                }
            }
        };
        match self.is_own(&current) {
            // Our previous record, unchanged. After an unknown outcome, the renew was not
            // applied (yet): try again. After a conflict, the store refused our renew although
            // the record is unchanged: a store that enforces expiry no longer grants us the
            // lease (it expired, or an operator broke it). Either way the term cannot go on
            // from this revision.
            Some(_) if current.revision == held.stored.revision && current.record.is_held() => {
                if refused {
                    Ok(self.lost(None))
                } else {
                    Err(Error::indeterminate(format!(
                        "renew of {} was not applied yet; retrying",
                        self.key
                    )))
                }
            }
            // An earlier renew of this term whose response was lost: it landed (and, on a
            // store that enforces expiry, the term still holds the server lease).
            Some(own) if own.term == held.term && current.record.is_held() => {
                Ok(self.renewed(held.term, current, own.sent))
            }
            _ => Ok(self.lost(Some(current))),
        }
    }

    /// Re-reads as the holder of `term` ([`LeaseBackend::read_for_term`]) within the request
    /// timeout and before `deadline`.
    async fn read_before(
        &mut self,
        deadline: Instant,
        term: TermId,
    ) -> Result<Option<Stored>, Error> {
        let budget = self
            .request_timeout()
            .min(deadline.saturating_duration_since(Instant::now()));
        let read = self.backend.read_for_term(&self.key, term);
        let result = self.metrics.call(Op::Read, budget, read).await;
        match result {
            Ok(Ok(found)) => {
                if let Some(s) = &found {
                    self.note(s);
                }
                Ok(found)
            }
            Ok(Err(e)) => Err(Error::Indeterminate {
                message: format!("could not re-read {} after a write", self.key),
                source: Some(Box::new(e)),
            }),
            Err(_) => Err(Error::indeterminate(format!(
                "re-reading {} after a write timed out",
                self.key
            ))),
        }
    }

    fn renewed(&mut self, term: TermId, stored: Stored, sent: Instant) -> Renewal {
        self.note(&stored);
        let held = HeldTerm {
            term,
            stored,
            last_sent: sent,
        };
        let grant = self.grant_of(&held);
        self.held = Some(held);
        if Instant::now() >= grant.deadline {
            self.end_term("renew answered after the deadline");
            return Renewal::Expired;
        }
        debug!(key = %self.key, token = %grant.token, "renewed");
        Renewal::Renewed(grant)
    }

    fn lost(&mut self, current: Option<Stored>) -> Renewal {
        let leader = current.as_ref().and_then(|c| ObservedLeader::of(&c.record));
        if let Some(c) = &current {
            self.observe_revision(c, Instant::now());
        }
        warn!(
            key = %self.key,
            new_holder = leader.as_ref().map(|l| l.holder.as_str()).unwrap_or("nobody"),
            "lease lost: the record was changed by someone else"
        );
        self.held = None;
        Renewal::Lost { leader }
    }

    /// Forgets the held term (its deadline passed, or the caller stepped down without
    /// releasing). The record stays; this client recognises it as its own and may start a new
    /// term on it at once.
    pub fn end_term(&mut self, why: &str) {
        if self.held.take().is_some() {
            info!(key = %self.key, why, "term ended");
        }
    }

    /// Marks the record released, conditional on it still being the last one this client
    /// wrote, so that a follower can take over at once. Returns whether the record is now
    /// released by us; `false` if someone else had already changed it.
    ///
    /// Call it only once the work of the term has stopped.
    ///
    /// # Errors
    /// A store [`Error`]; the lease then expires by itself after its ttl.
    ///
    /// # Cancel safety
    /// Not cancel-safe: the write may still be applied.
    #[tracing::instrument(name = "release", level = "debug", skip(self), fields(key = %self.key, holder = %self.holder))]
    pub async fn release(&mut self) -> Result<bool, Error> {
        let Some(held) = self.held.take() else {
            return Ok(false);
        };
        let nonce = WriteNonce(self.rng.next_u64());
        let mut record = held.stored.record.clone();
        record.nonce = nonce;
        record.state = LeaseState::Released;
        record.written_unix_ms = wall_clock_unix_ms();
        let request = WriteRequest::new(
            self.key.clone(),
            Expected::Revision(held.stored.revision.clone()),
            record,
            WriteKind::Release,
            held.term,
        );
        self.remember(OwnWrite {
            nonce,
            sent: Instant::now(),
            term: held.term,
        });
        let write = self.backend.write(request);
        let outcome = self
            .metrics
            .call(Op::Release, self.request_timeout(), write)
            .await;
        let released = match outcome {
            Ok(Ok(WriteOutcome::Written(_))) => true,
            Ok(Ok(WriteOutcome::Conflict { current })) => {
                current.is_some_and(|c| c.record.nonce == nonce && c.record.holder == self.holder)
            }
            Ok(Err(e)) if e.kind() != crate::ErrorKind::Indeterminate => return Err(e),
            Ok(Err(_)) | Err(_) => self.resolve(nonce, held.term).await?.is_some(),
        };
        info!(key = %self.key, token = %held.stored.record.token, released, "released the lease");
        Ok(released)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryStore;

    fn client(store: &MemoryStore, holder: &str) -> LeaseClient {
        LeaseClient::new(
            Arc::new(store.clone()),
            LeaseKey::new("k").unwrap(),
            HolderId::new(holder).unwrap(),
            Timing::from_ttl(Duration::from_secs(10)),
        )
        .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn own_ended_term_is_retaken_at_once_with_a_new_token() {
        let store = MemoryStore::new();
        let mut a = client(&store, "a");
        let Acquisition::Acquired(g1) = a.try_acquire().await.unwrap() else {
            panic!("first acquire must win")
        };
        a.end_term("test");
        let Acquisition::Acquired(g2) = a.try_acquire().await.unwrap() else {
            panic!("own record must be retaken")
        };
        assert!(g2.token > g1.token);
    }

    #[tokio::test(start_paused = true)]
    async fn a_restarted_holder_with_the_same_id_waits_like_anyone() {
        let store = MemoryStore::new();
        let mut a = client(&store, "a");
        assert!(matches!(
            a.try_acquire().await.unwrap(),
            Acquisition::Acquired(_)
        ));
        // Same holder id, new process: it does not know the nonces, so it must wait.
        let mut a2 = client(&store, "a");
        assert!(matches!(
            a2.try_acquire().await.unwrap(),
            Acquisition::Following { .. }
        ));
    }

    /// A store that enforces expiry and has stopped granting our lease (an operator broke
    /// it): it refuses the renew, and the record is unchanged.
    #[derive(Debug)]
    struct Broken(MemoryStore);

    #[async_trait::async_trait]
    impl LeaseBackend for Broken {
        fn expiry_model(&self) -> ExpiryModel {
            ExpiryModel::EnforcedByStore
        }
        async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
            self.0.read(key).await
        }
        async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
            if request.kind == WriteKind::Renew {
                return Ok(WriteOutcome::Conflict { current: None });
            }
            self.0.write(request).await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_renew_on_an_unchanged_record_is_lost_at_once() {
        let mut a = LeaseClient::new(
            Arc::new(Broken(MemoryStore::new())),
            LeaseKey::new("k").unwrap(),
            HolderId::new("a").unwrap(),
            Timing::from_ttl(Duration::from_secs(15)),
        )
        .unwrap();
        assert!(matches!(
            a.try_acquire().await.unwrap(),
            Acquisition::Acquired(_)
        ));
        assert_eq!(a.renew().await.unwrap(), Renewal::Lost { leader: None });
        assert!(a.grant().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn renew_after_deadline_expires_and_release_without_term_is_false() {
        let store = MemoryStore::new();
        let mut a = client(&store, "a");
        let Acquisition::Acquired(g) = a.try_acquire().await.unwrap() else {
            panic!()
        };
        tokio::time::sleep_until(g.deadline).await;
        assert_eq!(a.renew().await.unwrap(), Renewal::Expired);
        assert!(a.grant().is_none());
        assert!(!a.release().await.unwrap());
    }
}
