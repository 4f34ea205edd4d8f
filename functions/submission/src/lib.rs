//! The orders API's writes. `POST /orders`: the HTTP side of submission. Checks what the
//! engine cannot see (content type, body size, the key header), then hands the body and key
//! to the engine's [`Submission`] service and turns its outcome into a response. Every
//! rejection happens before anything is written.
//!
//! `POST /orders/{id}/steps/{step}/{complete|refuse|heartbeat}`: the answer of a party outside
//! the stack to a step that waits for it, bearing the token the step's announcement carried,
//! behind the same authorizer as orders. A repeated, late or forged answer changes nothing
//! and gets a 409 saying why.

pub mod settings;

use lambda_http::http::StatusCode;
use lambda_http::http::header::CONTENT_TYPE;
use lambda_http::{Body, Request, RequestExt, Response};
use sas_aws::api;
use sas_engine::OrderId;
use sas_engine::load::LoadSource;
use sas_engine::payload::MAX_PAYLOAD_LEN;
use sas_engine::ports::{Clock, EventBus, Ids, Outbox, Payloads, StateStore};
use sas_engine::services::{Asked, Operator, Submission};
use serde_json::json;

/// Largest request body accepted: twice the largest input, so that an input within
/// [`MAX_PAYLOAD_LEN`] bytes of JSON is not refused for the spaces around its values; the
/// input itself is then measured without them.
pub const MAX_BODY_BYTES: usize = 2 * MAX_PAYLOAD_LEN;
/// The header carrying the client's idempotency key.
pub const KEY_HEADER: &str = "idempotency-key";

/// Handles one request of the orders API's writes: an answer if its path names a step, else
/// a submission.
pub async fn route<S, Q, B, C, I, L, P>(
    submission: &Submission<S, Q, B, C, I, L, P>,
    answers: &Operator<S, Q, B, C, P>,
    request: Request,
) -> Response<Body>
where
    S: StateStore,
    Q: Outbox,
    B: EventBus,
    C: Clock,
    I: Ids,
    L: LoadSource,
    P: Payloads,
{
    if request.path_parameters().first("step").is_some() {
        respond(answers, request).await
    } else {
        handle(submission, request).await
    }
}

/// Handles one request routed to `POST /orders/{id}/steps/{step}/{answer}`, and counts a
/// refusal by its error code.
pub async fn respond<S, Q, B, C, P>(
    answers: &Operator<S, Q, B, C, P>,
    request: Request,
) -> Response<Body>
where
    S: StateStore,
    Q: Outbox,
    B: EventBus,
    C: Clock,
    P: Payloads,
{
    let params = request.path_parameters();
    let (id, step, verb) = (
        params.first("id").unwrap_or_default(),
        params.first("step").unwrap_or_default(),
        params.first("answer").unwrap_or_default(),
    );
    let response = async {
        let Ok(order_id) = id.parse::<OrderId>() else {
            return api::error(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such order: the id must be a UUID",
                json!({}),
            );
        };
        let by = match api::caller(&request) {
            Ok(owner) => String::from(owner),
            Err(e) => return api::from_error(&e),
        };
        let answering = match api::answering(verb, step, request.body(), &by, false) {
            Ok(a) => a,
            Err(response) => return *response,
        };
        api::answered(order_id, &answering, answers.answer(order_id, &answering).await)
    }
    .await;
    if !response.status().is_success() {
        sas_engine::metrics::refused(api::error_code(&response).unwrap_or("unknown"));
    }
    response
}

/// Handles one request routed to `POST /orders`, and counts a refusal by its error code.
pub async fn handle<S, Q, B, C, I, L, P>(
    submission: &Submission<S, Q, B, C, I, L, P>,
    request: Request,
) -> Response<Body>
where
    S: StateStore,
    Q: Outbox,
    B: EventBus,
    C: Clock,
    I: Ids,
    L: LoadSource,
    P: Payloads,
{
    let response = answer(submission, request).await;
    if !response.status().is_success() {
        sas_engine::metrics::refused(api::error_code(&response).unwrap_or("unknown"));
    }
    response
}

async fn answer<S, Q, B, C, I, L, P>(
    submission: &Submission<S, Q, B, C, I, L, P>,
    request: Request,
) -> Response<Body>
where
    S: StateStore,
    Q: Outbox,
    B: EventBus,
    C: Clock,
    I: Ids,
    L: LoadSource,
    P: Payloads,
{
    let content_type =
        request.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let media_type = content_type.split(';').next().unwrap_or_default().trim();
    if !media_type.eq_ignore_ascii_case("application/json") {
        return api::error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "Content-Type must be application/json",
            json!({}),
        );
    }
    let body = api::body_bytes(request.body());
    if body.len() > MAX_BODY_BYTES {
        return api::error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            &format!("the body must be at most {MAX_BODY_BYTES} bytes"),
            json!({}),
        );
    }
    let Some(key) = request.headers().get(KEY_HEADER) else {
        return api::error(
            StatusCode::BAD_REQUEST,
            "missing_idempotency_key",
            "the Idempotency-Key header is required",
            json!({ "fields": [{ "field": "Idempotency-Key", "reason": "is required" }] }),
        );
    };
    // A header that is not visible ASCII cannot be a valid key; the engine says why.
    let key = key.to_str().unwrap_or("\u{fffd}");
    let owner = match api::caller(&request) {
        Ok(owner) => owner,
        Err(e) => return api::from_error(&e),
    };
    // `?workflow=<name>` picks the workflow; without it, the stack's default one.
    // `?priority=high` marks the order a priority of its tenant.
    let query = request.query_string_parameters();
    let asked = Asked { workflow: query.first("workflow"), priority: query.first("priority") };
    match submission.submit_asking(&owner, asked, key, body).await {
        Ok(accepted) => api::accepted(&accepted.order_id.to_string(), accepted.created),
        Err(e) => api::from_error(&e),
    }
}
