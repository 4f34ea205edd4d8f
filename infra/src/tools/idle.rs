//! What a stack costs a month with no orders, counted from the template as CloudFormation
//! would deploy it: what watches it (the dashboard, the alarms' metrics, the supervisor's
//! metric series), Lambda's empty polls of every queue a function consumes, and the
//! supervisor's sweeps. Every count follows from the template, so an agent added to its list
//! is in the figures.

use std::collections::HashMap;

use crate::Error;
use crate::emulation::template::{Context, Template};
use crate::tools::ceiling::Params;
use crate::tools::durations::{Measured, Memory, slowdown};
use crate::tools::prices as price;

/// A month, in the seconds CloudWatch and Lambda bill by (30.4 days).
const MONTH_SECONDS: f64 = 30.4 * 86_400.0;
/// CloudWatch's price of a dashboard a month.
const DASHBOARD_MONTH: f64 = 3.00;
/// A standard alarm's price a month, per metric it watches.
const ALARM_METRIC_MONTH: f64 = 0.10;
/// A custom metric series a month (the first 10,000).
const METRIC_SERIES_MONTH: f64 = 0.30;
/// Pollers Lambda runs for an SQS mapping from the start, each long-polling its queue.
const POLLERS_PER_MAPPING: f64 = 5.0;
/// The longest long poll SQS allows: an empty queue answers each poll after it.
const LONG_POLL_SECONDS: f64 = 20.0;
/// The supervisor's own series, beside two per queue (`QueueBacklog`, `QueueWait`):
/// `OldestInFlightAge`, `SweepSize`, `SupervisorResets`, `SweepRacesLost`.
const SUPERVISOR_SERIES: f64 = 4.0;
/// What a sweep prints to its log, measured on the local stack, and what Lambda adds.
const SWEEP_LOG_BYTES: f64 = 3_000.0 + 450.0;
/// What a sweep waits for: its queries of the index's shards and its reads of the queues'
/// depths, side by side. Its processor time is measured ([`crate::tools::durations`]).
const SWEEP_WAIT_SECONDS: f64 = 0.1;

/// One line of the monthly bill.
#[derive(Clone, Debug)]
pub struct Line {
    pub item: String,
    pub count: String,
    pub unit: String,
    pub monthly: f64,
}

/// The monthly bill of a stack from `template` at `params` that receives no order.
pub fn idle(template: &Template, params: &Params) -> Result<Vec<Line>, Error> {
    let ctx = Context::new(template, "idle", "us-east-1", &HashMap::new())?;
    let deployed = |kind: &'static str| {
        template.of_kind(kind).filter(|(_, r)| ctx.holds(r.condition.as_deref()))
    };
    let dashboards = deployed("AWS::CloudWatch::Dashboard").count() as f64;
    let alarms: Vec<f64> = deployed("AWS::CloudWatch::Alarm")
        .map(|(_, r)| match r.properties["Metrics"].as_array() {
            Some(metrics) => metrics.iter().filter(|m| m.get("MetricStat").is_some()).count(),
            None => 1,
        } as f64)
        .collect();
    let alarm_metrics: f64 = alarms.iter().sum();
    let mappings = deployed("AWS::Serverless::Function")
        .flat_map(|(_, r)| r.properties["Events"].as_object().into_iter().flat_map(|e| e.values()))
        .filter(|event| event["Type"] == "SQS")
        .count() as f64
        + deployed("AWS::Lambda::EventSourceMapping").count() as f64;
    // The supervisor weighs every queue a function consumes.
    let queues = mappings;
    let series = SUPERVISOR_SERIES + 2.0 * queues;
    let receives = mappings * POLLERS_PER_MAPPING * MONTH_SECONDS / LONG_POLL_SECONDS;
    let sweeps = params.sweeps_per_minute * MONTH_SECONDS / 60.0;
    // Each sweep: a query of each index shard and a scan of the wait reports (half a read unit
    // each, eventually consistent and small), and a read of each queue's depth.
    let sweep_reads = sweeps * (params.index_shards + 1.0) * 0.5;
    let mb = Memory::of_stack(template, &[])?.supervisor_mb;
    let sweep_cpu_s = Measured::recorded()?.of("supervisor").of_batch(0.0) / 1000.0;
    let sweep_seconds = SWEEP_WAIT_SECONDS + sweep_cpu_s * slowdown(mb);
    let sweep_cost = sweeps * price::LAMBDA_REQUEST
        + sweeps * sweep_seconds * mb / 1024.0 * price::LAMBDA_GB_SECOND
        + sweep_reads * price::DYNAMODB_RRU
        + sweeps * queues * price::SQS_REQUEST;
    let log_gb = sweeps * SWEEP_LOG_BYTES / 1e9;
    Ok(vec![
        Line {
            item: "the dashboards (`CreateDashboard`): the stack's, and one per agent".into(),
            count: format!("{dashboards:.0}"),
            unit: format!("${DASHBOARD_MONTH:.2}"),
            monthly: dashboards * DASHBOARD_MONTH,
        },
        Line {
            item: format!("alarms: {}, watching {alarm_metrics:.0} metrics", alarms.len()),
            count: format!("{alarm_metrics:.0} alarm metrics"),
            unit: format!("${ALARM_METRIC_MONTH:.2}"),
            monthly: alarm_metrics * ALARM_METRIC_MONTH,
        },
        Line {
            item: format!(
                "the supervisor's metric series, printed every sweep: four of its own, and `QueueBacklog` and `QueueWait` for each of the {queues:.0} queues"
            ),
            count: format!("{series:.0} series"),
            unit: format!("${METRIC_SERIES_MONTH:.2}"),
            monthly: series * METRIC_SERIES_MONTH,
        },
        Line {
            item: format!(
                "Lambda's pollers of the {mappings:.0} SQS event source mappings, long polls of 20 s that find nothing ({POLLERS_PER_MAPPING:.0} pollers a mapping, as Lambda starts with)"
            ),
            count: format!("{:.2} million receives", receives / 1e6),
            unit: "$0.40 per million".into(),
            monthly: receives * price::SQS_REQUEST,
        },
        Line {
            item: format!(
                "the supervisor's sweeps: {sweeps:.0} invocations, each querying each of the expiry index's {:.0} shards, scanning the wait reports and reading {queues:.0} queues' depths",
                params.index_shards
            ),
            count: String::new(),
            unit: String::new(),
            monthly: sweep_cost,
        },
        Line {
            item: "the sweeps' log lines (about 3 KB each, and Lambda's own)".into(),
            count: format!("{log_gb:.2} GB"),
            unit: "$0.50 per GB".into(),
            monthly: log_gb * price::CLOUDWATCH_LOGS_GB,
        },
    ])
}

/// `lines` as the README's table, with their total.
pub fn render(lines: &[Line]) -> String {
    let mut out =
        String::from("| item | how many | unit price | per month |\n| --- | --- | ---: | ---: |\n");
    for l in lines {
        out.push_str(&format!("| {} | {} | {} | ${:.2} |\n", l.item, l.count, l.unit, l.monthly));
    }
    let total: f64 = lines.iter().map(|l| l.monthly).sum();
    out.push_str(&format!("| **total** | | | **${total:.2}** |\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_queue_the_template_consumes_is_polled_and_weighed_in_the_idle_bill() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../template.yaml");
        let template = Template::load(&path).unwrap();
        let params = Params::of_stack("defaults", &template, &[]).unwrap();
        let lines = idle(&template, &params).unwrap();
        // The scheduler's start and reply queues, and one per agent of the template's list.
        let agents = template
            .of_kind("AWS::Serverless::Function")
            .filter(|(id, _)| id.ends_with("AgentFunction"))
            .count();
        assert!(agents >= 5, "{agents} agents");
        let queues = 2 + agents;
        let line = |start: &str| lines.iter().find(|l| l.item.starts_with(start)).unwrap();
        let polls = line("Lambda's pollers");
        assert!(
            polls.item.contains(&format!("the {queues} SQS event source mappings")),
            "{polls:?}"
        );
        let series = line("the supervisor's metric series");
        assert_eq!(series.count, format!("{} series", 4 + 2 * queues));
        assert!(render(&lines).contains("| **total** |"));
    }
}
