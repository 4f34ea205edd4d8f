//! Workflows that start workflows: a step starts a child order of another workflow and waits
//! for its end; the child's outputs complete the step, its failure fails it; undoing the
//! parent undoes a processed child by the child's own compensation, and a parent that stops
//! cancels its child in flight.

#![allow(clippy::unwrap_used)] // test crate: helpers outside #[test] fns panic on failed setup

mod world;

use std::time::Duration;

use sas_engine::OrderId;
use sas_engine::catalogue::Catalogue;
use sas_engine::memory::Behaviour;
use sas_engine::services::Command;
use sas_engine::state::{CommandKind, ProcessState, StepStatus};
use sas_engine::workflow::Workflow;
use world::{World, agent_names};

/// A parent that reserves the stock, has a child charge the card, then ships; the child
/// charges and refunds on the payment service.
fn world() -> World {
    let mut w = World::new();
    let child = r#"{"name":"charge","steps":[
        {"name":"charge-payment","agent":"payment","compensation":{"action":"refund-payment"}}]}"#;
    let parent = r#"{"name":"order-fulfilment","version":2,"steps":[
        {"name":"reserve-inventory","agent":"inventory","compensation":{"action":"release-inventory"}},
        {"name":"pay","child":{"workflow":"charge","timeout_seconds":600}},
        {"name":"ship","agent":"shipping"}]}"#;
    let workflows = [child, parent].map(|json| Workflow::from_json(json, &agent_names()).unwrap());
    w.deploy(Catalogue::new(workflows.to_vec()).unwrap());
    w
}

fn child_of(parent: OrderId) -> OrderId {
    OrderId::for_child(parent, "pay", 0)
}

#[tokio::test]
async fn a_processed_child_completes_its_step_with_its_outputs() {
    let mut w = world();
    let id = w.submit("parent-1").await.unwrap().order_id;
    w.run_for(Duration::from_secs(120)).await;
    let parent = w.state(id);
    assert_eq!(parent.process_state, ProcessState::Processed);
    let child = w.state(child_of(id));
    assert_eq!(child.process_state, ProcessState::Processed);
    assert_eq!(child.workflow, "charge");
    assert_eq!(
        child.parent.as_ref().map(|p| (p.order_id, p.step.name.as_str())),
        Some((id, "pay"))
    );
    // The step's output is the child's outputs, by step.
    let pay = parent.steps.iter().find(|s| s.name == "pay").unwrap();
    let charged = &child.steps[0].output;
    assert_eq!(pay.output.as_ref().map(|o| &o["charge-payment"]), charged.as_ref());
    // The child's charge is its own, under its own keys.
    assert!(w.remote.applied(&World::key(child_of(id), "charge-payment", "do")));
    assert!(w.remote.applied(&World::key(id, "ship", "do")));
}

#[tokio::test]
async fn a_child_that_fails_fails_its_step_and_the_parent_undoes_the_rest() {
    let mut w = world();
    w.remote.script("charge-payment", [Behaviour::Permanent("card declined".into())]);
    let id = w.submit("parent-2").await.unwrap().order_id;
    w.run_for(Duration::from_secs(120)).await;
    assert_eq!(w.state(child_of(id)).process_state, ProcessState::Error);
    let parent = w.state(id);
    assert_eq!(parent.process_state, ProcessState::Error);
    let pay = parent.steps.iter().find(|s| s.name == "pay").unwrap();
    assert_eq!(pay.status, StepStatus::Failed);
    assert!(pay.detail.as_deref().unwrap().contains("ended Error"), "{:?}", pay.detail);
    assert!(w.remote.applied(&World::key(id, "reserve-inventory", "undo")));
    assert!(!w.remote.applied(&World::key(id, "ship", "do")));
}

#[tokio::test]
async fn undoing_the_parent_undoes_a_processed_child_by_its_own_compensation() {
    let mut w = world();
    w.remote.script("ship", [Behaviour::Permanent("no carrier".into())]);
    let id = w.submit("parent-3").await.unwrap().order_id;
    w.run_for(Duration::from_secs(300)).await;
    let child = w.state(child_of(id));
    // The child was processed, then undone by its parent: its charge refunded.
    assert_eq!(child.process_state, ProcessState::Cancelled, "{:?}", child.cause);
    assert!(w.remote.applied(&World::key(child_of(id), "charge-payment", "undo")));
    let parent = w.state(id);
    assert_eq!(parent.process_state, ProcessState::Error);
    let statuses: Vec<_> = parent.steps.iter().map(|s| (s.name.as_str(), s.status)).collect();
    assert_eq!(
        statuses,
        [
            ("reserve-inventory", StepStatus::Undone),
            ("pay", StepStatus::Undone),
            ("ship", StepStatus::Failed)
        ]
    );
    assert!(parent.needs_manual_undo().is_empty(), "{:?}", parent.needs_manual_undo());
}

#[tokio::test]
async fn a_parent_cancelled_while_its_child_runs_cancels_the_child() {
    let mut w = world();
    // The payment service fails for now, again and again: the parent is cancelled meanwhile.
    w.remote.script("charge-payment", vec![Behaviour::Transient; 20]);
    let id = w.submit("parent-4").await.unwrap().order_id;
    w.run_for(Duration::from_secs(5)).await;
    assert!(w.state(child_of(id)).process_state.is_in_flight());
    let cancel = Command::new(CommandKind::Cancel, "c-1", "arn:ops", "customer called").unwrap();
    w.operator().command(id, &cancel).await.unwrap().unwrap();
    w.run_for(Duration::from_secs(300)).await;
    let child = w.state(child_of(id));
    assert_eq!(child.process_state, ProcessState::Cancelled, "{:?}", child.cause);
    // Its charge never went through; the parent's stock was released, and nothing shipped.
    assert!(!w.remote.applied(&World::key(child_of(id), "charge-payment", "do")));
    assert!(w.remote.applied(&World::key(id, "reserve-inventory", "undo")));
    assert!(!w.remote.applied(&World::key(id, "ship", "do")));
    let parent = w.state(id);
    assert_eq!(parent.process_state, ProcessState::Cancelled, "{:?}", parent.cause);
}

#[test]
fn a_child_of_a_workflow_the_stack_does_not_run_or_of_itself_is_refused_at_load() {
    let load = |jsons: &[&str]| {
        let ws = jsons.iter().map(|j| Workflow::from_json(j, &agent_names()).unwrap()).collect();
        Catalogue::new(ws).map(|_| ()).unwrap_err().to_string()
    };
    let orphan =
        r#"{"name":"a","steps":[{"name":"s","child":{"workflow":"b","timeout_seconds":60}}]}"#;
    assert!(load(&[orphan]).contains("starts b, which the stack does not run"));
    let a = r#"{"name":"a","steps":[{"name":"s","child":{"workflow":"b","timeout_seconds":60}}]}"#;
    let b = r#"{"name":"b","steps":[{"name":"t","child":{"workflow":"a","timeout_seconds":60}}]}"#;
    assert!(load(&[a, b]).contains("would start itself"));
    let from_later = r#"{"name":"c","steps":[
        {"name":"s","child":{"workflow":"c2","input":"/outputs/t","timeout_seconds":60}},
        {"name":"t","agent":"payment"}]}"#;
    let err = Workflow::from_json(from_later, &agent_names()).unwrap_err().to_string();
    assert!(err.contains("does not depend on"), "{err}");
}

/// A parent whose child step times out while the child's charge is on the wire: the parent
/// undoes the child, whose cancel comes too late for the charge. Returns the parent and the
/// child once everything ended.
async fn undone_while_on_the_wire(
    w: &mut World,
) -> (sas_engine::state::StateRecord, sas_engine::state::StateRecord) {
    let child = r#"{"name":"charge","steps":[
        {"name":"charge-payment","agent":"payment","budget_seconds":300,
         "compensation":{"action":"refund-payment"}}]}"#;
    let parent = r#"{"name":"order-fulfilment","version":2,"steps":[
        {"name":"reserve-inventory","agent":"inventory","compensation":{"action":"release-inventory"}},
        {"name":"pay","child":{"workflow":"charge","timeout_seconds":60}}]}"#;
    let workflows = [child, parent].map(|json| Workflow::from_json(json, &agent_names()).unwrap());
    w.deploy(Catalogue::new(workflows.to_vec()).unwrap());
    let id = w.submit("parent-5").await.unwrap().order_id;
    let payment = sas_engine::ports::Destination::Agent(sas_engine::AgentName::new("payment"));
    // Everything runs but the payment agent: the charge waits on its queue.
    let others =
        |w: &World| w.destinations().into_iter().filter(|d| *d != payment).collect::<Vec<_>>();
    for _ in 0..20 {
        for dest in others(w) {
            while w.queues.visible_len(&dest) > 0 {
                w.step(&dest).await;
            }
        }
    }
    // The payment agent takes the charge and calls its service, which takes its time.
    let charge = w.queues.receive(&payment, 1).pop().expect("the charge is on its way");
    w.queues.change_visibility(&payment, &charge.receipt, Duration::from_secs(3600)).unwrap();
    // The child step's timeout passes: the parent undoes its child, in flight.
    w.clock.advance(Duration::from_secs(60));
    for _ in 0..20 {
        if w.state(id).phase == sas_engine::state::Phase::Compensating {
            break;
        }
        w.clock.advance(Duration::from_secs(5));
        w.sweep().await;
        for dest in others(w) {
            while w.queues.visible_len(&dest) > 0 {
                w.step(&dest).await;
            }
        }
    }
    assert_eq!(w.state(id).phase, sas_engine::state::Phase::Compensating);
    assert!(w.state(child_of(id)).process_state.is_in_flight());
    // Then the charge lands, and everything settles.
    let incoming = sas_engine::ports::Incoming {
        message_id: &charge.message_id,
        receive_count: charge.receive_count,
    };
    assert!(w.deliver(&payment, incoming, &charge.body).await);
    w.queues.delete(&payment, &charge.receipt).unwrap();
    w.run_for(Duration::from_secs(300)).await;
    (w.state(id), w.state(child_of(id)))
}

#[tokio::test]
async fn a_child_its_parent_undoes_while_its_call_is_on_the_wire_is_undone_once_the_call_lands() {
    let mut w = World::new();
    let (parent, child) = undone_while_on_the_wire(&mut w).await;
    assert_eq!(child.process_state, ProcessState::Cancelled, "{:?}", child.cause);
    assert!(w.remote.applied(&World::key(child.order_id, "charge-payment", "do")));
    assert!(w.remote.applied(&World::key(child.order_id, "charge-payment", "undo")));
    let pay = parent.steps.iter().find(|s| s.name == "pay").unwrap();
    assert_eq!(pay.status, StepStatus::Undone, "{:?}", pay.detail);
    assert!(parent.needs_manual_undo().is_empty(), "{:?}", parent.needs_manual_undo());
}

#[tokio::test]
async fn with_the_guard_broken_the_child_is_kept_processed_and_its_charge_in_place() {
    // The broken guard `ChildKeptWhenUndoComesLate` (see `sas_engine::mutants`): the test
    // above fails with it, which this shows.
    let _broken =
        sas_engine::mutants::switch_on(&[sas_engine::mutants::Mutant::ChildKeptWhenUndoComesLate]);
    let mut w = World::new();
    let (_, child) = undone_while_on_the_wire(&mut w).await;
    assert_eq!(child.process_state, ProcessState::Processed);
    assert!(!w.remote.applied(&World::key(child.order_id, "charge-payment", "undo")));
}
