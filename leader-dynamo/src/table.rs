//! The table: checked (and created on request) when the store is built.

use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableStatus,
};
use leader_core::Error;
use tokio::time::Instant;

use leader_core::backend::call_budget;

use crate::client::DynamoStore;
use crate::error::{DynamoError, Op, map_sdk};

/// The least time each call of the table check has.
const TABLE_BUDGET: Duration = Duration::from_secs(5);

impl DynamoStore {
    /// Checks that the table exists with the right key schema; creates it (on-demand billing)
    /// if it is missing and `create` is set.
    pub(crate) async fn ensure_table(&self, create: bool, wait: Duration) -> Result<(), Error> {
        // Not part of an election: the table check may take longer than a store call.
        let budget = call_budget().max(TABLE_BUDGET);
        let described = self
            .call(Op::Table)
            .with_budget(budget)
            .run(|left| async move {
                self.client
                    .describe_table()
                    .table_name(&self.ctx.table)
                    .customize()
                    .config_override(Self::attempt_config(left))
                    .send()
                    .await
                    .map_err(|e| map_sdk(Op::Table, &self.ctx, e))
            })
            .await;
        let table = match described {
            Ok(out) => out.table,
            Err(Error::NotFound { .. }) if create => {
                self.create_table(budget).await?;
                return self.wait_active(wait).await;
            }
            Err(e) => return Err(e),
        };
        let schema = table
            .as_ref()
            .map(|t| t.key_schema().to_vec())
            .unwrap_or_default();
        let types = table
            .as_ref()
            .map(|t| t.attribute_definitions().to_vec())
            .unwrap_or_default();
        let pk_is_string = types.iter().any(|d| {
            d.attribute_name() == self.partition_key
                && *d.attribute_type() == ScalarAttributeType::S
        });
        let ok = schema.len() == 1
            && schema.iter().all(|k| {
                k.attribute_name() == self.partition_key && *k.key_type() == KeyType::Hash
            })
            && pk_is_string;
        if !ok {
            let found = schema
                .iter()
                .map(|k| format!("{} ({})", k.attribute_name(), k.key_type().as_str()))
                .collect::<Vec<_>>()
                .join(", ");
            let source = DynamoError::KeySchema {
                table: self.ctx.table.clone(),
                found: if found.is_empty() {
                    "unknown".to_owned()
                } else {
                    found
                },
                expected: self.partition_key.clone(),
            };
            return Err(Error::InvalidConfig {
                message: source.to_string(),
                source: Some(Box::new(source)),
            });
        }
        Ok(())
    }

    async fn create_table(&self, budget: Duration) -> Result<(), Error> {
        let bad =
            |e: aws_sdk_dynamodb::error::BuildError| Error::backend("building CreateTable", e);
        let definition = AttributeDefinition::builder()
            .attribute_name(&self.partition_key)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .map_err(bad)?;
        let key = KeySchemaElement::builder()
            .attribute_name(&self.partition_key)
            .key_type(KeyType::Hash)
            .build()
            .map_err(bad)?;
        tracing::info!(table = %self.ctx.table, "creating the DynamoDB table (on-demand)");
        let created = self
            .client
            .create_table()
            .table_name(&self.ctx.table)
            .attribute_definitions(definition)
            .key_schema(key)
            .billing_mode(BillingMode::PayPerRequest)
            .customize()
            .config_override(Self::attempt_config(budget))
            .send()
            .await;
        match created {
            Ok(_) => Ok(()),
            // Another instance created it first.
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_in_use_exception()) =>
            {
                Ok(())
            }
            Err(e) => Err(map_sdk(Op::Table, &self.ctx, e)),
        }
    }

    async fn wait_active(&self, wait: Duration) -> Result<(), Error> {
        let until = Instant::now() + wait;
        loop {
            let status = self
                .client
                .describe_table()
                .table_name(&self.ctx.table)
                .customize()
                .config_override(Self::attempt_config(TABLE_BUDGET))
                .send()
                .await
                .ok()
                .and_then(|out| out.table.and_then(|t| t.table_status));
            if status == Some(TableStatus::Active) {
                return Ok(());
            }
            if Instant::now() >= until {
                return Err(Error::Unavailable {
                    message: format!(
                        "DynamoDB table {:?} did not become active within {wait:?}",
                        self.ctx.table
                    ),
                    source: None,
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
