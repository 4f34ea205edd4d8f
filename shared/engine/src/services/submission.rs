//! Submission: validates an order, writes it with its state record in one transaction, and
//! kicks the scheduler. Idempotent on the client's key.

use std::sync::Arc;
use std::time::Duration;

use tracing::info;

use super::effects::Effector;
use crate::config::EngineConfig;
use crate::error::{Error, Result};
use crate::events::StatusKind;
use crate::ids::{IdempotencyKey, OrderId};
use crate::machine::Effect;
use crate::order::Order;
use crate::ports::{Clock, Created, EventBus, Ids, OrderRecord, Outbox, Read, StateStore};
use crate::state::{InputRef, ProcessState, StateRecord};
use crate::workflow::Workflow;

/// The result of a successful submission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Accepted {
    pub order_id: OrderId,
    /// False when the key had been used before for the same order: the existing order is
    /// returned and nothing new was written.
    pub created: bool,
}

/// The submission service, over its ports.
#[derive(Debug)]
pub struct Submission<S, Q, B, C, I> {
    ports: Effector<S, Q, B, C>,
    ids: I,
}

impl<S: StateStore, Q: Outbox, B: EventBus, C: Clock, I: Ids> Submission<S, Q, B, C, I> {
    pub fn new(
        store: S,
        outbox: Q,
        bus: B,
        clock: C,
        ids: I,
        config: Arc<EngineConfig>,
        workflow: Arc<Workflow>,
    ) -> Self {
        Submission { ports: Effector { store, outbox, bus, clock, config, workflow }, ids }
    }

    /// Accepts an order. Invalid input is rejected before anything is written. The same key
    /// with the same order returns the existing order; with a different order it is refused.
    pub async fn submit(&self, key: &str, body: &[u8]) -> Result<Accepted> {
        let key = IdempotencyKey::parse(key)?;
        let order = Order::from_json(body)?;
        let order_id = OrderId::for_key(&key);
        let now = self.ports.clock.now();
        let state = StateRecord::new(
            order_id,
            &self.ports.workflow,
            &self.ports.config,
            self.ids.new_id(),
            now,
        );
        let record = OrderRecord { order_id, idempotency_key: key, order, created_at: now };

        match self.ports.store.create(&record, &state).await? {
            Created::Created => {
                info!(%order_id, "order accepted");
                self.kick(&state).await?;
                Ok(Accepted { order_id, created: true })
            }
            Created::AlreadyExists => {
                let existing =
                    self.ports.store.load_order(order_id, Read::Consistent).await?.ok_or_else(
                        || Error::Corrupt {
                            order_id,
                            reason: "order reported as existing but not found".into(),
                        },
                    )?;
                if existing.order != record.order {
                    return Err(Error::KeyReused { existing: order_id });
                }
                // The first submission may have died between its write and its start message:
                // while the order has not been claimed even once, send it again (a duplicate
                // start leads to one claim).
                if let Some(current) = self.ports.store.load(order_id, Read::Consistent).await? {
                    if current.process_state == ProcessState::Pending
                        && current.last_input == InputRef::Submit
                    {
                        self.kick(&current).await?;
                    }
                }
                Ok(Accepted { order_id, created: false })
            }
        }
    }

    async fn kick(&self, state: &StateRecord) -> Result<()> {
        let mut effects = vec![Effect::Kick { delay: Duration::ZERO }];
        if self.ports.config.status_events.contains(StatusKind::Received) {
            effects.push(Effect::Status { kind: StatusKind::Received, step: None });
        }
        self.ports.perform(state, &effects).await
    }
}
