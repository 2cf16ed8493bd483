//! The round driver: waits for a leader, injects the scenario's fault into the running
//! candidates, and measures how long the store went without a new term. Each scenario is one
//! method of [`Drive`].

use std::path::PathBuf;
use std::time::Duration;

use leader_core::Timing;
use nix::sys::signal::Signal;

use super::measure::{Measured, expect_term, ms};
use super::process::{Proc, leader, logs, term_after, terms_started_while_cut_off, wait_for};
use super::restart::{Instance, Outage, outage};
use super::scenario::{SLACK, Scenario};
use super::{BackendKind, EV_TERM_ENDED, EV_WRITE, OUT_ACCEPTED, Proxy, mono_us};
use crate::cluster::Cluster;
use crate::proxy::{ProxyFaults, ThrottleAnswer};

mod members;

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
    /// The backend, for the scenario's bound and the shape of its throttling answers.
    pub(super) kind: BackendKind,
    /// The quorum's member folders, in member order (the quorum of folders only).
    pub(super) folders: Vec<PathBuf>,
    /// The lease key.
    pub(super) key: &'a str,
    /// The round's own cluster (member rounds only).
    pub(super) cluster: Option<&'a Cluster>,
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

/// How long the drive lets the candidates settle after the first leader and after a fault.
const SETTLE: Duration = Duration::from_millis(800);

/// Injects the round's fault and returns what it saw.
pub(super) async fn drive(round: RoundContext<'_>) -> RoundOutcome {
    let mut d = Drive {
        scenario: round.scenario,
        timing: round.timing,
        procs: round.procs,
        store: round.store,
        bound: round.scenario.bound(round.kind, round.timing),
        kind: round.kind,
        folders: round.folders,
        key: round.key,
        cluster: round.cluster,
        violations: Vec::new(),
        measured: Measured::default(),
        step_downs: 0,
    };
    // `?` in the scenario ends the round and keeps what was seen until then.
    let result = d.run().await;
    RoundOutcome {
        violations: d.violations,
        failure: result.err(),
        measured: d.measured,
        step_downs: d.step_downs,
    }
}

/// One round's fault being played, and what it has seen so far.
struct Drive<'a> {
    scenario: Scenario,
    timing: &'a Timing,
    procs: &'a mut [Proc],
    store: Option<&'a mut Instance>,
    kind: BackendKind,
    folders: Vec<PathBuf>,
    key: &'a str,
    cluster: Option<&'a Cluster>,
    /// The scenario's bound on the failover, handover or recovery time, if it has one.
    bound: Option<Duration>,
    violations: Vec<String>,
    measured: Measured,
    step_downs: usize,
}

impl Drive<'_> {
    /// Waits for the first leader, then plays the scenario on it.
    async fn run(&mut self) -> Result<(), String> {
        let start_limit = self.timing.ttl * 2 + Duration::from_secs(15);
        let (l, token) = wait_for(start_limit, || leader(self.procs))
            .await
            .ok_or_else(|| format!("no leader within {start_limit:?} of the start"))?;
        tokio::time::sleep(SETTLE).await;
        match self.scenario {
            Scenario::Kill | Scenario::Term => self.kill_or_term(l).await?,
            Scenario::Stop => self.stop(l, token).await?,
            Scenario::Partition => self.partition(l, token).await?,
            Scenario::Stall => self.stall().await?,
            Scenario::Restart | Scenario::RestartEmpty => self.restart(l, token).await?,
            Scenario::Throttle | Scenario::Lossy | Scenario::Late => self.degrade().await?,
            Scenario::MemberAway => self.member_away(l, token).await?,
            Scenario::MemberKill
            | Scenario::MemberStop
            | Scenario::MemberPartition
            | Scenario::LeaderMinority
            | Scenario::FollowerMinority
            | Scenario::RollingRestart => self.member_fault(l, token).await?,
        }
        Ok(())
    }

    /// How long to wait for the next term after the fault.
    fn wait_limit(&self) -> Duration {
        self.bound.unwrap_or(self.timing.ttl) + Duration::from_secs(5)
    }

    /// The first term after `after` (not by `not_by`), recorded as the round's time.
    fn expect_new(
        &mut self,
        after: u64,
        not_by: Option<usize>,
        what: &str,
    ) -> Option<(usize, u64, u64)> {
        expect_term(
            self.procs,
            after,
            not_by,
            what,
            self.bound,
            &mut self.measured,
        )
    }

    /// SIGKILL (failover) or SIGTERM (handover) of the leader `l`.
    async fn kill_or_term(&mut self, l: usize) -> Result<(), String> {
        let kill = self.scenario == Scenario::Kill;
        let t = mono_us();
        let procs = &mut *self.procs;
        if kill {
            procs[l].signal(Signal::SIGKILL);
            procs[l].killed_at = Some(t);
            let _ = procs[l].child.wait();
            procs[l].done = true;
        } else {
            procs[l].signal(Signal::SIGTERM);
        }
        let wait_limit = self.wait_limit();
        let _ = wait_for(wait_limit, || term_after(self.procs, t, Some(l))).await;
        let what = if kill {
            "failover after SIGKILL"
        } else {
            "handover after SIGTERM"
        };
        self.expect_new(t, Some(l), what)
            .ok_or_else(|| format!("no new leader within {wait_limit:?} of the {what}"))?;
        tokio::time::sleep(SETTLE).await;
        Ok(())
    }

    /// SIGSTOP of the leader `l` (of term `token`) past its ttl; SIGCONT once the next term
    /// has written: the resumed leader must notice its term ended, and no write of its old
    /// term may be accepted.
    async fn stop(&mut self, l: usize, token: u64) -> Result<(), String> {
        let t = mono_us();
        self.procs[l].signal(Signal::SIGSTOP);
        self.stays_stopped(l, t).await?;
        let wait_limit = self.wait_limit();
        let found = self.expect_new(t, Some(l), "failover after SIGSTOP");
        let (n, new_token, _) =
            found.ok_or_else(|| format!("no new leader within {wait_limit:?} of the SIGSTOP"))?;
        // Resume once the new term has written, so that a write the old leader had decided
        // on before the pause meets a higher fence.
        let procs = &mut *self.procs;
        let _ = wait_for(Duration::from_secs(3), || {
            procs[n]
                .read()
                .events
                .iter()
                .any(|e| e.ev == EV_WRITE && e.token == new_token && e.outcome == OUT_ACCEPTED)
                .then_some(())
        })
        .await;
        let id = procs[l].id.clone();
        if procs[l].stopped() != Some(true) {
            return Err(format!(
                "harness: {id} was running again before the drive sent SIGCONT: something \
                 else resumed it"
            ));
        }
        let resumed = mono_us();
        procs[l].signal(Signal::SIGCONT);
        let noticed = wait_for(Duration::from_secs(3), || procs[l].term_ended(token)).await;
        if noticed.is_none() {
            self.violations.push(format!(
                "{id} did not notice within 3 s of SIGCONT that term {token} ended"
            ));
        }
        tokio::time::sleep(SETTLE).await;
        for e in self.procs[l].read().events {
            if e.ev == EV_WRITE && e.token == token && e.t1 > resumed && e.outcome == OUT_ACCEPTED {
                self.violations.push(format!(
                    "{id} wrote with its old token {token} after SIGCONT and it was accepted"
                ));
            }
        }
        Ok(())
    }

    /// The pause must take hold and last until the drive resumes it: waits for the next term
    /// (not by `l`) while checking that. A leader that runs on is not the election's fault but
    /// the drill's premise broken (in 2 of the first long run's rounds the leader went on
    /// writing); said as such, with what the kernel reported.
    async fn stays_stopped(&mut self, l: usize, t: u64) -> Result<(), String> {
        let procs = &*self.procs;
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
        let _ = wait_for(self.wait_limit(), || {
            if running_again.is_none() && procs[l].stopped() != Some(true) {
                running_again = Some(mono_us());
            }
            term_after(procs, t, Some(l))
        })
        .await;
        match running_again {
            Some(at) => Err(format!(
                "harness: {id} was running again {:.0} ms after its SIGSTOP, before the drive \
                 sent SIGCONT: something else resumed it",
                ms(at.saturating_sub(t))
            )),
            None => Ok(()),
        }
    }

    /// The leader `l` cut off from the store: another takes over, and `l` logs the end of
    /// its term.
    async fn partition(&mut self, l: usize, token: u64) -> Result<(), String> {
        let t = mono_us();
        if let Some(p) = &self.procs[l].proxy {
            p.set(ProxyFaults {
                blackhole: true,
                ..ProxyFaults::default()
            });
        }
        let wait_limit = self.wait_limit();
        let _ = wait_for(wait_limit, || term_after(self.procs, t, Some(l))).await;
        self.expect_new(t, Some(l), "failover after partition")
            .ok_or_else(|| format!("no new leader within {wait_limit:?} of the partition"))?;
        let procs = &*self.procs;
        let stepped = wait_for(Duration::from_secs(2), || procs[l].term_ended(token)).await;
        if stepped.is_none() {
            self.violations.push(format!(
                "the partitioned leader {} did not log the end of term {token}",
                procs[l].id
            ));
        }
        if let Some(p) = &self.procs[l].proxy {
            p.heal();
        }
        tokio::time::sleep(SETTLE).await;
        Ok(())
    }

    /// Every candidate cut off from the store for more than a ttl: no term may start then,
    /// and one does soon after the heal.
    async fn stall(&mut self) -> Result<(), String> {
        let t = mono_us();
        self.set_faults(|_| ProxyFaults {
            blackhole: true,
            ..ProxyFaults::default()
        });
        tokio::time::sleep(self.timing.ttl + Duration::from_millis(500)).await;
        let healed = self.heal();
        // Nothing answered after the requests in flight timed out: no term may start.
        self.violations.extend(terms_started_while_cut_off(
            self.procs,
            t,
            self.timing.request_timeout,
            healed,
            "while the store was unreachable",
        ));
        let wait_limit = self.wait_limit();
        let _ = wait_for(wait_limit, || term_after(self.procs, healed, None)).await;
        self.expect_new(healed, None, "recovery after the stall")
            .ok_or_else(|| format!("no leader within {wait_limit:?} of the heal"))?;
        tokio::time::sleep(SETTLE).await;
        Ok(())
    }

    /// The store's own instance goes down mid-term and comes back (with its data, or empty):
    /// see `restart::outage` for the steps and what is checked.
    async fn restart(&mut self, l: usize, token: u64) -> Result<(), String> {
        let store = self
            .store
            .as_deref_mut()
            .ok_or("a restart round needs a store instance of its own")?;
        let round = Outage {
            store,
            procs: &mut *self.procs,
            timing: self.timing,
            leader: (l, token),
            bound: self.bound,
        };
        outage(round, &mut self.violations, &mut self.measured).await?;
        tokio::time::sleep(SETTLE).await;
        Ok(())
    }

    /// The quorum's last member, then its second, away (its folder renamed away) for longer
    /// than the ttl and back: the leader `l` keeps term `token` throughout, and nobody else
    /// begins a term.
    async fn member_away(&mut self, l: usize, token: u64) -> Result<(), String> {
        let (l, token) = self.carried_everywhere(l, token).await?;
        let t = mono_us();
        for i in [2, 1] {
            let folder = self
                .folders
                .get(i)
                .ok_or("a member-away round needs a quorum's folders")?
                .clone();
            let away = folder.with_extension("away");
            std::fs::rename(&folder, &away)
                .map_err(|e| format!("harness: renaming {folder:?} away: {e}"))?;
            tokio::time::sleep(self.timing.ttl + SETTLE).await;
            std::fs::rename(&away, &folder)
                .map_err(|e| format!("harness: renaming {folder:?} back: {e}"))?;
            // Back: the leader's next renews write it again.
            tokio::time::sleep(self.timing.renew_every * 2).await;
        }
        let procs = &*self.procs;
        if procs[l].term_ended(token).is_some() {
            self.violations.push(format!(
                "the leader {} lost term {token} while one member of three was away",
                procs[l].id
            ));
        }
        if let Some((n, other, _)) = term_after(procs, t, None) {
            self.violations.push(format!(
                "{} began term {other} while the leader held a majority",
                procs[n].id
            ));
        }
        Ok(())
    }

    /// A term may begin on a bare majority, and only a term that carries every member
    /// survives the loss of any one: waits until the term of `token` (led by `l`) does, as the
    /// quorum's status read shows it. A member another candidate wrote first is taken back
    /// once that record times out; one whose token mark went above the term's never is, so
    /// after two ttls the leader hands over (SIGTERM), and the next term is waited for the
    /// same way. Returns the leader and token to take members away under.
    async fn carried_everywhere(&mut self, l: usize, token: u64) -> Result<(usize, u64), String> {
        let dir = self
            .folders
            .first()
            .and_then(|f| f.parent())
            .ok_or("a member-away round needs a quorum's folders")?
            .to_path_buf();
        let (mut l, mut token) = (l, token);
        for _ in 0..3 {
            let end = tokio::time::Instant::now() + self.timing.ttl * 2;
            while tokio::time::Instant::now() < end {
                if super::quorum_carries_everywhere(&dir, self.key, token).await {
                    return Ok((l, token));
                }
                tokio::time::sleep(self.timing.renew_every).await;
            }
            let t = mono_us();
            self.procs[l].signal(Signal::SIGTERM);
            let wait_limit = self.wait_limit();
            (l, token, _) = wait_for(wait_limit, || term_after(self.procs, t, Some(l)))
                .await
                .ok_or_else(|| format!("no new leader within {wait_limit:?} of the SIGTERM"))?;
        }
        Err(format!(
            "harness: no term carried every member of the quorum (the last: {token})"
        ))
    }

    /// A store that throttles, loses answers or delivers writes late for a while (with a
    /// handover halfway through, for late writes): there is a leader soon after.
    async fn degrade(&mut self) -> Result<(), String> {
        let t = mono_us();
        let scenario = self.scenario;
        let faults = match scenario {
            Scenario::Throttle => ProxyFaults {
                throttle_fraction: 0.3,
                throttle_status: 503,
                // S3 throttles with its own error; the others get a bare 503.
                throttle_answer: if self.kind.s3() {
                    ThrottleAnswer::S3SlowDown
                } else {
                    ThrottleAnswer::Plain
                },
                ..ProxyFaults::default()
            },
            Scenario::Lossy => ProxyFaults {
                lose_response_fraction: 0.2,
                ..ProxyFaults::default()
            },
            _ => ProxyFaults {
                late_fraction: 0.2,
                late_by: self.timing.request_timeout * 2 + Duration::from_millis(200),
                ..ProxyFaults::default()
            },
        };
        self.set_faults(|proxy| {
            let mut faults = faults;
            if matches!(proxy, Proxy::Tcp(_)) {
                // On a byte stream everything queues behind a held chunk: at 0.2 the fault is
                // almost a stall, and the handover halfway through rarely happens while
                // writes are held.
                faults.late_fraction = faults.late_fraction.min(0.05);
            }
            faults
        });
        let window = (self.timing.ttl * 2).max(Duration::from_secs(5));
        if scenario == Scenario::Late {
            // A handover halfway through, so that the old leader's held writes (renews, its
            // release, fenced writes) land after the next term has begun.
            tokio::time::sleep(window / 2).await;
            if let Some((i, _)) = leader(self.procs) {
                self.procs[i].signal(Signal::SIGTERM);
            }
            tokio::time::sleep(window / 2).await;
        } else {
            tokio::time::sleep(window).await;
        }
        let healed = self.heal();
        self.step_downs = logs(self.procs)
            .iter()
            .flat_map(|l| l.events.iter())
            .filter(|e| e.ev == EV_TERM_ENDED && e.t > t && e.t < healed)
            .count();
        let timing = self.timing;
        let limit = timing.ttl + timing.retry_every * 2 + SLACK + Duration::from_secs(5);
        wait_for(limit, || leader(self.procs))
            .await
            .ok_or_else(|| format!("no leader within {limit:?} after the {}", scenario.name()))?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok(())
    }

    /// Sets the faults `of` its proxy gives on every candidate's proxy.
    fn set_faults(&self, of: impl Fn(&Proxy) -> ProxyFaults) {
        for p in self.procs.iter() {
            if let Some(proxy) = &p.proxy {
                proxy.set(of(proxy));
            }
        }
    }

    /// Heals every proxy; the instant it did.
    fn heal(&self) -> u64 {
        let healed = mono_us();
        for p in self.procs.iter() {
            if let Some(proxy) = &p.proxy {
                proxy.heal();
            }
        }
        healed
    }
}
