//! The stack's HTTP API. Every request is signed with SigV4 for `execute-api`, with the
//! credentials the standard AWS chain finds (environment, profile, web identity, container or
//! instance role), as the API's `AWS_IAM` authorizer requires, or carries a bearer token where
//! the API takes JWTs. Throttled and unavailable answers
//! are retried: reads are safe to repeat, and a command carries its id, so a repeat is applied
//! once.

use std::time::{Duration, SystemTime};

use aws_config::BehaviorVersion;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use serde_json::Value;

/// Tries of one request that meets throttling, unavailability or a dropped connection.
const TRIES: u32 = 5;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error(
        "no AWS credentials: {0} (set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
    )]
    Credentials(String),
    #[error("could not sign the request: {0}")]
    Signing(String),
    #[error("{url}: {source}")]
    Http { url: String, source: reqwest::Error },
    #[error("{status} from {url}: {message}")]
    Api { status: u16, url: String, message: String, body: Value },
}

/// A connection to one stack's API.
#[derive(Debug)]
pub struct Api {
    base: String,
    region: String,
    http: reqwest::Client,
    auth: Auth,
}

/// How requests prove who sends them: signed with AWS credentials (`ApiAuth` `AWS_IAM`), or
/// with a bearer token from the stack's identity provider (`ApiAuth` `JWT`).
#[derive(Debug)]
enum Auth {
    SigV4(SharedCredentialsProvider),
    Bearer(String),
}

/// An answer as the API gave it, whatever its status.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// The `Retry-After` header, in seconds.
    pub retry_after: Option<u64>,
    pub body: Value,
}

impl Api {
    /// `base` is the stack's API URL (its `ApiUrl` output). The region is `region`, else the
    /// standard chain's, else the one in the URL.
    pub async fn connect(base: &str, region: Option<String>) -> Result<Api, CliError> {
        Api::connect_as(base, region, None).await
    }

    /// As [`Api::connect`]; with a `token`, requests carry it as a bearer token instead of a
    /// signature, and no AWS credentials are needed.
    pub async fn connect_as(
        base: &str,
        region: Option<String>,
        token: Option<String>,
    ) -> Result<Api, CliError> {
        let config = aws_config::defaults(BehaviorVersion::latest()).load().await;
        let auth = match token {
            Some(token) => Auth::Bearer(token),
            None => Auth::SigV4(config.credentials_provider().ok_or_else(|| {
                CliError::Credentials("no credential provider configured".into())
            })?),
        };
        let region = region
            .or_else(|| config.region().map(|r| r.to_string()))
            .or_else(|| region_of(base))
            .unwrap_or_else(|| "us-east-1".into());
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(40))
            .build()
            .map_err(|source| CliError::Http { url: base.into(), source })?;
        Ok(Api { base: base.trim_end_matches('/').to_owned(), region, http, auth })
    }

    /// `GET` a path (with its query string) and its JSON answer; any status other than 200
    /// is an error carrying the API's message.
    pub async fn get(&self, path: &str) -> Result<Value, CliError> {
        self.call("GET", path, None).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, CliError> {
        self.call("POST", path, Some(body)).await
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, CliError> {
        let url = format!("{}{path}", self.base);
        let body = body.map(Value::to_string).unwrap_or_default();
        let mut wait = Duration::from_millis(500);
        for attempt in 1..=TRIES {
            let outcome = self.send(method, &url, &body).await;
            let retry_after = match &outcome {
                Err(CliError::Http { source, .. })
                    if source.is_connect() || source.is_timeout() =>
                {
                    Some(wait)
                }
                // 500 is API Gateway's answer when Lambda throttles the function; every admin
                // command and answer is idempotent, so sending it again is safe.
                Err(CliError::Api { status: 429 | 500 | 503, body, .. }) => Some(
                    body.pointer("/error/retry_after_seconds")
                        .and_then(Value::as_u64)
                        .map_or(wait, Duration::from_secs),
                ),
                _ => None,
            };
            match retry_after {
                Some(pause) if attempt < TRIES => {
                    tokio::time::sleep(pause.min(Duration::from_secs(10))).await;
                    wait *= 2;
                }
                _ => return outcome,
            }
        }
        unreachable!("the last try returns")
    }

    async fn send(&self, method: &str, url: &str, body: &str) -> Result<Value, CliError> {
        let answer = self.request(method, url, &[], body).await?;
        // 202: a bulk command asked for, which the stack goes on with.
        if (200..300).contains(&answer.status) {
            return Ok(answer.body);
        }
        let value = answer.body;
        let message = value
            .pointer("/error/message")
            .or_else(|| value.get("message"))
            .and_then(Value::as_str)
            .map_or_else(|| value.to_string(), str::to_owned);
        Err(CliError::Api { status: answer.status, url: url.to_owned(), message, body: value })
    }

    /// Sends one request to `path` (with its query string), with `headers` besides the
    /// content type and the proof of who sends it, once, and returns the answer whatever its
    /// status. Fails only if no answer came.
    pub async fn once(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Result<Answer, CliError> {
        let url = format!("{}{path}", self.base);
        self.request(method, &url, headers, body).await
    }

    async fn request(
        &self,
        method: &str,
        url: &str,
        extra: &[(&str, &str)],
        body: &str,
    ) -> Result<Answer, CliError> {
        let mut headers = vec![("content-type", "application/json")];
        headers.extend_from_slice(extra);
        let reqwest_method = reqwest::Method::from_bytes(method.as_bytes())
            .map_err(|e| CliError::Usage(e.to_string()))?;
        let mut request = self.http.request(reqwest_method, url);
        for (name, value) in &headers {
            request = request.header(*name, *value);
        }
        match &self.auth {
            Auth::Bearer(token) => request = request.bearer_auth(token),
            Auth::SigV4(credentials) => {
                for (name, value) in
                    self.signature(credentials, method, url, &headers, body).await?
                {
                    request = request.header(name, value);
                }
            }
        }
        if !body.is_empty() {
            request = request.body(body.to_owned());
        }
        let http = |source| CliError::Http { url: url.to_owned(), source };
        let response = request.send().await.map_err(http)?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()?.trim().parse().ok());
        let text = response.text().await.map_err(http)?;
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok(Answer { status, retry_after, body })
    }

    /// The headers that sign a request for `execute-api`.
    async fn signature(
        &self,
        credentials: &SharedCredentialsProvider,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Result<Vec<(String, String)>, CliError> {
        let credentials = credentials
            .provide_credentials()
            .await
            .map_err(|e| CliError::Credentials(e.to_string()))?;
        let identity: Identity = credentials.into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name("execute-api")
            .time(SystemTime::now())
            .settings(SigningSettings::default())
            .build()
            .map_err(|e| CliError::Signing(e.to_string()))?
            .into();
        let signable = SignableRequest::new(
            method,
            url,
            headers.iter().copied(),
            SignableBody::Bytes(body.as_bytes()),
        )
        .map_err(|e| CliError::Signing(e.to_string()))?;
        let (instructions, _) =
            sign(signable, &params).map_err(|e| CliError::Signing(e.to_string()))?.into_parts();
        Ok(instructions
            .headers()
            .map(|(name, value)| (name.to_owned(), value.to_owned()))
            .collect())
    }
}

/// The region in an API Gateway URL (`https://{id}.execute-api.{region}.amazonaws.com`).
fn region_of(url: &str) -> Option<String> {
    let host = url.split("://").nth(1)?.split(['/', ':']).next()?;
    let mut parts = host.split('.');
    parts.next()?;
    (parts.next()? == "execute-api").then(|| parts.next().map(str::to_owned)).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_region_is_read_from_an_api_gateway_url() {
        assert_eq!(
            region_of("https://abc123.execute-api.eu-west-1.amazonaws.com").as_deref(),
            Some("eu-west-1")
        );
        assert_eq!(region_of("http://127.0.0.1:3000"), None);
    }
}
