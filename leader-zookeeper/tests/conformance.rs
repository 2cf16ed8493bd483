//! The core's conformance suite against a real ZooKeeper server, in real time with a ttl of
//! 2 s (each term's session timeout).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod support;

use std::sync::Arc;

use async_trait::async_trait;
use leader_core::conformance::{ConformantStore, Harness, unique_key};
use leader_core::{Error, LeaseKey, Timing};
use zookeeper_client::{Acls, CreateMode};

/// One parent node per harness; every `store()` is a new store (as another process's).
struct ZooKeeper {
    path: String,
}

impl ZooKeeper {
    fn new() -> Self {
        Self {
            path: support::unique_path("conformance"),
        }
    }

    async fn endpoint(&self) -> String {
        support::endpoint().await.expect("no ZooKeeper server")
    }

    fn node(&self, key: &LeaseKey) -> String {
        format!("{}/{key}", self.path)
    }
}

#[async_trait]
impl Harness for ZooKeeper {
    async fn store(&self) -> Result<Arc<dyn ConformantStore>, Error> {
        Ok(Arc::new(
            support::store(&self.endpoint().await, &self.path).await,
        ))
    }

    fn unique_key(&self) -> LeaseKey {
        unique_key("case").unwrap()
    }

    fn timing(&self) -> Timing {
        support::timing()
    }

    async fn plant_malformed(&self, key: &LeaseKey) -> Result<(), Error> {
        let raw = support::raw(&self.endpoint().await).await;
        let options = CreateMode::Persistent.with_acls(Acls::anyone_all());
        raw.mkdir(&self.path, &options).await.unwrap();
        raw.create(&self.node(key), b"{\"not\": \"a record\"", &options)
            .await
            .unwrap();
        Ok(())
    }

    async fn delete_record(&self, key: &LeaseKey) -> Result<(), Error> {
        let raw = support::raw(&self.endpoint().await).await;
        raw.delete(&self.node(key), None).await.unwrap();
        Ok(())
    }
}

leader_core::conformance_tests!(ZooKeeper::new());
