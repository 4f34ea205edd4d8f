//! Every transition of the table, the illegal inputs, and the terminal states' deafness.

use std::time::Duration;

use serde_json::json;

use super::*;
use crate::ids::{AgentName, IdempotencyKey, OrderId};
use crate::state::{AlertDelivery, StateRecord};

const T0: Timestamp = Timestamp::from_millis(1_767_225_600_000);

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

struct Fixture {
    config: EngineConfig,
    workflow: Workflow,
}

impl Fixture {
    fn new() -> Self {
        let config = EngineConfig {
            status_events: crate::events::StatusKinds::all(),
            ..EngineConfig::default()
        };
        let agents = Workflow::agents_in(sas_workflows::order_fulfilment());
        let workflow = Workflow::from_json(sas_workflows::order_fulfilment(), &agents).unwrap();
        Fixture { config, workflow }
    }

    fn one_step() -> Self {
        let mut f = Fixture::new();
        f.workflow = Workflow::from_json(
            r#"{"name":"notify","steps":[{"name":"ship","agent":"shipping","budget_seconds":60}]}"#,
            &[AgentName::new("shipping")],
        )
        .unwrap();
        f
    }

    fn ctx(&self, now: Timestamp) -> Ctx<'_> {
        Ctx { now, config: &self.config, workflow: &self.workflow, seed: 0 }
    }

    fn new_record(&self) -> StateRecord {
        let id = OrderId::for_key(&IdempotencyKey::parse("order-1").unwrap());
        create(id, "corr-1".into(), &self.ctx(T0)).next
    }

    fn decide(&self, record: &StateRecord, input: Input<'_>, now: Timestamp) -> Decision {
        decide(record, input, &self.ctx(now))
    }

    /// Decides, insists on a transition, and checks the record's invariants.
    fn apply(&self, record: &StateRecord, input: Input<'_>, now: Timestamp) -> Transition {
        match self.decide(record, input, now) {
            Decision::Apply(t) => {
                t.next.check().unwrap();
                assert_eq!(t.next.revision, record.revision + 1);
                *t
            }
            other => panic!("expected a transition, got {other:?}"),
        }
    }

    fn claim(&self, record: &StateRecord, now: Timestamp) -> StateRecord {
        let message = format!("start-{}", record.attempt);
        let input =
            Input::Claim { attempt: record.attempt, owner: "scheduler-a", message: &message };
        self.apply(record, input, now).next
    }

    fn reply(&self, record: &StateRecord, outcome: StepOutcome, now: Timestamp) -> Transition {
        let step = step_ref(record);
        let attempt = record.steps[step.index].lease.map_or(record.attempt, |l| l.attempt);
        let message = format!("reply-{attempt}");
        let input = Input::Reply { attempt, step: &step, outcome: &outcome, message: &message };
        self.apply(record, input, now)
    }

    fn done(&self, record: &StateRecord, now: Timestamp) -> StateRecord {
        self.reply(record, StepOutcome::done(json!({"ref": cursor(record)})), now).next
    }

    fn expire(&self, record: &StateRecord, now: Timestamp) -> Transition {
        self.apply(record, expiry(record.complete_by.unwrap()), now)
    }
}

/// The supervisor's input for an entry with this CompleteBy, with every queue empty.
fn expiry(complete_by: Timestamp) -> Input<'static> {
    Input::Expire { complete_by, horizon: Duration::ZERO }
}

fn step_ref(record: &StateRecord) -> StepRef {
    StepRef {
        index: cursor(record),
        name: record.steps[cursor(record)].name.clone(),
        direction: record.phase.direction(),
        element: None,
    }
}

/// The first step holding a lease (or, paused, the first to go on with).
fn cursor(record: &StateRecord) -> usize {
    let current = record.current_step().map(|s| s.name.clone());
    record.steps.iter().position(|s| Some(&s.name) == current.as_ref()).unwrap_or(usize::MAX)
}

fn statuses(effects: &[Effect]) -> Vec<StatusKind> {
    effects
        .iter()
        .filter_map(|e| if let Effect::Status { kind, .. } = e { Some(*kind) } else { None })
        .collect()
}

fn alerts(effects: &[Effect]) -> usize {
    effects.iter().filter(|e| **e == Effect::Alert).count()
}

fn step_statuses(record: &StateRecord) -> Vec<StepStatus> {
    record.steps.iter().map(|s| s.status).collect()
}

#[test]
fn a_new_order_is_pending_with_a_deadline_for_its_claim() {
    let f = Fixture::new();
    let r = f.new_record();
    r.check().unwrap();
    assert_eq!((r.process_state, r.attempt, r.failure_count), (ProcessState::Pending, 0, 0));
    assert_eq!(r.locked_by, None);
    // Its lease: claim grace (30 s) + the first step's budget (30 s). The index first looks
    // at it when the claim's grace ends, so that the steps that follow leave it there.
    assert_eq!(r.earliest_lease(), Some(T0.plus(secs(60))));
    assert_eq!(r.complete_by, Some(T0.plus(secs(30))));
}

#[test]
fn a_claim_leases_the_current_step_and_dispatches_it() {
    let f = Fixture::new();
    let r = f.new_record();
    let t = f.apply(
        &r,
        Input::Claim { attempt: 0, owner: "scheduler-a", message: "start-copy" },
        T0.plus(secs(1)),
    );
    assert_eq!(t.next.process_state, ProcessState::Processing);
    assert_eq!(t.next.locked_by.as_deref(), Some("scheduler-a"));
    assert_eq!(t.next.attempt, 1);
    // The Pending deadline still leaves the whole budget: kept, so the index entry is unchanged.
    assert_eq!(t.next.complete_by, r.complete_by);
    assert_eq!(
        t.effects,
        vec![
            Effect::Status { kind: StatusKind::Processing, step: None },
            Effect::Dispatch { step: 0 }
        ]
    );
}

#[test]
fn a_late_claim_gets_a_fresh_full_budget() {
    let f = Fixture::new();
    let r = f.new_record();
    let late = T0.plus(secs(50));
    let next = f.claim(&r, late);
    assert_eq!(next.earliest_lease(), Some(late.plus(secs(30))));
    // Within the lead of where the index holds it: the entry stays.
    assert_eq!(next.complete_by, r.complete_by);
}

#[test]
fn duplicate_start_messages_lead_to_exactly_one_claim() {
    let f = Fixture::new();
    let r = f.new_record();
    let claimed = f.claim(&r, T0);
    // The same start message delivered again (its handler died after writing): the claim is
    // written, its dispatch is redone.
    let again = Input::Claim { attempt: 0, owner: "scheduler-b", message: "start-0" };
    assert_eq!(f.decide(&claimed, again, T0), Decision::Replay(vec![Effect::Dispatch { step: 0 }]));
    // A second copy of the start message (another queue message) is a duplicate: ignored.
    assert_eq!(
        f.decide(
            &claimed,
            Input::Claim { attempt: 0, owner: "scheduler-b", message: "start-copy" },
            T0
        ),
        Decision::Ignore(Ignored::Stale { received: 0, current: 1 })
    );
    // After the order moved on, the old start message changes nothing at all.
    let moved = f.done(&claimed, T0.plus(secs(2)));
    assert_eq!(
        f.decide(
            &moved,
            Input::Claim { attempt: 0, owner: "scheduler-b", message: "start-copy" },
            T0
        ),
        Decision::Ignore(Ignored::Stale { received: 0, current: 2 })
    );
    // A start for an attempt the order never had is stale too.
    assert_eq!(
        f.decide(&r, Input::Claim { attempt: 7, owner: "scheduler-b", message: "start-copy" }, T0),
        Decision::Ignore(Ignored::Stale { received: 7, current: 0 })
    );
}

#[test]
fn a_done_reply_records_the_step_and_leases_the_next_in_one_write() {
    let f = Fixture::new();
    let claimed = f.claim(&f.new_record(), T0);
    let now = T0.plus(secs(3));
    let t = f.reply(&claimed, StepOutcome::done(json!({"reservation": "r-1"})), now);
    let n = &t.next;
    assert_eq!(n.steps[0].status, StepStatus::Done);
    assert_eq!(n.steps[0].output, Some(json!({"reservation": "r-1"})));
    assert_eq!((cursor(n), n.attempt, n.process_state), (1, 2, ProcessState::Processing));
    assert_eq!(n.earliest_lease(), Some(now.plus(secs(30))));
    assert_eq!(n.complete_by, claimed.complete_by, "one write, and no move in the index");
    assert_eq!(statuses(&t.effects), [StatusKind::StepDone]);
    assert_eq!(t.effects.last(), Some(&Effect::Dispatch { step: cursor(&t.next) }));
}

#[test]
fn the_three_step_workflow_runs_to_processed() {
    let f = Fixture::new();
    let mut r = f.claim(&f.new_record(), T0);
    r = f.done(&r, T0.plus(secs(1)));
    r = f.done(&r, T0.plus(secs(2)));
    let t = f.reply(&r, StepOutcome::done(json!({"tracking": "t-9"})), T0.plus(secs(3)));
    let p = &t.next;
    assert_eq!(p.process_state, ProcessState::Processed);
    assert_eq!(
        (p.complete_by, p.locked_by.as_ref()),
        (None, None),
        "a finished record leaves the index"
    );
    assert!(p.steps.iter().all(|s| s.status == StepStatus::Done));
    assert_eq!(statuses(&t.effects), [StatusKind::StepDone, StatusKind::Processed]);
    assert_eq!(alerts(&t.effects), 0);
}

#[test]
fn a_permanent_failure_of_the_first_step_ends_in_error_with_one_alert() {
    let f = Fixture::new();
    let r = f.claim(&f.new_record(), T0);
    let now = T0.plus(secs(2));
    let t = f.reply(&r, StepOutcome::failed("out of stock"), now);
    let e = &t.next;
    assert_eq!(e.process_state, ProcessState::Error);
    assert_eq!(
        e.cause,
        Some(Cause::StepRejected {
            step: "reserve-inventory".into(),
            reason: "out of stock".into()
        })
    );
    assert_eq!(e.alert, Some(AlertDelivery::Pending));
    assert_eq!(
        e.complete_by,
        Some(now.plus(f.config.alert_retry_after)),
        "stays indexed until the alert is confirmed"
    );
    assert_eq!(statuses(&t.effects), [StatusKind::Failed]);
    assert_eq!(alerts(&t.effects), 1);
}

#[test]
fn a_permanent_failure_of_payment_releases_the_inventory() {
    let f = Fixture::new();
    let mut r = f.claim(&f.new_record(), T0);
    r = f.done(&r, T0.plus(secs(1)));
    let t = f.reply(&r, StepOutcome::failed("card declined"), T0.plus(secs(2)));
    let c = &t.next;
    assert_eq!(c.phase, Phase::Compensating);
    assert_eq!(step_statuses(c), [StepStatus::ToUndo, StepStatus::Failed, StepStatus::NotStarted]);
    assert_eq!((cursor(c), c.process_state), (0, ProcessState::Processing));
    assert_eq!(statuses(&t.effects), [StatusKind::Compensating]);
    assert_eq!(t.effects.last(), Some(&Effect::Dispatch { step: cursor(&t.next) }));

    let t = f.reply(c, StepOutcome::done(json!({"released": true})), T0.plus(secs(3)));
    assert_eq!(t.next.process_state, ProcessState::Error);
    assert_eq!(
        step_statuses(&t.next),
        [StepStatus::Undone, StepStatus::Failed, StepStatus::NotStarted]
    );
    assert!(t.next.needs_manual_undo().is_empty());
    assert_eq!(statuses(&t.effects), [StatusKind::Compensated]);
    assert_eq!(alerts(&t.effects), 1);
}

#[test]
fn a_permanent_failure_of_shipping_refunds_then_releases() {
    let f = Fixture::new();
    let mut r = f.claim(&f.new_record(), T0);
    r = f.done(&r, T0.plus(secs(1)));
    r = f.done(&r, T0.plus(secs(2)));
    r = f.reply(&r, StepOutcome::failed("address undeliverable"), T0.plus(secs(3))).next;
    assert_eq!(step_statuses(&r), [StepStatus::ToUndo, StepStatus::ToUndo, StepStatus::Failed]);
    assert_eq!(cursor(&r), 1, "the last completed step is undone first");
    assert_eq!(step_ref(&r).direction, Direction::Undo);
    let refunded = f.done(&r, T0.plus(secs(4)));
    assert_eq!((cursor(&refunded), refunded.process_state), (0, ProcessState::Processing));
    assert_eq!(refunded.attempt, r.attempt + 1, "each undo is its own lease");
    let t = f.reply(&refunded, StepOutcome::done(json!({})), T0.plus(secs(5)));
    assert_eq!(
        step_statuses(&t.next),
        [StepStatus::Undone, StepStatus::Undone, StepStatus::Failed]
    );
    assert_eq!(statuses(&t.effects), [StatusKind::Compensated]);
}

#[test]
fn a_refused_undo_does_not_stop_the_others_and_is_reported() {
    let f = Fixture::new();
    let mut r = f.claim(&f.new_record(), T0);
    r = f.done(&r, T0.plus(secs(1)));
    r = f.done(&r, T0.plus(secs(2)));
    r = f.reply(&r, StepOutcome::failed("no carrier"), T0.plus(secs(3))).next;
    r = f.reply(&r, StepOutcome::failed("refund window closed"), T0.plus(secs(4))).next;
    assert_eq!((cursor(&r), r.phase), (0, Phase::Compensating), "inventory is still released");
    let t = f.reply(&r, StepOutcome::done(json!({})), T0.plus(secs(5)));
    assert_eq!(t.next.needs_manual_undo(), ["charge-payment"]);
    assert_eq!(t.next.steps[1].detail.as_deref(), Some("refund window closed"));
    assert_eq!(statuses(&t.effects), [StatusKind::Failed]);
    assert_eq!(alerts(&t.effects), 1);
}

#[test]
fn replies_from_other_attempts_change_nothing() {
    let f = Fixture::new();
    let r = f.claim(&f.new_record(), T0);
    let step = step_ref(&r);
    let done = StepOutcome::done(json!({}));
    for attempt in [0, r.attempt + 1, u64::MAX] {
        assert_eq!(
            f.decide(
                &r,
                Input::Reply { attempt, step: &step, outcome: &done, message: "reply-x" },
                T0
            ),
            Decision::Ignore(Ignored::Stale { received: attempt, current: r.attempt })
        );
    }
}

#[test]
fn a_stale_reply_is_rejected_after_the_supervisor_reset_the_order() {
    let f = Fixture::new();
    let r = f.claim(&f.new_record(), T0);
    let old_step = step_ref(&r);
    let old_attempt = r.attempt;
    let expired_at = r.earliest_lease().unwrap().plus(secs(1));
    let reset = f.expire(&r, expired_at).next;
    assert_eq!(reset.process_state, ProcessState::Pending);
    let late = StepOutcome::done(json!({}));
    let input =
        Input::Reply { attempt: old_attempt, step: &old_step, outcome: &late, message: "reply-x" };
    assert_eq!(
        f.decide(&reset, input, expired_at),
        Decision::Ignore(Ignored::Stale { received: old_attempt, current: reset.attempt })
    );
    // And once the step is claimed again, the old attempt still cannot complete it.
    let reclaimed = f.claim(&reset, expired_at.plus(secs(6)));
    assert_eq!(
        f.decide(&reclaimed, input, expired_at.plus(secs(7))),
        Decision::Ignore(Ignored::Stale { received: old_attempt, current: reclaimed.attempt })
    );
}

#[test]
fn illegal_inputs_are_typed_outcomes() {
    let f = Fixture::new();
    let r = f.claim(&f.new_record(), T0);
    let done = StepOutcome::done(json!({}));
    let wrong_step = StepRef {
        index: 1,
        name: "charge-payment".into(),
        direction: Direction::Do,
        element: None,
    };
    assert!(matches!(
        f.decide(
            &r,
            Input::Reply {
                attempt: r.attempt,
                step: &wrong_step,
                outcome: &done,
                message: "reply-x"
            },
            T0
        ),
        Decision::Illegal(Illegal::WrongStep { .. })
    ));
    let wrong_way = StepRef { direction: Direction::Undo, ..step_ref(&r) };
    assert!(matches!(
        f.decide(
            &r,
            Input::Reply {
                attempt: r.attempt,
                step: &wrong_way,
                outcome: &done,
                message: "reply-x"
            },
            T0
        ),
        Decision::Illegal(Illegal::WrongDirection { .. })
    ));
    let pending = f.new_record();
    assert_eq!(
        f.decide(
            &pending,
            Input::Reply {
                attempt: 0,
                step: &step_ref(&pending),
                outcome: &done,
                message: "reply-x"
            },
            T0
        ),
        Decision::Illegal(Illegal::NotDispatched { attempt: 0 })
    );
    assert_eq!(f.decide(&r, Input::AlertSent, T0), Decision::Illegal(Illegal::NoAlert));
}

#[test]
fn terminal_states_ignore_late_and_duplicate_events() {
    let f = Fixture::new();
    let mut r = f.claim(&f.new_record(), T0);
    let first = step_ref(&r);
    r = f.done(&r, T0);
    r = f.done(&r, T0);
    let last_step = step_ref(&r);
    let last_attempt = r.attempt;
    let processed = f.done(&r, T0);
    let done = StepOutcome::done(json!({}));
    let far = T0.plus(secs(10_000));
    let late = [
        Input::Claim { attempt: 0, owner: "x", message: "start-copy" },
        Input::Claim { attempt: processed.attempt, owner: "x", message: "start-copy" },
        Input::Reply { attempt: 1, step: &first, outcome: &done, message: "reply-x" },
        expiry(T0),
    ];
    for input in late {
        assert_eq!(
            f.decide(&processed, input, far),
            Decision::Ignore(Ignored::Terminal),
            "{input:?}"
        );
    }
    // The reply that finished it, delivered again, only replays the terminal event.
    assert_eq!(
        f.decide(
            &processed,
            Input::Reply {
                attempt: last_attempt,
                step: &last_step,
                outcome: &done,
                message: &format!("reply-{last_attempt}")
            },
            far
        ),
        Decision::Replay(vec![Effect::Status { kind: StatusKind::Processed, step: None }])
    );
    assert_eq!(f.decide(&processed, Input::AlertSent, far), Decision::Illegal(Illegal::NoAlert));

    // An Error whose alert went out ignores everything, including the supervisor.
    let failed = f.reply(&f.claim(&f.new_record(), T0), StepOutcome::failed("no"), T0).next;
    let sent = f.apply(&failed, Input::AlertSent, T0).next;
    assert_eq!(sent.alert, Some(AlertDelivery::Sent));
    assert_eq!(sent.complete_by, None, "leaves the index once the alert is out");
    for input in
        [Input::Claim { attempt: sent.attempt, owner: "x", message: "start-copy" }, expiry(T0)]
    {
        assert_eq!(f.decide(&sent, input, far), Decision::Ignore(Ignored::Terminal));
    }
    assert_eq!(f.decide(&sent, Input::AlertSent, far), Decision::Ignore(Ignored::AlertAlreadySent));
}

#[test]
fn a_redelivered_reply_after_error_replays_the_alert_only_until_it_is_sent() {
    let f = Fixture::new();
    let r = f.claim(&f.new_record(), T0);
    let step = step_ref(&r);
    let no = StepOutcome::failed("no");
    let input = Input::Reply { attempt: r.attempt, step: &step, outcome: &no, message: "reply-x" };
    let failed = f.apply(&r, input, T0).next;
    let failed_event = Effect::Status { kind: StatusKind::Failed, step: None };
    assert_eq!(
        f.decide(&failed, input, T0),
        Decision::Replay(vec![failed_event.clone(), Effect::Alert])
    );
    let sent = f.apply(&failed, Input::AlertSent, T0).next;
    assert_eq!(f.decide(&sent, input, T0), Decision::Replay(vec![failed_event]));
}

#[test]
fn the_supervisor_leaves_a_lease_alone_until_complete_by_passes() {
    let f = Fixture::new();
    let r = f.claim(&f.new_record(), T0);
    let (cb, end) = (r.complete_by.unwrap(), r.earliest_lease().unwrap());
    assert!(cb < end, "the index holds it ahead of its lease");
    assert_eq!(
        f.decide(&r, expiry(cb), cb.minus(Duration::from_millis(1))),
        Decision::Ignore(Ignored::NotExpired { complete_by: Some(cb) })
    );
    // Found early: passed by until its lease ends.
    assert_eq!(
        f.decide(&r, expiry(cb), end.minus(Duration::from_millis(1))),
        Decision::Ignore(Ignored::NotExpired { complete_by: Some(end) })
    );
    // An index entry older than the record (the index lags) is not acted on.
    assert_eq!(
        f.decide(&r, expiry(cb.minus(secs(5))), end.plus(secs(5))),
        Decision::Ignore(Ignored::Moved)
    );
    assert!(matches!(f.decide(&r, expiry(cb), end), Decision::Apply(_)));
}

#[test]
fn an_expired_lease_is_reset_to_pending_with_a_wait_that_grows() {
    let f = Fixture {
        config: EngineConfig { failure_threshold: 10, ..Fixture::new().config },
        ..Fixture::new()
    };
    let mut r = f.claim(&f.new_record(), T0);
    let mut previous_wait = Duration::ZERO;
    for failures in 1..=4u32 {
        let now = r.earliest_lease().unwrap().plus(secs(1));
        let t = f.expire(&r, now);
        let n = &t.next;
        let wait = f.config.wait.wait(failures);
        assert!(wait > previous_wait);
        previous_wait = wait;
        assert_eq!(
            (n.process_state, n.failure_count, n.locked_by.as_ref()),
            (ProcessState::Pending, failures, None)
        );
        assert_eq!(n.attempt, r.attempt + 1, "the reset fences out the expired attempt");
        assert_eq!(n.complete_by, Some(now.plus(wait).plus(f.config.claim_grace).plus(secs(30))));
        assert_eq!(t.effects, vec![Effect::Kick { delay: wait, attempt: t.next.attempt }]);
        r = f.claim(n, now.plus(wait));
    }
}

#[test]
fn an_unclaimed_pending_order_is_rescheduled_at_the_same_attempt() {
    // The start message was lost: nothing is running, the order just does not move.
    let f = Fixture::new();
    let r = f.new_record();
    let now = r.earliest_lease().unwrap().plus(secs(1));
    let t = f.expire(&r, now);
    assert_eq!(
        (t.next.process_state, t.next.failure_count, t.next.attempt),
        (ProcessState::Pending, 1, 0)
    );
    assert_eq!(
        t.effects,
        vec![Effect::Kick { delay: f.config.wait.wait(1), attempt: t.next.attempt }]
    );
    // Had the first start message only been late, it still claims the order; the second then
    // finds it claimed.
    let claimed = f.apply(
        &t.next,
        Input::Claim { attempt: 0, owner: "scheduler-a", message: "the-late-one" },
        now.plus(secs(2)),
    );
    let again = Input::Claim { attempt: 0, owner: "scheduler-b", message: "the-new-one" };
    assert_eq!(
        f.decide(&claimed.next, again, now.plus(secs(9))),
        Decision::Ignore(Ignored::Stale { received: 0, current: 1 })
    );
}

#[test]
fn a_lease_within_the_horizon_of_the_queues_is_not_judged() {
    // The queues hold messages that waited 90 s: a lease that ran out less than that ago may
    // only be waiting for its request or its reply.
    let f = Fixture::new();
    let r = f.claim(&f.new_record(), T0);
    let (cb, end) = (r.complete_by.unwrap(), r.earliest_lease().unwrap());
    let horizon = secs(90);
    let waiting = Input::Expire { complete_by: cb, horizon };
    for now in [end, end.plus(secs(1)), end.plus(secs(89))] {
        assert_eq!(
            f.decide(&r, waiting, now),
            Decision::Ignore(Ignored::Queued { until: end.plus(horizon) }),
            "at {now}"
        );
    }
    let t = f.apply(&r, waiting, end.plus(horizon));
    assert_eq!((t.next.process_state, t.next.failure_count), (ProcessState::Pending, 1));
    // The same holds for an order whose start message waits in the scheduler's queue.
    let pending = f.new_record();
    let cb = pending.complete_by.unwrap();
    assert!(matches!(
        f.decide(&pending, Input::Expire { complete_by: cb, horizon }, cb.plus(secs(60))),
        Decision::Ignore(Ignored::Queued { .. })
    ));
    // An alert waits on no queue: the horizon does not hold it back.
    let failed = f.reply(&f.claim(&f.new_record(), T0), StepOutcome::failed("no"), T0).next;
    let due = failed.complete_by.unwrap();
    assert!(matches!(
        f.decide(&failed, Input::Expire { complete_by: due, horizon }, due),
        Decision::Apply(_)
    ));
}

#[test]
fn at_the_threshold_a_step_with_nothing_to_undo_goes_to_error_with_one_alert() {
    let f = Fixture::one_step();
    let mut r = f.claim(&f.new_record(), T0);
    for _ in 1..f.config.failure_threshold {
        let now = r.earliest_lease().unwrap().plus(secs(1));
        r = f.claim(&f.expire(&r, now).next, now.plus(secs(300)));
    }
    assert_eq!(r.failure_count, f.config.failure_threshold - 1);
    let cb = r.complete_by.unwrap();
    // Last try, lease not over yet: left alone.
    assert!(matches!(f.decide(&r, expiry(cb), cb.minus(secs(1))), Decision::Ignore(_)));
    let t = f.expire(&r, cb);
    assert_eq!(t.next.process_state, ProcessState::Error);
    assert_eq!(t.next.failure_count, f.config.failure_threshold);
    assert_eq!(
        t.next.cause,
        Some(Cause::StepTimedOut { step: "ship".into(), failures: f.config.failure_threshold })
    );
    assert_eq!(
        t.next.needs_manual_undo(),
        ["ship"],
        "it may have shipped: the operator must check"
    );
    assert_eq!(alerts(&t.effects), 1);
    assert_eq!(statuses(&t.effects), [StatusKind::Failed]);
}

#[test]
fn a_step_s_own_count_of_expired_leases_takes_the_place_of_the_stack_s() {
    let mut f = Fixture::one_step();
    f.workflow = Workflow::from_json(
        r#"{"name":"notify","steps":[{"name":"ship","agent":"shipping","expired_leases":1}]}"#,
        &[AgentName::new("shipping")],
    )
    .unwrap();
    assert!(f.config.failure_threshold > 1);
    let r = f.claim(&f.new_record(), T0);
    let t = f.expire(&r, r.earliest_lease().unwrap());
    assert_eq!(t.next.process_state, ProcessState::Error, "no second lease");
    assert_eq!(t.next.cause, Some(Cause::StepTimedOut { step: "ship".into(), failures: 1 }));
}

#[test]
fn a_step_s_own_first_wait_takes_the_place_of_the_stack_s_and_doubles() {
    let mut f = Fixture::one_step();
    f.workflow = Workflow::from_json(
        r#"{"name":"notify","steps":[{"name":"ship","agent":"shipping","retry_wait_seconds":60}]}"#,
        &[AgentName::new("shipping")],
    )
    .unwrap();
    assert!(f.config.failure_threshold >= 3 && f.config.wait.base < secs(60));
    let r = f.claim(&f.new_record(), T0);
    let t = f.expire(&r, r.earliest_lease().unwrap());
    assert_eq!(t.effects.last(), Some(&Effect::Kick { delay: secs(60), attempt: t.next.attempt }));
    let now = t.next.complete_by.unwrap();
    let r = f.claim(&t.next, now.minus(f.workflow.steps()[0].budget));
    let t = f.expire(&r, r.earliest_lease().unwrap());
    assert_eq!(t.effects.last(), Some(&Effect::Kick { delay: secs(120), attempt: t.next.attempt }));
    // Beyond the 15 minutes an SQS delay can carry, a file is refused.
    let long =
        r#"{"name":"n","steps":[{"name":"ship","agent":"shipping","retry_wait_seconds":901}]}"#;
    let err = Workflow::from_json(long, &[AgentName::new("shipping")]).unwrap_err();
    assert!(err.to_string().contains("retry_wait_seconds must be from 0 to 900"), "{err}");
}

#[test]
fn at_the_threshold_completed_steps_and_the_uncertain_one_are_compensated() {
    let f = Fixture::new();
    let mut r = f.claim(&f.new_record(), T0);
    r = f.done(&r, T0.plus(secs(1)));
    // Payment keeps timing out.
    for _ in 1..f.config.failure_threshold {
        let now = r.earliest_lease().unwrap();
        r = f.claim(&f.expire(&r, now).next, now.plus(secs(300)));
    }
    let t = f.expire(&r, r.earliest_lease().unwrap());
    let c = &t.next;
    assert_eq!((c.phase, c.process_state), (Phase::Compensating, ProcessState::Pending));
    // The charge may have gone through with its answer lost: it is refunded too.
    assert_eq!(step_statuses(c), [StepStatus::ToUndo, StepStatus::ToUndo, StepStatus::NotStarted]);
    assert_eq!((cursor(c), c.failure_count), (1, f.config.failure_threshold));
    assert_eq!(c.steps[1].lease.unwrap().failures, 0, "the undo starts with a clean count");
    assert_eq!(alerts(&t.effects), 0, "the alert comes once, when the order ends");
    assert_eq!(
        t.effects.last(),
        Some(&Effect::Kick { delay: Duration::ZERO, attempt: t.next.attempt })
    );

    let mut r = f.claim(c, c.updated_at);
    assert_eq!(
        step_ref(&r),
        StepRef {
            index: 1,
            name: "charge-payment".into(),
            direction: Direction::Undo,
            element: None
        }
    );
    r = f.done(&r, r.updated_at);
    let t = f.reply(&r, StepOutcome::done(json!({})), r.updated_at);
    assert_eq!(t.next.process_state, ProcessState::Error);
    assert_eq!(statuses(&t.effects), [StatusKind::Compensated]);
    assert_eq!(alerts(&t.effects), 1);
}

#[test]
fn an_undo_that_keeps_timing_out_is_left_to_the_operator() {
    let f = Fixture::new();
    let mut r = f.claim(&f.new_record(), T0);
    r = f.done(&r, T0);
    r = f.reply(&r, StepOutcome::failed("declined"), T0).next;
    for _ in 1..f.config.failure_threshold {
        let now = r.earliest_lease().unwrap();
        r = f.claim(&f.expire(&r, now).next, now.plus(secs(300)));
    }
    let t = f.expire(&r, r.earliest_lease().unwrap());
    assert_eq!(t.next.process_state, ProcessState::Error);
    assert_eq!(t.next.needs_manual_undo(), ["reserve-inventory"]);
    assert_eq!(statuses(&t.effects), [StatusKind::Failed]);
    assert_eq!(alerts(&t.effects), 1);
}

#[test]
fn an_unconfirmed_alert_is_published_again_by_one_supervisor() {
    let f = Fixture::new();
    let failed = f.reply(&f.claim(&f.new_record(), T0), StepOutcome::failed("no"), T0).next;
    let due = failed.complete_by.unwrap();
    assert!(matches!(f.decide(&failed, expiry(due), due.minus(secs(1))), Decision::Ignore(_)));
    let t = f.expire(&failed, due);
    assert_eq!(alerts(&t.effects), 1);
    assert_eq!(
        t.next.complete_by,
        Some(due.plus(f.config.alert_retry_after)),
        "re-leased before publishing"
    );
    // A second supervisor holding the old index entry finds the record moved.
    assert_eq!(f.decide(&t.next, expiry(due), due), Decision::Ignore(Ignored::Moved));
}

#[test]
fn status_events_follow_the_configuration() {
    let mut f = Fixture::new();
    f.config.status_events = crate::events::StatusKinds::default();
    let t = f.apply(
        &f.new_record(),
        Input::Claim { attempt: 0, owner: "s", message: "start-copy" },
        T0,
    );
    assert_eq!(
        t.effects,
        vec![Effect::Dispatch { step: cursor(&t.next) }],
        "processing is not a terminal kind"
    );
    f.config.status_events = crate::events::StatusKinds::none();
    let r = f.claim(&f.new_record(), T0);
    let t = f.reply(&r, StepOutcome::failed("no"), T0);
    assert_eq!(t.effects, vec![Effect::Alert], "alerts are not optional");
}

#[test]
fn the_timeline_keeps_the_first_and_latest_entries() {
    let f = Fixture {
        config: EngineConfig { failure_threshold: 50, timeline_limit: 5, ..Fixture::new().config },
        ..Fixture::new()
    };
    let mut r = f.claim(&f.new_record(), T0);
    for _ in 0..10 {
        let now = r.earliest_lease().unwrap();
        r = f.claim(&f.expire(&r, now).next, now.plus(secs(300)));
    }
    assert_eq!(r.timeline.len(), 5);
    assert_eq!(r.timeline[0].what, Happening::Received);
    assert_eq!(r.timeline[4].what, Happening::Claimed);
}

#[test]
fn a_second_copy_of_an_applied_reply_is_ignored_not_replayed() {
    // Replaying on every copy would dispatch the next step once per copy, and each of those
    // dispatches would produce more copies: duplicates must stay duplicates.
    let f = Fixture::new();
    let r = f.claim(&f.new_record(), T0);
    let step = step_ref(&r);
    let done = StepOutcome::done(json!({}));
    let original = format!("reply-{}", r.attempt);
    let next = f.done(&r, T0);
    let copy = Input::Reply { attempt: r.attempt, step: &step, outcome: &done, message: "copy" };
    assert_eq!(
        f.decide(&next, copy, T0),
        Decision::Ignore(Ignored::Stale { received: r.attempt, current: next.attempt })
    );
    let same = Input::Reply { attempt: r.attempt, step: &step, outcome: &done, message: &original };
    assert_eq!(f.decide(&next, same, T0), Decision::Replay(vec![Effect::Dispatch { step: 1 }]));
}

#[test]
fn a_corrupt_record_is_refused_not_decided_on() {
    let f = Fixture::new();
    let mut r = f.claim(&f.new_record(), T0);
    r.steps[0].lease = None;
    let step = StepRef { index: 99, name: "x".into(), direction: Direction::Do, element: None };
    let done = StepOutcome::done(json!({}));
    for input in [
        Input::Reply { attempt: r.attempt, step: &step, outcome: &done, message: "m" },
        expiry(r.complete_by.unwrap()),
        Input::Claim { attempt: r.attempt, owner: "s", message: "m" },
    ] {
        assert!(matches!(f.decide(&r, input, T0), Decision::Illegal(Illegal::Corrupt { .. })));
    }
}

mod branches;
mod callbacks;
mod commands;
mod reports;
mod waits;

/// One recorded metric: its name, its labels, and its value as text.
type Recorded = (String, Vec<(String, String)>, String);

/// What `crate::metrics` recorded for each transition's (before, after) pair.
fn recorded(pairs: &[(&StateRecord, &StateRecord)]) -> Vec<Recorded> {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        for (before, after) in pairs {
            crate::metrics::saved(before, after);
        }
    });
    let mut out: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let labels = key.labels().map(|l| (l.key().to_owned(), l.value().to_owned())).collect();
            let value = match value {
                DebugValue::Counter(n) => n.to_string(),
                DebugValue::Gauge(g) => g.to_string(),
                DebugValue::Histogram(h) => format!("{h:?}"),
            };
            (key.name().to_owned(), labels, value)
        })
        .collect();
    out.sort();
    out
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

/// An order's records through a reservation (1 s), a payment refused (2 s later) and the
/// reservation released (4 s later): new, claimed, reserved, refused, released.
fn declined_and_released(f: &Fixture) -> [StateRecord; 5] {
    let new = f.new_record();
    let claimed = f.claim(&new, T0);
    let reserved = f.done(&claimed, T0.plus(secs(1)));
    let refused = f.reply(&reserved, StepOutcome::failed("card declined"), T0.plus(secs(3))).next;
    let released = f.reply(&refused, StepOutcome::done(json!({})), T0.plus(secs(7))).next;
    [new, claimed, reserved, refused, released]
}

#[test]
fn each_transition_is_counted_and_timed_from_the_timeline_it_adds() {
    let f = Fixture::new();
    let [new, claimed, reserved, refused, released] = declined_and_released(&f);
    assert_eq!(released.process_state, ProcessState::Error);
    let got = recorded(&[
        (&new, &claimed),
        (&claimed, &reserved),
        (&reserved, &refused),
        (&refused, &released),
    ]);
    let seconds = |s: f64| format!("[{s:?}]");
    assert_eq!(
        got,
        vec![
            ("OrdersEnded".into(), labels(&[("outcome", "compensated")]), "1".into()),
            (
                "StepDuration".into(),
                labels(&[("step", "charge-payment"), ("outcome", "refused")]),
                seconds(2.0)
            ),
            (
                "StepDuration".into(),
                labels(&[("step", "reserve-inventory"), ("outcome", "done")]),
                seconds(1.0)
            ),
            (
                "StepDuration".into(),
                labels(&[("step", "reserve-inventory"), ("outcome", "undone")]),
                seconds(4.0)
            ),
            ("TimeToTerminal".into(), labels(&[("outcome", "compensated")]), seconds(7.0)),
        ]
    );

    // A lease that expires with every queue empty counts against the step.
    let t = f.expire(&claimed, claimed.earliest_lease().unwrap().plus(secs(1)));
    let got = recorded(&[(&claimed, &t.next)]);
    assert_eq!(got, vec![("LeaseExpiries".into(), labels(&[("counted", "yes")]), "1".into())]);
}

#[test]
fn an_ended_order_is_printed_at_once_with_its_end_already_counted() {
    use metrics_util::debugging::DebuggingRecorder;
    use std::cell::RefCell;
    thread_local! {
        /// What the recorder held at each print on this thread: how many `OrdersEnded` and
        /// `TimeToTerminal` series.
        static PRINTS: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
        static SNAPSHOTTER: RefCell<Option<metrics_util::debugging::Snapshotter>> =
            const { RefCell::new(None) };
    }
    fn print() {
        let ends = SNAPSHOTTER.with_borrow(|s| {
            s.as_ref().map_or(0, |s| {
                s.snapshot()
                    .into_vec()
                    .iter()
                    .filter(|(k, ..)| ["OrdersEnded", "TimeToTerminal"].contains(&k.key().name()))
                    .count()
            })
        });
        PRINTS.with_borrow_mut(|p| p.push(ends));
    }
    crate::metrics::print_ends_at_once(print);

    let f = Fixture::new();
    let [new, claimed, reserved, refused, released] = declined_and_released(&f);
    let recorder = DebuggingRecorder::new();
    SNAPSHOTTER.with_borrow_mut(|s| *s = Some(recorder.snapshotter()));
    metrics::with_local_recorder(&recorder, || {
        for (before, after) in [(&new, &claimed), (&claimed, &reserved), (&reserved, &refused)] {
            crate::metrics::saved(before, after);
        }
        assert_eq!(PRINTS.with_borrow(Vec::len), 0, "no order ended yet: nothing printed early");
        crate::metrics::saved(&refused, &released);
    });
    assert_eq!(
        PRINTS.with_borrow(Vec::clone),
        vec![2],
        "one print, right after the write that ended the order, with its count and time in it"
    );
}

#[test]
fn a_record_whose_step_the_workflow_no_longer_has_is_refused_naming_it() {
    // A record written under a workflow whose step was since renamed or removed.
    let f = Fixture::new();
    let mut r = f.new_record();
    r.steps[0].name = "renamed-away".into();
    let claim = Input::Claim { attempt: r.attempt, owner: "scheduler-a", message: "start-0" };
    assert_eq!(
        f.decide(&r, claim, T0),
        Decision::Illegal(Illegal::UnknownStep { step: "renamed-away".into() })
    );
}

mod holds;
