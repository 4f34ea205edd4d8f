//! The HTTP API, emulated on loopback: requests matched against the template's routes become
//! API Gateway payload format 2.0 events for the route's function, and its answer becomes the
//! HTTP response. The same translation serves function URLs (one route that takes everything).
//! Each route is throttled as the template's `DefaultRouteSettings` say: a token bucket of
//! `ThrottlingBurstLimit` tokens refilled at `ThrottlingRateLimit` a second, a request without
//! a token answered 429 before any function runs.
//!
//! A route whose authorizer is `AWS_IAM` takes only requests signed with SigV4 for the stack's
//! region (see [`crate::access::sigv4`]), as API Gateway does, and hands the function the caller in
//! `requestContext.authorizer.iam`: the access key id stands for the principal
//! (`arn:aws:iam::<account>:user/<access key id>`). The caller's policy must allow the call, as
//! IAM's must on AWS (see [`crate::access::callers`]). Any other request gets 403, and the reason is
//! logged.
//!
//! HTTP does not allow control characters in header values, and neither `http` nor
//! `lambda_http` can hold one, so no function could answer for such a request: the gateway
//! reads each request's head before hyper parses it and refuses one that carries such a value
//! with a 400 naming the header, where hyper would close with an empty 400. To read every
//! head, each connection takes one request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, to_bytes};
use axum::http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use base64::Engine;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::warn;

use crate::access::callers::Callers;
use crate::access::policy::{Access, Need};
use crate::access::{jwt, sigv4};
use crate::emulation::runtime_api::{InvokeError, RuntimeApi};
use crate::emulation::template::LOCAL_ACCOUNT;

/// API Gateway's limit on a request body.
const MAX_BODY: usize = 10 * 1024 * 1024;
/// How much of a request's head is read before hyper takes over; API Gateway's limit on the
/// request line and headers together is lower.
const MAX_HEAD: usize = 64 * 1024;
/// How long a connection may take to send its request's head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// One route: `METHOD /path/{param}` to a function. Method `ANY` and a final `{name+}`
/// segment match anything, as in API Gateway.
#[derive(Clone, Debug)]
pub struct Route {
    pub method: String,
    pub path: String,
    pub function: RuntimeApi,
    pub timeout: Duration,
    /// The route's throttle, if it has one.
    pub throttle: Option<Throttle>,
    /// Who may call it, if not everyone.
    pub authorizer: Option<Authorizer>,
    /// For a function URL: the function, whose invokers' policies must allow the call.
    pub invoked: Option<Invoked>,
    /// For an `AWS_IAM` route of the HTTP API: the policy each signed caller holds, which must
    /// allow the call.
    pub callers: Option<Arc<Callers>>,
}

/// A function behind an `AWS_IAM` function URL. Its callers are themselves functions of the
/// stack, signing as their logical ids: their policies must allow `lambda:InvokeFunctionUrl`
/// and `lambda:InvokeFunction` on it, as Lambda requires.
#[derive(Clone, Debug)]
pub struct Invoked {
    pub access: Access,
    pub function_arn: String,
}

/// A route's authorizer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Authorizer {
    /// `AWS_IAM`: requests signed with SigV4 for `service` in this region (`execute-api` for
    /// the HTTP API, `lambda` for function URLs).
    Iam { region: String, service: String },
    /// `JWT`: bearer tokens of `issuer` for one of `audience`.
    Jwt { issuer: String, audience: Vec<String> },
    /// One the local stack does not emulate: every request is refused.
    Unsupported(String),
}

/// A route's throttling limits: a steady rate per second, and a burst above it.
#[derive(Clone, Debug)]
pub struct Throttle {
    rate: f64,
    burst: f64,
    bucket: Arc<Mutex<(f64, Instant)>>,
}

impl Throttle {
    pub fn new(rate: f64, burst: f64) -> Throttle {
        let burst = burst.max(1.0);
        Throttle { rate, burst, bucket: Arc::new(Mutex::new((burst, Instant::now()))) }
    }

    /// Takes a token if one is left.
    fn admit(&self) -> bool {
        let mut bucket = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        let (tokens, since) = &mut *bucket;
        let now = Instant::now();
        *tokens = (*tokens + now.duration_since(*since).as_secs_f64() * self.rate).min(self.burst);
        *since = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

impl Route {
    fn route_key(&self) -> String {
        if self.method == "ANY" && self.path == "/{proxy+}" {
            "$default".into()
        } else {
            format!("{} {}", self.method, self.path)
        }
    }

    /// The path parameters if `method` and `path` match this route.
    fn matches(&self, method: &str, path: &str) -> Option<Map<String, Value>> {
        if self.method != "ANY" && !self.method.eq_ignore_ascii_case(method) {
            return None;
        }
        let mut params = Map::new();
        let pattern: Vec<&str> = self.path.trim_matches('/').split('/').collect();
        let actual: Vec<&str> = path.trim_matches('/').split('/').collect();
        for (i, p) in pattern.iter().enumerate() {
            if let Some(name) = p.strip_prefix('{').and_then(|p| p.strip_suffix("+}")) {
                params.insert(name.into(), actual[i.min(actual.len())..].join("/").into());
                return Some(params);
            }
            let a = actual.get(i)?;
            match p.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                Some(name) if !a.is_empty() => {
                    params.insert(name.into(), (*a).into());
                }
                Some(_) => return None,
                None if p == a => {}
                None => return None,
            }
        }
        (pattern.len() == actual.len()).then_some(params)
    }
}

/// Serves `routes` on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, routes: Vec<Route>) {
    let app = axum::Router::new().fallback(move |request: Request<Body>| {
        let routes = routes.clone();
        async move { handle(&routes, request).await }
    });
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(connection(stream, app.clone()));
            }
            Err(e) => {
                // Out of descriptors, most likely: wait for some to be closed.
                warn!(error = %e, "the gateway could not accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// One connection, one request: its head is screened, then hyper serves it.
async fn connection(stream: TcpStream, app: axum::Router) {
    let (mut reader, mut writer) = stream.into_split();
    let Ok(Ok(head)) = tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut reader)).await else {
        return;
    };
    if let Some(header) = control_character_in(&head) {
        let body = format!(
            r#"{{"message":"Bad Request: the value of the {header} header has a control character, which HTTP does not allow"}}"#
        );
        let answer = format!(
            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        if writer.write_all(answer.as_bytes()).await.is_ok() && writer.shutdown().await.is_ok() {
            // Read what the client still sends, so that closing does not reset the connection
            // before it has read the answer.
            let (mut rest, mut sink) = (reader.take(MAX_BODY as u64), tokio::io::sink());
            let drain = tokio::io::copy(&mut rest, &mut sink);
            let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
        }
        return;
    }
    let io = tokio::io::join(std::io::Cursor::new(head).chain(reader), writer);
    let _ = hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(app))
        .await;
}

/// Reads until the end of the request's head (or `MAX_HEAD` bytes, or the end of the stream),
/// and returns all it read.
async fn read_head(reader: &mut (impl tokio::io::AsyncRead + Unpin)) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    while head_end(&head).is_none() && head.len() < MAX_HEAD {
        let n = reader.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&chunk[..n]);
    }
    Ok(head)
}

/// Where the head ends: after the empty line (CRLF, or LF alone, as hyper also takes).
fn head_end(bytes: &[u8]) -> Option<usize> {
    let crlf = bytes.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    let lf = bytes.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The lower-case name of the first header whose value has a control character (other than
/// a tab), if any.
fn control_character_in(head: &[u8]) -> Option<String> {
    let head = &head[..head_end(head).unwrap_or(head.len())];
    head.split(|&b| b == b'\n').skip(1).find_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let colon = line.iter().position(|&b| b == b':')?;
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f).then(|| {
            match HeaderName::from_bytes(name) {
                Ok(name) => name.as_str().to_owned(),
                Err(_) => "unnamed".to_owned(),
            }
        })
    })
}

async fn handle(routes: &[Route], request: Request<Body>) -> Response<Body> {
    let (parts, body) = request.into_parts();
    let method = parts.method.as_str().to_owned();
    let path = parts.uri.path().to_owned();
    let Some((route, params)) =
        routes.iter().find_map(|r| r.matches(&method, &path).map(|p| (r, p)))
    else {
        return plain(StatusCode::NOT_FOUND, r#"{"message":"Not Found"}"#);
    };
    let Ok(bytes) = to_bytes(body, MAX_BODY).await else {
        return plain(StatusCode::PAYLOAD_TOO_LARGE, r#"{"message":"Request Entity Too Large"}"#);
    };
    let received = header_values(&parts.headers);
    let query = parts.uri.query().unwrap_or_default().to_owned();
    let request = Received { method: &method, path: &path, query: &query, headers: &received };
    let caller = match authorize(route, &request, &bytes) {
        Ok(caller) => caller,
        Err((status, body)) => return plain(status, body),
    };
    if route.throttle.as_ref().is_some_and(|t| !t.admit()) {
        return plain(StatusCode::TOO_MANY_REQUESTS, r#"{"message":"Too Many Requests"}"#);
    }
    let event = event(route, &request, params, &bytes, caller);
    match route.function.invoke(event.to_string(), route.timeout).await {
        Ok(answer) => response(&answer),
        Err(InvokeError::Timeout(_)) => {
            plain(StatusCode::SERVICE_UNAVAILABLE, r#"{"message":"Service Unavailable"}"#)
        }
        // API Gateway treats a refused invocation (Lambda throttling the function) as an
        // integration failure: the client gets a 500, which it retries with the same key.
        Err(InvokeError::Throttled(_)) => {
            plain(StatusCode::INTERNAL_SERVER_ERROR, r#"{"message":"Internal Server Error"}"#)
        }
        Err(e) => {
            warn!(error = %e, "function failed");
            plain(StatusCode::INTERNAL_SERVER_ERROR, r#"{"message":"Internal Server Error"}"#)
        }
    }
}

/// A request's line and headers, as the gateway received them.
struct Received<'a> {
    method: &'a str,
    path: &'a str,
    query: &'a str,
    headers: &'a [(String, String)],
}

/// The status and body of the answer that refuses a request.
type Refusal = (StatusCode, &'static str);

/// Who the route's authorizer says the caller is (`None` for a route without one), or why the
/// request is refused.
fn authorize(route: &Route, request: &Received<'_>, body: &[u8]) -> Result<Option<Value>, Refusal> {
    let Received { method, path, query, headers } = *request;
    match &route.authorizer {
        None => Ok(None),
        Some(Authorizer::Iam { region, service }) => {
            let signed = sigv4::Signed { method, raw_path: path, raw_query: query, headers, body };
            match sigv4::verify(&signed, region, service, chrono::Utc::now()) {
                Ok(access_key) => authorize_iam(route, method, path, &access_key),
                Err(refusal) => {
                    warn!(%method, %path, %refusal, "request refused by the AWS_IAM authorizer");
                    Err((StatusCode::FORBIDDEN, r#"{"message":"Forbidden"}"#))
                }
            }
        }
        Some(Authorizer::Jwt { issuer, audience }) => {
            let authorization = headers
                .iter()
                .find(|(name, _)| name == "authorization")
                .map(|(_, value)| value.as_str());
            match jwt::verify(authorization, issuer, audience, chrono::Utc::now()) {
                Ok(claims) => Ok(Some(json!({ "jwt": { "claims": claims, "scopes": null } }))),
                Err(refusal) => {
                    warn!(%method, %path, %refusal, "request refused by the JWT authorizer");
                    Err((StatusCode::UNAUTHORIZED, r#"{"message":"Unauthorized"}"#))
                }
            }
        }
        Some(Authorizer::Unsupported(other)) => {
            warn!(authorizer = other, "authorizer not emulated locally; refusing the request");
            Err((StatusCode::FORBIDDEN, r#"{"message":"Forbidden"}"#))
        }
    }
}

/// For a caller whose signature is good: whether its policy allows the call, as IAM decides it
/// for a function URL's invokers and for the HTTP API's signed callers.
fn authorize_iam(
    route: &Route,
    method: &str,
    path: &str,
    access_key: &str,
) -> Result<Option<Value>, Refusal> {
    if let Some(Invoked { access, function_arn }) = &route.invoked {
        let needs = ["lambda:InvokeFunctionUrl", "lambda:InvokeFunction"]
            .map(|action| Need::new(action, function_arn.as_str()));
        if access.authorize_needs(access_key, "InvokeFunctionUrl", &needs).is_err() {
            return Err((StatusCode::FORBIDDEN, r#"{"Message":"Forbidden"}"#));
        }
    }
    if let Some(Err(refusal)) = route.callers.as_ref().map(|c| c.allows(access_key, method, path)) {
        warn!(%method, %path, %refusal, "request refused by the caller's policy");
        return Err((StatusCode::FORBIDDEN, r#"{"message":"Forbidden"}"#));
    }
    Ok(Some(json!({ "iam": iam_caller(access_key) })))
}

/// The API Gateway payload format 2.0 event of a request to `route`, with its path `params`
/// and its `caller` as the authorizer described it.
fn event(
    route: &Route,
    request: &Received<'_>,
    params: Map<String, Value>,
    bytes: &[u8],
    caller: Option<Value>,
) -> Value {
    let Received { method, path, query, headers: received } = *request;
    let mut headers = Map::new();
    for (name, value) in received {
        // API Gateway joins repeated headers with commas and lower-cases names.
        let entry = headers.entry(name).or_insert_with(|| Value::String(String::new()));
        if let Value::String(s) = entry {
            if !s.is_empty() {
                s.push(',');
            }
            s.push_str(value);
        }
    }
    let (body, encoded) = match std::str::from_utf8(bytes) {
        Ok(text) => (text.to_owned(), false),
        Err(_) => (base64::engine::general_purpose::STANDARD.encode(bytes), true),
    };
    let now = chrono::Utc::now();
    let route_key = route.route_key();
    let mut event = json!({
        "version": "2.0",
        "routeKey": route_key,
        "rawPath": path,
        "rawQueryString": query,
        "headers": headers,
        "requestContext": {
            "accountId": LOCAL_ACCOUNT,
            "apiId": "local",
            "domainName": "127.0.0.1",
            "domainPrefix": "local",
            "http": {"method": method, "path": path, "protocol": "HTTP/1.1", "sourceIp": "127.0.0.1",
                     "userAgent": headers.get("user-agent").cloned().unwrap_or(Value::Null)},
            "requestId": uuid::Uuid::new_v4().to_string(),
            "routeKey": route_key,
            "stage": "$default",
            "time": now.format("%d/%b/%Y:%H:%M:%S %z").to_string(),
            "timeEpoch": now.timestamp_millis(),
        },
        "isBase64Encoded": encoded,
    });
    if !bytes.is_empty() {
        event["body"] = Value::String(body);
    }
    if let Some(caller) = caller {
        event["requestContext"]["authorizer"] = caller;
    }
    if !params.is_empty() && route_key != "$default" {
        event["pathParameters"] = Value::Object(params);
    }
    if !query.is_empty() {
        let pairs: HashMap<String, String> = query
            .split('&')
            .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
            .collect();
        event["queryStringParameters"] = json!(pairs);
    }
    event
}

/// Every header as a (lower-case name, value) pair. A value that is not plain ASCII is passed
/// on as text, not dropped, so that the function's own validation answers for it.
fn header_values(headers: &axum::http::HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect()
}

/// The caller as API Gateway's IAM authorizer describes it, for a verified access key id.
fn iam_caller(access_key: &str) -> Value {
    json!({
        "accessKey": access_key,
        "accountId": LOCAL_ACCOUNT,
        "callerId": access_key,
        "userArn": format!("arn:aws:iam::{LOCAL_ACCOUNT}:user/{access_key}"),
        "userId": access_key,
    })
}

/// Turns a function's answer into a response, as API Gateway does for payload format 2.0.
fn response(answer: &str) -> Response<Body> {
    let Ok(value) = serde_json::from_str::<Value>(answer) else {
        return plain(StatusCode::INTERNAL_SERVER_ERROR, r#"{"message":"Internal Server Error"}"#);
    };
    let Some(status) = value.get("statusCode").and_then(Value::as_u64) else {
        // An answer without a status code is the body of a 200.
        return plain(StatusCode::OK, answer);
    };
    let body = value.get("body").and_then(Value::as_str).unwrap_or_default();
    let bytes = if value.get("isBase64Encoded").and_then(Value::as_bool).unwrap_or(false) {
        base64::engine::general_purpose::STANDARD.decode(body).unwrap_or_default()
    } else {
        body.as_bytes().to_vec()
    };
    let mut response = Response::new(Body::from(bytes));
    *response.status_mut() = u16::try_from(status)
        .ok()
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (name, v) in value.get("headers").and_then(Value::as_object).into_iter().flatten() {
        if let (Ok(name), Some(Ok(v))) =
            (HeaderName::try_from(name.as_str()), v.as_str().map(HeaderValue::from_str))
        {
            response.headers_mut().insert(name, v);
        }
    }
    response
}

fn plain(status: StatusCode, body: &str) -> Response<Body> {
    let mut response = Response::new(Body::from(body.to_owned()));
    *response.status_mut() = status;
    response.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests;
