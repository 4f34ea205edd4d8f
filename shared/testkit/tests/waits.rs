//! A workflow that waits a year, then for a person's approval: the kit answers the approval
//! (and, while the faults last, forges tokens, refuses and keeps it alive), and jumps the
//! clock from one deadline to the next, so a year's wait takes a few sweeps.

#![allow(clippy::unwrap_used)]

use sas_agent_kit::{RemoteCall, RemoteFault, RemoteService};
use sas_testkit::{Kit, Ledger};
use serde_json::{Value, json};

const WORKFLOW: &str = r#"{
  "name": "yearly-renewal",
  "version": 1,
  "steps": [
    {"name": "reserve", "agent": "seats", "budget_seconds": 20,
     "compensation": {"action": "release", "budget_seconds": 20}},
    {"name": "a-year", "wait": {"seconds": 31536000}, "depends_on": ["reserve"]},
    {"name": "approval", "callback": {"timeout_seconds": 172800}, "depends_on": ["a-year"]},
    {"name": "renew", "agent": "seats", "budget_seconds": 20, "depends_on": ["approval"]}
  ],
  "input_schema": {"type": "object", "required": ["seat"],
                   "properties": {"seat": {"type": "string"}}}
}"#;

/// Seats, recorded in the ledger as they are reserved, released and renewed.
struct Seats {
    ledger: Ledger,
}

impl RemoteService for Seats {
    async fn call(&self, call: &RemoteCall) -> Result<Value, RemoteFault> {
        let seat = call.order.input()["seat"].as_str().unwrap_or_default().to_owned();
        // The key's step names each effect: a call repeated is the same effect.
        let effect = format!("{} {seat}", call.action);
        let effects = self.ledger.effects();
        let done = effects.iter().any(|e| e.key == call.idempotency_key);
        match call.action.as_str() {
            "reserve" | "renew" if !done => self.ledger.apply(call, effect),
            "release" if !done => {
                let reserved = format!("reserve {seat}");
                if self.ledger.in_place().contains_key(&reserved) {
                    self.ledger.undo(call, reserved);
                }
            }
            _ => {}
        }
        Ok(json!({ "seat": seat }))
    }
}

#[test]
fn a_year_long_wait_and_an_approval_end_in_a_renewal_or_a_release() {
    let started = std::time::Instant::now();
    let report = Kit::new()
        .workflow("yearly-renewal.json", WORKFLOW)
        .agent("seats", |ledger: &Ledger| Seats { ledger: ledger.clone() })
        .answering(|step, input| json!({ "approved": step, "seat": input["seat"] }))
        .orders(4, |i| json!({ "seat": format!("s-{i}") }))
        .seeds(0..50)
        .check();
    assert!(report.processed > 0, "{report}");
    assert!(report.injected.get("answer").is_some_and(|n| *n > 0), "{report}");
    eprintln!("50 seeds of a year's wait in {:?}", started.elapsed());
}
