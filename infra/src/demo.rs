//! The demo: the local stack under a few hundred orders while the remote services misbehave,
//! with live progress and a summary that checks the system's promises: every order terminal,
//! no remote effect applied twice, one alert per failed order.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use sas_engine::memory::SplitMix;
use serde_json::Value;
use tokio::sync::Semaphore;

use crate::Error;
use crate::aws::Clients;
use crate::local::LocalStack;

/// Faults of the simulated services during the demo: transient faults, lost answers, slow
/// calls, an outage from 15 s to 25 s after start, and payments declined for good now and then.
pub const DEMO_FAULTS: &str = r#"{"default":{"transient_rate":0.15,"lost_answer_rate":0.03,"latency_ms":20,"latency_jitter_ms":40,
  "outages":[{"start_s":15,"end_s":25}]},"actions":{"charge-payment":{"permanent_rate":0.04}}}"#;

/// The reference workflow with budgets short enough for a demo.
pub const DEMO_WORKFLOW: &str = r#"{"name":"order-fulfilment","steps":[
  {"name":"reserve-inventory","agent":"inventory","budget_seconds":15,"compensation":{"action":"release-inventory","budget_seconds":15}},
  {"name":"charge-payment","agent":"payment","budget_seconds":15,"compensation":{"action":"refund-payment","budget_seconds":15}},
  {"name":"ship","agent":"shipping","budget_seconds":15}]}"#;

/// Template parameters for the demo: quick retries, and a sweep every minute (run faster).
pub fn demo_parameters() -> HashMap<String, String> {
    [
        ("ClaimGraceSeconds", "2"),
        ("RetryWaitBaseSeconds", "1"),
        ("RetryWaitMaxSeconds", "4"),
        ("FailureThreshold", "4"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// What the demo found.
#[derive(Debug, Default)]
pub struct Summary {
    pub orders: usize,
    pub processed: usize,
    pub compensated: usize,
    pub failed: usize,
    pub unfinished: usize,
    pub errors_without_alert: usize,
    pub max_applications: u64,
    /// Function processes killed during the run.
    pub kills: u32,
    pub text: String,
}

impl Summary {
    /// The demo passes when every order is terminal, no effect was applied twice, and every
    /// failed order raised its alert.
    pub fn passed(&self) -> bool {
        self.unfinished == 0 && self.max_applications <= 1 && self.errors_without_alert == 0
    }
}

/// Function processes killed while orders flow, to show that crashes lose nothing.
#[derive(Clone, Copy, Debug)]
pub struct Chaos {
    /// Time between two kills.
    pub every: Duration,
    /// Seed of the choice of process.
    pub seed: u64,
}

/// How long the killing goes on once every order has been accepted.
const CHAOS_AFTER_ACCEPTED: Duration = Duration::from_secs(30);

/// Submits `orders` orders through the HTTP API, at most `rate` a second if given, and follows
/// them to the end (or `limit`), killing function processes meanwhile if `chaos` says so.
pub async fn run(
    stack: &LocalStack,
    orders: usize,
    rate: Option<f64>,
    limit: Duration,
    chaos: Option<Chaos>,
) -> Result<Summary, Error> {
    let accepted_at: OnceLock<Instant> = OnceLock::new();
    let killer = async {
        let Some(chaos) = chaos else { return 0 };
        let random = SplitMix::seeded(chaos.seed);
        let mut kills = 0;
        while accepted_at.get().is_none_or(|at| at.elapsed() < CHAOS_AFTER_ACCEPTED) {
            tokio::time::sleep(chaos.every).await;
            if stack.kill_random(&random).is_some() {
                kills += 1;
            }
        }
        kills
    };
    let (summary, kills) = tokio::join!(follow(stack, orders, rate, limit, &accepted_at), killer);
    let mut summary = summary?;
    if chaos.is_some() {
        summary.kills = kills;
        summary.text.push_str(&format!(
            "chaos: {kills} function processes killed with SIGKILL, {} restarts\n",
            stack.restarts()
        ));
    }
    Ok(summary)
}

async fn follow(
    stack: &LocalStack,
    orders: usize,
    rate: Option<f64>,
    limit: Duration,
    accepted_at: &OnceLock<Instant>,
) -> Result<Summary, Error> {
    let started = Instant::now();
    let http = reqwest::Client::new();
    let slots = Arc::new(Semaphore::new(8));
    let mut submissions = Vec::new();
    let pace = rate.map(|r| Duration::from_secs_f64(1.0 / r));
    for i in 0..orders {
        if let Some(pace) = pace {
            tokio::time::sleep(pace).await;
        }
        let (http, api, slots) = (http.clone(), stack.api_url.clone(), slots.clone());
        submissions.push(tokio::spawn(async move {
            let _slot = slots.acquire_owned().await;
            submit(&http, &api, i).await
        }));
    }
    let mut ids = Vec::new();
    for s in submissions {
        if let Ok(Some(id)) = s.await {
            ids.push(id);
        }
    }
    let _ = accepted_at.set(Instant::now());
    println!("demo: {} orders accepted in {:.1} s", ids.len(), started.elapsed().as_secs_f64());

    // Straight to the emulators: the demo's own reads are not the system's cost.
    let clients = Clients::new(&stack.emulators, "us-east-1").await;
    let dynamodb = &clients.dynamodb;
    let table =
        stack.stack.reference("StateTable").ok_or_else(|| Error::Local("no StateTable".into()))?;
    let mut records;
    loop {
        records = scan(dynamodb, &table).await?;
        let mut by_state: BTreeMap<String, usize> = BTreeMap::new();
        for r in &records {
            *by_state.entry(state_of(r)).or_default() += 1;
        }
        let settled = records.iter().filter(|r| settled(r)).count();
        println!(
            "demo: {:>5.1} s  {}",
            started.elapsed().as_secs_f64(),
            by_state.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join("  ")
        );
        if settled == ids.len() && records.len() == ids.len() || started.elapsed() > limit {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    summarise(stack, &clients, &http, &records, ids.len(), started.elapsed()).await
}

async fn submit(http: &reqwest::Client, api: &str, i: usize) -> Option<String> {
    let body = format!(
        r#"{{"customer_id":"demo-{c}","currency":"EUR","items":[{{"sku":"BOOK-{s}","quantity":{q},"unit_price":1250}}],
            "ship_to":{{"name":"Ada","line1":"1 Main St","city":"Paris","postal_code":"75001","country":"FR"}}}}"#,
        c = i % 37,
        s = i % 5,
        q = 1 + i % 3
    );
    for _ in 0..30 {
        let answer = http
            .post(format!("{api}/orders"))
            .header("content-type", "application/json")
            .header("idempotency-key", format!("demo-order-{i:05}"))
            .body(body.clone())
            .send()
            .await;
        if let Ok(a) = answer {
            if a.status() == 202 {
                let v: Value = a.json().await.ok()?;
                return v["order_id"].as_str().map(str::to_owned);
            }
        }
        // A 5xx or a refused connection: retry with the same key, as a client should.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    None
}

type Item = HashMap<String, AttributeValue>;

async fn scan(client: &aws_sdk_dynamodb::Client, table: &str) -> Result<Vec<Item>, Error> {
    let mut out = Vec::new();
    let mut pages = client.scan().table_name(table).into_paginator().send();
    while let Some(page) = pages.next().await {
        let page = page.map_err(|e| {
            Error::Local(format!("scan: {}", aws_sdk_dynamodb::error::DisplayErrorContext(e)))
        })?;
        out.extend(page.items.unwrap_or_default());
    }
    Ok(out)
}

fn state_of(r: &Item) -> String {
    r.get("ProcessState").and_then(|v| v.as_s().ok()).cloned().unwrap_or_default()
}

/// Terminal, and out of the expiry index (its alert, if any, confirmed).
fn settled(r: &Item) -> bool {
    matches!(state_of(r).as_str(), "Processed" | "Error") && !r.contains_key("CompleteBy")
}

fn body(r: &Item) -> Value {
    r.get("Body")
        .and_then(|v| v.as_s().ok())
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or(Value::Null)
}

async fn summarise(
    stack: &LocalStack,
    clients: &Clients,
    http: &reqwest::Client,
    records: &[Item],
    accepted: usize,
    elapsed: Duration,
) -> Result<Summary, Error> {
    let mut s = Summary { orders: accepted, ..Summary::default() };
    let mut to_terminal = Vec::new();
    let (mut resets, mut error_ids) = (0usize, Vec::new());
    for r in records {
        let b = body(r);
        let timeline = b["timeline"].as_array().cloned().unwrap_or_default();
        resets += timeline.iter().filter(|e| e["what"] == "retry_scheduled").count();
        let end = timeline
            .iter()
            .rev()
            .find(|e| matches!(e["what"].as_str(), Some("processed" | "compensated" | "failed")));
        if let (Some(end), Some(created)) = (end, b["created_at"].as_i64()) {
            to_terminal.push(end["at"].as_i64().unwrap_or(created) - created);
        }
        match (state_of(r).as_str(), end.and_then(|e| e["what"].as_str())) {
            ("Processed", _) => s.processed += 1,
            ("Error", Some("compensated")) => s.compensated += 1,
            ("Error", _) => s.failed += 1,
            _ => s.unfinished += 1,
        }
        if state_of(r) == "Error" {
            if let Some(id) = r.get("OrderId").and_then(|v| v.as_s().ok()) {
                error_ids.push(id.clone());
            }
        }
    }
    s.unfinished += accepted.saturating_sub(records.len());

    // Alerts, as an operator would read them: from the queue the alert rule feeds.
    let sqs = &clients.sqs;
    let alerts_url = stack.stack.reference("AlertsQueue").unwrap_or_default();
    let mut alerted: HashMap<String, usize> = HashMap::new();
    loop {
        let got =
            sqs.receive_message().queue_url(&alerts_url).max_number_of_messages(10).send().await;
        let messages = got.ok().and_then(|o| o.messages).unwrap_or_default();
        if messages.is_empty() {
            break;
        }
        for m in messages {
            let event: Value =
                serde_json::from_str(m.body().unwrap_or_default()).unwrap_or(Value::Null);
            if let Some(order) = event["detail"]["order_id"].as_str() {
                *alerted.entry(order.to_owned()).or_default() += 1;
            }
            let _ = sqs
                .delete_message()
                .queue_url(&alerts_url)
                .receipt_handle(m.receipt_handle().unwrap_or_default())
                .send()
                .await;
        }
    }
    s.errors_without_alert = error_ids.iter().filter(|id| !alerted.contains_key(*id)).count();

    let remote = stack.stack.attribute("RemoteSimFunctionUrl", "FunctionUrl").unwrap_or_default();
    let ledger: Value = match http.get(format!("{remote}ledger")).send().await {
        Ok(r) => r.json().await.unwrap_or(Value::Null),
        Err(_) => Value::Null,
    };
    let stats: Value = match http.get(format!("{remote}stats")).send().await {
        Ok(r) => r.json().await.unwrap_or(Value::Null),
        Err(_) => Value::Null,
    };
    s.max_applications = ledger["max_applications"].as_u64().unwrap_or(u64::MAX);

    to_terminal.sort_unstable();
    let pct = |p: f64| {
        to_terminal
            .get(((to_terminal.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(0)
    };
    let mut t = String::new();
    let n = accepted.max(1) as f64;
    t.push_str(&format!(
        "\n# Demo summary ({accepted} orders, {:.0} s)\n\n",
        elapsed.as_secs_f64()
    ));
    t.push_str(&format!(
        "processed {}, compensated {}, failed {}, not finished {}\n",
        s.processed, s.compensated, s.failed, s.unfinished
    ));
    t.push_str(&format!(
        "alerts: {} orders in Error, {} alerted, {} without an alert\n",
        error_ids.len(),
        error_ids.iter().filter(|id| alerted.contains_key(*id)).count(),
        s.errors_without_alert
    ));
    t.push_str(&format!(
        "remote calls: {} ({} transient, {} throttled, {} during the outage, {} answers lost, {} refused for good); largest number of applications of one effect: {}\n",
        stats["total"], stats["transient"], stats["throttled"], stats["outage"], stats["lost_answer"], stats["permanent"], s.max_applications
    ));
    t.push_str(&format!("supervisor resets: {resets}\n"));
    t.push_str(&format!(
        "time to terminal: p50 {:.1} s, p95 {:.1} s, max {:.1} s\n\n",
        pct(0.5) as f64 / 1000.0,
        pct(0.95) as f64 / 1000.0,
        to_terminal.last().copied().unwrap_or(0) as f64 / 1000.0
    ));

    // AWS API calls per order, as counted by the proxy in front of the emulator.
    t.push_str("| service | operation | calls per order | list price (us-east-1, 2026-11-21) | per million orders |\n| --- | --- | ---: | --- | ---: |\n");
    let mut total = 0.0;
    for ((service, operation), count) in stack.proxy.counts.snapshot() {
        let per = count as f64 / n;
        let (unit, note) = price(&service, &operation);
        let cost = per * unit;
        total += cost;
        t.push_str(&format!("| {service} | {operation} | {per:.2} | {note} | ${cost:.2} |\n"));
    }
    let invocations: u64 = stack.functions.iter().map(|f| f.api.invocations()).sum();
    let api_requests: u64 = stack
        .functions
        .iter()
        .filter(|f| {
            f.spec.events.iter().any(|e| matches!(e, crate::functions::EventSource::HttpApi { .. }))
        })
        .map(|f| f.api.invocations())
        .sum();
    let lambda = invocations as f64 / n * 0.20;
    let gateway = api_requests as f64 / n * 1.00;
    total += lambda + gateway;
    t.push_str(&format!(
        "| lambda | invocations | {:.2} | $0.20 per million | ${lambda:.2} |\n",
        invocations as f64 / n
    ));
    t.push_str(&format!(
        "| apigateway | HTTP API requests | {:.2} | $1.00 per million | ${gateway:.2} |\n",
        api_requests as f64 / n
    ));
    t.push_str(&format!("| **total** | | | | **${total:.2}** |\n\n"));
    t.push_str("Per-order figures include the supervisor's sweeps (Query, and its reads of the queues' load: Scan and\n");
    t.push_str("GetQueueAttributes), run 60 times faster than on AWS, and the retries the faults caused; DynamoDB writes are\n");
    t.push_str("priced at one unit each (two per item in a transaction), without index writes: `cargo run -p sas-infra --bin cost-model`\n");
    t.push_str(
        "counts capacity units exactly for the fault-free path. Lambda duration is not included.\n",
    );
    s.text = t;
    Ok(s)
}

/// List price per million calls of an operation, and how it is priced.
fn price(service: &str, operation: &str) -> (f64, &'static str) {
    match (service, operation) {
        ("dynamodb", "TransactWriteItems") => (4.0 * 0.625, "4 write units at $0.625 per million"),
        ("dynamodb", "PutItem" | "UpdateItem" | "DeleteItem") => {
            (0.625, "1 write unit at $0.625 per million")
        }
        ("dynamodb", "GetItem, consistent") => (0.125, "1 read unit at $0.125 per million"),
        ("dynamodb", "GetItem, eventual") => (0.0625, "½ read unit at $0.125 per million"),
        ("dynamodb", "Query" | "Scan") => (0.0625, "½ read unit at $0.125 per million"),
        ("dynamodb", _) => (0.0, "control plane, free"),
        ("sqs", _) => (0.40, "$0.40 per million requests"),
        ("eventbridge", "PutEvents") => (1.00, "$1.00 per million events"),
        (_, _) => (0.0, "not billed per call"),
    }
}
