//! Leader election on Azure Blob Storage leases, for the leader-lease suite.
//!
//! The workflow: every instance builds an [`AzureLeaseStore`] on the same container, hands it to
//! a [`leader_core::Elector`] for a lease key, and waits for a term. One blob per key holds
//! the lease record; instances race to take the blob's lease (15 to 60 s, granted and expired
//! by the service), and the winner writes the new term's fencing token into the blob with its
//! lease id before it reports itself leader. The leader renews every `renew_every` (half the
//! ttl by default); when it dies, the service lets the lease expire and the next instance's
//! acquire succeeds; on shutdown it marks the record released and gives the lease back, so a
//! follower takes over at once. Tokens keep growing even if an operator deletes the blob (a
//! high-water mark is kept beside it).
//!
//! # On a VM with a managed identity
//!
//! Give the VM's identity the *Storage Blob Data Contributor* role on the container, then:
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use leader_azure::AzureLeaseStoreBuilder;
//! use leader_core::{Elector, LeaseKey};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = AzureLeaseStoreBuilder::new()
//!     .with_account("mystorageaccount")
//!     .with_container("leases")
//!     .with_managed_identity(None) // the system-assigned identity
//!     .build() // checks the container: a missing one fails here
//!     .await?;
//!
//! let elector = Elector::builder(Arc::new(store), LeaseKey::new("scheduler")?)
//!     .ttl(Duration::from_secs(15)) // Azure leases last 15 to 60 s
//!     .build()?;
//! let handle = elector.spawn();
//!
//! let term = handle.wait_for_term().await?;
//! // Pass the token to whatever the leader writes, so that a deposed leader is rejected.
//! let token = term.token();
//! # let _ = token;
//! term.cancelled().await; // leadership lost: stop the work
//! drop(term);
//! handle.shutdown().await; // release the lease on the way out
//! # Ok(())
//! # }
//! ```
//!
//! [`AzureLeaseStoreBuilder::from_env`] reads `AZURE_STORAGE_*` variables instead (a connection
//! string, an account key or SAS, or else workload / managed identity), and
//! [`AzureLeaseStoreBuilder::with_emulator`] points at Azurite.
//!
//! # Requests per operation
//!
//! On the lease blob `KEY` (plus the token blob `.KEY.token` when a term starts):
//! - **Waiting follower, every poll** ([`leader_core::Timing::poll_every`], 500 ms by
//!   default): one Get Blob Properties (`HEAD`: ETag, lease state and metadata, no body). Only
//!   when the ETag or the lease state differs from the follower's last look does it also
//!   download the record with one Get Blob (a few hundred bytes). A leader's renew writes
//!   the record, so with the defaults (ttl 15 s, renew every 5 s, polls every 500 to 550 ms)
//!   a follower of a live leader sends about 6,850 Get Blob Properties and 720 Get Blob an
//!   hour (measured against Azurite: 6,840 and 720), where a poll used to be a Get Blob
//!   every time. A lease that expires or that an
//!   operator breaks changes the lease state but not the ETag: the next poll sees it, downloads
//!   the record and reports it released. A follower does not write while the lease is live.
//!   Azure bills Get Blob Properties as an "other" operation and Get Blob as a "read"
//!   (general-purpose v2 and premium block blob accounts; a v1 account bills both as reads),
//!   and only Get Blob reads data (per-GB retrieval on cool and colder tiers). A conditional
//!   Get Blob (`If-None-Match`, 304 when the ETag is the same) would not do: a 304 carries no
//!   lease state (none documented by Azure, none sent by Azurite), so it cannot tell an
//!   expired or broken lease from a live one.
//! - **Acquire**: Lease Blob (acquire; with Put Blob first if the blob does not exist), Get
//!   Blob and Put Blob of the token blob, Put Blob of the record with the lease id.
//! - **Renew**: Lease Blob (renew), Put Blob of the record with the lease id.
//! - **Release**: Put Blob of the released record, Lease Blob (release).
//! - **`read`** (status, and the core's re-read after a lost answer): one Get Blob.
//!
//! # Guarantees and limits
//! - Every call ends by the elector's request timeout for it ([`leader_core::Timing`]: ttl / 10,
//!   1.5 s for the 15 s ttl), connection and token requests included, and the SDK does
//!   not retry: reads and fenced uploads go through the core's one retry loop
//!   ([`leader_core::backend::Call`]: throttling and unavailability only), and the lease
//!   logic in `leader-core` decides what else to retry (the one exception, the lease call of
//!   an acquire, is below). A write whose answer
//!   is lost is reported as indeterminate and resolved by re-reading with the term's lease id:
//!   the write counts only if the blob's lease is still that term's.
//! - A lease call whose answer is lost is asked again with the same lease id (the service
//!   grants the active lease to its own id again) within the request timeout; if no attempt
//!   is answered, or the acquire fails after the lease was taken, the lease is released
//!   (conditional on the blob being unchanged, so a record written with it keeps it). A lease
//!   call that reaches the service only after that release can still hold the blob until its
//!   lease expires.
//! - Lease durations other than 15 to 60 whole seconds are rejected when the elector is
//!   built ([`leader_core::LeaseBackend::check_timing`]).
//! - Fenced writes to other blobs ([`leader_core::FencedStore`]) keep the writer's token in
//!   the blob's metadata and write with `If-Match` on the ETag read (`If-None-Match: *` for a
//!   new blob), so a lower token never overwrites a higher one, and a late upload never
//!   overwrites a later one.
//!
//! # The suite
//!
//! The stores of the suite: a local folder and memory (`leader-core`), Azure Blob
//! (`leader-azure`), DynamoDB (`leader-dynamo`), Amazon S3 (`leader-s3`), Google Cloud Storage (`leader-gcs`), etcd
//! (`leader-etcd`), ZooKeeper (`leader-zookeeper`)
//! and a Raft group of the instances themselves (`leader-raft`). The `leader` crate opens any of them
//! from a URL and re-exports the whole API; the `leader` command (crate `leader-cli`) runs a
//! program under any of them. The protocol they share is the repository's `docs/protocol.md`.

mod auth;
mod builder;
mod client;
mod error;

#[cfg(feature = "test-util")]
pub use auth::SharedKeySigner;
pub use azure_identity::UserAssignedId;
pub use builder::{AzureLeaseStoreBuilder, EMULATOR_ACCOUNT, EMULATOR_ENDPOINT, EMULATOR_KEY};
pub use client::{AzureLeaseStore, MAX_LEASE_SECS, MIN_LEASE_SECS};
