//! The campaign of one candidate over a quorum: reading rounds, the verdict on each member,
//! acquiring a majority with one token, renewing, adopting members back, releasing. The
//! rules are in `docs/quorum.md`; each step names the rule it keeps.

use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::member::{Answer, Found, Io, MarkSeen, Member, Wrote};
use super::record::{Names, Record, State, members_hash, term_id};
use super::{Quorum, QuorumFlaw, join_all};
use crate::backend::{Changes, Expected};
use crate::campaign::{Campaign, SeenTerm};
use crate::config::{ClockRate, Timing};
use crate::error::{ConfigError, Error};
use crate::lease::{Acquisition, Grant, ObservedLeader, Renewal};
use crate::metrics::{Op, StoreContact, StoreMetrics};
use crate::model::{HolderId, LeaseKey, Metadata, validate_metadata};
use crate::rand::Rng;
use crate::token::FencingToken;

/// The term this candidate holds.
#[derive(Clone, Debug)]
struct Held {
    term: String,
    token: u64,
}

/// What one read of every member showed (`None`: no answer).
#[derive(Debug)]
struct Round {
    answers: Vec<Option<Answer>>,
    /// Whether the marks were read (a round that may lead to a write).
    full: bool,
}

impl Round {
    fn answered(&self) -> usize {
        self.answers.iter().flatten().count()
    }

    /// Every member answered, none with a record or a mark, not even of another identity:
    /// a new key, or one emptied on every member.
    fn all_empty(&self) -> bool {
        self.full
            && self
                .answers
                .iter()
                .all(|a| a.as_ref().is_some_and(|a| a.is_empty() && !a.has_foreign()))
    }

    /// The members that answered with nothing.
    fn empty(&self) -> usize {
        self.answers
            .iter()
            .flatten()
            .filter(|a| a.is_empty())
            .count()
    }

    /// The highest token any answer shows.
    fn top(&self) -> u64 {
        self.answers
            .iter()
            .flatten()
            .map(Answer::top)
            .max()
            .unwrap_or(0)
    }

    /// How many members show term `term` released with `token`, and whether any shows a
    /// higher token.
    fn released(&self, term: &str, token: u64) -> (usize, bool) {
        let mut same = 0;
        let mut higher = false;
        for a in self.answers.iter().flatten() {
            if let Found::Record {
                record, token: t, ..
            } = &a.found
            {
                if record.term == term && !record.is_held() && *t == token {
                    same += 1;
                }
                higher |= *t > token;
            }
            higher |= a.mark().is_some_and(|(t, _)| t > token);
        }
        (same, higher)
    }

    /// The term held on a majority of the members, as records show it (a follower's view of
    /// the leader).
    fn leader(&self, majority: usize) -> Option<(Record, u64)> {
        let held: Vec<(&Record, u64)> = self
            .answers
            .iter()
            .flatten()
            .filter_map(|a| match &a.found {
                Found::Record { record, token, .. } if record.is_held() => Some((record, *token)),
                _ => None,
            })
            .collect();
        held.iter()
            .find(|(r, _)| held.iter().filter(|(o, _)| o.term == r.term).count() >= majority)
            .map(|(r, t)| ((*r).clone(), *t))
    }
}

/// The verdict on one member for an acquisition.
#[derive(Clone, Debug)]
enum Verdict {
    /// May be taken, on this condition; `token`: the record's.
    Free { expected: Expected, token: u64 },
    /// Held (or released) by another term, not free before `until`.
    Busy { until: Instant },
    /// Absent on a key with a history: a tombstone first.
    Repair,
    /// No answer, or a record that cannot be read.
    Unknown,
}

/// The campaign of one candidate for one key over a [`Quorum`].
#[derive(Debug)]
pub(crate) struct QuorumClient {
    key: LeaseKey,
    holder: HolderId,
    metadata: Metadata,
    timing: Timing,
    clock: ClockRate,
    rng: Rng,
    names: Names,
    members: Vec<Member>,
    majority: usize,
    fingerprint: String,
    contact: StoreContact,
    held: Option<Held>,
    highest: u64,
    /// No acquisition before this, after a round that took only a minority.
    not_before: Option<Instant>,
    seen: Option<SeenTerm>,
    replaced: Option<SeenTerm>,
    flaw: QuorumFlaw,
    /// A record of another member set in the way was said (once until it is gone).
    foreign_warned: bool,
}

impl QuorumClient {
    pub(crate) fn new(
        quorum: &Quorum,
        key: LeaseKey,
        holder: HolderId,
        timing: Timing,
    ) -> Result<Self, ConfigError> {
        timing.validate()?;
        let names = Names::new(&key)?;
        let members = quorum
            .members()
            .iter()
            .map(|m| {
                Ok(Member {
                    name: m.name.clone(),
                    cas: m.objects(),
                    metrics: StoreMetrics::new(&key, &holder, m.store.name()),
                    seen: None,
                    own: None,
                    id: None,
                    foreign: None,
                })
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        let member_names: Vec<String> = quorum.members().iter().map(|m| m.name.clone()).collect();
        let fingerprint = members_hash(&member_names, timing.ttl);
        Ok(Self {
            key,
            holder,
            metadata: Metadata::new(),
            timing,
            clock: ClockRate(1.0),
            rng: Rng::from_entropy(),
            names,
            majority: quorum.majority(),
            fingerprint,
            members,
            contact: StoreContact::default(),
            held: None,
            highest: 0,
            not_before: None,
            seen: None,
            replaced: None,
            flaw: quorum.flaw(),
            foreign_warned: false,
        })
    }

    /// Whether the simulation planted `flaw`. A constant false without the `simulation`
    /// feature, so the optimiser drops the flawed branches.
    fn planted(&self, flaw: QuorumFlaw) -> bool {
        cfg!(feature = "simulation") && self.flaw == flaw
    }

    pub(crate) fn set_metadata(&mut self, metadata: Metadata) -> Result<(), ConfigError> {
        validate_metadata(&metadata)?;
        self.metadata = metadata;
        Ok(())
    }

    pub(crate) fn with_clock(mut self, clock: ClockRate, seed: Option<u64>) -> Self {
        self.clock = clock;
        if let Some(seed) = seed {
            self.rng = Rng::seeded(seed);
        }
        self
    }

    fn real(&self, d: Duration) -> Duration {
        self.clock.real(d)
    }

    fn io(&self, j: usize) -> Io {
        Io::for_member(
            &self.members[j],
            &self.names,
            &self.key,
            &self.holder,
            self.real(self.timing.request_timeout),
            self.timing.request_timeout,
        )
    }

    /// How long a record must be seen unchanged before it is free: the longer of our ttl and
    /// its writer's.
    fn wait(&self, record: &Record) -> Duration {
        self.real(self.timing.ttl.max(Duration::from_millis(record.ttl_ms)))
    }

    fn record(&mut self, term: &str, state: State) -> Record {
        Record {
            v: 1,
            holder: self.holder.clone(),
            term: term.to_owned(),
            state,
            nonce: self.rng.next_u64(),
            ttl_ms: u64::try_from(self.timing.ttl.as_millis()).unwrap_or(u64::MAX),
            members: self.fingerprint.clone(),
            // Set per member by the write.
            stamp: String::new(),
            metadata: self.metadata.clone(),
        }
    }

    /// The deadline of the held term: the majority-th largest of the members' deadlines,
    /// each the send time of our last acknowledged write there plus `ttl - margin`.
    fn deadline(&self) -> Option<Instant> {
        let held = self.held.as_ref()?;
        let validity = self.real(self.timing.term_validity());
        let mut ends: Vec<Instant> = self
            .members
            .iter()
            .filter_map(|m| m.own.as_ref())
            .filter(|o| o.held && o.term == held.term)
            .map(|o| o.sent + validity)
            .collect();
        ends.sort_unstable_by(|a, b| b.cmp(a));
        if self.planted(QuorumFlaw::DeadlineFromLargest) {
            return ends.first().copied();
        }
        ends.get(self.majority - 1).copied()
    }

    fn grant(&self) -> Option<Grant> {
        let held = self.held.as_ref()?;
        let deadline = self.deadline()?;
        (Instant::now() < deadline).then_some(Grant {
            token: FencingToken(held.token),
            deadline,
        })
    }

    /// One read of every member at once: the records, and the marks and identities in a
    /// full round. Notes what each showed.
    async fn round(&mut self, full: bool) -> Result<Round, Error> {
        let reads = (0..self.members.len())
            .map(|j| self.io(j).read(full))
            .collect();
        let results = join_all(reads).await;
        let mut answers = Vec::with_capacity(results.len());
        for (member, result) in self.members.iter_mut().zip(results) {
            match result {
                Ok(answer) => {
                    member.note(&answer);
                    answers.push(Some(answer));
                }
                Err(e) => {
                    debug!(member = %member.name, error = %e, "a quorum member did not answer");
                    answers.push(None);
                }
            }
        }
        let round = Round { answers, full };
        self.highest = self.highest.max(round.top());
        if round.answered() >= self.majority {
            self.contact.note();
        }
        self.check_identities()?;
        self.refuse_foreign(&round)?;
        Ok(round)
    }

    /// Members that show nothing: they lost everything, or never took part, and give no
    /// lower bound for tokens. When every member answered with nothing, the key is new, or
    /// emptied everywhere: nothing is suspect, and the tokens go on from what this candidate
    /// has seen. Only then: a key whose members did not all answer is never taken for new,
    /// even by a candidate that has seen nothing of it (the history may sit on the members
    /// that did not answer).
    ///
    /// At most a minority of the members may have lost their history (the quorum's
    /// assumption), so no more than a minority of the empty answers count as suspect: the
    /// others never took part (a first acquisition that reached only some members, say).
    /// Counting every empty answer would wedge such a key for good, since nothing ever
    /// writes those members again.
    fn suspects(&self, round: &Round) -> usize {
        if !round.full || round.all_empty() {
            return 0;
        }
        round.empty().min(self.members.len() - self.majority)
    }

    /// Two members with one identity are one store under two names: it would count twice.
    fn check_identities(&self) -> Result<(), Error> {
        for (i, a) in self.members.iter().enumerate() {
            for b in &self.members[..i] {
                if a.id.is_some() && a.id == b.id {
                    return Err(Error::InvalidConfig {
                        message: format!(
                            "the quorum members {} and {} are the same store under two names \
                             (both hold the identity {:?} of {}); a store may count once: \
                             give each member its own store",
                            b.name,
                            a.name,
                            a.id.as_deref().unwrap_or_default(),
                            self.names.id
                        ),
                        source: None,
                    });
                }
            }
        }
        Ok(())
    }

    /// Records of another member set (or ttl: the fingerprint has both): two candidates that
    /// count different sets could each hold a majority of their own. One seen *changing*
    /// (renewed, or taken over) proves a live candidate of the other set: this one refuses to
    /// go on (an error that needs a person). One that is only seen is waited out (see
    /// [`foreign_in_the_way`](Self::foreign_in_the_way)): a dead candidate's record goes
    /// stale and is then taken over as any record, so setting the configuration right is
    /// enough.
    fn refuse_foreign(&mut self, round: &Round) -> Result<(), Error> {
        let mut changed = None;
        for (m, a) in self.members.iter_mut().zip(&round.answers) {
            let Some(a) = a else {
                continue;
            };
            match &a.found {
                Found::Record {
                    record, revision, ..
                } if record.members != self.fingerprint => {
                    if m.foreign.as_ref().is_some_and(|r| r != revision) {
                        changed = Some((m.name.clone(), record.holder.clone()));
                    }
                    m.foreign = Some(revision.clone());
                }
                _ => m.foreign = None,
            }
        }
        match changed {
            None => Ok(()),
            Some((member, holder)) => Err(Error::InvalidConfig {
                message: format!(
                    "{holder} renews a term on quorum member {member} with another set of \
                     members or another ttl: every candidate of key {} must name the same \
                     stores the same way (their URLs) and use the same ttl; refusing to campaign \
                     until it does",
                    self.key
                ),
                source: None,
            }),
        }
    }

    /// Whether a record of another member set is held and not yet stale on some member:
    /// this candidate writes nothing until it is (stale: taken over as any record; changing:
    /// refused).
    fn foreign_in_the_way(&self, round: &Round) -> bool {
        round.answers.iter().enumerate().any(|(j, a)| {
            matches!(a, Some(Answer { found: Found::Record { record, .. }, .. })
                if record.members != self.fingerprint && record.is_held())
                && matches!(self.verdict(j, round), Verdict::Busy { .. })
        })
    }

    /// The verdict on member `j` from `round` (rule 2 of `docs/quorum.md`).
    fn verdict(&self, j: usize, round: &Round) -> Verdict {
        let Some(answer) = &round.answers[j] else {
            return Verdict::Unknown;
        };
        let member = &self.members[j];
        match &answer.found {
            Found::Damaged { .. } => Verdict::Unknown,
            // A brand-new key: empty everywhere, and this candidate has seen no history (one
            // that has may be looking at a key an operator emptied under a live leader).
            Found::Absent
                if (round.all_empty() && self.highest == 0)
                    || self.planted(QuorumFlaw::AbsentTakenAtOnce) =>
            {
                Verdict::Free {
                    expected: answer.absent(),
                    token: 0,
                }
            }
            Found::Absent => Verdict::Repair,
            Found::Record {
                record,
                token,
                revision,
            } => {
                let ours = record.members == self.fingerprint;
                let free = Verdict::Free {
                    expected: Expected::Revision(revision.clone()),
                    token: *token,
                };
                // Our own last write here, of a term that is over: nobody else may act on
                // it, nothing else was seen here since.
                if ours
                    && record.holder == self.holder
                    && member.own.as_ref().is_some_and(|o| o.revision == *revision)
                {
                    return free;
                }
                // Released by its term on a majority, and nothing newer anywhere: the term's
                // work has stopped.
                if ours && !record.is_held() {
                    let (same, higher) = round.released(&record.term, *token);
                    let needed = if self.planted(QuorumFlaw::ReleasedByMinority) {
                        1
                    } else {
                        self.majority
                    };
                    if same >= needed && !higher {
                        return free;
                    }
                }
                let since = member
                    .seen
                    .as_ref()
                    .filter(|s| s.revision == *revision)
                    .map_or(answer.at, |s| s.since);
                let until = since + self.wait(record);
                if answer.at >= until {
                    free
                } else {
                    Verdict::Busy { until }
                }
            }
        }
    }

    /// What a follower reports: the term a majority shows held, and when a majority of the
    /// members could be free (the majority-th earliest).
    fn following(&mut self, round: &Round) -> Acquisition {
        let leader = round.leader(self.majority);
        self.note_seen(round);
        let now = Instant::now();
        let mut times: Vec<Instant> = (0..self.members.len())
            .filter_map(|j| match self.verdict(j, round) {
                Verdict::Free { .. } | Verdict::Repair => Some(now),
                Verdict::Busy { until } => Some(until),
                Verdict::Unknown => None,
            })
            .collect();
        times.sort_unstable();
        // Not before a later instant: a majority free now that was not taken is blocked by
        // something else (suspects, a record of another set, a back-off), which the next poll
        // looks at again.
        let takeover_at = times.get(self.majority - 1).copied().filter(|t| *t > now);
        Acquisition::Following {
            leader: leader.map(|(r, token)| ObservedLeader {
                holder: r.holder,
                token: FencingToken(token),
                metadata: r.metadata,
            }),
            takeover_at,
        }
    }

    /// Notes the term a majority shows (held, or released on a majority), for the time
    /// without a leader.
    fn note_seen(&mut self, round: &Round) {
        let mut best: Option<SeenTerm> = None;
        for (j, a) in round.answers.iter().enumerate() {
            let Some(Answer {
                found: Found::Record { record, token, .. },
                ..
            }) = a
            else {
                continue;
            };
            let count = round
                .answers
                .iter()
                .flatten()
                .filter(|o| matches!(&o.found, Found::Record { record: r, .. } if r.term == record.term))
                .count();
            if count < self.majority {
                continue;
            }
            let since = self.members[j]
                .seen
                .as_ref()
                .map_or(Instant::now(), |s| s.since);
            let seen = SeenTerm {
                token: FencingToken(*token),
                held: record.is_held(),
                since,
            };
            best = Some(match best {
                Some(b) if b.token > seen.token => b,
                Some(b) if b.token == seen.token && b.since >= seen.since => b,
                _ => seen,
            });
        }
        if best.is_some() {
            self.seen = best;
        }
    }

    /// Writes tombstones on the members found absent on a key with a history, so that they
    /// are timed as any record (a follower cannot time an absence: it may have missed a
    /// write and the delete after it).
    async fn repair(&mut self, round: &Round, floor: u64) {
        let absent: Vec<usize> = (0..self.members.len())
            .filter(|j| matches!(self.verdict(*j, round), Verdict::Repair))
            .collect();
        if absent.is_empty() {
            return;
        }
        // Each stone names a term of its own that never was: stones written together must
        // not pass for a release of one term by a majority.
        let stones: Vec<Record> = absent
            .iter()
            .map(|_| {
                let term = term_id(self.rng.next_u64(), self.rng.next_u64());
                self.record(&term, State::Released)
            })
            .collect();
        let writes = absent
            .iter()
            .zip(&stones)
            .map(|(j, stone)| {
                let io = self.io(*j);
                let answer = round.answers[*j].as_ref();
                let known = answer.map(Answer::mark_seen).unwrap_or_default();
                let expected = answer.map_or(Expected::Absent, Answer::absent);
                let stone = stone.clone();
                async move {
                    // The mark first (it keeps the floor if the stone is deleted too): no
                    // stone without it.
                    let sent = Instant::now();
                    let wrote = match io.raise(floor, known, 3, true).await {
                        Ok(true) => io.write(Op::Acquire, &stone, floor, &expected).await,
                        _ => Wrote::Failed,
                    };
                    (wrote, sent)
                }
            })
            .collect();
        for ((j, stone), (wrote, at)) in absent.into_iter().zip(stones).zip(join_all(writes).await)
        {
            if let Wrote::Written(revision) = wrote {
                info!(member = %self.members[j].name, "a quorum member had no record of a key with a history: wrote a tombstone, timed as any record");
                let member = &mut self.members[j];
                member.wrote(&stone, floor, revision, at);
                // Not ours to retake at once: it names no term of ours.
                member.own = None;
            }
        }
    }

    /// Rule 3: takes the free members with one new token, the first of them alone first (so
    /// that candidates racing for the key meet there), the rest side by side; the term begins
    /// if a majority was taken before its deadline, else what was taken is given back.
    async fn acquire(
        &mut self,
        round: &Round,
        free: Vec<(usize, Expected)>,
    ) -> Result<Acquisition, Error> {
        let floor = if self.planted(QuorumFlaw::TokenFromOne) {
            round.answers.iter().flatten().next().map_or(0, Answer::top)
        } else {
            self.highest.max(round.top())
        };
        let token = floor.checked_add(1).ok_or_else(|| Error::InvalidConfig {
            message: format!(
                "the quorum token of {} reached u64::MAX; delete the key's records and \
                     marks on every member",
                self.key
            ),
            source: None,
        })?;
        self.highest = self.highest.max(token);
        let term = term_id(self.rng.next_u64(), self.rng.next_u64());
        let record = self.record(&term, State::Held);
        let mut won = Vec::new();
        let (first, rest) = free
            .split_first()
            .map_or((None, &free[..0]), |(f, r)| (Some(f), r));
        if let Some((j, expected)) = first {
            if let Some(taken) = self.claim(round, *j, expected, &record, token).await {
                won.push(taken);
            } else {
                return Ok(self.back_off(round, &[]).await);
            }
        }
        let claims = rest
            .iter()
            .map(|(j, expected)| {
                let io = self.io(*j);
                let known = round.answers[*j]
                    .as_ref()
                    .map(Answer::mark_seen)
                    .unwrap_or_default();
                let (record, expected) = (record.clone(), expected.clone());
                let j = *j;
                async move { (j, claim_io(io, known, &record, token, &expected, 3).await) }
            })
            .collect();
        for (j, taken) in join_all(claims).await {
            if let Some((revision, sent)) = taken {
                won.push((j, revision, sent));
            }
        }
        for (j, revision, sent) in &won {
            self.members[*j].wrote(&record, token, revision.clone(), *sent);
        }
        self.held = Some(Held {
            term: term.clone(),
            token,
        });
        match self.grant() {
            Some(grant) if won.len() >= self.majority => {
                info!(key = %self.key, holder = %self.holder, token, members = won.len(), "acquired the lease on a majority of the quorum");
                self.replaced = self.seen.take();
                Ok(Acquisition::Acquired(grant))
            }
            _ => {
                self.held = None;
                let taken: Vec<usize> = won.iter().map(|(j, _, _)| *j).collect();
                Ok(self.back_off(round, &taken).await)
            }
        }
    }

    /// Takes member `j` for the term of `record` with `token`: raises its mark, then writes
    /// the record on `expected`. The revision and the send time if taken.
    async fn claim(
        &mut self,
        round: &Round,
        j: usize,
        expected: &Expected,
        record: &Record,
        token: u64,
    ) -> Option<(usize, crate::backend::Revision, Instant)> {
        let known = round.answers[j]
            .as_ref()
            .map(Answer::mark_seen)
            .unwrap_or_default();
        let taken = claim_io(self.io(j), known, record, token, expected, 3).await;
        taken.map(|(revision, sent)| (j, revision, sent))
    }

    /// Gives back the members `taken` in a round that did not make a majority (their
    /// records are released by the term that never began), and waits a little before the
    /// next attempt, so that candidates that split the members do not meet again at once.
    async fn back_off(&mut self, round: &Round, taken: &[usize]) -> Acquisition {
        if !taken.is_empty() {
            debug!(
                taken = taken.len(),
                "took only a minority of the quorum; giving it back"
            );
            self.release_members(taken, None).await;
        }
        let poll = self.real(self.timing.poll_every);
        self.not_before = Some(Instant::now() + self.rng.duration(Duration::ZERO, poll * 2));
        self.following(round)
    }

    /// Writes `released` for the term held on `members` (the current term, or the one being
    /// given back), conditional on our last write there. How many were released.
    async fn release_members(&mut self, members: &[usize], held: Option<&Held>) -> usize {
        let Some((term, token)) = held.map(|h| (h.term.clone(), h.token)).or_else(|| {
            let own = members
                .first()
                .and_then(|j| self.members[*j].own.as_ref())?;
            let token = self.members[*members.first()?].seen.as_ref()?.token;
            Some((own.term.clone(), token))
        }) else {
            return 0;
        };
        let record = self.record(&term, State::Released);
        let writes = members
            .iter()
            .filter_map(|j| {
                let own = self.members[*j].own.as_ref()?;
                let expected = Expected::Revision(own.revision.clone());
                let io = self.io(*j);
                let record = record.clone();
                let j = *j;
                Some(async move {
                    let sent = Instant::now();
                    (
                        j,
                        io.write(Op::Release, &record, token, &expected).await,
                        sent,
                    )
                })
            })
            .collect();
        let mut released = 0;
        for (j, wrote, sent) in join_all(writes).await {
            if let Wrote::Written(revision) = wrote {
                self.members[j].wrote(&record, token, revision, sent);
                released += 1;
            }
        }
        released
    }
}

/// Takes one member: raises its mark to `token` (from `known`), then writes `record` on
/// `expected`; a mark already at or above `token` means another candidate is ahead there.
async fn claim_io(
    io: Io,
    known: MarkSeen,
    record: &Record,
    token: u64,
    expected: &Expected,
    attempts: usize,
) -> Option<(crate::backend::Revision, Instant)> {
    match io.raise(token, known, attempts, false).await {
        Ok(true) => {}
        Ok(false) => return None,
        Err(e) => {
            debug!(member = %io.name, error = %e, "could not raise a quorum member's token mark");
            return None;
        }
    }
    let sent = Instant::now();
    match io.write(Op::Acquire, record, token, expected).await {
        Wrote::Written(revision) => Some((revision, sent)),
        _ => None,
    }
}

#[async_trait]
impl Campaign for QuorumClient {
    fn key(&self) -> &LeaseKey {
        &self.key
    }

    fn holder(&self) -> &HolderId {
        &self.holder
    }

    fn store_contact(&self) -> StoreContact {
        self.contact.clone()
    }

    fn changes(&self) -> Option<Changes> {
        None
    }

    async fn try_acquire(&mut self) -> Result<Acquisition, Error> {
        if let Some(grant) = self.grant() {
            return Ok(Acquisition::Acquired(grant));
        }
        self.held = None;
        let round = self.round(false).await?;
        if self.not_before.is_some_and(|t| Instant::now() < t) {
            return Ok(self.following(&round));
        }
        let possible = (0..self.members.len())
            .filter(|j| {
                matches!(
                    self.verdict(*j, &round),
                    Verdict::Free { .. } | Verdict::Repair
                )
            })
            .count();
        if possible < self.majority {
            // A damaged record that stands in the way: say so (it is never written over).
            if let Some(Found::Damaged { key, detail }) = round
                .answers
                .iter()
                .flatten()
                .map(|a| &a.found)
                .find(|f| matches!(f, Found::Damaged { .. }))
            {
                return Err(Error::MalformedRecord {
                    key: key.clone(),
                    detail: detail.clone(),
                });
            }
            return Ok(self.following(&round));
        }
        // A round that may lead to writes: every member again, with its mark.
        let round = self.round(true).await?;
        if self.foreign_in_the_way(&round) {
            if !self.foreign_warned {
                warn!(key = %self.key, "a quorum member carries a term of another set of members (or ttl); waiting until it is stale, or refusing if it is renewed");
                self.foreign_warned = true;
            }
            return Ok(self.following(&round));
        }
        self.foreign_warned = false;
        let floor = self.highest.max(round.top());
        let sound = round.answered() - self.suspects(&round);
        if sound < self.majority {
            debug!(
                sound,
                "fewer than a majority of the quorum's members answered with their history; not writing"
            );
            return Ok(self.following(&round));
        }
        self.repair(&round, floor).await;
        let free: Vec<(usize, Expected)> = (0..self.members.len())
            .filter_map(|j| match self.verdict(j, &round) {
                Verdict::Free { expected, .. } => Some((j, expected)),
                _ => None,
            })
            .collect();
        if free.len() < self.majority {
            return Ok(self.following(&round));
        }
        self.acquire(&round, free).await
    }

    async fn observe(&mut self) -> Result<Option<ObservedLeader>, Error> {
        let round = self.round(false).await?;
        self.note_seen(&round);
        Ok(round
            .leader(self.majority)
            .map(|(r, token)| ObservedLeader {
                holder: r.holder,
                token: FencingToken(token),
                metadata: r.metadata,
            }))
    }

    async fn renew(&mut self) -> Result<Renewal, Error> {
        renew::renew(self).await
    }

    async fn release(&mut self) -> Result<bool, Error> {
        let Some(held) = self.held.take() else {
            return Ok(false);
        };
        let live: Vec<usize> = (0..self.members.len())
            .filter(|j| {
                self.members[*j]
                    .own
                    .as_ref()
                    .is_some_and(|o| o.held && o.term == held.term)
            })
            .collect();
        let released = self.release_members(&live, Some(&held)).await;
        info!(key = %self.key, released, of = live.len(), "released the lease on the quorum");
        Ok(released >= self.majority)
    }

    fn end_term(&mut self, why: &str) {
        if let Some(held) = self.held.take() {
            info!(key = %self.key, token = held.token, why, "term ended");
        }
    }

    fn seen(&self) -> Option<SeenTerm> {
        self.seen
    }

    fn replaced(&self) -> Option<SeenTerm> {
        self.replaced
    }
}

mod renew {
    //! Renewing a term over a quorum, and taking members back into it.

    use super::*;

    /// Rule 4: writes the term again on every member that carries it, side by side, and
    /// reads the others (to take back a member the term lost, once free). The term is lost
    /// when fewer than a majority still carry it; renewed when its deadline moved on.
    pub(super) async fn renew(c: &mut QuorumClient) -> Result<Renewal, Error> {
        let Some(held) = c.held.clone() else {
            return Ok(Renewal::Lost { leader: None });
        };
        let Some(before) = c.deadline().filter(|d| Instant::now() < *d) else {
            c.held = None;
            return Ok(Renewal::Expired);
        };
        write_round(c, &held).await;
        let carrying = c
            .members
            .iter()
            .filter(|m| {
                m.own
                    .as_ref()
                    .is_some_and(|o| o.held && o.term == held.term)
            })
            .count();
        if carrying < c.majority {
            c.held = None;
            return Ok(Renewal::Lost { leader: None });
        }
        // The members the term lost, looked at and taken back within what the renew period
        // leaves (a member whose calls hang must not cost the term).
        if let Some(d) = c.deadline() {
            let rt = c.real(c.timing.request_timeout);
            let budget = d
                .saturating_duration_since(Instant::now())
                .saturating_sub(2 * rt)
                .min(c.real(c.timing.renew_every) / 2);
            if let Ok(Err(e)) = tokio::time::timeout(budget, look_and_adopt(c, &held)).await {
                // Another member set may count a majority of its own: stop acting now.
                warn!(error = %e, "stepping down");
                c.held = None;
                return Ok(Renewal::Lost { leader: None });
            }
        }
        match c.deadline() {
            Some(d) if Instant::now() >= d => {
                c.held = None;
                Ok(Renewal::Expired)
            }
            Some(d) if d > before => Ok(Renewal::Renewed(Grant {
                token: FencingToken(held.token),
                deadline: d,
            })),
            _ => Err(Error::unavailable(format!(
                "the renew of {} reached fewer than a majority of the quorum",
                c.key
            ))),
        }
    }

    /// The renew's writes: the term's record written again on every member that carries it,
    /// side by side, each conditional on its own last write there. Notes what each did.
    async fn write_round(c: &mut QuorumClient, held: &Held) {
        let record = c.record(&held.term, State::Held);
        let calls = (0..c.members.len())
            .filter_map(|j| {
                let own = c.members[j].own.as_ref();
                let carries = own.is_some_and(|o| o.held && o.term == held.term);
                let blind = j == 0 && c.planted(QuorumFlaw::BlindRenew);
                if !carries && !blind {
                    return None;
                }
                let expected = own.map(|o| Expected::Revision(o.revision.clone()));
                let (io, record) = (c.io(j), record.clone());
                Some(async move {
                    let expected = if blind {
                        // The planted flaw: on whatever revision is there now.
                        io.current().await.or(expected)
                    } else {
                        expected
                    };
                    let sent = Instant::now();
                    let wrote = match expected {
                        Some(expected) => io.write(Op::Renew, &record, held.token, &expected).await,
                        None => Wrote::Failed,
                    };
                    (j, wrote, sent)
                })
            })
            .collect();
        for (j, wrote, sent) in join_all(calls).await {
            match wrote {
                Wrote::Written(revision) => {
                    c.members[j].wrote(&record, held.token, revision, sent);
                }
                Wrote::Conflict => {
                    warn!(member = %c.members[j].name, "the term's record on a quorum member was replaced; the term goes on without it");
                    c.members[j].own = None;
                }
                Wrote::Failed | Wrote::Unknown => {}
            }
        }
    }

    /// Reads the members that do not carry the term (a record of another member set renewed
    /// there is an error: the caller steps down), and takes back those that are free.
    async fn look_and_adopt(c: &mut QuorumClient, held: &Held) -> Result<(), Error> {
        let carrying: Vec<bool> = c
            .members
            .iter()
            .map(|m| {
                m.own
                    .as_ref()
                    .is_some_and(|o| o.held && o.term == held.term)
            })
            .collect();
        let reads = (0..c.members.len())
            .map(|j| {
                let io = (!carrying[j]).then(|| c.io(j));
                async move {
                    match io {
                        Some(io) => io.read(true).await.ok(),
                        None => None,
                    }
                }
            })
            .collect();
        let answers: Vec<Option<Answer>> = join_all(reads).await;
        for (m, a) in c.members.iter_mut().zip(&answers) {
            if let Some(a) = a {
                m.note(a);
            }
        }
        let round = Round {
            answers,
            full: true,
        };
        c.refuse_foreign(&round)?;
        adopt(c, held, round).await;
        Ok(())
    }

    /// Takes back into the held term the members that no longer carry it, once they are free
    /// by the rules (stale for a ttl; a tombstone written on an empty one first), and only
    /// over a record whose token is below the term's: a member where a rival left a higher
    /// token waits for the next term.
    async fn adopt(c: &mut QuorumClient, held: &Held, round: Round) {
        let mut stones = Vec::new();
        let mut takes = Vec::new();
        for j in 0..c.members.len() {
            let Some(answer) = &round.answers[j] else {
                continue;
            };
            if answer.mark().is_some_and(|(t, _)| t > held.token) {
                continue;
            }
            // A record of this very term (a write of ours that landed after its answer was
            // lost): ours to go on writing, on its revision.
            if let Found::Record {
                record, revision, ..
            } = &answer.found
                && record.holder == c.holder
                && record.term == held.term
                && record.is_held()
            {
                takes.push((j, Expected::Revision(revision.clone())));
                continue;
            }
            match c.verdict(j, &round) {
                Verdict::Free { expected, token } if token < held.token => {
                    takes.push((j, expected));
                }
                Verdict::Repair => stones.push(j),
                _ => {}
            }
        }
        if !stones.is_empty() {
            let floor = held.token.saturating_sub(1);
            let partial = Round {
                answers: round
                    .answers
                    .iter()
                    .enumerate()
                    .map(|(j, a)| a.clone().filter(|_| stones.contains(&j)))
                    .collect(),
                full: true,
            };
            c.repair(&partial, floor).await;
        }
        if takes.is_empty() {
            return;
        }
        let record = c.record(&held.term, State::Held);
        let claims = takes
            .into_iter()
            .map(|(j, expected)| {
                let io = c.io(j);
                let known = round.answers[j]
                    .as_ref()
                    .map(Answer::mark_seen)
                    .unwrap_or_default();
                let record = record.clone();
                let token = held.token;
                // One attempt at the mark: a renew has no time for more.
                async move { (j, claim_io(io, known, &record, token, &expected, 1).await) }
            })
            .collect();
        for (j, taken) in join_all(claims).await {
            if let Some((revision, sent)) = taken {
                info!(member = %c.members[j].name, token = held.token, "took a quorum member back into the term");
                c.members[j].wrote(&record, held.token, revision, sent);
            }
        }
    }
}
