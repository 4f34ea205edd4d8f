//! What an order is: the input it was submitted with, already checked against its workflow's
//! JSON Schema ([`crate::workflow::Workflow::input`]), and what a refused input gets back.
//!
//! A [`Rejection`] lists every problem found, each naming its JSON pointer (`/items/2/quantity`;
//! the empty pointer is the whole input), so a client can fix a request in one round trip. An
//! order's input is compared as a whole when an idempotency key is reused.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One problem with a request: the JSON pointer of the value at fault, and why.
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
    /// A rejection with one problem.
    pub fn one(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Rejection { errors: vec![FieldError { field: field.into(), reason: reason.into() }] }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            let field = if e.field.is_empty() { "(the input)" } else { &e.field };
            write!(f, "{field}: {}", e.reason)?;
        }
        Ok(())
    }
}

/// What a workflow reads from an order's input to sort it (a concurrency key, a tenant): the
/// value at `pointer`, a non-empty string of at most `max_len` bytes or an integer, as a string.
/// `noun` and `what` name it in a refusal ("key", "a concurrency key"); `missing` is the
/// refusal of an input without it.
pub fn token_at(
    input: &Value,
    pointer: &str,
    (noun, what): (&str, &str),
    max_len: usize,
    missing: String,
) -> Result<String, Rejection> {
    let refuse = |why: String| Err(Rejection::one(pointer, why));
    let value = match input.pointer(pointer) {
        None | Some(Value::Null) => return refuse(missing),
        Some(Value::String(s)) if s.is_empty() => return refuse(format!("an empty {noun}")),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => n.to_string(),
        Some(_) => return refuse(format!("{what} is a string or an integer")),
    };
    if value.len() > max_len {
        return refuse(format!("{what} is at most {max_len} bytes"));
    }
    Ok(value)
}

/// An order's input, valid for its workflow. It is what every step's request carries as
/// `order`; its shape is the workflow's to define.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Order(pub Value);

impl Order {
    /// The order's JSON input, as the client submitted it and the workflow's schema accepted.
    pub fn input(&self) -> &Value {
        &self.0
    }
}
