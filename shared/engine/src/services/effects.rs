//! Performing the side effects of a decision: messages to queues, events to the bus, and the
//! bookkeeping of the one alert an order in Error gets.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use tracing::{debug, warn};

use crate::catalogue::Catalogue;
use crate::config::EngineConfig;
use crate::error::{Error, Result};
use crate::events::{Alert, BusEvent, Callback};
use crate::ids::{Direction, step_key};
use crate::keys::Queued;
use crate::machine::{Ctx, Decision, Effect, Input, decide};
use crate::message::{Message, Start, StepRef, StepRequest};
use crate::payload::NoPayloads;
use crate::ports::{
    Clock, Destination, ENTRY_TRIES, EventBus, Expected, OrderRecord, Outbox, Outgoing, Payloads,
    Read, Saved, StateStore,
};
use crate::state::{Cause, CommandKind, ProcessState, StateRecord, StepStatus};
use crate::time::Timestamp;

/// Conflicts tolerated while recording that an alert was sent or a place given back; each one
/// means another writer touched the record, which can only happen a few times.
const RECORD_TRIES: usize = 3;

/// The ports and settings that every service writing orders shares, given to each as one
/// bundle: the state store, the outbox, the event bus and the clock, with the engine's
/// configuration and the workflows the stack runs. The services carry out the side effects
/// of their decisions through them.
#[derive(Clone, Debug)]
pub struct Ports<S, Q, B, C, P = NoPayloads> {
    pub store: S,
    pub outbox: Q,
    pub bus: B,
    pub clock: C,
    pub config: Arc<EngineConfig>,
    pub catalogue: Arc<Catalogue>,
    /// Where large values are kept: read back to start a child on part of one, and where a
    /// child's outputs are kept for its parent ([`crate::payload`]).
    pub payloads: P,
}

impl<S: StateStore, Q: Outbox, B: EventBus, C: Clock, P: Payloads> Ports<S, Q, B, C, P> {
    /// What the machine decides `record`'s next transition with, now: the version of its
    /// workflow it started on.
    pub fn ctx(&self, record: &StateRecord) -> Result<Ctx<'_>> {
        Ok(Ctx {
            now: self.clock.now(),
            config: &self.config,
            workflow: self.catalogue.of(record)?,
            // The tokens of callbacks must be beyond guessing.
            seed: uuid::Uuid::new_v4().as_u128(),
        })
    }

    /// Writes `next` over `record`, expecting it unchanged, and counts what the transition
    /// did if the write took.
    pub async fn save(&self, record: &StateRecord, next: &StateRecord) -> Result<Saved> {
        let saved = self.store.save(next, Expected::of(record)).await?;
        if saved == Saved::Saved {
            crate::metrics::saved(record, next);
        }
        Ok(saved)
    }

    /// Performs `effects` of `record` (the record as written): messages first, then events. Any
    /// failure is returned, so the input is retried and the effects replayed; duplicates are
    /// harmless by design.
    pub async fn perform(&self, record: &StateRecord, effects: &[Effect]) -> Result<()> {
        let now = self.clock.now();
        let mut outgoing = Vec::new();
        let mut events = Vec::new();
        let mut alert_at = None;
        for effect in effects {
            match effect {
                Effect::Dispatch { step } => {
                    outgoing.push(self.request(record, *step, now).await?);
                }
                Effect::Announce { step } => {
                    events.push(self.announcement(record, *step, now).await?)
                }
                Effect::Kick { delay, attempt } => outgoing.push(Outgoing::later(
                    Destination::Scheduler,
                    Message::Start(Start {
                        order_id: record.order_id,
                        attempt: *attempt,
                        correlation_id: record.correlation_id.clone(),
                        due_at: Some(now.plus(*delay)),
                        group: record.group.clone(),
                    }),
                    *delay,
                )),
                Effect::Status { kind, step } => {
                    events.push(BusEvent::status(record, *kind, step.clone(), now))
                }
                Effect::Alert => {
                    let alert = alert_for(record, now).ok_or_else(|| Error::Corrupt {
                        order_id: record.order_id,
                        reason: "alert for an order without a failure cause".into(),
                    })?;
                    alert_at = Some(events.len());
                    events.push(BusEvent::alert(&alert));
                }
                Effect::Child { step } => outgoing.extend(self.child(record, *step).await?),
                // A call in flight cannot be stopped: its answer is waited for.
                Effect::StopChild { step } if super::fanout::is_inline(record, *step) => {}
                Effect::StopChild { step } => self.stop_child(record, *step).await?,
                Effect::Count { step } => self.count(record, *step).await?,
                Effect::Elements { step, elements } => {
                    outgoing.extend(self.elements(record, *step, elements).await?)
                }
                Effect::ElementsAgain { step, elements, delay } => {
                    outgoing.extend(self.element_calls(record, *step, elements, *delay).await?)
                }
                Effect::Collect { step } => outgoing.push(self.collect(record, *step).await?),
                Effect::DropPages => self.drop_pages(record).await?,
                Effect::TellParent => outgoing.extend(self.tell_parent(record)),
                Effect::Join => {
                    if let Some(slot) = &record.slot {
                        self.store.join(&slot.key, &Queued::of(record, slot)).await?;
                    }
                }
                Effect::Release => {
                    self.release(record).await?;
                    self.record_released(record).await?;
                }
            }
        }
        if !outgoing.is_empty() {
            self.outbox.send(&outgoing).await?;
        }
        if events.is_empty() {
            return Ok(());
        }
        let refused = self.publish_each_once(&events).await?;
        let alert_published = alert_at.is_some_and(|i| !refused.iter().any(|(f, _)| *f == i));
        if alert_published {
            self.record_alert_sent(record).await?;
        }
        if let Some((_, reason)) = refused.first() {
            return Err(Error::PublishFailed {
                failed: refused.len(),
                total: events.len(),
                first_reason: reason.clone(),
            });
        }
        Ok(())
    }

    /// Publishes `events`, then again, alone, the entries the bus refused, up to
    /// [`ENTRY_TRIES`] tries: publishing the accepted ones again would only duplicate them.
    /// Returns the entries (by position in `events`) still refused, with the bus's reason.
    async fn publish_each_once(&self, events: &[BusEvent]) -> Result<Vec<(usize, String)>> {
        let mut pending: Vec<usize> = (0..events.len()).collect();
        let mut refused = Vec::new();
        for _ in 0..ENTRY_TRIES {
            let batch: Vec<BusEvent> = pending.iter().map(|&i| events[i].clone()).collect();
            let report = self.bus.publish(&batch).await?;
            refused = report
                .failed
                .into_iter()
                .filter_map(|(at, why)| pending.get(at).map(|&i| (i, why)))
                .collect();
            if refused.is_empty() {
                break;
            }
            pending = refused.iter().map(|(i, _)| *i).collect();
        }
        Ok(refused)
    }

    /// Builds the request for the lease of step `index` (to do or to undo it), sent at `now`.
    async fn request(
        &self,
        record: &StateRecord,
        index: usize,
        now: Timestamp,
    ) -> Result<Outgoing> {
        let corrupt = |reason: String| Error::Corrupt { order_id: record.order_id, reason };
        let (state, lease) =
            record.steps.get(index).and_then(|s| Some((s, *s.sent()?))).ok_or_else(|| {
                corrupt(format!("dispatch of step {index}, whose lease was not sent"))
            })?;
        let direction = state.direction();
        let workflow = self.catalogue.of(record)?;
        let step = workflow
            .step_named(&state.name)
            .ok_or_else(|| corrupt(format!("step {:?} is not in the workflow", state.name)))?;
        let (action, budget) = step
            .action(direction)
            .ok_or_else(|| corrupt(format!("step {:?} has no compensation", state.name)))?;
        let order = self.order_of(record).await?;
        let request = StepRequest {
            order_id: record.order_id,
            attempt: lease.attempt,
            correlation_id: record.correlation_id.clone(),
            step: StepRef { index, name: state.name.clone(), direction, element: None },
            action: action.to_owned(),
            complete_by: lease.complete_by,
            idempotency_key: step_key(record.order_id, &state.name, direction, state.generation),
            order: order.order,
            input: if direction == Direction::Undo { state.output.clone() } else { None },
            outputs: if direction == Direction::Do {
                outputs_of(record, &workflow.upstream(&state.name))
            } else {
                Default::default()
            },
            due_at: Some(now),
            budget_ms: Some(u64::try_from(budget.as_millis()).unwrap_or(u64::MAX)),
            resumed: lease.held_since.is_some(),
            last_lease: lease.failures.saturating_add(1)
                >= step.lease_limit(self.config.failure_threshold),
            group: record.group.clone(),
        };
        let agent = step.agent().ok_or_else(|| corrupt(format!("step {:?} waits", state.name)))?;
        Ok(Outgoing::now(Destination::Agent(agent.clone()), Message::Request(Box::new(request))))
    }

    /// The announcement of the callback step `index` waits for.
    async fn announcement(
        &self,
        record: &StateRecord,
        index: usize,
        now: Timestamp,
    ) -> Result<BusEvent> {
        let corrupt = |reason: String| Error::Corrupt { order_id: record.order_id, reason };
        let (state, lease, token) = record
            .steps
            .get(index)
            .and_then(|s| Some((s, *s.sent()?, s.token.clone()?)))
            .ok_or_else(|| corrupt(format!("announcement of step {index}, which has no token")))?;
        let workflow = self.catalogue.of(record)?;
        let step = workflow
            .step_named(&state.name)
            .ok_or_else(|| corrupt(format!("step {:?} is not in the workflow", state.name)))?;
        let order = self.order_of(record).await?;
        let callback = Callback {
            order_id: record.order_id,
            workflow: record.workflow.clone(),
            workflow_version: record.workflow_version,
            step: state.name.clone(),
            token,
            answer_by: lease.complete_by,
            timeout_seconds: step.budget.as_secs(),
            answer_path: format!("/orders/{}/steps/{}", record.order_id, state.name),
            order: order.order.0,
            outputs: outputs_of(record, &workflow.upstream(&state.name)),
            at: now,
            correlation_id: record.correlation_id.clone(),
        };
        Ok(BusEvent::callback(&callback, lease.attempt))
    }

    /// The order `record` is the state of: kept in the record, or, for a record written
    /// before orders were, in the orders table.
    pub(super) async fn order_of(&self, record: &StateRecord) -> Result<OrderRecord> {
        if let Some(order) = record.order() {
            return Ok(order);
        }
        // An order never changes once written, so any copy found is the copy; only one written
        // a moment ago can be missed by the cheaper read.
        if let Some(order) = self.store.load_order(record.order_id, Read::Eventual).await? {
            return Ok(order);
        }
        self.store.load_order(record.order_id, Read::Consistent).await?.ok_or_else(|| {
            Error::Corrupt {
                order_id: record.order_id,
                reason: "state record without its order".into(),
            }
        })
    }

    /// Records that `written`'s place was given back: it leaves the expiry index. If that
    /// cannot be written, the supervisor gives the place back once more later.
    async fn record_released(&self, written: &StateRecord) -> Result<()> {
        self.record_done(written, Input::Released, "its place given back").await
    }

    /// Marks the alert as sent. The alert is out; if that cannot be written, the supervisor
    /// publishes it once more later rather than lose it.
    async fn record_alert_sent(&self, written: &StateRecord) -> Result<()> {
        self.record_done(written, Input::AlertSent, "its alert sent").await
    }

    /// Writes what `input` records of `written`, re-reading the record if someone wrote it
    /// meanwhile; nothing if it is already recorded.
    async fn record_done(&self, written: &StateRecord, input: Input<'_>, what: &str) -> Result<()> {
        let mut record = written.clone();
        for _ in 0..RECORD_TRIES {
            let ctx = self.ctx(&record)?;
            let Decision::Apply(t) = decide(&record, input, &ctx) else {
                debug!(order_id = %record.order_id, what, "already recorded");
                return Ok(());
            };
            if self.save(&record, &t.next).await? == Saved::Saved {
                return Ok(());
            }
            match self.store.load(record.order_id, Read::Consistent).await? {
                Some(fresh) => record = fresh,
                None => return Ok(()),
            }
        }
        warn!(order_id = %written.order_id, what, "could not record it");
        Ok(())
    }
}

/// The alert of an order in Error, or processed with reported failures; `None` if the record
/// has neither a cause nor a report.
pub(crate) fn alert_for(record: &StateRecord, now: Timestamp) -> Option<Alert> {
    let reported: Vec<Cause> =
        record.steps.iter().filter_map(|s| s.reported.as_ref()).map(Cause::without_text).collect();
    let cause = match &record.cause {
        Some(cause) => cause.without_text(),
        None => reported.first()?.clone(),
    };
    let processed = record.process_state == ProcessState::Processed;
    let needs_manual_undo = record.needs_manual_undo();
    let id = record.order_id;
    // The first failure keeps the plain id it always had; a failure after a redrive, or an undo
    // of a processed order that left something to undo by hand, has one of its own.
    let mut alert_id = match record.redrives {
        0 => format!("{id}/alert"),
        n => format!("{id}/alert/{n}"),
    };
    if let Some(undo) = record.commands.last().filter(|c| c.command == CommandKind::Undo)
        && !processed
    {
        alert_id = format!("{alert_id}/undo/{}", undo.id);
    }
    Some(Alert {
        alert_id,
        order_id: id,
        workflow: record.workflow.clone(),
        workflow_version: record.workflow_version,
        failed_step: cause.step().map(str::to_owned),
        cause,
        undone: record
            .steps
            .iter()
            .filter(|s| s.status == StepStatus::Undone)
            .map(|s| s.name.clone())
            .collect(),
        state: record.process_state,
        reported,
        fully_compensated: !processed && needs_manual_undo.is_empty(),
        show_command: format!("sas show {id}"),
        redrive_command: if processed {
            String::new()
        } else if needs_manual_undo.is_empty() {
            format!("sas redrive {id} --reason '<what was fixed>'")
        } else {
            format!("sas redrive {id} --compensation --reason '<what was fixed>'")
        },
        needs_manual_undo,
        failure_count: record.failure_count,
        redrives: record.redrives,
        at: now,
        correlation_id: record.correlation_id.clone(),
    })
}

/// The outputs of `steps` that are done, by step name.
fn outputs_of(record: &StateRecord, steps: &HashSet<&str>) -> BTreeMap<String, serde_json::Value> {
    record
        .steps
        .iter()
        .filter(|s| s.status == StepStatus::Done && steps.contains(s.name.as_str()))
        .filter_map(|s| Some((s.name.clone(), s.output.clone()?)))
        .collect()
}
