//! The three-step order workflow through the real services and in-memory ports: run to the
//! end, failed at each step with the right undo, and recovered from lost messages and crashes.

mod world;

use std::time::Duration;

use sas_engine::config::{EngineConfig, HoldPolicy};
use sas_engine::events::SERVICE_DETAIL_TYPE;
use sas_engine::memory::Behaviour;
use sas_engine::ports::{Clock, Destination, Incoming};
use sas_engine::services::Handled;
use sas_engine::state::{Cause, Phase, ProcessState, StepStatus};
use world::World;

fn statuses(w: &World, id: sas_engine::OrderId) -> Vec<StepStatus> {
    w.state(id).steps.iter().map(|s| s.status).collect()
}

#[tokio::test]
async fn an_order_runs_through_all_three_steps() {
    let mut w = World::new();
    let id = w.submit("happy-1").await.unwrap().order_id;
    w.settle().await;

    let r = w.state(id);
    assert_eq!(r.process_state, ProcessState::Processed);
    assert_eq!(r.complete_by, None);
    assert_eq!(r.failure_count, 0);
    for step in ["reserve-inventory", "charge-payment", "ship"] {
        assert_eq!(w.remote.applications(&World::key(id, step, "do")), 1, "{step}");
    }
    assert_eq!(w.remote.ledger().len(), 3);
    assert_eq!(
        w.statuses(id),
        ["received", "processing", "step_done", "step_done", "step_done", "processed"]
    );
    assert!(w.alerts().is_empty());
    // The record's put, with the order in it, then one write per transition: claim, two
    // step-and-lease writes, finish.
    let stats = w.store.stats();
    assert_eq!((stats.order_puts, stats.writes, stats.conflicts), (0, 5, 0));
}

#[tokio::test]
async fn a_rejected_reservation_fails_the_order_with_nothing_to_undo() {
    let mut w = World::new();
    w.remote.script("reserve-inventory", [Behaviour::Permanent("out of stock".into())]);
    let id = w.submit("fail-at-1").await.unwrap().order_id;
    w.settle().await;

    let r = w.state(id);
    assert_eq!(r.process_state, ProcessState::Error);
    assert_eq!(
        r.cause,
        Some(Cause::StepRejected {
            step: "reserve-inventory".into(),
            reason: "out of stock".into()
        })
    );
    assert_eq!(
        statuses(&w, id),
        [StepStatus::Failed, StepStatus::NotStarted, StepStatus::NotStarted]
    );
    assert!(w.remote.ledger().is_empty(), "nothing was applied, nothing undone");
    let alerts = w.alerts();
    assert_eq!(alerts.len(), 1);
    assert_eq!(alerts[0]["fully_compensated"], true);
    assert_eq!(w.statuses(id).last().map(String::as_str), Some("failed"));
    assert_eq!(r.complete_by, None, "the alert was confirmed, so the record left the index");
}

#[tokio::test]
async fn a_declined_payment_releases_the_reserved_stock() {
    let mut w = World::new();
    w.remote.script("charge-payment", [Behaviour::Permanent("card declined".into())]);
    let id = w.submit("fail-at-2").await.unwrap().order_id;
    w.settle().await;

    assert_eq!(w.state(id).process_state, ProcessState::Error);
    assert_eq!(statuses(&w, id), [StepStatus::Undone, StepStatus::Failed, StepStatus::NotStarted]);
    assert!(w.remote.applied(&World::key(id, "reserve-inventory", "do")));
    assert!(w.remote.applied(&World::key(id, "reserve-inventory", "undo")));
    assert!(
        !w.remote.applied(&World::key(id, "charge-payment", "undo")),
        "a refused charge is not refunded"
    );
    assert_eq!(w.alerts().len(), 1);
    assert_eq!(w.statuses(id).last().map(String::as_str), Some("compensated"));
}

#[tokio::test]
async fn a_failed_shipment_refunds_then_releases_in_reverse_order() {
    let mut w = World::new();
    w.remote.script("ship", [Behaviour::Permanent("address undeliverable".into())]);
    let id = w.submit("fail-at-3").await.unwrap().order_id;
    w.settle().await;

    assert_eq!(w.state(id).process_state, ProcessState::Error);
    assert_eq!(statuses(&w, id), [StepStatus::Undone, StepStatus::Undone, StepStatus::Failed]);
    let ledger: Vec<String> = w.remote.ledger().into_iter().map(|e| e.action).collect();
    assert_eq!(
        ledger,
        ["reserve-inventory", "charge-payment", "refund-payment", "release-inventory"]
    );
    // The refund received what the charge returned.
    let alerts = w.alerts();
    assert_eq!(alerts.len(), 1);
    assert_eq!(alerts[0]["needs_manual_undo"], serde_json::json!([]));
}

#[tokio::test]
async fn transient_faults_are_absorbed_by_the_agent_with_one_effect() {
    let mut w = World::new();
    w.remote.script(
        "charge-payment",
        [Behaviour::Transient, Behaviour::Transient, Behaviour::ApplyThenLoseAnswer],
    );
    let id = w.submit("flaky-1").await.unwrap().order_id;
    w.settle().await;

    assert_eq!(w.state(id).process_state, ProcessState::Processed);
    let key = World::key(id, "charge-payment", "do");
    assert_eq!(w.remote.calls(&key), 4, "three faults, then the retry that finds the lost answer");
    assert_eq!(w.remote.applications(&key), 1);
    assert_eq!(w.state(id).failure_count, 0, "the supervisor never had to step in");
}

#[tokio::test]
async fn the_idempotency_key_survives_a_redispatch_by_the_supervisor() {
    // Faults that never add up to a hold of the service: the lease runs out.
    let hold = HoldPolicy { after_failures: u32::MAX, ..HoldPolicy::default() };
    let mut w = World::with(EngineConfig { hold, ..EngineConfig::default() });
    // The charge goes through but every answer is lost until the agent runs out of tries.
    let lost = std::iter::repeat_n(Behaviour::ApplyThenLoseAnswer, 8);
    w.remote.script("charge-payment", lost);
    let id = w.submit("lost-answer").await.unwrap().order_id;
    w.settle().await;
    assert_eq!(w.state(id).process_state, ProcessState::Processing);
    let first_attempt = w.state(id).attempt;

    w.run_for(Duration::from_secs(600)).await;
    let r = w.state(id);
    assert_eq!(r.process_state, ProcessState::Processed);
    assert_eq!(r.failure_count, 1, "one lease ran out before the answer was found");
    assert!(r.attempt > first_attempt + 1, "the step was leased again");
    let key = World::key(id, "charge-payment", "do");
    assert!(w.remote.calls(&key) > 8, "re-dispatched with the same key");
    assert_eq!(w.remote.applications(&key), 1, "and charged once");
    assert_eq!(w.remote.max_applications(), 1);
}

#[tokio::test]
async fn an_outage_holds_its_orders_and_they_finish_once_the_service_is_back() {
    let mut w = World::new();
    let policy = w.system.config.hold;
    w.remote.script("charge-payment", std::iter::repeat_n(Behaviour::Transient, 100_000));
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(w.submit(&format!("outage-{n}")).await.unwrap().order_id);
    }
    let down = Duration::from_secs(1800);
    w.run_for(down).await;
    for id in &ids {
        let r = w.state(*id);
        assert_eq!((r.process_state, r.failure_count), (ProcessState::Pending, 0), "{id}");
        assert_eq!(r.held_on().map(|h| h.key()).as_deref(), Some("payment/charge-payment"));
        assert_eq!(r.steps[0].status, StepStatus::Done, "nothing was undone");
    }
    // The faults that made the hold, then one probe per interval at most.
    let calls = w.remote.faults().transient;
    let probes = u32::try_from(down.as_secs() / policy.probe_every.as_secs()).unwrap() + 1;
    assert!(calls <= policy.after_failures + probes, "{calls} calls while it was down");
    // One alert for the hold of the charge, and one more once it lasted past the operators'
    // threshold (ten minutes), with what its probes met.
    let held = w.bus.of_type(SERVICE_DETAIL_TYPE);
    assert_eq!(held.len(), 2, "one alert for the hold, one when it went on: {held:?}");
    fn told(a: &serde_json::Value) -> (Option<&str>, Option<&str>, Option<&str>, Option<u64>) {
        (a["service"].as_str(), a["action"].as_str(), a["state"].as_str(), a["waiting"].as_u64())
    }
    assert_eq!(told(&held[0]), (Some("payment"), Some("charge-payment"), Some("held"), Some(5)));
    assert_eq!(told(&held[1]).2, Some("still_held"));
    assert_eq!(held[1]["last_probe"].as_str(), Some("unavailable"), "{}", held[1]);
    assert!(held[1]["probes"].as_u64().unwrap() > 50, "{}", held[1]);
    assert!(w.alerts().is_empty(), "no order failed");

    w.remote.unscript("charge-payment");
    w.run_for(Duration::from_secs(600)).await;
    for id in &ids {
        let r = w.state(*id);
        assert_eq!((r.process_state, r.failure_count), (ProcessState::Processed, 0), "{id}");
        assert_eq!(w.remote.applications(&World::key(*id, "charge-payment", "do")), 1);
    }
    let changes = w.bus.of_type(SERVICE_DETAIL_TYPE);
    assert_eq!(changes.len(), 3, "one alert for the release: {changes:?}");
    assert_eq!(changes[2]["state"].as_str(), Some("open"));
    assert!(w.alerts().is_empty());
}

#[tokio::test]
async fn a_release_spreads_the_orders_that_waited_no_more_than_the_resume_rate_a_second() {
    use sas_engine::health::ServiceRecord;
    use sas_engine::ports::ServiceBook;
    let mut w = World::new();
    let now = w.clock.now();
    let held =
        ServiceRecord::open("payment", now).hold_by(now, None, "ops", "maintenance").unwrap();
    w.book.save(&held).await.unwrap();
    let mut ids = Vec::new();
    for n in 0..35 {
        ids.push(w.submit(&format!("spread-{n}")).await.unwrap().order_id);
    }
    w.run_for(Duration::from_secs(120)).await;
    let record = w.book.load("payment").await.unwrap().unwrap();
    w.book.save(&record.release_by(w.clock.now(), None, "ops", "done").unwrap()).await.unwrap();
    let released = w.clock.now();
    assert_eq!(w.tend().await.resumed, 35);
    // SQS delays messages by whole seconds: each of the first seconds gets ten start messages,
    // the stack's resume rate, and none gets more. A resumed lease starts after its delay.
    let config = &w.system.config;
    let budget = Duration::from_secs(30);
    let mut per_second = std::collections::BTreeMap::new();
    for id in &ids {
        let lease = w.state(*id).steps[1].lease.unwrap();
        let delay = released.until(lease.complete_by) - config.claim_grace - budget;
        *per_second.entry(delay.as_secs()).or_insert(0) += 1;
    }
    let spread: Vec<(u64, i32)> = per_second.into_iter().collect();
    assert_eq!(spread, [(0, 10), (1, 10), (2, 10), (3, 5)]);
    w.run_for(Duration::from_secs(300)).await;
    assert!(ids.iter().all(|id| w.state(*id).process_state == ProcessState::Processed));
}

#[tokio::test]
async fn orders_of_a_released_service_resume_only_once_the_queues_flow() {
    use sas_engine::health::ServiceRecord;
    use sas_engine::ports::ServiceBook;
    let mut w = World::new();
    let now = w.clock.now();
    let held =
        ServiceRecord::open("payment", now).hold_by(now, None, "ops", "maintenance").unwrap();
    w.book.save(&held).await.unwrap();
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(w.submit(&format!("held-{n}")).await.unwrap().order_id);
    }
    w.run_for(Duration::from_secs(300)).await;
    for id in &ids {
        assert_eq!(w.state(*id).held_on().map(|h| h.service.as_str()), Some("payment"));
    }

    // Released while the scheduler takes nothing: a new order's start message waits an hour.
    let record = w.book.load("payment").await.unwrap().unwrap();
    w.book.save(&record.release_by(w.clock.now(), None, "ops", "done").unwrap()).await.unwrap();
    w.submit("behind").await.unwrap();
    w.clock.advance(Duration::from_secs(3600));
    let report = w.sweep().await;
    assert_eq!(report.stalled.as_deref(), Some("scheduler"));
    for id in &ids {
        let r = w.state(*id);
        assert_eq!(r.held_on().map(|h| h.service.as_str()), Some("payment"), "not resumed");
    }
    assert_eq!(w.queues.len(&Destination::Scheduler), 1, "nothing added to the stalled queue");

    // Once the scheduler runs again, the next sweep resumes them.
    w.run_for(Duration::from_secs(600)).await;
    for id in &ids {
        let r = w.state(*id);
        assert_eq!((r.process_state, r.failure_count), (ProcessState::Processed, 0), "{id}");
    }
}

#[tokio::test]
async fn a_lost_start_message_is_recovered_by_the_supervisor() {
    let mut w = World::new();
    let id = w.submit("lost-start").await.unwrap().order_id;
    // The start message vanishes.
    let lost = w.queues.receive(&Destination::Scheduler, 10);
    assert_eq!(lost.len(), 1);
    w.queues.delete(&Destination::Scheduler, &lost[0].receipt).unwrap();
    w.settle().await;
    assert_eq!(w.state(id).process_state, ProcessState::Pending);

    // Not yet: the claim deadline has not passed.
    assert_eq!(w.sweep().await.found, 0);
    w.run_for(Duration::from_secs(300)).await;
    let r = w.state(id);
    assert_eq!(r.process_state, ProcessState::Processed);
    assert_eq!(r.failure_count, 1, "the lost start message cost one lease");
    assert!(r.timeline.iter().any(|e| e.what == sas_engine::state::Happening::RetryScheduled));
}

#[tokio::test]
async fn an_order_stuck_between_steps_is_rescheduled() {
    // The scheduler recorded step one and leased step two, then died before dispatching it,
    // and its reply message was lost too: every recorded step is consistent, nothing moves.
    let mut w = World::new();
    let id = w.submit("stuck").await.unwrap().order_id;
    let inventory = Destination::Agent(sas_engine::AgentName::new("inventory"));
    assert!(w.step(&Destination::Scheduler).await);
    assert!(w.step(&inventory).await);
    w.queues.fail_next_sends(1);
    let reply = w.queues.receive(&Destination::Replies, 1).remove(0);
    let incoming = Incoming { message_id: &reply.message_id, receive_count: reply.receive_count };
    assert!(!w.deliver(&Destination::Replies, incoming, &reply.body).await);
    w.queues.delete(&Destination::Replies, &reply.receipt).unwrap(); // and the reply is gone
    let r = w.state(id);
    assert_eq!((leased(&r), r.process_state), (vec![1], ProcessState::Processing));
    w.settle().await;
    assert_eq!(leased(&w.state(id)), [1], "nothing moves on its own");

    w.run_for(Duration::from_secs(300)).await;
    assert_eq!(w.state(id).process_state, ProcessState::Processed);
    assert_eq!(w.remote.max_applications(), 1);
}

#[tokio::test]
async fn a_crash_after_the_write_is_repaired_by_the_redelivered_message() {
    let mut w = World::new();
    // A reply queue whose messages come back well within a step's budget.
    let quick = sas_engine::memory::QueueSettings {
        visibility_timeout: Duration::from_secs(10),
        ..Default::default()
    };
    w.queues.configure(&Destination::Replies, quick);
    let id = w.submit("crash").await.unwrap().order_id;
    let inventory = Destination::Agent(sas_engine::AgentName::new("inventory"));
    assert!(w.step(&Destination::Scheduler).await);
    assert!(w.step(&inventory).await);
    // The scheduler writes the transition but cannot dispatch; its message comes back.
    w.queues.fail_next_sends(1);
    assert!(!w.step(&Destination::Replies).await);
    assert_eq!(leased(&w.state(id)), [1]);
    assert_eq!(w.queues.len(&Destination::Replies), 1, "the reply was not deleted");
    w.clock.advance(Duration::from_secs(11));
    w.settle().await;
    assert_eq!(w.state(id).process_state, ProcessState::Processed);
    assert!(w.handled.iter().any(|(_, h)| *h == Handled::Replayed));
    assert_eq!(w.state(id).failure_count, 0, "repaired without the supervisor");
    assert_eq!(w.remote.max_applications(), 1);
}

#[tokio::test]
async fn duplicated_messages_change_nothing_twice() {
    let mut w = World::new();
    let id = w.submit("dup").await.unwrap().order_id;
    // Every message is delivered twice.
    for _ in 0..20 {
        let mut any = false;
        for dest in w.destinations() {
            for d in w.queues.receive(&dest, 10) {
                any = true;
                // Two copies of the message: another message id each.
                w.deliver(&dest, Incoming::first(&d.message_id), &d.body).await;
                w.deliver(&dest, Incoming::first(&format!("{}-copy", d.message_id)), &d.body).await;
                w.queues.delete(&dest, &d.receipt).unwrap();
            }
        }
        if !any {
            break;
        }
    }
    let r = w.state(id);
    assert_eq!(r.process_state, ProcessState::Processed);
    assert_eq!(w.remote.max_applications(), 1);
    let writes = w.store.stats().writes;
    assert_eq!(writes, 5, "the record's creation, then each transition written once");
    assert_eq!(w.statuses(id).iter().filter(|s| *s == "processed").count(), 1);
}

#[tokio::test]
async fn a_payment_that_keeps_timing_out_is_compensated_with_one_alert() {
    let mut w = World::new();
    // The payment service hangs past every lease (budget and claim grace included).
    let slow = std::iter::repeat_n(Behaviour::Slow(Duration::from_secs(120)), 20);
    w.remote.script("charge-payment", slow);
    let id = w.submit("hang").await.unwrap().order_id;
    w.run_for(Duration::from_secs(3_600)).await;

    let r = w.state(id);
    assert_eq!(r.process_state, ProcessState::Error);
    assert_eq!(r.phase, Phase::Compensating);
    assert_eq!(r.cause, Some(Cause::StepTimedOut { step: "charge-payment".into(), failures: 3 }));
    // The charge may have happened (a slow call completes after its caller gave up): refunded.
    assert_eq!(statuses(&w, id), [StepStatus::Undone, StepStatus::Undone, StepStatus::NotStarted]);
    assert_eq!(w.alerts().len(), 1);
    assert_eq!(w.remote.max_applications(), 1);
}

/// The places of the steps holding a lease.
fn leased(record: &sas_engine::state::StateRecord) -> Vec<usize> {
    record.leased().map(|(i, _, _)| i).collect()
}
