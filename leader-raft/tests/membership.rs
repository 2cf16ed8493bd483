//! A member configured with another member set is refused, with an error naming both sets.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod support;

use std::time::Duration;

use leader_core::ErrorKind;
use leader_raft::{RaftConfig, RaftStore};
use support::{Group, free_addresses};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_another_member_set_is_refused() {
    let mut group = Group::start(3).await;
    group.stop(2).await;
    // Member 2 comes back believing in a fourth member.
    let mut members = group.addresses.clone();
    members.push(free_addresses(1).remove(0));
    let config = RaftConfig::new(members.clone(), group.addresses[2].clone(), group.dir(2))
        .with_timing(group.timing);
    let odd = RaftStore::start(config).await.unwrap();
    group.leader_among(&[0, 1], Duration::from_secs(10)).await;

    let err = odd.status_of(&group.addresses[0]).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    let text = err.to_string();
    assert!(text.contains("another member set"), "{text}");
    assert!(
        text.contains(&format!("{:?}", {
            let mut m = group.addresses.clone();
            m.sort();
            m
        })),
        "{text}"
    );
    assert!(text.contains(&members[3]), "{text}");
    let err = group
        .member(0)
        .status_of(&group.addresses[2])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    odd.shutdown().await;
    group.shutdown_all().await;
}
