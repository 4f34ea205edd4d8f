//! Faults on the wire, as AWS produces them, through the local stack's proxy in front of moto:
//! the real handlers and adapters, the real SDK parsing a real error response. Each test says
//! what the client or the queue must see, and that nothing was half done.

#![allow(clippy::unwrap_used)]

use sas_engine::ports::{Read, StateStore};
use sas_engine::state::ProcessState;
use sas_engine::{IdempotencyKey, OrderId};
use sas_infra::emulation::proxy::{FaultRule, WireFault};
use sas_tests::effects::{assert_effects_match, ended};
use sas_tests::stack::{System, order_json, statuses};

fn rule(service: &str, operation: &str, fault: WireFault, times: u32) -> FaultRule {
    FaultRule { times: Some(times), ..FaultRule::new(service, Some(operation), fault) }
}

/// More hits than the SDK's own attempts (three in its standard retry mode), so the fault
/// reaches the adapter instead of being retried away.
const PAST_SDK_RETRIES: u32 = 3;

async fn post(system: &System, key: &str) -> (u16, Option<String>, serde_json::Value) {
    let response = system
        .post_response(
            Some(key.as_bytes()),
            Some("application/json"),
            order_json("c-wire").into_bytes(),
        )
        .await;
    let status = response.status().as_u16();
    let retry_after = response.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
    let body = match response.body() {
        lambda_http::Body::Text(t) => serde_json::from_str(t).unwrap(),
        _ => serde_json::Value::Null,
    };
    (status, retry_after, body)
}

#[tokio::test]
async fn a_throttled_put_at_the_door_answers_503_and_the_retry_accepts_the_order_once() {
    let system = System::behind_proxy("wire-puts", "{}").await;
    let proxy = system.proxy.as_ref().unwrap();
    let mut ids = Vec::new();
    for (n, (operation, fault)) in [
        ("PutItem on StateTable", WireFault::Throttle),
        ("PutItem on StateTable", WireFault::ThroughputExceeded),
    ]
    .into_iter()
    .enumerate()
    {
        proxy.faults.set(vec![rule("dynamodb", operation, fault.clone(), PAST_SDK_RETRIES)]);
        let key = format!("wire-puts-{n}");
        let (status, retry_after, body) = post(&system, &key).await;
        assert_eq!(status, 503, "{operation} {fault:?}: {body}");
        assert_eq!(body["error"]["code"], "unavailable", "{operation}");
        assert!(retry_after.is_some_and(|s| s.parse::<u64>().is_ok()), "{operation}");
        // Nothing was accepted: no state record, so nothing runs and nobody was told.
        assert_eq!(system.t.count("StateTable").await, n as i32, "{operation}");
        // The client retries with the same key, and the order is taken once.
        let (status, _, body) = post(&system, &key).await;
        assert_eq!((status, &body["created"]), (202, &serde_json::json!(true)), "{body}");
        ids.push(body["order_id"].as_str().unwrap().parse::<OrderId>().unwrap());
        let (status, _, again) = post(&system, &key).await;
        assert_eq!((status, &again["created"]), (202, &serde_json::json!(false)), "{again}");
        assert_eq!(again["order_id"], body["order_id"]);
    }
    assert_eq!(system.t.count("StateTable").await, 2);
    system.settle().await;
    for id in ids {
        assert_eq!(system.state(id).await.process_state, ProcessState::Processed, "{id}");
    }
}

#[tokio::test]
async fn a_throttled_door_answers_503_until_the_throttling_stops() {
    let system = System::behind_proxy("wire-door", "{}").await;
    let proxy = system.proxy.as_ref().unwrap();
    proxy.faults.set(vec![rule(
        "dynamodb",
        "PutItem on StateTable",
        WireFault::Throttle,
        PAST_SDK_RETRIES,
    )]);
    let (status, retry_after, _) = post(&system, "wire-door").await;
    assert_eq!(status, 503);
    assert!(retry_after.is_some());
    assert_eq!(system.t.count("StateTable").await, 0);
    let (status, _, _) = post(&system, "wire-door").await;
    assert_eq!(status, 202);
}

#[tokio::test]
async fn a_throttled_state_write_leaves_its_message_for_redelivery() {
    let system = System::behind_proxy("wire-throttle", "{}").await;
    let proxy = system.proxy.as_ref().unwrap();
    let (status, _, body) = post(&system, "wire-throttle").await;
    assert_eq!(status, 202, "{body}");
    let id: OrderId = body["order_id"].as_str().unwrap().parse().unwrap();

    // The claim's conditional write is throttled past the SDK's retries: the start message is
    // reported failed, so the queue keeps it, and the record is untouched.
    proxy.faults.set(vec![rule(
        "dynamodb",
        "PutItem on StateTable",
        WireFault::Throttle,
        PAST_SDK_RETRIES,
    )]);
    let event = system.t.receive("SchedulerQueue", 1).await;
    assert_eq!(event.len(), 1);
    let response = system.handle_batch("SchedulerQueue", sqs_event(&event)).await;
    assert_eq!(response.batch_item_failures.len(), 1, "the throttled start must come back");
    assert_eq!(system.state(id).await.process_state, ProcessState::Pending);

    // Redelivered once the throttling is over, it is claimed.
    system.t.release("SchedulerQueue", event[0].receipt_handle().unwrap()).await;
    system.settle().await;
    assert_eq!(system.state(id).await.process_state, ProcessState::Processed);
    assert!(proxy.faults.rules().iter().all(|r| r.times == Some(0)), "every fault was hit");
}

#[tokio::test]
async fn a_send_that_fails_on_the_server_is_replayed_from_the_written_state() {
    let system = System::behind_proxy("wire-send", "{}").await;
    let proxy = system.proxy.as_ref().unwrap();
    system.fast_redelivery.store(true, std::sync::atomic::Ordering::Relaxed);
    let (_, _, body) = post(&system, "wire-send").await;
    let id: OrderId = body["order_id"].as_str().unwrap().parse().unwrap();

    // The claim is written, then its request cannot be sent: the start message fails and
    // comes back, and its redelivery sends the request from the written state.
    proxy.faults.set(vec![rule(
        "sqs",
        "SendMessageBatch",
        WireFault::ServerError { status: 503 },
        PAST_SDK_RETRIES,
    )]);
    assert_eq!(system.pump_queue("SchedulerQueue").await, 1);
    let claimed = system.state(id).await;
    assert_eq!(claimed.process_state, ProcessState::Processing);
    assert!(system.t.receive("inventoryQueue", 0).await.is_empty(), "nothing was sent");
    system.settle().await;
    let done = system.state(id).await;
    assert_eq!(done.process_state, ProcessState::Processed);
    // One lease per step: the replay did not take a new one.
    assert_eq!(done.attempt, claimed.attempt + 2);
    let ledger = system.remote.ledger().await;
    assert_eq!(ledger["max_applications"], 1);
    assert_effects_match(&ledger, sas_workflows::order_fulfilment(), &ended([id], "Processed"));
}

#[tokio::test]
async fn an_event_eventbridge_refuses_alone_is_published_again_alone() {
    let system = System::behind_proxy(
        "wire-event",
        r#"{"actions": {"charge-payment": {"permanent_rate": 1.0}}}"#,
    )
    .await;
    let proxy = system.proxy.as_ref().unwrap();
    // Every PutEvents call with a second entry has it refused (a 200 naming it failed).
    let fail_second = WireFault::FailEntry { index: 1 };
    proxy.faults.set(vec![FaultRule::new("eventbridge", Some("PutEvents"), fail_second)]);
    let (status, _, body) = post(&system, "wire-event").await;
    assert_eq!(status, 202, "{body}");
    let id: OrderId = body["order_id"].as_str().unwrap().parse().unwrap();
    system.settle().await;
    proxy.faults.clear();
    assert!(proxy.faults.hits() > 0, "no entry was refused");

    let record = system.state(id).await;
    assert_eq!(record.process_state, ProcessState::Error);
    assert_eq!(record.alert, Some(sas_engine::state::AlertDelivery::Sent));
    // Each event once: the refused ones again, alone, and the accepted ones not again.
    let alerts = system.t.drain("AlertsQueue").await;
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    let events = system.t.drain("OrderEventsQueue").await;
    let seen = statuses(&events, id);
    let once = ["received", "processing", "step_done", "compensating", "compensated"];
    assert_eq!(seen, once, "{events:?}");
}

#[tokio::test]
async fn slow_answers_make_an_order_slower_not_different() {
    let system = System::behind_proxy("wire-slow", "{}").await;
    let proxy = system.proxy.as_ref().unwrap();
    proxy.faults.set(vec![FaultRule::new("*", None, WireFault::Slow { ms: 150 })]);
    let started = std::time::Instant::now();
    let (status, _, body) = post(&system, "wire-slow").await;
    assert_eq!(status, 202, "{body}");
    system.settle().await;
    proxy.faults.clear();
    let id = OrderId::for_key(&IdempotencyKey::parse("wire-slow").unwrap());
    let record = system.t.store().load(id, Read::Consistent).await.unwrap().unwrap();
    assert_eq!(record.process_state, ProcessState::Processed);
    assert_eq!(record.failure_count, 0);
    assert!(started.elapsed() >= std::time::Duration::from_millis(150 * 6), "the proxy delayed");
}

fn sqs_event(messages: &[aws_sdk_sqs::types::Message]) -> aws_lambda_events::event::sqs::SqsEvent {
    let mut event = aws_lambda_events::event::sqs::SqsEvent::default();
    for m in messages {
        let mut record = aws_lambda_events::event::sqs::SqsMessage::default();
        record.message_id = m.message_id().map(str::to_owned);
        record.receipt_handle = m.receipt_handle().map(str::to_owned);
        record.body = m.body().map(str::to_owned);
        event.records.push(record);
    }
    event
}
