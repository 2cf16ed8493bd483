//! Shared helpers of the emulator tests: a bucket per harness, the test timing, a lossy proxy.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)] // test code

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use integration_tests::gcs::GcsClient;
use integration_tests::{Emulator, require, unique_name};
use leader_core::{LeaseKey, Timing};
use leader_gcs::GcsStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
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
    next: AtomicU64,
}

impl Bucket {
    pub(crate) fn new() -> Self {
        Self {
            name: unique_name("leader-gcs"),
            endpoint: OnceCell::new(),
            next: AtomicU64::new(0),
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
        LeaseKey::new(format!(
            "case-{}",
            self.next.fetch_add(1, Ordering::Relaxed)
        ))
        .unwrap()
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

/// A TCP proxy in front of the emulator that can lose the response of the next upload: the
/// request reaches the emulator (and is applied), the connection is closed before the answer.
pub(crate) struct LossyProxy {
    pub(crate) url: String,
    arm: Arc<AtomicBool>,
    dropped: Arc<AtomicUsize>,
}

impl LossyProxy {
    pub(crate) async fn start(upstream: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let upstream = upstream.trim_start_matches("http://").to_owned();
        let arm = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicUsize::new(0));
        let (a, d) = (arm.clone(), dropped.clone());
        tokio::spawn(async move {
            loop {
                let (client, _) = listener.accept().await.unwrap();
                tokio::spawn(relay(client, upstream.clone(), a.clone(), d.clone()));
            }
        });
        Self { url, arm, dropped }
    }

    /// Loses the response of the next upload.
    pub(crate) fn lose_next_upload_response(&self) {
        self.arm.store(true, Ordering::SeqCst);
    }

    /// How many responses were lost so far.
    pub(crate) fn lost(&self) -> usize {
        self.dropped.load(Ordering::SeqCst)
    }
}

async fn relay(client: TcpStream, upstream: String, arm: Arc<AtomicBool>, lost: Arc<AtomicUsize>) {
    let server = TcpStream::connect(&upstream).await.unwrap();
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let swallow = Arc::new(AtomicBool::new(false));
    let swallow_up = swallow.clone();
    let up = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if buf[..n].starts_with(b"POST /upload") && arm.swap(false, Ordering::SeqCst) {
                swallow_up.store(true, Ordering::SeqCst);
            }
            if server_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match server_read.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if swallow.load(Ordering::SeqCst) {
            lost.fetch_add(1, Ordering::SeqCst);
            break;
        }
        if client_write.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    up.abort();
}
