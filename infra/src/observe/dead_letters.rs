//! Dead-letter arrivals, reported as they happen: which queue, which order, and why.
//!
//! SQS says nothing when it moves a message to a dead-letter queue, and a look at the message
//! there (a receive) would count against it. So the local stack puts together what it already
//! sees: its event source mappings know which deliveries failed and how often each message
//! was received, the functions' logs say why a message failed ([`DeadLetters::note_log`]), and
//! a watch on each dead-letter queue's depth tells when SQS moved something. A message whose
//! last allowed delivery failed is *condemned*; when the depth of its dead-letter queue
//! grows, the condemned messages of its source queue are reported as arrived, oldest first.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_sqs::types::QueueAttributeName;
use serde::Serialize;
use serde_json::Value;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::Error;
use crate::emulation::provision::Stack;
use crate::emulation::template::{Resource, Template, scalar_string};

/// Most reasons remembered: the messages that failed lately, not all that ever did.
const REASONS_KEPT: usize = 10_000;
/// Longest reason shown.
const REASON_SHOWN: usize = 300;
/// How often each dead-letter queue's depth is read.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// One message that reached a dead-letter queue.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Arrival {
    /// Seconds since the Unix epoch.
    pub at: f64,
    /// The queue it came from (its logical id, `SchedulerQueue`), and the dead-letter queue.
    pub queue: String,
    pub dead_letter_queue: String,
    pub message_id: Option<String>,
    pub order_id: Option<String>,
    /// `start`, `request` or `reply`, as the body says.
    pub kind: Option<String>,
    pub receives: Option<u32>,
    /// The last error logged for it, or what is known instead.
    pub reason: String,
}

impl std::fmt::Display for Arrival {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "dead letter: {} -> {}", self.queue, self.dead_letter_queue)?;
        if let Some(kind) = &self.kind {
            write!(f, ", a {kind}")?;
        }
        if let Some(order) = &self.order_id {
            write!(f, " of order {order}")?;
        }
        if let Some(n) = self.receives {
            write!(f, " after {n} receives")?;
        }
        write!(f, ": {}", self.reason)
    }
}

/// A message whose last allowed delivery failed: SQS moves it on its next receive.
#[derive(Clone, Debug)]
struct Condemned {
    message_id: String,
    order_id: Option<String>,
    kind: Option<String>,
    receives: u32,
    /// Why the delivery failed, when the invocation itself failed.
    failure: Option<String>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Message id to the last error logged for it, with the order of arrival to forget the
    /// oldest.
    reasons: HashMap<String, String>,
    reason_order: VecDeque<String>,
    /// Source queue URL to its condemned messages, oldest first.
    condemned: HashMap<String, VecDeque<Condemned>>,
    arrivals: Vec<Arrival>,
}

/// What the local stack knows about dead letters; cheap to clone, shared by the pollers, the
/// processes' output readers and the watches.
#[derive(Clone, Debug, Default)]
pub struct DeadLetters {
    inner: Arc<Mutex<Inner>>,
    /// Whether arrivals are printed as they are found.
    print: bool,
}

/// A queue with a redrive policy.
#[derive(Clone, Debug)]
pub struct Redrive {
    /// Logical ids of the queue and of its dead-letter queue.
    pub queue: String,
    pub dead_letter_queue: String,
    pub queue_url: String,
    pub dead_letter_url: String,
    pub max_receive_count: u32,
    /// How long a received message stays hidden (SQS's default when the template sets none).
    pub visibility_timeout: Duration,
}

impl DeadLetters {
    /// `print`: whether each arrival is printed on our output as it is found.
    pub fn new(print: bool) -> Self {
        DeadLetters { inner: Arc::default(), print }
    }

    /// Every arrival so far, oldest first.
    pub fn arrivals(&self) -> Vec<Arrival> {
        self.lock().arrivals.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads a function's log line (JSON, as the functions print on Lambda): a warning or an
    /// error about a message is remembered as that message's latest reason.
    pub fn note_log(&self, line: &str) {
        if !line.starts_with("{") || !(line.contains("\"WARN\"") || line.contains("\"ERROR\"")) {
            return;
        }
        let Ok(v) = serde_json::from_str::<Value>(line) else { return };
        let Some(id) = message_id_of(&v) else { return };
        let text = |key: &str| v.get(key).and_then(Value::as_str);
        let reason = match (text("message"), text("error")) {
            (Some(m), Some(e)) => format!("{m}: {e}"),
            (Some(m), None) => m.to_owned(),
            (None, Some(e)) => e.to_owned(),
            (None, None) => return,
        };
        let mut inner = self.lock();
        if inner.reasons.insert(id.clone(), shorten(&reason)).is_none() {
            inner.reason_order.push_back(id);
            while inner.reason_order.len() > REASONS_KEPT {
                if let Some(old) = inner.reason_order.pop_front() {
                    inner.reasons.remove(&old);
                }
            }
        }
    }

    /// Notes that a delivery of a message from `queue_url` failed on its `receives`-th
    /// receive, out of `max_receive_count` allowed; `failure` says why when the whole
    /// invocation failed. Only the last allowed delivery matters.
    pub fn note_failed_delivery(
        &self,
        queue_url: &str,
        max_receive_count: Option<u32>,
        message: &aws_sdk_sqs::types::Message,
        failure: Option<&str>,
    ) {
        let Some(max) = max_receive_count else { return };
        let receives = message
            .attributes()
            .and_then(|a| {
                a.get(&aws_sdk_sqs::types::MessageSystemAttributeName::ApproximateReceiveCount)
            })
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(0);
        if receives < max {
            return;
        }
        let body: Value =
            message.body().and_then(|b| serde_json::from_str(b).ok()).unwrap_or_default();
        let text = |key: &str| body.get(key).and_then(Value::as_str).map(str::to_owned);
        let condemned = Condemned {
            message_id: message.message_id().unwrap_or_default().to_owned(),
            order_id: text("order_id"),
            // An event of the bus has no type of ours (see `sas_engine::message`).
            kind: text("type").or_else(|| text("detail-type").map(|_| "event".to_owned())),
            receives,
            failure: failure.map(shorten),
        };
        let mut inner = self.lock();
        let queue = inner.condemned.entry(queue_url.to_owned()).or_default();
        if !queue.iter().any(|c| c.message_id == condemned.message_id) {
            queue.push_back(condemned);
        }
    }

    /// `arrived` messages reached `redrive`'s dead-letter queue: reports them.
    fn arrived(&self, redrive: &Redrive, arrived: u64) {
        let at = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64();
        let mut found = Vec::new();
        {
            let mut inner = self.lock();
            for _ in 0..arrived {
                let next =
                    inner.condemned.get_mut(&redrive.queue_url).and_then(VecDeque::pop_front);
                let arrival = match next {
                    Some(c) => {
                        let reason = c
                            .failure
                            .clone()
                            .or_else(|| inner.reasons.get(&c.message_id).cloned())
                            .unwrap_or_else(|| {
                                "its function reported it failed, without logging why".into()
                            });
                        Arrival {
                            at,
                            queue: redrive.queue.clone(),
                            dead_letter_queue: redrive.dead_letter_queue.clone(),
                            message_id: Some(c.message_id),
                            order_id: c.order_id,
                            kind: c.kind,
                            receives: Some(c.receives),
                            reason,
                        }
                    }
                    None => Arrival {
                        at,
                        queue: redrive.queue.clone(),
                        dead_letter_queue: redrive.dead_letter_queue.clone(),
                        message_id: None,
                        order_id: None,
                        kind: None,
                        receives: None,
                        reason: "no failed delivery of it was seen (sent there directly?)".into(),
                    },
                };
                inner.arrivals.push(arrival.clone());
                found.push(arrival);
            }
        }
        if self.print {
            for a in found {
                println!("{a}");
            }
        }
    }

    /// Watches the depth of each dead-letter queue of `redrives` and reports what arrives.
    /// `sqs` should not be counted as the system's calls.
    pub fn watch(&self, sqs: aws_sdk_sqs::Client, redrives: Vec<Redrive>) -> JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut depths: BTreeMap<String, u64> = BTreeMap::new();
            let mut ticks = tokio::time::interval(WATCH_EVERY);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                for redrive in &redrives {
                    let depth = match depth(&sqs, &redrive.dead_letter_url).await {
                        Ok(depth) => depth,
                        Err(e) => {
                            warn!(queue = %redrive.dead_letter_url, error = %e, "cannot read a dead-letter queue's depth");
                            continue;
                        }
                    };
                    let seen = depths.insert(redrive.dead_letter_url.clone(), depth).unwrap_or(0);
                    // Fewer than before: some were moved back or deleted; nothing arrived.
                    if depth > seen {
                        this.arrived(redrive, depth - seen);
                    }
                }
            }
        })
    }
}

/// A queue's redrive policy, evaluated; `Null` if it has none.
pub(crate) fn redrive_policy(stack: &Stack, queue: &Resource) -> Result<Value, Error> {
    let policy = stack.eval(queue.properties.get("RedrivePolicy").unwrap_or(&Value::Null))?;
    // CloudFormation takes the redrive policy as an object or as its JSON text.
    Ok(match policy {
        Value::String(text) => serde_json::from_str(&text).unwrap_or(Value::Null),
        other => other,
    })
}

/// Every queue of `stack` with a redrive policy, with its dead-letter queue.
pub fn redrives(template: &Template, stack: &Stack) -> Result<Vec<Redrive>, Error> {
    let mut out = Vec::new();
    for (id, resource) in template.of_kind("AWS::SQS::Queue") {
        if !stack.context.holds(resource.condition.as_deref()) {
            continue;
        }
        let policy = redrive_policy(stack, resource)?;
        let Some(target) = policy.get("deadLetterTargetArn").map(scalar_string).transpose()? else {
            continue;
        };
        let max_receive_count = policy
            .get("maxReceiveCount")
            .map(scalar_string)
            .transpose()?
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| {
                Error::Template(format!("{id}: a redrive policy without maxReceiveCount"))
            })?;
        let dead_letter_queue = stack
            .context
            .attributes
            .iter()
            .find(|((_, attribute), value)| attribute == "Arn" && value.as_str() == Some(&target))
            .map(|((dlq, _), _)| dlq.clone())
            .ok_or_else(|| {
                Error::Local(format!("{id}: no dead-letter queue {target} was created"))
            })?;
        let visibility_timeout = stack
            .eval(resource.properties.get("VisibilityTimeout").unwrap_or(&Value::from(30)))
            .and_then(|v| scalar_string(&v))?
            .parse()
            .map(Duration::from_secs)
            .map_err(|_| Error::Template(format!("{id}: VisibilityTimeout is not a number")))?;
        let url = |logical_id: &str| {
            stack
                .reference(logical_id)
                .ok_or_else(|| Error::Local(format!("no {logical_id} was created")))
        };
        out.push(Redrive {
            queue_url: url(id)?,
            dead_letter_url: url(&dead_letter_queue)?,
            queue: id.to_owned(),
            dead_letter_queue,
            max_receive_count,
            visibility_timeout,
        });
    }
    Ok(out)
}

/// Messages in a queue, visible or not.
pub(crate) async fn depth(sqs: &aws_sdk_sqs::Client, url: &str) -> Result<u64, String> {
    let out = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(e).to_string())?;
    let attributes = out.attributes.unwrap_or_default();
    let n = |name: QueueAttributeName| {
        attributes.get(&name).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
    };
    Ok(n(QueueAttributeName::ApproximateNumberOfMessages)
        + n(QueueAttributeName::ApproximateNumberOfMessagesNotVisible))
}

/// The message id a JSON log line is about: a field of its own, or of its span(s).
fn message_id_of(v: &Value) -> Option<String> {
    let direct = v.get("message_id").or_else(|| v.pointer("/span/message_id"));
    let in_spans = || {
        v.get("spans")
            .and_then(Value::as_array)
            .and_then(|spans| spans.iter().rev().find_map(|s| s.get("message_id")))
    };
    direct.or_else(in_spans).and_then(Value::as_str).map(str::to_owned)
}

fn shorten(s: &str) -> String {
    match s.char_indices().nth(REASON_SHOWN) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(id: &str, receives: u32, body: &str) -> aws_sdk_sqs::types::Message {
        aws_sdk_sqs::types::Message::builder()
            .message_id(id)
            .body(body)
            .attributes(
                aws_sdk_sqs::types::MessageSystemAttributeName::ApproximateReceiveCount,
                receives.to_string(),
            )
            .build()
    }

    fn redrive() -> Redrive {
        Redrive {
            queue: "ReplyQueue".into(),
            dead_letter_queue: "ReplyDeadLetterQueue".into(),
            queue_url: "http://q/reply".into(),
            dead_letter_url: "http://q/reply-dlq".into(),
            max_receive_count: 5,
            visibility_timeout: Duration::from_secs(71),
        }
    }

    #[test]
    fn an_arrival_names_its_order_and_the_last_error_logged_for_it() {
        let d = DeadLetters::new(false);
        let body = r#"{"v":1,"type":"reply","order_id":"o-1"}"#;
        d.note_log(r#"{"level":"WARN","error":"first","message":"will be retried","span":{"message_id":"m-1","name":"message"}}"#);
        d.note_log(r#"{"level":"ERROR","error":"bad body","message":"cannot be handled","span":{"message_id":"m-1","name":"message"}}"#);
        d.note_log(r#"{"level":"INFO","message":"fine","span":{"message_id":"m-1"}}"#);
        // An earlier delivery failed: not the last allowed one, nothing is condemned.
        d.note_failed_delivery("http://q/reply", Some(5), &message("m-1", 4, body), None);
        d.arrived(&redrive(), 1);
        assert_eq!(d.arrivals()[0].message_id, None, "nothing was condemned yet");
        d.note_failed_delivery("http://q/reply", Some(5), &message("m-1", 5, body), None);
        d.note_failed_delivery("http://q/reply", Some(5), &message("m-1", 5, body), None);
        d.arrived(&redrive(), 1);
        let a = &d.arrivals()[1];
        assert_eq!(a.order_id.as_deref(), Some("o-1"));
        assert_eq!(a.kind.as_deref(), Some("reply"));
        assert_eq!(a.receives, Some(5));
        assert_eq!(a.reason, "cannot be handled: bad body");
        assert_eq!(
            a.to_string(),
            "dead letter: ReplyQueue -> ReplyDeadLetterQueue, a reply of order o-1 after 5 receives: cannot be handled: bad body"
        );
        // Noted twice, reported once.
        d.arrived(&redrive(), 1);
        assert_eq!(d.arrivals()[2].message_id, None);
    }

    #[test]
    fn a_failed_invocation_is_its_own_reason() {
        let d = DeadLetters::new(false);
        d.note_failed_delivery(
            "http://q/reply",
            Some(5),
            &message("m-2", 6, "not json"),
            Some("the function timed out"),
        );
        d.arrived(&redrive(), 1);
        let a = &d.arrivals()[0];
        assert_eq!((a.order_id.as_deref(), a.reason.as_str()), (None, "the function timed out"));
    }

    #[test]
    fn every_work_queue_leaves_receives_for_a_message_to_be_sent_again() {
        let template = crate::emulation::provision::project_template();
        let stack = crate::emulation::provision::local_dry_run(&template, &[]);
        let found = redrives(&template, &stack).unwrap();
        // The scheduler's two queues and each agent's.
        let agents = crate::tools::workflows::deployed_agents(&template).unwrap();
        assert_eq!(found.len(), 2 + agents.len(), "{found:?}");
        for r in found {
            // A message kept back by a passing cause is sent again on this receive; if that
            // send fails too, later receives must still be left before the dead-letter queue.
            assert!(
                r.max_receive_count > sas_aws::batch::REQUEUE_FROM_RECEIVE + 1,
                "{}: maxReceiveCount {} leaves no receive to spare",
                r.queue,
                r.max_receive_count
            );
            assert!(r.visibility_timeout >= Duration::from_secs(60), "{}", r.queue);
        }
    }
}
