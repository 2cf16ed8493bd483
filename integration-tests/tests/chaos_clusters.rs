//! Chaos drills on three-member clusters: an etcd cluster and a ZooKeeper ensemble of each
//! round's own (`scripts/emulators cluster`), every member behind fault proxies, candidate `i`
//! talking to member `i`. The faults are the store's own (see `Scenario::MEMBERS`): its leader
//! member killed, paused or partitioned, a minority member under the leader's or a follower's
//! client, a rolling restart. Each with the chaos checker and the bound on the time unled.
//!
//! One round at a time per cluster kind (an etcd round and a ZooKeeper round may overlap), so
//! that two cores carry the members, the candidates and the rest of the suite.

mod chaos_support;

use integration_tests::chaos::BackendKind;
use integration_tests::chaos::drill::Scenario;
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
    ($($name:ident: $kind:ident $scenario:ident;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            round(BackendKind::$kind, Scenario::$scenario).await;
        }
    )*};
}

rounds! {
    etcd_member_kill: Etcd MemberKill;
    etcd_member_stop: Etcd MemberStop;
    etcd_member_partition: Etcd MemberPartition;
    etcd_leader_minority: Etcd LeaderMinority;
    etcd_follower_minority: Etcd FollowerMinority;
    etcd_rolling_restart: Etcd RollingRestart;
    zookeeper_member_kill: ZooKeeper MemberKill;
    zookeeper_member_stop: ZooKeeper MemberStop;
    zookeeper_member_partition: ZooKeeper MemberPartition;
    zookeeper_leader_minority: ZooKeeper LeaderMinority;
    zookeeper_follower_minority: ZooKeeper FollowerMinority;
    zookeeper_rolling_restart: ZooKeeper RollingRestart;
}
