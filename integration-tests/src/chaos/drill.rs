//! The scenarios: one round spawns candidate processes, each behind its own proxy, injects one
//! fault, shuts everything down, and checks the history.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use leader_core::{ObjectName, Timing};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::Serialize;

use super::candidate::CandidateArgs;
use super::checker::{CandidateLog, FinalObject, check, parse_log};
use super::{
    BackendKind, EV_EXIT, EV_TERM_ENDED, EV_TERM_STARTED, EV_WRITE, OUT_ACCEPTED, duration_us,
    mono_us, open_store,
};
use crate::proxy::{FaultProxy, ProxyFaults, authority};

/// Slack on every timing bound, for process scheduling on a loaded machine.
pub const SLACK: Duration = Duration::from_secs(1);

/// One fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Scenario {
    /// SIGKILL the leader: a new term within `ttl + retry_every` (+ slack).
    Kill,
    /// SIGSTOP the leader past its ttl, then SIGCONT: its later writes are rejected or not
    /// made, and it notices that its term ended.
    Stop,
    /// Blackhole the leader's proxy: it steps down by its deadline, and a follower takes over
    /// only after that, within `ttl + retry_every` (+ slack).
    Partition,
    /// Blackhole every proxy for longer than the ttl, then heal: nobody acts without a term,
    /// and a leader is back within `ttl + 2 x retry_every` (+ slack) of the heal.
    Stall,
    /// 30 % of requests answered 503 for a while: no invariant breaks, a leader afterwards.
    Throttle,
    /// SIGTERM the leader: handover within `retry_every` (+ slack).
    Term,
    /// 20 % of requests applied by the store with their answer dropped, for a while: writes of
    /// unknown outcome everywhere; no invariant breaks, a leader afterwards.
    Lossy,
    /// 20 % of requests held past the sender's request timeout, then applied by the store (the
    /// sender has given up and re-read meanwhile), with a SIGTERM handover halfway through: no
    /// invariant breaks, a leader afterwards.
    Late,
}

impl Scenario {
    /// Every scenario.
    pub const ALL: [Scenario; 8] = [
        Scenario::Kill,
        Scenario::Stop,
        Scenario::Partition,
        Scenario::Stall,
        Scenario::Throttle,
        Scenario::Term,
        Scenario::Lossy,
        Scenario::Late,
    ];

    /// The name used on command lines and in summaries.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Kill => "sigkill",
            Scenario::Stop => "sigstop",
            Scenario::Partition => "partition",
            Scenario::Stall => "stall",
            Scenario::Throttle => "throttle",
            Scenario::Term => "sigterm",
            Scenario::Lossy => "lossy",
            Scenario::Late => "late",
        }
    }

    /// The scenario of a [`name`](Self::name).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Whether it applies to `kind` (the file store has no proxy to partition or throttle).
    pub fn applies_to(self, kind: BackendKind) -> bool {
        kind.proxied() || matches!(self, Scenario::Kill | Scenario::Stop | Scenario::Term)
    }

    /// The bound on the measured time: failover, handover or recovery.
    pub fn bound(self, t: &Timing) -> Option<Duration> {
        match self {
            Scenario::Kill | Scenario::Stop | Scenario::Partition => {
                Some(t.ttl + t.retry_every + SLACK)
            }
            Scenario::Stall => Some(t.ttl + t.retry_every * 2 + SLACK),
            Scenario::Term => Some(t.retry_every + SLACK),
            Scenario::Throttle | Scenario::Lossy | Scenario::Late => None,
        }
    }
}

/// Where and how a round runs.
#[derive(Clone, Debug)]
pub struct DrillConfig {
    /// The `chaos_candidate` binary.
    pub candidate_bin: PathBuf,
    /// A directory for the candidates' logs (and the file store); one subdirectory per round.
    pub work_dir: PathBuf,
    /// How many candidates (at least 2).
    pub candidates: usize,
    /// Seeds the proxies' dice.
    pub seed: u64,
}

/// The outcome of one round.
#[derive(Clone, Debug, Serialize)]
pub struct RoundReport {
    /// The backend.
    pub backend: BackendKind,
    /// The scenario.
    pub scenario: Scenario,
    /// Every violated invariant (empty: the round passed).
    pub violations: Vec<String>,
    /// Failover (kill, stop, partition), handover (sigterm) or recovery (stall) time.
    pub measured_ms: Option<f64>,
    /// Terms seen.
    pub terms: usize,
    /// Writes acknowledged.
    pub accepted: usize,
    /// Writes rejected for a stale token.
    pub fenced: usize,
    /// Writes failed or of unknown outcome.
    pub failed: usize,
    /// Step-downs while the fault was on (throttle: spurious ones).
    pub step_downs: usize,
    /// Requests the proxies delivered late (applied after their sender gave up).
    pub late_deliveries: u64,
    /// The round's directory (logs).
    pub dir: PathBuf,
}

struct Proc {
    id: String,
    child: Child,
    log: PathBuf,
    proxy: Option<FaultProxy>,
    killed_at: Option<u64>,
    done: bool,
}

impl Proc {
    fn pid(&self) -> Option<Pid> {
        i32::try_from(self.child.id()).ok().map(Pid::from_raw)
    }

    fn signal(&mut self, signal: Signal) {
        if !self.done
            && let Some(pid) = self.pid()
        {
            let _ = kill(pid, signal);
        }
    }

    /// `Some(())` once this candidate has logged the end of term `token`.
    fn term_ended(&self, token: u64) -> Option<()> {
        self.read()
            .events
            .iter()
            .any(|e| e.ev == EV_TERM_ENDED && e.token == token)
            .then_some(())
    }

    fn read(&self) -> CandidateLog {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        parse_log(&self.id, &text, self.killed_at)
    }

    fn exited(&mut self) -> bool {
        if !self.done && matches!(self.child.try_wait(), Ok(Some(_))) {
            self.done = true;
        }
        self.done
    }
}

fn logs(procs: &[Proc]) -> Vec<CandidateLog> {
    procs.iter().map(Proc::read).collect()
}

/// The candidate that leads now per its log (a term started and not ended, not killed), with
/// its token.
fn leader(procs: &[Proc]) -> Option<(usize, u64)> {
    let mut best = None;
    for (i, p) in procs.iter().enumerate() {
        if p.killed_at.is_some() || p.done {
            continue;
        }
        let log = p.read();
        let mut open = None;
        for e in &log.events {
            match e.ev.as_str() {
                EV_TERM_STARTED => open = Some(e.token),
                EV_TERM_ENDED if open == Some(e.token) => open = None,
                _ => {}
            }
        }
        if let Some(token) = open
            && best.is_none_or(|(_, t)| token > t)
        {
            best = Some((i, token));
        }
    }
    best
}

/// The first term started after `t`, not by `not_by`: (candidate, token, start).
fn term_after(procs: &[Proc], t: u64, not_by: Option<usize>) -> Option<(usize, u64, u64)> {
    let mut first: Option<(usize, u64, u64)> = None;
    for (i, p) in procs.iter().enumerate() {
        if Some(i) == not_by {
            continue;
        }
        for e in p.read().events {
            if e.ev == EV_TERM_STARTED && e.t > t && first.is_none_or(|f| e.t < f.2) {
                first = Some((i, e.token, e.t));
            }
        }
    }
    first
}

async fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if tokio::time::Instant::now() >= end {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// Creates the round's container, table or bucket and returns (emulator URL, place).
async fn prepare(
    kind: BackendKind,
    dir: &Path,
    timing: &Timing,
) -> Result<(String, String), String> {
    let Some(emulator) = kind.emulator() else {
        let store = dir.join("store");
        std::fs::create_dir_all(&store).map_err(|e| format!("creating {store:?}: {e}"))?;
        return Ok((store.display().to_string(), String::new()));
    };
    let endpoint = crate::endpoint(emulator)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{emulator} is not available"))?;
    let place = crate::unique_name("chaos");
    match kind {
        BackendKind::Gcs => crate::gcs::GcsClient::new(&endpoint.url)
            .create_bucket(&place)
            .await
            .map_err(|e| format!("creating bucket {place}: {e}"))?,
        _ => {
            open_store(
                kind,
                &endpoint.url,
                &place,
                timing.request_timeout.max(Duration::from_secs(2)),
                true,
            )
            .await
            .map_err(|e| format!("creating {place}: {e}"))?;
        }
    }
    Ok((endpoint.url, place))
}

/// Runs one round of `scenario` on `kind` and checks it.
///
/// # Errors
/// A message if the round could not be set up (no emulator, no binary); invariant violations
/// are in the report, not errors.
pub async fn run_round(
    kind: BackendKind,
    scenario: Scenario,
    cfg: &DrillConfig,
) -> Result<RoundReport, String> {
    let timing = kind.timing();
    let dir = cfg.work_dir.join(format!(
        "{}-{}-{}",
        kind.name(),
        scenario.name(),
        crate::unique_name("r")
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {dir:?}: {e}"))?;
    let (url, place) = prepare(kind, &dir, &timing).await?;
    let key = "chaos".to_owned();
    let mut procs = Vec::new();
    for i in 0..cfg.candidates.max(2) {
        let id = format!("c{i}");
        let (endpoint, proxy) = if kind.proxied() {
            let upstream = authority(&url).ok_or_else(|| format!("bad endpoint {url}"))?;
            let proxy = FaultProxy::start(upstream, cfg.seed.wrapping_add(i as u64))
                .await
                .map_err(|e| format!("starting a proxy: {e}"))?;
            // Keep the path (Azurite's account) after the proxy's authority.
            let path = url
                .strip_prefix("http://")
                .and_then(|r| r.find('/').map(|p| &r[p..]))
                .unwrap_or("");
            (format!("{}{path}", proxy.url()), Some(proxy))
        } else {
            (url.clone(), None)
        };
        let args = CandidateArgs {
            backend: kind,
            endpoint,
            place: place.clone(),
            key: key.clone(),
            id: id.clone(),
            timing,
            write_every: Duration::from_millis(60),
            act_delay: Duration::from_millis(150),
        };
        let log = dir.join(format!("{id}.jsonl"));
        let out = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let err =
            std::fs::File::create(dir.join(format!("{id}.stderr"))).map_err(|e| e.to_string())?;
        let child = Command::new(&cfg.candidate_bin)
            .args(args.to_args())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("spawning {:?}: {e}", cfg.candidate_bin))?;
        procs.push(Proc {
            id,
            child,
            log,
            proxy,
            killed_at: None,
            done: false,
        });
    }
    let mut violations = Vec::new();
    let mut measured = Measured::default();
    let mut step_downs = 0;
    let result = drive(
        kind,
        scenario,
        &timing,
        &mut procs,
        &mut violations,
        &mut measured,
        &mut step_downs,
    )
    .await;
    // Shut down: resume, SIGTERM, wait; SIGKILL what is left.
    for p in procs.iter_mut() {
        if let Some(proxy) = &p.proxy {
            proxy.heal();
        }
        p.signal(Signal::SIGCONT);
        p.signal(Signal::SIGTERM);
    }
    let exit_limit = timing.ttl + Duration::from_secs(5);
    let _ = wait_for(exit_limit, || {
        procs.iter_mut().all(Proc::exited).then_some(())
    })
    .await;
    for p in procs.iter_mut() {
        if !p.exited() {
            violations.push(format!(
                "{} did not exit within {exit_limit:?} of SIGTERM",
                p.id
            ));
            p.killed_at = Some(mono_us());
            p.signal(Signal::SIGKILL);
            let _ = p.child.wait();
            p.done = true;
        } else if p.killed_at.is_none() && !p.read().events.iter().any(|e| e.ev == EV_EXIT) {
            violations.push(format!("{} exited without shutting down its elector", p.id));
        }
    }
    if let Err(e) = result {
        violations.push(e);
    }
    violations.append(&mut measured.late);
    // The protected object, read directly (no proxy).
    let endpoint = if kind.proxied() {
        url.clone()
    } else {
        dir.join("store").display().to_string()
    };
    let object = match open_store(kind, &endpoint, &place, Duration::from_secs(5), false).await {
        Ok((_, fenced)) => {
            let name = ObjectName::new(format!("{key}-object")).map_err(|e| e.to_string())?;
            match fenced.fenced_read(&name).await {
                Ok(o) => o.map(|o| FinalObject {
                    fence: o.fence.get(),
                    value: String::from_utf8_lossy(&o.value).into_owned(),
                }),
                Err(e) => return Err(format!("reading the protected object: {e}")),
            }
        }
        Err(e) => return Err(format!("opening the store to read the object: {e}")),
    };
    let late_deliveries = procs
        .iter()
        .filter_map(|p| p.proxy.as_ref())
        .map(|proxy| {
            proxy
                .counts()
                .late
                .load(std::sync::atomic::Ordering::Relaxed)
        })
        .sum();
    let verdict = check(&logs(&procs), object.as_ref());
    violations.extend(verdict.violations);
    Ok(RoundReport {
        backend: kind,
        scenario,
        violations,
        measured_ms: measured.value,
        terms: verdict.terms.len(),
        accepted: verdict.accepted,
        fenced: verdict.fenced,
        failed: verdict.failed,
        step_downs,
        late_deliveries,
        dir,
    })
}

/// Injects the fault; bounds go to `violations`, an `Err` for a round that went nowhere.
async fn drive(
    kind: BackendKind,
    scenario: Scenario,
    timing: &Timing,
    procs: &mut [Proc],
    violations: &mut Vec<String>,
    measured: &mut Measured,
    step_downs: &mut usize,
) -> Result<(), String> {
    let _ = kind;
    let settle = Duration::from_millis(800);
    let start_limit = timing.ttl * 2 + Duration::from_secs(15);
    let (l, token) = wait_for(start_limit, || leader(procs))
        .await
        .ok_or_else(|| format!("no leader within {start_limit:?} of the start"))?;
    tokio::time::sleep(settle).await;
    let bound = scenario.bound(timing);
    let wait_limit = bound.unwrap_or(timing.ttl) + Duration::from_secs(5);
    let mut expect_new = |procs: &[Proc], after: u64, not_by: Option<usize>, what: &str| {
        expect_term(procs, after, not_by, what, bound, measured)
    };
    match scenario {
        Scenario::Kill | Scenario::Term => {
            let t = mono_us();
            if scenario == Scenario::Kill {
                procs[l].signal(Signal::SIGKILL);
                procs[l].killed_at = Some(t);
                let _ = procs[l].child.wait();
                procs[l].done = true;
            } else {
                procs[l].signal(Signal::SIGTERM);
            }
            let _ = wait_for(wait_limit, || term_after(procs, t, Some(l))).await;
            let what = if scenario == Scenario::Kill {
                "failover after SIGKILL"
            } else {
                "handover after SIGTERM"
            };
            expect_new(procs, t, Some(l), what)
                .ok_or_else(|| format!("no new leader within {wait_limit:?} of the {what}"))?;
            tokio::time::sleep(settle).await;
        }
        Scenario::Stop => {
            let t = mono_us();
            procs[l].signal(Signal::SIGSTOP);
            let _ = wait_for(wait_limit, || term_after(procs, t, Some(l))).await;
            let found = expect_new(procs, t, Some(l), "failover after SIGSTOP");
            let (n, new_token, _) = found
                .ok_or_else(|| format!("no new leader within {wait_limit:?} of the SIGSTOP"))?;
            // Resume once the new term has written, so that a write the old leader had
            // decided on before the pause meets a higher fence.
            let _ = wait_for(Duration::from_secs(3), || {
                procs[n]
                    .read()
                    .events
                    .iter()
                    .any(|e| e.ev == EV_WRITE && e.token == new_token && e.outcome == OUT_ACCEPTED)
                    .then_some(())
            })
            .await;
            let resumed = mono_us();
            procs[l].signal(Signal::SIGCONT);
            let noticed = wait_for(Duration::from_secs(3), || procs[l].term_ended(token)).await;
            if noticed.is_none() {
                violations.push(format!(
                    "{} did not notice within 3 s of SIGCONT that term {token} ended",
                    procs[l].id
                ));
            }
            tokio::time::sleep(settle).await;
            for e in procs[l].read().events {
                if e.ev == EV_WRITE
                    && e.token == token
                    && e.t1 > resumed
                    && e.outcome == OUT_ACCEPTED
                {
                    violations.push(format!(
                        "{} wrote with its old token {token} after SIGCONT and it was accepted",
                        procs[l].id
                    ));
                }
            }
        }
        Scenario::Partition => {
            let t = mono_us();
            if let Some(p) = &procs[l].proxy {
                p.set(ProxyFaults {
                    blackhole: true,
                    ..ProxyFaults::default()
                });
            }
            let _ = wait_for(wait_limit, || term_after(procs, t, Some(l))).await;
            expect_new(procs, t, Some(l), "failover after partition")
                .ok_or_else(|| format!("no new leader within {wait_limit:?} of the partition"))?;
            let stepped = wait_for(Duration::from_secs(2), || procs[l].term_ended(token)).await;
            if stepped.is_none() {
                violations.push(format!(
                    "the partitioned leader {} did not log the end of term {token}",
                    procs[l].id
                ));
            }
            if let Some(p) = &procs[l].proxy {
                p.heal();
            }
            tokio::time::sleep(settle).await;
        }
        Scenario::Stall => {
            let t = mono_us();
            for p in procs.iter() {
                if let Some(proxy) = &p.proxy {
                    proxy.set(ProxyFaults {
                        blackhole: true,
                        ..ProxyFaults::default()
                    });
                }
            }
            tokio::time::sleep(timing.ttl + Duration::from_millis(500)).await;
            let healed = mono_us();
            for p in procs.iter() {
                if let Some(proxy) = &p.proxy {
                    proxy.heal();
                }
            }
            // Nothing answered after the requests in flight timed out: no term may start.
            let quiet_from = t + duration_us(timing.request_timeout) + 200_000;
            for log in logs(procs) {
                for e in &log.events {
                    if e.ev == EV_TERM_STARTED && e.t > quiet_from && e.t < healed {
                        violations.push(format!(
                            "{} began term {} while the store was unreachable",
                            log.id, e.token
                        ));
                    }
                }
            }
            let _ = wait_for(wait_limit, || term_after(procs, healed, None)).await;
            expect_new(procs, healed, None, "recovery after the stall")
                .ok_or_else(|| format!("no leader within {wait_limit:?} of the heal"))?;
            tokio::time::sleep(settle).await;
        }
        Scenario::Throttle | Scenario::Lossy | Scenario::Late => {
            let t = mono_us();
            let faults = match scenario {
                Scenario::Throttle => ProxyFaults {
                    throttle_fraction: 0.3,
                    throttle_status: 503,
                    ..ProxyFaults::default()
                },
                Scenario::Lossy => ProxyFaults {
                    lose_response_fraction: 0.2,
                    ..ProxyFaults::default()
                },
                _ => ProxyFaults {
                    late_fraction: 0.2,
                    late_by: timing.request_timeout * 2 + Duration::from_millis(200),
                    ..ProxyFaults::default()
                },
            };
            for p in procs.iter() {
                if let Some(proxy) = &p.proxy {
                    proxy.set(faults);
                }
            }
            let window = (timing.ttl * 2).max(Duration::from_secs(5));
            if scenario == Scenario::Late {
                // A handover halfway through, so that the old leader's held writes (renews,
                // its release, fenced writes) land after the next term has begun.
                tokio::time::sleep(window / 2).await;
                if let Some((i, _)) = leader(procs) {
                    procs[i].signal(Signal::SIGTERM);
                }
                tokio::time::sleep(window / 2).await;
            } else {
                tokio::time::sleep(window).await;
            }
            let healed = mono_us();
            for p in procs.iter() {
                if let Some(proxy) = &p.proxy {
                    proxy.heal();
                }
            }
            *step_downs = logs(procs)
                .iter()
                .flat_map(|l| l.events.iter())
                .filter(|e| e.ev == EV_TERM_ENDED && e.t > t && e.t < healed)
                .count();
            let limit = timing.ttl + timing.retry_every * 2 + SLACK + Duration::from_secs(5);
            wait_for(limit, || leader(procs)).await.ok_or_else(|| {
                format!("no leader within {limit:?} after the {}", scenario.name())
            })?;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    Ok(())
}

/// The first term after `after` (not by `not_by`); records how long it took in `measured`.
/// A time over `bound` is recorded in `late`.
fn expect_term(
    procs: &[Proc],
    after: u64,
    not_by: Option<usize>,
    what: &str,
    bound: Option<Duration>,
    measured: &mut Measured,
) -> Option<(usize, u64, u64)> {
    let found = term_after(procs, after, not_by);
    if let Some((_, _, t)) = found {
        let took = t.saturating_sub(after);
        measured.value = Some(ms(took));
        if let Some(b) = bound
            && took > duration_us(b)
        {
            measured
                .late
                .push(format!("{what} took {:.0} ms, more than {b:?}", ms(took)));
        }
    }
    found
}

#[derive(Debug, Default)]
struct Measured {
    value: Option<f64>,
    late: Vec<String>,
}

/// Rounds of many scenarios, summarised.
#[derive(Debug, Default)]
pub struct Summary {
    rows: BTreeMap<(BackendKind, Scenario), Row>,
}

#[derive(Debug, Default)]
struct Row {
    rounds: usize,
    violations: usize,
    setup_errors: usize,
    measured: Vec<f64>,
    step_downs: usize,
    accepted: usize,
    fenced: usize,
    examples: Vec<String>,
}

impl Summary {
    /// Adds one round (or its setup error).
    pub fn add(
        &mut self,
        kind: BackendKind,
        scenario: Scenario,
        round: &Result<RoundReport, String>,
    ) {
        let row = self.rows.entry((kind, scenario)).or_default();
        row.rounds += 1;
        match round {
            Ok(r) => {
                row.violations += r.violations.len();
                if let Some(m) = r.measured_ms {
                    row.measured.push(m);
                }
                row.step_downs += r.step_downs;
                row.accepted += r.accepted;
                row.fenced += r.fenced;
                for v in r.violations.iter().take(2) {
                    if row.examples.len() < 6 {
                        row.examples.push(format!("{}: {v}", r.dir.display()));
                    }
                }
            }
            Err(e) => {
                row.setup_errors += 1;
                if row.examples.len() < 6 {
                    row.examples.push(format!("setup: {e}"));
                }
            }
        }
    }

    /// Total violations and setup errors.
    pub fn failures(&self) -> usize {
        self.rows
            .values()
            .map(|r| r.violations + r.setup_errors)
            .sum()
    }

    /// A table: rounds, violations, and min / median / p99 of the measured time per backend
    /// and scenario, then example violations.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<7} {:<10} {:>6} {:>10} {:>6} {:>9} {:>9} {:>9} {:>10} {:>9} {:>7}",
            "backend",
            "scenario",
            "rounds",
            "violations",
            "setup",
            "min_ms",
            "median_ms",
            "p99_ms",
            "stepdowns",
            "accepted",
            "fenced"
        );
        for ((kind, scenario), row) in &self.rows {
            let mut m = row.measured.clone();
            m.sort_by(f64::total_cmp);
            let pick = |q: f64| -> String {
                if m.is_empty() {
                    "-".to_owned()
                } else {
                    let i = ((m.len() as f64 - 1.0) * q).round() as usize;
                    format!("{:.0}", m[i.min(m.len() - 1)])
                }
            };
            let _ = writeln!(
                out,
                "{:<7} {:<10} {:>6} {:>10} {:>6} {:>9} {:>9} {:>9} {:>10} {:>9} {:>7}",
                kind.name(),
                scenario.name(),
                row.rounds,
                row.violations,
                row.setup_errors,
                pick(0.0),
                pick(0.5),
                pick(0.99),
                row.step_downs,
                row.accepted,
                row.fenced
            );
        }
        for ((kind, scenario), row) in &self.rows {
            for e in &row.examples {
                let _ = writeln!(out, "{} {}: {e}", kind.name(), scenario.name());
            }
        }
        out
    }
}
