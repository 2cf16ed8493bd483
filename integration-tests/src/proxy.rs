//! A fault-injecting HTTP proxy between a backend under test and its emulator.
//!
//! It forwards one request per connection (it rewrites `Connection: close` into each request,
//! so that a response ends when the emulator closes the connection) and, as the test decides,
//! adds latency, refuses new connections, blackholes requests (holds them without an answer,
//! like a partition), answers a fraction of requests with a throttling status without
//! forwarding them, forwards a request and then drops its response (the emulator applied
//! it; the client never hears), or holds a request past the client's timeout and only then
//! forwards it (late delivery: the write lands after its sender gave up and re-read).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The faults in force; change them with [`FaultProxy::set`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProxyFaults {
    /// Added before each request is forwarded.
    pub latency: Duration,
    /// New connections are accepted and closed at once.
    pub refuse_new: bool,
    /// Requests are held without an answer until this is turned off (then the connection is
    /// closed without an answer).
    pub blackhole: bool,
    /// Fraction of requests answered with `throttle_status` without being forwarded.
    pub throttle_fraction: f64,
    /// The status of throttling answers (429 or 503).
    pub throttle_status: u16,
    /// Fraction of requests forwarded (and applied) whose response is dropped.
    pub lose_response_fraction: f64,
    /// Fraction of requests held for `late_by` before they are forwarded (and applied); their
    /// response is dropped. With `late_by` above the client's request timeout, the client has
    /// given up (and re-read) before the write lands.
    pub late_fraction: f64,
    /// How long a late request is held.
    pub late_by: Duration,
}

impl Default for ProxyFaults {
    fn default() -> Self {
        Self {
            latency: Duration::ZERO,
            refuse_new: false,
            blackhole: false,
            throttle_fraction: 0.0,
            throttle_status: 503,
            lose_response_fraction: 0.0,
            late_fraction: 0.0,
            late_by: Duration::ZERO,
        }
    }
}

/// What the proxy did, for assertions and reports.
#[derive(Debug, Default)]
pub struct ProxyCounts {
    /// Requests forwarded with their response returned.
    pub forwarded: AtomicU64,
    /// Requests answered with a throttling status.
    pub throttled: AtomicU64,
    /// Requests forwarded whose response was dropped.
    pub lost: AtomicU64,
    /// Connections refused.
    pub refused: AtomicU64,
    /// Requests held by a blackhole.
    pub blackholed: AtomicU64,
    /// Requests delivered late (held, then forwarded with the response dropped).
    pub late: AtomicU64,
}

struct Shared {
    upstream: SocketAddr,
    faults: watch::Sender<ProxyFaults>,
    counts: ProxyCounts,
    rng: Mutex<u64>,
    /// Requests to let through, then requests whose response is lost, whatever the faults.
    lose_plan: Mutex<(u64, u64)>,
}

impl Shared {
    fn planned_loss(&self) -> bool {
        let mut plan = self.lose_plan.lock().unwrap_or_else(|e| e.into_inner());
        match *plan {
            (0, 0) => false,
            (0, lose) => {
                plan.1 = lose - 1;
                true
            }
            (skip, _) => {
                plan.0 = skip - 1;
                false
            }
        }
    }

    fn chance(&self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        let mut s = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

/// A running proxy on a loopback port; stops when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.shared.upstream)
            .finish()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The `host:port` of an `http://host:port[/path]` URL.
pub fn authority(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("http://")?;
    Some(rest.split('/').next().unwrap_or(rest))
}

impl FaultProxy {
    /// Starts a proxy to `upstream` (`host:port`) with no faults, seeding its dice with `seed`.
    ///
    /// # Errors
    /// If the upstream address does not resolve or no loopback port can be bound.
    pub async fn start(upstream: &str, seed: u64) -> std::io::Result<Self> {
        let upstream = tokio::net::lookup_host(upstream)
            .await?
            .next()
            .ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::NotFound, "upstream did not resolve")
            })?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (faults, _) = watch::channel(ProxyFaults::default());
        let shared = Arc::new(Shared {
            upstream,
            faults,
            counts: ProxyCounts::default(),
            rng: Mutex::new(seed),
            lose_plan: Mutex::new((0, 0)),
        });
        let task = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(Self { addr, shared, task })
    }

    /// The proxy's base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Replaces the faults in force.
    pub fn set(&self, faults: ProxyFaults) {
        self.shared.faults.send_replace(faults);
    }

    /// Of the next requests (in the order they arrive), lets `skip` through and then forwards
    /// `count` and drops their responses, whatever the faults in force; requests held by a
    /// blackhole or throttled do not count.
    pub fn lose_responses(&self, skip: u64, count: u64) {
        *self
            .shared
            .lose_plan
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = (skip, count);
    }

    /// Turns every fault off.
    pub fn heal(&self) {
        self.set(ProxyFaults::default());
    }

    /// What the proxy did so far.
    pub fn counts(&self) -> &ProxyCounts {
        &self.shared.counts
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((conn, _)) = listener.accept().await else {
            continue;
        };
        if shared.faults.borrow().refuse_new {
            shared.counts.refused.fetch_add(1, Ordering::Relaxed);
            drop(conn);
            continue;
        }
        tokio::spawn(handle(conn, shared.clone()));
    }
}

const MAX_HEAD: usize = 64 * 1024;

/// Reads one request: the head (rewritten to `Connection: close`) and its body.
async fn read_request(conn: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::with_capacity(4096);
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
        let mut chunk = [0u8; 4096];
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = std::str::from_utf8(&buf[..head_end]).ok()?;
    let mut lines = head.split("\r\n");
    let request_line = lines.next()?;
    let mut content_length = 0usize;
    let mut chunked = false;
    let mut out = format!("{request_line}\r\n");
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':')?;
        let name_l = name.trim().to_ascii_lowercase();
        if name_l == "connection" || name_l == "keep-alive" {
            continue;
        }
        if name_l == "transfer-encoding" {
            // A chunked body (the GCS client's uploads) is forwarded de-chunked, with a
            // Content-Length, so that the upstream sees one plain request.
            if !value.trim().eq_ignore_ascii_case("chunked") {
                return None;
            }
            chunked = true;
            continue;
        }
        if name_l == "content-length" {
            content_length = value.trim().parse().ok()?;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    let mut body = buf[head_end..].to_vec();
    if chunked {
        let body = read_chunked(conn, body).await?;
        out.push_str(&format!("Content-Length: {}\r\n", body.len()));
        out.push_str("Connection: close\r\n\r\n");
        let mut request = out.into_bytes();
        request.extend_from_slice(&body);
        return Some(request);
    }
    out.push_str("Connection: close\r\n\r\n");
    while body.len() < content_length {
        let mut chunk = vec![0u8; (content_length - body.len()).min(64 * 1024)];
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let mut request = out.into_bytes();
    request.extend_from_slice(&body);
    Some(request)
}

/// Reads the rest of a chunked body (`pending` holds what was read after the head) and returns
/// it de-chunked; trailers are dropped.
async fn read_chunked(conn: &mut TcpStream, mut pending: Vec<u8>) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        // The size line.
        let line_end = loop {
            if let Some(i) = pending.windows(2).position(|w| w == b"\r\n") {
                break i;
            }
            if pending.len() > MAX_HEAD {
                return None;
            }
            fill(conn, &mut pending).await?;
        };
        let line = std::str::from_utf8(&pending[..line_end]).ok()?;
        let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
        pending.drain(..line_end + 2);
        if size == 0 {
            // Trailers, up to the empty line.
            loop {
                if let Some(i) = pending.windows(2).position(|w| w == b"\r\n") {
                    if i == 0 {
                        return Some(body);
                    }
                    pending.drain(..i + 2);
                    continue;
                }
                fill(conn, &mut pending).await?;
            }
        }
        while pending.len() < size + 2 {
            fill(conn, &mut pending).await?;
        }
        body.extend_from_slice(&pending[..size]);
        pending.drain(..size + 2);
    }
}

async fn fill(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Option<()> {
    let mut chunk = [0u8; 4096];
    let n = conn.read(&mut chunk).await.ok()?;
    if n == 0 {
        return None;
    }
    buf.extend_from_slice(&chunk[..n]);
    Some(())
}

async fn handle(mut conn: TcpStream, shared: Arc<Shared>) {
    let Some(request) = read_request(&mut conn).await else {
        return;
    };
    let mut faults_rx = shared.faults.subscribe();
    let faults = *faults_rx.borrow_and_update();
    if faults.blackhole {
        shared.counts.blackholed.fetch_add(1, Ordering::Relaxed);
        let _ = faults_rx.wait_for(|f| !f.blackhole).await;
        return;
    }
    if !faults.latency.is_zero() {
        tokio::time::sleep(faults.latency).await;
    }
    if shared.chance(faults.throttle_fraction) {
        shared.counts.throttled.fetch_add(1, Ordering::Relaxed);
        let reason = if faults.throttle_status == 429 {
            "Too Many Requests"
        } else {
            "Service Unavailable"
        };
        let answer = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Length: 0\r\nRetry-After: 1\r\nConnection: close\r\n\r\n",
            faults.throttle_status
        );
        let _ = conn.write_all(answer.as_bytes()).await;
        let _ = conn.shutdown().await;
        return;
    }
    let late = shared.chance(faults.late_fraction);
    if late {
        // Held past the client's timeout whether or not the client is still there, then
        // applied: the hardest lost-response case.
        tokio::time::sleep(faults.late_by).await;
    }
    let lose = late || shared.planned_loss() || shared.chance(faults.lose_response_fraction);
    let Ok(mut up) = TcpStream::connect(shared.upstream).await else {
        return;
    };
    if up.write_all(&request).await.is_err() {
        return;
    }
    let mut response = Vec::new();
    if up.read_to_end(&mut response).await.is_err() {
        return;
    }
    if late {
        shared.counts.late.fetch_add(1, Ordering::Relaxed);
        return; // applied long after the client gave up
    }
    if lose {
        shared.counts.lost.fetch_add(1, Ordering::Relaxed);
        return; // the emulator applied it; the client never hears
    }
    shared.counts.forwarded.fetch_add(1, Ordering::Relaxed);
    let _ = conn.write_all(&response).await;
    let _ = conn.shutdown().await;
}
