//! The remote service behind an agent, over HTTP.
//!
//! `POST {service_url}/actions/{action}` with the step's idempotency key in the
//! `Idempotency-Key` header and `{order_id, direction, order, input, outputs}` as JSON (`input`:
//! for an undo, the output of the step it undoes; `outputs`: for a step, those of the steps done
//! before it, by name). A 2xx answer is the step's output. A 429, or a 503 that says when to
//! come back (`Retry-After` in seconds), is the service throttling: every execution of the
//! agent leaves it alone that long. 408, other 5xx, timeouts and connection failures are
//! transient (the effect may or may not have happened; the retry carries the same key), and
//! in a row they hold the action. Any other 4xx, 401 and 403 included, is a refusal: the step
//! fails at once with the service's answer as its cause, and nothing is held, since the
//! service answered (credentials or a grant refused are fixed by an operator, who redrives the
//! orders they failed).
//!
//! Calls authenticate as [`ServiceAuth`] says: signed with SigV4 for services behind IAM, or
//! with a token read from Secrets Manager at cold start, in a header marked sensitive so that
//! it is never printed.

use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use reqwest::{Client, StatusCode};
use sas_engine::ports::{Clock, RemoteCall, RemoteFault, RemoteService};
use serde_json::{Value, json};

use crate::signing::SigV4;
use crate::system::SystemClock;

/// How an agent authenticates to its service.
#[derive(Clone, Debug, Default)]
pub enum ServiceAuth {
    /// No credentials.
    #[default]
    None,
    /// Each request signed with SigV4.
    SigV4(SigV4),
    /// A fixed header on each request (`Authorization: Bearer ...`, or an API key header).
    Header { name: HeaderName, value: HeaderValue },
}

impl ServiceAuth {
    /// A bearer token, as `Authorization: Bearer <token>`.
    pub fn bearer(token: &str) -> Result<ServiceAuth, String> {
        ServiceAuth::header("authorization", &format!("Bearer {}", token.trim()))
    }

    /// A secret sent as the value of header `name`.
    pub fn header(name: &str, secret: &str) -> Result<ServiceAuth, String> {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("{name:?} is not a header name"))?;
        // The error names neither the secret nor any part of it.
        let mut value = HeaderValue::from_str(secret.trim())
            .map_err(|_| "the secret is not a valid header value".to_owned())?;
        value.set_sensitive(true);
        Ok(ServiceAuth::Header { name, value })
    }
}

/// Longest error text kept from a response body.
const MAX_ERROR_TEXT: usize = 300;

/// A remote service reached over HTTP. The clock says how long is left until a step's
/// CompleteBy, which bounds each call.
#[derive(Clone, Debug)]
pub struct HttpRemote<C = SystemClock> {
    client: Client,
    base_url: String,
    call_timeout: Duration,
    clock: C,
    auth: ServiceAuth,
}

impl HttpRemote {
    /// `call_timeout` caps one call; a call never outlives the step's CompleteBy either.
    pub fn new(base_url: &str, call_timeout: Duration) -> Result<Self, reqwest::Error> {
        HttpRemote::with_clock(base_url, call_timeout, SystemClock)
    }
}

impl<C: Clock> HttpRemote<C> {
    pub fn with_clock(
        base_url: &str,
        call_timeout: Duration,
        clock: C,
    ) -> Result<Self, reqwest::Error> {
        let client = Client::builder().connect_timeout(Duration::from_secs(3)).build()?;
        let base_url = base_url.trim_end_matches('/').to_owned();
        Ok(HttpRemote { client, base_url, call_timeout, clock, auth: ServiceAuth::None })
    }

    /// Calls authenticated as `auth` says.
    pub fn with_auth(mut self, auth: ServiceAuth) -> Self {
        self.auth = auth;
        self
    }
}

impl<C: Clock> RemoteService for HttpRemote<C> {
    async fn call(&self, call: &RemoteCall) -> Result<Value, RemoteFault> {
        let left = self.clock.now().until(call.deadline);
        if left.is_zero() {
            return Err(RemoteFault::Transient("deadline passed before the call".into()));
        }
        let body = json!({
            "order_id": call.order_id,
            "direction": call.direction,
            "order": call.order,
            "input": call.input,
            "outputs": call.outputs,
        });
        let mut request = self
            .client
            .post(format!("{}/actions/{}", self.base_url, call.action))
            .header("Idempotency-Key", &call.idempotency_key)
            .timeout(left.min(self.call_timeout))
            .json(&body)
            .build()
            .map_err(|e| RemoteFault::Transient(format!("building the request: {e}")))?;
        match &self.auth {
            ServiceAuth::None => {}
            ServiceAuth::SigV4(signer) => signer
                .sign(&mut request)
                .await
                .map_err(|e| RemoteFault::Transient(e.to_string()))?,
            ServiceAuth::Header { name, value } => {
                request.headers_mut().insert(name.clone(), value.clone());
            }
        }
        let response = self
            .client
            .execute(request)
            .await
            .map_err(|e| RemoteFault::Transient(format!("request failed: {e}")))?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let text = response
            .text()
            .await
            .map_err(|e| RemoteFault::Transient(format!("reading the answer: {e}")))?;
        if status.is_success() {
            return serde_json::from_str(&text).or_else(|_| {
                Ok(Value::String(sas_engine::message::truncate(&text, MAX_ERROR_TEXT)))
            });
        }
        if status == StatusCode::TOO_MANY_REQUESTS
            || (status == StatusCode::SERVICE_UNAVAILABLE && retry_after.is_some())
        {
            return Err(RemoteFault::Throttled { reason: status.to_string(), retry_after });
        }
        if status == StatusCode::REQUEST_TIMEOUT || status.is_server_error() {
            // Only the status: transient faults are logged, and a body may echo the order.
            Err(RemoteFault::Transient(status.to_string()))
        } else {
            // A refusal's text is the order's failure cause, kept with the order.
            let text = sas_engine::message::truncate(&text, MAX_ERROR_TEXT);
            Err(RemoteFault::Permanent(format!("{status}: {text}")))
        }
    }
}
