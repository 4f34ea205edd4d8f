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
//! | Processing | reply of the current attempt: failed, or done with an output too large | compensation leased and dispatched, or Error and alert |
//! | Processing | the same, for a step whose failures are only reported | the failure recorded on the step; next step leased and dispatched, or Processed and alert |
//! | Processing (undoing) | reply: done or failed | next undo leased and dispatched, or Error and alert |
//! | Pending | reply of the current attempt | illegal: nothing was dispatched at that attempt |
//! | Pending, Processing | reply of another attempt | ignored: stale |
//! | Pending, Processing | expiry, CompleteBy not passed or changed | ignored |
//! | Pending, Processing | expiry, CompleteBy passed by less than the horizon | ignored: its messages may still be waiting in a queue |
//! | Pending | expiry, CompleteBy passed by the horizon, below threshold | FailureCount + 1; Pending at the same attempt with a later CompleteBy; start message again after a wait |
//! | Processing | expiry, CompleteBy passed by the horizon, below threshold | FailureCount + 1; Pending at a new attempt with a later CompleteBy; start message after a wait |
//! | Pending, Processing | expiry, CompleteBy passed by the horizon, at threshold | compensation queued, or Error and alert |
//! | Pending, Processing | the same, for a step whose failures are only reported | the step left uncertain and passed; next step queued, or Processed and alert |
//! | Error, Processed (alert pending) | expiry, CompleteBy passed | alert published again |
//! | Error, Processed (alert pending) | alert sent | alert recorded, record leaves the expiry index |
//! | Pending | the submission again (same key, same order), never claimed | start message again |
//! | Processed, Error, Cancelled | any message or expiry (but an alert's, above) | ignored: terminal states move only by an operator's command |
//! | Paused | any message or expiry | ignored: nothing of it is in flight |
//!
//! Operator commands (each with an id, the caller and a reason; a command id already applied
//! changes nothing, and a command that does not fit the state is refused with the state named):
//!
//! | state | command | outcome |
//! | --- | --- | --- |
//! | Pending, Paused (forward) | cancel | completed steps queued for undo, last first, and started; nothing to undo: Cancelled |
//! | Processing (forward) | cancel | the step in flight finishes; at its reply or its judged expiry, undo as above |
//! | Pending | pause | Paused at once: its start message is fenced off |
//! | Processing | pause | the step in flight finishes; the order is Paused where it would have gone on |
//! | Paused | resume | Pending at a new attempt; start message |
//! | Processing (pause waiting) | resume | the pause is withdrawn |
//! | Error | redrive | Pending from the first step not done; undone and refused steps done again under new keys |
//! | Error, undo failed | redrive_compensation | the failed undos queued again under their keys |
//! | any other | any | refused, naming the state |
//!
//! A cancelled order whose undos all succeed ends Cancelled, with a status event and no alert
//! (the operator asked for it); one whose undo fails, or whose step in flight could not be
//! undone, ends in Error with an alert listing what is left. A cancel never outruns the step in
//! flight: its reply is awaited, so a step that completes is undone, and if it was the last
//! step the order is Processed (there was nothing left to stop). A cancelled step whose outcome
//! is unknown (its lease had expired) is handled as any uncertain step: undone if it can be,
//! reported if not.
//!
//! A step whose failures are only reported does not stop the order when it fails: the cause is
//! recorded on the step, the order goes on, and once it is Processed the operators get an
//! alert naming what was left undone. An operator's cancel waiting on the step takes
//! precedence (the order stops as asked), and should the order stop later for another cause,
//! a reported step whose outcome is unknown is undone with the others.
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
use crate::ids::{Direction, OrderId};
use crate::message::{MAX_OUTPUT_LEN, StepOutcome, StepRef, output_len};
use crate::mutants::{self, Mutant};
use crate::state::{
    AlertDelivery, Cause, CommandEntry, CommandKind, Happening, InputRef, Phase, ProcessState,
    StateRecord, StepState, StepStatus, Stop,
};
use crate::time::Timestamp;
use crate::workflow::{OnFailure, Step, Workflow};

/// Operator commands remembered on a record for recognising a repeat; an older one sent again
/// is judged on the record's state, which refuses or ignores nearly every repeat anyway.
pub const COMMANDS_KEPT: usize = 16;

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
    /// The order was submitted again with the same key and the same content.
    Resubmit,
    /// An operator's command, with its id (the same id is applied once), who gave it and why.
    Command { command: CommandKind, id: &'a str, by: &'a str, reason: &'a str },
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
    /// The order is Processed, Error or Cancelled: the system's own inputs change nothing of
    /// it (an Error's alert apart); only an operator's redrive moves it again.
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
    /// The submission was repeated after the order was first claimed: it is under way.
    Started,
    /// The order is paused: no message of its can be current.
    Paused,
    /// An operator command with this id was applied before.
    AlreadyApplied,
}

/// Why an operator command was refused. Nothing was written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("the order is {state}: there is nothing left to {command}", state = .state.as_str(), command = .command.as_str())]
    Finished { state: ProcessState, command: CommandKind },
    #[error("the order is {state}; only an order in Error can be redriven", state = .state.as_str())]
    NotFailed { state: ProcessState },
    #[error("the order is being undone ({state}): it will end on its own", state = .state.as_str())]
    Undoing { state: ProcessState },
    #[error("a cancel is already waiting for the step in flight")]
    Cancelling,
    #[error("the order is already paused")]
    AlreadyPaused,
    #[error("a pause is already waiting for the step in flight")]
    Pausing,
    #[error("the order is {state}, not paused", state = .state.as_str())]
    NotPaused { state: ProcessState },
    #[error("the order was cancelled by {by}; it cannot be redriven")]
    WasCancelled { by: String },
    #[error("undoing {steps:?} failed: redrive the compensation first")]
    UndoFailed { steps: Vec<String> },
    #[error("no undo of this order failed: there is no compensation to redrive")]
    NothingToUndo,
    #[error("the order failed at {ended_at}, longer ago than the redrive window ({window_s} s)")]
    TooLate { ended_at: Timestamp, window_s: u64 },
    #[error("the workflow has no step {step:?} any more")]
    UnknownStep { step: String },
    #[error("command id {id:?} was used for a {earlier} command", earlier = .earlier.as_str())]
    IdReused { id: String, earlier: CommandKind },
}

impl Refused {
    /// A stable name for the refusal, for programs that act on it.
    pub fn code(&self) -> &'static str {
        match self {
            Refused::Finished { .. } => "finished",
            Refused::NotFailed { .. } => "not_failed",
            Refused::Undoing { .. } => "undoing",
            Refused::Cancelling => "cancelling",
            Refused::AlreadyPaused => "already_paused",
            Refused::Pausing => "pausing",
            Refused::NotPaused { .. } => "not_paused",
            Refused::WasCancelled { .. } => "was_cancelled",
            Refused::UndoFailed { .. } => "undo_failed",
            Refused::NothingToUndo => "nothing_to_undo",
            Refused::TooLate { .. } => "too_late",
            Refused::UnknownStep { .. } => "unknown_step",
            Refused::IdReused { .. } => "command_id_reused",
        }
    }
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

/// What is done with an illegal input, by where it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Remedy {
    /// A queue message: a poison message, left to fail until it reaches its dead-letter queue,
    /// where an operator can look at it and move it back once the cause is fixed.
    DeadLetter,
    /// The supervisor's sweep, an alert's bookkeeping or an operator: nothing to set aside;
    /// logged as an error and counted, and the caller is told.
    Report,
}

/// The remedy for an illegal `input`.
pub fn remedy(input: &Input<'_>) -> Remedy {
    match input {
        Input::Claim { .. } | Input::Reply { .. } => Remedy::DeadLetter,
        Input::Expire { .. } | Input::AlertSent | Input::Resubmit | Input::Command { .. } => {
            Remedy::Report
        }
    }
}

/// The outcome of [`decide`].
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    Apply(Box<Transition>),
    Replay(Vec<Effect>),
    Ignore(Ignored),
    Illegal(Illegal),
    /// An operator command that does not apply to the record as it is.
    Refuse(Refused),
}

/// The record of a newly submitted order and what follows its creation: Pending at attempt 0,
/// with a CompleteBy that gives the scheduler `claim_grace` to claim it and the first step its
/// whole budget, and a start message.
pub fn create(order_id: OrderId, correlation_id: String, ctx: &Ctx<'_>) -> Transition {
    let first_budget = ctx.workflow.steps().first().map_or(Duration::ZERO, |s| s.budget);
    let mut next = StateRecord {
        order_id,
        workflow: ctx.workflow.name().to_owned(),
        workflow_version: ctx.workflow.version(),
        process_state: ProcessState::Pending,
        locked_by: None,
        complete_by: Some(ctx.now.plus(ctx.config.claim_grace).plus(first_budget)),
        failure_count: 0,
        attempt: 0,
        revision: 0,
        phase: Phase::Forward,
        cursor: 0,
        steps: ctx.workflow.steps().iter().map(|s| StepState::new(&s.name)).collect(),
        cause: None,
        alert: None,
        last_input: InputRef::Submit,
        correlation_id,
        shard: order_id.shard(ctx.config.index_shards),
        created_at: ctx.now,
        updated_at: ctx.now,
        ended_at: None,
        timeline: Vec::new(),
        stop: None,
        commands: Vec::new(),
        redrives: 0,
    };
    next.note(ctx.now, Happening::Received, None, ctx.config.timeline_limit);
    Transition { next, effects: started(ctx) }
}

/// What a new order owes the world: its start message, and its first status event.
fn started(ctx: &Ctx<'_>) -> Vec<Effect> {
    let mut effects = vec![Effect::Kick { delay: Duration::ZERO }];
    effects.extend(status(ctx, StatusKind::Received, None));
    effects
}

/// Decides what `input` does to `record`. See the module documentation for the tables.
pub fn decide(record: &StateRecord, input: Input<'_>, ctx: &Ctx<'_>) -> Decision {
    // Everything below may rely on the invariants (the cursor names a step, and so on).
    if let Err(reason) = record.check() {
        return Decision::Illegal(Illegal::Corrupt { reason });
    }
    if let Input::Command { command, id, by, reason } = input {
        return operate(record, Command { kind: command, id, by, reason }, ctx);
    }
    settle_stop(record, react(record, input, ctx), ctx)
}

/// What the system's own inputs do.
fn react(record: &StateRecord, input: Input<'_>, ctx: &Ctx<'_>) -> Decision {
    use ProcessState::{Cancelled, Error, Paused, Pending, Processed, Processing};
    let current = record.attempt;
    match (record.process_state, input) {
        // The same queue message again: its transition is written, its effects may not be.
        (_, Input::Claim { message, .. } | Input::Reply { message, .. })
            if record.last_input.is_message(message) =>
        {
            Decision::Replay(replay(record, ctx))
        }

        // The client submitted again, perhaps because the first submission died between its
        // write and its start message: while nobody has claimed the order, start it again (a
        // duplicate start leads to one claim).
        (Pending, Input::Resubmit) if record.last_input == InputRef::Submit => {
            Decision::Replay(started(ctx))
        }
        (_, Input::Resubmit) => Decision::Ignore(Ignored::Started),

        (Pending, Input::Claim { attempt, owner, message }) if attempt == current => {
            claim(record, owner, message, ctx)
        }
        (Paused, Input::Claim { .. }) => Decision::Ignore(Ignored::Paused),
        (Pending | Processing, Input::Claim { attempt, .. }) => {
            Decision::Ignore(Ignored::Stale { received: attempt, current })
        }

        (Processing, Input::Reply { attempt, step, outcome, message })
            if attempt == current
                || mutants::on(Mutant::ReplyFromPreviousAttempt) && attempt + 1 == current =>
        {
            reply(record, step, outcome, message, ctx)
        }
        (Pending | Paused, Input::Reply { attempt, .. }) if attempt == current => {
            Decision::Illegal(Illegal::NotDispatched { attempt })
        }
        (Pending | Processing | Paused, Input::Reply { attempt, .. }) => {
            Decision::Ignore(Ignored::Stale { received: attempt, current })
        }

        (Pending | Processing, Input::Expire { complete_by, horizon }) => {
            expire(record, complete_by, horizon, ctx)
        }
        (Paused, Input::Expire { .. }) => Decision::Ignore(Ignored::Moved),
        (Error | Processed, Input::Expire { complete_by, .. })
            if record.alert == Some(AlertDelivery::Pending) =>
        {
            retry_alert(record, complete_by, ctx)
        }

        (Error | Processed, Input::AlertSent) => match record.alert {
            Some(AlertDelivery::Pending) => alert_sent(record, ctx),
            Some(AlertDelivery::Sent) => Decision::Ignore(Ignored::AlertAlreadySent),
            None => Decision::Illegal(Illegal::NoAlert),
        },
        (Pending | Processing | Paused | Cancelled, Input::AlertSent) => {
            Decision::Illegal(Illegal::NoAlert)
        }

        (
            Processed | Error | Cancelled,
            Input::Claim { .. } | Input::Reply { .. } | Input::Expire { .. },
        ) => Decision::Ignore(Ignored::Terminal),

        (_, Input::Command { .. }) => unreachable_command(record),
    }
}

/// Commands are decided by [`operate`]; this arm only keeps the match exhaustive.
fn unreachable_command(record: &StateRecord) -> Decision {
    Decision::Illegal(Illegal::Corrupt {
        reason: format!("{}: a command reached the message path", record.order_id),
    })
}

/// Pending → Processing: take the lease on the current step (or undo) and dispatch it.
fn claim(record: &StateRecord, owner: &str, message: &str, ctx: &Ctx<'_>) -> Decision {
    let Some((step, budget)) = leased_action(record, ctx) else {
        return unknown_step(record);
    };
    let mut next = begin(record, ctx, InputRef::Message(message.to_owned()));
    next.locked_by = Some(owner.to_owned());
    // A Pending deadline that still leaves the step its whole budget is kept: the lease is as
    // long as promised, and the expiry index entry is not rewritten (an index key change costs
    // two index writes).
    let fresh = ctx.now.plus(budget);
    take_lease(&mut next, record.complete_by.map_or(fresh, |cb| cb.max(fresh)));
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
    // An agent of this version answers TooLarge itself; one of another may not.
    let too_large = match outcome {
        StepOutcome::Done { output } => output_len(output),
        StepOutcome::TooLarge { bytes } => Some(*bytes),
        StepOutcome::Failed { .. } => None,
    };
    match (record.phase, outcome) {
        (Phase::Forward, StepOutcome::Done { output }) if too_large.is_none() => {
            next.steps[c].status = StepStatus::Done;
            next.steps[c].output = Some(output.clone());
            next.failure_count = 0;
            next.note(ctx.now, Happening::StepDone, Some(name.clone()), limit);
            let effects = status(ctx, StatusKind::StepDone, Some(name));
            advance(next, record, effects, ctx, Via::Lease)
        }
        (Phase::Forward, StepOutcome::Done { .. } | StepOutcome::TooLarge { .. }) => {
            // The effect is in place but its output cannot be carried: the step is done,
            // without its output, and fails; undone with the others, its undo is told nothing.
            let bytes = too_large.unwrap_or_default();
            let limit = MAX_OUTPUT_LEN as u64;
            next.steps[c].status = StepStatus::Done;
            next.steps[c].detail = Some(format!(
                "its output of {bytes} bytes is larger than the {limit} bytes a step may return"
            ));
            let cause = Cause::OutputTooLarge { step: name, bytes, limit };
            failed(next, record, cause, ctx, Via::Lease)
        }
        (Phase::Forward, StepOutcome::Failed { reason }) => {
            next.steps[c].status = StepStatus::Failed;
            next.steps[c].detail = Some(reason.clone());
            // The agent reported a permanent fault: the step took no effect, so only the steps
            // before it are undone.
            let cause = Cause::StepRejected { step: name, reason: reason.clone() };
            failed(next, record, cause, ctx, Via::Lease)
        }
        (Phase::Compensating, StepOutcome::Done { .. } | StepOutcome::TooLarge { .. }) => {
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

/// The cursor's step failed for good, for `cause`, its status already set. A step whose
/// failures are only reported is passed, and the order goes on; any other failure (or any
/// failure while a cancel waits) stops the order and undoes what it did.
fn failed(
    mut next: StateRecord,
    record: &StateRecord,
    cause: Cause,
    ctx: &Ctx<'_>,
    via: Via,
) -> Decision {
    let c = record.cursor;
    let name = record.steps[c].name.clone();
    let limit = ctx.config.timeline_limit;
    let cancel = cancelled_by(record);
    let policy = ctx.workflow.step_named(&name).map(|s| s.on_failure);
    if policy == Some(OnFailure::Report) && cancel.is_none() {
        next.steps[c].reported = Some(cause);
        next.failure_count = 0;
        next.note(ctx.now, Happening::StepReported, Some(name), limit);
        return advance(next, record, Vec::new(), ctx, via);
    }
    if !matches!(cause, Cause::StepTimedOut { .. }) {
        // An expiry is on the timeline already.
        next.note(ctx.now, Happening::StepFailed, Some(name), limit);
    }
    next.cause = Some(cancel.unwrap_or(cause));
    compensate(next, ctx, via)
}

/// Goes on past the cursor's step, done or reported: leases the next step to do (or hands it
/// to the scheduler), or ends the order Processed. A cancel waiting for the step takes effect
/// here instead, unless nothing is left to stop.
fn advance(
    mut next: StateRecord,
    record: &StateRecord,
    mut effects: Vec<Effect>,
    ctx: &Ctx<'_>,
    via: Via,
) -> Decision {
    let Some(following) = next_to_do(&next, record.cursor + 1) else {
        // A cancel waiting for the last step comes too late: nothing is left to stop.
        return processed(next, effects, ctx);
    };
    if let Some(cause) = cancelled_by(record) {
        // The cancel's safe point: the step is done, and is undone with the others.
        next.cause = Some(cause);
        return first(effects, compensate(next, ctx, via));
    }
    next.cursor = following;
    let started = match via {
        Via::Lease => lease(&mut next, ctx).map(|()| Effect::Dispatch),
        Via::Kick => requeue(&mut next, ctx),
    };
    match started {
        Some(effect) => {
            effects.push(effect);
            apply(next, effects)
        }
        None => unknown_step(&next),
    }
}

/// Every step is done or reported: Processed. A report owes the operators an alert, which
/// keeps the record in the expiry index until it is known to be published.
fn processed(mut next: StateRecord, mut effects: Vec<Effect>, ctx: &Ctx<'_>) -> Decision {
    next.process_state = ProcessState::Processed;
    next.locked_by = None;
    next.complete_by = None;
    next.ended_at = Some(ctx.now);
    next.note(ctx.now, Happening::Processed, None, ctx.config.timeline_limit);
    effects.extend(status(ctx, StatusKind::Processed, None));
    if next.steps.iter().any(|s| s.reported.is_some()) {
        next.alert = Some(AlertDelivery::Pending);
        next.complete_by = Some(ctx.now.plus(ctx.config.alert_retry_after));
        effects.push(Effect::Alert);
    }
    apply(next, effects)
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

    let Some(step) = ctx.workflow.step_named(&name) else {
        // No amount of retrying can run a step the workflow no longer has.
        next.cause.get_or_insert(Cause::UnknownStep { step: name.clone() });
        next.steps[c].status = StepStatus::Uncertain;
        return fail(next, ctx);
    };

    // A cancel waiting for this step does not wait for a retry: the step is uncertain now.
    let cancel = cancelled_by(record);
    let threshold = step.expired_leases.unwrap_or(ctx.config.failure_threshold);
    if failures < threshold && cancel.is_none() {
        // Wait longer before each further try, in case the fault is not as transient as hoped.
        let wait = step.waits(ctx.config.wait).wait(failures);
        let budget = step.action(record.phase.direction()).map_or(step.budget, |(_, b)| b);
        next.failure_count = failures;
        // Processing: the request (or its reply) is judged lost, and a new attempt fences it
        // out. A Pending order keeps its attempt: should its start message only be late after
        // all, it still claims the order, and the new one finds it claimed.
        let new_attempt = record.process_state == ProcessState::Processing
            || mutants::on(Mutant::PendingResetTakesNewAttempt);
        let due = ctx.now.plus(wait).plus(ctx.config.claim_grace).plus(budget);
        hand_back(&mut next, new_attempt, due);
        next.note(ctx.now, Happening::RetryScheduled, Some(name), limit);
        return apply(next, vec![Effect::Kick { delay: wait }]);
    }

    next.failure_count = failures;
    let detail = format!("lease expired {failures} times");
    match record.phase {
        Phase::Forward => {
            // The step may have taken effect with its answer lost: undo it too if it can be
            // undone (compensations must tolerate undoing what never happened), otherwise
            // leave it to the operator. Passed on a report, it stays as it may be.
            let undo = step.compensation.is_some()
                && (step.on_failure == OnFailure::Undo || cancel.is_some());
            next.steps[c].status = if undo { StepStatus::ToUndo } else { StepStatus::Uncertain };
            next.steps[c].detail = Some(detail);
            failed(next, record, Cause::StepTimedOut { step: name, failures }, ctx, Via::Kick)
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
/// A step not reached in this run but sent under its current keys before (a redrive kept the
/// keys of a step whose outcome was unknown) is as uncertain as ever: undone if it can be,
/// otherwise left on the operator's list.
fn compensate(mut next: StateRecord, ctx: &Ctx<'_>, via: Via) -> Decision {
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
                s.detail = Some("sent in an earlier run; its outcome is unknown".into());
            }
            _ => {}
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
        Via::Kick => requeue(next, ctx),
    }
}

/// Hands the cursor's step (or undo) back to the scheduler: Pending at a new attempt, with the
/// claim grace and the action's whole budget before CompleteBy, and a start message. `None` if
/// the workflow has no such step.
fn requeue(next: &mut StateRecord, ctx: &Ctx<'_>) -> Option<Effect> {
    let (_, budget) = leased_action(next, ctx)?;
    hand_back(next, true, ctx.now.plus(ctx.config.claim_grace).plus(budget));
    Some(Effect::Kick { delay: Duration::ZERO })
}

/// The move to Pending: the order is the scheduler's to claim again, by `complete_by`, from a
/// start message its caller sends. At a new attempt, unless a start message already sent for
/// the current one must still be able to claim it.
fn hand_back(next: &mut StateRecord, new_attempt: bool, complete_by: Timestamp) {
    next.process_state = ProcessState::Pending;
    next.locked_by = None;
    if new_attempt {
        next.attempt += 1;
    }
    next.complete_by = Some(complete_by);
}

/// Ends the order once nothing is left to undo: Cancelled if an operator cancelled it and
/// nothing is left to revert by hand; otherwise Error with its alert pending, the record
/// staying in the expiry index until the alert is known to be published.
fn fail(mut next: StateRecord, ctx: &Ctx<'_>) -> Decision {
    for s in &mut next.steps {
        // Only reachable when the workflow lost a step's compensation while the order was in
        // flight: what could not be undone is left to the operator.
        if s.status == StepStatus::ToUndo {
            s.status = StepStatus::Uncertain;
        }
    }
    next.locked_by = None;
    next.ended_at = Some(ctx.now);
    let limit = ctx.config.timeline_limit;
    if let Some(Cause::Cancelled { by, reason }) = next.cause.clone() {
        if next.needs_manual_undo().is_empty() {
            next.process_state = ProcessState::Cancelled;
            next.complete_by = None;
            next.note_command(ctx.now, Happening::Cancelled, &by, &reason, limit);
            return apply(next, status(ctx, StatusKind::Cancelled, None));
        }
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
        ProcessState::Pending | ProcessState::Paused => Vec::new(),
        ProcessState::Processed | ProcessState::Error | ProcessState::Cancelled => {
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
        ProcessState::Cancelled => StatusKind::Cancelled,
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
    take_lease(next, ctx.now.plus(budget));
    Some(())
}

/// The move to Processing: a new attempt on the cursor's step (or undo), due by
/// `complete_by`, whose request goes out once the record is written; from then on it may
/// have reached its service under the step's keys.
fn take_lease(next: &mut StateRecord, complete_by: Timestamp) {
    next.process_state = ProcessState::Processing;
    next.attempt += 1;
    next.steps[next.cursor].dispatched = true;
    next.complete_by = Some(complete_by);
}

/// The workflow step at the cursor and the budget of the action the phase calls for.
fn leased_action<'w>(record: &StateRecord, ctx: &Ctx<'w>) -> Option<(&'w Step, Duration)> {
    let name = &record.steps.get(record.cursor)?.name;
    let step = ctx.workflow.step_named(name)?;
    let (_, budget) = step.action(record.phase.direction())?;
    Some((step, budget))
}

fn has_compensation(workflow: &Workflow, step: &str) -> bool {
    workflow.step_named(step).is_some_and(|s| s.compensation.is_some())
}

fn unknown_step(record: &StateRecord) -> Decision {
    let step = record.steps.get(record.cursor).map(|s| s.name.clone()).unwrap_or_default();
    Decision::Illegal(Illegal::UnknownStep { step })
}

/// An operator command as [`operate`] takes it.
#[derive(Clone, Copy, Debug)]
struct Command<'a> {
    kind: CommandKind,
    id: &'a str,
    by: &'a str,
    reason: &'a str,
}

/// Decides an operator command. See the second table of the module documentation.
fn operate(record: &StateRecord, cmd: Command<'_>, ctx: &Ctx<'_>) -> Decision {
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
                ProcessState::Pending => vec![Effect::Kick { delay: Duration::ZERO }],
                ProcessState::Processing | ProcessState::Paused => Vec::new(),
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
        Ok(other) => other,
        Err(refused) => Decision::Refuse(refused),
    }
}

/// Cancel: at once when no step is in flight, else when the step in flight is finished.
fn cancel(record: &StateRecord, cmd: Command<'_>, ctx: &Ctx<'_>) -> Result<Decision, Refused> {
    let state = record.process_state;
    if state.is_terminal() {
        return Err(Refused::Finished { state, command: cmd.kind });
    }
    if record.phase == Phase::Compensating {
        return Err(Refused::Undoing { state });
    }
    let limit = ctx.config.timeline_limit;
    let mut next = begin(record, ctx, InputRef::Command(cmd.id.to_owned()));
    next.note_command(ctx.now, Happening::CancelRequested, cmd.by, cmd.reason, limit);
    if state == ProcessState::Processing {
        match &record.stop {
            Some(stop) if stop.command == CommandKind::Cancel => return Err(Refused::Cancelling),
            // A waiting pause gives way: the order is to stop for good.
            _ => next.stop = Some(stop_of(cmd)),
        }
        return Ok(apply(next, Vec::new()));
    }
    // Pending or Paused. A step that was sent before (its lease expired, or an earlier run
    // under the same keys timed out) may have taken effect all the same, its answer lost: it is
    // as uncertain as a step in flight, and undone (or reported) too.
    let c = next.cursor;
    if next.steps[c].dispatched || record.failure_count > 0 {
        let undoable = has_compensation(ctx.workflow, &next.steps[c].name);
        next.steps[c].status = if undoable { StepStatus::ToUndo } else { StepStatus::Uncertain };
        next.steps[c].detail = Some("cancelled while the step's outcome was unknown".into());
    }
    next.cause = Some(Cause::Cancelled { by: cmd.by.to_owned(), reason: cmd.reason.to_owned() });
    Ok(compensate(next, ctx, Via::Kick))
}

/// Pause: at once when no step is in flight, else when the step in flight is finished.
fn pause(record: &StateRecord, cmd: Command<'_>, ctx: &Ctx<'_>) -> Result<Decision, Refused> {
    let state = record.process_state;
    let limit = ctx.config.timeline_limit;
    let mut next = begin(record, ctx, InputRef::Command(cmd.id.to_owned()));
    match state {
        ProcessState::Processed | ProcessState::Error | ProcessState::Cancelled => {
            Err(Refused::Finished { state, command: cmd.kind })
        }
        ProcessState::Paused => Err(Refused::AlreadyPaused),
        ProcessState::Processing => match &record.stop {
            Some(stop) if stop.command == CommandKind::Cancel => Err(Refused::Cancelling),
            Some(_) => Err(Refused::Pausing),
            None => {
                next.stop = Some(stop_of(cmd));
                next.note_command(ctx.now, Happening::PauseRequested, cmd.by, cmd.reason, limit);
                Ok(apply(next, Vec::new()))
            }
        },
        ProcessState::Pending => {
            hold(&mut next, ctx, cmd.by, cmd.reason);
            Ok(apply(next, Vec::new()))
        }
    }
}

/// Resume: a paused order goes back to the scheduler; a waiting pause is withdrawn.
fn resume(record: &StateRecord, cmd: Command<'_>, ctx: &Ctx<'_>) -> Result<Decision, Refused> {
    let state = record.process_state;
    let limit = ctx.config.timeline_limit;
    let mut next = begin(record, ctx, InputRef::Command(cmd.id.to_owned()));
    match (state, &record.stop) {
        (ProcessState::Processing, Some(stop)) if stop.command == CommandKind::Pause => {
            next.stop = None;
            next.note_command(ctx.now, Happening::Resumed, cmd.by, cmd.reason, limit);
            Ok(apply(next, Vec::new()))
        }
        (ProcessState::Paused, _) => {
            let Some(kick) = requeue(&mut next, ctx) else {
                let step = record.steps[record.cursor].name.clone();
                return Err(Refused::UnknownStep { step });
            };
            next.note_command(ctx.now, Happening::Resumed, cmd.by, cmd.reason, limit);
            Ok(apply(next, vec![kick]))
        }
        _ => Err(Refused::NotPaused { state }),
    }
}

/// Redrive: an order in Error runs again from its first step not done. Steps that were undone
/// or refused are done again under keys of a new generation; a step whose outcome is unknown
/// (it timed out and nothing could undo it) keeps its key, so that its service answers what it
/// did rather than doing it twice.
fn redrive(record: &StateRecord, cmd: Command<'_>, ctx: &Ctx<'_>) -> Result<Decision, Refused> {
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
    let mut next = begin(record, ctx, InputRef::Command(cmd.id.to_owned()));
    for s in &mut next.steps {
        match s.status {
            StepStatus::Done | StepStatus::NotStarted => continue,
            StepStatus::Undone | StepStatus::Failed => {
                s.generation += 1;
                s.dispatched = false;
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
    let Some(cursor) = next_to_do(&next, 0) else {
        // Every step is done: an Error record never looks like this.
        return Err(Refused::NotFailed { state: record.process_state });
    };
    next.cursor = cursor;
    next.phase = Phase::Forward;
    next.cause = None;
    restart(next, ctx, cmd)
}

/// Redrive of the compensation: the undos that failed are queued again, under their keys (an
/// undo is idempotent, and harmless where its step never took effect).
fn redrive_compensation(
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
    next.cursor = next.steps.iter().rposition(|s| s.status == StepStatus::ToUndo).unwrap_or(0);
    restart(next, ctx, cmd)
}

/// Puts a redriven record back to Pending at a new attempt with its start message.
fn restart(mut next: StateRecord, ctx: &Ctx<'_>, cmd: Command<'_>) -> Result<Decision, Refused> {
    let Some(kick) = requeue(&mut next, ctx) else {
        return Err(Refused::UnknownStep { step: next.steps[next.cursor].name.clone() });
    };
    next.failure_count = 0;
    next.alert = None;
    next.ended_at = None;
    next.redrives += 1;
    next.note_command(ctx.now, Happening::Redriven, cmd.by, cmd.reason, ctx.config.timeline_limit);
    Ok(apply(next, vec![kick]))
}

fn within_window(record: &StateRecord, ctx: &Ctx<'_>) -> Result<(), Refused> {
    let ended_at = record.ended_at.unwrap_or(record.updated_at);
    if ended_at.plus(ctx.config.redrive_window) < ctx.now {
        return Err(Refused::TooLate { ended_at, window_s: ctx.config.redrive_window.as_secs() });
    }
    Ok(())
}

/// A transition out of a Processing record ends the operator's stop waiting on it: a pause
/// holds the order where it would have gone on (nothing is dispatched or kicked); a cancel was
/// acted on by the transition itself. A transition that kept the same lease would leave the
/// stop waiting; none of the system's inputs makes one today.
fn settle_stop(record: &StateRecord, decision: Decision, ctx: &Ctx<'_>) -> Decision {
    let Some(stop) = &record.stop else {
        return decision;
    };
    let Decision::Apply(mut t) = decision else {
        return decision;
    };
    if t.next.process_state == ProcessState::Processing && t.next.attempt == record.attempt {
        return Decision::Apply(t);
    }
    t.next.stop = None;
    if stop.command == CommandKind::Pause && t.next.process_state.is_in_flight() {
        // A step leased by this transition is not sent after all.
        let c = t.next.cursor;
        t.next.steps[c].dispatched = record.steps[c].dispatched;
        hold(&mut t.next, ctx, &stop.by, &stop.reason);
        t.effects.retain(|e| !matches!(e, Effect::Dispatch | Effect::Kick { .. }));
    }
    Decision::Apply(t)
}

/// Holds a record where it stands: Paused, out of the expiry index, at a new attempt so that
/// no message sent before counts.
fn hold(next: &mut StateRecord, ctx: &Ctx<'_>, by: &str, reason: &str) {
    next.process_state = ProcessState::Paused;
    next.locked_by = None;
    next.complete_by = None;
    next.attempt += 1;
    next.note_command(ctx.now, Happening::Paused, by, reason, ctx.config.timeline_limit);
}

fn stop_of(cmd: Command<'_>) -> Stop {
    Stop { command: cmd.kind, by: cmd.by.to_owned(), reason: cmd.reason.to_owned() }
}

/// The cause to record if an operator's cancel is waiting on `record`.
fn cancelled_by(record: &StateRecord) -> Option<Cause> {
    let stop = record.stop.as_ref().filter(|s| s.command == CommandKind::Cancel)?;
    Some(Cause::Cancelled { by: stop.by.clone(), reason: stop.reason.clone() })
}

/// The first step at or after `from` that is not done (after a redrive, steps kept done may
/// lie ahead of the cursor).
fn next_to_do(record: &StateRecord, from: usize) -> Option<usize> {
    (from..record.steps.len()).find(|&i| !record.steps[i].passed())
}

/// `decision`, with `effects` performed before its own.
fn first(effects: Vec<Effect>, decision: Decision) -> Decision {
    match decision {
        Decision::Apply(mut t) => {
            let mut all = effects;
            all.append(&mut t.effects);
            t.effects = all;
            Decision::Apply(t)
        }
        other => other,
    }
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
