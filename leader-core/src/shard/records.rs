//! What sharded leadership keeps in the store, and how: the names under a key, the shard
//! record, the roster, the token high-water mark, and the claimed set a member publishes.

use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, Error};
use crate::model::{HolderId, LeaseKey, Metadata, ObjectName};

/// The most shards one key may have: a member's claimed set must fit its record's metadata
/// (as a bitmap, `MAX_SHARDS / 6` base64 characters).
pub const MAX_SHARDS: u32 = 16_384;

/// The longest key of a sharded election: its record names add up to 32 bytes to it.
pub(crate) const MAX_SHARDED_KEY_LEN: usize = 96;

/// Metadata key of the shard count in a member record.
pub(crate) const META_SHARDS: &str = "shards";
/// Metadata key of the claimed set in a member record.
pub(crate) const META_CLAIMS: &str = "claims";

/// The names of one sharded election's records.
#[derive(Clone, Debug)]
pub(crate) struct Names {
    key: LeaseKey,
    roster: ObjectName,
    tokens: LeaseKey,
    coord: LeaseKey,
    plan: ObjectName,
    history: ObjectName,
}

impl Names {
    pub(crate) fn new(key: &LeaseKey) -> Result<Self, ConfigError> {
        if key.as_str().len() > MAX_SHARDED_KEY_LEN {
            return Err(ConfigError::InvalidName {
                what: "sharded key",
                name: key.to_string(),
                reason: format!(
                    "it is longer than {MAX_SHARDED_KEY_LEN} bytes (its records add to the name)"
                ),
            });
        }
        Ok(Self {
            key: key.clone(),
            roster: ObjectName::new(format!("{key}.roster"))?,
            tokens: LeaseKey::new(format!("{key}.tokens"))?,
            coord: LeaseKey::new(format!("{key}.coord"))?,
            plan: ObjectName::new(format!("{key}.plan"))?,
            history: ObjectName::new(format!("{key}.history"))?,
        })
    }

    pub(crate) fn key(&self) -> &LeaseKey {
        &self.key
    }

    /// The roster object: who joined.
    pub(crate) fn roster(&self) -> &ObjectName {
        &self.roster
    }

    /// The lease whose terms' tokens are the shard tokens.
    pub(crate) fn tokens(&self) -> &LeaseKey {
        &self.tokens
    }

    /// The coordinator's lease: its holder reads the members and writes the plan.
    pub(crate) fn coord(&self) -> &LeaseKey {
        &self.coord
    }

    /// The coordinator's plan: which member should lead each shard.
    pub(crate) fn plan(&self) -> &ObjectName {
        &self.plan
    }

    /// The mark that the key has a history: written by the first instance that finds it
    /// absent, never removed by an instance. It names the key's first roster when its writer
    /// created that roster right after it ([`HistoryMark`]).
    pub(crate) fn history(&self) -> &ObjectName {
        &self.history
    }

    /// The record of shard `s`.
    pub(crate) fn shard(&self, s: u32) -> ObjectName {
        // Valid by construction: a valid key, a dot, a letter, digits.
        ObjectName::new(format!("{}.s.{s}", self.key)).unwrap_or_else(|_| self.roster.clone())
    }

    /// The membership lease key of `id`: ids may hold characters that names may not, so the
    /// key carries a hash of the id.
    pub(crate) fn member(&self, id: &HolderId) -> LeaseKey {
        LeaseKey::new(format!(
            "{}.m.{:016x}",
            self.key,
            crate::rand::stable_hash(id.as_str())
        ))
        .unwrap_or_else(|_| self.key.clone())
    }
}

/// Whether a shard record says its owner holds it, or gave it up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ShardState {
    Held,
    Released,
}

/// The record of one shard: who owns it, under which membership term, with which token.
/// Written only when ownership changes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ShardRecord {
    pub(crate) v: u32,
    pub(crate) owner: HolderId,
    /// The owner's membership term (its membership lease's token) when it took the shard.
    pub(crate) member: u64,
    pub(crate) state: ShardState,
    /// The shard's fencing token.
    pub(crate) token: u64,
    /// Tells this write from any other, to recognise it after a lost answer.
    pub(crate) nonce: u64,
}

impl ShardRecord {
    pub(crate) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub(crate) fn decode(name: &ObjectName, bytes: &[u8]) -> Result<Self, Error> {
        decode(name, bytes, "shard record")
    }
}

/// The history mark's content: the creation mark of the key's first roster, written by the
/// instance that created that roster, before it, on a key that showed no history; or nothing
/// (written beside a roster already there, or by earlier builds, whose marks are empty).
pub(crate) struct HistoryMark;

impl HistoryMark {
    pub(crate) fn encode(first_roster: Option<u64>) -> Vec<u8> {
        first_roster
            .map(|created| format!("first-roster {created}").into_bytes())
            .unwrap_or_default()
    }

    /// The first roster the mark names, if it names one.
    pub(crate) fn first_roster(bytes: &[u8]) -> Option<u64> {
        std::str::from_utf8(bytes)
            .ok()?
            .strip_prefix("first-roster ")?
            .parse()
            .ok()
    }
}

/// Who joined a sharded election, in which membership term, and how many shards it has.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Roster {
    pub(crate) v: u32,
    pub(crate) shards: u32,
    pub(crate) members: Vec<Entry>,
    /// Drawn when the roster is created: a different value means it was deleted and written
    /// again since it was last read.
    #[serde(default)]
    pub(crate) created: u64,
}

/// One member of the roster: its id, the membership term it joined in, and its ttl. A member
/// writes its entry again in each new membership term, so that a prune decided from an older
/// look (conditional on the roster as it was) cannot remove it. The ttl tells every reader how
/// long that member's terms can last (instances of a key may run with different ttls).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "EntryForm")]
pub(crate) struct Entry {
    pub(crate) id: HolderId,
    pub(crate) term: u64,
    /// Milliseconds; 0 when not known (an entry of an earlier build).
    pub(crate) ttl_ms: u64,
}

/// An entry as stored: `{"id", "term", "ttl_ms"}`, or a bare id (a roster of earlier builds:
/// term 0, rewritten by its member at its next look).
#[derive(Deserialize)]
#[serde(untagged)]
enum EntryForm {
    Entry {
        id: HolderId,
        term: u64,
        #[serde(default)]
        ttl_ms: u64,
    },
    Id(HolderId),
}

impl From<EntryForm> for Entry {
    fn from(form: EntryForm) -> Self {
        match form {
            EntryForm::Entry { id, term, ttl_ms } => Entry { id, term, ttl_ms },
            EntryForm::Id(id) => Entry {
                id,
                term: 0,
                ttl_ms: 0,
            },
        }
    }
}

impl Roster {
    pub(crate) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub(crate) fn decode(name: &ObjectName, bytes: &[u8]) -> Result<Self, Error> {
        decode(name, bytes, "roster")
    }

    /// The ids listed, each once, in order.
    pub(crate) fn ids(&self) -> Vec<HolderId> {
        let mut ids: Vec<HolderId> = self.members.iter().map(|e| e.id.clone()).collect();
        ids.sort();
        ids.dedup();
        ids
    }

    /// Whether `id` is listed, in any membership term.
    pub(crate) fn lists_id(&self, id: &HolderId) -> bool {
        self.members.iter().any(|e| e.id == *id)
    }

    /// Whether `id` is listed in membership term `term`.
    pub(crate) fn lists(&self, id: &HolderId, term: u64) -> bool {
        self.members.iter().any(|e| e.id == *id && e.term == term)
    }

    /// Lists `id` in term `term` with its `ttl`, in place of any earlier entry of it.
    pub(crate) fn enter(&mut self, id: &HolderId, term: u64, ttl: std::time::Duration) {
        self.members.retain(|e| e.id != *id);
        self.members.push(Entry {
            id: id.clone(),
            term,
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
        });
        self.v = self.v.max(2);
    }

    /// The longest ttl any entry names.
    pub(crate) fn longest_ttl(&self) -> std::time::Duration {
        let ms = self.members.iter().map(|e| e.ttl_ms).max().unwrap_or(0);
        std::time::Duration::from_millis(ms)
    }
}

fn decode<T: for<'de> Deserialize<'de>>(
    name: &ObjectName,
    bytes: &[u8],
    what: &str,
) -> Result<T, Error> {
    serde_json::from_slice(bytes).map_err(|e| Error::MalformedRecord {
        key: name.to_string(),
        detail: format!(
            "it is not a sharded election's {what} ({e}); another program wrote it, or it was \
             damaged: delete it or use another key"
        ),
    })
}

/// A set of shards `0..n`, as a bitmap.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ShardSet {
    n: u32,
    bits: Vec<u64>,
}

impl ShardSet {
    /// The empty set of shards `0..n`.
    pub fn new(n: u32) -> Self {
        Self {
            n,
            bits: vec![0; n.div_ceil(64) as usize],
        }
    }

    /// Every shard of `0..n`.
    pub(crate) fn all(n: u32) -> Self {
        let mut set = Self::new(n);
        for s in 0..n {
            set.insert(s);
        }
        set
    }

    /// The number of shards it is a subset of.
    pub fn universe(&self) -> u32 {
        self.n
    }

    /// Adds `s` (ignored if `s >= n`).
    pub fn insert(&mut self, s: u32) {
        if s < self.n {
            self.bits[(s / 64) as usize] |= 1 << (s % 64);
        }
    }

    /// Removes `s`.
    pub fn remove(&mut self, s: u32) {
        if s < self.n {
            self.bits[(s / 64) as usize] &= !(1 << (s % 64));
        }
    }

    /// Whether `s` is in the set.
    pub fn contains(&self, s: u32) -> bool {
        s < self.n && self.bits[(s / 64) as usize] & (1 << (s % 64)) != 0
    }

    /// How many shards are in the set.
    pub fn len(&self) -> usize {
        self.bits.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|w| *w == 0)
    }

    /// Adds every shard of `other`.
    pub fn union_with(&mut self, other: &ShardSet) {
        for (a, b) in self.bits.iter_mut().zip(&other.bits) {
            *a |= *b;
        }
    }

    /// The shards in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.n).filter(|s| self.contains(*s))
    }

    /// The set as text: ranges such as `0-2499,5000` (`r:` prefix) or a base64url bitmap
    /// (`b:` prefix), whichever is shorter.
    pub fn encode(&self) -> String {
        let mut ranges = String::from("r:");
        let mut s = 0;
        while s < self.n {
            if !self.contains(s) {
                s += 1;
                continue;
            }
            let start = s;
            while s + 1 < self.n && self.contains(s + 1) {
                s += 1;
            }
            if ranges.len() > 2 {
                ranges.push(',');
            }
            if start == s {
                ranges.push_str(&start.to_string());
            } else {
                ranges.push_str(&format!("{start}-{s}"));
            }
            s += 1;
        }
        let bytes: Vec<u8> = self
            .bits
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .take(self.n.div_ceil(8) as usize)
            .collect();
        let bitmap = format!("b:{}", base64url(&bytes));
        if bitmap.len() < ranges.len() {
            bitmap
        } else {
            ranges
        }
    }

    /// Reads what [`encode`](Self::encode) wrote, for `n` shards.
    pub fn decode(n: u32, text: &str) -> Option<Self> {
        let mut set = Self::new(n);
        if let Some(ranges) = text.strip_prefix("r:") {
            for part in ranges.split(',').filter(|p| !p.is_empty()) {
                let (a, b) = match part.split_once('-') {
                    Some((a, b)) => (a.parse().ok()?, b.parse().ok()?),
                    None => {
                        let a: u32 = part.parse().ok()?;
                        (a, a)
                    }
                };
                if a > b || b >= n {
                    return None;
                }
                for s in a..=b {
                    set.insert(s);
                }
            }
            return Some(set);
        }
        let bytes = unbase64url(text.strip_prefix("b:")?)?;
        if bytes.len() != n.div_ceil(8) as usize {
            return None;
        }
        for (i, byte) in bytes.iter().enumerate() {
            for bit in 0..8 {
                if byte & (1 << bit) != 0 {
                    let s = u32::try_from(i * 8 + bit).ok()?;
                    if s >= n {
                        return None;
                    }
                    set.insert(s);
                }
            }
        }
        Some(set)
    }
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn base64url(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(char::from(B64[((n >> (18 - 6 * i)) & 63) as usize]));
        }
    }
    out
}

fn unbase64url(text: &str) -> Option<Vec<u8>> {
    let digits: Option<Vec<u32>> = text
        .bytes()
        .map(|c| B64.iter().position(|d| *d == c).map(|p| p as u32))
        .collect();
    let digits = digits?;
    if digits.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, d)| n | (d << (18 - 6 * i)));
        for i in 0..chunk.len() - 1 {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    Some(out)
}

/// What a member record publishes: the shard count and the claimed set.
pub(crate) fn claims_metadata(set: &ShardSet) -> Metadata {
    Metadata::from([
        (META_SHARDS.to_owned(), set.universe().to_string()),
        (META_CLAIMS.to_owned(), set.encode()),
    ])
}

/// The claimed set a member record publishes, if it is one of `n` shards.
pub(crate) fn claims_of(n: u32, metadata: &Metadata) -> Option<ShardSet> {
    if metadata.get(META_SHARDS)?.parse::<u32>().ok()? != n {
        return None;
    }
    ShardSet::decode(n, metadata.get(META_CLAIMS)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_round_trip_as_ranges_or_bitmaps_and_fit_the_metadata_budget() {
        for n in [1u32, 7, 64, 65, 1000, MAX_SHARDS] {
            let mut alternate = ShardSet::new(n);
            let mut block = ShardSet::new(n);
            for s in (0..n).step_by(2) {
                alternate.insert(s);
            }
            for s in 0..n / 3 {
                block.insert(s);
            }
            for set in [ShardSet::new(n), alternate, block] {
                let text = set.encode();
                assert_eq!(ShardSet::decode(n, &text), Some(set.clone()), "{n}: {text}");
                let meta = claims_metadata(&set);
                crate::model::validate_metadata(&meta).expect("fits");
                assert_eq!(claims_of(n, &meta), Some(set));
            }
        }
        let mut set = ShardSet::new(1000);
        for s in [0, 1, 2, 5, 9] {
            set.insert(s);
        }
        assert_eq!(set.encode(), "r:0-2,5,9");
        assert_eq!(set.len(), 5);
        let mut small = ShardSet::new(10);
        small.insert(0);
        small.insert(5);
        assert_eq!(ShardSet::decode(10, &small.encode()), Some(small));
        for bad in ["r:3-1", "r:10", "r:x", "b:!!", "b:AAAA", "x"] {
            assert_eq!(ShardSet::decode(10, bad), None, "{bad}");
        }
        // Another shard count: not this election's claims.
        assert_eq!(claims_of(1001, &claims_metadata(&set)), None);
    }

    #[test]
    fn names_fit_and_member_keys_are_stable() {
        let key = LeaseKey::new("k".repeat(MAX_SHARDED_KEY_LEN)).unwrap();
        let names = Names::new(&key).unwrap();
        let id = HolderId::new("host/with:odd#chars?").unwrap();
        assert_ne!(names.member(&id).as_str(), key.as_str());
        assert_eq!(names.member(&id), names.member(&id));
        assert!(names.shard(MAX_SHARDS - 1).as_str().ends_with(".s.16383"));
        let too_long = LeaseKey::new("k".repeat(MAX_SHARDED_KEY_LEN + 1)).unwrap();
        assert!(Names::new(&too_long).is_err());
    }
}
