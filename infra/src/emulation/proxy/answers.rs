//! The answers the proxy gives in place of an emulator, each in its service's own wire format
//! so that the SDK reads them as AWS's: access denied, an injected error, a batch answered
//! alone.

use axum::body::Body;
use axum::http::Response;
use axum::http::StatusCode;
use serde_json::json;

use super::faults::WireFault;
use crate::access::policy::{Denial, Protocol, speaks_rest_json};

/// AWS's answer to a request the caller's policy does not allow, in the service's protocol:
/// DynamoDB's `AccessDeniedException` (status 400); SQS's JSON protocol with the query-protocol
/// code `AccessDenied` in `x-amzn-query-error`, which the SDK takes as the error code (status
/// 403); `AccessDeniedException` (status 400) for the other JSON services; the query
/// protocol's XML `ErrorResponse` (SNS's code is `AuthorizationError`); S3's XML `Error`
/// (status 403); and for the REST-JSON services, `x-amzn-ErrorType: AccessDeniedException`
/// with the message in a JSON body (status 403).
pub(super) fn denied(service: &str, protocol: &Protocol, denial: &Denial) -> Response<Body> {
    let message = denial.message();
    let typed = |code: &str, key: &str| json!({ "__type": code, key: message }).to_string();
    let escaped = message.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    let json = matches!(protocol, Protocol::Json { .. });
    let (body, http_status, content_type) = match service {
        _ if !json && service == "s3" => (
            format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>AccessDenied</Code><Message>{escaped}</Message><RequestId>local</RequestId></Error>"
            ),
            403,
            "application/xml",
        ),
        // REST-JSON: the code in a header, the message in the body.
        _ if !json && speaks_rest_json(service) => {
            (json!({ "message": message }).to_string(), 403, "application/json")
        }
        _ if !json => (
            format!(
                "<ErrorResponse><Error><Type>Sender</Type><Code>{}</Code><Message>{escaped}</Message></Error><RequestId>local</RequestId></ErrorResponse>",
                if service == "sns" { "AuthorizationError" } else { "AccessDenied" }
            ),
            403,
            "text/xml",
        ),
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
        _ => (typed("AccessDeniedException", "Message"), 400, "application/x-amz-json-1.1"),
    };
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = StatusCode::from_u16(http_status).unwrap_or(StatusCode::FORBIDDEN);
    let headers = response.headers_mut();
    headers.insert("content-type", axum::http::HeaderValue::from_static(content_type));
    if !json && speaks_rest_json(service) {
        headers.insert(
            "x-amzn-errortype",
            axum::http::HeaderValue::from_static("AccessDeniedException"),
        );
    }
    if service == "sqs" && json {
        headers.insert(
            "x-amzn-query-error",
            axum::http::HeaderValue::from_static("AccessDenied;Sender"),
        );
    }
    response
}

/// The answer AWS gives for `fault` on `service`, in that service's JSON protocol: the error
/// code in `__type` (DynamoDB's with its namespace), which is what the SDK reads.
pub(super) fn error_response(service: &str, fault: &WireFault) -> Response<Body> {
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
pub(super) fn batch_answer(service: &str, body: Vec<u8>) -> Response<Body> {
    let content_type =
        if service == "sqs" { "application/x-amz-json-1.0" } else { "application/x-amz-json-1.1" };
    let mut response = Response::new(Body::from(body));
    response
        .headers_mut()
        .insert("content-type", axum::http::HeaderValue::from_static(content_type));
    response
}
