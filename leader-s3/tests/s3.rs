//! The S3 cases, each against both emulators (moto behind the serialising launcher, and
//! LocalStack's S3): what the emulators do (fidelity canaries), and what the store does with
//! S3's answers, including those no emulator gives (409, lost answers, throttling, a bucket in
//! another region), which come from the suite's fault proxy.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr
)]

mod support;

use std::sync::Arc;

use aws_sdk_s3::primitives::ByteStream;
use integration_tests::proxy::{Canned, Fault, Match, Rule};
use leader_core::backend::{
    Expected, LeaseRecord, TermId, WriteKind, WriteNonce, WriteOutcome, WriteRequest, within,
};
use leader_core::{
    Acquisition, ErrorKind, FencingToken, HolderId, LeaseBackend, LeaseClient, LeaseKey, Metadata,
};
use leader_s3::{S3Builder, S3Store};
use support::{Emu, new_bucket, proxy, raw_client, raw_delete, raw_get, raw_put, store_at, timing};

fn record(holder: &str, token: u64, nonce: u64) -> LeaseRecord {
    LeaseRecord::held(
        HolderId::new(holder).unwrap(),
        FencingToken(token),
        timing().ttl,
        Metadata::new(),
        WriteNonce(nonce),
    )
}

fn write(key: &LeaseKey, expected: Expected, record: LeaseRecord, kind: WriteKind) -> WriteRequest {
    WriteRequest::new(key.clone(), expected, record, kind, TermId(1))
}

/// Writes holder a's record with `nonce` to `key` on `expected` (a plain write, no token
/// mark), within `budget` as the core would.
async fn put_record(
    store: &S3Store,
    key: &LeaseKey,
    expected: Expected,
    nonce: u64,
    budget: std::time::Duration,
) -> Result<WriteOutcome, leader_core::Error> {
    let request = write(key, expected, record("a", 1, nonce), WriteKind::Renew);
    within(budget, store.write(request))
        .await
        .expect("the store ends its call by the deadline")
}

fn client(store: &Arc<dyn LeaseBackend>, key: &LeaseKey, who: &str) -> LeaseClient {
    LeaseClient::new(
        store.clone(),
        key.clone(),
        HolderId::new(who).unwrap(),
        timing(),
    )
    .unwrap()
}

async fn acquire(c: &mut LeaseClient) -> leader_core::Grant {
    match c.try_acquire().await.unwrap() {
        Acquisition::Acquired(g) => g,
        other => panic!("expected to acquire, got {other:?}"),
    }
}

/// The status of a raw conditional put: 200, 412, 404, 501...
async fn put_status(url: &str, bucket: &str, key: &str, if_match: Option<&str>, none: bool) -> u16 {
    let mut put = raw_client(url)
        .put_object()
        .bucket(bucket)
        .key(key)
        .body(ByteStream::from(format!("{if_match:?}{none}").into_bytes()));
    if let Some(etag) = if_match {
        put = put.if_match(etag);
    }
    if none {
        put = put.if_none_match("*");
    }
    match put.send().await {
        Ok(_) => 200,
        Err(e) => e.raw_response().map_or(0, |r| r.status().as_u16()),
    }
}

/// What each emulator really does with the conditions the store relies on (a stale `If-Match`
/// is refused, one of 8 racing `If-None-Match: *` creates wins, 100 rounds), and the known
/// gaps, so that a change of either is noticed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fidelity_canary_of_each_emulator() {
    for emu in Emu::BOTH {
        let Some(url) = emu.url().await else { continue };
        let bucket = new_bucket(&url).await;
        assert_eq!(
            put_status(&url, &bucket, "k", None, true).await,
            200,
            "{emu:?}"
        );
        assert_eq!(
            put_status(&url, &bucket, "k", None, true).await,
            412,
            "{emu:?}"
        );
        let (_, etag) = raw_get(&url, &bucket, "k").await.unwrap();
        assert_eq!(
            put_status(&url, &bucket, "k", Some(&etag), false).await,
            200,
            "{emu:?}"
        );
        // The ETag read before that write is stale now.
        assert_eq!(
            put_status(&url, &bucket, "k", Some(&etag), false).await,
            412,
            "{emu:?}"
        );
        // If-Match on an absent object: 404 NoSuchKey (the store takes it as a conflict).
        assert_eq!(
            put_status(&url, &bucket, "gone", Some(&etag), false).await,
            404,
            "{emu:?}"
        );
        // The same bytes give the same ETag: the reason every write of the store is unique.
        raw_put(&url, &bucket, "same", b"x").await;
        let (_, one) = raw_get(&url, &bucket, "same").await.unwrap();
        raw_put(&url, &bucket, "same", b"y").await;
        raw_put(&url, &bucket, "same", b"x").await;
        let (_, again) = raw_get(&url, &bucket, "same").await.unwrap();
        assert_eq!(one, again, "{emu:?}: identical bytes, identical ETag");

        let mut double = 0;
        for round in 0..100 {
            let key = format!("race-{round}");
            let racers: Vec<_> = (0..8)
                .map(|_| {
                    let (url, bucket, key) = (url.clone(), bucket.clone(), key.clone());
                    tokio::spawn(async move { put_status(&url, &bucket, &key, None, true).await })
                })
                .collect();
            let mut winners = 0;
            for r in racers {
                let status = r.await.unwrap();
                assert!(matches!(status, 200 | 412 | 409), "{emu:?}: {status}");
                winners += usize::from(status == 200);
            }
            assert!(winners >= 1, "{emu:?} round {round}: nobody won");
            double += usize::from(winners > 1);
        }
        assert_eq!(double, 0, "{emu:?}: rounds with two winners of one create");

        // Known gaps (the store needs none of these): LocalStack does not implement
        // DeleteObject If-Match (501); moto compares `If-Match: *` on a delete literally (412).
        let delete = raw_client(&url)
            .delete_object()
            .bucket(&bucket)
            .key("k")
            .if_match("*")
            .send()
            .await;
        let status = delete
            .err()
            .and_then(|e| e.raw_response().map(|r| r.status().as_u16()));
        let expected = match emu {
            Emu::LocalStack => Some(501),
            Emu::Moto => Some(412),
        };
        assert_eq!(status, expected, "{emu:?}: conditional delete");
    }
}

/// A renew that writes the very same record still changes the bytes, so the ETag: a
/// follower never sees a renewed lease as unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_never_writes_the_same_bytes_twice() {
    for emu in Emu::BOTH {
        let Some(url) = emu.url().await else { continue };
        let bucket = new_bucket(&url).await;
        let store = store_at(&url, &bucket).await;
        let key = LeaseKey::new("same").unwrap();
        let r = record("a", 1, 7);
        let first = store
            .write(write(&key, Expected::Absent, r.clone(), WriteKind::Renew))
            .await
            .unwrap();
        let WriteOutcome::Written(first) = first else {
            panic!("{first:?}")
        };
        let (bytes_one, _) = raw_get(&url, &bucket, "same").await.unwrap();
        let expected = Expected::Revision(first.revision.clone());
        let second = store
            .write(write(&key, expected, r.clone(), WriteKind::Renew))
            .await;
        let WriteOutcome::Written(second) = second.unwrap() else {
            panic!()
        };
        let (bytes_two, _) = raw_get(&url, &bucket, "same").await.unwrap();
        assert_ne!(bytes_one, bytes_two, "{emu:?}");
        assert_ne!(first.revision, second.revision, "{emu:?}");
        assert_eq!(store.read(&key).await.unwrap().unwrap(), second, "{emu:?}");
    }
}

/// 409 `ConditionalRequestConflict` (S3: a concurrent request won, this one was not applied)
/// is retried with the same condition; one that persists writes nothing and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_409_is_retried_and_a_persistent_one_writes_nothing() {
    for emu in Emu::BOTH {
        let Some(url) = emu.url().await else { continue };
        let bucket = new_bucket(&url).await;
        let p = proxy(&url).await;
        let store = store_at(&p.url(), &bucket).await;
        let key = LeaseKey::new("k409").unwrap();
        let lease_put = Match::path(hyper::Method::PUT, &format!("/{bucket}/k409"));
        let conflict = || Fault::Answer(Canned::s3(409, "ConditionalRequestConflict"));
        p.inject(Rule::new(lease_put.clone(), conflict()));
        p.reset_requests();
        let out = put_record(&store, &key, Expected::Absent, 1, timing().request_timeout)
            .await
            .unwrap();
        assert!(matches!(out, WriteOutcome::Written(_)), "{emu:?}: {out:?}");
        let puts = p.requests().get(&format!("PUT /{bucket}/k409")).copied();
        assert_eq!(puts, Some(2), "{emu:?}: {:?}", p.requests());

        let other = LeaseKey::new("other").unwrap();
        let other_put = Match::path(hyper::Method::PUT, &format!("/{bucket}/other"));
        p.inject(Rule::new(other_put, conflict()).times(1000));
        let err = put_record(
            &store,
            &other,
            Expected::Absent,
            2,
            timing().request_timeout,
        )
        .await
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{emu:?}: {err}");
        assert!(raw_get(&url, &bucket, "other").await.is_none(), "{emu:?}");
        p.clear_rules();
    }
}

/// A write whose answer is lost is indeterminate, never sent again; the core re-reads and
/// recognises its own write, so the term is not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_is_indeterminate_and_the_core_recognises_its_write() {
    for emu in Emu::BOTH {
        let Some(url) = emu.url().await else { continue };
        let bucket = new_bucket(&url).await;
        let p = proxy(&url).await;
        let store = store_at(&p.url(), &bucket).await;
        let key = LeaseKey::new("lost").unwrap();
        let lease_put = Match::path(hyper::Method::PUT, &format!("/{bucket}/lost"));
        p.inject(Rule::new(lease_put.clone(), Fault::LoseResponse));
        let err = put_record(&store, &key, Expected::Absent, 3, timing().request_timeout)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Indeterminate, "{emu:?}: {err}");
        let landed = store.read(&key).await.unwrap().unwrap();
        assert_eq!(
            landed.record.nonce,
            WriteNonce(3),
            "{emu:?}: the write landed"
        );

        // Through the core: the answer to the acquire's lease write (its second PUT, after
        // the placeholder) is lost, and the core still holds the term; then the answer to
        // the placeholder itself is lost, and the store takes its own placeholder.
        let backend: Arc<dyn LeaseBackend> = Arc::new(store_at(&p.url(), &bucket).await);
        for (i, skip) in [1, 0].into_iter().enumerate() {
            let fresh = LeaseKey::new(format!("lost-acquire-{i}")).unwrap();
            let put = Match::path(hyper::Method::PUT, &format!("/{bucket}/{fresh}"));
            p.inject(Rule::new(put, Fault::LoseResponse).after(skip));
            let mut a = client(&backend, &fresh, "a");
            let grant = acquire(&mut a).await;
            let stored = store.read(&fresh).await.unwrap().unwrap();
            assert_eq!(
                (stored.record.holder.as_str(), stored.record.token),
                ("a", grant.token)
            );
            assert!(a.release().await.unwrap());
        }
        assert_eq!(
            p.counts().lost.load(std::sync::atomic::Ordering::SeqCst),
            3,
            "{emu:?}"
        );
    }
}

/// Tokens stay above every earlier one when an operator deletes the lease object, mid-term or
/// after a release, and whoever acquires next; the mark object keeps the highest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_across_deletions_and_the_mark_keeps_the_highest() {
    for emu in Emu::BOTH {
        let Some(url) = emu.url().await else { continue };
        let bucket = new_bucket(&url).await;
        let p = proxy(&url).await;
        let backend: Arc<dyn LeaseBackend> = Arc::new(store_at(&p.url(), &bucket).await);
        let key = LeaseKey::new("deleted").unwrap();
        let mut issued = Vec::new();
        let mut a = client(&backend, &key, "a");
        p.reset_requests();
        issued.push(acquire(&mut a).await.token.get());
        // A first acquire: lease read, placeholder write, mark read and write, lease write.
        let requests = p.requests();
        let count = |what: &str| requests.get(what).copied().unwrap_or(0);
        assert_eq!(
            count(&format!("PUT /{bucket}/.deleted.token")),
            1,
            "{requests:?}"
        );
        assert_eq!(count(&format!("PUT /{bucket}/deleted")), 2, "{requests:?}");
        // Deleted mid-term; a candidate that never saw the key proposes token 1.
        raw_delete(&url, &bucket, "deleted").await;
        let mut b = client(&backend, &key, "b");
        issued.push(acquire(&mut b).await.token.get());
        // The deposed holder's renew finds b's record: its term is over (or it had already
        // expired on a's own clock, on a slow machine).
        let renewal = a.renew().await.unwrap();
        assert!(
            !matches!(renewal, leader_core::Renewal::Renewed(_)),
            "{emu:?}: {renewal:?}"
        );
        assert!(b.release().await.unwrap());
        raw_delete(&url, &bucket, "deleted").await;
        issued.push(acquire(&mut a).await.token.get());
        assert!(
            issued.windows(2).all(|w| w[0] < w[1]),
            "{emu:?}: {issued:?}"
        );
        let (mark, _) = raw_get(&url, &bucket, ".deleted.token").await.unwrap();
        assert_eq!(
            String::from_utf8(mark).unwrap(),
            issued[2].to_string(),
            "{emu:?}"
        );
        eprintln!("{emu:?}: tokens across deletions {issued:?}");
    }
}

/// A damaged mark stops an acquire with an error naming the object, and is not overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_mark_is_reported_and_kept() {
    for emu in Emu::BOTH {
        let Some(url) = emu.url().await else { continue };
        let bucket = new_bucket(&url).await;
        raw_put(&url, &bucket, ".m.token", b"not a number").await;
        let backend: Arc<dyn LeaseBackend> = Arc::new(store_at(&url, &bucket).await);
        let mut a = client(&backend, &LeaseKey::new("m").unwrap(), "a");
        let err = a.try_acquire().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::MalformedRecord, "{emu:?}: {err}");
        assert!(err.to_string().contains(".m.token"), "{err}");
        let (body, _) = raw_get(&url, &bucket, ".m.token").await.unwrap();
        assert_eq!(body, b"not a number");
        // At most the acquire's released placeholder is there: no term began.
        let lease = backend.read(&LeaseKey::new("m").unwrap()).await.unwrap();
        assert!(
            lease.is_none_or(|l| l.record.state == leader_core::backend::LeaseState::Released),
            "{emu:?}"
        );
    }
}

/// The answers of a bucket or an account in trouble, each at `build` (its bucket check) with
/// the message a user acts on; throttling passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_and_credential_failures_are_classified_at_build() {
    for emu in Emu::BOTH {
        let Some(url) = emu.url().await else { continue };
        // A real missing bucket, from the emulator itself.
        let err = S3Builder::new()
            .with_emulator(&url)
            .with_bucket("no-such-bucket-here")
            .build()
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound, "{emu:?}: {err}");
        assert!(err.to_string().contains("no-such-bucket-here"), "{err}");

        let bucket = new_bucket(&url).await;
        let p = proxy(&url).await;
        let get = || Match::path(hyper::Method::GET, &format!("/{bucket}/"));
        let mut redirect = Canned::s3(301, "PermanentRedirect");
        redirect
            .headers
            .push(("x-amz-bucket-region", "eu-west-1".to_owned()));
        for (canned, kind, says) in [
            (
                Canned::s3(403, "ExpiredToken"),
                ErrorKind::Unauthenticated,
                "refused",
            ),
            (
                Canned::s3(403, "InvalidAccessKeyId"),
                ErrorKind::Unauthenticated,
                "refused",
            ),
            (
                Canned::s3(403, "AccessDenied"),
                ErrorKind::PermissionDenied,
                "s3:ListBucket",
            ),
            (redirect, ErrorKind::InvalidConfig, "eu-west-1"),
            (
                Canned::s3(501, "NotImplemented"),
                ErrorKind::InvalidConfig,
                "If-Match",
            ),
        ] {
            p.inject(Rule::new(get(), Fault::Answer(canned.clone())).times(100));
            let err = S3Builder::new()
                .with_emulator(p.url())
                .with_bucket(&bucket)
                .build()
                .await
                .unwrap_err();
            assert_eq!(err.kind(), kind, "{emu:?} {canned:?}: {err}");
            assert!(err.to_string().contains(says), "{emu:?}: {err}");
            p.clear_rules();
        }
        // SlowDown twice, then through: retried within the call.
        p.inject(Rule::new(get(), Fault::Answer(Canned::s3(503, "SlowDown"))).times(2));
        S3Builder::new()
            .with_emulator(p.url())
            .with_bucket(&bucket)
            .build()
            .await
            .unwrap();
    }
}

/// A versioned bucket, and one with Object Lock and a default retention, both elect: the
/// conditions apply to the current version, and every put carries a checksum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versioned_and_object_lock_buckets_elect() {
    use aws_sdk_s3::types::{
        BucketVersioningStatus, DefaultRetention, ObjectLockConfiguration, ObjectLockEnabled,
        ObjectLockRetentionMode, ObjectLockRule, VersioningConfiguration,
    };
    for emu in Emu::BOTH {
        let Some(url) = emu.url().await else { continue };
        let raw = raw_client(&url);
        let versioned = new_bucket(&url).await;
        raw.put_bucket_versioning()
            .bucket(&versioned)
            .versioning_configuration(
                VersioningConfiguration::builder()
                    .status(BucketVersioningStatus::Enabled)
                    .build(),
            )
            .send()
            .await
            .unwrap();
        let locked = integration_tests::unique_name("locked");
        raw.create_bucket()
            .bucket(&locked)
            .object_lock_enabled_for_bucket(true)
            .send()
            .await
            .unwrap();
        raw.put_object_lock_configuration()
            .bucket(&locked)
            .object_lock_configuration(
                ObjectLockConfiguration::builder()
                    .object_lock_enabled(ObjectLockEnabled::Enabled)
                    .rule(
                        ObjectLockRule::builder()
                            .default_retention(
                                DefaultRetention::builder()
                                    .mode(ObjectLockRetentionMode::Governance)
                                    .days(1)
                                    .build(),
                            )
                            .build(),
                    )
                    .build(),
            )
            .send()
            .await
            .unwrap();
        for bucket in [&versioned, &locked] {
            let backend: Arc<dyn LeaseBackend> = Arc::new(store_at(&url, bucket).await);
            let key = LeaseKey::new("v").unwrap();
            let mut a = client(&backend, &key, "a");
            let first = acquire(&mut a).await;
            assert!(matches!(
                a.renew().await.unwrap(),
                leader_core::Renewal::Renewed(_)
            ));
            assert!(a.release().await.unwrap(), "{emu:?} {bucket}");
            // A delete leaves a delete marker in a versioned bucket: absent to the store.
            raw_delete(&url, bucket, "v").await;
            let mut b = client(&backend, &key, "b");
            let second = acquire(&mut b).await;
            assert!(second.token > first.token, "{emu:?} {bucket}");
        }
    }
}

/// An acquire of an absent record whose create is held in flight while another candidate
/// takes the key and an operator deletes the record: when the held create lands, its term's
/// token is still above the other's (the create is a released placeholder, and the token is
/// raised only after it landed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_create_after_a_deletion_still_gets_a_higher_token() {
    for emu in Emu::BOTH {
        let Some(url) = emu.url().await else { continue };
        let bucket = new_bucket(&url).await;
        let p = proxy(&url).await;
        let late = store_at(&p.url(), &bucket).await;
        let key = LeaseKey::new("late-create").unwrap();
        let put = Match::path(hyper::Method::PUT, &format!("/{bucket}/late-create"));
        p.inject(Rule::new(
            put,
            Fault::Delay(std::time::Duration::from_millis(800)),
        ));
        let b = {
            let key = key.clone();
            tokio::spawn(async move {
                let request = write(
                    &key,
                    Expected::Absent,
                    record("b", 1, 11),
                    WriteKind::Acquire,
                );
                within(std::time::Duration::from_secs(3), late.write(request)).await
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let direct = store_at(&url, &bucket).await;
        let request = write(
            &key,
            Expected::Absent,
            record("a", 1, 12),
            WriteKind::Acquire,
        );
        let WriteOutcome::Written(a) = direct.write(request).await.unwrap() else {
            panic!("{emu:?}: a did not acquire")
        };
        raw_delete(&url, &bucket, "late-create").await;
        let WriteOutcome::Written(b) = b.await.unwrap().unwrap().unwrap() else {
            panic!("{emu:?}: b did not acquire after the deletion")
        };
        assert!(
            b.record.token > a.record.token,
            "{emu:?}: b's term {} began after a's {}",
            b.record.token,
            a.record.token
        );
    }
}

/// A throttled write is retried, but S3 does not promise it was not applied: once a write was
/// throttled, a retry that finds the condition failed is an unknown outcome, not a conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_after_throttling_is_an_unknown_outcome() {
    for emu in Emu::BOTH {
        let Some(url) = emu.url().await else { continue };
        let bucket = new_bucket(&url).await;
        let p = proxy(&url).await;
        let store = store_at(&p.url(), &bucket).await;
        let key = LeaseKey::new("slow").unwrap();
        let put = || Match::path(hyper::Method::PUT, &format!("/{bucket}/slow"));
        let slow_down = || Fault::Answer(Canned::s3(503, "SlowDown"));
        let budget = std::time::Duration::from_secs(2);
        // Throttled once, then written.
        p.inject(Rule::new(put(), slow_down()));
        let out = put_record(&store, &key, Expected::Absent, 1, budget)
            .await
            .unwrap();
        assert!(matches!(out, WriteOutcome::Written(_)), "{emu:?}: {out:?}");
        // Throttled, then the condition fails (the object exists): unknown, not a conflict.
        p.inject(Rule::new(put(), slow_down()));
        let err = put_record(&store, &key, Expected::Absent, 2, budget)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Indeterminate, "{emu:?}: {err}");
        // Without throttling, the same write is a plain conflict.
        let out = put_record(&store, &key, Expected::Absent, 3, budget)
            .await
            .unwrap();
        assert!(
            matches!(out, WriteOutcome::Conflict { .. }),
            "{emu:?}: {out:?}"
        );
    }
}
