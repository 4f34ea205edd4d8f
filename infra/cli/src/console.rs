//! `sas console`: the operators' console served on loopback, its calls of the admin API
//! signed here with the operator's own credentials, as every other verb of `sas` signs them.
//!
//! The page never sees the credentials. What stands between another program on the machine
//! (or a page of another site open in the same browser) and the signing proxy is a session
//! token: made at start, given to the page in the address's fragment (which no request
//! carries), and required in a header on every call of `/api/` (a header another site's page
//! cannot set without this server's leave, which it never gives). The host a request names
//! must be this server's loopback address, so that a name rebound to 127.0.0.1 reaches
//! nothing.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::{Body, to_bytes};
use axum::http::{HeaderValue, Method, Request, Response, StatusCode, header};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use sas_console::Mode;

use crate::client::{Api, CliError};

/// Largest body the page may send: a command's reason, or an answer's output.
const MAX_BODY: usize = 64 * 1024;

/// A console bound to its address, not yet serving.
#[derive(Debug)]
pub struct Console {
    listener: TcpListener,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    api: Api,
    token: String,
    /// The `Host` values a request may name: the address as bound, and `localhost` with its port.
    hosts: [String; 2],
}

impl Console {
    /// Binds `127.0.0.1:port` (0: a free port) for a console of `api`.
    pub async fn bind(api: Api, port: u16) -> Result<Console, CliError> {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port)))
            .await
            .map_err(|e| CliError::Usage(format!("cannot listen on 127.0.0.1:{port}: {e}")))?;
        let address =
            listener.local_addr().map_err(|e| CliError::Usage(format!("no local address: {e}")))?;
        let token = uuid::Uuid::new_v4().simple().to_string();
        let hosts = [address.to_string(), format!("localhost:{}", address.port())];
        Ok(Console { listener, shared: Arc::new(Shared { api, token, hosts }) })
    }

    /// The address to open: the page, with the session in its fragment.
    pub fn url(&self) -> String {
        format!("http://{}/#session={}", self.shared.hosts[0], self.shared.token)
    }

    /// Serves until the process ends.
    pub async fn serve(self) -> Result<(), CliError> {
        let shared = self.shared;
        let app = axum::Router::new().fallback(move |request: Request<Body>| {
            let shared = shared.clone();
            async move { shared.answer(request).await }
        });
        axum::serve(self.listener, app)
            .await
            .map_err(|e| CliError::Usage(format!("the console stopped: {e}")))
    }
}

impl Shared {
    async fn answer(&self, request: Request<Body>) -> Response<Body> {
        let host = request.headers().get(header::HOST).and_then(|h| h.to_str().ok());
        if !host.is_some_and(|h| self.hosts.iter().any(|mine| mine == h)) {
            return refusal(
                StatusCode::MISDIRECTED_REQUEST,
                "this console answers its own address only",
            );
        }
        let path = request.uri().path().to_owned();
        if let Some(rest) = path.strip_prefix("/api/") {
            return self.forward(rest.to_owned(), request).await;
        }
        if request.method() != Method::GET {
            return refusal(StatusCode::METHOD_NOT_ALLOWED, "the page's files are only read");
        }
        if path == "/config.json" {
            return page_file("application/json", Mode::Proxy.config());
        }
        match sas_console::file(&path) {
            Some((kind, body)) => page_file(kind, body.to_owned()),
            None => refusal(StatusCode::NOT_FOUND, "no such file"),
        }
    }

    /// A call of the page, sent on to the stack's admin API, signed.
    async fn forward(&self, rest: String, request: Request<Body>) -> Response<Body> {
        let token = request.headers().get(sas_console::TOKEN_HEADER).and_then(|t| t.to_str().ok());
        if token != Some(self.token.as_str()) {
            return refusal(
                StatusCode::UNAUTHORIZED,
                "no session: open the console at the address `sas console` printed",
            );
        }
        if !rest.starts_with("admin/") {
            return refusal(StatusCode::NOT_FOUND, "the console calls the admin API only");
        }
        let method = request.method().as_str().to_owned();
        let query = request.uri().query().map(|q| format!("?{q}")).unwrap_or_default();
        let body = match to_bytes(request.into_body(), MAX_BODY).await {
            Ok(bytes) => bytes,
            Err(_) => {
                return refusal(StatusCode::PAYLOAD_TOO_LARGE, "a body of at most 64 KiB");
            }
        };
        let Ok(body) = std::str::from_utf8(&body) else {
            return refusal(StatusCode::BAD_REQUEST, "the body must be UTF-8 JSON");
        };
        match self.api.once(&method, &format!("/{rest}{query}"), &[], body).await {
            Ok(answer) => {
                let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::BAD_GATEWAY);
                json_response(status, &answer.body)
            }
            Err(e) => refusal(StatusCode::BAD_GATEWAY, &format!("the stack's API: {e}")),
        }
    }
}

fn page_file(kind: &'static str, body: String) -> Response<Body> {
    let mut response = Response::new(Body::from(body));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    if let Ok(policy) = HeaderValue::from_str(&Mode::Proxy.content_security_policy()) {
        headers.insert(header::CONTENT_SECURITY_POLICY, policy);
    }
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// An answer of the console itself, shaped as the admin API's errors.
fn refusal(status: StatusCode, message: &str) -> Response<Body> {
    let code = match status {
        StatusCode::UNAUTHORIZED => "no_session",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::BAD_GATEWAY => "unreachable",
        _ => "invalid_request",
    };
    json_response(status, &json!({ "error": { "code": code, "message": message } }))
}
