//! The remote service behind an agent, over HTTP.
//!
//! `POST {service_url}/actions/{action}` with the step's idempotency key in the
//! `Idempotency-Key` header and `{order_id, direction, order, input}` as JSON. A 2xx answer is
//! the step's output. 408, 429, 5xx, timeouts and connection failures are transient (the
//! effect may or may not have happened; the retry carries the same key). Any other 4xx is a
//! permanent refusal.

use std::time::Duration;

use reqwest::{Client, StatusCode};
use sas_engine::ports::{Clock, RemoteCall, RemoteFault, RemoteService};
use serde_json::{Value, json};

use crate::system::SystemClock;

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
        Ok(HttpRemote { client, base_url, call_timeout, clock })
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
        });
        let response = self
            .client
            .post(format!("{}/actions/{}", self.base_url, call.action))
            .header("Idempotency-Key", &call.idempotency_key)
            .timeout(left.min(self.call_timeout))
            .json(&body)
            .send()
            .await
            .map_err(|e| RemoteFault::Transient(format!("request failed: {e}")))?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| RemoteFault::Transient(format!("reading the answer: {e}")))?;
        if status.is_success() {
            return serde_json::from_str(&text).or_else(|_| {
                Ok(Value::String(sas_engine::message::truncate(&text, MAX_ERROR_TEXT)))
            });
        }
        let detail = format!("{status}: {}", sas_engine::message::truncate(&text, MAX_ERROR_TEXT));
        if status == StatusCode::REQUEST_TIMEOUT
            || status == StatusCode::TOO_MANY_REQUESTS
            || status.is_server_error()
        {
            Err(RemoteFault::Transient(detail))
        } else {
            Err(RemoteFault::Permanent(detail))
        }
    }
}
