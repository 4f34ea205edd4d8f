//! What an operator sees of a local run: orders by state, time to terminal, queue depths,
//! alerts and dead letters, drawn on one page.
//!
//! An [`Observer`] samples the running stack every two seconds, or less often once its table
//! is large, straight from the emulators (its reads are not the system's cost, so they do not
//! go through the proxy), and keeps the history. Its [`View`] is drawn by [`PAGE`], a page
//! with no external resources: served live by [`Observer::serve`] (the page fetches
//! `view.json` every two seconds, and each order links to its timeline at `orders/{id}`), or
//! written once as a self-contained report by [`Observer::report`], with the view and every
//! listed order's timeline embedded in it.

mod data;
mod page;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::types::AttributeValue;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::Error;
use crate::emulation::aws::Clients;
use crate::emulation::local::LocalStack;
use crate::observe::dead_letters::{self, DeadLetters};
use crate::observe::metrics::Metrics;
pub use data::{Alert, Ended, MetricsSummary, OrderRow, STATES, Sample, View};
use data::{Record, metrics_summary};
pub use page::PAGE;
use page::{escape, order_page, page, timeline};

/// How often the stack is sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(2);
/// Samples kept: two hours at one every two seconds; older ones are dropped.
const SAMPLES_KEPT: usize = 3_600;
/// Orders listed (the latest created), alerts and dead letters shown: enough to browse, few
/// enough that a report of a long run stays a few megabytes.
const ORDERS_LISTED: usize = 1_000;
const ALERTS_SHOWN: usize = 200;
const DEAD_LETTERS_SHOWN: usize = 200;

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

/// Samples a running stack every [`SAMPLE_EVERY`], or nine times as long as the last sample
/// took if that is longer, and keeps what it saw; dropping it stops the sampling and any page
/// it serves.
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
            let mut took = Duration::ZERO;
            loop {
                // A sample scans the whole table, which grows with the orders, and `up` keeps
                // its observer as long as the stack lives: sampling at most a tenth of the
                // time keeps watching a stack that took many orders from becoming its
                // emulator's main work.
                tokio::time::sleep(SAMPLE_EVERY.max(took * 9)).await;
                let start = Instant::now();
                sampling.sample().await;
                took = start.elapsed();
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
