//! What an operator sees of a local run: orders by state, time to terminal, queue depths,
//! alerts and dead letters, drawn on one page.
//!
//! An [`Observer`] samples the running stack every two seconds, straight from the emulators
//! (its reads are not the system's cost, so they do not go through the proxy), and keeps the
//! history. Its [`View`] is drawn by [`PAGE`], a page with no external resources: served live
//! by [`Observer::serve`] (the page fetches `view.json` every two seconds, and each order links
//! to its timeline at `orders/{id}`), or written once as a self-contained report by
//! [`Observer::report`], with the view and every listed order's timeline embedded in it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::types::AttributeValue;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use serde::Serialize;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::Error;
use crate::aws::Clients;
use crate::dead_letters::{self, Arrival, DeadLetters};
use crate::local::LocalStack;
use crate::metrics::Metrics;

/// How often the stack is sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(2);
/// Samples kept: two hours at one every two seconds; older ones are dropped.
const SAMPLES_KEPT: usize = 3_600;
/// Orders listed (the latest created), alerts and dead letters shown: enough to browse, few
/// enough that a report of a long run stays a few megabytes.
const ORDERS_LISTED: usize = 1_000;
const ALERTS_SHOWN: usize = 200;
const DEAD_LETTERS_SHOWN: usize = 200;

/// Every state an order can be in, in the order the charts draw them: a state no order is in
/// is still a series, so that a chart's legend does not change as orders move.
pub const STATES: [&str; 6] =
    ["Pending", "Processing", "Processed", "Error", "Paused", "Cancelled"];

/// One sample of the stack.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    /// Seconds since the observer started.
    pub t: f64,
    /// Orders in each of [`STATES`].
    pub states: BTreeMap<String, usize>,
    /// Messages in each queue (visible and in flight), by logical id; a queue that could not
    /// be read is left out of its sample.
    pub queues: BTreeMap<String, u64>,
}

/// An order that ended, and how long it took from acceptance.
#[derive(Clone, Debug, Serialize)]
pub struct Ended {
    pub order_id: String,
    /// `processed`, `compensated`, `failed` or `cancelled`.
    pub outcome: String,
    pub seconds: f64,
}

/// One order as listed.
#[derive(Clone, Debug, Serialize)]
pub struct OrderRow {
    pub order_id: String,
    pub state: String,
    /// Milliseconds since the Unix epoch.
    pub created_at: Option<i64>,
    pub ended_at: Option<i64>,
    pub outcome: Option<String>,
    pub cause: Option<String>,
}

/// An order in Error: the alert it raises, one per order.
#[derive(Clone, Debug, Serialize)]
pub struct Alert {
    pub order_id: String,
    pub at: Option<i64>,
    pub outcome: String,
    pub cause: String,
    /// Whether its timeline records the alert as sent.
    pub sent: bool,
}

/// What the functions' own metrics say about ended orders.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MetricsSummary {
    /// `OrdersEnded` by outcome.
    pub ended: BTreeMap<String, u64>,
    /// `TimeToTerminal` by outcome: (count, p50, p95) in seconds.
    pub time_to_terminal: BTreeMap<String, (u64, f64, f64)>,
    pub lease_expiries: u64,
    pub supervisor_resets: u64,
    /// Metric lines the functions printed.
    pub lines: u64,
}

/// Everything the page draws.
#[derive(Clone, Debug, Serialize)]
pub struct View {
    /// When the observer started, in milliseconds since the Unix epoch.
    pub started_at: i64,
    /// Seconds since then.
    pub elapsed: f64,
    pub states: Vec<String>,
    /// Every queue of the stack, dead-letter queues included, by logical id.
    pub queues: Vec<String>,
    pub samples: Vec<Sample>,
    /// Every ended order.
    pub ended: Vec<Ended>,
    /// Orders in the table, and the latest [`ORDERS_LISTED`] of them, newest first.
    pub order_count: usize,
    pub orders: Vec<OrderRow>,
    /// The latest alerts, newest first.
    pub alerts: Vec<Alert>,
    pub alert_count: usize,
    /// The latest dead-letter arrivals, newest first.
    pub dead_letters: Vec<Arrival>,
    pub dead_letter_count: usize,
    pub metrics: MetricsSummary,
}

/// An order's record as read from the table.
#[derive(Clone, Debug)]
struct Record {
    order_id: String,
    state: String,
    created_at: Option<i64>,
    /// The state record (`Body`), parsed.
    body: Value,
}

impl Record {
    fn from_item(item: &HashMap<String, AttributeValue>) -> Option<Record> {
        let text = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned();
        Some(Record {
            order_id: text("OrderId")?,
            state: text("ProcessState").unwrap_or_default(),
            created_at: item
                .get("CreatedAt")
                .and_then(|v| v.as_n().ok())
                .and_then(|n| n.parse().ok()),
            body: text("Body").and_then(|b| serde_json::from_str(&b).ok()).unwrap_or(Value::Null),
        })
    }

    /// The timeline entry that ended the order, if it ended.
    fn end(&self) -> Option<&Value> {
        self.body["timeline"].as_array()?.iter().rev().find(|e| {
            matches!(e["what"].as_str(), Some("processed" | "compensated" | "failed" | "cancelled"))
        })
    }

    fn outcome(&self) -> Option<String> {
        let ending = self.end().and_then(|e| e["what"].as_str());
        match (self.state.as_str(), ending) {
            ("Processed", _) => Some("processed".into()),
            ("Error", Some("compensated")) => Some("compensated".into()),
            ("Error", _) => Some("failed".into()),
            ("Cancelled", _) => Some("cancelled".into()),
            _ => None,
        }
    }

    fn ended_at(&self) -> Option<i64> {
        self.outcome()?;
        self.body["ended_at"].as_i64().or_else(|| self.end().and_then(|e| e["at"].as_i64()))
    }

    fn cause(&self) -> Option<String> {
        let c = &self.body["cause"];
        let kind = c["kind"].as_str()?;
        let mut text = kind.replace('_', " ");
        if let Some(step) = c["step"].as_str() {
            text.push_str(&format!(" at {step}"));
        }
        if let Some(n) = c["failures"].as_u64() {
            text.push_str(&format!(" after {n} expired leases"));
        }
        if let Some(reason) = c["reason"].as_str() {
            text.push_str(&format!(": {reason}"));
        }
        Some(text)
    }

    fn row(&self) -> OrderRow {
        OrderRow {
            order_id: self.order_id.clone(),
            state: self.state.clone(),
            created_at: self.created_at,
            ended_at: self.ended_at(),
            outcome: self.outcome(),
            cause: self.cause(),
        }
    }
}

#[derive(Debug, Default)]
struct History {
    samples: Vec<Sample>,
    /// The records of the latest scan.
    records: Vec<Record>,
}

#[derive(Debug)]
struct Shared {
    clients: Clients,
    table: String,
    /// Logical id and URL of every queue.
    queues: Vec<(String, String)>,
    started: Instant,
    started_at: i64,
    metrics: Metrics,
    dead_letters: DeadLetters,
    history: Mutex<History>,
}

/// Samples a running stack every [`SAMPLE_EVERY`] and keeps what it saw; dropping it stops
/// the sampling and any page it serves.
#[derive(Debug)]
pub struct Observer {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Observer {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Observer {
    /// Starts sampling `stack`; the first sample is taken before this returns.
    pub async fn start(stack: &LocalStack) -> Result<Observer, Error> {
        let clients = Clients::new(&stack.emulators, &stack.stack.context.region).await;
        let table = stack
            .stack
            .reference("StateTable")
            .ok_or_else(|| Error::Local("no StateTable".into()))?;
        let queues = stack
            .stack
            .created
            .iter()
            .filter_map(|id| Some((id.clone(), stack.stack.attribute(id, "QueueUrl")?)))
            .collect();
        let started_at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let shared = Arc::new(Shared {
            clients,
            table,
            queues,
            started: Instant::now(),
            started_at,
            metrics: stack.metrics.clone(),
            dead_letters: stack.dead_letters.clone(),
            history: Mutex::default(),
        });
        shared.sample().await;
        let sampling = shared.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(SAMPLE_EVERY).await;
                sampling.sample().await;
            }
        });
        Ok(Observer { shared, tasks: vec![task] })
    }

    /// Takes a sample now, so that what follows sees the stack as it is.
    pub async fn refresh(&self) {
        self.shared.sample().await;
    }

    /// What the page draws, as of the latest sample.
    pub fn snapshot(&self) -> View {
        self.shared.view()
    }

    /// Serves the live page on `listener` until the observer is dropped: `/` the page,
    /// `/view.json` the [`View`], `/orders/{id}` an order's timeline, read from the table.
    pub fn serve(&mut self, listener: TcpListener) {
        let shared = self.shared.clone();
        let app = axum::Router::new().fallback(move |request: Request<Body>| {
            let shared = shared.clone();
            async move { shared.answer(request.uri().path()).await }
        });
        self.tasks.push(tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        let service = TowerToHyperService::new(app.clone());
                        tokio::spawn(async move {
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        });
                    }
                    Err(e) => {
                        // Out of descriptors, most likely: wait for some to be closed.
                        warn!(error = %e, "the view could not accept a connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }));
    }

    /// The page as a self-contained report of the run so far: a fresh sample, the view
    /// embedded, and the timeline of every listed order.
    pub async fn report(&self) -> String {
        self.refresh().await;
        let view = self.snapshot();
        let timelines: String = {
            let history = self.shared.lock();
            let by_id: HashMap<&str, &Record> =
                history.records.iter().map(|r| (r.order_id.as_str(), r)).collect();
            view.orders
                .iter()
                .filter_map(|o| by_id.get(o.order_id.as_str()))
                .map(|r| {
                    format!(
                        "<details id=\"order-{id}\"><summary>{id}: {state}</summary>{timeline}</details>\n",
                        id = escape(&r.order_id),
                        state = escape(&r.state),
                        timeline = timeline(r)
                    )
                })
                .collect()
        };
        page(
            Some(&view),
            &format!("<section id=\"timelines\"><h2>Timelines</h2>\n{timelines}</section>"),
        )
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn sample(&self) {
        let records = match self.scan().await {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "the view could not read the state table");
                return;
            }
        };
        let mut queues = BTreeMap::new();
        for (id, url) in &self.queues {
            if let Ok(depth) = dead_letters::depth(&self.clients.sqs, url).await {
                queues.insert(id.clone(), depth);
            }
        }
        let mut states: BTreeMap<String, usize> =
            STATES.iter().map(|s| ((*s).to_owned(), 0)).collect();
        for r in &records {
            *states.entry(r.state.clone()).or_default() += 1;
        }
        let sample = Sample { t: self.started.elapsed().as_secs_f64(), states, queues };
        let mut history = self.lock();
        history.samples.push(sample);
        if history.samples.len() > SAMPLES_KEPT {
            let over = history.samples.len() - SAMPLES_KEPT;
            history.samples.drain(..over);
        }
        history.records = records;
    }

    async fn scan(&self) -> Result<Vec<Record>, String> {
        let mut out = Vec::new();
        let mut pages =
            self.clients.dynamodb.scan().table_name(&self.table).into_paginator().send();
        while let Some(page) = pages.next().await {
            let page =
                page.map_err(|e| aws_sdk_dynamodb::error::DisplayErrorContext(e).to_string())?;
            out.extend(page.items().iter().filter_map(Record::from_item));
        }
        Ok(out)
    }

    /// One order's record, read now.
    async fn record(&self, order_id: &str) -> Option<Record> {
        let got = self
            .clients
            .dynamodb
            .get_item()
            .table_name(&self.table)
            .key("OrderId", AttributeValue::S(order_id.to_owned()))
            .consistent_read(true)
            .send()
            .await
            .ok()?;
        Record::from_item(got.item()?)
    }

    fn view(&self) -> View {
        let history = self.lock();
        let mut records: Vec<&Record> = history.records.iter().collect();
        records.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.order_id.cmp(&b.order_id)));
        let ended = records
            .iter()
            .filter_map(|r| {
                let seconds = (r.ended_at()? - r.created_at?) as f64 / 1000.0;
                Some(Ended { order_id: r.order_id.clone(), outcome: r.outcome()?, seconds })
            })
            .collect();
        let mut alerts: Vec<Alert> = records
            .iter()
            .filter(|r| r.state == "Error")
            .map(|r| Alert {
                order_id: r.order_id.clone(),
                at: r.ended_at(),
                outcome: r.outcome().unwrap_or_default(),
                cause: r.cause().unwrap_or_else(|| "no cause recorded".into()),
                sent: r.body["timeline"]
                    .as_array()
                    .is_some_and(|t| t.iter().any(|e| e["what"] == "alert_sent")),
            })
            .collect();
        alerts.sort_by_key(|a| std::cmp::Reverse(a.at));
        let alert_count = alerts.len();
        alerts.truncate(ALERTS_SHOWN);
        let mut dead_letters = self.dead_letters.arrivals();
        let dead_letter_count = dead_letters.len();
        dead_letters.reverse();
        dead_letters.truncate(DEAD_LETTERS_SHOWN);
        View {
            started_at: self.started_at,
            elapsed: self.started.elapsed().as_secs_f64(),
            states: STATES.iter().map(|s| (*s).to_owned()).collect(),
            queues: self.queues.iter().map(|(id, _)| id.clone()).collect(),
            samples: history.samples.clone(),
            ended,
            order_count: records.len(),
            orders: records.iter().take(ORDERS_LISTED).map(|r| r.row()).collect(),
            alerts,
            alert_count,
            dead_letters,
            dead_letter_count,
            metrics: metrics_summary(&self.metrics),
        }
    }

    async fn answer(&self, path: &str) -> Response<Body> {
        let html = "text/html; charset=utf-8";
        match path {
            "/" | "/index.html" => respond(StatusCode::OK, html, page(None, "")),
            "/view.json" => match serde_json::to_string(&self.view()) {
                Ok(json) => respond(StatusCode::OK, "application/json", json),
                Err(e) => respond(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", e.to_string()),
            },
            _ => {
                let id = path.strip_prefix("/orders/").map(|id| {
                    percent_encoding::percent_decode_str(id).decode_utf8_lossy().into_owned()
                });
                match id {
                    Some(id) if !id.is_empty() => match self.record(&id).await {
                        Some(r) => respond(StatusCode::OK, html, order_page(&r)),
                        None => respond(
                            StatusCode::NOT_FOUND,
                            html,
                            format!(
                                "<!doctype html><title>No such order</title><p>No order {} in the table. <a href=\"../\">Back</a></p>",
                                escape(&id)
                            ),
                        ),
                    },
                    _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found".into()),
                }
            }
        }
    }
}

fn respond(status: StatusCode, content_type: &str, body: String) -> Response<Body> {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    if let Ok(v) = "no-store".parse() {
        r.headers_mut().insert(header::CACHE_CONTROL, v);
    }
    r
}

fn metrics_summary(m: &Metrics) -> MetricsSummary {
    use sas_engine::metrics::{LEASE_EXPIRIES, ORDERS_ENDED, SUPERVISOR_RESETS, TIME_TO_TERMINAL};
    let total = |name: &str| m.by(name, "").values().map(|s| s.sum).sum::<f64>() as u64;
    MetricsSummary {
        ended: m.by(ORDERS_ENDED, "outcome").into_iter().map(|(k, s)| (k, s.sum as u64)).collect(),
        time_to_terminal: m
            .by(TIME_TO_TERMINAL, "outcome")
            .into_iter()
            .map(|(k, s)| {
                let q = |q: f64| s.quantile(q).unwrap_or(0.0);
                let summary = (s.count, q(0.5), q(0.95));
                (k, summary)
            })
            .collect(),
        lease_expiries: total(LEASE_EXPIRIES),
        supervisor_resets: total(SUPERVISOR_RESETS),
        lines: m.lines().0,
    }
}

/// Text made safe inside HTML elements and quoted attributes.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A time as UTC, to the millisecond.
fn clock(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map_or_else(|| ms.to_string(), |t| t.format("%Y-%m-%d %H:%M:%S%.3fZ").to_string())
}

/// An order's timeline as a table: when (and how long after it was received), what happened,
/// at which step, and what else the entry says.
fn timeline(r: &Record) -> String {
    let entries = r.body["timeline"].as_array().cloned().unwrap_or_default();
    let first = entries.first().and_then(|e| e["at"].as_i64()).or(r.created_at);
    let mut t = String::from(
        "<table class=\"timeline\"><thead><tr><th>time</th><th>after</th><th>what happened</th><th>step</th><th>detail</th></tr></thead><tbody>\n",
    );
    for e in &entries {
        let at = e["at"].as_i64();
        let after = at.zip(first).map(|(a, f)| format!("+{:.2} s", (a - f) as f64 / 1000.0));
        let mut detail = Vec::new();
        if let Some(n) = e["attempt"].as_u64() {
            detail.push(format!("attempt {n}"));
        }
        if let Some(by) = e["by"].as_str() {
            detail.push(format!("by {by}"));
        }
        if let Some(reason) = e["reason"].as_str() {
            detail.push(reason.to_owned());
        }
        let what = e["what"].as_str().unwrap_or("?");
        t.push_str(&format!(
            "<tr data-what=\"{w}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
            at.map(clock).unwrap_or_default(),
            after.unwrap_or_default(),
            escape(&what.replace('_', " ")),
            escape(e["step"].as_str().unwrap_or("")),
            escape(&detail.join("; ")),
            w = escape(what),
        ));
    }
    t.push_str("</tbody></table>");
    if entries.is_empty() {
        t.push_str("<p>No timeline recorded.</p>");
    }
    t
}

/// The live page of one order.
fn order_page(r: &Record) -> String {
    let mut facts = vec![format!("state {}", escape(&r.state))];
    if let Some(c) = r.created_at {
        facts.push(format!("accepted {}", clock(c)));
    }
    if let Some(e) = r.ended_at() {
        facts.push(format!("ended {}", clock(e)));
    }
    if let Some(o) = r.outcome() {
        facts.push(format!("outcome {}", escape(&o)));
    }
    if let Some(c) = r.cause() {
        facts.push(format!("cause: {}", escape(&c)));
    }
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Order {id}</title><style>{STYLE}</style></head><body>\n<p><a href=\"../\">&larr; all orders</a></p><h1>Order <span class=\"id\">{id}</span></h1><p class=\"facts\">{}</p>\n{}\n</body></html>\n",
        facts.join(" · "),
        timeline(r),
        id = escape(&r.order_id),
    )
}

/// The page, with `view` embedded (a report) or fetched (live), and `extra` HTML at its end.
fn page(view: Option<&View>, extra: &str) -> String {
    let embedded = view
        .and_then(|v| serde_json::to_string(v).ok())
        // Inside a script element, only `<` could end it early; in JSON it appears only in
        // strings, where the escape means the same.
        .map(|json| {
            format!(
                "<script type=\"application/json\" id=\"view\">{}</script>",
                json.replace('<', "\\u003c")
            )
        })
        .unwrap_or_default();
    PAGE.replace("<!--STYLE-->", STYLE)
        .replace("<!--VIEW-->", &embedded)
        .replace("<!--EXTRA-->", extra)
}

/// Shared by the page and the order pages.
const STYLE: &str = r#"
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
.grid { display: grid; grid-template-columns: 1fr 1fr; gap: 1em 2em; }
.grid > figure { margin: 0; } figcaption { font-weight: 600; margin-bottom: .3em; }
svg { width: 100%; height: auto; background: #fafafa; border: 1px solid #ddd; }
svg text { font: 11px system-ui, sans-serif; fill: #444; }
.legend { list-style: none; padding: 0; margin: .3em 0; display: flex; flex-wrap: wrap; gap: .3em 1.2em; font-size: 12px; }
.legend svg { width: 28px; height: 12px; border: 0; background: none; vertical-align: middle; margin-right: .3em; }
table { border-collapse: collapse; width: 100%; font-size: 12px; }
th, td { text-align: left; padding: 3px 6px; border-bottom: 1px solid #e4e4e4; vertical-align: top; }
th { background: #f0f0f0; }
.facts { color: #555; } .id { font-family: ui-monospace, monospace; white-space: nowrap; }
.scroll { max-height: 420px; overflow: auto; }
details { margin: .4em 0; } details summary { cursor: pointer; font-family: ui-monospace, monospace; }
details:target { outline: 2px solid #0072b2; }
"#;

/// The page: charts and tables drawn from a [`View`], with no external resource. Every chart
/// is an `<svg data-chart=...>` whose series and bars carry what they show in data attributes;
/// series differ by dash and hatching as well as colour, and each is labelled.
pub const PAGE: &str = r##"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Local stack: the run</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style><!--STYLE--></style></head>
<body>
<h1>Local stack: the run</h1>
<p id="status" class="facts">Loading&hellip;</p>
<div class="grid">
<figure><figcaption>Orders by state over time</figcaption><svg data-chart="states" viewBox="0 0 560 300" role="img" aria-label="Orders by state over time"></svg><ul class="legend" id="states-legend"></ul></figure>
<figure><figcaption>Time to terminal (seconds from acceptance to end)</figcaption><svg data-chart="time-to-terminal" viewBox="0 0 560 300" role="img" aria-label="Distribution of time to terminal"></svg><ul class="legend" id="ttt-legend"></ul></figure>
<figure><figcaption>Queue depths over time (visible and in flight)</figcaption><svg data-chart="queues" viewBox="0 0 560 300" role="img" aria-label="Queue depths over time"></svg><ul class="legend" id="queues-legend"></ul></figure>
<figure><figcaption>Functions' metrics</figcaption><div id="metrics"></div></figure>
</div>
<h2>Alerts <span id="alert-count"></span></h2>
<div class="scroll"><table id="alerts"><thead><tr><th>ended</th><th>order</th><th>outcome</th><th>cause</th><th>alert sent</th></tr></thead><tbody></tbody></table></div>
<h2>Dead letters <span id="dead-letter-count"></span></h2>
<div class="scroll"><table id="dead-letters"><thead><tr><th>arrived</th><th>queue</th><th>dead-letter queue</th><th>kind</th><th>order</th><th>receives</th><th>reason</th></tr></thead><tbody></tbody></table></div>
<h2>Orders <span id="order-count"></span></h2>
<div class="scroll"><table id="orders"><thead><tr><th>order</th><th>state</th><th>accepted</th><th>ended</th><th>outcome / cause</th></tr></thead><tbody></tbody></table></div>
<!--VIEW-->
<!--EXTRA-->
<script>
"use strict";
const NS = "http://www.w3.org/2000/svg";
// Okabe and Ito's palette, told apart by most colour-blind readers; dashes tell the rest.
const COLOURS = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"];
const DASHES = ["", "6 3", "2 2", "8 3 2 3", "1 3", "10 4", "4 4 1 4", "12 2"];
const OUTCOMES = ["processed", "compensated", "failed", "cancelled"];
const W = 560, H = 300, M = {l: 46, r: 12, t: 12, b: 34};
const embedded = document.getElementById("view");

function el(name, attrs, parent, text) {
  const e = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
function html(tag, text, parent) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}
function time(ms) { return ms == null ? "" : new Date(ms).toISOString().slice(11, 23); }
function link(id) {
  const a = document.createElement("a");
  a.textContent = id;
  a.className = "id order-link";
  a.href = embedded ? "#order-" + id : "orders/" + encodeURIComponent(id);
  return a;
}
function axes(svg, xMax, yMax, xLabel) {
  const pw = W - M.l - M.r, ph = H - M.t - M.b;
  for (let i = 0; i <= 4; i++) {
    const y = M.t + ph - ph * i / 4;
    el("line", {x1: M.l, x2: W - M.r, y1: y, y2: y, stroke: "#e2e2e2"}, svg);
    el("text", {x: M.l - 4, y: y + 4, "text-anchor": "end"}, svg, String(Math.round(yMax * i / 4 * 100) / 100));
  }
  for (let i = 0; i <= 5; i++) {
    const x = M.l + pw * i / 5;
    el("text", {x: x, y: H - M.b + 14, "text-anchor": "middle"}, svg, String(Math.round(xMax * i / 5 * 10) / 10));
  }
  el("text", {x: M.l + pw / 2, y: H - 4, "text-anchor": "middle"}, svg, xLabel);
  el("line", {x1: M.l, x2: M.l, y1: M.t, y2: M.t + ph, stroke: "#888"}, svg);
  el("line", {x1: M.l, x2: W - M.r, y1: M.t + ph, y2: M.t + ph, stroke: "#888"}, svg);
}
// A colour and a dash per series; past eight series the colours come back, with other dashes.
function colour(i) { return COLOURS[i % COLOURS.length]; }
function dash(i) { return DASHES[(i + Math.floor(i / COLOURS.length)) % DASHES.length]; }
function swatch(legend, i, label, kind) {
  const li = html("li", undefined, legend);
  const s = el("svg", {viewBox: "0 0 28 12", "aria-hidden": "true"}, li);
  if (kind === "bar") el("rect", {x: 2, y: 1, width: 24, height: 10, fill: "url(#hatch-" + i + ")", stroke: COLOURS[i]}, s);
  else el("line", {x1: 1, x2: 27, y1: 6, y2: 6, stroke: colour(i), "stroke-width": 2.5, "stroke-dasharray": dash(i)}, s);
  li.appendChild(document.createTextNode(label));
}
// One line per series over the samples' times; each line carries its name and last value.
function lineChart(svg, legend, samples, names, pick, xLabel) {
  clear(svg); clear(legend);
  const xMax = niceMax(samples.length ? samples[samples.length - 1].t : 1);
  let top = 0;
  for (const s of samples) for (const n of names) top = Math.max(top, pick(s, n) || 0);
  const yMax = niceMax(top);
  axes(svg, xMax, yMax, xLabel);
  const pw = W - M.l - M.r, ph = H - M.t - M.b;
  names.forEach((n, i) => {
    const points = samples.filter(s => pick(s, n) !== undefined)
      .map(s => (M.l + pw * s.t / xMax).toFixed(1) + "," + (M.t + ph - ph * pick(s, n) / yMax).toFixed(1));
    const last = samples.length ? (pick(samples[samples.length - 1], n) || 0) : 0;
    el("polyline", {"data-series": n, "data-last": last, points: points.join(" "), fill: "none",
      stroke: colour(i), "stroke-width": 2, "stroke-dasharray": dash(i)}, svg,
      undefined).appendChild(el("title", {}, null, n + ": " + last));
    swatch(legend, i, n + " (" + last + ")");
  });
}
function hatches(svg) {
  const defs = el("defs", {}, svg);
  OUTCOMES.forEach((o, i) => {
    const p = el("pattern", {id: "hatch-" + i, width: 6, height: 6, patternUnits: "userSpaceOnUse",
      patternTransform: "rotate(" + [0, 45, -45, 90][i] + ")"}, defs);
    el("rect", {width: 6, height: 6, fill: COLOURS[i], "fill-opacity": i === 0 ? 1 : 0.35}, p);
    if (i > 0) el("line", {x1: 0, y1: 0, x2: 0, y2: 6, stroke: COLOURS[i], "stroke-width": 3}, p);
  });
}
// Stacked bars of ended orders by how long they took, one colour and hatching per outcome.
function histogram(svg, legend, ended) {
  clear(svg); clear(legend);
  hatches(svg);
  const longest = ended.reduce((m, e) => Math.max(m, e.seconds), 0);
  const steps = [0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600];
  const width = steps.find(s => longest / s <= 20) || Math.ceil(longest / 20);
  const bins = Math.max(1, Math.floor(longest / width) + 1);
  const counts = Array.from({length: bins}, () => OUTCOMES.map(() => 0));
  for (const e of ended) {
    const o = OUTCOMES.indexOf(e.outcome);
    counts[Math.min(bins - 1, Math.floor(e.seconds / width))][o < 0 ? 2 : o] += 1;
  }
  const yMax = niceMax(Math.max(1, ...counts.map(c => c.reduce((a, b) => a + b, 0))));
  const xMax = bins * width;
  axes(svg, xMax, yMax, "seconds to terminal");
  const pw = W - M.l - M.r, ph = H - M.t - M.b, bw = pw / bins;
  counts.forEach((c, b) => {
    let base = 0;
    c.forEach((n, o) => {
      if (n === 0) return;
      const h = ph * n / yMax;
      const lo = +(b * width).toFixed(2), hi = +((b + 1) * width).toFixed(2);
      el("rect", {"data-bin": lo + "-" + hi, "data-outcome": OUTCOMES[o], "data-count": n,
        x: (M.l + b * bw + 1).toFixed(1), y: (M.t + ph - base - h).toFixed(1), width: Math.max(1, bw - 2).toFixed(1),
        height: h.toFixed(1), fill: "url(#hatch-" + o + ")", stroke: COLOURS[o]}, svg)
        .appendChild(el("title", {}, null, n + " " + OUTCOMES[o] + " in " + lo + " to " + hi + " s"));
      base += h;
    });
  });
  OUTCOMES.forEach((o, i) => {
    const n = ended.filter(e => e.outcome === o).length;
    if (n > 0 || i < 3) swatch(legend, i, o + " (" + n + ")", "bar");
  });
}
function rows(table, items, cells) {
  const body = table.tBodies[0];
  clear(body);
  for (const item of items) {
    const tr = html("tr", undefined, body);
    for (const c of cells(item)) {
      const td = html("td", undefined, tr);
      if (c instanceof Node) td.appendChild(c); else td.textContent = c == null ? "" : String(c);
    }
  }
}
function draw(v) {
  const last = v.samples.length ? v.samples[v.samples.length - 1] : {states: {}, queues: {}};
  document.getElementById("status").textContent = (embedded ? "Report of a run: " : "Live, every 2 s: ") +
    v.elapsed.toFixed(0) + " s observed, " + v.order_count + " orders (" +
    v.states.map(s => s + " " + (last.states[s] || 0)).join(", ") + ")";
  lineChart(document.querySelector('[data-chart="states"]'), document.getElementById("states-legend"),
    v.samples, v.states, (s, n) => s.states[n] || 0, "seconds since start");
  histogram(document.querySelector('[data-chart="time-to-terminal"]'), document.getElementById("ttt-legend"), v.ended);
  lineChart(document.querySelector('[data-chart="queues"]'), document.getElementById("queues-legend"),
    v.samples, v.queues, (s, n) => s.queues[n], "seconds since start");
  const m = v.metrics, metrics = document.getElementById("metrics");
  clear(metrics);
  const ul = html("ul", undefined, metrics);
  html("li", "orders ended: " + (Object.entries(m.ended).map(([k, n]) => k + " " + n).join(", ") || "none yet"), ul);
  for (const [k, [n, p50, p95]] of Object.entries(m.time_to_terminal))
    html("li", k + " in p50 " + p50.toFixed(2) + " s, p95 " + p95.toFixed(2) + " s (" + n + ")", ul);
  html("li", "lease expiries " + m.lease_expiries + ", supervisor resets " + m.supervisor_resets + ", " + m.lines + " metric lines", ul);
  document.getElementById("alert-count").textContent = "(" + v.alert_count + ")";
  rows(document.getElementById("alerts"), v.alerts, a => [time(a.at), link(a.order_id), a.outcome, a.cause, a.sent ? "yes" : "not yet"]);
  document.getElementById("dead-letter-count").textContent = "(" + v.dead_letter_count + ")";
  rows(document.getElementById("dead-letters"), v.dead_letters, d => [time(d.at * 1000), d.queue, d.dead_letter_queue,
    d.kind, d.order_id ? link(d.order_id) : "", d.receives, d.reason]);
  document.getElementById("order-count").textContent = "(" + v.orders.length + " latest of " + v.order_count + ")";
  rows(document.getElementById("orders"), v.orders, o => [link(o.order_id), o.state, time(o.created_at), time(o.ended_at),
    [o.outcome, o.cause].filter(Boolean).join(": ")]);
}
function openTarget() {
  const t = location.hash && document.getElementById(decodeURIComponent(location.hash.slice(1)));
  if (t && t.tagName === "DETAILS") t.open = true;
}
if (embedded) {
  draw(JSON.parse(embedded.textContent));
  openTarget();
  window.addEventListener("hashchange", openTarget);
} else {
  const refresh = () => fetch("view.json", {cache: "no-store"}).then(r => r.json()).then(draw)
    .catch(e => { document.getElementById("status").textContent = "Cannot reach the stack: " + e; });
  refresh();
  setInterval(refresh, 2000);
}
</script>
</body></html>
"##;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(state: &str, body: Value) -> Record {
        Record { order_id: "o-1".into(), state: state.into(), created_at: Some(1_000), body }
    }

    #[test]
    fn an_ended_order_has_its_outcome_end_and_cause_from_its_record() {
        let r = record(
            "Error",
            json!({"timeline": [
                {"at": 1_000, "what": "received", "attempt": 0},
                {"at": 3_500, "what": "compensated", "attempt": 1},
                {"at": 3_600, "what": "alert_sent", "attempt": 1}],
              "cause": {"kind": "step_rejected", "step": "charge-payment", "reason": "declined"}}),
        );
        let row = r.row();
        assert_eq!(row.outcome.as_deref(), Some("compensated"));
        assert_eq!(row.ended_at, Some(3_500), "the end entry, with no ended_at");
        assert_eq!(row.cause.as_deref(), Some("step rejected at charge-payment: declined"));
        let with_end = record("Processed", json!({"ended_at": 2_000, "timeline": []}));
        assert_eq!(
            (with_end.outcome().as_deref(), with_end.ended_at()),
            (Some("processed"), Some(2_000))
        );
        let running = record("Processing", json!({"timeline": [{"at": 1_000, "what": "claimed"}]}));
        assert_eq!((running.outcome(), running.ended_at()), (None, None));
    }

    #[test]
    fn the_report_embeds_its_view_where_no_text_can_close_the_script() {
        let view = View {
            started_at: 0,
            elapsed: 1.0,
            states: vec!["Error".into()],
            queues: vec![],
            samples: vec![],
            ended: vec![],
            order_count: 1,
            orders: vec![],
            alerts: vec![Alert {
                order_id: "o-1".into(),
                at: None,
                outcome: "failed".into(),
                cause: "</script><b>".into(),
                sent: false,
            }],
            alert_count: 1,
            dead_letters: vec![],
            dead_letter_count: 0,
            metrics: MetricsSummary::default(),
        };
        let html = page(Some(&view), "");
        let start = html.find("<script type=\"application/json\" id=\"view\">").unwrap();
        let end = start + html[start..].find("</script>").unwrap();
        let json = &html[start..end].split_once('>').unwrap().1;
        let back: Value = serde_json::from_str(json).unwrap();
        assert_eq!(back["alerts"][0]["cause"], "</script><b>");
        assert!(!page(None, "").contains("id=\"view\""), "the live page fetches its view");
    }

    #[test]
    fn a_timeline_shows_each_entry_escaped_with_its_step_and_detail() {
        let r = record(
            "Processing",
            json!({"timeline": [
                {"at": 1_000, "what": "received", "attempt": 0},
                {"at": 1_250, "what": "step_failed", "attempt": 1, "step": "ship", "reason": "<down>"}]}),
        );
        let t = timeline(&r);
        assert!(t.contains("<tr data-what=\"received\">"));
        assert!(t.contains("+0.25 s") && t.contains("step failed") && t.contains("ship"));
        assert!(t.contains("&lt;down&gt;") && !t.contains("<down>"));
    }
}
