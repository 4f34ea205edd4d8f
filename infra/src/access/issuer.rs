//! An OpenID Connect issuer on loopback, standing in for a team's own (Okta, Entra ID, a
//! Cognito user pool...) so that a JWT stack's console signs its users in locally as it does
//! on AWS: the page reads where to go from the issuer's discovery document, sends the browser
//! to its sign-in page with PKCE, and trades the code for an ID token.
//!
//! Its sign-in page asks for a user name and the user's groups and checks no password: anyone
//! on the machine may be anyone, as with the local SigV4 secret. Its tokens are the local
//! issuer's (HS256 under [`jwt::LOCAL_SIGNING_KEY`]), which the local stack's authorizer and
//! identity pool take; the code exchange is checked as a real issuer checks it (one use, the
//! same client and address, the verifier of the challenge).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::{Body, to_bytes};
use axum::http::{HeaderValue, Method, Request, Response, StatusCode};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use percent_encoding::{NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::access::jwt;

/// The claim that carries a user's groups in the issuer's ID tokens.
pub const GROUPS_CLAIM: &str = "groups";

/// How long an ID token is valid.
const TOKEN_SECONDS: i64 = 3600;

/// A sign-in waiting for its code to be traded.
#[derive(Clone, Debug)]
struct Grant {
    client_id: String,
    redirect_uri: String,
    challenge: String,
    user: String,
    groups: Vec<String>,
}

/// The issuer, serving until dropped.
#[derive(Debug)]
pub struct LocalIssuer {
    url: String,
    task: JoinHandle<()>,
}

impl LocalIssuer {
    /// Serves an issuer on a free loopback port.
    pub async fn start() -> std::io::Result<LocalIssuer> {
        LocalIssuer::start_on(0).await
    }

    /// Serves an issuer on loopback's `port` (0: any free one).
    pub async fn start_on(port: u16) -> std::io::Result<LocalIssuer> {
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        let url = format!("http://{}", listener.local_addr()?);
        let grants: Arc<Mutex<HashMap<String, Grant>>> = Arc::default();
        let issuer = url.clone();
        let app = axum::Router::new().fallback(move |request: Request<Body>| {
            let (issuer, grants) = (issuer.clone(), grants.clone());
            async move { answer(&issuer, &grants, request).await }
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(LocalIssuer { url, task })
    }

    /// The issuer's URL: its tokens' `iss`, and where its discovery document is.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for LocalIssuer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    issuer: &str,
    grants: &Mutex<HashMap<String, Grant>>,
    request: Request<Body>,
) -> Response<Body> {
    let (parts, body) = request.into_parts();
    let query = form(parts.uri.query().unwrap_or_default());
    let body = to_bytes(body, 64 * 1024).await.unwrap_or_default();
    let posted = form(&String::from_utf8_lossy(&body));
    match (&parts.method, parts.uri.path()) {
        (&Method::GET, "/.well-known/openid-configuration") => json_response(
            StatusCode::OK,
            &json!({
                "issuer": issuer,
                "authorization_endpoint": format!("{issuer}/authorize"),
                "token_endpoint": format!("{issuer}/token"),
                "end_session_endpoint": format!("{issuer}/logout"),
                "response_types_supported": ["code"],
                "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["HS256"],
                "code_challenge_methods_supported": ["S256"],
            }),
        ),
        (&Method::GET, "/authorize") => sign_in_page(&query),
        (&Method::POST, "/authorize") => signed_in(grants, &posted),
        (&Method::OPTIONS, "/token") => cors(Response::new(Body::empty())),
        (&Method::POST, "/token") => cors(trade(issuer, grants, &posted)),
        (&Method::GET, "/logout") => {
            match query.get("post_logout_redirect_uri").or(query.get("logout_uri")) {
                Some(back) => redirect(back),
                None => html(StatusCode::OK, "<p>Signed out.</p>"),
            }
        }
        _ => json_response(StatusCode::NOT_FOUND, &json!({"error": "not_found"})),
    }
}

/// The sign-in form, carrying the request's parameters on.
fn sign_in_page(query: &HashMap<String, String>) -> Response<Body> {
    let missing = ["client_id", "redirect_uri", "state", "code_challenge"]
        .into_iter()
        .find(|k| query.get(*k).is_none_or(String::is_empty));
    if let Some(missing) = missing {
        return html(StatusCode::BAD_REQUEST, &format!("<p>invalid_request: no {missing}</p>"));
    }
    if query.get("response_type").map(String::as_str) != Some("code")
        || query.get("code_challenge_method").map(String::as_str) != Some("S256")
    {
        return html(StatusCode::BAD_REQUEST, "<p>invalid_request: code flow with S256 only</p>");
    }
    let hidden: String = ["client_id", "redirect_uri", "state", "code_challenge"]
        .iter()
        .map(|k| format!(r#"<input type="hidden" name="{k}" value="{}">"#, escape(&query[*k])))
        .collect();
    html(
        StatusCode::OK,
        &format!(
            r#"<h1>Local issuer: sign in</h1><form method="post" action="authorize">{hidden}
<label>User <input id="user" name="user" required></label>
<label>Groups (separated by spaces) <input id="groups" name="groups"></label>
<button id="sign-in" type="submit">Sign in</button></form>"#
        ),
    )
}

/// The form sent: back to the client with a code.
fn signed_in(
    grants: &Mutex<HashMap<String, Grant>>,
    posted: &HashMap<String, String>,
) -> Response<Body> {
    let field = |k: &str| posted.get(k).cloned().unwrap_or_default();
    let user = field("user");
    if user.trim().is_empty() {
        return html(StatusCode::BAD_REQUEST, "<p>a user name is needed</p>");
    }
    let code = uuid::Uuid::new_v4().simple().to_string();
    let grant = Grant {
        client_id: field("client_id"),
        redirect_uri: field("redirect_uri"),
        challenge: field("code_challenge"),
        user: user.trim().to_owned(),
        groups: field("groups").split_whitespace().map(str::to_owned).collect(),
    };
    let back = format!(
        "{}?code={code}&state={}",
        grant.redirect_uri,
        utf8_percent_encode(&field("state"), NON_ALPHANUMERIC)
    );
    grants.lock().unwrap_or_else(|p| p.into_inner()).insert(code, grant);
    redirect(&back)
}

/// The token endpoint: a code, once, for the client and address it was given to, with the
/// verifier of its challenge.
fn trade(
    issuer: &str,
    grants: &Mutex<HashMap<String, Grant>>,
    posted: &HashMap<String, String>,
) -> Response<Body> {
    let refused = |error: &str| json_response(StatusCode::BAD_REQUEST, &json!({"error": error}));
    if posted.get("grant_type").map(String::as_str) != Some("authorization_code") {
        return refused("unsupported_grant_type");
    }
    let code = posted.get("code").cloned().unwrap_or_default();
    let Some(grant) = grants.lock().unwrap_or_else(|p| p.into_inner()).remove(&code) else {
        return refused("invalid_grant");
    };
    let verifier = posted.get("code_verifier").cloned().unwrap_or_default();
    let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
    if posted.get("client_id") != Some(&grant.client_id)
        || posted.get("redirect_uri") != Some(&grant.redirect_uri)
        || challenge != grant.challenge
    {
        return refused("invalid_grant");
    }
    let now = chrono::Utc::now();
    let mut claims = jwt::claims(
        issuer,
        &grant.client_id,
        &grant.user,
        now,
        chrono::Duration::seconds(TOKEN_SECONDS),
    );
    claims[GROUPS_CLAIM] = json!(grant.groups);
    let token = jwt::mint(&claims);
    json_response(
        StatusCode::OK,
        &json!({"id_token": token, "access_token": token, "token_type": "Bearer", "expires_in": TOKEN_SECONDS}),
    )
}

/// An `application/x-www-form-urlencoded` text's fields.
fn form(text: &str) -> HashMap<String, String> {
    let decode =
        |s: &str| percent_decode_str(&s.replace('+', " ")).decode_utf8_lossy().into_owned();
    text.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('"', "&quot;").replace('<', "&lt;").replace('>', "&gt;")
}

fn html(status: StatusCode, body: &str) -> Response<Body> {
    let page = format!("<!doctype html><meta charset=\"utf-8\"><title>Local issuer</title>{body}");
    let mut response = Response::new(Body::from(page));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("text/html; charset=utf-8"));
    response
}

fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
    response
}

fn redirect(to: &str) -> Response<Body> {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::FOUND;
    if let Ok(location) = to.parse() {
        response.headers_mut().insert("location", location);
    }
    response
}

/// A page of another origin calls the token endpoint, as issuers allow single-page clients.
pub(crate) fn cors(mut response: Response<Body>) -> Response<Body> {
    let headers = response.headers_mut();
    headers.insert("access-control-allow-origin", HeaderValue::from_static("*"));
    headers.insert("access-control-allow-methods", HeaderValue::from_static("POST, OPTIONS"));
    headers.insert(
        "access-control-allow-headers",
        HeaderValue::from_static("content-type, x-amz-target"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    const BACK: &str = "http://back/";

    /// The code the issuer sends the browser back with, once ada signed in with `challenge`.
    async fn signed_in_code(http: &reqwest::Client, issuer: &str, challenge: &str) -> String {
        let back = http
            .post(format!("{issuer}/authorize"))
            .body(format!(
                "client_id=console&redirect_uri=http%3A%2F%2Fback%2F&state=s1&code_challenge={challenge}&user=ada&groups=sas-operators+team-a"
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(back.status(), 302);
        let location = back.headers()["location"].to_str().unwrap().to_owned();
        let query = location.strip_prefix(&format!("{BACK}?")).unwrap();
        let fields = form(query);
        assert_eq!(fields["state"], "s1", "{location}");
        fields["code"].clone()
    }

    async fn trade(
        http: &reqwest::Client,
        issuer: &str,
        code: &str,
        verifier: &str,
    ) -> reqwest::Response {
        http.post(format!("{issuer}/token"))
            .body(format!(
                "grant_type=authorization_code&client_id=console&redirect_uri=http%3A%2F%2Fback%2F&code={code}&code_verifier={verifier}"
            ))
            .send()
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_code_is_traded_once_for_its_client_with_the_verifier_of_its_challenge() {
        let issuer = LocalIssuer::start().await.unwrap();
        let url = issuer.url();
        let http =
            reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
        let found: Value = http
            .get(format!("{url}/.well-known/openid-configuration"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(found["issuer"], url);
        let verifier = "a-verifier-of-forty-three-characters-or-more-0123";
        let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
        let page = http
            .get(format!(
                "{url}/authorize?response_type=code&client_id=console&redirect_uri=http%3A%2F%2Fback%2F&state=s1&code_challenge={challenge}&code_challenge_method=S256"
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(page.status(), 200);
        assert!(page.text().await.unwrap().contains(r#"name="state" value="s1""#));

        // A verifier not of the challenge spends the code, as an issuer spends it.
        let code = signed_in_code(&http, url, &challenge).await;
        assert_eq!(trade(&http, url, &code, "another-verifier").await.status(), 400);
        assert_eq!(trade(&http, url, &code, verifier).await.status(), 400);

        let code = signed_in_code(&http, url, &challenge).await;
        let tokens: Value = trade(&http, url, &code, verifier).await.json().await.unwrap();
        let token = format!("Bearer {}", tokens["id_token"].as_str().unwrap());
        let claims =
            jwt::verify(Some(&token), url, &["console".into()], chrono::Utc::now()).unwrap();
        assert_eq!(claims["sub"], "ada");
        assert_eq!(claims[GROUPS_CLAIM], "[sas-operators team-a]");
        assert_eq!(trade(&http, url, &code, verifier).await.status(), 400, "a code is traded once");
    }
}
