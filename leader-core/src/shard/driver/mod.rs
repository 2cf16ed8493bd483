//! The task of one sharded instance: its membership term, takeovers and releases by the
//! coordinator's plan, and (in `coord`) the coordinator's own work when this instance holds the
//! coordinator lease. The rules are in `docs/sharding.md`; each step below names the rule it
//! keeps.

mod coord;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use super::plan::Plan;
use super::records::{
    HistoryMark, Names, Roster, ShardRecord, ShardSet, ShardState, claims_metadata, claims_of,
};
use super::{Assignment, ShardFlaw, Shared};
use crate::backend::{
    Backoff, Expected, ExpiryModel, Fence, FencedCas, FencedPut, LeaseBackend, ObjectWrite,
    Revision, Stored, within,
};
use crate::clock::Anchor;
use crate::config::{ClockRate, Timing};
use crate::elector::{ElectorTask, Problem, is_permanent};
use crate::error::{Error, ErrorKind};
use crate::lease::{Acquisition, Grant, LeaseClient, Renewal};
use crate::model::{HolderId, ObjectName};
use crate::rand::{Rng, stable_hash};
use crate::term::{TermDeadline, TermSlot, term_over};
use crate::token::FencingToken;

/// At most this many shards are taken in one poll, so that a poll stays short next to the
/// renew period.
const BATCH: usize = 256;

/// At most this many ended membership terms are remembered (then forgotten at once; they
/// are judged again from the store).
const ENDED_KEPT: usize = 10_000;

/// How soon to look again while a released shard's work has not confirmed it stopped.
const RELEASE_CHECK: Duration = Duration::from_millis(20);

pub(crate) struct Parts {
    pub(crate) leases: Arc<dyn LeaseBackend>,
    pub(crate) objects: Arc<dyn FencedCas>,
    pub(crate) names: Names,
    pub(crate) shards: u32,
    pub(crate) holder: HolderId,
    pub(crate) member: LeaseClient,
    pub(crate) tokens: LeaseClient,
    pub(crate) coord: LeaseClient,
    pub(crate) timing: Timing,
    pub(crate) clock: ClockRate,
    pub(crate) rng: Rng,
    pub(crate) flaw: ShardFlaw,
}

/// Another member as this instance sees it, through its own client of that member's key
/// (holder: this instance), which times the record for the observed-time rule and, when the
/// member is dead, takes its record over to end its term.
#[derive(Debug)]
struct Peer {
    client: LeaseClient,
    /// Its record is held by it and changed within a ttl on our clock.
    live: bool,
    /// Read at least once.
    read: bool,
    /// Its membership term as last read held by it.
    term: u64,
    claims: ShardSet,
}

impl Peer {
    /// A member not read yet, last seen in membership term `term`.
    fn new(client: LeaseClient, term: u64, n: u32) -> Self {
        Self {
            client,
            live: false,
            read: false,
            term,
            claims: ShardSet::new(n),
        }
    }
}

#[derive(Debug)]
enum State {
    /// Written, not yet published in a successful renew: not acted on.
    Pending,
    /// Led: the receiver closes when every `Term` of it is dropped.
    Acting(mpsc::Receiver<()>),
    /// Being released; `None` once no work of it can be running.
    Releasing(Option<mpsc::Receiver<()>>),
}

#[derive(Debug)]
struct Owned {
    token: u64,
    revision: Revision,
    state: State,
    /// Taken from an absent record: its term begins only if, after the renew that publishes
    /// it, no other live member claims it (rule 1e).
    from_absent: bool,
}

/// The membership term this instance holds.
struct Membership {
    grant: Grant,
    fence: Fence,
    cancel: CancellationToken,
    deadline: watch::Sender<TermDeadline>,
    next_renew: Instant,
    /// Ended (by `end_membership`): the driver goes back to joining.
    over: bool,
}

enum End {
    Shutdown,
    Over,
    Failed(Problem),
}

#[derive(Debug)]
pub(crate) struct Driver {
    leases: Arc<dyn LeaseBackend>,
    objects: Arc<dyn FencedCas>,
    names: Names,
    n: u32,
    me: HolderId,
    member: LeaseClient,
    /// The `P.tokens` lease, whose terms' tokens are the shard tokens.
    tokens: LeaseClient,
    /// A release of the token lease failed: it may still be ours.
    tokens_held: bool,
    /// The coordinator lease (`P.coord`), campaigned for by every member.
    coord: LeaseClient,
    /// While this instance coordinates: its coordinator term and what it has seen.
    leading: Option<coord::Leading>,
    /// While another instance coordinates: the client that times its membership record, so
    /// that a successor can end its term at once if it dies.
    watching: Option<(HolderId, LeaseClient)>,
    /// The last plan read (or written, when coordinating).
    plan: Option<Plan>,
    /// The highest plan version seen: a new plan is numbered above it.
    max_version: u64,
    /// The membership term and roster (its creation mark) this instance is listed in, and
    /// since when.
    listed: Option<(u64, u64, Instant)>,
    timing: Timing,
    clock: ClockRate,
    rng: Rng,
    flaw: ShardFlaw,
    peers: BTreeMap<HolderId, Peer>,
    owned: BTreeMap<u32, Owned>,
    /// Shards of an ended membership term of ours, to take back first (rule 6).
    intend: ShardSet,
    /// Shards whose write naming us had an unknown outcome (it may land late), with the
    /// condition it was sent with: while the record still meets it, the write may land.
    uncertain: BTreeMap<u32, Expected>,
    /// Writes of ours with an unknown outcome that another live member claims: watched as
    /// `uncertain` is, not published.
    unpublished: BTreeMap<u32, Expected>,
    /// Shards whose record names our membership term, whose adoption failed: tried again.
    adopt_retry: ShardSet,
    /// Shards taken from absent records, read back after the renew that published them,
    /// whose claims check (rule 1e) is still to be made: at the next look, where a renew can
    /// come between its reads (made right after the renew, it could hold up the next one).
    recheck: ShardSet,
    /// When adoptions are tried again next.
    adopt_due: Instant,
    /// When the shard records are looked at next while the roster cannot be trusted.
    gap_look_due: Instant,
    highest: u64,
    /// The creation mark of the roster this instance last read.
    roster_seen: Option<u64>,
    /// Whether that read found no roster (its mark was drawn by this instance).
    roster_absent: bool,
    /// Since when this instance, which has not seen a roster yet, has found none beside a
    /// history mark (another instance may be creating the first one).
    create_held: Option<Instant>,
    /// The history mark this instance wrote naming the roster it then created, with the
    /// mark's revision, while that roster's write has an unknown outcome: a late landing,
    /// after a delete, would pass for the key's first roster, so the mark is voided before
    /// this instance writes another roster.
    mark_to_void: Option<(u64, Revision)>,
    /// This instance's last write of a new roster has an unknown outcome: seen later, that
    /// roster may have landed after others were written and deleted, so it is not trusted.
    created_unknown: bool,
    /// The roster was written again after a delete (or first seen on a key with a history):
    /// `Some(None)` until a plan naming it was seen, then since when (rule 3.2).
    roster_gap: Option<Option<Instant>>,

    /// The highest membership token seen per member: names its latest term.
    last_token: HashMap<HolderId, u64>,
    /// The longest ttl seen in a member record.
    max_ttl: Duration,
    /// Clients of members' records for ending their terms (rule 3.2), by member.
    reapers: HashMap<HolderId, LeaseClient>,
    /// Membership terms `(member, token)` known to be over.
    ended: HashSet<(HolderId, u64)>,
    /// The membership terms this process has held.
    my_terms: HashSet<u64>,
    /// Membership terms `(member, token)` whose record a linearizable read showed absent (an
    /// operator deleted it), and since when: such a term counts as over only a ttl later.
    /// Keyed by term, so that a member that came back and was deleted again is timed anew.
    absent: HashMap<(HolderId, u64), Instant>,
    /// Membership terms `(member, token)` whose member's record a linearizable read showed in
    /// a later term of the same id, and since when: over a ttl later (rule 3.2). Not reset by
    /// a later read (the record is there: it is the later term that was seen).
    superseded: HashMap<(HolderId, u64), Instant>,
    shared: Option<Arc<Shared>>,
}

impl Driver {
    pub(crate) fn new(p: Parts) -> Self {
        Self {
            intend: ShardSet::new(p.shards),
            uncertain: BTreeMap::new(),
            unpublished: BTreeMap::new(),
            adopt_retry: ShardSet::new(p.shards),
            recheck: ShardSet::new(p.shards),
            adopt_due: Instant::now(),
            gap_look_due: Instant::now(),
            leases: p.leases,
            objects: p.objects,
            names: p.names,
            n: p.shards,
            me: p.holder,
            member: p.member,
            tokens: p.tokens,
            tokens_held: false,
            coord: p.coord,
            leading: None,
            watching: None,
            plan: None,
            max_version: 0,
            listed: None,
            timing: p.timing,
            clock: p.clock,
            rng: p.rng,
            flaw: p.flaw,
            peers: BTreeMap::new(),
            owned: BTreeMap::new(),
            highest: 0,
            absent: HashMap::new(),
            superseded: HashMap::new(),
            reapers: HashMap::new(),
            last_token: HashMap::new(),
            roster_seen: None,
            roster_absent: false,
            create_held: None,
            mark_to_void: None,
            created_unknown: false,
            roster_gap: None,

            max_ttl: p.timing.ttl,
            ended: HashSet::new(),
            my_terms: HashSet::new(),
            shared: None,
        }
    }

    pub(crate) fn timing(&self) -> &Timing {
        &self.timing
    }

    pub(crate) fn start(mut self) -> (Arc<Shared>, ElectorTask) {
        let (tx, _) = watch::channel(Assignment::default());
        let shared = Arc::new(Shared {
            tick: self
                .clock
                .real(self.timing.margin / 2)
                .max(Duration::from_millis(1)),
            key: self.names.key().clone(),
            holder: self.me.clone(),
            shards: self.n,
            shutdown: CancellationToken::new(),
            slots: Mutex::new(BTreeMap::new()),
            tx,
            shards_led: crate::metrics::shards_led(self.names.key(), &self.me, &*self.leases),
            answered: self.member.store_contact(),
        });
        self.shared = Some(shared.clone());
        let span =
            info_span!("sharded", key = %shared.key, holder = %shared.holder, shards = self.n);
        (shared, Box::pin(self.run().instrument(span)))
    }

    fn shared(&self) -> Arc<Shared> {
        // Set by `start`, before the task runs.
        self.shared.clone().unwrap_or_else(|| {
            let (tx, _) = watch::channel(Assignment::default());
            Arc::new(Shared {
                tick: Duration::from_millis(1),
                key: self.names.key().clone(),
                holder: self.me.clone(),
                shards: self.n,
                shutdown: CancellationToken::new(),
                slots: Mutex::new(BTreeMap::new()),
                tx,
                shards_led: ::metrics::Gauge::noop(),
                answered: self.member.store_contact(),
            })
        })
    }

    fn real(&self, d: Duration) -> Duration {
        self.clock.real(d)
    }

    async fn run(mut self) {
        let shared = self.shared();
        let _guard = Guard(shared.clone());
        let problem = loop {
            let m = match self.join().await {
                Ok(Some(m)) => m,
                Ok(None) => break None,
                Err(p) => break Some(p),
            };
            match self.serve(m).await {
                End::Shutdown => break None,
                End::Over => {}
                End::Failed(p) => break Some(p),
            }
        };
        shared.publish(|a| {
            a.member = false;
            a.stopped = Some(problem);
        });
        info!("sharded instance stopped");
    }

    /// The set this instance claims: what it owns, what it means to take back, and what a
    /// write of ours may still make ours (an unknown outcome, or an adoption to retry).
    fn claims(&self) -> ShardSet {
        let mut set = self.intend.clone();
        set.union_with(&self.adopt_retry);
        for s in self.owned.keys().chain(self.uncertain.keys()) {
            set.insert(*s);
        }
        set
    }

    /// Takes a membership term (a new one: a restart, or after the last one ended).
    async fn join(&mut self) -> Result<Option<Membership>, Problem> {
        let shared = self.shared();
        self.stop_leading().await;
        let retry = self.real(self.timing.retry_every);
        let mut backoff = Backoff::new(retry / 4, retry).pauses();
        loop {
            if shared.shutdown.is_cancelled() {
                return Ok(None);
            }
            self.member
                .set_metadata(claims_metadata(&self.claims()))
                .map_err(|e| Problem {
                    kind: ErrorKind::InvalidConfig,
                    message: e.to_string(),
                })?;
            let anchor = Anchor::now();
            let wait = match self.member.try_acquire().await {
                Ok(Acquisition::Acquired(grant)) => return Ok(Some(self.begin(grant, anchor))),
                Ok(Acquisition::Following { takeover_at, .. }) => {
                    // Our id's record, held by an earlier process or a taker: wait as anyone.
                    backoff.reset();
                    let poll = Instant::now() + self.real(self.timing.poll_every);
                    takeover_at.map_or(poll, |t| t.min(poll))
                }
                Err(e) if is_permanent(&e) => {
                    warn!(error = %e, "could not join: this error needs a person (not retried)");
                    return Err(Problem::from(&e));
                }
                Err(e) => {
                    debug!(error = %e, "could not take the membership lease; backing off");
                    shared.publish(|a| a.problem = Some(Problem::from(&e)));
                    Instant::now() + backoff.next(&mut self.rng)
                }
            };
            tokio::select! {
                biased;
                _ = shared.shutdown.cancelled() => return Ok(None),
                _ = sleep_until(wait) => {}
            }
        }
    }

    fn begin(&mut self, grant: Grant, anchor: Anchor) -> Membership {
        let shared = self.shared();
        self.my_terms.insert(grant.token.0);
        let cancel = CancellationToken::new();
        let (deadline, rx) = watch::channel(TermDeadline {
            at: grant.deadline,
            anchor,
        });
        tokio::spawn(watchdog(shared.clone(), grant.token, cancel.clone(), rx));
        let validity = self.real(self.timing.term_validity());
        let renew_every = self.real(self.timing.renew_every);
        info!(token = %grant.token, "membership term began");
        shared.publish(|a| {
            a.member = true;
            a.problem = None;
        });
        Membership {
            fence: Fence {
                key: self.member.key().clone(),
                holder: self.me.clone(),
                token: grant.token,
                lease_term: None,
            },
            next_renew: grant.deadline - validity + renew_every,
            grant,
            cancel,
            deadline,
            over: false,
        }
    }

    async fn serve(&mut self, mut m: Membership) -> End {
        let shared = self.shared();
        let poll = self.real(self.timing.poll_every);
        let mut next_poll = Instant::now();
        loop {
            let coord_retry = self.coord_retry();
            tokio::select! {
                biased;
                _ = shared.shutdown.cancelled() => {
                    self.leave(&mut m).await;
                    return End::Shutdown;
                }
                _ = sleep_until(m.grant.deadline) => {
                    self.end_membership(&mut m, "deadline passed without a successful renew");
                    return End::Over;
                }
                _ = m.cancel.cancelled() => {
                    self.end_membership(&mut m, "deadline passed (the host was suspended)");
                    return End::Over;
                }
                _ = sleep_until(m.next_renew) => {
                    if !self.renew(&mut m).await {
                        return End::Over;
                    }
                }
                _ = sleep_until(coord_retry.unwrap_or(next_poll)), if coord_retry.is_some() => {
                    self.renew_coord().await;
                }
                _ = sleep(self.real(RELEASE_CHECK)), if self.releasing() => {
                    // Released shards whose work has stopped: mark them released now, not at
                    // the next poll.
                    self.finish_releases(&mut m).await;
                    if m.over {
                        return End::Over;
                    }
                }
                _ = sleep_until(next_poll) => {
                    let looked = self.poll(&mut m).await;
                    if m.over {
                        return End::Over;
                    }
                    match looked {
                        Ok(()) => shared.publish(|a| a.problem = None),
                        Err(e) if is_permanent(&e) => {
                            warn!(error = %e, "stopping: this error needs a person (not retried)");
                            self.leave(&mut m).await;
                            return End::Failed(Problem::from(&e));
                        }
                        Err(e) => {
                            debug!(error = %e, "a look at the members failed; trying again");
                            shared.publish(|a| a.problem = Some(Problem::from(&e)));
                        }
                    }
                    next_poll = Instant::now() + self.rng.duration(poll * 9 / 10, poll * 11 / 10);
                }
            }
        }
    }

    /// Renews the membership, publishing the claimed set; starts the terms of shards taken
    /// since (rule 1: act only once the set that includes them is written; those taken from
    /// absent records after their claims check at the next look). Returns `false` when the
    /// membership term is over.
    async fn renew(&mut self, m: &mut Membership) -> bool {
        let mut published = self.claims();
        if let Err(e) = self.member.set_metadata(claims_metadata(&published)) {
            // Cannot happen within MAX_SHARDS; if it did, nothing new may begin (rule 1c).
            warn!(error = %e, "the claimed set does not fit the record; renewing without it");
            published = ShardSet::new(self.n);
        }
        let rt = self.real(self.timing.request_timeout);
        let mut backoff = Backoff::new(rt / 8, rt / 2).pauses();
        // Taken before the first attempt: a grant may come from any attempt's write (one whose
        // answer was lost), and a host suspend since must shorten it.
        let anchor = Anchor::now();
        loop {
            let renewal = tokio::select! {
                biased;
                _ = sleep_until(m.grant.deadline) => None,
                _ = m.cancel.cancelled() => None,
                r = self.member.renew() => Some(r),
            };
            match renewal {
                None | Some(Ok(Renewal::Expired)) => {
                    self.end_membership(m, "deadline passed before a renew succeeded");
                    return false;
                }
                Some(Ok(Renewal::Lost { .. })) => {
                    self.end_membership(m, "the membership record was taken over");
                    return false;
                }
                Some(Ok(Renewal::Renewed(grant))) => {
                    m.grant = grant;
                    m.deadline.send_replace(TermDeadline {
                        at: grant.deadline,
                        anchor,
                    });
                    let validity = self.real(self.timing.term_validity());
                    m.next_renew = grant.deadline - validity + self.real(self.timing.renew_every);
                    // Right after the membership: a coordinator lease that lapses means its
                    // holder's membership has lapsed too (a successor can end it at once).
                    if self.leading.is_some() {
                        self.renew_coord().await;
                    }
                    self.activate(m, &published).await;
                    return true;
                }
                Some(Err(e)) => {
                    warn!(error = %e, "membership renew failed; retrying before the deadline");
                    let wait = Instant::now() + backoff.next(&mut self.rng);
                    tokio::select! {
                        biased;
                        _ = sleep_until(m.grant.deadline) => {}
                        _ = m.cancel.cancelled() => {}
                        _ = sleep_until(wait) => {}
                    }
                }
            }
        }
    }

    /// Whether a released shard waits for its work to stop, or for its record to be marked.
    fn releasing(&self) -> bool {
        self.owned
            .values()
            .any(|o| matches!(o.state, State::Releasing(_)))
    }

    /// Renews now if a renew is due, so that a long batch of store calls (a slow or busy
    /// store) never starves the membership. `false` once the membership term is over.
    async fn stay(&mut self, m: &mut Membership) -> bool {
        if !m.over && Instant::now() >= m.next_renew {
            self.renew(m).await;
        }
        !m.over
    }

    /// Starts a term for every pending shard in `published` whose record reads back as written
    /// (rule 1d); those taken from absent records wait for their claims check at the next
    /// look (rule 1e, [`recheck_absent_takes`](Self::recheck_absent_takes)).
    async fn activate(&mut self, m: &Membership, published: &ShardSet) {
        // Rule 1d: the record must still be the one we wrote now that the set naming the
        // shard is published. An operator's delete between our write and that renew would
        // let another instance take the shard without seeing our claim; a record read back
        // after the renew closes that window (the other taker reads claims after the record,
        // so it sees ours, or we see its record or the absence here).
        let waiting: Vec<(u32, Revision)> = self
            .owned
            .iter()
            .filter(|(s, o)| matches!(o.state, State::Pending) && published.contains(**s))
            .map(|(s, o)| (*s, o.revision.clone()))
            .collect();
        let mut verified = ShardSet::new(self.n);
        let started = Instant::now();
        let budget = self.real(self.timing.renew_every) / 4;
        for (s, revision) in waiting {
            // A slow store: the rest stay pending, read back after the next renew.
            if started.elapsed() > budget {
                break;
            }
            let name = self.names.shard(s);
            match self.get(&name, "reading back a shard record").await {
                Ok(Some((_, now))) if now == revision => verified.insert(s),
                Ok(_) => {
                    warn!(
                        shard = s,
                        "a shard record taken changed or vanished before its term began (an operator's delete?); not leading it"
                    );
                    self.owned.remove(&s);
                }
                // Not known: it stays pending until the next renew.
                Err(_) => {}
            }
        }
        // Rule 1e for those taken from absent records: at the next look.
        if !self.planted(ShardFlaw::NoClaimsRecheck) {
            let absent: Vec<u32> = verified
                .iter()
                .filter(|s| self.owned.get(s).is_some_and(|o| o.from_absent))
                .collect();
            for s in absent {
                verified.remove(s);
                self.recheck.insert(s);
            }
        }
        self.start_terms(m, &verified);
    }

    /// Rule 1e: a shard taken from an absent record begins only if, after the renew that
    /// published our claim, no other live member claims it. An absent record can be absent
    /// again after an operator's delete: our write, decided before, may have landed after
    /// another member took the shard and started acting (it published its claim before it
    /// acted, so we see it here). Such a shard is not led; it stays claimed, as a record of
    /// ours to adopt once nobody else claims it (rule 7). Unknown claims: it stays pending,
    /// checked again at the next look. Runs in a look, after the renew that published the
    /// shards (`activate` read them back then): a renew due meanwhile is made between reads.
    async fn recheck_absent_takes(&mut self, m: &mut Membership) {
        // Only shards still taken from an absent record and waiting (one released, or taken
        // again since, is not checked for an earlier take).
        let waiting = |o: Option<&Owned>| {
            o.is_some_and(|o| o.from_absent && matches!(o.state, State::Pending))
        };
        let stale: Vec<u32> = self
            .recheck
            .iter()
            .filter(|s| !waiting(self.owned.get(s)))
            .collect();
        for s in stale {
            self.recheck.remove(s);
        }
        // Nothing to check, or no complete set of claims to be had yet (rule 3.2).
        if self.recheck.is_empty() || self.roster_gap_pending() {
            return;
        }
        let pending = std::mem::replace(&mut self.recheck, ShardSet::new(self.n));
        let Some(claims) = self.claims_now(m).await.filter(|claims| claims.complete) else {
            if !m.over {
                self.recheck.union_with(&pending);
            }
            return;
        };
        if m.over {
            return;
        }
        // Still ours and waiting (not released, nor ended with the membership, meanwhile).
        let absent: Vec<u32> = pending
            .iter()
            .filter(|s| waiting(self.owned.get(s)))
            .collect();
        // The token lease as it is now: if a token was reserved after ours, another member
        // may have taken the shard, acted and released it (and an operator deleted the
        // record) before our write landed: our token would be below its.
        let last_reserved = self.last_reserved().await.flatten();
        let mut ok = ShardSet::new(self.n);
        for s in absent {
            let claimed = claims.of.iter().any(|(_, _, set)| set.contains(s));
            let later = !self.planted(ShardFlaw::NoTokenRecheck)
                && self.owned.get(&s).map(|o| o.token) != last_reserved;
            if claimed {
                warn!(
                    shard = s,
                    "another live member claims a shard taken from an absent record (an operator's delete met a late write); not leading it"
                );
            } else if later {
                debug!(
                    shard = s,
                    "a token was reserved after ours: adopting the shard with a new one"
                );
                self.adopt_due = Instant::now();
            }
            if claimed || later {
                self.owned.remove(&s);
                self.adopt_retry.insert(s);
            } else if let Some(o) = self.owned.get_mut(&s) {
                o.from_absent = false;
                ok.insert(s);
            }
        }
        self.start_terms(m, &ok);
    }

    fn start_terms(&mut self, m: &Membership, published: &ShardSet) {
        let shared = self.shared();
        let mut started = 0usize;
        {
            let mut slots = shared.slots();
            for (s, owned) in &mut self.owned {
                if !matches!(owned.state, State::Pending) || !published.contains(*s) {
                    continue;
                }
                let (alive, rx) = mpsc::channel(1);
                owned.state = State::Acting(rx);
                slots.insert(
                    *s,
                    TermSlot {
                        fence: Fence {
                            key: m.fence.key.clone(),
                            holder: self.me.clone(),
                            token: FencingToken(owned.token),
                            lease_term: Some(m.fence.token),
                        },
                        cancel: m.cancel.child_token(),
                        deadline: m.deadline.subscribe(),
                        alive,
                        handed_out: false,
                    },
                );
                started += 1;
            }
        }
        if started > 0 {
            info!(started, led = self.owned.len(), "began leading shards");
            shared.publish(|_| {});
        }
    }

    fn end_membership(&mut self, m: &mut Membership, why: &str) {
        if m.over {
            return;
        }
        m.over = true;
        let shared = self.shared();
        m.cancel.cancel();
        self.member.end_term(why);
        shared.slots().clear();
        let mut intend = ShardSet::new(self.n);
        for (s, o) in &self.owned {
            if !matches!(o.state, State::Releasing(_)) {
                intend.insert(*s);
            }
        }
        self.intend = intend;
        self.owned.clear();
        self.uncertain.clear();
        self.unpublished.clear();
        self.adopt_retry = ShardSet::new(self.n);
        self.recheck = ShardSet::new(self.n);
        warn!(
            why,
            shards = self.intend.len(),
            "membership term ended; every shard term with it"
        );
        shared.publish(|a| a.member = false);
    }

    /// One look: at the coordinator (and, coordinating, at every member), then one step
    /// towards the plan: release what it gives to others, take what it gives to us.
    async fn poll(&mut self, m: &mut Membership) -> Result<(), Error> {
        self.finish_releases(m).await;
        self.recheck_absent_takes(m).await;
        if m.over {
            return Ok(());
        }
        if !self.uncertain.is_empty() || !self.unpublished.is_empty() {
            self.check_uncertain(m).await;
        }
        if self.tokens_held {
            // Our own record: taken back at once, then released.
            if let Ok(Acquisition::Acquired(_)) = self.tokens.try_acquire().await
                && self.tokens.release().await.is_ok()
            {
                self.tokens_held = false;
            }
        }
        self.follow_coordinator().await?;
        if self.leading.is_some() {
            // A failed look of the coordinator's: the rest of the poll (releases and takes
            // by the plan in hand) goes on.
            match self.coordinate(m).await {
                Err(e) if is_permanent(&e) => return Err(e),
                Err(e) => debug!(error = %e, "the coordinator's look failed; trying again"),
                Ok(()) => {}
            }
        } else {
            self.watch_coordinator().await;
        }
        let joined = self.join_roster(m).await?;
        let Some(plan) = &self.plan else {
            return Ok(()); // no coordinator has planned yet: keep what we have
        };
        let members = plan.members.len();
        self.shared().publish(|a| a.members = members);
        // Not in the plan: the coordinator has not counted this membership term yet (it is
        // new, or about to be ended). Keep what we lead and take back only our own.
        let share = plan.share_of(&self.me);
        if let Some(share) = &share {
            // Rule 4: give up what the plan gives to others (released once its work stops).
            let surplus: Vec<u32> = self
                .owned
                .iter()
                .filter(|(s, o)| !share.contains(**s) && !matches!(o.state, State::Releasing(_)))
                .map(|(s, _)| *s)
                .collect();
            if !surplus.is_empty() {
                self.release_shards(&surplus);
                self.finish_releases(m).await;
            }
        }
        let share = share.unwrap_or_else(|| ShardSet::new(self.n));
        let candidates = self.candidates(&share);
        debug!(
            members,
            mine = self.owned.len(),
            planned = share.len(),
            candidates = candidates.len(),
            "balance"
        );
        // Not in the roster yet: others would not see our claims (rule 3.2), take nothing.
        if candidates.is_empty() || !joined {
            return Ok(());
        }
        // While the roster may lack a live member (rule 3.2), no take can be judged, but a
        // look still starts this instance's own clocks on the owners' terms (an absent or
        // unchanged record is timed from the first read) and settles claims of ours that
        // are not needed: once per renew period, not each poll (a fleet starting on a busy
        // store would otherwise read a batch of shard records per instance per poll).
        if self.roster_gap_pending() && !self.planted(ShardFlaw::IgnoreClaims) {
            let now = Instant::now();
            if now < self.gap_look_due {
                return Ok(());
            }
            self.gap_look_due = now + self.real(self.timing.renew_every);
        }
        self.take(m, candidates).await
    }

    /// The shards to try this poll, at most [`BATCH`]: of our own ended term first (rule 6),
    /// adoptions to retry (rule 7, once per renew period: another member's claim may block
    /// them for long), writes of ours whose outcome is unknown (tried again, so that a write
    /// that never lands does not leave the shard claimed and unled), then the plan's; each is
    /// taken only by the shard record's rules (rule 3).
    fn candidates(&mut self, share: &ShardSet) -> Vec<u32> {
        let now = Instant::now();
        let adopt = now >= self.adopt_due && !self.adopt_retry.is_empty();
        if adopt {
            self.adopt_due = now + self.real(self.timing.renew_every);
        }
        let mut seen = ShardSet::new(self.n);
        let mut candidates = Vec::new();
        let ordered = self
            .intend
            .iter()
            .chain(self.adopt_retry.iter().filter(|_| adopt))
            .chain(self.uncertain.keys().copied())
            .chain(share.iter());
        for s in ordered {
            if candidates.len() >= BATCH {
                break;
            }
            if !self.owned.contains_key(&s) && !seen.contains(s) {
                seen.insert(s);
                candidates.push(s);
            }
        }
        candidates
    }

    /// Reads the roster (a new one if there is none), refusing another shard count, and
    /// notes whether it was deleted and written again since the last read.
    async fn read_roster(&mut self) -> Result<(Roster, Expected), Error> {
        let name = self.names.roster().clone();
        let found = self.get(&name, "reading the roster").await?;
        let (roster, expected) = match found {
            Some((bytes, revision)) => {
                (Roster::decode(&name, &bytes)?, Expected::Revision(revision))
            }
            None => {
                // With the planted flaw, a roster written again takes the mark the history
                // mark names, and so passes for the key's first roster.
                let from_mark = match self.planted(ShardFlaw::RosterFromMark) {
                    true => self.mark().await.ok().flatten().and_then(|m| m.0),
                    false => None,
                };
                let roster = Roster {
                    v: 2,
                    shards: self.n,
                    members: Vec::new(),
                    created: from_mark.unwrap_or_else(|| self.creation_mark()),
                };
                (roster, Expected::Absent)
            }
        };
        if roster.shards != self.n {
            return Err(Error::InvalidConfig {
                message: format!(
                    "the sharded key {} has {} shards, this instance was started with {}; every \
                     instance of a key must use the same number (or use another key)",
                    self.names.key(),
                    roster.shards,
                    self.n
                ),
                source: None,
            });
        }
        // Every member's ttl: a wait for another member's term to end lasts the longest. And
        // every member's term as listed: an absence is timed for the latest (a member lists
        // each new term before it takes a shard).
        self.max_ttl = self.max_ttl.max(roster.longest_ttl());
        for e in &roster.members {
            self.raise_term(&e.id, e.term);
        }
        self.note_roster(&roster, &expected).await;
        Ok((roster, expected))
    }

    /// Notes a roster read: if it was deleted and written again (or this is a first look at
    /// a roster that may have been), takes wait until every live member has listed itself
    /// again (rule 3.2).
    async fn note_roster(&mut self, roster: &Roster, expected: &Expected) {
        let unknown = std::mem::take(&mut self.created_unknown);
        let recreated = match self.roster_seen {
            Some(created) => *expected == Expected::Absent || created != roster.created || unknown,
            // A first look, and no roster: whether this instance may create it, and whether
            // takes then wait, is decided when it writes it (`may_create_roster`).
            None if *expected == Expected::Absent => return,
            // A first look: this process cannot tell a roster written again after a delete
            // from one that never changed, unless the history mark names it (the key's first
            // roster) or the key shows no history at all.
            None => !self.first_roster(roster.created).await,
        };
        if recreated {
            // Deleted (an operator) and written again: until every live member has added
            // itself again, it does not list everyone whose claims matter (rule 3.2).
            // Found absent last time: most often the first writes of a fleet starting
            // together, but a write and a delete may have come between, so the gap opens all
            // the same; only the message differs.
            if self.roster_absent {
                debug!(
                    "the roster was absent at the last look; no shard changes hands until every live member has listed itself"
                );
            } else if self.roster_seen.is_some() {
                warn!(
                    "the roster was deleted; no shard changes hands until every live member lists itself again"
                );
            }
            self.roster_gap = Some(None);
            self.listed = None;
        }
        self.roster_seen = Some(roster.created);
        self.roster_absent = *expected == Expected::Absent;
        self.create_held = None;
        // The roster our mark names, seen there: it has landed, and cannot land again.
        if *expected != Expected::Absent && self.mark_to_void_roster() == Some(roster.created) {
            self.mark_to_void = None;
        }
        let announced = self.plan_announced();
        self.saw_plan(announced);
    }

    /// A creation mark for a roster this instance writes, never drawn twice for a key: it
    /// covers this instance's id and latest membership term (a member record's tokens never
    /// repeat), so that processes seeded alike (a fixed `jitter_seed`) draw different ones.
    fn creation_mark(&mut self) -> u64 {
        let term = self.my_terms.iter().max().copied().unwrap_or(0);
        let draw = self.rng.next_u64();
        stable_hash(&format!("{} {term} {draw}", self.me))
    }

    /// A first look at a roster that is there: whether it lists every live member at once.
    /// Yes if the history mark names it: its creator wrote the mark, on a key that showed no
    /// history, right before creating it, so it is the key's first roster and was never
    /// deleted (a roster written again draws a new creation mark), and every member that ever
    /// took a shard listed itself in it. On a key without a mark (an earlier build's, or one
    /// an operator deleted), yes only if nothing else shows a history either and this
    /// instance writes the mark now (naming no roster: for every other instance, a history).
    async fn first_roster(&mut self, created: u64) -> bool {
        match self.mark().await {
            Ok(Some((first, _))) => first == Some(created) && self.no_token_record().await,
            Ok(None) => {
                !self.other_history().await
                    && self.write_mark(&Expected::Absent, None).await.is_some()
            }
            Err(_) => false,
        }
    }

    /// A first look found no roster: whether this instance may create it now, and if so
    /// whether takes then wait (rule 3.2). On a key that shows no history, the instance whose
    /// history mark (naming the roster it is about to write) lands first creates it, and
    /// nobody waits; the others create nothing and read again at their next poll, when the
    /// roster is there. A mark already there means another instance is creating the first
    /// roster, or the roster was deleted: this instance waits a renew period for the first,
    /// then writes one itself, after which takes wait.
    async fn may_create_roster(&mut self, created: u64) -> bool {
        let gap = match self.mark().await {
            Err(_) => return false,
            Ok(Some((first, _))) if first == Some(created) => false,
            Ok(Some((first, revision))) => {
                let since = *self.create_held.get_or_insert_with(Instant::now);
                if since.elapsed() < self.real(self.timing.renew_every) {
                    return false;
                }
                // A mark that names a roster which is not there: its write may still land
                // (its writer gone or cut off) and must not pass for the first roster then,
                // so the mark names none before this instance writes another.
                let expected = Expected::Revision(revision);
                if first.is_some() && self.write_mark(&expected, None).await.is_none() {
                    return false; // tried again at the next poll
                }
                true
            }
            Ok(None) if self.other_history().await => {
                // A mark written meanwhile may name a roster: judged at the next poll.
                if self.write_mark(&Expected::Absent, None).await.is_none() {
                    return false;
                }
                true
            }
            Ok(None) => {
                let Some(revision) = self.write_mark(&Expected::Absent, Some(created)).await else {
                    return false;
                };
                self.mark_to_void = Some((created, revision));
                false
            }
        };
        if gap {
            debug!(
                "no roster on a key with a history: creating one; no shard changes hands until every live member has listed itself"
            );
            self.roster_gap = Some(None);
            self.listed = None;
        }
        self.roster_seen = Some(created);
        self.roster_absent = true;
        self.create_held = None;
        true
    }

    /// The history mark, if there: the first roster it names, if any, and its revision.
    async fn mark(&mut self) -> Result<Option<(Option<u64>, Revision)>, Error> {
        let name = self.names.history().clone();
        let found = self.get(&name, "reading the history mark").await?;
        Ok(found.map(|(bytes, revision)| (HistoryMark::first_roster(&bytes), revision)))
    }

    /// The token of the token lease's record, the last one reserved (`Some(None)`: no
    /// record; `None`: not known).
    async fn last_reserved(&mut self) -> Option<Option<u64>> {
        let limit = self.real(self.timing.request_timeout);
        match within(limit, self.leases.read(self.names.tokens())).await {
            Ok(Ok(stored)) => Some(stored.map(|s| s.record.token.0)),
            _ => None,
        }
    }

    /// Whether the token lease has no record: no token was ever reserved for the key, so no
    /// shard record was ever taken (unless an operator deleted it, or on etcd and ZooKeeper a
    /// reserver died holding it, which removes the record with its term). Not known: no.
    async fn no_token_record(&mut self) -> bool {
        self.last_reserved().await == Some(None)
    }

    /// Whether anything but the history mark shows that the key has a history: a plan, or a
    /// record of its token lease. Not known: yes. (The token lease alone may be absent for a
    /// moment on etcd and ZooKeeper, whose leases vanish with their term, so the mark, which
    /// no instance removes, decides where it is there.)
    async fn other_history(&mut self) -> bool {
        if self.plan.is_some() || self.max_version > 0 {
            return true;
        }
        !self.no_token_record().await
    }

    /// Writes the history mark if it is as `expected`, naming `first_roster`: its revision if
    /// this write put it there, or if its answer was lost and a read shows the mark as it was
    /// to be written (none if another instance's came first, or the outcome is not known).
    async fn write_mark(
        &mut self,
        expected: &Expected,
        first_roster: Option<u64>,
    ) -> Option<Revision> {
        let name = self.names.history().clone();
        let fence = Fence::new(self.names.key().clone(), self.me.clone(), FencingToken(0));
        let value = HistoryMark::encode(first_roster);
        let put = FencedPut::new(&fence, &name, expected, &value).without_lease_check();
        let limit = self.real(self.timing.request_timeout);
        match within(limit, self.objects.put_fenced_if(put)).await {
            Ok(Ok(ObjectWrite::Written(revision))) => Some(revision),
            Ok(Ok(ObjectWrite::Conflict)) => None,
            // Not known: a mark naming a roster is this write's alone, and a void (on a
            // revision) needs only the mark to name none: read back. An empty mark written
            // on absence could be another instance's, whose write means a history.
            _ if first_roster.is_some() || *expected != Expected::Absent => {
                match self.get(&name, "reading the history mark back").await {
                    Ok(Some((bytes, revision))) if bytes == value => Some(revision),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// The roster the mark this instance may have to void names.
    fn mark_to_void_roster(&self) -> Option<u64> {
        self.mark_to_void.as_ref().map(|(x, _)| *x)
    }

    /// Voids the history mark this instance wrote for a roster whose write has an unknown
    /// outcome (it names no roster from then on): whether that is done, or moot (the mark
    /// changed: it no longer names that roster).
    async fn void_mark(&mut self) -> bool {
        let Some((_, revision)) = self.mark_to_void.clone() else {
            return true;
        };
        let expected = Expected::Revision(revision);
        let done = match self.write_mark(&expected, None).await {
            Some(_) => true,
            // Not written: done if the mark no longer names that roster (read again); if it
            // still does (at another revision: written again by a late copy of our write
            // after a delete), voided at that revision next time.
            None => match self.mark().await {
                Ok(Some((Some(first), now))) if Some(first) == self.mark_to_void_roster() => {
                    self.mark_to_void = Some((first, now));
                    false
                }
                Ok(_) => true,
                Err(_) => false,
            },
        };
        if done {
            self.mark_to_void = None;
        }
        done
    }

    /// Lists this instance in the roster in its membership term, unless it is already (the
    /// roster is read only until then, or when a plan names another roster). `true` once
    /// listed.
    async fn join_roster(&mut self, m: &Membership) -> Result<bool, Error> {
        let term = m.fence.token.0;
        let other_roster = self
            .plan
            .as_ref()
            .is_some_and(|p| Some(p.roster) != self.roster_seen);
        // Listed for a ttl and still not in the plan: look again (an entry removed by hand).
        let unplanned = self
            .plan
            .as_ref()
            .is_some_and(|p| p.share_of(&self.me).is_none())
            && self
                .listed
                .is_some_and(|(_, _, since)| since.elapsed() >= self.wait_ttl());
        if other_roster || unplanned {
            self.listed = None;
        }
        if self
            .listed
            .is_some_and(|(t, c, _)| t == term && Some(c) == self.roster_seen)
        {
            return Ok(true);
        }
        let (roster, expected) = self.read_roster().await?;
        self.enter_roster(m, roster, expected).await
    }

    /// Writes our entry (this membership term) into `roster`, read at `expected`, unless it
    /// is there. `true` once listed.
    async fn enter_roster(
        &mut self,
        m: &Membership,
        mut roster: Roster,
        expected: Expected,
    ) -> Result<bool, Error> {
        let term = m.fence.token.0;
        if self.listed_in(&roster, &self.me, term) {
            self.listed = Some((term, roster.created, Instant::now()));
            return Ok(true);
        }
        if expected == Expected::Absent {
            if self.roster_seen.is_none() && !self.may_create_roster(roster.created).await {
                return Ok(false);
            }
            // Another roster than the one our mark names, whose write may still land: the
            // mark first names none (else, landing after this one was deleted, it would pass
            // for the first).
            let first = self.mark_to_void_roster();
            if first.is_some_and(|x| x != roster.created) && !self.void_mark().await {
                return Ok(false);
            }
        }
        roster.enter(&self.me, term, self.timing.ttl);
        let name = self.names.roster().clone();
        let written = self.put(m, &name, &expected, &roster.encode()).await;
        // Landed, or answered not applied: it cannot land later.
        let known = matches!(written, Ok(Put::Written(_) | Put::Conflict));
        if let Some((x, revision)) = self.mark_to_void.clone()
            && x == roster.created
        {
            // Landed: trusted only if the mark still names it at our revision. A write that
            // took long may land after another instance, tired of waiting, voided the mark
            // and wrote a roster that was then deleted (rule 3.2).
            if matches!(written, Ok(Put::Written(_)))
                && !matches!(self.mark().await, Ok(Some((Some(first), now))) if first == x && now == revision)
            {
                debug!(
                    "our first roster landed after the mark was voided; waiting as after a delete"
                );
                self.roster_gap = Some(None);
            }
            if known {
                self.mark_to_void = None;
            }
        }
        self.created_unknown = expected == Expected::Absent && !known;
        match written {
            Ok(Put::Written(_)) => {
                info!(members = roster.members.len(), "joined the roster");
                self.listed = Some((term, roster.created, Instant::now()));
                Ok(true)
            }
            Ok(_) => {
                debug!("the roster changed while joining; trying again");
                Ok(false)
            }
            Err(e) if is_permanent(&e) => Err(e),
            Err(e) => {
                debug!(error = %e, "could not join the roster yet");
                Ok(false)
            }
        }
    }

    /// Whether `roster` lists `id` in membership term `term`; with the planted flaw, in any
    /// term (the review's finding F2).
    fn listed_in(&self, roster: &Roster, id: &HolderId, term: u64) -> bool {
        if self.planted(ShardFlaw::PruneById) {
            roster.lists_id(id)
        } else {
            roster.lists(id, term)
        }
    }

    fn peer_client(&self, id: &HolderId) -> Result<LeaseClient, Error> {
        LeaseClient::counted_as(
            self.leases.clone(),
            self.names.member(id),
            self.me.clone(),
            self.timing,
            self.names.key(),
        )
        .map(|c| c.with_clock(self.clock, None))
        .map_err(|e| Error::InvalidConfig {
            message: e.to_string(),
            source: None,
        })
    }

    /// Rule 3: takes the candidate shards that are free, in one batch with one token
    /// reservation, and renews at once so that their terms can begin.
    async fn take(&mut self, m: &mut Membership, candidates: Vec<u32>) -> Result<(), Error> {
        let found = self.read_shards(m, candidates).await?;
        if m.over {
            return Ok(());
        }
        // 2. Who may be acting on each: every take is checked against the members' claims as
        // they are now (linearizable reads), and a held record against its owner's term.
        let my_term = m.fence.token.0;
        let by_id = self.planted(ShardFlaw::OwnerById);
        let ours = |r: &ShardRecord, me: &HolderId| {
            r.state == ShardState::Held && r.owner == *me && (r.member == my_term || by_id)
        };
        let claims = if found.is_empty() || self.planted(ShardFlaw::IgnoreClaims) {
            Some(Claims::none())
        } else {
            self.claims_now(m).await
        };
        // With the planted flaw, claims count for absent records and adoptions only.
        let absent_only = self.planted(ShardFlaw::ClaimsForAbsentOnly);
        let complete = claims.as_ref().is_some_and(|c| c.complete);
        let mut over: HashMap<(HolderId, u64), bool> = HashMap::new();
        let mut free: Vec<(u32, Expected, u64)> = Vec::new();
        for (s, record) in found {
            if !self.stay(m).await {
                return Ok(());
            }
            let claimed = self.claimed(&mut over, m, claims.as_ref(), s).await;
            // A write of ours with an unknown outcome, which another live member claims too
            // (its own may be unknown as well): no longer published, so that neither blocks
            // the other for good; still watched, and adopted if it lands (rule 7).
            if claimed
                && !self.owned.contains_key(&s)
                && let Some(sent_on) = self.uncertain.remove(&s)
            {
                self.unpublished.insert(s, sent_on);
            }
            // Judged with every claim known: no longer one of our ended term's to take back
            // first (rule 6), whatever the verdict.
            if complete {
                self.intend.remove(s);
            }
            match record {
                None => {
                    self.adopt_retry.remove(s);
                    if complete && !claimed {
                        free.push((s, Expected::Absent, 0));
                    }
                }
                Some((r, revision)) if ours(&r, &self.me) => {
                    // Ours already: a write whose answer was lost, or one that landed late
                    // (perhaps after an operator deleted another member's record of the shard).
                    // Adopted only if no other live member claims it, by a write of our own
                    // with a new token, so that no other write of ours still on its way can
                    // land and the shard's tokens keep rising. Until then it stays claimed.
                    if complete && !claimed {
                        free.push((s, Expected::Revision(revision), r.token));
                    } else {
                        self.adopt_retry.insert(s);
                    }
                }
                Some((r, revision)) => {
                    // Not ours (any more): nothing to adopt.
                    self.adopt_retry.remove(s);
                    // With the planted flaw, the plan is trusted: no rule asked.
                    let trusted = self.trusts_plan(s);
                    let ended = r.state == ShardState::Released
                        || trusted
                        || self.is_over(&mut over, m, &r.owner, r.member).await;
                    debug!(shard = s, owner = %r.owner, member = r.member, state = ?r.state, ended, claimed, "a shard record");
                    // A record that names a released or ended term may still be acted on by a
                    // member whose own record of the shard an operator deleted and a late
                    // write replaced (rule 3.2): it still claims the shard, and the set of
                    // members read must be complete to see it.
                    if trusted || (ended && complete && (!claimed || absent_only)) {
                        free.push((s, Expected::Revision(revision), r.token));
                    }
                }
            }
        }
        if !free.is_empty() {
            // 3. One reserved token for the batch, above every earlier one, then the records.
            let floor = free.iter().map(|(_, _, t)| *t).max().unwrap_or(0);
            let reserved = if self.planted(ShardFlaw::NoReservation) {
                Some(None)
            } else {
                self.reserve(floor, m.next_renew).await?.map(Some)
            };
            if let Some(reserved) = reserved {
                let n = self.write_held(m, free, reserved).await?;
                if n > 0 {
                    info!(taken = n, token = reserved.unwrap_or(0), "took shards");
                }
            }
        }
        // 4. Publish the new set at once; the terms begin when that renew succeeds.
        m.next_renew = m.next_renew.min(self.pending_renew());
        Ok(())
    }

    /// Whether a live member other than us claims shard `s` (unknown claims: yes).
    async fn claimed(
        &mut self,
        over: &mut HashMap<(HolderId, u64), bool>,
        m: &Membership,
        claims: Option<&Claims>,
        s: u32,
    ) -> bool {
        let Some(claims) = claims else {
            return true;
        };
        for (id, token, set) in &claims.of {
            if set.contains(s) && !self.is_over(over, m, id, *token).await {
                return true;
            }
        }
        false
    }

    /// The planted flaw [`ShardFlaw::TrustThePlan`]: a shard the plan gives us is taken as if
    /// its owner's term were over.
    fn trusts_plan(&self, s: u32) -> bool {
        self.planted(ShardFlaw::TrustThePlan)
            && self
                .plan
                .as_ref()
                .and_then(|p| p.share_of(&self.me))
                .is_some_and(|share| share.contains(s))
    }

    /// Rule 3.1: the candidates' shard records, read linearizably (`None`: absent), as many as
    /// half a renew period allows; a damaged record is left out.
    async fn read_shards(
        &mut self,
        m: &mut Membership,
        candidates: Vec<u32>,
    ) -> Result<Vec<(u32, Option<(ShardRecord, Revision)>)>, Error> {
        let mut found = Vec::with_capacity(candidates.len());
        let started = Instant::now();
        let budget = self.real(self.timing.renew_every) / 2;
        for s in candidates {
            // A slow store: take what was read so far; the rest waits for the next look.
            if started.elapsed() > budget || !self.stay(m).await {
                break;
            }
            let name = self.names.shard(s);
            match self.get(&name, "reading a shard record").await {
                Ok(None) => found.push((s, None)),
                Ok(Some((bytes, revision))) => match ShardRecord::decode(&name, &bytes) {
                    Ok(r) => found.push((s, Some((r, revision)))),
                    Err(e) => warn!(error = %e, "not taking a shard whose record is damaged"),
                },
                Err(e) if is_permanent(&e) => return Err(e),
                Err(e) => {
                    debug!(shard = s, error = %e, "could not read a shard record");
                    break;
                }
            }
        }
        Ok(found)
    }

    /// Writes each shard record as held by us under our membership term, with `token` (or
    /// the record's own token when `None`, for adoptions and the planted flaw), conditional
    /// on what was read. Returns how many were written.
    async fn write_held(
        &mut self,
        m: &mut Membership,
        shards: Vec<(u32, Expected, u64)>,
        token: Option<u64>,
    ) -> Result<usize, Error> {
        let mut written = 0;
        for (s, expected, old) in shards {
            if !self.stay(m).await {
                break;
            }
            let token = token.unwrap_or(if self.planted(ShardFlaw::NoReservation) {
                old + 1
            } else {
                old
            });
            let record = self.record(m, ShardState::Held, token);
            let name = self.names.shard(s);
            match self.put(m, &name, &expected, &record.encode()).await {
                Ok(Put::Written(revision)) => {
                    written += 1;
                    self.recheck.remove(s);
                    self.uncertain.remove(&s);
                    self.unpublished.remove(&s);
                    self.adopt_retry.remove(s);
                    self.owned.insert(
                        s,
                        Owned {
                            token,
                            revision,
                            state: State::Pending,
                            from_absent: expected == Expected::Absent,
                        },
                    );
                }
                Ok(Put::Conflict) => debug!(shard = s, "lost the race for a shard"),
                // It may land later, naming us: look again until we know.
                Ok(Put::Unknown) => {
                    self.uncertain.insert(s, expected);
                }
                Err(e) if e.kind() == ErrorKind::Fenced => {
                    debug!("the store says our membership term is over; stopping the batch");
                    break;
                }
                Err(e) if is_permanent(&e) => return Err(e),
                Err(e) => debug!(shard = s, error = %e, "could not write a shard record"),
            }
        }
        Ok(written)
    }

    /// Shards whose held-write had an unknown outcome, not owned since: once the record has
    /// moved on from the write's condition, the write can no longer land; if it names our
    /// term, it goes to the shards to adopt (which [`take`](Self::take) does, with the claims
    /// check and a new token), else it is forgotten.
    async fn check_uncertain(&mut self, m: &mut Membership) {
        let pending: Vec<(u32, Expected)> = self
            .uncertain
            .iter()
            .chain(&self.unpublished)
            .map(|(s, e)| (*s, e.clone()))
            .collect();
        for (s, sent_on) in pending {
            if self.owned.contains_key(&s) {
                self.uncertain.remove(&s);
                self.unpublished.remove(&s);
                continue;
            }
            if !self.stay(m).await {
                return;
            }
            let name = self.names.shard(s);
            let Ok(found) = self.get(&name, "reading a shard record").await else {
                continue;
            };
            if sent_on.matches(found.as_ref().map(|(_, r)| r)) {
                continue;
            }
            self.uncertain.remove(&s);
            self.unpublished.remove(&s);
            if let Some((bytes, _)) = found
                && let Ok(r) = ShardRecord::decode(&name, &bytes)
                && r.owner == self.me
                && r.member == m.fence.token.0
                && r.state == ShardState::Held
            {
                self.adopt_retry.insert(s);
            }
        }
    }

    /// A shard record of ours under membership term `m`, with a fresh nonce.
    fn record(&mut self, m: &Membership, state: ShardState, token: u64) -> ShardRecord {
        ShardRecord {
            v: 1,
            owner: self.me.clone(),
            member: m.fence.token.0,
            state,
            token,
            nonce: self.rng.next_u64(),
        }
    }

    /// Now, if some owned shard waits for a renew to be published; else far away.
    fn pending_renew(&self) -> Instant {
        let now = Instant::now();
        if self
            .owned
            .values()
            .any(|o| matches!(o.state, State::Pending))
        {
            now
        } else {
            now + Duration::from_secs(86_400)
        }
    }

    /// Every other member's record as it is now, for the claims check of a take: (id, its
    /// term's token, its claims). `None` if one could not be read.
    async fn claims_now(&mut self, m: &mut Membership) -> Option<Claims> {
        let (ids, complete) = self.claimant_ids().await?;
        let mut of = Vec::with_capacity(ids.len());
        for id in ids {
            if !self.stay(m).await {
                return None;
            }
            of.extend(self.claim_of(id).await?);
        }
        Some(Claims { of, complete })
    }

    /// Everyone whose claims matter: the roster as it is now (a member may have joined since
    /// this poll began), the members of the last plan, and every member known otherwise, our
    /// own id included (another process may hold a term of it); and whether that is everyone:
    /// not while a roster written again after a delete may not list every live member yet
    /// (rule 3.2). `None` if the roster could not be read.
    async fn claimant_ids(&mut self) -> Option<(Vec<HolderId>, bool)> {
        let (roster, expected) = self.read_roster().await.ok()?;
        let complete = expected != Expected::Absent && !self.roster_gap_open();
        let mut ids: Vec<HolderId> = roster.ids();
        ids.extend(self.peers.keys().cloned());
        ids.extend(self.watching.iter().map(|(id, _)| id.clone()));
        if let Some(plan) = &self.plan {
            ids.extend(plan.members.iter().map(|s| s.id.clone()));
        }
        ids.push(self.me.clone());
        ids.sort();
        ids.dedup();
        Some((ids, complete))
    }

    /// Whether a roster written again after a delete (or first seen on a key with a history)
    /// may still lack live members: until a ttl after this instance first saw a plan that
    /// names it. Every live member reads such a plan within a poll of its announcement (it
    /// follows the coordinator lease) and lists itself again; the coordinator also lists every
    /// live member it knows.
    fn roster_gap_open(&mut self) -> bool {
        let open = self.roster_gap_pending();
        if !open {
            self.roster_gap = None;
        }
        open
    }

    /// As [`roster_gap_open`](Self::roster_gap_open), without closing a gap that has run
    /// out: only a check made after a fresh read of the roster (which may raise the longest
    /// ttl) closes one.
    fn roster_gap_pending(&self) -> bool {
        match self.roster_gap {
            None => false,
            Some(Some(since)) => since.elapsed() < self.wait_ttl(),
            Some(None) => true,
        }
    }

    /// Notes the plan in hand, `announced` by a coordinator (a member takes only announced
    /// plans; the coordinator's own counts once its lease announces it): if it names the
    /// roster this instance last read and a gap after that roster was written again is open,
    /// the gap starts to run out; a *settled* plan (written once its coordinator's own gap had
    /// run out, so every live member has listed itself since) closes it at once.
    fn saw_plan(&mut self, announced: bool) {
        let Some(plan) = &self.plan else {
            return;
        };
        if Some(plan.roster) != self.roster_seen {
            return;
        }
        match self.roster_gap {
            Some(_) if plan.settled => self.roster_gap = None,
            Some(None) if announced => self.roster_gap = Some(Some(Instant::now())),
            _ => {}
        }
    }

    /// What the terms of `id` claim by a linearizable read of its record: (id, term, claimed
    /// set) of each term that may be live, none of this process's own; `None` if that is not
    /// known. A term superseded by a later one of the same id claims every shard until it is
    /// over (a ttl after the later one was first seen, rule 3.2): after an operator deleted
    /// its record, a second process with that id can begin a term while the first still acts
    /// until its next renew, and the record no longer says what the first claims.
    async fn claim_of(&mut self, id: HolderId) -> Option<Vec<(HolderId, u64, ShardSet)>> {
        let key = self.names.member(&id);
        let read = within(
            self.real(self.timing.request_timeout),
            self.leases.read(&key),
        )
        .await;
        // The latest term of it this instance has seen, to time a deletion by.
        let seen = self.last_token.get(&id).copied().unwrap_or(0);
        match read {
            Ok(Ok(Some(stored))) => {
                self.saw(&id, &stored);
                let current = stored.record.token.0;
                let mut superseded: Vec<u64> = self
                    .superseded
                    .keys()
                    .filter(|(i, t)| *i == id && *t < current)
                    .map(|(_, t)| *t)
                    .collect();
                // In term order, not the map's: a seed plays the same history every time.
                superseded.sort_unstable();
                let mut of: Vec<(HolderId, u64, ShardSet)> = superseded
                    .into_iter()
                    .map(|t| (id.clone(), t, ShardSet::all(self.n)))
                    .collect();
                if stored.record.is_held()
                    && stored.record.holder == id
                    && !self.is_my_term(&id, current)
                {
                    // Claims that cannot be read are unknown claims.
                    let set = claims_of(self.n, &stored.record.metadata)?;
                    of.push((id, current, set));
                }
                // Else ours, released by it, or taken over: that term is over.
                Some(of)
            }
            // Expired by a store that enforces expiry: its term is over.
            Ok(Ok(None)) if self.leases.expiry_model() == ExpiryModel::EnforcedByStore => {
                Some(Vec::new())
            }
            // Deleted: what it claimed is unknown until a ttl has passed (see is_over).
            Ok(Ok(None)) => {
                let since = *self.absent.entry((id, seen)).or_insert_with(Instant::now);
                (since.elapsed() >= self.wait_ttl()).then_some(Vec::new())
            }
            _ => None,
        }
    }

    /// Notes what a read of `id`'s member record showed: its latest term, its ttl, and that it
    /// is not absent now.
    fn saw(&mut self, id: &HolderId, stored: &Stored) {
        if stored.record.holder == *id {
            self.raise_term(id, stored.record.token.0);
        }
        self.max_ttl = self.max_ttl.max(stored.record.ttl);
        self.absent.retain(|(i, _), _| i != id);
    }

    /// Whether `(id, term)` is a membership term this process has held.
    fn is_my_term(&self, id: &HolderId, term: u64) -> bool {
        *id == self.me && self.my_terms.contains(&term)
    }

    /// Notes that `id` has begun membership term `term` (seen in its record or its roster
    /// entry). A later term than the latest seen *supersedes* that one: after an operator's
    /// delete, a second process with the id may have begun it while the first still acts
    /// until its next renew, so the earlier term claims every shard until it is over (a ttl
    /// after this first sight, rule 3.2), unless it is known over: a term of this process,
    /// one ended already, or any term where the store ends a term whose record is deleted.
    pub(super) fn raise_term(&mut self, id: &HolderId, term: u64) {
        let seen = self.last_token.get(id).copied().unwrap_or(0);
        if seen > 0
            && seen < term
            && !self.is_my_term(id, seen)
            && !self.ended.contains(&(id.clone(), seen))
            && self.leases.expiry_model() != ExpiryModel::EnforcedByStore
        {
            self.superseded
                .entry((id.clone(), seen))
                .or_insert_with(Instant::now);
        }
        let token = self.last_token.entry(id.clone()).or_insert(0);
        *token = (*token).max(term);
    }

    /// How long an absence or a new term of another member must be seen before its last term
    /// counts as over: the longest ttl of any member seen (instances of a key may run with
    /// different ttls), on our clock.
    fn wait_ttl(&self) -> Duration {
        self.real(self.timing.ttl.max(self.max_ttl))
    }

    /// Whether membership term `token` of `owner` is over (rule 3.2), by a linearizable read
    /// of its record: absent, or a later term's token. A record still at that term is ended
    /// by taking it over as a single-key lease (released at once: after a ttl unchanged on
    /// our clock, or at once if released), and then released, so that a late renew of the
    /// owner fails.
    async fn is_over(
        &mut self,
        cache: &mut HashMap<(HolderId, u64), bool>,
        m: &Membership,
        owner: &HolderId,
        token: u64,
    ) -> bool {
        let term = (owner.clone(), token);
        if let Some(over) = cache.get(&term) {
            return *over;
        }
        // With the planted flaw, any other term of our id counts as one of ours that ended.
        let mine = self.my_terms.contains(&token) || self.planted(ShardFlaw::OwnerById);
        let over = if self.ended.contains(&term)
            || (*owner == self.me && mine && token != m.fence.token.0)
        {
            // Known over: a term of this process that it ended itself, or one we ended.
            true
        } else {
            self.end_if_over(owner, token).await
        };
        if over {
            if self.ended.len() >= ENDED_KEPT {
                self.ended.clear();
            }
            // Known over from now on: its timers are done with.
            self.absent.remove(&term);
            self.superseded.remove(&term);
            self.ended.insert(term.clone());
        }
        cache.insert(term, over);
        over
    }

    /// Rule 3.2 for a term not known over, by a linearizable read of its member's record.
    async fn end_if_over(&mut self, owner: &HolderId, token: u64) -> bool {
        let key = self.names.member(owner);
        if self.planted(ShardFlaw::LaggingOwnerRead) {
            return self.flawed_over(owner, token).await;
        }
        let read = within(
            self.real(self.timing.request_timeout),
            self.leases.read(&key),
        )
        .await;
        let stored: Option<Stored> = match read {
            Ok(Ok(found)) => found,
            _ => return false,
        };
        let term = (owner.clone(), token);
        let Some(stored) = stored else {
            let ttl = self.wait_ttl();
            // Where the store expires leases itself (etcd deletes the key, ZooKeeper the
            // node), absence is how a term ends: over. Elsewhere an operator deleted it: its
            // member's renews fail from now on, but one sent before may have given it a
            // deadline up to a ttl away.
            if self.leases.expiry_model() == ExpiryModel::EnforcedByStore {
                return true;
            }
            let since = *self.absent.entry(term).or_insert_with(Instant::now);
            return since.elapsed() >= ttl;
        };
        // Not `saw`: an absence timed for an earlier term must not be forgotten here. The
        // record's own ttl counts before any wait is timed by it.
        self.max_ttl = self.max_ttl.max(stored.record.ttl);
        let ttl = self.wait_ttl();
        let current = stored.record.token.0;
        if current > token {
            // A later term on the key. Taken over by another instance (which ended this term
            // by the observed-time rule): over. Begun by a process with the member's id: over
            // too, unless the record had been deleted, when the term's own process may still
            // be acting until its deadline; so that case waits a ttl from the first sight.
            if stored.record.holder != *owner {
                return true;
            }
            let since = *self.superseded.entry(term).or_insert_with(Instant::now);
            return since.elapsed() >= ttl;
        }
        if current < token || stored.record.holder != *owner {
            return false;
        }
        if !stored.record.is_held() {
            // Released by its member, once the term's work had stopped.
            return true;
        }
        // Held at this term: over once unchanged for a full ttl on our clock, and then taken
        // over (and released), so that a late renew of the member cannot extend it.
        let Some(client) = self.client_of(owner) else {
            return false;
        };
        let stale = client
            .observed()
            .is_some_and(|(s, since)| s.revision == stored.revision && since.elapsed() >= ttl);
        if !stale {
            // Start (or go on with) the clock: the cheap read times the revision as followers
            // do; a lag only makes it start later.
            let _ = client.observe().await;
            return false;
        }
        match client.try_acquire().await {
            Ok(Acquisition::Acquired(grant)) => {
                info!(member = %owner, token, taken_with = %grant.token, "ended a member's term: its record was unchanged for a ttl");
                if let Err(e) = client.release().await {
                    debug!(error = %e, "could not release a member record taken over; it expires");
                }
                self.reapers.remove(owner);
                true
            }
            Ok(Acquisition::Following { .. }) => false,
            Err(e) => {
                debug!(member = %owner, error = %e, "could not end a member's term");
                false
            }
        }
    }

    /// The client that times `owner`'s record: the roster peer's (which has been reading it
    /// every poll), else one of its own kept across polls (an owner that left the roster).
    fn client_of(&mut self, owner: &HolderId) -> Option<&mut LeaseClient> {
        if self.peers.contains_key(owner) {
            return self.peers.get_mut(owner).map(|p| &mut p.client);
        }
        if !self.reapers.contains_key(owner) {
            let client = self.peer_client(owner).ok()?;
            self.reapers.insert(owner.clone(), client);
        }
        self.reapers.get_mut(owner)
    }

    /// Whether the simulation planted `flaw` in this instance. A constant false without the
    /// `simulation` feature (no flaw can be planted then), so the optimiser drops the flawed
    /// branches.
    fn planted(&self, flaw: ShardFlaw) -> bool {
        cfg!(feature = "simulation") && self.flaw == flaw
    }

    /// The planted flaw [`ShardFlaw::LaggingOwnerRead`]: the owner's term judged from the
    /// cheap (lagging) read, any other token taken for a later term.
    async fn flawed_over(&mut self, owner: &HolderId, token: u64) -> bool {
        let Some(client) = self.client_of(owner) else {
            return false;
        };
        match client.observe().await {
            Ok(Some(s)) => s.record.token.0 != token || !s.record.is_held(),
            Ok(None) => true,
            Err(_) => false,
        }
    }

    /// Reserves a shard token above every earlier one: the token of a new term of the
    /// `P.tokens` lease, released at once. Every store keeps a lease key's tokens rising, also
    /// after an operator deletes the record, so shard tokens do too, whatever is deleted.
    /// `None` if another instance holds it now (try again at the next look).
    async fn reserve(&mut self, floor: u64, next_renew: Instant) -> Result<Option<u64>, Error> {
        // Another taker may hold the token lease for a moment (between its take and its
        // release): tried again within a request timeout, not dropped with the batch just
        // read (takers starting together on a slow store would otherwise spend most looks
        // reading records for nothing).
        let give_up = (Instant::now() + self.real(self.timing.request_timeout)).min(next_renew);
        let grant = loop {
            match self.tokens.try_acquire().await {
                Ok(Acquisition::Acquired(grant)) => break grant,
                Ok(Acquisition::Following { .. }) if Instant::now() < give_up => {
                    let (lo, hi) = (self.timing.poll_every / 10, self.timing.poll_every / 4);
                    let pause = self.rng.duration(self.real(lo), self.real(hi));
                    sleep(pause).await;
                }
                Ok(Acquisition::Following { .. }) => {
                    debug!("another taker holds the token lease; trying again at the next look");
                    return Ok(None);
                }
                Err(e) if is_permanent(&e) => return Err(e),
                Err(e) => {
                    debug!(error = %e, "could not reserve a token; trying again at the next look");
                    return Ok(None);
                }
            }
        };
        match self.tokens.release().await {
            Ok(true) => {}
            // Not known released: others would wait a ttl for it; release it again at the
            // next look.
            Ok(false) => self.tokens_held = true,
            Err(e) => {
                debug!(error = %e, "could not release the token lease; trying again");
                self.tokens_held = true;
            }
        }
        let high = grant.token.0;
        if high <= floor.max(self.highest) {
            warn!(
                high,
                floor, "the token lease gave a token below a shard's; not using it"
            );
            return Ok(None);
        }
        self.highest = high;
        Ok(Some(high))
    }

    /// Rule 4: ends the terms of `shards`; their records are marked released once their work
    /// has stopped ([`finish_releases`]).
    fn release_shards(&mut self, shards: &[u32]) {
        let shared = self.shared();
        {
            let mut slots = shared.slots();
            for s in shards {
                if let Some(slot) = slots.remove(s) {
                    slot.cancel.cancel();
                }
                if let Some(o) = self.owned.get_mut(s) {
                    let state = std::mem::replace(&mut o.state, State::Releasing(None));
                    if let State::Acting(rx) = state {
                        o.state = State::Releasing(Some(rx));
                    }
                }
            }
        }
        info!(
            count = shards.len(),
            "releasing shards the plan gives to others"
        );
        shared.publish(|_| {});
    }

    /// Marks released the records of shards whose work has stopped, then publishes the
    /// smaller set with a renew.
    async fn finish_releases(&mut self, m: &mut Membership) {
        let mut done = Vec::new();
        for (s, o) in &mut self.owned {
            if let State::Releasing(rx) = &mut o.state {
                let stopped = match rx {
                    None => true,
                    Some(rx) => {
                        matches!(rx.try_recv(), Err(mpsc::error::TryRecvError::Disconnected))
                    }
                };
                if stopped {
                    o.state = State::Releasing(None);
                    done.push((*s, o.token, o.revision.clone()));
                }
            }
        }
        if done.is_empty() {
            return;
        }
        let mut released = 0usize;
        for (s, token, revision) in done {
            if !self.stay(m).await {
                break;
            }
            let record = self.record(m, ShardState::Released, token);
            let name = self.names.shard(s);
            match self
                .put(m, &name, &Expected::Revision(revision), &record.encode())
                .await
            {
                // Released, or changed by someone else (then it is not ours to release).
                Ok(Put::Written(_) | Put::Conflict) => {
                    self.owned.remove(&s);
                    released += 1;
                }
                // It may land later: try again (conditional on the same revision, so only
                // one of the two can land); the shard stays claimed meanwhile.
                Ok(Put::Unknown) => {
                    debug!(shard = s, "a release's outcome is unknown; trying again")
                }
                Err(e) if e.kind() == ErrorKind::Fenced => {
                    self.owned.remove(&s);
                }
                Err(e) if is_permanent(&e) => {
                    warn!(shard = s, error = %e, "cannot release a shard: this error needs a person");
                }
                Err(e) => debug!(shard = s, error = %e, "could not release a shard yet"),
            }
        }
        if released > 0 {
            info!(released, led = self.owned.len(), "released shards");
            m.next_renew = Instant::now();
        }
    }

    /// Shutdown: ends every shard term, waits for the work (until the deadline), releases the
    /// shards whose work stopped, leaves the roster and releases the membership.
    async fn leave(&mut self, m: &mut Membership) {
        let all: Vec<u32> = self.owned.keys().copied().collect();
        self.release_shards(&all);
        // Wait for the work to stop, renewing meanwhile: the shards stay claimed (nobody else
        // takes them) until every one's work is confirmed stopped. Work that ignores its
        // cancelled term gets a few ttls; then the membership is left to expire instead.
        let give_up = Instant::now() + self.real(self.timing.ttl) * 4;
        loop {
            let running = self.owned.values_mut().any(|o| match &mut o.state {
                State::Releasing(Some(rx)) => {
                    !matches!(rx.try_recv(), Err(mpsc::error::TryRecvError::Disconnected))
                }
                _ => false,
            });
            if !running || m.over {
                break;
            }
            if Instant::now() >= give_up {
                warn!(
                    "the work of a shard was not confirmed stopped; not releasing, the membership will expire"
                );
                m.cancel.cancel();
                self.member.end_term("work outlived its term");
                return;
            }
            tokio::select! {
                biased;
                _ = sleep_until(m.next_renew) => {
                    self.renew(m).await;
                }
                _ = sleep(self.real(RELEASE_CHECK)) => {}
            }
        }
        if m.over {
            return;
        }
        self.finish_releases(m).await;
        // The coordinator lease first: a successor takes over at once, not a ttl later.
        self.stop_leading().await;
        let name = self.names.roster().clone();
        if let Ok(Some((bytes, revision))) = self.get(&name, "reading the roster").await
            && let Ok(mut roster) = Roster::decode(&name, &bytes)
        {
            roster.members.retain(|e| e.id != self.me);
            let _ = self
                .put(m, &name, &Expected::Revision(revision), &roster.encode())
                .await;
        }
        m.cancel.cancel();
        match self.member.release().await {
            Ok(_) => info!("left: shards and membership released"),
            Err(e) => {
                warn!(error = %e, "could not release the membership; it expires after its ttl")
            }
        }
    }

    async fn get(
        &self,
        name: &ObjectName,
        what: &'static str,
    ) -> Result<Option<(Vec<u8>, Revision)>, Error> {
        let limit = self.real(self.timing.request_timeout);
        let found = within(limit, self.objects.get_fenced(name))
            .await
            .map_err(|_| Error::Timeout {
                operation: what,
                after: self.timing.request_timeout,
            })??;
        Ok(found.map(|o| (o.value, o.revision)))
    }

    /// Writes `value` to `name` if it is as `expected`, with our membership as the fence (the
    /// stores that can check in the same write that the membership term is live). An unknown
    /// outcome is looked up by reading the object back; if the value is not there, it stays
    /// [`Put::Unknown`]: the write may still land (late), and callers must not act as if it
    /// never will.
    async fn put(
        &self,
        m: &Membership,
        name: &ObjectName,
        expected: &Expected,
        value: &[u8],
    ) -> Result<Put, Error> {
        let limit = self.real(self.timing.request_timeout);
        let put = FencedPut::new(&m.fence, name, expected, value);
        match within(limit, self.objects.put_fenced_if(put)).await {
            Ok(Ok(ObjectWrite::Written(revision))) => Ok(Put::Written(revision)),
            Ok(Ok(ObjectWrite::Conflict)) => Ok(Put::Conflict),
            Ok(Err(e)) if e.kind() != ErrorKind::Indeterminate => Err(e),
            Ok(Err(_)) | Err(_) => match self.get(name, "re-reading after a write").await {
                Ok(Some((bytes, revision))) if bytes == value => Ok(Put::Written(revision)),
                _ => Ok(Put::Unknown),
            },
        }
    }
}

/// What the other members claim, by linearizable reads of their records.
struct Claims {
    /// (id, membership term, claimed set) of each member whose term is live as read.
    of: Vec<(HolderId, u64, ShardSet)>,
    /// Whether every member whose claims matter was read: not while a roster written again
    /// after a delete may not list every live member yet. Every take needs complete claims.
    complete: bool,
}

impl Claims {
    fn none() -> Self {
        Self {
            of: Vec::new(),
            complete: true,
        }
    }
}

/// The outcome of a conditional object write.
enum Put {
    Written(Revision),
    Conflict,
    /// Not applied as far as a read could tell, but it may still land.
    Unknown,
}

/// Ends every shard term of membership term `token` at its deadline, without the driver's
/// task.
async fn watchdog(
    shared: Arc<Shared>,
    token: FencingToken,
    cancel: CancellationToken,
    deadline: watch::Receiver<TermDeadline>,
) {
    term_over(&cancel, &deadline, shared.tick).await;
    shared
        .slots()
        .retain(|_, slot| slot.fence.lease_term != Some(token));
    shared.publish(|_| {});
}

/// Held by the task: if it panics or is dropped, every shard term ends and readers learn that
/// the instance has stopped.
struct Guard(Arc<Shared>);

impl Drop for Guard {
    fn drop(&mut self) {
        for (_, slot) in std::mem::take(&mut *self.0.slots()) {
            slot.cancel.cancel();
        }
        self.0.publish(|a| {
            if a.stopped.is_none() {
                a.member = false;
                a.stopped = Some(Some(Problem {
                    kind: ErrorKind::Backend,
                    message: "the sharded elector's task ended unexpectedly (it panicked or was \
                              dropped)"
                        .to_owned(),
                }));
            }
        });
    }
}
