//! A leader whose store URL names every member of a three-member cluster (as the docs ask):
//! one member's fault, whichever it is, must not end its term. The chaos drills
//! (`chaos_clusters.rs`) give each candidate one member, so that a fault reaches its clients
//! unhidden; these tests are the other half, what a user who lists every member gets.
//!
//! Each test runs an elector in this process on a cluster of its own
//! (`scripts/emulators cluster`), waits for its term, then puts faults on the members one
//! after the other, each for longer than the ttl, and asserts that the term lived through all
//! of them (it ends only if a renew fails to reach a majority for `ttl - margin`).
#![allow(clippy::unwrap_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use integration_tests::chaos::drill::Scenario;
use integration_tests::cluster::{Cluster, ClusterKind, MemberAction};
use integration_tests::{Emulator, require};
use leader::OpenOptions;
use leader_core::Elector;
use tokio::sync::Mutex;

/// One cluster of each kind at a time in this binary (see `chaos_clusters.rs`).
static ETCD: Mutex<()> = Mutex::const_new(());
static ZOOKEEPER: Mutex<()> = Mutex::const_new(());

/// The faults, each on one member for `hold`, healed before the next.
async fn term_lives_through(kind: ClusterKind, faults: &[(Target, MemberAction, MemberAction)]) {
    let emulator = match kind {
        ClusterKind::Etcd => Emulator::Etcd,
        ClusterKind::ZooKeeper => Emulator::ZooKeeper,
    };
    if require(emulator).await.is_none() {
        return;
    }
    let lock = if kind == ClusterKind::Etcd {
        &ETCD
    } else {
        &ZOOKEEPER
    };
    let _one_at_a_time = lock.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(kind, &dir.path().join("cluster"))
        .await
        .unwrap();
    let hosts: Vec<&str> = cluster
        .endpoints()
        .iter()
        .map(|e| e.trim_start_matches("http://"))
        .collect();
    let url = match kind {
        ClusterKind::Etcd => format!("etcd://{}/clients/key", hosts.join(",")),
        ClusterKind::ZooKeeper => format!("zk://{}/clients/key", hosts.join(",")),
    };
    let (store, key) = leader::from_url(&url, &OpenOptions::new().with_create_if_missing(true))
        .await
        .unwrap();
    // The drills' cluster timing: ttl 4 s, margin 1 s, renews every 700 ms.
    let timing = Scenario::MemberKill.timing(integration_tests::chaos::BackendKind::Etcd);
    let elector = Elector::builder(store, key)
        .timing(timing)
        .holder_id(leader_core::HolderId::new("all-members").unwrap())
        .build()
        .unwrap();
    let handle = Arc::new(elector.spawn());
    let term = tokio::time::timeout(Duration::from_secs(20), handle.wait_for_term())
        .await
        .unwrap()
        .unwrap();
    let token = term.token();
    let hold = timing.ttl * 2;
    for (target, fault, end) in faults {
        let member = match target {
            Target::StoreLeader => cluster.healthy(Duration::from_secs(30)).await.unwrap(),
            Target::Follower => {
                let leader = cluster.healthy(Duration::from_secs(30)).await.unwrap();
                (leader + 1) % 3
            }
        };
        cluster.member(member, *fault).await.unwrap();
        let lived = term.run_until_over(tokio::time::sleep(hold)).await;
        cluster.member(member, *end).await.unwrap();
        assert!(
            lived.is_some(),
            "{kind:?}: term {token} ended during {fault:?} of member {member} ({target:?}), \
             logs in {}",
            dir.keep().display()
        );
        cluster.healthy(Duration::from_secs(30)).await.unwrap();
        // Renews catch up before the next fault.
        tokio::time::sleep(timing.renew_every * 3).await;
        assert!(
            term.is_valid(),
            "{kind:?}: term {token} ended after {fault:?}"
        );
    }
    drop(term);
    Arc::try_unwrap(handle).unwrap().shutdown().await;
}

#[derive(Clone, Copy, Debug)]
enum Target {
    StoreLeader,
    Follower,
}

/// A follower member and the leader member cut from the others (their clients still reach
/// them: they answer "no leader", or close the connection, at once), and the leader member
/// killed. Not here: a member that goes silent (blackholed) under the leader's client. The
/// client notices only after its connection's keep-alive (etcd: 5 s + 5 s) or 2/3 of the
/// session timeout (ZooKeeper), too late at this ttl of 4 s (docs/etcd-zookeeper.md).
const FAULTS: [(Target, MemberAction, MemberAction); 3] = [
    (
        Target::Follower,
        MemberAction::IsolatePeers,
        MemberAction::Heal,
    ),
    (
        Target::StoreLeader,
        MemberAction::IsolatePeers,
        MemberAction::Heal,
    ),
    (Target::StoreLeader, MemberAction::Kill, MemberAction::Start),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_term_lives_through_any_one_members_fault() {
    term_lives_through(ClusterKind::Etcd, &FAULTS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zookeeper_term_lives_through_any_one_members_fault() {
    term_lives_through(ClusterKind::ZooKeeper, &FAULTS).await;
}
