//! The fault-injecting proxy, against a tiny HTTP server of the test's own.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use integration_tests::proxy::{FaultProxy, ProxyFaults};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Answers every request with `ok` and counts the requests it received (it "applies" them).
async fn upstream() -> (String, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicU64::new(0));
    let c = count.clone();
    tokio::spawn(async move {
        loop {
            let (mut conn, _) = listener.accept().await.unwrap();
            let c = c.clone();
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
                c.fetch_add(1, Ordering::SeqCst);
                let _ = conn
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await;
                let _ = conn.shutdown().await;
            });
        }
    });
    (addr.to_string(), count)
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
    assert_eq!(applied.load(Ordering::SeqCst), 1);

    proxy.set(ProxyFaults {
        throttle_fraction: 1.0,
        throttle_status: 429,
        ..Default::default()
    });
    assert_eq!(c.get(&url).send().await.unwrap().status(), 429);
    assert_eq!(
        applied.load(Ordering::SeqCst),
        1,
        "a throttled request is not forwarded"
    );

    proxy.set(ProxyFaults {
        lose_response_fraction: 1.0,
        ..Default::default()
    });
    assert!(c.put(&url).body("x").send().await.is_err());
    assert_eq!(
        applied.load(Ordering::SeqCst),
        2,
        "a lost response was still applied"
    );

    proxy.set(ProxyFaults {
        blackhole: true,
        ..Default::default()
    });
    let err = c.get(&url).send().await.unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert_eq!(applied.load(Ordering::SeqCst), 2);

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
    assert_eq!(applied.load(Ordering::SeqCst), 200 - throttled);
}
