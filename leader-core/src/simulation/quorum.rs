//! Deterministic simulation of the election over a quorum of stores: several candidates of one
//! key over `n` memory stores, each store behind faults of its own (outages, slowness, storms of
//! failures and lost answers, writes delivered late), each candidate reaching each store through
//! faults of its own (a cut of one candidate from some stores only), with frozen processes,
//! crashes (restarted under a new id), pauses with an answer in flight, resignations, clock
//! drift, and an operator deleting a member's record, its mark, its record and mark, or
//! wiping a member empty, under paused tokio time. The operator never leaves more than a
//! minority of the members empty (neither a record nor a mark) at once: the design survives
//! the loss of a minority's memory of the key, not a majority's. Faults stop
//! [`QuorumSimConfig::quiet`] before the end (in some seeds one member stays down).
//!
//! Every candidate runs [`Elector::quorum_builder`]; its worker acts while its
//! [`Term`](crate::Term) is valid, and sends fenced writes carrying the term's token to a
//! protected object on a store of its own, through faults (some arrive late). The checkers:
//! 1. [`check_one_leader`]: no two candidates act in overlapping intervals;
//! 2. [`check_tokens`]: terms' tokens strictly increase in the order terms begin, none twice;
//! 3. [`check_fencing`]: the protected object never accepts a token below one it accepted;
//! 4. [`check_store_chains`]: on each member, every write that puts a new term (or a
//!    tombstone) over a record carries a token strictly above the one it replaces;
//! 5. [`check_quorum_liveness`]: once faults stop (with a majority of the members up, or all of
//!    them), no stretch without a leader lasts longer than [`quorum_liveness_bound`].
//!
//! It keeps the determinism of the single-key simulation (see the module's "Determinism"): one
//! current-thread runtime with paused time, every choice from generators seeded by the seed,
//! and one task only waiting on each candidate's `Leadership` channel.
//!
//! A [`QuorumFlaw`] plants a known bug in every candidate (and
//! [`QuorumSimConfig::ignore_deadline`] one in the work), so that a test can show the checkers
//! catch it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, sleep_until, timeout};

use super::candidate::term_ready;
use super::check::{check_fencing, check_one_leader, check_tokens, spans};
use super::faults::{FaultControl, Faults, FaultyStore, Late};
use super::world::{Freezable, Gate, lock};
use super::{Cand, Event, Violation};
use crate::backend::{
    FencedCas, FencedObject, FencedPut, FencedStore, LeaseBackend, ObjectWrite, Stored,
    WriteOutcome, WriteRequest,
};
use crate::config::Timing;
use crate::elector::{Elector, ElectorHandle, Leadership};
use crate::error::{Error, ErrorKind};
use crate::memory::MemoryStore;
use crate::model::{HolderId, LeaseKey, ObjectName};
use crate::quorum::flaw::QuorumFlaw;
use crate::quorum::record::Record;
use crate::quorum::{Quorum, QuorumMember};
use crate::rand::Rng;
use crate::term::Term;

/// What to simulate.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct QuorumSimConfig {
    /// The seed: the same seed plays the same history.
    pub seed: u64,
    /// How many member stores (3 or 5; an even number only for a negative control, built
    /// with [`Quorum::unchecked`]).
    pub members: usize,
    /// How many candidates run at once.
    pub candidates: usize,
    /// Simulated time.
    pub duration: Duration,
    /// How long before the end every fault stops (and nothing more is delivered late): the
    /// stretch in which liveness is judged.
    pub quiet: Duration,
    /// The timing of every candidate.
    pub timing: Timing,
    /// Each candidate's clock rate is drawn from `1 ± max_drift`.
    pub max_drift: f64,
    /// Latency of a healthy store (uniform up to this, each way).
    pub base_latency: Duration,
    /// Probability that a write to a member is delivered late (see [`Faults::late`]); twice
    /// that in a storm.
    pub late_writes: f64,
    /// Probability that a fenced write to the protected object is delivered late.
    pub late_fenced_writes: f64,
    /// Late writes are held for a time uniform in this range.
    pub hold: (Duration, Duration),
    /// A planted flaw in every candidate, or none.
    pub flaw: QuorumFlaw,
    /// Workers act for a ttl past their term's deadline, whatever the elector says (work that
    /// trusts a cached term): a planted bug.
    pub ignore_deadline: bool,
}

impl QuorumSimConfig {
    /// Three candidates over three members for 60 simulated seconds (faults stop 12 s before
    /// the end) with a 2 s ttl, 1 % drift, up to 10 ms latency each way, 3 % of member writes
    /// and 10 % of fenced writes delivered 0.5 s to 3 s late.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            members: 3,
            candidates: 3,
            duration: Duration::from_secs(60),
            quiet: Duration::from_secs(12),
            timing: Timing::from_ttl(Duration::from_secs(2)),
            max_drift: 0.01,
            base_latency: Duration::from_millis(10),
            late_writes: 0.03,
            late_fenced_writes: 0.1,
            hold: (Duration::from_millis(500), Duration::from_secs(3)),
            flaw: QuorumFlaw::None,
            ignore_deadline: false,
        }
    }

    /// With `members` member stores.
    pub fn with_members(mut self, members: usize) -> Self {
        self.members = members;
        self
    }

    /// With a planted flaw. [`QuorumFlaw::EvenHalves`] needs an even number of members: it
    /// sets four if the number is odd.
    pub fn with_flaw(mut self, flaw: QuorumFlaw) -> Self {
        self.flaw = flaw;
        if flaw == QuorumFlaw::EvenHalves && self.members % 2 == 1 {
            self.members = 4;
        }
        self
    }
}

/// What an operator removed from a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deletion {
    /// The term record (`KEY.q`).
    Record,
    /// The token mark (`KEY.qhw`) alone: the record still carries its token.
    Mark,
    /// The term record and the token mark (`KEY.qhw`).
    RecordAndMark,
    /// Everything: the record, the mark and the member's identity (`KEY.qid`), as a store
    /// that comes back empty.
    Wipe,
}

/// One entry of the history; `at` is simulated time since the start.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum QuorumEvent {
    Started {
        cand: Cand,
        at: Duration,
    },
    Crashed {
        cand: Cand,
        at: Duration,
    },
    Frozen {
        cand: Cand,
        at: Duration,
        until: Duration,
    },
    /// The process was paused after a member applied its write and answered, before it read
    /// the answer (which it reads when it resumes).
    PausedInFlight {
        cand: Cand,
        at: Duration,
        until: Duration,
    },
    /// Cut from every member and from the protected object.
    Partitioned {
        cand: Cand,
        at: Duration,
        until: Duration,
    },
    /// Cut from the member `store` alone (the other candidates still reach it).
    Cut {
        cand: Cand,
        store: usize,
        at: Duration,
        until: Duration,
    },
    /// The member is down (or hangs) for everyone.
    Outage {
        store: usize,
        at: Duration,
        until: Duration,
    },
    /// The member answers slowly (some calls time out).
    Slow {
        store: usize,
        at: Duration,
        until: Duration,
    },
    /// The member fails calls, loses answers and delivers more writes late.
    Storm {
        store: usize,
        at: Duration,
        until: Duration,
    },
    /// An operator removed objects of the key from a member.
    Deleted {
        store: usize,
        what: Deletion,
        at: Duration,
    },
    /// A write of `cand` held for late delivery by the member `store` (`None`: a fenced
    /// write, held by the protected object's store).
    Held {
        cand: Cand,
        store: Option<usize>,
        at: Duration,
        until: Duration,
    },
    /// The held write is applied now (conditionally, as any write).
    Delivered {
        cand: Cand,
        store: Option<usize>,
        at: Duration,
    },
    Resigned {
        cand: Cand,
        at: Duration,
    },
    /// The elector granted a term (seen from outside the process).
    Granted {
        cand: Cand,
        token: u64,
        at: Duration,
    },
    /// The elector's term ended (seen from outside the process).
    Revoked {
        cand: Cand,
        token: u64,
        at: Duration,
    },
    /// The worker began acting on a term.
    TermStarted {
        cand: Cand,
        token: u64,
        at: Duration,
    },
    /// The worker stopped acting: its deadline, or the cancellation.
    TermEnded {
        cand: Cand,
        token: u64,
        at: Duration,
    },
    /// A fenced write of `cand` reached the protected object, which took it (`accepted`), or
    /// the writer learnt that it was refused as stale.
    Write {
        cand: Cand,
        token: u64,
        at: Duration,
        accepted: bool,
    },
    /// The member `store` applied a write that put a new term in its record (an acquisition,
    /// a member taken back, or a tombstone: the first write of a block), with `token`, over a
    /// record with the token `replaced` (`None`: over no record).
    Landed {
        store: usize,
        cand: Option<Cand>,
        token: u64,
        replaced: Option<u64>,
        held: bool,
        at: Duration,
    },
    /// Faults stopped; `down`: a member kept down to the end.
    Quiet {
        at: Duration,
        down: Option<usize>,
    },
    /// The members at the end: `empty` have neither a record nor a mark.
    Final {
        empty: Vec<usize>,
    },
}

impl QuorumEvent {
    /// The event as the single-key simulation's checkers know it, if they know it.
    pub fn as_event(&self) -> Option<Event> {
        Some(match *self {
            QuorumEvent::Started { cand, at } => Event::Started { cand, at },
            QuorumEvent::Crashed { cand, at } => Event::Crashed { cand, at },
            QuorumEvent::Frozen { cand, at, until } => Event::Frozen { cand, at, until },
            QuorumEvent::PausedInFlight { cand, at, until } => {
                Event::PausedInFlight { cand, at, until }
            }
            QuorumEvent::Partitioned { cand, at, until } => Event::Partitioned { cand, at, until },
            QuorumEvent::Resigned { cand, at } => Event::Resigned { cand, at },
            QuorumEvent::Granted { cand, token, at } => Event::Granted { cand, token, at },
            QuorumEvent::Revoked { cand, token, at } => Event::Revoked { cand, token, at },
            QuorumEvent::TermStarted { cand, token, at } => Event::TermStarted { cand, token, at },
            QuorumEvent::TermEnded { cand, token, at } => Event::TermEnded { cand, token, at },
            QuorumEvent::Write {
                cand,
                token,
                at,
                accepted,
            } => Event::Write {
                cand,
                token,
                at,
                accepted,
            },
            _ => return None,
        })
    }
}

/// The result of one seed.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct QuorumReport {
    /// The seed.
    pub seed: u64,
    /// How many members.
    pub members: usize,
    /// Everything that happened, in the order it happened.
    pub events: Vec<QuorumEvent>,
    /// What the checkers found (empty if all invariants held).
    pub violations: Vec<Violation>,
    /// How many terms began (as workers saw them).
    pub terms: usize,
    /// How the election recovered once faults stopped.
    pub recovery: Recovery,
}

impl QuorumReport {
    /// A hash of the whole history (every event, in order): equal for two runs of one seed.
    pub fn history_hash(&self) -> u64 {
        // FNV-1a over the events' debug forms, as the single-key history's.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for e in &self.events {
            for b in format!("{e:?}\n").bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        h
    }

    /// The history as the single-key checkers know it.
    pub fn projected(&self) -> Vec<Event> {
        self.events
            .iter()
            .filter_map(QuorumEvent::as_event)
            .collect()
    }

    /// How many events match `f`.
    pub fn count(&self, f: impl Fn(&QuorumEvent) -> bool) -> usize {
        self.events.iter().filter(|e| f(e)).count()
    }

    /// Whether some violation came from a safety checker (all but liveness).
    pub fn unsafe_history(&self) -> bool {
        self.violations.iter().any(|v| v.checker != "liveness")
    }
}

/// How the election recovered once faults stopped (and the last write held by a member
/// landed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Recovery {
    /// How long until a candidate acted; `None` if none did by the end.
    pub to_leader: Option<Duration>,
    /// The longest stretch in which no candidate acted.
    pub longest_gap: Duration,
}

/// The longest stretch without a leader allowed once faults have stopped:
/// `2 x ttl + 4 x poll_every + 8 x request_timeout`, scaled for drift.
///
/// Why it suffices, with every member healthy (or all but one down for good) and every
/// candidate able: a candidate reads every member within `1.1 x poll_every` (plus a round, at
/// most a request timeout per call); a record it then sees unchanged for a ttl on its clock is
/// free, and it takes a majority in one read round, one full round (records, marks) and two
/// write rounds (the first member alone, then the rest), each call within a request timeout.
/// What can add to that, once: a split vote (candidates that each took a minority give it back
/// and back off up to `2 x poll_every`; given-back records are free at once only to their
/// writer, so the others may wait a ttl on them), or a member found empty (a tombstone, timed
/// for a ttl, written in the same round as the first look).
pub fn quorum_liveness_bound(config: &QuorumSimConfig) -> Duration {
    let t = config.timing;
    (t.ttl * 2 + t.poll_every * 4 + t.request_timeout * 8).mul_f64(1.0 + 2.0 * config.max_drift)
}

/// Checker 4: on each member, every write that puts a new term in the record (an
/// acquisition, a member taken back into a term, a tombstone) over a record of the member's
/// history (stamped with its identity: not one written before the member was emptied, landing
/// late) carries a token
/// strictly above the replaced record's (guard P1 of `docs/quorum.md`: tokens never go down
/// along a member's chain of records, the ground of the tokens' order across terms).
pub fn check_store_chains(events: &[QuorumEvent]) -> Vec<Violation> {
    events
        .iter()
        .filter_map(|e| match *e {
            QuorumEvent::Landed {
                store,
                cand,
                token,
                replaced: Some(replaced),
                held,
                at,
            } if token <= replaced => Some(Violation {
                checker: "store chain",
                detail: format!(
                    "member {store}: a {} record with token {token} from {} replaced token \
                     {replaced} at {at:?}",
                    if held { "held" } else { "released" },
                    cand.map_or_else(|| "an unknown writer".to_owned(), |c| format!("cand {c}"))
                ),
            }),
            _ => None,
        })
        .collect()
}

/// Checker 5: once faults have stopped (the [`QuorumEvent::Quiet`] instant, or later if a
/// write held by a member lands later), no stretch without a candidate acting lasts longer
/// than [`quorum_liveness_bound`]. Returns how the election recovered, and the violations.
pub fn check_quorum_liveness(
    config: &QuorumSimConfig,
    events: &[QuorumEvent],
) -> (Recovery, Vec<Violation>) {
    let end = config.duration;
    let Some(quiet) = events.iter().find_map(|e| match e {
        QuorumEvent::Quiet { at, .. } => Some(*at),
        _ => None,
    }) else {
        let v = Violation {
            checker: "liveness",
            detail: "the run did not reach its quiet stretch".to_owned(),
        };
        return (Recovery::default(), vec![v]);
    };
    let from = events
        .iter()
        .filter_map(|e| match e {
            QuorumEvent::Held {
                store: Some(_),
                until,
                ..
            } => Some(*until),
            _ => None,
        })
        .fold(quiet, Duration::max)
        .min(end);
    let projected: Vec<Event> = events.iter().filter_map(QuorumEvent::as_event).collect();
    let mut covered: Vec<(Duration, Duration)> = spans(&projected, end)
        .into_iter()
        .filter(|s| s.end > from)
        .map(|s| (s.start.max(from), s.end))
        .collect();
    covered.sort();
    let bound = quorum_liveness_bound(config);
    let mut recovery = Recovery::default();
    let mut at = from;
    let mut gaps = Vec::new();
    for (a, b) in covered {
        if a > at {
            gaps.push((at, a));
        }
        if recovery.to_leader.is_none() {
            recovery.to_leader = Some(a.saturating_sub(from));
        }
        at = at.max(b);
    }
    if at < end {
        gaps.push((at, end));
    }
    let empty = events.iter().rev().find_map(|e| match e {
        QuorumEvent::Final { empty } => Some(empty.clone()),
        _ => None,
    });
    let mut out = Vec::new();
    for (a, b) in gaps {
        recovery.longest_gap = recovery.longest_gap.max(b - a);
        if b - a > bound {
            let state = match &empty {
                Some(e) if !e.is_empty() => {
                    format!("; at the end members {e:?} had neither a record nor a mark of the key")
                }
                _ => String::new(),
            };
            out.push(Violation {
                checker: "liveness",
                detail: format!(
                    "no leader from {a:?} to {b:?}, after faults stopped at {from:?} (bound \
                     {bound:?}){state}"
                ),
            });
        }
    }
    (recovery, out)
}

/// Plays one seed and checks its history.
pub fn run_quorum(config: &QuorumSimConfig) -> QuorumReport {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build();
    let events = match runtime {
        Ok(rt) => rt.block_on(simulate(config.clone())),
        Err(e) => {
            return QuorumReport {
                seed: config.seed,
                members: config.members,
                events: Vec::new(),
                violations: vec![Violation {
                    checker: "runtime",
                    detail: e.to_string(),
                }],
                terms: 0,
                recovery: Recovery::default(),
            };
        }
    };
    let projected: Vec<Event> = events.iter().filter_map(QuorumEvent::as_event).collect();
    let mut violations = check_one_leader(&projected, config.duration);
    violations.extend(check_tokens(&projected));
    violations.extend(check_fencing(&projected));
    violations.extend(check_store_chains(&events));
    let (recovery, liveness) = check_quorum_liveness(config, &events);
    violations.extend(liveness);
    QuorumReport {
        seed: config.seed,
        members: config.members,
        terms: projected
            .iter()
            .filter(|e| matches!(e, Event::TermStarted { .. }))
            .count(),
        events,
        violations,
        recovery,
    }
}

/// The objects of the key on every member.
struct Names {
    record: ObjectName,
    mark: ObjectName,
    id: ObjectName,
}

impl Names {
    fn new() -> Option<Self> {
        Some(Self {
            record: ObjectName::new("sim.q").ok()?,
            mark: ObjectName::new("sim.qhw").ok()?,
            id: ObjectName::new("sim.qid").ok()?,
        })
    }
}

/// The shared world: the clock, the log, the members and their store-wide faults, the
/// protected object's store.
struct World {
    start: Instant,
    /// When faults stop.
    quiet_at: Instant,
    events: Mutex<Vec<QuorumEvent>>,
    stores: Vec<MemoryStore>,
    /// Store-wide faults, one per member.
    faults: Vec<Switch>,
    /// A member kept down through the quiet stretch.
    kept_down: Mutex<Option<usize>>,
    /// The store of the protected object.
    resource: MemoryStore,
    /// Its faults (its own rate of late delivery).
    resource_faults: Arc<FaultControl>,
    /// The candidates acting now, with their terms' tokens.
    leaders: Mutex<BTreeMap<Cand, u64>>,
    names: Names,
    config: QuorumSimConfig,
}

impl World {
    fn now(&self) -> Duration {
        Instant::now() - self.start
    }

    fn since_start(&self, t: Instant) -> Duration {
        t.saturating_duration_since(self.start)
    }

    fn log(&self, e: QuorumEvent) {
        lock(&self.events).push(e);
    }

    /// A member's faults when nothing happens to it: latency, and late writes until faults
    /// stop.
    fn healthy(&self) -> Faults {
        let quiet = Instant::now() >= self.quiet_at;
        Faults {
            latency: self.config.base_latency,
            late: if quiet { 0.0 } else { self.config.late_writes },
            hold_min: self.config.hold.0,
            hold_max: self.config.hold.1,
            ..Faults::default()
        }
    }

    /// Ends a fault of member `j`: healthy again (unless it is kept down to the end).
    fn restore(&self, j: usize) {
        let down = *lock(&self.kept_down) == Some(j);
        let mut faults = self.healthy();
        faults.down = down;
        self.faults[j].control.set(faults);
    }

    fn leader(&self) -> Option<Cand> {
        lock(&self.leaders).keys().next().copied()
    }

    /// Whether member `j` shows the clients neither a record nor a mark of the key (the
    /// memory store answers at once). As the clients read it: a record or mark stamped with
    /// another identity than the member's is absent (written before a wipe, landing late; with
    /// no identity at all, the next full round draws a new one, so everything is).
    async fn empty(&self, j: usize) -> bool {
        let store = &self.stores[j];
        let id = match store.get_fenced(&self.names.id).await {
            Ok(o) => o.map(|o| o.value),
            Err(_) => return false,
        };
        let ours = |stamp: &[u8]| id.as_deref() == Some(stamp);
        let record = match store.get_fenced(&self.names.record).await {
            Ok(Some(o)) => Record::decode(&self.names.record, "", &o.value)
                .map_or(true, |r| ours(r.stamp.as_bytes())),
            Ok(None) => false,
            Err(_) => return false,
        };
        let mark = match store.get_fenced(&self.names.mark).await {
            Ok(Some(o)) => ours(&o.value),
            Ok(None) => false,
            Err(_) => return false,
        };
        !record && !mark
    }
}

/// A fault control whose faults may overlap: each fault counts itself in, and the control is
/// restored when the last of them ends (not when the first does).
#[derive(Clone)]
struct Switch {
    control: Arc<FaultControl>,
    active: Arc<Mutex<usize>>,
}

impl Switch {
    fn new() -> Self {
        Self {
            control: FaultControl::new(),
            active: Arc::default(),
        }
    }

    /// Applies `fault` now, for `d`; then `restore`, unless another fault is still on.
    fn apply(
        &self,
        d: Duration,
        fault: impl FnOnce(&mut Faults),
        restore: impl FnOnce(&FaultControl) + Send + 'static,
    ) {
        *lock(&self.active) += 1;
        self.control.update(fault);
        let this = self.clone();
        tokio::spawn(async move {
            sleep(d).await;
            let last = {
                let mut active = lock(&this.active);
                *active = active.saturating_sub(1);
                *active == 0
            };
            if last {
                restore(&this.control);
            }
        });
    }

    /// Cuts for `d` (the calls hang, or fail at once); no fault after.
    fn cut(&self, d: Duration, hang: bool) {
        self.apply(
            d,
            |f| {
                f.down = !hang;
                f.hang = hang;
            },
            |c| c.set(Faults::default()),
        );
    }
}

/// What a term record says, as far as the simulation reads it.
#[derive(serde::Deserialize)]
struct RecordView {
    holder: String,
    term: String,
    state: String,
}

impl RecordView {
    fn parse(bytes: &[u8]) -> Option<Self> {
        serde_json::from_slice(bytes).ok()
    }
}

/// The candidate a holder id names (`c7` is candidate 7).
fn cand_of(holder: &str) -> Option<Cand> {
    holder.strip_prefix('c').and_then(|c| c.parse().ok())
}

/// Member `j` as every candidate reaches it: the memory store, logging each write that puts
/// a new term in the record.
struct MemberStore {
    world: Arc<World>,
    j: usize,
}

impl std::fmt::Debug for MemberStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MemberStore({})", self.j)
    }
}

#[async_trait]
impl FencedCas for MemberStore {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        self.world.stores[self.j].get_fenced(object).await
    }

    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        let store = &self.world.stores[self.j];
        if *put.object != self.world.names.record {
            return store.put_fenced_if(put).await;
        }
        // The memory store answers at once: nothing runs between these reads and the write.
        let before = store.get_fenced(put.object).await?;
        let id = store
            .get_fenced(&self.world.names.id)
            .await?
            .map(|o| o.value);
        let token = put.fence.token.get();
        let new = RecordView::parse(put.value);
        let outcome = store.put_fenced_if(put).await?;
        if let (ObjectWrite::Written(_), Some(new)) = (&outcome, new) {
            let same_term = before
                .as_ref()
                .and_then(|o| RecordView::parse(&o.value))
                .is_some_and(|v| v.term == new.term);
            if !same_term {
                self.world.log(QuorumEvent::Landed {
                    store: self.j,
                    cand: cand_of(&new.holder),
                    token,
                    // A record stamped with another identity (written before the member
                    // was emptied) is not the member's history: over no record.
                    replaced: before
                        .filter(|o| {
                            Record::decode(&self.world.names.record, "", &o.value)
                                .is_ok_and(|r| id.as_deref() == Some(r.stamp.as_bytes()))
                        })
                        .map(|o| o.fence.get()),
                    held: new.state == "held",
                    at: self.world.now(),
                });
            }
        }
        Ok(outcome)
    }
}

/// Members are reached only as conditional object stores; the lease calls are never made.
#[async_trait]
impl LeaseBackend for MemberStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        self.world.stores[self.j].read(key).await
    }

    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        self.world.stores[self.j].write(request).await
    }
}

/// A pause armed on a process: it freezes once a member has applied and answered its next
/// record write, before it reads the answer.
#[derive(Clone, Copy)]
struct Pause {
    frozen: Duration,
    /// How long it is then cut from every member after it resumes.
    then_cut: Option<Duration>,
}

/// One candidate's process, as its links to the members see it.
struct Process {
    world: Arc<World>,
    cand: Cand,
    gate: Arc<Gate>,
    /// The candidate's own faults: cut from everything.
    control: Switch,
    pause: Mutex<Option<Pause>>,
}

impl Process {
    fn arm(&self, pause: Pause) {
        *lock(&self.pause) = Some(pause);
    }

    /// Freezes the process after an answered write, if a pause is armed (and faults have not
    /// stopped); the freeze ends before faults stop.
    async fn pause_in_flight(&self) {
        let Some(pause) = lock(&self.pause).take() else {
            return;
        };
        let left = self
            .world
            .quiet_at
            .saturating_duration_since(Instant::now());
        let frozen = pause.frozen.min(left);
        if frozen.is_zero() || !freeze(&self.world, self.cand, &self.gate, frozen, true) {
            return;
        }
        if let Some(cut) = pause.then_cut {
            let cut = cut.min(left - frozen);
            let (at, until) = (self.world.now(), self.world.now() + frozen + cut);
            self.control.cut(frozen + cut, false);
            self.world.log(QuorumEvent::Partitioned {
                cand: self.cand,
                at,
                until,
            });
        }
        // Give up the thread: the gate keeps the process from running until it thaws, and
        // only then does it read the answer.
        tokio::task::yield_now().await;
    }
}

/// Freezes `cand`'s process for `d` (unless it is frozen already) and logs it; whether it
/// froze.
fn freeze(world: &Arc<World>, cand: Cand, gate: &Arc<Gate>, d: Duration, in_flight: bool) -> bool {
    let Some(generation) = gate.freeze() else {
        return false;
    };
    let (at, until) = (world.now(), world.now() + d);
    world.log(if in_flight {
        QuorumEvent::PausedInFlight { cand, at, until }
    } else {
        QuorumEvent::Frozen { cand, at, until }
    });
    let gate = gate.clone();
    tokio::spawn(async move {
        sleep(d).await;
        gate.thaw(generation);
    });
    true
}

/// One candidate's way to one member: the member's faults, the candidate's faults towards
/// it, and the candidate's process (for pauses in flight).
struct Link {
    inner: FaultyStore<MemberStore>,
    process: Arc<Process>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Link(cand {} to member {})",
            self.process.cand,
            self.inner.inner().j
        )
    }
}

#[async_trait]
impl FencedCas for Link {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        self.inner.get_fenced(object).await
    }

    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        let record = *put.object == self.process.world.names.record;
        let outcome = self.inner.put_fenced_if(put).await;
        if record && matches!(outcome, Ok(ObjectWrite::Written(_))) {
            self.process.pause_in_flight().await;
        }
        outcome
    }
}

#[async_trait]
impl LeaseBackend for Link {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        self.inner.read(key).await
    }

    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        self.inner.write(request).await
    }
}

/// The protected object, logging each fenced write it takes, as it takes it.
struct Resource {
    world: Arc<World>,
    cand: Cand,
}

impl std::fmt::Debug for Resource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Resource(cand {})", self.cand)
    }
}

#[async_trait]
impl FencedCas for Resource {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        self.world.resource.get_fenced(object).await
    }

    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        let token = put.fence.token.get();
        let outcome = self.world.resource.put_fenced_if(put).await;
        if let Ok(ObjectWrite::Written(_)) = outcome {
            self.world.log(QuorumEvent::Write {
                cand: self.cand,
                token,
                at: self.world.now(),
                accepted: true,
            });
        }
        outcome
    }
}

/// A running candidate.
struct Running {
    gate: Arc<Gate>,
    /// Cut from everything.
    control: Switch,
    /// Cut from one member each.
    links: Vec<Switch>,
    process: Arc<Process>,
    driver: JoinHandle<()>,
    worker: JoinHandle<()>,
    observer: JoinHandle<()>,
    resign: mpsc::Sender<()>,
}

/// How often a worker acts while its term is valid.
const WORK_EVERY: Duration = Duration::from_millis(250);

/// Logs the late writes of `cand` to member `store` (`None`: to the protected object).
fn late_logger(
    world: &Arc<World>,
    cand: Cand,
    store: Option<usize>,
) -> impl Fn(Late) + Send + Sync + use<> {
    let world = world.clone();
    move |late: Late| match late {
        Late::Held { until, .. } => world.log(QuorumEvent::Held {
            cand,
            store,
            at: world.now(),
            until: world.since_start(until),
        }),
        Late::Applying { .. } => world.log(QuorumEvent::Delivered {
            cand,
            store,
            at: world.now(),
        }),
    }
}

/// The quorum as candidate `cand` reaches it (through `process`'s faults), and its faults
/// towards each member.
fn quorum_of(world: &Arc<World>, process: &Arc<Process>, rng: &mut Rng) -> (Quorum, Vec<Switch>) {
    let cand = process.cand;
    let mut links = Vec::new();
    let members: Vec<QuorumMember> = (0..world.config.members)
        .map(|j| {
            let link = Switch::new();
            let controls = vec![
                world.faults[j].control.clone(),
                link.control.clone(),
                process.control.control.clone(),
            ];
            links.push(link);
            let inner = FaultyStore::new(
                MemberStore {
                    world: world.clone(),
                    j,
                },
                rng.next_u64(),
                controls,
            )
            .on_late(late_logger(world, cand, Some(j)));
            let store = Link {
                inner,
                process: process.clone(),
            };
            QuorumMember::new(format!("m{j}"), Arc::new(store))
        })
        .collect();
    let quorum = match Quorum::new(members.clone()) {
        Ok(q) => q,
        // An even number of members: only for the negative control.
        Err(_) => Quorum::unchecked(members),
    };
    (quorum.with_flaw(world.config.flaw), links)
}

fn start(world: &Arc<World>, cand: Cand, rng: &mut Rng) -> Option<Running> {
    let control = Switch::new();
    let gate = Arc::new(Gate::default());
    let process = Arc::new(Process {
        world: world.clone(),
        cand,
        gate: gate.clone(),
        control: control.clone(),
        pause: Mutex::new(None),
    });
    let (quorum, links) = quorum_of(world, &process, rng);
    let resource = Arc::new(
        FaultyStore::new(
            Resource {
                world: world.clone(),
                cand,
            },
            rng.next_u64(),
            vec![world.resource_faults.clone(), control.control.clone()],
        )
        .on_late(late_logger(world, cand, None)),
    );
    let drift = (rng.next_f64() * 2.0 - 1.0) * world.config.max_drift;
    let (handle, task) = Elector::quorum_builder(quorum, LeaseKey::new("sim").ok()?)
        .timing(world.config.timing)
        .holder_id(HolderId::new(format!("c{cand}")).ok()?)
        .jitter_seed(rng.next_u64())
        .simulated_clock_rate(1.0 + drift)
        .build()
        .ok()?
        .into_parts();
    let granted = Arc::new(Notify::new());
    let observer = tokio::spawn(observe(
        world.clone(),
        cand,
        handle.leadership(),
        granted.clone(),
    ));
    let (resign_tx, resign_rx) = mpsc::channel(1);
    let driver = tokio::spawn(Freezable {
        inner: task,
        gate: gate.clone(),
    });
    let worker = tokio::spawn(Freezable {
        inner: Box::pin(work(
            world.clone(),
            cand,
            handle,
            resource,
            granted,
            resign_rx,
        )),
        gate: gate.clone(),
    });
    world.log(QuorumEvent::Started {
        cand,
        at: world.now(),
    });
    Some(Running {
        gate,
        control,
        links,
        process,
        driver,
        worker,
        observer,
        resign: resign_tx,
    })
}

/// Records grants and revocations as the elector publishes them, and tells the worker of each
/// new term; runs outside the frozen process. The only task that waits on the candidate's
/// `Leadership` channel.
async fn observe(
    world: Arc<World>,
    cand: Cand,
    mut rx: watch::Receiver<Leadership>,
    granted: Arc<Notify>,
) {
    let mut current: Option<u64> = None;
    loop {
        let token = rx.borrow_and_update().token().map(|t| t.0);
        if token != current {
            if let Some(old) = current {
                world.log(QuorumEvent::Revoked {
                    cand,
                    token: old,
                    at: world.now(),
                });
            }
            if let Some(new) = token {
                world.log(QuorumEvent::Granted {
                    cand,
                    token: new,
                    at: world.now(),
                });
                granted.notify_one();
            }
            current = token;
        }
        if rx.changed().await.is_err() {
            if let Some(old) = current {
                world.log(QuorumEvent::Revoked {
                    cand,
                    token: old,
                    at: world.now(),
                });
            }
            return;
        }
    }
}

/// A worker's belief that it may act: logs its end when dropped (normally, or when the task
/// is aborted by a crash).
struct Belief {
    world: Arc<World>,
    cand: Cand,
    term: Term,
}

impl Drop for Belief {
    fn drop(&mut self) {
        let now = self.world.now();
        let at = if self.world.config.ignore_deadline {
            now
        } else {
            now.min(self.world.since_start(self.term.deadline()))
        };
        self.world.log(QuorumEvent::TermEnded {
            cand: self.cand,
            token: self.term.token().0,
            at,
        });
        lock(&self.world.leaders).remove(&self.cand);
    }
}

/// A candidate's work: whenever it leads, a fenced write to the protected object every
/// `WORK_EVERY`, only while the term allows it (or, with the planted bug, a ttl longer).
async fn work(
    world: Arc<World>,
    cand: Cand,
    handle: ElectorHandle,
    resource: Arc<FaultyStore<Resource>>,
    granted: Arc<Notify>,
    mut resign: mpsc::Receiver<()>,
) {
    let Ok(object) = ObjectName::new("resource") else {
        return;
    };
    let ignore_deadline = world.config.ignore_deadline;
    let request_timeout = world.config.timing.request_timeout;
    let ttl = world.config.timing.ttl;
    loop {
        tokio::select! {
            biased;
            Some(()) = resign.recv() => { let _ = handle.resign().await; continue; }
            () = granted.notified() => {}
        }
        let term = match term_ready(&handle).await {
            Some(Ok(term)) => term,
            Some(Err(())) => return,
            // The term ended before this process could look (it was frozen).
            None => continue,
        };
        let token = term.token().0;
        world.log(QuorumEvent::TermStarted {
            cand,
            token,
            at: world.now(),
        });
        lock(&world.leaders).insert(cand, token);
        let belief = Belief {
            world: world.clone(),
            cand,
            term,
        };
        let mut resigning = false;
        loop {
            let acting = if ignore_deadline {
                Instant::now() < belief.term.deadline() + ttl
            } else {
                belief.term.is_valid()
            };
            if !acting {
                break;
            }
            let write = resource.fenced_write(belief.term.fence(), &object, b"work");
            if let Ok(Err(e)) = timeout(request_timeout, write).await
                && e.kind() == ErrorKind::Fenced
            {
                world.log(QuorumEvent::Write {
                    cand,
                    token,
                    at: world.now(),
                    accepted: false,
                });
            }
            tokio::select! {
                biased;
                _ = belief.term.cancelled(), if !ignore_deadline => break,
                Some(()) = resign.recv() => { resigning = true; break; }
                _ = sleep(WORK_EVERY) => {}
            }
        }
        drop(belief);
        if resigning {
            world.log(QuorumEvent::Resigned {
                cand,
                at: world.now(),
            });
            let _ = handle.resign().await;
        }
    }
}

/// Stops a candidate as a crash does: its tasks end where they are.
async fn kill(r: Running) {
    r.driver.abort();
    r.worker.abort();
    let _ = r.driver.await;
    let _ = r.worker.await;
    r.observer.abort();
    let _ = r.observer.await;
}

async fn simulate(config: QuorumSimConfig) -> Vec<QuorumEvent> {
    // Valid names; without them the run has no history (and fails the liveness checker).
    let Some(names) = Names::new() else {
        return Vec::new();
    };
    let start = Instant::now();
    let end = start + config.duration;
    let quiet_at = end.checked_sub(config.quiet).unwrap_or(start);
    let world = Arc::new(World {
        start,
        quiet_at,
        events: Mutex::new(Vec::new()),
        stores: (0..config.members).map(|_| MemoryStore::new()).collect(),
        faults: (0..config.members).map(|_| Switch::new()).collect(),
        kept_down: Mutex::new(None),
        resource: MemoryStore::new(),
        resource_faults: FaultControl::new(),
        leaders: Mutex::new(BTreeMap::new()),
        names,
        config: config.clone(),
    });
    for j in 0..config.members {
        world.restore(j);
    }
    world.resource_faults.set(Faults {
        latency: config.base_latency,
        late: config.late_fenced_writes,
        hold_min: config.hold.0,
        hold_max: config.hold.1,
        ..Faults::default()
    });
    let mut director = Director {
        rng: Rng::seeded(config.seed),
        ttl: config.timing.ttl,
        world: world.clone(),
        running: BTreeMap::new(),
        next: 0,
        restarts: Vec::new(),
        left: Duration::ZERO,
    };
    for _ in 0..config.candidates {
        director.start();
        let pause = director
            .rng
            .duration(Duration::ZERO, Duration::from_millis(100));
        sleep(pause).await;
    }
    director.play_until(quiet_at).await;
    director.quiet().await;
    sleep_until(end).await;
    let mut empty = Vec::new();
    for j in 0..config.members {
        if world.empty(j).await {
            empty.push(j);
        }
    }
    world.log(QuorumEvent::Final { empty });
    for r in std::mem::take(&mut director.running).into_values() {
        kill(r).await;
    }
    lock(&world.events).clone()
}

/// A fault, or an operator's act.
enum Action {
    FreezeLeader(Duration),
    FreezeAnyone(Duration),
    /// Restart under a new id after this.
    CrashLeader(Duration),
    CrashAnyone(Duration),
    /// Cut from everything; hang (or refuse).
    PartitionLeader(Duration, bool),
    /// Cut the leader from these members.
    CutLeader(Vec<usize>, Duration, bool),
    /// Cut a follower from these members.
    CutFollower(Vec<usize>, Duration, bool),
    PauseLeaderInFlight(Duration),
    PauseFollowerInFlight(Duration),
    /// Pause the leader briefly with a renew's answer in flight, then cut it from everything.
    PauseLeaderThenCut(Duration, Duration),
    ResignLeader,
    /// These members down for everyone; hang (or refuse).
    Outage(Vec<usize>, Duration, bool),
    Slow(usize, Duration),
    Storm(usize, Duration),
    Delete(Vec<usize>, Deletion),
}

/// The candidates of one run, and the faults played on them.
struct Director {
    rng: Rng,
    ttl: Duration,
    world: Arc<World>,
    running: BTreeMap<Cand, Running>,
    /// The number of the next candidate to start.
    next: Cand,
    /// Candidates to start at an instant.
    restarts: Vec<Instant>,
    /// How long until faults stop: every fault ends before.
    left: Duration,
}

impl Director {
    fn start(&mut self) {
        if let Some(r) = start(&self.world, self.next, &mut self.rng) {
            self.running.insert(self.next, r);
        }
        self.next += 1;
    }

    /// Plays faults until `quiet_at`, restarting crashed candidates; those still due start
    /// then.
    async fn play_until(&mut self, quiet_at: Instant) {
        let ttl = self.ttl;
        let mut next_action = Instant::now() + self.rng.duration(ttl / 2, ttl * 2);
        loop {
            self.restarts.sort();
            let wake = self
                .restarts
                .first()
                .map_or(next_action, |t| (*t).min(next_action));
            if wake >= quiet_at {
                break;
            }
            sleep_until(wake).await;
            if self.restarts.first().is_some_and(|t| *t <= Instant::now()) {
                self.restarts.remove(0);
                self.start();
                continue;
            }
            next_action = Instant::now() + self.rng.duration(ttl / 2, ttl * 2);
            self.left = quiet_at.saturating_duration_since(Instant::now());
            let action = self.pick();
            self.play(action).await;
        }
        sleep_until(quiet_at).await;
        for _ in std::mem::take(&mut self.restarts) {
            self.start();
        }
    }

    /// Faults stop: every member healthy with no late delivery (one perhaps kept down, if
    /// none of the others is empty), no pause armed.
    async fn quiet(&mut self) {
        let world = self.world.clone();
        let n = world.config.members;
        let down = if self.rng.chance(0.3) {
            Some(self.rng.range_u64(0, n as u64 - 1) as usize)
        } else {
            None
        };
        // A member that lost everything is suspect until written again: with another one
        // down, a majority of the others may not answer with their history (no term, safe).
        let mut empty = Vec::new();
        for j in 0..n {
            empty.push(world.empty(j).await);
        }
        let down = down.filter(|d| !(0..n).any(|j| j != *d && empty[j]));
        *lock(&world.kept_down) = down;
        for j in 0..n {
            world.restore(j);
        }
        for r in self.running.values() {
            *lock(&r.process.pause) = None;
        }
        world.log(QuorumEvent::Quiet {
            at: world.now(),
            down,
        });
    }

    /// A duration of `lo` to `hi` ttls, ending before faults stop.
    fn span(&mut self, lo: f64, hi: f64) -> Duration {
        let ttl = self.ttl;
        self.rng
            .duration(ttl.mul_f64(lo), ttl.mul_f64(hi))
            .min(self.left)
    }

    /// `k` distinct members, at random.
    fn members(&mut self, k: usize) -> Vec<usize> {
        let mut all: Vec<usize> = (0..self.world.config.members).collect();
        let mut out = Vec::new();
        while out.len() < k && !all.is_empty() {
            let i = self.rng.range_u64(0, all.len() as u64 - 1) as usize;
            out.push(all.remove(i));
        }
        out.sort_unstable();
        out
    }

    fn pick(&mut self) -> Action {
        let n = self.world.config.members;
        let majority = n / 2 + 1;
        let some = |d: &mut Self| {
            let k = d.rng.range_u64(1, n as u64 - 1) as usize;
            d.members(k)
        };
        match self.rng.range_u64(0, 23) {
            0 | 1 => Action::FreezeLeader(self.span(1.2, 3.0)),
            2 => Action::FreezeAnyone(self.span(0.2, 2.0)),
            3 | 4 => Action::CrashLeader(self.span(0.2, 1.5)),
            5 => Action::CrashAnyone(self.span(0.2, 1.5)),
            6 => {
                let hang = self.rng.chance(0.5);
                Action::PartitionLeader(self.span(0.3, 2.0), hang)
            }
            7..=9 => {
                let (stores, hang) = (some(self), self.rng.chance(0.5));
                Action::CutLeader(stores, self.span(0.5, 3.0), hang)
            }
            10 => {
                let (stores, hang) = (some(self), self.rng.chance(0.5));
                Action::CutFollower(stores, self.span(0.5, 3.0), hang)
            }
            11 => Action::PauseLeaderInFlight(self.span(1.2, 3.0)),
            12 => Action::PauseFollowerInFlight(self.span(1.2, 3.0)),
            13 => {
                let pause = self.span(0.22, 0.45);
                Action::PauseLeaderThenCut(pause, self.span(1.0, 2.0))
            }
            14 => Action::ResignLeader,
            15 | 16 => {
                let (stores, hang) = (self.members(1), self.rng.chance(0.5));
                Action::Outage(stores, self.span(0.3, 3.0), hang)
            }
            17 => {
                let (stores, hang) = (self.members(majority), self.rng.chance(0.5));
                Action::Outage(stores, self.span(0.2, 1.5), hang)
            }
            18 => {
                let j = self.members(1);
                Action::Slow(j[0], self.span(0.5, 3.0))
            }
            19 => {
                let j = self.members(1);
                Action::Storm(j[0], self.span(0.5, 3.0))
            }
            20 => Action::Delete(self.members(1), Deletion::Record),
            21 => {
                let what = if self.rng.chance(0.5) {
                    Deletion::RecordAndMark
                } else {
                    Deletion::Mark
                };
                Action::Delete(self.members(1), what)
            }
            22 => Action::Delete(self.members(1), Deletion::Wipe),
            _ => {
                let k = self.rng.range_u64(majority as u64, n as u64) as usize;
                Action::Delete(self.members(k), Deletion::Record)
            }
        }
    }

    /// The leader (if any), or any running candidate.
    fn target(&mut self, leader_only: bool) -> Option<Cand> {
        let leader = self.world.leader().filter(|c| self.running.contains_key(c));
        if leader.is_some() || leader_only {
            return leader;
        }
        self.any(None)
    }

    /// A running candidate other than `not`, at random.
    fn any(&mut self, not: Option<Cand>) -> Option<Cand> {
        let keys: Vec<Cand> = self
            .running
            .keys()
            .copied()
            .filter(|c| Some(*c) != not)
            .collect();
        let i = self.rng.range_u64(0, keys.len().saturating_sub(1) as u64) as usize;
        keys.get(i).copied()
    }

    async fn play(&mut self, action: Action) {
        match action {
            Action::FreezeLeader(d) => self.freeze(true, d),
            Action::FreezeAnyone(d) => self.freeze(false, d),
            Action::CrashLeader(d) => self.crash(true, d).await,
            Action::CrashAnyone(d) => self.crash(false, d).await,
            Action::PartitionLeader(d, hang) => {
                if let Some(c) = self.target(false) {
                    self.partition(c, d, hang);
                }
            }
            Action::CutLeader(stores, d, hang) => {
                if let Some(c) = self.target(false) {
                    self.cut(c, &stores, d, hang);
                }
            }
            Action::CutFollower(stores, d, hang) => {
                let leader = self.world.leader();
                if let Some(c) = self.any(leader) {
                    self.cut(c, &stores, d, hang);
                }
            }
            Action::PauseLeaderInFlight(_)
            | Action::PauseFollowerInFlight(_)
            | Action::PauseLeaderThenCut(..) => self.pause(action),
            Action::ResignLeader => {
                if let Some(r) = self.target(true).and_then(|c| self.running.get(&c)) {
                    let _ = r.resign.try_send(());
                }
            }
            Action::Outage(stores, d, hang) => {
                for j in stores {
                    self.disturb(
                        j,
                        d,
                        QuorumEvent::Outage {
                            store: j,
                            at: self.world.now(),
                            until: self.world.now() + d,
                        },
                        move |f| {
                            f.down = !hang;
                            f.hang = hang;
                        },
                    );
                }
            }
            Action::Slow(j, d) => {
                let e = QuorumEvent::Slow {
                    store: j,
                    at: self.world.now(),
                    until: self.world.now() + d,
                };
                self.disturb(j, d, e, |f| f.latency = Duration::from_millis(120));
            }
            Action::Storm(j, d) => {
                let e = QuorumEvent::Storm {
                    store: j,
                    at: self.world.now(),
                    until: self.world.now() + d,
                };
                let late = self.world.config.late_writes * 2.0;
                self.disturb(j, d, e, move |f| {
                    f.latency = Duration::from_millis(150);
                    f.fail_before = 0.15;
                    f.lose_response = 0.1;
                    f.late = late;
                });
            }
            Action::Delete(stores, what) => {
                for j in stores {
                    self.delete(j, what).await;
                }
            }
        }
    }

    fn freeze(&mut self, leader: bool, d: Duration) {
        let Some(c) = self.target(leader) else {
            return;
        };
        if let Some(r) = self.running.get(&c)
            && !d.is_zero()
        {
            freeze(&self.world, c, &r.gate, d, false);
        }
    }

    /// A crash; a new candidate (a new id) starts `d` later.
    async fn crash(&mut self, leader: bool, d: Duration) {
        let Some(c) = self.target(leader) else {
            return;
        };
        let Some(r) = self.running.remove(&c) else {
            return;
        };
        kill(r).await;
        self.world.log(QuorumEvent::Crashed {
            cand: c,
            at: self.world.now(),
        });
        self.restarts.push(Instant::now() + d);
    }

    fn partition(&mut self, c: Cand, d: Duration, hang: bool) {
        let Some(r) = self.running.get(&c) else {
            return;
        };
        if d.is_zero() {
            return;
        }
        r.control.cut(d, hang);
        let now = self.world.now();
        self.world.log(QuorumEvent::Partitioned {
            cand: c,
            at: now,
            until: now + d,
        });
    }

    /// Cuts candidate `c` from the members `stores` only.
    fn cut(&mut self, c: Cand, stores: &[usize], d: Duration, hang: bool) {
        let Some(r) = self.running.get(&c) else {
            return;
        };
        if d.is_zero() {
            return;
        }
        let now = self.world.now();
        for &j in stores {
            r.links[j].cut(d, hang);
            self.world.log(QuorumEvent::Cut {
                cand: c,
                store: j,
                at: now,
                until: now + d,
            });
        }
    }

    fn pause(&mut self, action: Action) {
        let leader = self.world.leader();
        let (c, pause) = match action {
            Action::PauseLeaderInFlight(d) => (self.target(false), (d, None)),
            Action::PauseLeaderThenCut(d, cut) => (leader, (d, Some(cut))),
            Action::PauseFollowerInFlight(d) => (self.any(leader), (d, None)),
            _ => return,
        };
        if let Some(r) = c.and_then(|c| self.running.get(&c))
            && !r.gate.is_frozen()
        {
            r.process.arm(Pause {
                frozen: pause.0,
                then_cut: pause.1,
            });
        }
    }

    /// A fault of member `j` for `d`, logged as `event`; the member is restored after.
    fn disturb(
        &mut self,
        j: usize,
        d: Duration,
        event: QuorumEvent,
        fault: impl FnOnce(&mut Faults),
    ) {
        if d.is_zero() {
            return;
        }
        let world = self.world.clone();
        self.world.faults[j].apply(d, fault, move |_| world.restore(j));
        self.world.log(event);
    }

    /// The operator removes objects of the key from member `j`, unless that would leave a
    /// majority of the members empty (neither a record nor a mark): the design survives the
    /// loss of a minority's memory of the key; a majority's leaves no lower bound for tokens.
    async fn delete(&mut self, j: usize, what: Deletion) {
        let world = self.world.clone();
        let n = world.config.members;
        let store = &world.stores[j];
        // What is left of the key on the member after the deletion.
        let record = what == Deletion::Mark
            && matches!(store.get_fenced(&world.names.record).await, Ok(Some(_)));
        let mark = what == Deletion::Record
            && matches!(store.get_fenced(&world.names.mark).await, Ok(Some(_)));
        let mut empty = usize::from(!record && !mark);
        for other in (0..n).filter(|o| *o != j) {
            empty += usize::from(world.empty(other).await);
        }
        if empty > n - (n / 2 + 1) {
            return;
        }
        if what != Deletion::Mark {
            store.delete_object(&world.names.record);
        }
        if what != Deletion::Record {
            store.delete_object(&world.names.mark);
        }
        if what == Deletion::Wipe {
            store.delete_object(&world.names.id);
        }
        world.log(QuorumEvent::Deleted {
            store: j,
            what,
            at: world.now(),
        });
    }
}
