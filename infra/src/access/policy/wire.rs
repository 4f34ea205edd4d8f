//! An AWS API request as it arrives on the wire, and what it is: its service, from the
//! signature's credential scope or `X-Amz-Target`, and its operation, from the protocol the
//! service speaks. The JSON protocols (DynamoDB, SQS, EventBridge, Secrets Manager, ...) name
//! the operation in `X-Amz-Target`; the query protocol (SNS, STS, SQS from older SDKs, ...) in
//! the form's `Action`; the REST protocols (S3's XML, and the REST-JSON services) by the
//! method and the path.

use percent_encoding::percent_decode_str;

/// A request, as the proxy received it.
#[derive(Clone, Copy, Debug, Default)]
pub struct AwsRequest<'a> {
    pub method: &'a str,
    /// The path, still percent-encoded.
    pub path: &'a str,
    /// The query string, without `?`.
    pub query: &'a str,
    /// The `X-Amz-Target` header.
    pub target: Option<&'a str>,
    /// The `Authorization` header.
    pub authorization: Option<&'a str>,
    /// The `x-amz-copy-source` header (S3's copies).
    pub copy_source: Option<&'a str>,
    pub body: &'a [u8],
}

/// How a request names its operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// `X-Amz-Target: <prefix>.<operation>` and a JSON body.
    Json { prefix: String, operation: String },
    /// A form whose `Action` is the operation, with its other parameters.
    Query { action: String, params: Vec<(String, String)> },
    /// The method and path are the operation.
    Rest,
}

impl<'a> AwsRequest<'a> {
    /// The service the request was signed for (`s3`, `sns`, ...), as its credential scope
    /// names it: `Credential=<key>/<date>/<region>/<service>/aws4_request`.
    pub fn signed_service(&self) -> Option<&'a str> {
        let credential = self.authorization?.split_once("Credential=")?.1;
        let scope = credential.split([',', ' ']).next()?;
        scope.split('/').nth(3).filter(|s| !s.is_empty())
    }

    /// The service, as the proxy counts and checks it: the credential scope's name, or for a
    /// JSON request the service its target prefix names.
    pub fn service(&self) -> String {
        if let Protocol::Json { prefix, .. } = self.protocol() {
            let by_prefix = match prefix.as_str() {
                p if p.starts_with("DynamoDB") => Some("dynamodb"),
                p if p.starts_with("AmazonSQS") => Some("sqs"),
                p if p.starts_with("AWSEvents") => Some("events"),
                "secretsmanager" => Some("secretsmanager"),
                _ => None,
            };
            if let Some(service) = by_prefix {
                return service.to_owned();
            }
        }
        self.signed_service().unwrap_or("unknown").to_owned()
    }

    pub fn protocol(&self) -> Protocol {
        if let Some((prefix, operation)) = self.target.and_then(|t| t.split_once('.')) {
            return Protocol::Json { prefix: prefix.to_owned(), operation: operation.to_owned() };
        }
        // A query-protocol request is a form posted to `/` (or, from some clients, a GET with
        // the form in its query string).
        let form = if self.method.eq_ignore_ascii_case("POST") && self.path == "/" {
            std::str::from_utf8(self.body).unwrap_or_default()
        } else if self.path == "/" {
            self.query
        } else {
            ""
        };
        let params = form_pairs(form);
        match params.iter().position(|(k, _)| k == "Action") {
            Some(at) => {
                let mut params = params;
                let (_, action) = params.remove(at);
                Protocol::Query { action, params }
            }
            None => Protocol::Rest,
        }
    }

    /// The path's segments after the first `/`, decoded: for S3, the bucket and the key.
    pub fn bucket_and_key(&self) -> (Option<String>, Option<String>) {
        let path = self.path.strip_prefix('/').unwrap_or(self.path);
        let (bucket, key) = match path.split_once('/') {
            Some((bucket, key)) => (bucket, Some(key)),
            None => (path, None),
        };
        let decode = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
        let bucket = Some(decode(bucket)).filter(|b| !b.is_empty());
        let key = key.filter(|k| !k.is_empty()).map(decode);
        (bucket, key)
    }

    /// The query string's parameter names (S3 names its sub-resources so: `?tagging`).
    pub fn query_has(&self, name: &str) -> bool {
        form_pairs(self.query).iter().any(|(k, _)| k == name)
    }
}

/// A form's (or a query string's) pairs, decoded.
pub fn form_pairs(form: &str) -> Vec<(String, String)> {
    let decode =
        |s: &str| percent_decode_str(&s.replace('+', " ")).decode_utf8_lossy().into_owned();
    form.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), String::new()),
        })
        .collect()
}
