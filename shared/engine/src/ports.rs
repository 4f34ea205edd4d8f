//! Ports: what the engine needs from the outside world, shaped like what DynamoDB, SQS,
//! EventBridge and an HTTP service really offer, and nothing more.
//!
//! - [`StateStore`]: conditional single-item writes, and one small transaction (order and state
//!   record together). A failed condition is an outcome ([`Saved::Conflict`]), not an error.
//!   It also keeps each concurrency key's places (one item, written on its version) and its
//!   line (read in order, consistently).
//! - [`ExpiryIndex`]: a sparse, sharded index of records by CompleteBy, queried one shard at a
//!   time. Eventually consistent: it may lag behind the table, so whoever acts on an entry
//!   re-reads the record and writes with a condition.
//! - [`HeldIndex`]: a sparse index of the orders that wait for a hold, by what is held (a
//!   service, or one action of it) and since when, so that a service opening again finds its orders without a scan and an
//!   order that waits costs nothing per sweep.
//! - [`OrderFinder`]: the orders that need an operator (in Error, paused, or in flight for
//!   long), newest first and a page at a time, found through sparse indexes, never a scan.
//! - [`Outbox`]: at-least-once queues. A message may be delivered twice, late, or out of order.
//! - [`EventBus`]: publishing can fail for some events of a batch and not others.
//! - [`QueueDepths`]: how many messages each queue holds (SQS's approximate counts).
//! - [`WaitGauge`]: what the consumers report of how long messages waited for them.
//! - [`Clock`], [`Ids`], [`Random`]: time, identifiers and randomness, injected so tests decide.
//! - [`RemoteService`]: the business service behind one agent.
//! - [`ServiceBook`]: one record per service (open or held), each write conditional on the
//!   version read.
//! - [`Pace`]: each limited service's next free turn and its places in flight, each taken by
//!   a conditional write.
//! - [`Payloads`]: objects written whole and read back whole by key, as S3 keeps them.
//!
//! Each has an in-memory implementation in `crate::memory` (the `memory` feature) with the
//! same semantics, and an AWS implementation outside this crate. Methods return `Send` futures
//! so handlers can run them concurrently on a multi-threaded runtime.

use std::future::Future;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::bulk::BulkJob;

use crate::error::Result;
use crate::events::{BusEvent, PublishReport};
use crate::health::ServiceRecord;
use crate::ids::{AgentName, Direction, IdempotencyKey, OrderId, Owner};
use crate::keys::{Queued, Slots};
use crate::message::Message;
use crate::order::Order;
use crate::pace::{Booked, Place, Usage};
use crate::state::{ProcessState, StateRecord};
use crate::time::Timestamp;

/// An accepted order as stored in the orders table. Immutable once written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderRecord {
    pub order_id: OrderId,
    /// Who submitted it: the only caller it is shown to.
    pub owner: Owner,
    pub idempotency_key: IdempotencyKey,
    pub order: Order,
    pub created_at: Timestamp,
}

/// What a conditional write expects to find: the record exactly as it was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expected {
    pub process_state: ProcessState,
    pub attempt: u64,
    pub revision: u64,
}

impl Expected {
    pub fn of(record: &StateRecord) -> Expected {
        Expected {
            process_state: record.process_state,
            attempt: record.attempt,
            revision: record.revision,
        }
    }
}

/// Outcome of creating an order's item or its state record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Created {
    /// The item was written.
    Created,
    /// An item with this id already exists; nothing was written.
    AlreadyExists,
}

/// Outcome of a conditional write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Saved {
    Saved,
    /// The record was not as expected (someone else wrote first); nothing was written.
    Conflict,
}

/// How fresh a read must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Read {
    /// Sees every write that succeeded before it (DynamoDB's strongly consistent read).
    Consistent,
    /// May miss the latest writes for a moment, at half the price (DynamoDB's eventually
    /// consistent read). Only worth it where a stale answer is detected and read again.
    Eventual,
}

/// Refuses a state record no store may write, as [`Error::Corrupt`](crate::Error::Corrupt):
/// one that breaks an invariant of [`StateRecord::check`], or, for a save (`expected` given),
/// one whose revision is not `expected.revision + 1`. Every store calls it before writing, so
/// a broken transition fails where it was made, never on a later read.
pub fn check_write(next: &StateRecord, expected: Option<Expected>) -> Result<()> {
    let corrupt = |reason: String| crate::Error::Corrupt { order_id: next.order_id, reason };
    next.check().map_err(corrupt)?;
    if expected.is_some_and(|e| next.revision != e.revision + 1) {
        return Err(corrupt("revision must grow by one per write".into()));
    }
    Ok(())
}

/// The state table and the orders table.
pub trait StateStore: Send + Sync {
    /// Writes an order's item (its input and key), only if none exists with its id. The
    /// submission writes it before the state record, so that a record never lacks its order;
    /// an order whose record is missing was never accepted, and the next submission of its key
    /// writes the record (see [`crate::services::Submission`]).
    fn create_order(&self, order: &OrderRecord) -> impl Future<Output = Result<Created>> + Send;

    /// Writes a new state record, only if none exists with its id. A record [`check_write`]
    /// refuses is an error, and nothing is written.
    fn create_state(&self, state: &StateRecord) -> impl Future<Output = Result<Created>> + Send;

    /// Reads a state record.
    fn load(
        &self,
        id: OrderId,
        read: Read,
    ) -> impl Future<Output = Result<Option<StateRecord>>> + Send;

    /// Reads an order.
    fn load_order(
        &self,
        id: OrderId,
        read: Read,
    ) -> impl Future<Output = Result<Option<OrderRecord>>> + Send;

    /// Reads many state records at once, each as [`StateStore::load`] would, in the order of
    /// `ids`. A store that can read a batch in one call does (DynamoDB: 100 a call).
    fn load_many(
        &self,
        ids: &[OrderId],
        read: Read,
    ) -> impl Future<Output = Result<Vec<Option<StateRecord>>>> + Send {
        async move {
            let mut records = Vec::with_capacity(ids.len());
            for &id in ids {
                records.push(self.load(id, read).await?);
            }
            Ok(records)
        }
    }

    /// Replaces a state record if, and only if, it is still as `expected`. A record
    /// [`check_write`] refuses (its revision must be `expected.revision + 1`) is an error, and
    /// nothing is written.
    fn save(
        &self,
        next: &StateRecord,
        expected: Expected,
    ) -> impl Future<Output = Result<Saved>> + Send;

    // Concurrency keys ([`crate::keys`]): each key's places and its line.

    /// The places of `key`, read consistently; [`Slots::empty`] if none was ever written.
    fn slots(&self, key: &str) -> impl Future<Output = Result<Slots>> + Send;

    /// Writes `next` if the stored places of its key are still at `next.version - 1` (none
    /// stored, for version 1); reports a conflict otherwise.
    fn save_slots(&self, next: &Slots) -> impl Future<Output = Result<Saved>> + Send;

    /// Writes `queued` into `key`'s line, at its [`Queued::position`]; written again, the
    /// same entry.
    fn join(&self, key: &str, queued: &Queued) -> impl Future<Output = Result<()>> + Send;

    /// The first `limit` entries of `key`'s line, in order, read consistently.
    fn line(&self, key: &str, limit: usize) -> impl Future<Output = Result<Vec<Queued>>> + Send;

    /// How many entries of `key`'s line come before `position`.
    fn ahead(&self, key: &str, position: &str) -> impl Future<Output = Result<u32>> + Send;

    /// Takes the entry at `queued`'s position out of `key`'s line, if it is there.
    fn leave(&self, key: &str, queued: &Queued) -> impl Future<Output = Result<()>> + Send;

    // Pages ([`Page`]): the outputs of the elements of passes over lists run inline.

    /// Writes `page`, replacing any with its pass and id.
    fn put_page(&self, page: &Page) -> impl Future<Output = Result<()>> + Send;

    /// Every page of `pass`, in the order of their ids, read consistently.
    fn pages(&self, pass: &str) -> impl Future<Output = Result<Vec<Page>>> + Send;

    /// Deletes every page of `pass`.
    fn drop_pages(&self, pass: &str) -> impl Future<Output = Result<()>> + Send;
}

/// The outputs of elements of a pass over a list run inline, kept until the order no longer
/// needs them: one page for each write that took answers of that pass, written before it
/// (a page whose write then lost to another writer's is never read: the elements it holds are
/// taken, and paged, again). The record keeps only which elements ended well.
#[derive(Clone, Debug, PartialEq)]
pub struct Page {
    /// The pass: [`Page::pass_of`].
    pub pass: String,
    /// Unique within the pass, in the order of the writes: the revision of the write that
    /// took its answers, then the queue id of the reply that brought them.
    pub id: String,
    /// The output of each element it holds.
    pub outputs: std::collections::BTreeMap<u32, serde_json::Value>,
}

impl Page {
    /// The pass of `order`'s step `step` at its run `generation`.
    pub fn pass_of(order: OrderId, step: &str, generation: u32) -> String {
        format!("{order}#{step}#{generation}")
    }

    /// The id of the page of the write at `revision` that took the reply `message`.
    pub fn id_of(revision: u64, message: &str) -> String {
        format!("{revision:020}#{message}")
    }
}

/// One entry of the expiry index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    pub order_id: OrderId,
    pub complete_by: Timestamp,
    /// Since when its order is watched ([`StateRecord::watched_since`]).
    pub watched_since: Timestamp,
}

/// The sparse CompleteBy index.
pub trait ExpiryIndex: Send + Sync {
    /// Every entry of `shard` whose CompleteBy is at or before `due_by`, earliest first: the
    /// shard up to `due_by`, one small index item per order being watched, page after page.
    /// The sweep's one read of a shard: its head is what has expired, and the longest-watched
    /// of them all tells how long the oldest order has been worked on. Eventually consistent.
    fn due(
        &self,
        shard: u16,
        due_by: Timestamp,
    ) -> impl Future<Output = Result<Vec<IndexEntry>>> + Send;
}

/// The sparse index of orders waiting for a held service ([`StateRecord::held_on`]).
pub trait HeldIndex: Send + Sync {
    /// Orders waiting for the hold `on` names ([`crate::state::Held::key`]: a service, or one
    /// action of it), the longest-waiting first, at most `limit`. Eventually consistent:
    /// whoever acts on one re-reads it.
    fn held(&self, on: &str, limit: usize) -> impl Future<Output = Result<Vec<OrderId>>> + Send;

    /// How many orders wait for the hold `on` names.
    fn count_held(&self, on: &str) -> impl Future<Output = Result<u64>> + Send;
}

/// A concurrency key with orders running, as [`KeyIndex`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BusyKey {
    pub key: String,
    /// Since when it has had orders running without a break.
    pub since: Timestamp,
}

/// The sparse index of concurrency keys with orders running, for operators.
pub trait KeyIndex: Send + Sync {
    /// Up to `limit` keys with orders running, the longest busy first. Eventually consistent:
    /// a key that just became busy or idle may be missing or still there.
    fn busy_keys(&self, limit: usize) -> impl Future<Output = Result<Vec<BusyKey>>> + Send;
}

/// Which orders an operator asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listing {
    /// In Error, newest failure first.
    Failed,
    /// Paused, most recently paused first.
    Paused,
    /// In flight (Pending or Processing) and accepted at least this long ago, newest first.
    InFlight { older_than: Duration },
    /// Processed with a step's failure only reported, not yet acknowledged, newest first.
    Reported,
    /// In flight with a step waiting for an answer from outside, the latest to start waiting
    /// first.
    AwaitingAnswer,
}

/// A page of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListQuery {
    pub listing: Listing,
    /// Only orders that failed at (or are paused at) this step.
    pub step: Option<String>,
    /// Only orders whose failure cause is of this kind (`step_rejected`, ...).
    pub cause: Option<String>,
    /// Only orders of this workflow (any version).
    pub workflow: Option<String>,
    pub now: Timestamp,
    /// Partitions of the expiry index (in-flight listings query each).
    pub shards: u16,
    /// At most this many orders.
    pub limit: usize,
    /// Where the previous page ended (its `next`).
    pub after: Option<String>,
}

impl ListQuery {
    /// How many orders the page holds: the limit asked for, within 1 to 1,000.
    pub fn page_size(&self) -> usize {
        self.limit.clamp(1, 1000)
    }

    /// Where the page starts: the (since, order id) of the previous page's last order.
    pub fn start(&self) -> Result<Option<(Timestamp, OrderId)>> {
        cursor_start(self.after.as_deref())
    }
}

/// One order of a listing, as the index knows it: enough to choose, not to act.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    pub order_id: OrderId,
    /// The order's workflow and the version it runs.
    pub workflow: String,
    pub workflow_version: u32,
    /// Since when it is on the list: its failure, its pause, the start of its wait for an
    /// answer, or (in flight) since when it is watched ([`StateRecord::watched_since`]), a
    /// time to come while every step it holds waits for a time or an answer.
    pub since: Timestamp,
    /// When it joined the list: `since`, but in flight when it was last taken up
    /// ([`StateRecord::taken_up`]), never a time to come. A bulk command leaves alone the
    /// orders that joined after its ask.
    pub entered: Timestamp,
    pub step: Option<String>,
    pub cause: Option<String>,
}

/// A page of orders, and where the next one starts if there is more.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListPage {
    pub orders: Vec<Listed>,
    pub next: Option<String>,
}

/// Finds the orders that need an operator. Eventually consistent: an order may be listed a
/// moment after it left the list, so whoever acts re-reads it (commands do).
pub trait OrderFinder: Send + Sync {
    fn find(&self, query: &ListQuery) -> impl Future<Output = Result<ListPage>> + Send;

    /// How many orders `query`'s listing holds (its page and cursor aside), counting up to
    /// `cap`: what its index holds, never a scan of the table.
    fn count(&self, query: &ListQuery, cap: u64) -> impl Future<Output = Result<Counted>> + Send;

    /// Up to `limit` orders whose search key is `value` ([`StateRecord::search_key`]), each
    /// with when it was accepted, the newest first (those of one millisecond in an order the
    /// store keeps), after the entry `after`: what the search index holds, ended orders
    /// included, until the store forgets them.
    fn searched(
        &self,
        value: &str,
        after: Option<(Timestamp, OrderId)>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(Timestamp, OrderId)>>> + Send;
}

impl Counted {
    /// `found` orders counted against `cap`.
    pub fn of(found: u64, cap: u64, exact: bool) -> Counted {
        Counted { orders: found.min(cap), capped: found > cap, exact }
    }
}

/// A listing's size, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Counted {
    /// Orders counted, at most the cap asked for.
    pub orders: u64,
    /// The count stopped at the cap: at least this many.
    pub capped: bool,
    /// The count is the listing's size. An in-flight listing is counted by its index alone,
    /// without reading each order's record: its entries are the orders in flight and the few
    /// whose alert is on its way, whatever step or workflow the listing asks for. Then
    /// `false`: the count is an upper bound.
    pub exact: bool,
}

impl ListPage {
    /// The first `limit` of `rows` (ordered newest first, fetched one past the page to tell
    /// whether more follow), with the cursor of the next page if there is one.
    pub fn cut(mut rows: Vec<Listed>, limit: usize) -> ListPage {
        let next = (rows.len() > limit).then(|| page_cursor(&rows[limit - 1]));
        rows.truncate(limit);
        ListPage { orders: rows, next }
    }

    /// A page cut short, before it filled, by how much its filter may read: `rows`, and the
    /// next page starts after `read_to`, the last order it read, listed or not. A page may
    /// then hold fewer orders than asked for, or none, and still be followed by more.
    pub fn short(rows: Vec<Listed>, read_to: (Timestamp, OrderId)) -> ListPage {
        ListPage { orders: rows, next: Some(cursor_at(read_to)) }
    }
}

/// A page cursor: the last order listed, as `{since_ms}.{order_id}`. Listings are ordered by
/// (since, order id), newest first.
fn page_cursor(last: &Listed) -> String {
    cursor_at((last.since, last.order_id))
}

pub(crate) fn cursor_at((since, order_id): (Timestamp, OrderId)) -> String {
    format!("{}.{}", since.as_millis(), order_id)
}

/// Where a page given `after` (a previous page's `next`) starts: the (since, order id) it
/// names, or none for a first page; an error if the cursor was not made by [`cursor_at`].
pub(crate) fn cursor_start(after: Option<&str>) -> Result<Option<(Timestamp, OrderId)>> {
    after
        .map(|cursor| {
            parse_cursor(cursor).ok_or_else(|| {
                crate::Error::InvalidCommand(format!("malformed page cursor {cursor:?}"))
            })
        })
        .transpose()
}

/// The (since, order id) a cursor names; `None` if it was not made by [`page_cursor`].
fn parse_cursor(cursor: &str) -> Option<(Timestamp, OrderId)> {
    let (at, id) = cursor.split_once('.')?;
    Some((Timestamp::from_millis(at.parse().ok()?), id.parse().ok()?))
}

/// Where a message goes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Destination {
    /// The scheduler's queue of start messages.
    Scheduler,
    /// An agent's request queue.
    Agent(AgentName),
    /// The scheduler's queue of agent replies.
    Replies,
}

impl Destination {
    /// A stable name for storage and logs: `scheduler`, `replies`, `agent:<name>`.
    pub fn name(&self) -> String {
        match self {
            Destination::Scheduler => "scheduler".into(),
            Destination::Replies => "replies".into(),
            Destination::Agent(a) => format!("agent:{}", a.as_str()),
        }
    }

    /// The destination [`Destination::name`] gave this name.
    pub fn parse(name: &str) -> Option<Destination> {
        match name {
            "scheduler" => Some(Destination::Scheduler),
            "replies" => Some(Destination::Replies),
            other => {
                let agent = other.strip_prefix("agent:")?;
                (!agent.is_empty()).then(|| Destination::Agent(AgentName::new(agent)))
            }
        }
    }
}

/// A message as its consumer took it from the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Incoming<'a> {
    /// The id the queue gave the message, the same on every delivery of it; for a message sent
    /// again, the id of the one it was sent again for ([`Outgoing::again_of`]).
    pub message_id: &'a str,
    /// How many times it has been received, this time included (SQS's
    /// `ApproximateReceiveCount`): above 1, it came back after a consumer failed.
    pub receive_count: u32,
}

impl<'a> Incoming<'a> {
    /// A message received for the first time.
    pub fn first(message_id: &'a str) -> Incoming<'a> {
        Incoming { message_id, receive_count: 1 }
    }
}

/// Longest delay a message can be sent with: SQS takes 0 to 900 whole seconds.
pub const MAX_DELAY: Duration = Duration::from_secs(15 * 60);

/// Tries a message gets within one [`Outbox::send`] when the queue fails it alone, for a
/// passing cause (one failed entry of an SQS batch), and an event within one publication when
/// the bus refuses it alone (one failed entry of `PutEvents`): 3, as many as the SDK's standard
/// retry mode gives a failed request.
pub const ENTRY_TRIES: u32 = 3;

/// A message to send, possibly delayed by up to [`MAX_DELAY`]. It is never delivered before
/// its delay has run out; SQS counts delays in whole seconds, so a fraction of a second may add
/// up to one second more.
#[derive(Clone, Debug, PartialEq)]
pub struct Outgoing {
    pub to: Destination,
    pub message: Message,
    pub delay: Duration,
    /// The id its consumer knows it by, when it is a message sent again (a new message to the
    /// queue, with a fresh receive count) for the one of that id: a transition the first one
    /// wrote is then replayed, not refused as stale. SQS carries it as a message attribute.
    pub again_of: Option<String>,
}

impl Outgoing {
    pub fn now(to: Destination, message: Message) -> Outgoing {
        Outgoing::later(to, message, Duration::ZERO)
    }

    pub fn later(to: Destination, message: Message, delay: Duration) -> Outgoing {
        Outgoing { to, message, delay, again_of: None }
    }

    /// `message`, received as `identity`, sent again to `to` `delay` later.
    pub fn again(to: Destination, message: Message, delay: Duration, identity: &str) -> Outgoing {
        Outgoing { to, message, delay, again_of: Some(identity.to_owned()) }
    }
}

/// Sending side of the queues.
pub trait Outbox: Send + Sync {
    /// Sends every message, or fails. A message the queue would refuse (a delay above
    /// [`MAX_DELAY`]) fails the call before anything is sent. A message the queue fails alone,
    /// for a passing cause, is sent again by itself, never with the messages already accepted,
    /// up to [`ENTRY_TRIES`] tries in all; if it still fails, the call fails as unavailable,
    /// the other messages sent once. On any failure some messages may have been sent: callers
    /// rely on redelivery and on duplicates being harmless, never on all-or-nothing.
    fn send(&self, messages: &[Outgoing]) -> impl Future<Output = Result<()>> + Send;
}

/// The event bus.
pub trait EventBus: Send + Sync {
    /// Publishes a batch (at most 10 events); the report lists those that were not accepted, by
    /// position. The engine publishes those again, alone.
    fn publish(&self, events: &[BusEvent]) -> impl Future<Output = Result<PublishReport>> + Send;
}

/// How many messages one queue holds, as SQS counts them (approximately).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Depth {
    /// Visible: waiting for a consumer (`ApproximateNumberOfMessages`).
    pub waiting: u64,
    /// Received and not yet deleted (`ApproximateNumberOfMessagesNotVisible`).
    pub in_flight: u64,
    /// Sent with a delay that has not run out (`ApproximateNumberOfMessagesDelayed`).
    pub delayed: u64,
}

/// The queues' depths.
pub trait QueueDepths: Send + Sync {
    /// The depth of every queue this port knows.
    fn depths(&self) -> impl Future<Output = Result<Vec<(Destination, Depth)>>> + Send;
}

/// One consumer's report on one queue: how long the messages it took lately had waited.
#[derive(Clone, Debug, PartialEq)]
pub struct WaitReport {
    pub queue: Destination,
    /// The consumer process that made it; each has one report per queue, replaced by its next.
    pub reporter: String,
    /// The longest wait among the messages it took lately.
    pub wait: Duration,
    /// Messages it took per second since its previous report.
    pub rate: f64,
    /// When it was made.
    pub at: Timestamp,
    /// Until when `wait` stands: after that the wait is forgotten.
    pub until: Timestamp,
    /// When the whole report can be forgotten: once its wait lapsed and a newer report would
    /// have come if its consumer still took messages.
    pub expires: Timestamp,
}

/// Where consumers leave their wait reports for the supervisor and the door.
pub trait WaitGauge: Send + Sync {
    /// Stores `report`, replacing the same reporter's previous one for that queue.
    fn report(&self, report: &WaitReport) -> impl Future<Output = Result<()>> + Send;
    /// Every report that has not expired at `now`.
    fn reports(&self, now: Timestamp) -> impl Future<Output = Result<Vec<WaitReport>>> + Send;
}

/// Time.
pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;
    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> + Send;
}

/// Fresh identifiers (correlation ids).
pub trait Ids: Send + Sync {
    fn new_id(&self) -> String;
}

/// Randomness for jitter.
pub trait Random: Send + Sync {
    /// A number in [0, 1).
    fn unit(&self) -> f64;
}

impl Random for sas_rng::SplitMix {
    fn unit(&self) -> f64 {
        sas_rng::SplitMix::unit(self)
    }
}

/// Where bulk commands are kept ([`crate::bulk`]): one record per job, by its id.
pub trait BulkBook: Send + Sync {
    /// Records a new job; `false`, writing nothing, if one with its id exists.
    fn create_job(&self, job: &BulkJob) -> impl Future<Output = Result<bool>> + Send;

    /// The job `id` names, read consistently.
    fn job(&self, id: &str) -> impl Future<Output = Result<Option<BulkJob>>> + Send;

    /// Writes `job` if the stored one is still at round `round`; a conflict otherwise.
    fn save_job(&self, job: &BulkJob, round: u64) -> impl Future<Output = Result<Saved>> + Send;

    /// The jobs kept, the newest first, at most `limit`.
    fn jobs(&self, limit: usize) -> impl Future<Output = Result<Vec<BulkJob>>> + Send;
}

/// Where each service's health is kept: a small table of one item per service.
pub trait ServiceBook: Send + Sync {
    /// The record of `service`, read consistently; `None` if nothing was ever written of it.
    fn load(&self, service: &str) -> impl Future<Output = Result<Option<ServiceRecord>>> + Send;

    /// Every service's record.
    fn all(&self) -> impl Future<Output = Result<Vec<ServiceRecord>>> + Send;

    /// Writes `next` if the stored record is still at `next.version - 1` (absent, for version
    /// 1); reports a conflict otherwise.
    fn save(&self, next: &ServiceRecord) -> impl Future<Output = Result<Saved>> + Send;
}

/// What every execution of an agent shares to keep its service within its declared limits
/// ([`crate::pace`]). Only a limited service's agent calls it.
pub trait Pace: Send + Sync {
    /// Takes the next turn of `service`'s calls, `spacing` after the turn before it (or now,
    /// if that is later), if it starts by `latest`; takes nothing otherwise.
    fn take_turn(
        &self,
        service: &str,
        spacing: Duration,
        now: Timestamp,
        latest: Timestamp,
    ) -> impl Future<Output = Result<Booked>> + Send;

    /// Takes one of `limit` places in flight for a call that is over by `until`: `None` if
    /// every place is taken by a call still within its own `until`.
    fn enter(
        &self,
        service: &str,
        limit: u32,
        now: Timestamp,
        until: Timestamp,
    ) -> impl Future<Output = Result<Option<Place>>> + Send;

    /// Gives `place` back, unless someone took it again after its `until`.
    fn leave(&self, service: &str, place: Place) -> impl Future<Output = Result<()>> + Send;

    /// What `service` uses of its limits at `now`.
    fn usage(&self, service: &str, now: Timestamp) -> impl Future<Output = Result<Usage>> + Send;
}

/// Where large values are kept ([`crate::payload`]): whole objects by key. Writing a key again
/// replaces the object; a key is only ever written with the same content (it names the
/// content's digest), so a repeated write is harmless.
pub trait Payloads: Send + Sync {
    /// Whether this store keeps anything ([`crate::payload::NoPayloads`] does not).
    fn stores(&self) -> bool {
        true
    }

    /// Writes `body` under `key`.
    fn put(&self, key: &str, body: Vec<u8>) -> impl Future<Output = Result<()>> + Send;

    /// The object under `key`, or `None` if there is none.
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<Vec<u8>>>> + Send;
}

/// One call to a remote service: what an agent's [`RemoteService`] is asked to do. The same
/// call may come more than once (a retry after a passing fault, a step sent again after its
/// lease expired, a message delivered twice), always with the same `idempotency_key`.
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteCall {
    /// The order the step belongs to (`Display` gives its UUID).
    pub order_id: OrderId,
    /// What to do: the step's name in its workflow file, or for an undo its
    /// `compensation.action`.
    pub action: String,
    /// Whether this is the step (`Do`) or its undo (`Undo`).
    pub direction: Direction,
    /// The service deduplicates on this: the same key must never take effect twice. It is
    /// `<order id>/<step>/<do|undo>` (with a generation after an operator's redrive), stable
    /// across retries and redeliveries.
    pub idempotency_key: String,
    /// The order as it was accepted: [`Order::input`] is its JSON input, checked against the
    /// workflow's schema.
    pub order: Order,
    /// For an undo, the output of the step it undoes (`None` for a step, and for the undo of
    /// a step whose outcome is unknown).
    pub input: Option<serde_json::Value>,
    /// For a step, the outputs of the steps it depends on (directly or through others), by step
    /// name: `call.outputs["open-account"]["account_id"]`. Empty for an undo.
    pub outputs: std::collections::BTreeMap<String, serde_json::Value>,
    /// The call must give up by then: past it the reply would not count (the step's lease is
    /// over). The HTTP agent turns it into its request's timeout.
    pub deadline: Timestamp,
}

/// How a remote call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RemoteFault {
    /// Worth retrying: timeouts, throttling, 5xx, connection failures. The effect may or may
    /// not have happened.
    #[error("transient: {0}")]
    Transient(String),
    /// Final: the service refused the action, which did not take effect.
    #[error("permanent: {0}")]
    Permanent(String),
    /// The service asks to be called less often (HTTP 429, or a 503 with `Retry-After`): the
    /// action did not take effect. Every execution of the agent waits `retry_after` (or a
    /// second) before its next call, and the call is tried again without counting against
    /// its retries; throttling that goes on holds the service like any passing fault.
    #[error("throttled: {reason}")]
    Throttled { reason: String, retry_after: Option<Duration> },
}

/// The business service behind one agent: what a team implements for an agent of its own.
pub trait RemoteService: Send + Sync {
    /// Performs `call` and answers: `Ok` with the step's output (a JSON value of at most
    /// 256 KiB, stored outside the order's record above 512 bytes, which later steps get whole
    /// in their [`RemoteCall::outputs`] and an undo as its [`RemoteCall::input`]); [`RemoteFault::Permanent`] when the service refused, which
    /// fails the step at once and, as its workflow says, undoes the order; or
    /// [`RemoteFault::Transient`] for anything worth another try (a timeout, throttling, a
    /// 5xx, a connection refused, an error whose effect is not known), which the agent retries
    /// with backoff within the step's budget before the supervisor's policy decides.
    fn call(
        &self,
        call: &RemoteCall,
    ) -> impl Future<Output = std::result::Result<serde_json::Value, RemoteFault>> + Send;
}

// Shared handles: a port behind an `Arc` is the same port, so one in-memory store or one SDK
// client can serve several services.

impl<T: StateStore + ?Sized> StateStore for std::sync::Arc<T> {
    fn create_order(&self, order: &OrderRecord) -> impl Future<Output = Result<Created>> + Send {
        (**self).create_order(order)
    }
    fn create_state(&self, state: &StateRecord) -> impl Future<Output = Result<Created>> + Send {
        (**self).create_state(state)
    }
    fn load(
        &self,
        id: OrderId,
        read: Read,
    ) -> impl Future<Output = Result<Option<StateRecord>>> + Send {
        (**self).load(id, read)
    }
    fn load_order(
        &self,
        id: OrderId,
        read: Read,
    ) -> impl Future<Output = Result<Option<OrderRecord>>> + Send {
        (**self).load_order(id, read)
    }
    fn load_many(
        &self,
        ids: &[OrderId],
        read: Read,
    ) -> impl Future<Output = Result<Vec<Option<StateRecord>>>> + Send {
        (**self).load_many(ids, read)
    }
    fn save(
        &self,
        next: &StateRecord,
        expected: Expected,
    ) -> impl Future<Output = Result<Saved>> + Send {
        (**self).save(next, expected)
    }
    fn slots(&self, key: &str) -> impl Future<Output = Result<Slots>> + Send {
        (**self).slots(key)
    }
    fn save_slots(&self, next: &Slots) -> impl Future<Output = Result<Saved>> + Send {
        (**self).save_slots(next)
    }
    fn join(&self, key: &str, queued: &Queued) -> impl Future<Output = Result<()>> + Send {
        (**self).join(key, queued)
    }
    fn line(&self, key: &str, limit: usize) -> impl Future<Output = Result<Vec<Queued>>> + Send {
        (**self).line(key, limit)
    }
    fn ahead(&self, key: &str, position: &str) -> impl Future<Output = Result<u32>> + Send {
        (**self).ahead(key, position)
    }
    fn leave(&self, key: &str, queued: &Queued) -> impl Future<Output = Result<()>> + Send {
        (**self).leave(key, queued)
    }
    fn put_page(&self, page: &Page) -> impl Future<Output = Result<()>> + Send {
        (**self).put_page(page)
    }
    fn pages(&self, pass: &str) -> impl Future<Output = Result<Vec<Page>>> + Send {
        (**self).pages(pass)
    }
    fn drop_pages(&self, pass: &str) -> impl Future<Output = Result<()>> + Send {
        (**self).drop_pages(pass)
    }
}

impl<T: ExpiryIndex + ?Sized> ExpiryIndex for std::sync::Arc<T> {
    fn due(
        &self,
        shard: u16,
        due_by: Timestamp,
    ) -> impl Future<Output = Result<Vec<IndexEntry>>> + Send {
        (**self).due(shard, due_by)
    }
}

impl<T: OrderFinder + ?Sized> OrderFinder for std::sync::Arc<T> {
    fn find(&self, query: &ListQuery) -> impl Future<Output = Result<ListPage>> + Send {
        (**self).find(query)
    }

    fn count(&self, query: &ListQuery, cap: u64) -> impl Future<Output = Result<Counted>> + Send {
        (**self).count(query, cap)
    }

    fn searched(
        &self,
        value: &str,
        after: Option<(Timestamp, OrderId)>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(Timestamp, OrderId)>>> + Send {
        (**self).searched(value, after, limit)
    }
}

impl<T: Outbox + ?Sized> Outbox for std::sync::Arc<T> {
    fn send(&self, messages: &[Outgoing]) -> impl Future<Output = Result<()>> + Send {
        (**self).send(messages)
    }
}

impl<T: EventBus + ?Sized> EventBus for std::sync::Arc<T> {
    fn publish(&self, events: &[BusEvent]) -> impl Future<Output = Result<PublishReport>> + Send {
        (**self).publish(events)
    }
}

impl<T: QueueDepths + ?Sized> QueueDepths for std::sync::Arc<T> {
    fn depths(&self) -> impl Future<Output = Result<Vec<(Destination, Depth)>>> + Send {
        (**self).depths()
    }
}

impl<T: WaitGauge + ?Sized> WaitGauge for std::sync::Arc<T> {
    fn report(&self, report: &WaitReport) -> impl Future<Output = Result<()>> + Send {
        (**self).report(report)
    }
    fn reports(&self, now: Timestamp) -> impl Future<Output = Result<Vec<WaitReport>>> + Send {
        (**self).reports(now)
    }
}

impl<T: Clock + ?Sized> Clock for std::sync::Arc<T> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> + Send {
        (**self).sleep(duration)
    }
}

impl<T: Ids + ?Sized> Ids for std::sync::Arc<T> {
    fn new_id(&self) -> String {
        (**self).new_id()
    }
}

impl<T: Random + ?Sized> Random for std::sync::Arc<T> {
    fn unit(&self) -> f64 {
        (**self).unit()
    }
}

impl<T: RemoteService + ?Sized> RemoteService for std::sync::Arc<T> {
    fn call(
        &self,
        call: &RemoteCall,
    ) -> impl Future<Output = std::result::Result<serde_json::Value, RemoteFault>> + Send {
        (**self).call(call)
    }
}

impl<T: ServiceBook + ?Sized> ServiceBook for std::sync::Arc<T> {
    fn load(&self, service: &str) -> impl Future<Output = Result<Option<ServiceRecord>>> + Send {
        (**self).load(service)
    }
    fn all(&self) -> impl Future<Output = Result<Vec<ServiceRecord>>> + Send {
        (**self).all()
    }
    fn save(&self, next: &ServiceRecord) -> impl Future<Output = Result<Saved>> + Send {
        (**self).save(next)
    }
}

impl<T: Pace + ?Sized> Pace for std::sync::Arc<T> {
    fn take_turn(
        &self,
        service: &str,
        spacing: Duration,
        now: Timestamp,
        latest: Timestamp,
    ) -> impl Future<Output = Result<Booked>> + Send {
        (**self).take_turn(service, spacing, now, latest)
    }
    fn enter(
        &self,
        service: &str,
        limit: u32,
        now: Timestamp,
        until: Timestamp,
    ) -> impl Future<Output = Result<Option<Place>>> + Send {
        (**self).enter(service, limit, now, until)
    }
    fn leave(&self, service: &str, place: Place) -> impl Future<Output = Result<()>> + Send {
        (**self).leave(service, place)
    }
    fn usage(&self, service: &str, now: Timestamp) -> impl Future<Output = Result<Usage>> + Send {
        (**self).usage(service, now)
    }
}

impl<T: Payloads + ?Sized> Payloads for std::sync::Arc<T> {
    fn stores(&self) -> bool {
        (**self).stores()
    }
    fn put(&self, key: &str, body: Vec<u8>) -> impl Future<Output = Result<()>> + Send {
        (**self).put(key, body)
    }
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<Vec<u8>>>> + Send {
        (**self).get(key)
    }
}

impl<T: KeyIndex + ?Sized> KeyIndex for std::sync::Arc<T> {
    fn busy_keys(&self, limit: usize) -> impl Future<Output = Result<Vec<BusyKey>>> + Send {
        (**self).busy_keys(limit)
    }
}

impl<T: HeldIndex + ?Sized> HeldIndex for std::sync::Arc<T> {
    fn held(
        &self,
        service: &str,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<OrderId>>> + Send {
        (**self).held(service, limit)
    }
    fn count_held(&self, service: &str) -> impl Future<Output = Result<u64>> + Send {
        (**self).count_held(service)
    }
}
