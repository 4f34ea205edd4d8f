//! Answers from outside to a step that waits for a callback: its token, a heartbeat, a
//! completion or a refusal.

use super::*;

/// An answer as [`answer`] takes it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Answered<'a> {
    pub(super) step: &'a str,
    pub(super) token: Option<&'a str>,
    pub(super) answer: &'a Answer,
    pub(super) by: &'a str,
    pub(super) reason: &'a str,
}

/// Decides an answer to a step that waits for a callback. It counts only while the step waits,
/// and, from outside, only with the token the step's announcement carried; anything else
/// changes nothing and is refused with the reason.
pub(super) fn answer(record: &StateRecord, a: Answered<'_>, ctx: &Ctx<'_>) -> Decision {
    let (Some(step), Some(i)) =
        (ctx.workflow.step_named(a.step), record.steps.iter().position(|s| s.name == a.step))
    else {
        return Decision::Refuse(Refused::UnknownStep { step: a.step.to_owned() });
    };
    if !matches!(step.work, Work::Callback) {
        return Decision::Refuse(Refused::NoCallback { step: a.step.to_owned() });
    }
    let state = &record.steps[i];
    if let Some(token) = a.token
        && !state.token.as_deref().is_some_and(|t| same_token(t, token))
        && !mutants::on(Mutant::AnswerWithAnyToken)
    {
        return Decision::Refuse(Refused::WrongToken { step: a.step.to_owned() });
    }
    if record.last_input == InputRef::Answer(a.step.to_owned()) && state.lease.is_none() {
        // This answer was the last write: its handler may have died before its effects.
        return Decision::Replay(match record.process_state {
            ProcessState::Pending | ProcessState::Processing => kicks(record),
            ProcessState::Paused => Vec::new(),
            _ => replay(record, ctx),
        });
    }
    if !record.process_state.is_in_flight() || state.sent().is_none() {
        let (status, state) = (state.status, record.process_state);
        return Decision::Refuse(Refused::NotWaiting { step: a.step.to_owned(), status, state });
    }
    if let Answer::Complete { output } = a.answer
        && let Some(bytes) = output_len(output)
    {
        return Decision::Refuse(Refused::OutputTooLarge { bytes, limit: MAX_OUTPUT_LEN as u64 });
    }
    let mut next = begin(record, ctx, InputRef::Answer(a.step.to_owned()));
    let limit = ctx.config.timeline_limit;
    let mut effects = Vec::new();
    if *a.answer != Answer::Heartbeat {
        next.active_since = Some(ctx.now);
    }
    match a.answer {
        Answer::Heartbeat => {
            // Still at it: the timeout starts again, under the same token.
            if let Some(lease) = &mut next.steps[i].lease {
                lease.complete_by = ctx.now.plus(step.budget);
                effects.extend(callback_end(lease, ctx));
                next.steps[i].answer_by = Some(lease.complete_by);
            }
            next.complete_by = next.index_key(next.complete_by);
            return apply(next, effects);
        }
        Answer::Complete { output } => {
            next.steps[i].lease = None;
            next.steps[i].status = StepStatus::Done;
            next.steps[i].output = Some(output.clone());
            next.note_answer(ctx.now, Happening::StepDone, a.step, a.by, a.reason, limit);
            effects = status(ctx, StatusKind::StepDone, Some(a.step.to_owned()));
        }
        Answer::Refuse => {
            next.steps[i].lease = None;
            next.steps[i].status = StepStatus::Failed;
            let reason = format!("refused by {}: {}", a.by, a.reason);
            next.steps[i].detail = Some(reason.clone());
            next.note_answer(ctx.now, Happening::StepFailed, a.step, a.by, a.reason, limit);
            failed(&mut next, i, Cause::StepRejected { step: a.step.to_owned(), reason }, ctx);
        }
    }
    proceed(next, effects, ctx, Via::KICK)
}

/// Compares two tokens in a time that does not tell how much of a guess was right.
pub(super) fn same_token(expected: &str, given: &str) -> bool {
    let (a, b) = (expected.as_bytes(), given.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
