//! The election over a quorum of stores, under paused time on memory stores, each behind its
//! own fault control: a minority outage costs nothing, a majority outage ends the term by its
//! deadline, failover and handover, deletions, and the member set's checks.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use leader_core::backend::FencedCas;
use leader_core::quorum::{Quorum, QuorumMember};
use leader_core::simulation::{FaultControl, FaultyStore};
use leader_core::{
    ConfigError, Elector, ElectorHandle, FencingToken, HolderId, Leadership, LeaseKey, MemoryStore,
    ObjectName, Timing,
};
use tokio::time::{Instant, sleep};

const TTL: Duration = Duration::from_secs(15);

fn key() -> LeaseKey {
    LeaseKey::new("job").unwrap()
}

/// Three memory stores; each candidate reaches them through fault controls of its own.
struct Stores {
    stores: Vec<MemoryStore>,
}

impl Stores {
    fn new(n: usize) -> Self {
        Self {
            stores: (0..n).map(|_| MemoryStore::new()).collect(),
        }
    }

    /// A candidate's view: the quorum, and one fault control per member.
    fn view(&self, seed: u64) -> (Quorum, Vec<Arc<FaultControl>>) {
        let mut controls = Vec::new();
        let members = self
            .stores
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let control = FaultControl::new();
                controls.push(control.clone());
                let faulty = FaultyStore::new(s.clone(), seed * 16 + i as u64, vec![control]);
                QuorumMember::new(format!("m{i}"), Arc::new(faulty))
            })
            .collect();
        (Quorum::new(members).unwrap(), controls)
    }

    fn start(&self, id: &str, seed: u64) -> (ElectorHandle, Vec<Arc<FaultControl>>) {
        let (quorum, controls) = self.view(seed);
        let handle = Elector::quorum_builder(quorum, key())
            .ttl(TTL)
            .holder_id(HolderId::new(id).unwrap())
            .jitter_seed(seed)
            .build()
            .unwrap()
            .spawn();
        (handle, controls)
    }

    /// The quorum token in member `i`'s record of the key.
    async fn token_on(&self, i: usize) -> Option<u64> {
        let record = ObjectName::new("job.q").unwrap();
        let found = self.stores[i].get_fenced(&record).await.unwrap()?;
        Some(found.fence.get())
    }
}

fn leading(h: &ElectorHandle) -> Option<FencingToken> {
    h.leadership().borrow().token()
}

async fn until(what: &str, within: Duration, f: impl Fn() -> bool) {
    let end = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < end, "{what}: not within {within:?}");
        sleep(Duration::from_millis(10)).await;
    }
}

/// Watches `handles` for `d`: no two lead at once, and tokens only rise. The tokens seen, in
/// order, with when each was first seen.
async fn watch_terms(handles: &[&ElectorHandle], d: Duration) -> Vec<(FencingToken, Instant)> {
    let end = Instant::now() + d;
    let mut tokens: Vec<(FencingToken, Instant)> = Vec::new();
    while Instant::now() < end {
        let leaders: Vec<FencingToken> = handles.iter().filter_map(|h| leading(h)).collect();
        assert!(leaders.len() <= 1, "two leaders at once: {leaders:?}");
        if let Some(t) = leaders.first()
            && tokens.last().map(|(t, _)| t) != Some(t)
        {
            if let Some((last, _)) = tokens.last() {
                assert!(t > last, "token went from {last} to {t}");
            }
            tokens.push((*t, Instant::now()));
        }
        sleep(Duration::from_millis(10)).await;
    }
    tokens
}

/// As [`watch_terms`], the tokens alone.
async fn watch_for(handles: &[&ElectorHandle], d: Duration) -> Vec<FencingToken> {
    watch_terms(handles, d)
        .await
        .into_iter()
        .map(|(t, _)| t)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_leader_keeps_its_term_and_token_through_the_outage_of_one_store() {
    let stores = Stores::new(3);
    let (a, a_faults) = stores.start("a", 1);
    let (b, b_faults) = stores.start("b", 2);
    until("a leader", 2 * TTL, || {
        leading(&a).is_some() || leading(&b).is_some()
    })
    .await;
    let (leader, faults) = if leading(&a).is_some() {
        (&a, [a_faults, b_faults].concat())
    } else {
        (&b, [b_faults, a_faults].concat())
    };
    let token = leading(leader).unwrap();
    // Store 2 goes away for everyone, for four ttls.
    for (i, f) in faults.iter().enumerate() {
        if i % 3 == 2 {
            f.update(|f| f.down = true);
        }
    }
    let tokens = watch_for(&[&a, &b], 4 * TTL).await;
    assert_eq!(tokens, vec![token], "the term must go on, unchanged");
    assert_eq!(leading(leader), Some(token));
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_outage_of_a_majority_ends_the_term_by_its_deadline_and_a_later_term_rises() {
    let stores = Stores::new(3);
    let (a, a_faults) = stores.start("a", 1);
    until("a leads", 2 * TTL, || leading(&a).is_some()).await;
    let first = leading(&a).unwrap();
    let deadline = match &*a.leadership().borrow() {
        Leadership::Leader { deadline, .. } => *deadline,
        other => panic!("{other:?}"),
    };
    for f in &a_faults[..2] {
        f.update(|f| f.down = true);
    }
    until("a steps down", TTL, || leading(&a).is_none()).await;
    assert!(Instant::now() <= deadline + Duration::from_millis(50));
    // Nobody leads while a majority is away.
    let (b, b_faults) = stores.start("b", 2);
    for f in &b_faults[..2] {
        f.update(|f| f.down = true);
    }
    let end = Instant::now() + 2 * TTL;
    while Instant::now() < end {
        assert!(leading(&a).is_none() && leading(&b).is_none());
        sleep(Duration::from_millis(50)).await;
    }
    for f in a_faults.iter().chain(&b_faults) {
        f.update(|f| f.down = false);
    }
    until("a new term", 3 * TTL, || {
        leading(&a).is_some() || leading(&b).is_some()
    })
    .await;
    let next = leading(&a).or(leading(&b)).unwrap();
    assert!(next > first, "{next} after {first}");
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_crashed_leader_is_replaced_after_a_ttl_and_a_released_one_at_once() {
    let stores = Stores::new(3);
    let (quorum, _) = stores.view(1);
    let (a, task) = Elector::quorum_builder(quorum, key())
        .ttl(TTL)
        .holder_id(HolderId::new("a").unwrap())
        .build()
        .unwrap()
        .into_parts();
    let task = tokio::spawn(task);
    until("a leads", 2 * TTL, || leading(&a).is_some()).await;
    let first = leading(&a).unwrap();
    let (b, _) = stores.start("b", 2);
    sleep(TTL / 2).await;
    assert!(leading(&b).is_none());
    task.abort(); // a crash: no release
    let crashed = Instant::now();
    until("b takes over", 2 * TTL, || leading(&b).is_some()).await;
    let failover = crashed.elapsed();
    assert!(failover <= TTL + Duration::from_secs(2), "{failover:?}");
    let second = leading(&b).unwrap();
    assert!(second > first);
    let (c, _) = stores.start("c", 3);
    sleep(Duration::from_secs(2)).await;
    let released = Instant::now();
    b.shutdown().await;
    until("c takes over", TTL, || leading(&c).is_some()).await;
    assert!(
        released.elapsed() <= Duration::from_secs(2),
        "handover took {:?}",
        released.elapsed()
    );
    assert!(leading(&c).unwrap() > second);
    c.shutdown().await;
    drop(a);
}

#[tokio::test(start_paused = true)]
async fn deleted_records_delay_a_takeover_and_tokens_still_rise() {
    let stores = Stores::new(3);
    let (a, _) = stores.start("a", 1);
    until("a leads", 2 * TTL, || leading(&a).is_some()).await;
    let first = leading(&a).unwrap();
    let (b, _) = stores.start("b", 2);
    sleep(Duration::from_secs(1)).await;
    // An operator deletes a's record on two members: a loses its majority at its next renew.
    let record = ObjectName::new("job.q").unwrap();
    for s in &stores.stores[..2] {
        s.delete_object(&record);
    }
    let deleted = Instant::now();
    let tokens = watch_terms(&[&a, &b], 3 * TTL).await;
    assert!(
        leading(&a).is_some() || leading(&b).is_some(),
        "nobody leads"
    );
    assert_eq!(tokens.len(), 2, "{tokens:?}");
    let (next, at) = tokens[1];
    assert!(next > first, "{next} after {first}");
    // The deleted members were tombstoned and timed: nobody took them before a ttl.
    assert!(at - deleted >= TTL, "{:?}", at - deleted);
    // Every record and the third member's too: the marks keep the tokens rising.
    a.shutdown().await;
    b.shutdown().await;
    for s in &stores.stores {
        s.delete_object(&record);
    }
    let (c, _) = stores.start("c", 3);
    until("c leads", 4 * TTL, || leading(&c).is_some()).await;
    assert!(leading(&c).unwrap() > next);
    assert!(stores.token_on(0).await.unwrap() > next.get());
    c.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn candidates_started_together_elect_one_leader() {
    let stores = Stores::new(3);
    let handles: Vec<ElectorHandle> = (0..5)
        .map(|i| stores.start(&format!("c{i}"), 10 + i).0)
        .collect();
    let all: Vec<&ElectorHandle> = handles.iter().collect();
    until("a leader", 3 * TTL, || {
        all.iter().any(|h| leading(h).is_some())
    })
    .await;
    let tokens = watch_for(&all, 2 * TTL).await;
    assert_eq!(tokens.len(), 1, "{tokens:?}");
    for h in handles {
        h.shutdown().await;
    }
}

#[test]
fn a_quorum_needs_an_odd_number_of_distinct_members() {
    let member = |name: &str| QuorumMember::new(name, Arc::new(MemoryStore::new()));
    for n in [0usize, 1, 2, 4, 6, 10, 11] {
        let members = (0..n).map(|i| member(&format!("m{i}"))).collect();
        assert!(
            matches!(Quorum::new(members), Err(ConfigError::InvalidQuorum(_))),
            "{n} members"
        );
    }
    let twice = vec![member("a"), member("b"), member("a")];
    let e = Quorum::new(twice).unwrap_err();
    assert!(e.to_string().contains("given twice"), "{e}");
    assert_eq!(
        Quorum::new(vec![member("a"), member("b"), member("c")])
            .unwrap()
            .majority(),
        2
    );
}

#[tokio::test(start_paused = true)]
async fn one_store_under_two_names_is_refused() {
    let shared = MemoryStore::new();
    let quorum = Quorum::new(vec![
        QuorumMember::new("a", Arc::new(shared.clone())),
        QuorumMember::new("b", Arc::new(MemoryStore::new())),
        QuorumMember::new("a-again", Arc::new(shared)),
    ])
    .unwrap();
    let handle = Elector::quorum_builder(quorum, key())
        .ttl(TTL)
        .build()
        .unwrap()
        .spawn();
    let end = Instant::now() + 2 * TTL;
    loop {
        if let Leadership::Stopped { problem: Some(p) } = &*handle.leadership().borrow() {
            assert!(p.message.contains("same store under two names"), "{p:?}");
            break;
        }
        assert!(Instant::now() < end, "not refused");
        assert!(leading(&handle).is_none());
        sleep(Duration::from_millis(10)).await;
    }
}

/// Two candidates configured with different member sets ({a, b, c} and {a, b, d}) each take
/// a majority of their own while one shared store is cut off from each (on a key each set has
/// led before, with every member answering: a brand-new key's first term needs them all).
/// Once they can see
/// each other's records, both step down within two renew periods (each sees the other's
/// record renewed), one stops with an error that names the mismatch, and they never lead at
/// once again.
#[tokio::test(start_paused = true)]
async fn candidates_with_different_member_sets_step_down_and_refuse() {
    let shared: Vec<MemoryStore> = (0..4).map(|_| MemoryStore::new()).collect();
    let view = |names: [&str; 3], idx: [usize; 3], seed: u64| {
        let mut controls = Vec::new();
        let members = names
            .iter()
            .zip(idx)
            .map(|(name, i)| {
                let control = FaultControl::new();
                controls.push(control.clone());
                let faulty = FaultyStore::new(shared[i].clone(), seed + i as u64, vec![control]);
                QuorumMember::new(*name, Arc::new(faulty))
            })
            .collect();
        (Quorum::new(members).unwrap(), controls)
    };
    let start = |q: Quorum, id: &str| {
        Elector::quorum_builder(q, key())
            .ttl(TTL)
            .holder_id(HolderId::new(id).unwrap())
            .build()
            .unwrap()
            .spawn()
    };
    // Each set leads once with all its members, and resigns.
    for (names, idx, seed) in [
        (["a", "b", "c"], [0, 1, 2], 30),
        (["a", "b", "d"], [0, 1, 3], 40),
    ] {
        let (q, _) = view(names, idx, seed);
        let h = start(q, "earlier");
        until("an earlier term", 3 * TTL, || leading(&h).is_some()).await;
        h.shutdown().await;
    }
    let (qa, a_faults) = view(["a", "b", "c"], [0, 1, 2], 10);
    let (qb, b_faults) = view(["a", "b", "d"], [0, 1, 3], 20);
    // a cannot reach store a, b cannot reach store b: each takes a majority of its own.
    a_faults[0].update(|f| f.down = true);
    b_faults[1].update(|f| f.down = true);
    let a = start(qa, "a");
    let b = start(qb, "b");
    until("both lead", 3 * TTL, || {
        leading(&a).is_some() && leading(&b).is_some()
    })
    .await;
    a_faults[0].update(|f| f.down = false);
    b_faults[1].update(|f| f.down = false);
    let renew_every = Timing::from_ttl(TTL).renew_every;
    until(
        "not both lead",
        2 * renew_every + Duration::from_secs(1),
        || leading(&a).is_none() || leading(&b).is_none(),
    )
    .await;
    let stopped = |h: &ElectorHandle| {
        matches!(&*h.leadership().borrow(), Leadership::Stopped { problem: Some(p) }
            if p.message.contains("another set of members"))
    };
    let end = Instant::now() + 4 * TTL;
    let mut refused = false;
    while Instant::now() < end {
        assert!(
            leading(&a).is_none() || leading(&b).is_none(),
            "both lead again"
        );
        refused |= stopped(&a) || stopped(&b);
        sleep(Duration::from_millis(10)).await;
    }
    assert!(refused, "neither refused the other member set");
}
