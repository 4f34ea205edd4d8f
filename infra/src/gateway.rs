//! The HTTP API, emulated on loopback: requests matched against the template's routes become
//! API Gateway payload format 2.0 events for the route's function, and its answer becomes the
//! HTTP response. The same translation serves function URLs (one route that takes everything).
//! Each route is throttled as the template's `DefaultRouteSettings` say: a token bucket of
//! `ThrottlingBurstLimit` tokens refilled at `ThrottlingRateLimit` a second, a request without
//! a token answered 429 before any function runs.
//!
//! A route whose authorizer is `AWS_IAM` takes only requests signed with SigV4 for the stack's
//! region (see [`crate::sigv4`]), as API Gateway does, and hands the function the caller in
//! `requestContext.authorizer.iam`: the access key id stands for the principal
//! (`arn:aws:iam::<account>:user/<access key id>`). Any other request gets 403, and the reason
//! is logged.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, to_bytes};
use axum::http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use base64::Engine;
use serde_json::{Map, Value, json};
use tracing::warn;

use crate::policy::{Access, Need};
use crate::runtime_api::{InvokeError, RuntimeApi};
use crate::template::LOCAL_ACCOUNT;
use crate::{jwt, sigv4};

/// API Gateway's limit on a request body.
const MAX_BODY: usize = 10 * 1024 * 1024;

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
pub async fn serve(listener: tokio::net::TcpListener, routes: Vec<Route>) -> std::io::Result<()> {
    let app = axum::Router::new().fallback(move |request: Request<Body>| {
        let routes = routes.clone();
        async move { handle(&routes, request).await }
    });
    axum::serve(listener, app).await
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
    let caller = match &route.authorizer {
        None => None,
        Some(Authorizer::Iam { region, service }) => {
            let signed = sigv4::Signed {
                method: &method,
                raw_path: &path,
                raw_query: parts.uri.query().unwrap_or_default(),
                headers: &received,
                body: &bytes,
            };
            match sigv4::verify(&signed, region, service, chrono::Utc::now()) {
                Ok(access_key) => {
                    if let Some(Invoked { access, function_arn }) = &route.invoked {
                        let needs = ["lambda:InvokeFunctionUrl", "lambda:InvokeFunction"]
                            .map(|action| Need::new(action, function_arn.as_str()));
                        if access.authorize_needs(&access_key, "InvokeFunctionUrl", &needs).is_err()
                        {
                            return plain(StatusCode::FORBIDDEN, r#"{"Message":"Forbidden"}"#);
                        }
                    }
                    Some(json!({ "iam": iam_caller(&access_key) }))
                }
                Err(refusal) => {
                    warn!(%method, %path, %refusal, "request refused by the AWS_IAM authorizer");
                    return plain(StatusCode::FORBIDDEN, r#"{"message":"Forbidden"}"#);
                }
            }
        }
        Some(Authorizer::Jwt { issuer, audience }) => {
            let authorization = received
                .iter()
                .find(|(name, _)| name == "authorization")
                .map(|(_, value)| value.as_str());
            match jwt::verify(authorization, issuer, audience, chrono::Utc::now()) {
                Ok(claims) => Some(json!({ "jwt": { "claims": claims, "scopes": null } })),
                Err(refusal) => {
                    warn!(%method, %path, %refusal, "request refused by the JWT authorizer");
                    return plain(StatusCode::UNAUTHORIZED, r#"{"message":"Unauthorized"}"#);
                }
            }
        }
        Some(Authorizer::Unsupported(other)) => {
            warn!(authorizer = other, "authorizer not emulated locally; refusing the request");
            return plain(StatusCode::FORBIDDEN, r#"{"message":"Forbidden"}"#);
        }
    };
    if route.throttle.as_ref().is_some_and(|t| !t.admit()) {
        return plain(StatusCode::TOO_MANY_REQUESTS, r#"{"message":"Too Many Requests"}"#);
    }
    let mut headers = Map::new();
    for (name, value) in received {
        // API Gateway joins repeated headers with commas and lower-cases names.
        let entry = headers.entry(name).or_insert_with(|| Value::String(String::new()));
        if let Value::String(s) = entry {
            if !s.is_empty() {
                s.push(',');
            }
            s.push_str(&value);
        }
    }
    let query = parts.uri.query().unwrap_or_default().to_owned();
    let (body, encoded) = match std::str::from_utf8(&bytes) {
        Ok(text) => (text.to_owned(), false),
        Err(_) => (base64::engine::general_purpose::STANDARD.encode(&bytes), true),
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
    match route.function.invoke(event.to_string(), route.timeout).await {
        Ok(answer) => response(&answer),
        Err(InvokeError::Timeout(_)) => {
            plain(StatusCode::SERVICE_UNAVAILABLE, r#"{"message":"Service Unavailable"}"#)
        }
        Err(e) => {
            warn!(error = %e, "function failed");
            plain(StatusCode::INTERNAL_SERVER_ERROR, r#"{"message":"Internal Server Error"}"#)
        }
    }
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
mod tests {
    use super::*;

    async fn route(method: &str, path: &str) -> Route {
        Route {
            method: method.into(),
            path: path.into(),
            function: RuntimeApi::start("f", "us-east-1").await.unwrap(),
            timeout: Duration::from_secs(1),
            throttle: None,
            authorizer: None,
            invoked: None,
        }
    }

    #[test]
    fn a_verified_access_key_names_the_caller() {
        let caller = iam_caller("AKIDOPS1");
        assert_eq!(caller["userArn"], format!("arn:aws:iam::{LOCAL_ACCOUNT}:user/AKIDOPS1"));
        assert_eq!(caller["accessKey"], "AKIDOPS1");
    }

    #[test]
    fn a_throttle_lets_a_burst_through_then_the_steady_rate() {
        let t = Throttle::new(10.0, 3.0);
        assert!((0..3).all(|_| t.admit()), "the burst");
        assert!(!t.admit(), "then nothing until tokens come back");
        std::thread::sleep(Duration::from_millis(120));
        assert!(t.admit(), "one token per 100 ms");
        assert!(!t.admit());
    }

    #[tokio::test]
    async fn routes_match_methods_paths_and_parameters() {
        let get = route("GET", "/orders/{id}").await;
        assert_eq!(get.matches("GET", "/orders/42").unwrap()["id"], "42");
        assert!(get.matches("POST", "/orders/42").is_none());
        assert!(get.matches("GET", "/orders").is_none());
        assert!(get.matches("GET", "/orders/42/x").is_none());
        let post = route("POST", "/orders").await;
        assert!(post.matches("post", "/orders").is_some());
        let any = route("ANY", "/{proxy+}").await;
        assert_eq!(any.matches("PUT", "/actions/charge").unwrap()["proxy"], "actions/charge");
        assert_eq!(any.route_key(), "$default");
    }

    #[test]
    fn header_values_that_are_not_ascii_are_passed_on() {
        let mut headers = axum::http::HeaderMap::new();
        headers.insert("idempotency-key", HeaderValue::from_bytes("clé-1".as_bytes()).unwrap());
        headers.append("x-a", HeaderValue::from_static("1"));
        headers.append("x-a", HeaderValue::from_static("2"));
        let values = header_values(&headers);
        assert!(values.contains(&("idempotency-key".into(), "clé-1".into())), "{values:?}");
        assert_eq!(values.iter().filter(|(n, _)| n == "x-a").count(), 2);
    }

    #[test]
    fn answers_become_responses() {
        let r = response(
            r#"{"statusCode":202,"headers":{"location":"/orders/1"},"body":"{\"ok\":true}"}"#,
        );
        assert_eq!(r.status(), 202);
        assert_eq!(r.headers()["location"], "/orders/1");
        assert_eq!(response("not json").status(), 500);
        assert_eq!(response(r#"{"hello":1}"#).status(), 200);
    }
}
