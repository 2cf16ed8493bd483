//! The task of one sharded instance: its membership term, the look at the other members, the
//! balance, takeovers and releases. The rules are in `docs/sharding.md`; each step below names
//! the rule it keeps.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use super::records::{
    Names, Roster, ShardRecord, ShardSet, ShardState, claims_metadata, claims_of, score,
    stable_hash,
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
use crate::rand::Rng;
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
    claims: ShardSet,
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
    my_hash: u64,
    member: LeaseClient,
    /// The `P.tokens` lease, whose terms' tokens are the shard tokens.
    tokens: LeaseClient,
    /// A release of the token lease failed: it may still be ours.
    tokens_held: bool,
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
    /// Shards whose record names our membership term, whose adoption failed: tried again.
    adopt_retry: ShardSet,
    highest: u64,
    /// Whether this instance has seen the roster; and since when it has been written again
    /// after it vanished.
    roster_seen: Option<u64>,
    roster_gap: Option<Instant>,
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
    shared: Option<Arc<Shared>>,
}

impl Driver {
    pub(crate) fn new(p: Parts) -> Self {
        Self {
            my_hash: stable_hash(p.holder.as_str()),
            intend: ShardSet::new(p.shards),
            uncertain: BTreeMap::new(),
            adopt_retry: ShardSet::new(p.shards),
            leases: p.leases,
            objects: p.objects,
            names: p.names,
            n: p.shards,
            me: p.holder,
            member: p.member,
            tokens: p.tokens,
            tokens_held: false,
            timing: p.timing,
            clock: p.clock,
            rng: p.rng,
            flaw: p.flaw,
            peers: BTreeMap::new(),
            owned: BTreeMap::new(),
            highest: 0,
            absent: HashMap::new(),
            reapers: HashMap::new(),
            last_token: HashMap::new(),
            roster_seen: None,
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
    /// since (rule 1: act only once the set that includes them is written). Returns `false`
    /// when the membership term is over.
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

    /// Starts a term for every pending shard in `published`.
    async fn activate(&mut self, m: &Membership, published: &ShardSet) {
        // Rule 1: the record must still be the one we wrote now that the set naming the shard
        // is published. An operator's delete between our write and that renew would let
        // another instance take the shard without seeing our claim; a record read back
        // after the renew closes that window (the other taker reads claims after the
        // record, so it sees ours, or we see its record or the absence here).
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
        self.start_terms(m, &verified);
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
        self.adopt_retry = ShardSet::new(self.n);
        warn!(
            why,
            shards = self.intend.len(),
            "membership term ended; every shard term with it"
        );
        shared.publish(|a| a.member = false);
    }

    /// One look at the roster and the members, then one step towards balance.
    async fn poll(&mut self, m: &mut Membership) -> Result<(), Error> {
        self.finish_releases(m).await;
        if !self.uncertain.is_empty() {
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
        let (roster, joined) = self.roster(m).await?;
        self.look_at_peers(m, &roster).await;
        let live: Vec<&Peer> = self.peers.values().filter(|p| p.live).collect();
        let members = live.len() + 1;
        let n = self.n as usize;
        let (lo, hi) = (n / members, n.div_ceil(members));
        let someone_below = live.iter().any(|p| p.claims.len() < lo);
        let mut claimed = ShardSet::new(self.n);
        for p in &live {
            claimed.union_with(&p.claims);
        }
        self.shared().publish(|a| a.members = members);
        let mine = self.owned.len();
        let mut held = claimed.clone();
        held.union_with(&self.claims());
        let unclaimed = n - held.len();
        // Rule 5: release above the ceiling, or above the floor while someone is below it and
        // no shard is free for it to take (else each look would release one more while the
        // others' published counts catch up).
        let surplus = if mine > hi {
            mine - hi
        } else if someone_below && mine > lo && unclaimed == 0 {
            1
        } else {
            0
        };
        if surplus > 0 {
            self.release(surplus);
            self.finish_releases(m).await;
        } else {
            let want = if someone_below { lo } else { hi };
            let room = want.saturating_sub(mine);
            // Shards of our own ended term first (rule 6), then free ones in our order.
            let mut candidates: Vec<u32> = self
                .adopt_retry
                .iter()
                .chain(self.intend.iter())
                .filter(|s| !self.owned.contains_key(s))
                .collect();
            let mut free: Vec<u32> = (0..self.n)
                .filter(|s| {
                    !self.owned.contains_key(s)
                        && !claimed.contains(*s)
                        && !self.intend.contains(*s)
                        && !self.adopt_retry.contains(*s)
                })
                .collect();
            free.sort_by_key(|s| std::cmp::Reverse(score(self.my_hash, *s)));
            candidates.extend(free);
            let take = room
                .max(self.intend.len() + self.adopt_retry.len())
                .min(BATCH);
            candidates.truncate(take);
            debug!(
                members,
                mine,
                lo,
                hi,
                room,
                candidates = candidates.len(),
                "balance"
            );
            // Not in the roster yet: others would not see our claims (rule 3.2), take nothing.
            if !candidates.is_empty() && joined {
                self.intend = ShardSet::new(self.n);
                self.take(m, candidates).await?;
            }
        }
        self.prune(m).await;
        Ok(())
    }

    /// Reads the roster and joins it if this instance is not in it.
    async fn roster(&mut self, m: &Membership) -> Result<(Vec<HolderId>, bool), Error> {
        let name = self.names.roster().clone();
        let found = self.get(&name, "reading the roster").await?;
        let (roster, expected) = match found {
            Some((bytes, revision)) => {
                (Roster::decode(&name, &bytes)?, Expected::Revision(revision))
            }
            None => (
                Roster {
                    v: 1,
                    shards: self.n,
                    members: Vec::new(),
                    created: self.rng.next_u64(),
                },
                Expected::Absent,
            ),
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
        let recreated = match self.roster_seen {
            Some(created) => expected == Expected::Absent || created != roster.created,
            // A first look: this process cannot tell a roster written again after a delete
            // from one that never changed. If the key has a history (its token lease has a
            // record), absent shard records wait a ttl, in case a member has not listed
            // itself again yet; on a new key, nothing waits.
            None => {
                let history = within(
                    self.real(self.timing.request_timeout),
                    self.leases.read(self.names.tokens()),
                )
                .await;
                !matches!(history, Ok(Ok(None)))
            }
        };
        if recreated {
            // Deleted (an operator) and written again: until every live member has added
            // itself again, it does not list everyone whose claims matter (rule 3.2).
            if self.roster_seen.is_some() {
                warn!("the roster was deleted; absent shard records wait a ttl");
            }
            self.roster_gap = Some(Instant::now());
        }
        self.roster_seen = Some(roster.created);
        if roster.members.contains(&self.me) {
            return Ok((roster.members, true));
        }
        let mut joined = roster.clone();
        joined.members.push(self.me.clone());
        match self.put(m, &name, &expected, &joined.encode()).await {
            Ok(Put::Written(_)) => {
                info!(members = joined.members.len(), "joined the roster");
                Ok((joined.members, true))
            }
            Ok(_) => {
                debug!("the roster changed while joining; trying again");
                Ok((roster.members, false))
            }
            Err(e) if is_permanent(&e) => Err(e),
            Err(e) => {
                debug!(error = %e, "could not join the roster yet");
                Ok((roster.members, false))
            }
        }
    }

    /// Removes members whose term is over from the roster (released, taken over, expired,
    /// or dead for a ttl and then ended as rule 3.2 ends a term), so that it does not grow
    /// with every instance that ever ran. A member that comes back adds itself again.
    async fn prune(&mut self, m: &mut Membership) {
        let candidates: Vec<(HolderId, u64)> = self
            .peers
            .iter()
            .filter(|(_, p)| !p.live && p.read)
            .map(|(id, _)| (id.clone(), self.last_token.get(id).copied().unwrap_or(0)))
            .collect();
        let mut gone = Vec::new();
        let mut cache = HashMap::new();
        for (id, seen) in candidates {
            if !self.stay(m).await {
                return;
            }
            // The member's current term, by a linearizable read (the cheap view may show an
            // older one, which may well be over while the member lives on in a newer term).
            let read = within(
                self.real(self.timing.request_timeout),
                self.leases.read(&self.names.member(&id)),
            )
            .await;
            let over = match read {
                Ok(Ok(Some(stored))) if stored.record.holder == id && stored.record.is_held() => {
                    self.is_over(&mut cache, m, &id, stored.record.token.0)
                        .await
                }
                // Released by it, or taken over by another instance: left.
                Ok(Ok(Some(_))) => true,
                Ok(Ok(None)) => self.is_over(&mut cache, m, &id, seen).await,
                _ => false,
            };
            if over {
                gone.push(id);
            }
        }
        if gone.is_empty() {
            return;
        }
        let name = self.names.roster().clone();
        let Ok(Some((bytes, revision))) = self.get(&name, "reading the roster").await else {
            return;
        };
        let Ok(mut roster) = Roster::decode(&name, &bytes) else {
            return;
        };
        roster.members.retain(|id| !gone.contains(id));
        if let Ok(Put::Written(_)) = self
            .put(m, &name, &Expected::Revision(revision), &roster.encode())
            .await
        {
            info!(
                removed = gone.len(),
                "removed members whose term is over from the roster"
            );
            for id in gone {
                self.peers.remove(&id);
            }
        }
    }

    /// The cheap read of every other member's record (rule 2): who is live, what it claims.
    async fn look_at_peers(&mut self, m: &mut Membership, roster: &[HolderId]) {
        self.peers.retain(|id, _| roster.contains(id));
        let ttl = self.real(self.timing.ttl);
        for id in roster {
            if *id == self.me {
                continue;
            }
            if !self.stay(m).await {
                return;
            }
            if !self.peers.contains_key(id) {
                let Ok(client) = self.peer_client(id) else {
                    continue;
                };
                self.peers.insert(
                    id.clone(),
                    Peer {
                        client,
                        // Not counted until read: a member that cannot be read must not hold
                        // the others' targets down.
                        live: false,
                        read: false,
                        claims: ShardSet::new(self.n),
                    },
                );
            }
            let n = self.n;
            let Some(peer) = self.peers.get_mut(id) else {
                continue;
            };
            let observed = peer.client.observe().await;
            if let Ok(Some(s)) = &observed {
                let token = self.last_token.entry(id.clone()).or_insert(0);
                *token = (*token).max(s.record.token.0);
                self.max_ttl = self.max_ttl.max(s.record.ttl);
            }
            let Some(peer) = self.peers.get_mut(id) else {
                continue;
            };
            match observed {
                Ok(found) => {
                    let held_by_it = found
                        .as_ref()
                        .is_some_and(|s| s.record.is_held() && s.record.holder == *id);
                    let fresh = peer.client.expiry_model() == ExpiryModel::EnforcedByStore
                        || peer
                            .client
                            .observed()
                            .is_some_and(|(_, since)| since.elapsed() < ttl);
                    peer.read = true;
                    peer.live = held_by_it && fresh;
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
        // 2. Who may be acting on each: absent records are checked against the members'
        // claims as they are now (linearizable reads), others against their owner's term.
        let my_term = m.fence.token.0;
        let by_id = self.planted(ShardFlaw::OwnerById);
        let ours = |r: &ShardRecord, me: &HolderId| {
            r.state == ShardState::Held && r.owner == *me && (r.member == my_term || by_id)
        };
        let needs_claims = found.iter().any(|(_, r)| match r {
            None => true,
            Some((r, _)) => ours(r, &self.me),
        });
        let claims = if needs_claims && !self.planted(ShardFlaw::IgnoreClaims) {
            self.claims_now(m).await
        } else {
            Some(Vec::new())
        };
        let mut over: HashMap<(HolderId, u64), bool> = HashMap::new();
        let mut free: Vec<(u32, Expected, u64)> = Vec::new();
        for (s, record) in found {
            if !self.stay(m).await {
                return Ok(());
            }
            // Whether a live member other than us claims the shard (unknown: yes).
            let claimed = match &claims {
                None => true,
                Some(claims) => {
                    let mut blocked = false;
                    for (id, token, set) in claims {
                        if set.contains(s) && !self.is_over(&mut over, m, id, *token).await {
                            blocked = true;
                            break;
                        }
                    }
                    blocked
                }
            };
            match record {
                None => {
                    if !claimed {
                        free.push((s, Expected::Absent, 0));
                    }
                }
                Some((r, revision)) if r.state == ShardState::Released => {
                    free.push((s, Expected::Revision(revision), r.token));
                }
                Some((r, revision)) if ours(&r, &self.me) => {
                    // Ours already: a write whose answer was lost, or one that landed late
                    // (perhaps after an operator deleted another member's record of the shard).
                    // Adopted only if no other live member claims it, by a write of our own
                    // with a new token, so that no other write of ours still on its way can
                    // land and the shard's tokens keep rising. Until then it stays claimed.
                    if claimed {
                        self.adopt_retry.insert(s);
                    } else {
                        free.push((s, Expected::Revision(revision), r.token));
                    }
                }
                Some((r, revision)) => {
                    let ended = self.is_over(&mut over, m, &r.owner, r.member).await;
                    debug!(shard = s, owner = %r.owner, member = r.member, ended, "a held shard record");
                    if ended {
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
                self.reserve(floor).await?.map(Some)
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
                    self.uncertain.remove(&s);
                    self.adopt_retry.remove(s);
                    self.owned.insert(
                        s,
                        Owned {
                            token,
                            revision,
                            state: State::Pending,
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
            .map(|(s, e)| (*s, e.clone()))
            .collect();
        for (s, sent_on) in pending {
            if self.owned.contains_key(&s) {
                self.uncertain.remove(&s);
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

    /// Every roster member's record as it is now, for the claims check of absent shard
    /// records: (id, its term's token, its claims). `None` if one could not be read.
    async fn claims_now(&mut self, m: &mut Membership) -> Option<Vec<(HolderId, u64, ShardSet)>> {
        // The roster as it is now (a member may have joined since this poll began), and
        // every member known otherwise.
        if self
            .roster_gap
            .is_some_and(|since| since.elapsed() < self.wait_ttl())
        {
            return None;
        }
        let name = self.names.roster().clone();
        let (bytes, _) = self.get(&name, "reading the roster").await.ok()??;
        let roster = Roster::decode(&name, &bytes).ok()?;
        let mut ids: Vec<HolderId> = roster.members;
        ids.extend(self.peers.keys().cloned());
        ids.sort();
        ids.dedup();
        ids.retain(|id| *id != self.me);
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if !self.stay(m).await {
                return None;
            }
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
                    if stored.record.is_held() && stored.record.holder == id {
                        // Claims that cannot be read are unknown claims.
                        let set = claims_of(self.n, &stored.record.metadata)?;
                        out.push((id, stored.record.token.0, set));
                    }
                    // Else released by it, or taken over: its term is over.
                }
                // Expired by a store that enforces expiry: its term is over.
                Ok(Ok(None)) if self.leases.expiry_model() == ExpiryModel::EnforcedByStore => {}
                // Deleted: what it claimed is unknown until a ttl has passed (see is_over).
                Ok(Ok(None)) => {
                    let since = *self.absent.entry((id, seen)).or_insert_with(Instant::now);
                    if since.elapsed() < self.wait_ttl() {
                        return None;
                    }
                }
                _ => return None,
            }
        }
        Some(out)
    }

    /// Notes what a read of `id`'s member record showed: its latest term, its ttl, and that it
    /// is not absent now.
    fn saw(&mut self, id: &HolderId, stored: &Stored) {
        let token = self.last_token.entry(id.clone()).or_insert(0);
        *token = (*token).max(stored.record.token.0);
        self.max_ttl = self.max_ttl.max(stored.record.ttl);
        self.absent.retain(|(i, _), _| i != id);
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
        let over = if self.ended.contains(&term)
            || (*owner == self.me && self.my_terms.contains(&token) && token != m.fence.token.0)
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
            self.ended.insert(term.clone());
        }
        cache.insert(term, over);
        over
    }

    /// Rule 3.2 for a term not known over, by a linearizable read of its member's record.
    async fn end_if_over(&mut self, owner: &HolderId, token: u64) -> bool {
        let key = self.names.member(owner);
        let ttl = self.wait_ttl();
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
        // Not `saw`: an absence timed for an earlier term must not be forgotten here.
        self.max_ttl = self.max_ttl.max(stored.record.ttl);
        let current = stored.record.token.0;
        if current > token {
            // A later term on the key. Taken over by another instance (which ended this term
            // by the observed-time rule): over. Begun by a process with the member's id: over
            // too, unless the record had been deleted, when the term's own process may still
            // be acting until its deadline; so that case waits a ttl from the first sight.
            if stored.record.holder != *owner {
                return true;
            }
            let since = *self.absent.entry(term).or_insert_with(Instant::now);
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
    async fn reserve(&mut self, floor: u64) -> Result<Option<u64>, Error> {
        let grant = match self.tokens.try_acquire().await {
            Ok(Acquisition::Acquired(grant)) => grant,
            Ok(Acquisition::Following { .. }) => return Ok(None),
            Err(e) if is_permanent(&e) => return Err(e),
            Err(e) => {
                debug!(error = %e, "could not reserve a token; trying again at the next look");
                return Ok(None);
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

    /// Rule 4: ends the terms of the `count` shards this instance wants least; their records
    /// are marked released once their work has stopped ([`finish_releases`]).
    fn release(&mut self, count: usize) {
        let shared = self.shared();
        let mut mine: Vec<u32> = self
            .owned
            .iter()
            .filter(|(_, o)| !matches!(o.state, State::Releasing(_)))
            .map(|(s, _)| *s)
            .collect();
        mine.sort_by_key(|s| score(self.my_hash, *s));
        mine.truncate(count);
        {
            let mut slots = shared.slots();
            for s in &mine {
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
        info!(count = mine.len(), "releasing shards above the fair share");
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
        let count = self.owned.len();
        self.release(count);
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
        let name = self.names.roster().clone();
        if let Ok(Some((bytes, revision))) = self.get(&name, "reading the roster").await
            && let Ok(mut roster) = Roster::decode(&name, &bytes)
        {
            roster.members.retain(|id| *id != self.me);
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
