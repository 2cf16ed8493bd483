//! What is particular to etcd, against a real server: etcd ends a lease by itself, the watch
//! wakes followers, fenced writes check the lease key, the token is the create revision.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod support;

use std::sync::Arc;
use std::time::Duration;

use leader_core::backend::{Expected, Fence, FencedCas, FencedPut, ObjectWrite, encode_fenced};
use leader_core::{
    Acquisition, Error, FencedStore, FencingToken, HolderId, LeaseBackend, LeaseClient, ObjectName,
    Renewal,
};
use support::Prefix;
use tokio::time::{Instant, timeout};

fn client(store: &leader_etcd::EtcdStore, key: &leader_core::LeaseKey, who: &str) -> LeaseClient {
    let backend: Arc<dyn LeaseBackend> = Arc::new(store.clone());
    LeaseClient::new(
        backend,
        key.clone(),
        HolderId::new(who).unwrap(),
        support::timing(),
    )
    .unwrap()
}

/// The fence of `c`'s term `g`.
fn fence_of(c: &LeaseClient, g: &leader_core::Grant) -> Fence {
    Fence::new(c.key().clone(), c.holder().clone(), g.token)
}

async fn acquired(c: &mut LeaseClient) -> leader_core::Grant {
    match c.try_acquire().await.unwrap() {
        Acquisition::Acquired(g) => g,
        other => panic!("{} should have acquired: {other:?}", c.holder()),
    }
}

/// A holder that stops renewing (a crash) loses its key when etcd's lease runs out, with no
/// follower timing anything: the follower acquires once etcd deleted the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_ends_a_lease_that_is_not_renewed() {
    let p = Prefix::new();
    let store = p.store().await;
    let key = p.unique_key();
    let raw = support::raw().await;
    let mut a = client(&store, &key, "a");
    let mut b = client(&store, &key, "b");
    let g1 = acquired(&mut a).await;
    let written = raw
        .get(&store.lease_key(&key))
        .await
        .unwrap()
        .expect("key written");
    assert_eq!(
        g1.token.0,
        u64::try_from(written.create_revision).unwrap(),
        "the token is the create revision"
    );
    assert_ne!(written.lease, 0, "the key is attached to an etcd lease");
    drop(a); // no renew, no release
    let started = Instant::now();
    let g2 = loop {
        match b.try_acquire().await.unwrap() {
            Acquisition::Acquired(g) => break g,
            Acquisition::Following { takeover_at, .. } => {
                assert_eq!(takeover_at, None, "followers of etcd leases time nothing");
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the lease never ended"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The lease is whole seconds (2 s here); etcd expires it on its own clock.
    assert!(
        started.elapsed() >= Duration::from_millis(1000),
        "{:?}",
        started.elapsed()
    );
    assert!(g2.token > g1.token);
}

/// The watch wakes a follower when the key is released or deleted, without waiting for a poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_fires_on_release_and_on_delete() {
    let p = Prefix::new();
    let store = p.store().await;
    let key = p.unique_key();
    let mut changes = store.changes(&key).expect("etcd offers change hints");
    // The first hint says the watch is established.
    timeout(Duration::from_secs(5), changes.changed())
        .await
        .expect("watch established");
    let mut a = client(&store, &key, "a");
    acquired(&mut a).await;
    timeout(Duration::from_secs(2), changes.changed())
        .await
        .expect("hint on acquire");
    assert!(a.release().await.unwrap());
    timeout(Duration::from_secs(2), changes.changed())
        .await
        .expect("hint on release");
    support::raw()
        .await
        .delete(&store.lease_key(&key))
        .await
        .unwrap();
    timeout(Duration::from_secs(2), changes.changed())
        .await
        .expect("hint on delete");
}

/// A renew after an operator deleted the key and another candidate created it again is lost:
/// the rewrite is compared on the revision this term wrote, which no other write can have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renew_after_the_key_was_recreated_is_lost() {
    let p = Prefix::new();
    let store = p.store().await;
    let key = p.unique_key();
    let mut a = client(&store, &key, "a");
    let mut b = client(&store, &key, "b");
    let g1 = acquired(&mut a).await;
    support::raw()
        .await
        .delete(&store.lease_key(&key))
        .await
        .unwrap();
    let g2 = acquired(&mut b).await;
    assert!(g2.token > g1.token);
    assert!(matches!(a.renew().await.unwrap(), Renewal::Lost { .. }));
    // b's record is untouched.
    let now = store.read(&key).await.unwrap().unwrap();
    assert_eq!(
        (now.record.holder.as_str(), now.record.token),
        ("b", g2.token)
    );
    assert!(now.record.is_held());
}

/// A fenced write is refused once the writer's lease key is gone, even before a newer term
/// wrote the object; it goes through while the term is live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_need_the_live_lease_key() {
    let p = Prefix::new();
    let store = p.store().await;
    let key = p.unique_key();
    let object = ObjectName::new("report").unwrap();
    let mut a = client(&store, &key, "a");
    let g = acquired(&mut a).await;
    let fence = fence_of(&a, &g);
    store.fenced_write(&fence, &object, b"one").await.unwrap();
    support::raw()
        .await
        .delete(&store.lease_key(&key))
        .await
        .unwrap();
    let err = store
        .fenced_write(&fence, &object, b"two")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Fenced { .. }), "{err}");
    let kept = store.fenced_read(&object).await.unwrap().unwrap();
    assert_eq!(kept.value, b"one");
}

/// A put without the lease check compares the object alone: where the same fence's checked
/// put is refused (no lease key is held for it), it writes, the same bytes a checked put
/// stores, and each kind of put goes on from the revision the other left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchecked_put_writes_where_the_checked_put_is_fenced() {
    let p = Prefix::new();
    let store = p.store().await;
    let raw = support::raw().await;
    let object = ObjectName::new("cas-record").unwrap();
    let stored = || async { raw.get(&store.object_key(&object)).await.unwrap() };
    let idle = Fence::new(p.unique_key(), HolderId::new("a").unwrap(), FencingToken(7));
    let absent = Expected::Absent;
    let err = store
        .put_fenced_if(FencedPut::new(&idle, &object, &absent, b"one"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Fenced { .. }), "{err}");
    assert!(stored().await.is_none());

    let put = FencedPut::new(&idle, &object, &absent, b"one").without_lease_check();
    let ObjectWrite::Written(r1) = store.put_fenced_if(put).await.unwrap() else {
        panic!("an unchecked put of an absent object must be written");
    };
    let raw_value = stored().await.unwrap().value;
    assert_eq!(raw_value, encode_fenced(FencingToken(7), b"one"));
    let read = store.get_fenced(&object).await.unwrap().unwrap();
    assert_eq!(
        (read.fence, read.value, &read.revision),
        (FencingToken(7), b"one".to_vec(), &r1)
    );

    // A live term's checked put on the unchecked put's revision, then an unchecked put on the
    // checked put's revision.
    let key = p.unique_key();
    let mut a = client(&store, &key, "a");
    let g = acquired(&mut a).await;
    let fence = fence_of(&a, &g);
    let at_r1 = Expected::Revision(r1);
    let put = FencedPut::new(&fence, &object, &at_r1, b"two");
    let ObjectWrite::Written(r2) = store.put_fenced_if(put).await.unwrap() else {
        panic!("a checked put on the unchecked put's revision must be written");
    };
    let raw_value = stored().await.unwrap().value;
    assert_eq!(raw_value, encode_fenced(g.token, b"two"));
    let at_r2 = Expected::Revision(r2);
    let put = FencedPut::new(&fence, &object, &at_r2, b"three").without_lease_check();
    let ObjectWrite::Written(r3) = store.put_fenced_if(put).await.unwrap() else {
        panic!("an unchecked put on the checked put's revision must be written");
    };
    let read = store.get_fenced(&object).await.unwrap().unwrap();
    assert_eq!(
        (read.fence, read.value, read.revision),
        (g.token, b"three".to_vec(), r3)
    );
}

/// After a lost answer the core re-reads as the term: only the term's own etcd lease counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_for_term_knows_its_own_lease() {
    let p = Prefix::new();
    let store = p.store().await;
    let key = p.unique_key();
    let backend: Arc<dyn LeaseBackend> = Arc::new(store.clone());
    let mut a = client(&store, &key, "a");
    acquired(&mut a).await;
    let plain = backend.read(&key).await.unwrap().unwrap();
    assert!(plain.record.is_held());
    let other = backend
        .read_for_term(&key, leader_core::backend::TermId(12345))
        .await
        .unwrap()
        .unwrap();
    assert!(!other.record.is_held(), "another term's lease is not ours");
    assert_ne!(other.revision, plain.revision);
}

/// A released term's token no longer writes: the released record keeps its create revision
/// (its token), but is detached from any lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_term_cannot_write_fenced() {
    let p = Prefix::new();
    let store = p.store().await;
    let key = p.unique_key();
    let object = ObjectName::new("report").unwrap();
    let mut a = client(&store, &key, "a");
    let g = acquired(&mut a).await;
    let fence = fence_of(&a, &g);
    store.fenced_write(&fence, &object, b"one").await.unwrap();
    assert!(a.release().await.unwrap());
    let released = store.read(&key).await.unwrap().unwrap();
    assert_eq!(
        released.record.token, g.token,
        "the released record keeps its token"
    );
    let err = store
        .fenced_write(&fence, &object, b"two")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Fenced { .. }), "{err}");
}

/// A shard term's fence: the lease checked is the membership term (`lease_term`), the token
/// written is the shard's. It writes while that term is live, with the shard's token as the
/// object's fence; once the term has ended (released, then a newer term), the same lease term
/// is refused although its token is above the object's fence, and a refusal by the lease never
/// reports the membership's token as the object's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_with_a_separate_lease_term_needs_that_term_live() {
    let p = Prefix::new();
    let store = p.store().await;
    let key = p.unique_key();
    let object = ObjectName::new("shard-report").unwrap();
    let mut a = client(&store, &key, "a");
    let g = acquired(&mut a).await;
    let member = fence_of(&a, &g);
    let shard = |token: u64| Fence {
        token: FencingToken(token),
        lease_term: Some(member.token),
        ..member.clone()
    };
    let s = g.token.get() + 1000;
    let written = store
        .fenced_write(&shard(s), &object, b"one")
        .await
        .unwrap();
    assert_eq!(written.fence, FencingToken(s));

    assert!(a.release().await.unwrap());
    let err = store
        .fenced_write(&shard(s + 1), &object, b"after release")
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Fenced { presented, highest: None, .. } if presented.get() == s + 1),
        "{err}"
    );

    let mut b = client(&store, &key, "b");
    let g2 = acquired(&mut b).await;
    assert!(g2.token > g.token);
    let err = store
        .fenced_write(&shard(s + 2), &object, b"after a newer term")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Fenced { highest: None, .. }), "{err}");
    // A shard token below the newer membership token, on an object it may write: refused by
    // the lease, and the membership token is not reported as the object's fence.
    let err = store
        .fenced_write(&shard(1), &ObjectName::new("shard-fresh").unwrap(), b"x")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Fenced { highest: None, .. }), "{err}");
    let kept = store.fenced_read(&object).await.unwrap().unwrap();
    assert_eq!((kept.fence, kept.value), (FencingToken(s), b"one".to_vec()));

    // The newer membership term's fence writes with a shard token above the object's fence.
    let newer = Fence {
        token: FencingToken(s + 3),
        lease_term: Some(g2.token),
        ..fence_of(&b, &g2)
    };
    let written = store.fenced_write(&newer, &object, b"two").await.unwrap();
    assert_eq!(written.fence, newer.token);
}
