//! The core's conformance suite against a real etcd server, in real time with a 2 s ttl.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod support;

use std::sync::Arc;

use async_trait::async_trait;
use leader_core::conformance::{ConformantStore, Harness};
use leader_core::{Error, LeaseKey, Timing};
use support::Prefix;

struct Etcd(Prefix);

#[async_trait]
impl Harness for Etcd {
    async fn store(&self) -> Result<Arc<dyn ConformantStore>, Error> {
        Ok(Arc::new(self.0.store().await))
    }

    fn unique_key(&self) -> LeaseKey {
        self.0.unique_key()
    }

    fn timing(&self) -> Timing {
        support::timing()
    }

    async fn plant_malformed(&self, key: &LeaseKey) -> Result<(), Error> {
        let k = self.0.store().await.lease_key(key);
        support::raw()
            .await
            .put(&k, b"{\"not\": \"a record\"")
            .await
            .unwrap();
        Ok(())
    }

    async fn delete_record(&self, key: &LeaseKey) -> Result<(), Error> {
        let k = self.0.store().await.lease_key(key);
        support::raw().await.delete(&k).await.unwrap();
        Ok(())
    }
}

leader_core::conformance_tests!(Etcd(Prefix::new()));
