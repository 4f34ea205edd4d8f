//! Steps that wait for the outside world: a token announced once the step starts, answered
//! once with it (or by an operator), a heartbeat that starts the timeout again, and a timeout
//! that fails the step as its policy says.

use super::*;
use crate::state::{CommandKind, TimelineEntry, WaitingFor};

const DAY: Duration = Duration::from_secs(24 * 3600);
const BY: &str = "arn:aws:iam::123456789012:user/reviewer";

/// An account opening: the identity and the credit checked at once, then a person's approval
/// within two days, then the account.
fn opening() -> Fixture {
    let mut f = Fixture::new();
    f.workflow = Workflow::from_json(
        r#"{"name":"opening","steps":[
            {"name":"identity","agent":"checks","compensation":{"action":"forget-identity"}},
            {"name":"credit","agent":"checks","depends_on":[],
             "compensation":{"action":"forget-credit"}},
            {"name":"approval","callback":{"timeout_seconds":172800},
             "depends_on":["identity","credit"]},
            {"name":"account","agent":"core"}]}"#,
        &[AgentName::new("checks"), AgentName::new("core")],
    )
    .unwrap();
    f
}

const IDENTITY: usize = 0;
const CREDIT: usize = 1;
const APPROVAL: usize = 2;
const ACCOUNT: usize = 3;

impl Fixture {
    fn respond(
        &self,
        record: &StateRecord,
        token: Option<&str>,
        answer: &Answer,
        now: Timestamp,
    ) -> Decision {
        let input = Input::Answer { step: "approval", token, answer, by: BY, reason: "looks fine" };
        self.decide(record, input, now)
    }
}

fn applied(decision: Decision) -> Transition {
    match decision {
        Decision::Apply(t) => {
            t.next.check().unwrap();
            *t
        }
        other => panic!("expected a transition, got {other:?}"),
    }
}

/// The order once both checks are done: the approval announced, at `T0 + 2 s`.
fn awaiting(f: &Fixture) -> (StateRecord, Vec<Effect>) {
    let r = f.claim(&f.new_record(), T0);
    let r = f.answer_done(&r, IDENTITY);
    let mut r = r;
    r.updated_at = T0.plus(secs(2));
    let t = f.answer(&r, CREDIT, StepOutcome::done(json!({"score": 700})));
    (t.next, t.effects)
}

fn token(record: &StateRecord) -> String {
    record.steps[APPROVAL].token.clone().expect("the approval has a token")
}

#[test]
fn a_callback_starts_with_a_token_announced_and_a_lease_as_long_as_its_timeout() {
    let f = opening();
    let (r, effects) = awaiting(&f);
    assert!(effects.contains(&Effect::Announce { step: APPROVAL }), "{effects:?}");
    assert!(!effects.contains(&Effect::Dispatch { step: APPROVAL }), "nothing goes to an agent");
    let lease = r.steps[APPROVAL].lease.unwrap();
    assert!(lease.sent && !lease.timer);
    assert_eq!(lease.complete_by, T0.plus(secs(2)).plus(2 * DAY));
    assert_eq!(
        (r.process_state, r.complete_by),
        (ProcessState::Processing, Some(lease.complete_by))
    );
    assert!(!r.steps[APPROVAL].dispatched, "nothing reached a service");
    // It shows as waiting for an answer, due at its end; its start is on the timeline.
    assert_eq!(r.steps[APPROVAL].waiting(), Some((WaitingFor::Answer, lease.complete_by)));
    assert_eq!(r.steps[APPROVAL].answer_by, Some(lease.complete_by));
    let started = r.timeline.last().unwrap();
    assert_eq!(
        (started.what, started.step.as_deref(), started.until, started.reason.as_deref()),
        (
            Happening::Waiting,
            Some("approval"),
            Some(lease.complete_by),
            Some("waits for an answer from outside")
        )
    );
    // Waiting for a person is not being held up: not before the answer is due.
    assert_eq!(r.watched_since(), lease.complete_by);
    assert_eq!(token(&r).len(), 40);
    // A redelivered reply announces it again, under the same token.
    let InputRef::Message(last) = r.last_input.clone() else { panic!("a reply wrote it") };
    let again = Input::Reply {
        attempt: 0,
        step: &StepRef {
            index: CREDIT,
            name: "credit".into(),
            direction: Direction::Do,
            element: None,
        },
        outcome: &StepOutcome::done(json!({})),
        message: &last,
    };
    assert_eq!(
        f.decide(&r, again, T0.plus(secs(3))),
        Decision::Replay(vec![Effect::Announce { step: APPROVAL }])
    );
}

#[test]
fn the_token_completes_the_step_once_with_its_output_and_who_answered() {
    let f = opening();
    let (r, _) = awaiting(&f);
    let token = token(&r);
    let output = json!({"approved_by": "ada"});
    let complete = Answer::Complete { output: output.clone() };
    let t = applied(f.respond(&r, Some(&token), &complete, T0.plus(DAY)));
    let n = &t.next;
    assert_eq!(n.steps[APPROVAL].status, StepStatus::Done);
    assert_eq!(n.steps[APPROVAL].output, Some(output));
    assert_eq!(n.steps[APPROVAL].waiting(), None, "no longer waiting");
    assert_eq!(n.steps[APPROVAL].answer_by, r.steps[APPROVAL].answer_by, "the time it met");
    assert_eq!(n.watched_since(), T0.plus(DAY), "worked on again from the answer");
    assert_eq!(n.created_at, T0);
    let entry = n.timeline.last().unwrap();
    assert_eq!((entry.what, entry.by.as_deref()), (Happening::StepDone, Some(BY)));
    assert_eq!(entry.reason.as_deref(), Some("looks fine"));
    // The account is queued for the scheduler: the API does not talk to agents.
    let lease = n.steps[ACCOUNT].lease.unwrap();
    assert!(!lease.sent);
    assert!(t.effects.contains(&Effect::Kick { delay: Duration::ZERO, attempt: lease.attempt }));
    assert_eq!(n.process_state, ProcessState::Pending);

    // The same answer again, its write the last: the start message is sent again.
    assert_eq!(
        f.respond(n, Some(&token), &complete, T0.plus(DAY)),
        Decision::Replay(vec![Effect::Kick { delay: Duration::ZERO, attempt: lease.attempt }])
    );
    // Once the order has moved on, it is refused, saying the step is done.
    let n = f.claim(n, T0.plus(DAY));
    assert_eq!(
        f.respond(&n, Some(&token), &complete, T0.plus(DAY)),
        Decision::Refuse(Refused::NotWaiting {
            step: "approval".into(),
            status: StepStatus::Done,
            state: ProcessState::Processing
        })
    );
}

#[test]
fn a_forged_token_or_an_answer_to_a_step_that_takes_none_changes_nothing() {
    let f = opening();
    let (r, _) = awaiting(&f);
    let complete = Answer::Complete { output: json!({}) };
    let forged = "0".repeat(40);
    assert_eq!(
        f.respond(&r, Some(&forged), &complete, T0.plus(secs(5))),
        Decision::Refuse(Refused::WrongToken { step: "approval".into() })
    );
    let mut short = token(&r);
    short.pop();
    assert_eq!(
        f.respond(&r, Some(&short), &complete, T0.plus(secs(5))),
        Decision::Refuse(Refused::WrongToken { step: "approval".into() })
    );
    let input = Input::Answer {
        step: "credit",
        token: Some(&forged),
        answer: &complete,
        by: BY,
        reason: "",
    };
    assert_eq!(
        f.decide(&r, input, T0.plus(secs(5))),
        Decision::Refuse(Refused::NoCallback { step: "credit".into() })
    );
    let input = Input::Answer { step: "nope", token: None, answer: &complete, by: BY, reason: "" };
    assert_eq!(
        f.decide(&r, input, T0.plus(secs(5))),
        Decision::Refuse(Refused::UnknownStep { step: "nope".into() })
    );
    // An agent's reply naming the approval's attempt: nothing was sent to an agent.
    let attempt = r.steps[APPROVAL].lease.unwrap().attempt;
    let step = StepRef {
        index: APPROVAL,
        name: "approval".into(),
        direction: Direction::Do,
        element: None,
    };
    let outcome = StepOutcome::done(json!({}));
    let reply = Input::Reply { attempt, step: &step, outcome: &outcome, message: "forged" };
    assert_eq!(
        f.decide(&r, reply, T0.plus(secs(5))),
        Decision::Illegal(Illegal::NotDispatched { attempt })
    );
    // Before the step starts there is no token to match.
    let early = f.claim(&f.new_record(), T0);
    assert_eq!(
        f.respond(&early, Some(&forged), &complete, T0),
        Decision::Refuse(Refused::WrongToken { step: "approval".into() })
    );
    assert_eq!(
        f.respond(&early, None, &complete, T0),
        Decision::Refuse(Refused::NotWaiting {
            step: "approval".into(),
            status: StepStatus::NotStarted,
            state: ProcessState::Processing
        })
    );
}

#[test]
fn a_refusal_fails_the_step_and_undoes_the_checks_with_who_refused_and_why() {
    let f = opening();
    let (r, _) = awaiting(&f);
    let input = Input::Answer {
        step: "approval",
        token: Some(&token(&r)),
        answer: &Answer::Refuse,
        by: BY,
        reason: "address does not match",
    };
    let t = applied(f.decide(&r, input, T0.plus(DAY)));
    let n = &t.next;
    assert_eq!(n.steps[APPROVAL].status, StepStatus::Failed);
    assert_eq!(
        n.cause,
        Some(Cause::StepRejected {
            step: "approval".into(),
            reason: format!("refused by {BY}: address does not match")
        })
    );
    assert_eq!(n.phase, Phase::Compensating);
    let mut undoing: Vec<usize> = n.leased().map(|(i, _, _)| i).collect();
    undoing.sort_unstable();
    assert_eq!(undoing, [IDENTITY, CREDIT], "both checks undone at once");
    // The refusal is on the timeline once, with who refused and why.
    let failures: Vec<&TimelineEntry> =
        n.timeline.iter().filter(|e| e.what == Happening::StepFailed).collect();
    assert_eq!(failures.len(), 1, "{:?}", n.timeline);
    assert_eq!(
        (failures[0].by.as_deref(), failures[0].reason.as_deref()),
        (Some(BY), Some("address does not match"))
    );
}

#[test]
fn a_heartbeat_starts_the_timeout_again_and_silence_fails_the_step_at_its_end() {
    let f = opening();
    let (r, _) = awaiting(&f);
    let first_end = r.complete_by.unwrap();
    let token = token(&r);
    let beat = T0.plus(DAY);
    let t = applied(f.respond(&r, Some(&token), &Answer::Heartbeat, beat));
    let n = t.next;
    assert!(t.effects.is_empty());
    assert_eq!(n.complete_by, Some(beat.plus(2 * DAY)));
    assert_eq!(n.steps[APPROVAL].answer_by, Some(beat.plus(2 * DAY)), "its answer due later");
    assert_eq!(n.steps[APPROVAL].waiting(), Some((WaitingFor::Answer, beat.plus(2 * DAY))));
    assert_eq!(n.steps[APPROVAL].lease.unwrap().attempt, r.steps[APPROVAL].lease.unwrap().attempt);
    assert_eq!(n.steps[APPROVAL].token.as_deref(), Some(token.as_str()));
    // The sweep that saw the first end finds the record moved.
    assert_eq!(f.decide(&n, expiry(first_end), first_end), Decision::Ignore(Ignored::Moved));
    // At the new end, however busy the queues: no answer is in them.
    let end = beat.plus(2 * DAY);
    let busy = Input::Expire { complete_by: end, horizon: secs(600) };
    let t = f.apply(&n, busy, end);
    assert_eq!(t.next.steps[APPROVAL].status, StepStatus::Failed);
    assert_eq!(t.next.steps[APPROVAL].detail.as_deref(), Some("no answer within 172800 s"));
    assert_eq!(t.next.cause, Some(Cause::StepTimedOut { step: "approval".into(), failures: 1 }));
    assert_eq!(t.next.phase, Phase::Compensating);
    // The answer that comes after is late, and says so.
    assert_eq!(
        f.respond(&t.next, Some(&token), &Answer::Complete { output: json!({}) }, end),
        Decision::Refuse(Refused::NotWaiting {
            step: "approval".into(),
            status: StepStatus::Failed,
            state: ProcessState::Pending
        })
    );
}

#[test]
fn an_operator_answers_without_the_token_and_a_cancel_does_not_wait_for_the_answer() {
    let f = opening();
    let (r, _) = awaiting(&f);
    let t = applied(f.respond(&r, None, &Answer::Complete { output: json!({}) }, T0.plus(DAY)));
    assert_eq!(t.next.steps[APPROVAL].status, StepStatus::Done);

    let t = f.order(&r, CommandKind::Cancel, "c-1", T0.plus(DAY));
    assert!(t.next.steps[APPROVAL].lease.is_none(), "nobody waits for the answer any more");
    assert_eq!(t.next.phase, Phase::Compensating);
    assert_eq!(
        f.respond(&t.next, Some(&token(&r)), &Answer::Heartbeat, T0.plus(DAY)),
        Decision::Refuse(Refused::NotWaiting {
            step: "approval".into(),
            status: StepStatus::NotStarted,
            state: ProcessState::Pending
        })
    );
}

#[test]
fn a_redriven_callback_gets_a_new_token_and_the_old_one_stops_counting() {
    let f = opening();
    let (r, _) = awaiting(&f);
    let old = token(&r);
    let input = Input::Answer {
        step: "approval",
        token: Some(&old),
        answer: &Answer::Refuse,
        by: BY,
        reason: "missing document",
    };
    let n = applied(f.decide(&r, input, T0.plus(secs(10)))).next;
    let mut n = f.claim(&n, T0.plus(secs(11)));
    for i in [IDENTITY, CREDIT] {
        n = f.answer_done(&n, i);
    }
    assert_eq!(n.process_state, ProcessState::Error);
    let n = f.order(&n, CommandKind::Redrive, "r-1", T0.plus(secs(20))).next;
    let n = f.claim(&n, T0.plus(secs(21)));
    let n = f.answer_done(&n, IDENTITY);
    let t = f.answer(&n, CREDIT, StepOutcome::done(json!({})));
    assert!(t.effects.contains(&Effect::Announce { step: APPROVAL }));
    let new = token(&t.next);
    assert_ne!(new, old);
    let complete = Answer::Complete { output: json!({}) };
    assert_eq!(
        f.respond(&t.next, Some(&old), &complete, T0.plus(secs(30))),
        Decision::Refuse(Refused::WrongToken { step: "approval".into() })
    );
    applied(f.respond(&t.next, Some(&new), &complete, T0.plus(secs(30))));
}

#[test]
fn a_callback_declares_only_its_timeout_and_failure_policy() {
    let cases = [
        (r#"{"name":"c","callback":{"timeout_seconds":0}}"#, "from 1 to 31622400"),
        (r#"{"name":"c","callback":{}}"#, "timeout_seconds"),
        (r#"{"name":"c","callback":{"timeout_seconds":5},"agent":"core"}"#, "one of an agent"),
        (
            r#"{"name":"c","callback":{"timeout_seconds":5},"budget_seconds":5}"#,
            "its timeout is its budget",
        ),
        (
            r#"{"name":"c","callback":{"timeout_seconds":5},"compensation":{"action":"x"}}"#,
            "no compensation",
        ),
    ];
    for (step, expected) in cases {
        let json = format!(r#"{{"name":"w","steps":[{step}]}}"#);
        let err = Workflow::from_json(&json, &[AgentName::new("core")]).unwrap_err().to_string();
        assert!(err.contains(expected), "{step}: {err}");
    }
    let json = r#"{"name":"w","steps":[{"name":"c","callback":{"timeout_seconds":5},"on_failure":"report"}]}"#;
    let w = Workflow::from_json(json, &[]).unwrap();
    assert_eq!(w.steps()[0].budget, secs(5));
    assert!(w.agents().is_empty());
}

#[test]
fn a_refusal_repeated_after_it_ended_the_order_replays_the_end_and_then_says_the_step_is_over() {
    let mut f = Fixture::new();
    f.workflow = Workflow::from_json(
        r#"{"name":"gate","steps":[{"name":"approval","callback":{"timeout_seconds":60}},
            {"name":"account","agent":"core"}]}"#,
        &[AgentName::new("core")],
    )
    .unwrap();
    let r = f.claim(&f.new_record(), T0);
    let token = r.steps[0].token.clone().unwrap();
    let refuse = |record: &StateRecord| {
        let input = Input::Answer {
            step: "approval",
            token: Some(&token),
            answer: &Answer::Refuse,
            by: BY,
            reason: "no",
        };
        f.decide(record, input, T0.plus(secs(5)))
    };
    let t = applied(refuse(&r));
    assert_eq!(t.next.process_state, ProcessState::Error, "nothing to undo");
    assert!(t.effects.contains(&Effect::Alert));
    // Sent again while its write is the last: its handler may have died before the alert.
    let Decision::Replay(effects) = refuse(&t.next) else { panic!("expected a replay") };
    assert!(effects.contains(&Effect::Alert), "{effects:?}");
    let mut sent = t.next.clone();
    sent.last_input = InputRef::Expire;
    assert_eq!(
        refuse(&sent),
        Decision::Refuse(Refused::NotWaiting {
            step: "approval".into(),
            status: StepStatus::Failed,
            state: ProcessState::Error
        })
    );
}

/// The opening with an approval due within ten minutes, which SQS can delay a message for.
fn quick() -> Fixture {
    let mut f = opening();
    let json = r#"{"name":"opening","steps":[
            {"name":"identity","agent":"checks","compensation":{"action":"forget-identity"}},
            {"name":"credit","agent":"checks","depends_on":[],
             "compensation":{"action":"forget-credit"}},
            {"name":"approval","callback":{"timeout_seconds":600},
             "depends_on":["identity","credit"]},
            {"name":"account","agent":"core"}]}"#;
    f.workflow =
        Workflow::from_json(json, &[AgentName::new("checks"), AgentName::new("core")]).unwrap();
    f
}

/// The start message of `attempt`, received at `now`.
fn kicked(f: &Fixture, record: &StateRecord, attempt: u64, now: Timestamp) -> Decision {
    let input = Input::Claim { attempt, owner: "scheduler-a", message: "end-of-approval" };
    f.decide(record, input, now)
}

#[test]
fn a_timeout_within_sqs_s_delay_is_acted_on_at_its_end_by_its_own_start_message() {
    let f = quick();
    let (r, effects) = awaiting(&f);
    let lease = r.steps[APPROVAL].lease.unwrap();
    let end = T0.plus(secs(2)).plus(secs(600));
    assert_eq!(lease.complete_by, end);
    assert!(
        effects.contains(&Effect::Kick { delay: secs(600), attempt: lease.attempt }),
        "a start message due at the end: {effects:?}"
    );
    // Before its end, the message changes nothing (clocks differ a little).
    let early = kicked(&f, &r, lease.attempt, end.minus(secs(1)));
    assert!(matches!(early, Decision::Ignore(Ignored::NotExpired { .. })), "{early:?}");
    // At its end the step fails unanswered, as the supervisor's sweep would fail it, and the
    // checks done are undone.
    let t = applied(kicked(&f, &r, lease.attempt, end));
    let n = &t.next;
    assert_eq!(n.steps[APPROVAL].status, StepStatus::Failed);
    assert_eq!(n.steps[APPROVAL].detail.as_deref(), Some("no answer within 600 s"));
    assert!(matches!(n.cause, Some(Cause::StepTimedOut { .. })), "{:?}", n.cause);
    assert!(n.steps[IDENTITY].lease.is_some() && n.steps[CREDIT].lease.is_some(), "undos queued");
    // The same message again replays; a message of another attempt is stale.
    assert!(matches!(kicked(&f, n, lease.attempt, end), Decision::Replay(_)));
    let other = Input::Claim { attempt: lease.attempt, owner: "scheduler-b", message: "other" };
    assert!(matches!(f.decide(n, other, end), Decision::Ignore(Ignored::Stale { .. })));
}

#[test]
fn a_heartbeat_sends_the_start_message_of_its_new_end_and_the_old_one_changes_nothing() {
    let f = quick();
    let (r, _) = awaiting(&f);
    let lease = r.steps[APPROVAL].lease.unwrap();
    let beat = T0.plus(secs(300));
    let t = applied(f.respond(&r, Some(&token(&r)), &Answer::Heartbeat, beat));
    let moved = t.next.steps[APPROVAL].lease.unwrap();
    assert_eq!((moved.attempt, moved.complete_by), (lease.attempt, beat.plus(secs(600))));
    assert!(
        t.effects.contains(&Effect::Kick { delay: secs(600), attempt: lease.attempt }),
        "{:?}",
        t.effects
    );
    let old_end = kicked(&f, &t.next, lease.attempt, lease.complete_by);
    assert!(matches!(old_end, Decision::Ignore(Ignored::NotExpired { .. })), "{old_end:?}");
    let failed = applied(kicked(&f, &t.next, lease.attempt, moved.complete_by));
    assert_eq!(failed.next.steps[APPROVAL].status, StepStatus::Failed);
}

#[test]
fn a_timeout_longer_than_sqs_s_delay_waits_for_the_sweep() {
    let f = opening();
    let (r, effects) = awaiting(&f);
    let attempt = r.steps[APPROVAL].lease.unwrap().attempt;
    assert!(
        !effects.iter().any(|e| matches!(e, Effect::Kick { attempt: a, .. } if *a == attempt)),
        "two days: {effects:?}"
    );
}
