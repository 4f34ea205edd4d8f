//! The HTTP face of the simulated service: an axum router that turns requests into calls of
//! the [`Simulator`] and its outcomes into status codes. The same router serves locally and
//! inside Lambda behind a function URL.
//!
//! | request | answers |
//! | --- | --- |
//! | `POST /actions/{action}` with `Idempotency-Key` | 200 output, 400, 409, 422, 429, 503 |
//! | `GET /faults`, `PUT /faults` | the configuration (400 if the new one is invalid) |
//! | `GET /ledger`, `GET /ledger/{key}` | every effect, or one (404 if none) |
//! | `GET /stats` | calls counted by outcome and their busiest second; the ledger's size and its most applications of one key |
//! | `GET /stats/keys` | the same, for every key that met a fault |
//! | `POST /reset` | empties the ledger and the statistics |
//! | `GET /health` | 200 |
//!
//! Every error body is JSON with an `error` field; permanent ones (409, 422) also carry
//! `"permanent": true`, so a caller can classify an answer from its body as well as its status.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::faults::FaultConfig;
use crate::ledger::{Call, Direction};
use crate::sim::{Outcome, Simulator};

/// Seconds since the service started. Injected so tests can move time without waiting.
pub type Clock = Arc<dyn Fn() -> f64 + Send + Sync>;

/// Header carrying the idempotency key of a call. Required.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Header set to `true` on a 200 that replays a key's recorded output rather than applying it,
/// so the body stays exactly what was recorded.
pub const REPLAYED: &str = "idempotent-replayed";

/// The service's shared state: the simulator behind a lock, the clock, and the slots calls
/// are served in, if they are limited.
#[derive(Clone)]
pub struct App {
    sim: Arc<Mutex<Simulator>>,
    clock: Clock,
    /// When the clock read zero, to place a call by when its URL received it.
    started_at: std::time::SystemTime,
    slots: Option<Arc<tokio::sync::Semaphore>>,
}

/// When the function URL in front of the service received a call (its event's
/// `requestContext.timeEpoch`): the call is counted then, as the front door of a service
/// counts it, however long it then queued for an execution environment.
#[derive(Clone, Copy, Debug)]
pub struct ArrivedAt(pub std::time::SystemTime);

impl App {
    /// A service with this (validated) configuration whose clock starts now.
    pub fn new(config: FaultConfig) -> App {
        let started = Instant::now();
        App::with_clock(config, Arc::new(move || started.elapsed().as_secs_f64()))
    }

    /// A service with this configuration and clock (seconds since start).
    pub fn with_clock(config: FaultConfig, clock: Clock) -> App {
        let started_at = std::time::SystemTime::now() - Duration::from_secs_f64(clock().max(0.0));
        App { sim: Arc::new(Mutex::new(Simulator::new(config))), clock, started_at, slots: None }
    }

    /// The service serving at most `n` calls of `/actions` at once, each with its latency, the
    /// others waiting their turn. A held call (`hold_while`) gives its slot up while it is held,
    /// and the other endpoints take none: holding one action holds up no other call.
    pub fn serving_at_once(mut self, n: usize) -> App {
        self.slots = Some(Arc::new(tokio::sync::Semaphore::new(n.max(1))));
        self
    }

    fn sim(&self) -> MutexGuard<'_, Simulator> {
        // A panic while holding the lock leaves a usable simulator (every update is a few
        // plain assignments), so a poisoned lock is taken over rather than failing forever.
        self.sim.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl fmt::Debug for App {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The simulator is left out: locking it here could deadlock a caller that holds it.
        f.debug_struct("App").finish_non_exhaustive()
    }
}

/// The body of `POST /actions/{action}`. Other fields (`order`, `input`, ...) are accepted
/// and ignored: the simulated effect does not depend on them. The outputs of the steps before
/// are kept in the ledger, to show what a step was given.
#[derive(Debug, Deserialize)]
struct ActionRequest {
    order_id: String,
    direction: Direction,
    #[serde(default)]
    outputs: Value,
    #[serde(default)]
    order: Value,
    #[serde(default)]
    input: Value,
}

/// The router of every endpoint, on this state.
pub fn router(app: App) -> Router {
    Router::new()
        .route("/actions/{action}", post(action))
        .route("/faults", get(get_faults).put(put_faults))
        .route("/ledger", get(ledger))
        // A wildcard, so a key is found whether its slashes are percent-encoded or not.
        .route("/ledger/{*key}", get(effect))
        .route("/stats", get(stats))
        .route("/stats/keys", get(stats_by_key))
        .route("/reset", post(reset))
        .route("/health", get(health))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "not found") })
        .with_state(app)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

fn permanent(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into(), "permanent": true }))).into_response()
}

async fn action(
    State(app): State<App>,
    Path(action): Path<String>,
    arrived: Option<axum::Extension<ArrivedAt>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let key = headers.get(IDEMPOTENCY_KEY).and_then(|v| v.to_str().ok()).unwrap_or_default();
    if key.is_empty() {
        return error(StatusCode::BAD_REQUEST, "missing or empty Idempotency-Key header");
    }
    // Parsed by hand rather than with the `Json` extractor, whose rejections are plain text
    // and which insists on a content type.
    let request: ActionRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid body: {e}")),
    };
    let call = Call {
        key: key.to_owned(),
        order_id: request.order_id,
        action,
        direction: request.direction,
        outputs: match request.outputs {
            Value::Object(map) if map.is_empty() => Value::Null,
            other => other,
        },
        order_bytes: json_len(&request.order),
        input_bytes: json_len(&request.input),
    };
    // A call is counted (against the rate, in an outage) as it arrives, as a service's front
    // door counts it, not when a worker gets to it: calls that queue for the worker are not
    // calls that came together.
    let now = match arrived {
        Some(axum::Extension(ArrivedAt(at))) => {
            at.duration_since(app.started_at).map_or(0.0, |d| d.as_secs_f64())
        }
        None => (app.clock)(),
    };
    let slot = match &app.slots {
        Some(slots) => slots.clone().acquire_owned().await.ok(),
        None => None,
    };
    let answer = app.sim().handle(&call, now);
    tracing::info!(
        action = %call.action,
        key = %call.key,
        direction = call.direction.as_str(),
        outcome = answer.outcome.kind(),
        latency_ms = answer.latency.as_millis() as u64,
        "call"
    );
    // The lock is released before waiting, so a slow call holds up no other.
    if let Some(file) = &answer.hold_while {
        drop(slot);
        hold(file, &call.key).await;
    }
    if !answer.latency.is_zero() {
        tokio::time::sleep(answer.latency).await;
    }
    match answer.outcome {
        Outcome::Applied(output) => (StatusCode::OK, Json(output)).into_response(),
        Outcome::Replayed(output) => (
            StatusCode::OK,
            [(HeaderName::from_static(REPLAYED), HeaderValue::from_static("true"))],
            Json(output),
        )
            .into_response(),
        Outcome::Permanent(reason) => permanent(StatusCode::UNPROCESSABLE_ENTITY, reason),
        Outcome::Denied(reason) => permanent(StatusCode::FORBIDDEN, reason),
        Outcome::Tombstoned => permanent(StatusCode::CONFLICT, "cancelled: already compensated"),
        Outcome::Transient => error(StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        Outcome::Throttled => {
            let mut throttled = error(StatusCode::TOO_MANY_REQUESTS, "throttled");
            throttled.headers_mut().insert("retry-after", HeaderValue::from_static("1"));
            throttled
        }
        Outcome::LostAnswer => error(StatusCode::SERVICE_UNAVAILABLE, "answer lost"),
        Outcome::Outage => error(StatusCode::SERVICE_UNAVAILABLE, "outage"),
    }
}

/// The length of `value` in bytes of JSON; 0 for nothing.
fn json_len(value: &Value) -> u64 {
    if value.is_null() {
        return 0;
    }
    serde_json::to_vec(value).map_or(0, |b| b.len() as u64)
}

/// Waits while `file` exists, having written `key` to `{file}.held` for the test that holds it;
/// never longer than a caller could wait.
async fn hold(file: &str, key: &str) {
    let held = format!("{file}.held");
    if let Err(e) = std::fs::write(&held, key) {
        tracing::warn!(%held, error = %e, "cannot say a call is held: not holding it");
        return;
    }
    let until = Instant::now() + std::time::Duration::from_millis(crate::faults::MAX_LATENCY_MS);
    // Tiny calls on a local file: blocking the runtime for them costs nothing worth a thread.
    while std::path::Path::new(file).exists() && Instant::now() < until {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let _ = std::fs::remove_file(&held);
}

async fn get_faults(State(app): State<App>) -> Response {
    Json(app.sim().config().clone()).into_response()
}

async fn put_faults(State(app): State<App>, body: Bytes) -> Response {
    let parsed = std::str::from_utf8(&body)
        .map_err(|e| e.to_string())
        .and_then(|text| FaultConfig::from_json(text).map_err(|e| e.to_string()));
    match parsed {
        Ok(config) => {
            tracing::info!(faults = ?config, "faults replaced");
            app.sim().set_config(config.clone());
            Json(config).into_response()
        }
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}

async fn ledger(State(app): State<App>) -> Response {
    let sim = app.sim();
    let ledger = sim.ledger();
    let started_at_ms =
        app.started_at.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    Json(json!({
        "started_at_ms": started_at_ms,
        "effects": ledger.effects(),
        "max_applications": ledger.max_applications(),
    }))
    .into_response()
}

async fn effect(State(app): State<App>, Path(key): Path<String>) -> Response {
    let sim = app.sim();
    let ledger = sim.ledger();
    match ledger.effect(&key) {
        Some(effect) => Json(effect).into_response(),
        // The calls are still worth knowing: a refused key was tried but never took effect.
        None => (
            StatusCode::NOT_FOUND,
            Json(json!({ "error": "no effect for this key", "key": key, "calls": ledger.calls(&key) })),
        )
            .into_response(),
    }
}

/// The counts, and what a caller checking for double effects needs of the ledger without
/// reading all of it (its size grows with every call and would outgrow a Lambda response).
async fn stats(State(app): State<App>) -> Response {
    let sim = app.sim();
    let mut body = json!(sim.stats());
    body["effects"] = json!(sim.ledger().effects().len());
    body["max_applications"] = json!(sim.ledger().max_applications());
    Json(body).into_response()
}

async fn stats_by_key(State(app): State<App>) -> Response {
    Json(app.sim().stats().faulted_keys.clone()).into_response()
}

async fn reset(State(app): State<App>) -> Response {
    app.sim().reset();
    tracing::info!("ledger and stats reset");
    Json(json!({ "reset": true })).into_response()
}

async fn health(State(app): State<App>) -> Json<Value> {
    Json(json!({ "status": "ok", "uptime_s": (app.clock)() }))
}
