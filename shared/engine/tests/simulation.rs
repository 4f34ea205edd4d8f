//! Deterministic simulation: many orders through the real services on in-memory ports, with
//! faults chosen by a seed, and the invariants checked after every event.
//!
//! Faults: lost, duplicated, delayed and reordered messages; a handler dying between any two of
//! its calls (the port call fails and the handler stops there, its message not deleted);
//! throttled writes; remote services failing transiently, refusing for good, applying an effect
//! and losing the answer, answering too late, or answering more than a step may keep;
//! supervisors sweeping at once; an expiry index lagging behind the table. An operator acts on
//! random orders at random moments all the while (cancel, pause, resume, redrive, redrive of the
//! compensation; sometimes the same command twice, sometimes crashing halfway). After the faults
//! stop, the operator resumes what it paused, and every order must reach a terminal state.
//!
//! Every agent guards its service, with one book of the services' records for all, and every
//! sweep is followed by the supervisor's tending of the services. On half the seeds the
//! services also misbehave over time: a service down for a spell, flapping, or coming back
//! slowly, and an operator holding and releasing services by hand. The faults stopping ends
//! the outages and the operator's holds. Besides the orders' invariants, the checks hold the
//! services to theirs: nothing but its probe reaches a held service; a step waits for its held
//! service with nothing counted against it, and fails for it only past its `max_hold`; once
//! the faults stop, an order waiting for a service is resumed by the first tending after the
//! service opens; and each hold and release is announced once.
//!
//! On two seeds in five the services are paced: some declare a rate and a concurrency, which
//! their agents keep; each service throttles (429 with a `Retry-After`) above a rate of its own
//! and a few calls at random; calls take time to reach a service and to be answered, and an
//! agent handles some requests of its queue side by side, on a clock that wakes each of them at
//! its time. Where each call reaches its service, no second, however aligned, holds more calls
//! than the service declared, nor are more in flight at once. An agent never gives up on a
//! request right after a 429; a request kept back keeps its lease until it is back and its
//! budget spent; and no order is stopped as refused by a service that never refused it.
//!
//! Each seed runs one workflow (the repository's two, or a random shape whose steps may only
//! report their failures, may depend on each other, and may wait for a time or for an answer
//! from outside, which a party gives, refuses or keeps alive at random moments, with the right
//! token, an old one or a forged one, or leaves to time out), and on a fifth of the seeds a new version of it is deployed halfway
//! through the faults: every order must keep the version it started on, and its steps, to its
//! end.
//!
//! On a third of the seeds the workflow runs one or two orders of a customer at a time (a
//! `concurrency` key on the customer, and orders of three customers): after every event, no
//! key has more places taken than its limit, and no order runs without its place; once every
//! order ended, every place was given back and nobody is left in line.
//!
//! `SEED=n cargo test -p sas-engine --test simulation` replays one seed exactly;
//! `SIM_SEEDS=n` runs n seeds (default 2000). Every kind of fault can be switched off:
//! `SIM_FAULTS_OFF=crash,lost` drops those kinds, `SIM_FAULTS=duplicated` keeps only the kinds
//! named (the names are those of [`Fault`]). A seed replays exactly under the same switches.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sas_engine::catalogue::Catalogue;
use sas_engine::config::{EngineConfig, HoldPolicy};
use sas_engine::events::{ALERT_DETAIL_TYPE, CALLBACK_DETAIL_TYPE, SERVICE_DETAIL_TYPE};
use sas_engine::health::hold_key;
use sas_engine::ids::{Direction, step_key};
use sas_engine::load::{self, Gauges, Unmetered};
use sas_engine::memory::{
    Behaviour, Delivery, ManualClock, MemoryBus, MemoryPayloads, MemoryQueues, MemoryRemote,
    MemoryStore, Outage, SeqIds, SplitMix, Throttle,
};
use sas_engine::message::{Message, StepRequest};
use sas_engine::mutants::{self, Mutant};
use sas_engine::pace::{self, Limits};
use sas_engine::payload::{self, MAX_INLINE_INPUT_LEN, Stored};
use sas_engine::ports::{Clock, Destination, Incoming, OrderRecord};
use sas_engine::services::{
    Agent, AgentOutcome, Applied, Assembly, Command, Commanded, Operator, RESUME_SPREAD, Scheduler,
    ServiceDesk, ServicesReport, Starter, Submission, Supervisor, SweepReport,
};
use sas_engine::state::{
    AlertDelivery, Cause, CommandKind, InputRef, Lease, Phase, ProcessState, StateRecord,
    StepStatus,
};
use sas_engine::workflow::{OnFailure, Wait, Work, Workflow};
use sas_engine::{AgentName, Error, OrderId, Result, Timestamp};
use sas_testkit::hands::{self, Desk, Dice, Operators, Taken, flowing};
use sas_testkit::watch::{Watch, Watched};
use sas_testkit::world::{Book, Bus, Load, Payloads, Ports, Queues, Store, Waits};
use sas_testkit::{Crashes, Fault, Faults, Timeline};

const ORDERS: usize = 12;
const FAULTY_EVENTS: usize = 600;
/// How often the supervisor sweeps once the faults stop.
const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// Holds on the scale of simulated time: an action is held after four passing faults in a row
/// within 20 s, and probed every 5 s; a hold that lasts ten minutes is announced once more.
const HOLD: HoldPolicy = HoldPolicy {
    after_failures: 4,
    window: Duration::from_secs(20),
    probe_every: Duration::from_secs(5),
    resume_per_second: 10,
    alert_after: Duration::from_secs(600),
};

type Remote = Arc<MemoryRemote<Timeline>>;
type SimAgent = Agent<Watched<Remote>, Queues, Timeline, SplitMix, Waits, Book, Payloads>;

/// What a run injected, by kind, and what it saw.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    injected: [u64; Fault::ALL.len()],
    /// Checks that found a key with every place taken, and orders found waiting in line.
    keys_full: u64,
    in_line: u64,
    /// Records both supervisors went for, where the conditional write stopped the second.
    races_lost: u64,
    /// Longest simulated time from the faults stopping to every order finished.
    longest_settle: Duration,
    /// Operator commands that changed an order, and those refused for its state.
    commands_applied: u64,
    commands_refused: u64,
    /// Orders that reached Processed after an operator's redrive.
    redriven_to_the_end: u64,
    /// Processed orders an operator undid.
    undone: u64,
    /// Child orders started, and those undone by their parent.
    children: u64,
    children_undone: u64,
    /// Elements of lists run by a child each; steps over a list done with some failed within
    /// their tolerance, and failed past it.
    elements: u64,
    /// Of those, run inline: each one call, no child.
    inline_elements: u64,
    /// Lists run inline whose service was still held at their own timeout.
    held_past_timeout: u64,
    tolerance_met: u64,
    tolerance_missed: u64,
    /// Orders processed with a step's failure only reported.
    processed_with_reports: u64,
    /// Orders that ended on the version before a deploy, after it.
    ended_on_old_version: u64,
    /// Orders seen with two steps in flight at once, and with two undos in flight at once.
    side_by_side: u64,
    undone_side_by_side: u64,
    /// Waits over in processed orders.
    waits_over: u64,
    /// Answers to steps waiting for one that counted, and those refused (another token, a
    /// step no longer waiting).
    answers_applied: u64,
    answers_refused: u64,
    /// Steps that waited for an answer in vain, until their timeout.
    unanswered: u64,
    /// Holds, releases and holds past the operators' threshold announced, one alert each.
    holds_announced: u64,
    releases_announced: u64,
    overdue_announced: u64,
    /// Calls that reached a service while its agent held another of its actions.
    beside_holds: u64,
    /// Runs of steps (or undos) that waited for their held service, and those of them that
    /// failed for it, held past their `max_hold`.
    parked: u64,
    held_too_long: u64,
    /// Orders the supervisor resumed for a service open again (the probes it sent included).
    resumed: u64,
    /// Probes that reached a held service, and calls let through within [`FRESH`] of a hold.
    probes: u64,
    late_calls: u64,
    /// Seeds whose services declared limits; calls that reached a limited service, those that
    /// filled its second, and those that took its last place in flight.
    paced_seeds: u64,
    limited_calls: u64,
    full_seconds: u64,
    full_places: u64,
    /// Calls made while a rate learned from their service's 429s was in force.
    learned_calls: u64,
    /// Requests an agent kept back for want of room at its service.
    kept_back: u64,
    /// Orders started by an event on the scheduler queue, and events that matched nothing.
    started_by_events: u64,
    unmatched_events: u64,
    /// Events delivered twice.
    events_duplicated: u64,
}

impl Tally {
    fn add(&mut self, fault: Fault, n: u64) {
        self.injected[fault as usize] += n;
    }

    fn count(&self, fault: Fault) -> u64 {
        self.injected[fault as usize]
    }
}

impl std::ops::AddAssign for Tally {
    fn add_assign(&mut self, o: Tally) {
        for (a, b) in self.injected.iter_mut().zip(o.injected) {
            *a += b;
        }
        self.races_lost += o.races_lost;
        self.keys_full += o.keys_full;
        self.in_line += o.in_line;
        self.longest_settle = self.longest_settle.max(o.longest_settle);
        self.commands_applied += o.commands_applied;
        self.commands_refused += o.commands_refused;
        self.redriven_to_the_end += o.redriven_to_the_end;
        self.undone += o.undone;
        self.children += o.children;
        self.children_undone += o.children_undone;
        self.elements += o.elements;
        self.inline_elements += o.inline_elements;
        self.held_past_timeout += o.held_past_timeout;
        self.tolerance_met += o.tolerance_met;
        self.tolerance_missed += o.tolerance_missed;
        self.processed_with_reports += o.processed_with_reports;
        self.ended_on_old_version += o.ended_on_old_version;
        self.side_by_side += o.side_by_side;
        self.undone_side_by_side += o.undone_side_by_side;
        self.waits_over += o.waits_over;
        self.answers_applied += o.answers_applied;
        self.answers_refused += o.answers_refused;
        self.unanswered += o.unanswered;
        self.holds_announced += o.holds_announced;
        self.releases_announced += o.releases_announced;
        self.overdue_announced += o.overdue_announced;
        self.beside_holds += o.beside_holds;
        self.parked += o.parked;
        self.held_too_long += o.held_too_long;
        self.resumed += o.resumed;
        self.probes += o.probes;
        self.late_calls += o.late_calls;
        self.paced_seeds += o.paced_seeds;
        self.limited_calls += o.limited_calls;
        self.full_seconds += o.full_seconds;
        self.full_places += o.full_places;
        self.learned_calls += o.learned_calls;
        self.kept_back += o.kept_back;
        self.started_by_events += o.started_by_events;
        self.unmatched_events += o.unmatched_events;
        self.events_duplicated += o.events_duplicated;
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for fault in Fault::ALL {
            write!(f, "{} {}, ", fault.name(), self.count(fault))?;
        }
        write!(
            f,
            "supervisor races lost {}; operator commands applied {}, refused {}; redriven orders processed {}; processed orders undone {}; child orders {}, undone by their parent {}; elements of lists {} ({} inline, {} lists held past their timeout), lists within their tolerance {}, past it {}; processed with a reported failure {}; ended on the version before a deploy {}; with steps in flight side by side {}, undos {}; waits over {}; answers applied {}, refused {}; unanswered {}; holds announced {}, releases {}, still held past the threshold {}; calls beside another action's hold {}; steps waiting for a held service {}, of which held too long {}; orders resumed {}; probes {}; calls in a hold's first second {}; seeds with declared limits {}, calls at limited services {}, of which filled a second {}, took the last place {}; calls at a learned rate {}; requests kept back {}; orders started by events {}, events delivered twice {}, events that matched nothing {}; longest settle {} s",
            self.races_lost,
            self.commands_applied,
            self.commands_refused,
            self.redriven_to_the_end,
            self.undone,
            self.children,
            self.children_undone,
            self.elements,
            self.inline_elements,
            self.held_past_timeout,
            self.tolerance_met,
            self.tolerance_missed,
            self.processed_with_reports,
            self.ended_on_old_version,
            self.side_by_side,
            self.undone_side_by_side,
            self.waits_over,
            self.answers_applied,
            self.answers_refused,
            self.unanswered,
            self.holds_announced,
            self.releases_announced,
            self.overdue_announced,
            self.beside_holds,
            self.parked,
            self.held_too_long,
            self.resumed,
            self.probes,
            self.late_calls,
            self.paced_seeds,
            self.limited_calls,
            self.full_seconds,
            self.full_places,
            self.learned_calls,
            self.kept_back,
            self.started_by_events,
            self.events_duplicated,
            self.unmatched_events,
            self.longest_settle.as_secs()
        )
    }
}

/// What the services of a run are built on: built once at the start, and again at a deploy.
struct Wiring {
    system: Assembly<Store, Bus, ManualClock, Waits, Load, Payloads>,
    outbox: Queues,
    /// How far ahead of everyone else's the supervisors' clocks read.
    ahead: Duration,
}

type Services = (
    Submission<Store, Queues, Bus, ManualClock, SeqIds, Load, Payloads>,
    Scheduler<Store, Queues, Bus, ManualClock, Waits, Payloads>,
    [Supervisor<Store, Store, Queues, Bus, ManualClock, Load, Payloads>; 2],
    Operator<Store, Queues, Bus, ManualClock, Payloads>,
    Starter<Store, Queues, Bus, ManualClock, SeqIds, Unmetered, Payloads>,
);

impl Wiring {
    /// The services that run `catalogue`; `ids` starts their correlation ids.
    fn services(&self, catalogue: Arc<Catalogue>, ids: &str) -> Services {
        let system = self.system.running(catalogue);
        let outbox = || self.outbox.clone();
        let supervisor = || {
            let clock = system.clock.ahead_by(self.ahead);
            system.on_clock(clock).supervisor(outbox())
        };
        (
            system.submission(outbox(), SeqIds::new(ids)),
            system.scheduler(outbox(), format!("scheduler-{ids}")),
            [supervisor(), supervisor()],
            system.operator(outbox()),
            system.starter(outbox(), SeqIds::new(&format!("e{ids}"))),
        )
    }
}

struct Sim {
    seed: u64,
    /// The workflow of this run (see [`workflow_of`]).
    workflow: Arc<Workflow>,
    /// The version deployed halfway through the faults on some seeds (see [`next_version`]),
    /// and the event at which it is.
    next: Option<(Arc<Workflow>, usize)>,
    /// What the services are built on, to build them again at a deploy.
    wiring: Wiring,
    /// Whether the next version is deployed yet.
    deployed: bool,
    /// The workflow a child step of the run's workflow starts, on the seeds that have one.
    child: Option<Arc<Workflow>>,
    /// Where large inputs and outputs are kept.
    shelf: Arc<MemoryPayloads>,
    /// The version each order must keep: the current one when it was accepted.
    versions: HashMap<OrderId, u32>,
    rng: SplitMix,
    clock: ManualClock,
    memory: Arc<MemoryStore<ManualClock>>,
    queues: Arc<MemoryQueues<ManualClock>>,
    bus: Arc<MemoryBus>,
    remote: Remote,
    crashes: Crashes,
    submission: Submission<Store, Queues, Bus, ManualClock, SeqIds, Load, Payloads>,
    scheduler: Scheduler<Store, Queues, Bus, ManualClock, Waits, Payloads>,
    agents: HashMap<Destination, SimAgent>,
    supervisors: [Supervisor<Store, Store, Queues, Bus, ManualClock, Load, Payloads>; 2],
    operator: Operator<Store, Queues, Bus, ManualClock, Payloads>,
    /// The scheduler's starter, of the orders the events on the scheduler queue start.
    starter: Starter<Store, Queues, Bus, ManualClock, SeqIds, Unmetered, Payloads>,
    /// The order each event that matches the run's workflow must start, with the event's id
    /// and its detail (the order's input); and how many events that match nothing were sent.
    events: HashMap<OrderId, (String, serde_json::Value)>,
    unmatched: u64,
    /// Whether each key's applications are counted (see [`Sim::check`]).
    count_keys: bool,
    /// The scheduler queue's dead letters looked at so far (see [`Sim::redrive_events`]).
    dead_seen: usize,
    /// The operators' commands so far.
    operators: Operators,
    /// How many times each order ended owing an alert (in Error, or Processed with a reported
    /// failure), and how many of those times its alert was seen recorded as sent. Each time
    /// owes one distinct alert, unless an operator's redrive came before it was published.
    errors: HashMap<OrderId, usize>,
    alerted: HashMap<OrderId, usize>,
    /// Ledger entries the check of effects in place has seen: it runs again only on new ones.
    ledger_checked: usize,
    /// Each step's action and its undo's, to count effects in place as the business does.
    steps: Vec<(String, Option<String>)>,
    accepted: Vec<OrderId>,
    terminal: HashMap<OrderId, StateRecord>,
    /// Orders seen with more than one step (or undo) in flight at once.
    side_by_side: HashSet<(OrderId, Phase)>,
    attempts: HashMap<OrderId, u64>,
    /// Each order's revision and CompleteBy at the last check: a supervisor's write must find
    /// the deadline it replaces passed, whether a Processing lease, a Pending claim or an
    /// alert's retry.
    deadlines: HashMap<OrderId, (u64, Option<Timestamp>)>,
    tally: Tally,
    /// The kinds switched on for this run.
    faults: Faults,
    /// False once the faulty part of the run is over.
    faults_on: bool,
    settle_bound: Duration,
    /// Every queue: the scheduler's two, then each agent's.
    destinations: Vec<Destination>,
    /// Whether a step of the run's workflow waits for an answer from outside.
    answered: bool,
    config: Arc<EngineConfig>,
    /// Each service's record, which the agents guard, the supervisors tend and the desk holds
    /// and releases by hand.
    book: Book,
    desk: Desk,
    /// The agents of the run's workflow: its services, each with its actions.
    services: Vec<String>,
    actions: HashMap<String, Vec<String>>,
    /// Whether the seed's services misbehave over time (see [`service_faults`]), and the kind
    /// of each outage, in the order the remote was given them.
    service_faults: bool,
    outage_kinds: Vec<Fault>,
    watch: Arc<Mutex<Watch>>,
    /// When each run of a step (its direction and generation) was first seen waiting for its
    /// held service: its `max_hold` counts from then.
    first_park: HashMap<(OrderId, usize), ((Direction, u32), Timestamp)>,
    /// Each order as the last check saw it.
    previous: HashMap<OrderId, StateRecord>,
    /// Since when each service has been open, as the checks saw its record, and how many
    /// tendings of the services had ended by then.
    open_since: HashMap<String, (Timestamp, u64)>,
    /// Tendings of the services ended so far, and by the time the faults stopped.
    tends: u64,
    tends_at_stop: u64,
    /// The service each order is listed under as waiting for it, and how many tendings had
    /// ended when it was.
    listed_at: HashMap<OrderId, (Option<String>, u64)>,
    /// Service alerts checked so far, and each one seen, as (event id, state, who).
    service_alerts: usize,
    announced: HashSet<(String, String, Option<String>)>,
    /// Bus events accepted at the last check: only new ones can hold a service alert.
    bus_seen: usize,
    /// When the faults stopped.
    stopped: Option<Timestamp>,
    /// Whether the seed's services declare limits and throttle (see [`pacing`]).
    paced: bool,
    /// Each step whose request an agent kept back, by order and step: the request's attempt,
    /// when the step goes again, and until when the lease it was deferred to must stand.
    kept_back: HashMap<(OrderId, usize), (u64, Timestamp, Timestamp)>,
}

impl Sim {
    fn new(seed: u64, faults: Faults) -> Sim {
        Sim::breaking(seed, faults, Duration::ZERO)
    }

    /// A run whose supervisors' clocks read `ahead` of everyone else's.
    fn breaking(seed: u64, faults: Faults, ahead: Duration) -> Sim {
        let rng = SplitMix::seeded(seed);
        let Ports { clock, timeline, memory, queues, waits, bus, shelf, crashes } =
            Ports::new(seed, faults);
        let remote = Arc::new(MemoryRemote::new(timeline.clone()));
        // All ports share one countdown: a crash stops the handler at its n-th call, whichever
        // port that call goes to.
        let store = crashes.wrap(memory.clone());
        let outbox = crashes.wrap(queues.clone());
        let events = crashes.wrap(bus.clone());
        let payloads = crashes.wrap(shelf.clone());
        let workflow = Arc::new(workflow_of(seed));
        let child = child_workflow(seed).map(Arc::new);
        let catalogue = Arc::new(
            Catalogue::new(
                std::iter::once((*workflow).clone())
                    .chain(child.as_ref().map(|c| (**c).clone()))
                    .collect(),
            )
            .unwrap(),
        );
        let next = next_version(seed, &workflow).map(|v2| (Arc::new(v2), FAULTY_EVENTS / 2));
        let mut versions = vec![&*workflow];
        versions.extend(next.as_ref().map(|(v2, _)| &**v2));
        let misbehaving = service_faults(seed, &versions, clock.now(), faults);
        let paced = pacing(seed, &versions, faults);
        let config = Arc::new(EngineConfig {
            failure_threshold: 3,
            index_shards: 4,
            max_hold: misbehaving.as_ref().map_or(EngineConfig::default().max_hold, |m| m.max_hold),
            hold: HOLD,
            limits: paced.as_ref().map(|p| p.limits.clone()).unwrap_or_default(),
            ..EngineConfig::default()
        });
        let mut outage_kinds = Vec::new();
        for (kind, outage) in misbehaving.iter().flat_map(|m| &m.outages) {
            outage_kinds.push(*kind);
            remote.outage(outage.clone());
        }
        for throttle in paced.iter().flat_map(|p| &p.throttles) {
            remote.throttle(throttle.clone());
        }
        // Every remote behaviour is drawn from the seed, before the run starts: the steps'
        // actions first, then their undos, then those a later version adds.
        let mut draw = SplitMix::seeded(seed ^ 0x5eed);
        // Large outputs are drawn apart, so that the other behaviours are as they were.
        let mut large = SplitMix::seeded(seed ^ 0x1a56e);
        let actions_of = |w: &Workflow| -> Vec<(String, bool)> {
            let steps = w.steps().iter();
            steps
                .clone()
                .map(|s| (s.name.clone(), false))
                .chain(steps.filter_map(|s| Some((s.compensation.as_ref()?.action.clone(), true))))
                .collect()
        };
        let mut actions = actions_of(&workflow);
        if let Some((v2, _)) = &next {
            actions.extend(
                actions_of(v2).into_iter().filter(|a| !actions.contains(a)).collect::<Vec<_>>(),
            );
        }
        if let Some(child) = &child {
            actions.extend(actions_of(child));
        }
        for (action, undo) in actions {
            let script: Vec<Behaviour> =
                (0..4000).map(|_| remote_behaviour(&mut draw, &mut large, undo, faults)).collect();
            remote.script(&action, script);
        }
        let system = Assembly {
            store,
            bus: events,
            clock: clock.clone(),
            config: config.clone(),
            catalogue: catalogue.clone(),
            waits: waits.clone(),
            load: Gauges { waits: waits.clone(), depths: queues.clone() },
            payloads,
        };
        let book = Book::default();
        let watch = Arc::new(Mutex::new(Watch::default()));
        let agents = workflow
            .agents()
            .into_iter()
            .enumerate()
            .map(|(n, name)| {
                let random = SplitMix::seeded(seed.wrapping_add(n as u64));
                let reporter = format!("agent-{name}");
                let limits = config.limits_of(name.as_str());
                let watched = Watched {
                    remote: remote.clone(),
                    book: book.clone(),
                    service: name.as_str().to_owned(),
                    clock: timeline.clone(),
                    watch: watch.clone(),
                    limits,
                    times: paced
                        .as_ref()
                        .map(|_| Arc::new(SplitMix::seeded(seed ^ 0x7157 ^ n as u64))),
                };
                let agent = system
                    .on_clock(timeline.clone())
                    .agent(name, watched, outbox.clone(), random, reporter)
                    .guarded(book.clone(), name.as_str(), config.hold)
                    .limited(limits);
                (Destination::Agent(name.clone()), agent)
            })
            .collect();
        let services: Vec<String> =
            workflow.agents().into_iter().map(|a| a.as_str().to_owned()).collect();
        let service_actions = workflow
            .agents()
            .into_iter()
            .map(|a| (a.as_str().to_owned(), crate::actions_of(&versions, a)))
            .collect();
        let desk = ServiceDesk {
            book: book.clone(),
            index: memory.clone(),
            clock: clock.clone(),
            agents: workflow.agents().into_iter().cloned().collect(),
            limits: config.limits.clone(),
            actions: catalogue.actions(),
        };
        let destinations = system.destinations();
        let wiring = Wiring { system, outbox, ahead };
        let (submission, scheduler, supervisors, operator, starter) =
            wiring.services(catalogue, "c");
        let answered = workflow.steps().iter().any(|s| matches!(s.work, Work::Callback));
        let settle_bound = settle_bound(&config, &workflow)
            .max(next.as_ref().map_or(Duration::ZERO, |(v2, _)| settle_bound(&config, v2)))
            + paced.as_ref().map_or(Duration::ZERO, |p| p.settle_bound(&versions));
        // Orders of one customer run a limit at a time: the last in line starts once those
        // before it ended, each round at most a look later than its place freed (its start
        // lost, its place taken back).
        let settle_bound = match keyed(seed) {
            Some(limit) => {
                let rounds = ORDERS.div_ceil(3 * limit as usize) as u32;
                (settle_bound + sas_engine::keys::LAST_LOOK) * rounds
            }
            None => settle_bound,
        };
        // A later version keeps every step of the first (it may add some).
        let steps = next
            .as_ref()
            .map_or(&workflow, |(v2, _)| v2)
            .steps()
            .iter()
            .chain(child.iter().flat_map(|c| c.steps()))
            .map(|s| (s.name.clone(), s.compensation.as_ref().map(|c| c.action.clone())))
            .collect();
        Sim {
            seed,
            workflow: workflow.clone(),
            next,
            wiring,
            deployed: false,
            child: child.clone(),
            shelf,
            versions: HashMap::new(),
            rng,
            clock,
            memory,
            queues,
            bus,
            remote,
            crashes,
            submission,
            scheduler,
            agents,
            supervisors,
            operator,
            starter,
            events: HashMap::new(),
            unmatched: 0,
            dead_seen: 0,
            count_keys: true,
            operators: Operators::default(),
            errors: HashMap::new(),
            alerted: HashMap::new(),
            ledger_checked: 0,
            steps,
            accepted: Vec::new(),
            terminal: HashMap::new(),
            side_by_side: HashSet::new(),
            attempts: HashMap::new(),
            deadlines: HashMap::new(),
            tally: Tally::default(),
            faults,
            faults_on: true,
            settle_bound,
            destinations,
            answered,
            config,
            book,
            desk,
            services,
            actions: service_actions,
            service_faults: misbehaving.is_some(),
            outage_kinds,
            watch,
            first_park: HashMap::new(),
            previous: HashMap::new(),
            open_since: HashMap::new(),
            tends: 0,
            tends_at_stop: 0,
            listed_at: HashMap::new(),
            service_alerts: 0,
            announced: HashSet::new(),
            bus_seen: 0,
            stopped: None,
            paced: paced.is_some(),
            kept_back: HashMap::new(),
        }
    }

    /// Deploys the run's next version: the services start again with both versions, the new
    /// one current; what is in flight stays where it is.
    fn deploy(&mut self) {
        let Some((v2, _)) = &self.next else { return };
        let mut workflows = vec![(*self.workflow).clone(), (**v2).clone()];
        workflows.extend(self.child.as_ref().map(|c| (**c).clone()));
        let catalogue = Catalogue::new(workflows).unwrap();
        // The operators' desk knows the new version's actions, as the redeployed admin does.
        self.desk.actions = catalogue.actions();
        let (submission, scheduler, supervisors, operator, starter) =
            self.wiring.services(Arc::new(catalogue), "d");
        self.submission = submission;
        self.scheduler = scheduler;
        self.supervisors = supervisors;
        self.operator = operator;
        self.starter = starter;
        self.deployed = true;
    }

    /// The version of the run's workflow `version` names.
    fn workflow_of_version(&self, version: u32) -> &Workflow {
        match &self.next {
            Some((v2, _)) if v2.version() == version => v2,
            _ => &self.workflow,
        }
    }

    /// The workflow `record` runs: the run's own (in the version it started on), or its
    /// child workflow.
    fn workflow_of(&self, record: &StateRecord) -> &Workflow {
        match &self.child {
            Some(child) if child.name() == record.workflow => child,
            _ => self.workflow_of_version(record.workflow_version),
        }
    }

    /// Whether to inject `fault` now, with probability `p`. The draw is made even for a kind
    /// switched off, so that switching one kind off leaves the others' schedule alone.
    fn chance(&mut self, fault: Fault, p: f64) -> bool {
        if !self.faults_on {
            return false;
        }
        let hit = self.rng.unit() < p && self.faults.on(fault);
        if hit && fault != Fault::Crash {
            // Crashes are counted when they happen: an armed crash may find no call to stop.
            self.tally.add(fault, 1);
        }
        hit
    }

    fn pick(&self, n: usize) -> usize {
        hands::pick(&self.rng, n)
    }

    /// Arms a crash at one of the next few port calls of the handler about to run.
    fn maybe_crash(&mut self) {
        if self.chance(Fault::Crash, 0.08) {
            let at = 1 + self.pick(5) as u32;
            self.crashes.arm(at);
        }
    }

    fn disarm(&mut self) {
        self.crashes.disarm();
    }

    async fn submit(&mut self, i: usize) {
        // An input the run's workflow takes: each example's own shape, an order for the rest.
        // With a concurrency key, orders of three customers.
        let customer = if keyed(self.seed).is_some() { i % 3 } else { i };
        let body = if self.workflow.name() == "account-opening" {
            format!(
                r#"{{"customer":{{"name":"H {i}","email":"h{customer}@example.com"}},"plan":"basic"}}"#
            )
        } else {
            // Now and then as many lines as an order may have, each with a long SKU: an input
            // larger than a request carries, stored outside the order's record.
            // (Chosen by the order's number, not drawn, so that the run's draws are as they
            // would be without.)
            let large = self.faults_on && self.faults.on(Fault::LargeValue) && i % 8 == 5;
            if large {
                self.tally.add(Fault::LargeValue, 1);
            }
            let lines = if large { 50 } else { 1 };
            let items: Vec<String> = (0..lines)
                .map(|n| {
                    let sku = match lines {
                        1 => format!("SKU-{i}"),
                        _ => format!("SKU-{i}-{n}-{}", "X".repeat(40)),
                    };
                    format!(r#"{{"sku":"{sku}","quantity":1,"unit_price":100}}"#)
                })
                .collect();
            // A list of up to five parcels, for a step that runs a child for each.
            let parcels = match has_fan(self.seed) {
                true => {
                    let list: Vec<String> =
                        (0..i % 6).map(|n| format!(r#"{{"parcel":{n}}}"#)).collect();
                    format!(r#""parcels":[{}],"#, list.join(","))
                }
                false => String::new(),
            };
            let body = format!(
                r#"{{"customer_id":"c-{customer}","currency":"EUR","items":[{}],{parcels}
                "ship_to":{{"name":"N","line1":"L","city":"C","postal_code":"1","country":"FR"}}}}"#,
                items.join(",")
            );
            assert!(lines == 1 || body.len() > MAX_INLINE_INPUT_LEN, "{}", body.len());
            body
        };
        // One order in four comes as an event on the bus, which the scheduler queue holds
        // until the starter has made its order (chosen by the order's number, not drawn); one
        // in eight of those comes with an event that matches no workflow.
        if i % 4 == 1 {
            self.send_event(i, &body);
            return;
        }
        // The client retries with the same key until it is told the order is accepted.
        for _ in 0..20 {
            self.maybe_crash();
            if self.chance(Fault::Throttled, 0.05) {
                self.memory.fail_next_writes(1);
            }
            // Named: a run with a child workflow runs two.
            let workflow = Some(self.workflow.name());
            let owner = sas_engine::Owner::anonymous();
            let key = format!("sim-{i}");
            let result = self.submission.submit_to(&owner, workflow, &key, body.as_bytes()).await;
            self.disarm();
            if let Ok(accepted) = result {
                self.accepted.push(accepted.order_id);
                let current = match &self.next {
                    Some((v2, _)) if self.deployed => v2.version(),
                    _ => self.workflow.version(),
                };
                self.versions.insert(accepted.order_id, current);
                return;
            }
        }
        let workflow = Some(self.workflow.name());
        let last = self
            .submission
            .submit_to(
                &sas_engine::Owner::anonymous(),
                workflow,
                &format!("sim-{i}"),
                body.as_bytes(),
            )
            .await;
        panic!("seed {}: order {i} never accepted: {last:?}", self.seed);
    }

    /// Puts the event of order `i` on the scheduler queue, as the bus's rule does.
    fn send_event(&mut self, i: usize, body: &str) {
        let detail: serde_json::Value = serde_json::from_str(body).unwrap();
        let id = format!("ev-{i}");
        let event = serde_json::json!({"version": "0", "id": id, "source": "sim.shop",
            "detail-type": "OrderPlaced", "detail": detail});
        self.queues.send_raw(&Destination::Scheduler, event.to_string()).unwrap();
        let key = sas_engine::starts::event_key(self.workflow.name(), &id);
        let key = sas_engine::IdempotencyKey::parse(&key).unwrap();
        let order = OrderId::for_owner_key(&sas_engine::Owner::starts(), &key);
        self.events.insert(order, (id, detail));
        if i % 8 == 1 {
            let other = serde_json::json!({"version": "0", "id": format!("other-{i}"),
                "source": "sim.other", "detail-type": "OrderPlaced", "detail": {}});
            self.queues.send_raw(&Destination::Scheduler, other.to_string()).unwrap();
            self.unmatched += 1;
        }
    }

    /// Sends again the events the scheduler queue dead-lettered: delayed, and crashed in their
    /// handling, an event may reach the dead-letter list here. Deployed, a message that keeps
    /// failing for a passing cause is sent again before its receives run out
    /// (`sas_aws::batch`), and the simulation never sends a poison event.
    fn redrive_events(&mut self) {
        let dead = self.queues.dead_letters(&Destination::Scheduler);
        for body in dead.iter().skip(self.dead_seen) {
            if body.contains("\"detail-type\"") {
                self.queues.send_raw(&Destination::Scheduler, body.clone()).unwrap();
            }
        }
        self.dead_seen = dead.len();
    }

    /// Delivers one message from a random queue, with the faults the seed chooses.
    async fn deliver(&mut self) -> bool {
        self.redrive_events();
        let start = self.pick(self.destinations.len());
        for k in 0..self.destinations.len() {
            let dest = self.destinations[(start + k) % self.destinations.len()].clone();
            let batch = self.queues.receive(&dest, 10);
            if batch.is_empty() {
                continue;
            }
            let mut dice =
                Dice { rng: &self.rng, faults: self.faults, on: self.faults_on, drawn: Vec::new() };
            // Agents' batches are drawn only where the services are paced, so that other
            // seeds run as before.
            let taken = hands::take(&self.queues, &dest, batch, self.paced, &mut dice);
            for fault in dice.drawn {
                self.tally.add(fault, 1);
            }
            let d = match taken {
                Taken::Turn(taken) => {
                    self.deliver_turn(&dest, taken).await;
                    return true;
                }
                Taken::Together(taken) if dest == Destination::Replies => {
                    self.deliver_together(&dest, taken).await;
                    return true;
                }
                Taken::Together(taken) => {
                    self.handle_together(&dest, taken).await;
                    return true;
                }
                Taken::Lost => return true,
                Taken::One { delivery, duplicated } => {
                    let event = delivery.body.contains("\"detail-type\"");
                    self.tally.events_duplicated += u64::from(event && duplicated);
                    delivery
                }
            };
            if self.chance(Fault::Throttled, 0.03) {
                self.memory.fail_next_writes(1);
            }
            self.maybe_crash();
            let message = Message::decode(&d.body).unwrap();
            let before = message.order_id().and_then(|id| self.memory.peek(id));
            self.check_outputs(&message, before.as_ref());
            let incoming = Incoming { message_id: d.identity(), receive_count: d.receive_count };
            let handled = match &message {
                Message::Request(r) => {
                    self.watch.lock().unwrap().throttled.remove(&r.idempotency_key);
                    let outcome = self.agents[&dest].handle(r, incoming).await;
                    self.agent_handled(r, &outcome);
                    outcome.map(|_| ())
                }
                Message::Elements(r) => {
                    for call in &r.elements {
                        self.watch.lock().unwrap().throttled.remove(&call.idempotency_key);
                    }
                    let ended = self.agents[&dest].handle_elements(r, incoming).await;
                    self.elements_handled(r, &ended);
                    ended.map(|_| ())
                }
                Message::Event(e) => self.starter.on_event(e).await.map(|started| {
                    for s in started {
                        let refused = s.outcome.err();
                        assert!(refused.is_none(), "seed {}: {refused:?}", self.seed);
                    }
                }),
                m => self.scheduler.handle(m, incoming).await.map(|_| ()),
            };
            self.disarm();
            // Whatever the faults, the system itself never produces a poison message.
            if let Err(Error::InvalidMessage(why)) = &handled {
                panic!("seed {}: a message the system sent was refused: {why}", self.seed);
            }
            self.check_fenced(&message, &d.message_id, before.as_ref());
            if handled.is_ok() {
                let _ = self.queues.delete(&dest, &d.receipt);
            }
            return true;
        }
        false
    }

    /// A step is asked with the outputs of the steps it depends on, and of no other.
    fn check_outputs(&self, message: &Message, before: Option<&StateRecord>) {
        let (Message::Request(r), Some(record)) = (message, before) else { return };
        let upstream = self.workflow_of(record).upstream(&r.step.name);
        let stray: Vec<&String> =
            r.outputs.keys().filter(|k| !upstream.contains(k.as_str())).collect();
        assert!(
            stray.is_empty(),
            "seed {}: {} was asked with the outputs of {stray:?}, which it does not depend on",
            self.seed,
            r.step.name
        );
    }

    /// Handles up to three requests of one agent at once, as a batch of its queue is: their
    /// calls meet at their service, in its turns and its places in flight.
    async fn handle_together(&mut self, dest: &Destination, taken: Vec<Delivery>) {
        let messages: Vec<Message> =
            taken.iter().map(|d| Message::decode(&d.body).unwrap()).collect();
        for m in &messages {
            self.check_outputs(m, m.order_id().and_then(|id| self.memory.peek(id)).as_ref());
            let keys: Vec<&String> = match m {
                Message::Request(r) => vec![&r.idempotency_key],
                Message::Elements(r) => r.elements.iter().map(|c| &c.idempotency_key).collect(),
                _ => panic!("seed {}: {m:?} on {dest:?}", self.seed),
            };
            for key in keys {
                self.watch.lock().unwrap().throttled.remove(key);
            }
        }
        let agent = &self.agents[dest];
        let outcomes =
            futures_util::future::join_all(taken.iter().zip(&messages).map(|(d, m)| async move {
                let incoming =
                    Incoming { message_id: d.identity(), receive_count: d.receive_count };
                match m {
                    Message::Elements(r) => {
                        agent.handle_elements(r, incoming).await.map(AgentDid::Elements)
                    }
                    Message::Request(r) => agent.handle(r, incoming).await.map(AgentDid::Step),
                    _ => unreachable!("only requests are taken together"),
                }
            }))
            .await;
        for ((d, m), outcome) in taken.iter().zip(&messages).zip(outcomes) {
            if let Err(Error::InvalidMessage(why)) = &outcome {
                panic!("seed {}: a message the system sent was refused: {why}", self.seed);
            }
            let ok = outcome.is_ok();
            match (m, outcome) {
                (Message::Request(r), outcome) => {
                    let outcome = outcome.map(|did| match did {
                        AgentDid::Step(o) => o,
                        AgentDid::Elements(_) => unreachable!("a request answers as a step"),
                    });
                    self.agent_handled(r, &outcome);
                }
                (Message::Elements(r), outcome) => {
                    let ended = outcome.map(|did| match did {
                        AgentDid::Elements(ended) => ended,
                        AgentDid::Step(_) => unreachable!("elements answer each"),
                    });
                    self.elements_handled(r, &ended);
                }
                _ => {}
            }
            if ok {
                let _ = self.queues.delete(dest, &d.receipt);
            }
        }
    }

    /// [`Sim::agent_handled`] for each element of an elements request: none is let go right
    /// after a 429. (An element kept back keeps its step's lease, which covers it.)
    fn elements_handled(
        &mut self,
        r: &sas_engine::message::ElementsRequest,
        ended: &Result<Vec<(u32, AgentOutcome)>>,
    ) {
        let Ok(ended) = ended else { return };
        let watch = self.watch.lock().unwrap();
        for (k, outcome) in ended {
            if !matches!(outcome, AgentOutcome::GaveUp { .. } | AgentOutcome::Expired { .. }) {
                continue;
            }
            let Some(call) = r.elements.iter().find(|c| c.element == *k) else { continue };
            let throttled = watch.throttled.get(&call.idempotency_key).copied();
            assert!(
                throttled != Some(true),
                "seed {}: the agent of {} let element {k} of {} go right after a 429: {outcome:?}",
                self.seed,
                r.step.name,
                r.order_id
            );
        }
    }

    /// An agent never gives up on a request, nor lets it run out, right after a 429: it waits
    /// out the quiet its service asked for, or keeps the request back. A request kept back
    /// keeps its lease (see [`Sim::check_kept_back`]).
    fn agent_handled(&mut self, r: &StepRequest, outcome: &Result<AgentOutcome>) {
        match outcome {
            Ok(AgentOutcome::GaveUp { .. } | AgentOutcome::Expired { .. }) => {
                let watch = self.watch.lock().unwrap();
                let throttled = watch.throttled.get(&r.idempotency_key).copied();
                assert!(
                    throttled != Some(true),
                    "seed {}: the agent of {} let {} of {} go right after a 429: {outcome:?}",
                    self.seed,
                    r.step.name,
                    r.action,
                    r.order_id
                );
            }
            Ok(AgentOutcome::KeptBack { until, .. }) => {
                self.tally.kept_back += 1;
                // The step is deferred: its next lease starts at `until`, and stands for the
                // claim grace and its budget from then.
                let budget = Duration::from_millis(r.budget_ms.unwrap_or(0));
                let stands = until.plus(self.config.claim_grace).plus(budget);
                self.kept_back.insert((r.order_id, r.step.index), (r.attempt, *until, stands));
            }
            _ => {}
        }
    }

    /// A request kept back defers its step without a failure: no lease of the step is judged
    /// expired before the lease it was deferred to has run its claim grace and its budget.
    fn check_kept_back(&self, r: &StateRecord) {
        let Some(previous) = self.previous.get(&r.order_id) else { return };
        if r.revision == previous.revision || r.last_input != InputRef::Expire {
            return;
        }
        let now = self.clock.now();
        for (i, s) in r.steps.iter().enumerate() {
            let Some(&(attempt, back, stands)) = self.kept_back.get(&(r.order_id, i)) else {
                continue;
            };
            // Only a lease that came of the deferral (its reply may have been lost, and the
            // step reset as for any lost message): one that starts when the service has room.
            let before = previous.steps.get(i).and_then(|b| b.lease);
            let deferred = |l: &Lease| l.attempt > attempt && l.complete_by >= stands;
            let Some(before) = before.filter(|l| deferred(l) && now < stands) else {
                continue;
            };
            let judged = s.lease.is_some_and(|l| l.failures > before.failures)
                || matches!(&r.cause, Some(Cause::StepTimedOut { step, .. }) if *step == s.name);
            assert!(
                !judged,
                "seed {}: {} {}, its request kept back until {back}, had its lease judged expired at {now}, before {stands}",
                self.seed, r.order_id, s.name
            );
        }
    }

    /// Only the current lease of a step may change an order: a reply from an older lease that
    /// moved the record (`before` it was handled) is a stale attempt writing.
    fn check_fenced(&self, message: &Message, message_id: &str, before: Option<&StateRecord>) {
        let (Message::Reply(reply), Some(before)) = (message, before) else { return };
        let after = self.memory.peek(reply.order_id).unwrap();
        // (A redelivery of the message that wrote `before` only finishes its effects, such as
        // recording that its alert went out.)
        let moved_by_it = after.revision > before.revision
            && after.last_input.is_message(message_id)
            && !before.last_input.is_message(message_id);
        let held = before.steps.get(reply.step.index).and_then(|s| s.sent().copied());
        assert!(
            !moved_by_it || held.is_some_and(|l| l.attempt == reply.attempt),
            "seed {}: a reply of attempt {} changed {} whose step {} held {held:?}",
            self.seed,
            reply.attempt,
            reply.order_id,
            reply.step.name,
        );
    }

    /// Handles one order's messages of a batch in one turn, as the deployed scheduler does:
    /// what they do is written at once, and a crash may stop it at any of its port calls.
    async fn deliver_turn(&mut self, dest: &Destination, taken: Vec<Delivery>) {
        let messages: Vec<Message> =
            taken.iter().map(|d| Message::decode(&d.body).unwrap()).collect();
        let before = messages[0].order_id().and_then(|id| self.memory.peek(id));
        let turn = hands::incoming(&taken, &messages);
        self.maybe_crash();
        let handled = self.scheduler.handle_turn(&turn).await;
        self.disarm();
        for ((d, m), handled) in taken.iter().zip(&messages).zip(handled) {
            if let Err(Error::InvalidMessage(why)) = &handled {
                panic!("seed {}: a message the system sent was refused: {why}", self.seed);
            }
            self.check_fenced(m, &d.message_id, before.as_ref());
            if handled.is_ok() {
                let _ = self.queues.delete(dest, &d.receipt);
            }
        }
    }

    /// Handles up to three replies at once, as the scheduler handles a batch: their writes meet
    /// when they are for one order's steps side by side, and none may be lost for it.
    async fn deliver_together(&mut self, dest: &Destination, taken: Vec<Delivery>) {
        let messages: Vec<Message> =
            taken.iter().map(|d| Message::decode(&d.body).unwrap()).collect();
        let befores: Vec<Option<StateRecord>> =
            messages.iter().map(|m| m.order_id().and_then(|id| self.memory.peek(id))).collect();
        let scheduler = &self.scheduler;
        let handled =
            futures_util::future::join_all(taken.iter().zip(&messages).map(|(d, m)| async move {
                let incoming =
                    Incoming { message_id: d.identity(), receive_count: d.receive_count };
                scheduler.handle(m, incoming).await
            }))
            .await;
        for (((d, m), before), handled) in taken.iter().zip(&messages).zip(&befores).zip(handled) {
            if let Err(Error::InvalidMessage(why)) = &handled {
                panic!("seed {}: a message the system sent was refused: {why}", self.seed);
            }
            self.check_fenced(m, &d.message_id, before.as_ref());
            // A reply done with while its lease still holds it was dropped, not judged.
            if let (Ok(_), Message::Reply(reply)) = (&handled, m) {
                let after = self.memory.peek(reply.order_id).unwrap();
                let held = after.steps.get(reply.step.index).and_then(|s| s.sent().copied());
                assert!(
                    held.is_none_or(|l| l.attempt != reply.attempt),
                    "seed {}: the reply of {} to {} was let go while its lease waits for it",
                    self.seed,
                    reply.step.name,
                    reply.order_id
                );
            }
            if handled.is_ok() {
                let _ = self.queues.delete(dest, &d.receipt);
            }
        }
    }

    /// A step is started only once every step it depends on is passed, and undone only once
    /// every step that depends on it is settled.
    fn check_order_of_steps(&self, r: &StateRecord) {
        let workflow = self.workflow_of(r);
        let status = |name: &str| r.steps.iter().find(|s| s.name == name);
        for (_, step, _) in r.leased() {
            let (ahead, broken) = match r.phase {
                Phase::Forward => (workflow.upstream(&step.name), "before a step it depends on"),
                Phase::Compensating => {
                    (workflow.downstream(&step.name), "while a step depending on it waits to be")
                }
            };
            for other in ahead {
                let other = status(other).unwrap();
                let fine = match r.phase {
                    Phase::Forward => other.passed(),
                    Phase::Compensating => other.status != StepStatus::ToUndo,
                };
                assert!(
                    fine,
                    "seed {}: {} {:?} {} {broken}: {} is {:?}",
                    self.seed, r.order_id, r.phase, step.name, other.name, other.status
                );
            }
        }
    }

    /// One run of the supervisor: its sweep, then its tending of the services.
    async fn sweep(&mut self) {
        if self.chance(Fault::DoubleSweep, 0.2) {
            // Two supervisors at once: every port call yields, so their reads and writes
            // interleave.
            let (a, b) = (&self.supervisors[0], &self.supervisors[1]);
            let book = &self.book;
            let ((ra, ta), (rb, tb)) = futures_util::future::join(
                async {
                    let swept = a.sweep().await;
                    let flowing = flowing(&swept);
                    (swept, (a.tend(book, flowing).await, flowing))
                },
                async {
                    let swept = b.sweep().await;
                    let flowing = flowing(&swept);
                    (swept, (b.tend(book, flowing).await, flowing))
                },
            )
            .await;
            self.judge(ra);
            self.judge(rb);
            self.tended(ta.0, ta.1);
            self.tended(tb.0, tb.1);
        } else {
            self.maybe_crash();
            let report = self.supervisors[0].sweep().await;
            let flowing = flowing(&report);
            let tended = self.supervisors[0].tend(&self.book, flowing).await;
            self.disarm();
            self.judge(report);
            self.tended(tended, flowing);
        }
    }

    /// Tending the services fails (on some orders) only while faults are injected. A tending
    /// that could `resume` (its sweep found the queues flowing) counts as the one an open
    /// service's waiting orders are due at.
    fn tended(&mut self, report: Result<ServicesReport>, resume: bool) {
        let seed = self.seed;
        match report {
            Ok(report) => {
                assert!(
                    self.faults_on || report.errors == 0,
                    "seed {seed}: tending the services without faults failed: {report:?}"
                );
                self.tally.resumed += report.resumed as u64;
                if resume {
                    self.tends += 1;
                }
            }
            Err(e) => assert!(self.faults_on && e.is_retryable(), "seed {seed}: tend failed: {e}"),
        }
    }

    /// An operator holds a service by hand (a maintenance window), or one action of it, or
    /// releases a hold (see [`hands::hold_by_hand`]).
    async fn hold_by_hand(&mut self) {
        let done = hands::hold_by_hand(&self.desk, &self.clock, &self.rng, &self.services).await;
        done.unwrap_or_else(|e| panic!("seed {}: {e}", self.seed));
    }

    /// Once the faults stop, the operator releases what it holds.
    async fn release_by_hand(&mut self) {
        let done = hands::release_by_hand(&self.desk).await;
        done.unwrap_or_else(|e| panic!("seed {}: {e}", self.seed));
    }

    /// A sweep never meets a record it cannot judge, and fails (whole or on some records) only
    /// while faults are injected.
    fn judge(&mut self, report: Result<SweepReport>) {
        let seed = self.seed;
        let report = match report {
            Ok(report) => report,
            Err(e) => {
                assert!(self.faults_on && e.is_retryable(), "seed {seed}: sweep failed: {e}");
                return;
            }
        };
        assert_eq!(report.illegal, 0, "seed {seed}: a record the machine cannot judge: {report:?}");
        assert!(
            self.faults_on || report.errors == 0,
            "seed {seed}: a sweep without faults failed on records: {report:?}"
        );
        assert!(report.ignored + report.acted + report.lost_races + report.errors <= report.found);
        self.tally.races_lost += report.lost_races as u64;
    }

    /// An operator's command on a random accepted order. Now and then it is a command sent
    /// before, again (a tool retrying a call it is unsure went through).
    async fn operate(&mut self) {
        if self.accepted.is_empty() {
            return;
        }
        let id = self.accepted[self.pick(self.accepted.len())];
        let state = self.memory.peek(id).map(|r| {
            let undo_failed = r.steps.iter().any(|s| s.status == StepStatus::UndoFailed);
            (r.process_state, undo_failed)
        });
        let (kind, command_id) = self.operators.choose(id, state, &self.rng);
        self.maybe_crash();
        self.command(id, kind, &command_id).await;
        self.disarm();
    }

    async fn command(&mut self, id: OrderId, kind: CommandKind, command_id: &str) {
        let command = Command::new(kind, command_id, "sim-operator", "simulated").unwrap();
        match self.operator.command(id, &command).await {
            Ok(Some(Commanded { applied: Applied::Refused(_), .. })) => {
                self.tally.commands_refused += 1;
            }
            Ok(Some(_)) => self.tally.commands_applied += 1,
            Ok(None) => panic!("seed {}: accepted order {id} not found", self.seed),
            // The operator's handler died (an injected crash) or lost its write races.
            Err(e) => assert!(e.is_retryable(), "seed {}: command failed: {e}", self.seed),
        }
    }

    /// The party outside answers a step announced as waiting for it: mostly with the token of
    /// its announcement (an old one, for a step announced again since), sometimes with a forged
    /// one, sometimes as an operator without one. An answer counts only if the step waited
    /// for it right then, under that very token.
    async fn answer(&mut self) {
        let announced = self.bus.of_type(CALLBACK_DETAIL_TYPE);
        if announced.is_empty() {
            return;
        }
        let a = &announced[self.pick(announced.len())];
        let output = serde_json::json!({"answered": "sim"});
        let (id, step, token, answering) = hands::answer_to(a, &self.rng, output).unwrap();
        let before = self.memory.peek(id).unwrap();
        self.maybe_crash();
        let result = self.operator.answer(id, &answering).await;
        self.disarm();
        let seed = self.seed;
        match result {
            Ok(Some(Commanded { applied: Applied::Now, .. })) => {
                // No stale, repeated or forged answer is applied.
                let taken = hands::check_answer_taken(&before, &step, token.as_deref());
                taken.unwrap_or_else(|e| panic!("seed {seed}: {e}"));
                self.tally.answers_applied += 1;
            }
            Ok(Some(Commanded { applied: Applied::Refused(_), .. })) => {
                self.tally.answers_refused += 1;
            }
            Ok(Some(_)) => {}
            Ok(None) => panic!("seed {seed}: announced order {id} not found"),
            Err(e) => assert!(e.is_retryable(), "seed {seed}: answer failed: {e}"),
        }
    }

    /// Once the faults stop, the operator resumes every order it paused.
    async fn resume_paused(&mut self) {
        // In order of id: the store's own order changes from run to run, and a seed must not.
        let mut records = self.memory.records();
        records.sort_by_key(|r| r.order_id);
        for r in records {
            if r.process_state == ProcessState::Paused {
                let command_id = self.operators.next_id();
                self.command(r.order_id, CommandKind::Resume, &command_id).await;
            }
        }
    }

    /// The invariants, after every event.
    fn check(&mut self) {
        let seed = self.seed;
        self.check_services();
        let records: HashMap<OrderId, StateRecord> =
            self.memory.records().into_iter().map(|r| (r.order_id, r)).collect();
        let stored = self.memory.orders();
        // An order an event started is the one its id names, at once.
        for o in stored.iter().filter(|o| started_by_event(o)) {
            let key = o.idempotency_key.as_str();
            let expected = self.events.contains_key(&o.order_id);
            assert!(expected, "seed {seed}: an order {key} no event should have started");
        }
        let orders: HashSet<OrderId> = stored.into_iter().map(|o| o.order_id).collect();
        // No half-written order but one whose event is still to be handled again; no accepted
        // order lost. An event's order is accepted once it is written whole.
        let half: Vec<&OrderId> = orders.iter().filter(|id| !records.contains_key(id)).collect();
        assert!(
            half.iter().all(|id| self.events.contains_key(id)),
            "seed {seed}: half-written order {half:?}"
        );
        assert!(
            records.keys().all(|id| orders.contains(id)),
            "seed {seed}: a record without its order"
        );
        for (id, r) in &records {
            if self.events.contains_key(id) && !self.versions.contains_key(id) {
                self.accepted.push(*id);
                self.versions.insert(*id, r.workflow_version);
            }
        }
        for id in &self.accepted {
            assert!(records.contains_key(id), "seed {seed}: accepted order {id} lost");
        }
        for (id, r) in &records {
            r.check().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            // An order keeps the version it started on, and that version's steps.
            if let Some(&version) = self.versions.get(id) {
                assert_eq!(r.workflow_version, version, "seed {seed}: {id} changed version");
                let names: Vec<&str> = self
                    .workflow_of_version(version)
                    .steps()
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect();
                let steps: Vec<&str> = r.steps.iter().map(|s| s.name.as_str()).collect();
                assert_eq!(steps, names, "seed {seed}: {id} runs steps of another version");
            }
            // Leases only move forward: a stale attempt never writes.
            let last = self.attempts.entry(*id).or_insert(0);
            assert!(r.attempt >= *last, "seed {seed}: {id} attempt went back");
            *last = r.attempt;
            // At most one live lease: the supervisor may take a lease or a claim away (reset,
            // retry, or move on to compensation) only once it has ended; the index may find
            // the order earlier than that, never act on it earlier.
            if let Some(&(revision, deadline)) = self.deadlines.get(id) {
                if r.revision > revision && r.last_input == InputRef::Expire {
                    assert!(
                        deadline.is_some_and(|d| d <= self.clock.now()),
                        "seed {seed}: {id} expired at revision {} before its CompleteBy {deadline:?}",
                        r.revision
                    );
                }
            }
            self.deadlines.insert(*id, (r.revision, r.earliest_lease().or(r.complete_by)));
            self.check_order_of_steps(r);
            self.check_kept_back(r);
            self.check_holds(r);
            if r.leased().filter(|(_, _, l)| l.sent).count() > 1
                && self.side_by_side.insert((*id, r.phase))
            {
                match r.phase {
                    Phase::Forward => self.tally.side_by_side += 1,
                    Phase::Compensating => self.tally.undone_side_by_side += 1,
                }
            }
            // Terminal states move only by an operator's redrive, or, for a Processed order, an
            // operator's undo (an Error record otherwise only records its alert as sent).
            let undone = self.terminal.get(id).is_some_and(|before| {
                before.process_state == ProcessState::Processed
                    && r.commands.len() > before.commands.len()
                    && r.commands.last().is_some_and(|c| c.command == CommandKind::Undo)
                    && matches!(r.last_input, InputRef::Command(_))
            });
            if undone {
                // Undone at once (nothing it did has an undo) or going back over its steps.
                self.terminal.remove(id);
                self.tally.undone += 1;
            }
            if let Some(before) = self.terminal.get(id) {
                if r.is_terminal() {
                    assert_eq!(
                        r.process_state, before.process_state,
                        "seed {seed}: {id} left a terminal state"
                    );
                    assert_eq!(r.steps, before.steps, "seed {seed}: {id} changed after it ended");
                    if r.alert == Some(AlertDelivery::Sent) && before.alert != r.alert {
                        *self.alerted.entry(*id).or_default() += 1;
                        self.terminal.insert(*id, r.clone());
                    }
                } else {
                    assert!(
                        r.redrives > before.redrives
                            && matches!(r.last_input, InputRef::Command(_)),
                        "seed {seed}: {id} left {:?} without an operator's redrive",
                        before.process_state
                    );
                    self.terminal.remove(id);
                }
            } else if r.is_terminal() {
                if r.alert.is_some() {
                    *self.errors.entry(*id).or_default() += 1;
                    if r.alert == Some(AlertDelivery::Sent) {
                        *self.alerted.entry(*id).or_default() += 1;
                    }
                }
                if r.redrives > 0 && r.process_state == ProcessState::Processed {
                    self.tally.redriven_to_the_end += 1;
                }
                if r.process_state == ProcessState::Processed && r.alert.is_some() {
                    self.tally.processed_with_reports += 1;
                }
                if r.process_state == ProcessState::Processed {
                    let waits = r.steps.iter().filter(|s| s.wake_at.is_some()).count();
                    self.tally.waits_over += waits as u64;
                }
                let unanswered = r.steps.iter().filter(|s| {
                    s.detail.as_deref().is_some_and(|d| d.starts_with("no answer within"))
                });
                self.tally.unanswered += unanswered.count() as u64;
                if self.deployed && r.workflow_version == self.workflow.version() {
                    self.tally.ended_on_old_version += 1;
                }
                self.terminal.insert(*id, r.clone());
            }
        }
        // Of all the runs of one step of one order, whatever their keys, at most one has its
        // effect in place (done, and not undone). Only a ledger change can change that.
        let ledger_len = self.remote.ledger_len();
        if ledger_len != self.ledger_checked {
            self.ledger_checked = ledger_len;
            for ((order, step), n) in self.remote.in_place(&self.steps) {
                assert!(
                    (0..=1).contains(&n),
                    "seed {seed}: {order} has {step} in place {n} times\n{:#?}",
                    self.remote.ledger().iter().filter(|e| e.order_id == order).collect::<Vec<_>>()
                );
            }
        }
        // And each key took effect at most once.
        let most = if self.count_keys { self.remote.max_applications() } else { 0 };
        assert!(most <= 1, "seed {seed}: an effect applied twice");
        self.check_keys(&records);
    }

    /// No more orders of a customer run than its workflow's limit: each runs only while it
    /// holds one of its key's places, and a key never has more places taken than its limit.
    fn check_keys(&mut self, records: &HashMap<OrderId, StateRecord>) {
        let (seed, Some(limit)) = (self.seed, keyed(self.seed)) else { return };
        let slots: HashMap<String, sas_engine::keys::Slots> =
            self.memory.all_slots().into_iter().map(|s| (s.key.clone(), s)).collect();
        for s in slots.values() {
            assert!(
                s.running.len() <= limit as usize,
                "seed {seed}: {} places of {} taken, over its limit of {limit}",
                s.running.len(),
                s.key
            );
        }
        let mut running: HashMap<&str, Vec<OrderId>> = HashMap::new();
        for (id, r) in records {
            let Some(slot) = r.slot.as_ref().filter(|s| s.admitted && !r.is_terminal()) else {
                continue;
            };
            let held =
                slots.get(&slot.key).is_some_and(|s| s.running.contains_key(&slot.place(*id)));
            assert!(held, "seed {seed}: {id} runs for {} without its place", slot.key);
            running.entry(&slot.key).or_default().push(*id);
        }
        for (key, ids) in running {
            assert!(
                ids.len() <= limit as usize,
                "seed {seed}: {} orders of {key} running at once: {ids:?}",
                ids.len()
            );
            if ids.len() == limit as usize {
                self.tally.keys_full += 1;
            }
        }
        self.tally.in_line += records.values().filter(|r| r.waits_in_line()).count() as u64;
    }

    /// Once every order ended, every place was given back and nobody is left in line.
    fn check_keys_at_end(&self) {
        let seed = self.seed;
        for s in self.memory.all_slots() {
            assert!(
                s.running.is_empty(),
                "seed {seed}: places of {} never given back: {:?}",
                s.key,
                s.running
            );
        }
        let lines = self.memory.lines();
        assert!(lines.is_empty(), "seed {seed}: left in line: {lines:?}");
    }

    /// Nothing but its probe reaches a held action (calls in the first [`FRESH`] of a hold
    /// aside); what is held is what is down: an agent holds one action, never for refusals,
    /// and a probe's answer opens only the action it tried; and each change of a service's
    /// record is announced at most once.
    fn check_services(&mut self) {
        let seed = self.seed;
        let now = self.clock.now();
        let records = self.book.records();
        {
            let watch = self.watch.lock().unwrap();
            assert!(watch.intruders.is_empty(), "seed {seed}: {}", watch.intruders[0]);
            assert!(watch.overruns.is_empty(), "seed {seed}: {}", watch.overruns[0]);
            for r in &records {
                for (on, scope) in r.scopes() {
                    let key = hold_key(&r.service, on);
                    if let Some(hold) = scope.held.as_ref().filter(|h| h.by.is_none()) {
                        assert!(on.is_some(), "seed {seed}: the agent held all of {key}: {hold:?}");
                        let refused = ["refused", "cancelled: already compensated", "AccessDenied"];
                        assert!(
                            !refused.iter().any(|r| hold.reason.contains(r)),
                            "seed {seed}: {key} held for refusals: {}",
                            hold.reason
                        );
                    }
                    let Some(release) = scope.released.as_ref().filter(|r| r.by.is_none()) else {
                        continue;
                    };
                    let answered = watch.answered.get(&key);
                    assert!(
                        answered.is_some_and(|at| *at >= release.held_since),
                        "seed {seed}: {key} opened by a probe at {} s, though no call of it was answered since its hold began {} s before",
                        release.at.until(now).as_secs(),
                        release.held_since.until(now).as_secs()
                    );
                }
            }
        }
        // Each hold's orders wait while it, or the whole service, is held.
        let mut open = HashSet::new();
        for service in &self.services {
            let record = records.iter().find(|r| &r.service == service);
            let whole = record.is_some_and(|r| r.whole.held.is_some());
            let actions = &self.actions[service];
            let scopes = std::iter::once(None).chain(actions.iter().map(|a| Some(a.as_str())));
            for on in scopes {
                let held = record.and_then(|r| r.scope(on)).is_some_and(|s| s.held.is_some());
                if !held && (on.is_none() || !whole) {
                    open.insert(hold_key(service, on));
                }
            }
        }
        self.open_since.retain(|key, _| open.contains(key));
        for key in open {
            self.open_since.entry(key).or_insert((now, self.tends));
        }
        let published = self.bus.count();
        if published == self.bus_seen {
            return;
        }
        self.bus_seen = published;
        let alerts = self.bus.of_type(SERVICE_DETAIL_TYPE);
        for a in &alerts[self.service_alerts..] {
            let state = a["state"].as_str().unwrap_or_default().to_owned();
            let event_id = a["event_id"].as_str().unwrap_or_default().to_owned();
            let by = a["by"].as_str().map(str::to_owned);
            assert!(
                self.announced.insert((event_id, state.clone(), by)),
                "seed {seed}: a change of {} announced twice: {a}",
                a["service"]
            );
            match state.as_str() {
                "held" => self.tally.holds_announced += 1,
                "still_held" => self.tally.overdue_announced += 1,
                _ => self.tally.releases_announced += 1,
            }
        }
        self.service_alerts = alerts.len();
    }

    /// A step waits for its held service with nothing counted against it, and fails for it
    /// only once it has waited its whole `max_hold` (counted from when this run of it was first
    /// seen waiting); anything else that ends its wait is a resume or an operator's command.
    /// Once the faults stop, an order waits no longer than it takes the supervisor to find the
    /// service it waits for open.
    fn check_holds(&mut self, r: &StateRecord) {
        let seed = self.seed;
        let id = r.order_id;
        let now = self.clock.now();
        let workflow = self.workflow_of(r);
        let stack = self.config.max_hold;
        let max_holds: Vec<Duration> = r
            .steps
            .iter()
            .map(|s| workflow.step_named(&s.name).map_or(stack, |w| w.max_hold(stack)))
            .collect();
        // A pass run inline calls its child's step, and undoes the elements that need it on
        // the way: either action of it may be held.
        let child = self.child.as_ref().and_then(|c| c.inline_step());
        let own_actions: Vec<Vec<String>> = r
            .steps
            .iter()
            .map(|s| match (s.fan.as_ref().and_then(|f| f.inline), child) {
                (Some(_), Some(step)) => [Direction::Do, Direction::Undo]
                    .iter()
                    .filter_map(|d| Some(step.action(*d)?.0.to_owned()))
                    .collect(),
                _ => workflow
                    .step_named(&s.name)
                    .and_then(|step| Some(step.action(s.direction())?.0.to_owned()))
                    .into_iter()
                    .collect(),
            })
            .collect();
        let previous = self.previous.insert(id, r.clone());
        let by_command = matches!(r.last_input, InputRef::Command(_));
        let stopping = previous.as_ref().is_some_and(|p| p.phase == Phase::Forward)
            && (r.cause.is_some() || r.stop.is_some() || r.process_state == ProcessState::Paused);
        for (i, s) in r.steps.iter().enumerate() {
            let key = (id, i);
            let run = (s.direction(), s.generation);
            let parked = s.lease.is_some_and(|l| l.held);
            let before = previous.as_ref().and_then(|p| p.steps.get(i));
            let was = before.is_some_and(|b| b.lease.is_some_and(|l| l.held));
            let stayed_held = s.detail.as_deref().is_some_and(|d| d.ends_with("which stayed held"));
            let too_long = stayed_held && before.is_none_or(|b| b.detail != s.detail);
            let same_run = before.is_some_and(|b| (b.direction(), b.generation) == run);
            if was && !parked && !by_command {
                let held = self.first_park.get(&key).map(|(_, at)| at.until(now));
                if s.lease.is_some() && same_run {
                    let failures = |l: Option<sas_engine::state::Lease>| l.map(|l| l.failures);
                    assert_eq!(
                        failures(s.lease),
                        failures(before.and_then(|b| b.lease)),
                        "seed {seed}: {id} {} resumed with a failure counted for its wait",
                        s.name
                    );
                } else if stayed_held {
                    assert!(
                        held.is_some_and(|h| h >= max_holds[i]),
                        "seed {seed}: {id} {} failed held too long after {held:?}, its max_hold {:?}",
                        s.name,
                        max_holds[i]
                    );
                    self.tally.held_too_long += 1;
                } else if s.fan.as_ref().is_some_and(|f| f.inline.is_some())
                    && s.ends_by.is_some_and(|end| end <= now)
                {
                    // A list run inline waits for its held service within its own timeout.
                    assert!(
                        s.detail.as_deref().is_some_and(|d| d.contains("did not end within")),
                        "seed {seed}: {id} {} ended its wait past its timeout otherwise: {:?}",
                        s.name,
                        s.detail
                    );
                    self.tally.held_past_timeout += 1;
                } else {
                    // An order that stops takes back what waits to be sent, held steps too.
                    assert!(
                        stopping && r.cause.as_ref().and_then(Cause::step) != Some(s.name.as_str()),
                        "seed {seed}: {id} {} ended its wait for its service {:?} after {held:?}, neither resumed, nor held past its max_hold {:?}, nor taken back by a stop: {:?}",
                        s.name,
                        s.status,
                        max_holds[i],
                        s.detail
                    );
                }
            } else if too_long && !was {
                panic!("seed {seed}: {id} {} failed held too long without waiting", s.name);
            } else if was && parked {
                assert_eq!(
                    s.lease.map(|l| l.failures),
                    before.and_then(|b| b.lease).map(|l| l.failures),
                    "seed {seed}: {id} {} counted a failure while it waited for its service",
                    s.name
                );
            }
            match s.lease {
                None => {
                    self.first_park.remove(&key);
                }
                Some(lease) => {
                    if self.first_park.get(&key).is_some_and(|(seen, _)| *seen != run) {
                        self.first_park.remove(&key);
                    }
                    if lease.held && !self.first_park.contains_key(&key) {
                        self.first_park.insert(key, (run, now));
                        self.tally.parked += 1;
                        // It waits for the whole service, or for its own action: never for
                        // another action held while its own answers.
                        let own = &own_actions[i];
                        let on = s.held.as_ref().and_then(|h| h.action.as_deref());
                        assert!(
                            on.is_none_or(|on| own.iter().any(|a| a == on)),
                            "seed {seed}: {id} {} ({own:?}) waits for a hold of {on:?}",
                            s.name
                        );
                    }
                }
            }
        }
        // An order is listed under the service it waits for (the one it first waited for, of
        // two): the first tending once that is open and the order listed resumes it. A step may
        // start waiting after its service opened (its agent's answer was on its way).
        let listed = r.held_on().map(|h| h.key());
        if self.listed_at.get(&id).map(|(service, _)| service) != Some(&listed) {
            self.listed_at.insert(id, (listed, self.tends));
        }
        if self.faults_on || !r.process_state.is_in_flight() {
            return;
        }
        if let Some(held) = r.held_on() {
            if let Some(&(open, tends)) = self.open_since.get(&held.key()) {
                let from = self.stopped.map_or(open, |stopped| open.max(stopped));
                let listed = self.listed_at.get(&id).map_or(0, |(_, at)| *at);
                assert!(
                    self.tends <= tends.max(listed).max(self.tends_at_stop),
                    "seed {seed}: {id} still waits for {}, open for {} s since the faults stopped",
                    held.key(),
                    from.until(now).as_secs()
                );
            }
        }
    }

    /// Once the faults stop, every hold and release is announced, and the last alert of each
    /// thing ever held (a service, or one action of it) tells its state.
    fn check_announced(&self) {
        let seed = self.seed;
        let alerts = self.bus.of_type(SERVICE_DETAIL_TYPE);
        for record in self.book.records() {
            assert!(!record.unannounced(), "seed {seed}: {} left unannounced", record.service);
            for (on, scope) in record.scopes() {
                let key = hold_key(&record.service, on);
                let last = alerts.iter().rev().find(|a| {
                    a["service"] == record.service.as_str() && a["action"].as_str() == on
                });
                let states: &[&str] = match (&scope.held, &scope.released) {
                    (Some(hold), _) if hold.overdue => &["still_held"],
                    (Some(_), _) => &["held"],
                    (None, Some(_)) => &["open"],
                    (None, None) => {
                        // Never held: the record keeps a quiet the service asked for, or the
                        // holds of its actions.
                        assert!(last.is_none(), "seed {seed}: {key} announced, never held");
                        continue;
                    }
                };
                let told = last.and_then(|a| a["state"].as_str());
                assert!(
                    told.is_some_and(|t| states.contains(&t)),
                    "seed {seed}: the last alert of {key} ({told:?}) does not tell its state {states:?}"
                );
            }
        }
    }

    async fn run(&mut self) -> Tally {
        // Half the orders arrive at once, so that many messages are in flight together; the
        // rest all through the faulty part, the last shortly before it ends, so that some are
        // mid-flight when the faults stop.
        let (burst, spread) = (ORDERS / 2, FAULTY_EVENTS - 40);
        let mut submitted = 0;
        for event in 0..FAULTY_EVENTS {
            if self.next.as_ref().is_some_and(|(_, at)| *at == event) {
                self.deploy();
            }
            while submitted < ORDERS
                && (submitted < burst || event >= (submitted - burst) * spread / (ORDERS - burst))
            {
                self.submit(submitted).await;
                submitted += 1;
                self.check();
            }
            match self.pick(20) {
                0..=13 => {
                    self.deliver().await;
                }
                14..=17 => self.clock.advance(Duration::from_millis(self.pick(20_000) as u64)),
                _ => self.sweep().await,
            }
            self.check();
            if self.chance(Fault::Operator, 0.04) {
                self.operate().await;
                self.check();
            }
            // Drawn only where a step waits for an answer, so that other seeds run as before.
            if self.answered && self.chance(Fault::Answer, 0.06) {
                self.answer().await;
                self.check();
            }
            // Drawn only where the services misbehave, so that other seeds run as before.
            if self.service_faults && self.chance(Fault::ManualHold, 0.02) {
                self.hold_by_hand().await;
                self.check();
            }
        }
        // Faults stop (the remote services keep their scripted behaviour): the system must
        // finish every order within the bound. What the faults armed and no call took yet (a
        // throttle for a delivery whose handling wrote nothing, a crash) is disarmed with them.
        // The outages end, and the operator releases the services it holds.
        self.faults_on = false;
        self.memory.fail_next_writes(0);
        self.disarm();
        self.remote.end_outages();
        self.remote.end_throttling();
        self.release_by_hand().await;
        let stopped = self.clock.now();
        self.stopped = Some(stopped);
        self.tends_at_stop = self.tends;
        self.check();
        let stop = stopped.plus(self.settle_bound);
        while !self.finished() {
            self.resume_paused().await;
            self.check();
            if self.clock.now() >= stop {
                for (id, _) in self.unfinished() {
                    eprintln!("{:#?}", self.memory.peek(id));
                }
                eprintln!(
                    "places: {:#?}\nlines: {:#?}",
                    self.memory.all_slots(),
                    self.memory.lines()
                );
            }
            assert!(
                self.clock.now() < stop,
                "seed {}: orders still in flight {:?} after the faults stopped: {:?}",
                self.seed,
                self.settle_bound,
                self.unfinished()
            );
            while self.deliver().await {
                self.check();
            }
            self.clock.advance(SWEEP_EVERY);
            self.sweep().await;
            self.check();
        }
        // An alert whose publishing failed while the faults ran goes again once its
        // announcement's time runs out.
        let tended = self.supervisors[0].tend(&self.book, true).await;
        self.tended(tended, true);
        if self.book.records().iter().any(|r| r.unannounced()) {
            self.clock.advance(self.config.alert_retry_after);
            let tended = self.supervisors[0].tend(&self.book, true).await;
            self.tended(tended, true);
        }
        self.check();
        self.check_announced();
        self.check_outcomes();
        self.check_keys_at_end();
        self.check_children();
        self.check_events().await;
        let settled = stopped.until(self.clock.now());
        self.tally.longest_settle = settled;
        self.tally.add(Fault::Crash, self.crashes.count().into());
        self.tally.add(Fault::IndexLag, self.memory.stats().stale_index_queries);
        self.tally.add(Fault::StaleRead, self.memory.stats().stale_reads);
        let remote = self.remote.faults();
        self.tally.add(Fault::RemoteTransient, remote.transient.into());
        self.tally.add(Fault::RemotePermanent, remote.permanent.into());
        self.tally.add(Fault::LostAnswer, remote.lost_answers.into());
        self.tally.add(Fault::Timeout, remote.timeouts.into());
        self.tally.add(Fault::OversizeOutput, remote.oversize.into());
        self.tally.add(Fault::LargeValue, remote.large.into());
        self.tally.add(Fault::RemoteThrottled, remote.throttled.into());
        for ((_, failed), kind) in self.remote.outages().into_iter().zip(&self.outage_kinds) {
            if failed > 0 {
                self.tally.add(*kind, 1);
            }
        }
        let watch = self.watch.lock().unwrap();
        self.tally.probes = watch.probed;
        self.tally.late_calls = watch.late;
        self.tally.beside_holds = watch.beside_holds;
        self.tally.paced_seeds = u64::from(self.paced);
        self.tally.limited_calls = watch.limited_calls;
        self.tally.full_seconds = watch.full_seconds;
        self.tally.full_places = watch.full_places;
        self.tally.learned_calls = watch.learned_calls;
        drop(watch);
        self.tally
    }

    fn finished(&self) -> bool {
        let started = self.events.keys().all(|id| self.memory.peek(*id).is_some());
        started && self.memory.records().iter().all(|r| r.is_terminal() && r.complete_by.is_none())
    }

    fn unfinished(&self) -> Vec<(OrderId, ProcessState)> {
        self.memory
            .records()
            .into_iter()
            .filter(|r| !(r.is_terminal() && r.complete_by.is_none()))
            .map(|r| (r.order_id, r.process_state))
            .chain(
                (self.events.keys().filter(|id| self.memory.peek(**id).is_none()))
                    .map(|id| (*id, ProcessState::Pending)),
            )
            .collect()
    }

    /// Every event that matches the run's workflow started exactly its one order, whose owner
    /// is the starts', whose key is the event's id and whose input is the event's detail,
    /// however often it was delivered; an event that matches nothing started none.
    async fn check_events(&mut self) {
        let seed = self.seed;
        let by_events: Vec<OrderRecord> =
            self.memory.orders().into_iter().filter(started_by_event).collect();
        for o in &by_events {
            let Some((id, detail)) = self.events.get(&o.order_id) else {
                panic!(
                    "seed {seed}: an order {} no event should have started",
                    o.idempotency_key.as_str()
                )
            };
            let key = sas_engine::starts::event_key(self.workflow.name(), id);
            assert_eq!(o.idempotency_key.as_str(), key, "seed {seed}");
            let input = payload::resolve(&self.shelf, o.order_id, &o.order.0).await.unwrap();
            assert_eq!(&input, detail, "seed {seed}: {id} started an order of another input");
        }
        assert_eq!(by_events.len(), self.events.len(), "seed {seed}: orders started by events");
        self.tally.started_by_events += by_events.len() as u64;
        self.tally.unmatched_events += self.unmatched;
    }

    /// What the business sees at the end: processed orders kept every effect of their last run
    /// and nothing of earlier ones; compensated and cancelled ones undid every effect; each
    /// time an order reached Error it raised one distinct alert, and a cancelled order none of
    /// its own.
    /// Every child's end matches its parent's: a step done has its child processed, a step
    /// undone or failed has none left processed, and no child is in flight once its parent
    /// ended.
    fn check_children(&mut self) {
        let seed = self.seed;
        for r in self.memory.records() {
            for s in r.steps.iter().filter(|s| s.fan.is_some()) {
                match s.fan.as_ref().and_then(|f| f.inline) {
                    Some(version) => self.check_inline(&r, s, version),
                    None => self.check_elements(&r, s),
                }
            }
            for s in r.steps.iter().filter(|s| s.child.is_some()) {
                let id = s.child.unwrap();
                let Some(child) = self.memory.peek(id) else {
                    // Never started: its step must not be done.
                    assert!(
                        s.status != StepStatus::Done,
                        "seed {seed}: {} has {} done without its child",
                        r.order_id,
                        s.name
                    );
                    continue;
                };
                self.tally.children += 1;
                assert_eq!(
                    child.parent.as_ref().map(|p| p.order_id),
                    Some(r.order_id),
                    "seed {seed}: {id} forgot its parent"
                );
                assert!(
                    !r.is_terminal() || child.is_terminal(),
                    "seed {seed}: child {id} is {:?} after its parent {} ended {:?}",
                    child.process_state,
                    r.order_id,
                    r.process_state
                );
                let processed = child.process_state == ProcessState::Processed;
                match s.status {
                    StepStatus::Done => assert!(
                        processed,
                        "seed {seed}: {} has {} done, its child {id} {:?}",
                        r.order_id, s.name, child.process_state
                    ),
                    StepStatus::Undone | StepStatus::Failed => assert!(
                        !processed,
                        "seed {seed}: {} has {} {:?}, its child {id} processed",
                        r.order_id, s.name, s.status
                    ),
                    _ => {}
                }
                if s.status == StepStatus::Undone {
                    self.tally.children_undone += 1;
                }
            }
        }
    }

    /// Every element of a pass run inline matches its list's end, as the service's ledger
    /// keeps it under the element's keys: none called past where the list stopped starting,
    /// none applied twice; a list done has its elements that ended well in place and those
    /// that failed not (unless nothing can undo them); a list undone or failed has none left
    /// in place; and the pages of an order that ended with nothing left to undo are gone.
    fn check_inline(&mut self, r: &StateRecord, s: &sas_engine::state::StepState, version: u32) {
        let seed = self.seed;
        let fan = s.fan.as_ref().unwrap();
        let Some(items) = fan.items else { return };
        let allowed = match &self.workflow_of(r).step_named(&s.name).map(|w| &w.work) {
            Some(Work::Child(c)) => c.fan.unwrap().tolerance.allows(items),
            _ => panic!("seed {seed}: {} is no list step", s.name),
        };
        let child = self.child.as_ref().expect("a list runs the run's child workflow");
        assert_eq!(child.version(), version, "seed {seed}: {} ran another child", r.order_id);
        let step = child.inline_step().cloned().expect("a child run inline is one call");
        let key = |k: u32, direction| {
            let id = OrderId::for_element(r.order_id, &s.name, s.generation, k);
            sas_engine::ids::step_key(id, &step.name, direction, 0)
        };
        let mut in_place = 0;
        for k in 0..items {
            let (done, undo) = (key(k, Direction::Do), key(k, Direction::Undo));
            if k >= fan.forward.next {
                assert_eq!(
                    self.remote.calls(&done),
                    0,
                    "seed {seed}: element {k} of {} called past its list's window",
                    r.order_id
                );
                continue;
            }
            self.tally.elements += 1;
            self.tally.inline_elements += 1;
            if self.remote.applied(&done) && !self.remote.applied(&undo) {
                in_place += 1;
            }
        }
        let undoable = step.compensation.is_some();
        match s.status {
            StepStatus::Done => {
                assert!(
                    in_place == fan.forward.ok || (!undoable && in_place >= fan.forward.ok),
                    "seed {seed}: {} has {} done with {in_place} elements in place: {fan:?}",
                    r.order_id,
                    s.name
                );
                assert!(
                    fan.forward.failed <= allowed,
                    "seed {seed}: {} past its tolerance",
                    r.order_id
                );
                if fan.forward.failed > 0 {
                    self.tally.tolerance_met += 1;
                }
            }
            StepStatus::Undone | StepStatus::Failed if undoable => assert_eq!(
                in_place, 0,
                "seed {seed}: {} has {} {:?}, {in_place} of its elements in place: {fan:?}",
                r.order_id, s.name, s.status
            ),
            _ => {}
        }
        if fan.forward.failed > allowed && r.is_terminal() {
            self.tally.tolerance_missed += 1;
        }
        if r.is_terminal() && r.needs_manual_undo().is_empty() {
            let pass = sas_engine::ports::Page::pass_of(r.order_id, &s.name, s.generation);
            assert!(
                self.memory.pages_of(&pass).is_empty(),
                "seed {seed}: {} ended {:?} with the pages of {} left",
                r.order_id,
                r.process_state,
                s.name
            );
        }
    }

    /// Every element's child matches its list's end: none past where the list stopped
    /// starting, none in flight once the parent ended; a list done has as many processed as
    /// it counts, within its tolerance; a list undone or failed has none left processed.
    fn check_elements(&mut self, r: &StateRecord, s: &sas_engine::state::StepState) {
        let seed = self.seed;
        let fan = s.fan.as_ref().unwrap();
        let Some(items) = fan.items else { return };
        let allowed = match &self.workflow.step_named(&s.name).map(|w| &w.work) {
            Some(Work::Child(c)) => c.fan.unwrap().tolerance.allows(items),
            _ => panic!("seed {seed}: {} is no list step", s.name),
        };
        let (mut processed, mut ended_other) = (0, 0);
        for k in 0..items {
            let id = OrderId::for_element(r.order_id, &s.name, s.generation, k);
            let Some(child) = self.memory.peek(id) else { continue };
            assert!(
                k < fan.forward.next,
                "seed {seed}: element {k} of {} started past its list's window",
                r.order_id
            );
            self.tally.elements += 1;
            let link = child.parent.as_ref().unwrap();
            assert_eq!(
                (link.order_id, link.step.element),
                (r.order_id, Some(k)),
                "seed {seed}: {id}"
            );
            assert!(
                !r.is_terminal() || child.is_terminal(),
                "seed {seed}: element {k} ({id}) is {:?} after its parent {} ended {:?}",
                child.process_state,
                r.order_id,
                r.process_state
            );
            match child.process_state {
                ProcessState::Processed => processed += 1,
                state if state.is_terminal() => ended_other += 1,
                _ => {}
            }
        }
        match s.status {
            StepStatus::Done => {
                assert_eq!(processed, fan.forward.ok, "seed {seed}: {} {fan:?}", r.order_id);
                assert_eq!(processed + ended_other, items, "seed {seed}: {} {fan:?}", r.order_id);
                assert!(
                    ended_other <= allowed,
                    "seed {seed}: {} done past its tolerance",
                    r.order_id
                );
                if ended_other > 0 {
                    self.tally.tolerance_met += 1;
                }
            }
            StepStatus::Undone | StepStatus::Failed => assert_eq!(
                processed, 0,
                "seed {seed}: {} has {} {:?}, {processed} of its elements processed",
                r.order_id, s.name, s.status
            ),
            _ => {}
        }
        if fan.forward.failed > allowed && r.is_terminal() {
            self.tally.tolerance_missed += 1;
        }
    }

    fn check_outcomes(&self) {
        let seed = self.seed;
        // Every service saw whole values: no reference passed on, every undo told what its
        // step answered.
        let misread = self.remote.faults().misread;
        assert_eq!(misread, 0, "seed {seed}: {misread} calls were not handed whole values");
        // Every reference an order keeps names an object that is there, under the order's own
        // prefix.
        let kept = self.shelf.keys();
        for r in self.memory.records() {
            let order = self.memory.orders().into_iter().find(|o| o.order_id == r.order_id);
            let values = r.steps.iter().filter_map(|s| s.output.as_ref());
            for value in values.chain(order.as_ref().map(|o| o.order.input())) {
                if let Some(stored) = Stored::of(value) {
                    assert!(
                        stored.key.starts_with(&payload::prefix(r.order_id))
                            && kept.contains(&stored.key),
                        "seed {seed}: {} keeps a reference to {}, which is not there",
                        r.order_id,
                        stored.key
                    );
                }
            }
        }
        let ledger = self.remote.ledger();
        let applied =
            |key: String| ledger.iter().any(|e| e.key == key && e.output.get("noop").is_none());
        let in_place = self.remote.in_place(&self.steps);
        let alerts = self.bus.of_type(ALERT_DETAIL_TYPE);
        for r in self.memory.records() {
            let id = r.order_id;
            let ids: HashSet<String> = alerts
                .iter()
                .filter(|a| a["order_id"] == id.to_string())
                .map(|a| a["alert_id"].as_str().unwrap_or_default().to_owned())
                .collect();
            let errors = self.errors.get(&id).copied().unwrap_or(0);
            let alerted = self.alerted.get(&id).copied().unwrap_or(0);
            assert!(
                alerted <= ids.len() && ids.len() <= errors,
                "seed {seed}: {id} reached Error {errors} times ({alerted} recorded alerted), {} distinct alerts",
                ids.len(),
            );
            let key = |s: &sas_engine::state::StepState, d| step_key(id, &s.name, d, s.generation);
            let workflow = self.workflow_of(&r);
            let answered = |s: &sas_engine::state::StepState| {
                workflow.step_named(&s.name).is_some_and(|w| matches!(w.work, Work::Callback))
            };
            // A child step's effects are its child's, checked by `check_children`.
            let child_step = |s: &sas_engine::state::StepState| {
                workflow.step_named(&s.name).is_some_and(|w| matches!(w.work, Work::Child(_)))
            };
            let live_for = |step: &str| in_place.get(&(id, step.to_owned())).copied().unwrap_or(0);
            match r.process_state {
                ProcessState::Processed => {
                    assert_eq!(
                        r.alert.is_some(),
                        r.steps.iter().any(|s| s.reported.is_some()),
                        "seed {seed}: {id} processed: an alert exactly when a failure was reported"
                    );
                    for s in r.steps.iter().filter(|s| s.reported.is_some() && !child_step(s)) {
                        // Passed on a report: refused, it took no effect; left uncertain, it is
                        // in place at most once (checked throughout); done, it is kept.
                        let in_place = live_for(&s.name);
                        match s.status {
                            StepStatus::Failed => assert_eq!(
                                in_place, 0,
                                "seed {seed}: {id} {} refused but in place",
                                s.name
                            ),
                            StepStatus::Done => assert_eq!(
                                in_place, 1,
                                "seed {seed}: {id} {} not in place once",
                                s.name
                            ),
                            StepStatus::Uncertain => {}
                            other => {
                                panic!("seed {seed}: {id} processed with {} {other:?}", s.name)
                            }
                        }
                    }
                    for s in r.steps.iter().filter(|s| s.wake_at.is_some()) {
                        // A wait is over, and never before its time.
                        let woke = s.output.as_ref().and_then(|o| o["woke_at"].as_str());
                        let woke = woke.and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
                        assert!(
                            s.status == StepStatus::Done
                                && woke.is_some_and(|t| {
                                    t.timestamp_millis() >= s.wake_at.unwrap().as_millis()
                                }),
                            "seed {seed}: {id} {} woke {woke:?}, before {:?}",
                            s.name,
                            s.wake_at
                        );
                    }
                    for s in r.steps.iter().filter(|s| answered(s) && s.reported.is_none()) {
                        // Answered from outside, with what the answer carried.
                        assert_eq!(
                            (s.status, s.output.clone()),
                            (StepStatus::Done, Some(serde_json::json!({"answered": "sim"}))),
                            "seed {seed}: {id} processed without an answer to {}",
                            s.name
                        );
                    }
                    let calls = r
                        .steps
                        .iter()
                        .filter(|s| s.wake_at.is_none() && !answered(s) && !child_step(s));
                    for s in calls.filter(|s| s.reported.is_none()) {
                        assert!(
                            applied(key(s, Direction::Do)),
                            "seed {seed}: {id} processed without {}",
                            s.name
                        );
                        assert!(
                            !applied(key(s, Direction::Undo)),
                            "seed {seed}: {id} processed but {} undone",
                            s.name
                        );
                        assert_eq!(
                            live_for(&s.name),
                            1,
                            "seed {seed}: {id} {} not in place once",
                            s.name
                        );
                    }
                }
                ProcessState::Error | ProcessState::Cancelled => {
                    // A step stops the order as refused only if its service (or, for an answer
                    // from outside, the party) refused it: a 429 is never taken for a refusal.
                    if let Some(Cause::StepRejected { step, .. }) = &r.cause {
                        let by_service =
                            self.watch.lock().unwrap().refused.contains(&(id, step.clone()));
                        let by_party = workflow
                            .step_named(step)
                            .is_some_and(|w| matches!(w.work, Work::Callback | Work::Child(_)));
                        assert!(
                            by_service || by_party,
                            "seed {seed}: {id} stopped as refused by {step}, which its service never refused"
                        );
                    }
                    // Only a step whose failures undo the order stops it.
                    if let Some(step) = r.cause.as_ref().and_then(Cause::step) {
                        let policy = workflow.steps().iter().find(|s| s.name == step);
                        assert_eq!(
                            policy.map(|s| s.on_failure),
                            Some(OnFailure::Undo),
                            "seed {seed}: {id} stopped by {step}, whose failures are only reported"
                        );
                    }
                    for s in r.steps.iter().filter(|s| !child_step(s)) {
                        if s.status == StepStatus::Undone {
                            assert!(
                                applied(key(s, Direction::Undo)) || !applied(key(s, Direction::Do)),
                                "seed {seed}: {id} {} marked undone",
                                s.name
                            );
                        }
                        // A step done and not undone is one without an undo: reported (a
                        // wait that is over, or an answer, leaves nothing to undo).
                        assert!(
                            s.status != StepStatus::Done
                                || s.wake_at.is_some()
                                || answered(s)
                                || r.needs_manual_undo().contains(&s.name),
                            "seed {seed}: {id} ended {:?} with {} done, not undone, unreported",
                            r.process_state,
                            s.name
                        );
                        // Whatever is in place is on the operator's list.
                        if live_for(&s.name) > 0 {
                            assert!(
                                r.needs_manual_undo().contains(&s.name),
                                "seed {seed}: {id} ended {:?} with {} in place and unreported\n{}\n{:#?}",
                                r.process_state,
                                s.name,
                                serde_json::to_string_pretty(&r).unwrap(),
                                ledger
                                    .iter()
                                    .filter(|e| e.key.starts_with(&id.to_string()))
                                    .map(|e| (&e.key, &e.output))
                                    .collect::<Vec<_>>()
                            );
                        }
                    }
                }
                other => panic!("seed {seed}: {id} ended {other:?}"),
            }
        }
    }
}

/// The next scripted behaviour of a remote action; a kind switched off succeeds instead.
fn remote_behaviour(
    draw: &mut SplitMix,
    large: &mut SplitMix,
    undo: bool,
    faults: Faults,
) -> Behaviour {
    let x = draw.unit();
    let size = large.unit();
    let (fault, behaviour) = match x {
        x if x < 0.10 => (Fault::RemoteTransient, Behaviour::Transient),
        x if x < 0.14 => (Fault::LostAnswer, Behaviour::ApplyThenLoseAnswer),
        // Longer than most budgets: the effect lands after the caller gave up.
        x if x < 0.16 => (Fault::Timeout, Behaviour::Slow(Duration::from_secs(40))),
        x if x < 0.17 && !undo => (Fault::RemotePermanent, Behaviour::Permanent("refused".into())),
        x if x < 0.18 && !undo => (Fault::OversizeOutput, Behaviour::Oversize),
        // From a little over what a message carries to a few hundred kilobytes.
        _ if size < 0.04 => {
            let bytes = 600 + (size * 5_000_000.0) as usize;
            (Fault::LargeValue, Behaviour::Large(bytes))
        }
        _ => return Behaviour::Succeed,
    };
    if faults.on(fault) { behaviour } else { Behaviour::Succeed }
}

/// The workflow a seed runs: the two examples of `shared/workflows/` (the reference one on half
/// the seeds, which the checks that break the engine on purpose rely on), and shapes drawn from
/// the seed on a quarter: one to five steps on any of five agents, each with or without an undo,
/// some with their own count of expired leases or their own wait, some only reported when they
/// fail.
fn workflow_of(seed: u64) -> Workflow {
    let json = workflow_json(seed);
    Workflow::from_json(&json, &Workflow::agents_in(&json)).unwrap()
}

/// The version deployed halfway through the faults, on a fifth of the seeds: the run's
/// workflow with the opposite failure policy on its first step that calls an agent, and one
/// more step at the end, on that step's agent, with an undo. Orders accepted before it keep the first version
/// to their end (their undos and redrives included); orders accepted after take this one.
fn next_version(seed: u64, first: &Workflow) -> Option<Workflow> {
    if seed % 5 != 2 {
        return None;
    }
    let mut spec: serde_json::Value = serde_json::from_str(&workflow_json(seed)).unwrap();
    spec["version"] = (first.version() + 1).into();
    let steps = spec["steps"].as_array_mut().unwrap();
    // The first step that calls an agent (a wait has no failure policy).
    let first_call = steps.iter().position(|s| s.get("agent").is_some())?;
    let flipped = if steps[first_call]["on_failure"] == "report" { "undo" } else { "report" };
    steps[first_call]["on_failure"] = flipped.into();
    let agent = steps[first_call]["agent"].clone();
    steps.push(serde_json::json!({
        "name": "audit-v2", "agent": agent, "budget_seconds": 10,
        "compensation": {"action": "unaudit-v2", "budget_seconds": 10}
    }));
    let json = spec.to_string();
    Some(Workflow::from_json(&json, &Workflow::agents_in(&json)).unwrap())
}

/// Whether the workflow a seed runs starts a child order: on two in five of the seeds that
/// draw their workflow's shape.
fn has_child(seed: u64) -> bool {
    seed % 4 == 3 && SplitMix::seeded(seed ^ 0xc41d0).unit() < 0.4
}

/// Whether the child step of a seed's workflow runs a child for each parcel of the order: on
/// half of the seeds with a child step.
fn has_fan(seed: u64) -> bool {
    has_child(seed) && SplitMix::seeded(seed ^ 0xfa40).unit() < 0.5
}

/// The workflow of the child order a seed's workflow starts, if it starts one: one or two
/// steps on the agents its parent calls, each with or without an undo.
fn child_workflow(seed: u64) -> Option<Workflow> {
    if !has_child(seed) {
        return None;
    }
    let parent = workflow_json(seed);
    let agents = Workflow::agents_in(&parent);
    if agents.is_empty() {
        return None;
    }
    let draw = SplitMix::seeded(seed ^ 0xc41d1);
    let pick = |n: usize| ((draw.unit() * n as f64) as usize).min(n - 1);
    let steps: Vec<serde_json::Value> = (0..1 + pick(2))
        .map(|k| {
            let mut step = serde_json::json!({
                "name": format!("child-step-{k}"),
                "agent": agents[pick(agents.len())].as_str(),
                "budget_seconds": 5 + 5 * pick(6),
            });
            if draw.unit() < 0.7 {
                step["compensation"] = serde_json::json!({"action": format!("child-undo-{k}")});
            }
            step
        })
        .collect();
    let json = serde_json::json!({"name": format!("child-{seed}"), "steps": steps}).to_string();
    Some(Workflow::from_json(&json, &agents).unwrap())
}

/// The JSON of the workflow a seed runs first (see [`workflow_of`]).
/// Whether an order was started by an event (the children of an order take its owner, not
/// its kind of key).
fn started_by_event(o: &OrderRecord) -> bool {
    o.owner == sas_engine::Owner::starts() && o.idempotency_key.as_str().starts_with("event-")
}

/// The workflow file a seed runs, which events from `sim.shop` start as well (see
/// [`Sim::send_event`]).
fn workflow_json(seed: u64) -> String {
    let mut spec: serde_json::Value = serde_json::from_str(&workflow_shape(seed)).unwrap();
    spec["starts"] = serde_json::json!([{"event": {"pattern": {"source": ["sim.shop"]}}}]);
    if let Some(limit) = keyed(seed) {
        let key = match spec["name"].as_str() {
            Some("account-opening") => "/input/customer/email",
            _ => "/input/customer_id",
        };
        if spec.get("input_schema").is_none() {
            spec["input_schema"] = serde_json::json!({"type": "object",
                "properties": {"customer_id": {"type": "string"}}, "required": ["customer_id"]});
        }
        spec["concurrency"] = serde_json::json!({"key": key, "limit": limit});
    }
    spec.to_string()
}

/// The concurrency limit per customer of the workflow a seed runs, on a third of the seeds:
/// one or two orders of a customer at a time.
fn keyed(seed: u64) -> Option<u32> {
    (seed % 3 == 0).then(|| 1 + (seed / 3 % 2) as u32)
}

fn workflow_shape(seed: u64) -> String {
    match seed % 4 {
        0 | 1 => sas_workflows::order_fulfilment().to_owned(),
        2 => sas_workflows::file("account-opening").unwrap().json.to_owned(),
        _ => {
            let draw = SplitMix::seeded(seed ^ 0x5a4e);
            let pick = |n: usize| ((draw.unit() * n as f64) as usize).min(n - 1);
            // The agents the repository's workflows use.
            let mut agents: Vec<String> = Vec::new();
            for file in sas_workflows::FILES {
                for agent in Workflow::agents_in(file.json) {
                    if !agents.iter().any(|a| a == agent.as_str()) {
                        agents.push(agent.as_str().to_owned());
                    }
                }
            }
            let steps: Vec<serde_json::Value> = (0..1 + pick(5))
                .map(|k| {
                    let mut step = serde_json::json!({
                        "name": format!("step-{k}"),
                        "agent": agents[pick(agents.len())].as_str(),
                        "budget_seconds": 5 + 5 * pick(12),
                    });
                    if draw.unit() < 0.6 {
                        step["compensation"] =
                            serde_json::json!({"action": format!("undo-{k}"), "budget_seconds": 5 + 5 * pick(6)});
                    }
                    if draw.unit() < 0.2 {
                        step["expired_leases"] = (1 + pick(4)).into();
                    }
                    if draw.unit() < 0.2 {
                        step["retry_wait_seconds"] = (pick(30)).into();
                    }
                    if draw.unit() < 0.3 {
                        step["on_failure"] = "report".into();
                    }
                    step
                })
                .collect();
            let steps = with_callbacks(seed, with_waits(seed, with_dependencies(seed, steps)));
            let mut steps = with_max_holds(seed, steps);
            if has_child(seed) && steps.iter().any(|s| s.get("agent").is_some()) {
                // Last, after the step above it: a child order of one or two steps, on the
                // agents its parent calls.
                let draw = SplitMix::seeded(seed ^ 0xc41d);
                let timeout = 60 + (draw.unit() * 600.0) as u64;
                let mut step = serde_json::json!({
                    "name": "step-child",
                    "child": {"workflow": format!("child-{seed}"), "timeout_seconds": timeout},
                });
                // On half of them, a child for each parcel of the order, a few at a time.
                let fan = SplitMix::seeded(seed ^ 0xfa40);
                if has_fan(seed) {
                    fan.unit();
                    let tolerance = match (fan.unit() * 3.0) as u32 {
                        0 => serde_json::json!({"count": 0}),
                        1 => serde_json::json!({"count": 1}),
                        _ => serde_json::json!({"share": 0.5}),
                    };
                    // A child of one call runs inline, unless asked to run as orders.
                    let as_orders = SplitMix::seeded(seed ^ 0x1a11).unit() < 0.3;
                    step = serde_json::json!({
                        "name": "step-child",
                        "each": {"items": "/input/parcels", "workflow": format!("child-{seed}"),
                                 "max_concurrency": 1 + (fan.unit() * 3.0) as u32,
                                 "tolerance": tolerance, "timeout_seconds": timeout,
                                 "as_orders": as_orders},
                    });
                }
                if draw.unit() < 0.3 {
                    step["on_failure"] = "report".into();
                }
                steps.push(step);
            }
            serde_json::json!({"name": format!("shape-{seed}"), "steps": steps}).to_string()
        }
    }
}

/// On half the seeds, `steps` with dependencies of their own: each step is given a rank and
/// depends on some of the steps ranked below it, whatever their place in the file, so that the
/// steps run in an order of their dependencies rather than the file's, and a step is asked
/// with the outputs of what it depends on. Drawn apart, so the steps themselves stay the same.
fn with_dependencies(seed: u64, mut steps: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    let draw = SplitMix::seeded(seed ^ 0xdeb5);
    if draw.unit() < 0.5 {
        return steps;
    }
    let ranks: Vec<f64> = steps.iter().map(|_| draw.unit()).collect();
    let names: Vec<String> =
        steps.iter().map(|s| s["name"].as_str().unwrap_or_default().to_owned()).collect();
    for (k, step) in steps.iter_mut().enumerate() {
        let below: Vec<&String> =
            names.iter().zip(&ranks).filter(|(_, r)| **r < ranks[k]).map(|(n, _)| n).collect();
        let chosen: Vec<&String> = below.into_iter().filter(|_| draw.unit() < 0.5).collect();
        step["depends_on"] = serde_json::json!(chosen);
    }
    steps
}

/// On a third of the seeds, one of `steps` waits instead of calling its agent: for a few
/// seconds up to twenty minutes, so that some waits are woken by their delayed start message
/// and some, longer than SQS delays one, by the supervisor. Drawn apart, like the dependencies.
fn with_waits(seed: u64, mut steps: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    let draw = SplitMix::seeded(seed ^ 0x3a17);
    if draw.unit() < 2.0 / 3.0 {
        return steps;
    }
    let k = ((draw.unit() * steps.len() as f64) as usize).min(steps.len() - 1);
    let seconds = 1 + (draw.unit() * 1200.0) as u64;
    let name = steps[k]["name"].clone();
    let mut wait = serde_json::json!({"name": name, "wait": {"seconds": seconds}});
    if let Some(depends_on) = steps[k].get("depends_on") {
        wait["depends_on"] = depends_on.clone();
    }
    steps[k] = wait;
    steps
}

/// On a third of the seeds, one of `steps` waits for an answer from outside instead of
/// calling its agent, for thirty seconds up to half an hour, undoing the order or only
/// reporting when it is refused or never answered. Drawn apart, like the dependencies.
fn with_callbacks(seed: u64, mut steps: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    let draw = SplitMix::seeded(seed ^ 0xca11);
    if draw.unit() < 2.0 / 3.0 {
        return steps;
    }
    let k = ((draw.unit() * steps.len() as f64) as usize).min(steps.len() - 1);
    let seconds = 30 + (draw.unit() * 1770.0) as u64;
    let on_failure = if draw.unit() < 0.3 { "report" } else { "undo" };
    let name = steps[k]["name"].clone();
    let mut callback = serde_json::json!({
        "name": name, "callback": {"timeout_seconds": seconds}, "on_failure": on_failure
    });
    if let Some(depends_on) = steps[k].get("depends_on") {
        callback["depends_on"] = depends_on.clone();
    }
    steps[k] = callback;
    steps
}

/// On a third of the seeds, some of `steps` that call an agent wait for their held service
/// no longer than their own `max_hold_seconds`, one to fifteen minutes. Drawn apart, like the
/// dependencies.
fn with_max_holds(seed: u64, mut steps: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    let draw = SplitMix::seeded(seed ^ 0x401d);
    if draw.unit() < 2.0 / 3.0 {
        return steps;
    }
    for step in steps.iter_mut().filter(|s| s.get("agent").is_some()) {
        if draw.unit() < 0.5 {
            step["max_hold_seconds"] = (60 * (1 + (draw.unit() * 15.0) as u64)).into();
        }
    }
    steps
}

/// What a seed's services do over time, on the seeds where they misbehave.
struct ServiceFaults {
    /// The stack's `max_hold`: one to thirty minutes, so that most holds end in time and some
    /// do not.
    max_hold: Duration,
    /// The spells the services fail calls, each with its kind.
    outages: Vec<(Fault, Outage)>,
}

/// On half the seeds the services misbehave over time: one to three spells, each on one of
/// the workflow's agents (every action of it, in every version, undos included), starting in
/// the first fifteen minutes: down for 20 s to 20 min; flapping in turns of 1 to 8 s for 30 s
/// to 5 min; or down for 10 s to 5 min, then coming back over 30 s to 5 min. Drawn apart, so
/// that the other seeds run as before; a kind switched off is drawn all the same, and left
/// out.
fn service_faults(
    seed: u64,
    versions: &[&Workflow],
    start: Timestamp,
    faults: Faults,
) -> Option<ServiceFaults> {
    let draw = SplitMix::seeded(seed ^ 0x0ff1);
    if draw.unit() < 0.5 {
        return None;
    }
    let pick = |n: usize| ((draw.unit() * n as f64) as usize).min(n.saturating_sub(1));
    let seconds = |s: f64| Duration::from_millis((s * 1000.0) as u64);
    let max_hold = Duration::from_secs(60 + (draw.unit() * 1740.0) as u64);
    let agents = versions[0].agents();
    if agents.is_empty() {
        return None;
    }
    let mut outages = Vec::new();
    for _ in 0..1 + pick(3) {
        let actions = actions_of(versions, agents[pick(agents.len())]);
        let from = start.plus(seconds(draw.unit() * 900.0));
        let (kind, down, flapping, recovery) = match pick(3) {
            0 => (Fault::Outage, 20.0 * 60f64.powf(draw.unit()), None, 0.0),
            1 => {
                let turn = Duration::from_secs(1 + pick(8) as u64);
                (Fault::Flapping, 30.0 * 10f64.powf(draw.unit()), Some(turn), 0.0)
            }
            _ => {
                let down = 10.0 * 30f64.powf(draw.unit());
                (Fault::SlowRecovery, down, None, 30.0 * 10f64.powf(draw.unit()))
            }
        };
        if faults.on(kind) {
            let until = from.plus(seconds(down));
            let recovery = seconds(recovery);
            let refusal = None;
            outages.push((kind, Outage { actions, from, until, flapping, recovery, refusal }));
        }
    }
    // Drawn apart, so that the spells above are as they were: on half these seeds, one more
    // spell of a part of a service, for 20 s to 20 min: its forward actions down while its
    // undos answer, or the reverse, or one of its actions refused for good.
    let more = SplitMix::seeded(seed ^ 0x0ff2);
    if more.unit() < 0.5 {
        let pick = |n: usize| ((more.unit() * n as f64) as usize).min(n.saturating_sub(1));
        let agent = agents[pick(agents.len())];
        let (forward, undos) = split_actions(versions, agent);
        let from = start.plus(seconds(more.unit() * 900.0));
        let until = from.plus(seconds(20.0 * 60f64.powf(more.unit())));
        let (kind, actions, refusal) = match pick(3) {
            0 => (Fault::ForwardDown, forward, None),
            1 => (Fault::UndoDown, undos, None),
            _ => {
                let all = [forward, undos].concat();
                let action = all[pick(all.len())].clone();
                let refusal = format!("AccessDenied: not authorized to perform {action}");
                (Fault::Denied, vec![action], Some(refusal))
            }
        };
        if faults.on(kind) && !actions.is_empty() {
            let recovery = Duration::ZERO;
            let outage = Outage { actions, from, until, flapping: None, recovery, refusal };
            outages.push((kind, outage));
        }
    }
    Some(ServiceFaults { max_hold, outages })
}

/// `agent`'s forward actions and its undos in `versions`, each once.
fn split_actions(versions: &[&Workflow], agent: &AgentName) -> (Vec<String>, Vec<String>) {
    let undos: Vec<String> = versions
        .iter()
        .flat_map(|w| w.steps())
        .filter_map(|s| Some(s.compensation.as_ref()?.action.clone()))
        .collect();
    actions_of(versions, agent).into_iter().partition(|a| !undos.contains(a))
}

/// Every action of `agent`'s steps in `versions`, undos included, each once.
fn actions_of(versions: &[&Workflow], agent: &AgentName) -> Vec<String> {
    let mut actions: Vec<String> = Vec::new();
    for step in versions.iter().flat_map(|w| w.steps()).filter(|s| s.agent() == Some(agent)) {
        let undo = step.compensation.as_ref().map(|c| c.action.clone());
        for action in std::iter::once(step.name.clone()).chain(undo) {
            if !actions.contains(&action) {
                actions.push(action);
            }
        }
    }
    actions
}

/// What a seed's services declare of the load they take, and how they throttle, on the seeds
/// whose services are paced.
struct Pacing {
    /// What each limited service declares, by agent.
    limits: BTreeMap<String, Limits>,
    throttles: Vec<Throttle>,
}

impl Pacing {
    /// What pacing may add to the time orders take once the faults stop (and the throttles
    /// with them): the last quiet a service asked for, then every request of every order
    /// waiting for its turn at the slowest declared rate.
    fn settle_bound(&self, versions: &[&Workflow]) -> Duration {
        let quiet = self.throttles.iter().filter_map(|t| t.retry_after).max().unwrap_or_default();
        let steps = versions.iter().map(|w| w.steps().len()).max().unwrap_or(0);
        let requests = u32::try_from(2 * ORDERS * steps).unwrap_or(u32::MAX);
        let slowest = self.limits.values().filter_map(|l| l.per_second).min();
        quiet.max(Duration::from_secs(1)) + slowest.map_or(Duration::ZERO, pace::spacing) * requests
    }
}

/// On two seeds in five the services are paced, and calls take time (drawn apart, so that the
/// other seeds run as before). Each agent of the workflow declares, one time in two, a rate of
/// one to six calls a second, one to three calls in flight, or both. Each service throttles
/// on its own: at the rate it declared, or one time in three at or below it (declared too
/// high); one time in three at two to six a second if it declared no rate; and up to 5 % of
/// its calls at random. Its 429 asks for nothing one time in four, for one to ten seconds, or
/// one time in eight for half a minute to two minutes. A kind switched off is drawn all the
/// same, and left out.
fn pacing(seed: u64, versions: &[&Workflow], faults: Faults) -> Option<Pacing> {
    let draw = SplitMix::seeded(seed ^ 0x9ace);
    if draw.unit() < 0.6 {
        return None;
    }
    // One to `n`.
    let pick = |n: u32| 1 + ((draw.unit() * f64::from(n)) as u32).min(n - 1);
    let mut limits = BTreeMap::new();
    let mut throttles = Vec::new();
    for agent in versions[0].agents() {
        let declared = if draw.unit() < 0.5 {
            let which = draw.unit();
            Limits {
                per_second: (which < 0.7).then(|| pick(6)),
                in_flight: (which >= 0.4).then(|| pick(3)),
            }
        } else {
            Limits::NONE
        };
        let per_second = match declared.per_second {
            Some(rate) if draw.unit() < 1.0 / 3.0 => Some(pick(rate)),
            Some(rate) => Some(rate),
            None => (draw.unit() < 1.0 / 3.0).then(|| 1 + pick(5)),
        };
        let per_mille = (draw.unit() * 50.0) as u32;
        let retry_after = match draw.unit() {
            x if x < 0.25 => None,
            x if x < 0.875 => Some(Duration::from_secs(u64::from(pick(10)))),
            _ => Some(Duration::from_secs(30 + (draw.unit() * 90.0) as u64)),
        };
        let throttle_seed = draw.next_u64();
        if !declared.is_none() {
            limits.insert(agent.as_str().to_owned(), declared);
        }
        if faults.on(Fault::RemoteThrottled) {
            let actions = actions_of(versions, agent);
            throttles.push(Throttle {
                actions,
                per_second,
                per_mille,
                retry_after,
                seed: throttle_seed,
            });
        }
    }
    Some(Pacing { limits, throttles })
}

/// How long, once faults stop, the system may take to finish an order, from the configuration:
/// every lease of every step and every undo may expire its step's `expired_leases` times (by
/// default `failure_threshold`), each costing at most the claim grace, the budget, the longest
/// retry wait, the reports' delay the horizon adds, and one sweep interval; the waits reported while faults ran may hold the horizon open
/// for as long as they stand (the longest budget, the claim grace and one report); then the
/// alert may need one republish.
fn settle_bound(config: &EngineConfig, workflow: &Workflow) -> Duration {
    // Each lease, with the longest wait the step may take after it.
    let lease = |budget: Duration, wait: Duration| {
        config.claim_grace + budget + wait + load::SLACK + SWEEP_EVERY
    };
    let leases: Duration = workflow
        .steps()
        .iter()
        .map(|s| {
            match &s.work {
                // A wait may begin as the faults stop; a long one is found by a sweep.
                Work::Wait(Wait::For(d)) => return *d + SWEEP_EVERY,
                // Nobody answers once the faults stop: it times out, found by a sweep (it
                // may begin late, once its start message is claimed).
                Work::Callback => return config.claim_grace + s.budget + SWEEP_EVERY,
                _ => {}
            }
            let wait = s.waits(config.wait).max;
            let both = lease(s.budget, wait)
                + s.compensation.as_ref().map_or(Duration::ZERO, |c| lease(c.budget, wait));
            both * s.expired_leases.unwrap_or(config.failure_threshold)
        })
        .sum();
    let longest = workflow
        .steps()
        .iter()
        .filter(|s| s.agent().is_some())
        .map(|s| s.budget)
        .max()
        .unwrap_or_default();
    let reported = longest + config.claim_grace + load::REPORT_EVERY;
    // A service its agent holds as the faults stop opens at its next probe, which the
    // supervisor sends once due (the scripted faults may fail a few in a row); the orders that
    // waited for it are then resumed within the minute.
    let probes = 3 * (config.hold.probe_every + SWEEP_EVERY) + RESUME_SPREAD;
    leases + reported + probes + config.alert_retry_after + SWEEP_EVERY
}

fn seeds() -> Vec<u64> {
    if let Some(seed) = std::env::var("SEED").ok().and_then(|s| s.parse().ok()) {
        return vec![seed];
    }
    let n: u64 = std::env::var("SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2000);
    (1..=n).collect()
}

/// Seeds from which a run must have met every kind of fault and every rare path.
const COVERING_SEEDS: usize = 500;

async fn run_seeds(seeds: &[u64], faults: Faults) -> Tally {
    let mut total = Tally::default();
    for &seed in seeds {
        // A panic names its seed; rerun it alone with SEED=<seed> (and the same switches).
        total += Sim::new(seed, faults).run().await;
    }
    total
}

#[tokio::test(flavor = "current_thread")]
async fn every_order_ends_and_no_invariant_breaks_under_injected_faults() {
    let faults = Faults::from_env().unwrap_or_else(|e| panic!("{e}"));
    let seeds = seeds();
    let total = run_seeds(&seeds, faults).await;
    println!(
        "{} seeds, {ORDERS} orders each, 0 invariant violations; injected: {total}",
        seeds.len()
    );
    if seeds.len() >= COVERING_SEEDS {
        // A run that injected nothing would prove nothing. The rarest paths (a list that ends
        // within its tolerance) are met a few times in 500 seeds, not always in 100.
        for fault in Fault::ALL.into_iter().filter(|&f| faults.on(f)) {
            assert!(total.count(fault) > 0, "no {} faults were injected", fault.name());
        }
        if faults.on(Fault::DoubleSweep) {
            assert!(total.races_lost > 0, "the supervisors never raced for a record");
        }
        if faults.on(Fault::Operator) {
            assert!(total.commands_refused > 0, "no operator command was ever refused");
            assert!(total.redriven_to_the_end > 0, "no redriven order was ever processed");
            assert!(total.undone > 0, "no processed order was ever undone");
            assert!(total.children_undone > 0, "no child order was ever undone by its parent");
            assert!(total.tolerance_met > 0, "no list ever ended within its tolerance");
            assert!(total.tolerance_missed > 0, "no list ever failed past its tolerance");
        }
        if faults.on(Fault::RemotePermanent) {
            assert!(total.processed_with_reports > 0, "no order went on past a reported failure");
        }
        assert!(total.ended_on_old_version > 0, "no order in flight at a deploy ever ended");
        assert!(total.children > 0, "no child order was ever started");
        assert!(total.elements > 0, "no list ever ran a child");
        assert!(total.side_by_side > 0, "no two steps of an order were ever in flight at once");
        assert!(total.undone_side_by_side > 0, "no two undos of an order ran at once");
        assert!(total.waits_over > 0, "no wait was ever over");
        if faults.on(Fault::Answer) {
            assert!(total.answers_applied > 0, "no answer ever counted");
            assert!(total.answers_refused > 0, "no answer was ever refused");
        }
        assert!(total.unanswered > 0, "no step ever waited for an answer in vain");
        let outages = [Fault::Outage, Fault::Flapping, Fault::SlowRecovery];
        if outages.iter().chain([&Fault::ManualHold]).any(|&f| faults.on(f)) {
            assert!(total.parked > 0, "no step ever waited for a held service");
            assert!(total.resumed > 0, "no order waiting for a service was ever resumed");
            assert!(total.held_too_long > 0, "no step ever waited past its max_hold");
            assert!(total.holds_announced > 0, "no hold was ever announced");
            assert!(total.releases_announced > 0, "no release was ever announced");
        }
        if outages.iter().any(|&f| faults.on(f)) {
            assert!(total.probes > 0, "no held service was ever probed");
        }
        if faults.on(Fault::ForwardDown) || faults.on(Fault::UndoDown) {
            assert!(total.beside_holds > 0, "no action was called while another was held");
        }
        if faults.on(Fault::Denied) {
            assert!(total.count(Fault::Denied) > 0, "no call was ever denied");
        }
        assert!(total.paced_seeds > 0, "no seed's services declared limits");
        assert!(total.full_seconds > 0, "no call ever filled its service's declared second");
        assert!(total.full_places > 0, "no call ever took its service's last place in flight");
        assert!(total.kept_back > 0, "no request was ever kept back");
        assert!(total.keys_full > 0, "no customer's key ever had every place taken");
        assert!(total.in_line > 0, "no order ever waited in its key's line");
        if faults.on(Fault::RemoteThrottled) {
            assert!(total.learned_calls > 0, "no call ever went at a rate learned from 429s");
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_fault_kind_switched_off_is_never_injected() {
    for fault in Fault::ALL {
        let total = run_seeds(&[1, 2, 3, 4], Faults::all().without(fault)).await;
        assert_eq!(total.count(fault), 0, "{} injected while switched off", fault.name());
    }
}

/// What a run breaks on purpose, to show that the checks notice.
#[derive(Clone, Copy, Debug)]
enum Breakage {
    /// The remote services apply a repeated key again.
    ForgetfulServices,
    /// Guards of the engine broken (see `sas_engine::mutants`).
    Mutants(&'static [Mutant]),
    /// Supervisors whose clocks run this far ahead.
    SupervisorAhead(Duration),
}

/// Runs seeds under `breakage` until one fails: the panic's message, or `None` if every seed
/// passed.
fn first_failure(seeds: std::ops::RangeInclusive<u64>, breakage: Breakage) -> Option<String> {
    for seed in seeds {
        // A thread of its own, whose panic is the expected outcome; the mutants' switches are
        // per thread.
        let outcome = std::thread::spawn(move || {
            let _switched = match breakage {
                Breakage::Mutants(mutants) => Some(mutants::switch_on(mutants)),
                _ => None,
            };
            let ahead = match breakage {
                Breakage::SupervisorAhead(by) => by,
                _ => Duration::ZERO,
            };
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            runtime.block_on(async {
                let mut sim = Sim::breaking(seed, Faults::all(), ahead);
                if let Breakage::ForgetfulServices = breakage {
                    sim.remote.forget_keys();
                    // Without the count of each key's applications: the business's count
                    // alone must see it.
                    sim.count_keys = false;
                }
                sim.run().await
            })
        })
        .join();
        if let Err(panic) = outcome {
            let text = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()));
            let text = text.unwrap_or_default();
            // The seed and the message the README quotes, under --nocapture.
            eprintln!("{breakage:?} failed at seed {seed}: {text}");
            return Some(text);
        }
    }
    None
}

#[test]
fn the_double_effect_check_fails_a_run_whose_services_apply_a_repeated_key_again() {
    let failure = first_failure(1..=5, Breakage::ForgetfulServices)
        .expect("five runs passed with services that apply every repeated call again");
    // The business count sees it on its own: a step in place twice, whatever the keys.
    assert!(failure.contains(" in place 2 times"), "{failure}");
}

#[test]
fn a_reply_guard_off_by_one_fails_the_simulation() {
    let breakage = Breakage::Mutants(&[Mutant::ReplyFromPreviousAttempt]);
    let failure = first_failure(1..=20, breakage)
        .expect("twenty runs passed taking replies of the previous attempt");
    // Either the old reply moves the order, or it names a step or a direction the order has
    // left behind.
    let noticed =
        ["a reply of attempt", "WrongStep", "WrongDirection"].iter().any(|n| failure.contains(n));
    assert!(noticed, "{failure}");
}

#[test]
fn a_supervisor_whose_clock_runs_ahead_fails_the_simulation() {
    // Its index query and the machine's own checks both read its clock, so both guards give.
    let breakage = Breakage::SupervisorAhead(Duration::from_secs(20));
    let failure =
        first_failure(1..=20, breakage).expect("twenty runs passed with a supervisor 20 s ahead");
    assert!(failure.contains("before its CompleteBy"), "{failure}");
}

#[test]
fn a_redrive_giving_new_keys_to_steps_of_unknown_outcome_fails_the_simulation() {
    let breakage = Breakage::Mutants(&[Mutant::NewKeysForUncertainSteps]);
    let failure = first_failure(1..=400, breakage)
        .expect("400 runs passed with redrives that run an uncertain step again under new keys");
    assert!(failure.contains(" in place 2 times"), "{failure}");
}

#[test]
fn a_list_counting_an_element_end_twice_fails_the_simulation() {
    let breakage = Breakage::Mutants(&[Mutant::ElementEndsCountedTwice]);
    let failure = first_failure(1..=800, breakage)
        .expect("800 runs passed counting duplicated ends of a list's elements");
    assert!(failure.contains("FanState"), "{failure}");
}

#[test]
fn an_event_delivered_again_starting_an_order_again_fails_the_simulation() {
    let breakage = Breakage::Mutants(&[Mutant::EventStartedAgain]);
    let failure = first_failure(1..=800, breakage)
        .expect("800 runs passed with events that start an order at each delivery");
    assert!(failure.contains("-again no event should have started"), "{failure}");
}

#[test]
fn an_answer_counted_whatever_its_token_fails_the_simulation() {
    let breakage = Breakage::Mutants(&[Mutant::AnswerWithAnyToken]);
    let failure = first_failure(1..=600, breakage)
        .expect("600 runs passed taking answers with forged and stale tokens");
    assert!(failure.contains("with another token"), "{failure}");
}

#[test]
fn an_agent_calling_its_held_service_fails_the_simulation() {
    let breakage = Breakage::Mutants(&[Mutant::HeldAgentCallsService]);
    let failure = first_failure(1..=20, breakage)
        .expect("twenty runs passed with agents that call their service while it is held");
    assert!(failure.contains("and not as its probe"), "{failure}");
}

#[test]
fn a_held_step_whose_lease_runs_with_its_budget_fails_the_simulation() {
    let breakage = Breakage::Mutants(&[Mutant::HeldStepBurnsLease]);
    let failure = first_failure(1..=20, breakage)
        .expect("twenty runs passed with steps failing for their held service within their budget");
    assert!(failure.contains("failed held too long after"), "{failure}");
}

#[test]
fn a_supervisor_that_resumes_no_order_fails_the_simulation() {
    let breakage = Breakage::Mutants(&[Mutant::NoResume]);
    let failure = first_failure(1..=20, breakage)
        .expect("twenty runs passed with a supervisor that resumes nothing once a service opens");
    assert!(failure.contains("still waits for"), "{failure}");
}

#[test]
fn a_hold_announced_without_being_recorded_fails_the_simulation() {
    let breakage = Breakage::Mutants(&[Mutant::AnnouncementUnrecorded]);
    let failure = first_failure(1..=20, breakage)
        .expect("twenty runs passed with holds announced again at every sweep");
    assert!(failure.contains("announced twice"), "{failure}");
}

#[test]
fn an_agent_handing_on_references_to_stored_values_fails_the_simulation() {
    let breakage = Breakage::Mutants(&[Mutant::StoredValuesUnread]);
    let failure = first_failure(1..=20, breakage)
        .expect("twenty runs passed with services handed references instead of values");
    assert!(failure.contains("not handed whole values"), "{failure}");
}

#[test]
fn a_declared_rate_spaced_with_no_room_for_travel_fails_the_simulation() {
    let breakage = Breakage::Mutants(&[Mutant::SpacingWithoutTravel]);
    let failure = first_failure(1..=60, breakage)
        .expect("sixty runs passed with turns a second over the rate apart, whatever travel takes");
    assert!(failure.contains("calls within a second"), "{failure}");
}

#[test]
fn a_hold_that_stops_and_is_probed_by_any_action_of_its_service_fails_the_simulation() {
    let breakage = Breakage::Mutants(&[Mutant::ProbeOfAnotherAction]);
    let failure = first_failure(1..=400, breakage)
        .expect("400 runs passed with holds that another action's answer opens");
    let noticed = ["opened by a probe", "waits for a hold of"].iter().any(|n| failure.contains(n));
    assert!(noticed, "{failure}");
}

#[test]
fn a_refusal_counted_towards_a_hold_fails_the_simulation() {
    let breakage = Breakage::Mutants(&[Mutant::RefusalCountsTowardsHold]);
    let failure = first_failure(1..=400, breakage)
        .expect("400 runs passed with services held for the calls they refused");
    assert!(failure.contains("held for refusals"), "{failure}");
}

#[test]
fn a_place_never_given_back_fails_the_simulation() {
    let breakage = Breakage::Mutants(&[Mutant::PlaceKeptOnEnd]);
    let failure = first_failure(1..=20, breakage)
        .expect("twenty runs passed with orders that kept their key's place once ended");
    let noticed = ["never given back", "still in flight"].iter().any(|n| failure.contains(n));
    assert!(noticed, "{failure}");
}

#[test]
fn a_place_given_back_twice_fails_the_simulation() {
    let breakage = Breakage::Mutants(&[Mutant::PlaceFreedTwice]);
    let failure = first_failure(1..=40, breakage)
        .expect("forty runs passed with orders that gave back two places when they ended");
    let noticed = ["without its place", "running at once"].iter().any(|n| failure.contains(n));
    assert!(noticed, "{failure}");
}

#[test]
fn the_settle_bound_follows_from_the_configuration() {
    let json = sas_workflows::order_fulfilment();
    let workflow = Workflow::from_json(json, &Workflow::agents_in(json)).unwrap();
    let config = EngineConfig { failure_threshold: 3, ..EngineConfig::default() };
    // Five leases (three steps, two undos), 30 s of claim grace, 300 s of longest wait, 6 s of
    // the reports' delay and 5 s between sweeps each, plus the budgets (30 + 30 + 60 + 30 +
    // 30), three times over; the waits reported during the faults (60 + 30 + 5 s); then one
    // alert republish (120 s) and one more sweep; and three probes of a held service, 10 s
    // apart, each found by a sweep, then a minute to resume what waited for it.
    let expected = 3 * (5 * (30 + 300 + 6 + 5) + 180) + 95 + 3 * (10 + 5) + 60 + 120 + 5;
    assert_eq!(settle_bound(&config, &workflow), Duration::from_secs(expected));
}

/// What an agent did with a request taken in a batch.
enum AgentDid {
    Step(AgentOutcome),
    Elements(Vec<(u32, AgentOutcome)>),
}
