//! Where the HTTP agent's service is and how it authenticates there, read at cold start (the
//! rest of an agent's settings are the kit's). `SERVICE_URL` says which service this deployment
//! wraps; `SERVICE_AUTH` (in any case) how it authenticates there: `sigv4` (signed for
//! `SERVICE_SIGNING_NAME`, by default `lambda` for function URLs and `execute-api` otherwise),
//! `bearer` or `api-key` (the text of the secret `SERVICE_SECRET_ARN`, read once per cold
//! start), or `none`.

use std::time::Duration;

use sas_aws::settings::Env;
use sas_engine::{Error, Result};

/// Default cap on one call to the remote service.
const DEFAULT_CALL_TIMEOUT_MS: u64 = 10_000;

#[derive(Clone, Debug)]
pub struct Settings {
    pub service_url: String,
    pub auth: Auth,
    /// Cap on one call (`CALL_TIMEOUT_MS`).
    pub call_timeout: Duration,
}

/// How calls to the service authenticate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Auth {
    None,
    /// Signed with the function's role for this signing name.
    SigV4 {
        signing_name: String,
    },
    /// `Authorization: Bearer` and the secret's text.
    Bearer {
        secret_arn: String,
    },
    /// `x-api-key` and the secret's text.
    ApiKey {
        secret_arn: String,
    },
}

impl Settings {
    pub fn from_env(env: &Env) -> Result<Settings> {
        let call_timeout_ms = match env.get("CALL_TIMEOUT_MS") {
            Some(v) => v.parse().map_err(|_| {
                Error::Config(format!("CALL_TIMEOUT_MS={v:?} is not a number of milliseconds"))
            })?,
            None => DEFAULT_CALL_TIMEOUT_MS,
        };
        let service_url = env.required("SERVICE_URL")?;
        Ok(Settings {
            auth: auth(env, &service_url)?,
            service_url,
            call_timeout: Duration::from_millis(call_timeout_ms),
        })
    }
}

fn auth(env: &Env, service_url: &str) -> Result<Auth> {
    let secret_arn = || env.required("SERVICE_SECRET_ARN");
    // The template passes its parameter's spelling (SIGV4, API_KEY, ...).
    let kind = env.get("SERVICE_AUTH").unwrap_or_default().to_ascii_lowercase().replace('_', "-");
    Ok(match kind.as_str() {
        "none" | "" => Auth::None,
        "sigv4" => Auth::SigV4 {
            signing_name: env.get("SERVICE_SIGNING_NAME").unwrap_or_else(|| {
                let function_url = service_url.contains(".lambda-url.");
                if function_url { "lambda" } else { "execute-api" }.to_owned()
            }),
        },
        "bearer" => Auth::Bearer { secret_arn: secret_arn()? },
        "api-key" => Auth::ApiKey { secret_arn: secret_arn()? },
        other => {
            return Err(Error::Config(format!(
                "SERVICE_AUTH={other:?} is not one of sigv4, bearer, api-key, none"
            )));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth_of(pairs: &[(&str, &str)]) -> Result<Auth> {
        auth(&Env::from_pairs(pairs.iter().copied()), "https://abc.lambda-url.us-east-1.on.aws/")
    }

    #[test]
    fn the_auth_kind_is_read_in_the_templates_spelling_or_any_case() {
        assert_eq!(auth_of(&[]).unwrap(), Auth::None);
        assert_eq!(
            auth_of(&[("SERVICE_AUTH", "SIGV4")]).unwrap(),
            Auth::SigV4 { signing_name: "lambda".into() }
        );
        assert_eq!(
            auth_of(&[("SERVICE_AUTH", "API_KEY"), ("SERVICE_SECRET_ARN", "arn:s")]).unwrap(),
            Auth::ApiKey { secret_arn: "arn:s".into() }
        );
        let missing = auth_of(&[("SERVICE_AUTH", "bearer")]).unwrap_err().to_string();
        assert!(missing.contains("SERVICE_SECRET_ARN"), "{missing}");
        let unknown = auth_of(&[("SERVICE_AUTH", "basic")]).unwrap_err().to_string();
        assert!(unknown.contains("basic"), "{unknown}");
    }
}
