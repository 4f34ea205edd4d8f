//! Operators' commands: cancel, pause, resume, redrive, acknowledge and undo, each recorded with
//! who gave it and why, refused when it does not fit the order's state.

use super::*;

/// An operator command as [`operate`] takes it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Command<'a> {
    pub(super) kind: CommandKind,
    pub(super) id: &'a str,
    pub(super) by: &'a str,
    pub(super) reason: &'a str,
    pub(super) after: Duration,
}

impl Command<'_> {
    /// How the steps the command frees are started: kicked, after its delay.
    fn via(&self) -> Via {
        Via::Kick { after: self.after }
    }
}

/// Decides an operator command. See the second table of the module documentation.
pub(super) fn operate(record: &StateRecord, cmd: Command<'_>, ctx: &Ctx<'_>) -> Decision {
    if let Some(earlier) = record.commands.iter().find(|c| c.id == cmd.id) {
        if earlier.command != cmd.kind {
            return Decision::Refuse(Refused::IdReused {
                id: cmd.id.to_owned(),
                earlier: earlier.command,
            });
        }
        // The command's write was the last one: its handler may have died before the effects.
        if record.last_input == InputRef::Command(cmd.id.to_owned()) {
            return Decision::Replay(match record.process_state {
                ProcessState::Pending | ProcessState::Processing => kicks(record),
                ProcessState::Paused => Vec::new(),
                // An acknowledgement owes the world nothing.
                _ if earlier.command == CommandKind::Acknowledge => Vec::new(),
                _ => replay(record, ctx),
            });
        }
        return Decision::Ignore(Ignored::AlreadyApplied);
    }
    let state = record.process_state;
    let decision = match cmd.kind {
        CommandKind::Cancel => cancel(record, cmd, ctx),
        CommandKind::Pause => pause(record, cmd, ctx),
        CommandKind::Resume => resume(record, cmd, ctx),
        CommandKind::Acknowledge => acknowledge(record, cmd, ctx),
        CommandKind::Undo => undo(record, cmd, ctx),
        CommandKind::Redrive | CommandKind::RedriveCompensation if state != ProcessState::Error => {
            Err(match state {
                ProcessState::Processed | ProcessState::Cancelled => {
                    Refused::Finished { state, command: cmd.kind }
                }
                _ => Refused::NotFailed { state },
            })
        }
        CommandKind::Redrive => redrive(record, cmd, ctx),
        CommandKind::RedriveCompensation => redrive_compensation(record, cmd, ctx),
    };
    match decision {
        Ok(Decision::Apply(mut t)) => {
            t.next.commands.push(CommandEntry {
                id: cmd.id.to_owned(),
                command: cmd.kind,
                by: cmd.by.to_owned(),
                reason: cmd.reason.to_owned(),
                at: ctx.now,
            });
            let excess = t.next.commands.len().saturating_sub(COMMANDS_KEPT);
            t.next.commands.drain(..excess);
            Decision::Apply(t)
        }
        Ok(Decision::Illegal(Illegal::UnknownStep { step })) => {
            Decision::Refuse(Refused::UnknownStep { step })
        }
        Ok(other) => other,
        Err(refused) => Decision::Refuse(refused),
    }
}

/// Cancel: at once when no step is in flight, else once the steps in flight are finished.
pub(super) fn cancel(
    record: &StateRecord,
    cmd: Command<'_>,
    ctx: &Ctx<'_>,
) -> Result<Decision, Refused> {
    let state = record.process_state;
    if state.is_terminal() {
        return Err(Refused::Finished { state, command: cmd.kind });
    }
    if record.phase == Phase::Compensating || record.cause.is_some() {
        return Err(Refused::Undoing { state });
    }
    if matches!(&record.stop, Some(stop) if stop.command == CommandKind::Cancel) {
        return Err(Refused::Cancelling);
    }
    let limit = ctx.config.timeline_limit;
    let mut next = begin(record, ctx, InputRef::Command(cmd.id.to_owned()));
    next.note_command(ctx.now, Happening::CancelRequested, cmd.by, cmd.reason, limit);
    // A waiting pause gives way: the order is to stop for good. Steps queued and not yet
    // sent are taken back; a step sent before (its lease expired, or an earlier run under the
    // same keys timed out) may have taken effect all the same, its answer lost: it is as
    // uncertain as a step in flight, and undone (or reported) too.
    next.stop = Some(stop_of(cmd));
    Ok(proceed(next, Vec::new(), ctx, cmd.via()))
}

/// Pause: at once when no step is in flight, else once the steps in flight are finished.
pub(super) fn pause(
    record: &StateRecord,
    cmd: Command<'_>,
    ctx: &Ctx<'_>,
) -> Result<Decision, Refused> {
    let state = record.process_state;
    let limit = ctx.config.timeline_limit;
    let mut next = begin(record, ctx, InputRef::Command(cmd.id.to_owned()));
    match state {
        ProcessState::Processed | ProcessState::Error | ProcessState::Cancelled => {
            Err(Refused::Finished { state, command: cmd.kind })
        }
        ProcessState::Paused => Err(Refused::AlreadyPaused),
        ProcessState::Pending if record.waits_in_line() => Err(Refused::InLine {
            key: record.slot.as_ref().map(|s| s.key.clone()).unwrap_or_default(),
        }),
        ProcessState::Pending | ProcessState::Processing => match &record.stop {
            Some(stop) if stop.command == CommandKind::Cancel => Err(Refused::Cancelling),
            Some(_) => Err(Refused::Pausing),
            None if record.cause.is_some() => Err(Refused::Undoing { state }),
            None => {
                if state == ProcessState::Processing {
                    next.note_command(
                        ctx.now,
                        Happening::PauseRequested,
                        cmd.by,
                        cmd.reason,
                        limit,
                    );
                }
                next.stop = Some(stop_of(cmd));
                Ok(proceed(next, Vec::new(), ctx, cmd.via()))
            }
        },
    }
}

/// Resume: a paused order goes back to the scheduler; a waiting pause is withdrawn.
pub(super) fn resume(
    record: &StateRecord,
    cmd: Command<'_>,
    ctx: &Ctx<'_>,
) -> Result<Decision, Refused> {
    let state = record.process_state;
    let limit = ctx.config.timeline_limit;
    let mut next = begin(record, ctx, InputRef::Command(cmd.id.to_owned()));
    match (state, &record.stop) {
        (ProcessState::Processing, Some(stop)) if stop.command == CommandKind::Pause => {
            next.stop = None;
            next.note_command(ctx.now, Happening::Resumed, cmd.by, cmd.reason, limit);
            Ok(proceed(next, Vec::new(), ctx, cmd.via()))
        }
        (ProcessState::Paused, _) => {
            next.active_since = Some(ctx.now);
            next.note_command(ctx.now, Happening::Resumed, cmd.by, cmd.reason, limit);
            Ok(proceed(next, Vec::new(), ctx, cmd.via()))
        }
        _ => Err(Refused::NotPaused { state }),
    }
}

/// Redrive: an order in Error runs again from the steps not done. Steps that were undone or
/// refused are done again under keys of a new generation; a step whose outcome is unknown (it
/// timed out and nothing could undo it) keeps its key, so that its service answers what it
/// did rather than doing it twice.
pub(super) fn redrive(
    record: &StateRecord,
    cmd: Command<'_>,
    ctx: &Ctx<'_>,
) -> Result<Decision, Refused> {
    within_window(record, ctx)?;
    if let Some(Cause::Cancelled { by, .. }) = &record.cause {
        return Err(Refused::WasCancelled { by: by.clone() });
    }
    let undo_failed: Vec<String> = record
        .steps
        .iter()
        .filter(|s| s.status == StepStatus::UndoFailed)
        .map(|s| s.name.clone())
        .collect();
    if !undo_failed.is_empty() {
        return Err(Refused::UndoFailed { steps: undo_failed });
    }
    if let Some(s) = record.steps.iter().find(|s| ctx.workflow.step_named(&s.name).is_none()) {
        return Err(Refused::UnknownStep { step: s.name.clone() });
    }
    if record.steps.iter().all(|s| s.status == StepStatus::Done) {
        // Every step is done: an Error record never looks like this.
        return Err(Refused::NotFailed { state: record.process_state });
    }
    let mut next = begin(record, ctx, InputRef::Command(cmd.id.to_owned()));
    for s in &mut next.steps {
        match s.status {
            StepStatus::Done | StepStatus::NotStarted => continue,
            StepStatus::Undone | StepStatus::Failed => {
                s.generation += 1;
                s.dispatched = false;
                s.fan = None;
            }
            StepStatus::Uncertain if mutants::on(Mutant::NewKeysForUncertainSteps) => {
                s.generation += 1;
                s.dispatched = false;
            }
            StepStatus::Uncertain | StepStatus::ToUndo | StepStatus::UndoFailed => {}
        }
        s.status = StepStatus::NotStarted;
        s.output = None;
        s.detail = None;
        s.reported = None;
    }
    next.phase = Phase::Forward;
    next.cause = None;
    Ok(restart(record, next, ctx, cmd))
}

/// Redrive of the compensation: the undos that failed are queued again, under their keys (an
/// undo is idempotent, and harmless where its step never took effect).
pub(super) fn redrive_compensation(
    record: &StateRecord,
    cmd: Command<'_>,
    ctx: &Ctx<'_>,
) -> Result<Decision, Refused> {
    within_window(record, ctx)?;
    if !record.steps.iter().any(|s| s.status == StepStatus::UndoFailed) {
        return Err(Refused::NothingToUndo);
    }
    let mut next = begin(record, ctx, InputRef::Command(cmd.id.to_owned()));
    for s in &mut next.steps {
        if s.status == StepStatus::UndoFailed {
            s.status = StepStatus::ToUndo;
            s.detail = None;
        }
    }
    next.phase = Phase::Compensating;
    Ok(restart(record, next, ctx, cmd))
}

/// Puts a redriven record back in flight, its free steps queued at a new attempt with their
/// start message; an order with a concurrency key waits in line first.
pub(super) fn restart(
    record: &StateRecord,
    mut next: StateRecord,
    ctx: &Ctx<'_>,
    cmd: Command<'_>,
) -> Decision {
    next.failure_count = 0;
    next.alert = None;
    next.ended_at = None;
    next.redrives += 1;
    next.active_since = Some(ctx.now);
    next.note_command(ctx.now, Happening::Redriven, cmd.by, cmd.reason, ctx.config.timeline_limit);
    let relaunched = proceed(next, Vec::new(), ctx, cmd.via());
    in_line_first(record, relaunched, ctx)
}

pub(super) fn within_window(record: &StateRecord, ctx: &Ctx<'_>) -> Result<(), Refused> {
    let ended_at = record.ended_at.unwrap_or(record.updated_at);
    if ended_at.plus(ctx.config.redrive_window) < ctx.now {
        return Err(Refused::TooLate { ended_at, window_s: ctx.config.redrive_window.as_secs() });
    }
    Ok(())
}

/// Holds a record where it stands: Paused, out of the expiry index, at a new attempt so that
/// no message sent before counts.
pub(super) fn hold(next: &mut StateRecord, ctx: &Ctx<'_>, by: &str, reason: &str) {
    next.process_state = ProcessState::Paused;
    next.locked_by = None;
    next.complete_by = None;
    next.stop = None;
    next.attempt += 1;
    next.note_command(ctx.now, Happening::Paused, by, reason, ctx.config.timeline_limit);
}

pub(super) fn stop_of(cmd: Command<'_>) -> Stop {
    Stop { command: cmd.kind, by: cmd.by.to_owned(), reason: cmd.reason.to_owned() }
}

/// The cause to record if an operator's cancel is waiting on `record`.
pub(super) fn cancelled_by(record: &StateRecord) -> Option<Cause> {
    let stop = record.stop.as_ref().filter(|s| s.command == CommandKind::Cancel)?;
    Some(Cause::Cancelled { by: stop.by.clone(), reason: stop.reason.clone() })
}

/// Takes note of the failures a processed order reported: it leaves the operators' list of
/// such orders, and nothing else of it changes.
/// Undo: a Processed order goes back over its completed steps, last first, undoing each by its
/// compensation, as a cancelled order does; it ends Cancelled, or in Error with its alert if a
/// step has no undo or an undo fails.
pub(super) fn undo(
    record: &StateRecord,
    cmd: Command<'_>,
    ctx: &Ctx<'_>,
) -> Result<Decision, Refused> {
    let state = record.process_state;
    if state != ProcessState::Processed {
        return Err(Refused::NotProcessed { state });
    }
    let mut next = begin(record, ctx, InputRef::Command(cmd.id.to_owned()));
    let limit = ctx.config.timeline_limit;
    next.note_command(ctx.now, Happening::UndoRequested, cmd.by, cmd.reason, limit);
    next.cause = Some(Cause::Cancelled { by: cmd.by.to_owned(), reason: cmd.reason.to_owned() });
    next.ended_at = None;
    // An alert of the failures it reported is moot now: the order is undone on purpose, and
    // gets an alert of its own should anything be left to undo by hand.
    next.alert = None;
    Ok(in_line_first(record, compensate(next, ctx, cmd.via()), ctx))
}

pub(super) fn acknowledge(
    record: &StateRecord,
    cmd: Command<'_>,
    ctx: &Ctx<'_>,
) -> Result<Decision, Refused> {
    if let Some(earlier) = record.commands.iter().find(|c| c.command == CommandKind::Acknowledge) {
        return Err(Refused::Acknowledged { by: earlier.by.clone() });
    }
    if record.process_state != ProcessState::Processed || record.unacknowledged_report().is_none() {
        return Err(Refused::NothingReported { state: record.process_state });
    }
    let mut next = begin(record, ctx, InputRef::Command(cmd.id.to_owned()));
    let limit = ctx.config.timeline_limit;
    next.note_command(ctx.now, Happening::Acknowledged, cmd.by, cmd.reason, limit);
    Ok(apply(next, Vec::new()))
}

/// The parent undoes the step that started this child: a processed child is undone, one in
/// flight cancelled, as an operator's command would (recorded with the parent as its author),
/// and from now on the child's end answers the parent's undo. A child already ended tells
/// its parent at once how.
pub(super) fn parent_undo(record: &StateRecord, parent: &Parent, ctx: &Ctx<'_>) -> Decision {
    let kind = match record.process_state {
        ProcessState::Processed => CommandKind::Undo,
        _ => CommandKind::Cancel,
    };
    from_parent(record, parent, kind, true, ctx)
}

/// The parent stops while this child is in flight: the child is cancelled; its end still
/// answers the parent's step.
pub(super) fn parent_stop(record: &StateRecord, parent: &Parent, ctx: &Ctx<'_>) -> Decision {
    if record.process_state.is_terminal() {
        return Decision::Ignore(Ignored::Terminal);
    }
    from_parent(record, parent, CommandKind::Cancel, false, ctx)
}

/// Applies `kind` to the child as its parent's command (one id per parent lease), and, with
/// `relink`, answers the parent's lease `parent` from now on.
fn from_parent(
    record: &StateRecord,
    parent: &Parent,
    kind: CommandKind,
    relink: bool,
    ctx: &Ctx<'_>,
) -> Decision {
    let id = format!("parent-{}-{}", parent.step.direction.as_str(), parent.attempt);
    let by = format!("order {}", parent.order_id);
    let reason = match parent.step.direction {
        Direction::Do => "its parent order stops",
        Direction::Undo => "its parent order is undone",
    };
    let linked = record.parent.as_ref() == Some(parent) || !relink;
    let cmd = Command { kind, id: &id, by: &by, reason, after: Duration::ZERO };
    match operate(record, cmd, ctx) {
        Decision::Apply(mut t) => {
            if relink {
                t.next.parent = Some(parent.clone());
            }
            if t.next.process_state.is_terminal() && !t.effects.contains(&Effect::TellParent) {
                t.effects.push(Effect::TellParent);
            }
            Decision::Apply(t)
        }
        // Nothing to cancel or undo (it is being undone already, or it ended): only the link
        // changes, and a child that ended says so.
        Decision::Refuse(_) if !linked => {
            let mut next = begin(record, ctx, InputRef::Command(id));
            next.parent = Some(parent.clone());
            let effects = match next.process_state.is_terminal() {
                true => vec![Effect::TellParent],
                false => Vec::new(),
            };
            apply(next, effects)
        }
        Decision::Refuse(_) if record.process_state.is_terminal() => {
            Decision::Replay(vec![Effect::TellParent])
        }
        Decision::Refuse(_) => Decision::Ignore(Ignored::AlreadyApplied),
        other => other,
    }
}
