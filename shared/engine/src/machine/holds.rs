//! Holds: a step whose service is held waits for it without burning its leases. Its lease is
//! queued for nobody (no start message waits for it, and the supervisor's sweeps pass it by)
//! until the supervisor resumes it once the service is open again, or until its `max_hold`
//! ends and the wait counts as the step's failure. A step whose service has no room for its
//! call yet (its declared rate or concurrency, or a throttle) is deferred: it goes again when
//! the agent says there will be room, at a lease that starts then.

use super::*;
use crate::message::MAX_DEFER;
use crate::state::Held;
use crate::workflow::Step;

/// The agent answered that step `i`'s service, or its `action` there, is held: the step (or
/// undo) waits for it at a new attempt, which fences off anything still on its way for the
/// old one. Its count of expired leases is kept as it was, and its time held counts from the
/// first hold.
pub(super) fn park(
    next: &mut StateRecord,
    i: usize,
    lease: &Lease,
    reason: &str,
    action: Option<&str>,
    ctx: &Ctx<'_>,
) {
    let Some(step) = ctx.workflow.step_named(&next.steps[i].name) else { return };
    park_on(next, i, lease, reason, action, step, ctx);
}

/// [`park`], for step `i` whose calls are `step`'s: its own, or, for a pass over a list run
/// inline, its child's, whose service is held and whose `max_hold` it waits for.
pub(super) fn park_on(
    next: &mut StateRecord,
    i: usize,
    lease: &Lease,
    reason: &str,
    action: Option<&str>,
    step: &Step,
    ctx: &Ctx<'_>,
) {
    let name = next.steps[i].name.clone();
    let service = step.agent().map(|a| a.as_str().to_owned()).unwrap_or_default();
    let since = lease.held_since.unwrap_or(ctx.now);
    let mut until = match budget_of(&next.steps[i], ctx) {
        Some(budget) if mutants::on(Mutant::HeldStepBurnsLease) => ctx.now.plus(budget),
        _ => since.plus(step.max_hold(ctx.config.max_hold)),
    };
    // A pass over a list waits no longer than its own timeout.
    if let Some(end) = next.steps[i].ends_by.filter(|_| next.steps[i].direction() == Direction::Do)
    {
        until = until.min(end);
    }
    let action = action.map(str::to_owned);
    next.steps[i].held = Some(Held { service, action, since, reason: reason.to_owned() });
    next.attempt += 1;
    next.steps[i].lease = Some(Lease {
        attempt: next.attempt,
        complete_by: until,
        sent: false,
        failures: lease.failures,
        timer: false,
        held: true,
        held_since: Some(since),
    });
    next.note_wait(ctx.now, &name, WaitingFor::Service, until, ctx.config.timeline_limit);
}

/// The agent found no room at step `i`'s service before its budget ended, until `until`: the
/// step goes again then, at one new attempt (which fences off the old one) whose lease starts
/// then, with a start message due then. Its count of expired leases is kept as it was. `None`
/// if the step is not in the workflow.
pub(super) fn defer(
    next: &mut StateRecord,
    i: usize,
    lease: &Lease,
    until: Timestamp,
    ctx: &Ctx<'_>,
) -> Option<Effect> {
    let budget = budget_of(&next.steps[i], ctx)?;
    let delay = ctx.now.until(until).min(MAX_DEFER);
    next.attempt += 1;
    let attempt = next.attempt;
    let complete_by = ctx.now.plus(delay).plus(ctx.config.claim_grace).plus(budget);
    next.steps[i].lease = Some(Lease {
        attempt,
        complete_by,
        sent: false,
        failures: lease.failures,
        timer: false,
        held: false,
        held_since: None,
    });
    let name = next.steps[i].name.clone();
    let reason = "waits for room at its service";
    next.note_waiting(ctx.now, &name, reason, ctx.now.plus(delay), ctx.config.timeline_limit);
    Some(Effect::Kick { delay, attempt })
}

/// The supervisor found the hold the key `on` names ([`Held::key`]) ended: every step of the
/// order held on it is queued again, at one new attempt, with a start message after `delay`
/// (the supervisor spreads the orders it resumes over time, at the pace the service accepts).
pub(super) fn resume_held(
    record: &StateRecord,
    on: &str,
    delay: Duration,
    ctx: &Ctx<'_>,
) -> Decision {
    let held: Vec<usize> = record
        .leased()
        .filter(|(_, s, l)| l.held && s.held.as_ref().is_some_and(|h| h.key() == on))
        .map(|(i, _, _)| i)
        .collect();
    if held.is_empty() {
        return Decision::Ignore(Ignored::NotHeld);
    }
    let mut next = begin(record, ctx, InputRef::Resume);
    next.attempt += 1;
    let attempt = next.attempt;
    for i in held {
        let Some(budget) = budget_of(&next.steps[i], ctx) else {
            return unknown_step(&next.steps[i]);
        };
        let Some(held) = next.steps[i].lease else { continue };
        let complete_by = ctx.now.plus(delay).plus(ctx.config.claim_grace).plus(budget);
        next.steps[i].lease = Some(Lease { attempt, complete_by, held: false, ..held });
        let name = next.steps[i].name.clone();
        next.note(ctx.now, Happening::HoldEnded, Some(name), ctx.config.timeline_limit);
    }
    in_flight(next, vec![Effect::Kick { delay, attempt }])
}

/// Step `i` waited for its held service until its `max_hold` ended: that is its failure. What
/// its calls before the hold did is unknown, so it is undone with the others if it can be, as
/// after its last expired lease; an undo that waited so is left to the operators.
pub(super) fn held_too_long(next: &mut StateRecord, i: usize, ctx: &Ctx<'_>) {
    let name = next.steps[i].name.clone();
    let (service, held_s) = match &next.steps[i].held {
        Some(h) => (h.service.clone(), h.since.until(ctx.now).as_secs()),
        None => (String::new(), 0),
    };
    let cause = Cause::ServiceHeldTooLong { step: name.clone(), service, held_s };
    next.steps[i].detail = Some(cause.to_string());
    let undoable = ctx.workflow.step_named(&name).is_some_and(|s| {
        s.compensation.is_some() && (s.on_failure == OnFailure::Undo || next.cause.is_some())
    });
    match next.steps[i].direction() {
        Direction::Do => {
            next.steps[i].status =
                if undoable { StepStatus::ToUndo } else { StepStatus::Uncertain };
            failed(next, i, cause, ctx);
        }
        Direction::Undo => {
            next.steps[i].status = StepStatus::UndoFailed;
            next.note(ctx.now, Happening::UndoFailed, Some(name), ctx.config.timeline_limit);
        }
    }
}
