//! Bad input, table by table, through the real handlers on a moto server: every malformed API
//! request gets its status, error code and field, and writes nothing; every malformed queue
//! message is reported failed (so SQS moves it to the dead-letter queue) while the rest of its
//! batch is handled.

#![allow(clippy::unwrap_used)]

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use sas_engine::OrderId;
use sas_engine::state::ProcessState;
use sas_tests::stack::{System, order_json};
use serde_json::{Value, json};

/// One API request and what it must get back.
struct Request {
    name: &'static str,
    key: Option<Vec<u8>>,
    content_type: Option<&'static str>,
    body: Vec<u8>,
}

/// The expected answer: status, error code and the field named first (none for a 202). An order's
/// fields are named by JSON pointer, as the schema validator reports them: `/items/0/quantity`,
/// and the empty pointer for the whole input.
type Expected = (u16, &'static str, Option<&'static str>);

fn valid_order() -> Value {
    serde_json::from_str(&order_json("c-bad")).unwrap()
}

/// The valid order with one change.
fn edited(edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let mut order = valid_order();
    edit(&mut order);
    order.to_string().into_bytes()
}

fn request(name: &'static str, body: Vec<u8>) -> Request {
    Request {
        name,
        key: Some(name.as_bytes().to_vec()),
        content_type: Some("application/json"),
        body,
    }
}

impl Request {
    fn key(mut self, key: Option<&[u8]>) -> Self {
        self.key = key.map(<[u8]>::to_vec);
        self
    }

    fn content_type(mut self, content_type: Option<&'static str>) -> Self {
        self.content_type = content_type;
        self
    }
}

fn line_items(n: usize, quantity: i64, unit_price: i64) -> Value {
    (0..n)
        .map(|i| json!({"sku": format!("SKU-{i}"), "quantity": quantity, "unit_price": unit_price}))
        .collect()
}

fn api_cases() -> Vec<(Request, Expected)> {
    let valid = valid_order().to_string().into_bytes();
    let bad = |code, field| (400, code, Some(field));
    let invalid = |field| (400, "invalid_order", Some(field));
    // A body that does not decode is named as a whole: the empty pointer.
    let malformed = bad("malformed_json", "");
    let accepted = (202, "", None);
    let mut nested = "[".repeat(10_000);
    nested.push_str(&"]".repeat(10_000));
    let mut padded = valid.clone();
    padded.resize(sas_submission::MAX_BODY_BYTES, b' ');
    let mut oversized = valid.clone();
    oversized.resize(sas_submission::MAX_BODY_BYTES + 1, b' ');
    let mut with_bom = b"\xEF\xBB\xBF".to_vec();
    with_bom.extend_from_slice(&valid);
    let mut not_utf8 = order_json("c-bad").replace("Ada Lovelace", "Ada \u{1}").into_bytes();
    let at = not_utf8.iter().position(|&b| b == 1).unwrap();
    not_utf8[at] = 0xFF;
    let long_key = "k".repeat(128);
    let too_long_key = "k".repeat(129);

    vec![
        // Not JSON, or not one JSON object.
        (request("malformed", b"{not json".to_vec()), malformed),
        (request("empty-body", Vec::new()), malformed),
        (request("truncated", valid[..valid.len() / 2].to_vec()), malformed),
        (request("trailing-garbage", [&valid[..], b"x"].concat()), malformed),
        (request("two-objects", [&valid[..], &valid[..]].concat()), malformed),
        (request("byte-order-mark", with_bom), malformed),
        (request("not-utf8", not_utf8), malformed),
        (
            request("lone-surrogate", order_json("c").replace("Ada", "Ada \\ud800").into_bytes()),
            malformed,
        ),
        (
            request("deeply-nested", format!(r#"{{"customer_id": {nested}}}"#).into_bytes()),
            // The decoder gives up at its recursion limit, before any schema is consulted: the
            // body cannot be read, so it is named as a whole.
            malformed,
        ),
        // Valid JSON but not an object: the schema's `type` fails at the root.
        (request("null", b"null".to_vec()), invalid("")),
        (request("array", b"[]".to_vec()), invalid("")),
        (request("string", br#""an order""#.to_vec()), invalid("")),
        // Wrong types.
        (
            request("customer-number", edited(|o| o["customer_id"] = json!(5))),
            invalid("/customer_id"),
        ),
        (request("items-object", edited(|o| o["items"] = json!({"sku": "A"}))), invalid("/items")),
        (
            request("quantity-string", edited(|o| o["items"][0]["quantity"] = json!("2"))),
            invalid("/items/0/quantity"),
        ),
        (
            request("quantity-fraction", edited(|o| o["items"][0]["quantity"] = json!(1.5))),
            invalid("/items/0/quantity"),
        ),
        (
            request(
                "price-exponent",
                order_json("c")
                    .replace("\"unit_price\":1250", "\"unit_price\":1.25e3")
                    .into_bytes(),
            ),
            // JSON Schema's `integer` is any number whose fraction is zero, however it is
            // written: 1.25e3 is the integer 1250, within range.
            accepted,
        ),
        (
            request(
                "quantity-overflow",
                order_json("c")
                    .replace("\"quantity\":2", "\"quantity\":9223372036854775808")
                    .into_bytes(),
            ),
            invalid("/items/0/quantity"),
        ),
        (request("ship-to-string", edited(|o| o["ship_to"] = json!("Paris"))), invalid("/ship_to")),
        (request("currency-null", edited(|o| o["currency"] = Value::Null)), invalid("/currency")),
        (
            request("line2-number", edited(|o| o["ship_to"]["line2"] = json!(12))),
            invalid("/ship_to/line2"),
        ),
        // Refused, where it was once taken as absent: under JSON Schema null is a value, not
        // absence, and line2 is a string (as the OpenAPI document also says). Omit it instead.
        (
            request("line2-null", edited(|o| o["ship_to"]["line2"] = Value::Null)),
            invalid("/ship_to/line2"),
        ),
        (
            request(
                "duplicate-key",
                order_json("c").replacen('{', r#"{"customer_id":"someone","#, 1).into_bytes(),
            ),
            // A body two parsers may read differently (the first value, or the last) is refused
            // as a whole, while it is decoded.
            malformed,
        ),
        // Missing and unknown fields.
        (
            request(
                "missing-currency",
                edited(|o| drop(o.as_object_mut().unwrap().remove("currency"))),
            ),
            // `required` fails at the object that lacks the property; the reason names it.
            invalid(""),
        ),
        (
            request(
                "missing-city",
                edited(|o| drop(o["ship_to"].as_object_mut().unwrap().remove("city"))),
            ),
            invalid("/ship_to"),
        ),
        (
            request(
                "missing-sku",
                edited(|o| drop(o["items"][0].as_object_mut().unwrap().remove("sku"))),
            ),
            invalid("/items/0"),
        ),
        // Likewise `additionalProperties` fails at the object holding the unknown property, not
        // at a pointer to a property the schema does not have; the reason names it.
        (request("unknown-field", edited(|o| o["coupon"] = json!("FREE"))), invalid("")),
        (
            request("unknown-item-field", edited(|o| o["items"][0]["discount"] = json!(5))),
            invalid("/items/0"),
        ),
        (
            request("unknown-address-field", edited(|o| o["ship_to"]["phone"] = json!("+33"))),
            invalid("/ship_to"),
        ),
        // Out of range: quantities, amounts, sizes.
        (
            request("quantity-zero", edited(|o| o["items"][0]["quantity"] = json!(0))),
            invalid("/items/0/quantity"),
        ),
        (
            request("quantity-negative", edited(|o| o["items"][0]["quantity"] = json!(-2))),
            invalid("/items/0/quantity"),
        ),
        (
            request("quantity-absurd", edited(|o| o["items"][0]["quantity"] = json!(1_001))),
            invalid("/items/0/quantity"),
        ),
        (
            request("price-zero", edited(|o| o["items"][0]["unit_price"] = json!(0))),
            invalid("/items/0/unit_price"),
        ),
        (
            request("price-negative", edited(|o| o["items"][0]["unit_price"] = json!(-1))),
            invalid("/items/0/unit_price"),
        ),
        (
            request("price-absurd", edited(|o| o["items"][0]["unit_price"] = json!(100_000_001))),
            invalid("/items/0/unit_price"),
        ),
        (
            request("total-absurd", edited(|o| o["items"] = line_items(10, 1_000, 100_000_000))),
            // Every line is within its limits, and the schema sets none on the total (a sum is
            // beyond JSON Schema): 10^12 minor units are accepted.
            accepted,
        ),
        (request("no-items", edited(|o| o["items"] = json!([]))), invalid("/items")),
        (
            request("too-many-items", edited(|o| o["items"] = line_items(51, 1, 1))),
            invalid("/items"),
        ),
        (
            request(
                "duplicate-sku",
                edited(|o| {
                    o["items"] = json!([{"sku": "A", "quantity": 1, "unit_price": 1},
                                        {"sku": "A", "quantity": 2, "unit_price": 1}]);
                }),
            ),
            // The schema has no rule across items (`uniqueItems` would compare whole items, and
            // these differ anyway): two lines of one SKU are a valid order under it.
            accepted,
        ),
        (
            request("currency-lowercase", edited(|o| o["currency"] = json!("eur"))),
            invalid("/currency"),
        ),
        (
            request("country-alpha3", edited(|o| o["ship_to"]["country"] = json!("FRA"))),
            invalid("/ship_to/country"),
        ),
        (
            request("customer-space", edited(|o| o["customer_id"] = json!("c 1"))),
            invalid("/customer_id"),
        ),
        (
            request("customer-too-long", edited(|o| o["customer_id"] = json!("c".repeat(65)))),
            invalid("/customer_id"),
        ),
        (
            request(
                "postal-code-too-long",
                edited(|o| o["ship_to"]["postal_code"] = json!("1".repeat(17))),
            ),
            invalid("/ship_to/postal_code"),
        ),
        // Unicode edge cases.
        (
            request("currency-fullwidth", edited(|o| o["currency"] = json!("ＥＵＲ"))),
            invalid("/currency"),
        ),
        (
            request(
                "name-direction-override",
                edited(|o| o["ship_to"]["name"] = json!("Ada \u{202E}ecalevol")),
            ),
            // Schema defect (reported): text100's one required non-blank character is `\S`,
            // which also matches a single control or direction character; the OpenAPI
            // document's pattern excludes them there too.
            invalid("/ship_to/name"),
        ),
        (
            request("name-nul", edited(|o| o["ship_to"]["name"] = json!("Ada\u{0}"))),
            // The same defect: the NUL is the `\S`.
            invalid("/ship_to/name"),
        ),
        (
            request("name-blank", edited(|o| o["ship_to"]["name"] = json!(" \t "))),
            invalid("/ship_to/name"),
        ),
        (
            request(
                "name-101-characters",
                edited(|o| o["ship_to"]["name"] = json!("é".repeat(101))),
            ),
            invalid("/ship_to/name"),
        ),
        (
            request("customer-non-ascii", edited(|o| o["customer_id"] = json!("clïent"))),
            invalid("/customer_id"),
        ),
        (
            request("sku-emoji", edited(|o| o["items"][0]["sku"] = json!("BOOK-📚"))),
            invalid("/items/0/sku"),
        ),
        // The idempotency key.
        (
            request("missing-key", valid.clone()).key(None),
            bad("missing_idempotency_key", "Idempotency-Key"),
        ),
        (
            request("empty-key", valid.clone()).key(Some(b"")),
            bad("invalid_idempotency_key", "Idempotency-Key"),
        ),
        (
            request("key-with-space", valid.clone()).key(Some(b"order 1")),
            bad("invalid_idempotency_key", "Idempotency-Key"),
        ),
        (
            request("key-with-slash", valid.clone()).key(Some(b"order/1")),
            bad("invalid_idempotency_key", "Idempotency-Key"),
        ),
        (
            request("key-too-long", valid.clone()).key(Some(too_long_key.as_bytes())),
            bad("invalid_idempotency_key", "Idempotency-Key"),
        ),
        (
            request("key-non-ascii", valid.clone()).key(Some("clé".as_bytes())),
            bad("invalid_idempotency_key", "Idempotency-Key"),
        ),
        // The content type and the size.
        (
            request("no-content-type", valid.clone()).content_type(None),
            (415, "unsupported_media_type", None),
        ),
        (
            request("text-plain", valid.clone()).content_type(Some("text/plain")),
            (415, "unsupported_media_type", None),
        ),
        (
            request("json-like", valid.clone()).content_type(Some("application/jsonp")),
            (415, "unsupported_media_type", None),
        ),
        (
            request("form", valid.clone()).content_type(Some("application/x-www-form-urlencoded")),
            (415, "unsupported_media_type", None),
        ),
        (request("oversized", oversized), (413, "payload_too_large", None)),
        (request("a-megabyte", vec![b' '; 1024 * 1024]), (413, "payload_too_large", None)),
        // At the edges, and accepted.
        (
            request("charset-parameter", valid.clone())
                .content_type(Some("application/json; charset=utf-8")),
            accepted,
        ),
        (
            request("content-type-case", valid.clone()).content_type(Some("Application/JSON")),
            accepted,
        ),
        (request("exactly-the-size-limit", padded), accepted),
        (request("key-of-128", valid.clone()).key(Some(long_key.as_bytes())), accepted),
        (request("key-punctuation", valid.clone()).key(Some(b"A-z_0.9:x")), accepted),
        (
            request(
                "unicode-text",
                edited(|o| {
                    o["ship_to"]["name"] = json!("Zoë Ådne 🚀");
                    o["ship_to"]["city"] = json!("東京");
                }),
            ),
            accepted,
        ),
        (
            request(
                "name-100-characters",
                edited(|o| o["ship_to"]["name"] = json!("é".repeat(100))),
            ),
            accepted,
        ),
        (
            request("total-at-limit", edited(|o| o["items"] = line_items(1, 1_000, 1_000_000))),
            accepted,
        ),
        (request("line2-blank", edited(|o| o["ship_to"]["line2"] = json!("  "))), accepted),
    ]
}

#[tokio::test]
async fn every_malformed_request_gets_its_error_and_writes_nothing() {
    let s = System::start("bad-requests", "{}").await;
    let mut accepted = 0;
    let mut failures = Vec::new();
    for (r, (status, code, field)) in api_cases() {
        let (got, answer) = s.post_bytes(r.key.as_deref(), r.content_type, r.body).await;
        let got_code = answer["error"]["code"].as_str().unwrap_or_default();
        let got_field = answer["error"]["fields"][0]["field"].as_str();
        if (got, got_code, got_field) != (status, code, field) {
            failures.push(format!(
                "{}: expected {status} {code} {field:?}, got {got} {got_code} {got_field:?}: {answer}",
                r.name
            ));
        }
        if got == 202 {
            accepted += 1;
        } else {
            assert!(answer["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{answer}");
        }
        let counts = (s.t.count("OrdersTable").await, s.t.count("StateTable").await);
        assert_eq!(counts, (0, accepted), "{}: a rejection wrote something", r.name);
    }
    assert!(failures.is_empty(), "{} cases failed:\n{}", failures.len(), failures.join("\n"));

    let never_submitted = OrderId::for_key(&sas_engine::IdempotencyKey::parse("never").unwrap());
    for (id, status, code) in [
        ("not-a-uuid".to_owned(), 400, "invalid_order_id"),
        ("".to_owned(), 400, "invalid_order_id"),
        (format!("{never_submitted}x"), 400, "invalid_order_id"),
        (never_submitted.to_string(), 404, "not_found"),
    ] {
        let (got, answer) = s.get(&id).await;
        assert_eq!(
            (got, answer["error"]["code"].as_str().unwrap_or_default()),
            (status, code),
            "GET {id:?}: {answer}"
        );
        // Exactly what the OpenAPI document allows: a code and a message, nothing else.
        let keys: Vec<&String> =
            answer["error"].as_object().map(|e| e.keys().collect()).unwrap_or_default();
        assert_eq!(keys, ["code", "message"], "GET {id:?}: {answer}");
    }
    // Only the accepted orders were started.
    s.settle().await;
    assert_eq!(s.t.count("StateTable").await, accepted);
}

/// A batch as the event source mapping hands it over: (message id, body) pairs.
fn batch(messages: &[(String, String)]) -> SqsEvent {
    let mut event = SqsEvent::default();
    for (id, body) in messages {
        let mut m = SqsMessage::default();
        m.message_id = Some(id.clone());
        m.body = Some(body.clone());
        event.records.push(m);
    }
    event
}

/// Submits an order and takes its start message off the scheduler queue.
async fn submitted(s: &System, key: &str) -> (OrderId, String) {
    let (status, answer) = s.post(Some(key), "application/json", &order_json("c-q")).await;
    assert_eq!(status, 202, "{answer}");
    let id: OrderId = answer["order_id"].as_str().unwrap().parse().unwrap();
    let start = s.t.receive("SchedulerQueue", 0).await;
    assert_eq!(start.len(), 1);
    s.t.delete("SchedulerQueue", start[0].receipt_handle().unwrap()).await;
    (id, start[0].body().unwrap().to_owned())
}

fn scheduler_poison(processing: OrderId, attempt: u64) -> Vec<(&'static str, String)> {
    let nobody = OrderId::for_key(&sas_engine::IdempotencyKey::parse("nobody").unwrap());
    let start = |v: Value| v.to_string();
    let reply = |step: Value, outcome: Value| {
        json!({"v": 1, "type": "reply", "order_id": processing, "attempt": attempt,
               "correlation_id": "c", "step": step, "complete_by": 0,
               "idempotency_key": "k", "outcome": outcome})
        .to_string()
    };
    let done = json!({"status": "done", "output": {}});
    vec![
        ("empty", String::new()),
        ("not-json", "not an envelope".into()),
        ("array", "[1, 2]".into()),
        (
            "no-version",
            start(
                json!({"type": "start", "order_id": nobody, "attempt": 0, "correlation_id": "c"}),
            ),
        ),
        (
            "version-2",
            start(
                json!({"v": 2, "type": "start", "order_id": nobody, "attempt": 0, "correlation_id": "c"}),
            ),
        ),
        (
            "version-string",
            start(
                json!({"v": "1", "type": "start", "order_id": nobody, "attempt": 0, "correlation_id": "c"}),
            ),
        ),
        (
            "no-type",
            start(json!({"v": 1, "order_id": nobody, "attempt": 0, "correlation_id": "c"})),
        ),
        ("unknown-type", start(json!({"v": 1, "type": "cancel", "order_id": nobody}))),
        (
            "no-order-id",
            start(json!({"v": 1, "type": "start", "attempt": 0, "correlation_id": "c"})),
        ),
        (
            "bad-order-id",
            start(
                json!({"v": 1, "type": "start", "order_id": "123", "attempt": 0, "correlation_id": "c"}),
            ),
        ),
        (
            "negative-attempt",
            start(
                json!({"v": 1, "type": "start", "order_id": nobody, "attempt": -1, "correlation_id": "c"}),
            ),
        ),
        (
            "unknown-order",
            start(
                json!({"v": 1, "type": "start", "order_id": nobody, "attempt": 0, "correlation_id": "c"}),
            ),
        ),
        (
            "request-on-scheduler-queue",
            start(json!({"v": 1, "type": "request", "order_id": nobody, "attempt": 1,
            "correlation_id": "c", "step": {"index": 0, "name": "reserve-inventory", "direction": "do"},
            "action": "reserve-inventory", "complete_by": 0, "idempotency_key": "k",
            "order": serde_json::from_str::<Value>(&order_json("c")).unwrap()})),
        ),
        (
            "unknown-outcome",
            reply(
                json!({"index": 0, "name": "reserve-inventory", "direction": "do"}),
                json!({"status": "maybe"}),
            ),
        ),
        (
            "bad-direction",
            reply(
                json!({"index": 0, "name": "reserve-inventory", "direction": "sideways"}),
                done.clone(),
            ),
        ),
        ("wrong-step", reply(json!({"index": 2, "name": "ship", "direction": "do"}), done.clone())),
        (
            "wrong-direction",
            reply(json!({"index": 0, "name": "reserve-inventory", "direction": "undo"}), done),
        ),
    ]
}

#[tokio::test]
async fn malformed_scheduler_messages_fail_alone_and_change_nothing() {
    let s = System::start("bad-scheduler-messages", "{}").await;
    // An order holding a lease on its first step, for replies that contradict it.
    let (processing, start) = submitted(&s, "processing").await;
    let claimed = s.handle_batch("SchedulerQueue", batch(&[("m-0".into(), start)])).await;
    assert!(claimed.batch_item_failures.is_empty());
    let before = s.state(processing).await;
    assert_eq!(before.process_state, ProcessState::Processing);
    s.t.drain_raw("inventoryQueue").await;

    let poison = scheduler_poison(processing, before.attempt);
    // Batches of ten, as the mapping delivers them: nine poison messages and one good start.
    for (n, chunk) in poison.chunks(9).enumerate() {
        let (good, start) = submitted(&s, &format!("beside-poison-{n}")).await;
        let mut messages: Vec<(String, String)> =
            chunk.iter().map(|(name, body)| ((*name).to_owned(), body.clone())).collect();
        messages.push(("good".into(), start));
        let response = s.handle_batch("SchedulerQueue", batch(&messages)).await;
        let mut failed: Vec<&str> =
            response.batch_item_failures.iter().map(|f| f.item_identifier.as_str()).collect();
        failed.sort_unstable();
        let mut expected: Vec<&str> = chunk.iter().map(|(name, _)| *name).collect();
        expected.sort_unstable();
        assert_eq!(failed, expected, "exactly the poison messages fail");
        assert_eq!(s.state(good).await.process_state, ProcessState::Processing);
        // The good start dispatched its one request; the poison nothing.
        let requests = s.t.drain_raw("inventoryQueue").await;
        assert_eq!(requests.len(), 1, "{requests:?}");
        assert!(requests[0].contains(&good.to_string()));
    }
    assert_eq!(s.state(processing).await, before, "the contradicting replies changed the order");
    assert_eq!(s.t.count("StateTable").await, 1 + poison.len().div_ceil(9) as i32);
    assert!(s.t.drain_raw("ReplyQueue").await.is_empty());
}

#[tokio::test]
async fn malformed_agent_messages_fail_alone_and_call_nothing() {
    let s = System::start("bad-agent-messages", "{}").await;
    let (id, start) = submitted(&s, "agent-beside-poison").await;
    s.handle_batch("SchedulerQueue", batch(&[("m-0".into(), start.clone())])).await;
    let request = s.t.receive("inventoryQueue", 0).await;
    s.t.delete("inventoryQueue", request[0].receipt_handle().unwrap()).await;
    let request: Value = serde_json::from_str(request[0].body().unwrap()).unwrap();
    let without = |field: &str| {
        let mut r = request.clone();
        r.as_object_mut().unwrap().remove(field);
        r.to_string()
    };
    let poison: Vec<(&str, String)> = vec![
        ("not-json", "{".into()),
        ("start-on-agent-queue", start),
        ("reply-on-agent-queue", {
            let mut r = request.clone();
            r["type"] = json!("reply");
            r["outcome"] = json!({"status": "done", "output": {}});
            r.to_string()
        }),
        ("no-order", without("order")),
        ("no-idempotency-key", without("idempotency_key")),
        ("no-complete-by", without("complete_by")),
        ("version-2", {
            let mut r = request.clone();
            r["v"] = json!(2);
            r.to_string()
        }),
    ];
    let mut messages: Vec<(String, String)> =
        poison.iter().map(|(name, body)| ((*name).to_owned(), body.clone())).collect();
    messages.push(("good".into(), request.to_string()));
    let response = s.handle_batch("inventoryQueue", batch(&messages)).await;
    let mut failed: Vec<&str> =
        response.batch_item_failures.iter().map(|f| f.item_identifier.as_str()).collect();
    failed.sort_unstable();
    let mut expected: Vec<&str> = poison.iter().map(|(name, _)| *name).collect();
    expected.sort_unstable();
    assert_eq!(failed, expected, "exactly the poison messages fail");
    // One call, one effect, one reply: the good request's.
    let ledger = s.remote.ledger().await;
    assert_eq!(ledger["effects"].as_array().unwrap().len(), 1, "{ledger}");
    let replies = s.t.drain_raw("ReplyQueue").await;
    assert_eq!(replies.len(), 1);
    assert!(replies[0].contains(&id.to_string()));
}

#[tokio::test]
async fn every_poison_message_ends_in_its_dead_letter_queue() {
    let s = System::start("poison-to-dlq", "{}").await;
    let nobody = OrderId::for_key(&sas_engine::IdempotencyKey::parse("nobody").unwrap());
    // SQS refuses empty bodies, so the empty case cannot be sent.
    let poison: Vec<String> = scheduler_poison(nobody, 1)
        .into_iter()
        .map(|(_, body)| body)
        .filter(|b| !b.is_empty())
        .collect();
    for body in &poison {
        s.t.send_raw("SchedulerQueue", body).await;
    }
    s.t.send_raw("inventoryQueue", "not a request").await;
    let (_, body) =
        s.post(Some("order-among-poison"), "application/json", &order_json("c-9")).await;
    let id: OrderId = body["order_id"].as_str().unwrap().parse().unwrap();
    s.fast_redelivery.store(true, std::sync::atomic::Ordering::Relaxed);
    s.settle().await;
    assert_eq!(s.state(id).await.process_state, ProcessState::Processed);
    let mut dead = s.t.drain_raw("SchedulerDeadLetterQueue").await;
    dead.sort();
    let mut expected = poison.clone();
    expected.sort();
    assert_eq!(dead, expected);
    assert_eq!(s.t.drain_raw("inventoryDeadLetterQueue").await, ["not a request"]);
}
