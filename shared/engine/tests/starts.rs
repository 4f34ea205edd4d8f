//! Orders started without a client: an event that matches a workflow's pattern starts one
//! order, however often it is delivered; a schedule's time starts one, however often it is
//! looked at.

#![allow(clippy::unwrap_used)] // test crate: helpers outside #[test] fns panic on failed setup

mod world;

use std::sync::Arc;

use serde_json::json;

use sas_engine::Timestamp;
use sas_engine::memory::SeqIds;
use sas_engine::services::Starter;
use sas_engine::starts::{Declared, Pattern, Schedule, Start};
use sas_engine::state::ProcessState;
use world::World;

fn starts() -> Vec<Declared> {
    let signed_up = json!({"source": ["shop.web"], "detail-type": ["OrderPlaced"],
                           "detail": {"currency": ["EUR"]}});
    vec![
        Declared {
            workflow: "order-fulfilment".into(),
            index: 0,
            start: Start::Event {
                pattern: Pattern::new(&signed_up).unwrap(),
                input: "/detail".into(),
            },
        },
        Declared {
            workflow: "order-fulfilment".into(),
            index: 1,
            start: Start::Schedule {
                schedule: Schedule::parse("rate(15 minutes)", None).unwrap(),
                input: serde_json::from_str(&world::order_body("nightly")).unwrap(),
            },
        },
    ]
}

fn event(id: &str, currency: &str) -> serde_json::Value {
    let mut detail: serde_json::Value = serde_json::from_str(&world::order_body(id)).unwrap();
    detail["currency"] = currency.into();
    json!({"id": id, "source": "shop.web", "detail-type": "OrderPlaced", "detail": detail})
}

#[tokio::test]
async fn an_event_delivered_twice_starts_one_order_and_one_that_does_not_match_none() {
    let mut w = World::new();
    let starter =
        Starter::new(w.system.submission(w.queues.clone(), Arc::new(SeqIds::new("s"))), starts());
    let first = starter.on_event(&event("e-1", "EUR")).await.unwrap();
    let again = starter.on_event(&event("e-1", "EUR")).await.unwrap();
    assert_eq!(first.len(), 1);
    let accepted = first[0].outcome.clone().unwrap();
    assert!(accepted.created);
    assert_eq!(
        again[0].outcome.clone().unwrap(),
        sas_engine::services::Accepted { created: false, ..accepted }
    );
    assert!(starter.on_event(&event("e-2", "USD")).await.unwrap().is_empty());
    w.run_for(std::time::Duration::from_secs(120)).await;
    assert_eq!(w.state(accepted.order_id).process_state, ProcessState::Processed);
    assert_eq!(w.store.records().len(), 1);
}

#[tokio::test]
async fn a_schedules_time_looked_at_by_two_sweeps_starts_one_order() {
    let w = World::new();
    let starter = || {
        Starter::new(w.system.submission(w.queues.clone(), Arc::new(SeqIds::new("s"))), starts())
    };
    let (one, other) = (starter(), starter());
    // 1.8e12 ms since the epoch is on a quarter hour.
    let t = |minutes: i64| Timestamp::from_millis(1_800_000_000_000 + minutes * 60_000);
    let created = |s: &[sas_engine::services::Started]| {
        s.iter().filter(|s| s.outcome.as_ref().unwrap().created).count()
    };
    // Two sweeps whose windows overlap over the quarter past: the process that started it
    // skips it, another one finds the order it made.
    let first = one.on_schedules(t(-1), t(15)).await.unwrap();
    let second = one.on_schedules(t(14), t(31)).await.unwrap();
    let elsewhere = other.on_schedules(t(14), t(31)).await.unwrap();
    assert_eq!((first.len(), created(&first)), (2, 2));
    assert_eq!((second.len(), created(&second)), (1, 1));
    assert_eq!((elsewhere.len(), created(&elsewhere)), (2, 0));
    assert_eq!(w.store.records().len(), 3);
    // A key names the schedule and its time.
    assert_eq!(first[1].key, elsewhere[0].key);
    assert_eq!(second[0].key, elsewhere[1].key);
    assert!(first[1].key.starts_with("schedule-order-fulfilment-1-"));
}

#[tokio::test]
async fn an_event_whose_input_its_workflow_refuses_starts_nothing_and_says_why() {
    let w = World::new();
    let starter =
        Starter::new(w.system.submission(w.queues.clone(), Arc::new(SeqIds::new("s"))), starts());
    let mut refused = event("e-3", "EUR");
    refused["detail"]["items"] = json!([]);
    let started = starter.on_event(&refused).await.unwrap();
    let why = started[0].outcome.clone().unwrap_err();
    assert!(why.contains("/items"), "{why}");
    assert!(w.store.records().is_empty() && w.store.orders().is_empty());
}
