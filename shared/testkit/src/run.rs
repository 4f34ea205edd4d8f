//! A team's run: its workflows, its agents and stand-ins, and the orders it submits, seed
//! after seed through the real services on in-memory ports, with the faults the seed draws,
//! and the invariants checked after every event.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sas_engine::catalogue::Catalogue;
use sas_engine::config::EngineConfig;
use sas_engine::events::CALLBACK_DETAIL_TYPE;
use sas_engine::load::Gauges;
use sas_engine::machine::Answer;
use sas_engine::memory::{
    Delivery, ManualClock, MemoryBus, MemoryQueues, MemoryStore, SeqIds, SplitMix,
};
use sas_engine::message::Message;
use sas_engine::ports::{Clock, Destination, Incoming};
use sas_engine::services::{
    Agent, Answering, Applied, Assembly, Command, Commanded, Operator, Scheduler, ServiceDesk,
    Submission, Supervisor, SweepReport,
};
use sas_engine::state::{Cause, CommandKind, InputRef, ProcessState, StateRecord, StepStatus};
use sas_engine::workflow::{Work, Workflow, load_file};
use sas_engine::{AgentName, OrderId, Owner};
use serde_json::Value;

use crate::agents::{self, Alarm, Build, Injected, Service, StandIn};
use crate::faults::{Fault, Faults};
use crate::hands::{self, Desk, Dice, Operators, Taken, flowing};
use crate::ledger::Ledger;
use crate::watch::{Watch, Watched};
use crate::world::{
    Book, Bus, Crashes, Load, Payloads, Ports, Queues, Store, Timeline, Waits, lock,
};

/// A team's own check of a seed's end.
type Assertion = Arc<dyn Fn(&End) -> Result<(), String> + Send + Sync>;

/// What a seed left, for a team's own assertions ([`Kit::asserting`]): every order as it
/// ended, and the ledger of effects.
#[derive(Debug)]
pub struct End<'a> {
    pub seed: u64,
    pub orders: Vec<Ended>,
    pub ledger: &'a Ledger,
}

/// An order as it ended.
#[derive(Clone, Debug)]
pub struct Ended {
    pub order_id: OrderId,
    /// The workflow it ran, and the version it started on and kept.
    pub workflow: String,
    pub version: u32,
    /// What it was submitted with.
    pub input: Value,
    pub state: ProcessState,
    /// Its steps' outputs, by name, for those that have one.
    pub outputs: BTreeMap<String, Value>,
    /// The steps whose effects an operator is told to undo by hand.
    pub to_undo_by_hand: Vec<String>,
}

/// What the party outside answers a step waiting for it, given the step and the order's input.
type Answers = Arc<dyn Fn(&str, &Value) -> Value + Send + Sync>;

/// Each order's timeline: what happened to it, line by line.
pub(crate) type Timelines = Arc<Mutex<HashMap<OrderId, Vec<String>>>>;

type KitAgent = Agent<Watched<Injected>, Queues, Timeline, SplitMix, Waits, Book, Payloads>;

/// How often the supervisor sweeps once the faults stop.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// A run of a team's workflows, built up then [`Kit::run`] (or [`Kit::check`]).
///
/// ```no_run
/// use sas_testkit::{Kit, StandIn};
/// # struct Tenants;
/// # impl sas_engine::ports::RemoteService for Tenants {
/// #     async fn call(&self, _: &sas_engine::ports::RemoteCall)
/// #         -> Result<serde_json::Value, sas_engine::ports::RemoteFault> { Ok(serde_json::json!({})) }
/// # }
/// Kit::new()
///     .workflow_file("shared/workflows/tenant-provisioning.json")
///     .agent("tenants", |_ledger| Tenants)
///     .stand_in("mailer", StandIn::new().refusing("send-invite", 0.2))
///     .orders(8, |i| serde_json::json!({"tenant": format!("t-{i}"), "admin_email": "a@b.c"}))
///     .check();
/// ```
#[derive(Clone)]
pub struct Kit {
    /// Each workflow file: its path (for messages), its name without `.json`, its text.
    files: Vec<(String, String, String)>,
    /// Files that could not be read.
    unread: Vec<String>,
    agents: Vec<(AgentName, Build)>,
    stand_ins: Vec<(AgentName, StandIn)>,
    orders: usize,
    input: Arc<dyn Fn(usize) -> Value + Send + Sync>,
    workflow: Option<String>,
    answer: Answers,
    seeds: Vec<u64>,
    faults: Faults,
    events: usize,
    /// The stack's settings, by the names its functions read.
    settings: BTreeMap<String, String>,
    assertions: Vec<Assertion>,
    /// The workflow files of a deploy halfway through the faults.
    redeploy: Vec<(String, String, String)>,
}

impl std::fmt::Debug for Kit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let agents: Vec<&str> = self.agents.iter().map(|(a, _)| a.as_str()).collect();
        let stand_ins: Vec<&str> = self.stand_ins.iter().map(|(a, _)| a.as_str()).collect();
        f.debug_struct("Kit")
            .field("files", &self.files.iter().map(|f| &f.0).collect::<Vec<_>>())
            .field("agents", &agents)
            .field("stand_ins", &stand_ins)
            .field("orders", &self.orders)
            .field("seeds", &self.seeds.len())
            .finish_non_exhaustive()
    }
}

impl Default for Kit {
    fn default() -> Kit {
        Kit::new()
    }
}

impl Kit {
    /// A run of nothing yet: 200 seeds (`SEED=n` runs that one alone, `KIT_SEEDS=n` the first
    /// n) of 6 orders each, every kind of fault the kit injects on (`SIM_FAULTS` and
    /// `SIM_FAULTS_OFF` choose, by name).
    pub fn new() -> Kit {
        let seeds = match std::env::var("SEED").ok().and_then(|s| s.parse().ok()) {
            Some(seed) => vec![seed],
            None => {
                let n = std::env::var("KIT_SEEDS").ok().and_then(|s| s.parse().ok());
                (0..n.unwrap_or(200)).collect()
            }
        };
        Kit {
            files: Vec::new(),
            unread: Vec::new(),
            agents: Vec::new(),
            stand_ins: Vec::new(),
            orders: 6,
            input: Arc::new(|_| Value::Object(Default::default())),
            workflow: None,
            answer: Arc::new(|_, _| serde_json::json!({})),
            seeds,
            faults: Faults::from_env().unwrap_or_else(|e| panic!("{e}")),
            events: 300,
            settings: BTreeMap::new(),
            assertions: Vec::new(),
            redeploy: Vec::new(),
        }
    }

    /// A workflow file, read now and checked as the stack checks it when the run starts
    /// (named after its workflow, `<name>.json`, or `<name>.v<version>.json` for an older
    /// version kept). The first file's workflow is the one orders go to, unless
    /// [`Kit::submitting_to`] names another.
    pub fn workflow_file(mut self, path: impl AsRef<std::path::Path>) -> Kit {
        if let Some(file) = self.read(path.as_ref()) {
            self.files.push(file);
        }
        self
    }

    /// The workflow file at `path`; one that cannot be read is noted, for the run to refuse.
    fn read(&mut self, path: &std::path::Path) -> Option<(String, String, String)> {
        match std::fs::read_to_string(path) {
            Ok(json) => Some(file(&path.display().to_string(), &json)),
            Err(e) => {
                self.unread.push(format!("{}: {e}", path.display()));
                None
            }
        }
    }

    /// A workflow file's text (`include_str!` of it), named by its `path`.
    pub fn workflow(mut self, path: &str, json: &str) -> Kit {
        self.files.push(file(path, json));
        self
    }

    /// One of the stack's settings, by the name its functions read it under (the template's
    /// parameter sets it): `SERVICE_RATES` and `SERVICE_CONCURRENCY` (`"dns=5,storage=20"`),
    /// `MAX_HOLD_SECONDS`, `FAILURE_THRESHOLD`, `HOLD_AFTER_FAILURES`... A value the stack
    /// would refuse is refused when the run starts, with its message. A service that declares
    /// a rate or a concurrency is held to it at every call, and its calls take time to travel.
    pub fn setting(mut self, name: &str, value: &str) -> Kit {
        self.settings.insert(name.to_owned(), value.to_owned());
        self
    }

    /// Halfway through the faults the stack is deployed again with these workflow files (as
    /// `sam deploy` replaces the functions: typically the new version as `<name>.json` and the
    /// one before kept as `<name>.v<N>.json`). Every order keeps the version it started on,
    /// and its steps, to its end; one accepted after takes the new one. A file that cannot be
    /// read, or that the stack would refuse, is an error when the run starts.
    pub fn deploying_midway<P: AsRef<std::path::Path>>(
        mut self,
        paths: impl IntoIterator<Item = P>,
    ) -> Kit {
        for path in paths {
            if let Some(file) = self.read(path.as_ref()) {
                self.redeploy.push(file);
            }
        }
        self
    }

    /// As [`Kit::deploying_midway`], the files' texts, each named by its path.
    pub fn deploying_midway_json(mut self, files: &[(&str, &str)]) -> Kit {
        self.redeploy.extend(files.iter().map(|(path, json)| file(path, json)));
        self
    }

    /// The agent `name` is the team's own service, built afresh for each seed by `build`,
    /// which is given the seed's [`Ledger`] to record the effects its fakes make.
    pub fn agent<R, F>(mut self, name: &str, build: F) -> Kit
    where
        R: sas_engine::ports::RemoteService + 'static,
        F: Fn(&Ledger) -> R + Send + Sync + 'static,
    {
        self.agents.push((AgentName::new(name), agents::own(build)));
        self
    }

    /// The agent `name` calls a stand-in for its HTTP service.
    pub fn stand_in(mut self, name: &str, stand_in: StandIn) -> Kit {
        self.stand_ins.push((AgentName::new(name), stand_in));
        self
    }

    /// Each seed submits `n` orders, the i-th with the input `input(i)`.
    pub fn orders(
        mut self,
        n: usize,
        input: impl Fn(usize) -> Value + Send + Sync + 'static,
    ) -> Kit {
        self.orders = n;
        self.input = Arc::new(input);
        self
    }

    /// A check of the team's own, on what each seed left once every order ended (and the
    /// kit's own checks passed): an error fails the seed, with its message, as a broken
    /// invariant does.
    pub fn asserting(
        mut self,
        check: impl Fn(&End) -> Result<(), String> + Send + Sync + 'static,
    ) -> Kit {
        self.assertions.push(Arc::new(check));
        self
    }

    /// Orders go to this workflow rather than the first file's.
    pub fn submitting_to(mut self, workflow: &str) -> Kit {
        self.workflow = Some(workflow.to_owned());
        self
    }

    /// What the party outside answers a step that waits for an answer (`callback`), given the
    /// step's name and the order's input; `{}` if not said.
    pub fn answering(
        mut self,
        answer: impl Fn(&str, &Value) -> Value + Send + Sync + 'static,
    ) -> Kit {
        self.answer = Arc::new(answer);
        self
    }

    /// These seeds (`SEED=n` still runs that one alone).
    pub fn seeds(mut self, seeds: impl IntoIterator<Item = u64>) -> Kit {
        if std::env::var("SEED").is_err() {
            self.seeds = seeds.into_iter().collect();
        }
        self
    }

    /// Only these kinds of fault (the environment's switches apply over them).
    pub fn faults(mut self, faults: Faults) -> Kit {
        let from_env = Faults::from_env().unwrap_or_else(|e| panic!("{e}"));
        self.faults = Fault::ALL
            .into_iter()
            .filter(|f| faults.on(*f) && from_env.on(*f))
            .fold(Faults::none(), Faults::with);
        self
    }

    /// Runs every seed, and panics with the first failure (its seed, the broken invariant
    /// and the order's timeline) or with the setup's error; returns what the seeds did.
    pub fn check(self) -> Report {
        match self.run() {
            Ok(report) if report.failures.is_empty() => {
                eprintln!("{report}");
                report
            }
            Ok(report) => {
                // The test harness names each test's thread after the test.
                let test = std::thread::current().name().unwrap_or("<this test>").to_owned();
                let seed = report.failures[0].seed;
                panic!("{report}run it alone: SEED={seed} cargo test -- --exact {test}")
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// Runs every seed, each on the threads the machine has; a workflow file the stack would
    /// refuse, or an agent its workflows name that the kit was not given, is an error.
    pub fn run(self) -> Result<Report, String> {
        let setup = Arc::new(self.setup()?);
        let seeds = Arc::new(Mutex::new(self.seeds.clone().into_iter()));
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
        let reports: Vec<Report> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    let (seeds, setup, kit) = (seeds.clone(), setup.clone(), &self);
                    scope.spawn(move || {
                        let runtime = tokio::runtime::Builder::new_current_thread()
                            .build()
                            .unwrap_or_else(|e| panic!("a runtime for the kit: {e}"));
                        let mut report = Report::default();
                        loop {
                            let Some(seed) = lock(&seeds).next() else { break };
                            let one = runtime.block_on(Run::new(kit, &setup, seed).go());
                            report += one;
                        }
                        report
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap_or_default()).collect()
        });
        let mut report = reports.into_iter().fold(Report::default(), |mut a, b| {
            a += b;
            a
        });
        report.failures.sort_by_key(|f| f.seed);
        Ok(report)
    }

    fn setup(&self) -> Result<Setup, String> {
        if let Some(unread) = self.unread.first() {
            return Err(unread.clone());
        }
        if self.files.is_empty() {
            return Err("no workflow file: give the kit one with workflow_file".into());
        }
        let deployed: Vec<AgentName> = self
            .agents
            .iter()
            .map(|(a, _)| a.clone())
            .chain(self.stand_ins.iter().map(|(a, _)| a.clone()))
            .collect();
        let load = |files: &[(String, String, String)]| {
            let workflows = files
                .iter()
                .map(|(path, name, json)| load_file(path, name, json, &deployed))
                .collect::<Result<Vec<Workflow>, _>>()
                .map_err(|e| e.to_string())?;
            Catalogue::new(workflows).map_err(|e| e.to_string())
        };
        let catalogue = load(&self.files)?;
        let next = match self.redeploy.is_empty() {
            true => None,
            false => Some(Arc::new(load(&self.redeploy)?)),
        };
        let name = match &self.workflow {
            Some(name) => name.clone(),
            None => self.files[0].1.split(".v").next().unwrap_or_default().to_owned(),
        };
        catalogue.current(&name).ok_or_else(|| format!("no workflow named {name}"))?;
        let used: Vec<AgentName> =
            catalogue.agents().into_iter().chain(next.iter().flat_map(|n| n.agents())).collect();
        let mut unused: Vec<&str> =
            deployed.iter().filter(|a| !used.contains(a)).map(|a| a.as_str()).collect();
        unused.sort();
        if !unused.is_empty() {
            return Err(format!(
                "agents no workflow uses: {} (a step names each agent it runs on)",
                unused.join(", ")
            ));
        }
        let settings = &self.settings;
        let config =
            EngineConfig::from_lookup(|k| settings.get(k).cloned()).map_err(|e| e.to_string())?;
        let unknown: Vec<&str> = config
            .limits
            .keys()
            .filter(|a| !deployed.iter().any(|d| d.as_str() == a.as_str()))
            .map(String::as_str)
            .collect();
        if !unknown.is_empty() {
            return Err(format!("limits of agents that are not deployed: {}", unknown.join(", ")));
        }
        let config = Arc::new(EngineConfig { index_shards: 4, ..config });
        if let Some(next) = &next {
            next.current(&name)
                .ok_or_else(|| format!("no workflow named {name} in the files deployed midway"))?;
        }
        let actions = used
            .iter()
            .map(|agent| {
                let mut of_agent = undo_flags(&catalogue, agent);
                for more in next.iter().flat_map(|next| undo_flags(next, agent)) {
                    if !of_agent.contains(&more) {
                        of_agent.push(more);
                    }
                }
                (agent.clone(), of_agent)
            })
            .collect();
        let answered = std::iter::once(&catalogue)
            .chain(next.as_deref())
            .flat_map(|c| c.all())
            .any(|w| w.steps().iter().any(|s| matches!(s.work, Work::Callback)));
        Ok(Setup {
            catalogue: Arc::new(catalogue),
            next,
            workflow: name,
            config,
            actions,
            answered,
        })
    }
}

struct Setup {
    catalogue: Arc<Catalogue>,
    /// What is deployed midway, if anything.
    next: Option<Arc<Catalogue>>,
    workflow: String,
    config: Arc<EngineConfig>,
    /// Every agent either deploy's workflows name, with its actions (and whether each is an
    /// undo).
    actions: Vec<(AgentName, Vec<(String, bool)>)>,
    /// Whether a step of the workflows waits for an answer from outside.
    answered: bool,
}

/// A workflow file: its path (for messages), its name without `.json`, its text.
fn file(path: &str, json: &str) -> (String, String, String) {
    let stem = std::path::Path::new(path).file_stem();
    let name = stem.map_or(path.into(), |s| s.to_string_lossy().into_owned());
    (path.to_owned(), name, json.to_owned())
}

/// What the seeds did: how their orders ended, the faults injected, and every seed that broke
/// an invariant.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub seeds: u64,
    pub orders: u64,
    pub processed: u64,
    pub compensated: u64,
    pub cancelled: u64,
    /// Orders in Error with nothing left in place (`compensated`), and with steps left for the
    /// operators to undo by hand (`errors`).
    pub errors: u64,
    /// Effects the ledger recorded, done and undone.
    pub effects: u64,
    /// Calls that reached a service with a declared rate or concurrency, and of them those
    /// that filled its second or took its last place in flight: how hard the limits were met.
    pub limited_calls: u64,
    pub full: u64,
    /// Orders seen waiting in line while every place of their concurrency key was taken.
    pub in_line: u64,
    pub injected: BTreeMap<&'static str, u64>,
    pub failures: Vec<Failure>,
}

impl std::ops::AddAssign for Report {
    fn add_assign(&mut self, o: Report) {
        self.seeds += o.seeds;
        self.orders += o.orders;
        self.processed += o.processed;
        self.compensated += o.compensated;
        self.cancelled += o.cancelled;
        self.errors += o.errors;
        self.effects += o.effects;
        self.limited_calls += o.limited_calls;
        self.full += o.full;
        self.in_line += o.in_line;
        for (k, n) in o.injected {
            *self.injected.entry(k).or_default() += n;
        }
        self.failures.extend(o.failures);
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(first) = self.failures.first() {
            return writeln!(
                f,
                "{} of {} seeds failed; the first:\n{first}",
                self.failures.len(),
                self.seeds
            );
        }
        let injected: Vec<String> = self
            .injected
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        write!(
            f,
            "{} seeds, {} orders: {} processed, {} compensated, {} cancelled, {} in error; {} effects; {} calls at declared limits, {} of them at the limit; {} orders waited in line for their key; injected: {}",
            self.seeds,
            self.orders,
            self.processed,
            self.compensated,
            self.cancelled,
            self.errors,
            self.effects,
            self.limited_calls,
            self.full,
            self.in_line,
            injected.join(", ")
        )
    }
}

/// A seed that broke an invariant.
#[derive(Clone, Debug)]
pub struct Failure {
    pub seed: u64,
    /// The invariant, in a few words.
    pub invariant: &'static str,
    pub order: Option<OrderId>,
    /// What broke it.
    pub detail: String,
    /// The order's timeline up to then.
    pub timeline: Vec<String>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "seed {}: {}: {}", self.seed, self.invariant, self.detail)?;
        if let Some(order) = self.order {
            writeln!(f, "timeline of {order}:")?;
            for line in &self.timeline {
                writeln!(f, "  {line}")?;
            }
        }
        Ok(())
    }
}

type Broken = (&'static str, Option<OrderId>, String);

/// One seed's run.
struct Run {
    seed: u64,
    /// What the services are built on, to build them again at a deploy.
    system: Assembly<Store, Bus, ManualClock, Waits, Load, Payloads>,
    outbox: Queues,
    /// The workflows deployed midway, until they are; when they were.
    next: Option<Arc<Catalogue>>,
    deployed_at: Option<sas_engine::Timestamp>,
    rng: SplitMix,
    faults: Faults,
    on: Arc<AtomicBool>,
    clock: ManualClock,
    memory: Arc<MemoryStore<ManualClock>>,
    queues: Arc<MemoryQueues<ManualClock>>,
    bus: Arc<MemoryBus>,
    crashes: Crashes,
    submission: Submission<Store, Queues, Bus, ManualClock, SeqIds, Load, Payloads>,
    scheduler: Scheduler<Store, Queues, Bus, ManualClock, Waits, Payloads>,
    supervisors: [Supervisor<Store, Store, Queues, Bus, ManualClock, Load, Payloads>; 2],
    operator: Operator<Store, Queues, Bus, ManualClock, Payloads>,
    agents: HashMap<Destination, KitAgent>,
    destinations: Vec<Destination>,
    book: Book,
    /// The operators' desk, where services are held and released by hand.
    desk: Desk,
    ledger: Ledger,
    ledger_checked: usize,
    catalogue: Arc<Catalogue>,
    workflow: String,
    orders: usize,
    input: Arc<dyn Fn(usize) -> Value + Send + Sync>,
    answer: Answers,
    events: usize,
    assertions: Vec<Assertion>,
    /// Whether a step of the workflows waits for an answer from outside.
    answered: bool,
    accepted: Vec<OrderId>,
    inputs: HashMap<OrderId, Value>,
    timelines: Timelines,
    alarms: Alarm,
    /// What reached the services, against the book and their declared limits.
    watch: Arc<Mutex<Watch>>,
    /// Each order as the last check saw it.
    previous: HashMap<OrderId, StateRecord>,
    /// The steps seen with their undo failed: an operator's redrive undoes them later,
    /// after the steps they depend on.
    undo_failed: std::collections::HashSet<(OrderId, String)>,
    /// Orders seen waiting in line while every place of their key was taken.
    in_line: std::collections::HashSet<OrderId>,
    operators: Operators,
    injected: [u64; Fault::ALL.len()],
    remote_injected: Arc<Mutex<[u64; Fault::ALL.len()]>>,
}

impl Run {
    fn new(kit: &Kit, setup: &Setup, seed: u64) -> Run {
        let rng = SplitMix::seeded(seed);
        let faults = kit.faults;
        let Ports { clock, timeline, memory, queues, waits, bus, shelf, crashes } =
            Ports::new(seed, faults);
        let config = setup.config.clone();
        let system = Assembly {
            store: crashes.wrap(memory.clone()),
            bus: crashes.wrap(bus.clone()),
            clock: clock.clone(),
            config: config.clone(),
            catalogue: setup.catalogue.clone(),
            waits: waits.clone(),
            load: Gauges { waits: waits.clone(), depths: queues.clone() },
            payloads: crashes.wrap(shelf),
        };
        let outbox = crashes.wrap(queues.clone());
        let book = Book::default();
        let ledger = Ledger::default();
        ledger.set_clock(clock.clone());
        let on = Arc::new(AtomicBool::new(true));
        let timelines = Timelines::default();
        let alarms = Alarm::default();
        let watch = Arc::new(Mutex::new(Watch::default()));
        let remote_injected = Arc::new(Mutex::new([0; Fault::ALL.len()]));
        let mut agents = HashMap::new();
        for (n, (name, of_agent)) in setup.actions.iter().enumerate() {
            let service = match kit.agents.iter().find(|(a, _)| a == name) {
                Some((_, build)) => Service::Own(build(&ledger)),
                None => {
                    let (_, stand_in) = kit
                        .stand_ins
                        .iter()
                        .find(|(a, _)| a == name)
                        .unwrap_or_else(|| unreachable!("every agent is deployed"));
                    let remote = stand_in.build(&timeline, clock.now(), of_agent, seed ^ n as u64);
                    Service::StandIn { remote, seen: Arc::default() }
                }
            };
            let own = matches!(service, Service::Own(_));
            let draws = SplitMix::seeded(seed.rotate_left(17) ^ (n as u64 + 1));
            let spells = agents::spells(&draws, clock.now(), faults, of_agent);
            let injected = Injected {
                agent: name.as_str().to_owned(),
                service,
                ledger: ledger.clone(),
                clock: timeline.clone(),
                draws: Arc::new(draws),
                faults,
                on: on.clone(),
                spells: Arc::new(spells),
                own,
                alarms: alarms.clone(),
                timeline: timelines.clone(),
                injected: remote_injected.clone(),
                reached: Arc::default(),
                refused: Arc::default(),
            };
            let limits = config.limits_of(name.as_str());
            let watched = Watched {
                remote: injected,
                book: book.clone(),
                service: name.as_str().to_owned(),
                clock: timeline.clone(),
                watch: watch.clone(),
                limits,
                // A service that declares limits takes time to reach and to answer, as
                // the room its agent's turns leave for travel must allow.
                times: (!limits.is_none())
                    .then(|| Arc::new(SplitMix::seeded(seed ^ 0x7157 ^ n as u64))),
            };
            let agent = system
                .on_clock(timeline.clone())
                .agent(
                    name,
                    watched,
                    outbox.clone(),
                    SplitMix::seeded(seed.wrapping_add(n as u64)),
                    format!("agent-{name}"),
                )
                .guarded(book.clone(), name.as_str(), config.hold)
                .limited(limits);
            agents.insert(Destination::Agent(name.clone()), agent);
        }
        let supervisor = || system.supervisor(outbox.clone());
        let desk = ServiceDesk {
            book: book.clone(),
            index: memory.clone(),
            clock: clock.clone(),
            agents: setup.actions.iter().map(|(a, _)| a.clone()).collect(),
            limits: config.limits.clone(),
            actions: setup.catalogue.actions(),
        };
        Run {
            system: system.clone(),
            outbox: outbox.clone(),
            desk,
            seed,
            rng,
            faults,
            on,
            submission: system.submission(outbox.clone(), SeqIds::new("k")),
            scheduler: system.scheduler(outbox.clone(), "scheduler-k"),
            supervisors: [supervisor(), supervisor()],
            operator: system.operator(outbox.clone()),
            destinations: setup.next.as_ref().map_or_else(
                || system.destinations(),
                |n| system.running(n.clone()).destinations(),
            ),
            next: setup.next.clone(),
            deployed_at: None,
            clock,
            memory,
            queues,
            bus,
            crashes,
            agents,
            book,
            ledger,
            ledger_checked: 0,
            catalogue: setup.catalogue.clone(),
            workflow: setup.workflow.clone(),
            orders: kit.orders,
            input: kit.input.clone(),
            answer: kit.answer.clone(),
            events: kit.events,
            assertions: kit.assertions.clone(),
            answered: setup.answered,
            accepted: Vec::new(),
            inputs: HashMap::new(),
            timelines,
            alarms,
            watch,
            previous: HashMap::new(),
            in_line: Default::default(),
            undo_failed: Default::default(),
            operators: Operators::default(),
            injected: [0; Fault::ALL.len()],
            remote_injected,
        }
    }

    /// The whole run: faults while the orders arrive, then none until every order ended.
    async fn go(mut self) -> Report {
        let outcome = self.faulty().await;
        let outcome = match outcome {
            Ok(()) => self.settle().await,
            broken => broken,
        };
        let mut report =
            Report { seeds: 1, orders: self.accepted.len() as u64, ..Report::default() };
        for r in self.memory.records() {
            match r.process_state {
                ProcessState::Processed => report.processed += 1,
                ProcessState::Cancelled => report.cancelled += 1,
                ProcessState::Error if r.needs_manual_undo().is_empty() => report.compensated += 1,
                ProcessState::Error => report.errors += 1,
                _ => {}
            }
        }
        report.effects = self.ledger.len() as u64;
        report.in_line = self.in_line.len() as u64;
        let watch = lock(&self.watch);
        report.limited_calls = watch.limited_calls;
        report.full = watch.full_seconds + watch.full_places;
        drop(watch);
        let remote = *lock(&self.remote_injected);
        for f in Fault::ALL {
            let n = self.injected[f as usize] + remote[f as usize];
            *report.injected.entry(f.name()).or_default() += n;
        }
        *report.injected.entry(Fault::Crash.name()).or_default() += u64::from(self.crashes.count());
        let stats = self.memory.stats();
        *report.injected.entry(Fault::IndexLag.name()).or_default() += stats.stale_index_queries;
        *report.injected.entry(Fault::StaleRead.name()).or_default() += stats.stale_reads;
        if let Err((invariant, order, detail)) = outcome {
            let timeline =
                order.and_then(|o| lock(&self.timelines).get(&o).cloned()).unwrap_or_default();
            report.failures.push(Failure { seed: self.seed, invariant, order, detail, timeline });
        }
        report
    }

    async fn faulty(&mut self) -> Result<(), Broken> {
        let burst = self.orders.div_ceil(2);
        let spread = self.events.saturating_sub(40).max(1);
        let mut submitted = 0;
        for event in 0..self.events {
            if event == self.events / 2 {
                self.deploy();
            }
            while submitted < self.orders
                && (submitted < burst
                    || event >= (submitted - burst) * spread / (self.orders - burst).max(1))
            {
                self.submit(submitted).await?;
                submitted += 1;
                self.check()?;
            }
            match self.pick(20) {
                0..=13 => {
                    self.deliver().await?;
                }
                14..=17 => self.clock.advance(Duration::from_millis(self.pick(20_000) as u64)),
                _ => self.sweep().await?,
            }
            self.check()?;
            if self.chance(Fault::Operator, 0.04) {
                self.operate().await?;
                self.check()?;
            }
            if self.chance(Fault::ManualHold, 0.02) {
                self.hold_by_hand().await?;
                self.check()?;
            }
            if self.answered && self.chance(Fault::Answer, 0.06) {
                self.answer(true).await?;
                self.check()?;
            }
        }
        while submitted < self.orders {
            self.submit(submitted).await?;
            submitted += 1;
        }
        Ok(())
    }

    /// Deploys the workflows given for midway: the services start again on them; what is in
    /// flight stays where it is.
    fn deploy(&mut self) {
        let Some(next) = self.next.take() else { return };
        let system = self.system.running(next.clone());
        let outbox = || self.outbox.clone();
        self.submission = system.submission(outbox(), SeqIds::new("d"));
        self.scheduler = system.scheduler(outbox(), "scheduler-d");
        self.supervisors = [system.supervisor(outbox()), system.supervisor(outbox())];
        self.operator = system.operator(outbox());
        // The operators' desk knows the new version's actions, as the redeployed admin does.
        self.desk.actions = next.actions();
        self.catalogue = next;
        let at = self.clock.now();
        self.deployed_at = Some(at);
        for id in self.accepted.clone() {
            self.note(id, format!("deployed again at {at}"));
        }
    }

    /// With the faults stopped, every order must end: messages delivered as they come, the
    /// supervisor sweeping every few seconds, the clock jumping to the next deadline when
    /// nothing else is due (a wait of a year takes a few sweeps).
    async fn settle(&mut self) -> Result<(), Broken> {
        self.on.store(false, Ordering::Relaxed);
        self.memory.fail_next_writes(0);
        self.crashes.disarm();
        self.release_by_hand().await?;
        let stopped = self.clock.now();
        let mut rounds = 0;
        loop {
            self.resume_paused().await?;
            self.answer(false).await?;
            while self.deliver().await? {
                self.check()?;
            }
            if self.finished() {
                break;
            }
            rounds += 1;
            if rounds > 20_000 {
                let (id, state) = self.unfinished()[0];
                let record = self.memory.peek(id).map(|r| serde_json::to_string(&r));
                return Err((
                    "every order ends",
                    Some(id),
                    format!(
                        "{id} is still {state:?} {} s after the faults stopped: {record:?}",
                        stopped.until(self.clock.now()).as_secs()
                    ),
                ));
            }
            self.clock.advance(self.next_jump());
            self.sweep().await?;
            self.check()?;
        }
        self.check()?;
        self.check_end()?;
        self.check_team()
    }

    /// The team's own assertions, on what the seed left.
    fn check_team(&self) -> Result<(), Broken> {
        if self.assertions.is_empty() {
            return Ok(());
        }
        let mut orders: Vec<Ended> = self
            .memory
            .records()
            .into_iter()
            .map(|r| Ended {
                order_id: r.order_id,
                workflow: r.workflow.clone(),
                version: r.workflow_version,
                input: self.inputs.get(&r.order_id).cloned().unwrap_or_default(),
                state: r.process_state,
                outputs: r
                    .steps
                    .iter()
                    .filter_map(|s| Some((s.name.clone(), s.output.clone()?)))
                    .collect(),
                to_undo_by_hand: r.needs_manual_undo(),
            })
            .collect();
        orders.sort_by_key(|o| o.order_id);
        let end = End { seed: self.seed, orders, ledger: &self.ledger };
        for check in &self.assertions {
            check(&end).map_err(|what| {
                // The order the message names, if it names one, has its timeline printed.
                let named = end.orders.iter().find(|o| what.contains(&o.order_id.to_string()));
                ("the team's own assertion", named.map(|o| o.order_id), what)
            })?;
        }
        Ok(())
    }

    /// How far the clock may move with nothing missed: a sweep's interval, or up to the next
    /// deadline of any order when no message waits.
    fn next_jump(&self) -> Duration {
        // A hold with no order waiting for it lasts until an order needs its service; one
        // waiting for it is due at its own deadline, which bounds the jump.
        if self.destinations.iter().any(|d| !self.queues.is_empty(d)) {
            return SWEEP_EVERY;
        }
        let now = self.clock.now();
        let due = self.memory.records().iter().filter_map(|r| r.complete_by).min();
        due.map_or(SWEEP_EVERY, |d| now.until(d).max(SWEEP_EVERY))
    }

    fn finished(&self) -> bool {
        self.memory.records().iter().all(|r| r.is_terminal() && r.complete_by.is_none())
    }

    fn unfinished(&self) -> Vec<(OrderId, ProcessState)> {
        let mut left: Vec<(OrderId, ProcessState)> = self
            .memory
            .records()
            .into_iter()
            .filter(|r| !(r.is_terminal() && r.complete_by.is_none()))
            .map(|r| (r.order_id, r.process_state))
            .collect();
        left.sort_by_key(|(id, _)| *id);
        left
    }

    fn chance(&mut self, fault: Fault, p: f64) -> bool {
        if !self.on.load(Ordering::Relaxed) {
            return false;
        }
        let hit = self.rng.unit() < p && self.faults.on(fault);
        if hit && fault != Fault::Crash {
            self.injected[fault as usize] += 1;
        }
        hit
    }

    fn pick(&self, n: usize) -> usize {
        hands::pick(&self.rng, n)
    }

    fn maybe_crash(&mut self) {
        if self.chance(Fault::Crash, 0.08) {
            self.crashes.arm(1 + self.pick(5) as u32);
        }
    }

    fn note(&self, order: OrderId, line: String) {
        let line = format!("{} {line}", self.clock.now());
        lock(&self.timelines).entry(order).or_default().push(line);
    }

    /// Submits order `i`, as a client does: again with the same key until it is accepted. An
    /// input the workflow refuses is the team's test's mistake, reported as such.
    async fn submit(&mut self, i: usize) -> Result<(), Broken> {
        let input = (self.input)(i);
        let body = input.to_string();
        let key = format!("kit-{i}");
        let mut last = None;
        for _ in 0..20 {
            self.maybe_crash();
            if self.chance(Fault::Throttled, 0.05) {
                self.memory.fail_next_writes(1);
            }
            let owner = Owner::anonymous();
            let submitted = self
                .submission
                .submit_to(&owner, Some(&self.workflow), &key, body.as_bytes())
                .await;
            self.crashes.disarm();
            match submitted {
                Ok(accepted) => {
                    self.note(accepted.order_id, format!("accepted as {key}: {body}"));
                    self.accepted.push(accepted.order_id);
                    self.inputs.insert(accepted.order_id, input);
                    return Ok(());
                }
                Err(e) if !e.is_retryable() => {
                    return Err((
                        "the orders are ones the workflow takes",
                        None,
                        format!("order {i} ({body}) was refused: {e}"),
                    ));
                }
                Err(e) => last = Some(e),
            }
        }
        Err(("every order is accepted", None, format!("order {i} was never accepted: {last:?}")))
    }

    /// Delivers one message from a queue, with the faults the seed draws; false if every
    /// queue was empty.
    async fn deliver(&mut self) -> Result<bool, Broken> {
        let start = self.pick(self.destinations.len());
        for k in 0..self.destinations.len() {
            let dest = self.destinations[(start + k) % self.destinations.len()].clone();
            let batch = self.queues.receive(&dest, 10);
            if batch.is_empty() {
                continue;
            }
            let on = self.on.load(Ordering::Relaxed);
            let mut dice = Dice { rng: &self.rng, faults: self.faults, on, drawn: Vec::new() };
            let taken = hands::take(&self.queues, &dest, batch, true, &mut dice);
            for fault in dice.drawn {
                self.injected[fault as usize] += 1;
            }
            let d = match taken {
                Taken::Turn(taken) => {
                    self.handle_turn(&dest, taken).await?;
                    return Ok(true);
                }
                Taken::Together(taken) => {
                    self.handle_together(&dest, taken).await?;
                    return Ok(true);
                }
                Taken::Lost => return Ok(true),
                Taken::One { delivery, .. } => delivery,
            };
            if self.chance(Fault::Throttled, 0.03) {
                self.memory.fail_next_writes(1);
            }
            self.maybe_crash();
            self.handle_together(&dest, vec![d]).await?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Handles `taken` (one message, or a few side by side), each as its consumer does; a message the system sent
    /// and refuses breaks the run.
    async fn handle_together(
        &mut self,
        dest: &Destination,
        taken: Vec<Delivery>,
    ) -> Result<(), Broken> {
        let messages = decode(&taken)?;
        let (agent, scheduler) = (self.agents.get(dest), &self.scheduler);
        let handled =
            futures_util::future::join_all(taken.iter().zip(&messages).map(|(d, m)| async move {
                let incoming =
                    Incoming { message_id: d.identity(), receive_count: d.receive_count };
                match (m, agent) {
                    (Message::Request(r), Some(a)) => a.handle(r, incoming).await.map(|_| ()),
                    (Message::Elements(r), Some(a)) => {
                        a.handle_elements(r, incoming).await.map(|_| ())
                    }
                    (m, _) => scheduler.handle(m, incoming).await.map(|_| ()),
                }
            }))
            .await;
        self.crashes.disarm();
        self.done_with(dest, &taken, &messages, handled)
    }

    /// Handles one order's messages in one turn, as the deployed scheduler does.
    async fn handle_turn(
        &mut self,
        dest: &Destination,
        taken: Vec<Delivery>,
    ) -> Result<(), Broken> {
        let messages = decode(&taken)?;
        let turn = hands::incoming(&taken, &messages);
        self.maybe_crash();
        let handled = self.scheduler.handle_turn(&turn).await;
        self.crashes.disarm();
        let handled = handled.into_iter().map(|h| h.map(|_| ())).collect();
        self.done_with(dest, &taken, &messages, handled)
    }

    /// Deletes what was handled; what failed stays for its redelivery.
    fn done_with(
        &self,
        dest: &Destination,
        taken: &[Delivery],
        messages: &[Message],
        handled: Vec<sas_engine::Result<()>>,
    ) -> Result<(), Broken> {
        for ((d, m), handled) in taken.iter().zip(messages).zip(handled) {
            if let Err(sas_engine::Error::InvalidMessage(why)) = &handled {
                return Err(("the system sends only messages it takes", m.order_id(), why.clone()));
            }
            if handled.is_ok() {
                let _ = self.queues.delete(dest, &d.receipt);
            }
        }
        Ok(())
    }

    async fn sweep(&mut self) -> Result<(), Broken> {
        if self.chance(Fault::DoubleSweep, 0.2) {
            let (a, b) = (&self.supervisors[0], &self.supervisors[1]);
            let book = &self.book;
            let (ra, rb) = futures_util::future::join(
                async {
                    let swept = a.sweep().await;
                    let _ = a.tend(book, flowing(&swept)).await;
                    swept
                },
                async {
                    let swept = b.sweep().await;
                    let _ = b.tend(book, flowing(&swept)).await;
                    swept
                },
            )
            .await;
            self.judge(ra)?;
            return self.judge(rb);
        }
        self.maybe_crash();
        let swept = self.supervisors[0].sweep().await;
        let tended = self.supervisors[0].tend(&self.book, flowing(&swept)).await;
        self.crashes.disarm();
        let faults_on = self.on.load(Ordering::Relaxed);
        if let Err(e) = tended.as_ref().map(|r| r.errors).map_err(|e| e.to_string()) {
            if !faults_on {
                return Err(("the supervisor tends the services", None, e));
            }
        }
        self.judge(swept)
    }

    fn judge(&self, swept: sas_engine::Result<SweepReport>) -> Result<(), Broken> {
        let on = self.on.load(Ordering::Relaxed);
        match swept {
            Ok(r) if r.illegal > 0 => {
                Err(("every record is one the machine can judge", None, format!("{r:?}")))
            }
            Ok(r) if !on && r.errors > 0 => {
                Err(("a sweep without faults succeeds", None, format!("{r:?}")))
            }
            Err(e) if !(on && e.is_retryable()) => {
                Err(("a sweep without faults succeeds", None, e.to_string()))
            }
            _ => Ok(()),
        }
    }

    /// An operator's command on a random order, fitting its state: cancel or pause one in
    /// flight, resume one paused, redrive one in error, undo one processed.
    async fn operate(&mut self) -> Result<(), Broken> {
        if self.accepted.is_empty() {
            return Ok(());
        }
        let id = self.accepted[self.pick(self.accepted.len())];
        let state = self.memory.peek(id).map(|r| {
            let undo_failed = r.steps.iter().any(|s| s.status == StepStatus::UndoFailed);
            (r.process_state, undo_failed)
        });
        let (kind, command_id) = self.operators.choose(id, state, &self.rng);
        self.maybe_crash();
        self.command(id, kind, &command_id).await
    }

    async fn command(
        &mut self,
        id: OrderId,
        kind: CommandKind,
        command_id: &str,
    ) -> Result<(), Broken> {
        let command = Command::new(kind, command_id, "kit-operator", "the kit's operator")
            .unwrap_or_else(|e| unreachable!("a command the kit makes: {e}"));
        let done = self.operator.command(id, &command).await;
        self.crashes.disarm();
        let what = match &done {
            Ok(Some(Commanded { applied: Applied::Refused(why), .. })) => format!("refused: {why}"),
            Ok(None) => "refused: no such order".to_owned(),
            Ok(_) => "applied".to_owned(),
            Err(e) => format!("failed: {e}"),
        };
        self.note(id, format!("operator: {kind:?} {what}"));
        match done {
            Err(e) if !e.is_retryable() => {
                Err(("an operator's command is applied or refused", Some(id), e.to_string()))
            }
            _ => Ok(()),
        }
    }

    /// An operator holds a service, or an action of it, by hand, or releases a hold.
    async fn hold_by_hand(&mut self) -> Result<(), Broken> {
        let services: Vec<String> =
            self.desk.agents.iter().map(|a| a.as_str().to_owned()).collect();
        hands::hold_by_hand(&self.desk, &self.clock, &self.rng, &services)
            .await
            .map_err(|e| ("the operators' desk holds and releases", None, e))
    }

    /// Once the faults stop, the operator releases what it holds by hand.
    async fn release_by_hand(&mut self) -> Result<(), Broken> {
        hands::release_by_hand(&self.desk)
            .await
            .map_err(|e| ("the operators' desk holds and releases", None, e))
    }

    /// Once the faults stop, the operator resumes every order it paused.
    async fn resume_paused(&mut self) -> Result<(), Broken> {
        let mut paused: Vec<OrderId> = self
            .memory
            .records()
            .into_iter()
            .filter(|r| r.process_state == ProcessState::Paused)
            .map(|r| r.order_id)
            .collect();
        paused.sort();
        for id in paused {
            let command_id = self.operators.next_id();
            self.command(id, CommandKind::Resume, &command_id).await?;
        }
        Ok(())
    }

    /// The party outside answers steps announced as waiting for it. With faults on, one
    /// random announcement, sometimes with a forged token or a refusal; once they stop,
    /// every step still waiting, with its token, as the team's answer says.
    async fn answer(&mut self, faulty: bool) -> Result<(), Broken> {
        let announced = self.bus.of_type(CALLBACK_DETAIL_TYPE);
        if announced.is_empty() {
            return Ok(());
        }
        let chosen: Vec<&Value> = if faulty {
            vec![&announced[self.pick(announced.len())]]
        } else {
            announced.iter().collect()
        };
        for a in chosen {
            let Some(id) = a["order_id"].as_str().and_then(|s| s.parse::<OrderId>().ok()) else {
                continue;
            };
            let step = a["step"].as_str().unwrap_or_default().to_owned();
            let Some(r) = self.memory.peek(id) else { continue };
            let waiting = r.steps.iter().find(|s| s.name == step);
            let current = waiting.and_then(|s| s.token.clone());
            if !faulty && (current.as_deref() != a["token"].as_str() || r.is_terminal()) {
                continue;
            }
            let input = self.inputs.get(&id).cloned().unwrap_or_default();
            let output = (self.answer)(&step, &input);
            let (token, answering) = if faulty {
                let Some((_, _, token, answering)) = hands::answer_to(a, &self.rng, output) else {
                    continue;
                };
                (token, answering)
            } else {
                let token = a["token"].as_str();
                let complete = Answer::Complete { output };
                let Ok(answering) = Answering::new(&step, token, complete, "sim-party", "the kit")
                else {
                    continue;
                };
                (token.map(str::to_owned), answering)
            };
            let kind = match &answering.answer {
                Answer::Refuse => "refusal",
                Answer::Heartbeat => "heartbeat",
                Answer::Complete { .. } => "answer",
            };
            if faulty {
                self.maybe_crash();
            }
            let done = self.operator.answer(id, &answering).await;
            self.crashes.disarm();
            let what = match &done {
                Ok(Some(Commanded { applied: Applied::Refused(_), .. })) => "refused",
                Ok(_) => "taken",
                Err(_) => "failed",
            };
            self.note(id, format!("party outside: {kind} to {step}: {what}"));
            if let Ok(Some(Commanded { applied: Applied::Now, .. })) = done {
                hands::check_answer_taken(&r, &step, token.as_deref()).map_err(|e| {
                    ("an answer counts only when the step waits for it", Some(id), e)
                })?;
            }
        }
        Ok(())
    }

    /// The invariants, after every event.
    fn check(&mut self) -> Result<(), Broken> {
        if let Some((order, what)) = lock(&self.alarms).first().cloned() {
            return Err(("the agents' services behave", Some(order), what));
        }
        {
            let watch = lock(&self.watch);
            if let Some(intruder) = watch.intruders.first() {
                return Err((
                    "nothing but its probe reaches a held service",
                    None,
                    intruder.clone(),
                ));
            }
            if let Some(overrun) = watch.overruns.first() {
                return Err(("each service is kept to its declared rate", None, overrun.clone()));
            }
        }
        let records: Vec<StateRecord> = self.memory.records();
        let stored: std::collections::HashSet<OrderId> =
            records.iter().map(|r| r.order_id).collect();
        if let Some(id) = self.accepted.iter().find(|id| !stored.contains(id)) {
            return Err(("no accepted order is lost", Some(*id), format!("{id} is gone")));
        }
        for r in &records {
            let id = r.order_id;
            r.check()
                .map_err(|e| ("each record keeps its own invariants", Some(id), e.to_string()))?;
            self.check_version(r)?;
            if let Some(before) = self.previous.get(&id) {
                if r.attempt < before.attempt {
                    return Err((
                        "leases only move forward",
                        Some(id),
                        format!("attempt {} after {}", r.attempt, before.attempt),
                    ));
                }
                // A lease is taken away only once its CompleteBy passed.
                if r.revision > before.revision && r.last_input == InputRef::Expire {
                    let deadline = before.earliest_lease().or(before.complete_by);
                    if deadline.is_none_or(|d| d > self.clock.now()) {
                        return Err((
                            "timeouts are kept",
                            Some(id),
                            format!(
                                "expired at {} before its CompleteBy {deadline:?}",
                                self.clock.now()
                            ),
                        ));
                    }
                }
                if r.revision != before.revision {
                    let steps: Vec<String> = r
                        .steps
                        .iter()
                        .map(|s| match &s.detail {
                            Some(why) => format!("{} {:?} ({why})", s.name, s.status),
                            None => format!("{} {:?}", s.name, s.status),
                        })
                        .collect();
                    self.note(
                        id,
                        format!(
                            "record r{}: {:?} {:?} [{}]{}",
                            r.revision,
                            r.process_state,
                            r.phase,
                            steps.join(", "),
                            r.cause.as_ref().map_or(String::new(), |c| format!(", because {c}"))
                        ),
                    );
                }
            }
            if let Some(before) = self.previous.get(&id).filter(|b| b.is_terminal()) {
                let by_operator = matches!(r.last_input, InputRef::Command(_));
                if r.process_state != before.process_state && !by_operator {
                    return Err((
                        "an order that ended stays ended",
                        Some(id),
                        format!("{:?} became {:?}", before.process_state, r.process_state),
                    ));
                }
            }
            for step in r.steps.iter().filter(|s| s.status == StepStatus::UndoFailed) {
                self.undo_failed.insert((id, step.name.clone()));
            }
            self.previous.insert(id, r.clone());
        }
        // No key has more of its orders running than its limit; an order counts as waiting
        // in line when every place of its key is taken.
        let slots = self.memory.all_slots();
        let full: Vec<&str> = slots
            .iter()
            .filter(|s| s.limit > 0 && s.running.len() >= s.limit as usize)
            .map(|s| s.key.as_str())
            .collect();
        for r in records.iter().filter(|r| !r.is_terminal()) {
            let Some(slot) = r.slot.as_ref().filter(|s| s.admitted) else { continue };
            let held = slots
                .iter()
                .any(|s| s.key == slot.key && s.running.contains_key(&slot.place(r.order_id)));
            if !held {
                return Err((
                    "each key runs no more orders than its limit",
                    Some(r.order_id),
                    format!("{} runs for {} without its place", r.order_id, slot.key),
                ));
            }
        }
        for r in records.iter().filter(|r| r.waits_in_line()) {
            if r.slot.as_ref().is_some_and(|s| full.contains(&s.key.as_str())) {
                self.in_line.insert(r.order_id);
            }
        }
        for s in &slots {
            if s.limit > 0 && s.running.len() > s.limit as usize {
                return Err((
                    "each key runs no more orders than its limit",
                    None,
                    format!(
                        "{} places of {} taken, over its limit of {}",
                        s.running.len(),
                        s.key,
                        s.limit
                    ),
                ));
            }
        }
        let len = self.ledger.len();
        if len != self.ledger_checked {
            let from = self.ledger_checked;
            self.ledger_checked = len;
            self.ledger
                .check_since(from)
                .map_err(|(order, what)| ("no effect twice", Some(order), what))?;
        }
        Ok(())
    }

    /// An order keeps the version it started on, and that version's steps; one created after
    /// a deploy starts on the version then current.
    fn check_version(&self, r: &StateRecord) -> Result<(), Broken> {
        let id = r.order_id;
        // As the last check saw it, which held it to the version it started on.
        let started = self.previous.get(&id).map_or(r.workflow_version, |b| b.workflow_version);
        let broken = |what: String| Err(("an order keeps its workflow's version", Some(id), what));
        if r.workflow_version != started {
            return broken(format!("version {} after {started}", r.workflow_version));
        }
        let Ok(workflow) = self.catalogue.of(r) else {
            return broken(format!("version {started} of {} is not deployed", r.workflow));
        };
        let names: Vec<&str> = workflow.steps().iter().map(|s| s.name.as_str()).collect();
        let steps: Vec<&str> = r.steps.iter().map(|s| s.name.as_str()).collect();
        if steps != names {
            return broken(format!("steps {steps:?}, where version {started} has {names:?}"));
        }
        let after = self.deployed_at.is_some_and(|at| r.created_at >= at);
        let current = self.catalogue.current(&r.workflow).map(|w| w.version());
        if after && r.workflow == self.workflow && Some(started) != current {
            return broken(format!(
                "created after the deploy on version {started}, not {current:?}"
            ));
        }
        Ok(())
    }

    /// Once every order ended: each one's effects are as its end says, and every place of a
    /// key was given back.
    fn check_end(&mut self) -> Result<(), Broken> {
        let mut records = self.memory.records();
        records.sort_by_key(|r| r.order_id);
        for r in &records {
            let workflow = self
                .catalogue
                .of(r)
                .map_err(|e| ("each order keeps its workflow", Some(r.order_id), e.to_string()))?;
            let kept = match r.process_state {
                ProcessState::Processed => true,
                ProcessState::Error | ProcessState::Cancelled => false,
                _ => continue,
            };
            // An order stops as refused only if its service (or, for an answer from outside
            // or a child, the party) refused it: a 429, an outage, a timeout is never taken
            // for a refusal.
            if let Some(Cause::StepRejected { step, .. }) = &r.cause {
                let by_service = lock(&self.watch).refused.contains(&(r.order_id, step.clone()));
                let by_party = workflow
                    .step_named(step)
                    .is_some_and(|w| matches!(w.work, Work::Callback | Work::Child(_)));
                if !by_service && !by_party {
                    return Err((
                        "an order stops as refused only when it was",
                        Some(r.order_id),
                        format!("stopped as refused by {step}, which its service never refused"),
                    ));
                }
            }
            let listed = r.needs_manual_undo();
            let late: Vec<String> = r
                .steps
                .iter()
                .filter(|s| self.undo_failed.contains(&(r.order_id, s.name.clone())))
                .map(|s| s.name.clone())
                .collect();
            if kept {
                // A wait is over, and never before its time.
                for step in r.steps.iter().filter(|s| s.wake_at.is_some()) {
                    let woke = step.output.as_ref().and_then(|o| o["woke_at"].as_str());
                    // Both written as RFC 3339 to the millisecond, in UTC: they sort as text.
                    let due = step.wake_at.map(|t| t.to_rfc3339()).unwrap_or_default();
                    if step.reported.is_none() && woke.is_none_or(|t| t < due.as_str()) {
                        return Err((
                            "a wait is over, never before its time",
                            Some(r.order_id),
                            format!(
                                "{} woke at {woke:?}, to wake at {:?}",
                                step.name, step.wake_at
                            ),
                        ));
                    }
                }
            }
            self.ledger.check_end(r.order_id, workflow, kept, &listed, &late).map_err(|what| {
                ("each step applied once, each undo once in reverse order", Some(r.order_id), what)
            })?;
        }
        for s in self.memory.all_slots() {
            if !s.running.is_empty() {
                return Err((
                    "every place of a key is given back",
                    None,
                    format!("{}: {:?}", s.key, s.running),
                ));
            }
        }
        Ok(())
    }
}

/// Each action of `agent` in the catalogue, with whether it is an undo.
fn undo_flags(catalogue: &Catalogue, agent: &AgentName) -> Vec<(String, bool)> {
    let mut found: Vec<(String, bool)> = Vec::new();
    for w in catalogue.all() {
        for s in w.steps().iter().filter(|s| s.agent() == Some(agent)) {
            let mut push = |a: &str, undo: bool| {
                if !found.iter().any(|(x, _)| x == a) {
                    found.push((a.to_owned(), undo));
                }
            };
            push(&s.name, false);
            if let Some(c) = &s.compensation {
                push(&c.action, true);
            }
        }
    }
    found
}

fn decode(taken: &[Delivery]) -> Result<Vec<Message>, Broken> {
    taken
        .iter()
        .map(|d| {
            Message::decode(&d.body).map_err(|e| {
                ("the system sends only messages it takes", None, format!("{e}: {}", d.body))
            })
        })
        .collect()
}
