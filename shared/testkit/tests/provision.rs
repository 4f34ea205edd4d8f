//! A three-step workflow as a team writes one: a bucket made by its own Rust agent, a domain
//! registered at a partner's HTTP API (a stand-in that refuses some domains and goes down for
//! a spell), and a welcome mail whose failure is only reported. Whatever fails, every bucket
//! and domain of an order undone is gone, once, the domain before the bucket it points at.
//!
//! `KIT_SEEDS=1000 cargo test -p sas-testkit --test provision` runs 1,000 seeds.

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use sas_agent_kit::{RemoteCall, RemoteFault, RemoteService};
use sas_testkit::{Kit, Ledger, StandIn};
use serde_json::{Value, json};

const WORKFLOW: &str = r#"{
  "name": "provision-tenant",
  "version": 1,
  "steps": [
    {"name": "create-bucket", "agent": "storage", "budget_seconds": 30,
     "compensation": {"action": "delete-bucket", "budget_seconds": 30}},
    {"name": "register-domain", "agent": "dns", "budget_seconds": 30, "depends_on": ["create-bucket"],
     "compensation": {"action": "release-domain", "budget_seconds": 30}},
    {"name": "welcome", "agent": "mailer", "budget_seconds": 20, "on_failure": "report",
     "depends_on": ["register-domain"]}
  ],
  "input_schema": {"type": "object", "required": ["tenant"],
                   "properties": {"tenant": {"type": "string", "pattern": "^[a-z0-9-]{1,40}$"}}}
}"#;

/// Buckets, one per tenant, named after it; an undo leaves a marker so that a late create of
/// the same step is refused.
struct Storage {
    ledger: Ledger,
    buckets: Mutex<HashSet<String>>,
    undone: Mutex<HashSet<String>>,
}

impl RemoteService for Storage {
    async fn call(&self, call: &RemoteCall) -> Result<Value, RemoteFault> {
        let tenant = call.order.input()["tenant"].as_str().unwrap_or_default();
        let bucket = format!("tenant-{tenant}");
        match call.action.as_str() {
            "create-bucket" => {
                if self.undone.lock().unwrap().contains(&call.order_id.to_string()) {
                    return Err(RemoteFault::Permanent("cancelled: already undone".into()));
                }
                if self.buckets.lock().unwrap().insert(bucket.clone()) {
                    self.ledger.apply(call, format!("bucket {bucket}"));
                }
                Ok(json!({ "bucket": bucket }))
            }
            "delete-bucket" => {
                self.undone.lock().unwrap().insert(call.order_id.to_string());
                if self.buckets.lock().unwrap().remove(&bucket) {
                    self.ledger.undo(call, format!("bucket {bucket}"));
                }
                Ok(json!({ "deleted": bucket }))
            }
            other => Err(RemoteFault::Permanent(format!("no action {other}"))),
        }
    }
}

fn kit() -> Kit {
    Kit::new()
        .workflow("provision-tenant.json", WORKFLOW)
        .agent("storage", |ledger: &Ledger| Storage {
            ledger: ledger.clone(),
            buckets: Mutex::default(),
            undone: Mutex::default(),
        })
        // The partner takes 3 calls a second, and the stack declares 2 (and 2 at once).
        .stand_in(
            "dns",
            StandIn::new()
                .refusing("register-domain", 0.2)
                .rate("register-domain", 3)
                .down(Duration::from_secs(120), Duration::from_secs(240)),
        )
        .setting("SERVICE_RATES", "dns=2")
        .setting("SERVICE_CONCURRENCY", "dns=2")
        .stand_in("mailer", StandIn::from_json(r#"{"default": {"transient_rate": 0.3}}"#).unwrap())
        .orders(6, |i| json!({ "tenant": format!("t-{i}") }))
}

#[test]
fn every_bucket_and_domain_of_an_order_undone_is_gone_once_in_reverse_order() {
    let report = kit().check();
    assert!(report.processed > 0 && report.compensated > 0, "{report}");
    assert!(report.full > 0, "the partner's declared limits were never met: {report}");
}

#[test]
fn a_setting_the_stack_refuses_is_refused_with_its_message() {
    let refused = kit().setting("SERVICE_RATES", "dns=0").run().unwrap_err();
    assert!(refused.contains("SERVICE_RATES"), "{refused}");
    let unknown = kit().setting("SERVICE_RATES", "ftp=5").run().unwrap_err();
    assert!(unknown.contains("not deployed: ftp"), "{unknown}");
}

#[test]
fn a_knob_the_stand_in_does_not_know_is_refused_with_its_name() {
    let unknown = StandIn::from_json(r#"{"actions": {"welcome": {"transient": 0.3}}}"#);
    assert_eq!(unknown.unwrap_err(), "/actions/welcome/transient: no such knob");
    let rate = StandIn::from_json(r#"{"default": {"permanent_rate": 3}}"#);
    assert!(rate.unwrap_err().starts_with("/default/permanent_rate: 3"));
}
