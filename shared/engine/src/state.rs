//! The state record of one order: the pattern's fields, plus what multi-step work needs.
//!
//! `OrderId`, `LockedBy`, `CompleteBy`, `ProcessState` and `FailureCount` mean what the pattern
//! says. On top of them:
//!
//! - `attempt` is a fencing token. It grows with every lease (claim, next step, reset), every
//!   message carries it, and a message from an older attempt can change nothing.
//! - `revision` grows with every write; each write expects the revision it read, so two
//!   writers that read the same record can never both succeed.
//! - `phase`, `cursor` and `steps` say which step is being done or undone, and how each went.
//! - `complete_by` is set exactly while the record needs the supervisor's attention: while the
//!   order is in flight (Pending or Processing), and while an operator alert is not yet known to
//!   be published. It is what the sparse expiry index holds, so finished records leave it.
//! - `last_input` names the message whose handling produced this revision, so a redelivery of
//!   that same message (its handler died after writing) can redo the lost side effects, while a
//!   second copy of it changes nothing.
//!
//! [`StateRecord::check`] states the invariants; every transition keeps them.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::EngineConfig;
use crate::ids::{Direction, OrderId};
use crate::time::Timestamp;
use crate::workflow::Workflow;

/// The pattern's process states.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ProcessState {
    /// Waiting for the scheduler to claim it (new, reset by the supervisor, or undo queued).
    Pending,
    /// Claimed: a step (or its undo) has been dispatched and holds a lease until CompleteBy.
    Processing,
    /// Every step completed. Terminal.
    Processed,
    /// The order failed; the alert says whether its effects were undone. Terminal.
    Error,
}

impl ProcessState {
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessState::Pending => "Pending",
            ProcessState::Processing => "Processing",
            ProcessState::Processed => "Processed",
            ProcessState::Error => "Error",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            ProcessState::Pending,
            ProcessState::Processing,
            ProcessState::Processed,
            ProcessState::Error,
        ]
        .into_iter()
        .find(|p| p.as_str() == s)
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, ProcessState::Processed | ProcessState::Error)
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
    /// Not completed yet (possibly in progress: see the record's cursor).
    NotStarted,
    /// Completed; its output is recorded.
    Done,
    /// The agent reported a permanent fault; the remote effect did not happen.
    Failed,
    /// Its leases kept expiring; the remote effect may or may not have happened.
    Uncertain,
    /// Queued to be undone (or being undone: see the cursor).
    ToUndo,
    /// Undone.
    Undone,
    /// Undoing it failed; an operator must look.
    UndoFailed,
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
}

impl Cause {
    pub fn step(&self) -> &str {
        match self {
            Cause::StepRejected { step, .. }
            | Cause::StepTimedOut { step, .. }
            | Cause::UnknownStep { step } => step,
        }
    }
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
    /// The supervisor acted on an expired lease.
    Expire,
}

impl InputRef {
    pub fn is_message(&self, id: &str) -> bool {
        matches!(self, InputRef::Message(m) if m == id)
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
    LeaseExpired,
    RetryScheduled,
    CompensationStarted,
    StepUndone,
    UndoFailed,
    Processed,
    Compensated,
    Failed,
    AlertSent,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineEntry {
    pub at: Timestamp,
    pub what: Happening,
    pub attempt: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

/// The state record. See the module documentation for the meaning of each field.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateRecord {
    pub order_id: OrderId,
    pub workflow: String,
    pub process_state: ProcessState,
    pub locked_by: Option<String>,
    pub complete_by: Option<Timestamp>,
    /// Expired leases of the current step (reset when a step completes, and when compensation
    /// begins).
    pub failure_count: u32,
    pub attempt: u64,
    pub revision: u64,
    pub phase: Phase,
    /// Index of the step being done or undone; meaningful while Pending or Processing.
    pub cursor: usize,
    pub steps: Vec<StepState>,
    pub cause: Option<Cause>,
    pub alert: Option<AlertDelivery>,
    pub last_input: InputRef,
    pub correlation_id: String,
    /// Expiry-index shard, fixed at creation.
    pub shard: u16,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub timeline: Vec<TimelineEntry>,
}

impl StateRecord {
    /// The record of a newly submitted order: Pending at attempt 0, with a CompleteBy that gives
    /// the scheduler `claim_grace` to claim it and the first step its whole budget.
    pub fn new(
        order_id: OrderId,
        workflow: &Workflow,
        config: &EngineConfig,
        correlation_id: String,
        now: Timestamp,
    ) -> StateRecord {
        let first_budget = workflow.steps().first().map_or(Duration::ZERO, |s| s.budget);
        let mut record = StateRecord {
            order_id,
            workflow: workflow.name().to_owned(),
            process_state: ProcessState::Pending,
            locked_by: None,
            complete_by: Some(now.plus(config.claim_grace).plus(first_budget)),
            failure_count: 0,
            attempt: 0,
            revision: 0,
            phase: Phase::Forward,
            cursor: 0,
            steps: workflow
                .steps()
                .iter()
                .map(|s| StepState {
                    name: s.name.clone(),
                    status: StepStatus::NotStarted,
                    output: None,
                    detail: None,
                })
                .collect(),
            cause: None,
            alert: None,
            last_input: InputRef::Submit,
            correlation_id,
            shard: order_id.shard(config.index_shards),
            created_at: now,
            updated_at: now,
            timeline: Vec::new(),
        };
        record.note(now, Happening::Received, None, config.timeline_limit);
        record
    }

    pub fn is_terminal(&self) -> bool {
        self.process_state.is_terminal()
    }

    /// The step being done or undone, while the order is in flight.
    pub fn current_step(&self) -> Option<&StepState> {
        match self.process_state {
            ProcessState::Pending | ProcessState::Processing => self.steps.get(self.cursor),
            ProcessState::Processed | ProcessState::Error => None,
        }
    }

    /// Steps whose effects may still be in place after a failure and that nothing will undo.
    pub fn needs_manual_undo(&self) -> Vec<String> {
        self.steps
            .iter()
            .filter(|s| {
                matches!(
                    s.status,
                    StepStatus::Uncertain | StepStatus::UndoFailed | StepStatus::ToUndo
                )
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
        self.timeline.push(TimelineEntry { at, what, attempt: self.attempt, step });
        let limit = limit.max(2);
        if self.timeline.len() > limit {
            let excess = self.timeline.len() - limit;
            self.timeline.drain(1..=excess);
        }
    }

    /// Checks the invariants every stored record satisfies. Adapters run it on what they read;
    /// tests and the simulation run it after every transition.
    pub fn check(&self) -> Result<(), String> {
        let in_flight =
            matches!(self.process_state, ProcessState::Pending | ProcessState::Processing);
        let fail = |msg: &str| {
            Err(format!(
                "{} ({:?} attempt {}): {msg}",
                self.order_id, self.process_state, self.attempt
            ))
        };
        if self.steps.is_empty() {
            return fail("no steps");
        }
        if in_flight {
            if self.complete_by.is_none() {
                return fail("in flight without CompleteBy: the supervisor could never find it");
            }
            if self.cursor >= self.steps.len() {
                return fail("cursor past the last step");
            }
            if (self.process_state == ProcessState::Processing) != self.locked_by.is_some() {
                return fail("LockedBy must be set exactly while Processing");
            }
            if self.alert.is_some() {
                return fail("alert on an order in flight");
            }
            let current = self.steps[self.cursor].status;
            match self.phase {
                Phase::Forward => {
                    if self.cause.is_some() {
                        return fail("moving forward with a failure cause");
                    }
                    if current != StepStatus::NotStarted
                        || self.steps[..self.cursor].iter().any(|s| s.status != StepStatus::Done)
                        || self.steps[self.cursor..]
                            .iter()
                            .any(|s| s.status != StepStatus::NotStarted)
                    {
                        return fail("forward progress out of order");
                    }
                }
                Phase::Compensating => {
                    if self.cause.is_none() {
                        return fail("compensating without a cause");
                    }
                    if current != StepStatus::ToUndo {
                        return fail("undoing a step that is not queued for undo");
                    }
                    if self.steps[self.cursor + 1..].iter().any(|s| s.status == StepStatus::ToUndo)
                    {
                        return fail("undo out of reverse order");
                    }
                }
            }
        } else {
            if self.locked_by.is_some() {
                return fail("finished order still locked");
            }
            match self.process_state {
                ProcessState::Processed => {
                    if self.complete_by.is_some() || self.alert.is_some() || self.cause.is_some() {
                        return fail("processed order with CompleteBy, alert or cause");
                    }
                    if self.steps.iter().any(|s| s.status != StepStatus::Done) {
                        return fail("processed with a step not done");
                    }
                }
                _ => {
                    if self.cause.is_none() {
                        return fail("error without a cause");
                    }
                    match self.alert {
                        None => return fail("error without an alert"),
                        Some(AlertDelivery::Pending) if self.complete_by.is_none() => {
                            return fail("alert pending but not in the expiry index");
                        }
                        Some(AlertDelivery::Sent) if self.complete_by.is_some() => {
                            return fail("alert sent but still in the expiry index");
                        }
                        _ => {}
                    }
                    if self.steps.iter().any(|s| s.status == StepStatus::ToUndo)
                        && self.phase == Phase::Compensating
                    {
                        return fail("compensation ended with steps still queued");
                    }
                }
            }
        }
        Ok(())
    }
}
