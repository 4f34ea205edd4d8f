//! The side effects of a step over a list: reading the list, starting (or undoing) the
//! children of its elements, and collecting their outputs once every one ended.
//!
//! Element `k`'s child is [`OrderId::for_element`] of the parent, the step, its run and `k`,
//! so none of them is ever listed on the parent's record: a start repeated finds the child it
//! made, and the outputs are read back by id, a batch at a time.

use serde_json::Value;

use super::children::{link, reply};
use super::effects::Ports;
use crate::error::{Error, Result};
use crate::ids::{Direction, OrderId, Owner};
use crate::machine::Input;
use crate::message::StepOutcome;
use crate::ports::{Clock, EventBus, Outbox, Outgoing, Payloads, Read, StateStore};
use crate::state::{ProcessState, StateRecord};
use crate::workflow::{MAX_ELEMENTS, Work};

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
