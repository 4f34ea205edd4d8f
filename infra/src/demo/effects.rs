//! What the simulated service's ledger (`GET /ledger`) says the business holds, counted as the
//! business counts it: for each order and each step of the workflow, the applications of the
//! step's action minus those of its undo that undid something, whatever idempotency keys they
//! came with. A second key for the same step shows as a step in place twice, which no count per
//! key can see. The demo judges its run with it, and the end-to-end tests theirs.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

/// Each step's action and its undo's, from a workflow's JSON (none if it does not parse); a
/// step that waits, for a time or for an answer, calls no service and is left out.
fn steps(workflow_json: &str) -> Vec<(String, Option<String>)> {
    let workflow: Value = serde_json::from_str(workflow_json).unwrap_or(Value::Null);
    let steps = workflow["steps"].as_array().map(Vec::as_slice).unwrap_or_default();
    steps
        .iter()
        .filter_map(|s| {
            s["agent"].as_str()?;
            let action = s["name"].as_str()?.to_owned();
            Some((action, s["compensation"]["action"].as_str().map(str::to_owned)))
        })
        .collect()
}

/// (order id, step) → effects in place, for every order the ledger names.
pub fn in_place(ledger: &Value, workflow_json: &str) -> BTreeMap<(String, String), i64> {
    count(ledger, &steps(workflow_json))
}

fn count(ledger: &Value, steps: &[(String, Option<String>)]) -> BTreeMap<(String, String), i64> {
    let mut counts = BTreeMap::new();
    let effects = ledger["effects"].as_array().map(Vec::as_slice).unwrap_or_default();
    for e in effects {
        if e["output"].get("noop").is_some() {
            continue;
        }
        let (action, undo) = (e["action"].as_str().unwrap_or_default(), e["direction"] == "undo");
        let step = steps.iter().find(
            |(a, u)| {
                if undo { u.as_deref() == Some(action) } else { a == action }
            },
        );
        let Some((step, _)) = step else { continue };
        let sign = if undo { -1 } else { 1 };
        let order = e["order_id"].as_str().unwrap_or_default().to_owned();
        *counts.entry((order, step.clone())).or_default() +=
            sign * e["applications"].as_i64().unwrap_or(1);
    }
    counts
}

/// How an order ended, for [`mismatches_of`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct End {
    pub workflow: String,
    /// `Processed`, `Compensated` or `Cancelled`.
    pub state: String,
    /// The steps of a processed order whose failures were only reported, with their status
    /// (`failed`: nothing took effect; `done`: in place; `uncertain`: either).
    pub reported: Vec<(String, String)>,
}

impl End {
    pub fn new(workflow: &str, state: &str) -> End {
        End { workflow: workflow.to_owned(), state: state.to_owned(), reported: Vec::new() }
    }

    /// How many times `step` must be in place; `None` if either 0 or 1 may be.
    fn expected(&self, step: &str) -> Option<i64> {
        if self.state != "Processed" {
            return Some(0);
        }
        match self.reported.iter().find(|(s, _)| s == step).map(|(_, status)| status.as_str()) {
            None | Some("done") => Some(1),
            Some("failed") => Some(0),
            Some(_) => None,
        }
    }
}

/// What is wrong with what the business holds, one line each (empty if nothing): any step of
/// any order in place other than 0 or 1 times; and, for each order in `ends`, every step once if
/// its end is `Processed`, and nothing for any other end (compensated, cancelled).
pub fn mismatches(
    ledger: &Value,
    workflow_json: &str,
    ends: &HashMap<String, String>,
) -> Vec<String> {
    let name = "workflow".to_owned();
    let ends = ends.iter().map(|(o, e)| (o.clone(), End::new(&name, e))).collect();
    mismatches_of(ledger, &[(name, workflow_json.to_owned())], &ends)
}

/// As [`mismatches`], for orders of several workflows: `workflows` by name, and each order's
/// end. The workflows' actions must not share names. A processed order's step whose failure
/// was only reported is held to what its status says.
pub fn mismatches_of(
    ledger: &Value,
    workflows: &[(String, String)],
    ends: &HashMap<String, End>,
) -> Vec<String> {
    let all: Vec<_> = workflows.iter().flat_map(|(_, json)| steps(json)).collect();
    let counts = count(ledger, &all);
    let mut wrong = Vec::new();
    for ((order, step), n) in &counts {
        if !(0..=1).contains(n) {
            wrong.push(format!("{order}: {step} in place {n} times"));
        }
    }
    let mut ends: Vec<_> = ends.iter().collect();
    ends.sort_by(|a, b| a.0.cmp(b.0));
    for (order, end) in ends {
        let Some((_, json)) = workflows.iter().find(|(name, _)| *name == end.workflow) else {
            wrong.push(format!("{order} runs {}, which the count does not know", end.workflow));
            continue;
        };
        for (step, _) in steps(json) {
            let n = counts.get(&(order.clone(), step.clone())).copied().unwrap_or(0);
            if end.expected(&step).is_some_and(|expected| n != expected) {
                wrong.push(format!("{order} ended {} with {step} in place {n} times", end.state));
            }
        }
    }
    wrong
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const WORKFLOW: &str = r#"{"steps":[{"name":"charge","agent":"a","compensation":{"action":"refund"}},{"name":"ship","agent":"a"}]}"#;

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
    fn a_step_in_place_twice_is_wrong_whatever_the_order_s_end() {
        let ledger = json!({"effects": [
            effect("o1", "charge", "do", 1, false),
            effect("o1", "charge", "do", 1, false),
        ]});
        assert_eq!(mismatches(&ledger, WORKFLOW, &HashMap::new()), ["o1: charge in place 2 times"]);
    }

    #[test]
    fn each_order_is_held_to_its_own_workflow_s_steps() {
        let other = r#"{"steps":[{"name":"open","agent":"a","compensation":{"action":"close"}}]}"#;
        let ledger = json!({"effects": [
            effect("o1", "charge", "do", 1, false),
            effect("o1", "ship", "do", 1, false),
            effect("o2", "open", "do", 1, false),
            effect("o3", "open", "do", 1, false),
            effect("o3", "close", "undo", 1, false),
        ]});
        let workflows =
            [("shop".to_owned(), WORKFLOW.to_owned()), ("bank".to_owned(), other.to_owned())];
        let ends = HashMap::from([
            ("o1".to_owned(), End::new("shop", "Processed")),
            ("o2".to_owned(), End::new("bank", "Processed")),
            ("o3".to_owned(), End::new("bank", "Compensated")),
        ]);
        assert_eq!(mismatches_of(&ledger, &workflows, &ends), Vec::<String>::new());
        let wrong = HashMap::from([("o2".to_owned(), End::new("shop", "Processed"))]);
        assert_eq!(mismatches_of(&ledger, &workflows, &wrong).len(), 2, "charge and ship missing");
    }

    #[test]
    fn a_reported_step_of_a_processed_order_is_held_to_its_status() {
        let ledger = json!({"effects": [effect("o1", "charge", "do", 1, false)]});
        let workflows = [("shop".to_owned(), WORKFLOW.to_owned())];
        let with = |status: &str| {
            let reported = vec![("ship".to_owned(), status.to_owned())];
            let end = End { reported, ..End::new("shop", "Processed") };
            HashMap::from([("o1".to_owned(), end)])
        };
        assert!(mismatches_of(&ledger, &workflows, &with("failed")).is_empty());
        assert!(mismatches_of(&ledger, &workflows, &with("uncertain")).is_empty());
        assert_eq!(
            mismatches_of(&ledger, &workflows, &with("done")),
            ["o1 ended Processed with ship in place 0 times"]
        );
        let shipped = json!({"effects": [
            effect("o1", "charge", "do", 1, false),
            effect("o1", "ship", "do", 1, false),
        ]});
        assert_eq!(
            mismatches_of(&shipped, &workflows, &with("failed")),
            ["o1 ended Processed with ship in place 1 times"],
            "refused, yet in place"
        );
    }

    #[test]
    fn an_end_needs_its_own_ledger_shape() {
        let ledger = json!({"effects": [effect("o1", "charge", "do", 1, false)]});
        let processed = HashMap::from([("o1".to_owned(), "Processed".to_owned())]);
        assert_eq!(
            mismatches(&ledger, WORKFLOW, &processed),
            ["o1 ended Processed with ship in place 0 times"]
        );
        let compensated = HashMap::from([("o1".to_owned(), "Compensated".to_owned())]);
        assert_eq!(
            mismatches(&ledger, WORKFLOW, &compensated),
            ["o1 ended Compensated with charge in place 1 times"]
        );
    }
}
