//! ZooKeeper sessions: opening one within a deadline, and the store's shared session, which
//! is replaced by a new one when it expires.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leader_core::Error;
use tokio::time::Instant;
use tracing::warn;
use zookeeper_client::{Client, Connector, Error as ZkError, SessionState};

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

/// How long the shared session may go without a connection before the next call opens a new
/// session instead of waiting for the client to reconnect it. The client tries again at
/// doubling intervals (100 ms, 200 ms, ... up to the session's timeout), so after an outage
/// of a few seconds its next attempt may come seconds after the servers are back; a new
/// session connects at once. The shared session holds no ephemeral node, so nothing is lost
/// with it.
pub(crate) const STALLED_AFTER: Duration = Duration::from_secs(1);

/// The session the store reads, watches and writes protected objects with. It holds no
/// ephemeral node. If it expires (a partition longer than its timeout), or has had no
/// connection for [`STALLED_AFTER`], the next call opens a new one; the watches move to it
/// ([`replaced`](Self::replaced)).
pub(crate) struct SharedSession {
    hosts: String,
    connect_timeout: Duration,
    current: Mutex<Current>,
    /// Held while a new session is opened, so that concurrent callers open only one.
    reconnecting: tokio::sync::Mutex<()>,
    /// Counts the sessions that replaced the first.
    replacements: tokio::sync::watch::Sender<u64>,
}

/// The current shared session.
struct Current {
    client: Client,
    /// Since when it has had no connection (`None` while it has one), kept by [`track`].
    disconnected: Arc<Mutex<Option<Instant>>>,
}

impl Current {
    fn new(client: Client) -> Self {
        let disconnected = track(&client);
        Self {
            client,
            disconnected,
        }
    }
}

/// Follows the state of `client`'s session and keeps since when it has had no connection.
/// The task ends with the session (a terminal state), or at the first change after the
/// session is no longer current.
fn track(client: &Client) -> Arc<Mutex<Option<Instant>>> {
    let disconnected = Arc::new(Mutex::new(None));
    let kept = Arc::downgrade(&disconnected);
    let mut states = client.state_watcher();
    tokio::spawn(async move {
        loop {
            let state = states.changed().await;
            let Some(since) = kept.upgrade() else {
                return;
            };
            let mut since = since.lock().unwrap_or_else(PoisonError::into_inner);
            if state == SessionState::Disconnected {
                since.get_or_insert_with(Instant::now);
            } else {
                *since = None;
            }
            if state.is_terminated() {
                return;
            }
        }
    });
    disconnected
}

/// What a call finds the current shared session to be.
enum Found {
    /// Usable: connected, or briefly disconnected (the client is reconnecting it).
    Usable(Client),
    /// To be replaced: ended, or without a connection for so long (said how, for the log).
    Replace(Client, String),
}

impl SharedSession {
    /// Opens the shared session within `connect_timeout`.
    pub(crate) async fn connect(hosts: String, connect_timeout: Duration) -> Result<Self, Error> {
        let client = Self::open(&hosts, Instant::now() + connect_timeout).await?;
        Ok(Self {
            hosts,
            connect_timeout,
            current: Mutex::new(Current::new(client)),
            reconnecting: tokio::sync::Mutex::new(()),
            replacements: tokio::sync::watch::Sender::new(0),
        })
    }

    async fn open(hosts: &str, deadline: Instant) -> Result<Client, Error> {
        let connector = Client::connector().with_session_timeout(SHARED_SESSION_TIMEOUT);
        connect(connector, hosts, deadline).await
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn current(&self) -> Client {
        self.lock().client.clone()
    }

    /// The current session, and whether it must be replaced.
    fn find(&self) -> Found {
        let current = self.lock();
        let client = current.client.clone();
        let state = client.state();
        if state.is_terminated() {
            return Found::Replace(client, format!("ended ({state})"));
        }
        let since = *current
            .disconnected
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match since.map(|t| t.elapsed()) {
            Some(without) if state == SessionState::Disconnected && without >= STALLED_AFTER => {
                Found::Replace(
                    client,
                    format!(
                        "had no connection for {without:?} (the client's next reconnect \
                         attempt may be seconds away)"
                    ),
                )
            }
            _ => Found::Usable(client),
        }
    }

    /// A client of a live session: the current one, or a new one if it ended or has had no
    /// connection for [`STALLED_AFTER`] (opened within the call's deadline, at most the
    /// connect timeout).
    ///
    /// # Errors
    /// [`Error::Unavailable`] if a new session was needed and no server could open one.
    pub(crate) async fn client(&self) -> Result<Client, Error> {
        if let Found::Usable(client) = self.find() {
            return Ok(client);
        }
        let _one = self.reconnecting.lock().await;
        let (old, why) = match self.find() {
            Found::Usable(client) => return Ok(client),
            Found::Replace(client, why) => (client, why),
        };
        let deadline =
            leader_core::backend::call_deadline().min(Instant::now() + self.connect_timeout);
        let fresh = Self::open(&self.hosts, deadline).await?;
        warn!(
            hosts = %self.hosts,
            old = %old.session_id(),
            new = %fresh.session_id(),
            "the store's shared ZooKeeper session {why}; opened a new one"
        );
        *self.lock() = Current::new(fresh.clone());
        self.replacements.send_modify(|n| *n += 1);
        Ok(fresh)
    }

    /// Changes each time a new session replaces the current one: a watch set on the old one
    /// must be set again on the new one.
    pub(crate) fn replaced(&self) -> tokio::sync::watch::Receiver<u64> {
        self.replacements.subscribe()
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
