//! A member configured with another member set is refused at start, with an error naming both
//! sets: on its old folder (the log knows the group's members) and on a new one (the others
//! refuse it).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod support;

use std::time::Duration;

use leader_raft::{RaftConfig, RaftError, RaftStore};
use support::{Group, free_addresses};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_another_member_set_is_refused() {
    let mut group = Group::start(3).await;
    group.stop(2).await;
    // Member 2 comes back believing in a fourth member.
    let mut members = group.addresses.clone();
    members.push(free_addresses(1).remove(0));
    let sorted = {
        let mut m = group.addresses.clone();
        m.sort();
        m
    };
    let odd = |dir| {
        RaftConfig::new(members.clone(), group.addresses[2].clone(), dir).with_timing(group.timing)
    };
    let err = RaftStore::start(odd(group.dir(2))).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, RaftError::InvalidConfig { .. }), "{text}");
    assert!(text.contains("belongs to a group"), "{text}");
    assert!(text.contains(&members[3]), "{text}");
    for address in &sorted {
        assert!(text.contains(address.as_str()), "{text}");
    }

    // On a new folder, the members of the group refuse it.
    group.leader_among(&[0, 1], Duration::from_secs(10)).await;
    let fresh = group.root.path().join("fresh");
    let err = RaftStore::start(odd(fresh)).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, RaftError::InvalidConfig { .. }), "{text}");
    assert!(text.contains("another member set"), "{text}");
    assert!(text.contains(&format!("{sorted:?}")), "{text}");
    group.shutdown_all().await;
}
