//! One member store of a quorum, as one candidate sees it: what it last read there and since
//! when, its own last write there, and the calls (each bounded by the request timeout): read
//! the term record and the token high-water mark, raise the mark, write a term record on a
//! condition, and resolve a write whose answer was lost.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::debug;

use super::record::{Names, Record};
use crate::backend::{Expected, Fence, FencedCas, FencedObject, FencedPut, ObjectWrite, Revision};
use crate::error::{Error, ErrorKind};
use crate::metrics::{Op, StoreMetrics};
use crate::model::{HolderId, LeaseKey, ObjectName};
use crate::token::FencingToken;

/// A record as a read found it.
#[derive(Clone, Debug)]
pub(crate) enum Found {
    Absent,
    Record {
        record: Record,
        token: u64,
        revision: Revision,
    },
    /// Not a term record: never written over (an operator deletes it). What is wrong.
    Damaged {
        key: String,
        detail: String,
    },
}

/// What one member answered to a read.
#[derive(Clone, Debug)]
pub(crate) struct Answer {
    pub(crate) found: Found,
    /// The token high-water mark and its revision (`None`: absent), if it was read.
    pub(crate) high: Option<Option<(u64, Revision)>>,
    /// The member's identity, if it was read (created if absent).
    pub(crate) id: Option<String>,
    /// The revision of a record stamped with another identity (written before the member
    /// was emptied, landing late): it reads as absent, and a write where the record is
    /// absent is conditioned on this revision instead (else it would never apply).
    pub(crate) record_over: Option<Revision>,
    /// The same for a mark of another identity.
    pub(crate) mark_over: Option<Revision>,
    /// The highest token of those objects: not the member's history, but tokens some term
    /// minted, so they raise the floor of the next.
    pub(crate) over_top: u64,
    /// When the answer came.
    pub(crate) at: Instant,
}

/// A token mark as a raise starts from it.
#[derive(Clone, Debug, Default)]
pub(crate) struct MarkSeen {
    /// The member's own mark: its token and revision.
    pub(crate) ours: Option<(u64, Revision)>,
    /// The revision of a mark of another identity standing where ours is absent.
    pub(crate) over: Option<Revision>,
}

impl Answer {
    /// The highest token this answer shows: the record's and the mark's.
    pub(crate) fn top(&self) -> u64 {
        let record = match &self.found {
            Found::Record { token, .. } => *token,
            _ => 0,
        };
        let high = self.mark().map_or(0, |(t, _)| t);
        record.max(high).max(self.over_top)
    }

    /// Whether a record or mark of another identity stands there: the key has a history
    /// (perhaps a live term whose writer has not seen the member's new identity yet).
    pub(crate) fn has_foreign(&self) -> bool {
        self.record_over.is_some() || self.mark_over.is_some()
    }

    /// The token mark as read, if it was read and exists.
    pub(crate) fn mark(&self) -> Option<(u64, Revision)> {
        self.high.clone().flatten()
    }

    /// The mark, for a raise.
    pub(crate) fn mark_seen(&self) -> MarkSeen {
        MarkSeen {
            ours: self.mark(),
            over: self.mark_over.clone(),
        }
    }

    /// The condition of a write where the record reads as absent.
    pub(crate) fn absent(&self) -> Expected {
        self.record_over
            .clone()
            .map_or(Expected::Absent, Expected::Revision)
    }

    /// Shows no history of the key at all: no record, and no mark (if the mark was read).
    pub(crate) fn is_empty(&self) -> bool {
        matches!(self.found, Found::Absent) && matches!(self.high, Some(None))
    }
}

/// The record last seen on a member, and since when (the local time of the first answer that
/// showed its revision).
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) revision: Revision,
    pub(crate) token: u64,
    pub(crate) since: Instant,
}

/// This candidate's last acknowledged write on a member.
#[derive(Clone, Debug)]
pub(crate) struct Own {
    pub(crate) revision: Revision,
    /// The term it wrote.
    pub(crate) term: String,
    /// When the write was sent: with the ttl, the member's deadline for that term.
    pub(crate) sent: Instant,
    /// Held (or the release of the term).
    pub(crate) held: bool,
}

/// A member store and what this candidate knows of it.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) name: String,
    pub(crate) cas: Arc<dyn FencedCas>,
    pub(crate) metrics: StoreMetrics,
    pub(crate) seen: Option<Seen>,
    pub(crate) own: Option<Own>,
    pub(crate) id: Option<String>,
    /// The revision of the record of another member set last seen here, if it was one.
    pub(crate) foreign: Option<Revision>,
}

impl Member {
    /// Notes what an answer showed: a new revision starts a new observation, the same one
    /// keeps its first sight; a revision other than our last write means ours is no longer
    /// the record there.
    pub(crate) fn note(&mut self, answer: &Answer) {
        match &answer.found {
            Found::Record {
                token, revision, ..
            } => {
                if self.seen.as_ref().is_none_or(|s| s.revision != *revision) {
                    self.seen = Some(Seen {
                        revision: revision.clone(),
                        token: *token,
                        since: answer.at,
                    });
                }
                if self.own.as_ref().is_some_and(|o| o.revision != *revision) {
                    self.own = None;
                }
            }
            Found::Absent => {
                self.seen = None;
                self.own = None;
            }
            Found::Damaged { .. } => {
                self.seen = None;
                self.own = None;
            }
        }
        if let Some(id) = &answer.id {
            self.id = Some(id.clone());
        }
    }

    /// Notes a write of ours that the member acknowledged.
    pub(crate) fn wrote(&mut self, record: &Record, token: u64, revision: Revision, sent: Instant) {
        let now = Instant::now();
        self.seen = Some(Seen {
            revision: revision.clone(),
            token,
            since: now,
        });
        self.own = Some(Own {
            revision,
            term: record.term.clone(),
            sent,
            held: record.is_held(),
        });
    }
}

/// The calls of one member, owned so that several run at once.
#[derive(Clone, Debug)]
pub(crate) struct Io {
    pub(crate) name: String,
    pub(crate) cas: Arc<dyn FencedCas>,
    pub(crate) metrics: StoreMetrics,
    pub(crate) names: Names,
    pub(crate) fence: Fence,
    pub(crate) timeout: Duration,
    pub(crate) timeout_named: Duration,
    /// The member's identity as last read: the stamp of what this candidate writes there, and
    /// what a record or mark read there must carry.
    pub(crate) id: Option<String>,
}

/// What a conditional write of a term record came to.
#[derive(Clone, Debug)]
pub(crate) enum Wrote {
    Written(Revision),
    /// The record was not as expected: nothing written.
    Conflict,
    /// The store refused or failed it: nothing written, and it will not land.
    Failed,
    /// Not known: it may land later (conditional as ever).
    Unknown,
}

impl Io {
    pub(crate) fn for_member(
        member: &Member,
        names: &Names,
        key: &LeaseKey,
        holder: &HolderId,
        timeout: Duration,
        timeout_named: Duration,
    ) -> Self {
        Self {
            name: member.name.clone(),
            cas: member.cas.clone(),
            metrics: member.metrics.clone(),
            names: names.clone(),
            fence: Fence::new(key.clone(), holder.clone(), FencingToken(0)),
            timeout,
            timeout_named,
            id: member.id.clone(),
        }
    }

    async fn get(&self, op: Op, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        self.metrics
            .call(op, self.timeout, self.cas.get_fenced(object))
            .await
            .map_err(|_| Error::Timeout {
                operation: "reading a quorum member",
                after: self.timeout_named,
            })?
    }

    async fn put(
        &self,
        op: Op,
        object: &ObjectName,
        token: u64,
        expected: &Expected,
        value: &[u8],
    ) -> Result<ObjectWrite, Error> {
        let fence = Fence {
            token: FencingToken(token),
            ..self.fence.clone()
        };
        let put = FencedPut::new(&fence, object, expected, value).without_lease_check();
        match self
            .metrics
            .call(op, self.timeout, self.cas.put_fenced_if(put))
            .await
        {
            Ok(result) => result,
            Err(_) => Err(Error::Indeterminate {
                message: format!("a write to {object} on {} timed out", self.name),
                source: None,
            }),
        }
    }

    /// Reads the term record; in a full round first the member's identity (drawn and written
    /// if there is none) and then the mark too. A record or mark stamped with another identity
    /// than the member's (written before the member was emptied, and landing late) reads as
    /// absent.
    pub(crate) async fn read(mut self, full: bool) -> Result<Answer, Error> {
        let id = if full {
            let id = self.identity().await?;
            self.id = Some(id.clone());
            Some(id)
        } else {
            None
        };
        self.read_with(full, id).await
    }

    /// As [`read`](Self::read) in a full round, for an operator's look: the identity is read,
    /// never written (a member without one shows its objects unchecked).
    pub(crate) async fn look(mut self) -> Result<Answer, Error> {
        let id = self
            .get(Op::Read, &self.names.id)
            .await?
            .map(|o| String::from_utf8_lossy(&o.value).into_owned());
        self.id.clone_from(&id);
        self.read_with(true, id).await
    }

    async fn read_with(self, full: bool, id: Option<String>) -> Result<Answer, Error> {
        let mut record_over = None;
        let mut over_top = 0;
        let found = match self.get(Op::Read, &self.names.record).await? {
            None => Found::Absent,
            Some(o) => match Record::decode(&self.names.record, &self.name, &o.value) {
                Ok(record) if self.id.as_ref().is_some_and(|id| record.stamp != *id) => {
                    debug!(member = %self.name, "a record written before the member was emptied: absent");
                    over_top = o.fence.get();
                    record_over = Some(o.revision);
                    Found::Absent
                }
                Ok(record) => Found::Record {
                    record,
                    token: o.fence.get(),
                    revision: o.revision,
                },
                Err(Error::MalformedRecord { key, detail }) => Found::Damaged { key, detail },
                Err(e) => Found::Damaged {
                    key: self.names.record.to_string(),
                    detail: e.to_string(),
                },
            },
        };
        let mut mark_over = None;
        let high = if full {
            let mark = self.get(Op::Read, &self.names.high).await?;
            Some(match mark {
                Some(o) if self.id.as_ref().is_some_and(|id| o.value != id.as_bytes()) => {
                    over_top = over_top.max(o.fence.get());
                    mark_over = Some(o.revision);
                    None
                }
                o => o.map(|o| (o.fence.get(), o.revision)),
            })
        } else {
            None
        };
        Ok(Answer {
            found,
            high,
            id,
            record_over,
            mark_over,
            over_top,
            at: Instant::now(),
        })
    }

    /// The member's identity: read, or drawn and written if there is none.
    async fn identity(&self) -> Result<String, Error> {
        for _ in 0..3 {
            if let Some(o) = self.get(Op::Read, &self.names.id).await? {
                return Ok(String::from_utf8_lossy(&o.value).into_owned());
            }
            let drawn = {
                let mut rng = crate::rand::Rng::from_entropy();
                super::record::term_id(rng.next_u64(), rng.next_u64())
            };
            match self
                .put(
                    Op::Acquire,
                    &self.names.id,
                    0,
                    &Expected::Absent,
                    drawn.as_bytes(),
                )
                .await
            {
                Ok(ObjectWrite::Written(_)) => return Ok(drawn),
                Ok(ObjectWrite::Conflict) => {}
                Err(e) if e.kind() == ErrorKind::Indeterminate => {}
                Err(e) => return Err(e),
            }
        }
        Err(Error::unavailable(format!(
            "could not read or write the identity of quorum member {}",
            self.name
        )))
    }

    /// Raises the token mark to `token`, from `known` (as the round read it; `None` absent,
    /// or stamped with another identity). `Ok(true)` once the mark is at `token` (or, with
    /// `at_least`, at or above it); `Ok(false)` if it is above (another candidate is ahead
    /// there). Tries `attempts` times.
    pub(crate) async fn raise(
        &self,
        token: u64,
        seen: MarkSeen,
        attempts: usize,
        at_least: bool,
    ) -> Result<bool, Error> {
        let MarkSeen {
            ours: mut known,
            mut over,
        } = seen;
        let stamp = self.id.clone().unwrap_or_default();
        for _ in 0..attempts {
            match known.as_ref().map(|(t, _)| *t) {
                Some(t) if t > token => return Ok(at_least),
                Some(t) if t == token => return Ok(true),
                _ => {}
            }
            let expected = match (&known, &over) {
                (Some((_, r)), _) | (None, Some(r)) => Expected::Revision(r.clone()),
                (None, None) => Expected::Absent,
            };
            match self
                .put(
                    Op::Acquire,
                    &self.names.high,
                    token,
                    &expected,
                    stamp.as_bytes(),
                )
                .await
            {
                Ok(ObjectWrite::Written(_)) => return Ok(true),
                Ok(ObjectWrite::Conflict) => {}
                Err(e) if e.kind() == ErrorKind::Indeterminate => {}
                Err(e) => return Err(e),
            }
            // Changed meanwhile, or not known: look again (a mark at `token` is ours, or of
            // a rival with the same token, which the records' writes then decide between).
            (known, over) = match self.get(Op::Read, &self.names.high).await? {
                Some(o) if o.value == stamp.as_bytes() => (Some((o.fence.get(), o.revision)), None),
                Some(o) => {
                    // The member's identity changed since this candidate read it (it was
                    // emptied): the mark may be its real one, never lowered by a stale
                    // stamp. The next full round reads the identity again.
                    let id = self.get(Op::Read, &self.names.id).await?;
                    if id.is_none_or(|id| id.value == o.value) {
                        return Ok(false);
                    }
                    (None, Some(o.revision))
                }
                None => (None, None),
            };
        }
        Ok(known.is_some_and(|(t, _)| t == token || (at_least && t > token)))
    }

    /// The condition that matches the record as it is now (for the planted blind renew).
    pub(crate) async fn current(&self) -> Option<Expected> {
        match self.get(Op::Read, &self.names.record).await {
            Ok(Some(o)) => Some(Expected::Revision(o.revision)),
            Ok(None) => Some(Expected::Absent),
            Err(_) => None,
        }
    }

    /// Writes `record` with `token` on `expected`; a write whose answer was lost is resolved
    /// by reading the record back (our bytes there: written).
    pub(crate) async fn write(
        &self,
        op: Op,
        record: &Record,
        token: u64,
        expected: &Expected,
    ) -> Wrote {
        let stamped = Record {
            stamp: self.id.clone().unwrap_or_default(),
            ..record.clone()
        };
        let bytes = stamped.encode();
        match self
            .put(op, &self.names.record, token, expected, &bytes)
            .await
        {
            Ok(ObjectWrite::Written(revision)) => Wrote::Written(revision),
            Ok(ObjectWrite::Conflict) => Wrote::Conflict,
            Err(e) if e.kind() != ErrorKind::Indeterminate => {
                debug!(member = %self.name, error = %e, "a term write failed");
                Wrote::Failed
            }
            Err(e) => {
                debug!(member = %self.name, error = %e, "a term write's outcome is unknown; re-reading");
                match self.get(Op::Read, &self.names.record).await {
                    Ok(Some(o)) if o.value == bytes => Wrote::Written(o.revision),
                    _ => Wrote::Unknown,
                }
            }
        }
    }
}
