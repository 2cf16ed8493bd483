//! Leader election on DynamoDB conditional writes, for the leader-lease suite.
//!
//! The workflow: build a [`DynamoStore`] on a table (the table check runs at
//! [`build`](DynamoBuilder::build)), hand it to a [`leader_core::Elector`], wait for a term,
//! do the term's work with its fencing token (fenced writes to items of the same table go
//! through [`FencedStore::fenced_write`](leader_core::FencedStore::fenced_write), a
//! `TransactWriteItems` that also checks the lease), and shut down, which releases the lease
//! so that a follower takes over at once.
//!
//! # Example: an EC2 instance with an instance profile
//!
//! Credentials come from the instance profile through `aws-config`'s default chain (IMDSv2);
//! the region from `AWS_REGION` or the instance metadata. The role needs
//! `dynamodb:GetItem`, `UpdateItem`, `ConditionCheckItem`, `DescribeTable` on the table (and
//! `CreateTable` if you opt in to creating it); the transactions of acquires and fenced
//! writes are authorised by `UpdateItem` and `ConditionCheckItem` on their items.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use leader_core::{Elector, FencedStore, LeaseKey, ObjectName};
//! use leader_dynamo::DynamoBuilder;
//!
//! # #[cfg(not(feature = "from-env"))] fn main() {}
//! # #[cfg(feature = "from-env")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = DynamoBuilder::from_env()?
//!     .with_table("leader-leases")
//!     .build()
//!     .await?;
//! let elector = Elector::builder(Arc::new(store.clone()), LeaseKey::new("scheduler")?)
//!     // Every store call ends by the request timeout (ttl / 10, at most 2 s, by default).
//!     .ttl(Duration::from_secs(15))
//!     .build()?;
//! let handle = elector.spawn();
//!
//! let term = handle.wait_for_term().await?;
//! // A write that only this term's leader can make: rejected with `Error::Fenced` once a
//! // newer term has begun.
//! store
//!     .fenced_write(term.fence(), &ObjectName::new("daily-report")?, b"done")
//!     .await?;
//! drop(term);
//!
//! handle.shutdown().await; // releases the lease
//! # Ok(())
//! # }
//! ```
//!
//! # The items
//!
//! One item per lease key, with partition key `lease#<key>` (attribute `pk` by default, a
//! string), and the attributes `holder` (S), `rev` (N, bumped by every write), `token` (N,
//! raised only when a new term begins), `ttl_ms` (N, a duration, never an absolute time),
//! `state` (`held` / `released`), `meta` (M of S), `nonce` (S, random per write) and two
//! informational wall-clock stamps. The core's revision is `<rev>.<nonce>`, and a write
//! expecting it is conditional on both attributes, so a revision is never reused even if an
//! operator deletes and recreates the item.
//!
//! Beside it, one **token high-water mark** per lease key: partition key `mark#<key>`
//! ([`MARK_PREFIX`]), attribute `high` (N), the highest fencing token any term of the key
//! ever had. It only ever rises: every acquire is one `TransactWriteItems` that writes the
//! lease item (on its condition) and sets `high` to the new token on condition that the mark
//! is absent or a number below it. If only the mark's condition fails, the lease item lost
//! its history (it was deleted): the store raises the token above the mark and sends the
//! transaction again (the cancelled one applied nothing), and the core takes the raised
//! token. So a term's token is above every earlier one even after the lease item is deleted.
//!
//! Renews and releases keep the token and do not touch the mark: each is one `UpdateItem`
//! with `ReturnValues=ALL_NEW` and `ReturnValuesOnConditionCheckFailure=ALL_OLD`, so a
//! conflict reports the current holder without a second read. Every failed lease condition
//! returns the item, and an item that is exactly our write is recognised as ours.
//! Protected objects are items `fenced#<name>` with `fence` (N), `value` (B) and
//! `object_rev` (S, a random revision set by every write). A fenced write reads the object,
//! and the core refuses it if the object's fence is above the writer's token; otherwise one
//! `TransactWriteItems` checks that the lease item still has the writer's holder and token
//! and updates the object on condition that its `object_rev` is the one read (or that it is
//! absent). The revision, not the fence, makes the write conditional, so a write of a term
//! delivered late cannot undo a later acknowledged write of the same term. A write without
//! the lease check
//! ([`FencedPut::without_lease_check`](leader_core::backend::FencedPut::without_lease_check),
//! for an election over several stores) is one `UpdateItem` of the object item with the same
//! update and condition, and no transaction. DynamoDB's TTL deletion is not used; do not
//! enable it on these items.
//!
//! Requests, per lease key: an acquire is a consistent `GetItem` and one
//! `TransactWriteItems` of two items (2 write units each, 4 in all, where a plain
//! `UpdateItem` costs 1), plus one more transaction right after the lease item was deleted;
//! a renew or a release is one `UpdateItem` (1 write unit); a waiting follower's poll (every
//! 500 ms by default) is one *eventually consistent* `GetItem` (half a read unit): about
//! 7,000 polls, 3,500 read units an hour. That is safe although a replica may lag: a follower
//! starts its ttl for a revision when a response first shows it, which is after the write
//! that made it was sent, and its takeover is a conditional write that DynamoDB checks
//! against the latest item.
//!
//! # What an operator may delete
//!
//! - **The lease item** `lease#<key>`: the usual way to clear a stuck lease. The holder
//!   loses its term at its next renew (the renew finds no item) and its fenced writes are
//!   rejected at once (they check the lease item); a candidate may acquire at once, and its
//!   token is above every earlier one (from the mark).
//! - **The mark alone** `mark#<key>`, while the lease item is there: harmless; the next
//!   acquire mints above the lease item's token and writes the mark again.
//! - **Both** (or the mark, then the lease item before any acquire rewrote the mark), the
//!   whole table, or a restore of an older backup: **tokens start over** (from 1, or from the
//!   backup's values). Do it only with every protected resource reset too, or for a key that
//!   is retired. To repair a damaged mark (reported as a malformed record naming the mark
//!   item), set `high` to a number at least the highest token ever issued for the key.
//! - A protected object `fenced#<name>`: its fence goes with it, but a fenced write also
//!   checks the lease item, so only the current holder can write it again.
//!
//! Lease items written by an older version of this crate have no mark yet; the first
//! acquire writes it, and from then on the lease item may be deleted safely.
//!
//! # Requests and timeouts
//!
//! The SDK's own retries are disabled on every call; each call runs through the core's one
//! retry loop ([`leader_core::backend::Call`]), bounded by the elector's request timeout for
//! that call ([`leader_core::Timing`]), retries included. Reads and writes retry only what DynamoDB rejected without applying
//! (throttling, a concurrent transaction, credentials not yet loaded), with a short, capped,
//! jittered backoff; everything ambiguous in a write (a timeout, a lost connection, a 5xx) is
//! [`leader_core::Error::Indeterminate`], so the core re-reads instead of writing again.
//!
//! # Features
//!
//! - `from-env` (default): [`DynamoBuilder::from_env`], through `aws-config` with a rustls
//!   (ring) HTTPS client. Without it, this crate compiles no TLS stack: pass your own
//!   `aws_sdk_dynamodb::Client` to [`DynamoBuilder::with_client`].
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
mod item;
mod table;

pub use builder::DynamoBuilder;
pub use client::DynamoStore;
pub use item::{LEASE_PREFIX, MARK_PREFIX, OBJECT_PREFIX};
