//! A step over a list: one child order per element, a few at a time, within a tolerance of
//! failures; its output is the children's outputs in order, and its undo undoes every child
//! that was processed, and only those. A child workflow of one call of an agent runs inline,
//! each element one call under the keys its child would have had: every test that holds for
//! both runs in both ways.

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

/// How the elements run: each a child order, or inline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Orders,
    Inline,
}

use Mode::{Inline, Orders};

const BOTH: [Mode; 2] = [Orders, Inline];

/// A parent that reserves the stock, ships each parcel of its input (at most `concurrency` at
/// once, `tolerance` of them may fail), then charges the card.
fn world(mode: Mode, concurrency: u32, tolerance: &str) -> World {
    world_within(mode, concurrency, tolerance, 3600, "undo")
}

/// [`world`], the list given `timeout` seconds to end, and its failure doing `on_failure`.
fn world_within(
    mode: Mode,
    concurrency: u32,
    tolerance: &str,
    timeout: u64,
    on_failure: &str,
) -> World {
    let as_orders = mode == Orders;
    let mut w = World::new();
    let child = r#"{"name":"ship-parcel","input_schema":{"type":"object","required":["parcel"]},
        "steps":[{"name":"ship","agent":"shipping","compensation":{"action":"recall"}}]}"#;
    let parent = format!(
        r#"{{"name":"ship-all","steps":[
        {{"name":"reserve-inventory","agent":"inventory","compensation":{{"action":"release-inventory"}}}},
        {{"name":"ship-each","each":{{"items":"/input/parcels","workflow":"ship-parcel",
            "max_concurrency":{concurrency},"tolerance":{tolerance},"timeout_seconds":{timeout},
            "as_orders":{as_orders}}},
            "on_failure":"{on_failure}"}},
        {{"name":"charge-payment","agent":"payment","compensation":{{"action":"refund-payment"}}}}]}}"#
    );
    let workflows =
        [child, parent.as_str()].map(|json| Workflow::from_json(json, &agent_names()).unwrap());
    w.deploy(Catalogue::new(workflows.to_vec()).unwrap());
    w
}

/// How `parent`'s list runs, as its record says.
fn runs_inline(w: &World, parent: OrderId) -> bool {
    w.state(parent).steps[SHIP_EACH].fan.as_ref().is_some_and(|f| f.inline.is_some())
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

/// The elements of `parent` in flight: its children not ended, or its calls out.
fn in_flight(w: &World, parent: OrderId) -> usize {
    if runs_inline(w, parent) {
        let fan = w.state(parent).steps[SHIP_EACH].fan.clone().unwrap_or_default();
        return fan.forward.running.len() + fan.cleaning.len();
    }
    let of = |r: &StateRecord| r.parent.as_ref().is_some_and(|p| p.order_id == parent);
    w.store.records().iter().filter(|r| of(r) && !r.process_state.is_terminal()).count()
}

/// No element of `parent` has a child order: they ran inline.
fn no_child(w: &World, parent: OrderId, items: u32) -> bool {
    (0..items).all(|k| w.store.peek(element(parent, k)).is_none())
}

#[tokio::test]
async fn every_element_runs_a_few_at_a_time_and_the_outputs_come_back_in_order() {
    for mode in BOTH {
        every_element_in_order(mode).await;
    }
}

async fn every_element_in_order(mode: Mode) {
    let mut w = world(mode, 3, r#"{"count":0}"#);
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
        // In order: element k's output is its step's, by name, as a child's outputs are.
        let ledger = w.remote.ledger();
        let call = ledger.iter().find(|e| e.key == World::key(element(id, k), "ship", "do"));
        assert_eq!(list[k as usize]["ship"], call.unwrap().output, "{mode:?} element {k}");
        if mode == Orders {
            let child = w.state(element(id, k));
            assert_eq!(child.process_state, ProcessState::Processed);
            assert_eq!(child.parent.as_ref().unwrap().step.element, Some(k));
            assert_eq!(Some(&list[k as usize]["ship"]), child.steps[0].output.as_ref());
        }
    }
    let fan = step.fan.as_ref().unwrap();
    assert_eq!((fan.items, fan.forward.ok, fan.forward.failed), (Some(10), 10, 0));
    assert_eq!(fan.inline.is_some(), mode == Inline);
    if mode == Inline {
        assert!(no_child(&w, id, 10));
        // The outputs' pages went with the order's end.
        let pass = sas_engine::ports::Page::pass_of(id, "ship-each", 0);
        assert!(w.store.pages_of(&pass).is_empty(), "pages left: {pass}");
    }
    assert!(w.remote.applied(&World::key(id, "charge-payment", "do")));
}

#[tokio::test]
async fn failures_within_the_tolerance_leave_a_gap_in_the_output_and_the_order_goes_on() {
    for mode in BOTH {
        failures_within_the_tolerance_leave_a_gap_in_the_output_and_the_order_goes_on_in(mode)
            .await;
    }
}

async fn failures_within_the_tolerance_leave_a_gap_in_the_output_and_the_order_goes_on_in(
    mode: Mode,
) {
    let mut w = world(mode, 2, r#"{"share":0.25}"#);
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
    for mode in BOTH {
        past_the_tolerance_no_more_elements_start_and_only_the_processed_ones_are_undone_in(mode)
            .await;
    }
}

async fn past_the_tolerance_no_more_elements_start_and_only_the_processed_ones_are_undone_in(
    mode: Mode,
) {
    let mut w = world(mode, 2, r#"{"count":1}"#);
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
    for mode in BOTH {
        a_list_past_its_tolerance_that_only_reports_lets_the_order_go_on_with_its_parcels_shipped_in(mode).await;
    }
}

async fn a_list_past_its_tolerance_that_only_reports_lets_the_order_go_on_with_its_parcels_shipped_in(
    mode: Mode,
) {
    let mut w = world_within(mode, 2, r#"{"count":0}"#, 3600, "report");
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
    let own = (0..5).map(|k| about(element(id, k))).sum::<usize>();
    assert_eq!(own, usize::from(mode == Orders), "{mode:?}");
}

#[tokio::test]
async fn an_elements_end_lost_on_the_way_is_found_at_the_next_look_not_at_the_timeout() {
    let mut w = world(Orders, 2, r#"{"count":0}"#);
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
    for mode in BOTH {
        a_cancel_stops_the_children_in_flight_and_undoes_the_processed_ones_in(mode).await;
    }
}

async fn a_cancel_stops_the_children_in_flight_and_undoes_the_processed_ones_in(mode: Mode) {
    let mut w = world(mode, 4, r#"{"count":0}"#);
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
        assert_eq!(child.is_some(), mode == Orders && k < fan.forward.next, "element {k}");
        assert!(child.is_none_or(|c| c.process_state == ProcessState::Cancelled), "element {k}");
    }
    assert!(w.remote.applied(&World::key(id, "reserve-inventory", "undo")));
}

#[tokio::test]
async fn undoing_a_processed_parent_undoes_every_element() {
    for mode in BOTH {
        undoing_a_processed_parent_undoes_every_element_in(mode).await;
    }
}

async fn undoing_a_processed_parent_undoes_every_element_in(mode: Mode) {
    let mut w = world(mode, 5, r#"{"count":0}"#);
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
    for mode in BOTH {
        a_thousand_elements_keep_the_parent_record_small_in(mode).await;
    }
}

async fn a_thousand_elements_keep_the_parent_record_small_in(mode: Mode) {
    let mut w = world(mode, 50, r#"{"count":0}"#);
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
    for mode in BOTH {
        a_list_that_is_not_there_fails_the_step_with_nothing_started_in(mode).await;
    }
}

async fn a_list_that_is_not_there_fails_the_step_with_nothing_started_in(mode: Mode) {
    let mut w = world(mode, 3, r#"{"count":0}"#);
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
    for mode in BOTH {
        an_empty_list_completes_the_step_with_an_empty_output_in(mode).await;
    }
}

async fn an_empty_list_completes_the_step_with_an_empty_output_in(mode: Mode) {
    let mut w = world(mode, 3, r#"{"count":0}"#);
    let id = submit(&w, "fan-8", &parcels(0)).await;
    w.run_for(Duration::from_secs(120)).await;
    let parent = w.state(id);
    assert_eq!(parent.process_state, ProcessState::Processed, "{:?}", parent.cause);
    assert_eq!(parent.steps[SHIP_EACH].output, Some(json!([])));
}

#[tokio::test]
async fn a_list_that_outlives_its_timeout_is_undone_with_its_children_stopped() {
    for mode in BOTH {
        a_list_that_outlives_its_timeout_is_undone_with_its_children_stopped_in(mode).await;
    }
}

async fn a_list_that_outlives_its_timeout_is_undone_with_its_children_stopped_in(mode: Mode) {
    let mut w = world_within(mode, 2, r#"{"count":0}"#, 120, "undo");
    // Two parcels ship, then shipping is down for longer than the list's timeout, though not
    // for ever: the parcels shipped are recalled once it is back.
    let mut script = vec![Behaviour::Succeed; 2];
    script.extend(vec![Behaviour::Transient; 400]);
    w.remote.script("ship", script);
    let id = submit(&w, "fan-9", &parcels(6)).await;
    w.run_for(Duration::from_secs(7200)).await;
    let parent = w.state(id);
    assert_eq!(
        parent.process_state,
        ProcessState::Error,
        "{mode:?} {:?} {:#?} {:?}",
        parent.cause,
        parent.timeline,
        w.remote.faults()
    );
    assert!(format!("{:?}", parent.cause).contains("StepTimedOut"), "{:?}", parent.cause);
    let step = &parent.steps[SHIP_EACH];
    assert_eq!(step.status, StepStatus::Undone, "{:?}", step.detail);
    assert_eq!(in_flight(&w, id), 0);
    assert!((0..2).all(|k| shipped(&w, id, k) && recalled(&w, id, k)));
    assert!(parent.needs_manual_undo().is_empty(), "{:?}", parent.needs_manual_undo());
}

#[tokio::test]
async fn inline_the_elements_started_together_go_in_one_request_and_one_write_takes_their_answers()
{
    let mut w = world(Inline, 10, r#"{"count":0}"#);
    let id = submit(&w, "fan-20", &parcels(10)).await;
    w.run_for(Duration::from_secs(120)).await;
    let parent = w.state(id);
    assert_eq!(parent.process_state, ProcessState::Processed, "{:?}", parent.cause);
    let replies = w.handled.iter().filter(|(kind, _)| kind == "elements_reply").count();
    assert_eq!(replies, 1, "ten elements started together are answered in one reply");
    assert_eq!(w.agent_outcomes.len() - 2, 10, "one call each (and the two plain steps)");
    // Written at its start, claim, each plain step's end, the list's read, the elements'
    // answers, the collected list, and its end: the ten elements took one write.
    assert!(parent.revision <= 8, "the parent was written {} times", parent.revision);
    assert!(no_child(&w, id, 10));
}

#[tokio::test]
async fn inline_an_answer_lost_on_the_way_costs_a_lease_and_the_calls_go_again_under_their_keys() {
    let mut w = world(Inline, 2, r#"{"count":0}"#);
    let id = submit(&w, "fan-21", &parcels(4)).await;
    let mut lost = false;
    for _ in 0..200 {
        for d in w.queues.receive(&Destination::Replies, 10) {
            let incoming = Incoming { message_id: &d.message_id, receive_count: d.receive_count };
            if !lost && d.body.contains("elements_reply") {
                lost = true;
            } else if !w.deliver(&Destination::Replies, incoming, &d.body).await {
                continue;
            }
            w.queues.delete(&Destination::Replies, &d.receipt).unwrap();
        }
        if w.pump().await == 0 && lost {
            break;
        }
    }
    assert!(lost, "no elements were answered");
    w.run_for(Duration::from_secs(600)).await;
    let parent = w.state(id);
    assert_eq!(parent.process_state, ProcessState::Processed, "{:?}", parent.cause);
    assert!((0..4).all(|k| shipped(&w, id, k)));
    // Called again under the same keys: each parcel shipped once.
    assert_eq!(w.remote.max_applications(), 1);
    assert!(parent.timeline.iter().any(|e| e.what == sas_engine::state::Happening::LeaseExpired));
    assert!(parent.steps[SHIP_EACH].fan.as_ref().unwrap().strikes.is_empty());
}

#[tokio::test]
async fn inline_an_output_too_large_to_keep_fails_its_element_and_undoes_it_at_once() {
    let mut w = world(Inline, 1, r#"{"count":1}"#);
    w.remote.script("ship", [Behaviour::Succeed, Behaviour::Oversize]);
    let id = submit(&w, "fan-22", &parcels(3)).await;
    w.run_for(Duration::from_secs(300)).await;
    let parent = w.state(id);
    assert_eq!(parent.process_state, ProcessState::Processed, "{:?}", parent.cause);
    let step = &parent.steps[SHIP_EACH];
    let fan = step.fan.as_ref().unwrap();
    assert_eq!((fan.forward.ok, fan.forward.failed), (2, 1), "{fan:?}");
    // Its effect took place and could not be kept: undone as its child would have undone it.
    assert!(shipped(&w, id, 1) && recalled(&w, id, 1));
    assert!(fan.dirty.is_empty() && fan.settled.contains(1), "{fan:?}");
    let output = whole(&w, id, step.output.as_ref().unwrap()).await;
    assert!(output[1].is_null() && !output[0].is_null() && !output[2].is_null(), "{output}");
    assert!(!recalled(&w, id, 0) && !recalled(&w, id, 2));
}

#[tokio::test]
async fn inline_an_element_whose_input_its_child_refuses_fails_without_a_call() {
    let mut w = world(Inline, 3, r#"{"count":1}"#);
    let body = json!({"parcels": [{"parcel": "p-0"}, {"weight": 2}, {"parcel": "p-2"}]});
    let id = submit(&w, "fan-23", &body.to_string()).await;
    w.run_for(Duration::from_secs(300)).await;
    let parent = w.state(id);
    assert_eq!(parent.process_state, ProcessState::Processed, "{:?}", parent.cause);
    assert_eq!(w.remote.calls(&World::key(element(id, 1), "ship", "do")), 0);
    let output = whole(&w, id, parent.steps[SHIP_EACH].output.as_ref().unwrap()).await;
    assert!(output[1].is_null() && shipped(&w, id, 0) && shipped(&w, id, 2), "{output}");
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
