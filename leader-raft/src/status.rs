//! A member's view of the group.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What one member knows of the group, from its own Raft state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Status {
    /// This member's id (its position in the sorted member list, from 1).
    pub id: u64,
    /// This member's address.
    pub address: String,
    /// The leader this member knows of, if any.
    pub leader: Option<u64>,
    /// The leader's address, if a leader is known.
    pub leader_address: Option<String>,
    /// The member's Raft role: `Leader`, `Follower`, `Candidate`, `Learner` or `Shutdown`.
    pub role: String,
    /// The current Raft term.
    pub term: u64,
    /// The index of the last entry in this member's log.
    pub last_log_index: Option<u64>,
    /// The index of the last entry applied to this member's state.
    pub last_applied_index: Option<u64>,
    /// The voters of the membership this member applies, by id.
    pub members: BTreeMap<u64, String>,
    /// Whether this member rejoined with an empty folder and has not caught up yet (it takes
    /// no part in elections meanwhile).
    pub catching_up: bool,
    /// Requests this member has sent to the others since it started (Raft's and forwarded
    /// client calls; each has one answer).
    pub requests_sent: u64,
}
