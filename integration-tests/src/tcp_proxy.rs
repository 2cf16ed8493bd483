//! A byte-level fault proxy for stores that do not speak plain HTTP/1: etcd (gRPC over HTTP/2)
//! and ZooKeeper (its own binary protocol). Where [`crate::proxy`] sees requests, this one sees
//! only connections and bytes, and its faults are the ones a network makes:
//!
//! - a **partition** ([`TcpFaultProxy::partition`]): no byte moves in either direction on any
//!   connection, open or new, and nothing is closed; [`TcpFaultProxy::heal`] then closes every
//!   connection that lived through it (what was held is lost, as in a real partition), so the
//!   clients reconnect, and new connections are forwarded again (`partition(false)` does the
//!   same; `heal` also ends the refusal below);
//! - **refused connections** ([`TcpFaultProxy::refuse_new`]): accepted and closed at once;
//! - a **reset** of every open connection ([`TcpFaultProxy::reset_all`]): a server restart as
//!   its clients see it;
//! - a **cut of one origin** ([`TcpFaultProxy::cut`]): with [`Origins`], each connection is
//!   traced to the process (one of a few registered ones, by index) that opened it, and the
//!   connections of a cut origin are held as in a partition while the others go on; the end of
//!   the cut closes what it held. This is how one member of a group that dials the others'
//!   proxies alike is cut from them (Raft members, which all dial the same addresses);
//! - **late delivery** ([`TcpFaultProxy::late`]): from client to server only, each chunk of
//!   bytes read from a client is, with a given probability (seeded dice), held for a while
//!   before it is forwarded, and the bytes behind it on the same connection queue behind it (one
//!   byte stream: the order is kept). With a hold above the client's request timeout, the
//!   client gives up while its request is still on its way, and the server applies it late.
//!   What was held still goes out after its hold when the fault ends or the client leaves.
//!
//! Each accepted connection gets a fresh connection to the upstream, and bytes are copied both
//! ways as they come (a half-close is passed on). The controls take effect at once, on open
//! connections too, from any thread or task. Dropping the proxy stops it and closes every
//! connection.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leader_core::conformance::Rng;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// What the proxy did so far (a snapshot, see [`TcpFaultProxy::counters`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpProxyCounters {
    /// Connections accepted, refused ones included.
    pub accepted: u64,
    /// Connections open now (forwarding or held by a partition).
    pub open: u64,
    /// Connections closed at once because new connections were refused.
    pub refused: u64,
    /// Open connections the proxy closed: by [`TcpFaultProxy::reset_all`], or by
    /// [`TcpFaultProxy::heal`] after a partition.
    pub reset: u64,
    /// Connections closed because the upstream could not be reached.
    pub upstream_failed: u64,
    /// Bytes forwarded from clients to the upstream.
    pub bytes_to_upstream: u64,
    /// Bytes forwarded from the upstream to clients.
    pub bytes_to_client: u64,
    /// Chunks of client bytes the late-delivery fault held and then forwarded (the bytes that
    /// merely queued behind them are not counted).
    pub late: u64,
    /// Connections of a proxy with [`Origins`] that a process other than the origins holds
    /// (a cut never holds them: a test that cuts should see none it did not open itself). A
    /// connection whose client closed it before it was traced is closed, not counted.
    pub untraced: u64,
}

#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    open: AtomicU64,
    refused: AtomicU64,
    reset: AtomicU64,
    upstream_failed: AtomicU64,
    bytes_to_upstream: AtomicU64,
    bytes_to_client: AtomicU64,
    late: AtomicU64,
    untraced: AtomicU64,
}

/// The most origins a proxy tells apart.
pub const MAX_ORIGINS: usize = 8;

/// The controls in force. The counters let a connection see a partition or a reset that came
/// and went while it was not looking.
#[derive(Clone, Copy, Debug, Default)]
struct Control {
    partitioned: bool,
    /// Partitions begun so far.
    partitions: u64,
    /// The origins cut now (bit `i`: origin `i`).
    cut: u8,
    /// Cuts begun so far, per origin.
    cuts: [u64; MAX_ORIGINS],
    refuse_new: bool,
    /// Calls of `reset_all` so far.
    resets: u64,
    /// The late-delivery fault: the fraction of client chunks held, and for how long (off if
    /// either is zero).
    late_fraction: f64,
    late_by: Duration,
}

impl Control {
    /// Whether a connection of `origin` is held now.
    fn blocked(&self, origin: Option<usize>) -> bool {
        self.partitioned || origin.is_some_and(|o| self.is_cut(o))
    }

    /// Whether origin `o` is cut now.
    fn is_cut(&self, o: usize) -> bool {
        self.cut & (1 << o) != 0
    }

    /// Which partition and which cut of `origin` are the latest: a forwarding connection that
    /// sees either number move (a fault came and went before it looked) is closed.
    fn epoch(&self, origin: Option<usize>) -> (u64, u64) {
        (self.partitions, origin.map_or(0, |o| self.cuts[o]))
    }

    /// The hold of the late-delivery fault, if it is on.
    fn late(&self) -> Option<(f64, Duration)> {
        (self.late_fraction > 0.0 && !self.late_by.is_zero())
            .then_some((self.late_fraction, self.late_by))
    }
}

/// The processes whose connections a proxy tells apart, by index (at most [`MAX_ORIGINS`]):
/// a connection is traced (through `/proc/net/tcp` and each process's open files) to the
/// process, or one of its descendants, that holds its other end. One `Origins` may serve many
/// proxies; [`set`](Self::set) a restarted process's new pid.
#[derive(Clone, Debug, Default)]
pub struct Origins(Arc<Mutex<Vec<Option<u32>>>>);

impl Origins {
    /// No process known yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Origin `index` is the process `pid` (and its descendants) from now on.
    ///
    /// # Panics
    /// If `index` is not below [`MAX_ORIGINS`].
    pub fn set(&self, index: usize, pid: u32) {
        assert!(index < MAX_ORIGINS, "at most {MAX_ORIGINS} origins");
        let mut pids = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if pids.len() <= index {
            pids.resize(index + 1, None);
        }
        pids[index] = Some(pid);
    }

    /// Who opened the connection from `peer` to `local` (the proxy's end).
    fn of(&self, peer: SocketAddr, local: SocketAddr) -> Trace {
        let inode = match Socket::settled(peer.port(), local.port()) {
            Socket::Held(inode) => inode,
            Socket::Orphan | Socket::Missing => return Trace::Gone,
            Socket::Unknown => return Trace::Stranger,
        };
        let target = format!("socket:[{inode}]");
        let pids = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let parents = crate::parents();
        let found = pids.iter().enumerate().find_map(|(index, pid)| {
            let pid = (*pid)?;
            let mut tree = crate::descendants_among(&parents, pid);
            tree.push(pid);
            tree.iter().any(|p| holds(*p, &target)).then_some(index)
        });
        match found {
            Some(index) => Trace::Origin(index),
            // Closed while it was looked for: no process holds it any more.
            None if !matches!(
                Socket::settled(peer.port(), local.port()),
                Socket::Held(now) if now == inode
            ) =>
            {
                Trace::Gone
            }
            None => Trace::Stranger,
        }
    }
}

/// What tracing a connection found.
enum Trace {
    /// One of the origins holds its other end.
    Origin(usize),
    /// A process that is none of the origins holds it.
    Stranger,
    /// Its other end is closed already (no process holds it): the client gave up on it.
    Gone,
}

/// What the kernel's socket tables say of the socket whose local port is `local_port` and
/// remote port `remote_port`.
#[derive(Debug, PartialEq, Eq)]
enum Socket {
    /// Held by a process: its inode.
    Held(String),
    /// Listed with no inode: no process holds it any more (closed, still shutting down).
    Orphan,
    /// Not listed (gone, or skipped: the tables are read in pieces, not at one instant).
    Missing,
    /// The tables cannot be read (no `/proc`).
    Unknown,
}

impl Socket {
    fn of(local_port: u16, remote_port: u16) -> Self {
        let mut readable = false;
        for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
            let Ok(text) = std::fs::read_to_string(table) else {
                continue;
            };
            readable = true;
            let port = |field: &str| {
                field
                    .rsplit_once(':')
                    .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
            };
            for line in text.lines().skip(1) {
                let parts: Vec<&str> = line.split_whitespace().collect();
                if parts.len() >= 10
                    && port(parts[1]) == Some(local_port)
                    && port(parts[2]) == Some(remote_port)
                {
                    return if parts[9] == "0" {
                        Socket::Orphan
                    } else {
                        Socket::Held(parts[9].to_owned())
                    };
                }
            }
        }
        if readable {
            Socket::Missing
        } else {
            Socket::Unknown
        }
    }

    /// As [`of`](Self::of), a missing socket looked for once more before it is believed.
    fn settled(local_port: u16, remote_port: u16) -> Self {
        match Self::of(local_port, remote_port) {
            Socket::Missing => Self::of(local_port, remote_port),
            known => known,
        }
    }
}

/// Whether process `pid` has the file `target` (`socket:[INODE]`) open.
fn holds(pid: u32, target: &str) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == target))
}

struct Shared {
    upstream: Vec<SocketAddr>,
    origins: Option<Origins>,
    control: watch::Sender<Control>,
    counters: Counters,
    rng: Mutex<Rng>,
}

impl Shared {
    /// Whether the next client chunk is held, and for how long, by the fault in force now.
    fn hold_for(&self) -> Option<Duration> {
        let (fraction, by) = self.control.borrow().late()?;
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        rng.chance(fraction).then_some(by)
    }
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// A running byte-level fault proxy on a loopback port; stops when dropped.
pub struct TcpFaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for TcpFaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpFaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.shared.upstream)
            .finish()
    }
}

impl Drop for TcpFaultProxy {
    /// Stops accepting and closes every connection (their tasks are aborted with it).
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TcpFaultProxy {
    /// Starts a proxy on `127.0.0.1:0` to `upstream` (a `SocketAddr`, or `"host:port"`), with
    /// no fault in force. Every address `upstream` resolves to now is tried, in order, for each
    /// new connection. Its dice (for [`late`](Self::late)) are seeded with 0; see
    /// [`start_seeded`](Self::start_seeded).
    ///
    /// # Errors
    /// If `upstream` does not resolve, or no loopback port can be bound.
    pub async fn start(upstream: impl ToSocketAddrs) -> io::Result<Self> {
        Self::start_seeded(upstream, 0).await
    }

    /// As [`start`](Self::start), with the dice of the random faults seeded with `seed`.
    ///
    /// # Errors
    /// If `upstream` does not resolve, or no loopback port can be bound.
    pub async fn start_seeded(upstream: impl ToSocketAddrs, seed: u64) -> io::Result<Self> {
        Self::start_with(upstream, seed, None).await
    }

    /// As [`start`](Self::start), tracing each connection to one of `origins`, so that
    /// [`cut`](Self::cut) can hold one origin's connections alone.
    ///
    /// # Errors
    /// If `upstream` does not resolve, or no loopback port can be bound.
    pub async fn start_traced(upstream: impl ToSocketAddrs, origins: Origins) -> io::Result<Self> {
        Self::start_with(upstream, 0, Some(origins)).await
    }

    async fn start_with(
        upstream: impl ToSocketAddrs,
        seed: u64,
        origins: Option<Origins>,
    ) -> io::Result<Self> {
        let upstream: Vec<SocketAddr> = tokio::net::lookup_host(upstream).await?.collect();
        if upstream.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "the upstream resolved to no address",
            ));
        }
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            origins,
            control: watch::Sender::new(Control::default()),
            counters: Counters::default(),
            rng: Mutex::new(Rng::seeded(seed)),
        });
        let task = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(Self { addr, shared, task })
    }

    /// The proxy's address, on loopback.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy's address as `127.0.0.1:PORT` (a ZooKeeper connect string; etcd clients want
    /// `http://` before it).
    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    /// Starts (`true`) or ends (`false`) a partition. While
    /// it lasts, no byte is forwarded in either direction on any connection and none is
    /// closed; new connections are accepted and held without reaching the upstream. When it
    /// ends, every connection that lived through it is closed on both sides (the bytes held
    /// are dropped) and new connections are forwarded again.
    pub fn partition(&self, on: bool) {
        self.shared.control.send_if_modified(|c| {
            if c.partitioned == on {
                return false;
            }
            c.partitioned = on;
            if on {
                c.partitions += 1;
            }
            true
        });
    }

    /// Starts (`true`) or ends (`false`) a cut of origin `index` (see [`Origins`]; a proxy
    /// started without them has no origins, so this changes nothing there): as a partition
    /// (see [`partition`](Self::partition)) for that origin's connections alone, open or new.
    /// A connection traced to no origin is never cut.
    ///
    /// # Panics
    /// If `index` is not below [`MAX_ORIGINS`].
    pub fn cut(&self, index: usize, on: bool) {
        assert!(index < MAX_ORIGINS, "at most {MAX_ORIGINS} origins");
        let bit = 1u8 << index;
        self.shared.control.send_if_modified(|c| {
            if (c.cut & bit != 0) == on {
                return false;
            }
            if on {
                c.cut |= bit;
                c.cuts[index] += 1;
            } else {
                c.cut &= !bit;
            }
            true
        });
    }

    /// Ends every fault: a partition (see [`partition`](Self::partition)), the cuts, the refusal of
    /// new connections and late delivery (bytes already held still go out when their hold
    /// ends, see [`late`](Self::late)).
    pub fn heal(&self) {
        self.shared.control.send_if_modified(|c| {
            let changed = c.partitioned || c.cut != 0 || c.refuse_new || c.late().is_some();
            c.partitioned = false;
            c.cut = 0;
            c.refuse_new = false;
            c.late_fraction = 0.0;
            c.late_by = Duration::ZERO;
            changed
        });
    }

    /// Late delivery, client to server only (`fraction` or `by` zero: off). While on, each
    /// chunk of bytes read from a client (what one read returned) is, with probability
    /// `fraction`, held for `by` from when it was read before it is forwarded; the bytes behind
    /// it on the same connection queue behind it (the order is kept: it is one byte stream),
    /// and go out as soon as it has. Bytes from the server to the client are not delayed.
    ///
    /// What was held goes out after its hold even if the fault ends meanwhile, or the client
    /// closes or resets its connection (then the upstream connection is half-closed, or
    /// closed, after the last held byte): a request the client gave up on still lands. A
    /// partition or a reset, however, drops what is held with the connection. Each held chunk
    /// is counted in [`TcpProxyCounters::late`] once it is forwarded.
    pub fn late(&self, fraction: f64, by: Duration) {
        self.shared.control.send_if_modified(|c| {
            let changed = c.late_fraction != fraction || c.late_by != by;
            c.late_fraction = fraction;
            c.late_by = by;
            changed
        });
    }

    /// While `true`, new connections are accepted and closed at once; open ones go on.
    pub fn refuse_new(&self, on: bool) {
        self.shared.control.send_if_modified(|c| {
            let changed = c.refuse_new != on;
            c.refuse_new = on;
            changed
        });
    }

    /// Closes every open connection now, on both sides (held ones too); new ones are
    /// forwarded as before.
    pub fn reset_all(&self) {
        self.shared.control.send_modify(|c| c.resets += 1);
    }

    /// What the proxy did so far.
    pub fn counters(&self) -> TcpProxyCounters {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TcpProxyCounters {
            accepted: get(&c.accepted),
            open: get(&c.open),
            refused: get(&c.refused),
            reset: get(&c.reset),
            upstream_failed: get(&c.upstream_failed),
            bytes_to_upstream: get(&c.bytes_to_upstream),
            bytes_to_client: get(&c.bytes_to_client),
            late: get(&c.late),
            untraced: get(&c.untraced),
        }
    }
}

/// The members of a group that all dial the same addresses (a Raft group), each binding a
/// loopback port of its own behind a traced proxy, so that one member can be cut from the
/// others both ways ([`isolate`](Self::isolate)). Stops the proxies when dropped.
#[derive(Debug)]
pub struct MemberProxies {
    binds: Vec<String>,
    proxies: Vec<TcpFaultProxy>,
    origins: Origins,
}

impl MemberProxies {
    /// `n` members (at most [`MAX_ORIGINS`]) on free loopback ports, a proxy in front of each.
    ///
    /// # Errors
    /// If no loopback port can be had.
    pub async fn start(n: usize) -> io::Result<Self> {
        // The members' ports held while the proxies pick theirs, so that none takes one.
        let held = (0..n)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
            .collect::<io::Result<Vec<_>>>()?;
        let binds = held
            .iter()
            .map(|l| l.local_addr().map(|a| a.to_string()))
            .collect::<io::Result<Vec<_>>>()?;
        let origins = Origins::new();
        let mut proxies = Vec::new();
        for bind in &binds {
            proxies.push(TcpFaultProxy::start_traced(bind.clone(), origins.clone()).await?);
        }
        drop(held);
        Ok(Self {
            binds,
            proxies,
            origins,
        })
    }

    /// The address the others dial for each member (its proxy's), in member order.
    pub fn addresses(&self) -> Vec<String> {
        self.proxies.iter().map(TcpFaultProxy::endpoint).collect()
    }

    /// The address member `i` binds (`--raft-bind`).
    pub fn bind(&self, i: usize) -> Option<&str> {
        self.binds.get(i).map(String::as_str)
    }

    /// Member `i` is process `pid` (and its descendants) from now on.
    pub fn started(&self, i: usize, pid: u32) {
        self.origins.set(i, pid);
    }

    /// Cuts member `i` from the others (`on`), both ways: nothing reaches its proxy, and its
    /// own connections to theirs are held; or heals the cut (what it held is closed, and the
    /// members reconnect).
    pub fn isolate(&self, i: usize, on: bool) {
        for (j, proxy) in self.proxies.iter().enumerate() {
            if j == i {
                proxy.partition(on);
            } else {
                proxy.cut(i, on);
            }
        }
    }

    /// Ends every cut.
    pub fn heal(&self) {
        for proxy in &self.proxies {
            proxy.heal();
        }
    }

    /// Connections between members that were traced to none of them (see
    /// [`TcpProxyCounters::untraced`]).
    pub fn untraced(&self) -> u64 {
        self.proxies.iter().map(|p| p.counters().untraced).sum()
    }
}

/// Accepts until aborted; the connection tasks live in a `JoinSet` that aborts them all when
/// this task is aborted (the proxy is dropped).
async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, peer)) => {
                    add(&shared.counters.accepted, 1);
                    let control = shared.control.subscribe();
                    if control.borrow().refuse_new {
                        add(&shared.counters.refused, 1);
                        drop(client);
                        continue;
                    }
                    connections.spawn(serve(client, peer, shared.clone(), control));
                }
                // Out of descriptors or the like: wait instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Counts a connection open for as long as its task lives (aborted or not).
struct OpenGuard(Arc<Shared>);

impl OpenGuard {
    fn new(shared: &Arc<Shared>) -> Self {
        add(&shared.counters.open, 1);
        Self(shared.clone())
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.counters.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a connection must do after a change of the controls.
enum Verdict {
    /// Stop forwarding and hold the connection while a fault holds it.
    Hold,
    /// Close it (a reset, or the end of a partition it lived through).
    Close,
    /// The proxy is gone.
    Gone,
}

/// Waits for a change that concerns a forwarding connection of `origin` that began under
/// `start`.
async fn next_verdict(
    control: &mut watch::Receiver<Control>,
    start: Control,
    origin: Option<usize>,
) -> Verdict {
    loop {
        if control.changed().await.is_err() {
            return Verdict::Gone;
        }
        let now = *control.borrow_and_update();
        if now.resets != start.resets {
            return Verdict::Close;
        }
        if now.blocked(origin) {
            return Verdict::Hold;
        }
        if now.epoch(origin) != start.epoch(origin) {
            // A partition or cut began and ended before this task looked.
            return Verdict::Close;
        }
    }
}

/// Holds a connection of `origin` while a fault holds it (a partition, a cut of its origin,
/// one after the other without a gap) and until a reset. A cut that begins during a partition
/// and outlasts it (or the other way round) keeps it held, as a network would; a heal and a new
/// fault too quick to be seen apart are one long fault.
async fn hold(
    control: &mut watch::Receiver<Control>,
    start: Control,
    origin: Option<usize>,
) -> Verdict {
    loop {
        let now = *control.borrow_and_update();
        if now.resets != start.resets || !now.blocked(origin) {
            return Verdict::Close;
        }
        if control.changed().await.is_err() {
            return Verdict::Gone;
        }
    }
}

async fn serve(
    mut client: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    mut control: watch::Receiver<Control>,
) {
    let _open = OpenGuard::new(&shared);
    // Before tracing: a fault that comes and goes meanwhile is seen as such.
    let start = *control.borrow_and_update();
    let origin = match (&shared.origins, client.local_addr()) {
        (Some(origins), Ok(local)) => {
            let origins = origins.clone();
            match tokio::task::spawn_blocking(move || origins.of(peer, local)).await {
                Ok(Trace::Origin(index)) => Some(index),
                // Closed by its client before it could be traced: what it sent must not slip
                // through a cut, and nobody reads an answer.
                Ok(Trace::Gone) => return,
                Ok(Trace::Stranger) | Err(_) => {
                    add(&shared.counters.untraced, 1);
                    None
                }
            }
        }
        _ => None,
    };
    // Kept open (not read) while a partition holds the connection.
    let mut upstream_slot: Option<TcpStream> = None;
    let verdict = if start.blocked(origin) {
        Verdict::Hold
    } else {
        let connect = TcpStream::connect(&shared.upstream[..]);
        let connected = tokio::select! {
            biased;
            verdict = next_verdict(&mut control, start, origin) => Err(verdict),
            connected = connect => Ok(connected),
        };
        match connected {
            Err(verdict) => verdict,
            Ok(Err(_)) => {
                add(&shared.counters.upstream_failed, 1);
                return;
            }
            Ok(Ok(upstream)) => {
                let upstream = upstream_slot.insert(upstream);
                // Small writes (ZooKeeper pings, gRPC frames) go out at once both ways.
                let _ = client.set_nodelay(true);
                let _ = upstream.set_nodelay(true);
                let (client_read, client_write) = client.split();
                let (upstream_read, upstream_write) = upstream.split();
                let relay = relay(
                    (client_read, client_write),
                    (upstream_read, upstream_write),
                    &shared,
                );
                tokio::select! {
                    biased;
                    verdict = next_verdict(&mut control, start, origin) => verdict,
                    // Both sides closed, or one failed: close the other too.
                    () = relay => return,
                }
            }
        }
    };
    let verdict = match verdict {
        Verdict::Hold => hold(&mut control, start, origin).await,
        other => other,
    };
    if let Verdict::Close = verdict {
        add(&shared.counters.reset, 1);
    }
    // Returning drops (closes) both connections.
}

/// The size of the reads (and of a chunk, for the late-delivery fault).
const CHUNK: usize = 16 * 1024;

/// How many chunks read from a client may wait for their turn on one connection before the
/// proxy stops reading from that client (backpressure while bytes are held).
const QUEUED_CHUNKS: usize = 256;

/// A chunk of client bytes on its way to the upstream.
struct Chunk {
    bytes: Vec<u8>,
    /// Not before then (the end of its own hold, or of the one ahead of it).
    release: Instant,
    /// Held by the late-delivery fault (counted when forwarded).
    late: bool,
}

/// Copies bytes both ways until both sides are closed or one fails (then returns, and the
/// caller closes both). From client to upstream, a reader queues the chunks with their release
/// times and a writer forwards them in order when due; if the client side ends or fails, or
/// the other direction fails, what is queued (held bytes included) still goes out before the
/// upstream is half-closed (or, after a failure, closed).
async fn relay(
    client: (impl AsyncRead + Unpin, impl AsyncWrite + Unpin),
    upstream: (impl AsyncRead + Unpin, impl AsyncWrite + Unpin),
    shared: &Shared,
) {
    let (client_read, client_write) = client;
    let (upstream_read, upstream_write) = upstream;
    let counters = &shared.counters;
    let (queue, queued) = mpsc::channel(QUEUED_CHUNKS);
    let writer = forward_queued(queued, upstream_write, counters);
    // The reader owns the sender: when the readers end (or fail), the queue is closed, and the
    // writer drains it and stops.
    let readers = async {
        tokio::try_join!(
            read_into_queue(client_read, queue, shared),
            pipe(upstream_read, client_write, &counters.bytes_to_client),
        )
    };
    tokio::pin!(writer, readers);
    tokio::select! {
        written = &mut writer => {
            if written.is_err() {
                // The upstream cannot be written to: close both.
                return;
            }
            // The client half-closed and all its bytes are out; the other direction goes on.
            let _ = readers.await;
        }
        read = &mut readers => {
            // Both directions ended, or one failed (the client left, say): what the client
            // sent before still goes out, held bytes after their hold.
            let _ = read;
            let _ = writer.await;
        }
    }
}

/// Reads the client's bytes into `queue`, deciding for each chunk whether the late-delivery
/// fault holds it. Ends (closing the queue) at the client's end of stream.
async fn read_into_queue(
    mut from: impl AsyncRead + Unpin,
    queue: mpsc::Sender<Chunk>,
    shared: &Shared,
) -> io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    // When the chunk ahead goes out (at the latest).
    let mut ahead = Instant::now();
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        let now = Instant::now();
        let hold = shared.hold_for();
        let release = (now + hold.unwrap_or(Duration::ZERO)).max(ahead);
        ahead = release;
        let chunk = Chunk {
            bytes: buf[..n].to_vec(),
            release,
            late: hold.is_some(),
        };
        if queue.send(chunk).await.is_err() {
            // The writer stopped (the upstream failed).
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the upstream is closed",
            ));
        }
    }
}

/// Forwards the queued chunks to the upstream in order, each when it is due; at the end of the
/// queue, passes the end on (half-close).
async fn forward_queued(
    mut queued: mpsc::Receiver<Chunk>,
    mut to: impl AsyncWrite + Unpin,
    counters: &Counters,
) -> io::Result<()> {
    while let Some(chunk) = queued.recv().await {
        tokio::time::sleep_until(chunk.release).await;
        to.write_all(&chunk.bytes).await?;
        add(&counters.bytes_to_upstream, chunk.bytes.len() as u64);
        if chunk.late {
            add(&counters.late, 1);
        }
    }
    to.shutdown().await
}

/// Copies `from` to `to` until `from` ends, then passes the end on (half-close).
async fn pipe(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    forwarded: &AtomicU64,
) -> io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        to.write_all(&buf[..n]).await?;
        add(forwarded, n as u64);
    }
}
