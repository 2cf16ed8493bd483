//! The coordinator: one member at a time holds the coordinator lease (`P.coord`); it reads
//! the roster and every member's record each poll, ends the terms of dead members (rule 3.2),
//! keeps the roster true (prunes ended terms, lists live members it lacks), and writes the
//! plan (`P.plan`), announcing its version in the lease's metadata. Every other member reads
//! only that lease and the coordinator's own member record each poll (two reads, whatever the
//! number of members), and the plan when the announcement changes. A coordinator is no
//! authority: the shard records are (`docs/sharding.md`).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{Driver, Membership, Peer, Put, is_permanent};
use crate::backend::{Expected, ExpiryModel, Revision, within};
use crate::error::Error;
use crate::lease::{Acquisition, Grant, Renewal};
use crate::model::{HolderId, Metadata};
use crate::shard::ShardFlaw;
use crate::shard::plan::{Plan, Seen, Share, allot};
use crate::shard::records::{Entry, Roster, ShardRecord, ShardSet, ShardState, claims_of};

/// The metadata key of the plan's version in the coordinator lease.
const META_PLAN: &str = "plan";

/// At most this many shard records are read in one poll for the unclaimed-shard check.
const PIN_READS: usize = 16;

/// What this instance keeps while it coordinates.
#[derive(Debug)]
pub(super) struct Leading {
    /// The coordinator term.
    grant: Grant,
    /// The plan object's revision as last read or written (`None`: none yet).
    revision: Option<Revision>,
    /// The plan version the coordinator lease's metadata announces (as last written).
    announced: u64,
    /// When the plan object was last read to check that it is still there (an operator may
    /// delete it: it is written again).
    checked: Instant,
    /// A renew of the coordinator lease failed: when to try again, before its deadline.
    retry_at: Option<Instant>,
    /// Shards no live member claims, and since when.
    unclaimed_since: BTreeMap<u32, Instant>,
    /// Shards whose record names a live member's current term that does not claim them:
    /// planned to that member, so that it adopts them (rule 7).
    pinned: BTreeMap<u32, HolderId>,
}

impl Driver {
    /// Follows the coordinator lease (one read), and becomes the coordinator if it is free
    /// or stale; learns of a new plan from its announcement, and reads the plan then.
    pub(super) async fn follow_coordinator(&mut self) -> Result<(), Error> {
        if let Some(leading) = &self.leading {
            if Instant::now() >= leading.grant.deadline {
                warn!("the coordinator lease was not renewed in time; no longer coordinating");
                self.leading = None;
                self.coord.end_term("not renewed in time");
            }
            return Ok(());
        }
        let version = self.plan.as_ref().map_or(0, |p| p.version);
        self.coord
            .set_metadata(plan_metadata(version))
            .map_err(|e| Error::InvalidConfig {
                message: e.to_string(),
                source: None,
            })?;
        match self.coord.try_acquire().await {
            Ok(Acquisition::Acquired(grant)) => self.start_leading(grant, version).await,
            Ok(Acquisition::Following {
                leader: Some(leader),
                ..
            }) => {
                if self
                    .watching
                    .as_ref()
                    .is_none_or(|(id, _)| *id != leader.holder)
                    && leader.holder != self.me
                    && let Ok(client) = self.peer_client(&leader.holder)
                {
                    self.watching = Some((leader.holder.clone(), client));
                }
                // The plan announced: this version, written in this coordinator term.
                let announced = leader
                    .metadata
                    .get(META_PLAN)
                    .and_then(|v| v.parse::<u64>().ok())
                    .map(|v| (v, leader.token.0));
                let held = self.plan.as_ref().map(|p| (p.version, p.term));
                debug!(coordinator = %leader.holder, ?announced, ?held, "following the coordinator");
                if announced.is_some() && announced != held {
                    self.read_plan(announced).await?;
                }
            }
            Ok(Acquisition::Following { leader: None, .. }) => {}
            Err(e) if is_permanent(&e) => return Err(e),
            Err(e) => debug!(error = %e, "could not read the coordinator lease"),
        }
        Ok(())
    }

    /// The cheap read of the coordinator's own member record: if it dies, whoever succeeds
    /// it has timed that record already and ends its term at once.
    pub(super) async fn watch_coordinator(&mut self) {
        if let Some((_, client)) = &mut self.watching
            && let Err(e) = client.observe().await
        {
            debug!(error = %e, "could not read the coordinator's member record");
        }
    }

    /// Reads the plan. A member takes it only if it is the one `announced` (version and
    /// coordinator term), else it keeps the last and reads again at its next look; the
    /// coordinator takes any (as the previous plan, a hint). A damaged plan is kept out (the
    /// coordinator writes over it).
    async fn read_plan(&mut self, announced: Option<(u64, u64)>) -> Result<(), Error> {
        let name = self.names.plan().clone();
        let found = self.get(&name, "reading the plan").await?;
        if let Some(leading) = &mut self.leading {
            leading.revision = found.as_ref().map(|(_, r)| r.clone());
            leading.checked = Instant::now();
        }
        let Some((bytes, _)) = found else {
            return Ok(());
        };
        let plan = match Plan::decode(&name, &bytes) {
            Ok(plan) => plan,
            Err(e) => {
                warn!(error = %e, "the plan cannot be read; keeping the last one");
                return Ok(());
            }
        };
        self.max_version = self.max_version.max(plan.version);
        if announced.is_some_and(|(v, t)| plan.version != v || plan.term != t) {
            debug!(
                version = plan.version,
                "the plan is not the one announced yet; reading it again at the next look"
            );
            return Ok(());
        }
        debug!(version = plan.version, members = plan.members.len(), by = %plan.by, "read the plan");
        self.max_ttl = self.max_ttl.max(Duration::from_millis(plan.ttl_ms));
        self.plan = Some(plan);
        self.saw_plan(announced.is_some());
        Ok(())
    }

    async fn start_leading(&mut self, grant: Grant, announced: u64) {
        info!(term = %grant.token, "became the coordinator");
        self.leading = Some(Leading {
            grant,
            revision: None,
            announced,
            checked: Instant::now(),
            retry_at: None,
            unclaimed_since: BTreeMap::new(),
            pinned: BTreeMap::new(),
        });
        // The previous coordinator's record, timed while it coordinated: a peer from now on.
        if let Some((id, client)) = self.watching.take() {
            let term = self.last_token.get(&id).copied().unwrap_or(0);
            self.peers.insert(id, Peer::new(client, term, self.n));
        }
        if let Err(e) = self.read_plan(None).await {
            debug!(error = %e, "could not read the plan; writing a new one");
        }
    }

    /// Gives up the coordinator lease, if held (a successor takes over at once).
    pub(super) async fn stop_leading(&mut self) {
        if self.leading.take().is_some()
            && let Err(e) = self.coord.release().await
        {
            debug!(error = %e, "could not release the coordinator lease; it expires");
        }
    }

    /// Whether the plan in hand is announced: always for a member (it takes only announced
    /// plans), for the coordinator once its lease announces the plan's version.
    pub(super) fn plan_announced(&self) -> bool {
        self.leading
            .as_ref()
            .is_none_or(|l| self.plan.as_ref().is_some_and(|p| p.version == l.announced))
    }

    /// When a failed renew of the coordinator lease is tried again, if one is due.
    pub(super) fn coord_retry(&self) -> Option<Instant> {
        self.leading.as_ref().and_then(|l| l.retry_at)
    }

    /// Renews the coordinator lease, announcing the plan's version; gives up coordinating if
    /// the lease was lost. A failed renew is tried again soon, while the lease lasts: one
    /// failed write must not cost the coordinator its lease (its successor would plan afresh).
    pub(super) async fn renew_coord(&mut self) {
        let version = self.plan.as_ref().map_or(0, |p| p.version);
        if let Err(e) = self.coord.set_metadata(plan_metadata(version)) {
            warn!(error = %e, "cannot announce the plan's version");
        }
        let renewed = self.coord.renew().await;
        let rt = self.real(self.timing.request_timeout);
        let retry_at = Instant::now() + self.rng.duration(rt / 4, rt / 2);
        let Some(leading) = &mut self.leading else {
            return;
        };
        match renewed {
            Ok(Renewal::Renewed(grant)) => {
                leading.grant = grant;
                leading.announced = version;
                leading.retry_at = None;
                self.saw_plan(true);
            }
            Ok(Renewal::Lost { .. } | Renewal::Expired) => {
                warn!("the coordinator lease was lost; no longer coordinating");
                self.leading = None;
            }
            Err(e) => {
                debug!(error = %e, "could not renew the coordinator lease; trying again");
                leading.retry_at = (retry_at < leading.grant.deadline).then_some(retry_at);
            }
        }
    }

    /// The coordinator's look: the roster and every member, the terms that are over ended
    /// and pruned, and a new plan if the members or their claims call for one.
    pub(super) async fn coordinate(&mut self, m: &mut Membership) -> Result<(), Error> {
        let (roster, expected) = self.read_roster().await?;
        let absent = expected == Expected::Absent;
        if !self.enter_roster(m, roster.clone(), expected).await? && absent {
            // No roster, and this instance did not create one (yet): no plan names it.
            return Ok(());
        }
        // The roster's members, the last plan's, and the peers already known: a roster an
        // operator deleted loses nobody here.
        let mut ids = roster.ids();
        if let Some(plan) = &self.plan {
            ids.extend(plan.members.iter().map(|s| s.id.clone()));
        }
        ids.extend(self.peers.keys().cloned());
        ids.sort();
        ids.dedup();
        ids.retain(|id| *id != self.me);
        self.look_at_peers(m, &ids).await;
        if m.over {
            return Ok(());
        }
        self.tend_roster(m, &roster).await;
        let live = self.planned_members();
        let shared = self.shared();
        shared.publish(|a| a.members = live.len());
        self.pin_unclaimed(m, &live).await;
        self.publish_plan(m, &live, roster.created).await?;
        // A plan written but not announced yet (the renew that was to announce it failed, or
        // its write's answer was lost and a read found it landed): announce it now.
        let version = self.plan.as_ref().map(|p| p.version);
        if self
            .leading
            .as_ref()
            .is_some_and(|l| Some(l.announced) != version && l.retry_at.is_none())
        {
            self.renew_coord().await;
        }
        Ok(())
    }

    /// The members to plan for: this instance, every member live by its record, and every
    /// member of the last plan not read yet (a new coordinator's first look, or a read that
    /// failed), so that a read it has not made yet takes nobody's shards away.
    fn planned_members(&self) -> Vec<Seen> {
        let mut live: Vec<Seen> = vec![Seen {
            id: self.me.clone(),
            claims: self.claims(),
        }];
        let planned = |id: &HolderId| self.plan.as_ref().is_some_and(|p| p.share_of(id).is_some());
        live.extend(
            self.peers
                .iter()
                .filter(|(id, p)| p.live || (!p.read && planned(id)))
                .map(|(id, p)| Seen {
                    id: id.clone(),
                    claims: p.claims.clone(),
                }),
        );
        live.sort_by(|a, b| a.id.cmp(&b.id));
        live
    }

    /// Rule 2.1, for the coordinator: the cheap read of every other member's record in `ids`,
    /// who is live (held by it, changed within the longer of its ttl and ours on our clock),
    /// in which term, what it claims.
    async fn look_at_peers(&mut self, m: &mut Membership, ids: &[HolderId]) {
        for id in ids {
            if !self.stay(m).await {
                return;
            }
            if !self.peers.contains_key(id) {
                let Ok(client) = self.peer_client(id) else {
                    continue;
                };
                let term = self.last_token.get(id).copied().unwrap_or(0);
                self.peers
                    .insert(id.clone(), Peer::new(client, term, self.n));
            }
            let Some(peer) = self.peers.get_mut(id) else {
                continue;
            };
            let observed = peer.client.observe().await;
            if let Ok(Some(s)) = &observed {
                if s.record.holder == *id {
                    self.raise_term(id, s.record.token.0);
                }
                self.max_ttl = self.max_ttl.max(s.record.ttl);
            }
            let own_ttl = self.timing.ttl;
            let observer_only = self.planted(ShardFlaw::ObserverTtl);
            let n = self.n;
            let real = self.clock;
            let Some(peer) = self.peers.get_mut(id) else {
                continue;
            };
            match observed {
                Ok(found) => {
                    let held_by_it = found
                        .as_ref()
                        .is_some_and(|s| s.record.is_held() && s.record.holder == *id);
                    // The member renews by its own ttl: judged by ours alone, a member with a
                    // longer one would flicker out of the plan at every renew.
                    let ttl = match &found {
                        Some(s) if !observer_only => own_ttl.max(s.record.ttl),
                        _ => own_ttl,
                    };
                    let fresh = peer.client.expiry_model() == ExpiryModel::EnforcedByStore
                        || peer
                            .client
                            .observed()
                            .is_some_and(|(_, since)| since.elapsed() < real.real(ttl));
                    peer.read = true;
                    peer.live = held_by_it && fresh;
                    if let Some(s) = found.as_ref().filter(|_| held_by_it) {
                        peer.term = s.record.token.0;
                    }
                    peer.claims = found
                        .as_ref()
                        .filter(|_| held_by_it)
                        .and_then(|s| claims_of(n, &s.record.metadata))
                        .unwrap_or_else(|| ShardSet::new(n));
                }
                // Unknown: keep what was seen.
                Err(e) => debug!(member = %id, error = %e, "could not read a member's record"),
            }
        }
    }

    /// Keeps the roster true: ends the terms of members that look dead (rule 3.2: after a ttl
    /// unchanged, their record taken over and released) and removes the entries whose term is
    /// over, so that it does not grow with every instance that ever ran; and lists the live
    /// members it lacks in their current term (after an operator deleted it, say), so that
    /// every taker sees their claims. An entry names a membership term: a member that came
    /// back in a new term wrote its entry again, so a prune decided from an earlier look
    /// (conditional on that roster) cannot remove it.
    async fn tend_roster(&mut self, m: &mut Membership, roster: &Roster) {
        let by_id = self.planted(ShardFlaw::PruneById);
        // The roster's entries, and the peers it does not list (by their last term seen).
        let mut judged: Vec<Entry> = roster.members.clone();
        judged.extend(
            self.peers
                .iter()
                .filter(|(id, _)| !roster.lists_id(id))
                .map(|(id, p)| Entry {
                    id: id.clone(),
                    term: p.term,
                    ttl_ms: 0,
                }),
        );
        let mut gone = Vec::new();
        let mut cache = HashMap::new();
        for entry in judged {
            let looks_dead =
                entry.id != self.me && self.peers.get(&entry.id).is_some_and(|p| !p.live && p.read);
            if !looks_dead {
                continue;
            }
            if !self.stay(m).await {
                return;
            }
            // The term to judge: the entry's own; with the planted flaw, the member's latest
            // as one read shows it (the review's finding F2).
            let term = if by_id {
                self.latest_term(&entry.id).await.unwrap_or(entry.term)
            } else {
                entry.term
            };
            if self.is_over(&mut cache, m, &entry.id, term).await {
                gone.push(entry);
            }
        }
        // Peers the roster does not list whose term is over: forgotten.
        for e in &gone {
            if !roster.members.contains(e) {
                self.peers.remove(&e.id);
            }
        }
        gone.retain(|e| roster.members.contains(e));
        // A lagging read may show a member's earlier term: never list it back in one older
        // than the latest known of it. Only ids the roster lists in no term: an entry of an
        // earlier term is replaced by its member, which reads it first, so that the later
        // term of an id never hides the earlier one from the process that began it (once the
        // earlier term is over, the prune removes its entry and the next look lists the id).
        let missing: Vec<Entry> = self
            .peers
            .iter()
            .filter(|(id, p)| {
                p.live
                    && p.term >= self.last_token.get(*id).copied().unwrap_or(0)
                    && !roster.lists_id(id)
            })
            .map(|(id, p)| Entry {
                id: id.clone(),
                term: p.term,
                ttl_ms: 0,
            })
            .collect();
        if gone.is_empty() && missing.is_empty() {
            return;
        }
        self.rewrite_roster(m, &gone, &missing, by_id).await;
    }

    /// Removes the entries `gone` from the roster and lists `missing`, by one conditional
    /// write on the roster as it is now.
    async fn rewrite_roster(
        &mut self,
        m: &mut Membership,
        gone: &[Entry],
        missing: &[Entry],
        by_id: bool,
    ) {
        let name = self.names.roster().clone();
        let Ok(Some((bytes, revision))) = self.get(&name, "reading the roster").await else {
            return;
        };
        let Ok(mut now) = Roster::decode(&name, &bytes) else {
            return;
        };
        if by_id {
            now.members.retain(|e| !gone.iter().any(|g| g.id == e.id));
        } else {
            now.members.retain(|e| !gone.contains(e));
        }
        for e in missing {
            if !now.lists_id(&e.id) {
                let ttl = self.max_ttl;
                now.enter(&e.id, e.term, ttl);
            }
        }
        if let Ok(Put::Written(_)) = self
            .put(m, &name, &Expected::Revision(revision), &now.encode())
            .await
        {
            info!(
                removed = gone.len(),
                listed = missing.len(),
                "the roster: removed members whose term is over, listed live ones it lacked"
            );
            for e in gone {
                if !now.lists_id(&e.id) {
                    self.peers.remove(&e.id);
                }
            }
        }
    }

    /// The term of `id`'s record as a linearizable read shows it, if held by it.
    async fn latest_term(&mut self, id: &HolderId) -> Option<u64> {
        let read = within(
            self.real(self.timing.request_timeout),
            self.leases.read(&self.names.member(id)),
        )
        .await;
        match read {
            Ok(Ok(Some(s))) if s.record.holder == *id => Some(s.record.token.0),
            _ => None,
        }
    }

    /// Rule 8: a shard that no live member has claimed for a ttl is read; if its record names
    /// a live member's current term (held), it is planned to that member, which adopts it. (A
    /// write of a member's may land late, after a delete, naming a term that does not claim
    /// the shard: otherwise nobody would ever lead it, as no taker may end a live term.)
    async fn pin_unclaimed(&mut self, m: &mut Membership, live: &[Seen]) {
        let mut claimed = ShardSet::new(self.n);
        for member in live {
            claimed.union_with(&member.claims);
        }
        let wait = self.wait_ttl();
        let terms: BTreeMap<HolderId, u64> = live
            .iter()
            .map(|s| {
                let term = if s.id == self.me {
                    m.fence.token.0
                } else {
                    self.peers.get(&s.id).map_or(0, |p| p.term)
                };
                (s.id.clone(), term)
            })
            .collect();
        let no_net = self.planted(ShardFlaw::NoUnclaimedNet);
        let Some(leading) = &mut self.leading else {
            return;
        };
        let now = Instant::now();
        leading.unclaimed_since.retain(|s, _| !claimed.contains(*s));
        leading
            .pinned
            .retain(|s, id| !claimed.contains(*s) && terms.contains_key(id));
        for s in (0..self.n).filter(|s| !claimed.contains(*s)) {
            leading.unclaimed_since.entry(s).or_insert(now);
        }
        if no_net {
            return;
        }
        let due: Vec<u32> = leading
            .unclaimed_since
            .iter()
            .filter(|(s, since)| since.elapsed() >= wait && !leading.pinned.contains_key(s))
            .map(|(s, _)| *s)
            .take(PIN_READS)
            .collect();
        for s in due {
            let name = self.names.shard(s);
            let Ok(Some((bytes, _))) = self.get(&name, "reading an unclaimed shard").await else {
                continue;
            };
            let Ok(r) = ShardRecord::decode(&name, &bytes) else {
                continue;
            };
            let names_live_term =
                r.state == ShardState::Held && terms.get(&r.owner).is_some_and(|t| *t == r.member);
            if let Some(leading) = &mut self.leading {
                if names_live_term {
                    info!(shard = s, owner = %r.owner, "an unclaimed shard's record names a live term; planning it to its owner");
                    leading.pinned.insert(s, r.owner);
                } else {
                    // Read: it waits another ttl before it is read again.
                    leading.unclaimed_since.insert(s, Instant::now());
                }
            }
        }
    }

    /// Whether the plan object is still the one last read or written, read once per renew
    /// period while the plan does not change (an operator may delete it; a late write of an
    /// earlier coordinator may replace it).
    async fn plan_in_place(&mut self) -> bool {
        let every = self.real(self.timing.renew_every);
        let Some(leading) = &self.leading else {
            return false;
        };
        if leading.revision.is_none() {
            return false;
        }
        if leading.checked.elapsed() < every {
            return true;
        }
        let name = self.names.plan().clone();
        let Ok(found) = self.get(&name, "checking the plan").await else {
            return true; // unknown: looked at again next time
        };
        let Some(leading) = &mut self.leading else {
            return false;
        };
        leading.checked = Instant::now();
        let now = found.map(|(_, r)| r);
        if now == leading.revision {
            return true;
        }
        debug!("the plan object changed or vanished; writing it again");
        // Replaced: read what is there (its version, and whether a later coordinator term
        // wrote it: then this one stands down).
        if now.is_some() {
            let term = leading.grant.token.0;
            if self.read_plan(None).await.is_ok()
                && self.plan.as_ref().is_some_and(|p| p.term > term)
            {
                info!("a later coordinator wrote the plan; no longer coordinating");
                self.leading = None;
                self.coord.end_term("a later coordinator wrote the plan");
            }
        } else if let Some(leading) = &mut self.leading {
            leading.revision = None;
        }
        false
    }

    /// Writes a new plan if it differs from the last one (or is no longer in the store), and
    /// publishes its version.
    async fn publish_plan(
        &mut self,
        m: &mut Membership,
        live: &[Seen],
        roster: u64,
    ) -> Result<(), Error> {
        let Some(leading) = &self.leading else {
            return Ok(());
        };
        let term = leading.grant.token.0;
        let previous = self.plan.as_ref().map(Plan::shares).unwrap_or_default();
        let shares = allot(self.n, live, &previous, &leading.pinned);
        let members: Vec<Share> = live
            .iter()
            .zip(&shares)
            .map(|(s, set)| Share {
                id: s.id.clone(),
                shards: set.encode(),
            })
            .collect();
        let ttl_ms = u64::try_from(self.max_ttl.as_millis()).unwrap_or(u64::MAX);
        let settled = !self.roster_gap_open();
        // Unchanged, written in this coordinator term, and still in the store.
        let unchanged = self.plan.as_ref().is_some_and(|p| {
            p.members == members
                && p.roster == roster
                && p.term == term
                && p.ttl_ms == ttl_ms
                && p.settled == settled
        });
        if unchanged && self.plan_in_place().await {
            return Ok(());
        }
        let Some(leading) = &self.leading else {
            return Ok(());
        };
        let version = self
            .max_version
            .max(self.plan.as_ref().map_or(0, |p| p.version))
            + 1;
        let plan = Plan {
            v: 1,
            version,
            shards: self.n,
            by: self.me.clone(),
            term,
            roster,
            members,
            ttl_ms,
            settled,
        };
        let expected = match &leading.revision {
            Some(r) => Expected::Revision(r.clone()),
            None => Expected::Absent,
        };
        let name = self.names.plan().clone();
        match self.put(m, &name, &expected, &plan.encode()).await? {
            Put::Written(revision) => {
                debug!(version, members = live.len(), "wrote a new plan");
                if let Some(leading) = &mut self.leading {
                    leading.revision = Some(revision);
                    leading.checked = Instant::now();
                }
                self.max_version = version;
                self.plan = Some(plan);
            }
            Put::Conflict | Put::Unknown => {
                // Someone else wrote it (another coordinator, or our late write): read it,
                // and stand down if a later coordinator term wrote it.
                self.read_plan(None).await?;
                if self.plan.as_ref().is_some_and(|p| p.term > term) {
                    info!("a later coordinator wrote the plan; no longer coordinating");
                    self.leading = None;
                    self.coord.end_term("a later coordinator wrote the plan");
                }
            }
        }
        Ok(())
    }
}

/// The coordinator lease's metadata: the plan version it stands for.
fn plan_metadata(version: u64) -> Metadata {
    Metadata::from([(META_PLAN.to_owned(), version.to_string())])
}
