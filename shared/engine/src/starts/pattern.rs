//! EventBridge event patterns, matched in the engine: the stack's one rule takes every event
//! of its bus, and each workflow's declared patterns pick the events that start its orders.
//!
//! A pattern is a JSON object whose fields name the event's fields: an object goes down into
//! the event's object there, an array lists what the event's value may be (any of them; an
//! event's array matches if any of its elements does). Every field of the pattern must match.
//! The values are EventBridge's content filters: a literal (string, number, boolean, null),
//! `{"prefix"}`, `{"suffix"}`, `{"equals-ignore-case"}`, `{"wildcard"}` (`*` for any run of
//! characters), `{"anything-but"}` (a value, a list, or `{"prefix"}`/`{"suffix"}`),
//! `{"numeric": [op, n, ...]}` and `{"exists": bool}`. A pattern is checked when its workflow
//! loads: anything else is refused there, never met at run time.

use serde_json::{Map, Value};

/// A checked event pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pattern(Map<String, Value>);

impl Pattern {
    /// Checks `pattern`, naming the first field at fault.
    pub fn new(pattern: &Value) -> Result<Pattern, String> {
        let checked = Pattern::of_rule(pattern)?;
        let own = |v: &Value| v.as_str() == Some(super::OWN_SOURCE);
        if checked.0.get("source").and_then(Value::as_array).is_some_and(|s| s.iter().all(own)) {
            return Err(format!(
                "/source: only the stack's own events have source {}, and they never start an order: name the source of the events that should",
                super::OWN_SOURCE
            ));
        }
        Ok(checked)
    }

    /// Checks `pattern` as one of the stack's own rules holds it: unlike a start's, it may pick
    /// the stack's own events.
    pub fn of_rule(pattern: &Value) -> Result<Pattern, String> {
        let Value::Object(fields) = pattern else {
            return Err("an event pattern is a JSON object".into());
        };
        if fields.is_empty() {
            return Err("an event pattern names at least one field".into());
        }
        check_fields(fields, "")?;
        Ok(Pattern(fields.clone()))
    }

    /// Whether `event` (an EventBridge event: `source`, `detail-type`, `detail`, ...) matches.
    pub fn matches(&self, event: &Value) -> bool {
        matches_fields(&self.0, event)
    }
}

fn check_fields(fields: &Map<String, Value>, at: &str) -> Result<(), String> {
    for (name, value) in fields {
        let here = format!("{at}/{name}");
        match value {
            Value::Object(inner) if !inner.is_empty() => check_fields(inner, &here)?,
            Value::Array(values) if !values.is_empty() => {
                for v in values {
                    check_value(v).map_err(|e| format!("{here}: {e}"))?;
                }
            }
            _ => return Err(format!("{here}: a field holds a non-empty object or list")),
        }
    }
    Ok(())
}

fn check_value(value: &Value) -> Result<(), String> {
    let Value::Object(filter) = value else {
        return match value {
            Value::Array(_) => Err("a list inside a list".into()),
            _ => Ok(()),
        };
    };
    let (name, arg) = match filter.iter().next() {
        Some(one) if filter.len() == 1 => one,
        _ => return Err("a filter is an object of one field".into()),
    };
    let text = arg.is_string();
    let ok = match name.as_str() {
        "prefix" | "suffix" | "equals-ignore-case" | "wildcard" => text,
        "exists" => arg.is_boolean(),
        "numeric" => numeric_checked(arg)?,
        "anything-but" => match arg {
            Value::Array(values) => values.iter().all(|v| v.is_string() || v.is_number()),
            Value::Object(inner) => {
                inner.len() == 1
                    && inner
                        .iter()
                        .all(|(k, v)| matches!(k.as_str(), "prefix" | "suffix") && v.is_string())
            }
            Value::String(_) | Value::Number(_) => true,
            _ => false,
        },
        other => return Err(format!("the filter {other:?} is not one this stack matches")),
    };
    if ok { Ok(()) } else { Err(format!("{name}: {arg} is not what it takes")) }
}

/// Whether `arg` is a list of comparisons (`">", 0, "<=", 5`), at most two.
fn numeric_checked(arg: &Value) -> Result<bool, String> {
    let Value::Array(parts) = arg else { return Ok(false) };
    if parts.is_empty() || parts.len() % 2 != 0 || parts.len() > 4 {
        return Ok(false);
    }
    for pair in parts.chunks(2) {
        let op = pair[0].as_str().unwrap_or_default();
        if !matches!(op, "=" | "<" | "<=" | ">" | ">=") || !pair[1].is_number() {
            return Ok(false);
        }
    }
    Ok(true)
}

fn matches_fields(fields: &Map<String, Value>, event: &Value) -> bool {
    fields.iter().all(|(name, wanted)| {
        let found = event.get(name);
        match wanted {
            Value::Object(inner) => found.is_some_and(|f| matches_fields(inner, f)),
            Value::Array(values) => values.iter().any(|v| matches_value(v, found)),
            _ => false,
        }
    })
}

/// Whether `found` (absent: `None`) matches the filter `wanted`.
fn matches_value(wanted: &Value, found: Option<&Value>) -> bool {
    if let Value::Object(filter) = wanted
        && let Some((name, arg)) = filter.iter().next()
    {
        if name == "exists" {
            return arg.as_bool() == Some(found.is_some_and(|f| !f.is_object()));
        }
        // Only a field that is there matches anything but its absence.
        let Some(found) = found else { return false };
        return each(found).any(|v| filter_matches(name, arg, v));
    }
    found.is_some_and(|f| each(f).any(|v| same(wanted, v)))
}

/// The values an event's field stands for: each element of a list, or itself.
fn each(value: &Value) -> Box<dyn Iterator<Item = &Value> + '_> {
    match value {
        Value::Array(values) => Box::new(values.iter()),
        one => Box::new(std::iter::once(one)),
    }
}

fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

fn filter_matches(name: &str, arg: &Value, v: &Value) -> bool {
    let (text, pattern) = (v.as_str(), arg.as_str().unwrap_or_default());
    match name {
        "prefix" => text.is_some_and(|t| t.starts_with(pattern)),
        "suffix" => text.is_some_and(|t| t.ends_with(pattern)),
        "equals-ignore-case" => text.is_some_and(|t| t.to_lowercase() == pattern.to_lowercase()),
        "wildcard" => text.is_some_and(|t| wildcard(pattern, t)),
        "numeric" => v.as_f64().is_some_and(|n| numeric(arg, n)),
        "anything-but" => match arg {
            Value::Array(values) => !values.iter().any(|a| same(a, v)),
            Value::Object(inner) => inner.iter().all(|(k, p)| {
                let p = p.as_str().unwrap_or_default();
                match (k.as_str(), text) {
                    ("prefix", Some(t)) => !t.starts_with(p),
                    ("suffix", Some(t)) => !t.ends_with(p),
                    _ => false,
                }
            }),
            one => !same(one, v),
        },
        _ => false,
    }
}

fn numeric(arg: &Value, n: f64) -> bool {
    let parts = arg.as_array().map(Vec::as_slice).unwrap_or_default();
    parts.chunks(2).all(|pair| {
        let bound = pair.get(1).and_then(Value::as_f64).unwrap_or(f64::NAN);
        match pair[0].as_str() {
            Some("=") => n == bound,
            Some("<") => n < bound,
            Some("<=") => n <= bound,
            Some(">") => n > bound,
            Some(">=") => n >= bound,
            _ => false,
        }
    })
}

/// Whether `text` matches `pattern`, where `*` stands for any run of characters.
fn wildcard(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let [first, middle @ .., last] = parts.as_slice() else {
        return pattern == text;
    };
    let Some(mut rest) = text.strip_prefix(first) else { return false };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn event() -> Value {
        json!({
            "id": "7bf73129-1428-4cd3-a780-95db273d1602",
            "source": "shop.accounts",
            "detail-type": "TenantSignedUp",
            "detail": {"tenant": "acme", "plan": "premium", "seats": 12, "tags": ["eu", "beta"],
                       "region": "eu-west-1"}
        })
    }

    fn matches(pattern: Value) -> bool {
        Pattern::new(&pattern).unwrap().matches(&event())
    }

    #[test]
    fn literals_nested_fields_and_lists_match_as_eventbridge_matches_them() {
        assert!(matches(json!({"source": ["shop.accounts"], "detail-type": ["TenantSignedUp"]})));
        assert!(matches(json!({"detail": {"plan": ["basic", "premium"]}})));
        assert!(matches(json!({"detail": {"tags": ["beta"]}})), "any element of a list");
        assert!(matches(json!({"detail": {"seats": [12.0]}})), "numbers by value");
        assert!(!matches(json!({"source": ["shop.orders"]})));
        assert!(!matches(json!({"source": ["shop.accounts"], "detail": {"plan": ["basic"]}})));
        assert!(!matches(json!({"detail": {"missing": ["x"]}})));
    }

    #[test]
    fn each_filter_matches_what_it_says_and_no_more() {
        let cases = [
            (json!({"detail": {"region": [{"prefix": "eu-"}]}}), true),
            (json!({"detail": {"region": [{"suffix": "-1"}]}}), true),
            (json!({"detail": {"region": [{"prefix": "us-"}]}}), false),
            (json!({"detail": {"tenant": [{"equals-ignore-case": "ACME"}]}}), true),
            (json!({"detail": {"region": [{"wildcard": "eu-*-1"}]}}), true),
            (json!({"detail": {"region": [{"wildcard": "us-*"}]}}), false),
            (json!({"detail": {"plan": [{"anything-but": "basic"}]}}), true),
            (json!({"detail": {"plan": [{"anything-but": ["basic", "premium"]}]}}), false),
            (json!({"detail": {"plan": [{"anything-but": {"prefix": "pre"}}]}}), false),
            (json!({"detail": {"missing": [{"anything-but": "x"}]}}), false),
            (json!({"detail": {"seats": [{"numeric": [">", 10, "<=", 12]}]}}), true),
            (json!({"detail": {"seats": [{"numeric": [">=", 13]}]}}), false),
            (json!({"detail": {"tenant": [{"exists": true}]}}), true),
            (json!({"detail": {"missing": [{"exists": false}]}}), true),
            (json!({"detail": {"tenant": [{"exists": false}]}}), false),
        ];
        for (pattern, expected) in cases {
            assert_eq!(matches(pattern.clone()), expected, "{pattern}");
        }
    }

    #[test]
    fn a_pattern_this_stack_cannot_match_is_refused_at_load() {
        for (pattern, error) in [
            (json!([]), "a JSON object"),
            (json!({}), "at least one field"),
            (json!({"source": "shop"}), "/source: a field holds"),
            (json!({"source": ["sas.orders"]}), "/source: only the stack's own events"),
            (json!({"source": []}), "/source: a field holds"),
            (json!({"detail": {"ip": [{"cidr": "10.0.0.0/24"}]}}), "\"cidr\" is not one"),
            (json!({"detail": {"n": [{"numeric": [">"]}]}}), "numeric"),
            (json!({"detail": {"n": [{"prefix": 3}]}}), "prefix"),
        ] {
            let e = Pattern::new(&pattern).unwrap_err();
            assert!(e.contains(error), "{pattern}: {e}");
        }
    }

    #[test]
    fn a_rule_of_the_stack_may_pick_its_own_events_and_is_checked_as_a_start_is() {
        let own = json!({"source": ["sas.orders"], "detail-type": ["OrderStatusChanged"]});
        let rule = Pattern::of_rule(&own).unwrap();
        let event = json!({"source": "sas.orders", "detail-type": "OrderStatusChanged"});
        assert!(rule.matches(&event));
        assert!(!rule.matches(&json!({"source": "sas.orders", "detail-type": "Other"})));
        let e = Pattern::of_rule(&json!({"source": "sas.orders"})).unwrap_err();
        assert!(e.contains("/source: a field holds"), "{e}");
    }
}
