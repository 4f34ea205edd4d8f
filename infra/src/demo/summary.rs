//! The demo's summary and its checks: how each order ended and whether a fault the simulated
//! service injected explains it, whether every failed order raised its alert, and whether the
//! service holds exactly what the orders' ends say.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::Value;

use super::clients::Door;
use super::figures::{self, ended_in_metrics, traces_seen};
use super::records::{Item, body, scan, state_of};
use super::{DEMO_CLIENT, Summary, effects, workflows_run};
use crate::Error;
use crate::access::sigv4;
use crate::emulation::aws::Clients;
use crate::emulation::local::LocalStack;
use sas_engine::state::FanState;

/// What the simulated service says it did: its fault counts, the faults it injected per step
/// key, and its ledger of effects.
struct Service {
    stats: Value,
    faulted: Value,
    ledger: Value,
    /// The faults it ran with.
    faults: Value,
}

/// The orders as their records tell them, beyond the counts kept in the [`Summary`].
#[derive(Default)]
pub(super) struct Tally {
    /// Milliseconds from creation to end, of every finished order whose times could be read.
    pub(super) to_terminal: Vec<i64>,
    /// Steps of the orders, by workflow: an order that goes through sends and handles one start
    /// message and a request and a reply per step, and writes its state once at submission,
    /// once to claim, and once per step.
    pub(super) steps: usize,
    /// Orders, and processed ones, by workflow.
    by_workflow: BTreeMap<String, (usize, usize)>,
    /// Milliseconds from creation to Processed, by workflow.
    to_processed: BTreeMap<String, Vec<i64>>,
    pub(super) resets: usize,
    /// Milliseconds each order's steps waited for a held service, of the orders that did.
    held: Vec<i64>,
    error_ids: Vec<String>,
    reported_ids: Vec<String>,
    compensated_unexplained: usize,
    failed_unexplained: usize,
    reported_unexplained: usize,
    /// Each order's end, for the orders whose end says exactly what the service must hold: a
    /// processed order every step once, a compensated one nothing. An order failed with steps
    /// left to undo by hand may keep those; the count still holds it to at most one each.
    ends: HashMap<String, effects::End>,
    /// Orders submitted (not children) whose records were read.
    orders: usize,
    /// Child orders (a step over a list runs one per element): all, processed, and undone by
    /// their parent.
    children: usize,
    children_processed: usize,
    children_undone: usize,
    /// Child orders in Error: compensated, or failed otherwise.
    children_compensated: usize,
    children_failed: usize,
    /// The child workflow of each step over a list, by workflow and step.
    lists: HashMap<(String, String), String>,
    /// Elements of lists run inline whose effects are held to their list's end.
    elements: usize,
}

/// The child workflow of each step over a list of `workflows` (by name, as JSON), by workflow
/// and step.
fn lists_of(workflows: &[(String, String)]) -> HashMap<(String, String), String> {
    let mut lists = HashMap::new();
    for (name, json) in workflows {
        let spec: Value = serde_json::from_str(json).unwrap_or_default();
        for step in spec["steps"].as_array().map(Vec::as_slice).unwrap_or_default() {
            if let (Some(step), Some(child)) =
                (step["name"].as_str(), step["each"]["workflow"].as_str())
            {
                lists.insert((name.clone(), step.to_owned()), child.to_owned());
            }
        }
    }
    lists
}

/// Whether an order in Error ended compensated, as its timeline says.
fn compensated(b: &Value) -> bool {
    let timeline = b["timeline"].as_array().map(Vec::as_slice).unwrap_or_default();
    let end = timeline.iter().rev().find_map(|e| match e["what"].as_str() {
        Some(what @ ("processed" | "compensated" | "failed")) => Some(what),
        _ => None,
    });
    end == Some("compensated")
}

/// What a run left to be summed up: the state records read at its end, and what the clients
/// and the killer counted on the way.
pub(super) struct Ran<'a> {
    pub(super) records: &'a [Item],
    pub(super) accepted: usize,
    pub(super) elapsed: Duration,
    pub(super) door: &'a Door,
    pub(super) kills: &'a AtomicU64,
}

pub(super) async fn summarise(
    stack: &LocalStack,
    clients: &Clients,
    http: &reqwest::Client,
    ran: Ran<'_>,
) -> Result<Summary, Error> {
    let Ran { records, accepted, elapsed, door, kills } = ran;
    let Service { stats, faulted, ledger, faults } = service_reports(stack, http).await?;
    let kills = kills.load(Ordering::Relaxed);

    let mut s = Summary { orders: accepted, ..Summary::default() };
    let mut tally = Tally { lists: lists_of(&workflows_run(stack)), ..Tally::default() };
    for r in records {
        tally.add(r, &faulted, kills, &mut s);
    }
    s.unfinished += accepted.saturating_sub(tally.orders);
    s.reported = tally.reported_ids.len();
    s.unexplained =
        tally.compensated_unexplained + tally.failed_unexplained + tally.reported_unexplained;
    // The functions count every order that ends, children too.
    let ended = [
        s.processed + tally.children_processed,
        s.compensated + tally.children_compensated,
        s.failed + tally.children_failed,
    ];
    let metrics = ended_in_metrics(stack, ended, stack.unanswered()).await;
    s.metrics_disagree = !metrics.keeps_promise(ended);
    let traces = traces_seen(stack, records).await;
    s.traces_broken = traces.broken;

    let alerted = alerted(stack, clients).await;
    s.errors_without_alert = tally.error_ids.iter().filter(|id| !alerted.contains(*id)).count()
        + tally.reported_ids.iter().filter(|id| !alerted.contains(*id)).count();
    let (ledger, statements_wrong) = with_accounts(stack, clients, ledger).await?;
    s.effects_wrong = effects::mismatches_of(&ledger, &workflows_run(stack), &tally.ends);
    s.effects_wrong.extend(statements_wrong);
    s.over_rate = over_rate(stack, &stats);
    s.outage_missed = declares_outage(&faults) && stats["outage"].as_u64().unwrap_or(0) == 0;

    tally.to_terminal.sort_unstable();
    let calls = stack.proxy.counts.snapshot();
    let per_order = figures::per_order(stack, &calls, accepted, &tally, records.len());

    let mut t = outcomes(&s, &tally, &alerted, &stats, accepted, elapsed);
    t.push_str(&holds(stack, clients, &tally.held).await);
    t.push_str(&format!(
        "door: {} refused while the queues were long (sent again after Retry-After), {} throttled by the route (429), {} answered 500 (the function throttled or failed), {} other errors\n",
        door.refused.load(Ordering::Relaxed),
        door.throttled.load(Ordering::Relaxed),
        door.failed.load(Ordering::Relaxed),
        door.other.load(Ordering::Relaxed)
    ));
    s.dead_lettered = stack.dead_letters.arrivals().len();
    t.push_str(&figures::load(stack, &s, &tally, &per_order));
    t.push_str(&traces.text);
    t.push_str(&metrics.text(&s, ended));
    t.push_str(&figures::costs(stack, &calls, accepted));
    s.text = t;
    Ok(s)
}

/// What the simulated service reports: its fault counts, the faults per step key, and its
/// ledger. Without the service's own account there is nothing to judge the orders against.
async fn service_reports(stack: &LocalStack, http: &reqwest::Client) -> Result<Service, Error> {
    let remote = stack.stack.attribute("RemoteSimFunctionUrl", "FunctionUrl").unwrap_or_default();
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
    let (stats, faulted, ledger, faults) =
        tokio::join!(get("stats"), get("stats/keys"), get("ledger"), get("faults"));
    Ok(Service { stats: stats?, faulted: faulted?, ledger: ledger?, faults: faults? })
}

impl Tally {
    /// Counts a child order: not one the clients submitted, but its effects are judged as any
    /// order's, by how it ended.
    fn add_child(&mut self, r: &Item, b: &Value) {
        self.children += 1;
        let id = r.get("OrderId").and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
        let workflow = b["workflow"].as_str().unwrap_or_default();
        let end = match state_of(r).as_str() {
            "Processed" => {
                self.children_processed += 1;
                "Processed"
            }
            "Cancelled" => {
                self.children_undone += 1;
                "Cancelled"
            }
            "Error" if compensated(b) => {
                self.children_compensated += 1;
                "Compensated"
            }
            "Error" => {
                self.children_failed += 1;
                return;
            }
            _ => return,
        };
        self.ends.insert(id, effects::End::new(workflow, end));
    }

    /// Counts one order's record, in `s` and here.
    fn add(&mut self, r: &Item, faulted: &Value, kills: u64, s: &mut Summary) {
        let b = body(r);
        self.steps += b["steps"].as_array().map_or(0, Vec::len);
        if b["parent"].is_object() {
            return self.add_child(r, &b);
        }
        self.orders += 1;
        let timeline = b["timeline"].as_array().cloned().unwrap_or_default();
        self.resets += timeline.iter().filter(|e| e["what"] == "retry_scheduled").count();
        if let Some(held) = held_for(&timeline) {
            self.held.push(held);
        }
        let end = timeline
            .iter()
            .rev()
            .find(|e| matches!(e["what"].as_str(), Some("processed" | "compensated" | "failed")));
        let created =
            r.get("CreatedAt").and_then(|v| v.as_n().ok()).and_then(|n| n.parse::<i64>().ok());
        let workflow = b["workflow"].as_str().unwrap_or_default().to_owned();
        match (end.and_then(|e| e["at"].as_i64()), created) {
            (Some(end), Some(created)) => {
                self.to_terminal.push(end - created);
                if state_of(r) == "Processed" {
                    self.to_processed.entry(workflow.clone()).or_default().push(end - created);
                }
            }
            // A finished order whose times cannot be read would leave the figures below
            // silently short.
            _ if matches!(state_of(r).as_str(), "Processed" | "Error") => s.untimed += 1,
            _ => {}
        }
        let id = r.get("OrderId").and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
        let why = explained(&b["cause"], &id, faulted, kills);
        let per_workflow = self.by_workflow.entry(workflow.clone()).or_default();
        per_workflow.0 += 1;
        match (state_of(r).as_str(), end.and_then(|e| e["what"].as_str())) {
            ("Processed", _) => {
                s.processed += 1;
                per_workflow.1 += 1;
                let reported = reported_steps(&b);
                if !reported.is_empty() {
                    self.reported_ids.push(id.clone());
                    // A report must be what the service did to that step, as a failure must.
                    let why =
                        reported.iter().all(|st| explained(&st["reported"], &id, faulted, kills));
                    self.reported_unexplained += usize::from(!why);
                }
                let field = |st: &Value, k: &str| st[k].as_str().unwrap_or_default().to_owned();
                let reported =
                    reported.iter().map(|st| (field(st, "name"), field(st, "status"))).collect();
                let end = effects::End { reported, ..effects::End::new(&workflow, "Processed") };
                self.ends.insert(id.clone(), end);
            }
            ("Error", Some("compensated")) => {
                s.compensated += 1;
                self.ends.insert(id.clone(), effects::End::new(&workflow, "Compensated"));
                self.compensated_unexplained += usize::from(!why);
            }
            ("Error", _) => {
                s.failed += 1;
                self.failed_unexplained += usize::from(!why);
            }
            _ => s.unfinished += 1,
        }
        self.add_elements(&id, &b, self.ends.get(&id).map(|e| e.state.clone()));
        if state_of(r) == "Error" {
            self.error_ids.push(id);
        }
    }

    /// Holds each element of the order's lists run inline to what its list says of it, as a
    /// child order is held to its end: in place once if it ended well in an order processed,
    /// and not at all otherwise (`end`: the order's end, if it has one to hold it to).
    fn add_elements(&mut self, id: &str, b: &Value, end: Option<String>) {
        let (Some(end), Ok(parent)) = (end, id.parse::<sas_engine::OrderId>()) else { return };
        for step in b["steps"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let Ok(fan) = serde_json::from_value::<FanState>(step["fan"].clone()) else { continue };
            let (Some(_), Some(items)) = (fan.inline, fan.items) else { continue };
            let name = step["name"].as_str().unwrap_or_default();
            let generation = step["generation"].as_u64().unwrap_or(0) as u32;
            let of = (b["workflow"].as_str().unwrap_or_default().to_owned(), name.to_owned());
            let Some(workflow) = self.lists.get(&of).cloned() else { continue };
            for k in 0..items.min(fan.forward.next) {
                let ended_well = !fan.settled.contains(k) && !fan.dirty.contains(k);
                let state =
                    if end == "Processed" && ended_well { "Processed" } else { "Compensated" };
                let element = sas_engine::OrderId::for_element(parent, name, generation, k);
                self.ends.insert(element.to_string(), effects::End::new(&workflow, state));
                self.elements += 1;
            }
        }
    }
}

/// The orders that raised an alert, as an operator would read them: from the queue the alert
/// rule feeds, emptied as it is read.
async fn alerted(stack: &LocalStack, clients: &Clients) -> HashSet<String> {
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
    alerted
}

/// `ledger` with the ledger agent's effects added: they are in its own table, an open account
/// being its step in place, a closed one that step undone; and every account whose statement
/// in the ledger's bucket does not say what its item does.
async fn with_accounts(
    stack: &LocalStack,
    clients: &Clients,
    mut ledger: Value,
) -> Result<(Value, Vec<String>), Error> {
    // The ledger's table as the template names it.
    let accounts = stack.stack.reference("LedgerAccountsTable").unwrap_or_default();
    // The bucket as the template names it: a stack without it keeps no statements.
    let bucket = stack.stack.reference("LedgerStatementsBucket");
    let mut statements_wrong = Vec::new();
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
            let status = item.get("Status").and_then(|v| v.as_s().ok()).cloned();
            if status.as_deref() == Some("closed") {
                effects.push(effect("close-account", "undo"));
            }
            let Some(bucket) = &bucket else { continue };
            let account = item.get("AccountId").and_then(|v| v.as_s().ok()).cloned();
            let account = account.unwrap_or_default();
            let stated = statement(clients, bucket, &account).await;
            if stated.as_deref() != status.as_deref() {
                statements_wrong.push(format!(
                    "order {order}: account {account} is {} but its statement says {}",
                    status.as_deref().unwrap_or("neither open nor closed"),
                    stated.as_deref().unwrap_or("nothing (no statement)")
                ));
            }
        }
    }
    Ok((ledger, statements_wrong))
}

/// The status the statement of `account` in `bucket` gives, if there is one.
async fn statement(clients: &Clients, bucket: &str, account: &str) -> Option<String> {
    let object = clients
        .s3
        .get_object()
        .bucket(bucket)
        .key(format!("statements/{account}.json"))
        .send()
        .await
        .ok()?;
    let bytes = object.body.collect().await.ok()?.into_bytes();
    let statement: Value = serde_json::from_slice(&bytes).ok()?;
    statement["status"].as_str().map(str::to_owned)
}

/// The summary's heading, then how the orders ended, by workflow, with their alerts, the
/// remote calls and the effects in place.
fn outcomes(
    s: &Summary,
    tally: &Tally,
    alerted: &HashSet<String>,
    stats: &Value,
    accepted: usize,
    elapsed: Duration,
) -> String {
    let mut t = String::new();
    t.push_str(&format!(
        "\n# Demo summary ({accepted} orders, {:.0} s)\n\n",
        elapsed.as_secs_f64()
    ));
    t.push_str(&format!(
        "processed {} ({} with a step's failure only reported, {} unexplained), compensated {} ({} unexplained), failed {} ({} unexplained), not finished {}\n",
        s.processed,
        s.reported,
        tally.reported_unexplained,
        s.compensated,
        tally.compensated_unexplained,
        s.failed,
        tally.failed_unexplained,
        s.unfinished
    ));
    t.push_str(&format!(
        "workflows: {}\n",
        tally
            .by_workflow
            .iter()
            .map(|(w, (orders, processed))| {
                let mut times = tally.to_processed.get(w).cloned().unwrap_or_default();
                times.sort_unstable();
                let p50 = times.get(times.len().saturating_sub(1) / 2).copied().unwrap_or(0);
                format!("{w} {orders} ({processed} processed, p50 {:.2} s)", p50 as f64 / 1000.0)
            })
            .collect::<Vec<_>>()
            .join(", ")
    ));
    if tally.children > 0 {
        t.push_str(&format!(
            "child orders (one per parcel of a split shipment): {} ({} processed, {} undone by their parent, {} compensated, {} failed)\n",
            tally.children,
            tally.children_processed,
            tally.children_undone,
            tally.children_compensated,
            tally.children_failed
        ));
    }
    let (error_ids, reported_ids) = (&tally.error_ids, &tally.reported_ids);
    t.push_str(&format!(
        "alerts: {} orders in Error and {} processed with a report, {} alerted, {} without an alert\n",
        error_ids.len(),
        reported_ids.len(),
        error_ids.iter().chain(reported_ids).filter(|id| alerted.contains(*id)).count(),
        s.errors_without_alert
    ));
    t.push_str(&format!(
        "remote calls: {} ({} transient, {} throttled, {} during the outage, {} answers lost, {} refused for good)\n",
        stats["total"], stats["transient"], stats["throttled"], stats["outage"], stats["lost_answer"], stats["permanent"]
    ));
    t.push_str(&format!("busiest second at the service: {}\n", busiest(stats)));
    if s.outage_missed {
        t.push_str("THE OUTAGE MET NO CALL: every order was over before it began, so the run did not show what it was for\n");
    }
    if !s.over_rate.is_empty() {
        t.push_str(&format!("CALLED FASTER THAN DECLARED: {}\n", s.over_rate.join("; ")));
    }
    t.push_str(&format!(
        "effects in place, per order and step: {} wrong ({} processed or compensated orders and {} elements of their lists held to their end, every order to at most once a step){}\n",
        s.effects_wrong.len(),
        tally.ends.len() - tally.elements,
        tally.elements,
        s.effects_wrong.iter().take(5).map(|w| format!("\n  {w}")).collect::<String>()
    ));
    t
}

/// How long an order's steps waited for a held service, from its timeline: from each wait for
/// a service to the end of that hold. `None` if it never waited so.
fn held_for(timeline: &[Value]) -> Option<i64> {
    let mut since: HashMap<&str, i64> = HashMap::new();
    let mut held = None;
    for e in timeline {
        let (Some(step), Some(at)) = (e["step"].as_str(), e["at"].as_i64()) else { continue };
        match e["what"].as_str() {
            Some("waiting") if e["reason"].as_str().is_some_and(|r| r.contains("service")) => {
                since.insert(step, at);
            }
            Some("hold_ended") => {
                if let Some(from) = since.remove(step) {
                    *held.get_or_insert(0) += at - from;
                }
            }
            _ => {}
        }
    }
    held
}

/// The services' holds, as their records tell (of a whole service, or of one action: how
/// long, and the probes that reached each while held: the only calls that did), and the time
/// orders spent waiting for them.
async fn holds(stack: &LocalStack, clients: &Clients, held: &[i64]) -> String {
    let table = stack.stack.reference("ServicesTable").unwrap_or_default();
    let records = scan(&clients.dynamodb, &table).await.unwrap_or_default();
    let mut services = Vec::new();
    let records = records.iter().map(body).filter_map(|b| serde_json::from_value(b).ok());
    for record in records.collect::<Vec<sas_engine::health::ServiceRecord>>() {
        for (on, scope) in record.scopes() {
            let (since, until, probes, by) = match (&scope.held, &scope.released) {
                (Some(h), _) => (h.since, None, h.probes, h.by.clone()),
                (None, Some(r)) => (r.held_since, Some(r.at), r.probes, None),
                (None, None) => continue,
            };
            let how_long = match until {
                Some(until) => format!("for {:.0} s", since.until(until).as_secs_f64()),
                None => "still held".to_owned(),
            };
            let by = by.map_or("its agent".to_owned(), |by| format!("operator {by}"));
            let name = sas_engine::health::hold_key(&record.service, on);
            services.push(format!(
                "{name} (last held by {by}, {how_long}, {probes} probes reached it while held)"
            ));
        }
    }
    let mut held = held.to_vec();
    held.sort_unstable();
    let total: i64 = held.iter().sum();
    format!(
        "holds: {}; {} orders waited for a held service, {:.0} s in all, p50 {:.0} s, longest {:.0} s\n",
        if services.is_empty() { "no service was held".to_owned() } else { services.join(", ") },
        held.len(),
        total as f64 / 1000.0,
        held.get(held.len().saturating_sub(1) / 2).copied().unwrap_or(0) as f64 / 1000.0,
        held.last().copied().unwrap_or(0) as f64 / 1000.0,
    )
}

/// The most calls of each action the service counted in one of its seconds, busiest first.
fn busiest(stats: &Value) -> String {
    let mut actions: Vec<(&String, u64)> = stats["actions"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(action, counts)| (action, counts["busiest_second"].as_u64().unwrap_or(0)))
        .collect();
    actions.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let each: Vec<String> = actions.iter().map(|(a, n)| format!("{a} {n}")).collect();
    format!("{} calls in all ({})", stats["busiest_second"], each.join(", "))
}

/// The actions the service counted more calls of in one of its seconds than their agent's
/// declared rate (`ServiceRates`), one line each. The service counts each action on its own,
/// so the calls of two actions of one agent in one second are not added up here.
fn over_rate(stack: &LocalStack, stats: &Value) -> Vec<String> {
    // The supervisor reads every service's limits; an agent has only its own.
    let Some(supervisor) = stack.functions.iter().find(|f| f.spec.binary == "supervisor") else {
        return Vec::new();
    };
    let env = &supervisor.spec.environment;
    let Ok(config) = sas_engine::config::EngineConfig::from_lookup(|k| env.get(k).cloned()) else {
        return vec!["the supervisor's SERVICE_RATES could not be read".to_owned()];
    };
    over_rate_of(&config, &workflows_run(stack), stats)
}

/// Whether the simulated service's faults (its `GET /faults`) declare an outage, for any
/// action.
fn declares_outage(faults: &Value) -> bool {
    let has = |f: &Value| f["outages"].as_array().is_some_and(|o| !o.is_empty());
    has(&faults["default"])
        || faults["actions"].as_object().is_some_and(|actions| actions.values().any(has))
}

fn over_rate_of(
    config: &sas_engine::config::EngineConfig,
    workflows: &[(String, String)],
    stats: &Value,
) -> Vec<String> {
    let mut over = Vec::new();
    for (_, json) in workflows {
        let workflow: Value = serde_json::from_str(json).unwrap_or(Value::Null);
        for step in workflow["steps"].as_array().into_iter().flatten() {
            let Some(name) = step["agent"].as_str() else { continue };
            let Some(rate) = config.limits_of(name).per_second else { continue };
            let undo = step["compensation"]["action"].as_str();
            for action in step["name"].as_str().into_iter().chain(undo) {
                let most = stats["actions"][action]["busiest_second"].as_u64().unwrap_or(0);
                let line = format!("{action} {most} in one second, {name} declared {rate}");
                if most > u64::from(rate) && !over.contains(&line) {
                    over.push(line);
                }
            }
        }
    }
    over
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

/// The steps of an order (its record's body) whose failures were only reported.
pub(super) fn reported_steps(body: &Value) -> Vec<&Value> {
    let steps = body["steps"].as_array().map(Vec::as_slice).unwrap_or_default();
    steps.iter().filter(|st| st.get("reported").is_some()).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_outage_is_declared_for_every_action_or_for_one() {
        let faults = |f: &str| serde_json::from_str::<Value>(f).unwrap_or(Value::Null);
        assert!(declares_outage(&faults(crate::demo::DEMO_FAULTS)));
        assert!(declares_outage(&faults(
            r#"{"default":{},"actions":{"ship":{"outages":[{"start_s":1,"end_s":2}]}}}"#
        )));
        assert!(!declares_outage(&faults(r#"{"default":{"transient_rate":0.5}}"#)));
        assert!(!declares_outage(&faults(r#"{"default":{"outages":[]}}"#)));
    }

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

    #[test]
    fn an_action_called_faster_than_its_agent_declared_is_named_and_no_other() {
        let vars = [("SERVICE_RATES", "payment=5")];
        let config = sas_engine::config::EngineConfig::from_lookup(|k| {
            vars.iter().find(|(name, _)| *name == k).map(|(_, v)| (*v).to_owned())
        })
        .unwrap();
        let workflow = json!({"name": "shop", "steps": [
            {"name": "charge", "agent": "payment", "compensation": {"action": "refund"}},
            {"name": "ship", "agent": "shipping"},
        ]});
        let workflows = [("shop".to_owned(), workflow.to_string())];
        let stats = |charge: u64, refund: u64| {
            json!({"actions": {
                "charge": {"busiest_second": charge},
                "refund": {"busiest_second": refund},
                "ship": {"busiest_second": 40},
            }})
        };
        assert!(over_rate_of(&config, &workflows, &stats(5, 5)).is_empty(), "5 is the rate");
        assert_eq!(
            over_rate_of(&config, &workflows, &stats(6, 2)),
            ["charge 6 in one second, payment declared 5"]
        );
        assert_eq!(over_rate_of(&config, &workflows, &stats(1, 7)).len(), 1, "undos count too");
    }
}
