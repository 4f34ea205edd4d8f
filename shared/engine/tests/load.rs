//! Load simulation: the real services on in-memory ports, in a world where work takes time.
//!
//! The fault simulation (`simulation.rs`) gives every handler all the capacity it wants; here
//! each function has a fixed number of workers, each taking a batch from its queue, first in
//! first out, and busy for the batch's service time; each remote service answers as many calls
//! at once as its agent has workers, each after its latency. Orders arrive at a rate, and in
//! bursts above what the system can serve; a remote service can slow down, or declare a rate
//! and a concurrency below what its agent's workers could send it, which every worker keeps
//! together through one services book, as the deployed agents do through the services table
//! (the service itself answers 429 to a call above its rate, and to a few at random). Clients
//! whose order is refused at the door send it again after its `Retry-After`. Time is a manual
//! clock moved in ticks; each worker keeps a clock of its own, so that a batch's writes and
//! messages happen when its work ends.
//!
//! What must hold, for every scenario and seed:
//! - every order accepted ends, in a terminal state, with its alert sent if it failed;
//! - every order that did not go through is explained by faults the seed injected into that
//!   very step: a step refused for good was refused by its service; a step whose lease expired
//!   N times had N faults that cost a lease (a message of that step lost, or its agent giving up
//!   on a call the seed failed). Faults the agent retried away, load and delay explain nothing;
//! - the work per order (messages sent and handled, state writes) stays within 1.25 times the
//!   fault-free path's: recovery adds no work to a backlog;
//! - a burst makes a backlog, and the backlog drains at capacity: orders finish at 90 % of the
//!   capacity or more until it is gone;
//! - a service that declares a rate never receives more calls in a second, however aligned,
//!   nor more in flight than it declares, and no order fails for it (429s included);
//! - a service whose rate nobody declared is called at the rate its agents learn from its
//!   429s: no order fails for it, and it throttles one call in ten orders at most.
//!
//! `SIM_LOAD_SEEDS=n` runs n seeds per scenario (default 2); `SEED=n` one seed of each.

#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sas_engine::catalogue::Catalogue;
use sas_engine::config::EngineConfig;
use sas_engine::ids::Direction;
use sas_engine::load::Gauges;
use sas_engine::memory::{
    InMemory, ManualClock, MemoryBus, MemoryPayloads, MemoryQueues, MemoryRemote,
    MemoryServiceBook, MemoryStore, MemoryWaits, SeqIds, SplitMix,
};
use sas_engine::message::Message;
use sas_engine::mutants::{self, Mutant};
use sas_engine::pace::{self, Limits};
use sas_engine::ports::{
    Clock, Destination, Incoming, Outbox, Outgoing, RemoteCall, RemoteFault, RemoteService,
};
use sas_engine::services::{Agent, AgentOutcome, Scheduler, Submission, Supervisor};
use sas_engine::state::{AlertDelivery, Cause, Happening, ProcessState};
use sas_engine::workflow::Workflow;
use sas_engine::{AgentName, Error, OrderId, Result, Timestamp};

const TICK: Duration = Duration::from_millis(100);
const STEPS: f64 = 3.0;
/// What the fault-free path costs one order: a start message and a request and a reply per
/// step, sent and handled; a state written at submission, at the claim and once per step.
const FAULT_FREE_MESSAGES: f64 = 1.0 + 2.0 * STEPS;
const FAULT_FREE_WRITES: f64 = 2.0 + STEPS;
const MAX_AMPLIFICATION: f64 = 1.25;
const MIN_GOODPUT: f64 = 0.9;

/// How much work the system can do.
#[derive(Clone, Copy, Debug)]
struct Capacity {
    /// Scheduler workers on each of its two queues, and their batch.
    scheduler_workers: usize,
    scheduler_batch: usize,
    /// A scheduler batch takes this, plus `per_message` for each message in it.
    per_batch: Duration,
    per_message: Duration,
    /// Workers of each agent: as many calls as its remote service answers at once.
    agent_workers: usize,
    /// A remote call's latency.
    latency: Duration,
    sweep_every: Duration,
}

const CAPACITY: Capacity = Capacity {
    scheduler_workers: 2,
    scheduler_batch: 10,
    per_batch: Duration::from_millis(50),
    per_message: Duration::from_millis(20),
    agent_workers: 3,
    latency: Duration::from_millis(200),
    sweep_every: Duration::from_secs(10),
};

impl Capacity {
    /// Orders a second the slowest stage can serve.
    fn orders_per_second(&self) -> f64 {
        let batch = self.per_batch + self.per_message * self.scheduler_batch as u32;
        let scheduler =
            (self.scheduler_workers * self.scheduler_batch) as f64 / batch.as_secs_f64();
        // The reply queue carries one message per step, the start queue one per order.
        let replies = scheduler / STEPS;
        let agent = self.agent_workers as f64 / self.latency.as_secs_f64();
        scheduler.min(replies).min(agent)
    }
}

/// Orders arriving, services slowing, faults injected.
#[derive(Clone, Debug)]
struct Scenario {
    name: &'static str,
    /// Steady arrivals, as a share of capacity.
    base: f64,
    /// A burst: from `start` for `length`, arrivals at `factor` times capacity.
    burst: Option<(Duration, Duration, f64)>,
    /// A remote service slowing down: from `start` for `length`, its latency times `factor`.
    slowdown: Option<(&'static str, Duration, Duration, f64)>,
    /// A remote service that takes so much: a rate it throttles above, a concurrency.
    limited: Option<(&'static str, Limits)>,
    /// Whether the stack declares what the limited service takes; if not, its agents learn its
    /// rate from its throttling.
    declared: bool,
    /// The share of capacity a backlog must drain at.
    min_goodput: f64,
    /// Arrivals stop after this.
    arrivals_for: Duration,
    /// The door's longest accepted wait; `None` keeps it open (to let the backlog form).
    door: Option<Duration>,
    /// Probabilities: a delivered message lost, a remote call failing for now, a step's key
    /// refused for good, a call to the limited service answered 429 whatever its rate.
    lost: f64,
    transient: f64,
    permanent: f64,
    throttled: f64,
}

impl Scenario {
    /// Orders a second the system can serve: its slowest stage, or the rate a limited service
    /// declares (each order calls it once, and its agents space the calls a little more than
    /// one over the rate apart).
    fn capacity(&self) -> f64 {
        let system = CAPACITY.orders_per_second();
        match self.limited.and_then(|(_, limits)| limits.per_second) {
            Some(rate) => system.min(1.0 / pace::spacing(rate).as_secs_f64()),
            None => system,
        }
    }
}

fn scenarios() -> Vec<Scenario> {
    let open = Scenario {
        name: "",
        base: 0.5,
        burst: None,
        slowdown: None,
        limited: None,
        declared: true,
        min_goodput: MIN_GOODPUT,
        arrivals_for: Duration::from_secs(120),
        door: None,
        lost: 0.002,
        transient: 0.03,
        permanent: 0.02,
        throttled: 0.0,
    };
    let burst =
        |factor: f64, secs: u64| Some((Duration::from_secs(20), Duration::from_secs(secs), factor));
    // Rarer faults while the backlog is measured: their retries and undos are work too, and
    // would take from what the backlog can drain at.
    let open = Scenario { lost: 0.001, transient: 0.01, permanent: 0.01, ..open };
    let limited = Scenario {
        name: "payment declared at 5 calls a second, burst 2x for 60 s",
        limited: Some(("payment", Limits { per_second: Some(5), in_flight: None })),
        burst: burst(2.0, 60),
        lost: 0.0,
        transient: 0.0,
        permanent: 0.0,
        throttled: 0.01,
        ..open.clone()
    };
    vec![
        Scenario {
            name: "steady at 0.8x, with more faults",
            base: 0.8,
            lost: 0.01,
            transient: 0.05,
            permanent: 0.03,
            ..open.clone()
        },
        Scenario { name: "burst 2x for 60 s, door open", burst: burst(2.0, 60), ..open.clone() },
        Scenario { name: "burst 5x for 30 s, door open", burst: burst(5.0, 30), ..open.clone() },
        Scenario { name: "burst 10x for 20 s, door open", burst: burst(10.0, 20), ..open.clone() },
        Scenario {
            name: "burst 10x for 20 s, door at 20 s",
            burst: burst(10.0, 20),
            door: Some(Duration::from_secs(20)),
            ..open.clone()
        },
        Scenario {
            name: "payment 4x slower for 60 s at 0.8x",
            base: 0.8,
            slowdown: Some(("payment", Duration::from_secs(20), Duration::from_secs(60), 4.0)),
            ..open.clone()
        },
        // The only faults are the service's own 429s: every order must go through.
        limited.clone(),
        // The same service, its rate declared nowhere: its agents find it from its 429s, going
        // above it now and then to follow it, which costs a share of what a declared rate
        // gives.
        Scenario {
            name: "payment takes 5 calls a second, declared nowhere, burst 2x for 60 s",
            declared: false,
            min_goodput: 0.75,
            ..limited
        },
    ]
}

/// What the seed did to an order, for explaining its end.
#[derive(Clone, Debug, Default)]
struct Injected {
    /// Actions refused for good.
    refused: HashSet<String>,
    /// Remote calls failed for now, per action (most are retried away by the agent).
    transient: HashMap<String, u32>,
    /// Per step, the faults that each cost a lease: a message of the step lost, or its agent
    /// giving up on a call that the seed failed.
    lease_faults: HashMap<String, u32>,
}

impl Injected {
    fn cost_a_lease(&mut self, step: &str) {
        *self.lease_faults.entry(step.to_owned()).or_default() += 1;
    }
}

type Ledger = Arc<Mutex<HashMap<OrderId, Injected>>>;

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

/// The calls that reached the limited service: when each came, when it was answered, and
/// whether the service took it (or answered 429).
#[derive(Debug, Default)]
struct Arrivals {
    calls: Mutex<Vec<(Timestamp, Timestamp, bool)>>,
}

impl Arrivals {
    /// The most calls that came within one second, however the second is aligned.
    fn busiest_second(&self) -> usize {
        let mut at: Vec<Timestamp> = self.calls.lock().unwrap().iter().map(|c| c.0).collect();
        at.sort_unstable();
        let second = Duration::from_secs(1);
        let mut last = 0;
        let mut most = 0;
        for first in 0..at.len() {
            while last < at.len() && at[last] < at[first].plus(second) {
                last += 1;
            }
            most = most.max(last - first);
        }
        most
    }

    /// The most calls in flight at once: come, and not answered yet.
    fn most_in_flight(&self) -> usize {
        let mut moves: Vec<(Timestamp, i64)> = Vec::new();
        for (came, answered, _) in self.calls.lock().unwrap().iter() {
            moves.extend([(*came, 1), (*answered, -1)]);
        }
        // An answer before a call that comes at the same moment.
        moves.sort_unstable();
        let mut now = 0i64;
        let mut most = 0i64;
        for (_, step) in moves {
            now += step;
            most = most.max(now);
        }
        usize::try_from(most).unwrap_or(0)
    }

    fn throttled(&self) -> usize {
        self.calls.lock().unwrap().iter().filter(|c| !c.2).count()
    }
}

/// A remote service with latency, on the calling worker's clock, and seeded faults; effects
/// go through the shared in-memory service, whose ledger checks they happen once. The limited
/// service counts the calls that reach it and answers 429 to those above its rate.
#[derive(Debug)]
struct Remote {
    inner: Arc<MemoryRemote<ManualClock>>,
    worker: ManualClock,
    agent: AgentName,
    scenario: Scenario,
    start: Timestamp,
    /// This worker's draws of transient faults.
    seed: u64,
    /// The world's, shared by every worker: which keys the business refuses.
    refusals: u64,
    calls: AtomicU64,
    injected: Ledger,
    /// Where the limited service notes its calls, if this is it.
    arrivals: Option<Arc<Arrivals>>,
}

impl RemoteService for Remote {
    async fn call(&self, call: &RemoteCall) -> std::result::Result<serde_json::Value, RemoteFault> {
        let now = self.worker.now();
        let mut latency = CAPACITY.latency;
        if let Some((agent, from, length, factor)) = self.scenario.slowdown {
            let t = self.start.until(now);
            if agent == self.agent.as_str() && t >= from && t < from + length {
                latency = latency.mul_f64(factor);
            }
        }
        if let Some(arrivals) = &self.arrivals {
            let rate = self.scenario.limited.and_then(|(_, limits)| limits.per_second);
            let mut calls = arrivals.calls.lock().unwrap();
            let second_ago = now.minus(Duration::from_secs(1));
            let taken =
                calls.iter().filter(|(at, _, took)| *took && *at > second_ago && *at <= now);
            let full = rate.is_some_and(|r| taken.count() >= r as usize);
            let drawn = SplitMix::for_key(self.seed, &call.idempotency_key, calls.len() as u64)
                .unit()
                < self.scenario.throttled;
            calls.push((now, now.plus(latency), !(full || drawn)));
            if full || drawn {
                self.worker.advance(latency);
                let reason = "429 Too Many Requests".to_owned();
                return Err(RemoteFault::Throttled {
                    reason,
                    retry_after: Some(Duration::from_secs(1)),
                });
            }
        }
        if now.plus(latency) > call.deadline {
            self.worker.set(call.deadline);
            return Err(RemoteFault::Transient("timeout".into()));
        }
        self.worker.advance(latency);
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        let draw = SplitMix::seeded(self.seed ^ n.wrapping_mul(0x9e37_79b9)).unit();
        // The same key always gets the same answer, whichever worker calls, as a card declined
        // stays declined; and a key that took effect is answered with its effect, never refused.
        let refused = call.direction == Direction::Do
            && !self.inner.applied(&call.idempotency_key)
            && SplitMix::seeded(self.refusals ^ fingerprint(&call.idempotency_key)).unit()
                < self.scenario.permanent;
        let mut injected = self.injected.lock().unwrap();
        if refused {
            injected.entry(call.order_id).or_default().refused.insert(call.action.clone());
            return Err(RemoteFault::Permanent("refused".into()));
        }
        if draw < self.scenario.transient {
            *injected
                .entry(call.order_id)
                .or_default()
                .transient
                .entry(call.action.clone())
                .or_default() += 1;
            return Err(RemoteFault::Transient("unavailable".into()));
        }
        drop(injected);
        self.inner.call(call).await
    }
}

fn fingerprint(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

type Store = Arc<MemoryStore<ManualClock>>;
type Queues = Arc<MemoryQueues<ManualClock>>;
type Bus = Arc<MemoryBus>;
type Waits = Arc<MemoryWaits>;
type Load = Gauges<Waits, Queues>;
type Book = Arc<MemoryServiceBook>;

struct SchedulerWorker {
    clock: ManualClock,
    busy_until: Timestamp,
    queue: Destination,
    scheduler: Scheduler<Store, WorkerOutbox, Bus, ManualClock, Waits, Arc<MemoryPayloads>>,
}

struct AgentWorker {
    clock: ManualClock,
    busy_until: Timestamp,
    queue: Destination,
    agent:
        Agent<Arc<Remote>, WorkerOutbox, ManualClock, SplitMix, Waits, Book, Arc<MemoryPayloads>>,
}

/// What a run measured.
#[derive(Debug, Default)]
struct Outcome {
    accepted: usize,
    refused: u64,
    processed: usize,
    compensated: usize,
    failed: usize,
    unexplained: Vec<(OrderId, Cause)>,
    sent: f64,
    handled: f64,
    writes: f64,
    /// Orders finished per second while the burst's backlog lasted, and how long it lasted.
    goodput: Option<(f64, Duration)>,
    longest_horizon: Duration,
    resets: usize,
    /// Time from acceptance to the end, median and 95th percentile.
    to_end: (Duration, Duration),
    /// At the limited service: the most calls in a second, however aligned, the most in flight
    /// at once, the calls it answered 429, and the requests its agents kept back.
    limited: Option<(usize, usize, usize, u64)>,
}

struct World {
    seed: u64,
    scenario: Scenario,
    clock: ManualClock,
    start: Timestamp,
    store: Store,
    queues: Queues,
    bus: Bus,
    remote: Arc<MemoryRemote<ManualClock>>,
    /// Each step's action and its undo's, to count effects in place as the business does.
    steps: Vec<(String, Option<String>)>,
    injected: Ledger,
    rng: SplitMix,
    submission: Submission<Store, Queues, Bus, ManualClock, SeqIds, Load, Arc<MemoryPayloads>>,
    supervisor: Supervisor<Store, Store, Queues, Bus, ManualClock, Load, Arc<MemoryPayloads>>,
    schedulers: Vec<SchedulerWorker>,
    agents: Vec<AgentWorker>,
    /// The services' records and paces, shared by every agent worker.
    book: Book,
    arrivals: Option<Arc<Arrivals>>,
    kept_back: u64,
    handled: u64,
    /// Every queue: the scheduler's two, then each agent's.
    destinations: Vec<Destination>,
}

impl World {
    fn new(scenario: &Scenario, seed: u64) -> World {
        let clock = ManualClock::default();
        let start = clock.now();
        let memory = InMemory::new(clock.clone());
        let injected = Ledger::default();
        let limits = scenario
            .limited
            .filter(|_| scenario.declared)
            .map(|(agent, limits)| (agent.to_owned(), limits));
        let config = Arc::new(EngineConfig {
            max_queue_wait: scenario.door.unwrap_or(Duration::from_secs(3600)),
            limits: limits.into_iter().collect(),
            ..EngineConfig::default()
        });
        let json = sas_workflows::order_fulfilment();
        let workflow = Arc::new(Workflow::from_json(json, &Workflow::agents_in(json)).unwrap());
        let catalogue = Arc::new(Catalogue::single((*workflow).clone()));
        let system = memory.assembly(clock.clone(), config, catalogue);
        let queues = &memory.queues;
        let submission = system.submission(queues.clone(), SeqIds::new("c"));
        let supervisor = system.supervisor(queues.clone());
        // Each worker runs on a clock of its own, and its outbox sends at its time.
        let worker = || {
            let own = ManualClock::at(start);
            let outbox =
                WorkerOutbox { queues: queues.clone(), world: clock.clone(), worker: own.clone() };
            (system.on_clock(own.clone()), outbox, own)
        };
        let mut schedulers = Vec::new();
        for queue in [Destination::Scheduler, Destination::Replies] {
            for n in 0..CAPACITY.scheduler_workers {
                let (system, outbox, clock) = worker();
                let scheduler = system.scheduler(outbox, format!("scheduler-{}-{n}", queue.name()));
                schedulers.push(SchedulerWorker {
                    clock,
                    busy_until: start,
                    queue: queue.clone(),
                    scheduler,
                });
            }
        }
        // Every worker of every agent guards its service in one book, as the deployed agents
        // share the services table; the limited service's counts its calls.
        let book = Book::default();
        let limited = scenario.limited.map(|(agent, _)| agent);
        let arrivals = limited.map(|_| Arc::new(Arrivals::default()));
        let mut agents = Vec::new();
        for (a, name) in system.catalogue.agents().iter().enumerate() {
            for n in 0..CAPACITY.agent_workers {
                let (system, outbox, clock) = worker();
                let service = Arc::new(Remote {
                    inner: memory.remote.clone(),
                    worker: clock.clone(),
                    agent: name.clone(),
                    scenario: scenario.clone(),
                    start,
                    seed: seed.wrapping_mul(31).wrapping_add((a * 7 + n) as u64),
                    refusals: seed,
                    calls: AtomicU64::new(0),
                    injected: injected.clone(),
                    arrivals: arrivals.clone().filter(|_| limited == Some(name.as_str())),
                });
                let random = SplitMix::seeded(seed ^ (a * 100 + n) as u64);
                let agent = system
                    .agent(name, service, outbox, random, format!("agent-{name}-{n}"))
                    .guarded(book.clone(), name.as_str(), system.config.hold)
                    .limited(system.config.limits_of(name.as_str()));
                let queue = Destination::Agent(name.clone());
                agents.push(AgentWorker { clock, busy_until: start, queue, agent });
            }
        }
        World {
            seed,
            scenario: scenario.clone(),
            clock,
            start,
            steps: workflow
                .steps()
                .iter()
                .map(|s| (s.name.clone(), s.compensation.as_ref().map(|c| c.action.clone())))
                .collect(),
            destinations: system.destinations(),
            store: memory.store,
            queues: memory.queues,
            bus: memory.bus,
            remote: memory.remote,
            injected,
            rng: SplitMix::seeded(seed),
            submission,
            supervisor,
            schedulers,
            agents,
            book,
            arrivals,
            kept_back: 0,
            handled: 0,
        }
    }

    fn elapsed(&self) -> Duration {
        self.start.until(self.clock.now())
    }

    /// Arrivals a second at `t`, as a share of capacity.
    fn arrival_rate(&self, t: Duration) -> f64 {
        let capacity = CAPACITY.orders_per_second();
        match self.scenario.burst {
            Some((from, length, factor)) if t >= from && t < from + length => factor * capacity,
            _ if t < self.scenario.arrivals_for => self.scenario.base * capacity,
            _ => 0.0,
        }
    }

    /// Takes a delivery off `queue`, or loses it (as the seed says). Returns the ones kept.
    fn take(&mut self, queue: &Destination, max: usize) -> Vec<sas_engine::memory::Delivery> {
        let mut kept = Vec::new();
        for d in self.queues.receive(queue, max) {
            if self.rng.unit() < self.scenario.lost {
                let message = Message::decode(&d.body).unwrap();
                let order = message.order_id().expect("no event travels in these runs");
                let steps = match &message {
                    Message::Request(r) => vec![r.step.name.clone()],
                    Message::Reply(r) => vec![r.step.name.clone()],
                    Message::ChildEnded(c) => vec![c.step.name.clone()],
                    Message::Elements(r) => vec![r.step.name.clone()],
                    Message::ElementsReply(r) => vec![r.step.name.clone()],
                    Message::Event(_) => Vec::new(),
                    // A start message is for the steps queued at its attempt.
                    Message::Start(start) => {
                        let r = self.store.peek(order).unwrap();
                        let queued = r.leased().filter(|(_, _, l)| l.attempt == start.attempt);
                        queued.map(|(_, s, _)| s.name.clone()).collect()
                    }
                };
                let mut injected = self.injected.lock().unwrap();
                for step in steps {
                    injected.entry(order).or_default().cost_a_lease(&step);
                }
                drop(injected);
                self.queues.delete(queue, &d.receipt).unwrap();
            } else {
                kept.push(d);
            }
        }
        kept
    }

    async fn work(&mut self) {
        let now = self.clock.now();
        for i in 0..self.schedulers.len() {
            if self.schedulers[i].busy_until > now {
                continue;
            }
            let queue = self.schedulers[i].queue.clone();
            let batch = self.take(&queue, CAPACITY.scheduler_batch);
            if batch.is_empty() {
                continue;
            }
            let w = &mut self.schedulers[i];
            // The batch's effects happen when its work ends.
            w.clock.set(now);
            w.clock.advance(CAPACITY.per_batch + CAPACITY.per_message * batch.len() as u32);
            w.busy_until = w.clock.now();
            for d in &batch {
                let message = Message::decode(&d.body).unwrap();
                let incoming =
                    Incoming { message_id: d.identity(), receive_count: d.receive_count };
                match w.scheduler.handle(&message, incoming).await {
                    Ok(_) => self.queues.delete(&queue, &d.receipt).unwrap(),
                    Err(Error::InvalidMessage(why)) => {
                        panic!("seed {}: a message the system sent was refused: {why}", self.seed)
                    }
                    Err(_) => {}
                }
            }
            self.handled += batch.len() as u64;
        }
        for i in 0..self.agents.len() {
            if self.agents[i].busy_until > now {
                continue;
            }
            let queue = self.agents[i].queue.clone();
            let Some(d) = self.take(&queue, 1).pop() else { continue };
            let w = &mut self.agents[i];
            w.clock.set(now);
            let Message::Request(request) = Message::decode(&d.body).unwrap() else { panic!() };
            let incoming = Incoming { message_id: d.identity(), receive_count: d.receive_count };
            let failed = || {
                let injected = self.injected.lock().unwrap();
                let of = injected.get(&request.order_id);
                of.and_then(|i| i.transient.get(&request.action).copied()).unwrap_or(0)
            };
            let failed_before = failed();
            let handled = w.agent.handle(&request, incoming).await;
            if let Ok(AgentOutcome::KeptBack { .. }) = handled {
                self.kept_back += 1;
            }
            if let Ok(AgentOutcome::GaveUp { .. }) = handled {
                if failed() > failed_before {
                    let mut injected = self.injected.lock().unwrap();
                    injected.entry(request.order_id).or_default().cost_a_lease(&request.step.name);
                }
            }
            if handled.is_ok() {
                self.queues.delete(&queue, &d.receipt).unwrap();
            }
            w.busy_until = w.clock.now().max(now.plus(Duration::from_millis(1)));
            self.handled += 1;
        }
    }

    fn finished(&self) -> bool {
        self.store.records().iter().all(|r| r.is_terminal() && r.complete_by.is_none())
    }

    fn waiting(&self) -> usize {
        self.destinations.iter().map(|d| self.queues.visible_len(d)).sum()
    }

    async fn run(&mut self) -> Outcome {
        let mut out = Outcome::default();
        let mut owed = 0.0;
        let mut next_order = 0usize;
        // Orders refused at the door, and when their clients send them again: after what
        // Retry-After says, and up to a fifth more.
        let mut retries: Vec<(Timestamp, usize)> = Vec::new();
        let mut next_sweep = self.start.plus(CAPACITY.sweep_every);
        let burst = self.scenario.burst.map(|(from, _, _)| self.start.plus(from));
        let mut backlog_over: Option<Timestamp> = None;
        let capacity = self.scenario.capacity();
        let limit = Duration::from_secs(3600);
        loop {
            self.clock.advance(TICK);
            let now = self.clock.now();
            let t = self.elapsed();
            assert!(
                t < limit,
                "seed {}: {}: orders still in flight after an hour",
                self.seed,
                self.scenario.name
            );
            owed += self.arrival_rate(t) * TICK.as_secs_f64();
            let mut due: Vec<usize> = Vec::new();
            while owed >= 1.0 {
                owed -= 1.0;
                due.push(next_order);
                next_order += 1;
            }
            retries.retain(|(at, i)| {
                if *at <= now {
                    due.push(*i);
                    false
                } else {
                    true
                }
            });
            for i in due {
                match self.submission.submit(&format!("load-{i}"), order_body(i).as_bytes()).await {
                    Ok(a) => out.accepted += usize::from(a.created),
                    Err(Error::Overloaded { retry_after, .. }) => {
                        out.refused += 1;
                        let wait = retry_after.mul_f64(1.0 + 0.2 * self.rng.unit());
                        retries.push((now.plus(wait), i));
                    }
                    Err(e) => panic!("seed {}: submission failed: {e}", self.seed),
                }
            }
            self.work().await;
            if now >= next_sweep {
                let report = self.supervisor.sweep().await.unwrap();
                out.longest_horizon =
                    out.longest_horizon.max(Duration::from_millis(report.horizon_ms));
                self.supervisor.tend(&self.book, report.stalled.is_none()).await.unwrap();
                next_sweep = now.plus(CAPACITY.sweep_every);
            }
            // The backlog lasts from the burst for as long as the queues hold two seconds of
            // work or more (with the door, the rest of it waits with the clients).
            if let Some(b) = burst {
                if now > b && self.waiting() as f64 >= 2.0 * capacity * FAULT_FREE_MESSAGES {
                    backlog_over = Some(now);
                }
            }
            let arrivals_over = t > self.scenario.arrivals_for
                && self.scenario.burst.is_none_or(|(from, length, _)| t > from + length);
            // Looking at every record costs: once a second is enough.
            let whole_second = t.as_millis() % 1000 == 0;
            if arrivals_over && retries.is_empty() && whole_second && self.finished() {
                break;
            }
        }
        if let (Some(from), Some(to)) = (burst, backlog_over) {
            let ends = self.store.records().into_iter().filter_map(|r| {
                let end = r.timeline.iter().rev().find(|e| {
                    matches!(
                        e.what,
                        Happening::Processed | Happening::Compensated | Happening::Failed
                    )
                })?;
                Some(end.at)
            });
            let done = ends.filter(|at| *at >= from && *at < to).count();
            let span = from.until(to);
            out.goodput = Some((done as f64 / span.as_secs_f64(), span));
        }
        self.outcome(out)
    }

    fn outcome(&self, mut out: Outcome) -> Outcome {
        let injected = self.injected.lock().unwrap();
        let alerts = self.bus.of_type(sas_engine::events::ALERT_DETAIL_TYPE);
        let in_place = self.remote.in_place(&self.steps);
        let mut to_end = Vec::new();
        for r in self.store.records() {
            // What the business holds for the order, whatever keys its calls came with: a
            // processed order every step once; one in Error nothing, but what is on the
            // operator's list to undo by hand.
            for (step, _) in &self.steps {
                let n = in_place.get(&(r.order_id, step.clone())).copied().unwrap_or(0);
                let expected = match r.process_state {
                    ProcessState::Processed => 1..=1,
                    _ if r.needs_manual_undo().contains(step) => 0..=1,
                    _ => 0..=0,
                };
                assert!(
                    expected.contains(&n),
                    "seed {}: {} ended {:?} with {step} in place {n} times\n{:#?}\n{}",
                    self.seed,
                    r.order_id,
                    r.process_state,
                    self.remote
                        .ledger()
                        .iter()
                        .filter(|e| e.order_id == r.order_id)
                        .collect::<Vec<_>>(),
                    serde_json::to_string_pretty(&r).unwrap()
                );
            }
            if let Some(end) = r.timeline.iter().rev().find(|e| {
                matches!(e.what, Happening::Processed | Happening::Compensated | Happening::Failed)
            }) {
                to_end.push(r.created_at.until(end.at));
            }
            out.resets += r.timeline.iter().filter(|e| e.what == Happening::RetryScheduled).count();
            match r.process_state {
                ProcessState::Processed => out.processed += 1,
                ProcessState::Error => {
                    assert_eq!(
                        r.alert,
                        Some(AlertDelivery::Sent),
                        "seed {}: {} not alerted",
                        self.seed,
                        r.order_id
                    );
                    assert!(
                        alerts.iter().any(|a| a["order_id"] == r.order_id.to_string()),
                        "seed {}: no alert for {}",
                        self.seed,
                        r.order_id
                    );
                    if r.needs_manual_undo().is_empty() {
                        out.compensated += 1;
                    } else {
                        out.failed += 1;
                    }
                    let cause = r.cause.clone().unwrap();
                    let what = injected.get(&r.order_id).cloned().unwrap_or_default();
                    let explained = match &cause {
                        Cause::StepRejected { step, .. } => what.refused.contains(step),
                        // Each expired lease needs a fault of its own, in that step.
                        Cause::StepTimedOut { step, failures } => {
                            what.lease_faults.get(step).copied().unwrap_or(0) >= *failures
                        }
                        // The load simulation's services answer small outputs, none is
                        // held for hours, and its workflows have no concurrency key.
                        Cause::OutputTooLarge { .. }
                        | Cause::KeyBusy { .. }
                        | Cause::KeyWaitedTooLong { .. }
                        | Cause::ServiceHeldTooLong { .. }
                        | Cause::UnknownStep { .. }
                        | Cause::Cancelled { .. } => false,
                    };
                    if !explained {
                        out.unexplained.push((r.order_id, cause));
                    }
                }
                other => panic!("seed {}: {} ended {other:?}", self.seed, r.order_id),
            }
        }
        to_end.sort_unstable();
        let pct = |p: f64| to_end.get(((to_end.len() as f64 - 1.0) * p).round() as usize).copied();
        out.to_end = (pct(0.5).unwrap_or_default(), pct(0.95).unwrap_or_default());
        let n = out.accepted.max(1) as f64;
        let sent: usize = self.destinations.iter().map(|d| self.queues.sent_count(d)).sum();
        out.sent = sent as f64 / n;
        out.handled = self.handled as f64 / n;
        let stats = self.store.stats();
        out.writes = stats.writes as f64 / n;
        assert!(self.remote.max_applications() <= 1, "seed {}: an effect applied twice", self.seed);
        out.limited = self
            .arrivals
            .as_ref()
            .map(|a| (a.busiest_second(), a.most_in_flight(), a.throttled(), self.kept_back));
        out
    }
}

fn order_body(i: usize) -> String {
    format!(
        r#"{{"customer_id":"c-{i}","currency":"EUR","items":[{{"sku":"SKU-{n}","quantity":1,"unit_price":100}}],
            "ship_to":{{"name":"N","line1":"L","city":"C","postal_code":"1","country":"FR"}}}}"#,
        n = i % 7
    )
}

fn seeds() -> Vec<u64> {
    if let Some(seed) = std::env::var("SEED").ok().and_then(|s| s.parse().ok()) {
        return vec![seed];
    }
    let n: u64 = std::env::var("SIM_LOAD_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2);
    (1..=n).collect()
}

#[tokio::test(flavor = "current_thread")]
async fn load_and_delay_never_fail_an_order_nor_multiply_its_work() {
    let capacity = CAPACITY.orders_per_second();
    println!("capacity: {capacity:.1} orders a second");
    println!(
        "| scenario | seed | accepted | refused at the door | processed | compensated | failed | unexplained | sent / handled / writes per order (x fault-free) | resets | accepted to end, p50 / p95 | goodput in the backlog | longest horizon |"
    );
    println!(
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- | --- | ---: |"
    );
    let mut problems = Vec::new();
    let mut limited = Vec::new();
    for scenario in scenarios() {
        for seed in seeds() {
            let mut world = World::new(&scenario, seed);
            let out = world.run().await;
            let amplification = [
                out.sent / FAULT_FREE_MESSAGES,
                out.handled / FAULT_FREE_MESSAGES,
                out.writes / FAULT_FREE_WRITES,
            ];
            let capacity = scenario.capacity();
            let goodput = out.goodput.map_or("n/a".to_owned(), |(g, span)| {
                format!("{:.0} % of capacity over {} s", 100.0 * g / capacity, span.as_secs())
            });
            println!(
                "| {} | {seed} | {} | {} | {} | {} | {} | {} | {:.2} / {:.2} / {:.2} | {} | {:.1} s / {:.1} s | {goodput} | {} s |",
                scenario.name,
                out.accepted,
                out.refused,
                out.processed,
                out.compensated,
                out.failed,
                out.unexplained.len(),
                amplification[0],
                amplification[1],
                amplification[2],
                out.resets,
                out.to_end.0.as_secs_f64(),
                out.to_end.1.as_secs_f64(),
                out.longest_horizon.as_secs()
            );
            if !out.unexplained.is_empty() {
                problems.push(format!(
                    "{} seed {seed}: {} orders failed for no injected cause, e.g. {:?}",
                    scenario.name,
                    out.unexplained.len(),
                    &out.unexplained[..out.unexplained.len().min(3)]
                ));
            }
            if let Some(worst) = amplification.iter().copied().find(|a| *a > MAX_AMPLIFICATION) {
                problems.push(format!(
                    "{} seed {seed}: {worst:.2} times the fault-free work per order",
                    scenario.name
                ));
            }
            if scenario.burst.is_some() && out.goodput.is_none() {
                // Without a backlog the burst tested nothing that capacity alone cannot serve.
                problems.push(format!("{} seed {seed}: the burst made no backlog", scenario.name));
            }
            if let Some((goodput, _)) = out.goodput {
                if goodput < scenario.min_goodput * capacity {
                    problems.push(format!(
                        "{} seed {seed}: the backlog drained at {:.0} % of capacity",
                        scenario.name,
                        100.0 * goodput / capacity
                    ));
                }
            }
            if let (Some((agent, limits)), Some(figures)) = (scenario.limited, out.limited) {
                limited.push((scenario.name, seed, agent, limits, scenario.declared, figures));
                let (busiest, in_flight, throttled, _) = figures;
                let declared = scenario.declared;
                if declared && limits.per_second.is_some_and(|rate| busiest > rate as usize) {
                    problems.push(format!(
                        "{} seed {seed}: {busiest} calls reached {agent} within a second",
                        scenario.name
                    ));
                }
                // Undeclared, its calls above its rate are the 429s it answers: one in ten
                // orders at most once its agents learn it (called as they come, it answers
                // more than one order in two with a 429).
                if !declared && throttled * 10 > out.accepted {
                    problems.push(format!(
                        "{} seed {seed}: {throttled} calls throttled for {} orders",
                        scenario.name, out.accepted
                    ));
                }
                if declared && limits.in_flight.is_some_and(|places| in_flight > places as usize) {
                    problems.push(format!(
                        "{} seed {seed}: {in_flight} calls were in flight at {agent} at once",
                        scenario.name
                    ));
                }
                // Its only faults are 429s: none may fail an order.
                if out.processed != out.accepted {
                    problems.push(format!(
                        "{} seed {seed}: {} of {} orders did not go through",
                        scenario.name,
                        out.accepted - out.processed,
                        out.accepted
                    ));
                }
            }
        }
    }
    println!();
    println!(
        "| scenario | seed | service | declared | busiest second | most in flight | 429s answered | requests kept back |"
    );
    println!("| --- | ---: | --- | --- | ---: | ---: | ---: | ---: |");
    for (name, seed, agent, limits, declared, (busiest, in_flight, throttled, kept_back)) in limited
    {
        let rate = limits.per_second.map(|r| format!("{r} a second"));
        let places = limits.in_flight.map(|p| format!("{p} in flight"));
        let takes = [rate, places].into_iter().flatten().collect::<Vec<_>>().join(", ");
        let declared = if declared { takes } else { format!("nothing (takes {takes})") };
        println!(
            "| {name} | {seed} | {agent} | {declared} | {busiest} | {in_flight} | {throttled} | {kept_back} |"
        );
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The recovery from before queue waits counted (the supervisor judging a lease as soon as its
/// CompleteBy passes, a Pending reset taking a new attempt, an agent dropping a request whose
/// lease ran out while it waited): under a burst it fails orders for no fault and drains the
/// backlog slowly, and the checks above must say so.
#[tokio::test(flavor = "current_thread")]
async fn the_old_recovery_fails_orders_for_no_cause_in_a_burst() {
    let _switched = mutants::switch_on(&Mutant::OLD_RECOVERY);
    let scenario = scenarios().into_iter().find(|s| s.name == "burst 5x for 30 s, door open");
    let out = World::new(&scenario.unwrap(), 1).run().await;
    let capacity = CAPACITY.orders_per_second();
    let (goodput, _) = out.goodput.expect("the burst made a backlog");
    println!(
        "old recovery: {} of {} orders failed for no injected cause, {} resets, {:.2} times the messages and {:.2} times the writes, the backlog drained at {:.0} %",
        out.unexplained.len(),
        out.accepted,
        out.resets,
        out.sent / FAULT_FREE_MESSAGES,
        out.writes / FAULT_FREE_WRITES,
        100.0 * goodput / capacity
    );
    assert!(out.unexplained.len() > 100, "{:?}", &out.unexplained[..out.unexplained.len().min(3)]);
    assert!(goodput < MIN_GOODPUT * capacity);
}

#[test]
fn the_model_s_capacity_is_its_slowest_stage() {
    // Agents: 3 workers at 200 ms a call; the scheduler's replies: 80 a second over 3 steps.
    assert!((CAPACITY.orders_per_second() - 15.0).abs() < 1e-9);
}
