//! The scheduler: claims Pending orders, dispatches steps to agents, records their replies and
//! moves each order to its next step, to compensation, or to its end.

use std::time::Duration;

use tracing::{debug, error, info};

use super::Handled;
use super::effects::Ports;
use crate::error::{Error, Result};
use crate::ids::OrderId;
use crate::load::WaitReporter;
use crate::machine::{Decision, Effect, Ignored, Input, Remedy, Transition, decide, remedy};
use crate::message::{Message, StepOutcome, StepReply};
use crate::payload::NoPayloads;
use crate::ports::{
    Clock, Destination, EventBus, Incoming, Outbox, Payloads, Read, Saved, StateStore, WaitGauge,
};
use crate::state::{InputRef, StateRecord};

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
        let now = self.ports.clock.now();
        // The scheduler acts on a message at once: no work follows the wait.
        let queue = queue_of(message);
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
            Message::Request(_) | Message::Elements(_) => {
                Err(Error::InvalidMessage("a step request was sent to the scheduler".into()))
            }
            Message::ElementsReply(reply) => {
                let input = Input::Elements {
                    attempt: reply.attempt,
                    step: &reply.step,
                    outcomes: &reply.outcomes,
                    message: message_id,
                };
                self.run(reply.order_id, input).await
            }
            // Its consumer hands an event to the starter ([`super::Starter`]), never here.
            Message::Event(_) => {
                Err(Error::InvalidMessage("an event was handed to the scheduler".into()))
            }
        }
    }

    /// Handles the messages of one order from one batch, in their order, recording what they
    /// all do in one write: the replies of steps side by side, or the ends of many elements
    /// of a step over a list, cost one conditional write instead of one each. The write names
    /// every message it records, so that any of them delivered again replays its effects. A
    /// start message, messages of several orders, or an order waiting in its key's line are
    /// handled one by one ([`Scheduler::handle`]). Returns what became of each message.
    pub async fn handle_turn(&self, messages: &[(Message, Incoming<'_>)]) -> Vec<Result<Handled>> {
        let order_id = messages.first().and_then(|(m, _)| m.order_id());
        let foldable = messages.len() > 1
            && messages.iter().all(|(m, _)| {
                matches!(m, Message::Reply(_) | Message::ChildEnded(_) | Message::ElementsReply(_))
                    && m.order_id() == order_id
            });
        let Some(order_id) = order_id.filter(|_| foldable) else {
            let mut handled = Vec::with_capacity(messages.len());
            for (message, incoming) in messages {
                handled.push(self.handle(message, *incoming).await);
            }
            return handled;
        };
        let now = self.ports.clock.now();
        let mut results: Vec<Option<Result<Handled>>> = Vec::with_capacity(messages.len());
        // What each child that ended says, read before anything is decided.
        let mut outcomes: Vec<Option<StepOutcome>> = Vec::with_capacity(messages.len());
        for (message, incoming) in messages {
            let queue = queue_of(message);
            self.waits.observe(&queue, message.due_at(), *incoming, now, Duration::ZERO).await;
            let (result, outcome) = match message {
                Message::ChildEnded(ended) => match self.ports.outcome_of_child(ended).await {
                    Ok(Some(outcome)) => (None, Some(outcome)),
                    Ok(None) => {
                        let why =
                            Ignored::Stale { received: ended.attempt, current: ended.attempt };
                        (Some(Ok(Handled::Ignored(why))), None)
                    }
                    Err(e) => (Some(Err(e)), None),
                },
                _ => (None, None),
            };
            results.push(result);
            outcomes.push(outcome);
        }
        let inputs: Vec<(usize, Input<'_>)> = messages
            .iter()
            .enumerate()
            .filter(|(i, _)| results[*i].is_none())
            .filter_map(|(i, (message, incoming))| {
                let message_id = incoming.message_id;
                let input = match message {
                    Message::Reply(r) => Input::Reply {
                        attempt: r.attempt,
                        step: &r.step,
                        outcome: &r.outcome,
                        message: message_id,
                    },
                    Message::ChildEnded(e) => Input::Reply {
                        attempt: e.attempt,
                        step: &e.step,
                        outcome: outcomes[i].as_ref()?,
                        message: message_id,
                    },
                    Message::ElementsReply(r) => Input::Elements {
                        attempt: r.attempt,
                        step: &r.step,
                        outcomes: &r.outcomes,
                        message: message_id,
                    },
                    _ => return None,
                };
                Some((i, input))
            })
            .collect();
        let folded = self.fold(order_id, &inputs).await;
        for (i, result) in folded {
            results[i] = Some(result);
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| Err(Error::unavailable("scheduler", "message left unjudged")))
            })
            .collect()
    }

    /// Decides `inputs` in turn on `order_id`'s record and writes what they did at once, as
    /// often as another writer's write comes between; then performs the effects. What became
    /// of each input, by its index.
    async fn fold(
        &self,
        order_id: OrderId,
        inputs: &[(usize, Input<'_>)],
    ) -> Vec<(usize, Result<Handled>)> {
        // The cheaper eventual read is trusted only when every input applies and the write
        // takes, as in `run`.
        let mut read = Read::Eventual;
        for _ in 0..=CONFLICT_TRIES {
            let record = match self.ports.store.load(order_id, read).await {
                Ok(Some(record)) => record,
                // A record written a moment ago may be missed by the cheaper read.
                Ok(None) if read == Read::Eventual => {
                    read = Read::Consistent;
                    continue;
                }
                Ok(None) => {
                    return inputs
                        .iter()
                        .map(|(i, _)| {
                            (
                                *i,
                                Err(Error::InvalidMessage(format!(
                                    "order {order_id} does not exist"
                                ))),
                            )
                        })
                        .collect();
                }
                Err(e) => return fail_all(inputs, &e),
            };
            if record.waits_in_line() {
                // Its line is looked at message by message.
                let mut out = Vec::with_capacity(inputs.len());
                for (i, input) in inputs {
                    out.push((*i, self.run(order_id, *input).await));
                }
                return out;
            }
            match self.fold_on(&record, inputs, read).await {
                Ok(Some(out)) => return out,
                Ok(None) => read = Read::Consistent,
                Err(e) => return fail_all(inputs, &e),
            }
        }
        inputs
            .iter()
            .map(|(i, _)| (*i, Err(Error::Contended { order_id, tries: CONFLICT_TRIES })))
            .collect()
    }

    /// One fold of `inputs` on `record`; `None` if it must be done again on a fresh consistent
    /// read (the write met another writer's, or the eventual copy looked out of date).
    async fn fold_on(
        &self,
        record: &StateRecord,
        inputs: &[(usize, Input<'_>)],
        read: Read,
    ) -> Result<Option<Vec<(usize, Result<Handled>)>>> {
        let mut current = record.clone();
        let mut recorded: Option<InputRef> = None;
        let mut effects = Vec::new();
        let mut replays = Vec::new();
        let mut out = Vec::with_capacity(inputs.len());
        let mut pages = Vec::new();
        for (i, input) in inputs {
            let (Input::Reply { message, .. } | Input::Elements { message, .. }) = input else {
                continue;
            };
            match decide(&current, *input, &self.ports.ctx(&current)?) {
                Decision::Apply(t) => {
                    recorded = Some(match &recorded {
                        None => InputRef::Message((*message).to_owned()),
                        Some(before) => before.and_message(message),
                    });
                    effects.extend(t.effects.into_iter().map(|e| {
                        let lease = lease_of(&e, &t.next);
                        (e, lease)
                    }));
                    pages.extend(t.pages);
                    current = t.next;
                    out.push((*i, Ok(Handled::Applied)));
                }
                // Looked stale, repeated or impossible on a copy that may be behind.
                _ if read == Read::Eventual => return Ok(None),
                Decision::Replay(owed) => {
                    replays.extend(owed);
                    out.push((*i, Ok(Handled::Replayed)));
                }
                Decision::Ignore(why) => {
                    debug!(order_id = %record.order_id, ?why, "ignored");
                    out.push((*i, Ok(Handled::Ignored(why))));
                }
                Decision::Illegal(why) => {
                    let what = format!(
                        "cannot apply to order {} (attempt {}): {why:?}",
                        record.order_id, current.attempt
                    );
                    out.push((
                        *i,
                        match remedy(input) {
                            Remedy::DeadLetter => Err(Error::InvalidMessage(what)),
                            Remedy::Report => {
                                error!(order_id = %record.order_id, ?why, "illegal input");
                                Ok(Handled::Illegal(why))
                            }
                        },
                    ));
                }
                Decision::Refuse(why) => {
                    out.push((
                        *i,
                        Err(Error::InvalidMessage(format!("{}: {why}", record.order_id))),
                    ));
                }
            }
        }
        if let Some(recorded) = recorded {
            // One write, whatever the number of transitions it holds.
            current.revision = record.revision + 1;
            current.last_input = recorded;
            for page in &pages {
                self.ports.store.put_page(page).await?;
            }
            if self.ports.save(record, &current).await? == Saved::Conflict {
                return Ok(None);
            }
            debug!(order_id = %record.order_id, state = current.process_state.as_str(), inputs = out.len(), "transitions written at once");
        }
        // An effect on a step's lease that a later input of the turn moved on is the later
        // one's to carry out (or no one's: the step stopped before anything was sent).
        let mut effects: Vec<Effect> = effects
            .into_iter()
            .filter(|(e, lease)| lease.is_none() || *lease == lease_of(e, &current))
            .map(|(e, _)| e)
            .collect();
        effects.extend(replays);
        if !effects.is_empty() {
            if let Err(e) = self.ports.perform(&current, &effects).await {
                // Every message whose effects were owed comes back, and replays them.
                let owed =
                    |r: &Result<Handled>| matches!(r, Ok(Handled::Applied | Handled::Replayed));
                return Ok(Some(
                    out.into_iter()
                        .map(|(i, r)| if owed(&r) { (i, Err(again(&e))) } else { (i, r) })
                        .collect(),
                ));
            }
        }
        Ok(Some(out))
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
        // The outputs the write takes are kept before it, so that no write names an element
        // ended well whose output could be lost.
        for page in &t.pages {
            self.ports.store.put_page(page).await?;
        }
        let saved = self.ports.save(record, &t.next).await?;
        if saved == Saved::Saved {
            debug!(order_id = %record.order_id, state = t.next.process_state.as_str(), attempt = t.next.attempt, "transition");
            self.ports.perform(&t.next, &t.effects).await?;
        }
        Ok(saved)
    }
}

/// `e` for each of `inputs`.
fn fail_all(inputs: &[(usize, Input<'_>)], e: &Error) -> Vec<(usize, Result<Handled>)> {
    inputs.iter().map(|(i, _)| (*i, Err(again(e)))).collect()
}

/// An error like `e` for another message that met it: retryable if it is.
fn again(e: &Error) -> Error {
    if e.is_retryable() {
        Error::unavailable("scheduler", e.to_string())
    } else {
        Error::InvalidMessage(e.to_string())
    }
}

/// The lease of its step an effect acts on, as `record` holds it (its attempt, or none sent);
/// `None` for an effect on no step's lease.
fn lease_of(effect: &Effect, record: &StateRecord) -> Option<Option<u64>> {
    let step = match effect {
        Effect::Dispatch { step }
        | Effect::Announce { step }
        | Effect::Child { step }
        | Effect::Count { step }
        | Effect::Elements { step, .. }
        | Effect::ElementsAgain { step, .. }
        | Effect::Collect { step } => *step,
        _ => return None,
    };
    Some(record.steps.get(step).and_then(|s| s.sent()).map(|l| l.attempt))
}

/// The queue a message of the scheduler's comes from.
fn queue_of(message: &Message) -> Destination {
    match message {
        Message::Start(_) | Message::ChildEnded(_) | Message::Event(_) => Destination::Scheduler,
        _ => Destination::Replies,
    }
}
