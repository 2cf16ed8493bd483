//! The transport between members: TCP (TLS when configured), frames of a `u32` length
//! (big-endian, at most [`MAX_FRAME`]) and JSON. Every request carries the sender's member id
//! and the digest of its member set; a member refuses a sender that is not in its set or that
//! was configured with another set (and, with TLS, one whose certificate does not name the
//! sender's host).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError as OrError,
    RemoteError, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Vote};
use rustls_pki_types::CertificateDer;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::{Instant, timeout, timeout_at};

use crate::config::{Members, host_of};
use crate::state::{Command, Response, StoredBytes, StoredObject, TypeConfig};
use crate::status::Status;
pub(crate) use crate::storage::MAX_FRAME;
use crate::tls::{Tls, names_host, server_name};

/// How long an idle connection is kept open by the listener.
const IDLE: Duration = Duration::from_secs(60);
/// How long a TLS handshake may take on the listener's side.
const HANDSHAKE: Duration = Duration::from_secs(10);
/// Idle connections kept per peer.
const POOL: usize = 8;

/// What a member asks another.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Request {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<u64>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// A client write forwarded to the leader, with the time left to the caller.
    Write {
        command: Command,
        budget_ms: u64,
    },
    /// A client read forwarded to the leader.
    Read {
        query: Query,
        budget_ms: u64,
    },
    Status,
    /// Asked by a member with an empty data folder before it joins.
    History,
}

/// What a member tells a member with an empty folder of its own state.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct History {
    /// Whether its log (or snapshot) holds anything beyond the initial membership.
    pub(crate) entries: bool,
    /// Its current vote, whose term is its current term (0 before the group's first election).
    pub(crate) vote: Vote<u64>,
    /// Its folder's incarnation.
    pub(crate) incarnation: String,
    /// The incarnation of each founding member, by id (empty before the group formed).
    pub(crate) founders: Founders,
}

/// The incarnation of each member the group formed with, by member id.
pub(crate) type Founders = BTreeMap<u64, String>;

impl History {
    /// A member that has seen no election and no entry.
    pub(crate) fn is_empty(&self) -> bool {
        self.vote.leader_id.term == 0 && !self.entries
    }
}

/// What a read asks for.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum Query {
    Lease(String),
    Object(String),
}

/// What a read found.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum Answer {
    Lease(Option<StoredBytes>),
    Object(Option<StoredObject>),
}

/// Why the leader did not answer a forwarded client call.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum Failure {
    /// This member is not the leader; nothing was proposed.
    NotLeader { leader: Option<u64> },
    /// Not proposed (shutting down, no quorum for a read).
    Unavailable(String),
    /// A write that may have been applied.
    Indeterminate(String),
    /// A read that did not finish in time.
    Timeout(String),
}

/// A request with the sender's identity.
#[derive(Debug, Serialize, Deserialize)]
struct Envelope {
    from: u64,
    members_digest: String,
    body: Request,
}

/// The answer to a request.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Reply {
    AppendEntries(Result<AppendEntriesResponse<u64>, OrError<u64>>),
    Vote(Result<VoteResponse<u64>, OrError<u64>>),
    InstallSnapshot(Result<InstallSnapshotResponse<u64>, OrError<u64, InstallSnapshotError>>),
    Write(Result<Response, Failure>),
    Read(Result<Answer, Failure>),
    Status(Box<Status>),
    History(History),
    /// The member is still starting (asking the others before it joins): try again later.
    NotReady,
    /// The request was refused: the reason, and the refusing member's member set.
    Refused {
        reason: String,
        members: Vec<String>,
    },
}

/// Reads one frame, refusing one longer than [`MAX_FRAME`] before allocating for it.
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Vec<u8>> {
    let len = r.read_u32().await? as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes exceeds the limit of {MAX_FRAME} bytes"),
        ));
    }
    let mut buf = vec![0; len];
    r.read_exact(&mut buf).await?;
    Ok(buf)
}

/// Writes one frame.
pub(crate) async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, bytes: &[u8]) -> io::Result<()> {
    if bytes.len() > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a frame of {} bytes exceeds the limit of {MAX_FRAME} bytes",
                bytes.len()
            ),
        ));
    }
    w.write_u32(bytes.len() as u32).await?;
    w.write_all(bytes).await?;
    w.flush().await
}

/// A byte stream to a peer: TCP or TLS over TCP.
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}
type Conn = Box<dyn Io>;

/// Why a call to a peer failed.
#[derive(Debug)]
pub(crate) enum CallError {
    /// The request never left: no connection, or the handshake failed.
    NotSent(String),
    /// The request may have arrived: the connection broke or the answer did not come in time.
    Lost(String),
    /// The peer refused the request (not a member, another member set, a bad certificate).
    Refused(String),
    /// The request is larger than a frame may be; nothing was sent.
    TooLarge(usize),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::NotSent(m) | CallError::Lost(m) | CallError::Refused(m) => f.write_str(m),
            CallError::TooLarge(n) => write!(
                f,
                "a request of {n} bytes exceeds the frame limit of {MAX_FRAME} bytes"
            ),
        }
    }
}

/// This member's client side: connections to the other members.
pub(crate) struct Peers {
    members: Members,
    tls: Option<Tls>,
    idle: Mutex<HashMap<u64, Vec<Conn>>>,
    /// Requests sent (or attempted) since start.
    sent: AtomicU64,
}

impl Peers {
    pub(crate) fn new(members: Members, tls: Option<Tls>) -> Self {
        Self {
            members,
            tls,
            idle: Mutex::new(HashMap::new()),
            sent: AtomicU64::new(0),
        }
    }

    /// Requests sent (or attempted) to other members since start.
    pub(crate) fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Drops every idle connection.
    pub(crate) fn close_all(&self) {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    fn take_idle(&self, target: u64) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.get_mut(&target).and_then(Vec::pop)
    }

    fn put_idle(&self, target: u64, conn: Conn) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let conns = idle.entry(target).or_default();
        if conns.len() < POOL {
            conns.push(conn);
        }
    }

    async fn dial(&self, address: &str) -> io::Result<Conn> {
        let tcp = TcpStream::connect(address).await?;
        tcp.set_nodelay(true)?;
        let Some(tls) = &self.tls else {
            return Ok(Box::new(tcp));
        };
        let host = host_of(address).map_err(io::Error::other)?;
        let name = server_name(host)
            .ok_or_else(|| io::Error::other(format!("{host} is not a valid TLS name")))?;
        Ok(Box::new(tls.connector.connect(name, tcp).await?))
    }

    /// Sends `body` to member `target` and waits for its reply, all within `budget`.
    ///
    /// A client write always goes on a new connection, so that a failure to connect is known
    /// not to have sent it; other requests reuse idle connections (and retry once on a new one,
    /// since they change nothing or are safe to repeat).
    pub(crate) async fn call(
        &self,
        target: u64,
        body: Request,
        budget: Duration,
    ) -> Result<Reply, CallError> {
        let deadline = Instant::now() + budget;
        let address = self
            .members
            .address(target)
            .ok_or_else(|| CallError::NotSent(format!("{target} is not a member id")))?
            .to_owned();
        let is_write = matches!(body, Request::Write { .. });
        let envelope = Envelope {
            from: self.members.me(),
            members_digest: self.members.digest().to_owned(),
            body,
        };
        let bytes = serde_json::to_vec(&envelope)
            .map_err(|e| CallError::NotSent(format!("cannot encode a request: {e}")))?;
        if bytes.len() > MAX_FRAME {
            return Err(CallError::TooLarge(bytes.len()));
        }
        self.sent.fetch_add(1, Ordering::Relaxed);
        if !is_write
            && let Some(conn) = self.take_idle(target)
            && let Ok(Ok((conn, reply))) = timeout_at(deadline, exchange(conn, &bytes)).await
        {
            self.put_idle(target, conn);
            return self.interpret(&address, reply);
        }
        let conn = match timeout_at(deadline, self.dial(&address)).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return Err(CallError::NotSent(format!("cannot reach {address}: {e}"))),
            Err(_) => {
                return Err(CallError::NotSent(format!(
                    "cannot reach {address} within {budget:?}"
                )));
            }
        };
        match timeout_at(deadline, exchange(conn, &bytes)).await {
            Ok(Ok((conn, reply))) => {
                self.put_idle(target, conn);
                self.interpret(&address, reply)
            }
            Ok(Err(e)) => Err(CallError::Lost(format!(
                "the connection to {address} broke: {e}"
            ))),
            Err(_) => Err(CallError::Lost(format!(
                "{address} did not answer within {budget:?}"
            ))),
        }
    }

    fn interpret(&self, address: &str, reply: Reply) -> Result<Reply, CallError> {
        match reply {
            Reply::NotReady => Err(CallError::NotSent(format!(
                "member {address} is still starting"
            ))),
            Reply::Refused { reason, members } => {
                let message = format!(
                    "member {address} refused this member: {reason} (its members: {members:?}; \
                     ours: {:?})",
                    self.members.sorted()
                );
                tracing::error!("{message}");
                Err(CallError::Refused(message))
            }
            reply => Ok(reply),
        }
    }
}

async fn exchange(mut conn: Conn, bytes: &[u8]) -> io::Result<(Conn, Reply)> {
    write_frame(&mut conn, bytes).await?;
    let answer = read_frame(&mut conn).await?;
    let reply = serde_json::from_slice(&answer)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("a bad reply: {e}")))?;
    Ok((conn, reply))
}

/// What the listener hands each admitted request to.
pub(crate) trait Handler: Send + Sync + 'static {
    /// Answers `body` from member `from`.
    fn handle(&self, from: u64, body: Request) -> impl Future<Output = Reply> + Send;
}

/// Accepts connections until the future is dropped (which also ends every connection).
pub(crate) async fn serve<H: Handler>(
    listener: &TcpListener,
    handler: Arc<H>,
    members: Members,
    tls: Option<Tls>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    let (handler, members, tls) = (handler.clone(), members.clone(), tls.clone());
                    connections.spawn(async move {
                        if let Err(e) = connection(tcp, handler, &members, tls).await {
                            tracing::debug!(%peer, error = %e, "a member connection ended");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next() => {}
        }
    }
}

async fn connection<H: Handler>(
    tcp: TcpStream,
    handler: Arc<H>,
    members: &Members,
    tls: Option<Tls>,
) -> io::Result<()> {
    tcp.set_nodelay(true)?;
    let (mut io, cert): (Conn, Option<CertificateDer<'static>>) = match tls {
        None => (Box::new(tcp), None),
        Some(tls) => {
            let stream = match timeout(HANDSHAKE, tls.acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "refused a TLS connection");
                    return Err(e);
                }
                Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "TLS handshake")),
            };
            let cert = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| c.clone().into_owned());
            (Box::new(stream), cert)
        }
    };
    loop {
        let Ok(frame) = timeout(IDLE, read_frame(&mut io)).await else {
            return Ok(());
        };
        let reply = match serde_json::from_slice::<Envelope>(&frame?) {
            Err(e) => Err(format!("not a request of this protocol version: {e}")),
            Ok(envelope) => match admit(&envelope, members, cert.as_ref()) {
                Ok(()) => Ok(handler.handle(envelope.from, envelope.body).await),
                Err(reason) => Err(reason),
            },
        };
        let refused = reply.is_err();
        let reply = reply.unwrap_or_else(|reason| {
            tracing::error!("refusing a request: {reason}");
            Reply::Refused {
                reason,
                members: members.sorted().to_vec(),
            }
        });
        let bytes = serde_json::to_vec(&reply).map_err(io::Error::other)?;
        write_frame(&mut io, &bytes).await?;
        if refused {
            return Ok(());
        }
    }
}

/// Checks the sender of `envelope`: a member of our set, configured with the same set, and
/// (with TLS) holding a certificate for its host.
fn admit(
    envelope: &Envelope,
    members: &Members,
    cert: Option<&CertificateDer<'_>>,
) -> Result<(), String> {
    if envelope.members_digest != members.digest() {
        return Err(format!(
            "the sender (member id {}) was configured with another member set (digest {}) than \
             this member's {:?} (digest {}); start every member with the same list",
            envelope.from,
            envelope.members_digest,
            members.sorted(),
            members.digest()
        ));
    }
    let Some(address) = members.address(envelope.from) else {
        return Err(format!(
            "sender id {} is not a member of {:?}",
            envelope.from,
            members.sorted()
        ));
    };
    if let Some(cert) = cert {
        let host = host_of(address).map_err(|e| e.to_string())?;
        if !names_host(cert, host) {
            return Err(format!(
                "the sender claims to be member {address}, but its certificate does not name \
                 {host}"
            ));
        }
    }
    Ok(())
}

/// openraft's network: one client per target member, over [`Peers`].
pub(crate) struct Network {
    pub(crate) peers: Arc<Peers>,
    /// How long replication to an unreachable member pauses (openraft's default is 500 ms).
    pub(crate) backoff: Duration,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> PeerClient {
        PeerClient {
            peers: self.peers.clone(),
            target,
            backoff: self.backoff,
        }
    }
}

/// openraft's client of one member.
pub(crate) struct PeerClient {
    peers: Arc<Peers>,
    target: u64,
    backoff: Duration,
}

type RpcError<E = openraft::error::Infallible> = RPCError<u64, BasicNode, OrError<u64, E>>;
type RpcResult<T, E = openraft::error::Infallible> = Result<T, RpcError<E>>;

impl PeerClient {
    async fn rpc(&self, body: Request, option: &RPCOption) -> Result<Reply, io::Error> {
        self.peers
            .call(self.target, body, option.hard_ttl())
            .await
            .map_err(|e| match e {
                CallError::NotSent(m) | CallError::Refused(m) => {
                    io::Error::new(io::ErrorKind::NotConnected, m)
                }
                CallError::Lost(m) => io::Error::other(m),
                too_large @ CallError::TooLarge(_) => {
                    io::Error::new(io::ErrorKind::FileTooLarge, too_large.to_string())
                }
            })
    }

    fn failed<E: std::error::Error>(&self, e: &io::Error) -> RpcError<E> {
        if e.kind() == io::ErrorKind::NotConnected {
            RPCError::Unreachable(Unreachable::new(e))
        } else {
            RPCError::Network(NetworkError::new(e))
        }
    }

    fn unexpected<E: std::error::Error>(&self) -> RpcError<E> {
        let e = io::Error::other(format!("member {} sent an unexpected reply", self.target));
        RPCError::Network(NetworkError::new(&e))
    }

    fn remote<E: std::error::Error>(&self, e: OrError<u64, E>) -> RpcError<E> {
        RPCError::RemoteError(RemoteError::new(self.target, e))
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(self.backoff))
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<u64>> {
        let entries = rpc.entries.len() as u64;
        match self.rpc(Request::AppendEntries(rpc), &option).await {
            Ok(Reply::AppendEntries(r)) => r.map_err(|e| self.remote(e)),
            Ok(_) => Err(self.unexpected()),
            // Too many entries for one frame: openraft sends fewer.
            Err(e) if e.kind() == io::ErrorKind::FileTooLarge && entries > 1 => Err(
                RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(entries / 2)),
            ),
            Err(e) => Err(self.failed(&e)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<u64>, InstallSnapshotError> {
        match self.rpc(Request::InstallSnapshot(rpc), &option).await {
            Ok(Reply::InstallSnapshot(r)) => r.map_err(|e| self.remote(e)),
            Ok(_) => Err(self.unexpected()),
            Err(e) => Err(self.failed(&e)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<u64>> {
        match self.rpc(Request::Vote(rpc), &option).await {
            Ok(Reply::Vote(r)) => r.map_err(|e| self.remote(e)),
            Ok(_) => Err(self.unexpected()),
            Err(e) => Err(self.failed(&e)),
        }
    }
}

/// The member ids and addresses of a membership, for [`Status`].
pub(crate) fn member_map<'a>(
    nodes: impl Iterator<Item = (&'a u64, &'a BasicNode)>,
) -> BTreeMap<u64, String> {
    nodes.map(|(id, n)| (*id, n.addr.clone())).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn only_members_of_the_same_set_are_admitted() {
        let ours = Members::new(&["a:1".into(), "b:2".into(), "c:3".into()], "a:1").unwrap();
        let envelope = |from, digest: &str| Envelope {
            from,
            members_digest: digest.to_owned(),
            body: Request::Status,
        };
        assert!(admit(&envelope(2, ours.digest()), &ours, None).is_ok());
        let stranger = admit(&envelope(4, ours.digest()), &ours, None).unwrap_err();
        assert!(stranger.contains("not a member"), "{stranger}");
        let other = Members::new(&["a:1".into(), "b:2".into()], "a:1").unwrap();
        let mismatch = admit(&envelope(2, other.digest()), &ours, None).unwrap_err();
        assert!(
            mismatch.contains("another member set") && mismatch.contains("c:3"),
            "{mismatch}"
        );
    }

    #[tokio::test]
    async fn a_frame_over_the_limit_is_refused_before_allocating() {
        let mut bytes = ((MAX_FRAME as u32) + 1).to_be_bytes().to_vec();
        bytes.extend_from_slice(b"tiny");
        let err = read_frame(&mut bytes.as_slice()).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("exceeds"), "{err}");
        let mut out = Vec::new();
        write_frame(&mut out, b"hello").await.unwrap();
        assert_eq!(read_frame(&mut out.as_slice()).await.unwrap(), b"hello");
    }
}
