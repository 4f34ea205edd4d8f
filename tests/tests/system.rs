//! The system end to end on a moto server: the real submission, status, scheduler, agent and
//! supervisor handlers with the real adapters, resources from `template.yaml`, the simulated
//! remote service over HTTP, and the event sources played by the test.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use sas_engine::state::{Phase, ProcessState, StepStatus};
use sas_tests::effects::{assert_effects_match, ended, mismatches};
use sas_tests::stack::{System, order_id, order_json, statuses};
use serde_json::Value;

#[tokio::test]
async fn an_order_runs_through_the_three_steps() {
    let s = System::start("happy", "{}").await;
    let (status, body) =
        s.post(Some("order-happy-1"), "application/json", &order_json("c-1")).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["created"], true);
    let id = order_id(&body);
    assert_eq!(body["status_url"], format!("/orders/{id}"));
    s.settle().await;

    let r = s.state(id).await;
    assert_eq!(r.process_state, ProcessState::Processed);
    assert_eq!(r.complete_by, None);
    let ledger = s.remote.ledger().await;
    assert_eq!(ledger["effects"].as_array().unwrap().len(), 3);
    assert_eq!(ledger["max_applications"], 1);
    assert_effects_match(&ledger, sas_workflows::order_fulfilment(), &ended([id], "Processed"));

    let (status, view) = s.get(&id.to_string()).await;
    assert_eq!(status, 200);
    assert_eq!(view["process_state"], "Processed");
    assert_eq!(view["steps"].as_array().unwrap().len(), 3);
    assert!(view["timeline"].as_array().unwrap().len() >= 5);
    let events = s.t.drain("OrderEventsQueue").await;
    assert_eq!(statuses(&events, id).last().map(String::as_str), Some("processed"));
    assert!(s.t.drain("AlertsQueue").await.is_empty());
}

/// Submits `n` orders under keys `{prefix}-{i}`, settles the system, and requires each of them
/// Processed.
async fn processed_orders(s: &System, prefix: &str, n: usize) -> Vec<sas_engine::OrderId> {
    let mut ids = Vec::new();
    for i in 0..n {
        let key = format!("{prefix}-{i}");
        let (status, body) = s.post(Some(&key), "application/json", &order_json("c-2")).await;
        assert_eq!(status, 202, "{body}");
        ids.push(order_id(&body));
    }
    s.settle().await;
    for &id in &ids {
        assert_eq!(s.state(id).await.process_state, ProcessState::Processed, "{id}");
    }
    ids
}

#[tokio::test]
async fn the_business_count_fails_when_the_service_applies_a_repeated_key_again() {
    // Lost answers make the agents call again with the same key; a service that forgets its
    // keys applies each of those again, and the count of effects in place must say so.
    let s = System::start(
        "forgetful",
        r#"{"default": {"lost_answer_rate": 0.5, "forget_keys": true, "seed": 5}}"#,
    )
    .await;
    let ids = processed_orders(&s, "order-forgetful", 4).await;
    let stats = s.remote.stats().await;
    assert!(stats["lost_answer"].as_u64().unwrap() > 0, "no answer was lost: {stats}");
    let ledger = s.remote.ledger().await;
    let wrong = mismatches(&ledger, sas_workflows::order_fulfilment(), &ended(ids, "Processed"));
    println!("{}", wrong.join("\n"));
    assert!(wrong.iter().any(|w| w.contains(" in place 2 times")), "{wrong:?}\n{ledger}");
}

#[tokio::test]
async fn transient_faults_of_the_remote_service_are_absorbed_by_the_agents() {
    let s = System::start(
        "flaky",
        r#"{"default": {"transient_rate": 0.4, "lost_answer_rate": 0.4, "seed": 5}}"#,
    )
    .await;
    // Four calls in five fail: faults in a row hold the service now and then, and the orders
    // that meet it wait until a probe is answered and the supervisor resumes them.
    let mut ids = Vec::new();
    for i in 0..4 {
        let key = format!("order-flaky-{i}");
        let (status, body) = s.post(Some(&key), "application/json", &order_json("c-2")).await;
        assert_eq!(status, 202, "{body}");
        ids.push(order_id(&body));
    }
    for _ in 0..60 {
        s.settle().await;
        let mut done = true;
        for &id in &ids {
            done &= s.state(id).await.process_state == ProcessState::Processed;
        }
        if done {
            break;
        }
        s.clock.advance(Duration::from_secs(10));
        s.sweep().await;
    }
    for &id in &ids {
        assert_eq!(s.state(id).await.process_state, ProcessState::Processed, "{id}");
    }
    let stats = s.remote.stats().await;
    assert!(stats["transient"].as_u64().unwrap() > 0, "{stats}");
    assert!(stats["lost_answer"].as_u64().unwrap() > 0, "{stats}");
    let ledger = s.remote.ledger().await;
    assert_eq!(ledger["max_applications"], 1);
    assert_effects_match(&ledger, sas_workflows::order_fulfilment(), &ended(ids, "Processed"));
}

#[tokio::test]
async fn a_lost_start_message_is_recovered_by_the_supervisor() {
    let s = System::start("lost-start", "{}").await;
    let (_, body) = s.post(Some("order-lost-start"), "application/json", &order_json("c-3")).await;
    let id = order_id(&body);
    let lost = s.t.receive("SchedulerQueue", 0).await;
    assert_eq!(lost.len(), 1);
    s.t.delete("SchedulerQueue", lost[0].receipt_handle().unwrap()).await;
    s.settle().await;
    assert_eq!(s.state(id).await.process_state, ProcessState::Pending);
    assert_eq!(s.sweep().await.acted, 0, "its deadline has not passed");

    s.expire(id).await;
    let report = s.sweep().await;
    assert_eq!(report.acted, 1, "{report:?}");
    let r = s.state(id).await;
    assert_eq!((r.process_state, r.failure_count), (ProcessState::Pending, 1));
    // The new start message waits out the retry delay (a real SQS delay of one second).
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    s.settle().await;
    assert_eq!(s.state(id).await.process_state, ProcessState::Processed);
}

#[tokio::test]
async fn a_permanent_fault_is_compensated_and_an_operator_alerted() {
    let s =
        System::start("declined", r#"{"actions": {"charge-payment": {"permanent_rate": 1.0}}}"#)
            .await;
    let (_, body) = s.post(Some("order-declined"), "application/json", &order_json("c-4")).await;
    let id = order_id(&body);
    s.settle().await;

    let r = s.state(id).await;
    assert_eq!((r.process_state, r.phase), (ProcessState::Error, Phase::Compensating));
    let steps: Vec<StepStatus> = r.steps.iter().map(|s| s.status).collect();
    assert_eq!(steps, [StepStatus::Undone, StepStatus::Failed, StepStatus::NotStarted]);
    let ledger = s.remote.ledger().await;
    let actions: Vec<&str> = ledger["effects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["reserve-inventory", "release-inventory"]);

    // Observed the way an operator and the submitting application would: on queues that
    // EventBridge rules feed.
    let alerts = s.t.drain("AlertsQueue").await;
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    assert_eq!(alerts[0]["detail-type"], "OrderNeedsAttention");
    assert_eq!(alerts[0]["detail"]["order_id"], id.to_string());
    assert_eq!(alerts[0]["detail"]["fully_compensated"], true);
    assert_eq!(alerts[0]["detail"]["failed_step"], "charge-payment");
    assert_eq!(alerts[0]["detail"]["undone"], serde_json::json!(["reserve-inventory"]));
    assert_eq!(alerts[0]["detail"]["show_command"], format!("sas show {id}"));
    assert_eq!(alerts[0]["detail"]["cause"]["kind"], "step_rejected");
    let events = s.t.drain("OrderEventsQueue").await;
    let seen = statuses(&events, id);
    assert!(
        seen.contains(&"compensating".to_owned())
            && seen.last().map(String::as_str) == Some("compensated"),
        "{seen:?}"
    );
    assert_eq!(r.alert, Some(sas_engine::state::AlertDelivery::Sent));
}

#[tokio::test]
async fn duplicate_and_stale_replies_change_nothing() {
    let s = System::start("duplicates", "{}").await;
    let (_, body) = s.post(Some("order-dup"), "application/json", &order_json("c-5")).await;
    let id = order_id(&body);
    // Run up to the first reply and keep a copy of it.
    assert_eq!(s.pump_queue("SchedulerQueue").await, 1);
    assert_eq!(s.pump_queue("inventoryQueue").await, 1);
    let replies = s.t.receive("ReplyQueue", 0).await;
    let first_reply = replies[0].body().unwrap().to_owned();
    s.t.release("ReplyQueue", replies[0].receipt_handle().unwrap()).await;
    s.settle().await;
    let finished = s.state(id).await;
    assert_eq!(finished.process_state, ProcessState::Processed);

    // The old reply, twice, long after its step and attempt are over.
    s.t.send_raw("ReplyQueue", &first_reply).await;
    s.t.send_raw("ReplyQueue", &first_reply).await;
    s.settle().await;
    assert_eq!(s.state(id).await, finished, "not a byte changed");
    let ledger = s.remote.ledger().await;
    assert_eq!(ledger["max_applications"], 1);
    assert_effects_match(&ledger, sas_workflows::order_fulfilment(), &ended([id], "Processed"));
}

#[tokio::test]
async fn the_same_key_returns_the_same_order_and_a_different_order_is_refused() {
    let s = System::start("idempotent", "{}").await;
    let (status, first) = s.post(Some("order-same"), "application/json", &order_json("c-6")).await;
    assert_eq!((status, &first["created"]), (202, &Value::Bool(true)));
    let (status, again) = s.post(Some("order-same"), "application/json", &order_json("c-6")).await;
    assert_eq!((status, &again["created"]), (202, &Value::Bool(false)));
    assert_eq!(first["order_id"], again["order_id"]);
    // One item: the order is kept in its state record.
    assert_eq!((s.t.count("OrdersTable").await, s.t.count("StateTable").await), (0, 1));

    let (status, conflict) =
        s.post(Some("order-same"), "application/json", &order_json("someone-else")).await;
    assert_eq!(status, 409, "{conflict}");
    assert_eq!(conflict["error"]["code"], "idempotency_key_reused");
    assert_eq!(conflict["error"]["order_id"], first["order_id"]);
    assert_eq!((s.t.count("OrdersTable").await, s.t.count("StateTable").await), (0, 1));
    s.settle().await;
    assert_eq!(s.state(order_id(&first)).await.process_state, ProcessState::Processed);
}

#[tokio::test]
async fn an_ended_order_carries_when_dynamodb_may_forget_it_and_a_failed_one_does_not() {
    let days = 30;
    let config = sas_tests::stack::test_config();
    let retention = Some(Duration::from_secs(days * 24 * 3600));
    let s = System::with_config(
        "retention",
        r#"{"actions": {"charge-payment": {"permanent_rate": 1.0}}}"#,
        sas_engine::config::EngineConfig { retention, ..config },
    )
    .await;
    // The table's time to live reads the attribute the records carry.
    let ttl = s.t.dynamodb.describe_time_to_live().table_name(s.t.name("StateTable")).send().await;
    let ttl = ttl.unwrap().time_to_live_description.unwrap();
    assert_eq!(ttl.attribute_name(), Some("ExpiresAt"), "{ttl:?}");
    let (status, accepted) =
        s.post(Some("kept-a-month"), "application/json", &order_json("c-7")).await;
    assert_eq!(status, 202, "{accepted}");
    let id = order_id(&accepted);
    s.settle().await;
    let record = s.state(id).await;
    // The payment service declines every card: the order is undone, and kept for an operator.
    assert_eq!((record.process_state, record.expires_at), (ProcessState::Error, None));
    let item = stored_item(&s, id).await;
    assert!(!item.contains_key("ExpiresAt"), "{item:?}");
    // An order that ends well is forgotten 30 days after its end, to the second.
    s.remote.set_faults("{}").await;
    let (_, accepted) = s.post(Some("kept-b-month"), "application/json", &order_json("c-8")).await;
    let id = order_id(&accepted);
    s.settle().await;
    let record = s.state(id).await;
    assert_eq!(record.process_state, ProcessState::Processed);
    let item = stored_item(&s, id).await;
    let at: i64 = item["ExpiresAt"].as_n().unwrap().parse().unwrap();
    let ended = record.ended_at.unwrap().as_millis();
    assert_eq!(at, (ended + days as i64 * 86_400_000 + 999) / 1000, "{item:?}");
}

/// Order `id`'s item in `StateTable`, as stored.
async fn stored_item(
    s: &System,
    id: sas_engine::OrderId,
) -> std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue> {
    let key = aws_sdk_dynamodb::types::AttributeValue::S(id.to_string());
    let got = s.t.dynamodb.get_item().table_name(s.t.name("StateTable")).key("OrderId", key);
    got.send().await.unwrap().item.unwrap()
}

/// The steps of `ledger` applied for order `id`, by action, in the order applied.
fn applied(ledger: &Value, id: sas_engine::OrderId) -> Vec<String> {
    let effects = ledger["effects"].as_array().cloned().unwrap_or_default();
    effects
        .iter()
        .filter(|e| e["key"].as_str().is_some_and(|k| k.starts_with(&id.to_string())))
        .map(|e| e["action"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Delivers every queue but `except` until none of them has anything left.
async fn settle_but(s: &System, except: &str) {
    for _ in 0..200 {
        let mut delivered = 0;
        for (_, queue) in s.t.work_queues() {
            if queue != except {
                delivered += s.pump_queue(&queue).await;
            }
        }
        if delivered == 0 {
            return;
        }
    }
    panic!("the system did not settle");
}

#[tokio::test]
async fn a_held_charge_reaches_the_operators_alerts_and_a_refund_goes_on_beside_it() {
    let s = System::start("held-charge", r#"{"actions": {"ship": {"permanent_rate": 1.0}}}"#).await;
    // Order A is charged, and its shipment waits in the shipping queue.
    let (_, body) = s.post(Some("order-held-a"), "application/json", &order_json("c-a")).await;
    let a = order_id(&body);
    settle_but(&s, "shippingQueue").await;
    assert_eq!(applied(&s.remote.ledger().await, a), ["reserve-inventory", "charge-payment"]);

    // Every charge fails for now: order B's hold the charges, and B waits.
    let down = r#"{"actions": {"ship": {"permanent_rate": 1.0},
                              "charge-payment": {"transient_rate": 1.0}}}"#;
    s.remote.set_faults(down).await;
    let (_, body) = s.post(Some("order-held-b"), "application/json", &order_json("c-b")).await;
    let b = order_id(&body);
    settle_but(&s, "shippingQueue").await;
    let held = s.state(b).await;
    assert_eq!(held.process_state, ProcessState::Pending);
    assert_eq!(held.held_on().map(|h| h.key()).as_deref(), Some("payment/charge-payment"));

    // A's shipment is refused: its refund goes to the payment service, whose charges are held
    // but whose refunds answer, and A is undone.
    s.settle().await;
    let undone = s.state(a).await;
    assert_eq!((undone.process_state, undone.phase), (ProcessState::Error, Phase::Compensating));
    let steps: Vec<StepStatus> = undone.steps.iter().map(|s| s.status).collect();
    assert_eq!(steps, [StepStatus::Undone, StepStatus::Undone, StepStatus::Failed]);
    assert!(applied(&s.remote.ledger().await, a).contains(&"refund-payment".to_owned()));

    // The sweep announces the hold: the alert rule takes it to the operators' queue.
    s.sweep().await;
    let alerts = s.t.drain("AlertsQueue").await;
    let holds: Vec<&Value> =
        alerts.iter().filter(|a| a["detail-type"] == "ServiceHoldChanged").collect();
    assert_eq!(holds.len(), 1, "{alerts:?}");
    let detail = &holds[0]["detail"];
    assert_eq!(
        (&detail["service"], &detail["action"], &detail["state"], &detail["waiting"]),
        (&Value::from("payment"), &Value::from("charge-payment"), &Value::from("held"), &1.into())
    );
    assert!(alerts.iter().any(|a| a["detail-type"] == "OrderNeedsAttention"), "A's: {alerts:?}");
    let ops = Some("arn:aws:iam::123456789012:user/ops");
    let (status, services) = s.admin("GET", "/admin/services", None, ops).await;
    assert_eq!(status, 200, "{services}");
    let payment = services["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["service"] == "payment")
        .unwrap()
        .clone();
    assert_eq!(payment["state"], "actions_held", "{payment}");
    assert_eq!(payment["holds"][0]["action"], "charge-payment", "{payment}");

    // The charges answer again: the next probe, carried by B, opens them, and the release
    // is announced in turn.
    s.remote.set_faults("{}").await;
    s.clock.advance(s.config.hold.probe_every);
    s.sweep().await;
    s.settle().await;
    assert_eq!(s.state(b).await.process_state, ProcessState::Processed);
    s.sweep().await;
    let alerts = s.t.drain("AlertsQueue").await;
    let opened: Vec<&Value> = alerts
        .iter()
        .filter(|a| a["detail-type"] == "ServiceHoldChanged" && a["detail"]["state"] == "open")
        .collect();
    assert_eq!(opened.len(), 1, "{alerts:?}");
    assert_eq!(opened[0]["detail"]["action"], "charge-payment");
}

#[tokio::test]
async fn a_denied_call_fails_its_step_at_once_and_holds_nothing() {
    let s = System::start("denied-charge", r#"{"actions": {"charge-payment": {"denied": true}}}"#)
        .await;
    let mut ids = Vec::new();
    for k in 0..6 {
        let key = format!("order-denied-{k}");
        let (_, body) = s.post(Some(&key), "application/json", &order_json("c-d")).await;
        ids.push(order_id(&body));
    }
    s.settle().await;
    for id in ids {
        let r = s.state(id).await;
        assert_eq!((r.process_state, r.phase), (ProcessState::Error, Phase::Compensating));
        let cause = r.cause.as_ref().unwrap();
        assert_eq!(cause.kind(), "step_rejected", "{cause}");
        assert!(cause.to_string().contains("AccessDenied"), "{cause}");
        assert_eq!(r.failure_count, 0, "refused at once, no lease ran out");
    }
    use sas_engine::ports::ServiceBook;
    let record = s.book.load("payment").await.unwrap();
    assert!(record.is_none_or(|r| !r.is_held()), "six denials in a row hold nothing");
    let stats = s.remote.stats().await;
    assert_eq!(stats["actions"]["charge-payment"]["denied"], 6, "each charge called once: {stats}");
}

#[tokio::test]
async fn an_agent_queue_made_after_the_scheduler_sends_to_it_delays_its_orders_and_fails_none() {
    let s = System::start("queue-later", "{}").await;
    s.fast_redelivery.store(true, std::sync::atomic::Ordering::Relaxed);
    // A stack update adding an agent may run the scheduler's new code before CloudFormation
    // has made the agent's queue: here the first step's queue is not there yet.
    let (_, queue) =
        s.t.agent_queues().into_iter().find(|(a, _)| a.as_str() == "inventory").unwrap();
    let url = s.t.name(&queue);
    let attributes =
        s.t.sqs
            .get_queue_attributes()
            .queue_url(&url)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::All)
            .send()
            .await
            .unwrap();
    s.t.sqs.delete_queue().queue_url(&url).send().await.unwrap();
    let (_, body) = s.post(Some("order-queue-later"), "application/json", &order_json("c-q")).await;
    let id = order_id(&body);
    // The start is claimed, its dispatch cannot be sent, and the message comes back; from its
    // third receive it is sent again as a new message, a minute later, so that however long
    // the queue takes to come it never reaches the dead letters.
    for _ in 0..sas_aws::batch::REQUEUE_FROM_RECEIVE {
        assert_eq!(s.pump_queue("SchedulerQueue").await, 1);
    }
    assert_eq!(s.pump_queue("SchedulerQueue").await, 0, "sent again for later");
    assert!(s.t.drain_raw("SchedulerDeadLetterQueue").await.is_empty());
    assert_eq!(s.state(id).await.process_state, ProcessState::Processing);

    // The queue is made. The message sent again is known by the first one's id: the claim that
    // one wrote is replayed and its dispatch sent, rather than the claim refused as stale and
    // the order left until its lease runs out.
    let kept = ["VisibilityTimeout", "RedrivePolicy", "MessageRetentionPeriod"];
    let mut made = s.t.sqs.create_queue().queue_name(url.rsplit('/').next().unwrap());
    for (name, value) in attributes.attributes().into_iter().flatten() {
        if kept.contains(&name.as_str()) {
            made = made.attributes(name.clone(), value);
        }
    }
    made.send().await.unwrap();
    tokio::time::sleep(sas_aws::batch::REQUEUE_DELAY + Duration::from_secs(1)).await;
    s.settle().await;
    let r = s.state(id).await;
    assert_eq!((r.process_state, r.failure_count), (ProcessState::Processed, 0));
    for queue in ["SchedulerDeadLetterQueue", "ReplyDeadLetterQueue", "inventoryDeadLetterQueue"] {
        assert!(s.t.drain_raw(queue).await.is_empty(), "{queue}");
    }
}
