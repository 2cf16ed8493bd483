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
//!   its clients see it.
//!
//! Each accepted connection gets a fresh connection to the upstream, and bytes are copied both
//! ways as they come (a half-close is passed on). The controls take effect at once, on open
//! connections too, from any thread or task. Dropping the proxy stops it and closes every
//! connection.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

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
}

/// The controls in force. The counters let a connection see a partition or a reset that came
/// and went while it was not looking.
#[derive(Clone, Copy, Debug, Default)]
struct Control {
    partitioned: bool,
    /// Partitions begun so far.
    partitions: u64,
    refuse_new: bool,
    /// Calls of `reset_all` so far.
    resets: u64,
}

struct Shared {
    upstream: Vec<SocketAddr>,
    control: watch::Sender<Control>,
    counters: Counters,
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
    /// new connection.
    ///
    /// # Errors
    /// If `upstream` does not resolve, or no loopback port can be bound.
    pub async fn start(upstream: impl ToSocketAddrs) -> io::Result<Self> {
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
            control: watch::Sender::new(Control::default()),
            counters: Counters::default(),
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

    /// Ends every fault: a partition (see [`partition`](Self::partition)) and the refusal of
    /// new connections.
    pub fn heal(&self) {
        self.shared.control.send_if_modified(|c| {
            let changed = c.partitioned || c.refuse_new;
            c.partitioned = false;
            c.refuse_new = false;
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
        }
    }
}

/// Accepts until aborted; the connection tasks live in a `JoinSet` that aborts them all when
/// this task is aborted (the proxy is dropped).
async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    add(&shared.counters.accepted, 1);
                    let control = shared.control.subscribe();
                    if control.borrow().refuse_new {
                        add(&shared.counters.refused, 1);
                        drop(client);
                        continue;
                    }
                    connections.spawn(serve(client, shared.clone(), control));
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
    /// Stop forwarding and hold the connection through this partition (its number).
    Hold(u64),
    /// Close it (a reset, or the end of a partition it lived through).
    Close,
    /// The proxy is gone.
    Gone,
}

/// Waits for a change that concerns a forwarding connection that began under `start`.
async fn next_verdict(control: &mut watch::Receiver<Control>, start: Control) -> Verdict {
    loop {
        if control.changed().await.is_err() {
            return Verdict::Gone;
        }
        let now = *control.borrow_and_update();
        if now.resets != start.resets {
            return Verdict::Close;
        }
        if now.partitioned {
            return Verdict::Hold(now.partitions);
        }
        if now.partitions != start.partitions {
            // A partition began and ended before this task looked.
            return Verdict::Close;
        }
    }
}

/// Holds a connection through a partition (number `partition`) until it ends or a reset.
async fn hold(control: &mut watch::Receiver<Control>, start: Control, partition: u64) -> Verdict {
    loop {
        let now = *control.borrow_and_update();
        if now.resets != start.resets || !now.partitioned || now.partitions != partition {
            return Verdict::Close;
        }
        if control.changed().await.is_err() {
            return Verdict::Gone;
        }
    }
}

async fn serve(mut client: TcpStream, shared: Arc<Shared>, mut control: watch::Receiver<Control>) {
    let _open = OpenGuard::new(&shared);
    let start = *control.borrow_and_update();
    // Kept open (not read) while a partition holds the connection.
    let mut upstream_slot: Option<TcpStream> = None;
    let verdict = if start.partitioned {
        Verdict::Hold(start.partitions)
    } else {
        let connect = TcpStream::connect(&shared.upstream[..]);
        let connected = tokio::select! {
            biased;
            verdict = next_verdict(&mut control, start) => Err(verdict),
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
                let counters = &shared.counters;
                let relay = async {
                    tokio::try_join!(
                        pipe(client_read, upstream_write, &counters.bytes_to_upstream),
                        pipe(upstream_read, client_write, &counters.bytes_to_client),
                    )
                };
                tokio::select! {
                    biased;
                    verdict = next_verdict(&mut control, start) => verdict,
                    // Both sides closed, or one failed: close the other too.
                    _ = relay => return,
                }
            }
        }
    };
    let verdict = match verdict {
        Verdict::Hold(partition) => hold(&mut control, start, partition).await,
        other => other,
    };
    if let Verdict::Close = verdict {
        add(&shared.counters.reset, 1);
    }
    // Returning drops (closes) both connections.
}

/// Copies `from` to `to` until `from` ends, then passes the end on (half-close).
async fn pipe(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    forwarded: &AtomicU64,
) -> io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        to.write_all(&buf[..n]).await?;
        add(forwarded, n as u64);
    }
}
