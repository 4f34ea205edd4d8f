//! The real router, driven request by request with a manual clock: apply, replay, tombstone,
//! no-op undo, permanent refusal by key, lost answer, outage, and the configuration, ledger
//! and statistics endpoints. And the real binary: it prints its address and answers on it.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use sas_remote_sim::{App, FaultConfig, router};
use serde_json::{Value, json};
use tower::ServiceExt;

/// A router whose clock reads the seconds stored in the returned cell.
fn service(config: FaultConfig) -> (Router, Arc<AtomicU64>) {
    let now = Arc::new(AtomicU64::new(0f64.to_bits()));
    let clock = now.clone();
    let app =
        App::with_clock(config, Arc::new(move || f64::from_bits(clock.load(Ordering::SeqCst))));
    (router(app), now)
}

fn set_time(cell: &AtomicU64, seconds: f64) {
    cell.store(seconds.to_bits(), Ordering::SeqCst);
}

struct Reply {
    status: StatusCode,
    replayed: bool,
    body: Value,
}

async fn send(
    app: &Router,
    method: Method,
    uri: &str,
    key: Option<&str>,
    body: Option<Value>,
) -> Reply {
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
    let response = app.clone().oneshot(request.body(body).unwrap()).await.unwrap();
    let status = response.status();
    let replayed = response.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
    let body = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap() };
    Reply { status, replayed, body }
}

/// Calls `action` for step `step` of `order` in `direction`, as an agent would.
async fn call(app: &Router, action: &str, order: &str, step: &str, direction: &str) -> Reply {
    let key = format!("{order}/{step}/{direction}");
    let body = json!({
        "order_id": order,
        "direction": direction,
        "order": {"customer_id": "cust-42", "items": []},
        "input": null,
        "deadline": "ignored: unknown fields are tolerated",
    });
    send(app, Method::POST, &format!("/actions/{action}"), Some(&key), Some(body)).await
}

async fn get(app: &Router, uri: &str) -> Reply {
    send(app, Method::GET, uri, None, None).await
}

async fn put_faults(app: &Router, faults: Value) -> Reply {
    send(app, Method::PUT, "/faults", None, Some(faults)).await
}

#[tokio::test]
async fn a_held_call_takes_effect_at_once_answers_once_its_file_is_gone_and_holds_up_no_other() {
    let dir = std::env::temp_dir().join(format!("remote-sim-hold-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("charge");
    std::fs::write(&file, "").unwrap();
    let faults = json!({"actions": {"charge-payment": {"hold_while": file}}});
    // One call at a time, as in Lambda: the held call gives its turn up.
    let config = FaultConfig::from_json(&faults.to_string()).unwrap();
    let app = router(App::new(config).serving_at_once(1));

    let held = tokio::spawn({
        let app = app.clone();
        async move { call(&app, "charge-payment", "o1", "charge", "do").await }
    });
    let marker = dir.join("charge.held");
    while !marker.exists() {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "o1/charge/do");
    // On the wire: the effect is in place, and the answer waits.
    let ledger = get(&app, "/ledger").await.body;
    assert_eq!(ledger["effects"][0]["key"], "o1/charge/do", "{ledger}");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(!held.is_finished(), "the call answered while held");
    // Another action is not held, nor are the statistics.
    assert_eq!(call(&app, "ship", "o1", "ship", "do").await.status, StatusCode::OK);
    assert_eq!(get(&app, "/stats").await.status, StatusCode::OK);

    std::fs::remove_file(&file).unwrap();
    let answer = held.await.unwrap();
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.body, json!({"ref": "charge-payment-1"}));
    assert!(!marker.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn the_router_serves_the_ledger_semantics_and_the_faults() {
    let (app, now) = service(FaultConfig::default());
    assert_eq!(get(&app, "/health").await.status, StatusCode::OK);

    // Apply, then replay with the recorded output.
    let first = call(&app, "reserve-inventory", "o1", "reserve", "do").await;
    assert_eq!((first.status, first.replayed), (StatusCode::OK, false));
    assert_eq!(first.body, json!({"ref": "reserve-inventory-1"}));
    let again = call(&app, "reserve-inventory", "o1", "reserve", "do").await;
    assert_eq!((again.status, again.replayed), (StatusCode::OK, true));
    assert_eq!(again.body, first.body);

    // A real undo, then the late do is tombstoned.
    let undo = call(&app, "release-inventory", "o1", "reserve", "undo").await;
    assert_eq!(undo.body, json!({"ref": "release-inventory-2"}));
    let late = call(&app, "reserve-inventory", "o1", "reserve", "do").await;
    assert_eq!(late.status, StatusCode::CONFLICT);
    assert_eq!(late.body["permanent"], json!(true));

    // An undo of something never done is a recorded no-op, and tombstones its step.
    let noop = call(&app, "refund-payment", "o2", "charge", "undo").await;
    assert_eq!(noop.status, StatusCode::OK);
    assert_eq!(noop.body, json!({"ref": "refund-payment-3", "noop": true}));
    assert_eq!(
        call(&app, "charge-payment", "o2", "charge", "do").await.status,
        StatusCode::CONFLICT
    );

    // Permanent refusal by key: every retry of the key gets it, nothing is applied, and the
    // undo of the refused step is a no-op.
    let faults = json!({"actions": {"charge-payment": {"permanent_rate": 1.0, "seed": 5}}});
    let put = put_faults(&app, faults.clone()).await;
    assert_eq!(
        (put.status, put.body.clone()),
        (StatusCode::OK, json!({"default": default_faults(), "actions": faults["actions"]}))
    );
    assert_eq!(get(&app, "/faults").await.body, put.body);
    for _ in 0..2 {
        let refused = call(&app, "charge-payment", "o3", "charge", "do").await;
        assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(refused.body["permanent"], json!(true));
        assert!(refused.body["error"].as_str().unwrap().contains("charge-payment"));
    }
    let refund = call(&app, "refund-payment", "o3", "charge", "undo").await;
    assert_eq!(refund.body["noop"], json!(true));
    // Other actions are untouched by the override.
    assert_eq!(call(&app, "ship", "o3", "ship", "do").await.status, StatusCode::OK);

    // A lost answer: 503, yet the effect is in the ledger and the retry gets its output.
    put_faults(&app, json!({"default": {"lost_answer_rate": 1.0}})).await;
    let lost = call(&app, "ship", "o4", "ship", "do").await;
    assert_eq!(lost.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(lost.body, json!({"error": "answer lost"}));
    let entry = get(&app, "/ledger/o4%2Fship%2Fdo").await;
    assert_eq!(entry.status, StatusCode::OK);
    let output = entry.body["output"].clone();
    put_faults(&app, json!({})).await;
    let retry = call(&app, "ship", "o4", "ship", "do").await;
    assert_eq!((retry.status, retry.replayed, retry.body), (StatusCode::OK, true, output));

    // An outage window: 503 inside, nothing applied; served again after it.
    put_faults(&app, json!({"default": {"outages": [{"start_s": 100.0, "end_s": 200.0}]}})).await;
    set_time(&now, 150.0);
    let down = call(&app, "charge-payment", "o5", "charge", "do").await;
    assert_eq!(
        (down.status, down.body),
        (StatusCode::SERVICE_UNAVAILABLE, json!({"error": "outage"}))
    );
    let absent = get(&app, "/ledger/o5/charge/do").await;
    assert_eq!(absent.status, StatusCode::NOT_FOUND);
    assert_eq!(absent.body["calls"], json!(1));
    set_time(&now, 200.0);
    assert_eq!(call(&app, "charge-payment", "o5", "charge", "do").await.status, StatusCode::OK);

    // Transient faults and throttling.
    put_faults(&app, json!({"default": {"transient_rate": 1.0}})).await;
    let flaky = call(&app, "ship", "o6", "ship", "do").await;
    assert_eq!(
        (flaky.status, flaky.body),
        (StatusCode::SERVICE_UNAVAILABLE, json!({"error": "unavailable"}))
    );
    put_faults(&app, json!({"default": {"throttle_rate": 1.0}})).await;
    assert_eq!(call(&app, "ship", "o6", "ship", "do").await.status, StatusCode::TOO_MANY_REQUESTS);
    put_faults(&app, json!({})).await;

    // The ledger: every effect once, in order, with its calls.
    let ledger = get(&app, "/ledger").await.body;
    assert_eq!(ledger["max_applications"], json!(1));
    let keys: Vec<&str> =
        ledger["effects"].as_array().unwrap().iter().map(|e| e["key"].as_str().unwrap()).collect();
    assert_eq!(
        keys,
        [
            "o1/reserve/do",
            "o1/reserve/undo",
            "o2/charge/undo",
            "o3/charge/undo",
            "o3/ship/do",
            "o4/ship/do",
            "o5/charge/do"
        ]
    );
    let first_effect = &ledger["effects"][0];
    assert_eq!(first_effect["order_id"], json!("o1"));
    assert_eq!(first_effect["action"], json!("reserve-inventory"));
    assert_eq!(first_effect["direction"], json!("do"));
    assert_eq!(first_effect["applications"], json!(1));
    assert_eq!(first_effect["calls"], json!(3));
    // When each took effect, in seconds since the service started, as its clock says.
    let times: Vec<f64> =
        ledger["effects"].as_array().unwrap().iter().map(|e| e["at_s"].as_f64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    assert!(ledger["started_at_ms"].as_u64().is_some(), "{ledger}");

    // The statistics count every call by outcome.
    let stats = get(&app, "/stats").await.body;
    let expected = json!({
        "total": 16, "ok": 6, "replayed": 2, "permanent": 2, "transient": 1, "throttled": 1,
        "lost_answer": 1, "outage": 1, "tombstoned": 2,
    });
    for (name, count) in expected.as_object().unwrap() {
        assert_eq!(&stats[name], count, "{name}: {stats}");
    }
    assert_eq!(stats["actions"]["charge-payment"]["permanent"], json!(2));
    assert_eq!((&stats["effects"], &stats["max_applications"]), (&json!(7), &json!(1)));
    // Second 0 held every call but the four made in the outage and after it.
    assert_eq!(stats["busiest_second"], json!(12), "{stats}");

    // A rate limit: the call beyond it is throttled, and told when to come back.
    put_faults(&app, json!({"actions": {"ship": {"max_per_second": 1}}})).await;
    set_time(&now, 5.0);
    assert_eq!(call(&app, "ship", "o6", "ship", "do").await.status, StatusCode::OK);
    let request = Request::builder()
        .method(Method::POST)
        .uri("/actions/ship")
        .header("Idempotency-Key", "o7/ship/do")
        .body(Body::from(json!({"order_id": "o7", "direction": "do"}).to_string()))
        .unwrap();
    let limited = app.clone().oneshot(request).await.unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.headers()["retry-after"], "1");
    set_time(&now, 6.0);
    assert_eq!(call(&app, "ship", "o7", "ship", "do").await.status, StatusCode::OK);

    // Reset empties the ledger and the stats, and references start again.
    assert_eq!(send(&app, Method::POST, "/reset", None, None).await.status, StatusCode::OK);
    let emptied = get(&app, "/ledger").await.body;
    assert_eq!((&emptied["effects"], &emptied["max_applications"]), (&json!([]), &json!(0)));
    assert_eq!(get(&app, "/stats").await.body["total"], json!(0));
    assert_eq!(get(&app, "/stats").await.body["busiest_second"], json!(0));
    let fresh = call(&app, "reserve-inventory", "o1", "reserve", "do").await;
    assert_eq!(fresh.body, json!({"ref": "reserve-inventory-1"}));
}

fn default_faults() -> Value {
    json!({
        "latency_ms": 0, "latency_jitter_ms": 0, "transient_rate": 0.0, "throttle_rate": 0.0,
        "permanent_rate": 0.0, "permanent_undo": false, "lost_answer_rate": 0.0, "outages": [],
        "seed": 0, "forget_keys": false,
    })
}

#[tokio::test]
async fn bad_requests_are_refused_with_json_errors() {
    let (app, _) = service(FaultConfig::default());
    let body = json!({"order_id": "o1", "direction": "do"});
    let no_key = send(&app, Method::POST, "/actions/ship", None, Some(body.clone())).await;
    assert_eq!(no_key.status, StatusCode::BAD_REQUEST);
    assert!(no_key.body["error"].as_str().unwrap().contains("Idempotency-Key"));
    let empty_key = send(&app, Method::POST, "/actions/ship", Some(""), Some(body)).await;
    assert_eq!(empty_key.status, StatusCode::BAD_REQUEST);
    for bad in
        [json!({"order_id": "o1"}), json!({"order_id": "o1", "direction": "sideways"}), json!([1])]
    {
        let reply = send(&app, Method::POST, "/actions/ship", Some("o1/ship/do"), Some(bad)).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST);
        assert!(reply.body["error"].is_string());
    }
    let bad_faults = put_faults(&app, json!({"default": {"transient_rate": 3}})).await;
    assert_eq!(bad_faults.status, StatusCode::BAD_REQUEST);
    assert_eq!(get(&app, "/faults").await.body["default"]["transient_rate"], json!(0.0));
    assert_eq!(get(&app, "/nowhere").await.status, StatusCode::NOT_FOUND);
    // Nothing of it reached the ledger or the statistics.
    assert_eq!(get(&app, "/stats").await.body["total"], json!(0));
    assert_eq!(get(&app, "/stats").await.body["busiest_second"], json!(0));
}

/// Reads one HTTP/1.1 response to a request sent on a fresh connection.
fn http_get(addr: &str, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// The binary under test, killed when the test ends, even by a failed assertion.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_binary_prints_its_address_and_serves_on_it() {
    let mut child = Running(
        Command::new(env!("CARGO_BIN_EXE_remote-sim"))
            .args(["--listen", "127.0.0.1:0", "--faults", r#"{"default": {"seed": 9}}"#])
            .env_remove("AWS_LAMBDA_RUNTIME_API")
            .env_remove("FAULTS")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("listening on http://").unwrap();
    let health = http_get(addr, "/health");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let faults = http_get(addr, "/faults");
    assert!(faults.contains(r#""seed":9"#), "{faults}");
}

#[test]
fn the_binary_refuses_a_bad_configuration() {
    let output = Command::new(env!("CARGO_BIN_EXE_remote-sim"))
        .args(["--listen", "127.0.0.1:0"])
        .env_remove("AWS_LAMBDA_RUNTIME_API")
        .env("FAULTS", r#"{"default": {"transient_rate": 2}}"#)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(output.stdout.is_empty());
    assert!(String::from_utf8_lossy(&output.stderr).contains("transient_rate"));
}
