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
use sas_engine::message::Message;
use sas_engine::ports::{Clock, Outbox, Outgoing};
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
/// batch is handled, then sending it in one go. Replies found past their CompleteBy at that
/// point are dropped: an agent's answer must not arrive after its lease.
pub async fn for_each_message_deferring<Q, C, F, Fut>(
    event: SqsEvent,
    outbox: &Deferring<Q>,
    clock: &C,
    handle: F,
) -> SqsBatchResponse
where
    Q: Outbox,
    C: Clock,
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

    let now = clock.now();
    let mut failed = Vec::new();
    let mut owners = Vec::new();
    let mut outgoing = Vec::new();
    for ((id, ok), held) in results {
        let held = std::mem::take(&mut *held.lock().unwrap_or_else(|e| e.into_inner()));
        let live: Vec<Outgoing> = held
            .into_iter()
            .filter(|m| !matches!(&m.message, Message::Reply(r) if r.complete_by <= now))
            .collect();
        if !live.is_empty() {
            owners.push(id.clone());
        }
        outgoing.extend(live);
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
