//! A group of members in one test process, on loopback ports, each with its own folder.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    dead_code,
    unreachable_pub
)]

use std::path::PathBuf;
use std::time::Duration;

use leader_raft::{RaftConfig, RaftError, RaftStore, RaftTiming, TlsConfig};
use tempfile::TempDir;
use tokio::time::{Instant, sleep};

/// The timing of test groups: the defaults, with a request timeout of 400 ms.
pub fn raft_timing() -> RaftTiming {
    let mut t = RaftTiming::default();
    t.request_timeout = Duration::from_millis(400);
    t
}

/// `n` loopback addresses whose ports were free a moment ago.
pub fn free_addresses(n: usize) -> Vec<String> {
    let listeners: Vec<_> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().to_string())
        .collect()
}

/// A group of members in this process.
pub struct Group {
    pub addresses: Vec<String>,
    pub root: TempDir,
    pub members: Vec<Option<RaftStore>>,
    pub tls: Vec<Option<TlsConfig>>,
    pub timing: RaftTiming,
    pub snapshot_every: u64,
}

impl Group {
    /// Starts `n` plaintext members.
    pub async fn start(n: usize) -> Self {
        Self::start_with(n, |_| None).await
    }

    /// Starts `n` members at once (a member with an empty folder waits for every other one to
    /// answer), member `i` with TLS `tls(i)`; picks new ports if one was taken meanwhile.
    pub async fn start_with(n: usize, tls: impl Fn(&str) -> Option<TlsConfig>) -> Self {
        for _ in 0..5 {
            let addresses = free_addresses(n);
            let mut group = Group {
                tls: addresses.iter().map(|a| tls(a)).collect(),
                addresses,
                root: tempfile::tempdir().unwrap(),
                members: (0..n).map(|_| None).collect(),
                timing: raft_timing(),
                snapshot_every: RaftConfig::DEFAULT_SNAPSHOT_EVERY,
            };
            let mut starts = tokio::task::JoinSet::new();
            for i in 0..n {
                let config = group.config(i);
                starts.spawn(async move { (i, RaftStore::start(config).await) });
            }
            let mut conflict = false;
            while let Some(joined) = starts.join_next().await {
                // A start aborted after a port conflict.
                let Ok(joined) = joined else { continue };
                match joined {
                    (i, Ok(store)) => group.members[i] = Some(store),
                    (_, Err(RaftError::Listen { .. })) => {
                        conflict = true;
                        starts.abort_all();
                    }
                    (i, Err(e)) => panic!("member {i} did not start: {e}"),
                }
            }
            if !conflict {
                return group;
            }
            group.shutdown_all().await;
        }
        panic!("no free ports after 5 tries");
    }

    pub fn dir(&self, i: usize) -> PathBuf {
        self.root.path().join(format!("member-{i}"))
    }

    pub fn config(&self, i: usize) -> RaftConfig {
        let mut config = RaftConfig::new(
            self.addresses.clone(),
            self.addresses[i].clone(),
            self.dir(i),
        )
        .with_timing(self.timing)
        .with_snapshot_every(self.snapshot_every);
        if let Some(tls) = &self.tls[i] {
            config = config.with_tls(tls.clone());
        }
        config
    }

    pub async fn try_start_member(&self, i: usize) -> Result<RaftStore, RaftError> {
        RaftStore::start(self.config(i)).await
    }

    /// (Re)starts member `i` with its folder, retrying while its port is still held.
    pub async fn restart(&mut self, i: usize) {
        for _ in 0..50 {
            match self.try_start_member(i).await {
                Ok(store) => {
                    self.members[i] = Some(store);
                    return;
                }
                Err(RaftError::Listen { .. }) => sleep(Duration::from_millis(100)).await,
                Err(e) => panic!("member {i} did not restart: {e}"),
            }
        }
        panic!("member {i}'s port stayed busy");
    }

    /// The index (in `addresses`) of the member with Raft id `id` (ids number the sorted
    /// addresses from 1).
    pub fn index_of(&self, id: u64) -> Option<usize> {
        let mut sorted = self.addresses.clone();
        sorted.sort();
        let address = sorted.get(usize::try_from(id).ok()?.checked_sub(1)?)?;
        self.addresses.iter().position(|a| a == address)
    }

    pub fn member(&self, i: usize) -> &RaftStore {
        self.members[i].as_ref().expect("member is running")
    }

    pub async fn stop(&mut self, i: usize) {
        if let Some(store) = self.members[i].take() {
            store.shutdown().await;
        }
    }

    pub async fn shutdown_all(&mut self) {
        for i in 0..self.members.len() {
            self.stop(i).await;
        }
    }

    /// The index of the member that every running member agrees leads, within `within`.
    pub async fn leader(&self, within: Duration) -> usize {
        let running: Vec<usize> = (0..self.members.len())
            .filter(|i| self.members[*i].is_some())
            .collect();
        self.leader_among(&running, within).await
    }

    /// The index of the member, one of `among`, that members `among` agree leads (and that
    /// believes it does), within `within`.
    pub async fn leader_among(&self, among: &[usize], within: Duration) -> usize {
        let deadline = Instant::now() + within;
        loop {
            let views: Vec<_> = among.iter().map(|i| self.member(*i).status()).collect();
            let leader = views[0].leader;
            if let Some(id) = leader
                && views.iter().all(|v| v.leader == leader)
                && let Some(i) = self.index_of(id)
                && among.contains(&i)
                && let Some(running) = &self.members[i]
                && running.status().role == "Leader"
            {
                return i;
            }
            assert!(
                Instant::now() < deadline,
                "no agreed leader within {within:?}: {views:#?}"
            );
            sleep(Duration::from_millis(20)).await;
        }
    }
}
