//! An agent's reply to the lease it names, and how the order goes on from a step's end: the
//! steps it freed, a stop after a failure, or Processed.

use super::*;

/// A reply: only the lease it names, if that lease was sent, is moved by it.
pub(super) fn reply(
    record: &StateRecord,
    attempt: u64,
    step: &StepRef,
    outcome: &StepOutcome,
    message: &str,
    ctx: &Ctx<'_>,
) -> Decision {
    if let Some(k) = step.element {
        return element(record, attempt, step, k, outcome, message, ctx);
    }
    let (i, leased, lease) = match answered(record, attempt, step) {
        Ok(found) => found,
        Err(decision) => return decision,
    };
    if awaits_callback(ctx, leased) || !whole_reply_fits(ctx, leased) {
        // Nothing goes to an agent for a callback: no agent can answer for it.
        return Decision::Illegal(Illegal::NotDispatched { attempt });
    }
    let direction = leased.direction();
    let mut next = begin(record, ctx, InputRef::Message(message.to_owned()));
    next.steps[i].lease = None;
    let name = leased.name.clone();
    let limit = ctx.config.timeline_limit;
    // An agent of this version answers TooLarge itself; one of another may not.
    let too_large = match outcome {
        StepOutcome::Done { output } => output_len(output),
        StepOutcome::TooLarge { bytes } => Some(*bytes),
        StepOutcome::Failed { .. } | StepOutcome::Held { .. } | StepOutcome::Deferred { .. } => {
            None
        }
    };
    let mut effects = Vec::new();
    match (direction, outcome) {
        (Direction::Do, StepOutcome::Done { output }) if too_large.is_none() => {
            next.steps[i].status = StepStatus::Done;
            next.steps[i].output = Some(output.clone());
            next.note(ctx.now, Happening::StepDone, Some(name.clone()), limit);
            effects = status(ctx, StatusKind::StepDone, Some(name));
        }
        (Direction::Do, StepOutcome::Done { .. } | StepOutcome::TooLarge { .. }) => {
            // The effect is in place but its output cannot be carried: the step is done,
            // without its output, and fails; undone with the others, its undo is told nothing.
            let bytes = too_large.unwrap_or_default();
            // An agent that stores large outputs answers TooLarge only above what it may
            // store; one that does not (or a Done carrying more than a record keeps), above
            // what a record keeps.
            let limit = if bytes > MAX_PAYLOAD_LEN as u64 {
                MAX_PAYLOAD_LEN as u64
            } else {
                MAX_OUTPUT_LEN as u64
            };
            next.steps[i].status = StepStatus::Done;
            next.steps[i].detail = Some(format!(
                "its output of {bytes} bytes is larger than the {limit} bytes a step may return"
            ));
            failed(&mut next, i, Cause::OutputTooLarge { step: name, bytes, limit }, ctx);
        }
        (Direction::Do, StepOutcome::Failed { reason }) => {
            next.steps[i].status = StepStatus::Failed;
            next.steps[i].detail = Some(reason.clone());
            // The agent reported a permanent fault: the step took no effect, so only the steps
            // done before it are undone.
            failed(&mut next, i, Cause::StepRejected { step: name, reason: reason.clone() }, ctx);
        }
        (Direction::Undo, StepOutcome::Done { .. } | StepOutcome::TooLarge { .. }) => {
            next.steps[i].status = StepStatus::Undone;
            next.note(ctx.now, Happening::StepUndone, Some(name), limit);
        }
        (_, StepOutcome::Held { reason, action }) => {
            // Nothing is known of the effect of the calls made before the hold: the step
            // waits under the same keys, so that its service answers what it did.
            park(&mut next, i, &lease, reason, action.as_deref(), ctx);
        }
        (_, StepOutcome::Deferred { until }) => match defer(&mut next, i, &lease, *until, ctx) {
            Some(kick) => effects.push(kick),
            None => return unknown_step(&next.steps[i]),
        },
        (Direction::Undo, StepOutcome::Failed { reason }) => {
            // One undo refused does not stop the others: release the stock even if the refund
            // failed. The operator gets the list of what is left.
            next.steps[i].status = StepStatus::UndoFailed;
            next.steps[i].detail = Some(reason.clone());
            next.note(ctx.now, Happening::UndoFailed, Some(name), limit);
        }
    }
    proceed(next, effects, ctx, Via::Lease)
}

/// The step a reply (or a child's end) answers, with its lease: the lease at `attempt`, sent,
/// of the step and direction it names; otherwise what to decide instead (stale, or illegal).
pub(super) fn answered<'r>(
    record: &'r StateRecord,
    attempt: u64,
    step: &StepRef,
) -> Result<(usize, &'r StepState, Lease), Decision> {
    let Some((i, leased, lease)) = holder(record, attempt, step) else {
        return Err(Decision::Ignore(Ignored::Stale {
            received: attempt,
            current: record.attempt,
        }));
    };
    if !lease.sent {
        return Err(Decision::Illegal(Illegal::NotDispatched { attempt }));
    }
    if step.index != i || step.name != leased.name {
        return Err(Decision::Illegal(Illegal::WrongStep {
            leased: leased.name.clone(),
            replied: step.name.clone(),
        }));
    }
    let direction = leased.direction();
    if step.direction != direction {
        return Err(Decision::Illegal(Illegal::WrongDirection {
            leased: direction,
            replied: step.direction,
        }));
    }
    Ok((i, leased, *lease))
}

/// The step whose lease holds `attempt`, with the lease.
pub(super) fn holder<'r>(
    record: &'r StateRecord,
    attempt: u64,
    step: &StepRef,
) -> Option<(usize, &'r StepState, &'r Lease)> {
    record.leased().find(|(_, _, l)| l.attempt == attempt).or_else(|| {
        // A mutant that takes an older attempt's reply for the step's current one.
        let (i, s, l) = record.leased().find(|(i, _, l)| *i == step.index && l.sent)?;
        (mutants::on(Mutant::ReplyFromPreviousAttempt) && attempt < l.attempt).then_some((i, s, l))
    })
}

/// Step `i` failed for good, for `cause`, its status already set. A step whose failures are
/// only reported is passed, and the order goes on; any other failure (or any failure while a
/// cancel waits, or while the order already stops) stops the order: nothing new starts, and
/// once the steps in flight are finished, what was done is undone.
pub(super) fn failed(next: &mut StateRecord, i: usize, cause: Cause, ctx: &Ctx<'_>) {
    let name = next.steps[i].name.clone();
    let limit = ctx.config.timeline_limit;
    let cancel = cancelled_by(next);
    let policy = ctx.workflow.step_named(&name).map(|s| s.on_failure);
    if policy == Some(OnFailure::Report) && cancel.is_none() && next.cause.is_none() {
        next.steps[i].reported = Some(cause);
        next.note(ctx.now, Happening::StepReported, Some(name), limit);
        return;
    }
    // An expiry is on the timeline already, and so is a refusal from outside, with who gave
    // it and why.
    let noted = next.timeline.last().is_some_and(|e| {
        e.what == Happening::StepFailed && e.at == ctx.now && e.step.as_deref() == Some(&name)
    });
    if !matches!(cause, Cause::StepTimedOut { .. }) && !noted {
        next.note(ctx.now, Happening::StepFailed, Some(name), limit);
    }
    // The first cause is the order's: a step failing while it stops only adds to the undo.
    if next.cause.is_none() {
        next.cause = Some(cancel.unwrap_or(cause));
    }
}

/// How the steps a transition starts get to their agents: the scheduler leases and dispatches
/// them in the same write; the supervisor and the operators' commands queue them and kick the
/// scheduler, which keeps the roles apart.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Via {
    Lease,
    /// Queued, with a start message `after` this long.
    Kick {
        after: Duration,
    },
}

impl Via {
    /// Queued, with a start message at once.
    pub(super) const KICK: Via = Via::Kick { after: Duration::ZERO };
}

/// Where the order goes once a transition has settled the steps it touched: the steps (or
/// undos) that are now free to start are started; an order that stops waits for its steps in
/// flight, then pauses or undoes what it did; an order with nothing left to do or undo ends.
pub(super) fn proceed(
    mut next: StateRecord,
    mut effects: Vec<Effect>,
    ctx: &Ctx<'_>,
    via: Via,
) -> Decision {
    if next.phase == Phase::Forward {
        let stopping = next.cause.is_some() || next.stop.is_some();
        if !stopping {
            return go_on(next, effects, ctx, via);
        }
        // Nothing new starts: the steps queued and not yet sent are taken back (a step sent
        // under its keys before is as uncertain as ever, and compensation judges it), and so
        // are callbacks, whose answer nothing would wait for now: their tokens stop counting.
        for i in 0..next.steps.len() {
            if next.steps[i].lease.is_some_and(|l| !l.sent) || awaits_callback(ctx, &next.steps[i])
            {
                next.steps[i].lease = None;
            }
        }
        if next.steps.iter().any(|s| s.lease.is_some()) {
            // A child in flight is asked to stop: the order does not wait out its whole run.
            // (A pause waits for it.)
            let ending = next.cause.is_some() || cancelled_by(&next).is_some();
            for (i, s) in next.steps.iter().enumerate() {
                if ending
                    && s.sent().is_some()
                    && s.direction() == Direction::Do
                    && starts_child(ctx, s)
                {
                    effects.push(Effect::StopChild { step: i });
                }
            }
            return in_flight(next, effects);
        }
        if let Some(stop) = next.stop.take()
            && next.cause.is_none()
        {
            // A child its parent undoes is undone even so: its parent counts on it.
            let undone_by_parent = next.parent.as_ref().is_some_and(|p| {
                p.step.direction == Direction::Undo
                    && !mutants::on(Mutant::ChildKeptWhenUndoComesLate)
            });
            if next.steps.iter().all(StepState::passed) && !undone_by_parent {
                // The stop came too late: nothing is left to stop.
                return processed(next, effects, ctx);
            }
            match stop.command {
                CommandKind::Cancel => {
                    next.cause = Some(Cause::Cancelled { by: stop.by, reason: stop.reason });
                }
                _ => {
                    hold(&mut next, ctx, &stop.by, &stop.reason);
                    return apply(next, effects);
                }
            }
        }
        return first(effects, compensate(next, ctx, via));
    }
    undo_next(next, effects, ctx, via)
}

/// Forward, nothing stopping: starts every step whose dependencies (direct or through
/// others) are all passed, or ends the order Processed once every step is.
pub(super) fn go_on(
    mut next: StateRecord,
    mut effects: Vec<Effect>,
    ctx: &Ctx<'_>,
    via: Via,
) -> Decision {
    let mut ready = Vec::new();
    for (i, s) in next.steps.iter().enumerate() {
        if s.status != StepStatus::NotStarted || s.lease.is_some() {
            continue;
        }
        if ctx.workflow.step_named(&s.name).is_none() {
            return unknown_step(s);
        }
        // Through others too: after a redrive, a step kept done may stand between a step and
        // one it depends on that runs again.
        let passed = |d: &&str| next.steps.iter().any(|o| o.name == *d && o.passed());
        if ctx.workflow.upstream(&s.name).iter().all(passed) {
            ready.push(i);
        }
    }
    if let Err(decision) = start(&mut next, &ready, &mut effects, ctx, via) {
        return decision;
    }
    if next.steps.iter().any(|s| s.lease.is_some()) {
        return in_flight(next, effects);
    }
    if next.steps.iter().all(StepState::passed) {
        return processed(next, effects, ctx);
    }
    // A step not passed whose dependencies never will be: only a workflow changed under the
    // order can leave it so.
    let stuck = next.steps.iter().find(|s| !s.passed()).map(|s| s.name.clone());
    Decision::Illegal(Illegal::UnknownStep { step: stuck.unwrap_or_default() })
}

/// The record as its leases make it: Processing while one is sent, Pending while some wait
/// for the scheduler, its CompleteBy where the index holds it while that stays close enough
/// before the earliest lease (see [`crate::state::INDEX_LEAD`]).
pub(super) fn in_flight(mut next: StateRecord, effects: Vec<Effect>) -> Decision {
    if next.steps.iter().any(|s| s.sent().is_some()) {
        next.process_state = ProcessState::Processing;
    } else {
        next.process_state = ProcessState::Pending;
        next.locked_by = None;
    }
    next.complete_by = next.index_key(next.complete_by);
    apply(next, effects)
}

/// Every step is done or reported: Processed. A report owes the operators an alert, which
/// keeps the record in the expiry index until it is known to be published.
pub(super) fn processed(
    mut next: StateRecord,
    mut effects: Vec<Effect>,
    ctx: &Ctx<'_>,
) -> Decision {
    next.process_state = ProcessState::Processed;
    next.locked_by = None;
    next.complete_by = None;
    next.stop = None;
    next.ended_at = Some(ctx.now);
    next.note(ctx.now, Happening::Processed, None, ctx.config.timeline_limit);
    effects.extend(status(ctx, StatusKind::Processed, None));
    if next.steps.iter().any(|s| s.reported.is_some()) {
        next.alert = Some(AlertDelivery::Pending);
        next.complete_by = Some(ctx.now.plus(ctx.config.alert_retry_after));
        effects.push(Effect::Alert);
    }
    effects.extend(tell_parent(&next));
    apply(next, effects)
}
