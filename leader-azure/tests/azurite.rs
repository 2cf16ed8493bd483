//! The conformance suite and the Azure-specific cases, against Azurite, in real time.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr
)] // test code

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use azure_storage_blob::models::{BlobClientAcquireLeaseOptions, BlobClientBreakLeaseOptions};
use integration_tests::proxy::{FaultProxy, ProxyFaults};
use integration_tests::{Emulator, require, unique_name};
use leader_azure::{AzureLeaseStore, AzureLeaseStoreBuilder};
use leader_core::backend::within;
use leader_core::backend::{
    Expected, ExpiryModel, IfChanged, LeaseRecord, Stored, TermId, WriteKind, WriteNonce,
    WriteOutcome, WriteRequest,
};
use leader_core::conformance::{ConformantStore, Harness, unique_key};
use leader_core::{
    Acquisition, ConfigError, Error, ErrorKind, FencingToken, HolderId, LeaseBackend, LeaseClient,
    LeaseKey, Metadata, Renewal, Timing,
};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(15);

struct Azurite {
    endpoint: String,
    container: String,
}

async fn endpoint() -> String {
    require(Emulator::Azurite)
        .await
        .expect("Azurite is needed (LEADER_ALLOW_SKIP is not supported by these tests)")
        .url
}

async fn azurite() -> Azurite {
    Azurite {
        endpoint: endpoint().await,
        container: unique_name("lease-az"),
    }
}

impl Azurite {
    fn builder(&self) -> AzureLeaseStoreBuilder {
        AzureLeaseStoreBuilder::new()
            .with_emulator(&self.endpoint)
            .with_container(&self.container)
            .with_create_container_if_missing(true)
    }

    async fn azure(&self) -> AzureLeaseStore {
        self.builder().build().await.unwrap()
    }
}

#[async_trait]
impl Harness for Azurite {
    async fn store(&self) -> Result<Arc<dyn ConformantStore>, Error> {
        // A new store per call: separate clients, shared only through Azurite.
        Ok(Arc::new(self.azure().await))
    }

    fn unique_key(&self) -> LeaseKey {
        unique_key("case").unwrap()
    }

    fn timing(&self) -> Timing {
        Timing::from_ttl(TTL)
    }

    async fn plant_malformed(&self, key: &LeaseKey) -> Result<(), Error> {
        let store = self.azure().await;
        let blob = store.blob_client(&store.lease_blob_name(key));
        blob.upload(
            azure_core::Bytes::from_static(b"\x00\x01 not json").into(),
            None,
        )
        .await
        .unwrap();
        Ok(())
    }

    async fn delete_record(&self, key: &LeaseKey) -> Result<(), Error> {
        // As an operator must: break the lease, then delete the blob.
        let store = self.azure().await;
        let options = BlobClientBreakLeaseOptions {
            break_period: Some(0),
            ..Default::default()
        };
        // Fails harmlessly (409) when no lease is held.
        let _ = store
            .blob_client(&store.lease_blob_name(key))
            .break_lease(Some(options))
            .await;
        store
            .blob_client(&store.lease_blob_name(key))
            .delete(None)
            .await
            .unwrap();
        Ok(())
    }
}

leader_core::conformance_tests!(azurite().await);

fn client(store: &AzureLeaseStore, key: &LeaseKey, who: &str) -> LeaseClient {
    LeaseClient::new(
        Arc::new(store.clone()),
        key.clone(),
        HolderId::new(who).unwrap(),
        Timing::from_ttl(TTL),
    )
    .unwrap()
}

async fn acquired(c: &mut LeaseClient) -> FencingToken {
    match c.try_acquire().await.unwrap() {
        Acquisition::Acquired(g) => g.token,
        other => panic!("{} should have acquired: {other:?}", c.holder()),
    }
}

async fn break_lease(store: &AzureLeaseStore, key: &LeaseKey) {
    let blob = store.blob_client(&store.lease_blob_name(key));
    let options = BlobClientBreakLeaseOptions {
        break_period: Some(0),
        ..Default::default()
    };
    blob.break_lease(Some(options)).await.unwrap();
}

fn raw_record(holder: &str, token: u64, nonce: u64) -> LeaseRecord {
    LeaseRecord::held(
        HolderId::new(holder).unwrap(),
        FencingToken(token),
        TTL,
        Metadata::new(),
        WriteNonce(nonce),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_lease_ends_the_term_and_the_next_token_is_higher() {
    let h = azurite().await;
    let store = h.azure().await;
    let key = h.unique_key();
    let mut a = client(&store, &key, "a");
    let mut b = client(&store, &key, "b");
    let t1 = acquired(&mut a).await;
    assert!(matches!(
        b.try_acquire().await.unwrap(),
        Acquisition::Following {
            leader: Some(_),
            ..
        }
    ));
    break_lease(&store, &key).await;
    match a.renew().await.unwrap() {
        Renewal::Lost { .. } => {}
        other => panic!("a renew after an operator broke the lease must be lost: {other:?}"),
    }
    let t2 = acquired(&mut b).await;
    assert!(t2 > t1, "{t2} must be above {t1}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_blob_is_recreated_with_a_higher_token() {
    let h = azurite().await;
    let store = h.azure().await;
    let key = h.unique_key();
    let mut a = client(&store, &key, "a");
    let t1 = acquired(&mut a).await;
    assert!(matches!(a.renew().await.unwrap(), Renewal::Renewed(_)));
    // An operator removes the lease blob (breaking the lease first, as Azure requires).
    break_lease(&store, &key).await;
    store
        .blob_client(&store.lease_blob_name(&key))
        .delete(None)
        .await
        .unwrap();
    assert!(store.read(&key).await.unwrap().is_none());
    match a.renew().await.unwrap() {
        Renewal::Lost { .. } => {}
        other => panic!("renew of a deleted blob must be lost: {other:?}"),
    }
    // A fresh process knows nothing of the old token; the store still raises it.
    let mut c = client(&store, &key, "c");
    let t2 = acquired(&mut c).await;
    assert!(t2 > t1, "token after recreation {t2} must be above {t1}");
    let stored = store.read(&key).await.unwrap().unwrap();
    assert_eq!(stored.record.token, t2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_renewed_after_another_acquired_is_lost() {
    let h = azurite().await;
    let store = h.azure().await;
    let key = h.unique_key();
    let old = TermId(0xa11ce);
    let first = match store
        .write(WriteRequest::new(
            key.clone(),
            Expected::Absent,
            raw_record("old", 1, 1),
            WriteKind::Acquire,
            old,
        ))
        .await
        .unwrap()
    {
        WriteOutcome::Written(s) => s,
        other => panic!("create failed: {other:?}"),
    };
    let started = Instant::now();
    // Another instance polls until the service lets the lease expire.
    let mut attempts = 0;
    let second = loop {
        attempts += 1;
        let outcome = store
            .write(WriteRequest::new(
                key.clone(),
                Expected::Revision(first.revision.clone()),
                raw_record("new", 2, 2),
                WriteKind::Acquire,
                TermId(0xb0b),
            ))
            .await
            .unwrap();
        match outcome {
            WriteOutcome::Written(s) => break s,
            WriteOutcome::Conflict { .. } => {
                assert!(started.elapsed() < TTL * 2, "no takeover within 2 x ttl");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    };
    let waited = started.elapsed();
    eprintln!("MEASURED: takeover after {waited:?} ({attempts} acquire attempts), ttl {TTL:?}");
    assert!(waited >= TTL - Duration::from_millis(500), "{waited:?}");
    // The old holder renews with its lease id, even with the current revision: lost.
    let stale = store
        .write(WriteRequest::new(
            key.clone(),
            Expected::Revision(second.revision.clone()),
            raw_record("old", 1, 3),
            WriteKind::Renew,
            old,
        ))
        .await
        .unwrap();
    assert!(matches!(stale, WriteOutcome::Conflict { .. }), "{stale:?}");
    assert_eq!(store.read(&key).await.unwrap(), Some(second));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_key_is_a_clear_authentication_error() {
    let h = azurite().await;
    h.azure().await; // the container exists
    let wrong = AzureLeaseStoreBuilder::new()
        .with_emulator(&h.endpoint)
        .with_container(&h.container)
        .with_access_key("d3Jvbmcga2V5IGZvciB0aGUgZW11bGF0b3I=");
    assert!(
        !format!("{wrong:?}").contains("d3Jvbmc"),
        "the key must not be shown"
    );
    // The container check of build() meets the refusal, ...
    let err = wrong.clone().build().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unauthenticated, "{err}");
    assert!(err.to_string().contains("credentials"), "{err}");
    // ... and so does every call of a store built without it.
    let store = wrong.build_unchecked().unwrap();
    let err = store.read(&h.unique_key()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unauthenticated, "{err}");
    assert!(
        !format!("{store:?}").contains("d3Jvbmc"),
        "the key must not be shown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_container_is_named_and_created_only_on_request() {
    let endpoint = endpoint().await;
    let container = unique_name("missing");
    let plain = AzureLeaseStoreBuilder::new()
        .with_emulator(&endpoint)
        .with_container(&container);
    let err = plain.clone().build().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains(&container), "{err}");
    let store = plain.build_unchecked().unwrap();
    let err = store.read(&LeaseKey::new("k").unwrap()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    for _ in 0..2 {
        AzureLeaseStoreBuilder::new()
            .with_emulator(&endpoint)
            .with_container(&container)
            .with_create_container_if_missing(true)
            .build()
            .await
            .unwrap();
    }
    assert!(
        store
            .read(&LeaseKey::new("k").unwrap())
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn timing_the_service_cannot_honour_is_rejected() {
    let store = AzureLeaseStoreBuilder::new()
        .with_emulator("http://127.0.0.1:1/devstoreaccount1")
        .with_container("leases")
        .build_unchecked()
        .unwrap();
    let key = LeaseKey::new("k").unwrap();
    for ttl in [Duration::from_secs(10), Duration::from_secs(90)] {
        let err = LeaseClient::new(
            Arc::new(store.clone()),
            key.clone(),
            HolderId::new("a").unwrap(),
            Timing::from_ttl(ttl),
        )
        .unwrap_err();
        assert!(matches!(err, ConfigError::Unsupported { .. }), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_without_an_answer_is_indeterminate_within_the_request_timeout() {
    // The fault proxy in front of Azurite holds every request without an answer.
    let h = azurite().await;
    let proxy = FaultProxy::in_front_of(&h.endpoint, 4).await.unwrap();
    proxy.set(ProxyFaults {
        blackhole: true,
        ..ProxyFaults::default()
    });
    let limit = Duration::from_millis(400);
    let store = AzureLeaseStoreBuilder::new()
        .with_emulator(proxy.url_for(&h.endpoint))
        .with_container("leases")
        .build_unchecked()
        .unwrap();
    let key = LeaseKey::new("k").unwrap();
    let started = Instant::now();
    // The elector runs each call within its request timeout; the store ends it by then
    // with its own answer.
    let write = store.write(WriteRequest::new(
        key.clone(),
        Expected::Absent,
        raw_record("a", 1, 1),
        WriteKind::Acquire,
        TermId(1),
    ));
    let err = within(limit, write)
        .await
        .expect("ended by the deadline")
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Indeterminate, "{err}");
    let err = within(limit, store.read(&key))
        .await
        .expect("ended by the deadline")
        .unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(
        started.elapsed() < limit * 3,
        "two calls took {:?}",
        started.elapsed()
    );
    assert!(proxy.counts().blackholed.load(Ordering::Relaxed) >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_objects_keep_the_highest_token_even_for_empty_values() {
    use leader_core::{Fence, FencedStore, ObjectName};
    let h = azurite().await;
    let store = h.azure().await;
    let key = h.unique_key();
    let object = ObjectName::new(format!("{key}-obj")).unwrap();
    let fence = |token| {
        Fence::new(
            key.clone(),
            HolderId::new("w").unwrap(),
            FencingToken(token),
        )
    };
    assert!(store.fenced_read(&object).await.unwrap().is_none());
    let first = store.fenced_write(&fence(3), &object, b"").await.unwrap();
    assert_eq!(first.fence, FencingToken(3));
    let read = store.fenced_read(&object).await.unwrap().unwrap();
    assert_eq!(
        (read.fence, read.value.as_slice()),
        (FencingToken(3), &b""[..])
    );
    // The same token may write again; a lower one may not.
    store
        .fenced_write(&fence(3), &object, b"again")
        .await
        .unwrap();
    match store.fenced_write(&fence(2), &object, b"stale").await {
        Err(Error::Fenced {
            presented, highest, ..
        }) => {
            assert_eq!(presented, FencingToken(2));
            assert_eq!(highest, Some(FencingToken(3)));
        }
        other => panic!("a lower token must be fenced off: {other:?}"),
    }
    let read = store.fenced_read(&object).await.unwrap().unwrap();
    assert_eq!(read.value, b"again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_env_reaches_the_emulator_and_measures_round_trips() {
    if std::env::var("AZURE_STORAGE_CONNECTION_STRING").is_err() {
        eprintln!("SKIPPED: AZURE_STORAGE_CONNECTION_STRING is not set");
        return;
    }
    let h = azurite().await;
    h.azure().await; // the container exists
    let store = AzureLeaseStoreBuilder::from_env()
        .unwrap()
        .with_container(&h.container)
        .build()
        .await
        .unwrap();
    let key = h.unique_key();
    assert!(store.read(&key).await.unwrap().is_none());
    let mut a = client(&store, &key, "a");
    let started = Instant::now();
    acquired(&mut a).await;
    let acquire = started.elapsed();
    let started = Instant::now();
    assert!(matches!(a.renew().await.unwrap(), Renewal::Renewed(_)));
    let renew = started.elapsed();
    let started = Instant::now();
    assert!(a.release().await.unwrap());
    let release = started.elapsed();
    eprintln!(
        "MEASURED: against Azurite, acquire of a new key {acquire:?}, renew {renew:?}, release {release:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Lost answers: a write applied by Azurite whose answer never reaches the writer.

/// What happens on Azurite between a write that Azurite applied and the writer's re-read.
#[derive(Clone, Copy, Debug)]
enum Meanwhile {
    /// Nothing: the lease is still the writer's.
    Nothing,
    /// An operator breaks the lease.
    Break,
    /// An operator breaks the lease and another candidate takes the blob's lease with this id
    /// (it has not written its record yet).
    BreakAndSeize(TermId),
}

/// The real store, except that the answer of the next write is lost after Azurite applied
/// it, and `Meanwhile` happens on Azurite before the writer hears of it. Everything else is
/// forwarded to the store.
#[derive(Debug)]
struct LosesAnswer {
    store: AzureLeaseStore,
    next: std::sync::Mutex<Option<Meanwhile>>,
}

impl LosesAnswer {
    fn new(store: &AzureLeaseStore) -> Arc<Self> {
        Arc::new(Self {
            store: store.clone(),
            next: std::sync::Mutex::new(None),
        })
    }

    fn lose_next_answer(&self, meanwhile: Meanwhile) {
        *self.next.lock().unwrap() = Some(meanwhile);
    }
}

#[async_trait]
impl LeaseBackend for LosesAnswer {
    fn expiry_model(&self) -> ExpiryModel {
        self.store.expiry_model()
    }
    fn check_timing(&self, timing: &Timing) -> Result<(), ConfigError> {
        self.store.check_timing(timing)
    }
    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        self.store.read(key).await
    }
    async fn read_for_term(&self, key: &LeaseKey, term: TermId) -> Result<Option<Stored>, Error> {
        self.store.read_for_term(key, term).await
    }
    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        let key = request.key.clone();
        let outcome = self.store.write(request).await?;
        let Some(meanwhile) = self.next.lock().unwrap().take() else {
            return Ok(outcome);
        };
        assert!(
            matches!(outcome, WriteOutcome::Written(_)),
            "the write to lose must be applied: {outcome:?}"
        );
        match meanwhile {
            Meanwhile::Nothing => {}
            Meanwhile::Break => break_lease(&self.store, &key).await,
            Meanwhile::BreakAndSeize(other) => {
                break_lease(&self.store, &key).await;
                seize_lease(&self.store, &key, other).await;
            }
        }
        Err(Error::indeterminate(
            "test: Azurite applied the write; the answer was lost",
        ))
    }
}

async fn seize_lease(store: &AzureLeaseStore, key: &LeaseKey, term: TermId) {
    let blob = store.blob_client(&store.lease_blob_name(key));
    let options = BlobClientAcquireLeaseOptions {
        proposed_lease_id: Some(term.to_guid()),
        ..Default::default()
    };
    blob.acquire_lease(15, Some(options)).await.unwrap();
}

fn client_of(store: Arc<dyn LeaseBackend>, key: &LeaseKey, who: &str) -> LeaseClient {
    LeaseClient::new(
        store,
        key.clone(),
        HolderId::new(who).unwrap(),
        Timing::from_ttl(TTL),
    )
    .unwrap()
}

/// Asserts that `c` does not hold a term, whatever `try_acquire` answered.
async fn no_term(c: &mut LeaseClient, why: &str) {
    match c.try_acquire().await {
        Ok(Acquisition::Following { .. }) | Err(_) => {}
        Ok(Acquisition::Acquired(g)) => panic!("{why}: reported a term {g:?}"),
    }
    assert!(c.grant().is_none(), "{why}: holds a grant");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_acquire_answer_with_the_lease_still_ours_is_a_term() {
    // The positive control of the next tests: nothing happens between write and re-read.
    let h = azurite().await;
    let store = h.azure().await;
    let key = h.unique_key();
    let lossy = LosesAnswer::new(&store);
    let mut a = client_of(lossy.clone(), &key, "a");
    lossy.lose_next_answer(Meanwhile::Nothing);
    assert_eq!(acquired(&mut a).await, FencingToken(1));
    let mut b = client(&store, &key, "b");
    no_term(&mut b, "b while a holds the lease").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_acquire_then_an_operator_break_is_no_term() {
    let h = azurite().await;
    let store = h.azure().await;
    let key = h.unique_key();
    let lossy = LosesAnswer::new(&store);
    let mut a = client_of(lossy.clone(), &key, "a");
    lossy.lose_next_answer(Meanwhile::Break);
    no_term(&mut a, "a after an operator broke its lease").await;
    // The lease is free: another candidate takes it at once, with a higher token.
    let mut b = client(&store, &key, "b");
    assert_eq!(acquired(&mut b).await, FencingToken(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_acquire_then_another_candidates_lease_is_no_term() {
    // The blob still holds a's record (its nonce) and is leased, but by another term.
    let h = azurite().await;
    let store = h.azure().await;
    let key = h.unique_key();
    let lossy = LosesAnswer::new(&store);
    let mut a = client_of(lossy.clone(), &key, "a");
    lossy.lose_next_answer(Meanwhile::BreakAndSeize(TermId(0xb0b)));
    no_term(&mut a, "a while another term holds the blob's lease").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_renew_then_another_candidates_lease_ends_the_term() {
    let h = azurite().await;
    let store = h.azure().await;
    let key = h.unique_key();
    let lossy = LosesAnswer::new(&store);
    let mut a = client_of(lossy.clone(), &key, "a");
    acquired(&mut a).await;
    lossy.lose_next_answer(Meanwhile::BreakAndSeize(TermId(0xb0b)));
    if let Ok(Renewal::Renewed(g)) = a.renew().await {
        panic!("a renewed although its lease is another's: {g:?}");
    }
    assert!(a.grant().is_none(), "a still holds a grant");
}

// ---------------------------------------------------------------------------------------------
// A lease call whose answer is lost, through the fault proxy: Azurite applies it, the proxy
// drops the response.

async fn through_proxy(h: &Azurite, seed: u64) -> (FaultProxy, AzureLeaseStore) {
    let proxy = FaultProxy::in_front_of(&h.endpoint, seed).await.unwrap();
    let store = AzureLeaseStoreBuilder::new()
        .with_emulator(proxy.url_for(&h.endpoint))
        .with_container(&h.container)
        // No container check: the proxy counts only the test's own requests.
        .build_unchecked()
        .unwrap();
    (proxy, store)
}

/// a's acquire of `key` (term 0xa, token 2) over the released record at `revision`.
fn acquire_as_a(key: &LeaseKey, revision: leader_core::backend::Revision) -> WriteRequest {
    WriteRequest::new(
        key.clone(),
        Expected::Revision(revision),
        raw_record("a", 2, 7),
        WriteKind::Acquire,
        TermId(0xa),
    )
}

/// A key whose blob exists with a released record, so that an acquire starts with the lease
/// call; returns its revision.
async fn released_blob(store: &AzureLeaseStore, key: &LeaseKey) -> leader_core::backend::Revision {
    let mut c = client(store, key, "setup");
    acquired(&mut c).await;
    assert!(c.release().await.unwrap());
    store.read(key).await.unwrap().unwrap().revision
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_call_whose_answer_is_lost_is_asked_again_with_the_same_lease_id() {
    let h = azurite().await;
    let direct = h.azure().await;
    let key = h.unique_key();
    let revision = released_blob(&direct, &key).await;
    let (proxy, store) = through_proxy(&h, 1).await;
    // The acquire's first request is the lease call: Azurite grants it, the answer is lost.
    proxy.lose_responses(0, 1);
    let outcome = store.write(acquire_as_a(&key, revision)).await.unwrap();
    assert_eq!(proxy.counts().lost.load(Ordering::Relaxed), 1);
    let WriteOutcome::Written(written) = outcome else {
        panic!("the acquire must recover the lease its lost call took: {outcome:?}")
    };
    // A proper term: the record is a's, held, and the blob's lease is a's.
    let seen = direct
        .read_for_term(&key, TermId(0xa))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen, written);
    assert!(seen.record.is_held());
    let mut b = client(&direct, &key, "b");
    no_term(&mut b, "b while a holds the lease").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_written_whose_answer_is_lost_keeps_its_lease() {
    // The lease call and the high-water mark's read and write are answered; the record is
    // written, its answer lost. The store must not give back the lease of a written record:
    // the core's re-read finds it as a held term.
    let h = azurite().await;
    let direct = h.azure().await;
    let key = h.unique_key();
    let revision = released_blob(&direct, &key).await;
    let (proxy, store) = through_proxy(&h, 3).await;
    proxy.lose_responses(3, 1);
    let err = store.write(acquire_as_a(&key, revision)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Indeterminate, "{err}");
    assert_eq!(proxy.counts().lost.load(Ordering::Relaxed), 1);
    let seen = direct
        .read_for_term(&key, TermId(0xa))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen.record.nonce, WriteNonce(7));
    assert!(
        seen.record.is_held(),
        "the written record lost its lease: {seen:?}"
    );
    let mut b = client(&direct, &key, "b");
    no_term(&mut b, "b while a's written record holds the lease").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_call_that_never_gets_an_answer_leaves_no_lease_behind() {
    let h = azurite().await;
    let direct = h.azure().await;
    let key = h.unique_key();
    let revision = released_blob(&direct, &key).await;
    let (proxy, store) = through_proxy(&h, 2).await;
    // Every answer is lost, the release's too: Azurite applies them all.
    proxy.set(ProxyFaults {
        lose_response_fraction: 1.0,
        ..ProxyFaults::default()
    });
    let err = store.write(acquire_as_a(&key, revision)).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    let lease_calls = proxy.counts().lost.load(Ordering::Relaxed);
    assert!(
        lease_calls >= 2,
        "the lease call was asked again: {lease_calls} lost answers"
    );
    // Another candidate is not blocked until the lease of the lost calls expires (one ttl).
    let started = Instant::now();
    let mut b = client(&direct, &key, "b");
    loop {
        if let Acquisition::Acquired(g) = b.try_acquire().await.unwrap() {
            eprintln!(
                "MEASURED: b acquired {:?} after the failed acquire, token {}",
                started.elapsed(),
                g.token
            );
            break;
        }
        assert!(
            started.elapsed() < TTL / 3,
            "b is still blocked {:?} after the failed acquire: a stray lease",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(proxy);
}

// ---------------------------------------------------------------------------------------------
// A waiting follower's poll (read_if_changed): Get Blob Properties, and a download only when
// the revision (ETag and lease state) changed. Requests are counted by the fault proxy.

/// The requests the proxy forwarded since the last reset, by method (`GET`, `HEAD`, `PUT`).
fn by_method(proxy: &FaultProxy) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    for (label, n) in proxy.requests() {
        let method = label.split(' ').next().unwrap_or_default().to_owned();
        *out.entry(method).or_default() += n;
    }
    out
}

fn counts(pairs: &[(&str, u64)]) -> std::collections::BTreeMap<String, u64> {
    pairs.iter().map(|(m, n)| ((*m).to_owned(), *n)).collect()
}

/// The ETag part of a lease blob's revision (`ETAG|lease-state`).
fn etag(s: &Stored) -> &str {
    s.revision.as_str().rsplit_once('|').unwrap().0
}

/// `b`, following through the proxy, polls a held lease it has seen: what the poll answers.
async fn poll(store: &AzureLeaseStore, key: &LeaseKey, known: &Stored) -> IfChanged {
    store
        .read_if_changed(key, Some(&known.revision))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followers_poll_of_an_unchanged_held_lease_downloads_nothing() {
    let h = azurite().await;
    let direct = h.azure().await;
    let key = h.unique_key();
    let mut a = client(&direct, &key, "a");
    acquired(&mut a).await;
    let (proxy, store) = through_proxy(&h, 5).await;
    // The follower's first look knows no revision: properties, then the record.
    let mut b = client(&store, &key, "b");
    match b.try_acquire().await.unwrap() {
        Acquisition::Following {
            leader: Some(l), ..
        } => assert_eq!(l.holder.as_str(), "a"),
        other => panic!("b must follow a: {other:?}"),
    }
    assert_eq!(by_method(&proxy), counts(&[("GET", 1), ("HEAD", 1)]));
    // Then, while a's record and lease stay as they are, one HEAD per poll and nothing else:
    // no download, and no acquire attempt while the lease is held.
    proxy.reset_requests();
    const POLLS: u64 = 5;
    for _ in 0..POLLS {
        match b.try_acquire().await.unwrap() {
            Acquisition::Following {
                leader: Some(l), ..
            } => assert_eq!(l.holder.as_str(), "a"),
            other => panic!("b must still follow a: {other:?}"),
        }
    }
    assert_eq!(by_method(&proxy), counts(&[("HEAD", POLLS)]));
    // A renew writes the record (a new ETag): the next poll downloads it, once.
    let seen = direct.read(&key).await.unwrap().unwrap();
    assert!(matches!(a.renew().await.unwrap(), Renewal::Renewed(_)));
    proxy.reset_requests();
    let IfChanged::Changed(Some(renewed)) = poll(&store, &key, &seen).await else {
        panic!("a renew must read as changed")
    };
    assert_ne!(renewed.revision, seen.revision);
    assert!(renewed.record.is_held());
    assert_eq!(renewed, direct.read(&key).await.unwrap().unwrap());
    assert_eq!(poll(&store, &key, &renewed).await, IfChanged::Unchanged);
    assert_eq!(by_method(&proxy), counts(&[("GET", 1), ("HEAD", 2)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_lease_polls_as_changed_and_released_without_a_write() {
    let h = azurite().await;
    let direct = h.azure().await;
    let key = h.unique_key();
    let mut a = client(&direct, &key, "a");
    acquired(&mut a).await;
    let (proxy, store) = through_proxy(&h, 6).await;
    let held = direct.read(&key).await.unwrap().unwrap();
    assert_eq!(poll(&store, &key, &held).await, IfChanged::Unchanged);
    // An operator breaks the lease: the blob's ETag stays, its lease state changes.
    break_lease(&direct, &key).await;
    proxy.reset_requests();
    let IfChanged::Changed(Some(now)) = poll(&store, &key, &held).await else {
        panic!("a broken lease must poll as changed")
    };
    assert!(
        !now.record.is_held(),
        "a broken lease reads as held: {now:?}"
    );
    assert_ne!(now.revision, held.revision);
    assert_eq!(now.record.holder, held.record.holder);
    // The ETag did not change: only the lease state tells the poll that the lease is gone.
    assert_eq!(etag(&now), etag(&held));
    assert_eq!(now, direct.read(&key).await.unwrap().unwrap());
    assert_eq!(by_method(&proxy), counts(&[("GET", 1), ("HEAD", 1)]));
    // The follower sees the lease free and takes it.
    let mut b = client(&store, &key, "b");
    acquired(&mut b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_polls_as_changed_and_released_without_a_write() {
    let h = azurite().await;
    let store = h.azure().await;
    let key = h.unique_key();
    let mut a = client(&store, &key, "a");
    acquired(&mut a).await;
    let held = store.read(&key).await.unwrap().unwrap();
    let started = Instant::now();
    // Nobody writes; the service lets the lease run out after its 15 s.
    let now = loop {
        match poll(&store, &key, &held).await {
            IfChanged::Unchanged => {
                assert!(
                    started.elapsed() < TTL + Duration::from_secs(5),
                    "no expiry"
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            IfChanged::Changed(Some(now)) => break now,
            IfChanged::Changed(None) => panic!("the blob vanished"),
        }
    };
    let waited = started.elapsed();
    eprintln!("MEASURED: the poll saw the lease expire after {waited:?}, ttl {TTL:?}");
    assert!(waited >= TTL - Duration::from_millis(500), "{waited:?}");
    assert!(
        !now.record.is_held(),
        "an expired lease reads as held: {now:?}"
    );
    assert_ne!(now.revision, held.revision);
    assert_eq!(etag(&now), etag(&held), "only the lease state changed");
    assert_eq!(now, store.read(&key).await.unwrap().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_of_a_missing_blob_or_container_downloads_nothing() {
    let h = azurite().await;
    let direct = h.azure().await;
    let key = h.unique_key();
    let (proxy, store) = through_proxy(&h, 7).await;
    let made_up = leader_core::backend::Revision::new("\"0x1\"|leased");
    assert_eq!(
        store.read_if_changed(&key, Some(&made_up)).await.unwrap(),
        IfChanged::Changed(None)
    );
    assert_eq!(
        store.read_if_changed(&key, None).await.unwrap(),
        IfChanged::Changed(None)
    );
    assert_eq!(by_method(&proxy), counts(&[("HEAD", 2)]));
    drop(direct);
    // A missing container is named, as by read.
    let gone = AzureLeaseStoreBuilder::new()
        .with_emulator(proxy.url_for(&h.endpoint))
        .with_container(unique_name("no-such"))
        .build_unchecked()
        .unwrap();
    let err = gone.read_if_changed(&key, None).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains("no-such"), "{err}");
}
