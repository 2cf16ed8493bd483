//! The conformance suite on the in-memory store, with paused time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leader_core::backend::{FencedCas, FencedPut, ObjectWrite};
use leader_core::conformance::{ConformantStore, Harness, unique_key};
use leader_core::{Error, LeaseKey, MemoryStore, Timing};

#[derive(Default)]
struct Memory {
    store: MemoryStore,
}

#[async_trait]
impl Harness for Memory {
    async fn store(&self) -> Result<Arc<dyn ConformantStore>, Error> {
        Ok(Arc::new(self.store.clone()))
    }

    fn unique_key(&self) -> LeaseKey {
        unique_key("case").unwrap()
    }

    fn timing(&self) -> Timing {
        Timing::from_ttl(Duration::from_secs(10))
    }

    async fn plant_malformed(&self, key: &LeaseKey) -> Result<(), Error> {
        self.store.put_raw(key, b"{\"v\":1,\"holder\":".to_vec());
        Ok(())
    }

    async fn delete_record(&self, key: &LeaseKey) -> Result<(), Error> {
        self.store.delete(key);
        Ok(())
    }
}

leader_core::conformance_tests!(paused: Memory::default());

#[tokio::test(start_paused = true)]
async fn the_whole_suite_runs_in_one_go() {
    leader_core::conformance::run_all(&Memory::default())
        .await
        .unwrap();
}

/// A store that ignores every condition: the canary must catch it, so that the suite cannot
/// pass vacuously.
#[derive(Debug, Default)]
struct IgnoresConditions(MemoryStore);

#[async_trait]
impl leader_core::LeaseBackend for IgnoresConditions {
    async fn read(&self, key: &LeaseKey) -> Result<Option<leader_core::backend::Stored>, Error> {
        self.0.read(key).await
    }

    async fn write(
        &self,
        mut request: leader_core::backend::WriteRequest,
    ) -> Result<leader_core::backend::WriteOutcome, Error> {
        request.expected = match self.0.read(&request.key).await? {
            Some(s) => leader_core::backend::Expected::Revision(s.revision),
            None => leader_core::backend::Expected::Absent,
        };
        self.0.write(request).await
    }
}

#[async_trait]
impl FencedCas for IgnoresConditions {
    async fn get_fenced(
        &self,
        object: &leader_core::ObjectName,
    ) -> Result<Option<leader_core::FencedObject>, Error> {
        self.0.get_fenced(object).await
    }

    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        self.0.put_fenced_if(put).await
    }
}

#[derive(Default)]
struct Broken {
    store: Arc<IgnoresConditions>,
}

#[async_trait]
impl Harness for Broken {
    async fn store(&self) -> Result<Arc<dyn ConformantStore>, Error> {
        Ok(self.store.clone())
    }
    fn unique_key(&self) -> LeaseKey {
        unique_key("case").unwrap()
    }
    fn timing(&self) -> Timing {
        Timing::from_ttl(Duration::from_secs(10))
    }
    async fn plant_malformed(&self, key: &LeaseKey) -> Result<(), Error> {
        self.store.0.put_raw(key, b"x".to_vec());
        Ok(())
    }

    async fn delete_record(&self, key: &LeaseKey) -> Result<(), Error> {
        self.store.0.delete(key);
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn the_canary_catches_a_store_that_ignores_conditions() {
    let failure = leader_core::conformance::fidelity_canary(&Broken::default())
        .await
        .unwrap_err();
    assert!(failure.message.contains("STALE REVISION"), "{failure}");
}
