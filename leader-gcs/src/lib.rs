//! Leader election on Google Cloud Storage: one object per lease key, written with generation
//! preconditions, for the [`leader_core`] elector.
//!
//! # Workflow
//!
//! 1. Build a [`GcsStore`] for a bucket ([`GcsStore::builder`], or [`GcsBuilder::from_env`]).
//!    Credentials are Application Default Credentials: the instance's service account on
//!    GCE, GKE workload identity, Cloud Run, or `GOOGLE_APPLICATION_CREDENTIALS`. The
//!    identity needs `storage.objects.get` and `storage.objects.create` +
//!    `storage.objects.delete` (overwrite) on the bucket, e.g. `roles/storage.objectUser`.
//! 2. Hand it to [`leader_core::Elector`], which campaigns, renews, steps down and releases.
//! 3. Use the term's fencing token, and [`FencedStore::fenced_write`](leader_core::FencedStore)
//!    for objects in the same bucket that only the leader may change.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use leader_core::{Elector, FencedStore, LeaseKey, ObjectName};
//! use leader_gcs::GcsStore;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // On a GCE instance: the metadata server gives the instance's service account a token.
//! let store = GcsStore::builder().with_bucket("my-project-leases").build().await?;
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
//! Against an emulator (fake-gcs-server), [`GcsBuilder::with_emulator`] sets the endpoint and
//! anonymous credentials (the SDK does not read `STORAGE_EMULATOR_HOST`, and without
//! anonymous credentials it would wait for a metadata server). [`GcsBuilder::build`] asks the
//! credentials for a token once and reads the bucket once, so that a machine without usable
//! credentials fails at startup with [`Error::Unauthenticated`](leader_core::Error), and a
//! missing bucket with [`Error::NotFound`](leader_core::Error).
//!
//! # How the store works
//!
//! - **Records.** The lease of key `k` is the object `<prefix>k` (no prefix by default; the
//!   `leader` crate's `gs://BUCKET/FOLDER/KEY` is the object `FOLDER/KEY`), its body the record's JSON ([`LeaseRecord::to_json`](leader_core::backend::LeaseRecord)),
//!   its generation the revision. Writes are multipart uploads (`Storage::write_object`) with
//!   `ifGenerationMatch`: 0 to create, the observed generation to take over, renew or release
//!   (a release is an overwrite that marks the record released, not a delete). HTTP 412 is a
//!   conflict. Reads are `Storage::read_object`. Nothing else of the API is used.
//! - **Fencing tokens.** An acquire conditional on generation `g` stores a token of at least
//!   `g + 1`. An acquire of an absent object first creates a *released* placeholder, then
//!   writes the held record on the placeholder's generation with a token above it. GCS
//!   generations are microsecond timestamps (documented only as unique), so each token is at
//!   most the generation of the write that began its term, and a deleted and recreated object
//!   still yields tokens above every earlier one. Renews and releases keep the token.
//! - **Rate.** GCS accepts about one write per second to one object name, so
//!   `check_timing` rejects `renew_every` below 1 s. Followers only read: a waiting
//!   follower's poll (every 500 ms by default) is one `read_object` with
//!   `ifGenerationNotMatch` set to the generation it last saw, which GCS answers with 304 and
//!   no body while the record is unchanged (one class B operation either way; an emulator
//!   that ignores the condition sends the object, and the generation is compared instead).
//! - **Retries and timeouts.** The SDK's retries are off (its default policy retries for up
//!   to 300 s and repeats conditional writes); every call runs through the core's one retry
//!   loop ([`leader_core::backend::Call`]), bounded, retries included, by the elector's
//!   request timeout for that call ([`leader_core::Timing`]). Reads retry 429, 5xx and transport
//!   failures; writes retry only what was not applied (429, a connection that was never
//!   made). A write that may have landed (no answer in time, a lost connection, a 5xx) is
//!   [`Error::Indeterminate`](leader_core::Error) at once and never sent again: the core
//!   re-reads and recognises its own write by holder and nonce.
//! - **Fenced writes.** A protected object `<prefix>.<name>.fenced` holds a fence line and the
//!   value; a fenced write reads it, refuses if its fence is above the writer's token, and
//!   uploads on the generation it read (the core's [`leader_core::FencedStore`] over this
//!   crate's [`leader_core::backend::FencedCas`]).
//! - **Bucket.** A missing bucket is [`Error::NotFound`](leader_core::Error) naming it (GCS says
//!   so on reads; fake-gcs-server only on the first write). This crate does not create
//!   buckets.
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

pub use builder::{BUCKET_VAR, DEFAULT_PREFIX, EMULATOR_VAR, GcsBuilder, PREFIX_VAR};
pub use client::{GcsStore, MIN_RENEW_EVERY};
