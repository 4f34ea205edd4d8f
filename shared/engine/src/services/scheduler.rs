//! The scheduler: claims Pending orders, dispatches steps to agents, records their replies and
//! moves each order to its next step, to compensation, or to its end.

use std::time::Duration;

use tracing::{debug, error, info};

use super::Handled;
use super::effects::Ports;
use crate::error::{Error, Result};
use crate::ids::OrderId;
use crate::load::WaitReporter;
use crate::machine::{Decision, Ignored, Input, Remedy, Transition, decide, remedy};
use crate::message::{Message, StepReply};
use crate::payload::NoPayloads;
use crate::ports::{
    Clock, Destination, EventBus, Incoming, Outbox, Payloads, Read, Saved, StateStore, WaitGauge,
};
use crate::state::StateRecord;

/// Consistent reads a message is judged on before it goes back to its queue: each conflict is
/// another writer's transition, and an order has at most a few at once (its steps in flight,
/// the supervisor, an operator).
const CONFLICT_TRIES: usize = 8;

/// The scheduler, over its ports.
#[derive(Debug)]
pub struct Scheduler<S, Q, B, C, W, P = NoPayloads> {
    ports: Ports<S, Q, B, C, P>,
    waits: WaitReporter<W>,
    owner: String,
}

impl<S, Q, B, C, W, P> Scheduler<S, Q, B, C, W, P>
where
    S: StateStore,
    Q: Outbox,
    B: EventBus,
    C: Clock,
    W: WaitGauge,
    P: Payloads,
{
    /// `owner` identifies this scheduler instance; it is written to LockedBy when it claims,
    /// and names its reports to `waits`.
    pub fn new(ports: Ports<S, Q, B, C, P>, waits: W, owner: String) -> Self {
        Scheduler {
            waits: WaitReporter::new(waits, owner.clone(), ports.config.claim_grace),
            ports,
            owner,
        }
    }

    /// The outbox this scheduler sends through (a batch consumer flushes it).
    pub fn outbox(&self) -> &Q {
        &self.ports.outbox
    }

    /// Handles one message from the scheduler queue or the reply queue.
    ///
    /// `Ok` means the message is done with (whatever [`Handled`] says) and can be deleted. A
    /// retryable `Err` means it should come back; a non-retryable one means it never will work
    /// (a request sent to the wrong queue, a corrupt record) and belongs in a dead-letter queue.
    ///
    /// `incoming.message_id` is the id the queue gave the message; it stays the same when the
    /// message is delivered again, which is how a redelivery is told from a duplicate. How long
    /// the message waited is reported for its queue.
    pub async fn handle(&self, message: &Message, incoming: Incoming<'_>) -> Result<Handled> {
        let queue = match message {
            Message::Start(_) | Message::ChildEnded(_) | Message::Event(_) => {
                Destination::Scheduler
            }
            _ => Destination::Replies,
        };
        let now = self.ports.clock.now();
        // The scheduler acts on a message at once: no work follows the wait.
        self.waits.observe(&queue, message.due_at(), incoming, now, Duration::ZERO).await;
        let message_id = incoming.message_id;
        match message {
            Message::Start(start) => {
                let input = Input::Claim {
                    attempt: start.attempt,
                    owner: &self.owner,
                    message: message_id,
                };
                self.run(start.order_id, input).await
            }
            Message::Reply(reply) => self.on_reply(reply, message_id).await,
            Message::ChildEnded(ended) => {
                let Some(outcome) = self.ports.outcome_of_child(ended).await? else {
                    // Word of an end the child has left since (its parent undoes it now, and
                    // it will say again how that ends): late, and nothing to act on.
                    let why = Ignored::Stale { received: ended.attempt, current: ended.attempt };
                    return Ok(Handled::Ignored(why));
                };
                let input = Input::Reply {
                    attempt: ended.attempt,
                    step: &ended.step,
                    outcome: &outcome,
                    message: message_id,
                };
                self.run(ended.order_id, input).await
            }
            Message::Request(_) => {
                Err(Error::InvalidMessage("a step request was sent to the scheduler".into()))
            }
            // Its consumer hands an event to the starter ([`super::Starter`]), never here.
            Message::Event(_) => {
                Err(Error::InvalidMessage("an event was handed to the scheduler".into()))
            }
        }
    }

    async fn on_reply(&self, reply: &StepReply, message_id: &str) -> Result<Handled> {
        let input = Input::Reply {
            attempt: reply.attempt,
            step: &reply.step,
            outcome: &reply.outcome,
            message: message_id,
        };
        self.run(reply.order_id, input).await
    }

    async fn run(&self, order_id: OrderId, input: Input<'_>) -> Result<Handled> {
        // Nearly every message finds the record as the write before it left it, so the cheaper
        // eventual read comes first. It is trusted only when it leads to a write that succeeds:
        // that write's condition proves the copy was the latest. Anything else (a conflict, or
        // a message that looks stale, repeated or impossible against the copy) is judged again
        // on a consistent read.
        // An order waiting in its key's line is judged on a consistent read, after a look at
        // the line.
        if let Some(record) = self.ports.store.load(order_id, Read::Eventual).await?
            && !record.waits_in_line()
        {
            if let Decision::Apply(t) = decide(&record, input, &self.ports.ctx(&record)?) {
                if self.apply(&record, &t).await? == Saved::Saved {
                    return Ok(Handled::Applied);
                }
            }
        }
        // A conflict is another writer's transition: a sibling step's reply, the supervisor, an
        // operator. This message is judged again on what that writer left, as often as it
        // takes; one that still meets a writer every time goes back to its queue, to be
        // delivered again, rather than be lost.
        for _ in 0..CONFLICT_TRIES {
            let Some(record) = self.ports.store.load(order_id, Read::Consistent).await? else {
                // Messages are only ever sent for orders already written, so this one is
                // forged or misrouted: a poison message, for the dead-letter queue and an
                // operator.
                return Err(Error::InvalidMessage(format!("order {order_id} does not exist")));
            };
            if let Some(handled) = self.judge(&record, input).await? {
                return Ok(handled);
            }
        }
        Err(Error::Contended { order_id, tries: CONFLICT_TRIES })
    }

    /// Decides `input` on `record` and acts on the decision; `None` if the write met another
    /// writer's.
    async fn judge(&self, record: &StateRecord, input: Input<'_>) -> Result<Option<Handled>> {
        let order_id = record.order_id;
        let input = match input {
            Input::Claim { attempt, owner, message }
                if record.waits_in_line() && attempt == record.attempt =>
            {
                let admitted = self.ports.take_place(record).await?;
                Input::Admission { attempt, owner, message, admitted }
            }
            other => other,
        };
        let handled = match decide(record, input, &self.ports.ctx(record)?) {
            Decision::Apply(t) => match self.apply(record, &t).await? {
                Saved::Saved => Handled::Applied,
                Saved::Conflict => return Ok(None),
            },
            Decision::Replay(effects) => {
                info!(%order_id, attempt = record.attempt, "redelivered message: replaying side effects");
                self.ports.perform(record, &effects).await?;
                Handled::Replayed
            }
            Decision::Ignore(why) => {
                debug!(%order_id, ?why, "ignored");
                Handled::Ignored(why)
            }
            // A correct system never sends this message for this record.
            Decision::Illegal(why) => {
                let what = format!(
                    "cannot apply to order {order_id} (attempt {}): {why:?}",
                    record.attempt
                );
                match remedy(&input) {
                    Remedy::DeadLetter => return Err(Error::InvalidMessage(what)),
                    Remedy::Report => {
                        error!(%order_id, ?why, "illegal input");
                        Handled::Illegal(why)
                    }
                }
            }
            // Only operator commands are refused, and none comes this way.
            Decision::Refuse(why) => {
                return Err(Error::InvalidMessage(format!("{order_id}: {why}")));
            }
        };
        Ok(Some(handled))
    }

    /// Writes a transition over `record` and, if the write took, performs its effects.
    async fn apply(&self, record: &StateRecord, t: &Transition) -> Result<Saved> {
        let saved = self.ports.save(record, &t.next).await?;
        if saved == Saved::Saved {
            debug!(order_id = %record.order_id, state = t.next.process_state.as_str(), attempt = t.next.attempt, "transition");
            self.ports.perform(&t.next, &t.effects).await?;
        }
        Ok(saved)
    }
}
