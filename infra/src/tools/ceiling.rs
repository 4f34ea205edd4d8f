//! How many orders a second one stack takes: for each AWS resource an order passes through,
//! what AWS's published quota on it allows, given what one order uses of it; which binds
//! first; and what shows when it is exceeded.
//!
//! What an order uses is counted by `cost-model` (the same run that prices it); the quotas are
//! AWS's defaults, each with the page that states it; the parameters are the template's
//! defaults or the larger set the README gives. How long an invocation lasts comes from
//! [`super::durations`]: the processor time measured on the local stack, at each function's
//! memory, and the waits on AWS's APIs, assumed; every mapping's ceiling scales with it.

use std::collections::HashMap;
use std::fmt::Write as _;

use sas_engine::config::{INDEX_SHARDS, Scale, busiest_partition};
use serde_json::Value;

use crate::Error;
use crate::emulation::template::{Context, Template};

/// One of AWS's default quotas, with the page that states it.
#[derive(Clone, Copy, Debug)]
pub struct Quota {
    pub value: f64,
    pub what: &'static str,
    pub source: &'static str,
}

const LAMBDA_SCALING: &str = "https://docs.aws.amazon.com/lambda/latest/dg/scaling-behavior.html";
const LAMBDA_QUOTAS: &str =
    "https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html";
const SQS_SCALING: &str = "https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-scaling.html";
const DYNAMODB_ON_DEMAND: &str =
    "https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/on-demand-capacity-mode.html";
const DYNAMODB_QUOTAS: &str =
    "https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/ServiceQuotas.html";
const DYNAMODB_PARTITIONS: &str =
    "https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/bp-partition-key-design.html";
const DYNAMODB_WARM: &str =
    "https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/warm-throughput.html";
const EVENTBRIDGE_QUOTAS: &str =
    "https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-quota.html";
const API_GATEWAY_QUOTAS: &str =
    "https://docs.aws.amazon.com/apigateway/latest/developerguide/limits.html";

/// Requests a second all of an account's APIs take in a region (most regions; 2,500 in some).
pub const API_ACCOUNT_RPS: Quota = Quota {
    value: 10_000.0,
    what: "10,000 requests a second per account and region, all APIs",
    source: API_GATEWAY_QUOTAS,
};
/// Concurrent executions of all an account's functions in a region.
pub const LAMBDA_CONCURRENCY: Quota = Quota {
    value: 1_000.0,
    what: "1,000 concurrent executions per account and region (raisable)",
    source: LAMBDA_QUOTAS,
};
/// How fast one function adds execution environments.
pub const LAMBDA_SCALING_RATE: Quota = Quota {
    value: 1_000.0,
    what: "1,000 more execution environments every 10 s, per function",
    source: LAMBDA_SCALING,
};
/// Batches an SQS event source mapping processes at once at most (`MaximumConcurrency` is 2 to
/// 1,000); it starts at 5 and adds up to 300 a minute.
pub const MAPPING_CONCURRENCY: Quota = Quota {
    value: 1_000.0,
    what: "at most `MaximumConcurrency` (2 to 1,000) batches at once; starts at 5, adds 300 a minute",
    source: SQS_SCALING,
};
/// Write units a second a new on-demand table sustains; it takes up to double its previous
/// peak at once, and more within 30 minutes.
pub const NEW_TABLE_WCU: Quota = Quota {
    value: 4_000.0,
    what: "a new on-demand table: 4,000 write units a second, then up to twice its peak, doubling every 30 min",
    source: DYNAMODB_ON_DEMAND,
};
/// Write units a second a new global secondary index of an on-demand table sustains: an index
/// has partitions of its own, and starts as a new table does.
pub const NEW_INDEX_WCU: Quota = Quota {
    value: 4_000.0,
    what: "a new on-demand index: 4,000 write units a second, then ramps as its table does (warm throughput)",
    source: DYNAMODB_WARM,
};
/// Write units a second one on-demand table takes at most, by default.
pub const TABLE_MAX_WCU: Quota = Quota {
    value: 40_000.0,
    what: "40,000 write units a second per table (raisable)",
    source: DYNAMODB_QUOTAS,
};
/// Write units a second one partition takes. A new index has one partition per 1,000 units
/// of its warm throughput, and DynamoDB places each shard of the expiry index on one of them.
pub const PARTITION_WCU: Quota = Quota {
    value: 1_000.0,
    what: "1,000 write units a second per partition",
    source: DYNAMODB_PARTITIONS,
};
/// `PutEvents` requests a second per account in us-east-1, us-west-2 and eu-west-1 (2,400 or
/// less elsewhere).
pub const PUT_EVENTS_RPS: Quota = Quota {
    value: 10_000.0,
    what: "`PutEvents`: 10,000 requests a second per account in us-east-1 (less in most regions)",
    source: EVENTBRIDGE_QUOTAS,
};

/// `PutEvents` requests a second per account in us-east-2, the smallest of the quotas these
/// tables cite (smaller regions have smaller ones still).
pub const PUT_EVENTS_RPS_US_EAST_2: Quota = Quota {
    value: 2_400.0,
    what: "`PutEvents`: 2,400 requests a second per account in us-east-2",
    source: EVENTBRIDGE_QUOTAS,
};
/// Events a bus delivers to its rules' targets a second, per account, by region: one for each
/// rule an event matches. Past it, deliveries are delayed, not lost.
pub const RULE_DELIVERIES: [Quota; 3] = [
    Quota {
        value: 18_750.0,
        what: "deliveries to rule targets: 18,750 a second in us-east-1, us-west-2 and eu-west-1",
        source: EVENTBRIDGE_QUOTAS,
    },
    Quota {
        value: 4_500.0,
        what: "4,500 in us-east-2 and eu-central-1",
        source: EVENTBRIDGE_QUOTAS,
    },
    Quota {
        value: 750.0,
        what: "750 in af-south-1, ap-northeast-3, ap-southeast-3 and eu-south-1 (1,100 in the regions not named)",
        source: EVENTBRIDGE_QUOTAS,
    },
];
/// Requests the HTTP API takes at once across the account's APIs, before its steady rate.
pub const API_ACCOUNT_BURST: Quota = Quota {
    value: 5_000.0,
    what: "a burst of 5,000 requests per account and region, all APIs",
    source: API_GATEWAY_QUOTAS,
};
/// How far above its declared rate every binder of a stack should be.
pub const HEADROOM: f64 = 0.3;

/// Messages an event source mapping hands one invocation (the template's `BatchSize`).
pub const BATCH_SIZE: f64 = 10.0;

/// How long invocations last on AWS, in milliseconds. Each message of a batch is handled
/// concurrently, so a batch lasts about as long as one message's reads, write and send.
#[derive(Clone, Copy, Debug)]
pub struct Durations {
    pub submission_ms: f64,
    pub scheduler_batch_ms: f64,
    /// An agent's batch lasts as long as its slowest remote call.
    pub agent_batch_ms: f64,
    /// What a new environment adds to the submission that starts it: Lambda's start of it,
    /// and the function's init.
    pub submission_start_ms: f64,
}

/// What one order uses of each resource, as counted by `cost-model`.
#[derive(Clone, Copy, Debug, Default)]
pub struct PerOrder {
    pub api_requests: f64,
    pub state_table_wcu: f64,
    /// Writes of the busier of the indexes sharded by `ExpiryShard` (`ByCompleteBy`,
    /// `ByWatchedSince`), spread over its shards.
    pub index_wcu: f64,
    pub starts: f64,
    pub replies: f64,
    /// Requests to the busiest agent's queue.
    pub agent_requests: f64,
    /// Agents an order calls: their mappings run side by side.
    pub agents: f64,
    pub put_events: f64,
    /// Deliveries of its events to the targets of the stack's own rules (the alerts', the
    /// callbacks').
    pub rule_deliveries: f64,
    /// Its terminal status events: each rule a team adds on them delivers one.
    pub terminal_events: f64,
}

/// The stack's parameters that bound its throughput, and what follows from them.
#[derive(Clone, Debug)]
pub struct Params {
    pub name: &'static str,
    pub poller_concurrency: f64,
    pub api_rate: f64,
    /// `ApiThrottlingBurstLimit`.
    pub api_burst: f64,
    /// `ExpectedOrdersPerSecond`, from which the sweep limit and the warm throughputs follow.
    pub expected_rate: f64,
    /// Shards of `ByCompleteBy` (the same for every rate).
    pub index_shards: f64,
    pub sweep_limit: f64,
    /// Write units a second `StateTable` and `ByCompleteBy` take from their first minute: a new
    /// table's, or the warm throughput the template sets for the declared rate.
    pub state_table_warm: f64,
    pub index_warm: f64,
    /// Sweeps a minute (`SweepSchedule`).
    pub sweeps_per_minute: f64,
    /// Share of orders traced whole (`TraceSamplePercent`), from 0 to 1.
    pub trace_share: f64,
    /// How long the scheduler's mappings gather a batch (`SchedulerBatchingWindowSeconds`).
    pub scheduler_window_s: f64,
    /// How long each agent's mapping does (`AgentBatchingWindowSeconds`).
    pub agent_window_s: f64,
    /// Days an ended order is kept (`OrderRetentionDays`; 0: for ever).
    pub retention_days: f64,
}

impl Params {
    /// The parameters of a stack deployed from `template` with `overrides`, as CloudFormation
    /// would resolve them.
    pub fn of_stack(
        name: &'static str,
        template: &Template,
        overrides: &[(&str, &str)],
    ) -> Result<Params, Error> {
        let overrides: HashMap<String, String> =
            overrides.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let ctx = Context::new(template, "ceiling", "us-east-1", &overrides)?;
        let number = |name: &str| -> Result<f64, Error> {
            ctx.parameters
                .get(name)
                .and_then(|v| v.as_str()?.parse().ok())
                .ok_or_else(|| Error::Template(format!("parameter {name} is not a number")))
        };
        let table = template
            .resource("StateTable")
            .ok_or_else(|| Error::Template("no StateTable".into()))?;
        let table = ctx.eval(&table.properties)?;
        let warm = |w: &Value, floor: f64| {
            w["WarmThroughput"]["WriteUnitsPerSecond"].as_f64().map_or(floor, |v| v.max(floor))
        };
        // The two indexes sharded by ExpiryShard take as many writes an order as each other
        // (cost-model counts the busier): the one with the least warm throughput binds.
        let sharded = |name: &str| {
            table["GlobalSecondaryIndexes"]
                .as_array()
                .and_then(|all| all.iter().find(|g| g["IndexName"] == name))
                .map(|index| warm(index, NEW_INDEX_WCU.value))
                .ok_or_else(|| Error::Template(format!("StateTable has no {name}")))
        };
        let index_warm = sharded("ByCompleteBy")?.min(sharded("ByWatchedSince")?);
        let expected_rate = number("ExpectedOrdersPerSecond")?;
        // The engine derives these from the same declaration (EXPECTED_ORDERS_PER_SECOND).
        let scale = Scale::for_rate(expected_rate as u32);
        Ok(Params {
            name,
            poller_concurrency: number("PollerConcurrency")?,
            api_rate: number("ApiThrottlingRateLimit")?,
            api_burst: number("ApiThrottlingBurstLimit")?,
            expected_rate,
            index_shards: f64::from(INDEX_SHARDS),
            sweep_limit: scale.sweep_limit as f64,
            state_table_warm: warm(&table, NEW_TABLE_WCU.value),
            index_warm,
            sweeps_per_minute: 1.0,
            trace_share: number("TraceSamplePercent")? / 100.0,
            scheduler_window_s: number("SchedulerBatchingWindowSeconds")?,
            agent_window_s: number("AgentBatchingWindowSeconds")?,
            retention_days: number("OrderRetentionDays")?,
        })
    }
}

/// One resource's ceiling.
#[derive(Clone, Debug)]
pub struct Limit {
    pub resource: &'static str,
    /// The quota or parameter that bounds it, and where it is stated.
    pub bound: String,
    /// Orders a second it allows, by parameter set.
    pub orders_per_second: Vec<f64>,
    /// True while the tables are new; false once they have ramped.
    pub new_stack_only: bool,
    /// False for a quota of another region than us-east-1, or one that only a team's own rule
    /// meets: shown with its margin, left out of the stack's ceiling.
    pub counted: bool,
    pub shows: &'static str,
}

/// Orders a second a queue's mapping takes: `PollerConcurrency` full batches at once, each
/// lasting `batch_ms`, an order sending `messages_per_order` to the queue.
pub fn mapping(params: &Params, batch_ms: f64, messages_per_order: f64) -> f64 {
    params.poller_concurrency * BATCH_SIZE / (batch_ms / 1000.0) / messages_per_order
}

/// Concurrent executions one order a second keeps busy: the submission's, and the share of a
/// batch of each queue's.
pub fn executions_per_order_per_second(per: &PerOrder, d: &Durations) -> f64 {
    per.api_requests * d.submission_ms / 1000.0
        + (per.starts + per.replies) / BATCH_SIZE * d.scheduler_batch_ms / 1000.0
        + per.agents * per.agent_requests / BATCH_SIZE * d.agent_batch_ms / 1000.0
}

/// Every resource's ceiling, for each parameter set.
pub fn limits(per: &PerOrder, d: &Durations, sets: &[Params]) -> Vec<Limit> {
    let each = |f: &dyn Fn(&Params) -> f64| sets.iter().map(f).collect::<Vec<_>>();
    let fixed = |v: f64| sets.iter().map(|_| v).collect::<Vec<_>>();
    let mut all = vec![
        Limit {
            resource: "HTTP API route (`ApiThrottlingRateLimit`)",
            bound: "the stack's parameter".into(),
            orders_per_second: each(&|p| p.api_rate / per.api_requests),
            new_stack_only: false,
            counted: true,
            shows: "API Gateway answers 429; the client sends the order again with its key",
        },
        Limit {
            resource: "HTTP API, the account",
            bound: cite(&API_ACCOUNT_RPS),
            orders_per_second: fixed(API_ACCOUNT_RPS.value / per.api_requests),
            new_stack_only: false,
            counted: true,
            shows: "API Gateway answers 429",
        },
        Limit {
            resource: "scheduler, start queue (`PollerConcurrency`)",
            bound: cite(&MAPPING_CONCURRENCY),
            orders_per_second: each(&|p| mapping(p, d.scheduler_batch_ms, per.starts)),
            new_stack_only: false,
            counted: true,
            shows: "start messages wait in the queue; past `MaxQueueWaitSeconds` the door answers 503 with Retry-After",
        },
        Limit {
            resource: "scheduler, reply queue (`PollerConcurrency`)",
            bound: cite(&MAPPING_CONCURRENCY),
            orders_per_second: each(&|p| mapping(p, d.scheduler_batch_ms, per.replies)),
            new_stack_only: false,
            counted: true,
            shows: "replies wait in the queue; orders slow down, the door sheds new ones with 503",
        },
        Limit {
            resource: "an agent's queue (`PollerConcurrency`)",
            bound: cite(&MAPPING_CONCURRENCY),
            orders_per_second: each(&|p| mapping(p, d.agent_batch_ms, per.agent_requests)),
            new_stack_only: false,
            counted: true,
            shows: "requests wait in the agent's queue; the door sheds new orders with 503",
        },
        Limit {
            resource: "Lambda, the account's concurrent executions",
            bound: cite(&LAMBDA_CONCURRENCY),
            orders_per_second: fixed(
                LAMBDA_CONCURRENCY.value / executions_per_order_per_second(per, d),
            ),
            new_stack_only: false,
            counted: true,
            shows: "invocations throttled: API Gateway answers 500 to the submission (clients retry), queued messages wait",
        },
        Limit {
            resource: "StateTable, new (on-demand; pre-warmed for `ExpectedOrdersPerSecond`)",
            bound: format!("{}, or its warm throughput", cite(&NEW_TABLE_WCU)),
            orders_per_second: each(&|p| p.state_table_warm / per.state_table_wcu),
            new_stack_only: true,
            counted: true,
            shows: "writes throttled past the SDK's retries: the message comes back later, the door answers 503",
        },
        Limit {
            resource: "`ByCompleteBy` and `ByWatchedSince`, new (on-demand indexes; pre-warmed as their table)",
            bound: cite(&NEW_INDEX_WCU),
            orders_per_second: each(&|p| p.index_warm / per.index_wcu),
            new_stack_only: true,
            counted: true,
            shows: "the index throttles the table's writes, as below",
        },
        Limit {
            resource: "StateTable, ramped",
            bound: cite(&TABLE_MAX_WCU),
            orders_per_second: fixed(TABLE_MAX_WCU.value / per.state_table_wcu),
            new_stack_only: false,
            counted: true,
            shows: "writes throttled, as above",
        },
        Limit {
            resource: "`ByCompleteBy` or `ByWatchedSince`, new, its busiest partition (its shards placed at random on one partition per 1,000 units; what 1 new index in 100 meets)",
            bound: cite(&PARTITION_WCU),
            orders_per_second: each(&|p| busiest_partition_ceiling(per, p)),
            new_stack_only: true,
            counted: true,
            shows: "the index throttles the table's writes (an index that cannot keep up holds back its table), until DynamoDB splits the partition",
        },
        Limit {
            resource: "EventBridge `PutEvents`",
            bound: cite(&PUT_EVENTS_RPS),
            orders_per_second: fixed(PUT_EVENTS_RPS.value / per.put_events),
            new_stack_only: false,
            counted: true,
            shows: "terminal events late (published again); alerts republished by the supervisor",
        },
        Limit {
            resource: "EventBridge `PutEvents`, us-east-2",
            bound: cite(&PUT_EVENTS_RPS_US_EAST_2),
            orders_per_second: fixed(PUT_EVENTS_RPS_US_EAST_2.value / per.put_events),
            new_stack_only: false,
            counted: false,
            shows: "as above",
        },
    ];
    // One rule of a team's on the terminal events, region by region: shown, never the ceiling.
    let regions = [
        (
            "EventBridge deliveries, one rule of yours on the terminal events: us-east-1",
            "the events reach their targets late; none is lost",
        ),
        ("the same: us-east-2", "as above"),
        (
            "the same: the smallest regions",
            "as above; `StatusEvents=none` (or fewer kinds) publishes fewer",
        ),
    ];
    all.extend(RULE_DELIVERIES.iter().zip(regions).map(|(quota, (resource, shows))| Limit {
        resource,
        bound: cite(quota),
        orders_per_second: fixed(quota.value / deliveries(per)),
        new_stack_only: false,
        counted: false,
        shows,
    }));
    all
}

/// Deliveries to rule targets one order makes: the stack's own rules', and one rule's of the
/// team's on its terminal events.
fn deliveries(per: &PerOrder) -> f64 {
    per.rule_deliveries + per.terminal_events
}

/// How far above `declared` a binder that takes `ceiling` orders a second is, as a share.
pub fn margin(ceiling: f64, declared: f64) -> f64 {
    ceiling / declared - 1.0
}

fn cite(q: &Quota) -> String {
    format!("[{}]({})", q.what, q.source)
}

/// The limit that binds first for parameter set `i`, on a new stack or once its tables ramped.
pub fn binding(limits: &[Limit], i: usize, new_stack: bool) -> Option<&Limit> {
    limits
        .iter()
        .filter(|l| l.counted && (new_stack || !l.new_stack_only))
        .min_by(|a, b| a.orders_per_second[i].total_cmp(&b.orders_per_second[i]))
}

/// How long a new stack's tables take to sustain `orders_per_second`, each doubling its
/// previous peak every 30 minutes from what it takes at first (a new table's, or its warm
/// throughput).
pub fn ramp_minutes(per: &PerOrder, params: &Params, orders_per_second: f64) -> f64 {
    let doublings = |needed: f64, start: f64| {
        if needed <= start { 0.0 } else { (needed / start).log2().ceil() }
    };
    let most = doublings(orders_per_second * per.state_table_wcu, params.state_table_warm)
        .max(doublings(orders_per_second * per.index_wcu, params.index_warm));
    most * 30.0
}

/// Minutes the supervisor takes to repair every lease of `seconds` of orders arriving at
/// `orders_per_second`, should they all expire at once.
pub fn recovery_minutes(params: &Params, orders_per_second: f64, seconds: f64) -> f64 {
    (orders_per_second * seconds / (params.sweep_limit * params.sweeps_per_minute)).ceil()
}

/// Partitions a new `ByCompleteBy` has: one per 1,000 units of its warm throughput.
pub fn index_partitions(params: &Params) -> u16 {
    (params.index_warm / PARTITION_WCU.value).ceil() as u16
}

/// Orders a second a new `ByCompleteBy` takes before the partition holding the most of its
/// shards, in the placement one new index in a hundred meets, is full: each shard takes an
/// even share of the index's writes.
pub fn busiest_partition_ceiling(per: &PerOrder, params: &Params) -> f64 {
    let shards = params.index_shards as u16;
    let most = busiest_partition(shards, index_partitions(params), PLACEMENT_SHARE);
    PARTITION_WCU.value * f64::from(shards) / f64::from(most) / per.index_wcu
}

/// Share of new indexes whose busiest partition holds no more shards than the ceiling assumes.
pub const PLACEMENT_SHARE: f64 = 0.99;

/// The ceiling table, in Markdown.
pub fn render(per: &PerOrder, d: &Durations, sets: &[Params]) -> String {
    let limits = limits(per, d, sets);
    let mut t = String::new();
    let names: Vec<&str> = sets.iter().map(|p| p.name).collect();
    let _ = writeln!(t, "| resource | bound by | {} | when exceeded |", names.join(" | "));
    let _ = writeln!(t, "| --- | --- | {}--- |", "---: | ".repeat(sets.len()));
    for l in &limits {
        // Each ceiling with its margin over the set's declared rate, in bold under the headroom.
        let cells: Vec<String> = l
            .orders_per_second
            .iter()
            .zip(sets)
            .map(|(v, p)| {
                let m = margin(*v, p.expected_rate);
                let cell = format!("{v:.0} ({:+.0} %)", 100.0 * m);
                if m < HEADROOM { format!("**{cell}**") } else { cell }
            })
            .collect();
        let _ =
            writeln!(t, "| {} | {} | {} | {} |", l.resource, l.bound, cells.join(" | "), l.shows);
    }
    let _ = writeln!(t);
    for (i, p) in sets.iter().enumerate() {
        let (Some(new), Some(ramped)) = (binding(&limits, i, true), binding(&limits, i, false))
        else {
            continue;
        };
        let ceiling = ramped.orders_per_second[i];
        let first_minute = new.orders_per_second[i];
        let declared = if first_minute >= p.expected_rate {
            "taken from the first minute"
        } else {
            "more than a new stack takes"
        };
        let _ = writeln!(
            t,
            "- **{}** (declares {:.0} orders a second, {declared}): a new stack takes {:.0} orders a second ({}); once its tables have ramped ({:.0} minutes of rising traffic), {:.0} ({}). Every lease of a minute of orders at the declared rate expiring at once is repaired in {:.0} minutes ({:.0} a sweep, over {:.0} shards).",
            p.name,
            p.expected_rate,
            first_minute,
            new.resource,
            ramp_minutes(per, p, ceiling),
            ceiling,
            ramped.resource,
            recovery_minutes(p, p.expected_rate, 60.0),
            p.sweep_limit,
            p.index_shards,
        );
        let close: Vec<String> = limits
            .iter()
            .filter(|l| margin(l.orders_per_second[i], p.expected_rate) < HEADROOM)
            .map(|l| {
                let m = margin(l.orders_per_second[i], p.expected_rate);
                format!("{} ({:+.0} %)", l.resource, 100.0 * m)
            })
            .collect();
        let _ = if close.is_empty() {
            writeln!(
                t,
                "  Every binder takes at least {:.0} % more than the {:.0} orders a second it declares.",
                100.0 * HEADROOM,
                p.expected_rate
            )
        } else {
            writeln!(
                t,
                "  Within {:.0} % of the {:.0} orders a second it declares: {}.",
                100.0 * HEADROOM,
                p.expected_rate,
                close.join("; ")
            )
        };
        if p.api_burst > API_ACCOUNT_BURST.value {
            let _ = writeln!(
                t,
                "  Its route's burst of {:.0} is more than the account's {}: the account's binds first.",
                p.api_burst,
                cite(&API_ACCOUNT_BURST)
            );
        }
    }
    let executions = executions_per_order_per_second(per, d);
    let from_idle = per.api_requests * (d.submission_ms + d.submission_start_ms) / 1000.0;
    let _ = writeln!(
        t,
        "- Each order a second keeps {executions:.3} executions busy on average, in warm environments and full batches: {:.0} at 1,000 orders a second, {:.0} at 2,000. A function adds at most {}, so a stack in use meets no Lambda ramp below about {:.0} orders a second. From idle, each submission starts an environment of its own, which adds {:.0} ms (Lambda's start of it, assumed, and the function's measured init): a burst from idle above about {:.0} orders a second meets the submission's ramp in its first seconds, and what it cannot start yet is answered 500 (see the load simulation).",
        executions * 1000.0,
        executions * 2000.0,
        cite(&LAMBDA_SCALING_RATE),
        LAMBDA_SCALING_RATE.value / executions,
        d.submission_start_ms,
        LAMBDA_SCALING_RATE.value / from_idle
    );
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three_steps() -> PerOrder {
        PerOrder {
            api_requests: 1.0,
            state_table_wcu: 6.0,
            index_wcu: 2.0,
            starts: 1.0,
            replies: 3.0,
            agent_requests: 1.0,
            agents: 3.0,
            put_events: 1.0,
            rule_deliveries: 0.0,
            terminal_events: 1.0,
        }
    }

    fn set(poller: f64, shards: f64) -> Params {
        Params {
            name: "p",
            poller_concurrency: poller,
            api_rate: 200.0,
            api_burst: 400.0,
            expected_rate: 100.0,
            index_shards: shards,
            sweep_limit: 500.0,
            state_table_warm: NEW_TABLE_WCU.value,
            index_warm: NEW_INDEX_WCU.value,
            sweeps_per_minute: 1.0,
            trace_share: 1.0,
            scheduler_window_s: 0.0,
            agent_window_s: 0.0,
            retention_days: 30.0,
        }
    }

    fn template() -> Template {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../template.yaml");
        Template::load(&path).unwrap()
    }

    /// What `cost-model` counts for a three-step order: 5.015 write units on `StateTable`, 2 on
    /// `ByCompleteBy`.
    fn counted() -> PerOrder {
        PerOrder { state_table_wcu: 5.015, index_wcu: 2.0, ..three_steps() }
    }

    #[test]
    fn every_rate_a_stack_may_declare_is_taken_from_its_first_minute_with_room_to_spare() {
        let template = template();
        let allowed = template.parameters["ExpectedOrdersPerSecond"]["AllowedValues"].clone();
        let rates: Vec<String> = allowed
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
            .collect();
        assert!(rates.contains(&"2000".to_owned()), "{rates:?}");
        let per = counted();
        for rate in &rates {
            let p = Params::of_stack("r", &template, &[("ExpectedOrdersPerSecond", rate)]).unwrap();
            let r = p.expected_rate;
            // Half again the declared rate, for retries and resumes.
            assert!(p.state_table_warm / per.state_table_wcu >= 1.5 * r, "StateTable at {rate}");
            assert!(p.index_warm / per.index_wcu >= 1.5 * r, "ByCompleteBy at {rate}");
            assert!(
                busiest_partition_ceiling(&per, &p) >= (1.0 + HEADROOM) * r,
                "the index's busiest partition at {rate}"
            );
            assert!(recovery_minutes(&p, r, 60.0) <= 5.0, "recovery at {rate}");
        }
        // Where no warm throughput is needed, none is bought.
        let small = Params::of_stack("s", &template, &[]).unwrap();
        assert_eq!((small.state_table_warm, small.index_warm), (4_000.0, 4_000.0));
        let large =
            Params::of_stack("l", &template, &[("ExpectedOrdersPerSecond", "2000")]).unwrap();
        assert_eq!((large.state_table_warm, large.index_warm), (21_000.0, 12_000.0));
        assert_eq!((large.index_shards, large.sweep_limit), (128.0, 24_000.0));
        assert_eq!(index_partitions(&large), 12);
    }

    #[test]
    fn each_ceiling_is_the_quota_over_what_an_order_uses_of_it() {
        let limits = limits(&three_steps(), &Durations::WAITS, &[set(2.0, 8.0)]);
        let of = |name: &str| {
            limits.iter().find(|l| l.resource.starts_with(name)).unwrap().orders_per_second[0]
        };
        // 2 batches of 10 replies, 40 ms each: 500 replies, 3 an order.
        assert!((of("scheduler, reply") - 500.0 / 3.0).abs() < 1e-9);
        assert!((of("an agent's") - 200.0).abs() < 1e-9);
        assert!((of("StateTable, new") - 4_000.0 / 6.0).abs() < 1e-9);
        // 8 shards on a new index's 4 partitions: 6 on one, in one placement in a hundred.
        assert!(
            (of("`ByCompleteBy` or `ByWatchedSince`, new, its busiest")
                - 1_000.0 * 8.0 / 6.0 / 2.0)
                .abs()
                < 1e-9
        );
        assert!((of("`ByCompleteBy` and `ByWatchedSince`, new (") - 2_000.0).abs() < 1e-9);
        let first = binding(&limits, 0, true).unwrap();
        assert_eq!(first.resource, "scheduler, reply queue (`PollerConcurrency`)");
    }

    #[test]
    fn a_quota_of_another_region_shows_its_margin_and_never_sets_the_ceiling() {
        let per = three_steps();
        let p = Params { expected_rate: 2_000.0, api_rate: 3_000.0, ..set(100.0, 8.0) };
        let all = limits(&per, &Durations::WAITS, std::slice::from_ref(&p));
        let smallest = all.iter().find(|l| l.resource == "the same: the smallest regions").unwrap();
        assert!((smallest.orders_per_second[0] - 750.0).abs() < 1e-9);
        assert_eq!(
            binding(&all, 0, false).unwrap().resource,
            "HTTP API route (`ApiThrottlingRateLimit`)"
        );
        let text = render(&per, &Durations::WAITS, &[p]);
        // Under the headroom, in bold, with the margin over the declared rate.
        assert!(text.contains("| **2400 (+20 %)** |"), "{text}");
        assert!(text.contains("| **750 ("), "{text}");
        assert!(text.contains("| 3000 (+50 %) |"), "{text}");
        assert!(text.contains("Within 30 % of the 2000 orders a second it declares:"), "{text}");
    }

    #[test]
    fn a_new_table_ramps_by_doubling_and_the_supervisor_repairs_a_sweep_limit_a_minute() {
        let per = three_steps();
        let new = set(2.0, 8.0);
        assert_eq!(ramp_minutes(&per, &new, 600.0), 0.0);
        // 12,000 units a second: three times a new table's, two doublings.
        assert_eq!(ramp_minutes(&per, &new, 2_000.0), 60.0);
        let warm = Params { state_table_warm: 12_000.0, index_warm: 4_000.0, ..new.clone() };
        assert_eq!(ramp_minutes(&per, &warm, 2_000.0), 0.0);
        assert_eq!(ramp_minutes(&per, &warm, 3_000.0), 30.0);
        assert_eq!(recovery_minutes(&set(2.0, 8.0), 100.0, 60.0), 12.0);
    }
}
