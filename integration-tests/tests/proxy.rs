//! The fault-injecting proxy, against a tiny HTTP server of the test's own that records the
//! bytes it receives.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use integration_tests::proxy::{Canned, Fault, FaultProxy, Match, ProxyFaults, Rule};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Every request the upstream received, as raw bytes (it "applied" them).
#[derive(Clone, Default)]
struct Applied(Arc<Mutex<Vec<String>>>);

impl Applied {
    fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    fn last(&self) -> String {
        self.0.lock().unwrap().last().cloned().unwrap_or_default()
    }
}

/// Answers every request with `ok` on a connection it then closes.
async fn upstream() -> (String, Applied) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let applied = Applied::default();
    let seen = applied.clone();
    tokio::spawn(async move {
        loop {
            let (mut conn, _) = listener.accept().await.unwrap();
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                loop {
                    let n = conn.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..i]).to_lowercase();
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse().unwrap());
                        if buf.len() >= i + 4 + len {
                            assert!(head.contains("connection: close"));
                            break;
                        }
                    }
                }
                seen.0
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf).into_owned());
                let _ = conn
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await;
                let _ = conn.shutdown().await;
            });
        }
    });
    (addr.to_string(), applied)
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap()
}

#[tokio::test]
async fn passes_through_and_injects_each_fault() {
    let (up, applied) = upstream().await;
    let proxy = FaultProxy::start(&up, 1).await.unwrap();
    let url = format!("{}/x", proxy.url());
    let c = client();

    let r = c.put(&url).body("hello").send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "ok");
    assert_eq!(applied.count(), 1);
    assert!(
        applied.last().ends_with("\r\n\r\nhello"),
        "{}",
        applied.last()
    );

    proxy.set(ProxyFaults {
        throttle_fraction: 1.0,
        throttle_status: 429,
        ..Default::default()
    });
    assert_eq!(c.get(&url).send().await.unwrap().status(), 429);
    assert_eq!(applied.count(), 1, "a throttled request is not forwarded");

    proxy.set(ProxyFaults {
        lose_response_fraction: 1.0,
        ..Default::default()
    });
    assert!(c.put(&url).body("x").send().await.is_err());
    assert_eq!(applied.count(), 2, "a lost response was still applied");

    proxy.set(ProxyFaults {
        blackhole: true,
        ..Default::default()
    });
    let err = c.get(&url).send().await.unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert_eq!(applied.count(), 2);

    proxy.set(ProxyFaults {
        refuse_new: true,
        ..Default::default()
    });
    assert!(c.get(&url).send().await.is_err());

    proxy.set(ProxyFaults {
        latency: Duration::from_millis(100),
        ..Default::default()
    });
    let start = tokio::time::Instant::now();
    assert_eq!(c.get(&url).send().await.unwrap().status(), 200);
    assert!(start.elapsed() >= Duration::from_millis(100));

    proxy.heal();
    assert_eq!(c.get(&url).send().await.unwrap().status(), 200);
    let counts = proxy.counts();
    assert_eq!(counts.throttled.load(Ordering::SeqCst), 1);
    assert_eq!(counts.lost.load(Ordering::SeqCst), 1);
    assert_eq!(counts.blackholed.load(Ordering::SeqCst), 1);
    assert!(counts.refused.load(Ordering::SeqCst) >= 1);
    assert_eq!(counts.forwarded.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_fraction_of_requests_is_throttled() {
    let (up, applied) = upstream().await;
    let proxy = FaultProxy::start(&up, 42).await.unwrap();
    proxy.set(ProxyFaults {
        throttle_fraction: 0.3,
        ..Default::default()
    });
    let c = client();
    let mut throttled = 0;
    for _ in 0..200 {
        if c.get(format!("{}/y", proxy.url()))
            .send()
            .await
            .unwrap()
            .status()
            == 503
        {
            throttled += 1;
        }
    }
    assert!(
        (30..=90).contains(&throttled),
        "{throttled} of 200 throttled at 30 %"
    );
    assert_eq!(applied.count(), 200 - throttled);
}

#[tokio::test]
async fn a_late_request_lands_after_its_client_gave_up() {
    let (up, applied) = upstream().await;
    let proxy = FaultProxy::start(&up, 7).await.unwrap();
    proxy.set(ProxyFaults {
        late_fraction: 1.0,
        late_by: Duration::from_millis(800),
        ..Default::default()
    });
    let err = client()
        .put(format!("{}/z", proxy.url()))
        .body("late")
        .send()
        .await;
    assert!(err.unwrap_err().is_timeout());
    assert_eq!(applied.count(), 0, "not yet");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(applied.count(), 1, "applied after the client's timeout");
    assert_eq!(proxy.counts().late.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn planned_faults_take_the_requests_they_match_after_skipping_some() {
    let (up, applied) = upstream().await;
    let proxy = FaultProxy::start(&up, 1).await.unwrap();
    let c = client();
    let op = |name: &str| {
        c.post(format!("{}/", proxy.url()))
            .header("x-amz-target", format!("DynamoDB_20120810.{name}"))
            .body("{}")
            .send()
    };
    proxy.inject(
        Rule::new(
            Match::aws("UpdateItem"),
            Fault::Answer(Canned::aws_throttling()),
        )
        .times(2),
    );
    proxy.inject(Rule::new(Match::aws("GetItem"), Fault::LoseResponse).after(1));
    // The throttling answer is DynamoDB's own, and only UpdateItem gets it.
    let r = op("UpdateItem").await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.headers()["content-type"], "application/x-amz-json-1.0");
    assert!(r.text().await.unwrap().contains("ThrottlingException"));
    assert_eq!(op("PutItem").await.unwrap().status(), 200);
    assert_eq!(op("UpdateItem").await.unwrap().status(), 400);
    assert_eq!(op("UpdateItem").await.unwrap().status(), 200, "spent");
    // The first GetItem goes through, the second is applied and its answer lost.
    assert_eq!(op("GetItem").await.unwrap().status(), 200);
    assert!(op("GetItem").await.is_err());
    assert_eq!(op("GetItem").await.unwrap().status(), 200, "spent");
    assert_eq!(applied.count(), 5);
    let requests = proxy.requests();
    assert_eq!(requests.get("UpdateItem"), Some(&3));
    assert_eq!(requests.get("GetItem"), Some(&3));
    assert_eq!(requests.get("PutItem"), Some(&1));
    proxy.reset_requests();
    assert!(proxy.requests().is_empty());

    // A dropped connection: not forwarded, no answer. A path match.
    proxy.inject(Rule::new(
        Match::path(reqwest::Method::POST, "/upload"),
        Fault::Drop,
    ));
    assert_eq!(
        c.post(format!("{}/other", proxy.url()))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert!(
        c.post(format!("{}/upload/b", proxy.url()))
            .body("x")
            .send()
            .await
            .is_err()
    );
    assert_eq!(applied.count(), 6);
    assert_eq!(proxy.counts().dropped.load(Ordering::SeqCst), 1);
    assert_eq!(
        proxy.requests().get("POST /upload/b"),
        Some(&1),
        "{:?}",
        proxy.requests()
    );

    // Canned answers of GCS and Azure; rules can be cleared.
    proxy.inject(Rule::new(Match::Any, Fault::Answer(Canned::gcs(429))));
    let r = c.get(proxy.url()).send().await.unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.text().await.unwrap().contains("rateLimitExceeded"));
    proxy.inject(Rule::new(
        Match::Any,
        Fault::Answer(Canned::azure_server_busy()),
    ));
    let r = c.get(proxy.url()).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["x-ms-error-code"], "ServerBusy");
    proxy.inject(Rule::new(Match::Any, Fault::Drop).times(100));
    proxy.clear_rules();
    assert_eq!(c.get(proxy.url()).send().await.unwrap().status(), 200);
}

#[tokio::test]
async fn a_held_response_is_applied_and_never_answered() {
    let (up, applied) = upstream().await;
    let proxy = FaultProxy::start(&up, 1).await.unwrap();
    proxy.inject(Rule::new(
        Match::Any,
        Fault::HoldResponse(Duration::from_secs(60)),
    ));
    let started = tokio::time::Instant::now();
    let err = client()
        .put(proxy.url())
        .body("x")
        .send()
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(applied.count(), 1);
    assert_eq!(proxy.counts().lost.load(Ordering::SeqCst), 1);

    proxy.inject(Rule::new(
        Match::Any,
        Fault::Delay(Duration::from_millis(200)),
    ));
    let started = tokio::time::Instant::now();
    assert_eq!(
        client().get(proxy.url()).send().await.unwrap().status(),
        200
    );
    assert!(started.elapsed() >= Duration::from_millis(200));
}

/// The GCS client uploads with a chunked body: it reaches the upstream de-chunked, with a
/// Content-Length.
#[tokio::test]
async fn a_chunked_body_reaches_the_upstream_with_a_content_length() {
    let (up, applied) = upstream().await;
    let proxy = FaultProxy::start(&up, 1).await.unwrap();
    let mut client = TcpStream::connect(proxy.url().trim_start_matches("http://"))
        .await
        .unwrap();
    client
        .write_all(
            b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
              6\r\nhello \r\n5;ext=1\r\nworld\r\n0\r\nTrailer: t\r\n\r\n",
        )
        .await
        .unwrap();
    let mut answer = String::new();
    client.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let seen = applied.last();
    let lower = seen.to_ascii_lowercase();
    assert!(lower.contains("content-length: 11\r\n"), "{seen}");
    assert!(!lower.contains("transfer-encoding"), "{seen}");
    assert!(seen.ends_with("\r\n\r\nhello world"), "{seen}");
}
