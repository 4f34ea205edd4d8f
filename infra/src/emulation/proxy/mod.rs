//! The local stack's AWS proxy: the functions reach the emulators through it. It forwards every
//! request unchanged to the emulator that serves its service (but for a batch of messages with
//! kept traces, whose headers moto would drop: [`split`]), counts requests by service and
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

mod answers;
mod calls;
mod faults;
mod split;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use axum::body::{Body, Bytes, to_bytes};
use axum::http::request::Parts;
use axum::http::{Method, Request, Response, StatusCode};

use crate::access::policy::{Access, AwsRequest};
use answers::{batch_answer, denied, error_response};
use calls::received;
pub use calls::{Call, Counts, Seen, classify, label};
pub use faults::{FaultRule, WireFault, WireFaults};
use faults::{take_entry, with_failed_entry};

/// Path of the proxy's own control endpoint; no AWS API request uses it.
pub const CONTROL_PATH: &str = "/_proxy/faults";

/// Path of the access checks' report (an [`crate::access::policy::AccessReport`] as JSON).
pub const ACCESS_PATH: &str = "/_proxy/access";

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
        let Ok(body) = to_bytes(body, 64 * 1024 * 1024).await else {
            return status(StatusCode::PAYLOAD_TOO_LARGE);
        };
        if parts.uri.path() == CONTROL_PATH {
            return self.control(&parts.method, &body);
        }
        if parts.uri.path() == ACCESS_PATH {
            return self.access_report(&parts.method);
        }
        let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
        let request = AwsRequest {
            method: parts.method.as_str(),
            path: parts.uri.path(),
            query: parts.uri.query().unwrap_or_default(),
            target: header("x-amz-target"),
            authorization: header("authorization"),
            copy_source: header("x-amz-copy-source"),
            body: &body,
        };
        let mut call = classify(&request);
        // Authorisation comes first, as on AWS: a refused request is neither throttled nor
        // billed, so it is not counted either.
        if let (Some(access), Some(key)) = (&self.access, access_key_id(&parts.headers)) {
            if let Err(denial) = access.authorize(key, &request) {
                return denied(&call.service, &request.protocol(), &denial);
            }
        }
        match self.inject(&mut call, access_key_id(&parts.headers), body).await {
            Ok((body, failed_entry)) => {
                self.forward(client, &parts, &call, body, failed_entry).await
            }
            Err(answer) => answer,
        }
    }

    /// Applies the fault a rule has for `call` (made by `caller`), if any: a delay, an entry
    /// taken out of a batch (returned with the rest of the request, and its index), or the
    /// fault's own answer (as the error).
    async fn inject(
        &self,
        call: &mut Call,
        caller: Option<&str>,
        mut body: Bytes,
    ) -> Result<(Bytes, Option<(usize, serde_json::Value)>), Response<Body>> {
        // The entry a `FailEntry` fault took out, and its index.
        let mut failed_entry = None;
        match self.faults.take(call, caller) {
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
                        self.counts.add(call, 0);
                        let answer = with_failed_entry(&call.service, None, index, &taken.entry);
                        return Err(batch_answer(&call.service, answer.unwrap_or_default()));
                    }
                    body = taken.rest.into();
                    failed_entry = Some((index, taken.entry));
                }
            }
            Some(fault) => {
                self.counts.add(call, 0);
                return Err(error_response(&call.service, &fault));
            }
            None => {}
        }
        Ok((body, failed_entry))
    }

    /// Forwards the request to the emulator that serves `call`'s service, counts it, and
    /// answers with the emulator's answer, the entry a fault took out (`failed_entry`) reported
    /// failed in it.
    async fn forward(
        &self,
        client: &reqwest::Client,
        parts: &Parts,
        call: &Call,
        body: Bytes,
        failed_entry: Option<(usize, serde_json::Value)>,
    ) -> Response<Body> {
        if (call.service.as_str(), call.operation.as_str()) == ("sqs", "SendMessageBatch") {
            if let Some(sends) = split::entries_as_sends(&body) {
                return self.forward_each(client, parts, call, sends, failed_entry).await;
            }
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
                self.counts.add(call, messages);
                response.body(Body::from(bytes)).unwrap_or_else(|_| status(StatusCode::BAD_GATEWAY))
            }
            Err(_) => {
                self.counts.add(call, 0);
                status(StatusCode::BAD_GATEWAY)
            }
        }
    }

    /// Forwards a `SendMessageBatch` as its entries' `SendMessage`s ([`split`]), counts it
    /// once, and answers as the batch would, with `failed_entry` reported failed in it.
    async fn forward_each(
        &self,
        client: &reqwest::Client,
        parts: &Parts,
        call: &Call,
        sends: Vec<(String, serde_json::Value)>,
        failed_entry: Option<(usize, serde_json::Value)>,
    ) -> Response<Body> {
        let upstream = self.upstreams.of(&call.service);
        let mut results = Vec::with_capacity(sends.len());
        for (id, send) in sends {
            let mut outgoing = client.post(format!("{upstream}/")).body(send.to_string());
            for (name, value) in &parts.headers {
                if name != "host" && name != "content-length" && name != "x-amz-target" {
                    outgoing = outgoing.header(name, value);
                }
            }
            let answer = outgoing.header("x-amz-target", "AmazonSQS.SendMessage").send().await;
            let Ok(answer) = answer else {
                self.counts.add(call, 0);
                return status(StatusCode::BAD_GATEWAY);
            };
            let ok = answer.status().is_success();
            results.push(split::entry_result(&id, ok, &answer.bytes().await.unwrap_or_default()));
        }
        let sent = results.iter().filter(|r| r.is_ok()).count() as u64;
        let mut bytes = split::batch_answer(results).to_string().into_bytes();
        if let Some((index, entry)) = &failed_entry {
            if let Some(with) = with_failed_entry(&call.service, Some(&bytes), *index, entry) {
                bytes = with;
            }
        }
        self.counts.add(call, sent);
        Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/x-amz-json-1.0")
            .body(Body::from(bytes))
            .unwrap_or_else(|_| status(StatusCode::BAD_GATEWAY))
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

fn status(code: StatusCode) -> Response<Body> {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = code;
    r
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
