//! The lease store on etcd: one key per lease, attached to an etcd lease per term.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leader_core::backend::{
    Call, ChangeNotifier, Changes, Expected, ExpiryModel, FencedCas, FencedPut, IfChanged,
    LeaseRecord, LeaseState, ObjectWrite, Revision, Stored, TermId, WriteKind, WriteOutcome,
    WriteRequest, decode_fenced, encode_fenced,
};
use leader_core::{Error, FencedObject, FencingToken, LeaseBackend, LeaseKey, ObjectName};
use tracing::{debug, warn};

use crate::error::{Effect, is_lease_exists, is_lease_not_found, to_error};
use crate::rpc::Rpc;
use crate::wire::{Compare, KeyValue, RequestOp, TxnRequest, TxnResponse};

/// The suffix of the revision of a record that is not held (no live lease, or, read for a
/// term, not that term's lease): the same content reads with another revision when held.
const NOT_HELD: &str = "r";
/// How long a best-effort revoke of an unused lease may take.
const REVOKE_BUDGET: Duration = Duration::from_secs(2);
/// The longest pause between attempts to re-establish a watch.
const WATCH_PAUSE_MAX: Duration = Duration::from_secs(2);

/// A lease store on etcd, with etcd's own leases enforcing expiry.
///
/// Build it with [`EtcdStore::builder`]. Cloning is cheap; clones share the connection.
#[derive(Clone)]
pub struct EtcdStore {
    rpc: Rpc,
    prefix: Arc<str>,
    endpoints: Arc<[String]>,
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// The etcd lease id of a term: its [`TermId`] folded into a positive `i64` (etcd's lease ids
/// are positive), so that a retried grant of the same term proposes the same id.
pub(crate) fn lease_id(term: TermId) -> i64 {
    let folded = (term.0 as u64 ^ (term.0 >> 64) as u64) & (i64::MAX as u64);
    i64::try_from(folded.max(1)).unwrap_or(1)
}

/// A ttl as whole seconds of an etcd lease, rounded up (etcd's leases last whole seconds; a
/// longer server lease only makes followers wait longer, never the holder act longer).
pub(crate) fn lease_secs(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

/// The mod revision in a revision this store made.
fn mod_revision(revision: &Revision) -> Result<i64, Error> {
    let s = revision.as_str();
    s.strip_suffix(NOT_HELD)
        .unwrap_or(s)
        .parse()
        .map_err(|_| Error::backend(format!("{s:?} is not an etcd revision"), "bad revision"))
}

impl EtcdStore {
    pub(crate) fn new(rpc: Rpc, prefix: String, endpoints: Vec<String>) -> Self {
        Self {
            rpc,
            prefix: prefix.into(),
            endpoints: endpoints.into(),
        }
    }

    /// A builder; see [`EtcdBuilder`](crate::EtcdBuilder).
    pub fn builder() -> crate::EtcdBuilder {
        crate::EtcdBuilder::new()
    }

    /// The etcd key of the lease record of `key`: the prefix, then the key.
    pub fn lease_key(&self, key: &LeaseKey) -> String {
        format!("{}{}", self.prefix, key.as_str())
    }

    /// The etcd key of a protected object: the prefix, then `.{name}.fenced` (lease keys never
    /// start with `.`, so the two cannot meet).
    pub fn object_key(&self, object: &ObjectName) -> String {
        format!("{}.{}.fenced", self.prefix, object.as_str())
    }

    /// The key prefix this store works under.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The record in `kv`, with the etcd facts that decide it: its token is the key's create
    /// revision, and it is held only while attached to a lease (to `term_lease`, if given).
    fn stored(key: &LeaseKey, kv: &KeyValue, term_lease: Option<i64>) -> Result<Stored, Error> {
        let mut record = LeaseRecord::from_json(key.as_str(), &kv.value)?;
        record.token = FencingToken(u64::try_from(kv.create_revision).unwrap_or(0));
        let held = kv.lease != 0 && term_lease.is_none_or(|l| l == kv.lease);
        let revision = if held {
            kv.mod_revision.to_string()
        } else {
            record.state = LeaseState::Released;
            format!("{}{NOT_HELD}", kv.mod_revision)
        };
        Ok(Stored {
            record,
            revision: Revision::new(revision),
        })
    }

    async fn get(
        &self,
        key: &str,
        serializable: bool,
        what: &'static str,
    ) -> Result<Option<KeyValue>, Error> {
        let rpc = &self.rpc;
        Call::read(what)
            .run(|left| async move {
                rpc.get(key.as_bytes(), serializable, left)
                    .await
                    .map(|(kv, _)| kv)
                    .map_err(|s| to_error(s, what, Effect::None))
            })
            .await
    }

    async fn txn(&self, txn: &TxnRequest, what: &'static str) -> Result<TxnResponse, Error> {
        let rpc = &self.rpc;
        Call::write(what)
            .run(|left| async move {
                rpc.txn(txn.clone(), left)
                    .await
                    .map_err(|s| to_error(s, what, Effect::MayHaveApplied))
            })
            .await
    }

    /// The conflict of a failed transaction whose failure branch read the lease key first. If
    /// `unused` is a lease the write would have attached and the key is not attached to it,
    /// that lease is revoked (a lease the key still has is the term's own: kept).
    fn conflict(&self, key: &LeaseKey, answer: &TxnResponse, unused: Option<i64>) -> WriteOutcome {
        let kv = answer.range(0);
        if let Some(lease) = unused
            && kv.is_none_or(|kv| kv.lease != lease)
        {
            self.revoke_later(lease);
        }
        // A record that cannot be parsed is still a conflict (and is never written over).
        let current = kv.and_then(|kv| Self::stored(key, kv, None).ok());
        WriteOutcome::Conflict { current }
    }

    /// Revokes a lease this store granted but no longer needs, in the background: it would
    /// expire by itself after its ttl.
    fn revoke_later(&self, lease: i64) {
        let rpc = self.rpc.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                // Bounded even while no endpoint answers (the channel then waits to connect).
                match tokio::time::timeout(REVOKE_BUDGET, rpc.revoke(lease, REVOKE_BUDGET)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        debug!(lease, error = %e, "could not revoke an unused etcd lease; it expires by itself");
                    }
                    Err(_) => debug!(lease, "revoking an unused etcd lease timed out; it expires by itself"),
                }
            });
        }
    }

    async fn acquire(&self, request: &WriteRequest) -> Result<WriteOutcome, Error> {
        let key = self.lease_key(&request.key);
        let k = key.as_bytes();
        if let Expected::Revision(revision) = &request.expected {
            // The record of an ended term (ours), or one not attached to a lease: delete it,
            // so that the new term creates the key and gets a new create revision (its token).
            // If a later step fails, the error does not mention this delete: harmless, since
            // it removed a record that every candidate may take at once, as if absent.
            let clear = TxnRequest {
                compare: vec![Compare::modified_at(k, mod_revision(revision)?)],
                success: vec![RequestOp::delete(k)],
                failure: vec![RequestOp::get(k)],
            };
            let answer = self
                .txn(&clear, "deleting an ended term's lease key")
                .await?;
            if !answer.succeeded {
                return Ok(self.conflict(&request.key, &answer, None));
            }
        }
        let lease = lease_id(request.term);
        let secs = lease_secs(request.record.ttl);
        let rpc = &self.rpc;
        let granted = Call::write("granting an etcd lease")
            .run(|left| async move {
                match rpc.grant(lease, secs, left).await {
                    Ok(ttl) => Ok(ttl),
                    // Granted by an earlier attempt of this call, whose answer was lost.
                    Err(s) if is_lease_exists(&s) => Ok(secs),
                    // A grant with a proposed id is safe to repeat.
                    Err(s) => Err(to_error(s, "granting an etcd lease", Effect::None)),
                }
            })
            .await?;
        if granted < secs {
            self.revoke_later(lease);
            return Err(Error::InvalidConfig {
                message: format!(
                    "etcd granted a lease of {granted} s for a ttl of {secs} s; the holder would \
                     outlive its lease"
                ),
                source: None,
            });
        }
        let create = TxnRequest {
            compare: vec![Compare::created_at(k, 0)],
            success: vec![RequestOp::put(k, request.record.to_json(), lease)],
            failure: vec![RequestOp::get(k)],
        };
        let answer = self.txn(&create, "creating the lease key").await?;
        if !answer.succeeded {
            return Ok(self.conflict(&request.key, &answer, Some(lease)));
        }
        let created = answer.revision();
        let token = u64::try_from(created).unwrap_or(0);
        if token < request.record.token.0 {
            // Revisions only grow, so this is a cluster restored from an old backup or
            // replaced by a new one: tokens would go backwards. Give the key up.
            self.revoke_later(lease);
            return Err(Error::InvalidConfig {
                message: format!(
                    "etcd's revision ({created}) is below a fencing token already seen on {key} \
                     ({}): was the cluster restored from a backup or replaced? Fencing tokens \
                     would go backwards; delete the protected objects' fences or use a new key \
                     prefix",
                    request.record.token
                ),
                source: None,
            });
        }
        let mut record = request.record.clone();
        record.token = FencingToken(token);
        Ok(WriteOutcome::Written(Stored {
            record,
            revision: Revision::new(created.to_string()),
        }))
    }

    async fn renew(&self, request: &WriteRequest) -> Result<WriteOutcome, Error> {
        let Expected::Revision(revision) = &request.expected else {
            return Ok(WriteOutcome::Conflict { current: None });
        };
        let key = self.lease_key(&request.key);
        let k = key.as_bytes();
        let lease = lease_id(request.term);
        let rpc = &self.rpc;
        // First the lease (etcd restarts its ttl when the leader receives this, after we sent
        // it), then the record, on the revision we last wrote: that also proves the key is
        // still this term's (revisions are unique across the cluster).
        let ttl = Call::write("refreshing the etcd lease")
            .run(|left| async move {
                match rpc.keep_alive(lease, left).await {
                    Ok(ttl) => Ok(ttl),
                    Err(s) if is_lease_not_found(&s) => Ok(0),
                    // A refresh is safe to repeat: it only extends the lease.
                    Err(s) => Err(to_error(s, "refreshing the etcd lease", Effect::None)),
                }
            })
            .await?;
        if ttl <= 0 {
            return Ok(WriteOutcome::Conflict { current: None });
        }
        let put = TxnRequest {
            compare: vec![Compare::modified_at(k, mod_revision(revision)?)],
            success: vec![RequestOp::put(k, request.record.to_json(), lease)],
            failure: vec![RequestOp::get(k)],
        };
        let put = &put;
        let answer = Call::write("rewriting the lease key")
            .run(|left| async move {
                match rpc.txn(put.clone(), left).await {
                    Ok(answer) => Ok(Some(answer)),
                    // The lease ended between the refresh and the write: etcd refused the
                    // write whole.
                    Err(s) if is_lease_not_found(&s) => Ok(None),
                    Err(s) => Err(to_error(
                        s,
                        "rewriting the lease key",
                        Effect::MayHaveApplied,
                    )),
                }
            })
            .await?;
        let Some(answer) = answer else {
            return Ok(WriteOutcome::Conflict { current: None });
        };
        if !answer.succeeded {
            return Ok(self.conflict(&request.key, &answer, Some(lease)));
        }
        Ok(WriteOutcome::Written(Stored {
            record: request.record.clone(),
            revision: Revision::new(answer.revision().to_string()),
        }))
    }

    async fn release(&self, request: &WriteRequest) -> Result<WriteOutcome, Error> {
        let Expected::Revision(revision) = &request.expected else {
            return Ok(WriteOutcome::Conflict { current: None });
        };
        let key = self.lease_key(&request.key);
        let k = key.as_bytes();
        let lease = lease_id(request.term);
        // The released record stays (detached from any lease, so it reads released, with its
        // token: the create revision does not change), on the revision this term wrote; then
        // the term's lease, now holding nothing, is revoked.
        let put = TxnRequest {
            compare: vec![Compare::modified_at(k, mod_revision(revision)?)],
            success: vec![RequestOp::put(k, request.record.to_json(), 0)],
            failure: vec![RequestOp::get(k)],
        };
        let answer = self.txn(&put, "releasing the lease key").await?;
        if !answer.succeeded {
            return Ok(self.conflict(&request.key, &answer, Some(lease)));
        }
        self.revoke_later(lease);
        Ok(WriteOutcome::Written(Stored {
            record: request.record.clone(),
            revision: Revision::new(format!("{}{NOT_HELD}", answer.revision())),
        }))
    }
}

/// Aborts the watch task when the hints it feeds are dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Keeps a watch on `key` and wakes the followers on every change, and after every
/// (re)connection, since changes may have been missed in between.
async fn watch(rpc: Rpc, key: Vec<u8>, notifier: ChangeNotifier) {
    let mut pause = Duration::from_millis(100);
    loop {
        match rpc.watch(&key, Duration::from_secs(2)).await {
            Ok(mut stream) => loop {
                match stream.message().await {
                    Ok(Some(answer)) => {
                        if answer.created {
                            pause = Duration::from_millis(100);
                        }
                        if answer.created || !answer.events.is_empty() {
                            notifier.notify();
                        }
                        if answer.canceled {
                            debug!(reason = %answer.cancel_reason, "etcd cancelled the watch");
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(status) => {
                        debug!(error = %status, "the etcd watch failed; watching again");
                        break;
                    }
                }
            },
            Err(status) => debug!(error = %status, "could not watch the lease key"),
        }
        notifier.notify();
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(WATCH_PAUSE_MAX);
    }
}

#[async_trait]
impl LeaseBackend for EtcdStore {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn expiry_model(&self) -> ExpiryModel {
        ExpiryModel::EnforcedByStore
    }

    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        let kv = self
            .get(&self.lease_key(key), false, "reading the lease key")
            .await?;
        kv.map(|kv| Self::stored(key, &kv, None)).transpose()
    }

    async fn read_if_changed(
        &self,
        key: &LeaseKey,
        known: Option<&Revision>,
    ) -> Result<IfChanged, Error> {
        // Served by the member asked, without a quorum round: it may lag, never invent.
        let kv = self
            .get(&self.lease_key(key), true, "polling the lease key")
            .await?;
        let current = kv.map(|kv| Self::stored(key, &kv, None)).transpose()?;
        Ok(IfChanged::compared(current, known))
    }

    async fn read_for_term(&self, key: &LeaseKey, term: TermId) -> Result<Option<Stored>, Error> {
        let kv = self
            .get(&self.lease_key(key), false, "re-reading the lease key")
            .await?;
        kv.map(|kv| Self::stored(key, &kv, Some(lease_id(term))))
            .transpose()
    }

    fn changes(&self, key: &LeaseKey) -> Option<Changes> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let (notifier, changes) = Changes::channel();
        let task = runtime.spawn(watch(
            self.rpc.clone(),
            self.lease_key(key).into_bytes(),
            notifier,
        ));
        Some(changes.keep_alive(AbortOnDrop(task)))
    }

    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        match request.kind {
            WriteKind::Acquire => self.acquire(&request).await,
            WriteKind::Renew => self.renew(&request).await,
            WriteKind::Release => self.release(&request).await,
        }
    }
}

#[async_trait]
impl FencedCas for EtcdStore {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        let key = self.object_key(object);
        let kv = self.get(&key, false, "reading a protected object").await?;
        kv.map(|kv| {
            decode_fenced(
                object.as_str(),
                &kv.value,
                Revision::new(kv.mod_revision.to_string()),
            )
        })
        .transpose()
    }

    /// One transaction: the object is as `put.expected` (created at 0 if absent, else
    /// modified at the revision read) and, unless the put is
    /// [without the lease check](FencedPut::without_lease_check), the fence's lease key is
    /// its term's; then the object is put with the fence's token. Both kinds of put store the
    /// same bytes.
    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        let lease_key = self.lease_key(&put.fence.key);
        let object_key = self.object_key(put.object);
        let (l, o) = (lease_key.as_bytes(), object_key.as_bytes());
        // The lease is checked against its own term's token (a shard term's fence writes
        // the shard's token, but its lease is the instance's membership).
        let term = i64::try_from(put.fence.lease_token().0).unwrap_or(i64::MAX);
        let object_as_read = match put.expected {
            Expected::Absent => Compare::created_at(o, 0),
            Expected::Revision(r) => Compare::modified_at(o, mod_revision(r)?),
        };
        // The term is live exactly while its lease key exists with the create revision that is
        // its token and is attached to a lease: etcd deletes the key when the lease ends, and a
        // release detaches it.
        let (compare, failure) = if put.lease_check {
            (
                vec![
                    Compare::created_at(l, term),
                    Compare::leased(l),
                    object_as_read,
                ],
                vec![RequestOp::get(l)],
            )
        } else {
            (vec![object_as_read], Vec::new())
        };
        let txn = TxnRequest {
            compare,
            success: vec![RequestOp::put(
                o,
                encode_fenced(put.fence.token, put.value),
                0,
            )],
            failure,
        };
        let answer = self.txn(&txn, "writing a protected object").await?;
        if answer.succeeded {
            return Ok(ObjectWrite::Written(Revision::new(
                answer.revision().to_string(),
            )));
        }
        if put.lease_check {
            refused(&put, term, &answer)?;
        }
        Ok(ObjectWrite::Conflict)
    }
}

/// Why the transaction of a fenced put that checks the lease failed, from its failure branch
/// (the lease key): [`Error::Fenced`] if the lease key is not the live term `term`, else `Ok`
/// (the object was not as expected: a conflict).
fn refused(put: &FencedPut<'_>, term: i64, answer: &TxnResponse) -> Result<(), Error> {
    let lease_kv = answer.range(0);
    let found = lease_kv.map(|kv| kv.create_revision);
    if found == Some(term) && lease_kv.is_some_and(|kv| kv.lease != 0) {
        return Ok(());
    }
    warn!(
        object = %put.object,
        token = %put.fence.token,
        lease_token = %put.fence.lease_token(),
        "fenced write refused: the term's lease has ended"
    );
    // A newer term's token is one of the object's series only when the fence has no separate
    // lease term.
    let newer = found
        .and_then(|t| u64::try_from(t).ok())
        .map(FencingToken)
        .filter(|t| put.fence.lease_term.is_none() && *t > put.fence.token);
    Err(Error::Fenced {
        object: put.object.to_string(),
        presented: put.fence.token,
        highest: newer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_are_positive_and_stable_per_term() {
        for t in [0u128, 1, u128::MAX, 1 << 64, (1 << 63) | 5] {
            let id = lease_id(TermId(t));
            assert!(id > 0, "{t}: {id}");
            assert_eq!(id, lease_id(TermId(t)));
        }
        assert_ne!(lease_id(TermId(7)), lease_id(TermId(8)));
    }

    #[test]
    fn lease_seconds_round_up() {
        assert_eq!(lease_secs(Duration::from_millis(1)), 1);
        assert_eq!(lease_secs(Duration::from_secs(15)), 15);
        assert_eq!(lease_secs(Duration::from_millis(2500)), 3);
    }

    #[test]
    fn revisions_of_records_not_held_differ_and_parse_back() {
        let held = Revision::new("42");
        let not_held = Revision::new(format!("42{NOT_HELD}"));
        assert_ne!(held, not_held);
        assert_eq!(mod_revision(&held).unwrap(), 42);
        assert_eq!(mod_revision(&not_held).unwrap(), 42);
        assert!(mod_revision(&Revision::new("etag")).is_err());
    }
}
