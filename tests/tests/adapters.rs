//! What only the AWS adapters have to get right, against a real emulator (moto), on tables,
//! queues and a bus created from `template.yaml`: splitting sends into batches, routing events
//! through the rules, and mapping a missing resource to the right error. The semantics the
//! adapters share with the in-memory ports are in `contract.rs`.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use sas_aws::eventbridge::EventBridgeBus;
use sas_aws::sqs::{QueueUrls, SqsOutbox};
use sas_engine::config::EngineConfig;
use sas_engine::events::{BusEvent, StatusKind};
use sas_engine::message::{Message, Start};
use sas_engine::order::Order;
use sas_engine::ports::{Destination, EventBus, OrderRecord, Outbox, Outgoing};
use sas_engine::state::StateRecord;
use sas_engine::workflow::Workflow;
use sas_engine::{AgentName, IdempotencyKey, OrderId, Owner, Timestamp};
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
    let workflow = workflow();
    let ctx = sas_engine::machine::Ctx { now: T0, config, workflow: &workflow };
    let state = sas_engine::machine::create(id, "corr".into(), &ctx).next;
    (
        OrderRecord {
            order_id: id,
            owner: Owner::anonymous(),
            idempotency_key: key,
            order,
            created_at: T0,
        },
        state,
    )
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
