//! Shared test helpers: the two S3 emulators (moto behind the serialising launcher, LocalStack's
//! S3), a plain SDK client for what an operator does by hand, and the conformance harness.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    dead_code,
    unreachable_pub
)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_s3::Client;
use aws_sdk_s3::primitives::ByteStream;
use integration_tests::proxy::FaultProxy;
use integration_tests::{Emulator, require};
use leader_core::conformance::{ConformantStore, Harness, unique_key};
use leader_core::{Error, LeaseKey, Timing};
use leader_s3::{S3Builder, S3Store};
use tokio::sync::OnceCell;

/// One of the two emulators every S3 test runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Emu {
    /// moto's S3, behind `scripts/moto_server.py` (one request at a time).
    Moto,
    /// LocalStack's S3 provider, on the host.
    LocalStack,
}

impl Emu {
    pub const BOTH: [Emu; 2] = [Emu::Moto, Emu::LocalStack];

    /// The emulator's endpoint URL; fails the test with instructions if it is not running
    /// (unless `LEADER_ALLOW_SKIP=1`, then `None`): see `integration_tests::require`.
    pub async fn url(self) -> Option<String> {
        let emulator = match self {
            Emu::Moto => Emulator::MotoS3,
            Emu::LocalStack => Emulator::LocalStackS3,
        };
        let endpoint = require(emulator).await?;
        Some(endpoint.url.trim_end_matches('/').to_owned())
    }
}

/// A short timing that both emulators meet on a loaded 2-core machine (as the DynamoDB tests
/// on moto): ttl 3 s, request timeout 500 ms.
pub fn timing() -> Timing {
    let mut t = Timing::from_ttl(Duration::from_millis(3000));
    t.request_timeout = Duration::from_millis(500);
    t.margin = Duration::from_millis(1000);
    t.renew_every = Duration::from_secs(1);
    t.validate().unwrap();
    t
}

/// A plain SDK client of the emulator at `url`, for what an operator does by hand.
pub fn raw_client(url: &str) -> Client {
    integration_tests::s3::client(url)
}

/// Creates a bucket with a fresh name and returns it.
pub async fn new_bucket(url: &str) -> String {
    let bucket = integration_tests::unique_name("leases");
    integration_tests::s3::create_bucket(url, &bucket)
        .await
        .unwrap_or_else(|e| panic!("at {url}: {e}"));
    bucket
}

/// A store on `bucket` through `url` (the emulator, or a proxy in front of it).
pub async fn store_at(url: &str, bucket: &str) -> S3Store {
    S3Builder::new()
        .with_emulator(url)
        .with_bucket(bucket)
        .build()
        .await
        .unwrap()
}

/// An object's bytes and ETag as stored, read directly.
pub async fn raw_get(url: &str, bucket: &str, key: &str) -> Option<(Vec<u8>, String)> {
    match raw_client(url)
        .get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
    {
        Ok(out) => {
            let etag = out.e_tag().unwrap().to_owned();
            Some((out.body.collect().await.unwrap().to_vec(), etag))
        }
        Err(e) if e.raw_response().is_some_and(|r| r.status().as_u16() == 404) => None,
        Err(e) => panic!("reading {key}: {e:?}"),
    }
}

/// Puts an object unconditionally, as an operator's tool does.
pub async fn raw_put(url: &str, bucket: &str, key: &str, body: &[u8]) {
    raw_client(url)
        .put_object()
        .bucket(bucket)
        .key(key)
        .body(ByteStream::from(body.to_vec()))
        .send()
        .await
        .unwrap();
}

/// Deletes an object, as an operator recovering a stuck lease does.
pub async fn raw_delete(url: &str, bucket: &str, key: &str) {
    raw_client(url)
        .delete_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .unwrap();
}

/// The suite's fault proxy in front of the emulator at `url`.
pub async fn proxy(url: &str) -> FaultProxy {
    FaultProxy::in_front_of(url, 1).await.unwrap()
}

/// One bucket per harness (that is, per conformance case).
pub struct S3Harness {
    emu: Emu,
    bucket: OnceCell<(String, String)>,
}

pub fn harness(emu: Emu) -> S3Harness {
    S3Harness {
        emu,
        bucket: OnceCell::new(),
    }
}

impl S3Harness {
    /// The emulator's URL and this harness's bucket (created on first use).
    async fn place(&self) -> &(String, String) {
        self.bucket
            .get_or_init(|| async {
                let url = self.emu.url().await.expect("the emulator is required");
                let bucket = new_bucket(&url).await;
                (url, bucket)
            })
            .await
    }
}

#[async_trait]
impl Harness for S3Harness {
    async fn store(&self) -> Result<Arc<dyn ConformantStore>, Error> {
        let (url, bucket) = self.place().await;
        // A new client per call, as another process would have.
        Ok(Arc::new(store_at(url, bucket).await))
    }

    fn unique_key(&self) -> LeaseKey {
        unique_key("case").unwrap()
    }

    fn timing(&self) -> Timing {
        timing()
    }

    async fn plant_malformed(&self, key: &LeaseKey) -> Result<(), Error> {
        let (url, bucket) = self.place().await;
        raw_put(url, bucket, key.as_str(), b"{\"not\": \"a record\"").await;
        Ok(())
    }

    async fn delete_record(&self, key: &LeaseKey) -> Result<(), Error> {
        let (url, bucket) = self.place().await;
        raw_delete(url, bucket, key.as_str()).await;
        Ok(())
    }
}
