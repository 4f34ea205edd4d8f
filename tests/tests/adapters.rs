//! Each adapter's requests, conditions and error mapping against a real emulator (moto),
//! on tables, queues and a bus created from `template.yaml`.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use sas_aws::eventbridge::EventBridgeBus;
use sas_aws::sqs::{QueueUrls, SqsOutbox};
use sas_engine::config::EngineConfig;
use sas_engine::events::{BusEvent, StatusKind};
use sas_engine::message::{Message, Start};
use sas_engine::order::Order;
use sas_engine::ports::{
    Created, Destination, EventBus, Expected, ExpiryIndex, OrderRecord, Outbox, Outgoing, Read,
    Saved, StateStore,
};
use sas_engine::state::{ProcessState, StateRecord, StepStatus};
use sas_engine::workflow::Workflow;
use sas_engine::{AgentName, IdempotencyKey, OrderId, Timestamp};
use sas_tests::TestStack;
use sas_tests::stack::order_json;

const T0: Timestamp = Timestamp::from_millis(1_800_000_000_000);

fn workflow() -> Workflow {
    let agents = ["inventory", "payment", "shipping"].map(AgentName::new);
    Workflow::from_json(Workflow::order_fulfilment_json(), &agents).unwrap()
}

fn new_order(key: &str, config: &EngineConfig) -> (OrderRecord, StateRecord) {
    let key = IdempotencyKey::parse(key).unwrap();
    let id = OrderId::for_key(&key);
    let order = Order::from_json(order_json("c-1").as_bytes()).unwrap();
    let state = StateRecord::new(id, &workflow(), config, "corr".into(), T0);
    (OrderRecord { order_id: id, idempotency_key: key, order, created_at: T0 }, state)
}

#[tokio::test]
async fn create_writes_both_items_once_and_reports_an_existing_order() {
    let t = TestStack::new("create").await;
    let store = t.store();
    let (order, state) = new_order("k-create", &EngineConfig::default());
    assert_eq!(store.create(&order, &state).await.unwrap(), Created::Created);
    assert_eq!(store.create(&order, &state).await.unwrap(), Created::AlreadyExists);
    assert_eq!((t.count("OrdersTable").await, t.count("StateTable").await), (1, 1));
    for read in [Read::Consistent, Read::Eventual] {
        assert_eq!(store.load(order.order_id, read).await.unwrap().unwrap(), state);
        assert_eq!(store.load_order(order.order_id, read).await.unwrap().unwrap(), order);
    }

    // The state item exists but the order does not: the transaction writes neither.
    let (order2, mut state2) = new_order("k-create-2", &EngineConfig::default());
    state2.order_id = order.order_id;
    assert_eq!(store.create(&order2, &state2).await.unwrap(), Created::AlreadyExists);
    assert_eq!(t.count("OrdersTable").await, 1);
    assert!(store.load_order(order2.order_id, Read::Consistent).await.unwrap().is_none());
}

#[tokio::test]
async fn save_writes_only_over_the_expected_revision() {
    let t = TestStack::new("save").await;
    let store = t.store();
    let (order, state) = new_order("k-save", &EngineConfig::default());
    store.create(&order, &state).await.unwrap();

    let mut next = state.clone();
    next.revision += 1;
    next.process_state = ProcessState::Processing;
    next.locked_by = Some("scheduler/a".into());
    next.attempt = 1;
    assert_eq!(store.save(&next, Expected::of(&state)).await.unwrap(), Saved::Saved);
    // A second writer that read the same revision loses.
    let mut rival = state.clone();
    rival.revision += 1;
    rival.failure_count = 1;
    assert_eq!(store.save(&rival, Expected::of(&state)).await.unwrap(), Saved::Conflict);
    // So does one expecting the right revision but another attempt or state.
    let wrong_attempt = Expected { attempt: 7, ..Expected::of(&next) };
    let mut later = next.clone();
    later.revision += 1;
    assert_eq!(store.save(&later, wrong_attempt).await.unwrap(), Saved::Conflict);
    let wrong_state = Expected { process_state: ProcessState::Pending, ..Expected::of(&next) };
    assert_eq!(store.save(&later, wrong_state).await.unwrap(), Saved::Conflict);
    assert_eq!(store.load(order.order_id, Read::Consistent).await.unwrap().unwrap(), next);
    // A save for a record that does not exist is a conflict too, not a create.
    let (_, ghost) = new_order("k-ghost", &EngineConfig::default());
    let mut ghost_next = ghost.clone();
    ghost_next.revision += 1;
    assert_eq!(store.save(&ghost_next, Expected::of(&ghost)).await.unwrap(), Saved::Conflict);
}

#[tokio::test]
async fn the_expiry_index_is_sparse_sharded_and_ordered() {
    let t = TestStack::new("index").await;
    let store = t.store();
    let config = EngineConfig { index_shards: 2, ..EngineConfig::default() };
    let mut ids = Vec::new();
    for i in 0..6 {
        let (order, state) = new_order(&format!("k-index-{i}"), &config);
        store.create(&order, &state).await.unwrap();
        ids.push(state);
    }
    let due = ids[0].complete_by.unwrap();
    let mut seen = 0;
    for shard in 0..2 {
        let before = store.expired(shard, due.minus(Duration::from_millis(1)), 100).await.unwrap();
        assert!(before.is_empty(), "nothing is due yet");
        let entries = store.expired(shard, due, 100).await.unwrap();
        assert!(entries.iter().all(|e| e.order_id.shard(2) == shard));
        seen += entries.len();
    }
    assert_eq!(seen, 6);

    // A finished record leaves the index.
    let first = &ids[0];
    let mut done = first.clone();
    done.revision += 1;
    done.process_state = ProcessState::Processed;
    done.complete_by = None;
    for s in &mut done.steps {
        s.status = StepStatus::Done;
    }
    assert_eq!(store.save(&done, Expected::of(first)).await.unwrap(), Saved::Saved);
    let shard = first.order_id.shard(2);
    let far = T0.plus(Duration::from_secs(3600));
    let entries = store.expired(shard, far, 100).await.unwrap();
    assert!(entries.iter().all(|e| e.order_id != first.order_id));
    assert!(entries.windows(2).all(|w| w[0].complete_by <= w[1].complete_by), "earliest first");
    assert_eq!(store.expired(shard, far, 1).await.unwrap().len(), 1, "the limit holds");
}

#[tokio::test]
async fn the_outbox_batches_by_queue_and_honours_delays() {
    let t = TestStack::new("outbox").await;
    let urls = QueueUrls::default()
        .with(Destination::Scheduler, t.name("SchedulerQueue"))
        .with(Destination::Replies, t.name("ReplyQueue"));
    let outbox = SqsOutbox::new(t.sqs.clone(), urls);
    let start = |n: u64| {
        let id = OrderId::for_key(&IdempotencyKey::parse(&format!("k{n}")).unwrap());
        Message::Start(Start { order_id: id, attempt: n, correlation_id: "c".into(), due_at: None })
    };
    let mut messages: Vec<Outgoing> =
        (0..23).map(|n| Outgoing::now(Destination::Scheduler, start(n))).collect();
    messages.push(Outgoing {
        to: Destination::Scheduler,
        message: start(99),
        delay: Duration::from_secs(30),
    });
    outbox.send(&messages).await.unwrap();
    let mut received = Vec::new();
    loop {
        let batch = t.receive("SchedulerQueue", 0).await;
        if batch.is_empty() {
            break;
        }
        for m in batch {
            received.push(Message::decode(m.body().unwrap()).unwrap());
            t.delete("SchedulerQueue", m.receipt_handle().unwrap()).await;
        }
    }
    assert_eq!(received.len(), 23, "the delayed message is not visible yet");
    // A destination the function was not configured for is a configuration error.
    let err = outbox
        .send(&[Outgoing::now(Destination::Agent(AgentName::new("fax")), start(1))])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("fax"), "{err}");
    // A queue that does not exist is a permanent error.
    let missing = SqsOutbox::new(
        t.sqs.clone(),
        QueueUrls::default()
            .with(Destination::Replies, format!("{}-missing", t.name("ReplyQueue"))),
    );
    let err = missing.send(&[Outgoing::now(Destination::Replies, start(1))]).await.unwrap_err();
    assert!(!err.is_retryable(), "{err}");
}

#[tokio::test]
async fn published_events_reach_the_queues_subscribed_by_rules() {
    let t = TestStack::new("bus").await;
    let bus = EventBridgeBus::new(t.events.clone(), t.name("EventBus"));
    let (_, state) = new_order("k-bus", &EngineConfig::default());
    let status = BusEvent::status(&state, StatusKind::Processed, None, T0);
    let report = bus.publish(&[status]).await.unwrap();
    assert!(report.failed.is_empty(), "{report:?}");
    let events = t.drain("OrderEventsQueue").await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["detail-type"], "OrderStatusChanged");
    assert_eq!(events[0]["source"], "sas.orders");
    assert_eq!(events[0]["detail"]["order_id"], state.order_id.to_string());
    assert!(t.drain("AlertsQueue").await.is_empty(), "status events are not alerts");

    // Publishing to a bus that does not exist is never a silent success.
    let missing = EventBridgeBus::new(t.events.clone(), format!("{}-missing", t.name("EventBus")));
    let status = BusEvent::status(&state, StatusKind::Processed, None, T0);
    match missing.publish(&[status]).await {
        Ok(report) => assert_eq!(report.failed.len(), 1, "{report:?}"),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}
