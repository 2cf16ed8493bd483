//! `leader status`: who holds the lease, or (`--shards`) how the shards of a sharded key are
//! led; with `--watch`, one line per change until interrupted.

use std::io::Write as _;
use std::time::{Duration, UNIX_EPOCH};

use clap::Args;
use leader::Store;
use leader::backend::Stored;
use leader::{Error, LeaseKey, ShardSet, ShardedStatus, wall_clock_unix_ms};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::{Exit, exit, store};

/// The shortest `--interval` accepted.
const MIN_INTERVAL: Duration = Duration::from_millis(50);
/// The longest `--interval` accepted.
const MAX_INTERVAL: Duration = Duration::from_secs(3600);
/// How long one look at the store may take while watching before it counts as a transient
/// error (the cloud stores give up sooner by themselves; this bounds a hung file system).
const LOOK_TIMEOUT: Duration = Duration::from_secs(5);
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Where the lease lives (see "Stores" below). Given 3 or 5 times (or as space-separated
    /// URLs in LEADER_STORE): an election over a quorum of stores; prints each member's
    /// record and the term a majority carries, and exits 69 if fewer than a majority answered.
    #[arg(long, env = "LEADER_STORE", value_delimiter = ' ', required = true)]
    store: Vec<String>,
    #[command(flatten)]
    store_options: store::StoreOptions,
    /// The key is sharded (`leader run --shards`): print its members, the shards each claims
    /// and the shards nobody claims, read from the members' records (one read per member).
    #[arg(long)]
    shards: bool,
    /// Print one JSON object (with --watch: one per line).
    #[arg(long, env = "LEADER_JSON")]
    json: bool,
    /// Keep watching until interrupted: print the state at once, then a line each time the
    /// holder, the token or the state changes (with --shards: the assignment).
    ///
    /// The record is read every --interval; a renew that only rewrites it prints nothing.
    /// In text, a line starts with this machine's time (RFC 3339, UTC; with --shards the
    /// assignment's lines follow it); with --json each line is one object with the fields
    /// of `status --json` (`status --shards --json`) plus "at_unix_ms", this machine's wall
    /// clock when the change was seen. A store error that may pass (unreachable,
    /// throttled, timed out) prints one line with the state "unknown" (with --json: an
    /// "error" field) and one warning on stderr, and the watch goes on; once reads succeed
    /// again, the state is printed as a change.
    ///
    /// Exit codes: 0 when stopped by SIGINT, SIGTERM or SIGHUP, or when stdout's reader is
    /// gone (e.g. `| head -1`); 64 for an --interval outside 50ms..1h; 69 (78 for a
    /// configuration error) when the store cannot be used and retrying will not help, as
    /// without --watch (a missing folder, container, table or bucket, rejected
    /// credentials, a malformed record); 74 if stdout cannot be written (e.g. a full disk).
    #[arg(long)]
    watch: bool,
    /// With --watch: how often to read the store (50ms to 1h).
    #[arg(long, value_name = "DURATION", requires = "watch", default_value = "500ms",
          value_parser = crate::parse_duration)]
    interval: Duration,
}

pub(crate) async fn run(args: StatusArgs) -> Result<u8, Exit> {
    if args.watch && !(MIN_INTERVAL..=MAX_INTERVAL).contains(&args.interval) {
        return Err(Exit::new(
            exit::USAGE,
            format!(
                "--interval {}: must be between 50ms and 1h",
                humantime::format_duration(args.interval)
            ),
        ));
    }
    if let [_, _, ..] = args.store.as_slice() {
        return quorum_status(&args).await;
    }
    let url = store::parse(&args.store[0])?;
    if args.watch {
        // From the start: a stop while the store opens ends the watch as documented (0).
        let mut stop = StopSignals::new()?;
        let (backend, key) = tokio::select! {
            biased;
            () = stop.recv() => return Ok(0),
            opened = store::open(&url, &args.store_options) => opened?,
        };
        return watch(&*backend, &key, &args, stop).await;
    }
    let (backend, key) = store::open(&url, &args.store_options).await?;
    if args.shards {
        return sharded(&*backend, &key, args.json).await;
    }
    let current = backend
        .read(&key)
        .await
        .map_err(|e| store::unavailable(&e))?;
    let now_ms = wall_clock_unix_ms();
    let sharded = match current {
        None => sharded_shards(&*backend, &key).await,
        Some(_) => None,
    };
    if args.json {
        println!("{}", record_json(&key, current.as_ref(), sharded, now_ms));
        return Ok(0);
    }
    println!("{}", headline(&key, current.as_ref()));
    match current {
        None => {
            if let Some(n) = sharded {
                println!("  {key} is a sharded key ({n} shards): see `leader status --shards`");
            }
        }
        Some(s) => {
            let r = &s.record;
            let age_ms = now_ms.saturating_sub(r.written_unix_ms);
            println!(
                "  ttl {:?}; last written about {:.1} s ago (by the writer's clock)",
                r.ttl,
                age_ms as f64 / 1000.0
            );
            for (k, v) in &r.metadata {
                println!("  {k} = {v}");
            }
        }
    }
    Ok(0)
}

/// `leader status` over several stores: once, or (`--watch`) a view per change.
async fn quorum_status(args: &StatusArgs) -> Result<u8, Exit> {
    if args.shards {
        return Err(Exit::new(
            exit::USAGE,
            "--shards reads one store; an election over several stores leads one key".to_owned(),
        ));
    }
    let timeout = leader::Timing::from_ttl(leader::Timing::DEFAULT_TTL).request_timeout;
    if !args.watch {
        return crate::quorum::status(&args.store, &args.store_options, args.json, timeout).await;
    }
    let mut stop = StopSignals::new()?;
    let (quorum, key) = tokio::select! {
        biased;
        () = stop.recv() => return Ok(0),
        opened = crate::quorum::open(&args.store, &args.store_options) => opened?,
    };
    let mut last = None;
    loop {
        let status = leader::quorum::read_status(&quorum, &key, timeout)
            .await
            .map_err(|e| store::unavailable(&e))?;
        let at_ms = wall_clock_unix_ms();
        let mut value = crate::quorum::status_json(&status, at_ms);
        if let Some(o) = value.as_object_mut() {
            o.remove("at_unix_ms");
        }
        if last.as_ref() != Some(&value) {
            last = Some(value);
            let text = if args.json {
                format!("{}\n", crate::quorum::status_json(&status, at_ms))
            } else {
                format!(
                    "{} {}",
                    timestamp(at_ms),
                    crate::quorum::status_text(&status)
                )
            };
            if !emit(&text)? {
                return Ok(0);
            }
        }
        tokio::select! {
            biased;
            () = stop.recv() => return Ok(0),
            () = tokio::time::sleep(args.interval) => {}
        }
    }
}

/// The number of shards if `key` has no record of its own but is a sharded key (so that
/// status says so rather than only "nobody"); `None` otherwise or if that cannot be read.
async fn sharded_shards(backend: &dyn Store, key: &LeaseKey) -> Option<u32> {
    leader::read_status(backend, key)
        .await
        .ok()
        .flatten()
        .map(|s| s.shards)
}

/// The state word of a record: `absent`, `held` or `released`.
fn state_of(current: Option<&Stored>) -> &'static str {
    match current {
        None => "absent",
        Some(s) if s.record.is_held() => "held",
        Some(_) => "released",
    }
}

/// The JSON of `leader status --json` (documented in the README); `now_ms` is this
/// machine's wall clock, for `approx_age_ms`.
fn record_json(
    key: &LeaseKey,
    current: Option<&Stored>,
    sharded: Option<u32>,
    now_ms: u64,
) -> serde_json::Value {
    let Some(s) = current else {
        return serde_json::json!({
            "key": key.as_str(), "state": "absent", "holder": null, "token": null,
            "metadata": {}, "sharded": sharded.is_some(),
        });
    };
    let r = &s.record;
    serde_json::json!({
        "key": key.as_str(),
        "holder": r.holder.as_str(),
        "token": r.token.get(),
        "state": state_of(current),
        "metadata": r.metadata,
        "ttl_ms": u64::try_from(r.ttl.as_millis()).unwrap_or(u64::MAX),
        "written_unix_ms": r.written_unix_ms,
        "term_started_unix_ms": r.term_started_unix_ms,
        // The writer's wall clock, not ours: informational only.
        "approx_age_ms": now_ms.saturating_sub(r.written_unix_ms),
        "revision": s.revision.as_str(),
    })
}

/// The first line of `leader status` (and the line of `--watch`).
fn headline(key: &LeaseKey, current: Option<&Stored>) -> String {
    match current {
        None => format!("{key}: nobody holds the lease (no record)"),
        Some(s) => format!(
            "{key}: {} by {} with token {}",
            state_of(current),
            s.record.holder,
            s.record.token
        ),
    }
}

/// What one look at the store found while watching.
enum Seen {
    /// The key's own record.
    Single(Option<Stored>),
    /// The assignment of a sharded key (`None`: no roster), and whether the key has a
    /// record of its own.
    Shards(Option<ShardedStatus>, bool),
}

impl Seen {
    /// One read of what `--watch` watches.
    async fn read(backend: &dyn Store, key: &LeaseKey, shards: bool) -> Result<Seen, Error> {
        let look = async {
            if !shards {
                return Ok(Seen::Single(backend.read(key).await?));
            }
            let status = leader::read_status(backend, key).await?;
            // As `status --shards`: the key's own record tells a missing bucket (an error)
            // from a key that nobody joined.
            let single = match status {
                None => backend.read(key).await?.is_some(),
                Some(_) => false,
            };
            Ok(Seen::Shards(status, single))
        };
        tokio::time::timeout(LOOK_TIMEOUT, look)
            .await
            .unwrap_or(Err(Error::Timeout {
                operation: "reading the lease",
                after: LOOK_TIMEOUT,
            }))
    }

    /// What a change is measured on: holder, token and state, or the assignment; not the
    /// revision, the write time or the metadata.
    fn what(&self, key: &LeaseKey) -> serde_json::Value {
        match self {
            Seen::Single(current) => serde_json::json!([
                state_of(current.as_ref()),
                current.as_ref().map(|s| s.record.holder.as_str()),
                current.as_ref().map(|s| s.record.token.get()),
            ]),
            Seen::Shards(status, _) => sharded_json(key, status.as_ref()),
        }
    }
}

/// The output of a change while watching: one JSON line, or text lines of which the first
/// starts with the time.
async fn render(
    backend: &dyn Store,
    key: &LeaseKey,
    seen: &Seen,
    json: bool,
    at_ms: u64,
) -> String {
    let mut value = match (seen, json) {
        (Seen::Single(current), true) => {
            let sharded = match current {
                None => sharded_shards(backend, key).await,
                Some(_) => None,
            };
            record_json(key, current.as_ref(), sharded, at_ms)
        }
        (Seen::Shards(status, _), true) => sharded_json(key, status.as_ref()),
        (Seen::Single(current), false) => {
            return format!("{} {}\n", timestamp(at_ms), headline(key, current.as_ref()));
        }
        (Seen::Shards(Some(status), _), false) => {
            return format!("{} {}", timestamp(at_ms), sharded_text(key, status));
        }
        (Seen::Shards(None, single), false) => {
            let mut out = format!(
                "{} {key}: no instance has joined this sharded key (no roster)\n",
                timestamp(at_ms)
            );
            if *single {
                out.push_str(&format!(
                    "  {key} has a lease record of its own: see `leader status --watch` without --shards\n"
                ));
            }
            return out;
        }
    };
    if let Some(object) = value.as_object_mut() {
        object.insert("at_unix_ms".to_owned(), at_ms.into());
    }
    format!("{value}\n")
}

/// The text of a transient store error with its causes (an I/O error's errno, an SDK's
/// message), which its own text leaves out.
fn describe(error: &Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    let mut separator = "; cause: ";
    while let Some(cause) = source {
        text.push_str(separator);
        text.push_str(&cause.to_string());
        separator = ": ";
        source = cause.source();
    }
    text
}

/// The line for a transient store error while watching; `error` is its [`describe`] text.
fn unknown_line(key: &LeaseKey, error: &str, json: bool, at_ms: u64) -> String {
    if json {
        let value = serde_json::json!({
            "key": key.as_str(), "state": "unknown", "holder": null, "token": null,
            "error": error, "at_unix_ms": at_ms,
        });
        format!("{value}\n")
    } else {
        format!("{} {key}: unknown ({error})\n", timestamp(at_ms))
    }
}

/// `at_ms` as RFC 3339 in UTC with milliseconds.
fn timestamp(at_ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(at_ms)).to_string()
}

/// The signals that end a watch.
struct StopSignals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl StopSignals {
    fn new() -> Result<Self, Exit> {
        let make = |kind: SignalKind, name: &str| {
            signal(kind).map_err(|e| {
                Exit::new(exit::UNAVAILABLE, format!("signal handler for {name}: {e}"))
            })
        };
        Ok(Self {
            int: make(SignalKind::interrupt(), "SIGINT")?,
            term: make(SignalKind::terminate(), "SIGTERM")?,
            hup: make(SignalKind::hangup(), "SIGHUP")?,
        })
    }

    /// Waits for one of them.
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
            _ = self.hup.recv() => {}
        }
    }
}

/// Writes `text` to stdout and flushes it (stdout may be a pipe). `Ok(false)` if its reader
/// is gone.
fn emit(text: &str) -> Result<bool, Exit> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(Exit::new(
            exit::IO_ERROR,
            format!("cannot write to stdout: {e}"),
        )),
    }
}

/// What the watch has printed so far.
struct Watcher<'a> {
    backend: &'a dyn Store,
    key: &'a LeaseKey,
    shards: bool,
    json: bool,
    interval: Duration,
    /// What the last line printed showed (`None` at first and after an error line).
    last: Option<serde_json::Value>,
    /// Whether the last look failed (its line and warning are printed).
    failing: bool,
}

impl Watcher<'_> {
    /// One look at the store: the text to print, if anything changed.
    async fn step(&mut self) -> Result<Option<String>, Exit> {
        let seen = Seen::read(self.backend, self.key, self.shards).await;
        let at_ms = wall_clock_unix_ms();
        match seen {
            Ok(seen) => {
                if self.failing {
                    tracing::info!(key = %self.key, "the store answers again");
                    self.failing = false;
                }
                let what = seen.what(self.key);
                if self.last.as_ref() == Some(&what) {
                    return Ok(None);
                }
                self.last = Some(what);
                Ok(Some(
                    render(self.backend, self.key, &seen, self.json, at_ms).await,
                ))
            }
            Err(e) if e.is_retryable() => {
                self.last = None;
                if self.failing {
                    return Ok(None);
                }
                self.failing = true;
                let error = describe(&e);
                tracing::warn!(
                    key = %self.key,
                    "cannot read the lease: {error}; still watching, every {}",
                    humantime::format_duration(self.interval)
                );
                Ok(Some(unknown_line(self.key, &error, self.json, at_ms)))
            }
            Err(e) => Err(store::unavailable(&e)),
        }
    }
}

/// `leader status --watch`: a line per change until a stop signal, a closed stdout or an
/// error that retrying will not fix.
async fn watch(
    backend: &dyn Store,
    key: &LeaseKey,
    args: &StatusArgs,
    mut stop: StopSignals,
) -> Result<u8, Exit> {
    let mut watcher = Watcher {
        backend,
        key,
        shards: args.shards,
        json: args.json,
        interval: args.interval,
        last: None,
        failing: false,
    };
    loop {
        let text = tokio::select! {
            biased;
            () = stop.recv() => return Ok(0),
            text = watcher.step() => text?,
        };
        if let Some(text) = text
            && !emit(&text)?
        {
            return Ok(0);
        }
        tokio::select! {
            biased;
            () = stop.recv() => return Ok(0),
            () = tokio::time::sleep(args.interval) => {}
        }
    }
}

/// `leader status --shards`.
async fn sharded(backend: &dyn Store, key: &LeaseKey, json: bool) -> Result<u8, Exit> {
    let status = leader::read_status(backend, key)
        .await
        .map_err(|e| store::unavailable(&e))?;
    match (status, json) {
        (Some(s), true) => println!("{}", sharded_json(key, Some(&s))),
        (Some(s), false) => print!("{}", sharded_text(key, &s)),
        (None, _) => {
            // Some stores answer "no such object" for a missing bucket too; the key's own
            // record tells them apart (and whether the key is a single lease).
            let single = backend
                .read(key)
                .await
                .map_err(|e| store::unavailable(&e))?;
            if json {
                println!("{}", sharded_json(key, None));
            } else {
                println!("{key}: no instance has joined this sharded key (no roster)");
                if single.is_some() {
                    println!(
                        "  {key} has a lease record of its own: see `leader status` without --shards"
                    );
                }
            }
        }
    }
    Ok(0)
}

/// The shards of `set` as ranges, `0-2,5`; empty for none.
fn ranges(set: &ShardSet) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut run: Option<(u32, u32)> = None;
    for s in set.iter() {
        run = match run {
            Some((a, b)) if s == b + 1 => Some((a, s)),
            Some(done) => {
                out.push(range(done));
                Some((s, s))
            }
            None => Some((s, s)),
        };
    }
    out.extend(run.map(range));
    out.join(",")
}

fn range((a, b): (u32, u32)) -> String {
    if a == b {
        a.to_string()
    } else {
        format!("{a}-{b}")
    }
}

/// The JSON of `leader status --shards` (documented in the README).
fn sharded_json(key: &LeaseKey, status: Option<&ShardedStatus>) -> serde_json::Value {
    let Some(s) = status else {
        return serde_json::json!({
            "key": key.as_str(), "shards": null, "members": [], "unclaimed": [],
            "unclaimed_ranges": "",
        });
    };
    let members: Vec<serde_json::Value> = s
        .members
        .iter()
        .map(|m| {
            serde_json::json!({
                "id": m.id.as_str(),
                "held": m.held,
                "token": m.token.get(),
                "count": m.claims.len(),
                "claims": m.claims.iter().collect::<Vec<u32>>(),
                "ranges": ranges(&m.claims),
            })
        })
        .collect();
    serde_json::json!({
        "key": key.as_str(),
        "shards": s.shards,
        "members": members,
        "unclaimed": s.unclaimed.iter().collect::<Vec<u32>>(),
        "unclaimed_ranges": ranges(&s.unclaimed),
    })
}

fn sharded_text(key: &LeaseKey, s: &ShardedStatus) -> String {
    use std::fmt::Write;
    let held = s.members.iter().filter(|m| m.held).count();
    let mut out = format!(
        "{key}: {} shards; {held} of {} members hold their membership; {} unclaimed\n",
        s.shards,
        s.members.len(),
        s.unclaimed.len()
    );
    for m in &s.members {
        let _ = if m.held {
            let n = m.claims.len();
            let list = if n == 0 {
                String::new()
            } else {
                format!(": {}", ranges(&m.claims))
            };
            writeln!(
                out,
                "  {}: held, membership token {}, {n} shard{}{list}",
                m.id,
                m.token,
                if n == 1 { "" } else { "s" }
            )
        } else {
            writeln!(
                out,
                "  {}: not held (membership token {}), no shards",
                m.id, m.token
            )
        };
    }
    if !s.unclaimed.is_empty() {
        let _ = writeln!(out, "  unclaimed: {}", ranges(&s.unclaimed));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_sets_print_as_ranges() {
        let mut set = ShardSet::new(10);
        assert_eq!(ranges(&set), "");
        for s in [0, 1, 2, 5, 7, 8, 9] {
            set.insert(s);
        }
        assert_eq!(ranges(&set), "0-2,5,7-9");
        let mut one = ShardSet::new(3);
        one.insert(1);
        assert_eq!(ranges(&one), "1");
    }

    #[test]
    fn watch_lines_carry_the_time_and_an_error_its_cause() {
        assert_eq!(timestamp(1_796_133_104_827), "2026-12-01T13:51:44.827Z");
        let e = Error::Unavailable {
            message: "I/O error on /leases/job.lease".into(),
            source: Some(Box::new(std::io::Error::from_raw_os_error(24))),
        };
        let text = describe(&e);
        assert!(
            text.starts_with(&e.to_string()) && text.contains("; cause: Too many open files"),
            "{text}"
        );
        let key = LeaseKey::new("job").unwrap();
        let line: serde_json::Value =
            serde_json::from_str(&unknown_line(&key, &text, true, 5)).unwrap();
        assert_eq!(line["state"], "unknown");
        assert_eq!(line["error"], text.as_str());
        assert_eq!(line["at_unix_ms"], 5);
    }
}
