//! Steps that do not depend on each other: leased together, fenced one by one, awaited before
//! an order stops, and undone in reverse order of their dependencies.

use super::*;
use crate::state::CommandKind;

/// A trip: the flight and the hotel at once once the trip is opened, then the payment, which
/// waits for both.
fn trip() -> Fixture {
    let mut f = Fixture::new();
    f.workflow = Workflow::from_json(
        r#"{"name":"trip","steps":[
            {"name":"open","agent":"desk","compensation":{"action":"close"}},
            {"name":"flight","agent":"airline","depends_on":["open"],
             "compensation":{"action":"cancel-flight"}},
            {"name":"hotel","agent":"hotels","depends_on":["open"],
             "compensation":{"action":"cancel-room"}},
            {"name":"pay","agent":"desk","depends_on":["flight","hotel"]}]}"#,
        &[AgentName::new("desk"), AgentName::new("airline"), AgentName::new("hotels")],
    )
    .unwrap();
    f
}

const OPEN: usize = 0;
const FLIGHT: usize = 1;
const HOTEL: usize = 2;
const PAY: usize = 3;

impl Fixture {
    /// The reply of step `i`'s lease.
    pub(super) fn answer(
        &self,
        record: &StateRecord,
        i: usize,
        outcome: StepOutcome,
    ) -> Transition {
        let state = &record.steps[i];
        let step = StepRef {
            index: i,
            name: state.name.clone(),
            direction: state.direction(),
            element: None,
        };
        let attempt = state.lease.expect("the step holds a lease").attempt;
        let message = format!("reply-{}-{attempt}", state.name);
        let input = Input::Reply { attempt, step: &step, outcome: &outcome, message: &message };
        self.apply(record, input, record.updated_at)
    }

    pub(super) fn answer_done(&self, record: &StateRecord, i: usize) -> StateRecord {
        self.answer(record, i, StepOutcome::done(json!({"step": i}))).next
    }
}

/// The places of the steps whose lease was sent.
fn sent(record: &StateRecord) -> Vec<usize> {
    record.leased().filter(|(_, _, l)| l.sent).map(|(i, _, _)| i).collect()
}

fn dispatched(effects: &[Effect]) -> Vec<usize> {
    effects
        .iter()
        .filter_map(|e| if let Effect::Dispatch { step } = e { Some(*step) } else { None })
        .collect()
}

/// The order with the flight and the hotel both in flight.
fn both_in_flight(f: &Fixture) -> StateRecord {
    let r = f.claim(&f.new_record(), T0);
    f.answer_done(&r, OPEN)
}

#[test]
fn steps_that_depend_only_on_a_done_step_are_leased_together_each_under_its_own_attempt() {
    let f = trip();
    let r = f.new_record();
    assert_eq!(r.leased().map(|(i, _, _)| i).collect::<Vec<_>>(), [OPEN]);
    let r = f.claim(&r, T0);
    let t = f.answer(&r, OPEN, StepOutcome::done(json!({})));
    assert_eq!(dispatched(&t.effects), [FLIGHT, HOTEL], "both sent by the same write");
    let n = &t.next;
    assert_eq!(sent(n), [FLIGHT, HOTEL]);
    let (flight, hotel) = (n.steps[FLIGHT].lease.unwrap(), n.steps[HOTEL].lease.unwrap());
    assert_ne!(flight.attempt, hotel.attempt);
    assert_eq!(n.attempt, flight.attempt.max(hotel.attempt));
    assert_eq!(n.complete_by, Some(flight.complete_by.min(hotel.complete_by)));
}

#[test]
fn a_step_waits_for_every_step_it_depends_on() {
    let f = trip();
    let r = both_in_flight(&f);
    let t = f.answer(&r, HOTEL, StepOutcome::done(json!({})));
    assert!(dispatched(&t.effects).is_empty(), "the payment waits for the flight too");
    assert_eq!((sent(&t.next), t.next.process_state), (vec![FLIGHT], ProcessState::Processing));
    let t = f.answer(&t.next, FLIGHT, StepOutcome::done(json!({})));
    assert_eq!(dispatched(&t.effects), [PAY]);
    let done = f.answer_done(&t.next, PAY);
    assert_eq!(done.process_state, ProcessState::Processed);
}

#[test]
fn a_reply_moves_only_the_lease_it_names() {
    let f = trip();
    let r = both_in_flight(&f);
    let flight = r.steps[FLIGHT].lease.unwrap().attempt;
    let hotel =
        StepRef { index: HOTEL, name: "hotel".into(), direction: Direction::Do, element: None };
    let done = StepOutcome::done(json!({}));
    // The flight's attempt on the hotel's step: a forged or mixed-up message.
    let mixed = Input::Reply { attempt: flight, step: &hotel, outcome: &done, message: "m" };
    assert_eq!(
        f.decide(&r, mixed, T0),
        Decision::Illegal(Illegal::WrongStep { leased: "flight".into(), replied: "hotel".into() })
    );
    // An attempt of the hotel's no lease holds any more: stale.
    let old = Input::Reply { attempt: 1, step: &hotel, outcome: &done, message: "m" };
    assert!(matches!(f.decide(&r, old, T0), Decision::Ignore(Ignored::Stale { .. })));
}

#[test]
fn a_failure_starts_nothing_new_and_waits_for_the_steps_in_flight_before_undoing() {
    let f = trip();
    let r = both_in_flight(&f);
    assert!(!r.stopping());
    let t = f.answer(&r, FLIGHT, StepOutcome::failed("sold out"));
    let n = &t.next;
    assert!(t.effects.iter().all(|e| !matches!(e, Effect::Dispatch { .. } | Effect::Kick { .. })));
    assert_eq!(
        (n.process_state, n.phase, sent(n)),
        (ProcessState::Processing, Phase::Forward, vec![HOTEL])
    );
    assert!(matches!(n.cause, Some(Cause::StepRejected { .. })));
    assert!(n.stopping(), "shown as stopping while the hotel is in flight");
    // The hotel is booked after all: it is undone with the opening, the hotel first.
    let t = f.answer(n, HOTEL, StepOutcome::done(json!({"room": 12})));
    let n = &t.next;
    assert_eq!(n.phase, Phase::Compensating);
    assert!(!n.stopping(), "undoing now");
    assert_eq!(dispatched(&t.effects), [HOTEL], "the opening waits for the undo of the hotel");
    assert_eq!(n.steps[OPEN].status, StepStatus::ToUndo);
    let n = f.answer_done(n, HOTEL);
    assert_eq!(sent(&n), [OPEN]);
    let n = f.answer_done(&n, OPEN);
    assert_eq!(n.process_state, ProcessState::Error);
    assert_eq!(
        step_statuses(&n),
        [StepStatus::Undone, StepStatus::Failed, StepStatus::Undone, StepStatus::NotStarted]
    );
}

#[test]
fn independent_steps_are_undone_at_once_and_before_the_step_they_depend_on() {
    let f = trip();
    let r = both_in_flight(&f);
    let r = f.answer_done(&r, FLIGHT);
    let r = f.answer_done(&r, HOTEL);
    let t = f.answer(&r, PAY, StepOutcome::failed("card declined"));
    assert_eq!(dispatched(&t.effects), [FLIGHT, HOTEL], "both undone by the same write");
    let n = f.answer(&t.next, HOTEL, StepOutcome::failed("no refunds")).next;
    assert_eq!(sent(&n), [FLIGHT], "the opening still waits for the flight's undo");
    let t = f.answer(&n, FLIGHT, StepOutcome::done(json!({})));
    assert_eq!(dispatched(&t.effects), [OPEN]);
    let n = f.answer_done(&t.next, OPEN);
    assert_eq!(n.process_state, ProcessState::Error);
    assert_eq!(n.needs_manual_undo(), ["hotel"]);
}

#[test]
fn an_expired_lease_is_judged_alone_while_its_sibling_goes_on() {
    let f = trip();
    let r = both_in_flight(&f);
    let hotel_due = r.steps[HOTEL].lease.unwrap().complete_by;
    // The flight answers; the hotel's request is lost.
    let r = f.answer_done(&r, FLIGHT);
    assert_eq!(r.complete_by, Some(hotel_due));
    let t = f.expire(&r, hotel_due);
    let n = &t.next;
    let lease = n.steps[HOTEL].lease.unwrap();
    assert_eq!((lease.sent, lease.failures, n.process_state), (false, 1, ProcessState::Pending));
    assert_eq!(t.effects, [Effect::Kick { delay: f.config.wait.wait(1), attempt: lease.attempt }]);
    // Its start message leases the hotel alone.
    let claimed = f.claim(n, hotel_due.plus(secs(60)));
    assert_eq!(sent(&claimed), [HOTEL]);
    assert_eq!(claimed.steps[HOTEL].lease.unwrap().failures, 1);
}

#[test]
fn a_cancel_waits_for_every_step_in_flight_then_undoes_them_all() {
    let f = trip();
    let r = both_in_flight(&f);
    let r = f.order(&r, CommandKind::Cancel, "c-1", r.updated_at).next;
    assert_eq!((r.process_state, sent(&r)), (ProcessState::Processing, vec![FLIGHT, HOTEL]));
    let r = f.answer_done(&r, FLIGHT);
    assert_eq!((r.phase, r.cause.as_ref()), (Phase::Forward, None), "still waiting for the hotel");
    let t = f.answer(&r, HOTEL, StepOutcome::done(json!({})));
    assert!(matches!(t.next.cause, Some(Cause::Cancelled { .. })));
    assert_eq!(dispatched(&t.effects), [FLIGHT, HOTEL]);
    let r = f.answer_done(&f.answer_done(&t.next, FLIGHT), HOTEL);
    let r = f.answer_done(&r, OPEN);
    assert_eq!(r.process_state, ProcessState::Cancelled);
}

#[test]
fn a_pause_waits_for_the_steps_in_flight_and_a_resume_starts_what_is_free() {
    let f = trip();
    let r = both_in_flight(&f);
    let r = f.order(&r, CommandKind::Pause, "p-1", r.updated_at).next;
    let r = f.answer_done(&r, HOTEL);
    assert_eq!(r.process_state, ProcessState::Processing, "the flight is still in flight");
    let r = f.answer_done(&r, FLIGHT);
    assert_eq!(r.process_state, ProcessState::Paused, "the payment is not started");
    let t = f.order(&r, CommandKind::Resume, "r-1", r.updated_at);
    assert_eq!(t.next.leased().map(|(i, _, _)| i).collect::<Vec<_>>(), [PAY]);
    assert_eq!(t.effects, [Effect::Kick { delay: Duration::ZERO, attempt: t.next.attempt }]);
}

#[test]
fn a_redrive_runs_again_only_the_steps_that_failed_or_were_undone() {
    let f = trip();
    let r = both_in_flight(&f);
    // The flight is refused; the hotel, booked meanwhile, is undone, then the opening.
    let r = f.answer(&r, FLIGHT, StepOutcome::failed("sold out")).next;
    let r = f.answer_done(&r, HOTEL);
    let r = f.answer_done(&f.answer_done(&r, HOTEL), OPEN);
    assert_eq!(r.process_state, ProcessState::Error);
    let t = f.order(&r, CommandKind::Redrive, "d-1", r.updated_at);
    assert_eq!(t.next.leased().map(|(i, _, _)| i).collect::<Vec<_>>(), [OPEN]);
    assert_eq!(t.next.steps[OPEN].generation, 1, "done again under new keys");
    assert_eq!(t.next.steps[FLIGHT].generation, 1);
}
