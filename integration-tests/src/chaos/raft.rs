//! The Raft group of a `raft://` round (`docs/raft.md`): there is no store to start, the
//! candidates are the store. Each candidate process runs one member of the group, at its own
//! loopback address and with its own data folder (`raft-<index>` in the round's directory),
//! and opens it with [`OpenOptions::with_raft_member`], as `leader run --raft-listen
//! --raft-dir` does. The member list is every candidate's address, the same for all.
//!
//! Each member binds a loopback port of its own and is dialled at a TCP fault proxy in front
//! of it ([`RaftGroup::proxy`]): every connection to a proxy is traced to the candidate
//! process that opened it, so that one member can be cut from the others both ways (nothing
//! reaches its proxy, and its own connections to the others' proxies are held), as a network
//! partition would. That is the drills' `partition` (the leader's member cut off) and `stall`
//! (every member cut off).
//!
//! A candidate's endpoint names its member, `HOST:PORT~BIND@FOLDER` ([`RaftGroup::endpoint`]:
//! the address the others dial, the one it binds, its folder); the round's place is the member
//! list, `HOST:PORT,HOST:PORT,...` ([`RaftGroup::place`]).
//!
//! A new group forms only once every member has started and answered: the drill starts all
//! candidates of a round together. A member lives as long as its process: a killed or
//! stopped candidate takes its member with it (the others, a majority, go on), and at the end
//! of the round, once every candidate has exited, the group is gone. The protected object is
//! then read by starting the whole group again, in this process, from the candidates' folders
//! ([`RaftGroup::final_object`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use leader::raft::{RaftConfig, RaftError, RaftStore};
use leader::{OpenOptions, StoreUrl};
use leader_core::{Error, FencedStore, LeaseKey, ObjectName};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::checker::FinalObject;
use super::{OpenedStore, Proxy};
use crate::tcp_proxy::MemberProxies;

/// How long a member tries to bind its address: a member keeps its port until its process
/// exits, so a member started again at once (or a port picked free a moment ago that another
/// socket holds for a while) may find it taken briefly.
const BIND_PATIENCE: Duration = Duration::from_secs(5);
/// The pause between two attempts to bind.
const BIND_PAUSE: Duration = Duration::from_millis(100);

/// The group of one round: each candidate's address (its proxy's) and data folder, in
/// candidate order, and the proxies in front of the members.
#[derive(Clone, Debug)]
pub struct RaftGroup {
    members: Vec<String>,
    folders: Vec<PathBuf>,
    proxies: Arc<MemberProxies>,
}

impl RaftGroup {
    /// A group of `n` members on free loopback ports, each behind a traced proxy
    /// ([`MemberProxies`]), their folders in `dir`.
    ///
    /// # Errors
    /// A message if no port could be had.
    pub async fn new(dir: &Path, n: usize) -> Result<Self, String> {
        let proxies = MemberProxies::start(n)
            .await
            .map_err(|e| format!("starting the members' proxies on loopback: {e}"))?;
        let folders = (0..n).map(|i| dir.join(format!("raft-{i}"))).collect();
        Ok(Self {
            members: proxies.addresses(),
            folders,
            proxies: Arc::new(proxies),
        })
    }

    /// Candidate `i` is process `pid` (its member's connections are traced to it).
    pub fn started(&self, i: usize, pid: u32) {
        self.proxies.started(i, pid);
    }

    /// The faults of candidate `i`'s member: a blackhole cuts it from the others both ways.
    pub fn proxy(&self, i: usize) -> Proxy {
        Proxy::Member(MemberCut {
            proxies: self.proxies.clone(),
            index: i,
        })
    }

    /// The round's place: the member list.
    pub fn place(&self) -> String {
        self.members.join(",")
    }

    /// The endpoint of candidate `i`: its member's address, the address it binds and its
    /// folder, `HOST:PORT~BIND@FOLDER` (the same on every start of that candidate).
    pub fn endpoint(&self, i: usize) -> String {
        match (
            self.members.get(i),
            self.proxies.bind(i),
            self.folders.get(i),
        ) {
            (Some(address), Some(bind), Some(folder)) => {
                format!("{address}~{bind}@{}", folder.display())
            }
            _ => String::new(),
        }
    }

    /// The protected object `name` once every candidate has exited: the whole group started
    /// again from the candidates' folders, in this process (each member binding its port, the
    /// proxies healed and still in front of them), the
    /// object read through the first member, and the group stopped. A group that has no Raft
    /// leader yet answers with a transient error: tried again for up to 20 s.
    ///
    /// # Errors
    /// A message if it could not be read, and whether only because the group did not answer in
    /// time (a transient error to the end).
    pub async fn final_object(
        &self,
        name: &ObjectName,
    ) -> Result<Option<FinalObject>, (String, bool)> {
        // Together: a member whose folder is empty (a candidate that never got to start its
        // member) waits for every other.
        self.proxies.heal();
        let mut starts = JoinSet::new();
        for (i, (listen, folder)) in self.members.iter().zip(&self.folders).enumerate() {
            let config = RaftConfig::new(self.members.clone(), listen.clone(), folder.clone())
                .with_bind(self.proxies.bind(i).unwrap_or(listen));
            starts.spawn(async move { (i, start(config).await) });
        }
        let mut stores = Vec::new();
        let mut failed = None;
        while let Some(started) = starts.join_next().await {
            match started {
                Ok((i, Ok(store))) => stores.push((i, store)),
                Ok((i, Err(e))) => failed = Some(format!("starting member {i} again: {e}")),
                Err(e) => failed = Some(format!("starting a member again: {e}")),
            }
        }
        stores.sort_by_key(|(i, _)| *i);
        let read = match (&failed, stores.first()) {
            (None, Some((_, store))) => read_patiently(store, name).await,
            (Some(e), _) => Err((e.clone(), false)),
            (None, None) => Err(("the group has no members".to_owned(), false)),
        };
        for (_, store) in &stores {
            store.shutdown().await;
        }
        read
    }
}

/// Reads `name` through `store`, trying a transient error again for up to 20 s.
async fn read_patiently(
    store: &RaftStore,
    name: &ObjectName,
) -> Result<Option<FinalObject>, (String, bool)> {
    let give_up = Instant::now() + Duration::from_secs(20);
    loop {
        match store.fenced_read(name).await {
            Ok(o) => {
                return Ok(o.map(|o| FinalObject {
                    fence: o.fence.get(),
                    value: String::from_utf8_lossy(&o.value).into_owned(),
                }));
            }
            Err(e) if e.is_retryable() && Instant::now() < give_up => {
                tracing::debug!(error = %e, "the final object could not be read yet");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => {
                let again = e.is_retryable();
                return Err((format!("reading the protected object: {e}"), again));
            }
        }
    }
}

/// Starts a member, binding its address again for up to [`BIND_PATIENCE`] while it is taken.
async fn start(config: RaftConfig) -> Result<RaftStore, RaftError> {
    let give_up = Instant::now() + BIND_PATIENCE;
    loop {
        match RaftStore::start(config.clone()).await {
            Err(RaftError::Listen { .. }) if Instant::now() < give_up => {
                tokio::time::sleep(BIND_PAUSE).await;
            }
            started => return started,
        }
    }
}

/// The faults of one member of a [`RaftGroup`], for the drills ([`Proxy::Member`]).
#[derive(Clone, Debug)]
pub struct MemberCut {
    proxies: Arc<MemberProxies>,
    index: usize,
}

impl MemberCut {
    /// Cuts the member from the others both ways (`on`), or heals the cut
    /// ([`MemberProxies::isolate`]).
    pub fn isolate(&self, on: bool) {
        self.proxies.isolate(self.index, on);
    }
}

/// The address, bound address and folder of an [`endpoint`](RaftGroup::endpoint).
fn member(endpoint: &str) -> Result<(String, String, PathBuf), Error> {
    endpoint
        .split_once('@')
        .and_then(|(addresses, folder)| {
            let (listen, bind) = addresses.split_once('~')?;
            (!listen.is_empty() && !bind.is_empty() && !folder.is_empty())
                .then(|| (listen.to_owned(), bind.to_owned(), PathBuf::from(folder)))
        })
        .ok_or_else(|| Error::InvalidConfig {
            message: format!("a raft member's endpoint is HOST:PORT~BIND@FOLDER, not {endpoint:?}"),
            source: None,
        })
}

/// Whether opening failed only because the member's address was taken.
fn address_taken(e: &Error) -> bool {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<RaftError>())
        .is_some_and(|r| matches!(r, RaftError::Listen { .. }))
}

/// Starts the member of `endpoint` ([`RaftGroup::endpoint`]) of the group `place`
/// ([`RaftGroup::place`]) the way `leader run --store raft://... --raft-listen --raft-dir`
/// does, and returns it as the store. Its address taken (a store error that needs a person, by
/// the library's rules) is tried again for up to [`BIND_PATIENCE`]: see there.
///
/// # Errors
/// The store's error when the member cannot start.
pub(super) async fn open(endpoint: &str, place: &str, key: LeaseKey) -> Result<OpenedStore, Error> {
    let (listen, bind, folder) = member(endpoint)?;
    let members: Vec<String> = place.split(',').map(str::to_owned).collect();
    let url = StoreUrl::Raft {
        members,
        tls: false,
        key,
    };
    let options = OpenOptions::new()
        .with_raft_member(listen, folder)
        .with_raft_bind(bind);
    let give_up = Instant::now() + BIND_PATIENCE;
    loop {
        match leader::open(&url, &options).await {
            Err(e) if address_taken(&e) && Instant::now() < give_up => {
                tracing::warn!(error = %e, "the member's address is taken: trying again");
                tokio::time::sleep(BIND_PAUSE).await;
            }
            Err(e) => return Err(e),
            Ok(store) => return Ok((store.clone(), store)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_endpoint_names_the_member_and_its_folder() {
        let group = RaftGroup::new(Path::new("/tmp/round"), 3).await.unwrap();
        let (listen, bind, folder) = member(&group.endpoint(1)).unwrap();
        assert_eq!(group.place().split(',').nth(1), Some(listen.as_str()));
        assert_eq!(Some(bind.as_str()), group.proxies.bind(1));
        assert_ne!(bind, listen);
        assert_eq!(folder, Path::new("/tmp/round/raft-1"));
        assert!(member("127.0.0.1:1@/tmp/f").is_err());
        assert_eq!(group.place().split(',').count(), 3);
        assert!(member("127.0.0.1:1").is_err());
        assert!(group.endpoint(3).is_empty());
    }
}
