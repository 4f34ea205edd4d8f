//! What the simulated service's ledger (`GET /ledger`) says the business holds, counted as the
//! business counts it: for each order and each step of the workflow, the applications of the
//! step's action minus those of its undo that undid something, whatever idempotency keys they
//! came with. A second key for the same step shows as a step in place twice, which no count per
//! key can see.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

/// Each step's action and its undo's, from a workflow's JSON.
fn steps(workflow_json: &str) -> Vec<(String, Option<String>)> {
    let workflow: Value = serde_json::from_str(workflow_json).unwrap();
    workflow["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let action = s["name"].as_str().unwrap().to_owned();
            (action, s["compensation"]["action"].as_str().map(str::to_owned))
        })
        .collect()
}

/// (order id, step) → effects in place, for every order the ledger names.
pub fn in_place(ledger: &Value, workflow_json: &str) -> BTreeMap<(String, String), i64> {
    let steps = steps(workflow_json);
    let mut counts = BTreeMap::new();
    for e in ledger["effects"].as_array().unwrap() {
        if e["output"].get("noop").is_some() {
            continue;
        }
        let (action, undo) = (e["action"].as_str().unwrap(), e["direction"] == "undo");
        let step = steps.iter().find(
            |(a, u)| {
                if undo { u.as_deref() == Some(action) } else { a == action }
            },
        );
        let Some((step, _)) = step else { continue };
        let sign = if undo { -1 } else { 1 };
        *counts.entry((e["order_id"].as_str().unwrap().to_owned(), step.clone())).or_default() +=
            sign * e["applications"].as_i64().unwrap();
    }
    counts
}

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

/// What [`assert_effects_match`] finds wrong, one line each; empty if nothing.
pub fn mismatches(
    ledger: &Value,
    workflow_json: &str,
    ends: &HashMap<String, String>,
) -> Vec<String> {
    let counts = in_place(ledger, workflow_json);
    let mut wrong = Vec::new();
    for ((order, step), n) in &counts {
        if !(0..=1).contains(n) {
            wrong.push(format!("{order}: {step} in place {n} times"));
        }
    }
    let mut ends: Vec<_> = ends.iter().collect();
    ends.sort();
    for (order, state) in ends {
        for (step, _) in steps(workflow_json) {
            let n = counts.get(&(order.clone(), step.clone())).copied().unwrap_or(0);
            if n != i64::from(state == "Processed") {
                wrong.push(format!("{order} ended {state} with {step} in place {n} times"));
            }
        }
    }
    wrong
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const WORKFLOW: &str =
        r#"{"steps":[{"name":"charge","compensation":{"action":"refund"}},{"name":"ship"}]}"#;

    fn effect(order: &str, action: &str, direction: &str, applications: u32, noop: bool) -> Value {
        let output = if noop { json!({"ref": "r", "noop": true}) } else { json!({"ref": "r"}) };
        json!({"order_id": order, "action": action, "direction": direction,
               "applications": applications, "output": output, "key": "any"})
    }

    #[test]
    fn steps_are_counted_whatever_their_keys_and_undos_of_nothing_count_nothing() {
        let ledger = json!({"effects": [
            effect("o1", "charge", "do", 1, false),
            effect("o1", "charge", "do", 1, false),
            effect("o2", "charge", "do", 1, false),
            effect("o2", "refund", "undo", 1, false),
            effect("o3", "refund", "undo", 1, true),
            effect("o4", "ship", "do", 2, false),
        ]});
        let counts = in_place(&ledger, WORKFLOW);
        assert_eq!(counts[&("o1".into(), "charge".into())], 2, "two keys, two charges");
        assert_eq!(counts[&("o2".into(), "charge".into())], 0);
        assert!(!counts.contains_key(&("o3".into(), "charge".into())));
        assert_eq!(counts[&("o4".into(), "ship".into())], 2, "a key applied twice");
    }

    #[test]
    #[should_panic(expected = "charge in place 2 times")]
    fn a_step_in_place_twice_fails_the_check() {
        let ledger = json!({"effects": [
            effect("o1", "charge", "do", 1, false),
            effect("o1", "charge", "do", 1, false),
        ]});
        assert_effects_match(&ledger, WORKFLOW, &HashMap::new());
    }

    #[test]
    #[should_panic(expected = "o1 ended Processed with ship in place 0 times")]
    fn a_processed_order_missing_a_step_fails_the_check() {
        let ledger = json!({"effects": [effect("o1", "charge", "do", 1, false)]});
        let ends = HashMap::from([("o1".to_owned(), "Processed".to_owned())]);
        assert_effects_match(&ledger, WORKFLOW, &ends);
    }
}
