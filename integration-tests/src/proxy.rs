//! The one fault-injecting HTTP proxy between a backend under test and its emulator.
//!
//! Built on hyper: it parses each request (a chunked body too), forwards it on a fresh
//! upstream connection (with `Connection: close`, the body with a `Content-Length`) and answers
//! the client on a connection that closes after the response. Faults come two ways, and both
//! can be in force at once:
//!
//! - **Random faults** ([`ProxyFaults`], replaced with [`FaultProxy::set`]): latency, refused
//!   connections, a blackhole (requests held without an answer, like a partition), a fraction
//!   of requests answered with a throttling status without being forwarded, a fraction
//!   forwarded whose response is dropped (the emulator applied it; the client never hears),
//!   and a fraction held past the client's timeout and only then forwarded (late delivery: the
//!   write lands after its sender gave up and re-read). The dice are seeded.
//! - **Planned faults** ([`Rule`], added with [`FaultProxy::inject`]): for the requests that
//!   [`Match`] (say the next `UpdateItem`, or GCS uploads), after letting some through, a
//!   [`Fault`]: a canned answer shaped like the store's own ([`Canned::aws_throttling`],
//!   [`Canned::gcs`], [`Canned::azure_server_busy`]), a dropped connection, a delay, a lost or
//!   held response, a late delivery.
//!
//! Once a request is read, what the proxy does with it goes on whether or not its client is
//! still there: a late or lost write is applied even after the client has given up.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use leader_core::conformance::Rng;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The random faults in force; change them with [`FaultProxy::set`].
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
    /// The shape of throttling answers: a bare status, or the store's own error.
    pub throttle_answer: ThrottleAnswer,
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
            throttle_answer: ThrottleAnswer::Plain,
            lose_response_fraction: 0.0,
            late_fraction: 0.0,
            late_by: Duration::ZERO,
        }
    }
}

/// How the random throttling of [`ProxyFaults`] answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ThrottleAnswer {
    /// The status with an empty body and `Retry-After: 1` ([`Canned::status`]).
    #[default]
    Plain,
    /// As S3 throttles: the status with S3's XML error `SlowDown` ([`Canned::s3`]).
    S3SlowDown,
}

impl ThrottleAnswer {
    /// The answer with `status`.
    pub fn canned(self, status: u16) -> Canned {
        match self {
            ThrottleAnswer::Plain => Canned::status(status),
            ThrottleAnswer::S3SlowDown => Canned::s3(status, "SlowDown"),
        }
    }
}

/// What the proxy did, for assertions and reports.
#[derive(Debug, Default)]
pub struct ProxyCounts {
    /// Requests forwarded with their response returned.
    pub forwarded: AtomicU64,
    /// Requests answered with a throttling status or another canned answer, not forwarded.
    pub throttled: AtomicU64,
    /// Requests forwarded whose response was dropped (at once or after a hold).
    pub lost: AtomicU64,
    /// Connections refused.
    pub refused: AtomicU64,
    /// Requests held by a blackhole.
    pub blackholed: AtomicU64,
    /// Requests delivered late (held, then forwarded with the response dropped).
    pub late: AtomicU64,
    /// Requests whose connection was closed without forwarding them.
    pub dropped: AtomicU64,
}

/// Which requests a [`Rule`] applies to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Match {
    /// Every request.
    Any,
    /// AWS JSON-protocol requests (DynamoDB) of one operation, as named by `X-Amz-Target`
    /// (`UpdateItem`, `TransactWriteItems`, ...).
    AwsOperation(String),
    /// Requests with `method` whose path starts with `prefix` (GCS uploads: `POST /upload`).
    Path {
        /// The method.
        method: Method,
        /// The start of the path.
        prefix: String,
    },
}

impl Match {
    /// AWS requests of `operation`.
    pub fn aws(operation: &str) -> Self {
        Self::AwsOperation(operation.to_owned())
    }

    /// Requests with `method` whose path starts with `prefix`.
    pub fn path(method: Method, prefix: &str) -> Self {
        Self::Path {
            method,
            prefix: prefix.to_owned(),
        }
    }

    fn matches(&self, seen: &Seen) -> bool {
        match self {
            Match::Any => true,
            Match::AwsOperation(op) => seen.aws_operation.as_deref() == Some(op.as_str()),
            Match::Path { method, prefix } => {
                seen.method == *method && seen.path.starts_with(prefix)
            }
        }
    }
}

/// A canned answer, sent without forwarding the request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Canned {
    /// The status.
    pub status: u16,
    /// Extra headers.
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: String,
}

impl Canned {
    /// `status` with an empty body and `Retry-After: 1`: a generic throttling answer.
    pub fn status(status: u16) -> Self {
        Self {
            status,
            headers: vec![("retry-after", "1".to_owned())],
            body: String::new(),
        }
    }

    /// DynamoDB's throttling answer: 400 with a `ThrottlingException` in the JSON protocol.
    pub fn aws_throttling() -> Self {
        Self {
            status: 400,
            headers: vec![("content-type", "application/x-amz-json-1.0".to_owned())],
            body: r#"{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException","message":"Rate of requests exceeds the allowed throughput."}"#
                .to_owned(),
        }
    }

    /// A Cloud Storage JSON API error with `status` (429 rate limit, 503 backend error).
    pub fn gcs(status: u16) -> Self {
        let (reason, message) = match status {
            429 => (
                "rateLimitExceeded",
                "The rate of change requests to the object is too high.",
            ),
            _ => ("backendError", "Backend Error"),
        };
        Self {
            status,
            headers: vec![("content-type", "application/json; charset=UTF-8".to_owned())],
            body: format!(
                r#"{{"error":{{"code":{status},"message":"{message}","errors":[{{"message":"{message}","domain":"global","reason":"{reason}"}}]}}}}"#
            ),
        }
    }

    /// An S3 REST error: `status` with the XML body S3 sends, naming `code` (`SlowDown`,
    /// `ConditionalRequestConflict`, `ExpiredToken`, `PermanentRedirect`, ...).
    pub fn s3(status: u16, code: &str) -> Self {
        Self {
            status,
            headers: vec![("content-type", "application/xml".to_owned())],
            body: format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code>\
                 <Message>canned by the fault proxy</Message><RequestId>0</RequestId></Error>"
            ),
        }
    }

    /// Azure Storage's 503 `ServerBusy`.
    pub fn azure_server_busy() -> Self {
        Self {
            status: 503,
            headers: vec![
                ("content-type", "application/xml".to_owned()),
                ("x-ms-error-code", "ServerBusy".to_owned()),
            ],
            body: "<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>ServerBusy</Code>\
                   <Message>The server is currently unable to receive requests. Please retry \
                   your request.</Message></Error>"
                .to_owned(),
        }
    }

    fn response(&self) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(Bytes::from(self.body.clone())));
        *response.status_mut() =
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        for (name, value) in &self.headers {
            if let Ok(value) = HeaderValue::from_str(value) {
                response.headers_mut().insert(*name, value);
            }
        }
        response
    }
}

/// What the proxy does to a request a [`Rule`] matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Answers with this, without forwarding.
    Answer(Canned),
    /// Closes the connection without forwarding or answering.
    Drop,
    /// Holds the request this long, then forwards it as usual.
    Delay(Duration),
    /// Forwards it (the store applies it) and closes the connection without the answer.
    LoseResponse,
    /// Forwards it, then holds the connection this long without an answer (the client times
    /// out), then closes it.
    HoldResponse(Duration),
    /// Holds the request this long, then forwards it (it lands after its client gave up) and
    /// drops the answer.
    Late(Duration),
}

/// A planned fault: to the requests that match, after `skip` of them went through
/// untouched, `fault`, `times` times.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    matcher: Match,
    fault: Fault,
    skip: u64,
    times: u64,
}

impl Rule {
    /// `fault` on the next request that matches.
    pub fn new(matcher: Match, fault: Fault) -> Self {
        Self {
            matcher,
            fault,
            skip: 0,
            times: 1,
        }
    }

    /// Lets `skip` matching requests through first.
    pub fn after(mut self, skip: u64) -> Self {
        self.skip = skip;
        self
    }

    /// Applies the fault to `times` matching requests (1 unless told).
    pub fn times(mut self, times: u64) -> Self {
        self.times = times;
        self
    }
}

/// What the proxy needs to know of a request to match and count it.
struct Seen {
    method: Method,
    path: String,
    aws_operation: Option<String>,
}

impl Seen {
    fn label(&self) -> String {
        match &self.aws_operation {
            Some(op) => op.clone(),
            None => format!("{} {}", self.method, self.path),
        }
    }
}

/// One kind of request with one kind of answer, as [`FaultProxy::exchanges`] counts them: what
/// a cloud's price of a request depends on, as far as the proxy can see it.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Exchange {
    /// The AWS operation, else `METHOD /path` (as [`FaultProxy::requests`] names requests).
    pub kind: String,
    /// Azure Blob's operation parameters of the query, `restype=` and `comp=`, as they came
    /// (`comp=lease`, `restype=container&comp=list`), if any.
    pub azure_op: Option<String>,
    /// Azure's `x-ms-lease-action` header (`acquire`, `renew`, `release`, ...), if any.
    pub lease_action: Option<String>,
    /// DynamoDB reads (`GetItem`, `Query`, `Scan`): whether the request asked for a strongly
    /// consistent read (`"ConsistentRead":true`); `None` for other requests.
    pub consistent_read: Option<bool>,
    /// DynamoDB transactions (`TransactWriteItems`, `TransactGetItems`): how many items.
    pub items: Option<usize>,
    /// The status of the store's answer; `None` if the client got no answer from the proxy.
    pub status: Option<u16>,
    /// The store's error code of an error answer (`ConditionalCheckFailedException`,
    /// `LeaseAlreadyPresent`, `conditionNotMet`, ...), if it gave one.
    pub error: Option<String>,
}

impl Exchange {
    /// What the request says; the answer is filled in later.
    fn of_request(seen: &Seen, query: Option<&str>, headers: &HeaderMap, body: &[u8]) -> Self {
        let azure_op = query
            .map(|q| {
                q.split('&')
                    .filter(|pair| pair.starts_with("restype=") || pair.starts_with("comp="))
                    .collect::<Vec<_>>()
                    .join("&")
            })
            .filter(|op| !op.is_empty());
        let lease_action = headers
            .get("x-ms-lease-action")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let (consistent_read, items) = match &seen.aws_operation {
            Some(op) => aws_request_details(op, body),
            None => (None, None),
        };
        Self {
            kind: seen.label(),
            azure_op,
            lease_action,
            consistent_read,
            items,
            status: None,
            error: None,
        }
    }
}

/// What a DynamoDB request's price depends on besides its operation: `ConsistentRead` of a
/// read, and the number of items of a transaction.
fn aws_request_details(operation: &str, body: &[u8]) -> (Option<bool>, Option<usize>) {
    let json: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let consistent = matches!(operation, "GetItem" | "Query" | "Scan").then(|| {
        json.get("ConsistentRead")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false)
    });
    let items = operation
        .starts_with("Transact")
        .then(|| {
            json.get("TransactItems")
                .and_then(serde_json::Value::as_array)
                .map(Vec::len)
        })
        .flatten();
    (consistent, items)
}

/// The error code of an error answer: Azure's `x-ms-error-code`, the AWS JSON protocol's
/// `__type` (without its namespace), the first reason of a Cloud Storage JSON error, or the
/// `<Code>` of an S3 XML error.
fn error_code(headers: &HeaderMap, body: &[u8]) -> Option<String> {
    if let Some(code) = headers.get("x-ms-error-code").and_then(|v| v.to_str().ok()) {
        return Some(code.to_owned());
    }
    if body.trim_ascii_start().starts_with(b"<") {
        let text = String::from_utf8_lossy(body);
        let (_, rest) = text.split_once("<Code>")?;
        let (code, _) = rest.split_once("</Code>")?;
        return Some(code.trim().to_owned()).filter(|c| !c.is_empty());
    }
    let json: serde_json::Value = serde_json::from_slice(body).ok()?;
    if let Some(t) = json.get("__type").and_then(serde_json::Value::as_str) {
        return Some(t.rsplit('#').next().unwrap_or(t).to_owned());
    }
    json.pointer("/error/errors/0/reason")
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
}

struct Shared {
    upstream: SocketAddr,
    faults: watch::Sender<ProxyFaults>,
    counts: ProxyCounts,
    rng: Mutex<Rng>,
    rules: Mutex<Vec<Rule>>,
    requests: Mutex<BTreeMap<String, u64>>,
    exchanges: Mutex<BTreeMap<Exchange, u64>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn chance(&self, p: f64) -> bool {
        p > 0.0 && lock(&self.rng).chance(p)
    }

    /// The fault of the first rule that takes this request; spent rules are removed.
    fn planned(&self, seen: &Seen) -> Option<Fault> {
        let mut rules = lock(&self.rules);
        let i = rules.iter().position(|r| r.matcher.matches(seen))?;
        let rule = &mut rules[i];
        if rule.skip > 0 {
            rule.skip -= 1;
            return None;
        }
        let fault = rule.fault.clone();
        rule.times = rule.times.saturating_sub(1);
        if rule.times == 0 {
            rules.remove(i);
        }
        Some(fault)
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
            rng: Mutex::new(Rng::seeded(seed)),
            rules: Mutex::new(Vec::new()),
            requests: Mutex::new(BTreeMap::new()),
            exchanges: Mutex::new(BTreeMap::new()),
        });
        let task = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(Self { addr, shared, task })
    }

    /// Starts a proxy in front of the emulator at `url` (`http://host:port[/path]`; the path
    /// is not kept: add it to [`url`](Self::url) where the store needs it).
    ///
    /// # Errors
    /// If `url` is not a plain-HTTP URL, or as [`start`](Self::start).
    pub async fn in_front_of(url: &str, seed: u64) -> std::io::Result<Self> {
        let upstream = authority(url).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("not an http:// URL: {url}"),
            )
        })?;
        Self::start(upstream, seed).await
    }

    /// `url`, the emulator's URL given to [`in_front_of`](Self::in_front_of), with this
    /// proxy's address in place of the emulator's; the path (Azurite's account) is kept.
    pub fn url_for(&self, url: &str) -> String {
        let path = url
            .strip_prefix("http://")
            .and_then(|rest| rest.find('/').map(|i| &rest[i..]))
            .unwrap_or("");
        format!("{}{path}", self.url())
    }

    /// The proxy's base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Replaces the random faults in force.
    pub fn set(&self, faults: ProxyFaults) {
        self.shared.faults.send_replace(faults);
    }

    /// Adds a planned fault, after those already planned (the first rule that matches a
    /// request takes it).
    pub fn inject(&self, rule: Rule) {
        lock(&self.shared.rules).push(rule);
    }

    /// Drops every planned fault not yet spent.
    pub fn clear_rules(&self) {
        lock(&self.shared.rules).clear();
    }

    /// Of the next requests (in the order they arrive), lets `skip` through and then forwards
    /// `count` and drops their responses, whatever the random faults in force; requests held
    /// by a blackhole or throttled do not count. Replaces every planned fault.
    pub fn lose_responses(&self, skip: u64, count: u64) {
        let mut rules = lock(&self.shared.rules);
        rules.clear();
        if count > 0 {
            rules.push(
                Rule::new(Match::Any, Fault::LoseResponse)
                    .after(skip)
                    .times(count),
            );
        }
    }

    /// Turns every random fault off (planned faults stay).
    pub fn heal(&self) {
        self.set(ProxyFaults::default());
    }

    /// What the proxy did so far.
    pub fn counts(&self) -> &ProxyCounts {
        &self.shared.counts
    }

    /// The requests received per operation (the AWS operation, else `METHOD /path`), since
    /// the start or the last [`reset_requests`](Self::reset_requests).
    pub fn requests(&self) -> BTreeMap<String, u64> {
        lock(&self.shared.requests).clone()
    }

    /// The requests received since the start or the last
    /// [`reset_requests`](Self::reset_requests), by what their price depends on: kind, the
    /// details of the request that change its price, and the answer's status and error code.
    /// A request is counted here once its answer is known (or known to be withheld).
    pub fn exchanges(&self) -> BTreeMap<Exchange, u64> {
        lock(&self.shared.exchanges).clone()
    }

    /// Starts counting [`requests`](Self::requests) and [`exchanges`](Self::exchanges) afresh.
    pub fn reset_requests(&self) {
        lock(&self.shared.requests).clear();
        lock(&self.shared.exchanges).clear();
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
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let shared = shared.clone();
                async move { handle(request, shared).await }
            });
            // One request per connection, as the emulators' clients see from a proxy that
            // closes after each answer; a request without an answer closes it too.
            let _ = hyper::server::conn::http1::Builder::new()
                .keep_alive(false)
                .serve_connection(TokioIo::new(conn), service)
                .await;
        });
    }
}

/// Why a request got no answer: the connection is closed without one.
#[derive(Debug)]
struct NoAnswer(&'static str);

impl std::fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for NoAnswer {}

const HOP_BY_HOP: [&str; 6] = [
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// The whole of `body`; `broken` says why there is no answer if it breaks off.
async fn whole(body: Incoming, broken: &'static str) -> Result<Bytes, NoAnswer> {
    Ok(body
        .collect()
        .await
        .map_err(|_| NoAnswer(broken))?
        .to_bytes())
}

async fn handle(
    request: Request<Incoming>,
    shared: Arc<Shared>,
) -> Result<Response<Full<Bytes>>, NoAnswer> {
    let (mut parts, body) = request.into_parts();
    // The whole body (a chunked one de-chunked), forwarded with a Content-Length.
    let body = whole(body, "the request body did not arrive").await?;
    let had_body = parts.headers.contains_key(header::CONTENT_LENGTH)
        || parts.headers.contains_key(header::TRANSFER_ENCODING);
    strip_hop_by_hop(&mut parts.headers);
    // The body is sent whole, so no interim 100 Continue is wanted from the upstream.
    parts.headers.remove(header::EXPECT);
    if had_body {
        parts
            .headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    }
    parts
        .headers
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    let seen = Seen {
        method: parts.method.clone(),
        path: parts.uri.path().to_owned(),
        aws_operation: parts
            .headers
            .get("x-amz-target")
            .and_then(|t| t.to_str().ok())
            .and_then(|t| t.split('.').nth(1))
            .map(str::to_owned),
    };
    *lock(&shared.requests).entry(seen.label()).or_default() += 1;
    let mut exchange = Exchange::of_request(&seen, parts.uri.query(), &parts.headers, &body);
    let request = Request::from_parts(parts, Full::new(body));
    // What follows goes on if the client leaves: a held or late write still lands.
    let answer = tokio::spawn(decide(request, seen, shared.clone()))
        .await
        .map_err(|_| NoAnswer("the proxy's task failed"))
        .flatten();
    let answer = match answer {
        Ok(response) => {
            exchange.status = Some(response.status().as_u16());
            if response.status().as_u16() >= 400 {
                let (parts, body) = response.into_parts();
                let body = body
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                exchange.error = error_code(&parts.headers, &body);
                Ok(Response::from_parts(parts, Full::new(body)))
            } else {
                Ok(response)
            }
        }
        Err(e) => Err(e),
    };
    *lock(&shared.exchanges).entry(exchange).or_default() += 1;
    answer
}

async fn decide(
    request: Request<Full<Bytes>>,
    seen: Seen,
    shared: Arc<Shared>,
) -> Result<Response<Full<Bytes>>, NoAnswer> {
    let counts = &shared.counts;
    let mut faults_rx = shared.faults.subscribe();
    let faults = *faults_rx.borrow_and_update();
    if faults.blackhole {
        counts.blackholed.fetch_add(1, Ordering::Relaxed);
        let _ = faults_rx.wait_for(|f| !f.blackhole).await;
        return Err(NoAnswer("blackholed"));
    }
    if !faults.latency.is_zero() {
        tokio::time::sleep(faults.latency).await;
    }
    if shared.chance(faults.throttle_fraction) {
        counts.throttled.fetch_add(1, Ordering::Relaxed);
        return Ok(faults
            .throttle_answer
            .canned(faults.throttle_status)
            .response());
    }
    let planned = shared.planned(&seen);
    let late = match planned {
        Some(Fault::Late(by)) => Some(by),
        _ => shared
            .chance(faults.late_fraction)
            .then_some(faults.late_by),
    };
    let lose = match &planned {
        Some(Fault::Answer(canned)) => {
            counts.throttled.fetch_add(1, Ordering::Relaxed);
            return Ok(canned.response());
        }
        Some(Fault::Drop) => {
            counts.dropped.fetch_add(1, Ordering::Relaxed);
            return Err(NoAnswer("dropped"));
        }
        Some(Fault::Delay(by)) => {
            tokio::time::sleep(*by).await;
            None
        }
        Some(Fault::LoseResponse) => Some(Duration::ZERO),
        Some(Fault::HoldResponse(hold)) => Some(*hold),
        Some(Fault::Late(_)) | None => None,
    };
    if let Some(by) = late {
        // Held past the client's timeout whether or not the client is still there, then
        // applied: the hardest lost-response case.
        tokio::time::sleep(by).await;
    }
    let lose = lose.or_else(|| {
        shared
            .chance(faults.lose_response_fraction)
            .then_some(Duration::ZERO)
    });
    let response = forward(shared.upstream, request).await?;
    if late.is_some() {
        counts.late.fetch_add(1, Ordering::Relaxed);
        return Err(NoAnswer("applied long after the client gave up"));
    }
    if let Some(hold) = lose {
        counts.lost.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(hold).await;
        return Err(NoAnswer("the emulator applied it; the client never hears"));
    }
    counts.forwarded.fetch_add(1, Ordering::Relaxed);
    Ok(response)
}

/// Sends `request` to the upstream on a connection of its own and reads the whole answer.
async fn forward(
    upstream: SocketAddr,
    request: Request<Full<Bytes>>,
) -> Result<Response<Full<Bytes>>, NoAnswer> {
    let conn = TcpStream::connect(upstream)
        .await
        .map_err(|_| NoAnswer("the upstream refused"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(conn))
        .await
        .map_err(|_| NoAnswer("the upstream handshake failed"))?;
    let driver = tokio::spawn(connection);
    let result = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|_| NoAnswer("the upstream did not answer"))?;
        let (mut parts, body) = response.into_parts();
        let body = whole(body, "the upstream's answer broke off").await?;
        // The Content-Length stays (a HEAD answer's describes a body it does not carry).
        strip_hop_by_hop(&mut parts.headers);
        Ok(Response::from_parts(parts, Full::new(body)))
    }
    .await;
    driver.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamodb_reads_and_transactions_are_told_apart() {
        let get = br#"{"TableName":"t","Key":{"pk":{"S":"k"}},"ConsistentRead":true}"#;
        assert_eq!(aws_request_details("GetItem", get), (Some(true), None));
        let get = br#"{"TableName":"t","Key":{"pk":{"S":"k"}}}"#;
        assert_eq!(aws_request_details("GetItem", get), (Some(false), None));
        let put = br#"{"TableName":"t","Item":{}}"#;
        assert_eq!(aws_request_details("PutItem", put), (None, None));
        let tx = br#"{"TransactItems":[{"Update":{}},{"ConditionCheck":{}}]}"#;
        assert_eq!(
            aws_request_details("TransactWriteItems", tx),
            (None, Some(2))
        );
        assert_eq!(
            aws_request_details("GetItem", b"not json"),
            (Some(false), None)
        );
    }

    #[test]
    fn error_codes_of_each_store() {
        let mut azure = HeaderMap::new();
        azure.insert(
            "x-ms-error-code",
            HeaderValue::from_static("LeaseAlreadyPresent"),
        );
        assert_eq!(
            error_code(&azure, b"<Error/>").as_deref(),
            Some("LeaseAlreadyPresent")
        );
        let aws =
            br#"{"__type":"com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException"}"#;
        assert_eq!(
            error_code(&HeaderMap::new(), aws).as_deref(),
            Some("ConditionalCheckFailedException")
        );
        let gcs = br#"{"error":{"code":412,"errors":[{"reason":"conditionNotMet"}]}}"#;
        assert_eq!(
            error_code(&HeaderMap::new(), gcs).as_deref(),
            Some("conditionNotMet")
        );
        let s3 = b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>PreconditionFailed</Code>\
            <Message>At least one of the pre-conditions you specified did not hold</Message></Error>";
        assert_eq!(
            error_code(&HeaderMap::new(), s3).as_deref(),
            Some("PreconditionFailed")
        );
        let canned = ThrottleAnswer::S3SlowDown.canned(503);
        assert_eq!(
            error_code(&HeaderMap::new(), canned.body.as_bytes()).as_deref(),
            Some("SlowDown")
        );
        assert_eq!(error_code(&HeaderMap::new(), b"<Error/>"), None);
        assert_eq!(error_code(&HeaderMap::new(), b""), None);
    }
}
