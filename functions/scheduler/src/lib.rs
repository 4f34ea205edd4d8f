//! The scheduler function's handler: an SQS batch from the scheduler queue (start messages,
//! and the bus's events for the starts the workflows declare) or the reply queue (agent
//! replies), each message handed to the engine's [`Scheduler`], or an event to its
//! [`Starter`]. The requests the batch dispatches are sent together (one `SendMessageBatch`
//! per agent queue rather than one request per message).

pub mod settings;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use sas_aws::batch::{Coalescing, Received, for_each_turn_coalescing};
use sas_engine::load::LoadSource;
use sas_engine::message::Message;
use sas_engine::ports::{
    Clock, Destination, EventBus, Ids, Outbox, Payloads, StateStore, WaitGauge,
};
use sas_engine::services::{Scheduler, Starter};
use sas_engine::{Error, Result};
use tracing::{Span, debug};

/// Handles a batch; the failed messages are reported for redelivery.
pub async fn handle<S, Q, B, C, W, P, I, L>(
    scheduler: &Scheduler<S, Coalescing<Q>, B, C, W, P>,
    starter: &Starter<S, Coalescing<Q>, B, C, I, L, P>,
    event: SqsEvent,
) -> SqsBatchResponse
where
    S: StateStore,
    Q: Outbox,
    B: EventBus,
    C: Clock,
    W: WaitGauge,
    P: Payloads,
    I: Ids,
    L: LoadSource,
{
    for_each_turn_coalescing(event, scheduler.outbox(), home, |line| async move {
        // One order's messages of the batch, recorded together; an event, alone.
        if let [received] = &line[..] {
            return vec![handle_one(scheduler, starter, received).await];
        }
        let decoded: Vec<Result<Message>> = line.iter().map(|r| Message::decode(&r.body)).collect();
        let turn: Vec<(Message, sas_engine::ports::Incoming<'_>)> = line
            .iter()
            .zip(&decoded)
            .filter_map(|(r, m)| Some((m.as_ref().ok()?.clone(), r.incoming())))
            .collect();
        let mut handled = scheduler.handle_turn(&turn).await.into_iter();
        decoded
            .into_iter()
            .map(|m| match m {
                Err(e) => Err(e),
                Ok(_) => match handled.next() {
                    Some(Ok(h)) => {
                        debug!(?h, "handled");
                        Ok(())
                    }
                    Some(Err(e)) => Err(e),
                    None => Err(Error::InvalidMessage("a message left unhandled".into())),
                },
            })
            .collect()
    })
    .await
}

/// Handles one message alone: an event, or the only message of its order in the batch.
async fn handle_one<S, Q, B, C, W, P, I, L>(
    scheduler: &Scheduler<S, Coalescing<Q>, B, C, W, P>,
    starter: &Starter<S, Coalescing<Q>, B, C, I, L, P>,
    received: &Received,
) -> Result<()>
where
    S: StateStore,
    Q: Outbox,
    B: EventBus,
    C: Clock,
    W: WaitGauge,
    P: Payloads,
    I: Ids,
    L: LoadSource,
{
    let message = Message::decode(&received.body)?;
    if let Message::Event(event) = &message {
        return start(starter, event).await;
    }
    if let Some(order_id) = message.order_id() {
        Span::current().record("order_id", tracing::field::display(order_id));
    }
    let handled = scheduler.handle(&message, received.incoming()).await?;
    debug!(?handled, "handled");
    Ok(())
}

/// Starts the orders an event starts. An event that matches a start but whose input its
/// workflow refuses can never start that order: it fails, to end in the dead-letter queue
/// where an operator sees it (the orders it did start are found again, not made twice).
async fn start<S, Q, B, C, I, L, P>(
    starter: &Starter<S, Q, B, C, I, L, P>,
    event: &serde_json::Value,
) -> Result<()>
where
    S: StateStore,
    Q: Outbox,
    B: EventBus,
    C: Clock,
    I: Ids,
    L: LoadSource,
    P: Payloads,
{
    let started = starter.on_event(event).await?;
    let refused: Vec<String> = started
        .iter()
        .filter_map(|s| s.outcome.as_ref().err().map(|why| format!("{}: {why}", s.workflow)))
        .collect();
    if refused.is_empty() {
        debug!(started = started.len(), "event handled");
        return Ok(());
    }
    Err(Error::InvalidMessage(format!("the event starts no order of {}", refused.join("; "))))
}

/// The queue each kind of message the scheduler takes comes from.
fn home(message: &Message) -> Option<Destination> {
    match message {
        Message::Start(_) | Message::ChildEnded(_) | Message::Event(_) => {
            Some(Destination::Scheduler)
        }
        Message::Reply(_) | Message::ElementsReply(_) => Some(Destination::Replies),
        Message::Request(_) | Message::Elements(_) => None,
    }
}
