//! The ZooKeeper session of each term: opened by the term's acquire, authenticated as an
//! identity of its own (so that only it can write the term's lease node), and ended by a
//! watchdog once its holder has not written for a ttl.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use leader_core::Error;
use leader_core::backend::{Rng, TermId};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};
use zookeeper_client::{Acl, AuthId, Client, Error as ZkError, Permission};

use crate::multi::replace_node;
use crate::session::connect;

/// How long ending a term's session may take (deleting its node), when no caller waits.
const END_BUDGET: Duration = Duration::from_secs(2);

/// The ACL of a lease node: everyone may read it; only the sessions authenticated as its
/// creator (the term's own identity) may change it.
pub(crate) fn lease_node_acl() -> [Acl; 2] {
    [
        Acl::new(Permission::READ, AuthId::anyone()),
        Acl::new(Permission::ALL, AuthId::authed()),
    ]
}

/// The session timeout to ask for a ttl: the ttl in whole milliseconds, rounded up.
pub(crate) fn session_timeout_for(ttl: Duration) -> Duration {
    let millis = ttl.as_nanos().div_ceil(1_000_000);
    Duration::from_millis(u64::try_from(millis).unwrap_or(u64::MAX))
}

/// Aborts a task when dropped.
#[derive(Debug)]
pub(crate) struct AbortOnDrop(pub(crate) JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The live term sessions of one store, by term.
#[derive(Debug, Default)]
pub(crate) struct Terms {
    map: Mutex<HashMap<(String, TermId), Arc<TermSession>>>,
    /// Whether a negotiated session timeout above the ttl was already reported.
    warned_longer_timeout: AtomicBool,
}

impl Terms {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<(String, TermId), Arc<TermSession>>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The session of `term` on the lease node `path`, if it is live.
    pub(crate) fn get(&self, path: &str, term: TermId) -> Option<Arc<TermSession>> {
        self.map().get(&(path.to_owned(), term)).cloned()
    }

    /// Forgets the session of `term` on `path` (which has no node, or whose node is gone)
    /// and returns it; with `only`, only if it is that session. Dropping it leaves the
    /// session to expire.
    pub(crate) fn forget(
        &self,
        path: &str,
        term: TermId,
        only: Option<i64>,
    ) -> Option<Arc<TermSession>> {
        let mut map = self.map();
        let key = (path.to_owned(), term);
        if only.is_some_and(|id| map.get(&key).is_some_and(|s| s.session_id != id)) {
            return None;
        }
        let removed = map.remove(&key);
        if let Some(session) = &removed {
            session.ended.store(true, Ordering::SeqCst);
        }
        removed
    }

    /// Registers `session` as the session of its term, replacing any other.
    pub(crate) fn insert(&self, session: &Arc<TermSession>) {
        let key = (session.path.clone(), session.term);
        self.map().insert(key, session.clone());
    }

    /// Registers `session` as the session of its term unless the term has one; returns
    /// whether it did.
    pub(crate) fn insert_if_absent(&self, session: &Arc<TermSession>) -> bool {
        let key = (session.path.clone(), session.term);
        let mut map = self.map();
        if map.contains_key(&key) {
            return false;
        }
        map.insert(key, session.clone());
        true
    }

    /// The live session whose node at `path` was created at zxid `czxid`.
    pub(crate) fn by_node(&self, path: &str, czxid: i64) -> Option<Arc<TermSession>> {
        self.map()
            .values()
            .find(|s| s.path == path && s.czxid() == Some(czxid))
            .cloned()
    }

    /// The live session of this store whose id is `owner` (a node's `ephemeralOwner`), for
    /// the node at `path`.
    pub(crate) fn by_owner(&self, path: &str, owner: i64) -> Option<Arc<TermSession>> {
        self.map()
            .values()
            .find(|s| s.path == path && s.session_id == owner)
            .cloned()
    }

    /// How many term sessions are live (for tests).
    pub(crate) fn len(&self) -> usize {
        self.map().len()
    }

    /// Opens the session of a new term for the lease node `path`: session timeout `ttl`,
    /// authenticated as a random identity of its own, with a watchdog that ends it `ttl`
    /// after `sent` (or after the last [`touch`](TermSession::touch)). The caller registers
    /// it ([`insert`](Self::insert)).
    ///
    /// # Errors
    /// [`Error::Unavailable`] if no server answers by `deadline`; [`Error::InvalidConfig`] if
    /// the ensemble grants a session timeout below the ttl (its `maxSessionTimeout`).
    pub(crate) async fn open(
        self: &Arc<Self>,
        hosts: &str,
        path: String,
        term: TermId,
        ttl: Duration,
        sent: Instant,
        deadline: Instant,
    ) -> Result<Arc<TermSession>, Error> {
        let mut rng = Rng::from_entropy();
        let user = format!("leader-term-{:032x}", term.0);
        let password = format!("{:016x}{:016x}", rng.next_u64(), rng.next_u64());
        let requested = session_timeout_for(ttl);
        let connector = Client::connector()
            .with_session_timeout(requested)
            .with_auth("digest", format!("{user}:{password}").as_bytes())
            // Dropping the client (the store dropped, the process exiting) leaves the session
            // to expire after its timeout instead of closing it: the node outlives every
            // deadline its holder may still act on. Terms that end while the store lives
            // delete their node explicitly (`end_session`).
            .with_detached();
        let client = connect(connector, hosts, deadline).await?;
        let negotiated = client.session_timeout();
        if negotiated < ttl {
            return Err(Error::InvalidConfig {
                message: format!(
                    "the ZooKeeper ensemble granted a session timeout of {negotiated:?} for a \
                     lease ttl of {ttl:?}: its maxSessionTimeout is below the ttl, so the lease \
                     node could vanish before its holder's deadline. Raise maxSessionTimeout in \
                     zoo.cfg to at least {} ms (default 20 x tickTime), or lower the ttl",
                    requested.as_millis()
                ),
                source: None,
            });
        }
        if negotiated > requested && !self.warned_longer_timeout.swap(true, Ordering::Relaxed) {
            warn!(
                ttl = ?ttl,
                session_timeout = ?negotiated,
                "the ZooKeeper ensemble granted a session timeout above the ttl (its \
                 minSessionTimeout, default 2 x tickTime): a holder that dies keeps its lease \
                 node that long, so failover after a crash is slower than the ttl"
            );
        }
        let (sent_tx, sent_rx) = watch::channel(sent);
        let session = Arc::new(TermSession {
            term,
            session_id: client.session_id().0,
            client: client.clone(),
            path: path.clone(),
            ttl,
            czxid: AtomicI64::new(0),
            sent: sent_tx,
            ended: AtomicBool::new(false),
            watchdog: Mutex::new(None),
        });
        let task = tokio::spawn(watchdog(
            Arc::downgrade(self),
            term,
            client,
            path,
            ttl,
            sent_rx,
        ));
        *session
            .watchdog
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(AbortOnDrop(task));
        debug!(node = %session.path, session = %format_args!("{:#x}", session.session_id), ?negotiated, "opened the term's ZooKeeper session");
        Ok(session)
    }

    /// Ends the session of `term` now: deletes its lease node if it still has it, and
    /// forgets it. Best effort within `deadline`; a node that could not be deleted goes when
    /// the session expires.
    pub(crate) async fn end(&self, path: &str, term: TermId, deadline: Instant) {
        if let Some(session) = self.forget(path, term, None) {
            end_session(&session.client, &session.path, deadline).await;
        }
    }
}

/// The ZooKeeper session of one term.
#[derive(Debug)]
pub(crate) struct TermSession {
    /// The term.
    pub(crate) term: TermId,
    /// The session's client (authenticated as the term's identity).
    pub(crate) client: Client,
    /// The session's id, the `ephemeralOwner` of the node it creates.
    pub(crate) session_id: i64,
    /// The lease node of the term.
    pub(crate) path: String,
    /// The term's ttl.
    pub(crate) ttl: Duration,
    /// The `czxid` of the term's node, once known (0 before).
    czxid: AtomicI64,
    /// When the last acquire or renew of the term was sent: the watchdog ends the session a
    /// ttl after it.
    sent: watch::Sender<Instant>,
    /// Set when the session is being ended: no more writes.
    ended: AtomicBool,
    watchdog: Mutex<Option<AbortOnDrop>>,
}

impl TermSession {
    /// The `czxid` of the term's node, if known.
    pub(crate) fn czxid(&self) -> Option<i64> {
        Some(self.czxid.load(Ordering::SeqCst)).filter(|c| *c != 0)
    }

    /// Records the `czxid` of the term's node.
    pub(crate) fn set_czxid(&self, czxid: i64) {
        self.czxid.store(czxid, Ordering::SeqCst);
    }

    /// Records that a write of the term is sent at `at`: the session lives a ttl after it.
    /// Returns `false` (and records nothing) if the session is ending or a ttl has passed
    /// since the last write (the watchdog is about to end it): the write must not be sent.
    pub(crate) fn touch(&self, at: Instant) -> bool {
        if self.ended.load(Ordering::SeqCst) {
            return false;
        }
        // The check and the update in one step, against the clock read inside it: the
        // watchdog must never decide to end the session between the two while this write
        // goes out.
        let mut alive = false;
        self.sent.send_if_modified(|t| {
            alive = *t + self.ttl > Instant::now();
            if alive && at > *t {
                *t = at;
                return true;
            }
            false
        });
        alive
    }
}

/// Ends the session a ttl after the last write of the term: the term's holder stopped
/// renewing (its deadline, `sent + ttl - margin`, has passed), so the node must not keep the
/// key blocked. ZooKeeper's own pings would keep the session, and the node, alive forever.
async fn watchdog(
    terms: Weak<Terms>,
    term: TermId,
    client: Client,
    path: String,
    ttl: Duration,
    mut sent: watch::Receiver<Instant>,
) {
    loop {
        let until = *sent.borrow_and_update() + ttl;
        tokio::select! {
            () = tokio::time::sleep_until(until) => {
                if *sent.borrow() + ttl <= Instant::now() {
                    break;
                }
            }
            changed = sent.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
    // Out of the map first, so that no write of the term is sent any more.
    let session_id = client.session_id().0;
    let removed = terms
        .upgrade()
        .and_then(|t| t.forget(&path, term, Some(session_id)));
    info!(node = %path, "no write of the term for a ttl: deleting its lease node and ending its ZooKeeper session");
    end_session(&client, &path, Instant::now() + END_BUDGET).await;
    // Dropping the last handle aborts this task, which is done anyway.
    drop(removed);
}

/// Deletes the node at `path` if `client`'s session owns it (its `ephemeralOwner`), by
/// `deadline`; the session is then left to expire without a node.
///
/// The delete is a multi of `setData(version)` and `delete(version + 1)`: the `setData` is
/// allowed only to the node's creator (its ACL), so a node that another term created at the
/// same path in between (with the same version) is never deleted.
pub(crate) async fn end_session(client: &Client, path: &str, deadline: Instant) {
    let session = client.session_id().0;
    let work = async {
        client.sync(path).await?;
        let Some(stat) = client.check_stat(path).await? else {
            return Ok(false);
        };
        if stat.ephemeral_owner != session {
            return Ok(false);
        }
        let Some(next) = stat.version.checked_add(1) else {
            return Ok(false);
        };
        replace_node(client, path, &[], stat.version, next, None)
            .await
            .map_err(|(e, _)| e)?;
        Ok::<bool, ZkError>(true)
    };
    match tokio::time::timeout_at(deadline, work).await {
        Ok(Ok(true)) => debug!(node = %path, "deleted the term's lease node"),
        Ok(Ok(false)) => debug!(node = %path, "the term's lease node was already gone"),
        Ok(Err(e)) => {
            debug!(node = %path, error = %e, "could not delete the term's lease node; it goes when its session expires");
        }
        Err(_) => {
            warn!(node = %path, "deleting the term's lease node got no answer in time; it goes when its session expires");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_timeouts_round_up_to_whole_milliseconds() {
        assert_eq!(
            session_timeout_for(Duration::from_secs(2)),
            Duration::from_millis(2000)
        );
        assert_eq!(
            session_timeout_for(Duration::from_micros(1_500)),
            Duration::from_millis(2)
        );
    }

    #[test]
    fn only_the_creator_may_write_a_lease_node() {
        let acl = lease_node_acl();
        assert_eq!(acl[0].permission(), Permission::READ);
        assert_eq!(acl[0].scheme(), "world");
        assert_eq!(acl[1].permission(), Permission::ALL);
        assert_eq!(acl[1].scheme(), "auth");
    }
}
