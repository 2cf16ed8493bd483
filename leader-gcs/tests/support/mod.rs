//! Shared helpers of the emulator tests: a bucket per harness, the test timing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)] // test code

use std::time::Duration;

use integration_tests::gcs::GcsClient;
use integration_tests::{Emulator, require, unique_name};
use leader_core::{LeaseKey, Timing};
use leader_gcs::GcsStore;
use tokio::sync::OnceCell;

/// The store's request timeout in the tests (and the elector's).
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_millis(600);

/// The shortest timing GCS allows: renew every 1 s (its write rate per object), so
/// ttl > renew_every + request_timeout + margin = 1 s + 0.6 s + 1.2 s.
pub(crate) fn timing() -> Timing {
    let mut t = Timing::from_ttl(Duration::from_millis(3500));
    t.renew_every = Duration::from_secs(1);
    t.retry_every = Duration::from_millis(500);
    t.request_timeout = REQUEST_TIMEOUT;
    t.margin = Duration::from_millis(1200);
    t.validate().unwrap();
    t
}

/// A bucket on fake-gcs-server, created (with one JSON API call) on first use.
pub(crate) struct Bucket {
    pub(crate) name: String,
    endpoint: OnceCell<String>,
}

impl Bucket {
    pub(crate) fn new() -> Self {
        Self {
            name: unique_name("leader-gcs"),
            endpoint: OnceCell::new(),
        }
    }

    /// The emulator's URL, after creating the bucket.
    pub(crate) async fn endpoint(&self) -> &str {
        self.endpoint
            .get_or_init(|| async {
                let endpoint = require(Emulator::Gcs)
                    .await
                    .expect("these tests need fake-gcs-server (STORAGE_EMULATOR_HOST)");
                GcsClient::new(&endpoint.url)
                    .create_bucket(&self.name)
                    .await
                    .unwrap();
                endpoint.url
            })
            .await
    }

    pub(crate) async fn store(&self) -> GcsStore {
        let endpoint = self.endpoint().await.to_owned();
        self.store_at(&endpoint).await
    }

    pub(crate) async fn store_at(&self, endpoint: &str) -> GcsStore {
        GcsStore::builder()
            .with_bucket(&self.name)
            .with_emulator(endpoint)
            .build()
            .await
            .unwrap()
    }

    pub(crate) async fn raw(&self) -> GcsClient {
        GcsClient::new(self.endpoint().await)
    }

    pub(crate) fn unique_key(&self) -> LeaseKey {
        leader_core::conformance::unique_key("case").unwrap()
    }

    /// Deletes an object with the JSON API, as an operator would.
    pub(crate) async fn delete(&self, object: &str) {
        let encoded: String = object
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.') {
                    char::from(b).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        let url = format!(
            "{}/storage/v1/b/{}/o/{encoded}",
            self.endpoint().await,
            self.name
        );
        let response = reqwest::Client::new().delete(url).send().await.unwrap();
        assert!(
            response.status().is_success(),
            "delete: {}",
            response.status()
        );
    }
}
