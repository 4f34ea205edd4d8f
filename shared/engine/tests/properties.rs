//! Property tests of everything that reads outside input: an order's input as the reference
//! workflow checks it against its JSON Schema, the idempotency key, the message decoders, and
//! the state machine on records read back from storage. Whatever the bytes, these return a typed
//! error and never panic; what they accept keeps its limits and survives a round trip; what they
//! refuse is named by where it is wrong, never by repeating it.
//!
//! The order properties hold the validator to [`conforms`], a model of what the `input_schema`
//! of `shared/workflows/order-fulfilment.json` means, written out here by hand: a disagreement is
//! a fault in the schema (or in the model).
//!
//! `PROPTEST_CASES=n` sets the cases per property (256 by default).

#![allow(clippy::unwrap_used)]

use std::sync::LazyLock;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::strategy::Union;
use proptest::test_runner::TestCaseError;
use sas_engine::Timestamp;
use sas_engine::config::EngineConfig;
use sas_engine::ids::{IdempotencyKey, OrderId};
use sas_engine::machine::{Ctx, Decision, Illegal, Input, decide};
use sas_engine::message::{Message, StepOutcome, StepRef};
use sas_engine::order::{FieldError, Rejection};
use sas_engine::state::{CommandKind, StateRecord};
use sas_engine::workflow::Workflow;
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// What the reference workflow's input is meant to be.

/// The reference workflow, loaded once: compiling its schema is the slow part.
static WORKFLOW: LazyLock<Workflow> = LazyLock::new(|| {
    let json = sas_workflows::order_fulfilment();
    Workflow::from_json(json, &Workflow::agents_in(json)).unwrap()
});

/// Put into every broken value that can hold it: no reason may ever contain it.
const MARK: &str = "Qx7Zebra";

const MAX_ITEMS: usize = 50;
const MAX_QUANTITY: i64 = 1000;
const MAX_UNIT_PRICE: i64 = 100_000_000;
/// `customer_id` and `sku`.
const MAX_TOKEN: usize = 64;
/// `ship_to.name` and `ship_to.city`.
const MAX_SHORT_TEXT: usize = 100;
/// `ship_to.line1` and `ship_to.line2`.
const MAX_LONG_TEXT: usize = 200;
const MAX_POSTAL_CODE: usize = 16;

const ROOT_KEYS: [&str; 4] = ["customer_id", "currency", "items", "ship_to"];
const ITEM_KEYS: [&str; 3] = ["sku", "quantity", "unit_price"];
const SHIP_TO_KEYS: [&str; 6] = ["name", "line1", "line2", "city", "postal_code", "country"];
const SHIP_TO_REQUIRED: [&str; 5] = ["name", "line1", "city", "postal_code", "country"];

/// The bidirectional formatting characters no text may hold (besides control characters): the
/// marks, embeddings and overrides, isolates, and the byte order mark.
const BIDI: [char; 12] = [
    '\u{200E}', '\u{200F}', '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}', '\u{202E}', '\u{2066}',
    '\u{2067}', '\u{2068}', '\u{2069}', '\u{FEFF}',
];

fn forbidden(c: char) -> bool {
    c.is_control() || BIDI.contains(&c)
}

fn token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_.@:-".contains(c)
}

fn postal_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == ' ' || c == '-'
}

fn is_token(v: &Value) -> bool {
    v.as_str().is_some_and(|s| (1..=MAX_TOKEN).contains(&s.len()) && s.chars().all(token_char))
}

/// `n` capital ASCII letters (a currency, a country).
fn is_code(v: &Value, n: usize) -> bool {
    v.as_str().is_some_and(|s| s.len() == n && s.chars().all(|c| c.is_ascii_uppercase()))
}

/// A JSON Schema integer: any number without a fractional part, `2.0` included.
fn is_integer_within(v: &Value, min: i64, max: i64) -> bool {
    v.as_f64().is_some_and(|f| f.fract() == 0.0 && f >= min as f64 && f <= max as f64)
}

/// At most `max` characters, none a control or bidi character, and, unless `blank_ok`, one
/// that is not white space.
fn is_text(v: &Value, max: usize, blank_ok: bool) -> bool {
    v.as_str().is_some_and(|s| {
        s.chars().count() <= max
            && !s.chars().any(forbidden)
            && (blank_ok || s.chars().any(|c| !c.is_whitespace()))
    })
}

fn is_postal_code(v: &Value) -> bool {
    v.as_str()
        .is_some_and(|s| (1..=MAX_POSTAL_CODE).contains(&s.len()) && s.chars().all(postal_char))
}

/// An object with every key of `required` and no key outside `allowed`.
fn is_object_of(v: &Value, required: &[&str], allowed: &[&str]) -> bool {
    v.as_object().is_some_and(|fields| {
        required.iter().all(|k| fields.contains_key(*k))
            && fields.keys().all(|k| allowed.contains(&k.as_str()))
    })
}

/// Whether `input` is a valid order for the reference workflow, as its schema means it.
fn conforms(input: &Value) -> bool {
    let item_ok = |item: &Value| {
        is_object_of(item, &ITEM_KEYS, &ITEM_KEYS)
            && is_token(&item["sku"])
            && is_integer_within(&item["quantity"], 1, MAX_QUANTITY)
            && is_integer_within(&item["unit_price"], 1, MAX_UNIT_PRICE)
    };
    let ship_to = &input["ship_to"];
    is_object_of(input, &ROOT_KEYS, &ROOT_KEYS)
        && is_token(&input["customer_id"])
        && is_code(&input["currency"], 3)
        && input["items"].as_array().is_some_and(|items| {
            (1..=MAX_ITEMS).contains(&items.len()) && items.iter().all(item_ok)
        })
        && is_object_of(ship_to, &SHIP_TO_REQUIRED, &SHIP_TO_KEYS)
        && is_text(&ship_to["name"], MAX_SHORT_TEXT, false)
        && is_text(&ship_to["line1"], MAX_LONG_TEXT, false)
        && ship_to.get("line2").is_none_or(|l| is_text(l, MAX_LONG_TEXT, true))
        && is_text(&ship_to["city"], MAX_SHORT_TEXT, false)
        && is_postal_code(&ship_to["postal_code"])
        && is_code(&ship_to["country"], 2)
}

/// `n` characters of [`MARK`], over and over.
fn marked(n: usize) -> String {
    MARK.chars().cycle().take(n).collect()
}

fn items_of(order: &Value) -> usize {
    order["items"].as_array().map_or(0, Vec::len)
}

/// A fixed valid order, for the messages and the plain tests.
fn sample_order() -> Value {
    json!({
        "customer_id": "cust-42",
        "currency": "EUR",
        "items": [{"sku": "BOOK-1", "quantity": 2, "unit_price": 1250},
                  {"sku": "PEN-9", "quantity": 1, "unit_price": 300}],
        "ship_to": {"name": "Ada Lovelace", "line1": "12 St James's Square", "line2": "Flat 1",
                    "city": "London", "postal_code": "SW1Y 4JH", "country": "GB"}
    })
}

/// What the reference workflow answers to `body`, checked against what it must be: malformed
/// JSON is refused as a whole without quoting it, a valid order is accepted unchanged, and
/// anything else is refused with reasons that each point at a part of the input.
fn check_answer(body: &[u8]) -> Result<(), TestCaseError> {
    let answer = WORKFLOW.input(body);
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        let Err(rejection) = answer else {
            return Err(TestCaseError::fail("malformed JSON was accepted"));
        };
        prop_assert_eq!(rejection.errors.len(), 1);
        let e = &rejection.errors[0];
        prop_assert!(e.field.is_empty() && e.reason.starts_with("malformed JSON"), "{}", rejection);
        prop_assert!(!e.reason.contains(MARK), "the reason quotes the body: {}", rejection);
        return Ok(());
    };
    match answer {
        Ok(order) => {
            prop_assert!(conforms(&value), "accepted, but the schema says otherwise: {}", value);
            prop_assert_eq!(order.0, value);
        }
        Err(rejection) => {
            prop_assert!(
                !conforms(&value),
                "refused ({}), but the schema allows {}",
                rejection,
                value
            );
            prop_assert!(!rejection.errors.is_empty());
            for e in &rejection.errors {
                prop_assert!(value.pointer(&e.field).is_some(), "{:?} points at nothing", e.field);
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Valid orders, anywhere within the schema's limits.

/// Any character a text may hold, white space included.
fn text_char() -> impl Strategy<Value = char> {
    prop_oneof![
        6 => prop::char::range(' ', '~'),
        2 => any::<char>().prop_map(|c| if forbidden(c) { '·' } else { c }),
        1 => prop::sample::select(vec![
            '\u{A0}', '\u{2003}', '\u{3000}', '\u{2028}', '\u{200B}', '\u{200D}', '\u{301}', 'é',
            'ß', '東', '😀',
        ]),
    ]
}

fn non_blank_char() -> impl Strategy<Value = char> {
    text_char().prop_map(|c| if c.is_whitespace() { '#' } else { c })
}

/// White space a text may hold (none of it a control character).
fn blank_char() -> impl Strategy<Value = char> {
    prop::sample::select(vec![
        ' ', '\u{A0}', '\u{1680}', '\u{2003}', '\u{2028}', '\u{2029}', '\u{202F}', '\u{205F}',
        '\u{3000}',
    ])
}

fn forbidden_char() -> impl Strategy<Value = char> {
    prop_oneof![
        prop::char::range('\0', '\u{1F}'),
        prop::char::range('\u{7F}', '\u{9F}'),
        prop::sample::select(BIDI.to_vec()),
    ]
}

/// 1 to `max` characters, at least one not white space; often exactly `max`.
fn text(max: usize) -> impl Strategy<Value = String> {
    prop_oneof![1..=max, Just(max)]
        .prop_flat_map(|n| (prop::collection::vec(text_char(), n - 1), non_blank_char(), 0..n))
        .prop_map(|(mut chars, c, at)| {
            chars.insert(at, c);
            chars.into_iter().collect()
        })
}

/// 0 to `max` characters, blank or not; often exactly `max`.
fn free_text(max: usize) -> impl Strategy<Value = String> {
    prop_oneof![0..=max, Just(max)]
        .prop_flat_map(|n| prop::collection::vec(text_char(), n))
        .prop_map(|chars| chars.into_iter().collect())
}

fn token() -> impl Strategy<Value = String> {
    prop_oneof!["[A-Za-z0-9_.@:-]{1,64}", "[A-Za-z0-9_.@:-]{64}"]
}

fn item() -> impl Strategy<Value = Value> {
    (
        token(),
        prop_oneof![1..=MAX_QUANTITY, Just(1), Just(MAX_QUANTITY)],
        prop_oneof![1..=MAX_UNIT_PRICE, Just(1), Just(MAX_UNIT_PRICE)],
    )
        .prop_map(|(sku, quantity, unit_price)| {
            json!({"sku": sku, "quantity": quantity, "unit_price": unit_price})
        })
}

fn ship_to() -> impl Strategy<Value = Value> {
    (
        text(MAX_SHORT_TEXT),
        text(MAX_LONG_TEXT),
        prop::option::of(free_text(MAX_LONG_TEXT)),
        text(MAX_SHORT_TEXT),
        "[A-Za-z0-9 -]{1,16}",
        "[A-Z]{2}",
    )
        .prop_map(|(name, line1, line2, city, postal_code, country)| {
            let mut ship_to = json!({"name": name, "line1": line1, "city": city,
                                     "postal_code": postal_code, "country": country});
            if let Some(line2) = line2 {
                ship_to["line2"] = json!(line2);
            }
            ship_to
        })
}

/// Any valid order: 1 to 50 items (often a few, sometimes exactly 50), every text anywhere
/// from its shortest to its longest.
fn orders() -> impl Strategy<Value = Value> {
    let items = prop_oneof![
        3 => prop::collection::vec(item(), 1..=4),
        1 => prop::collection::vec(item(), 1..=MAX_ITEMS),
        1 => prop::collection::vec(item(), MAX_ITEMS),
    ];
    (token(), "[A-Z]{3}", items, ship_to()).prop_map(|(customer_id, currency, items, ship_to)| {
        json!({"customer_id": customer_id, "currency": currency, "items": items,
               "ship_to": ship_to})
    })
}

// ---------------------------------------------------------------------------------------------
// One fault in an otherwise valid order.

/// A single thing wrong with an order, and where it must be reported.
#[derive(Clone, Debug)]
enum Fault {
    /// The member at pointer `at` set to `with` (added if absent).
    Replace { at: String, with: Value },
    /// `key`, which the schema does not know, added to the object at `at`.
    Unknown { at: String, key: String },
    /// Required `key` removed from the object at `at`.
    Missing { at: String, key: &'static str },
}

/// The object at pointer `at`, which must be one.
fn object_at<'a>(value: &'a mut Value, at: &str) -> &'a mut serde_json::Map<String, Value> {
    value.pointer_mut(at).and_then(Value::as_object_mut).unwrap()
}

fn replace(at: impl Into<String>, with: Value) -> Fault {
    Fault::Replace { at: at.into(), with }
}

impl Fault {
    /// The pointer every error must name: the broken value, or the object that misses a key
    /// or holds one too many.
    fn at(&self) -> &str {
        match self {
            Fault::Replace { at, .. } | Fault::Unknown { at, .. } | Fault::Missing { at, .. } => at,
        }
    }

    fn apply(&self, order: &Value) -> Value {
        let mut order = order.clone();
        match self {
            Fault::Replace { at, with } => match at.rsplit_once('/') {
                None => order = with.clone(),
                Some((parent, key)) => {
                    object_at(&mut order, parent).insert(key.to_owned(), with.clone());
                }
            },
            Fault::Unknown { at, key } => {
                object_at(&mut order, at).insert(key.clone(), json!(format!("{MARK} extra")));
            }
            Fault::Missing { at, key } => {
                object_at(&mut order, at).remove(*key).unwrap();
            }
        }
        order
    }

    /// Text that would show the broken value repeated in a reason: [`MARK`] if the value holds
    /// it, a number as written; `None` if the value is too plain to tell (`""`, `null`).
    fn telltale(&self) -> Option<String> {
        match self {
            Fault::Replace { with, .. } if with.to_string().contains(MARK) => Some(MARK.into()),
            Fault::Replace { with: Value::Number(n), .. } => Some(n.to_string()),
            Fault::Replace { .. } | Fault::Missing { .. } => None,
            Fault::Unknown { .. } => Some(MARK.into()),
        }
    }
}

/// A value of any JSON type but `expected`.
fn wrong_type(expected: &'static str) -> impl Strategy<Value = Value> {
    let candidates = [
        Value::Null,
        json!(true),
        json!(4242),
        json!(42.5),
        json!(MARK),
        json!([MARK]),
        json!({"note": MARK}),
    ];
    let others: Vec<Value> = candidates
        .into_iter()
        .filter(|v| match expected {
            "string" => !v.is_string(),
            "object" => !v.is_object(),
            "array" => !v.is_array(),
            "integer" => !is_integer_within(v, i64::MIN, i64::MAX),
            _ => unreachable!("no such type here"),
        })
        .collect();
    prop::sample::select(others)
}

/// [`MARK`] with `c` inserted at one place or another.
fn mark_with(c: impl Strategy<Value = char>) -> impl Strategy<Value = Value> {
    (c, 0..=MARK.len()).prop_map(|(c, at)| {
        let mut s = MARK.to_owned();
        s.insert(at, c);
        json!(s)
    })
}

/// A text that would do but for one to three control or bidi characters.
fn with_forbidden_chars() -> impl Strategy<Value = Value> {
    prop::collection::vec((forbidden_char(), any::<Index>()), 1..=3).prop_map(|bad| {
        let mut chars: Vec<char> = format!("{MARK} Lane").chars().collect();
        for (c, at) in bad {
            chars.insert(at.index(chars.len() + 1), c);
        }
        json!(chars.into_iter().collect::<String>())
    })
}

/// Longer than `max` characters, counted as characters, not bytes.
fn too_long(max: usize) -> impl Strategy<Value = Value> {
    (max + 1..=max + 30, any::<bool>()).prop_map(|(n, wide)| {
        if wide {
            json!(format!("{MARK}{}", "😀".repeat(n - MARK.len())))
        } else {
            json!(marked(n))
        }
    })
}

fn bad_token() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!("")),
        (MAX_TOKEN + 1..=2 * MAX_TOKEN).prop_map(|n| json!(marked(n))),
        mark_with(any::<char>().prop_filter("a token's character", |c| !token_char(*c))),
        wrong_type("string"),
    ]
}

/// Anything but `n` capital ASCII letters.
fn bad_code(n: usize) -> impl Strategy<Value = Value> {
    let letter = || prop::char::range('A', 'Z');
    prop_oneof![
        Just(json!(MARK)),
        (0..=6usize)
            .prop_filter("the right length", move |l| *l != n)
            .prop_flat_map(move |l| prop::collection::vec(letter(), l))
            .prop_map(|s| json!(s.into_iter().collect::<String>())),
        (
            prop::collection::vec(letter(), n),
            any::<char>().prop_filter("a capital", |c| !c.is_ascii_uppercase()),
            0..n,
        )
            .prop_map(|(mut s, c, at)| {
                s[at] = c;
                json!(s.into_iter().collect::<String>())
            }),
        wrong_type("string"),
    ]
}

fn bad_integer(min: i64, max: i64) -> impl Strategy<Value = Value> {
    prop_oneof![
        (i64::MIN..min).prop_map(Value::from),
        (min - 3..min).prop_map(Value::from),
        (max + 1..=i64::MAX).prop_map(Value::from),
        (max + 1..=max + 3).prop_map(Value::from),
        ((1u64 << 63)..=u64::MAX).prop_map(Value::from),
        (min - 2..=max + 2).prop_map(|k| json!(k as f64 + 0.5)),
        prop::sample::select(vec![1e19, 1e300, -1e300]).prop_map(|f| json!(f)),
        Just(json!(min.to_string())),
        wrong_type("integer"),
    ]
}

/// What `name`, `line1` and `city` must not be.
fn bad_text(max: usize) -> impl Strategy<Value = Value> {
    prop_oneof![
        too_long(max),
        with_forbidden_chars(),
        prop::collection::vec(blank_char(), 0..=max.min(30))
            .prop_map(|blank| json!(blank.into_iter().collect::<String>())),
        wrong_type("string"),
    ]
}

fn bad_line2() -> impl Strategy<Value = Value> {
    prop_oneof![too_long(MAX_LONG_TEXT), with_forbidden_chars(), wrong_type("string")]
}

fn bad_postal_code() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!("")),
        (MAX_POSTAL_CODE + 1..=40).prop_map(|n| json!(marked(n))),
        mark_with(any::<char>().prop_filter("a postal code's character", |c| !postal_char(*c))),
        wrong_type("string"),
    ]
}

fn bad_items() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!([])),
        prop::collection::vec(item(), MAX_ITEMS + 1..=MAX_ITEMS + 5).prop_map(Value::Array),
        wrong_type("array"),
    ]
}

/// A key the object it is put in does not know: made up, or one of another object's.
fn unknown_key(known: &'static [&'static str]) -> impl Strategy<Value = String> {
    let all_keys: Vec<&str> =
        ROOT_KEYS.iter().chain(&ITEM_KEYS).chain(&SHIP_TO_KEYS).copied().collect();
    prop_oneof![
        "[a-z_]{1,12}",
        "[a-z/~ .]{1,6}",
        prop::sample::select(all_keys).prop_map(str::to_owned),
    ]
    .prop_filter("a key it knows", move |k| !known.contains(&k.as_str()))
}

/// One fault anywhere in an order of `items` items.
fn fault(items: usize) -> impl Strategy<Value = Fault> {
    let item = move || 0..items;
    Union::new([
        bad_token().prop_map(|v| replace("/customer_id", v)).boxed(),
        bad_code(3).prop_map(|v| replace("/currency", v)).boxed(),
        bad_items().prop_map(|v| replace("/items", v)).boxed(),
        (item(), bad_token()).prop_map(|(i, v)| replace(format!("/items/{i}/sku"), v)).boxed(),
        (item(), bad_integer(1, MAX_QUANTITY))
            .prop_map(|(i, v)| replace(format!("/items/{i}/quantity"), v))
            .boxed(),
        (item(), bad_integer(1, MAX_UNIT_PRICE))
            .prop_map(|(i, v)| replace(format!("/items/{i}/unit_price"), v))
            .boxed(),
        wrong_type("object").prop_map(|v| replace("/ship_to", v)).boxed(),
        (prop::sample::select(vec!["name", "city"]), bad_text(MAX_SHORT_TEXT))
            .prop_map(|(field, v)| replace(format!("/ship_to/{field}"), v))
            .boxed(),
        bad_text(MAX_LONG_TEXT).prop_map(|v| replace("/ship_to/line1", v)).boxed(),
        bad_line2().prop_map(|v| replace("/ship_to/line2", v)).boxed(),
        bad_postal_code().prop_map(|v| replace("/ship_to/postal_code", v)).boxed(),
        bad_code(2).prop_map(|v| replace("/ship_to/country", v)).boxed(),
        wrong_type("object").prop_map(|v| replace("", v)).boxed(),
        unknown_key(&ROOT_KEYS).prop_map(|key| Fault::Unknown { at: String::new(), key }).boxed(),
        (item(), unknown_key(&ITEM_KEYS))
            .prop_map(|(i, key)| Fault::Unknown { at: format!("/items/{i}"), key })
            .boxed(),
        unknown_key(&SHIP_TO_KEYS)
            .prop_map(|key| Fault::Unknown { at: "/ship_to".into(), key })
            .boxed(),
        prop::sample::select(ROOT_KEYS.to_vec())
            .prop_map(|key| Fault::Missing { at: String::new(), key })
            .boxed(),
        (item(), prop::sample::select(ITEM_KEYS.to_vec()))
            .prop_map(|(i, key)| Fault::Missing { at: format!("/items/{i}"), key })
            .boxed(),
        prop::sample::select(SHIP_TO_REQUIRED.to_vec())
            .prop_map(|key| Fault::Missing { at: "/ship_to".into(), key })
            .boxed(),
    ])
}

/// A valid order, and one fault to put in it.
fn order_and_fault() -> impl Strategy<Value = (Value, Fault)> {
    orders().prop_flat_map(|order| {
        let items = items_of(&order);
        (Just(order), fault(items))
    })
}

// ---------------------------------------------------------------------------------------------
// Any JSON at all, and damaged messages and records.

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
        prop::sample::select(vec![
            0i64,
            1,
            -1,
            MAX_QUANTITY,
            MAX_QUANTITY + 1,
            MAX_UNIT_PRICE,
            MAX_UNIT_PRICE + 1
        ])
        .prop_map(Value::from),
        prop::sample::select(vec![2.0, 2.5, 1e8]).prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::from),
        prop::sample::select(vec![
            "",
            " ",
            "EUR",
            "FR",
            "SKU-1",
            "Ada",
            "A\u{7}",
            "\u{202E}A",
            "do",
            "undo",
            "start",
            "reply",
            "done",
            "failed",
        ])
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

fn order_id() -> OrderId {
    OrderId::for_key(&IdempotencyKey::parse("order-1").unwrap())
}

/// One valid message of each kind.
fn valid_messages() -> Vec<Value> {
    let order = sample_order();
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

// ---------------------------------------------------------------------------------------------
// The properties.

proptest! {
    #[test]
    fn any_bytes_as_an_order_give_an_answer(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        check_answer(&bytes)?;
    }

    #[test]
    fn a_damaged_order_body_gives_an_answer(
        order in orders(),
        cut in prop::option::of(any::<Index>()),
        damage in prop::collection::vec((any::<Index>(), any::<u8>()), 0..4),
    ) {
        // With MARK in it, a malformed body shows whether the reason quotes the body.
        let mut order = order;
        order["customer_id"] = json!(MARK);
        let mut body = order.to_string().into_bytes();
        for (at, byte) in damage {
            let at = at.index(body.len());
            body[at] = byte;
        }
        if let Some(cut) = cut {
            body.truncate(cut.index(body.len()));
        }
        check_answer(&body)?;
    }

    #[test]
    fn any_json_as_an_order_gives_an_answer(value in json_value()) {
        check_answer(value.to_string().as_bytes())?;
    }

    #[test]
    fn an_order_with_one_part_changed_is_accepted_only_within_the_schema(
        order in orders(),
        pick in any::<usize>(),
        with in prop::option::weighted(0.9, json_value()),
    ) {
        check_answer(mutate(&order, pick, with).to_string().as_bytes())?;
    }

    #[test]
    fn every_valid_order_is_accepted_unchanged(order in orders()) {
        prop_assert!(conforms(&order), "the generator and the model disagree on {}", order);
        let accepted = WORKFLOW
            .input(order.to_string().as_bytes())
            .map_err(|r| TestCaseError::fail(format!("refused: {r}")))?;
        prop_assert_eq!(&accepted.0, &order);
        // The body's layout does not matter, and the order serialises as its input.
        let pretty = WORKFLOW.input(serde_json::to_string_pretty(&order).unwrap().as_bytes());
        prop_assert_eq!(pretty.as_ref(), Ok(&accepted));
        prop_assert_eq!(serde_json::to_value(&accepted).unwrap(), order);
    }

    #[test]
    fn an_order_with_one_fault_is_refused_there_without_repeating_it(
        (order, fault) in order_and_fault(),
    ) {
        let input = fault.apply(&order);
        prop_assert!(!conforms(&input), "the model takes {:?} for no fault", fault);
        let Err(rejection) = WORKFLOW.input(input.to_string().as_bytes()) else {
            return Err(TestCaseError::fail(format!("{fault:?} was accepted")));
        };
        prop_assert!(!rejection.errors.is_empty());
        for e in &rejection.errors {
            prop_assert_eq!(e.field.as_str(), fault.at(), "{:?}: {}", fault, rejection);
            if let Some(telltale) = fault.telltale() {
                prop_assert!(!e.reason.contains(&telltale), "{:?}: {}", fault, rejection);
            }
        }
        if let Fault::Missing { key, .. } = &fault {
            let named = format!("\"{key}\"");
            prop_assert!(
                rejection.errors.iter().any(|e| e.reason.contains(&named)),
                "the missing key is not named: {}", rejection
            );
        }
    }

    #[test]
    fn any_text_in_an_address_is_checked_as_a_text(
        field in prop::sample::select(vec!["name", "line1", "line2", "city"]),
        text in prop::collection::vec(
            prop_oneof![8 => text_char(), 1 => forbidden_char(), 1 => blank_char()],
            0..=MAX_LONG_TEXT + 2,
        ),
    ) {
        let text: String = text.into_iter().collect();
        let mut order = sample_order();
        order["ship_to"][field] = json!(text);
        let (max, blank_ok) = match field {
            "name" | "city" => (MAX_SHORT_TEXT, false),
            "line1" => (MAX_LONG_TEXT, false),
            _ => (MAX_LONG_TEXT, true),
        };
        let valid = is_text(&json!(text), max, blank_ok);
        match WORKFLOW.input(order.to_string().as_bytes()) {
            Ok(accepted) => {
                prop_assert!(valid, "{} {:?} was accepted", field, text);
                prop_assert_eq!(&accepted.0["ship_to"][field], &json!(text));
            }
            Err(r) => {
                prop_assert!(!valid, "{} {:?} was refused: {}", field, text, r);
                let at = format!("/ship_to/{field}");
                prop_assert!(r.errors.iter().all(|e| e.field == at), "{}", r);
            }
        }
    }

    #[test]
    fn texts_are_accepted_exactly_up_to_their_length_limit(
        (at, shortest, longest, fill) in prop::sample::select(vec![
            ("/customer_id", 1, MAX_TOKEN, 'k'),
            ("/items/0/sku", 1, MAX_TOKEN, '9'),
            ("/ship_to/name", 1, MAX_SHORT_TEXT, 'n'),
            ("/ship_to/name", 1, MAX_SHORT_TEXT, '😀'),
            ("/ship_to/city", 1, MAX_SHORT_TEXT, 'é'),
            ("/ship_to/line1", 1, MAX_LONG_TEXT, 'l'),
            ("/ship_to/line2", 0, MAX_LONG_TEXT, '東'),
            ("/ship_to/postal_code", 1, MAX_POSTAL_CODE, 'P'),
        ]),
        at_the_top in any::<bool>(),
        step in 0usize..=4,
    ) {
        // 0 to 4 characters, or 2 short of the limit to 2 past it.
        let len = if at_the_top { longest + step - 2 } else { step };
        let text: String = std::iter::repeat_n(fill, len).collect();
        let input = replace(at, json!(text)).apply(&sample_order());
        let answer = WORKFLOW.input(input.to_string().as_bytes());
        let within = (shortest..=longest).contains(&len);
        prop_assert_eq!(answer.is_ok(), within, "{} of {} characters: {:?}", at, len, answer);
        if let Err(r) = answer {
            prop_assert!(r.errors.iter().all(|e| e.field == at), "{}", r);
        }
    }

    #[test]
    fn items_quantities_and_prices_are_accepted_exactly_within_their_bounds(
        count in prop_oneof![0usize..3, MAX_ITEMS - 2..=MAX_ITEMS + 2],
        quantity in prop_oneof![any::<i64>(), -2i64..3, MAX_QUANTITY - 2..MAX_QUANTITY + 3, 1..MAX_QUANTITY],
        price in prop_oneof![any::<i64>(), -2i64..3, MAX_UNIT_PRICE - 2..MAX_UNIT_PRICE + 3, 1..2_000_000i64],
    ) {
        let mut body = sample_order();
        body["items"] = json!(vec![json!({"sku": "A", "quantity": quantity, "unit_price": price}); count]);
        let within = (1..=MAX_ITEMS).contains(&count)
            && (1..=MAX_QUANTITY).contains(&quantity)
            && (1..=MAX_UNIT_PRICE).contains(&price);
        let answer = WORKFLOW.input(body.to_string().as_bytes());
        prop_assert_eq!(answer.is_ok(), within, "{} x {} x {}: {:?}", count, quantity, price, answer);
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
        let workflow: &Workflow = &WORKFLOW;
        let config = EngineConfig::default();
        let t0 = Timestamp::from_millis(1_767_225_600_000);
        let ctx0 = Ctx { now: t0, config: &config, workflow, seed: 0 };
        let record = sas_engine::machine::create(order_id(), "c".into(), &ctx0).next;
        let body = mutate(&serde_json::to_value(&record).unwrap(), pick, with);
        let Ok(record) = serde_json::from_value::<StateRecord>(body) else { return Ok(()) };
        let sound = record.check();
        let ctx = Ctx { now: Timestamp::from_millis(t0.as_millis() + now_offset), config: &config, workflow, seed: 0 };
        let step = StepRef { index: 0, name: "reserve-inventory".into(), direction: sas_engine::ids::Direction::Do, element: None };
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
        .chain(CommandKind::ALL.map(|command| Input::Command { command, id: "cmd-1", by: "ops", reason: "why", after: std::time::Duration::ZERO }))
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

// ---------------------------------------------------------------------------------------------
// Plain tests.

#[test]
fn the_valid_inputs_the_properties_start_from_are_valid() {
    // Otherwise the mutations would only ever explore rejections.
    let order = sample_order();
    assert!(conforms(&order));
    assert_eq!(WORKFLOW.input(order.to_string().as_bytes()).unwrap().0, order);
    for m in valid_messages() {
        assert_round_trips(&Message::decode(&m.to_string()).unwrap());
    }
    let config = EngineConfig::default();
    let ctx = Ctx { now: Timestamp::from_millis(0), config: &config, workflow: &WORKFLOW, seed: 0 };
    let record = sas_engine::machine::create(order_id(), "c".into(), &ctx).next;
    let back: StateRecord = serde_json::from_value(serde_json::to_value(&record).unwrap()).unwrap();
    back.check().unwrap();
}

/// The order with the member at each pointer set to its value.
fn order_with(changes: &[(&str, Value)]) -> Value {
    changes
        .iter()
        .fold(sample_order(), |order, (at, with)| replace(*at, with.clone()).apply(&order))
}

#[test]
fn the_limits_hold_at_their_edges() {
    let item = json!({"sku": "A", "quantity": 1, "unit_price": 1});
    let accepted = [
        ("/ship_to/name", json!("n".repeat(MAX_SHORT_TEXT))),
        // Characters are counted, not bytes.
        ("/ship_to/name", json!("😀".repeat(MAX_SHORT_TEXT))),
        ("/ship_to/city", json!("c".repeat(MAX_SHORT_TEXT))),
        ("/ship_to/line1", json!("l".repeat(MAX_LONG_TEXT))),
        ("/ship_to/line2", json!("l".repeat(MAX_LONG_TEXT))),
        ("/ship_to/line2", json!("")),
        ("/ship_to/line2", json!("   ")),
        ("/ship_to/postal_code", json!("P".repeat(MAX_POSTAL_CODE))),
        ("/customer_id", json!("k".repeat(MAX_TOKEN))),
        ("/customer_id", json!("Az09_.@:-")),
        ("/items", json!(vec![item.clone(); MAX_ITEMS])),
        ("/items/0/quantity", json!(MAX_QUANTITY)),
        ("/items/0/quantity", json!(1)),
        ("/items/0/unit_price", json!(MAX_UNIT_PRICE)),
        ("/items/0/unit_price", json!(1)),
        // Nothing is trimmed any more: what is accepted is kept as it came.
        ("/ship_to/name", json!("  Ada  ")),
        // A JSON Schema integer is any number without a fraction, and it stays as written.
        ("/items/0/quantity", json!(2.0)),
        ("/items/0/unit_price", json!(1e8)),
    ];
    for (at, value) in accepted {
        let order = order_with(&[(at, value)]);
        match WORKFLOW.input(order.to_string().as_bytes()) {
            Ok(accepted) => assert_eq!(accepted.0, order, "{at}"),
            Err(r) => panic!("{at} refused at its limit: {r}"),
        }
    }
    let refused = [
        ("/ship_to/name", json!("n".repeat(MAX_SHORT_TEXT + 1))),
        ("/ship_to/name", json!("😀".repeat(MAX_SHORT_TEXT + 1))),
        ("/ship_to/name", json!("")),
        ("/ship_to/name", json!(" \u{A0}\u{3000}")),
        ("/ship_to/city", json!("c".repeat(MAX_SHORT_TEXT + 1))),
        ("/ship_to/line1", json!("l".repeat(MAX_LONG_TEXT + 1))),
        ("/ship_to/line2", json!("l".repeat(MAX_LONG_TEXT + 1))),
        ("/ship_to/line2", json!("Flat\t1")),
        ("/ship_to/postal_code", json!("P".repeat(MAX_POSTAL_CODE + 1))),
        ("/customer_id", json!("k".repeat(MAX_TOKEN + 1))),
        ("/items", json!(vec![item; MAX_ITEMS + 1])),
        ("/items", json!([])),
        ("/items/0/quantity", json!(MAX_QUANTITY + 1)),
        ("/items/0/quantity", json!(0)),
        ("/items/0/quantity", json!(2.5)),
        ("/items/0/unit_price", json!(MAX_UNIT_PRICE + 1)),
        ("/items/0/unit_price", json!(0)),
    ];
    for (at, value) in refused {
        let order = order_with(&[(at, value)]);
        match WORKFLOW.input(order.to_string().as_bytes()) {
            Ok(_) => panic!("{at} accepted past its limit"),
            Err(r) => {
                assert!(!r.errors.is_empty() && r.errors.iter().all(|e| e.field == at), "{at}: {r}")
            }
        }
    }
}

#[test]
fn no_text_takes_a_control_or_bidi_character() {
    // Every such character, alone, first, in the middle and last, in each text of the address.
    let mut accepted = Vec::new();
    for c in (0..=0x9F).filter_map(char::from_u32).filter(|c| c.is_control()).chain(BIDI) {
        for field in ["name", "line1", "line2", "city"] {
            for text in
                [format!("{c}"), format!("{c}Ada"), format!("Ada{c}Lovelace"), format!("Ada{c}")]
            {
                let at = format!("/ship_to/{field}");
                let order = order_with(&[(at.as_str(), json!(text))]);
                match WORKFLOW.input(order.to_string().as_bytes()) {
                    Ok(_) => accepted.push(format!("{field} {text:?}")),
                    Err(r) => assert!(r.errors.iter().all(|e| e.field == at), "{r}"),
                }
            }
        }
    }
    assert!(
        accepted.is_empty(),
        "{} texts with a control or bidi character were accepted, among them: {}",
        accepted.len(),
        accepted.iter().take(12).cloned().collect::<Vec<_>>().join(", ")
    );
}

#[test]
fn where_the_schema_reports_what() {
    let refused = |order: Value| WORKFLOW.input(order.to_string().as_bytes()).unwrap_err().errors;
    let error =
        |field: &str, reason: &str| FieldError { field: field.into(), reason: reason.into() };

    // A missing key is reported on the object that misses it, by name.
    let mut order = sample_order();
    order["ship_to"].as_object_mut().unwrap().remove("city");
    assert_eq!(refused(order), [error("/ship_to", "\"city\" is a required property")]);

    // So is an unknown key, on the object that holds it: its value is not repeated, its name is.
    let mut order = sample_order();
    order["items"][1]["gift_note"] = json!(MARK);
    assert_eq!(
        refused(order),
        [error("/items/1", "Additional properties are not allowed ('gift_note' was unexpected)")]
    );

    // A number out of range is named by its pointer; its value is not repeated, the limit is.
    let mut order = sample_order();
    order["items"][1]["quantity"] = json!(4321);
    assert_eq!(
        refused(order),
        [error("/items/1/quantity", "value is greater than the maximum of 1000")]
    );

    // Whatever is not an object is refused as a whole.
    assert_eq!(refused(json!([MARK])), [error("", "value is not of type \"object\"")]);
}

#[test]
fn a_rejection_reads_as_pointers_and_reasons() {
    let rejection = Rejection {
        errors: vec![
            FieldError {
                field: "/items/2/quantity".into(),
                reason: "value is greater than the maximum of 1000".into(),
            },
            FieldError {
                field: String::new(),
                reason: "\"currency\" is a required property".into(),
            },
        ],
    };
    assert_eq!(
        rejection.to_string(),
        "/items/2/quantity: value is greater than the maximum of 1000; \
         (the input): \"currency\" is a required property"
    );

    // And as the workflow gives one: every pointer shown, no value.
    let mut order = sample_order();
    order.as_object_mut().unwrap().remove("currency");
    order["ship_to"]["name"] = json!(MARK.repeat(20));
    order["items"][0]["unit_price"] = json!(987_654_321);
    let shown = WORKFLOW.input(order.to_string().as_bytes()).unwrap_err().to_string();
    for part in ["(the input): ", "/ship_to/name: ", "/items/0/unit_price: "] {
        assert!(shown.contains(part), "{part:?} is not in {shown}");
    }
    assert!(!shown.contains(MARK) && !shown.contains("987654321"), "{shown}");
}
