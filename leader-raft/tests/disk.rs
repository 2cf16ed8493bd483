//! The data folder across restarts: a torn last log record is dropped, other damage (in the
//! log or the vote) stops the member with an error naming the file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod support;

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::time::Duration;

use leader_core::{LeaseBackend, LeaseKey};
use leader_raft::RaftError;
use support::Group;
use tokio::time::{Instant, sleep};

/// A one-member group holding one raw record, stopped.
async fn stopped_group_with_a_record() -> (Group, LeaseKey) {
    let mut group = Group::start(1).await;
    group.leader(Duration::from_secs(10)).await;
    let key = LeaseKey::new("kept").unwrap();
    group
        .member(0)
        .put_raw(&key, b"raw".to_vec())
        .await
        .unwrap();
    group.stop(0).await;
    (group, key)
}

async fn raw_read(group: &Group, key: &LeaseKey) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match group.member(0).read(key).await {
            // The planted bytes are no record: the read names the key.
            Err(e) if e.kind() == leader_core::ErrorKind::MalformedRecord => return e.to_string(),
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                sleep(Duration::from_millis(50)).await;
            }
            other => panic!("unexpected read: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_last_log_record_is_dropped_at_replay() {
    let (mut group, key) = stopped_group_with_a_record().await;
    let log = group.dir(0).join("log");
    let intact = fs::metadata(&log).unwrap().len();
    // A crash in the middle of an append: a header promising 100 bytes, and 10 of them.
    let mut file = OpenOptions::new().append(true).open(&log).unwrap();
    file.write_all(&100u32.to_le_bytes()).unwrap();
    file.write_all(&(!100u32).to_le_bytes()).unwrap();
    file.write_all(&[0u8; 4]).unwrap();
    file.write_all(&[b'x'; 10]).unwrap();
    drop(file);
    group.restart(0).await;
    assert!(raw_read(&group, &key).await.contains("kept"));
    group.stop(0).await;
    // The torn tail was cut off (and later appends came after the intact part).
    let bytes = fs::read(&log).unwrap();
    assert!(bytes.len() as u64 >= intact);
    assert!(!bytes.windows(10).any(|w| w == [b'x'; 10]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_log_record_is_an_error_naming_the_file() {
    let (group, _) = stopped_group_with_a_record().await;
    let log = group.dir(0).join("log");
    let mut bytes = fs::read(&log).unwrap();
    bytes[10] ^= 0x55; // inside the first record, which is not the last
    fs::write(&log, &bytes).unwrap();
    let err = group.try_start_member(0).await.unwrap_err();
    assert!(matches!(err, RaftError::Damaged { .. }), "{err}");
    assert!(
        err.to_string().contains(&log.display().to_string()),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_vote_file_is_an_error_naming_the_file() {
    let (group, _) = stopped_group_with_a_record().await;
    let vote = group.dir(0).join("vote");
    assert!(vote.exists());
    fs::write(&vote, b"{\"leader_id\": ").unwrap();
    let err = group.try_start_member(0).await.unwrap_err();
    assert!(matches!(err, RaftError::Damaged { .. }), "{err}");
    assert!(
        err.to_string().contains(&vote.display().to_string()),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let (group, _) = stopped_group_with_a_record().await;
    let mode = |p: &std::path::Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&group.dir(0)), 0o700);
    for name in ["vote", "log", "lock"] {
        assert_eq!(mode(&group.dir(0).join(name)), 0o600, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_too_large_for_a_raft_entry_is_refused_before_it_is_proposed() {
    let mut group = Group::start(1).await;
    group.leader(Duration::from_secs(10)).await;
    let key = LeaseKey::new("huge").unwrap();
    let before = group.member(0).status().last_log_index;
    let err = group
        .member(0)
        .put_raw(&key, vec![255; 10 << 20])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), leader_core::ErrorKind::InvalidConfig, "{err}");
    assert!(err.to_string().contains("nothing was written"), "{err}");
    assert_eq!(group.member(0).status().last_log_index, before);
    group.shutdown_all().await;
}
