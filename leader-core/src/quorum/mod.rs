//! One leader over a majority of independent stores: an election that survives the outage of
//! any minority of them.
//!
//! Every member store keeps, per key, a term record (`KEY.q`), a token high-water mark
//! (`KEY.qhw`) and its identity (`KEY.qid`), written by plain compare-and-swap. A candidate
//! leads while a majority of the members carry a live record of its term: per member, the
//! single-key rules of `docs/protocol.md` (a follower takes a record over only after seeing it
//! unchanged for a full ttl on its own clock; a leader's deadline on a member is the send time
//! of its last acknowledged write there plus `ttl - margin`), and across them:
//! - the term's deadline is the majority-th largest of the members' deadlines;
//! - one token per term, above every token and mark that a read of a majority showed, raised
//!   into each member's mark before the term's record is written there (so that it survives
//!   a deleted record), the same on every member;
//! - a candidate that cannot take a majority in one round writes nothing; one that took only
//!   a minority gives it back and backs off;
//! - an absent record on a member of a key with a history is never taken directly: a
//!   *tombstone* is written there first, and timed as any record.
//!
//! `docs/quorum.md` has the rules, the argument for their safety, and their limits. Build an
//! elector over a quorum with [`Elector::quorum_builder`](crate::Elector::quorum_builder).
//!
//! ```
//! use std::sync::Arc;
//! use leader_core::quorum::{Quorum, QuorumMember};
//! use leader_core::{Elector, LeaseKey, MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let quorum = Quorum::new(vec![
//!     QuorumMember::new("a", Arc::new(MemoryStore::new())),
//!     QuorumMember::new("b", Arc::new(MemoryStore::new())),
//!     QuorumMember::new("c", Arc::new(MemoryStore::new())),
//! ])?;
//! let handle = Elector::quorum_builder(quorum, LeaseKey::new("nightly")?).build()?.spawn();
//! let term = handle.wait_for_term().await?;
//! println!("leading with token {} on a majority of 3 stores", term.token());
//! drop(term);
//! handle.shutdown().await;
//! # Ok(())
//! # }
//! ```

mod client;
pub(crate) mod flaw;
mod member;
pub(crate) mod record;
mod status;

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

use crate::backend::{FencedCas, FencedObject, FencedPut, ObjectWrite, ShardStore};
use crate::error::{ConfigError, Error};
use crate::model::ObjectName;

pub(crate) use client::QuorumClient;
use flaw::QuorumFlaw;
pub use status::{MemberView, QuorumStatus, read_status};

/// The most members a quorum may have.
pub const MAX_MEMBERS: usize = 9;

/// One store of a [`Quorum`], with its name.
///
/// The name says which store it is, the same way on every candidate (the `leader` facade uses
/// the store's URL without its endpoint): the member set's fingerprint, which every record
/// carries, is made of the names, so that candidates configured with different sets refuse
/// each other's records instead of both leading.
#[derive(Clone)]
pub struct QuorumMember {
    name: String,
    store: Arc<dyn ShardStore>,
}

impl QuorumMember {
    /// The member `name`, on `store`.
    pub fn new(name: impl Into<String>, store: Arc<dyn ShardStore>) -> Self {
        Self {
            name: name.into(),
            store,
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its store.
    pub fn store(&self) -> &Arc<dyn ShardStore> {
        &self.store
    }

    pub(crate) fn objects(&self) -> Arc<dyn FencedCas> {
        self.store.clone().objects()
    }
}

impl fmt::Debug for QuorumMember {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuorumMember")
            .field("name", &self.name)
            .field("store", &self.store.name())
            .finish()
    }
}

/// The member stores of an election over a majority: an odd number from 3 to
/// [`MAX_MEMBERS`], each named once. Members must be independent (no replication between
/// them, no shared account, region or control plane) and durable (a store that loses an
/// acknowledged write, or is restored in place from a backup, breaks the majority's memory):
/// `docs/quorum.md`.
///
/// It is also a [`FencedCas`] (and so a [`FencedStore`](crate::FencedStore)) for the objects a
/// leader protects: they live on the first member, and are fenced by the quorum's token
/// alone (the lease lives in no one store, so no store checks it). Tokens strictly increase
/// from term to term across the quorum, so a deposed leader's late write is refused there as
/// on a single store; while that member is away, fenced writes fail.
#[derive(Clone, Debug)]
pub struct Quorum {
    members: Vec<QuorumMember>,
    flaw: QuorumFlaw,
}

impl Quorum {
    /// The quorum of `members`.
    ///
    /// # Errors
    /// [`ConfigError::InvalidQuorum`] for an even number of members (a majority of 2 of 4
    /// survives no more outages than 2 of 3, and two halves could each count 2), fewer than 3
    /// or more than [`MAX_MEMBERS`], or a name given twice.
    pub fn new(members: Vec<QuorumMember>) -> Result<Self, ConfigError> {
        let names: Vec<String> = members.iter().map(|m| m.name.clone()).collect();
        Self::check_names(&names)?;
        Ok(Self {
            members,
            flaw: QuorumFlaw::None,
        })
    }

    /// Simulation only: the quorum of `members` without the checks of [`new`](Self::new)
    /// (an even number, for a negative control).
    #[cfg(feature = "simulation")]
    pub fn unchecked(members: Vec<QuorumMember>) -> Self {
        Self {
            members,
            flaw: QuorumFlaw::None,
        }
    }

    /// Simulation only: plant a flaw in every candidate built on this quorum, to show that
    /// the checkers catch it.
    #[cfg(feature = "simulation")]
    #[must_use]
    pub fn with_flaw(mut self, flaw: QuorumFlaw) -> Self {
        self.flaw = flaw;
        self
    }

    /// Checks a quorum's member names as [`new`](Self::new) does, before any store is opened.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn check_names(names: &[String]) -> Result<(), ConfigError> {
        let n = names.len();
        if !(3..=MAX_MEMBERS).contains(&n) || n.is_multiple_of(2) {
            return Err(ConfigError::InvalidQuorum(format!(
                "{n} members; an election over a quorum needs an odd number from 3 to \
                 {MAX_MEMBERS} (3 survives the loss of any one store, 5 of any two)"
            )));
        }
        for (i, name) in names.iter().enumerate() {
            if names[..i].contains(name) {
                return Err(ConfigError::InvalidQuorum(format!(
                    "the member {name} is given twice; each store may count once"
                )));
            }
        }
        Ok(())
    }

    /// The members, in the order given.
    pub fn members(&self) -> &[QuorumMember] {
        &self.members
    }

    /// How many members a term needs: a majority.
    pub fn majority(&self) -> usize {
        match self.flaw {
            QuorumFlaw::MajorityOfOne if cfg!(feature = "simulation") => 1,
            QuorumFlaw::EvenHalves if cfg!(feature = "simulation") => self.members.len() / 2,
            _ => self.members.len() / 2 + 1,
        }
    }

    pub(crate) fn flaw(&self) -> QuorumFlaw {
        self.flaw
    }

    fn first(&self) -> Arc<dyn FencedCas> {
        self.members[0].objects()
    }
}

#[async_trait]
impl FencedCas for Quorum {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        self.first().get_fenced(object).await
    }

    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        self.first().put_fenced_if(put.without_lease_check()).await
    }
}

/// Runs `futures` side by side and returns their outputs in order.
pub(crate) async fn join_all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    use std::task::Poll;
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, slot) in futures.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *slot = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}
