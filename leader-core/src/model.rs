//! The values every layer shares: names, tokens, revisions and the stored lease record.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, Error};
use crate::rand::Rng;
use crate::token::FencingToken;

/// Longest accepted [`LeaseKey`] or [`ObjectName`], in bytes.
pub const MAX_NAME_LEN: usize = 128;
/// Longest accepted [`HolderId`], in bytes.
pub const MAX_HOLDER_LEN: usize = 200;
/// Largest accepted total size of a record's metadata (keys plus values), in bytes.
///
/// Azure keeps metadata in 8 KiB of headers; this leaves room for the record's own fields.
pub const MAX_METADATA_BYTES: usize = 4096;

fn check_name(what: &'static str, name: &str) -> Result<(), ConfigError> {
    let invalid = |reason: &str| ConfigError::InvalidName {
        what,
        name: name.to_owned(),
        reason: reason.to_owned(),
    };
    if name.is_empty() {
        return Err(invalid("it is empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(invalid("it is longer than 128 bytes"));
    }
    if name.starts_with('.') {
        return Err(invalid("it starts with '.'"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(invalid(&format!(
            "it contains {c:?}; use ASCII letters, digits, '-', '_' and '.'"
        )));
    }
    Ok(())
}

/// The name of one election ("scheduler", "shard-17").
///
/// Each backend maps it to one object: a blob, an item, an object, a file. Keys are 1 to 128
/// bytes of ASCII letters, digits, `-`, `_` and `.`, and do not start with `.`, so that every
/// store can use them as they are.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct LeaseKey(String);

impl LeaseKey {
    /// Validates `name` as a lease key.
    ///
    /// # Errors
    /// [`ConfigError::InvalidName`] if the name is empty, too long, or has other characters.
    pub fn new(name: impl Into<String>) -> Result<Self, ConfigError> {
        let name = name.into();
        check_name("lease key", &name)?;
        Ok(Self(name))
    }

    /// The key as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for LeaseKey {
    type Error = ConfigError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<LeaseKey> for String {
    fn from(value: LeaseKey) -> Self {
        value.0
    }
}

impl fmt::Display for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The name of an object protected by fencing tokens, in the same store as the lease.
///
/// Same rules as [`LeaseKey`].
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectName(String);

impl ObjectName {
    /// Validates `name` as an object name.
    ///
    /// # Errors
    /// [`ConfigError::InvalidName`] if the name is empty, too long, or has other characters.
    pub fn new(name: impl Into<String>) -> Result<Self, ConfigError> {
        let name = name.into();
        check_name("object name", &name)?;
        Ok(Self(name))
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ObjectName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who campaigns: one process, one `HolderId`.
///
/// The default, [`HolderId::generate`], is `hostname-pid-suffix` with a random suffix, so that
/// a restarted process never mistakes its predecessor's lease for its own. Holder ids are 1 to
/// 200 bytes of printable ASCII without spaces.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HolderId(String);

impl HolderId {
    /// Validates `id` as a holder id.
    ///
    /// # Errors
    /// [`ConfigError::InvalidName`] if the id is empty, too long, or not printable ASCII.
    pub fn new(id: impl Into<String>) -> Result<Self, ConfigError> {
        let id = id.into();
        let invalid = |reason: &str| ConfigError::InvalidName {
            what: "holder id",
            name: id.clone(),
            reason: reason.to_owned(),
        };
        if id.is_empty() {
            return Err(invalid("it is empty"));
        }
        if id.len() > MAX_HOLDER_LEN {
            return Err(invalid("it is longer than 200 bytes"));
        }
        if !id.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid("use printable ASCII without spaces"));
        }
        Ok(Self(id))
    }

    /// `hostname-pid-suffix`, with a random 8-hex-digit suffix.
    pub fn generate() -> Self {
        let host: String = gethostname::gethostname()
            .to_string_lossy()
            .chars()
            .map(|c| if c.is_ascii_graphic() { c } else { '_' })
            .take(120)
            .collect();
        let host = if host.is_empty() {
            "host".to_owned()
        } else {
            host
        };
        let suffix = Rng::from_entropy().next_u64() as u32;
        Self(format!("{host}-{}-{suffix:08x}", std::process::id()))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for HolderId {
    type Error = ConfigError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<HolderId> for String {
    fn from(value: HolderId) -> Self {
        value.0
    }
}

impl fmt::Display for HolderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The backend's version of a stored record (DynamoDB version attribute, GCS generation, Azure
/// ETag, a hash of a file). Opaque to the core: it is only compared for equality.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Revision(String);

impl Revision {
    /// Wraps a backend's revision.
    pub fn new(revision: impl Into<String>) -> Self {
        Self(revision.into())
    }

    /// The revision as the backend gave it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A random value written with every record, so that a writer can recognise its own write when
/// the outcome of a request was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WriteNonce(pub u64);

impl WriteNonce {
    pub(crate) fn to_hex(self) -> String {
        format!("{:016x}", self.0)
    }

    pub(crate) fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 16 {
            return None;
        }
        u64::from_str_radix(s, 16).ok().map(Self)
    }
}

impl fmt::Display for WriteNonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Identifies one term of one candidate; random, never stored by the core.
///
/// Backends with server-side leases use it as the lease id they propose (Azure accepts a GUID),
/// so that a retried acquire of the same term is recognised by the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TermId(pub u128);

impl TermId {
    /// The id in GUID form (`8-4-4-4-12` lowercase hex digits).
    pub fn to_guid(self) -> String {
        let h = format!("{:032x}", self.0);
        format!(
            "{}-{}-{}-{}-{}",
            &h[0..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..32]
        )
    }
}

/// Whether the record grants a lease or says that nobody holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LeaseState {
    /// The holder leads until it stops renewing.
    Held,
    /// The last holder stepped down; anyone may take the lease at once.
    Released,
}

/// Free-form key/value pairs that the leader publishes and followers read (its address, say).
pub type Metadata = BTreeMap<String, String>;

/// Checks metadata for the limits every backend can store.
///
/// # Errors
/// [`ConfigError::InvalidMetadata`] for an empty or non-identifier key, a value with control
/// characters, or more than [`MAX_METADATA_BYTES`] in all.
pub fn validate_metadata(metadata: &Metadata) -> Result<(), ConfigError> {
    let mut total = 0;
    for (k, v) in metadata {
        if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(ConfigError::InvalidMetadata(format!(
                "key {k:?}: use ASCII letters, digits and '_'"
            )));
        }
        if v.chars().any(char::is_control) {
            return Err(ConfigError::InvalidMetadata(format!(
                "value of {k:?} contains control characters"
            )));
        }
        total += k.len() + v.len();
    }
    if total > MAX_METADATA_BYTES {
        return Err(ConfigError::InvalidMetadata(format!(
            "{total} bytes in all; at most {MAX_METADATA_BYTES} are allowed"
        )));
    }
    Ok(())
}

/// The lease record as the core writes it and every backend stores it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseRecord {
    /// Who holds (or last held) the lease.
    pub holder: HolderId,
    /// The fencing token of the holder's term.
    pub token: FencingToken,
    /// How long the lease lasts after the holder's last successful write, as the holder promised.
    pub ttl: Duration,
    /// Held or released.
    pub state: LeaseState,
    /// What the holder publishes for followers.
    pub metadata: Metadata,
    /// Random per write; lets a writer recognise its own write after a lost response.
    pub nonce: WriteNonce,
    /// Informational: the holder's wall clock (Unix milliseconds) when its term began.
    /// Never compared with a local time.
    pub term_started_unix_ms: u64,
    /// Informational: the writer's wall clock (Unix milliseconds) at this write.
    pub written_unix_ms: u64,
}

impl LeaseRecord {
    /// A record of a held lease, stamped with the wall clock for information.
    pub fn held(
        holder: HolderId,
        token: FencingToken,
        ttl: Duration,
        metadata: Metadata,
        nonce: WriteNonce,
    ) -> Self {
        let now = wall_clock_unix_ms();
        Self {
            holder,
            token,
            ttl,
            state: LeaseState::Held,
            metadata,
            nonce,
            term_started_unix_ms: now,
            written_unix_ms: now,
        }
    }

    /// Whether the record says that the lease is held.
    pub fn is_held(&self) -> bool {
        self.state == LeaseState::Held
    }

    /// Encodes the record as the JSON document that blob and file stores keep.
    pub fn to_json(&self) -> Vec<u8> {
        let doc = RecordDoc {
            v: RECORD_FORMAT,
            holder: self.holder.clone(),
            token: self.token.0,
            ttl_ms: u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX),
            state: self.state,
            metadata: self.metadata.clone(),
            nonce: self.nonce.to_hex(),
            term_started_unix_ms: self.term_started_unix_ms,
            written_unix_ms: self.written_unix_ms,
        };
        // Serialising a struct of strings, numbers and a string map cannot fail.
        serde_json::to_vec(&doc).unwrap_or_default()
    }

    /// Decodes a JSON record, naming `key` in the error if it is malformed.
    ///
    /// # Errors
    /// [`Error::MalformedRecord`] if the bytes are not a record of a known format.
    pub fn from_json(key: &str, bytes: &[u8]) -> Result<Self, Error> {
        let malformed = |detail: String| Error::MalformedRecord {
            key: key.to_owned(),
            detail,
        };
        let value: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| malformed(format!("not JSON ({e}); {} bytes", bytes.len())))?;
        match value.get("v").and_then(serde_json::Value::as_u64) {
            Some(RECORD_FORMAT) => {}
            Some(other) => {
                return Err(malformed(format!(
                    "record format {other} is not known to this version (expected {RECORD_FORMAT}); upgrade leader-core"
                )));
            }
            None => return Err(malformed("no record format field \"v\"".to_owned())),
        }
        let doc: RecordDoc =
            serde_json::from_value(value).map_err(|e| malformed(format!("bad field: {e}")))?;
        let nonce = WriteNonce::from_hex(&doc.nonce)
            .ok_or_else(|| malformed(format!("nonce {:?} is not 16 hex digits", doc.nonce)))?;
        Self::from_parts(
            key,
            RecordParts {
                holder: doc.holder,
                token: doc.token,
                ttl_ms: doc.ttl_ms,
                state: doc.state,
                metadata: doc.metadata,
                nonce,
                term_started_unix_ms: doc.term_started_unix_ms,
                written_unix_ms: doc.written_unix_ms,
            },
        )
    }

    /// Assembles a record from fields that a backend stored separately (DynamoDB attributes,
    /// Azure metadata), with the same checks as [`LeaseRecord::from_json`].
    ///
    /// # Errors
    /// [`Error::MalformedRecord`] naming `key` if a field is out of range.
    pub fn from_parts(key: &str, parts: RecordParts) -> Result<Self, Error> {
        let malformed = |detail: String| Error::MalformedRecord {
            key: key.to_owned(),
            detail,
        };
        if parts.ttl_ms == 0 {
            return Err(malformed("ttl is zero".to_owned()));
        }
        if parts.token == 0 {
            return Err(malformed("token is zero; tokens start at 1".to_owned()));
        }
        validate_metadata(&parts.metadata).map_err(|e| malformed(e.to_string()))?;
        Ok(Self {
            holder: parts.holder,
            token: FencingToken(parts.token),
            ttl: Duration::from_millis(parts.ttl_ms),
            state: parts.state,
            metadata: parts.metadata,
            nonce: parts.nonce,
            term_started_unix_ms: parts.term_started_unix_ms,
            written_unix_ms: parts.written_unix_ms,
        })
    }
}

/// The fields of a record as a backend stored them; see [`LeaseRecord::from_parts`].
#[derive(Clone, Debug)]
#[allow(missing_docs)]
pub struct RecordParts {
    pub holder: HolderId,
    pub token: u64,
    pub ttl_ms: u64,
    pub state: LeaseState,
    pub metadata: Metadata,
    pub nonce: WriteNonce,
    pub term_started_unix_ms: u64,
    pub written_unix_ms: u64,
}

const RECORD_FORMAT: u64 = 1;

#[derive(Serialize, Deserialize)]
struct RecordDoc {
    v: u64,
    holder: HolderId,
    token: u64,
    ttl_ms: u64,
    state: LeaseState,
    #[serde(default)]
    metadata: Metadata,
    nonce: String,
    #[serde(default)]
    term_started_unix_ms: u64,
    #[serde(default)]
    written_unix_ms: u64,
}

/// The wall clock in Unix milliseconds, for information only (records, logs).
///
/// This is the one place that reads `SystemTime`; nothing compares its result with a local
/// instant.
pub fn wall_clock_unix_ms() -> u64 {
    #[allow(clippy::disallowed_methods)] // the one informational wall-clock read
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        assert!(LeaseKey::new("scheduler").is_ok());
        assert!(LeaseKey::new("shard-17.v2_a").is_ok());
        for bad in ["", ".hidden", "a/b", "a b", "é", &"x".repeat(129)] {
            let err = LeaseKey::new(bad).unwrap_err();
            assert!(err.to_string().contains("lease key"), "{err}");
        }
        assert!(ObjectName::new("orders.json").is_ok());
        assert!(HolderId::new("pod-a:1@ns").is_ok());
        assert!(HolderId::new("has space").is_err());
        assert!(HolderId::new("").is_err());
    }

    #[test]
    fn generated_holder_ids_are_valid_and_distinct() {
        let a = HolderId::generate();
        let b = HolderId::generate();
        assert_ne!(a, b);
        assert!(HolderId::new(a.as_str()).is_ok());
        assert!(a.as_str().contains(&format!("-{}-", std::process::id())));
    }

    #[test]
    fn record_round_trips_through_json() {
        let mut meta = Metadata::new();
        meta.insert("addr".into(), "10.0.0.1:8080".into());
        let rec = LeaseRecord::held(
            HolderId::new("a").unwrap(),
            FencingToken(7),
            Duration::from_millis(15_000),
            meta,
            WriteNonce(0xdead_beef),
        );
        let back = LeaseRecord::from_json("k", &rec.to_json()).unwrap();
        assert_eq!(back, rec);
    }

    #[test]
    fn malformed_records_name_the_key_and_the_problem() {
        let cases: [(&[u8], &str); 5] = [
            (b"garbage", "not JSON"),
            (b"{\"holder\":\"a\"}", "no record format"),
            (b"{\"v\":9}", "format 9"),
            (
                b"{\"v\":1,\"holder\":\"a\",\"token\":1,\"ttl_ms\":0,\"state\":\"held\",\"nonce\":\"0000000000000001\"}",
                "ttl is zero",
            ),
            (
                b"{\"v\":1,\"holder\":\"a\",\"token\":1,\"ttl_ms\":5,\"state\":\"held\",\"nonce\":\"xyz\"}",
                "nonce",
            ),
        ];
        for (bytes, expected) in cases {
            let err = LeaseRecord::from_json("jobs", bytes).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains("jobs"), "{msg}");
            assert!(msg.contains(expected), "{msg} should mention {expected}");
        }
    }

    #[test]
    fn metadata_limits() {
        let mut m = Metadata::new();
        m.insert("ok_key".into(), "v".into());
        assert!(validate_metadata(&m).is_ok());
        m.insert("bad-key".into(), "v".into());
        assert!(validate_metadata(&m).is_err());
        let mut big = Metadata::new();
        big.insert("k".into(), "v".repeat(MAX_METADATA_BYTES));
        assert!(validate_metadata(&big).is_err());
    }

    #[test]
    fn term_id_formats_as_guid() {
        let g = TermId(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef).to_guid();
        assert_eq!(g, "01234567-89ab-cdef-0123-456789abcdef");
    }
}
