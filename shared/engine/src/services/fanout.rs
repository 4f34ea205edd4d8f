//! The side effects of a step over a list: reading the list, starting (or undoing) the
//! children of its elements, and collecting their outputs once every one ended.
//!
//! Element `k`'s child is [`OrderId::for_element`] of the parent, the step, its run and `k`,
//! so none of them is ever listed on the parent's record: a start repeated finds the child it
//! made, and the outputs are read back by id, a batch at a time.
//!
//! A pass run inline makes no child: its elements' calls go to the child step's agent a few
//! to a request, each under the id and keys its child would have had, and the outputs they
//! answer are read back from the pass's pages ([`Page`]).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::children::{link, reply};
use super::effects::Ports;
use crate::error::{Error, Result};
use crate::ids::{Direction, OrderId, Owner, step_key};
use crate::machine::Input;
use crate::message::{
    ElementCall, ElementOutcome, ElementsReply, ElementsRequest, MAX_ELEMENTS_A_REQUEST,
    MAX_OUTPUT_LEN, Message, StepOutcome, StepRef,
};
use crate::payload::{self, Kept, MAX_INLINE_INPUT_LEN};
use crate::ports::{
    Clock, Destination, EventBus, Outbox, Outgoing, Page, Payloads, Read, StateStore,
};
use crate::state::{FanState, ProcessState, StateRecord, StepState};
use crate::workflow::{MAX_ELEMENTS, Step, Work, Workflow};

/// Most bytes of elements' input one request carries, so that it stays well within what SQS
/// takes (an element larger than [`MAX_INLINE_INPUT_LEN`] travels as a reference).
const REQUEST_INPUTS_LEN: usize = 64 * 1024;

/// Children read in one call while collecting a list's outputs: DynamoDB's batch.
const COLLECT_BATCH: usize = 100;

impl<S, Q, B, C, P> Ports<S, Q, B, C, P>
where
    S: StateStore,
    Q: Outbox,
    B: EventBus,
    C: Clock,
    P: Payloads,
{
    /// Reads the list of `parent`'s step `index` and decides its length on the parent.
    pub(super) async fn count(&self, parent: &StateRecord, index: usize) -> Result<()> {
        let attempt = sent_attempt(parent, index)?;
        let counted = self.list(parent, index).await?.map(|(_, list)| list.len());
        let items = match counted {
            Ok(n) if n <= MAX_ELEMENTS as usize => Ok(n as u32),
            Ok(n) => Err(format!(
                "its list has {n} elements, more than the {MAX_ELEMENTS} a step may run"
            )),
            Err(why) => Err(why),
        };
        let input = Input::Counted {
            attempt,
            step: index,
            items: items.as_ref().copied().map_err(String::as_str),
        };
        self.drive(parent.order_id, input).await.map(|_| ())
    }

    /// Brings the children of `elements` of `parent`'s step `index` in line with its lease.
    pub(super) async fn elements(
        &self,
        parent: &StateRecord,
        index: usize,
        elements: &[u32],
    ) -> Result<Vec<Outgoing>> {
        if is_inline(parent, index) {
            return self.element_calls(parent, index, elements, Duration::ZERO).await;
        }
        let direction = parent.steps.get(index).map(|s| s.direction()).unwrap_or(Direction::Do);
        let mut outgoing = Vec::new();
        if direction == Direction::Undo {
            if elements.is_empty() {
                let (whole, _) = link(parent, index, None)?;
                return Ok(vec![reply(&whole, StepOutcome::Done { output: Value::Null })]);
            }
            for &k in elements {
                let (link, child) = link(parent, index, Some(k))?;
                outgoing.extend(self.undo_child(child, &link).await?);
            }
            return Ok(outgoing);
        }
        let (owner, list) = match self.list(parent, index).await? {
            Ok(found) => found,
            Err(why) => {
                // The list was read when the step started; only a changed workflow moves it.
                return Err(Error::Corrupt { order_id: parent.order_id, reason: why });
            }
        };
        for &k in elements {
            let (link, child) = link(parent, index, Some(k))?;
            let Some(element) = list.get(k as usize) else {
                let why = format!("its list has no element {k}");
                outgoing.push(reply(&link, StepOutcome::failed(&why)));
                continue;
            };
            outgoing.extend(
                self.start_child(parent, index, child, link, Some((&owner, element))).await?,
            );
        }
        Ok(outgoing)
    }

    /// Every element of `parent`'s step `index` ended: reads their children and replies with
    /// the list of their outputs, in order (`null` where an element failed).
    pub(super) async fn collect(&self, parent: &StateRecord, index: usize) -> Result<Outgoing> {
        if is_inline(parent, index) {
            return self.collect_inline(parent, index).await;
        }
        let state = &parent.steps[index];
        let items = state.fan.as_ref().and_then(|f| f.items).unwrap_or(0);
        let ids: Vec<OrderId> = (0..items)
            .map(|k| OrderId::for_element(parent.order_id, &state.name, state.generation, k))
            .collect();
        let mut outputs = Vec::with_capacity(ids.len());
        for batch in ids.chunks(COLLECT_BATCH) {
            for child in self.store.load_many(batch, Read::Consistent).await? {
                outputs.push(match child {
                    Some(c) if c.process_state == ProcessState::Processed => {
                        self.outputs_of_child(&c).await?
                    }
                    _ => Value::Null,
                });
            }
        }
        self.collected(parent, index, outputs).await
    }

    /// The reply of `parent`'s step `index` whose output is the list of its elements'
    /// `outputs`, kept as any output is.
    async fn collected(
        &self,
        parent: &StateRecord,
        index: usize,
        outputs: Vec<Value>,
    ) -> Result<Outgoing> {
        let (whole, _) = link(parent, index, None)?;
        let outcome = self.kept_output(parent.order_id, Value::Array(outputs)).await?;
        Ok(reply(&whole, outcome))
    }

    /// The owner of the parent's order and the list of its step `index`, or why there is none.
    async fn list(
        &self,
        parent: &StateRecord,
        index: usize,
    ) -> Result<std::result::Result<(Owner, Vec<Value>), String>> {
        let workflow = self.catalogue.of(parent)?;
        let Some(Work::Child(spec)) = workflow.step(index).map(|s| &s.work) else {
            return Err(Error::Corrupt {
                order_id: parent.order_id,
                reason: format!("step {index} runs over no list"),
            });
        };
        let order = self.order_of(parent).await?;
        Ok(match self.child_input(parent, &order, spec).await? {
            Ok(Value::Array(list)) => Ok((order.owner, list)),
            Ok(_) => Err(format!("the value at {} is not a list", spec.input)),
            Err(why) => Err(why),
        })
    }

    /// The calls of `elements` of `parent`'s step `index`, a pass run inline, to its child
    /// step's agent, sent after `delay`: forward, each element called (or, dirty, undone);
    /// for the step's undo, each undone, told the output its call answered. An element whose
    /// input its child workflow would refuse is answered failed at once, as its child would
    /// have been.
    pub(super) async fn element_calls(
        &self,
        parent: &StateRecord,
        index: usize,
        elements: &[u32],
        delay: Duration,
    ) -> Result<Vec<Outgoing>> {
        let corrupt = |reason: String| Error::Corrupt { order_id: parent.order_id, reason };
        let state = &parent.steps[index];
        let lease = *state
            .sent()
            .ok_or_else(|| corrupt(format!("calls of step {index}, whose lease was not sent")))?;
        let (child, step) = self.inline_of(parent, index)?;
        let fan = state.fan.clone().unwrap_or_default();
        let (_, list) = match self.list(parent, index).await? {
            Ok(found) => found,
            Err(why) => return Err(corrupt(why)),
        };
        let agent = step.agent().ok_or_else(|| corrupt(format!("{} calls no agent", step.name)))?;
        let undoing = elements.iter().any(|&k| call_direction(state, &fan, k) == Direction::Undo);
        let outputs = match undoing {
            true => self.outputs_to_undo(parent, state, step).await?,
            false => BTreeMap::new(),
        };
        let mut refused = Vec::new();
        let mut calls: [Vec<(usize, ElementCall)>; 2] = Default::default();
        for &k in elements {
            let direction = call_direction(state, &fan, k);
            let id = OrderId::for_element(parent.order_id, &state.name, state.generation, k);
            let Some(element) = list.get(k as usize) else {
                let why = format!("its list has no element {k}");
                refused.push(ElementOutcome { element: k, outcome: StepOutcome::failed(&why) });
                continue;
            };
            let input = match child.input(&serde_json::to_vec(element).unwrap_or_default()) {
                Ok(order) => order.0,
                Err(rejection) => {
                    let why = format!("its input is not valid for {}: {rejection}", child.name());
                    refused.push(ElementOutcome { element: k, outcome: StepOutcome::failed(&why) });
                    continue;
                }
            };
            let input = match payload::keep(&self.payloads, id, input, MAX_INLINE_INPUT_LEN).await?
            {
                Kept::Inline(v) | Kept::Stored(v) => v,
                Kept::TooLarge { bytes } => {
                    let why = format!("its input of {bytes} bytes is too large");
                    refused.push(ElementOutcome { element: k, outcome: StepOutcome::failed(&why) });
                    continue;
                }
            };
            // What its undo is told travels as a step's output does: a large one by reference.
            let output = match outputs.get(&k).filter(|_| direction == Direction::Undo) {
                // Kept by reference already (as its call's agent answered it).
                Some(output) if payload::is_reference(output) => Some(output.clone()),
                Some(output) => {
                    match payload::keep(&self.payloads, id, output.clone(), MAX_OUTPUT_LEN).await? {
                        Kept::Inline(v) | Kept::Stored(v) => Some(v),
                        Kept::TooLarge { .. } => None,
                    }
                }
                None => None,
            };
            let call = ElementCall {
                element: k,
                order_id: id,
                idempotency_key: step_key(id, &step.name, direction, 0),
                input,
                output,
            };
            let len = serde_json::to_string(&call.input).map_or(0, |s| s.len())
                + call.output.as_ref().map_or(0, |o| o.to_string().len());
            calls[usize::from(direction == Direction::Undo)].push((len, call));
        }
        let now = self.clock.now();
        let threshold = step.lease_limit(self.config.failure_threshold);
        let mut outgoing = Vec::new();
        for (direction, calls) in [Direction::Do, Direction::Undo].into_iter().zip(calls) {
            let Some((action, budget)) = step.action(direction) else {
                // Nothing undoes it: an undo of it is done at once.
                let done = StepOutcome::Done { output: Value::Null };
                let answered = calls
                    .iter()
                    .map(|(_, c)| ElementOutcome { element: c.element, outcome: done.clone() });
                outgoing.extend(answer(parent, index, state, direction, answered.collect(), now));
                continue;
            };
            for chunk in in_requests(calls) {
                let last_lease = chunk.iter().any(|c| {
                    fan.strikes.get(&c.element).copied().unwrap_or(0).saturating_add(1) >= threshold
                });
                let request = ElementsRequest {
                    order_id: parent.order_id,
                    attempt: lease.attempt,
                    correlation_id: parent.correlation_id.clone(),
                    step: StepRef { index, name: state.name.clone(), direction, element: None },
                    action: action.to_owned(),
                    complete_by: lease.complete_by,
                    elements: chunk,
                    due_at: Some(now.plus(delay)),
                    budget_ms: Some(u64::try_from(budget.as_millis()).unwrap_or(u64::MAX)),
                    resumed: lease.held_since.is_some(),
                    last_lease,
                    group: parent.group.clone(),
                };
                let message = Message::Elements(Box::new(request));
                let to = Destination::Agent(agent.clone());
                outgoing.push(match delay.is_zero() {
                    true => Outgoing::now(to, message),
                    false => Outgoing::later(to, message, delay),
                });
            }
        }
        if !refused.is_empty() {
            let direction = state.direction();
            outgoing.extend(answer(parent, index, state, direction, refused, now));
        }
        Ok(outgoing)
    }

    /// Every element of `parent`'s step `index`, run inline, ended: replies with the list of
    /// their outputs, in order, read from the pass's pages (`null` where an element failed).
    async fn collect_inline(&self, parent: &StateRecord, index: usize) -> Result<Outgoing> {
        let state = &parent.steps[index];
        let (_, step) = self.inline_of(parent, index)?;
        let fan = state.fan.clone().unwrap_or_default();
        let items = fan.items.unwrap_or(0);
        let mut found = self.outputs_on_pages(parent, state).await?;
        let mut outputs = Vec::with_capacity(items as usize);
        for k in 0..items {
            if fan.settled.contains(k) || fan.dirty.contains(k) {
                outputs.push(Value::Null);
                continue;
            }
            let output = found.remove(&k).ok_or_else(|| Error::Corrupt {
                order_id: parent.order_id,
                reason: format!("step {} has no page with the output of element {k}", state.name),
            })?;
            // As its child order's outputs would be: by step, each whole.
            let id = OrderId::for_element(parent.order_id, &state.name, state.generation, k);
            let whole = payload::resolve(&self.payloads, id, &output).await?;
            outputs.push(Value::Object([(step.name.clone(), whole)].into_iter().collect()));
        }
        self.collected(parent, index, outputs).await
    }

    /// The output each element of `state`'s pass answered, from the first page that holds it.
    async fn outputs_on_pages(
        &self,
        parent: &StateRecord,
        state: &StepState,
    ) -> Result<BTreeMap<u32, Value>> {
        let pass = Page::pass_of(parent.order_id, &state.name, state.generation);
        let mut found = BTreeMap::new();
        for page in self.store.pages(&pass).await? {
            for (k, output) in page.outputs {
                found.entry(k).or_insert(output);
            }
        }
        Ok(found)
    }

    /// The output each element of `state`'s pass answered, as its undo is told it: from the
    /// list the pass collected, if it ended well (its pages may be gone with the order's end,
    /// should an operator undo it later), else from its pages.
    async fn outputs_to_undo(
        &self,
        parent: &StateRecord,
        state: &StepState,
        step: &Step,
    ) -> Result<BTreeMap<u32, Value>> {
        let Some(collected) = &state.output else {
            return self.outputs_on_pages(parent, state).await;
        };
        let list = payload::resolve(&self.payloads, parent.order_id, collected).await?;
        let outputs = list.as_array().map(Vec::as_slice).unwrap_or_default();
        Ok(outputs
            .iter()
            .enumerate()
            .filter_map(|(k, o)| Some((u32::try_from(k).ok()?, o.get(&step.name)?.clone())))
            .collect())
    }

    /// Deletes the pages of `record`'s passes run inline.
    pub(super) async fn drop_pages(&self, record: &StateRecord) -> Result<()> {
        for state in
            record.steps.iter().filter(|s| s.fan.as_ref().is_some_and(|f| f.inline.is_some()))
        {
            let pass = Page::pass_of(record.order_id, &state.name, state.generation);
            self.store.drop_pages(&pass).await?;
        }
        Ok(())
    }

    /// The child workflow and its step that `parent`'s step `index` runs inline.
    fn inline_of(&self, parent: &StateRecord, index: usize) -> Result<(&Workflow, &Step)> {
        let corrupt = |reason: String| Error::Corrupt { order_id: parent.order_id, reason };
        let state = &parent.steps[index];
        let version = state.fan.as_ref().and_then(|f| f.inline);
        let workflow = self.catalogue.of(parent)?;
        let (Some(Work::Child(child)), Some(version)) =
            (workflow.step_named(&state.name).map(|s| &s.work), version)
        else {
            return Err(corrupt(format!("step {} runs no list inline", state.name)));
        };
        let step =
            child.inline.as_ref().and_then(|inline| inline.step(version)).ok_or_else(|| {
                corrupt(format!("{} version {version} is not one step", child.workflow))
            })?;
        let child_workflow = self.catalogue.version(&child.workflow, version).ok_or_else(|| {
            corrupt(format!("this deployment has no {} version {version}", child.workflow))
        })?;
        Ok((child_workflow.as_ref(), step))
    }
}

/// Whether `parent`'s step `index` runs its list inline.
pub(super) fn is_inline(parent: &StateRecord, index: usize) -> bool {
    parent.steps.get(index).and_then(|s| s.fan.as_ref()).is_some_and(|f| f.inline.is_some())
}

/// Which way element `k`'s call goes: forward, done (or, dirty, undone); for the step's undo,
/// undone.
fn call_direction(state: &StepState, fan: &FanState, k: u32) -> Direction {
    match state.direction() {
        Direction::Do if fan.cleaning.contains(&k) => Direction::Undo,
        direction => direction,
    }
}

/// `calls` cut into requests of at most [`MAX_ELEMENTS_A_REQUEST`] elements and
/// [`REQUEST_INPUTS_LEN`] bytes of input (an element alone goes alone, whatever its size).
fn in_requests(calls: Vec<(usize, ElementCall)>) -> Vec<Vec<ElementCall>> {
    let mut requests: Vec<Vec<ElementCall>> = Vec::new();
    let mut len = 0;
    for (size, call) in calls {
        let full = requests.last().is_none_or(|r| {
            r.len() >= MAX_ELEMENTS_A_REQUEST || (len + size > REQUEST_INPUTS_LEN && !r.is_empty())
        });
        if full {
            requests.push(Vec::new());
            len = 0;
        }
        len += size;
        if let Some(request) = requests.last_mut() {
            request.push(call);
        }
    }
    requests
}

/// The reply that answers `outcomes` of `parent`'s step `index` at once, for calls that go
/// nowhere (an element its child would refuse, an undo with nothing to undo).
fn answer(
    parent: &StateRecord,
    index: usize,
    state: &StepState,
    direction: Direction,
    outcomes: Vec<ElementOutcome>,
    now: crate::time::Timestamp,
) -> Option<Outgoing> {
    let lease = state.sent()?;
    if outcomes.is_empty() {
        return None;
    }
    let reply = ElementsReply {
        order_id: parent.order_id,
        attempt: lease.attempt,
        correlation_id: parent.correlation_id.clone(),
        step: StepRef { index, name: state.name.clone(), direction, element: None },
        complete_by: lease.complete_by,
        outcomes,
        due_at: Some(now),
        group: parent.group.clone(),
    };
    Some(Outgoing::now(Destination::Replies, Message::ElementsReply(reply)))
}

/// The attempt of the sent lease of `parent`'s step `index`.
fn sent_attempt(parent: &StateRecord, index: usize) -> Result<u64> {
    parent.steps.get(index).and_then(|s| s.sent()).map(|l| l.attempt).ok_or_else(|| {
        Error::Corrupt {
            order_id: parent.order_id,
            reason: format!("list of step {index}, whose lease was not sent"),
        }
    })
}
