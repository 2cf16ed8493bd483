//! Leader election on etcd: one key per lease, attached to an etcd lease that the cluster
//! expires by itself, for the [`leader_core`] elector.
//!
//! # Workflow
//!
//! 1. Build an [`EtcdStore`] with the cluster's endpoints ([`EtcdStore::builder`], or
//!    [`EtcdBuilder::from_env`]), and a user if the cluster has auth enabled.
//! 2. Hand it to [`leader_core::Elector`], which campaigns, renews, steps down and releases.
//! 3. Use the term's fencing token, and [`FencedStore::fenced_write`](leader_core::FencedStore)
//!    for keys in the same cluster that only the leader may change.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use leader_core::{Elector, FencedStore, LeaseKey, ObjectName};
//! use leader_etcd::EtcdStore;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = EtcdStore::builder()
//!     .with_endpoints(["http://etcd-0:2379", "http://etcd-1:2379", "http://etcd-2:2379"])
//!     .build()
//!     .await?;
//! let elector = Elector::builder(Arc::new(store.clone()), LeaseKey::new("scheduler")?)
//!     .ttl(Duration::from_secs(15))
//!     .build()?;
//! let handle = elector.spawn();
//!
//! let term = handle.wait_for_term().await?;
//! println!("leading with token {}", term.token());
//! if term.is_valid() {
//!     let report = ObjectName::new("daily-report")?;
//!     store.fenced_write(term.fence(), &report, b"done").await?;
//! }
//! drop(term);
//! handle.shutdown().await; // releases the lease: a follower takes over at once
//! # Ok(())
//! # }
//! ```
//!
//! # How the store works
//!
//! - **Keys.** The lease of key `k` is the etcd key `<prefix>k` (prefix `leader-lease/` by
//!   default; the `leader` crate's `etcd://HOST:PORT/FOLDER/KEY` is the key `FOLDER/KEY`),
//!   its value the record's JSON ([`LeaseRecord::to_json`](leader_core::backend::LeaseRecord)).
//!   A protected object `name` is the key `<prefix>.name.fenced`.
//! - **Expiry is etcd's** ([`ExpiryModel::EnforcedByStore`](leader_core::backend::ExpiryModel)).
//!   Each term grants an etcd lease of `ttl` (rounded up to whole seconds, etcd's unit) with
//!   an id derived from the term, and attaches the key to it. etcd deletes the key when the
//!   lease ends, so a key attached to a lease is a live term: a follower tries to take the
//!   key only once it is gone or released. A lease starts or restarts when the etcd
//!   leader receives the grant or keep-alive, after the holder sent it, so it never ends
//!   before the holder's deadline (`send time + ttl - margin`).
//! - **Acquire** is a grant and a transaction that creates the key if it does not exist
//!   (`create_revision == 0`). The record of an ended term, or a key without a lease, is first
//!   deleted in a transaction compared on its `mod_revision`.
//! - **Renew** is a keep-alive of the term's lease, then a transaction that rewrites the record
//!   if its `mod_revision` is still the one this term wrote (revisions are unique across the
//!   cluster, so this also proves that the key is still the term's): two requests.
//! - **Release** rewrites the record as released, detached from any lease, in a transaction
//!   compared on the term's `mod_revision` (so `status` still shows who led, with its token),
//!   then revokes the term's lease. A key without a lease reads as released, and the next
//!   acquire deletes and recreates it (a new create revision: a new token).
//! - **Fencing tokens** are the key's `create_revision`: the cluster-wide revision of the
//!   transaction that began the term. etcd's revision never goes back, also when keys are
//!   deleted or compacted, so every term's token is above every earlier one by construction.
//!   (The token inside the stored JSON is the core's proposal; reads report the create
//!   revision.) A cluster restored from an old snapshot would break that; an acquire that
//!   sees its revision below a token already seen refuses with a clear error.
//! - **Followers** poll with serializable reads (served by the member they ask, without a
//!   quorum round), and a watch on the key wakes them the moment it is deleted, so a release
//!   or an expiry is acted on within one round trip; the poll stays as the safety net.
//! - **Fenced writes** are transactions that compare the object's `mod_revision` (or its
//!   absence) *and* that the lease key still exists with the writer's token as its create
//!   revision: a deposed leader's write is refused with
//!   [`Error::Fenced`](leader_core::Error) even before a new leader wrote the object. A put
//!   [without the lease check](leader_core::backend::FencedPut::without_lease_check) compares
//!   the object alone.
//! - **Retries and timeouts.** Every call runs through the core's one retry loop
//!   ([`leader_core::backend::Call`]), bounded by the elector's request timeout, and sends
//!   that deadline to etcd (`grpc-timeout`). A transaction whose answer is lost is
//!   [`Error::Indeterminate`](leader_core::Error) and never sent again; the core re-reads,
//!   and recognises its own write only while the key is attached to its term's lease.
//! - **Permissions.** With auth enabled, the user needs a role with `readwrite` on the range
//!   of the prefix (`etcdctl role grant-permission ROLE readwrite --prefix=true leader-lease/`)
//!   and the lease API (any authenticated user may grant and revoke leases).
//! - **Which etcd.** 3.3 or later. On clusters of several members, prefer 3.4.31, 3.5.13,
//!   3.6 or later: older releases can revoke a lease early when a stuck old leader wakes up
//!   after a leader change (etcd-io/etcd#15247), which breaks the rule above; [`EtcdBuilder::build`]
//!   warns on them.
//! - **No `protoc`.** The few etcd v3 messages used are declared in this crate (the wire
//!   contract is etcd's `rpc.proto`), so building needs no protobuf compiler.
//!
//! # The suite
//!
//! The stores of the suite: a local folder and memory (`leader-core`), Azure Blob
//! (`leader-azure`), DynamoDB (`leader-dynamo`), Amazon S3 (`leader-s3`), Google Cloud Storage (`leader-gcs`), etcd
//! (`leader-etcd`), ZooKeeper (`leader-zookeeper`)
//! and a Raft group of the instances themselves (`leader-raft`). The `leader` crate opens any of them
//! from a URL and re-exports the whole API; the `leader` command (crate `leader-cli`) runs a
//! program under any of them. The protocol they share is the repository's `docs/protocol.md`.

mod builder;
mod error;
mod rpc;
mod store;
mod wire;

pub use builder::{
    CA_FILE_VAR, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX, ENDPOINTS_VAR, EtcdBuilder, PASSWORD_VAR,
    PREFIX_VAR, USER_VAR,
};
pub use store::EtcdStore;
