//! Consuming an SQS batch the way the event source mapping expects with
//! `ReportBatchItemFailures`: every message is handled (concurrently, one span each), and only
//! the ones that failed are reported, so they come back after their visibility timeout and,
//! past the queue's `maxReceiveCount`, land in its dead-letter queue. A message that cannot be
//! parsed fails on every try and so ends there too, without holding up the rest of its batch.
//!
//! [`for_each_message_deferring`] also holds back the messages the handlers send until the
//! whole batch is handled, then sends them together: ten replies handled in one invocation
//! dispatch their ten requests in one `SendMessageBatch` per queue instead of ten requests.
//! Sends happen after the writes that decided them either way; if the combined send fails,
//! every message whose sends were in it is reported failed, and its redelivery replays them.

use std::future::Future;
use std::sync::{Arc, Mutex};

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use futures_util::future::join_all;
use sas_engine::ports::{Outbox, Outgoing};
use sas_engine::{Error, Result};
use tracing::{Instrument, error, info_span, warn};

type Held = Arc<Mutex<Vec<Outgoing>>>;

tokio::task_local! {
    /// The messages held back for the message being handled, inside a deferring batch.
    static HELD: Held;
}

/// An [`Outbox`] that holds messages back while inside [`for_each_message_deferring`], and
/// sends at once anywhere else.
#[derive(Clone, Debug)]
pub struct Deferring<Q>(pub Q);

impl<Q: Outbox> Outbox for Deferring<Q> {
    async fn send(&self, messages: &[Outgoing]) -> Result<()> {
        if let Ok(held) = HELD.try_with(Arc::clone) {
            held.lock().unwrap_or_else(|e| e.into_inner()).extend(messages.iter().cloned());
            return Ok(());
        }
        self.0.send(messages).await
    }
}

/// Handles every record of `event` with `handle(message_id, body)` and reports the failures.
pub async fn for_each_message<F, Fut>(event: SqsEvent, handle: F) -> SqsBatchResponse
where
    F: Fn(String, String) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let results = join_all(event.records.into_iter().map(|record| {
        let id = record.message_id.unwrap_or_default();
        let body = record.body.unwrap_or_default();
        handle_one(id.clone(), handle(id, body))
    }))
    .await;
    response(results.into_iter().filter_map(|(id, ok)| (!ok).then_some(id)))
}

/// Like [`for_each_message`], holding back what the handlers send through `outbox` until the
/// batch is handled, then sending it in one go.
pub async fn for_each_message_deferring<Q, F, Fut>(
    event: SqsEvent,
    outbox: &Deferring<Q>,
    handle: F,
) -> SqsBatchResponse
where
    Q: Outbox,
    F: Fn(String, String) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let results = join_all(event.records.into_iter().map(|record| {
        let id = record.message_id.unwrap_or_default();
        let body = record.body.unwrap_or_default();
        let held = Held::default();
        let fut = HELD.scope(held.clone(), handle_one(id.clone(), handle(id, body)));
        async move { (fut.await, held) }
    }))
    .await;

    let mut failed = Vec::new();
    let mut owners = Vec::new();
    let mut outgoing = Vec::new();
    for ((id, ok), held) in results {
        let held = std::mem::take(&mut *held.lock().unwrap_or_else(|e| e.into_inner()));
        if !held.is_empty() {
            owners.push(id.clone());
        }
        outgoing.extend(held);
        if !ok {
            failed.push(id);
        }
    }
    if !outgoing.is_empty() {
        if let Err(e) = outbox.0.send(&outgoing).await {
            warn!(error = %e, messages = outgoing.len(), "sending the batch's messages failed; their sources will be retried");
            for owner in owners {
                if !failed.contains(&owner) {
                    failed.push(owner);
                }
            }
        }
    }
    response(failed.into_iter())
}

/// Runs one message's handling in its span and logs a failure; returns (id, succeeded).
async fn handle_one(id: String, work: impl Future<Output = Result<()>>) -> (String, bool) {
    let span = info_span!("message", message_id = %id, order_id = tracing::field::Empty);
    let ok = async move {
        match work.await {
            Ok(()) => true,
            Err(e) => {
                report(&e);
                false
            }
        }
    }
    .instrument(span)
    .await;
    (id, ok)
}

fn report(e: &Error) {
    if e.is_retryable() {
        warn!(error = %e, "will be retried");
    } else {
        error!(error = %e, "cannot be handled; it will end in the dead-letter queue");
    }
}

fn response(failed: impl Iterator<Item = String>) -> SqsBatchResponse {
    let mut response = SqsBatchResponse::default();
    for id in failed {
        let mut failure = BatchItemFailure::default();
        failure.item_identifier = id;
        response.batch_item_failures.push(failure);
    }
    response
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use aws_lambda_events::event::sqs::SqsMessage;
    use sas_engine::memory::{ManualClock, MemoryQueues};
    use sas_engine::message::{Message, Start};
    use sas_engine::ports::Destination;
    use sas_engine::{IdempotencyKey, OrderId};

    use super::*;

    fn event(ids: &[&str]) -> SqsEvent {
        let mut event = SqsEvent::default();
        for id in ids {
            let mut m = SqsMessage::default();
            m.message_id = Some((*id).to_owned());
            m.body = Some((*id).to_owned());
            event.records.push(m);
        }
        event
    }

    fn start(n: u64) -> Outgoing {
        let order_id = OrderId::for_key(&IdempotencyKey::parse(&format!("k{n}")).unwrap());
        Outgoing::now(
            Destination::Scheduler,
            Message::Start(Start { order_id, attempt: n, correlation_id: "c".into() }),
        )
    }

    #[tokio::test]
    async fn a_batch_sends_once_and_reports_only_its_failures() {
        let queues = Arc::new(MemoryQueues::new(ManualClock::default()));
        let outbox = Deferring(queues.clone());
        let outbox_ref = &outbox;
        let response =
            for_each_message_deferring(event(&["a", "b", "c"]), &outbox, |id, _| async move {
                outbox_ref.send(&[start(1), start(2)]).await?;
                if id == "b" { Err(Error::InvalidMessage("poison".into())) } else { Ok(()) }
            })
            .await;
        let failed: Vec<_> =
            response.batch_item_failures.iter().map(|f| f.item_identifier.as_str()).collect();
        assert_eq!(failed, ["b"]);
        // Six messages, all sent after the batch, through the inner outbox in one call.
        assert_eq!(queues.sent_count(&Destination::Scheduler), 6);
        // Outside a batch, the outbox sends at once.
        outbox.send(&[start(3)]).await.unwrap();
        assert_eq!(queues.sent_count(&Destination::Scheduler), 7);
    }

    #[tokio::test]
    async fn when_the_combined_send_fails_every_sender_is_retried() {
        let queues = Arc::new(MemoryQueues::new(ManualClock::default()));
        let outbox = Deferring(queues.clone());
        let outbox_ref = &outbox;
        queues.fail_next_sends(1);
        let response =
            for_each_message_deferring(event(&["a", "b", "quiet"]), &outbox, |id, _| async move {
                if id != "quiet" {
                    outbox_ref.send(&[start(1)]).await?;
                }
                Ok(())
            })
            .await;
        let mut failed: Vec<_> =
            response.batch_item_failures.iter().map(|f| f.item_identifier.clone()).collect();
        failed.sort();
        assert_eq!(failed, ["a", "b"], "the message that sent nothing is done");
    }
}
