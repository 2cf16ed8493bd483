//! Leader election on Amazon S3 conditional writes, for the leader-lease suite: one object per
//! lease key, written with `If-None-Match: *` and `If-Match: <ETag>`, for the
//! [`leader_core`] elector.
//!
//! # Workflow
//!
//! 1. Build an [`S3Store`] for a bucket ([`S3Builder::from_env`] for the default AWS
//!    credential chain, or [`S3Builder::with_emulator`]). [`S3Builder::build`] reads one object
//!    that need not exist, so that a missing bucket ([`Error::NotFound`](leader_core::Error)),
//!    a bucket in another region, refused credentials or a missing permission fail at start.
//! 2. Hand it to [`leader_core::Elector`], which campaigns, renews, steps down and releases.
//! 3. Use the term's fencing token, and [`FencedStore::fenced_write`](leader_core::FencedStore)
//!    for objects in the same bucket that only the leader may change.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use leader_core::{Elector, FencedStore, LeaseKey, ObjectName};
//! use leader_s3::S3Builder;
//!
//! # #[cfg(not(feature = "from-env"))] fn main() {}
//! # #[cfg(feature = "from-env")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // On EC2, ECS or EKS: the instance profile, task role or web identity.
//! let store = S3Builder::from_env()?
//!     .with_bucket("my-leases")
//!     .with_prefix("prod/")
//!     .build()
//!     .await?;
//! let elector = Elector::builder(Arc::new(store.clone()), LeaseKey::new("scheduler")?)
//!     .ttl(Duration::from_secs(15))
//!     .build()?;
//! let handle = elector.spawn();
//!
//! let term = handle.wait_for_term().await?;
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
//! # Permissions
//!
//! `s3:GetObject` and `s3:PutObject` on the objects under the prefix, and `s3:ListBucket` on
//! the bucket (it may be limited to the prefix with an `s3:prefix` condition). Without
//! `s3:ListBucket`, S3 answers 403 instead of 404 for an object that does not exist, so a
//! first election (or a deleted record) would read as a permission error. Nothing is ever
//! deleted, listed or copied by this crate.
//!
//! # How the store works
//!
//! - **Records.** The lease of key `k` is the object `<prefix>k` (no prefix by default; the
//!   `leader` crate's `s3://BUCKET/FOLDER/KEY` is the object `FOLDER/KEY`, as the console
//!   shows it), its body the record's JSON with one more field, `s3_write`, a write id. The
//!   revision is the object's ETag. A write is one `PutObject` with `If-None-Match: *` (create)
//!   or `If-Match` on the ETag read (take over, renew, release: a release is an overwrite that
//!   marks the record released, never a delete, so no conditional delete is needed). 412, and
//!   404 on `If-Match` (the object was deleted), are a conflict.
//! - **Every write's bytes are unique.** S3's ETag of a single-part upload is the MD5 of its
//!   bytes, so two writes of the same bytes would have the same ETag, and a follower that saw
//!   the ETag "unchanged" for a ttl could take over from a leader that renewed. The write id
//!   (a random 64-bit origin per store and a counter) makes every body differ; protected
//!   objects carry it on a first line of their own.
//! - **Fencing tokens.** S3 has no number that grows with the object (version ids are opaque,
//!   `LastModified` is a clock), so each key has a **token high-water mark**, the object
//!   `<prefix>.<key>.token` holding the highest token ever granted. Every acquire first raises
//!   it, by `If-Match` (or `If-None-Match: *`) on the mark it read, to the proposed token or one
//!   above the mark if that is higher, and only then writes the lease, always by `If-Match` on
//!   an ETag it read: an acquire of an absent record first creates a *released* placeholder
//!   (`If-None-Match: *`) and takes that. Why: an ETag is new, absence is not (an operator can
//!   delete the object again). A term's write on ETag `e` lands only if `e` came after every
//!   earlier term's lease write, and the term read the mark after `e` existed, so after every
//!   earlier term raised it: tokens strictly increase, also after an operator deletes the lease
//!   object, even while a create is held in flight. (Deleting the mark as well loses that
//!   memory: the next token is then one above the lease's, or 1.) A takeover costs one GET and
//!   two PUTs (three on an absent record); renews and releases are one PUT and keep the token.
//! - **Followers** poll with `GetObject` and `If-None-Match: <ETag>`, which S3 answers 304
//!   without a body while the record is unchanged (one GET request either way, billed at the
//!   GET rate). A follower takes over only after it has seen the same ETag for a full ttl on its
//!   own clock; nothing compares S3's `LastModified` with a local clock.
//! - **Retries and timeouts.** The SDK's retries are off; every call runs through the core's
//!   one retry loop ([`leader_core::backend::Call`]), bounded, retries included, by the
//!   elector's request timeout for that call. Reads retry throttling (503 `SlowDown`, 429), 5xx
//!   and transport failures. Writes retry only what was not applied: throttling, and 409
//!   `ConditionalRequestConflict` (S3: a concurrent request won and this one was not applied;
//!   the retry carries the same condition). A write that may have landed (no answer in time, a
//!   lost connection, any other 5xx) is [`Error::Indeterminate`](leader_core::Error) at once and
//!   never sent again: the core re-reads and recognises its own write by holder and nonce.
//! - **Fenced writes.** A protected object `<prefix>.<name>.fenced` holds a write-id line, a
//!   fence line and the value; a fenced write reads it, refuses if its fence is above the
//!   writer's token, and writes on the ETag it read (the core's
//!   [`leader_core::FencedStore`] over this crate's [`leader_core::backend::FencedCas`]).
//!   Unlike DynamoDB, S3 has no transaction across two objects, so the write cannot also check
//!   that the lease is still the writer's: a deposed leader that has not yet seen a newer term
//!   may still write, as long as no newer term has written the object. Once a newer term has,
//!   the object's fence is above the old token and every write of the old term is refused, and
//!   a write of the old term that raced it is refused by the ETag condition. An object that is
//!   deleted loses its fence: the next write creates it again with any token (as on GCS).
//! - **Never restore an older version of a lease or mark object** (from a versioned bucket or a
//!   backup): an old version brings back an old ETag, which a write held in flight may still
//!   expect. Delete the object instead; the next acquire starts over above the mark.
//! - **Buckets.** Unversioned buckets are best. A versioned bucket works (conditions apply to
//!   the current version), but keeps every renew as a version: add a lifecycle rule that
//!   expires noncurrent versions under the prefix. A bucket with Object Lock works too (the SDK
//!   sends a checksum with every put), but a default retention keeps every renew as a locked
//!   version that no lifecycle rule can expire until the retention ends: do not apply one to
//!   the lease prefix. This crate never creates buckets.
//! - **S3-compatible stores** must implement `If-None-Match: *` and `If-Match` on `PutObject`
//!   atomically; one that answers 501 is refused with
//!   [`Error::InvalidConfig`](leader_core::Error). One that accepts the headers and ignores
//!   them cannot be detected by a client and is not safe.
//!
//! # The suite
//!
//! The stores of the suite: a local folder and memory (`leader-core`), Azure Blob
//! (`leader-azure`), DynamoDB (`leader-dynamo`), Amazon S3 (`leader-s3`), Google Cloud Storage
//! (`leader-gcs`), etcd (`leader-etcd`), ZooKeeper (`leader-zookeeper`)
//! and a Raft group of the instances themselves (`leader-raft`). The `leader` crate
//! opens any of them from a URL and re-exports the whole API; the `leader` command (crate
//! `leader-cli`) runs a program under any of them. The protocol they share is the repository's
//! `docs/protocol.md`.

mod builder;
mod client;
mod error;

pub use builder::{BUCKET_VAR, PREFIX_VAR, S3Builder};
pub use client::S3Store;
