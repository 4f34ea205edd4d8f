//! The state machine: the one place where every state change of an order is decided.
//!
//! [`decide`] takes the record as read, one input, and the time, and returns a [`Decision`]:
//! apply a transition (a new record to write conditionally, and the side effects to perform
//! once the write succeeded), replay the side effects of a transition that was already applied
//! (its message is back because the handler died after writing), ignore the input (stale,
//! duplicate, too early, or the order is finished), or reject it as illegal. It never panics and
//! performs no I/O; the services in [`crate::services`] do the reading, writing and sending.
//!
//! The transitions, by state and input:
//!
//! | state | input | outcome |
//! | --- | --- | --- |
//! | Pending | claim of the current attempt | Processing; lease the current step (or undo) and dispatch it |
//! | any | the queue message that produced the current revision, again | replay its side effects |
//! | Pending, Processing | claim of another attempt | ignored: stale or duplicate |
//! | Processing | reply of the current attempt: done | next step leased and dispatched, or Processed |
//! | Processing | reply of the current attempt: failed | compensation leased and dispatched, or Error and alert |
//! | Processing (undoing) | reply: done or failed | next undo leased and dispatched, or Error and alert |
//! | Pending | reply of the current attempt | illegal: nothing was dispatched at that attempt |
//! | Pending, Processing | reply of another attempt | ignored: stale |
//! | Pending, Processing | expiry, CompleteBy not passed or changed | ignored |
//! | Pending, Processing | expiry, CompleteBy passed by less than the horizon | ignored: its messages may still be waiting in a queue |
//! | Pending | expiry, CompleteBy passed by the horizon, below threshold | FailureCount + 1; Pending at the same attempt with a later CompleteBy; start message again after a wait |
//! | Processing | expiry, CompleteBy passed by the horizon, below threshold | FailureCount + 1; Pending at a new attempt with a later CompleteBy; start message after a wait |
//! | Pending, Processing | expiry, CompleteBy passed by the horizon, at threshold | compensation queued, or Error and alert |
//! | Error (alert pending) | expiry, CompleteBy passed | alert published again |
//! | Error (alert pending) | alert sent | alert recorded, record leaves the expiry index |
//! | Processed, Error | anything else | ignored: terminal states never move |
//!
//! # When an expired lease counts as a failure
//!
//! A lease counts against FailureCount only when the supervisor acts on it, and it acts only
//! once the lease has been expired for longer than the *horizon*: the longest time a message
//! of an order in flight may currently still spend waiting in the queues, as their consumers
//! report it ([`crate::load`]). Queues are roughly first in, first out, so a message that is
//! still waiting is younger than the messages its consumers are taking: however long a backlog
//! lasts, the leases it delays stay within the horizon and never count. A lost message is
//! found all the same: once the messages sent after it have been taken, the horizon no longer
//! covers it, and its lease is judged at most a horizon (and a sweep) after it ended. A reset
//! of a Pending order keeps its attempt, so a start message that was only late still claims
//! it; one of a Processing order takes a new attempt, since the old request is judged lost.

use std::time::Duration;

use crate::config::EngineConfig;
use crate::events::StatusKind;
use crate::ids::Direction;
use crate::message::{StepOutcome, StepRef};
use crate::state::{
    AlertDelivery, Cause, Happening, InputRef, Phase, ProcessState, StateRecord, StepStatus,
};
use crate::time::Timestamp;
use crate::workflow::{Step, Workflow};

/// What a decision needs besides the record and the input.
#[derive(Clone, Copy, Debug)]
pub struct Ctx<'a> {
    pub now: Timestamp,
    pub config: &'a EngineConfig,
    pub workflow: &'a Workflow,
}

/// Something that happened to an order.
#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    /// A start message (queue id `message`) asks the scheduler to claim the order at `attempt`.
    Claim { attempt: u64, owner: &'a str, message: &'a str },
    /// An agent replied (queue id `message`) for a step at `attempt`.
    Reply { attempt: u64, step: &'a StepRef, outcome: &'a StepOutcome, message: &'a str },
    /// The supervisor found the record in the expiry index with this CompleteBy; the record's
    /// messages may still be waiting in a queue for up to `horizon` after it.
    Expire { complete_by: Timestamp, horizon: Duration },
    /// The order's alert was accepted by the event bus.
    AlertSent,
}

/// A side effect to perform after the decision's write succeeded. Effects are described, not
/// built: the service derives the messages from the record that was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Send the request for the record's current step (or undo) to its agent.
    Dispatch,
    /// Send a start message for the record's attempt, after `delay`.
    Kick { delay: Duration },
    /// Publish a status event.
    Status { kind: StatusKind, step: Option<String> },
    /// Publish the order's alert, then record that it was sent.
    Alert,
}

/// A state change to write, and what to do once it is written.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    pub next: StateRecord,
    pub effects: Vec<Effect>,
}

/// Why an input changed nothing. All of these are normal under at-least-once delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ignored {
    /// The order is Processed or Error; terminal states never move.
    Terminal,
    /// The input belongs to another attempt than the record's (older lease, or a duplicate of a
    /// message that was already acted on).
    Stale { received: u64, current: u64 },
    /// The lease has not expired: the supervisor leaves the record alone.
    NotExpired { complete_by: Option<Timestamp> },
    /// The lease ran out, but the queues are slow enough that its messages may still be on
    /// their way until `until`: a late message is not a lost one.
    Queued { until: Timestamp },
    /// The record changed since the index entry was written (eventual consistency).
    Moved,
    /// The alert was already recorded as sent.
    AlertAlreadySent,
}

/// Inputs that cannot happen in a correct system: a bug, a forged message, or an incompatible
/// change of workflow. They change nothing and are logged as errors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Illegal {
    /// A reply of the current attempt names another step than the one leased.
    WrongStep { leased: String, replied: String },
    /// A reply of the current attempt is for the other direction (do versus undo).
    WrongDirection { leased: Direction, replied: Direction },
    /// A reply carries an attempt at which nothing was dispatched.
    NotDispatched { attempt: u64 },
    /// The record names a step the loaded workflow does not have.
    UnknownStep { step: String },
    /// An alert was reported sent for an order that has none.
    NoAlert,
    /// The record breaks an invariant of [`StateRecord::check`]; nothing is decided on it.
    Corrupt { reason: String },
}

/// The outcome of [`decide`].
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    Apply(Box<Transition>),
    Replay(Vec<Effect>),
    Ignore(Ignored),
    Illegal(Illegal),
}

/// Decides what `input` does to `record`. See the module documentation for the table.
pub fn decide(record: &StateRecord, input: Input<'_>, ctx: &Ctx<'_>) -> Decision {
    use ProcessState::{Error, Pending, Processed, Processing};
    // Everything below may rely on the invariants (the cursor names a step, and so on).
    if let Err(reason) = record.check() {
        return Decision::Illegal(Illegal::Corrupt { reason });
    }
    let current = record.attempt;
    match (record.process_state, input) {
        // The same queue message again: its transition is written, its effects may not be.
        (_, Input::Claim { message, .. } | Input::Reply { message, .. })
            if record.last_input.is_message(message) =>
        {
            Decision::Replay(replay(record, ctx))
        }

        (Pending, Input::Claim { attempt, owner, message }) if attempt == current => {
            claim(record, owner, message, ctx)
        }
        (Pending | Processing, Input::Claim { attempt, .. }) => {
            Decision::Ignore(Ignored::Stale { received: attempt, current })
        }

        (Processing, Input::Reply { attempt, step, outcome, message }) if attempt == current => {
            reply(record, step, outcome, message, ctx)
        }
        (Pending, Input::Reply { attempt, .. }) if attempt == current => {
            Decision::Illegal(Illegal::NotDispatched { attempt })
        }
        (Pending | Processing, Input::Reply { attempt, .. }) => {
            Decision::Ignore(Ignored::Stale { received: attempt, current })
        }

        (Pending | Processing, Input::Expire { complete_by, horizon }) => {
            expire(record, complete_by, horizon, ctx)
        }
        (Error, Input::Expire { complete_by, .. })
            if record.alert == Some(AlertDelivery::Pending) =>
        {
            retry_alert(record, complete_by, ctx)
        }

        (Error, Input::AlertSent) => match record.alert {
            Some(AlertDelivery::Pending) => alert_sent(record, ctx),
            Some(AlertDelivery::Sent) => Decision::Ignore(Ignored::AlertAlreadySent),
            None => Decision::Illegal(Illegal::NoAlert),
        },
        (Pending | Processing | Processed, Input::AlertSent) => Decision::Illegal(Illegal::NoAlert),

        (Processed | Error, Input::Claim { .. } | Input::Reply { .. } | Input::Expire { .. }) => {
            Decision::Ignore(Ignored::Terminal)
        }
    }
}

/// Pending → Processing: take the lease on the current step (or undo) and dispatch it.
fn claim(record: &StateRecord, owner: &str, message: &str, ctx: &Ctx<'_>) -> Decision {
    let Some((step, budget)) = leased_action(record, ctx) else {
        return unknown_step(record);
    };
    let mut next = begin(record, ctx, InputRef::Message(message.to_owned()));
    next.process_state = ProcessState::Processing;
    next.locked_by = Some(owner.to_owned());
    next.attempt += 1;
    // A Pending deadline that still leaves the step its whole budget is kept: the lease is as
    // long as promised, and the expiry index entry is not rewritten (an index key change costs
    // two index writes).
    let fresh = ctx.now.plus(budget);
    next.complete_by = Some(record.complete_by.map_or(fresh, |cb| cb.max(fresh)));
    next.note(ctx.now, Happening::Claimed, Some(step.name.clone()), ctx.config.timeline_limit);
    let mut effects = status(ctx, StatusKind::Processing, None);
    effects.push(Effect::Dispatch);
    apply(next, effects)
}

/// A reply of the current attempt.
fn reply(
    record: &StateRecord,
    step: &StepRef,
    outcome: &StepOutcome,
    message: &str,
    ctx: &Ctx<'_>,
) -> Decision {
    let leased = &record.steps[record.cursor];
    if step.index != record.cursor || step.name != leased.name {
        return Decision::Illegal(Illegal::WrongStep {
            leased: leased.name.clone(),
            replied: step.name.clone(),
        });
    }
    let direction = record.phase.direction();
    if step.direction != direction {
        return Decision::Illegal(Illegal::WrongDirection {
            leased: direction,
            replied: step.direction,
        });
    }
    let mut next = begin(record, ctx, InputRef::Message(message.to_owned()));
    let c = record.cursor;
    let name = leased.name.clone();
    let limit = ctx.config.timeline_limit;
    match (record.phase, outcome) {
        (Phase::Forward, StepOutcome::Done { output }) => {
            next.steps[c].status = StepStatus::Done;
            next.steps[c].output = Some(output.clone());
            next.failure_count = 0;
            next.note(ctx.now, Happening::StepDone, Some(name.clone()), limit);
            let mut effects = status(ctx, StatusKind::StepDone, Some(name));
            if c + 1 < next.steps.len() {
                next.cursor = c + 1;
                match lease(&mut next, ctx) {
                    Some(()) => effects.push(Effect::Dispatch),
                    None => return unknown_step(&next),
                }
            } else {
                next.process_state = ProcessState::Processed;
                next.locked_by = None;
                next.complete_by = None;
                next.note(ctx.now, Happening::Processed, None, limit);
                effects.extend(status(ctx, StatusKind::Processed, None));
            }
            apply(next, effects)
        }
        (Phase::Forward, StepOutcome::Failed { reason }) => {
            next.steps[c].status = StepStatus::Failed;
            next.steps[c].detail = Some(reason.clone());
            next.cause = Some(Cause::StepRejected { step: name.clone(), reason: reason.clone() });
            next.note(ctx.now, Happening::StepFailed, Some(name), limit);
            // The agent reported a permanent fault: the step took no effect, so only the steps
            // before it are undone.
            compensate(next, ctx, Via::Lease)
        }
        (Phase::Compensating, StepOutcome::Done { .. }) => {
            next.steps[c].status = StepStatus::Undone;
            next.note(ctx.now, Happening::StepUndone, Some(name), limit);
            continue_undo(next, ctx, Via::Lease)
        }
        (Phase::Compensating, StepOutcome::Failed { reason }) => {
            next.steps[c].status = StepStatus::UndoFailed;
            next.steps[c].detail = Some(reason.clone());
            next.note(ctx.now, Happening::UndoFailed, Some(name), limit);
            // One undo refused does not stop the others: release the stock even if the refund
            // failed. The operator gets the list of what is left.
            continue_undo(next, ctx, Via::Lease)
        }
    }
}

/// The supervisor found an expired record in flight.
fn expire(record: &StateRecord, seen: Timestamp, horizon: Duration, ctx: &Ctx<'_>) -> Decision {
    if let Some(ignored) = not_expired(record, seen, ctx) {
        return Decision::Ignore(ignored);
    }
    let until = seen.plus(horizon);
    if until > ctx.now {
        return Decision::Ignore(Ignored::Queued { until });
    }
    let mut next = begin(record, ctx, InputRef::Expire);
    let failures = record.failure_count.saturating_add(1);
    let c = record.cursor;
    let name = record.steps[c].name.clone();
    let limit = ctx.config.timeline_limit;
    next.note(ctx.now, Happening::LeaseExpired, Some(name.clone()), limit);

    let Some(step) = ctx.workflow.steps().iter().find(|s| s.name == name) else {
        // No amount of retrying can run a step the workflow no longer has.
        next.cause.get_or_insert(Cause::UnknownStep { step: name.clone() });
        next.steps[c].status = StepStatus::Uncertain;
        return fail(next, ctx);
    };

    if failures < ctx.config.failure_threshold {
        // Wait longer before each further try, in case the fault is not as transient as hoped.
        let wait = ctx.config.wait.wait(failures);
        let budget = step.action(record.phase.direction()).map_or(step.budget, |(_, b)| b);
        next.failure_count = failures;
        if record.process_state == ProcessState::Processing {
            // The request (or its reply) is judged lost: a new lease fences it out.
            next.attempt += 1;
        }
        // A Pending order keeps its attempt: should its start message only be late after all,
        // it still claims the order, and the new one finds it claimed.
        next.process_state = ProcessState::Pending;
        next.locked_by = None;
        next.complete_by = Some(ctx.now.plus(wait).plus(ctx.config.claim_grace).plus(budget));
        next.note(ctx.now, Happening::RetryScheduled, Some(name), limit);
        return apply(next, vec![Effect::Kick { delay: wait }]);
    }

    next.failure_count = failures;
    let detail = format!("lease expired {failures} times");
    match record.phase {
        Phase::Forward => {
            // The step may have taken effect with its answer lost: undo it too if it can be
            // undone (compensations must tolerate undoing what never happened), otherwise
            // leave it to the operator.
            next.steps[c].status = if step.compensation.is_some() {
                StepStatus::ToUndo
            } else {
                StepStatus::Uncertain
            };
            next.steps[c].detail = Some(detail);
            next.cause = Some(Cause::StepTimedOut { step: name, failures });
            compensate(next, ctx, Via::Kick)
        }
        Phase::Compensating => {
            next.steps[c].status = StepStatus::UndoFailed;
            next.steps[c].detail = Some(detail);
            next.note(ctx.now, Happening::UndoFailed, Some(name), limit);
            continue_undo(next, ctx, Via::Kick)
        }
    }
}

/// How the next undo gets started: the scheduler leases and dispatches it in the same write;
/// the supervisor leaves it Pending and kicks the scheduler, which keeps the roles apart.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Via {
    Lease,
    Kick,
}

/// Queues every completed step that has a compensation for undoing, last first, and starts.
fn compensate(mut next: StateRecord, ctx: &Ctx<'_>, via: Via) -> Decision {
    for s in &mut next.steps {
        if s.status == StepStatus::Done && has_compensation(ctx.workflow, &s.name) {
            s.status = StepStatus::ToUndo;
        }
    }
    if !next.steps.iter().any(|s| s.status == StepStatus::ToUndo) {
        return fail(next, ctx);
    }
    next.phase = Phase::Compensating;
    next.note(ctx.now, Happening::CompensationStarted, None, ctx.config.timeline_limit);
    let mut effects = status(ctx, StatusKind::Compensating, None);
    match start_undo(&mut next, ctx, via, usize::MAX) {
        Some(effect) => effects.push(effect),
        None => return fail(next, ctx),
    }
    apply(next, effects)
}

/// Moves to the next step to undo below the cursor, or ends the order when none is left.
fn continue_undo(mut next: StateRecord, ctx: &Ctx<'_>, via: Via) -> Decision {
    let below = next.cursor;
    match start_undo(&mut next, ctx, via, below) {
        Some(effect) => apply(next, vec![effect]),
        None => fail(next, ctx),
    }
}

/// Points the cursor at the highest step below `below` queued for undo and leases it (or
/// leaves it Pending for the scheduler). `None` when nothing is left to undo.
fn start_undo(next: &mut StateRecord, ctx: &Ctx<'_>, via: Via, below: usize) -> Option<Effect> {
    let index = next.steps.iter().take(below).rposition(|s| s.status == StepStatus::ToUndo)?;
    next.cursor = index;
    next.failure_count = 0;
    match via {
        Via::Lease => {
            lease(next, ctx)?;
            Some(Effect::Dispatch)
        }
        Via::Kick => {
            let (_, budget) = leased_action(next, ctx)?;
            next.process_state = ProcessState::Pending;
            next.locked_by = None;
            next.attempt += 1;
            next.complete_by = Some(ctx.now.plus(ctx.config.claim_grace).plus(budget));
            Some(Effect::Kick { delay: Duration::ZERO })
        }
    }
}

/// Ends the order in Error with its alert pending. The record stays in the expiry index until
/// the alert is known to be published.
fn fail(mut next: StateRecord, ctx: &Ctx<'_>) -> Decision {
    let kind = if next.needs_manual_undo().is_empty()
        && next.steps.iter().any(|s| s.status == StepStatus::Undone)
    {
        StatusKind::Compensated
    } else {
        StatusKind::Failed
    };
    for s in &mut next.steps {
        // Only reachable when the workflow lost a step's compensation while the order was in
        // flight: what could not be undone is left to the operator.
        if s.status == StepStatus::ToUndo {
            s.status = StepStatus::Uncertain;
        }
    }
    next.process_state = ProcessState::Error;
    next.locked_by = None;
    next.alert = Some(AlertDelivery::Pending);
    next.complete_by = Some(ctx.now.plus(ctx.config.alert_retry_after));
    let happening =
        if kind == StatusKind::Compensated { Happening::Compensated } else { Happening::Failed };
    next.note(ctx.now, happening, None, ctx.config.timeline_limit);
    let mut effects = status(ctx, kind, None);
    effects.push(Effect::Alert);
    apply(next, effects)
}

/// The supervisor found an Error record whose alert was never confirmed.
fn retry_alert(record: &StateRecord, seen: Timestamp, ctx: &Ctx<'_>) -> Decision {
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

fn alert_sent(record: &StateRecord, ctx: &Ctx<'_>) -> Decision {
    // The input that produced the Error stays the last input: its redelivery still replays the
    // terminal status event, but no longer the alert.
    let mut next = begin(record, ctx, record.last_input.clone());
    next.alert = Some(AlertDelivery::Sent);
    next.complete_by = None;
    next.note(ctx.now, Happening::AlertSent, None, ctx.config.timeline_limit);
    apply(next, Vec::new())
}

/// The side effects a record in this state owes the world, for a redelivered message whose
/// transition was already written. Non-terminal status events are not replayed: they are
/// informative, and the next terminal event supersedes them.
fn replay(record: &StateRecord, ctx: &Ctx<'_>) -> Vec<Effect> {
    match record.process_state {
        ProcessState::Processing => vec![Effect::Dispatch],
        ProcessState::Pending => Vec::new(),
        ProcessState::Processed | ProcessState::Error => {
            let mut effects = status(ctx, terminal_kind(record), None);
            if record.alert == Some(AlertDelivery::Pending) {
                effects.push(Effect::Alert);
            }
            effects
        }
    }
}

fn terminal_kind(record: &StateRecord) -> StatusKind {
    match record.process_state {
        ProcessState::Processed => StatusKind::Processed,
        _ if record.needs_manual_undo().is_empty()
            && record.steps.iter().any(|s| s.status == StepStatus::Undone) =>
        {
            StatusKind::Compensated
        }
        _ => StatusKind::Failed,
    }
}

fn not_expired(record: &StateRecord, seen: Timestamp, ctx: &Ctx<'_>) -> Option<Ignored> {
    if record.complete_by != Some(seen) {
        return Some(Ignored::Moved);
    }
    if seen > ctx.now {
        return Some(Ignored::NotExpired { complete_by: record.complete_by });
    }
    None
}

/// Takes a fresh lease on the cursor's step: Processing, next attempt, CompleteBy one budget
/// away. The lock holder stays the scheduler that wrote it.
fn lease(next: &mut StateRecord, ctx: &Ctx<'_>) -> Option<()> {
    let (_, budget) = leased_action(next, ctx)?;
    next.process_state = ProcessState::Processing;
    next.attempt += 1;
    next.complete_by = Some(ctx.now.plus(budget));
    Some(())
}

/// The workflow step at the cursor and the budget of the action the phase calls for.
fn leased_action<'w>(record: &StateRecord, ctx: &Ctx<'w>) -> Option<(&'w Step, Duration)> {
    let name = &record.steps.get(record.cursor)?.name;
    let step = ctx.workflow.steps().iter().find(|s| &s.name == name)?;
    let (_, budget) = step.action(record.phase.direction())?;
    Some((step, budget))
}

fn has_compensation(workflow: &Workflow, step: &str) -> bool {
    workflow.steps().iter().any(|s| s.name == step && s.compensation.is_some())
}

fn unknown_step(record: &StateRecord) -> Decision {
    let step = record.steps.get(record.cursor).map(|s| s.name.clone()).unwrap_or_default();
    Decision::Illegal(Illegal::UnknownStep { step })
}

/// A copy of the record for the next revision, stamped with the input that produced it.
fn begin(record: &StateRecord, ctx: &Ctx<'_>, input: InputRef) -> StateRecord {
    let mut next = record.clone();
    next.revision += 1;
    next.updated_at = ctx.now;
    next.last_input = input;
    next
}

fn status(ctx: &Ctx<'_>, kind: StatusKind, step: Option<String>) -> Vec<Effect> {
    if ctx.config.status_events.contains(kind) {
        vec![Effect::Status { kind, step }]
    } else {
        Vec::new()
    }
}

fn apply(next: StateRecord, effects: Vec<Effect>) -> Decision {
    Decision::Apply(Box::new(Transition { next, effects }))
}

#[cfg(test)]
mod tests;
