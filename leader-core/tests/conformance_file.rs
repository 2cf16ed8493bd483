//! The conformance suite on the file store, in real time with a short ttl.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leader_core::conformance::{ConformantStore, Harness, unique_key};
use leader_core::{Error, FileStore, LeaseKey, Timing};

struct Files {
    dir: tempfile::TempDir,
}

fn files() -> Files {
    Files {
        dir: tempfile::tempdir().unwrap(),
    }
}

#[async_trait]
impl Harness for Files {
    async fn store(&self) -> Result<Arc<dyn ConformantStore>, Error> {
        // A new FileStore per call: separate clients, shared only through the files.
        Ok(Arc::new(FileStore::open(self.dir.path())?))
    }

    fn unique_key(&self) -> LeaseKey {
        unique_key("case").unwrap()
    }

    fn timing(&self) -> Timing {
        Timing::from_ttl(Duration::from_millis(1200))
    }

    async fn plant_malformed(&self, key: &LeaseKey) -> Result<(), Error> {
        let store = FileStore::open(self.dir.path())?;
        std::fs::write(store.lease_path(key), b"\x00\x01 not json").unwrap();
        Ok(())
    }

    async fn delete_record(&self, key: &LeaseKey) -> Result<(), Error> {
        let store = FileStore::open(self.dir.path())?;
        std::fs::remove_file(store.lease_path(key)).unwrap();
        Ok(())
    }
}

leader_core::conformance_tests!(files());
