//! ZooKeeper sessions: opening one within a deadline, and the store's shared session, which
//! is replaced by a new one when it expires.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use leader_core::Error;
use tokio::time::Instant;
use tracing::warn;
use zookeeper_client::{Client, Connector, Error as ZkError};

/// The session timeout of the shared session (reads, watches, fenced objects). It holds no
/// ephemeral nodes, so it only decides how long a broken connection may be repaired before
/// the session has to be replaced.
pub(crate) const SHARED_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects `connector` to `hosts`, trying each server once, by `deadline`.
pub(crate) async fn connect(
    connector: Connector,
    hosts: &str,
    deadline: Instant,
) -> Result<Client, Error> {
    let limit = deadline.saturating_duration_since(Instant::now());
    let unreachable = |detail: String, source: Option<ZkError>| Error::Unavailable {
        message: format!(
            "no ZooKeeper server of {hosts:?} {detail}; check the host list and that the \
             ensemble is running and reachable from here"
        ),
        source: source.map(|e| Box::new(e) as leader_core::BoxError),
    };
    let connecting = connector.with_fail_eagerly().connect(hosts);
    match tokio::time::timeout_at(deadline, connecting).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e @ ZkError::BadArguments(_))) => Err(Error::InvalidConfig {
            message: format!("invalid ZooKeeper host list {hosts:?}: {e}"),
            source: Some(Box::new(e)),
        }),
        Ok(Err(e @ ZkError::AuthFailed)) => Err(Error::Unauthenticated {
            message: format!("ZooKeeper ({hosts}) refused the session's credentials: {e}"),
            source: Some(Box::new(e)),
        }),
        Ok(Err(e @ (ZkError::NoHosts | ZkError::Timeout | ZkError::ConnectionLoss))) => {
            Err(unreachable(
                "accepted a connection (refused, unreachable or no answer)".to_owned(),
                Some(e),
            ))
        }
        Ok(Err(e)) => Err(unreachable(format!("opened a session ({e})"), Some(e))),
        Err(_) => Err(unreachable(format!("answered within {limit:?}"), None)),
    }
}

/// The session the store reads, watches and writes protected objects with. It holds no
/// ephemeral node. If it expires (a partition longer than its timeout), the next call opens
/// a new one.
pub(crate) struct SharedSession {
    hosts: String,
    connect_timeout: Duration,
    current: Mutex<Client>,
    /// Held while a new session is opened, so that concurrent callers open only one.
    reconnecting: tokio::sync::Mutex<()>,
}

impl SharedSession {
    /// Opens the shared session within `connect_timeout`.
    pub(crate) async fn connect(hosts: String, connect_timeout: Duration) -> Result<Self, Error> {
        let client = Self::open(&hosts, Instant::now() + connect_timeout).await?;
        Ok(Self {
            hosts,
            connect_timeout,
            current: Mutex::new(client),
            reconnecting: tokio::sync::Mutex::new(()),
        })
    }

    async fn open(hosts: &str, deadline: Instant) -> Result<Client, Error> {
        let connector = Client::connector().with_session_timeout(SHARED_SESSION_TIMEOUT);
        connect(connector, hosts, deadline).await
    }

    fn current(&self) -> Client {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A client of a live session: the current one, or a new one if it expired or closed
    /// (opened within the call's deadline, at most the connect timeout).
    pub(crate) async fn client(&self) -> Result<Client, Error> {
        let current = self.current();
        if !current.state().is_terminated() {
            return Ok(current);
        }
        let _one = self.reconnecting.lock().await;
        let current = self.current();
        let state = current.state();
        if !state.is_terminated() {
            return Ok(current);
        }
        let deadline =
            leader_core::backend::call_deadline().min(Instant::now() + self.connect_timeout);
        let fresh = Self::open(&self.hosts, deadline).await?;
        warn!(
            hosts = %self.hosts,
            old = %current.session_id(),
            new = %fresh.session_id(),
            "the store's shared ZooKeeper session ended ({state}); opened a new one"
        );
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = fresh.clone();
        Ok(fresh)
    }

    /// The ensemble's host list.
    pub(crate) fn hosts(&self) -> &str {
        &self.hosts
    }

    /// The id of the current shared session (for tests and logs).
    pub(crate) fn session_id(&self) -> i64 {
        self.current().session_id().0
    }
}
