//! Workflows change while orders run: a deploy brings a new version, new orders take it, and
//! every order already accepted finishes, is compensated or redriven on the version it
//! started on. A version taken away stops only the orders that still need it, and says so.

#![allow(clippy::unwrap_used)] // test crate: helpers outside #[test] fns panic on failed setup

mod world;

use std::time::Duration;

use sas_engine::Error;
use sas_engine::catalogue::Catalogue;
use sas_engine::config::EngineConfig;
use sas_engine::memory::Behaviour;
use sas_engine::ports::Destination;
use sas_engine::services::Command;
use sas_engine::state::{CommandKind, ProcessState};
use sas_engine::workflow::Workflow;
use world::{World, agent_names};

/// The reference workflow as version `version`, with `extra` steps (on the shipping agent)
/// after its own.
fn version(version: u32, extra: &[&str]) -> Workflow {
    let mut spec: serde_json::Value =
        serde_json::from_str(sas_workflows::order_fulfilment()).unwrap();
    spec["version"] = version.into();
    for step in extra {
        let step = serde_json::json!({"name": step, "agent": "shipping", "budget_seconds": 30});
        spec["steps"].as_array_mut().unwrap().push(step);
    }
    Workflow::from_json(&spec.to_string(), &agent_names()).unwrap()
}

fn steps(w: &World, id: sas_engine::OrderId) -> Vec<String> {
    w.state(id).steps.iter().map(|s| s.name.clone()).collect()
}

#[tokio::test]
async fn orders_in_flight_finish_on_their_version_and_new_ones_take_the_new_one() {
    let mut w = World::new();
    w.deploy(Catalogue::new(vec![version(1, &[])]).unwrap());
    let started = w.submit("before-1").await.unwrap().order_id;
    let waiting = w.submit("before-2").await.unwrap().order_id;
    // The first is claimed and its first step requested; the second's start waits unread.
    w.step(&Destination::Scheduler).await;
    assert_eq!(w.state(started).process_state, ProcessState::Processing);

    w.deploy(Catalogue::new(vec![version(1, &[]), version(2, &["confirm"])]).unwrap());
    let after = w.submit("after-1").await.unwrap().order_id;
    w.run_for(Duration::from_secs(60)).await;

    for id in [started, waiting] {
        let record = w.state(id);
        assert_eq!((record.process_state, record.workflow_version), (ProcessState::Processed, 1));
        assert_eq!(steps(&w, id), ["reserve-inventory", "charge-payment", "ship"]);
        assert!(!w.remote.applied(&World::key(id, "confirm", "do")), "v1 has no confirm step");
    }
    let record = w.state(after);
    assert_eq!((record.process_state, record.workflow_version), (ProcessState::Processed, 2));
    assert_eq!(steps(&w, after), ["reserve-inventory", "charge-payment", "ship", "confirm"]);
    assert!(w.remote.applied(&World::key(after, "confirm", "do")));
    // Status events name the version each order runs.
    let versions: Vec<u64> = w
        .bus
        .of_type(sas_engine::events::STATUS_DETAIL_TYPE)
        .iter()
        .filter(|e| e["order_id"] == after.to_string())
        .map(|e| e["workflow_version"].as_u64().unwrap())
        .collect();
    assert!(!versions.is_empty() && versions.iter().all(|v| *v == 2), "{versions:?}");
}

#[tokio::test]
async fn a_failed_order_is_redriven_on_its_version_while_that_version_is_kept() {
    let max_hold = Duration::from_secs(600);
    let mut w = World::with(EngineConfig { max_hold, ..EngineConfig::default() });
    w.deploy(Catalogue::new(vec![version(1, &[])]).unwrap());
    // The inventory service stays down past the policy (held longer than the order may wait
    // for it): nothing to undo, the order fails.
    w.remote.script("reserve-inventory", std::iter::repeat_n(Behaviour::Transient, 10_000));
    let id = w.submit("failed").await.unwrap().order_id;
    w.run_for(Duration::from_secs(3600)).await;
    assert_eq!(w.state(id).process_state, ProcessState::Error);

    // Version 2 is deployed beside it, and the service is back: the redrive runs version 1.
    w.deploy(Catalogue::new(vec![version(1, &[]), version(2, &["confirm"])]).unwrap());
    w.remote.unscript("reserve-inventory");
    let redrive = Command::new(CommandKind::Redrive, "r-1", "arn:ops", "stock back").unwrap();
    w.operator().command(id, &redrive).await.unwrap().unwrap();
    w.run_for(Duration::from_secs(120)).await;
    let record = w.state(id);
    assert_eq!((record.process_state, record.workflow_version), (ProcessState::Processed, 1));
    assert_eq!(steps(&w, id), ["reserve-inventory", "charge-payment", "ship"]);
    assert!(!w.remote.applied(&World::key(id, "confirm", "do")));
}

#[tokio::test]
async fn an_order_whose_version_is_gone_is_refused_naming_it_and_nothing_else_stops() {
    let mut w = World::new();
    w.deploy(Catalogue::new(vec![version(1, &[])]).unwrap());
    let old = w.submit("old").await.unwrap().order_id;
    // Version 1 is taken away while its order waits: only version 2 is deployed.
    w.deploy(Catalogue::new(vec![version(2, &["confirm"])]).unwrap());
    let new = w.submit("new").await.unwrap().order_id;
    w.settle().await;
    assert_eq!(w.state(new).process_state, ProcessState::Processed);
    // Its start message cannot be handled: after its receives it is a dead letter, where the
    // dead-letter alarm and `sas dlq peek` show it.
    for _ in 0..6 {
        w.clock.advance(Duration::from_secs(31));
        w.pump().await;
    }
    assert_eq!(w.queues.dead_letters(&Destination::Scheduler).len(), 1);
    let record = w.state(old);
    assert_eq!(record.process_state, ProcessState::Pending, "nothing drove it");
    // The supervisor reports it for a look rather than failing its sweep.
    let report = w.sweep().await;
    assert_eq!((report.illegal, report.errors), (1, 0), "{report:?}");
    // An operator's command says which version is missing.
    let cancel = Command::new(CommandKind::Cancel, "c-1", "arn:ops", "stuck").unwrap();
    let err = w.operator().command(old, &cancel).await.unwrap_err();
    assert!(matches!(&err, Error::WorkflowGone { version: 1, .. }), "{err}");
    assert!(err.to_string().contains("order-fulfilment version 1"), "{err}");
    // Deployed again, it goes on where it stopped.
    w.deploy(Catalogue::new(vec![version(1, &[]), version(2, &["confirm"])]).unwrap());
    w.run_for(Duration::from_secs(120)).await;
    assert_eq!(w.state(old).process_state, ProcessState::Processed);
}
