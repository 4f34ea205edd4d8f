//! What an order is, and what makes one acceptable.
//!
//! The wire form is decoded strictly (unknown fields, wrong types and missing fields are
//! rejected with the path of the offending field), then checked against explicit limits. A
//! [`Rejection`] lists every problem found, each naming its field, so a client can fix a request
//! in one round trip. A validated [`Order`] is normalised (trimmed text) and compared as a whole
//! when an idempotency key is reused.

use std::collections::HashSet;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Items per order: at least one, at most this many.
pub const MAX_ITEMS: usize = 50;
/// Quantity of one line: 1 to this.
pub const MAX_QUANTITY: i64 = 1_000;
/// Price of one unit in minor units (cents): 1 to this (one million in major units).
pub const MAX_UNIT_PRICE: i64 = 100_000_000;
/// Total of an order in minor units: at most this (ten million in major units).
pub const MAX_TOTAL: i64 = 1_000_000_000;

/// One problem with a request, naming the field it is about (`items[2].quantity`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldError {
    pub field: String,
    pub reason: String,
}

/// Why an order was not accepted: at least one [`FieldError`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub struct Rejection {
    pub errors: Vec<FieldError>,
}

impl Rejection {
    fn one(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Rejection { errors: vec![FieldError { field: field.into(), reason: reason.into() }] }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: {}", e.field, e.reason)?;
        }
        Ok(())
    }
}

/// A validated order. Construct it with [`Order::from_json`] or [`OrderRequest::validate`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    pub customer_id: String,
    pub currency: String,
    pub items: Vec<LineItem>,
    pub ship_to: Address,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineItem {
    pub sku: String,
    pub quantity: i64,
    pub unit_price: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Address {
    pub name: String,
    pub line1: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line2: Option<String>,
    pub city: String,
    pub postal_code: String,
    pub country: String,
}

/// The order as a client sends it, before validation.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderRequest {
    pub customer_id: String,
    pub currency: String,
    pub items: Vec<LineItemRequest>,
    pub ship_to: AddressRequest,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LineItemRequest {
    pub sku: String,
    pub quantity: i64,
    pub unit_price: i64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddressRequest {
    pub name: String,
    pub line1: String,
    #[serde(default)]
    pub line2: Option<String>,
    pub city: String,
    pub postal_code: String,
    pub country: String,
}

impl Order {
    /// Decodes and validates a JSON body.
    pub fn from_json(body: &[u8]) -> Result<Order, Rejection> {
        let de = &mut serde_json::Deserializer::from_slice(body);
        let request: OrderRequest = serde_path_to_error::deserialize(&mut *de).map_err(|e| {
            let field = match e.path().to_string() {
                // Broken syntax is the body's fault, wherever the parser noticed it.
                _ if !e.inner().is_data() => "body".to_owned(),
                p if p == "." => "body".to_owned(),
                p => p,
            };
            Rejection::one(field, describe_json_error(e.inner()))
        })?;
        // Anything after the object but whitespace makes the body something else than one order.
        de.end().map_err(|e| Rejection::one("body", describe_json_error(&e)))?;
        request.validate()
    }

    /// The order's total in minor units. Cannot overflow: validation bounds every term.
    pub fn total(&self) -> i64 {
        self.items.iter().map(|i| i.quantity * i.unit_price).sum()
    }
}

fn describe_json_error(e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    match e.classify() {
        // serde's wording for these ("invalid type: string, expected i64 at line 1...") is
        // accurate, but the position is noise once the field is named.
        Category::Data => strip_position(&e.to_string()),
        Category::Syntax | Category::Eof => format!("malformed JSON: {e}"),
        Category::Io => "could not read the body".to_owned(),
    }
}

fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) => message[..i].to_owned(),
        None => message.to_owned(),
    }
}

impl OrderRequest {
    /// Checks every limit, collecting all problems, and returns the normalised order.
    pub fn validate(self) -> Result<Order, Rejection> {
        let mut v = Validator::default();
        let customer_id = v.token("customer_id", &self.customer_id, 64, "A-Z a-z 0-9 - _ . @ :");
        let currency = v.upper_code("currency", &self.currency, 3, "an ISO 4217 code such as EUR");

        if self.items.is_empty() {
            v.fail("items", "must contain at least one item");
        } else if self.items.len() > MAX_ITEMS {
            v.fail("items", format!("must contain at most {MAX_ITEMS} items"));
        }
        let mut skus = HashSet::new();
        let mut items = Vec::with_capacity(self.items.len());
        for (i, item) in self.items.into_iter().enumerate().take(MAX_ITEMS) {
            let sku = v.token(&format!("items[{i}].sku"), &item.sku, 64, "A-Z a-z 0-9 - _ . @ :");
            if !sku.is_empty() && !skus.insert(sku.clone()) {
                v.fail(format!("items[{i}].sku"), "appears more than once; merge the lines");
            }
            v.range(&format!("items[{i}].quantity"), item.quantity, 1, MAX_QUANTITY);
            v.range(&format!("items[{i}].unit_price"), item.unit_price, 1, MAX_UNIT_PRICE);
            items.push(LineItem { sku, quantity: item.quantity, unit_price: item.unit_price });
        }

        let a = self.ship_to;
        let ship_to = Address {
            name: v.text("ship_to.name", &a.name, 100),
            line1: v.text("ship_to.line1", &a.line1, 200),
            // A blank second line is an empty form field, not a mistake: it is dropped before
            // the text rules, which refuse blanks, are applied (unless it is longer than any
            // line may be, as the schema says).
            line2: a
                .line2
                .as_deref()
                .filter(|l| !l.trim().is_empty() || l.chars().count() > 200)
                .map(|l| v.text("ship_to.line2", l, 200)),
            city: v.text("ship_to.city", &a.city, 100),
            postal_code: v.postal_code("ship_to.postal_code", &a.postal_code),
            country: v.upper_code(
                "ship_to.country",
                &a.country,
                2,
                "an ISO 3166-1 alpha-2 code such as FR",
            ),
        };

        let order = Order { customer_id, currency, items, ship_to };
        if v.errors.is_empty() && order.total() > MAX_TOTAL {
            v.fail("items", format!("order total must not exceed {MAX_TOTAL} minor units"));
        }
        if v.errors.is_empty() { Ok(order) } else { Err(Rejection { errors: v.errors }) }
    }
}

#[derive(Default)]
struct Validator {
    errors: Vec<FieldError>,
}

impl Validator {
    fn fail(&mut self, field: impl Into<String>, reason: impl Into<String>) {
        self.errors.push(FieldError { field: field.into(), reason: reason.into() });
    }

    /// Free text: at most `max` characters as sent (so that the limit is the one a JSON schema
    /// states), non-blank, no control or bidirectional formatting characters (those can make a
    /// stored value display as something else); stored trimmed.
    fn text(&mut self, field: &str, raw: &str, max: usize) -> String {
        let t = raw.trim();
        if raw.chars().count() > max {
            self.fail(field, format!("must be at most {max} characters"));
        } else if t.is_empty() {
            self.fail(field, "must not be blank");
        } else if t.chars().any(is_disallowed_char) {
            self.fail(field, "must not contain control or text-direction characters");
        }
        t.to_owned()
    }

    /// An identifier: 1 to `max` characters from a small ASCII set, no trimming.
    fn token(&mut self, field: &str, raw: &str, max: usize, allowed: &str) -> String {
        if raw.is_empty() {
            self.fail(field, "must not be empty");
        } else if raw.len() > max {
            self.fail(field, format!("must be at most {max} characters"));
        } else if !raw.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.@:".contains(&b)) {
            self.fail(field, format!("may only contain {allowed}"));
        }
        raw.to_owned()
    }

    fn upper_code(&mut self, field: &str, raw: &str, len: usize, what: &str) -> String {
        if raw.len() != len || !raw.bytes().all(|b| b.is_ascii_uppercase()) {
            self.fail(field, format!("must be {what}"));
        }
        raw.to_owned()
    }

    fn postal_code(&mut self, field: &str, raw: &str) -> String {
        let t = raw.trim();
        if t.is_empty()
            || t.len() > 16
            || !t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b' ' || b == b'-')
        {
            self.fail(field, "must be 1 to 16 letters, digits, spaces or '-'");
        }
        t.to_owned()
    }

    fn range(&mut self, field: &str, value: i64, min: i64, max: i64) {
        if !(min..=max).contains(&value) {
            self.fail(field, format!("must be between {min} and {max}"));
        }
    }
}

fn is_disallowed_char(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
        || c == '\u{FEFF}'
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn valid() -> Value {
        json!({
            "customer_id": "cust-42",
            "currency": "EUR",
            "items": [
                {"sku": "BOOK-1", "quantity": 2, "unit_price": 1250},
                {"sku": "PEN-9", "quantity": 1, "unit_price": 300}
            ],
            "ship_to": {"name": " Ada Lovelace ", "line1": "12 St James's Square", "city": "London",
                        "postal_code": "SW1Y 4JH", "country": "GB"}
        })
    }

    fn check(body: &Value) -> Result<Order, Rejection> {
        Order::from_json(body.to_string().as_bytes())
    }

    fn fields(r: Rejection) -> Vec<String> {
        r.errors.into_iter().map(|e| e.field).collect()
    }

    #[test]
    fn a_valid_order_is_accepted_and_normalised() {
        let order = check(&valid()).unwrap();
        assert_eq!(order.ship_to.name, "Ada Lovelace");
        assert_eq!(order.total(), 2800);
        assert_eq!(order.items.len(), 2);
    }

    #[test]
    fn a_blank_second_address_line_is_absent() {
        for blank in ["", "   ", "\t"] {
            let mut b = valid();
            b["ship_to"]["line2"] = json!(blank);
            assert_eq!(check(&b).unwrap().ship_to.line2, None, "{blank:?}");
        }
        let mut b = valid();
        b["ship_to"]["line2"] = json!(" Flat 1 ");
        assert_eq!(check(&b).unwrap().ship_to.line2.as_deref(), Some("Flat 1"));
        b["ship_to"]["line2"] = json!("Flat\u{202E}1");
        assert_eq!(fields(check(&b).unwrap_err()), ["ship_to.line2"]);
    }

    #[test]
    fn text_limits_count_the_characters_as_sent() {
        let mut b = valid();
        b["ship_to"]["name"] = json!("é".repeat(100));
        assert!(check(&b).is_ok());
        // Trimming would bring it within the limit, but the limit is the one the schema states.
        b["ship_to"]["name"] = json!(format!(" {}", "é".repeat(100)));
        assert_eq!(fields(check(&b).unwrap_err()), ["ship_to.name"]);
        // A blank second line is absent only within the limit of a line.
        b["ship_to"]["name"] = json!("Ada");
        b["ship_to"]["line2"] = json!(" ".repeat(200));
        assert_eq!(check(&b).unwrap().ship_to.line2, None);
        b["ship_to"]["line2"] = json!(" ".repeat(201));
        assert_eq!(fields(check(&b).unwrap_err()), ["ship_to.line2"]);
    }

    #[test]
    fn decoding_errors_name_the_field() {
        let mut b = valid();
        b["items"][1]["quantity"] = json!("3");
        let r = check(&b).unwrap_err();
        assert_eq!(fields(r.clone()), ["items[1].quantity"]);
        assert!(r.errors[0].reason.contains("invalid type"), "{r}");

        let mut b = valid();
        b["ship_to"]["planet"] = json!("Mars");
        assert_eq!(fields(check(&b).unwrap_err()), ["ship_to.planet"]);

        let mut b = valid();
        b.as_object_mut().unwrap().remove("currency");
        let r = check(&b).unwrap_err();
        assert!(r.errors[0].reason.contains("missing field `currency`"), "{r}");

        let r = Order::from_json(b"{\"customer_id\": ").unwrap_err();
        assert!(r.errors[0].reason.starts_with("malformed JSON"), "{r}");
        let r = Order::from_json(b"[]").unwrap_err();
        assert_eq!(r.errors[0].field, "body");

        let body = valid().to_string();
        for broken in [format!("{body} x"), format!("{body}{body}"), body[..body.len() / 2].into()]
        {
            let r = Order::from_json(broken.as_bytes()).unwrap_err();
            assert_eq!(fields(r.clone()), ["body"]);
            assert!(r.errors[0].reason.starts_with("malformed JSON"), "{r}");
        }
        assert!(Order::from_json(format!(" {body}\n\t ").as_bytes()).is_ok());
    }

    #[test]
    fn every_limit_is_enforced_and_all_problems_are_reported() {
        let mut b = valid();
        b["currency"] = json!("eur");
        b["items"][0]["quantity"] = json!(0);
        b["items"][1]["unit_price"] = json!(-5);
        b["ship_to"]["country"] = json!("GBR");
        b["ship_to"]["city"] = json!("   ");
        let r = check(&b).unwrap_err();
        assert_eq!(
            fields(r),
            [
                "currency",
                "items[0].quantity",
                "items[1].unit_price",
                "ship_to.city",
                "ship_to.country"
            ]
        );
    }

    #[test]
    fn quantities_amounts_and_sizes_have_bounds() {
        type Mutation = Box<dyn Fn(&mut Value)>;
        let cases: Vec<(Mutation, &str)> = vec![
            (Box::new(|b| b["items"] = json!([])), "items"),
            (
                Box::new(|b| b["items"][0]["quantity"] = json!(MAX_QUANTITY + 1)),
                "items[0].quantity",
            ),
            (
                Box::new(|b| b["items"][0]["unit_price"] = json!(MAX_UNIT_PRICE + 1)),
                "items[0].unit_price",
            ),
            (Box::new(|b| b["items"][0]["quantity"] = json!(1.5)), "items[0].quantity"),
            (Box::new(|b| b["items"][0]["quantity"] = json!(u64::MAX)), "items[0].quantity"),
            (Box::new(|b| b["items"][1]["sku"] = json!("BOOK-1")), "items[1].sku"),
            (Box::new(|b| b["items"][1]["sku"] = json!("has space")), "items[1].sku"),
            (Box::new(|b| b["customer_id"] = json!("")), "customer_id"),
            (Box::new(|b| b["ship_to"]["name"] = json!("x".repeat(101))), "ship_to.name"),
            (Box::new(|b| b["ship_to"]["postal_code"] = json!("SW1Y_4JH")), "ship_to.postal_code"),
            (Box::new(|b| b["ship_to"]["line1"] = json!("evil\u{202E}txt")), "ship_to.line1"),
            (Box::new(|b| b["ship_to"]["line1"] = json!("nul\u{0}byte")), "ship_to.line1"),
            (
                Box::new(|b| {
                    b["items"] =
                        json!((0..MAX_ITEMS + 1)
                        .map(|i| json!({"sku": format!("S{i}"), "quantity": 1, "unit_price": 1}))
                        .collect::<Vec<_>>())
                }),
                "items",
            ),
            (
                Box::new(|b| {
                    b["items"] = json!((0..20)
                        .map(|i| json!({"sku": format!("S{i}"), "quantity": MAX_QUANTITY, "unit_price": MAX_UNIT_PRICE}))
                        .collect::<Vec<_>>())
                }),
                "items",
            ),
        ];
        for (i, (mutate, field)) in cases.into_iter().enumerate() {
            let mut b = valid();
            mutate(&mut b);
            let r = check(&b).expect_err(&format!("case {i} accepted"));
            assert_eq!(r.errors[0].field, field, "case {i}: {r}");
        }
    }

    #[test]
    fn unicode_text_is_measured_in_characters() {
        let mut b = valid();
        b["ship_to"]["name"] = json!("é".repeat(100));
        b["ship_to"]["city"] = json!("Zürich 🏔");
        assert!(check(&b).is_ok());
        b["ship_to"]["name"] = json!("é".repeat(101));
        assert!(check(&b).is_err());
    }
}
