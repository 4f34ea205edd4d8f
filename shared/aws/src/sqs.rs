//! Sending messages with SQS: each destination is a queue URL from configuration; messages are
//! sent in batches of up to ten per queue, and a batch with any failed entry is an error (the
//! caller's input is retried, and duplicates are harmless by design).

use std::collections::HashMap;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{
    MessageSystemAttributeNameForSends, MessageSystemAttributeValue, SendMessageBatchRequestEntry,
};
use sas_engine::ports::{Destination, Outbox, Outgoing};
use sas_engine::{Error, Result};

use crate::errors::classify;
use crate::trace;

const SERVICE: &str = "sqs";
/// Most entries in one SendMessageBatch call.
const BATCH: usize = 10;

/// The order's trace, as the `AWSTraceHeader` system attribute (see [`crate::trace`]).
fn trace_attribute(
    message: &sas_engine::message::Message,
) -> Option<HashMap<MessageSystemAttributeNameForSends, MessageSystemAttributeValue>> {
    let header = trace::header_for(message.correlation_id())?;
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
            match by_queue.iter_mut().find(|(u, _)| *u == url) {
                Some((_, list)) => list.push(m),
                None => by_queue.push((url, vec![m])),
            }
        }
        for (url, list) in by_queue {
            for chunk in list.chunks(BATCH) {
                let entries = chunk
                    .iter()
                    .enumerate()
                    .map(|(i, m)| {
                        SendMessageBatchRequestEntry::builder()
                            .id(i.to_string())
                            .message_body(m.message.encode())
                            .delay_seconds(i32::try_from(m.delay.as_secs().min(900)).unwrap_or(900))
                            .set_message_system_attributes(trace_attribute(&m.message))
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
                    .map_err(|e| classify(SERVICE, e))?;
                if let Some(f) = out.failed().first() {
                    let reason = format!(
                        "{} of {} messages not sent: {} {}",
                        out.failed().len(),
                        chunk.len(),
                        f.code(),
                        f.message().unwrap_or_default()
                    );
                    return Err(if f.sender_fault() {
                        Error::rejected(SERVICE, reason)
                    } else {
                        Error::unavailable(SERVICE, reason)
                    });
                }
            }
        }
        Ok(())
    }
}
