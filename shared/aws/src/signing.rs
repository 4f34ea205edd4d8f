//! SigV4 signing of outgoing HTTP requests, for services behind IAM: API Gateway routes with
//! `AWS_IAM` auth (`execute-api`) and function URLs with `AWS_IAM` auth (`lambda`). Credentials
//! come from a provider (the standard chain: in Lambda, the function's role), asked on every
//! request so that rotated credentials are picked up; the provider caches them.

use std::time::SystemTime;

use aws_config::SdkConfig;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use reqwest::header::{HeaderName, HeaderValue};

/// Signs requests for one service in one region.
#[derive(Clone, Debug)]
pub struct SigV4 {
    credentials: SharedCredentialsProvider,
    region: String,
    service: String,
}

/// Why a request could not be signed, or sent.
#[derive(Debug, thiserror::Error)]
pub enum SigningError {
    #[error("no AWS credentials: {0}")]
    Credentials(String),
    #[error("could not sign the request: {0}")]
    Sign(String),
    #[error(transparent)]
    Http(#[from] reqwest::Error),
}

impl SigV4 {
    pub fn new(credentials: SharedCredentialsProvider, region: &str, service: &str) -> SigV4 {
        SigV4 { credentials, region: region.to_owned(), service: service.to_owned() }
    }

    /// With the credentials and region of an SDK configuration; `None` without either.
    pub fn from_config(config: &SdkConfig, service: &str) -> Option<SigV4> {
        let credentials = config.credentials_provider()?;
        let region = config.region()?.to_string();
        Some(SigV4::new(credentials, &region, service))
    }

    /// The name requests are signed for.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// Builds, signs and sends a request.
    pub async fn send(
        &self,
        client: &reqwest::Client,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, SigningError> {
        let mut request = request.build()?;
        self.sign(&mut request).await?;
        Ok(client.execute(request).await?)
    }

    /// Adds the signature headers to `request`, covering its method, URL, headers and body.
    pub async fn sign(&self, request: &mut reqwest::Request) -> Result<(), SigningError> {
        self.sign_at(request, SystemTime::now()).await
    }

    /// As [`SigV4::sign`], as if at `time` (a signature too old is refused: for tests of that).
    pub async fn sign_at(
        &self,
        request: &mut reqwest::Request,
        time: SystemTime,
    ) -> Result<(), SigningError> {
        let credentials = self
            .credentials
            .provide_credentials()
            .await
            .map_err(|e| SigningError::Credentials(e.to_string()))?;
        let identity: Identity = credentials.into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name(&self.service)
            .time(time)
            .settings(SigningSettings::default())
            .build()
            .map_err(|e| SigningError::Sign(e.to_string()))?
            .into();
        let headers: Vec<(&str, &str)> = request
            .headers()
            .iter()
            .filter_map(|(n, v)| Some((n.as_str(), v.to_str().ok()?)))
            .collect();
        let body = request.body().and_then(reqwest::Body::as_bytes).unwrap_or_default();
        let signable = SignableRequest::new(
            request.method().as_str(),
            request.url().as_str(),
            headers.into_iter(),
            SignableBody::Bytes(body),
        )
        .map_err(|e| SigningError::Sign(e.to_string()))?;
        let (instructions, _) =
            sign(signable, &params).map_err(|e| SigningError::Sign(e.to_string()))?.into_parts();
        let mut added = Vec::new();
        for (name, value) in instructions.headers() {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| SigningError::Sign(e.to_string()))?;
            let mut value =
                HeaderValue::from_str(value).map_err(|e| SigningError::Sign(e.to_string()))?;
            if name == reqwest::header::AUTHORIZATION || name.as_str() == "x-amz-security-token" {
                value.set_sensitive(true);
            }
            added.push((name, value));
        }
        for (name, value) in added {
            request.headers_mut().insert(name, value);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use aws_credential_types::Credentials;

    use super::*;

    #[tokio::test]
    async fn a_signed_request_carries_the_scope_and_signed_headers() {
        let credentials =
            SharedCredentialsProvider::new(Credentials::new("AKID", "secret", None, None, "test"));
        let signer = SigV4::new(credentials, "eu-west-1", "lambda");
        let client = reqwest::Client::new();
        let mut request = client
            .post("https://abc.lambda-url.eu-west-1.on.aws/actions/charge")
            .header("content-type", "application/json")
            .body("{}")
            .build()
            .unwrap();
        signer.sign(&mut request).await.unwrap();
        let authorization = request.headers()["authorization"].to_str().unwrap().to_owned();
        assert!(authorization.starts_with("AWS4-HMAC-SHA256 Credential=AKID/"), "{authorization}");
        assert!(authorization.contains("/eu-west-1/lambda/aws4_request"), "{authorization}");
        assert!(
            authorization.contains("content-type;host;x-amz-content-sha256;x-amz-date")
                || authorization.contains("content-type;host;x-amz-date"),
            "{authorization}"
        );
        assert!(request.headers()["authorization"].is_sensitive());
        assert!(request.headers().contains_key("x-amz-date"));
    }
}
