//! The replicated state: lease records, high-water tokens and fenced objects, changed only by
//! [`Command`]s applied in log order, the same way on every member.
//!
//! The semantics are the in-memory store's ([`leader_core::MemoryStore`]): records kept as the
//! JSON bytes the core wrote, conditional writes on a revision, an acquire minting above the
//! key's high-water token, the high-water kept across a delete. The revision of every write is
//! the Raft log index of the entry that made it (as a decimal string): the same on every
//! member, and never reused.

use std::collections::BTreeMap;
use std::io::Cursor;

use leader_core::FencingToken;
use leader_core::backend::{Expected, WriteKind};
use openraft::{BasicNode, LogId, StoredMembership};
use serde::{Deserialize, Serialize};

openraft::declare_raft_types!(
    /// The openraft types of the group.
    pub(crate) TypeConfig:
        D = Command,
        R = Response,
        NodeId = u64,
        Node = BasicNode,
);

/// A condition of a conditional write, as replicated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Condition {
    /// Nothing is stored under the name.
    Absent,
    /// What is stored has exactly this revision.
    Revision(String),
}

impl Condition {
    fn matches(&self, current: Option<&str>) -> bool {
        match self {
            Condition::Absent => current.is_none(),
            Condition::Revision(r) => current == Some(r.as_str()),
        }
    }
}

impl From<&Expected> for Condition {
    fn from(expected: &Expected) -> Self {
        match expected {
            Expected::Absent => Condition::Absent,
            Expected::Revision(r) => Condition::Revision(r.as_str().to_owned()),
        }
    }
}

/// A change to the state, one per log entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Command {
    /// A conditional write of a lease record (JSON bytes from `LeaseRecord::to_json`).
    WriteLease {
        /// The lease key.
        key: String,
        /// The condition.
        expected: Condition,
        /// The record as JSON.
        record: Vec<u8>,
        /// Whether the write begins a term (then the token is minted above the high-water).
        acquire: bool,
    },
    /// An operator's delete of a lease record; the key's high-water token stays.
    DeleteLease {
        /// The lease key.
        key: String,
    },
    /// Raw bytes stored as a lease record, unchecked (to plant a malformed record in tests).
    PutRaw {
        /// The lease key.
        key: String,
        /// The bytes.
        bytes: Vec<u8>,
    },
    /// A conditional write of a protected object.
    PutFenced {
        /// The object name.
        object: String,
        /// The condition.
        expected: Condition,
        /// The writer's token, stored as the object's fence.
        fence: u64,
        /// The content.
        value: Vec<u8>,
    },
    /// An operator's delete of a protected object.
    DeleteObject {
        /// The object name.
        object: String,
    },
}

impl Command {
    /// The write of `request` as a command.
    pub(crate) fn write(request: &leader_core::backend::WriteRequest) -> Self {
        Command::WriteLease {
            key: request.key.as_str().to_owned(),
            expected: Condition::from(&request.expected),
            record: request.record.to_json(),
            acquire: request.kind == WriteKind::Acquire,
        }
    }
}

/// Bytes stored under a name, with their revision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredBytes {
    /// The stored bytes.
    pub bytes: Vec<u8>,
    /// Their revision: the log index of the write.
    pub revision: String,
}

/// A protected object as replicated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredObject {
    /// The token of the write that made it.
    pub fence: u64,
    /// The content.
    pub value: Vec<u8>,
    /// The revision: the log index of the write.
    pub revision: String,
}

/// What applying a command answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Response {
    /// An entry without an answer (blank, membership, delete, raw put).
    Done,
    /// A lease write applied: the record as stored (its token possibly raised).
    Written(StoredBytes),
    /// A lease write whose condition failed: what is there, if anything.
    Conflict(Option<StoredBytes>),
    /// An object write applied, with its new revision.
    ObjectWritten(String),
    /// An object write whose condition failed.
    ObjectConflict,
    /// The command carried a record that cannot be parsed; nothing was written.
    Refused(String),
}

/// The replicated data.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Leases {
    leases: BTreeMap<String, StoredBytes>,
    /// The highest token ever written per key; kept when a record is deleted.
    high_water: BTreeMap<String, u64>,
    objects: BTreeMap<String, StoredObject>,
}

impl Leases {
    /// The record of `key`.
    pub(crate) fn lease(&self, key: &str) -> Option<&StoredBytes> {
        self.leases.get(key)
    }

    /// The protected object `name`.
    pub(crate) fn object(&self, name: &str) -> Option<&StoredObject> {
        self.objects.get(name)
    }

    /// Applies `command`, the entry at log `index`. Deterministic: the same state, index and
    /// command give the same result on every member.
    pub(crate) fn apply(&mut self, index: u64, command: &Command) -> Response {
        let revision = index.to_string();
        match command {
            Command::WriteLease {
                key,
                expected,
                record,
                acquire,
            } => self.write_lease(key, expected, record, *acquire, revision),
            Command::DeleteLease { key } => {
                self.leases.remove(key);
                Response::Done
            }
            Command::PutRaw { key, bytes } => {
                let stored = StoredBytes {
                    bytes: bytes.clone(),
                    revision,
                };
                self.leases.insert(key.clone(), stored);
                Response::Done
            }
            Command::PutFenced {
                object,
                expected,
                fence,
                value,
            } => {
                let current = self.objects.get(object).map(|o| o.revision.as_str());
                if !expected.matches(current) {
                    return Response::ObjectConflict;
                }
                let stored = StoredObject {
                    fence: *fence,
                    value: value.clone(),
                    revision: revision.clone(),
                };
                self.objects.insert(object.clone(), stored);
                Response::ObjectWritten(revision)
            }
            Command::DeleteObject { object } => {
                self.objects.remove(object);
                Response::Done
            }
        }
    }

    fn write_lease(
        &mut self,
        key: &str,
        expected: &Condition,
        record: &[u8],
        acquire: bool,
        revision: String,
    ) -> Response {
        let current = self.leases.get(key);
        if !expected.matches(current.map(|s| s.revision.as_str())) {
            return Response::Conflict(current.cloned());
        }
        let mut record = match leader_core::backend::LeaseRecord::from_json(key, record) {
            Ok(record) => record,
            Err(e) => return Response::Refused(e.to_string()),
        };
        let high = self.high_water.get(key).copied().unwrap_or(0);
        if acquire && record.token.get() <= high {
            // Deleted since the writer read it: mint above every token the key ever had.
            record.token = FencingToken(high.saturating_add(1));
        }
        self.high_water
            .insert(key.to_owned(), high.max(record.token.get()));
        let stored = StoredBytes {
            bytes: record.to_json(),
            revision,
        };
        self.leases.insert(key.to_owned(), stored.clone());
        Response::Written(stored)
    }
}

/// The state machine's content: the data, the last applied entry and the membership.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Machine {
    /// The last entry applied.
    pub last_applied: Option<LogId<u64>>,
    /// The last membership applied.
    pub membership: StoredMembership<u64, BasicNode>,
    /// The data.
    pub leases: Leases,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use std::time::Duration;

    use leader_core::HolderId;
    use leader_core::backend::LeaseRecord;
    use leader_core::backend::WriteNonce;

    use super::*;

    fn record(token: u64) -> Vec<u8> {
        LeaseRecord::held(
            HolderId::new("h").unwrap(),
            FencingToken(token),
            Duration::from_secs(5),
            Default::default(),
            WriteNonce(token),
        )
        .to_json()
    }

    fn write(key: &str, expected: Condition, token: u64, acquire: bool) -> Command {
        Command::WriteLease {
            key: key.into(),
            expected,
            record: record(token),
            acquire,
        }
    }

    #[test]
    fn conditions_revisions_and_high_water() {
        let mut s = Leases::default();
        let Response::Written(first) = s.apply(3, &write("k", Condition::Absent, 1, true)) else {
            panic!("first write")
        };
        assert_eq!(first.revision, "3");
        // The same condition again conflicts and shows the record.
        assert_eq!(
            s.apply(4, &write("k", Condition::Absent, 1, true)),
            Response::Conflict(Some(first.clone()))
        );
        assert!(matches!(
            s.apply(5, &write("k", Condition::Revision("2".into()), 2, false)),
            Response::Conflict(_)
        ));
        // A delete keeps the high-water: the next acquire mints above it.
        s.apply(6, &Command::DeleteLease { key: "k".into() });
        let Response::Written(again) = s.apply(7, &write("k", Condition::Absent, 1, true)) else {
            panic!("acquire after delete")
        };
        let token = LeaseRecord::from_json("k", &again.bytes).unwrap().token;
        assert_eq!(token, FencingToken(2));
        assert_eq!(again.revision, "7");
    }

    #[test]
    fn objects_have_their_own_revisions() {
        let mut s = Leases::default();
        let put = |expected| Command::PutFenced {
            object: "o".into(),
            expected,
            fence: 4,
            value: b"v".to_vec(),
        };
        assert_eq!(
            s.apply(9, &put(Condition::Absent)),
            Response::ObjectWritten("9".into())
        );
        assert_eq!(
            s.apply(10, &put(Condition::Absent)),
            Response::ObjectConflict
        );
        assert_eq!(
            s.apply(11, &put(Condition::Revision("9".into()))),
            Response::ObjectWritten("11".into())
        );
        assert_eq!(s.object("o").unwrap().fence, 4);
    }

    #[test]
    fn a_bad_record_is_refused_and_raw_bytes_are_kept() {
        let mut s = Leases::default();
        let bad = Command::WriteLease {
            key: "k".into(),
            expected: Condition::Absent,
            record: b"nope".to_vec(),
            acquire: true,
        };
        assert!(matches!(s.apply(1, &bad), Response::Refused(_)));
        s.apply(
            2,
            &Command::PutRaw {
                key: "k".into(),
                bytes: b"nope".to_vec(),
            },
        );
        assert_eq!(s.lease("k").unwrap().bytes, b"nope");
    }
}
