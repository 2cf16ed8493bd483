//! The calls to DynamoDB: consistent reads, conditional `UpdateItem`s, fenced transactions.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::error::TransactionCanceledException;
use aws_sdk_dynamodb::types::{
    AttributeValue, ConditionCheck, ReturnValue, ReturnValuesOnConditionCheckFailure,
    TransactWriteItem, Update,
};
use leader_core::backend::{Backoff, Call, FencedCas, FencedPut, ObjectWrite, Rng, call_deadline};
use leader_core::backend::{
    Expected, IfChanged, LeaseRecord, Revision, Stored, WriteKind, WriteOutcome, WriteRequest,
};
use leader_core::{Error, FencedObject, FencingToken, LeaseBackend, LeaseKey, ObjectName};
use tokio::time::Instant;
use tracing::{debug, info};

use crate::error::{Context, Op, Reason, failed_condition, map_sdk};
use crate::item::{
    HELD, Item, LEASE_PREFIX, MARK_PREFIX, OBJECT_PREFIX, RELEASED, attr, ms, names, num,
    parse_lease, parse_mark, parse_object, parse_revision, revision_of,
};

/// How many acquiring transactions one write may send: the proposal, then above the mark,
/// then once more if the mark rose again in between (the lease item deleted once more).
const MINT_ATTEMPTS: u32 = 3;

/// The update of every lease write: the whole record, so that the item is exactly the write.
const LEASE_UPDATE: &str = "SET #holder = :holder, #rev = :rev, #token = :token, #ttl = :ttl, \
     #state = :state, #meta = :meta, #nonce = :nonce, #started = :started, #written = :written";

/// A DynamoDB table of lease items and fenced objects. Build it with
/// [`DynamoBuilder`](crate::DynamoBuilder).
///
/// Each lease key is one item whose partition key is `lease#<key>`, plus its token
/// high-water mark `mark#<key>`; each protected object is one item whose partition key is
/// `fenced#<name>`. See the crate docs for the attributes and what an operator may delete.
#[derive(Clone)]
pub struct DynamoStore {
    pub(crate) client: Client,
    pub(crate) partition_key: String,
    pub(crate) ctx: Context,
    pub(crate) backoff: Backoff,
}

impl fmt::Debug for DynamoStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The client's configuration is left out on purpose: it holds the credentials provider.
        f.debug_struct("DynamoStore")
            .field("table", &self.ctx.table)
            .field("partition_key", &self.partition_key)
            .finish_non_exhaustive()
    }
}

/// A conditional write of a lease item, sent as an `UpdateItem` or inside a transaction.
#[derive(Clone, Debug)]
struct LeaseUpdate {
    pk: (String, AttributeValue),
    condition: &'static str,
    names: HashMap<String, String>,
    values: Item,
    /// The `rev` attribute of the item once the write has landed.
    next_rev: u64,
}

impl LeaseUpdate {
    /// What the item is once this write of `record` has landed.
    fn written(&self, record: &LeaseRecord) -> Stored {
        Stored {
            record: record.clone(),
            revision: revision_of(self.next_rev, record.nonce),
        }
    }

    fn set_token(&mut self, token: FencingToken) {
        self.values.insert(":token".to_owned(), num(token.get()));
    }
}

/// The update of every write of a protected object: its fence, value and revision.
const OBJECT_UPDATE: &str = "SET #fence = :token, #value = :value, #orev = :orev";

/// A conditional write of a protected object's item, sent as an `UpdateItem` or inside the
/// fenced transaction.
#[derive(Clone, Debug)]
struct ObjectUpdate {
    pk: (String, AttributeValue),
    condition: &'static str,
    names: HashMap<String, String>,
    values: Item,
    /// The object's revision once the write has landed (its new `object_rev`).
    revision: Revision,
}

/// A transaction that DynamoDB cancelled because an item's condition failed: which item (by
/// position in the transaction), and the item as DynamoDB returned it.
#[derive(Debug)]
struct ConditionFailed {
    item: usize,
    returned: Option<Item>,
}

/// The outcome of a lease write whose condition failed, given the item DynamoDB returned: if
/// that item is exactly this write (an earlier attempt of it landed), a success; else a
/// conflict naming the current record.
fn conflict_or_ours(key: &str, record: &LeaseRecord, old: Option<Item>) -> WriteOutcome {
    let current = old.and_then(|item| parse_lease(key, &item).ok());
    if let Some(c) = &current
        && c.record.holder == record.holder
        && c.record.nonce == record.nonce
    {
        return WriteOutcome::Written(c.clone());
    }
    WriteOutcome::Conflict { current }
}

/// The reasons of a cancelled transaction, as plain data for the mapping in `error.rs`.
fn reasons_of(t: &TransactionCanceledException) -> Vec<Reason> {
    t.cancellation_reasons()
        .iter()
        .map(|r| Reason {
            code: r.code().unwrap_or("None").to_owned(),
            message: r.message().unwrap_or("").to_owned(),
        })
        .collect()
}

impl DynamoStore {
    /// The table this store uses.
    pub fn table(&self) -> &str {
        &self.ctx.table
    }

    /// The name of the table's partition key attribute.
    pub fn partition_key(&self) -> &str {
        &self.partition_key
    }

    /// The SDK settings of one attempt: no SDK retries, and nothing outlives `remaining`.
    pub(crate) fn attempt_config(remaining: Duration) -> aws_sdk_dynamodb::config::Builder {
        let remaining = remaining.max(Duration::from_millis(1));
        aws_sdk_dynamodb::config::Builder::default()
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .operation_timeout(remaining)
                    .operation_attempt_timeout(remaining)
                    .connect_timeout(remaining)
                    .read_timeout(remaining)
                    .build(),
            )
    }

    /// The retry policy of one call of `op`: the core's, with this store's backoff.
    pub(crate) fn call(&self, op: Op) -> Call {
        let call = if op.mutates() {
            Call::write(op.name())
        } else {
            Call::read(op.name())
        };
        call.with_backoff(self.backoff)
    }

    /// Sends one `TransactWriteItems`; a transaction cancelled for a failed condition is
    /// `Ok(Err(_))` naming the item, any other cancellation an error (`what` names the
    /// transaction in it).
    async fn transact(
        &self,
        op: Op,
        what: &'static str,
        items: Vec<TransactWriteItem>,
    ) -> Result<Result<(), ConditionFailed>, Error> {
        self.call(op)
            .run(|left| {
                let items = items.clone();
                async move {
                    let Err(e) = self
                        .client
                        .transact_write_items()
                        .set_transact_items(Some(items))
                        .customize()
                        .config_override(Self::attempt_config(left))
                        .send()
                        .await
                    else {
                        return Ok(Ok(()));
                    };
                    let Some(TransactWriteItemsError::TransactionCanceledException(t)) =
                        e.as_service_error()
                    else {
                        return Err(map_sdk(op, &self.ctx, e));
                    };
                    let item = failed_condition(what, &self.ctx, &reasons_of(t))?;
                    let returned = t
                        .cancellation_reasons()
                        .get(item)
                        .and_then(|r| r.item())
                        .cloned();
                    Ok(Err(ConditionFailed { item, returned }))
                }
            })
            .await
    }

    fn pk(&self, prefix: &str, name: &str) -> (String, AttributeValue) {
        (
            self.partition_key.clone(),
            AttributeValue::S(format!("{prefix}{name}")),
        )
    }

    /// A strongly consistent `GetItem` (1 read unit for an item up to 4 KB).
    async fn get(&self, pk: (String, AttributeValue)) -> Result<Option<Item>, Error> {
        self.get_item(pk, Consistency::Strong).await
    }

    async fn get_item(
        &self,
        pk: (String, AttributeValue),
        consistency: Consistency,
    ) -> Result<Option<Item>, Error> {
        self.call(Op::Read)
            .run(|left| {
                let pk = pk.clone();
                async move {
                    self.client
                        .get_item()
                        .table_name(&self.ctx.table)
                        .key(pk.0, pk.1)
                        .consistent_read(consistency == Consistency::Strong)
                        .customize()
                        .config_override(Self::attempt_config(left))
                        .send()
                        .await
                        .map(|out| out.item)
                        .map_err(|e| map_sdk(Op::Read, &self.ctx, e))
                }
            })
            .await
    }

    async fn read_lease(
        &self,
        key: &LeaseKey,
        consistency: Consistency,
    ) -> Result<Option<Stored>, Error> {
        let item = self
            .get_item(self.pk(LEASE_PREFIX, key.as_str()), consistency)
            .await?;
        item.map(|item| parse_lease(key.as_str(), &item))
            .transpose()
    }

    /// The conditional write of `request` to its lease item.
    fn lease_update(&self, request: &WriteRequest) -> Result<LeaseUpdate, Error> {
        let key = request.key.as_str();
        let record = &request.record;
        let mut n = names(&[
            ("#holder", attr::HOLDER),
            ("#rev", attr::REV),
            ("#token", attr::TOKEN),
            ("#ttl", attr::TTL_MS),
            ("#state", attr::STATE),
            ("#meta", attr::META),
            ("#nonce", attr::NONCE),
            ("#started", attr::STARTED),
            ("#written", attr::WRITTEN),
        ]);
        let state = if record.is_held() { HELD } else { RELEASED };
        let mut v: Item = HashMap::from([
            (
                ":holder".to_owned(),
                AttributeValue::S(record.holder.as_str().to_owned()),
            ),
            (":token".to_owned(), num(record.token.get())),
            (":ttl".to_owned(), num(ms(record.ttl))),
            (":state".to_owned(), AttributeValue::S(state.to_owned())),
            (
                ":meta".to_owned(),
                AttributeValue::M(
                    record
                        .metadata
                        .iter()
                        .map(|(k, v)| (k.clone(), AttributeValue::S(v.clone())))
                        .collect(),
                ),
            ),
            (
                ":nonce".to_owned(),
                AttributeValue::S(record.nonce.to_string()),
            ),
            (":started".to_owned(), num(record.term_started_unix_ms)),
            (":written".to_owned(), num(record.written_unix_ms)),
        ]);
        let (condition, next_rev) = match &request.expected {
            Expected::Absent => {
                n.insert("#pk".to_owned(), self.partition_key.clone());
                ("attribute_not_exists(#pk)", 1)
            }
            Expected::Revision(revision) => {
                let Some((rev, nonce)) = parse_revision(revision) else {
                    return Err(Error::InvalidConfig {
                        message: format!(
                            "revision {revision} of {key} was not made by the DynamoDB backend"
                        ),
                        source: None,
                    });
                };
                v.insert(":old_rev".to_owned(), num(rev));
                v.insert(":old_nonce".to_owned(), AttributeValue::S(nonce));
                (
                    "#rev = :old_rev AND #nonce = :old_nonce",
                    rev.saturating_add(1),
                )
            }
        };
        v.insert(":rev".to_owned(), num(next_rev));
        Ok(LeaseUpdate {
            pk: self.pk(LEASE_PREFIX, key),
            condition,
            names: n,
            values: v,
            next_rev,
        })
    }

    async fn write_lease(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        let lease = self.lease_update(&request)?;
        let key = request.key.as_str();
        let record = request.record;
        if request.kind == WriteKind::Acquire {
            return self.acquire_lease(key, record, lease).await;
        }
        // Renews and releases keep the token: one `UpdateItem` of the lease item, the mark
        // is not touched.
        let outcome = self
            .call(Op::Write)
            .run(|left| {
                let lease = lease.clone();
                async move {
                    self.client
                        .update_item()
                        .table_name(&self.ctx.table)
                        .key(lease.pk.0, lease.pk.1)
                        .update_expression(LEASE_UPDATE)
                        .condition_expression(lease.condition)
                        .set_expression_attribute_names(Some(lease.names))
                        .set_expression_attribute_values(Some(lease.values))
                        .return_values(ReturnValue::AllNew)
                        .return_values_on_condition_check_failure(
                            ReturnValuesOnConditionCheckFailure::AllOld,
                        )
                        .customize()
                        .config_override(Self::attempt_config(left))
                        .send()
                        .await
                        .map(|out| Ok(out.attributes))
                        .or_else(|e| match e.as_service_error() {
                            Some(UpdateItemError::ConditionalCheckFailedException(c)) => {
                                Ok(Err(c.item().cloned()))
                            }
                            _ => Err(map_sdk(Op::Write, &self.ctx, e)),
                        })
                }
            })
            .await?;
        Ok(match outcome {
            Ok(Some(new)) => WriteOutcome::Written(
                parse_lease(key, &new).unwrap_or_else(|_| lease.written(&record)),
            ),
            Ok(None) => WriteOutcome::Written(lease.written(&record)),
            Err(old) => conflict_or_ours(key, &record, old),
        })
    }

    /// Begins a term with one `TransactWriteItems` of two updates: the lease item (on its
    /// condition) and the key's token high-water mark, set to the new token on condition that
    /// it is below it or absent. The mark therefore only ever rises, and it is at least the
    /// token of every term that ever began, whatever happened to the lease item.
    ///
    /// If only the mark's condition fails, the proposed token is not above every earlier one
    /// (the lease item was deleted since the proposer read it): the token is raised above the
    /// mark and the transaction sent again. A cancelled transaction applied nothing, so this
    /// is not a blind retry; anything ambiguous still goes back to the core as indeterminate.
    async fn acquire_lease(
        &self,
        key: &str,
        mut record: LeaseRecord,
        mut lease: LeaseUpdate,
    ) -> Result<WriteOutcome, Error> {
        let deadline = call_deadline();
        let quarter = deadline.saturating_duration_since(Instant::now()) / 4;
        let proposed = record.token;
        for attempt in 0..MINT_ATTEMPTS {
            let left = deadline.saturating_duration_since(Instant::now());
            if attempt > 0 && left < quarter {
                break;
            }
            match self.transact_acquire(key, &lease, record.token).await? {
                Ok(()) => {
                    if record.token != proposed {
                        info!(
                            key,
                            %proposed,
                            token = %record.token,
                            "the lease item had lost its history (deleted?); minted the token \
                             above the key's high-water mark"
                        );
                    }
                    return Ok(WriteOutcome::Written(lease.written(&record)));
                }
                Err(ConditionFailed { item: 0, returned }) => {
                    return Ok(conflict_or_ours(key, &record, returned));
                }
                Err(ConditionFailed { returned, .. }) => {
                    let high = match returned {
                        Some(item) => Some(parse_mark(key, &item)?),
                        // DynamoDB did not return the mark: read it.
                        None => self.read_mark(key).await?,
                    };
                    if let Some(high) = high {
                        let above = high.next().ok_or_else(|| Error::InvalidConfig {
                            message: format!(
                                "the fencing token of {key} reached u64::MAX in its high-water \
                                 mark item ({MARK_PREFIX}{key}); no new term can begin"
                            ),
                            source: None,
                        })?;
                        record.token = record.token.max(above);
                        lease.set_token(record.token);
                    }
                    debug!(key, %proposed, ?high, "the token high-water mark is not below the proposed token; raising it");
                }
            }
        }
        Err(Error::Unavailable {
            message: format!(
                "the token high-water mark of lease {key:?} kept rising while acquiring (is \
                 the lease item being deleted over and over?); nothing was written, try again"
            ),
            source: None,
        })
    }

    /// Sends one acquiring transaction (see [`acquire_lease`](Self::acquire_lease)) with
    /// `token` as the new term's token: item 0 is the lease, item 1 the mark.
    async fn transact_acquire(
        &self,
        key: &str,
        lease: &LeaseUpdate,
        token: FencingToken,
    ) -> Result<Result<(), ConditionFailed>, Error> {
        let build = |e: aws_sdk_dynamodb::error::BuildError| {
            Error::backend("building the acquiring transaction", e)
        };
        let lease_item = Update::builder()
            .table_name(&self.ctx.table)
            .key(lease.pk.0.clone(), lease.pk.1.clone())
            .update_expression(LEASE_UPDATE)
            .condition_expression(lease.condition)
            .set_expression_attribute_names(Some(lease.names.clone()))
            .set_expression_attribute_values(Some(lease.values.clone()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(build)?;
        let mark_pk = self.pk(MARK_PREFIX, key);
        let mark_item = Update::builder()
            .table_name(&self.ctx.table)
            .key(mark_pk.0, mark_pk.1)
            .update_expression("SET #high = :token")
            // A mark that is not a number fails the condition (and is reported malformed)
            // rather than being compared across types.
            .condition_expression(
                "attribute_not_exists(#pk) OR (attribute_type(#high, :number) AND #high < :token)",
            )
            .set_expression_attribute_names(Some(names(&[
                ("#pk", &self.partition_key),
                ("#high", attr::HIGH),
            ])))
            .set_expression_attribute_values(Some(HashMap::from([
                (":token".to_owned(), num(token.get())),
                (":number".to_owned(), AttributeValue::S("N".to_owned())),
            ])))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(build)?;
        let items = vec![
            TransactWriteItem::builder().update(lease_item).build(),
            TransactWriteItem::builder().update(mark_item).build(),
        ];
        self.transact(Op::Write, "acquiring transaction", items)
            .await
    }

    /// Reads the token high-water mark of lease `key`, if it has one.
    async fn read_mark(&self, key: &str) -> Result<Option<FencingToken>, Error> {
        let item = self.get(self.pk(MARK_PREFIX, key)).await?;
        item.map(|item| parse_mark(key, &item)).transpose()
    }

    /// The conditional write of `put`'s object item: the fence's token, the value and a new
    /// random `object_rev`, on condition that the item is as `put.expected`. Both kinds of
    /// fenced write send exactly this, so the item is the same whichever wrote it.
    fn object_update(&self, put: &FencedPut<'_>) -> ObjectUpdate {
        let revision = format!("{:016x}", Rng::from_entropy().next_u64());
        let mut attr_names = names(&[
            ("#fence", attr::FENCE),
            ("#value", attr::VALUE),
            ("#orev", attr::OBJECT_REV),
        ]);
        let mut values = HashMap::from([
            (":token".to_owned(), num(put.fence.token.get())),
            (
                ":value".to_owned(),
                AttributeValue::B(Blob::new(put.value.to_vec())),
            ),
            (":orev".to_owned(), AttributeValue::S(revision.clone())),
        ]);
        let condition = match put.expected {
            Expected::Absent => {
                attr_names.insert("#pk".to_owned(), self.partition_key.clone());
                "attribute_not_exists(#pk)"
            }
            Expected::Revision(r) => {
                values.insert(
                    ":expected".to_owned(),
                    AttributeValue::S(r.as_str().to_owned()),
                );
                "#orev = :expected"
            }
        };
        ObjectUpdate {
            pk: self.pk(OBJECT_PREFIX, put.object.as_str()),
            condition,
            names: attr_names,
            values,
            revision: Revision::new(revision),
        }
    }

    /// The conditional write of a protected object: one `TransactWriteItems` of a
    /// `ConditionCheck` that the lease still has the fence's holder and lease token (item 0) and
    /// the object's update, with the fence's token, on condition that it is as `expected`
    /// (item 1).
    async fn transact_fenced(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        let fence = put.fence;
        let build = |e: aws_sdk_dynamodb::error::BuildError| {
            Error::backend("building the fenced transaction", e)
        };
        let lease_pk = self.pk(LEASE_PREFIX, fence.key.as_str());
        let check = ConditionCheck::builder()
            .table_name(&self.ctx.table)
            .key(lease_pk.0, lease_pk.1)
            .condition_expression("#holder = :holder AND #token = :term AND #state = :held")
            .set_expression_attribute_names(Some(names(&[
                ("#holder", attr::HOLDER),
                ("#token", attr::TOKEN),
                ("#state", attr::STATE),
            ])))
            .set_expression_attribute_values(Some(HashMap::from([
                (
                    ":holder".to_owned(),
                    AttributeValue::S(fence.holder.as_str().to_owned()),
                ),
                (":term".to_owned(), num(fence.lease_token().get())),
                (":held".to_owned(), AttributeValue::S(HELD.to_owned())),
            ])))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(build)?;
        let object = self.object_update(&put);
        let update = Update::builder()
            .table_name(&self.ctx.table)
            .key(object.pk.0, object.pk.1)
            .update_expression(OBJECT_UPDATE)
            .condition_expression(object.condition)
            .set_expression_attribute_names(Some(object.names))
            .set_expression_attribute_values(Some(object.values))
            .build()
            .map_err(build)?;
        let items = vec![
            TransactWriteItem::builder().condition_check(check).build(),
            TransactWriteItem::builder().update(update).build(),
        ];
        Ok(
            match self
                .transact(Op::FencedWrite, "fenced transaction", items)
                .await?
            {
                Ok(()) => ObjectWrite::Written(object.revision),
                // The lease is no longer this holder's term. Its newer token is one of the
                // object's series only when the fence has no separate lease term.
                Err(ConditionFailed { item: 0, returned }) => {
                    let newer = returned
                        .and_then(|item| parse_lease(fence.key.as_str(), &item).ok())
                        .map(|stored| stored.record.token)
                        .filter(|t| fence.lease_term.is_none() && *t > fence.token);
                    return Err(Error::Fenced {
                        object: put.object.to_string(),
                        presented: fence.token,
                        highest: newer,
                    });
                }
                Err(ConditionFailed { .. }) => ObjectWrite::Conflict,
            },
        )
    }

    /// A write of a protected object without the lease check
    /// ([`FencedPut::without_lease_check`]): one conditional `UpdateItem` of the object item,
    /// the same update on the same condition as in the fenced transaction (1 write unit for an
    /// item up to 1 KB, where a transaction costs 2 per item). A failed condition is a
    /// conflict; an unknown outcome is indeterminate, as for every write.
    async fn update_object(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        let object = self.object_update(&put);
        let written = self
            .call(Op::ObjectWrite)
            .run(|left| {
                let object = object.clone();
                async move {
                    let sent = self
                        .client
                        .update_item()
                        .table_name(&self.ctx.table)
                        .key(object.pk.0, object.pk.1)
                        .update_expression(OBJECT_UPDATE)
                        .condition_expression(object.condition)
                        .set_expression_attribute_names(Some(object.names))
                        .set_expression_attribute_values(Some(object.values))
                        .customize()
                        .config_override(Self::attempt_config(left))
                        .send()
                        .await;
                    match sent {
                        Ok(_) => Ok(true),
                        Err(e) => match e.as_service_error() {
                            Some(UpdateItemError::ConditionalCheckFailedException(_)) => Ok(false),
                            _ => Err(map_sdk(Op::ObjectWrite, &self.ctx, e)),
                        },
                    }
                }
            })
            .await?;
        Ok(if written {
            ObjectWrite::Written(object.revision)
        } else {
            ObjectWrite::Conflict
        })
    }
}

/// How a `GetItem` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Consistency {
    /// The latest write (`ConsistentRead`), 1 read unit per 4 KB.
    Strong,
    /// A replica that may lag by up to about a second, half a read unit per 4 KB.
    Eventual,
}

#[async_trait]
impl LeaseBackend for DynamoStore {
    fn name(&self) -> &'static str {
        "dynamodb"
    }

    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        self.read_lease(key, Consistency::Strong).await
    }

    /// An eventually consistent `GetItem`: half a read unit where `read` costs one, and
    /// safe for followers by the contract (a replica may lag, but shows only writes that were
    /// made; every takeover is a conditional write that DynamoDB checks on the latest item).
    /// The whole item is read: DynamoDB rounds a read up to 4 KB, and a lease item is far
    /// below, so a projection would save no read units.
    async fn read_if_changed(
        &self,
        key: &LeaseKey,
        known: Option<&Revision>,
    ) -> Result<IfChanged, Error> {
        let current = self.read_lease(key, Consistency::Eventual).await?;
        Ok(IfChanged::compared(current, known))
    }

    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        self.write_lease(request).await
    }
}

#[async_trait]
impl FencedCas for DynamoStore {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        let item = self.get(self.pk(OBJECT_PREFIX, object.as_str())).await?;
        item.map(|item| parse_object(object.as_str(), &item))
            .transpose()
    }

    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        if put.lease_check {
            self.transact_fenced(put).await
        } else {
            self.update_object(put).await
        }
    }
}
