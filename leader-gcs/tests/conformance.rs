//! The core's conformance suite against fake-gcs-server, in real time with the shortest
//! timing GCS allows (renew every 1 s, ttl 3.5 s).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod support;

use std::sync::Arc;

use async_trait::async_trait;
use leader_core::conformance::{ConformantStore, Harness};
use leader_core::{Error, LeaseKey, Timing};
use support::Bucket;

struct Gcs(Bucket);

#[async_trait]
impl Harness for Gcs {
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
        let object = self.0.store().await.lease_object(key);
        self.0
            .raw()
            .await
            .upload(&self.0.name, &object, b"{\"not\": \"a record\"", None)
            .await
            .unwrap();
        Ok(())
    }

    async fn delete_record(&self, key: &LeaseKey) -> Result<(), Error> {
        let object = self.0.store().await.lease_object(key);
        self.0
            .raw()
            .await
            .delete(&self.0.name, &object)
            .await
            .unwrap();
        Ok(())
    }
}

leader_core::conformance_tests!(Gcs(Bucket::new()));
