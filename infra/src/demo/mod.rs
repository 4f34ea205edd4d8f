//! The demo: the local stack under a few hundred orders while the remote services misbehave,
//! with live progress and a summary that checks the system's promises: every order terminal,
//! no remote effect applied twice, one alert per failed order, and every order that did not
//! go through explained by a fault the simulated service injected into it.
//!
//! The clients behave as a client of the API should: an order refused at the door (503) is
//! sent again, with the same idempotency key, after its `Retry-After` (and up to a fifth more,
//! so that clients refused together do not come back together); a throttled one (429 from the
//! route, 500 when Lambda throttles the function), or one that met an error, after a second,
//! then twice as long each time, up to half a minute.

pub mod effects;

mod clients;
mod figures;
mod follow;
mod records;
mod summary;

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sas_rng::SplitMix;
use serde_json::Value;

use crate::Error;
use crate::emulation::local::LocalStack;
use crate::observe::cpu::{CpuSample, FunctionUse};

/// Faults of the simulated services during the demo: transient faults, lost answers, slow
/// calls, an outage from 5 s to 15 s after the service starts (while the orders are still
/// arriving), and payments declined and welcome emails refused for good now and then.
pub const DEMO_FAULTS: &str = r#"{"default":{"transient_rate":0.15,"lost_answer_rate":0.03,"latency_ms":20,"latency_jitter_ms":40,
  "outages":[{"start_s":5,"end_s":15}]},"actions":{"charge-payment":{"permanent_rate":0.04},"send-welcome":{"permanent_rate":0.08}}}"#;

/// The reference workflow (`shared/workflows/`) with budgets short enough for a demo.
pub fn demo_workflow() -> String {
    with_budgets(sas_workflows::order_fulfilment(), 15)
}

/// The workflows the demo runs side by side, with budgets short enough for a demo: the
/// reference one, its express variant, account-opening, and the shop's order shipped parcel by
/// parcel with the workflow each parcel runs (as `WORKFLOW_JSON`, a list).
pub fn demo_workflows() -> String {
    let file = |name: &str| sas_workflows::file(name).map_or("", |f| f.json);
    let all: Vec<Value> = [
        demo_workflow(),
        with_budgets(file(EXPRESS_WORKFLOW), 15),
        with_budgets(file(ACCOUNT_WORKFLOW), 15),
        with_budgets(file(SPLIT_WORKFLOW), 15),
        with_budgets(file(PARCEL_WORKFLOW), 15),
    ]
    .iter()
    .filter_map(|w| serde_json::from_str(w).ok())
    .collect();
    Value::Array(all).to_string()
}

/// The second workflow: every [`ACCOUNT_EVERY`]th order of the demo opens an account, where the
/// stack runs it.
const ACCOUNT_WORKFLOW: &str = "account-opening";
const ACCOUNT_EVERY: usize = 4;

/// The third: the shop's order with the stock reserved and the card charged at once, for the
/// order after each account, where the stack runs it.
const EXPRESS_WORKFLOW: &str = "express-fulfilment";

/// The fourth: the shop's order shipped parcel by parcel, each parcel a child order of
/// [`PARCEL_WORKFLOW`], for one order in [`SPLIT_EVERY`], where the stack runs it.
const SPLIT_WORKFLOW: &str = "split-shipment";
const PARCEL_WORKFLOW: &str = "parcel-delivery";
const SPLIT_EVERY: usize = 8;

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
        // A wait's time and a callback's timeout are not budgets.
        for step in steps.iter_mut().filter(|s| s.get("agent").is_some()) {
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
    /// Actions called faster than their agent's declared rate, one line each.
    pub over_rate: Vec<String>,
    /// Function processes killed during the run.
    pub kills: u32,
    /// Messages that reached a dead-letter queue.
    pub dead_lettered: usize,
    /// The faults declared an outage and no call met it: the run ended before it began.
    pub outage_missed: bool,
    /// What each function did during the run, and the processor time it took (where the
    /// machine tells it).
    pub uses: Vec<FunctionUse>,
    pub text: String,
}

impl Summary {
    /// The demo passes when every order is terminal, the service holds exactly what the
    /// orders' ends say (see [`crate::demo::effects`]), no action was called faster than its
    /// agent declared, every failed
    /// order raised its alert, and every order that did not go through was failed by a fault
    /// the simulated service injected, not by load or delay; and the figures it reports cover
    /// every finished order; and no message reached a dead-letter queue (neither crashes nor
    /// throttling are a reason for one); and an outage the faults declare met the orders.
    pub fn passed(&self) -> bool {
        self.unfinished == 0
            && !self.outage_missed
            && self.dead_lettered == 0
            && self.effects_wrong.is_empty()
            && self.over_rate.is_empty()
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
    let before = CpuSample::take(stack);
    let following = follow::follow(stack, orders, rate, limit, &accepted_at, &kills);
    let (summary, ()) = tokio::join!(following, killer);
    let mut summary = summary?;
    if let (Some(before), Some(after)) = (before, CpuSample::take(stack)) {
        summary.text.push_str(&after.since(&before));
        summary.uses = after.uses(&before, stack);
    }
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
