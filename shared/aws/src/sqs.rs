//! Sending messages with SQS: each destination is a queue URL from configuration; messages are
//! sent in batches of up to ten per queue. A delay SQS would refuse fails the send before
//! anything is sent; a delay is rounded up to whole seconds, so a message is never early.
//!
//! `SendMessageBatch` answers 200 even when some entries failed. An entry failed on SQS's side
//! is sent again by itself (the others were accepted: sending them again would only duplicate
//! them), up to [`ENTRY_TRIES`] tries; one still failing, or failed as the sender's fault, fails
//! the send, so the caller's input is retried, and duplicates are harmless by design. A queue
//! that does not exist yet fails a send as a passing cause.
//!
//! A message sent again for one its consumer could not handle carries that one's id in the
//! [`AGAIN_OF_ATTRIBUTE`] message attribute, so that the engine takes it as the same message.
//!
//! A message of an order with a group ([`sas_engine::fair`]) is sent with it as its
//! `MessageGroupId`: on a standard queue, that is what makes SQS deliver the tenants fairly.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{
    BatchResultErrorEntry, MessageAttributeValue, MessageSystemAttributeNameForSends,
    MessageSystemAttributeValue, SendMessageBatchRequestEntry,
};
use sas_engine::ports::{Destination, ENTRY_TRIES, MAX_DELAY, Outbox, Outgoing};
use sas_engine::{Error, Result};

use crate::errors::classify;
use crate::trace;

const SERVICE: &str = "sqs";

/// The message attribute that carries [`Outgoing::again_of`].
pub const AGAIN_OF_ATTRIBUTE: &str = "SasAgainOf";

/// [`Outgoing::again_of`] as message attributes.
fn again_of_attribute(outgoing: &Outgoing) -> Option<HashMap<String, MessageAttributeValue>> {
    let id = outgoing.again_of.as_ref()?;
    let value =
        MessageAttributeValue::builder().data_type("String").string_value(id).build().ok()?;
    Some(HashMap::from([(AGAIN_OF_ATTRIBUTE.to_owned(), value)]))
}
/// Most entries in one SendMessageBatch call.
const BATCH: usize = 10;

/// The order's trace, as the `AWSTraceHeader` system attribute (see [`crate::trace`]).
fn trace_attribute(
    message: &sas_engine::message::Message,
) -> Option<HashMap<MessageSystemAttributeNameForSends, MessageSystemAttributeValue>> {
    let header = trace::header_of(message)?;
    let value = MessageSystemAttributeValue::builder()
        .data_type("String")
        .string_value(header.to_string())
        .build()
        .ok()?;
    Some(HashMap::from([(MessageSystemAttributeNameForSends::AwsTraceHeader, value)]))
}

/// Queue URLs by destination.
#[derive(Clone, Debug, Default)]
pub struct QueueUrls(HashMap<Destination, String>);

impl QueueUrls {
    pub fn with(mut self, destination: Destination, url: impl Into<String>) -> Self {
        self.0.insert(destination, url.into());
        self
    }

    fn url(&self, destination: &Destination) -> Result<&str> {
        self.0.get(destination).map(String::as_str).ok_or_else(|| {
            // A destination the function was not configured for: a deployment mistake.
            Error::Config(format!("no queue URL configured for {destination:?}"))
        })
    }
}

/// The [`Outbox`] port on SQS.
#[derive(Clone, Debug)]
pub struct SqsOutbox {
    client: Client,
    urls: QueueUrls,
}

impl SqsOutbox {
    pub fn new(client: Client, urls: QueueUrls) -> Self {
        SqsOutbox { client, urls }
    }
}

impl Outbox for SqsOutbox {
    async fn send(&self, messages: &[Outgoing]) -> Result<()> {
        let mut by_queue: Vec<(&str, Vec<&Outgoing>)> = Vec::new();
        for m in messages {
            let url = self.urls.url(&m.to)?;
            delay_seconds(m.delay)?;
            match by_queue.iter_mut().find(|(u, _)| *u == url) {
                Some((_, list)) => list.push(m),
                None => by_queue.push((url, vec![m])),
            }
        }
        // A batch whose entries failed for good does not stop the others, as SQS does not stop
        // a batch at its failed entries; the failure is reported once they are sent, the
        // sender's fault first, since retrying will not mend it.
        let mut failed: Option<Error> = None;
        for (url, list) in by_queue {
            for chunk in list.chunks(BATCH) {
                if let Some(e) = self.send_batch(url, chunk).await? {
                    if failed.as_ref().is_none_or(Error::is_retryable) {
                        failed = Some(e);
                    }
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }
}

impl SqsOutbox {
    /// Sends one batch, then again, alone, the entries SQS failed on its side. An error is a
    /// call that failed whole; `Some` is the failure of entries that failed for good.
    async fn send_batch(&self, url: &str, chunk: &[&Outgoing]) -> Result<Option<Error>> {
        // An entry's id is its position in the chunk, so a failed entry names its message.
        let mut pending: Vec<usize> = (0..chunk.len()).collect();
        for tried in 1..=ENTRY_TRIES {
            let entries = pending
                .iter()
                .map(|&i| {
                    let m = chunk[i];
                    SendMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .message_body(m.message.encode())
                        .delay_seconds(delay_seconds(m.delay)?)
                        .set_message_system_attributes(trace_attribute(&m.message))
                        .set_message_attributes(again_of_attribute(m))
                        .set_message_group_id(m.message.group().map(str::to_owned))
                        .build()
                        .map_err(|e| Error::rejected(SERVICE, e))
                })
                .collect::<Result<Vec<_>>>()?;
            let out = self
                .client
                .send_message_batch()
                .queue_url(url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| sending_failed(url, e))?;
            let failed = out.failed();
            let Some(first) = failed.first() else {
                return Ok(None);
            };
            let reason = |f: &BatchResultErrorEntry| {
                format!(
                    "{} of {} messages not sent (try {tried} of {ENTRY_TRIES}): {} {}",
                    failed.len(),
                    pending.len(),
                    f.code(),
                    f.message().unwrap_or_default()
                )
            };
            // The sender's fault fails the same way every time.
            if let Some(f) = failed.iter().find(|f| f.sender_fault()) {
                return Ok(Some(Error::rejected(SERVICE, reason(f))));
            }
            let again: Option<Vec<usize>> = failed
                .iter()
                .map(|f| f.id().parse().ok().filter(|i| pending.contains(i)))
                .collect();
            match again {
                Some(again) if tried < ENTRY_TRIES => pending = again,
                // Either out of tries, or SQS named an entry not sent: which to send again is
                // unknown, and the caller's retry sends them all.
                _ => return Ok(Some(Error::unavailable(SERVICE, reason(first)))),
            }
        }
        Ok(None)
    }
}

/// Why a send failed. A queue that does not exist is a passing cause: a stack update that adds
/// an agent can start the scheduler's new code, which sends to the agent's queue by its name,
/// before CloudFormation has created that queue; the message waits for it rather than ending in
/// the dead letters.
fn sending_failed(
    url: &str,
    e: aws_sdk_sqs::error::SdkError<
        aws_sdk_sqs::operation::send_message_batch::SendMessageBatchError,
        aws_sdk_sqs::config::http::HttpResponse,
    >,
) -> Error {
    let missing = e.as_service_error().is_some_and(|s| {
        s.is_queue_does_not_exist()
            || s.meta().code() == Some("AWS.SimpleQueueService.NonExistentQueue")
    });
    if missing {
        return Error::unavailable(
            SERVICE,
            format!("queue {url} does not exist (yet: a stack update may be creating it)"),
        );
    }
    classify(SERVICE, e)
}

/// `DelaySeconds` for `delay`: whole seconds, rounded up so that SQS never delivers early;
/// above [`MAX_DELAY`] SQS would refuse it, and so does this.
fn delay_seconds(delay: Duration) -> Result<i32> {
    let seconds = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
    if seconds > MAX_DELAY.as_secs() {
        return Err(Error::rejected(
            SERVICE,
            format!("delay {delay:?} is above SQS's maximum of {} s", MAX_DELAY.as_secs()),
        ));
    }
    i32::try_from(seconds).map_err(|e| Error::rejected(SERVICE, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_are_whole_seconds_rounded_up_and_at_most_fifteen_minutes() {
        let secs = |ms: u64| delay_seconds(Duration::from_millis(ms)).ok();
        assert_eq!(secs(0), Some(0));
        assert_eq!(secs(1), Some(1));
        assert_eq!(secs(1500), Some(2));
        assert_eq!(secs(2000), Some(2));
        assert_eq!(secs(900_000), Some(900));
        assert_eq!(secs(900_001), None);
        let err = delay_seconds(Duration::from_secs(901)).unwrap_err();
        assert!(!err.is_retryable(), "{err}");
    }
}
