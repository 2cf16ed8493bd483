//! The calls to Azure Blob Storage: one blob per lease key, leased by the holder.
//!
//! Blob names in the container, after the store's prefix (none by default, or a folder such as
//! `prod/leases/`; lease keys and object names never start with `.`, so these cannot
//! collide):
//! - `{key}`: the lease record as JSON ([`LeaseRecord::to_json`]), with the token,
//!   holder and state mirrored in its metadata (`leadertoken`, `leaderholder`, `leaderstate`)
//!   for people looking in the portal.
//!
//! The service, not the record, decides whether a lease is live: `read` reports a record as
//! held only while the blob's lease is active (`x-ms-lease-state: leased`), and the revision
//! is the blob's ETag together with its lease state. So a lease that an operator broke, or
//! that expired, reads as released with a new revision, and the holder's next renew is
//! reported lost although the record itself did not change. A holder that lost the answer to
//! one of its writes re-reads with its lease id ([`LeaseBackend::read_for_term`]), which the
//! service answers only while that lease is active, so it never takes back a term whose lease
//! was broken or passed to another candidate in between.
//! - `.{key}.token`: the highest token ever granted for the key, so that a term that starts on
//!   a recreated lease blob (an operator deleted it) still gets a higher token.
//! - `.{name}.fenced`: a protected object; its fence is in the `leaderfence` metadata.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use azure_core::Bytes;
use azure_core::http::headers::{HeaderName, Headers};
use azure_core::http::{Etag, RequestContent};
use azure_storage_blob::models::{
    BlobClientAcquireLeaseOptions, BlobClientAcquireLeaseResultHeaders, BlobClientDownloadOptions,
    BlobClientGetPropertiesResultHeaders, BlobClientReleaseLeaseOptions,
    BlobClientReleaseLeaseResultHeaders, BlobClientRenewLeaseOptions,
    BlobClientRenewLeaseResultHeaders, BlockBlobClientUploadOptions,
};
use azure_storage_blob::{BlobClient, BlobContainerClient};
use leader_core::backend::{Call, FencedCas, FencedPut, ObjectWrite, call_budget, call_deadline};
use leader_core::backend::{
    Expected, ExpiryModel, IfChanged, LeaseRecord, LeaseState, Revision, Stored, TermId, WriteKind,
    WriteNonce, WriteOutcome, WriteRequest,
};
use leader_core::{
    ConfigError, Error, FencedObject, FencingToken, LeaseBackend, LeaseKey, ObjectName, Timing,
};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::error::{Class, Effect, classify, to_error};

/// The shortest lease Azure grants, in seconds.
pub const MIN_LEASE_SECS: u64 = 15;
/// The longest finite lease Azure grants, in seconds.
pub const MAX_LEASE_SECS: u64 = 60;

const META_TOKEN: &str = "leadertoken";
const META_HOLDER: &str = "leaderholder";
const META_STATE: &str = "leaderstate";
const META_FENCE: &str = "leaderfence";
const FENCE_HEADER: HeaderName = HeaderName::from_static("x-ms-meta-leaderfence");
/// How often a contended compare-and-swap (high-water mark, fenced object) is tried.
const CAS_ATTEMPTS: usize = 4;
/// Distinguishes the nonce of the placeholder a create writes from the record's own.
const PLACEHOLDER_NONCE_MASK: u64 = 0x5a5a_5a5a_5a5a_5a5a;
const LEASE_STATE_HEADER: HeaderName = HeaderName::from_static("x-ms-lease-state");
const LEASED: &str = "leased";
const AVAILABLE: &str = "available";
/// The lease-state part of a revision read by a term whose lease the blob does not have.
const NOT_OURS: &str = "not-ours";
/// An acquire-lease call may take this share of the call's time (1/3), so that a call
/// whose answer is lost can be asked again, with the same lease id, within the timeout.
const LEASE_ATTEMPT_SHARE: u32 = 3;
/// The pause before asking again for a lease whose answer was lost or failed.
const LEASE_RETRY_PAUSE: Duration = Duration::from_millis(100);

/// The revision of a lease blob: its ETag and its lease state.
fn revision(etag: &str, lease_state: &str) -> Revision {
    Revision::new(format!("{etag}|{lease_state}"))
}

/// The ETag part of a revision made by [`revision`].
fn etag_of(revision: &Revision) -> &str {
    revision
        .as_str()
        .rsplit_once('|')
        .map_or(revision.as_str(), |(etag, _)| etag)
}

/// A lease store on Azure Blob Storage, with the service's own leases enforcing expiry.
///
/// Build it with [`AzureLeaseStoreBuilder`](crate::AzureLeaseStoreBuilder). Cloning is cheap;
/// clones share the HTTP client.
#[derive(Clone)]
pub struct AzureLeaseStore {
    container: Arc<BlobContainerClient>,
    container_name: String,
    /// Put before every blob name (a folder such as `prod/leases/`, or nothing).
    prefix: String,
    create_container: bool,
}

impl fmt::Debug for AzureLeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL is shown without its query, which may hold a SAS token.
        let mut url = self.container.url().clone();
        url.set_query(None);
        f.debug_struct("AzureLeaseStore")
            .field("container", &url.as_str())
            .finish_non_exhaustive()
    }
}

/// What a blob is, as read.
struct Fetched {
    body: Bytes,
    etag: String,
    headers: Headers,
}

/// The lease state in a blob's response headers (Get Blob, Get Blob Properties), in lower case.
fn lease_state_of(headers: &Headers) -> String {
    headers
        .get_optional_str(&LEASE_STATE_HEADER)
        .unwrap_or(AVAILABLE)
        .to_ascii_lowercase()
}

impl Fetched {
    /// The blob's lease state as the service reported it, in lower case.
    fn lease_state(&self) -> String {
        lease_state_of(&self.headers)
    }

    /// The lease record of `key`, marked released unless `held`, with a revision from the
    /// ETag and `state`.
    fn into_stored(self, key: &LeaseKey, held: bool, state: &str) -> Result<Stored, Error> {
        let mut record = LeaseRecord::from_json(key.as_str(), &self.body)?;
        if !held {
            record.state = LeaseState::Released;
        }
        Ok(Stored {
            record,
            revision: revision(&self.etag, state),
        })
    }
}

/// What Get Blob Properties tells of a lease blob.
enum Peeked {
    /// There is no blob.
    Absent,
    /// The blob's revision: its ETag and lease state.
    At(Revision),
    /// The answer had no ETag (the service always sends one): nothing to compare.
    NoEtag,
}

/// The precondition of an upload.
#[derive(Clone, Copy)]
enum Cond<'a> {
    /// `If-None-Match: *`: create only.
    Absent,
    /// `If-Match: etag`.
    Matches(&'a str),
}

impl AzureLeaseStore {
    pub(crate) fn new(
        container: BlobContainerClient,
        container_name: String,
        prefix: String,
        create_container: bool,
    ) -> Self {
        Self {
            container: Arc::new(container),
            container_name,
            prefix,
            create_container,
        }
    }

    /// The container's name.
    pub fn container_name(&self) -> &str {
        &self.container_name
    }

    /// The name of the blob that holds the lease of `key`: `<prefix><key>`.
    pub fn lease_blob_name(&self, key: &LeaseKey) -> String {
        lease_blob(&self.prefix, key)
    }

    /// The name of the blob that keeps the highest token granted for `key`:
    /// `<prefix>.<key>.token`.
    pub fn token_blob_name(&self, key: &LeaseKey) -> String {
        token_blob(&self.prefix, key)
    }

    /// The name of the blob of a protected object: `<prefix>.<name>.fenced`.
    pub fn object_blob_name(&self, object: &ObjectName) -> String {
        object_blob(&self.prefix, object)
    }

    /// An SDK client for a blob of this container, with this store's credentials and limits:
    /// for operators and tests (inspect, break a lease, delete). The lease protocol never
    /// needs it.
    pub fn blob_client(&self, blob_name: &str) -> BlobClient {
        self.container.blob_client(blob_name)
    }

    /// Checks that the container exists, creating it if the builder opted in.
    ///
    /// # Errors
    /// [`Error::NotFound`] naming the container if it is missing (and creating it was not
    /// asked for); [`Error::Unauthenticated`] or [`Error::PermissionDenied`] for credentials;
    /// [`Error::Timeout`] after the request timeout.
    ///
    /// # Cancel safety
    /// Cancel-safe: at most the container is created, which a later call sees.
    pub(crate) async fn ensure_container(&self) -> Result<(), Error> {
        let check = || async {
            match self.container.get_properties(None).await {
                Ok(_) => Ok(()),
                Err(e) if self.create_container && classify(&e) == Class::ContainerMissing => {
                    match self.container.create(None).await {
                        Ok(_) => {
                            info!(container = %self.container_name, "created the lease container");
                            Ok(())
                        }
                        Err(e) if is_code(&e, "ContainerAlreadyExists") => Ok(()),
                        Err(e) => Err(self.err(e, "creating the container", Effect::Settled)),
                    }
                }
                Err(e) => Err(self.err(e, "checking the container", Effect::Settled)),
            }
        };
        self.bounded_read("checking the container", check).await
    }

    fn err(&self, e: azure_core::Error, what: &str, effect: Effect) -> Error {
        to_error(e, what, &self.container_name, effect)
    }

    /// Runs a read (`attempt` makes one try) through the core's retry loop, within the
    /// request timeout.
    async fn bounded_read<T, F, Fut>(
        &self,
        operation: &'static str,
        mut attempt: F,
    ) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        Call::read(operation).run(|_| attempt()).await
    }

    async fn fetch(&self, blob: &BlobClient) -> Result<Option<Fetched>, azure_core::Error> {
        self.fetch_with(blob, None).await
    }

    /// Downloads a blob; with `lease_id`, only if the blob's lease is active with that id.
    async fn fetch_with(
        &self,
        blob: &BlobClient,
        lease_id: Option<String>,
    ) -> Result<Option<Fetched>, azure_core::Error> {
        let options = BlobClientDownloadOptions {
            lease_id,
            ..BlobClientDownloadOptions::default()
        };
        let response = match blob.download(Some(options)).await {
            Ok(r) => r,
            Err(e) if classify(&e) == Class::BlobMissing => return Ok(None),
            Err(e) => return Err(e),
        };
        let etag = response
            .properties
            .etag
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default();
        let headers = response.headers;
        let body = response.body.collect().await?;
        Ok(Some(Fetched {
            body,
            etag,
            headers,
        }))
    }

    /// What Get Blob Properties (a `HEAD`, no body) tells of the lease blob.
    async fn peek(&self, blob: &BlobClient) -> Result<Peeked, azure_core::Error> {
        let response = match blob.get_properties(None).await {
            Ok(r) => r,
            Err(e) if classify(&e) == Class::BlobMissing => return Ok(Peeked::Absent),
            Err(e) => return Err(e),
        };
        Ok(match response.etag()? {
            Some(etag) => Peeked::At(revision(etag.as_ref(), &lease_state_of(response.headers()))),
            None => Peeked::NoEtag,
        })
    }

    /// One attempt of [`read`](LeaseBackend::read): downloads the lease blob and reports the
    /// record held only while the blob's lease is active, with the revision of that answer.
    async fn read_once(&self, blob: &BlobClient, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        let fetched = self
            .fetch(blob)
            .await
            .map_err(|e| self.err(e, "reading the lease blob", Effect::Settled))?;
        let Some(f) = fetched else {
            return Ok(None);
        };
        // Expired, broken, breaking or released: nobody holds it, whatever it says.
        let lease_state = f.lease_state();
        f.into_stored(key, lease_state == LEASED, &lease_state)
            .map(Some)
    }

    async fn upload(
        &self,
        blob: &BlobClient,
        body: Vec<u8>,
        metadata: HashMap<String, String>,
        cond: Cond<'_>,
        lease_id: Option<&str>,
    ) -> Result<String, azure_core::Error> {
        let content_type = if metadata.contains_key(META_FENCE) {
            "application/octet-stream"
        } else {
            "application/json"
        };
        let mut options = BlockBlobClientUploadOptions {
            metadata: Some(metadata),
            lease_id: lease_id.map(str::to_owned),
            blob_content_type: Some(content_type.to_owned()),
            ..BlockBlobClientUploadOptions::default()
        };
        match cond {
            Cond::Absent => options.if_none_match = Some(Etag::from("*")),
            Cond::Matches(etag) => options.if_match = Some(Etag::from(etag)),
        }
        let content = RequestContent::from(body);
        let result = blob.upload(content, Some(options)).await?;
        Ok(result.etag.map(|e| e.to_string()).unwrap_or_default())
    }

    /// Raises the high-water mark of `key` to at least `proposed` and returns the token to
    /// use: `proposed`, or one above the mark if that is higher.
    async fn raise_high_water(
        &self,
        key: &LeaseKey,
        proposed: FencingToken,
    ) -> Result<FencingToken, Error> {
        let name = self.token_blob_name(key);
        let blob = self.container.blob_client(&name);
        for _ in 0..CAS_ATTEMPTS {
            let current = self
                .fetch(&blob)
                .await
                .map_err(|e| self.err(e, "reading the token high-water mark", Effect::Settled))?;
            let (mark, cond) = match &current {
                None => (0, Cond::Absent),
                Some(f) => (parse_mark(&name, &f.body)?, Cond::Matches(&f.etag)),
            };
            let floor = FencingToken(mark)
                .next()
                .ok_or_else(|| Error::InvalidConfig {
                    message: format!("the fencing token of {key} reached u64::MAX"),
                    source: None,
                })?;
            let token = proposed.max(floor);
            let body = token.0.to_string().into_bytes();
            match self.upload(&blob, body, HashMap::new(), cond, None).await {
                Ok(_) => {
                    if token != proposed {
                        info!(%key, proposed = %proposed, token = %token, "raised the token above the high-water mark (the lease blob was recreated)");
                    }
                    return Ok(token);
                }
                Err(e) if classify(&e) == Class::ConditionFailed => {}
                // The mark is only ever raised, so an unknown outcome is harmless: tokens
                // skip a value at worst. Nothing was written to the lease record.
                Err(e) => {
                    return Err(self.err(e, "raising the token high-water mark", Effect::Settled));
                }
            }
        }
        Err(Error::unavailable(format!(
            "the token high-water mark of {key} kept changing"
        )))
    }

    /// Acquire: create the blob if absent, take its lease with the term as lease id, raise the
    /// token's high-water mark, write the record with the lease.
    ///
    /// A lease this acquire may have taken but not used (its record was not written) is
    /// released, so that no stray lease blocks everyone for a ttl: see [`PendingLease`].
    async fn acquire(
        &self,
        blob: &BlobClient,
        req: &WriteRequest,
        deadline: Instant,
    ) -> Result<WriteOutcome, Error> {
        let lease_id = req.term.to_guid();
        let duration = lease_secs(req.record.ttl)?;
        let base = match &req.expected {
            Expected::Absent => {
                // Create the blob, so that there is something to lease. The placeholder says
                // "released" with a nonce that is not the request's, so that nobody (the core
                // resolving a lost response included) mistakes it for a held term.
                let mut placeholder = req.record.clone();
                placeholder.state = LeaseState::Released;
                placeholder.nonce = WriteNonce(req.record.nonce.0 ^ PLACEHOLDER_NONCE_MASK);
                match self
                    .upload(
                        blob,
                        placeholder.to_json(),
                        record_metadata(&placeholder),
                        Cond::Absent,
                        None,
                    )
                    .await
                {
                    Ok(etag) => etag,
                    Err(e) if classify(&e).is_conflict() => return Ok(conflict()),
                    Err(e) => return Err(self.err(e, "creating the lease blob", Effect::Unknown)),
                }
            }
            Expected::Revision(r) => etag_of(r).to_owned(),
        };
        let mut pending = PendingLease {
            container: self.container.clone(),
            blob_name: self.lease_blob_name(&req.key),
            lease_id,
            etag: base,
            timeout: call_budget(),
            armed: false,
        };
        let Some(leased) = self
            .take_lease(blob, &req.key, duration, deadline, &mut pending)
            .await?
        else {
            return Ok(conflict());
        };
        pending.etag.clone_from(&leased);
        let token = match self.raise_high_water(&req.key, req.record.token).await {
            Ok(t) => t,
            Err(e) => {
                pending.release().await;
                return Err(e);
            }
        };
        let mut record = req.record.clone();
        record.token = token;
        match self
            .put_record(
                blob,
                record,
                &leased,
                &pending.lease_id,
                "writing the acquired lease record",
            )
            .await
        {
            Ok(WriteOutcome::Written(stored)) => {
                pending.armed = false;
                Ok(WriteOutcome::Written(stored))
            }
            // Nothing of ours was written: give the lease back for the next contender.
            Ok(refused) => {
                pending.release().await;
                Ok(refused)
            }
            // The record may have been written. The release is conditional on the ETag the
            // blob had before, so it frees the lease only if the record was not written (and
            // then it can no longer be, as it needs the lease): either the core finds its
            // record with the lease still its own, or nobody is blocked.
            Err(e) => {
                pending.release().await;
                Err(e)
            }
        }
    }

    /// Takes the lease of `blob` for `pending.lease_id`, conditional on `pending.etag`, and
    /// returns the blob's ETag, or `None` if another lease or a change is in the way.
    ///
    /// A call whose answer is lost (or that fails in a way that may hide an applied request)
    /// is asked again with the *same* proposed lease id: the service grants a lease that is
    /// already active with that id again (Azure and Azurite both accept an acquire with the
    /// active lease id as proposed id, restarting its duration), so a retry recovers a lease
    /// that the lost call took. Each call may take a third of the call's time; attempts
    /// go on until `deadline`. If none is answered, `pending` stays armed, and the caller's
    /// dropping it releases the lease id in the background.
    async fn take_lease(
        &self,
        blob: &BlobClient,
        key: &LeaseKey,
        duration: i32,
        deadline: Instant,
        pending: &mut PendingLease,
    ) -> Result<Option<String>, Error> {
        let per_attempt = deadline.saturating_duration_since(Instant::now()) / LEASE_ATTEMPT_SHARE;
        let mut attempts = 0u32;
        let mut last: Option<Error> = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            attempts += 1;
            let options = BlobClientAcquireLeaseOptions {
                proposed_lease_id: Some(pending.lease_id.clone()),
                if_match: Some(Etag::from(pending.etag.as_str())),
                ..BlobClientAcquireLeaseOptions::default()
            };
            // Any request sent may be applied: from now on, the lease may be ours.
            let maybe_ours = pending.armed;
            pending.armed = true;
            // Never past `deadline` (a timer from a later `now` could fall a tick after it).
            let until = (Instant::now() + per_attempt).min(deadline);
            match tokio::time::timeout_at(until, blob.acquire_lease(duration, Some(options))).await
            {
                Ok(Ok(response)) => {
                    if attempts > 1 {
                        info!(%key, attempts, "took the blob lease after asking again with the same lease id");
                    }
                    return Ok(Some(
                        response
                            .etag()
                            .ok()
                            .flatten()
                            .map_or_else(|| pending.etag.clone(), |e| e.to_string()),
                    ));
                }
                Ok(Err(e)) => {
                    let class = classify(&e);
                    if class.is_conflict() || !may_retry(class) {
                        // A stated refusal: this call took nothing. An earlier one whose
                        // answer was lost may have; `pending` then stays armed.
                        pending.armed = maybe_ours;
                        if class.is_conflict() {
                            return Ok(None);
                        }
                        return Err(self.err(e, "acquiring the blob lease", Effect::Settled));
                    }
                    if class == Class::NotSent {
                        pending.armed = maybe_ours;
                    }
                    debug!(%key, attempt = attempts, error = %e, "the lease call failed; asking again with the same lease id");
                    last = Some(self.err(e, "acquiring the blob lease", Effect::Settled));
                }
                Err(_) => {
                    debug!(%key, attempt = attempts, after = ?per_attempt.min(left), "no answer to the lease call; asking again with the same lease id");
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            tokio::time::sleep(LEASE_RETRY_PAUSE.min(left)).await;
        }
        warn!(%key, attempts, "no answer to the lease call within the request timeout; releasing its lease id");
        let message = format!(
            "the lease of {key} could not be taken: no answer to the lease call within {:?} ({attempts} attempts with the same lease id); nothing was written, and the lease id is being released",
            call_budget()
        );
        Err(Error::Unavailable {
            message,
            source: last.map(|e| Box::new(e) as leader_core::BoxError),
        })
    }

    /// Writes `record` with the lease id, on condition of `etag`.
    async fn put_record(
        &self,
        blob: &BlobClient,
        record: LeaseRecord,
        etag: &str,
        lease_id: &str,
        what: &str,
    ) -> Result<WriteOutcome, Error> {
        match self
            .upload(
                blob,
                record.to_json(),
                record_metadata(&record),
                Cond::Matches(etag),
                Some(lease_id),
            )
            .await
        {
            Ok(etag) => Ok(WriteOutcome::Written(Stored {
                record,
                revision: revision(&etag, LEASED),
            })),
            Err(e) if classify(&e).is_conflict() => Ok(conflict()),
            Err(e) => Err(self.err(e, what, Effect::Unknown)),
        }
    }

    async fn renew(&self, blob: &BlobClient, req: &WriteRequest) -> Result<WriteOutcome, Error> {
        let Expected::Revision(expected) = &req.expected else {
            return Ok(conflict());
        };
        let lease_id = req.term.to_guid();
        let base = etag_of(expected);
        let options = BlobClientRenewLeaseOptions {
            if_match: Some(Etag::from(base)),
            ..BlobClientRenewLeaseOptions::default()
        };
        let etag = match blob.renew_lease(lease_id.clone(), Some(options)).await {
            Ok(response) => response
                .etag()
                .ok()
                .flatten()
                .map(|e| e.to_string())
                .unwrap_or_else(|| base.to_owned()),
            Err(e) if classify(&e).is_conflict() => return Ok(conflict()),
            // Renewing the lease does not change the record: nothing was written.
            Err(e) => return Err(self.err(e, "renewing the blob lease", Effect::Settled)),
        };
        self.put_record(
            blob,
            req.record.clone(),
            &etag,
            &lease_id,
            "writing the renewed lease record",
        )
        .await
    }

    async fn release(&self, blob: &BlobClient, req: &WriteRequest) -> Result<WriteOutcome, Error> {
        let Expected::Revision(expected) = &req.expected else {
            return Ok(conflict());
        };
        let lease_id = req.term.to_guid();
        let written = self
            .put_record(
                blob,
                req.record.clone(),
                etag_of(expected),
                &lease_id,
                "writing the released lease record",
            )
            .await?;
        let WriteOutcome::Written(mut stored) = written else {
            return Ok(written);
        };
        let written_etag = etag_of(&stored.revision).to_owned();
        let options = BlobClientReleaseLeaseOptions {
            if_match: Some(Etag::from(written_etag.as_str())),
            ..BlobClientReleaseLeaseOptions::default()
        };
        match blob.release_lease(lease_id, Some(options)).await {
            Ok(response) => {
                let etag = response
                    .etag()
                    .ok()
                    .flatten()
                    .map_or(written_etag, |e| e.to_string());
                stored.revision = revision(&etag, AVAILABLE);
            }
            Err(e) => {
                warn!(key = %req.key, error = %e, "the record says released, but the blob lease could not be released; it expires by itself");
            }
        }
        Ok(WriteOutcome::Written(stored))
    }
}

/// A blob lease that an acquire may hold but has not used: no record was written with it
/// (or it is unknown whether one was). Unless disarmed, it is released: by
/// [`release`](Self::release), or in the background when dropped armed (the acquire failed,
/// or was cancelled at its timeout), so that a lease whose call went unanswered does not block
/// every candidate until it expires.
///
/// The release is conditional on `etag`, the ETag the blob had before the record would have
/// been written: a record written with this lease keeps it (the core may find it and hold
/// the term), and once the lease is released no record can be written with it any more.
/// A lease call that reaches the service after the release can still take the lease; it
/// then expires after one ttl.
struct PendingLease {
    container: Arc<BlobContainerClient>,
    blob_name: String,
    lease_id: String,
    etag: String,
    timeout: Duration,
    armed: bool,
}

impl PendingLease {
    /// Releases the lease now, best-effort and within the request timeout. If this is
    /// cancelled, the release is sent again from [`Drop`].
    async fn release(&mut self) {
        if self.armed {
            release_unused(
                self.container.clone(),
                self.blob_name.clone(),
                self.lease_id.clone(),
                self.etag.clone(),
                self.timeout,
            )
            .await;
            self.armed = false;
        }
    }
}

impl Drop for PendingLease {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let release = release_unused(
            self.container.clone(),
            std::mem::take(&mut self.blob_name),
            std::mem::take(&mut self.lease_id),
            std::mem::take(&mut self.etag),
            self.timeout,
        );
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(release);
            }
            Err(_) => {
                warn!(
                    "an unused blob lease could not be released (no runtime); it expires by itself"
                );
            }
        }
    }
}

async fn release_unused(
    container: Arc<BlobContainerClient>,
    blob_name: String,
    lease_id: String,
    etag: String,
    limit: Duration,
) {
    let blob = container.blob_client(&blob_name);
    let options = BlobClientReleaseLeaseOptions {
        if_match: Some(Etag::from(etag)),
        ..BlobClientReleaseLeaseOptions::default()
    };
    match tokio::time::timeout(limit, blob.release_lease(lease_id, Some(options))).await {
        Ok(Ok(_)) => debug!(blob = %blob_name, "released an unused blob lease"),
        Ok(Err(e)) => {
            debug!(blob = %blob_name, error = %e, "did not release the blob lease (not ours, or the record was written with it)");
        }
        Err(_) => {
            warn!(blob = %blob_name, "releasing an unused blob lease got no answer; it expires by itself");
        }
    }
}

/// Whether a failed lease call may be asked again: it was not a stated refusal.
fn may_retry(class: Class) -> bool {
    matches!(
        class,
        Class::NoAnswer | Class::ServerError | Class::Throttled | Class::Other | Class::NotSent
    )
}

fn conflict() -> WriteOutcome {
    WriteOutcome::Conflict { current: None }
}

fn is_code(e: &azure_core::Error, code: &str) -> bool {
    matches!(
        e.kind(),
        azure_core::error::ErrorKind::HttpResponse { error_code: Some(c), .. } if c == code
    )
}

/// The lease duration for `ttl`: whole seconds from 15 to 60.
fn lease_secs(ttl: Duration) -> Result<i32, Error> {
    check_lease_duration(ttl).map_err(|e| Error::InvalidConfig {
        message: e.to_string(),
        source: None,
    })?;
    i32::try_from(ttl.as_secs()).map_err(|_| Error::InvalidConfig {
        message: format!("lease duration {ttl:?} out of range"),
        source: None,
    })
}

fn check_lease_duration(ttl: Duration) -> Result<(), ConfigError> {
    let secs = ttl.as_secs();
    if ttl.subsec_nanos() != 0 || !(MIN_LEASE_SECS..=MAX_LEASE_SECS).contains(&secs) {
        return Err(ConfigError::Unsupported {
            backend: "Azure Blob",
            reason: format!(
                "a lease lasts {MIN_LEASE_SECS} to {MAX_LEASE_SECS} whole seconds; ttl {ttl:?} is not one of them"
            ),
        });
    }
    Ok(())
}

fn record_metadata(record: &LeaseRecord) -> HashMap<String, String> {
    let state = match record.state {
        LeaseState::Held => "held",
        LeaseState::Released => "released",
    };
    HashMap::from([
        (META_TOKEN.to_owned(), record.token.to_string()),
        (META_HOLDER.to_owned(), record.holder.to_string()),
        (META_STATE.to_owned(), state.to_owned()),
    ])
}

fn parse_mark(name: &str, body: &[u8]) -> Result<u64, Error> {
    std::str::from_utf8(body)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .ok_or_else(|| Error::MalformedRecord {
            key: name.to_owned(),
            detail: format!(
                "the token high-water mark is not a number ({} bytes)",
                body.len()
            ),
        })
}

#[async_trait]
impl LeaseBackend for AzureLeaseStore {
    fn name(&self) -> &'static str {
        "azure"
    }

    fn expiry_model(&self) -> ExpiryModel {
        ExpiryModel::EnforcedByStore
    }

    fn check_timing(&self, timing: &Timing) -> Result<(), ConfigError> {
        check_lease_duration(timing.ttl)
    }

    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        let blob = &self.container.blob_client(&self.lease_blob_name(key));
        let work = move || self.read_once(blob, key);
        self.bounded_read("reading the lease blob", work).await
    }

    /// A waiting follower's poll: Get Blob Properties (a `HEAD`: the ETag, the lease state,
    /// no body), and a download only if the revision it shows is not `known`.
    ///
    /// The revision is the ETag together with the lease state, both from the same answer, so
    /// `Unchanged` means that the record (every write changes the ETag) and the lease (whose
    /// changes may leave the ETag as it is: acquiring, breaking and expiring do on Azurite)
    /// are both as the follower last saw them when the service answered. A lease that
    /// expired or was broken without a write shows its new state, and the record is
    /// downloaded and reported released, as by [`read`](LeaseBackend::read). A blob that is
    /// not there is reported absent without a download.
    ///
    /// When the revision changed, the record comes from a plain Get Blob, with the ETag and
    /// lease state *of that answer* (not of the `HEAD`): body and revision come from one
    /// response, so a write between the two requests only makes the answer newer.
    ///
    /// Why not one conditional Get Blob with `If-None-Match` (304 when unchanged)? A 304
    /// says only that the ETag is the same, and the ETag does not change when a lease expires
    /// or is broken. Azure documents no lease headers on a 304, and Azurite 3.35 sends none
    /// (nor an ETag): the poll would answer `Unchanged` for a lease that is gone, or need a
    /// second request every time.
    ///
    /// Cost per poll: one Get Blob Properties (billed by Azure as an "other" operation on
    /// general-purpose v2 and premium accounts, where Get Blob is a "read"; no data is read,
    /// so no per-GB retrieval charge on cool and colder tiers), plus one Get Blob when the
    /// record changed (a renew writes it, so about once per `renew_every`).
    async fn read_if_changed(
        &self,
        key: &LeaseKey,
        known: Option<&Revision>,
    ) -> Result<IfChanged, Error> {
        let blob = &self.container.blob_client(&self.lease_blob_name(key));
        let work = move || async move {
            let peeked = self
                .peek(blob)
                .await
                .map_err(|e| self.err(e, "reading the lease blob's properties", Effect::Settled))?;
            match peeked {
                Peeked::Absent => return Ok(IfChanged::Changed(None)),
                Peeked::At(now) if known == Some(&now) => return Ok(IfChanged::Unchanged),
                Peeked::At(_) | Peeked::NoEtag => {}
            }
            self.read_once(blob, key).await.map(IfChanged::Changed)
        };
        self.bounded_read("polling the lease blob", work).await
    }

    /// Reads the lease blob with the term's lease id (`x-ms-lease-id`), which the service
    /// answers only while the blob's lease is active with that id: the record and the lease
    /// are checked in one request. If the lease is another's, broken, breaking, expired or
    /// released, the record is read again without the id and reported released.
    async fn read_for_term(&self, key: &LeaseKey, term: TermId) -> Result<Option<Stored>, Error> {
        let blob = &self.container.blob_client(&self.lease_blob_name(key));
        let work = move || async move {
            let what = "re-reading the lease blob with the term's lease id";
            let (fetched, ours) = match self.fetch_with(blob, Some(term.to_guid())).await {
                Ok(f) => (f, true),
                Err(e) if classify(&e) == Class::Lost => {
                    let plain = self
                        .fetch(blob)
                        .await
                        .map_err(|e| self.err(e, what, Effect::Settled))?;
                    (plain, false)
                }
                Err(e) => return Err(self.err(e, what, Effect::Settled)),
            };
            let Some(f) = fetched else {
                return Ok(None);
            };
            // A breaking lease still answers to its id, but it cannot be renewed: not a term.
            let ours = ours && f.lease_state() == LEASED;
            let state = if ours { LEASED } else { NOT_OURS };
            f.into_stored(key, ours, state).map(Some)
        };
        self.bounded_read("re-reading the lease blob", work).await
    }

    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        let blob = self
            .container
            .blob_client(&self.lease_blob_name(&request.key));
        let deadline = call_deadline();
        let budget = call_budget();
        let work = async {
            match request.kind {
                WriteKind::Acquire => self.acquire(&blob, &request, deadline).await,
                WriteKind::Renew => self.renew(&blob, &request).await,
                WriteKind::Release => self.release(&blob, &request).await,
            }
        };
        let outcome = tokio::time::timeout_at(deadline, work)
            .await
            .map_err(|_| {
                Error::indeterminate(format!(
                    "writing the lease of {} did not finish within {:?}",
                    request.key, budget
                ))
            })??;
        if let WriteOutcome::Written(s) = &outcome {
            debug!(key = %request.key, holder = %s.record.holder, token = %s.record.token, kind = ?request.kind, "wrote the lease blob");
        }
        Ok(outcome)
    }
}

#[async_trait]
impl FencedCas for AzureLeaseStore {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        let blob = &self.container.blob_client(&self.object_blob_name(object));
        let work = move || async move {
            let fetched = self
                .fetch(blob)
                .await
                .map_err(|e| self.err(e, "reading the fenced object", Effect::Settled))?;
            let Some(f) = fetched else {
                return Ok(None);
            };
            Ok(Some(FencedObject {
                fence: fence_of(object, &f.headers)?,
                value: f.body.to_vec(),
                revision: Revision::new(f.etag),
            }))
        };
        self.bounded_read("reading the fenced object", work).await
    }

    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        let blob = self
            .container
            .blob_client(&self.object_blob_name(put.object));
        let cond = match put.expected {
            Expected::Absent => Cond::Absent,
            Expected::Revision(etag) => Cond::Matches(etag.as_str()),
        };
        let metadata = HashMap::from([(META_FENCE.to_owned(), put.fence.token.to_string())]);
        Call::write("writing the fenced object")
            .run(|_| {
                let upload = self.upload(&blob, put.value.to_vec(), metadata.clone(), cond, None);
                async move {
                    match upload.await {
                        Ok(etag) => Ok(ObjectWrite::Written(Revision::new(etag))),
                        Err(e) if classify(&e).is_conflict() => Ok(ObjectWrite::Conflict),
                        Err(e) => Err(self.err(e, "writing the fenced object", Effect::Unknown)),
                    }
                }
            })
            .await
    }
}

fn fence_of(object: &ObjectName, headers: &Headers) -> Result<FencingToken, Error> {
    headers
        .get_optional_str(&FENCE_HEADER)
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(FencingToken)
        .ok_or_else(|| Error::MalformedRecord {
            key: object.to_string(),
            detail: format!("the blob has no numeric {META_FENCE} metadata"),
        })
}

/// The blob names of a store with `prefix`. Lease keys and object names never start with `.`,
/// so a lease blob never meets a token or object blob.
fn lease_blob(prefix: &str, key: &LeaseKey) -> String {
    format!("{prefix}{key}")
}

fn token_blob(prefix: &str, key: &LeaseKey) -> String {
    format!("{prefix}.{key}.token")
}

fn object_blob(prefix: &str, object: &ObjectName) -> String {
    format!("{prefix}.{object}.fenced")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_durations_are_whole_seconds_from_15_to_60() {
        for ok in [15, 30, 60] {
            assert!(
                check_lease_duration(Duration::from_secs(ok)).is_ok(),
                "{ok}"
            );
        }
        for bad in [
            Duration::from_secs(14),
            Duration::from_secs(61),
            Duration::from_millis(15_500),
            Duration::ZERO,
        ] {
            let err = check_lease_duration(bad).unwrap_err();
            assert!(err.to_string().contains("15 to 60"), "{err}");
        }
    }

    #[test]
    fn revisions_carry_the_lease_state() {
        let r = revision("\"0x8D1\"", LEASED);
        assert_eq!(r.as_str(), "\"0x8D1\"|leased");
        assert_eq!(etag_of(&r), "\"0x8D1\"");
        assert_ne!(r, revision("\"0x8D1\"", "broken"));
        assert_eq!(etag_of(&Revision::new("plain")), "plain");
    }

    #[test]
    fn high_water_mark_parsing() {
        assert_eq!(parse_mark("token.k", b"42").unwrap(), 42);
        let err = parse_mark("token.k", b"x").unwrap_err();
        assert!(err.to_string().contains("token.k"), "{err}");
    }

    #[test]
    fn blob_names_do_not_collide() {
        let k = LeaseKey::new("a").unwrap();
        let o = ObjectName::new("a").unwrap();
        for prefix in ["", "prod/leases/"] {
            let names = [
                lease_blob(prefix, &k),
                token_blob(prefix, &k),
                object_blob(prefix, &o),
            ];
            assert_eq!(
                names,
                [
                    format!("{prefix}a"),
                    format!("{prefix}.a.token"),
                    format!("{prefix}.a.fenced"),
                ]
            );
        }
    }
}
