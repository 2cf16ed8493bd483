//! The benchmark of sharded leadership: `shard_bench [parts=scale,fleet,members]
//! [backends=azure,dynamo,gcs,etcd,zookeeper] [shards=1000] [procs=4] [scale_shards=10000]
//! [scale_settle=20] [scale_window=60] [ttl=15] [settle=10] [window=60] [single_window=30]
//! [sizes=4,16,64,128] [member_shards=1024] [members_window=60] [old=PATH] [old_label=TEXT]
//! [out=FILE] [dir=DIR]`. Usually run by `scripts/shard_bench`, which builds it with
//! `--release`, starts the emulators and writes `results/sharding.md`.
//!
//! Not a test: nothing asserts on a figure, and neither `cargo test` nor CI runs it.
//!
//! - **scale** (in a process of its own, [`scale`]): one sharded elector alone on the in-memory
//!   store leads `scale_shards` shards with the default timing; the time to take them all,
//!   then, after `scale_settle` s, over `scale_window` s: CPU time as % of one core, resident
//!   set, terms that ended at their deadline (missed deadlines), membership terms lost.
//! - **fleet** (per backend, one after the other, [`fleet`]): `procs` member processes share
//!   `shards` shards: time to take them all, store calls per hour of one instance while
//!   nothing changes hands, then the time to converge after one more process joins and after
//!   one is SIGKILLed; then `procs` processes with one single-key elector per shard (a range
//!   of keys each) and their store calls per hour, counted the same way ([`counted`];
//!   `single_window=0` skips them).
//! - **members** (per fleet size in `sizes`, [`members_part`]): in one process per size and
//!   scheme ([`members`]), that many instances on one shared in-memory store share
//!   `member_shards` shards: each instance's store calls per hour (the coordinator's apart),
//!   CPU and memory per instance, then the time to converge after a join, the crash of a
//!   member and the crash of the coordinator; the same with one lease per shard (calls only);
//!   and, if `old` names a `shard_bench` built from the first design (every member reads
//!   every other; `old_label` names its commit), the same measurement with it, side by side.
//!   Then the store bill of a 100-instance fleet at list prices.
//!
//! The tables go to stdout (markdown) and to `out` if given, progress to stderr. Exits 2 on a
//! bad argument, 1 if a part could not be completed or the logs show a rule broken (the
//! tables still show what was measured).
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command-line program reports on its streams"
)]

mod counted;
mod fleet;
mod member;
mod members;
mod members_part;
mod scale;
mod usage;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Duration;

use integration_tests::chaos::BackendKind;

use fleet::{FleetReport, FleetSettings, Steady};
use members_part::MembersSettings;
use scale::Scale;

/// What the command line asked for.
struct Settings {
    run_scale: bool,
    run_fleet: bool,
    run_members: bool,
    backends: Vec<BackendKind>,
    scale_shards: u32,
    scale_settle: Duration,
    scale_window: Duration,
    fleet: FleetSettings,
    members: MembersSettings,
    out: Option<PathBuf>,
}

fn seconds(name: &str, value: &str) -> Result<Duration, String> {
    match value.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(Duration::from_secs_f64(v)),
        _ => Err(format!(
            "{name}={value:?} is not a positive number of seconds"
        )),
    }
}

fn whole(name: &str, value: &str) -> Result<u32, String> {
    match value.parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{name}={value:?} is not a positive whole number")),
    }
}

fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Settings, String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
    let mut s = Settings {
        run_scale: true,
        run_fleet: true,
        run_members: true,
        backends: vec![
            BackendKind::Azure,
            BackendKind::Dynamo,
            BackendKind::Gcs,
            BackendKind::Etcd,
            BackendKind::ZooKeeper,
        ],
        scale_shards: 10_000,
        scale_settle: Duration::from_secs(20),
        scale_window: Duration::from_secs(60),
        fleet: FleetSettings {
            shards: 1000,
            procs: 4,
            ttl: Duration::from_secs(15),
            settle: Duration::from_secs(10),
            window: Duration::from_secs(60),
            single_window: Duration::from_secs(30),
            dir: std::env::temp_dir().join(integration_tests::unique_name("shard-bench")),
            exe,
        },
        members: MembersSettings {
            sizes: vec![4, 16, 64, 128],
            shards: 1024,
            ttl: Duration::from_secs(15),
            settle: Duration::from_secs(10),
            window: Duration::from_secs(60),
            old: None,
            old_label: "the first design".to_owned(),
        },
        out: None,
    };
    for arg in args {
        let Some((name, value)) = arg.split_once('=') else {
            return Err(format!("argument {arg:?} is not name=value"));
        };
        match name {
            "parts" => {
                s.run_scale = false;
                s.run_fleet = false;
                s.run_members = false;
                for part in value.split(',') {
                    match part {
                        "scale" => s.run_scale = true,
                        "fleet" => s.run_fleet = true,
                        "members" => s.run_members = true,
                        _ => {
                            return Err(format!("unknown part {part:?} (scale, fleet, members)"));
                        }
                    }
                }
            }
            "backends" => {
                s.backends = value
                    .split(',')
                    .map(|b| BackendKind::parse(b).ok_or_else(|| format!("unknown backend {b:?}")))
                    .collect::<Result<_, _>>()?;
            }
            "shards" => s.fleet.shards = whole(name, value)?,
            "procs" => s.fleet.procs = whole(name, value)? as usize,
            "scale_shards" => s.scale_shards = whole(name, value)?,
            "scale_settle" => s.scale_settle = seconds(name, value)?,
            "scale_window" => s.scale_window = seconds(name, value)?,
            "ttl" => {
                s.fleet.ttl = seconds(name, value)?;
                s.members.ttl = s.fleet.ttl;
            }
            "settle" => {
                s.fleet.settle = seconds(name, value)?;
                s.members.settle = s.fleet.settle;
            }
            "window" => s.fleet.window = seconds(name, value)?,
            "single_window" if value == "0" => s.fleet.single_window = Duration::ZERO,
            "single_window" => s.fleet.single_window = seconds(name, value)?,
            "out" => s.out = Some(PathBuf::from(value)),
            "dir" => s.fleet.dir = PathBuf::from(value),
            _ if members_arg(&mut s.members, name, value)? => {}
            _ => return Err(format!("unknown argument {name:?}")),
        }
    }
    Ok(s)
}

/// Reads an argument of the members part; `false` if `name` is none of them.
fn members_arg(m: &mut MembersSettings, name: &str, value: &str) -> Result<bool, String> {
    match name {
        "sizes" => {
            m.sizes = value
                .split(',')
                .map(|v| whole(name, v).map(|n| n as usize))
                .collect::<Result<_, _>>()?;
            if m.sizes.contains(&1) {
                return Err("sizes: a fleet has at least 2 instances".to_owned());
            }
        }
        "member_shards" => m.shards = whole(name, value)?,
        "members_window" => m.window = seconds(name, value)?,
        "old" => m.old = Some(PathBuf::from(value)),
        "old_label" => m.old_label = value.to_owned(),
        _ => return Ok(false),
    }
    Ok(true)
}

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LEADER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .try_init();
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    init_tracing();
    let mut args = std::env::args().skip(1).peekable();
    let sub = args.peek().cloned();
    match sub.as_deref() {
        Some("member") => {
            args.next();
            member_process(args).await
        }
        Some("members") => {
            args.next();
            match members::MembersArgs::parse(args) {
                Ok(a) => {
                    let result = members::run(&a).await;
                    println!("{}", serde_json::to_string(&result).unwrap_or_default());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("shard_bench members: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Some("scale") => {
            args.next();
            match parse_args(args) {
                Ok(s) => {
                    let result = scale::run(s.scale_shards, s.scale_settle, s.scale_window).await;
                    println!("{}", serde_json::to_string(&result).unwrap_or_default());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("shard_bench scale: {e}");
                    ExitCode::from(2)
                }
            }
        }
        _ => match parse_args(args) {
            Ok(s) => run_parts(&s).await,
            Err(e) => {
                eprintln!("shard_bench: {e}");
                ExitCode::from(2)
            }
        },
    }
}

/// `shard_bench member ...`: one process of a fleet.
async fn member_process(args: impl IntoIterator<Item = String>) -> ExitCode {
    let parsed = match member::MemberArgs::parse(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("shard_bench member: {e}");
            return ExitCode::from(2);
        }
    };
    match member::run(parsed).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            member::emit(&member::Line {
                ev: "error".to_owned(),
                t: integration_tests::chaos::mono_us(),
                msg: e.clone(),
                ..member::Line::default()
            });
            eprintln!("shard_bench member: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the parts asked for and writes the tables.
async fn run_parts(s: &Settings) -> ExitCode {
    if s.run_fleet
        && let Err(e) = std::fs::create_dir_all(&s.fleet.dir)
    {
        eprintln!("shard_bench: creating {:?}: {e}", s.fleet.dir);
        return ExitCode::FAILURE;
    }
    let mut failed = false;
    let scale = if s.run_scale {
        eprintln!(
            "[shard_bench] scale: {} shards on the memory store ({} s to settle, {} s window)",
            s.scale_shards,
            s.scale_settle.as_secs_f64(),
            s.scale_window.as_secs_f64()
        );
        let result = run_scale(s);
        failed |= result.as_ref().map_or(true, |r| !r.error.is_empty());
        Some(result)
    } else {
        None
    };
    let mut fleets = Vec::new();
    if s.run_fleet {
        for &kind in &s.backends {
            let report = fleet::run(kind, &s.fleet).await;
            if let Some(e) = &report.error {
                eprintln!("[shard_bench] {}: {e}", kind.name());
            }
            for v in &report.violations {
                eprintln!("[shard_bench] {}: VIOLATION {v}", kind.name());
            }
            failed |= report.error.is_some() || !report.violations.is_empty();
            fleets.push(report);
        }
    }
    let members = if s.run_members {
        let results = members_part::run(&s.members, &s.fleet.exe);
        failed |= members_part::failed(&results);
        Some(results)
    } else {
        None
    };
    let mut text = render(s, scale.as_ref(), &fleets);
    if s.run_scale || s.run_fleet {
        text.push_str(HOW_MEASURED);
        text.push('\n');
    }
    if let Some(results) = &members {
        text.push_str(&members_part::render(&s.members, results));
    }
    print!("{text}");
    if let Some(out) = &s.out
        && let Err(e) = std::fs::write(out, &text)
    {
        eprintln!("shard_bench: writing {out:?}: {e}");
        failed = true;
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Runs `shard_bench scale` in a process of its own (so that its memory is its own).
fn run_scale(s: &Settings) -> Result<Scale, String> {
    let args = [
        "scale".to_owned(),
        format!("scale_shards={}", s.scale_shards),
        format!("scale_settle={}", s.scale_settle.as_secs_f64()),
        format!("scale_window={}", s.scale_window.as_secs_f64()),
    ];
    run_json(&s.fleet.exe, &args)
}

/// Runs `exe args...` (a part in a process of its own) and reads the JSON line it prints.
fn run_json<T: serde::de::DeserializeOwned>(exe: &Path, args: &[String]) -> Result<T, String> {
    let what = args.first().map_or("", String::as_str);
    let output = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("starting {} {what}: {e}", exe.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(text.trim()).map_err(|e| {
        format!(
            "the {what} run ({}) printed no result ({e}): {text:?}",
            output.status
        )
    })
}

/// The note under the tables.
const HOW_MEASURED: &str = "
## How measured

- Release builds; every process runs a tokio runtime with 2 worker threads; the default \
timing for the ttl (`Timing::from_ttl`). Every term (shard term or single-key term) is taken \
by a task that holds it until `cancelled()` completes, then drops it, as well-behaved work does.
- CPU is `getrusage(RUSAGE_SELF)` (user + system) over the window divided by its wall time; \
memory is `VmRSS` (sampled every second) and `VmHWM` from `/proc/self/status`.
- A missed deadline is a term whose `cancelled()` completed at or after its deadline while \
the instance was not shutting down (a release ends a term before its deadline); memberships \
lost count `Assignment::member` going from true to false.
- Store calls are counted by a wrapper around the store, inside each process, per trait \
method (`read`, `read_if_changed`, `read_for_term`, `write` by kind, `get_fenced`, \
`put_fenced_if`): the same count for every backend and both schemes. A call is not always one \
network request (an Azure write may be a blob write and a lease operation; a call retried \
inside a backend counts once): `results/bench.md` counts HTTP requests for one lease.
- Fleet runs use one member process per instance (`shard_bench member`), spawned, \
SIGKILLed and SIGTERMed for real; each prints its terms (`start` / `end`, with token), its \
membership deadline and a tick per second with its counts, stamped with `CLOCK_MONOTONIC`. \
Converge times are from the spawn or the signal to the first moment the driver saw every \
shard led by one live process with counts within one (the driver checks every 20 ms). \
The log check reads every shard's terms after the run: no two processes' terms of a shard \
overlap (a term's end is logged before it is dropped, so before the release that lets \
another process take it; a killed process's terms end at its last logged deadline), and \
tokens increase in the order the terms began.
- One lease per shard: each process holds a range of single-key electors, started one \
after the other over one renew period so that their renews spread out. It measures only \
holders (no follower polls another process's keys, which a real KCL or Event Hubs worker \
does to find expired leases): the cheapest such a scheme can be.
";

fn mib(kib: f64) -> String {
    format!("{:.1}", kib / 1024.0)
}

fn opt_secs(c: Option<f64>) -> String {
    c.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
}

fn per_hour(v: f64) -> String {
    let v = v.round() as u64;
    // Thousands separated by commas, for the eye.
    let digits = v.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn render(s: &Settings, scale: Option<&Result<Scale, String>>, fleets: &[FleetReport]) -> String {
    let mut o = String::new();
    if let Some(scale) = scale {
        render_scale(&mut o, s, scale);
    }
    if !fleets.is_empty() {
        render_fleet(&mut o, &s.fleet, fleets);
        render_steady(&mut o, &s.fleet, fleets);
    }
    o
}

/// The scale part's table.
fn render_scale(o: &mut String, s: &Settings, scale: &Result<Scale, String>) {
    let _ = writeln!(
        o,
        "## Scale: {} shards, one process, memory store\n",
        s.scale_shards
    );
    match scale {
        Err(e) => {
            let _ = writeln!(o, "Not measured: {e}\n");
        }
        Ok(r) => {
            if !r.error.is_empty() {
                let _ = writeln!(o, "Incomplete: {}\n", r.error);
            }
            let _ = writeln!(
                o,
                "Timing: the defaults (`{}`). Every term is taken by its own task and held \
                 until it ends. Window: {:.1} s, after {:.0} s to settle.\n",
                r.timing, r.window_s, r.settle_s
            );
            let _ = writeln!(o, "| figure | measured | target |\n|---|---|---|");
            let rows = [
                (
                    "time to take all shards at start".to_owned(),
                    format!(
                        "{:.2} s ({:.2} s of CPU)",
                        r.take_ms as f64 / 1000.0,
                        r.take_cpu_ms as f64 / 1000.0
                    ),
                    "-".to_owned(),
                ),
                (
                    "CPU, steady".to_owned(),
                    format!("{:.2} % of one core", r.cpu_pct),
                    "< 2 %".to_owned(),
                ),
                (
                    "RSS, steady (start / max / end of the window)".to_owned(),
                    format!(
                        "{} / {} / {} MiB",
                        mib(r.rss_start_kib as f64),
                        mib(r.rss_max_kib as f64),
                        mib(r.rss_end_kib as f64)
                    ),
                    "< 64 MiB".to_owned(),
                ),
                (
                    "RSS, peak since the start (VmHWM)".to_owned(),
                    format!("{} MiB", mib(r.peak_kib as f64)),
                    "< 64 MiB".to_owned(),
                ),
                (
                    "missed deadlines (terms ended at their deadline)".to_owned(),
                    r.missed.to_string(),
                    "0".to_owned(),
                ),
                (
                    "terms ended otherwise, membership terms lost".to_owned(),
                    format!("{}, {}", r.ended, r.lost_member),
                    "0, 0".to_owned(),
                ),
                (
                    "fewest shards led after the take".to_owned(),
                    r.led_min.to_string(),
                    r.shards.to_string(),
                ),
                (
                    "store calls in the window, per hour".to_owned(),
                    calls_summary(&r.calls, r.window_s),
                    "-".to_owned(),
                ),
                (
                    "shutdown (release every shard, then the membership)".to_owned(),
                    format!(
                        "{:.2} s, {} shard-record writes",
                        r.shutdown_ms as f64 / 1000.0,
                        r.shutdown_calls.put_fenced_if
                    ),
                    "-".to_owned(),
                ),
            ];
            for (what, got, target) in rows {
                let _ = writeln!(o, "| {what} | {got} | {target} |");
            }
            o.push('\n');
        }
    }
}

/// The fleet part's convergence table.
fn render_fleet(o: &mut String, f: &FleetSettings, fleets: &[FleetReport]) {
    let _ = writeln!(
        o,
        "## {} shards over {} processes, per backend\n",
        f.shards, f.procs
    );
    let _ = writeln!(
        o,
        "Timing: the defaults for a ttl of {} s. Converge: every shard led by a live process, \
         none by two, counts within one (after the join: {} processes, {}-{} each; after the \
         kill: {} processes). Moved: shard terms begun meanwhile.\n",
        f.ttl.as_secs_f64(),
        f.procs + 1,
        f.shards as usize / (f.procs + 1),
        (f.shards as usize).div_ceil(f.procs + 1),
        f.procs
    );
    let _ = writeln!(
        o,
        "| backend | take all at start, s | process {} joins: converge, s | moved | SIGKILL of \
         one: converge, s | moved | missed deadlines | memberships lost | log check |\n\
         |---|---|---|---|---|---|---|---|---|",
        f.procs + 1
    );
    for r in fleets {
        let conv = |c: &Option<fleet::Converged>| {
            (
                c.as_ref().map_or_else(
                    || "-".to_owned(),
                    |c| {
                        let lo = c.counts.iter().min().copied().unwrap_or(0);
                        let hi = c.counts.iter().max().copied().unwrap_or(0);
                        format!("{:.2} ({lo}-{hi} each)", c.secs)
                    },
                ),
                c.as_ref()
                    .map_or_else(|| "-".to_owned(), |c| c.moved.to_string()),
            )
        };
        let (join_s, join_moved) = conv(&r.join);
        let (kill_s, kill_moved) = conv(&r.kill);
        let check = if r.violations.is_empty() {
            "ok".to_owned()
        } else {
            format!(
                "**{} violations** (first: {})",
                r.violations.len(),
                r.violations[0]
            )
        };
        let _ = writeln!(
            o,
            "| {} | {} | {join_s} | {join_moved} | {kill_s} | {kill_moved} | {} | {} | {check} |",
            r.kind.name(),
            opt_secs(r.take.as_ref().map(|c| c.secs)),
            r.missed,
            r.lost
        );
    }
    o.push('\n');
    for r in fleets.iter().filter(|r| r.error.is_some()) {
        let _ = writeln!(
            o,
            "- {}: stopped early: {} (logs: `{}`)",
            r.kind.name(),
            r.error.as_deref().unwrap_or_default(),
            r.logs.display()
        );
    }
}

/// The fleet part's tables of store calls while nothing changes hands.
fn render_steady(o: &mut String, f: &FleetSettings, fleets: &[FleetReport]) {
    let _ = writeln!(
        o,
        "\n## Store calls per hour of one instance while nothing changes hands\n\n\
         Sharded: {} processes, one sharded elector each ({} s window). One lease per shard: \
         {} processes, each holding {} single-key electors ({} s window). Calls of the store \
         traits counted inside each process; mean of the processes.\n",
        f.procs,
        f.window.as_secs_f64(),
        f.procs,
        f.shards as usize / f.procs,
        f.single_window.as_secs_f64()
    );
    let names = counted::Calls::default().fields().map(|(n, _)| n);
    let _ = write!(o, "| backend | scheme |");
    for n in names {
        let _ = write!(o, " {n} |");
    }
    let _ = writeln!(
        o,
        " reads | writes | all | changes in window | CPU % of a core | RSS MiB |"
    );
    let _ = writeln!(
        o,
        "|---|---|{}---|---|---|---|---|---|",
        "---|".repeat(names.len())
    );
    for r in fleets {
        for (scheme, steady) in [("sharded", &r.sharded), ("lease per shard", &r.single)] {
            let Some(st) = steady else {
                let _ = writeln!(o, "| {} | {scheme} | not measured |", r.kind.name());
                continue;
            };
            let _ = writeln!(o, "{}", steady_row(r.kind.name(), scheme, st));
        }
    }
    o.push('\n');
    let _ = writeln!(
        o,
        "| backend | writes per hour, sharded | writes per hour, lease per shard | ratio | all \
         calls per hour, sharded | all calls per hour, lease per shard | ratio | terms lost \
         (lease per shard) |\n|---|---|---|---|---|---|---|---|"
    );
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if a > 0.0 => format!("{:.1} x", b / a),
        _ => "-".to_owned(),
    };
    let shown = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), per_hour);
    for r in fleets {
        let writes = (
            r.sharded.as_ref().map(|s| s.writes),
            r.single.as_ref().map(|s| s.writes),
        );
        let all = (
            r.sharded.as_ref().map(|s| s.reads + s.writes),
            r.single.as_ref().map(|s| s.reads + s.writes),
        );
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            r.kind.name(),
            shown(writes.0),
            shown(writes.1),
            ratio(writes.0, writes.1),
            shown(all.0),
            shown(all.1),
            ratio(all.0, all.1),
            r.single_lost,
        );
    }
}

fn steady_row(backend: &str, scheme: &str, st: &Steady) -> String {
    let mut row = format!("| {backend} | {scheme} |");
    for (_, v) in &st.per_hour {
        let _ = write!(row, " {} |", per_hour(*v));
    }
    let _ = write!(
        row,
        " {} | {} | {} | {} | {:.2} | {} |",
        per_hour(st.reads),
        per_hour(st.writes),
        per_hour(st.reads + st.writes),
        st.changes,
        st.cpu_pct,
        mib(st.rss_kib)
    );
    row
}

fn calls_summary(c: &counted::Calls, window_s: f64) -> String {
    let scale = if window_s > 0.0 {
        3600.0 / window_s
    } else {
        0.0
    };
    let parts: Vec<String> = c
        .fields()
        .iter()
        .filter(|(_, v)| *v > 0)
        .map(|(n, v)| format!("{n} {}", per_hour(*v as f64 * scale)))
        .collect();
    if parts.is_empty() {
        "none".to_owned()
    } else {
        parts.join(", ")
    }
}
