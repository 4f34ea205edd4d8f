//! The state machine: the one place where every state change of an order is decided.
//!
//! [`decide`] takes the record as read, one input, and the time, and returns a [`Decision`]:
//! apply a transition (a new record to write conditionally, and the side effects to perform
//! once the write succeeded), replay the side effects of a transition that was already applied
//! (its message is back because the handler died after writing), ignore the input (stale,
//! duplicate, too early, or the order is finished), or reject it as illegal. It never panics and
//! performs no I/O; the services in [`crate::services`] do the reading, writing and sending.
//!
//! Each step being done or undone holds its own lease (attempt, CompleteBy, count of expired
//! leases) in the one record, so every transition stays one conditional write of that record,
//! whichever steps it touches. A step starts once every step it depends on (directly or
//! through others) is done or reported: steps that do not depend on each other are leased in
//! the same write and run at once. A step that waits for a time holds a lease that ends when
//! it wakes; nothing is sent for it but, for a wait SQS can delay a message for, a start
//! message due at that time. A step that waits for a callback holds a lease as long as its
//! timeout, sent to nobody: its start announces a token, which only an answer to that lease
//! may bear, and, for a timeout SQS can delay a message for, a start message due at its end
//! (again at each heartbeat). Either wait's start is on the timeline (`waiting`, with what it
//! waits for and until when). The record is Processing while a lease is sent, Pending
//! while leases only wait for the scheduler, and its CompleteBy is the earliest lease's.
//!
//! The transitions, by state and input:
//!
//! | state | input | outcome |
//! | --- | --- | --- |
//! | Pending, Processing | start message of a queued lease's attempt | every step queued at that attempt leased and dispatched; Processing |
//! | any | the queue message that produced the current revision, again | replay its side effects (every request in flight sent again) |
//! | Pending, Processing | start message of a wait's attempt, at or after its time | the wait done; the steps it freed leased and dispatched |
//! | Pending, Processing | start message of a wait's attempt, before its time | ignored: the supervisor wakes it |
//! | Pending, Processing | start message no queued lease holds | ignored: stale or duplicate |
//! | Processing | reply of a sent lease: done | the step done; the steps it freed leased and dispatched; Processed when none is left |
//! | Processing | reply of a sent lease: failed, or done with an output too large | the order stops: nothing new starts, steps in flight are awaited, then every done step is undone |
//! | Processing | the same, for a step whose failures are only reported | the failure recorded on the step; the order goes on as for done |
//! | Processing (undoing) | reply: done or failed | the undos it freed leased and dispatched, or Error and alert once none is left |
//! | Pending, Processing | reply naming a lease that waits for the scheduler | illegal: nothing was dispatched at that attempt |
//! | Pending, Processing, Paused | reply of an attempt no lease holds | ignored: stale |
//! | Pending, Processing | expiry, CompleteBy not passed or changed | ignored |
//! | Pending, Processing | expiry, CompleteBy passed by less than the horizon | ignored: its messages may still be waiting in a queue |
//! | Pending, Processing | expiry: each lease passed by the horizon, below its threshold | its count + 1; queued again (a sent one at a new attempt) with a later CompleteBy; start message after a wait |
//! | Pending, Processing | the same, at its threshold (or while the order stops) | the step failed, its outcome unknown: the order stops as for a refusal (or goes on, if only reported); an undo failed |
//! | Pending, Processing | expiry: a wait's lease at its time (no horizon: nothing of it is in a queue) | the wait done; the steps it freed queued; start message |
//! | Processing | answer to a callback bearing its token (or an operator's): complete | the step done with the output given, who answered on the timeline; the steps it freed queued; start message |
//! | Processing | the same: refuse | the step failed with who refused and why: the order stops as for an agent's refusal (or goes on, if only reported) |
//! | Processing | the same: heartbeat | the callback's lease runs a whole timeout from now, its answer due then |
//! | any | answer with another token, to a step not waiting (done, failed, not started, order stopping or ended) or taking no callback | refused, saying why; nothing written |
//! | Pending, Processing | expiry: a callback's lease at its end (no horizon: no answer is in a queue) | the step failed, unanswered |
//! | Processing | start message of a callback's attempt, at or after its end | the step failed, unanswered (as at its expiry, without waiting for a sweep) |
//! | Processing | start message of a callback's attempt, before its end | ignored: a heartbeat moved the end, and sent its own |
//! | Error, Processed (alert pending) | expiry, CompleteBy passed | alert published again |
//! | Error, Processed (alert pending) | alert sent | alert recorded, record leaves the expiry index |
//! | Pending | the submission again (same key, same order), never claimed | start message again |
//! | Processed, Error, Cancelled | any message or expiry (but an alert's, above) | ignored: terminal states move only by an operator's command |
//! | Paused | any message or expiry | ignored: nothing of it is in flight |
//!
//! Undos run in reverse order of the dependencies: a step is undone once no step that depends
//! on it (directly or through others) is still queued for undo, so independent undos run at
//! once, and in a sequence the last step done is undone first.
//!
//! Operator commands (each with an id, the caller and a reason; a command id already applied
//! changes nothing, and a command that does not fit the state is refused with the state named):
//!
//! | state | command | outcome |
//! | --- | --- | --- |
//! | Pending, Paused (forward) | cancel | queued steps taken back; completed steps queued for undo and started; nothing to undo: Cancelled |
//! | Processing (forward) | cancel | queued steps taken back; the steps in flight finish; once the last has replied or been judged, undo as above |
//! | Pending | pause | Paused at once: its start messages are fenced off |
//! | Processing | pause | queued steps taken back; the steps in flight finish; the order is Paused where it would have gone on |
//! | Paused | resume | the free steps queued at a new attempt; start message |
//! | Processing (pause waiting) | resume | the pause is withdrawn; the free steps queued again |
//! | Error | redrive | Pending with the steps not done queued as their dependencies allow; undone and refused steps done again under new keys |
//! | Error, undo failed | redrive_compensation | the failed undos queued again under their keys |
//! | any other | any | refused, naming the state |
//!
//! A cancelled order whose undos all succeed ends Cancelled, with a status event and no alert
//! (the operator asked for it); one whose undo fails, or whose step in flight could not be
//! undone, ends in Error with an alert listing what is left. A cancel never outruns the steps
//! in flight: their replies are awaited, so a step that completes is undone, and if the last
//! steps complete the order is Processed (there was nothing left to stop). A step sent before
//! whose outcome is unknown (its lease had expired, or it was taken back before its new claim)
//! is handled as any uncertain step: undone if it can be, reported if not.
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
//! of a lease that waited for the scheduler keeps its attempt, so a start message that was
//! only late still claims it; one of a sent lease takes a new attempt, since the old request
//! is judged lost.

use std::collections::HashSet;
use std::time::Duration;

use crate::config::EngineConfig;
use crate::events::StatusKind;
use crate::ids::{Direction, OrderId};
use crate::message::{MAX_OUTPUT_LEN, StepOutcome, StepRef, output_len};
use crate::mutants::{self, Mutant};
use crate::state::{
    AlertDelivery, Cause, CommandEntry, CommandKind, Happening, InputRef, Lease, Phase,
    ProcessState, StateRecord, StepState, StepStatus, Stop, WaitingFor,
};
use crate::time::Timestamp;
use crate::workflow::{OnFailure, Wait, Work, Workflow};

/// The longest SQS delays a message: a longer wait is woken by the supervisor.
const MAX_DELIVERY_DELAY: Duration = Duration::from_secs(900);

/// Operator commands remembered on a record for recognising a repeat; an older one sent again
/// is judged on the record's state, which refuses or ignores nearly every repeat anyway.
pub const COMMANDS_KEPT: usize = 16;

/// What a decision needs besides the record and the input.
#[derive(Clone, Copy, Debug)]
pub struct Ctx<'a> {
    pub now: Timestamp,
    pub config: &'a EngineConfig,
    pub workflow: &'a Workflow,
    /// Fresh randomness, from which the tokens of the callbacks a transition starts are made.
    pub seed: u128,
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
    /// An answer to step `step`, which waits for a callback: from the party outside, bearing
    /// the token it was given, or from an operator on its behalf (`token` `None`).
    Answer {
        step: &'a str,
        token: Option<&'a str>,
        answer: &'a Answer,
        by: &'a str,
        reason: &'a str,
    },
}

/// What the outside world answers a step that waits for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Done, with the step's output.
    Complete { output: serde_json::Value },
    /// Refused: the step fails, as its workflow says a failure does.
    Refuse,
    /// Not yet, but still at it: the timeout starts again.
    Heartbeat,
}

impl Answer {
    pub fn as_str(&self) -> &'static str {
        match self {
            Answer::Complete { .. } => "complete",
            Answer::Refuse => "refuse",
            Answer::Heartbeat => "heartbeat",
        }
    }
}

/// A side effect to perform after the decision's write succeeded. Effects are described, not
/// built: the service derives the messages from the record that was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Send the request for step `step`'s lease (to do or to undo it) to its agent.
    Dispatch { step: usize },
    /// Announce that step `step` waits for a callback, with its token.
    Announce { step: usize },
    /// Send a start message for the steps queued at `attempt`, after `delay`.
    Kick { delay: Duration, attempt: u64 },
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
    #[error("step {step:?} does not wait for a callback")]
    NoCallback { step: String },
    #[error("this is not the token step {step:?} was given")]
    WrongToken { step: String },
    #[error("step {step:?} no longer waits for an answer: it is {status}, the order {state}", status = .status.as_str(), state = .state.as_str())]
    NotWaiting { step: String, status: StepStatus, state: ProcessState },
    #[error("the output is {bytes} bytes, more than the {limit} bytes a step may return")]
    OutputTooLarge { bytes: u64, limit: u64 },
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
            Refused::NoCallback { .. } => "no_callback",
            Refused::WrongToken { .. } => "wrong_token",
            Refused::NotWaiting { .. } => "not_waiting",
            Refused::OutputTooLarge { .. } => "output_too_large",
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
        Input::Expire { .. }
        | Input::AlertSent
        | Input::Resubmit
        | Input::Command { .. }
        | Input::Answer { .. } => Remedy::Report,
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
/// each step that depends on nothing queued with the claim grace and its whole budget before
/// its CompleteBy (or, if it waits, until it wakes), and one start message for them all.
pub fn create(order_id: OrderId, correlation_id: String, ctx: &Ctx<'_>) -> Transition {
    create_waking(order_id, correlation_id, &[], ctx)
}

/// [`create`], for an order whose steps that wait until a time of its input wake at `wakes`
/// (see [`Workflow::wakes`]).
pub fn create_waking(
    order_id: OrderId,
    correlation_id: String,
    wakes: &[(String, Timestamp)],
    ctx: &Ctx<'_>,
) -> Transition {
    let steps = ctx
        .workflow
        .steps()
        .iter()
        .map(|s| {
            let mut state = StepState::new(&s.name);
            state.wake_at = wakes.iter().find(|(name, _)| *name == s.name).map(|(_, at)| *at);
            state
        })
        .collect();
    let mut next = StateRecord {
        order_id,
        workflow: ctx.workflow.name().to_owned(),
        workflow_version: ctx.workflow.version(),
        process_state: ProcessState::Pending,
        locked_by: None,
        complete_by: None,
        failure_count: 0,
        attempt: 0,
        revision: 0,
        phase: Phase::Forward,
        steps,
        cause: None,
        alert: None,
        last_input: InputRef::Submit,
        correlation_id,
        shard: order_id.shard(ctx.config.index_shards),
        created_at: ctx.now,
        active_since: None,
        updated_at: ctx.now,
        ended_at: None,
        timeline: Vec::new(),
        stop: None,
        commands: Vec::new(),
        redrives: 0,
        legacy_cursor: None,
    };
    let mut effects = started(ctx);
    for (i, step) in ctx.workflow.steps().iter().enumerate() {
        if !step.depends_on.is_empty() {
            continue;
        }
        match &step.work {
            Work::Wait(wait) => wait_for(&mut next, i, wait, ctx, &mut effects),
            Work::Agent(_) | Work::Callback => {
                // At attempt 0, which the start message every new order gets claims.
                let complete_by = ctx.now.plus(ctx.config.claim_grace).plus(step.budget);
                let lease =
                    Lease { attempt: 0, complete_by, sent: false, failures: 0, timer: false };
                next.steps[i].lease = Some(lease);
            }
        }
    }
    next.complete_by = next.earliest_lease();
    next.note(ctx.now, Happening::Received, None, ctx.config.timeline_limit);
    Transition { next, effects }
}

/// What a new order owes the world: its start message, and its first status event.
fn started(ctx: &Ctx<'_>) -> Vec<Effect> {
    let mut effects = vec![Effect::Kick { delay: Duration::ZERO, attempt: 0 }];
    effects.extend(status(ctx, StatusKind::Received, None));
    effects
}

/// Decides what `input` does to `record`. See the module documentation for the tables.
pub fn decide(record: &StateRecord, input: Input<'_>, ctx: &Ctx<'_>) -> Decision {
    // Everything below may rely on the invariants (leases on steps that can hold them, ...).
    if let Err(reason) = record.check() {
        return Decision::Illegal(Illegal::Corrupt { reason });
    }
    if let Input::Command { command, id, by, reason } = input {
        return operate(record, Command { kind: command, id, by, reason }, ctx);
    }
    if let Input::Answer { step, token, answer: given, by, reason } = input {
        return answer(record, Answered { step, token, answer: given, by, reason }, ctx);
    }
    react(record, input, ctx)
}

/// What the system's own inputs do.
fn react(record: &StateRecord, input: Input<'_>, ctx: &Ctx<'_>) -> Decision {
    use ProcessState::{Cancelled, Error, Paused, Pending, Processed, Processing};
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

        (Pending | Processing, Input::Claim { attempt, owner, message }) => {
            claim(record, attempt, owner, message, ctx)
        }
        (Paused, Input::Claim { .. }) => Decision::Ignore(Ignored::Paused),
        (Paused, Input::Reply { attempt, .. }) => {
            Decision::Ignore(Ignored::Stale { received: attempt, current: record.attempt })
        }

        (Pending | Processing, Input::Reply { attempt, step, outcome, message }) => {
            reply(record, attempt, step, outcome, message, ctx)
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

        (_, Input::Command { .. } | Input::Answer { .. }) => unreachable_command(record),
    }
}

/// Commands and answers are decided by [`operate`] and [`answer`]; this arm only keeps the
/// match exhaustive.
fn unreachable_command(record: &StateRecord) -> Decision {
    Decision::Illegal(Illegal::Corrupt {
        reason: format!("{}: a command reached the message path", record.order_id),
    })
}

/// A start message: every step queued at its attempt is leased and dispatched, and a wait
/// whose time has come is over.
fn claim(
    record: &StateRecord,
    attempt: u64,
    owner: &str,
    message: &str,
    ctx: &Ctx<'_>,
) -> Decision {
    let queued: Vec<(usize, Lease)> = record
        .leased()
        .filter(|(_, _, l)| !l.sent && l.attempt == attempt)
        .map(|(i, _, l)| (i, *l))
        .collect();
    if queued.is_empty() {
        return timed_out(record, attempt, message, ctx);
    }
    if queued.iter().all(|(_, l)| l.timer && l.complete_by > ctx.now) {
        // A wait's start message came before its time (clocks differ a little): the
        // supervisor wakes it if nothing else does.
        return Decision::Ignore(Ignored::NotExpired { complete_by: record.complete_by });
    }
    let mut next = begin(record, ctx, InputRef::Message(message.to_owned()));
    next.locked_by = Some(owner.to_owned());
    let mut effects = if record.process_state == ProcessState::Pending {
        status(ctx, StatusKind::Processing, None)
    } else {
        Vec::new()
    };
    for (i, lease) in queued {
        if lease.timer {
            if lease.complete_by <= ctx.now {
                wake(&mut next, i, ctx, &mut effects);
            }
            continue;
        }
        let Some(budget) = budget_of(&next.steps[i], ctx) else {
            return unknown_step(&next.steps[i]);
        };
        // A deadline that still leaves the step its whole budget is kept: the lease is as
        // long as promised, and the expiry index entry is not rewritten (an index key change
        // costs two index writes).
        let fresh = ctx.now.plus(budget);
        dispatch(&mut next, i, lease.complete_by.max(fresh), ctx, &mut effects);
        let name = next.steps[i].name.clone();
        next.note(ctx.now, Happening::Claimed, Some(name), ctx.config.timeline_limit);
    }
    proceed(next, effects, ctx, Via::Lease)
}

/// A start message no queued lease holds: the end of the callback waiting at its attempt, if
/// one is, judged as its expiry would be (so that a timeout of minutes acts within seconds of
/// its end, not at the next sweep); otherwise stale.
fn timed_out(record: &StateRecord, attempt: u64, message: &str, ctx: &Ctx<'_>) -> Decision {
    let callback =
        record.leased().find(|(_, s, l)| l.sent && l.attempt == attempt && awaits_callback(ctx, s));
    let Some((i, _, lease)) = callback else {
        return Decision::Ignore(Ignored::Stale { received: attempt, current: record.attempt });
    };
    if lease.complete_by > ctx.now {
        return Decision::Ignore(Ignored::NotExpired { complete_by: Some(lease.complete_by) });
    }
    let mut next = begin(record, ctx, InputRef::Message(message.to_owned()));
    let mut effects = Vec::new();
    judge(&mut next, i, ctx, &mut effects);
    proceed(next, effects, ctx, Via::Kick)
}

/// The start message that ends a callback's wait at the end of `lease`, if SQS can delay a
/// message that long; a longer wait ends at the supervisor's sweep.
fn callback_end(lease: &Lease, ctx: &Ctx<'_>) -> Option<Effect> {
    let delay = ctx.now.until(lease.complete_by);
    (delay <= MAX_DELIVERY_DELAY).then_some(Effect::Kick { delay, attempt: lease.attempt })
}

/// The wait of step `i` is over: the step is done.
fn wake(next: &mut StateRecord, i: usize, ctx: &Ctx<'_>, effects: &mut Vec<Effect>) {
    let name = next.steps[i].name.clone();
    next.steps[i].lease = None;
    next.steps[i].status = StepStatus::Done;
    next.steps[i].output = Some(serde_json::json!({ "woke_at": ctx.now.to_rfc3339() }));
    next.active_since = Some(ctx.now);
    next.note(ctx.now, Happening::StepDone, Some(name.clone()), ctx.config.timeline_limit);
    effects.extend(status(ctx, StatusKind::StepDone, Some(name)));
}

/// Starts the wait of step `i`: a lease that ends when it wakes (kept from an earlier start),
/// and, for a wait SQS can delay a message for, a start message that comes at that time; the
/// supervisor wakes a longer one.
fn wait_for(
    next: &mut StateRecord,
    i: usize,
    wait: &Wait,
    ctx: &Ctx<'_>,
    effects: &mut Vec<Effect>,
) {
    let from_now = match wait {
        Wait::For(duration) => *duration,
        // Set at submission; a record made without it wakes at once.
        Wait::Until(_) => Duration::ZERO,
    };
    let wake = *next.steps[i].wake_at.get_or_insert(ctx.now.plus(from_now));
    next.attempt += 1;
    let attempt = next.attempt;
    next.steps[i].lease =
        Some(Lease { attempt, complete_by: wake, sent: false, failures: 0, timer: true });
    let name = next.steps[i].name.clone();
    next.note_wait(ctx.now, &name, WaitingFor::Time, wake, ctx.config.timeline_limit);
    let delay = ctx.now.until(wake);
    if delay <= MAX_DELIVERY_DELAY {
        effects.push(Effect::Kick { delay, attempt });
    }
}

/// A reply: only the lease it names, if that lease was sent, is moved by it.
fn reply(
    record: &StateRecord,
    attempt: u64,
    step: &StepRef,
    outcome: &StepOutcome,
    message: &str,
    ctx: &Ctx<'_>,
) -> Decision {
    let Some((i, leased, lease)) = holder(record, attempt, step) else {
        return Decision::Ignore(Ignored::Stale { received: attempt, current: record.attempt });
    };
    if !lease.sent || awaits_callback(ctx, leased) {
        // Nothing goes to an agent for a callback: no agent can answer for it.
        return Decision::Illegal(Illegal::NotDispatched { attempt });
    }
    if step.index != i || step.name != leased.name {
        return Decision::Illegal(Illegal::WrongStep {
            leased: leased.name.clone(),
            replied: step.name.clone(),
        });
    }
    let direction = leased.direction();
    if step.direction != direction {
        return Decision::Illegal(Illegal::WrongDirection {
            leased: direction,
            replied: step.direction,
        });
    }
    let mut next = begin(record, ctx, InputRef::Message(message.to_owned()));
    next.steps[i].lease = None;
    let name = leased.name.clone();
    let limit = ctx.config.timeline_limit;
    // An agent of this version answers TooLarge itself; one of another may not.
    let too_large = match outcome {
        StepOutcome::Done { output } => output_len(output),
        StepOutcome::TooLarge { bytes } => Some(*bytes),
        StepOutcome::Failed { .. } => None,
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
            let limit = MAX_OUTPUT_LEN as u64;
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

/// The step whose lease holds `attempt`, with the lease.
fn holder<'r>(
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
fn failed(next: &mut StateRecord, i: usize, cause: Cause, ctx: &Ctx<'_>) {
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
enum Via {
    Lease,
    Kick,
}

/// Where the order goes once a transition has settled the steps it touched: the steps (or
/// undos) that are now free to start are started; an order that stops waits for its steps in
/// flight, then pauses or undoes what it did; an order with nothing left to do or undo ends.
fn proceed(mut next: StateRecord, effects: Vec<Effect>, ctx: &Ctx<'_>, via: Via) -> Decision {
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
            return in_flight(next, effects);
        }
        if let Some(stop) = next.stop.take()
            && next.cause.is_none()
        {
            if next.steps.iter().all(StepState::passed) {
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
fn go_on(mut next: StateRecord, mut effects: Vec<Effect>, ctx: &Ctx<'_>, via: Via) -> Decision {
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

/// Compensating: starts every undo that no step depending on it still waits for (undos run
/// in reverse order of the dependencies, independent ones at once), or ends the order once
/// nothing is left to undo.
fn undo_next(mut next: StateRecord, mut effects: Vec<Effect>, ctx: &Ctx<'_>, via: Via) -> Decision {
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

/// Starts steps `ready` (or their undos): leased and dispatched at once, or queued at one new
/// attempt with one start message for them all.
fn start(
    next: &mut StateRecord,
    ready: &[usize],
    effects: &mut Vec<Effect>,
    ctx: &Ctx<'_>,
    via: Via,
) -> Result<(), Decision> {
    let mut kicked = None;
    for &i in ready {
        let state = &next.steps[i];
        let step = ctx.workflow.step_named(&state.name);
        if let (Some(Work::Wait(wait)), Direction::Do) = (step.map(|s| &s.work), state.direction())
        {
            wait_for(next, i, wait, ctx, effects);
            continue;
        }
        let Some(budget) = budget_of(state, ctx) else {
            return Err(unknown_step(state));
        };
        match via {
            Via::Lease => dispatch(next, i, ctx.now.plus(budget), ctx, effects),
            Via::Kick => {
                // Every step queued by this write at one attempt, claimed by one start message.
                let attempt = *kicked.get_or_insert_with(|| {
                    next.attempt += 1;
                    next.attempt
                });
                let complete_by = ctx.now.plus(ctx.config.claim_grace).plus(budget);
                let lease = Lease { attempt, complete_by, sent: false, failures: 0, timer: false };
                next.steps[i].lease = Some(lease);
            }
        }
    }
    if let Some(attempt) = kicked {
        effects.push(Effect::Kick { delay: Duration::ZERO, attempt });
    }
    Ok(())
}

/// Sends step `i`, due by `complete_by`: its request to its agent, or, for a callback, the
/// announcement of a fresh token, which only this lease accepts.
fn dispatch(
    next: &mut StateRecord,
    i: usize,
    complete_by: Timestamp,
    ctx: &Ctx<'_>,
    effects: &mut Vec<Effect>,
) {
    if !awaits_callback(ctx, &next.steps[i]) {
        send(next, i, complete_by);
        effects.push(Effect::Dispatch { step: i });
        return;
    }
    // Not marked dispatched: nothing reached a service, so a stop leaves nothing to judge.
    next.attempt += 1;
    let attempt = next.attempt;
    let lease = Lease { attempt, complete_by, sent: true, failures: 0, timer: false };
    next.steps[i].lease = Some(lease);
    next.steps[i].token = Some(token(ctx.seed, next.order_id, attempt, i));
    next.steps[i].answer_by = Some(complete_by);
    let name = next.steps[i].name.clone();
    next.note_wait(ctx.now, &name, WaitingFor::Answer, complete_by, ctx.config.timeline_limit);
    effects.push(Effect::Announce { step: i });
    effects.extend(callback_end(&lease, ctx));
}

/// A token no one can guess from anything the order shows, distinct for every step and attempt
/// even from one seed.
fn token(seed: u128, order_id: OrderId, attempt: u64, step: usize) -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    hash.update(seed.to_le_bytes());
    hash.update(order_id.to_string().as_bytes());
    hash.update(attempt.to_le_bytes());
    hash.update((step as u64).to_le_bytes());
    hash.finalize().iter().take(20).map(|b| format!("{b:02x}")).collect()
}

/// Whether `state` is a step that waits for a callback (to do: a callback has no undo).
fn awaits_callback(ctx: &Ctx<'_>, state: &StepState) -> bool {
    ctx.workflow.step_named(&state.name).is_some_and(|s| matches!(s.work, Work::Callback))
}

/// Leases step `i` (keeping its count of expired leases) and marks it dispatched: a new
/// attempt, due by `complete_by`, whose request goes out once the record is written; from
/// then on it may have reached its service under the step's keys.
fn send(next: &mut StateRecord, i: usize, complete_by: Timestamp) {
    next.attempt += 1;
    let failures = next.steps[i].lease.map_or(0, |l| l.failures);
    let attempt = next.attempt;
    next.steps[i].lease = Some(Lease { attempt, complete_by, sent: true, failures, timer: false });
    next.steps[i].dispatched = true;
}

/// The record as its leases make it: Processing while one is sent, Pending while some wait
/// for the scheduler, with the earliest lease as its CompleteBy.
fn in_flight(mut next: StateRecord, effects: Vec<Effect>) -> Decision {
    if next.steps.iter().any(|s| s.sent().is_some()) {
        next.process_state = ProcessState::Processing;
    } else {
        next.process_state = ProcessState::Pending;
        next.locked_by = None;
    }
    next.complete_by = next.earliest_lease();
    apply(next, effects)
}

/// Every step is done or reported: Processed. A report owes the operators an alert, which
/// keeps the record in the expiry index until it is known to be published.
fn processed(mut next: StateRecord, mut effects: Vec<Effect>, ctx: &Ctx<'_>) -> Decision {
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
    apply(next, effects)
}

/// The supervisor found an expired record in flight: every lease expired by more than the
/// horizon is judged in the one write.
fn expire(record: &StateRecord, seen: Timestamp, horizon: Duration, ctx: &Ctx<'_>) -> Decision {
    if let Some(ignored) = not_expired(record, seen, ctx) {
        return Decision::Ignore(ignored);
    }
    // A wait or a callback is due at its time: no message of it can be on its way.
    let due = |s: &StepState, l: &Lease| match l.timer || awaits_callback(ctx, s) {
        true => l.complete_by,
        false => l.complete_by.plus(horizon),
    };
    let expired: Vec<usize> =
        record.leased().filter(|(_, s, l)| due(s, l) <= ctx.now).map(|(i, _, _)| i).collect();
    if expired.is_empty() {
        return Decision::Ignore(Ignored::Queued { until: seen.plus(horizon) });
    }
    let mut next = begin(record, ctx, InputRef::Expire);
    let mut effects = Vec::new();
    for i in expired {
        judge(&mut next, i, ctx, &mut effects);
    }
    proceed(next, effects, ctx, Via::Kick)
}

/// Judges the expired lease of step `i`: tried again after a wait while below its threshold
/// and nothing stops the order; otherwise the step failed (its outcome unknown), or its undo
/// did.
fn judge(next: &mut StateRecord, i: usize, ctx: &Ctx<'_>, effects: &mut Vec<Effect>) {
    let Some(lease) = next.steps[i].lease.take() else { return };
    if lease.timer {
        return wake(next, i, ctx, effects);
    }
    let failures = lease.failures.saturating_add(1);
    next.failure_count = next.failure_count.saturating_add(1);
    let name = next.steps[i].name.clone();
    let limit = ctx.config.timeline_limit;
    next.note(ctx.now, Happening::LeaseExpired, Some(name.clone()), limit);

    let Some(step) = ctx.workflow.step_named(&name) else {
        // No amount of retrying can run a step the workflow no longer has.
        next.cause.get_or_insert(Cause::UnknownStep { step: name.clone() });
        next.steps[i].status = StepStatus::Uncertain;
        return;
    };
    let direction = next.steps[i].direction();
    if matches!(step.work, Work::Callback) {
        // Its budget was the time the outside world had to answer, and it did not.
        next.steps[i].status = StepStatus::Failed;
        next.steps[i].detail = Some(format!("no answer within {} s", step.budget.as_secs()));
        return failed(next, i, Cause::StepTimedOut { step: name, failures }, ctx);
    }
    let threshold = step.expired_leases.unwrap_or(ctx.config.failure_threshold);
    // An order that stops for good does not wait for a retry of a step: its outcome is
    // unknown now. One that pauses takes the step back, and starts it again on resuming.
    let ending =
        direction == Direction::Do && (next.cause.is_some() || cancelled_by(next).is_some());
    if failures < threshold && !ending {
        if direction == Direction::Do && next.stop.is_some() {
            return;
        }
        // Wait longer before each further try, in case the fault is not as transient as hoped.
        let wait = step.waits(ctx.config.wait).wait(failures);
        let budget = step.action(direction).map_or(step.budget, |(_, b)| b);
        // A sent request (or its reply) is judged lost, and a new attempt fences it out. A
        // queued step keeps its attempt: should its start message only be late after all, it
        // still claims the step, and the new one finds it claimed.
        let attempt = if lease.sent || mutants::on(Mutant::PendingResetTakesNewAttempt) {
            next.attempt += 1;
            next.attempt
        } else {
            lease.attempt
        };
        let complete_by = ctx.now.plus(wait).plus(ctx.config.claim_grace).plus(budget);
        next.steps[i].lease =
            Some(Lease { attempt, complete_by, sent: false, failures, timer: false });
        next.note(ctx.now, Happening::RetryScheduled, Some(name), limit);
        effects.push(Effect::Kick { delay: wait, attempt });
        return;
    }
    let detail = match failures {
        1 => "its lease expired once, its outcome unknown".to_owned(),
        n => format!("its lease expired {n} times, its outcome unknown"),
    };
    match direction {
        Direction::Do => {
            // The step may have taken effect with its answer lost: undo it too if it can be
            // undone (compensations must tolerate undoing what never happened), otherwise
            // leave it to the operator. Passed on a report, it stays as it may be.
            let undo =
                step.compensation.is_some() && (step.on_failure == OnFailure::Undo || ending);
            next.steps[i].status = if undo { StepStatus::ToUndo } else { StepStatus::Uncertain };
            next.steps[i].detail = Some(detail);
            failed(next, i, Cause::StepTimedOut { step: name, failures }, ctx);
        }
        Direction::Undo => {
            next.steps[i].status = StepStatus::UndoFailed;
            next.steps[i].detail = Some(detail);
            next.note(ctx.now, Happening::UndoFailed, Some(name), limit);
        }
    }
}

/// Nothing is in flight any more: queues every completed step that has a compensation for
/// undoing, and starts the undos nothing waits for. A step not reached in this run but sent
/// under its current keys before (a redrive kept the keys of a step whose outcome was
/// unknown, or a step was taken back before its claim) is as uncertain as ever: undone if it
/// can be, otherwise left on the operator's list.
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
fn fail(mut next: StateRecord, ctx: &Ctx<'_>) -> Decision {
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
/// transition was already written: every request in flight again (an agent answers a repeat
/// from its ledger), and a terminal state's event and alert. Non-terminal status events are
/// not replayed: they are informative, and the next terminal event supersedes them.
fn replay(record: &StateRecord, ctx: &Ctx<'_>) -> Vec<Effect> {
    match record.process_state {
        ProcessState::Processing => record
            .leased()
            .filter(|(_, _, l)| l.sent)
            .map(|(i, s, _)| match awaits_callback(ctx, s) {
                true => Effect::Announce { step: i },
                false => Effect::Dispatch { step: i },
            })
            .collect(),
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

/// The start messages the record's queued steps wait for.
fn kicks(record: &StateRecord) -> Vec<Effect> {
    let mut attempts: Vec<u64> =
        record.leased().filter(|(_, _, l)| !l.sent).map(|(_, _, l)| l.attempt).collect();
    attempts.sort_unstable();
    attempts.dedup();
    attempts.into_iter().map(|attempt| Effect::Kick { delay: Duration::ZERO, attempt }).collect()
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

/// The budget of the action a lease on `state` is for (a callback's timeout); `None` if the
/// workflow has no such step (or no undo for it).
fn budget_of(state: &StepState, ctx: &Ctx<'_>) -> Option<Duration> {
    let step = ctx.workflow.step_named(&state.name)?;
    match (&step.work, state.direction()) {
        (Work::Callback, Direction::Do) => Some(step.budget),
        _ => step.action(state.direction()).map(|(_, budget)| budget),
    }
}

fn has_compensation(workflow: &Workflow, step: &str) -> bool {
    workflow.step_named(step).is_some_and(|s| s.compensation.is_some())
}

fn unknown_step(state: &StepState) -> Decision {
    Decision::Illegal(Illegal::UnknownStep { step: state.name.clone() })
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
                ProcessState::Pending | ProcessState::Processing => kicks(record),
                ProcessState::Paused => Vec::new(),
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
        Ok(Decision::Illegal(Illegal::UnknownStep { step })) => {
            Decision::Refuse(Refused::UnknownStep { step })
        }
        Ok(other) => other,
        Err(refused) => Decision::Refuse(refused),
    }
}

/// An answer as [`answer`] takes it.
#[derive(Clone, Copy, Debug)]
struct Answered<'a> {
    step: &'a str,
    token: Option<&'a str>,
    answer: &'a Answer,
    by: &'a str,
    reason: &'a str,
}

/// Decides an answer to a step that waits for a callback. It counts only while the step waits,
/// and, from outside, only with the token the step's announcement carried; anything else
/// changes nothing and is refused with the reason.
fn answer(record: &StateRecord, a: Answered<'_>, ctx: &Ctx<'_>) -> Decision {
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
            next.complete_by = next.earliest_lease();
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
    proceed(next, effects, ctx, Via::Kick)
}

/// Compares two tokens in a time that does not tell how much of a guess was right.
fn same_token(expected: &str, given: &str) -> bool {
    let (a, b) = (expected.as_bytes(), given.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Cancel: at once when no step is in flight, else once the steps in flight are finished.
fn cancel(record: &StateRecord, cmd: Command<'_>, ctx: &Ctx<'_>) -> Result<Decision, Refused> {
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
    Ok(proceed(next, Vec::new(), ctx, Via::Kick))
}

/// Pause: at once when no step is in flight, else once the steps in flight are finished.
fn pause(record: &StateRecord, cmd: Command<'_>, ctx: &Ctx<'_>) -> Result<Decision, Refused> {
    let state = record.process_state;
    let limit = ctx.config.timeline_limit;
    let mut next = begin(record, ctx, InputRef::Command(cmd.id.to_owned()));
    match state {
        ProcessState::Processed | ProcessState::Error | ProcessState::Cancelled => {
            Err(Refused::Finished { state, command: cmd.kind })
        }
        ProcessState::Paused => Err(Refused::AlreadyPaused),
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
                Ok(proceed(next, Vec::new(), ctx, Via::Kick))
            }
        },
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
            Ok(proceed(next, Vec::new(), ctx, Via::Kick))
        }
        (ProcessState::Paused, _) => {
            next.active_since = Some(ctx.now);
            next.note_command(ctx.now, Happening::Resumed, cmd.by, cmd.reason, limit);
            Ok(proceed(next, Vec::new(), ctx, Via::Kick))
        }
        _ => Err(Refused::NotPaused { state }),
    }
}

/// Redrive: an order in Error runs again from the steps not done. Steps that were undone or
/// refused are done again under keys of a new generation; a step whose outcome is unknown (it
/// timed out and nothing could undo it) keeps its key, so that its service answers what it
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
    Ok(restart(next, ctx, cmd))
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
    Ok(restart(next, ctx, cmd))
}

/// Puts a redriven record back in flight, its free steps queued at a new attempt with their
/// start message.
fn restart(mut next: StateRecord, ctx: &Ctx<'_>, cmd: Command<'_>) -> Decision {
    next.failure_count = 0;
    next.alert = None;
    next.ended_at = None;
    next.redrives += 1;
    next.active_since = Some(ctx.now);
    next.note_command(ctx.now, Happening::Redriven, cmd.by, cmd.reason, ctx.config.timeline_limit);
    proceed(next, Vec::new(), ctx, Via::Kick)
}

fn within_window(record: &StateRecord, ctx: &Ctx<'_>) -> Result<(), Refused> {
    let ended_at = record.ended_at.unwrap_or(record.updated_at);
    if ended_at.plus(ctx.config.redrive_window) < ctx.now {
        return Err(Refused::TooLate { ended_at, window_s: ctx.config.redrive_window.as_secs() });
    }
    Ok(())
}

/// Holds a record where it stands: Paused, out of the expiry index, at a new attempt so that
/// no message sent before counts.
fn hold(next: &mut StateRecord, ctx: &Ctx<'_>, by: &str, reason: &str) {
    next.process_state = ProcessState::Paused;
    next.locked_by = None;
    next.complete_by = None;
    next.stop = None;
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
