//! Leader election on storage you already have: the lease protocol, the elector, fencing
//! tokens, and the stores that need no cloud.
//!
//! Many identical instances campaign for one lease key; exactly one leads at a time. The
//! leader renews in the background and stops acting *before* its lease could have expired;
//! when it dies, a follower takes over after the lease's ttl; when it shuts down, it releases
//! the lease and a follower takes over at once. Every term carries a [`FencingToken`] higher
//! than every earlier term's, so a protected resource can reject a deposed leader's writes.
//!
//! Programs use it through the `leader` crate, which re-exports all of it and opens any store
//! from a URL. The protocol it implements, with its timing rules and defaults, is the
//! repository's `docs/protocol.md`.
//!
//! The pieces:
//! - [`LeaseBackend`]: the small contract a store implements (read; write if the revision
//!   still matches). [`MemoryStore`] and [`FileStore`] here; the stores of the suite are a
//!   local folder and memory (`leader-core`), Azure Blob (`leader-azure`), DynamoDB
//!   (`leader-dynamo`), Amazon S3 (`leader-s3`), Google Cloud Storage (`leader-gcs`), etcd
//!   (`leader-etcd`), ZooKeeper (`leader-zookeeper`)
//!   and a Raft group of the instances themselves (`leader-raft`).
//! - [`LeaseClient`]: the protocol over any backend (staleness on the local monotonic clock,
//!   tokens, recovery from lost responses), written once.
//! - [`Elector`]: campaigns, renews, steps down, releases, and publishes [`Leadership`];
//!   [`ShardedElector`]: one leader per shard, the shards balanced over the instances. Both
//!   hand each term to its work as a [`Term`].
//! - [`FencedStore`] and [`FenceGate`]: the resource side of fencing.
//! - [`metrics`]: what an election records through the `metrics` facade (who leads, terms,
//!   time without a leader, renew latency and slack, store requests), for any exporter.
//!
//! The root holds what users of an election need. What a backend author implements and uses
//! (the stored record and its revision, conditional writes, [`backend::FencedCas`] under
//! fenced writes, the one retry loop [`backend::Call`]) is in [`backend`].
//!
//! # Example
//!
//! Campaign, get the token, do fenced work, step down (on the in-memory store):
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use leader_core::{Elector, FencedStore, LeaseKey, MemoryStore, ObjectName};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MemoryStore::new();
//! let elector = Elector::builder(Arc::new(store.clone()), LeaseKey::new("scheduler")?)
//!     .ttl(Duration::from_secs(15))
//!     .build()?;
//! let handle = elector.spawn();
//!
//! // Wait until this instance leads.
//! let term = handle.wait_for_term().await?;
//! println!("leading with token {}", term.token());
//!
//! // Do the work of the term; a write that a newer term has overtaken is rejected.
//! let report = ObjectName::new("daily-report")?;
//! if term.is_valid() {
//!     store.fenced_write(term.fence(), &report, b"done").await?;
//! }
//! drop(term); // the work has stopped
//!
//! // Step down: the lease is released, and a follower may take over at once.
//! handle.shutdown().await;
//! # Ok(())
//! # }
//! ```

pub mod backend;
mod call;
mod campaign;
mod clock;
mod config;
mod elector;
mod error;
mod fence;
mod file;
mod lease;
mod memory;
pub mod metrics;
mod model;
pub mod quorum;
mod rand;
mod shard;
mod term;
mod token;

#[cfg(feature = "conformance")]
pub mod conformance;
#[cfg(feature = "simulation")]
pub mod simulation;
#[cfg(feature = "tls")]
pub mod tls;

pub use backend::{Fence, FencedObject, FencedStore, LeaseBackend};
pub use config::{Timing, TimingOverrides};
pub use elector::{
    Elector, ElectorBuilder, ElectorHandle, ElectorTask, Leadership, Problem, Stopped,
};
pub use error::{BoxError, ConfigError, Error, ErrorKind};
pub use fence::{FenceGate, StaleToken};
pub use file::{FileStore, FileStoreBuilder};
pub use lease::{Acquisition, Grant, LeaseClient, ObservedLeader, Renewal};
pub use memory::MemoryStore;
pub use metrics::StoreContact;
pub use model::{
    HolderId, LeaseKey, MAX_HOLDER_LEN, MAX_METADATA_BYTES, MAX_NAME_LEN, Metadata, ObjectName,
    validate_metadata, wall_clock_unix_ms,
};
pub use shard::{
    Assignment, MAX_SHARDS, MemberStatus, ShardSet, ShardStore, ShardTerms, ShardedElector,
    ShardedElectorBuilder, ShardedHandle, ShardedStatus, read_status,
};
pub use term::{Renewals, Term};
pub use token::FencingToken;
