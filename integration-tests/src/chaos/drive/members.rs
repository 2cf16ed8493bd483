//! The faults of a store's own members: a round on a three-member etcd cluster or ZooKeeper
//! ensemble ([`Cluster`]), candidate `i` talking to member `i` alone (so that a fault hits the
//! clients of that member, and nothing hides it), while the leader renews.
//!
//! What every such round measures is the longest time without an acknowledged write of any
//! candidate from the fault until the end of the round (a leader writes every 60 ms): the time
//! the protected resource went unled, against [`Scenario::bound`].

use std::time::Duration;

use nix::sys::signal::Signal;

use super::super::measure::ms;
use super::super::process::{leader, logs, term_after, wait_for};
use super::super::scenario::Scenario;
use super::super::{EV_TERM_STARTED, EV_WRITE, OUT_ACCEPTED, duration_us, mono_us};
use super::Drive;
use crate::cluster::{Cluster, MemberAction};

/// How long a cluster may take to have a leader all follow again after a member's fault.
const HEALTHY: Duration = Duration::from_secs(30);

impl Drive<'_> {
    /// Plays the member fault of the round's scenario on its cluster; `l` leads with `token`.
    pub(super) async fn member_fault(&mut self, l: usize, token: u64) -> Result<(), String> {
        let cluster = self
            .cluster
            .ok_or("a member round needs a cluster of its own")?;
        let store_leader = cluster.healthy(HEALTHY).await?;
        let t = mono_us();
        let ttl = self.timing.ttl;
        match self.scenario {
            Scenario::MemberKill => {
                cluster.member(store_leader, MemberAction::Kill).await?;
                tokio::time::sleep(ttl + Duration::from_secs(1)).await;
                cluster.member(store_leader, MemberAction::Start).await?;
            }
            Scenario::MemberStop => {
                cluster.member(store_leader, MemberAction::Pause).await?;
                tokio::time::sleep(ttl * 2).await;
                cluster.member(store_leader, MemberAction::Resume).await?;
            }
            Scenario::MemberPartition => {
                cluster.member(store_leader, MemberAction::Isolate).await?;
                tokio::time::sleep(ttl + Duration::from_secs(2)).await;
                cluster.member(store_leader, MemberAction::Heal).await?;
            }
            Scenario::LeaderMinority => self.leader_minority(cluster, l, token, t).await?,
            Scenario::FollowerMinority => self.follower_minority(cluster, l).await?,
            Scenario::RollingRestart => {
                for i in 0..3 {
                    cluster.member(i, MemberAction::Stop).await?;
                    cluster.member(i, MemberAction::Start).await?;
                    cluster.healthy(HEALTHY).await?;
                    tokio::time::sleep(self.timing.renew_every * 2).await;
                }
            }
            _ => return Err(format!("{} is not a member fault", self.scenario.name())),
        }
        cluster.healthy(HEALTHY).await?;
        let limit = self.wait_limit();
        wait_for(limit, || leader(self.procs))
            .await
            .ok_or_else(|| format!("no leader within {limit:?} of the member's return"))?;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        self.unled_gap(t, mono_us());
        Ok(())
    }

    /// The member of the leader's client cut from the other two (its client still reaches
    /// it): neither its reads nor its writes may keep the term alive. The leader ends its
    /// term (by its deadline: a ttl after its last renew at most), never begins another
    /// while the member is cut off, and a candidate on the majority side takes over.
    async fn leader_minority(
        &mut self,
        cluster: &Cluster,
        l: usize,
        token: u64,
        t: u64,
    ) -> Result<(), String> {
        cluster.member(l, MemberAction::IsolatePeers).await?;
        let ttl = self.timing.ttl;
        // Its deadline is at most `ttl - margin` after the cut (after its last renew).
        let by = ttl - self.timing.margin + Duration::from_millis(500);
        let procs = &*self.procs;
        let ended = wait_for(by, || procs[l].term_ended(token)).await;
        if ended.is_none() {
            self.violations.push(format!(
                "{} kept term {token} for more than {by:?} through a member cut from the others",
                procs[l].id
            ));
        }
        let limit = self.wait_limit();
        let _ = wait_for(limit, || term_after(self.procs, t, Some(l))).await;
        if term_after(self.procs, t, Some(l)).is_none() {
            return Err(format!(
                "no candidate on the majority side began a term within {limit:?}"
            ));
        }
        tokio::time::sleep(ttl).await;
        let healed = mono_us();
        cluster.member(l, MemberAction::Heal).await?;
        self.no_term_by(l, t, healed, "while its member was cut from the others");
        Ok(())
    }

    /// A follower's member cut from the other two, and the leader hands over (SIGTERM)
    /// meanwhile: the follower, whose reads may be stale, never begins a term while cut off;
    /// the candidate on the majority side takes over.
    async fn follower_minority(&mut self, cluster: &Cluster, l: usize) -> Result<(), String> {
        let f = (l + 1) % self.procs.len();
        let t = mono_us();
        cluster.member(f, MemberAction::IsolatePeers).await?;
        // Long enough for the member to notice that it lost the others.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let handover = mono_us();
        self.procs[l].signal(Signal::SIGTERM);
        let limit = self.wait_limit();
        let _ = wait_for(limit, || term_after(self.procs, handover, Some(l))).await;
        match term_after(self.procs, handover, Some(l)) {
            None => {
                return Err(format!(
                    "no candidate began a term within {limit:?} of the handover"
                ));
            }
            Some((n, token, _)) if n == f => self.violations.push(format!(
                "{} began term {token} while its member was cut from the others",
                self.procs[f].id
            )),
            Some(_) => {}
        }
        tokio::time::sleep(self.timing.ttl).await;
        let healed = mono_us();
        cluster.member(f, MemberAction::Heal).await?;
        self.no_term_by(f, t, healed, "while its member was cut from the others");
        Ok(())
    }

    /// A violation for each term candidate `c` began between `from` and `to`.
    fn no_term_by(&mut self, c: usize, from: u64, to: u64, while_: &str) {
        for e in self.procs[c].read().events {
            if e.ev == EV_TERM_STARTED && e.t > from && e.t < to {
                self.violations.push(format!(
                    "{} began term {} {while_}",
                    self.procs[c].id, e.token
                ));
            }
        }
    }

    /// Records the longest time between `from` and `to` without an acknowledged write of any
    /// candidate, and whether it broke the scenario's bound.
    fn unled_gap(&mut self, from: u64, to: u64) {
        let mut acks: Vec<u64> = logs(self.procs)
            .iter()
            .flat_map(|l| l.events.iter())
            .filter(|e| e.ev == EV_WRITE && e.outcome == OUT_ACCEPTED && e.t > from && e.t < to)
            .map(|e| e.t)
            .collect();
        acks.sort_unstable();
        let mut prev = from;
        let mut gap = 0;
        for at in acks.into_iter().chain(std::iter::once(to)) {
            gap = gap.max(at.saturating_sub(prev));
            prev = at;
        }
        self.measured.value = Some(ms(gap));
        if let Some(b) = self.bound
            && gap > duration_us(b)
        {
            self.measured.late.push(format!(
                "{}: the resource went unled for {:.0} ms, more than {b:?}",
                self.scenario.name(),
                ms(gap)
            ));
        }
    }
}
