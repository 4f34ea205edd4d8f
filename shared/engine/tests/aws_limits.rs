//! AWS's limits on one deployed stack, around the real services: the orders a second it
//! finishes when sent its stated ceiling, and what becomes of the orders sent at twice that.
//!
//! As in `load.rs`, the real services (submission, scheduler, agents, supervisor) run on
//! in-memory ports, on a manual clock moved in ticks, each worker on a clock of its own so that
//! a batch's writes and messages happen when its work ends. Around them, the quotas that bound
//! one stack on AWS, at their published defaults:
//!
//! - **The HTTP API route** takes `ApiThrottlingRateLimit` requests a second, from a bucket of
//!   `ApiThrottlingBurstLimit`. Every request takes a token, a client's retries included; one
//!   that finds none is answered 429 before any function runs, and its client sends the order
//!   again later, backing off (1 s, doubling to 30 s, and up to a fifth more).
//! - **The door** (the submission's own refusal, 503 with `Retry-After`) is the engine's: its
//!   clients come back after what it says, and up to a fifth more. So do the clients of a
//!   submission whose write DynamoDB throttled (503, `Retry-After: 1`).
//! - **Each SQS event source mapping** runs at most `PollerConcurrency` batches of 10 at once,
//!   and only as many as it has scaled to: 5 at first, 300 more a minute. A batch lasts as
//!   `cost-model` takes it: the waits assumed and the processor time measured for a batch of
//!   its size, at the template's memory (below); an agent's remote calls are made side by
//!   side. A message whose
//!   handling failed comes back after its queue's visibility timeout (71 s for the scheduler's
//!   queues, 540 s for an agent's) and, from its third receive on, is sent again as a new
//!   message 60 s later, as the deployed consumers do, so that a passing cause never
//!   dead-letters it.
//! - **DynamoDB** takes so many write units a second: `StateTable` 4,000 when new, or its warm
//!   throughput; the `ByCompleteBy` index 4,000 when new, or its warm throughput; and each
//!   partition of that index, one per 1,000 units of it, 1,000. Its 128 shards lie on its
//!   partitions as they do in one new index in a hundred, the worst of the others: as many as
//!   [`busiest_partition`] says on the first, the rest spread evenly over the others. A state
//!   write costs one unit (the order is
//!   kept in its record, which stays under 1 KB). A write that
//!   changes the record's entry in the index costs index units on its shard's partition, as
//!   `cost-model` counts them: one to add or remove the entry, two to move it. A write that
//!   would take any of these past what its second has left is throttled (an index that cannot
//!   keep up holds back its table's writes) and costs nothing. Where a function's time is
//!   modelled (the scheduler's batches), the SDK tries it twice more, after up to 1 s and then
//!   2 s, on that function's clock; then, and at once for the submission and the supervisor,
//!   the store fails as the DynamoDB adapter fails a `ProvisionedThroughputExceededException`:
//!   [`Error::Unavailable`], retryable.
//! - **Lambda** runs at most 1,000 executions at once across the account's functions, and
//!   each function adds at most 1,000 execution environments every 10 s. Each batch of a
//!   mapping, and each submission (65 ms), is one execution. One that finds every environment
//!   of its function busy starts a new one: a cold start, which adds Lambda's start of the
//!   environment (assumed: 500 ms) and the function's init (its processor time as
//!   `local-stack durations` measured it, at the function's memory). One that finds no
//!   execution free, or an environment its function may not add yet, is throttled: a mapping
//!   leaves its messages in the queue and tries again at the next tick; a submission is
//!   answered 500 by API Gateway, and its client backs off as after a 429.
//! - **The supervisor** sweeps once a minute, repairing at most `sweep_limit` records; that
//!   limit follows from `ExpectedOrdersPerSecond` through [`Scale::for_rate`], as in the
//!   deployed functions.
//!
//! The quotas are restated here from `infra/src/tools/ceiling.rs`, which cites the page of each
//! (this crate cannot depend on the infra crate); the per-order uses and invocation durations
//! from which `cost-model` states each set's ceiling are restated with them, and a test checks
//! that they give the ceilings it states.
//!
//! **Scaled down.** A set may be run at 1/k of its size: every rate, quota and capacity (API
//! rate and burst, mapping concurrency, write units, sweep limit) divided by k, durations
//! unchanged, so that orders behave as at full size while k times fewer of them are simulated.
//! `defaults` runs at full size; `large` at 1/20 (145 orders a second for its 2,909). A
//! scaled-down mapping's worker stands for k batches at once, and starts once the mapping has
//! scaled to all k of them: the first of `large`'s 3 s after the first message, the second at
//! 7 s (where AWS adds a batch at a time). A scaled-down partition sees its writes' random
//! spread k times closer to its quota than at full size: harsher, not kinder.
//!
//! Each run lasts three minutes of arrivals. A stack sent its ceiling meets rising traffic: its
//! first minute brings a fifth of it. One sent twice its ceiling starts cold. The large set is
//! also sent the 2,000 orders a second it declares, once cold (mappings at 5 batches, no
//! environment) and once warm (every mapping scaled up, an environment for each batch). What
//! must hold, for each set:
//! - sent its stated ceiling or its declared rate, the stack finishes orders at 90 % of it or
//!   more over the last minute of the arrivals;
//! - sent twice that, it refuses some (429 and 503), every order sent is accepted in the end,
//!   and every order accepted ends Processed: none compensated, none in Error, no message
//!   dead-lettered or refused as poison, no illegal input. It also goes on finishing orders at
//!   90 % of its ceiling or more: overload does not collapse it;
//! - in every run, 95 % of the orders accepted end within `MAX_QUEUE_WAIT_SECONDS` (60 s) of
//!   their acceptance, as the door promises.
//!
//! **Neighbours.** The same stack at its defaults, shared by tenants (each its own caller): four
//! send one order a second each for a minute; a fifth, five seconds in, sends 3,000 as fast as
//! the route takes them (nine tenths of its rate, above what the stack finishes), so that a
//! backlog builds in the queues. With fair queues (the in-memory queues deliver as SQS fair
//! queues do, by the orders' groups), the four's p95 from first try to Processed stays within
//! 1.5 times what they get alone, and the door refuses none of their orders; without, it does
//! not (which shows the burst made a backlog to wait behind).
//!
//! Left out: reads (the tables' read units, never near their quotas here), the supervisor's
//! executions (one a minute), environments Lambda ends while idle, DynamoDB's burst
//! capacity and the SDK's client-side retry quota, several submission containers each with its
//! own view of the queues (one door here), and faults: nothing else fails in this world, so an
//! order that does not end Processed failed for the limits alone.
//!
//! `SEED=n` runs seed n (default 1).

#![allow(clippy::unwrap_used)]

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sas_engine::catalogue::Catalogue;
use sas_engine::config::{EngineConfig, INDEX_SHARDS, Scale, busiest_partition};
use sas_engine::keys::{Queued, Slots};
use sas_engine::load::Gauges;
use sas_engine::memory::{
    Delivery, InMemory, ManualClock, MemoryBus, MemoryQueues, MemoryRemote, MemoryServiceBook,
    MemoryStore, MemoryWaits, QueueSettings, SeqIds, SplitMix,
};
use sas_engine::message::Message;
use sas_engine::payload::NoPayloads;
use sas_engine::ports::{
    Clock, Created, Destination, Expected, ExpiryIndex, HeldIndex, Incoming, IndexEntry,
    OrderRecord, Outbox, Outgoing, Read, RemoteCall, RemoteFault, RemoteService, Saved, StateStore,
};
use sas_engine::services::{Agent, Assembly, Handled, Scheduler, Submission, Supervisor};
use sas_engine::state::{Happening, ProcessState, StateRecord};
use sas_engine::workflow::Workflow;
use sas_engine::{Error, OrderId, Owner, Result, Timestamp};

// AWS's quotas, as `infra/src/tools/ceiling.rs` states and cites them.
/// Write units a second one partition takes; a new index has one per 1,000 units of its warm
/// throughput.
const PARTITION_WCU: f64 = 1_000.0;
/// Share of new indexes whose busiest partition holds no more shards than the stated ceiling
/// assumes.
const PLACEMENT_SHARE: f64 = 0.99;
/// Write units a second a new on-demand table takes (`StateTable` unless pre-warmed).
const NEW_TABLE_WCU: f64 = 4_000.0;
/// Write units a second a new on-demand index takes, unless pre-warmed.
const NEW_INDEX_WCU: f64 = 4_000.0;
/// An event source mapping's concurrent batches at first, and how many it adds a minute.
const MAPPING_START: f64 = 5.0;
const MAPPING_GROWTH_PER_MINUTE: f64 = 300.0;
/// Messages a mapping hands one invocation (the template's `BatchSize`).
const BATCH: usize = 10;
/// How long a mapping gathers messages into a batch of fewer than [`BATCH`] before it invokes
/// its function (`SchedulerBatchingWindowSeconds`, `AgentBatchingWindowSeconds`).
const BATCHING_WINDOW: Duration = Duration::from_secs(1);
/// Concurrent executions of all an account's functions in a region.
const ACCOUNT_CONCURRENCY: f64 = 1_000.0;
/// Execution environments one function may add in each [`SCALING_WINDOW`].
const FUNCTION_SCALING: f64 = 1_000.0;
const SCALING_WINDOW: Duration = Duration::from_secs(10);

// What one order of the three-step workflow uses, as `cost-model` counts it.
const API_REQUESTS: f64 = 1.0;
const STARTS: f64 = 1.0;
const REPLIES: f64 = 3.0;
const AGENT_REQUESTS: f64 = 1.0;
const AGENTS: f64 = 3.0;
const STATE_TABLE_WCU: f64 = 5.015;
const INDEX_WCU: f64 = 2.0;

// How long invocations last, as `cost-model` takes them (`infra/src/tools/durations.rs`): what
// each waits for on AWS, assumed (an agent's batch, as long as its slowest remote call), and
// the processor time `local-stack durations` measured for a batch of 10, slowed to the share of
// a vCPU the template's memory buys.
const SUBMISSION_WAIT_MS: f64 = 30.0;
const SCHEDULER_WAIT_MS: f64 = 40.0;
const AGENT_WAIT_MS: f64 = 100.0;
const SUBMISSION_MEMORY_MB: f64 = 128.0;
const SCHEDULER_MEMORY_MB: f64 = 1024.0;
const AGENT_MEMORY_MB: f64 = 128.0;
/// Lambda's part of a cold start, before the function's own init (`ENVIRONMENT_START_MS` in
/// `infra/src/tools/durations.rs`): assumed, on the slow side of what AWS gives.
const ENVIRONMENT_START_MS: f64 = 500.0;
const ONE_VCPU_MB: f64 = 1769.0;
const MEASURED: &str = include_str!("../../../infra/durations.json");

/// What `local-stack durations` measured, read once: the simulation asks at every batch.
static WORK: std::sync::LazyLock<serde_json::Value> = std::sync::LazyLock::new(|| {
    serde_json::from_str::<serde_json::Value>(MEASURED).unwrap()["work"].clone()
});

/// How many times longer processor work takes at `memory_mb` than on a whole vCPU.
fn slowdown(memory_mb: f64) -> f64 {
    (ONE_VCPU_MB / memory_mb).max(1.0)
}

/// How long a batch of `messages` of function `kind` lasts: `wait_ms`, and its processor time
/// at `memory_mb`, to the millisecond.
fn batch_duration(kind: &str, wait_ms: f64, memory_mb: f64, messages: usize) -> Duration {
    let work = &WORK[kind];
    let cpu_ms = work["invocation_ms"].as_f64().unwrap()
        + messages as f64 * work["message_ms"].as_f64().unwrap();
    let ms = wait_ms + cpu_ms * slowdown(memory_mb);
    Duration::from_millis(ms.round() as u64)
}

fn scheduler_batch(messages: usize) -> Duration {
    batch_duration("scheduler", SCHEDULER_WAIT_MS, SCHEDULER_MEMORY_MB, messages)
}

/// An agent's batch lasts as long as its slowest remote call: each call takes this.
fn agent_batch(messages: usize) -> Duration {
    batch_duration("agent", AGENT_WAIT_MS, AGENT_MEMORY_MB, messages)
}

/// Executions one order a second keeps busy, in full batches: its submission, and its share of
/// a batch of each queue's.
fn executions() -> f64 {
    API_REQUESTS * submission_invocation().as_secs_f64()
        + (STARTS + REPLIES) / BATCH as f64 * scheduler_batch(BATCH).as_secs_f64()
        + AGENTS * AGENT_REQUESTS / BATCH as f64 * agent_batch(BATCH).as_secs_f64()
}

/// One request to the HTTP API's submission.
fn submission_invocation() -> Duration {
    batch_duration("submission", SUBMISSION_WAIT_MS, SUBMISSION_MEMORY_MB, 0)
}

/// What a new execution environment of `kind` adds to its first invocation: Lambda's own start
/// of it, and the function's init (its processor time as `local-stack durations` measured it,
/// slowed to its memory's share of a vCPU).
fn cold_start(kind: &str, memory_mb: f64) -> Duration {
    let init_ms = WORK[kind]["init_ms"].as_f64().unwrap();
    Duration::from_millis((ENVIRONMENT_START_MS + init_ms * slowdown(memory_mb)).round() as u64)
}

// The deployed consumers (`template.yaml`, `shared/aws/src/batch.rs`).
const SCHEDULER_VISIBILITY: Duration = Duration::from_secs(71);
const AGENT_VISIBILITY: Duration = Duration::from_secs(540);
const MAX_RECEIVES: u32 = 5;
const REQUEUE_FROM_RECEIVE: u32 = 3;
const REQUEUE_DELAY: Duration = Duration::from_secs(60);
/// `MaxQueueWaitSeconds`: the longest a new order may expect to wait in the queues before the
/// door refuses it.
const MAX_QUEUE_WAIT: Duration = Duration::from_secs(60);
/// `SweepSchedule`: once a minute.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// The SDK's standard retry mode: three tries in all, each retry after a random share of 1 s
/// doubling per retry (up to 20 s).
const SDK_ATTEMPTS: u32 = 3;
const SDK_INITIAL_BACKOFF: Duration = Duration::from_secs(1);
const SDK_MAX_BACKOFF: Duration = Duration::from_secs(20);

/// A 429's client waits 1 s, doubling with each 429 of the same order up to this.
const CLIENT_MAX_BACKOFF: Duration = Duration::from_secs(30);

const TICK: Duration = Duration::from_millis(50);
const ARRIVALS_FOR: Duration = Duration::from_secs(180);
/// Goodput is measured over the last minute of the arrivals.
const MEASURED_FROM: Duration = Duration::from_secs(120);
/// A stack sent its ceiling has been in use: for the first minute its orders come at this
/// share of the ceiling. One sent twice its ceiling starts cold: its door, which reads what
/// the consumers last reported of their rates, takes fewer orders in that minute.
const WARM_UP: Duration = Duration::from_secs(60);
const WARM_UP_SHARE: f64 = 0.2;
const MIN_GOODPUT: f64 = 0.9;
/// How far below each quota a stack's use should stay at its declared rate.
const HEADROOM: f64 = 0.3;
/// How long a stack started cold at its declared rate may meet Lambda's throttling, while its
/// first environments start.
const COLD_SURGE: Duration = Duration::from_secs(10);
const FIRST_MINUTE: Duration = Duration::from_secs(60);

/// The parameters of one deployed stack that bound its throughput.
#[derive(Clone, Copy, Debug)]
struct Stack {
    name: &'static str,
    /// Every rate, quota and capacity is divided by this in the model; durations are not.
    scale: u32,
    /// `PollerConcurrency`: batches at once on each queue.
    poller_concurrency: u32,
    /// `ApiThrottlingRateLimit`, `ApiThrottlingBurstLimit`.
    api_rate: f64,
    api_burst: f64,
    /// `ExpectedOrdersPerSecond`.
    expected_rate: u32,
    /// Write units a second `StateTable` and `ByCompleteBy` take from the first minute: a new
    /// table's, or the warm throughput the template sets for the declared rate.
    state_table_wcu: f64,
    index_wcu: f64,
    /// Orders a second `cost-model` states it takes ("How far one stack goes").
    stated_ceiling: f64,
}

const DEFAULTS: Stack = Stack {
    name: "defaults",
    scale: 1,
    poller_concurrency: 2,
    api_rate: 200.0,
    api_burst: 400.0,
    expected_rate: 50,
    state_table_wcu: NEW_TABLE_WCU,
    index_wcu: NEW_INDEX_WCU,
    // Two batches of 10 at once on an agent's queue, each 271 ms.
    stated_ceiling: 20.0 / 0.271,
};

const LARGE: Stack = Stack {
    name: "large",
    scale: 20,
    poller_concurrency: 100,
    api_rate: 3_000.0,
    api_burst: 5_000.0,
    expected_rate: 2_000,
    state_table_wcu: 21_000.0,
    index_wcu: 12_000.0,
    // A new index's busiest partition: 22 of the 128 shards, each 2 units an order.
    stated_ceiling: 1_000.0 * 128.0 / 22.0 / 2.0,
};

impl Stack {
    /// Orders a second each modelled resource allows the full-size stack, as `ceiling.rs`
    /// computes them.
    fn limits(&self) -> Vec<(&'static str, f64)> {
        let mapping = |batch: Duration, per_order: f64| {
            f64::from(self.poller_concurrency) * BATCH as f64 / batch.as_secs_f64() / per_order
        };
        let shards = f64::from(INDEX_SHARDS);
        let busiest =
            f64::from(busiest_partition(INDEX_SHARDS, self.partitions(), PLACEMENT_SHARE));
        vec![
            ("HTTP API route", self.api_rate / API_REQUESTS),
            ("scheduler, start queue", mapping(scheduler_batch(BATCH), STARTS)),
            ("scheduler, reply queue", mapping(scheduler_batch(BATCH), REPLIES)),
            ("an agent's queue", mapping(agent_batch(BATCH), AGENT_REQUESTS)),
            ("StateTable", self.state_table_wcu / STATE_TABLE_WCU),
            ("ByCompleteBy", self.index_wcu / INDEX_WCU),
            ("ByCompleteBy, its busiest partition", shards / busiest * PARTITION_WCU / INDEX_WCU),
            ("Lambda, the account's concurrent executions", ACCOUNT_CONCURRENCY / executions()),
        ]
    }

    /// The limit that binds first (the first listed, of equals), and its orders a second.
    fn ceiling(&self) -> (&'static str, f64) {
        self.limits().into_iter().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap()
    }

    fn k(&self) -> f64 {
        f64::from(self.scale)
    }

    /// The stated ceiling, in the model's orders a second.
    fn modelled_ceiling(&self) -> f64 {
        self.stated_ceiling / self.k()
    }

    /// Workers on each queue once its mapping has scaled up.
    fn workers(&self) -> usize {
        (self.poller_concurrency / self.scale) as usize
    }

    /// Workers on each queue `t` after the first message: each stands for `scale` batches at
    /// once, and starts once the mapping has scaled to all of them.
    fn workers_at(&self, t: Duration) -> usize {
        let batches = (MAPPING_START + MAPPING_GROWTH_PER_MINUTE * t.as_secs_f64() / 60.0)
            .min(f64::from(self.poller_concurrency));
        ((batches / self.k()).floor() as usize).min(self.workers())
    }

    /// Partitions of a new `ByCompleteBy`.
    fn partitions(&self) -> u16 {
        (self.index_wcu / PARTITION_WCU).ceil() as u16
    }

    /// The partition each shard lies on: as many as one new index in a hundred has on its
    /// busiest partition on the first, the others dealt out in turn over the rest.
    fn placement(&self) -> Vec<usize> {
        let partitions = usize::from(self.partitions());
        assert!(partitions <= MOST_PARTITIONS, "{partitions} partitions");
        let busiest =
            usize::from(busiest_partition(INDEX_SHARDS, self.partitions(), PLACEMENT_SHARE));
        (0..usize::from(INDEX_SHARDS))
            .map(|shard| match shard.checked_sub(busiest) {
                None => 0,
                Some(_) if partitions == 1 => 0,
                Some(rest) => 1 + rest % (partitions - 1),
            })
            .collect()
    }

    fn quotas(&self) -> Quotas {
        Quotas {
            state_table: self.state_table_wcu / self.k(),
            index: self.index_wcu / self.k(),
            partition: PARTITION_WCU / self.k(),
        }
    }

    fn config(&self) -> EngineConfig {
        let scale = Scale::for_rate(self.expected_rate);
        EngineConfig {
            expected_rate: self.expected_rate,
            sweep_limit: scale.sweep_limit.div_ceil(self.scale as usize),
            max_queue_wait: MAX_QUEUE_WAIT,
            ..EngineConfig::default()
        }
    }
}

/// Write units a second, in the model's scale.
#[derive(Clone, Copy, Debug)]
struct Quotas {
    state_table: f64,
    index: f64,
    partition: f64,
}

/// What one write costs: units of each table, and of the index on the record's shard's
/// partition.
#[derive(Clone, Copy, Debug, Default)]
struct Units {
    state: f64,
    index: f64,
    shard: u16,
}

/// Partitions a modelled index has at most (32 thousand units of warm throughput).
const MOST_PARTITIONS: usize = 32;

/// Units used in one second.
#[derive(Clone, Copy, Debug, Default)]
struct Used {
    state: f64,
    index: f64,
    partitions: [f64; MOST_PARTITIONS],
}

/// What refused a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Refusal {
    StateTable,
    Index,
    Partition,
}

/// DynamoDB's write throughput for one stack, shared by every caller of the store.
#[derive(Debug)]
struct Dynamo {
    quotas: Quotas,
    /// The partition of each shard.
    placement: Vec<usize>,
    seconds: BTreeMap<i64, Used>,
    /// The busiest second of each: `StateTable`, the index, its busiest partition.
    peak: (f64, f64, f64),
    /// Units taken in all.
    taken: Used,
    /// Tries refused, by what refused them; writes failed after every try.
    refused: BTreeMap<Refusal, u64>,
    failed: u64,
}

impl Dynamo {
    fn new(quotas: Quotas, placement: Vec<usize>) -> Self {
        Dynamo {
            quotas,
            placement,
            seconds: BTreeMap::new(),
            peak: (0.0, 0.0, 0.0),
            taken: Used::default(),
            refused: BTreeMap::new(),
            failed: 0,
        }
    }

    /// Takes `units` from second `second`'s budgets, or refuses without taking anything.
    fn take(&mut self, second: i64, units: &Units) -> std::result::Result<(), Refusal> {
        // Writers' clocks are seconds apart at most: older seconds are over.
        while self.seconds.first_key_value().is_some_and(|(s, _)| *s < second - 60) {
            self.seconds.pop_first();
        }
        let q = self.quotas;
        let used = self.seconds.entry(second).or_default();
        let partition = self.placement[usize::from(units.shard)];
        let refusal = if used.state + units.state > q.state_table {
            Some(Refusal::StateTable)
        } else if used.index + units.index > q.index {
            Some(Refusal::Index)
        } else if used.partitions[partition] + units.index > q.partition {
            Some(Refusal::Partition)
        } else {
            None
        };
        if let Some(refusal) = refusal {
            *self.refused.entry(refusal).or_default() += 1;
            return Err(refusal);
        }
        used.state += units.state;
        used.index += units.index;
        used.partitions[partition] += units.index;
        let (state, index, busiest) = self.peak;
        self.peak =
            (state.max(used.state), index.max(used.index), busiest.max(used.partitions[partition]));
        self.taken.state += units.state;
        self.taken.index += units.index;
        Ok(())
    }
}

/// Lambda in the stack's account: the account's concurrent executions, shared by every
/// function, and each function's execution environments, of which it may add
/// [`FUNCTION_SCALING`] in each [`SCALING_WINDOW`]. An invocation that finds no execution free,
/// or needs an environment its function may not add yet, is throttled; one that finds every
/// environment of its function busy starts a new one (a cold start).
#[derive(Debug)]
struct Lambda {
    quota: f64,
    scaling: f64,
    /// When each execution in flight ends, by function.
    running: BTreeMap<String, Vec<Timestamp>>,
    /// Each function's environments, and those it added in each window.
    environments: BTreeMap<String, (usize, BTreeMap<i64, f64>)>,
    /// The most executions in flight at once, cold starts, invocations throttled (by the
    /// account's quota, by a function's scaling), and when the last was.
    peak: usize,
    cold_starts: u64,
    throttled: (u64, u64),
    last_throttled: Option<Timestamp>,
    /// A window of the run (the last minute of arrivals), the most executions at once in it,
    /// and their time in it all together.
    measured: (Timestamp, Timestamp),
    measured_peak: usize,
    busy: Duration,
}

impl Lambda {
    fn new(stack: &Stack, start: Timestamp) -> Lambda {
        Lambda {
            quota: ACCOUNT_CONCURRENCY / stack.k(),
            scaling: FUNCTION_SCALING / stack.k(),
            running: BTreeMap::new(),
            environments: BTreeMap::new(),
            peak: 0,
            cold_starts: 0,
            throttled: (0, 0),
            last_throttled: None,
            measured_peak: 0,
            measured: (start.plus(MEASURED_FROM), start.plus(ARRIVALS_FOR)),
            busy: Duration::ZERO,
        }
    }

    /// `function` has `environments` already started (a warm stack).
    fn warmed(&mut self, function: &str, environments: usize) {
        self.environments.entry(function.to_owned()).or_default().0 = environments;
    }

    fn in_flight(&mut self, now: Timestamp) -> usize {
        for ends in self.running.values_mut() {
            ends.retain(|end| *end > now);
        }
        self.running.values().map(Vec::len).sum()
    }

    /// Whether an invocation of `function` at `now` would be taken, and if so whether it
    /// needs a new environment, or else what refuses it; nothing is taken.
    fn would_take(&mut self, function: &str, now: Timestamp) -> std::result::Result<bool, Limit> {
        let in_flight = self.in_flight(now);
        let busy = self.running.get(function).map_or(0, Vec::len);
        let (environments, added) = self.environments.get(function).cloned().unwrap_or_default();
        let cold = busy >= environments;
        let window = now.as_millis().div_euclid(SCALING_WINDOW.as_millis() as i64);
        let added = added.get(&window).copied().unwrap_or(0.0);
        // A function's scaling is told first: no quota raised would lift it.
        if cold && added + 1.0 > self.scaling {
            Err(Limit::Scaling)
        } else if in_flight as f64 + 1.0 > self.quota {
            Err(Limit::Account)
        } else {
            Ok(cold)
        }
    }

    /// Starts an invocation of `function` at `now`, or throttles it (`None`); returns whether
    /// it starts a new environment. [`Lambda::ran`] says when it ends.
    fn invoke(&mut self, function: &str, now: Timestamp) -> Option<bool> {
        let cold = match self.would_take(function, now) {
            Ok(cold) => cold,
            Err(limit) => {
                self.throttle(now, limit);
                return None;
            }
        };
        if cold {
            let window = now.as_millis().div_euclid(SCALING_WINDOW.as_millis() as i64);
            let (environments, added) = self.environments.entry(function.to_owned()).or_default();
            *environments += 1;
            *added.entry(window).or_default() += 1.0;
            self.cold_starts += 1;
        }
        Some(cold)
    }

    /// Counts an invocation `limit` refused at `now`.
    fn throttle(&mut self, now: Timestamp, limit: Limit) {
        match limit {
            Limit::Account => self.throttled.0 += 1,
            Limit::Scaling => self.throttled.1 += 1,
        }
        self.last_throttled = self.last_throttled.max(Some(now));
    }

    /// The invocation of `function` just started, at `begins`, ends at `ends`.
    fn ran(&mut self, function: &str, begins: Timestamp, ends: Timestamp) {
        let (from, to) = self.measured;
        if begins < to && ends > from {
            self.busy += begins.max(from).until(ends.min(to));
        }
        self.running.entry(function.to_owned()).or_default().push(ends);
        let at_once = self.running.values().map(Vec::len).sum();
        self.peak = self.peak.max(at_once);
        if begins >= self.measured.0 && begins < self.measured.1 {
            self.measured_peak = self.measured_peak.max(at_once);
        }
    }
}

/// What makes Lambda throttle an invocation.
#[derive(Clone, Copy, Debug)]
enum Limit {
    /// Every execution the account may run is running.
    Account,
    /// Its function needs a new environment and has added all it may in this window.
    Scaling,
}

/// The functions, as [`Lambda`] knows them: the scheduler takes both its queues.
const SUBMISSION: &str = "submission";
const SCHEDULER: &str = "scheduler";

fn agent_function(queue: &Destination) -> String {
    format!("agent {}", queue.name())
}

/// Table write units of a state write: one, the finished record's included (with its body
/// deflated, the reference workflow's record, its order in it, stays under 1 KB: 739 bytes at
/// most).
const STATE_WRITE_UNITS: f64 = 1.0;

/// Writes of the `ByCompleteBy` index, which projects the keys and `CreatedAt`: one to add or
/// remove an entry, two to move it (a key change), one to rewrite it in place (`CreatedAt`
/// changed), none when it stays as it is. As `cost-model` counts them.
fn index_units(old: Option<&StateRecord>, new: &StateRecord) -> f64 {
    let key = |r: &StateRecord| r.complete_by.map(|cb| (r.shard, cb));
    match (old.and_then(key), key(new)) {
        (None, None) => 0.0,
        (None, Some(_)) | (Some(_), None) => 1.0,
        (Some(a), Some(b)) if a == b => {
            if old.map(StateRecord::watched_since) == Some(new.watched_since()) { 0.0 } else { 1.0 }
        }
        _ => 2.0,
    }
}

/// The in-memory store behind DynamoDB's write throughput: each caller sees it through its own
/// clock (a worker's, or the world's), and the budgets are shared.
#[derive(Debug)]
struct Throttled {
    inner: Arc<MemoryStore<ManualClock>>,
    clock: ManualClock,
    dynamo: Arc<Mutex<Dynamo>>,
    /// The jitter of the SDK's retries, where the caller's time is modelled; without it a
    /// throttled write fails at once.
    retries: Option<SplitMix>,
}

impl Throttled {
    /// Takes a write's units, retrying as the SDK does; fails as the adapter does.
    fn admit(&self, units: &Units) -> Result<()> {
        let mut tries = 1;
        loop {
            let second = self.clock.now().as_millis().div_euclid(1000);
            let refusal = match self.dynamo.lock().unwrap().take(second, units) {
                Ok(()) => return Ok(()),
                Err(refusal) => refusal,
            };
            match &self.retries {
                Some(jitter) if tries < SDK_ATTEMPTS => {
                    let cap = (SDK_INITIAL_BACKOFF * 2u32.pow(tries - 1)).min(SDK_MAX_BACKOFF);
                    self.clock.advance(cap.mul_f64(jitter.unit()));
                    tries += 1;
                }
                _ => {
                    self.dynamo.lock().unwrap().failed += 1;
                    return Err(Error::unavailable(
                        "dynamodb",
                        format!("ProvisionedThroughputExceededException ({refusal:?})"),
                    ));
                }
            }
        }
    }
}

impl StateStore for Throttled {
    async fn create_order(&self, order: &OrderRecord) -> Result<Created> {
        self.inner.create_order(order).await
    }

    async fn create_state(&self, state: &StateRecord) -> Result<Created> {
        let new = self.inner.peek(state.order_id).is_none();
        let index = if new { index_units(None, state) } else { 0.0 };
        self.admit(&Units { state: STATE_WRITE_UNITS, index, shard: state.shard })?;
        self.inner.create_state(state).await
    }

    async fn load(&self, id: OrderId, read: Read) -> Result<Option<StateRecord>> {
        self.inner.load(id, read).await
    }

    async fn load_order(&self, id: OrderId, read: Read) -> Result<Option<OrderRecord>> {
        self.inner.load_order(id, read).await
    }

    async fn save(&self, next: &StateRecord, expected: Expected) -> Result<Saved> {
        let old = self.inner.peek(next.order_id);
        // A put is billed whether its condition holds or not; the index is written only if
        // it does.
        let holds = old.as_ref().is_some_and(|o| Expected::of(o) == expected);
        let index = if holds { index_units(old.as_ref(), next) } else { 0.0 };
        self.admit(&Units { state: STATE_WRITE_UNITS, index, shard: next.shard })?;
        self.inner.save(next, expected).await
    } // Its workflows have no concurrency key.
    async fn slots(&self, key: &str) -> Result<Slots> {
        self.inner.slots(key).await
    }
    async fn save_slots(&self, next: &Slots) -> Result<Saved> {
        self.inner.save_slots(next).await
    }
    async fn join(&self, key: &str, queued: &Queued) -> Result<()> {
        self.inner.join(key, queued).await
    }
    async fn line(&self, key: &str, limit: usize) -> Result<Vec<Queued>> {
        self.inner.line(key, limit).await
    }
    async fn ahead(&self, key: &str, position: &str) -> Result<u32> {
        self.inner.ahead(key, position).await
    }
    async fn leave(&self, key: &str, queued: &Queued) -> Result<()> {
        self.inner.leave(key, queued).await
    }
    async fn put_page(&self, page: &sas_engine::ports::Page) -> Result<()> {
        self.inner.put_page(page).await
    }
    async fn pages(&self, pass: &str) -> Result<Vec<sas_engine::ports::Page>> {
        self.inner.pages(pass).await
    }
    async fn drop_pages(&self, pass: &str) -> Result<()> {
        self.inner.drop_pages(pass).await
    }
}

impl ExpiryIndex for Throttled {
    async fn due(&self, shard: u16, due_by: Timestamp) -> Result<Vec<IndexEntry>> {
        self.inner.due(shard, due_by).await
    }
}

impl HeldIndex for Throttled {
    async fn held(&self, service: &str, limit: usize) -> Result<Vec<OrderId>> {
        self.inner.held(service, limit).await
    }

    async fn count_held(&self, service: &str) -> Result<u64> {
        self.inner.count_held(service).await
    }
}

/// An outbox whose messages leave when the worker's work ends: sends made on a worker's clock
/// ahead of the world's are delayed by the difference.
#[derive(Clone, Debug)]
struct WorkerOutbox {
    queues: Arc<MemoryQueues<ManualClock>>,
    world: ManualClock,
    worker: ManualClock,
}

impl Outbox for WorkerOutbox {
    async fn send(&self, messages: &[Outgoing]) -> Result<()> {
        let ahead = self.world.now().until(self.worker.now());
        let later: Vec<Outgoing> =
            messages.iter().map(|m| Outgoing { delay: m.delay + ahead, ..m.clone() }).collect();
        self.queues.send(&later).await
    }
}

/// A remote service that answers every call, on the calling lane's clock, after
/// [`agent_batch`].
#[derive(Debug)]
struct Remote {
    inner: Arc<MemoryRemote<ManualClock>>,
    clock: ManualClock,
    /// Messages in the batch of the call's lane.
    batch: Arc<AtomicUsize>,
}

impl RemoteService for Remote {
    async fn call(&self, call: &RemoteCall) -> std::result::Result<serde_json::Value, RemoteFault> {
        self.clock.advance(agent_batch(self.batch.load(Ordering::Relaxed)));
        self.inner.call(call).await
    }
}

/// API Gateway's throttling of one route: a bucket of `burst` tokens, refilled at `rate` a
/// second.
#[derive(Debug)]
struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Timestamp,
}

impl TokenBucket {
    fn take(&mut self, now: Timestamp) -> bool {
        let refill = self.at.until(now).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + refill).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

type Store = Arc<Throttled>;
type Queues = Arc<MemoryQueues<ManualClock>>;
type Bus = Arc<MemoryBus>;
type Waits = Arc<MemoryWaits>;
type Load = Gauges<Waits, Queues>;
type Book = Arc<MemoryServiceBook>;

/// One concurrent batch of the scheduler's mapping.
struct SchedulerWorker {
    clock: ManualClock,
    busy_until: Timestamp,
    outbox: WorkerOutbox,
    scheduler: Scheduler<Store, WorkerOutbox, Bus, ManualClock, Waits>,
}

/// One concurrent batch of an agent's mapping: a lane for each message of the batch, each
/// calling the service at once.
struct AgentWorker {
    busy_until: Timestamp,
    batch: Arc<AtomicUsize>,
    lanes: Vec<Lane>,
}

struct Lane {
    clock: ManualClock,
    outbox: WorkerOutbox,
    agent: Agent<Arc<Remote>, WorkerOutbox, ManualClock, SplitMix, Waits, Book>,
}

/// What the consumers met.
#[derive(Debug, Default)]
struct Handling {
    /// Messages whose handling failed for a passing cause: left for redelivery, or sent again.
    failed: u64,
    requeued: u64,
    /// Messages refused as never workable, and inputs a correct system never sends.
    poison: u64,
    illegal: u64,
}

/// What a run measured.
#[derive(Debug, Default)]
struct Outcome {
    offered: usize,
    accepted: usize,
    processed: usize,
    other_ends: Vec<(OrderId, ProcessState)>,
    refused_api: u64,
    /// Submissions Lambda throttled: API Gateway answers 500.
    refused_lambda: u64,
    refused_door: u64,
    refused_throttled: u64,
    /// With neighbours, the door's refusals of the quiet tenants' orders.
    refused_others: u64,
    /// Orders ended per second over the measured window.
    goodput: f64,
    /// Accepted to ended, and first try to ended (the client's wait), p50 and p95.
    to_end: (Duration, Duration),
    client_wait: (Duration, Duration),
    /// With neighbours, the same for the bulk tenant's orders and for the others'.
    bulk_wait: (Duration, Duration),
    quiet_wait: (Duration, Duration),
    /// Orders accepted in the first minute.
    first_minute: usize,
    resets: usize,
    handling: Handling,
    dead_letters: usize,
    /// DynamoDB: units taken per order (state table, index), the busiest second of each
    /// budget against its quota, tries refused by what, writes failed after every try.
    units_per_order: (f64, f64),
    peak: (f64, f64, f64),
    refused_writes: BTreeMap<Refusal, u64>,
    failed_writes: u64,
    /// Lambda: the most executions at once; at the busiest and on average over the measured
    /// window; cold starts, invocations throttled, and how long into the run the last was.
    executions: usize,
    measured_executions: usize,
    mean_executions: f64,
    cold_starts: u64,
    invocations_throttled: (u64, u64),
    throttled_until: Option<Duration>,
    lasted: Duration,
}

/// How a run's stack stands when its orders begin, and how they come.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Start {
    /// Rising traffic: its first minute brings a fifth of the rate; its mappings and
    /// functions scale from the first message, as a new stack's do.
    Rising,
    /// Nothing running: each mapping at its first 5 batches, no execution environment, and
    /// the whole rate from the first second.
    Cold,
    /// In full use already: every mapping scaled up, an environment for each of its batches
    /// and for the submissions, and the whole rate from the first second.
    Warm,
}

impl Start {
    fn name(self) -> &'static str {
        match self {
            Start::Rising => "rising",
            Start::Cold => "cold",
            Start::Warm => "warm",
        }
    }
}

struct World {
    seed: u64,
    stack: Stack,
    /// Arrivals, as a multiple of the stated ceiling.
    factor: f64,
    from: Start,
    lambda: Lambda,
    clock: ManualClock,
    start: Timestamp,
    memory: InMemory<ManualClock>,
    dynamo: Arc<Mutex<Dynamo>>,
    submission: Submission<Store, Queues, Bus, ManualClock, SeqIds, Load>,
    supervisor: Supervisor<Store, Store, Queues, Bus, ManualClock, Load>,
    book: Book,
    schedulers: Vec<(Destination, Vec<SchedulerWorker>)>,
    agents: Vec<(Destination, Vec<AgentWorker>)>,
    destinations: Vec<Destination>,
    handling: Handling,
    rng: SplitMix,
    /// Tenants sharing the stack, instead of one client sending at `factor` times the ceiling.
    neighbours: Option<Neighbours>,
    /// Since when each queue's mapping has been gathering a batch it has not filled.
    gathering: HashMap<Destination, Timestamp>,
}

/// One tenant's burst among tenants sending a few orders a second each.
#[derive(Clone, Copy, Debug)]
struct Neighbours {
    /// Orders the bulk tenant sends, from [`BULK_FROM`], as fast as the route takes them.
    bulk: usize,
    /// Tenants sending one order a second each, for [`QUIET_FOR`].
    quiet: usize,
}

/// When the bulk tenant starts, and how fast it sends: nine tenths of what the route takes,
/// above what the stack finishes, so that a backlog builds in the queues and none at the route.
const BULK_FROM: Duration = Duration::from_secs(5);
const BULK_SHARE_OF_ROUTE: f64 = 0.9;
const QUIET_FOR: Duration = Duration::from_secs(60);

impl World {
    fn new(stack: Stack, factor: f64, from: Start, seed: u64) -> World {
        World::build(stack, factor, from, seed, stack.config())
    }

    /// `neighbours` on `stack`, its queues fair or not.
    fn neighbours(stack: Stack, neighbours: Neighbours, fair: bool, seed: u64) -> World {
        let config = EngineConfig { fair_queues: fair, ..stack.config() };
        let world = World::build(stack, 1.0, Start::Rising, seed, config);
        World { neighbours: Some(neighbours), ..world }
    }

    fn build(stack: Stack, factor: f64, from: Start, seed: u64, config: EngineConfig) -> World {
        let clock = ManualClock::default();
        let start = clock.now();
        let memory = InMemory::new(clock.clone());
        let dynamo = Arc::new(Mutex::new(Dynamo::new(stack.quotas(), stack.placement())));
        let throttled = |clock: ManualClock, retries: Option<SplitMix>| {
            Arc::new(Throttled {
                inner: memory.store.clone(),
                clock,
                dynamo: dynamo.clone(),
                retries,
            })
        };
        let json = sas_workflows::order_fulfilment();
        let workflow = Workflow::from_json(json, &Workflow::agents_in(json)).unwrap();
        // The submission and the supervisor run on the world's clock: a throttled write of
        // theirs fails at once.
        let system = Assembly {
            store: throttled(clock.clone(), None),
            bus: memory.bus.clone(),
            clock: clock.clone(),
            config: Arc::new(config),
            catalogue: Arc::new(Catalogue::single(workflow)),
            waits: memory.waits.clone(),
            load: memory.load(),
            payloads: NoPayloads,
        };
        let queues = &memory.queues;
        for destination in system.destinations() {
            let visibility_timeout = match destination {
                Destination::Agent(_) => AGENT_VISIBILITY,
                _ => SCHEDULER_VISIBILITY,
            };
            let settings =
                QueueSettings { visibility_timeout, max_receive_count: Some(MAX_RECEIVES) };
            queues.configure(&destination, settings);
        }
        let mut draws = 0u64;
        let mut worker = || {
            draws += 1;
            let own = ManualClock::at(start);
            let outbox =
                WorkerOutbox { queues: queues.clone(), world: clock.clone(), worker: own.clone() };
            let jitter = SplitMix::seeded(seed.wrapping_mul(1_000_003).wrapping_add(draws));
            let system = Assembly {
                store: throttled(own.clone(), Some(jitter)),
                ..system.on_clock(own.clone())
            };
            (system, outbox, own, draws)
        };
        let mut schedulers = Vec::new();
        for queue in [Destination::Scheduler, Destination::Replies] {
            let workers: Vec<SchedulerWorker> = (0..stack.workers())
                .map(|n| {
                    let (system, outbox, clock, _) = worker();
                    let owner = format!("scheduler-{}-{n}", queue.name());
                    SchedulerWorker {
                        clock,
                        busy_until: start,
                        scheduler: system.scheduler(outbox.clone(), owner),
                        outbox,
                    }
                })
                .collect();
            schedulers.push((queue, workers));
        }
        let book = Book::default();
        let mut agents = Vec::new();
        for name in system.catalogue.agents() {
            let workers: Vec<AgentWorker> = (0..stack.workers())
                .map(|n| {
                    let batch = Arc::new(AtomicUsize::new(BATCH));
                    AgentWorker {
                        busy_until: start,
                        batch: batch.clone(),
                        lanes: (0..BATCH)
                            .map(|lane| {
                                let (system, outbox, clock, draw) = worker();
                                let remote = Arc::new(Remote {
                                    inner: memory.remote.clone(),
                                    clock: clock.clone(),
                                    batch: batch.clone(),
                                });
                                let random =
                                    SplitMix::seeded(seed ^ draw.wrapping_mul(0x9e37_79b9));
                                let agent = system
                                    .agent(
                                        &name,
                                        remote,
                                        outbox.clone(),
                                        random,
                                        format!("agent-{name}-{n}-{lane}"),
                                    )
                                    .guarded(book.clone(), name.as_str(), system.config.hold);
                                Lane { clock, outbox, agent }
                            })
                            .collect(),
                    }
                })
                .collect();
            agents.push((Destination::Agent(name), workers));
        }
        let mut lambda = Lambda::new(&stack, start);
        if from == Start::Warm {
            let submissions =
                factor * stack.modelled_ceiling() * submission_invocation().as_secs_f64();
            lambda.warmed(SUBMISSION, (2.0 * submissions).ceil() as usize);
            lambda.warmed(SCHEDULER, schedulers.iter().map(|(_, w)| w.len()).sum());
            for (queue, workers) in &agents {
                lambda.warmed(&agent_function(queue), workers.len());
            }
        }
        World {
            seed,
            stack,
            factor,
            from,
            lambda,
            start,
            submission: system.submission(queues.clone(), SeqIds::new("c")),
            supervisor: system.supervisor(queues.clone()),
            destinations: system.destinations(),
            clock,
            memory,
            dynamo,
            book,
            schedulers,
            agents,
            handling: Handling::default(),
            rng: SplitMix::seeded(seed),
            neighbours: None,
            gathering: HashMap::new(),
        }
    }

    fn elapsed(&self) -> Duration {
        self.start.until(self.clock.now())
    }

    /// Deletes a message whose handling is over; leaves one that failed for a passing cause to
    /// come back, or, from its third receive on, sends it again as a new message; counts one
    /// that can never be handled (it goes on to the dead letters).
    async fn settle(
        &mut self,
        queue: &Destination,
        d: &Delivery,
        handled: Result<()>,
        outbox: &WorkerOutbox,
    ) {
        match handled {
            Ok(()) => self.memory.queues.delete(queue, &d.receipt).unwrap(),
            Err(e) if e.is_retryable() => {
                self.handling.failed += 1;
                if d.receive_count >= REQUEUE_FROM_RECEIVE {
                    let message = Message::decode(&d.body).unwrap();
                    let again =
                        Outgoing::again(queue.clone(), message, REQUEUE_DELAY, d.identity());
                    if outbox.send(&[again]).await.is_ok() {
                        self.handling.requeued += 1;
                        self.memory.queues.delete(queue, &d.receipt).unwrap();
                    }
                }
            }
            Err(e) => {
                eprintln!("seed {}: a message can never be handled: {e}", self.seed);
                self.handling.poison += 1;
            }
        }
    }

    /// Lets every worker of every mapping take batches until the next tick, each batch as soon
    /// as the worker is free and its queue holds messages.
    async fn work(&mut self) {
        let now = self.clock.now();
        let next_tick = now.plus(TICK);
        let active = match self.from {
            Start::Warm => self.stack.workers(),
            Start::Rising | Start::Cold => self.stack.workers_at(self.elapsed()),
        };
        for q in 0..self.schedulers.len() {
            loop {
                let (queue, workers) = &self.schedulers[q];
                let queue = queue.clone();
                let Some(i) = first_free(workers[..active].iter().map(|w| w.busy_until), next_tick)
                else {
                    break;
                };
                let begins = self.schedulers[q].1[i].busy_until.max(now);
                if !self.batch_ready(&queue, now) {
                    break;
                }
                // A throttled invocation leaves its messages in the queue for a later try.
                if let Err(limit) = self.lambda.would_take(SCHEDULER, begins) {
                    self.throttled(begins, limit);
                    break;
                }
                let batch = self.memory.queues.receive(&queue, BATCH);
                if batch.is_empty() {
                    break;
                }
                let mut lasts = scheduler_batch(batch.len());
                if self.lambda.invoke(SCHEDULER, begins) == Some(true) {
                    lasts += cold_start("scheduler", SCHEDULER_MEMORY_MB);
                }
                let w = &self.schedulers[q].1[i];
                // The batch's effects happen when its work ends.
                w.clock.set(begins.plus(lasts));
                let outbox = w.outbox.clone();
                for d in &batch {
                    let message = Message::decode(&d.body).unwrap();
                    let incoming =
                        Incoming { message_id: d.identity(), receive_count: d.receive_count };
                    let handled =
                        self.schedulers[q].1[i].scheduler.handle(&message, incoming).await;
                    if let Ok(Handled::Illegal(why)) = &handled {
                        eprintln!("seed {}: illegal input: {why:?}", self.seed);
                        self.handling.illegal += 1;
                    }
                    self.settle(&queue, d, handled.map(|_| ()), &outbox).await;
                }
                // A throttled write's retries keep the batch going.
                let w = &mut self.schedulers[q].1[i];
                w.busy_until = w.clock.now();
                self.lambda.ran(SCHEDULER, begins, w.busy_until);
            }
        }
        for a in 0..self.agents.len() {
            loop {
                let (queue, workers) = &self.agents[a];
                let queue = queue.clone();
                let Some(i) = first_free(workers[..active].iter().map(|w| w.busy_until), next_tick)
                else {
                    break;
                };
                let function = agent_function(&queue);
                let begins = self.agents[a].1[i].busy_until.max(now);
                if !self.batch_ready(&queue, now) {
                    break;
                }
                if let Err(limit) = self.lambda.would_take(&function, begins) {
                    self.throttled(begins, limit);
                    break;
                }
                let batch = self.memory.queues.receive(&queue, BATCH);
                if batch.is_empty() {
                    break;
                }
                self.agents[a].1[i].batch.store(batch.len(), Ordering::Relaxed);
                let invoked = begins;
                let cold = self.lambda.invoke(&function, invoked) == Some(true);
                // A new environment starts before the batch's calls are made.
                let begins =
                    if cold { begins.plus(cold_start("agent", AGENT_MEMORY_MB)) } else { begins };
                let mut ends = begins.plus(Duration::from_millis(1));
                for (lane, d) in batch.iter().enumerate() {
                    let Message::Request(request) = Message::decode(&d.body).unwrap() else {
                        panic!("seed {}: a request queue held something else", self.seed)
                    };
                    let incoming =
                        Incoming { message_id: d.identity(), receive_count: d.receive_count };
                    let l = &self.agents[a].1[i].lanes[lane];
                    l.clock.set(begins);
                    let handled = l.agent.handle(&request, incoming).await;
                    let (lane_ends, outbox) = (l.clock.now(), l.outbox.clone());
                    ends = ends.max(lane_ends);
                    self.settle(&queue, d, handled.map(|_| ()), &outbox).await;
                }
                self.agents[a].1[i].busy_until = ends;
                self.lambda.ran(&function, invoked, ends);
            }
        }
    }

    /// Whether `queue`'s mapping has a batch to hand its function at `now`: a full one, or
    /// whatever its window gathered once the window is over.
    fn batch_ready(&mut self, queue: &Destination, now: Timestamp) -> bool {
        let visible = self.memory.queues.visible_len(queue);
        if visible == 0 {
            self.gathering.remove(queue);
            return false;
        }
        if visible >= BATCH {
            return true;
        }
        let since = *self.gathering.entry(queue.clone()).or_insert(now);
        if since.plus(BATCHING_WINDOW) > now {
            return false;
        }
        self.gathering.remove(queue);
        true
    }

    /// Counts an invocation the mapping could not make: it backs off, and tries again at the
    /// next tick. Always true.
    fn throttled(&mut self, at: Timestamp, limit: Limit) -> bool {
        self.lambda.throttle(at, limit);
        true
    }

    /// Whether every queue is empty and every order ended.
    fn quiet(&self) -> bool {
        self.destinations.iter().all(|d| self.memory.queues.len(d) == 0)
            && self
                .memory
                .store
                .records()
                .iter()
                .all(|r| r.is_terminal() && r.complete_by.is_none())
    }

    async fn run(&mut self) -> Outcome {
        let mut out = Outcome::default();
        let (factor, ceiling) = (self.factor, self.stack.modelled_ceiling());
        let rising = self.from == Start::Rising;
        let rate = |t: Duration| {
            let warming = rising && t < WARM_UP;
            if warming { WARM_UP_SHARE * ceiling } else { factor * ceiling }
        };
        let mut api = TokenBucket {
            rate: self.stack.api_rate / self.stack.k(),
            burst: self.stack.api_burst / self.stack.k(),
            tokens: self.stack.api_burst / self.stack.k(),
            at: self.start,
        };
        let mut owed = 0.0;
        // With neighbours: what each tenant is owed, and has sent.
        let mut tenants: Vec<(Owner, f64, usize)> = Vec::new();
        if let Some(n) = self.neighbours {
            let owner = |name: String| {
                (Owner::iam(&format!("arn:aws:iam::123456789012:user/{name}")).unwrap(), 0.0, 0)
            };
            tenants.push(owner("bulk".into()));
            tenants.extend((0..n.quiet).map(|q| owner(format!("quiet-{q}"))));
        }
        // Each client's tenant, with neighbours; and each order's, once accepted.
        let mut tenant_of: Vec<usize> = Vec::new();
        let mut order_tenant: HashMap<OrderId, usize> = HashMap::new();
        let most = |n: Neighbours, tenant: usize| {
            if tenant == 0 { n.bulk } else { QUIET_FOR.as_secs() as usize }
        };
        // Each client's first try, its 429s so far, and when it tries next.
        let mut first_try: Vec<Timestamp> = Vec::new();
        let mut throttled: Vec<u32> = Vec::new();
        let mut waiting: BinaryHeap<Reverse<(Timestamp, usize)>> = BinaryHeap::new();
        let mut accepted_at: HashMap<OrderId, Timestamp> = HashMap::new();
        let mut next_sweep = self.start.plus(SWEEP_EVERY);
        let limit = Duration::from_secs(1800);
        loop {
            self.clock.advance(TICK);
            let now = self.clock.now();
            let t = self.elapsed();
            assert!(t < limit, "seed {}: orders still in flight after 30 minutes", self.seed);
            let mut due: Vec<usize> = Vec::new();
            if let Some(n) = self.neighbours {
                let route = self.stack.api_rate / self.stack.k();
                for (tenant, (_, owed, sent)) in tenants.iter_mut().enumerate() {
                    let (rate, from) = match tenant {
                        0 => (BULK_SHARE_OF_ROUTE * route, BULK_FROM),
                        _ => (1.0, Duration::ZERO),
                    };
                    if t < from {
                        continue;
                    }
                    *owed += rate * TICK.as_secs_f64();
                    while *owed >= 1.0 && *sent < most(n, tenant) {
                        *owed -= 1.0;
                        *sent += 1;
                        due.push(first_try.len());
                        first_try.push(now);
                        throttled.push(0);
                        tenant_of.push(tenant);
                    }
                }
            } else if t <= ARRIVALS_FOR {
                owed += rate(t) * TICK.as_secs_f64();
                while owed >= 1.0 {
                    owed -= 1.0;
                    due.push(first_try.len());
                    first_try.push(now);
                    throttled.push(0);
                }
            }
            while waiting.peek().is_some_and(|Reverse((at, _))| *at <= now) {
                due.push(waiting.pop().unwrap().0.1);
            }
            let arrivals = due.len();
            for (n, i) in due.into_iter().enumerate() {
                let later = |after: Duration, rng: &SplitMix| {
                    Reverse((now.plus(after.mul_f64(1.0 + 0.2 * rng.unit())), i))
                };
                // The tick's requests come one after another over it, not all at its start.
                let arrives = now.plus(TICK.mul_f64(n as f64 / arrivals as f64));
                // API Gateway's 429, or Lambda's throttling of the submission (a 500): the
                // client backs off and tries again.
                let invoked = api.take(now).then(|| self.lambda.invoke(SUBMISSION, arrives));
                let Some(Some(cold)) = invoked else {
                    match invoked {
                        None => out.refused_api += 1,
                        Some(_) => out.refused_lambda += 1,
                    }
                    throttled[i] += 1;
                    let backoff = Duration::from_secs(1 << (throttled[i] - 1).min(5));
                    waiting.push(later(backoff.min(CLIENT_MAX_BACKOFF), &self.rng));
                    continue;
                };
                let lasts = submission_invocation()
                    + if cold {
                        cold_start("submission", SUBMISSION_MEMORY_MB)
                    } else {
                        Duration::ZERO
                    };
                self.lambda.ran(SUBMISSION, arrives, arrives.plus(lasts));
                let key = format!("limits-{i}");
                let owner =
                    tenant_of.get(i).map_or_else(Owner::anonymous, |t| tenants[*t].0.clone());
                match self.submission.submit_as(&owner, &key, order_body(i).as_bytes()).await {
                    Ok(a) => {
                        accepted_at.entry(a.order_id).or_insert(first_try[i]);
                        if let Some(t) = tenant_of.get(i) {
                            order_tenant.insert(a.order_id, *t);
                        }
                    }
                    Err(Error::Overloaded { retry_after, .. }) => {
                        out.refused_door += 1;
                        out.refused_others += u64::from(tenant_of.get(i).is_some_and(|t| *t != 0));
                        waiting.push(later(retry_after, &self.rng));
                    }
                    Err(e) if e.is_retryable() => {
                        out.refused_throttled += 1;
                        waiting.push(later(Duration::from_secs(1), &self.rng));
                    }
                    Err(e) => panic!("seed {}: submission failed: {e}", self.seed),
                }
            }
            self.work().await;
            if now >= next_sweep {
                self.supervisor.sweep().await.unwrap();
                self.supervisor.tend(&self.book, true).await.unwrap();
                next_sweep = next_sweep.plus(SWEEP_EVERY);
            }
            let whole_second = t.as_millis() % 1000 == 0;
            let arriving = match self.neighbours {
                Some(n) => tenants.iter().enumerate().any(|(i, (_, _, sent))| *sent < most(n, i)),
                None => t <= ARRIVALS_FOR,
            };
            if !arriving && waiting.is_empty() && whole_second && self.quiet() {
                break;
            }
        }
        out.lasted = self.elapsed();
        out.offered = first_try.len();
        self.outcome(out, &accepted_at, &order_tenant)
    }

    fn outcome(
        &mut self,
        mut out: Outcome,
        first_try: &HashMap<OrderId, Timestamp>,
        tenant_of: &HashMap<OrderId, usize>,
    ) -> Outcome {
        let mut by_tenant: [Vec<Duration>; 2] = Default::default();
        let records = self.memory.store.records();
        let (from, to) = (self.start.plus(MEASURED_FROM), self.start.plus(ARRIVALS_FOR));
        let mut to_end = Vec::new();
        let mut client_wait = Vec::new();
        let mut ended_in_window = 0;
        for r in &records {
            out.accepted += 1;
            out.first_minute += usize::from(r.created_at < self.start.plus(FIRST_MINUTE));
            match r.process_state {
                ProcessState::Processed => out.processed += 1,
                other => out.other_ends.push((r.order_id, other)),
            }
            out.resets += r.timeline.iter().filter(|e| e.what == Happening::RetryScheduled).count();
            if let Some(ended) = r.ended_at {
                to_end.push(r.created_at.until(ended));
                if let Some(tried) = first_try.get(&r.order_id) {
                    client_wait.push(tried.until(ended));
                    if let Some(t) = tenant_of.get(&r.order_id) {
                        by_tenant[usize::from(*t != 0)].push(tried.until(ended));
                    }
                }
                ended_in_window += usize::from(ended >= from && ended < to);
            }
        }
        out.goodput = ended_in_window as f64 / from.until(to).as_secs_f64();
        out.to_end = percentiles(&mut to_end);
        out.client_wait = percentiles(&mut client_wait);
        out.bulk_wait = percentiles(&mut by_tenant[0]);
        out.quiet_wait = percentiles(&mut by_tenant[1]);
        out.handling = std::mem::take(&mut self.handling);
        out.dead_letters =
            self.destinations.iter().map(|d| self.memory.queues.dead_letters(d).len()).sum();
        let dynamo = self.dynamo.lock().unwrap();
        let n = out.accepted.max(1) as f64;
        out.units_per_order = (dynamo.taken.state / n, dynamo.taken.index / n);
        out.peak = dynamo.peak;
        out.refused_writes = dynamo.refused.clone();
        out.failed_writes = dynamo.failed;
        out.executions = self.lambda.peak;
        out.measured_executions = self.lambda.measured_peak;
        out.throttled_until = self.lambda.last_throttled.map(|t| self.start.until(t));
        out.mean_executions =
            self.lambda.busy.as_secs_f64() / (ARRIVALS_FOR - MEASURED_FROM).as_secs_f64();
        out.cold_starts = self.lambda.cold_starts;
        out.invocations_throttled = self.lambda.throttled;
        assert!(
            self.memory.remote.max_applications() <= 1,
            "seed {}: an effect applied twice",
            self.seed
        );
        out
    }
}

fn percentiles(all: &mut [Duration]) -> (Duration, Duration) {
    all.sort_unstable();
    let at = |p: f64| {
        all.get(((all.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or_default()
    };
    (at(0.5), at(0.95))
}

fn order_body(i: usize) -> String {
    format!(
        r#"{{"customer_id":"c-{i}","currency":"EUR","items":[{{"sku":"SKU-{n}","quantity":1,"unit_price":100}}],
            "ship_to":{{"name":"N","line1":"L","city":"C","postal_code":"1","country":"FR"}}}}"#,
        n = i % 7
    )
}

fn seed() -> u64 {
    std::env::var("SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(1)
}

/// Runs `stack` at `factor` times its ceiling, prints a row of figures, and returns what
/// failed to hold.
async fn measure(stack: Stack, factor: f64, from: Start) -> Vec<String> {
    let seed = seed();
    let out = World::new(stack, factor, from, seed).run().await;
    let ceiling = stack.modelled_ceiling();
    // What the stack is sent, or its ceiling if less: what it should finish.
    let owed = factor.min(1.0) * ceiling;
    let sent_at = stack.stated_ceiling * factor;
    let k = stack.k();
    let secs = |d: Duration| d.as_secs_f64();
    let refused: Vec<String> =
        out.refused_writes.iter().map(|(what, n)| format!("{n} {what:?}")).collect();
    let q = stack.quotas();
    println!(
        "| {} (1/{}) | {sent_at:.0} ({factor:.2}x), {} | {} | {} | {:.0} | {} | {} | {} / {} / {} / {} | {:.0} ({:.0} %) | {:.1} s / {:.1} s | {:.1} s / {:.1} s | {:.2} / {:.2} | {:.0} of {:.0} / {:.0} of {:.0} / {:.0} of {:.0} | {} ({} failed) | {:.0} of {:.0} / {:.0} / {:.0} ({:.3} an order a second) / {:.0} / {:.0} / {:.0}{} | {} / {} | {} | {} | {} s |",
        stack.name,
        stack.scale,
        from.name(),
        out.offered,
        out.accepted,
        out.first_minute as f64 / FIRST_MINUTE.as_secs_f64() * k,
        out.processed,
        out.other_ends.len(),
        out.refused_api,
        out.refused_lambda,
        out.refused_door,
        out.refused_throttled,
        out.goodput * k,
        100.0 * out.goodput / ceiling,
        secs(out.to_end.0),
        secs(out.to_end.1),
        secs(out.client_wait.0),
        secs(out.client_wait.1),
        out.units_per_order.0,
        out.units_per_order.1,
        out.peak.0 * k,
        q.state_table * k,
        out.peak.1 * k,
        q.index * k,
        out.peak.2 * k,
        q.partition * k,
        if refused.is_empty() { "none".to_owned() } else { refused.join(", ") },
        out.failed_writes,
        out.executions as f64 * k,
        ACCOUNT_CONCURRENCY,
        out.measured_executions as f64 * k,
        out.mean_executions * k,
        out.mean_executions / owed,
        out.cold_starts as f64 * k,
        out.invocations_throttled.0 as f64 * k,
        out.invocations_throttled.1 as f64 * k,
        out.throttled_until
            .map_or_else(String::new, |t| format!(" (the last at {} s)", t.as_secs())),
        out.handling.failed,
        out.handling.requeued,
        out.resets,
        out.dead_letters + out.handling.poison as usize,
        out.lasted.as_secs(),
    );
    let mut problems = Vec::new();
    let mut check = |holds: bool, what: String| {
        if !holds {
            problems.push(format!("{} at {factor}x (seed {seed}): {what}", stack.name));
        }
    };
    check(
        out.goodput >= MIN_GOODPUT * owed,
        format!(
            "orders finished at {:.0} a second, {:.0} % of the {:.0} owed",
            out.goodput * k,
            100.0 * out.goodput / owed,
            owed * k
        ),
    );
    check(
        out.accepted == out.offered,
        format!(
            "{} of {} orders sent were never accepted",
            out.offered - out.accepted,
            out.offered
        ),
    );
    check(
        out.processed == out.accepted,
        format!(
            "{} of {} orders accepted did not end Processed, e.g. {:?}",
            out.accepted - out.processed,
            out.accepted,
            &out.other_ends[..out.other_ends.len().min(3)]
        ),
    );
    check(
        out.dead_letters == 0 && out.handling.poison == 0,
        format!("{} dead letters, {} poison", out.dead_letters, out.handling.poison),
    );
    check(out.handling.illegal == 0, format!("{} illegal inputs", out.handling.illegal));
    check(
        out.to_end.1 <= MAX_QUEUE_WAIT,
        format!(
            "95 % of the orders took up to {:.1} s from acceptance to their end, more than the {} s the door allows",
            out.to_end.1.as_secs_f64(),
            MAX_QUEUE_WAIT.as_secs()
        ),
    );
    if sent_at <= f64::from(stack.expected_rate) + 0.5 {
        // Once the environments are up: a cold stack's first seconds are judged below.
        check(
            out.measured_executions as f64 * k * (1.0 + HEADROOM) <= ACCOUNT_CONCURRENCY,
            format!(
                "{:.0} executions at once over the last minute, within {:.0} % of the account's {ACCOUNT_CONCURRENCY}",
                out.measured_executions as f64 * k,
                100.0 * HEADROOM
            ),
        );
        check(
            out.throttled_until.is_none_or(|t| t <= COLD_SURGE),
            format!("Lambda throttled invocations until {:?} into the run", out.throttled_until),
        );
    }
    if factor > 1.0 {
        check(
            out.refused_api + out.refused_door > 0,
            "nothing was refused: the arrivals were not above what the stack takes".into(),
        );
    }
    problems
}

/// The worker that is free soonest, if any is free before `next_tick`.
fn first_free(busy_until: impl Iterator<Item = Timestamp>, next_tick: Timestamp) -> Option<usize> {
    busy_until.enumerate().filter(|(_, b)| *b < next_tick).min_by_key(|(_, b)| *b).map(|(i, _)| i)
}

fn header() {
    println!(
        "| stack (scale) | sent at (of the ceiling), start | orders sent | accepted | accepted a second in the first minute | processed | other ends | refused: 429 / 500 Lambda throttled / 503 door / 503 throttled | goodput a second (of the ceiling) | accepted to end, p50 / p95 | first try to end, p50 / p95 | write units per order: table / index | busiest second: StateTable / ByCompleteBy / its busiest partition | tries throttled (writes failed) | Lambda: executions at once: busiest / busiest over the last minute / on average over it (per order a second); cold starts / invocations throttled: by the account's quota / by a function's scaling | handlings failed / sent again | supervisor resets | dead letters | lasted |"
    );
    println!(
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- | --- | --- | --- | --- | --- | --- | ---: | ---: | ---: |"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn one_stack_takes_its_stated_ceiling_and_sheds_twice_it_without_failing_an_order() {
    header();
    let mut problems = Vec::new();
    for stack in [DEFAULTS, LARGE] {
        for (factor, from) in [(1.0, Start::Rising), (2.0, Start::Cold)] {
            problems.extend(measure(stack, factor, from).await);
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The large set at the rate it declares, started cold and warm: every order finished, and
/// the account's executions never within [`HEADROOM`] of its quota.
#[tokio::test(flavor = "current_thread")]
async fn the_large_set_takes_its_declared_rate_from_cold_and_warm() {
    header();
    let mut problems = Vec::new();
    let factor = f64::from(LARGE.expected_rate) / LARGE.stated_ceiling;
    for from in [Start::Cold, Start::Warm] {
        problems.extend(measure(LARGE, factor, from).await);
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// How much slower the quiet tenants' orders may be with a neighbour's burst than alone.
const NEIGHBOUR_SLOWDOWN: f64 = 1.5;

#[tokio::test(flavor = "current_thread")]
async fn a_tenant_s_burst_slows_its_own_orders_not_the_other_tenants() {
    let seed = seed();
    let stack = DEFAULTS;
    let quiet = Neighbours { bulk: 0, quiet: 4 };
    let noisy = Neighbours { bulk: 3_000, quiet: 4 };
    println!(
        "| {} stack | bulk tenant's orders | fair queues | others' orders, p50 / p95 | bulk's orders, p50 / p95 | refused: 429 / 503 door (the others') | processed | lasted |",
        stack.name
    );
    println!("| --- | ---: | --- | --- | --- | --- | ---: | ---: |");
    let mut runs = Vec::new();
    for (neighbours, fair) in [(quiet, true), (noisy, true), (noisy, false)] {
        let out = World::neighbours(stack, neighbours, fair, seed).run().await;
        let secs = |d: Duration| d.as_secs_f64();
        println!(
            "| seed {seed} | {} | {} | {:.1} s / {:.1} s | {} | {} / {} ({}) | {} of {} | {} s |",
            neighbours.bulk,
            if fair { "on" } else { "off" },
            secs(out.quiet_wait.0),
            secs(out.quiet_wait.1),
            if neighbours.bulk == 0 {
                "-".to_owned()
            } else {
                format!("{:.1} s / {:.1} s", secs(out.bulk_wait.0), secs(out.bulk_wait.1))
            },
            out.refused_api,
            out.refused_door,
            out.refused_others,
            out.processed,
            out.accepted,
            out.lasted.as_secs(),
        );
        assert_eq!(out.accepted, out.offered, "seed {seed}: every order sent is accepted");
        assert_eq!(out.processed, out.accepted, "seed {seed}: {:?}", &out.other_ends);
        runs.push(out);
    }
    let (alone, fair, unfair) = (&runs[0], &runs[1], &runs[2]);
    let bound = alone.quiet_wait.1.mul_f64(NEIGHBOUR_SLOWDOWN);
    assert!(
        fair.quiet_wait.1 <= bound,
        "seed {seed}: with fair queues the others' p95 is {:?}, more than {NEIGHBOUR_SLOWDOWN} times \
         the {:?} they get alone",
        fair.quiet_wait.1,
        alone.quiet_wait.1
    );
    // The burst does make a backlog: without fair queues the others wait behind it.
    assert!(
        unfair.quiet_wait.1 > bound,
        "seed {seed}: the burst made no backlog the others could wait behind: {:?}",
        unfair.quiet_wait
    );
    assert!(fair.bulk_wait.1 > fair.quiet_wait.1, "the bulk waits behind its own burst");
    assert_eq!(fair.refused_others, 0, "seed {seed}: the door turned the others away");
}

#[test]
fn the_restated_quotas_give_the_ceilings_cost_model_states() {
    let (bound, ceiling) = DEFAULTS.ceiling();
    assert_eq!(bound, "an agent's queue");
    assert!((ceiling - DEFAULTS.stated_ceiling).abs() < 0.5, "{ceiling}");
    let (bound, ceiling) = LARGE.ceiling();
    assert_eq!(bound, "ByCompleteBy, its busiest partition");
    assert!((ceiling - LARGE.stated_ceiling).abs() < 0.5, "{ceiling}");
    // Pre-warmed for 2,000 orders a second, the index takes twice the route's 3,000, and its
    // busiest partition (22 of the 128 shards on one of 12) a little less than the route.
    let of = |name: &str| LARGE.limits().into_iter().find(|l| l.0 == name).unwrap().1;
    assert!((of("ByCompleteBy") - 6_000.0).abs() < 1e-9);
    assert!((of("ByCompleteBy, its busiest partition") - 128_000.0 / 22.0 / 2.0).abs() < 1e-9);
    // As `cost-model` states it: 0.174 executions an order a second, about 5,758 orders a second.
    let lambda = of("Lambda, the account's concurrent executions");
    assert!((lambda - 5_758.0).abs() < 30.0, "{lambda}");
    let placement = LARGE.placement();
    assert_eq!(placement.iter().filter(|&&p| p == 0).count(), 22);
    assert!((1..12).all(|p| placement.iter().filter(|&&q| q == p).count() <= 10));
    // The scaled-down model keeps whole workers and the shards of the full-size stack.
    assert_eq!((LARGE.workers(), LARGE.config().index_shards), (5, INDEX_SHARDS));
    assert_eq!(
        (LARGE.workers_at(Duration::ZERO), LARGE.workers_at(Duration::from_secs(7))),
        (0, 2)
    );
    assert_eq!(DEFAULTS.workers_at(Duration::ZERO), 2);
}
