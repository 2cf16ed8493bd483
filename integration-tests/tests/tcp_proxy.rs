//! The byte-level fault proxy, against a tiny echo server of the test's own on loopback that
//! counts its open connections and the bytes it receives.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use integration_tests::tcp_proxy::{Origins, TcpFaultProxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep, timeout};

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

/// A cut holds the connections of its origin alone: this test process's (traced through its
/// parent, so the walk down the process tree is taken), not one traced to another process or
/// to none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_holds_its_origins_connections_alone_and_its_end_closes_them() {
    let (upstream, seen) = echo_server().await;
    let parent = nix::unistd::getppid().as_raw() as u32;
    let mut sleeper = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let origins = Origins::new();
    origins.set(0, sleeper.id());
    origins.set(2, parent);
    let proxy = TcpFaultProxy::start_traced(upstream, origins.clone())
        .await
        .unwrap();
    let mut ours = connect(&proxy).await;
    round_trip(&mut ours, b"before").await;

    // The cut of another origin (a process that holds no connection here) changes nothing.
    proxy.cut(0, true);
    round_trip(&mut ours, b"not ours").await;
    proxy.cut(0, false);
    round_trip(&mut ours, b"still").await;

    // Our origin's cut holds the open connection and a new one; nothing is forwarded.
    let forwarded = seen.received.load(Ordering::SeqCst);
    proxy.cut(2, true);
    ours.write_all(b"ping").await.unwrap();
    assert!(
        !closed_within(&mut ours, SILENCE).await,
        "closed by the cut"
    );
    let mut during = connect(&proxy).await;
    during.write_all(b"ping").await.unwrap();
    assert!(
        !closed_within(&mut during, SILENCE).await,
        "closed by the cut"
    );
    assert_eq!(seen.received.load(Ordering::SeqCst), forwarded);

    // Registered under another index meanwhile, our new connections are that origin's: the
    // cut of 2 no longer holds them.
    origins.set(2, sleeper.id());
    origins.set(1, parent);
    let mut other = connect(&proxy).await;
    round_trip(&mut other, b"origin 1").await;

    // The cut's end closes what it held; the others go on.
    proxy.cut(2, false);
    assert!(
        closed_within(&mut ours, DUE).await,
        "not closed after the cut"
    );
    assert!(
        closed_within(&mut during, DUE).await,
        "not closed after the cut"
    );
    round_trip(&mut other, b"still open").await;
    assert_eq!(proxy.counters().reset, 2);

    // A partition that begins during a cut holds the connection on after the cut ends; its
    // own end closes it.
    proxy.cut(1, true);
    other.write_all(b"ping").await.unwrap();
    assert!(
        !closed_within(&mut other, SILENCE).await,
        "closed by the cut"
    );
    proxy.partition(true);
    proxy.cut(1, false);
    assert!(
        !closed_within(&mut other, SILENCE).await,
        "closed at the end of the cut while a partition held it"
    );
    proxy.partition(false);
    assert!(
        closed_within(&mut other, DUE).await,
        "not closed after the partition"
    );
    assert_eq!(proxy.counters().untraced, 0);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
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

/// One connection of a byte sink: what it received (when, and what; an empty chunk is the end
/// of stream), and a way to send bytes down to the client.
struct Sink {
    received: mpsc::UnboundedReceiver<(Instant, Vec<u8>)>,
    send: mpsc::UnboundedSender<Vec<u8>>,
}

/// A server that records the bytes it receives on each connection and sends down what its
/// test gives it; one [`Sink`] per accepted connection, in the order of acceptance.
async fn sink_server() -> (SocketAddr, mpsc::UnboundedReceiver<Sink>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (sinks, accepted) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (conn, _) = listener.accept().await.unwrap();
            let (mut read, mut write) = conn.into_split();
            let (received_tx, received) = mpsc::unbounded_channel();
            let (send, mut to_send) = mpsc::unbounded_channel::<Vec<u8>>();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                loop {
                    let n = read.read(&mut buf).await.unwrap_or(0);
                    let _ = received_tx.send((Instant::now(), buf[..n].to_vec()));
                    if n == 0 {
                        break;
                    }
                }
            });
            tokio::spawn(async move {
                while let Some(bytes) = to_send.recv().await {
                    if write.write_all(&bytes).await.is_err() {
                        break;
                    }
                }
            });
            let _ = sinks.send(Sink { received, send });
        }
    });
    (addr, accepted)
}

impl Sink {
    /// Receives until `expected` bytes have come (or the end of stream); returns them with when
    /// the first and the last of them came.
    async fn receive(&mut self, expected: usize) -> (Vec<u8>, Instant, Instant) {
        let mut all = Vec::new();
        let mut first = None;
        let mut last = Instant::now();
        while all.len() < expected {
            let (at, bytes) = timeout(DUE, self.received.recv())
                .await
                .expect("the bytes did not come in time")
                .expect("the sink is gone");
            if bytes.is_empty() {
                break;
            }
            first.get_or_insert(at);
            last = at;
            all.extend_from_slice(&bytes);
        }
        (all, first.unwrap_or(last), last)
    }

    /// Whether the end of stream comes within `within` (no byte may come first).
    async fn ends_within(&mut self, within: Duration) -> bool {
        match timeout(within, self.received.recv()).await {
            Err(_) => false,
            Ok(None) => true,
            Ok(Some((_, bytes))) => {
                assert!(bytes.is_empty(), "unexpected bytes: {bytes:?}");
                true
            }
        }
    }
}

/// The hold of the late-delivery tests, and how soon bytes that are not held must come (well
/// under the hold, with room for a loaded machine).
const HOLD: Duration = Duration::from_millis(800);
const QUICK: Duration = Duration::from_millis(300);

#[tokio::test]
async fn late_delivery_holds_client_bytes_in_order_and_not_the_other_way() {
    let (upstream, mut sinks) = sink_server().await;
    let proxy = TcpFaultProxy::start_seeded(upstream, 7).await.unwrap();
    let mut conn = connect(&proxy).await;
    let mut sink = timeout(DUE, sinks.recv()).await.unwrap().unwrap();

    // Every chunk is held while the fault is on (fraction 1).
    proxy.late(1.0, HOLD);
    let sent = Instant::now();
    conn.write_all(b"first").await.unwrap();
    sleep(Duration::from_millis(100)).await;
    // The fault ends: "second" is not held itself, but it queues behind "first".
    proxy.late(0.0, HOLD);
    conn.write_all(b"second").await.unwrap();

    // Meanwhile the server's bytes reach the client at once.
    sleep(Duration::from_millis(50)).await;
    let down = Instant::now();
    sink.send.send(b"down".to_vec()).unwrap();
    let mut back = [0u8; 4];
    timeout(DUE, conn.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&back, b"down");
    let came_down = Instant::now();
    assert!(
        came_down - down < QUICK,
        "server-to-client bytes were delayed by {:?}",
        came_down - down
    );
    assert!(
        came_down - sent < HOLD,
        "the held bytes delayed the other direction"
    );
    assert_eq!(proxy.counters().bytes_to_upstream, 0, "nothing due yet");
    assert_eq!(proxy.counters().bytes_to_client, 4);

    // Both come after the hold of the first, in order.
    let (got, first, last) = sink.receive(11).await;
    assert_eq!(got, b"firstsecond");
    assert!(first - sent >= HOLD, "held for {:?} only", first - sent);
    assert!(
        last - sent < HOLD + QUICK,
        "\"second\" waited for {:?}, not behind \"first\" only",
        last - sent
    );
    let c = proxy.counters();
    assert_eq!((c.late, c.bytes_to_upstream), (1, 11), "{c:?}");

    // The fault is off: bytes go through at once.
    let sent = Instant::now();
    conn.write_all(b"third").await.unwrap();
    let (got, first, _) = sink.receive(5).await;
    assert_eq!(got, b"third");
    assert!(first - sent < QUICK, "still held");
    // A zero fraction (or hold) is no fault.
    proxy.late(0.0, HOLD);
    proxy.late(1.0, Duration::ZERO);
    let sent = Instant::now();
    round_trip_through(&mut conn, &mut sink, b"fourth").await;
    assert!(sent.elapsed() < QUICK, "held");
    let c = proxy.counters();
    assert_eq!((c.late, c.reset, c.open), (1, 0, 1), "{c:?}");
}

/// Sends `msg` to the sink and waits for it there.
async fn round_trip_through(conn: &mut TcpStream, sink: &mut Sink, msg: &[u8]) {
    conn.write_all(msg).await.unwrap();
    let (got, _, _) = sink.receive(msg.len()).await;
    assert_eq!(got, msg);
}

#[tokio::test]
async fn late_bytes_land_after_the_client_left_and_after_a_heal() {
    let (upstream, mut sinks) = sink_server().await;
    let proxy = TcpFaultProxy::start_seeded(upstream, 7).await.unwrap();
    proxy.late(1.0, HOLD);

    // The client sends, then resets its connection at once: the bytes still land after their
    // hold, then the upstream connection is closed.
    let mut gone = connect(&proxy).await;
    let mut sink = timeout(DUE, sinks.recv()).await.unwrap().unwrap();
    let sent = Instant::now();
    gone.write_all(b"request").await.unwrap();
    sleep(Duration::from_millis(50)).await;
    gone.set_zero_linger().unwrap();
    drop(gone);
    let (got, first, _) = sink.receive(7).await;
    assert_eq!(got, b"request");
    assert!(first - sent >= HOLD, "held for {:?} only", first - sent);
    assert!(
        sink.ends_within(DUE).await,
        "the upstream connection stayed open"
    );
    eventually("the connection closed", || proxy.counters().open == 0).await;

    // The same with a plain close (a half-close passed on after the held bytes).
    let mut closed = connect(&proxy).await;
    let mut sink = timeout(DUE, sinks.recv()).await.unwrap().unwrap();
    let sent = Instant::now();
    closed.write_all(b"bye").await.unwrap();
    drop(closed);
    let (got, first, _) = sink.receive(3).await;
    assert_eq!(got, b"bye");
    assert!(first - sent >= HOLD, "held for {:?} only", first - sent);
    assert!(
        sink.ends_within(DUE).await,
        "the upstream connection stayed open"
    );

    // A heal ends the fault, but what was held still goes out after its hold.
    let mut conn = connect(&proxy).await;
    let mut sink = timeout(DUE, sinks.recv()).await.unwrap().unwrap();
    let sent = Instant::now();
    conn.write_all(b"held").await.unwrap();
    sleep(Duration::from_millis(50)).await;
    proxy.heal();
    let (got, first, _) = sink.receive(4).await;
    assert_eq!(got, b"held");
    assert!(first - sent >= HOLD, "held for {:?} only", first - sent);
    let sent = Instant::now();
    round_trip_through(&mut conn, &mut sink, b"healed").await;
    assert!(sent.elapsed() < QUICK, "still held");
    let c = proxy.counters();
    assert_eq!((c.late, c.reset, c.bytes_to_upstream), (3, 0, 20), "{c:?}");
}

#[tokio::test]
async fn a_reset_drops_held_bytes() {
    let (upstream, mut sinks) = sink_server().await;
    let proxy = TcpFaultProxy::start_seeded(upstream, 7).await.unwrap();
    let mut conn = connect(&proxy).await;
    let mut sink = timeout(DUE, sinks.recv()).await.unwrap().unwrap();
    proxy.late(1.0, HOLD);
    conn.write_all(b"lost").await.unwrap();
    sleep(Duration::from_millis(50)).await;
    proxy.reset_all();
    assert!(closed_within(&mut conn, DUE).await, "not closed");
    // The upstream side ends without the held bytes.
    assert!(
        sink.ends_within(DUE).await,
        "the upstream connection stayed open"
    );
    let c = proxy.counters();
    assert_eq!((c.late, c.reset, c.bytes_to_upstream), (0, 1, 0), "{c:?}");
}

#[tokio::test]
async fn late_delivery_dice_follow_the_fraction() {
    // Chunks one at a time (each waits for the one before to land), half of them held.
    let (upstream, mut sinks) = sink_server().await;
    let proxy = TcpFaultProxy::start_seeded(upstream, 11).await.unwrap();
    let mut conn = connect(&proxy).await;
    let mut sink = timeout(DUE, sinks.recv()).await.unwrap().unwrap();
    let by = Duration::from_millis(40);
    proxy.late(0.5, by);
    for i in 0..40u8 {
        let before = proxy.counters().late;
        let sent = Instant::now();
        round_trip_through(&mut conn, &mut sink, &[i]).await;
        match proxy.counters().late - before {
            0 => {}
            1 => assert!(
                sent.elapsed() >= by,
                "counted late, held {:?}",
                sent.elapsed()
            ),
            n => panic!("one chunk counted {n} times"),
        }
    }
    let late = proxy.counters().late;
    assert!((8..=32).contains(&late), "{late} of 40 held at one half");
}
