//! What the proxy counts: each request classified by service and operation (and, where price
//! or purpose differ, by table, queue or consistency), with the messages it carries.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::lock;
use crate::access::policy::{AwsRequest, Protocol, form_pairs, operation};

/// What the proxy saw of one kind of request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    pub requests: u64,
    /// Messages carried: sent by `SendMessage(Batch)`, or received by `ReceiveMessage`.
    pub messages: u64,
}

/// Requests seen, by (service, operation as counted).
#[derive(Clone, Debug, Default)]
pub struct Counts(Arc<Mutex<BTreeMap<(String, String), Seen>>>);

impl Counts {
    pub fn snapshot(&self) -> BTreeMap<(String, String), Seen> {
        lock(&self.0).clone()
    }

    pub(super) fn add(&self, call: &Call, messages: u64) {
        let mut counts = lock(&self.0);
        let seen = counts.entry((call.service.clone(), call.counted_as.clone())).or_default();
        seen.requests += 1;
        seen.messages += messages;
    }
}

/// A request as the proxy sees it: the service, the API operation, the name it is counted
/// under (which says more where price or purpose differ), and the messages it sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub service: String,
    pub operation: String,
    pub counted_as: String,
    pub sends: u64,
}

/// What a table or queue is counted as, from its name, URL or ARN: physical names end with the
/// logical id (`<stack>-ReplyQueue`, `<stack>-StateTable`) or, for an agent's queue, the
/// agent's name (`<stack id>_agent_payment`).
pub fn label(name: &str) -> &str {
    name.rsplit(['/', ':', '-', '_']).next().unwrap_or("?")
}

/// The service and operation of an AWS API request: from its `X-Amz-Target` header (the JSON
/// protocols of DynamoDB, SQS, EventBridge, Secrets Manager), its `Action` (query protocol:
/// SNS, ...) or its method and path (REST: S3), the service from the signature's scope where
/// no target names it. Whether a `GetItem` is consistent (a whole read unit) or eventual
/// (half), and which queue a send goes to, are counted apart.
pub fn classify(request: &AwsRequest<'_>) -> Call {
    let operation = operation(request);
    let Protocol::Json { prefix, .. } = request.protocol() else {
        let service = request.signed_service().unwrap_or("other").to_owned();
        let counted_as = match (service.as_str(), operation.as_str()) {
            ("sqs", "SendMessage" | "GetQueueAttributes") => {
                let form = form_pairs(std::str::from_utf8(request.body).unwrap_or_default());
                let url = form.iter().find(|(k, _)| k == "QueueUrl").map_or("", |(_, v)| v);
                let to = if operation == "GetQueueAttributes" { "of" } else { "to" };
                format!("{operation} {to} {}", label(url))
            }
            _ => operation.clone(),
        };
        return Call { service, operation, counted_as, sends: 0 };
    };
    // The service as its prices name it (IAM's `events` is EventBridge), from the one reading
    // of the target prefix; a prefix no service is known by is counted as itself.
    let service = match request.service().as_str() {
        "events" => "eventbridge".to_owned(),
        "unknown" => prefix,
        known => known.to_owned(),
    };
    let service = service.as_str();
    let json = serde_json::from_slice::<serde_json::Value>(request.body).unwrap_or_default();
    let logical = |name: &str| label(name).to_owned();
    let mut sends = 0;
    let counted_as = match (service, operation.as_str()) {
        ("dynamodb", "GetItem") => {
            let consistent = json["ConsistentRead"].as_bool().unwrap_or(false);
            format!("GetItem, {}", if consistent { "consistent" } else { "eventual" })
        }
        ("dynamodb", "PutItem") => {
            format!("PutItem on {}", logical(json["TableName"].as_str().unwrap_or("")))
        }
        ("sqs", "SendMessage" | "SendMessageBatch" | "GetQueueAttributes") => {
            sends = match operation.as_str() {
                "SendMessage" => 1,
                "SendMessageBatch" => json["Entries"].as_array().map_or(0, |e| e.len() as u64),
                _ => 0,
            };
            let queue = logical(json["QueueUrl"].as_str().unwrap_or(""));
            let to = if operation == "GetQueueAttributes" { "of" } else { "to" };
            format!("{operation} {to} {queue}")
        }
        _ => operation.clone(),
    };
    Call { service: service.to_owned(), operation, counted_as, sends }
}

/// Messages a `ReceiveMessage` answer hands out.
pub(super) fn received(answer: &[u8]) -> u64 {
    serde_json::from_slice::<serde_json::Value>(answer)
        .ok()
        .and_then(|v| v["Messages"].as_array().map(|m| m.len() as u64))
        .unwrap_or(0)
}
