//! A step over a list: one child order per element, a few at a time, within a tolerance of
//! failures; its output is the children's outputs in order, and its undo undoes every child
//! that was processed, and only those.

#![allow(clippy::unwrap_used)] // test crate: helpers outside #[test] fns panic on failed setup

mod world;

use std::time::Duration;

use serde_json::{Value, json};

use sas_engine::OrderId;
use sas_engine::catalogue::Catalogue;
use sas_engine::ids::Owner;
use sas_engine::memory::Behaviour;
use sas_engine::ports::{Destination, Incoming};
use sas_engine::services::Command;
use sas_engine::state::{CommandKind, ProcessState, StateRecord, StepStatus};
use sas_engine::workflow::Workflow;
use world::{World, agent_names};

const SHIP_EACH: usize = 1;

/// A parent that reserves the stock, ships each parcel of its input by a child order (at most
/// `concurrency` at once, `tolerance` of them may fail), then charges the card.
fn world(concurrency: u32, tolerance: &str) -> World {
    world_within(concurrency, tolerance, 3600, "undo")
}

/// [`world`], the list given `timeout` seconds to end, and its failure doing `on_failure`.
fn world_within(concurrency: u32, tolerance: &str, timeout: u64, on_failure: &str) -> World {
    let mut w = World::new();
    let child = r#"{"name":"ship-parcel","input_schema":{"type":"object","required":["parcel"]},
        "steps":[{"name":"ship","agent":"shipping","compensation":{"action":"recall"}}]}"#;
    let parent = format!(
        r#"{{"name":"ship-all","steps":[
        {{"name":"reserve-inventory","agent":"inventory","compensation":{{"action":"release-inventory"}}}},
        {{"name":"ship-each","each":{{"items":"/input/parcels","workflow":"ship-parcel",
            "max_concurrency":{concurrency},"tolerance":{tolerance},"timeout_seconds":{timeout}}},
            "on_failure":"{on_failure}"}},
        {{"name":"charge-payment","agent":"payment","compensation":{{"action":"refund-payment"}}}}]}}"#
    );
    let workflows =
        [child, parent.as_str()].map(|json| Workflow::from_json(json, &agent_names()).unwrap());
    w.deploy(Catalogue::new(workflows.to_vec()).unwrap());
    w
}

fn parcels(n: u32) -> String {
    let list: Vec<Value> = (0..n).map(|k| json!({"parcel": format!("p-{k}")})).collect();
    json!({ "parcels": list }).to_string()
}

async fn submit(w: &World, key: &str, body: &str) -> OrderId {
    let owner = Owner::anonymous();
    w.submission.submit_to(&owner, Some("ship-all"), key, body.as_bytes()).await.unwrap().order_id
}

fn element(parent: OrderId, k: u32) -> OrderId {
    OrderId::for_element(parent, "ship-each", 0, k)
}

fn shipped(w: &World, parent: OrderId, k: u32) -> bool {
    w.remote.applied(&World::key(element(parent, k), "ship", "do"))
}

fn recalled(w: &World, parent: OrderId, k: u32) -> bool {
    w.remote.applied(&World::key(element(parent, k), "ship", "undo"))
}

/// `value` of order `id`, read back from the payload store if it was kept there.
async fn whole(w: &World, id: OrderId, value: &Value) -> Value {
    sas_engine::payload::resolve(&w.system.payloads, id, value).await.unwrap()
}

/// The children of `parent` still in flight.
fn in_flight(w: &World, parent: OrderId) -> usize {
    let of = |r: &StateRecord| r.parent.as_ref().is_some_and(|p| p.order_id == parent);
    w.store.records().iter().filter(|r| of(r) && !r.process_state.is_terminal()).count()
}

#[tokio::test]
async fn every_element_runs_as_a_child_a_few_at_a_time_and_the_outputs_come_back_in_order() {
    let mut w = world(3, r#"{"count":0}"#);
    let id = submit(&w, "fan-1", &parcels(10)).await;
    let mut most = 0;
    for _ in 0..400 {
        if w.pump().await == 0 {
            break;
        }
        most = most.max(in_flight(&w, id));
    }
    w.run_for(Duration::from_secs(60)).await;
    let parent = w.state(id);
    assert_eq!(parent.process_state, ProcessState::Processed, "{:?}", parent.cause);
    assert_eq!(most, 3, "at most max_concurrency children run at once, and that many do");
    let step = &parent.steps[SHIP_EACH];
    let output = whole(&w, id, step.output.as_ref().unwrap()).await;
    let list = output.as_array().unwrap();
    assert_eq!(list.len(), 10);
    for k in 0..10 {
        assert!(shipped(&w, id, k));
        let child = w.state(element(id, k));
        assert_eq!(child.process_state, ProcessState::Processed);
        assert_eq!(child.parent.as_ref().unwrap().step.element, Some(k));
        // In order: element k's output is its child's.
        assert_eq!(Some(&list[k as usize]["ship"]), child.steps[0].output.as_ref());
    }
    let fan = step.fan.as_ref().unwrap();
    assert_eq!((fan.items, fan.forward.ok, fan.forward.failed), (Some(10), 10, 0));
    assert!(w.remote.applied(&World::key(id, "charge-payment", "do")));
}

#[tokio::test]
async fn failures_within_the_tolerance_leave_a_gap_in_the_output_and_the_order_goes_on() {
    let mut w = world(2, r#"{"share":0.25}"#);
    w.remote.script("ship", vec![Behaviour::Permanent("no such address".into()); 2]);
    let id = submit(&w, "fan-2", &parcels(8)).await;
    w.run_for(Duration::from_secs(300)).await;
    let parent = w.state(id);
    assert_eq!(parent.process_state, ProcessState::Processed, "{:?}", parent.cause);
    let output = whole(&w, id, parent.steps[SHIP_EACH].output.as_ref().unwrap()).await;
    let gaps = output.as_array().unwrap().iter().filter(|o| o.is_null()).count();
    assert_eq!(gaps, 2);
    assert_eq!((0..8).filter(|&k| shipped(&w, id, k)).count(), 6);
}

#[tokio::test]
async fn past_the_tolerance_no_more_elements_start_and_only_the_processed_ones_are_undone() {
    let mut w = world(2, r#"{"count":1}"#);
    // The first two are shipped, then two refused: the tolerance of one is passed.
    w.remote.script(
        "ship",
        [
            Behaviour::Succeed,
            Behaviour::Succeed,
            Behaviour::Permanent("no such address".into()),
            Behaviour::Permanent("no such address".into()),
        ],
    );
    let id = submit(&w, "fan-3", &parcels(20)).await;
    w.run_for(Duration::from_secs(600)).await;
    let parent = w.state(id);
    assert_eq!(parent.process_state, ProcessState::Error);
    let step = &parent.steps[SHIP_EACH];
    assert_eq!(step.status, StepStatus::Undone, "{:?}", step.detail);
    let fan = step.fan.as_ref().unwrap();
    assert!(fan.forward.next < 20, "elements kept starting past the tolerance: {fan:?}");
    assert_eq!(fan.forward.failed, 2);
    for k in 0..20 {
        // Every element that took effect is undone; none other is, and none after the stop ran.
        assert_eq!(recalled(&w, id, k), shipped(&w, id, k), "element {k}");
        if k >= fan.forward.next {
            assert!(w.store.peek(element(id, k)).is_none(), "element {k} was started");
        }
    }
    assert_eq!((0..20).filter(|&k| shipped(&w, id, k)).count() as u32, fan.forward.ok);
    assert!(fan.forward.ok >= 2);
    assert!(w.remote.applied(&World::key(id, "reserve-inventory", "undo")));
    assert!(!w.remote.applied(&World::key(id, "charge-payment", "do")));
    let cause = format!("{:?}", parent.cause);
    assert!(cause.contains("2 of 20 elements failed; it tolerates 1"), "{cause}");
}

#[tokio::test]
async fn a_list_past_its_tolerance_that_only_reports_lets_the_order_go_on_with_its_parcels_shipped()
{
    let mut w = world_within(2, r#"{"count":0}"#, 3600, "report");
    w.remote.script(
        "ship",
        [Behaviour::Succeed, Behaviour::Succeed, Behaviour::Permanent("no such address".into())],
    );
    let id = submit(&w, "fan-10", &parcels(5)).await;
    w.run_for(Duration::from_secs(600)).await;
    let parent = w.state(id);
    assert_eq!(parent.process_state, ProcessState::Processed, "{:?}", parent.cause);
    let step = &parent.steps[SHIP_EACH];
    assert!(step.reported.is_some(), "{step:?}");
    assert_eq!(step.status, StepStatus::Uncertain, "{:?}", step.detail);
    let shipped: Vec<u32> = (0..5).filter(|&k| shipped(&w, id, k)).collect();
    assert!(shipped.len() >= 2 && (0..5).all(|k| !recalled(&w, id, k)), "{shipped:?}");
    assert!(w.remote.applied(&World::key(id, "charge-payment", "do")));
    // The parent's report, and the refused parcel's own Error.
    let about = |o: OrderId| w.alerts().iter().filter(|a| a["order_id"] == o.to_string()).count();
    assert_eq!(about(id), 1);
    assert_eq!((0..5).map(|k| about(element(id, k))).sum::<usize>(), 1);
}

#[tokio::test]
async fn an_elements_end_lost_on_the_way_is_found_at_the_next_look_not_at_the_timeout() {
    let mut w = world(2, r#"{"count":0}"#);
    let id = submit(&w, "fan-11", &parcels(4)).await;
    // The first word of a child's end is lost: deleted, never handled.
    let mut lost = None;
    for _ in 0..200 {
        for d in w.queues.receive(&Destination::Scheduler, 10) {
            let incoming = Incoming { message_id: &d.message_id, receive_count: d.receive_count };
            if lost.is_none() && d.body.contains("child_ended") {
                lost = Some(d.body.clone());
            } else if !w.deliver(&Destination::Scheduler, incoming, &d.body).await {
                continue;
            }
            w.queues.delete(&Destination::Scheduler, &d.receipt).unwrap();
        }
        if w.pump().await == 0 && lost.is_some() {
            break;
        }
    }
    assert!(lost.is_some(), "no child ended");
    assert!(w.state(id).process_state.is_in_flight());
    // The supervisor's look at the step's children, five minutes on, finds the end.
    w.run_for(Duration::from_secs(600)).await;
    let parent = w.state(id);
    assert_eq!(parent.process_state, ProcessState::Processed, "{:?}", parent.cause);
    assert_eq!(parent.failure_count, 0);
    assert!((0..4).all(|k| shipped(&w, id, k)));
}

#[tokio::test]
async fn a_cancel_stops_the_children_in_flight_and_undoes_the_processed_ones() {
    let mut w = world(4, r#"{"count":0}"#);
    // Shipping is down for now: the first elements retry while the parent is cancelled.
    w.remote.script("ship", vec![Behaviour::Transient; 6]);
    let id = submit(&w, "fan-4", &parcels(30)).await;
    w.run_for(Duration::from_secs(5)).await;
    assert!(in_flight(&w, id) > 0);
    let cancel = Command::new(CommandKind::Cancel, "c-1", "arn:ops", "customer called").unwrap();
    w.operator().command(id, &cancel).await.unwrap().unwrap();
    w.run_for(Duration::from_secs(600)).await;
    let parent = w.state(id);
    assert_eq!(parent.process_state, ProcessState::Cancelled, "{:?}", parent.cause);
    assert_eq!(in_flight(&w, id), 0);
    let fan = parent.steps[SHIP_EACH].fan.clone().unwrap();
    assert!(fan.forward.next < 30, "{fan:?}");
    for k in 0..30 {
        // Every parcel shipped is recalled (a child stopped while its call's outcome was
        // unknown recalls it too: a recall of nothing is harmless); none after the stop left.
        assert!(!shipped(&w, id, k) || recalled(&w, id, k), "element {k}");
        let child = w.store.peek(element(id, k));
        assert_eq!(child.is_some(), k < fan.forward.next, "element {k}");
        assert!(child.is_none_or(|c| c.process_state == ProcessState::Cancelled), "element {k}");
    }
    assert!(w.remote.applied(&World::key(id, "reserve-inventory", "undo")));
}

#[tokio::test]
async fn undoing_a_processed_parent_undoes_every_element() {
    let mut w = world(5, r#"{"count":0}"#);
    let id = submit(&w, "fan-5", &parcels(12)).await;
    w.run_for(Duration::from_secs(120)).await;
    assert_eq!(w.state(id).process_state, ProcessState::Processed);
    let undo = Command::new(CommandKind::Undo, "u-1", "arn:ops", "returned").unwrap();
    w.operator().command(id, &undo).await.unwrap().unwrap();
    w.run_for(Duration::from_secs(600)).await;
    let parent = w.state(id);
    assert_eq!(parent.process_state, ProcessState::Cancelled, "{:?}", parent.cause);
    assert!((0..12).all(|k| recalled(&w, id, k)));
    assert!(w.remote.applied(&World::key(id, "charge-payment", "undo")));
}

#[tokio::test]
async fn a_thousand_elements_keep_the_parent_record_small() {
    let mut w = world(50, r#"{"count":0}"#);
    let id = submit(&w, "fan-6", &parcels(1000)).await;
    let mut largest = 0;
    for _ in 0..20_000 {
        if w.pump().await == 0 {
            break;
        }
        largest = largest.max(serde_json::to_vec(&w.state(id)).unwrap().len());
    }
    w.run_for(Duration::from_secs(600)).await;
    let parent = w.state(id);
    assert_eq!(parent.process_state, ProcessState::Processed, "{:?}", parent.cause);
    assert!((0..1000).all(|k| shipped(&w, id, k)));
    // Counts and the elements in flight, never the list: well under one write unit's worth
    // of growth over the record of a plain three-step order.
    assert!(largest < 4096, "the parent's record grew to {largest} bytes");
    let output = parent.steps[SHIP_EACH].output.clone().unwrap();
    assert!(output.get("$stored").is_some(), "a list of 1,000 outputs is stored: {output}");
    assert_eq!(whole(&w, id, &output).await.as_array().unwrap().len(), 1000);
}

#[tokio::test]
async fn a_list_that_is_not_there_fails_the_step_with_nothing_started() {
    let mut w = world(3, r#"{"count":0}"#);
    let id = submit(&w, "fan-7", r#"{"parcels":{"not":"a list"}}"#).await;
    w.run_for(Duration::from_secs(120)).await;
    let parent = w.state(id);
    assert_eq!(parent.process_state, ProcessState::Error);
    let step = &parent.steps[SHIP_EACH];
    assert_eq!(step.status, StepStatus::Failed);
    assert!(step.detail.as_deref().unwrap().contains("not a list"), "{:?}", step.detail);
    assert!(w.store.peek(element(id, 0)).is_none());
    assert!(w.remote.applied(&World::key(id, "reserve-inventory", "undo")));
}

#[tokio::test]
async fn an_empty_list_completes_the_step_with_an_empty_output() {
    let mut w = world(3, r#"{"count":0}"#);
    let id = submit(&w, "fan-8", &parcels(0)).await;
    w.run_for(Duration::from_secs(120)).await;
    let parent = w.state(id);
    assert_eq!(parent.process_state, ProcessState::Processed, "{:?}", parent.cause);
    assert_eq!(parent.steps[SHIP_EACH].output, Some(json!([])));
}

#[tokio::test]
async fn a_list_that_outlives_its_timeout_is_undone_with_its_children_stopped() {
    let mut w = world_within(2, r#"{"count":0}"#, 120, "undo");
    // Two parcels ship, then shipping is down for longer than the list's timeout, though not
    // for ever: the parcels shipped are recalled once it is back.
    let mut script = vec![Behaviour::Succeed; 2];
    script.extend(vec![Behaviour::Transient; 40]);
    w.remote.script("ship", script);
    let id = submit(&w, "fan-9", &parcels(6)).await;
    w.run_for(Duration::from_secs(7200)).await;
    let parent = w.state(id);
    assert_eq!(parent.process_state, ProcessState::Error, "{:?}", parent.cause);
    assert!(format!("{:?}", parent.cause).contains("StepTimedOut"), "{:?}", parent.cause);
    let step = &parent.steps[SHIP_EACH];
    assert_eq!(step.status, StepStatus::Undone, "{:?}", step.detail);
    assert_eq!(in_flight(&w, id), 0);
    assert!((0..2).all(|k| shipped(&w, id, k) && recalled(&w, id, k)));
    assert!(parent.needs_manual_undo().is_empty(), "{:?}", parent.needs_manual_undo());
}

#[test]
fn a_list_step_is_checked_at_load() {
    let load = |each: &str| {
        let json = format!(r#"{{"name":"a","steps":[{{"name":"s","each":{each}}}]}}"#);
        Workflow::from_json(&json, &agent_names()).map(|_| ()).unwrap_err().to_string()
    };
    let e = load(r#"{"items":"/input/x","workflow":"b","max_concurrency":0,"timeout_seconds":60}"#);
    assert!(e.contains("max_concurrency must be from 1 to 100"), "{e}");
    let e = load(
        r#"{"items":"/input/x","workflow":"b","max_concurrency":2,"tolerance":{"share":1.5},"timeout_seconds":60}"#,
    );
    assert!(e.contains("tolerance.share must be from 0 to 1"), "{e}");
    let e = load(r#"{"items":"x","workflow":"b","max_concurrency":2,"timeout_seconds":60}"#);
    assert!(e.contains("each.items must be a JSON pointer"), "{e}");
    let e =
        load(r#"{"items":"/outputs/t","workflow":"b","max_concurrency":2,"timeout_seconds":60}"#);
    assert!(e.contains("does not depend on"), "{e}");
}
