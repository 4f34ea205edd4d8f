//! The side effects that reach another order: a parent starting, stopping or undoing its
//! child, and a child telling its parent it ended.
//!
//! A child is an order of its own, created by a conditional write under an id made from its
//! parent, step and run, so a start repeated (a replay, a redelivered claim) finds the child
//! it made. It keeps a link to the lease of its parent's step that it answers; its end is
//! a [`ChildEnded`] message to the scheduler, which reads the child and answers the parent's
//! step as an agent's reply would, fenced by that lease's attempt. A parent acts on its child
//! through the child's own state machine ([`Input::ParentUndo`], [`Input::ParentStop`]), as an
//! operator's command would, so the child stays the only judge of its own state.

use serde_json::{Map, Value};
use tracing::{info, warn};

use super::effects::Ports;
use crate::error::{Error, Result};
use crate::ids::{Direction, IdempotencyKey, OrderId, Owner};
use crate::machine::{self, Ctx, Decision, Input};
use crate::message::{ChildEnded, Message, StepOutcome, StepRef, StepReply};
use crate::order::Order;
use crate::payload::{self, Kept, MAX_INLINE_INPUT_LEN};
use crate::ports::{
    Clock, Created, Destination, EventBus, OrderRecord, Outbox, Outgoing, Payloads, Read, Saved,
    StateStore,
};
use crate::state::{Parent, ProcessState, StateRecord, Submitted};
use crate::workflow::{Child, Work};

/// Writes a child's transition may meet before the parent's effect gives up for now (and its
/// input comes back).
const CHILD_TRIES: usize = 8;

impl<S, Q, B, C, P> Ports<S, Q, B, C, P>
where
    S: StateStore,
    Q: Outbox,
    B: EventBus,
    C: Clock,
    P: Payloads,
{
    /// The child of `parent`'s step `index`, brought in line with the step's lease: started
    /// for a step, undone (or cancelled) for its undo. Returns what to send.
    pub(super) async fn child(&self, parent: &StateRecord, index: usize) -> Result<Vec<Outgoing>> {
        let (link, child) = link(parent, index, None)?;
        match link.step.direction {
            Direction::Do => self.start_child(parent, index, child, link, None).await,
            Direction::Undo => self.undo_child(child, &link).await,
        }
    }

    /// The child `id` undone (or cancelled) for its parent's undo `link`, or, never started,
    /// the undo answered: there is nothing to undo.
    pub(super) async fn undo_child(&self, id: OrderId, link: &Parent) -> Result<Vec<Outgoing>> {
        if self.drive(id, Input::ParentUndo { parent: link }).await? {
            return Ok(Vec::new());
        }
        Ok(vec![reply(link, StepOutcome::Done { output: Value::Null })])
    }

    /// Cancels the child of `parent`'s step `index` (each in flight, for a step over a list),
    /// in flight while its parent stops.
    pub(super) async fn stop_child(&self, parent: &StateRecord, index: usize) -> Result<()> {
        let running = parent
            .steps
            .get(index)
            .and_then(|s| s.fan.as_ref())
            .map(|f| f.forward.running.iter().map(|&k| Some(k)).collect::<Vec<_>>());
        for element in running.unwrap_or_else(|| vec![None]) {
            let (link, child) = stop_link(parent, index, element)?;
            self.drive(child, Input::ParentStop { parent: &link }).await?;
        }
        Ok(())
    }

    /// Word to the parent of `child`, which has ended.
    pub(super) fn tell_parent(&self, child: &StateRecord) -> Option<Outgoing> {
        let parent = child.parent.as_ref()?;
        Some(Outgoing::now(
            Destination::Scheduler,
            Message::ChildEnded(ChildEnded {
                order_id: parent.order_id,
                attempt: parent.attempt,
                correlation_id: parent.correlation_id.clone(),
                step: parent.step.clone(),
                child: child.order_id,
                due_at: Some(self.clock.now()),
                group: child.group.clone(),
            }),
        ))
    }

    /// How `ended`'s child ended, as its parent's step takes it: `None` if it has not ended
    /// for that lease of its parent's step (it was relinked to a later one since, or left its
    /// end to be undone).
    pub async fn outcome_of_child(&self, ended: &ChildEnded) -> Result<Option<StepOutcome>> {
        let Some(child) = self.store.load(ended.child, Read::Consistent).await? else {
            return Err(Error::InvalidMessage(format!(
                "child order {} does not exist",
                ended.child
            )));
        };
        let Some(link) = child.parent.as_ref().filter(|p| p.order_id == ended.order_id) else {
            return Err(Error::InvalidMessage(format!(
                "order {} is not a child of {}",
                ended.child, ended.order_id
            )));
        };
        if link.attempt != ended.attempt || link.step.direction != ended.step.direction {
            return Ok(None);
        }
        let why = |state: ProcessState| {
            let cause =
                child.cause.as_ref().map_or_else(String::new, |c| format!(": {}", c.kind()));
            format!("its child order {} ended {}{cause}", child.order_id, state.as_str())
        };
        Ok(Some(match (ended.step.direction, child.process_state) {
            (_, state) if !state.is_terminal() => return Ok(None),
            // An element's output is read with the others' once the list is done.
            (Direction::Do, ProcessState::Processed) if ended.step.element.is_some() => {
                StepOutcome::Done { output: Value::Null }
            }
            (Direction::Do, ProcessState::Processed) => {
                self.outputs_for(&child, ended.order_id).await?
            }
            (Direction::Do, state) => StepOutcome::failed(&why(state)),
            // Undone: every step it did is undone, or it had done nothing.
            (Direction::Undo, _) if child.needs_manual_undo().is_empty() => {
                StepOutcome::Done { output: Value::Null }
            }
            (Direction::Undo, state) => StepOutcome::failed(&why(state)),
        }))
    }

    /// A processed child's outputs, by step, as its parent's step output: each value whole,
    /// and the whole kept as any output is (stored under the parent if large).
    async fn outputs_for(&self, child: &StateRecord, parent: OrderId) -> Result<StepOutcome> {
        let outputs = self.outputs_of_child(child).await?;
        self.kept_output(parent, outputs).await
    }

    /// A processed child's outputs by step, each value whole.
    pub(super) async fn outputs_of_child(&self, child: &StateRecord) -> Result<Value> {
        let mut outputs = Map::new();
        for step in &child.steps {
            if let Some(value) = &step.output {
                let whole = payload::resolve(&self.payloads, child.order_id, value).await?;
                outputs.insert(step.name.clone(), whole);
            }
        }
        Ok(Value::Object(outputs))
    }

    /// `output` as a step of `parent` carries it: kept as any output is (stored under the
    /// parent if large).
    pub(super) async fn kept_output(&self, parent: OrderId, output: Value) -> Result<StepOutcome> {
        Ok(match payload::keep_output(&self.payloads, parent, output).await? {
            Kept::Inline(output) | Kept::Stored(output) => StepOutcome::Done { output },
            Kept::TooLarge { bytes } => StepOutcome::TooLarge { bytes },
        })
    }

    /// Starts the child `id` of `parent`'s step `index`, or, if it exists, tells the parent how
    /// it ended should it have. Its input is `given` (the owner of the parent's order and an
    /// element of the step's list), or is found at the step's pointer.
    pub(super) async fn start_child(
        &self,
        parent: &StateRecord,
        index: usize,
        id: OrderId,
        link: Parent,
        given: Option<(&Owner, &Value)>,
    ) -> Result<Vec<Outgoing>> {
        if let Some(existing) = self.store.load(id, Read::Consistent).await? {
            return Ok(existing
                .process_state
                .is_terminal()
                .then(|| self.tell_parent(&existing))
                .flatten()
                .into_iter()
                .collect());
        }
        let workflow = self.catalogue.of(parent)?;
        let spec = match workflow.step(index).map(|s| &s.work) {
            Some(Work::Child(spec)) => spec,
            _ => {
                return Err(Error::Corrupt {
                    order_id: parent.order_id,
                    reason: format!("step {index} starts no child"),
                });
            }
        };
        let (owner, body) = match given {
            Some((owner, element)) => (owner.clone(), serde_json::to_vec(element)),
            None => {
                let order = self.order_of(parent).await?;
                match self.child_input(parent, &order, spec).await? {
                    Ok(input) => (order.owner, serde_json::to_vec(&input)),
                    Err(why) => return Ok(vec![reply(&link, StepOutcome::failed(&why))]),
                }
            }
        };
        let found = match spec.version {
            Some(v) => self.catalogue.version(&spec.workflow, v),
            None => self.catalogue.for_new_order(Some(&spec.workflow)).ok(),
        };
        let Some(child_workflow) = found else {
            let why = format!("this deployment has no workflow {} to start", spec.workflow);
            return Ok(vec![reply(&link, StepOutcome::failed(&why))]);
        };
        let body = body.unwrap_or_default();
        let order_input = match child_workflow.input(&body) {
            Ok(order) => order,
            Err(rejection) => {
                let why =
                    format!("its child's input is not valid for {}: {rejection}", spec.workflow);
                return Ok(vec![reply(&link, StepOutcome::failed(&why))]);
            }
        };
        let now = self.clock.now();
        let wakes = match child_workflow.wakes(&order_input.0, now) {
            Ok(wakes) => wakes,
            Err(e) => return Ok(vec![reply(&link, StepOutcome::failed(&e.to_string()))]),
        };
        let line = match child_workflow.key_of(&order_input.0) {
            Ok(line) => line,
            Err(e) => return Ok(vec![reply(&link, StepOutcome::failed(&e.to_string()))]),
        };
        let search_key = child_workflow.search_value(&order_input.0);
        let kept =
            match payload::keep(&self.payloads, id, order_input.0, MAX_INLINE_INPUT_LEN).await? {
                Kept::Inline(v) | Kept::Stored(v) => v,
                Kept::TooLarge { bytes } => {
                    let why = format!("its child's input of {bytes} bytes is too large");
                    return Ok(vec![reply(&link, StepOutcome::failed(&why))]);
                }
            };
        let run = parent.steps[index].generation;
        let element = link.step.element.map_or_else(String::new, |k| format!("-{k}"));
        let key =
            IdempotencyKey::parse(&format!("child-{}-{index}-{run}{element}", parent.order_id))
                .map_err(Error::from)?;
        let ctx = Ctx { now, config: &self.config, workflow: child_workflow, seed: 0 };
        let mut created =
            machine::create_waking(id, parent.correlation_id.clone(), &wakes, line, &ctx);
        created.next.parent = Some(link);
        created.next.group = parent.group.clone();
        created.next.search_key = search_key;
        created.next.submitted = Some(Submitted { owner, key, input: Order(kept) });
        if self.store.create_state(&created.next).await? == Created::AlreadyExists {
            return Ok(Vec::new());
        }
        info!(parent = %parent.order_id, child = %id, workflow = %spec.workflow, "child order started");
        Box::pin(self.perform(&created.next, &created.effects)).await?;
        Ok(Vec::new())
    }

    /// The child's input (for a step over a list, the list), found at its step's pointer, or
    /// why it cannot be.
    pub(super) async fn child_input(
        &self,
        parent: &StateRecord,
        order: &OrderRecord,
        spec: &Child,
    ) -> Result<std::result::Result<Value, String>> {
        let mut parts = spec.input.splitn(4, '/').skip(1);
        let (root, rest) = match parts.next() {
            Some("input") => {
                let whole =
                    payload::resolve(&self.payloads, parent.order_id, order.order.input()).await?;
                (whole, parts.collect::<Vec<_>>().join("/"))
            }
            Some("outputs") => {
                let step = parts.next().unwrap_or_default();
                let Some(output) =
                    parent.steps.iter().find(|s| s.name == step).and_then(|s| s.output.as_ref())
                else {
                    return Ok(Err(format!("step {step:?} has no output for its child's input")));
                };
                let whole = payload::resolve(&self.payloads, parent.order_id, output).await?;
                (whole, parts.collect::<Vec<_>>().join("/"))
            }
            _ => return Ok(Err(format!("no input at {}", spec.input))),
        };
        let pointer = if rest.is_empty() { String::new() } else { format!("/{rest}") };
        Ok(root.pointer(&pointer).cloned().ok_or_else(|| format!("no input at {}", spec.input)))
    }

    /// Decides `input` on order `id` and carries out what it decides, as often as other
    /// writers make it necessary; `false` if there is no such order.
    pub(super) async fn drive(&self, id: OrderId, input: Input<'_>) -> Result<bool> {
        for _ in 0..CHILD_TRIES {
            let Some(record) = self.store.load(id, Read::Consistent).await? else {
                return Ok(false);
            };
            match machine::decide(&record, input, &self.ctx(&record)?) {
                Decision::Apply(t) => {
                    if self.save(&record, &t.next).await? == Saved::Saved {
                        Box::pin(self.perform(&t.next, &t.effects)).await?;
                        return Ok(true);
                    }
                }
                Decision::Replay(effects) => {
                    Box::pin(self.perform(&record, &effects)).await?;
                    return Ok(true);
                }
                other => {
                    warn!(order_id = %id, ?other, "a parent's word changed nothing of its child");
                    return Ok(true);
                }
            }
        }
        Err(Error::Contended { order_id: id, tries: CHILD_TRIES })
    }
}

/// The link a child keeps to `parent`'s step `index` (for a step over a list, to one
/// `element`), as its lease stands, and the child's id for the step's run.
pub(super) fn link(
    parent: &StateRecord,
    index: usize,
    element: Option<u32>,
) -> Result<(Parent, OrderId)> {
    let lease = parent.steps.get(index).and_then(|s| s.sent()).ok_or_else(|| Error::Corrupt {
        order_id: parent.order_id,
        reason: format!("child of step {index}, whose lease was not sent"),
    })?;
    Ok(link_at(parent, index, element, lease.attempt))
}

/// [`link`], to the step's lease at `attempt`.
fn link_at(
    parent: &StateRecord,
    index: usize,
    element: Option<u32>,
    attempt: u64,
) -> (Parent, OrderId) {
    let state = &parent.steps[index];
    let child = match element {
        Some(k) => OrderId::for_element(parent.order_id, &state.name, state.generation, k),
        None => OrderId::for_child(parent.order_id, &state.name, state.generation),
    };
    let link = Parent {
        order_id: parent.order_id,
        step: StepRef { index, name: state.name.clone(), direction: state.direction(), element },
        attempt,
        correlation_id: parent.correlation_id.clone(),
    };
    (link, child)
}

/// The link a stop names: as [`link`], or, for a list whose lease ran out (its children in
/// flight stop at once), at the parent's last attempt, which only makes the stop's command id.
fn stop_link(
    parent: &StateRecord,
    index: usize,
    element: Option<u32>,
) -> Result<(Parent, OrderId)> {
    match parent.steps.get(index).and_then(|s| s.sent()) {
        Some(_) => link(parent, index, element),
        None => Ok(link_at(parent, index, element, parent.attempt)),
    }
}

/// An answer to the parent's step that no child gave: a start that could not be made, an undo
/// with nothing to undo.
/// It carries no group: a message without one is a tenant of its own to a fair queue, and
/// these are rare.
pub(super) fn reply(link: &Parent, outcome: StepOutcome) -> Outgoing {
    Outgoing::now(
        Destination::Scheduler,
        Message::Reply(StepReply {
            order_id: link.order_id,
            attempt: link.attempt,
            correlation_id: link.correlation_id.clone(),
            step: link.step.clone(),
            complete_by: crate::time::Timestamp::from_millis(0),
            idempotency_key: String::new(),
            outcome,
            due_at: None,
            group: None,
        }),
    )
}
