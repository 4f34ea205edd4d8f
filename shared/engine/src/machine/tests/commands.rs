//! Operator commands: every row of the second table, the refusals, and repeats of one command.

use super::*;
use crate::state::{CommandKind, Stop};

const BY: &str = "arn:aws:iam::123456789012:user/ops";

impl Fixture {
    pub(super) fn command(
        &self,
        record: &StateRecord,
        kind: CommandKind,
        id: &str,
        now: Timestamp,
    ) -> Decision {
        let input = Input::Command {
            command: kind,
            id,
            by: BY,
            reason: "customer asked",
            after: Duration::ZERO,
        };
        self.decide(record, input, now)
    }

    /// Applies a command that must be accepted, and checks the record's invariants.
    pub(super) fn order(
        &self,
        record: &StateRecord,
        kind: CommandKind,
        id: &str,
        now: Timestamp,
    ) -> Transition {
        match self.command(record, kind, id, now) {
            Decision::Apply(t) => {
                t.next.check().unwrap();
                assert_eq!(t.next.revision, record.revision + 1);
                assert_eq!(t.next.last_input, InputRef::Command(id.into()));
                assert_eq!(
                    t.next.commands.last().map(|c| (c.id.as_str(), c.command)),
                    Some((id, kind))
                );
                *t
            }
            other => panic!("expected {kind:?} to apply, got {other:?}"),
        }
    }

    fn refused(&self, record: &StateRecord, kind: CommandKind, now: Timestamp) -> Refused {
        match self.command(record, kind, "refused-cmd", now) {
            Decision::Refuse(r) => r,
            other => panic!("expected {kind:?} to be refused, got {other:?}"),
        }
    }

    fn failed(&self, record: &StateRecord, reason: &str, now: Timestamp) -> StateRecord {
        self.reply(record, StepOutcome::failed(reason), now).next
    }

    /// An order whose shipping timed out for good: nothing can undo it, the other two steps
    /// were undone.
    fn shipping_timed_out(&self) -> StateRecord {
        let mut r = self.claim(&self.new_record(), T0);
        r = self.done(&r, T0);
        r = self.done(&r, T0);
        for _ in 0..self.config.failure_threshold {
            let at = r.earliest_lease().unwrap().plus(secs(1));
            r = self.expire(&r, at).next;
            if r.process_state == ProcessState::Pending && r.phase == Phase::Forward {
                r = self.claim(&r, at);
            }
        }
        r = self.claim(&r, T0.plus(secs(3000)));
        r = self.done(&r, T0.plus(secs(3001)));
        r = self.done(&r, T0.plus(secs(3002)));
        assert_eq!(r.process_state, ProcessState::Error);
        r
    }

    /// An order whose payment was refused and whose inventory was released: Error, compensated.
    fn compensated(&self) -> StateRecord {
        let mut r = self.claim(&self.new_record(), T0);
        r = self.done(&r, T0.plus(secs(1)));
        r = self.failed(&r, "card declined", T0.plus(secs(2)));
        r = self.done(&r, T0.plus(secs(3)));
        assert_eq!(r.process_state, ProcessState::Error);
        r
    }
}

fn who(record: &StateRecord, what: Happening) -> Option<(String, String)> {
    record
        .timeline
        .iter()
        .rev()
        .find(|e| e.what == what)
        .and_then(|e| Some((e.by.clone()?, e.reason.clone()?)))
}

#[test]
fn cancelling_an_order_nobody_claimed_ends_it_at_once_without_an_alert() {
    let f = Fixture::new();
    let r = f.new_record();
    let t = f.order(&r, CommandKind::Cancel, "c-1", T0.plus(secs(1)));
    let c = &t.next;
    assert_eq!(c.process_state, ProcessState::Cancelled);
    assert_eq!((c.complete_by, c.alert, c.ended_at), (None, None, Some(T0.plus(secs(1)))));
    assert_eq!(c.cause, Some(Cause::Cancelled { by: BY.into(), reason: "customer asked".into() }));
    assert_eq!(t.effects, vec![Effect::Status { kind: StatusKind::Cancelled, step: None }]);
    assert_eq!(who(c, Happening::Cancelled), Some((BY.into(), "customer asked".into())));
    // Its start message, late, finds a finished order.
    let claim = Input::Claim { attempt: 0, owner: "s", message: "start-0" };
    assert_eq!(f.decide(c, claim, T0.plus(secs(2))), Decision::Ignore(Ignored::Terminal));
}

#[test]
fn a_cancel_waits_for_the_step_in_flight_then_undoes_in_reverse() {
    let f = Fixture::new();
    let mut r = f.claim(&f.new_record(), T0);
    r = f.done(&r, T0.plus(secs(1)));
    let t = f.order(&r, CommandKind::Cancel, "c-1", T0.plus(secs(2)));
    // Nothing is sent and the lease stands: the payment call is in flight.
    assert!(t.effects.is_empty());
    assert_eq!((t.next.process_state, t.next.attempt), (ProcessState::Processing, r.attempt));
    assert_eq!(t.next.stop.as_ref().map(|s| s.command), Some(CommandKind::Cancel));
    // Its reply is the safe point: the charge is done, and undone first.
    let t = f.reply(&t.next, StepOutcome::done(json!({"charge": "ch-1"})), T0.plus(secs(3)));
    let u = &t.next;
    assert_eq!(u.phase, Phase::Compensating);
    assert_eq!(u.stop, None);
    assert_eq!(step_statuses(u), [StepStatus::ToUndo, StepStatus::ToUndo, StepStatus::NotStarted]);
    assert_eq!(cursor(u), 1);
    assert_eq!(statuses(&t.effects), [StatusKind::StepDone, StatusKind::Compensating]);
    assert_eq!(t.effects.last(), Some(&Effect::Dispatch { step: cursor(&t.next) }));
    let refunded = f.done(u, T0.plus(secs(4)));
    let t = f.reply(&refunded, StepOutcome::done(json!({})), T0.plus(secs(5)));
    assert_eq!(t.next.process_state, ProcessState::Cancelled);
    assert_eq!(
        step_statuses(&t.next),
        [StepStatus::Undone, StepStatus::Undone, StepStatus::NotStarted]
    );
    assert_eq!(statuses(&t.effects), [StatusKind::Cancelled]);
    assert_eq!(alerts(&t.effects), 0, "the operator asked for it");
}

#[test]
fn a_cancelled_step_that_fails_leaves_only_the_earlier_ones_to_undo() {
    let f = Fixture::new();
    let mut r = f.claim(&f.new_record(), T0);
    r = f.done(&r, T0.plus(secs(1)));
    r = f.order(&r, CommandKind::Cancel, "c-1", T0.plus(secs(2))).next;
    r = f.failed(&r, "card declined", T0.plus(secs(3)));
    assert_eq!(step_statuses(&r), [StepStatus::ToUndo, StepStatus::Failed, StepStatus::NotStarted]);
    assert!(matches!(r.cause, Some(Cause::Cancelled { .. })), "the order ends as the operator's");
    let t = f.reply(&r, StepOutcome::done(json!({})), T0.plus(secs(4)));
    assert_eq!(t.next.process_state, ProcessState::Cancelled);
}

#[test]
fn a_cancel_waiting_for_the_last_step_comes_too_late() {
    let f = Fixture::new();
    let mut r = f.claim(&f.new_record(), T0);
    r = f.done(&r, T0);
    r = f.done(&r, T0);
    r = f.order(&r, CommandKind::Cancel, "c-1", T0.plus(secs(1))).next;
    let t = f.reply(&r, StepOutcome::done(json!({})), T0.plus(secs(2)));
    assert_eq!(t.next.process_state, ProcessState::Processed);
    assert_eq!(t.next.stop, None);
    assert_eq!(alerts(&t.effects), 0);
}

#[test]
fn a_cancelled_step_whose_lease_expires_is_undone_without_retries() {
    let f = Fixture::new();
    let mut r = f.claim(&f.new_record(), T0);
    r = f.done(&r, T0.plus(secs(1)));
    r = f.order(&r, CommandKind::Cancel, "c-1", T0.plus(secs(2))).next;
    let t = f.expire(&r, r.earliest_lease().unwrap().plus(secs(1)));
    let u = &t.next;
    // The charge may have gone through with its answer lost: it is refunded too.
    assert_eq!(step_statuses(u), [StepStatus::ToUndo, StepStatus::ToUndo, StepStatus::NotStarted]);
    assert_eq!(
        (u.process_state, u.phase, cursor(u)),
        (ProcessState::Pending, Phase::Compensating, 1)
    );
    assert_eq!(
        t.effects.last(),
        Some(&Effect::Kick { delay: Duration::ZERO, attempt: t.next.attempt })
    );
    assert!(matches!(u.cause, Some(Cause::Cancelled { .. })));
}

#[test]
fn a_cancel_after_an_expired_lease_treats_the_step_as_uncertain() {
    let f = Fixture::new();
    let mut r = f.claim(&f.new_record(), T0);
    r = f.done(&r, T0);
    r = f.done(&r, T0);
    // Shipping (no compensation) timed out once and waits for its retry.
    r = f.expire(&r, r.earliest_lease().unwrap().plus(secs(1))).next;
    assert_eq!((r.process_state, r.failure_count), (ProcessState::Pending, 1));
    let t = f.order(&r, CommandKind::Cancel, "c-1", r.complete_by.unwrap());
    let u = &t.next;
    assert_eq!(step_statuses(u), [StepStatus::ToUndo, StepStatus::ToUndo, StepStatus::Uncertain]);
    // Undo what can be undone; what cannot ends in Error, with the operator told.
    let mut u = f.claim(u, T0.plus(secs(400)));
    u = f.done(&u, T0.plus(secs(401)));
    let t = f.reply(&u, StepOutcome::done(json!({})), T0.plus(secs(402)));
    assert_eq!(t.next.process_state, ProcessState::Error);
    assert_eq!(t.next.needs_manual_undo(), ["ship"]);
    assert_eq!(alerts(&t.effects), 1);
}

#[test]
fn a_cancel_whose_undo_fails_ends_in_error_and_its_compensation_can_be_redriven() {
    let f = Fixture::new();
    let mut r = f.claim(&f.new_record(), T0);
    r = f.done(&r, T0);
    r = f.order(&r, CommandKind::Cancel, "c-1", T0).next;
    r = f.done(&r, T0.plus(secs(1)));
    r = f.failed(&r, "refund window closed", T0.plus(secs(2)));
    let t = f.reply(&r, StepOutcome::done(json!({})), T0.plus(secs(3)));
    let e = t.next;
    assert_eq!(e.process_state, ProcessState::Error);
    assert_eq!(alerts(&t.effects), 1);
    assert_eq!(e.needs_manual_undo(), ["charge-payment"]);
    // Not forward: the operator wanted it stopped.
    assert!(matches!(
        f.refused(&e, CommandKind::Redrive, T0.plus(secs(4))),
        Refused::WasCancelled { .. }
    ));
    let t = f.order(&e, CommandKind::RedriveCompensation, "rc-1", T0.plus(secs(5)));
    let p = &t.next;
    assert_eq!(
        (p.process_state, p.phase, cursor(p)),
        (ProcessState::Pending, Phase::Compensating, 1)
    );
    assert_eq!(p.steps[1].status, StepStatus::ToUndo);
    assert_eq!(p.steps[1].generation, 0, "an undo is retried under its own key");
    assert_eq!((p.alert, p.ended_at, p.redrives), (None, None, 1));
    assert_eq!(t.effects, vec![Effect::Kick { delay: Duration::ZERO, attempt: t.next.attempt }]);
    let claimed = f.claim(p, T0.plus(secs(6)));
    let t = f.reply(&claimed, StepOutcome::done(json!({})), T0.plus(secs(7)));
    assert_eq!(t.next.process_state, ProcessState::Cancelled);
    assert_eq!(alerts(&t.effects), 0);
}

#[test]
fn cancel_is_refused_where_it_does_not_apply() {
    let f = Fixture::new();
    let now = T0.plus(secs(10));
    let mut processed = f.claim(&f.new_record(), T0);
    for _ in 0..3 {
        processed = f.done(&processed, T0);
    }
    assert_eq!(
        f.refused(&processed, CommandKind::Cancel, now),
        Refused::Finished { state: ProcessState::Processed, command: CommandKind::Cancel }
    );
    let error = f.compensated();
    assert!(matches!(f.refused(&error, CommandKind::Cancel, now), Refused::Finished { .. }));
    let mut undoing = f.claim(&f.new_record(), T0);
    undoing = f.done(&undoing, T0);
    undoing = f.failed(&undoing, "declined", T0);
    assert_eq!(
        f.refused(&undoing, CommandKind::Cancel, now),
        Refused::Undoing { state: ProcessState::Processing }
    );
    let waiting = f.order(&f.claim(&f.new_record(), T0), CommandKind::Cancel, "c-1", now).next;
    assert_eq!(f.refused(&waiting, CommandKind::Cancel, now), Refused::Cancelling);
    assert_eq!(f.refused(&waiting, CommandKind::Pause, now), Refused::Cancelling);
    let cancelled = f.order(&f.new_record(), CommandKind::Cancel, "c-2", now).next;
    assert!(matches!(f.refused(&cancelled, CommandKind::Cancel, now), Refused::Finished { .. }));
    assert!(matches!(f.refused(&cancelled, CommandKind::Redrive, now), Refused::Finished { .. }));
    // A refusal names the state, in words an operator reads.
    assert_eq!(
        Refused::Finished { state: ProcessState::Processed, command: CommandKind::Cancel }
            .to_string(),
        "the order is Processed: there is nothing left to cancel"
    );
}

#[test]
fn the_same_command_id_is_applied_once() {
    let f = Fixture::new();
    let r = f.claim(&f.new_record(), T0);
    let paused = f.order(&r, CommandKind::Pause, "p-1", T0).next;
    // Sent again right after: its write was the last, so its (empty) effects are replayed.
    assert_eq!(f.command(&paused, CommandKind::Pause, "p-1", T0), Decision::Replay(Vec::new()));
    let resumed = f.order(&paused, CommandKind::Resume, "r-1", T0).next;
    assert_eq!(
        f.command(&resumed, CommandKind::Pause, "p-1", T0),
        Decision::Ignore(Ignored::AlreadyApplied)
    );
    assert_eq!(
        f.command(&resumed, CommandKind::Cancel, "p-1", T0),
        Decision::Refuse(Refused::IdReused { id: "p-1".into(), earlier: CommandKind::Pause })
    );
    // A redrive's lost start message is sent again when the command is repeated.
    let redriven = f.order(&f.compensated(), CommandKind::Redrive, "d-1", T0.plus(secs(9))).next;
    assert_eq!(
        f.command(&redriven, CommandKind::Redrive, "d-1", T0.plus(secs(10))),
        Decision::Replay(vec![Effect::Kick { delay: Duration::ZERO, attempt: redriven.attempt }])
    );
}

#[test]
fn only_the_latest_commands_are_kept() {
    let f = Fixture::new();
    let mut r = f.claim(&f.new_record(), T0);
    for i in 0..COMMANDS_KEPT + 3 {
        r = f.order(&r, CommandKind::Pause, &format!("p-{i}"), T0).next;
        r = f.order(&r, CommandKind::Resume, &format!("r-{i}"), T0).next;
    }
    assert_eq!(r.commands.len(), COMMANDS_KEPT);
    assert_eq!(r.commands.last().unwrap().id, format!("r-{}", COMMANDS_KEPT + 2));
}

#[test]
fn pausing_an_order_nobody_claimed_holds_it_at_once_and_fences_its_start() {
    let f = Fixture::new();
    let r = f.new_record();
    let t = f.order(&r, CommandKind::Pause, "p-1", T0.plus(secs(1)));
    let p = &t.next;
    assert_eq!((p.process_state, p.complete_by, p.attempt), (ProcessState::Paused, None, 1));
    assert!(t.effects.is_empty());
    let start = Input::Claim { attempt: 0, owner: "s", message: "start-0" };
    assert_eq!(f.decide(p, start, T0.plus(secs(2))), Decision::Ignore(Ignored::Paused));
    assert_eq!(f.refused(p, CommandKind::Pause, T0), Refused::AlreadyPaused);
    let t = f.order(p, CommandKind::Resume, "r-1", T0.plus(secs(100)));
    let q = &t.next;
    assert_eq!((q.process_state, q.attempt), (ProcessState::Pending, 2));
    assert_eq!(q.complete_by, Some(T0.plus(secs(100 + 30 + 30))));
    assert_eq!(t.effects, vec![Effect::Kick { delay: Duration::ZERO, attempt: t.next.attempt }]);
    assert_eq!(who(q, Happening::Resumed), Some((BY.into(), "customer asked".into())));
    assert_eq!(q.watched_since(), T0.plus(secs(100)), "the pause is no hold-up");
    let claimed = f.claim(q, T0.plus(secs(101)));
    assert_eq!(claimed.process_state, ProcessState::Processing);
}

#[test]
fn a_pause_lets_the_step_in_flight_finish_and_holds_the_order_before_the_next() {
    let f = Fixture::new();
    let r = f.claim(&f.new_record(), T0);
    let waiting = f.order(&r, CommandKind::Pause, "p-1", T0.plus(secs(1))).next;
    assert_eq!(
        waiting.stop,
        Some(Stop { command: CommandKind::Pause, by: BY.into(), reason: "customer asked".into() })
    );
    let t = f.reply(&waiting, StepOutcome::done(json!({"r": 1})), T0.plus(secs(2)));
    let p = &t.next;
    assert_eq!(
        (p.process_state, cursor(p), p.complete_by, p.stop.as_ref()),
        (ProcessState::Paused, 1, None, None)
    );
    assert_eq!(p.steps[0].status, StepStatus::Done);
    assert_eq!(statuses(&t.effects), [StatusKind::StepDone]);
    assert!(
        !t.effects.iter().any(|e| matches!(e, Effect::Dispatch { .. })),
        "nothing is sent while paused"
    );
    // Resumed, it goes on with payment and ends as if it had never stopped.
    let mut q = f.order(p, CommandKind::Resume, "r-1", T0.plus(secs(60))).next;
    q = f.claim(&q, T0.plus(secs(61)));
    assert_eq!(q.steps[cursor(&q)].name, "charge-payment");
    q = f.done(&q, T0.plus(secs(62)));
    q = f.done(&q, T0.plus(secs(63)));
    assert_eq!(q.process_state, ProcessState::Processed);
}

#[test]
fn a_waiting_pause_can_be_withdrawn() {
    let f = Fixture::new();
    let r = f.claim(&f.new_record(), T0);
    let waiting = f.order(&r, CommandKind::Pause, "p-1", T0).next;
    assert_eq!(f.refused(&waiting, CommandKind::Pause, T0), Refused::Pausing);
    let t = f.order(&waiting, CommandKind::Resume, "r-1", T0);
    assert!(t.effects.is_empty());
    assert_eq!((t.next.stop.as_ref(), t.next.attempt), (None, r.attempt));
    let next = f.done(&t.next, T0.plus(secs(1)));
    assert_eq!((next.process_state, cursor(&next)), (ProcessState::Processing, 1));
    assert_eq!(
        f.refused(&next, CommandKind::Resume, T0),
        Refused::NotPaused { state: ProcessState::Processing }
    );
}

#[test]
fn a_paused_step_whose_lease_expires_is_held_with_its_failure_counted() {
    let f = Fixture::new();
    let r = f.claim(&f.new_record(), T0);
    let waiting = f.order(&r, CommandKind::Pause, "p-1", T0).next;
    let t = f.expire(&waiting, r.earliest_lease().unwrap().plus(secs(1)));
    assert_eq!((t.next.process_state, t.next.failure_count), (ProcessState::Paused, 1));
    assert!(t.effects.is_empty());
    // A late reply of the old lease changes nothing.
    let step = step_ref(&r);
    let done = StepOutcome::done(json!({}));
    let late = Input::Reply { attempt: r.attempt, step: &step, outcome: &done, message: "late" };
    assert!(matches!(
        f.decide(&t.next, late, T0.plus(secs(99))),
        Decision::Ignore(Ignored::Stale { .. })
    ));
}

#[test]
fn a_redrive_runs_a_compensated_order_again_from_the_start_under_new_keys() {
    let f = Fixture::new();
    let e = f.compensated();
    assert_eq!(step_statuses(&e), [StepStatus::Undone, StepStatus::Failed, StepStatus::NotStarted]);
    let now = T0.plus(secs(3600));
    let t = f.order(&e, CommandKind::Redrive, "d-1", now);
    let p = &t.next;
    assert_eq!((p.process_state, p.phase, cursor(p)), (ProcessState::Pending, Phase::Forward, 0));
    assert_eq!((p.cause.as_ref(), p.alert, p.ended_at, p.failure_count), (None, None, None, 0));
    assert!(p.steps.iter().all(|s| s.status == StepStatus::NotStarted));
    assert_eq!(p.steps.iter().map(|s| s.generation).collect::<Vec<_>>(), [1, 1, 0]);
    assert_eq!(p.attempt, e.attempt + 1);
    assert_eq!(t.effects, vec![Effect::Kick { delay: Duration::ZERO, attempt: t.next.attempt }]);
    assert_eq!(who(p, Happening::Redriven), Some((BY.into(), "customer asked".into())));
    assert_eq!(p.watched_since(), now, "the hour in Error is no hold-up");
    let mut q = f.claim(p, now.plus(secs(1)));
    for _ in 0..3 {
        q = f.done(&q, now.plus(secs(2)));
    }
    assert_eq!(q.process_state, ProcessState::Processed);
    assert_eq!(q.redrives, 1);
}

#[test]
fn a_command_spread_by_a_bulk_command_starts_its_steps_after_its_delay() {
    let f = Fixture::new();
    let e = f.compensated();
    let now = T0.plus(secs(3600));
    let redrive = Input::Command {
        command: CommandKind::Redrive,
        id: "bulk-1",
        by: BY,
        reason: "the bank is back",
        after: secs(7),
    };
    let Decision::Apply(t) = f.decide(&e, redrive, now) else { panic!("not applied") };
    t.next.check().unwrap();
    assert_eq!(t.effects, vec![Effect::Kick { delay: secs(7), attempt: t.next.attempt }]);
    // Its lease counts from the start message's arrival, not from the command.
    let undelayed = f.order(&e, CommandKind::Redrive, "d-1", now).next;
    let lease = t.next.steps[0].lease.unwrap();
    assert_eq!(lease.complete_by, undelayed.steps[0].lease.unwrap().complete_by.plus(secs(7)));
    assert!(!lease.sent);
}

#[test]
fn a_redrive_keeps_the_key_of_a_step_whose_outcome_is_unknown() {
    let f = Fixture::new();
    let r = f.shipping_timed_out();
    assert_eq!(step_statuses(&r), [StepStatus::Undone, StepStatus::Undone, StepStatus::Uncertain]);
    let p = f.order(&r, CommandKind::Redrive, "d-1", T0.plus(secs(4000))).next;
    // The service answers the shipment it may have made under its old key, not a second one.
    assert_eq!(p.steps.iter().map(|s| s.generation).collect::<Vec<_>>(), [1, 1, 0]);
}

#[test]
fn a_redrive_skips_a_step_that_stayed_done() {
    let mut f = Fixture::new();
    let agents = ["inventory", "payment", "shipping"].map(AgentName::new);
    f.workflow = Workflow::from_json(
        r#"{"name":"w","steps":[
            {"name":"reserve","agent":"inventory","compensation":{"action":"release"}},
            {"name":"notify","agent":"shipping"},
            {"name":"charge","agent":"payment","compensation":{"action":"refund"}}]}"#,
        &agents,
    )
    .unwrap();
    let mut r = f.claim(&f.new_record(), T0);
    r = f.done(&r, T0);
    r = f.done(&r, T0);
    r = f.failed(&r, "declined", T0);
    r = f.done(&r, T0.plus(secs(1)));
    assert_eq!(step_statuses(&r), [StepStatus::Undone, StepStatus::Done, StepStatus::Failed]);
    let mut p = f.order(&r, CommandKind::Redrive, "d-1", T0.plus(secs(2))).next;
    assert_eq!(
        step_statuses(&p),
        [StepStatus::NotStarted, StepStatus::Done, StepStatus::NotStarted]
    );
    p = f.claim(&p, T0.plus(secs(3)));
    p = f.done(&p, T0.plus(secs(4)));
    assert_eq!(p.steps[cursor(&p)].name, "charge", "the notification is not sent twice");
    p = f.done(&p, T0.plus(secs(5)));
    assert_eq!(p.process_state, ProcessState::Processed);
}

#[test]
fn redrive_is_refused_where_it_does_not_apply() {
    let f = Fixture::new();
    let in_flight = f.claim(&f.new_record(), T0);
    assert_eq!(
        f.refused(&in_flight, CommandKind::Redrive, T0),
        Refused::NotFailed { state: ProcessState::Processing }
    );
    let e = f.compensated();
    assert_eq!(
        f.refused(&e, CommandKind::RedriveCompensation, T0.plus(secs(5))),
        Refused::NothingToUndo
    );
    let late = e.ended_at.unwrap().plus(f.config.redrive_window).plus(secs(1));
    assert!(matches!(f.refused(&e, CommandKind::Redrive, late), Refused::TooLate { .. }));
    // A refused undo must be retried before the order can go forward again.
    let mut u = f.claim(&f.new_record(), T0);
    u = f.done(&u, T0);
    u = f.failed(&u, "declined", T0);
    u = f.failed(&u, "stock gone", T0);
    assert_eq!(
        f.refused(&u, CommandKind::Redrive, T0),
        Refused::UndoFailed { steps: vec!["reserve-inventory".into()] }
    );
}

#[test]
fn a_resubmission_starts_the_order_again_only_while_nobody_claimed_it() {
    let f = Fixture::new();
    let r = f.new_record();
    let started = f.decide(&r, Input::Resubmit, T0);
    assert_eq!(
        started,
        Decision::Replay(vec![
            Effect::Kick { delay: Duration::ZERO, attempt: 0 },
            Effect::Status { kind: StatusKind::Received, step: None }
        ])
    );
    let claimed = f.claim(&r, T0);
    assert_eq!(f.decide(&claimed, Input::Resubmit, T0), Decision::Ignore(Ignored::Started));
}

#[test]
fn illegal_inputs_go_to_a_dead_letter_queue_only_when_a_message_carried_them() {
    let step = StepRef { index: 0, name: "x".into(), direction: Direction::Do, element: None };
    let done = StepOutcome::done(json!({}));
    assert_eq!(remedy(&Input::Claim { attempt: 0, owner: "s", message: "m" }), Remedy::DeadLetter);
    let reply = Input::Reply { attempt: 0, step: &step, outcome: &done, message: "m" };
    assert_eq!(remedy(&reply), Remedy::DeadLetter);
    assert_eq!(remedy(&expiry(T0)), Remedy::Report);
    assert_eq!(remedy(&Input::AlertSent), Remedy::Report);
    let cancel = Input::Command {
        command: CommandKind::Cancel,
        id: "c",
        by: BY,
        reason: "r",
        after: Duration::ZERO,
    };
    assert_eq!(remedy(&cancel), Remedy::Report);
}

#[test]
fn a_paused_order_cancelled_undoes_only_what_was_sent() {
    let f = Fixture::new();
    let r = f.claim(&f.new_record(), T0);
    let waiting = f.order(&r, CommandKind::Pause, "p-1", T0).next;
    let paused = f.done(&waiting, T0.plus(secs(1)));
    assert_eq!(paused.process_state, ProcessState::Paused);
    assert!(!paused.steps[1].dispatched, "the payment request was held back");
    let t = f.order(&paused, CommandKind::Cancel, "c-1", T0.plus(secs(2)));
    assert_eq!(
        step_statuses(&t.next),
        [StepStatus::ToUndo, StepStatus::NotStarted, StepStatus::NotStarted]
    );
}

#[test]
fn a_redriven_step_of_unknown_outcome_is_reported_if_the_order_is_then_cancelled() {
    let f = Fixture::new();
    let e = f.shipping_timed_out();
    let mut p = f.order(&e, CommandKind::Redrive, "d-1", T0.plus(secs(4000))).next;
    assert!(p.steps[2].dispatched && !p.steps[0].dispatched);
    p = f.claim(&p, T0.plus(secs(4001)));
    p = f.done(&p, T0.plus(secs(4002)));
    p = f.order(&p, CommandKind::Pause, "p-1", T0.plus(secs(4003))).next;
    p = f.done(&p, T0.plus(secs(4004)));
    assert_eq!((p.process_state, cursor(&p)), (ProcessState::Paused, 2));
    // The shipment may have been made under the key the redrive kept.
    p = f.order(&p, CommandKind::Cancel, "c-1", T0.plus(secs(4005))).next;
    assert_eq!(p.steps[2].status, StepStatus::Uncertain);
}

#[test]
fn a_step_of_unknown_outcome_stays_on_the_list_when_its_redrive_fails_before_it() {
    let f = Fixture::new();
    let e = f.shipping_timed_out();
    assert_eq!(e.needs_manual_undo(), ["ship"]);
    let mut p = f.order(&e, CommandKind::Redrive, "d-1", T0.plus(secs(4000))).next;
    p = f.claim(&p, T0.plus(secs(4001)));
    p = f.done(&p, T0.plus(secs(4002)));
    p = f.failed(&p, "card declined", T0.plus(secs(4003)));
    p = f.done(&p, T0.plus(secs(4004)));
    assert_eq!(p.process_state, ProcessState::Error);
    assert_eq!(
        p.needs_manual_undo(),
        ["ship"],
        "the first run's shipment is still unaccounted for"
    );
}

#[test]
fn a_processed_order_undone_undoes_its_steps_last_first_and_leaves_what_has_no_undo_listed() {
    let f = Fixture::new();
    let mut r = f.claim(&f.new_record(), T0);
    for n in 1..=3 {
        r = f.done(&r, T0.plus(secs(n)));
    }
    assert_eq!(r.process_state, ProcessState::Processed);
    let t = f.order(&r, CommandKind::Undo, "u-1", T0.plus(secs(10)));
    let u = &t.next;
    // Shipping has no undo; the charge, then the reservation, are queued for the scheduler.
    assert_eq!(
        (u.phase, u.process_state, u.ended_at),
        (Phase::Compensating, ProcessState::Pending, None)
    );
    assert_eq!(step_statuses(u), [StepStatus::ToUndo, StepStatus::ToUndo, StepStatus::Done]);
    assert_eq!(who(u, Happening::UndoRequested), Some((BY.into(), "customer asked".into())));
    assert!(matches!(t.effects.last(), Some(Effect::Kick { .. })), "{:?}", t.effects);
    // The same command again is the same undo; a second one finds the order under way.
    assert_eq!(
        f.command(u, CommandKind::Undo, "u-1", T0.plus(secs(11))),
        Decision::Replay(kicks(u))
    );
    assert_eq!(
        f.refused(u, CommandKind::Undo, T0.plus(secs(11))),
        Refused::NotProcessed { state: ProcessState::Pending }
    );
    let mut u = f.claim(u, T0.plus(secs(12)));
    assert_eq!(step_ref(&u).name, "charge-payment", "the last step with an undo goes first");
    u = f.done(&u, T0.plus(secs(13)));
    u = f.done(&u, T0.plus(secs(14)));
    // What could not be undone is left to the operators, with an alert.
    assert_eq!(u.process_state, ProcessState::Error);
    assert_eq!(step_statuses(&u), [StepStatus::Undone, StepStatus::Undone, StepStatus::Done]);
    assert_eq!(u.needs_manual_undo(), ["ship"]);
    assert_eq!(u.alert, Some(AlertDelivery::Pending));
}

#[test]
fn a_processed_order_whose_every_step_has_an_undo_ends_cancelled_once_undone() {
    let mut f = Fixture::new();
    let json = r#"{"name":"pair","steps":[
        {"name":"reserve-inventory","agent":"inventory","compensation":{"action":"release-inventory"}},
        {"name":"charge-payment","agent":"payment","compensation":{"action":"refund-payment"}}]}"#;
    f.workflow = Workflow::from_json(json, &Workflow::agents_in(json)).unwrap();
    let mut r = f.claim(&f.new_record(), T0);
    r = f.done(&r, T0.plus(secs(1)));
    r = f.done(&r, T0.plus(secs(2)));
    let u = f.order(&r, CommandKind::Undo, "u-1", T0.plus(secs(3))).next;
    let mut u = f.claim(&u, T0.plus(secs(4)));
    u = f.done(&u, T0.plus(secs(5)));
    let t = f.reply(&u, StepOutcome::done(json!({})), T0.plus(secs(6)));
    assert_eq!(t.next.process_state, ProcessState::Cancelled);
    assert_eq!(statuses(&t.effects), [StatusKind::Cancelled]);
    assert_eq!(alerts(&t.effects), 0, "an operator asked for it");
    assert_eq!(
        t.next.cause,
        Some(Cause::Cancelled { by: BY.into(), reason: "customer asked".into() })
    );
}

#[test]
fn only_a_processed_order_can_be_undone() {
    let f = Fixture::new();
    let pending = f.new_record();
    assert_eq!(
        f.refused(&pending, CommandKind::Undo, T0),
        Refused::NotProcessed { state: ProcessState::Pending }
    );
    let failed = f.compensated();
    assert_eq!(
        f.refused(&failed, CommandKind::Undo, T0.plus(secs(10))),
        Refused::NotProcessed { state: ProcessState::Error }
    );
}
