//! `leader::quorum_from_urls`: members from URLs, the member set's checks, and a member that
//! cannot be reached when the quorum is opened.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use leader::{Elector, ErrorKind, Leadership, OpenOptions, quorum_from_urls};

fn dirs(n: usize) -> Vec<tempfile::TempDir> {
    (0..n).map(|_| tempfile::tempdir().unwrap()).collect()
}

fn urls(dirs: &[tempfile::TempDir], key: &str) -> Vec<String> {
    dirs.iter()
        .map(|d| format!("file://{}/{key}", d.path().display()))
        .collect()
}

#[tokio::test]
async fn three_folders_elect_a_leader_with_a_quorum_token() {
    let d = dirs(3);
    let (quorum, key) = quorum_from_urls(&urls(&d, "job"), &OpenOptions::new())
        .await
        .unwrap();
    assert_eq!(key.as_str(), "job");
    assert_eq!(quorum.members().len(), 3);
    let handle = Elector::quorum_builder(quorum, key)
        .ttl(Duration::from_secs(2))
        .build()
        .unwrap()
        .spawn();
    let term = tokio::time::timeout(Duration::from_secs(10), handle.wait_for_term())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(term.token().get(), 1);
    drop(term);
    handle.shutdown().await;
    for dir in &d {
        assert!(
            dir.path().join("job.q.fenced").exists(),
            "no record in {dir:?}"
        );
    }
}

#[tokio::test]
async fn a_member_set_that_cannot_work_is_refused_before_anything_opens() {
    let d = dirs(4);
    let all = urls(&d, "job");
    let even = quorum_from_urls(&all, &OpenOptions::new())
        .await
        .unwrap_err();
    assert_eq!(even.kind(), ErrorKind::InvalidConfig);
    assert!(even.to_string().contains("odd number"), "{even}");
    let twice = vec![all[0].clone(), all[1].clone(), all[0].clone()];
    let e = quorum_from_urls(&twice, &OpenOptions::new())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("given twice"), "{e}");
    let mut keys = urls(&d[..3], "job");
    keys[2] = format!("file://{}/other", d[2].path().display());
    let e = quorum_from_urls(&keys, &OpenOptions::new())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("same lease key"), "{e}");
    let mut missing = urls(&d[..3], "job");
    missing[1] = "file:///nonexistent/leader-quorum-test/job".to_owned();
    let e = quorum_from_urls(&missing, &OpenOptions::new())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig);
    assert!(e.to_string().contains("cannot be used"), "{e}");
}

/// An etcd member on a closed port cannot be reached now: the quorum opens anyway, and the
/// two folders carry the election.
#[cfg(feature = "etcd")]
#[tokio::test]
async fn a_member_unreachable_at_start_does_not_stop_the_candidate() {
    let d = dirs(2);
    let mut all = urls(&d, "job");
    all.push("etcd://127.0.0.1:9/job".to_owned());
    let (quorum, key) = quorum_from_urls(&all, &OpenOptions::new()).await.unwrap();
    let handle = Elector::quorum_builder(quorum, key)
        .ttl(Duration::from_secs(2))
        .build()
        .unwrap()
        .spawn();
    // It campaigns on: no error. A new key begins only once every member has answered (its
    // history could sit on the member away), so no term either.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let now = handle.leadership().borrow().clone();
    assert!(
        matches!(
            now,
            Leadership::Follower { .. } | Leadership::Unknown { .. }
        ),
        "{now:?}"
    );
    handle.shutdown().await;
}
