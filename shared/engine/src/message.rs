//! Queue messages: versioned JSON envelopes.
//!
//! Three kinds travel: `start` (to the scheduler queue: "claim this order"), `request` (to an
//! agent's queue: "perform this step"), and `reply` (to the reply queue: "this is how it went").
//! Requests and replies carry the order id, the step, the attempt (the fencing token), the
//! CompleteBy of the lease, the idempotency key of the remote call and a correlation id. A start
//! carries the order id, the attempt it expects to claim, and the correlation id: everything
//! else is in the state record.
//!
//! Every message also says when it became due (`due_at`: when it was sent, plus any delay), so
//! that its consumer can tell how long it waited in the queue (see [`crate::load`]), and a
//! request says how long the agent may work on it (`budget_ms`), counted from when the agent
//! takes it: time spent waiting in a queue is never taken from the work.
//!
//! A fourth kind comes from outside: an event of the stack's bus, delivered to the scheduler
//! queue by the bus as it is (no envelope of ours), for the starts the workflows declare
//! ([`crate::starts`]). It is told apart by its shape and sent again as it came.
//!
//! Every envelope has `"v": 1`. Unknown fields are ignored, so a newer sender can add fields
//! without breaking an older consumer; anything that changes a field's meaning takes a new
//! version, which an older consumer rejects as a poison message rather than misreading.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::ids::{Direction, OrderId};
use crate::order::Order;
use crate::time::Timestamp;

/// The envelope version this code writes and reads.
pub const VERSION: u32 = 1;
/// Longest failure reason kept from an agent, in bytes; longer ones are cut.
pub const MAX_REASON_LEN: usize = 300;
/// Largest step output carried as it is, in bytes of JSON: the output lives in the state
/// record, which must stay small, and rides in every later step's request. An agent that keeps
/// payloads stores a larger one (up to [`crate::payload::MAX_PAYLOAD_LEN`]) and carries a
/// reference instead ([`crate::payload`]); above that, or with no store, the step fails (or,
/// if its workflow says so, is reported) with its effect in place.
pub const MAX_OUTPUT_LEN: usize = 512;

/// Any message, tagged by `type`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    Start(Start),
    Request(Box<StepRequest>),
    Reply(StepReply),
    ChildEnded(ChildEnded),
    /// The calls of some elements of a step over a list run inline, to one agent.
    Elements(Box<ElementsRequest>),
    /// How some of those calls went, in one reply.
    ElementsReply(ElementsReply),
    /// An event of the bus, whole: its fields are the bus's, not ours.
    #[serde(skip)]
    Event(Box<serde_json::Value>),
}

/// "My child order ended": sent by whichever service ended a child, to the scheduler, which
/// reads the child to learn how and answers the parent's step with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildEnded {
    /// The parent.
    pub order_id: OrderId,
    /// The attempt of the parent step's lease the child answers.
    pub attempt: u64,
    pub correlation_id: String,
    pub step: StepRef,
    pub child: OrderId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_at: Option<Timestamp>,
    /// The order's group ([`crate::fair`]), which the queue delivers it by. Absent without
    /// fair queues, and from older senders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// "Claim this order": sent by submission and by the supervisor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Start {
    pub order_id: OrderId,
    /// The attempt the sender saw while the order was Pending; a claim succeeds only if the
    /// record still has it.
    pub attempt: u64,
    pub correlation_id: String,
    /// When the message became due: sent, plus its delay. Absent from older senders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_at: Option<Timestamp>,
    /// The order's group ([`crate::fair`]), which the queue delivers it by. Absent without
    /// fair queues, and from older senders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// Which step, and which way.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRef {
    pub index: usize,
    pub name: String,
    pub direction: Direction,
    /// For a step over a list: the element whose child this is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub element: Option<u32>,
}

/// "Perform this action before CompleteBy": sent by the scheduler to an agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepRequest {
    pub order_id: OrderId,
    pub attempt: u64,
    pub correlation_id: String,
    pub step: StepRef,
    /// The remote action: the step's name, or its compensation's action.
    pub action: String,
    pub complete_by: Timestamp,
    /// The same for every retry and re-dispatch of this step of this order.
    pub idempotency_key: String,
    pub order: Order,
    /// For an undo, the output of the step being undone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<serde_json::Value>,
    /// For a step, the outputs of the steps it depends on (directly or through others), by step
    /// name, so that it can use what they produced (a shipment, the reservation's reference).
    /// Each is at most [`MAX_OUTPUT_LEN`] bytes of JSON (a larger one is a reference to its
    /// stored value), so a request stays far below SQS's 256 KiB.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub outputs: BTreeMap<String, serde_json::Value>,
    /// When the request was sent. Absent from older senders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_at: Option<Timestamp>,
    /// How long the agent may work on it, from when it takes it. Absent from older senders,
    /// whose agents work until `complete_by`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_ms: Option<u64>,
    /// The step waited for a hold of its service, and was resumed since: its calls take their
    /// turns at the stack's resume rate, so that the orders that waited do not all reach the
    /// service as it comes back.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resumed: bool,
    /// The step fails if this lease runs out (its expired leases would reach the step's
    /// threshold): the agent holds the action rather than let passing faults alone fail it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub last_lease: bool,
    /// The order's group ([`crate::fair`]), which the queue delivers it by. Absent without
    /// fair queues, and from older senders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// "This is how it went": sent by an agent to the scheduler, only before CompleteBy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepReply {
    pub order_id: OrderId,
    pub attempt: u64,
    pub correlation_id: String,
    pub step: StepRef,
    pub complete_by: Timestamp,
    pub idempotency_key: String,
    pub outcome: StepOutcome,
    /// When the reply was sent. Absent from older senders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_at: Option<Timestamp>,
    /// The order's group ([`crate::fair`]), which the queue delivers it by. Absent without
    /// fair queues, and from older senders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// Most elements one [`ElementsRequest`] carries: what one SQS batch would.
pub const MAX_ELEMENTS_A_REQUEST: usize = 10;

/// "Perform these elements' calls before CompleteBy": sent by the scheduler to the agent of a
/// step over a list that runs inline ([`crate::workflow::Inline`]), for elements started
/// together. Each element is called as the step of its child order would be, under its own
/// order id and keys; the request's lease is the step's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ElementsRequest {
    /// The order whose step runs over the list.
    pub order_id: OrderId,
    pub attempt: u64,
    pub correlation_id: String,
    /// The step over the list (no element named: the request is for those in `elements`).
    pub step: StepRef,
    /// The remote action: the child step's name, or its compensation's action.
    pub action: String,
    pub complete_by: Timestamp,
    pub elements: Vec<ElementCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resumed: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub last_lease: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// One element's call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ElementCall {
    /// Its place in the list.
    pub element: u32,
    /// The id its child order would have had, which its service sees as the call's order.
    pub order_id: OrderId,
    /// The same for every re-send of this element's call (its child's step's key).
    pub idempotency_key: String,
    /// The element: its child's input.
    pub input: serde_json::Value,
    /// For an undo, the output of the element's call being undone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<serde_json::Value>,
}

/// "This is how these went": sent by an agent for an [`ElementsRequest`], naming each element
/// it has an answer for. An element it has none for (its budget ran out, its faults outlasted
/// the retries) is left out, as a step's request is left unanswered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ElementsReply {
    pub order_id: OrderId,
    pub attempt: u64,
    pub correlation_id: String,
    pub step: StepRef,
    pub complete_by: Timestamp,
    pub outcomes: Vec<ElementOutcome>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// How one element's call went.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ElementOutcome {
    pub element: u32,
    pub outcome: StepOutcome,
}

impl ElementsRequest {
    /// Element `call`'s request, as the step of its child order would have been sent: what
    /// the agent performs for it.
    pub fn request_of(&self, call: &ElementCall) -> StepRequest {
        StepRequest {
            order_id: call.order_id,
            attempt: self.attempt,
            correlation_id: self.correlation_id.clone(),
            step: StepRef { element: Some(call.element), ..self.step.clone() },
            action: self.action.clone(),
            complete_by: self.complete_by,
            idempotency_key: call.idempotency_key.clone(),
            order: Order(call.input.clone()),
            input: call.output.clone(),
            outputs: BTreeMap::new(),
            due_at: self.due_at,
            budget_ms: self.budget_ms,
            resumed: self.resumed,
            last_lease: self.last_lease,
            group: self.group.clone(),
        }
    }

    /// The reply with `outcomes`.
    pub fn reply(&self, outcomes: Vec<ElementOutcome>, now: Timestamp) -> ElementsReply {
        ElementsReply {
            order_id: self.order_id,
            attempt: self.attempt,
            correlation_id: self.correlation_id.clone(),
            step: self.step.clone(),
            complete_by: self.complete_by,
            outcomes,
            due_at: Some(now),
            group: self.group.clone(),
        }
    }
}

/// The longest SQS delays a message: a start message due later is not sent, and a sweep acts
/// in its place.
pub const MAX_DELIVERY_DELAY: Duration = Duration::from_secs(900);

/// The longest a step is deferred at once ([`StepOutcome::Deferred`]): its start message is
/// sent with the delay.
pub const MAX_DEFER: Duration = MAX_DELIVERY_DELAY;

/// The result an agent reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum StepOutcome {
    /// The remote action took effect; `output` is what the service returned.
    Done { output: serde_json::Value },
    /// The remote service refused for good (not a transient fault); the action took no effect.
    Failed { reason: String },
    /// The remote action took effect, but its output of `bytes` bytes of JSON is larger than
    /// the agent may keep ([`crate::payload::MAX_PAYLOAD_LEN`], or [`MAX_OUTPUT_LEN`] for an
    /// agent without a payload store): the order records that, and does not carry the output.
    TooLarge { bytes: u64 },
    /// The agent's service, or the step's action there, is held (down, or refusing more
    /// calls for now), and the agent did not get an answer from it: the step waits for it to
    /// open, under the same keys, without counting against its leases. `reason` says why it
    /// is held; `action` names the action held, absent when the whole service is.
    Held {
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        action: Option<String>,
    },
    /// The agent's service had no room for the call before the budget ended (its turns or
    /// places in flight were taken, or it asked to be left alone for longer): the agent did
    /// not call it again, and the step goes again at `until`, under the same keys, at a new
    /// lease that starts then. Nothing counts against the step.
    Deferred { until: Timestamp },
}

impl StepOutcome {
    /// Builds a `Done` outcome, or `TooLarge` for an output too large to keep.
    pub fn done(output: serde_json::Value) -> StepOutcome {
        match output_len(&output) {
            Some(bytes) => StepOutcome::TooLarge { bytes },
            None => StepOutcome::Done { output },
        }
    }

    /// Builds a `Held` outcome for a hold of `action` (`None`: of the whole service), cutting
    /// the reason to [`MAX_REASON_LEN`] bytes.
    pub fn held(reason: &str, action: Option<&str>) -> StepOutcome {
        StepOutcome::Held {
            reason: truncate(reason, MAX_REASON_LEN),
            action: action.map(str::to_owned),
        }
    }

    /// Builds a `Failed` outcome, cutting the reason to [`MAX_REASON_LEN`] bytes.
    pub fn failed(reason: &str) -> StepOutcome {
        StepOutcome::Failed { reason: truncate(reason, MAX_REASON_LEN) }
    }
}

/// The size of `output` in bytes of JSON if it is larger than [`MAX_OUTPUT_LEN`].
pub fn output_len(output: &serde_json::Value) -> Option<u64> {
    let len = serde_json::to_string(output).map_or(u64::MAX, |s| s.len() as u64);
    (len > MAX_OUTPUT_LEN as u64).then_some(len)
}

/// Cuts `s` to at most `max` bytes on a character boundary.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

#[derive(Serialize)]
struct Outgoing<'a> {
    v: u32,
    #[serde(flatten)]
    message: &'a Message,
}

fn decode_as<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, Error> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let reason = without_quoted_values(&e.inner().to_string());
        Error::InvalidMessage(format!("{}: {reason}", e.path()))
    })
}

/// A decoding error without the values it quotes (`invalid type: string "Ada Lovelace"`):
/// it is logged, and a value of a poison message may be a customer's.
fn without_quoted_values(reason: &str) -> String {
    reason
        .split('"')
        .enumerate()
        .map(|(i, part)| if i % 2 == 1 { "…" } else { part })
        .collect::<Vec<_>>()
        .join("\"")
}

impl Message {
    /// The JSON body of this message, with its version.
    pub fn encode(&self) -> String {
        if let Message::Event(event) = self {
            return event.to_string();
        }
        serde_json::to_string(&Outgoing { v: VERSION, message: self }).unwrap_or_default()
    }

    /// Decodes a body. Every failure is an [`Error::InvalidMessage`] naming what is wrong, so a
    /// consumer can route the message to its dead-letter queue with a reason.
    pub fn decode(body: &str) -> Result<Message, Error> {
        let invalid = Error::InvalidMessage;
        let value: serde_json::Value =
            serde_json::from_str(body).map_err(|e| invalid(format!("not JSON: {e}")))?;
        let serde_json::Value::Object(fields) = value else {
            return Err(invalid("not a JSON object".into()));
        };
        if !fields.contains_key("v") && is_event(&fields) {
            return Ok(Message::Event(Box::new(serde_json::Value::Object(fields))));
        }
        match fields.get("v") {
            Some(v) if v.as_u64() == Some(u64::from(VERSION)) => {}
            Some(v) => return Err(invalid(format!("unsupported envelope version {v}"))),
            None => return Err(invalid("missing envelope version `v`".into())),
        }
        let kind = fields.get("type").and_then(|t| t.as_str()).unwrap_or_default().to_owned();
        // Each kind is decoded on its own (not through the tagged enum) so that errors can name
        // the offending field.
        let fields = serde_json::Value::Object(fields);
        match kind.as_str() {
            "start" => decode_as(fields).map(Message::Start),
            "request" => decode_as(fields).map(|r| Message::Request(Box::new(r))),
            "reply" => decode_as(fields).map(Message::Reply),
            "child_ended" => decode_as(fields).map(Message::ChildEnded),
            "elements" => decode_as(fields).map(|r| Message::Elements(Box::new(r))),
            "elements_reply" => decode_as(fields).map(Message::ElementsReply),
            "" => Err(invalid("missing message `type`".into())),
            other => Err(invalid(format!("unknown message type {other:?}"))),
        }
    }

    /// The order the message is about; an event is about none yet.
    pub fn order_id(&self) -> Option<OrderId> {
        match self {
            Message::Start(m) => Some(m.order_id),
            Message::Request(m) => Some(m.order_id),
            Message::Reply(m) => Some(m.order_id),
            Message::ChildEnded(m) => Some(m.order_id),
            Message::Elements(m) => Some(m.order_id),
            Message::ElementsReply(m) => Some(m.order_id),
            Message::Event(_) => None,
        }
    }

    /// When the message became due for its consumer, if its sender said.
    pub fn due_at(&self) -> Option<Timestamp> {
        match self {
            Message::Start(m) => m.due_at,
            Message::Request(m) => m.due_at,
            Message::Reply(m) => m.due_at,
            Message::ChildEnded(m) => m.due_at,
            Message::Elements(m) => m.due_at,
            Message::ElementsReply(m) => m.due_at,
            Message::Event(_) => None,
        }
    }

    /// Whether it tells of a fault in its order: the service refused the step, kept no room
    /// for its output or is held; a lease ran out before (the last one, or a step resumed
    /// after a hold); or a step is being undone. An order's trace, if it was not sampled at
    /// its start, is kept from its first such message on.
    pub fn tells_of_fault(&self) -> bool {
        match self {
            Message::Request(m) => m.step.direction == Direction::Undo || m.resumed || m.last_lease,
            Message::Reply(m) => {
                m.step.direction == Direction::Undo
                    || matches!(
                        m.outcome,
                        StepOutcome::Failed { .. }
                            | StepOutcome::TooLarge { .. }
                            | StepOutcome::Held { .. }
                    )
            }
            Message::Elements(m) => {
                m.step.direction == Direction::Undo || m.resumed || m.last_lease
            }
            Message::ElementsReply(m) => {
                m.step.direction == Direction::Undo
                    || m.outcomes.iter().any(|o| {
                        matches!(
                            o.outcome,
                            StepOutcome::Failed { .. }
                                | StepOutcome::TooLarge { .. }
                                | StepOutcome::Held { .. }
                        )
                    })
            }
            Message::Start(_) | Message::ChildEnded(_) | Message::Event(_) => false,
        }
    }

    /// The group the queue delivers it by ([`crate::fair`]): its order's. An event, not yet
    /// anyone's order, is its own.
    pub fn group(&self) -> Option<&str> {
        match self {
            Message::Start(m) => m.group.as_deref(),
            Message::Request(m) => m.group.as_deref(),
            Message::Reply(m) => m.group.as_deref(),
            Message::ChildEnded(m) => m.group.as_deref(),
            Message::Elements(m) => m.group.as_deref(),
            Message::ElementsReply(m) => m.group.as_deref(),
            Message::Event(_) => None,
        }
    }

    pub fn correlation_id(&self) -> &str {
        match self {
            Message::Start(m) => &m.correlation_id,
            Message::Request(m) => &m.correlation_id,
            Message::Reply(m) => &m.correlation_id,
            Message::ChildEnded(m) => &m.correlation_id,
            Message::Elements(m) => &m.correlation_id,
            Message::ElementsReply(m) => &m.correlation_id,
            // What an event starts is correlated by its own id.
            Message::Event(event) => event.get("id").and_then(|v| v.as_str()).unwrap_or_default(),
        }
    }
}

/// Whether a body is an event of the bus: EventBridge always gives these three as strings.
fn is_event(fields: &serde_json::Map<String, serde_json::Value>) -> bool {
    ["id", "source", "detail-type"].iter().all(|k| fields.get(*k).is_some_and(|v| v.is_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::IdempotencyKey;

    fn start() -> Message {
        let id = OrderId::for_key(&IdempotencyKey::parse("k1").unwrap());
        Message::Start(Start {
            order_id: id,
            attempt: 3,
            correlation_id: "c-1".into(),
            due_at: Some(Timestamp::from_millis(1_000)),
            group: Some("acme#priority".into()),
        })
    }

    #[test]
    fn round_trips_with_a_version() {
        let m = start();
        let body = m.encode();
        assert!(body.contains("\"v\":1") && body.contains("\"type\":\"start\""), "{body}");
        assert_eq!(Message::decode(&body).unwrap(), m);
    }

    #[test]
    fn unknown_fields_are_tolerated_but_versions_are_not() {
        let mut v: serde_json::Value = serde_json::from_str(&start().encode()).unwrap();
        v["added_later"] = serde_json::json!(true);
        assert_eq!(Message::decode(&v.to_string()).unwrap(), start());
        v["v"] = serde_json::json!(2);
        assert!(Message::decode(&v.to_string()).unwrap_err().to_string().contains("version 2"));
        v.as_object_mut().unwrap().remove("v");
        assert!(
            Message::decode(&v.to_string())
                .unwrap_err()
                .to_string()
                .contains("missing envelope version")
        );
    }

    #[test]
    fn malformed_bodies_are_invalid_messages_with_a_reason() {
        for (body, expect) in [
            ("", "not JSON"),
            ("[1,2]", "not a JSON object"),
            (r#"{"v":1,"type":"launch"}"#, "unknown message type"),
            (r#"{"v":1}"#, "missing message `type`"),
            (
                r#"{"v":1,"type":"start","order_id":"nope","attempt":1,"correlation_id":"c"}"#,
                "order_id",
            ),
            (
                r#"{"v":1,"type":"start","order_id":"6c1f0c5e-4b7a-4a39-8a8e-0f5d2e1b9c3a","attempt":-1,"correlation_id":"c"}"#,
                "attempt",
            ),
            (r#"{"v":"1","type":"start"}"#, "version"),
        ] {
            let err = Message::decode(body).unwrap_err();
            assert!(matches!(err, Error::InvalidMessage(_)));
            assert!(err.to_string().contains(expect), "{body}: {err}");
            assert!(!err.is_retryable());
        }
    }

    #[test]
    fn a_decoding_error_names_the_field_but_not_the_value() {
        let body = r#"{"v":1,"type":"start","order_id":"Ada Lovelace, 12 St James's Square","attempt":1,"correlation_id":"c"}"#;
        let err = Message::decode(body).unwrap_err().to_string();
        assert!(err.contains("order_id"), "{err}");
        assert!(!err.contains("Ada") && !err.contains("Square"), "{err}");
    }

    #[test]
    fn outcomes_are_bounded() {
        let big = serde_json::json!({ "blob": "x".repeat(600) });
        assert!(
            matches!(StepOutcome::done(big), StepOutcome::TooLarge { bytes } if bytes > MAX_OUTPUT_LEN as u64)
        );
        let StepOutcome::Failed { reason } = StepOutcome::failed(&"é".repeat(400)) else {
            panic!()
        };
        assert!(reason.len() <= MAX_REASON_LEN && reason.chars().all(|c| c == 'é'));
    }

    #[test]
    fn a_refusal_a_hold_an_undo_or_a_lease_run_out_tells_of_a_fault() {
        let step = |direction| StepRef { index: 0, name: "pay".into(), direction, element: None };
        let reply = |direction, outcome| {
            Message::Reply(StepReply {
                order_id: OrderId::for_key(&IdempotencyKey::parse("k1").unwrap()),
                attempt: 1,
                correlation_id: "c-1".into(),
                step: step(direction),
                complete_by: Timestamp::from_millis(1_000),
                idempotency_key: "k1-pay".into(),
                outcome,
                due_at: None,
                group: None,
            })
        };
        let done = || StepOutcome::Done { output: serde_json::json!({}) };
        assert!(!start().tells_of_fault());
        assert!(!reply(Direction::Do, done()).tells_of_fault());
        let later = StepOutcome::Deferred { until: Timestamp::from_millis(2_000) };
        assert!(!reply(Direction::Do, later).tells_of_fault(), "waiting its turn is no fault");
        assert!(reply(Direction::Do, StepOutcome::failed("no funds")).tells_of_fault());
        assert!(reply(Direction::Do, StepOutcome::held("down", None)).tells_of_fault());
        assert!(reply(Direction::Do, StepOutcome::TooLarge { bytes: 600 }).tells_of_fault());
        assert!(reply(Direction::Undo, done()).tells_of_fault());
    }

    #[test]
    fn an_event_of_the_bus_is_told_by_its_shape_and_sent_again_as_it_came() {
        let body = r#"{"version":"0","id":"e-1","detail-type":"TenantSignedUp","source":"shop.web","time":"2026-11-29T10:00:00Z","detail":{"tenant":"acme"}}"#;
        let message = Message::decode(body).unwrap();
        let Message::Event(event) = &message else { panic!("{message:?}") };
        assert_eq!(event["detail"]["tenant"], "acme");
        assert_eq!((message.order_id(), message.correlation_id()), (None, "e-1"));
        assert_eq!(Message::decode(&message.encode()).unwrap(), message);
        // Without its detail-type it is nothing this system reads.
        let err = Message::decode(r#"{"id":"e-1","source":"shop.web"}"#).unwrap_err();
        assert!(err.to_string().contains("version"), "{err}");
    }
}
