//! A step over a list: one child order per element, at most `max_concurrency` of them in
//! flight, forward and while undoing.
//!
//! The step holds one lease for the whole pass, and its record only counts (the window of
//! [`FanState`]): the elements started, those in flight, those ended well or not. An element's
//! end comes as a reply of the step's lease naming the element; one that is not in flight is a
//! duplicate. Forward, the pass starts elements in order while nothing stops it and fewer
//! have failed than the step tolerates; once none is in flight it ends: every element ended
//! within the tolerance and the step's output is collected from the children (a reply of the
//! lease brings it), or the step failed, its processed children left to undo. Its undo passes
//! over the children started, each undone by its own compensation (one that failed undid
//! itself and answers at once); the step is undone once every one is.

use super::*;
use crate::state::FanState;
use crate::workflow::Fan;

/// How step `state` runs over a list; `None` if it does not.
pub(super) fn fan_of(ctx: &Ctx<'_>, state: &StepState) -> Option<Fan> {
    match ctx.workflow.step_named(&state.name).map(|s| &s.work) {
        Some(Work::Child(child)) => child.fan,
        _ => None,
    }
}

/// Step `i`, just sent, over its list: forward, the list is read first (at its first lease
/// of the run) or the pass goes on where a pause left it; an undo passes over the children
/// started afresh, each of which answers again.
pub(super) fn open(
    next: &mut StateRecord,
    i: usize,
    fan: Fan,
    ctx: &Ctx<'_>,
    effects: &mut Vec<Effect>,
) {
    let direction = next.steps[i].direction();
    let state = next.steps[i].fan.get_or_insert_with(FanState::default);
    match direction {
        Direction::Do if state.items.is_none() => effects.push(Effect::Count { step: i }),
        Direction::Do => advance(next, i, fan, ctx, effects),
        Direction::Undo => {
            state.back = Default::default();
            if state.forward.next == 0 {
                // Nothing started: the undo is answered at once.
                effects.push(Effect::Elements { step: i, elements: Vec::new() });
                return;
            }
            advance(next, i, fan, ctx, effects);
        }
    }
}

/// The list of step `step`, sent at `attempt`, was read: it has `items` elements, or cannot be
/// run (no list at its pointer, too long), and the step fails with nothing done.
pub(super) fn counted(
    record: &StateRecord,
    attempt: u64,
    step: usize,
    items: Result<u32, &str>,
    ctx: &Ctx<'_>,
) -> Decision {
    let stale = Decision::Ignore(Ignored::Stale { received: attempt, current: record.attempt });
    let Some((i, state, _)) = record.leased().find(|(i, s, l)| {
        *i == step && l.attempt == attempt && l.sent && s.direction() == Direction::Do
    }) else {
        return stale;
    };
    let Some(fan) = fan_of(ctx, state) else {
        return Decision::Illegal(Illegal::NotDispatched { attempt });
    };
    if state.fan.as_ref().is_none_or(|f| f.items.is_some()) {
        return stale;
    }
    // The message that sent the step stays the last input: its redelivery replays the pass.
    let mut next = begin(record, ctx, record.last_input.clone());
    let mut effects = Vec::new();
    match items {
        Ok(items) => {
            if let Some(f) = next.steps[i].fan.as_mut() {
                f.items = Some(items);
            }
            advance(&mut next, i, fan, ctx, &mut effects);
        }
        Err(reason) => {
            let name = next.steps[i].name.clone();
            next.steps[i].lease = None;
            next.steps[i].status = StepStatus::Failed;
            next.steps[i].detail = Some(reason.to_owned());
            failed(
                &mut next,
                i,
                Cause::StepRejected { step: name, reason: reason.to_owned() },
                ctx,
            );
        }
    }
    proceed(next, effects, ctx, Via::Lease)
}

/// The child of element `element` of the step `step` names ended, as `outcome` says, for the
/// lease at `attempt`.
pub(super) fn element(
    record: &StateRecord,
    attempt: u64,
    step: &StepRef,
    element: u32,
    outcome: &StepOutcome,
    message: &str,
    ctx: &Ctx<'_>,
) -> Decision {
    let (i, leased, _) = match answered(record, attempt, step) {
        Ok(found) => found,
        Err(decision) => return decision,
    };
    let Some(fan) = fan_of(ctx, leased) else {
        return Decision::Illegal(Illegal::NotDispatched { attempt });
    };
    let direction = leased.direction();
    let ok = match outcome {
        StepOutcome::Done { .. } => true,
        StepOutcome::Failed { .. } => false,
        StepOutcome::TooLarge { .. } | StepOutcome::Held { .. } | StepOutcome::Deferred { .. } => {
            return Decision::Illegal(Illegal::NotDispatched { attempt });
        }
    };
    let running = leased.fan.as_ref().is_some_and(|f| {
        let w = if direction == Direction::Do { &f.forward } else { &f.back };
        w.running.contains(&element)
    });
    if !running && !mutants::on(Mutant::ElementEndsCountedTwice) {
        // Its end was counted already: a duplicate.
        return Decision::Ignore(Ignored::Stale { received: attempt, current: record.attempt });
    }
    let mut next = begin(record, ctx, InputRef::Message(message.to_owned()));
    if let Some(f) = next.steps[i].fan.as_mut() {
        let w = if direction == Direction::Do { &mut f.forward } else { &mut f.back };
        w.running.retain(|&k| k != element);
        if ok {
            w.ok += 1;
        } else {
            w.failed += 1;
        }
    }
    let mut effects = Vec::new();
    advance(&mut next, i, fan, ctx, &mut effects);
    proceed(next, effects, ctx, Via::Lease)
}

/// Whether a reply to the whole of step `state` (not to one element) may be taken: forward,
/// the collected output of a pass that ended well; for its undo, the answer of one with
/// nothing to undo.
pub(super) fn whole_reply_fits(ctx: &Ctx<'_>, state: &StepState) -> bool {
    let Some(fan) = fan_of(ctx, state) else { return true };
    let Some(f) = &state.fan else { return false };
    match state.direction() {
        Direction::Do => f.items.is_some_and(|items| {
            f.forward.next == items
                && f.forward.running.is_empty()
                && f.forward.failed <= fan.tolerance.allows(items)
        }),
        Direction::Undo => f.forward.next == 0,
    }
}

/// What a redelivered message owes step `i`'s pass: the elements in flight again, or the
/// read of its list, or its collection.
pub(super) fn replay_of(state: &StepState, i: usize) -> Effect {
    let Some(f) = &state.fan else { return Effect::Count { step: i } };
    let window = match state.direction() {
        Direction::Do if f.items.is_none() => return Effect::Count { step: i },
        Direction::Do => &f.forward,
        Direction::Undo => &f.back,
    };
    if window.running.is_empty() && state.direction() == Direction::Do {
        return Effect::Collect { step: i };
    }
    Effect::Elements { step: i, elements: window.running.clone() }
}

/// Moves step `i`'s pass on: starts as many elements as its concurrency allows while nothing
/// stops it, and, once none is in flight, ends it.
fn advance(next: &mut StateRecord, i: usize, fan: Fan, ctx: &Ctx<'_>, effects: &mut Vec<Effect>) {
    let direction = next.steps[i].direction();
    // A cancel or a failure ends the pass; a pause only holds it, to go on where it was.
    let ending = next.cause.is_some() || cancelled_by(next).is_some();
    let pausing = next.stop.is_some() && !ending;
    let Some(state) = next.steps[i].fan.as_mut() else { return };
    let Some(items) = state.items else { return };
    let allowed = fan.tolerance.allows(items);
    let tripped = direction == Direction::Do && state.forward.failed > allowed;
    let (window, end) = match direction {
        Direction::Do => (&mut state.forward, items),
        Direction::Undo => (&mut state.back, state.forward.next),
    };
    let held_back = direction == Direction::Do && (tripped || ending || pausing);
    let mut started = Vec::new();
    while !held_back && window.running.len() < fan.max_concurrency as usize && window.next < end {
        window.running.push(window.next);
        started.push(window.next);
        window.next += 1;
    }
    if !started.is_empty() {
        effects.push(Effect::Elements { step: i, elements: started });
    }
    if !window.running.is_empty() {
        return;
    }
    let (next_k, ok, failures) = (window.next, window.ok, window.failed);
    let name = next.steps[i].name.clone();
    let limit = ctx.config.timeline_limit;
    match direction {
        Direction::Do if next_k == items && !tripped && !ending => {
            // Every element ended within the tolerance: the children's outputs are read and
            // come back as the reply of this lease.
            effects.push(Effect::Collect { step: i });
        }
        Direction::Do if pausing && !tripped => next.steps[i].lease = None,
        Direction::Do => {
            let s = &mut next.steps[i];
            s.lease = None;
            // Its processed children took effect: the step is undone with the others.
            s.status = if ok > 0 { StepStatus::ToUndo } else { StepStatus::Failed };
            let detail = if tripped {
                format!("{failures} of {items} elements failed; it tolerates {allowed}")
            } else {
                format!("stopped after {next_k} of {items} elements")
            };
            s.detail = Some(detail.clone());
            if tripped {
                failed(next, i, Cause::StepRejected { step: name, reason: detail }, ctx);
                // Passed on a report, its processed children stay, as an uncertain step's
                // effect does (undone after all should the order stop later).
                let s = &mut next.steps[i];
                if s.reported.is_some() && s.status == StepStatus::ToUndo {
                    s.status = StepStatus::Uncertain;
                }
            }
        }
        Direction::Undo => {
            let s = &mut next.steps[i];
            s.lease = None;
            if failures == 0 {
                s.status = StepStatus::Undone;
                next.note(ctx.now, Happening::StepUndone, Some(name), limit);
            } else {
                s.status = StepStatus::UndoFailed;
                s.detail = Some(format!("the undo of {failures} of {next_k} elements failed"));
                next.note(ctx.now, Happening::UndoFailed, Some(name), limit);
            }
        }
    }
}
