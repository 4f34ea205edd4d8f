//! SigV4 verification, as API Gateway's `AWS_IAM` authorizer (service `execute-api`) and
//! function URLs with `AWS_IAM` auth (service `lambda`) do it: the
//! request is put in canonical form, the string to sign is built from it and the credential
//! scope, and the signature must be the one the caller's secret key gives. A signature more
//! than five minutes away from the gateway's clock is expired.
//!
//! The local stack has no IAM: every access key id names a caller, and its secret key is
//! [`LOCAL_SECRET_KEY`]. What is proved locally is that requests are signed, signed for this
//! region and service, recently, and not changed since.

use chrono::{DateTime, NaiveDateTime, Utc};
use hmac::{Hmac, KeyInit, Mac};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use sha2::{Digest, Sha256};

/// The secret key of every access key id on the local stack.
pub const LOCAL_SECRET_KEY: &str = "local";

/// The service name a request to an HTTP API is signed for.
pub const EXECUTE_API: &str = "execute-api";
/// The service name a request to a function URL is signed for.
pub const LAMBDA: &str = "lambda";

/// A signer for `caller` on the local stack, for `service` (`execute-api` for the HTTP API,
/// `lambda` for function URLs).
pub fn local_signer(caller: &str, region: &str, service: &str) -> sas_aws::signing::SigV4 {
    let credentials =
        aws_credential_types::Credentials::new(caller, LOCAL_SECRET_KEY, None, None, "local stack");
    sas_aws::signing::SigV4::new(
        aws_credential_types::provider::SharedCredentialsProvider::new(credentials),
        region,
        service,
    )
}

/// How far a request's signing time may be from the gateway's clock.
const MAX_SKEW_SECONDS: i64 = 5 * 60;

/// Why a request is refused, in API Gateway's words where it has them.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("Missing Authentication Token")]
    Unsigned,
    #[error("Authorization header requires {0}")]
    Malformed(&'static str),
    #[error("Credential should be scoped to a valid region, not '{0}'")]
    WrongRegion(String),
    #[error("Credential should be scoped to correct service: '{0}'")]
    WrongService(String),
    #[error("Signature expired: the request was signed at {0}")]
    Expired(String),
    #[error(
        "The request signature we calculated does not match the signature you provided. Check your AWS Secret Access Key and signing method."
    )]
    Mismatch,
}

/// A request as the gateway received it: the path and query exactly as sent.
#[derive(Debug)]
pub struct Signed<'a> {
    pub method: &'a str,
    pub raw_path: &'a str,
    pub raw_query: &'a str,
    /// Every header, names in any case; a repeated header once per value.
    pub headers: &'a [(String, String)],
    pub body: &'a [u8],
}

/// The access key id of a request correctly signed for `service` in `region` at about `now`.
pub fn verify(
    request: &Signed<'_>,
    region: &str,
    service: &str,
    now: DateTime<Utc>,
) -> Result<String, Refusal> {
    let authorization = header(request.headers, "authorization").ok_or(Refusal::Unsigned)?;
    let fields = authorization
        .strip_prefix("AWS4-HMAC-SHA256 ")
        .ok_or(Refusal::Malformed("the AWS4-HMAC-SHA256 algorithm"))?;
    let field = |name: &str| {
        fields.split(',').map(str::trim).find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
    };
    let credential = field("Credential").ok_or(Refusal::Malformed("'Credential' parameter"))?;
    let signed_headers =
        field("SignedHeaders").ok_or(Refusal::Malformed("'SignedHeaders' parameter"))?;
    let signature = field("Signature").ok_or(Refusal::Malformed("'Signature' parameter"))?;

    let [access_key, date, scope_region, scope_service, terminator] =
        credential.split('/').collect::<Vec<_>>()[..]
    else {
        return Err(Refusal::Malformed("a credential of five parts"));
    };
    if access_key.is_empty() || terminator != "aws4_request" {
        return Err(Refusal::Malformed("a credential of five parts"));
    }
    if scope_region != region {
        return Err(Refusal::WrongRegion(scope_region.to_owned()));
    }
    if scope_service != service {
        return Err(Refusal::WrongService(service.to_owned()));
    }
    let amz_date = header(request.headers, "x-amz-date")
        .ok_or(Refusal::Malformed("an 'X-Amz-Date' header"))?;
    let signed_at = NaiveDateTime::parse_from_str(&amz_date, "%Y%m%dT%H%M%SZ")
        .map_err(|_| Refusal::Malformed("an 'X-Amz-Date' of the form 20261122T101500Z"))?
        .and_utc();
    if !amz_date.starts_with(date) {
        return Err(Refusal::Malformed("a credential dated the day of 'X-Amz-Date'"));
    }
    if (now - signed_at).num_seconds().abs() > MAX_SKEW_SECONDS {
        return Err(Refusal::Expired(amz_date));
    }
    let names: Vec<&str> = signed_headers.split(';').collect();
    if !names.contains(&"host") {
        return Err(Refusal::Malformed("the 'host' header to be signed"));
    }

    let scope = format!("{date}/{region}/{service}/aws4_request");
    let key = signing_key(LOCAL_SECRET_KEY, date, region, service).ok_or(Refusal::Mismatch)?;
    // Clients differ in whether the path is encoded once or twice before signing (only S3 says
    // once), and in the query's `+`: botocore signs a prepared URL's query as it stands, other
    // clients encode it afresh, reading a `+` as itself or (as a form encoder wrote it) as a
    // space. Each is taken.
    let paths = [canonical_path(request.raw_path, true), canonical_path(request.raw_path, false)];
    let raw = request.raw_query;
    let queries =
        [canonical_query(raw), canonical_query(&raw.replace('+', "%20")), query_as_sent(raw)];
    let matches = paths.iter().flat_map(|path| queries.iter().map(move |query| (path, query))).any(
        |(path, query)| {
            let canonical = canonical_request(request, path, query, &names, signed_headers);
            let to_sign = format!(
                "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
                hex::encode(Sha256::digest(canonical.as_bytes()))
            );
            let Ok(wanted) = hex::decode(signature) else { return false };
            hmac(&key, to_sign.as_bytes()).is_some_and(|mac| mac.verify_slice(&wanted).is_ok())
        },
    );
    if matches { Ok(access_key.to_owned()) } else { Err(Refusal::Mismatch) }
}

fn canonical_request(
    request: &Signed<'_>,
    path: &str,
    query: &str,
    names: &[&str],
    signed: &str,
) -> String {
    let headers: String = names
        .iter()
        .map(|name| {
            let values: Vec<String> = request
                .headers
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect();
            format!("{name}:{}\n", values.join(","))
        })
        .collect();
    format!(
        "{}\n{path}\n{}\n{headers}\n{signed}\n{}",
        request.method.to_ascii_uppercase(),
        query,
        hex::encode(Sha256::digest(request.body))
    )
}

/// Each segment of the path decoded, then encoded as SigV4 wants (twice over, unless `once`).
fn canonical_path(raw: &str, once: bool) -> String {
    if raw.is_empty() {
        return "/".into();
    }
    raw.split('/')
        .map(|segment| {
            let encoded = encode(&decode(segment));
            if once { encoded } else { encode(&encoded) }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Parameters decoded, encoded again, and sorted by name, then value.
fn canonical_query(raw: &str) -> String {
    let mut pairs: Vec<(String, String)> = raw
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (encode(&decode(k)), encode(&decode(v)))
        })
        .collect();
    pairs.sort();
    pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&")
}

/// The query's pairs sorted, each as it was sent.
fn query_as_sent(raw: &str) -> String {
    let mut pairs: Vec<(&str, &str)> = raw
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .collect();
    pairs.sort();
    pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&")
}

/// What SigV4 leaves as it is: the unreserved characters of RFC 3986.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

fn encode(text: &str) -> String {
    utf8_percent_encode(text, UNRESERVED).to_string()
}

/// Percent-decodes (a `+` stays a `+`: SigV4 clients encode a space as `%20`).
fn decode(text: &str) -> String {
    percent_decode_str(text).decode_utf8_lossy().into_owned()
}

fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> Option<Vec<u8>> {
    [date, region, service, "aws4_request"]
        .iter()
        .try_fold(format!("AWS4{secret}").into_bytes(), |key, part| {
            Some(hmac(&key, part.as_bytes())?.finalize().into_bytes().to_vec())
        })
}

/// HMAC-SHA256 of `data`; `None` only if the key were refused, which HMAC never does.
fn hmac(key: &[u8], data: &[u8]) -> Option<Hmac<Sha256>> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).ok()?;
    mac.update(data);
    Some(mac)
}

fn header(headers: &[(String, String)], name: &str) -> Option<String> {
    headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.clone())
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use aws_credential_types::Credentials;
    use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
    use aws_sigv4::sign::v4;
    use aws_smithy_runtime_api::client::identity::Identity;

    use super::*;

    const HOST: &str = "127.0.0.1:3000";

    /// Headers of a request signed by the AWS SDK's signer, as a client sends them.
    fn signed(
        method: &str,
        path_and_query: &str,
        body: &[u8],
        (secret, region, service): (&str, &str, &str),
        at: DateTime<Utc>,
    ) -> Vec<(String, String)> {
        let identity: Identity = Credentials::new("ops-ada", secret, None, None, "test").into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(region)
            .name(service)
            .time(SystemTime::from(at))
            .settings(SigningSettings::default())
            .build()
            .unwrap()
            .into();
        let url = format!("http://{HOST}{path_and_query}");
        let headers = [("content-type", "application/json")];
        let request =
            SignableRequest::new(method, &url, headers.into_iter(), SignableBody::Bytes(body))
                .unwrap();
        let (instructions, _) = sign(request, &params).unwrap().into_parts();
        let mut sent: Vec<(String, String)> =
            instructions.headers().map(|(n, v)| (n.to_owned(), v.to_owned())).collect();
        sent.push(("Host".into(), HOST.into()));
        sent.push(("Content-Type".into(), "application/json".into()));
        sent
    }

    fn check(
        method: &str,
        path: &str,
        query: &str,
        body: &[u8],
        headers: &[(String, String)],
        now: DateTime<Utc>,
    ) -> Result<String, Refusal> {
        let request = Signed { method, raw_path: path, raw_query: query, headers, body };
        verify(&request, "us-east-1", EXECUTE_API, now)
    }

    const LOCAL: (&str, &str, &str) = (LOCAL_SECRET_KEY, "us-east-1", "execute-api");

    #[test]
    fn a_request_signed_by_the_sdk_is_taken_and_names_its_access_key() {
        let now = Utc::now();
        let h =
            signed("GET", "/admin/orders?list=failed&limit=5&step=charge-payment", b"", LOCAL, now);
        let query = "list=failed&limit=5&step=charge-payment";
        assert_eq!(check("GET", "/admin/orders", query, b"", &h, now), Ok("ops-ada".into()));

        let body = br#"{"command_id":"c-1","reason":"payment back"}"#;
        let path = "/admin/orders/0b6e8f3c-5d0a-5c4e-9a51-6f1f6f3f1b2a/redrive";
        let h = signed("POST", path, body, LOCAL, now);
        assert_eq!(check("POST", path, "", body, &h, now), Ok("ops-ada".into()));
        // Signed a minute ago, or by a client whose clock is a minute ahead.
        let minute = chrono::Duration::seconds(60);
        assert!(check("POST", path, "", body, &h, now + minute).is_ok());
        assert!(check("POST", path, "", body, &h, now - minute).is_ok());
    }

    #[test]
    fn a_plus_in_the_query_is_taken_however_the_client_put_it_in_the_canonical_form() {
        let now = Utc::now();
        let query = "list=failed&after=a+b%C2%84";
        let h = signed("GET", &format!("/admin/orders?{query}"), b"", LOCAL, now);
        assert_eq!(check("GET", "/admin/orders", query, b"", &h, now), Ok("ops-ada".into()));
        // botocore signs the query as sent, pairs sorted; the SDK reads the `+` as a space.
        assert_eq!(query_as_sent(query), "after=a+b%C2%84&list=failed");
        assert_eq!(canonical_query(query), "after=a%2Bb%C2%84&list=failed");
        // A `+` changed after signing is still refused.
        assert_eq!(
            check("GET", "/admin/orders", "list=failed&after=a-b%C2%84", b"", &h, now),
            Err(Refusal::Mismatch)
        );
    }

    #[test]
    fn a_request_changed_after_signing_or_signed_otherwise_is_refused() {
        let now = Utc::now();
        let body = br#"{"command_id":"c-1","reason":"payment back"}"#;
        let path = "/admin/orders/0b6e8f3c-5d0a-5c4e-9a51-6f1f6f3f1b2a/cancel";
        let good = signed("POST", path, body, LOCAL, now);
        let other = "/admin/orders/0b6e8f3c-5d0a-5c4e-9a51-6f1f6f3f1b2b/cancel";
        for (what, method, path, query, body, headers, refusal) in [
            (
                "another body",
                "POST",
                path,
                "",
                &br#"{"command_id":"c-2","reason":"x"}"#[..],
                good.clone(),
                Refusal::Mismatch,
            ),
            ("another order", "POST", other, "", &body[..], good.clone(), Refusal::Mismatch),
            ("another method", "PUT", path, "", &body[..], good.clone(), Refusal::Mismatch),
            ("a query added", "POST", path, "a=1", &body[..], good.clone(), Refusal::Mismatch),
            (
                "another secret",
                "POST",
                path,
                "",
                &body[..],
                signed("POST", path, body, ("real", "us-east-1", "execute-api"), now),
                Refusal::Mismatch,
            ),
            (
                "another region",
                "POST",
                path,
                "",
                &body[..],
                signed("POST", path, body, (LOCAL_SECRET_KEY, "eu-west-1", "execute-api"), now),
                Refusal::WrongRegion("eu-west-1".into()),
            ),
            (
                "another service",
                "POST",
                path,
                "",
                &body[..],
                signed("POST", path, body, (LOCAL_SECRET_KEY, "us-east-1", "lambda"), now),
                Refusal::WrongService(EXECUTE_API.into()),
            ),
            (
                "no signature",
                "POST",
                path,
                "",
                &body[..],
                vec![("Host".to_owned(), HOST.to_owned())],
                Refusal::Unsigned,
            ),
        ] {
            assert_eq!(check(method, path, query, body, &headers, now), Err(refusal), "{what}");
        }
        let stale = signed("POST", path, body, LOCAL, now - chrono::Duration::seconds(6 * 60));
        assert!(matches!(check("POST", path, "", body, &stale, now), Err(Refusal::Expired(_))));
    }

    #[test]
    fn an_authorization_header_of_another_shape_is_malformed() {
        let now = Utc::now();
        let date = now.format("%Y%m%dT%H%M%SZ").to_string();
        let day = &date[..8];
        for authorization in [
            "Bearer abc".to_owned(),
            "AWS4-HMAC-SHA256 SignedHeaders=host, Signature=00".to_owned(),
            format!(
                "AWS4-HMAC-SHA256 Credential=ops/{day}/us-east-1/execute-api/aws4_request, Signature=00"
            ),
            format!(
                "AWS4-HMAC-SHA256 Credential=ops/{day}/us-east-1/execute-api, SignedHeaders=host, Signature=00"
            ),
            format!(
                "AWS4-HMAC-SHA256 Credential=/{day}/us-east-1/execute-api/aws4_request, SignedHeaders=host, Signature=00"
            ),
            format!(
                "AWS4-HMAC-SHA256 Credential=ops/{day}/us-east-1/execute-api/aws4_request, SignedHeaders=x-amz-date, Signature=00"
            ),
        ] {
            let headers = vec![
                ("Authorization".to_owned(), authorization.clone()),
                ("X-Amz-Date".to_owned(), date.clone()),
                ("Host".to_owned(), HOST.to_owned()),
            ];
            let got = check("GET", "/admin/orders", "", b"", &headers, now);
            assert!(matches!(got, Err(Refusal::Malformed(_))), "{authorization}: {got:?}");
        }
    }

    #[test]
    fn paths_and_queries_are_put_in_canonical_form() {
        assert_eq!(canonical_query("b=2&a=x%20y&a=1&c"), "a=1&a=x%20y&b=2&c=");
        assert_eq!(canonical_path("/orders/a%20b", true), "/orders/a%20b");
        assert_eq!(canonical_path("/orders/a%20b", false), "/orders/a%2520b");
        assert_eq!(canonical_path("", true), "/");
    }
}
