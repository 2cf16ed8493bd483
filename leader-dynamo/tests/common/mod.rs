//! Shared test helpers: the moto harness and a fault-injecting, request-counting TCP proxy.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue;
use integration_tests::{Emulator, require};
use leader_core::conformance::{ConformantStore, Harness};
use leader_core::{Error, LeaseKey, Timing};
use leader_dynamo::{DynamoBuilder, DynamoStore, LEASE_PREFIX, MARK_PREFIX};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::OnceCell;

/// A short timing that the serialized moto server meets even when ten cases run at once on
/// a loaded 2-core machine: ttl 3 s, request timeout 500 ms (150 ms was seen to time out).
pub(crate) fn timing() -> Timing {
    let mut t = Timing::from_ttl(Duration::from_millis(3000));
    t.request_timeout = Duration::from_millis(500);
    t.margin = Duration::from_millis(1000);
    t.validate().unwrap();
    t
}

/// The emulator's endpoint URL.
pub(crate) async fn moto_url() -> String {
    require(Emulator::DynamoDb)
        .await
        .expect("the DynamoDB emulator is required")
        .url
}

/// A store on `table` through `url`, creating the table if needed.
pub(crate) async fn store_at(url: &str, table: &str) -> DynamoStore {
    DynamoBuilder::new()
        .with_emulator(url)
        .with_table(table)
        .with_create_table_if_missing(true)
        .build()
        .await
        .unwrap()
}

/// A plain SDK client of the emulator at `url`, for what an operator does by hand.
pub(crate) fn raw_client(url: &str) -> aws_sdk_dynamodb::Client {
    let endpoint = integration_tests::Endpoint {
        emulator: Emulator::DynamoDb,
        url: url.to_owned(),
        source: integration_tests::Source::Env,
    };
    integration_tests::dynamodb::client(&endpoint)
}

/// Deletes the lease item of `key`, as an operator recovering a stuck lease does.
pub(crate) async fn delete_lease(url: &str, table: &str, key: &LeaseKey) {
    raw_client(url)
        .delete_item()
        .table_name(table)
        .key("pk", AttributeValue::S(format!("{LEASE_PREFIX}{key}")))
        .send()
        .await
        .unwrap();
}

/// The attributes of the item with partition key `pk`, read directly (consistently).
pub(crate) async fn raw_item(
    url: &str,
    table: &str,
    pk: String,
) -> Option<std::collections::HashMap<String, AttributeValue>> {
    raw_client(url)
        .get_item()
        .table_name(table)
        .key("pk", AttributeValue::S(pk))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
}

/// The token high-water mark of `key` as stored (`None` if the item is absent).
pub(crate) async fn mark_of(url: &str, table: &str, key: &LeaseKey) -> Option<u64> {
    let item = raw_item(url, table, format!("{MARK_PREFIX}{key}")).await?;
    match item.get("high") {
        Some(AttributeValue::N(n)) => Some(n.parse().unwrap()),
        other => panic!("the mark of {key} is not a number: {other:?}"),
    }
}

/// One table per harness (that is, per conformance case).
pub(crate) struct Moto {
    table: String,
    url: OnceCell<String>,
    next: AtomicU64,
}

pub(crate) fn moto() -> Moto {
    Moto {
        table: integration_tests::unique_name("leases"),
        url: OnceCell::new(),
        next: AtomicU64::new(0),
    }
}

impl Moto {
    async fn url(&self) -> &str {
        self.url.get_or_init(moto_url).await
    }
}

#[async_trait]
impl Harness for Moto {
    async fn store(&self) -> Result<Arc<dyn ConformantStore>, Error> {
        // A new client per call, as another process would have.
        Ok(Arc::new(store_at(self.url().await, &self.table).await))
    }

    fn unique_key(&self) -> LeaseKey {
        LeaseKey::new(format!(
            "case-{}",
            self.next.fetch_add(1, Ordering::Relaxed)
        ))
        .unwrap()
    }

    fn timing(&self) -> Timing {
        timing()
    }

    async fn plant_malformed(&self, key: &LeaseKey) -> Result<(), Error> {
        let url = self.url().await.to_owned();
        store_at(&url, &self.table).await;
        let endpoint = integration_tests::Endpoint {
            emulator: Emulator::DynamoDb,
            url,
            source: integration_tests::Source::Env,
        };
        integration_tests::dynamodb::client(&endpoint)
            .put_item()
            .table_name(&self.table)
            .item("pk", AttributeValue::S(format!("{LEASE_PREFIX}{key}")))
            .item("holder", AttributeValue::N("5".to_owned()))
            .item("token", AttributeValue::S("not a number".to_owned()))
            .send()
            .await
            .unwrap();
        Ok(())
    }

    async fn delete_record(&self, key: &LeaseKey) -> Result<(), Error> {
        let endpoint = integration_tests::Endpoint {
            emulator: Emulator::DynamoDb,
            url: self.url().await.to_owned(),
            source: integration_tests::Source::Env,
        };
        integration_tests::dynamodb::client(&endpoint)
            .delete_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(format!("{LEASE_PREFIX}{key}")))
            .send()
            .await
            .unwrap();
        Ok(())
    }
}

/// A TCP proxy in front of the emulator that counts requests per DynamoDB operation and can
/// drop the response of the next request of one operation (after the emulator applied it).
pub(crate) struct Proxy {
    pub(crate) url: String,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    counts: Mutex<BTreeMap<String, u64>>,
    /// (operation, hang instead of dropping at once, requests of it to let through first)
    drop_next: Mutex<Option<(String, bool, u64)>>,
    dropped: AtomicU64,
    throttle: Mutex<Option<(String, u64)>>,
}

impl Proxy {
    pub(crate) async fn start(upstream: &str) -> Proxy {
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (s, upstream) = (s.clone(), upstream.clone());
                tokio::spawn(async move {
                    let _ = serve(conn, &upstream, &s).await;
                });
            }
        });
        Proxy { url, shared }
    }

    /// Drop the response to the next request of `operation` (e.g. `UpdateItem`).
    pub(crate) fn drop_next(&self, operation: &str) {
        self.drop_after(operation, 0);
    }

    /// Drop the response to the request of `operation` that follows the next `skip` ones.
    pub(crate) fn drop_after(&self, operation: &str, skip: u64) {
        *self.shared.drop_next.lock().unwrap() = Some((operation.to_owned(), false, skip));
    }

    /// Hold the response to the next request of `operation` for a minute (the client times
    /// out), after the emulator applied it.
    pub(crate) fn hang_next(&self, operation: &str) {
        *self.shared.drop_next.lock().unwrap() = Some((operation.to_owned(), true, 0));
    }

    /// Answer the next `times` requests of `operation` with a `ThrottlingException`, without
    /// forwarding them.
    pub(crate) fn throttle_next(&self, operation: &str, times: u64) {
        *self.shared.throttle.lock().unwrap() = Some((operation.to_owned(), times));
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    pub(crate) fn counts(&self) -> BTreeMap<String, u64> {
        self.shared.counts.lock().unwrap().clone()
    }

    pub(crate) fn reset_counts(&self) {
        self.shared.counts.lock().unwrap().clear();
    }
}

struct Message {
    bytes: Vec<u8>,
    head: String,
}

impl Message {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    }
}

async fn read_message<R: AsyncBufReadExt + Unpin>(r: &mut R) -> std::io::Result<Option<Message>> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).await? == 0 {
            return Ok(None);
        }
        let end = line == "\r\n";
        head.push_str(&line);
        if end {
            break;
        }
    }
    let mut msg = Message {
        bytes: head.clone().into_bytes(),
        head,
    };
    match msg.header("content-length") {
        Some(n) => {
            let mut body = vec![0; n.parse().unwrap()];
            r.read_exact(&mut body).await?;
            msg.bytes.extend(body);
        }
        None if msg.head.starts_with("HTTP/") => {
            r.read_to_end(&mut msg.bytes).await?;
        }
        None => {}
    }
    Ok(Some(msg))
}

async fn serve(conn: TcpStream, upstream: &str, shared: &Shared) -> std::io::Result<()> {
    let mut client = BufReader::new(conn);
    loop {
        let Some(request) = read_message(&mut client).await? else {
            return Ok(());
        };
        let op = request
            .header("x-amz-target")
            .and_then(|t| t.split('.').nth(1).map(str::to_owned))
            .unwrap_or_else(|| "other".to_owned());
        *shared.counts.lock().unwrap().entry(op.clone()).or_default() += 1;
        let throttled = {
            let mut t = shared.throttle.lock().unwrap();
            match t.as_mut() {
                Some((o, n)) if *o == op && *n > 0 => {
                    *n -= 1;
                    true
                }
                _ => false,
            }
        };
        if throttled {
            let body = r#"{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException","message":"Rate of requests exceeds the allowed throughput."}"#;
            let response = format!(
                "HTTP/1.1 400 Bad Request\r\nContent-Type: application/x-amz-json-1.0\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            client.get_mut().write_all(response.as_bytes()).await?;
            return Ok(());
        }
        let mut up = BufReader::new(TcpStream::connect(upstream).await?);
        up.get_mut().write_all(&request.bytes).await?;
        let Some(response) = read_message(&mut up).await? else {
            return Ok(());
        };
        let drop_it = {
            let mut d = shared.drop_next.lock().unwrap();
            match d.take() {
                Some((o, hang, 0)) if o == op => Some(hang),
                Some((o, hang, skip)) if o == op => {
                    *d = Some((o, hang, skip - 1));
                    None
                }
                other => {
                    *d = other;
                    None
                }
            }
        };
        if let Some(hang) = drop_it {
            if hang {
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            // The emulator applied the request; the client never hears of it.
            shared.dropped.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        client.get_mut().write_all(&response.bytes).await?;
        if response
            .header("connection")
            .is_some_and(|c| c.eq_ignore_ascii_case("close"))
        {
            return Ok(());
        }
    }
}
