//! Members stop and restart: the group elects again, a restarted member rejoins with its log,
//! and a group without a quorum fails fast with a retryable error.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod support;

use std::time::Duration;

use leader_core::backend::{
    Expected, LeaseRecord, Stored, TermId, WriteKind, WriteNonce, WriteOutcome, WriteRequest,
};
use leader_core::{ErrorKind, FencingToken, HolderId, LeaseBackend, LeaseKey};
use leader_raft::RaftStore;
use support::Group;
use tokio::time::{Instant, sleep};

fn record(token: u64) -> LeaseRecord {
    LeaseRecord::held(
        HolderId::new("tester").unwrap(),
        FencingToken(token),
        Duration::from_secs(5),
        Default::default(),
        WriteNonce(token),
    )
}

async fn acquire(store: &RaftStore, key: &LeaseKey, token: u64) -> Stored {
    let request = WriteRequest::new(
        key.clone(),
        Expected::Absent,
        record(token),
        WriteKind::Acquire,
        TermId(u128::from(token)),
    );
    match store.write(request).await.unwrap() {
        WriteOutcome::Written(stored) => stored,
        other => panic!("expected a write, got {other:?}"),
    }
}

/// Retries `read` for a few seconds (a group may still be electing).
async fn read_eventually(store: &RaftStore, key: &LeaseKey) -> Option<Stored> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match store.read(key).await {
            Ok(found) => return found,
            Err(e) if Instant::now() < deadline => {
                assert!(e.is_retryable(), "{e}");
                sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("no answer within 10 s: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_leader_is_replaced_and_a_restarted_member_rejoins_with_its_log() {
    let mut group = Group::start(3).await;
    let leader = group.leader(Duration::from_secs(10)).await;
    let follower = (leader + 1) % 3;
    let before = LeaseKey::new("before").unwrap();
    let first = acquire(group.member(follower), &before, 1).await;

    group.stop(leader).await;
    let new_leader = group.leader(Duration::from_secs(10)).await;
    assert_ne!(new_leader, leader);
    let other = (0..3).find(|i| *i != leader && *i != new_leader).unwrap();
    assert_eq!(
        read_eventually(group.member(other), &before).await,
        Some(first.clone())
    );
    let after = LeaseKey::new("after").unwrap();
    let second = acquire(group.member(other), &after, 7).await;

    // The old leader comes back with its folder and catches up.
    group.restart(leader).await;
    let index: u64 = second.revision.as_str().parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while group.member(leader).status().last_applied_index < Some(index) {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            group.member(leader).status()
        );
        sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        read_eventually(group.member(leader), &after).await,
        Some(second.clone())
    );

    // Every member down, every member up again: the records can only come from the folders.
    group.shutdown_all().await;
    group.restart(0).await;
    // Alone, it cannot catch up from anyone: what it shows is its replayed log (its metrics
    // appear once its Raft core has started).
    let deadline = Instant::now() + Duration::from_secs(2);
    while group.member(0).status().last_log_index < Some(index) {
        assert!(Instant::now() < deadline, "{:?}", group.member(0).status());
        sleep(Duration::from_millis(20)).await;
    }
    group.restart(1).await;
    group.restart(2).await;
    assert_eq!(read_eventually(group.member(2), &before).await, Some(first));
    assert_eq!(read_eventually(group.member(1), &after).await, Some(second));
    // Revisions are never reused: a new write gets a fresh one.
    let third = acquire(group.member(0), &LeaseKey::new("third").unwrap(), 1).await;
    assert!(third.revision.as_str().parse::<u64>().unwrap() > index);
    group.shutdown_all().await;
}

/// Writes and reads through `store` fail with a retryable error within the request timeout.
async fn fails_fast(group: &Group, store: &RaftStore, expected: &[ErrorKind]) {
    let limit = group.timing.request_timeout + Duration::from_millis(300);
    let key = LeaseKey::new("no-quorum").unwrap();
    let request = WriteRequest::new(
        key.clone(),
        Expected::Absent,
        record(1),
        WriteKind::Acquire,
        TermId(1),
    );
    let started = Instant::now();
    let err = store.write(request).await.unwrap_err();
    assert!(
        started.elapsed() < limit,
        "the write took {:?}",
        started.elapsed()
    );
    assert!(
        err.is_retryable() && expected.contains(&err.kind()),
        "{err}"
    );
    let started = Instant::now();
    let err = store.read(&key).await.unwrap_err();
    assert!(
        started.elapsed() < limit,
        "the read took {:?}",
        started.elapsed()
    );
    assert!(err.is_retryable(), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_quorum_a_surviving_follower_fails_fast() {
    let mut group = Group::start(3).await;
    let leader = group.leader(Duration::from_secs(10)).await;
    let survivor = (leader + 1) % 3;
    group.stop(leader).await;
    group.stop((leader + 2) % 3).await;
    // No leader can be elected: nothing is ever proposed.
    let store = group.member(survivor).clone();
    fails_fast(&group, &store, &[ErrorKind::Unavailable]).await;
    group.shutdown_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_quorum_a_surviving_leader_fails_fast() {
    let mut group = Group::start(3).await;
    let leader = group.leader(Duration::from_secs(10)).await;
    group.stop((leader + 1) % 3).await;
    group.stop((leader + 2) % 3).await;
    // The leader may still believe it leads: its proposal is never committed (indeterminate),
    // or it has stepped down (unavailable).
    let store = group.member(leader).clone();
    fails_fast(
        &group,
        &store,
        &[ErrorKind::Indeterminate, ErrorKind::Unavailable],
    )
    .await;
    group.shutdown_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_behind_the_purged_log_catches_up_from_a_snapshot() {
    let mut group = Group::start(3).await;
    let leader = group.leader(Duration::from_secs(10)).await;
    let behind = (leader + 1) % 3;
    // Snapshots every 5 entries from now on (members restart with it).
    group.snapshot_every = 5;
    for i in 0..3 {
        group.stop(i).await;
    }
    for i in 0..3 {
        group.restart(i).await;
    }
    group.leader(Duration::from_secs(10)).await;
    group.stop(behind).await;
    let writer = group.member((behind + 1) % 3).clone();
    let mut last = None;
    for n in 0..30 {
        last = Some(acquire(&writer, &LeaseKey::new(format!("k{n}")).unwrap(), 1).await);
    }
    let last = last.unwrap();
    let index: u64 = last.revision.as_str().parse().unwrap();
    // The others have purged the entries the stopped member misses.
    let purged = group.dir((behind + 1) % 3).join("snapshot");
    assert!(purged.exists(), "no snapshot was taken");
    group.restart(behind).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while group.member(behind).status().last_applied_index < Some(index) {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            group.member(behind).status()
        );
        sleep(Duration::from_millis(20)).await;
    }
    assert!(
        group.dir(behind).join("snapshot").exists(),
        "it did not install a snapshot"
    );
    // Alone with one other, it serves the records it got from the snapshot.
    group.stop((behind + 1) % 3).await;
    let key = LeaseKey::new("k0").unwrap();
    assert!(read_eventually(group.member(behind), &key).await.is_some());
    group.shutdown_all().await;
}

/// Whether any of `among` becomes the Raft leader within `within`.
async fn some_leader(group: &Group, among: &[usize], within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if among
            .iter()
            .any(|i| group.member(*i).status().role == "Leader")
        {
            return true;
        }
        sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_an_emptied_folder_joins_only_when_told_and_after_catching_up() {
    let mut group = Group::start(3).await;
    let leader = group.leader(Duration::from_secs(10)).await;
    let wiped = (leader + 1) % 3;
    let key = LeaseKey::new("kept").unwrap();
    let written = acquire(group.member(leader), &key, 3).await;
    group.stop(wiped).await;
    std::fs::remove_dir_all(group.dir(wiped)).unwrap();

    let err = group.try_start_member(wiped).await.unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, leader_raft::RaftError::EmptyFolder { term, .. } if term >= 1),
        "{text}"
    );
    assert!(text.contains("--raft-rejoin"), "{text}");

    let store = RaftStore::start(group.config(wiped).with_rejoin(true))
        .await
        .unwrap();
    group.members[wiped] = Some(store);
    let deadline = Instant::now() + Duration::from_secs(10);
    while group.member(wiped).status().catching_up {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            group.member(wiped).status()
        );
        sleep(Duration::from_millis(20)).await;
    }
    assert!(!group.dir(wiped).join("rejoining").exists());
    assert_eq!(
        read_eventually(group.member(wiped), &key).await,
        Some(written)
    );
    // It votes again: without the old leader, the two others elect one of them.
    group.stop(leader).await;
    let others: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    group.leader_among(&others, Duration::from_secs(10)).await;
    group.shutdown_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_still_catching_up_gives_no_vote() {
    let mut group = Group::start(3).await;
    let leader = group.leader(Duration::from_secs(10)).await;
    let behind = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    let key = LeaseKey::new("kept").unwrap();
    let written = acquire(group.member(leader), &key, 3).await;
    // `behind` restarts as if a rejoin had been cut short (its marker is still there), while
    // the leader is down: `other` cannot win an election without its vote.
    group.stop(behind).await;
    group.stop(leader).await;
    std::fs::write(group.dir(behind).join("rejoining"), b"").unwrap();
    group.restart(behind).await;
    assert!(group.member(behind).status().catching_up);
    assert!(
        !some_leader(&group, &[behind, other], Duration::from_secs(3)).await,
        "{:?} {:?}",
        group.member(behind).status(),
        group.member(other).status()
    );
    // The leader's return lets the group elect; `behind` catches up and votes again.
    group.restart(leader).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while group.member(behind).status().catching_up {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            group.member(behind).status()
        );
        sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        read_eventually(group.member(behind), &key).await,
        Some(written)
    );
    let now = group.leader(Duration::from_secs(10)).await;
    group.stop(now).await;
    let rest: Vec<usize> = (0..3).filter(|i| *i != now).collect();
    group.leader_among(&rest, Duration::from_secs(10)).await;
    group.shutdown_all().await;
}

/// Requests among the members per second (figures for `results/raft.md`, opt-in): the group
/// idle for 10 s, then 30 s of the load one held lease puts on it at the default ttl of 15 s:
/// a waiting instance's linearizable read every 0.5 s and the holder's renew every 7.5 s, each
/// through a member that is not the Raft leader (so forwarded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "figures for results/raft.md: cargo test -p leader-raft --test failover -- --ignored"]
async fn figures_requests_per_second() {
    let mut group = Group::start(3).await;
    let leader = group.leader(Duration::from_secs(10)).await;
    let sent = |g: &Group| -> u64 { (0..3).map(|i| g.member(i).status().requests_sent).sum() };
    let before = sent(&group);
    sleep(Duration::from_secs(10)).await;
    let idle = (sent(&group) - before) as f64 / 10.0;

    let (holder, reader) = ((leader + 1) % 3, (leader + 2) % 3);
    let key = LeaseKey::new("figures").unwrap();
    let mut stored = acquire(group.member(holder), &key, 1).await;
    let before = sent(&group);
    let start = Instant::now();
    let mut renewed = start;
    while start.elapsed() < Duration::from_secs(30) {
        sleep(Duration::from_millis(500)).await;
        group.member(reader).read(&key).await.unwrap();
        if renewed.elapsed() >= Duration::from_millis(7500) {
            renewed = Instant::now();
            let request = WriteRequest::new(
                key.clone(),
                Expected::Revision(stored.revision.clone()),
                record(1),
                WriteKind::Renew,
                TermId(1),
            );
            stored = match group.member(holder).write(request).await.unwrap() {
                WriteOutcome::Written(s) => s,
                other => panic!("the renew failed: {other:?}"),
            };
        }
    }
    let loaded = (sent(&group) - before) as f64 / start.elapsed().as_secs_f64();
    eprintln!(
        "MEASURED raft requests among 3 members per second: idle {idle:.1}, one lease held at ttl 15 s {loaded:.1} (each request has one answer)"
    );
    group.shutdown_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_that_lost_part_of_its_state_is_refused() {
    let mut group = Group::start(3).await;
    let leader = group.leader(Duration::from_secs(10)).await;
    acquire(group.member(leader), &LeaseKey::new("kept").unwrap(), 3).await;
    let (f, g) = ((leader + 1) % 3, (leader + 2) % 3);
    group.stop(f).await;
    group.stop(g).await;
    let damaged = |err: leader_raft::RaftError, file: &str| {
        let text = err.to_string();
        assert!(
            matches!(err, leader_raft::RaftError::Damaged { .. })
                && text.contains(file)
                && text.contains("--raft-rejoin"),
            "{text}"
        );
    };
    // The log gone, the vote kept: it would vote for a candidate missing what it acknowledged.
    std::fs::remove_file(group.dir(f).join("log")).unwrap();
    damaged(group.try_start_member(f).await.unwrap_err(), "log");
    // Everything gone but its founders: with the vote file went its incarnation, so it is not
    // the founder it was.
    std::fs::remove_file(group.dir(f).join("vote")).unwrap();
    group.restart(g).await;
    let err = group.try_start_member(f).await.unwrap_err();
    assert!(
        matches!(err, leader_raft::RaftError::EmptyFolder { .. }),
        "{err}"
    );
    // The vote gone, the log kept: it could vote twice in a term.
    group.stop(g).await;
    std::fs::remove_file(group.dir(g).join("vote")).unwrap();
    damaged(group.try_start_member(g).await.unwrap_err(), "vote");
    group.shutdown_all().await;
}

/// A founding member stopped while it waits for the others, and started again after one of
/// them formed the group counting it in, joins as the founder it is (its incarnation is kept in
/// its vote file) instead of being taken for an emptied folder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_founder_restarted_during_the_first_start_still_joins() {
    let addresses = support::free_addresses(3);
    let mut group = Group {
        tls: vec![None; 3],
        addresses,
        root: tempfile::tempdir().unwrap(),
        members: (0..3).map(|_| None).collect(),
        timing: support::raft_timing(),
        snapshot_every: leader_raft::RaftConfig::DEFAULT_SNAPSHOT_EVERY,
    };
    let a = tokio::spawn(RaftStore::start(group.config(0)));
    let c = tokio::spawn(RaftStore::start(group.config(2)));
    // `a` and `c` answer each other, then `c` is stopped before `b` ever starts.
    sleep(Duration::from_millis(800)).await;
    c.abort();
    let _ = c.await;
    let b = tokio::spawn(RaftStore::start(group.config(1)));
    // `a` now has every answer and forms the group; `b` waits for `c`.
    let a = a.await.unwrap().unwrap();
    sleep(Duration::from_millis(800)).await;
    group.members[0] = Some(a);
    group.restart(2).await;
    group.members[1] = Some(b.await.unwrap().unwrap());
    group.leader(Duration::from_secs(10)).await;
    group.shutdown_all().await;
}
