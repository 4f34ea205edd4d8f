//! Where the HTTP agent's service is and how it authenticates there, read at cold start (the
//! rest of an agent's settings are the kit's). Each takes its own entry, found by its
//! `AGENT_NAME`, of `SERVICE_URLS` (`agent=url` entries, comma-separated; the template gives
//! it only its own of the stack's ServiceUrls, `agent=` where it has none) and `SERVICE_AUTH`
//! (`agent=kind` entries; ServiceAuth). An agent without a URL calls `SIMULATED_SERVICE_URL`, the demo
//! service deployed while no URL is set, signed for Lambda. The kinds are `sigv4` (the
//! default; signed for `lambda` on function URLs and `execute-api` otherwise), `bearer` or
//! `api-key` (the text of the secret `SERVICE_SECRET_ID`, read once per cold start), or `none`,
//! in any case.

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
        secret_id: String,
    },
    /// `x-api-key` and the secret's text.
    ApiKey {
        secret_id: String,
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
        let agent = env.required("AGENT_NAME")?;
        let (service_url, auth) = match env.entry("SERVICE_URLS", &agent)? {
            Some(url) => {
                let auth = auth(env, &agent, &url)?;
                (url, auth)
            }
            None => match env.get("SIMULATED_SERVICE_URL") {
                Some(url) => (url, Auth::SigV4 { signing_name: "lambda".into() }),
                None => {
                    return Err(Error::Config(format!(
                        "agent {agent} has no URL in SERVICE_URLS, and no simulated service is deployed: add {agent}=https://... to the stack's ServiceUrls"
                    )));
                }
            },
        };
        Ok(Settings { auth, service_url, call_timeout: Duration::from_millis(call_timeout_ms) })
    }
}

/// The value of `agent`'s entry in the `agent=value` list `variable`, if it has one.
fn auth(env: &Env, agent: &str, service_url: &str) -> Result<Auth> {
    let secret_id = || env.required("SERVICE_SECRET_ID");
    // The template passes its parameter's spelling (SIGV4, API_KEY, ...).
    let kind = env.entry("SERVICE_AUTH", agent)?.unwrap_or_else(|| "sigv4".into());
    Ok(match kind.to_ascii_lowercase().replace('_', "-").as_str() {
        "none" => Auth::None,
        "sigv4" => Auth::SigV4 {
            signing_name: if service_url.contains(".lambda-url.") {
                "lambda"
            } else {
                "execute-api"
            }
            .to_owned(),
        },
        "bearer" => Auth::Bearer { secret_id: secret_id()? },
        "api-key" => Auth::ApiKey { secret_id: secret_id()? },
        _ => {
            return Err(Error::Config(format!(
                "SERVICE_AUTH: {agent}={kind} is not one of SIGV4, BEARER, API_KEY, NONE"
            )));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Result<Settings> {
        let base = [("AGENT_NAME", "payment"), ("SERVICE_SECRET_ID", "st/payment")];
        Settings::from_env(&Env::from_pairs(base.iter().chain(pairs).copied()))
    }

    #[test]
    fn an_agent_takes_its_own_entries_in_the_template_s_spelling() {
        let urls = ("SERVICE_URLS", "inventory=https://i.example, payment=https://p.lambda-url.x/");
        let s = settings(&[urls]).unwrap();
        assert_eq!(s.service_url, "https://p.lambda-url.x/");
        assert_eq!(s.auth, Auth::SigV4 { signing_name: "lambda".into() });
        let auth = |kind| settings(&[urls, ("SERVICE_AUTH", kind)]).map(|s| s.auth);
        assert_eq!(
            auth("payment=API_KEY").unwrap(),
            Auth::ApiKey { secret_id: "st/payment".into() }
        );
        assert_eq!(auth("inventory=NONE,payment=none").unwrap(), Auth::None);
        let unknown = auth("payment=basic").unwrap_err().to_string();
        assert!(unknown.contains("payment=basic"), "{unknown}");
        let malformed = auth("payment").unwrap_err().to_string();
        assert!(malformed.contains("agent=value"), "{malformed}");
    }

    #[test]
    fn without_a_url_the_agent_calls_the_simulated_service_or_names_what_is_missing() {
        let sim = settings(&[("SIMULATED_SERVICE_URL", "http://127.0.0.1:9/")]).unwrap();
        assert_eq!(sim.service_url, "http://127.0.0.1:9/");
        assert_eq!(sim.auth, Auth::SigV4 { signing_name: "lambda".into() });
        let err = settings(&[("SERVICE_URLS", "inventory=https://i.example")]).unwrap_err();
        assert!(err.to_string().contains("add payment=https://"), "{err}");
        // The template gives an agent without an entry `<agent>=`.
        let err = settings(&[("SERVICE_URLS", "payment="), ("SERVICE_AUTH", "payment=")]);
        assert!(err.unwrap_err().to_string().contains("add payment=https://"));
        let own = [("SERVICE_URLS", "payment="), ("SIMULATED_SERVICE_URL", "http://127.0.0.1:9/")];
        assert_eq!(settings(&own).unwrap().service_url, "http://127.0.0.1:9/");
    }
}
