//! What the page draws: the samples of the stack, and the orders as their records tell them.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::types::AttributeValue;
use sas_engine::state::Cause;
use serde::Serialize;
use serde_json::Value;

use crate::observe::dead_letters::Arrival;
use crate::observe::metrics::Metrics;

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
    /// Orders in the table, and the latest [`ORDERS_LISTED`](super::ORDERS_LISTED) of them, newest
    /// first.
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
pub(super) struct Record {
    pub(super) order_id: String,
    pub(super) state: String,
    pub(super) created_at: Option<i64>,
    /// The state record (`Body`), parsed.
    pub(super) body: Value,
}

impl Record {
    pub(super) fn from_item(item: &HashMap<String, AttributeValue>) -> Option<Record> {
        let text = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned();
        Some(Record {
            order_id: text("OrderId")?,
            state: text("ProcessState").unwrap_or_default(),
            created_at: item
                .get("CreatedAt")
                .and_then(|v| v.as_n().ok())
                .and_then(|n| n.parse().ok()),
            body: sas_aws::dynamo::body_text(item)
                .ok()
                .and_then(|b| serde_json::from_str(&b).ok())
                .unwrap_or(Value::Null),
        })
    }

    /// The timeline entry that ended the order, if it ended.
    fn end(&self) -> Option<&Value> {
        self.body["timeline"].as_array()?.iter().rev().find(|e| {
            matches!(e["what"].as_str(), Some("processed" | "compensated" | "failed" | "cancelled"))
        })
    }

    pub(super) fn outcome(&self) -> Option<String> {
        let ending = self.end().and_then(|e| e["what"].as_str());
        match (self.state.as_str(), ending) {
            ("Processed", _) => Some("processed".into()),
            ("Error", Some("compensated")) => Some("compensated".into()),
            ("Error", _) => Some("failed".into()),
            ("Cancelled", _) => Some("cancelled".into()),
            _ => None,
        }
    }

    pub(super) fn ended_at(&self) -> Option<i64> {
        self.outcome()?;
        self.body["ended_at"].as_i64().or_else(|| self.end().and_then(|e| e["at"].as_i64()))
    }

    /// Why the order failed, as a sentence; for a step that did not finish in time, with what
    /// its own detail says (no answer within its timeout, or its leases).
    pub(super) fn cause(&self) -> Option<String> {
        let cause: Cause = serde_json::from_value(self.body["cause"].clone()).ok()?;
        if let Cause::StepTimedOut { step, .. } = &cause {
            let steps = self.body["steps"].as_array().map_or(&[][..], Vec::as_slice);
            let detail = steps.iter().find(|s| s["name"] == step.as_str());
            if let Some(detail) = detail.and_then(|s| s["detail"].as_str()) {
                return Some(format!("{step} did not finish in time: {detail}"));
            }
        }
        Some(cause.to_string())
    }

    /// Whether a step failed while others are in flight: it undoes what was done once they end.
    pub(super) fn stopping(&self) -> bool {
        matches!(self.state.as_str(), "Pending" | "Processing")
            && self.body["phase"] == "forward"
            && self.body["cause"].is_object()
    }

    pub(super) fn row(&self) -> OrderRow {
        OrderRow {
            order_id: self.order_id.clone(),
            state: if self.stopping() {
                format!("{} (stopping)", self.state)
            } else {
                self.state.clone()
            },
            created_at: self.created_at,
            ended_at: self.ended_at(),
            outcome: self.outcome(),
            cause: self.cause(),
        }
    }
}

pub(super) fn metrics_summary(m: &Metrics) -> MetricsSummary {
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
