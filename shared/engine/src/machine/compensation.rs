//! Undoing what was done, in reverse order of the dependencies; the order's end in Error with
//! its alert; and replaying the effects of a transition already written.

use super::*;

/// Compensating: starts every undo that no step depending on it still waits for (undos run
/// in reverse order of the dependencies, independent ones at once), or ends the order once
/// nothing is left to undo.
pub(super) fn undo_next(
    mut next: StateRecord,
    mut effects: Vec<Effect>,
    ctx: &Ctx<'_>,
    via: Via,
) -> Decision {
    let queued: HashSet<&str> = next
        .steps
        .iter()
        .filter(|s| s.status == StepStatus::ToUndo)
        .map(|s| s.name.as_str())
        .collect();
    let ready: Vec<usize> = next
        .steps
        .iter()
        .enumerate()
        .filter(|(_, s)| s.status == StepStatus::ToUndo && s.lease.is_none())
        .filter(|(_, s)| ctx.workflow.downstream(&s.name).is_disjoint(&queued))
        .map(|(i, _)| i)
        .collect();
    if let Err(decision) = start(&mut next, &ready, &mut effects, ctx, via) {
        return decision;
    }
    if next.steps.iter().any(|s| s.lease.is_some()) {
        return in_flight(next, effects);
    }
    first(effects, fail(next, ctx))
}

/// Nothing is in flight any more: queues every completed step that has a compensation for
/// undoing, and starts the undos nothing waits for. A step not reached in this run but sent
/// under its current keys before (a redrive kept the keys of a step whose outcome was
/// unknown, or a step was taken back before its claim) is as uncertain as ever: undone if it
/// can be, otherwise left on the operator's list.
pub(super) fn compensate(mut next: StateRecord, ctx: &Ctx<'_>, via: Via) -> Decision {
    for s in &mut next.steps {
        let undoable = has_compensation(ctx.workflow, &s.name);
        match s.status {
            StepStatus::Done if undoable => s.status = StepStatus::ToUndo,
            // Passed on a report while its outcome was unknown: now the order stops after all.
            StepStatus::Uncertain if undoable && s.reported.is_some() => {
                s.status = StepStatus::ToUndo;
            }
            StepStatus::NotStarted if s.dispatched => {
                s.status = if undoable { StepStatus::ToUndo } else { StepStatus::Uncertain };
                s.detail = Some("sent before the order stopped; its outcome is unknown".into());
            }
            _ => {}
        }
    }
    if !next.steps.iter().any(|s| s.status == StepStatus::ToUndo) {
        return fail(next, ctx);
    }
    next.phase = Phase::Compensating;
    next.note(ctx.now, Happening::CompensationStarted, None, ctx.config.timeline_limit);
    let effects = status(ctx, StatusKind::Compensating, None);
    undo_next(next, effects, ctx, via)
}

/// Ends the order once nothing is left to undo: Cancelled if an operator cancelled it and
/// nothing is left to revert by hand; otherwise Error with its alert pending, the record
/// staying in the expiry index until the alert is known to be published.
pub(super) fn fail(mut next: StateRecord, ctx: &Ctx<'_>) -> Decision {
    for s in &mut next.steps {
        // Only reachable when the workflow lost a step's compensation while the order was in
        // flight: what could not be undone is left to the operator.
        if s.status == StepStatus::ToUndo {
            s.status = StepStatus::Uncertain;
        }
        s.lease = None;
    }
    next.locked_by = None;
    next.stop = None;
    next.ended_at = Some(ctx.now);
    let limit = ctx.config.timeline_limit;
    if let Some(Cause::Cancelled { by, reason }) = next.cause.clone() {
        if next.needs_manual_undo().is_empty() {
            next.process_state = ProcessState::Cancelled;
            next.complete_by = None;
            next.note_command(ctx.now, Happening::Cancelled, &by, &reason, limit);
            let mut effects = status(ctx, StatusKind::Cancelled, None);
            effects.extend(tell_parent(&next));
            return apply(next, effects);
        }
    }
    if matches!(next.cause, Some(Cause::KeyBusy { .. })) {
        // Skipped: it never ran, and its workflow asked for exactly that.
        next.process_state = ProcessState::Cancelled;
        next.complete_by = None;
        next.note(ctx.now, Happening::Cancelled, None, limit);
        let mut effects = status(ctx, StatusKind::Cancelled, None);
        effects.extend(tell_parent(&next));
        return apply(next, effects);
    }
    let kind = if next.needs_manual_undo().is_empty()
        && next.steps.iter().any(|s| s.status == StepStatus::Undone)
    {
        StatusKind::Compensated
    } else {
        StatusKind::Failed
    };
    next.process_state = ProcessState::Error;
    next.alert = Some(AlertDelivery::Pending);
    next.complete_by = Some(ctx.now.plus(ctx.config.alert_retry_after));
    let happening =
        if kind == StatusKind::Compensated { Happening::Compensated } else { Happening::Failed };
    next.note(ctx.now, happening, None, limit);
    let mut effects = status(ctx, kind, None);
    effects.push(Effect::Alert);
    effects.extend(tell_parent(&next));
    apply(next, effects)
}

/// What a child order owes its parent once it ends: word of how it ended.
pub(super) fn tell_parent(record: &StateRecord) -> Option<Effect> {
    record.parent.as_ref().map(|_| Effect::TellParent)
}

/// The supervisor found an Error record whose alert was never confirmed.
pub(super) fn retry_alert(record: &StateRecord, seen: Timestamp, ctx: &Ctx<'_>) -> Decision {
    if let Some(ignored) = not_expired(record, seen, ctx) {
        return Decision::Ignore(ignored);
    }
    // Taking a new deadline first means a second supervisor cannot publish it at the same time.
    let mut next = begin(record, ctx, InputRef::Expire);
    next.complete_by = Some(ctx.now.plus(ctx.config.alert_retry_after));
    let mut effects = status(ctx, terminal_kind(record), None);
    effects.push(Effect::Alert);
    apply(next, effects)
}

pub(super) fn alert_sent(record: &StateRecord, ctx: &Ctx<'_>) -> Decision {
    // The input that produced the Error stays the last input: its redelivery still replays the
    // terminal status event, but no longer the alert.
    let mut next = begin(record, ctx, record.last_input.clone());
    next.alert = Some(AlertDelivery::Sent);
    // An order whose key's place is not yet recorded given back stays where the supervisor
    // finds it.
    if !next.release_pending() {
        next.complete_by = None;
    }
    next.note(ctx.now, Happening::AlertSent, None, ctx.config.timeline_limit);
    apply(next, Vec::new())
}

/// The side effects a record in this state owes the world, for a redelivered message whose
/// transition was already written: every request in flight again (an agent answers a repeat
/// from its ledger), and a terminal state's event and alert. Non-terminal status events are
/// not replayed: they are informative, and the next terminal event supersedes them.
pub(super) fn replay(record: &StateRecord, ctx: &Ctx<'_>) -> Vec<Effect> {
    match record.process_state {
        ProcessState::Processing => record
            .leased()
            .filter(|(_, _, l)| l.sent)
            .map(|(i, s, _)| {
                if starts_child(ctx, s) {
                    children_again(ctx, s, i)
                } else if awaits_callback(ctx, s) {
                    Effect::Announce { step: i }
                } else {
                    Effect::Dispatch { step: i }
                }
            })
            .collect(),
        ProcessState::Pending | ProcessState::Paused => Vec::new(),
        ProcessState::Processed | ProcessState::Error | ProcessState::Cancelled => {
            let mut effects = status(ctx, terminal_kind(record), None);
            if record.alert == Some(AlertDelivery::Pending) {
                effects.push(Effect::Alert);
            }
            if record.parent.is_some() {
                effects.push(Effect::TellParent);
            }
            if record.slot.is_some() {
                effects.push(Effect::Release);
            }
            if pages_done(record) {
                effects.push(Effect::DropPages);
            }
            effects
        }
    }
}

pub(super) fn terminal_kind(record: &StateRecord) -> StatusKind {
    match record.process_state {
        ProcessState::Processed => StatusKind::Processed,
        ProcessState::Cancelled => StatusKind::Cancelled,
        _ if record.needs_manual_undo().is_empty()
            && record.steps.iter().any(|s| s.status == StepStatus::Undone) =>
        {
            StatusKind::Compensated
        }
        _ => StatusKind::Failed,
    }
}

/// Whether `step` can be undone: by its compensation, or, starting a child, by the child's.
pub(super) fn has_compensation(workflow: &Workflow, step: &str) -> bool {
    workflow
        .step_named(step)
        .is_some_and(|s| s.compensation.is_some() || matches!(s.work, Work::Child(_)))
}

pub(super) fn unknown_step(state: &StepState) -> Decision {
    Decision::Illegal(Illegal::UnknownStep { step: state.name.clone() })
}
