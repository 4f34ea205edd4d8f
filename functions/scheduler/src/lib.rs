//! The scheduler function's handler: an SQS batch from the scheduler queue (start messages) or
//! the reply queue (agent replies), each message handed to the engine's [`Scheduler`]. The
//! requests the batch dispatches are sent together (one `SendMessageBatch` per agent queue
//! rather than one request per message).

pub mod settings;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use sas_aws::batch::{Coalescing, for_each_message_coalescing};
use sas_engine::message::Message;
use sas_engine::ports::{Clock, Destination, EventBus, Outbox, Payloads, StateStore, WaitGauge};
use sas_engine::services::Scheduler;
use tracing::{Span, debug};

/// Handles a batch; the failed messages are reported for redelivery.
pub async fn handle<S, Q, B, C, W, P>(
    scheduler: &Scheduler<S, Coalescing<Q>, B, C, W, P>,
    event: SqsEvent,
) -> SqsBatchResponse
where
    S: StateStore,
    Q: Outbox,
    B: EventBus,
    C: Clock,
    W: WaitGauge,
    P: Payloads,
{
    for_each_message_coalescing(event, scheduler.outbox(), home, |received| async move {
        let message = Message::decode(&received.body)?;
        Span::current().record("order_id", tracing::field::display(message.order_id()));
        let handled = scheduler.handle(&message, received.incoming()).await?;
        debug!(?handled, "handled");
        Ok(())
    })
    .await
}

/// The queue each kind of message the scheduler takes comes from.
fn home(message: &Message) -> Option<Destination> {
    match message {
        Message::Start(_) | Message::ChildEnded(_) => Some(Destination::Scheduler),
        Message::Reply(_) => Some(Destination::Replies),
        Message::Request(_) => None,
    }
}
