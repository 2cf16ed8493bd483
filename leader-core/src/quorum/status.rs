//! What an operator sees of an election over a quorum: each member's record, and the term a
//! majority carries.

use std::time::Duration;

use super::member::{Found, Io, Member};
use super::record::{Names, State, members_hash};
use super::{Quorum, join_all};
use crate::error::Error;
use crate::metrics::StoreMetrics;
use crate::model::{HolderId, LeaseKey, Metadata};

/// One member as a read showed it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemberView {
    /// The member's name.
    pub name: String,
    /// The error, if the member did not answer (or its record cannot be read).
    pub error: Option<String>,
    /// The record's holder, if there is a record.
    pub holder: Option<HolderId>,
    /// The record's quorum token.
    pub token: Option<u64>,
    /// Whether the record is held (`false`: released, or a tombstone).
    pub held: bool,
    /// The record's term (32 hex digits).
    pub term: Option<String>,
    /// Whether the record was written by a candidate with the same member set as the one
    /// read with.
    pub same_members: bool,
    /// The member's token high-water mark.
    pub mark: Option<u64>,
    /// What the record's writer publishes.
    pub metadata: Metadata,
}

/// An election over a quorum as one read of every member shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct QuorumStatus {
    /// The lease key.
    pub key: LeaseKey,
    /// How many members a term needs.
    pub majority: usize,
    /// Each member, in the order of the quorum.
    pub members: Vec<MemberView>,
    /// The term a majority of the members carries, if one does: its holder, its token and
    /// its metadata. (Whether its records are still renewed, one read cannot tell.)
    pub leader: Option<(HolderId, u64, Metadata)>,
}

/// Reads every member of `quorum` once, side by side: each member's record of `key` and its
/// token mark, and the term a majority carries.
///
/// # Errors
/// [`Error::InvalidConfig`] if `key` makes no valid object names. A member that does not
/// answer is reported in its [`MemberView::error`], not as an error.
pub async fn read_status(
    quorum: &Quorum,
    key: &LeaseKey,
    request_timeout: Duration,
) -> Result<QuorumStatus, Error> {
    let objects = Names::new(key).map_err(|e| Error::InvalidConfig {
        message: e.to_string(),
        source: None,
    })?;
    let holder = HolderId::new("status").map_err(|e| Error::InvalidConfig {
        message: e.to_string(),
        source: None,
    })?;
    let names: Vec<String> = quorum.members().iter().map(|m| m.name.clone()).collect();
    let reads = quorum
        .members()
        .iter()
        .map(|m| {
            let member = Member {
                name: m.name.clone(),
                cas: m.objects(),
                metrics: StoreMetrics::new(key, &holder, m.store.name()),
                seen: None,
                own: None,
                id: None,
                foreign: None,
            };
            Io::for_member(
                &member,
                &objects,
                key,
                &holder,
                request_timeout,
                request_timeout,
            )
            .look()
        })
        .collect();
    let answers = join_all(reads).await;
    let mut members = Vec::with_capacity(answers.len());
    for (m, answer) in quorum.members().iter().zip(answers) {
        let mut view = MemberView {
            name: m.name.clone(),
            error: None,
            holder: None,
            token: None,
            held: false,
            term: None,
            same_members: true,
            mark: None,
            metadata: Metadata::new(),
        };
        match answer {
            Err(e) => view.error = Some(e.to_string()),
            Ok(a) => {
                view.mark = a.mark().map(|(t, _)| t);
                match a.found {
                    Found::Absent => {}
                    Found::Damaged { key, detail } => {
                        view.error = Some(format!("{key} is malformed: {detail}"));
                    }
                    Found::Record { record, token, .. } => {
                        view.held = record.state == State::Held;
                        let ttl = Duration::from_millis(record.ttl_ms);
                        view.same_members = record.members == members_hash(&names, ttl);
                        view.holder = Some(record.holder);
                        view.token = Some(token);
                        view.term = Some(record.term);
                        view.metadata = record.metadata;
                    }
                }
            }
        }
        members.push(view);
    }
    let majority = quorum.majority();
    let leader = members
        .iter()
        .filter(|v| v.held)
        .find(|v| {
            members
                .iter()
                .filter(|o| o.held && o.term == v.term)
                .count()
                >= majority
        })
        .and_then(|v| Some((v.holder.clone()?, v.token?, v.metadata.clone())));
    Ok(QuorumStatus {
        key: key.clone(),
        majority,
        members,
        leader,
    })
}
