//! Event sources, emulated the way AWS runs them: SQS event source mappings (batches, partial
//! batch failures, a concurrency limit; redelivery and dead-lettering are the queue's own) and
//! EventBridge schedules. A throttled invocation is retried as Lambda does: a mapping's batch
//! with backoff until its messages' visibility timeout runs out (then they come back, counted
//! one more receive), a schedule's event until it goes through.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, MessageSystemAttributeName};
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use crate::emulation::runtime_api::{InvokeError, RuntimeApi};
use crate::emulation::template::LOCAL_ACCOUNT;
use crate::observe::dead_letters::DeadLetters;

/// Longest a receive waits for a message (SQS's maximum).
const LONG_POLL_SECONDS: i32 = 20;

/// One SQS event source mapping.
#[derive(Clone, Debug)]
pub struct SqsMapping {
    pub function: String,
    pub queue_url: String,
    pub queue_arn: String,
    /// Messages per invocation; one receive returns at most 10.
    pub batch_size: i32,
    /// How long to keep gathering a batch that is not full yet.
    pub batching_window: Duration,
    pub report_batch_item_failures: bool,
    pub timeout: Duration,
    pub region: String,
    /// The queue's `maxReceiveCount`, if it has a dead-letter queue.
    pub max_receive_count: Option<u32>,
    /// How long a received message stays hidden: the time a throttled batch is retried for.
    pub visibility_timeout: Duration,
    /// Told of every failed delivery, to report what reaches the dead-letter queue.
    pub dead_letters: Option<DeadLetters>,
}

/// Polls the queue and invokes the function with batches, never more at once than `limit`
/// allows. Messages the function reports as failed, or all of them when the invocation fails,
/// are left in the queue: they come back after their visibility timeout, and SQS moves them
/// to the dead-letter queue after `maxReceiveCount` receives.
pub fn poll_sqs(
    sqs: aws_sdk_sqs::Client,
    mapping: SqsMapping,
    api: RuntimeApi,
    limit: Arc<Semaphore>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let Ok(permit) = limit.clone().acquire_owned().await else { return };
            let Some(messages) = gather(&sqs, &mapping).await else {
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            };
            if messages.is_empty() {
                continue;
            }
            let (sqs, mapping, api) = (sqs.clone(), mapping.clone(), api.clone());
            tokio::spawn(async move {
                deliver(&sqs, &mapping, &api, messages).await;
                drop(permit);
            });
        }
    })
}

/// One batch: a long-polled receive, then more receives until the batch is full or the
/// batching window has passed. `None` if the queue could not be read.
async fn gather(
    sqs: &aws_sdk_sqs::Client,
    mapping: &SqsMapping,
) -> Option<Vec<aws_sdk_sqs::types::Message>> {
    let want = mapping.batch_size.clamp(1, 10);
    let started = std::time::Instant::now();
    let mut messages = Vec::new();
    loop {
        // Long polling, as Lambda's pollers do: an idle queue costs one receive every 20 s,
        // and a message that arrives is returned at once.
        let wait = if messages.is_empty() { LONG_POLL_SECONDS } else { 0 };
        let received = sqs
            .receive_message()
            .queue_url(&mapping.queue_url)
            .max_number_of_messages(want - i32::try_from(messages.len()).unwrap_or(want))
            .wait_time_seconds(wait)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await;
        match received {
            Ok(out) => messages.extend(out.messages.unwrap_or_default()),
            Err(e) => {
                warn!(function = %mapping.function, error = %aws_sdk_sqs::error::DisplayErrorContext(e), "receive failed");
                return if messages.is_empty() { None } else { Some(messages) };
            }
        }
        let full = i32::try_from(messages.len()).unwrap_or(want) >= want;
        if messages.is_empty() || full || started.elapsed() >= mapping.batching_window {
            return Some(messages);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// First and longest pause between tries of a throttled invocation.
const THROTTLE_BACKOFF: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(8));

/// Invokes the function with an event of `records` messages, trying again with backoff while
/// it is throttled and the next try would still start before `give_up_at`; the last answer
/// otherwise.
async fn invoke_through_throttling(
    api: &RuntimeApi,
    payload: &str,
    records: usize,
    timeout: Duration,
    give_up_at: std::time::Instant,
) -> Result<String, InvokeError> {
    let mut pause = THROTTLE_BACKOFF.0;
    loop {
        match api.invoke_carrying(payload.to_owned(), records, timeout).await {
            Err(InvokeError::Throttled(quota))
                if std::time::Instant::now() + pause < give_up_at =>
            {
                debug!(quota, "throttled; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(THROTTLE_BACKOFF.1);
            }
            other => return other,
        }
    }
}

async fn deliver(
    sqs: &aws_sdk_sqs::Client,
    mapping: &SqsMapping,
    api: &RuntimeApi,
    messages: Vec<aws_sdk_sqs::types::Message>,
) {
    let records: Vec<Value> = messages.iter().map(|m| record(m, mapping)).collect();
    let event = json!({ "Records": records }).to_string();
    let ids: Vec<&str> = messages.iter().map(|m| m.message_id().unwrap_or_default()).collect();
    let note = |m: &aws_sdk_sqs::types::Message, why: Option<&str>| {
        if let Some(d) = &mapping.dead_letters {
            d.note_failed_delivery(&mapping.queue_url, mapping.max_receive_count, m, why);
        }
    };
    // A throttled batch is tried again as long as an invocation could still end before its
    // messages become visible again.
    let give_up_at =
        std::time::Instant::now() + mapping.visibility_timeout.saturating_sub(mapping.timeout);
    let failed: Vec<String> = match invoke_through_throttling(
        api,
        &event,
        messages.len(),
        mapping.timeout,
        give_up_at,
    )
    .await
    {
        Ok(answer) if mapping.report_batch_item_failures => {
            match reported_failures(&answer, &ids) {
                Some(failed) => failed,
                // An answer Lambda cannot read fails the whole batch.
                None => {
                    let why = format!(
                        "{} answered with no batch response it could read",
                        mapping.function
                    );
                    messages.iter().for_each(|m| note(m, Some(&why)));
                    return;
                }
            }
        }
        Ok(_) => Vec::new(),
        Err(e) => {
            warn!(function = %mapping.function, error = %e, "invocation failed; the batch will be retried");
            let why = format!("the invocation of {} failed: {e}", mapping.function);
            messages.iter().for_each(|m| note(m, Some(&why)));
            return;
        }
    };
    for m in &messages {
        if failed.iter().any(|f| Some(f.as_str()) == m.message_id()) {
            note(m, None);
        }
    }
    let entries: Vec<DeleteMessageBatchRequestEntry> = messages
        .iter()
        .enumerate()
        .filter(|(_, m)| !failed.iter().any(|f| Some(f.as_str()) == m.message_id()))
        .filter_map(|(i, m)| {
            DeleteMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(m.receipt_handle().unwrap_or_default())
                .build()
                .ok()
        })
        .collect();
    if entries.is_empty() {
        return;
    }
    if let Err(e) = sqs
        .delete_message_batch()
        .queue_url(&mapping.queue_url)
        .set_entries(Some(entries))
        .send()
        .await
    {
        warn!(function = %mapping.function, error = %aws_sdk_sqs::error::DisplayErrorContext(e), "delete failed; messages will be redelivered");
    }
}

/// The item identifiers a `ReportBatchItemFailures` answer names, or `None` if the answer is
/// not one (or names a message that was not in the batch).
fn reported_failures(answer: &str, ids: &[&str]) -> Option<Vec<String>> {
    let value: Value = serde_json::from_str(answer).ok()?;
    let Some(failures) = value.get("batchItemFailures") else { return Some(Vec::new()) };
    failures
        .as_array()?
        .iter()
        .map(|f| {
            f.get("itemIdentifier")
                .and_then(Value::as_str)
                .filter(|id| ids.contains(id))
                .map(str::to_owned)
        })
        .collect()
}

fn record(m: &aws_sdk_sqs::types::Message, mapping: &SqsMapping) -> Value {
    let attributes: serde_json::Map<String, Value> = m
        .attributes()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.as_str().to_owned(), Value::String(v.clone())))
        .collect();
    // As Lambda hands them over: each with its type, and string or binary lists left empty.
    let message_attributes: serde_json::Map<String, Value> = m
        .message_attributes()
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            let value = json!({
                "stringValue": v.string_value(),
                "stringListValues": [],
                "binaryListValues": [],
                "dataType": v.data_type(),
            });
            (k.clone(), value)
        })
        .collect();
    json!({
        "messageId": m.message_id(),
        "receiptHandle": m.receipt_handle(),
        "body": m.body(),
        "attributes": attributes,
        "messageAttributes": message_attributes,
        "md5OfBody": m.md5_of_body(),
        "eventSource": "aws:sqs",
        "eventSourceARN": mapping.queue_arn,
        "awsRegion": mapping.region,
    })
}

/// Invokes the function every `period` with a scheduled event, as an EventBridge schedule
/// does. A failed invocation is logged; the next tick comes regardless.
pub fn schedule(
    function: String,
    api: RuntimeApi,
    period: Duration,
    timeout: Duration,
    region: String,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await; // the first tick is immediate; a schedule's first run is not
        loop {
            ticks.tick().await;
            let event = json!({
                "version": "0",
                "id": uuid::Uuid::new_v4().to_string(),
                "detail-type": "Scheduled Event",
                "source": "aws.events",
                "account": LOCAL_ACCOUNT,
                "time": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                "region": region,
                "resources": [format!("arn:aws:events:{region}:{LOCAL_ACCOUNT}:rule/{function}-schedule")],
                "detail": {},
            });
            // EventBridge invokes asynchronously: Lambda keeps a throttled event and tries
            // again, here until it goes through or the next one is due.
            let give_up_at = std::time::Instant::now() + period;
            let payload = event.to_string();
            if let Err(e) = invoke_through_throttling(&api, &payload, 0, timeout, give_up_at).await
            {
                warn!(%function, error = %e, "scheduled invocation failed");
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_item_failures_are_read_strictly() {
        let ids = ["a", "b"];
        assert_eq!(
            reported_failures(r#"{"batchItemFailures":[{"itemIdentifier":"b"}]}"#, &ids),
            Some(vec!["b".to_owned()])
        );
        assert_eq!(reported_failures(r#"{"batchItemFailures":[]}"#, &ids), Some(vec![]));
        assert_eq!(reported_failures("{}", &ids), Some(vec![]));
        assert_eq!(
            reported_failures(r#"{"batchItemFailures":[{"itemIdentifier":"zzz"}]}"#, &ids),
            None
        );
        assert_eq!(reported_failures("not json", &ids), None);
    }
}
