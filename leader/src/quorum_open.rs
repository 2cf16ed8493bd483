//! Opening an election over several stores from their URLs. A member that cannot be reached
//! when the quorum is opened does not stop the candidate: it is opened at its first call that
//! finds it reachable (an election over a quorum survives the outage of a minority of its
//! stores, also across a restart of the candidate).

use std::sync::Arc;

use async_trait::async_trait;
use leader_core::backend::{
    FencedCas, FencedObject, FencedPut, ObjectWrite, Stored, WriteOutcome, WriteRequest,
};
use leader_core::quorum::{Quorum, QuorumMember};
use leader_core::{ConfigError, Error, LeaseBackend, LeaseKey, ObjectName, ShardStore};
use tokio::sync::OnceCell;
use tracing::warn;

use crate::{OpenOptions, Store, StoreUrl, open};

/// Parses `urls` (3, 5, 7 or 9 store URLs that end with the same lease key), opens each
/// store, and returns the quorum over them with the key. Each member is named by its URL (as
/// [`StoreUrl`] prints it): give every candidate the same URLs, so that their records carry
/// the same member set.
///
/// A member that cannot be reached now (a transient error) is opened at its first call that
/// finds it reachable; one that can never be used (a missing container, table or bucket,
/// rejected credentials, a backend not compiled in) is an error now.
///
/// # Errors
/// [`Error::InvalidConfig`] for a malformed URL, URLs with different keys, an even number of
/// members, or a member named twice; the error of a member that cannot be used.
///
/// # Cancel safety
/// As [`open`].
pub async fn quorum_from_urls<S: AsRef<str>>(
    urls: &[S],
    options: &OpenOptions,
) -> Result<(Quorum, LeaseKey), Error> {
    let parsed: Vec<StoreUrl> = urls
        .iter()
        .map(|u| StoreUrl::parse(u.as_ref()))
        .collect::<Result<_, _>>()?;
    let Some(key) = parsed.first().map(|u| u.key().clone()) else {
        return Err(config(ConfigError::InvalidQuorum(
            "no member store given".to_owned(),
        )));
    };
    if let Some(other) = parsed.iter().find(|u| *u.key() != key) {
        return Err(Error::InvalidConfig {
            message: format!(
                "every member of a quorum must name the same lease key: {other} names {}, \
                 the first member {key}",
                other.key()
            ),
            source: None,
        });
    }
    let names: Vec<String> = parsed.iter().map(ToString::to_string).collect();
    // The member set's checks before anything is opened.
    Quorum::check_names(&names).map_err(config)?;
    let mut members = Vec::with_capacity(names.len());
    // One after the other: opening is a few calls per member, each bounded in time.
    for (url, name) in parsed.into_iter().zip(names) {
        let store: Arc<dyn ShardStore> = match open(&url, options).await {
            Ok(store) => store,
            Err(e) if e.is_retryable() => {
                warn!(member = %name, error = %e, "a quorum member cannot be reached now; opening it at its first call that reaches it");
                Arc::new(Lazy {
                    kind: kind(&url),
                    url,
                    options: options.clone(),
                    store: OnceCell::new(),
                    warned: std::sync::atomic::AtomicBool::new(false),
                })
            }
            Err(e) => {
                return Err(Error::InvalidConfig {
                    message: format!("the quorum member {name} cannot be used: {e}"),
                    source: Some(Box::new(e)),
                });
            }
        };
        members.push(QuorumMember::new(name, store));
    }
    Ok((Quorum::new(members).map_err(config)?, key))
}

fn config(e: ConfigError) -> Error {
    Error::InvalidConfig {
        message: e.to_string(),
        source: None,
    }
}

/// The backend name of a URL's store, for metrics.
fn kind(url: &StoreUrl) -> &'static str {
    match url {
        StoreUrl::File { .. } => "file",
        StoreUrl::Azure { .. } => "azure",
        StoreUrl::Dynamo { .. } => "dynamodb",
        StoreUrl::S3 { .. } => "s3",
        StoreUrl::Gcs { .. } => "gcs",
        StoreUrl::Etcd { .. } => "etcd",
        StoreUrl::Raft { .. } => "raft",
        StoreUrl::ZooKeeper { .. } => "zookeeper",
    }
}

/// A member store opened at its first call that reaches it.
#[derive(Debug)]
struct Lazy {
    kind: &'static str,
    url: StoreUrl,
    options: OpenOptions,
    store: OnceCell<Arc<dyn Store>>,
    /// An error that retrying will not fix was said (once).
    warned: std::sync::atomic::AtomicBool,
}

impl Lazy {
    async fn store(&self) -> Result<&Arc<dyn Store>, Error> {
        let opened = self
            .store
            .get_or_try_init(|| open(&self.url, &self.options))
            .await;
        if let Err(e) = &opened
            && !e.is_retryable()
            && !self.warned.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::error!(member = %self.url, error = %e, "a quorum member that was away at the start cannot be used now that it answers; the election goes on without it: fix it and restart");
        }
        opened
    }
}

#[async_trait]
impl LeaseBackend for Lazy {
    fn name(&self) -> &'static str {
        self.kind
    }
    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        self.store().await?.read(key).await
    }
    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        self.store().await?.write(request).await
    }
}

#[async_trait]
impl FencedCas for Lazy {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        self.store().await?.get_fenced(object).await
    }
    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        self.store().await?.put_fenced_if(put).await
    }
}
