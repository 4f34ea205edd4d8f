//! Submission: validates an order, writes its state record with the order in it, and kicks
//! the scheduler. Idempotent on the client's key.
//!
//! The one write is a conditional put: an order is accepted once its record is written, and a
//! key sent again finds the record and compares the order it holds. A submission that dies
//! after the write leaves an order nobody kicked, which the client's retry (or the supervisor)
//! starts.
//!
//! An input too large to carry in every request is stored first ([`crate::payload`]), after
//! the door let the order in, so that a refused order writes nothing anywhere.
//!
//! It is also the door: before it writes, it checks that a new order would not wait in the
//! queues longer than the deployment accepts ([`crate::load`]), and refuses it with a time to
//! come back otherwise. Accepting an order it could only serve late would make every order
//! later, and the backlog longer.

use std::sync::Mutex;

use tracing::{info, warn};

use super::effects::Ports;
use crate::error::{Error, Result};
use crate::fair::{self, Shares};
use crate::ids::{IdempotencyKey, OrderId, Owner};
use crate::load::{Admission, Cached, DoorTally, LoadSource};
use crate::machine::{self, Ctx, Decision, Input, decide};
use crate::order::{Order, Rejection};
use crate::payload::{self, Kept, MAX_INLINE_INPUT_LEN, MAX_PAYLOAD_LEN, NoPayloads};
use crate::ports::{Clock, Created, EventBus, Ids, Outbox, Payloads, Read, StateStore};
use crate::state::{StateRecord, Submitted};
use crate::time::Timestamp;
use crate::workflow::Workflow;

/// The result of a successful submission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Accepted {
    pub order_id: OrderId,
    /// False when the key had been used before for the same order: the existing order is
    /// returned and nothing new was written.
    pub created: bool,
}

/// What a caller asks of a new order besides its input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Asked<'a> {
    /// The workflow it runs; `None`: the stack's default one.
    pub workflow: Option<&'a str>,
    /// `high` marks it a priority of its tenant ([`crate::fair`]), as its workflow's
    /// `fairness.priority` may; `normal` (or `None`) leaves that to its input.
    pub priority: Option<&'a str>,
}

impl Asked<'_> {
    /// Whether the caller asked for a priority order, or why what it asked is not a priority.
    fn priority(&self) -> Result<bool> {
        match self.priority {
            None | Some("normal") => Ok(false),
            Some("high") => Ok(true),
            Some(_) => {
                Err(Error::InvalidOrder(Rejection::one("priority", "must be `high` or `normal`")))
            }
        }
    }
}

/// The submission service, over its ports.
#[derive(Debug)]
pub struct Submission<S, Q, B, C, I, L, P = NoPayloads> {
    ports: Ports<S, Q, B, C, P>,
    ids: I,
    load: Cached<L>,
    /// What this door did since the load in use was read.
    tally: Mutex<DoorTally>,
    /// The orders this door let in that may still wait, by tenant.
    shares: Mutex<Shares>,
}

impl<S, Q, B, C, I, L, P> Submission<S, Q, B, C, I, L, P> {
    /// `load` tells how long the queues are; it is read at most every few seconds. Inputs
    /// larger than [`MAX_INLINE_INPUT_LEN`] are stored in the ports' payloads
    /// ([`crate::payload`]); with none, an input is kept whole up to [`MAX_PAYLOAD_LEN`].
    pub fn new(ports: Ports<S, Q, B, C, P>, ids: I, load: L) -> Self {
        Submission {
            ports,
            ids,
            load: Cached::new(load),
            tally: Mutex::default(),
            shares: Mutex::default(),
        }
    }
}

impl<S, Q, B, C, I, L, P> Submission<S, Q, B, C, I, L, P>
where
    S: StateStore,
    Q: Outbox,
    B: EventBus,
    C: Clock,
    I: Ids,
    L: LoadSource,
    P: Payloads,
{
    /// Accepts an order. Invalid input is rejected before anything is written, and so is an
    /// order that would wait too long in the queues ([`Error::Overloaded`]). The same key with
    /// the same order returns the existing order; with a different order it is refused.
    pub async fn submit(&self, key: &str, body: &[u8]) -> Result<Accepted> {
        self.submit_as(&Owner::anonymous(), key, body).await
    }

    /// Accepts an order for `owner`, whose keys are its own (see [`Submission::submit`]).
    pub async fn submit_as(&self, owner: &Owner, key: &str, body: &[u8]) -> Result<Accepted> {
        self.submit_to(owner, None, key, body).await
    }

    /// Accepts an order of the workflow `workflow` (its newest version), or of the default
    /// workflow if it names none (see [`crate::catalogue::Catalogue::for_new_order`]), for `owner`. Its input is
    /// checked against that workflow's schema.
    pub async fn submit_to(
        &self,
        owner: &Owner,
        workflow: Option<&str>,
        key: &str,
        body: &[u8],
    ) -> Result<Accepted> {
        self.submit_asking(owner, Asked { workflow, priority: None }, key, body).await
    }

    /// Accepts an order for `owner` as it asks ([`Asked`]: its workflow, a priority); see
    /// [`Submission::submit_to`]. A key sent again returns its order as first accepted, at the
    /// priority it was first given.
    pub async fn submit_asking(
        &self,
        owner: &Owner,
        asked: Asked<'_>,
        key: &str,
        body: &[u8],
    ) -> Result<Accepted> {
        let key = IdempotencyKey::parse(key)?;
        let priority = asked.priority()?;
        let workflow: &Workflow = self
            .ports
            .catalogue
            .for_new_order(asked.workflow)
            .map_err(|why| Error::InvalidOrder(Rejection::one("workflow", why)))?;
        refuse_too_large(body)?;
        let order = workflow.input(body)?;
        let order_id = OrderId::for_owner_key(owner, &key);
        let now = self.ports.clock.now();
        let wakes = workflow.wakes(&order.0, now)?;
        let line = workflow.key_of(&order.0)?;
        let group = workflow.group_of(&order.0, owner, priority)?;
        let group = self.ports.config.fair_queues.then_some(group);
        self.admit(now, workflow, group.as_deref()).await?;
        // Read before a large input is stored and only referred to.
        let search_key = workflow.search_value(&order.0);
        let order = self.keep(order_id, order).await?;
        let ctx = Ctx { now, config: &self.ports.config, workflow, seed: 0 };
        let mut created = machine::create_waking(order_id, self.ids.new_id(), &wakes, line, &ctx);
        created.next.group = group;
        created.next.search_key = search_key;
        created.next.submitted = Some(Submitted { owner: owner.clone(), key, input: order });

        match self.ports.store.create_state(&created.next).await? {
            Created::Created => {
                info!(%order_id, correlation_id = %created.next.correlation_id, "order accepted");
                crate::metrics::accepted();
                self.ports.perform(&created.next, &created.effects).await?;
                Ok(Accepted { order_id, created: true })
            }
            // The key was used before, or a submission of it is racing this one.
            Created::AlreadyExists => {
                let Some(current) = self.ports.store.load(order_id, Read::Consistent).await? else {
                    // Forgotten since (its retention ran out): the client may send it again.
                    return Err(Error::unavailable(
                        "state store",
                        "the order of this key was being forgotten; send it again",
                    ));
                };
                let existing = self.ports.order_of(&current).await?;
                let asked = created.next.submitted.as_ref().map(|s| &s.input);
                if Some(&existing.order) != asked {
                    return Err(Error::KeyReused { existing: order_id });
                }
                self.resubmitted(&current, workflow).await
            }
        }
    }

    /// The input as the order keeps it: whole, or stored and referred to.
    async fn keep(&self, order_id: OrderId, order: Order) -> Result<Order> {
        let inline =
            if self.ports.payloads.stores() { MAX_INLINE_INPUT_LEN } else { MAX_PAYLOAD_LEN };
        match payload::keep(&self.ports.payloads, order_id, order.0, inline).await? {
            Kept::Inline(value) | Kept::Stored(value) => Ok(Order(value)),
            // Within the size limit, only an input shaped like a stored reference, with no
            // store to put it in, gets here.
            Kept::TooLarge { .. } => Err(Error::InvalidOrder(Rejection::one(
                "",
                "an input whose only field is `$stored`, which stands for a stored value here",
            ))),
        }
    }

    /// The answer to an order submitted again, already accepted as `current`: the same order,
    /// with whatever its first submission may not have done (its start message, its first
    /// event) done again; a refusal if the key was used for another workflow.
    async fn resubmitted(&self, current: &StateRecord, workflow: &Workflow) -> Result<Accepted> {
        if current.workflow != workflow.name() {
            return Err(Error::KeyReused { existing: current.order_id });
        }
        let workflow = self.ports.catalogue.of(current)?;
        let ctx =
            Ctx { now: self.ports.clock.now(), config: &self.ports.config, workflow, seed: 0 };
        if let Decision::Replay(effects) = decide(current, Input::Resubmit, &ctx) {
            self.ports.perform(current, &effects).await?;
        }
        Ok(Accepted { order_id: current.order_id, created: false })
    }

    /// Now, by its clock.
    pub(super) fn now(&self) -> Timestamp {
        self.ports.clock.now()
    }

    /// Refuses a new order while the queues would keep it waiting longer than
    /// `max_queue_wait` in all. If the queues cannot be read, the order is let in: the door must not
    /// turn away orders because a metric is missing.
    ///
    /// With fair queues, an order of `group` waits behind its tenant's part of the backlog only
    /// ([`Shares::part`]): a tenant that floods the door is refused for its own backlog, and
    /// the others are let in while their part of it is short.
    async fn admit(&self, now: Timestamp, workflow: &Workflow, group: Option<&str>) -> Result<()> {
        let load = match self.load.load(now).await {
            Ok(load) => load,
            Err(e) => {
                warn!(error = %e, "the queues' load is unknown: the order is let in");
                return Ok(());
            }
        };
        let tenant = group.map(fair::tenant_of);
        let mut shares = self.shares.lock().unwrap_or_else(|e| e.into_inner());
        let part = tenant.map_or(1.0, |t| shares.part(t, now));
        let mut tally = self.tally.lock().unwrap_or_else(|e| e.into_inner());
        let so_far = tally.for_load(&load);
        match load.admission(self.ports.config.max_queue_wait, workflow, &so_far, part) {
            Admission::Admit { expected_wait } => {
                tally.admitted += 1;
                if let Some(tenant) = tenant {
                    shares.admitted(tenant, now, expected_wait);
                }
                Ok(())
            }
            Admission::Refuse { busiest, expected_wait, retry_after } => {
                tally.refused += 1;
                info!(busiest = %busiest.name(), expected_wait_s = expected_wait.as_secs(), "order refused at the door");
                Err(Error::Overloaded { busiest: busiest.name(), expected_wait, retry_after })
            }
        }
    }
}

/// Refuses an input larger than [`MAX_PAYLOAD_LEN`] bytes of JSON as it is kept (without the
/// spaces a client may have put between its values), before its schema is checked.
fn refuse_too_large(body: &[u8]) -> Result<()> {
    if body.len() <= MAX_PAYLOAD_LEN {
        return Ok(());
    }
    // A body that is not JSON is left for the schema check to name.
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else { return Ok(()) };
    let len = serde_json::to_vec(&value).map_or(usize::MAX, |b| b.len());
    if len <= MAX_PAYLOAD_LEN {
        return Ok(());
    }
    let why = format!("{len} bytes of JSON, more than the {MAX_PAYLOAD_LEN} an order may have");
    Err(Error::InvalidOrder(Rejection::one("", why)))
}
