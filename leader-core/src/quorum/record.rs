//! What an election over a quorum keeps in each member store: the term record, the token
//! high-water mark, and the member's identity, each a protected object written by plain
//! compare-and-swap ([`FencedPut::without_lease_check`](crate::backend::FencedPut)).

use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, Error};
use crate::model::{HolderId, LeaseKey, Metadata, ObjectName};

/// The objects of one key in each member store.
#[derive(Clone, Debug)]
pub(crate) struct Names {
    /// The term record: `KEY.q`; its fence is the quorum token of the term.
    pub(crate) record: ObjectName,
    /// The token high-water mark: `KEY.qhw`; its fence only ever rises.
    pub(crate) high: ObjectName,
    /// The member's identity: `KEY.qid`, drawn by whoever finds it absent.
    pub(crate) id: ObjectName,
}

impl Names {
    pub(crate) fn new(key: &LeaseKey) -> Result<Self, ConfigError> {
        Ok(Self {
            record: ObjectName::new(format!("{key}.q"))?,
            high: ObjectName::new(format!("{key}.qhw"))?,
            id: ObjectName::new(format!("{key}.qid"))?,
        })
    }
}

/// Whether a term record says its term holds the lease, or gave it up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum State {
    Held,
    Released,
}

/// A term record as stored (the token is the object's fence, not in the body).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) v: u32,
    pub(crate) holder: HolderId,
    /// The term, the same on every member it holds: 32 hex digits. A tombstone (written on
    /// a member found empty) names a term that never was.
    pub(crate) term: String,
    pub(crate) state: State,
    /// Drawn for every write, so that two writes never leave the same bytes, and a writer
    /// can recognise its own write after a lost answer.
    pub(crate) nonce: u64,
    /// The writer's ttl in milliseconds: followers wait at least this long.
    pub(crate) ttl_ms: u64,
    /// The member set of the writer (a hash of its members' names, their number and the ttl).
    pub(crate) members: String,
    /// The identity (`K.qid`) of the member it was written to: a record written before the
    /// member was emptied, landing late, is not taken for the member's history.
    #[serde(default)]
    pub(crate) stamp: String,
    #[serde(default)]
    pub(crate) metadata: Metadata,
}

impl Record {
    pub(crate) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub(crate) fn decode(name: &ObjectName, member: &str, bytes: &[u8]) -> Result<Self, Error> {
        serde_json::from_slice(bytes).map_err(|e| Error::MalformedRecord {
            key: format!("{name} on {member}"),
            detail: format!(
                "it is not a quorum election's term record ({e}); another program wrote it, or \
                 it was damaged: delete it (a candidate then waits a ttl before taking the \
                 member)"
            ),
        })
    }

    pub(crate) fn is_held(&self) -> bool {
        self.state == State::Held
    }
}

/// A term's id, as records carry it.
pub(crate) fn term_id(hi: u64, lo: u64) -> String {
    format!("{hi:016x}{lo:016x}")
}

/// The member set's fingerprint: its size, its members' names (in any order) and the ttl of
/// every candidate (a tombstone stands for a deleted record of unknown writer, and is timed
/// by the ttl of its own writer: every candidate of a key must have the same).
pub(crate) fn members_hash(names: &[String], ttl: std::time::Duration) -> String {
    let mut sorted: Vec<&str> = names.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    let text = format!("{}:{}:{}", sorted.len(), ttl.as_millis(), sorted.join("\n"));
    format!("{:016x}", crate::rand::stable_hash(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: std::time::Duration = std::time::Duration::from_secs(15);

    #[test]
    fn a_record_round_trips_and_a_damaged_one_names_the_member() {
        let r = Record {
            v: 1,
            holder: HolderId::new("a").unwrap(),
            term: term_id(1, 2),
            state: State::Held,
            nonce: 7,
            ttl_ms: 15_000,
            members: members_hash(&["x".to_owned(), "y".to_owned(), "z".to_owned()], TTL),
            stamp: "id".to_owned(),
            metadata: Metadata::new(),
        };
        let name = ObjectName::new("k.q").unwrap();
        assert_eq!(Record::decode(&name, "m1", &r.encode()).unwrap(), r);
        let e = Record::decode(&name, "m1", b"garbage").unwrap_err();
        assert!(e.to_string().contains("k.q on m1"), "{e}");
    }

    #[test]
    fn the_member_hash_ignores_order_and_counts_members_and_the_ttl() {
        let abc = members_hash(&["a".into(), "b".into(), "c".into()], TTL);
        assert_eq!(
            abc,
            members_hash(&["c".into(), "a".into(), "b".into()], TTL)
        );
        assert_ne!(
            abc,
            members_hash(&["a".into(), "b".into(), "d".into()], TTL)
        );
        assert_ne!(abc, members_hash(&["a".into(), "b".into()], TTL));
        let other_ttl = members_hash(&["a".into(), "b".into(), "c".into()], TTL * 2);
        assert_ne!(abc, other_ttl);
    }
}
