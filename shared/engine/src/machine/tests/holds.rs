//! A step whose service is held: it waits without failing, the supervisor resumes it once the
//! service is open, and only its `max_hold` makes the wait a failure.

use super::*;
use crate::state::WaitingFor;

const HOUR: Duration = Duration::from_secs(3600);

fn held(reason: &str) -> StepOutcome {
    StepOutcome::held(reason, None)
}

fn resume(f: &Fixture, r: &StateRecord, on: &str, delay: u64, now: Timestamp) -> Decision {
    f.decide(r, Input::Resume { on, delay: secs(delay) }, now)
}

/// An order whose first step (inventory) found its service held at T0 + 1 s.
fn parked(f: &Fixture) -> StateRecord {
    let r = f.claim(&f.new_record(), T0);
    let t = f.reply(&r, held("5 faults in a row: 503"), T0.plus(secs(1)));
    assert!(t.effects.is_empty(), "a held step sends nothing: {:?}", t.effects);
    t.next
}

#[test]
fn a_step_whose_service_is_held_waits_for_it_without_counting_a_failure() {
    let f = Fixture::new();
    let r = parked(&f);
    assert_eq!(r.process_state, ProcessState::Pending);
    assert_eq!(r.failure_count, 0);
    let lease = r.steps[0].lease.unwrap();
    assert!(lease.held && !lease.sent && lease.failures == 0);
    // The default max_hold: 6 hours from the hold.
    let until = T0.plus(secs(1)).plus(6 * HOUR);
    assert_eq!((lease.complete_by, r.complete_by), (until, Some(until)));
    assert_eq!(r.steps[0].waiting(), Some((WaitingFor::Service, until)));
    let hold = r.held_on().unwrap();
    assert_eq!((hold.service.as_str(), hold.since), ("inventory", T0.plus(secs(1))));
    assert_eq!(r.timeline.last().unwrap().what, Happening::Waiting);

    // The sweeps pass it by until its max_hold ends, whatever the queues.
    let sweep = Input::Expire { complete_by: until, horizon: secs(30) };
    assert!(matches!(f.decide(&r, sweep, T0.plus(HOUR)), Decision::Ignore(_)));
    // Nothing but a resume starts it: not even a start message naming its attempt.
    let claim = Input::Claim { attempt: lease.attempt, owner: "s", message: "forged" };
    assert!(matches!(f.decide(&r, claim, T0.plus(HOUR)), Decision::Ignore(Ignored::Stale { .. })));
}

#[test]
fn a_reply_of_the_attempt_before_the_hold_is_stale_and_its_redelivery_sends_nothing() {
    let f = Fixture::new();
    let r = f.claim(&f.new_record(), T0);
    let before = r.steps[0].lease.unwrap().attempt;
    let parked = f.reply(&r, held("down"), T0.plus(secs(1))).next;
    let step = step_ref(&r);
    let done = StepOutcome::done(json!({}));
    let late = Input::Reply { attempt: before, step: &step, outcome: &done, message: "other" };
    assert!(matches!(
        f.decide(&parked, late, T0.plus(secs(2))),
        Decision::Ignore(Ignored::Stale { .. })
    ));
    let again = Input::Reply {
        attempt: before,
        step: &step,
        outcome: &held("down"),
        message: &format!("reply-{before}"),
    };
    assert_eq!(f.decide(&parked, again, T0.plus(secs(2))), Decision::Replay(Vec::new()));
}

#[test]
fn the_supervisor_resumes_a_held_step_once_its_service_is_open() {
    let f = Fixture::new();
    let r = parked(&f);
    let now = T0.plus(HOUR);
    assert_eq!(resume(&f, &r, "payment", 0, now), Decision::Ignore(Ignored::NotHeld));

    let Decision::Apply(t) = resume(&f, &r, "inventory", 3, now) else { panic!("not resumed") };
    t.next.check().unwrap();
    let lease = t.next.steps[0].lease.unwrap();
    assert!(!lease.held && !lease.sent);
    assert_eq!(t.effects, vec![Effect::Kick { delay: secs(3), attempt: lease.attempt }]);
    // Its start message comes after the delay: the claim grace and its budget count from then.
    assert_eq!(lease.complete_by, now.plus(secs(3 + 30 + 30)));
    assert_eq!(t.next.timeline.last().unwrap().what, Happening::HoldEnded);
    assert!(t.next.held_on().is_none() && t.next.steps[0].held.is_none());
    // Since when it was held is remembered while the step goes on.
    assert_eq!(lease.held_since, Some(T0.plus(secs(1))));
    assert_eq!(resume(&f, &t.next, "inventory", 0, now), Decision::Ignore(Ignored::NotHeld));

    let claimed = f.claim(&t.next, now.plus(secs(3)));
    assert_eq!(claimed.steps[0].generation, 0);
    let done = f.done(&claimed, now.plus(secs(4)));
    assert_eq!(done.steps[0].status, StepStatus::Done);
    assert_eq!(done.failure_count, 0);
}

#[test]
fn a_step_held_by_a_hold_of_its_action_waits_under_that_action_and_resumes_with_it() {
    let f = Fixture::new();
    let r = f.claim(&f.new_record(), T0);
    let outcome = StepOutcome::held("5 faults in a row: 503", Some("reserve-inventory"));
    let parked = f.reply(&r, outcome, T0.plus(secs(1))).next;
    let hold = parked.held_on().unwrap();
    assert_eq!(hold.key(), "inventory/reserve-inventory");
    // The whole service opening, or another action's hold ending, is not what it waits for.
    for other in ["inventory", "inventory/release-inventory"] {
        assert_eq!(
            resume(&f, &parked, other, 0, T0.plus(HOUR)),
            Decision::Ignore(Ignored::NotHeld)
        );
    }
    let Decision::Apply(t) = resume(&f, &parked, "inventory/reserve-inventory", 0, T0.plus(HOUR))
    else {
        panic!("not resumed")
    };
    assert!(t.next.held_on().is_none());
}

#[test]
fn a_step_held_again_counts_its_max_hold_from_the_first_hold_then_fails_for_it() {
    let f = Fixture::new();
    let first = parked(&f);
    let Decision::Apply(t) = resume(&f, &first, "inventory", 0, T0.plus(HOUR)) else { panic!() };
    let claimed = f.claim(&t.next, T0.plus(HOUR));
    let again = f.reply(&claimed, held("still down"), T0.plus(HOUR).plus(secs(5))).next;
    let until = T0.plus(secs(1)).plus(6 * HOUR);
    assert_eq!(again.complete_by, Some(until));
    assert_eq!(again.steps[0].held.as_ref().unwrap().reason, "still down");

    let t = f.apply(&again, expiry(until), until);
    assert_eq!(t.next.failure_count, 0, "a hold is not an expired lease");
    let cause = t.next.cause.clone().unwrap();
    assert_eq!(cause.kind(), "service_held_too_long");
    assert_eq!(cause.to_string(), "reserve-inventory waited 6 h for inventory, which stayed held");
    // What its calls before the hold did is unknown: it is undone as a lost step would be.
    assert_eq!(t.next.steps[0].status, StepStatus::ToUndo);
    assert_eq!(t.next.phase, Phase::Compensating);
}

#[test]
fn a_workflow_or_a_step_sets_its_own_max_hold() {
    let mut f = Fixture::one_step();
    let flow = |json: &str| Workflow::from_json(json, &[AgentName::new("shipping")]);
    f.workflow =
        flow(r#"{"name":"w","max_hold_seconds":600,"steps":[{"name":"ship","agent":"shipping"}]}"#)
            .unwrap();
    let r = f.claim(&f.new_record(), T0);
    assert_eq!(f.reply(&r, held("down"), T0).next.complete_by, Some(T0.plus(secs(600))));

    f.workflow = flow(
        r#"{"name":"w","max_hold_seconds":600,"steps":[{"name":"ship","agent":"shipping","max_hold_seconds":120}]}"#,
    )
    .unwrap();
    let r = f.claim(&f.new_record(), T0);
    let parked = f.reply(&r, held("down"), T0).next;
    assert_eq!(parked.earliest_lease(), Some(T0.plus(secs(120))));
    // Nothing to undo: the order ends in Error, its step's outcome unknown.
    let t = f.apply(&parked, expiry(parked.complete_by.unwrap()), T0.plus(secs(120)));
    assert_eq!(t.next.process_state, ProcessState::Error);
    assert_eq!(t.next.steps[0].status, StepStatus::Uncertain);
    assert_eq!(alerts(&t.effects), 1);

    for (json, error) in [
        (
            r#"{"name":"w","max_hold_seconds":59,"steps":[{"name":"a","agent":"shipping"}]}"#,
            "max_hold_seconds must be from 60 to 86400",
        ),
        (
            r#"{"name":"w","steps":[{"name":"a","agent":"shipping","max_hold_seconds":86401}]}"#,
            "max_hold_seconds must be from 60 to 86400",
        ),
        (
            r#"{"name":"w","steps":[{"name":"a","wait":{"seconds":5},"max_hold_seconds":600}]}"#,
            "max_hold_seconds",
        ),
    ] {
        let e = flow(json).unwrap_err().to_string();
        assert!(e.contains(error), "{json}: {e}");
    }
}

#[test]
fn an_undo_waits_for_its_held_service_and_past_its_max_hold_is_left_to_the_operator() {
    let f = Fixture::new();
    let r = f.done(&f.claim(&f.new_record(), T0), T0);
    let t = f.reply(&r, StepOutcome::failed("card declined"), T0).next;
    assert_eq!(t.phase, Phase::Compensating);
    let parked = f.reply(&t, held("down"), T0.plus(secs(1))).next;
    assert_eq!(parked.steps[0].status, StepStatus::ToUndo);
    assert!(parked.steps[0].lease.unwrap().held);

    let until = parked.complete_by.unwrap();
    let t = f.apply(&parked, expiry(until), until);
    assert_eq!(t.next.process_state, ProcessState::Error);
    assert_eq!(t.next.steps[0].status, StepStatus::UndoFailed);
    assert_eq!(alerts(&t.effects), 1);
}

#[test]
fn a_cancel_takes_back_a_held_step_and_undoes_what_its_calls_may_have_done() {
    let f = Fixture::new();
    let r = parked(&f);
    let cancel = Input::Command {
        command: CommandKind::Cancel,
        id: "c1",
        by: "op",
        reason: "r",
        after: Duration::ZERO,
    };
    let t = f.apply(&r, cancel, T0.plus(secs(5)));
    assert!(t.next.steps[0].held.is_none());
    // Its request reached the service before the hold: its undo is queued, not skipped.
    assert_eq!(t.next.steps[0].status, StepStatus::ToUndo);
    assert_eq!(t.next.phase, Phase::Compensating);
    assert_eq!(
        resume(&f, &t.next, "inventory", 0, T0.plus(HOUR)),
        Decision::Ignore(Ignored::NotHeld)
    );
}

#[test]
fn a_step_deferred_for_room_at_its_service_goes_again_then_without_counting_a_failure() {
    let f = Fixture::new();
    let r = f.claim(&f.new_record(), T0);
    let before = r.steps[0].lease.unwrap();
    let until = T0.plus(secs(40));
    let t = f.reply(&r, StepOutcome::Deferred { until }, T0.plus(secs(1)));
    let lease = t.next.steps[0].lease.unwrap();
    // A new attempt, not sent, whose lease starts when the service has room.
    assert!(lease.attempt > before.attempt && !lease.sent && !lease.held);
    let budget = f.workflow.steps()[0].budget;
    assert_eq!(lease.complete_by, until.plus(f.config.claim_grace).plus(budget));
    assert_eq!((lease.failures, t.next.failure_count), (0, 0));
    assert_eq!(t.next.process_state, ProcessState::Pending);
    assert_eq!(t.effects, [Effect::Kick { delay: secs(39), attempt: lease.attempt }]);
    assert_eq!(t.next.held_on(), None, "a deferred step is not held");
    let noted = t.next.timeline.last().unwrap();
    assert_eq!((noted.what, noted.until), (Happening::Waiting, Some(until)));

    // Its start message starts it again, and the old attempt's late answer is stale.
    let again = f.claim(&t.next, until);
    assert!(again.steps[0].lease.unwrap().sent);
    let step = step_ref(&r);
    let done = StepOutcome::done(json!({}));
    let late = Input::Reply { attempt: before.attempt, step: &step, outcome: &done, message: "x" };
    assert!(matches!(f.decide(&again, late, until), Decision::Ignore(Ignored::Stale { .. })));
    let finished = f.reply(&again, StepOutcome::done(json!({})), until.plus(secs(1))).next;
    assert_eq!(finished.steps[0].status, StepStatus::Done);
    assert_eq!(finished.failure_count, 0);
}
