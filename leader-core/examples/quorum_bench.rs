//! The election over a quorum of 3 stores next to one store, measured in the protocol's own
//! time (paused tokio time, memory stores with 10 ms of latency each way, the default timing
//! of a 15 s ttl): store calls per hour of a leader and of a follower, failover after a crash,
//! handover after a release, and how long nobody leads while one store (or two) is away.
//!
//! ```text
//! cargo run --release -p leader-core --features simulation --example quorum_bench
//! ```
//!
//! Prints markdown tables (for `results/quorum.md`). Not a test: nothing asserts on a figure.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use leader_core::quorum::{Quorum, QuorumMember};
use leader_core::simulation::{FaultControl, FaultyStore};
use leader_core::{Elector, ElectorHandle, HolderId, LeaseKey, MemoryStore};
use tokio::time::{Instant, sleep};

const TTL: Duration = Duration::from_secs(15);
const RUNS: u64 = 20;

/// One store, or three.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scheme {
    One,
    Quorum,
}

impl Scheme {
    fn name(self) -> &'static str {
        match self {
            Scheme::One => "one store",
            Scheme::Quorum => "quorum of 3",
        }
    }
}

/// The stores, with one fault control per store (its outages) shared by every candidate.
struct World {
    scheme: Scheme,
    stores: Vec<MemoryStore>,
    outages: Vec<Arc<FaultControl>>,
}

/// A candidate, with its view of each store (to count its calls).
struct Candidate {
    handle: Option<ElectorHandle>,
    task: Option<tokio::task::JoinHandle<()>>,
    views: Vec<Arc<FaultyStore<MemoryStore>>>,
}

impl World {
    fn new(scheme: Scheme) -> Self {
        let n = if scheme == Scheme::One { 1 } else { 3 };
        let outages = (0..n)
            .map(|_| {
                let c = FaultControl::new();
                c.update(|f| f.latency = Duration::from_millis(10));
                c
            })
            .collect();
        Self {
            scheme,
            stores: (0..n).map(|_| MemoryStore::new()).collect(),
            outages,
        }
    }

    fn start(&self, id: &str, seed: u64) -> Candidate {
        let views: Vec<Arc<FaultyStore<MemoryStore>>> = self
            .stores
            .iter()
            .zip(&self.outages)
            .enumerate()
            .map(|(i, (s, o))| {
                Arc::new(FaultyStore::new(
                    s.clone(),
                    seed * 8 + i as u64,
                    vec![o.clone()],
                ))
            })
            .collect();
        let key = LeaseKey::new("job").unwrap();
        let builder = match self.scheme {
            Scheme::One => Elector::builder(views[0].clone(), key),
            Scheme::Quorum => {
                let members = views
                    .iter()
                    .enumerate()
                    .map(|(i, v)| QuorumMember::new(format!("m{i}"), v.clone()))
                    .collect();
                Elector::quorum_builder(Quorum::new(members).unwrap(), key)
            }
        };
        let (handle, task) = builder
            .ttl(TTL)
            .holder_id(HolderId::new(id).unwrap())
            .jitter_seed(seed)
            .build()
            .unwrap()
            .into_parts();
        Candidate {
            handle: Some(handle),
            task: Some(tokio::spawn(task)),
            views,
        }
    }
}

impl Candidate {
    fn leads(&self) -> bool {
        self.handle
            .as_ref()
            .is_some_and(|h| h.leadership().borrow().is_leader())
    }

    fn calls(&self) -> (u64, u64) {
        self.views.iter().fold((0, 0), |(r, w), v| {
            let (vr, vw) = v.counts();
            (r + vr, w + vw)
        })
    }

    fn crash(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }

    async fn stop(&mut self) {
        if let Some(h) = self.handle.take() {
            h.shutdown().await;
        }
        self.crash();
    }
}

async fn until(limit: Duration, f: impl Fn() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while !f() {
        if start.elapsed() > limit {
            return None;
        }
        sleep(Duration::from_millis(5)).await;
    }
    Some(start.elapsed())
}

/// Calls per hour of the leader and of one follower, over an hour of simulated time.
async fn calls(scheme: Scheme) -> [(f64, f64); 2] {
    let world = World::new(scheme);
    let mut a = world.start("a", 1);
    until(TTL, || a.leads()).await;
    let mut b = world.start("b", 2);
    sleep(TTL).await;
    let (a0, b0) = (a.calls(), b.calls());
    let hour = Duration::from_secs(3600);
    sleep(hour).await;
    let (a1, b1) = (a.calls(), b.calls());
    a.stop().await;
    b.stop().await;
    [
        ((a1.0 - a0.0) as f64, (a1.1 - a0.1) as f64),
        ((b1.0 - b0.0) as f64, (b1.1 - b0.1) as f64),
    ]
}

/// Failover after a crash, and handover after a release: the median and the largest of
/// `RUNS` runs, each crash or release at another phase of the renew cycle.
async fn failover(scheme: Scheme, release: bool) -> (f64, f64) {
    let mut times = Vec::new();
    for run in 0..RUNS {
        let world = World::new(scheme);
        let mut a = world.start("a", 10 + run);
        until(TTL, || a.leads()).await;
        let b = world.start("b", 100 + run);
        sleep(TTL + Duration::from_millis(373 * run)).await;
        let t0 = Instant::now();
        if release {
            a.stop().await;
        } else {
            a.crash();
        }
        if until(4 * TTL, || b.leads()).await.is_some() {
            times.push(t0.elapsed().as_secs_f64());
        }
        let mut b = b;
        b.stop().await;
    }
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], times[times.len() - 1])
}

/// How long nobody leads while `down` stores are away for `outage`, starting mid-term:
/// the median of `RUNS` runs.
async fn leaderless(scheme: Scheme, down: usize, outage: Duration) -> f64 {
    let mut gaps = Vec::new();
    for run in 0..RUNS {
        let world = World::new(scheme);
        let mut a = world.start("a", 20 + run);
        until(TTL, || a.leads()).await;
        let mut b = world.start("b", 200 + run);
        sleep(TTL + Duration::from_millis(411 * run)).await;
        for o in &world.outages[..down] {
            o.update(|f| f.down = true);
        }
        let end = Instant::now() + outage;
        let mut gap = Duration::ZERO;
        let step = Duration::from_millis(10);
        // Until the outage is over and someone leads again.
        loop {
            let now = Instant::now();
            if now >= end {
                for o in &world.outages[..down] {
                    o.update(|f| f.down = false);
                }
            }
            let leads = a.leads() || b.leads();
            if !leads {
                gap += step;
            } else if now >= end {
                break;
            }
            if now > end + 4 * TTL {
                break;
            }
            sleep(step).await;
        }
        gaps.push(gap.as_secs_f64());
        a.stop().await;
        b.stop().await;
    }
    gaps.sort_by(f64::total_cmp);
    gaps[gaps.len() / 2]
}

async fn bench() {
    println!(
        "| scheme | leader reads/h | leader writes/h | follower reads/h | follower writes/h |"
    );
    println!("|---|---|---|---|---|");
    for scheme in [Scheme::One, Scheme::Quorum] {
        let [l, f] = calls(scheme).await;
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} |",
            scheme.name(),
            l.0,
            l.1,
            f.0,
            f.1
        );
    }
    println!();
    println!(
        "| scheme | failover after a crash, median / max s | handover after a release, median / max s |"
    );
    println!("|---|---|---|");
    for scheme in [Scheme::One, Scheme::Quorum] {
        let (fm, fx) = failover(scheme, false).await;
        let (hm, hx) = failover(scheme, true).await;
        println!(
            "| {} | {fm:.2} / {fx:.2} | {hm:.2} / {hx:.2} |",
            scheme.name()
        );
    }
    println!();
    println!("| outage | one store: nobody leads, s | quorum of 3: nobody leads, s |");
    println!("|---|---|---|");
    for outage in [10u64, 60, 300] {
        let d = Duration::from_secs(outage);
        let one = leaderless(Scheme::One, 1, d).await;
        let q1 = leaderless(Scheme::Quorum, 1, d).await;
        let q2 = leaderless(Scheme::Quorum, 2, d).await;
        println!("| one store away {outage} s | {one:.1} | {q1:.1} |");
        println!("| two of three away {outage} s | - | {q2:.1} |");
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(bench());
}
