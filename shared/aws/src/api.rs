//! The HTTP API's answers: how the engine's outcomes become status codes and JSON bodies.
//!
//! Client errors say what to fix (the field and the reason); server errors say only that the
//! service is unavailable or failed, never the internal error text, which goes to the log.

use lambda_http::http::StatusCode;
use lambda_http::http::header::{CONTENT_TYPE, HeaderValue, LOCATION, RETRY_AFTER};
use lambda_http::request::RequestContext;
use lambda_http::{Body, Request, RequestExt, Response};
use sas_engine::machine::Answer;
use sas_engine::order::FieldError;
use sas_engine::services::{Answering, Applied, Commanded};
use sas_engine::{Error, OrderId, Owner};
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::error;

/// The caller, as the route's authorizer names it: an IAM principal, a JWT's issuer and
/// subject, or the anonymous caller on a route without an authorizer. A route with an
/// authorizer that names no one is refused rather than taken as anonymous.
pub fn caller(request: &Request) -> Result<Owner, Error> {
    let Some(RequestContext::ApiGatewayV2(context)) = request.request_context_ref() else {
        return Ok(Owner::anonymous());
    };
    // An empty authorizer description is the same as none.
    let Some(authorizer) = context
        .authorizer
        .as_ref()
        .filter(|a| a.iam.is_some() || a.jwt.is_some() || !a.fields.is_empty())
    else {
        return Ok(Owner::anonymous());
    };
    if let Some(arn) = authorizer.iam.as_ref().and_then(|iam| iam.user_arn.as_deref()) {
        return Ok(Owner::iam(arn)?);
    }
    if let Some(jwt) = authorizer.jwt.as_ref() {
        let claim = |name: &str| jwt.claims.get(name).map(String::as_str).unwrap_or_default();
        return Ok(Owner::jwt(claim("iss"), claim("sub"))?);
    }
    Err(Error::InvalidCaller("the authorizer named no caller".into()))
}

/// A request body's bytes, whether API Gateway passed it as text or as base64.
pub fn body_bytes(body: &Body) -> &[u8] {
    match body {
        Body::Text(text) => text.as_bytes(),
        Body::Binary(bytes) => bytes,
        _ => b"",
    }
}

/// A JSON response.
pub fn json(status: StatusCode, body: &Value) -> Response<Body> {
    let mut response = Response::new(Body::Text(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A JSON error: `{"error": {"code", "message", ...extra}}`.
pub fn error(status: StatusCode, code: &str, message: &str, extra: Value) -> Response<Body> {
    let mut err = json!({ "code": code, "message": message });
    if let (Value::Object(e), Value::Object(x)) = (&mut err, extra) {
        e.extend(x);
    }
    json(status, &json!({ "error": err }))
}

/// Every error code the orders API's writes answer with.
const ERROR_CODES: [&str; 18] = [
    "invalid_order",
    "malformed_json",
    "missing_idempotency_key",
    "invalid_idempotency_key",
    "idempotency_key_reused",
    "unsupported_media_type",
    "payload_too_large",
    "forbidden",
    "overloaded",
    "unavailable",
    "internal",
    "invalid_answer",
    "wrong_token",
    "not_waiting",
    "no_callback",
    "unknown_step",
    "output_too_large",
    "not_found",
];

/// The `code` of an error answer made by [`error`], if it is one of the orders API's writes.
pub fn error_code(response: &Response<Body>) -> Option<&'static str> {
    let Body::Text(text) = response.body() else { return None };
    let value: Value = serde_json::from_str(text).ok()?;
    let code = value.get("error")?.get("code")?.as_str()?;
    // Only the codes the API documents become metric labels, so their number stays fixed.
    ERROR_CODES.iter().find(|c| **c == code).copied()
}

/// Largest body of an answer to a callback: its output is at most 512 bytes of JSON.
pub const MAX_ANSWER_BYTES: usize = 4 * 1024;

/// The body of an answer to a step that waits for a callback.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AnswerBody {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    output: Option<Value>,
    #[serde(default)]
    reason: String,
}

/// Reads an answer (`verb`: `complete`, `refuse` or `heartbeat`) to step `step` from `body`,
/// given by `by`: from the party outside, whose body must bear the step's token, or from an
/// operator (`operator`), whose must not. A bad answer is a 400 (or a 404 for another verb).
pub fn answering(
    verb: &str,
    step: &str,
    body: &Body,
    by: &str,
    operator: bool,
) -> Result<Answering, Box<Response<Body>>> {
    let bad = |message: &str| {
        Box::new(error(StatusCode::BAD_REQUEST, "invalid_answer", message, json!({})))
    };
    let bytes = body_bytes(body);
    if bytes.len() > MAX_ANSWER_BYTES {
        return Err(bad(&format!("the body must be at most {MAX_ANSWER_BYTES} bytes")));
    }
    let shape = match operator {
        true => "{\"reason\", \"output\"?}",
        false => "{\"token\", \"output\"?, \"reason\"?}",
    };
    let body: AnswerBody = serde_json::from_slice(if bytes.is_empty() { b"{}" } else { bytes })
        .map_err(|e| bad(&format!("the body must be {shape}: {e}")))?;
    let token = match (operator, body.token.as_deref()) {
        (false, None) => return Err(bad("the token the step's announcement carried is required")),
        (true, Some(_)) => return Err(bad("an operator answers without a token")),
        (_, token) => token,
    };
    if operator && body.reason.trim().is_empty() {
        // The party's own answer needs none; an operator's stands in for it, so says why.
        return Err(bad("an operator's answer needs a reason: it is kept on the timeline"));
    }
    let answer = match (verb, body.output) {
        ("complete", output) => Answer::Complete { output: output.unwrap_or_else(|| json!({})) },
        ("refuse" | "heartbeat", Some(_)) => {
            return Err(bad("only complete carries an output"));
        }
        ("refuse", None) => Answer::Refuse,
        ("heartbeat", None) => Answer::Heartbeat,
        _ => {
            return Err(Box::new(error(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such answer: complete, refuse or heartbeat",
                json!({}),
            )));
        }
    };
    Answering::new(step, token, answer, by, &body.reason).map_err(|e| match e {
        Error::InvalidCommand(message) => bad(&message),
        other => Box::new(from_error(&other)),
    })
}

/// The response to an answer to order `order_id`'s step: 200 with the order's state if it
/// counted (now, or before: the same answer repeated), 409 saying why if it did not, 404 for
/// no such order.
pub fn answered(
    order_id: OrderId,
    answer: &Answering,
    outcome: Result<Option<Commanded>, Error>,
) -> Response<Body> {
    match outcome {
        Ok(Some(Commanded { applied: Applied::Refused(refused), record })) => error(
            StatusCode::CONFLICT,
            refused.code(),
            &refused.to_string(),
            json!({ "state": record.process_state.as_str() }),
        ),
        Ok(Some(done)) => json(
            StatusCode::OK,
            &json!({
                "order_id": order_id,
                "step": answer.step,
                "answer": answer.answer.as_str(),
                "applied": if done.applied == Applied::Now { "now" } else { "before" },
                "process_state": done.record.process_state.as_str(),
                "answer_by": done.record.steps.iter().find(|s| s.name == answer.step)
                    .and_then(|s| s.answer_by).map(|t| t.to_rfc3339()),
            }),
        ),
        Ok(None) => error(StatusCode::NOT_FOUND, "not_found", "no such order", json!({})),
        Err(e) => from_error(&e),
    }
}

/// 202 for an accepted (or already accepted) order, with its status link.
pub fn accepted(order_id: &str, created: bool) -> Response<Body> {
    let link = format!("/orders/{order_id}");
    let mut response = json(
        StatusCode::ACCEPTED,
        &json!({ "order_id": order_id, "status_url": link, "created": created }),
    );
    if let Ok(value) = link.parse() {
        response.headers_mut().insert(LOCATION, value);
    }
    response
}

/// The answer for an engine error.
pub fn from_error(e: &Error) -> Response<Body> {
    match e {
        Error::InvalidOrder(rejection) => {
            let code = match rejection.errors.as_slice() {
                [FieldError { reason, .. }] if reason.starts_with("malformed JSON") => {
                    "malformed_json"
                }
                // The `workflow` query parameter names no workflow of the stack.
                [FieldError { field, .. }] if field == "workflow" => "unknown_workflow",
                _ => "invalid_order",
            };
            error(
                StatusCode::BAD_REQUEST,
                code,
                &rejection.to_string(),
                json!({ "fields": rejection.errors }),
            )
        }
        Error::InvalidKey(reason) => error(
            StatusCode::BAD_REQUEST,
            "invalid_idempotency_key",
            &format!("Idempotency-Key {reason}"),
            json!({ "fields": [{ "field": "Idempotency-Key", "reason": reason }] }),
        ),
        Error::InvalidCaller(why) => {
            error!(%why, "the authorizer's caller cannot own orders");
            error(
                StatusCode::FORBIDDEN,
                "forbidden",
                "the caller could not be identified",
                json!({}),
            )
        }
        Error::KeyReused { existing } => error(
            StatusCode::CONFLICT,
            "idempotency_key_reused",
            "this Idempotency-Key was already used for a different order",
            json!({ "order_id": existing }),
        ),
        Error::Overloaded { retry_after, .. } => {
            let seconds = retry_after.as_secs().max(1);
            let mut response = error(
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded",
                &format!(
                    "too many orders are waiting to be served; retry in {seconds} s with the same Idempotency-Key"
                ),
                json!({ "retry_after_seconds": seconds }),
            );
            if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
                response.headers_mut().insert(RETRY_AFTER, value);
            }
            response
        }
        e if e.is_retryable() => {
            error!(error = %e, "dependency unavailable");
            let mut response = error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "temporarily unavailable; retry with the same Idempotency-Key",
                json!({}),
            );
            response.headers_mut().insert(RETRY_AFTER, HeaderValue::from_static("1"));
            response
        }
        e => {
            error!(error = %e, "request failed");
            error(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error", json!({}))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(authorizer: Option<Value>) -> Request {
        let mut event = json!({
            "version": "2.0", "routeKey": "GET /orders/{id}", "rawPath": "/orders/x",
            "rawQueryString": "", "headers": {"host": "api.test"},
            "requestContext": {
                "accountId": "123456789012", "apiId": "test", "domainName": "api.test",
                "http": {"method": "GET", "path": "/orders/x", "protocol": "HTTP/1.1",
                         "sourceIp": "127.0.0.1", "userAgent": "test"},
                "requestId": "r", "routeKey": "GET /orders/{id}", "stage": "$default",
                "time": "22/Nov/2026:00:00:00 +0000", "timeEpoch": 0
            },
            "isBase64Encoded": false,
        });
        if let Some(authorizer) = authorizer {
            event["requestContext"]["authorizer"] = authorizer;
        }
        lambda_http::request::from_str(&event.to_string()).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn an_answer_s_body_is_read_as_the_api_document_states() {
        let read = |verb: &str, body: &str, operator: bool| {
            answering(verb, "review", &Body::Text(body.into()), "arn:ops", operator)
                .map_err(|r| (r.status().as_u16(), error_code(&r).unwrap_or_default()))
        };
        let party = read("complete", r#"{"token":"abc123","output":{"ok":true}}"#, false).unwrap();
        assert_eq!(party.token.as_deref(), Some("abc123"));
        assert_eq!(party.answer, Answer::Complete { output: json!({"ok": true}) });
        assert_eq!(
            read("heartbeat", r#"{"token":"abc"}"#, false).unwrap().answer,
            Answer::Heartbeat
        );
        let operator = read("refuse", r#"{"reason":"fraud"}"#, true).unwrap();
        assert_eq!((operator.token, operator.answer), (None, Answer::Refuse));
        let bad = (400, "invalid_answer");
        for (verb, body, operator) in [
            ("complete", "{}", false),
            ("complete", r#"{"token":"a-b"}"#, false),
            ("refuse", r#"{"token":"abc"}"#, false),
            ("heartbeat", r#"{"token":"abc","output":{}}"#, false),
            ("complete", r#"{"token":"abc","extra":1}"#, false),
            ("complete", "not json", false),
            ("complete", r#"{"token":"abc","reason":"x"}"#, true),
            ("complete", r#"{"reason":" "}"#, true),
            ("complete", r#"{"token":"abc","reason":"line\nbreak"}"#, false),
        ] {
            assert_eq!(read(verb, body, operator).err(), Some(bad), "{verb} {body} {operator}");
        }
        assert_eq!(read("approve", r#"{"token":"abc"}"#, false).err(), Some((404, "not_found")));
    }

    #[test]
    fn the_caller_is_whom_the_authorizer_names() {
        let iam = json!({"iam": {"userArn": "arn:aws:iam::123456789012:user/ada"}});
        let owner = caller(&request(Some(iam))).map(|o| o.to_string());
        assert_eq!(owner.ok().as_deref(), Some("arn:aws:iam::123456789012:user/ada"));
        let jwt = json!({"jwt": {"claims": {"iss": "https://issuer.example", "sub": "bob"}}});
        let owner = caller(&request(Some(jwt))).map(|o| o.to_string());
        assert_eq!(owner.ok().as_deref(), Some("jwt:https://issuer.example#bob"));
        for open in [None, Some(json!({})), Some(Value::Null)] {
            assert!(caller(&request(open.clone())).is_ok_and(|o| o.is_anonymous()), "{open:?}");
        }
        // An authorizer that names no one usable is refused, never taken as anonymous.
        for nobody in [
            json!({"iam": {}}),
            json!({"jwt": {"claims": {"iss": "https://issuer.example"}}}),
            json!({"lambda": {"tenant": "t-1"}}),
        ] {
            let got = caller(&request(Some(nobody.clone())));
            assert!(matches!(got, Err(Error::InvalidCaller(_))), "{nobody}: {got:?}");
        }
    }
}
