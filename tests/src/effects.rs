//! The tests' assertion on what the business holds, per order and step, as
//! [`sas_infra::demo::effects`] counts it from the simulated service's ledger.

use std::collections::HashMap;

use serde_json::Value;

pub use sas_infra::demo::effects::mismatches;

/// The ends [`assert_effects_match`] expects: each of `ids` in `state`.
pub fn ended<T: ToString>(
    ids: impl IntoIterator<Item = T>,
    state: &str,
) -> HashMap<String, String> {
    ids.into_iter().map(|id| (id.to_string(), state.to_owned())).collect()
}

/// Asserts that each order holds what its end says: every step once if `Processed`, nothing
/// otherwise (compensated, cancelled); and that no step of any order is in place twice.
pub fn assert_effects_match(ledger: &Value, workflow_json: &str, ends: &HashMap<String, String>) {
    let wrong = mismatches(ledger, workflow_json, ends);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
