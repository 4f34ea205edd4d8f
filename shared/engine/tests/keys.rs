//! Concurrency per key: orders of one key run at most `limit` at a time, in the order they
//! were accepted, whatever else runs beside them; a waiting order is cancelled, skipped or
//! timed out as its workflow says; a place its order never gave back is taken back.

#![allow(clippy::unwrap_used)] // test crate: helpers outside #[test] fns panic on failed setup

mod world;

use std::time::Duration;

use sas_engine::OrderId;
use sas_engine::catalogue::Catalogue;
use sas_engine::keys::Slots;
use sas_engine::machine::Refused;
use sas_engine::ports::{Clock, StateStore};
use sas_engine::services::{Applied, Command};
use sas_engine::state::{CommandKind, Happening, ProcessState};
use sas_engine::workflow::Workflow;
use serde_json::{Value, json};
use world::{World, agent_names};

/// The reference workflow with `concurrency`, and `steps` of its own if given.
fn keyed_world(concurrency: Value, steps: Option<Value>) -> World {
    keyed_world_as(concurrency, |spec| {
        if let Some(steps) = steps {
            spec["steps"] = steps;
        }
    })
}

/// The reference workflow with `concurrency`, changed by `change`.
fn keyed_world_as(concurrency: Value, change: impl FnOnce(&mut Value)) -> World {
    let mut w = World::new();
    let mut spec: Value = serde_json::from_str(sas_workflows::order_fulfilment()).unwrap();
    spec["version"] = json!(2);
    spec["concurrency"] = concurrency;
    change(&mut spec);
    let workflow = Workflow::from_json(&spec.to_string(), &agent_names()).unwrap();
    w.deploy(Catalogue::new(vec![workflow]).unwrap());
    w
}

/// Orders of `key` (`<group>/<customer>`) that hold a place and have not ended.
fn running(w: &World, key: &str) -> Vec<OrderId> {
    w.store
        .records()
        .into_iter()
        .filter(|r| r.slot.as_ref().is_some_and(|s| s.key == key && s.admitted) && !r.is_terminal())
        .map(|r| r.order_id)
        .collect()
}

/// Pumps until nothing is visible, checking after every round that no two orders of `key`
/// run at once.
async fn settle_one_at_a_time(w: &mut World, key: &str) {
    for _ in 0..200 {
        let running = running(w, key);
        assert!(running.len() <= 1, "orders of {key} running at once: {running:?}");
        if w.pump().await == 0 {
            return;
        }
    }
    panic!("the system did not settle");
}

/// The orders of the service's ledger, in the order their effects took place.
fn ledger_orders(w: &World) -> Vec<OrderId> {
    w.remote.ledger().into_iter().map(|e| e.order_id).collect()
}

#[tokio::test]
async fn orders_of_one_key_run_one_at_a_time_in_the_order_they_were_accepted() {
    let mut w = keyed_world(json!({"key": "/input/customer_id", "limit": 1}), None);
    // Keys of one length are orders of one customer (see `order_body`).
    let same: Vec<OrderId> = {
        let mut ids = Vec::new();
        for key in ["a-1", "a-2", "a-3"] {
            ids.push(w.submit(key).await.unwrap().order_id);
        }
        ids
    };
    let other = w.submit("bbbb-1").await.unwrap().order_id;
    w.pump().await;
    // The first order of each customer runs at once; the others of the first wait.
    assert!(w.state(same[0]).slot.unwrap().admitted);
    assert!(w.state(other).slot.unwrap().admitted, "another customer's order waited");
    for (n, id) in same[1..].iter().enumerate() {
        assert!(w.state(*id).waits_in_line(), "{id} did not wait");
        let standing = w.ports().standing(&w.state(*id)).await.unwrap().unwrap();
        assert_eq!((standing.running, standing.position), (1, n as u32 + 1), "{standing}");
    }
    assert_eq!(
        w.ports().standing(&w.state(same[2])).await.unwrap().unwrap().to_string(),
        "order-fulfilment/c-3: 1 running of 1, this order 2nd in line"
    );
    assert!(w.ports().standing(&w.state(same[0])).await.unwrap().is_none());
    settle_one_at_a_time(&mut w, "order-fulfilment/c-3").await;
    for id in same.iter().chain([&other]) {
        assert_eq!(w.state(*id).process_state, ProcessState::Processed);
    }
    // In the service's ledger, each order of the customer took effect after the one before
    // it had taken all of its effects.
    let mut order: Vec<OrderId> =
        ledger_orders(&w).into_iter().filter(|o| same.contains(o)).collect();
    order.dedup();
    assert_eq!(order, same, "effects of one customer's orders interleaved, or out of order");
    let waited = w.state(same[2]);
    let happenings: Vec<Happening> = waited.timeline.iter().map(|t| t.what).collect();
    assert!(happenings.contains(&Happening::InLine) && happenings.contains(&Happening::Admitted));
    // Nothing is left of the key once its orders ended: no place taken, nobody in line.
    let slots = w.store.slots("order-fulfilment/c-3").await.unwrap();
    assert!(slots.running.is_empty(), "{slots:?}");
    assert!(w.store.lines().is_empty(), "{:?}", w.store.lines());
}

#[tokio::test]
async fn a_limit_above_one_lets_that_many_run_and_no_more() {
    let mut w = keyed_world(json!({"key": "/input/customer_id", "limit": 2}), None);
    let mut ids = Vec::new();
    for key in ["a-1", "a-2", "a-3", "a-4", "a-5"] {
        ids.push(w.submit(key).await.unwrap().order_id);
    }
    let key = "order-fulfilment/c-3";
    let mut most = 0;
    for _ in 0..200 {
        let now = running(&w, key).len();
        assert!(now <= 2, "{now} orders of {key} running at once");
        most = most.max(now);
        if w.pump().await == 0 {
            break;
        }
    }
    assert_eq!(most, 2, "the limit of 2 was never used");
    assert!(ids.iter().all(|id| w.state(*id).process_state == ProcessState::Processed));
}

#[tokio::test]
async fn a_waiting_order_is_cancelled_at_once_and_cannot_be_paused() {
    let mut w = keyed_world(json!({"key": "/input/customer_id", "limit": 1}), None);
    let first = w.submit("a-1").await.unwrap().order_id;
    let second = w.submit("a-2").await.unwrap().order_id;
    w.pump().await;
    assert!(w.state(second).waits_in_line());
    let operator = w.operator();
    let command = |kind, id| Command::new(kind, id, "arn:ops", "customer called").unwrap();
    let paused = operator.command(second, &command(CommandKind::Pause, "p-1")).await;
    let applied = paused.unwrap().unwrap().applied;
    assert!(matches!(applied, Applied::Refused(Refused::InLine { .. })), "{applied:?}");
    operator.command(second, &command(CommandKind::Cancel, "c-1")).await.unwrap();
    assert_eq!(w.state(second).process_state, ProcessState::Cancelled);
    w.settle().await;
    assert_eq!(w.state(first).process_state, ProcessState::Processed);
    assert!(!ledger_orders(&w).contains(&second), "a cancelled waiting order took effect");
    assert!(w.store.lines().is_empty());
}

#[tokio::test]
async fn a_workflow_that_skips_ends_a_newcomer_whose_key_is_busy_without_running_it() {
    let mut w =
        keyed_world(json!({"key": "/input/customer_id", "limit": 1, "on_conflict": "skip"}), None);
    let first = w.submit("a-1").await.unwrap().order_id;
    w.pump().await;
    let second = w.submit("a-2").await.unwrap().order_id;
    w.settle().await;
    assert_eq!(w.state(first).process_state, ProcessState::Processed);
    let skipped = w.state(second);
    assert_eq!(skipped.process_state, ProcessState::Cancelled);
    assert_eq!(skipped.cause.unwrap().kind(), "key_busy");
    assert!(!ledger_orders(&w).contains(&second));
    assert!(w.alerts().is_empty(), "a skipped order is no operator's business");
    // With the key free again, the next one runs.
    let third = w.submit("a-3").await.unwrap().order_id;
    w.settle().await;
    assert_eq!(w.state(third).process_state, ProcessState::Processed);
}

#[tokio::test]
async fn a_wait_of_the_running_order_holds_its_key_and_max_wait_fails_the_next_with_its_cause() {
    let steps = json!([
        {"name": "reserve-inventory", "agent": "inventory",
         "compensation": {"action": "release-inventory"}},
        {"name": "cool-off", "wait": {"seconds": 600}},
        {"name": "charge-payment", "agent": "payment"}
    ]);
    let mut w = keyed_world(
        json!({"key": "/input/customer_id", "limit": 1, "max_wait_seconds": 120}),
        Some(steps),
    );
    let first = w.submit("a-1").await.unwrap().order_id;
    let second = w.submit("a-2").await.unwrap().order_id;
    w.run_for(Duration::from_secs(300)).await;
    // The first waits out its time holding the key; the second gave up after two minutes.
    assert!(!w.state(first).is_terminal());
    let failed = w.state(second);
    assert_eq!(failed.process_state, ProcessState::Error);
    let cause = failed.cause.clone().unwrap();
    assert_eq!(cause.kind(), "key_waited_too_long", "{cause}");
    assert!(w.alerts().iter().any(|a| a["order_id"] == second.to_string()));
    assert!(!ledger_orders(&w).contains(&second));
    w.run_for(Duration::from_secs(900)).await;
    assert_eq!(w.state(first).process_state, ProcessState::Processed);
    // Redriven, it waits in line again and runs once the key is free.
    let redrive = Command::new(CommandKind::Redrive, "again", "arn:ops", "asked").unwrap();
    w.operator().command(second, &redrive).await.unwrap();
    w.run_for(Duration::from_secs(900)).await;
    assert_eq!(w.state(second).process_state, ProcessState::Processed);
}

#[tokio::test]
async fn a_place_its_order_never_gave_back_is_taken_back_once_the_next_looks_again() {
    let mut w = keyed_world(json!({"key": "/input/customer_id", "limit": 1}), None);
    let first = w.submit("a-1").await.unwrap().order_id;
    w.settle().await;
    assert_eq!(w.state(first).process_state, ProcessState::Processed);
    // As if the first order's handler died between its last write and giving its place back.
    let key = "order-fulfilment/c-3";
    let mut leaked = w.store.slots(key).await.unwrap();
    leaked.running.insert(format!("{first}.0"), w.clock.now());
    leaked.version += 1;
    w.store.save_slots(&leaked).await.unwrap();
    let second = w.submit("a-2").await.unwrap().order_id;
    w.settle().await;
    assert!(w.state(second).waits_in_line(), "admitted while the key looked full");
    w.run_for(Duration::from_secs(600)).await;
    let done = w.state(second);
    assert_eq!(done.process_state, ProcessState::Processed);
    let slots: Slots = w.store.slots(key).await.unwrap();
    assert!(slots.running.is_empty(), "{slots:?}");
    // Taken back within a look or two, not at the end of the run.
    let admitted = done.timeline.iter().find(|t| t.what == Happening::Admitted).unwrap().at;
    assert!(
        done.created_at.until(admitted) <= Duration::from_secs(180),
        "{:?}",
        done.created_at.until(admitted)
    );
}

#[tokio::test]
async fn an_order_without_its_key_is_refused_at_the_door_and_nothing_is_written() {
    // A schema that lets the customer out: the key is what refuses the order.
    let w = keyed_world_as(json!({"key": "/input/customer_id", "limit": 1}), |spec| {
        let required = spec["input_schema"]["required"].as_array_mut().unwrap();
        required.retain(|r| r != "customer_id");
    });
    let body = r#"{"currency":"EUR","items":[{"sku":"BOOK-1","quantity":1,"unit_price":1250}],
        "ship_to":{"name":"Ada","line1":"1 Main St","city":"Paris","postal_code":"75001","country":"FR"}}"#;
    let err = w.submission.submit("no-key", body.as_bytes()).await.unwrap_err().to_string();
    assert!(err.contains("/customer_id") && err.contains("concurrency.key"), "{err}");
    assert!(w.store.orders().is_empty() && w.store.records().is_empty());
    assert!(w.queues.sent_count(&sas_engine::ports::Destination::Scheduler) == 0);
}
