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
//! | Processing | reply of a sent lease: held (its service is held, no answer came) | the step (or undo) waits for its service at a new attempt, queued for nobody, its lease ending with its `max_hold` (counted from its first hold); nothing counts against it |
//! | Pending, Processing | resume: the supervisor found the step's service open | every step held on it queued at one new attempt; start message after the delay given |
//! | Pending, Processing | resume for a service no step waits for | ignored |
//! | Pending, Processing | expiry: a held lease at the end of its `max_hold` (no horizon) | the step failed (`service_held_too_long`), its outcome unknown: undone if it can be; an undo failed |
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
//! | Pending, Processing | expiry: a child step's lease before its timeout (it ends every five minutes) | its children looked at: a start or an end's word lost is made again, under the same lease; nothing counts against it |
//! | Pending, Processing | expiry: a child step's lease at its timeout | the step failed, its outcome unknown: undone (its child cancelled, or undone) with the rest; a list's children in flight stopped at once |
//! | Pending, Processing | a list's element ended (a child-ended message naming the element) | counted; more elements started up to the step's concurrency while nothing stops it and no more failed than it tolerates; once none is in flight, the children's outputs collected (the step's reply), or the step failed, its processed children undone with the rest |
//! | Processing (undoing) | expiry of a child step's undo lease | its children asked again at a new attempt; nothing counts against it |
//! | Pending, Processing | a child step's child ended (a child-ended message, read as a reply of its lease) | as an agent's reply: processed is done, with the child's outputs; Error or Cancelled failed; for its undo, undone unless the child left something to undo by hand |
//! | Pending, Processing (stopping) | any transition while a child step is in flight | its child is asked to cancel (a command of the parent's) |
//! | any, a child | its parent undoes the step that started it | processed: undone as by an operator's undo; in flight: cancelled; its end answers the parent's undo from then on |
//! | Error, Processed (alert pending) | expiry, CompleteBy passed | alert published again |
//! | Error, Processed (alert pending) | alert sent | alert recorded, record leaves the expiry index |
//! | Pending | the submission again (same key, same order), never claimed | start message again |
//! | Pending, in its key's line | start message of its attempt, after a look at the line: it holds a place | admitted: the steps that depend on nothing leased and dispatched |
//! | Pending, in its key's line | the same, no place | ignored (it waits on); for a workflow that skips, Cancelled (`key_busy`) |
//! | Pending, in its key's line | expiry: past its `max_wait` | Error (`key_waited_too_long`) and alert; nothing is undone |
//! | Pending, in its key's line | expiry, before | looked at again later; its entry in the line written again, a start message now |
//! | Processed, Error, Cancelled, its key's place not recorded given back | expiry | the place given back again (the alert too, if still owed) |
//! | Processed, Error, Cancelled | its key's place given back | recorded: it leaves the expiry index (unless its alert is owed) |
//! | Processed, Error, Cancelled | any message or expiry (but an alert's, above) | ignored: terminal states move only by an operator's command |
//! | Paused | any message, expiry or resume | ignored: nothing of it is in flight |
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
//! | Processed, a failure reported | acknowledge | taken note of, who and why on the timeline: it leaves the operators' list (once) |
//! | Processed | undo | every completed step queued for undo, last first, as for a cancel: Cancelled once all are undone; Error with its alert if a step has no undo or one fails |
//! | Pending, in its key's line | pause | refused: nothing of it runs yet |
//! | Error, Processed, of a workflow with a concurrency key | redrive, redrive_compensation, undo | as above, but what it would queue waits until it is admitted again, in line behind the orders of its key |
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
//! alert naming what was left undone, and the order is on their list of reported orders until
//! one of them acknowledges it. An operator's cancel waiting on the step takes
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
//!
//! By concern, every part of the one pure [`decide`]: here the inputs, decisions and effects,
//! and the dispatch of an input to its part; `leases` (claims, dispatch, waits, expiry),
//! `replies` (an agent's answer and how the order goes on), `compensation` (undoing, the end in
//! Error, replays), `answers` (callbacks answered from outside), `holds` (steps waiting for
//! their held service), `line` (orders waiting for their concurrency key, see
//! [`crate::keys`]) and `commands` (operators').

use std::collections::HashSet;
use std::time::Duration;

use crate::config::EngineConfig;
use crate::events::StatusKind;
use crate::ids::{Direction, OrderId};
use crate::message::{ElementOutcome, MAX_OUTPUT_LEN, StepOutcome, StepRef, output_len};
use crate::mutants::{self, Mutant};
use crate::payload::MAX_PAYLOAD_LEN;
use crate::state::{
    AlertDelivery, Cause, CommandEntry, CommandKind, Happening, InputRef, Lease, Parent, Phase,
    ProcessState, StateRecord, StepState, StepStatus, Stop, WaitingFor,
};
use crate::time::Timestamp;
use crate::workflow::{OnFailure, Wait, Work, Workflow};

mod answers;
mod commands;
mod compensation;
mod fanout;
mod holds;
mod leases;
mod line;
mod replies;

use answers::*;
use commands::*;
use compensation::*;
use fanout::*;
use holds::*;
use leases::*;
use line::*;
use replies::*;

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
    /// A start message (queue id `message`) at `attempt` of an order waiting in its key's
    /// line, handled after the line was looked at: `admitted` if the order holds one of the
    /// key's places ([`crate::keys`]).
    Admission { attempt: u64, owner: &'a str, message: &'a str, admitted: bool },
    /// An agent replied (queue id `message`) for a step at `attempt`.
    Reply { attempt: u64, step: &'a StepRef, outcome: &'a StepOutcome, message: &'a str },
    /// An agent answered (queue id `message`) calls of elements of a step over a list run
    /// inline, at `attempt`; `step` names the step, and which way the calls went.
    Elements { attempt: u64, step: &'a StepRef, outcomes: &'a [ElementOutcome], message: &'a str },
    /// The supervisor found the record in the expiry index with this CompleteBy; the record's
    /// messages may still be waiting in a queue for up to `horizon` after it.
    Expire { complete_by: Timestamp, horizon: Duration },
    /// The supervisor found the hold `on` names ([`crate::state::Held::key`]: a service, or
    /// one action of it) ended: the order's steps held on it go on, their start message sent
    /// after `delay`.
    Resume { on: &'a str, delay: Duration },
    /// The order's alert was accepted by the event bus.
    AlertSent,
    /// The ended order's place among its key's was given back ([`crate::keys`]).
    Released,
    /// The order was submitted again with the same key and the same content.
    Resubmit,
    /// An operator's command, with its id (the same id is applied once), who gave it and why;
    /// the steps it frees start `after` this long (zero, but for a bulk command, which spreads
    /// its orders over time as resumed orders are).
    Command { command: CommandKind, id: &'a str, by: &'a str, reason: &'a str, after: Duration },
    /// The parent of this child order undoes the step that started it: the child is undone
    /// if it was processed, cancelled if still in flight, and its end answers the parent's
    /// undo (`parent`, with the undo's lease) from now on.
    ParentUndo { parent: &'a Parent },
    /// The parent of this child order stops while the child is in flight: the child is
    /// cancelled, and its end still answers the parent's step.
    ParentStop { parent: &'a Parent },
    /// The list of step `step` (sent at `attempt`) was read: its length, or why it cannot be
    /// run.
    Counted { attempt: u64, step: usize, items: Result<u32, &'a str> },
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
    /// Bring the child order of step `step` in line with its lease: started, for a step; undone
    /// (or cancelled, if still in flight), for its undo.
    Child { step: usize },
    /// Cancel the child order of step `step` (for a step over a list, each child in flight),
    /// in flight while its parent stops.
    StopChild { step: usize },
    /// Read the list of step `step`, just sent, and decide its length ([`Input::Counted`]).
    Count { step: usize },
    /// Bring the children of these elements of step `step`'s list in line with its lease:
    /// started, for the step; undone (or cancelled, if still in flight), for its undo. An undo
    /// with no element answers at once: nothing of the list was started.
    Elements { step: usize, elements: Vec<u32> },
    /// Send the calls of these elements of step `step`'s pass, run inline, again after
    /// `delay`: their service had no room for them sooner, or their lease ran out.
    ElementsAgain { step: usize, elements: Vec<u32>, delay: Duration },
    /// Read the outputs of step `step`'s children, every element ended, and reply with their
    /// list as the step's output.
    Collect { step: usize },
    /// Tell the parent of this child order how it ended.
    TellParent,
    /// Delete the pages of the order's passes run inline: it ended, and has nothing left that
    /// an operator may have to undo.
    DropPages,
    /// Write the order's entry in its key's line (it waits there).
    Join,
    /// Give the order's place among its key's running orders back, take it out of the line,
    /// and admit the next in line.
    Release,
}

/// A state change to write, and what to do once it is written.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    pub next: StateRecord,
    pub effects: Vec<Effect>,
    /// The outputs of elements run inline that this write takes: written before it.
    pub pages: Vec<crate::ports::Page>,
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
    /// No step of the order waits for the service named.
    NotHeld,
    /// The order waits in its key's line: every place of its key is taken, or orders
    /// accepted before it wait too.
    InLine,
    /// The ended order's place was already recorded given back, or it held none.
    Released,
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
    #[error("the order is {state} with no failure reported: there is nothing to acknowledge", state = .state.as_str())]
    NothingReported { state: ProcessState },
    #[error("the order's reports were already acknowledged by {by}")]
    Acknowledged { by: String },
    #[error("the order is {state}: only a Processed order can be undone", state = .state.as_str())]
    NotProcessed { state: ProcessState },
    #[error(
        "the order waits in line for its key {key}: nothing of it runs yet (cancel it, or pause it once it starts)"
    )]
    InLine { key: String },
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
            Refused::NothingReported { .. } => "nothing_reported",
            Refused::Acknowledged { .. } => "already_acknowledged",
            Refused::NotProcessed { .. } => "not_processed",
            Refused::InLine { .. } => "in_line",
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
        Input::Claim { .. }
        | Input::Reply { .. }
        | Input::Elements { .. }
        | Input::Admission { .. } => Remedy::DeadLetter,
        Input::Expire { .. }
        | Input::Resume { .. }
        | Input::AlertSent
        | Input::Released
        | Input::Resubmit
        | Input::Command { .. }
        | Input::Answer { .. }
        | Input::ParentUndo { .. }
        | Input::ParentStop { .. }
        | Input::Counted { .. } => Remedy::Report,
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
    create_waking(order_id, correlation_id, &[], None, ctx)
}

/// [`create`], for an order whose steps that wait until a time of its input wake at `wakes`
/// (see [`Workflow::wakes`]), and which, with a concurrency key (see [`Workflow::key_of`]),
/// waits in that key's line before any step starts.
pub fn create_waking(
    order_id: OrderId,
    correlation_id: String,
    wakes: &[(String, Timestamp)],
    key: Option<String>,
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
        parent: None,
        group: None,
        slot: None,
        legacy_cursor: None,
        submitted: None,
        search_key: None,
        expires_at: None,
    };
    if let Some(key) = key {
        next.note(ctx.now, Happening::Received, None, ctx.config.timeline_limit);
        let mut effects = into_line(&mut next, key, ctx);
        effects.extend(status(ctx, StatusKind::Received, None));
        return Transition { next, effects, pages: Vec::new() };
    }
    let mut effects = started(ctx);
    for (i, step) in ctx.workflow.steps().iter().enumerate() {
        if !step.depends_on.is_empty() {
            continue;
        }
        match &step.work {
            Work::Wait(wait) => wait_for(&mut next, i, wait, ctx, &mut effects),
            Work::Agent(_) | Work::Callback | Work::Child(_) => {
                // At attempt 0, which the start message every new order gets claims.
                let complete_by = ctx.now.plus(ctx.config.claim_grace).plus(step.budget);
                let lease = Lease::queued(0, complete_by);
                next.steps[i].lease = Some(lease);
            }
        }
    }
    // A new order is first looked at when the scheduler should have claimed it, early enough
    // that its index entry can stay there while the steps that follow end within the lead.
    next.complete_by = next.index_key(Some(ctx.now.plus(ctx.config.claim_grace)));
    next.note(ctx.now, Happening::Received, None, ctx.config.timeline_limit);
    Transition { next, effects, pages: Vec::new() }
}

/// What a new order owes the world: its start message, and its first status event.
fn started(ctx: &Ctx<'_>) -> Vec<Effect> {
    let mut effects = vec![Effect::Kick { delay: Duration::ZERO, attempt: 0 }];
    effects.extend(status(ctx, StatusKind::Received, None));
    effects
}

/// Decides what `input` does to `record`. See the module documentation for the tables. What
/// it writes says when the store may forget the order ([`StateRecord::expiry`]): never
/// while anything is left to do with it.
pub fn decide(record: &StateRecord, input: Input<'_>, ctx: &Ctx<'_>) -> Decision {
    match decide_input(record, input, ctx) {
        Decision::Apply(mut t) => {
            t.next.expires_at = t.next.expiry(ctx.config.retention);
            Decision::Apply(t)
        }
        other => other,
    }
}

fn decide_input(record: &StateRecord, input: Input<'_>, ctx: &Ctx<'_>) -> Decision {
    // Everything below may rely on the invariants (leases on steps that can hold them, ...).
    if let Err(reason) = record.check() {
        return Decision::Illegal(Illegal::Corrupt { reason });
    }
    if let Input::Command { command, id, by, reason, after } = input {
        return operate(record, Command { kind: command, id, by, reason, after }, ctx);
    }
    if let Input::Answer { step, token, answer: given, by, reason } = input {
        return answer(record, Answered { step, token, answer: given, by, reason }, ctx);
    }
    if let Input::ParentUndo { parent } = input {
        return parent_undo(record, parent, ctx);
    }
    if let Input::ParentStop { parent } = input {
        return parent_stop(record, parent, ctx);
    }
    if let Input::Counted { attempt, step, items } = input {
        if !record.process_state.is_in_flight() {
            return Decision::Ignore(Ignored::Terminal);
        }
        return counted(record, attempt, step, items, ctx);
    }
    react(record, input, ctx)
}

/// What the system's own inputs do.
fn react(record: &StateRecord, input: Input<'_>, ctx: &Ctx<'_>) -> Decision {
    use ProcessState::{Cancelled, Error, Paused, Pending, Processed, Processing};
    match (record.process_state, input) {
        // The same queue message again: its transition is written, its effects may not be.
        (
            _,
            Input::Claim { message, .. }
            | Input::Reply { message, .. }
            | Input::Elements { message, .. }
            | Input::Admission { message, .. },
        ) if record.last_input.is_message(message) => Decision::Replay(replay(record, ctx)),

        // The client submitted again, perhaps because the first submission died between its
        // write and its start message: while nobody has claimed the order, start it again (a
        // duplicate start leads to one claim).
        (Pending, Input::Resubmit) if record.last_input == InputRef::Submit => {
            if record.waits_in_line() {
                let kick = Effect::Kick { delay: Duration::ZERO, attempt: record.attempt };
                return Decision::Replay(vec![Effect::Join, kick]);
            }
            Decision::Replay(started(ctx))
        }
        (_, Input::Resubmit) => Decision::Ignore(Ignored::Started),

        // Only a start message handled after a look at its key's line starts a waiting order.
        (Pending, Input::Claim { .. }) if record.waits_in_line() => {
            Decision::Ignore(Ignored::InLine)
        }
        (Pending, Input::Admission { attempt, owner, message, admitted })
            if record.waits_in_line() =>
        {
            admission(record, attempt, owner, message, admitted, ctx)
        }
        (Pending, Input::Expire { complete_by, .. }) if record.waits_in_line() => {
            look_again(record, complete_by, ctx)
        }
        (_, Input::Admission { attempt, .. }) => {
            Decision::Ignore(Ignored::Stale { received: attempt, current: record.attempt })
        }
        (Pending | Processing, Input::Claim { attempt, owner, message }) => {
            claim(record, attempt, owner, message, ctx)
        }
        (Paused, Input::Claim { .. }) => Decision::Ignore(Ignored::Paused),
        (Paused, Input::Reply { attempt, .. } | Input::Elements { attempt, .. }) => {
            Decision::Ignore(Ignored::Stale { received: attempt, current: record.attempt })
        }

        (Pending | Processing, Input::Reply { attempt, step, outcome, message }) => {
            reply(record, attempt, step, outcome, message, ctx)
        }
        (Pending | Processing, Input::Elements { attempt, step, outcomes, message }) => {
            elements_answered(record, attempt, step, outcomes, message, ctx)
        }

        (Pending | Processing, Input::Expire { complete_by, horizon }) => {
            expire(record, complete_by, horizon, ctx)
        }
        (Paused, Input::Expire { .. }) => Decision::Ignore(Ignored::Moved),
        (Pending | Processing, Input::Resume { on, delay }) => resume_held(record, on, delay, ctx),
        (Paused, Input::Resume { .. }) => Decision::Ignore(Ignored::Paused),
        (Error | Processed | Cancelled, Input::Expire { complete_by, .. })
            if record.release_pending() =>
        {
            release_again(record, complete_by, ctx)
        }
        (Error | Processed, Input::Expire { complete_by, .. })
            if record.alert == Some(AlertDelivery::Pending) =>
        {
            retry_alert(record, complete_by, ctx)
        }
        (_, Input::Released) => released(record, ctx),

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
            Input::Claim { .. }
            | Input::Reply { .. }
            | Input::Elements { .. }
            | Input::Expire { .. }
            | Input::Resume { .. },
        ) => Decision::Ignore(Ignored::Terminal),

        (
            _,
            Input::Command { .. }
            | Input::Answer { .. }
            | Input::ParentUndo { .. }
            | Input::ParentStop { .. }
            | Input::Counted { .. },
        ) => unreachable_command(record),
    }
}

/// Commands and answers are decided by [`operate`] and [`answer`]; this arm only keeps the
/// match exhaustive.
fn unreachable_command(record: &StateRecord) -> Decision {
    Decision::Illegal(Illegal::Corrupt {
        reason: format!("{}: a command reached the message path", record.order_id),
    })
}

/// Whether `record` ended with pages of passes run inline that nothing needs any more: none
/// of its steps is left for an operator to undo.
fn pages_done(record: &StateRecord) -> bool {
    record.is_terminal()
        && record.steps.iter().any(|s| s.fan.as_ref().is_some_and(|f| f.inline.is_some()))
        && record.needs_manual_undo().is_empty()
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

fn apply(mut next: StateRecord, mut effects: Vec<Effect>) -> Decision {
    // An order that ended in this write gives its key's place back, and stays in the expiry
    // index until that is recorded.
    if next.release_pending() && next.ended_at == Some(next.updated_at) {
        effects.push(Effect::Release);
        let look = next.updated_at.plus(crate::keys::RELEASE_CHECK);
        next.complete_by = Some(next.complete_by.map_or(look, |at| at.min(look)));
    }
    if next.ended_at == Some(next.updated_at) && pages_done(&next) {
        effects.push(Effect::DropPages);
    }
    // Whatever resumed, ended or took back a held lease ended the step's wait for its service.
    for s in next.steps.iter_mut().filter(|s| !s.lease.is_some_and(|l| l.held)) {
        s.held = None;
    }
    Decision::Apply(Box::new(Transition { next, effects, pages: Vec::new() }))
}

#[cfg(test)]
mod tests;
