//! The demo's figures: what its run cost per order at list prices, how much work each order
//! took against the fault-free path, and what the functions' own metrics and traces said.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::Summary;
use super::records::{Item, body, state_of};
use super::summary::{Tally, reported_steps};
use crate::emulation::functions::EventSource;
use crate::emulation::local::{LocalStack, REMOTE_SERVICE, RunningFunction};
use crate::emulation::proxy::{Seen, label};
use crate::observe::traces::OrderTraces;
use crate::tools::prices::{self, per_million};

/// What the proxy's counts say each order took, and what the workflow's steps take on the
/// fault-free path.
pub(super) struct PerOrder {
    sent: f64,
    handled: f64,
    writes: f64,
    fault_free_messages: f64,
    fault_free_writes: f64,
}

/// Requests and messages per order of the calls to `service` whose operation `pick` takes.
fn seen(
    calls: &BTreeMap<(String, String), Seen>,
    n: f64,
    service: &str,
    pick: &dyn Fn(&str) -> bool,
) -> (f64, f64) {
    let (requests, messages) = calls
        .iter()
        .filter(|((s, op), _)| s == service && pick(op))
        .fold((0, 0), |(r, m), (_, seen)| (r + seen.requests, m + seen.messages));
    (requests as f64 / n, messages as f64 / n)
}

/// Messages sent to the work queues and handled, and state writes, per order of `accepted`,
/// with the fault-free path of the `records`' steps.
pub(super) fn per_order(
    stack: &LocalStack,
    calls: &BTreeMap<(String, String), Seen>,
    accepted: usize,
    tally: &Tally,
    records: usize,
) -> PerOrder {
    let n = accepted.max(1) as f64;
    let seen = |service: &str, pick: &dyn Fn(&str) -> bool| seen(calls, n, service, pick);
    // The work queues are those the functions consume, named as the proxy names them.
    let work_queues: Vec<&str> = stack
        .functions
        .iter()
        .flat_map(|f| &f.spec.events)
        .filter_map(|e| match e {
            EventSource::Sqs { queue_arn, .. } => Some(label(queue_arn)),
            _ => None,
        })
        .collect();
    let (_, sent) = seen("sqs", &|op| {
        op.starts_with("SendMessage")
            && work_queues.iter().any(|q| op.ends_with(&format!(" to {q}")))
    });
    let (_, handled) = seen("sqs", &|op| op == "ReceiveMessage");
    let (state_puts, _) = seen("dynamodb", &|op| op == "PutItem on StateTable");
    // A new order's record is a put too.
    let writes = state_puts;
    // Per order accepted, counting the work of its children (orders of their own) with it.
    let (records, steps) = (records as f64, tally.steps as f64);
    let (fault_free_messages, fault_free_writes) =
        ((records + 2.0 * steps) / n, (2.0 * records + steps) / n);
    PerOrder { sent, handled, writes, fault_free_messages, fault_free_writes }
}

/// The value at `p` (0 to 1) of `sorted`, 0 if empty.
fn percentile(sorted: &[i64], p: f64) -> i64 {
    sorted.get(((sorted.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0)
}

/// The load the run met and made: throttles, injected faults, dead letters, the work per order,
/// and the time to terminal (of `tally`'s sorted times).
pub(super) fn load(stack: &LocalStack, s: &Summary, tally: &Tally, per_order: &PerOrder) -> String {
    let &PerOrder { sent, handled, writes, fault_free_messages, fault_free_writes } = per_order;
    let (resets, to_terminal) = (tally.resets, &tally.to_terminal);
    let pct = |p: f64| percentile(to_terminal, p);
    let mut t = String::new();
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
    t
}

/// What an order cost at list prices: its AWS API calls, the functions' invocations and their
/// metric lines, with what the prices leave out.
pub(super) fn costs(
    stack: &LocalStack,
    calls: &BTreeMap<(String, String), Seen>,
    accepted: usize,
) -> String {
    let n = accepted.max(1) as f64;
    let mut t = String::new();
    // AWS API calls per order, as counted by the proxy in front of the emulator.
    t.push_str(&format!("| service | operation | calls per order | list price (us-east-1, {}) | per million orders |\n| --- | --- | ---: | --- | ---: |\n", prices::AS_OF));
    let mut total = 0.0;
    for ((service, operation), seen) in calls {
        let per = seen.requests as f64 / n;
        let (unit, note) = price(service, operation);
        let cost = per * unit;
        total += cost;
        t.push_str(&format!("| {service} | {operation} | {per:.2} | {note} | ${cost:.2} |\n"));
    }
    // The simulated remote service stands for the outside world: its invocations are not the
    // system's. The door's invocations (one per HTTP request, refused ones included) are kept
    // apart from the workflow's, which batching makes fewer per order as traffic grows.
    let is_api = |f: &&RunningFunction| {
        f.spec.events.iter().any(|e| matches!(e, EventSource::HttpApi { .. }))
    };
    let workflow: u64 = stack
        .functions
        .iter()
        .filter(|f| f.spec.logical_id != REMOTE_SERVICE && !is_api(f))
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
    t.push_str("priced at one unit each, without index writes: `cargo run -p sas-infra --bin cost-model`\n");
    t.push_str(
        "counts capacity units exactly for the fault-free path. Lambda duration is not included.\n",
    );
    t
}

/// List price per million calls of an operation, and how it is priced.
fn price(service: &str, operation: &str) -> (f64, String) {
    let (wru, rru) = (per_million(prices::DYNAMODB_WRU), per_million(prices::DYNAMODB_RRU));
    let units = |n: f64, what: &str, price: f64| {
        let n_text = if n == 0.5 { "½".to_owned() } else { format!("{n}") };
        (n * price, format!("{n_text} {what} at ${price:.3} per million"))
    };
    match (service, operation) {
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
        ("s3", "DeleteObject" | "DeleteObjects" | "DeleteBucket") => (0.0, "free".into()),
        ("s3", op)
            if op.starts_with("Put")
                || op.starts_with("List")
                || op.starts_with("Copy")
                || op.starts_with("Create")
                || op.starts_with("Complete")
                || op == "UploadPart" =>
        {
            let p = per_million(prices::S3_WRITE_REQUEST);
            (p, format!("${p:.2} per million requests"))
        }
        ("s3", _) => {
            let p = per_million(prices::S3_READ_REQUEST);
            (p, format!("${p:.2} per million requests"))
        }
        ("eventbridge", "PutEvents") => {
            let p = per_million(prices::EVENTBRIDGE_EVENT);
            (p, format!("${p:.2} per million events"))
        }
        (_, _) => (0.0, "not billed per call".into()),
    }
}

/// What the traces said: how many orders were not traced as they should be, and the line that
/// says so (or why the traces could not be read).
pub(super) struct TracesSeen {
    pub(super) broken: usize,
    pub(super) text: String,
}

/// Whether the traces are what the stack promises, as the segments the functions sent to the
/// emulator's X-Ray holds: an order's hops, if any were sent, are all in the one trace its
/// correlation id names; and an order that did not end processed (a step refused, undone,
/// or failed) has its trace, kept from its first fault whatever `TraceSamplePercent` says.
pub(super) async fn traces_seen(stack: &LocalStack, records: &[Item]) -> TracesSeen {
    let ids: Vec<String> = records
        .iter()
        .filter_map(|r| body(r)["correlation_id"].as_str().map(str::to_owned))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let segments = match stack.traces.segments(&ids).await {
        Ok(segments) => segments,
        Err(e) => {
            let text = format!("traces: could not be read from X-Ray: {e}\n");
            return TracesSeen { broken: records.len(), text };
        }
    };
    let seen = OrderTraces::of(&segments);
    let (mut traced, mut faulted, mut unsampled, mut broken, mut hops) = (0, 0, 0, 0, 0);
    for r in records {
        let id = r.get("OrderId").and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
        let b = body(r);
        let correlation = b["correlation_id"].as_str().unwrap_or_default().to_owned();
        let troubled = state_of(r) != "Processed" || !reported_steps(&b).is_empty();
        match seen.by_order.get(&id) {
            Some((traces, n)) if traces == &[correlation] => {
                traced += 1;
                faulted += usize::from(troubled);
                hops += n;
            }
            None if !troubled => unsampled += 1,
            _ => broken += 1,
        }
    }
    let text = format!(
        "traces: {traced} orders each in one trace of its own ({:.2} hops each on average), {faulted} of them for a fault; {unsampled} processed orders not sampled; {broken} split or missing; {} hops whose parent segment was not sent (an order kept from its first fault)\n",
        hops as f64 / traced.max(1) as f64,
        seen.orphans
    );
    TracesSeen { broken, text }
}

/// What the functions' metrics said about ended orders, and the lines that say so.
pub(super) struct MetricsSeen {
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
    pub(super) fn keeps_promise(&self, records: [usize; 3]) -> bool {
        let over = self.ended.iter().zip(records).any(|(m, r)| *m > r);
        !over && self.short(records) as u64 <= self.died
    }

    fn short(&self, records: [usize; 3]) -> usize {
        records.iter().zip(self.ended).map(|(r, m)| r.saturating_sub(m)).sum()
    }

    /// What the metrics said, and whether they kept their promise against `records` (ended
    /// processed, compensated and failed, children too).
    pub(super) fn text(&self, s: &Summary, records: [usize; 3]) -> String {
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
pub(super) async fn ended_in_metrics(
    stack: &LocalStack,
    expected: [usize; 3],
    died: u64,
) -> MetricsSeen {
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
}
