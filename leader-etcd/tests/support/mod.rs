//! Shared helpers of the etcd tests: the server, a prefix per harness, the test timing, and
//! raw access to keys through etcd's own JSON gateway (bypassing this crate).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)] // test code

use std::time::Duration;

use integration_tests::{Emulator, require, unique_name};
use leader_core::{LeaseKey, Timing};
use leader_etcd::EtcdStore;

/// The store's request timeout in the tests (and the elector's).
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_millis(300);

/// Short timing: a 2 s ttl (etcd's shortest lease with its default election timeout),
/// renewing every 500 ms, polling every 100 ms.
pub(crate) fn timing() -> Timing {
    let mut t = Timing::from_ttl(Duration::from_secs(2));
    t.renew_every = Duration::from_millis(500);
    t.retry_every = Duration::from_millis(200);
    t.poll_every = Duration::from_millis(100);
    t.request_timeout = REQUEST_TIMEOUT;
    t.margin = Duration::from_millis(600);
    t.validate().unwrap();
    t
}

/// The etcd server of `scripts/emulators` (`LEADER_ETCD_ENDPOINT`).
pub(crate) async fn endpoint() -> String {
    require(Emulator::Etcd)
        .await
        .expect("these tests need etcd (LEADER_ETCD_ENDPOINT; run under scripts/emulators)")
        .url
}

/// A key prefix of its own, so that runs and cases never meet.
pub(crate) struct Prefix {
    pub(crate) prefix: String,
}

impl Prefix {
    pub(crate) fn new() -> Self {
        Self {
            prefix: format!("{}/", unique_name("leader-etcd")),
        }
    }

    pub(crate) async fn store(&self) -> EtcdStore {
        EtcdStore::builder()
            .with_endpoint(endpoint().await)
            .with_prefix(&self.prefix)
            .build()
            .await
            .unwrap()
    }

    pub(crate) fn unique_key(&self) -> LeaseKey {
        leader_core::conformance::unique_key("etcd").unwrap()
    }
}

/// Raw access to the test server, behind the store's back.
pub(crate) async fn raw() -> integration_tests::etcd::EtcdRaw {
    integration_tests::etcd::EtcdRaw::new(&endpoint().await)
}
