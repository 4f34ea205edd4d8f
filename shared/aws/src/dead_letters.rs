//! Dead-letter queues as an operator works with them: how many messages each holds, what a few
//! of them were for (order, step, receive count), and moving them back to the queue they came
//! from once the cause is fixed.
//!
//! A move is SQS's own message move task where the endpoint has it. Otherwise (emulators) the
//! messages are copied: received, sent to the source queue, and only then deleted, so an
//! interruption can leave a message in both queues but never in neither. Every consumer
//! tolerates duplicates and stale messages, so a copy delivered twice, or a start message for
//! an attempt long gone, changes nothing.

use std::time::{Duration, Instant};

use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::retry::RetryConfig;
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, MessageSystemAttributeName, QueueAttributeName,
    SendMessageBatchRequestEntry,
};
use sas_engine::message::{Message, truncate};
use sas_engine::{Error, Result};
use serde::Serialize;
use tracing::{info, warn};

use crate::errors::classify;

const SERVICE: &str = "sqs";
/// Most messages one receive returns.
const BATCH: i32 = 10;
/// How long a copied message stays hidden in the dead-letter queue between its receive and its
/// delete; if the copy is interrupted it comes back after this.
const COPY_VISIBILITY_S: i32 = 60;
/// Longest part of a body shown for a message that could not be decoded.
const BODY_SHOWN: usize = 512;
/// Error codes with which an endpoint says it has no message move task.
const NO_MOVE_TASK: &[&str] =
    &["UnsupportedOperation", "InvalidAction", "UnknownOperationException", "NotImplemented"];

/// A dead-letter queue and the queue its messages came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetterQueue {
    /// The name operators use: `scheduler`, `replies`, or an agent's name.
    pub name: String,
    pub url: String,
    pub source_url: String,
}

/// How full a dead-letter queue is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueSummary {
    pub queue: String,
    /// Messages waiting to be looked at or moved.
    pub messages: u64,
    /// Messages hidden for a while by a peek or a move under way.
    pub in_flight: u64,
    /// The latest message move task, where the endpoint has them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub move_task: Option<MoveTask>,
}

/// A message move task as SQS reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MoveTask {
    pub status: String,
    pub moved: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to_move: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
}

/// One dead-lettered message and what it was for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeadLetter {
    pub message_id: String,
    /// `start`, `request`, `reply`, `child_ended` or `event` (an event of the bus for the
    /// workflows' starts); absent if the body is not a message of this system.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// `do` or `undo`, for requests and replies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direction: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u64>,
    /// Receives so far, counting the ones that failed before it was dead-lettered (and peeks).
    pub receive_count: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sent_at: Option<String>,
    /// Why the body could not be read, with its beginning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub undecodable: Option<String>,
}

/// What a move did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "method", rename_all = "snake_case")]
pub enum Moved {
    /// SQS moves the messages on its own; `task_handle` names the task.
    MoveTask { task_handle: String },
    /// The messages were copied by this call: `moved` of them; `more` if some were left (the
    /// call's limits were reached) and it should be called again.
    Copy { moved: u64, more: bool },
}

/// The system's dead-letter queues.
#[derive(Clone, Debug)]
pub struct DeadLetters {
    client: Client,
    queues: Vec<DeadLetterQueue>,
}

impl DeadLetters {
    pub fn new(client: Client, queues: Vec<DeadLetterQueue>) -> Self {
        DeadLetters { client, queues }
    }

    pub fn queue(&self, name: &str) -> Option<&DeadLetterQueue> {
        self.queues.iter().find(|q| q.name == name)
    }

    pub fn names(&self) -> Vec<&str> {
        self.queues.iter().map(|q| q.name.as_str()).collect()
    }

    /// Every dead-letter queue with its depth.
    pub async fn summaries(&self) -> Result<Vec<QueueSummary>> {
        let mut out = Vec::with_capacity(self.queues.len());
        for q in &self.queues {
            let attributes = self
                .client
                .get_queue_attributes()
                .queue_url(&q.url)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
                .attribute_names(QueueAttributeName::QueueArn)
                .send()
                .await
                .map_err(|e| classify(SERVICE, e))?;
            let attributes = attributes.attributes();
            let number = |name: QueueAttributeName| {
                attributes
                    .and_then(|a| a.get(&name))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or_default()
            };
            let arn = attributes.and_then(|a| a.get(&QueueAttributeName::QueueArn)).cloned();
            out.push(QueueSummary {
                queue: q.name.clone(),
                messages: number(QueueAttributeName::ApproximateNumberOfMessages),
                in_flight: number(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
                move_task: match arn {
                    Some(arn) => self.latest_move_task(&arn).await,
                    None => None,
                },
            });
        }
        Ok(out)
    }

    /// Up to `limit` (at most 10) messages of a dead-letter queue, left in it. A peek counts as
    /// a receive of each message shown.
    pub async fn peek(&self, queue: &DeadLetterQueue, limit: usize) -> Result<Vec<DeadLetter>> {
        let limit = i32::try_from(limit.clamp(1, BATCH as usize)).unwrap_or(BATCH);
        let out = self
            .client
            .receive_message()
            .queue_url(&queue.url)
            .max_number_of_messages(limit)
            // Visible again at once: a peek must not hide messages from a move that follows.
            .visibility_timeout(0)
            .wait_time_seconds(1)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send()
            .await
            .map_err(|e| classify(SERVICE, e))?;
        let mut letters = Vec::new();
        for m in out.messages() {
            let attribute = |name: MessageSystemAttributeName| {
                m.attributes().and_then(|a| a.get(&name)).cloned()
            };
            let mut letter = DeadLetter {
                message_id: m.message_id().unwrap_or_default().to_owned(),
                kind: None,
                order_id: None,
                step: None,
                direction: None,
                attempt: None,
                receive_count: attribute(MessageSystemAttributeName::ApproximateReceiveCount)
                    .and_then(|c| c.parse().ok())
                    .unwrap_or_default(),
                sent_at: attribute(MessageSystemAttributeName::SentTimestamp)
                    .and_then(|t| t.parse::<i64>().ok())
                    .and_then(chrono::DateTime::from_timestamp_millis)
                    .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
                undecodable: None,
            };
            let body = m.body().unwrap_or_default();
            match Message::decode(body) {
                Ok(message) => describe(&mut letter, &message),
                Err(e) => {
                    // A malformed message may still say which order it was about.
                    letter.order_id = serde_json::from_str::<serde_json::Value>(body)
                        .ok()
                        .and_then(|v| v.get("order_id")?.as_str().map(|s| truncate(s, 64)));
                    letter.undecodable = Some(format!("{e}: {}", truncate(body, BODY_SHOWN)));
                }
            }
            letters.push(letter);
        }
        Ok(letters)
    }

    /// Moves the messages of a dead-letter queue back to its source queue: SQS's move task if
    /// the endpoint has one, otherwise a copy of at most `max` messages within `budget`.
    pub async fn redrive(
        &self,
        queue: &DeadLetterQueue,
        max: u64,
        budget: Duration,
    ) -> Result<Moved> {
        let arn = self.arn(&queue.url).await?;
        let started = self
            .client
            .start_message_move_task()
            .source_arn(&arn)
            .customize()
            .config_override(no_retries())
            .send()
            .await;
        match started {
            Ok(out) => {
                let task_handle = out.task_handle().unwrap_or_default().to_owned();
                info!(queue = %queue.name, %task_handle, "dead-letter move task started");
                Ok(Moved::MoveTask { task_handle })
            }
            Err(e) if no_move_task(&e) => {
                warn!(queue = %queue.name, error = %aws_sdk_sqs::error::DisplayErrorContext(&e),
                      "no message move task at this endpoint; copying the messages");
                self.copy(queue, max, budget).await
            }
            Err(e) => Err(classify(SERVICE, e)),
        }
    }

    /// Receive, send to the source, then delete: a message is deleted only once its copy is
    /// accepted by the source queue.
    async fn copy(&self, queue: &DeadLetterQueue, max: u64, budget: Duration) -> Result<Moved> {
        let deadline = Instant::now() + budget;
        let mut moved = 0;
        while moved < max && Instant::now() < deadline {
            let want = i32::try_from((max - moved).min(BATCH as u64)).unwrap_or(BATCH);
            let received = self
                .client
                .receive_message()
                .queue_url(&queue.url)
                .max_number_of_messages(want)
                .visibility_timeout(COPY_VISIBILITY_S)
                .wait_time_seconds(1)
                .message_attribute_names("All")
                .send()
                .await
                .map_err(|e| classify(SERVICE, e))?;
            let messages = received.messages();
            if messages.is_empty() {
                info!(queue = %queue.name, moved, "dead letters copied back");
                return Ok(Moved::Copy { moved, more: false });
            }
            let entries = messages
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    SendMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .message_body(m.body().unwrap_or_default())
                        .set_message_attributes(m.message_attributes().cloned())
                        .build()
                        .map_err(|e| Error::rejected(SERVICE, e))
                })
                .collect::<Result<Vec<_>>>()?;
            let sent = self
                .client
                .send_message_batch()
                .queue_url(&queue.source_url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| classify(SERVICE, e))?;
            // Only what the source queue accepted is deleted; the rest reappears later.
            let deletes = sent
                .successful()
                .iter()
                .filter_map(|ok| {
                    let m = messages.get(ok.id().parse::<usize>().ok()?)?;
                    DeleteMessageBatchRequestEntry::builder()
                        .id(ok.id())
                        .receipt_handle(m.receipt_handle()?)
                        .build()
                        .ok()
                })
                .collect::<Vec<_>>();
            let accepted = deletes.len() as u64;
            if accepted > 0 {
                self.client
                    .delete_message_batch()
                    .queue_url(&queue.url)
                    .set_entries(Some(deletes))
                    .send()
                    .await
                    .map_err(|e| classify(SERVICE, e))?;
            }
            moved += accepted;
            if let Some(f) = sent.failed().first() {
                return Err(Error::unavailable(
                    SERVICE,
                    format!(
                        "{} of {} dead letters not sent back after {moved} moved: {} {}",
                        sent.failed().len(),
                        messages.len(),
                        f.code(),
                        f.message().unwrap_or_default()
                    ),
                ));
            }
        }
        info!(queue = %queue.name, moved, "dead letters copied back; more left");
        Ok(Moved::Copy { moved, more: true })
    }

    async fn arn(&self, url: &str) -> Result<String> {
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .map_err(|e| classify(SERVICE, e))?;
        out.attributes()
            .and_then(|a| a.get(&QueueAttributeName::QueueArn))
            .cloned()
            .ok_or_else(|| Error::rejected(SERVICE, format!("no ARN for queue {url}")))
    }

    /// The latest move task of a dead-letter queue; `None` where the endpoint has none.
    async fn latest_move_task(&self, arn: &str) -> Option<MoveTask> {
        let out = self
            .client
            .list_message_move_tasks()
            .source_arn(arn)
            .max_results(1)
            .customize()
            .config_override(no_retries())
            .send()
            .await
            .ok()?;
        let task = out.results().first()?;
        Some(MoveTask {
            status: task.status().unwrap_or("UNKNOWN").to_owned(),
            moved: task.approximate_number_of_messages_moved(),
            to_move: task.approximate_number_of_messages_to_move(),
            failure: task.failure_reason().map(str::to_owned),
        })
    }
}

/// For the move-task calls: an endpoint without the operation answers 5xx, and retrying it
/// only delays the fallback.
fn no_retries() -> aws_sdk_sqs::config::Builder {
    aws_sdk_sqs::config::Builder::default().retry_config(RetryConfig::disabled())
}

fn describe(letter: &mut DeadLetter, message: &Message) {
    letter.order_id = message.order_id().map(|id| id.to_string());
    let step = match message {
        Message::Start(m) => {
            letter.kind = Some("start");
            letter.attempt = Some(m.attempt);
            None
        }
        Message::Request(m) => {
            letter.kind = Some("request");
            letter.attempt = Some(m.attempt);
            Some(&m.step)
        }
        Message::Reply(m) => {
            letter.kind = Some("reply");
            letter.attempt = Some(m.attempt);
            Some(&m.step)
        }
        Message::ChildEnded(m) => {
            letter.kind = Some("child_ended");
            letter.attempt = Some(m.attempt);
            Some(&m.step)
        }
        Message::Elements(m) => {
            letter.kind = Some("elements");
            letter.attempt = Some(m.attempt);
            Some(&m.step)
        }
        Message::ElementsReply(m) => {
            letter.kind = Some("elements_reply");
            letter.attempt = Some(m.attempt);
            Some(&m.step)
        }
        Message::Event(_) => {
            letter.kind = Some("event");
            None
        }
    };
    if let Some(step) = step {
        letter.step = Some(step.name.clone());
        letter.direction = Some(step.direction.as_str().to_owned());
    }
}

/// Whether an error says the endpoint has no message move task (rather than that this one
/// failed): an unknown operation, or a server error without an error code.
fn no_move_task<E: ProvideErrorMetadata, R>(e: &SdkError<E, R>) -> bool {
    match e {
        SdkError::ServiceError(service) => {
            let code = service.err().code();
            code.is_none_or(|c| NO_MOVE_TASK.contains(&c) || c.chars().all(|c| c.is_ascii_digit()))
        }
        _ => false,
    }
}
