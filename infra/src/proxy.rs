//! The local stack's AWS proxy: the functions reach the emulators through it. It forwards every
//! request unchanged to the emulator that serves its service, counts requests by service and
//! operation (so the demo can report what an order really costs), and, when asked, answers in
//! place of the emulator with the faults AWS itself produces: throttling, server errors,
//! transactions cancelled for given reasons, slow answers, and batches (`SendMessageBatch`,
//! `PutEvents`) that succeed with one entry failed.
//!
//! Faults are [`FaultRule`]s, set from Rust through [`WireFaults`] or over HTTP at
//! `/_proxy/faults` (`PUT` a JSON list to replace them, `GET` to read them back, `DELETE` to
//! clear them). They are answered in each service's own wire format, so the SDK parses them as
//! it would parse AWS's, retries what it retries, and hands the rest to the adapters: what is
//! tested through the proxy is the real error path, not a mock of it.
//!
//! Given the functions' policies ([`Access`]), it also checks every request a function signs
//! (the access key id of its `Authorization` header names the function; the signature itself
//! is not verified) against that function's permissions before anything else, and answers a
//! request they do not allow as AWS does: an access-denied error in the service's own format,
//! naming the action and the resource. Requests signed with any other key (the stack's own
//! provisioning, tools and tests) go through unchecked. What was denied, and which grants no
//! request used, is read back from Rust or at `/_proxy/access` (`GET`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::{Body, to_bytes};
use axum::http::{Method, Request, Response, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::policy::{Access, Denial};

/// Path of the proxy's own control endpoint; no AWS API request uses it.
pub const CONTROL_PATH: &str = "/_proxy/faults";

/// Path of the access checks' report (an [`crate::policy::AccessReport`] as JSON).
pub const ACCESS_PATH: &str = "/_proxy/access";

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

    fn add(&self, call: &Call, messages: u64) {
        let mut counts = lock(&self.0);
        let seen = counts.entry((call.service.clone(), call.counted_as.clone())).or_default();
        seen.requests += 1;
        seen.messages += messages;
    }
}

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
struct Taken {
    /// The request without the entry.
    rest: Vec<u8>,
    entry: serde_json::Value,
    /// Entries left in `rest`.
    left: usize,
}

/// Takes entry `index` out of a batch request's `Entries`, if it has one.
fn take_entry(body: &[u8], index: usize) -> Option<Taken> {
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
fn with_failed_entry(
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
    fn take(&self, call: &Call, caller: Option<&str>) -> Option<WireFault> {
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

/// Where each service's requests go: an emulator per service, or one for all.
#[derive(Clone, Debug)]
pub struct Upstreams {
    pub default: String,
    /// By service (`dynamodb`, `sqs`, `eventbridge`).
    pub by_service: HashMap<String, String>,
}

impl Upstreams {
    /// Every service on one endpoint.
    pub fn single(endpoint: impl Into<String>) -> Upstreams {
        Upstreams { default: endpoint.into(), by_service: HashMap::new() }
    }

    fn of(&self, service: &str) -> &str {
        self.by_service.get(service).map_or(&self.default, String::as_str)
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

/// The service and operation of an AWS API request, from its `X-Amz-Target` header (the JSON
/// protocols of DynamoDB, SQS and EventBridge) or its `Action` parameter (query protocol).
/// Whether a `GetItem` is consistent (a whole read unit) or eventual (half), and which queue a
/// send goes to, are counted apart.
pub fn classify(target: Option<&str>, body: &[u8]) -> Call {
    let Some(target) = target else {
        let text = String::from_utf8_lossy(body);
        let action = text.split('&').find_map(|kv| kv.strip_prefix("Action=")).unwrap_or("unknown");
        return Call {
            service: "other".into(),
            operation: action.into(),
            counted_as: action.into(),
            sends: 0,
        };
    };
    let (prefix, operation) = target.split_once('.').unwrap_or((target, ""));
    let service = match prefix {
        p if p.starts_with("DynamoDB") => "dynamodb",
        p if p.starts_with("AmazonSQS") => "sqs",
        p if p.starts_with("AWSEvents") => "eventbridge",
        other => other,
    };
    let json = serde_json::from_slice::<serde_json::Value>(body).unwrap_or_default();
    // Physical names end with the logical id: `<stack>-ReplyQueue`, `<stack>-StateTable`.
    let logical = |name: &str| name.rsplit(['/', '-']).next().unwrap_or("?").to_owned();
    let mut sends = 0;
    let counted_as = match (service, operation) {
        ("dynamodb", "GetItem") => {
            let consistent = json["ConsistentRead"].as_bool().unwrap_or(false);
            format!("GetItem, {}", if consistent { "consistent" } else { "eventual" })
        }
        ("dynamodb", "PutItem") => {
            format!("PutItem on {}", logical(json["TableName"].as_str().unwrap_or("")))
        }
        ("sqs", "SendMessage" | "SendMessageBatch" | "GetQueueAttributes") => {
            sends = match operation {
                "SendMessage" => 1,
                "SendMessageBatch" => json["Entries"].as_array().map_or(0, |e| e.len() as u64),
                _ => 0,
            };
            let queue = logical(json["QueueUrl"].as_str().unwrap_or(""));
            let to = if operation == "GetQueueAttributes" { "of" } else { "to" };
            format!("{operation} {to} {queue}")
        }
        _ => operation.to_owned(),
    };
    Call { service: service.to_owned(), operation: operation.to_owned(), counted_as, sends }
}

/// Messages a `ReceiveMessage` answer hands out.
fn received(answer: &[u8]) -> u64 {
    serde_json::from_slice::<serde_json::Value>(answer)
        .ok()
        .and_then(|v| v["Messages"].as_array().map(|m| m.len() as u64))
        .unwrap_or(0)
}

/// The proxy's shared parts: where it forwards, what it counts, which faults it injects, and
/// whose requests it checks.
#[derive(Clone, Debug)]
pub struct Proxy {
    pub upstreams: Upstreams,
    pub counts: Counts,
    pub faults: WireFaults,
    /// The functions' permissions, if requests are checked against them.
    pub access: Option<Access>,
}

impl Proxy {
    pub fn new(upstreams: Upstreams) -> Proxy {
        Proxy { upstreams, counts: Counts::default(), faults: WireFaults::default(), access: None }
    }

    /// Checks every request signed by a function against that function's permissions.
    pub fn with_access(mut self, access: Access) -> Proxy {
        self.access = Some(access);
        self
    }

    /// Serves the proxy on `listener` until the task is dropped.
    pub async fn serve(self, listener: tokio::net::TcpListener) -> std::io::Result<()> {
        let client = reqwest::Client::new();
        let app = axum::Router::new().fallback(move |request: Request<Body>| {
            let (client, proxy) = (client.clone(), self.clone());
            async move { proxy.handle(&client, request).await }
        });
        axum::serve(listener, app).await
    }

    async fn handle(&self, client: &reqwest::Client, request: Request<Body>) -> Response<Body> {
        let (parts, body) = request.into_parts();
        let Ok(mut body) = to_bytes(body, 64 * 1024 * 1024).await else {
            return status(StatusCode::PAYLOAD_TOO_LARGE);
        };
        if parts.uri.path() == CONTROL_PATH {
            return self.control(&parts.method, &body);
        }
        if parts.uri.path() == ACCESS_PATH {
            return self.access_report(&parts.method);
        }
        let target = parts.headers.get("x-amz-target").and_then(|v| v.to_str().ok());
        let mut call = classify(target, &body);
        // Authorisation comes first, as on AWS: a refused request is neither throttled nor
        // billed, so it is not counted either.
        if let (Some(access), Some(key)) = (&self.access, access_key_id(&parts.headers)) {
            if let Err(denial) = access.authorize(key, target, &body) {
                return denied(&call.service, &denial);
            }
        }
        // The entry a `FailEntry` fault took out, and its index.
        let mut failed_entry = None;
        match self.faults.take(&call, access_key_id(&parts.headers)) {
            Some(WireFault::Slow { ms }) => tokio::time::sleep(Duration::from_millis(ms)).await,
            Some(WireFault::FailEntry { index }) => {
                let batch = matches!(
                    (call.service.as_str(), call.operation.as_str()),
                    ("sqs", "SendMessageBatch") | ("eventbridge", "PutEvents")
                );
                if let Some(taken) = take_entry(&body, index).filter(|_| batch) {
                    call.sends = call.sends.saturating_sub(1);
                    if taken.left == 0 {
                        // Nothing left to forward: the service would refuse an empty batch.
                        self.counts.add(&call, 0);
                        let answer = with_failed_entry(&call.service, None, index, &taken.entry);
                        return batch_answer(&call.service, answer.unwrap_or_default());
                    }
                    body = taken.rest.into();
                    failed_entry = Some((index, taken.entry));
                }
            }
            Some(fault) => {
                self.counts.add(&call, 0);
                return error_response(&call.service, &fault);
            }
            None => {}
        }
        let upstream = self.upstreams.of(&call.service);
        let url = format!("{upstream}{}", parts.uri.path_and_query().map_or("/", |p| p.as_str()));
        let mut outgoing = client.request(parts.method.clone(), url).body(body);
        for (name, value) in &parts.headers {
            if name != "host" && name != "content-length" {
                outgoing = outgoing.header(name, value);
            }
        }
        match outgoing.send().await {
            Ok(answer) => {
                let ok = answer.status().is_success();
                let mut response = Response::builder().status(answer.status());
                for (name, value) in answer.headers() {
                    if name != "content-length"
                        && name != "transfer-encoding"
                        && name != "connection"
                    {
                        response = response.header(name, value);
                    }
                }
                let mut bytes = answer.bytes().await.unwrap_or_default();
                if let Some((index, entry)) = failed_entry.as_ref().filter(|_| ok) {
                    if let Some(with) =
                        with_failed_entry(&call.service, Some(&bytes), *index, entry)
                    {
                        bytes = with.into();
                    }
                }
                let messages = match call.operation.as_str() {
                    "ReceiveMessage" if ok => received(&bytes),
                    _ if ok => call.sends,
                    _ => 0,
                };
                self.counts.add(&call, messages);
                response.body(Body::from(bytes)).unwrap_or_else(|_| status(StatusCode::BAD_GATEWAY))
            }
            Err(_) => {
                self.counts.add(&call, 0);
                status(StatusCode::BAD_GATEWAY)
            }
        }
    }

    fn control(&self, method: &Method, body: &[u8]) -> Response<Body> {
        match *method {
            Method::GET => {}
            Method::PUT => match serde_json::from_slice::<Vec<FaultRule>>(body) {
                Ok(rules) => self.faults.set(rules),
                Err(e) => {
                    let mut r = Response::new(Body::from(format!("invalid fault rules: {e}\n")));
                    *r.status_mut() = StatusCode::BAD_REQUEST;
                    return r;
                }
            },
            Method::DELETE => self.faults.clear(),
            _ => return status(StatusCode::METHOD_NOT_ALLOWED),
        }
        let rules = serde_json::to_string(&self.faults.rules()).unwrap_or_default();
        let mut r = Response::new(Body::from(rules));
        r.headers_mut()
            .insert("content-type", axum::http::HeaderValue::from_static("application/json"));
        r
    }

    fn access_report(&self, method: &Method) -> Response<Body> {
        if *method != Method::GET {
            return status(StatusCode::METHOD_NOT_ALLOWED);
        }
        let report = self.access.as_ref().map(Access::report).unwrap_or_default();
        let mut r = Response::new(Body::from(serde_json::to_string(&report).unwrap_or_default()));
        r.headers_mut()
            .insert("content-type", axum::http::HeaderValue::from_static("application/json"));
        r
    }
}

/// The access key id a request is signed with: `Credential=<key>/<scope>` in a SigV4
/// `Authorization` header.
fn access_key_id(headers: &axum::http::HeaderMap) -> Option<&str> {
    let authorization = headers.get("authorization")?.to_str().ok()?;
    let credential = authorization.split_once("Credential=")?.1;
    credential.split(['/', ',', ' ']).next().filter(|k| !k.is_empty())
}

/// AWS's answer to a request the caller's policy does not allow, in the service's protocol:
/// DynamoDB's `AccessDeniedException` (status 400); SQS's JSON protocol with the query-protocol
/// code `AccessDenied` in `x-amzn-query-error`, which the SDK takes as the error code (status
/// 403); `AccessDeniedException` (status 400) for the other JSON services; and the query
/// protocol's XML for a request without `X-Amz-Target`.
fn denied(service: &str, denial: &Denial) -> Response<Body> {
    let message = denial.message();
    let typed = |code: &str, key: &str| json!({ "__type": code, key: message }).to_string();
    let (body, http_status, content_type) = match service {
        "dynamodb" => (
            typed("com.amazonaws.dynamodb.v20120810#AccessDeniedException", "Message"),
            400,
            "application/x-amz-json-1.0",
        ),
        "sqs" => (
            typed("com.amazon.coral.service#AccessDeniedException", "message"),
            403,
            "application/x-amz-json-1.0",
        ),
        "other" => (
            format!(
                "<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code><Message>{}</Message></Error><RequestId>local</RequestId></ErrorResponse>",
                message.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
            ),
            403,
            "text/xml",
        ),
        _ => (typed("AccessDeniedException", "Message"), 400, "application/x-amz-json-1.1"),
    };
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = StatusCode::from_u16(http_status).unwrap_or(StatusCode::FORBIDDEN);
    let headers = response.headers_mut();
    headers.insert("content-type", axum::http::HeaderValue::from_static(content_type));
    if service == "sqs" {
        headers.insert(
            "x-amzn-query-error",
            axum::http::HeaderValue::from_static("AccessDenied;Sender"),
        );
    }
    response
}

/// The answer AWS gives for `fault` on `service`, in that service's JSON protocol: the error
/// code in `__type` (DynamoDB's with its namespace), which is what the SDK reads.
fn error_response(service: &str, fault: &WireFault) -> Response<Body> {
    let (code, http_status, extra) = match fault {
        WireFault::Throttle => ("ThrottlingException", 400, json!({})),
        WireFault::ThroughputExceeded => ("ProvisionedThroughputExceededException", 400, json!({})),
        WireFault::ServerError { status } => ("InternalServerError", *status, json!({})),
        WireFault::Cancel { reasons } => (
            "TransactionCanceledException",
            400,
            json!({ "CancellationReasons": reasons.iter().map(|r| json!({ "Code": r })).collect::<Vec<_>>() }),
        ),
        WireFault::Slow { .. } | WireFault::FailEntry { .. } => {
            ("InternalServerError", 500, json!({}))
        }
    };
    let typed = match service {
        "dynamodb" => format!("com.amazonaws.dynamodb.v20120810#{code}"),
        "sqs" => format!("com.amazonaws.sqs#{code}"),
        _ => code.to_owned(),
    };
    let mut body = json!({ "__type": typed, "message": format!("{code} (injected by the local stack's proxy)") });
    if let (Some(b), Some(x)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(x.clone());
    }
    let content_type = if service == "dynamodb" || service == "sqs" {
        "application/x-amz-json-1.0"
    } else {
        "application/x-amz-json-1.1"
    };
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() =
        StatusCode::from_u16(http_status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    headers.insert("content-type", axum::http::HeaderValue::from_static(content_type));
    if let Ok(v) = axum::http::HeaderValue::from_str(code) {
        headers.insert("x-amzn-errortype", v);
    }
    if service == "sqs" {
        // The SQS JSON protocol also names the query-protocol code, which the SDK prefers.
        let sender = if http_status < 500 { "Sender" } else { "Receiver" };
        if let Ok(v) = axum::http::HeaderValue::from_str(&format!("{code};{sender}")) {
            headers.insert("x-amzn-query-error", v);
        }
    }
    response
}

/// A batch answer of `service` with status 200, made by the proxy alone.
fn batch_answer(service: &str, body: Vec<u8>) -> Response<Body> {
    let content_type =
        if service == "sqs" { "application/x-amz-json-1.0" } else { "application/x-amz-json-1.1" };
    let mut response = Response::new(Body::from(body));
    response
        .headers_mut()
        .insert("content-type", axum::http::HeaderValue::from_static(content_type));
    response
}

fn status(code: StatusCode) -> Response<Body> {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = code;
    r
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counted(target: Option<&str>, body: &[u8]) -> (String, String) {
        let c = classify(target, body);
        (c.service, c.counted_as)
    }

    #[test]
    fn requests_are_classified_by_target_or_action() {
        assert_eq!(
            counted(Some("DynamoDB_20120810.DeleteItem"), b""),
            ("dynamodb".into(), "DeleteItem".into())
        );
        let batch = classify(
            Some("AmazonSQS.SendMessageBatch"),
            br#"{"QueueUrl":"http://127.0.0.1:5000/123456789012/sas-local-ReplyQueue","Entries":[{},{}]}"#,
        );
        assert_eq!((batch.counted_as.as_str(), batch.sends), ("SendMessageBatch to ReplyQueue", 2));
        assert_eq!(
            counted(Some("DynamoDB_20120810.PutItem"), br#"{"TableName":"local-StateTable"}"#),
            ("dynamodb".into(), "PutItem on StateTable".into())
        );
        assert_eq!(received(br#"{"Messages":[{},{},{}]}"#), 3);
        assert_eq!(received(b"{}"), 0);
        assert_eq!(
            counted(
                Some("DynamoDB_20120810.GetItem"),
                br#"{"TableName":"t","ConsistentRead":true}"#
            ),
            ("dynamodb".into(), "GetItem, consistent".into())
        );
        let eventual = classify(Some("DynamoDB_20120810.GetItem"), br#"{"TableName":"t"}"#);
        assert_eq!(eventual.counted_as, "GetItem, eventual");
        assert_eq!(eventual.operation, "GetItem", "faults match the plain operation");
        assert_eq!(
            counted(Some("AWSEvents.PutEvents"), b""),
            ("eventbridge".into(), "PutEvents".into())
        );
        assert_eq!(
            counted(None, b"Action=SendMessage&QueueUrl=x"),
            ("other".into(), "SendMessage".into())
        );
    }

    #[test]
    fn a_rule_hits_its_service_and_operation_as_often_as_it_says() {
        let faults = WireFaults::default();
        let put = classify(Some("DynamoDB_20120810.PutItem"), br#"{"TableName":"s-StateTable"}"#);
        let receive = classify(Some("AmazonSQS.ReceiveMessage"), b"{}");
        faults.set(vec![
            FaultRule {
                times: Some(2),
                ..FaultRule::new("dynamodb", Some("PutItem"), WireFault::Throttle)
            },
            FaultRule::new("*", None, WireFault::Slow { ms: 5 }),
        ]);
        assert_eq!(faults.take(&put, None), Some(WireFault::Throttle));
        assert_eq!(faults.take(&receive, None), Some(WireFault::Slow { ms: 5 }));
        assert_eq!(faults.take(&put, None), Some(WireFault::Throttle));
        // Spent: the next rule takes over.
        assert_eq!(faults.take(&put, None), Some(WireFault::Slow { ms: 5 }));
        // A rule can name the table (or queue) too.
        faults.set(vec![FaultRule::new(
            "dynamodb",
            Some("PutItem on QueueWaitsTable"),
            WireFault::Throttle,
        )]);
        assert_eq!(faults.take(&put, None), None);
        // And whose requests it hits, and how many of them.
        faults.set(vec![FaultRule {
            caller: Some("SchedulerFunction".into()),
            every: Some(3),
            ..FaultRule::new("dynamodb", Some("PutItem on StateTable"), WireFault::Throttle)
        }]);
        assert_eq!(faults.take(&put, Some("SupervisorFunction")), None);
        let hits: Vec<bool> =
            (0..6).map(|_| faults.take(&put, Some("SchedulerFunction")).is_some()).collect();
        assert_eq!(hits, [true, false, false, true, false, false]);
        faults.clear();
        assert_eq!(faults.take(&put, None), None);
    }

    #[test]
    fn rules_are_read_from_json_strictly() {
        let rules: Vec<FaultRule> = serde_json::from_str(
            r#"[{"service":"dynamodb","operation":"TransactWriteItems","times":1,
                 "fault":{"kind":"cancel","reasons":["None","TransactionConflict"]}}]"#,
        )
        .unwrap();
        assert_eq!(
            rules[0].fault,
            WireFault::Cancel { reasons: vec!["None".into(), "TransactionConflict".into()] }
        );
        assert!(
            serde_json::from_str::<Vec<FaultRule>>(
                r#"[{"service":"sqs","fault":{"kind":"throttle"},"often":2}]"#
            )
            .is_err()
        );
        // What it counts is its own.
        assert!(
            serde_json::from_str::<Vec<FaultRule>>(
                r#"[{"service":"sqs","fault":{"kind":"throttle"},"seen":2}]"#
            )
            .is_err()
        );
    }

    #[test]
    fn injected_errors_speak_each_services_protocol() {
        let r = error_response(
            "dynamodb",
            &WireFault::Cancel { reasons: vec!["None".into(), "TransactionConflict".into()] },
        );
        assert_eq!(r.status(), 400);
        let r = error_response("sqs", &WireFault::ServerError { status: 503 });
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["x-amzn-query-error"], "InternalServerError;Receiver");
    }

    #[test]
    fn a_failed_entry_is_reported_in_each_services_batch_answer() {
        let rule: FaultRule = serde_json::from_str(
            r#"{"service":"sqs","operation":"SendMessageBatch","fault":{"kind":"fail_entry","index":1}}"#,
        )
        .unwrap();
        assert_eq!(rule.fault, WireFault::FailEntry { index: 1 });
        let json = |bytes: &[u8]| serde_json::from_slice::<serde_json::Value>(bytes).unwrap();

        let request = br#"{"QueueUrl":"q","Entries":[{"Id":"0"},{"Id":"1"},{"Id":"2"}]}"#;
        assert!(take_entry(request, 3).is_none());
        let taken = take_entry(request, 1).unwrap();
        assert_eq!((taken.entry["Id"].as_str(), taken.left), (Some("1"), 2));
        assert_eq!(json(&taken.rest)["Entries"], json!([{"Id": "0"}, {"Id": "2"}]));
        let answer = br#"{"Successful":[{"Id":"0","MessageId":"a"},{"Id":"2","MessageId":"c"}]}"#;
        let sqs = json(&with_failed_entry("sqs", Some(answer), 1, &taken.entry).unwrap());
        assert_eq!(sqs["Successful"].as_array().unwrap().len(), 2);
        assert_eq!(sqs["Failed"][0]["Id"], "1");
        assert_eq!(
            (&sqs["Failed"][0]["Code"], &sqs["Failed"][0]["SenderFault"]),
            (&json!("InternalError"), &json!(false))
        );
        // Nothing forwarded: the proxy answers alone.
        let alone = json(&with_failed_entry("sqs", None, 0, &taken.entry).unwrap());
        assert_eq!(
            (alone["Successful"].as_array().unwrap().len(), alone["Failed"][0]["Id"].as_str()),
            (0, Some("1"))
        );

        let answer = br#"{"FailedEntryCount":0,"Entries":[{"EventId":"a"},{"EventId":"c"}]}"#;
        let events = json(&with_failed_entry("eventbridge", Some(answer), 1, &json!({})).unwrap());
        assert_eq!(events["FailedEntryCount"], 1);
        assert_eq!(events["Entries"][0]["EventId"], "a");
        assert_eq!(events["Entries"][1]["ErrorCode"], "InternalFailure");
        assert_eq!(events["Entries"][2]["EventId"], "c");
    }

    #[test]
    fn the_access_key_id_is_read_from_the_credential() {
        let mut headers = axum::http::HeaderMap::new();
        assert_eq!(access_key_id(&headers), None);
        headers.insert(
            "authorization",
            axum::http::HeaderValue::from_static(
                "AWS4-HMAC-SHA256 Credential=SchedulerFunction/20261121/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=00",
            ),
        );
        assert_eq!(access_key_id(&headers), Some("SchedulerFunction"));
    }

    /// One function `F` that may read one table, and nothing else.
    const READER: &str = r#"
Resources:
  Table:
    Type: AWS::DynamoDB::Table
  Queue:
    Type: AWS::SQS::Queue
  F:
    Type: AWS::Serverless::Function
    Properties:
      Policies:
        - Statement:
            - Effect: Allow
              Action: dynamodb:GetItem
              Resource:
                Fn::GetAtt: [Table, Arn]
"#;

    #[tokio::test]
    async fn denials_reach_the_sdk_as_each_service_s_access_denied() {
        use aws_sdk_dynamodb::error::ProvideErrorMetadata;
        use aws_sdk_dynamodb::types::AttributeValue;

        use crate::aws::{Clients, Endpoints};
        use crate::policy::{AccessReport, policies};
        use crate::provision::{Options, dry_run};
        use crate::template::Template;

        let template = Template::parse(READER).unwrap();
        let options =
            Options { stack_name: "t".into(), region: "us-east-1".into(), ..Options::default() };
        let stack = dry_run(&template, &options).unwrap();
        let access = Access::new(policies(&template, &stack).unwrap());
        // The emulator behind the proxy answers whatever reaches it with an empty success.
        let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream_url = format!("http://{}", upstream.local_addr().unwrap());
        let empty = axum::Router::new()
            .fallback(|| async { ([("content-type", "application/x-amz-json-1.0")], "{}") });
        tokio::spawn(async move { axum::serve(upstream, empty).await });
        let proxy = Proxy::new(Upstreams::single(upstream_url)).with_access(access);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(proxy.clone().serve(listener));
        let endpoints = Endpoints::single(&endpoint);
        let f = Clients::signing_as(&endpoints, "us-east-1", "F").await;
        let key = || AttributeValue::S("1".into());

        f.dynamodb.get_item().table_name("t-Table").key("k", key()).send().await.unwrap();
        let put =
            f.dynamodb.put_item().table_name("t-Table").item("k", key()).send().await.unwrap_err();
        assert!(put.as_service_error().is_some(), "{put:?}");
        assert_eq!(put.code(), Some("AccessDeniedException"));
        assert_eq!(
            put.message(),
            Some(
                "User: arn:aws:sts::123456789012:assumed-role/FRole/F is not authorized to perform: dynamodb:PutItem on resource: arn:aws:dynamodb:us-east-1:123456789012:table/t-Table because no identity-based policy allows the dynamodb:PutItem action"
            )
        );
        let send = f
            .sqs
            .send_message()
            .queue_url(format!("{endpoint}/123456789012/t-Queue"))
            .message_body("x")
            .send()
            .await
            .unwrap_err();
        assert!(send.as_service_error().is_some(), "{send:?}");
        assert_eq!(send.code(), Some("AccessDenied"));
        assert!(
            send.message().is_some_and(|m| m.contains(
                "sqs:SendMessage on resource: arn:aws:sqs:us-east-1:123456789012:t-Queue"
            )),
            "{send:?}"
        );
        let entry = aws_sdk_eventbridge::types::PutEventsRequestEntry::builder()
            .source("s")
            .detail_type("d")
            .detail("{}")
            .build();
        let publish = f.events.put_events().entries(entry).send().await.unwrap_err();
        assert!(publish.as_service_error().is_some(), "{publish:?}");
        assert_eq!(publish.code(), Some("AccessDeniedException"));

        // The stack's own clients are not a function: they pass unchecked.
        let stack_clients = Clients::new(&endpoints, "us-east-1").await;
        stack_clients
            .dynamodb
            .put_item()
            .table_name("t-Table")
            .item("k", key())
            .send()
            .await
            .unwrap();

        let report: AccessReport =
            reqwest::get(format!("{endpoint}{ACCESS_PATH}")).await.unwrap().json().await.unwrap();
        let denied: Vec<(&str, &str)> =
            report.denials.iter().map(|d| (d.function.as_str(), d.action.as_str())).collect();
        assert_eq!(
            denied,
            [("F", "dynamodb:PutItem"), ("F", "sqs:SendMessage"), ("F", "events:PutEvents")]
        );
        assert_eq!(report.checked["F"], 4);
        assert!(report.unused.is_empty(), "the one grant was used: {report:?}");
        let counted = proxy.counts.snapshot();
        assert_eq!(
            counted.values().map(|s| s.requests).sum::<u64>(),
            2,
            "denied calls are not billed"
        );
    }
}
