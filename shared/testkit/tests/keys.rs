//! One order at a time per account: a workflow with a concurrency key, its orders of two
//! accounts submitted together. The kit holds every seed to the key's limit: no more of an
//! account's orders running than its limit, none running without its place, every place given
//! back once all ended, and orders waiting in line while their account's place is taken.

#![allow(clippy::unwrap_used)]

use sas_agent_kit::{Direction, RemoteCall, RemoteFault, RemoteService};
use sas_testkit::{Kit, Ledger, StandIn};
use serde_json::{Value, json};

const WORKFLOW: &str = r#"{
  "name": "top-up",
  "version": 1,
  "concurrency": {"key": "/input/account", "limit": 1},
  "steps": [
    {"name": "hold-funds", "agent": "bank", "budget_seconds": 20,
     "compensation": {"action": "release-funds", "budget_seconds": 20}},
    {"name": "credit", "agent": "wallet", "budget_seconds": 20, "depends_on": ["hold-funds"]}
  ],
  "input_schema": {"type": "object", "required": ["account"],
                   "properties": {"account": {"type": "string"}}}
}"#;

/// Funds held per order, recorded in the ledger under the account.
struct Bank {
    ledger: Ledger,
}

impl RemoteService for Bank {
    async fn call(&self, call: &RemoteCall) -> Result<Value, RemoteFault> {
        let account = call.order.input()["account"].as_str().unwrap_or_default();
        let effect = format!("funds of {account} held by {}", call.order_id);
        let in_place = self.ledger.in_place().contains_key(&effect);
        let undone = self
            .ledger
            .effects()
            .iter()
            .any(|e| e.name == effect && e.direction == Direction::Undo);
        match call.action.as_str() {
            "hold-funds" if undone => {
                Err(RemoteFault::Permanent("cancelled: already undone".into()))
            }
            "hold-funds" if !in_place => {
                self.ledger.apply(call, effect);
                Ok(json!({}))
            }
            "release-funds" if in_place => {
                self.ledger.undo(call, effect);
                Ok(json!({}))
            }
            _ => Ok(json!({})),
        }
    }
}

#[test]
fn an_account_runs_one_order_at_a_time_whatever_fails() {
    let report = Kit::new()
        .workflow("top-up.json", WORKFLOW)
        .agent("bank", |ledger: &Ledger| Bank { ledger: ledger.clone() })
        .stand_in("wallet", StandIn::new().refusing("credit", 0.2))
        .orders(6, |i| json!({ "account": format!("a-{}", i % 2) }))
        .seeds(0..100)
        .check();
    assert!(report.processed > 0 && report.compensated > 0 && report.in_line > 0, "{report}");
}
