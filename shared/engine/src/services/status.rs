//! The status view of one order: what `GET /orders/{id}` returns.

use serde::Serialize;

use crate::error::Result;
use crate::ids::OrderId;
use crate::order::Order;
use crate::ports::{Read, StateStore};
use crate::state::{Cause, Phase, ProcessState, StepState, TimelineEntry};

/// An order with its state, steps and timeline, as shown to clients.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OrderView {
    pub order_id: OrderId,
    pub process_state: ProcessState,
    pub phase: Phase,
    pub failure_count: u32,
    pub attempt: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub complete_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
    pub steps: Vec<StepState>,
    pub timeline: Vec<TimelineEntry>,
    pub order: Order,
    pub created_at: String,
    pub updated_at: String,
}

/// Reads order views.
#[derive(Debug)]
pub struct StatusService<S> {
    store: S,
}

impl<S: StateStore> StatusService<S> {
    pub fn new(store: S) -> Self {
        StatusService { store }
    }

    /// The view of an order, or `None` if there is no such order.
    pub async fn get(&self, order_id: OrderId) -> Result<Option<OrderView>> {
        let Some(order) = self.store.load_order(order_id, Read::Consistent).await? else {
            return Ok(None);
        };
        let Some(state) = self.store.load(order_id, Read::Consistent).await? else {
            return Ok(None);
        };
        Ok(Some(OrderView {
            order_id,
            process_state: state.process_state,
            phase: state.phase,
            failure_count: state.failure_count,
            attempt: state.attempt,
            complete_by: state.complete_by.map(|t| t.to_rfc3339()),
            cause: state.cause,
            steps: state.steps,
            timeline: state.timeline,
            order: order.order,
            created_at: state.created_at.to_rfc3339(),
            updated_at: state.updated_at.to_rfc3339(),
        }))
    }
}
