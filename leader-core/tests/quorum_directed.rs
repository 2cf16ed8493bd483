//! The interleavings a safety review of the election over a quorum found, each played exactly
//! under paused time on memory stores behind faults of their own, asserting the behaviour the
//! rules now give (each failed on the code before its fix):
//! - F1: a member whose record an operator deleted is taken back into the term;
//! - F1b: so is a member where a renew landed after its answer was lost;
//! - F2: a long-dead record of another member set is waited out, not refused for good;
//! - F3: candidates with different ttls never lead at once (the ttl is part of the set);
//! - F4: a member whose writes hang does not make the term churn;
//! - F5b: a tombstone that lands late on a member emptied since repeats no token;
//! - F6: a key emptied under a live leader is not taken as a new one by a candidate that has
//!   seen its history;
//! - F7: a member emptied under a late write of its old identity is written again;
//! - F8: a key is new only when every member answers empty;
//! - F9: nor while a member shows a record or mark of another identity (a live term's).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use leader_core::backend::{Expected, Fence, FencedCas, FencedPut};
use leader_core::quorum::{Quorum, QuorumMember};
use leader_core::simulation::{FaultControl, FaultyStore};
use leader_core::{
    Elector, ElectorHandle, FencingToken, HolderId, Leadership, LeaseKey, MemoryStore, ObjectName,
    ShardStore,
};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

const TTL: Duration = Duration::from_secs(15);
const M: [&str; 3] = ["m0", "m1", "m2"];

type Faulty = Arc<FaultyStore<MemoryStore>>;

fn key() -> LeaseKey {
    LeaseKey::new("job").unwrap()
}

fn obj(s: &str) -> ObjectName {
    ObjectName::new(s).unwrap()
}

/// A candidate's view of `stores` under `names`: the quorum, one control and one faulty store
/// per member.
fn view(
    stores: &[MemoryStore],
    names: &[&str],
    seed: u64,
) -> (Quorum, Vec<Arc<FaultControl>>, Vec<Faulty>) {
    let mut controls = Vec::new();
    let mut faulty = Vec::new();
    let members = stores
        .iter()
        .zip(names)
        .enumerate()
        .map(|(i, (s, name))| {
            let control = FaultControl::new();
            controls.push(control.clone());
            let f: Faulty = Arc::new(FaultyStore::new(
                s.clone(),
                seed * 16 + i as u64,
                vec![control],
            ));
            faulty.push(f.clone());
            QuorumMember::new(*name, f as Arc<dyn ShardStore>)
        })
        .collect();
    (Quorum::new(members).unwrap(), controls, faulty)
}

fn stores() -> Vec<MemoryStore> {
    (0..3).map(|_| MemoryStore::new()).collect()
}

fn spawn(q: Quorum, id: &str, ttl: Duration, seed: u64) -> (ElectorHandle, JoinHandle<()>) {
    let (h, task) = Elector::quorum_builder(q, key())
        .ttl(ttl)
        .holder_id(HolderId::new(id).unwrap())
        .jitter_seed(seed)
        .build()
        .unwrap()
        .into_parts();
    (h, tokio::spawn(task))
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

/// The record on a store: its token, revision and body.
async fn record_on(s: &MemoryStore) -> Option<(u64, String, String)> {
    let o = s.get_fenced(&obj("job.q")).await.unwrap()?;
    Some((
        o.fence.get(),
        o.revision.to_string(),
        String::from_utf8_lossy(&o.value).into_owned(),
    ))
}

/// Watches `handles` for `d`: never two leaders at once, and tokens of new terms only rise.
async fn watch(handles: &[&ElectorHandle], d: Duration) -> Vec<FencingToken> {
    let end = Instant::now() + d;
    let mut tokens: Vec<FencingToken> = Vec::new();
    while Instant::now() < end {
        let leaders: Vec<FencingToken> = handles.iter().filter_map(|h| leading(h)).collect();
        assert!(leaders.len() <= 1, "two leaders at once: {leaders:?}");
        if let Some(t) = leaders.first()
            && tokens.last() != Some(t)
        {
            if let Some(last) = tokens.last() {
                assert!(t > last, "token went from {last} to {t}");
            }
            tokens.push(*t);
        }
        sleep(Duration::from_millis(10)).await;
    }
    tokens
}

/// A term of candidate "p" with every member answering, resigned: the key has a history on
/// every member (a brand-new key's first term needs every member to answer).
async fn prime(stores: &[MemoryStore], ttl: Duration, seed: u64) {
    let (q, _, _) = view(stores, &M, seed);
    let (p, _t) = spawn(q, "p", ttl, seed);
    until("p leads", 2 * ttl, || leading(&p).is_some()).await;
    p.shutdown().await;
}

fn wipe(s: &MemoryStore) {
    for n in ["job.q", "job.qhw", "job.qid"] {
        s.delete_object(&obj(n));
    }
}

#[tokio::test(start_paused = true)]
async fn f1_a_member_whose_record_was_deleted_rejoins_the_term() {
    let stores = stores();
    let (q, _, _) = view(&stores, &M, 1);
    let (a, _t) = spawn(q, "a", TTL, 1);
    until("a leads", 2 * TTL, || leading(&a).is_some()).await;
    let t = leading(&a).unwrap().get();
    stores[2].delete_object(&obj("job.q"));
    sleep(6 * TTL).await;
    assert_eq!(leading(&a).map(|t| t.get()), Some(t), "the term goes on");
    let (token, _, body) = record_on(&stores[2]).await.unwrap();
    assert_eq!(token, t, "member 2 carries the term again: {body}");
    assert!(body.contains("\"held\""), "{body}");
}

#[tokio::test(start_paused = true)]
async fn f1b_a_member_where_a_renew_landed_late_rejoins_the_term() {
    let stores = stores();
    let (q, controls, faulty) = view(&stores, &M, 2);
    let (a, _t) = spawn(q, "a", TTL, 2);
    until("a leads", 2 * TTL, || leading(&a).is_some()).await;
    controls[2].update(|f| {
        f.late = 1.0;
        f.hold_min = Duration::from_secs(5);
        f.hold_max = Duration::from_secs(5);
    });
    until("a renew held", TTL, || faulty[2].held() >= 1).await;
    controls[2].update(|f| f.late = 0.0);
    sleep(Duration::from_secs(6)).await; // landed
    let (_, landed, _) = record_on(&stores[2]).await.unwrap();
    sleep(3 * TTL).await;
    let (_, now, _) = record_on(&stores[2]).await.unwrap();
    assert_ne!(landed, now, "member 2 is written by the term again");
}

#[tokio::test(start_paused = true)]
async fn f2_a_long_dead_record_of_another_member_set_is_waited_out() {
    let stores = stores();
    let (qx, _, _) = view(&stores, &["x0", "x1", "x2"], 3);
    let (x, xt) = spawn(qx, "x", TTL, 3);
    until("x leads", 2 * TTL, || leading(&x).is_some()).await;
    xt.abort(); // a crash: no release
    sleep(20 * TTL).await;
    let (q, _, _) = view(&stores, &M, 4);
    let (c, _t) = spawn(q, "c", TTL, 4);
    until("c leads", 3 * TTL, || leading(&c).is_some()).await;
    assert!(!matches!(
        &*c.leadership().borrow(),
        Leadership::Stopped { .. }
    ));
    drop(x);
}

#[tokio::test(start_paused = true)]
async fn f3_candidates_with_different_ttls_never_lead_at_once() {
    let stores = stores();
    // A key led before, member 2 emptied since (as a key whose member 2 never took part).
    prime(&stores, Duration::from_secs(30), 50).await;
    wipe(&stores[2]);
    let (qa, a_faults, _) = view(&stores, &M, 5);
    a_faults[2].update(|f| f.down = true); // a cannot reach member 2
    let (a, _at) = spawn(qa, "a", Duration::from_secs(30), 5);
    until("a leads", 4 * TTL, || leading(&a).is_some()).await;
    let (qg, _, _) = view(&stores, &M, 6);
    let (g, _gt) = spawn(qg, "g", Duration::from_secs(8), 6);
    sleep(Duration::from_secs(2)).await;
    // Right after a's renew lands on member 0, an operator deletes that record.
    let (_, rev, _) = record_on(&stores[0]).await.unwrap();
    let end = Instant::now() + Duration::from_secs(40);
    while record_on(&stores[0])
        .await
        .is_some_and(|(_, r, _)| r == rev)
    {
        assert!(Instant::now() < end, "a never renewed");
        sleep(Duration::from_millis(5)).await;
    }
    stores[0].delete_object(&obj("job.q"));
    watch(&[&a, &g], 4 * TTL).await;
}

#[tokio::test(start_paused = true)]
async fn f4_a_member_whose_writes_hang_costs_no_term() {
    let stores = stores();
    prime(&stores, TTL, 70).await;
    let (q, controls, _) = view(&stores, &M, 7);
    controls[2].update(|f| {
        f.late = 1.0;
        f.hold_min = Duration::from_secs(3600);
        f.hold_max = Duration::from_secs(3600);
    });
    let (a, _t) = spawn(q, "a", TTL, 7);
    until("a leads", 4 * TTL, || leading(&a).is_some()).await;
    let tokens = watch(&[&a], 6 * TTL).await;
    assert_eq!(tokens.len(), 1, "terms churn: {tokens:?}");
}

#[tokio::test(start_paused = true)]
async fn f5b_a_late_tombstone_on_a_member_emptied_since_repeats_no_token() {
    let stores = stores();
    let (qx, _, _) = view(&stores, &M, 10);
    let (x, _xt) = spawn(qx, "x", TTL, 10);
    until("x leads", 2 * TTL, || leading(&x).is_some()).await;
    let mut tokens = vec![leading(&x).unwrap()];
    x.shutdown().await;
    stores[0].delete_object(&obj("job.q"));
    // f's writes to member 0 are delivered 60 s late: its tombstone there is in flight.
    let (qf, f_faults, f_faulty) = view(&stores, &M, 11);
    f_faults[0].update(|f| {
        f.late = 1.0;
        f.hold_min = Duration::from_secs(60);
        f.hold_max = Duration::from_secs(60);
    });
    let (f, _ft) = spawn(qf, "f", TTL, 11);
    until("f leads", 2 * TTL, || leading(&f).is_some()).await;
    tokens.push(leading(&f).unwrap());
    f.shutdown().await;
    f_faults[0].update(|f| f.late = 0.0);
    assert!(f_faulty[0].held() >= 1, "a write to member 0 is in flight");
    // x2 cannot reach member 2: it leads on {0, 1}.
    let (qx2, x2_faults, _) = view(&stores, &M, 12);
    x2_faults[2].update(|f| f.down = true);
    let (x2, x2t) = spawn(qx2, "x2", TTL, 12);
    until("x2 leads", 3 * TTL, || leading(&x2).is_some()).await;
    tokens.push(leading(&x2).unwrap());
    // Member 0 is emptied; x2 crashes; the late tombstone lands on the empty member 0.
    wipe(&stores[0]);
    x2t.abort();
    sleep(Duration::from_secs(70)).await;
    // b cannot reach member 1 (x2's other member).
    let (qb, b_faults, _) = view(&stores, &M, 13);
    b_faults[1].update(|f| f.down = true);
    let (b, _bt) = spawn(qb, "b", TTL, 13);
    let end = Instant::now() + 4 * TTL;
    while Instant::now() < end {
        if let Some(t) = leading(&b) {
            tokens.push(t);
            break;
        }
        sleep(Duration::from_millis(10)).await;
    }
    for w in tokens.windows(2) {
        assert!(w[1] > w[0], "a token repeated or went down: {tokens:?}");
    }
    drop(x2);
}

#[tokio::test(start_paused = true)]
async fn f6_a_key_emptied_under_a_live_leader_is_not_new_to_a_follower() {
    let stores = stores();
    let (qa, _, _) = view(&stores, &M, 14);
    let (a, _at) = spawn(qa, "a", TTL, 14);
    until("a leads", 2 * TTL, || leading(&a).is_some()).await;
    let (qb, _, _) = view(&stores, &M, 15);
    let (b, _bt) = spawn(qb, "b", TTL, 15);
    sleep(Duration::from_secs(1)).await;
    for s in &stores {
        s.delete_object(&obj("job.q"));
        s.delete_object(&obj("job.qhw"));
    }
    let tokens = watch(&[&a, &b], 4 * TTL).await;
    assert!(tokens.len() >= 2, "nobody led again: {tokens:?}");
}

/// F7, found by the simulation (seed 4741 at n = 3): an operator empties member 2 under a
/// live term, and a write stamped with the member's old identity lands there afterwards (a
/// late delivery, replayed here by writing back the objects the member held). The clients
/// read that record and mark as absent, as they must (they are not the member's history),
/// but a tombstone conditioned on "absent" could never apply over them: the member never
/// rejoined the term, and with another member down nobody could lead. The writes are now
/// conditioned on the revisions that stand there: the member carries the term again, and the
/// term survives member 0's outage.
#[tokio::test(start_paused = true)]
async fn f7_a_member_emptied_under_a_late_write_rejoins_the_term() {
    let stores = stores();
    let (q, controls, _) = view(&stores, &M, 14);
    let (a, _t) = spawn(q, "a", TTL, 14);
    until("a leads", 2 * TTL, || leading(&a).is_some()).await;
    let t = leading(&a).unwrap();
    let old: Vec<_> = {
        let mut v = Vec::new();
        for n in ["job.q", "job.qhw"] {
            v.push((n, stores[2].get_fenced(&obj(n)).await.unwrap().unwrap()));
        }
        v
    };
    wipe(&stores[2]);
    sleep(Duration::from_secs(1)).await;
    for (n, o) in &old {
        let fence = Fence::new(key(), HolderId::new("a").unwrap(), o.fence);
        let name = obj(n);
        let put = FencedPut::new(&fence, &name, &Expected::Absent, &o.value).without_lease_check();
        stores[2].put_fenced_if(put).await.unwrap();
    }
    sleep(4 * TTL).await;
    let (token, _, body) = record_on(&stores[2]).await.unwrap();
    assert_eq!(token, t.get(), "member 2 carries the term again: {body}");
    let id = stores[2]
        .get_fenced(&obj("job.qid"))
        .await
        .unwrap()
        .unwrap();
    let id = String::from_utf8_lossy(&id.value).into_owned();
    assert!(
        body.contains(&id),
        "stamped with the member's new identity: {body}"
    );
    controls[0].update(|f| f.down = true);
    sleep(2 * TTL).await;
    assert_eq!(leading(&a), Some(t), "the term survives member 0's outage");
}

/// F8, from a second safety review: a key counted as brand-new while a member did not
/// answer. Then a first term can begin with one member away, leaving the key's history on a
/// majority that excludes it; once an operator empties one of those two (a minority) and the
/// other is away, a freshly started candidate finds only empty members and mints a token
/// below the last one (tokens 1, 2, 3, then 1 again). A key is new only when every member
/// answers empty: with member 2 away, nobody begins; once it answers, the first term does.
#[tokio::test(start_paused = true)]
async fn f8_a_new_key_begins_only_once_every_member_answered() {
    let stores = stores();
    let (q, controls, _) = view(&stores, &M, 15);
    controls[2].update(|f| f.down = true);
    let (a, _t) = spawn(q, "a", TTL, 15);
    sleep(4 * TTL).await;
    assert!(leading(&a).is_none(), "a new key began with member 2 away");
    controls[2].update(|f| f.down = false);
    until("a leads once member 2 answers", 2 * TTL, || {
        leading(&a).is_some()
    })
    .await;
}

/// F9, from a third safety review: a live term's record of another identity taken at once.
/// a's first writes on member 0 cross an operator's emptying of it (replayed by deleting
/// member 0's identity after they landed): a leads on members 0 and 1 with records stamped
/// with an identity member 0 no longer has, and never takes member 2 (its writes there never
/// arrive). Member 1 is then emptied (one member of three), and b starts with its first read
/// of member 0 lost. b's full round draws member 0 a new identity, so every member reads as
/// empty: the key looked new, and b took all three at once with token 1, over a's live
/// record: two leaders. A member showing objects of another identity now keeps the key from
/// being new (a tombstone, timed, instead), and their tokens raise the floor.
async fn f9(partition_a_from_1: bool) {
    let stores = stores();
    put_id(&stores[2], "m2-identity").await;
    let (qa, a_c, _) = view(&stores, &M, 21);
    a_c[2].update(|f| {
        f.late = 1.0;
        f.hold_min = Duration::from_secs(100_000);
        f.hold_max = Duration::from_secs(100_000);
    });
    let (a, _at) = spawn(qa, "a", TTL, 21);
    until("a leads", 2 * TTL, || leading(&a).is_some()).await;
    let ta = leading(&a).unwrap();
    assert!(
        record_on(&stores[2]).await.is_none(),
        "member 2 not taken by a"
    );
    stores[0].delete_object(&obj("job.qid"));
    sleep(Duration::from_secs(8)).await;
    assert_eq!(leading(&a), Some(ta), "a still leads on members 0 and 1");
    if partition_a_from_1 {
        a_c[1].update(|f| f.down = true);
    }
    wipe(&stores[1]);
    let (qb, b_c, b_f) = view(&stores, &M, 22);
    b_c[0].update(|f| f.hang = true);
    let (b, _bt) = spawn(qb, "b", TTL, 22);
    while b_f[0].counts().0 == 0 {
        sleep(Duration::from_millis(1)).await;
    }
    b_c[0].update(|f| f.hang = false);
    let mut tokens = vec![ta];
    let end = Instant::now() + 2 * TTL;
    while Instant::now() < end {
        let (la, lb) = (leading(&a), leading(&b));
        assert!(
            la.is_none() || lb.is_none(),
            "two leaders at once: {la:?} {lb:?}"
        );
        if let Some(t) = lb
            && tokens.last() != Some(&t)
        {
            tokens.push(t);
        }
        sleep(Duration::from_millis(10)).await;
    }
    for w in tokens.windows(2) {
        assert!(w[1] > w[0], "a token repeated or went down: {tokens:?}");
    }
}

async fn put_id(s: &MemoryStore, id: &str) {
    let fence = Fence::new(key(), HolderId::new("op").unwrap(), FencingToken(0));
    let name = obj("job.qid");
    let put = FencedPut::new(&fence, &name, &Expected::Absent, id.as_bytes()).without_lease_check();
    s.put_fenced_if(put).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn f9_a_live_record_of_another_identity_is_not_taken_for_a_new_key() {
    f9(false).await;
}

#[tokio::test(start_paused = true)]
async fn f9b_the_same_with_the_leader_cut_from_the_emptied_member() {
    f9(true).await;
}
