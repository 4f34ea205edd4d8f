//! Steps that wait for a time: a lease that ends when they wake, a start message for a short
//! wait, the supervisor for a long one, and an order that stops without waiting for them.

use super::*;
use crate::state::{CommandKind, WaitingFor};

const DAY: Duration = Duration::from_secs(24 * 3600);

/// A refund: money back at once, a cooling-off period of `seconds`, then the refund is final.
fn refund(seconds: u64) -> Fixture {
    let mut f = Fixture::new();
    f.workflow = Workflow::from_json(
        &format!(
            r#"{{"name":"refund","steps":[
            {{"name":"pay-back","agent":"payment","compensation":{{"action":"claw-back"}}}},
            {{"name":"cooling-off","wait":{{"seconds":{seconds}}}}},
            {{"name":"close-case","agent":"payment"}}]}}"#
        ),
        &[AgentName::new("payment")],
    )
    .unwrap();
    f
}

const PAY_BACK: usize = 0;
const COOLING_OFF: usize = 1;
const CLOSE: usize = 2;

/// The order once its money is paid back, waiting.
fn waiting(f: &Fixture) -> (StateRecord, Vec<Effect>) {
    let r = f.claim(&f.new_record(), T0);
    let t = f.reply(&r, StepOutcome::done(json!({})), T0.plus(secs(1)));
    (t.next, t.effects)
}

#[test]
fn a_long_wait_holds_only_its_lease_and_the_supervisor_wakes_it() {
    let f = refund(DAY.as_secs());
    let (r, effects) = waiting(&f);
    let wake = T0.plus(secs(1)).plus(DAY);
    let lease = r.steps[COOLING_OFF].lease.unwrap();
    assert_eq!((lease.timer, lease.sent, lease.complete_by), (true, false, wake));
    assert_eq!((r.process_state, r.complete_by), (ProcessState::Pending, Some(wake)));
    assert!(
        !effects.iter().any(|e| matches!(e, Effect::Dispatch { .. } | Effect::Kick { .. })),
        "nothing is sent for a day-long wait: {effects:?}"
    );
    // It shows as a wait, until its time, and its start is on the timeline once.
    assert_eq!(r.steps[COOLING_OFF].waiting(), Some((WaitingFor::Time, wake)));
    let started: Vec<_> = r.timeline.iter().filter(|e| e.what == Happening::Waiting).collect();
    assert_eq!(started.len(), 1, "{:?}", r.timeline);
    assert_eq!(
        (started[0].at, started[0].step.as_deref(), started[0].until),
        (T0.plus(secs(1)), Some("cooling-off"), Some(wake))
    );
    assert_eq!(
        f.decide(&r, expiry(wake), wake.minus(secs(1))),
        Decision::Ignore(Ignored::NotExpired { complete_by: Some(wake) })
    );
    // At its time, even with messages still waiting in the queues: nothing of a wait is there.
    let busy = Input::Expire { complete_by: wake, horizon: secs(120) };
    let t = f.apply(&r, busy, wake);
    assert_eq!(t.next.steps[COOLING_OFF].status, StepStatus::Done);
    assert_eq!(t.next.failure_count, 0, "a wait that ends is no failure");
    assert_eq!(t.next.steps[COOLING_OFF].waiting(), None);
    assert_eq!(r.watched_since(), wake, "a wait is no hold-up");
    assert_eq!(t.next.watched_since(), wake, "worked on again from its wake");
    assert_eq!(t.next.leased().map(|(i, _, _)| i).collect::<Vec<_>>(), [CLOSE]);
    assert_eq!(
        t.effects.last(),
        Some(&Effect::Kick { delay: Duration::ZERO, attempt: t.next.attempt })
    );
}

#[test]
fn a_short_wait_is_woken_by_its_own_delayed_start_message() {
    let f = refund(60);
    let (r, effects) = waiting(&f);
    let attempt = r.steps[COOLING_OFF].lease.unwrap().attempt;
    assert_eq!(effects.last(), Some(&Effect::Kick { delay: secs(60), attempt }));
    let start = |now| {
        let input = Input::Claim { attempt, owner: "s", message: "delayed" };
        f.decide(&r, input, now)
    };
    let early = T0.plus(secs(30));
    assert!(matches!(start(early), Decision::Ignore(Ignored::NotExpired { .. })));
    let Decision::Apply(t) = start(T0.plus(secs(61))) else { panic!("not woken") };
    t.next.check().unwrap();
    assert_eq!(t.next.steps[COOLING_OFF].status, StepStatus::Done);
    assert_eq!(t.next.process_state, ProcessState::Processing, "the next step sent at once");
    assert!(t.effects.contains(&Effect::Dispatch { step: CLOSE }));
}

#[test]
fn a_cancel_does_not_wait_for_a_wait() {
    let f = refund(DAY.as_secs());
    let (r, _) = waiting(&f);
    let t = f.order(&r, CommandKind::Cancel, "c-1", T0.plus(secs(5)));
    assert_eq!(t.next.phase, Phase::Compensating, "undoing at once");
    assert_eq!(t.next.steps[COOLING_OFF].lease, None);
    assert_eq!(t.next.leased().map(|(i, _, _)| i).collect::<Vec<_>>(), [PAY_BACK]);
    let undone = f.done(&f.claim(&t.next, T0.plus(secs(6))), T0.plus(secs(7)));
    assert_eq!(undone.process_state, ProcessState::Cancelled);
}

#[test]
fn a_paused_wait_keeps_its_time_when_it_resumes() {
    let f = refund(3600);
    let (r, _) = waiting(&f);
    let wake = r.steps[COOLING_OFF].wake_at.unwrap();
    let paused = f.order(&r, CommandKind::Pause, "p-1", T0.plus(secs(10))).next;
    assert_eq!(paused.process_state, ProcessState::Paused);
    // Resumed before its time: it wakes when it would have.
    let early = f.order(&paused, CommandKind::Resume, "r-1", T0.plus(secs(600))).next;
    assert_eq!(early.steps[COOLING_OFF].lease.unwrap().complete_by, wake);
    // Resumed after it: it wakes at once.
    let late = f.order(&paused, CommandKind::Resume, "r-2", wake.plus(secs(600)));
    let attempt = late.next.steps[COOLING_OFF].lease.unwrap().attempt;
    assert_eq!(late.effects, [Effect::Kick { delay: Duration::ZERO, attempt }]);
}

#[test]
fn a_wait_until_a_time_of_the_input_is_checked_at_submission() {
    let workflow = Workflow::from_json(
        r#"{"name":"later","steps":[{"name":"hold","wait":{"until":"/release_at"}},
            {"name":"release","agent":"payment"}]}"#,
        &[AgentName::new("payment")],
    )
    .unwrap();
    let wakes = workflow.wakes(&json!({"release_at": "2026-01-02T00:00:00Z"}), T0).unwrap();
    assert_eq!(wakes, [("hold".to_owned(), T0.plus(DAY))]);
    for (input, reason) in [
        (json!({}), "RFC 3339"),
        (json!({"release_at": "tomorrow"}), "RFC 3339"),
        (json!({"release_at": "2028-01-01T00:00:00Z"}), "at most 366 days ahead"),
    ] {
        let refused = workflow.wakes(&input, T0).unwrap_err();
        assert_eq!(refused.errors[0].field, "/release_at");
        assert!(refused.errors[0].reason.contains(reason), "{refused:?}");
    }
    let f = Fixture { workflow, ..Fixture::new() };
    let id = OrderId::for_key(&crate::ids::IdempotencyKey::parse("later-1").unwrap());
    let t = create_waking(id, "c".into(), &wakes, None, &f.ctx(T0));
    t.next.check().unwrap();
    assert_eq!(t.next.complete_by, Some(T0.plus(DAY)));
}

#[test]
fn a_wait_is_declared_apart_from_what_an_agent_step_has() {
    let agents = [AgentName::new("payment")];
    for (step, error) in [
        (r#"{"name":"w","wait":{"seconds":0}}"#, "wait.seconds must be from 1 to 31622400"),
        (r#"{"name":"w","wait":{"seconds":31622401}}"#, "wait.seconds must be from 1"),
        (r#"{"name":"w","wait":{"until":"release_at"}}"#, "a JSON pointer"),
        (
            r#"{"name":"w","wait":{"seconds":5},"agent":"payment"}"#,
            "one of an agent, a wait, a callback, a child or an each",
        ),
        (r#"{"name":"w"}"#, "one of an agent, a wait, a callback, a child or an each"),
        (r#"{"name":"w","wait":{"seconds":5},"budget_seconds":5}"#, "it has no budget"),
    ] {
        let json = format!(r#"{{"name":"x","steps":[{step}]}}"#);
        let err = Workflow::from_json(&json, &agents).unwrap_err().to_string();
        assert!(err.contains(error), "{step}: {err}");
    }
    let agents_in = Workflow::agents_in(r#"{"steps":[{"name":"w","wait":{"seconds":5}}]}"#);
    assert!(agents_in.is_empty(), "a wait needs no agent deployed");
}
