//! The views of one order: what `GET /orders/{id}` returns to its client, and what an operator
//! reads (the same, with the commands, alert and redrives the record keeps).
//!
//! A value kept in the payload store ([`crate::payload`]) is shown as its reference, unless the
//! reader asks for whole values ([`Values::Whole`]): then each is read back, which costs a read
//! of the store each, so that a client polling an order's state pays nothing for its values.

use serde::Serialize;

use crate::error::Result;
use crate::ids::{OrderId, Owner};
use crate::keys::Standing;
use crate::order::Order;
use crate::payload::{self, NoPayloads};
use crate::ports::{OrderRecord, Payloads, Read, StateStore};
use crate::state::{
    AlertDelivery, Cause, CommandEntry, Phase, ProcessState, StateRecord, StepState, StepStatus,
    Stop, TimelineEntry, WaitingFor,
};
use crate::time::Timestamp;
use crate::workflow::{OnFailure, Work, Workflow};

/// An order with its state, steps and timeline, as shown to clients.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OrderView {
    pub order_id: OrderId,
    /// The workflow the order runs, and the version it started on and keeps.
    pub workflow: String,
    pub workflow_version: u32,
    pub process_state: ProcessState,
    pub phase: Phase,
    pub failure_count: u32,
    pub attempt: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub complete_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
    /// A step failed (`cause` says which and why) while others were in flight: nothing new
    /// starts, and once those end, what was done is undone.
    pub stopping: bool,
    pub steps: Vec<StepView>,
    pub timeline: Vec<TimelineEntry>,
    /// For a child order: the order and step that started it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentView>,
    /// For an order waiting for its concurrency key: where it stands in the key's line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_line: Option<InLine>,
    /// The group its messages carry ([`crate::fair`]): its tenant, with `#priority` for a
    /// priority order. Absent without fair queues.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    pub order: Order,
    pub created_at: String,
    pub updated_at: String,
}

/// Where an order waiting for its concurrency key stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InLine {
    #[serde(flatten)]
    pub standing: Standing,
    /// As `sas show` prints it: `customer/c-1: 1 running of 1, this order 2nd in line`.
    pub summary: String,
}

/// The order and step that started a child order.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ParentView {
    pub order_id: OrderId,
    pub step: String,
    /// For a step over a list: the element this child runs for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub element: Option<u32>,
}

/// A step as shown: its state, with its status as a reader means it ([`StepView::status`]),
/// and what it waits for if it waits.
#[derive(Clone, Debug, PartialEq)]
pub struct StepView {
    pub state: StepState,
    pub waiting: Option<Waiting>,
}

impl StepView {
    /// The step's status as shown: `in_progress` for a step under way (queued, in flight, or
    /// waiting: for its service, a time, an answer or its children), `undoing` for an undo under
    /// way, otherwise the status the record keeps (`not_started`, `done`, `failed`...).
    pub fn status(&self) -> &'static str {
        match (self.state.status, self.state.lease.is_some()) {
            (StepStatus::NotStarted, true) => "in_progress",
            (StepStatus::ToUndo, true) => "undoing",
            (status, _) => status.as_str(),
        }
    }
}

impl Serialize for StepView {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error as _;
        let mut shown = serde_json::to_value(&self.state).map_err(S::Error::custom)?;
        if let Some(fields) = shown.as_object_mut() {
            fields.insert("status".into(), self.status().into());
            if let Some(waiting) = &self.waiting {
                let waiting = serde_json::to_value(waiting).map_err(S::Error::custom)?;
                fields.insert("waiting".into(), waiting);
            }
        }
        shown.serialize(serializer)
    }
}

/// What a waiting step waits for, and until when: its time, when it wakes; or an answer from
/// outside, when the answer is due (after which the step fails, unanswered).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Waiting {
    #[serde(rename = "for")]
    pub what: WaitingFor,
    pub until: Timestamp,
}

/// An order as an operator sees it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OperatorView {
    #[serde(flatten)]
    pub view: OrderView,
    /// Who submitted it.
    pub owner: Owner,
    pub correlation_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    /// Steps whose effect is still in place after a failure or cancel and must be reverted by
    /// hand (or by redriving the compensation).
    pub needs_manual_undo: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alert: Option<AlertDelivery>,
    /// A cancel or pause waiting for the step in flight.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
    /// The latest operator commands applied, oldest first.
    pub commands: Vec<CommandEntry>,
    pub redrives: u32,
}

/// How a view shows the values kept in the payload store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Values {
    /// As references, read from the record alone.
    #[default]
    References,
    /// Whole, each read back from the store. One whose object is gone (past the retention)
    /// stays a reference.
    Whole,
}

impl Values {
    /// The `values` a query asks for (`references`, the default, or `whole`); `None` for
    /// anything else.
    pub fn asked(value: Option<&str>) -> Option<Values> {
        match value {
            None | Some("references") => Some(Values::References),
            Some("whole") => Some(Values::Whole),
            Some(_) => None,
        }
    }
}

/// Reads order views.
#[derive(Debug)]
pub struct StatusService<S, P = NoPayloads> {
    store: S,
    payloads: P,
}

impl<S: StateStore> StatusService<S> {
    pub fn new(store: S) -> Self {
        StatusService { store, payloads: NoPayloads }
    }
}

impl<S, P> StatusService<S, P> {
    /// The same service, reading whole values back from `payloads` when asked.
    pub fn keeping<K: Payloads>(self, payloads: K) -> StatusService<S, K> {
        StatusService { store: self.store, payloads }
    }
}

impl<S: StateStore, P: Payloads> StatusService<S, P> {
    /// The view of an order for `caller`, or `None` if there is no such order or it is
    /// someone else's: the two answers must not be told apart, or an id would say that an
    /// order exists.
    pub async fn get(&self, order_id: OrderId, caller: &Owner) -> Result<Option<OrderView>> {
        self.get_with(order_id, caller, Values::References).await
    }

    /// As [`StatusService::get`], with the stored values shown as `values` says.
    pub async fn get_with(
        &self,
        order_id: OrderId,
        caller: &Owner,
        values: Values,
    ) -> Result<Option<OrderView>> {
        let Some((order, state)) = self.load(order_id).await? else { return Ok(None) };
        if order.owner != *caller {
            return Ok(None);
        }
        let in_line = self.in_line(&state).await?;
        let mut view = view(order, state);
        view.in_line = in_line;
        if values == Values::Whole {
            self.read_back(&mut view).await?;
        }
        Ok(Some(view))
    }

    /// Replaces every reference in `view` by the value it stands for.
    async fn read_back(&self, view: &mut OrderView) -> Result<()> {
        let id = view.order_id;
        let values = std::iter::once(&mut view.order.0)
            .chain(view.steps.iter_mut().filter_map(|s| s.state.output.as_mut()));
        for value in values {
            match payload::resolve(&self.payloads, id, value).await {
                Ok(whole) => *value = whole,
                // Gone with the retention (or never there), or refused for good: the reference
                // stays, saying what it was and why it is not read back.
                Err(e) if !e.is_retryable() => {
                    if let Some(reference) = value.as_object_mut() {
                        let why = payload::unreadable(&e);
                        reference.insert(payload::UNREADABLE.into(), why.into());
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The operator's view of an order, whoever submitted it, with its stored values as
    /// `values` says; `None` if there is no such order.
    pub async fn operator_view(
        &self,
        order_id: OrderId,
        values: Values,
    ) -> Result<Option<OperatorView>> {
        let Some((order, mut state)) = self.load(order_id).await? else {
            return Ok(None);
        };
        let in_line = self.in_line(&state).await?;
        let mut view = OperatorView {
            owner: order.owner.clone(),
            needs_manual_undo: state.needs_manual_undo(),
            correlation_id: std::mem::take(&mut state.correlation_id),
            ended_at: state.ended_at.map(|t| t.to_rfc3339()),
            alert: state.alert,
            stop: state.stop.take(),
            commands: std::mem::take(&mut state.commands),
            redrives: state.redrives,
            view: view(order, state),
        };
        view.view.in_line = in_line;
        if values == Values::Whole {
            self.read_back(&mut view.view).await?;
        }
        Ok(Some(view))
    }

    /// Where `state` stands in its key's line, if it waits there: two reads of the keys'
    /// table, for waiting orders only.
    async fn in_line(&self, state: &StateRecord) -> Result<Option<InLine>> {
        let standing = super::line::standing(&self.store, state).await?;
        Ok(standing.map(|standing| InLine { summary: standing.to_string(), standing }))
    }

    async fn load(&self, order_id: OrderId) -> Result<Option<(OrderRecord, StateRecord)>> {
        let Some(state) = self.store.load(order_id, Read::Consistent).await? else {
            return Ok(None);
        };
        // A record written before orders were kept in their records has it in the orders table.
        let order = match state.order() {
            Some(order) => order,
            None => match self.store.load_order(order_id, Read::Consistent).await? {
                Some(order) => order,
                None => return Ok(None),
            },
        };
        Ok(Some((order, state)))
    }
}

fn view(order: OrderRecord, state: StateRecord) -> OrderView {
    let stopping = state.stopping();
    // The end of the earliest lease, not where the index holds the order (up to a minute
    // before it).
    let complete_by = state.earliest_lease().or(state.complete_by);
    OrderView {
        order_id: state.order_id,
        workflow: state.workflow,
        workflow_version: state.workflow_version,
        process_state: state.process_state,
        phase: state.phase,
        failure_count: state.failure_count,
        attempt: state.attempt,
        complete_by: complete_by.map(|t| t.to_rfc3339()),
        stopping,
        cause: state.cause,
        steps: state
            .steps
            .into_iter()
            .map(|s| StepView {
                waiting: s.waiting().map(|(what, until)| Waiting { what, until }),
                // A callback's token is for the party that answers it, which the event bus
                // reaches.
                state: StepState { token: None, ..s },
            })
            .collect(),
        timeline: state.timeline,
        parent: state.parent.map(|p| ParentView {
            order_id: p.order_id,
            step: p.step.name,
            element: p.step.element,
        }),
        in_line: None,
        group: state.group,
        order: order.order,
        created_at: state.created_at.to_rfc3339(),
        updated_at: state.updated_at.to_rfc3339(),
    }
}

/// A step of a workflow as an operator's console draws it: what it does, what it waits for,
/// and what undoes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StepOutline {
    pub name: String,
    /// `agent`, `wait`, `callback`, `child`, or `each` (a child, or a call, per element).
    pub kind: &'static str,
    /// The agent that performs it, or the workflow its children run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runs: Option<String>,
    pub depends_on: Vec<String>,
    /// Its input beside the order's: the steps whose outputs its request carries, every step
    /// it depends on, directly or through others, in the order the workflow declares them.
    /// Its undo is given its own output too.
    pub given: Vec<String>,
    /// The action that undoes it, if it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub undo: Option<String>,
    /// `undo`: its failure undoes the order; `report`: the order goes on without it.
    pub on_failure: &'static str,
}

/// The steps of `workflow`, in the order it declares them.
pub fn outline(workflow: &Workflow) -> Vec<StepOutline> {
    workflow
        .steps()
        .iter()
        .map(|step| {
            let (kind, runs) = match &step.work {
                Work::Agent(agent) => ("agent", Some(agent.to_string())),
                Work::Wait(_) => ("wait", None),
                Work::Callback => ("callback", None),
                Work::Child(child) if child.fan.is_some() => ("each", Some(child.workflow.clone())),
                Work::Child(child) => ("child", Some(child.workflow.clone())),
            };
            StepOutline {
                name: step.name.clone(),
                kind,
                runs,
                depends_on: step.depends_on.clone(),
                given: {
                    let upstream = workflow.upstream(&step.name);
                    let declared = workflow.steps().iter().map(|s| s.name.as_str());
                    declared.filter(|s| upstream.contains(s)).map(str::to_owned).collect()
                },
                undo: step.compensation.as_ref().map(|c| c.action.clone()),
                on_failure: match step.on_failure {
                    OnFailure::Undo => "undo",
                    OnFailure::Report => "report",
                },
            }
        })
        .collect()
}
