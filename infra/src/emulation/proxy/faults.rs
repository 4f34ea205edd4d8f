//! The faults the proxy injects: which requests each rule hits, and how a batch's entry is
//! taken out of the request and reported failed in the answer.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::calls::Call;
use super::lock;

/// A fault the proxy answers with instead of forwarding (or before forwarding, for `Slow`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum WireFault {
    /// The service's throttling error: DynamoDB's `ThrottlingException`, SQS's and
    /// EventBridge's `ThrottlingException`, all with status 400.
    Throttle,
    /// DynamoDB's `ProvisionedThroughputExceededException` (status 400).
    ThroughputExceeded,
    /// A server error with this status (500 to 599), as `InternalServerError`.
    ServerError { status: u16 },
    /// DynamoDB's `TransactionCanceledException`, with one reason code per item
    /// (`None`, `ConditionalCheckFailed`, `TransactionConflict`, `ThrottlingError`, ...).
    Cancel { reasons: Vec<String> },
    /// The request is forwarded after this many milliseconds.
    Slow { ms: u64 },
    /// The entry at `index` of a `SendMessageBatch` or `PutEvents` fails on the service's side
    /// while the others are accepted: it is taken out of the request before the rest is
    /// forwarded, and the answer (status 200) reports it as AWS does. SQS lists it under
    /// `Failed` with code `InternalError` and `SenderFault: false`; EventBridge puts an entry
    /// with `ErrorCode: InternalFailure` at its position and counts it in `FailedEntryCount`.
    /// Any other request, or one without that entry, is forwarded unchanged.
    FailEntry { index: usize },
}

/// The error code of a failed batch entry, by service.
fn entry_failure_code(service: &str) -> &'static str {
    if service == "sqs" { "InternalError" } else { "InternalFailure" }
}

/// A batch request with one entry taken out.
pub(super) struct Taken {
    /// The request without the entry.
    pub(super) rest: Vec<u8>,
    pub(super) entry: serde_json::Value,
    /// Entries left in `rest`.
    pub(super) left: usize,
}

/// Takes entry `index` out of a batch request's `Entries`, if it has one.
pub(super) fn take_entry(body: &[u8], index: usize) -> Option<Taken> {
    let mut request: serde_json::Value = serde_json::from_slice(body).ok()?;
    let entries = request.get_mut("Entries")?.as_array_mut()?;
    if index >= entries.len() {
        return None;
    }
    let entry = entries.remove(index);
    let left = entries.len();
    Some(Taken { rest: serde_json::to_vec(&request).ok()?, entry, left })
}

/// `answer` (the service's answer to the request without the entry; `None` if nothing was
/// left to forward) with `entry`, once at `index`, reported failed in `service`'s format.
pub(super) fn with_failed_entry(
    service: &str,
    answer: Option<&[u8]>,
    index: usize,
    entry: &serde_json::Value,
) -> Option<Vec<u8>> {
    let code = entry_failure_code(service);
    let message = format!("{code} (injected by the local stack's proxy)");
    let mut answer: serde_json::Value = match answer {
        Some(bytes) => serde_json::from_slice(bytes).ok()?,
        None => json!({}),
    };
    let fields = answer.as_object_mut()?;
    if service == "sqs" {
        fields.entry("Successful").or_insert_with(|| json!([]));
        let failed = fields.entry("Failed").or_insert_with(|| json!([]));
        failed.as_array_mut()?.push(json!({
            "Id": entry["Id"], "SenderFault": false, "Code": code, "Message": message,
        }));
    } else {
        let entries = fields.entry("Entries").or_insert_with(|| json!([])).as_array_mut()?;
        entries.insert(
            index.min(entries.len()),
            json!({ "ErrorCode": code, "ErrorMessage": message }),
        );
        let count = fields.get("FailedEntryCount").and_then(serde_json::Value::as_u64);
        fields.insert("FailedEntryCount".into(), json!(count.unwrap_or(0) + 1));
    }
    serde_json::to_vec(&answer).ok()
}

/// Which requests a fault hits, and how many times.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultRule {
    /// `dynamodb`, `sqs`, `eventbridge`, or `*` for any.
    pub service: String,
    /// The API operation (`PutItem`, `SendMessageBatch`, ...), or the name it is counted
    /// under, which also names its table or queue (`PutItem on StateTable`, `SendMessageBatch
    /// to ReplyQueue`); absent for any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    pub fault: WireFault,
    /// How many requests it hits before it is spent; absent for every request until cleared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub times: Option<u32>,
    /// Whose requests it hits: a function's logical id (its access key id locally); absent
    /// for anyone's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
    /// Hits one matching request in this many (the first, then every n-th); absent for all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<u32>,
    /// Matching requests seen so far, to space the hits.
    #[serde(skip)]
    pub seen: u64,
}

impl FaultRule {
    /// A rule that hits every request of `service` and `operation` with `fault`.
    pub fn new(service: &str, operation: Option<&str>, fault: WireFault) -> FaultRule {
        FaultRule {
            service: service.into(),
            operation: operation.map(str::to_owned),
            fault,
            times: None,
            caller: None,
            every: None,
            seen: 0,
        }
    }

    fn matches(&self, call: &Call, caller: Option<&str>) -> bool {
        (self.service == "*" || self.service == call.service)
            && self.operation.as_deref().is_none_or(|o| o == call.operation || o == call.counted_as)
            && self.caller.as_deref().is_none_or(|c| Some(c) == caller)
            && self.times != Some(0)
    }
}

/// The proxy's fault rules. Clones share them.
#[derive(Clone, Debug, Default)]
pub struct WireFaults {
    rules: Arc<Mutex<Vec<FaultRule>>>,
    /// Requests the rules have hit.
    hits: Arc<std::sync::atomic::AtomicU64>,
}

impl WireFaults {
    /// Replaces the rules.
    pub fn set(&self, rules: Vec<FaultRule>) {
        *lock(&self.rules) = rules;
    }

    /// Adds a rule after the others.
    pub fn add(&self, rule: FaultRule) {
        lock(&self.rules).push(rule);
    }

    pub fn clear(&self) {
        lock(&self.rules).clear();
    }

    pub fn rules(&self) -> Vec<FaultRule> {
        lock(&self.rules).clone()
    }

    /// The fault for this request, if a rule hits it; the first matching rule wins and is
    /// charged one hit.
    pub(super) fn take(&self, call: &Call, caller: Option<&str>) -> Option<WireFault> {
        let mut rules = lock(&self.rules);
        let rule = rules.iter_mut().find(|r| r.matches(call, caller))?;
        rule.seen += 1;
        if rule.every.is_some_and(|n| (rule.seen - 1) % u64::from(n.max(1)) != 0) {
            return None;
        }
        if let Some(n) = &mut rule.times {
            *n -= 1;
        }
        self.hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(rule.fault.clone())
    }

    /// Requests the rules have hit so far.
    pub fn hits(&self) -> u64 {
        self.hits.load(std::sync::atomic::Ordering::Relaxed)
    }
}
