//! Shared helpers of the etcd tests: the server, a prefix per harness, the test timing, and
//! raw access to keys through etcd's own JSON gateway (bypassing this crate).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)] // test code

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use integration_tests::unique_name;
use leader_core::{LeaseKey, Timing};
use leader_etcd::EtcdStore;
use serde_json::{Value, json};

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
    // TEMP until integration_tests::Emulator::Etcd lands.
    std::env::var("LEADER_ETCD_ENDPOINT").expect("these tests need etcd (LEADER_ETCD_ENDPOINT)")
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

/// etcd's JSON gateway (`/v3/...`), for what a test does behind the store's back.
pub(crate) struct Raw {
    http: reqwest::Client,
    base: String,
}

impl Raw {
    pub(crate) async fn new() -> Self {
        Self {
            http: reqwest::Client::new(),
            base: endpoint().await,
        }
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        let response = self
            .http
            .post(format!("{}/v3/{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(
            response.status().is_success(),
            "{path}: {}",
            response.status()
        );
        response.json().await.unwrap()
    }

    /// Writes `value` to `key` without a lease.
    pub(crate) async fn put(&self, key: &str, value: &[u8]) {
        self.post(
            "kv/put",
            json!({"key": B64.encode(key), "value": B64.encode(value)}),
        )
        .await;
    }

    /// Deletes `key`.
    pub(crate) async fn delete(&self, key: &str) {
        self.post("kv/deleterange", json!({"key": B64.encode(key)}))
            .await;
    }

    /// The key's `(create_revision, mod_revision, lease)`, if it exists.
    pub(crate) async fn get(&self, key: &str) -> Option<(i64, i64, i64)> {
        let answer = self.post("kv/range", json!({"key": B64.encode(key)})).await;
        let kv = answer.get("kvs")?.get(0)?;
        let num = |f: &str| {
            kv.get(f)
                .and_then(|v| v.as_str())
                .map_or(0, |s| s.parse::<i64>().unwrap())
        };
        Some((num("create_revision"), num("mod_revision"), num("lease")))
    }
}
