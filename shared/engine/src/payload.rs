//! Large values, kept outside the state record and the messages.
//!
//! An order's input above [`MAX_INLINE_INPUT_LEN`] bytes of JSON, or a step's output above
//! [`MAX_OUTPUT_LEN`], is written once to a payload store ([`Payloads`]: S3 on AWS) under the
//! order's own prefix and named by its SHA-256; the record, the requests, the replies and the
//! events carry only a small reference to it, `{"$stored": {"key", "bytes", "sha256"}}`. So the
//! normal path (small values) costs exactly what it did, a record never nears DynamoDB's item
//! limit, and a request carrying the outputs of ten earlier steps stays a few kilobytes.
//!
//! Only the agents (and whoever shows an order to its owner) read a stored value back, just
//! before they need it; the scheduler and the supervisor never do. A value is read back only
//! under its own order's prefix and only if its digest matches, so a reference forged in an
//! input or an answer can neither reach another order's values nor pass a changed one off.
//!
//! A value that is itself shaped like a reference is always stored, so that whatever reads a
//! reference back gets exactly what was written.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::ids::OrderId;
use crate::message::MAX_OUTPUT_LEN;
use crate::ports::Payloads;

/// The largest input or step output accepted, in bytes of JSON: what Step Functions carries
/// per state.
pub const MAX_PAYLOAD_LEN: usize = 256 * 1024;

/// The largest input kept in the orders table and carried in every request, in bytes of
/// JSON: one DynamoDB read unit, and a request far from any SQS billing step. A larger input
/// is stored.
pub const MAX_INLINE_INPUT_LEN: usize = 4 * 1024;

/// The field that marks a reference.
const MARK: &str = "$stored";

/// Where a stored value is, how large it is, and its digest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stored {
    /// The object's key in the payload store: `orders/<order id>/<sha256>`.
    pub key: String,
    /// Its length in bytes of JSON.
    pub bytes: u64,
    /// The SHA-256 of those bytes, in lowercase hex.
    pub sha256: String,
}

impl Stored {
    /// The reference `value` carries, if it is one.
    pub fn of(value: &Value) -> Option<Stored> {
        let Value::Object(fields) = value else { return None };
        if fields.len() != 1 {
            return None;
        }
        serde_json::from_value(fields.get(MARK)?.clone()).ok()
    }

    /// The JSON that stands for the stored value.
    pub fn to_value(&self) -> Value {
        serde_json::json!({ MARK: self })
    }
}

/// Whether `value` is shaped like a reference (whether or not a valid one).
pub fn is_reference(value: &Value) -> bool {
    matches!(value, Value::Object(fields) if fields.len() == 1 && fields.contains_key(MARK))
}

/// What [`keep`] made of a value.
#[derive(Clone, Debug, PartialEq)]
pub enum Kept {
    /// Small enough to carry: the value itself.
    Inline(Value),
    /// Written to the store: the reference to carry instead.
    Stored(Value),
    /// Larger than [`MAX_PAYLOAD_LEN`]: neither carried nor stored.
    TooLarge { bytes: u64 },
}

/// Keeps `value` of order `order_id`: as it is if it serialises to at most `inline` bytes (and
/// does not look like a reference), otherwise written to `store` and replaced by a reference.
/// A store that stores nothing keeps every value inline, up to `inline`.
pub async fn keep<P: Payloads>(
    store: &P,
    order_id: OrderId,
    value: Value,
    inline: usize,
) -> Result<Kept> {
    let body = serde_json::to_vec(&value).unwrap_or_default();
    let bytes = body.len() as u64;
    if body.len() <= inline && !is_reference(&value) {
        return Ok(Kept::Inline(value));
    }
    if body.len() > MAX_PAYLOAD_LEN || !store.stores() {
        return Ok(Kept::TooLarge { bytes });
    }
    let sha256 = hex(&Sha256::digest(&body));
    let stored = Stored { key: format!("{}{sha256}", prefix(order_id)), bytes, sha256 };
    // The key names the content, so writing it again (a retried call, a redelivered request)
    // writes the same object.
    store.put(&stored.key, body).await?;
    Ok(Kept::Stored(stored.to_value()))
}

/// The value `value` stands for: itself, or for a reference, the stored value it names, read
/// back from `store` and checked against its digest. A reference outside `order_id`'s prefix,
/// a missing object or a changed one is [`Error::Corrupt`].
pub async fn resolve<P: Payloads>(store: &P, order_id: OrderId, value: &Value) -> Result<Value> {
    if !is_reference(value) {
        return Ok(value.clone());
    }
    let corrupt = |reason: String| Error::Corrupt { order_id, reason };
    let stored = Stored::of(value).ok_or_else(|| corrupt("a malformed stored reference".into()))?;
    if !stored.key.starts_with(&prefix(order_id)) {
        return Err(corrupt(format!(
            "a reference to {:?}, outside the order's values",
            stored.key
        )));
    }
    let body = store
        .get(&stored.key)
        .await?
        .ok_or_else(|| corrupt(format!("the stored value {:?} is gone", stored.key)))?;
    if body.len() as u64 != stored.bytes || hex(&Sha256::digest(&body)) != stored.sha256 {
        return Err(corrupt(format!("the stored value {:?} is not the one written", stored.key)));
    }
    serde_json::from_slice(&body)
        .map_err(|e| corrupt(format!("the stored value {:?} is not JSON: {e}", stored.key)))
}

/// The field a reference is given, in a view of whole values, when its value cannot be read
/// back: why.
pub const UNREADABLE: &str = "unreadable";

/// Why a stored value could not be read back, for its reader: the error's own words, without
/// the record's id it names already.
pub fn unreadable(error: &Error) -> String {
    match error {
        Error::Corrupt { reason, .. } => {
            format!("{reason} (values are kept for the stack's PayloadRetentionDays)")
        }
        other => other.to_string(),
    }
}

/// Keeps a step's output: inline up to [`MAX_OUTPUT_LEN`] bytes, stored above.
pub async fn keep_output<P: Payloads>(store: &P, order_id: OrderId, output: Value) -> Result<Kept> {
    keep(store, order_id, output, MAX_OUTPUT_LEN).await
}

/// The prefix every stored value of `order_id` has: its lifecycle and its grants are by it.
pub fn prefix(order_id: OrderId) -> String {
    format!("orders/{order_id}/")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A payload store that stores nothing: every value is carried inline, and a larger one is
/// too large. For the services of a deployment without a payload bucket.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoPayloads;

impl Payloads for NoPayloads {
    fn stores(&self) -> bool {
        false
    }

    async fn put(&self, key: &str, _body: Vec<u8>) -> Result<()> {
        Err(Error::Config(format!("no payload store to write {key} to")))
    }

    async fn get(&self, _key: &str) -> Result<Option<Vec<u8>>> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::IdempotencyKey;
    use std::collections::HashMap;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Shelf(Mutex<HashMap<String, Vec<u8>>>);

    impl Payloads for Shelf {
        async fn put(&self, key: &str, body: Vec<u8>) -> Result<()> {
            self.0.lock().unwrap().insert(key.to_owned(), body);
            Ok(())
        }
        async fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
            Ok(self.0.lock().unwrap().get(key).cloned())
        }
    }

    fn order(key: &str) -> OrderId {
        OrderId::for_key(&IdempotencyKey::parse(key).unwrap())
    }

    fn run<T>(f: impl Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
    }

    #[test]
    fn small_values_stay_inline_and_large_ones_come_back_whole() {
        run(async {
            let shelf = Shelf::default();
            let id = order("k1");
            let small = serde_json::json!({ "label": "ok" });
            assert_eq!(keep_output(&shelf, id, small.clone()).await.unwrap(), Kept::Inline(small));

            let large = serde_json::json!({ "label": "x".repeat(100_000) });
            let Kept::Stored(reference) = keep_output(&shelf, id, large.clone()).await.unwrap()
            else {
                panic!("a 100 kB output is stored")
            };
            assert!(reference.to_string().len() <= MAX_OUTPUT_LEN, "{reference}");
            let stored = Stored::of(&reference).unwrap();
            assert!(stored.key.starts_with(&prefix(id)) && stored.bytes > 100_000);
            assert_eq!(resolve(&shelf, id, &reference).await.unwrap(), large);
            assert_eq!(shelf.0.lock().unwrap().len(), 1);
        });
    }

    #[test]
    fn a_value_shaped_like_a_reference_is_stored_so_it_reads_back_as_itself() {
        run(async {
            let shelf = Shelf::default();
            let id = order("k1");
            let lookalike = serde_json::json!({ "$stored": { "anything": 1 } });
            let Kept::Stored(reference) = keep_output(&shelf, id, lookalike.clone()).await.unwrap()
            else {
                panic!("a look-alike is stored")
            };
            assert_eq!(resolve(&shelf, id, &reference).await.unwrap(), lookalike);
        });
    }

    #[test]
    fn a_reference_reads_only_its_own_orders_unchanged_values() {
        run(async {
            let shelf = Shelf::default();
            let (mine, theirs) = (order("mine"), order("theirs"));
            let large = serde_json::json!("y".repeat(2_000));
            let Kept::Stored(reference) = keep_output(&shelf, theirs, large).await.unwrap() else {
                panic!()
            };
            let err = resolve(&shelf, mine, &reference).await.unwrap_err().to_string();
            assert!(err.contains("outside the order's values"), "{err}");

            let key = Stored::of(&reference).unwrap().key;
            shelf.0.lock().unwrap().get_mut(&key).unwrap()[3] = b'z';
            let err = resolve(&shelf, theirs, &reference).await.unwrap_err().to_string();
            assert!(err.contains("not the one written"), "{err}");

            shelf.0.lock().unwrap().clear();
            let err = resolve(&shelf, theirs, &reference).await.unwrap_err().to_string();
            assert!(err.contains("is gone"), "{err}");
        });
    }

    #[test]
    fn above_the_limit_or_without_a_store_a_value_is_too_large_and_nothing_is_written() {
        run(async {
            let shelf = Shelf::default();
            let id = order("k1");
            let huge = serde_json::json!("z".repeat(MAX_PAYLOAD_LEN));
            assert!(matches!(
                keep_output(&shelf, id, huge).await.unwrap(),
                Kept::TooLarge { bytes } if bytes > MAX_PAYLOAD_LEN as u64
            ));
            assert!(shelf.0.lock().unwrap().is_empty());
            let large = serde_json::json!("z".repeat(1_000));
            assert!(matches!(
                keep_output(&NoPayloads, id, large).await.unwrap(),
                Kept::TooLarge { bytes: 1_002 }
            ));
        });
    }
}
