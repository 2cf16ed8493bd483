//! The calls to Azure Blob Storage: one blob per lease key, leased by the holder.
//!
//! Blob names in the container (lease keys and object names never contain `/`, so these
//! prefixes cannot collide):
//! - `lease.{key}`: the lease record as JSON ([`LeaseRecord::to_json`]), with the token,
//!   holder and state mirrored in its metadata (`leadertoken`, `leaderholder`, `leaderstate`)
//!   for people looking in the portal.
//!
//! The service, not the record, decides whether a lease is live: `read` reports a record as
//! held only while the blob's lease is active (`x-ms-lease-state: leased`), and the revision
//! is the blob's ETag together with its lease state. So a lease that an operator broke, or
//! that expired, reads as released with a new revision, and the holder's next renew is
//! reported lost although the record itself did not change.
//! - `token.{key}`: the highest token ever granted for the key, so that a term that starts on
//!   a recreated lease blob (an operator deleted it) still gets a higher token.
//! - `fenced.{name}`: a protected object; its fence is in the `leaderfence` metadata.

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
    BlobClientAcquireLeaseOptions, BlobClientAcquireLeaseResultHeaders,
    BlobClientReleaseLeaseOptions, BlobClientReleaseLeaseResultHeaders,
    BlobClientRenewLeaseOptions, BlobClientRenewLeaseResultHeaders, BlockBlobClientUploadOptions,
};
use azure_storage_blob::{BlobClient, BlobContainerClient};
use leader_core::{
    ConfigError, Error, Expected, ExpiryModel, Fence, FencedObject, FencedStore, FencingToken,
    LeaseBackend, LeaseKey, LeaseRecord, LeaseState, ObjectName, Revision, Stored, Timing,
    WriteKind, WriteNonce, WriteOutcome, WriteRequest,
};
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
    request_timeout: Duration,
    create_container: bool,
}

impl fmt::Debug for AzureLeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL is shown without its query, which may hold a SAS token.
        let mut url = self.container.url().clone();
        url.set_query(None);
        f.debug_struct("AzureLeaseStore")
            .field("container", &url.as_str())
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

/// What a blob is, as read.
struct Fetched {
    body: Bytes,
    etag: String,
    headers: Headers,
}

/// The precondition of an upload.
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
        request_timeout: Duration,
        create_container: bool,
    ) -> Self {
        Self {
            container: Arc::new(container),
            container_name,
            request_timeout,
            create_container,
        }
    }

    /// The container's name.
    pub fn container_name(&self) -> &str {
        &self.container_name
    }

    /// The request timeout every call is bounded by.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// The name of the blob that holds the lease of `key`.
    pub fn lease_blob_name(key: &LeaseKey) -> String {
        format!("lease.{key}")
    }

    /// The name of the blob that keeps the highest token granted for `key`.
    pub fn token_blob_name(key: &LeaseKey) -> String {
        format!("token.{key}")
    }

    /// The name of the blob of a protected object.
    pub fn object_blob_name(object: &ObjectName) -> String {
        format!("fenced.{object}")
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
    pub async fn ensure_container(&self) -> Result<(), Error> {
        let check = async {
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

    async fn bounded_read<T>(
        &self,
        operation: &'static str,
        work: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        tokio::time::timeout(self.request_timeout, work)
            .await
            .map_err(|_| Error::Timeout {
                operation,
                after: self.request_timeout,
            })?
    }

    async fn fetch(&self, blob: &BlobClient) -> Result<Option<Fetched>, azure_core::Error> {
        let response = match blob.download(None).await {
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

    async fn release_quietly(&self, blob: &BlobClient, lease_id: &str) {
        if let Err(e) = blob.release_lease(lease_id.to_owned(), None).await {
            debug!(error = %e, "could not release a lease after a failed acquire; it expires by itself");
        }
    }

    /// Raises the high-water mark of `key` to at least `proposed` and returns the token to
    /// use: `proposed`, or one above the mark if that is higher.
    async fn raise_high_water(
        &self,
        key: &LeaseKey,
        proposed: FencingToken,
    ) -> Result<FencingToken, Error> {
        let name = Self::token_blob_name(key);
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

    async fn acquire(&self, blob: &BlobClient, req: &WriteRequest) -> Result<WriteOutcome, Error> {
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
        let options = BlobClientAcquireLeaseOptions {
            proposed_lease_id: Some(lease_id.clone()),
            if_match: Some(Etag::from(base.as_str())),
            ..BlobClientAcquireLeaseOptions::default()
        };
        let leased = match blob.acquire_lease(duration, Some(options)).await {
            Ok(response) => response
                .etag()
                .ok()
                .flatten()
                .map(|e| e.to_string())
                .unwrap_or(base),
            Err(e) if classify(&e).is_conflict() => return Ok(conflict()),
            Err(e) => return Err(self.err(e, "acquiring the blob lease", Effect::Unknown)),
        };
        let token = match self.raise_high_water(&req.key, req.record.token).await {
            Ok(t) => t,
            Err(e) => {
                self.release_quietly(blob, &lease_id).await;
                return Err(e);
            }
        };
        let mut record = req.record.clone();
        record.token = token;
        let outcome = self
            .put_record(
                blob,
                record,
                &leased,
                &lease_id,
                "writing the acquired lease record",
            )
            .await?;
        if let WriteOutcome::Conflict { .. } = outcome {
            // Nothing of ours was written: give the lease back for the next contender.
            self.release_quietly(blob, &lease_id).await;
        }
        Ok(outcome)
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
    fn expiry_model(&self) -> ExpiryModel {
        ExpiryModel::EnforcedByStore
    }

    fn check_timing(&self, timing: &Timing) -> Result<(), ConfigError> {
        check_lease_duration(timing.ttl)?;
        if self.request_timeout > timing.request_timeout {
            return Err(ConfigError::Unsupported {
                backend: "Azure Blob",
                reason: format!(
                    "the store's request timeout {:?} is longer than the elector's {:?}; lower it with with_request_timeout",
                    self.request_timeout, timing.request_timeout
                ),
            });
        }
        Ok(())
    }

    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        let blob = self.container.blob_client(&Self::lease_blob_name(key));
        let work = async {
            let fetched = self
                .fetch(&blob)
                .await
                .map_err(|e| self.err(e, "reading the lease blob", Effect::Settled))?;
            let Some(f) = fetched else {
                return Ok(None);
            };
            let mut record = LeaseRecord::from_json(key.as_str(), &f.body)?;
            let lease_state = f
                .headers
                .get_optional_str(&LEASE_STATE_HEADER)
                .unwrap_or(AVAILABLE)
                .to_ascii_lowercase();
            if lease_state != LEASED {
                // Expired, broken, breaking or released: nobody holds it, whatever it says.
                record.state = LeaseState::Released;
            }
            Ok(Some(Stored {
                record,
                revision: revision(&f.etag, &lease_state),
            }))
        };
        self.bounded_read("reading the lease blob", work).await
    }

    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        let blob = self
            .container
            .blob_client(&Self::lease_blob_name(&request.key));
        let work = async {
            match request.kind {
                WriteKind::Acquire => self.acquire(&blob, &request).await,
                WriteKind::Renew => self.renew(&blob, &request).await,
                WriteKind::Release => self.release(&blob, &request).await,
            }
        };
        let outcome = tokio::time::timeout(self.request_timeout, work)
            .await
            .map_err(|_| {
                Error::indeterminate(format!(
                    "writing the lease of {} did not finish within {:?}",
                    request.key, self.request_timeout
                ))
            })??;
        if let WriteOutcome::Written(s) = &outcome {
            debug!(key = %request.key, holder = %s.record.holder, token = %s.record.token, kind = ?request.kind, "wrote the lease blob");
        }
        Ok(outcome)
    }
}

#[async_trait]
impl FencedStore for AzureLeaseStore {
    async fn fenced_write(
        &self,
        fence: &Fence,
        object: &ObjectName,
        value: &[u8],
    ) -> Result<FencedObject, Error> {
        let blob = self.container.blob_client(&Self::object_blob_name(object));
        let work = async {
            for _ in 0..CAS_ATTEMPTS {
                let current = self
                    .fetch(&blob)
                    .await
                    .map_err(|e| self.err(e, "reading the fenced object", Effect::Settled))?;
                let cond = match &current {
                    None => Cond::Absent,
                    Some(f) => {
                        let highest = fence_of(object, &f.headers)?;
                        if highest > fence.token {
                            return Err(Error::Fenced {
                                object: object.to_string(),
                                presented: fence.token,
                                highest: Some(highest),
                            });
                        }
                        Cond::Matches(&f.etag)
                    }
                };
                let metadata = HashMap::from([(META_FENCE.to_owned(), fence.token.to_string())]);
                match self
                    .upload(&blob, value.to_vec(), metadata, cond, None)
                    .await
                {
                    Ok(etag) => {
                        return Ok(FencedObject {
                            fence: fence.token,
                            value: value.to_vec(),
                            revision: Revision::new(etag),
                        });
                    }
                    // Changed since we read it: read again and re-check the fence.
                    Err(e) if classify(&e).is_conflict() => {}
                    Err(e) => {
                        return Err(self.err(e, "writing the fenced object", Effect::Unknown));
                    }
                }
            }
            Err(Error::unavailable(format!(
                "the fenced object {object} kept changing"
            )))
        };
        tokio::time::timeout(self.request_timeout, work)
            .await
            .map_err(|_| {
                Error::indeterminate(format!(
                    "the fenced write to {object} did not finish within {:?}",
                    self.request_timeout
                ))
            })?
    }

    async fn fenced_read(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        let blob = self.container.blob_client(&Self::object_blob_name(object));
        let work = async {
            let fetched = self
                .fetch(&blob)
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
        let names = [
            AzureLeaseStore::lease_blob_name(&k),
            AzureLeaseStore::token_blob_name(&k),
            AzureLeaseStore::object_blob_name(&o),
        ];
        assert_eq!(names, ["lease.a", "token.a", "fenced.a"]);
    }
}
