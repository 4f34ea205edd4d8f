//! The local stack's JWT issuer and authorizer. A route whose authorizer is `JWT` takes, as API
//! Gateway's JWT authorizers do, a bearer token whose `iss` is the configured issuer, whose
//! `aud` (or `client_id`, as Cognito access tokens carry it) is one of the configured
//! audiences, and which has not expired; the function then sees its claims.
//!
//! API Gateway checks the token's signature against the issuer's published RSA keys. No issuer
//! can be reached from a laptop, so the local stack is an issuer of its own: it signs with
//! HMAC-SHA256 under [`LOCAL_SIGNING_KEY`], which anyone on the machine may use, as the local
//! SigV4 secret is. [`mint`] makes such tokens (`local-stack token` prints one), for whatever
//! issuer, audience and subject a test needs, so that the issuer and audience checks are the
//! real ones.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Map, Value, json};
use sha2::Sha256;

/// The key every locally issued token is signed with.
pub const LOCAL_SIGNING_KEY: &[u8] = b"local";

/// Why a token is refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no bearer token in the Authorization header")]
    Missing,
    #[error("the token is not a JWT")]
    Malformed,
    #[error("the token is signed with {0:?}; the local issuer signs with HS256")]
    Algorithm(String),
    #[error("the signature does not match")]
    Signature,
    #[error("the token has expired")]
    Expired,
    #[error("the token has no exp claim")]
    NoExpiry,
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("the token's issuer {0:?} is not the one configured")]
    Issuer(String),
    #[error("the token is for none of the configured audiences")]
    Audience,
}

/// A token of the local issuer carrying `claims` (which should hold `iss`, `sub`, `aud` and
/// `exp`).
pub fn mint(claims: &Value) -> String {
    let header = URL_SAFE_NO_PAD.encode(json!({"alg": "HS256", "typ": "JWT"}).to_string());
    let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signing_input = format!("{header}.{payload}");
    let signature = URL_SAFE_NO_PAD.encode(sign(signing_input.as_bytes()));
    format!("{signing_input}.{signature}")
}

/// Claims for `subject` of `issuer`, for `audience`, valid for `ttl` from `now`.
pub fn claims(
    issuer: &str,
    audience: &str,
    subject: &str,
    now: DateTime<Utc>,
    ttl: chrono::Duration,
) -> Value {
    json!({
        "iss": issuer,
        "sub": subject,
        "aud": audience,
        "iat": now.timestamp(),
        "exp": (now + ttl).timestamp(),
    })
}

/// The claims of the bearer token in `authorization` (the header's value), if it is one of the
/// local issuer's, for `issuer` and one of `audience`, and valid at `now`. The claims are given
/// as API Gateway hands them to functions: every value as a string.
pub fn verify(
    authorization: Option<&str>,
    issuer: &str,
    audience: &[String],
    now: DateTime<Utc>,
) -> Result<Map<String, Value>, Refusal> {
    let token = authorization.map(str::trim).filter(|t| !t.is_empty()).ok_or(Refusal::Missing)?;
    // API Gateway takes the token with or without the scheme.
    let token = token.strip_prefix("Bearer ").unwrap_or(token).trim();
    let mut parts = token.split('.');
    let (Some(header), Some(payload), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Refusal::Malformed);
    };
    let decode = |part: &str| -> Result<Value, Refusal> {
        let bytes = URL_SAFE_NO_PAD.decode(part).map_err(|_| Refusal::Malformed)?;
        serde_json::from_slice(&bytes).map_err(|_| Refusal::Malformed)
    };
    let alg = decode(header)?.get("alg").and_then(Value::as_str).unwrap_or_default().to_owned();
    if alg != "HS256" {
        return Err(Refusal::Algorithm(alg));
    }
    let given = URL_SAFE_NO_PAD.decode(signature).map_err(|_| Refusal::Malformed)?;
    let mut mac =
        Hmac::<Sha256>::new_from_slice(LOCAL_SIGNING_KEY).map_err(|_| Refusal::Signature)?;
    mac.update(format!("{header}.{payload}").as_bytes());
    mac.verify_slice(&given).map_err(|_| Refusal::Signature)?;

    let Value::Object(claims) = decode(payload)? else {
        return Err(Refusal::Malformed);
    };
    let time = |name: &str| claims.get(name).and_then(Value::as_i64);
    match time("exp") {
        None => return Err(Refusal::NoExpiry),
        Some(exp) if exp <= now.timestamp() => return Err(Refusal::Expired),
        Some(_) => {}
    }
    if time("nbf").is_some_and(|nbf| nbf > now.timestamp()) {
        return Err(Refusal::NotYetValid);
    }
    let iss = claims.get("iss").and_then(Value::as_str).unwrap_or_default();
    if iss != issuer {
        return Err(Refusal::Issuer(iss.to_owned()));
    }
    let names_one = |claim: &str| match claims.get(claim) {
        Some(Value::String(a)) => audience.contains(a),
        Some(Value::Array(list)) => {
            list.iter().filter_map(Value::as_str).any(|a| audience.iter().any(|b| a == b))
        }
        _ => false,
    };
    if !names_one("aud") && !names_one("client_id") {
        return Err(Refusal::Audience);
    }
    Ok(claims
        .into_iter()
        .map(|(k, v)| {
            let text = match v {
                Value::String(s) => s,
                Value::Array(items) => format!(
                    "[{}]",
                    items
                        .iter()
                        .map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_owned))
                        .collect::<Vec<_>>()
                        .join(" ")
                ),
                other => other.to_string(),
            };
            (k, Value::String(text))
        })
        .collect())
}

fn sign(input: &[u8]) -> Vec<u8> {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(LOCAL_SIGNING_KEY).expect("HMAC takes a key of any length");
    mac.update(input);
    mac.finalize().into_bytes().to_vec()
}

#[cfg(test)]
mod tests {
    use chrono::Duration;

    use super::*;

    const ISSUER: &str = "https://issuer.example";

    fn audiences() -> Vec<String> {
        vec!["orders".into(), "other-client".into()]
    }

    fn now() -> DateTime<Utc> {
        "2026-01-01T12:00:00Z".parse().unwrap()
    }

    fn token(edit: impl FnOnce(&mut Value)) -> String {
        let mut c = claims(ISSUER, "orders", "alice", now(), Duration::minutes(5));
        edit(&mut c);
        format!("Bearer {}", mint(&c))
    }

    fn check(authorization: &str) -> Result<Map<String, Value>, Refusal> {
        verify(Some(authorization), ISSUER, &audiences(), now())
    }

    #[test]
    fn a_token_of_the_issuer_for_an_audience_is_taken_and_its_claims_are_strings() {
        let claims = check(&token(|_| {})).unwrap();
        assert_eq!(claims["sub"], "alice");
        assert_eq!(claims["iss"], ISSUER);
        assert_eq!(claims["exp"], (now() + Duration::minutes(5)).timestamp().to_string());
        let bare = token(|_| {}).trim_start_matches("Bearer ").to_owned();
        assert!(check(&bare).is_ok(), "the scheme is optional");
        let cognito = token(|c| {
            c.as_object_mut().unwrap().remove("aud");
            c["client_id"] = json!("other-client");
        });
        assert!(check(&cognito).is_ok(), "an access token names its client in client_id");
        let many = token(|c| c["aud"] = json!(["elsewhere", "orders"]));
        assert_eq!(check(&many).unwrap()["aud"], "[elsewhere orders]");
    }

    #[test]
    fn tokens_are_refused_for_each_reason() {
        let cases: Vec<(String, Refusal)> = vec![
            (token(|c| c["aud"] = json!("elsewhere")), Refusal::Audience),
            (
                token(|c| c["iss"] = json!("https://other.example")),
                Refusal::Issuer("https://other.example".into()),
            ),
            (token(|c| c["exp"] = json!(now().timestamp())), Refusal::Expired),
            (token(|c| drop(c.as_object_mut().unwrap().remove("exp"))), Refusal::NoExpiry),
            (token(|c| c["nbf"] = json!(now().timestamp() + 60)), Refusal::NotYetValid),
            ("Bearer abc.def".into(), Refusal::Malformed),
            ("Bearer".into(), Refusal::Malformed),
        ];
        for (authorization, refusal) in cases {
            assert_eq!(check(&authorization), Err(refusal), "{authorization}");
        }
        assert_eq!(verify(None, ISSUER, &audiences(), now()), Err(Refusal::Missing));

        let good = token(|_| {});
        let (rest, _) = good.rsplit_once('.').unwrap();
        let forged = format!("{rest}.{}", URL_SAFE_NO_PAD.encode([0u8; 32]));
        assert_eq!(check(&forged), Err(Refusal::Signature));
        let other_claims = URL_SAFE_NO_PAD
            .encode(claims(ISSUER, "orders", "mallory", now(), Duration::minutes(5)).to_string());
        let parts: Vec<&str> = good.split('.').collect();
        let swapped = format!("{}.{other_claims}.{}", parts[0], parts[2]);
        assert_eq!(check(&swapped), Err(Refusal::Signature), "claims are covered by the signature");
        let unsigned_header = URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#);
        let unsigned = format!("Bearer {unsigned_header}.{}.", parts[1]);
        assert_eq!(check(&unsigned), Err(Refusal::Algorithm("none".into())));
    }
}
