//! The fleet run on one backend: real member processes (`shard_bench member`), their logs read
//! as they come, and the store calls they count.
//!
//! Sharded: `procs` processes share `shards` shards; once they have converged, a window with
//! nothing changing hands (store calls per hour), then one more process joins, then one is
//! SIGKILLed, each time until every shard is led again with counts within one. Then the same
//! number of processes run one single-key elector per shard (a range of keys each), and the
//! same window counts their calls. At the end, every shard's terms are checked from the logs:
//! no two processes' terms of a shard overlap, tokens increase.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use integration_tests::chaos::drill::prepare;
use integration_tests::chaos::{BackendKind, mono_us};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::time::sleep;

use crate::counted::Calls;
use crate::member::{Line, MemberArgs, Mode};

/// What the fleet run is told.
#[derive(Clone, Debug)]
pub(crate) struct FleetSettings {
    /// Shards (keys, in the single scheme).
    pub(crate) shards: u32,
    /// Processes at the start.
    pub(crate) procs: usize,
    /// Lease duration.
    pub(crate) ttl: Duration,
    /// Wait after convergence before a window.
    pub(crate) settle: Duration,
    /// The sharded scheme's window.
    pub(crate) window: Duration,
    /// The single scheme's window.
    pub(crate) single_window: Duration,
    /// Logs go below this folder.
    pub(crate) dir: PathBuf,
    /// This program (the members run `<exe> member ...`).
    pub(crate) exe: PathBuf,
}

/// A convergence: how long, how many terms began meanwhile, the counts at the end.
#[derive(Clone, Debug)]
pub(crate) struct Converged {
    /// From the event (spawn, join, kill) to every shard led with counts within one, s.
    pub(crate) secs: f64,
    /// Shard terms that began meanwhile.
    pub(crate) moved: usize,
    /// Shards led by each live process at the end.
    pub(crate) counts: Vec<usize>,
}

/// Store calls while nothing changed hands.
#[derive(Clone, Debug, Default)]
pub(crate) struct Steady {
    /// Processes measured.
    pub(crate) instances: usize,
    /// Mean calls per hour of one instance, by kind (as [`Calls::fields`]).
    pub(crate) per_hour: Vec<(&'static str, f64)>,
    /// Mean reads per hour of one instance.
    pub(crate) reads: f64,
    /// Mean writes per hour of one instance.
    pub(crate) writes: f64,
    /// The window, s (mean over the processes).
    pub(crate) window_s: f64,
    /// Shard terms that began or ended in the window (0: nothing changed hands).
    pub(crate) changes: usize,
    /// Mean CPU of one instance, % of one core.
    pub(crate) cpu_pct: f64,
    /// Mean resident set of one instance at the window's end, KiB.
    pub(crate) rss_kib: f64,
}

/// Everything measured on one backend.
#[derive(Clone, Debug)]
pub(crate) struct FleetReport {
    /// The backend.
    pub(crate) kind: BackendKind,
    /// The first error that stopped the run.
    pub(crate) error: Option<String>,
    /// Sharded: every shard led by the first `procs` processes, from their spawn.
    pub(crate) take: Option<Converged>,
    /// Sharded: the steady window.
    pub(crate) sharded: Option<Steady>,
    /// Sharded: one more process joins.
    pub(crate) join: Option<Converged>,
    /// Sharded: one process SIGKILLed.
    pub(crate) kill: Option<Converged>,
    /// Sharded: terms that ended at their deadline in a live process, and membership terms
    /// lost, summed over the processes (the killed one up to its last tick).
    pub(crate) missed: u64,
    /// See [`missed`](Self::missed).
    pub(crate) lost: u64,
    /// Single: the steady window.
    pub(crate) single: Option<Steady>,
    /// Single: terms that ended before the shutdown.
    pub(crate) single_lost: u64,
    /// What the logs show against the rules (a shard led by two at once, tokens not
    /// increasing, a member that died by itself).
    pub(crate) violations: Vec<String>,
    /// Where the members' logs are.
    pub(crate) logs: PathBuf,
}

/// One member as its log shows it.
#[derive(Debug, Default)]
struct Proc {
    id: String,
    led: BTreeMap<u32, u64>,
    ticks: Vec<Line>,
    deadline: u64,
    killed: Option<u64>,
    stopping: bool,
    eof: bool,
    junk: Vec<String>,
}

#[derive(Debug)]
struct Interval {
    proc: usize,
    start: u64,
    end: Option<u64>,
    tok: u64,
}

/// What every member's log showed so far.
#[derive(Debug, Default)]
struct World {
    procs: Vec<Proc>,
    intervals: BTreeMap<u32, Vec<Interval>>,
    /// When terms began.
    starts: Vec<u64>,
    /// When terms began or ended.
    changes: Vec<u64>,
}

impl World {
    fn apply(&mut self, p: usize, line: Line) {
        match line.ev.as_str() {
            "start" => {
                self.procs[p].led.insert(line.s, line.tok);
                self.intervals.entry(line.s).or_default().push(Interval {
                    proc: p,
                    start: line.t,
                    end: None,
                    tok: line.tok,
                });
                self.starts.push(line.t);
                self.changes.push(line.t);
            }
            "end" => {
                self.procs[p].led.remove(&line.s);
                if let Some(i) = self
                    .intervals
                    .get_mut(&line.s)
                    .and_then(|v| v.iter_mut().rev().find(|i| i.proc == p && i.end.is_none()))
                {
                    i.end = Some(line.t);
                }
                self.changes.push(line.t);
            }
            "deadline" => self.procs[p].deadline = line.d,
            "tick" => self.procs[p].ticks.push(line),
            _ => {}
        }
    }

    /// The counts if the live processes lead every shard once, within one of each other.
    fn converged(&self, live: &[usize], n: u32) -> Option<Vec<usize>> {
        let mut seen = vec![false; n as usize];
        let mut total = 0;
        for &p in live {
            for &s in self.procs[p].led.keys() {
                let slot = seen.get_mut(s as usize)?;
                if *slot {
                    return None;
                }
                *slot = true;
                total += 1;
            }
        }
        let counts: Vec<usize> = live.iter().map(|&p| self.procs[p].led.len()).collect();
        let (lo, hi) = (counts.iter().min()?, counts.iter().max()?);
        (total == n as usize && hi - lo <= 1).then_some(counts)
    }

    /// The rules the logs can be checked against: per shard, no two processes' terms overlap
    /// (an end is logged before the term is dropped, so before the release that lets another
    /// process take it; a killed process's terms end by its last logged deadline) and tokens
    /// increase in the order the terms began.
    fn violations(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (s, terms) in &self.intervals {
            let mut terms: Vec<&Interval> = terms.iter().collect();
            terms.sort_by_key(|i| i.start);
            // The term that ends last among those begun so far, and the previous term.
            let mut covering: Option<(&Interval, u64)> = None;
            let mut previous: Option<&Interval> = None;
            for i in terms {
                if let Some((c, c_end)) = covering
                    && c.proc != i.proc
                    && i.start <= c_end
                {
                    let until = if c_end == u64::MAX {
                        "the end".to_owned()
                    } else {
                        c_end.to_string()
                    };
                    out.push(format!(
                        "shard {s} led twice: {} (token {}) until {until}, {} (token {}) from \
                         {} (mono us)",
                        self.procs[c.proc].id, c.tok, self.procs[i.proc].id, i.tok, i.start
                    ));
                }
                if let Some(prev) = previous
                    && i.tok <= prev.tok
                {
                    out.push(format!(
                        "shard {s}: token {} of {} began after token {} of {}",
                        i.tok, self.procs[i.proc].id, prev.tok, self.procs[prev.proc].id
                    ));
                }
                let end = match (i.end, self.procs[i.proc].killed) {
                    (Some(end), _) => end,
                    (None, Some(_)) => self.procs[i.proc].deadline,
                    (None, None) => u64::MAX,
                };
                if covering.is_none_or(|(_, e)| end >= e) {
                    covering = Some((i, end));
                }
                previous = Some(i);
            }
        }
        out
    }
}

fn lock(world: &Mutex<World>) -> MutexGuard<'_, World> {
    world.lock().unwrap_or_else(|e| e.into_inner())
}

/// A member process; SIGKILLed and reaped when dropped if still running.
struct Member {
    child: Child,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Member {
    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(i32::MAX))
    }

    fn signal(&self, signal: Signal) {
        let _ = kill(self.pid(), signal);
    }

    /// SIGTERM, then SIGKILL after `grace`; reaps it and waits for its log to be read.
    async fn stop(&mut self, grace: Duration) {
        self.signal(Signal::SIGTERM);
        let until = tokio::time::Instant::now() + grace;
        while tokio::time::Instant::now() < until {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            sleep(Duration::from_millis(20)).await;
        }
        self.reap();
    }

    fn reap(&mut self) {
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            self.signal(Signal::SIGKILL);
            let _ = self.child.wait();
        }
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.reap();
    }
}

/// Starts a member whose log goes into `world` as process number `p`.
fn spawn(
    s: &FleetSettings,
    world: &Arc<Mutex<World>>,
    args: &MemberArgs,
    logs: &Path,
) -> Result<Member, String> {
    let p = {
        let mut w = lock(world);
        w.procs.push(Proc {
            id: args.id.clone(),
            ..Proc::default()
        });
        w.procs.len() - 1
    };
    let stderr = std::fs::File::create(logs.join(format!("{}.stderr", args.id)))
        .map_err(|e| format!("creating a log in {logs:?}: {e}"))?;
    let mut child = Command::new(&s.exe)
        .arg("member")
        .args(args.to_args())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("starting {:?}: {e}", s.exe))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut copy = std::fs::File::create(logs.join(format!("{}.jsonl", args.id)))
        .map_err(|e| format!("creating a log in {logs:?}: {e}"))?;
    let world = world.clone();
    let reader = std::thread::spawn(move || {
        use std::io::Write as _;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let _ = writeln!(copy, "{line}");
            let mut w = lock(&world);
            match serde_json::from_str::<Line>(&line) {
                Ok(parsed) => w.apply(p, parsed),
                Err(_) => w.procs[p].junk.push(line),
            }
        }
        lock(&world).procs[p].eof = true;
    });
    Ok(Member {
        child,
        reader: Some(reader),
    })
}

/// Waits until the live processes lead every shard, within one of each other; `since` is the
/// event timed from ([`mono_us`]).
async fn converge(
    world: &Mutex<World>,
    live: &[usize],
    n: u32,
    since: u64,
    within: Duration,
    what: &str,
) -> Result<Converged, String> {
    let until = tokio::time::Instant::now() + within;
    loop {
        {
            let w = lock(world);
            if let Some(counts) = w.converged(live, n) {
                let now = mono_us();
                return Ok(Converged {
                    secs: now.saturating_sub(since) as f64 / 1e6,
                    moved: w.starts.iter().filter(|&&t| t >= since).count(),
                    counts,
                });
            }
            if let Some(&p) = live.iter().find(|&&p| w.procs[p].eof) {
                return Err(format!(
                    "{what}: member {} exited by itself (see its .stderr log)",
                    w.procs[p].id
                ));
            }
            if tokio::time::Instant::now() >= until {
                let counts: Vec<String> = live
                    .iter()
                    .map(|&p| format!("{}: {}", w.procs[p].id, w.procs[p].led.len()))
                    .collect();
                return Err(format!(
                    "{what}: not converged within {} s (led: {})",
                    within.as_secs(),
                    counts.join(", ")
                ));
            }
        }
        sleep(Duration::from_millis(20)).await;
    }
}

/// Measures the calls of the live processes over `window`.
async fn steady(world: &Mutex<World>, live: &[usize], window: Duration) -> Steady {
    let w0 = mono_us();
    sleep(window).await;
    let w1 = mono_us();
    let w = lock(world);
    let mut out = Steady {
        changes: w.changes.iter().filter(|&&t| t >= w0 && t <= w1).count(),
        ..Steady::default()
    };
    let mut sums = [0.0; 8];
    let names = Calls::default().fields().map(|(name, _)| name);
    for &p in live {
        let ticks = &w.procs[p].ticks;
        let at = |t: u64| ticks.iter().rev().find(|l| l.t <= t);
        let (Some(a), Some(b)) = (at(w0), at(w1)) else {
            continue;
        };
        let dt = b.t.saturating_sub(a.t) as f64;
        if dt <= 0.0 {
            continue;
        }
        let d = b.calls.since(&a.calls);
        for (sum, (_, v)) in sums.iter_mut().zip(d.fields()) {
            *sum += v as f64 * 3.6e9 / dt;
        }
        out.reads += d.reads() as f64 * 3.6e9 / dt;
        out.writes += d.writes() as f64 * 3.6e9 / dt;
        out.cpu_pct += b.cpu_us.saturating_sub(a.cpu_us) as f64 / dt * 100.0;
        out.rss_kib += b.rss_kib as f64;
        out.window_s += dt / 1e6;
        out.instances += 1;
    }
    let k = out.instances.max(1) as f64;
    out.per_hour = names.into_iter().zip(sums.map(|v| v / k)).collect();
    out.reads /= k;
    out.writes /= k;
    out.cpu_pct /= k;
    out.rss_kib /= k;
    out.window_s /= k;
    out
}

/// Runs everything on `kind`.
pub(crate) async fn run(kind: BackendKind, s: &FleetSettings) -> FleetReport {
    let logs = s.dir.join(kind.name());
    let mut report = FleetReport {
        kind,
        error: None,
        take: None,
        sharded: None,
        join: None,
        kill: None,
        missed: 0,
        lost: 0,
        single: None,
        single_lost: 0,
        violations: Vec::new(),
        logs: logs.clone(),
    };
    if let Err(e) = run_inner(kind, s, &logs, &mut report).await {
        report.error = Some(e);
    }
    report
}

fn progress(kind: BackendKind, what: &str) {
    #[allow(clippy::print_stderr, reason = "progress of a long benchmark")]
    {
        eprintln!("[shard_bench] {}: {what}", kind.name());
    }
}

async fn run_inner(
    kind: BackendKind,
    s: &FleetSettings,
    logs: &Path,
    report: &mut FleetReport,
) -> Result<(), String> {
    std::fs::create_dir_all(logs).map_err(|e| format!("creating {logs:?}: {e}"))?;
    let (url, place) = prepare(kind, logs).await?;
    let n = s.shards;
    let member = |id: String, mode: Mode, shards: u32, count: u32| MemberArgs {
        kind,
        url: url.clone(),
        place: place.clone(),
        id,
        mode,
        shards,
        count,
        ttl: s.ttl,
    };

    // The sharded scheme.
    let world = Arc::new(Mutex::new(World::default()));
    let mut members = Vec::new();
    let t0 = mono_us();
    for i in 0..s.procs {
        let args = member(format!("m{i}"), Mode::Sharded, n, 0);
        members.push(spawn(s, &world, &args, logs)?);
    }
    let mut live: Vec<usize> = (0..s.procs).collect();
    let result = async {
        progress(kind, &format!("{} processes take {n} shards", s.procs));
        report.take = Some(
            converge(
                &world,
                &live,
                n,
                t0,
                Duration::from_secs(300),
                "initial take",
            )
            .await?,
        );
        sleep(s.settle).await;
        progress(kind, "steady window (sharded)");
        report.sharded = Some(steady(&world, &live, s.window).await);
        progress(kind, "one more process joins");
        let tj = mono_us();
        let args = member(format!("m{}", s.procs), Mode::Sharded, n, 0);
        members.push(spawn(s, &world, &args, logs)?);
        live.push(s.procs);
        report.join = Some(
            converge(
                &world,
                &live,
                n,
                tj,
                Duration::from_secs(180),
                "after the join",
            )
            .await?,
        );
        sleep(Duration::from_secs(2)).await;
        progress(kind, "SIGKILL one process");
        let victim = live.remove(0);
        let tk = mono_us();
        members[victim].signal(Signal::SIGKILL);
        lock(&world).procs[victim].killed = Some(tk);
        report.kill = Some(
            converge(
                &world,
                &live,
                n,
                tk,
                Duration::from_secs(180),
                "after the kill",
            )
            .await?,
        );
        Ok::<(), String>(())
    }
    .await;
    for &p in &live {
        lock(&world).procs[p].stopping = true;
    }
    for m in &members {
        m.signal(Signal::SIGTERM);
    }
    for m in &mut members {
        m.stop(Duration::from_secs(40)).await;
    }
    {
        let w = lock(&world);
        report.violations = w.violations();
        for (p, proc) in w.procs.iter().enumerate() {
            if let Some(tick) = proc.ticks.last() {
                report.missed += tick.missed_total;
                report.lost += tick.lost;
            }
            if proc.eof && proc.killed.is_none() && !proc.stopping && live.contains(&p) {
                report
                    .violations
                    .push(format!("member {} exited by itself", proc.id));
            }
            for junk in proc.junk.iter().take(3) {
                report
                    .violations
                    .push(format!("member {} printed {junk:?}", proc.id));
            }
        }
    }
    result?;
    drop(members);
    if s.single_window.is_zero() {
        return Ok(()); // single_window=0: no comparison asked for
    }

    // One lease per shard: the same number of processes, a range of keys each.
    progress(kind, "one lease per shard");
    let world = Arc::new(Mutex::new(World::default()));
    let mut members = Vec::new();
    let procs = u32::try_from(s.procs).unwrap_or(1).max(1);
    for i in 0..procs {
        let (first, next) = (n * i / procs, n * (i + 1) / procs);
        let args = member(format!("k{i}"), Mode::Single, first, next - first);
        members.push(spawn(s, &world, &args, logs)?);
    }
    let live: Vec<usize> = (0..s.procs).collect();
    let result = async {
        let until = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            {
                let w = lock(&world);
                let led: usize = live.iter().map(|&p| w.procs[p].led.len()).sum();
                if led == n as usize {
                    break;
                }
                if tokio::time::Instant::now() >= until {
                    return Err(format!(
                        "one lease per shard: {led} of {n} keys led after 120 s"
                    ));
                }
            }
            sleep(Duration::from_millis(20)).await;
        }
        sleep(s.settle).await;
        progress(kind, "steady window (one lease per shard)");
        report.single = Some(steady(&world, &live, s.single_window).await);
        Ok(())
    }
    .await;
    for m in &members {
        m.signal(Signal::SIGTERM);
    }
    for m in &mut members {
        m.stop(Duration::from_secs(40)).await;
    }
    {
        let w = lock(&world);
        for proc in &w.procs {
            if let Some(tick) = proc.ticks.last() {
                report.single_lost += tick.lost;
            }
        }
    }
    result
}
