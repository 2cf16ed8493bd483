//! What an [`Elector`](crate::Elector) campaigns through: the lease of one store
//! ([`LeaseClient`]) or a majority of independent stores ([`QuorumClient`](crate::quorum)).
//! The elector's term handling (deadline, watchdog, `Term`, stepping down) is the same for
//! both; only the rules of acquiring, renewing and releasing differ.

use std::fmt;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::backend::Changes;
use crate::error::Error;
use crate::lease::{Acquisition, LeaseClient, ObservedLeader, Renewal};
use crate::metrics::StoreContact;
use crate::model::{HolderId, LeaseKey};
use crate::token::FencingToken;

/// A term as a candidate's reads showed it: for the time without a leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SeenTerm {
    pub(crate) token: FencingToken,
    /// Held (or released).
    pub(crate) held: bool,
    /// The first answer that showed its latest record.
    pub(crate) since: Instant,
}

/// One candidate's campaign for one key: the calls an elector makes, with the meaning of
/// [`LeaseClient`]'s methods of the same names.
#[async_trait]
pub(crate) trait Campaign: Send + fmt::Debug {
    fn key(&self) -> &LeaseKey;
    fn holder(&self) -> &HolderId;
    /// When the store (a majority of the stores) last answered.
    fn store_contact(&self) -> StoreContact;
    /// The store's change hints, if it gives them.
    fn changes(&self) -> Option<Changes>;
    async fn try_acquire(&mut self) -> Result<Acquisition, Error>;
    /// The leader as a follower's read shows it now, without trying to acquire.
    async fn observe(&mut self) -> Result<Option<ObservedLeader>, Error>;
    async fn renew(&mut self) -> Result<Renewal, Error>;
    async fn release(&mut self) -> Result<bool, Error>;
    fn end_term(&mut self, why: &str);
    /// The term follower reads last showed.
    fn seen(&self) -> Option<SeenTerm>;
    /// The term the last successful acquire replaced, as last seen.
    fn replaced(&self) -> Option<SeenTerm>;
}

#[async_trait]
impl Campaign for LeaseClient {
    fn key(&self) -> &LeaseKey {
        LeaseClient::key(self)
    }
    fn holder(&self) -> &HolderId {
        LeaseClient::holder(self)
    }
    fn store_contact(&self) -> StoreContact {
        LeaseClient::store_contact(self)
    }
    fn changes(&self) -> Option<Changes> {
        LeaseClient::changes(self)
    }
    async fn try_acquire(&mut self) -> Result<Acquisition, Error> {
        LeaseClient::try_acquire(self).await
    }
    async fn observe(&mut self) -> Result<Option<ObservedLeader>, Error> {
        let found = LeaseClient::observe(self).await?;
        Ok(found.and_then(|s| {
            s.record.is_held().then_some(ObservedLeader {
                holder: s.record.holder,
                token: s.record.token,
                metadata: s.record.metadata,
            })
        }))
    }
    async fn renew(&mut self) -> Result<Renewal, Error> {
        LeaseClient::renew(self).await
    }
    async fn release(&mut self) -> Result<bool, Error> {
        LeaseClient::release(self).await
    }
    fn end_term(&mut self, why: &str) {
        LeaseClient::end_term(self, why);
    }
    fn seen(&self) -> Option<SeenTerm> {
        self.observed().map(|(s, since)| SeenTerm {
            token: s.record.token,
            held: s.record.is_held(),
            since,
        })
    }
    fn replaced(&self) -> Option<SeenTerm> {
        LeaseClient::replaced(self).map(|(s, since)| SeenTerm {
            token: s.record.token,
            held: s.record.is_held(),
            since,
        })
    }
}
