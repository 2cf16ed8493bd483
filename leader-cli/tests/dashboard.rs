#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code
#![allow(clippy::disallowed_methods)] // real processes need real time
//! The Grafana dashboard and the Prometheus files of `docker/` against what `leader run
//! --metrics-addr` serves.
//!
//! Every PromQL expression of `docker/grafana/dashboards/leader.json` (panels, panels nested
//! in rows, template variable queries) is parsed for the `leader_*` metrics and the labels it
//! uses. Real `leader run` processes on a file store are then scraped over plain HTTP
//! (`GET /metrics`), and the union of their scrapes must serve every sample name the
//! dashboard queries (a histogram as `NAME_bucket` etc.), with every label the query
//! selects or groups by; and every `leader_*` family served must be shown by the dashboard
//! or be listed in [`NOT_ON_DASHBOARD`] with a reason, so that a new metric forces a
//! decision.
//!
//! The processes (ttl 2 s, renew every 300 ms, so that a term and renewals happen within a
//! second): `a` leads a key with `--supervise` and a command that exits after 2 s, so its
//! terms end (term length) and begin again; `b` follows the same key and sees the handovers
//! (time without a leader); `s` is a sharded run (`--shards 2`) on another key, the only
//! kind that serves `leader_shards_led`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use common::{LEADER, descendants, exit_status, signal};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

/// `leader_*` families the exporter serves that the dashboard deliberately does not show:
/// (family, why). A family served by neither is an error of the test.
const NOT_ON_DASHBOARD: &[(&str, &str)] = &[];

/// The datasource of every panel: the dashboard's `datasource` variable, whose default is
/// the provisioned Prometheus (docker/grafana/provisioning/datasources/prometheus.yml).
const DATASOURCE_UID: &str = "${datasource}";

const TIMING: [&str; 4] = ["--ttl", "2s", "--renew-every", "300ms"];

fn docker(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docker")
        .join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(docker(path)).unwrap_or_else(|e| panic!("docker/{path}: {e}"))
}

fn dashboard() -> Value {
    serde_json::from_str(&read("grafana/dashboards/leader.json"))
        .expect("docker/grafana/dashboards/leader.json is not JSON")
}

// ------------------------------------------------------------------------------------------
// The dashboard's queries.

/// One PromQL expression of the dashboard, and where it is.
#[derive(Clone, Debug)]
struct Query {
    whence: String,
    expr: String,
}

/// Every PromQL expression of the dashboard: each panel's targets (rows' nested panels
/// included) and each query variable's query.
fn queries(dash: &Value) -> Vec<Query> {
    fn panels(list: &Value, out: &mut Vec<Query>) {
        for panel in list.as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or("(untitled)");
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    out.push(Query {
                        whence: format!("panel {title:?}, target {}", target["refId"]),
                        expr: expr.to_owned(),
                    });
                }
            }
            panels(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dash["panels"], &mut out);
    for var in dash["templating"]["list"].as_array().into_iter().flatten() {
        if var["type"] != "query" {
            continue;
        }
        let name = var["name"].as_str().unwrap_or("?");
        // Grafana 10+ keeps the query as an object; older dashboards as a string.
        let query = var["query"]["query"].as_str().or(var["query"].as_str());
        for (field, expr) in [("query", query), ("definition", var["definition"].as_str())] {
            if let Some(expr) = expr.filter(|e| !e.is_empty()) {
                out.push(Query {
                    whence: format!("variable ${name} ({field})"),
                    expr: expr.to_owned(),
                });
            }
        }
    }
    out
}

/// Every string under an `expr` key anywhere in the document: no query may hide from
/// [`queries`].
fn all_exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, x) in map {
                match (k.as_str(), x) {
                    ("expr", Value::String(s)) => out.push(s.clone()),
                    _ => all_exprs(x, out),
                }
            }
        }
        Value::Array(list) => list.iter().for_each(|x| all_exprs(x, out)),
        _ => {}
    }
}

#[derive(Debug, PartialEq)]
enum Tok {
    Ident(String),
    Str,
    Num,
    /// A Grafana variable: `$key`, `${key}`, `$__rate_interval`.
    Var,
    Punct(char),
}

fn tokens(expr: &str) -> Vec<Tok> {
    let c: Vec<char> = expr.chars().collect();
    let ident = |ch: char| ch.is_ascii_alphanumeric() || ch == '_' || ch == ':';
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch.is_whitespace() {
            i += 1;
        } else if ch == '#' {
            // A comment, to the end of the line.
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if matches!(ch, '"' | '\'' | '`') {
            i += 1;
            while i < c.len() && c[i] != ch {
                i += if c[i] == '\\' && ch != '`' { 2 } else { 1 };
            }
            i += 1;
            out.push(Tok::Str);
        } else if ch == '$' {
            i += 1;
            if c.get(i) == Some(&'{') {
                while i < c.len() && c[i] != '}' {
                    i += 1;
                }
                i += 1;
            } else {
                while i < c.len() && ident(c[i]) {
                    i += 1;
                }
            }
            out.push(Tok::Var);
        } else if ch.is_ascii_digit()
            || (ch == '.' && c.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            // Numbers and durations (0.99, 5m, 1h30m, 1e3).
            while i < c.len() && (ident(c[i]) || c[i] == '.') {
                i += 1;
            }
            out.push(Tok::Num);
        } else if ident(ch) {
            let start = i;
            while i < c.len() && ident(c[i]) {
                i += 1;
            }
            out.push(Tok::Ident(c[start..i].iter().collect()));
        } else {
            out.push(Tok::Punct(ch));
            i += 1;
        }
    }
    out
}

/// What one expression uses: `leader_*` names as written (a histogram as `NAME_bucket`...),
/// and the labels it selects on (`{label=...}`) or groups by (`by (...)`, `on (...)`...).
#[derive(Debug, Default, PartialEq)]
struct Uses {
    metrics: BTreeSet<String>,
    labels: BTreeSet<String>,
}

fn uses(expr: &str) -> Uses {
    let toks = tokens(expr);
    let mut out = Uses::default();
    let mut braces = 0usize;
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Punct('{') => braces += 1,
            Tok::Punct('}') => braces = braces.saturating_sub(1),
            Tok::Ident(name) if braces > 0 => {
                if matches!(toks.get(i + 1), Some(Tok::Punct('=' | '!'))) {
                    out.labels.insert(name.clone());
                }
            }
            Tok::Ident(kw)
                if matches!(
                    kw.as_str(),
                    "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
                ) && toks.get(i + 1) == Some(&Tok::Punct('(')) =>
            {
                i += 2;
                while i < toks.len() && toks[i] != Tok::Punct(')') {
                    if let Tok::Ident(label) = &toks[i] {
                        out.labels.insert(label.clone());
                    }
                    i += 1;
                }
            }
            // label_values(METRIC, LABEL) in a variable query.
            Tok::Ident(f) if f == "label_values" => {
                if let [
                    Tok::Punct('('),
                    ..,
                    Tok::Punct(','),
                    Tok::Ident(label),
                    Tok::Punct(')'),
                ] = &toks[i + 1..toks.len().min(i + 1 + count_to_close(&toks[i + 1..]))]
                {
                    out.labels.insert(label.clone());
                }
            }
            Tok::Ident(name) if name.starts_with("leader_") => {
                out.metrics.insert(name.clone());
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// The number of tokens from an opening parenthesis to its closing one, both included.
fn count_to_close(toks: &[Tok]) -> usize {
    let mut depth = 0usize;
    for (n, t) in toks.iter().enumerate() {
        match t {
            Tok::Punct('(') => depth += 1,
            Tok::Punct(')') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return n + 1;
                }
            }
            _ => {}
        }
    }
    toks.len()
}

// ------------------------------------------------------------------------------------------
// The exporter's answer.

/// A scrape in the Prometheus text format: each family's type, and each sample name's label
/// sets and values.
/// One sample's labels and value.
type Sample = (BTreeMap<String, String>, f64);

/// Something that must have happened, and how a scrape shows it.
type Activity = (&'static str, fn(&Scrape) -> bool);

#[derive(Debug, Default)]
struct Scrape {
    types: BTreeMap<String, String>,
    samples: BTreeMap<String, Vec<Sample>>,
}

const SUFFIXES: [&str; 3] = ["_bucket", "_sum", "_count"];

impl Scrape {
    fn parse(text: &str) -> Self {
        let mut s = Self::default();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut p = rest.split_whitespace();
                if let (Some(name), Some(kind)) = (p.next(), p.next()) {
                    s.types.insert(name.to_owned(), kind.to_owned());
                }
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            let name = &line[..end];
            let mut labels = BTreeMap::new();
            let mut rest = &line[end..];
            if rest.starts_with('{') {
                let (parsed, after) = parse_labels(&rest[1..])
                    .unwrap_or_else(|| panic!("malformed labels in {line:?}"));
                labels = parsed;
                rest = after;
            }
            let value = rest
                .split_whitespace()
                .next()
                .and_then(|v| match v {
                    "+Inf" => Some(f64::INFINITY),
                    "-Inf" => Some(f64::NEG_INFINITY),
                    v => v.parse().ok(),
                })
                .unwrap_or_else(|| panic!("malformed sample {line:?}"));
            s.samples
                .entry(name.to_owned())
                .or_default()
                .push((labels, value));
        }
        s
    }

    fn merge(&mut self, other: Scrape) {
        self.types.extend(other.types);
        for (name, mut v) in other.samples {
            self.samples.entry(name).or_default().append(&mut v);
        }
    }

    /// The family a sample name belongs to: `NAME_bucket` of a histogram is `NAME`.
    fn family(&self, sample: &str) -> String {
        for suffix in SUFFIXES {
            if let Some(base) = sample.strip_suffix(suffix)
                && matches!(
                    self.types.get(base).map(String::as_str),
                    Some("histogram" | "summary")
                )
            {
                return base.to_owned();
            }
        }
        sample.to_owned()
    }

    /// The `leader_*` families served: typed, or with samples.
    fn families(&self) -> BTreeSet<String> {
        self.types
            .keys()
            .cloned()
            .chain(self.samples.keys().map(|s| self.family(s)))
            .filter(|f| f.starts_with("leader_"))
            .collect()
    }

    /// Every label name on the samples of `sample`.
    fn labels(&self, sample: &str) -> BTreeSet<String> {
        self.samples
            .get(sample)
            .into_iter()
            .flatten()
            .flat_map(|(l, _)| l.keys().cloned())
            .collect()
    }

    fn values(&self, sample: &str) -> impl Iterator<Item = f64> + '_ {
        self.samples
            .get(sample)
            .into_iter()
            .flatten()
            .map(|(_, v)| *v)
    }

    fn sum(&self, sample: &str) -> f64 {
        self.values(sample).sum()
    }

    fn max(&self, sample: &str) -> f64 {
        self.values(sample).fold(f64::NEG_INFINITY, f64::max)
    }
}

/// `a="x",b="y\"z"}` → the labels, and what follows the `}`.
fn parse_labels(mut s: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    loop {
        s = s.trim_start_matches([',', ' ']);
        if let Some(rest) = s.strip_prefix('}') {
            return Some((labels, rest));
        }
        let eq = s.find('=')?;
        let name = s[..eq].trim().to_owned();
        s = s[eq + 1..].strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.insert(name, value);
        s = &s[end + 1..];
    }
}

// ------------------------------------------------------------------------------------------
// The checks, as functions of the queries and a scrape (the unit tests below run them on a
// planted mistake).

/// Each sample name a query uses that the scrape does not serve, with the query.
fn missing_metrics(queries: &[Query], scrape: &Scrape) -> Vec<String> {
    let mut out = Vec::new();
    for q in queries {
        for m in uses(&q.expr).metrics {
            if !scrape.samples.contains_key(&m) {
                out.push(format!("{m} (used by {}: {})", q.whence, q.expr));
            }
        }
    }
    out
}

/// Each label a query selects on or groups by that none of its metrics' samples carry.
fn missing_labels(queries: &[Query], scrape: &Scrape) -> Vec<String> {
    let mut out = Vec::new();
    for q in queries {
        let u = uses(&q.expr);
        let served: BTreeSet<String> = u.metrics.iter().flat_map(|m| scrape.labels(m)).collect();
        for l in u.labels.difference(&served) {
            out.push(format!(
                "label {l:?} (used by {}: {}; its metrics carry {served:?})",
                q.whence, q.expr
            ));
        }
    }
    out
}

/// The `leader_*` families served that no query uses and [`NOT_ON_DASHBOARD`]-like
/// `exceptions` do not excuse; and the exceptions that are stale (used, or not served).
fn unused_families(queries: &[Query], scrape: &Scrape, exceptions: &[(&str, &str)]) -> Vec<String> {
    let used: BTreeSet<String> = queries
        .iter()
        .flat_map(|q| uses(&q.expr).metrics)
        .map(|m| scrape.family(&m))
        .collect();
    let served = scrape.families();
    let excused: BTreeSet<String> = exceptions.iter().map(|(f, _)| (*f).to_owned()).collect();
    let mut out: Vec<String> = served
        .difference(&used)
        .filter(|f| !excused.contains(*f))
        .map(|f| format!("{f} is served but not on the dashboard (show it, or list it in NOT_ON_DASHBOARD with a reason)"))
        .collect();
    for f in &excused {
        if used.contains(f) {
            out.push(format!(
                "{f} is listed in NOT_ON_DASHBOARD but the dashboard uses it"
            ));
        } else if !served.contains(f) {
            out.push(format!("{f} is listed in NOT_ON_DASHBOARD but not served"));
        }
    }
    out
}

// ------------------------------------------------------------------------------------------
// Real processes.

/// A `GET` over HTTP/1.1 with `Connection: close`: (status, content type, body).
fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String, String), String> {
    let mut stream =
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/plain\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let raw = String::from_utf8(raw).map_err(|e| e.to_string())?;
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no end of headers in {raw:?}"))?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line in {head:?}"))?;
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let body = if headers
        .get("transfer-encoding")
        .is_some_and(|t| t.eq_ignore_ascii_case("chunked"))
    {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    let content_type = headers.get("content-type").cloned().unwrap_or_default();
    Ok((status, content_type, body))
}

fn dechunk(mut s: &str) -> Result<String, String> {
    let mut out = String::new();
    loop {
        let (size, rest) = s.split_once("\r\n").ok_or("truncated chunk")?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|e| format!("chunk size {size:?}: {e}"))?;
        if size == 0 {
            return Ok(out);
        }
        out.push_str(rest.get(..size).ok_or("truncated chunk")?);
        s = rest.get(size + 2..).ok_or("truncated chunk")?;
    }
}

/// One `leader run --metrics-addr 127.0.0.1:0`; killed with everything below it if the test
/// ends without stopping it.
struct Instance {
    name: &'static str,
    child: Child,
    addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

impl Instance {
    fn start(name: &'static str, args: &[&str]) -> Self {
        let mut child = Command::new(LEADER)
            .args(["run", "--metrics-addr", "127.0.0.1:0"])
            .args(args)
            .env("LEADER_LOG", "info")
            .env("LEADER_LOG_FORMAT", "text")
            .env_remove("LEADER_METRICS_ADDR")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = metrics_addr(&line) {
                    let _ = tx.send(addr);
                }
                lines.lock().unwrap().push(line);
            }
        });
        let Ok(addr) = rx.recv_timeout(Duration::from_secs(20)) else {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
            panic!(
                "`leader run` {name} logged no metrics_addr= line within 20 s; stderr:\n{}",
                log.lock().unwrap().join("\n")
            );
        };
        Self {
            name,
            child,
            addr,
            log,
        }
    }

    fn scrape(&self) -> Result<Scrape, String> {
        let (status, content_type, body) = http_get(self.addr, "/metrics")?;
        if status != 200 {
            return Err(format!("GET /metrics: status {status}: {body}"));
        }
        // Prometheus 3 refuses a scrape without a content type it knows.
        if !content_type.starts_with("text/plain") {
            return Err(format!(
                "GET /metrics: content type {content_type:?}, not text/plain"
            ));
        }
        Ok(Scrape::parse(&body))
    }

    fn stderr(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let pid = self.child.id() as i32;
            let mut all = descendants(pid);
            all.push(pid);
            for pid in all {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            let _ = self.child.wait();
        }
    }
}

/// The address in a log line `... metrics_addr=127.0.0.1:PORT ...` (quoted or not).
fn metrics_addr(line: &str) -> Option<SocketAddr> {
    let rest = line.split("metrics_addr=").nth(1)?;
    let value = rest.split_whitespace().next()?.trim_matches(['"', ',']);
    value.parse().ok()
}

// ------------------------------------------------------------------------------------------
// The tests.

#[test]
fn every_dashboard_metric_is_served() {
    let dash = dashboard();
    let queries = queries(&dash);
    let names: BTreeSet<String> = queries.iter().flat_map(|q| uses(&q.expr).metrics).collect();
    assert!(
        !names.is_empty(),
        "the dashboard queries no leader_* metric: {queries:#?}"
    );

    let dir = tempfile::tempdir().unwrap();
    let key = format!("file://{}/key", dir.path().display());
    let sharded = format!("file://{}/sharded", dir.path().display());
    let single = |id: &'static str| {
        let mut a = vec!["--store", key.as_str(), "--id", id];
        a.extend(TIMING);
        a
    };
    // `a` leads first: its command ends after 2 s, and --supervise campaigns again.
    let mut a_args = single("dash-a");
    a_args.extend(["--supervise", "--", "sleep", "2"]);
    let a = Instance::start("a", &a_args);
    let start = Instant::now();
    loop {
        if let Ok(s) = a.scrape()
            && s.max("leader_is_leader") == 1.0
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "a did not become leader within 15 s; stderr:\n{}",
            a.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut b_args = single("dash-b");
    b_args.extend(["--supervise", "--", "sleep", "30"]);
    let b = Instance::start("b", &b_args);
    let mut s_args = vec![
        "--store",
        sharded.as_str(),
        "--shards",
        "2",
        "--id",
        "dash-s",
    ];
    s_args.extend(TIMING);
    s_args.extend(["--", "sleep", "30"]);
    let s = Instance::start("s", &s_args);
    let instances = [&a, &b, &s];

    // What must have happened, so that every panel has data to show.
    let activity: [Activity; 7] = [
        ("an instance leads", |s| s.max("leader_is_leader") == 1.0),
        ("a term started", |s| {
            s.sum("leader_terms_started_total") >= 1.0
        }),
        ("a renew was timed", |s| {
            s.sum("leader_renew_duration_seconds_count") >= 1.0
        }),
        ("a renew's slack was observed", |s| {
            s.sum("leader_renew_slack_seconds_count") >= 1.0
        }),
        ("a term ended (a's command exits after 2 s)", |s| {
            s.sum("leader_term_duration_seconds_count") >= 1.0
        }),
        ("b saw a handover", |s| {
            s.sum("leader_leaderless_seconds_count") >= 1.0
        }),
        ("the sharded run leads both shards", |s| {
            s.max("leader_shards_led") == 2.0
        }),
    ];
    let limit = Duration::from_secs(30);
    let start = Instant::now();
    let (union, errors) = loop {
        let mut union = Scrape::default();
        let mut errors = Vec::new();
        for i in instances {
            match i.scrape() {
                Ok(s) => union.merge(s),
                Err(e) => errors.push(format!("{}: {e}", i.name)),
            }
        }
        let done = errors.is_empty()
            && missing_metrics(&queries, &union).is_empty()
            && activity.iter().all(|(_, f)| f(&union));
        if done || start.elapsed() > limit {
            break (union, errors);
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let logs = || {
        instances
            .iter()
            .map(|i| format!("--- {} stderr:\n{}", i.name, i.stderr()))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(errors.is_empty(), "scrapes failed: {errors:#?}\n{}", logs());
    let missing = missing_metrics(&queries, &union);
    assert!(
        missing.is_empty(),
        "the dashboard queries sample names that `leader run --metrics-addr` does not serve \
         (after {limit:?}; served: {:?}):\n{}",
        union.samples.keys().collect::<Vec<_>>(),
        missing.join("\n")
    );
    let labels = missing_labels(&queries, &union);
    assert!(labels.is_empty(), "{}", labels.join("\n"));
    let unused = unused_families(&queries, &union, NOT_ON_DASHBOARD);
    assert!(unused.is_empty(), "{}", unused.join("\n"));
    let idle: Vec<&str> = activity
        .iter()
        .filter(|(_, f)| !f(&union))
        .map(|(what, _)| *what)
        .collect();
    assert!(
        idle.is_empty(),
        "within {limit:?}, not seen in the scrapes: {idle:?}\n{}",
        logs()
    );

    for i in instances {
        signal(&i.child, Signal::SIGTERM);
    }
    for mut i in [a, b, s] {
        let status = exit_status(&mut i.child, Duration::from_secs(10));
        assert_eq!(
            status,
            Ok(128 + Signal::SIGTERM as i32),
            "{} after SIGTERM; stderr:\n{}",
            i.name,
            i.stderr()
        );
    }
}

#[test]
fn dashboard_is_complete_and_uses_the_provisioned_datasource() {
    let dash = dashboard();
    assert_eq!(dash["uid"], "leader-lease");
    assert!(dash["schemaVersion"].as_u64().unwrap() >= 39);
    let queries = queries(&dash);
    let mut everywhere = Vec::new();
    all_exprs(&dash, &mut everywhere);
    let from_panels = queries
        .iter()
        .filter(|q| q.whence.starts_with("panel"))
        .count();
    assert_eq!(
        everywhere.len(),
        from_panels,
        "an `expr` outside the panels' targets: {everywhere:#?}"
    );

    let vars = dash["templating"]["list"].as_array().unwrap();
    let var = |name: &str| {
        vars.iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no ${name} variable"))
    };
    assert_eq!(var("datasource")["type"], "datasource");
    assert_eq!(var("datasource")["query"], "prometheus");
    // The keys of every run: sharded runs serve no leader_is_leader, but store calls.
    let key = var("key");
    assert_eq!(
        key["query"]["query"],
        "label_values(leader_store_requests_total, key)"
    );
    assert_eq!(key["datasource"]["uid"], DATASOURCE_UID);

    // Every panel but a row queries, through the variable; rows nest panels.
    fn check(panels: &Value, seen: &mut usize) {
        for p in panels.as_array().unwrap() {
            let title = &p["title"];
            if p["type"] == "row" {
                check(&p["panels"], seen);
                continue;
            }
            *seen += 1;
            assert_eq!(p["datasource"]["uid"], DATASOURCE_UID, "panel {title}");
            let targets = p["targets"]
                .as_array()
                .unwrap_or_else(|| panic!("panel {title} has no targets"));
            assert!(!targets.is_empty(), "panel {title} has no targets");
            for t in targets {
                assert_eq!(t["datasource"]["uid"], DATASOURCE_UID, "panel {title}");
                let expr = t["expr"].as_str().unwrap_or_default();
                assert!(!uses(expr).metrics.is_empty(), "panel {title}: {expr:?}");
                // Every selector is narrowed to the chosen keys.
                assert!(expr.contains(r#"key=~"$key""#), "panel {title}: {expr}");
            }
        }
    }
    let mut seen = 0;
    check(&dash["panels"], &mut seen);
    assert!(seen >= 9, "{seen} panels");
    // At least one row is collapsed, with its panels nested: they were collected too.
    assert!(queries.iter().any(|q| q.expr.contains("leader_shards_led")));
}

#[test]
fn prometheus_and_grafana_files_fit_together() {
    let prometheus = read("prometheus.yml");
    for needle in [
        "job_name: leader",
        "scrape_interval: 5s",
        "metrics_path: /metrics",
        "host.docker.internal:9464",
    ] {
        assert!(
            prometheus.contains(needle),
            "prometheus.yml lacks {needle:?}"
        );
    }
    let datasource = read("grafana/provisioning/datasources/prometheus.yml");
    for needle in [
        "type: prometheus",
        "url: http://prometheus:9090",
        "isDefault: true",
        "timeInterval: 5s",
    ] {
        assert!(
            datasource.contains(needle),
            "the datasource provisioning lacks {needle:?}"
        );
    }
    let dashboards = read("grafana/provisioning/dashboards/leader.yml");
    assert!(dashboards.contains("path: /var/lib/grafana/dashboards"));
    let compose = read("compose.yaml");
    for needle in [
        "./prometheus.yml:/etc/prometheus/prometheus.yml",
        "./grafana/provisioning:/etc/grafana/provisioning",
        "./grafana/dashboards:/var/lib/grafana/dashboards",
        "host.docker.internal:host-gateway",
        "\"127.0.0.1:9090:9090\"",
        "\"127.0.0.1:3000:3000\"",
    ] {
        assert!(compose.contains(needle), "compose.yaml lacks {needle:?}");
    }
    assert_eq!(
        compose.matches("profiles: [\"observability\"]").count(),
        2,
        "prometheus and grafana, and only they, are in the profile observability"
    );
}

// The checks themselves, on a planted mistake.

const SAMPLE_SCRAPE: &str = r#"# TYPE leader_is_leader gauge
leader_is_leader{key="k",holder="h",backend="file"} 1
# TYPE leader_renew_duration_seconds histogram
leader_renew_duration_seconds_bucket{key="k",holder="h",backend="file",le="0.005"} 3
leader_renew_duration_seconds_bucket{key="k",holder="h",backend="file",le="+Inf"} 4
leader_renew_duration_seconds_sum{key="k",holder="h",backend="file"} 0.02
leader_renew_duration_seconds_count{key="k",holder="h",backend="file"} 4
# TYPE leader_store_requests_total counter
leader_store_requests_total{key="k",holder="h",backend="file",op="renew",outcome="ok"} 4
leader_store_requests_total{key="k \"quoted\", {braced}",holder="h",backend="file",op="read",outcome="error"} 0
"#;

fn q(expr: &str) -> Query {
    Query {
        whence: "test".into(),
        expr: expr.into(),
    }
}

#[test]
fn extractor_finds_metrics_and_labels() {
    let u = uses(
        r#"histogram_quantile(0.99, sum by (key, le) (rate(leader_renew_duration_seconds_bucket{key=~"$key", holder!="leader_not_a_metric"}[$__rate_interval]))) / on (key) group_left leader_is_leader # leader_comment"#,
    );
    assert_eq!(
        u.metrics,
        BTreeSet::from([
            "leader_renew_duration_seconds_bucket".into(),
            "leader_is_leader".into()
        ])
    );
    assert_eq!(
        u.labels,
        BTreeSet::from(["key".into(), "le".into(), "holder".into()])
    );
    let v = uses("label_values(leader_store_requests_total, key)");
    assert_eq!(
        v.metrics,
        BTreeSet::from(["leader_store_requests_total".into()])
    );
    assert_eq!(v.labels, BTreeSet::from(["key".into()]));
    assert_eq!(
        metrics_addr("2026-01-01T00:00:00Z  INFO serving metrics metrics_addr=127.0.0.1:41234"),
        Some("127.0.0.1:41234".parse().unwrap())
    );
}

#[test]
fn the_checks_catch_a_planted_mistake() {
    let scrape = Scrape::parse(SAMPLE_SCRAPE);
    assert_eq!(
        scrape.labels("leader_store_requests_total"),
        BTreeSet::from(["backend", "holder", "key", "op", "outcome"].map(String::from))
    );
    assert_eq!(
        scrape.family("leader_renew_duration_seconds_bucket"),
        "leader_renew_duration_seconds"
    );
    let good = vec![
        q(r#"max by (key, holder) (leader_is_leader{key=~"$key"})"#),
        q(
            r#"histogram_quantile(0.5, sum by (key, le) (rate(leader_renew_duration_seconds_bucket{key=~"$key"}[5m])))"#,
        ),
        q(r#"sum by (op, outcome) (rate(leader_store_requests_total{outcome!="ok"}[5m]))"#),
    ];
    assert!(missing_metrics(&good, &scrape).is_empty());
    assert!(missing_labels(&good, &scrape).is_empty());
    assert!(unused_families(&good, &scrape, &[]).is_empty());

    // The dashboard's own queries plus one for a metric nobody serves.
    let mut planted = queries(&dashboard());
    planted.push(q(r#"sum(rate(leader_bogus_total{key=~"$key"}[5m]))"#));
    let full = {
        // Everything the dashboard uses, served; the bogus metric not.
        let mut text = String::new();
        for name in planted.iter().flat_map(|q| uses(&q.expr).metrics) {
            if name != "leader_bogus_total" {
                text.push_str(&format!("{name}{{key=\"k\",holder=\"h\",backend=\"file\",le=\"1\",op=\"read\",outcome=\"ok\"}} 1\n"));
            }
        }
        Scrape::parse(&text)
    };
    let missing = missing_metrics(&planted, &full);
    assert_eq!(missing.len(), 1, "{missing:#?}");
    assert!(
        missing[0].starts_with("leader_bogus_total "),
        "{missing:#?}"
    );

    // A summary where the dashboard wants a histogram: no _bucket.
    let summary = Scrape::parse(
        "# TYPE leader_renew_duration_seconds summary\nleader_renew_duration_seconds{key=\"k\",quantile=\"0.5\"} 0.1\nleader_renew_duration_seconds_count{key=\"k\"} 1\n",
    );
    assert_eq!(missing_metrics(&good[1..2], &summary).len(), 1);

    // A label the metric does not carry.
    let labels = missing_labels(&[q("sum by (instance_id) (leader_is_leader)")], &scrape);
    assert_eq!(labels.len(), 1, "{labels:#?}");

    // A family served but not shown, and exceptions that are stale.
    let unused = unused_families(&good[..2], &scrape, &[]);
    assert_eq!(unused.len(), 1, "{unused:#?}");
    assert!(unused[0].starts_with("leader_store_requests_total "));
    assert!(
        unused_families(
            &good[..2],
            &scrape,
            &[("leader_store_requests_total", "test")]
        )
        .is_empty()
    );
    assert_eq!(
        unused_families(&good, &scrape, &[("leader_is_leader", "test")]).len(),
        1
    );
    assert_eq!(
        unused_families(&good, &scrape, &[("leader_gone", "test")]).len(),
        1
    );
}
