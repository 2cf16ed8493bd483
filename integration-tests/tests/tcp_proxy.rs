//! The byte-level fault proxy, against a tiny echo server of the test's own on loopback that
//! counts its open connections and the bytes it receives.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use integration_tests::tcp_proxy::TcpFaultProxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{sleep, timeout};

/// How long a reply may take when one is due, and how long "no reply" is waited for.
const DUE: Duration = Duration::from_secs(5);
const SILENCE: Duration = Duration::from_millis(300);

/// What the echo server saw.
#[derive(Default)]
struct Seen {
    open: AtomicU64,
    received: AtomicU64,
}

/// Echoes every byte back on each connection; passes a half-close on.
async fn echo_server() -> (SocketAddr, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let counts = seen.clone();
    tokio::spawn(async move {
        loop {
            let (mut conn, _) = listener.accept().await.unwrap();
            let counts = counts.clone();
            tokio::spawn(async move {
                counts.open.fetch_add(1, Ordering::SeqCst);
                let mut buf = [0u8; 4096];
                loop {
                    match conn.read(&mut buf).await {
                        Ok(0) => {
                            let _ = conn.shutdown().await;
                            break;
                        }
                        Ok(n) => {
                            counts.received.fetch_add(n as u64, Ordering::SeqCst);
                            if conn.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                        Err(_) => break,
                    }
                }
                counts.open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (addr, seen)
}

async fn connect(proxy: &TcpFaultProxy) -> TcpStream {
    TcpStream::connect(proxy.addr()).await.unwrap()
}

/// Sends `msg` and reads the echo.
async fn round_trip(conn: &mut TcpStream, msg: &[u8]) {
    conn.write_all(msg).await.unwrap();
    let mut back = vec![0u8; msg.len()];
    timeout(DUE, conn.read_exact(&mut back))
        .await
        .expect("no echo in time")
        .unwrap();
    assert_eq!(back, msg);
}

/// Whether the connection was closed (EOF or an error) within `within`; any data is a failure.
async fn closed_within(conn: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 64];
    match timeout(within, conn.read(&mut buf)).await {
        Err(_) => false,
        Ok(Ok(0) | Err(_)) => true,
        Ok(Ok(n)) => panic!("unexpected {n} bytes: {:?}", &buf[..n]),
    }
}

/// Polls `cond` until it holds (or fails the test after `DUE`).
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + DUE;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn forwards_both_ways_with_half_close_and_counts() {
    let (upstream, seen) = echo_server().await;
    let proxy = TcpFaultProxy::start(upstream).await.unwrap();
    assert_eq!(
        proxy.endpoint(),
        format!("127.0.0.1:{}", proxy.addr().port())
    );

    let mut a = connect(&proxy).await;
    round_trip(&mut a, b"hello").await;

    // A large payload in both directions, then a half-close: the echo ends, then EOF.
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let mut b = connect(&proxy).await;
    let (mut read, mut write) = b.split();
    let send = async {
        write.write_all(&payload).await.unwrap();
        write.shutdown().await.unwrap();
    };
    let mut back = Vec::new();
    let receive = read.read_to_end(&mut back);
    let ((), received) = timeout(DUE, async { tokio::join!(send, receive) })
        .await
        .unwrap();
    received.unwrap();
    assert!(back == payload, "the echo differs");

    let total = 5 + payload.len() as u64;
    eventually("all bytes counted", || {
        let c = proxy.counters();
        c.bytes_to_upstream == total && c.bytes_to_client == total
    })
    .await;
    assert_eq!(seen.received.load(Ordering::SeqCst), total);
    let c = proxy.counters();
    assert_eq!(
        (c.accepted, c.refused, c.reset, c.upstream_failed),
        (2, 0, 0, 0)
    );
    eventually("b closed", || proxy.counters().open == 1).await;
    drop(a);
    eventually("all closed", || proxy.counters().open == 0).await;
}

#[tokio::test]
async fn partition_holds_everything_and_heal_closes_what_it_held() {
    let (upstream, seen) = echo_server().await;
    let proxy = TcpFaultProxy::start(upstream).await.unwrap();
    let mut old = connect(&proxy).await;
    round_trip(&mut old, b"before").await;
    let forwarded = proxy.counters().bytes_to_upstream;

    proxy.partition(true);
    // An open connection: the request gets no answer, and the connection stays open.
    old.write_all(b"ping").await.unwrap();
    assert!(
        !closed_within(&mut old, SILENCE).await,
        "closed during the partition"
    );
    // A new one is accepted but never reaches the upstream.
    let mut during = connect(&proxy).await;
    during.write_all(b"ping").await.unwrap();
    assert!(
        !closed_within(&mut during, SILENCE).await,
        "closed during the partition"
    );
    assert_eq!(proxy.counters().bytes_to_upstream, forwarded);
    assert_eq!(seen.received.load(Ordering::SeqCst), forwarded);
    assert_eq!(seen.open.load(Ordering::SeqCst), 1);
    assert_eq!(proxy.counters().open, 2);

    proxy.heal();
    // Both held connections are closed, on the client's side and on the upstream's.
    assert!(
        closed_within(&mut old, DUE).await,
        "old connection not closed"
    );
    assert!(
        closed_within(&mut during, DUE).await,
        "new connection not closed"
    );
    eventually("upstream side closed", || {
        seen.open.load(Ordering::SeqCst) == 0
    })
    .await;
    eventually("proxy connections gone", || proxy.counters().open == 0).await;
    assert_eq!(proxy.counters().reset, 2);
    // The held bytes were dropped, and a new connection works.
    assert_eq!(seen.received.load(Ordering::SeqCst), forwarded);
    let mut fresh = connect(&proxy).await;
    round_trip(&mut fresh, b"after").await;
}

#[tokio::test]
async fn a_partition_that_came_and_went_still_closes_open_connections() {
    let (upstream, _) = echo_server().await;
    let proxy = TcpFaultProxy::start(upstream).await.unwrap();
    let mut conn = connect(&proxy).await;
    round_trip(&mut conn, b"x").await;
    // Too quick for the connection's task to see the partition itself.
    proxy.partition(true);
    proxy.partition(false);
    assert!(
        closed_within(&mut conn, DUE).await,
        "not closed after the partition"
    );
    assert_eq!(proxy.counters().reset, 1);
}

#[tokio::test]
async fn refuse_new_closes_new_connections_only() {
    let (upstream, _) = echo_server().await;
    let proxy = TcpFaultProxy::start(upstream).await.unwrap();
    let mut open = connect(&proxy).await;
    round_trip(&mut open, b"one").await;

    proxy.refuse_new(true);
    let mut refused = connect(&proxy).await;
    assert!(
        closed_within(&mut refused, DUE).await,
        "a new connection was not closed"
    );
    assert_eq!(proxy.counters().refused, 1);
    round_trip(&mut open, b"two").await;

    proxy.refuse_new(false);
    let mut again = connect(&proxy).await;
    round_trip(&mut again, b"three").await;
    proxy.refuse_new(true);
    proxy.heal(); // ends the refusal too
    let mut healed = connect(&proxy).await;
    round_trip(&mut healed, b"four").await;
    let c = proxy.counters();
    assert_eq!((c.accepted, c.refused, c.reset), (4, 1, 0));
}

#[tokio::test]
async fn reset_all_closes_open_connections_and_new_ones_work() {
    let (upstream, seen) = echo_server().await;
    let proxy = TcpFaultProxy::start(upstream).await.unwrap();
    let mut a = connect(&proxy).await;
    let mut b = connect(&proxy).await;
    round_trip(&mut a, b"a").await;
    round_trip(&mut b, b"b").await;

    proxy.reset_all();
    assert!(closed_within(&mut a, DUE).await, "a not closed");
    assert!(closed_within(&mut b, DUE).await, "b not closed");
    eventually("upstream side closed", || {
        seen.open.load(Ordering::SeqCst) == 0
    })
    .await;
    eventually("proxy connections gone", || proxy.counters().open == 0).await;
    assert_eq!(proxy.counters().reset, 2);

    let mut c = connect(&proxy).await;
    round_trip(&mut c, b"c").await;
    assert_eq!(proxy.counters().open, 1);
}

#[tokio::test]
async fn an_unreachable_upstream_closes_the_client() {
    let port = {
        let gone = TcpListener::bind("127.0.0.1:0").await.unwrap();
        gone.local_addr().unwrap()
    };
    let proxy = TcpFaultProxy::start(port).await.unwrap();
    let mut conn = connect(&proxy).await;
    assert!(closed_within(&mut conn, DUE).await, "not closed");
    assert_eq!(proxy.counters().upstream_failed, 1);
}

#[tokio::test]
async fn dropping_the_proxy_closes_everything() {
    let (upstream, seen) = echo_server().await;
    let proxy = TcpFaultProxy::start(upstream.to_string().as_str())
        .await
        .unwrap();
    let addr = proxy.addr();
    let mut forwarding = connect(&proxy).await;
    round_trip(&mut forwarding, b"x").await;
    proxy.partition(true);
    let mut held = connect(&proxy).await;
    sleep(Duration::from_millis(50)).await;

    drop(proxy);
    assert!(
        closed_within(&mut forwarding, DUE).await,
        "forwarding connection open"
    );
    assert!(closed_within(&mut held, DUE).await, "held connection open");
    eventually("upstream side closed", || {
        seen.open.load(Ordering::SeqCst) == 0
    })
    .await;
    // Nothing listens any more.
    let deadline = tokio::time::Instant::now() + DUE;
    while TcpStream::connect(addr).await.is_ok() {
        assert!(tokio::time::Instant::now() < deadline, "still accepting");
        sleep(Duration::from_millis(10)).await;
    }
}
