//! The conformance suite every backend runs against its real store.
//!
//! Each case is a plain `pub async fn` taking a [`Harness`], which gives the store, a fresh
//! key per case, a timing short enough for tests, and a way to plant a malformed record. Run
//! all cases as separate tests with [`conformance_tests!`](crate::conformance_tests):
//!
//! ```
//! # mod wrapper {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use async_trait::async_trait;
//! use leader_core::conformance::{ConformantStore, Harness, unique_key};
//! use leader_core::{Error, LeaseKey, MemoryStore, Timing};
//!
//! #[derive(Default)]
//! struct Memory { store: MemoryStore }
//!
//! #[async_trait]
//! impl Harness for Memory {
//!     async fn store(&self) -> Result<Arc<dyn ConformantStore>, Error> {
//!         Ok(Arc::new(self.store.clone()))
//!     }
//!     fn unique_key(&self) -> LeaseKey {
//!         unique_key("case").unwrap()
//!     }
//!     fn timing(&self) -> Timing {
//!         Timing::from_ttl(Duration::from_secs(10))
//!     }
//!     async fn plant_malformed(&self, key: &LeaseKey) -> Result<(), Error> {
//!         self.store.put_raw(key, b"not a record".to_vec());
//!         Ok(())
//!     }
//!     async fn delete_record(&self, key: &LeaseKey) -> Result<(), Error> {
//!         self.store.delete(key);
//!         Ok(())
//!     }
//! }
//!
//! leader_core::conformance_tests!(paused: Memory::default());
//! # }
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::{Instant, sleep, sleep_until};

use crate::backend::{
    Expected, ExpiryModel, Fence, FencedPut, FencedStore, IfChanged, LeaseBackend, ObjectWrite,
    Revision, WriteKind, WriteOutcome, WriteRequest,
};
use crate::config::Timing;
use crate::error::{ConfigError, Error};
use crate::lease::{Acquisition, Grant, LeaseClient, Renewal};
use crate::model::{HolderId, LeaseKey, LeaseRecord, Metadata, ObjectName, TermId, WriteNonce};
use crate::token::FencingToken;

/// The suite's seeded generator (SplitMix64), for harnesses and test tools that need dice
/// (a fault proxy's, unique names): one source of randomness in the whole workspace.
pub use crate::backend::Rng;

/// A lease key for a test that no other call returns: `{prefix}-{n}-{random}`, with a
/// process-wide counter and eight random hex digits (so that runs sharing a store do not meet
/// either). Harnesses return it from [`Harness::unique_key`].
///
/// # Errors
/// [`ConfigError::InvalidName`] if `prefix` is not a valid start of a key (ASCII letters,
/// digits, `-`, `_`, `.`; not too long).
pub fn unique_key(prefix: &str) -> Result<LeaseKey, ConfigError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let random = Rng::from_entropy().next_u64() & 0xffff_ffff;
    LeaseKey::new(format!("{prefix}-{n}-{random:08x}"))
}

/// A store that offers leases and fenced writes (through its [`FencedCas`](crate::backend::FencedCas), which the suite
/// also checks directly).
pub trait ConformantStore: crate::ShardStore {}
impl<T: crate::ShardStore + ?Sized> ConformantStore for T {}

/// What a backend provides to run the suite.
#[async_trait]
pub trait Harness: Send + Sync {
    /// A client of the store under test. Each call may return a new client (as another
    /// process would have); all must see the same data.
    async fn store(&self) -> Result<Arc<dyn ConformantStore>, Error>;

    /// A lease key that no other case (or earlier run) uses; [`unique_key`] makes one.
    fn unique_key(&self) -> LeaseKey;

    /// The timing to test with: as short as the store allows.
    fn timing(&self) -> Timing;

    /// Stores an unparsable record under `key`, bypassing the backend's checks.
    async fn plant_malformed(&self, key: &LeaseKey) -> Result<(), Error>;

    /// Deletes the lease record of `key` as an operator recovering a stuck lease would, with
    /// the store's own tools (breaking a server-side lease first where the store requires it),
    /// bypassing the backend.
    async fn delete_record(&self, key: &LeaseKey) -> Result<(), Error>;
}

/// A failed conformance case: which case, and what it saw.
#[derive(Debug, thiserror::Error)]
#[error("conformance case `{case}` failed: {message}")]
pub struct Failure {
    /// The case.
    pub case: &'static str,
    /// What went wrong.
    pub message: String,
}

fn fail(case: &'static str, message: impl Into<String>) -> Failure {
    Failure {
        case,
        message: message.into(),
    }
}

macro_rules! ensure {
    ($cond:expr, $case:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(fail($case, format!($($msg)+)));
        }
    };
}

trait Context<T> {
    fn ctx(self, case: &'static str, what: &str) -> Result<T, Failure>;
}

impl<T, E: std::fmt::Display> Context<T> for Result<T, E> {
    fn ctx(self, case: &'static str, what: &str) -> Result<T, Failure> {
        self.map_err(|e| fail(case, format!("{what}: {e}")))
    }
}

async fn client<H: Harness + ?Sized>(
    h: &H,
    case: &'static str,
    key: &LeaseKey,
    who: &str,
) -> Result<LeaseClient, Failure> {
    let store: Arc<dyn LeaseBackend> = h.store().await.ctx(case, "connecting")?;
    let holder = HolderId::new(format!("conformance-{who}")).ctx(case, "holder id")?;
    LeaseClient::new(store, key.clone(), holder, h.timing()).ctx(case, "timing")
}

async fn acquire(c: &mut LeaseClient, case: &'static str, who: &str) -> Result<Grant, Failure> {
    match c
        .try_acquire()
        .await
        .ctx(case, &format!("{who} acquiring"))?
    {
        Acquisition::Acquired(g) => Ok(g),
        other => Err(fail(
            case,
            format!("{who} should have acquired, got {other:?}"),
        )),
    }
}

/// The fence of `c`'s term `g`.
fn fence_of(c: &LeaseClient, g: &Grant) -> Fence {
    Fence::new(c.key().clone(), c.holder().clone(), g.token)
}

fn record(holder: &str, token: u64, ttl: Duration) -> Result<LeaseRecord, Failure> {
    let holder = HolderId::new(holder).ctx("record", "holder id")?;
    Ok(LeaseRecord::held(
        holder,
        FencingToken(token),
        ttl,
        Metadata::new(),
        WriteNonce(token ^ 0x00c0_ffee),
    ))
}

/// A fresh key: the first candidate acquires, with a token of at least 1, and the stored
/// record says so.
///
/// # Errors
/// A [`Failure`] describing the first broken expectation.
pub async fn create_if_absent<H: Harness + ?Sized>(h: &H) -> Result<(), Failure> {
    const CASE: &str = "create_if_absent";
    let key = h.unique_key();
    let store = h.store().await.ctx(CASE, "connecting")?;
    ensure!(
        store.read(&key).await.ctx(CASE, "read")?.is_none(),
        CASE,
        "a fresh key must have no record"
    );
    let mut a = client(h, CASE, &key, "a").await?;
    let g = acquire(&mut a, CASE, "a").await?;
    ensure!(g.token >= FencingToken(1), CASE, "token must be at least 1");
    let stored = store
        .read(&key)
        .await
        .ctx(CASE, "read")?
        .ok_or_else(|| fail(CASE, "no record after acquire"))?;
    ensure!(
        stored.record.holder == *a.holder() && stored.record.is_held(),
        CASE,
        "record must name the holder as holding: {stored:?}"
    );
    ensure!(
        stored.record.token == g.token,
        CASE,
        "stored token {} != granted {}",
        stored.record.token,
        g.token
    );
    ensure!(
        stored.record.ttl == h.timing().ttl,
        CASE,
        "stored ttl {:?} != {:?}",
        stored.record.ttl,
        h.timing().ttl
    );
    Ok(())
}

/// While a lease is held, a second candidate follows and a create-if-absent write conflicts
/// without changing the record.
///
/// # Errors
/// A [`Failure`] describing the first broken expectation.
pub async fn conflicting_create<H: Harness + ?Sized>(h: &H) -> Result<(), Failure> {
    const CASE: &str = "conflicting_create";
    let key = h.unique_key();
    let store = h.store().await.ctx(CASE, "connecting")?;
    let mut a = client(h, CASE, &key, "a").await?;
    let mut b = client(h, CASE, &key, "b").await?;
    acquire(&mut a, CASE, "a").await?;
    let before = store.read(&key).await.ctx(CASE, "read")?;
    match b.try_acquire().await.ctx(CASE, "b acquiring")? {
        Acquisition::Following {
            leader: Some(leader),
            ..
        } if leader.holder == *a.holder() => {}
        other => return Err(fail(CASE, format!("b must follow a, got {other:?}"))),
    }
    let outcome = store
        .write(WriteRequest::new(
            key.clone(),
            Expected::Absent,
            record("conformance-b", 99, h.timing().ttl)?,
            WriteKind::Acquire,
            TermId(1),
        ))
        .await
        .ctx(CASE, "raw create")?;
    ensure!(
        matches!(outcome, WriteOutcome::Conflict { .. }),
        CASE,
        "a create over an existing record must conflict, got {outcome:?}"
    );
    let after = store.read(&key).await.ctx(CASE, "read")?;
    ensure!(
        before == after,
        CASE,
        "the record changed: {before:?} -> {after:?}"
    );
    Ok(())
}

/// Renewing keeps the token, moves the deadline later and changes the revision.
///
/// # Errors
/// A [`Failure`] describing the first broken expectation.
pub async fn renew<H: Harness + ?Sized>(h: &H) -> Result<(), Failure> {
    const CASE: &str = "renew";
    let key = h.unique_key();
    let store = h.store().await.ctx(CASE, "connecting")?;
    let mut a = client(h, CASE, &key, "a").await?;
    let g1 = acquire(&mut a, CASE, "a").await?;
    let r1 = store.read(&key).await.ctx(CASE, "read")?;
    sleep(h.timing().renew_every).await;
    let g2 = match a.renew().await.ctx(CASE, "renew")? {
        Renewal::Renewed(g) => g,
        other => return Err(fail(CASE, format!("renew must succeed, got {other:?}"))),
    };
    ensure!(g2.token == g1.token, CASE, "renew changed the token");
    ensure!(
        g2.deadline > g1.deadline,
        CASE,
        "renew must extend the deadline"
    );
    let r2 = store.read(&key).await.ctx(CASE, "read")?;
    let (Some(r1), Some(r2)) = (r1, r2) else {
        return Err(fail(CASE, "record vanished"));
    };
    ensure!(
        r1.revision != r2.revision,
        CASE,
        "renew must change the revision"
    );
    ensure!(
        r2.record.is_held() && r2.record.token == g1.token,
        CASE,
        "bad record {r2:?}"
    );
    // A second renew works from the new revision.
    ensure!(
        matches!(a.renew().await.ctx(CASE, "renew")?, Renewal::Renewed(_)),
        CASE,
        "second renew must succeed"
    );
    Ok(())
}

/// Waits (boundedly) until `b` takes over, and returns its grant and when it got it.
async fn take_over(
    b: &mut LeaseClient,
    model: ExpiryModel,
    ttl: Duration,
    case: &'static str,
) -> Result<(Grant, Instant), Failure> {
    let give_up = Instant::now() + ttl * 3;
    loop {
        match b.try_acquire().await.ctx(case, "b acquiring")? {
            Acquisition::Acquired(g) => return Ok((g, Instant::now())),
            Acquisition::Following { takeover_at, .. } => {
                let next = match (model, takeover_at) {
                    (ExpiryModel::ObservedByFollowers, Some(t)) => t,
                    _ => Instant::now() + ttl / 10,
                };
                ensure!(next < give_up, case, "b did not take over within 3 x ttl");
                sleep_until(next).await;
            }
        }
    }
}

/// A follower takes over a lease its holder stopped renewing only after a full ttl, and gets
/// a higher token; before that, it follows and the record is untouched.
///
/// # Errors
/// A [`Failure`] describing the first broken expectation.
pub async fn takeover_only_after_full_ttl<H: Harness + ?Sized>(h: &H) -> Result<(), Failure> {
    const CASE: &str = "takeover_only_after_full_ttl";
    let key = h.unique_key();
    let ttl = h.timing().ttl;
    let store = h.store().await.ctx(CASE, "connecting")?;
    let model = store.expiry_model();
    let mut a = client(h, CASE, &key, "a").await?;
    let mut b = client(h, CASE, &key, "b").await?;
    // A store that enforces expiry starts the lease when it receives the request; the core
    // measures from when the answer came.
    let sent = Instant::now();
    let g1 = acquire(&mut a, CASE, "a").await?;
    let written = if model == ExpiryModel::EnforcedByStore {
        sent
    } else {
        Instant::now()
    };
    let held = store.read(&key).await.ctx(CASE, "read")?;
    let before = Instant::now();
    match b.try_acquire().await.ctx(CASE, "b acquiring")? {
        Acquisition::Following {
            leader: Some(l),
            takeover_at,
        } => {
            ensure!(l.holder == *a.holder(), CASE, "b must see a as leader");
            if model == ExpiryModel::ObservedByFollowers {
                let t = takeover_at.ok_or_else(|| fail(CASE, "no takeover time"))?;
                ensure!(
                    t >= before + ttl,
                    CASE,
                    "takeover allowed before a full ttl"
                );
            }
        }
        other => return Err(fail(CASE, format!("b must follow, got {other:?}"))),
    }
    sleep(ttl / 2).await;
    ensure!(
        matches!(
            b.try_acquire().await.ctx(CASE, "b acquiring")?,
            Acquisition::Following { .. }
        ),
        CASE,
        "b took over after half a ttl"
    );
    ensure!(
        store.read(&key).await.ctx(CASE, "read")? == held,
        CASE,
        "the record changed before the ttl ran out"
    );
    let (g2, at) = take_over(&mut b, model, ttl, CASE).await?;
    ensure!(
        at >= written + ttl,
        CASE,
        "b took over {:?} after a's write, before ttl {ttl:?}",
        at - written
    );
    ensure!(
        g2.token > g1.token,
        CASE,
        "token {} not above {}",
        g2.token,
        g1.token
    );
    let now = store.read(&key).await.ctx(CASE, "read")?;
    ensure!(
        now.is_some_and(|s| s.record.holder == *b.holder() && s.record.token == g2.token),
        CASE,
        "record must name b with its token"
    );
    Ok(())
}

/// After a takeover, the old holder's renew fails: its client reports the term over, and a
/// write conditional on its last revision is a conflict that leaves the new record intact.
///
/// # Errors
/// A [`Failure`] describing the first broken expectation.
pub async fn stale_renew_is_conflict<H: Harness + ?Sized>(h: &H) -> Result<(), Failure> {
    const CASE: &str = "stale_renew_is_conflict";
    let key = h.unique_key();
    let ttl = h.timing().ttl;
    let store = h.store().await.ctx(CASE, "connecting")?;
    let mut a = client(h, CASE, &key, "a").await?;
    let mut b = client(h, CASE, &key, "b").await?;
    let g1 = acquire(&mut a, CASE, "a").await?;
    let a_rev = store
        .read(&key)
        .await
        .ctx(CASE, "read")?
        .ok_or_else(|| fail(CASE, "no record"))?;
    b.try_acquire().await.ctx(CASE, "b observing")?;
    take_over(&mut b, store.expiry_model(), ttl, CASE).await?;
    let b_rec = store.read(&key).await.ctx(CASE, "read")?;
    let renewal = a.renew().await.ctx(CASE, "a renewing")?;
    ensure!(
        matches!(renewal, Renewal::Expired | Renewal::Lost { .. }),
        CASE,
        "a's renew after the takeover must fail, got {renewal:?}"
    );
    let mut stale = a_rev.record.clone();
    stale.nonce = WriteNonce(0x57a1e);
    let outcome = store
        .write(WriteRequest::new(
            key.clone(),
            Expected::Revision(a_rev.revision.clone()),
            stale,
            WriteKind::Renew,
            TermId(u128::from(g1.token.0)),
        ))
        .await
        .ctx(CASE, "stale renew write")?;
    ensure!(
        matches!(outcome, WriteOutcome::Conflict { .. }),
        CASE,
        "a renew conditional on a stale revision must conflict, got {outcome:?}"
    );
    ensure!(
        !a.release().await.ctx(CASE, "a releasing")?,
        CASE,
        "a must not release b's lease"
    );
    ensure!(
        store.read(&key).await.ctx(CASE, "read")? == b_rec,
        CASE,
        "b's record changed"
    );
    Ok(())
}

/// After a release, another candidate acquires at once, with a higher token.
///
/// # Errors
/// A [`Failure`] describing the first broken expectation.
pub async fn release_then_acquire<H: Harness + ?Sized>(h: &H) -> Result<(), Failure> {
    const CASE: &str = "release_then_acquire";
    let key = h.unique_key();
    let store = h.store().await.ctx(CASE, "connecting")?;
    let mut a = client(h, CASE, &key, "a").await?;
    let mut b = client(h, CASE, &key, "b").await?;
    let g1 = acquire(&mut a, CASE, "a").await?;
    b.try_acquire().await.ctx(CASE, "b observing")?;
    ensure!(
        a.release().await.ctx(CASE, "release")?,
        CASE,
        "release must succeed"
    );
    let released = store.read(&key).await.ctx(CASE, "read")?;
    ensure!(
        released
            .as_ref()
            .is_some_and(|s| !s.record.is_held() && s.record.token == g1.token),
        CASE,
        "released record must keep the token and say released: {released:?}"
    );
    let g2 = acquire(&mut b, CASE, "b").await?;
    ensure!(
        g2.token > g1.token,
        CASE,
        "token {} not above {}",
        g2.token,
        g1.token
    );
    Ok(())
}

/// How long a follower's read may take to catch up with a write (the store's replication
/// lag), in this suite.
const CATCH_UP: Duration = Duration::from_secs(5);

/// Asks [`LeaseBackend::read_if_changed`] until `done` accepts an answer, within
/// [`CATCH_UP`]; every answer before must pass `allowed` (it may lag, never invent).
async fn read_until(
    store: &dyn LeaseBackend,
    case: &'static str,
    key: &LeaseKey,
    known: Option<&Revision>,
    allowed: impl Fn(&IfChanged) -> bool,
    done: impl Fn(&IfChanged) -> bool,
    what: &str,
) -> Result<IfChanged, Failure> {
    let until = Instant::now() + CATCH_UP;
    loop {
        let seen = store
            .read_if_changed(key, known)
            .await
            .ctx(case, "read_if_changed")?;
        if done(&seen) {
            return Ok(seen);
        }
        ensure!(allowed(&seen), case, "{what}: unexpected answer {seen:?}");
        ensure!(
            Instant::now() < until,
            case,
            "{what}: still {seen:?} after {CATCH_UP:?}"
        );
        sleep(Duration::from_millis(100)).await;
    }
}

/// A follower's cheap read ([`LeaseBackend::read_if_changed`]) says `Unchanged` only for the
/// revision that is there, catches up with an acquire and a release, shows a live lease as
/// held and a released one as released, and never reports a revision that was not written.
///
/// # Errors
/// A [`Failure`] describing the first broken expectation.
pub async fn read_if_changed_follows_writes<H: Harness + ?Sized>(h: &H) -> Result<(), Failure> {
    const CASE: &str = "read_if_changed_follows_writes";
    let key = h.unique_key();
    let store = h.store().await.ctx(CASE, "connecting")?;
    let store = &*store;
    let absent = |s: &IfChanged| matches!(s, IfChanged::Changed(None));
    read_until(store, CASE, &key, None, |_| false, absent, "a fresh key").await?;
    let made_up = Revision::new("no-such-revision");
    read_until(
        store,
        CASE,
        &key,
        Some(&made_up),
        |_| false,
        absent,
        "a fresh key, made-up revision",
    )
    .await?;

    let mut a = client(h, CASE, &key, "a").await?;
    acquire(&mut a, CASE, "a").await?;
    let held = store
        .read(&key)
        .await
        .ctx(CASE, "read")?
        .ok_or_else(|| fail(CASE, "no record after acquire"))?;
    let is = |rev: &Revision| {
        let rev = rev.clone();
        move |s: &IfChanged| matches!(s, IfChanged::Changed(Some(x)) if x.revision == rev)
    };
    // Before it catches up, the read may show the key absent; nothing else.
    let seen = read_until(
        store,
        CASE,
        &key,
        None,
        absent,
        is(&held.revision),
        "after an acquire",
    )
    .await?;
    if let IfChanged::Changed(Some(s)) = &seen {
        ensure!(
            s.record.is_held() && s.record.holder == *a.holder(),
            CASE,
            "the acquired record must read as held by a: {s:?}"
        );
    }
    let unchanged = |s: &IfChanged| matches!(s, IfChanged::Unchanged);
    read_until(
        store,
        CASE,
        &key,
        Some(&held.revision),
        |_| false,
        unchanged,
        "known revision",
    )
    .await?;
    // A revision that was never written is never 'unchanged'.
    read_until(
        store,
        CASE,
        &key,
        Some(&made_up),
        |_| false,
        is(&held.revision),
        "made-up revision",
    )
    .await?;

    ensure!(
        a.release().await.ctx(CASE, "release")?,
        CASE,
        "release must succeed"
    );
    let released = store
        .read(&key)
        .await
        .ctx(CASE, "read")?
        .ok_or_else(|| fail(CASE, "no record after release"))?;
    let seen = read_until(
        store,
        CASE,
        &key,
        Some(&held.revision),
        unchanged,
        is(&released.revision),
        "after a release",
    )
    .await?;
    if let IfChanged::Changed(Some(s)) = &seen {
        ensure!(
            !s.record.is_held(),
            CASE,
            "the released record must read as released: {s:?}"
        );
    }
    Ok(())
}

/// `n` candidates race for a key, `rounds` times; each round exactly one wins, with a token
/// above the previous round's, and releases for the next round.
///
/// # Errors
/// A [`Failure`] describing the first broken expectation.
pub async fn race<H: Harness + ?Sized>(h: &H) -> Result<(), Failure> {
    const CASE: &str = "race";
    const N: usize = 5;
    const ROUNDS: usize = 4;
    let key = h.unique_key();
    let mut clients = Vec::with_capacity(N);
    for i in 0..N {
        clients.push(client(h, CASE, &key, &format!("racer{i}")).await?);
    }
    let mut last = FencingToken(0);
    for round in 0..ROUNDS {
        let mut tasks = tokio::task::JoinSet::new();
        for (i, mut c) in clients.drain(..).enumerate() {
            tasks.spawn(async move {
                let r = c.try_acquire().await;
                (i, c, r)
            });
        }
        let mut back: Vec<Option<LeaseClient>> = (0..N).map(|_| None).collect();
        let mut winners = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            let (i, c, r) = joined.ctx(CASE, "racer task")?;
            match r.ctx(CASE, &format!("round {round} racer {i}"))? {
                Acquisition::Acquired(g) => winners.push((i, g)),
                Acquisition::Following { .. } => {}
            }
            back[i] = Some(c);
        }
        clients = back.into_iter().flatten().collect();
        ensure!(
            winners.len() == 1,
            CASE,
            "round {round}: {} winners ({winners:?}); exactly one expected",
            winners.len()
        );
        let (i, g) = winners[0];
        ensure!(
            g.token > last,
            CASE,
            "round {round}: token {} not above {last}",
            g.token
        );
        last = g.token;
        ensure!(
            clients[i].release().await.ctx(CASE, "release")?,
            CASE,
            "winner's release failed"
        );
    }
    Ok(())
}

/// After a newer term writes a protected object, a write with the older token is rejected and
/// changes nothing; the newer term keeps writing.
///
/// # Errors
/// A [`Failure`] describing the first broken expectation.
pub async fn deposed_fenced_write_rejected<H: Harness + ?Sized>(h: &H) -> Result<(), Failure> {
    const CASE: &str = "deposed_fenced_write_rejected";
    let key = h.unique_key();
    let object = ObjectName::new(format!("{key}-object")).ctx(CASE, "object name")?;
    let store = h.store().await.ctx(CASE, "connecting")?;
    let mut a = client(h, CASE, &key, "a").await?;
    let mut b = client(h, CASE, &key, "b").await?;
    let g1 = acquire(&mut a, CASE, "a").await?;
    let fence_a = fence_of(&a, &g1);
    store
        .fenced_write(&fence_a, &object, b"from a")
        .await
        .ctx(CASE, "a's first fenced write")?;
    ensure!(
        a.release().await.ctx(CASE, "release")?,
        CASE,
        "release failed"
    );
    let g2 = acquire(&mut b, CASE, "b").await?;
    let fence_b = fence_of(&b, &g2);
    store
        .fenced_write(&fence_b, &object, b"from b")
        .await
        .ctx(CASE, "b's fenced write")?;
    match store.fenced_write(&fence_a, &object, b"late from a").await {
        Err(Error::Fenced { presented, .. }) => {
            ensure!(presented == g1.token, CASE, "rejection must name a's token");
        }
        other => {
            return Err(fail(
                CASE,
                format!("a's write after b's must be fenced off, got {other:?}"),
            ));
        }
    }
    let now = store
        .fenced_read(&object)
        .await
        .ctx(CASE, "read object")?
        .ok_or_else(|| fail(CASE, "object missing"))?;
    ensure!(
        now.value == b"from b" && now.fence == g2.token,
        CASE,
        "object must hold b's write with b's fence, has fence {}",
        now.fence
    );
    store
        .fenced_write(&fence_b, &object, b"again from b")
        .await
        .ctx(CASE, "b's second fenced write")?;
    Ok(())
}

/// The primitive under fenced writes: a put conditioned on a revision the object no longer
/// has is a conflict and changes nothing, even with the same token (so a write of a term
/// delivered late cannot undo a later write of the same term), and a put conditioned on
/// absence is a conflict once the object exists.
///
/// # Errors
/// A [`Failure`] describing the first broken expectation.
pub async fn fenced_put_needs_the_revision_it_read<H: Harness + ?Sized>(
    h: &H,
) -> Result<(), Failure> {
    const CASE: &str = "fenced_put_needs_the_revision_it_read";
    let key = h.unique_key();
    let object = ObjectName::new(format!("{key}-object")).ctx(CASE, "object name")?;
    let store = h.store().await.ctx(CASE, "connecting")?;
    let mut a = client(h, CASE, &key, "a").await?;
    let g = acquire(&mut a, CASE, "a").await?;
    let fence = fence_of(&a, &g);
    let first = store
        .fenced_write(&fence, &object, b"first")
        .await
        .ctx(CASE, "the first fenced write")?;
    let second = store
        .fenced_write(&fence, &object, b"second")
        .await
        .ctx(CASE, "the second fenced write")?;
    ensure!(
        first.revision != second.revision,
        CASE,
        "two writes left the same revision {:?}",
        first.revision
    );
    for (expected, what) in [
        (
            Expected::Revision(first.revision.clone()),
            "the first write's revision",
        ),
        (Expected::Absent, "absence"),
    ] {
        let late = FencedPut::new(&fence, &object, &expected, b"late");
        match store.put_fenced_if(late).await {
            Ok(ObjectWrite::Conflict) => {}
            other => {
                return Err(fail(
                    CASE,
                    format!("a put conditioned on {what} must be a conflict, got {other:?}"),
                ));
            }
        }
    }
    let now = store
        .get_fenced(&object)
        .await
        .ctx(CASE, "read object")?
        .ok_or_else(|| fail(CASE, "object missing"))?;
    ensure!(
        now.value == b"second" && now.revision == second.revision,
        CASE,
        "the object must still hold the second write"
    );
    Ok(())
}

/// A put without the lease check ([`FencedPut::without_lease_check`]) is a plain
/// compare-and-swap, as an election over several stores uses it: it needs no lease at the
/// fence's key (none is held here), creates an absent object, is a conflict on absence once the
/// object exists and on a revision it no longer has, and stores the fence's token.
///
/// # Errors
/// A [`Failure`] describing the first broken expectation.
pub async fn unchecked_put_is_a_plain_cas<H: Harness + ?Sized>(h: &H) -> Result<(), Failure> {
    const CASE: &str = "unchecked_put_is_a_plain_cas";
    let key = h.unique_key();
    let object = ObjectName::new(format!("{key}-cas")).ctx(CASE, "object name")?;
    let store = h.store().await.ctx(CASE, "connecting")?;
    let holder = HolderId::new("conformance-nobody").ctx(CASE, "holder id")?;
    let fence = Fence::new(key.clone(), holder, FencingToken(7));
    let put = |expected: &Expected, value: &'static [u8]| {
        let store = store.clone();
        let (fence, object, expected) = (fence.clone(), object.clone(), expected.clone());
        async move {
            let put = FencedPut::new(&fence, &object, &expected, value).without_lease_check();
            store.put_fenced_if(put).await
        }
    };
    let first = match put(&Expected::Absent, b"one").await {
        Ok(ObjectWrite::Written(r)) => r,
        other => {
            return Err(fail(
                CASE,
                format!(
                    "a put on an absent object with no lease held must be written, got {other:?}"
                ),
            ));
        }
    };
    let absent_again = put(&Expected::Absent, b"again").await;
    ensure!(
        matches!(absent_again, Ok(ObjectWrite::Conflict)),
        CASE,
        "a put conditioned on absence once the object exists must be a conflict, got {absent_again:?}"
    );
    let second = match put(&Expected::Revision(first.clone()), b"two").await {
        Ok(ObjectWrite::Written(r)) => r,
        other => {
            return Err(fail(
                CASE,
                format!("a put on the object's revision must be written, got {other:?}"),
            ));
        }
    };
    ensure!(second != first, CASE, "two writes left the same revision");
    let stale = put(&Expected::Revision(first), b"stale").await;
    ensure!(
        matches!(stale, Ok(ObjectWrite::Conflict)),
        CASE,
        "a put on a revision the object no longer has must be a conflict, got {stale:?}"
    );
    let now = store
        .get_fenced(&object)
        .await
        .ctx(CASE, "reading the object")?
        .ok_or_else(|| fail(CASE, "the object is missing"))?;
    ensure!(
        now.value == b"two" && now.revision == second && now.fence == FencingToken(7),
        CASE,
        "the object must hold the second write with the fence's token, got {now:?}"
    );
    Ok(())
}

/// A fence whose lease term differs from the token it writes (a shard term: the lease is the
/// instance's membership, the token the shard's): while the lease term is live, a fenced
/// write stores the fence's token, not the lease's, and a lower token with the same lease term
/// is refused by the object's fence.
///
/// # Errors
/// A [`Failure`] describing the first broken expectation.
pub async fn fence_with_a_separate_lease_term<H: Harness + ?Sized>(h: &H) -> Result<(), Failure> {
    const CASE: &str = "fence_with_a_separate_lease_term";
    let key = h.unique_key();
    let object = ObjectName::new(format!("{key}-object")).ctx(CASE, "object name")?;
    let store = h.store().await.ctx(CASE, "connecting")?;
    let mut a = client(h, CASE, &key, "a").await?;
    let g = acquire(&mut a, CASE, "a").await?;
    let shard = Fence {
        token: FencingToken(g.token.get() + 1000),
        lease_term: Some(g.token),
        ..fence_of(&a, &g)
    };
    ensure!(
        shard.lease_token() == g.token,
        CASE,
        "the lease token must be the lease term's"
    );
    let written = store
        .fenced_write(&shard, &object, b"shard")
        .await
        .ctx(CASE, "the shard term's fenced write")?;
    ensure!(
        written.fence == shard.token,
        CASE,
        "the write must report the shard's token {} as the fence, reported {}",
        shard.token,
        written.fence
    );
    let lower = Fence {
        token: FencingToken(g.token.get() + 999),
        ..shard.clone()
    };
    match store.fenced_write(&lower, &object, b"lower").await {
        Err(Error::Fenced {
            presented, highest, ..
        }) => {
            ensure!(
                presented == lower.token,
                CASE,
                "the rejection must name the token presented, {}, named {presented}",
                lower.token
            );
            ensure!(
                highest == Some(shard.token),
                CASE,
                "the rejection must name the object's fence {}, named {highest:?}",
                shard.token
            );
        }
        other => {
            return Err(fail(
                CASE,
                format!("a token below the object's fence must be fenced off, got {other:?}"),
            ));
        }
    }
    let now = store
        .fenced_read(&object)
        .await
        .ctx(CASE, "read object")?
        .ok_or_else(|| fail(CASE, "object missing"))?;
    ensure!(
        now.value == b"shard" && now.fence == shard.token,
        CASE,
        "the object must hold the shard term's write with its token {}, has fence {}",
        shard.token,
        now.fence
    );
    store
        .fenced_write(&shard, &object, b"shard again")
        .await
        .ctx(CASE, "the shard term's second fenced write")?;
    ensure!(
        a.release().await.ctx(CASE, "release")?,
        CASE,
        "release failed"
    );
    Ok(())
}

/// The record deleted in the middle of a term (an operator's usual recovery): the next term,
/// taken by a candidate that never saw the record, still gets a token above every earlier
/// one, a protected resource accepts the new leader and rejects the deposed one; and again
/// after a second deletion.
///
/// # Errors
/// A [`Failure`] describing the first broken expectation.
pub async fn token_survives_deletion<H: Harness + ?Sized>(h: &H) -> Result<(), Failure> {
    const CASE: &str = "token_survives_deletion";
    let key = h.unique_key();
    let object = ObjectName::new(format!("{key}-object")).ctx(CASE, "object name")?;
    let store = h.store().await.ctx(CASE, "connecting")?;
    // Two terms first, so that the token is above 1 before anything is deleted.
    let mut a = client(h, CASE, &key, "a").await?;
    let g0 = acquire(&mut a, CASE, "a").await?;
    ensure!(
        a.release().await.ctx(CASE, "release")?,
        CASE,
        "release failed"
    );
    let mut b = client(h, CASE, &key, "b").await?;
    let g1 = acquire(&mut b, CASE, "b").await?;
    ensure!(
        g1.token > g0.token,
        CASE,
        "token {} not above {}",
        g1.token,
        g0.token
    );
    // b's term is live when its record is deleted.
    let fence_old = fence_of(&b, &g1);
    store
        .fenced_write(&fence_old, &object, b"old term")
        .await
        .ctx(CASE, "the old term's fenced write")?;
    let mut highest = g1.token;
    for round in 0..2 {
        h.delete_record(&key)
            .await
            .ctx(CASE, &format!("deleting the record (round {round})"))?;
        let gone = store.read(&key).await.ctx(CASE, "read after delete")?;
        ensure!(
            gone.as_ref().is_none_or(|s| !s.record.is_held()),
            CASE,
            "the record must be gone (or released) after deletion: {gone:?}"
        );
        let mut fresh = client(h, CASE, &key, &format!("fresh{round}")).await?;
        let g = acquire(&mut fresh, CASE, "a candidate that never saw the record").await?;
        ensure!(
            g.token > highest,
            CASE,
            "round {round}: token {} after deletion is not above {highest}, issued before it",
            g.token
        );
        let fence = fence_of(&fresh, &g);
        store
            .fenced_write(&fence, &object, b"new term")
            .await
            .ctx(CASE, "the new leader's fenced write")?;
        match store.fenced_write(&fence_old, &object, b"deposed").await {
            Err(Error::Fenced { .. }) => {}
            other => {
                return Err(fail(
                    CASE,
                    format!("the deposed leader's write must be fenced off, got {other:?}"),
                ));
            }
        }
        highest = g.token;
        ensure!(
            fresh.release().await.ctx(CASE, "release")?,
            CASE,
            "release failed"
        );
    }
    Ok(())
}

/// A malformed record gives a clear error naming the key, and nothing overwrites it.
///
/// # Errors
/// A [`Failure`] describing the first broken expectation.
pub async fn malformed_record_is_reported_and_kept<H: Harness + ?Sized>(
    h: &H,
) -> Result<(), Failure> {
    const CASE: &str = "malformed_record_is_reported_and_kept";
    let key = h.unique_key();
    h.plant_malformed(&key).await.ctx(CASE, "planting")?;
    let store = h.store().await.ctx(CASE, "connecting")?;
    let mut a = client(h, CASE, &key, "a").await?;
    for attempt in 0..2 {
        match a.try_acquire().await {
            Err(e @ Error::MalformedRecord { .. }) => {
                ensure!(
                    e.to_string().contains(key.as_str()),
                    CASE,
                    "error must name the key: {e}"
                );
            }
            other => {
                return Err(fail(
                    CASE,
                    format!("attempt {attempt}: expected a malformed-record error, got {other:?}"),
                ));
            }
        }
    }
    let outcome = store
        .write(WriteRequest::new(
            key.clone(),
            Expected::Absent,
            record("conformance-a", 1, h.timing().ttl)?,
            WriteKind::Acquire,
            TermId(2),
        ))
        .await
        .ctx(CASE, "raw create")?;
    ensure!(
        matches!(outcome, WriteOutcome::Conflict { .. }),
        CASE,
        "a create over a malformed record must conflict, got {outcome:?}"
    );
    ensure!(
        matches!(store.read(&key).await, Err(Error::MalformedRecord { .. })),
        CASE,
        "the malformed record must still be there"
    );
    Ok(())
}

/// The store really checks conditions: a write with a stale revision, and a create over an
/// existing record, are rejected, and 8 concurrent creates have exactly one winner. Without
/// this, every other case could pass on a store that ignores conditions.
///
/// # Errors
/// A [`Failure`] describing the first broken expectation.
pub async fn fidelity_canary<H: Harness + ?Sized>(h: &H) -> Result<(), Failure> {
    const CASE: &str = "fidelity_canary";
    let key = h.unique_key();
    let ttl = h.timing().ttl;
    let store = h.store().await.ctx(CASE, "connecting")?;
    let term = TermId(0xfeed);
    let w = |expected, token: u64, kind| {
        record("conformance-canary", token, ttl)
            .map(|r| WriteRequest::new(key.clone(), expected, r, kind, term))
    };
    let first = match store
        .write(w(Expected::Absent, 1, WriteKind::Acquire)?)
        .await
        .ctx(CASE, "create")?
    {
        WriteOutcome::Written(s) => s,
        other => {
            return Err(fail(
                CASE,
                format!("create on a fresh key failed: {other:?}"),
            ));
        }
    };
    let second = match store
        .write(w(
            Expected::Revision(first.revision.clone()),
            2,
            WriteKind::Renew,
        )?)
        .await
        .ctx(CASE, "update")?
    {
        WriteOutcome::Written(s) => s,
        other => {
            return Err(fail(
                CASE,
                format!("update at the current revision failed: {other:?}"),
            ));
        }
    };
    ensure!(
        second.revision != first.revision,
        CASE,
        "revision did not change"
    );
    let stale = store
        .write(w(
            Expected::Revision(first.revision.clone()),
            3,
            WriteKind::Renew,
        )?)
        .await
        .ctx(CASE, "stale update")?;
    ensure!(
        matches!(stale, WriteOutcome::Conflict { .. }),
        CASE,
        "THE STORE ACCEPTED A WRITE WITH A STALE REVISION: {stale:?}"
    );
    let recreate = store
        .write(w(Expected::Absent, 4, WriteKind::Acquire)?)
        .await
        .ctx(CASE, "create over existing")?;
    ensure!(
        matches!(recreate, WriteOutcome::Conflict { .. }),
        CASE,
        "THE STORE ACCEPTED A CREATE OVER AN EXISTING RECORD: {recreate:?}"
    );
    let now = store.read(&key).await.ctx(CASE, "read")?;
    // The last accepted write, by its revision and nonce (not its token: a store may report
    // a term's token from its own facts, such as etcd's create revision).
    ensure!(
        now.as_ref().is_some_and(
            |s| s.revision == second.revision && s.record.nonce == second.record.nonce
        ),
        CASE,
        "the record must be the last accepted write: {now:?}"
    );
    racing_creates_have_one_winner(h, CASE).await
}

/// The canary's second half: 8 concurrent creates of a fresh key, each through a store of
/// its own; exactly one must win.
async fn racing_creates_have_one_winner<H: Harness + ?Sized>(
    h: &H,
    case: &'static str,
) -> Result<(), Failure> {
    let race_key = h.unique_key();
    let ttl = h.timing().ttl;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..8u64 {
        let store: Arc<dyn LeaseBackend> = h.store().await.ctx(case, "connecting")?;
        let req = WriteRequest::new(
            race_key.clone(),
            Expected::Absent,
            record(&format!("conformance-racer{i}"), 1, ttl)?,
            WriteKind::Acquire,
            TermId(u128::from(i) + 100),
        );
        tasks.spawn(async move { store.write(req).await });
    }
    let mut won = 0;
    while let Some(joined) = tasks.join_next().await {
        if let WriteOutcome::Written(_) = joined.ctx(case, "racer")?.ctx(case, "racing create")? {
            won += 1;
        }
    }
    ensure!(
        won == 1,
        case,
        "{won} of 8 concurrent creates won; exactly one must"
    );
    Ok(())
}

/// Sharded leadership on the store: two instances of six shards balance to three each, every
/// shard term's token is above the shard's earlier ones, a shard term's fence writes a
/// protected object, no shard is ever led by both at once (checked every 20 ms), and a
/// shutdown hands its shards over by release, well within a ttl.
///
/// # Errors
/// A [`Failure`] describing the first broken expectation.
pub async fn sharded_balance_and_handover<H: Harness + ?Sized>(h: &H) -> Result<(), Failure> {
    use sharded::{CASE, SHARDS};
    let key = h.unique_key();
    let timing = h.timing();
    let start = |id: &str, store| sharded::start(id, store, &key, timing);
    let settle = timing.ttl * 3;
    let (a, a_led) = start("a", h.store().await.ctx(CASE, "connecting")?)?;
    let first = sharded::until(&[&a], settle, "one instance leading every shard", |l| {
        l[0].len() == SHARDS as usize
    })
    .await?
    .remove(0);
    let (b, b_led) = start("b", h.store().await.ctx(CASE, "connecting")?)?;
    let both = sharded::until(&[&a, &b], settle, "balancing 3/3", |l| {
        l[0].len() == 3 && l[1].len() == 3
    })
    .await?;
    for (s, token) in &both[1] {
        ensure!(
            *token > first[s],
            CASE,
            "shard {s} moved to b with token {token}, not above a's {}",
            first[s]
        );
    }
    // A shard term's fence writes a protected object.
    let store = h.store().await.ctx(CASE, "connecting")?;
    let object = ObjectName::new(format!("{key}-object")).ctx(CASE, "object name")?;
    let fence = {
        let led = b_led.lock().unwrap_or_else(|e| e.into_inner());
        led.values().next().map(|t| t.fence().clone())
    };
    let fence = fence.ok_or_else(|| fail(CASE, "b has no shard term to write with"))?;
    store
        .fenced_write(&fence, &object, b"shard")
        .await
        .ctx(CASE, "a shard term's fenced write")?;
    // A shutdown hands every shard over by release: far sooner than a ttl.
    drop(a_led);
    let left = Instant::now();
    a.shutdown().await;
    let after = sharded::until(
        &[&b],
        timing.ttl,
        "b leading every shard after a left",
        |l| l[0].len() == SHARDS as usize,
    )
    .await?
    .remove(0);
    ensure!(
        left.elapsed() < timing.ttl,
        CASE,
        "the handover took {:?}, not less than a ttl",
        left.elapsed()
    );
    for (s, token) in &both[0] {
        ensure!(
            after[s] > *token,
            CASE,
            "shard {s} moved back to b with token {}, not above {token}",
            after[s]
        );
    }
    drop(b_led);
    b.shutdown().await;
    Ok(())
}

/// The instances of [`sharded_balance_and_handover`].
mod sharded {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tokio::time::{Instant, sleep};

    use super::{ConformantStore, Context, Failure, fail};
    use crate::{
        FencingToken, HolderId, LeaseKey, ShardStore, ShardedElector, ShardedHandle, Term, Timing,
    };

    pub(super) const CASE: &str = "sharded_balance_and_handover";
    pub(super) const SHARDS: u32 = 6;

    /// The terms an instance leads now, by shard.
    pub(super) type Led = Arc<Mutex<BTreeMap<u32, Term>>>;

    /// Starts instance `id`, keeping each shard term it is handed until the term ends.
    pub(super) fn start(
        id: &str,
        store: Arc<dyn ConformantStore>,
        key: &LeaseKey,
        timing: Timing,
    ) -> Result<(ShardedHandle, Led), Failure> {
        let store: Arc<dyn ShardStore> = store;
        let handle = ShardedElector::builder(store, key.clone(), SHARDS)
            .timing(timing)
            .holder_id(HolderId::new(id).ctx(CASE, "holder id")?)
            .build()
            .ctx(CASE, "building a sharded elector")?
            .spawn();
        let led: Led = Arc::default();
        let (terms, keep) = (handle.terms(), led.clone());
        tokio::spawn(async move {
            while let Ok(term) = terms.next().await {
                let Some(shard) = term.shard() else { continue };
                let cancel = term.cancellation_token();
                keep.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(shard, term);
                let keep = keep.clone();
                tokio::spawn(async move {
                    cancel.cancelled().await;
                    keep.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&shard);
                });
            }
        });
        Ok((handle, led))
    }

    /// Waits until `done` holds for what each instance leads, checking every 20 ms that no
    /// shard is led twice.
    pub(super) async fn until(
        handles: &[&ShardedHandle],
        within: Duration,
        what: &str,
        done: impl Fn(&[BTreeMap<u32, FencingToken>]) -> bool,
    ) -> Result<Vec<BTreeMap<u32, FencingToken>>, Failure> {
        let end = Instant::now() + within;
        loop {
            let led: Vec<_> = handles.iter().map(|h| h.led()).collect();
            for s in 0..SHARDS {
                let n = led.iter().filter(|l| l.contains_key(&s)).count();
                ensure!(n <= 1, CASE, "shard {s} led by {n} instances at once");
            }
            if done(&led) {
                return Ok(led);
            }
            ensure!(
                Instant::now() < end,
                CASE,
                "{what} did not happen within {within:?}: {led:?}"
            );
            sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Runs every case in turn, in the order of the one case list (that of
/// [`conformance_tests!`](crate::conformance_tests)).
///
/// # Errors
/// The first [`Failure`].
pub async fn run_all<H: Harness + ?Sized>(h: &H) -> Result<(), Failure> {
    crate::conformance_tests!(@list @run h);
    Ok(())
}

/// Generates one `#[tokio::test]` per conformance case for a harness expression.
///
/// `conformance_tests!(paused: expr)` runs the cases with paused tokio time (for stores that
/// do no real I/O); `conformance_tests!(expr)` runs them on a multi-threaded runtime in real
/// time. The calling crate needs `tokio` with the `macros` and `rt-multi-thread` features
/// (and `test-util` for `paused`).
#[macro_export]
macro_rules! conformance_tests {
    // The one list of cases; `@list` hands it to the arm named after it.
    (@list $($then:tt)*) => {
        $crate::conformance_tests!($($then)*;
            fidelity_canary, create_if_absent, conflicting_create, renew, release_then_acquire,
            race, deposed_fenced_write_rejected, fenced_put_needs_the_revision_it_read,
            fence_with_a_separate_lease_term, unchecked_put_is_a_plain_cas,
            malformed_record_is_reported_and_kept,
            read_if_changed_follows_writes, token_survives_deletion, takeover_only_after_full_ttl,
            stale_renew_is_conflict, sharded_balance_and_handover);
    };
    (@run $h:ident; $($case:ident),* $(,)?) => {
        $( $crate::conformance::$case($h).await?; )*
    };
    (@cases $rt:tt $harness:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test $rt]
            async fn $case() {
                let harness = $harness;
                if let Err(failure) = $crate::conformance::$case(&harness).await {
                    panic!("{failure}");
                }
            }
        )*
    };
    (paused: $harness:expr) => {
        $crate::conformance_tests!(@list @cases (start_paused = true) $harness);
    };
    ($harness:expr) => {
        $crate::conformance_tests!(@list @cases (flavor = "multi_thread", worker_threads = 2) $harness);
    };
}
