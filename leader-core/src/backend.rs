//! The contract between the core and a store.

use std::fmt;

use async_trait::async_trait;

use crate::config::Timing;
use crate::error::{ConfigError, Error};
use crate::model::{FencingToken, HolderId, LeaseKey, LeaseRecord, ObjectName, Revision, TermId};

/// A record as stored, with the revision the store gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// The record.
    pub record: LeaseRecord,
    /// The store's revision of it.
    pub revision: Revision,
}

/// What a conditional write expects to find.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expected {
    /// No record exists for the key.
    Absent,
    /// The record exists with exactly this revision.
    Revision(Revision),
}

/// Why the core writes. Compare-and-swap stores may ignore it; stores with server-side leases
/// map it to their lease operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteKind {
    /// Begin a term: create the record, take over a stale or released one, or re-take our own.
    /// The record carries the new term's token.
    Acquire,
    /// Extend the current term (same token, same [`TermId`]).
    Renew,
    /// End the current term: the record is marked released.
    Release,
}

/// One conditional write of a lease record.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct WriteRequest {
    /// The lease key.
    pub key: LeaseKey,
    /// The condition.
    pub expected: Expected,
    /// The record to store.
    pub record: LeaseRecord,
    /// Why the core writes.
    pub kind: WriteKind,
    /// The writer's term; the same for the acquire, renews and release of one term. A
    /// server-lease backend uses it as its proposed lease id.
    pub term: TermId,
}

impl WriteRequest {
    /// A write of `record` to `key` on condition `expected`.
    pub fn new(
        key: LeaseKey,
        expected: Expected,
        record: LeaseRecord,
        kind: WriteKind,
        term: TermId,
    ) -> Self {
        Self {
            key,
            expected,
            record,
            kind,
            term,
        }
    }
}

/// The outcome of a conditional write that the store answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The write was applied.
    Written(Stored),
    /// The condition did not hold; nothing was written. `current` is the record that is there,
    /// when the store returns it with the failure (DynamoDB does), else `None`.
    Conflict {
        /// The record found instead, if the store told.
        current: Option<Stored>,
    },
}

/// Who decides that a lease has expired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpiryModel {
    /// Compare-and-swap stores: a follower may take over only after it has seen the same
    /// revision unchanged for a full ttl on its own clock. The core enforces this.
    ObservedByFollowers,
    /// The store enforces expiry (Azure blob leases): a follower simply tries to acquire and
    /// the store refuses while the lease is live.
    EnforcedByStore,
}

/// A lease store: read a record, write it conditionally.
///
/// Expiry, renewal cadence, fencing tokens and the recovery from lost responses are the core's
/// job ([`LeaseClient`](crate::LeaseClient)); a backend only stores records faithfully.
///
/// # Contract
/// To be correct, an implementation must:
/// 1. **Be linearizable per key.** A `read` that starts after a `write` was applied returns that
///    write or a later one. `write` is atomic: it applies only if the record's current state
///    matches [`WriteRequest::expected`] at the instant it is applied.
/// 2. **Report a failed condition as [`WriteOutcome::Conflict`]**, never as an error, and
///    only when nothing was written. Include the current record when the store returns it.
///    (One exception: a store that must create an object before it can write it
///    conditionally, such as a blob to lease or a generation to match, may leave a
///    *released* placeholder where the record was absent; a released record is as free as
///    an absent one.)
/// 3. **Report an unknown outcome as [`Error::Indeterminate`].** If the write may have been
///    applied (a timeout after sending, a lost connection, a 5xx after the body was sent, an
///    SDK retry that ended in a conflict), say so. The core then re-reads with
///    [`read_for_term`](LeaseBackend::read_for_term) and recognises its own write by holder
///    and [`nonce`](LeaseRecord::nonce); a term only if that record is held. Any other error
///    promises that nothing was written.
/// 4. **Never retry a conditional write blindly**, and bound the SDK's own retries so that a
///    call does not outlive the core's request timeout (the core also cancels it at that
///    timeout; a cancelled write is indeterminate).
/// 5. **Store the record as given** and return it from `read` unchanged, with a revision that
///    changes on every applied write and is never reused for another content of the same key
///    (so a stale revision cannot match by accident). Revisions are compared only for
///    equality. A store that enforces expiry ([`ExpiryModel::EnforcedByStore`]) may report a
///    record whose server-side lease is not active as [`LeaseState::Released`](crate::LeaseState::Released), with a
///    revision different from the one it had while the lease was active (so followers and
///    `status` do not show a dead leader).
/// 6. **Keep tokens increasing.** The core proposes `previous token + 1` (or 1 for a record it
///    has never seen). A store whose record can vanish (an operator deletes a blob) may raise
///    the token in [`WriteOutcome::Written`] (never lower it) so that it stays above every
///    earlier term; the returned token is the one the core uses.
/// 7. **Refuse to overwrite what it cannot parse.** `read` of an unparsable record returns
///    [`Error::MalformedRecord`] naming the key; since the core then has no revision to
///    expect, it never writes over it.
/// 8. **Map errors to the semantic [`Error`] variants** in one place: a missing container is
///    [`Error::NotFound`], bad credentials [`Error::Unauthenticated`], throttling
///    [`Error::Throttled`], and so on.
///
/// A backend whose store grants leases itself (Azure) returns
/// [`ExpiryModel::EnforcedByStore`], maps [`WriteKind`] to its lease operations with
/// [`WriteRequest::term`] as the lease id, answers `Conflict` while another lease is live, and
/// implements [`read_for_term`](LeaseBackend::read_for_term) so that a lost response is
/// recognised only while the server lease is still the term's.
#[async_trait]
pub trait LeaseBackend: Send + Sync + fmt::Debug {
    /// Who decides that a lease has expired; see [`ExpiryModel`].
    fn expiry_model(&self) -> ExpiryModel {
        ExpiryModel::ObservedByFollowers
    }

    /// Rejects timing this store cannot honour (Azure: ttl of 15 to 60 s).
    ///
    /// # Errors
    /// [`ConfigError::Unsupported`] saying what the store needs.
    fn check_timing(&self, timing: &Timing) -> Result<(), ConfigError> {
        let _ = timing;
        Ok(())
    }

    /// Reads the record of `key`, or `None` if there is none.
    ///
    /// # Errors
    /// [`Error::MalformedRecord`] if the stored record cannot be parsed; any other [`Error`]
    /// for a store failure.
    ///
    /// # Cancel safety
    /// Cancel-safe: a read changes nothing.
    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error>;

    /// Reads the record of `key` as the holder of `term` must see it to recognise one of its
    /// own writes whose answer was lost.
    ///
    /// A store whose leases followers time ([`ExpiryModel::ObservedByFollowers`]) returns
    /// what [`read`](Self::read) returns; that is the default. A store that enforces expiry
    /// ([`ExpiryModel::EnforcedByStore`]) must report the record as
    /// [`LeaseState::Released`](crate::LeaseState::Released) unless, at the instant of the
    /// read, its server lease is active *and granted to `term`* (the lease id of the term's
    /// acquire): a record can still carry our nonce after an operator broke our lease, or
    /// while another candidate holds the new lease and has not yet written its record. The
    /// default cannot ask a store about its leases, so for such a store it reports every
    /// record as released: a lost answer is then never taken for a term (safe, but the term is
    /// lost). The core uses the revision returned here only to compare it with revisions it
    /// already holds, never as the condition of a write.
    ///
    /// # Errors
    /// As [`read`](Self::read).
    ///
    /// # Cancel safety
    /// Cancel-safe: a read changes nothing.
    async fn read_for_term(&self, key: &LeaseKey, term: TermId) -> Result<Option<Stored>, Error> {
        let _ = term;
        let mut found = self.read(key).await?;
        if self.expiry_model() == ExpiryModel::EnforcedByStore
            && let Some(stored) = &mut found
        {
            stored.record.state = crate::model::LeaseState::Released;
        }
        Ok(found)
    }

    /// Writes `request.record` if the record still matches `request.expected`.
    ///
    /// # Errors
    /// [`Error::Indeterminate`] if the write may have been applied; any other error means it
    /// was not.
    ///
    /// # Cancel safety
    /// Not cancel-safe: a cancelled write may still be applied. Treat it as indeterminate.
    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error>;
}

/// The credentials of a fenced write: the lease, its holder and the holder's token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    /// The lease key of the term.
    pub key: LeaseKey,
    /// The holder of the term.
    pub holder: HolderId,
    /// The term's fencing token.
    pub token: FencingToken,
}

/// A protected object as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FencedObject {
    /// The highest token that has written the object.
    pub fence: FencingToken,
    /// The object's content.
    pub value: Vec<u8>,
    /// The store's revision of the object.
    pub revision: Revision,
}

/// Writes to objects in the same store that only the current leader may change.
///
/// # Contract
/// `fenced_write` applies only if no write with a higher token has been applied to the object
/// (the object's recorded fence is at most `fence.token`), and records `fence.token` as the
/// new fence, atomically, with the store's conditional-write primitive. A backend may check
/// more (DynamoDB also checks, in one transaction, that the lease still has this holder and
/// token). A rejected write is [`Error::Fenced`] and changes nothing.
#[async_trait]
pub trait FencedStore: Send + Sync + fmt::Debug {
    /// Writes `value` to `object` if `fence` is not stale.
    ///
    /// # Errors
    /// [`Error::Fenced`] if a higher token has written the object; any other [`Error`] for a
    /// store failure (an [`Error::Indeterminate`] write may have been applied).
    ///
    /// # Cancel safety
    /// Not cancel-safe: a cancelled write may still be applied.
    async fn fenced_write(
        &self,
        fence: &Fence,
        object: &ObjectName,
        value: &[u8],
    ) -> Result<FencedObject, Error>;

    /// Reads a protected object.
    ///
    /// # Errors
    /// Any [`Error`] for a store failure, or [`Error::MalformedRecord`] for a damaged object.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    async fn fenced_read(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error>;
}
