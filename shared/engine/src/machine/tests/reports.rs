//! Steps whose failures are only reported, and outputs too large to keep.

use super::*;
use crate::message::MAX_OUTPUT_LEN;
use crate::state::{AttentionList, CommandKind, Stop};

/// Opens an account, welcomes its owner (a failure of which is only reported, and which can
/// be taken back), then activates it.
fn reporting() -> Fixture {
    let mut f = Fixture::new();
    f.workflow = Workflow::from_json(
        r#"{"name":"accounts","steps":[
            {"name":"open","agent":"ledger","compensation":{"action":"close"}},
            {"name":"welcome","agent":"notify","on_failure":"report",
             "compensation":{"action":"retract"}},
            {"name":"activate","agent":"ledger"}]}"#,
        &[AgentName::new("ledger"), AgentName::new("notify")],
    )
    .unwrap();
    f
}

/// Claims the order at `record`'s attempt, the time it was last written.
fn claimed(f: &Fixture, record: &StateRecord) -> StateRecord {
    f.claim(record, record.updated_at)
}

fn rejected(step: &str, reason: &str) -> Cause {
    Cause::StepRejected { step: step.into(), reason: reason.into() }
}

#[test]
fn a_reported_refusal_passes_its_step_and_the_order_ends_processed_with_an_alert() {
    let f = reporting();
    let r = f.done(&claimed(&f, &f.new_record()), T0.plus(secs(1)));
    let t = f.reply(&r, StepOutcome::failed("mailbox full"), T0.plus(secs(2)));
    let r = t.next;
    assert_eq!(
        (r.process_state, r.phase, cursor(&r)),
        (ProcessState::Processing, Phase::Forward, 2)
    );
    assert_eq!(r.cause, None, "the order goes on");
    assert_eq!(r.steps[1].status, StepStatus::Failed);
    assert_eq!(r.steps[1].reported, Some(rejected("welcome", "mailbox full")));
    assert_eq!(r.timeline.last().map(|e| e.what), Some(Happening::StepReported));
    assert_eq!(
        t.effects,
        vec![Effect::Dispatch { step: cursor(&r) }],
        "the next step leased in the same write"
    );

    let end = T0.plus(secs(3));
    let t = f.reply(&r, StepOutcome::done(json!({"active": true})), end);
    let p = t.next;
    assert_eq!(p.process_state, ProcessState::Processed);
    assert_eq!(statuses(&t.effects), [StatusKind::StepDone, StatusKind::Processed]);
    assert_eq!(alerts(&t.effects), 1, "the operators are told what was left undone");
    assert_eq!(p.alert, Some(AlertDelivery::Pending));
    assert_eq!(p.complete_by, Some(end.plus(f.config.alert_retry_after)));
    assert!(p.needs_manual_undo().is_empty(), "nothing is to be reverted: the order stands");

    // Until it is recorded as sent, a redelivered reply publishes it again, and so does the
    // supervisor once its deadline passes.
    let again = Input::Reply {
        attempt: r.attempt,
        step: &step_ref(&r),
        outcome: &StepOutcome::done(json!({})),
        message: &format!("reply-{}", r.attempt),
    };
    let Decision::Replay(effects) = f.decide(&p, again, end) else { panic!() };
    assert_eq!(alerts(&effects), 1);
    let due = p.complete_by.unwrap();
    assert_eq!(alerts(&f.expire(&p, due).effects), 1);

    let sent = f.apply(&p, Input::AlertSent, end).next;
    assert_eq!((sent.alert, sent.complete_by), (Some(AlertDelivery::Sent), None));
    assert_eq!(f.decide(&sent, Input::AlertSent, end), Decision::Ignore(Ignored::AlertAlreadySent));

    // It stays on the operators' list until one of them acknowledges it, once, with who and why.
    let listed = sent.attention().expect("on the list");
    assert_eq!(
        (listed.list, listed.since, listed.step.as_deref(), listed.cause),
        (AttentionList::Reported, end, Some("welcome"), Some("step_rejected"))
    );
    let ack = |id: &'static str| Input::Command {
        command: CommandKind::Acknowledge,
        id,
        by: "arn:aws:iam::123456789012:user/ops",
        reason: "welcome sent by hand",
        after: Duration::ZERO,
    };
    let later = end.plus(secs(60));
    let acked = f.apply(&sent, ack("ack-1"), later).next;
    assert_eq!(acked.attention(), None, "off the list");
    assert_eq!(
        (acked.process_state, acked.steps.clone()),
        (ProcessState::Processed, sent.steps.clone())
    );
    let noted = acked.timeline.last().unwrap();
    assert_eq!(
        (noted.what, noted.by.as_deref(), noted.reason.as_deref()),
        (
            Happening::Acknowledged,
            Some("arn:aws:iam::123456789012:user/ops"),
            Some("welcome sent by hand")
        )
    );
    assert_eq!(f.decide(&acked, ack("ack-1"), later), Decision::Replay(Vec::new()), "owes nothing");
    assert_eq!(
        f.decide(&acked, ack("ack-2"), later),
        Decision::Refuse(Refused::Acknowledged { by: "arn:aws:iam::123456789012:user/ops".into() })
    );
}

#[test]
fn an_order_with_nothing_reported_has_nothing_to_acknowledge() {
    let f = reporting();
    let r = f.done(&claimed(&f, &f.new_record()), T0.plus(secs(1)));
    let ack = Input::Command {
        command: CommandKind::Acknowledge,
        id: "a",
        by: "ops",
        reason: "r",
        after: Duration::ZERO,
    };
    assert_eq!(
        f.decide(&r, ack, T0.plus(secs(2))),
        Decision::Refuse(Refused::NothingReported { state: ProcessState::Processing })
    );
    let r = f.done(&r, T0.plus(secs(2)));
    let p = f.done(&r, T0.plus(secs(3)));
    assert_eq!(p.process_state, ProcessState::Processed);
    assert_eq!(p.attention(), None, "a clean order is on no list");
    assert_eq!(
        f.decide(&p, ack, T0.plus(secs(4))),
        Decision::Refuse(Refused::NothingReported { state: ProcessState::Processed })
    );
}

#[test]
fn a_reported_step_whose_leases_run_out_is_passed_and_undone_if_the_order_stops_after_all() {
    let f = reporting();
    let mut r = f.done(&claimed(&f, &f.new_record()), T0.plus(secs(1)));
    for _ in 1..f.config.failure_threshold {
        let now = r.earliest_lease().unwrap();
        r = f.claim(&f.expire(&r, now).next, now.plus(secs(300)));
    }
    let t = f.expire(&r, r.earliest_lease().unwrap());
    let r = t.next;
    assert_eq!((r.process_state, r.phase, cursor(&r)), (ProcessState::Pending, Phase::Forward, 2));
    assert_eq!(r.steps[1].status, StepStatus::Uncertain, "it may have been sent");
    let failures = f.config.failure_threshold;
    assert_eq!(r.steps[1].reported, Some(Cause::StepTimedOut { step: "welcome".into(), failures }));
    assert_eq!(r.steps[2].lease.unwrap().failures, 0, "the next step starts with a clean count");
    assert_eq!(
        t.effects,
        vec![Effect::Kick { delay: Duration::ZERO, attempt: r.attempt }],
        "the supervisor kicks"
    );

    // Activation is refused: the order stops, and the welcome that may have gone out is taken
    // back before the account is closed.
    let r = claimed(&f, &r);
    let r = f.reply(&r, StepOutcome::failed("frozen"), r.updated_at).next;
    assert_eq!(r.phase, Phase::Compensating);
    assert_eq!(r.cause, Some(rejected("activate", "frozen")));
    assert_eq!(step_statuses(&r)[..2], [StepStatus::ToUndo, StepStatus::ToUndo]);
    assert_eq!(step_ref(&r).name, "welcome");
    let r = f.reply(&r, StepOutcome::done(json!({})), r.updated_at).next;
    assert_eq!(step_ref(&r).name, "open");
    let t = f.reply(&r, StepOutcome::done(json!({})), r.updated_at);
    assert_eq!(t.next.process_state, ProcessState::Error);
    assert_eq!(statuses(&t.effects), [StatusKind::Compensated]);
}

#[test]
fn a_reported_step_with_no_undo_left_uncertain_is_on_the_operator_s_list_once_the_order_stops() {
    let mut f = reporting();
    f.workflow = Workflow::from_json(
        r#"{"name":"accounts","steps":[
            {"name":"welcome","agent":"notify","on_failure":"report","expired_leases":1},
            {"name":"activate","agent":"ledger"}]}"#,
        &[AgentName::new("ledger"), AgentName::new("notify")],
    )
    .unwrap();
    let r = claimed(&f, &f.new_record());
    let r = f.expire(&r, r.earliest_lease().unwrap()).next;
    assert!(r.needs_manual_undo().is_empty(), "passed on a report, it is meant to stay");
    let r = claimed(&f, &r);
    let t = f.reply(&r, StepOutcome::failed("frozen"), r.updated_at);
    assert_eq!(t.next.process_state, ProcessState::Error);
    assert_eq!(t.next.needs_manual_undo(), ["welcome"]);
    assert_eq!(statuses(&t.effects), [StatusKind::Failed]);
}

#[test]
fn an_output_too_large_fails_its_step_which_is_undone_as_done() {
    let f = reporting();
    let r = claimed(&f, &f.new_record());
    let big = json!({ "statement": "x".repeat(MAX_OUTPUT_LEN) });
    // From an agent that sends it anyway, or from one that says how large it was.
    for outcome in [StepOutcome::Done { output: big.clone() }, StepOutcome::done(big.clone())] {
        let t = f.reply(&r, outcome, T0.plus(secs(1)));
        let c = &t.next;
        let bytes = serde_json::to_string(&big).unwrap().len() as u64;
        let limit = MAX_OUTPUT_LEN as u64;
        assert_eq!(c.cause, Some(Cause::OutputTooLarge { step: "open".into(), bytes, limit }));
        assert_eq!(c.steps[0].output, None, "never stored");
        assert!(c.steps[0].detail.as_deref().unwrap().contains("larger than the 512 bytes"));
        // The account was opened: it is closed again.
        assert_eq!((c.phase, c.steps[0].status), (Phase::Compensating, StepStatus::ToUndo));
        assert_eq!(t.effects.last(), Some(&Effect::Dispatch { step: cursor(&t.next) }));
    }
}

#[test]
fn an_output_too_large_on_a_reported_step_passes_it_done_without_its_output() {
    let f = reporting();
    let r = f.done(&claimed(&f, &f.new_record()), T0.plus(secs(1)));
    let t = f.reply(&r, StepOutcome::TooLarge { bytes: 9_000 }, T0.plus(secs(2)));
    let r = t.next;
    assert_eq!((cursor(&r), r.cause.as_ref()), (2, None));
    assert_eq!((r.steps[1].status, r.steps[1].output.as_ref()), (StepStatus::Done, None));
    assert_eq!(r.steps[1].reported.as_ref().map(Cause::kind), Some("output_too_large"));
    let p = f.done(&r, T0.plus(secs(3)));
    assert_eq!((p.process_state, p.alert), (ProcessState::Processed, Some(AlertDelivery::Pending)));
}

#[test]
fn a_cancel_waiting_on_a_reported_step_that_fails_undoes_the_order() {
    let f = reporting();
    let r = f.done(&claimed(&f, &f.new_record()), T0.plus(secs(1)));
    let cancel = Input::Command {
        command: CommandKind::Cancel,
        id: "cancel-1",
        by: "ops",
        reason: "customer asked",
        after: Duration::ZERO,
    };
    let waiting = f.apply(&r, cancel, T0.plus(secs(2))).next;
    assert!(matches!(waiting.stop, Some(Stop { command: CommandKind::Cancel, .. })));
    let t = f.reply(&waiting, StepOutcome::failed("mailbox full"), T0.plus(secs(3)));
    assert_eq!(t.next.phase, Phase::Compensating, "the cancel stops it, report or not");
    assert_eq!(t.next.steps[1].reported, None);
    assert!(matches!(t.next.cause, Some(Cause::Cancelled { .. })));
}

#[test]
fn a_redrive_does_a_reported_refusal_again_under_new_keys() {
    let f = reporting();
    let r = f.done(&claimed(&f, &f.new_record()), T0.plus(secs(1)));
    let r = f.reply(&r, StepOutcome::failed("mailbox full"), T0.plus(secs(2))).next;
    // Activation times out with nothing to undo it: the order ends in Error.
    let mut r = r;
    for _ in 0..f.config.failure_threshold {
        let now = r.earliest_lease().unwrap();
        let t = f.expire(&r, now);
        r = t.next;
        if r.process_state == ProcessState::Pending && r.phase == Phase::Forward {
            r = f.claim(&r, now.plus(secs(300)));
        }
    }
    assert_eq!((r.phase, step_ref(&r).name.as_str()), (Phase::Compensating, "open"));
    let r = claimed(&f, &r);
    let r = f.reply(&r, StepOutcome::done(json!({})), r.updated_at).next;
    assert_eq!(r.process_state, ProcessState::Error);
    let redrive = Input::Command {
        command: CommandKind::Redrive,
        id: "redrive-1",
        by: "ops",
        reason: "mailbox emptied",
        after: Duration::ZERO,
    };
    let again = f.apply(&r, redrive, r.updated_at).next;
    assert_eq!(again.steps[1].status, StepStatus::NotStarted);
    assert_eq!((again.steps[1].reported.as_ref(), again.steps[1].generation), (None, 1));
}
