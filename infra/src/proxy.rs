//! A counting proxy in front of the AWS API emulator: functions are pointed at it, and it
//! forwards every request unchanged while counting them by service and operation, so the demo
//! can report the AWS API calls an order really costs.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::{Body, to_bytes};
use axum::http::{Request, Response, StatusCode};

/// Requests seen, by (service, operation).
#[derive(Clone, Debug, Default)]
pub struct Counts(Arc<Mutex<BTreeMap<(String, String), u64>>>);

impl Counts {
    pub fn snapshot(&self) -> BTreeMap<(String, String), u64> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn add(&self, service: &str, operation: &str) {
        *self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((service.to_owned(), operation.to_owned()))
            .or_default() += 1;
    }
}

/// The service and operation of an AWS API request, from its `X-Amz-Target` header (the JSON
/// protocols of DynamoDB, SQS and EventBridge) or its `Action` parameter (query protocol).
/// Where the price or the purpose differs, the operation says more: whether a `GetItem` is
/// consistent (a whole read unit) or eventual (half), and which queue a send goes to.
pub fn classify(target: Option<&str>, body: &[u8]) -> (String, String) {
    if let Some(target) = target {
        let (prefix, operation) = target.split_once('.').unwrap_or((target, ""));
        let service = match prefix {
            p if p.starts_with("DynamoDB") => "dynamodb",
            p if p.starts_with("AmazonSQS") => "sqs",
            p if p.starts_with("AWSEvents") => "eventbridge",
            other => other,
        };
        let json = || serde_json::from_slice::<serde_json::Value>(body).unwrap_or_default();
        let operation = match (service, operation) {
            ("dynamodb", "GetItem") => {
                let consistent = json()["ConsistentRead"].as_bool().unwrap_or(false);
                format!("GetItem, {}", if consistent { "consistent" } else { "eventual" })
            }
            ("sqs", "SendMessage" | "SendMessageBatch") => {
                // Physical names end with the logical id: `<stack>-ReplyQueue`.
                let json = json();
                let queue = json["QueueUrl"].as_str().unwrap_or("").rsplit(['/', '-']).next();
                format!("{operation} to {}", queue.unwrap_or("?"))
            }
            _ => operation.to_owned(),
        };
        return (service.to_owned(), operation);
    }
    let text = String::from_utf8_lossy(body);
    let action = text.split('&').find_map(|kv| kv.strip_prefix("Action=")).unwrap_or("unknown");
    ("other".to_owned(), action.to_owned())
}

/// Serves the proxy on `listener`, forwarding to `upstream`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    upstream: String,
    counts: Counts,
) -> std::io::Result<()> {
    let client = reqwest::Client::new();
    let app = axum::Router::new().fallback(move |request: Request<Body>| {
        let (client, upstream, counts) = (client.clone(), upstream.clone(), counts.clone());
        async move { forward(&client, &upstream, &counts, request).await }
    });
    axum::serve(listener, app).await
}

async fn forward(
    client: &reqwest::Client,
    upstream: &str,
    counts: &Counts,
    request: Request<Body>,
) -> Response<Body> {
    let (parts, body) = request.into_parts();
    let Ok(body) = to_bytes(body, 64 * 1024 * 1024).await else {
        return status(StatusCode::PAYLOAD_TOO_LARGE);
    };
    let target = parts.headers.get("x-amz-target").and_then(|v| v.to_str().ok());
    let (service, operation) = classify(target, &body);
    counts.add(&service, &operation);
    let url = format!("{upstream}{}", parts.uri.path_and_query().map_or("/", |p| p.as_str()));
    let mut outgoing = client.request(parts.method.clone(), url).body(body);
    for (name, value) in &parts.headers {
        if name != "host" && name != "content-length" {
            outgoing = outgoing.header(name, value);
        }
    }
    match outgoing.send().await {
        Ok(answer) => {
            let mut response = Response::builder().status(answer.status());
            for (name, value) in answer.headers() {
                if name != "content-length" && name != "transfer-encoding" && name != "connection" {
                    response = response.header(name, value);
                }
            }
            let bytes = answer.bytes().await.unwrap_or_default();
            response.body(Body::from(bytes)).unwrap_or_else(|_| status(StatusCode::BAD_GATEWAY))
        }
        Err(_) => status(StatusCode::BAD_GATEWAY),
    }
}

fn status(code: StatusCode) -> Response<Body> {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = code;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_classified_by_target_or_action() {
        assert_eq!(
            classify(Some("DynamoDB_20120810.PutItem"), b""),
            ("dynamodb".into(), "PutItem".into())
        );
        assert_eq!(
            classify(
                Some("AmazonSQS.SendMessageBatch"),
                br#"{"QueueUrl":"http://127.0.0.1:5000/123456789012/sas-local-ReplyQueue","Entries":[]}"#
            ),
            ("sqs".into(), "SendMessageBatch to ReplyQueue".into())
        );
        assert_eq!(
            classify(
                Some("DynamoDB_20120810.GetItem"),
                br#"{"TableName":"t","ConsistentRead":true}"#
            ),
            ("dynamodb".into(), "GetItem, consistent".into())
        );
        assert_eq!(
            classify(Some("DynamoDB_20120810.GetItem"), br#"{"TableName":"t"}"#),
            ("dynamodb".into(), "GetItem, eventual".into())
        );
        assert_eq!(
            classify(Some("AWSEvents.PutEvents"), b""),
            ("eventbridge".into(), "PutEvents".into())
        );
        assert_eq!(
            classify(None, b"Action=SendMessage&QueueUrl=x"),
            ("other".into(), "SendMessage".into())
        );
    }
}
