//! Bugs planted in a team's agent, each found by the kit at its first seeds: an undo that is
//! not idempotent, and a compensation that forgets its step's output. Each test expects the
//! failure, the invariant it breaks, and a seed to replay it from.

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::sync::Mutex;

use sas_agent_kit::{RemoteCall, RemoteFault, RemoteService};
use sas_testkit::{Failure, Kit, Ledger, StandIn};
use serde_json::{Value, json};

/// How the planted agent goes wrong.
#[derive(Clone, Copy)]
enum Bug {
    None,
    /// The undo deletes and records the deletion whether or not the bucket is there.
    UndoNotIdempotent,
    /// The undo deletes the bucket its name would have without the step's output.
    UndoForgetsOutput,
}

/// An agent that creates a bucket per tenant, its name made unique by the call's key, and
/// answers that name; its undo deletes the bucket its step answered.
struct Buckets {
    ledger: Ledger,
    buckets: Mutex<HashSet<String>>,
    undone: Mutex<HashSet<String>>,
    bug: Bug,
}

impl RemoteService for Buckets {
    async fn call(&self, call: &RemoteCall) -> Result<Value, RemoteFault> {
        let tenant = call.order.input()["tenant"].as_str().unwrap_or_default().to_owned();
        let step = call.idempotency_key.rsplit_once('/').map_or("", |(step, _)| step).to_owned();
        match call.action.as_str() {
            "create-bucket" => {
                if self.undone.lock().unwrap().contains(&step) {
                    return Err(RemoteFault::Permanent("cancelled: already undone".into()));
                }
                let bucket = bucket_of(&tenant, &step);
                if self.buckets.lock().unwrap().insert(bucket.clone()) {
                    self.ledger.apply(call, format!("bucket {bucket}"));
                }
                Ok(json!({ "bucket": bucket }))
            }
            "delete-bucket" => {
                self.undone.lock().unwrap().insert(step.clone());
                // The step's output, or, where its answer was lost, the name its call made.
                let answered = call.input.as_ref().and_then(|o| o["bucket"].as_str());
                let bucket = match self.bug {
                    Bug::UndoForgetsOutput => tenant.clone(),
                    _ => answered.map_or_else(|| bucket_of(&tenant, &step), str::to_owned),
                };
                let removed = self.buckets.lock().unwrap().remove(&bucket);
                if removed || matches!(self.bug, Bug::UndoNotIdempotent) {
                    self.ledger.undo(call, format!("bucket {bucket}"));
                }
                Ok(json!({ "deleted": bucket }))
            }
            other => Err(RemoteFault::Permanent(format!("no action {other}"))),
        }
    }
}

fn buckets(ledger: &Ledger, bug: Bug) -> Buckets {
    Buckets { ledger: ledger.clone(), buckets: Mutex::default(), undone: Mutex::default(), bug }
}

/// The bucket a step's call makes: the tenant's name and a number drawn from the step's key
/// (`<order>/<step>`), the same for every call of the step.
fn bucket_of(tenant: &str, step: &str) -> String {
    format!("{tenant}-{}", sas_rng::fnv1a(step.as_bytes()) % 100_000)
}

const WORKFLOW: &str = r#"{
  "name": "bucket-per-tenant",
  "version": 1,
  "steps": [
    {"name": "create-bucket", "agent": "buckets", "budget_seconds": 20,
     "compensation": {"action": "delete-bucket", "budget_seconds": 20}},
    {"name": "announce", "agent": "mailer", "budget_seconds": 20, "depends_on": ["create-bucket"]}
  ],
  "input_schema": {"type": "object", "required": ["tenant"],
                   "properties": {"tenant": {"type": "string"}}}
}"#;

fn first_failure(bug: Bug) -> Failure {
    let report = Kit::new()
        .workflow("bucket-per-tenant.json", WORKFLOW)
        .agent("buckets", move |ledger: &Ledger| buckets(ledger, bug))
        .stand_in("mailer", StandIn::new().refusing("announce", 0.3))
        .orders(6, |i| json!({ "tenant": format!("t-{i}") }))
        .seeds(0..50)
        .run()
        .unwrap();
    report.failures.first().cloned().unwrap_or_else(|| panic!("the bug went unnoticed: {report}"))
}

#[test]
fn an_undo_that_is_not_idempotent_is_found() {
    let failure = first_failure(Bug::UndoNotIdempotent);
    assert_eq!(failure.invariant, "no effect twice", "{failure}");
    assert!(failure.detail.contains("undone twice"), "{failure}");
    assert!(failure.seed < 20 && !failure.timeline.is_empty(), "{failure}");
}

#[test]
fn a_compensation_that_forgets_its_step_s_output_is_found() {
    let failure = first_failure(Bug::UndoForgetsOutput);
    assert!(failure.detail.contains("still in place"), "{failure}");
    assert!(failure.seed < 20 && !failure.timeline.is_empty(), "{failure}");
}

#[test]
fn the_same_agent_without_its_bugs_passes() {
    let report = Kit::new()
        .workflow("bucket-per-tenant.json", WORKFLOW)
        .agent("buckets", |ledger: &Ledger| buckets(ledger, Bug::None))
        .stand_in("mailer", StandIn::new().refusing("announce", 0.3))
        .orders(6, |i| json!({ "tenant": format!("t-{i}") }))
        .seeds(0..50)
        .check();
    assert!(report.compensated + report.cancelled > 0, "{report}");
}

#[test]
fn a_workflow_file_the_stack_refuses_is_refused_with_the_stack_s_message() {
    let misnamed = Kit::new()
        .workflow("another-name.json", WORKFLOW)
        .agent("buckets", |ledger: &Ledger| buckets(ledger, Bug::None))
        .stand_in("mailer", StandIn::new())
        .run()
        .unwrap_err();
    assert!(
        misnamed.ends_with("another-name.json: name: the workflow is named \"bucket-per-tenant\", and its file must be named after it (bucket-per-tenant.json, or bucket-per-tenant.v1.json for an older version kept)"),
        "{misnamed}"
    );
    let missing = Kit::new().workflow("bucket-per-tenant.json", WORKFLOW).run().unwrap_err();
    assert!(missing.contains("buckets"), "{missing}");
}

#[test]
fn a_team_s_own_assertion_that_fails_fails_its_seed() {
    let report = Kit::new()
        .workflow("bucket-per-tenant.json", WORKFLOW)
        .agent("buckets", |ledger: &Ledger| buckets(ledger, Bug::None))
        .stand_in("mailer", StandIn::new())
        .orders(2, |i| json!({ "tenant": format!("t-{i}") }))
        .asserting(|end| {
            match end.orders.iter().find(|o| o.outputs.contains_key("create-bucket")) {
                Some(o) => Err(format!("{} made a bucket", o.order_id)),
                None => Ok(()),
            }
        })
        .seeds(0..5)
        .run()
        .unwrap();
    let failure = report.failures.first().unwrap();
    assert_eq!((failure.seed, failure.invariant), (0, "the team's own assertion"), "{failure}");
    assert!(failure.detail.ends_with("made a bucket"), "{failure}");
}

/// An agent whose handler panics on one tenant's bucket.
struct Panicking;

impl RemoteService for Panicking {
    async fn call(&self, call: &RemoteCall) -> Result<Value, RemoteFault> {
        if call.order.input()["tenant"] == "t-1" && call.action == "create-bucket" {
            panic!("index out of bounds");
        }
        Ok(json!({}))
    }
}

#[test]
fn a_handler_that_panics_fails_its_step_and_its_seed() {
    let report = Kit::new()
        .workflow("bucket-per-tenant.json", WORKFLOW)
        .agent("buckets", |_: &Ledger| Panicking)
        .stand_in("mailer", StandIn::new())
        .orders(2, |i| json!({ "tenant": format!("t-{i}") }))
        .seeds(0..5)
        .run()
        .unwrap();
    let failure = report.failures.first().unwrap();
    assert_eq!(failure.seed, 0, "{failure}");
    assert!(
        failure.detail.starts_with("the handler of buckets panicked on create-bucket (do)")
            && failure.detail.ends_with("index out of bounds"),
        "{failure}"
    );
    assert!(failure.timeline.iter().any(|l| l.contains("panicked")), "{failure}");
}
