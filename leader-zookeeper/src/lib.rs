//! Leader election on ZooKeeper: one ephemeral node per lease key, owned by a session of the
//! term that holds it, for the [`leader_core`] elector.
//!
//! # Workflow
//!
//! 1. Build a [`ZooKeeperStore`] for an ensemble and a parent node
//!    ([`ZooKeeperStore::builder`], or [`ZooKeeperBuilder::from_env`]). `build()` opens the
//!    store's shared session and checks the parent node, so that an unreachable ensemble or a
//!    missing node fails at startup with a clear error.
//! 2. Hand it to [`leader_core::Elector`], which campaigns, renews, steps down and releases.
//! 3. Use the term's fencing token, and [`FencedStore::fenced_write`](leader_core::FencedStore)
//!    for protected objects under the same parent node.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use leader_core::{Elector, FencedStore, LeaseKey, ObjectName};
//! use leader_zookeeper::ZooKeeperStore;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = ZooKeeperStore::builder()
//!     .with_hosts("zk1:2181,zk2:2181,zk3:2181")
//!     .with_path("/leader-lease")
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
//! - **Nodes.** The lease record of key `k` is the node `{path}/k` (`path` is the parent
//!   node, [`DEFAULT_PATH`] unless [`ZooKeeperBuilder::with_path`] says otherwise), its data
//!   the record's JSON ([`LeaseRecord::to_json`](leader_core::backend::LeaseRecord)). A
//!   protected object `name` is the persistent node `{path}/.name.fenced` (lease keys never
//!   start with `.`), its data [`encode_fenced`](leader_core::backend::encode_fenced) bytes.
//! - **Sessions.** The store keeps one *shared* session for reads, watches and protected
//!   objects; it holds no ephemeral node, and is replaced by a new one if it expires. Each
//!   *term* gets a session of its own, opened by its acquire with a session timeout equal to
//!   the lease's ttl, and authenticated (`digest`) as a random identity of that term.
//! - **Expiry is ZooKeeper's** ([`ExpiryModel::EnforcedByStore`](leader_core::backend::ExpiryModel)):
//!   the lease node is an *ephemeral* node of the term's session. A record reads as held only
//!   while it is an ephemeral node (a persistent node, such as a released record or one an
//!   operator wrote, reads as released), so a follower simply tries to acquire when the node
//!   is gone or released. The node goes away
//!   - when the term is released (at once),
//!   - a ttl after the last acquire or renew of the term was *sent*, answered or not (a
//!     watchdog task of the store deletes it and leaves the session: without it, the
//!     client's pings would keep a term whose holder stopped renewing alive forever). The
//!     holder stops acting at `sent + ttl - margin`, before that;
//!   - when the session expires: the holder's process died, hung or lost the ensemble for a
//!     session timeout (at least the ttl after its last write, since every write and ping
//!     touches the session). Dropping the store has the same effect: its term sessions are
//!     left to expire rather than closed, so that no node goes before a deadline its holder
//!     may still act on.
//!
//!   The negotiated session timeout must be at least the ttl: otherwise the acquire drops
//!   the session and fails with [`Error::InvalidConfig`](leader_core::Error) saying to raise
//!   the server's `maxSessionTimeout` (default 20 x `tickTime`, 40 s). A longer one (the
//!   server's `minSessionTimeout`, default 2 x `tickTime`) is accepted with a warning: a
//!   crashed holder's node then lasts that long. The ttl must be 1 s to about 24.8 days
//!   ([`MIN_TTL`], [`MAX_TTL`]).
//! - **Write ownership.** A lease node's ACL is `world:anyone` READ and `auth` ALL: only
//!   the term's own session may change it. This matters because ZooKeeper versions restart at
//!   0 when a node is recreated: a renew conditional on the version alone could overwrite the
//!   record of another term after an operator deleted ours. With the ACL, it is refused
//!   (`NoAuth`), and the renew is a conflict. Deleting needs DELETE on the parent, so a
//!   release, an operator, and the takeover of a released record all can.
//! - **Acquire** (absent record): the new session creates the ephemeral node; `NodeExists` is
//!   a conflict. **Acquire of a released record** (expected revision): after checking the
//!   node's `czxid`, one multi replaces it (`setData` at its version, `delete`, `create`);
//!   a node of a live term fails the `setData` (its ACL) and is a conflict. **Acquire of our
//!   own ended term's node**: that term's session deletes it (only it may), then the new
//!   session creates the new node. After a conflict the new session, which holds no node, is
//!   dropped.
//! - **Fencing tokens** are the node's `czxid`, the transaction id of its creation, which
//!   grows across the ensemble's whole history: the token rises from term to term, also after
//!   the node was deleted. The acquire writes the record a second time with the czxid as its
//!   token (the czxid is known only after the create), so readers see the term's token.
//!   A czxid below the token the core proposed (transaction ids went back: the ensemble was
//!   rebuilt, or a record with a higher token was written by hand) is refused with
//!   [`Error::InvalidConfig`](leader_core::Error) and the new node deleted: tokens never go
//!   down.
//! - **Revisions** are `{czxid}.{version}`, with `.released` appended for a record reported
//!   released; the czxid makes a recreated node's revision new although its version restarts.
//! - **Renew**: `setData` of the record at the expected version, through the term's session
//!   (which the write also keeps alive). `BadVersion` is a conflict (the core re-reads);
//!   `NoNode`, `NoAuth` and an expired session are a conflict that ends the term's session.
//! - **Release**: one multi through the term's session replaces the ephemeral node by a
//!   *persistent* node with the released record (the token stays readable, and anyone may
//!   take it at once); the term's session is then dropped.
//! - **Reads.** `read` is `sync` + `getData` on the shared session (a follower server may
//!   lag; `sync` makes the read see every write applied before it started). A follower's
//!   poll (`read_if_changed`) is `exists` alone while the revision is unchanged, `getData`
//!   when it changed, without `sync` (it may lag, which its contract allows).
//!   `read_for_term` reports a record held only if the node's `ephemeralOwner` is the term's
//!   session. An unparsable record is [`Error::MalformedRecord`](leader_core::Error) naming
//!   the key and node, and is never overwritten.
//! - **Watch.** [`changes`](leader_core::LeaseBackend::changes) sets a persistent watch
//!   (ZooKeeper 3.6+) on the lease node through the shared session and hints at every event,
//!   so a waiting follower reads at once after a release or an expiry instead of at its next
//!   poll.
//! - **Fenced writes.** A protected object's write is one multi through the shared session:
//!   a version check of the lease node (after checking that it is the fence's term's node:
//!   ephemeral, czxid = token; otherwise [`Error::Fenced`](leader_core::Error)) and the
//!   object's create (expected absent) or `setData` at the expected version. A renew between
//!   the two is a conflict, read again by the core's
//!   [`FencedStore`](leader_core::FencedStore). A put
//!   [without the lease check](leader_core::backend::FencedPut::without_lease_check) reads no
//!   lease node, and its multi is the object's write alone. (Deleting a protected object
//!   resets its fence, as in every store.)
//! - **Retries and timeouts.** Every call runs through the core's
//!   [`Call`](leader_core::backend::Call) and ends by the call's deadline. Reads are retried
//!   while the ensemble is unreachable; a conditional write is retried only if it was never
//!   sent (throttled, no server); a lost connection after sending is
//!   [`Error::Indeterminate`](leader_core::Error) and never sent again: the core re-reads.
//!   Connections and sessions are repaired by the client as far as ZooKeeper allows: a
//!   server restart or a move to another server of the ensemble keeps every session (and so
//!   every term) whose timeout has not passed. The client waits longer after each failed
//!   reconnect (100 ms, doubling), so after an outage of a few seconds a call that finds the
//!   shared session without a connection for a second opens a new one at once rather than
//!   wait for the client's next attempt; the watch moves to it. A term's session cannot be
//!   replaced (it owns the lease node): its holder depends on the client's reconnect until
//!   its deadline. After a server restart, a node whose holder is gone stays until its
//!   session times out, counted from the server's start: a follower takes over about a ttl
//!   after the servers are back.
//!
//! # Permissions and server requirements
//!
//! - The parent node's ACL must allow READ, CREATE and DELETE to the candidates without
//!   authentication (`world:anyone`, or an `ip:` ACL). The store authenticates each term
//!   session as a random `digest` identity of its own and nothing else; the nodes it creates
//!   carry their own ACLs (lease nodes as above; released records and protected objects
//!   `world:anyone` ALL).
//! - With [`ZooKeeperBuilder::with_create_path`], `build()` creates the parent node and
//!   its missing ancestors as persistent nodes open to everyone: the nearest existing
//!   ancestor must allow CREATE.
//! - ZooKeeper 3.6 or later (persistent watches; tested with 3.8.0), with ACLs enforced (not
//!   `zookeeper.skipACL=yes`: the store detects a renew that landed on another term's node
//!   and fails with [`Error::InvalidConfig`](leader_core::Error)), the `digest`
//!   authentication provider (on by default), and a `maxSessionTimeout` of at least the ttl.
//! - Node data is limited by the server's `jute.maxbuffer` (1 MB by default): protected
//!   objects must fit.
//! - Each term held by a process has a connection of its own (besides the store's shared
//!   one): a process that holds many leases at once may need a higher `maxClientCnxns` (60
//!   connections per client address by default). An acquire costs a connection, a session
//!   and three requests (a few round trips); a renew is one request; a waiting follower
//!   only reads.
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
mod client;
mod error;
mod multi;
mod session;
mod term;

pub use builder::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_PATH, HOSTS_VAR, PATH_VAR, ZooKeeperBuilder};
pub use client::{MAX_TTL, MIN_TTL, ZooKeeperStore};
