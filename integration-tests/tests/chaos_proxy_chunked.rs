//! The proxy forwards a chunked request body de-chunked (the GCS client uploads that way).
#![allow(clippy::unwrap_used)]

use integration_tests::proxy::FaultProxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[tokio::test]
async fn a_chunked_body_reaches_the_upstream_with_a_content_length() {
    let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = upstream.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut conn, _) = upstream.accept().await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        // The proxy sends the whole request, then waits for the answer.
        while !String::from_utf8_lossy(&got).contains("hello world") {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "{}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
        conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .await
            .unwrap();
        conn.shutdown().await.unwrap();
        String::from_utf8(got).unwrap()
    });
    let proxy = FaultProxy::start(&addr.to_string(), 1).await.unwrap();
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
    let seen = server.await.unwrap();
    assert!(seen.contains("Content-Length: 11\r\n"), "{seen}");
    assert!(
        !seen.to_ascii_lowercase().contains("transfer-encoding"),
        "{seen}"
    );
    assert!(seen.ends_with("\r\n\r\nhello world"), "{seen}");
}
