//! The demo: the local stack under a few hundred orders while the remote services misbehave,
//! with live progress and a summary that checks the system's promises: every order terminal,
//! no remote effect applied twice, one alert per failed order, and every order that did not
//! go through explained by a fault the simulated service injected into it.
//!
//! The clients behave as a client of the API should: an order refused at the door (503) is
//! sent again, with the same idempotency key, after its `Retry-After` (and up to a fifth more,
//! so that clients refused together do not come back together); a throttled one (429), or one
//! that met an error, after a second, then twice as long each time, up to half a minute.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use sas_aws::signing::SigV4;
use sas_rng::SplitMix;
use serde_json::Value;
use tokio::sync::Semaphore;

use crate::Error;
use crate::aws::Clients;
use crate::effects;
use crate::local::LocalStack;
use crate::prices::{self, per_million};
use crate::sigv4;
use crate::traces::OrderTraces;

/// Faults of the simulated services during the demo: transient faults, lost answers, slow
/// calls, an outage from 15 s to 25 s after start, and payments declined for good now and then.
pub const DEMO_FAULTS: &str = r#"{"default":{"transient_rate":0.15,"lost_answer_rate":0.03,"latency_ms":20,"latency_jitter_ms":40,
  "outages":[{"start_s":15,"end_s":25}]},"actions":{"charge-payment":{"permanent_rate":0.04},"send-welcome":{"permanent_rate":0.08}}}"#;

/// The reference workflow (`shared/workflows/`) with budgets short enough for a demo.
pub fn demo_workflow() -> String {
    with_budgets(sas_workflows::order_fulfilment(), 15)
}

/// The workflows the demo runs side by side, with budgets short enough for a demo: the
/// reference one and account-opening (as `WORKFLOW_JSON`, a list).
pub fn demo_workflows() -> String {
    let account = sas_workflows::file(ACCOUNT_WORKFLOW).map_or("", |f| f.json);
    let both: Vec<Value> = [demo_workflow(), with_budgets(account, 15)]
        .iter()
        .filter_map(|w| serde_json::from_str(w).ok())
        .collect();
    Value::Array(both).to_string()
}

/// The second workflow: every [`ACCOUNT_EVERY`]th order of the demo opens an account, where the
/// stack runs it.
const ACCOUNT_WORKFLOW: &str = "account-opening";
const ACCOUNT_EVERY: usize = 4;

/// The workflows the stack's submission runs, by name, as JSON: its `WORKFLOW_JSON` (one or a
/// list), or the files built in.
fn workflows_run(stack: &LocalStack) -> Vec<(String, String)> {
    let set = stack
        .functions
        .iter()
        .find(|f| f.spec.logical_id == "SubmissionFunction")
        .and_then(|f| f.spec.environment.get("WORKFLOW_JSON"))
        .and_then(|json| serde_json::from_str::<Value>(json).ok());
    let list = match set {
        Some(Value::Array(list)) => list,
        Some(one) => vec![one],
        None => sas_workflows::FILES
            .iter()
            .filter(|f| f.name.split('.').count() == 1)
            .filter_map(|f| serde_json::from_str(f.json).ok())
            .collect(),
    };
    list.iter().filter_map(|w| Some((w["name"].as_str()?.to_owned(), w.to_string()))).collect()
}

/// `workflow_json` with every step's and every compensation's budget set to `seconds`: the
/// workflow as it is, on a clock a test or a demo can wait for.
pub fn with_budgets(workflow_json: &str, seconds: u64) -> String {
    let mut workflow: Value = serde_json::from_str(workflow_json).unwrap_or(Value::Null);
    if let Some(steps) = workflow["steps"].as_array_mut() {
        for step in steps {
            step["budget_seconds"] = seconds.into();
            if let Some(undo) = step.get_mut("compensation").filter(|c| c.is_object()) {
                undo["budget_seconds"] = seconds.into();
            }
        }
    }
    workflow.to_string()
}

/// The access key the demo's client signs with: its orders belong to this caller.
const DEMO_CLIENT: &str = "demo-client";

/// Template parameters for the demo: quick retries, a sweep every minute (run faster), and a
/// door that keeps the local stack's queues under 20 s.
pub fn demo_parameters() -> HashMap<String, String> {
    [
        ("ClaimGraceSeconds", "2"),
        ("RetryWaitBaseSeconds", "1"),
        ("RetryWaitMaxSeconds", "4"),
        ("FailureThreshold", "4"),
        ("MaxQueueWaitSeconds", "20"),
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
    /// Processed orders with a step whose failure its workflow only reports.
    pub reported: usize,
    pub unfinished: usize,
    /// Compensated or failed orders, and reported failures, that no injected fault explains.
    pub unexplained: usize,
    /// Orders in Error, or processed with a report, that raised no alert.
    pub errors_without_alert: usize,
    /// Finished orders whose time to terminal could not be read from their records.
    pub untimed: usize,
    /// Whether the orders the functions' metrics count as ended differ from those found ended.
    pub metrics_disagree: bool,
    /// Orders whose hops were not all in one trace named by the order, or had no trace.
    pub traces_broken: usize,
    /// What the simulated service holds that the orders' ends do not explain (a step in place
    /// twice, a processed order missing a step, a compensated one keeping one), one line each.
    pub effects_wrong: Vec<String>,
    /// Function processes killed during the run.
    pub kills: u32,
    /// Messages that reached a dead-letter queue.
    pub dead_lettered: usize,
    pub text: String,
}

impl Summary {
    /// The demo passes when every order is terminal, the service holds exactly what the
    /// orders' ends say (see [`crate::effects`]), every failed
    /// order raised its alert, and every order that did not go through was failed by a fault
    /// the simulated service injected, not by load or delay; and the figures it reports cover
    /// every finished order; and no message reached a dead-letter queue (neither crashes nor
    /// throttling are a reason for one).
    pub fn passed(&self) -> bool {
        self.unfinished == 0
            && self.dead_lettered == 0
            && self.effects_wrong.is_empty()
            && self.errors_without_alert == 0
            && self.unexplained == 0
            && self.untimed == 0
            && !self.metrics_disagree
            && self.traces_broken == 0
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

/// How the clients fared at the door.
#[derive(Debug, Default)]
struct Door {
    /// 503 answers: refused while the queues were long (or a dependency was unavailable).
    refused: AtomicU64,
    /// 429 answers: the route's throttling.
    throttled: AtomicU64,
    /// Anything else that was not a 202: errors, connections refused.
    other: AtomicU64,
}

/// Submits `orders` orders through the HTTP API, at most `rate` new ones a second if given
/// (otherwise as fast as 8 clients can), and follows them to the end (or `limit` after the last
/// is accepted; submitting gives up `limit` after the start), killing
/// function processes meanwhile if `chaos` says so.
pub async fn run(
    stack: &LocalStack,
    orders: usize,
    rate: Option<f64>,
    limit: Duration,
    chaos: Option<Chaos>,
) -> Result<Summary, Error> {
    let accepted_at: OnceLock<Instant> = OnceLock::new();
    let kills = AtomicU64::new(0);
    let killer = async {
        let Some(chaos) = chaos else { return };
        let random = SplitMix::seeded(chaos.seed);
        while accepted_at.get().is_none_or(|at| at.elapsed() < CHAOS_AFTER_ACCEPTED) {
            tokio::time::sleep(chaos.every).await;
            if stack.kill_random(&random).is_some() {
                kills.fetch_add(1, Ordering::Relaxed);
            }
        }
    };
    let following = follow(stack, orders, rate, limit, &accepted_at, &kills);
    let (summary, ()) = tokio::join!(following, killer);
    let mut summary = summary?;
    if chaos.is_some() {
        summary.text.push_str(&format!(
            "chaos: {} function processes killed with SIGKILL, {} restarts\n",
            summary.kills,
            stack.restarts()
        ));
    }
    // A call a function's policy refused fails the demo, however the orders went.
    stack.check_access(&mut summary.text)?;
    Ok(summary)
}

async fn follow(
    stack: &LocalStack,
    orders: usize,
    rate: Option<f64>,
    limit: Duration,
    accepted_at: &OnceLock<Instant>,
    kills: &AtomicU64,
) -> Result<Summary, Error> {
    let started = Instant::now();
    let deadline = started + limit;
    let http = reqwest::Client::new();
    let door = Arc::new(Door::default());
    // Unpaced, 8 clients send as fast as they are answered; paced, every order is a client of
    // its own arriving on time, however slow the answers.
    let slots = Arc::new(Semaphore::new(if rate.is_some() { orders.max(1) } else { 8 }));
    let pace = rate.map(|r| Duration::from_secs_f64(1.0 / r));
    let submitting = {
        let (http, api, door) = (http.clone(), stack.api_url.clone(), door.clone());
        let accounts = workflows_run(stack).iter().any(|(name, _)| name == ACCOUNT_WORKFLOW);
        // The demo's client signs its orders, as the API's default authorizer wants.
        let signer =
            sigv4::local_signer(DEMO_CLIENT, &stack.stack.context.region, sigv4::EXECUTE_API);
        tokio::spawn(async move {
            let mut submissions = Vec::new();
            for i in 0..orders {
                if let Some(pace) = pace {
                    tokio::time::sleep(pace).await;
                }
                let (http, api, slots, door, signer) =
                    (http.clone(), api.clone(), slots.clone(), door.clone(), signer.clone());
                submissions.push(tokio::spawn(async move {
                    let _slot = slots.acquire_owned().await;
                    submit(&http, &signer, &api, i, accounts, deadline, &door).await
                }));
            }
            let mut ids = Vec::new();
            for s in submissions {
                if let Ok(Some(id)) = s.await {
                    ids.push(id);
                }
            }
            ids
        })
    };

    // Straight to the emulators: the demo's own reads are not the system's cost.
    let clients = Clients::new(&stack.emulators, "us-east-1").await;
    let table =
        stack.stack.reference("StateTable").ok_or_else(|| Error::Local("no StateTable".into()))?;
    let mut ids: Option<Vec<String>> = None;
    let mut submitting = Some(submitting);
    let mut records;
    loop {
        if submitting.as_ref().is_some_and(|s| s.is_finished()) {
            let accepted = submitting.take().map(|s| async { s.await.unwrap_or_default() });
            if let Some(accepted) = accepted {
                let accepted = accepted.await;
                let _ = accepted_at.set(Instant::now());
                println!(
                    "demo: {} orders accepted in {:.1} s ({} refused at the door and sent again later, {} throttled)",
                    accepted.len(),
                    started.elapsed().as_secs_f64(),
                    door.refused.load(Ordering::Relaxed),
                    door.throttled.load(Ordering::Relaxed)
                );
                ids = Some(accepted);
            }
        }
        records = scan(&clients.dynamodb, &table).await?;
        let mut by_state: BTreeMap<String, usize> = BTreeMap::new();
        for r in &records {
            *by_state.entry(state_of(r)).or_default() += 1;
        }
        let settled = records.iter().filter(|r| settled(r)).count();
        let refused = door.refused.load(Ordering::Relaxed);
        println!(
            "demo: {:>5.1} s  {}{}",
            started.elapsed().as_secs_f64(),
            if by_state.is_empty() {
                "no order yet".to_owned()
            } else {
                by_state.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join("  ")
            },
            if ids.is_none() && refused > 0 {
                format!("  (door: {refused} refused)")
            } else {
                String::new()
            }
        );
        let done =
            ids.as_ref().is_some_and(|ids| settled == ids.len() && records.len() == ids.len());
        // Orders accepted late (a run paced slower than its door, or held back by kills) get the
        // whole limit after the last acceptance to end, as the first ones did.
        let ending_by = accepted_at.get().map_or(deadline, |at| *at + limit);
        if done || Instant::now() > ending_by {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let ids = match (ids, submitting) {
        (Some(ids), _) => ids,
        (None, Some(s)) => {
            s.abort();
            records
                .iter()
                .filter_map(|r| r.get("OrderId").and_then(|v| v.as_s().ok()).cloned())
                .collect()
        }
        (None, None) => Vec::new(),
    };
    let mut summary =
        summarise(stack, &clients, &http, &records, ids.len(), started.elapsed(), &door, kills)
            .await?;
    summary.kills = u32::try_from(kills.load(Ordering::Relaxed)).unwrap_or(u32::MAX);
    Ok(summary)
}

/// Sends order `i` until it is accepted or `deadline` passes; returns its id if accepted.
/// Submits the demo's `i`th order: a shop order, or (with `accounts`, one in
/// [`ACCOUNT_EVERY`]) an account to open.
async fn submit(
    http: &reqwest::Client,
    signer: &SigV4,
    api: &str,
    i: usize,
    accounts: bool,
    deadline: Instant,
    door: &Door,
) -> Option<String> {
    let account = accounts && i % ACCOUNT_EVERY == ACCOUNT_EVERY - 1;
    let (path, body) = if account {
        let body = serde_json::json!({
            "customer": {"name": format!("Holder {i}"), "email": format!("holder-{i}@example.com")},
            "plan": if i % 2 == 0 { "basic" } else { "premium" },
            "initial_deposit": 1000 * (i % 50)
        });
        (format!("{api}/orders?workflow={ACCOUNT_WORKFLOW}"), body.to_string())
    } else {
        let body = format!(
            r#"{{"customer_id":"demo-{c}","currency":"EUR","items":[{{"sku":"BOOK-{s}","quantity":{q},"unit_price":1250}}],
            "ship_to":{{"name":"Ada","line1":"1 Main St","city":"Paris","postal_code":"75001","country":"FR"}}}}"#,
            c = i % 37,
            s = i % 5,
            q = 1 + i % 3
        );
        (format!("{api}/orders"), body)
    };
    let jitter = SplitMix::seeded(i as u64);
    let mut backoff = Duration::from_millis(500);
    while Instant::now() < deadline {
        let request = http
            .post(&path)
            .header("content-type", "application/json")
            .header("idempotency-key", format!("demo-order-{i:05}"))
            .body(body.clone());
        let answer = signer.send(http, request).await;
        let wait = match answer {
            Ok(a) if a.status() == 202 => {
                let v: Value = a.json().await.ok()?;
                return v["order_id"].as_str().map(str::to_owned);
            }
            Ok(a) if a.status() == 503 && a.headers().contains_key("retry-after") => {
                door.refused.fetch_add(1, Ordering::Relaxed);
                let seconds = a
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(1);
                Some(Duration::from_secs(seconds))
            }
            Ok(a) if a.status() == 429 => {
                door.throttled.fetch_add(1, Ordering::Relaxed);
                None
            }
            // Anything else (a killed submission process, a refused connection): the same key
            // again shortly, as a client should.
            _ => {
                door.other.fetch_add(1, Ordering::Relaxed);
                None
            }
        };
        let wait = match wait {
            Some(retry_after) => retry_after,
            None => {
                backoff = (backoff * 2).min(Duration::from_secs(30));
                backoff
            }
        };
        tokio::time::sleep(wait.mul_f64(1.0 + 0.2 * jitter.unit())).await;
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

/// Whether what the simulated service did explains why an order did not go through:
///
/// - refused at a step: the service refused that step's key for good (or had undone it);
/// - timed out at a step, its lease expired N times: the service failed that step's key (an
///   outage, a transient fault, throttling or a lost answer) at least N times, since a lease
///   runs out only when its agent's calls keep failing; or function processes were being
///   killed. A request dropped or held up in a queue meets no fault at all;
/// - anything else (a step the workflow does not know): nothing explains it.
fn explained(cause: &Value, order_id: &str, faulted: &Value, kills: u64) -> bool {
    let step = cause["step"].as_str().unwrap_or_default();
    let counts = &faulted[format!("{order_id}/{step}/do")];
    let n = |k: &str| counts[k].as_u64().unwrap_or(0);
    match cause["kind"].as_str() {
        Some("step_rejected") => n("permanent") + n("tombstoned") > 0,
        Some("step_timed_out") => {
            let failed = n("outage") + n("transient") + n("throttled") + n("lost_answer");
            kills > 0 || failed >= cause["failures"].as_u64().unwrap_or(1)
        }
        _ => false,
    }
}

/// The steps of an order (its record's body) whose failures were only reported, with their
/// status.
fn reported_steps(body: &Value) -> Vec<(String, String)> {
    let steps = body["steps"].as_array().map(Vec::as_slice).unwrap_or_default();
    steps
        .iter()
        .filter(|st| st.get("reported").is_some())
        .map(|st| {
            let field = |k: &str| st[k].as_str().unwrap_or_default().to_owned();
            (field("name"), field("status"))
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
async fn summarise(
    stack: &LocalStack,
    clients: &Clients,
    http: &reqwest::Client,
    records: &[Item],
    accepted: usize,
    elapsed: Duration,
    door: &Door,
    kills: &AtomicU64,
) -> Result<Summary, Error> {
    let remote = stack.stack.attribute("RemoteSimFunctionUrl", "FunctionUrl").unwrap_or_default();
    // Without the service's own account there is nothing to judge the orders against.
    let signer = sigv4::local_signer(DEMO_CLIENT, &stack.stack.context.region, sigv4::LAMBDA);
    let get = |path: &'static str| {
        let url = format!("{remote}{path}");
        let signer = &signer;
        async move {
            let answer = signer.send(http, http.get(url)).await.map_err(|e| e.to_string());
            let answer = answer.and_then(|r| r.error_for_status().map_err(|e| e.to_string()));
            match answer {
                Ok(r) => r.json::<Value>().await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            }
            .map_err(|e| Error::Local(format!("reading the simulated service's /{path}: {e}")))
        }
    };
    let (stats, faulted, ledger) = tokio::join!(get("stats"), get("stats/keys"), get("ledger"));
    let (stats, faulted, ledger) = (stats?, faulted?, ledger?);
    // Each order's end, for the orders whose end says exactly what the service must hold: a
    // processed order every step once, a compensated one nothing. An order failed with steps
    // left to undo by hand may keep those; the count still holds it to at most one each.
    let mut ends = HashMap::new();
    let kills = kills.load(Ordering::Relaxed);

    let mut s = Summary { orders: accepted, ..Summary::default() };
    let mut to_terminal = Vec::new();
    // Steps of the orders, by workflow: an order that goes through sends and handles one start
    // message and a request and a reply per step, and writes its state once at submission,
    // once to claim, and once per step.
    let mut steps = 0usize;
    let mut by_workflow: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let (mut resets, mut error_ids) = (0usize, Vec::new());
    let (mut compensated_unexplained, mut failed_unexplained) = (0, 0);
    let (mut reported_ids, mut reported_unexplained) = (Vec::new(), 0);
    for r in records {
        let b = body(r);
        let timeline = b["timeline"].as_array().cloned().unwrap_or_default();
        resets += timeline.iter().filter(|e| e["what"] == "retry_scheduled").count();
        let end = timeline
            .iter()
            .rev()
            .find(|e| matches!(e["what"].as_str(), Some("processed" | "compensated" | "failed")));
        let created =
            r.get("CreatedAt").and_then(|v| v.as_n().ok()).and_then(|n| n.parse::<i64>().ok());
        match (end.and_then(|e| e["at"].as_i64()), created) {
            (Some(end), Some(created)) => to_terminal.push(end - created),
            // A finished order whose times cannot be read would leave the figures below
            // silently short.
            _ if matches!(state_of(r).as_str(), "Processed" | "Error") => s.untimed += 1,
            _ => {}
        }
        let id = r.get("OrderId").and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
        let why = explained(&b["cause"], &id, &faulted, kills);
        let workflow = b["workflow"].as_str().unwrap_or_default().to_owned();
        steps += b["steps"].as_array().map_or(0, Vec::len);
        let tally = by_workflow.entry(workflow.clone()).or_default();
        tally.0 += 1;
        match (state_of(r).as_str(), end.and_then(|e| e["what"].as_str())) {
            ("Processed", _) => {
                s.processed += 1;
                tally.1 += 1;
                let reported = reported_steps(&b);
                if !reported.is_empty() {
                    s.reported += 1;
                    reported_ids.push(id.clone());
                    // A report must be what the service did to that step, as a failure must.
                    let causes = b["steps"].as_array().cloned().unwrap_or_default();
                    let why = causes
                        .iter()
                        .filter_map(|st| st.get("reported"))
                        .all(|cause| explained(cause, &id, &faulted, kills));
                    reported_unexplained += usize::from(!why);
                }
                let end = effects::End { reported, ..effects::End::new(&workflow, "Processed") };
                ends.insert(id.clone(), end);
            }
            ("Error", Some("compensated")) => {
                s.compensated += 1;
                ends.insert(id.clone(), effects::End::new(&workflow, "Compensated"));
                compensated_unexplained += usize::from(!why);
            }
            ("Error", _) => {
                s.failed += 1;
                failed_unexplained += usize::from(!why);
            }
            _ => s.unfinished += 1,
        }
        if state_of(r) == "Error" {
            error_ids.push(id);
        }
    }
    s.unfinished += accepted.saturating_sub(records.len());
    s.unexplained = compensated_unexplained + failed_unexplained + reported_unexplained;
    let ended = [s.processed, s.compensated, s.failed];
    let metrics = ended_in_metrics(stack, ended, stack.unanswered()).await;
    s.metrics_disagree = !metrics.keeps_promise(ended);
    let traces = traces_seen(stack, records);
    s.traces_broken = traces.broken;

    // Alerts, as an operator would read them: from the queue the alert rule feeds.
    let alerts_url = stack.stack.reference("AlertsQueue").unwrap_or_default();
    let mut alerted: HashSet<String> = HashSet::new();
    loop {
        let got = clients
            .sqs
            .receive_message()
            .queue_url(&alerts_url)
            .max_number_of_messages(10)
            .send()
            .await;
        let messages = got.ok().and_then(|o| o.messages).unwrap_or_default();
        if messages.is_empty() {
            break;
        }
        for m in messages {
            let event: Value =
                serde_json::from_str(m.body().unwrap_or_default()).unwrap_or(Value::Null);
            if let Some(order) = event["detail"]["order_id"].as_str() {
                alerted.insert(order.to_owned());
            }
            let _ = clients
                .sqs
                .delete_message()
                .queue_url(&alerts_url)
                .receipt_handle(m.receipt_handle().unwrap_or_default())
                .send()
                .await;
        }
    }
    s.errors_without_alert = error_ids.iter().filter(|id| !alerted.contains(*id)).count()
        + reported_ids.iter().filter(|id| !alerted.contains(*id)).count();
    // The ledger agent's effects are in its own table: an open account is its step in place,
    // a closed one that step undone.
    let mut ledger = ledger;
    let accounts = format!("{}-ledger-accounts", stack.stack.context.stack_name);
    if let Ok(items) = scan(&clients.dynamodb, &accounts).await {
        let effects = ledger["effects"].as_array_mut();
        let effects = effects.ok_or_else(|| Error::Local("the ledger has no effects".into()))?;
        for item in items {
            let key = item.get("StepKey").and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
            let order = key.split('/').next().unwrap_or_default().to_owned();
            let effect = |action: &str, direction: &str| {
                serde_json::json!({"order_id": order, "action": action, "direction": direction,
                                   "applications": 1, "output": {}})
            };
            effects.push(effect("open-account", "do"));
            if item.get("Status").and_then(|v| v.as_s().ok()).is_some_and(|s| s == "closed") {
                effects.push(effect("close-account", "undo"));
            }
        }
    }
    s.effects_wrong = effects::mismatches_of(&ledger, &workflows_run(stack), &ends);

    to_terminal.sort_unstable();
    let pct = |p: f64| {
        to_terminal
            .get(((to_terminal.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(0)
    };
    let calls = stack.proxy.counts.snapshot();
    let n = accepted.max(1) as f64;
    let seen = |service: &str, pick: &dyn Fn(&str) -> bool| -> (f64, f64) {
        let (requests, messages) = calls
            .iter()
            .filter(|((s, op), _)| s == service && pick(op))
            .fold((0, 0), |(r, m), (_, seen)| (r + seen.requests, m + seen.messages));
        (requests as f64 / n, messages as f64 / n)
    };
    // The work queues are those the functions consume; physical names end with the logical
    // id, by which the proxy names a queue.
    let work_queues: Vec<&str> = stack
        .functions
        .iter()
        .flat_map(|f| &f.spec.events)
        .filter_map(|e| match e {
            crate::functions::EventSource::Sqs { queue_arn, .. } => {
                queue_arn.rsplit([':', '-']).next()
            }
            _ => None,
        })
        .collect();
    let (_, sent) = seen("sqs", &|op| {
        op.starts_with("SendMessage")
            && work_queues.iter().any(|q| op.ends_with(&format!(" to {q}")))
    });
    let (_, handled) = seen("sqs", &|op| op == "ReceiveMessage");
    let (state_puts, _) = seen("dynamodb", &|op| op == "PutItem on StateTable");
    let (transactions, _) = seen("dynamodb", &|op| op == "TransactWriteItems");
    let writes = state_puts + transactions;
    let steps = steps as f64 / records.len().max(1) as f64;
    let (fault_free_messages, fault_free_writes) = (1.0 + 2.0 * steps, 2.0 + steps);

    let mut t = String::new();
    t.push_str(&format!(
        "\n# Demo summary ({accepted} orders, {:.0} s)\n\n",
        elapsed.as_secs_f64()
    ));
    t.push_str(&format!(
        "processed {} ({} with a step's failure only reported, {} unexplained), compensated {} ({} unexplained), failed {} ({} unexplained), not finished {}\n",
        s.processed,
        s.reported,
        reported_unexplained,
        s.compensated,
        compensated_unexplained,
        s.failed,
        failed_unexplained,
        s.unfinished
    ));
    t.push_str(&format!(
        "workflows: {}\n",
        by_workflow
            .iter()
            .map(|(w, (orders, processed))| format!("{w} {orders} ({processed} processed)"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    t.push_str(&format!(
        "alerts: {} orders in Error and {} processed with a report, {} alerted, {} without an alert\n",
        error_ids.len(),
        reported_ids.len(),
        error_ids.iter().chain(&reported_ids).filter(|id| alerted.contains(*id)).count(),
        s.errors_without_alert
    ));
    t.push_str(&format!(
        "remote calls: {} ({} transient, {} throttled, {} during the outage, {} answers lost, {} refused for good)\n",
        stats["total"], stats["transient"], stats["throttled"], stats["outage"], stats["lost_answer"], stats["permanent"]
    ));
    t.push_str(&format!(
        "effects in place, per order and step: {} wrong ({} processed or compensated orders held to their end, every order to at most once a step){}\n",
        s.effects_wrong.len(),
        ends.len(),
        s.effects_wrong.iter().take(5).map(|w| format!("\n  {w}")).collect::<String>()
    ));
    t.push_str(&format!(
        "door: {} refused while the queues were long (sent again after Retry-After), {} throttled, {} other errors\n",
        door.refused.load(Ordering::Relaxed),
        door.throttled.load(Ordering::Relaxed),
        door.other.load(Ordering::Relaxed)
    ));
    s.dead_lettered = stack.dead_letters.arrivals().len();
    t.push_str(&format!(
        "throttling: {} invocations throttled{}, {} AWS requests failed by injected faults; dead-lettered: {} messages\n",
        stack.account.as_ref().map_or(0, |a| a.throttled()),
        stack.account.as_ref().map_or(String::new(), |a| format!(" (account quota {})", a.quota())),
        stack.proxy.faults.hits(),
        s.dead_lettered
    ));
    t.push_str(&format!(
        "supervisor resets: {resets}; per order: {sent:.2} messages sent, {handled:.2} handled, {writes:.2} state writes (amplification {:.2}, {:.2}, {:.2} against the fault-free {fault_free_messages:.2}, {fault_free_messages:.2}, {fault_free_writes:.2})\n",
        sent / fault_free_messages,
        handled / fault_free_messages,
        writes / fault_free_writes
    ));
    t.push_str(&format!(
        "time to terminal: p50 {:.2} s, p95 {:.2} s, max {:.2} s{}\n\n",
        pct(0.5) as f64 / 1000.0,
        pct(0.95) as f64 / 1000.0,
        to_terminal.last().copied().unwrap_or(0) as f64 / 1000.0,
        if s.untimed > 0 {
            format!(" ({} finished orders without readable times)", s.untimed)
        } else {
            String::new()
        }
    ));

    t.push_str(&traces.text);
    t.push_str(&metrics.text(&s));
    // AWS API calls per order, as counted by the proxy in front of the emulator.
    t.push_str(&format!("| service | operation | calls per order | list price (us-east-1, {}) | per million orders |\n| --- | --- | ---: | --- | ---: |\n", prices::AS_OF));
    let mut total = 0.0;
    for ((service, operation), seen) in &calls {
        let per = seen.requests as f64 / n;
        let (unit, note) = price(service, operation);
        let cost = per * unit;
        total += cost;
        t.push_str(&format!("| {service} | {operation} | {per:.2} | {note} | ${cost:.2} |\n"));
    }
    // The simulated remote service stands for the outside world: its invocations are not the
    // system's. The door's invocations (one per HTTP request, refused ones included) are kept
    // apart from the workflow's, which batching makes fewer per order as traffic grows.
    let is_api = |f: &&crate::local::RunningFunction| {
        f.spec.events.iter().any(|e| matches!(e, crate::functions::EventSource::HttpApi { .. }))
    };
    let workflow: u64 = stack
        .functions
        .iter()
        .filter(|f| f.spec.logical_id != crate::local::REMOTE_SERVICE && !is_api(f))
        .map(|f| f.api.invocations())
        .sum();
    let api_requests: u64 =
        stack.functions.iter().filter(is_api).map(|f| f.api.invocations()).sum();
    let lambda_workflow = workflow as f64 / n * per_million(prices::LAMBDA_REQUEST);
    let lambda_api = api_requests as f64 / n * per_million(prices::LAMBDA_REQUEST);
    let gateway = api_requests as f64 / n * per_million(prices::HTTP_API_REQUEST);
    total += lambda_workflow + lambda_api + gateway;
    let lambda = per_million(prices::LAMBDA_REQUEST);
    t.push_str(&format!(
        "| lambda | invocations of the scheduler, agents and supervisor | {:.2} | ${lambda:.2} per million | ${lambda_workflow:.2} |\n",
        workflow as f64 / n
    ));
    t.push_str(&format!(
        "| lambda | invocations behind the HTTP API | {:.2} | ${lambda:.2} per million | ${lambda_api:.2} |\n",
        api_requests as f64 / n
    ));
    t.push_str(&format!(
        "| apigateway | HTTP API requests | {:.2} | ${:.2} per million | ${gateway:.2} |\n",
        api_requests as f64 / n,
        per_million(prices::HTTP_API_REQUEST)
    ));
    // Metric lines are log lines: CloudWatch Logs ingestion is what they cost per order (the
    // metrics themselves cost per series and month, whatever the traffic).
    let (metric_lines, metric_bytes) = stack.metrics.lines();
    let metric_cost = metric_bytes as f64 / n * 1e6 / 1e9 * prices::CLOUDWATCH_LOGS_GB;
    total += metric_cost;
    t.push_str(&format!(
        "| cloudwatch | metric lines ({:.0} bytes per order) | {:.2} | ${:.2} per GB of logs ingested | ${metric_cost:.2} |\n",
        metric_bytes as f64 / n,
        metric_lines as f64 / n,
        prices::CLOUDWATCH_LOGS_GB
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
fn price(service: &str, operation: &str) -> (f64, String) {
    let (wru, rru) = (per_million(prices::DYNAMODB_WRU), per_million(prices::DYNAMODB_RRU));
    let units = |n: f64, what: &str, price: f64| {
        let n_text = if n == 0.5 { "½".to_owned() } else { format!("{n}") };
        (n * price, format!("{n_text} {what} at ${price:.3} per million"))
    };
    match (service, operation) {
        ("dynamodb", "TransactWriteItems") => units(4.0, "write units", wru),
        ("dynamodb", op)
            if op.starts_with("PutItem") || op == "UpdateItem" || op == "DeleteItem" =>
        {
            units(1.0, "write unit", wru)
        }
        ("dynamodb", "GetItem, consistent") => units(1.0, "read unit", rru),
        ("dynamodb", "GetItem, eventual" | "Query" | "Scan") => units(0.5, "read unit", rru),
        ("dynamodb", _) => (0.0, "control plane, free".into()),
        ("sqs", _) => {
            let p = per_million(prices::SQS_REQUEST);
            (p, format!("${p:.2} per million requests"))
        }
        ("eventbridge", "PutEvents") => {
            let p = per_million(prices::EVENTBRIDGE_EVENT);
            (p, format!("${p:.2} per million events"))
        }
        (_, _) => (0.0, "not billed per call".into()),
    }
}

/// What the functions' metrics said, and what printing them costs.
struct TracesSeen {
    broken: usize,
    text: String,
}

/// Whether every order's hops are in one trace, the one its correlation id names, as the
/// segments the functions sent to the local X-Ray daemon say.
fn traces_seen(stack: &LocalStack, records: &[Item]) -> TracesSeen {
    let seen = OrderTraces::of(&stack.traces.segments());
    let (mut whole, mut broken, mut hops) = (0, 0, 0);
    for r in records {
        let id = r.get("OrderId").and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
        let correlation = body(r)["correlation_id"].as_str().unwrap_or_default().to_owned();
        match seen.by_order.get(&id) {
            Some((traces, n)) if traces == &[correlation] => {
                whole += 1;
                hops += n;
            }
            _ => broken += 1,
        }
    }
    let text = format!(
        "traces: {whole} orders each in one trace of its own ({:.2} hops each on average), {broken} split or missing; {} hops whose parent segment was not received\n",
        hops as f64 / whole.max(1) as f64,
        seen.orphans
    );
    TracesSeen { broken, text }
}

struct MetricsSeen {
    /// Orders ended: processed, compensated, failed.
    ended: [usize; 3],
    /// Invocations that died or ran out of time before they answered.
    died: u64,
    text: String,
}

impl MetricsSeen {
    /// What the count of ended orders promises (`sas_engine::metrics::print_ends_at_once`): never
    /// more than the records of any outcome, and fewer only by orders whose ending invocation
    /// died right after its write, so at most one per invocation that died.
    fn keeps_promise(&self, records: [usize; 3]) -> bool {
        let over = self.ended.iter().zip(records).any(|(m, r)| *m > r);
        !over && self.short(records) as u64 <= self.died
    }

    fn short(&self, records: [usize; 3]) -> usize {
        records.iter().zip(self.ended).map(|(r, m)| r.saturating_sub(m)).sum()
    }

    fn text(&self, s: &Summary) -> String {
        let records = [s.processed, s.compensated, s.failed];
        let mut t = self.text.clone();
        if s.metrics_disagree {
            t.push_str(&format!(
                "METRICS DISAGREE: they count {:?} ended (processed, compensated, failed), the records {:?}, with {} invocations that died\n",
                self.ended, records, self.died
            ));
        } else if self.short(records) > 0 {
            t.push_str(&format!(
                "metrics: {} ended orders not counted, their invocations killed between the write that ended them and its print ({} invocations died in all)\n",
                self.short(records),
                self.died
            ));
        }
        t.push('\n');
        t
    }
}

/// Reads the metrics the functions printed, waiting a little for the last invocations' lines
/// to reach `expected` ended orders.
async fn ended_in_metrics(stack: &LocalStack, expected: [usize; 3], died: u64) -> MetricsSeen {
    let m = &stack.metrics;
    let ended = || {
        let by = m.by(sas_engine::metrics::ORDERS_ENDED, "outcome");
        let sum = |o: &str| by.get(o).map_or(0, |s| s.sum as usize);
        [sum("processed"), sum("compensated"), sum("failed")]
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while ended() != expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ended = ended();
    let mut t = String::new();
    let times = m.by(sas_engine::metrics::TIME_TO_TERMINAL, "outcome");
    let processed = times.get("processed").cloned().unwrap_or_default();
    let calls = m.by(sas_engine::metrics::REMOTE_CALL_DURATION, "outcome");
    let count = |o: &str| calls.get(o).map_or(0, |s| s.count);
    let expiries = m.by(sas_engine::metrics::LEASE_EXPIRIES, "counted");
    let expired = |c: &str| expiries.get(c).map_or(0, |s| s.sum as u64);
    let resets = m.by(sas_engine::metrics::SUPERVISOR_RESETS, "");
    let (lines, _) = m.lines();
    t.push_str(&format!(
        "metrics (the functions' own, from their embedded-metric lines): ended {} processed, {} compensated, {} failed; processed in p50 {:.2} s, p95 {:.2} s; remote calls {} ok, {} refused, {} transient; lease expiries {} counted, {} not; supervisor resets {}; {} series in {} lines\n",
        ended[0],
        ended[1],
        ended[2],
        processed.quantile(0.5).unwrap_or(0.0),
        processed.quantile(0.95).unwrap_or(0.0),
        count("ok"),
        count("refused"),
        count("transient"),
        expired("yes"),
        expired("no"),
        resets.get("").map_or(0, |s| s.sum as u64),
        m.snapshot().len(),
        lines,
    ));
    MetricsSeen { ended, died, text: t }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_call_is_priced_from_the_one_price_table() {
        let close = |(cost, note): (f64, String), want: f64, text: &str| {
            assert!((cost - want).abs() < 1e-9, "{cost} for {text}");
            assert_eq!(note, text);
        };
        close(price("dynamodb", "TransactWriteItems"), 2.5, "4 write units at $0.625 per million");
        close(
            price("dynamodb", "PutItem on StateTable"),
            0.625,
            "1 write unit at $0.625 per million",
        );
        close(price("dynamodb", "Query"), 0.0625, "½ read unit at $0.125 per million");
        close(price("sqs", "ReceiveMessage"), 0.40, "$0.40 per million requests");
        close(price("eventbridge", "PutEvents"), 1.00, "$1.00 per million events");
        close(price("dynamodb", "DescribeTable"), 0.0, "control plane, free");
    }
    use serde_json::json;

    #[test]
    fn a_failed_order_is_explained_only_by_what_the_service_did_to_its_step() {
        let faulted = json!({
            "o1/charge-payment/do": {"permanent": 1, "total": 2},
            "o2/reserve-inventory/do": {"outage": 3, "transient": 1, "total": 6},
            "o4/ship/do": {"transient": 1, "total": 2},
        });
        let rejected = |step: &str| json!({"kind": "step_rejected", "step": step, "reason": "no"});
        let timed_out = |step: &str| json!({"kind": "step_timed_out", "step": step, "failures": 4});
        assert!(explained(&rejected("charge-payment"), "o1", &faulted, 0));
        assert!(!explained(&rejected("ship"), "o1", &faulted, 0), "another step was refused");
        assert!(explained(&timed_out("reserve-inventory"), "o2", &faulted, 0));
        assert!(!explained(&timed_out("charge-payment"), "o1", &faulted, 0), "refused, not down");
        // Four expired leases need four failed calls: one transient fault does not explain
        // them, and a step nothing was done to is explained only by kills.
        assert!(!explained(&timed_out("ship"), "o4", &faulted, 0));
        assert!(!explained(&timed_out("ship"), "o3", &faulted, 0));
        assert!(explained(&timed_out("ship"), "o3", &faulted, 5));
        assert!(!explained(&json!({"kind": "unknown_step", "step": "x"}), "o3", &faulted, 5));
    }
}
