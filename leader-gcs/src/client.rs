//! The calls to GCS: `read_object` and `write_object` (a multipart upload with
//! `ifGenerationMatch`), with our own bounded retries, and the lease and fencing logic on top.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use google_cloud_storage::Error as SdkError;
use google_cloud_storage::client::Storage;
use google_cloud_storage::stub::{DefaultStorage, Storage as Stub};
use leader_core::backend::{
    Backoff, Call, FencedCas, FencedPut, ObjectWrite, decode_fenced, encode_fenced,
};
use leader_core::backend::{
    Expected, IfChanged, LeaseRecord, LeaseState, Revision, Stored, WriteKind, WriteNonce,
    WriteOutcome, WriteRequest,
};
use leader_core::{
    ConfigError, Error, FencedObject, FencingToken, LeaseBackend, LeaseKey, ObjectName, Timing,
};

use crate::error::{Class, Request, after_ambiguous, bucket_missing, map_error};

/// GCS accepts about one write per second to one object name.
pub const MIN_RENEW_EVERY: Duration = Duration::from_secs(1);

/// Backoff between attempts of one call: doubles from the first, capped.
const BACKOFF: Backoff = Backoff::new(Duration::from_millis(25), Duration::from_millis(400));

/// Leases and fenced objects in one GCS bucket.
///
/// Each lease key is one object, `<prefix><key>`, whose body is the record's JSON and whose
/// generation is the revision. Protected objects are `<prefix>.<name>.fenced`. See the crate
/// docs for the fencing-token scheme and the retry rules.
///
/// The type parameter is the SDK's transport; only tests replace it (with a mock stub).
#[derive(Clone)]
pub struct GcsStore<S: Stub + 'static = DefaultStorage> {
    storage: Storage<S>,
    bucket: String,
    bucket_path: String,
    prefix: String,
}

impl<S: Stub + 'static> fmt::Debug for GcsStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GcsStore")
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// The answer to a conditional upload.
enum Put {
    Written(i64),
    PreconditionFailed,
}

impl GcsStore {}

impl<S: Stub + 'static> GcsStore<S> {
    pub(crate) fn new(storage: Storage<S>, bucket: String, prefix: String) -> Self {
        Self {
            storage,
            bucket_path: format!("projects/_/buckets/{bucket}"),
            bucket,
            prefix,
        }
    }

    /// Reads an object that need not exist, so that a missing bucket (or missing
    /// permissions) shows now rather than at the first election.
    pub(crate) async fn check_bucket(&self) -> Result<(), Error> {
        self.get(&format!("{}.leader-bucket-check", self.prefix))
            .await
            .map(drop)
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The name of the object that holds `key`'s lease record.
    pub fn lease_object(&self, key: &LeaseKey) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The name of the GCS object behind a protected object: `<prefix>.<name>.fenced`, beside
    /// the leases (no lease key starts with `.`, so the two never meet).
    pub fn fenced_object(&self, object: &ObjectName) -> String {
        format!("{}.{object}.fenced", self.prefix)
    }

    fn request<'a>(&'a self, object: &'a str, write: bool) -> Request<'a> {
        Request {
            write,
            bucket: &self.bucket,
            object,
        }
    }

    /// Downloads an object and its generation; with `unless`, only if its generation is not
    /// that one (`ifGenerationNotMatch`), else `Ok(None)`.
    async fn get_once(
        &self,
        object: &str,
        unless: Option<i64>,
    ) -> Result<Option<(Vec<u8>, i64)>, SdkError> {
        let mut read = self.storage.read_object(&self.bucket_path, object);
        if let Some(generation) = unless {
            read = read.set_if_generation_not_match(generation);
        }
        // Boxed: the SDK's future is deeply nested, and this read sits under the builder's
        // bucket check; a caller awaiting `build()` in a large async fn would otherwise meet
        // the compiler's query depth limit.
        let mut response = match Box::pin(read.send()).await {
            Ok(response) => response,
            // GCS answers 304 when the generation is still `unless`; 412 is how a failed
            // precondition reads elsewhere, and this read has no other precondition.
            Err(e) if unless.is_some() && matches!(e.http_status_code(), Some(304 | 412)) => {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let generation = response.object().generation;
        if unless == Some(generation) {
            // A server that ignores the precondition sent the object anyway.
            return Ok(None);
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.next().await.transpose()? {
            body.extend_from_slice(&chunk);
        }
        Ok(Some((body, generation)))
    }

    /// Reads an object's body and generation; `None` if it does not exist. Throttling and
    /// transient failures are retried within the request timeout.
    async fn get(&self, object: &str) -> Result<Option<(Vec<u8>, i64)>, Error> {
        match self.get_unless(object, None).await? {
            Found::Object(body, generation) => Ok(Some((body, generation))),
            Found::Absent => Ok(None),
            // Only a read with a generation to compare can be answered "unchanged".
            Found::Unchanged => Err(Error::backend(
                format!("GCS answered 'not modified' to an unconditional read of {object}"),
                "a 304 without ifGenerationNotMatch",
            )),
        }
    }

    /// Reads an object unless its generation is still `unless`; throttling and transient
    /// failures are retried within the request timeout.
    async fn get_unless(&self, object: &str, unless: Option<i64>) -> Result<Found, Error> {
        let request = self.request(object, false);
        Call::read("reading a GCS object")
            .with_backoff(BACKOFF)
            .run(|_| async move {
                match self.get_once(object, unless).await {
                    Ok(Some((body, generation))) => Ok(Found::Object(body, generation)),
                    Ok(None) => Ok(Found::Unchanged),
                    Err(e) if Class::of(&e) == Class::NotFound && !bucket_missing(&e) => {
                        Ok(Found::Absent)
                    }
                    Err(e) => Err(map_error(e, request)),
                }
            })
            .await
    }

    /// Uploads `body` if the object's generation is `if_generation` (0: absent).
    ///
    /// Throttling and failures before sending are retried; a failure that may have applied
    /// the write (5xx, a lost connection, the timeout) is [`Error::Indeterminate`] at once,
    /// never retried: the core re-reads to decide.
    async fn put(&self, object: &str, body: Bytes, if_generation: i64) -> Result<Put, Error> {
        let request = self.request(object, true);
        // Sent up front in the metadata part: the SDK otherwise appends the checksum as a
        // third multipart part, which fake-gcs-server stores as part of the body.
        let crc = crc32c::crc32c(&body);
        Call::write("writing a GCS object")
            .with_backoff(BACKOFF)
            .run(|_| {
                let upload = self
                    .storage
                    .write_object(&self.bucket_path, object, body.clone())
                    .set_if_generation_match(if_generation)
                    .set_content_type("application/octet-stream")
                    .with_known_crc32c(crc)
                    .with_idempotency(false)
                    .send_unbuffered();
                async move {
                    match upload.await {
                        Ok(written) => Ok(Put::Written(written.generation)),
                        Err(e) if Class::of(&e) == Class::PreconditionFailed => {
                            Ok(Put::PreconditionFailed)
                        }
                        Err(e) => Err(map_error(e, request)),
                    }
                }
            })
            .await
    }

    async fn put_record(
        &self,
        object: &str,
        record: LeaseRecord,
        if_generation: i64,
    ) -> Result<WriteOutcome, Error> {
        let body = Bytes::from(record.to_json());
        Ok(match self.put(object, body, if_generation).await? {
            Put::Written(generation) => WriteOutcome::Written(Stored {
                record,
                revision: revision(generation),
            }),
            Put::PreconditionFailed => WriteOutcome::Conflict { current: None },
        })
    }

    /// Creates a lease record where there is none, in two writes, so that the token is raised
    /// above the generation of the first: a released placeholder (`ifGenerationMatch=0`),
    /// then the held record on the placeholder's generation.
    async fn create(&self, object: &str, record: LeaseRecord) -> Result<WriteOutcome, Error> {
        let mut placeholder = record.clone();
        placeholder.state = LeaseState::Released;
        placeholder.nonce = WriteNonce(!record.nonce.0);
        let first = match self.put_record(object, placeholder, 0).await? {
            WriteOutcome::Written(stored) => stored,
            conflict @ WriteOutcome::Conflict { .. } => return Ok(conflict),
        };
        let generation = generation_of(&first.revision).unwrap_or(0);
        let mut record = record;
        record.token = raise(record.token, generation);
        // The placeholder is written: from here on any failure leaves the record changed, so
        // the core must re-read (it finds a released record and acquires it at once).
        self.put_record(object, record, generation)
            .await
            .map_err(|e| after_ambiguous(e, self.request(object, true)))
    }
}

/// What a read found.
enum Found {
    /// The generation is still the one the reader knows.
    Unchanged,
    /// No such object.
    Absent,
    /// The object's body and generation.
    Object(Vec<u8>, i64),
}

fn revision(generation: i64) -> Revision {
    Revision::new(generation.to_string())
}

fn generation_of(revision: &Revision) -> Option<i64> {
    revision.as_str().parse().ok().filter(|g: &i64| *g > 0)
}

/// The token of a new term begun on an object at `generation`: above the proposal and above
/// the generation. GCS generations are microsecond timestamps, so every term's token is at
/// most the generation of the write that began it, and a recreated object (with a later
/// generation) still yields tokens above every earlier one.
fn raise(proposed: FencingToken, generation: i64) -> FencingToken {
    let floor = u64::try_from(generation).unwrap_or(0).saturating_add(1);
    proposed.max(FencingToken(floor))
}

impl<S: Stub + 'static> GcsStore<S> {
    fn parse_record(
        &self,
        key: &LeaseKey,
        object: &str,
        body: &[u8],
        generation: i64,
    ) -> Result<Stored, Error> {
        let label = format!("{key} (gs://{}/{object})", self.bucket);
        Ok(Stored {
            record: LeaseRecord::from_json(&label, body)?,
            revision: revision(generation),
        })
    }
}

#[async_trait]
impl<S: Stub + 'static> LeaseBackend for GcsStore<S> {
    fn name(&self) -> &'static str {
        "gcs"
    }

    /// GCS allows about one write per second to an object: `renew_every` must be at least
    /// 1 s, and the elector's request timeout must leave room for this store's.
    fn check_timing(&self, timing: &Timing) -> Result<(), ConfigError> {
        if timing.renew_every < MIN_RENEW_EVERY {
            return Err(ConfigError::Unsupported {
                backend: "gcs",
                reason: format!(
                    "renew_every {:?} is below 1 s; GCS accepts about one write per second to an object",
                    timing.renew_every
                ),
            });
        }
        Ok(())
    }

    /// Reads the object of `key`.
    ///
    /// # Errors
    /// [`Error::MalformedRecord`] naming the key, bucket and object if the body is not a lease
    /// record; [`Error::NotFound`] if the bucket is missing (on GCS; an emulator may only tell
    /// on the first write); [`Error::Timeout`] after the request timeout; any other [`Error`]
    /// for a store failure.
    ///
    /// # Cancel safety
    /// Cancel-safe: a read changes nothing.
    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        let object = self.lease_object(key);
        let Some((body, generation)) = self.get(&object).await? else {
            return Ok(None);
        };
        self.parse_record(key, &object, &body, generation).map(Some)
    }

    /// Downloads the record only if its generation changed (`ifGenerationNotMatch`: GCS
    /// answers 304 without a body while it has not). Each poll is still one billed read
    /// (class B), but an unchanged record costs no download.
    async fn read_if_changed(
        &self,
        key: &LeaseKey,
        known: Option<&Revision>,
    ) -> Result<IfChanged, Error> {
        let object = self.lease_object(key);
        let unless = known.and_then(generation_of);
        Ok(match self.get_unless(&object, unless).await? {
            Found::Unchanged => IfChanged::Unchanged,
            Found::Absent => IfChanged::Changed(None),
            Found::Object(body, generation) => {
                IfChanged::Changed(Some(self.parse_record(key, &object, &body, generation)?))
            }
        })
    }

    /// Uploads the record with `ifGenerationMatch` (0 for an absent object). An acquire on an
    /// existing object raises the token above the observed generation; an acquire of an
    /// absent object first writes a released placeholder (see the crate docs).
    ///
    /// # Errors
    /// [`Error::Indeterminate`] if the write may have landed (no answer within the request
    /// timeout, a lost connection or 5xx, a 412 after such a failure); [`Error::NotFound`] if
    /// the bucket is missing; any other [`Error`] means nothing was written.
    ///
    /// # Cancel safety
    /// Not cancel-safe: a cancelled write may still be applied. Treat it as indeterminate.
    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        let object = self.lease_object(&request.key);
        let mut record = request.record;
        match request.expected {
            Expected::Absent if request.kind == WriteKind::Acquire => {
                self.create(&object, record).await
            }
            Expected::Absent => self.put_record(&object, record, 0).await,
            Expected::Revision(expected) => {
                let Some(generation) = generation_of(&expected) else {
                    // Not a generation of ours: the object cannot be at that revision.
                    return Ok(WriteOutcome::Conflict { current: None });
                };
                if request.kind == WriteKind::Acquire {
                    record.token = raise(record.token, generation);
                }
                self.put_record(&object, record, generation).await
            }
        }
    }
}

#[async_trait]
impl<S: Stub + 'static> FencedCas for GcsStore<S> {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        let name = self.fenced_object(object);
        let label = format!("{object} (gs://{}/{name})", self.bucket);
        self.get(&name)
            .await?
            .map(|(body, generation)| decode_fenced(&label, &body, revision(generation)))
            .transpose()
    }

    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        let if_generation = match put.expected {
            Expected::Absent => 0,
            // A revision this store did not hand out matches no object.
            Expected::Revision(r) => match generation_of(r) {
                Some(generation) => generation,
                None => return Ok(ObjectWrite::Conflict),
            },
        };
        let body = Bytes::from(encode_fenced(put.fence.token, put.value));
        Ok(
            match self
                .put(&self.fenced_object(put.object), body, if_generation)
                .await?
            {
                Put::Written(generation) => ObjectWrite::Written(revision(generation)),
                Put::PreconditionFailed => ObjectWrite::Conflict,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::Arc;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use google_cloud_storage::model::{Object, ReadObjectRequest};
    use google_cloud_storage::model_ext::{ObjectHighlights, WriteObjectRequest};
    use google_cloud_storage::read_object::ReadObjectResponse;
    use google_cloud_storage::request_options::RequestOptions;
    use google_cloud_storage::streaming_source::{Seek, StreamingSource};
    use leader_core::ErrorKind;
    use leader_core::backend::within;
    use tokio::time::Instant;

    /// One scripted answer of the mock transport.
    #[derive(Clone, Debug)]
    enum Reply {
        /// Success: the object's generation (and, for reads, this body).
        Ok(i64),
        /// An HTTP error status with a body.
        Status(u16, &'static str),
        /// The connection broke after the request was sent.
        Broken,
        /// The connection could not be made.
        Refused,
        /// No answer, ever.
        Hang,
    }

    #[derive(Debug, Default)]
    struct Scripted {
        replies: Mutex<VecDeque<Reply>>,
        /// Answer given once the script is exhausted.
        then: Option<Reply>,
        calls: AtomicUsize,
        /// The `ifGenerationNotMatch` of each read.
        unless: Mutex<Vec<Option<i64>>>,
    }

    impl Scripted {
        fn new(replies: &[Reply], then: Option<Reply>) -> Self {
            Self {
                replies: Mutex::new(replies.iter().cloned().collect()),
                then,
                calls: AtomicUsize::new(0),
                unless: Mutex::new(Vec::new()),
            }
        }

        fn next(&self) -> Reply {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let next = self.replies.lock().unwrap().pop_front();
            next.or_else(|| self.then.clone())
                .expect("the script ran out of replies")
        }
    }

    async fn answer(reply: Reply) -> Result<i64, SdkError> {
        match reply {
            Reply::Ok(generation) => Ok(generation),
            Reply::Status(status, body) => Err(SdkError::http(
                status,
                http::HeaderMap::new(),
                Bytes::from_static(body.as_bytes()),
            )),
            Reply::Broken => Err(SdkError::io(std::io::Error::other("connection reset"))),
            Reply::Refused => Err(SdkError::connect(std::io::Error::other("refused"))),
            Reply::Hang => std::future::pending().await,
        }
    }

    impl Stub for Scripted {
        fn read_object(
            &self,
            req: ReadObjectRequest,
            _options: RequestOptions,
        ) -> impl Future<Output = google_cloud_storage::Result<ReadObjectResponse>> + Send {
            self.unless
                .lock()
                .unwrap()
                .push(req.if_generation_not_match);
            let reply = self.next();
            async move {
                let generation = answer(reply).await?;
                let mut object = ObjectHighlights::default();
                object.generation = generation;
                Ok(ReadObjectResponse::from_source(object, "body"))
            }
        }

        fn write_object_unbuffered<P>(
            &self,
            _payload: P,
            _req: WriteObjectRequest,
            _options: RequestOptions,
        ) -> impl Future<Output = google_cloud_storage::Result<Object>> + Send
        where
            P: StreamingSource + Seek + Send + Sync + 'static,
        {
            let reply = self.next();
            async move { Ok(Object::new().set_generation(answer(reply).await?)) }
        }
    }

    const TIMEOUT: Duration = Duration::from_millis(300);

    fn store(replies: &[Reply], then: Option<Reply>) -> (GcsStore<Scripted>, Arc<Scripted>) {
        let stub = Arc::new(Scripted::new(replies, then));
        let storage = Storage::from_stub(stub.clone());
        let store = GcsStore::new(storage, "b1c".into(), "p/".into());
        (store, stub)
    }

    async fn put(replies: &[Reply], then: Option<Reply>) -> (Result<Put, Error>, usize, Duration) {
        let (store, stub) = store(replies, then);
        let started = Instant::now();
        let result = within(TIMEOUT, store.put("p/k", Bytes::from_static(b"x"), 5))
            .await
            .expect("the store ends its call by the deadline");
        (result, stub.calls.load(Ordering::SeqCst), started.elapsed())
    }

    #[tokio::test]
    async fn throttled_and_unsent_writes_are_retried() {
        let (r, calls, _) = put(&[Reply::Status(429, ""), Reply::Ok(7)], None).await;
        assert!(matches!(r, Ok(Put::Written(7))) && calls == 2);
        let (r, calls, _) = put(
            &[Reply::Refused, Reply::Status(429, ""), Reply::Ok(8)],
            None,
        )
        .await;
        assert!(matches!(r, Ok(Put::Written(8))) && calls == 3);
    }

    #[tokio::test]
    async fn a_precondition_failure_is_a_conflict_and_an_ambiguous_failure_is_never_retried() {
        let (r, calls, _) = put(&[Reply::Status(412, "")], None).await;
        assert!(matches!(r, Ok(Put::PreconditionFailed)) && calls == 1);
        // Throttled or refused attempts were not applied: a later 412 is still a conflict.
        let (r, _, _) = put(
            &[
                Reply::Status(429, ""),
                Reply::Refused,
                Reply::Status(412, ""),
            ],
            None,
        )
        .await;
        assert!(matches!(r, Ok(Put::PreconditionFailed)));
        // After a broken connection or a 5xx the attempt may have landed: the outcome is
        // unknown at once, and the write is not sent again.
        for first in [
            Reply::Broken,
            Reply::Status(503, ""),
            Reply::Status(500, ""),
        ] {
            let (r, calls, _) =
                put(std::slice::from_ref(&first), Some(Reply::Status(412, ""))).await;
            let err = r.err().unwrap();
            assert_eq!(err.kind(), ErrorKind::Indeterminate, "{first:?}: {err}");
            assert_eq!(calls, 1);
        }
    }

    /// A follower's poll asks for the body only if the generation changed: GCS's 304 (or a
    /// 412, or the object at that same generation from a server that ignores the condition)
    /// is `Unchanged`; another generation is downloaded and parsed (the stub's body is not a
    /// record, hence the malformed-record error).
    #[tokio::test]
    async fn a_poll_downloads_only_a_changed_generation() {
        let key = LeaseKey::new("k").unwrap();
        let known = revision(5);
        for (reply, unchanged) in [
            (Reply::Status(304, ""), true),
            (Reply::Status(412, ""), true),
            (Reply::Ok(5), true),
            (Reply::Ok(6), false),
        ] {
            let (store, stub) = store(std::slice::from_ref(&reply), None);
            let r = within(TIMEOUT, store.read_if_changed(&key, Some(&known)))
                .await
                .unwrap();
            match r {
                Ok(IfChanged::Unchanged) => assert!(unchanged, "{reply:?}"),
                Err(e) => {
                    assert!(!unchanged, "{reply:?}: {e}");
                    assert_eq!(e.kind(), leader_core::ErrorKind::MalformedRecord, "{e}");
                }
                Ok(other) => panic!("{reply:?}: {other:?}"),
            }
            assert_eq!(*stub.unless.lock().unwrap(), [Some(5)]);
        }
        // Without a known revision the read is plain, and a 304 would be an error.
        let (store, stub) = store(&[Reply::Status(304, "")], None);
        let r = within(TIMEOUT, store.read_if_changed(&key, None))
            .await
            .unwrap();
        assert!(r.is_err(), "{r:?}");
        assert_eq!(*stub.unless.lock().unwrap(), [None]);
    }

    #[tokio::test]
    async fn retries_stop_at_the_request_timeout() {
        let slack = Duration::from_millis(150);
        // Throttled until the deadline: nothing was written, so it says throttled.
        let (r, calls, took) = put(&[], Some(Reply::Status(429, ""))).await;
        assert_eq!(r.err().unwrap().kind(), ErrorKind::Throttled);
        assert!(
            calls > 2 && took < TIMEOUT + slack,
            "{calls} calls in {took:?}"
        );
        // Throttled, then ambiguous: the outcome is unknown, and nothing more is sent.
        let (r, calls, _) = put(
            &[Reply::Status(429, ""), Reply::Status(503, "")],
            Some(Reply::Ok(1)),
        )
        .await;
        assert_eq!(r.err().unwrap().kind(), ErrorKind::Indeterminate);
        assert_eq!(calls, 2);
        // No answer at all: indeterminate, at the timeout.
        let (r, calls, took) = put(&[Reply::Hang], None).await;
        assert_eq!(r.err().unwrap().kind(), ErrorKind::Indeterminate);
        assert!(calls == 1 && took < TIMEOUT + slack, "{took:?}");
    }

    #[tokio::test]
    async fn permanent_write_failures_are_not_retried() {
        for (status, kind) in [
            (403, ErrorKind::PermissionDenied),
            (401, ErrorKind::Unauthenticated),
            (404, ErrorKind::NotFound),
            (400, ErrorKind::Backend),
        ] {
            let (r, calls, _) = put(&[Reply::Status(status, "")], Some(Reply::Ok(1))).await;
            assert_eq!(r.err().unwrap().kind(), kind, "{status}");
            assert_eq!(calls, 1, "{status}");
        }
    }

    #[tokio::test]
    async fn reads_retry_transient_failures_and_tell_absence_from_a_missing_bucket() {
        let key = LeaseKey::new("k").unwrap();
        let (s, stub) = store(&[Reply::Status(503, ""), Reply::Broken, Reply::Ok(3)], None);
        let err = s.read(&key).await.unwrap_err();
        // The mock's body is not a record: the error names the key, bucket and object.
        assert!(err.to_string().contains("k (gs://b1c/p/k)"), "{err}");
        assert_eq!(stub.calls.load(Ordering::SeqCst), 3);

        let (s, _) = store(&[Reply::Status(404, "No such object: b1c/p/k")], None);
        assert!(s.read(&key).await.unwrap().is_none());
        let (s, _) = store(
            &[Reply::Status(404, "The specified bucket does not exist.")],
            None,
        );
        assert_eq!(s.read(&key).await.unwrap_err().kind(), ErrorKind::NotFound);
        let (s, _) = store(&[Reply::Hang], None);
        let hung = within(TIMEOUT, s.read(&key))
            .await
            .expect("ended by the deadline");
        assert_eq!(hung.unwrap_err().kind(), ErrorKind::Timeout);
    }

    #[test]
    fn tokens_are_raised_above_the_generation_only() {
        assert_eq!(raise(FencingToken(5), 1_000), FencingToken(1_001));
        assert_eq!(raise(FencingToken(5_000), 1_000), FencingToken(5_000));
        assert_eq!(raise(FencingToken(5), -1), FencingToken(5));
        assert_eq!(raise(FencingToken(5), i64::MAX), FencingToken(1 << 63));
    }

    #[test]
    fn revisions_are_positive_generations() {
        assert_eq!(generation_of(&revision(17)), Some(17));
        assert_eq!(generation_of(&Revision::new("etag")), None);
        assert_eq!(generation_of(&Revision::new("0")), None);
    }
}
