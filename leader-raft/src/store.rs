//! [`RaftStore`]: a member of the group, and a lease store whose records live in the group's
//! replicated state.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leader_core::backend::LeaseRecord;
use leader_core::backend::{
    ChangeNotifier, Changes, FencedCas, FencedPut, LeaseBackend, ObjectWrite, Revision, Stored,
    WriteOutcome, WriteRequest, call_deadline,
};
use leader_core::{Error, FencedObject, FencingToken, LeaseKey, ObjectName};
use openraft::error::{ClientWriteError, InitializeError, RaftError as OrError};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest, VoteResponse};
use openraft::{Raft, ServerState};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout_at};

use crate::config::{Members, RaftConfig, RaftTiming};
use crate::error::RaftError;
use crate::files::Folder;
use crate::join::{Gate, Joiner, MARKER, is_empty, read_founders, same_members};
use crate::net::{
    Answer, CallError, Failure, Founders, Handler, History, Network, Peers, Query, Reply, Request,
    member_map, serve,
};
use crate::state::{Command, Condition, Response, StoredBytes, TypeConfig};
use crate::status::Status;
use crate::storage::{LogStore, MachineStore};
use crate::tls::Tls;

/// The largest client command (encoded), half a frame: the rest is room for the entry's
/// envelope in an `AppendEntries` of one entry.
const MAX_COMMAND: usize = crate::net::MAX_FRAME / 2;

/// The pause between attempts while no leader is reachable.
const RETRY_PAUSE: Duration = Duration::from_millis(25);

/// One member of the group, and a client of the group's lease store.
///
/// Every instance runs one member ([`RaftStore::start`]); the members elect a Raft leader among
/// themselves and replicate every lease write through its log. As a
/// [`LeaseBackend`] and [`FencedCas`], a member sends each call to the current Raft leader
/// (itself, or over the transport), which answers linearizably: a write once a quorum has
/// stored it, a read after confirming its leadership with a quorum (a read index).
///
/// Clones share the member. Stop it with [`shutdown`](RaftStore::shutdown).
#[derive(Clone)]
pub struct RaftStore {
    node: Arc<Node>,
    server: Arc<Mutex<Option<JoinHandle<()>>>>,
    folder: Arc<Mutex<Option<Folder>>>,
}

impl fmt::Debug for RaftStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RaftStore")
            .field("id", &self.node.members.me())
            .field("members", &self.node.members.sorted())
            .finish_non_exhaustive()
    }
}

/// What the listener and the store share.
struct Node {
    raft: Raft<TypeConfig>,
    members: Members,
    machine: MachineStore,
    peers: Arc<Peers>,
    timing: RaftTiming,
    notifier: ChangeNotifier,
    /// Closed while a rejoined member catches up: it neither votes nor starts elections.
    gate: Gate,
    /// This member's folder's incarnation, and the founders it knows.
    incarnation: String,
    founders: Founders,
}

impl RaftStore {
    /// Starts this member: opens its data folder (replaying its log), listens on its address,
    /// and joins the group. A member whose folder is empty proposes the initial membership
    /// (every member may: openraft accepts the same initial membership from several members).
    ///
    /// # Errors
    /// [`RaftError`] saying what to fix: the configuration, the folder (in use, unsafe,
    /// damaged), the TLS material, or the address.
    ///
    /// # Cancel safety
    /// Not cancel-safe: a cancelled start may leave the Raft node running until the runtime
    /// stops.
    pub async fn start(config: RaftConfig) -> Result<Self, RaftError> {
        config.openraft(true)?;
        let members = Members::new(&config.members, &config.listen)?;
        let tls = config.tls.as_ref().map(Tls::new).transpose()?;
        let folder = Folder::open(&config.dir)?;
        let mut log = LogStore::open(&folder)?;
        let notifier = Changes::channel().0;
        let machine = MachineStore::open(&folder, notifier.clone())?;
        let gate = Gate::open_or_closed(folder.path(MARKER))?;
        let empty = is_empty(&folder, &log, &machine, &gate)?;
        same_members(&folder, &log, &machine, &members)?;
        let bind = config.bind_address();
        let listener = TcpListener::bind(bind)
            .await
            .map_err(|source| RaftError::Listen {
                address: bind.to_owned(),
                source,
            })?;
        let peers = Arc::new(Peers::new(members.clone(), tls.clone()));
        let (incarnation, founders, form) = if empty {
            let joiner = Joiner {
                folder: &folder,
                gate: &gate,
                listener: &listener,
                peers: &peers,
                members: &members,
                tls: tls.clone(),
                config: &config,
            };
            joiner.first_start(&mut log).await?
        } else {
            let incarnation = log.incarnation().unwrap_or_default();
            (incarnation, read_founders(&folder)?, false)
        };
        let raft_config = Arc::new(config.openraft(!gate.is_closed())?);
        let network = Network {
            peers: peers.clone(),
            backoff: config.timing.heartbeat,
        };
        let raft = Raft::new(members.me(), raft_config, network, log, machine.clone())
            .await
            .map_err(|e| RaftError::Raft {
                message: format!("cannot start: {e}"),
            })?;
        tokio::spawn(log_leaders(raft.metrics(), members.clone()));
        let node = Arc::new(Node {
            raft,
            members: members.clone(),
            machine,
            peers,
            timing: config.timing,
            notifier,
            gate,
            incarnation,
            founders,
        });
        let store = Self {
            node: node.clone(),
            server: Arc::new(Mutex::new(None)),
            folder: Arc::new(Mutex::new(Some(folder))),
        };
        // The initial membership before answering anyone: a vote granted first would leave a
        // vote without a log, which the next start refuses.
        if form && let Err(e) = store.initialize().await {
            store.shutdown().await;
            return Err(e);
        }
        let server = tokio::spawn(async move { serve(&listener, node, members, tls).await });
        *store.server.lock().unwrap_or_else(|e| e.into_inner()) = Some(server);
        tracing::info!(
            id = store.node.members.me(),
            address = %config.listen,
            bound = %config.bind_address(),
            members = ?store.node.members.sorted(),
            empty,
            catching_up = store.node.gate.is_closed(),
            "raft member started"
        );
        Ok(store)
    }

    async fn initialize(&self) -> Result<(), RaftError> {
        match self.node.raft.initialize(self.node.members.nodes()).await {
            Ok(()) => Ok(()),
            // Another member's initial membership reached us first: the group is formed.
            Err(OrError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(RaftError::Raft {
                message: format!("cannot initialize the group: {e}"),
            }),
        }
    }

    /// Stops this member: its listener, its connections and its Raft node, and releases its
    /// data folder. Calls on any clone fail afterwards.
    ///
    /// # Cancel safety
    /// Not cancel-safe: cancelled, the member may be left half stopped.
    pub async fn shutdown(&self) {
        let server = self.server.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(server) = server {
            server.abort();
            let _ = server.await;
        }
        if let Err(e) = self.node.raft.shutdown().await {
            tracing::warn!(error = %e, "the raft node did not stop cleanly");
        }
        self.node.peers.close_all();
        drop(self.folder.lock().unwrap_or_else(|e| e.into_inner()).take());
        tracing::info!(id = self.node.members.me(), "raft member stopped");
    }

    /// This member's view of the group, from its own state (no network).
    pub fn status(&self) -> Status {
        self.node.status()
    }

    /// The view of the member at `address` (one of the configured members), asked over the
    /// transport.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if `address` is not a member or refuses us;
    /// [`Error::Unavailable`] if it cannot be reached in the request timeout.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn status_of(&self, address: &str) -> Result<Status, Error> {
        let members = &self.node.members;
        let Some(id) = (1u64..)
            .zip(members.sorted())
            .find_map(|(id, a)| (a == address).then_some(id))
        else {
            return Err(Error::InvalidConfig {
                message: format!("{address} is not one of the members {:?}", members.sorted()),
                source: None,
            });
        };
        if id == members.me() {
            return Ok(self.status());
        }
        let budget = self.node.timing.request_timeout;
        match self.node.peers.call(id, Request::Status, budget).await {
            Ok(Reply::Status(status)) => Ok(*status),
            Ok(_) => Err(Error::unavailable(format!(
                "{address} sent an unexpected reply"
            ))),
            Err(CallError::Refused(m)) => Err(Error::InvalidConfig {
                message: m,
                source: None,
            }),
            Err(e) => Err(Error::unavailable(e.to_string())),
        }
    }

    /// Deletes the record of `key`, as an operator might. The key's highest token is kept, so
    /// the next term's token is still above every earlier one.
    ///
    /// # Errors
    /// As a write: [`Error::Unavailable`] if it was not proposed, [`Error::Indeterminate`]
    /// if it may have been applied.
    ///
    /// # Cancel safety
    /// Not cancel-safe: a cancelled delete may still be applied.
    pub async fn delete(&self, key: &LeaseKey) -> Result<(), Error> {
        let key = key.as_str().to_owned();
        self.node
            .write(Command::DeleteLease { key })
            .await
            .map(drop)
    }

    /// Stores raw bytes as the record of `key`, bypassing every check (to plant a malformed
    /// record in a test).
    ///
    /// # Errors
    /// As [`delete`](Self::delete).
    ///
    /// # Cancel safety
    /// Not cancel-safe.
    pub async fn put_raw(&self, key: &LeaseKey, bytes: Vec<u8>) -> Result<(), Error> {
        let key = key.as_str().to_owned();
        self.node
            .write(Command::PutRaw { key, bytes })
            .await
            .map(drop)
    }

    /// Deletes the protected object `name`, as an operator might.
    ///
    /// # Errors
    /// As [`delete`](Self::delete).
    ///
    /// # Cancel safety
    /// Not cancel-safe.
    pub async fn delete_object(&self, name: &ObjectName) -> Result<(), Error> {
        let object = name.as_str().to_owned();
        self.node
            .write(Command::DeleteObject { object })
            .await
            .map(drop)
    }
}

fn budget_ms(deadline: Instant) -> u64 {
    let left = deadline.saturating_duration_since(Instant::now());
    u64::try_from(left.as_millis()).unwrap_or(u64::MAX)
}

/// Logs each change of the Raft leader this member knows of, until the node stops: which
/// member leads the group, and in which Raft term, is what an operator asks first.
async fn log_leaders(
    mut metrics: tokio::sync::watch::Receiver<openraft::RaftMetrics<u64, openraft::BasicNode>>,
    members: Members,
) {
    let mut known = None;
    loop {
        let (leader, term) = {
            let m = metrics.borrow_and_update();
            (m.current_leader, m.current_term)
        };
        if leader != known {
            known = leader;
            match leader {
                Some(id) if id == members.me() => {
                    tracing::info!(term, "this member is the raft leader");
                }
                Some(id) => tracing::info!(
                    leader = id,
                    address = members.address(id).unwrap_or("?"),
                    term,
                    "raft leader known"
                ),
                None => tracing::info!(term, "no raft leader known"),
            }
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// The outcome of a leader's answer, as the suite's error.
fn settle<T>(answer: Result<T, Failure>) -> Result<T, Error> {
    answer.map_err(|failure| match failure {
        Failure::NotLeader { .. } => Error::unavailable("the leader changed; nothing was written"),
        Failure::Unavailable(m) => Error::unavailable(m),
        Failure::Indeterminate(m) => Error::indeterminate(m),
        Failure::Timeout(m) => Error::unavailable(m),
    })
}

impl Node {
    /// The deadline of a call starting now: the core's, at most one request timeout away.
    fn deadline(&self) -> Instant {
        call_deadline().min(Instant::now() + self.timing.request_timeout)
    }

    fn leader(&self) -> Option<u64> {
        self.raft.metrics().borrow().current_leader
    }

    fn is_leader(&self) -> bool {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        m.state == ServerState::Leader && m.current_leader == Some(self.members.me())
    }

    fn status(&self) -> Status {
        let m = self.raft.metrics().borrow().clone();
        let address = |id: u64| self.members.address(id).map(str::to_owned);
        Status {
            id: m.id,
            address: address(m.id).unwrap_or_default(),
            leader: m.current_leader,
            leader_address: m.current_leader.and_then(address),
            role: format!("{:?}", m.state),
            term: m.current_term,
            last_log_index: m.last_log_index,
            last_applied_index: m.last_applied.map(|l| l.index),
            members: member_map(m.membership_config.nodes()),
            catching_up: self.gate.is_closed(),
            requests_sent: self.peers.sent(),
        }
    }

    fn history(&self) -> History {
        let m = self.raft.metrics().borrow().clone();
        History {
            entries: m.last_log_index.is_some_and(|i| i > 0) || m.snapshot.is_some(),
            vote: m.vote,
            incarnation: self.incarnation.clone(),
            founders: self.founders.clone(),
        }
    }

    /// Answers a vote request; refuses it while this member catches up after a rejoin.
    async fn vote(&self, rpc: VoteRequest<u64>) -> Result<VoteResponse<u64>, OrError<u64>> {
        // In a group of two every commit had the other member: its vote is safe to take.
        if self.gate.is_closed() && self.members.sorted().len() > 2 {
            let vote = self.raft.metrics().borrow().vote;
            tracing::debug!(candidate = %rpc.vote, "not voting while catching up after a rejoin");
            return Ok(VoteResponse::new(vote, None, false));
        }
        self.raft.vote(rpc).await
    }

    /// Appends a leader's entries; a member catching up after a rejoin opens its gate once it
    /// holds everything the leader has committed in the leader's own term (which, by Raft's
    /// leader completeness, is everything committed before).
    async fn append_entries(
        &self,
        rpc: AppendEntriesRequest<TypeConfig>,
    ) -> Result<AppendEntriesResponse<u64>, OrError<u64>> {
        if !self.gate.is_closed() {
            return self.raft.append_entries(rpc).await;
        }
        let leader = rpc.vote;
        let term = leader.leader_id.term;
        let sent = rpc.entries.last().map(|e| e.log_id).or(rpc.prev_log_id);
        let commit = rpc.leader_commit;
        let answer = self.raft.append_entries(rpc).await;
        let matched = match &answer {
            Ok(AppendEntriesResponse::Success) => sent,
            Ok(AppendEntriesResponse::PartialSuccess(matched)) => *matched,
            _ => None,
        };
        let caught_up = commit.is_some_and(|c| {
            leader.is_committed()
                && c.leader_id == *leader.leader_id()
                && matched.is_some_and(|m| m.index >= c.index)
        });
        if caught_up {
            match self.gate.open() {
                Ok(true) => {
                    self.raft.runtime_config().elect(true);
                    tracing::info!(
                        term,
                        "caught up with the group after a rejoin: voting again"
                    );
                }
                Ok(false) => {}
                Err(e) => tracing::error!(
                    error = %e,
                    "caught up after a rejoin, but the marker file cannot be removed; still \
                     not voting"
                ),
            }
        }
        answer
    }

    /// Proposes `command` here, as the leader, and waits for it to apply until `deadline`.
    async fn write_local(&self, command: Command, deadline: Instant) -> Result<Response, Failure> {
        if !self.is_leader() {
            return Err(Failure::NotLeader {
                leader: self.leader(),
            });
        }
        let rx = self.raft.client_write_ff(command).await.map_err(|e| {
            Failure::Unavailable(format!("the raft node stopped ({e}); nothing was written"))
        })?;
        match timeout_at(deadline, rx).await {
            Ok(Ok(Ok(written))) => Ok(written.data),
            // Once proposed, a refusal may come from a truncation of our entry, which a later
            // leader may still commit: unknown.
            Ok(Ok(Err(ClientWriteError::ForwardToLeader(_)))) => Err(Failure::Indeterminate(
                "the leader lost its leadership while the write was in flight; it may still be \
                 applied"
                    .to_owned(),
            )),
            Ok(Ok(Err(e))) => Err(Failure::Indeterminate(format!("the write failed: {e}"))),
            Ok(Err(_)) => Err(Failure::Indeterminate(
                "the raft node stopped before answering; the write may have been applied"
                    .to_owned(),
            )),
            Err(_) => Err(Failure::Indeterminate(
                "the write was proposed but not committed within the request timeout (no \
                 quorum?); it may still be applied"
                    .to_owned(),
            )),
        }
    }

    /// Reads `query` here, as the leader, after confirming leadership with a quorum.
    async fn read_local(&self, query: &Query, deadline: Instant) -> Result<Answer, Failure> {
        match timeout_at(deadline, self.raft.ensure_linearizable()).await {
            Err(_) => {
                return Err(Failure::Timeout(
                    "the read index was not confirmed in time".into(),
                ));
            }
            Ok(Err(OrError::APIError(openraft::error::CheckIsLeaderError::ForwardToLeader(f)))) => {
                return Err(Failure::NotLeader {
                    leader: f.leader_id,
                });
            }
            Ok(Err(e)) => return Err(Failure::Unavailable(format!("cannot read: {e}"))),
            Ok(Ok(_)) => {}
        }
        Ok(self.machine.read(|m| match query {
            Query::Lease(key) => Answer::Lease(m.leases.lease(key).cloned()),
            Query::Object(name) => Answer::Object(m.leases.object(name).cloned()),
        }))
    }

    /// Runs a client write on the leader, forwarding it if that is another member.
    async fn write(&self, command: Command) -> Result<Response, Error> {
        // An entry that no frame can carry would block replication for good: refuse it here.
        let size = serde_json::to_vec(&command).map_or(usize::MAX, |b| b.len());
        if size > MAX_COMMAND {
            return Err(Error::InvalidConfig {
                message: format!(
                    "nothing was written: the write encodes to {size} bytes, more than the \
                     {MAX_COMMAND} bytes a raft entry may have; write less"
                ),
                source: None,
            });
        }
        let deadline = self.deadline();
        let mut last = "no leader is known".to_owned();
        while Instant::now() < deadline {
            match self.leader() {
                Some(id) if id == self.members.me() => {
                    match self.write_local(command.clone(), deadline).await {
                        Err(Failure::NotLeader { .. }) => last = "leadership is moving".into(),
                        answer => return settle(answer),
                    }
                }
                Some(id) => {
                    let body = Request::Write {
                        command: command.clone(),
                        budget_ms: budget_ms(deadline),
                    };
                    let left = deadline.saturating_duration_since(Instant::now());
                    match self.peers.call(id, body, left).await {
                        Ok(Reply::Write(Err(Failure::NotLeader { .. }))) => {
                            last = format!("member {id} is no longer the leader");
                        }
                        Ok(Reply::Write(answer)) => return settle(answer),
                        Ok(_) => return Err(Error::indeterminate("the leader sent a bad reply")),
                        Err(CallError::NotSent(m)) => last = m,
                        Err(e @ CallError::TooLarge(_)) => {
                            return Err(Error::InvalidConfig {
                                message: format!("nothing was written: {e}; write less"),
                                source: None,
                            });
                        }
                        Err(CallError::Lost(m)) => {
                            return Err(Error::indeterminate(format!(
                                "the write was sent to the leader but {m}"
                            )));
                        }
                        Err(CallError::Refused(m)) => {
                            return Err(Error::InvalidConfig {
                                message: m,
                                source: None,
                            });
                        }
                    }
                }
                None => {}
            }
            sleep(RETRY_PAUSE.min(deadline.saturating_duration_since(Instant::now()))).await;
        }
        Err(Error::unavailable(format!(
            "the write was not proposed: {last} (no quorum of the raft group is reachable?)"
        )))
    }

    /// Runs a client read on the leader, forwarding it if that is another member.
    async fn read(&self, query: Query) -> Result<Answer, Error> {
        let deadline = self.deadline();
        let started = Instant::now();
        let mut last = "no leader is known".to_owned();
        while Instant::now() < deadline {
            let answer = match self.leader() {
                Some(id) if id == self.members.me() => self.read_local(&query, deadline).await,
                Some(id) => {
                    let body = Request::Read {
                        query: query.clone(),
                        budget_ms: budget_ms(deadline),
                    };
                    let left = deadline.saturating_duration_since(Instant::now());
                    match self.peers.call(id, body, left).await {
                        Ok(Reply::Read(answer)) => answer,
                        Ok(_) => Err(Failure::Unavailable("the leader sent a bad reply".into())),
                        Err(CallError::Refused(m)) => {
                            return Err(Error::InvalidConfig {
                                message: m,
                                source: None,
                            });
                        }
                        Err(e) => Err(Failure::Unavailable(e.to_string())),
                    }
                }
                None => Err(Failure::Unavailable("no leader is known".into())),
            };
            match answer {
                Ok(answer) => return Ok(answer),
                Err(Failure::Unavailable(m) | Failure::Timeout(m) | Failure::Indeterminate(m)) => {
                    last = m
                }
                Err(Failure::NotLeader { .. }) => last = "leadership is moving".into(),
            }
            sleep(RETRY_PAUSE.min(deadline.saturating_duration_since(Instant::now()))).await;
        }
        tracing::debug!(elapsed = ?started.elapsed(), "a raft read gave up: {last}");
        Err(Error::Timeout {
            operation: "a linearizable read of the raft group",
            after: self.timing.request_timeout.min(started.elapsed()),
        })
    }
}

impl Handler for Node {
    async fn handle(&self, _from: u64, body: Request) -> Reply {
        let within = |budget_ms: u64| {
            let budget = Duration::from_millis(budget_ms).min(self.timing.request_timeout);
            Instant::now() + budget
        };
        match body {
            Request::AppendEntries(rpc) => Reply::AppendEntries(self.append_entries(rpc).await),
            Request::Vote(rpc) => Reply::Vote(self.vote(rpc).await),
            Request::InstallSnapshot(rpc) => {
                Reply::InstallSnapshot(self.raft.install_snapshot(rpc).await)
            }
            Request::Write { command, budget_ms } => {
                Reply::Write(self.write_local(command, within(budget_ms)).await)
            }
            Request::Read { query, budget_ms } => {
                Reply::Read(self.read_local(&query, within(budget_ms)).await)
            }
            Request::Status => Reply::Status(Box::new(self.status())),
            Request::History => Reply::History(self.history()),
        }
    }
}

fn decode(key: &str, stored: StoredBytes) -> Result<Stored, Error> {
    Ok(Stored {
        record: LeaseRecord::from_json(key, &stored.bytes)?,
        revision: Revision::new(stored.revision),
    })
}

#[async_trait]
impl LeaseBackend for RaftStore {
    fn name(&self) -> &'static str {
        "raft"
    }

    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        match self
            .node
            .read(Query::Lease(key.as_str().to_owned()))
            .await?
        {
            Answer::Lease(found) => found.map(|s| decode(key.as_str(), s)).transpose(),
            Answer::Object(_) => Err(Error::unavailable("the leader answered another read")),
        }
    }

    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        let key = request.key.as_str().to_owned();
        match self.node.write(Command::write(&request)).await? {
            Response::Written(stored) => decode(&key, stored)
                .map(WriteOutcome::Written)
                .map_err(|e| Error::indeterminate(format!("written, but unreadable: {e}"))),
            Response::Conflict(current) => Ok(WriteOutcome::Conflict {
                current: current.and_then(|s| decode(&key, s).ok()),
            }),
            Response::Refused(reason) => Err(Error::Backend {
                message: format!("the group refused the record of {key}: {reason}"),
                source: None,
            }),
            other => Err(Error::indeterminate(format!(
                "an unexpected answer: {other:?}"
            ))),
        }
    }

    fn changes(&self, _key: &LeaseKey) -> Option<Changes> {
        Some(self.node.notifier.subscribe())
    }
}

#[async_trait]
impl FencedCas for RaftStore {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        match self
            .node
            .read(Query::Object(object.as_str().to_owned()))
            .await?
        {
            Answer::Object(found) => Ok(found.map(|o| FencedObject {
                fence: FencingToken(o.fence),
                value: o.value,
                revision: Revision::new(o.revision),
            })),
            Answer::Lease(_) => Err(Error::unavailable("the leader answered another read")),
        }
    }

    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        let command = Command::PutFenced {
            object: put.object.as_str().to_owned(),
            expected: Condition::from(put.expected),
            fence: put.fence.token.get(),
            value: put.value.to_vec(),
        };
        match self.node.write(command).await? {
            Response::ObjectWritten(revision) => Ok(ObjectWrite::Written(Revision::new(revision))),
            Response::ObjectConflict => Ok(ObjectWrite::Conflict),
            other => Err(Error::indeterminate(format!(
                "an unexpected answer: {other:?}"
            ))),
        }
    }
}
