//! The Lambda Runtime API, served on loopback, so a function's real binary (the `bootstrap`
//! that ships) runs locally exactly as it does in Lambda: it polls
//! `GET /2018-06-01/runtime/invocation/next` for an event and posts its answer or its error.
//!
//! One [`RuntimeApi`] serves one function; any number of processes of that function may poll
//! it, which is how a concurrency limit is emulated. An invocation not answered within the
//! function's timeout fails, as it would in Lambda (the process may have crashed or hung); an
//! invocation still waiting when its deadline passes is never handed out.
//!
//! Functions may share an [`AccountConcurrency`]: Lambda's account-wide quota of concurrent
//! executions. An invocation that finds it all in use is throttled at once, as Lambda answers
//! `TooManyRequestsException`; what happens next is the invoker's to decide, as on AWS.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

/// Lambda's limit on a synchronous invocation's response; a function that answers more fails
/// with `Function.ResponseSizeTooLarge`.
pub const RESPONSE_LIMIT: usize = 6 * 1024 * 1024;

/// How an invocation ended, when it did not return a response.
#[derive(Debug, thiserror::Error)]
pub enum InvokeError {
    #[error("no answer within {0:?} (the function timed out, hung or crashed)")]
    Timeout(Duration),
    #[error("the function failed: {error_type}: {body}")]
    Function { error_type: String, body: String },
    #[error("throttled: all {0} concurrent executions of the account are in use")]
    Throttled(usize),
}

/// An account's quota of concurrent executions, shared by every function that holds a clone.
#[derive(Clone, Debug)]
pub struct AccountConcurrency {
    quota: usize,
    in_use: Arc<tokio::sync::Semaphore>,
    throttled: Arc<AtomicU64>,
}

impl AccountConcurrency {
    pub fn new(quota: usize) -> AccountConcurrency {
        AccountConcurrency {
            quota,
            in_use: Arc::new(tokio::sync::Semaphore::new(quota)),
            throttled: Arc::default(),
        }
    }

    pub fn quota(&self) -> usize {
        self.quota
    }

    /// Invocations refused so far, across the functions.
    pub fn throttled(&self) -> u64 {
        self.throttled.load(Ordering::Relaxed)
    }

    /// Takes `n` executions, as other functions of the account would, until the permit is
    /// dropped: as soon as they are free, which may be only once invocations in flight end.
    pub async fn occupy(&self, n: u32) -> tokio::sync::OwnedSemaphorePermit {
        self.in_use.clone().acquire_many_owned(n).await.expect("the semaphore is never closed")
    }
}

struct Invocation {
    id: String,
    payload: String,
    deadline_ms: u128,
    answer: oneshot::Sender<Result<String, InvokeError>>,
}

struct Shared {
    function_arn: String,
    waiting: tokio::sync::Mutex<mpsc::UnboundedReceiver<Invocation>>,
    in_flight: Mutex<HashMap<String, oneshot::Sender<Result<String, InvokeError>>>>,
    /// While true, no invocation is handed out: the function's processes are being replaced.
    paused: tokio::sync::watch::Sender<bool>,
    /// Calls for a next invocation so far: before the first invocation, one per process that
    /// finished starting.
    polls: AtomicU64,
}

/// The Runtime API of one function.
#[derive(Clone)]
pub struct RuntimeApi {
    address: SocketAddr,
    submit: mpsc::UnboundedSender<Invocation>,
    shared: Arc<Shared>,
    next_id: Arc<AtomicU64>,
    /// Invocations that got no answer in time: their process died, or ran out of time.
    unanswered: Arc<AtomicU64>,
    account: Option<AccountConcurrency>,
    /// Invocations of this function the account's quota refused.
    throttled: Arc<AtomicU64>,
    /// Records (SQS messages, ...) the invocations' events carried, all together.
    records: Arc<AtomicU64>,
}

impl std::fmt::Debug for RuntimeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeApi").field("address", &self.address).finish_non_exhaustive()
    }
}

impl RuntimeApi {
    /// Serves the Runtime API for `function_name` on a free loopback port.
    pub async fn start(function_name: &str, region: &str) -> std::io::Result<RuntimeApi> {
        let (submit, waiting) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            function_arn: format!(
                "arn:aws:lambda:{region}:{}:function:{function_name}",
                crate::emulation::template::LOCAL_ACCOUNT
            ),
            waiting: tokio::sync::Mutex::new(waiting),
            in_flight: Mutex::default(),
            paused: tokio::sync::watch::Sender::new(false),
            polls: AtomicU64::new(0),
        });
        let app = Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next))
            .route("/2018-06-01/runtime/invocation/{id}/response", post(response))
            .route("/2018-06-01/runtime/invocation/{id}/error", post(error))
            .route("/2018-06-01/runtime/init/error", post(init_error))
            // Lambda's own limit applies, not the web framework's 2 MB: see `response`.
            .layer(DefaultBodyLimit::disable())
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                warn!(error = %e, "runtime API server stopped");
            }
        });
        Ok(RuntimeApi {
            address,
            submit,
            shared,
            next_id: Arc::default(),
            unanswered: Arc::default(),
            account: None,
            throttled: Arc::default(),
            records: Arc::default(),
        })
    }

    /// Counts this function's invocations against `account`'s quota.
    pub fn within(mut self, account: AccountConcurrency) -> RuntimeApi {
        self.account = Some(account);
        self
    }

    /// The value for the function's `AWS_LAMBDA_RUNTIME_API` variable.
    pub fn address(&self) -> String {
        self.address.to_string()
    }

    /// Calls its processes made for a next invocation: until one is invoked, how many of them
    /// have finished starting (a process's start ends with its first call).
    pub fn polls(&self) -> u64 {
        self.shared.polls.load(Ordering::Relaxed)
    }

    /// Invocations so far.
    pub fn invocations(&self) -> u64 {
        self.next_id.load(Ordering::Relaxed)
    }

    /// Records the events of the invocations so far carried (an SQS batch's messages), as
    /// their invokers said; an event that is not a batch (an API request, a schedule's) counts
    /// none.
    pub fn records(&self) -> u64 {
        self.records.load(Ordering::Relaxed)
    }

    /// Invocations so far that got no answer in time (a process killed while it held one,
    /// or one that ran past its timeout): what they did after their last output is lost.
    pub fn unanswered(&self) -> u64 {
        self.unanswered.load(Ordering::Relaxed)
    }

    /// Invocations of this function throttled so far.
    pub fn throttled(&self) -> u64 {
        self.throttled.load(Ordering::Relaxed)
    }

    /// Stops handing out invocations and waits, at most `limit`, until none is in flight:
    /// then the function's processes are idle, each waiting for its next invocation, and can
    /// be replaced without losing one. Invocations made meanwhile wait for [`resume`]. Returns
    /// whether every invocation in flight ended within `limit`.
    ///
    /// [`resume`]: RuntimeApi::resume
    pub async fn drain(&self, limit: Duration) -> bool {
        self.shared.paused.send_replace(true);
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            // Pollers let the queue go once paused, and take an invocation only while they
            // hold it: with it held, what is in flight is all there is.
            let idle = tokio::time::timeout_at(deadline, self.shared.waiting.lock())
                .await
                .is_ok_and(|_queue| {
                    self.shared.in_flight.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
                });
            if idle {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Hands out invocations again after [`drain`](RuntimeApi::drain).
    pub fn resume(&self) {
        self.shared.paused.send_replace(false);
    }

    /// Invokes the function with `payload` (JSON) and waits at most `timeout` for its answer.
    pub async fn invoke(&self, payload: String, timeout: Duration) -> Result<String, InvokeError> {
        self.invoke_carrying(payload, 0, timeout).await
    }

    /// [`invoke`](RuntimeApi::invoke) with an event that carries `records` (an SQS batch's
    /// messages), counted once the invocation is taken.
    pub async fn invoke_carrying(
        &self,
        payload: String,
        records: usize,
        timeout: Duration,
    ) -> Result<String, InvokeError> {
        // Held until the invocation ends: a concurrent execution of the account.
        let _execution = match &self.account {
            Some(account) => match account.in_use.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    account.throttled.fetch_add(1, Ordering::Relaxed);
                    self.throttled.fetch_add(1, Ordering::Relaxed);
                    return Err(InvokeError::Throttled(account.quota));
                }
            },
            None => None,
        };
        self.records.fetch_add(records as u64, Ordering::Relaxed);
        let id = format!(
            "{:08x}-local-{}",
            std::process::id(),
            self.next_id.fetch_add(1, Ordering::Relaxed)
        );
        let (answer, answered) = oneshot::channel();
        let deadline_ms = now_ms() + timeout.as_millis();
        let invocation = Invocation { id: id.clone(), payload, deadline_ms, answer };
        if self.submit.send(invocation).is_err() {
            return Err(InvokeError::Timeout(Duration::ZERO));
        }
        match tokio::time::timeout(timeout, answered).await {
            Ok(Ok(result)) => result,
            _ => {
                self.shared.in_flight.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                self.unanswered.fetch_add(1, Ordering::Relaxed);
                Err(InvokeError::Timeout(timeout))
            }
        }
    }
}

fn now_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

async fn next(State(shared): State<Arc<Shared>>) -> Response {
    shared.polls.fetch_add(1, Ordering::Relaxed);
    loop {
        // Holding the lock while waiting queues the pollers; dropping a poller's connection
        // drops its wait without losing an invocation.
        let mut paused = shared.paused.subscribe();
        until(&mut paused, false).await;
        let (id, deadline_ms, payload) = {
            let mut waiting = shared.waiting.lock().await;
            let invocation = tokio::select! {
                // Checked first: a poller already waiting when the function is paused takes
                // nothing more.
                biased;
                () = until(&mut paused, true) => continue,
                received = waiting.recv() => match received {
                    Some(i) => i,
                    // The function is going away: Lambda never answers a poller then (it
                    // freezes or ends the environment), and a runtime given an answer without
                    // an invocation's headers panics. The poller waits until its process is
                    // ended.
                    None => return std::future::pending().await,
                },
            };
            if invocation.deadline_ms <= now_ms() {
                // Whoever invoked has given up; Lambda would not start it either.
                continue;
            }
            // In flight before the queue is let go, so that `drain` never misses it.
            shared
                .in_flight
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(invocation.id.clone(), invocation.answer);
            (invocation.id, invocation.deadline_ms, invocation.payload)
        };
        let mut headers = HeaderMap::new();
        let mut set = |name: &'static str, value: String| {
            if let Ok(v) = HeaderValue::from_str(&value) {
                headers.insert(name, v);
            }
        };
        set("lambda-runtime-aws-request-id", id);
        set("lambda-runtime-deadline-ms", deadline_ms.to_string());
        set("lambda-runtime-invoked-function-arn", shared.function_arn.clone());
        set("lambda-runtime-trace-id", "Root=1-00000000-000000000000000000000000;Sampled=0".into());
        set("content-type", "application/json".into());
        return (StatusCode::OK, headers, payload).into_response();
    }
}

/// Waits until the function's being paused is `value`.
async fn until(paused: &mut tokio::sync::watch::Receiver<bool>, value: bool) {
    // The sender lives as long as the API: it is never dropped first.
    let reached = paused.wait_for(|p| *p == value).await.is_ok();
    if !reached {
        std::future::pending::<()>().await;
    }
}

async fn response(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    body: Bytes,
) -> StatusCode {
    if body.len() > RESPONSE_LIMIT {
        let error = InvokeError::Function {
            error_type: "Function.ResponseSizeTooLarge".to_owned(),
            body: format!(
                "response of {} bytes, over the limit of {RESPONSE_LIMIT} bytes",
                body.len()
            ),
        };
        finish(&shared, &id, Err(error));
        return StatusCode::PAYLOAD_TOO_LARGE;
    }
    finish(&shared, &id, Ok(String::from_utf8_lossy(&body).into_owned()))
}

async fn error(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let error_type = headers
        .get("lambda-runtime-function-error-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("Unhandled")
        .to_owned();
    finish(
        &shared,
        &id,
        Err(InvokeError::Function {
            error_type,
            body: String::from_utf8_lossy(&body).into_owned(),
        }),
    )
}

async fn init_error(body: Bytes) -> StatusCode {
    warn!(error = %String::from_utf8_lossy(&body), "function failed to initialise");
    StatusCode::ACCEPTED
}

fn finish(shared: &Shared, id: &str, result: Result<String, InvokeError>) -> StatusCode {
    match shared.in_flight.lock().unwrap_or_else(|e| e.into_inner()).remove(id) {
        Some(answer) => {
            // The invoker may have timed out meanwhile; then the answer is simply dropped.
            let _ = answer.send(result);
            StatusCode::ACCEPTED
        }
        None => StatusCode::NOT_FOUND,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal runtime client, doing what `lambda_runtime` does.
    async fn serve_once(api: &str, answer: impl Fn(&str) -> Result<String, String>) {
        let status = answer_once(api, answer).await;
        assert_eq!(status, 202);
    }

    /// Takes one invocation and posts the answer; returns the Runtime API's status.
    async fn answer_once(
        api: &str,
        answer: impl Fn(&str) -> Result<String, String>,
    ) -> reqwest::StatusCode {
        let client = reqwest::Client::new();
        let next = client
            .get(format!("http://{api}/2018-06-01/runtime/invocation/next"))
            .send()
            .await
            .unwrap();
        let id = next.headers()["lambda-runtime-aws-request-id"].to_str().unwrap().to_owned();
        assert!(next.headers().contains_key("lambda-runtime-deadline-ms"));
        let event = next.text().await.unwrap();
        let url = match answer(&event) {
            Ok(_) => format!("http://{api}/2018-06-01/runtime/invocation/{id}/response"),
            Err(_) => format!("http://{api}/2018-06-01/runtime/invocation/{id}/error"),
        };
        let body = answer(&event).unwrap_or_else(|e| e);
        client.post(url).body(body).send().await.unwrap().status()
    }

    #[tokio::test]
    async fn answers_are_limited_as_in_lambda_not_at_2_mb() {
        let api = RuntimeApi::start("big", "us-east-1").await.unwrap();
        let address = api.address();
        let runtime = tokio::spawn(async move {
            let fits =
                answer_once(&address, |_| Ok(format!("\"{}\"", "x".repeat(5_000_000)))).await;
            let over = answer_once(&address, |_| Ok("x".repeat(RESPONSE_LIMIT + 1))).await;
            (fits, over)
        });
        let out = api.invoke("{}".into(), Duration::from_secs(10)).await.unwrap();
        assert_eq!(out.len(), 5_000_002);
        let err = api.invoke("{}".into(), Duration::from_secs(10)).await.unwrap_err();
        assert!(
            matches!(&err, InvokeError::Function { error_type, .. } if error_type == "Function.ResponseSizeTooLarge"),
            "{err}"
        );
        let (fits, over) = runtime.await.unwrap();
        assert_eq!((fits.as_u16(), over.as_u16()), (202, 413));
    }

    #[tokio::test]
    async fn an_invocation_reaches_a_polling_runtime_and_its_answer_comes_back() {
        let api = RuntimeApi::start("echo", "us-east-1").await.unwrap();
        let address = api.address();
        let runtime = tokio::spawn(async move {
            serve_once(&address, |e| Ok(format!("{{\"echo\":{e}}}"))).await;
            serve_once(&address, |_| Err("{\"errorType\":\"Boom\"}".into())).await;
        });
        let out = api.invoke("{\"n\":1}".into(), Duration::from_secs(5)).await.unwrap();
        assert_eq!(out, "{\"echo\":{\"n\":1}}");
        let err = api.invoke("{}".into(), Duration::from_secs(5)).await.unwrap_err();
        assert!(matches!(err, InvokeError::Function { .. }), "{err}");
        runtime.await.unwrap();
    }

    #[tokio::test]
    async fn a_poller_of_a_function_going_away_gets_no_answer_to_panic_on() {
        let api = RuntimeApi::start("gone", "us-east-1").await.unwrap();
        let address = api.address();
        drop(api);
        let polled = reqwest::Client::new()
            .get(format!("http://{address}/2018-06-01/runtime/invocation/next"))
            .timeout(Duration::from_millis(500))
            .send()
            .await;
        assert!(polled.is_err_and(|e| e.is_timeout()), "answered without an invocation");
    }

    #[tokio::test]
    async fn an_unanswered_invocation_times_out_and_is_not_handed_out_late() {
        let api = RuntimeApi::start("slow", "us-east-1").await.unwrap();
        let err =
            api.invoke("{\"late\":true}".into(), Duration::from_millis(200)).await.unwrap_err();
        assert!(matches!(err, InvokeError::Timeout(_)));
        // A runtime that starts polling now gets the next invocation, not the expired one.
        let address = api.address();
        let runtime = tokio::spawn(async move { serve_once(&address, |e| Ok(e.to_owned())).await });
        assert_eq!(
            api.invoke("{\"fresh\":true}".into(), Duration::from_secs(5)).await.unwrap(),
            "{\"fresh\":true}"
        );
        runtime.await.unwrap();
    }

    #[tokio::test]
    async fn a_drained_function_finishes_what_it_holds_and_takes_nothing_until_resumed() {
        let api = RuntimeApi::start("drained", "us-east-1").await.unwrap();
        let address = api.address();
        // A runtime that holds its invocation for 300 ms, then polls again.
        let (took, taken) = oneshot::channel();
        let slow = address.clone();
        let runtime = tokio::spawn(async move {
            let client = reqwest::Client::new();
            let next = client
                .get(format!("http://{slow}/2018-06-01/runtime/invocation/next"))
                .send()
                .await
                .unwrap();
            let id = next.headers()["lambda-runtime-aws-request-id"].to_str().unwrap().to_owned();
            let _ = took.send(());
            tokio::time::sleep(Duration::from_millis(300)).await;
            let url = format!("http://{slow}/2018-06-01/runtime/invocation/{id}/response");
            client.post(url).body("\"first\"").send().await.unwrap();
            serve_once(&slow, |e| Ok(e.to_owned())).await;
        });
        let first = {
            let api = api.clone();
            tokio::spawn(async move { api.invoke("{}".into(), Duration::from_secs(5)).await })
        };
        taken.await.unwrap();
        let started = tokio::time::Instant::now();
        assert!(api.drain(Duration::from_secs(5)).await, "the invocation in flight ended");
        assert!(started.elapsed() >= Duration::from_millis(250), "drained before it ended");
        assert_eq!(first.await.unwrap().unwrap(), "\"first\"");

        // Paused: the runtime polls again, but the next invocation waits for the resume.
        let second = {
            let api = api.clone();
            tokio::spawn(
                async move { api.invoke("{\"n\":2}".into(), Duration::from_secs(5)).await },
            )
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!second.is_finished(), "handed out while paused");
        api.resume();
        assert_eq!(second.await.unwrap().unwrap(), "{\"n\":2}");
        runtime.await.unwrap();
        assert_eq!(api.unanswered(), 0);
    }
}
