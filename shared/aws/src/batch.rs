//! Consuming an SQS batch the way the event source mapping expects with
//! `ReportBatchItemFailures`: every message is handled (concurrently, one span each), and only
//! the ones that failed are reported, so they come back after their visibility timeout and,
//! past the queue's `maxReceiveCount`, land in its dead-letter queue. A message that cannot be
//! parsed fails on every try and so ends there too, without holding up the rest of its batch.

use std::future::Future;

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use futures_util::future::join_all;
use sas_engine::Error;
use tracing::{Instrument, error, info_span, warn};

/// Handles every record of `event` with `handle(message_id, body)` and reports the failures.
pub async fn for_each_message<F, Fut>(event: SqsEvent, handle: F) -> SqsBatchResponse
where
    F: Fn(String, String) -> Fut,
    Fut: Future<Output = Result<(), Error>>,
{
    let work = event.records.into_iter().map(|record| {
        let id = record.message_id.unwrap_or_default();
        let body = record.body.unwrap_or_default();
        let span = info_span!("message", message_id = %id, order_id = tracing::field::Empty);
        let fut = handle(id.clone(), body);
        async move {
            match fut.await {
                Ok(()) => None,
                Err(e) => {
                    if e.is_retryable() {
                        warn!(error = %e, "will be retried");
                    } else {
                        error!(error = %e, "cannot be handled; it will end in the dead-letter queue");
                    }
                    Some(id)
                }
            }
        }
        .instrument(span)
    });
    let mut response = SqsBatchResponse::default();
    for id in join_all(work).await.into_iter().flatten() {
        let mut failure = BatchItemFailure::default();
        failure.item_identifier = id;
        response.batch_item_failures.push(failure);
    }
    response
}
