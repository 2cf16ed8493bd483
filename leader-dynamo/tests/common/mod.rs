//! Shared test helpers: the moto harness and the fault proxy in front of moto.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue;
use integration_tests::proxy::FaultProxy;
use integration_tests::{Emulator, require};
use leader_core::conformance::{ConformantStore, Harness, unique_key};
use leader_core::{Error, LeaseKey, Timing};
use leader_dynamo::{DynamoBuilder, DynamoStore, LEASE_PREFIX, MARK_PREFIX};
use tokio::sync::OnceCell;

/// A short timing that the serialized moto server meets even when ten cases run at once on
/// a loaded 2-core machine: ttl 3 s, request timeout 500 ms (150 ms was seen to time out).
pub(crate) fn timing() -> Timing {
    let mut t = Timing::from_ttl(Duration::from_millis(3000));
    t.request_timeout = Duration::from_millis(500);
    t.margin = Duration::from_millis(1000);
    t.renew_every = Duration::from_secs(1);
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
}

pub(crate) fn moto() -> Moto {
    Moto {
        table: integration_tests::unique_name("leases"),
        url: OnceCell::new(),
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
        unique_key("case").unwrap()
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

/// The suite's fault proxy in front of the emulator at `url`: it counts requests per DynamoDB
/// operation ([`FaultProxy::requests`]) and injects planned faults.
pub(crate) async fn proxy(url: &str) -> FaultProxy {
    FaultProxy::in_front_of(url, 1).await.unwrap()
}
