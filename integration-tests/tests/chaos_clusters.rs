//! Chaos drills on three-member clusters: an etcd cluster and a ZooKeeper ensemble of each
//! round's own (`scripts/emulators cluster`), every member behind fault proxies.
//!
//! - The drills: candidate `i` talks to member `i` alone, so that a member's fault reaches its
//!   clients unhidden. The faults are the store's own (`Scenario::MEMBERS`): its leader member
//!   killed, paused or partitioned, a minority member under the leader's or a follower's
//!   client, a rolling restart; each with the chaos checker and the bound on the time unled.
//!   `scripts/test` runs the leader's and a follower's member cut from the others on both
//!   services, and a member's pause on ZooKeeper (on etcd 3.4.23 it meets etcd-io/etcd#15247); the kill, the partition and the rolling
//!   restart of a member run in the long soak (`chaos_soak scenarios=...`,
//!   `results/chaos.txt`), and a member's kill also in the client test below.
//! - A leader whose store URL names every member (as the docs ask): one member's fault,
//!   whichever it is, must not end its term. An elector in this process, faults on the
//!   members one after the other, each for longer than the ttl; the term must live through
//!   all of them (it ends only if no renew reaches a majority for `ttl - margin`).
//!
//! One drill per kind at a time, beside the two client tests (an elector in this process is
//! light): at most four clusters at once, which two cores carry with the rest of the suite.
#![allow(clippy::unwrap_used, clippy::panic)]

mod chaos_support;

use std::sync::Arc;
use std::time::Duration;

use integration_tests::chaos::BackendKind;
use integration_tests::chaos::drill::Scenario;
use integration_tests::cluster::{Cluster, ClusterKind, MemberAction};
use integration_tests::{Emulator, require};
use leader::OpenOptions;
use leader_core::Elector;
use tokio::sync::Mutex;

static ETCD: Mutex<()> = Mutex::const_new(());
static ZOOKEEPER: Mutex<()> = Mutex::const_new(());

async fn round(kind: BackendKind, scenario: Scenario) {
    let lock = if kind == BackendKind::Etcd {
        &ETCD
    } else {
        &ZOOKEEPER
    };
    let _one_at_a_time = lock.lock().await;
    chaos_support::drill(kind, scenario).await;
}

macro_rules! rounds {
    ($($(#[$attr:meta])* $name:ident: $kind:ident $scenario:ident;)*) => {$(
        $(#[$attr])*
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            round(BackendKind::$kind, Scenario::$scenario).await;
        }
    )*};
}

rounds! {
    #[ignore = "in the soak (chaos_soak scenarios=member-kill); a member's kill is in the client test"]
    etcd_member_kill: Etcd MemberKill;
    // Red at times on etcd 3.4.23 (the only release Debian bookworm has): the key of a live
    // term went away as the paused leader member resumed, 2.35 s before the holder's deadline
    // (etcd-io/etcd#15247's shape; results/etcd-15247/). A known bug of that release, which
    // leader-etcd warns about; it runs in the soak, and here once a fixed etcd is installed.
    #[ignore = "etcd 3.4.23 revokes a lease early after a paused leader resumes (etcd-io/etcd#15247)"]
    etcd_member_stop: Etcd MemberStop;
    #[ignore = "in the soak (chaos_soak scenarios=member-partition)"]
    etcd_member_partition: Etcd MemberPartition;
    etcd_leader_minority: Etcd LeaderMinority;
    etcd_follower_minority: Etcd FollowerMinority;
    #[ignore = "in the soak (chaos_soak scenarios=rolling-restart)"]
    etcd_rolling_restart: Etcd RollingRestart;
    #[ignore = "in the soak (chaos_soak scenarios=member-kill); a member's kill is in the client test"]
    zookeeper_member_kill: ZooKeeper MemberKill;
    zookeeper_member_stop: ZooKeeper MemberStop;
    #[ignore = "in the soak (chaos_soak scenarios=member-partition)"]
    zookeeper_member_partition: ZooKeeper MemberPartition;
    zookeeper_leader_minority: ZooKeeper LeaderMinority;
    zookeeper_follower_minority: ZooKeeper FollowerMinority;
    #[ignore = "in the soak (chaos_soak scenarios=rolling-restart)"]
    zookeeper_rolling_restart: ZooKeeper RollingRestart;
}

/// The faults, each on one member for `hold`, healed before the next.
async fn term_lives_through(kind: ClusterKind, faults: &[(Target, MemberAction, MemberAction)]) {
    let emulator = match kind {
        ClusterKind::Etcd => Emulator::Etcd,
        ClusterKind::ZooKeeper => Emulator::ZooKeeper,
    };
    if require(emulator).await.is_none() {
        return;
    }
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
    // Twice the drills' cluster timing: after a member's fault a renew must get through within
    // `ttl - margin - renew_every`, and the first write after a leader member's loss was
    // measured at 1.1 to 2.1 s (with the control port's own latency): 2.3 s of room at the
    // drills' ttl of 4 s was too little to be reliable, 5 s at 8 s is not.
    let mut timing = leader_core::Timing::from_ttl(Duration::from_secs(8));
    timing.margin = Duration::from_secs(2);
    timing.renew_every = Duration::from_secs(1);
    timing.retry_every = Duration::from_millis(500);
    timing.request_timeout = Duration::from_millis(500);
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
    // Longer than the ttl: a term that lives through it was renewed through another member.
    let hold = timing.ttl + Duration::from_secs(1);
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
/// session timeout (ZooKeeper): too late at these ttls (docs/etcd-zookeeper.md).
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
