//! DynamoDB-specific cases against moto: fenced transactions, lost responses, the table
//! checks, the request counts of a leader and a follower, and tokens that survive deletion of
//! the lease item (the token high-water mark).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr,
    reason = "test code"
)]

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use common::{delete_lease, mark_of, moto_url, proxy, raw_client, raw_item, store_at, timing};
use integration_tests::proxy::{Canned, Fault, FaultProxy, Match, Rule};
use leader_core::backend::within;
use leader_core::backend::{
    Expected, FencedCas, FencedPut, LeaseRecord, ObjectWrite, TermId, WriteKind, WriteNonce,
    WriteOutcome, WriteRequest,
};
use leader_core::{
    Acquisition, Elector, Error, ErrorKind, Fence, FencedStore, FencingToken, HolderId,
    LeaseBackend, LeaseClient, LeaseKey, Metadata, ObjectName, Renewal,
};
use leader_dynamo::{DynamoBuilder, LEASE_PREFIX, MARK_PREFIX, OBJECT_PREFIX};
use tokio::time::Instant;

fn table() -> String {
    integration_tests::unique_name("leases")
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

fn record(holder: &str, token: u64, nonce: u64) -> LeaseRecord {
    LeaseRecord::held(
        HolderId::new(holder).unwrap(),
        FencingToken(token),
        timing().ttl,
        Metadata::new(),
        WriteNonce(nonce),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_transaction_rejects_a_deposed_leader() {
    let store = Arc::new(store_at(&moto_url().await, &table()).await);
    let backend: Arc<dyn LeaseBackend> = store.clone();
    let key = LeaseKey::new("jobs").unwrap();
    let (orders, fresh) = (
        ObjectName::new("orders").unwrap(),
        ObjectName::new("fresh").unwrap(),
    );
    let mut a = client(&backend, &key, "a");
    let g1 = acquire(&mut a).await;
    let fence_a = Fence::new(key.clone(), a.holder().clone(), g1.token);
    let written = store.fenced_write(&fence_a, &orders, b"v1").await.unwrap();
    assert_eq!(written.fence, g1.token);
    assert_eq!(
        store.fenced_read(&orders).await.unwrap().unwrap().value,
        b"v1"
    );

    // b takes the lease over (as after a full ttl: a write conditional on a's revision with
    // a higher token). The object has not seen b's token yet: only the lease check can stop a.
    let current = store.read(&key).await.unwrap().unwrap();
    let takeover = store
        .write(WriteRequest::new(
            key.clone(),
            Expected::Revision(current.revision),
            record("b", g1.token.get() + 1, 0xb),
            WriteKind::Acquire,
            TermId(2),
        ))
        .await
        .unwrap();
    assert!(matches!(takeover, WriteOutcome::Written(_)), "{takeover:?}");

    for object in [&orders, &fresh] {
        match store.fenced_write(&fence_a, object, b"late").await {
            Err(e @ Error::Fenced { .. }) => {
                let Error::Fenced { presented, .. } = &e else {
                    unreachable!()
                };
                assert_eq!(*presented, g1.token);
                assert!(e.to_string().contains("no longer leader"), "{e}");
            }
            other => panic!("a deposed leader's write must be fenced off, got {other:?}"),
        }
    }
    assert_eq!(
        store.fenced_read(&orders).await.unwrap().unwrap().value,
        b"v1"
    );
    assert!(store.fenced_read(&fresh).await.unwrap().is_none());

    // b writes with its token; a's token is then also below the object's fence.
    let fence_b = Fence::new(
        key.clone(),
        HolderId::new("b").unwrap(),
        FencingToken(g1.token.get() + 1),
    );
    store.fenced_write(&fence_b, &orders, b"v2").await.unwrap();
    match store.fenced_write(&fence_a, &orders, b"late").await {
        Err(Error::Fenced { highest, .. }) => assert_eq!(highest, Some(fence_b.token)),
        other => panic!("{other:?}"),
    }
    // A fence naming a holder that never held the lease is rejected too.
    let impostor = Fence {
        holder: HolderId::new("c").unwrap(),
        ..fence_b.clone()
    };
    assert!(matches!(
        store.fenced_write(&impostor, &orders, b"x").await,
        Err(Error::Fenced { .. })
    ));
}

/// A shard term's fence: the lease checked is the membership term (`lease_term`), the token
/// written is the shard's. It writes while that term is live, with the shard's token as the
/// object's fence; once the term has ended (released, then a newer term), the same lease term
/// is refused although its token is above the object's fence, and a refusal by the lease never
/// reports the membership's token as the object's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_with_a_separate_lease_term_needs_that_term_live() {
    let store = Arc::new(store_at(&moto_url().await, &table()).await);
    let backend: Arc<dyn LeaseBackend> = store.clone();
    let key = LeaseKey::new("member.a").unwrap();
    let object = ObjectName::new("shard-report").unwrap();
    let mut a = client(&backend, &key, "a");
    let g = acquire(&mut a).await;
    let member = Fence::new(key.clone(), a.holder().clone(), g.token);
    let shard = |token: u64| Fence {
        token: FencingToken(token),
        lease_term: Some(member.token),
        ..member.clone()
    };
    let s = g.token.get() + 1000;
    let written = store
        .fenced_write(&shard(s), &object, b"one")
        .await
        .unwrap();
    assert_eq!(written.fence, FencingToken(s));

    assert!(a.release().await.unwrap());
    let err = store
        .fenced_write(&shard(s + 1), &object, b"after release")
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Fenced { presented, highest: None, .. } if presented.get() == s + 1),
        "{err}"
    );

    let mut b = client(&backend, &key, "b");
    let g2 = acquire(&mut b).await;
    assert!(g2.token > g.token);
    let err = store
        .fenced_write(&shard(s + 2), &object, b"after a newer term")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Fenced { highest: None, .. }), "{err}");
    // A shard token below the newer membership token, on an object it may write: refused by
    // the lease, and the membership token is not reported as the object's fence.
    let fresh = ObjectName::new("shard-fresh").unwrap();
    let err = store
        .fenced_write(&shard(1), &fresh, b"x")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Fenced { highest: None, .. }), "{err}");
    assert!(store.fenced_read(&fresh).await.unwrap().is_none());
    let kept = store.fenced_read(&object).await.unwrap().unwrap();
    assert_eq!((kept.fence, kept.value), (FencingToken(s), b"one".to_vec()));

    // The newer membership term's fence writes with a shard token above the object's fence.
    let newer = Fence {
        token: FencingToken(s + 3),
        lease_term: Some(g2.token),
        ..Fence::new(key.clone(), b.holder().clone(), g2.token)
    };
    let written = store.fenced_write(&newer, &object, b"two").await.unwrap();
    assert_eq!(written.fence, newer.token);
}

/// A put without the lease check is a plain compare-and-swap of the object item: where the
/// same fence's checked put is refused (no lease is held at its key), it writes, with one
/// `UpdateItem` and no transaction. Its item has the attributes a checked put leaves, and
/// each kind of put goes on from the revision the other left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchecked_put_writes_where_the_checked_put_is_fenced() {
    let url = moto_url().await;
    let table = table();
    let store = store_at(&url, &table).await;
    let proxy = proxy(&url).await;
    let through = store_at(&proxy.url(), &table).await;
    let object = ObjectName::new("cas-record").unwrap();
    let item = || raw_item(&url, &table, format!("{OBJECT_PREFIX}{object}"));
    let idle = Fence::new(
        LeaseKey::new("held-by-nobody").unwrap(),
        HolderId::new("a").unwrap(),
        FencingToken(7),
    );
    let absent = Expected::Absent;
    let err = through
        .put_fenced_if(FencedPut::new(&idle, &object, &absent, b"one"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Fenced { .. }), "{err}");
    assert!(item().await.is_none());

    proxy.reset_requests();
    let put = FencedPut::new(&idle, &object, &absent, b"one").without_lease_check();
    let ObjectWrite::Written(r1) = through.put_fenced_if(put).await.unwrap() else {
        panic!("an unchecked put of an absent object must be written");
    };
    assert_eq!(ops(&proxy), counted(&[("UpdateItem", 1)]));
    let read = store.get_fenced(&object).await.unwrap().unwrap();
    assert_eq!(
        (read.fence, read.value, &read.revision),
        (FencingToken(7), b"one".to_vec(), &r1)
    );
    let unchecked = item().await.unwrap();
    assert_eq!(
        unchecked.get("fence"),
        Some(&AttributeValue::N("7".to_owned()))
    );

    // A live term's checked put on the unchecked put's revision, then an unchecked put on the
    // checked put's revision.
    let backend: Arc<dyn LeaseBackend> = Arc::new(store.clone());
    let key = LeaseKey::new("held").unwrap();
    let mut a = client(&backend, &key, "a");
    let fence = Fence::new(key.clone(), a.holder().clone(), acquire(&mut a).await.token);
    let at_r1 = Expected::Revision(r1);
    let put = FencedPut::new(&fence, &object, &at_r1, b"two");
    let ObjectWrite::Written(r2) = store.put_fenced_if(put).await.unwrap() else {
        panic!("a checked put on the unchecked put's revision must be written");
    };
    let checked = item().await.unwrap();
    let names = |i: &HashMap<String, AttributeValue>| i.keys().cloned().collect::<BTreeSet<_>>();
    assert_eq!(names(&checked), names(&unchecked));
    let at_r2 = Expected::Revision(r2);
    let put = FencedPut::new(&fence, &object, &at_r2, b"three").without_lease_check();
    let ObjectWrite::Written(r3) = store.put_fenced_if(put).await.unwrap() else {
        panic!("an unchecked put on the checked put's revision must be written");
    };
    let read = store.get_fenced(&object).await.unwrap().unwrap();
    assert_eq!(
        (read.fence, read.value, read.revision),
        (fence.token, b"three".to_vec(), r3)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_renew_is_recognised_as_our_own_write() {
    let url = moto_url().await;
    let table = table();
    let direct = store_at(&url, &table).await;
    let proxy = proxy(&url).await;
    let through: Arc<dyn LeaseBackend> = Arc::new(store_at(&proxy.url(), &table).await);
    let key = LeaseKey::new("ambiguous").unwrap();
    let mut a = client(&through, &key, "a");
    let g1 = acquire(&mut a).await;
    let before = direct.read(&key).await.unwrap().unwrap();

    // The renew lands in the table, but its response never arrives.
    proxy.inject(Rule::new(Match::aws("UpdateItem"), Fault::LoseResponse));
    let renewal = a.renew().await.unwrap();
    assert_eq!(proxy.counts().lost.load(Ordering::Relaxed), 1);
    let Renewal::Renewed(g2) = renewal else {
        panic!("the lost renew is ours and must count, got {renewal:?}");
    };
    assert_eq!(g2.token, g1.token);
    assert!(g2.deadline > g1.deadline);
    let after = direct.read(&key).await.unwrap().unwrap();
    assert_ne!(after.revision, before.revision, "the renew was applied");
    assert_eq!(after.record.holder, *a.holder());
    // The term goes on from the recognised revision.
    assert!(matches!(a.renew().await.unwrap(), Renewal::Renewed(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttled_renews_are_retried_within_the_deadline() {
    let url = moto_url().await;
    let proxy = proxy(&url).await;
    let through: Arc<dyn LeaseBackend> = Arc::new(store_at(&proxy.url(), &table()).await);
    let key = LeaseKey::new("throttled").unwrap();
    let mut a = client(&through, &key, "a");
    let g1 = acquire(&mut a).await;

    // Two throttled attempts, then the write goes through, all within one request timeout.
    proxy.reset_requests();
    proxy.inject(
        Rule::new(
            Match::aws("UpdateItem"),
            Fault::Answer(Canned::aws_throttling()),
        )
        .times(2),
    );
    let started = Instant::now();
    let renewal = a.renew().await.unwrap();
    let took = started.elapsed();
    assert!(
        matches!(renewal, Renewal::Renewed(g) if g.token == g1.token),
        "{renewal:?}"
    );
    assert!(took < timing().request_timeout, "took {took:?}");
    assert_eq!(proxy.requests().get("UpdateItem"), Some(&3));

    // Throttled for good: the call gives up inside the request timeout with a retryable
    // error, and the term is still valid until its deadline.
    proxy.reset_requests();
    proxy.inject(
        Rule::new(
            Match::aws("UpdateItem"),
            Fault::Answer(Canned::aws_throttling()),
        )
        .times(1000),
    );
    let started = Instant::now();
    let err = a.renew().await.unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Throttled, "{err}");
    assert!(err.is_retryable());
    assert!(took <= timing().request_timeout, "took {took:?}");
    assert!(proxy.requests().get("UpdateItem").copied().unwrap_or(0) >= 2);
    assert!(a.grant().is_some(), "the term outlives a throttled renew");
    proxy.clear_rules();
    assert!(matches!(a.renew().await.unwrap(), Renewal::Renewed(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_or_late_write_responses_are_indeterminate() {
    let url = moto_url().await;
    let table = table();
    let direct = store_at(&url, &table).await;
    let proxy = proxy(&url).await;
    let through = store_at(&proxy.url(), &table).await;
    let key = LeaseKey::new("lost").unwrap();

    // An acquire is one transaction (the lease item and the token mark).
    proxy.inject(Rule::new(
        Match::aws("TransactWriteItems"),
        Fault::LoseResponse,
    ));
    let err = through
        .write(WriteRequest::new(
            key.clone(),
            Expected::Absent,
            record("a", 1, 0xa1),
            WriteKind::Acquire,
            TermId(1),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Indeterminate, "{err}");
    assert_eq!(proxy.counts().lost.load(Ordering::Relaxed), 1);
    let stored = direct.read(&key).await.unwrap().unwrap();
    assert_eq!(stored.record.nonce, WriteNonce(0xa1), "it was applied");

    // A response that never comes: the call ends within the request timeout, indeterminate.
    proxy.inject(Rule::new(
        Match::aws("UpdateItem"),
        Fault::HoldResponse(Duration::from_secs(60)),
    ));
    let started = Instant::now();
    let write = through.write(WriteRequest::new(
        key.clone(),
        Expected::Revision(stored.revision.clone()),
        record("a", 1, 0xa2),
        WriteKind::Renew,
        TermId(1),
    ));
    // The elector runs each call within its request timeout; the store answers by then.
    let err = within(timing().request_timeout, write)
        .await
        .expect("the store ends its call by the deadline")
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Indeterminate, "{err}");
    assert!(
        took < timing().request_timeout + Duration::from_millis(100),
        "took {took:?}"
    );
    let stored = direct.read(&key).await.unwrap().unwrap();
    assert_eq!(stored.record.nonce, WriteNonce(0xa2), "it was applied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_write_is_recognised_from_the_returned_old_item() {
    let store = store_at(&moto_url().await, &table()).await;
    let key = LeaseKey::new("repeat").unwrap();
    let request = WriteRequest::new(
        key.clone(),
        Expected::Absent,
        record("a", 1, 0x1),
        WriteKind::Acquire,
        TermId(1),
    );
    let WriteOutcome::Written(first) = store.write(request.clone()).await.unwrap() else {
        panic!("create failed");
    };
    // As an SDK retry of a write whose response was lost: the condition fails, but the item
    // DynamoDB returns is exactly our write.
    let again = store.write(request).await.unwrap();
    assert_eq!(again, WriteOutcome::Written(first.clone()));

    // Someone else's write conflicts, and the conflict names the holder without a read.
    let other = store
        .write(WriteRequest::new(
            key.clone(),
            Expected::Absent,
            record("b", 1, 0x2),
            WriteKind::Acquire,
            TermId(2),
        ))
        .await
        .unwrap();
    match other {
        WriteOutcome::Conflict { current: Some(c) } => assert_eq!(c, first),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_checks() {
    let url = moto_url().await;
    let name = table();
    let missing = DynamoBuilder::new()
        .with_emulator(url.as_str())
        .with_table(&name)
        .build()
        .await
        .unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound, "{missing}");
    assert!(missing.to_string().contains(&name), "{missing}");

    // Opt-in creation: on-demand billing, the configured key.
    let store = DynamoBuilder::new()
        .with_emulator(url.as_str())
        .with_table(&name)
        .with_create_table_if_missing(true)
        .build()
        .await
        .unwrap();
    assert_eq!(store.table(), name);
    let endpoint = integration_tests::require(integration_tests::Emulator::DynamoDb)
        .await
        .unwrap();
    let described = integration_tests::dynamodb::client(&endpoint)
        .describe_table()
        .table_name(&name)
        .send()
        .await
        .unwrap()
        .table
        .unwrap();
    assert_eq!(
        described
            .billing_mode_summary()
            .and_then(|b| b.billing_mode()),
        Some(&aws_sdk_dynamodb::types::BillingMode::PayPerRequest)
    );

    let wrong = DynamoBuilder::new()
        .with_emulator(url.as_str())
        .with_table(&name)
        .with_partition_key("id")
        .build()
        .await
        .unwrap_err();
    assert_eq!(wrong.kind(), ErrorKind::InvalidConfig, "{wrong}");
    assert!(wrong.to_string().contains("key schema"), "{wrong}");
}

/// Counts the requests of a leader and of a follower over one ttl, each through its own
/// counting proxy, with the test cadence (renew every 1 s, poll every 500 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_counts_over_one_ttl() {
    let url = moto_url().await;
    let table = table();
    store_at(&url, &table).await;
    let key = LeaseKey::new("counted").unwrap();
    let (pl, pf) = (proxy(&url).await, proxy(&url).await);
    let elector = |proxy_url: String, who: &'static str| {
        let table = table.clone();
        let key = key.clone();
        async move {
            let store = store_at(&proxy_url, &table).await;
            Elector::builder(Arc::new(store), key)
                .timing(timing())
                .holder_id(HolderId::new(who).unwrap())
                .build()
                .unwrap()
                .spawn()
        }
    };
    let leader = elector(pl.url(), "leader").await;
    let term = tokio::time::timeout(Duration::from_secs(5), leader.wait_for_term())
        .await
        .unwrap()
        .unwrap();
    drop(term);
    let follower = elector(pf.url(), "follower").await;
    let mut rx = follower.leadership();
    tokio::time::timeout(
        Duration::from_secs(5),
        rx.wait_for(|l| matches!(l, leader_core::Leadership::Follower { .. })),
    )
    .await
    .unwrap()
    .unwrap();

    pl.reset_requests();
    pf.reset_requests();
    // Three ttls, reported per ttl, to smooth the follower's jittered polling.
    const TTLS: u64 = 3;
    let ttl = timing().ttl;
    tokio::time::sleep(ttl * TTLS as u32).await;
    let (l, f) = (pl.requests(), pf.requests());
    let per_ttl = |m: &std::collections::BTreeMap<String, u64>| {
        m.iter()
            .map(|(op, n)| format!("{op}: {:.1}", *n as f64 / TTLS as f64))
            .collect::<Vec<_>>()
            .join(", ")
    };
    eprintln!(
        "requests per ttl ({ttl:?}, averaged over {TTLS}): leader {{{}}}, follower {{{}}}",
        per_ttl(&l),
        per_ttl(&f)
    );
    assert!(leader.current().is_leader());
    let get =
        |m: &std::collections::BTreeMap<String, u64>, op: &str| m.get(op).copied().unwrap_or(0);
    // Leader: one UpdateItem per renew (ttl / renew_every = 3 per ttl), no reads.
    assert!((7..=11).contains(&get(&l, "UpdateItem")), "{l:?}");
    assert_eq!(l.len(), 1, "{l:?}");
    // Follower: one GetItem per poll (every 1 to 1.1 x poll_every = 500 ms: 16.4 to 18 in
    // 9 s), no writes.
    assert!((15..=19).contains(&get(&f, "GetItem")), "{f:?}");
    assert_eq!(f.len(), 1, "{f:?}");
    // ... eventually consistent, half the price of the leader's consistent reads.
    let reads: Vec<_> = pf
        .exchanges()
        .into_keys()
        .map(|e| e.consistent_read)
        .collect();
    assert!(
        !reads.is_empty() && reads.iter().all(|c| *c == Some(false)),
        "{reads:?}"
    );
    follower.shutdown().await;
    leader.shutdown().await;
}

/// `from_env` reaches the emulator through `AWS_ENDPOINT_URL` and the environment's
/// credentials, with the same HTTPS-capable client a deployment uses.
#[cfg(feature = "from-env")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_env_honours_aws_endpoint_url() {
    let url = moto_url().await;
    let from_env = std::env::var("AWS_ENDPOINT_URL").ok();
    if from_env.is_none() && std::env::var(integration_tests::REQUIRED_VAR).as_deref() != Ok("1") {
        // The emulator came from Docker: there is no environment to read.
        eprintln!("SKIPPED: AWS_ENDPOINT_URL is not set");
        return;
    }
    assert_eq!(from_env.as_deref(), Some(url.as_str()));
    let store = DynamoBuilder::from_env()
        .unwrap()
        .with_table(table())
        .with_create_table_if_missing(true)
        .build()
        .await
        .unwrap();
    let backend: Arc<dyn LeaseBackend> = Arc::new(store);
    let mut a = client(&backend, &LeaseKey::new("env").unwrap(), "a");
    acquire(&mut a).await;
    assert!(a.release().await.unwrap());
}

/// The token stored in the lease item of `key`.
async fn lease_token(url: &str, table: &str, key: &LeaseKey) -> Option<u64> {
    let item = raw_item(url, table, format!("{LEASE_PREFIX}{key}")).await?;
    match item.get("token") {
        Some(AttributeValue::N(n)) => Some(n.parse().unwrap()),
        other => panic!("{other:?}"),
    }
}

fn ops(proxy: &FaultProxy) -> Vec<(String, u64)> {
    proxy.requests().into_iter().collect()
}

fn counted(pairs: &[(&str, u64)]) -> Vec<(String, u64)> {
    pairs.iter().map(|(op, n)| ((*op).to_owned(), *n)).collect()
}

/// Deleting the lease item, mid-term or after a release, once or twice in a row, never lets a
/// token be issued twice or go down: every term's token is above every earlier one, whoever
/// acquires (a candidate that never saw the key, or one that saw it before the deletion).
/// Also counts what an acquire and a renew cost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_stay_above_every_earlier_one_across_deletions() {
    let url = moto_url().await;
    let table = table();
    store_at(&url, &table).await;
    let proxy = proxy(&url).await;
    let through: Arc<dyn LeaseBackend> = Arc::new(store_at(&proxy.url(), &table).await);
    let key = LeaseKey::new("deleted").unwrap();
    let mut issued: Vec<u64> = Vec::new();
    let check = |who: &str, token: FencingToken, issued: &mut Vec<u64>| {
        let highest = issued.iter().copied().max().unwrap_or(0);
        assert!(
            token.get() > highest,
            "{who} got token {token} after {issued:?} were issued"
        );
        issued.push(token.get());
    };

    // A key's first term: one read, one transaction; the term's renew: one UpdateItem, and
    // the mark is not touched.
    proxy.reset_requests();
    let mut a = client(&through, &key, "a");
    let ga = acquire(&mut a).await;
    check("a", ga.token, &mut issued);
    assert_eq!(
        ops(&proxy),
        counted(&[("GetItem", 1), ("TransactWriteItems", 1)])
    );
    proxy.reset_requests();
    assert!(matches!(a.renew().await.unwrap(), Renewal::Renewed(_)));
    assert_eq!(ops(&proxy), counted(&[("UpdateItem", 1)]));
    assert_eq!(mark_of(&url, &table, &key).await, Some(ga.token.get()));

    // Round 1: deleted mid-term; a candidate that never saw the key proposes token 1, and
    // the store mints above the mark instead (one more transaction).
    delete_lease(&url, &table, &key).await;
    proxy.reset_requests();
    let mut b = client(&through, &key, "b");
    let gb = acquire(&mut b).await;
    check("b", gb.token, &mut issued);
    assert_eq!(
        ops(&proxy),
        counted(&[("GetItem", 1), ("TransactWriteItems", 2)])
    );
    // The deposed holder's renew finds no item: its term is over.
    assert!(
        matches!(a.renew().await.unwrap(), Renewal::Lost { .. }),
        "a renew after deletion must lose the term"
    );

    // Round 2: released, then deleted; a, who saw the key before, acquires again.
    assert!(b.release().await.unwrap());
    delete_lease(&url, &table, &key).await;
    let ga2 = acquire(&mut a).await;
    check("a again", ga2.token, &mut issued);

    // Round 3: deleted twice in a row (the second time with nothing to delete), then a new
    // candidate; and round 4: once more, mid-term.
    delete_lease(&url, &table, &key).await;
    delete_lease(&url, &table, &key).await;
    let mut c = client(&through, &key, "c");
    let gc = acquire(&mut c).await;
    check("c", gc.token, &mut issued);
    delete_lease(&url, &table, &key).await;
    let mut d = client(&through, &key, "d");
    let gd = acquire(&mut d).await;
    check("d", gd.token, &mut issued);

    // The item and the mark agree with the last term, and every token is unique.
    assert_eq!(lease_token(&url, &table, &key).await, Some(gd.token.get()));
    assert_eq!(mark_of(&url, &table, &key).await, Some(gd.token.get()));
    let mut unique = issued.clone();
    unique.dedup();
    assert_eq!(unique, issued);
    eprintln!("tokens across deletions: {issued:?}");
}

/// A stale writer cannot lower the mark: an acquire conditional on an old revision is a
/// conflict that leaves the mark alone, and an acquire that proposes a token at or below the
/// mark (after a deletion) gets a token above it, never rewinds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_mark_is_never_lowered_by_a_stale_writer() {
    let url = moto_url().await;
    let table = table();
    let store = store_at(&url, &table).await;
    let backend: Arc<dyn LeaseBackend> = Arc::new(store.clone());
    let key = LeaseKey::new("stale").unwrap();
    let mut a = client(&backend, &key, "a");
    let g1 = acquire(&mut a).await;
    let seen_by_stale = store.read(&key).await.unwrap().unwrap();
    assert!(a.release().await.unwrap());
    let mut b = client(&backend, &key, "b");
    let g2 = acquire(&mut b).await;
    assert!(g2.token > g1.token);
    assert_eq!(mark_of(&url, &table, &key).await, Some(g2.token.get()));

    let stale = |expected: Expected, token: u64, nonce: u64| {
        WriteRequest::new(
            key.clone(),
            expected,
            record("stale", token, nonce),
            WriteKind::Acquire,
            TermId(u128::from(nonce)),
        )
    };
    // 1. A late acquire on the revision it read long ago, with the token it proposed then
    //    and with a lower one: a conflict; neither the lease nor the mark moves.
    for token in [g1.token.get() + 1, 1] {
        let out = store
            .write(stale(
                Expected::Revision(seen_by_stale.revision.clone()),
                token,
                0x51 + token,
            ))
            .await
            .unwrap();
        assert!(matches!(out, WriteOutcome::Conflict { .. }), "{out:?}");
        assert_eq!(mark_of(&url, &table, &key).await, Some(g2.token.get()));
        assert_eq!(lease_token(&url, &table, &key).await, Some(g2.token.get()));
    }

    // 2. The lease item is deleted; a writer that believes the key is new proposes token 1,
    //    and one proposes exactly the mark. Each write lands above the mark, which rises.
    let mut highest = g2.token.get();
    for (token, nonce) in [(1, 0x61), (0, 0x62)] {
        delete_lease(&url, &table, &key).await;
        let token = if token == 0 { highest } else { token };
        let out = store
            .write(stale(Expected::Absent, token, nonce))
            .await
            .unwrap();
        let WriteOutcome::Written(written) = out else {
            panic!("an acquire of a deleted item must land: {out:?}");
        };
        assert!(
            written.record.token.get() > highest,
            "proposed {token}: got {} with the mark at {highest}",
            written.record.token
        );
        highest = written.record.token.get();
        assert_eq!(mark_of(&url, &table, &key).await, Some(highest));
        assert_eq!(lease_token(&url, &table, &key).await, Some(highest));
        // What the store reported is what it stored.
        assert_eq!(store.read(&key).await.unwrap().unwrap(), written);
    }
}

/// An acquire above the mark whose response is lost is recognised by the core as its own
/// write, with the raised token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_acquire_above_the_mark_is_recognised_with_its_token() {
    let url = moto_url().await;
    let table = table();
    let direct = store_at(&url, &table).await;
    let backend: Arc<dyn LeaseBackend> = Arc::new(direct.clone());
    let key = LeaseKey::new("lost-mark").unwrap();
    let mut a = client(&backend, &key, "a");
    let g1 = acquire(&mut a).await;
    delete_lease(&url, &table, &key).await;

    let proxy = proxy(&url).await;
    let through: Arc<dyn LeaseBackend> = Arc::new(store_at(&proxy.url(), &table).await);
    let mut b = client(&through, &key, "b");
    // The first transaction (token 1) is cancelled by the mark; the second one lands above
    // it, and its response is lost.
    proxy.inject(Rule::new(Match::aws("TransactWriteItems"), Fault::LoseResponse).after(1));
    let g2 = acquire(&mut b).await;
    assert_eq!(proxy.counts().lost.load(Ordering::Relaxed), 1);
    assert!(g2.token > g1.token, "{} after {}", g2.token, g1.token);
    let stored = direct.read(&key).await.unwrap().unwrap();
    assert_eq!(stored.record.holder, *b.holder());
    assert_eq!(stored.record.token, g2.token);
    assert!(matches!(b.renew().await.unwrap(), Renewal::Renewed(g) if g.token == g2.token));
}

/// A damaged mark is reported naming the key and the mark item, and nothing is written over
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_mark_is_reported_and_kept() {
    let url = moto_url().await;
    let table = table();
    let store = store_at(&url, &table).await;
    let key = LeaseKey::new("bad-mark").unwrap();
    raw_client(&url)
        .put_item()
        .table_name(&table)
        .item("pk", AttributeValue::S(format!("{MARK_PREFIX}{key}")))
        .item("high", AttributeValue::S("seven".to_owned()))
        .send()
        .await
        .unwrap();
    let err = store
        .write(WriteRequest::new(
            key.clone(),
            Expected::Absent,
            record("a", 1, 0x1),
            WriteKind::Acquire,
            TermId(1),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::MalformedRecord, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("bad-mark") && msg.contains("mark#bad-mark"),
        "{msg}"
    );
    assert!(store.read(&key).await.unwrap().is_none());
    let mark = raw_item(&url, &table, format!("{MARK_PREFIX}{key}"))
        .await
        .unwrap();
    assert_eq!(
        mark.get("high"),
        Some(&AttributeValue::S("seven".to_owned()))
    );
}
