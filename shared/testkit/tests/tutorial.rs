//! The README's tutorial workflow, `tenant-provisioning`, proved with the kit as a team would
//! prove its own: its Rust agent `tenants` on a map standing for its S3 bucket, its HTTP agent
//! `mailer` on a stand-in that refuses a share of invites, and every seed's orders checked.

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::sync::Mutex;

use sas_agent_kit::{RemoteCall, RemoteFault, RemoteService};
use sas_testkit::{Kit, Ledger, ProcessState, StandIn};
use serde_json::{Value, json};

/// The tenants' records, as the agent sees them: an S3 bucket in the stack, a set here, which
/// records in the ledger each object it creates and deletes.
struct Objects {
    ledger: Ledger,
    keys: Mutex<HashSet<String>>,
}

impl Objects {
    fn put(&self, call: &RemoteCall, key: &str) {
        if self.keys.lock().unwrap().insert(key.to_owned()) {
            self.ledger.apply(call, key);
        }
    }

    fn delete(&self, call: &RemoteCall, key: &str) {
        if self.keys.lock().unwrap().remove(key) {
            self.ledger.undo(call, key);
        }
    }

    /// A marker, which is no effect of the business's.
    fn mark(&self, key: &str) {
        self.keys.lock().unwrap().insert(key.to_owned());
    }

    fn exists(&self, key: &str) -> bool {
        self.keys.lock().unwrap().contains(key)
    }
}

/// The README's agent, its S3 calls replaced by the set's.
struct Tenants {
    objects: Objects,
}

impl RemoteService for Tenants {
    async fn call(&self, call: &RemoteCall) -> Result<Value, RemoteFault> {
        let tenant = call.order.input()["tenant"].as_str().unwrap_or_default().to_owned();
        let key = format!("tenants/{tenant}.json");
        let undone = format!("tenants/undone/{}", call.order_id);
        match call.action.as_str() {
            "create-tenant" => {
                if self.objects.exists(&undone) {
                    return Err(RemoteFault::Permanent("cancelled: already undone".into()));
                }
                self.objects.put(call, &key);
                Ok(json!({ "tenant_id": tenant }))
            }
            "delete-tenant" => {
                self.objects.mark(&undone);
                self.objects.delete(call, &key);
                Ok(json!({ "deleted": tenant }))
            }
            other => Err(RemoteFault::Permanent(format!("no action {other}"))),
        }
    }
}

fn tenants(ledger: &Ledger) -> Tenants {
    Tenants { objects: Objects { ledger: ledger.clone(), keys: Mutex::default() } }
}

#[test]
fn every_tenant_provisioned_is_kept_and_every_one_undone_is_deleted_once() {
    let report = Kit::new()
        .workflow_file(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/workflows/tenant-provisioning.json"
        ))
        .agent("tenants", tenants)
        .stand_in("mailer", StandIn::new().refusing("send-invite", 0.3))
        .orders(
            6,
            |i| json!({ "tenant": format!("t-{i}"), "admin_email": format!("ops@t-{i}.example") }),
        )
        // The team's own: a tenant's record is there when its order was processed, or when it
        // ended in error with the tenant on the operators' list; never else.
        .asserting(|end| {
            let in_place = end.ledger.in_place();
            for order in &end.orders {
                let key = format!("tenants/{}.json", order.input["tenant"].as_str().unwrap());
                let listed = order.to_undo_by_hand.iter().any(|s| s == "create-tenant");
                let may_stay = order.state == ProcessState::Processed
                    || (order.state == ProcessState::Error && listed);
                if in_place.contains_key(&key) && !may_stay {
                    return Err(format!("{key} is left by {}, {:?}", order.order_id, order.state));
                }
                if !in_place.contains_key(&key) && order.state == ProcessState::Processed {
                    return Err(format!("{key} is gone, {} processed", order.order_id));
                }
            }
            Ok(())
        })
        .check();
    // The seeds went through both ends, under every kind of fault the kit injects.
    assert!(report.processed > 0 && report.compensated + report.cancelled > 0, "{report}");
    for kind in ["crash", "duplicated", "lost", "lost-answer", "timeout", "outage", "operator"] {
        assert!(report.injected.get(kind).is_some_and(|n| *n > 0), "no {kind}: {report}");
    }
}

#[test]
fn the_workflow_is_the_readme_s() {
    let readme = include_str!("../../../README.md");
    let at = readme.find("**1. The workflow**").unwrap();
    let block = &readme[at..];
    let start = block.find("```json\n").unwrap() + "```json\n".len();
    let end = start + block[start..].find("```").unwrap();
    let ours: Value =
        serde_json::from_str(include_str!("workflows/tenant-provisioning.json")).unwrap();
    assert_eq!(serde_json::from_str::<Value>(&block[start..end]).unwrap(), ours);
}
