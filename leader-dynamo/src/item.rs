//! The item schema: partition keys, attribute names, and the parsing of lease, mark and
//! object items (a damaged item is a malformed record naming the item and the field).

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use leader_core::backend::{LeaseRecord, LeaseState, RecordParts, Revision, Stored, WriteNonce};
use leader_core::{Error, FencedObject, FencingToken, HolderId, Metadata};

/// Prefix of the partition key of a lease item: `lease#<key>`.
pub const LEASE_PREFIX: &str = "lease#";
/// Prefix of the partition key of a protected object: `fenced#<name>`.
pub const OBJECT_PREFIX: &str = "fenced#";
/// Prefix of the partition key of a lease key's token high-water mark: `mark#<key>`. The
/// item outlives the lease item; see the crate docs for what an operator may delete.
pub const MARK_PREFIX: &str = "mark#";

/// The attribute names of the items (always used through `#name` placeholders).
pub(crate) mod attr {
    pub(crate) const HOLDER: &str = "holder";
    pub(crate) const REV: &str = "rev";
    pub(crate) const TOKEN: &str = "token";
    pub(crate) const TTL_MS: &str = "ttl_ms";
    pub(crate) const STATE: &str = "state";
    pub(crate) const META: &str = "meta";
    pub(crate) const NONCE: &str = "nonce";
    pub(crate) const STARTED: &str = "term_started_unix_ms";
    pub(crate) const WRITTEN: &str = "written_unix_ms";
    pub(crate) const FENCE: &str = "fence";
    pub(crate) const VALUE: &str = "value";
    pub(crate) const OBJECT_REV: &str = "object_rev";
    pub(crate) const HIGH: &str = "high";
}

pub(crate) const HELD: &str = "held";
pub(crate) const RELEASED: &str = "released";

pub(crate) type Item = HashMap<String, AttributeValue>;

pub(crate) fn names(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(p, n)| ((*p).to_owned(), (*n).to_owned()))
        .collect()
}

pub(crate) fn num(n: u64) -> AttributeValue {
    AttributeValue::N(n.to_string())
}

pub(crate) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub(crate) fn revision_of(rev: u64, nonce: WriteNonce) -> Revision {
    Revision::new(format!("{rev}.{nonce}"))
}

pub(crate) fn parse_revision(revision: &Revision) -> Option<(u64, String)> {
    let (rev, nonce) = revision.as_str().split_once('.')?;
    Some((rev.parse().ok()?, nonce.to_owned()))
}

pub(crate) fn parse_nonce(s: &str) -> Option<WriteNonce> {
    (s.len() == 16)
        .then(|| u64::from_str_radix(s, 16).ok())
        .flatten()
        .map(WriteNonce)
}

struct Fields<'a> {
    item: &'a Item,
    name: &'a str,
}

impl Fields<'_> {
    fn bad(&self, detail: String) -> Error {
        Error::MalformedRecord {
            key: self.name.to_owned(),
            detail,
        }
    }

    fn string(&self, attr: &str) -> Result<&str, Error> {
        match self.item.get(attr) {
            Some(AttributeValue::S(s)) => Ok(s),
            Some(other) => Err(self.bad(format!("attribute {attr:?} is not a string: {other:?}"))),
            None => Err(self.bad(format!("attribute {attr:?} is missing"))),
        }
    }

    fn number(&self, attr: &str) -> Result<u64, Error> {
        match self.item.get(attr) {
            Some(AttributeValue::N(n)) => n.parse().map_err(|_| {
                self.bad(format!(
                    "attribute {attr:?} is not a non-negative integer: {n}"
                ))
            }),
            Some(other) => Err(self.bad(format!("attribute {attr:?} is not a number: {other:?}"))),
            None => Err(self.bad(format!("attribute {attr:?} is missing"))),
        }
    }

    fn number_or_zero(&self, attr: &str) -> Result<u64, Error> {
        if self.item.contains_key(attr) {
            self.number(attr)
        } else {
            Ok(0)
        }
    }
}

/// Parses a lease item into the core's record, naming `key` in any error.
pub(crate) fn parse_lease(key: &str, item: &Item) -> Result<Stored, Error> {
    let f = Fields { item, name: key };
    let holder = HolderId::new(f.string(attr::HOLDER)?).map_err(|e| f.bad(e.to_string()))?;
    let state = match f.string(attr::STATE)? {
        HELD => LeaseState::Held,
        RELEASED => LeaseState::Released,
        other => return Err(f.bad(format!("state {other:?} is neither held nor released"))),
    };
    let nonce_text = f.string(attr::NONCE)?;
    let nonce = parse_nonce(nonce_text)
        .ok_or_else(|| f.bad(format!("nonce {nonce_text:?} is not 16 hex digits")))?;
    let mut metadata = Metadata::new();
    match item.get(attr::META) {
        None => {}
        Some(AttributeValue::M(m)) => {
            for (k, v) in m {
                let AttributeValue::S(v) = v else {
                    return Err(f.bad(format!("metadata {k:?} is not a string")));
                };
                metadata.insert(k.clone(), v.clone());
            }
        }
        Some(other) => return Err(f.bad(format!("metadata is not a map: {other:?}"))),
    }
    let rev = f.number(attr::REV)?;
    let record = LeaseRecord::from_parts(
        key,
        RecordParts {
            holder,
            token: f.number(attr::TOKEN)?,
            ttl_ms: f.number(attr::TTL_MS)?,
            state,
            metadata,
            nonce,
            term_started_unix_ms: f.number_or_zero(attr::STARTED)?,
            written_unix_ms: f.number_or_zero(attr::WRITTEN)?,
        },
    )?;
    Ok(Stored {
        record,
        revision: revision_of(rev, nonce),
    })
}

/// Parses a protected object, naming `object` in any error.
/// Parses the token high-water mark item of lease `key`.
pub(crate) fn parse_mark(key: &str, item: &Item) -> Result<FencingToken, Error> {
    let found = item.get(attr::HIGH);
    if let Some(AttributeValue::N(n)) = found
        && let Ok(high) = n.parse::<u64>()
    {
        return Ok(FencingToken(high));
    }
    Err(Error::MalformedRecord {
        key: key.to_owned(),
        detail: format!(
            "its token high-water mark item ({MARK_PREFIX}{key}) has no non-negative integer \
             attribute {:?} (found {found:?}); set it to a number at least the highest fencing \
             token ever issued for this key",
            attr::HIGH
        ),
    })
}

pub(crate) fn parse_object(object: &str, item: &Item) -> Result<FencedObject, Error> {
    let f = Fields { item, name: object };
    let value = match item.get(attr::VALUE) {
        Some(AttributeValue::B(b)) => b.as_ref().to_vec(),
        None => Vec::new(),
        Some(other) => return Err(f.bad(format!("value is not binary: {other:?}"))),
    };
    Ok(FencedObject {
        fence: FencingToken(f.number(attr::FENCE)?),
        value,
        revision: Revision::new(f.string(attr::OBJECT_REV)?),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use super::*;
    use leader_core::ErrorKind;

    fn item(pairs: &[(&str, AttributeValue)]) -> Item {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    }

    fn good() -> Item {
        item(&[
            (attr::HOLDER, AttributeValue::S("a".into())),
            (attr::REV, num(3)),
            (attr::TOKEN, num(7)),
            (attr::TTL_MS, num(1500)),
            (attr::STATE, AttributeValue::S("held".into())),
            (
                attr::META,
                AttributeValue::M(HashMap::from([(
                    "addr".to_owned(),
                    AttributeValue::S("10.0.0.1".into()),
                )])),
            ),
            (attr::NONCE, AttributeValue::S("00000000deadbeef".into())),
        ])
    }

    #[test]
    fn lease_items_parse() {
        let s = parse_lease("k", &good()).unwrap();
        assert_eq!(s.record.token, FencingToken(7));
        assert_eq!(s.record.ttl, Duration::from_millis(1500));
        assert_eq!(s.record.metadata["addr"], "10.0.0.1");
        assert_eq!(s.revision.as_str(), "3.00000000deadbeef");
        assert_eq!(
            parse_revision(&s.revision),
            Some((3, "00000000deadbeef".to_owned()))
        );
    }

    #[test]
    fn malformed_lease_items_name_the_key_and_the_field() {
        let cases: [(&str, AttributeValue, &str); 5] = [
            (attr::TOKEN, AttributeValue::S("x".into()), "token"),
            (attr::TOKEN, num(0), "token is zero"),
            (attr::STATE, AttributeValue::S("maybe".into()), "maybe"),
            (attr::NONCE, AttributeValue::S("xyz".into()), "nonce"),
            (attr::META, AttributeValue::S("x".into()), "metadata"),
        ];
        for (attr_name, value, expected) in cases {
            let mut it = good();
            it.insert(attr_name.to_owned(), value);
            let e = parse_lease("jobs", &it).unwrap_err();
            let msg = e.to_string();
            assert_eq!(e.kind(), ErrorKind::MalformedRecord);
            assert!(msg.contains("jobs") && msg.contains(expected), "{msg}");
        }
        let mut it = good();
        it.remove(attr::HOLDER);
        assert!(
            parse_lease("jobs", &it)
                .unwrap_err()
                .to_string()
                .contains("missing")
        );
    }
}
