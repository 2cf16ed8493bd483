//! Leader election among identical instances that need no external store: the instances run a
//! small Raft group among themselves ([openraft](https://docs.rs/openraft) 0.9) and keep the
//! lease records in its replicated state, so the suite's lease protocol, fencing and
//! conformance suite apply unchanged.
//!
//! Each instance starts one member with the same member list ([`RaftConfig`]) and its own data
//! folder, then uses the member as its lease store. A one-member group, for example:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use leader_core::{LeaseBackend, LeaseKey};
//! use leader_raft::{RaftConfig, RaftStore};
//!
//! let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
//! let me = format!("127.0.0.1:{port}");
//! let dir = tempfile::tempdir()?;
//! let store = RaftStore::start(RaftConfig::new([me.clone()], me, dir.path().join("raft"))).await?;
//! let key = LeaseKey::new("nightly-report")?;
//! // Waits for the group to elect its Raft leader (here: itself), then reads linearizably.
//! let mut found = store.read(&key).await;
//! while found.is_err() {
//!     found = store.read(&key).await;
//! }
//! assert!(found?.is_none());
//! store.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! # Guarantees and limits
//! - Writes are committed by a quorum before they are answered; reads are linearizable (the
//!   leader confirms its leadership with a quorum, then reads its applied state). A member that
//!   is not the leader forwards both.
//! - A write whose answer was lost (a timeout, a broken connection, a leader change in flight)
//!   is [`Error::Indeterminate`](leader_core::Error::Indeterminate); a write refused before it
//!   was proposed (no leader reachable) is [`Error::Unavailable`](leader_core::Error::Unavailable).
//! - The member set is fixed at start; adding or removing members is not supported.
//! - **A member with an emptied folder does not rejoin silently.** A member that lost its
//!   folder forgets its vote and its log: voting as if new, it could vote twice in a term or
//!   help elect a leader that misses committed writes. So a member whose folder is empty asks
//!   every other member first (a new group forms only once all have answered) and refuses to
//!   start if the group knows it by another folder
//!   ([`RaftError::EmptyFolder`]). Started with [`RaftConfig::with_rejoin`], it joins instead,
//!   takes the highest term the others reported as its own, and neither votes nor starts an
//!   election until it holds everything the leader has committed in the leader's own term.
//!   Meanwhile the group has one member less: a three-member group then survives no further
//!   loss.
//!
//! The stores of the suite: a local folder and memory (`leader-core`), Azure Blob
//! (`leader-azure`), DynamoDB (`leader-dynamo`), Amazon S3 (`leader-s3`), Google Cloud Storage
//! (`leader-gcs`), etcd (`leader-etcd`), ZooKeeper (`leader-zookeeper`) and a Raft group of the
//! instances themselves (`leader-raft`). The `leader` crate opens any of them from a URL and
//! re-exports the whole API; the `leader` command (crate `leader-cli`) runs a program under
//! any of them.

#![forbid(unsafe_code)]

mod config;
mod error;
mod files;
mod join;
mod net;
mod state;
mod status;
mod storage;
mod store;
mod tls;

pub use config::{RaftConfig, RaftTiming, TlsConfig};
pub use error::RaftError;
pub use status::Status;
pub use store::RaftStore;
