//! Bulk commands on the in-memory system: asked for with the count shown, refused if the
//! listing changed, applied a slice at a time with the job's one command id, reported, and
//! never applied twice whoever drives them.

#![allow(clippy::unwrap_used)] // test crate: helpers outside #[test] fns panic on failed setup

mod world;

use std::time::Duration;

use sas_engine::bulk::{BulkFilter, BulkList};
use sas_engine::memory::Behaviour;
use sas_engine::ports::{BulkBook, Clock, Saved};
use sas_engine::services::Command;
use sas_engine::services::bulk::{Ask, Slice, Started, advance, start};
use sas_engine::state::{CommandKind, ProcessState};
use world::World;

const SHARDS: u16 = 4;

fn slice(orders: usize, per_second: usize) -> Slice {
    Slice { orders, per_second }
}

fn failed() -> BulkFilter {
    BulkFilter { list: BulkList::Failed, workflow: None, step: None, cause: None, older_than_s: 0 }
}

fn ask(id: &str, kind: CommandKind, filter: BulkFilter, expected: u64) -> Ask {
    let command = Command::new(kind, id, "arn:ops", "the bank is back").unwrap();
    Ask { command, filter, expected }
}

/// `n` orders whose payment is refused, each ended in Error.
async fn failing(w: &mut World, prefix: &str, n: usize) -> Vec<sas_engine::OrderId> {
    w.remote.script("charge-payment", vec![Behaviour::Permanent("declined".into()); n]);
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(w.submit(&format!("{prefix}-{i}")).await.unwrap().order_id);
    }
    w.run_for(Duration::from_secs(120)).await;
    for id in &ids {
        assert_eq!(w.state(*id).process_state, ProcessState::Error);
    }
    ids
}

#[tokio::test]
async fn a_bulk_redrive_is_counted_first_applied_a_slice_at_a_time_and_reported() {
    let mut w = World::new();
    let ids = failing(&mut w, "b", 5).await;
    let now = w.clock.now();

    // Shown 4 while 5 fail: nothing is made, and the count of now is given back.
    let stale = ask("bulk-stale", CommandKind::Redrive, failed(), 4);
    let changed = start(&*w.store, &*w.store, stale, now, SHARDS).await.unwrap();
    assert!(matches!(changed, Started::Changed { count } if count.orders == 5), "{changed:?}");
    assert!(w.store.job("bulk-stale").await.unwrap().is_none());

    let asked = ask("bulk-1", CommandKind::Redrive, failed(), 5);
    let Started::New(job) = start(&*w.store, &*w.store, asked.clone(), now, SHARDS).await.unwrap()
    else {
        panic!("a job is made")
    };
    assert_eq!((job.expected, job.round, job.finished), (5, 0, false));
    // Asked again (a retry), it is the same job; the same id for something else is refused.
    let again = start(&*w.store, &*w.store, asked, now, SHARDS).await.unwrap();
    assert!(matches!(again, Started::Existing(ref j) if j.id == "bulk-1"), "{again:?}");
    let paused = BulkFilter { list: BulkList::Paused, ..failed() };
    let other = ask("bulk-1", CommandKind::Redrive, paused, 0);
    assert!(start(&*w.store, &*w.store, other, now, SHARDS).await.is_err());

    // An order that fails after the ask is not the job's.
    w.clock.advance(Duration::from_secs(1));
    let later = failing(&mut w, "late", 1).await[0];
    let now = w.clock.now();

    let operator = w.operator();
    let job = advance(&*w.store, &*w.store, &operator, "bulk-1", slice(2, 100), now, SHARDS).await;
    let job = job.unwrap().unwrap();
    assert_eq!((job.tally.applied, job.tally.newer, job.round, job.finished), (2, 1, 1, false));
    let job =
        advance(&*w.store, &*w.store, &operator, "bulk-1", slice(100, 100), now, SHARDS).await;
    let job = job.unwrap().unwrap();
    assert_eq!((job.tally.applied, job.tally.reached(), job.finished), (5, 5, true), "{job:?}");
    w.run_for(Duration::from_secs(120)).await;
    for id in &ids {
        let record = w.state(*id);
        assert_eq!(record.process_state, ProcessState::Processed, "{id}");
        assert_eq!(record.commands.iter().filter(|c| c.id == "bulk-1").count(), 1);
    }
    assert_eq!(w.state(later).process_state, ProcessState::Error, "the newer order is left");

    // Finished, a job is driven no further.
    let done =
        advance(&*w.store, &*w.store, &operator, "bulk-1", slice(100, 100), now, SHARDS).await;
    assert_eq!(done.unwrap().unwrap().round, 2);
}

#[tokio::test]
async fn two_drivers_of_one_job_apply_each_order_once_and_one_slice_is_saved() {
    let mut w = World::new();
    let ids = failing(&mut w, "d", 3).await;
    let now = w.clock.now();
    let asked = ask("bulk-2", CommandKind::Redrive, failed(), 3);
    start(&*w.store, &*w.store, asked, now, SHARDS).await.unwrap();
    let stale = w.store.job("bulk-2").await.unwrap().unwrap();
    let operator = w.operator();
    let job =
        advance(&*w.store, &*w.store, &operator, "bulk-2", slice(100, 100), now, SHARDS).await;
    let job = job.unwrap().unwrap();
    assert_eq!((job.tally.applied, job.finished), (3, true));
    // A driver that read the job before saves nothing over it.
    assert_eq!(w.store.save_job(&stale, stale.round).await.unwrap(), Saved::Conflict);
    // The same orders commanded again under the job's id are applied before, not again.
    let command = Command::new(CommandKind::Redrive, "bulk-2", "arn:ops", "again").unwrap();
    for id in &ids {
        let again = operator.command(*id, &command).await.unwrap().unwrap();
        assert_eq!(again.applied, sas_engine::services::Applied::Before);
    }
}

#[tokio::test]
async fn orders_a_command_does_not_fit_are_refused_one_by_one_and_named() {
    let mut w = World::new();
    failing(&mut w, "r", 2).await;
    let now = w.clock.now();
    // A pause does not fit an order in Error: each refuses, and the job says why.
    let asked = ask("bulk-3", CommandKind::Pause, failed(), 2);
    start(&*w.store, &*w.store, asked, now, SHARDS).await.unwrap();
    let operator = w.operator();
    let job =
        advance(&*w.store, &*w.store, &operator, "bulk-3", slice(100, 100), now, SHARDS).await;
    let job = job.unwrap().unwrap();
    assert_eq!((job.tally.refused, job.tally.applied, job.refusals.len()), (2, 0, 2), "{job:?}");
    assert!(job.refusals.iter().all(|r| r.code == "finished"), "{:?}", job.refusals);
    assert!(job.finished);
}

#[tokio::test]
async fn the_supervisor_drives_the_jobs_not_finished_at_the_pace_held_orders_resume() {
    let mut w = World::new();
    let ids = failing(&mut w, "s", 4).await;
    let now = w.clock.now();
    let asked = ask("bulk-4", CommandKind::Redrive, failed(), 4);
    start(&*w.store, &*w.store, asked, now, SHARDS).await.unwrap();
    let driven = w.supervisor.drive_bulk(&*w.store).await.unwrap();
    assert_eq!(driven.len(), 1);
    assert_eq!((driven[0].tally.applied, driven[0].finished), (4, true), "{:?}", driven[0]);
    w.run_for(Duration::from_secs(120)).await;
    assert!(ids.iter().all(|id| w.state(*id).process_state == ProcessState::Processed));
    // A finished job is left as it is.
    assert!(w.supervisor.drive_bulk(&*w.store).await.unwrap().is_empty());
    assert_eq!(w.store.job("bulk-4").await.unwrap().unwrap().round, 1);
}

#[tokio::test]
async fn the_orders_of_a_slice_are_spread_over_seconds_at_the_pace_asked_for() {
    let mut w = World::new();
    let ids = failing(&mut w, "p", 5).await;
    let now = w.clock.now();
    let asked = ask("bulk-5", CommandKind::Redrive, failed(), 5);
    start(&*w.store, &*w.store, asked, now, SHARDS).await.unwrap();
    let operator = w.operator();
    let job = advance(&*w.store, &*w.store, &operator, "bulk-5", slice(100, 2), now, SHARDS).await;
    assert_eq!(job.unwrap().unwrap().tally.applied, 5);
    // Two orders a second: each order's steps are due a second later than the two before.
    let mut due: Vec<u64> = ids
        .iter()
        .map(|id| w.state(*id).earliest_lease().unwrap().as_millis().abs_diff(now.as_millis()))
        .collect();
    due.sort_unstable();
    let first = due[0];
    let spread: Vec<u64> = due.iter().map(|d| d - first).collect();
    assert_eq!(spread, [0, 0, 1000, 1000, 2000]);
    w.run_for(Duration::from_secs(120)).await;
    assert!(ids.iter().all(|id| w.state(*id).process_state == ProcessState::Processed));
}

#[tokio::test]
async fn a_bulk_cancel_in_flight_reaches_the_orders_that_wait_for_their_time() {
    let mut w = World::new();
    let later = r#"{"name":"later","steps":[{"name":"charge-payment","agent":"payment",
        "compensation":{"action":"refund-payment"}},
        {"name":"hold","wait":{"seconds":3600}},{"name":"ship","agent":"shipping"}]}"#;
    let workflow = sas_engine::workflow::Workflow::from_json(later, &world::agent_names());
    w.deploy(sas_engine::catalogue::Catalogue::single(workflow.unwrap()));
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(w.submit(&format!("w-{i}")).await.unwrap().order_id);
    }
    w.settle().await;
    // Each waits out its hour: watched from its end, a time to come, yet taken up before the ask.
    for id in &ids {
        assert!(w.state(*id).watched_since() > w.clock.now(), "{:?}", w.state(*id));
    }
    w.clock.advance(Duration::from_secs(60));
    let now = w.clock.now();
    let in_flight = BulkFilter {
        list: BulkList::InFlight,
        workflow: None,
        step: None,
        cause: None,
        older_than_s: 0,
    };
    let asked = ask("bulk-6", CommandKind::Cancel, in_flight, 3);
    let started = start(&*w.store, &*w.store, asked, now, SHARDS).await.unwrap();
    assert!(matches!(started, Started::New(_)), "{started:?}");
    let operator = w.operator();
    let job = advance(&*w.store, &*w.store, &operator, "bulk-6", slice(100, 100), now, SHARDS);
    let job = job.await.unwrap().unwrap();
    assert_eq!((job.tally.applied, job.tally.newer, job.finished), (3, 0, true), "{job:?}");
    w.run_for(Duration::from_secs(120)).await;
    for id in &ids {
        assert_eq!(w.state(*id).process_state, ProcessState::Cancelled, "{:?}", w.state(*id));
    }
}
