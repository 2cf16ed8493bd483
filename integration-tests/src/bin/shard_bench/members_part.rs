//! The members part: for each fleet size, one `shard_bench members` process per scheme
//! ([`members`](crate::members)): the sharded elector of this build, the same measurement built
//! from the first design's code if `old=` names that binary, and one lease per shard. Then
//! the tables: calls per instance, convergence, CPU and memory; calls by method; and the store
//! bill of a 100-instance fleet at list prices.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::counted::Calls;
use crate::members::{MembersArgs, MembersRun, PerHour, Scheme};
use crate::per_hour;

/// What the members part is told.
#[derive(Clone, Debug)]
pub(crate) struct MembersSettings {
    /// Fleet sizes.
    pub(crate) sizes: Vec<usize>,
    /// Shards.
    pub(crate) shards: u32,
    /// Lease duration.
    pub(crate) ttl: Duration,
    /// Wait after the take before the window.
    pub(crate) settle: Duration,
    /// The window.
    pub(crate) window: Duration,
    /// A `shard_bench` built from the first design (every member reads every other).
    pub(crate) old: Option<PathBuf>,
    /// What to call that build in the tables (its commit).
    pub(crate) old_label: String,
}

/// Every scheme at one size.
#[derive(Debug)]
pub(crate) struct SizeResult {
    n: usize,
    new: Result<MembersRun, String>,
    old: Option<Result<MembersRun, String>>,
    single: Result<MembersRun, String>,
}

impl SizeResult {
    fn runs(&self) -> impl Iterator<Item = &Result<MembersRun, String>> {
        [Some(&self.new), self.old.as_ref(), Some(&self.single)]
            .into_iter()
            .flatten()
    }
}

/// Runs every size and scheme, one process each, one after the other.
pub(crate) fn run(s: &MembersSettings, exe: &Path) -> Vec<SizeResult> {
    let mut out = Vec::new();
    for &n in &s.sizes {
        let args = |scheme| MembersArgs {
            scheme,
            n,
            shards: s.shards,
            ttl: s.ttl,
            settle: s.settle,
            window: s.window,
        };
        let one = |exe: &Path, scheme, what: &str| {
            eprintln!("[shard_bench] members: {n} instances, {what}");
            let mut argv = vec!["members".to_owned()];
            argv.extend(args(scheme).to_args());
            let result = crate::run_json::<MembersRun>(exe, &argv);
            match &result {
                Ok(r) if !r.error.is_empty() => {
                    eprintln!("[shard_bench] members: {n} instances, {what}: {}", r.error);
                }
                Err(e) => eprintln!("[shard_bench] members: {n} instances, {what}: {e}"),
                Ok(_) => {}
            }
            result
        };
        let new = one(exe, Scheme::Sharded, "sharded (this build)");
        let old = s.old.as_ref().map(|old| {
            one(
                old,
                Scheme::Sharded,
                &format!("sharded (first design, {})", s.old_label),
            )
        });
        let single = one(exe, Scheme::Single, "one lease per shard");
        out.push(SizeResult {
            n,
            new,
            old,
            single,
        });
    }
    out
}

/// Whether a run failed, or a crashed instance called the store after its crash.
pub(crate) fn failed(results: &[SizeResult]) -> bool {
    results.iter().flat_map(SizeResult::runs).any(|r| match r {
        Err(_) => true,
        Ok(r) => !r.error.is_empty() || r.calls_after_crash > 0,
    })
}

/// The schemes of one size, each with its label.
fn labelled<'a>(
    r: &'a SizeResult,
    s: &MembersSettings,
) -> Vec<(String, &'a Result<MembersRun, String>)> {
    let mut out = vec![("coordinator (this build)".to_owned(), &r.new)];
    if let Some(old) = &r.old {
        out.push((
            format!("every member reads every other ({})", s.old_label),
            old,
        ));
    }
    out.push(("one lease per shard".to_owned(), &r.single));
    out
}

fn secs(c: Option<&crate::members::Conv>) -> (String, String) {
    c.map_or_else(
        || ("-".to_owned(), "-".to_owned()),
        |c| (format!("{:.2}", c.secs), c.moved.to_string()),
    )
}

fn spread(mean: f64, lo: f64, hi: f64) -> String {
    format!("{} ({}-{})", per_hour(mean), per_hour(lo), per_hour(hi))
}

/// One row of the main table.
fn main_row(n: usize, label: &str, r: &MembersRun) -> String {
    let coord =
        |f: fn(&PerHour) -> f64| r.coord.as_ref().map_or("-".to_owned(), |c| per_hour(f(c)));
    let m = &r.members;
    let per_poll = if r.poll_s > 0.0 {
        format!("{:.2}", m.mean.reads / (3600.0 / r.poll_s))
    } else {
        "-".to_owned()
    };
    let (join, join_moved) = secs(r.join.as_ref());
    let (crash, crash_moved) = secs(r.crash_member.as_ref());
    let (coord_crash, coord_moved) = secs(r.crash_coord.as_ref());
    let k = r.n.max(1) as f64;
    format!(
        "| {n} | {label} | {} | {} | {} | {per_poll} | {} | {} | {} | {} | {join} | {join_moved} \
         | {crash} | {crash_moved} | {coord_crash} | {coord_moved} | {:.3} | {:.0} |",
        coord(|c| c.reads),
        spread(m.mean.reads, m.reads_min, m.reads_max),
        per_hour(r.fleet.mean.reads),
        coord(|c| c.writes),
        spread(m.mean.writes, m.writes_min, m.writes_max),
        per_hour(r.fleet.mean.writes),
        r.take
            .as_ref()
            .map_or("-".to_owned(), |c| format!("{:.2}", c.secs)),
        r.cpu_pct / k,
        r.rss_end_kib.saturating_sub(r.rss_before_kib) as f64 / k,
    )
}

/// The tables and the notes of the members part.
pub(crate) fn render(s: &MembersSettings, results: &[SizeResult]) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "## Members: {} shards, n instances in one process, memory store\n\n\
         Timing: the defaults for a ttl of {} s, in real time. Per instance while nothing \
         changes hands ({} s window, after {} s to settle): store calls per hour of the \
         coordinator, of the other members (mean, min-max) and of the whole fleet (mean); then \
         the time to converge (every shard led by one live instance, counts within one) after \
         one more instance joins, after a member that is not the coordinator crashes, and \
         after the coordinator crashes (and a live instance holds the coordinator lease); \
         moved: shard terms begun meanwhile. CPU and RSS: the process's, divided by n. The first \
         design has no coordinator: its members' figures are every instance's.\n",
        s.shards,
        s.ttl.as_secs_f64(),
        s.window.as_secs_f64(),
        s.settle.as_secs_f64(),
    );
    let _ = writeln!(
        o,
        "| n | scheme | reads/h, coordinator | reads/h, other members (min-max) | reads/h, \
         fleet mean | member reads per poll | writes/h, coordinator | writes/h, other members \
         (min-max) | writes/h, fleet mean | take all, s | join: converge, s | moved | crash \
         of a member: converge, s | moved | crash of the coordinator: converge, s | moved | \
         CPU % of a core per instance | RSS growth per instance, KiB |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    let mut problems: Vec<String> = Vec::new();
    for r in results {
        for (label, run) in labelled(r, s) {
            match run {
                Err(e) => {
                    let _ = writeln!(o, "| {} | {label} | not measured: {e} |", r.n);
                }
                Ok(run) => {
                    let _ = writeln!(o, "{}", main_row(r.n, &label, run));
                    if !run.error.is_empty() {
                        problems.push(format!("{} instances, {label}: {}", r.n, run.error));
                    }
                    for note in &run.notes {
                        problems.push(format!("{} instances, {label}: {note}", r.n));
                    }
                    if run.changes > 0 {
                        problems.push(format!(
                            "{} instances, {label}: {} shard terms began or ended in the window",
                            r.n, run.changes
                        ));
                    }
                }
            }
        }
    }
    o.push('\n');
    let crashed: Vec<&MembersRun> = results
        .iter()
        .flat_map(SizeResult::runs)
        .filter_map(|r| r.as_ref().ok())
        .filter(|r| r.crash_member.is_some())
        .collect();
    if !crashed.is_empty() {
        let calls: u64 = crashed.iter().map(|r| r.calls_after_crash).sum();
        problems.push(format!(
            "store calls made by a crashed instance after its crash, over the {} runs with \
             crashes: {calls} (must be 0)",
            crashed.len()
        ));
    }
    for p in &problems {
        let _ = writeln!(o, "- {p}");
    }
    o.push('\n');
    by_method(&mut o, s, results);
    cost(&mut o, s, results);
    o.push_str(HOW_MEASURED);
    o
}

fn by_method(o: &mut String, s: &MembersSettings, results: &[SizeResult]) {
    let names = Calls::default().fields().map(|(n, _)| n);
    let _ = writeln!(
        o,
        "### Members: store calls per hour of one instance, by method\n"
    );
    let _ = write!(o, "| n | scheme | who |");
    for n in names {
        let _ = write!(o, " {n} |");
    }
    let _ = writeln!(
        o,
        " reads | writes |\n|---|---|---|{}---|---|",
        "---|".repeat(names.len())
    );
    for r in results {
        for (label, run) in labelled(r, s) {
            let Ok(run) = run else { continue };
            let mut rows: Vec<(&str, &PerHour)> = Vec::new();
            if let Some(c) = &run.coord {
                rows.push(("coordinator", c));
            }
            if run.coord.is_some() {
                rows.push(("other members, mean", &run.members.mean));
            }
            rows.push(("fleet, mean", &run.fleet.mean));
            for (who, rates) in rows {
                let _ = write!(o, "| {} | {label} | {who} |", r.n);
                for v in rates.by_method {
                    let _ = write!(o, " {} |", per_hour(v));
                }
                let _ = writeln!(
                    o,
                    " {} | {} |",
                    per_hour(rates.reads),
                    per_hour(rates.writes)
                );
            }
        }
    }
    o.push('\n');
}

/// USD per call, by method in the order of [`Calls::fields`] (`read`, `read_if_changed`,
/// `read_for_term`, `get_fenced`, `write` acquire / renew / release, `put_fenced_if`), at the
/// list prices of `results/bench.md` (looked up on 2026-12-01).
const PRICES: [(&str, [f64; 8]); 3] = [
    // On-demand, US East: $0.125 per million read units, $0.625 per million write units. The
    // cheap read (`read_if_changed`) is eventually consistent (half a unit); `read`,
    // `read_for_term` and `get_fenced` are strongly consistent (one); a lease write is one
    // write unit; `put_fenced_if` a transaction of two items (the object and the membership
    // check), two units each.
    (
        "DynamoDB",
        [
            0.125e-6, 0.0625e-6, 0.125e-6, 0.125e-6, 0.625e-6, 0.625e-6, 0.625e-6, 2.5e-6,
        ],
    ),
    // Standard: $0.0004 per 1,000 class B (reads), $0.005 per 1,000 class A (writes).
    (
        "GCS",
        [0.4e-6, 0.4e-6, 0.4e-6, 0.4e-6, 5e-6, 5e-6, 5e-6, 5e-6],
    ),
    // Hot, LRS: reads are Get Blob (read) or Get Blob Properties (other), $0.005 per 10,000
    // each; a lease write is a Put Blob (write, $0.065 per 10,000) and a Lease Blob action
    // (other), as results/bench.md counted for a renew; `put_fenced_if` is a Put Blob.
    (
        "Azure Blob",
        [0.5e-6, 0.5e-6, 0.5e-6, 0.5e-6, 7e-6, 7e-6, 7e-6, 6.5e-6],
    ),
];

/// The fleet size the bill is extrapolated to.
const FLEET: f64 = 100.0;

/// A 100-instance fleet's calls per hour, by method, extrapolated from `run` (see
/// [`HOW_MEASURED`]).
fn fleet_of_100(run: &MembersRun) -> [f64; 8] {
    let n = run.n.max(1) as f64;
    // Methods 0..4 are reads; reads that go through every member grow linearly in n.
    let reads_scaled = |rates: &PerHour| {
        let mut v = rates.by_method;
        for x in &mut v[..4] {
            *x *= FLEET / n;
        }
        v
    };
    if run.scheme == Scheme::Single.name() {
        // The fleet's calls depend on the keys, not on how many instances share them.
        return run.fleet.mean.by_method.map(|v| v * n);
    }
    match &run.coord {
        Some(coord) => {
            let c = reads_scaled(coord);
            let mut out = run.members.mean.by_method.map(|v| v * (FLEET - 1.0));
            for (o, c) in out.iter_mut().zip(c) {
                *o += c;
            }
            out
        }
        None => reads_scaled(&run.fleet.mean).map(|v| v * FLEET),
    }
}

fn cost(o: &mut String, s: &MembersSettings, results: &[SizeResult]) {
    let _ = writeln!(
        o,
        "### Members: the store bill of a 100-instance fleet, USD per hour\n\n\
         Extrapolated from the largest size measured for each scheme ({} shards; see How \
         measured), priced per call at the list prices of `results/bench.md` (looked up on \
         2026-12-01; check them before quoting a cost).\n",
        s.shards
    );
    let _ = write!(o, "| scheme | from n | fleet reads/h | fleet writes/h |");
    for (cloud, _) in PRICES {
        let _ = write!(o, " {cloud} |");
    }
    let _ = writeln!(o, "\n|---|---|---|---|---|---|---|");
    let Some(first) = results.first() else { return };
    for (i, (label, _)) in labelled(first, s).into_iter().enumerate() {
        // The largest size at which this scheme was measured.
        let Some(run) = results
            .iter()
            .rev()
            .filter_map(|r| labelled(r, s).into_iter().nth(i))
            .find_map(|(_, run)| run.as_ref().ok().filter(|r| r.error.is_empty()))
        else {
            let _ = writeln!(o, "| {label} | not measured |");
            continue;
        };
        let calls = fleet_of_100(run);
        let reads: f64 = calls[..4].iter().sum();
        let writes: f64 = calls[4..].iter().sum();
        let _ = write!(
            o,
            "| {label} | {} | {} | {} |",
            run.n,
            per_hour(reads),
            per_hour(writes)
        );
        for (_, price) in PRICES {
            let usd: f64 = calls.iter().zip(price).map(|(c, p)| c * p).sum();
            let _ = write!(o, " {usd:.4} |");
        }
        o.push('\n');
    }
    o.push('\n');
}

/// The note under the members tables.
const HOW_MEASURED: &str = "\
### Members: how measured

- One process per fleet size and scheme (`shard_bench members`, release build, a tokio \
runtime with 2 worker threads, real time): n instances on one shared in-memory store \
(`MemoryStore`), each behind its own call-counting wrapper, every term taken by a task that \
drops it when `cancelled()` completes. The coordinator is the holder of the `<key>.coord` \
lease, read from the store at the window's end; the first design has no such lease.
- CPU % per instance: the process's CPU time in the window (`getrusage`, user + system) over \
its wall time, divided by n. RSS growth per instance: `VmRSS` at the window's end minus \
`VmRSS` before the instances started, divided by n (the shared store's records included).
- Converge: checked every 20 ms with `ShardedHandle::led()` on every live instance; timed from \
the event (the joiner's start, the crash) to the first check that sees every shard led by \
exactly one live instance with counts within one; after the coordinator's crash, also a live \
instance holding the coordinator lease. Moved: shard terms handed out meanwhile.
- A crash aborts the instance's task (`ShardedElector::into_parts`) where it stands and waits \
for it to be dropped, as a SIGKILL would: no release, no shutdown. Its wrapper then counts no \
store call (checked; a call would be reported under the table). It comes 20 ms after the \
instance's membership renew (its counter seen to rise, checked every 2 ms), so that its \
records have a whole ttl to run: the worst case, the same for both designs, where a crash at \
a random moment would come up to `renew_every` closer to its deadline.
- One lease per shard: each of the n instances holds `shards / n` single-key electors \
(`Elector`), started over one renew period so that their renews spread out; only holders, no \
follower (the cheapest such a scheme can be). No join or crash is measured for it.
- The first design: the same benchmark source built from the commit named in the scheme, \
where every member reads the roster and every other member's record each poll.
- The bill of 100 instances, from the run at the largest n measured: with a coordinator, 99 \
x the other members' mean + the coordinator, whose reads (the roster and every member's \
record, n a poll) are scaled by 100 / n and whose writes are as measured; the first design, \
100 x the mean instance with its reads (n a poll: the roster and every other member) scaled \
by 100 / n; one lease per shard, n x the mean instance (the fleet's calls depend on the \
shards, not on how many instances share them). Per call: DynamoDB on-demand (the cheap read \
`read_if_changed` eventually consistent, half a read unit; `read`, `read_for_term` and \
`get_fenced` strongly consistent, one unit; a lease write one write unit; `put_fenced_if` a \
two-item transaction, four units); GCS Standard (reads class B, writes class A); Azure Blob \
hot LRS (a read one read or other operation; a lease write a Put Blob and a Lease Blob action, \
as `results/bench.md` counted for a renew). One call is one request, retries aside.
";
