//! The state record of one order: the pattern's fields, plus what multi-step work needs.
//!
//! `OrderId`, `LockedBy`, `CompleteBy`, `ProcessState` and `FailureCount` mean what the pattern
//! says. On top of them:
//!
//! - Each step being done or undone holds a [`Lease`]: its own attempt, CompleteBy and count of
//!   expired leases. Steps that do not depend on each other hold leases at the same time.
//! - `attempt` is the record's counter of fencing tokens. Every lease takes the next value
//!   (claim, next step, reset); every message carries its lease's, and a message naming an
//!   attempt that no lease holds any more can change nothing.
//! - `revision` grows with every write; each write expects the revision it read, so two
//!   writers that read the same record can never both succeed.
//! - `phase` and `steps` say whether the order is going forward or undoing, and how each step
//!   went.
//! - `complete_by` is set exactly while the record needs the supervisor's attention: while the
//!   order is in flight (Pending or Processing: at most [`INDEX_LEAD`] before the earliest of
//!   its leases ends, never after), and while an operator alert is not yet known to be
//!   published. It is what the sparse expiry index holds, so finished records leave it.
//! - `failure_count` counts the expired leases the supervisor judged since the order was
//!   (re)started, all steps together; each lease counts its own against its step's threshold.
//! - `last_input` names the message whose handling produced this revision, so a redelivery of
//!   that same message (its handler died after writing) can redo the lost side effects, while a
//!   second copy of it changes nothing.
//! - `stop` is an operator's cancel or pause that waits for the steps in flight to finish;
//!   `commands` lists the latest operator commands applied, by id, so that a command sent
//!   twice is applied once; `redrives` counts how often the order was run again after failing.
//! - Each step has a `generation`, part of its idempotency keys: a step done again after it was
//!   undone (or refused) by a redrive is a new action for its service, not a repeat.
//!
//! - `submitted` is the order itself as its client sent it (who, under which key, its input),
//!   kept in its record so that accepting an order is one write and running it reads nothing
//!   else; records written before it was kept there find their order in the orders table.
//! - `expires_at` is when the store may forget an order that ended and needs nobody: set by
//!   [`StateRecord::expiry`] on every write, for the retention the stack keeps orders.
//!
//! [`StateRecord::check`] states the invariants; every transition keeps them.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ids::{Direction, IdempotencyKey, OrderId, Owner};
use crate::order::Order;
use crate::time::Timestamp;

/// How long before its earliest lease ends the expiry index may hold an order in flight.
/// Moving an index entry costs two index writes, and the steps of an order mostly end later
/// than the one before; within this lead the entry stays where it is. A sweep that finds an
/// order early reads it and passes it by, which only orders still in flight then cost, once
/// a sweep; the index never holds an order later than its lease, so none is found late.
pub const INDEX_LEAD: Duration = Duration::from_secs(60);

fn index_key(kept: Option<Timestamp>, earliest: Timestamp) -> Timestamp {
    match kept {
        Some(k) if k <= earliest && earliest <= k.plus(INDEX_LEAD) => k,
        _ => earliest,
    }
}

/// The pattern's process states.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ProcessState {
    /// Waiting for the scheduler to claim it (new, reset by the supervisor, or undo queued).
    Pending,
    /// Claimed: at least one step (or undo) has been dispatched and holds a lease until its
    /// CompleteBy.
    Processing,
    /// Every step completed. Terminal.
    Processed,
    /// The order failed; the alert says whether its effects were undone. Terminal until an
    /// operator redrives it.
    Error,
    /// An operator stopped it, at a point where no step was in flight: it resumes when told.
    Paused,
    /// An operator cancelled it and every completed step was undone. Terminal.
    Cancelled,
}

impl ProcessState {
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessState::Pending => "Pending",
            ProcessState::Processing => "Processing",
            ProcessState::Processed => "Processed",
            ProcessState::Error => "Error",
            ProcessState::Paused => "Paused",
            ProcessState::Cancelled => "Cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        ProcessState::ALL.into_iter().find(|p| p.as_str() == s)
    }

    pub const ALL: [ProcessState; 6] = [
        ProcessState::Pending,
        ProcessState::Processing,
        ProcessState::Processed,
        ProcessState::Error,
        ProcessState::Paused,
        ProcessState::Cancelled,
    ];

    /// Finished: nothing moves it but an operator's redrive (of an order in Error).
    pub fn is_terminal(self) -> bool {
        matches!(self, ProcessState::Processed | ProcessState::Error | ProcessState::Cancelled)
    }

    /// Pending or Processing: the supervisor watches it through its CompleteBy.
    pub fn is_in_flight(self) -> bool {
        matches!(self, ProcessState::Pending | ProcessState::Processing)
    }
}

/// Whether the order is moving forward through its steps or undoing them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Forward,
    Compensating,
}

impl Phase {
    pub fn direction(self) -> Direction {
        match self {
            Phase::Forward => Direction::Do,
            Phase::Compensating => Direction::Undo,
        }
    }
}

/// How one step stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    /// Not completed yet (in progress while it holds a lease).
    NotStarted,
    /// Completed; its output is recorded.
    Done,
    /// The agent reported a permanent fault; the remote effect did not happen.
    Failed,
    /// Its leases kept expiring; the remote effect may or may not have happened.
    Uncertain,
    /// Queued to be undone (being undone while it holds a lease).
    ToUndo,
    /// Undone.
    Undone,
    /// Undoing it failed; an operator must look.
    UndoFailed,
}

impl StepStatus {
    /// The name the API shows.
    pub fn as_str(self) -> &'static str {
        match self {
            StepStatus::NotStarted => "not_started",
            StepStatus::Done => "done",
            StepStatus::Failed => "failed",
            StepStatus::Uncertain => "uncertain",
            StepStatus::ToUndo => "to_undo",
            StepStatus::Undone => "undone",
            StepStatus::UndoFailed => "undo_failed",
        }
    }
}

/// One step's progress.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepState {
    pub name: String,
    pub status: StepStatus,
    /// What the agent returned when the step completed; passed to its compensation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<serde_json::Value>,
    /// Why it failed, for failed steps and failed undos.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Which run of the step its idempotency keys are for: 0 at first, one more each time a
    /// redrive does it again after it was undone or refused.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: u32,
    /// A request for the step may have reached its service under its current keys: it was
    /// leased at least once since its generation began.
    #[serde(default, skip_serializing_if = "is_false")]
    pub dispatched: bool,
    /// Why it failed, for a step whose failures are only reported: the order went on without
    /// it, and the operators were told. Its status still says what became of its effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported: Option<Cause>,
    /// Held while the step (or its undo) is queued for the scheduler or in flight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<Lease>,
    /// For a step that waits: when it wakes, once known (at submission for a time of the
    /// input, when it starts for a duration). Kept through a pause or a redrive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake_at: Option<Timestamp>,
    /// For a step that waits for a callback: the token its last announcement carried. Only an
    /// answer bearing it counts, and only while the step waits; it is kept once the wait is
    /// over, so that an answer repeated or come too late is told from a forged one. Never
    /// shown to the order's readers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// For a step that waits for a callback: when its answer is due, as its announcement or
    /// the last heartbeat set it. Kept once the wait is over, so that the reply to an answer,
    /// even repeated, names the time it met.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_by: Option<Timestamp>,
    /// For a step (or undo) that waits for its held service: which service, since when, and
    /// why it is held. Set exactly while its lease is held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<Held>,
    /// For a step that starts a child order: the child's id, once it was sent to start it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child: Option<OrderId>,
    /// For a step that starts a child (or a child per element of a list): when its children
    /// must have ended, its timeout from when it was sent. Its lease ends sooner, so that the
    /// supervisor looks at its children now and then until this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ends_by: Option<Timestamp>,
    /// For a step over a list: how far its children went, as counts (element `k`'s child is
    /// [`OrderId::for_element`]), so that a list of thousands never reaches the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fan: Option<FanState>,
}

/// How far a step over a list went in its current run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FanState {
    /// How many elements the list has, once read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<u32>,
    /// Its children: started over the list's elements in order.
    pub forward: Window,
    /// Their undo, over the children started, in order; empty until the step is undone.
    #[serde(default, skip_serializing_if = "Window::is_empty")]
    pub back: Window,
    /// For a pass run inline ([`crate::workflow::Inline`]): the version of the child workflow
    /// whose step it runs, taken when the list was read. `None`: its elements are child
    /// orders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inline: Option<u32>,
    /// Inline: the elements started that leave nothing to undo (refused by their service, or
    /// undone already).
    #[serde(default, skip_serializing_if = "ElementSet::is_empty")]
    pub settled: ElementSet,
    /// Inline: the elements that ended failed with their effect perhaps in place (an output
    /// too large to keep, or no answer past the lease limit): each is undone at once, as its
    /// child order would have undone itself.
    #[serde(default, skip_serializing_if = "ElementSet::is_empty")]
    pub dirty: ElementSet,
    /// Inline, forward: the dirty elements whose undo is in flight.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cleaning: Vec<u32>,
    /// Inline: how many leases of the step ran out while each element in flight was.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub strikes: BTreeMap<u32, u32>,
}

/// A set of a list's elements, kept as runs of consecutive ones (`"0-3,7"`): a few bytes
/// whether few of the list are in it or most.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ElementSet(Vec<(u32, u32)>);

impl ElementSet {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn contains(&self, k: u32) -> bool {
        self.0.iter().any(|&(a, b)| a <= k && k <= b)
    }

    /// How many elements it holds.
    pub fn len(&self) -> u32 {
        self.0.iter().map(|&(a, b)| b - a + 1).sum()
    }

    pub fn insert(&mut self, k: u32) {
        if self.contains(k) {
            return;
        }
        let at = self.0.partition_point(|&(_, b)| b < k);
        self.0.insert(at, (k, k));
        // Join the run with its neighbours where they touch.
        if at + 1 < self.0.len() && self.0[at + 1].0 == k + 1 {
            self.0[at].1 = self.0[at + 1].1;
            self.0.remove(at + 1);
        }
        if at > 0 && self.0[at - 1].1 + 1 == k {
            self.0[at - 1].1 = self.0[at].1;
            self.0.remove(at);
        }
    }

    pub fn remove(&mut self, k: u32) {
        let Some(at) = self.0.iter().position(|&(a, b)| a <= k && k <= b) else { return };
        let (a, b) = self.0[at];
        match (a == k, b == k) {
            (true, true) => {
                self.0.remove(at);
            }
            (true, false) => self.0[at].0 = k + 1,
            (false, true) => self.0[at].1 = k - 1,
            (false, false) => {
                self.0[at].1 = k - 1;
                self.0.insert(at + 1, (k + 1, b));
            }
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().flat_map(|&(a, b)| a..=b)
    }
}

impl Serialize for ElementSet {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let runs: Vec<String> = self
            .0
            .iter()
            .map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") })
            .collect();
        serializer.serialize_str(&runs.join(","))
    }
}

impl<'de> Deserialize<'de> for ElementSet {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        let mut set = ElementSet::default();
        for run in text.split(',').filter(|r| !r.is_empty()) {
            let bad = |_| serde::de::Error::custom(format!("not a run of elements: {run:?}"));
            let (a, b) = match run.split_once('-') {
                Some((a, b)) => (a.parse().map_err(bad)?, b.parse().map_err(bad)?),
                None => {
                    let k = run.parse().map_err(bad)?;
                    (k, k)
                }
            };
            let after_last = set.0.last().is_none_or(|&(_, last)| last.saturating_add(1) < a);
            if a > b || !after_last {
                return Err(serde::de::Error::custom(format!("a run out of order: {run:?}")));
            }
            set.0.push((a, b));
        }
        Ok(set)
    }
}

/// A pass over elements `0..` in order, a few at a time.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    /// The elements before this one were started.
    pub next: u32,
    /// Started and not ended, in the order they were started.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub running: Vec<u32>,
    /// Ended well: processed, or undone.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ok: u32,
    /// Ended otherwise: failed, or their undo failed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failed: u32,
}

impl Window {
    pub fn is_empty(&self) -> bool {
        *self == Window::default()
    }
}

/// A step kept back by a hold of its service, or of its action there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// The agent of the service that is held.
    pub service: String,
    /// The action held, if the hold is the action's alone; `None`: the whole service is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// When the step first found the service held.
    pub since: Timestamp,
    /// Why it is held, as its agent said.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

impl Held {
    /// The name the order is listed under while it waits ([`crate::health::hold_key`]).
    pub fn key(&self) -> String {
        crate::health::hold_key(&self.service, self.action.as_deref())
    }
}

/// One step's hold on the system's attention while it is done or undone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The fencing token: only a claim or a reply naming it counts for this step.
    pub attempt: u64,
    /// When the supervisor may judge it expired.
    pub complete_by: Timestamp,
    /// Dispatched to its agent; otherwise waiting for the scheduler to claim it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub sent: bool,
    /// Expired leases of this action so far, against its threshold.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failures: u32,
    /// A step that waits: its CompleteBy is the time it wakes, and nothing is sent for it but,
    /// for a short wait, a start message delayed to that time.
    #[serde(default, skip_serializing_if = "is_false")]
    pub timer: bool,
    /// A step whose service is held: nothing is sent and no start message waits for it; its
    /// CompleteBy is the end of its `max_hold`. The supervisor queues it again once the
    /// service is open ([`crate::machine::Input::Resume`]).
    #[serde(default, skip_serializing_if = "is_false")]
    pub held: bool,
    /// When the step first found its service held, carried from lease to lease while the step
    /// (or undo) goes on after its service opened: held again, it counts its `max_hold` from
    /// then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_since: Option<Timestamp>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Lease {
    /// A lease waiting for the scheduler to claim it at `attempt`, due by `complete_by`.
    pub fn queued(attempt: u64, complete_by: Timestamp) -> Lease {
        Lease {
            attempt,
            complete_by,
            sent: false,
            failures: 0,
            timer: false,
            held: false,
            held_since: None,
        }
    }
}

impl StepState {
    /// Whether the order may go on past this step: it is done, or its failure is only
    /// reported.
    pub fn passed(&self) -> bool {
        self.status == StepStatus::Done || self.reported.is_some()
    }

    /// The action a lease on this step is for: its undo once it is queued for undo.
    pub fn direction(&self) -> Direction {
        if self.status == StepStatus::ToUndo { Direction::Undo } else { Direction::Do }
    }

    /// The lease, if it was dispatched.
    pub fn sent(&self) -> Option<&Lease> {
        self.lease.as_ref().filter(|l| l.sent)
    }

    pub(crate) fn new(name: &str) -> StepState {
        StepState {
            name: name.to_owned(),
            status: StepStatus::NotStarted,
            output: None,
            detail: None,
            generation: 0,
            dispatched: false,
            reported: None,
            lease: None,
            wake_at: None,
            token: None,
            answer_by: None,
            held: None,
            child: None,
            ends_by: None,
            fan: None,
        }
    }

    /// What the step waits for, and until when, if it waits: its time, or an answer from
    /// outside (a callback's lease, once announced).
    pub fn waiting(&self) -> Option<(WaitingFor, Timestamp)> {
        let lease = self.lease.as_ref()?;
        if lease.timer {
            Some((WaitingFor::Time, lease.complete_by))
        } else if lease.held {
            Some((WaitingFor::Service, lease.complete_by))
        } else if lease.sent && self.token.is_some() {
            Some((WaitingFor::Answer, lease.complete_by))
        } else {
            None
        }
    }
}

/// What a waiting step waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitingFor {
    /// The time it wakes at.
    Time,
    /// An answer from outside, bearing the token its announcement carried (or an operator's).
    Answer,
    /// Its service, which is held: until the service is open again, or its `max_hold` ends.
    Service,
}

/// Why an order failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Cause {
    /// An agent reported a permanent fault for this step.
    StepRejected { step: String, reason: String },
    /// This step's lease expired `failures` times (the failure threshold).
    StepTimedOut { step: String, failures: u32 },
    /// The record names a step the loaded workflow does not have (the workflow was changed
    /// incompatibly while the order was in flight).
    UnknownStep { step: String },
    /// The step took effect, but what its service answered is larger than a step's output
    /// may be, so it could not be kept.
    OutputTooLarge { step: String, bytes: u64, limit: u64 },
    /// An operator cancelled the order.
    Cancelled { by: String, reason: String },
    /// The step's service was held for longer than the step may wait for it (`max_hold`).
    ServiceHeldTooLong { step: String, service: String, held_s: u64 },
    /// Its concurrency key had every place taken (or orders waiting), and its workflow skips
    /// an order then (`on_conflict: skip`): it never ran.
    KeyBusy { key: String },
    /// It waited in its concurrency key's line for longer than its workflow's `max_wait`.
    KeyWaitedTooLong { key: String, waited_s: u64 },
}

/// The cause as a sentence, for people: `charge-payment was refused: card declined`.
impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cause::StepRejected { step, reason } => write!(f, "{step} was refused: {reason}"),
            Cause::StepTimedOut { step, failures: 1 } => {
                write!(f, "{step} did not finish in time: its lease expired once")
            }
            Cause::StepTimedOut { step, failures } => {
                write!(f, "{step} did not finish in time: its lease expired {failures} times")
            }
            Cause::UnknownStep { step } => write!(f, "the workflow no longer has step {step}"),
            Cause::OutputTooLarge { step, bytes, limit } => {
                write!(f, "{step} answered {bytes} bytes, more than the {limit} a step may return")
            }
            Cause::Cancelled { by, reason } => write!(f, "cancelled by {by}: {reason}"),
            Cause::ServiceHeldTooLong { step, service, held_s } => {
                write!(f, "{step} waited {} for {service}, which stayed held", Span(*held_s))
            }
            Cause::KeyBusy { key } => {
                write!(f, "skipped: {key} was busy, and the workflow skips an order then")
            }
            Cause::KeyWaitedTooLong { key, waited_s } => {
                write!(f, "waited {} in line for {key}, longer than its max_wait", Span(*waited_s))
            }
        }
    }
}

impl Cause {
    /// The step that failed; none for a cancelled order.
    pub fn step(&self) -> Option<&str> {
        match self {
            Cause::StepRejected { step, .. }
            | Cause::StepTimedOut { step, .. }
            | Cause::OutputTooLarge { step, .. }
            | Cause::ServiceHeldTooLong { step, .. }
            | Cause::UnknownStep { step } => Some(step),
            Cause::Cancelled { .. } | Cause::KeyBusy { .. } | Cause::KeyWaitedTooLong { .. } => {
                None
            }
        }
    }

    /// The cause without the text that came from outside (a service's refusal, an operator's
    /// reason), which may name the customer: alerts leave the system, and carry only this.
    pub fn without_text(&self) -> Cause {
        const SEE_ORDER: &str = "not carried in alerts: see the order (sas show)";
        match self {
            Cause::StepRejected { step, .. } => {
                Cause::StepRejected { step: step.clone(), reason: SEE_ORDER.into() }
            }
            Cause::Cancelled { by, .. } => {
                Cause::Cancelled { by: by.clone(), reason: SEE_ORDER.into() }
            }
            other => other.clone(),
        }
    }

    /// A short name for filters and tables: `step_rejected`, `step_timed_out`, ...
    pub fn kind(&self) -> &'static str {
        match self {
            Cause::StepRejected { .. } => "step_rejected",
            Cause::StepTimedOut { .. } => "step_timed_out",
            Cause::OutputTooLarge { .. } => "output_too_large",
            Cause::UnknownStep { .. } => "unknown_step",
            Cause::Cancelled { .. } => "cancelled",
            Cause::ServiceHeldTooLong { .. } => "service_held_too_long",
            Cause::KeyBusy { .. } => "key_busy",
            Cause::KeyWaitedTooLong { .. } => "key_waited_too_long",
        }
    }
}

/// A length of time in seconds, as people read it: `40 s`, `12 min`, `6 h 30 min`.
struct Span(u64);

impl std::fmt::Display for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (h, min, s) = (self.0 / 3600, self.0 % 3600 / 60, self.0 % 60);
        match (h, min) {
            (0, 0) => write!(f, "{s} s"),
            (0, _) => write!(f, "{min} min"),
            (_, 0) => write!(f, "{h} h"),
            _ => write!(f, "{h} h {min} min"),
        }
    }
}

/// An operator command, as the machine takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommandKind {
    /// Stop the order at its next safe point and undo what it did.
    Cancel,
    /// Run an order in Error again from the step that failed.
    Redrive,
    /// Run the failed undos of an order in Error again.
    RedriveCompensation,
    /// Stop the order once its step in flight is finished.
    Pause,
    /// Let a paused order go on.
    Resume,
    /// Take note of a processed order's reported failures: it leaves the operators' list.
    Acknowledge,
    /// Undo a processed order: every completed step undone, last first, by its compensation.
    Undo,
}

impl CommandKind {
    pub const ALL: [CommandKind; 7] = [
        CommandKind::Cancel,
        CommandKind::Redrive,
        CommandKind::RedriveCompensation,
        CommandKind::Pause,
        CommandKind::Resume,
        CommandKind::Acknowledge,
        CommandKind::Undo,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CommandKind::Cancel => "cancel",
            CommandKind::Redrive => "redrive",
            CommandKind::RedriveCompensation => "redrive_compensation",
            CommandKind::Pause => "pause",
            CommandKind::Resume => "resume",
            CommandKind::Acknowledge => "acknowledge",
            CommandKind::Undo => "undo",
        }
    }

    pub fn parse(s: &str) -> Option<CommandKind> {
        CommandKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// An operator command that was applied: kept on the record so the same command id is
/// applied once, and shown with the timeline.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandEntry {
    pub id: String,
    pub command: CommandKind,
    /// The caller's identity (an IAM principal's ARN behind the admin API).
    pub by: String,
    pub reason: String,
    pub at: Timestamp,
}

/// The operators' lists an order can be on ([`StateRecord::attention`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionList {
    /// In Error.
    Failed,
    /// Processed with a step's failure only reported, until an operator acknowledges it.
    Reported,
    /// Paused by an operator.
    Paused,
    /// In flight, with a step waiting for an answer from outside.
    AwaitingAnswer,
}

impl AttentionList {
    /// The name an index keeps the list under: the process state, for the lists that only
    /// one state makes.
    pub fn as_str(self) -> &'static str {
        match self {
            AttentionList::Failed => "Error",
            AttentionList::Reported => "Processed",
            AttentionList::Paused => "Paused",
            AttentionList::AwaitingAnswer => "AwaitingAnswer",
        }
    }
}

/// Why an order is on an operator's list. See [`StateRecord::attention`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attention {
    pub list: AttentionList,
    pub since: Timestamp,
    pub step: Option<String>,
    pub cause: Option<&'static str>,
}

/// A cancel or pause that waits for the step in flight to finish.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stop {
    pub command: CommandKind,
    pub by: String,
    pub reason: String,
}

/// The parent of a child order: which order and step, and the lease of that step its end
/// answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Parent {
    pub order_id: OrderId,
    pub step: crate::message::StepRef,
    /// The attempt of the parent step's lease: the end of the child counts for it alone.
    pub attempt: u64,
    pub correlation_id: String,
}

/// Delivery of the one operator alert an `Error` record gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertDelivery {
    /// Not yet known to be published: the record stays in the expiry index until it is.
    Pending,
    /// Published.
    Sent,
}

/// What produced the current revision, for recognising the redelivery of the same message.
///
/// A queue message is named by the id the queue gave it, which stays the same when it is
/// delivered again after its consumer failed. A second copy of a message (an agent that sent
/// its reply twice) has another id: it is a duplicate to ignore, not a redelivery to finish.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputRef {
    Submit,
    /// The queue message with this id (a start message claimed, or a reply recorded).
    Message(String),
    /// The queue messages with these ids, of one order and one batch, recorded in one write.
    Messages(Vec<String>),
    /// The supervisor acted on an expired lease.
    Expire,
    /// The operator command with this id.
    Command(String),
    /// The answer to the callback of the step of this name.
    Answer(String),
    /// The supervisor resumed steps whose service was open again.
    Resume,
}

impl InputRef {
    pub fn is_message(&self, id: &str) -> bool {
        match self {
            InputRef::Message(m) => m == id,
            InputRef::Messages(all) => all.iter().any(|m| m == id),
            _ => false,
        }
    }

    /// This input and the message `id`, recorded by one write: the messages it names, then
    /// `id`.
    pub fn and_message(&self, id: &str) -> InputRef {
        let mut all = match self {
            InputRef::Message(m) => vec![m.clone()],
            InputRef::Messages(all) => all.clone(),
            _ => Vec::new(),
        };
        all.push(id.to_owned());
        InputRef::Messages(all)
    }
}

/// What happened to an order, when: the timeline the status API shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Happening {
    Received,
    Claimed,
    StepDone,
    StepFailed,
    /// A step failed, and its workflow only reports such a failure: the order went on.
    StepReported,
    LeaseExpired,
    RetryScheduled,
    CompensationStarted,
    StepUndone,
    UndoFailed,
    Processed,
    Compensated,
    Failed,
    AlertSent,
    CancelRequested,
    Cancelled,
    /// An operator asked for a processed order to be undone.
    UndoRequested,
    PauseRequested,
    Paused,
    Resumed,
    Redriven,
    /// A step began to wait: for its time, or for an answer from outside.
    Waiting,
    /// An operator took note of the failures a processed order reported.
    Acknowledged,
    /// The service a step waited for was open again: the step goes on.
    HoldEnded,
    /// The order joined its concurrency key's line.
    InLine,
    /// The order took one of its key's places: it runs.
    Admitted,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineEntry {
    pub at: Timestamp,
    pub what: Happening,
    pub attempt: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// For an operator's command: who gave it, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// For a step that began to wait: until when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Timestamp>,
}

fn first_version() -> u32 {
    1
}

/// The state record. See the module documentation for the meaning of each field.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateRecord {
    pub order_id: OrderId,
    pub workflow: String,
    /// The version of the workflow the order started on, which it keeps to its end (records
    /// written before versions existed ran version 1).
    #[serde(default = "first_version")]
    pub workflow_version: u32,
    pub process_state: ProcessState,
    pub locked_by: Option<String>,
    pub complete_by: Option<Timestamp>,
    /// Expired leases judged since the order was (re)started, all steps together.
    pub failure_count: u32,
    pub attempt: u64,
    pub revision: u64,
    pub phase: Phase,
    pub steps: Vec<StepState>,
    pub cause: Option<Cause>,
    pub alert: Option<AlertDelivery>,
    pub last_input: InputRef,
    pub correlation_id: String,
    /// Expiry-index shard, fixed at creation.
    pub shard: u16,
    pub created_at: Timestamp,
    /// When the order last came back into the system's hands after it was out of them for a
    /// while: a wait over, an answer from outside, a resume, a redrive. Until then, its age
    /// as one held up counts from `created_at` (see [`StateRecord::watched_since`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_since: Option<Timestamp>,
    pub updated_at: Timestamp,
    /// When the order last reached a terminal state; a redrive clears it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<Timestamp>,
    pub timeline: Vec<TimelineEntry>,
    /// An operator's cancel or pause waiting for the steps in flight (only while Processing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
    /// The latest operator commands applied, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<CommandEntry>,
    /// How many times an operator redrove the order (either way).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub redrives: u32,
    /// For a child order: the step of its parent that started it, and the lease of that step
    /// its end answers (a start, or an undo). Set when it is created; the lease changes when
    /// its parent undoes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<Parent>,
    /// The group its messages carry ([`crate::fair`]): its tenant, marked for a priority
    /// order. A child order has its parent's. `None` without fair queues, and on records
    /// written before them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// For an order of a workflow with a concurrency key: its key, its place in the key's line,
    /// and whether it holds one of the key's places ([`crate::keys`]). Kept once it ended, so
    /// that its place is given back and a redrive waits in line again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<crate::keys::Slot>,
    /// The one step in flight of a record written before each step held its own lease: read
    /// so that [`StateRecord::upgrade`] can give that step its lease, never written.
    #[serde(default, rename = "cursor", skip_serializing)]
    pub legacy_cursor: Option<usize>,
    /// The order as submitted. `None` on records written before orders were kept in their
    /// records: theirs is in the orders table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted: Option<Submitted>,
    /// The value operators find the order by: its input's at its workflow's `search_key`
    /// ([`crate::workflow::Workflow::search_value`]), kept from its creation on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search_key: Option<String>,
    /// When the store may delete the record: set once it ended and needs nobody
    /// ([`StateRecord::expiry`]); `None` while it may still change, or with no retention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Timestamp>,
}

/// An order as its client submitted it: who, under which idempotency key, and its input
/// (checked against its workflow's schema; a large one stored and referred to).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Submitted {
    pub owner: Owner,
    pub key: IdempotencyKey,
    pub input: Order,
}

impl StateRecord {
    /// Since when the system has been working on the order without a break: what the
    /// oldest-order age and the listing of orders in flight for long count from. A wait for a
    /// time or an answer, a pause or an Error is no part of it: while every lease the order
    /// holds waits for a time or for an answer from outside, this is the earliest end of
    /// them, a time to come.
    pub fn watched_since(&self) -> Timestamp {
        // A step that waits for an answer is the only one with a token.
        let waiting = |(_, s, l): (usize, &StepState, &Lease)| l.timer || s.token.is_some();
        match self.earliest_lease() {
            Some(end) if self.leased().all(waiting) => end,
            _ => self.taken_up(),
        }
    }

    /// When the system last took the order up: accepted, or back from a wait, an answer, a
    /// pause or an Error. Unlike [`StateRecord::watched_since`], never a time to come.
    pub fn taken_up(&self) -> Timestamp {
        self.active_since.unwrap_or(self.created_at)
    }

    pub fn is_terminal(&self) -> bool {
        self.process_state.is_terminal()
    }

    /// The first step being done or undone (or to be, once resumed), while the order is in
    /// flight or paused.
    pub fn current_step(&self) -> Option<&StepState> {
        match self.process_state {
            ProcessState::Pending | ProcessState::Processing => {
                self.steps.iter().find(|s| s.lease.is_some())
            }
            ProcessState::Paused => self.steps.iter().find(|s| match self.phase {
                Phase::Forward => !s.passed(),
                Phase::Compensating => s.status == StepStatus::ToUndo,
            }),
            ProcessState::Processed | ProcessState::Error | ProcessState::Cancelled => None,
        }
    }

    /// The steps holding a lease, with their place in the record.
    pub fn leased(&self) -> impl Iterator<Item = (usize, &StepState, &Lease)> {
        self.steps.iter().enumerate().filter_map(|(i, s)| Some((i, s, s.lease.as_ref()?)))
    }

    /// The earliest CompleteBy of the leases.
    pub fn earliest_lease(&self) -> Option<Timestamp> {
        self.leased().map(|(_, _, l)| l.complete_by).min()
    }

    /// The `complete_by` of an order in flight whose index entry is at `kept`: `kept` while
    /// the earliest lease ends no earlier and at most [`INDEX_LEAD`] later, which leaves the
    /// entry where it is; the earliest lease's end otherwise.
    pub fn index_key(&self, kept: Option<Timestamp>) -> Option<Timestamp> {
        Some(index_key(kept, self.earliest_lease()?))
    }

    /// The order as submitted, if the record keeps it (see [`StateRecord::submitted`]).
    pub fn order(&self) -> Option<crate::ports::OrderRecord> {
        let submitted = self.submitted.as_ref()?;
        Some(crate::ports::OrderRecord {
            order_id: self.order_id,
            owner: submitted.owner.clone(),
            idempotency_key: submitted.key.clone(),
            order: submitted.input.clone(),
            created_at: self.created_at,
        })
    }

    /// When the store may forget this record, if it is kept `retention` after it ends: the
    /// end plus the retention, rounded up to a second (the store counts in seconds), once the
    /// order ended and nothing is left to do or to tell about it. An order in Error, paused,
    /// with a failure reported and not acknowledged, an alert or a key's place not yet
    /// recorded, is kept until that changes; a child order is kept as long as its parent may
    /// undo it, which its own record cannot tell, so always.
    pub fn expiry(&self, retention: Option<Duration>) -> Option<Timestamp> {
        let retention = retention?;
        let ended = self.ended_at?;
        let done = matches!(self.process_state, ProcessState::Processed | ProcessState::Cancelled);
        if !done
            || self.parent.is_some()
            || self.complete_by.is_some()
            || self.attention().is_some()
        {
            return None;
        }
        let at = ended.plus(retention).as_millis();
        Some(Timestamp::from_millis(at.saturating_add(999) / 1000 * 1000))
    }

    /// Whether the order ended and its place among its key's is not yet recorded given back.
    pub fn release_pending(&self) -> bool {
        self.process_state.is_terminal() && self.slot.as_ref().is_some_and(|s| !s.released)
    }

    /// Whether the order waits in its concurrency key's line: Pending, not yet admitted.
    pub fn waits_in_line(&self) -> bool {
        self.process_state == ProcessState::Pending
            && self.slot.as_ref().is_some_and(|s| !s.admitted)
    }

    /// The hold the order waits for, if a step of it is held: of its held steps, the one held
    /// first. The store lists the order under its [`Held::key`] (one hold at a time: should
    /// two of its steps wait for two holds, the write that resumes the first lists it under
    /// the other).
    pub fn held_on(&self) -> Option<&Held> {
        // A step's hold is set exactly while its lease is held (see `check`).
        self.steps
            .iter()
            .filter_map(|s| s.held.as_ref())
            .min_by_key(|h| (h.since, h.service.as_str(), h.action.as_deref()))
    }

    /// A record written before each step held its own lease, as this version keeps it: the
    /// step that was in flight (or waiting for the scheduler) holds the lease the record
    /// held, so that the messages already sent for it still count. Adapters call it on what
    /// they read, before [`StateRecord::check`].
    pub fn upgrade(&mut self) {
        let Some(cursor) = self.legacy_cursor.take() else { return };
        if !self.process_state.is_in_flight() || self.steps.iter().any(|s| s.lease.is_some()) {
            return;
        }
        let (Some(complete_by), Some(step)) = (self.complete_by, self.steps.get_mut(cursor)) else {
            return;
        };
        step.lease = Some(Lease {
            attempt: self.attempt,
            complete_by,
            sent: self.process_state == ProcessState::Processing,
            failures: self.failure_count,
            timer: false,
            held: false,
            held_since: None,
        });
    }

    /// Whether the order is on an operator's list, and why: in Error (since it ended, with
    /// the step that failed and the kind of cause), or paused (since it was paused, at its
    /// current step). Orders in flight are found through the expiry index instead.
    pub fn attention(&self) -> Option<Attention> {
        match self.process_state {
            ProcessState::Error => Some(Attention {
                list: AttentionList::Failed,
                since: self.ended_at.unwrap_or(self.updated_at),
                step: self.cause.as_ref().and_then(Cause::step).map(str::to_owned),
                cause: self.cause.as_ref().map(Cause::kind),
            }),
            // Processed, but a step's failure was only reported: listed until acknowledged.
            ProcessState::Processed => self.unacknowledged_report().map(|reported| Attention {
                list: AttentionList::Reported,
                since: self.ended_at.unwrap_or(self.updated_at),
                step: Some(reported.name.clone()),
                cause: reported.reported.as_ref().map(Cause::kind),
            }),
            ProcessState::Paused => Some(Attention {
                list: AttentionList::Paused,
                since: self
                    .timeline
                    .iter()
                    .rev()
                    .find(|e| e.what == Happening::Paused)
                    .map_or(self.updated_at, |e| e.at),
                step: self.current_step().map(|s| s.name.clone()),
                cause: None,
            }),
            ProcessState::Pending | ProcessState::Processing => self.awaiting_answer(),
            ProcessState::Cancelled => None,
        }
    }

    /// Of the steps waiting for an answer from outside, the one waiting longest: since when it
    /// waits (as its timeline says; if the entry was cut from it, since the record changed).
    fn awaiting_answer(&self) -> Option<Attention> {
        self.steps
            .iter()
            .filter(|s| matches!(s.waiting(), Some((WaitingFor::Answer, _))))
            .map(|s| {
                let since = self
                    .timeline
                    .iter()
                    .rev()
                    .find(|e| e.what == Happening::Waiting && e.step.as_ref() == Some(&s.name))
                    .map_or(self.updated_at, |e| e.at);
                Attention {
                    list: AttentionList::AwaitingAnswer,
                    since,
                    step: Some(s.name.clone()),
                    cause: None,
                }
            })
            .min_by_key(|a| a.since)
    }

    /// The first step whose failure was only reported, while no operator has acknowledged
    /// the order's reports.
    pub fn unacknowledged_report(&self) -> Option<&StepState> {
        let acknowledged = self.commands.iter().any(|c| c.command == CommandKind::Acknowledge);
        self.steps.iter().find(|s| s.reported.is_some()).filter(|_| !acknowledged)
    }

    /// A step failed while others were in flight: nothing new starts, and once those end, the
    /// steps done are undone. The order is still Pending or Processing, moving forward.
    pub fn stopping(&self) -> bool {
        self.process_state.is_in_flight() && self.phase == Phase::Forward && self.cause.is_some()
    }

    /// Steps whose effects may still be in place after a failure and that nothing will undo.
    pub fn needs_manual_undo(&self) -> Vec<String> {
        // Once an order has a cause to stop (a failure, a cancel), a step still done is one
        // that has no undo: its effect stays in place. An uncertain step whose failure was
        // only reported was meant to stay, unless the order stopped after all.
        let stopped = self.cause.is_some();
        self.steps
            .iter()
            .filter(|s| match s.status {
                StepStatus::UndoFailed | StepStatus::ToUndo => true,
                StepStatus::Uncertain => stopped || s.reported.is_none(),
                // A wait that is over leaves nothing in place.
                StepStatus::Done => stopped && s.wake_at.is_none(),
                _ => false,
            })
            .map(|s| s.name.clone())
            .collect()
    }

    /// Appends to the timeline, keeping the first entry (when the order was received) and the
    /// most recent ones, so the record stays small however long an order struggles.
    pub(crate) fn note(
        &mut self,
        at: Timestamp,
        what: Happening,
        step: Option<String>,
        limit: usize,
    ) {
        self.push_entry(
            TimelineEntry {
                at,
                what,
                attempt: self.attempt,
                step,
                by: None,
                reason: None,
                until: None,
            },
            limit,
        );
    }

    /// Appends the answer to a step that waited for the outside world, with who gave it and why.
    pub(crate) fn note_answer(
        &mut self,
        at: Timestamp,
        what: Happening,
        step: &str,
        by: &str,
        reason: &str,
        limit: usize,
    ) {
        let entry = TimelineEntry {
            at,
            what,
            attempt: self.attempt,
            step: Some(step.to_owned()),
            by: Some(by.to_owned()),
            reason: (!reason.is_empty()).then(|| reason.to_owned()),
            until: None,
        };
        self.push_entry(entry, limit);
    }

    /// Appends the start of step `step`'s wait, for `what`, until `until`.
    pub(crate) fn note_wait(
        &mut self,
        at: Timestamp,
        step: &str,
        what: WaitingFor,
        until: Timestamp,
        limit: usize,
    ) {
        let reason = match what {
            WaitingFor::Time => "waits for its time",
            WaitingFor::Answer => "waits for an answer from outside",
            WaitingFor::Service => "waits for its service, which is held",
        };
        self.note_waiting(at, step, reason, until, limit);
    }

    /// Appends the start of step `step`'s wait, for `reason`, until `until`.
    pub(crate) fn note_waiting(
        &mut self,
        at: Timestamp,
        step: &str,
        reason: &str,
        until: Timestamp,
        limit: usize,
    ) {
        let entry = TimelineEntry {
            at,
            what: Happening::Waiting,
            attempt: self.attempt,
            step: Some(step.to_owned()),
            by: None,
            reason: Some(reason.to_owned()),
            until: Some(until),
        };
        self.push_entry(entry, limit);
    }

    /// Appends an operator's command to the timeline, with who gave it and why.
    pub(crate) fn note_command(
        &mut self,
        at: Timestamp,
        what: Happening,
        by: &str,
        reason: &str,
        limit: usize,
    ) {
        let step = self.current_step().map(|s| s.name.clone());
        let entry = TimelineEntry {
            at,
            what,
            attempt: self.attempt,
            step,
            by: Some(by.to_owned()),
            reason: Some(reason.to_owned()),
            until: None,
        };
        self.push_entry(entry, limit);
    }

    fn push_entry(&mut self, entry: TimelineEntry, limit: usize) {
        self.timeline.push(entry);
        let limit = limit.max(2);
        if self.timeline.len() > limit {
            let excess = self.timeline.len() - limit;
            self.timeline.drain(1..=excess);
        }
    }

    /// Checks the invariants every stored record satisfies. Adapters run it on what they read;
    /// tests and the simulation run it after every transition.
    pub fn check(&self) -> Result<(), String> {
        if self.steps.is_empty() {
            return self.broken("no steps");
        }
        if self.stop.is_some() && self.process_state != ProcessState::Processing {
            return self.broken("an operator's stop waits only while a step is in flight");
        }
        if !self.process_state.is_in_flight() && self.steps.iter().any(|s| s.lease.is_some()) {
            return self.broken("a lease on an order not in flight");
        }
        if self.process_state.is_in_flight() && self.complete_by.is_none() {
            return self.broken("in flight without CompleteBy: the supervisor could never find it");
        }
        if (self.process_state == ProcessState::Processing) != self.locked_by.is_some() {
            return self.broken("LockedBy must be set exactly while Processing");
        }
        if self.process_state.is_terminal() != self.ended_at.is_some() {
            return self.broken("EndedAt must be set exactly while terminal");
        }
        if self.expires_at.is_some() && self.attention().is_some() {
            return self.broken("an order an operator must look at would expire");
        }
        if self.expires_at.is_some() && (!self.is_terminal() || self.complete_by.is_some()) {
            return self.broken("an order the system still works on would expire");
        }
        match self.process_state {
            ProcessState::Pending | ProcessState::Processing | ProcessState::Paused => {
                if self.process_state == ProcessState::Paused && self.complete_by.is_some() {
                    return self.broken("paused with a CompleteBy: the supervisor would wake it");
                }
                if self.alert.is_some() {
                    return self.broken("alert on an order in flight");
                }
                self.check_progress()
            }
            ProcessState::Processed => self.check_processed(),
            ProcessState::Cancelled => {
                if self.complete_by.is_some() != self.release_pending() || self.alert.is_some() {
                    return self.broken("cancelled order with CompleteBy or alert");
                }
                if !matches!(self.cause, Some(Cause::Cancelled { .. } | Cause::KeyBusy { .. })) {
                    return self.broken("cancelled without the operator's cancel as its cause");
                }
                if !self.needs_manual_undo().is_empty() {
                    return self.broken("cancelled with effects left to revert: that is an Error");
                }
                Ok(())
            }
            ProcessState::Error => {
                if self.cause.is_none() {
                    return self.broken("error without a cause");
                }
                match self.alert {
                    None => return self.broken("error without an alert"),
                    Some(AlertDelivery::Pending) if self.complete_by.is_none() => {
                        return self.broken("alert pending but not in the expiry index");
                    }
                    Some(AlertDelivery::Sent)
                        if self.complete_by.is_some() != self.release_pending() =>
                    {
                        return self.broken("alert sent but still in the expiry index");
                    }
                    _ => {}
                }
                if self.steps.iter().any(|s| s.status == StepStatus::ToUndo) {
                    return self.broken("compensation ended with steps still queued");
                }
                Ok(())
            }
        }
    }

    /// The steps and the alert of a processed order.
    fn check_processed(&self) -> Result<(), String> {
        if self.cause.is_some() {
            return self.broken("processed order with a cause");
        }
        if self.steps.iter().any(|s| !s.passed()) {
            return self.broken("processed with a step neither done nor reported");
        }
        // Its alert is owed exactly when some step's failure was only reported.
        let reported = self.steps.iter().any(|s| s.reported.is_some());
        match self.alert {
            None if reported => self.broken("processed with a report but no alert"),
            Some(_) if !reported => self.broken("processed with an alert and no report"),
            Some(AlertDelivery::Pending) if self.complete_by.is_none() => {
                self.broken("alert pending but not in the expiry index")
            }
            Some(AlertDelivery::Sent) | None
                if self.complete_by.is_some() != self.release_pending() =>
            {
                self.broken("processed order with CompleteBy and no alert pending")
            }
            _ => Ok(()),
        }
    }

    /// The leases and the steps' statuses of an order in flight or paused.
    fn check_progress(&self) -> Result<(), String> {
        let sent = self.leased().any(|(_, _, l)| l.sent);
        let queued = self.leased().any(|(_, _, l)| !l.sent);
        if let Some(slot) = &self.slot
            && !slot.admitted
        {
            if self.process_state != ProcessState::Pending || sent || queued {
                return self.broken("an order waiting in its key's line is Pending, with no lease");
            }
            return Ok(());
        }
        match self.process_state {
            ProcessState::Paused if sent || queued => return self.broken("paused with a lease"),
            ProcessState::Processing if !sent => {
                return self.broken("processing with no step sent");
            }
            ProcessState::Pending if sent || !queued => {
                return self.broken("pending without exactly queued leases");
            }
            _ => {}
        }
        if self.process_state.is_in_flight() && self.index_key(self.complete_by) != self.complete_by
        {
            return self.broken("CompleteBy is after the earliest lease, or too long before it");
        }
        if self.steps.iter().any(|s| s.held.is_some() != s.lease.is_some_and(|l| l.held)) {
            return self.broken("a step's hold must be set exactly while its lease is held");
        }
        let mut attempts: Vec<(u64, bool)> = Vec::new();
        for (_, step, lease) in self.leased() {
            if lease.attempt > self.attempt {
                return self.broken("a lease from an attempt not yet taken");
            }
            if lease.held && (lease.sent || lease.timer || lease.held_since.is_none()) {
                return self.broken("a held lease must be queued, and know since when");
            }
            // A callback is sent to nobody: its token is what it was given.
            let marked = step.dispatched || step.token.is_some();
            if lease.sent && (!marked || attempts.iter().any(|a| a.0 == lease.attempt)) {
                return self.broken("a step sent under another's attempt, or not marked sent");
            }
            attempts.push((lease.attempt, lease.sent));
        }
        // Nothing new is queued while the order stops: it waits for the steps in flight.
        if (self.stop.is_some() || self.cause.is_some()) && queued && self.phase == Phase::Forward {
            return self.broken("a step queued while the order stops");
        }
        match self.phase {
            Phase::Forward => {
                if self.leased().any(|(_, s, _)| s.status != StepStatus::NotStarted) {
                    return self.broken("a lease on a step that is not to be done");
                }
                if self.cause.is_some() && !sent {
                    return self
                        .broken("moving forward with a failure cause and nothing in flight");
                }
            }
            Phase::Compensating => {
                if self.cause.is_none() {
                    return self.broken("compensating without a cause");
                }
                if self.leased().any(|(_, s, _)| s.status != StepStatus::ToUndo) {
                    return self.broken("undoing a step that is not queued for undo");
                }
            }
        }
        Ok(())
    }

    /// A broken invariant, named with the record it was found on.
    fn broken(&self, msg: &str) -> Result<(), String> {
        Err(format!("{} ({:?} attempt {}): {msg}", self.order_id, self.process_state, self.attempt))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_of_elements_keeps_runs_and_reads_back_what_it_wrote() {
        let mut set = ElementSet::default();
        for k in [3, 1, 2, 7, 0, 9, 8] {
            set.insert(k);
        }
        assert_eq!(serde_json::to_string(&set).unwrap(), r#""0-3,7-9""#);
        assert_eq!(set.len(), 7);
        set.remove(2);
        set.remove(9);
        set.remove(5);
        assert_eq!(set.iter().collect::<Vec<_>>(), [0, 1, 3, 7, 8]);
        let text = serde_json::to_string(&set).unwrap();
        assert_eq!(text, r#""0-1,3,7-8""#);
        assert_eq!(serde_json::from_str::<ElementSet>(&text).unwrap(), set);
        assert!(set.contains(3) && !set.contains(2) && !set.contains(100));
        for bad in [r#""3,1""#, r#""1-3,3""#, r#""4-2""#, r#""x""#] {
            assert!(serde_json::from_str::<ElementSet>(bad).is_err(), "{bad}");
        }
        // A whole list of ten thousand in a few bytes.
        let mut all = ElementSet::default();
        (0..10_000).for_each(|k| all.insert(k));
        assert_eq!(serde_json::to_string(&all).unwrap(), r#""0-9999""#);
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_millis(s * 1000)
    }

    #[test]
    fn the_index_entry_stays_while_the_earliest_lease_ends_within_its_lead() {
        let key = |kept: Option<i64>| index_key(kept.map(at), at(100));
        assert_eq!(key(None), at(100));
        // Later, within the lead: stays. Exactly at the lead: stays. Beyond it: moves.
        assert_eq!(key(Some(70)), at(70));
        assert_eq!(key(Some(40)), at(40));
        assert_eq!(key(Some(39)), at(100));
        // Never after the lease: an entry behind the earliest lease's end moves to it.
        assert_eq!(key(Some(101)), at(100));
    }
}
