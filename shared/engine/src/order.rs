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
