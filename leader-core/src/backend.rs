//! The contract between the core and a store: what a backend author implements, and the
//! helpers a backend uses ([`Call`] for its retries, [`encode_fenced`] for protected objects).

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

pub use crate::call::{
    Backoff, Call, DEFAULT_BUDGET, call_budget, call_deadline, may_retry, within,
};
use crate::config::Timing;
use crate::error::{ConfigError, Error};
use crate::model::{HolderId, LeaseKey, ObjectName};
pub use crate::model::{LeaseRecord, LeaseState, RecordParts, Revision, TermId, WriteNonce};
pub use crate::rand::Rng;
use crate::token::FencingToken;

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

impl Expected {
    /// Whether a record or object at revision `current` (`None`: there is none) meets this
    /// condition.
    pub fn matches(&self, current: Option<&Revision>) -> bool {
        match self {
            Expected::Absent => current.is_none(),
            Expected::Revision(r) => current == Some(r),
        }
    }
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
/// 4. **Never retry a conditional write blindly**, and end every call by its deadline
///    ([`call_deadline`], which the core sets per call with [`within`]; running the call
///    through [`Call`] does both). The core also cancels the call at that deadline; a
///    cancelled write is indeterminate.
/// 5. **Store the record as given** and return it from `read` unchanged, with a revision that
///    changes on every applied write and is never reused for another content of the same key
///    (so a stale revision cannot match by accident). Revisions are compared only for
///    equality. A store that enforces expiry ([`ExpiryModel::EnforcedByStore`]) may report a
///    record whose server-side lease is not active as [`LeaseState::Released`], with a
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
    /// A short name of the kind of store, the `backend` label of the suite's
    /// [metrics](crate::metrics): `memory`, `file`, `azure`, `dynamodb`, `gcs`, `etcd`,
    /// `zookeeper`. The default is `custom`.
    fn name(&self) -> &'static str {
        "custom"
    }

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
    /// [`LeaseState::Released`] unless, at the instant of the
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

    /// Reads the record of `key` as a waiting follower does, as cheaply as the store allows:
    /// [`IfChanged::Unchanged`] if its revision is still `known`, else what is there now.
    ///
    /// Followers call this every [`poll_every`](Timing::poll_every); [`read`](Self::read)
    /// stays the read that a writer and `status` rely on. The default reads and compares.
    ///
    /// # Contract
    /// Unlike `read`, this read may lag behind the latest write (an eventually consistent
    /// replica, a cache that a store keeps fresh), as long as:
    /// 1. **It never shows a revision before it was written.** Every revision it reports
    ///    (`known`, by answering `Unchanged`, or the one of the record it returns) had been
    ///    written when the answer left the store. Replication lag is fine; a guess is not.
    /// 2. **It catches up.** A revision written and left alone is reported within a short
    ///    time (the store's replication lag), so that followers see a release.
    /// 3. **Expiry as in `read`.** A store that enforces expiry reports the state of the
    ///    server lease as `read` does (a record whose lease is not active is released, with
    ///    its own revision).
    ///
    /// Why a lagging read is safe: a follower starts its ttl for a revision when a response
    /// first shows it, which by (1) is after the holder sent the write that made it, so the
    /// holder's deadline for that write (`t_sent + ttl - margin`) has passed once the follower
    /// has seen the revision unchanged for a ttl. A lag only makes a follower see a revision
    /// later, or longer than it lasted; and every takeover is a conditional write on the
    /// revision seen, which the store checks against its latest state, so a takeover based on
    /// an old revision fails.
    ///
    /// # Errors
    /// As [`read`](Self::read).
    ///
    /// # Cancel safety
    /// Cancel-safe: a read changes nothing.
    async fn read_if_changed(
        &self,
        key: &LeaseKey,
        known: Option<&Revision>,
    ) -> Result<IfChanged, Error> {
        Ok(IfChanged::compared(self.read(key).await?, known))
    }

    /// Hints that the record of `key` may have changed, for a store that can tell (a file
    /// system's change notifications, a watch): a waiting follower then reads at once instead
    /// of at its next poll. `None` (the default) if the store cannot tell; followers poll.
    ///
    /// A hint is only a reason to read: the core decides on what it reads, and keeps polling
    /// every [`poll_every`](Timing::poll_every) in case a hint is missed.
    fn changes(&self, key: &LeaseKey) -> Option<Changes> {
        let _ = key;
        None
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

/// What [`LeaseBackend::read_if_changed`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IfChanged {
    /// The record's revision is still the one the follower knows.
    Unchanged,
    /// The record now (`None`: there is none).
    Changed(Option<Stored>),
}

impl IfChanged {
    /// What a read that found `current` tells a follower who knows revision `known`.
    pub fn compared(current: Option<Stored>, known: Option<&Revision>) -> Self {
        match (&current, known) {
            (Some(s), Some(k)) if s.revision == *k => IfChanged::Unchanged,
            _ => IfChanged::Changed(current),
        }
    }
}

/// Hints from a store that a lease record may have changed; see [`LeaseBackend::changes`].
///
/// Made with [`Changes::channel`]: the store keeps the [`ChangeNotifier`] and calls
/// [`notify`](ChangeNotifier::notify) on a change, the core waits on
/// [`changed`](Changes::changed). Whatever must live as long as the hints (a file watcher)
/// goes in [`keep_alive`](Changes::keep_alive).
pub struct Changes {
    hints: tokio::sync::watch::Receiver<u64>,
    _alive: Option<Box<dyn Send + Sync>>,
}

/// The store's end of [`Changes`].
#[derive(Clone, Debug)]
pub struct ChangeNotifier(std::sync::Arc<tokio::sync::watch::Sender<u64>>);

impl ChangeNotifier {
    /// Wakes every follower waiting on the [`Changes`] of this notifier.
    pub fn notify(&self) {
        self.0.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Another [`Changes`] fed by this notifier.
    pub fn subscribe(&self) -> Changes {
        Changes {
            hints: self.0.subscribe(),
            _alive: None,
        }
    }
}

impl Changes {
    /// A notifier and the hints it sends.
    pub fn channel() -> (ChangeNotifier, Changes) {
        let (tx, hints) = tokio::sync::watch::channel(0);
        (
            ChangeNotifier(std::sync::Arc::new(tx)),
            Changes {
                hints,
                _alive: None,
            },
        )
    }

    /// Keeps `guard` alive as long as these hints.
    #[must_use]
    pub fn keep_alive(mut self, guard: impl Send + Sync + 'static) -> Self {
        self._alive = Some(Box::new(guard));
        self
    }

    /// Completes at the next hint after the last one seen; never, once the notifier is gone.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn changed(&mut self) {
        if self.hints.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl fmt::Debug for Changes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Changes").finish_non_exhaustive()
    }
}

/// The credentials of a fenced write: the lease, its holder, and the token the write stores as
/// the object's fence.
///
/// Usually the token is the lease term's own ([`Fence::new`]). A shard term writes the shard's
/// token while the lease that must still be live is the instance's membership: then
/// [`lease_term`](Self::lease_term) holds the membership term's token, and a store that also
/// checks the lease ([`FencedCas`], item 3) checks it against that token, not `token`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    /// The lease key of the term.
    pub key: LeaseKey,
    /// The holder of the term.
    pub holder: HolderId,
    /// The token written as the object's fence, and compared with the fence it has.
    pub token: FencingToken,
    /// The token of the lease term at `key` that must still be live, when it differs from
    /// `token` (a shard term: the lease is the instance's membership, `token` the shard's).
    /// `None`: the lease's term token is `token`.
    pub lease_term: Option<FencingToken>,
}

impl Fence {
    /// The fence of the term of `key` held by `holder` with `token`: the lease's term token and
    /// the written token are the same.
    pub fn new(key: LeaseKey, holder: HolderId, token: FencingToken) -> Self {
        Self {
            key,
            holder,
            token,
            lease_term: None,
        }
    }

    /// The token of the lease term that must still be live: [`lease_term`](Self::lease_term),
    /// else [`token`](Self::token).
    pub fn lease_token(&self) -> FencingToken {
        self.lease_term.unwrap_or(self.token)
    }
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
/// Implemented for every store that offers [`FencedCas`]: the fencing rule is the core's,
/// written once. A fenced write reads the object, refuses with [`Error::Fenced`] if a higher
/// token has written it, and otherwise writes the value and the writer's token as the new fence
/// on the condition that the object is still the one it read; if another writer got there
/// first, it reads again (a few rounds).
///
/// A fenced write ends by one deadline, all its calls included: the caller's ([`within`]),
/// else [`DEFAULT_BUDGET`] from its start.
#[async_trait]
pub trait FencedStore: Send + Sync + fmt::Debug {
    /// Writes `value` to `object` if `fence` is not stale.
    ///
    /// # Errors
    /// [`Error::Fenced`] if a higher token has written the object (or, on a store that checks
    /// the lease, if the lease's live term is no longer the fence's
    /// [lease token](Fence::lease_token) and holder); [`Error::MalformedRecord`] if the object
    /// was not written by a fenced write; [`Error::Unavailable`] if the object kept changing under
    /// the write; any other [`Error`] for a store failure (an [`Error::Indeterminate`] write
    /// may have been applied).
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

/// Rounds of read-then-write a fenced write tries while other writers change the object.
const FENCED_ROUNDS: usize = 4;

#[async_trait]
impl<S: FencedCas + ?Sized> FencedStore for S {
    async fn fenced_write(
        &self,
        fence: &Fence,
        object: &ObjectName,
        value: &[u8],
    ) -> Result<FencedObject, Error> {
        // The whole write (its reads, writes and rounds) has one deadline: the caller's, or
        // the default one.
        if !crate::call::in_scope() {
            let write = self.fenced_write(fence, object, value);
            return within(DEFAULT_BUDGET, write).await.unwrap_or_else(|_| {
                Err(Error::indeterminate(format!(
                    "the fenced write to {object} did not finish within {DEFAULT_BUDGET:?}"
                )))
            });
        }
        for _ in 0..FENCED_ROUNDS {
            let expected = match self.get_fenced(object).await? {
                Some(current) if current.fence > fence.token => {
                    return Err(Error::Fenced {
                        object: object.to_string(),
                        presented: fence.token,
                        highest: Some(current.fence),
                    });
                }
                Some(current) => Expected::Revision(current.revision),
                None => Expected::Absent,
            };
            let put = FencedPut::new(fence, object, &expected, value);
            match self.put_fenced_if(put).await? {
                ObjectWrite::Written(revision) => {
                    return Ok(FencedObject {
                        fence: fence.token,
                        value: value.to_vec(),
                        revision,
                    });
                }
                // Changed since we read it: read again and re-check the fence.
                ObjectWrite::Conflict => {}
            }
        }
        Err(Error::unavailable(format!(
            "the protected object {object} changed under {FENCED_ROUNDS} fenced writes in a row; \
             try again"
        )))
    }

    async fn fenced_read(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        self.get_fenced(object).await
    }
}

/// The outcome of a conditional write of a protected object that the store answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObjectWrite {
    /// Written; the object's new revision.
    Written(Revision),
    /// The object was not as expected; nothing was written.
    Conflict,
}

/// A store's compare-and-swap on protected objects: the primitive under [`FencedStore`].
///
/// # Contract
/// 1. [`get_fenced`](Self::get_fenced) returns the object's fence (the token of the write that
///    made it), value and a revision that changes on every applied write.
/// 2. [`put_fenced_if`](Self::put_fenced_if) stores the value with the fence's token as the
///    object's fence only if the object is as expected at the instant the write applies, atomically
///    (the store's conditional write: a generation, an ETag, a condition expression). A failed
///    condition is [`ObjectWrite::Conflict`] and writes nothing; an unknown outcome is
///    [`Error::Indeterminate`]; any other error promises that nothing was written. Never
///    retry it blindly: a late retry must still carry its condition.
/// 3. It may check more in the same atomic write (DynamoDB, etcd and ZooKeeper also check that
///    the lease at the fence's key is still the live term of its
///    [lease token](Fence::lease_token), DynamoDB with this holder) and refuse with
///    [`Error::Fenced`]. Such a check uses the lease token, never `token` itself: the two differ
///    for a shard term. Its [`Error::Fenced::highest`] names only a token of the object's own
///    series: a newer term's token when `lease_term` is `None`, else `None`. A put whose
///    [`lease_check`](FencedPut::lease_check) is `false` checks nothing but `expected`: it is
///    a plain compare-and-swap of the object (the records of an election over several stores,
///    whose lease lives in no one store).
///
/// The fencing rule itself (refuse a token below the object's fence, re-read on a conflict)
/// is the core's, in the [`FencedStore`] implementation every `FencedCas` gets.
#[async_trait]
pub trait FencedCas: Send + Sync + fmt::Debug {
    /// Reads a protected object, or `None` if there is none.
    ///
    /// # Errors
    /// [`Error::MalformedRecord`] naming the object if it was not written by a fenced write;
    /// any other [`Error`] for a store failure.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error>;

    /// Writes `put.value` with `put.fence.token` as the fence if `put.object` is as
    /// `put.expected`.
    ///
    /// # Errors
    /// [`Error::Indeterminate`] if the write may have been applied; [`Error::Fenced`] if the
    /// store checked the lease too and it is no longer the fence's; any other error means it
    /// was not applied.
    ///
    /// # Cancel safety
    /// Not cancel-safe: a cancelled write may still be applied (with its condition).
    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error>;
}

/// One conditional write of a protected object: store `value` with `fence.token` as the
/// object's fence if the object is as `expected`.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct FencedPut<'a> {
    /// The writer's lease, holder and token.
    pub fence: &'a Fence,
    /// The protected object.
    pub object: &'a ObjectName,
    /// The condition: the object absent, or at the revision the writer read.
    pub expected: &'a Expected,
    /// The new content.
    pub value: &'a [u8],
    /// Whether a store that can also check the fence's lease in the same write does so
    /// ([`FencedCas`], item 3). `true` unless built with
    /// [`without_lease_check`](Self::without_lease_check).
    pub lease_check: bool,
}

impl<'a> FencedPut<'a> {
    /// A write of `value` to `object` by `fence` on condition `expected`.
    pub fn new(
        fence: &'a Fence,
        object: &'a ObjectName,
        expected: &'a Expected,
        value: &'a [u8],
    ) -> Self {
        Self {
            fence,
            object,
            expected,
            value,
            lease_check: true,
        }
    }

    /// The same write, conditional on `expected` alone: no store checks the fence's lease.
    /// For objects whose writer's lease lives in no one store (an election over several
    /// stores); the fence's token is still stored as the object's fence.
    pub fn without_lease_check(mut self) -> Self {
        self.lease_check = false;
        self
    }
}

/// The first line of a protected object stored as bytes, before the token.
const FENCE_HEADER: &str = "leader-fence v1 ";

/// A protected object as bytes, for stores that keep the fence in the body (the file store,
/// GCS): the line `leader-fence v1 <token>`, then the value.
pub fn encode_fenced(token: FencingToken, value: &[u8]) -> Vec<u8> {
    let mut bytes = format!("{FENCE_HEADER}{token}\n").into_bytes();
    bytes.extend_from_slice(value);
    bytes
}

/// Reads what [`encode_fenced`] wrote; `name` names the object in errors, `revision` is the
/// store's revision of these bytes.
///
/// # Errors
/// [`Error::MalformedRecord`] naming the object if the bytes do not start with a fence line.
pub fn decode_fenced(name: &str, bytes: &[u8], revision: Revision) -> Result<FencedObject, Error> {
    let malformed = |detail: &str| Error::MalformedRecord {
        key: name.to_owned(),
        detail: format!("{detail}; it was not written by a fenced write"),
    };
    let newline = bytes
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| malformed("it has no fence line"))?;
    let token = std::str::from_utf8(&bytes[..newline])
        .ok()
        .and_then(|line| line.strip_prefix(FENCE_HEADER))
        .and_then(|t| t.parse::<u64>().ok())
        .ok_or_else(|| malformed("its first line is not `leader-fence v1 <token>`"))?;
    Ok(FencedObject {
        fence: FencingToken(token),
        value: bytes[newline + 1..].to_vec(),
        revision,
    })
}

/// Checks a prefix of object names (a folder such as `prod/leases/`, or any start of a name):
/// at most 512 bytes of printable ASCII without spaces, `#`, `?`, `[`, `]`, `*` and `\\`, not
/// starting with `.` or `/`. Blob and object stores put a store's objects under it.
///
/// # Errors
/// [`ConfigError::InvalidName`] saying what is wrong.
pub fn check_prefix(prefix: &str) -> Result<(), ConfigError> {
    let invalid = |reason: &str| ConfigError::InvalidName {
        what: "object prefix",
        name: prefix.to_owned(),
        reason: reason.to_owned(),
    };
    if prefix.len() > 512 {
        return Err(invalid("it is longer than 512 bytes"));
    }
    if prefix.starts_with('.') || prefix.starts_with('/') {
        return Err(invalid("it starts with '.' or '/'"));
    }
    if !prefix
        .bytes()
        .all(|b| b.is_ascii_graphic() && !matches!(b, b'#' | b'?' | b'[' | b']' | b'*' | b'\\'))
    {
        return Err(invalid(
            "use printable ASCII without spaces, '#', '?', '[', ']', '*' and '\\'",
        ));
    }
    Ok(())
}

/// A store for sharded leadership and for elections over several stores: leases
/// ([`LeaseBackend`]) and conditional objects ([`FencedCas`]). Every store of the suite is one; an `Arc` of any of them, or of a `dyn`
/// store trait that has this one as a supertrait, converts to `Arc<dyn ShardStore>`.
pub trait ShardStore: LeaseBackend + FencedCas {
    /// The store as a lease backend.
    fn leases(self: Arc<Self>) -> Arc<dyn LeaseBackend>;
    /// The store as a conditional object store.
    fn objects(self: Arc<Self>) -> Arc<dyn FencedCas>;
}

impl<T: LeaseBackend + FencedCas + 'static> ShardStore for T {
    fn leases(self: Arc<Self>) -> Arc<dyn LeaseBackend> {
        self
    }
    fn objects(self: Arc<Self>) -> Arc<dyn FencedCas> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store whose conditional puts never answer.
    #[derive(Debug)]
    struct Hangs;

    #[async_trait]
    impl FencedCas for Hangs {
        async fn get_fenced(&self, _: &ObjectName) -> Result<Option<FencedObject>, Error> {
            Ok(None)
        }
        async fn put_fenced_if(&self, _: FencedPut<'_>) -> Result<ObjectWrite, Error> {
            std::future::pending().await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_fenced_write_ends_by_one_deadline_even_outside_within() {
        let fence = Fence::new(
            LeaseKey::new("k").unwrap(),
            HolderId::new("a").unwrap(),
            FencingToken(1),
        );
        let object = ObjectName::new("o").unwrap();
        let started = tokio::time::Instant::now();
        let write = Hangs.fenced_write(&fence, &object, b"v");
        let r = tokio::time::timeout(DEFAULT_BUDGET * 2, write).await;
        let err = r.expect("ended by its own deadline").unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Indeterminate, "{err}");
        assert_eq!(started.elapsed(), DEFAULT_BUDGET);
        // Inside within, the caller's deadline holds.
        let started = tokio::time::Instant::now();
        let short = std::time::Duration::from_millis(300);
        let r = within(short, Hangs.fenced_write(&fence, &object, b"v")).await;
        assert!(r.is_err());
        assert_eq!(started.elapsed(), short);
    }

    #[test]
    fn prefixes_are_checked() {
        for ok in ["", "leader-lease/", "prod/leases/", "x-"] {
            assert!(check_prefix(ok).is_ok(), "{ok}");
        }
        for bad in ["/x", ".x", "a b", "a#b", "a?b", "a\\b"] {
            assert!(check_prefix(bad).is_err(), "{bad}");
        }
        assert!(check_prefix(&"a".repeat(513)).is_err());
    }

    #[test]
    fn a_fenced_body_round_trips_and_a_damaged_one_names_the_object() {
        let rev = Revision::new("r");
        let bytes = encode_fenced(FencingToken(7), b"pay\nload");
        let ok = decode_fenced("o", &bytes, rev.clone()).unwrap();
        assert_eq!(
            (ok.fence, ok.value, ok.revision),
            (FencingToken(7), b"pay\nload".to_vec(), rev.clone())
        );
        for damaged in [&b"nonsense"[..], b"leader-fence v1 x\n", b"other 7\nv"] {
            let err = decode_fenced("orders", damaged, rev.clone()).unwrap_err();
            assert!(err.to_string().contains("orders"), "{err}");
        }
    }
}
