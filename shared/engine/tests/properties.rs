//! Property tests of everything that reads outside input: the order validator, the idempotency
//! key, the message decoders, and the state machine on records read back from storage. Whatever
//! the bytes, these return a typed error and never panic; what they accept keeps its limits and
//! survives a round trip.
//!
//! `PROPTEST_CASES=n` sets the cases per property (256 by default).

#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use sas_engine::Timestamp;
use sas_engine::config::EngineConfig;
use sas_engine::ids::{IdempotencyKey, OrderId};
use sas_engine::machine::{Ctx, Decision, Illegal, Input, decide};
use sas_engine::message::{Message, StepOutcome, StepRef};
use sas_engine::order::{MAX_ITEMS, MAX_QUANTITY, MAX_TOTAL, MAX_UNIT_PRICE, Order};
use sas_engine::state::{CommandKind, StateRecord};
use sas_engine::workflow::Workflow;
use serde_json::{Value, json};

/// Field names the decoders know, so that generated objects often get past the first check.
const KEYS: &[&str] = &[
    "customer_id",
    "currency",
    "items",
    "ship_to",
    "sku",
    "quantity",
    "unit_price",
    "name",
    "line1",
    "line2",
    "city",
    "postal_code",
    "country",
    "v",
    "type",
    "order_id",
    "attempt",
    "correlation_id",
    "step",
    "index",
    "direction",
    "action",
    "complete_by",
    "idempotency_key",
    "order",
    "input",
    "outcome",
    "status",
    "output",
    "reason",
];

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        prop_oneof![Just(0i64), Just(1), Just(-1), Just(MAX_QUANTITY), Just(MAX_UNIT_PRICE)]
            .prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
        prop::sample::select(vec!["EUR", "FR", "do", "undo", "start", "reply", "done", "failed"])
            .prop_map(Value::from),
    ]
}

/// Any JSON value, nested a few levels, with keys mostly from [`KEYS`].
fn json_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 6, |inner| {
        let key =
            prop_oneof![4 => prop::sample::select(KEYS).prop_map(str::to_owned), 1 => ".{0,8}"];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(key, inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Every JSON pointer inside `value`, the root included.
fn pointers(value: &Value) -> Vec<String> {
    let mut out = vec![String::new()];
    match value {
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                out.extend(pointers(item).into_iter().map(|p| format!("/{i}{p}")));
            }
        }
        Value::Object(fields) => {
            for (k, item) in fields {
                let k = k.replace('~', "~0").replace('/', "~1");
                out.extend(pointers(item).into_iter().map(|p| format!("/{k}{p}")));
            }
        }
        _ => {}
    }
    out
}

/// `value` with the part at the `pick`-th pointer replaced by `with`, or removed.
fn mutate(value: &Value, pick: usize, with: Option<Value>) -> Value {
    let mut value = value.clone();
    let all = pointers(&value);
    let at = &all[pick % all.len()];
    match (with, at.rsplit_once('/')) {
        (None, Some((parent, key))) => match value.pointer_mut(parent) {
            Some(Value::Object(fields)) => {
                fields.remove(&key.replace("~1", "/").replace("~0", "~"));
            }
            Some(Value::Array(items)) => {
                let i: usize = key.parse().unwrap();
                items.remove(i);
            }
            _ => {}
        },
        (Some(with), _) => *value.pointer_mut(at).unwrap() = with,
        (None, None) => value = Value::Null,
    }
    value
}

fn valid_order() -> Value {
    json!({
        "customer_id": "cust-42",
        "currency": "EUR",
        "items": [{"sku": "BOOK-1", "quantity": 2, "unit_price": 1250},
                  {"sku": "PEN-9", "quantity": 1, "unit_price": 300}],
        "ship_to": {"name": "Ada Lovelace", "line1": "12 St James's Square", "line2": "Flat 1",
                    "city": "London", "postal_code": "SW1Y 4JH", "country": "GB"}
    })
}

/// What every accepted order must satisfy, and normalising it again must change nothing.
fn assert_within_limits(order: &Order) {
    assert!(!order.items.is_empty() && order.items.len() <= MAX_ITEMS);
    for item in &order.items {
        assert!((1..=MAX_QUANTITY).contains(&item.quantity));
        assert!((1..=MAX_UNIT_PRICE).contains(&item.unit_price));
    }
    assert!(order.total() <= MAX_TOTAL);
    for text in [&order.ship_to.name, &order.ship_to.line1, &order.ship_to.city] {
        assert!(!text.is_empty() && text.trim() == text && !text.chars().any(char::is_control));
    }
    let again = Order::from_json(serde_json::to_string(order).unwrap().as_bytes()).unwrap();
    assert_eq!(&again, order);
}

fn workflow() -> Workflow {
    let agents = Workflow::agents_in(sas_workflows::order_fulfilment());
    Workflow::from_json(sas_workflows::order_fulfilment(), &agents).unwrap()
}

fn order_id() -> OrderId {
    OrderId::for_key(&IdempotencyKey::parse("order-1").unwrap())
}

/// One valid message of each kind.
fn valid_messages() -> Vec<Value> {
    let order: Value = valid_order();
    let step = json!({"index": 1, "name": "charge-payment", "direction": "do"});
    vec![
        json!({"v": 1, "type": "start", "order_id": order_id(), "attempt": 3, "correlation_id": "c"}),
        json!({"v": 1, "type": "request", "order_id": order_id(), "attempt": 3,
               "correlation_id": "c", "step": step, "action": "charge-payment",
               "complete_by": 1_767_225_600_000i64, "idempotency_key": "k", "order": order,
               "input": {"ref": "r-1"}}),
        json!({"v": 1, "type": "reply", "order_id": order_id(), "attempt": 3,
               "correlation_id": "c", "step": step, "complete_by": 1_767_225_600_000i64,
               "idempotency_key": "k", "outcome": {"status": "failed", "reason": "declined"}}),
    ]
}

fn assert_round_trips(message: &Message) {
    assert_eq!(&Message::decode(&message.encode()).unwrap(), message);
}

proptest! {
    #[test]
    fn any_bytes_as_an_order_give_an_answer(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        if let Ok(order) = Order::from_json(&bytes) {
            assert_within_limits(&order);
        }
    }

    #[test]
    fn any_json_as_an_order_gives_an_answer(value in json_value()) {
        if let Ok(order) = Order::from_json(value.to_string().as_bytes()) {
            assert_within_limits(&order);
        }
    }

    #[test]
    fn an_order_with_one_part_changed_is_accepted_only_within_limits(
        pick in any::<usize>(),
        with in prop::option::weighted(0.9, json_value()),
    ) {
        let body = mutate(&valid_order(), pick, with);
        if let Ok(order) = Order::from_json(body.to_string().as_bytes()) {
            assert_within_limits(&order);
        }
    }

    #[test]
    fn quantities_and_prices_are_accepted_exactly_within_their_bounds(
        quantity in prop_oneof![any::<i64>(), -2i64..3, MAX_QUANTITY - 2..MAX_QUANTITY + 3, 1..MAX_QUANTITY],
        price in prop_oneof![any::<i64>(), -2i64..3, MAX_UNIT_PRICE - 2..MAX_UNIT_PRICE + 3, 1..2_000_000i64],
    ) {
        let mut body = valid_order();
        body["items"] = json!([{"sku": "A", "quantity": quantity, "unit_price": price}]);
        let within = (1..=MAX_QUANTITY).contains(&quantity)
            && (1..=MAX_UNIT_PRICE).contains(&price)
            && i128::from(quantity) * i128::from(price) <= i128::from(MAX_TOTAL);
        let answer = Order::from_json(body.to_string().as_bytes());
        prop_assert_eq!(answer.is_ok(), within, "{} x {}: {:?}", quantity, price, answer);
    }

    #[test]
    fn any_text_in_an_address_is_measured_and_checked(text in any::<String>()) {
        let mut body = valid_order();
        body["ship_to"]["name"] = json!(text);
        match Order::from_json(body.to_string().as_bytes()) {
            Ok(order) => {
                assert_eq!(order.ship_to.name, text.trim());
                assert!(order.ship_to.name.chars().count() <= 100);
                assert_within_limits(&order);
            }
            Err(r) => assert_eq!(r.errors[0].field, "ship_to.name", "{r}"),
        }
    }

    #[test]
    fn any_idempotency_key_is_checked(raw in any::<String>()) {
        if let Ok(key) = IdempotencyKey::parse(&raw) {
            assert!((1..=128).contains(&key.as_str().len()));
            assert!(key.as_str().bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b)));
            assert_eq!(OrderId::for_key(&key), OrderId::for_key(&IdempotencyKey::parse(&raw).unwrap()));
        }
    }

    #[test]
    fn any_text_as_a_message_gives_an_answer(body in any::<String>()) {
        if let Ok(message) = Message::decode(&body) {
            assert_round_trips(&message);
        }
    }

    #[test]
    fn any_json_as_a_message_gives_an_answer(
        value in json_value(),
        kind in prop::sample::select(vec!["start", "request", "reply", "other"]),
    ) {
        let mut value = value;
        if let Value::Object(fields) = &mut value {
            fields.insert("v".into(), json!(1));
            fields.insert("type".into(), json!(kind));
        }
        if let Ok(message) = Message::decode(&value.to_string()) {
            assert_round_trips(&message);
        }
    }

    #[test]
    fn a_message_with_one_part_changed_gives_an_answer(
        which in 0usize..3,
        pick in any::<usize>(),
        with in prop::option::weighted(0.9, json_value()),
    ) {
        let body = mutate(&valid_messages()[which], pick, with);
        if let Ok(message) = Message::decode(&body.to_string()) {
            assert_round_trips(&message);
        }
    }

    #[test]
    fn a_damaged_stored_record_never_makes_the_machine_panic(
        pick in any::<usize>(),
        with in prop::option::weighted(0.9, json_value()),
        attempt in 0u64..4,
        now_offset in 0i64..7_200_000,
    ) {
        let workflow = workflow();
        let config = EngineConfig::default();
        let t0 = Timestamp::from_millis(1_767_225_600_000);
        let ctx0 = Ctx { now: t0, config: &config, workflow: &workflow };
        let record = sas_engine::machine::create(order_id(), "c".into(), &ctx0).next;
        let body = mutate(&serde_json::to_value(&record).unwrap(), pick, with);
        let Ok(record) = serde_json::from_value::<StateRecord>(body) else { return Ok(()) };
        let sound = record.check();
        let ctx = Ctx { now: Timestamp::from_millis(t0.as_millis() + now_offset), config: &config, workflow: &workflow };
        let step = StepRef { index: 0, name: "reserve-inventory".into(), direction: sas_engine::ids::Direction::Do };
        let outcome = StepOutcome::done(json!({"ref": "r"}));
        for input in [
            Input::Claim { attempt, owner: "s", message: "m" },
            Input::Reply { attempt, step: &step, outcome: &outcome, message: "m" },
            Input::Expire {
                complete_by: record.complete_by.unwrap_or(t0),
                horizon: std::time::Duration::ZERO,
            },
            Input::AlertSent,
            Input::Resubmit,
        ]
        .into_iter()
        .chain(CommandKind::ALL.map(|command| Input::Command { command, id: "cmd-1", by: "ops", reason: "why" }))
        {
            // A damaged record is refused whole, whatever the input; a sound one only ever
            // moves to a sound record, one revision on.
            match (decide(&record, input, &ctx), &sound) {
                (Decision::Illegal(Illegal::Corrupt { .. }), Err(_)) => {}
                (decision, Err(why)) => {
                    prop_assert!(false, "a damaged record ({why}) gave {decision:?}");
                }
                (Decision::Illegal(Illegal::Corrupt { reason }), Ok(())) => {
                    prop_assert!(false, "a sound record refused as corrupt: {reason}");
                }
                (Decision::Apply(t), Ok(())) => {
                    prop_assert!(t.next.check().is_ok(), "{:?} wrote a damaged record: {:?}", input, t.next.check());
                    prop_assert_eq!(Some(t.next.revision), record.revision.checked_add(1));
                    prop_assert_eq!(t.next.order_id, record.order_id);
                }
                (_, Ok(())) => {}
            }
        }
    }
}

#[test]
fn the_valid_inputs_the_properties_start_from_are_valid() {
    // Otherwise the mutations would only ever explore rejections.
    assert_within_limits(&Order::from_json(valid_order().to_string().as_bytes()).unwrap());
    for m in valid_messages() {
        assert_round_trips(&Message::decode(&m.to_string()).unwrap());
    }
    let workflow = workflow();
    let config = EngineConfig::default();
    let ctx = Ctx { now: Timestamp::from_millis(0), config: &config, workflow: &workflow };
    let record = sas_engine::machine::create(order_id(), "c".into(), &ctx).next;
    let back: StateRecord = serde_json::from_value(serde_json::to_value(&record).unwrap()).unwrap();
    back.check().unwrap();
}
