//! Who leads which shards, read from the store: one read of the roster, one per member.

use crate::backend::{FencedCas, LeaseBackend, within};
use crate::call::DEFAULT_BUDGET;
use crate::error::{ConfigError, Error};
use crate::model::{HolderId, LeaseKey, Metadata};
use crate::token::FencingToken;

use super::records::{Names, Roster, ShardSet, claims_of};

/// One member of a sharded key as its record shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemberStatus {
    /// The member's id.
    pub id: HolderId,
    /// The key of its membership lease record.
    pub record: LeaseKey,
    /// Whether its membership record is held by it (a live or not yet expired member).
    pub held: bool,
    /// Its membership term's token (0 if it has no record).
    pub token: FencingToken,
    /// The shards it claims (empty unless held).
    pub claims: ShardSet,
    /// The record's metadata as stored.
    pub metadata: Metadata,
}

/// The assignment of a sharded key's shards as the members publish it.
///
/// Claims say where each shard is led, as of each member's last renew; the shard records
/// stay the authority (a claim may lag a take or a release by one renew).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardedStatus {
    /// The number of shards.
    pub shards: u32,
    /// The members in the roster.
    pub members: Vec<MemberStatus>,
    /// Shards that no held member claims.
    pub unclaimed: ShardSet,
}

/// Reads the assignment of the sharded `key`: the roster, then each member's record. `None`
/// if no instance has joined the key.
///
/// # Errors
/// Any store [`Error`]; [`Error::MalformedRecord`] if the roster is damaged.
pub async fn read_status<S>(store: &S, key: &LeaseKey) -> Result<Option<ShardedStatus>, Error>
where
    S: LeaseBackend + FencedCas + ?Sized,
{
    let names = Names::new(key).map_err(|e: ConfigError| Error::InvalidConfig {
        message: e.to_string(),
        source: None,
    })?;
    let timeout = |operation| Error::Timeout {
        operation,
        after: DEFAULT_BUDGET,
    };
    let Some(object) = within(DEFAULT_BUDGET, store.get_fenced(names.roster()))
        .await
        .map_err(|_| timeout("reading the roster"))??
    else {
        return Ok(None);
    };
    let roster = Roster::decode(names.roster(), &object.value)?;
    let mut unclaimed = ShardSet::new(roster.shards);
    for s in 0..roster.shards {
        unclaimed.insert(s);
    }
    let mut members = Vec::with_capacity(roster.members.len());
    for id in roster.ids() {
        let record = names.member(&id);
        let found = within(DEFAULT_BUDGET, store.read(&record))
            .await
            .map_err(|_| timeout("reading a member record"))??;
        let held = found
            .as_ref()
            .is_some_and(|s| s.record.is_held() && s.record.holder == id);
        let claims = found
            .as_ref()
            .filter(|_| held)
            .and_then(|s| claims_of(roster.shards, &s.record.metadata))
            .unwrap_or_else(|| ShardSet::new(roster.shards));
        for s in claims.iter() {
            unclaimed.remove(s);
        }
        members.push(MemberStatus {
            id,
            record,
            held,
            token: found.as_ref().map_or(FencingToken(0), |s| s.record.token),
            claims,
            metadata: found.map(|s| s.record.metadata).unwrap_or_default(),
        });
    }
    Ok(Some(ShardedStatus {
        shards: roster.shards,
        members,
        unclaimed,
    }))
}
