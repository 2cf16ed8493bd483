//! The core's conformance suite against a three-member group on loopback, in real time with a
//! 2 s ttl. The harness hands out clients of every member in turn, so that two calls in three
//! go through a member that is not the Raft leader and are forwarded.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use leader_core::conformance::{ConformantStore, Harness, unique_key};
use leader_core::{Error, LeaseKey, Timing};
use support::Group;

struct Raft {
    group: Group,
    next: AtomicUsize,
}

impl Raft {
    async fn start() -> Self {
        let group = Group::start(3).await;
        group.leader(Duration::from_secs(10)).await;
        Self {
            group,
            next: AtomicUsize::new(0),
        }
    }

    /// A member that is not the Raft leader now.
    fn follower(&self) -> &leader_raft::RaftStore {
        let members = self.group.members.iter().flatten();
        members
            .clone()
            .find(|m| m.status().role != "Leader")
            .unwrap_or_else(|| members.clone().next().unwrap())
    }
}

#[async_trait]
impl Harness for Raft {
    async fn store(&self) -> Result<Arc<dyn ConformantStore>, Error> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let store = match n % 3 {
            0 => self.follower().clone(),
            i => self.group.member(i).clone(),
        };
        Ok(Arc::new(store))
    }

    fn unique_key(&self) -> LeaseKey {
        unique_key("raft").unwrap()
    }

    fn timing(&self) -> Timing {
        let mut t = Timing::from_ttl(Duration::from_secs(2));
        t.renew_every = Duration::from_millis(500);
        t.retry_every = Duration::from_millis(200);
        t.poll_every = Duration::from_millis(100);
        t.request_timeout = Duration::from_millis(400);
        t.margin = Duration::from_millis(800);
        t.validate().unwrap();
        t
    }

    async fn plant_malformed(&self, key: &LeaseKey) -> Result<(), Error> {
        self.follower()
            .put_raw(key, b"{\"not\": \"a record\"".to_vec())
            .await
    }

    async fn delete_record(&self, key: &LeaseKey) -> Result<(), Error> {
        self.follower().delete(key).await
    }
}

leader_core::conformance_tests!(Raft::start().await);
