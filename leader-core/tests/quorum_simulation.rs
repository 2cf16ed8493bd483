//! The simulation of the election over a quorum of stores: seeds without a flaw break
//! nothing, each planted flaw is caught, one seed plays one history, the checkers can fail;
//! and directed cases for the flaws and the wedge that random seeds find rarely or never
//! find on their own terms.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use leader_core::backend::FencedCas;
use leader_core::quorum::{Quorum, QuorumMember};
use leader_core::simulation::{
    FaultControl, FaultyStore, QuorumEvent, QuorumFlaw, QuorumReport, QuorumSimConfig,
    check_quorum_liveness, check_store_chains, quorum_liveness_bound, run_quorum,
};
use leader_core::{ElectorHandle, FencingToken, HolderId, LeaseKey, MemoryStore, ObjectName};
use tokio::time::{Instant, sleep};

fn run(seed: u64, members: usize, flaw: QuorumFlaw, ignore_deadline: bool) -> QuorumReport {
    let mut config = QuorumSimConfig::new(seed)
        .with_members(members)
        .with_flaw(flaw);
    config.ignore_deadline = ignore_deadline;
    run_quorum(&config)
}

/// Seeds `first..first + count` of `members` members, on two threads.
fn seeds(first: u64, count: u64, members: usize) -> Vec<QuorumReport> {
    let half = first + count / 2;
    let other = std::thread::spawn(move || {
        (half..first + count)
            .map(|s| run(s, members, QuorumFlaw::None, false))
            .collect::<Vec<_>>()
    });
    let mut reports: Vec<_> = (first..half)
        .map(|s| run(s, members, QuorumFlaw::None, false))
        .collect();
    reports.extend(other.join().unwrap());
    reports
}

fn count_from_env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[test]
fn quorum_seeds_keep_every_invariant() {
    let mut reports = seeds(0, count_from_env("QUORUM_SEEDS", 100), 3);
    reports.extend(seeds(0, count_from_env("QUORUM_SEEDS_5", 40), 5));
    let broken: Vec<_> = reports
        .iter()
        .filter(|r| !r.violations.is_empty())
        .map(|r| (r.seed, r.members, r.violations.clone()))
        .collect();
    assert!(
        broken.is_empty(),
        "replay with `cargo run -p leader-core --features simulation --example simulate_quorum \
         -- --members N --seed S --verbose`: {broken:#?}"
    );
    // Terms change hands often, and the faults that can break the rules did happen.
    let terms: usize = reports.iter().map(|r| r.terms).sum();
    assert!(terms > reports.len() * 6, "only {terms} terms");
    let sum = |f: fn(&QuorumEvent) -> bool| reports.iter().map(|r| r.count(f)).sum::<usize>();
    assert!(sum(|e| matches!(e, QuorumEvent::Held { store: Some(_), .. })) > reports.len());
    assert!(sum(|e| matches!(e, QuorumEvent::Cut { .. })) > reports.len());
    assert!(sum(|e| matches!(e, QuorumEvent::Deleted { .. })) > reports.len());
    assert!(sum(|e| matches!(e, QuorumEvent::PausedInFlight { .. })) > reports.len() / 4);
    // Tombstones and members taken back into a term: writes over a record of another term.
    let over = sum(|e| matches!(e, QuorumEvent::Landed { held: false, .. }));
    assert!(over > reports.len(), "{over} tombstones");
}

/// Each planted flaw breaks a safety invariant within a few seeds; the first catching seeds
/// are in `results/simulation-quorum.txt`.
#[test]
fn every_planted_flaw_is_caught() {
    let cases: [(&str, QuorumFlaw, bool, u64); 8] = [
        (
            "deadline from the largest",
            QuorumFlaw::DeadlineFromLargest,
            false,
            20,
        ),
        (
            "absent taken at once",
            QuorumFlaw::AbsentTakenAtOnce,
            false,
            20,
        ),
        (
            "released by a minority",
            QuorumFlaw::ReleasedByMinority,
            false,
            20,
        ),
        ("token from one answer", QuorumFlaw::TokenFromOne, false, 20),
        ("a majority of one", QuorumFlaw::MajorityOfOne, false, 5),
        ("even halves", QuorumFlaw::EvenHalves, false, 20),
        ("blind renew", QuorumFlaw::BlindRenew, false, 20),
        ("work ignores its deadline", QuorumFlaw::None, true, 5),
    ];
    let missed: Vec<_> = cases
        .into_iter()
        .filter(|(_, flaw, ignore, budget)| {
            let members = if *flaw == QuorumFlaw::EvenHalves {
                4
            } else {
                3
            };
            !(0..*budget).any(|s| run(s, members, *flaw, *ignore).unsafe_history())
        })
        .map(|(name, ..)| name)
        .collect();
    assert!(
        missed.is_empty(),
        "not caught within their budgets: {missed:?}"
    );
}

#[test]
fn one_seed_plays_the_same_history_twice() {
    let a = run(7, 3, QuorumFlaw::None, false);
    let b = std::thread::spawn(|| run(7, 3, QuorumFlaw::None, false))
        .join()
        .unwrap();
    assert!(a.events.len() > 100);
    assert_eq!(a.events, b.events);
    assert_eq!(a.history_hash(), b.history_hash());
    assert_ne!(
        a.history_hash(),
        run(8, 3, QuorumFlaw::None, false).history_hash()
    );
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn the_chain_checker_flags_a_token_not_above_the_one_it_replaced() {
    let landed = |token, replaced| QuorumEvent::Landed {
        store: 1,
        cand: Some(0),
        token,
        replaced,
        held: true,
        at: ms(10),
    };
    assert!(check_store_chains(&[landed(6, Some(5)), landed(1, None)]).is_empty());
    assert_eq!(check_store_chains(&[landed(5, Some(5))]).len(), 1);
    assert_eq!(check_store_chains(&[landed(4, Some(5))]).len(), 1);
}

#[test]
fn the_liveness_checker_judges_the_stretch_after_the_faults() {
    let config = QuorumSimConfig::new(0);
    // 2 x 2 s + 4 x 0.4 s + 8 x 0.2 s, x 1.02
    let bound = quorum_liveness_bound(&config);
    assert_eq!(bound, ms(7_344));
    let term = |cand, token, from, to| {
        [
            QuorumEvent::TermStarted {
                cand,
                token,
                at: ms(from),
            },
            QuorumEvent::TermEnded {
                cand,
                token,
                at: ms(to),
            },
        ]
    };
    let quiet = QuorumEvent::Quiet {
        at: ms(48_000),
        down: None,
    };
    let judge = |events: Vec<QuorumEvent>| check_quorum_liveness(&config, &events);
    // A leader from 2 s after the faults to the end: fine.
    let mut h = vec![quiet.clone()];
    h.extend(term(0, 1, 50_000, 60_000));
    let (recovery, v) = judge(h.clone());
    assert!(v.is_empty(), "{v:?}");
    assert_eq!(recovery.to_leader, Some(ms(2_000)));
    // Nobody for 8 s: too long.
    let mut late = vec![quiet.clone()];
    late.extend(term(0, 1, 56_000, 60_000));
    assert_eq!(judge(late.clone()).1.len(), 1);
    // ... unless a write held by a member landed at 50 s: 6 s.
    late.push(QuorumEvent::Held {
        cand: 1,
        store: Some(0),
        at: ms(47_000),
        until: ms(50_000),
    });
    assert!(judge(late).1.is_empty());
    // A gap in the middle of the stretch counts too; one before it does not.
    let mut h = vec![quiet];
    h.extend(term(0, 1, 10_000, 49_000));
    h.extend(term(1, 2, 58_000, 60_000));
    assert_eq!(judge(h).1.len(), 1);
    // A run that never reached its quiet stretch fails.
    assert_eq!(judge(term(0, 1, 0, 60_000).to_vec()).1.len(), 1);
}

// Directed cases, on memory stores under paused time, with the default ttl.

const TTL: Duration = Duration::from_secs(15);

fn key() -> LeaseKey {
    LeaseKey::new("job").unwrap()
}

fn object(name: &str) -> ObjectName {
    ObjectName::new(name).unwrap()
}

/// Member stores; each candidate reaches them through fault controls of its own.
struct Stores {
    stores: Vec<MemoryStore>,
}

/// A candidate: its handle, its fault control towards each member, and its way to each
/// member (to count its calls).
struct Candidate {
    handle: ElectorHandle,
    controls: Vec<Arc<FaultControl>>,
    links: Vec<Arc<FaultyStore<MemoryStore>>>,
}

impl Candidate {
    /// How many reads it sent to the members.
    fn reads(&self) -> u64 {
        self.links.iter().map(|l| l.counts().0).sum()
    }
}

/// A member's term record, as far as these cases read it.
#[derive(Debug, PartialEq)]
struct Rec {
    holder: String,
    held: bool,
    term: String,
    token: u64,
}

impl Stores {
    fn new(n: usize) -> Self {
        Self {
            stores: (0..n).map(|_| MemoryStore::new()).collect(),
        }
    }

    fn start(
        &self,
        id: &str,
        seed: u64,
        flaw: QuorumFlaw,
    ) -> (ElectorHandle, Vec<Arc<FaultControl>>) {
        let c = self.candidate(id, seed, flaw, Duration::ZERO);
        (c.handle, c.controls)
    }

    /// A candidate whose calls take up to `latency` each way.
    fn candidate(&self, id: &str, seed: u64, flaw: QuorumFlaw, latency: Duration) -> Candidate {
        let mut controls = Vec::new();
        let mut links = Vec::new();
        let members = self
            .stores
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let control = FaultControl::new();
                control.update(|f| f.latency = latency);
                controls.push(control.clone());
                let faulty = Arc::new(FaultyStore::new(
                    s.clone(),
                    seed * 16 + i as u64,
                    vec![control],
                ));
                links.push(faulty.clone());
                QuorumMember::new(format!("m{i}"), faulty)
            })
            .collect();
        let quorum = Quorum::new(members).unwrap().with_flaw(flaw);
        let handle = leader_core::Elector::quorum_builder(quorum, key())
            .ttl(TTL)
            .holder_id(HolderId::new(id).unwrap())
            .jitter_seed(seed)
            .build()
            .unwrap()
            .spawn();
        Candidate {
            handle,
            controls,
            links,
        }
    }

    async fn record(&self, i: usize) -> Option<Rec> {
        let found = self.stores[i].get_fenced(&object("job.q")).await.unwrap()?;
        let v: serde_json::Value = serde_json::from_slice(&found.value).unwrap();
        Some(Rec {
            holder: v["holder"].as_str().unwrap().to_owned(),
            held: v["state"] == "held",
            term: v["term"].as_str().unwrap().to_owned(),
            token: found.fence.get(),
        })
    }

    async fn revision(&self, i: usize) -> Option<String> {
        let found = self.stores[i].get_fenced(&object("job.q")).await.unwrap()?;
        Some(format!("{:?}", found.revision))
    }
}

fn leading(h: &ElectorHandle) -> Option<FencingToken> {
    h.leadership().borrow().token()
}

async fn until(what: &str, within: Duration, mut f: impl AsyncFnMut() -> bool) {
    let end = Instant::now() + within;
    while !f().await {
        assert!(Instant::now() < end, "{what}: not within {within:?}");
        sleep(ms(10)).await;
    }
}

/// Blind renew, n = 5: x leads on all five members; right after its renew an operator
/// deletes its records on members 0, 1 and 2; y, following, sees three members free to
/// repair and writes a tombstone on each (at x's token, the highest it saw). At x's next
/// renew, the correct client meets a conflict on those three and loses its term (two of five
/// are left); the flawed one writes its record over y's tombstone on member 0 without its
/// condition, at the tombstone's own token, and goes on with members 0, 3 and 4. The
/// tombstone names another term: the first write of a block must carry a token above the one
/// it replaces (guard P1), and the chain checker flags it. (With one member renewed blind,
/// a second leader needs that member taken over legitimately while the blind writer still
/// counts a majority without it, which two majorities forbid; what the flaw breaks is the
/// chain of tokens on the member.) Returns what member 0 showed before and after x's renew,
/// and whether x still leads.
async fn blind_renew(flaw: QuorumFlaw) -> (Rec, Rec, bool) {
    let stores = Stores::new(5);
    let (x, _) = stores.start("x", 1, flaw);
    until("x leads", 2 * TTL, async || leading(&x).is_some()).await;
    let (y, _) = stores.start("y", 2, flaw);
    let first = stores.revision(0).await;
    until("x renews", TTL, async || stores.revision(0).await != first).await;
    for s in &stores.stores[..3] {
        s.delete_object(&object("job.q"));
    }
    until("y writes tombstones", Duration::from_secs(2), async || {
        stores.record(0).await.is_some_and(|r| r.holder == "y")
    })
    .await;
    let before = stores.record(0).await.unwrap();
    // x's next renew comes one renew period (7.5 s) after the last.
    sleep(Duration::from_secs(8)).await;
    let after = stores.record(0).await.unwrap();
    let x_leads = leading(&x).is_some();
    assert!(leading(&y).is_none());
    x.shutdown().await;
    y.shutdown().await;
    (before, after, x_leads)
}

/// The chain checker's verdict on a write that replaced `before` with `after` on member 0.
fn chain_verdict(before: &Rec, after: &Rec) -> usize {
    if before.term == after.term {
        return 0;
    }
    check_store_chains(&[QuorumEvent::Landed {
        store: 0,
        cand: None,
        token: after.token,
        replaced: Some(before.token),
        held: after.held,
        at: Duration::ZERO,
    }])
    .len()
}

#[tokio::test(start_paused = true)]
async fn a_blind_renew_over_five_members_breaks_the_chain_of_tokens() {
    let (before, after, x_leads) = blind_renew(QuorumFlaw::None).await;
    assert!(!before.held && before.holder == "y", "{before:?}");
    assert_eq!(after, before, "the tombstone stays");
    assert!(!x_leads, "three of five records gone: the term is lost");
    let (before, after, x_leads) = blind_renew(QuorumFlaw::BlindRenew).await;
    assert!(!before.held && before.holder == "y", "{before:?}");
    assert!(after.held && after.holder == "x", "{after:?}");
    assert_eq!(after.token, before.token);
    assert!(x_leads);
    assert_eq!(chain_verdict(&before, &after), 1);
}

/// Token from one answer, n = 3: x leads (token 1) and resigns; an operator wipes member 0
/// and deletes the marks of members 1 and 2 (their records, x's releases, still carry token
/// 1). y reads member 0 first: empty, so a suspect, but members 1 and 2 answer with their
/// history. The correct client mints 2 (above every record and mark it read); the flawed one
/// mints 1 + what member 0 shows = 1, and with the marks gone nothing refuses it: x's token
/// again.
async fn token_from_one(flaw: QuorumFlaw) -> (FencingToken, FencingToken) {
    let stores = Stores::new(3);
    let (x, _) = stores.start("x", 1, flaw);
    until("x leads", 2 * TTL, async || leading(&x).is_some()).await;
    let first = leading(&x).unwrap();
    x.shutdown().await;
    for name in ["job.q", "job.qhw", "job.qid"] {
        stores.stores[0].delete_object(&object(name));
    }
    for s in &stores.stores[1..] {
        s.delete_object(&object("job.qhw"));
    }
    let (y, _) = stores.start("y", 2, flaw);
    until("y leads", 2 * TTL, async || leading(&y).is_some()).await;
    let second = leading(&y).unwrap();
    y.shutdown().await;
    (first, second)
}

#[tokio::test(start_paused = true)]
async fn a_token_from_one_answer_repeats_a_token_once_the_marks_are_gone() {
    let (first, second) = token_from_one(QuorumFlaw::None).await;
    assert!(second > first, "{second} after {first}");
    let (first, second) = token_from_one(QuorumFlaw::TokenFromOne).await;
    assert!(second <= first, "{second} after {first}");
}

/// A key whose first acquisition left a trace on one member only: candidate a takes member
/// 0 (mark, then record), and its calls to members 1 and 2 then hang, so it gives member 0
/// back and its term never begins. Members 1 and 2 never took part: they show neither a
/// record nor a mark, while member 0 shows the key's history. Counting both as suspect (as
/// if they had lost it) leaves fewer than a majority answering with their history, forever:
/// nothing would ever write them again (the random seeds found this in about 1 seed in 50
/// at n = 3). At most a minority can have lost its history, so at most a minority of the
/// empty answers is suspect, and once the members answer again a term begins, above the
/// token a left on member 0.
#[tokio::test(start_paused = true)]
async fn a_key_whose_first_acquisition_reached_one_member_still_elects() {
    let stores = Stores::new(3);
    let a = stores.candidate("a", 1, QuorumFlaw::None, ms(5));
    let mark = async || {
        stores.stores[0]
            .get_fenced(&object("job.qhw"))
            .await
            .unwrap()
            .is_some()
    };
    let end = Instant::now() + TTL;
    while !mark().await {
        assert!(Instant::now() < end, "no mark on member 0");
        sleep(ms(1)).await;
    }
    for c in &a.controls[1..] {
        c.update(|f| f.hang = true);
    }
    until("a gives member 0 back", TTL, async || {
        stores.record(0).await.is_some_and(|r| !r.held)
    })
    .await;
    let left = stores.record(0).await.unwrap();
    assert!(stores.record(1).await.is_none() && stores.record(2).await.is_none());
    assert!(leading(&a.handle).is_none());
    for c in &a.controls[1..] {
        c.update(|f| f.hang = false);
    }
    let b = stores.candidate("b", 2, QuorumFlaw::None, ms(5)).handle;
    until("a leader", 4 * TTL, async || {
        leading(&a.handle).is_some() || leading(&b).is_some()
    })
    .await;
    let token = leading(&a.handle).or_else(|| leading(&b)).unwrap();
    assert!(token.get() > left.token, "{token} after {}", left.token);
}

/// A follower that may not write (here: one member wiped and another down, with n = 3, so
/// fewer than a majority answer with the key's history: no term, by design) still reads once
/// a poll, as any follower, though its verdicts call the members it could write free *now*:
/// at most 12 reads a poll (a round of records, then a full round of identity, record and
/// mark, on each of 3 members), polls at least 0.5 s apart, so at most 240 reads in 10 s
/// (180 measured). A follower that took "free now" for "take over now" would read again as
/// soon as each round ends (3,711 reads in 10 s when planted).
#[tokio::test(start_paused = true)]
async fn a_follower_that_may_not_write_reads_once_a_poll() {
    let stores = Stores::new(3);
    let a = stores.candidate("a", 1, QuorumFlaw::None, ms(5));
    until("a leads", 2 * TTL, async || leading(&a.handle).is_some()).await;
    a.handle.shutdown().await;
    for name in ["job.q", "job.qhw", "job.qid"] {
        stores.stores[0].delete_object(&object(name));
    }
    let b = stores.candidate("b", 2, QuorumFlaw::None, ms(5));
    b.controls[1].update(|f| f.down = true);
    sleep(2 * TTL).await;
    assert!(leading(&b.handle).is_none());
    let before = b.reads();
    sleep(Duration::from_secs(10)).await;
    let reads = b.reads() - before;
    assert!(reads <= 240, "{reads} reads in 10 s");
}
