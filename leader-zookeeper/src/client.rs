//! The calls to ZooKeeper, and the lease and fencing logic on top.
//!
//! Nodes under the store's parent node `{path}` (lease keys and object names never start
//! with `.`, so the two never meet):
//! - `{path}/{key}`: the lease record of `key` as JSON ([`LeaseRecord::to_json`]). While a
//!   term holds it, it is an *ephemeral* node of the term's own session
//!   ([`crate::term`]), writable only by that session (its ACL); a released record is a
//!   persistent node that anyone may replace.
//! - `{path}/.{name}.fenced`: a protected object, [`encode_fenced`] bytes.

use std::fmt;
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use async_trait::async_trait;
use leader_core::backend::{
    Call, ChangeNotifier, Changes, Expected, ExpiryModel, FencedCas, FencedPut, IfChanged,
    LeaseRecord, LeaseState, ObjectWrite, Revision, Stored, TermId, WriteKind, WriteOutcome,
    WriteRequest, call_deadline, decode_fenced, encode_fenced,
};
use leader_core::{
    ConfigError, Error, Fence, FencedObject, FencingToken, LeaseBackend, LeaseKey, ObjectName,
    Timing,
};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};
use zookeeper_client::{
    Acls, AddWatchMode, Client, CreateMode, CreateOptions, Error as ZkError, EventType,
    MultiWriteResult, Stat,
};

use crate::error::{Class, Request, map_error, parent_missing};
use crate::multi::{multi_failure, replace_node};
use crate::session::SharedSession;
use crate::term::{
    AbortOnDrop, TermSession, Terms, end_session, lease_node_acl, session_timeout_for,
};

/// The shortest ttl this store accepts: ZooKeeper's client pings every 3/20 of the session
/// timeout and gives a silent connection up after 2/5 of it, which below 1 s is too tight
/// for a real network.
pub const MIN_TTL: Duration = Duration::from_secs(1);

/// The longest ttl this store accepts: a session timeout is a 32-bit count of milliseconds.
pub const MAX_TTL: Duration = Duration::from_millis(i32::MAX as u64);

/// The revision suffix of a record reported released.
const RELEASED: &str = ".released";

/// Leases and fenced objects under one parent node of a ZooKeeper ensemble.
///
/// Build it with [`ZooKeeperStore::builder`]. Cloning is cheap; clones share the sessions and
/// the terms. Every candidate of a process may use one store (each term gets its own session
/// anyway). See the crate docs for how the store works.
#[derive(Clone)]
pub struct ZooKeeperStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: String,
    shared: Arc<SharedSession>,
    terms: Arc<Terms>,
    /// The tasks of [`LeaseBackend::changes`], aborted with the store.
    watches: Mutex<Vec<AbortHandle>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for watch in self
            .watches
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            watch.abort();
        }
    }
}

impl fmt::Debug for ZooKeeperStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZooKeeperStore")
            .field("hosts", &self.inner.shared.hosts())
            .field("path", &self.inner.path)
            .finish_non_exhaustive()
    }
}

/// Which session a read must find as the node's owner to report the record held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    /// Any session: the node is ephemeral.
    Any,
    /// This session (a term's).
    Session(i64),
    /// None: the record is reported released whatever it says.
    Nobody,
}

/// What a conditional write of the lease node ended with, before it becomes an outcome.
enum Attempt {
    /// Written; the node's new stat.
    Done(Stat),
    /// A ZooKeeper error, and which operation of a multi failed (0 for a single request).
    Failed(ZkError, usize),
}

impl ZooKeeperStore {
    pub(crate) fn new(path: String, shared: SharedSession) -> Self {
        Self {
            inner: Arc::new(Inner {
                path,
                shared: Arc::new(shared),
                terms: Arc::new(Terms::default()),
                watches: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The ensemble's host list.
    pub fn hosts(&self) -> &str {
        self.inner.shared.hosts()
    }

    /// The parent node of the lease nodes.
    pub fn path(&self) -> &str {
        &self.inner.path
    }

    /// The node that holds the lease record of `key`: `{path}/{key}`.
    pub fn lease_path(&self, key: &LeaseKey) -> String {
        child(&self.inner.path, key.as_str())
    }

    /// The node of a protected object: `{path}/.{name}.fenced`, beside the leases (no lease
    /// key starts with `.`, so the two never meet).
    pub fn object_path(&self, object: &ObjectName) -> String {
        child(&self.inner.path, &format!(".{object}.fenced"))
    }

    /// The number of terms whose ZooKeeper session this store keeps open (for tests and
    /// metrics): a term's session ends at its release, when a renew finds the term lost, and
    /// a ttl after its last acquire or renew.
    pub fn live_terms(&self) -> usize {
        self.inner.terms.len()
    }

    /// The id of the store's shared session (reads, watches, protected objects).
    pub fn shared_session_id(&self) -> i64 {
        self.inner.shared.session_id()
    }

    /// Reads a node through the shared session; `None` if it does not exist (and the parent
    /// does). With `fresh`, the session first syncs with the leader, so that the read sees
    /// every write applied before it started.
    async fn get_node(
        &self,
        path: &str,
        what: &'static str,
        fresh: bool,
    ) -> Result<Option<(Vec<u8>, Stat)>, Error> {
        let request = Request::read(what, path);
        Call::read(what)
            .run(|_| async {
                let client = self.inner.shared.client().await?;
                if fresh {
                    self.sync(&client).await?;
                }
                match client.get_data(path).await {
                    Ok(found) => Ok(Some(found)),
                    Err(ZkError::NoNode) => {
                        self.check_parent(&client).await?;
                        Ok(None)
                    }
                    Err(e) => Err(map_error(e, request)),
                }
            })
            .await
    }

    /// Makes the shared session's server catch up with the leader (`sync` on the parent).
    async fn sync(&self, client: &Client) -> Result<(), Error> {
        let parent = &self.inner.path;
        match client.sync(parent).await {
            Ok(()) => Ok(()),
            Err(ZkError::NoNode) => Err(parent_missing(parent, Some(ZkError::NoNode))),
            Err(e) => Err(map_error(e, Request::read("syncing", parent))),
        }
    }

    /// Fails with [`Error::NotFound`] if the parent node is missing.
    async fn check_parent(&self, client: &Client) -> Result<(), Error> {
        let parent = &self.inner.path;
        match client.check_stat(parent).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(parent_missing(parent, None)),
            Err(e) => Err(map_error(
                e,
                Request::read("checking the parent node", parent),
            )),
        }
    }

    /// The record of `key` as it is now, for a conflict's answer; `None` if it cannot be read.
    async fn current(&self, key: &LeaseKey, path: &str) -> Option<Stored> {
        let client = self.inner.shared.client().await.ok()?;
        let (data, stat) = client.get_data(path).await.ok()?;
        to_stored(key, path, &data, &stat, Owner::Any).ok()
    }

    /// Begins a term: opens its session, then creates the ephemeral node in it (after
    /// deleting the record found at the expected revision).
    async fn acquire(&self, key: &LeaseKey, path: &str, req: WriteRequest) -> WriteResult {
        let sent = Instant::now();
        let deadline = call_deadline();
        let expected = match &req.expected {
            Expected::Absent => None,
            Expected::Revision(r) => match parse_revision(r) {
                Some(at) => Some(at),
                // Not a revision of this store: no node is at it.
                None => return Ok(conflict(None)),
            },
        };
        let terms = &self.inner.terms;
        let hosts = self.inner.shared.hosts();
        let ttl = req.record.ttl;
        let session = Call::read("opening the term's ZooKeeper session")
            .run(|_| terms.open(hosts, path.to_owned(), req.term, ttl, sent, deadline))
            .await?;
        // Registered before the write, so that a write whose answer is lost (or that the core
        // cancels) is found by `read_for_term`, and the watchdog ends the session a ttl after
        // `sent` unless a renew comes. (A term id is the core's, fresh for each acquire;
        // only a test repeats one, and the earlier term's session then stays registered.)
        terms.insert_if_absent(&session);
        let outcome = self.create_in(&session, key, path, &req, expected).await;
        match &outcome {
            Ok(WriteOutcome::Written(_)) => terms.insert(&session),
            Err(e) if e.kind() == leader_core::ErrorKind::Indeterminate => {}
            // Nothing of this term was written.
            Ok(WriteOutcome::Conflict { .. }) => {
                terms.forget(path, req.term, Some(session.session_id));
            }
            // Nothing was written, or what was is deleted now.
            Err(_) => {
                terms.forget(path, req.term, Some(session.session_id));
                end_session(&session.client, path, deadline).await;
            }
        }
        outcome
    }

    async fn create_in(
        &self,
        session: &TermSession,
        key: &LeaseKey,
        path: &str,
        req: &WriteRequest,
        expected: Option<(i64, i32)>,
    ) -> WriteResult {
        let data = req.record.to_json();
        let acl = lease_node_acl();
        let ephemeral = CreateMode::Ephemeral.with_acls(Acls::new(&acl));
        let attempt = match expected {
            None => create_node(session, path, &data, &ephemeral).await?,
            Some(at) => {
                match self
                    .take_node(session, key, path, &data, &ephemeral, at)
                    .await?
                {
                    ControlFlow::Continue(attempt) => attempt,
                    ControlFlow::Break(answer) => return answer,
                }
            }
        };
        let stat = match attempt {
            Attempt::Done(stat) => stat,
            Attempt::Failed(e, index) => {
                return self
                    .acquire_failed(key, path, e, index, expected.is_some())
                    .await;
            }
        };
        self.write_token(session, key, path, req, stat).await
    }

    /// The term's node where a record was at `(czxid, version)`: our own earlier term's node
    /// is deleted by its session and created anew by this one; any other record is replaced
    /// in one multi. `Break` with the write's answer when it is decided without a node.
    async fn take_node(
        &self,
        session: &TermSession,
        key: &LeaseKey,
        path: &str,
        data: &[u8],
        ephemeral: &CreateOptions<'_>,
        (czxid, version): (i64, i32),
    ) -> Result<ControlFlow<WriteResult, Attempt>, Error> {
        let Some(next) = version.checked_add(1) else {
            return Ok(ControlFlow::Break(Ok(conflict(None))));
        };
        let mut ours = self.inner.terms.by_node(path, czxid);
        if ours.is_none() {
            // A create of ours whose answer was lost records no czxid: tell our own node by
            // its owner, one of our term sessions.
            if let Ok(Some(stat)) = session.client.check_stat(path).await
                && stat.czxid == czxid
                && stat.ephemeral_owner != 0
            {
                ours = self.inner.terms.by_owner(path, stat.ephemeral_owner);
            }
        }
        if let Some(old) = ours {
            // Our own earlier term's node: only its session may write it. It deletes it, then
            // the new session creates the new term's node.
            let delete = Request::write("deleting our earlier term's lease node", path);
            match once(delete, || {
                replace_node(&old.client, path, &[], version, next, None)
            })
            .await?
            {
                Attempt::Done(_) => {
                    self.inner
                        .terms
                        .forget(path, old.term, Some(old.session_id));
                }
                Attempt::Failed(e, index) => {
                    let answer = self.acquire_failed(key, path, e, index, true).await;
                    return Ok(ControlFlow::Break(answer));
                }
            }
            return Ok(ControlFlow::Continue(
                create_node(session, path, data, ephemeral).await?,
            ));
        }
        // A released record (or an ended term's node of another process, which its ACL
        // protects: `setData` fails): replace it in one multi. The multi checks the version
        // only, which a recreated node restarts: the czxid is checked first (the window
        // between the two is one round trip; a node another term created in it is protected
        // by its ACL).
        if !self.is_at(session, path, czxid, version).await? {
            let current = self.current(key, path).await;
            return Ok(ControlFlow::Break(Ok(conflict(current))));
        }
        let replace = Request::write("replacing the lease record", path);
        let attempt = once(replace, || {
            replace_node(&session.client, path, data, version, next, Some(ephemeral))
        })
        .await?;
        Ok(ControlFlow::Continue(attempt))
    }

    /// The term's node is created (its stat is `stat`): the token is the node's czxid, known
    /// only now, so the record is written again with it (same nonce), and every reader sees
    /// the term's real token.
    async fn write_token(
        &self,
        session: &TermSession,
        key: &LeaseKey,
        path: &str,
        req: &WriteRequest,
        stat: Stat,
    ) -> WriteResult {
        let stat = if stat.is_invalid() {
            self.own_stat(session, path).await?
        } else {
            stat
        };
        let token = token_of(stat.czxid);
        if token < req.record.token {
            return Err(Error::InvalidConfig {
                message: format!(
                    "the new lease node of {key} has czxid {token}, below the fencing token {} \
                     the lease already reached: the ZooKeeper ensemble's transaction ids went \
                     back (it was rebuilt, or restored from an older snapshot), or a record \
                     with a higher token was written by hand. Tokens would go down, so the \
                     store refuses; point it at the original ensemble, or reset the fences \
                     of the protected resources and delete {path}",
                    req.record.token
                ),
                source: None,
            });
        }
        session.set_czxid(stat.czxid);
        let mut record = req.record.clone();
        record.token = token;
        let data = record.to_json();
        let request = Request::write("writing the token into the lease node", path);
        let attempt = once(request, || async {
            session
                .client
                .set_data(path, &data, Some(stat.version))
                .await
                .map(Some)
                .map_err(|e| (e, 0))
        })
        .await
        .map_err(|e| after_create(e, path))?;
        let stat = match attempt {
            Attempt::Done(stat) => stat,
            // The node was created; whatever happened to it since, the core re-reads.
            Attempt::Failed(e, _) => {
                return Err(after_create(map_error(e, request), path));
            }
        };
        info!(%key, holder = %record.holder, %token, node = %path, session = %format_args!("{:#x}", session.session_id), "created the lease node");
        Ok(WriteOutcome::Written(Stored {
            record,
            revision: revision(stat.czxid, stat.version, true),
        }))
    }

    /// Whether the lease node is the one created at `czxid`, at `version` (after a `sync`).
    async fn is_at(
        &self,
        session: &TermSession,
        path: &str,
        czxid: i64,
        version: i32,
    ) -> Result<bool, Error> {
        let request = Request::read("checking the lease node", path);
        Call::read("checking the lease node")
            .run(|_| async {
                let client = &session.client;
                client.sync(path).await.map_err(|e| map_error(e, request))?;
                match client.check_stat(path).await {
                    Ok(stat) => Ok(stat.is_some_and(|s| s.czxid == czxid && s.version == version)),
                    Err(e) => Err(map_error(e, request)),
                }
            })
            .await
    }

    /// The stat of the term's node, read by its own session, when a multi's answer had none.
    async fn own_stat(&self, session: &TermSession, path: &str) -> Result<Stat, Error> {
        let what = "reading the created lease node";
        match session.client.get_data(path).await {
            Ok((_, stat)) if stat.ephemeral_owner == session.session_id => Ok(stat),
            Ok(_) | Err(ZkError::NoNode) => Err(Error::indeterminate(format!(
                "{path} was created, but was gone before its stat could be read"
            ))),
            Err(e) => Err(map_error(e, Request::write(what, path))),
        }
    }

    /// The outcome of an acquire whose write failed with `error` at `index` of its multi.
    async fn acquire_failed(
        &self,
        key: &LeaseKey,
        path: &str,
        error: ZkError,
        index: usize,
        replacing: bool,
    ) -> WriteResult {
        let class = Class::of(&error);
        let refused = match class {
            Class::Condition | Class::SessionEnded => true,
            // The record is not at the expected revision (gone, or another term's node).
            Class::NoNode | Class::NoAuth if replacing && index == 0 => true,
            // A create whose parent is missing.
            Class::NoNode => return Err(parent_missing(&self.inner.path, Some(error))),
            _ => false,
        };
        if refused {
            debug!(%key, node = %path, %error, "the acquire found the lease taken");
            let current = if class == Class::SessionEnded {
                None
            } else {
                self.current(key, path).await
            };
            return Ok(conflict(current));
        }
        Err(map_error(
            error,
            Request::write("acquiring the lease node", path),
        ))
    }

    /// Extends the term: `setData` through the term's own session, at the expected version.
    async fn renew(&self, key: &LeaseKey, path: &str, req: WriteRequest) -> WriteResult {
        let Some(session) = self.inner.terms.get(path, req.term) else {
            return Ok(conflict(None));
        };
        let Some((czxid, version)) = expected_revision(&req.expected) else {
            return Ok(conflict(None));
        };
        if session.czxid() != Some(czxid) || !session.touch(Instant::now()) {
            return Ok(conflict(None));
        }
        let data = req.record.to_json();
        let request = Request::write("renewing the lease node", path);
        let attempt = once(request, || async {
            session
                .client
                .set_data(path, &data, Some(version))
                .await
                .map(Some)
                .map_err(|e| (e, 0))
        })
        .await?;
        match attempt {
            Attempt::Done(stat) if stat.czxid == czxid => Ok(WriteOutcome::Written(Stored {
                record: req.record,
                revision: revision(czxid, stat.version, true),
            })),
            Attempt::Done(stat) => Err(Error::InvalidConfig {
                message: format!(
                    "the renew of {key} was applied to {path} created at zxid {}, not to the \
                     term's node (zxid {czxid}): the ZooKeeper server does not enforce ACLs \
                     (zookeeper.skipACL=yes?), which this store needs",
                    stat.czxid
                ),
                source: None,
            }),
            // Our own earlier renew, whose answer was lost, may have moved the version: the
            // core re-reads as the term's holder and decides.
            Attempt::Failed(ZkError::BadVersion, _) => Ok(conflict(None)),
            Attempt::Failed(error, _) => match Class::of(&error) {
                // Deleted (by an operator), another term's node (our ACL does not allow the
                // write), or our session expired: the term is over.
                Class::NoNode | Class::NoAuth | Class::SessionEnded => {
                    warn!(%key, node = %path, %error, "the renew found the term's lease node gone; ending the term's session");
                    self.inner.terms.end(path, req.term, call_deadline()).await;
                    Ok(conflict(None))
                }
                _ => Err(map_error(error, request)),
            },
        }
    }

    /// Ends the term: one multi through the term's session replaces its ephemeral node with a
    /// persistent node holding the released record, then the session is forgotten.
    async fn release(&self, key: &LeaseKey, path: &str, req: WriteRequest) -> WriteResult {
        let deadline = call_deadline();
        let terms = &self.inner.terms;
        let Some(session) = terms.get(path, req.term) else {
            return Ok(conflict(None));
        };
        let expected =
            expected_revision(&req.expected).filter(|(czxid, _)| session.czxid() == Some(*czxid));
        let Some((_, version)) = expected else {
            terms.end(path, req.term, deadline).await;
            return Ok(conflict(None));
        };
        let Some(next) = version.checked_add(1) else {
            terms.end(path, req.term, deadline).await;
            return Ok(conflict(None));
        };
        let data = req.record.to_json();
        let request = Request::write("releasing the lease node", path);
        let released = CreateMode::Persistent.with_acls(Acls::anyone_all());
        let attempt = once(request, || {
            replace_node(&session.client, path, &data, version, next, Some(&released))
        })
        .await;
        match attempt {
            Ok(Attempt::Done(stat)) => {
                terms.forget(path, req.term, Some(session.session_id));
                let revision = if stat.is_invalid() {
                    created_revision(&session.client, path, &data, false).await
                } else {
                    revision(stat.czxid, stat.version, false)
                };
                info!(%key, token = %req.record.token, node = %path, "released the lease node");
                Ok(WriteOutcome::Written(Stored {
                    record: req.record,
                    revision,
                }))
            }
            // May have been applied: the watchdog ends the session a ttl after its last
            // write (or the core's re-read finds the node released).
            Err(e) if e.kind() == leader_core::ErrorKind::Indeterminate => Err(e),
            Ok(Attempt::Failed(error, index)) => {
                // The core gives the term up whatever the answer: delete the node now if it
                // is still ours (so that a follower takes over at once).
                terms.end(path, req.term, deadline).await;
                match Class::of(&error) {
                    Class::Condition | Class::SessionEnded => Ok(conflict(None)),
                    Class::NoNode | Class::NoAuth if index == 0 => Ok(conflict(None)),
                    _ => Err(map_error(error, request)),
                }
            }
            Err(e) => {
                terms.end(path, req.term, deadline).await;
                Err(e)
            }
        }
    }

    fn register_watch(&self, task: AbortHandle) {
        let mut watches = self
            .inner
            .watches
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        watches.retain(|w| !w.is_finished());
        watches.push(task);
    }
}

type WriteResult = Result<WriteOutcome, Error>;

/// A failure after the term's node was created: the outcome is unknown to the core, which
/// re-reads ([`LeaseBackend::read_for_term`] knows the node by its owner).
fn after_create(error: Error, path: &str) -> Error {
    if error.kind() == leader_core::ErrorKind::Indeterminate {
        return error;
    }
    Error::Indeterminate {
        message: format!("{path} was created, then writing its token failed: {error}"),
        source: Some(Box::new(error)),
    }
}

/// Runs one conditional write through the core's call loop (bounded by the call's deadline):
/// only failures that promise the request was not applied are tried again (throttling, no
/// server); everything else is the attempt's answer.
/// Creates the new term's ephemeral node at `path`, by the term's own session.
async fn create_node(
    session: &TermSession,
    path: &str,
    data: &[u8],
    ephemeral: &CreateOptions<'_>,
) -> Result<Attempt, Error> {
    let request = Request::write("creating the lease node", path);
    once(request, || async {
        session
            .client
            .create(path, data, ephemeral)
            .await
            .map(|(stat, _)| Some(stat))
            .map_err(|e| (e, 0))
    })
    .await
}

async fn once<F, Fut>(request: Request<'_>, mut attempt: F) -> Result<Attempt, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<Stat>, (ZkError, usize)>>,
{
    Call::write(request.what)
        .run(|_| {
            let attempt = attempt();
            async move {
                match attempt.await {
                    // A multi without a created node (a delete) has no stat to report.
                    Ok(stat) => Ok(Attempt::Done(stat.unwrap_or_else(invalid_stat))),
                    Err((e, _)) if matches!(Class::of(&e), Class::Throttled | Class::NotSent) => {
                        Err(map_error(e, request))
                    }
                    Err((e, index)) => Ok(Attempt::Failed(e, index)),
                }
            }
        })
        .await
}

/// The revision of the node at `path` that `client`'s multi has just created with `data`,
/// read back by the same session (which sees its own writes): ZooKeeper 3.8 answers a create
/// inside a multi without the node's stat (ZOOKEEPER-4667). If the node is no longer that
/// creation (version 0, this data, persistent), a revision that matches no node.
async fn created_revision(client: &Client, path: &str, data: &[u8], held: bool) -> Revision {
    match client.get_data(path).await {
        Ok((found, stat)) if stat.version == 0 && stat.ephemeral_owner == 0 && found == data => {
            revision(stat.czxid, stat.version, held)
        }
        _ => Revision::new(UNKNOWN),
    }
}

/// A revision that matches no node (see [`created_revision`]).
const UNKNOWN: &str = "unknown";

/// A stat that [`Stat::is_invalid`] recognises.
fn invalid_stat() -> Stat {
    Stat {
        czxid: -1,
        mzxid: -1,
        pzxid: -1,
        ctime: 0,
        mtime: 0,
        version: -1,
        cversion: -1,
        aversion: -1,
        ephemeral_owner: 0,
        data_length: 0,
        num_children: 0,
    }
}

fn conflict(current: Option<Stored>) -> WriteOutcome {
    WriteOutcome::Conflict { current }
}

/// `{parent}/{name}`.
fn child(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

/// A node's fencing token: its `czxid`.
fn token_of(czxid: i64) -> FencingToken {
    FencingToken(u64::try_from(czxid).unwrap_or(0))
}

/// The revision of a lease node: `{czxid}.{version}`, with [`RELEASED`] appended when the
/// record is reported released.
fn revision(czxid: i64, version: i32, held: bool) -> Revision {
    let suffix = if held { "" } else { RELEASED };
    Revision::new(format!("{czxid}.{version}{suffix}"))
}

/// The revision `read_if_changed` can tell from a stat alone: held if the node is
/// ephemeral (a record that says released in an ephemeral node is then read in full).
fn stat_revision(stat: &Stat) -> Revision {
    revision(stat.czxid, stat.version, stat.ephemeral_owner != 0)
}

/// The `czxid` and version of a revision made by [`revision`].
fn parse_revision(revision: &Revision) -> Option<(i64, i32)> {
    let text = revision.as_str();
    let text = text.strip_suffix(RELEASED).unwrap_or(text);
    let (czxid, version) = text.split_once('.')?;
    Some((czxid.parse().ok()?, version.parse().ok()?))
}

fn expected_revision(expected: &Expected) -> Option<(i64, i32)> {
    match expected {
        Expected::Absent => None,
        Expected::Revision(r) => parse_revision(r),
    }
}

/// The lease record stored in a node, as the store reports it: held only if the node is
/// ephemeral, owned as `owner` requires, and its record says held.
fn to_stored(
    key: &LeaseKey,
    path: &str,
    data: &[u8],
    stat: &Stat,
    owner: Owner,
) -> Result<Stored, Error> {
    let label = format!("{key} (ZooKeeper node {path})");
    let mut record = LeaseRecord::from_json(&label, data)?;
    let ephemeral = stat.ephemeral_owner != 0;
    let live = match owner {
        Owner::Any => ephemeral,
        Owner::Session(id) => ephemeral && stat.ephemeral_owner == id,
        Owner::Nobody => false,
    };
    let held = live && record.is_held();
    if !held {
        record.state = LeaseState::Released;
    }
    Ok(Stored {
        record,
        revision: revision(stat.czxid, stat.version, held),
    })
}

#[async_trait]
impl LeaseBackend for ZooKeeperStore {
    fn name(&self) -> &'static str {
        "zookeeper"
    }

    /// ZooKeeper enforces expiry: a lease node is ephemeral, and goes with the session of its
    /// term (which ends a ttl after the term's last write, or when it expires).
    fn expiry_model(&self) -> ExpiryModel {
        ExpiryModel::EnforcedByStore
    }

    /// The ttl becomes the session timeout of each term: from [`MIN_TTL`] (1 s) to
    /// [`MAX_TTL`] (a 32-bit count of milliseconds). Whether the ensemble grants it (its
    /// `maxSessionTimeout`) is known only when a session is opened: the first acquire
    /// checks it.
    fn check_timing(&self, timing: &Timing) -> Result<(), ConfigError> {
        check_ttl(timing.ttl)
    }

    /// `sync`, then `getData` of the lease node, through the shared session.
    ///
    /// # Errors
    /// [`Error::MalformedRecord`] naming the key and node if the data is not a lease record;
    /// [`Error::NotFound`] if the parent node is missing; [`Error::Timeout`] after the
    /// request timeout; any other [`Error`] for a store failure.
    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        let path = self.lease_path(key);
        let found = self.get_node(&path, "reading the lease node", true).await?;
        found
            .map(|(data, stat)| to_stored(key, &path, &data, &stat, Owner::Any))
            .transpose()
    }

    /// A follower's poll: `exists` (the stat alone), and `getData` only if the revision it
    /// shows is not `known`. No `sync`: the answer may lag the leader by the replication lag
    /// of the shared session's server, which the contract allows.
    async fn read_if_changed(
        &self,
        key: &LeaseKey,
        known: Option<&Revision>,
    ) -> Result<IfChanged, Error> {
        let path = self.lease_path(key);
        let request = Request::read("polling the lease node", &path);
        let found = Call::read("polling the lease node")
            .run(|_| async {
                let client = self.inner.shared.client().await?;
                match client.check_stat(&path).await {
                    Ok(None) => {
                        self.check_parent(&client).await?;
                        return Ok(None);
                    }
                    Ok(Some(stat)) if known == Some(&stat_revision(&stat)) => {
                        return Ok(Some(None));
                    }
                    Ok(Some(_)) => {}
                    Err(e) => return Err(map_error(e, request)),
                }
                match client.get_data(&path).await {
                    Ok(found) => Ok(Some(Some(found))),
                    Err(ZkError::NoNode) => Ok(None),
                    Err(e) => Err(map_error(e, request)),
                }
            })
            .await?;
        Ok(match found {
            None => IfChanged::Changed(None),
            Some(None) => IfChanged::Unchanged,
            Some(Some((data, stat))) => {
                IfChanged::Changed(Some(to_stored(key, &path, &data, &stat, Owner::Any)?))
            }
        })
    }

    /// Reads as [`read`](LeaseBackend::read) does, and reports the record held only if the
    /// node's `ephemeralOwner` is the session of `term` (which this store opened).
    async fn read_for_term(&self, key: &LeaseKey, term: TermId) -> Result<Option<Stored>, Error> {
        let path = self.lease_path(key);
        let session = self.inner.terms.get(&path, term);
        let found = self
            .get_node(&path, "re-reading the lease node", true)
            .await?;
        let Some((data, stat)) = found else {
            return Ok(None);
        };
        let owner = match &session {
            Some(s) => Owner::Session(s.session_id),
            None => Owner::Nobody,
        };
        let mut stored = to_stored(key, &path, &data, &stat, owner)?;
        if let Some(s) = &session
            && stored.record.is_held()
        {
            // The term's node: its token is the czxid, as the acquire would have answered
            // (its second write, which puts the czxid into the record, may be what was lost).
            s.set_czxid(stat.czxid);
            stored.record.token = token_of(stat.czxid);
        }
        Ok(Some(stored))
    }

    /// Watches the lease node with a persistent watch on the shared session, and hints at
    /// every event (and once after each time the watch is set). `None` outside a tokio
    /// runtime.
    fn changes(&self, key: &LeaseKey) -> Option<Changes> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let (notifier, changes) = Changes::channel();
        let task = runtime.spawn(watch_node(
            Arc::downgrade(&self.inner.shared),
            self.lease_path(key),
            notifier,
        ));
        self.register_watch(task.abort_handle());
        Some(changes.keep_alive(AbortOnDrop(task)))
    }

    /// Acquire: a new session for the term, and its ephemeral node (replacing a released
    /// record, or our own ended term's node, at the expected revision). Renew: `setData` at
    /// the expected version through the term's session. Release: the ephemeral node replaced
    /// by a persistent released record, in one multi. See the crate docs.
    ///
    /// # Errors
    /// [`Error::Indeterminate`] if the write may have been applied (a lost connection, no
    /// answer within the request timeout); [`Error::NotFound`] if the parent node is
    /// missing; [`Error::InvalidConfig`] if the ensemble's session timeouts cannot hold the
    /// ttl, or its transaction ids went back; any other error means nothing was written.
    ///
    /// # Cancel safety
    /// Not cancel-safe: a cancelled write may still be applied. Treat it as indeterminate.
    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        let key = request.key.clone();
        let path = self.lease_path(&key);
        let kind = request.kind;
        let outcome = match kind {
            WriteKind::Acquire => self.acquire(&key, &path, request).await,
            WriteKind::Renew => self.renew(&key, &path, request).await,
            WriteKind::Release => self.release(&key, &path, request).await,
        }?;
        match &outcome {
            WriteOutcome::Written(s) => {
                debug!(%key, holder = %s.record.holder, token = %s.record.token, ?kind, revision = %s.revision, "wrote the lease node");
            }
            WriteOutcome::Conflict { .. } => {
                debug!(%key, ?kind, "the lease node was not as expected")
            }
        }
        Ok(outcome)
    }
}

/// Rejects a ttl that cannot be a ZooKeeper session timeout; see [`MIN_TTL`] and
/// [`MAX_TTL`].
fn check_ttl(ttl: Duration) -> Result<(), ConfigError> {
    if ttl < MIN_TTL || session_timeout_for(ttl) > MAX_TTL {
        return Err(ConfigError::Unsupported {
            backend: "ZooKeeper",
            reason: format!(
                "the ttl becomes each term's session timeout: from {MIN_TTL:?} (ZooKeeper's \
                 client pings and connection checks need room) to {MAX_TTL:?} (32-bit \
                 milliseconds); ttl {ttl:?} is outside"
            ),
        });
    }
    Ok(())
}

/// The task behind [`LeaseBackend::changes`]: a persistent watch on the lease node, set again
/// on a new shared session when the old one ends or is replaced; it hints once after each
/// time the watch is set (a change may have happened while it was not) and at every event.
async fn watch_node(shared: Weak<SharedSession>, path: String, notifier: ChangeNotifier) {
    const FIRST_PAUSE: Duration = Duration::from_millis(100);
    const MAX_PAUSE: Duration = Duration::from_secs(5);
    let mut pause = FIRST_PAUSE;
    loop {
        let Some(session) = shared.upgrade() else {
            return;
        };
        // Taken before the client, so that a replacement from here on ends every wait below:
        // the watch is then set on the new session at once.
        let mut replaced = session.replaced();
        let client = session.client().await;
        drop(session);
        let trouble = match client {
            Ok(client) => {
                // A watch sent on a session without a connection waits for it to reconnect.
                let watched = tokio::select! {
                    watched = client.watch(&path, AddWatchMode::Persistent) => Some(watched),
                    gone = replaced.changed() => {
                        if gone.is_err() {
                            return;
                        }
                        None
                    }
                };
                match watched {
                    None => {
                        pause = FIRST_PAUSE;
                        continue;
                    }
                    Some(Ok(mut watcher)) => {
                        pause = FIRST_PAUSE;
                        notifier.notify();
                        loop {
                            tokio::select! {
                                event = watcher.changed() => {
                                    notifier.notify();
                                    if event.event_type == EventType::Session
                                        && event.session_state.is_terminated()
                                    {
                                        // The session ended, its watches with it (the
                                        // watcher yields nothing more).
                                        break;
                                    }
                                }
                                gone = replaced.changed() => {
                                    if gone.is_err() {
                                        return;
                                    }
                                    // A new shared session replaced this one (which had no
                                    // connection): watch there.
                                    break;
                                }
                            }
                        }
                        // Until the next session: the client is dropped now.
                        drop(client);
                        continue;
                    }
                    Some(Err(ZkError::Unimplemented)) => {
                        warn!(node = %path, "the ZooKeeper server has no persistent watches (3.6 or later needed); followers only poll");
                        return;
                    }
                    Some(Err(e)) => format!("could not watch the lease node: {e}"),
                }
            }
            Err(e) => format!("no shared session to watch the lease node with: {e}"),
        };
        debug!(node = %path, %trouble, "trying again");
        tokio::select! {
            () = tokio::time::sleep(pause) => pause = (pause * 2).min(MAX_PAUSE),
            gone = replaced.changed() => {
                if gone.is_err() {
                    return;
                }
                pause = FIRST_PAUSE;
            }
        }
    }
}

#[async_trait]
impl FencedCas for ZooKeeperStore {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        let path = self.object_path(object);
        let label = format!("{object} (ZooKeeper node {path})");
        self.get_node(&path, "reading the protected object", true)
            .await?
            .map(|(data, stat)| decode_fenced(&label, &data, object_revision(&stat)))
            .transpose()
    }

    /// One multi through the shared session: check that the lease node still has the version
    /// just read (after checking that it is the fence's term's node: ephemeral, `czxid` =
    /// the fence's lease token), and create the object (expected absent) or set its data at
    /// the expected version. A put [without the lease check](FencedPut::without_lease_check)
    /// reads no lease node, and its multi is the object's write alone, with the same data.
    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        let lease = self.lease_path(&put.fence.key);
        let path = self.object_path(put.object);
        let version = match put.expected {
            Expected::Absent => None,
            Expected::Revision(r) => match parse_revision(r) {
                Some((_, version)) => Some(version),
                None => return Ok(ObjectWrite::Conflict),
            },
        };
        let object = ObjectOp {
            path: &path,
            data: encode_fenced(put.fence.token, put.value),
            version,
        };
        let fenced = || Error::Fenced {
            object: put.object.to_string(),
            presented: put.fence.token,
            highest: None,
        };
        let request = Request::write("writing the protected object", &path);
        let written = Call::write("writing the protected object")
            .run(|_| async {
                let client = self.inner.shared.client().await?;
                let checked = if put.lease_check {
                    match lease_version(&client, &lease, put.fence).await? {
                        Some(version) => Some((lease.as_str(), version)),
                        None => return Ok(None),
                    }
                } else {
                    None
                };
                commit_object(&client, checked, &object, request)
                    .await
                    .map(Some)
            })
            .await?;
        let Some(written) = written else {
            return Err(fenced());
        };
        // The object's operation in the multi: after the lease check, if there is one.
        let at = usize::from(put.lease_check);
        match written {
            Ok(results) => {
                let revision = match results.get(at) {
                    Some(
                        MultiWriteResult::Create { stat, .. } | MultiWriteResult::SetData { stat },
                    ) if !stat.is_invalid() => object_revision(stat),
                    _ => {
                        let client = self.inner.shared.client().await?;
                        created_revision(&client, &path, &object.data, true).await
                    }
                };
                Ok(ObjectWrite::Written(revision))
            }
            // The lease node is gone: the fence's term is over.
            Err((ZkError::NoNode, 0)) if put.lease_check => Err(fenced()),
            // Renewed since the stat was read (or recreated): read and try again.
            Err((ZkError::BadVersion, 0)) if put.lease_check => Ok(ObjectWrite::Conflict),
            Err((error, i)) if i == at && Class::of(&error) == Class::Condition => {
                Ok(ObjectWrite::Conflict)
            }
            Err((ZkError::NoNode, i)) if i == at => Ok(ObjectWrite::Conflict),
            Err((error, _)) => Err(map_error(error, request)),
        }
    }
}

/// The write of a protected object's node: create it with `data` (`version` `None`: expected
/// absent) or set its data at `version`.
struct ObjectOp<'a> {
    path: &'a str,
    data: Vec<u8>,
    version: Option<i32>,
}

/// The version of the lease node at `lease` if it is the node of `fence`'s lease term
/// (ephemeral, `czxid` = the lease token), read up to date with the ensemble's leader; `None`
/// if it is not (the term is over).
async fn lease_version(client: &Client, lease: &str, fence: &Fence) -> Result<Option<i32>, Error> {
    let read = Request::read("reading the lease node", lease);
    // Up to date with the ensemble's leader, so that the check starts from the lease node as
    // it is now, not as a lagging server last saw it. (The multi checks its version; a node
    // recreated at the same version between the two is the one window left, and the object's
    // fence still refuses a token below one that wrote it.)
    client.sync(lease).await.map_err(|e| map_error(e, read))?;
    let stat = client
        .check_stat(lease)
        .await
        .map_err(|e| map_error(e, read))?;
    // The lease term's own token: a shard term's fence writes the shard's token, but its
    // lease is the instance's membership.
    let term = fence.lease_token();
    Ok(stat
        .filter(|s| s.ephemeral_owner != 0 && token_of(s.czxid) == term)
        .map(|s| s.version))
}

/// Commits one multi: a version check of the lease node (`lease`: its path and version), if
/// given, then `object`'s write. A throttled or unsent multi is an error (the call may try it
/// again); any other failure is the error and the index of the operation that failed.
async fn commit_object(
    client: &Client,
    lease: Option<(&str, i32)>,
    object: &ObjectOp<'_>,
    request: Request<'_>,
) -> Result<Result<Vec<MultiWriteResult>, (ZkError, usize)>, Error> {
    let mut multi = client.new_multi_writer();
    let checked = match lease {
        Some((path, version)) => multi.add_check_version(path, version),
        None => Ok(()),
    };
    let added = checked.and_then(|()| match object.version {
        None => multi.add_create(
            object.path,
            &object.data,
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        ),
        Some(version) => multi.add_set_data(object.path, &object.data, Some(version)),
    });
    added.map_err(|e| map_error(e, request))?;
    match multi.commit().await {
        Ok(results) => Ok(Ok(results)),
        Err(e) => {
            let (error, index) = multi_failure(e);
            match Class::of(&error) {
                Class::Throttled | Class::NotSent => Err(map_error(error, request)),
                _ => Ok(Err((error, index))),
            }
        }
    }
}

/// The revision of a protected object: `{czxid}.{version}`.
fn object_revision(stat: &Stat) -> Revision {
    revision(stat.czxid, stat.version, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use leader_core::HolderId;
    use leader_core::backend::WriteNonce;

    fn stat(czxid: i64, version: i32, owner: i64) -> Stat {
        Stat {
            czxid,
            version,
            ephemeral_owner: owner,
            ..invalid_stat()
        }
    }

    fn record(state: LeaseState, token: u64) -> Vec<u8> {
        let mut r = LeaseRecord::held(
            HolderId::new("a").unwrap(),
            FencingToken(token),
            Duration::from_secs(2),
            Default::default(),
            WriteNonce(7),
        );
        r.state = state;
        r.to_json()
    }

    #[test]
    fn revisions_round_trip_and_released_ones_differ() {
        let held = revision(4_294_967_301, 3, true);
        let released = revision(4_294_967_301, 3, false);
        assert_ne!(held, released);
        assert_eq!(parse_revision(&held), Some((4_294_967_301, 3)));
        assert_eq!(parse_revision(&released), Some((4_294_967_301, 3)));
        for bad in ["", "12", "a.b", "1.2.3", "etag"] {
            assert_eq!(parse_revision(&Revision::new(bad)), None, "{bad}");
        }
    }

    #[test]
    fn only_an_ephemeral_node_reads_held() {
        let key = LeaseKey::new("k").unwrap();
        let data = record(LeaseState::Held, 90);
        let held = to_stored(&key, "/l/k", &data, &stat(90, 2, 77), Owner::Any).unwrap();
        assert!(held.record.is_held());
        assert_eq!(held.record.token, FencingToken(90));
        assert_eq!(held.revision, Revision::new("90.2"));
        assert_eq!(held.revision, stat_revision(&stat(90, 2, 77)));
        // Written by hand as a persistent node: released, as its record says otherwise.
        let by_hand = to_stored(
            &key,
            "/l/k",
            &record(LeaseState::Held, 5),
            &stat(90, 2, 0),
            Owner::Any,
        )
        .unwrap();
        assert!(!by_hand.record.is_held());
        assert_eq!(by_hand.record.token, FencingToken(5));
        assert_eq!(by_hand.revision, stat_revision(&stat(90, 2, 0)));
        // Another session's node, read for a term: released, with another revision.
        let other = to_stored(&key, "/l/k", &data, &stat(90, 2, 77), Owner::Session(78)).unwrap();
        assert!(!other.record.is_held());
        assert_ne!(other.revision, held.revision);
        let ours = to_stored(&key, "/l/k", &data, &stat(90, 2, 77), Owner::Session(77)).unwrap();
        assert_eq!(ours, held);
        let err = to_stored(&key, "/l/k", b"{", &stat(90, 2, 77), Owner::Any).unwrap_err();
        assert!(err.to_string().contains("k (ZooKeeper node /l/k)"), "{err}");
    }

    #[test]
    fn ttls_must_fit_a_session_timeout() {
        assert!(check_ttl(Duration::from_secs(2)).is_ok());
        assert!(check_ttl(MIN_TTL).is_ok());
        assert!(check_ttl(Duration::from_millis(999)).is_err());
        assert!(check_ttl(MAX_TTL).is_ok());
        let err = check_ttl(MAX_TTL + Duration::from_millis(1)).unwrap_err();
        assert!(err.to_string().contains("ZooKeeper"), "{err}");
    }

    #[test]
    fn paths_join_under_the_root_and_elsewhere() {
        assert_eq!(child("/", "k"), "/k");
        assert_eq!(child("/a/b", "k"), "/a/b/k");
    }
}
