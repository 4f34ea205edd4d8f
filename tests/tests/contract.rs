//! One contract per port, checked on both of its implementations: the in-memory one the engine's
//! tests and the simulation run on, and the AWS adapter, on moto with resources from
//! `template.yaml`. What the simulation proves holds only as far as the memory ports behave like
//! the adapters; each contract below states a semantic the engine relies on, once, and both
//! implementations must keep it.
//!
//! Where the two may differ on purpose, the contract asks only for what both promise: an
//! eventually consistent read may be stale in memory (it is made harsher there), and SQS
//! counts depths approximately.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use sas_aws::depths::SqsDepths;
use sas_aws::eventbridge::EventBridgeBus;
use sas_aws::sqs::{QueueUrls, SqsOutbox};
use sas_aws::waits::DynamoWaits;
use sas_engine::config::EngineConfig;
use sas_engine::events::{BusEvent, StatusKind};
use sas_engine::ids::Direction;
use sas_engine::machine::{Ctx, Decision, Input, decide};
use sas_engine::memory::{
    ManualClock, MemoryBus, MemoryQueues, MemoryStore, MemoryWaits, QueueSettings,
};
use sas_engine::message::{Message, Start};
use sas_engine::message::{StepOutcome, StepRef};
use sas_engine::order::Order;
use sas_engine::ports::{
    Clock, Created, Destination, EventBus, Expected, ExpiryIndex, ListPage, ListQuery, Listing,
    OrderFinder, OrderRecord, Outbox, Outgoing, QueueDepths, Read, Saved, StateStore, WaitGauge,
    WaitReport,
};
use sas_engine::state::{CommandKind, ProcessState, StateRecord, StepStatus};
use sas_engine::workflow::Workflow;
use sas_engine::{AgentName, IdempotencyKey, OrderId, Owner, Timestamp};
use sas_tests::TestStack;
use sas_tests::stack::order_json;

fn workflow() -> Workflow {
    let agents = ["inventory", "payment", "shipping"].map(AgentName::new);
    Workflow::from_json(Workflow::order_fulfilment_json(), &agents).unwrap()
}

fn new_order(key: &str, config: &EngineConfig, at: Timestamp) -> (OrderRecord, StateRecord) {
    let key = IdempotencyKey::parse(key).unwrap();
    let id = OrderId::for_key(&key);
    let order = Order::from_json(order_json("c-1").as_bytes()).unwrap();
    let workflow = workflow();
    let ctx = sas_engine::machine::Ctx { now: at, config, workflow: &workflow };
    let state = sas_engine::machine::create(id, "corr".into(), &ctx).next;
    (
        OrderRecord {
            order_id: id,
            owner: Owner::anonymous(),
            idempotency_key: key,
            order,
            created_at: at,
        },
        state,
    )
}

/// A key that differs between runs on the shared moto server.
fn key(name: &str) -> String {
    format!("{name}-{}", std::process::id())
}

// ---------------------------------------------------------------- state store and index

/// Creation is all or nothing; writes are conditional on the record as read; a failed condition
/// is an outcome, not an error; the index holds only records with a CompleteBy, per shard,
/// earliest first, up to a limit.
async fn store_contract<S: StateStore + ExpiryIndex>(store: &S, t0: Timestamp) {
    let config = EngineConfig { index_shards: 2, ..EngineConfig::default() };
    let (order, state) = new_order(&key("create"), &config, t0);
    assert_eq!(store.create(&order, &state).await.unwrap(), Created::Created);
    assert_eq!(store.create(&order, &state).await.unwrap(), Created::AlreadyExists);
    assert_eq!(store.load(order.order_id, Read::Consistent).await.unwrap().unwrap(), state);
    assert_eq!(store.load_order(order.order_id, Read::Consistent).await.unwrap().unwrap(), order);
    // The state half exists under another order's id: the transaction writes neither half.
    let (other_order, mut other_state) = new_order(&key("create-other"), &config, t0);
    other_state.order_id = order.order_id;
    assert_eq!(store.create(&other_order, &other_state).await.unwrap(), Created::AlreadyExists);
    assert!(store.load_order(other_order.order_id, Read::Consistent).await.unwrap().is_none());

    // Conditional writes.
    let mut next = state.clone();
    next.revision += 1;
    next.process_state = ProcessState::Processing;
    next.locked_by = Some("scheduler/a".into());
    next.attempt = 1;
    assert_eq!(store.save(&next, Expected::of(&state)).await.unwrap(), Saved::Saved);
    let mut rival = state.clone();
    rival.revision += 1;
    rival.failure_count = 1;
    assert_eq!(store.save(&rival, Expected::of(&state)).await.unwrap(), Saved::Conflict);
    let mut later = next.clone();
    later.revision += 1;
    let wrong_attempt = Expected { attempt: 7, ..Expected::of(&next) };
    assert_eq!(store.save(&later, wrong_attempt).await.unwrap(), Saved::Conflict);
    let wrong_state = Expected { process_state: ProcessState::Pending, ..Expected::of(&next) };
    assert_eq!(store.save(&later, wrong_state).await.unwrap(), Saved::Conflict);
    assert_eq!(store.load(order.order_id, Read::Consistent).await.unwrap().unwrap(), next);
    let (_, ghost) = new_order(&key("ghost"), &config, t0);
    let mut ghost_next = ghost.clone();
    ghost_next.revision += 1;
    assert_eq!(store.save(&ghost_next, Expected::of(&ghost)).await.unwrap(), Saved::Conflict);

    // The index: sparse, sharded, ordered, limited.
    let mut records = vec![next.clone()];
    for i in 0..5 {
        let at = t0.plus(Duration::from_secs(i));
        let (o, s) = new_order(&key(&format!("index-{i}")), &config, at);
        store.create(&o, &s).await.unwrap();
        records.push(s);
    }
    let last_due = records.iter().filter_map(|r| r.complete_by).max().unwrap();
    let ours = |entries: &[sas_engine::ports::IndexEntry]| {
        entries.iter().filter(|e| records.iter().any(|r| r.order_id == e.order_id)).count()
    };
    let mut seen = 0;
    for shard in 0..2 {
        let early = store.expired(shard, t0, 1000).await.unwrap();
        assert_eq!(ours(&early), 0, "nothing of ours is due at {t0}");
        let entries = store.expired(shard, last_due, 1000).await.unwrap();
        assert!(entries.iter().all(|e| e.order_id.shard(2) == shard), "one shard per query");
        assert!(entries.windows(2).all(|w| w[0].complete_by <= w[1].complete_by), "earliest first");
        seen += ours(&entries);
    }
    assert_eq!(seen, records.len());
    // Each shard tells when its oldest watched order was accepted.
    for shard in 0..2 {
        let want =
            records.iter().filter(|r| r.order_id.shard(2) == shard).map(|r| r.created_at).min();
        assert_eq!(store.oldest(shard).await.unwrap(), want, "oldest of shard {shard}");
    }
    // A finished record leaves the index.
    let mut done = next.clone();
    done.revision += 1;
    done.process_state = ProcessState::Processed;
    done.locked_by = None;
    done.complete_by = None;
    done.ended_at = Some(done.updated_at);
    for s in &mut done.steps {
        s.status = StepStatus::Done;
    }
    assert_eq!(store.save(&done, Expected::of(&next)).await.unwrap(), Saved::Saved);
    let shard = done.order_id.shard(2);
    let entries = store.expired(shard, last_due, 1000).await.unwrap();
    assert!(entries.iter().all(|e| e.order_id != done.order_id), "a finished record left");
    assert_eq!(store.expired(shard, last_due, 1).await.unwrap().len(), 1, "the limit holds");
    // An eventual read returns a stored version (possibly an older one), never another order's.
    let seen = store.load(order.order_id, Read::Eventual).await.unwrap();
    assert!(seen.is_none_or(|r| r.order_id == order.order_id));
}

#[tokio::test]
async fn memory_store_keeps_the_store_contract() {
    let clock = ManualClock::at(Timestamp::from_millis(1_800_000_000_000));
    store_contract(&MemoryStore::new(clock.clone()), clock.now()).await;
}

#[tokio::test]
async fn dynamodb_store_keeps_the_store_contract() {
    let t = TestStack::new("contract-store").await;
    store_contract(&t.store(), Timestamp::from_millis(1_800_000_000_000)).await;
}

// ---------------------------------------------------------------- order finder

/// Drives `record` through `inputs`, each at `at`, as the services would, writing each step.
async fn drive<S: StateStore>(
    store: &S,
    mut record: StateRecord,
    inputs: &[Input<'_>],
    at: Timestamp,
) -> StateRecord {
    let workflow = workflow();
    let config = EngineConfig::default();
    for input in inputs {
        let ctx = Ctx { now: at, config: &config, workflow: &workflow };
        let Decision::Apply(t) = decide(&record, *input, &ctx) else {
            panic!("{input:?} did not apply")
        };
        assert_eq!(store.save(&t.next, Expected::of(&record)).await.unwrap(), Saved::Saved);
        record = t.next;
    }
    record
}

/// Orders in Error and paused are listed newest first, filtered by step and cause, a page at
/// a time; orders in flight by age; nothing else is.
async fn finder_contract<S: StateStore + OrderFinder>(store: &S, t0: Timestamp) {
    let config = EngineConfig::default();
    let at = |s: u64| t0.plus(Duration::from_secs(s));
    let mut ids = Vec::new();
    let mut records = Vec::new();
    for (n, name) in
        ["refused-pay", "refused-stock", "paused", "old", "young", "done"].iter().enumerate()
    {
        let (order, state) = new_order(&key(&format!("finder-{name}")), &config, at(n as u64));
        assert_eq!(store.create(&order, &state).await.unwrap(), Created::Created);
        ids.push(order.order_id);
        records.push(state);
    }
    let claim = |a| Input::Claim { attempt: a, owner: "s", message: "m-claim" };
    let reply = |a, i: usize, name: &str, d, outcome| {
        (a, StepRef { index: i, name: name.into(), direction: d }, outcome)
    };
    let done = StepOutcome::done(serde_json::json!({"ref": "r"}));
    let refused = StepOutcome::failed("refused");
    // Payment refused, inventory released: Error at t0+10, failed at charge-payment.
    let r = drive(store, records[0].clone(), &[claim(0)], at(10)).await;
    let (a, s, o) = reply(r.attempt, 0, "reserve-inventory", Direction::Do, done.clone());
    let r = drive(
        store,
        r,
        &[Input::Reply { attempt: a, step: &s, outcome: &o, message: "m1" }],
        at(10),
    )
    .await;
    let (a, s, o) = reply(r.attempt, 1, "charge-payment", Direction::Do, refused.clone());
    let r = drive(
        store,
        r,
        &[Input::Reply { attempt: a, step: &s, outcome: &o, message: "m2" }],
        at(10),
    )
    .await;
    let (a, s, o) = reply(r.attempt, 0, "reserve-inventory", Direction::Undo, done.clone());
    let r = drive(
        store,
        r,
        &[Input::Reply { attempt: a, step: &s, outcome: &o, message: "m3" }],
        at(10),
    )
    .await;
    assert_eq!(r.process_state, ProcessState::Error);
    // Stock refused: Error at t0+20.
    let r = drive(store, records[1].clone(), &[claim(0)], at(20)).await;
    let (a, s, o) = reply(r.attempt, 0, "reserve-inventory", Direction::Do, refused.clone());
    drive(store, r, &[Input::Reply { attempt: a, step: &s, outcome: &o, message: "m4" }], at(20))
        .await;
    // Paused at t0+30.
    let pause = Input::Command { command: CommandKind::Pause, id: "p", by: "ops", reason: "check" };
    drive(store, records[2].clone(), &[pause], at(30)).await;
    // Processed.
    let mut r = drive(store, records[5].clone(), &[claim(0)], at(40)).await;
    for (i, name) in ["reserve-inventory", "charge-payment", "ship"].iter().enumerate() {
        let (a, s, o) = reply(r.attempt, i, name, Direction::Do, done.clone());
        r = drive(
            store,
            r,
            &[Input::Reply { attempt: a, step: &s, outcome: &o, message: &format!("m{}", 10 + i) }],
            at(40),
        )
        .await;
    }
    assert_eq!(r.process_state, ProcessState::Processed);

    let query = |listing| ListQuery {
        listing,
        step: None,
        cause: None,
        now: at(100),
        shards: config.index_shards,
        limit: 10,
        after: None,
    };
    let listed = |page: &ListPage| page.orders.iter().map(|l| l.order_id).collect::<Vec<_>>();
    let failed = store.find(&query(Listing::Failed)).await.unwrap();
    assert_eq!(listed(&failed), [ids[1], ids[0]], "newest failure first");
    assert_eq!(failed.next, None);
    assert_eq!(failed.orders[1].step.as_deref(), Some("charge-payment"));
    assert_eq!(failed.orders[1].cause.as_deref(), Some("step_rejected"));
    assert_eq!(failed.orders[1].since, at(10));
    let by_step = ListQuery { step: Some("charge-payment".into()), ..query(Listing::Failed) };
    assert_eq!(listed(&store.find(&by_step).await.unwrap()), [ids[0]], "{failed:?}");
    let by_cause = ListQuery { cause: Some("step_timed_out".into()), ..query(Listing::Failed) };
    assert!(store.find(&by_cause).await.unwrap().orders.is_empty());
    let first = store.find(&ListQuery { limit: 1, ..query(Listing::Failed) }).await.unwrap();
    assert_eq!(listed(&first), [ids[1]]);
    let second = ListQuery { limit: 1, after: first.next.clone(), ..query(Listing::Failed) };
    let second = store.find(&second).await.unwrap();
    assert_eq!((listed(&second), second.next), (vec![ids[0]], None));
    let paused = store.find(&query(Listing::Paused)).await.unwrap();
    assert_eq!(listed(&paused), [ids[2]]);
    assert_eq!(paused.orders[0].step.as_deref(), Some("reserve-inventory"));
    // Accepted at t0+3 and t0+4, still Pending; at t0+100, 97 s old or more is only the first.
    let old = Listing::InFlight { older_than: Duration::from_secs(97) };
    let in_flight = store.find(&query(old)).await.unwrap();
    assert_eq!(listed(&in_flight), [ids[3]]);
    assert_eq!(in_flight.orders[0].since, at(3));
    let both =
        store.find(&query(Listing::InFlight { older_than: Duration::from_secs(1) })).await.unwrap();
    assert_eq!(listed(&both), [ids[4], ids[3]]);
    let bad = ListQuery { after: Some("not-a-cursor".into()), ..query(Listing::Failed) };
    assert!(store.find(&bad).await.is_err());
}

#[tokio::test]
async fn memory_store_keeps_the_finder_contract() {
    let clock = ManualClock::at(Timestamp::from_millis(1_800_000_000_000));
    finder_contract(&MemoryStore::new(clock.clone()), clock.now()).await;
}

#[tokio::test]
async fn dynamodb_store_keeps_the_finder_contract() {
    let t = TestStack::new("contract-finder").await;
    finder_contract(&t.store(), Timestamp::from_millis(1_800_000_000_000)).await;
}

// ---------------------------------------------------------------- queues

/// The consumer side of a queue, as an event source mapping uses it.
trait Consumer {
    /// Up to ten visible messages: (message id, receipt, body, receive count).
    async fn receive(&self) -> Vec<(String, String, String, u32)>;
    async fn delete(&self, receipt: &str);
    /// Makes a received message visible again after `after`.
    async fn hide_for(&self, receipt: &str, after: Duration);
    /// Lets `d` pass.
    async fn pass(&self, d: Duration);
    /// Bodies moved to the dead-letter queue.
    async fn dead_letters(&self) -> Vec<String>;
}

fn start(n: u64, at: Timestamp) -> Message {
    let id = OrderId::for_key(&IdempotencyKey::parse(&format!("q{n}")).unwrap());
    Message::Start(Start { order_id: id, attempt: n, correlation_id: "c".into(), due_at: Some(at) })
}

fn attempts(got: &[(String, String, String, u32)]) -> Vec<u64> {
    let mut out: Vec<u64> = got
        .iter()
        .map(|(_, _, body, _)| match Message::decode(body).unwrap() {
            Message::Start(s) => s.attempt,
            other => panic!("{other:?}"),
        })
        .collect();
    out.sort_unstable();
    out
}

/// Sent messages are delivered whole, a delayed one only after its delay; a message not
/// deleted comes back, with the same id and a higher receive count, and after too many
/// receives it goes to the dead-letter queue; the depths count what waits, what is in flight
/// and what is delayed.
async fn queue_contract<Q: Outbox + QueueDepths, C: Consumer>(
    outbox: &Q,
    consumer: &C,
    now: Timestamp,
    max_receive_count: u32,
) {
    let dest = Destination::Scheduler;
    let mut batch: Vec<Outgoing> =
        (1..=3).map(|n| Outgoing::now(dest.clone(), start(n, now))).collect();
    batch.push(Outgoing {
        to: dest.clone(),
        message: start(9, now),
        delay: Duration::from_secs(2),
    });
    outbox.send(&batch).await.unwrap();
    let depth = |d: &[(Destination, sas_engine::ports::Depth)]| {
        d.iter().find(|(q, _)| *q == dest).map(|(_, depth)| *depth).unwrap_or_default()
    };
    let before = depth(&outbox.depths().await.unwrap());
    assert_eq!((before.waiting, before.delayed), (3, 1), "{before:?}");

    let got = consumer.receive().await;
    assert_eq!(attempts(&got), [1, 2, 3], "the delayed message is not visible yet");
    assert!(got.iter().all(|(_, _, _, count)| *count == 1));
    assert_eq!(depth(&outbox.depths().await.unwrap()).in_flight, 3);
    // Two handled, one failed: it comes back after its visibility timeout, same id.
    consumer.delete(&got[0].1).await;
    consumer.delete(&got[1].1).await;
    consumer.hide_for(&got[2].1, Duration::from_secs(1)).await;
    assert!(consumer.receive().await.is_empty(), "hidden while its timeout runs");
    consumer.pass(Duration::from_millis(2100)).await;
    let again = consumer.receive().await;
    assert_eq!(attempts(&again), [attempts(&got[2..])[0], 9]);
    let back = again.iter().find(|(id, ..)| *id == got[2].0).expect("the same message id");
    assert_eq!(back.3, 2, "received twice");
    // Received too many times: dead-lettered, never delivered again.
    let mut receipt = back.1.clone();
    for _ in back.3..max_receive_count {
        consumer.hide_for(&receipt, Duration::ZERO).await;
        receipt = consumer.receive().await.into_iter().find(|(id, ..)| *id == got[2].0).unwrap().1;
    }
    consumer.hide_for(&receipt, Duration::ZERO).await;
    let after = consumer.receive().await;
    assert!(after.iter().all(|(id, ..)| *id != got[2].0), "redriven, not delivered");
    assert_eq!(consumer.dead_letters().await.len(), 1);
}

struct MemoryConsumer {
    queues: Arc<MemoryQueues<ManualClock>>,
    clock: ManualClock,
}

impl Consumer for MemoryConsumer {
    async fn receive(&self) -> Vec<(String, String, String, u32)> {
        self.queues
            .receive(&Destination::Scheduler, 10)
            .into_iter()
            .map(|d| (d.message_id, d.receipt, d.body, d.receive_count))
            .collect()
    }
    async fn delete(&self, receipt: &str) {
        self.queues.delete(&Destination::Scheduler, receipt).unwrap();
    }
    async fn hide_for(&self, receipt: &str, after: Duration) {
        self.queues.change_visibility(&Destination::Scheduler, receipt, after).unwrap();
    }
    async fn pass(&self, d: Duration) {
        self.clock.advance(d);
    }
    async fn dead_letters(&self) -> Vec<String> {
        self.queues.dead_letters(&Destination::Scheduler)
    }
}

struct SqsConsumer<'a>(&'a TestStack);

impl Consumer for SqsConsumer<'_> {
    async fn receive(&self) -> Vec<(String, String, String, u32)> {
        self.0
            .receive("SchedulerQueue", 0)
            .await
            .into_iter()
            .map(|m| {
                let count = m
                    .attributes()
                    .and_then(|a| {
                        a.get(&aws_sdk_sqs::types::MessageSystemAttributeName::ApproximateReceiveCount)
                    })
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0);
                let text = |s: Option<&str>| s.unwrap_or_default().to_owned();
                (text(m.message_id()), text(m.receipt_handle()), text(m.body()), count)
            })
            .collect()
    }
    async fn delete(&self, receipt: &str) {
        self.0.delete("SchedulerQueue", receipt).await;
    }
    async fn hide_for(&self, receipt: &str, after: Duration) {
        self.0
            .sqs
            .change_message_visibility()
            .queue_url(self.0.name("SchedulerQueue"))
            .receipt_handle(receipt)
            .visibility_timeout(after.as_secs() as i32)
            .send()
            .await
            .unwrap();
    }
    async fn pass(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }
    async fn dead_letters(&self) -> Vec<String> {
        self.0.drain_raw("SchedulerDeadLetterQueue").await
    }
}

#[tokio::test]
async fn memory_queues_keep_the_queue_contract() {
    let clock = ManualClock::at(Timestamp::from_millis(1_800_000_000_000));
    let queues = Arc::new(MemoryQueues::new(clock.clone()));
    // As the template configures the scheduler's queue.
    let settings =
        QueueSettings { visibility_timeout: Duration::from_secs(61), max_receive_count: Some(5) };
    queues.configure(&Destination::Scheduler, settings);
    let consumer = MemoryConsumer { queues: queues.clone(), clock: clock.clone() };
    queue_contract(&queues, &consumer, clock.now(), 5).await;
}

/// The outbox and the depths of the real queues, as one port pair.
struct SqsQueues(SqsOutbox, SqsDepths);

impl Outbox for SqsQueues {
    async fn send(&self, messages: &[Outgoing]) -> sas_engine::Result<()> {
        self.0.send(messages).await
    }
}

impl QueueDepths for SqsQueues {
    async fn depths(&self) -> sas_engine::Result<Vec<(Destination, sas_engine::ports::Depth)>> {
        self.1.depths().await
    }
}

#[tokio::test]
async fn sqs_queues_keep_the_queue_contract() {
    let t = TestStack::new("contract-queues").await;
    let outbox = SqsOutbox::new(
        t.sqs.clone(),
        QueueUrls::default().with(Destination::Scheduler, t.name("SchedulerQueue")),
    );
    let now = sas_aws::system::SystemClock.now();
    queue_contract(&SqsQueues(outbox, t.depths()), &SqsConsumer(&t), now, 5).await;
}

// ---------------------------------------------------------------- event bus

/// A batch of events is accepted whole or reports, by position, the entries it refused.
async fn bus_contract<B: EventBus>(bus: &B, at: Timestamp) {
    let (_, state) = new_order(&key("bus"), &EngineConfig::default(), at);
    let events: Vec<BusEvent> = [StatusKind::Processing, StatusKind::Processed]
        .into_iter()
        .map(|k| BusEvent::status(&state, k, None, at))
        .collect();
    let report = bus.publish(&events).await.unwrap();
    assert!(report.failed.is_empty(), "{report:?}");
    assert!(bus.publish(&[]).await.unwrap().failed.is_empty(), "nothing to publish is fine");
}

#[tokio::test]
async fn memory_bus_keeps_the_bus_contract() {
    let bus = MemoryBus::new();
    bus_contract(&bus, Timestamp::from_millis(1_800_000_000_000)).await;
    assert_eq!(bus.count(), 2);
}

#[tokio::test]
async fn eventbridge_keeps_the_bus_contract() {
    let t = TestStack::new("contract-bus").await;
    let bus = EventBridgeBus::new(t.events.clone(), t.name("EventBus"));
    bus_contract(&bus, Timestamp::from_millis(1_800_000_000_000)).await;
    assert_eq!(t.drain("OrderEventsQueue").await.len(), 2, "the rule delivered both");
}

// ---------------------------------------------------------------- wait gauge

/// A reporter's report replaces its previous one for the same queue; reports of other
/// reporters and queues stand beside it; an expired report is gone.
async fn gauge_contract<G: WaitGauge>(gauge: &G, now: Timestamp) {
    let report = |reporter: &str, queue: Destination, wait: u64, expires_in: u64| WaitReport {
        queue,
        reporter: reporter.to_owned(),
        wait: Duration::from_secs(wait),
        rate: 2.5,
        at: now,
        until: now.plus(Duration::from_secs(expires_in)),
        expires: now.plus(Duration::from_secs(expires_in)),
    };
    let payment = Destination::Agent(AgentName::new("payment"));
    gauge.report(&report("a", Destination::Scheduler, 10, 60)).await.unwrap();
    gauge.report(&report("a", Destination::Scheduler, 20, 60)).await.unwrap();
    gauge.report(&report("b", Destination::Scheduler, 5, 60)).await.unwrap();
    gauge.report(&report("a", payment.clone(), 7, 30)).await.unwrap();
    let mut got = gauge.reports(now).await.unwrap();
    got.sort_by(|x, y| (&x.queue, &x.reporter).cmp(&(&y.queue, &y.reporter)));
    let summary: Vec<(String, String, u64)> =
        got.iter().map(|r| (r.queue.name(), r.reporter.clone(), r.wait.as_secs())).collect();
    assert_eq!(
        summary,
        [
            ("scheduler".into(), "a".into(), 20),
            ("scheduler".into(), "b".into(), 5),
            ("agent:payment".into(), "a".into(), 7),
        ]
    );
    assert_eq!(got[0], report("a", Destination::Scheduler, 20, 60), "read back whole");
    let later = gauge.reports(now.plus(Duration::from_secs(45))).await.unwrap();
    assert_eq!(later.len(), 2, "the payment report expired");
}

#[tokio::test]
async fn memory_waits_keep_the_gauge_contract() {
    gauge_contract(&MemoryWaits::default(), Timestamp::from_millis(1_800_000_000_000)).await;
}

#[tokio::test]
async fn dynamodb_waits_keep_the_gauge_contract() {
    let t = TestStack::new("contract-waits").await;
    let gauge = DynamoWaits::new(t.dynamodb.clone(), t.name("QueueWaitsTable"));
    gauge_contract(&gauge, Timestamp::from_millis(1_800_000_000_000)).await;
}
