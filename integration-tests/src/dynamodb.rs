//! An `aws-sdk-dynamodb` client for the emulator, and a table helper.

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
};

use crate::Endpoint;

/// The name of the partition key of the tables that [`create_table`] makes (a string).
pub const PARTITION_KEY: &str = "pk";

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

/// A client for the emulator at `endpoint`: static credentials (`AWS_ACCESS_KEY_ID` /
/// `AWS_SECRET_ACCESS_KEY`, default `test`), `AWS_REGION` (default `us-east-1`), plain HTTP,
/// and no automatic retries, so that a conditional write is sent exactly once.
pub fn client(endpoint: &Endpoint) -> Client {
    let credentials = Credentials::new(
        env_or("AWS_ACCESS_KEY_ID", "test"),
        env_or("AWS_SECRET_ACCESS_KEY", "test"),
        None,
        None,
        "leader-lease-emulator",
    );
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(&endpoint.url)
        .region(Region::new(env_or("AWS_REGION", "us-east-1")))
        .credentials_provider(credentials)
        .retry_config(RetryConfig::disabled())
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .build();
    Client::from_conf(config)
}

/// Creates an on-demand table with a string partition key [`PARTITION_KEY`] and waits until it
/// is active.
pub async fn create_table(client: &Client, table: &str) -> Result<(), aws_sdk_dynamodb::Error> {
    client
        .create_table()
        .table_name(table)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(PARTITION_KEY)
                .attribute_type(ScalarAttributeType::S)
                .build()?,
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name(PARTITION_KEY)
                .key_type(KeyType::Hash)
                .build()?,
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await?;
    // moto creates tables active; DynamoDB Local (LocalStack) may take a moment.
    for _ in 0..100 {
        let status = client
            .describe_table()
            .table_name(table)
            .send()
            .await?
            .table
            .and_then(|t| t.table_status);
        if status == Some(aws_sdk_dynamodb::types::TableStatus::Active) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Ok(())
}
