//! End to end on the local stack: the real function binaries behind a local Runtime API, event
//! sources emulated, resources from `template.yaml` on moto. Orders are submitted over HTTP while
//! function processes are killed with SIGKILL at random moments; every order must still end in
//! a terminal state, with no remote effect applied twice.
//!
//! The function binaries are built for it into `e2e` inside the target directory (a target
//! directory of its own: the one `cargo test` runs from stays locked while tests run).

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sas_engine::memory::SplitMix;
use sas_engine::ports::Random;
use sas_infra::emulator::{Moto, workspace_root};
use sas_infra::local::{LocalStack, Options};
use serde_json::Value;

/// The reference workflow with short budgets, so that a killed step's lease runs out in
/// seconds rather than minutes.
const FAST_WORKFLOW: &str = r#"{"name":"order-fulfilment","steps":[
  {"name":"reserve-inventory","agent":"inventory","budget_seconds":2,"compensation":{"action":"release-inventory","budget_seconds":2}},
  {"name":"charge-payment","agent":"payment","budget_seconds":2,"compensation":{"action":"refund-payment","budget_seconds":2}},
  {"name":"ship","agent":"shipping","budget_seconds":2}]}"#;

const ENGINE_FUNCTIONS: [&str; 4] =
    ["SubmissionFunction", "SchedulerFunction", "SupervisorFunction", "StatusFunction"];

/// Builds the function binaries as they ship (`cargo build --bins`), and returns their folder.
fn build_binaries() -> std::path::PathBuf {
    let root = workspace_root();
    // Beside the target directory this test was built in, wherever CARGO_TARGET_DIR or cargo's
    // configuration put it.
    let target = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .map_or_else(|| root.join("target"), std::path::Path::to_path_buf)
        .join("e2e");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::process::Command::new(cargo)
        .current_dir(&root)
        .args(["build", "--workspace", "--bins", "--quiet", "--target-dir"])
        .arg(&target)
        .status()
        .unwrap();
    assert!(status.success(), "building the function binaries failed");
    target.join("debug")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_finish_while_function_processes_are_killed() {
    let root = workspace_root();
    let bin_dir = build_binaries();
    let overrides = ENGINE_FUNCTIONS
        .iter()
        .map(|f| ((*f).to_owned(), "WORKFLOW_JSON".to_owned(), FAST_WORKFLOW.to_owned()))
        .chain([(
            "RemoteSimFunction".to_owned(),
            "FAULTS".to_owned(),
            r#"{"default":{"latency_ms":20}}"#.to_owned(),
        )])
        .collect();
    let options = Options {
        template: root.join("template.yaml"),
        endpoint: Some(Moto::shared().endpoint.clone()),
        split_emulators: false,
        bin_dir,
        api_port: 0,
        // The supervisor's one-minute rate, every second.
        schedule_speed: 60.0,
        max_instances: 2,
        stack_name: format!("e2e-{}", std::process::id()),
        region: "us-east-1".into(),
        parameters: HashMap::from([
            ("ClaimGraceSeconds".to_owned(), "1".to_owned()),
            ("RetryWaitBaseSeconds".to_owned(), "1".to_owned()),
            ("RetryWaitMaxSeconds".to_owned(), "2".to_owned()),
            ("FailureThreshold".to_owned(), "5".to_owned()),
        ]),
        overrides,
        show_logs: std::env::var_os("LOCAL_STACK_LOGS").is_some(),
    };
    let stack = LocalStack::up(&options).await.unwrap();
    let http = reqwest::Client::new();
    let body = r#"{"customer_id":"c-1","currency":"EUR","items":[{"sku":"BOOK-1","quantity":1,"unit_price":1250}],
                  "ship_to":{"name":"Ada","line1":"1 Main St","city":"Paris","postal_code":"75001","country":"FR"}}"#;

    // Kill a random function process (never the simulated remote service, which stands for
    // the outside world) every few hundred milliseconds while orders flow.
    let random = SplitMix::seeded(
        std::env::var("SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20_261_121),
    );
    let mut ids = Vec::new();
    let mut kills = 0;
    for i in 0..24 {
        let submitted = submit(&http, &stack.api_url, &format!("e2e-order-{i}"), body).await;
        ids.push(submitted);
        if i % 2 == 0 && stack.kill_random(&random).is_some() {
            kills += 1;
        }
        tokio::time::sleep(Duration::from_millis((random.unit() * 400.0) as u64)).await;
    }
    assert!(kills >= 10);

    let deadline = Instant::now() + Duration::from_secs(180);
    let mut states: HashMap<String, String> = HashMap::new();
    while Instant::now() < deadline {
        states.clear();
        for id in &ids {
            let view: Value = http
                .get(format!("{}/orders/{id}", stack.api_url))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap_or(Value::Null);
            let state = view["process_state"].as_str().unwrap_or("unknown").to_owned();
            states.insert(id.clone(), state);
        }
        if states.values().all(|s| s == "Processed" || s == "Error") {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let unfinished: Vec<_> =
        states.iter().filter(|(_, s)| *s != "Processed" && *s != "Error").collect();
    assert!(unfinished.is_empty(), "orders not terminal after the kills: {unfinished:?}");

    let remote = stack.stack.attribute("RemoteSimFunctionUrl", "FunctionUrl").unwrap();
    let ledger: Value =
        http.get(format!("{remote}ledger")).send().await.unwrap().json().await.unwrap();
    assert_eq!(ledger["max_applications"], 1, "a remote effect was applied twice");
    println!("{kills} kills, {} restarts, states: {:?}", stack.restarts(), count(&states));
}

async fn submit(http: &reqwest::Client, api: &str, key: &str, body: &str) -> String {
    // A killed submission process fails its request; a client retries with the same key.
    for _ in 0..20 {
        let response = http
            .post(format!("{api}/orders"))
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(body.to_owned())
            .send()
            .await;
        if let Ok(r) = response {
            if r.status() == 202 {
                let v: Value = r.json().await.unwrap();
                return v["order_id"].as_str().unwrap().to_owned();
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    panic!("order {key} was never accepted");
}

fn count(states: &HashMap<String, String>) -> HashMap<&str, usize> {
    let mut c = HashMap::new();
    for s in states.values() {
        *c.entry(s.as_str()).or_default() += 1;
    }
    c
}
