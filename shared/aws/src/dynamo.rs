//! The state store on DynamoDB: the state table, the orders table, the sparse, sharded
//! `ByCompleteBy` index the supervisor sweeps, and the concurrency keys' table.
//!
//! # Items
//!
//! State table, key `OrderId` (S). The pattern's fields are top-level attributes, so conditions,
//! the index and an operator's scan see them directly: `ProcessState` (S), `LockedBy` (S, only
//! while Processing), `CompleteBy` (N, epoch ms, only while the record needs watching),
//! `FailureCount` (N), `Attempt` (N), `Revision` (N), and `ExpiryShard` (N), the index's
//! partition key. Everything else (steps, outputs, timeline, ...) is one JSON document in
//! `Body` (B), deflated: a write is billed per started kilobyte, and the repetitive JSON of a
//! record shrinks to about half (items written before hold it as text, S, and read as well;
//! [`body_text`] reads either for tools that read items themselves). An item whose `CompleteBy` is removed drops out of the index: finished orders
//! cost the sweep nothing. `CreatedAt` (N) is projected into that index too, so the oldest
//! order's age is read from it. It holds since when the system has been working on the order
//! without a break: when it was accepted, or when it last came back after a wait, an answer from
//! outside, a pause or an Error; `AcceptedAt` (N) then keeps when it was accepted. (The
//! attribute kept its name when it took this meaning: a projection cannot change without the
//! index being built again.)
//!
//! A second sparse index, `ByAttention`, holds only the orders an operator must look at: an
//! item in Error or Paused, or Processed with a failure reported and not yet acknowledged,
//! carries `Attention` (S, the state) and `AttentionAt` (N, since when),
//! with `AttentionStep` and `CauseKind` projected for filtering. Entering costs one index write
//! and leaving one; orders that never fail never enter it.
//!
//! A third sparse index, `ByHeldService`, holds only the orders that wait for a hold: such an
//! item carries `HeldOn` (S: the service's agent, or `<agent>/<action>` for a hold of one
//! action) and `HeldSince` (N), keys only. An
//! order enters it when its step is held and leaves it when the step resumes, so a waiting
//! order costs nothing per sweep, and a service that opens finds its orders without a scan.
//!
//! The orders in flight are listed from a fourth, `ByWatchedSince`, a page at a time however
//! many there are: only an item in flight carries its partition key, `FlightShard` (N, its
//! `ExpiryShard`); its sort key is `CreatedAt`, and `Workflow` is projected for filtering. An
//! order enters it when accepted and leaves it when it ends, one index write each, and moves
//! (two) when a wait of it begins or ends.
//!
//! Orders table, key `OrderId` (S): `IdempotencyKey` (S), `Order` (S, JSON), `CreatedAt` (N).
//!
//! Keys table: the places and lines of concurrency keys (see [`keys`]).
//!
//! # Writes
//!
//! Every state change is one `PutItem` on the condition
//! `ProcessState = :ps AND Attempt = :a AND Revision = :r`: the record exactly as it was read. A
//! new order is two puts, each on `attribute_not_exists(OrderId)`: the order's item, then its
//! state record (see [`sas_engine::services::Submission`] for why not a transaction).
//! A record is checked before it is written ([`check_write`], as the in-memory store does) and
//! again when it is read: a broken one is refused where it was made, with nothing written.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{
    AttributeValue, KeysAndAttributes, ReturnValuesOnConditionCheckFailure, Select,
};
use futures_util::StreamExt;
use sas_engine::config::SHARD_QUERIES_AT_ONCE;
use sas_engine::keys::{Queued, Slots};
use sas_engine::ports::{
    Counted, Created, Expected, ExpiryIndex, HeldIndex, IndexEntry, ListPage, ListQuery, Listed,
    Listing, OrderFinder, OrderRecord, Page, Read, Saved, StateStore, check_write,
};
use sas_engine::state::{AttentionList, ProcessState, StateRecord};
use sas_engine::{Error, OrderId, Result, Timestamp};
use serde_json::Value;

use crate::errors::classify;
use crate::settings::Tables;

mod jobs;
mod keys;
mod pages;
pub use keys::{BUSY_INDEX, BUSY_SHARDS, busy_shard};

const SERVICE: &str = "dynamodb";
/// Most keys one `BatchGetItem` reads.
const BATCH_GET: usize = 100;
/// Calls one batch of keys may take while DynamoDB leaves some unread.
const BATCH_GET_ROUNDS: u32 = 6;
/// Name of the expiry index; the template defines it with the same name.
pub const EXPIRY_INDEX: &str = "ByCompleteBy";
/// Name of the index of orders needing an operator.
pub const ATTENTION_INDEX: &str = "ByAttention";
/// Name of the index of orders in flight, the most recently watched first.
pub const IN_FLIGHT_INDEX: &str = "ByWatchedSince";
/// Name of the index of orders waiting for a held service.
pub const HELD_INDEX: &str = "ByHeldService";
/// Name of the index of orders by the value of their workflow's search key.
pub const SEARCH_INDEX: &str = "BySearchKey";

/// A DynamoDB item.
pub type Item = HashMap<String, AttributeValue>;

/// The state, orders and keys tables, and their indexes.
#[derive(Clone, Debug)]
pub struct DynamoStore {
    client: Client,
    state_table: String,
    orders_table: String,
    keys_table: String,
}

impl DynamoStore {
    pub fn new(client: Client, tables: &Tables) -> Self {
        DynamoStore {
            client,
            state_table: tables.state.clone(),
            orders_table: tables.orders.clone(),
            keys_table: tables.keys.clone(),
        }
    }
}

impl DynamoStore {
    /// Puts `item` in `table` unless an item with its `OrderId` is there.
    async fn put_new(&self, table: &str, item: Item) -> Result<Created> {
        let result = self
            .client
            .put_item()
            .table_name(table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(OrderId)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::None)
            .send()
            .await;
        Ok(if took(result)? { Created::Created } else { Created::AlreadyExists })
    }
}

/// Whether a conditional put took: false if its condition failed, an error for anything else.
fn took<O>(result: std::result::Result<O, SdkError<PutItemError, HttpResponse>>) -> Result<bool> {
    match result {
        Ok(_) => Ok(true),
        Err(SdkError::ServiceError(e))
            if matches!(e.err(), PutItemError::ConditionalCheckFailedException(_)) =>
        {
            Ok(false)
        }
        Err(e) => Err(classify(SERVICE, e)),
    }
}

impl StateStore for DynamoStore {
    async fn create_order(&self, order: &OrderRecord) -> Result<Created> {
        self.put_new(&self.orders_table, order_item(order)).await
    }

    async fn create_state(&self, state: &StateRecord) -> Result<Created> {
        check_write(state, None)?;
        self.put_new(&self.state_table, state_item(state)?).await
    }

    async fn load(&self, id: OrderId, read: Read) -> Result<Option<StateRecord>> {
        let out = self
            .client
            .get_item()
            .table_name(&self.state_table)
            .key("OrderId", AttributeValue::S(id.to_string()))
            .consistent_read(read == Read::Consistent)
            .send()
            .await
            .map_err(|e| classify(SERVICE, e))?;
        out.item.map(|item| state_from_item(id, &item)).transpose()
    }

    async fn load_order(&self, id: OrderId, read: Read) -> Result<Option<OrderRecord>> {
        let out = self
            .client
            .get_item()
            .table_name(&self.orders_table)
            .key("OrderId", AttributeValue::S(id.to_string()))
            .consistent_read(read == Read::Consistent)
            .send()
            .await
            .map_err(|e| classify(SERVICE, e))?;
        out.item.map(|item| order_from_item(id, &item)).transpose()
    }

    async fn load_many(&self, ids: &[OrderId], read: Read) -> Result<Vec<Option<StateRecord>>> {
        let mut found: HashMap<OrderId, StateRecord> = HashMap::new();
        for batch in ids.chunks(BATCH_GET) {
            let mut keys: Vec<HashMap<String, AttributeValue>> = batch
                .iter()
                .map(|id| {
                    HashMap::from([("OrderId".to_owned(), AttributeValue::S(id.to_string()))])
                })
                .collect();
            // DynamoDB may leave keys unread under load; they are asked for again, a while
            // later each time, and a batch it keeps refusing is unavailable for now.
            for round in 0..BATCH_GET_ROUNDS {
                if keys.is_empty() {
                    break;
                }
                if round > 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(50 << round)).await;
                }
                let request = KeysAndAttributes::builder()
                    .set_keys(Some(std::mem::take(&mut keys)))
                    .consistent_read(read == Read::Consistent)
                    .build()
                    .map_err(|e| Error::unavailable(SERVICE, e.to_string()))?;
                let out = self
                    .client
                    .batch_get_item()
                    .request_items(&self.state_table, request)
                    .send()
                    .await
                    .map_err(|e| classify(SERVICE, e))?;
                for item in
                    out.responses.unwrap_or_default().remove(&self.state_table).unwrap_or_default()
                {
                    let id = item
                        .get("OrderId")
                        .and_then(|v| v.as_s().ok())
                        .and_then(|s| s.parse::<OrderId>().ok())
                        .ok_or_else(|| {
                            Error::unavailable(
                                SERVICE,
                                "a batch read returned an item without its key",
                            )
                        })?;
                    found.insert(id, state_from_item(id, &item)?);
                }
                keys = out
                    .unprocessed_keys
                    .and_then(|mut u| u.remove(&self.state_table))
                    .map(|k| k.keys)
                    .unwrap_or_default();
            }
            if !keys.is_empty() {
                return Err(Error::unavailable(
                    SERVICE,
                    format!("{} keys were left unread {BATCH_GET_ROUNDS} times", keys.len()),
                ));
            }
        }
        Ok(ids.iter().map(|id| found.remove(id)).collect())
    }

    async fn save(&self, next: &StateRecord, expected: Expected) -> Result<Saved> {
        check_write(next, Some(expected))?;
        let result = self
            .client
            .put_item()
            .table_name(&self.state_table)
            .set_item(Some(state_item(next)?))
            .condition_expression("ProcessState = :ps AND Attempt = :a AND Revision = :r")
            .expression_attribute_values(
                ":ps",
                AttributeValue::S(expected.process_state.as_str().into()),
            )
            .expression_attribute_values(":a", number(expected.attempt))
            .expression_attribute_values(":r", number(expected.revision))
            // Nothing is done with the old item; asking for none keeps the failure response small.
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::None)
            .send()
            .await;
        Ok(if took(result)? { Saved::Saved } else { Saved::Conflict })
    }

    async fn slots(&self, key: &str) -> Result<Slots> {
        self.read_slots(key).await
    }
    async fn save_slots(&self, next: &Slots) -> Result<Saved> {
        self.write_slots(next).await
    }
    async fn join(&self, key: &str, queued: &Queued) -> Result<()> {
        self.put_in_line(key, queued).await
    }
    async fn line(&self, key: &str, limit: usize) -> Result<Vec<Queued>> {
        self.read_line(key, limit).await
    }
    async fn ahead(&self, key: &str, position: &str) -> Result<u32> {
        self.count_ahead(key, position).await
    }
    async fn leave(&self, key: &str, queued: &Queued) -> Result<()> {
        self.out_of_line(key, queued).await
    }

    async fn put_page(&self, page: &Page) -> Result<()> {
        self.write_page(page).await
    }

    async fn pages(&self, pass: &str) -> Result<Vec<Page>> {
        self.read_pages(pass).await
    }

    async fn drop_pages(&self, pass: &str) -> Result<()> {
        self.delete_pages(pass).await
    }
}

impl ExpiryIndex for DynamoStore {
    async fn due(&self, shard: u16, due_by: Timestamp) -> Result<Vec<IndexEntry>> {
        self.watched(shard, due_by).await
    }
}

impl DynamoStore {
    /// A query of the orders waiting for `service`, longest-waiting first.
    fn held_query(
        &self,
        service: &str,
    ) -> aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder {
        self.client
            .query()
            .table_name(&self.state_table)
            .index_name(HELD_INDEX)
            .key_condition_expression("HeldOn = :s")
            .expression_attribute_values(":s", AttributeValue::S(service.to_owned()))
    }
}

impl HeldIndex for DynamoStore {
    async fn held(&self, service: &str, limit: usize) -> Result<Vec<OrderId>> {
        let mut found = Vec::new();
        let mut start = None;
        while found.len() < limit {
            let page = i32::try_from((limit - found.len()).min(1000)).unwrap_or(1000);
            let out = self
                .held_query(service)
                .limit(page)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| classify(SERVICE, e))?;
            for item in out.items() {
                let raw = string(item, "OrderId")?;
                found.push(raw.parse().map_err(|_| corrupt_index(raw))?);
            }
            start = out.last_evaluated_key;
            if start.is_none() {
                break;
            }
        }
        Ok(found)
    }

    async fn count_held(&self, service: &str) -> Result<u64> {
        let mut count = 0;
        let mut start = None;
        loop {
            let out = self
                .held_query(service)
                .select(aws_sdk_dynamodb::types::Select::Count)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| classify(SERVICE, e))?;
            count += u64::try_from(out.count).unwrap_or(0);
            start = out.last_evaluated_key;
            if start.is_none() {
                return Ok(count);
            }
        }
    }
}

impl OrderFinder for DynamoStore {
    async fn find(&self, query: &ListQuery) -> Result<ListPage> {
        let after = query.start()?;
        let limit = query.page_size();
        let orders = match attention_list(query.listing) {
            Some(list) => self.attention(list, query, after, limit).await?,
            None => {
                // Without an age, orders waiting for a time or an answer are listed too.
                let older_than = match query.listing {
                    Listing::InFlight { older_than } => older_than,
                    _ => Duration::ZERO,
                };
                let cutoff = (!older_than.is_zero()).then(|| query.now.minus(older_than));
                let (orders, cut_short) = self.in_flight(query, cutoff, after, limit).await?;
                if let Some(read_to) = cut_short {
                    return Ok(ListPage::short(orders, read_to));
                }
                orders
            }
        };
        Ok(ListPage::cut(orders, limit))
    }

    async fn count(&self, query: &ListQuery, cap: u64) -> Result<Counted> {
        let list = match query.listing {
            Listing::Failed => AttentionList::Failed,
            Listing::Paused => AttentionList::Paused,
            Listing::Reported => AttentionList::Reported,
            Listing::AwaitingAnswer => AttentionList::AwaitingAnswer,
            Listing::InFlight { older_than } => {
                if query.cause.is_some() {
                    // An order in flight has no failure cause.
                    return Ok(Counted::of(0, cap, true));
                }
                let cutoff = (!older_than.is_zero()).then(|| query.now.minus(older_than));
                let found = self.count_in_flight(query, cutoff, cap).await?;
                // The index knows each order's workflow, not the step it is at.
                return Ok(Counted::of(found, cap, query.step.is_none()));
            }
        };
        let (request, _) = self.attention_query(list, query);
        Ok(Counted::of(self.counted(request, cap).await?, cap, true))
    }

    async fn searched(
        &self,
        value: &str,
        after: Option<(Timestamp, OrderId)>,
        limit: usize,
    ) -> Result<Vec<(Timestamp, OrderId)>> {
        let request = self
            .client
            .query()
            .table_name(&self.state_table)
            .index_name(SEARCH_INDEX)
            .key_condition_expression("SearchKey = :v")
            .expression_attribute_values(":v", AttributeValue::S(value.to_owned()))
            .scan_index_forward(false);
        // The index orders a value's entries by when they were accepted, those of one
        // millisecond in an order of its own: a page goes on from the entry the last ended at.
        let mut start = after.map(|(at, id)| {
            Item::from([
                ("OrderId".into(), AttributeValue::S(id.to_string())),
                ("SearchKey".into(), AttributeValue::S(value.to_owned())),
                ("SearchAt".into(), number(at.as_millis())),
            ])
        });
        let mut found = Vec::new();
        while found.len() < limit {
            let out = request
                .clone()
                .limit(i32::try_from(limit - found.len()).unwrap_or(1000))
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| classify(SERVICE, e))?;
            for item in out.items() {
                let raw = string(item, "OrderId")?;
                let order_id: OrderId = raw.parse().map_err(|_| corrupt_index(raw))?;
                found.push((Timestamp::from_millis(parse_number(item, "SearchAt")?), order_id));
            }
            match out.last_evaluated_key {
                Some(key) => start = Some(key),
                None => break,
            }
        }
        Ok(found)
    }
}

/// The list of `ByAttention` a listing reads, if it reads one.
fn attention_list(listing: Listing) -> Option<AttentionList> {
    match listing {
        Listing::Failed => Some(AttentionList::Failed),
        Listing::Paused => Some(AttentionList::Paused),
        Listing::Reported => Some(AttentionList::Reported),
        Listing::AwaitingAnswer => Some(AttentionList::AwaitingAnswer),
        Listing::InFlight { .. } => None,
    }
}

impl DynamoStore {
    /// The query of `ByAttention` for `list`, newest first, with `query`'s filters, and
    /// whether it has any.
    fn attention_query(
        &self,
        list: AttentionList,
        query: &ListQuery,
    ) -> (aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder, bool) {
        let mut filters = Vec::new();
        let mut request = self
            .client
            .query()
            .table_name(&self.state_table)
            .index_name(ATTENTION_INDEX)
            .key_condition_expression("Attention = :a")
            .expression_attribute_values(":a", AttributeValue::S(list.as_str().into()))
            .scan_index_forward(false);
        if let Some(step) = &query.step {
            filters.push("AttentionStep = :step");
            request = request.expression_attribute_values(":step", AttributeValue::S(step.clone()));
        }
        if let Some(cause) = &query.cause {
            filters.push("CauseKind = :cause");
            request =
                request.expression_attribute_values(":cause", AttributeValue::S(cause.clone()));
        }
        if let Some(workflow) = &query.workflow {
            filters.push("Workflow = :workflow");
            request = request
                .expression_attribute_values(":workflow", AttributeValue::S(workflow.clone()));
        }
        if !filters.is_empty() {
            request = request.filter_expression(filters.join(" AND "));
        }
        (request, !filters.is_empty())
    }

    /// What `request` (a query of an index) matches, counted by DynamoDB page after page
    /// until past `cap`.
    async fn counted(
        &self,
        request: aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder,
        cap: u64,
    ) -> Result<u64> {
        let mut found = 0u64;
        let mut start = None;
        loop {
            let out = request
                .clone()
                .select(Select::Count)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| classify(SERVICE, e))?;
            found += u64::try_from(out.count).unwrap_or(0);
            match out.last_evaluated_key {
                Some(key) if found <= cap => start = Some(key),
                _ => return Ok(found),
            }
        }
    }

    /// Up to `limit + 1` orders of `ByAttention` in `state`, newest first, after `after`. The
    /// filters are applied by DynamoDB to what it reads, so a narrow filter reads more of the
    /// partition than it returns.
    async fn attention(
        &self,
        list: AttentionList,
        query: &ListQuery,
        after: Option<(Timestamp, OrderId)>,
        limit: usize,
    ) -> Result<Vec<Listed>> {
        let (request, filtered) = self.attention_query(list, query);
        let page_size = if filtered { 100 } else { limit + 1 };
        let mut start = after.map(|(at, id)| {
            Item::from([
                ("OrderId".into(), AttributeValue::S(id.to_string())),
                ("Attention".into(), AttributeValue::S(list.as_str().into())),
                ("AttentionAt".into(), number(at.as_millis())),
            ])
        });
        let mut found = Vec::new();
        loop {
            let out = request
                .clone()
                .set_exclusive_start_key(start.take())
                .limit(i32::try_from(page_size).unwrap_or(100))
                .send()
                .await
                .map_err(|e| classify(SERVICE, e))?;
            for item in out.items() {
                let raw = string(item, "OrderId")?;
                found.push(Listed {
                    order_id: raw.parse().map_err(|_| corrupt_index(raw))?,
                    workflow: item
                        .get("Workflow")
                        .and_then(|v| v.as_s().ok())
                        .cloned()
                        .unwrap_or_default(),
                    workflow_version: match item.get("WorkflowVersion") {
                        Some(_) => parse_number(item, "WorkflowVersion")?,
                        None => 1,
                    },
                    since: Timestamp::from_millis(parse_number(item, "AttentionAt")?),
                    entered: Timestamp::from_millis(parse_number(item, "AttentionAt")?),
                    step: item.get("AttentionStep").and_then(|v| v.as_s().ok()).cloned(),
                    cause: item.get("CauseKind").and_then(|v| v.as_s().ok()).cloned(),
                });
            }
            match out.last_evaluated_key {
                Some(key) if found.len() <= limit => start = Some(key),
                _ => return Ok(found),
            }
        }
    }

    /// Every entry of `shard` of the expiry index due by `due_by`, with since when it is watched
    /// (see `CreatedAt` above), earliest due first, page after page.
    async fn watched(&self, shard: u16, due_by: Timestamp) -> Result<Vec<IndexEntry>> {
        let mut found = Vec::new();
        let mut start = None;
        loop {
            let out = self
                .client
                .query()
                .table_name(&self.state_table)
                .index_name(EXPIRY_INDEX)
                .key_condition_expression("ExpiryShard = :s AND CompleteBy <= :due")
                .expression_attribute_values(":s", number(shard))
                .expression_attribute_values(":due", number(due_by.as_millis()))
                .projection_expression("OrderId, CompleteBy, CreatedAt")
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| classify(SERVICE, e))?;
            for item in out.items() {
                let raw = string(item, "OrderId")?;
                let order_id: OrderId = raw.parse().map_err(|_| corrupt_index(raw))?;
                let complete_by = Timestamp::from_millis(parse_number(item, "CompleteBy")?);
                let watched_since = Timestamp::from_millis(parse_number(item, "CreatedAt")?);
                found.push(IndexEntry { order_id, complete_by, watched_since });
            }
            start = out.last_evaluated_key;
            if start.is_none() {
                return Ok(found);
            }
        }
    }

    /// The query of `shard` of the in-flight index, newest watched first: the orders watched
    /// since `top` or before, of `workflow` if given.
    fn in_flight_query(
        &self,
        shard: u16,
        top: Option<Timestamp>,
        workflow: Option<&str>,
    ) -> aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder {
        let mut request = self
            .client
            .query()
            .table_name(&self.state_table)
            .index_name(IN_FLIGHT_INDEX)
            .key_condition_expression(match top {
                Some(_) => "FlightShard = :s AND CreatedAt <= :top",
                None => "FlightShard = :s",
            })
            .expression_attribute_values(":s", number(shard))
            .scan_index_forward(false);
        if let Some(top) = top {
            request = request.expression_attribute_values(":top", number(top.as_millis()));
        }
        if let Some(workflow) = workflow {
            request = request
                .filter_expression("Workflow = :workflow")
                .expression_attribute_values(":workflow", AttributeValue::S(workflow.into()));
        }
        request
    }

    /// Reads on in `shard` of the in-flight index, `limit` entries at most, where it was left.
    async fn read_on(
        &self,
        mut shard: ShardReader,
        query: &ListQuery,
        top: Option<Timestamp>,
        below: Option<(Timestamp, OrderId)>,
    ) -> Result<ShardReader> {
        let limit = shard.limit;
        let out = self
            .in_flight_query(shard.shard, top, query.workflow.as_deref())
            .projection_expression("OrderId, CreatedAt")
            .limit(i32::try_from(limit).unwrap_or(i32::MAX))
            .set_exclusive_start_key(shard.start.take())
            .send()
            .await
            .map_err(|e| classify(SERVICE, e))?;
        for item in out.items() {
            let raw = string(item, "OrderId")?;
            let id: OrderId = raw.parse().map_err(|_| corrupt_index(raw))?;
            let since = Timestamp::from_millis(parse_number(item, "CreatedAt")?);
            shard.floor = Some(since);
            if below.is_none_or(|b| (since, id) < b) {
                shard.read.push((since, id));
            }
        }
        shard.start = out.last_evaluated_key;
        shard.done = shard.start.is_none();
        shard.limit = (limit * 2).min(MAX_SHARD_READ);
        Ok(shard)
    }

    /// The newest `need` entries of the in-flight index not yet taken, taken from `shards`,
    /// newest first: each shard is read a little at first, and on only while what it may still
    /// hold could be among them (DynamoDB returns each shard newest first, but those watched
    /// since the same millisecond in any order, and the listing orders them by order id).
    async fn take_newest(
        &self,
        shards: &mut Vec<ShardReader>,
        query: &ListQuery,
        top: Option<Timestamp>,
        below: Option<(Timestamp, OrderId)>,
        need: usize,
    ) -> Result<Vec<(Timestamp, OrderId)>> {
        loop {
            let mut merged: Vec<(Timestamp, OrderId)> =
                shards.iter().flat_map(|s| s.read.iter().copied()).collect();
            merged.sort_unstable_by(|a, b| b.cmp(a));
            let edge = merged.get(need - 1).map(|(since, _)| *since);
            let (unsure, sure): (Vec<ShardReader>, Vec<ShardReader>) = shards
                .drain(..)
                .partition(|s| !s.done && edge.is_none_or(|e| s.floor.is_none_or(|f| f >= e)));
            *shards = sure;
            if unsure.is_empty() {
                merged.truncate(need);
                let taken: std::collections::HashSet<OrderId> =
                    merged.iter().map(|(_, id)| *id).collect();
                for shard in shards.iter_mut() {
                    shard.read.retain(|(_, id)| !taken.contains(id));
                }
                return Ok(merged);
            }
            let reads: Vec<Result<ShardReader>> = futures_util::stream::iter(unsure)
                .map(|shard| self.read_on(shard, query, top, below))
                .buffer_unordered(SHARD_QUERIES_AT_ONCE)
                .collect()
                .await;
            for read in reads {
                shards.push(read?);
            }
        }
    }

    /// Up to `limit + 1` orders in flight, watched since `cutoff` or before, newest first, after
    /// `after`, from the in-flight index, then the records of those listed, read in batches for
    /// the step each is at. A page reads the records it shows, and of the index what it shows
    /// and a few entries of each shard. Filtered by step, it also reads the records it passes
    /// over, [`PASSED_PER_PAGE`] at most: past that, it is cut short, and the last order read
    /// is returned too, for the next page to start after it.
    async fn in_flight(
        &self,
        query: &ListQuery,
        cutoff: Option<Timestamp>,
        after: Option<(Timestamp, OrderId)>,
        limit: usize,
    ) -> Result<(Vec<Listed>, Option<(Timestamp, OrderId)>)> {
        if query.cause.is_some() {
            // An order in flight has no failure cause: nothing can match.
            return Ok((Vec::new(), None));
        }
        let top = match (cutoff, after) {
            (Some(c), Some((a, _))) => Some(c.min(a)),
            (c, a) => c.or(a.map(|(since, _)| since)),
        };
        let count = usize::from(query.shards.max(1));
        // Enough of each shard at first for the page, were its orders spread evenly.
        let first = (limit + 1).div_ceil(count) + 1;
        let mut shards: Vec<ShardReader> =
            (0..query.shards.max(1)).map(|shard| ShardReader::new(shard, first)).collect();
        let mut found = Vec::new();
        let mut passed = 0usize;
        while found.len() <= limit {
            // Never more records read than the page's and those it may pass over.
            let need = (limit + 1 - found.len()).min(PASSED_PER_PAGE - passed);
            let taken = self.take_newest(&mut shards, query, top, after, need).await?;
            let Some(last) = taken.last().copied() else { break };
            let ids: Vec<OrderId> = taken.iter().map(|(_, id)| *id).collect();
            let records = self.load_many(&ids, Read::Eventual).await?;
            for ((since, id), record) in taken.into_iter().zip(records) {
                // The index follows the table a moment late: an order gone from flight is
                // passed over, as is one at another step than asked for.
                let Some(record) = record.filter(|r| r.process_state.is_in_flight()) else {
                    passed += 1;
                    continue;
                };
                let step = record.current_step().map(|s| s.name.clone());
                if query.step.as_ref().is_some_and(|s| step.as_ref() != Some(s)) {
                    passed += 1;
                    continue;
                }
                let entered = record.taken_up();
                found.push(Listed {
                    order_id: id,
                    workflow: record.workflow,
                    workflow_version: record.workflow_version,
                    since,
                    entered,
                    step,
                    cause: None,
                });
            }
            if passed >= PASSED_PER_PAGE && found.len() <= limit {
                return Ok((found, Some(last)));
            }
        }
        Ok((found, None))
    }

    /// How many orders of the in-flight index the listing holds, shards counted side by side
    /// and each only as far as its share of what is left below `cap`, until past it.
    async fn count_in_flight(
        &self,
        query: &ListQuery,
        cutoff: Option<Timestamp>,
        cap: u64,
    ) -> Result<u64> {
        let mut open: Vec<(u16, Option<Item>)> =
            (0..query.shards.max(1)).map(|shard| (shard, None)).collect();
        let mut found = 0u64;
        while !open.is_empty() && found <= cap {
            let share = (cap + 1 - found).div_ceil(open.len() as u64);
            let share = i32::try_from(share).unwrap_or(i32::MAX);
            let counts: Vec<Result<(u16, u64, Option<Item>)>> =
                futures_util::stream::iter(open.drain(..))
                    .map(|(shard, start)| async move {
                        let out = self
                            .in_flight_query(shard, cutoff, query.workflow.as_deref())
                            .select(Select::Count)
                            .limit(share)
                            .set_exclusive_start_key(start)
                            .send()
                            .await
                            .map_err(|e| classify(SERVICE, e))?;
                        let count = u64::try_from(out.count).unwrap_or(0);
                        Ok((shard, count, out.last_evaluated_key))
                    })
                    .buffer_unordered(SHARD_QUERIES_AT_ONCE)
                    .collect()
                    .await;
            for counted in counts {
                let (shard, count, rest) = counted?;
                found += count;
                if let Some(start) = rest {
                    open.push((shard, Some(start)));
                }
            }
        }
        Ok(found)
    }
}

/// Most records a page of orders in flight filtered by step reads and passes over.
const PASSED_PER_PAGE: usize = 500;

/// Most entries one read of a shard of the in-flight index asks for.
const MAX_SHARD_READ: usize = 1000;

/// Where a listing is in one shard of the in-flight index.
struct ShardReader {
    shard: u16,
    /// Entries read and not yet taken, newest first.
    read: Vec<(Timestamp, OrderId)>,
    /// The oldest entry read: what the shard still holds is no newer.
    floor: Option<Timestamp>,
    start: Option<Item>,
    done: bool,
    /// Entries the next read asks for: twice the last's.
    limit: usize,
}

impl ShardReader {
    fn new(shard: u16, limit: usize) -> ShardReader {
        ShardReader { shard, read: Vec::new(), floor: None, start: None, done: false, limit }
    }
}

/// Top-level attributes of a state item; everything else of the record goes into `Body`.
const TOP_LEVEL: [&str; 10] = [
    "order_id",
    "search_key",
    "expires_at",
    "process_state",
    "locked_by",
    "complete_by",
    "failure_count",
    "attempt",
    "revision",
    "shard",
];

/// The item a state record is stored as (public for tools that load tables in bulk).
pub fn state_item(r: &StateRecord) -> Result<Item> {
    let mut body = serde_json::to_value(r).map_err(|e| Error::rejected(SERVICE, e))?;
    if let Value::Object(map) = &mut body {
        for key in TOP_LEVEL {
            map.remove(key);
        }
        // Kept as `CreatedAt`; and an absent field reads back as null. Every byte counts: a
        // write is billed per started kilobyte of the larger of the old and new item.
        map.remove("created_at");
        map.retain(|_, v| !v.is_null());
    }
    let mut item = Item::new();
    item.insert("OrderId".into(), AttributeValue::S(r.order_id.to_string()));
    item.insert("ProcessState".into(), AttributeValue::S(r.process_state.as_str().into()));
    item.insert("FailureCount".into(), number(r.failure_count));
    item.insert("Attempt".into(), number(r.attempt));
    item.insert("Revision".into(), number(r.revision));
    if let Some(owner) = &r.locked_by {
        item.insert("LockedBy".into(), AttributeValue::S(owner.clone()));
    }
    item.insert("ExpiryShard".into(), number(r.shard));
    if let Some(cb) = r.complete_by {
        // The index needs both of its keys: without CompleteBy the item is not in it.
        item.insert("CompleteBy".into(), number(cb.as_millis()));
    }
    if let Some(at) = r.expires_at {
        // What DynamoDB's time to live reads: seconds since the epoch.
        item.insert("ExpiresAt".into(), number(at.as_millis().div_euclid(1000)));
    }
    item.insert("CreatedAt".into(), number(r.watched_since().as_millis()));
    if r.watched_since() != r.created_at {
        item.insert("AcceptedAt".into(), number(r.created_at.as_millis()));
    }
    if let Some(a) = r.attention() {
        item.insert("Attention".into(), AttributeValue::S(a.list.as_str().into()));
        item.insert("AttentionAt".into(), number(a.since.as_millis()));
        if let Some(step) = a.step {
            item.insert("AttentionStep".into(), AttributeValue::S(step));
        }
        if let Some(cause) = a.cause {
            item.insert("CauseKind".into(), AttributeValue::S(cause.into()));
        }
    }
    if r.process_state.is_in_flight() {
        // Only an order in flight is in the in-flight index.
        item.insert("FlightShard".into(), number(r.shard));
    }
    // Listings filter on an order's workflow from their index alone; the operators' lists show
    // its version from theirs too.
    if r.attention().is_some() || r.process_state.is_in_flight() {
        item.insert("Workflow".into(), AttributeValue::S(r.workflow.clone()));
    }
    if r.attention().is_some() {
        item.insert("WorkflowVersion".into(), number(r.workflow_version));
    }
    if let Some(held) = r.held_on() {
        item.insert("HeldOn".into(), AttributeValue::S(held.key()));
        item.insert("HeldSince".into(), number(held.since.as_millis()));
    }
    if let Some(value) = &r.search_key {
        item.insert("SearchKey".into(), AttributeValue::S(value.clone()));
        item.insert("SearchAt".into(), number(r.created_at.as_millis()));
    }
    let deflated = miniz_oxide::deflate::compress_to_vec(body.to_string().as_bytes(), 9);
    item.insert("Body".into(), AttributeValue::B(Blob::new(deflated)));
    Ok(item)
}

/// The largest body inflated: a state item holds at most 400 KB, and JSON seldom deflates to
/// less than a tenth, so anything larger is not a record's.
const BODY_INFLATED_MAX: usize = 8 << 20;

/// The JSON text of a state item's `Body`, deflated (B) or as items were written before (S).
pub fn body_text(item: &Item) -> std::result::Result<String, String> {
    match item.get("Body") {
        Some(AttributeValue::B(blob)) => {
            let bytes = miniz_oxide::inflate::decompress_to_vec_with_limit(
                blob.as_ref(),
                BODY_INFLATED_MAX,
            )
            .map_err(|e| format!("Body does not inflate: {e}"))?;
            String::from_utf8(bytes).map_err(|e| format!("Body is not UTF-8: {e}"))
        }
        Some(AttributeValue::S(text)) => Ok(text.clone()),
        Some(_) => Err("Body is neither binary nor a string".into()),
        None => Err("item without Body".into()),
    }
}

fn state_from_item(id: OrderId, item: &Item) -> Result<StateRecord> {
    let corrupt = |reason: String| Error::Corrupt { order_id: id, reason };
    let body = body_text(item).map_err(corrupt)?;
    let mut value: Value =
        serde_json::from_str(&body).map_err(|e| corrupt(format!("Body: {e}")))?;
    let Value::Object(map) = &mut value else {
        return Err(corrupt("Body is not an object".into()));
    };
    let state = string(item, "ProcessState").map_err(|e| corrupt(e.to_string()))?;
    if ProcessState::parse(state).is_none() {
        return Err(corrupt(format!("unknown ProcessState {state:?}")));
    }
    map.insert("order_id".into(), Value::String(id.to_string()));
    map.insert("process_state".into(), Value::String(state.to_owned()));
    map.insert(
        "locked_by".into(),
        item.get("LockedBy").and_then(|v| v.as_s().ok()).map_or(Value::Null, |s| s.as_str().into()),
    );
    map.insert(
        "complete_by".into(),
        item.get("CompleteBy")
            .map(|_| parse_number::<i64>(item, "CompleteBy"))
            .transpose()?
            .map_or(Value::Null, Value::from),
    );
    map.insert(
        "expires_at".into(),
        item.get("ExpiresAt")
            .map(|_| parse_number::<i64>(item, "ExpiresAt"))
            .transpose()?
            .map_or(Value::Null, |secs| Value::from(secs.saturating_mul(1000))),
    );
    map.insert("failure_count".into(), parse_number::<u32>(item, "FailureCount")?.into());
    map.insert("attempt".into(), parse_number::<u64>(item, "Attempt")?.into());
    map.insert("revision".into(), parse_number::<u64>(item, "Revision")?.into());
    map.insert("shard".into(), parse_number::<u16>(item, "ExpiryShard")?.into());
    if let Some(value) = item.get("SearchKey") {
        let value = value.as_s().map_err(|_| corrupt("SearchKey is not a string".into()))?;
        map.insert("search_key".into(), Value::String(value.clone()));
    }
    let accepted = if item.contains_key("AcceptedAt") { "AcceptedAt" } else { "CreatedAt" };
    map.insert("created_at".into(), parse_number::<i64>(item, accepted)?.into());
    let mut record: StateRecord =
        serde_json::from_value(value).map_err(|e| corrupt(format!("record: {e}")))?;
    record.upgrade();
    record.check().map_err(corrupt)?;
    Ok(record)
}

fn order_item(o: &OrderRecord) -> Item {
    let order = serde_json::to_string(&o.order).unwrap_or_default();
    Item::from([
        ("OrderId".into(), AttributeValue::S(o.order_id.to_string())),
        ("Owner".into(), AttributeValue::S(o.owner.as_str().to_owned())),
        ("IdempotencyKey".into(), AttributeValue::S(o.idempotency_key.as_str().to_owned())),
        ("Order".into(), AttributeValue::S(order)),
        ("CreatedAt".into(), number(o.created_at.as_millis())),
    ])
}

fn order_from_item(id: OrderId, item: &Item) -> Result<OrderRecord> {
    let corrupt = |reason: String| Error::Corrupt { order_id: id, reason };
    let key = string(item, "IdempotencyKey").map_err(|e| corrupt(e.to_string()))?;
    let order = string(item, "Order").map_err(|e| corrupt(e.to_string()))?;
    // Orders taken before owners were kept belong to the anonymous caller, whose ids they have.
    let owner = match item.get("Owner").and_then(|v| v.as_s().ok()) {
        Some(raw) => {
            sas_engine::Owner::try_from(raw.clone()).map_err(|e| corrupt(e.to_string()))?
        }
        None => sas_engine::Owner::anonymous(),
    };
    Ok(OrderRecord {
        order_id: id,
        owner,
        idempotency_key: sas_engine::IdempotencyKey::parse(key)
            .map_err(|e| corrupt(e.to_string()))?,
        order: serde_json::from_str(order).map_err(|e| corrupt(format!("Order: {e}")))?,
        created_at: Timestamp::from_millis(parse_number(item, "CreatedAt")?),
    })
}

fn number(n: impl ToString) -> AttributeValue {
    AttributeValue::N(n.to_string())
}

fn string<'a>(item: &'a Item, name: &str) -> Result<&'a str> {
    item.get(name)
        .and_then(|v| v.as_s().ok())
        .map(String::as_str)
        .ok_or_else(|| Error::rejected(SERVICE, format!("item without string attribute {name}")))
}

fn parse_number<T: std::str::FromStr>(item: &Item, name: &str) -> Result<T> {
    item.get(name)
        .and_then(|v| v.as_n().ok())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| Error::rejected(SERVICE, format!("item without numeric attribute {name}")))
}

fn corrupt_index(raw: &str) -> Error {
    Error::rejected(SERVICE, format!("index entry with a malformed OrderId {raw:?}"))
}

/// Size of a state item as DynamoDB bills it: attribute names plus values (strings in UTF-8
/// bytes, binaries in bytes, numbers at about one byte per two digits plus one). Used by the
/// cost model.
pub fn state_item_size(record: &StateRecord) -> Result<usize> {
    Ok(item_size(&state_item(record)?))
}

/// Size of an order item as DynamoDB bills it.
pub fn order_item_size(order: &OrderRecord) -> usize {
    item_size(&order_item(order))
}

fn item_size(item: &Item) -> usize {
    item.iter()
        .map(|(name, value)| {
            name.len()
                + match value {
                    AttributeValue::S(s) => s.len(),
                    AttributeValue::B(b) => b.as_ref().len(),
                    AttributeValue::N(n) => n.trim_start_matches('-').len().div_ceil(2) + 1,
                    _ => 0,
                }
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sas_engine::IdempotencyKey;
    use sas_engine::config::EngineConfig;
    use sas_engine::machine::Ctx;
    use sas_engine::workflow::Workflow;

    fn record() -> StateRecord {
        let agents = Workflow::agents_in(sas_workflows::order_fulfilment());
        let w = Workflow::from_json(sas_workflows::order_fulfilment(), &agents).unwrap();
        let id = OrderId::for_key(&IdempotencyKey::parse("k").unwrap());
        let config = EngineConfig::default();
        let ctx =
            Ctx { now: Timestamp::from_millis(1_000), config: &config, workflow: &w, seed: 0 };
        sas_engine::machine::create(id, "corr".into(), &ctx).next
    }

    #[test]
    fn a_record_survives_the_round_trip_through_an_item() {
        let r = record();
        let item = state_item(&r).unwrap();
        assert!(item.contains_key("CompleteBy") && item.contains_key("ExpiryShard"));
        assert!(!item.contains_key("LockedBy"));
        assert_eq!(state_from_item(r.order_id, &item).unwrap(), r);
    }

    #[test]
    fn an_order_with_a_search_key_is_indexed_by_it_in_the_order_of_its_acceptance() {
        let mut r = record();
        assert!(!state_item(&r).unwrap().contains_key("SearchKey"), "sparse");
        r.search_key = Some("c-1".into());
        let item = state_item(&r).unwrap();
        assert_eq!(string(&item, "SearchKey").unwrap(), "c-1");
        assert_eq!(parse_number::<i64>(&item, "SearchAt").unwrap(), r.created_at.as_millis());
        assert!(!body_text(&item).unwrap().contains("c-1"), "kept once, as its attribute");
        assert_eq!(state_from_item(r.order_id, &item).unwrap(), r);
    }

    #[test]
    fn an_order_back_from_a_wait_is_indexed_from_then_and_keeps_when_it_was_accepted() {
        let mut r = record();
        let item = state_item(&r).unwrap();
        assert!(!item.contains_key("AcceptedAt"), "nothing to keep apart");
        r.active_since = Some(r.created_at.plus(std::time::Duration::from_secs(86_400)));
        let item = state_item(&r).unwrap();
        assert_eq!(parse_number::<i64>(&item, "CreatedAt").unwrap(), 86_401_000);
        assert_eq!(parse_number::<i64>(&item, "AcceptedAt").unwrap(), 1_000);
        assert_eq!(state_from_item(r.order_id, &item).unwrap(), r);
    }

    #[test]
    fn a_record_written_before_steps_held_leases_gives_its_step_in_flight_the_lease() {
        let mut r = record();
        r.steps[0].lease = None;
        r.steps[0].dispatched = true;
        (r.process_state, r.locked_by, r.attempt) = (ProcessState::Processing, Some("s".into()), 4);
        r.failure_count = 1;
        let mut item = state_item(&r).unwrap();
        // As the version before wrote it: the step in flight named by a cursor.
        let body = body_text(&item).unwrap().replacen('{', r#"{"cursor":0,"#, 1);
        item.insert("Body".into(), AttributeValue::S(body));
        let read = state_from_item(r.order_id, &item).unwrap();
        let lease = read.steps[0].lease.unwrap();
        assert_eq!((lease.attempt, lease.sent, lease.failures), (4, true, 1));
        assert_eq!(Some(lease.complete_by), r.complete_by);
        assert_eq!(read.legacy_cursor, None);
    }

    #[test]
    fn a_finished_record_has_no_index_keys() {
        let mut r = record();
        r.process_state = ProcessState::Processed;
        r.complete_by = None;
        r.ended_at = Some(r.created_at);
        for s in &mut r.steps {
            s.status = sas_engine::state::StepStatus::Done;
            s.lease = None;
        }
        let item = state_item(&r).unwrap();
        assert!(!item.contains_key("CompleteBy"), "out of the index");
        assert_eq!(state_from_item(r.order_id, &item).unwrap(), r);
    }

    #[test]
    fn the_body_holds_neither_nulls_nor_what_has_an_attribute_of_its_own() {
        let mut r = record();
        r.cause = None;
        r.alert = None;
        let item = state_item(&r).unwrap();
        let body = body_text(&item).unwrap();
        assert!(!body.contains("null") && !body.contains("created_at"), "{body}");
        assert_eq!(state_from_item(r.order_id, &item).unwrap(), r);
    }

    #[test]
    fn the_body_is_kept_deflated_and_one_written_as_text_still_reads() {
        let r = record();
        let mut item = state_item(&r).unwrap();
        let text = body_text(&item).unwrap();
        let deflated = item["Body"].as_b().unwrap().as_ref().len();
        assert!(deflated * 2 < text.len() + 100, "{deflated} bytes for {} of text", text.len());
        item.insert("Body".into(), AttributeValue::S(text));
        assert_eq!(state_from_item(r.order_id, &item).unwrap(), r);
    }

    #[test]
    fn a_body_that_does_not_inflate_is_a_corrupt_record() {
        let r = record();
        let mut item = state_item(&r).unwrap();
        item.insert("Body".into(), AttributeValue::B(Blob::new(b"not deflate".to_vec())));
        let err = state_from_item(r.order_id, &item).unwrap_err();
        assert!(
            matches!(&err, Error::Corrupt { reason, .. } if reason.contains("inflate")),
            "{err}"
        );
    }

    #[test]
    fn a_new_record_fits_in_one_write_unit() {
        assert!(state_item_size(&record()).unwrap() < 1024);
    }
}
