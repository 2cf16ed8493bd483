//! `leader run --metrics-addr`: the library's metrics as Prometheus text at `/metrics`, and
//! `/healthz`, `/readyz` and `/leader`, from a small HTTP/1.1 server (one request per
//! connection, `Connection: close`).
//!
//! - `/healthz`: 200 while the elector runs (it has not stopped on a permanent error), else 503.
//! - `/readyz`: 200 if the store answered one of the elector's calls within the last ttl, else
//!   503 (the store is down, or throttles or times out every call).
//! - `/leader`: JSON: who leads the key as this instance knows it, with the token, metadata,
//!   state and since when (this machine's wall clock); for a sharded run, the shards led.
//!
//! The recorder is installed before the elector is built (the library registers its metrics
//! then) and the address is bound before campaigning, so that a taken port ends the run
//! before it leads.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leader::{Assignment, HolderId, Leadership, LeaseKey, Metadata, StoreContact};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::{Exit, exit};

/// Parses `--metrics-addr`: `HOST:PORT` with an IP address (`[::1]:9464` for IPv6), or a port
/// alone (`9464`, `:9464`) for the loopback address. Port 0 picks a free port (logged).
pub(crate) fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    let loopback = |port: &str| {
        port.parse::<u16>()
            .map(|p| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p))
            .map_err(|_| format!("{port:?} is not a port number (0 to 65535)"))
    };
    if let Some(port) = s.strip_prefix(':') {
        return loopback(port);
    }
    if !s.contains(':') {
        return loopback(s);
    }
    if let Some(port) = s.strip_prefix("localhost:") {
        return loopback(port);
    }
    s.parse::<SocketAddr>().map_err(|_| {
        format!(
            "{s:?} is not HOST:PORT with an IP address (examples: 9464, 127.0.0.1:9464, \
             0.0.0.0:9464 for every interface, [::1]:9464)"
        )
    })
}

/// Installs the Prometheus recorder as the process's recorder and describes the metrics.
/// Call it before building the elector.
pub(crate) fn install_recorder() -> Result<PrometheusHandle, Exit> {
    let fail = |e: String| Exit::new(exit::UNAVAILABLE, format!("cannot record metrics: {e}"));
    let mut builder = PrometheusBuilder::new();
    for (name, buckets) in leader::metrics::BUCKETS {
        builder = builder
            .set_buckets_for_metric(Matcher::Full(name.to_owned()), buckets)
            .map_err(|e| fail(e.to_string()))?;
    }
    let recorder = builder.build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|e| fail(e.to_string()))?;
    leader::metrics::describe();
    Ok(handle)
}

/// Binds `--metrics-addr`.
pub(crate) async fn bind(addr: SocketAddr) -> Result<TcpListener, Exit> {
    TcpListener::bind(addr).await.map_err(|e| {
        Exit::new(
            exit::CONFIG,
            format!("cannot serve --metrics-addr {addr}: {e}; choose another port"),
        )
    })
}

/// What the endpoints report on: the elector of a single key, or a sharded instance.
pub(crate) enum Source {
    Single {
        leadership: watch::Receiver<Leadership>,
        metadata: Metadata,
    },
    Sharded {
        assignment: watch::Receiver<Assignment>,
        shards: u32,
    },
}

/// The instance the endpoints describe.
pub(crate) struct Instance {
    pub(crate) key: LeaseKey,
    pub(crate) holder: HolderId,
    pub(crate) ttl: Duration,
    pub(crate) contact: StoreContact,
    pub(crate) source: Source,
}

/// At most this many requests are served at once; more are answered 503 at once.
const CONCURRENT: usize = 16;

/// A request's head must arrive within this time, and be at most [`MAX_HEAD`] bytes.
const READ_TIMEOUT: Duration = Duration::from_secs(2);
const MAX_HEAD: usize = 8192;

/// A whole exchange (head, answer) ends within this time: a client that does not read its
/// answer does not keep a slot.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves the endpoints on `listener` until the process ends.
pub(crate) fn serve(listener: TcpListener, prometheus: PrometheusHandle, instance: Instance) {
    let addr = listener
        .local_addr()
        .map_or_else(|_| "?".to_owned(), |a| a.to_string());
    info!(metrics_addr = %addr, "serving /metrics, /healthz, /readyz and /leader");
    let state = Arc::new(State::new(prometheus.clone(), instance));
    tokio::spawn(track_since(state.clone()));
    // The exporter keeps histogram samples until upkeep folds them in.
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            prometheus.run_upkeep();
        }
    });
    tokio::spawn(async move {
        let permits = Arc::new(Semaphore::new(CONCURRENT));
        loop {
            let mut stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    warn!(error = %e, "metrics endpoint: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let state = state.clone();
            // Slow or idle clients hold at most CONCURRENT slots; one more gets a quick 503
            // rather than a wait, so a probe never queues behind them.
            let permit = permits.clone().try_acquire_owned();
            tokio::spawn(async move {
                let exchange = async {
                    match permit {
                        Ok(_permit) => respond(&mut stream, &state).await,
                        Err(_) => busy(&mut stream).await,
                    }
                };
                match tokio::time::timeout(EXCHANGE_TIMEOUT, exchange).await {
                    Ok(Err(e)) => debug!(error = %e, "metrics endpoint: request not served"),
                    Err(_) => debug!("metrics endpoint: a client took too long; closed"),
                    Ok(Ok(())) => {}
                }
            });
        }
    });
}

struct State {
    prometheus: PrometheusHandle,
    instance: Instance,
    /// What `/leader` says, and since when (unix ms) it has said it.
    since: Mutex<(Value, u64)>,
}

impl State {
    fn new(prometheus: PrometheusHandle, instance: Instance) -> Self {
        Self {
            prometheus,
            instance,
            since: Mutex::new((Value::Null, unix_ms())),
        }
    }

    fn since(&self) -> std::sync::MutexGuard<'_, (Value, u64)> {
        self.since.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Who leads, as this instance knows it: the fields whose change restarts `since`.
    fn identity(&self) -> Value {
        let me = self.instance.holder.as_str();
        match &self.instance.source {
            Source::Single {
                leadership,
                metadata,
            } => match &*leadership.borrow() {
                Leadership::Leader { token, .. } => json!({
                    "state": "leader", "holder": me, "token": token.get(), "metadata": metadata,
                }),
                Leadership::SteppingDown { token } => json!({
                    "state": "stepping_down", "holder": me, "token": token.get(),
                    "metadata": metadata,
                }),
                Leadership::Follower { leader: Some(l) } => json!({
                    "state": "follower", "holder": l.holder.as_str(), "token": l.token.get(),
                    "metadata": l.metadata,
                }),
                Leadership::Follower { leader: None } => json!({
                    "state": "follower", "holder": null, "token": null, "metadata": {},
                }),
                Leadership::Stopped { problem } => json!({
                    "state": "stopped", "holder": null, "token": null, "metadata": {},
                    "problem": problem.as_ref().map(|p| p.message.clone()),
                }),
                Leadership::Unknown { problem } => json!({
                    "state": "unknown", "holder": null, "token": null, "metadata": {},
                    "problem": problem.as_ref().map(|p| p.message.clone()),
                }),
                _ => json!({ "state": "unknown", "holder": null, "token": null, "metadata": {} }),
            },
            Source::Sharded { assignment, shards } => {
                let a = assignment.borrow();
                let state = match (&a.stopped, a.member) {
                    (Some(_), _) => "stopped",
                    (None, true) => "member",
                    (None, false) => "joining",
                };
                let led: serde_json::Map<String, Value> = a
                    .led
                    .iter()
                    .map(|(s, t)| (s.to_string(), json!(t.get())))
                    .collect();
                json!({
                    "state": state, "holder": me, "shards": shards, "members": a.members,
                    "led": led,
                    "problem": a.stopped.clone().flatten().or(a.problem.clone()).map(|p| p.message),
                })
            }
        }
    }

    fn healthy(&self) -> Result<String, String> {
        let stopped = match &self.instance.source {
            Source::Single { leadership, .. } => match &*leadership.borrow() {
                Leadership::Stopped { problem } => {
                    Some(problem.as_ref().map(|p| p.message.clone()))
                }
                _ => None,
            },
            Source::Sharded { assignment, .. } => assignment
                .borrow()
                .stopped
                .clone()
                .map(|p| p.map(|p| p.message)),
        };
        match stopped {
            None => Ok("ok: the elector is running\n".to_owned()),
            Some(Some(why)) => Err(format!("the elector has stopped: {why}\n")),
            Some(None) => Err("the elector has stopped\n".to_owned()),
        }
    }

    fn ready(&self) -> Result<String, String> {
        let ttl = self.instance.ttl;
        match self.instance.contact.last_answer() {
            Some(at) if at.elapsed() <= ttl => Ok(format!(
                "ok: the store answered {:.1} s ago\n",
                at.elapsed().as_secs_f64()
            )),
            Some(at) => Err(format!(
                "the store has not answered for {:.1} s (more than the ttl, {ttl:?})\n",
                at.elapsed().as_secs_f64()
            )),
            None => Err("the store has not answered yet\n".to_owned()),
        }
    }

    fn leader(&self) -> Value {
        let (identity, since) = {
            let s = self.since();
            (s.0.clone(), s.1)
        };
        let mut out = identity;
        if let Value::Object(map) = &mut out {
            map.insert("key".to_owned(), json!(self.instance.key.as_str()));
            map.insert("self".to_owned(), json!(self.instance.holder.as_str()));
            map.insert("since_unix_ms".to_owned(), json!(since));
            let answered = self
                .instance
                .contact
                .last_answer()
                .map(|at| u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX));
            map.insert("store_answered_ms_ago".to_owned(), json!(answered));
        }
        out
    }
}

/// Keeps `since`: the wall-clock time at which what `/leader` reports (state, holder, token)
/// last changed.
async fn track_since(state: Arc<State>) {
    enum Rx {
        Single(watch::Receiver<Leadership>),
        Sharded(watch::Receiver<Assignment>),
    }
    let mut rx = match &state.instance.source {
        Source::Single { leadership, .. } => Rx::Single(leadership.clone()),
        Source::Sharded { assignment, .. } => Rx::Sharded(assignment.clone()),
    };
    loop {
        let now = state.identity();
        {
            let mut s = state.since();
            if s.0 != now {
                *s = (now, unix_ms());
            }
        }
        let open = match &mut rx {
            Rx::Single(r) => r.changed().await.is_ok(),
            Rx::Sharded(r) => r.changed().await.is_ok(),
        };
        if !open {
            return;
        }
    }
}

/// This machine's wall clock, in unix ms (informational, as `/leader` documents).
fn unix_ms() -> u64 {
    leader::wall_clock_unix_ms()
}

/// How reading a request head ended.
enum Head {
    /// The head (or what came before the client stopped sending).
    Read(Vec<u8>),
    TooLarge,
    /// Nothing complete within the time.
    TimedOut,
}

/// Reads a request head within `limit`.
async fn read_head(stream: &mut TcpStream, limit: Duration) -> std::io::Result<Head> {
    let mut head = Vec::with_capacity(512);
    let deadline = Instant::now() + limit;
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        if head.len() > MAX_HEAD {
            return Ok(Head::TooLarge);
        }
        let n = match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(read) => read?,
            Err(_) => return Ok(Head::TimedOut),
        };
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    Ok(Head::Read(head))
}

/// Answers a client beyond the served ones: reads its request first (briefly), so that
/// closing does not reset the connection before the client has read the answer.
async fn busy(stream: &mut TcpStream) -> std::io::Result<()> {
    let _ = read_head(stream, Duration::from_millis(250)).await?;
    let busy = "busy: too many requests at once\n";
    reply(stream, 503, "text/plain", busy, false).await
}

/// Reads one request head and answers it.
async fn respond(stream: &mut TcpStream, state: &State) -> std::io::Result<()> {
    let head = match read_head(stream, READ_TIMEOUT).await? {
        Head::Read(head) => head,
        Head::TimedOut => return Ok(()),
        Head::TooLarge => {
            return reply(stream, 431, "text/plain", "request head too large\n", false).await;
        }
    };
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let head_only = method == "HEAD";
    if method != "GET" && !head_only {
        return reply(stream, 405, "text/plain", "only GET and HEAD\n", head_only).await;
    }
    match path {
        "/metrics" => {
            let body = state.prometheus.render();
            let kind = "text/plain; version=0.0.4; charset=utf-8";
            reply(stream, 200, kind, &body, head_only).await
        }
        "/healthz" => {
            let (code, body) = match state.healthy() {
                Ok(b) => (200, b),
                Err(b) => (503, b),
            };
            reply(stream, code, "text/plain", &body, head_only).await
        }
        "/readyz" => {
            let (code, body) = match state.ready() {
                Ok(b) => (200, b),
                Err(b) => (503, b),
            };
            reply(stream, code, "text/plain", &body, head_only).await
        }
        "/leader" => {
            let body = format!("{}\n", state.leader());
            reply(stream, 200, "application/json", &body, head_only).await
        }
        "/" => {
            let body = "/metrics /healthz /readyz /leader\n";
            reply(stream, 200, "text/plain", body, head_only).await
        }
        _ => reply(stream, 404, "text/plain", "not found\n", head_only).await,
    }
}

async fn reply(
    stream: &mut TcpStream,
    code: u16,
    kind: &str,
    body: &str,
    head_only: bool,
) -> std::io::Result<()> {
    let reason = match code {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let allow = if code == 405 {
        "Allow: GET, HEAD\r\n"
    } else {
        ""
    };
    let mut out = format!(
        "HTTP/1.1 {code} {reason}\r\n{allow}Content-Type: {kind}\r\nContent-Length: {}\r\n\
         Cache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(body.as_bytes());
    }
    stream.write_all(&out).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_default_to_loopback_and_bad_ones_are_named() {
        let lo = |p| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p);
        assert_eq!(parse_addr("9464"), Ok(lo(9464)));
        assert_eq!(parse_addr(":9464"), Ok(lo(9464)));
        assert_eq!(parse_addr("localhost:0"), Ok(lo(0)));
        assert_eq!(
            parse_addr("0.0.0.0:9464").map(|a| a.ip().is_unspecified()),
            Ok(true)
        );
        assert!(parse_addr("[::1]:9464").is_ok());
        for bad in ["", "99999", "host.example:9464", "1.2.3.4", ":x"] {
            let e = parse_addr(bad).unwrap_err();
            assert!(
                e.contains(&format!("{:?}", bad.trim_start_matches(':'))) || e.contains(bad),
                "{bad}: {e}"
            );
        }
    }
}
