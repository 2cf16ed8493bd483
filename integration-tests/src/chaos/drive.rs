//! The round driver: waits for a leader, injects the scenario's fault into the running
//! candidates, and measures how long the store went without a new term.

use std::time::Duration;

use leader_core::Timing;
use nix::sys::signal::Signal;

use super::process::{Proc, leader, logs, term_after, terms_started_while_cut_off, wait_for};
use super::restart::{Instance, Outage, outage};
use super::scenario::{SLACK, Scenario};
use super::{EV_TERM_ENDED, EV_WRITE, OUT_ACCEPTED, Proxy, duration_us, mono_us};
use crate::proxy::ProxyFaults;

/// What [`drive`] works on: the round's fault and timing, and its running candidates.
pub(super) struct RoundContext<'a> {
    /// The fault to inject.
    pub(super) scenario: Scenario,
    /// The candidates' timing, from which the fault's length and the bounds follow.
    pub(super) timing: &'a Timing,
    /// The candidates, in the order they were spawned.
    pub(super) procs: &'a mut [Proc],
    /// The round's own store instance (restart rounds only).
    pub(super) store: Option<&'a mut Instance>,
}

/// What [`drive`] saw while the fault was on.
pub(super) struct RoundOutcome {
    /// Checks of the scenario that failed (a resumed leader not noticing its term ended, a term
    /// begun while the store was unreachable, ...).
    pub(super) violations: Vec<String>,
    /// Why the round went nowhere (no leader at the start, no new term after the fault), if it
    /// did.
    pub(super) failure: Option<String>,
    /// The failover, handover or recovery time, and the bound it broke.
    pub(super) measured: Measured,
    /// Step-downs while the fault was on (throttle, lossy, late).
    pub(super) step_downs: usize,
}

/// Injects the round's fault and returns what it saw.
pub(super) async fn drive(round: RoundContext<'_>) -> RoundOutcome {
    let RoundContext {
        scenario,
        timing,
        procs,
        mut store,
    } = round;
    let mut violations = Vec::new();
    let mut measured = Measured::default();
    let mut step_downs = 0;
    // A block of its own, so that `?` ends the round and keeps what was seen until then.
    let result: Result<(), String> = async {
        let settle = Duration::from_millis(800);
        let start_limit = timing.ttl * 2 + Duration::from_secs(15);
        let (l, token) = wait_for(start_limit, || leader(procs))
            .await
            .ok_or_else(|| format!("no leader within {start_limit:?} of the start"))?;
        tokio::time::sleep(settle).await;
        let bound = scenario.bound(timing);
        let wait_limit = bound.unwrap_or(timing.ttl) + Duration::from_secs(5);
        let mut expect_new = |procs: &[Proc], after: u64, not_by: Option<usize>, what: &str| {
            expect_term(procs, after, not_by, what, bound, &mut measured)
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
                // The pause must take hold and last until the drive resumes it. A leader that
                // runs on is not the election's fault but the drill's premise broken (in 2 of
                // the first long run's rounds the leader went on writing); said as such, with
                // what the kernel reported.
                let id = procs[l].id.clone();
                wait_for(Duration::from_secs(1), || {
                    (procs[l].stopped() == Some(true)).then_some(())
                })
                .await
                .ok_or_else(|| {
                    format!(
                        "harness: {id} was sent SIGSTOP but the kernel does not report it stopped \
                         (stopped: {:?})",
                        procs[l].stopped()
                    )
                })?;
                let mut running_again = None;
                let _ = wait_for(wait_limit, || {
                    if running_again.is_none() && procs[l].stopped() != Some(true) {
                        running_again = Some(mono_us());
                    }
                    term_after(procs, t, Some(l))
                })
                .await;
                if let Some(at) = running_again {
                    return Err(format!(
                        "harness: {id} was running again {:.0} ms after its SIGSTOP, before the \
                         drive sent SIGCONT: something else resumed it",
                        ms(at.saturating_sub(t))
                    ));
                }
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
                        .any(|e| {
                            e.ev == EV_WRITE && e.token == new_token && e.outcome == OUT_ACCEPTED
                        })
                        .then_some(())
                })
                .await;
                if procs[l].stopped() != Some(true) {
                    return Err(format!(
                        "harness: {id} was running again before the drive sent SIGCONT: \
                         something else resumed it"
                    ));
                }
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
                expect_new(procs, t, Some(l), "failover after partition").ok_or_else(|| {
                    format!("no new leader within {wait_limit:?} of the partition")
                })?;
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
                violations.extend(terms_started_while_cut_off(
                    procs,
                    t,
                    timing.request_timeout,
                    healed,
                    "while the store was unreachable",
                ));
                let _ = wait_for(wait_limit, || term_after(procs, healed, None)).await;
                expect_new(procs, healed, None, "recovery after the stall")
                    .ok_or_else(|| format!("no leader within {wait_limit:?} of the heal"))?;
                tokio::time::sleep(settle).await;
            }
            Scenario::Restart | Scenario::RestartEmpty => {
                // The store's own instance goes down mid-term and comes back (with its data, or
                // empty): see `restart::outage` for the steps and what is checked.
                let store = store
                    .as_deref_mut()
                    .ok_or("a restart round needs a store instance of its own")?;
                let round = Outage {
                    store,
                    procs: &mut *procs,
                    timing,
                    leader: (l, token),
                    bound,
                };
                outage(round, &mut violations, &mut measured).await?;
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
                        let mut faults = faults;
                        if matches!(proxy, Proxy::Tcp(_)) {
                            // On a byte stream everything queues behind a held chunk: at 0.2
                            // the fault is almost a stall, and the handover halfway through
                            // rarely happens while writes are held.
                            faults.late_fraction = faults.late_fraction.min(0.05);
                        }
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
                step_downs = logs(procs)
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
    .await;
    RoundOutcome {
        violations,
        failure: result.err(),
        measured,
        step_downs,
    }
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

/// The failover, handover or recovery time of a round.
#[derive(Debug, Default)]
pub(super) struct Measured {
    /// The time, in milliseconds.
    pub(super) value: Option<f64>,
    /// How it broke the scenario's bound, if it did.
    pub(super) late: Vec<String>,
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}
