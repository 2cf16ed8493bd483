//! Shared helpers of the tests against a real ZooKeeper server: the endpoint, a parent node
//! per test, the test timing, and an operator's raw client.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)] // test code

use std::time::Duration;

use integration_tests::Emulator;
use leader_core::Timing;
use leader_zookeeper::ZooKeeperStore;
use zookeeper_client::Client;

/// The parent of every test's nodes.
pub(crate) const ROOT: &str = "/leader-zookeeper-tests";

/// The server's `host:port` (`LEADER_ZOOKEEPER_ENDPOINT`, exported by `scripts/emulators`);
/// `None` (skip) only if the user allowed it with `LEADER_ALLOW_SKIP=1`.
pub(crate) async fn endpoint() -> Option<String> {
    integration_tests::require(Emulator::ZooKeeper)
        .await
        .map(|endpoint| endpoint.url)
}

/// The test timing: ttl 2 s (each term's session timeout), renew every 600 ms.
pub(crate) fn timing() -> Timing {
    let mut t = Timing::from_ttl(Duration::from_secs(2));
    t.renew_every = Duration::from_millis(600);
    t.request_timeout = Duration::from_millis(400);
    t.margin = Duration::from_millis(800);
    t.retry_every = Duration::from_millis(400);
    t.poll_every = Duration::from_millis(200);
    t.validate().unwrap();
    t
}

/// A parent node no other test (or run) uses: `/leader-zookeeper-tests/{name}-{random}`.
pub(crate) fn unique_path(name: &str) -> String {
    let random = leader_core::backend::Rng::from_entropy().next_u64();
    format!("{ROOT}/{name}-{random:016x}")
}

/// A store on `path`, creating the node.
pub(crate) async fn store(endpoint: &str, path: &str) -> ZooKeeperStore {
    ZooKeeperStore::builder()
        .with_hosts(endpoint)
        .with_path(path)
        .with_create_path(true)
        .build()
        .await
        .unwrap()
}

/// A plain client, as an operator's `zkCli.sh` would be.
pub(crate) async fn raw(endpoint: &str) -> Client {
    Client::connect(endpoint).await.unwrap()
}

/// A TCP proxy to the server whose connections can be cut, as a network failure or a server
/// restart would.
pub(crate) struct Proxy {
    /// The address to connect to instead of the server.
    pub(crate) addr: std::net::SocketAddr,
    cut: tokio::sync::watch::Sender<u64>,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub(crate) async fn start(server: &str) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (cut, _) = tokio::sync::watch::channel(0u64);
        let cuts = cut.clone();
        let server = server.to_owned();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut cut = cuts.subscribe();
                let server = server.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&server).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Proxy {
            addr,
            cut,
            accepted,
            task,
        }
    }

    /// How many connections the proxy has accepted.
    pub(crate) fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Closes every connection open now (new ones go through).
    pub(crate) fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
