//! The gateway's routing, authorizers, throttling and screening of request heads.

use super::*;

async fn route(method: &str, path: &str) -> Route {
    Route {
        method: method.into(),
        path: path.into(),
        function: RuntimeApi::start("f", "us-east-1").await.unwrap(),
        timeout: Duration::from_secs(1),
        throttle: None,
        authorizer: None,
        invoked: None,
        callers: None,
    }
}

#[test]
fn a_verified_access_key_names_the_caller() {
    let caller = iam_caller("AKIDOPS1");
    assert_eq!(caller["userArn"], format!("arn:aws:iam::{LOCAL_ACCOUNT}:user/AKIDOPS1"));
    assert_eq!(caller["accessKey"], "AKIDOPS1");
}

#[test]
fn a_throttle_lets_a_burst_through_then_the_steady_rate() {
    let t = Throttle::new(10.0, 3.0);
    assert!((0..3).all(|_| t.admit()), "the burst");
    assert!(!t.admit(), "then nothing until tokens come back");
    std::thread::sleep(Duration::from_millis(120));
    assert!(t.admit(), "one token per 100 ms");
    assert!(!t.admit());
}

#[tokio::test]
async fn routes_match_methods_paths_and_parameters() {
    let get = route("GET", "/orders/{id}").await;
    assert_eq!(get.matches("GET", "/orders/42").unwrap()["id"], "42");
    assert!(get.matches("POST", "/orders/42").is_none());
    assert!(get.matches("GET", "/orders").is_none());
    assert!(get.matches("GET", "/orders/42/x").is_none());
    let post = route("POST", "/orders").await;
    assert!(post.matches("post", "/orders").is_some());
    let any = route("ANY", "/{proxy+}").await;
    assert_eq!(any.matches("PUT", "/actions/charge").unwrap()["proxy"], "actions/charge");
    assert_eq!(any.route_key(), "$default");
}

#[test]
fn header_values_that_are_not_ascii_are_passed_on() {
    let mut headers = axum::http::HeaderMap::new();
    headers.insert("idempotency-key", HeaderValue::from_bytes("clé-1".as_bytes()).unwrap());
    headers.append("x-a", HeaderValue::from_static("1"));
    headers.append("x-a", HeaderValue::from_static("2"));
    let values = header_values(&headers);
    assert!(values.contains(&("idempotency-key".into(), "clé-1".into())), "{values:?}");
    assert_eq!(values.iter().filter(|(n, _)| n == "x-a").count(), 2);
}

#[test]
fn a_control_character_is_found_in_header_values_only() {
    let head = |headers: &[u8], body: &[u8]| {
        [b"POST /orders HTTP/1.1\r\nhost: x\r\n".as_slice(), headers, b"\r\n", body].concat()
    };
    let key = head(b"Idempotency-Key: k\x01\r\n", b"");
    assert_eq!(control_character_in(&key).as_deref(), Some("idempotency-key"));
    let bare_cr = head(b"x-a: 1\r2\r\n", b"");
    assert_eq!(control_character_in(&bare_cr).as_deref(), Some("x-a"));
    let delete = head(b"x-b: \x7f\n", b"");
    assert_eq!(control_character_in(&delete).as_deref(), Some("x-b"));
    for fine in [
        head(b"x-tab: a\tb\r\nidempotency-key: cl\xc3\xa9\r\n", b""),
        head(b"x-a: 1\r\n", b"{\"name\":\"\x01\"}"),
        b"GET /\x01 HTTP/1.1\r\n\r\n".to_vec(),
    ] {
        assert_eq!(control_character_in(&fine), None, "{}", String::from_utf8_lossy(&fine));
    }
}

/// Sends `request` on a connection of its own and reads the whole answer.
async fn exchange(address: std::net::SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    answer
}

#[tokio::test]
async fn a_header_http_does_not_allow_gets_a_clear_400_and_others_get_through() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let server = tokio::spawn(serve(listener, Vec::new()));
    let body = r#"{"a":1}"#;
    let refused = exchange(
        address,
        format!(
            "POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: k\x01\r\n\
                 content-length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await;
    assert!(refused.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{refused}");
    let json: Value = serde_json::from_str(refused.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert!(json["message"].as_str().unwrap().contains("idempotency-key"), "{json}");

    // Anything else is hyper's to serve, one request per connection.
    let passed =
        exchange(address, b"GET /nowhere HTTP/1.1\r\nhost: x\r\nx-tab: a\tb\r\n\r\n").await;
    assert!(passed.starts_with("HTTP/1.1 404 Not Found\r\n"), "{passed}");
    assert!(passed.to_ascii_lowercase().contains("connection: close"), "{passed}");
    assert!(passed.ends_with(r#"{"message":"Not Found"}"#), "{passed}");
    server.abort();
}

#[test]
fn answers_become_responses() {
    let r =
        response(r#"{"statusCode":202,"headers":{"location":"/orders/1"},"body":"{\"ok\":true}"}"#);
    assert_eq!(r.status(), 202);
    assert_eq!(r.headers()["location"], "/orders/1");
    assert_eq!(response("not json").status(), 500);
    assert_eq!(response(r#"{"hello":1}"#).status(), 200);
}

/// As API Gateway does: its own route throttling answers 429 before any function runs, and an
/// invocation Lambda refuses (the account's concurrency used up) answers 500, never retried.
#[tokio::test]
async fn a_throttled_route_answers_429_and_a_throttled_function_500() {
    use crate::emulation::runtime_api::AccountConcurrency;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let mut limited = route("GET", "/limited").await;
    let throttle = Throttle::new(0.001, 1.0);
    assert!(throttle.admit(), "the burst's one token, taken before the request");
    limited.throttle = Some(throttle);
    let mut busy = route("POST", "/orders").await;
    busy.function = busy.function.within(AccountConcurrency::new(0));
    let server = tokio::spawn(serve(listener, vec![limited, busy]));

    let answer = exchange(address, b"GET /limited HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 429 Too Many Requests\r\n"), "{answer}");
    assert!(answer.ends_with(r#"{"message":"Too Many Requests"}"#), "{answer}");
    let answer =
        exchange(address, b"POST /orders HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}").await;
    assert!(answer.starts_with("HTTP/1.1 500 Internal Server Error\r\n"), "{answer}");
    assert!(answer.ends_with(r#"{"message":"Internal Server Error"}"#), "{answer}");
    server.abort();
}
