//! The calls to S3: `GetObject` (with `If-None-Match` for a follower's poll) and conditional
//! `PutObject` (`If-None-Match: *` or `If-Match: <ETag>`), with our own bounded retries, and
//! the lease, token and fencing logic on top.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_s3::Client;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::primitives::ByteStream;
use leader_core::backend::{
    Backoff, Call, Expected, FencedCas, FencedPut, IfChanged, LeaseRecord, LeaseState, ObjectWrite,
    Revision, Rng, Stored, WriteKind, WriteNonce, WriteOutcome, WriteRequest, call_deadline,
    decode_fenced, encode_fenced,
};
use leader_core::{
    Error, ErrorKind, FencedObject, FencingToken, LeaseBackend, LeaseKey, ObjectName,
};
use tracing::{debug, info};

use crate::error::{Answer, Context, Failure, Op, map_sdk};

/// Flips the nonce of an acquire's placeholder, so that nobody (the core resolving a lost answer
/// included) takes the placeholder for the acquire's own write.
const PLACEHOLDER_NONCE_MASK: u64 = 0x5a5a_5a5a_5a5a_5a5a;

/// The first line of a protected object as this crate stores it, before the fence line: a
/// write id that makes every write's bytes, and so its ETag, unique.
const WRITE_LINE: &[u8] = b"leader-s3-write ";

/// Leases and fenced objects in one S3 bucket. Build it with [`S3Builder`](crate::S3Builder).
///
/// Each lease key is one object, `<prefix><key>`, whose body is the record's JSON and whose
/// ETag is the revision, plus its token high-water mark `<prefix>.<key>.token`. Protected
/// objects are `<prefix>.<name>.fenced`. See the crate docs for the token scheme and the retry
/// rules.
#[derive(Clone)]
pub struct S3Store {
    client: Client,
    ctx: Context,
    prefix: String,
    backoff: Backoff,
    writes: Arc<WriteIds>,
}

impl fmt::Debug for S3Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The client's configuration is left out on purpose: it holds the credentials provider.
        f.debug_struct("S3Store")
            .field("bucket", &self.ctx.bucket)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// Write ids: this store's random origin and a counter, so that no two writes of this store
/// carry the same bytes, and writes of two stores differ unless 64 random bits collide.
#[derive(Debug)]
struct WriteIds {
    origin: u64,
    next: AtomicU64,
}

impl WriteIds {
    fn next(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{:016x}{n:016x}", self.origin)
    }
}

/// The condition of a `PutObject`.
#[derive(Clone, Copy, Debug)]
enum Cond<'a> {
    /// `If-None-Match: *`: only if there is no object.
    Absent,
    /// `If-Match: <ETag>`: only if the object is at this ETag.
    Matches(&'a str),
}

/// What a `PutObject` writes; its bytes are made for each attempt, so that a retry carries a
/// new write id and never brings back the ETag of an earlier attempt.
#[derive(Clone, Copy, Debug)]
enum Body<'a> {
    /// A lease record.
    Record(&'a LeaseRecord),
    /// A protected object: its fence token and value.
    Fenced(FencingToken, &'a [u8]),
    /// A token mark (a number: it only rises, so its bytes never repeat).
    Mark(FencingToken),
}

/// The answer to a conditional `PutObject`.
#[derive(Debug, PartialEq, Eq)]
enum Put {
    /// Written; the object's new ETag.
    Written(String),
    /// The condition did not hold (412, or 404 for `If-Match` on an absent object).
    Failed,
}

/// The answer to a `GetObject`.
#[derive(Debug, PartialEq, Eq)]
enum Got {
    /// The body and ETag.
    Object(Vec<u8>, String),
    /// No such object.
    Absent,
    /// Still at the ETag given in `If-None-Match`.
    Unchanged,
}

impl S3Store {
    pub(crate) fn new(client: Client, ctx: Context, prefix: String, backoff: Backoff) -> Self {
        Self {
            client,
            ctx,
            prefix,
            backoff,
            writes: Arc::new(WriteIds {
                origin: Rng::from_entropy().next_u64(),
                next: AtomicU64::new(0),
            }),
        }
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.ctx.bucket
    }

    /// The name of the object that holds `key`'s lease record: `<prefix><key>`.
    pub fn lease_object(&self, key: &LeaseKey) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The name of the object that keeps the highest token granted for `key`:
    /// `<prefix>.<key>.token` (no lease key starts with `.`, so it never meets a lease).
    pub fn mark_object(&self, key: &LeaseKey) -> String {
        format!("{}.{key}.token", self.prefix)
    }

    /// The name of the S3 object behind a protected object: `<prefix>.<name>.fenced`.
    pub fn fenced_object(&self, object: &ObjectName) -> String {
        format!("{}.{object}.fenced", self.prefix)
    }

    /// Reads an object that need not exist, so that a missing bucket, a wrong region or
    /// missing permissions show now rather than at the first election.
    pub(crate) async fn check_bucket(&self) -> Result<(), Error> {
        let probe = format!("{}.leader-bucket-check", self.prefix);
        leader_core::backend::within(
            leader_core::backend::DEFAULT_BUDGET * 5,
            self.get(&probe, None),
        )
        .await
        .unwrap_or_else(|_| {
            Err(Error::Timeout {
                operation: "checking the S3 bucket",
                after: leader_core::backend::DEFAULT_BUDGET * 5,
            })
        })
        .map(drop)
    }

    /// The SDK settings of one attempt: no SDK retries, and nothing outlives `remaining`.
    fn attempt_config(remaining: Duration) -> aws_sdk_s3::config::Builder {
        let remaining = remaining.max(Duration::from_millis(1));
        aws_sdk_s3::config::Builder::default()
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .operation_timeout(remaining)
                    .operation_attempt_timeout(remaining)
                    .connect_timeout(remaining)
                    .read_timeout(remaining)
                    .build(),
            )
    }

    /// The retry policy of one call of `op`: the core's, with this store's backoff.
    fn call(&self, op: Op) -> Call {
        let call = if op == Op::Read {
            Call::read(op.name())
        } else {
            Call::write(op.name())
        };
        call.with_backoff(self.backoff)
    }

    /// Reads an object unless its ETag is still `unless` (`If-None-Match`, answered 304).
    /// Throttling and transient failures are retried within the request timeout.
    async fn get(&self, object: &str, unless: Option<&str>) -> Result<Got, Error> {
        self.call(Op::Read)
            .run(|left| async move {
                let mut request = self
                    .client
                    .get_object()
                    .bucket(&self.ctx.bucket)
                    .key(object);
                if let Some(etag) = unless {
                    request = request.if_none_match(etag);
                }
                let out = match request
                    .customize()
                    .config_override(Self::attempt_config(left))
                    .send()
                    .await
                {
                    Ok(out) => out,
                    Err(e) => {
                        return match Failure::of(&e).answer() {
                            Some(Answer::NoSuchKey) => Ok(Got::Absent),
                            Some(Answer::NotModified) if unless.is_some() => Ok(Got::Unchanged),
                            _ => Err(map_sdk(Op::Read, &self.ctx, e)),
                        };
                    }
                };
                let Some(etag) = out.e_tag().map(str::to_owned) else {
                    return Err(Error::backend(
                        format!("S3 sent {object} without an ETag"),
                        "a GetObject answer without an ETag header",
                    ));
                };
                if unless == Some(etag.as_str()) {
                    // A server that ignores the condition sent the object anyway.
                    return Ok(Got::Unchanged);
                }
                let body = out.body.collect().await.map_err(|e| Error::Unavailable {
                    message: format!("reading the body of S3 object {object} failed: {e}"),
                    source: Some(Box::new(e)),
                })?;
                Ok(Got::Object(body.to_vec(), etag))
            })
            .await
    }

    /// Uploads `body` on condition `cond`.
    ///
    /// Throttling, a 409 `ConditionalRequestConflict` (a concurrent request won, this one was
    /// not applied) and failures before sending are retried; a failure that may have applied
    /// the write (a 5xx, a lost connection, the timeout) is [`Error::Indeterminate`] at once,
    /// never retried: the core re-reads to decide.
    ///
    /// S3 does not promise that a throttled write (503 `SlowDown`, 429) was not applied, only
    /// that the client should slow down. It is retried all the same, but once a write was
    /// throttled, a later failed condition (perhaps our own earlier attempt) or the end of the
    /// call's time is [`Error::Indeterminate`], not a conflict or throttling.
    async fn put(
        &self,
        object: &str,
        body: Body<'_>,
        cond: Cond<'_>,
        op: Op,
    ) -> Result<Put, Error> {
        let throttled = AtomicBool::new(false);
        let throttled = &throttled;
        let result = self
            .call(op)
            .run(|left| {
                async move {
                    let body = self.bytes(body)?;
                    let request = self
                        .client
                        .put_object()
                        .bucket(&self.ctx.bucket)
                        .key(object)
                        .content_type(if op == Op::Write {
                            "application/json"
                        } else {
                            "application/octet-stream"
                        })
                        .body(ByteStream::from(body));
                    let request = match cond {
                        Cond::Absent => request.if_none_match("*"),
                        Cond::Matches(etag) => request.if_match(etag),
                    };
                    match request
                        .customize()
                        .config_override(Self::attempt_config(left))
                        .send()
                        .await
                    {
                        Ok(out) => match out.e_tag() {
                            Some(etag) => Ok(Put::Written(etag.to_owned())),
                            // Written, but with no revision to hold: the core re-reads.
                            None => Err(Error::indeterminate(format!(
                                "S3 accepted the write of {object} without an ETag"
                            ))),
                        },
                        Err(e) => match Failure::of(&e).answer() {
                            Some(Answer::PreconditionFailed | Answer::NoSuchKey)
                                if throttled.load(Ordering::Relaxed) =>
                            {
                                Err(Error::indeterminate(format!(
                                    "the write of S3 object {object} was throttled, then its \
                                     retry found the condition failed: the throttled attempt \
                                     may have been applied"
                                )))
                            }
                            Some(Answer::PreconditionFailed | Answer::NoSuchKey) => Ok(Put::Failed),
                            _ => {
                                let error = map_sdk(op, &self.ctx, e);
                                if error.kind() == ErrorKind::Throttled {
                                    throttled.store(true, Ordering::Relaxed);
                                }
                                Err(error)
                            }
                        },
                    }
                }
            })
            .await;
        match result {
            Err(e) if e.kind() != ErrorKind::Indeterminate && throttled.load(Ordering::Relaxed) => {
                Err(Error::Indeterminate {
                    message: format!(
                        "the write of S3 object {object} was throttled, then failed: a \
                         throttled attempt may have been applied"
                    ),
                    source: Some(Box::new(e)),
                })
            }
            other => other,
        }
    }

    /// The body of a lease record: its JSON with a write id, so that no two writes have the
    /// same bytes (S3's ETag is the MD5 of the bytes; a repeated body would repeat an ETag,
    /// and a follower could take a renewed lease for an unchanged one).
    fn record_body(&self, record: &LeaseRecord) -> Result<Vec<u8>, Error> {
        let broken = |detail: String| {
            Error::backend(
                format!("encoding a lease record for S3 failed: {detail}"),
                "a record the store could not make unique",
            )
        };
        let mut doc: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&record.to_json()).map_err(|e| broken(e.to_string()))?;
        doc.insert("s3_write".to_owned(), self.writes.next().into());
        serde_json::to_vec(&doc).map_err(|e| broken(e.to_string()))
    }

    /// The bytes of `body`, with a new write id.
    fn bytes(&self, body: Body<'_>) -> Result<Vec<u8>, Error> {
        match body {
            Body::Record(record) => self.record_body(record),
            Body::Fenced(token, value) => Ok(self.fenced_body(token, value)),
            Body::Mark(token) => Ok(token.0.to_string().into_bytes()),
        }
    }

    /// The body of a protected object: a write-id line, then the fence line and the value.
    fn fenced_body(&self, token: FencingToken, value: &[u8]) -> Vec<u8> {
        let mut body = WRITE_LINE.to_vec();
        body.extend_from_slice(self.writes.next().as_bytes());
        body.push(b'\n');
        body.extend_from_slice(&encode_fenced(token, value));
        body
    }

    fn label(&self, key: &str, object: &str) -> String {
        format!("{key} (s3://{}/{object})", self.ctx.bucket)
    }

    fn parse_record(
        &self,
        key: &LeaseKey,
        object: &str,
        body: &[u8],
        etag: String,
    ) -> Result<Stored, Error> {
        Ok(Stored {
            record: LeaseRecord::from_json(&self.label(key.as_str(), object), body)?,
            revision: Revision::new(etag),
        })
    }

    /// Creates a released placeholder for an acquire of `record` where `key` has none, and
    /// returns its revision; `None` if another record got there first. A placeholder whose
    /// answer was lost is recognised by holder and nonce: it is no term, so its unknown
    /// outcome is settled here.
    async fn create_placeholder(
        &self,
        key: &LeaseKey,
        record: &LeaseRecord,
    ) -> Result<Option<Revision>, Error> {
        let mut placeholder = record.clone();
        placeholder.state = LeaseState::Released;
        placeholder.nonce = WriteNonce(record.nonce.0 ^ PLACEHOLDER_NONCE_MASK);
        let object = self.lease_object(key);
        let body = Body::Record(&placeholder);
        match self.put(&object, body, Cond::Absent, Op::Write).await {
            Ok(Put::Written(etag)) => Ok(Some(Revision::new(etag))),
            Ok(Put::Failed) => Ok(None),
            Err(e) if e.kind() == ErrorKind::Indeterminate => match self.read(key).await? {
                Some(found)
                    if found.record.nonce == placeholder.nonce
                        && found.record.holder == placeholder.holder =>
                {
                    Ok(Some(found.revision))
                }
                Some(_) => Ok(None),
                None => Err(Error::Unavailable {
                    message: format!(
                        "creating the lease object of {key} had no clear answer and it is not \
                         there; no term was written"
                    ),
                    source: Some(Box::new(e)),
                }),
            },
            Err(e) => Err(e),
        }
    }

    /// Raises the token high-water mark of `key` to at least `proposed` and returns the token
    /// to use: `proposed`, or one above the mark if that is higher; `None` if the lease is no
    /// longer as `expected` (another candidate won the race the mark was contended in).
    ///
    /// Called by every acquire before its lease write, so the mark is at least every token
    /// ever granted for the key, whatever happened to the lease object since. The rounds of a
    /// contended mark are bounded by the call's deadline, not by a count: between two rounds
    /// the lease is read, and a lease that moved on ends the acquire as a conflict.
    async fn raise_mark(
        &self,
        key: &LeaseKey,
        proposed: FencingToken,
        expected: &Revision,
    ) -> Result<Option<FencingToken>, Error> {
        let name = self.mark_object(key);
        // The whole acquire's deadline, taken once: outside the core's `within`, each call
        // would get a fresh default budget and the rounds would never end.
        let deadline = call_deadline();
        loop {
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::unavailable(format!(
                    "the token high-water mark of {key} kept changing until the call's deadline"
                )));
            }
            let (mark, cond) = match self.get(&name, None).await? {
                Got::Object(body, etag) => (
                    parse_mark(&self.label(key.as_str(), &name), &body)?,
                    Some(etag),
                ),
                Got::Absent | Got::Unchanged => (0, None),
            };
            let floor = mark.checked_add(1).ok_or_else(|| Error::InvalidConfig {
                message: format!("the fencing token of {key} reached u64::MAX in its mark {name}"),
                source: None,
            })?;
            let token = proposed.max(FencingToken(floor));
            let cond = cond.as_deref().map_or(Cond::Absent, Cond::Matches);
            // The mark only rises, so its bytes (the number) never repeat.
            match self
                .put(&name, Body::Mark(token), cond, Op::MarkWrite)
                .await
            {
                Ok(Put::Written(_)) => {
                    if token != proposed {
                        info!(%key, %proposed, %token, "raised the token above the high-water mark (the lease object was deleted or recreated)");
                    }
                    return Ok(Some(token));
                }
                // Another acquire raised it first: if it has written the lease since, ours
                // would fail; else try the mark again.
                Ok(Put::Failed) => {
                    let lease = self.get(&self.lease_object(key), None).await?;
                    let still = matches!(&lease, Got::Object(_, etag) if etag == expected.as_str());
                    if !still {
                        return Ok(None);
                    }
                }
                // Whatever became of the mark, it only rose (tokens skip a value at worst), and
                // the lease was not written: read the mark again while time is left.
                Err(e) if e.kind() == ErrorKind::Indeterminate => {
                    debug!(%key, error = %e, "the token mark write had no clear answer; reading it again");
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// The token in a mark object's body.
fn parse_mark(label: &str, body: &[u8]) -> Result<u64, Error> {
    std::str::from_utf8(body)
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .ok_or_else(|| Error::MalformedRecord {
            key: label.to_owned(),
            detail: format!(
                "the token high-water mark is not a number ({} bytes)",
                body.len()
            ),
        })
}

/// A protected object's bytes without this crate's write-id line.
fn strip_write_line(body: &[u8]) -> &[u8] {
    body.strip_prefix(WRITE_LINE)
        .and_then(|rest| {
            rest.iter()
                .position(|b| *b == b'\n')
                .map(|i| &rest[i + 1..])
        })
        .unwrap_or(body)
}

#[async_trait]
impl LeaseBackend for S3Store {
    fn name(&self) -> &'static str {
        "s3"
    }

    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        let object = self.lease_object(key);
        match self.get(&object, None).await? {
            Got::Object(body, etag) => self.parse_record(key, &object, &body, etag).map(Some),
            Got::Absent | Got::Unchanged => Ok(None),
        }
    }

    /// Downloads the record only if its ETag changed (`If-None-Match`: S3 answers 304 without a
    /// body while it has not). Each poll is one GET request either way.
    async fn read_if_changed(
        &self,
        key: &LeaseKey,
        known: Option<&Revision>,
    ) -> Result<IfChanged, Error> {
        let object = self.lease_object(key);
        Ok(
            match self.get(&object, known.map(Revision::as_str)).await? {
                Got::Unchanged => IfChanged::Unchanged,
                Got::Absent => IfChanged::Changed(None),
                Got::Object(body, etag) => {
                    IfChanged::Changed(Some(self.parse_record(key, &object, &body, etag)?))
                }
            },
        )
    }

    /// Writes the record with `If-None-Match: *` (absent) or `If-Match` on the ETag expected.
    /// An acquire first raises the key's token mark (see the crate docs).
    ///
    /// # Errors
    /// [`Error::Indeterminate`] if the lease write may have landed (no answer within the
    /// request timeout, a lost connection or a 5xx); [`Error::NotFound`] if the bucket is
    /// missing; any other [`Error`] means the lease record was not written.
    ///
    /// # Cancel safety
    /// Not cancel-safe: a cancelled write may still be applied. Treat it as indeterminate.
    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        let object = self.lease_object(&request.key);
        let mut record = request.record;
        let mut expected = request.expected;
        if request.kind == WriteKind::Acquire {
            // Absence can come back (an operator deletes the object), so an acquire never
            // writes its term on it: it creates a released placeholder, whose ETag is new,
            // and takes that (see the crate docs, "Fencing tokens").
            let taken = match expected {
                Expected::Revision(revision) => revision,
                Expected::Absent => match self.create_placeholder(&request.key, &record).await? {
                    Some(revision) => revision,
                    None => return Ok(WriteOutcome::Conflict { current: None }),
                },
            };
            match self.raise_mark(&request.key, record.token, &taken).await? {
                Some(token) => record.token = token,
                None => return Ok(WriteOutcome::Conflict { current: None }),
            }
            expected = Expected::Revision(taken);
        }
        let cond = match &expected {
            Expected::Absent => Cond::Absent,
            Expected::Revision(r) => Cond::Matches(r.as_str()),
        };
        Ok(
            match self
                .put(&object, Body::Record(&record), cond, Op::Write)
                .await?
            {
                Put::Written(etag) => WriteOutcome::Written(Stored {
                    record,
                    revision: Revision::new(etag),
                }),
                Put::Failed => WriteOutcome::Conflict { current: None },
            },
        )
    }
}

#[async_trait]
impl FencedCas for S3Store {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        let name = self.fenced_object(object);
        match self.get(&name, None).await? {
            Got::Object(body, etag) => decode_fenced(
                &self.label(object.as_str(), &name),
                strip_write_line(&body),
                Revision::new(etag),
            )
            .map(Some),
            Got::Absent | Got::Unchanged => Ok(None),
        }
    }

    /// S3 has no transaction across two objects, so this does not check the lease in the
    /// same write ([`FencedCas`] item 3 is optional): the fence holds because the object
    /// carries its highest token and is only replaced on the ETag the fence check read.
    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        let cond = match put.expected {
            Expected::Absent => Cond::Absent,
            Expected::Revision(r) => Cond::Matches(r.as_str()),
        };
        let body = Body::Fenced(put.fence.token, put.value);
        Ok(
            match self
                .put(&self.fenced_object(put.object), body, cond, Op::ObjectWrite)
                .await?
            {
                Put::Written(etag) => ObjectWrite::Written(Revision::new(etag)),
                Put::Failed => ObjectWrite::Conflict,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use leader_core::HolderId;
    use leader_core::backend::WriteNonce;

    fn store() -> S3Store {
        let client = Client::from_conf(
            aws_sdk_s3::Config::builder()
                .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
                .build(),
        );
        S3Store::new(
            client,
            Context {
                bucket: "b".to_owned(),
            },
            "p/".to_owned(),
            Backoff::DEFAULT,
        )
    }

    /// The same record written twice gives two different bodies (and so two ETags), which
    /// still read back as the same record.
    #[test]
    fn no_two_writes_have_the_same_bytes() {
        let s = store();
        let record = LeaseRecord::held(
            HolderId::new("a").unwrap(),
            FencingToken(3),
            Duration::from_secs(5),
            Default::default(),
            WriteNonce(7),
        );
        let (one, two) = (
            s.record_body(&record).unwrap(),
            s.record_body(&record).unwrap(),
        );
        assert_ne!(one, two);
        for body in [&one, &two] {
            assert_eq!(LeaseRecord::from_json("k", body).unwrap(), record);
        }
        // Another store (another process) with the same record differs too.
        assert_ne!(store().record_body(&record).unwrap(), one);

        let (f1, f2) = (
            s.fenced_body(FencingToken(4), b"v"),
            s.fenced_body(FencingToken(4), b"v"),
        );
        assert_ne!(f1, f2);
        for body in [&f1, &f2] {
            let o = decode_fenced("o", strip_write_line(body), Revision::new("e")).unwrap();
            assert_eq!((o.fence, o.value.as_slice()), (FencingToken(4), &b"v"[..]));
        }
        // An object without the write line (written by hand, or an older version) still reads.
        let plain = encode_fenced(FencingToken(2), b"x");
        assert_eq!(strip_write_line(&plain), plain.as_slice());
    }

    #[test]
    fn object_names() {
        let s = store();
        let key = LeaseKey::new("k").unwrap();
        assert_eq!(s.lease_object(&key), "p/k");
        assert_eq!(s.mark_object(&key), "p/.k.token");
        assert_eq!(
            s.fenced_object(&ObjectName::new("o").unwrap()),
            "p/.o.fenced"
        );
    }

    #[test]
    fn marks_are_numbers() {
        assert_eq!(parse_mark("m", b"42").unwrap(), 42);
        let e = parse_mark("m (s3://b/.k.token)", b"x").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MalformedRecord);
        assert!(e.to_string().contains("s3://b/.k.token"), "{e}");
    }
}
