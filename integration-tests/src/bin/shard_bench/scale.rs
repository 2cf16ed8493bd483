//! The scale run (`shard_bench scale shards=N settle=S window=W`), in a process of its own: one
//! [`ShardedElector`] alone on the in-memory store leading every shard with the default timing,
//! every term taken and held until it ends. Prints one JSON [`Scale`] line on stdout.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use leader_core::{HolderId, LeaseKey, MemoryStore, ShardTerms, ShardedElector};
use serde::{Deserialize, Serialize};
use tokio::time::{Instant, sleep, timeout};

use crate::counted::{Calls, Counted};
use crate::usage::{cpu_us, peak_rss_kib, rss_kib};

/// What the scale run measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Scale {
    /// Shards.
    pub(crate) shards: u32,
    /// The timing in force (`Timing`'s debug form).
    pub(crate) timing: String,
    /// From the start to every shard's term handed out, ms.
    pub(crate) take_ms: u64,
    /// CPU time used meanwhile, ms.
    pub(crate) take_cpu_ms: u64,
    /// Waited after that before measuring, s.
    pub(crate) settle_s: f64,
    /// The measuring window, s.
    pub(crate) window_s: f64,
    /// CPU time in the window as % of one core.
    pub(crate) cpu_pct: f64,
    /// Resident set at the window's start, KiB.
    pub(crate) rss_start_kib: u64,
    /// Largest resident set sampled (every second) in the window, KiB.
    pub(crate) rss_max_kib: u64,
    /// Resident set at the window's end, KiB.
    pub(crate) rss_end_kib: u64,
    /// `VmHWM` at the window's end: the peak since the process started, KiB.
    pub(crate) peak_kib: u64,
    /// Terms that ended at their deadline before the shutdown (missed deadlines).
    pub(crate) missed: u64,
    /// Terms that ended otherwise before the shutdown (there is nobody to release to).
    pub(crate) ended: u64,
    /// Times the membership term was lost before the shutdown.
    pub(crate) lost_member: u64,
    /// The fewest shards led at any change after all were taken, before the shutdown.
    pub(crate) led_min: u64,
    /// Store calls in the window.
    pub(crate) calls: Calls,
    /// From the shutdown's start to its end (every shard released, then the membership), ms.
    pub(crate) shutdown_ms: u64,
    /// Store calls of the shutdown.
    pub(crate) shutdown_calls: Calls,
    /// Set if something failed.
    pub(crate) error: String,
}

#[derive(Debug, Default)]
struct Stats {
    handed: AtomicU64,
    missed: AtomicU64,
    ended: AtomicU64,
    stopping: AtomicBool,
}

async fn hold(terms: ShardTerms, stats: Arc<Stats>) {
    while let Ok(term) = terms.next().await {
        stats.handed.fetch_add(1, Ordering::Relaxed);
        let stats = stats.clone();
        tokio::spawn(async move {
            term.cancelled().await;
            if !stats.stopping.load(Ordering::Relaxed) {
                if Instant::now() >= term.deadline() {
                    stats.missed.fetch_add(1, Ordering::Relaxed);
                } else {
                    stats.ended.fetch_add(1, Ordering::Relaxed);
                }
            }
            drop(term);
        });
    }
}

/// Runs the scale measurement.
pub(crate) async fn run(shards: u32, settle: Duration, window: Duration) -> Scale {
    let mut out = Scale {
        shards,
        settle_s: settle.as_secs_f64(),
        window_s: window.as_secs_f64(),
        ..Scale::default()
    };
    if let Err(e) = measure(&mut out, settle, window).await {
        out.error = e;
    }
    out
}

async fn measure(out: &mut Scale, settle: Duration, window: Duration) -> Result<(), String> {
    let store = Arc::new(Counted::new(MemoryStore::new()));
    let key = LeaseKey::new("scale").map_err(|e| e.to_string())?;
    let elector = ShardedElector::builder(store.clone(), key, out.shards)
        .holder_id(HolderId::new("scale-0").map_err(|e| e.to_string())?)
        .build()
        .map_err(|e| e.to_string())?;
    out.timing = format!("{:?}", elector.timing());
    let stats = Arc::new(Stats::default());
    let (start, cpu0) = (Instant::now(), cpu_us());
    let handle = elector.spawn();
    tokio::spawn(hold(handle.terms(), stats.clone()));
    let all = u64::from(out.shards);
    timeout(Duration::from_secs(600), async {
        while stats.handed.load(Ordering::Relaxed) < all {
            sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .map_err(|_| {
        format!(
            "only {} of {all} terms handed out after 600 s",
            stats.handed.load(Ordering::Relaxed)
        )
    })?;
    out.take_ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    out.take_cpu_ms = cpu_us().saturating_sub(cpu0) / 1000;

    // From now on, watch every published change: membership lost, fewer shards led.
    let lost = Arc::new(AtomicU64::new(0));
    let led_min = Arc::new(AtomicU64::new(all));
    let mut assignment = handle.assignment();
    let (lost2, led_min2, stats2) = (lost.clone(), led_min.clone(), stats.clone());
    tokio::spawn(async move {
        let mut was_member = true;
        loop {
            if stats2.stopping.load(Ordering::Relaxed) {
                break;
            }
            let (member, led) = {
                let a = assignment.borrow_and_update();
                (a.member, a.led.len() as u64)
            };
            if was_member && !member {
                lost2.fetch_add(1, Ordering::Relaxed);
            }
            was_member = member;
            led_min2.fetch_min(led, Ordering::Relaxed);
            if assignment.changed().await.is_err() {
                break;
            }
        }
    });

    sleep(settle).await;
    let (w0, cpu0, calls0) = (Instant::now(), cpu_us(), store.calls());
    out.rss_start_kib = rss_kib();
    out.rss_max_kib = out.rss_start_kib;
    let end = w0 + window;
    while Instant::now() < end {
        sleep(Duration::from_secs(1).min(end - Instant::now())).await;
        out.rss_max_kib = out.rss_max_kib.max(rss_kib());
    }
    let (cpu1, calls1) = (cpu_us(), store.calls());
    let elapsed_us = w0.elapsed().as_micros() as f64;
    out.window_s = elapsed_us / 1e6;
    out.cpu_pct = cpu1.saturating_sub(cpu0) as f64 / elapsed_us * 100.0;
    out.rss_end_kib = rss_kib();
    out.peak_kib = peak_rss_kib();
    out.calls = calls1.since(&calls0);
    out.missed = stats.missed.load(Ordering::Relaxed);
    out.ended = stats.ended.load(Ordering::Relaxed);
    out.lost_member = lost.load(Ordering::Relaxed);
    out.led_min = led_min.load(Ordering::Relaxed);

    stats.stopping.store(true, Ordering::Relaxed);
    let stop = Instant::now();
    timeout(Duration::from_secs(120), handle.shutdown())
        .await
        .map_err(|_| "the shutdown took over 120 s".to_owned())?;
    out.shutdown_ms = u64::try_from(stop.elapsed().as_millis()).unwrap_or(u64::MAX);
    out.shutdown_calls = store.calls().since(&calls1);
    Ok(())
}
