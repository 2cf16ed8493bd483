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
//! `CreateTable` if you opt in to creating it).
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
//! let ttl = Duration::from_secs(15);
//! let store = DynamoBuilder::from_env()
//!     .await
//!     .with_table("leader-leases")
//!     // At most the elector's request timeout (ttl / 10, at most 2 s, by default).
//!     .with_request_timeout(Duration::from_millis(1500))
//!     .build()
//!     .await?;
//! let elector = Elector::builder(Arc::new(store.clone()), LeaseKey::new("scheduler")?)
//!     .ttl(ttl)
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
//! raised only when a new term begins, in the same conditional write), `ttl_ms` (N, a
//! duration, never an absolute time), `state` (`held` / `released`), `meta` (M of S),
//! `nonce` (S, random per write) and two informational wall-clock stamps. The core's
//! revision is `<rev>.<nonce>`, and a write expecting it is conditional on both attributes,
//! so a revision is never reused even if an operator deletes and recreates the item.
//! Every write is an `UpdateItem` with `ReturnValues=ALL_NEW` and
//! `ReturnValuesOnConditionCheckFailure=ALL_OLD`, so a conflict reports the current holder
//! without a second read, and an item that is exactly our write is recognised as ours.
//! Protected objects are items `fenced#<name>` with `fence` (N), `value` (B) and
//! `object_rev` (S). DynamoDB's TTL deletion is not used.
//!
//! # Requests and timeouts
//!
//! The SDK's own retries are disabled on every call; each call is bounded by the store's
//! request timeout, retries included. Reads retry throttling and unavailability with a short,
//! capped, jittered backoff; conditional writes retry only what DynamoDB rejected without
//! applying (throttling), and report everything ambiguous (a timeout, a lost connection, a
//! 5xx) as [`leader_core::Error::Indeterminate`], so the core re-reads instead of writing
//! again.
//!
//! # Features
//!
//! - `from-env` (default): [`DynamoBuilder::from_env`], through `aws-config` with a rustls
//!   (ring) HTTPS client. Without it, this crate compiles no TLS stack: pass your own
//!   `aws_sdk_dynamodb::Client` to [`DynamoBuilder::with_client`].

mod builder;
mod client;
mod error;

pub use builder::DynamoBuilder;
pub use client::{DynamoStore, LEASE_PREFIX, MARK_PREFIX, OBJECT_PREFIX};
