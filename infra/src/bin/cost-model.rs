//! `cost-model`: what one order costs on AWS, counted, not guessed.
//!
//! Runs orders through the real engine services (submission, scheduler, agents), the scheduler
//! and agents behind their functions' own batch handlers, on in-memory ports that count every
//! request the AWS adapters would make: DynamoDB write and read units from the real item
//! encoding (transactions at double rate, index writes when an index key changes, failed
//! conditional writes included), SQS requests, Lambda invocations, EventBridge events and API
//! calls, and the agents' reads and writes of their services' records, turns and places.
//! The functions' metric lines are counted too: the engine's metrics, printed in CloudWatch's
//! embedded metric format by the recorder the functions install, once per invocation and once
//! more after a write that ended an order, as they do; so are their own log lines, written by
//! their own subscriber. What a deployment at the template's defaults adds is priced with
//! them: Lambda's lines and traces for each invocation, the API's access log line, the orders'
//! traces, the bus's deliveries, and what an ended order keeps in DynamoDB each month. Prices
//! are AWS list prices for us-east-1; the arithmetic is printed.
//!
//! `cargo run -p sas-infra --bin cost-model -- [ORDERS] [BATCH]`: 1000 orders by default, in
//! SQS batches as the template's mappings fill them at the model's rate ([`batches`]), or of
//! BATCH messages each (10: what the mappings deliver under load).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use sas_aws::batch::Coalescing;
use sas_aws::dynamo::{order_item_size, state_item_size};
use sas_aws::settings::DEFAULT_SEND_LINGER_MS;
use sas_engine::catalogue::Catalogue;
use sas_engine::config::{EngineConfig, HoldPolicy};
use sas_engine::events::{BusEvent, CALLBACK_DETAIL_TYPE, STATUS_DETAIL_TYPE};
use sas_engine::health::ServiceRecord;
use sas_engine::keys::{Queued, Slots};
use sas_engine::load::{Gauges, Unmetered};
use sas_engine::machine::Answer;
use sas_engine::memory::{
    Behaviour, ManualClock, MemoryBus, MemoryPayloads, MemoryQueues, MemoryRemote,
    MemoryServiceBook, MemoryStore, MemoryWaits, SplitMix,
};
use sas_engine::message::Message;
use sas_engine::pace::{Booked, Limits, Place, Usage};
use sas_engine::ports::Clock;
use sas_engine::ports::{
    Created, Depth, Destination, Expected, ExpiryIndex, HeldIndex, Ids, IndexEntry, OrderRecord,
    Outbox, Outgoing, Pace, Page, Payloads, QueueDepths, Read, Saved, ServiceBook, StateStore,
    WaitGauge, WaitReport,
};
use sas_engine::services::{Agent, Answering, Assembly, Operator, Scheduler, Starter};
use sas_engine::starts::{OWN_SOURCE, Pattern};
use sas_engine::state::StateRecord;
use sas_engine::workflow::Workflow;
use sas_engine::{AgentName, OrderId, Result, Timestamp};

use sas_infra::emulation::template::{Context, Template};
use sas_infra::tools::batches;
use sas_infra::tools::ceiling::{self, Durations, Params, PerOrder};
use sas_infra::tools::durations::{self as timing, Measured, Memory};
use sas_infra::tools::prices as price;

/// The larger parameter set the README gives, for `sam deploy --parameter-overrides`.
const LARGE: &[(&str, &str)] = &[
    ("ExpectedOrdersPerSecond", "2000"),
    ("PollerConcurrency", "100"),
    ("ApiThrottlingRateLimit", "3000"),
    ("ApiThrottlingBurstLimit", "5000"),
];
/// How long a stored value is kept: the template's `PayloadRetentionDays` (90), in the months
/// S3 bills storage by.
const PAYLOAD_MONTHS: f64 = 90.0 / 30.4;
/// The steady load the model runs at.
const ORDERS_PER_SECOND: usize = 10;
/// Bytes DynamoDB adds to each item it stores (for its indexing), in the size it bills.
const ITEM_OVERHEAD: usize = 100;

/// Bytes and lines of embedded-metric output printed so far, all scenarios together.
static METRIC_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static METRIC_LINES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static COLLECTOR: std::sync::OnceLock<&'static metrics_cloudwatch_embedded::Collector> =
    std::sync::OnceLock::new();

/// Bytes and lines of the functions' own log lines (their `tracing` output, as JSON, at
/// `LogLevel`'s default), all scenarios together.
static LOG_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static LOG_LINES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Where the functions' log lines go here: counted instead of printed.
struct CountedLog;

impl std::io::Write for CountedLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        use std::sync::atomic::Ordering::Relaxed;
        LOG_BYTES.fetch_add(buf.len() as u64, Relaxed);
        LOG_LINES.fetch_add(buf.iter().filter(|&&b| b == b'\n').count() as u64, Relaxed);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Takes the log output counted since the last call: bytes and lines.
fn take_log_output() -> (f64, f64) {
    use std::sync::atomic::Ordering::Relaxed;
    (LOG_BYTES.swap(0, Relaxed) as f64, LOG_LINES.swap(0, Relaxed) as f64)
}

/// What Lambda itself writes to a function's log for each invocation, in its text format:
/// START, END, and REPORT (three events).
const LAMBDA_LINES: [&str; 3] = [
    "START RequestId: 3f2b8c1e-7a4d-4e9b-b1c6-0d5e8f7a9b21 Version: $LATEST\n",
    "END RequestId: 3f2b8c1e-7a4d-4e9b-b1c6-0d5e8f7a9b21\n",
    "REPORT RequestId: 3f2b8c1e-7a4d-4e9b-b1c6-0d5e8f7a9b21\tDuration: 38.47 ms\tBilled Duration: 39 ms\tMemory Size: 128 MB\tMax Memory Used: 31 MB\t\n",
];

/// What the REPORT line carries more under Lambda's own tracing (`Tracing: Active`).
const LAMBDA_XRAY_LINE: &str = "XRAY TraceId: 1-6750a1b2-3c4d5e6f7a8b9c0d1e2f3a4b\tSegmentId: 5a6b7c8d9e0f1a2b\tSampled: true\t\n";

/// Lambda's default sampling of the invocations it traces itself, per function: the first
/// invocation each second and this share of the rest. Its traces are the invocations' own,
/// apart from the orders' (a batch holds messages of many orders).
const LAMBDA_SAMPLED_SHARE: f64 = 0.05;

/// Traces Lambda records a second for a function invoked `rate` times a second.
fn lambda_traces(rate: f64) -> f64 {
    rate.min(1.0) + LAMBDA_SAMPLED_SHARE * (rate - 1.0).max(0.0)
}

/// The API's access log line for one request: the stage's format from the template, each
/// `$context` variable given a value as long as API Gateway's (the caller signed with SigV4,
/// as `ApiAuth`'s default `AWS_IAM` requires).
fn access_log_line(format: &str) -> String {
    let value = |variable: &str| match variable {
        "requestId" => "Hn3kXj6ZIAMEb7Q=",
        "requestTime" => "03/Dec/2026:22:16:36 +0000",
        "identity.sourceIp" => "203.0.113.42",
        "identity.caller" => "AROAZ3EXAMPLE7ROLEID2:shop-web",
        "identity.userArn" => "arn:aws:sts::123456789012:assumed-role/shop-web/shop-web",
        "routeKey" => "POST /orders",
        "status" => "202",
        "responseLength" => "58",
        "responseLatency" => "41",
        _ => "-",
    };
    let mut line = String::new();
    let mut rest = format;
    while let Some(at) = rest.find("$context.") {
        line.push_str(&rest[..at]);
        let name = &rest[at + "$context.".len()..];
        let end =
            name.find(|c: char| !(c.is_ascii_alphanumeric() || c == '.')).unwrap_or(name.len());
        line.push_str(value(&name[..end]));
        rest = &name[end..];
    }
    line.push_str(rest);
    line.push('\n');
    line
}

/// What a function prints when an invocation ends (or an order has just ended), counted
/// instead of printed.
fn flush_metrics() {
    use std::sync::atomic::Ordering::Relaxed;
    let Some(collector) = COLLECTOR.get() else { return };
    let mut lines = Vec::new();
    if collector.flush(&mut lines).is_ok() {
        METRIC_BYTES.fetch_add(lines.len() as u64, Relaxed);
        METRIC_LINES.fetch_add(lines.iter().filter(|&&b| b == b'\n').count() as u64, Relaxed);
    }
}

/// Takes the metric output counted since the last call: bytes and lines.
fn take_metric_output() -> (f64, f64) {
    use std::sync::atomic::Ordering::Relaxed;
    flush_metrics();
    (METRIC_BYTES.swap(0, Relaxed) as f64, METRIC_LINES.swap(0, Relaxed) as f64)
}

#[derive(Debug, Default)]
struct Meter {
    wru: f64,
    index_wru: f64,
    /// Within `index_wru`: `ByCompleteBy`'s writes and `ByWatchedSince`'s.
    expiry_wru: f64,
    flight_wru: f64,
    rru: f64,
    send_requests: f64,
    /// `GetQueueAttributes` requests (the door's reads of the queues' depths).
    depth_requests: f64,
    messages: HashMap<&'static str, f64>,
    /// Writes of state records (conditional puts and the submission's), and the largest
    /// state item written.
    state_writes: f64,
    largest_item: usize,
    /// Write units of the orders' items (their own table), within `wru`.
    orders_wru: f64,
    /// The functions' embedded-metric output: bytes and lines.
    metric_bytes: f64,
    metric_lines: f64,
    /// The functions' own log lines: bytes and lines.
    log_bytes: f64,
    log_lines: f64,
    /// The distinct traces the orders, their children included, belong to.
    traces: f64,
    /// The traces kept whatever the sampling: a message told of a fault in their order, or the
    /// supervisor sent one ([`sas_aws::trace`]).
    kept: HashSet<String>,
    /// The events the stack put on its bus.
    events: Vec<BusEvent>,
    /// What the finished orders keep in DynamoDB: their items' sizes, with the 100 bytes
    /// DynamoDB adds to each item it stores; those forgotten after the retention, and those
    /// kept for ever (child orders, and every order without a retention).
    expiring_bytes: f64,
    stored_bytes: f64,
    stored_items: f64,
    /// The payload bucket: objects written and read, and the bytes written.
    s3_puts: f64,
    s3_gets: f64,
    s3_bytes: f64,
}

/// The payload bucket, counted.
#[derive(Clone, Debug)]
struct MeteredPayloads {
    inner: Arc<MemoryPayloads>,
    meter: Arc<Mutex<Meter>>,
}

impl Payloads for MeteredPayloads {
    async fn put(&self, key: &str, body: Vec<u8>) -> Result<()> {
        {
            let mut m = self.meter.lock().unwrap_or_else(|e| e.into_inner());
            m.s3_puts += 1.0;
            m.s3_bytes += body.len() as f64;
        }
        self.inner.put(key, body).await
    }

    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.meter.lock().unwrap_or_else(|e| e.into_inner()).s3_gets += 1.0;
        self.inner.get(key).await
    }
}

#[derive(Clone, Debug)]
struct MeteredStore {
    inner: Arc<MemoryStore<ManualClock>>,
    meter: Arc<Mutex<Meter>>,
}

fn units(bytes: usize, unit: usize) -> f64 {
    bytes.div_ceil(unit).max(1) as f64
}

/// A `GetItem`: one unit per 4 KB read consistently, half that eventually.
fn read_units(bytes: usize, read: Read) -> f64 {
    let units = units(bytes, 4096);
    if read == Read::Consistent { units } else { units / 2.0 }
}

/// Index writes caused by a table write, all five indexes together, and within them those of
/// the two sharded by `ExpiryShard`, each with its own partitions (`ByCompleteBy`'s,
/// `ByWatchedSince`'s): what the busier of them takes bounds a new stack (see `ceiling`).
fn index_writes(old: Option<&StateRecord>, new: &StateRecord) -> (f64, f64, f64) {
    let (expiry, flight) = (expiry_index_writes(old, new), in_flight_index_writes(old, new));
    let all = expiry
        + flight
        + held_index_writes(old, new)
        + attention_index_writes(old, new)
        + search_index_writes(old, new);
    (all, expiry, flight)
}

/// Writes of the `BySearchKey` index (keys only, written as the order is accepted and never
/// changed): one as an order of a workflow that declares a `search_key` is accepted, none
/// after. Its entry leaves with the item, by time to live, which writes nothing billed.
fn search_index_writes(old: Option<&StateRecord>, new: &StateRecord) -> f64 {
    let key = |r: &StateRecord| r.search_key.clone().map(|v| (v, r.created_at, r.order_id));
    match (old.and_then(key), key(new)) {
        (None, None) => 0.0,
        (Some(a), Some(b)) if a == b => 0.0,
        (Some(_), Some(_)) => 2.0,
        _ => 1.0,
    }
}

/// Writes of the `ByWatchedSince` index (keys and the workflow, which never changes): one as an
/// order is accepted or taken up again and one as it ends, pauses or fails; two when since when
/// it is watched moves (a wait for a time or an answer begins or ends).
fn in_flight_index_writes(old: Option<&StateRecord>, new: &StateRecord) -> f64 {
    let key = |r: &StateRecord| r.process_state.is_in_flight().then(|| r.watched_since());
    match (old.and_then(key), key(new)) {
        (None, None) => 0.0,
        (Some(a), Some(b)) if a == b => 0.0,
        (Some(_), Some(_)) => 2.0,
        _ => 1.0,
    }
}

/// Writes of the `ByAttention` index, which projects the step, the cause and the workflow:
/// one as an order joins or leaves an operator's list (an order waiting for an answer is on
/// one while it waits), two to move it, one to rewrite it in place.
fn attention_index_writes(old: Option<&StateRecord>, new: &StateRecord) -> f64 {
    let key = |r: &StateRecord| r.attention().map(|a| (a.list, a.since));
    let projected = |r: &StateRecord| r.attention().map(|a| (a.step, a.cause));
    match (old.and_then(key), key(new)) {
        (None, None) => 0.0,
        (None, Some(_)) | (Some(_), None) => 1.0,
        (Some(a), Some(b)) if a == b => {
            if old.and_then(projected) == projected(new) {
                0.0
            } else {
                1.0
            }
        }
        _ => 2.0,
    }
}

/// Writes of the `ByHeldService` index (keys only: `HeldOn`, `HeldSince`): one as an order
/// starts or stops waiting for a held service, none while it waits.
fn held_index_writes(old: Option<&StateRecord>, new: &StateRecord) -> f64 {
    let key = |r: &StateRecord| r.held_on().map(|h| (h.key(), h.since));
    match (old.and_then(key), key(new)) {
        (None, None) => 0.0,
        (Some(a), Some(b)) if a == b => 0.0,
        (Some(_), Some(_)) => 2.0,
        _ => 1.0,
    }
}

/// Writes of the `ByCompleteBy` index, which projects the keys and `CreatedAt`: one to add or
/// remove an entry, two to move it (a key change), one to rewrite it in place (`CreatedAt`
/// changed), none when it stays as it is.
fn expiry_index_writes(old: Option<&StateRecord>, new: &StateRecord) -> f64 {
    let key = |r: &StateRecord| r.complete_by.map(|cb| (r.shard, cb));
    let projected = |r: &StateRecord| r.watched_since();
    match (old.and_then(key), key(new)) {
        (None, None) => 0.0,
        (None, Some(_)) | (Some(_), None) => 1.0,
        (Some(a), Some(b)) if a == b => {
            if old.map(projected) == Some(projected(new)) {
                0.0
            } else {
                1.0
            }
        }
        _ => 2.0,
    }
}

impl StateStore for MeteredStore {
    async fn create_order(&self, order: &OrderRecord) -> Result<Created> {
        let created = self.inner.create_order(order).await?;
        // A conditional put costs a unit per KB, whether it succeeds or not.
        let mut m = self.meter.lock().unwrap_or_else(|e| e.into_inner());
        m.wru += units(order_item_size(order), 1024);
        m.orders_wru += units(order_item_size(order), 1024);
        if created == Created::Created {
            m.stored_bytes += (order_item_size(order) + ITEM_OVERHEAD) as f64;
            m.stored_items += 1.0;
        }
        Ok(created)
    }

    async fn create_state(&self, state: &StateRecord) -> Result<Created> {
        let created = self.inner.create_state(state).await?;
        let mut m = self.meter.lock().unwrap_or_else(|e| e.into_inner());
        m.wru += units(state_item_size(state)?, 1024);
        m.state_writes += 1.0;
        if created == Created::Created {
            let (all, expiry, flight) = index_writes(None, state);
            m.index_wru += all;
            m.expiry_wru += expiry;
            m.flight_wru += flight;
        }
        Ok(created)
    }

    async fn load(&self, id: OrderId, read: Read) -> Result<Option<StateRecord>> {
        let r = self.inner.load(id, read).await?;
        let size = r.as_ref().map(state_item_size).transpose()?.unwrap_or(0);
        self.meter.lock().unwrap_or_else(|e| e.into_inner()).rru += read_units(size, read);
        Ok(r)
    }

    async fn load_order(&self, id: OrderId, read: Read) -> Result<Option<OrderRecord>> {
        let r = self.inner.load_order(id, read).await?;
        let size = r.as_ref().map(order_item_size).unwrap_or(0);
        self.meter.lock().unwrap_or_else(|e| e.into_inner()).rru += read_units(size, read);
        Ok(r)
    }

    async fn save(&self, next: &StateRecord, expected: Expected) -> Result<Saved> {
        let old = self.inner.peek(next.order_id);
        let saved = self.inner.save(next, expected).await?;
        let mut m = self.meter.lock().unwrap_or_else(|e| e.into_inner());
        // A put is billed on the larger of the old and new item; a failed condition still pays.
        let old_size = old.as_ref().map(state_item_size).transpose()?.unwrap_or(0);
        let new_size = state_item_size(next)?;
        m.wru += units(old_size.max(new_size), 1024);
        m.state_writes += 1.0;
        m.largest_item = m.largest_item.max(new_size);
        if saved == Saved::Saved {
            let (all, expiry, flight) = index_writes(old.as_ref(), next);
            m.index_wru += all;
            m.expiry_wru += expiry;
            m.flight_wru += flight;
        }
        Ok(saved)
    }

    // A key's places and its line are items of under a kilobyte: a unit a call.
    async fn slots(&self, key: &str) -> Result<Slots> {
        let out = self.inner.slots(key).await?;
        self.meter.lock().unwrap_or_else(|e| e.into_inner()).rru += 1.0;
        Ok(out)
    }
    async fn save_slots(&self, next: &Slots) -> Result<Saved> {
        let was_idle = self.inner.slots(&next.key).await?.running.is_empty();
        let out = self.inner.save_slots(next).await?;
        let mut meter = self.meter.lock().unwrap_or_else(|e| e.into_inner());
        meter.wru += 1.0;
        // A key that becomes busy or idle enters or leaves `ByBusyKey`: one index write.
        if out == Saved::Saved && was_idle != next.running.is_empty() {
            meter.index_wru += 1.0;
        }
        Ok(out)
    }
    async fn join(&self, key: &str, queued: &Queued) -> Result<()> {
        self.inner.join(key, queued).await?;
        self.meter.lock().unwrap_or_else(|e| e.into_inner()).wru += 1.0;
        Ok(())
    }
    async fn line(&self, key: &str, limit: usize) -> Result<Vec<Queued>> {
        let out = self.inner.line(key, limit).await?;
        self.meter.lock().unwrap_or_else(|e| e.into_inner()).rru += 1.0;
        Ok(out)
    }
    async fn ahead(&self, key: &str, position: &str) -> Result<u32> {
        let out = self.inner.ahead(key, position).await?;
        self.meter.lock().unwrap_or_else(|e| e.into_inner()).rru += 1.0;
        Ok(out)
    }
    async fn leave(&self, key: &str, queued: &Queued) -> Result<()> {
        self.inner.leave(key, queued).await?;
        self.meter.lock().unwrap_or_else(|e| e.into_inner()).wru += 1.0;
        Ok(())
    }
    async fn put_page(&self, page: &Page) -> Result<()> {
        self.inner.put_page(page).await?;
        let bytes = page_item_size(page);
        self.meter.lock().unwrap_or_else(|e| e.into_inner()).wru += units(bytes, 1024);
        Ok(())
    }
    async fn pages(&self, pass: &str) -> Result<Vec<Page>> {
        let pages = self.inner.pages(pass).await?;
        let bytes: usize = pages.iter().map(page_item_size).sum();
        // One consistent query: its items' bytes, at least one unit.
        self.meter.lock().unwrap_or_else(|e| e.into_inner()).rru += units(bytes, 4096).max(1.0);
        Ok(pages)
    }
    async fn drop_pages(&self, pass: &str) -> Result<()> {
        let pages = self.pages(pass).await?;
        self.inner.drop_pages(pass).await?;
        let units: f64 = pages.iter().map(|p| units(page_item_size(p), 1024)).sum();
        self.meter.lock().unwrap_or_else(|e| e.into_inner()).wru += units;
        Ok(())
    }
}

/// A page's item in `KeysTable`: its keys, its outputs' JSON and DynamoDB's 100 bytes.
fn page_item_size(page: &Page) -> usize {
    let outputs = serde_json::to_string(&page.outputs).map_or(0, |s| s.len());
    ITEM_OVERHEAD + page.pass.len() + page.id.len() + "KeyEntryOutputspage#".len() + outputs
}

/// An index item's size: the keys and a few attributes.
const INDEX_ITEM_BYTES: usize = 100;

/// A query of an index, eventually consistent: half a unit per 4 KB of what it returns.
fn query_units(items: usize) -> f64 {
    units(items * INDEX_ITEM_BYTES, 4096) / 2.0
}

impl ExpiryIndex for MeteredStore {
    async fn due(&self, shard: u16, due_by: Timestamp) -> Result<Vec<IndexEntry>> {
        let found = self.inner.due(shard, due_by).await?;
        self.meter.lock().unwrap_or_else(|e| e.into_inner()).rru += query_units(found.len());
        Ok(found)
    }
}

impl HeldIndex for MeteredStore {
    async fn held(&self, service: &str, limit: usize) -> Result<Vec<OrderId>> {
        let found = self.inner.held(service, limit).await?;
        self.meter.lock().unwrap_or_else(|e| e.into_inner()).rru += query_units(found.len());
        Ok(found)
    }

    async fn count_held(&self, service: &str) -> Result<u64> {
        let count = self.inner.count_held(service).await?;
        let items = usize::try_from(count).unwrap_or(usize::MAX);
        self.meter.lock().unwrap_or_else(|e| e.into_inner()).rru += query_units(items);
        Ok(count)
    }
}

#[derive(Debug)]
struct MeteredOutbox {
    inner: Arc<MemoryQueues<ManualClock>>,
    meter: Arc<Mutex<Meter>>,
    /// The supervisor's: every trace it sends for is kept.
    keeps_every_trace: bool,
}

impl Outbox for MeteredOutbox {
    async fn send(&self, messages: &[Outgoing]) -> Result<()> {
        self.inner.send(messages).await?;
        let mut m = self.meter.lock().unwrap_or_else(|e| e.into_inner());
        let mut per_queue: HashMap<&Destination, usize> = HashMap::new();
        for msg in messages {
            *per_queue.entry(&msg.to).or_default() += 1;
            let kind = match msg.message {
                Message::Start(_) => "start",
                Message::Request(_) | Message::Elements(_) => "request",
                Message::Reply(_) | Message::ChildEnded(_) | Message::ElementsReply(_) => "reply",
                Message::Event(_) => "bus_event",
            };
            *m.messages.entry(kind).or_default() += 1.0;
            // The calls an agent makes for it: one a step, one each element it carries.
            let calls = match &msg.message {
                Message::Request(_) => 1.0,
                Message::Elements(r) => r.elements.len() as f64,
                _ => 0.0,
            };
            *m.messages.entry("call").or_default() += calls;
            if self.keeps_every_trace || msg.message.tells_of_fault() {
                m.kept.insert(msg.message.correlation_id().to_owned());
            }
        }
        // SendMessageBatch: one request per queue per ten messages.
        m.send_requests += per_queue.values().map(|n| n.div_ceil(10) as f64).sum::<f64>();
        Ok(())
    }
}

/// The wait gauge, metered: a report is one write unit (its item is far under 1 KB), a read
/// is one eventually consistent scan of a table of a few small items (half a unit).
#[derive(Debug)]
struct MeteredWaits {
    inner: MemoryWaits,
    meter: Arc<Mutex<Meter>>,
}

impl WaitGauge for MeteredWaits {
    async fn report(&self, report: &WaitReport) -> Result<()> {
        self.meter.lock().unwrap_or_else(|e| e.into_inner()).wru += 1.0;
        self.inner.report(report).await
    }

    async fn reports(&self, now: Timestamp) -> Result<Vec<WaitReport>> {
        self.meter.lock().unwrap_or_else(|e| e.into_inner()).rru += 0.5;
        self.inner.reports(now).await
    }
}

/// The services table, metered: a consistent read of a service's record is one read unit;
/// each save, turn taken, place taken or given back one write unit.
#[derive(Clone, Debug)]
struct MeteredBook {
    inner: Arc<MemoryServiceBook>,
    meter: Arc<Mutex<Meter>>,
}

impl MeteredBook {
    fn count(&self, wru: f64, rru: f64) {
        let mut m = self.meter.lock().unwrap_or_else(|e| e.into_inner());
        m.wru += wru;
        m.rru += rru;
    }
}

impl ServiceBook for MeteredBook {
    async fn load(&self, service: &str) -> Result<Option<ServiceRecord>> {
        self.count(0.0, 1.0);
        self.inner.load(service).await
    }
    async fn all(&self) -> Result<Vec<ServiceRecord>> {
        self.count(0.0, 1.0);
        self.inner.all().await
    }
    async fn save(&self, next: &ServiceRecord) -> Result<Saved> {
        self.count(1.0, 0.0);
        self.inner.save(next).await
    }
}

impl Pace for MeteredBook {
    async fn take_turn(
        &self,
        service: &str,
        spacing: std::time::Duration,
        now: Timestamp,
        latest: Timestamp,
    ) -> Result<Booked> {
        self.count(1.0, 0.0);
        self.inner.take_turn(service, spacing, now, latest).await
    }
    async fn enter(
        &self,
        service: &str,
        limit: u32,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<Option<Place>> {
        self.count(1.0, 0.0);
        self.inner.enter(service, limit, now, until).await
    }
    async fn leave(&self, service: &str, place: Place) -> Result<()> {
        self.count(1.0, 0.0);
        self.inner.leave(service, place).await
    }
    async fn usage(&self, service: &str, now: Timestamp) -> Result<Usage> {
        self.count(0.0, 1.0);
        self.inner.usage(service, now).await
    }
}

/// Queue depths, metered: one `GetQueueAttributes` per queue.
#[derive(Clone, Debug)]
struct MeteredDepths {
    inner: Arc<MemoryQueues<ManualClock>>,
    queues: usize,
    meter: Arc<Mutex<Meter>>,
}

impl QueueDepths for MeteredDepths {
    async fn depths(&self) -> Result<Vec<(Destination, Depth)>> {
        self.meter.lock().unwrap_or_else(|e| e.into_inner()).depth_requests += self.queues as f64;
        self.inner.depths().await
    }
}

/// Mean messages a batch, by queue: the scheduler's start and reply queues, and an agent's.
#[derive(Clone, Copy, Debug)]
struct Batches {
    start: f64,
    replies: f64,
    agent: f64,
}

impl Batches {
    /// Full batches, as under load.
    const FULL: Batches = Batches::all(10.0);

    /// Batches of `messages` on every queue.
    const fn all(messages: f64) -> Batches {
        Batches { start: messages, replies: messages, agent: messages }
    }

    /// The batches the template's mappings make at the model's rate of `s`'s orders, whose
    /// messages `counted` counted over `orders`. An agent's rate is its share of the requests.
    fn filled(
        s: &Scenario,
        counted: &Meter,
        orders: f64,
        params: &Params,
        full: &Durations,
    ) -> Batches {
        let rate = |k: &str| {
            counted.messages.get(k).copied().unwrap_or(0.0) / orders * ORDERS_PER_SECOND as f64
        };
        let agents = s.agents();
        let mapping = |invocation_ms: f64, window_s: f64| batches::Mapping {
            concurrency: params.poller_concurrency as usize,
            invocation_s: invocation_ms / 1000.0,
            window_s,
            batch_size: ceiling::BATCH_SIZE as usize,
        };
        let scheduler = mapping(full.scheduler_batch_ms, params.scheduler_window_s);
        let agent = mapping(full.agent_batch_ms, params.agent_window_s);
        Batches {
            start: batches::mean_batch(&scheduler, rate("start") + rate("bus_event")),
            replies: batches::mean_batch(&scheduler, rate("reply")),
            agent: batches::mean_batch(&agent, rate("request") / agents),
        }
    }

    fn of(&self, destination: &Destination) -> f64 {
        match destination {
            Destination::Scheduler => self.start,
            Destination::Replies => self.replies,
            Destination::Agent(_) => self.agent,
        }
    }
}

/// What a stack deployed at the template's defaults adds to each order's bill.
struct Deployed {
    /// Share of orders traced whole (`TraceSamplePercent`).
    trace_share: f64,
    /// Lambda traces the invocations itself (`Tracing: Active` on the functions).
    lambda_tracing: bool,
    /// The API's access log line for a request.
    access_line: String,
    /// The bus's rules the stack has at the defaults.
    rules: Rules,
    /// How long an ended order is kept (`OrderRetentionDays`), if not for ever.
    retention: Option<std::time::Duration>,
    /// Each function's processor time, as `local-stack durations` measured it.
    measured: Measured,
    /// Each kind of function's memory.
    memory: Memory,
}

impl Deployed {
    /// How long invocations last whose batches hold `batch` messages.
    fn durations(&self, batch: f64) -> Durations {
        Durations::on_aws(&self.measured, &self.memory, batch)
    }
}

/// Version 4 UUIDs, as the functions make them, from a seeded generator: a deflated record is
/// as large as the functions' and the figures are the same from run to run.
#[derive(Debug)]
struct SeededUuids(SplitMix);

impl Default for SeededUuids {
    fn default() -> Self {
        SeededUuids(SplitMix::seeded(58))
    }
}

impl Ids for SeededUuids {
    fn new_id(&self) -> String {
        let bits = (u128::from(self.0.next_u64()) << 64) | u128::from(self.0.next_u64());
        uuid::Builder::from_random_bytes(bits.to_le_bytes()).into_uuid().to_string()
    }
}

/// The rules on the stack's bus, as a stack at the defaults has them (a rule whose condition
/// does not hold is not there): each rule's pattern, and how many of its targets are queues.
struct Rules(Vec<(Pattern, f64)>);

impl Rules {
    fn of(template: &Template, ctx: &Context) -> std::result::Result<Rules, String> {
        let mut rules = Vec::new();
        for (id, rule) in template.of_kind("AWS::Events::Rule") {
            if !ctx.holds(rule.condition.as_deref()) {
                continue;
            }
            let Some(pattern) = rule.properties.get("EventPattern") else { continue };
            let pattern = ctx.eval(pattern).map_err(|e| format!("{id}: {e}"))?;
            let pattern = Pattern::of_rule(&pattern).map_err(|e| format!("{id}: {e}"))?;
            let targets = rule.properties["Targets"].as_array().into_iter().flatten();
            let queues = targets
                .filter(|t| {
                    let target =
                        t["Arn"]["Fn::GetAtt"][0].as_str().and_then(|q| template.resource(q));
                    target.is_some_and(|r| r.kind == "AWS::SQS::Queue")
                })
                .count();
            rules.push((pattern, queues as f64));
        }
        Ok(Rules(rules))
    }

    /// The SQS requests the rules make to deliver `event`, one per queue it reaches.
    fn deliveries(&self, event: &BusEvent) -> f64 {
        let event = serde_json::json!({
            "source": OWN_SOURCE,
            "detail-type": event.detail_type,
            "detail": serde_json::from_str::<serde_json::Value>(&event.detail).unwrap_or_default(),
        });
        let reached = self.0.iter().filter(|(p, _)| p.matches(&event));
        reached.fold(0.0, |all, (_, queues)| all + queues)
    }
}

#[derive(Default)]
struct Scenario {
    name: &'static str,
    workflow: String,
    /// State transitions of the equivalent Step Functions Standard workflow.
    sfn_transitions: f64,
    /// What the payment service is declared to accept.
    payment: Limits,
    /// The payment service is held (by hand) as the orders come, and released once they all
    /// wait for it: every order waits once, and is resumed by the supervisor.
    held: bool,
    /// The payment step answers an output of this many bytes, stored in the payload bucket.
    large_output: Option<usize>,
    /// The order's input lists this many parcels, each shipped by one call of the shipping
    /// agent (the workflow runs a step over them, inline), or by a child order of its own.
    parcels: Option<usize>,
    /// Each order is started by an event put on the stack's bus, which the bus's rule hands
    /// to the scheduler queue, instead of by a client through the HTTP API.
    by_event: bool,
    /// The workflow runs one order of a customer at a time (`concurrency`, limit 1), and this
    /// many orders in a row are of one customer, accepted together: all but the first of them
    /// wait in line.
    per_customer: Option<usize>,
}

impl Scenario {
    /// The agents its workflow calls (at least one, as a divisor).
    fn agents(&self) -> f64 {
        Workflow::agents_in(&self.workflow).len().max(1) as f64
    }
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let orders: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1000);
    // Batches of a fixed size if given (10: what the mappings deliver under load), or as the
    // mappings fill them at the model's rate.
    let fixed: Option<f64> =
        args.next().map(|a| a.parse::<f64>()).transpose()?.map(|b| b.clamp(1.0, 10.0));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../template.yaml");
    let template = Template::load(&path)?;
    let defaults = Params::of_stack("defaults", &template, &[])?;
    let access_format = template
        .resource("HttpApiStage")
        .and_then(|stage| stage.properties["AccessLogSettings"]["Format"].as_str())
        .ok_or("the HTTP API's stage has no access log format")?;
    let lambda_tracing = template.globals["Function"]["Tracing"] == "Active";
    let at_defaults = Context::new(&template, "cost-model", "us-east-1", &HashMap::new())?;
    let deployed = Deployed {
        trace_share: defaults.trace_share,
        lambda_tracing,
        access_line: access_log_line(access_format),
        rules: Rules::of(&template, &at_defaults)?,
        retention: (defaults.retention_days > 0.0)
            .then(|| std::time::Duration::from_secs_f64(defaults.retention_days * 86_400.0)),
        measured: Measured::recorded()?,
        memory: Memory::of_stack(&template, &[])?,
    };
    let full = deployed.durations(ceiling::BATCH_SIZE);
    // The functions' log lines, as they print them at `LogLevel`'s default.
    sas_aws::telemetry::init_json(tracing_subscriber::EnvFilter::new("info"), || CountedLog);
    // The recorder the functions install, in a stack's namespace (`orders` here), under a
    // function name as long as theirs.
    let collector = metrics_cloudwatch_embedded::Builder::new()
        .cloudwatch_namespace("SchedulerAgentSupervisor/orders".to_owned())
        .with_dimension("Function", "scheduler".to_owned())
        .init()
        .map_err(|e| e.to_string())?;
    let _ = COLLECTOR.set(collector);
    sas_engine::metrics::describe();
    sas_engine::metrics::print_ends_at_once(flush_metrics);
    let scenarios = [
        Scenario {
            name: "one step",
            workflow: r#"{"name":"charge","steps":[{"name":"charge-payment","agent":"payment","budget_seconds":30,
                          "compensation":{"action":"refund-payment"}}]}"#
                .into(),
            sfn_transitions: 3.0,
            ..Scenario::default()
        },
        Scenario {
            name: "three steps",
            workflow: sas_workflows::order_fulfilment().into(),
            sfn_transitions: 5.0,
            ..Scenario::default()
        },
        Scenario {
            name: "three steps, the payment service declared at 50 calls a second and 4 in flight",
            workflow: sas_workflows::order_fulfilment().into(),
            sfn_transitions: 5.0,
            payment: Limits { per_second: Some(50), in_flight: Some(4) },
            ..Scenario::default()
        },
        Scenario {
            name: "three steps, every order waiting once for the payment service while it is held",
            workflow: sas_workflows::order_fulfilment().into(),
            sfn_transitions: 5.0,
            held: true,
            ..Scenario::default()
        },
        Scenario {
            name: "three steps, the payment step answering 100 KiB (stored, and read by the shipping step)",
            workflow: sas_workflows::order_fulfilment().into(),
            sfn_transitions: 5.0,
            large_output: Some(100 * 1024),
            ..Scenario::default()
        },
        Scenario {
            name: "three steps, the first two side by side",
            workflow: sas_workflows::file("express-fulfilment").map_or("", |f| f.json).into(),
            // The Parallel state and its two branches' tasks, the last task, start and end.
            sfn_transitions: 6.0,
            ..Scenario::default()
        },
        Scenario {
            name: "three steps and a one-minute wait before shipping",
            workflow: with_wait(sas_workflows::order_fulfilment(), 60),
            // The Wait state is one more transition.
            sfn_transitions: 6.0,
            ..Scenario::default()
        },
        Scenario {
            name: "three steps and an approval from outside before shipping",
            workflow: with_callback(sas_workflows::order_fulfilment(), 172_800),
            // A task that waits for its token is one more transition.
            sfn_transitions: 6.0,
            ..Scenario::default()
        },
        Scenario {
            name: "ten steps, three of them side by side",
            workflow: ten_steps(),
            // Ten tasks, the Parallel state around three of them, and the start and end.
            sfn_transitions: 13.0,
            ..Scenario::default()
        },
        Scenario {
            name: "three steps, shipping 10 parcels, one call each (a step over them, inline)",
            workflow: fan_out(false),
            // A Map state over the parcels, a task per parcel, the two other tasks, start, end.
            sfn_transitions: 15.0,
            parcels: Some(10),
            ..Scenario::default()
        },
        Scenario {
            name: "three steps, shipping 50 parcels, one call each (a step over them, inline)",
            workflow: fan_out(false),
            sfn_transitions: 55.0,
            parcels: Some(50),
            ..Scenario::default()
        },
        Scenario {
            name: "three steps, shipping 10 parcels by a child order each (`as_orders`)",
            workflow: fan_out(true),
            sfn_transitions: 15.0,
            parcels: Some(10),
            ..Scenario::default()
        },
        Scenario {
            name: "three steps, one order of a customer at a time, each customer's key free",
            workflow: sas_workflows::order_fulfilment().into(),
            sfn_transitions: 5.0,
            per_customer: Some(1),
            ..Scenario::default()
        },
        Scenario {
            name: "three steps, one order of a customer at a time, ten orders of a customer at once",
            workflow: sas_workflows::order_fulfilment().into(),
            sfn_transitions: 5.0,
            per_customer: Some(10),
            ..Scenario::default()
        },
        Scenario {
            name: "three steps, each order started by an event on the bus",
            workflow: sas_workflows::order_fulfilment().into(),
            // EventBridge starting the state machine: the same transitions.
            sfn_transitions: 5.0,
            by_event: true,
            ..Scenario::default()
        },
    ];
    let filled = match fixed {
        Some(b) => format!("SQS batches of {b}"),
        None => format!(
            "SQS batches as the template's mappings fill them at {ORDERS_PER_SECOND} orders a second"
        ),
    };
    println!("# Cost per million orders (happy path), {orders} orders measured, {filled}\n");
    let mut three_steps = None;
    let mut lists = Vec::new();
    for s in scenarios {
        // A list's children are orders too: fewer of its orders tell as much.
        let measured = if s.parcels.is_some() { (orders / 10).max(1) } else { orders };
        // The messages an order sends do not depend on how they are batched: a first run
        // counts them, and gives each queue's rate.
        let batches = match fixed {
            Some(b) => Batches::all(b),
            None => {
                let counted =
                    runtime.block_on(run(&s, measured, &Batches::FULL, deployed.retention))?;
                Batches::filled(&s, &counted, measured as f64, &defaults, &full)
            }
        };
        let meter = runtime.block_on(run(&s, measured, &batches, deployed.retention))?;
        let total = report(&s, &meter, measured as f64, &batches, &deployed);
        if let Some(parcels) = s.parcels.filter(|_| s.name.contains("inline")) {
            lists.push((parcels as f64, total, meter.state_writes / measured as f64));
        }
        if s.name == "three steps" {
            three_steps = Some((per_order(&s, &meter, orders as f64, &deployed.rules), s, batches));
        }
    }
    if let [(few, few_cost, few_writes), (many, many_cost, many_writes)] = lists[..] {
        let elements = many - few;
        println!(
            "Each parcel more (one call, run inline): ${:.2} per million orders, {:.2} state writes \
             (the parent's, once for the answers of each ten).\n",
            (many_cost - few_cost) / elements,
            (many_writes - few_writes) / elements
        );
    }
    println!("## What the stack costs a month with no orders\n");
    print!(
        "{}",
        sas_infra::tools::idle::render(&sas_infra::tools::idle::idle(&template, &defaults)?)
    );
    println!();
    println!("## How long an invocation lasts\n");
    print!("{}", timing::render(&deployed.measured));
    println!(
        "\nThe template's memory: submission {:.0} MB, scheduler {:.0} MB, agents {:.0} MB, supervisor {:.0} MB.\n",
        deployed.memory.submission_mb,
        deployed.memory.scheduler_mb,
        deployed.memory.agent_mb,
        deployed.memory.supervisor_mb
    );
    if let Some((per, s, batches)) = three_steps {
        let large = Params::of_stack("large", &template, LARGE)?;
        print_memory_choice(&per, &batches, &deployed.measured, &[&defaults, &large]);
        print_ceiling(&per, &s, &template, defaults, &full)?;
    }
    Ok(())
}

/// For each kind of function and memory size, what its invocations cost per million orders
/// (`per` of them, in `batches` as at the model's rate) and the orders a second its queue's
/// mapping takes in full batches, for each parameter set: the two sides of choosing its memory.
fn print_memory_choice(per: &PerOrder, batches: &Batches, measured: &Measured, sets: &[&Params]) {
    println!(
        "What each kind of function's memory costs (Lambda's GB-seconds per million orders of the three-step workflow, at {ORDERS_PER_SECOND} orders a second) and the orders a second its queue then takes (full batches, `PollerConcurrency` batches at once) at {}:\n",
        sets.iter().map(|p| p.name).collect::<Vec<_>>().join(" / ")
    );
    let sizes: Vec<String> = timing::MEMORY_SIZES.iter().map(|mb| format!("{mb:.0} MB")).collect();
    println!("| function | {} |", sizes.join(" | "));
    println!("| --- |{}", " ---: |".repeat(sizes.len()));
    let gb_s = |ms: f64, mb: f64| ms / 1000.0 * mb / 1024.0 * price::LAMBDA_GB_SECOND * 1e6;
    let rows: [(&str, &dyn Fn(f64) -> String); 3] = [
        ("submission", &|mb| {
            let d = Durations::on_aws(measured, &Memory::all(mb), 1.0);
            format!("${:.2}", gb_s(per.api_requests * d.submission_ms, mb))
        }),
        ("scheduler", &|mb| {
            let at = |b: f64| Durations::on_aws(measured, &Memory::all(mb), b).scheduler_batch_ms;
            let cost = per.starts / batches.start * at(batches.start)
                + per.replies / batches.replies * at(batches.replies);
            let full = at(ceiling::BATCH_SIZE);
            let ceilings: Vec<String> = sets
                .iter()
                .map(|p| format!("{:.0}", ceiling::mapping(p, full, per.starts.max(per.replies))))
                .collect();
            format!("${:.2}, {}/s", gb_s(cost, mb), ceilings.join(" / "))
        }),
        ("agents", &|mb| {
            let at = |b: f64| Durations::on_aws(measured, &Memory::all(mb), b).agent_batch_ms;
            let cost = per.agents * per.agent_requests / batches.agent * at(batches.agent);
            let full = at(ceiling::BATCH_SIZE);
            let ceilings: Vec<String> = sets
                .iter()
                .map(|p| format!("{:.0}", ceiling::mapping(p, full, per.agent_requests)))
                .collect();
            format!("${:.2}, {}/s", gb_s(cost, mb), ceilings.join(" / "))
        }),
    ];
    for (name, cell) in rows {
        let cells: Vec<String> = timing::MEMORY_SIZES.iter().map(|&mb| cell(mb)).collect();
        println!("| {name} | {} |", cells.join(" | "));
    }
    println!();
}

/// What one order of `s` used of each resource the ceiling counts.
fn per_order(s: &Scenario, m: &Meter, orders: f64, rules: &Rules) -> PerOrder {
    let msg = |k: &str| m.messages.get(k).copied().unwrap_or(0.0) / orders;
    let agents = s.agents();
    let status = m.events.iter().filter(|e| e.detail_type == STATUS_DETAIL_TYPE).count();
    PerOrder {
        api_requests: 1.0 + msg("answer"),
        state_table_wcu: (m.wru - m.orders_wru) / orders,
        index_wcu: m.expiry_wru.max(m.flight_wru) / orders,
        starts: msg("start"),
        replies: msg("reply"),
        agent_requests: msg("request") / agents,
        agents,
        // One request per event: what an order publishes goes out as it happens.
        put_events: msg("event"),
        rule_deliveries: m.events.iter().map(|e| rules.deliveries(e)).sum::<f64>() / orders,
        // At the defaults (`StatusEvents=terminal`) every status event is an order's end.
        terminal_events: status as f64 / orders,
    }
}

/// The ceiling of one stack for the `s` workflow, at the template's defaults and at the larger
/// set the README gives.
fn print_ceiling(
    per: &PerOrder,
    s: &Scenario,
    template: &Template,
    defaults: Params,
    durations: &Durations,
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let large = Params::of_stack("large", template, LARGE)?;
    println!(
        "## How far one stack goes: the {} workflow
",
        s.name
    );
    println!(
        "Per order: {:.2} API requests, {:.3} write units on StateTable, {:.3} on the busier of its sharded indexes (`ByCompleteBy`, `ByWatchedSince`); {:.1} start, {:.1} replies, {:.1} requests on each of {:.0} agents' queues; {:.1} `PutEvents`. Orders a second each resource allows, in batches of {:.0}, with invocations of {:.0} ms (submission), {:.0} ms (scheduler batch) and {:.0} ms (agent batch): the waits assumed and the processor time measured, at the template's memory. `large`: {}.\n",
        per.api_requests,
        per.state_table_wcu,
        per.index_wcu,
        per.starts,
        per.replies,
        per.agent_requests,
        per.agents,
        per.put_events,
        ceiling::BATCH_SIZE,
        durations.submission_ms,
        durations.scheduler_batch_ms,
        durations.agent_batch_ms,
        LARGE.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "),
    );
    print!("{}", ceiling::render(per, durations, &[defaults, large]));
    Ok(())
}

/// `workflow_json` with a wait of `seconds` before its last step.
fn with_wait(workflow_json: &str, seconds: u64) -> String {
    let mut spec: serde_json::Value = serde_json::from_str(workflow_json).unwrap_or_default();
    if let Some(steps) = spec["steps"].as_array_mut() {
        let at = steps.len().saturating_sub(1);
        steps.insert(at, serde_json::json!({"name": "hold", "wait": {"seconds": seconds}}));
    }
    spec.to_string()
}

/// `workflow_json` with a step before its last that waits up to `seconds` for an answer.
fn with_callback(workflow_json: &str, seconds: u64) -> String {
    let mut spec: serde_json::Value = serde_json::from_str(workflow_json).unwrap_or_default();
    if let Some(steps) = spec["steps"].as_array_mut() {
        let at = steps.len().saturating_sub(1);
        let step =
            serde_json::json!({"name": "approval", "callback": {"timeout_seconds": seconds}});
        steps.insert(at, step);
    }
    spec.to_string()
}

/// Ten steps on five agents, each with an undo: one, then three that depend only on it (run
/// side by side), then six in a row after all three.
/// Reserve, ship each parcel of the order (ten at a time) by one call of its own, or, `as_orders`,
/// by a child order of its own, charge.
fn fan_out(as_orders: bool) -> String {
    serde_json::json!([
        {"name": "ship-parcel", "steps": [
            {"name": "ship", "agent": "shipping", "budget_seconds": 30,
             "compensation": {"action": "recall-parcel"}}]},
        {"name": "parcels", "steps": [
            {"name": "reserve-inventory", "agent": "inventory", "budget_seconds": 30,
             "compensation": {"action": "release-inventory"}},
            {"name": "ship-each", "each": {"items": "/input/parcels", "workflow": "ship-parcel",
             "max_concurrency": 10, "timeout_seconds": 3600, "as_orders": as_orders}},
            {"name": "charge-payment", "agent": "payment", "budget_seconds": 30,
             "compensation": {"action": "refund-payment"}}]}
    ])
    .to_string()
}

fn ten_steps() -> String {
    let steps: Vec<serde_json::Value> = (1..=10)
        .map(|i| {
            let depends_on: Vec<String> = match i {
                1 => Vec::new(),
                2..=4 => vec!["step-01".into()],
                5 => (2..=4).map(|d| format!("step-{d:02}")).collect(),
                _ => vec![format!("step-{:02}", i - 1)],
            };
            serde_json::json!({
                "name": format!("step-{i:02}"),
                "agent": format!("agent{}", (i - 1) % 5 + 1),
                "budget_seconds": 30,
                "compensation": {"action": format!("undo-{i:02}")},
                "depends_on": depends_on,
            })
        })
        .collect();
    serde_json::json!({"name": "ten", "steps": steps}).to_string()
}

async fn run(
    s: &Scenario,
    orders: usize,
    batches: &Batches,
    retention: Option<std::time::Duration>,
) -> std::result::Result<Meter, Box<dyn std::error::Error>> {
    let batch_size = |dest: &Destination| batches.of(dest).round().max(1.0) as usize;
    let clock = ManualClock::default();
    let meter = Arc::new(Mutex::new(Meter::default()));
    let memory = Arc::new(MemoryStore::new(clock.clone()));
    let store = MeteredStore { inner: memory.clone(), meter: meter.clone() };
    let queues = Arc::new(MemoryQueues::new(clock.clone()));
    let outbox = || {
        Arc::new(MeteredOutbox {
            inner: queues.clone(),
            meter: meter.clone(),
            keeps_every_trace: false,
        })
    };
    let bus = Arc::new(MemoryBus::new());
    // Every agent the workflows name is deployed; a list of workflows runs its last.
    let mut jsons: Vec<String> = match serde_json::from_str::<serde_json::Value>(&s.workflow)? {
        serde_json::Value::Array(list) => list.iter().map(|w| w.to_string()).collect(),
        _ => vec![s.workflow.clone()],
    };
    let mut agents: Vec<AgentName> = Vec::new();
    for json in &jsons {
        for agent in Workflow::agents_in(json) {
            if !agents.contains(&agent) {
                agents.push(agent);
            }
        }
    }
    if s.per_customer.is_some()
        && let Some(last) = jsons.last_mut()
    {
        let mut spec: serde_json::Value = serde_json::from_str(last)?;
        spec["concurrency"] = serde_json::json!({"key": "/input/customer_id", "limit": 1});
        *last = spec.to_string();
    }
    if s.by_event
        && let Some(last) = jsons.last_mut()
    {
        let mut spec: serde_json::Value = serde_json::from_str(last)?;
        spec["starts"] = serde_json::json!([{"event": {"pattern": {"source": ["shop.web"]}}}]);
        *last = spec.to_string();
    }
    let workflows =
        jsons.iter().map(|j| Workflow::from_json(j, &agents)).collect::<Result<Vec<_>>>()?;
    let workflow = Arc::new(workflows.last().cloned().ok_or("no workflow")?);
    let mut destinations = vec![Destination::Scheduler, Destination::Replies];
    destinations.extend(agents.iter().cloned().map(Destination::Agent));
    let waits = Arc::new(MeteredWaits { inner: MemoryWaits::default(), meter: meter.clone() });
    let depths =
        MeteredDepths { inner: queues.clone(), queues: destinations.len(), meter: meter.clone() };
    // Correlation ids as long as the deployed functions' (a UUID): they are stored.
    let system = Assembly {
        store,
        bus: bus.clone(),
        clock: clock.clone(),
        config: Arc::new(EngineConfig { retention, ..EngineConfig::default() }),
        catalogue: Arc::new(Catalogue::new(workflows)?),
        waits: waits.clone(),
        load: Gauges { waits, depths },
        payloads: MeteredPayloads { inner: Arc::default(), meter: meter.clone() },
    };
    // One generator for the run: its ids never repeat.
    let ids = Arc::new(SeededUuids::default());
    let submission = system.submission(outbox(), ids.clone());
    // The party outside, answering each step that waits for it through the orders API.
    let answers = system.operator(outbox());
    // The scheduler and the agents gather what a batch sends, as their functions do.
    let linger = std::time::Duration::from_millis(DEFAULT_SEND_LINGER_MS);
    let scheduler = (
        system.scheduler(Coalescing::new(outbox(), linger), "s"),
        system.starter(Coalescing::new(outbox(), linger), ids.clone()),
    );
    let remote = Arc::new(MemoryRemote::new(clock.clone()));
    if let Some(bytes) = s.large_output {
        remote.script("charge-payment", vec![Behaviour::Large(bytes); orders]);
    }
    // Every agent guards its service, as deployed: it reads the service's record at most once
    // a second, and a limited one takes its calls' turns and places.
    let book = MeteredBook { inner: Arc::default(), meter: meter.clone() };
    let agents: HashMap<Destination, _> = agents
        .into_iter()
        .map(|name| {
            let outbox = Coalescing::new(outbox(), linger);
            let limits = if name.as_str() == "payment" { s.payment } else { Limits::NONE };
            let agent = system
                .agent(&name, remote.clone(), outbox, SplitMix::seeded(1), name.as_str())
                .guarded(book.clone(), name.as_str(), HoldPolicy::default())
                .limited(limits);
            (Destination::Agent(name), agent)
        })
        .collect();

    let mut body = serde_json::json!({"customer_id": "customer-0042", "currency": "EUR",
        "items": [{"sku": "BOOK-1", "quantity": 2, "unit_price": 1250},
                  {"sku": "PEN-9", "quantity": 1, "unit_price": 300}],
        "ship_to": {"name": "Ada Lovelace", "line1": "12 St James's Square",
                    "city": "London", "postal_code": "SW1Y 4JH", "country": "GB"}});
    if let Some(n) = s.parcels {
        let parcels: Vec<serde_json::Value> =
            (0..n).map(|k| serde_json::json!({"parcel": format!("P-{k:03}"), "kg": 2})).collect();
        body["parcels"] = parcels.into();
    }
    let customer_of = |i: usize| match s.per_customer {
        Some(n) => {
            let mut body = body.clone();
            body["customer_id"] = format!("customer-{:06}", i / n).into();
            body.to_string()
        }
        None => body.to_string(),
    };
    // Orders arrive at ORDERS_PER_SECOND, each second's drained before the next: a steady
    // load the system keeps up with, so that what depends on time (the door's reads of the
    // queues, the consumers' reports) is counted as it would be.
    if s.held {
        let now = clock.now();
        let held = ServiceRecord::open("payment", now).hold_by(now, None, "ops", "maintenance");
        book.save(&held.ok_or("the payment service could not be held")?).await?;
    }
    let mut answered = 0;
    let _ = take_metric_output();
    let _ = take_log_output();
    for i in 0..orders {
        let workflow = Some(workflow.name());
        let owner = sas_engine::Owner::anonymous();
        let key = format!("order-{i:08}");
        let body = customer_of(i);
        if s.by_event {
            // As the bus's rule delivers it: one message to the scheduler queue.
            let detail: serde_json::Value = serde_json::from_str(&body)?;
            let event = serde_json::json!({"version": "0", "id": key, "source": "shop.web",
                "detail-type": "OrderPlaced", "detail": detail});
            let to = Outgoing::now(Destination::Scheduler, Message::Event(Box::new(event)));
            outbox().send(&[to]).await?;
        } else {
            submission.submit_to(&owner, workflow, &key, body.as_bytes()).await?;
        }
        flush_metrics();
        if (i + 1) % ORDERS_PER_SECOND == 0 || i + 1 == orders {
            drain(&queues, &clock, &destinations, &batch_size, &scheduler, &agents).await?;
            while answer(&bus, &answers, &mut answered).await? > 0 {
                drain(&queues, &clock, &destinations, &batch_size, &scheduler, &agents).await?;
            }
            clock.advance(std::time::Duration::from_secs(1));
        }
    }
    let supervisor = system.supervisor(Arc::new(MeteredOutbox {
        inner: queues.clone(),
        meter: meter.clone(),
        keeps_every_trace: true,
    }));
    if s.held {
        let waiting = memory.records().iter().filter(|r| r.held_on().is_some()).count();
        if waiting != orders {
            return Err(format!("{waiting} of {orders} orders wait for the held service").into());
        }
        let record = book.load("payment").await?.ok_or("the payment service has no record")?;
        let released = record.release_by(clock.now(), None, "ops", "maintenance over");
        book.save(&released.ok_or("the payment service could not be released")?).await?;
    }
    // Orders that wait are woken by their delayed start messages, and those of a released
    // service by the supervisor's tending once a minute: time goes on until they are.
    for second in 0..3600 {
        if memory.records().iter().all(|r| r.is_terminal()) {
            break;
        }
        if s.held && second % 60 == 0 {
            supervisor.tend(&book, true).await?;
        }
        clock.advance(std::time::Duration::from_secs(1));
        drain(&queues, &clock, &destinations, &batch_size, &scheduler, &agents).await?;
    }
    let unfinished = memory.records().iter().filter(|r| !r.is_terminal()).count();
    if unfinished > 0 {
        return Err(format!("{unfinished} orders did not finish").into());
    }
    let published = bus.published();
    let mut m = std::mem::take(&mut *meter.lock().unwrap_or_else(|e| e.into_inner()));
    (m.metric_bytes, m.metric_lines) = take_metric_output();
    (m.log_bytes, m.log_lines) = take_log_output();
    let records = memory.records();
    m.traces = records.iter().map(|r| &r.correlation_id).collect::<HashSet<_>>().len() as f64;
    for r in &records {
        let bytes = (state_item_size(r)? + ITEM_OVERHEAD) as f64;
        if r.expires_at.is_some() {
            m.expiring_bytes += bytes;
        } else {
            m.stored_bytes += bytes;
        }
        m.stored_items += 1.0;
    }
    m.messages.insert("event", published.len() as f64);
    m.events = published;
    m.messages.insert("answer", answered as f64);
    Ok(m)
}

/// Completes, as the party outside would, every step announced since the first `answered`
/// announcements; returns how many it answered now.
async fn answer<S, Q, C, P>(
    bus: &MemoryBus,
    answers: &Operator<S, Q, Arc<MemoryBus>, C, P>,
    answered: &mut usize,
) -> std::result::Result<usize, Box<dyn std::error::Error>>
where
    S: StateStore,
    Q: Outbox,
    C: Clock,
    P: Payloads,
{
    let announced = bus.of_type(CALLBACK_DETAIL_TYPE);
    let new = &announced[(*answered).min(announced.len())..];
    for a in new {
        let id: OrderId = a["order_id"].as_str().unwrap_or_default().parse()?;
        let complete = Answer::Complete { output: serde_json::json!({"approved": true}) };
        let step = a["step"].as_str().unwrap_or_default();
        let answering =
            Answering::new(step, a["token"].as_str(), complete, "arn:aws:iam::1:user/partner", "")?;
        answers.answer(id, &answering).await?;
    }
    *answered += new.len();
    Ok(new.len())
}

/// Hands every message to its function, batch by batch, until the queues are empty.
async fn drain<S, A>(
    queues: &MemoryQueues<ManualClock>,
    clock: &ManualClock,
    destinations: &[Destination],
    batch_size: &dyn Fn(&Destination) -> usize,
    scheduler: &S,
    agents: &HashMap<Destination, A>,
) -> std::result::Result<(), Box<dyn std::error::Error>>
where
    S: Handler,
    A: Handler,
{
    loop {
        let mut delivered = 0;
        for dest in destinations {
            // Each batch a moment after the last, as on AWS: a lease taken later ends later,
            // and moving the record's index entry costs what it would.
            clock.advance(std::time::Duration::from_millis(1));
            let batch = queues.receive(dest, batch_size(dest));
            delivered += batch.len();
            let mut event = SqsEvent::default();
            for d in &batch {
                let mut record = SqsMessage::default();
                // As long as SQS's (a UUID), since the record keeps the last one it handled;
                // derived from the queue's own id, so a redelivery keeps it.
                let id = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, d.message_id.as_bytes());
                record.message_id = Some(id.to_string());
                record.body = Some(d.body.clone());
                event.records.push(record);
            }
            let response = match agents.get(dest) {
                Some(agent) => agent.batch(event).await,
                None => scheduler.batch(event).await,
            };
            flush_metrics();
            if !response.batch_item_failures.is_empty() {
                return Err(format!("a batch from {dest:?} failed").into());
            }
            for d in &batch {
                queues.delete(dest, &d.receipt)?;
            }
        }
        if delivered == 0 {
            return Ok(());
        }
    }
}

/// A function's batch handler.
trait Handler {
    async fn batch(&self, event: SqsEvent) -> SqsBatchResponse;
}

type MeteredQueues = Arc<MeteredOutbox>;

/// The scheduler function: its scheduler, and its starter of the orders the bus's events start.
type SchedulerFn = (
    Scheduler<
        MeteredStore,
        Coalescing<MeteredQueues>,
        Arc<MemoryBus>,
        ManualClock,
        Arc<MeteredWaits>,
        MeteredPayloads,
    >,
    Starter<
        MeteredStore,
        Coalescing<MeteredQueues>,
        Arc<MemoryBus>,
        ManualClock,
        Arc<SeededUuids>,
        Unmetered,
        MeteredPayloads,
    >,
);

impl Handler for SchedulerFn {
    async fn batch(&self, event: SqsEvent) -> SqsBatchResponse {
        sas_scheduler::handle(&self.0, &self.1, event).await
    }
}

impl Handler
    for Agent<
        Arc<MemoryRemote<ManualClock>>,
        Coalescing<MeteredQueues>,
        ManualClock,
        SplitMix,
        Arc<MeteredWaits>,
        MeteredBook,
        MeteredPayloads,
    >
{
    async fn batch(&self, event: SqsEvent) -> SqsBatchResponse {
        sas_agent_kit::handle(self, event).await
    }
}

fn report(s: &Scenario, m: &Meter, orders: f64, batches: &Batches, deployed: &Deployed) -> f64 {
    let per = |x: f64| x / orders;
    let million = 1e6;
    // A month as AWS bills storage: 730 hours. An expired item is paid for until DynamoDB
    // deletes it, within two days.
    let retention_months = deployed.retention.map_or(0.0, |r| r.as_secs_f64() / (730.0 * 3600.0));
    let kept_months = deployed.retention.map_or(0.0, |_| retention_months + 48.0 / 730.0);
    let (wru, index, rru) = (per(m.wru), per(m.index_wru), per(m.rru));
    let sends = per(m.send_requests);
    let msg = |k: &str| per(m.messages.get(k).copied().unwrap_or(0.0));
    // An order a client submits comes through the HTTP API and the submission function; one
    // an event starts, as a message the bus's rule sends to the scheduler queue.
    let (submitted, started) = if s.by_event { (0.0, 1.0) } else { (1.0, 0.0) };
    let (start_invocations, reply_invocations) =
        ((msg("start") + msg("bus_event")) / batches.start, msg("reply") / batches.replies);
    let scheduler_invocations = start_invocations + reply_invocations;
    let agent_invocations = msg("request") / batches.agent;
    // Each batch is one ReceiveMessage and one DeleteMessageBatch.
    let receives_and_deletes = 2.0 * (scheduler_invocations + agent_invocations);
    let depth_reads = per(m.depth_requests);
    let sqs = sends + receives_and_deletes + depth_reads;
    // The submission, and each answer from outside, one invocation of the submission function.
    let invocations = submitted + msg("answer") + scheduler_invocations + agent_invocations;
    // Each invocation as long as its batch makes it, at its function's memory.
    // An agent works for each call it makes: a request of elements carries several.
    let calls_a_batch =
        if agent_invocations > 0.0 { msg("call") / agent_invocations } else { batches.agent };
    let (of_starts, of_replies, of_agents) = (
        deployed.durations(batches.start),
        deployed.durations(batches.replies),
        deployed.durations(calls_a_batch),
    );
    let memory = &deployed.memory;
    let gb_seconds = ((submitted + msg("answer")) * of_starts.submission_ms * memory.submission_mb
        + start_invocations * of_starts.scheduler_batch_ms * memory.scheduler_mb
        + reply_invocations * of_replies.scheduler_batch_ms * memory.scheduler_mb
        + agent_invocations * of_agents.agent_batch_ms * memory.agent_mb)
        / 1000.0
        / 1024.0;
    // The event that starts an order is put on the bus as the status events are.
    let events = msg("event") + started;
    // The orders' traces, and those Lambda records of the invocations it samples, function
    // by function, at the model's rate, if it traces them itself.
    let rate = ORDERS_PER_SECOND as f64;
    let agents = s.agents();
    let lambda_traces = if deployed.lambda_tracing {
        (lambda_traces((submitted + msg("answer")) * rate)
            + lambda_traces(scheduler_invocations * rate)
            + agents * lambda_traces(agent_invocations / agents * rate))
            / rate
    } else {
        0.0
    };
    // Every trace kept for a fault, and the share sampled of the others.
    let kept = m.kept.len() as f64;
    let traces = per(kept + deployed.trace_share * (m.traces - kept).max(0.0)) + lambda_traces;
    // CloudWatch Logs bills each event's bytes and 26 more.
    let logged = |bytes: f64, lines: f64| bytes + lines * price::CLOUDWATCH_LOGS_EVENT_BYTES;
    let lambda_bytes = logged(
        (LAMBDA_LINES.iter().map(|l| l.len()).sum::<usize>()
            + if deployed.lambda_tracing { LAMBDA_XRAY_LINE.len() } else { 0 }) as f64,
        LAMBDA_LINES.len() as f64,
    );
    let access_bytes = logged(deployed.access_line.len() as f64, 1.0);
    let rows = [
        ("API Gateway HTTP API requests", submitted + msg("answer"), price::HTTP_API_REQUEST),
        ("DynamoDB write units (table)", wru, price::DYNAMODB_WRU),
        ("DynamoDB write units (index)", index, price::DYNAMODB_WRU),
        ("DynamoDB read units", rru, price::DYNAMODB_RRU),
        ("SQS requests", sqs, price::SQS_REQUEST),
        // Each rule the stack has that an event matches delivers it to its queues: the
        // callbacks' queue, the alerts' queue, the sample subscriber's queue if created.
        (
            "SQS requests, the bus's rules delivering the events",
            per(m.events.iter().map(|e| deployed.rules.deliveries(e)).sum()),
            price::SQS_REQUEST,
        ),
        ("Lambda invocations", invocations, price::LAMBDA_REQUEST),
        ("Lambda GB-seconds", gb_seconds, price::LAMBDA_GB_SECOND),
        ("EventBridge events", events, price::EVENTBRIDGE_EVENT),
        ("X-Ray traces recorded", traces, price::XRAY_TRACE),
        ("S3 PUT requests (payloads)", per(m.s3_puts), price::S3_WRITE_REQUEST),
        ("S3 GET requests (payloads)", per(m.s3_gets), price::S3_READ_REQUEST),
        (
            "DynamoDB storage, GB-months (ended orders, until deleted)",
            per(m.expiring_bytes) / 1e9 * kept_months,
            price::DYNAMODB_STORAGE_GB_MONTH + price::DYNAMODB_PITR_GB_MONTH,
        ),
        (
            "S3 storage, GB-months (payloads, kept 90 days)",
            per(m.s3_bytes) / 1e9 * PAYLOAD_MONTHS,
            price::S3_STORAGE_GB_MONTH,
        ),
        (
            "CloudWatch Logs, metric lines (bytes)",
            logged(per(m.metric_bytes), per(m.metric_lines)),
            price::CLOUDWATCH_LOGS_GB / 1e9,
        ),
        (
            "CloudWatch Logs, the functions' log lines (bytes)",
            logged(per(m.log_bytes), per(m.log_lines)),
            price::CLOUDWATCH_LOGS_GB / 1e9,
        ),
        (
            "CloudWatch Logs, Lambda's START, END and REPORT lines (bytes)",
            invocations * lambda_bytes,
            price::CLOUDWATCH_LOGS_GB / 1e9,
        ),
        (
            "CloudWatch Logs, the API's access log (bytes)",
            (submitted + msg("answer")) * access_bytes,
            price::CLOUDWATCH_LOGS_GB / 1e9,
        ),
    ];
    println!("## {} workflow\n", s.name);
    println!("| item | per order | unit price | per million orders |");
    println!("| --- | ---: | ---: | ---: |");
    let mut total = 0.0;
    for (name, count, unit) in rows {
        // The payload bucket's rows only where values are stored.
        if name.starts_with("S3") && count == 0.0 {
            continue;
        }
        let cost = count * unit * million;
        total += cost;
        if name.contains("storage") {
            println!("| {name} | {count:.7} | ${unit:.3}/GB-month | ${cost:.2} |");
        } else if name.ends_with("(bytes)") {
            println!("| {name} | {count:.0} | ${:.2}/GB | ${cost:.2} |", unit * 1e9);
        } else {
            println!("| {name} | {count:.3} | ${:.4}/M | ${cost:.2} |", unit * million);
        }
    }
    println!("| **total** | | | **${total:.2}** |\n");
    println!(
        "Messages per order: {:.1} start, {:.1} request, {:.1} reply; SQS: {sends:.1} send requests + {receives_and_deletes:.2} receive/delete requests + {depth_reads:.2} queue-depth reads.",
        msg("start"),
        msg("request"),
        msg("reply")
    );
    println!(
        "Messages a batch: {:.2} start, {:.2} replies, {:.2} an agent's requests; {:.2} invocations of the scheduler and the agents per order.",
        batches.start,
        batches.replies,
        batches.agent,
        scheduler_invocations + agent_invocations
    );
    println!(
        "Metric lines per order: {:.2} ({:.0} bytes), printed once per invocation and once after each write that ended an order.",
        per(m.metric_lines),
        per(m.metric_bytes)
    );
    println!(
        "State writes per order: {:.2}, one conditional write per transition; largest state item written: {} bytes.",
        m.state_writes / orders,
        m.largest_item
    );
    println!(
        "Log lines per order: {:.2} of the functions' own ({:.0} bytes), {:.0} of Lambda's; traces: {:.3} of orders ({:.3} kept for a fault or sent by the supervisor, the rest at `TraceSamplePercent` {:.0}), {lambda_traces:.3} of Lambda's own.",
        per(m.log_lines),
        per(m.log_bytes),
        invocations * LAMBDA_LINES.len() as f64,
        traces - lambda_traces,
        per(kept),
        deployed.trace_share * 100.0,
    );
    let (expiring, stored) = (per(m.expiring_bytes), per(m.stored_bytes));
    let gb_month = price::DYNAMODB_STORAGE_GB_MONTH + price::DYNAMODB_PITR_GB_MONTH;
    println!(
        "Kept in DynamoDB once ended: {:.0} bytes per order ({:.2} items, each counted with DynamoDB's 100 bytes, at ${:.2} per GB-month and ${:.2} more for point-in-time recovery): {expiring:.0} deleted {:.0} days after the order ended (`OrderRetentionDays`), and up to two days later (DynamoDB's time to live), in the total; {stored:.0} kept for ever (child orders), ${:.2} per million orders for each month, not in it.",
        expiring + stored,
        per(m.stored_items),
        price::DYNAMODB_STORAGE_GB_MONTH,
        price::DYNAMODB_PITR_GB_MONTH,
        retention_months * 730.0 / 24.0,
        stored / 1e9 * gb_month * million,
    );
    let sfn = s.sfn_transitions * price::STEP_FUNCTIONS_TRANSITION * million
        + (price::HTTP_API_REQUEST + price::EVENTBRIDGE_EVENT) * million;
    println!(
        "Step Functions Standard for the same: {} transitions × $25/M + API + event = ${sfn:.0} per million.\n",
        s.sfn_transitions
    );
    total
}
