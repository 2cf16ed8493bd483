//! What the conformance suite cannot see: the builder's checks, the token (czxid), the ACL
//! that keeps a term's writes on its own node, the watchdog, the session timeout check, the
//! watch, and fenced writes that check the lease node, against a real ZooKeeper server.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod support;

use std::sync::Arc;
use std::time::Duration;

use leader_core::backend::{
    Expected, FencedCas, FencedPut, LeaseRecord, LeaseState, ObjectWrite, Revision, TermId,
    WriteKind, WriteNonce, WriteOutcome, WriteRequest, encode_fenced,
};
use leader_core::conformance::unique_key;
use leader_core::{
    Acquisition, Elector, Error, ErrorKind, Fence, FencedStore, FencingToken, HolderId, Leadership,
    LeaseBackend, LeaseClient, LeaseKey, ObjectName, Renewal, Timing,
};
use leader_zookeeper::{ZooKeeperBuilder, ZooKeeperStore};
use tokio::time::{Instant, sleep, sleep_until, timeout};
use zookeeper_client::{Acls, Client, CreateMode};

/// The server, the store on a fresh parent node, and an operator's client.
struct Env {
    endpoint: String,
    path: String,
    store: ZooKeeperStore,
    raw: Client,
}

impl Env {
    async fn new(name: &str) -> Option<Env> {
        let endpoint = support::endpoint().await?;
        let path = support::unique_path(name);
        let store = support::store(&endpoint, &path).await;
        let raw = support::raw(&endpoint).await;
        Some(Env {
            endpoint,
            path,
            store,
            raw,
        })
    }

    fn client(&self, key: &LeaseKey, who: &str) -> LeaseClient {
        client_on(&self.store, key, who, support::timing())
    }

    /// The lease node's czxid, version and ephemeral owner, if it exists.
    async fn node(&self, key: &LeaseKey) -> Option<(i64, i32, i64)> {
        let path = self.store.lease_path(key);
        self.raw.sync(&path).await.unwrap();
        self.raw
            .check_stat(&path)
            .await
            .unwrap()
            .map(|s| (s.czxid, s.version, s.ephemeral_owner))
    }
}

fn client_on(store: &ZooKeeperStore, key: &LeaseKey, who: &str, timing: Timing) -> LeaseClient {
    LeaseClient::new(
        Arc::new(store.clone()),
        key.clone(),
        HolderId::new(who).unwrap(),
        timing,
    )
    .unwrap()
}

async fn acquire(c: &mut LeaseClient) -> leader_core::Grant {
    match c.try_acquire().await.unwrap() {
        Acquisition::Acquired(g) => g,
        other => panic!("{} should have acquired, got {other:?}", c.holder()),
    }
}

fn key() -> LeaseKey {
    unique_key("zk").unwrap()
}

#[tokio::test]
async fn a_missing_path_is_not_found_and_create_path_creates_it() {
    let Some(endpoint) = support::endpoint().await else {
        return;
    };
    let path = format!("{}/nested/leases", support::unique_path("missing"));
    let err = ZooKeeperStore::builder()
        .with_hosts(&endpoint)
        .with_path(&path)
        .build()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    let text = err.to_string();
    assert!(text.contains(&path), "{text}");
    assert!(text.contains("with_create_path"), "{text}");

    let store = ZooKeeperStore::builder()
        .with_hosts(&endpoint)
        .with_path(format!("{path}/"))
        .with_create_path(true)
        .build()
        .await
        .unwrap();
    assert_eq!(store.path(), path);
    let raw = support::raw(&endpoint).await;
    let stat = raw.check_stat(&path).await.unwrap().expect("created");
    assert_eq!(stat.ephemeral_owner, 0, "the parent must be persistent");
    // And a store on it now builds without the option.
    ZooKeeperStore::builder()
        .with_hosts(&endpoint)
        .with_path(&path)
        .build()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_parent_deleted_after_build_is_not_found_on_read() {
    let Some(env) = Env::new("parent-gone").await else {
        return;
    };
    env.raw.delete(&env.path, None).await.unwrap();
    let err = env.store.read(&key()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains(&env.path), "{err}");
    let err = env.store.read_if_changed(&key(), None).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
}

#[tokio::test]
async fn an_unreachable_ensemble_fails_fast_with_a_clear_error() {
    // Nothing listens on port 1: refused at once, for every host of the list.
    let started = Instant::now();
    let err = ZooKeeperBuilder::new()
        .with_hosts("127.0.0.1:1,127.0.0.1:2")
        .build()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let text = err.to_string();
    assert!(text.contains("127.0.0.1:1,127.0.0.1:2"), "{text}");
    assert!(text.contains("ensemble is running"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    // A host that never answers (a listener that accepts nothing): the connect timeout.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent = silent.local_addr().unwrap();
    let started = Instant::now();
    let err = ZooKeeperBuilder::new()
        .with_hosts(silent.to_string())
        .with_connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains(&silent.to_string()), "{err}");
    assert!(took < Duration::from_millis(1500), "{took:?}");

    let bad = ZooKeeperBuilder::new()
        .with_hosts("not a host list")
        .build()
        .await
        .unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::InvalidConfig, "{bad}");
    assert!(bad.to_string().contains("not a host list"), "{bad}");
}

#[tokio::test]
async fn a_malformed_record_is_reported_by_every_read_and_never_overwritten() {
    let Some(env) = Env::new("malformed").await else {
        return;
    };
    let key = key();
    let path = env.store.lease_path(&key);
    let garbage = b"not json at all".to_vec();
    env.raw
        .create(
            &path,
            &garbage,
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    for err in [
        env.store.read(&key).await.unwrap_err(),
        env.store.read_if_changed(&key, None).await.unwrap_err(),
        env.store.read_for_term(&key, TermId(9)).await.unwrap_err(),
    ] {
        assert_eq!(err.kind(), ErrorKind::MalformedRecord, "{err}");
        assert!(err.to_string().contains(&path), "{err}");
    }
    let mut a = env.client(&key, "a");
    for _ in 0..2 {
        let err = a.try_acquire().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::MalformedRecord, "{err}");
    }
    // A create, and a takeover on a revision the store never reported, conflict.
    for expected in [
        Expected::Absent,
        Expected::Revision(Revision::new("1.0.released")),
    ] {
        let outcome = env
            .store
            .write(WriteRequest::new(
                key.clone(),
                expected,
                record("raw", 1),
                WriteKind::Acquire,
                TermId(77),
            ))
            .await
            .unwrap();
        assert!(
            matches!(outcome, WriteOutcome::Conflict { .. }),
            "{outcome:?}"
        );
    }
    let (data, _) = env.raw.get_data(&path).await.unwrap();
    assert_eq!(data, garbage, "the malformed record was overwritten");
    assert_eq!(env.store.live_terms(), 0, "no session may stay open");
}

fn record(holder: &str, token: u64) -> LeaseRecord {
    LeaseRecord::held(
        HolderId::new(holder).unwrap(),
        FencingToken(token),
        Duration::from_secs(2),
        Default::default(),
        WriteNonce(token ^ 0xabc),
    )
}

#[tokio::test]
async fn the_token_is_the_czxid_and_rises_after_the_node_is_deleted() {
    let Some(env) = Env::new("token").await else {
        return;
    };
    let key = key();
    let mut a = env.client(&key, "a");
    let g1 = acquire(&mut a).await;
    let (czxid, _, owner) = env.node(&key).await.expect("node");
    assert_eq!(g1.token, FencingToken(czxid as u64));
    assert_ne!(owner, 0, "the lease node must be ephemeral");
    let stored = env.store.read(&key).await.unwrap().unwrap();
    assert_eq!(stored.record.token, g1.token, "readers see the czxid");
    assert!(stored.record.is_held());

    // An operator deletes the node mid-term; a candidate that never saw it acquires.
    env.raw
        .delete(&env.store.lease_path(&key), None)
        .await
        .unwrap();
    let other = support::store(&env.endpoint, &env.path).await;
    let mut b = client_on(&other, &key, "b", support::timing());
    let g2 = acquire(&mut b).await;
    let (czxid2, _, _) = env.node(&key).await.expect("node");
    assert_eq!(g2.token, FencingToken(czxid2 as u64));
    assert!(g2.token > g1.token, "{} after {}", g2.token, g1.token);
    // Released and taken again: higher still.
    assert!(b.release().await.unwrap());
    let released = env.store.read(&key).await.unwrap().unwrap();
    assert!(!released.record.is_held());
    assert_eq!(released.record.token, g2.token);
    let mut c = env.client(&key, "c");
    let g3 = acquire(&mut c).await;
    assert!(g3.token > g2.token);
}

/// Versions restart at 0 in a recreated node, so only the ACL tells a term's node from
/// another's: a renew after the node was deleted and recreated by another term is a
/// conflict, and the other term's record stays as it was.
#[tokio::test]
async fn a_renew_after_another_term_recreated_the_node_is_a_conflict() {
    let Some(env) = Env::new("acl").await else {
        return;
    };
    let key = key();
    let mut a = env.client(&key, "a");
    let ga = acquire(&mut a).await;
    let (_, version_a, _) = env.node(&key).await.unwrap();
    env.raw
        .delete(&env.store.lease_path(&key), None)
        .await
        .unwrap();
    let mut b = env.client(&key, "b");
    let gb = acquire(&mut b).await;
    let (czxid_b, version_b, _) = env.node(&key).await.unwrap();
    assert_eq!(
        version_a, version_b,
        "the test needs the same version in both nodes"
    );
    let before = env.store.read(&key).await.unwrap();
    // a is within its term: its renew is sent (setData at its version) and refused.
    assert!(Instant::now() < ga.deadline);
    match a.renew().await.unwrap() {
        Renewal::Lost { .. } => {}
        other => panic!("a's renew must be lost, got {other:?}"),
    }
    assert_eq!(
        env.store.read(&key).await.unwrap(),
        before,
        "b's record changed"
    );
    assert_eq!(env.node(&key).await.unwrap().0, czxid_b);
    assert_eq!(gb.token, FencingToken(czxid_b as u64));
    // b goes on.
    assert!(matches!(b.renew().await.unwrap(), Renewal::Renewed(_)));
}

/// The watchdog: a term whose client stops renewing loses its node a ttl after its last
/// renew was sent, not before, and not much later (ZooKeeper's pings would keep it forever).
#[tokio::test]
async fn a_term_that_stops_renewing_loses_its_node_a_ttl_after_its_last_renew() {
    let Some(env) = Env::new("watchdog").await else {
        return;
    };
    let key = key();
    let ttl = support::timing().ttl;
    let mut a = env.client(&key, "a");
    acquire(&mut a).await;
    sleep(Duration::from_millis(300)).await;
    let before = Instant::now();
    let g = match a.renew().await.unwrap() {
        Renewal::Renewed(g) => g,
        other => panic!("{other:?}"),
    };
    let after = Instant::now();
    // No more renews (the client lives on, as a stuck elector's would).
    sleep_until(g.deadline).await;
    assert!(env.node(&key).await.is_some(), "gone before the deadline");
    sleep_until(before + ttl - Duration::from_millis(150)).await;
    assert!(
        env.node(&key).await.is_some(),
        "gone before a ttl since the last renew was sent"
    );
    let give_up = after + ttl + Duration::from_millis(600);
    loop {
        if env.node(&key).await.is_none() {
            break;
        }
        assert!(
            Instant::now() < give_up,
            "the node outlived its last renew by more than a ttl"
        );
        sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        env.store.live_terms(),
        0,
        "the term's session must be ended"
    );
    // A follower takes the key at once; a's late renew is lost.
    let mut b = env.client(&key, "b");
    acquire(&mut b).await;
    assert!(matches!(
        a.renew().await.unwrap(),
        Renewal::Expired | Renewal::Lost { .. }
    ));
}

/// A holder that dies (its store dropped without a release: no renew, no close) keeps its
/// node until its session expires, a session timeout (the ttl) later, never earlier.
#[tokio::test]
async fn a_dead_holders_node_lasts_until_its_session_expires() {
    let Some(env) = Env::new("dead").await else {
        return;
    };
    let key = key();
    let ttl = support::timing().ttl;
    let dying = support::store(&env.endpoint, &env.path).await;
    let mut a = client_on(&dying, &key, "a", support::timing());
    let sent = Instant::now();
    acquire(&mut a).await;
    drop(a);
    drop(dying);
    sleep(ttl - Duration::from_millis(300)).await;
    assert!(
        env.node(&key).await.is_some(),
        "the node of a dead holder vanished before a ttl"
    );
    // ZooKeeper expires the session within about a tick after its timeout.
    let give_up = sent + ttl * 2 + Duration::from_millis(500);
    while env.node(&key).await.is_some() {
        assert!(Instant::now() < give_up, "the session never expired");
        sleep(Duration::from_millis(50)).await;
    }
    let mut b = env.client(&key, "b");
    acquire(&mut b).await;
}

/// Several candidates on one store: a release ends the term's session, and a waiting
/// follower, woken by the watch (its poll is far slower), takes over at once.
#[tokio::test]
async fn a_release_frees_the_key_at_once_for_a_follower_on_the_same_store() {
    let Some(env) = Env::new("handover").await else {
        return;
    };
    let key = key();
    let mut timing = support::timing();
    // So slow that a takeover within 700 ms of the release is the watch's doing (the first
    // poll of a campaign comes at a random instant within 1.1 x poll_every: a 3 % chance that
    // it falls into the window).
    timing.poll_every = Duration::from_secs(20);
    let store: Arc<dyn LeaseBackend> = Arc::new(env.store.clone());
    let first = Elector::builder(store.clone(), key.clone())
        .timing(timing)
        .holder_id(HolderId::new("first").unwrap())
        .build()
        .unwrap()
        .spawn();
    let term = timeout(Duration::from_secs(5), first.wait_for_term())
        .await
        .unwrap()
        .unwrap();
    let token1 = term.token();
    drop(term);
    let second = Elector::builder(store, key.clone())
        .timing(timing)
        .holder_id(HolderId::new("second").unwrap())
        .build()
        .unwrap()
        .spawn();
    // The second follows once its first read (at once) saw the first as leader.
    let mut seen = second.leadership();
    timeout(
        Duration::from_secs(3),
        seen.wait_for(|l| matches!(l, Leadership::Follower { leader: Some(_) })),
    )
    .await
    .unwrap()
    .unwrap();
    drop(seen);
    sleep(Duration::from_millis(200)).await;
    assert_eq!(env.store.live_terms(), 1);
    let released = Instant::now();
    first.shutdown().await;
    let term = timeout(Duration::from_secs(3), second.wait_for_term())
        .await
        .unwrap()
        .unwrap();
    let took = released.elapsed();
    assert!(term.token() > token1);
    assert!(
        took < Duration::from_millis(700),
        "the follower took {took:?} (its poll is every 20 s: the watch did not wake it)"
    );
    drop(term);
    second.shutdown().await;
    assert_eq!(env.store.live_terms(), 0, "every term's session is ended");
    let released = env.store.read(&key).await.unwrap().unwrap();
    assert!(!released.record.is_held());
}

#[tokio::test]
async fn changes_hint_within_200_ms_of_a_delete() {
    let Some(env) = Env::new("watch").await else {
        return;
    };
    let key = key();
    let mut changes = env.store.changes(&key).expect("inside a runtime");
    // The hint after the watch is set.
    timeout(Duration::from_secs(2), changes.changed())
        .await
        .expect("a first hint once the watch is set");
    let mut a = env.client(&key, "a");
    acquire(&mut a).await;
    timeout(Duration::from_secs(1), changes.changed())
        .await
        .expect("a hint for the create");
    // Drain the hints of the acquire's two writes.
    while timeout(Duration::from_millis(100), changes.changed())
        .await
        .is_ok()
    {}
    let deleted = Instant::now();
    env.raw
        .delete(&env.store.lease_path(&key), None)
        .await
        .unwrap();
    timeout(Duration::from_millis(200), changes.changed())
        .await
        .expect("no hint within 200 ms of the delete");
    assert!(deleted.elapsed() < Duration::from_millis(200));
    // Outside a runtime there are no hints.
    let store = env.store.clone();
    let outside = std::thread::spawn(move || store.changes(&key).is_none())
        .join()
        .unwrap();
    assert!(outside);
}

#[tokio::test]
async fn a_ttl_above_the_servers_max_session_timeout_is_a_clear_error() {
    let Some(env) = Env::new("max-timeout").await else {
        return;
    };
    let key = key();
    // The test server's maxSessionTimeout is 120 s.
    let mut a = client_on(
        &env.store,
        &key,
        "a",
        Timing::from_ttl(Duration::from_secs(150)),
    );
    let err = a.try_acquire().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    let text = err.to_string();
    assert!(text.contains("maxSessionTimeout"), "{text}");
    assert!(text.contains("150000 ms"), "{text}");
    assert!(env.node(&key).await.is_none(), "no node may be left");
    assert_eq!(env.store.live_terms(), 0, "no session may stay open");
    // And the timing the store cannot express at all is refused before any request.
    let short = LeaseClient::new(
        Arc::new(env.store.clone()),
        key.clone(),
        HolderId::new("b").unwrap(),
        Timing::from_ttl(Duration::from_millis(900)),
    )
    .unwrap_err();
    assert!(short.to_string().contains("ZooKeeper"), "{short}");
}

/// A record written by hand with a token above any czxid: the next acquire would go down
/// in tokens, so it is refused with a permanent error and leaves nothing behind.
#[tokio::test]
async fn a_token_the_czxid_cannot_reach_is_refused() {
    let Some(env) = Env::new("high-token").await else {
        return;
    };
    let key = key();
    let mut high = record("by-hand", 1 << 50);
    high.state = LeaseState::Released;
    let path = env.store.lease_path(&key);
    env.raw
        .create(
            &path,
            &high.to_json(),
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    let mut a = env.client(&key, "a");
    let err = a.try_acquire().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(err.to_string().contains("went back"), "{err}");
    assert!(!err.is_retryable());
    assert!(
        env.node(&key).await.is_none(),
        "the new node must be deleted"
    );
    assert_eq!(env.store.live_terms(), 0);
}

#[tokio::test]
async fn fenced_writes_check_the_lease_node() {
    let Some(env) = Env::new("fenced").await else {
        return;
    };
    let key = key();
    let object = ObjectName::new(format!("{key}-object")).unwrap();
    let mut a = env.client(&key, "a");
    let ga = acquire(&mut a).await;
    let fence_a = Fence::new(key.clone(), a.holder().clone(), ga.token);
    let first = env
        .store
        .fenced_write(&fence_a, &object, b"one")
        .await
        .unwrap();
    assert_eq!(first.fence, ga.token);
    let (data, _) = env
        .raw
        .get_data(&env.store.object_path(&object))
        .await
        .unwrap();
    assert!(data.ends_with(b"\none"));

    // A token that is not the lease node's czxid (a made-up or an older term's) is fenced,
    // although the object (absent here) has no higher fence.
    let stale = Fence {
        token: FencingToken(ga.token.0 - 1),
        ..fence_a.clone()
    };
    let fresh = ObjectName::new("fresh-object").unwrap();
    let err = env
        .store
        .fenced_write(&stale, &fresh, b"stale")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Fenced { .. }), "{err}");

    // The lease node deleted by an operator: the term's own token is fenced now, for an
    // existing object and for a new one.
    env.raw
        .delete(&env.store.lease_path(&key), None)
        .await
        .unwrap();
    for target in [object.clone(), fresh.clone()] {
        let err = env
            .store
            .fenced_write(&fence_a, &target, b"late")
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Fenced { .. }), "{target}: {err}");
    }
    let now = env.store.fenced_read(&object).await.unwrap().unwrap();
    assert_eq!(now.value, b"one");
    assert!(env.store.fenced_read(&fresh).await.unwrap().is_none());

    // The primitive: the lease check is part of the same multi.
    let mut b = env.client(&key, "b");
    let gb = acquire(&mut b).await;
    let fence_b = Fence::new(key.clone(), b.holder().clone(), gb.token);
    let expected = Expected::Revision(now.revision.clone());
    let put = FencedPut::new(&fence_a, &object, &expected, b"x");
    assert!(matches!(
        env.store.put_fenced_if(put).await,
        Err(Error::Fenced { .. })
    ));
    let put = FencedPut::new(&fence_b, &object, &expected, b"from b");
    assert!(matches!(
        env.store.put_fenced_if(put).await.unwrap(),
        leader_core::backend::ObjectWrite::Written(_)
    ));
    let read = env.store.get_fenced(&object).await.unwrap().unwrap();
    assert_eq!((read.fence, read.value), (gb.token, b"from b".to_vec()));
}

/// A put without the lease check reads no lease node and its multi is the object's write
/// alone: where the same fence's checked put is refused (no lease node), it writes, the same
/// data a checked put stores, and each kind of put goes on from the revision the other left.
#[tokio::test]
async fn an_unchecked_put_writes_where_the_checked_put_is_fenced() {
    let Some(env) = Env::new("unchecked").await else {
        return;
    };
    let object = ObjectName::new("cas-record").unwrap();
    let node = env.store.object_path(&object);
    let idle = Fence::new(key(), HolderId::new("a").unwrap(), FencingToken(7));
    let absent = Expected::Absent;
    let err = env
        .store
        .put_fenced_if(FencedPut::new(&idle, &object, &absent, b"one"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Fenced { .. }), "{err}");
    assert!(env.raw.check_stat(&node).await.unwrap().is_none());

    let put = FencedPut::new(&idle, &object, &absent, b"one").without_lease_check();
    let ObjectWrite::Written(r1) = env.store.put_fenced_if(put).await.unwrap() else {
        panic!("an unchecked put of an absent object must be written");
    };
    let (data, _) = env.raw.get_data(&node).await.unwrap();
    assert_eq!(data, encode_fenced(FencingToken(7), b"one"));
    let read = env.store.get_fenced(&object).await.unwrap().unwrap();
    assert_eq!(
        (read.fence, read.value, &read.revision),
        (FencingToken(7), b"one".to_vec(), &r1)
    );

    // A live term's checked put on the unchecked put's revision, then an unchecked put on the
    // checked put's revision.
    let key = key();
    let mut a = env.client(&key, "a");
    let fence = Fence::new(key.clone(), a.holder().clone(), acquire(&mut a).await.token);
    let at_r1 = Expected::Revision(r1);
    let put = FencedPut::new(&fence, &object, &at_r1, b"two");
    let ObjectWrite::Written(r2) = env.store.put_fenced_if(put).await.unwrap() else {
        panic!("a checked put on the unchecked put's revision must be written");
    };
    let (data, _) = env.raw.get_data(&node).await.unwrap();
    assert_eq!(data, encode_fenced(fence.token, b"two"));
    let at_r2 = Expected::Revision(r2);
    let put = FencedPut::new(&fence, &object, &at_r2, b"three").without_lease_check();
    let ObjectWrite::Written(r3) = env.store.put_fenced_if(put).await.unwrap() else {
        panic!("an unchecked put on the checked put's revision must be written");
    };
    let read = env.store.get_fenced(&object).await.unwrap().unwrap();
    assert_eq!(
        (read.fence, read.value, read.revision),
        (fence.token, b"three".to_vec(), r3)
    );
    assert!(a.release().await.unwrap());
}

/// A shard term's fence: the lease checked is the membership term (`lease_term`), the token
/// written is the shard's. It writes while that term is live, with the shard's token as the
/// object's fence; once the term has ended (released, then a newer term), the same lease term
/// is refused although its token is above the object's fence.
#[tokio::test]
async fn a_fence_with_a_separate_lease_term_needs_that_term_live() {
    let Some(env) = Env::new("shard-fence").await else {
        return;
    };
    let key = key();
    let object = ObjectName::new(format!("{key}-object")).unwrap();
    let mut a = env.client(&key, "a");
    let g = acquire(&mut a).await;
    let member = Fence::new(key.clone(), a.holder().clone(), g.token);
    let shard = |token: u64| Fence {
        token: FencingToken(token),
        lease_term: Some(member.token),
        ..member.clone()
    };
    let s = g.token.get() + 1000;
    let written = env
        .store
        .fenced_write(&shard(s), &object, b"one")
        .await
        .unwrap();
    assert_eq!(written.fence, FencingToken(s));
    let (data, _) = env
        .raw
        .get_data(&env.store.object_path(&object))
        .await
        .unwrap();
    assert!(data.starts_with(format!("leader-fence v1 {s}\n").as_bytes()));

    assert!(a.release().await.unwrap());
    let err = env
        .store
        .fenced_write(&shard(s + 1), &object, b"after release")
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Fenced { presented, highest: None, .. } if presented.get() == s + 1),
        "{err}"
    );

    let mut b = env.client(&key, "b");
    let g2 = acquire(&mut b).await;
    assert!(g2.token > g.token);
    let err = env
        .store
        .fenced_write(&shard(s + 2), &object, b"after a newer term")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Fenced { highest: None, .. }), "{err}");
    let kept = env.store.fenced_read(&object).await.unwrap().unwrap();
    assert_eq!((kept.fence, kept.value), (FencingToken(s), b"one".to_vec()));

    // The newer membership term's fence writes with a shard token above the object's fence.
    let newer = Fence {
        token: FencingToken(s + 3),
        lease_term: Some(g2.token),
        ..Fence::new(key.clone(), b.holder().clone(), g2.token)
    };
    let written = env
        .store
        .fenced_write(&newer, &object, b"two")
        .await
        .unwrap();
    assert_eq!(written.fence, newer.token);
    assert!(b.release().await.unwrap());
}

/// `read_for_term` reports the record held only to the term whose session owns the node:
/// not to another term, not to another store (process), and not after the node was
/// recreated by another term; and a conflicting acquire leaves no session behind.
#[tokio::test]
async fn read_for_term_reports_held_only_for_the_session_that_owns_the_node() {
    let Some(env) = Env::new("for-term").await else {
        return;
    };
    let key = key();
    let acquire_as = |store: &ZooKeeperStore, term: u128| {
        let store = store.clone();
        let key = key.clone();
        async move {
            store
                .write(WriteRequest::new(
                    key,
                    Expected::Absent,
                    record("raw", 1),
                    WriteKind::Acquire,
                    TermId(term),
                ))
                .await
                .unwrap()
        }
    };
    let WriteOutcome::Written(written) = acquire_as(&env.store, 1).await else {
        panic!("the first acquire must win");
    };
    let ours = env
        .store
        .read_for_term(&key, TermId(1))
        .await
        .unwrap()
        .unwrap();
    assert!(ours.record.is_held());
    assert_eq!(ours, written);
    let plain = env.store.read(&key).await.unwrap().unwrap();
    assert_eq!(plain, written);
    for (store, term) in [
        (&env.store, 2),
        (&support::store(&env.endpoint, &env.path).await, 1),
    ] {
        let theirs = store
            .read_for_term(&key, TermId(term))
            .await
            .unwrap()
            .unwrap();
        assert!(!theirs.record.is_held(), "term {term}: {theirs:?}");
        assert_ne!(theirs.revision, written.revision);
    }
    // Conflicting acquires (same store, other terms) leave no session open.
    for term in [3, 4] {
        assert!(matches!(
            acquire_as(&env.store, term).await,
            WriteOutcome::Conflict { current: Some(_) }
        ));
    }
    assert_eq!(env.store.live_terms(), 1);
    // Deleted by an operator and recreated by another term: no longer term 1's.
    env.raw
        .delete(&env.store.lease_path(&key), None)
        .await
        .unwrap();
    let other = support::store(&env.endpoint, &env.path).await;
    assert!(matches!(
        acquire_as(&other, 5).await,
        WriteOutcome::Written(_)
    ));
    let now = env
        .store
        .read_for_term(&key, TermId(1))
        .await
        .unwrap()
        .unwrap();
    assert!(!now.record.is_held(), "{now:?}");
    assert!(
        other
            .read_for_term(&key, TermId(5))
            .await
            .unwrap()
            .unwrap()
            .record
            .is_held()
    );
}

/// A broken connection (a network failure, a server restart) is repaired within the
/// session: the term goes on (same session, same node), and reads work again.
#[tokio::test]
async fn a_lost_connection_is_repaired_within_the_session() {
    let Some(endpoint) = support::endpoint().await else {
        return;
    };
    let proxy = support::Proxy::start(&endpoint).await;
    let path = support::unique_path("reconnect");
    let store = support::store(&proxy.addr.to_string(), &path).await;
    let raw = support::raw(&endpoint).await;
    let key = key();
    let mut a = client_on(&store, &key, "a", support::timing());
    let g = acquire(&mut a).await;
    let node = store.lease_path(&key);
    let owner = raw
        .check_stat(&node)
        .await
        .unwrap()
        .unwrap()
        .ephemeral_owner;
    let shared = store.shared_session_id();
    let connections = proxy.accepted();
    proxy.cut();
    sleep(Duration::from_millis(300)).await;
    let renewed = match a.renew().await.unwrap() {
        Renewal::Renewed(renewed) => renewed,
        other => panic!("the renew after a reconnect must succeed, got {other:?}"),
    };
    assert_eq!(renewed.token, g.token);
    let stat = raw.check_stat(&node).await.unwrap().unwrap();
    assert_eq!(
        stat.ephemeral_owner, owner,
        "the term's session must survive"
    );
    let read = store.read(&key).await.unwrap().unwrap();
    assert!(read.record.is_held());
    assert_eq!(
        store.shared_session_id(),
        shared,
        "the shared session must survive"
    );
    assert!(
        proxy.accepted() >= connections + 2,
        "both sessions must have reconnected through new connections"
    );
    assert!(a.release().await.unwrap());
}

/// A store on a fresh parent node behind a TCP fault proxy (a server that can go away), its
/// watch on `key` once set, and an operator's direct client.
async fn behind_a_proxy(
    name: &str,
    key: &LeaseKey,
) -> Option<(
    integration_tests::tcp_proxy::TcpFaultProxy,
    ZooKeeperStore,
    leader_core::backend::Changes,
    Client,
)> {
    let endpoint = support::endpoint().await?;
    let proxy = integration_tests::tcp_proxy::TcpFaultProxy::start(endpoint.as_str())
        .await
        .unwrap();
    let store = support::store(&proxy.endpoint(), &support::unique_path(name)).await;
    let raw = support::raw(&endpoint).await;
    let mut changes = store.changes(key).expect("inside a runtime");
    timeout(Duration::from_secs(2), changes.changed())
        .await
        .expect("a first hint once the watch is set");
    assert!(store.read(key).await.unwrap().is_none());
    Some((proxy, store, changes, raw))
}

/// The server goes away for `outage` (open connections reset, new ones closed at once), with
/// no call meanwhile; then the first read, given 1 s, must succeed.
async fn outage_then_read(
    proxy: &integration_tests::tcp_proxy::TcpFaultProxy,
    store: &ZooKeeperStore,
    key: &LeaseKey,
    outage: Duration,
) {
    proxy.refuse_new(true);
    proxy.reset_all();
    sleep(outage).await;
    proxy.refuse_new(false);
    let read = timeout(Duration::from_secs(1), store.read(key)).await;
    assert!(
        matches!(read, Ok(Ok(None))),
        "the first read after a {outage:?} outage must succeed within 1 s: {read:?}"
    );
}

/// A change made by someone else is hinted at within 1 s (the hints before it drained).
async fn create_is_hinted(
    store: &ZooKeeperStore,
    key: &LeaseKey,
    changes: &mut leader_core::backend::Changes,
    raw: &Client,
) {
    while timeout(Duration::from_millis(300), changes.changed())
        .await
        .is_ok()
    {}
    let node = store.lease_path(key);
    raw.create(
        &node,
        b"not a lease record",
        &CreateMode::Persistent.with_acls(Acls::anyone_all()),
    )
    .await
    .unwrap();
    timeout(Duration::from_secs(1), changes.changed())
        .await
        .expect("no hint within 1 s of a create after the outage");
    raw.delete(&node, None).await.unwrap();
}

/// After an outage of several seconds, the first call once the server is back succeeds, and
/// the watch works again: the shared session, without a connection for over a second, is
/// replaced rather than left to the ZooKeeper client's reconnect, which waits twice as long
/// after each failed attempt (100 ms, 200 ms, ... 6.4 s): 7.5 s into an outage its next
/// attempt would come about 12.7 s into it.
#[tokio::test]
async fn after_an_outage_the_first_call_answers_as_soon_as_the_server_is_back() {
    let key = key();
    let Some((proxy, store, mut changes, raw)) = behind_a_proxy("outage", &key).await else {
        return;
    };
    let before = store.shared_session_id();
    outage_then_read(&proxy, &store, &key, Duration::from_millis(7500)).await;
    assert_ne!(
        store.shared_session_id(),
        before,
        "a new shared session answered"
    );
    create_is_hinted(&store, &key, &mut changes, &raw).await;
}

/// An outage longer than the shared session's life (the client gives it up 14 s after its
/// last answer): the watch task, retrying at growing pauses while no session can be opened,
/// sets its watch as soon as a call has opened a new one, not at the end of its pause.
#[tokio::test]
async fn after_an_outage_longer_than_the_session_the_watch_resumes_at_once() {
    let key = key();
    let Some((proxy, store, mut changes, raw)) = behind_a_proxy("long-outage", &key).await else {
        return;
    };
    // 14 s, then the watch task's pauses of 0.1, 0.2, 0.4, 0.8, 1.6 and 3.2 s: at 21 s it is
    // in its 3.2 s or 5 s pause.
    outage_then_read(&proxy, &store, &key, Duration::from_secs(21)).await;
    create_is_hinted(&store, &key, &mut changes, &raw).await;
}
