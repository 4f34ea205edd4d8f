//! The agent function's handler: an SQS batch of step requests for one remote service, each
//! handed to the engine's [`Agent`]. Replies whose calls end close together share one
//! `SendMessageBatch`; none waits longer than the linger for the others. A reply can therefore
//! leave up to the linger after the agent checked CompleteBy; like any delay in delivery, that
//! is harmless, because its attempt number, not the clock, decides whether it still counts.

pub mod settings;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use sas_aws::batch::{Coalescing, for_each_message_coalescing};
use sas_engine::Error;
use sas_engine::message::Message;
use sas_engine::ports::{Clock, Outbox, Random, RemoteService, WaitGauge};
use sas_engine::services::Agent;
use tracing::{Span, info};

/// Handles a batch; the failed messages are reported for redelivery.
pub async fn handle<R, Q, C, X, W>(
    agent: &Agent<R, Coalescing<Q>, C, X, W>,
    event: SqsEvent,
) -> SqsBatchResponse
where
    R: RemoteService,
    Q: Outbox,
    C: Clock,
    X: Random,
    W: WaitGauge,
{
    // A request kept back by a passing cause goes back to this agent's own queue.
    let home = |m: &Message| matches!(m, Message::Request(_)).then(|| agent.queue().clone());
    for_each_message_coalescing(event, agent.outbox(), home, |received| async move {
        let Message::Request(request) = Message::decode(&received.body)? else {
            return Err(Error::InvalidMessage(
                "only step requests belong on an agent's queue".into(),
            ));
        };
        Span::current().record("order_id", tracing::field::display(request.order_id));
        let outcome = agent.handle(&request, received.incoming()).await?;
        info!(action = %request.action, attempt = request.attempt, ?outcome, "step handled");
        Ok(())
    })
    .await
}
