//! A new version deployed while orders of the one before are in flight: the tutorial's
//! workflow gains a step that sets the tenant's quota. Every order keeps the version it
//! started on, and its steps, to its end; and a deploy that drops the version before, which
//! orders in flight still run, is caught.

#![allow(clippy::unwrap_used)]

use sas_agent_kit::{Direction, RemoteCall, RemoteFault, RemoteService};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sas_testkit::{Kit, Ledger, ProcessState, StandIn};
use serde_json::{Value, json};

const V1: &str = include_str!("workflows/tenant-provisioning.json");

fn v2() -> String {
    let mut v2: Value = serde_json::from_str(V1).unwrap();
    v2["version"] = json!(2);
    v2["steps"].as_array_mut().unwrap().insert(
        1,
        json!({"name": "set-quota", "agent": "tenants", "budget_seconds": 20,
               "depends_on": ["create-tenant"],
               "compensation": {"action": "clear-quota", "budget_seconds": 20}}),
    );
    v2.to_string()
}

/// Tenants and their quotas, each an effect of its order's step.
struct Tenants {
    ledger: Ledger,
}

impl RemoteService for Tenants {
    async fn call(&self, call: &RemoteCall) -> Result<Value, RemoteFault> {
        let tenant = call.order.input()["tenant"].as_str().unwrap_or_default();
        let (effect, undo) = match call.action.as_str() {
            "create-tenant" => (format!("tenant {tenant}"), false),
            "delete-tenant" => (format!("tenant {tenant}"), true),
            "set-quota" => (format!("quota {tenant}"), false),
            "clear-quota" => (format!("quota {tenant}"), true),
            other => return Err(RemoteFault::Permanent(format!("no action {other}"))),
        };
        // A step undone is not done again by a late copy of its request.
        let effects = self.ledger.effects();
        let undone = effects.iter().any(|e| {
            e.name == effect && e.order_id == call.order_id && e.direction == Direction::Undo
        });
        let in_place = self.ledger.in_place().contains_key(&effect);
        match undo {
            false if undone => {
                return Err(RemoteFault::Permanent("cancelled: already undone".into()));
            }
            false if !in_place => self.ledger.apply(call, effect),
            true if in_place => self.ledger.undo(call, effect),
            _ => {}
        }
        Ok(json!({ "tenant": tenant }))
    }
}

fn kit() -> Kit {
    Kit::new()
        .workflow("tenant-provisioning.json", V1)
        .agent("tenants", |ledger: &Ledger| Tenants { ledger: ledger.clone() })
        .stand_in("mailer", StandIn::new().refusing("send-invite", 0.2))
        .orders(8, |i| json!({ "tenant": format!("t-{i}"), "admin_email": "ops@example.com" }))
        .seeds(0..100)
}

#[test]
fn orders_in_flight_at_a_deploy_keep_their_version_to_their_end() {
    let v2 = v2();
    let of_version: Arc<[AtomicU64; 3]> = Arc::default();
    let counted = of_version.clone();
    let report = kit()
        .deploying_midway_json(&[
            ("tenant-provisioning.v1.json", V1),
            ("tenant-provisioning.json", &v2),
        ])
        .asserting(move |end| {
            for order in end.orders.iter().filter(|o| o.state == ProcessState::Processed) {
                counted[order.version as usize].fetch_add(1, Ordering::Relaxed);
                // A processed order of version 2 set its quota; one of version 1 did not.
                if order.outputs.contains_key("set-quota") != (order.version == 2) {
                    return Err(format!("{} ran the steps of another version", order.order_id));
                }
            }
            Ok(())
        })
        .check();
    let [_, v1, v2] = &*of_version;
    let (v1, v2) = (v1.load(Ordering::Relaxed), v2.load(Ordering::Relaxed));
    assert!(v1 > 0 && v2 > 0, "processed orders of each version: {v1}, {v2}; {report}");
}

#[test]
fn a_deploy_that_drops_the_version_orders_still_run_is_caught() {
    let v2 = v2();
    let report = kit().deploying_midway_json(&[("tenant-provisioning.json", &v2)]).run().unwrap();
    let failure = report.failures.first().unwrap();
    assert_eq!(failure.invariant, "an order keeps its workflow's version", "{failure}");
    assert!(
        failure.detail.contains("version 1 of tenant-provisioning is not deployed"),
        "{failure}"
    );
}
