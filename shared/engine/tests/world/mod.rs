//! A whole system on in-memory ports: submission, scheduler, one agent per service, and the
//! supervisor, wired as the Lambda functions are, with queues pumped by hand so each test
//! decides exactly what is delivered, lost or redelivered, and when.

#![allow(dead_code)] // each test file uses a different part of the harness
#![allow(clippy::unwrap_used)] // test harness: a failed setup should panic

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sas_engine::catalogue::Catalogue;
use sas_engine::config::EngineConfig;
use sas_engine::events::{ALERT_DETAIL_TYPE, STATUS_DETAIL_TYPE, StatusKinds};
use sas_engine::load::Gauges;
use sas_engine::memory::{
    InMemory, ManualClock, MemoryAssembly, MemoryBus, MemoryPayloads, MemoryQueues, MemoryRemote,
    MemoryServiceBook, MemoryStore, MemoryWaits, SeqIds, SplitMix,
};
use sas_engine::message::Message;
use sas_engine::ports::{Destination, Incoming};
use sas_engine::services::{
    Accepted, Agent, AgentOutcome, Handled, Operator, Ports, Scheduler, ServicesReport, Submission,
    Supervisor, SweepReport,
};
use sas_engine::state::StateRecord;
use sas_engine::workflow::Workflow;
use sas_engine::{AgentName, OrderId, Result};

pub type Clock = ManualClock;
pub type Store = Arc<MemoryStore<Clock>>;
pub type Queues = Arc<MemoryQueues<Clock>>;
pub type Bus = Arc<MemoryBus>;
pub type Remote = Arc<MemoryRemote<Clock>>;
pub type Waits = Arc<MemoryWaits>;
pub type Load = Gauges<Waits, Queues>;
pub type Book = Arc<MemoryServiceBook>;
pub type Payloads = Arc<MemoryPayloads>;
/// An agent of this world: guarded, its service's health in the world's book.
pub type WorldAgent = Agent<Remote, Queues, Clock, Arc<SplitMix>, Waits, Book, Payloads>;

pub struct World {
    pub clock: Clock,
    pub store: Store,
    pub queues: Queues,
    pub bus: Bus,
    pub remote: Remote,
    pub waits: Waits,
    /// Each service's health, which the agents guard and the supervisor tends.
    pub book: Book,
    /// What the services are built from: the engine's configuration and the workflows it
    /// runs among them.
    pub system: MemoryAssembly<Clock>,
    pub submission: Submission<Store, Queues, Bus, Clock, Arc<SeqIds>, Load, Payloads>,
    pub scheduler: Scheduler<Store, Queues, Bus, Clock, Waits, Payloads>,
    pub agents: HashMap<AgentName, WorldAgent>,
    pub supervisor: Supervisor<Store, Store, Queues, Bus, Clock, Load, Payloads>,
    /// What each handler returned, in order, for assertions.
    pub handled: Vec<(String, Handled)>,
    pub agent_outcomes: Vec<AgentOutcome>,
}

/// The agents the reference workflow names, all deployed.
pub fn agent_names() -> Vec<AgentName> {
    Workflow::agents_in(sas_workflows::order_fulfilment())
}

impl World {
    pub fn new() -> World {
        World::with(EngineConfig { status_events: StatusKinds::all(), ..EngineConfig::default() })
    }

    pub fn with(config: EngineConfig) -> World {
        let clock = ManualClock::default();
        let memory = InMemory::new(clock.clone());
        let workflow =
            Workflow::from_json(sas_workflows::order_fulfilment(), &agent_names()).unwrap();
        let catalogue = Arc::new(Catalogue::single(workflow));
        let system = memory.assembly(clock.clone(), Arc::new(config), catalogue);
        let queues = &memory.queues;
        let submission = system.submission(queues.clone(), Arc::new(SeqIds::new("corr")));
        let scheduler = system.scheduler(queues.clone(), "scheduler-1");
        let random = Arc::new(SplitMix::seeded(42));
        let book = Book::default();
        let hold = system.config.hold;
        let agents = agent_names()
            .into_iter()
            .map(|name| {
                let reporter = format!("agent-{}", name.as_str());
                let agent = system
                    .agent(&name, memory.remote.clone(), queues.clone(), random.clone(), reporter)
                    .guarded(book.clone(), name.as_str(), hold);
                (name, agent)
            })
            .collect();
        let supervisor = system.supervisor(queues.clone());
        World {
            clock,
            store: memory.store,
            queues: memory.queues,
            bus: memory.bus,
            remote: memory.remote,
            waits: memory.waits,
            book,
            system,
            submission,
            scheduler,
            agents,
            supervisor,
            handled: Vec::new(),
            agent_outcomes: Vec::new(),
        }
    }

    /// A deploy: the services start again running `catalogue`, over the same store, queues,
    /// bus and services; what is in flight stays where it is.
    pub fn deploy(&mut self, catalogue: Catalogue) {
        self.system = self.system.running(Arc::new(catalogue));
        let queues = || self.queues.clone();
        self.submission = self.system.submission(queues(), Arc::new(SeqIds::new("corr-deployed")));
        self.scheduler = self.system.scheduler(queues(), "scheduler-2");
        self.supervisor = self.system.supervisor(queues());
    }

    /// The ports every service of this world works over, running its current catalogue.
    pub fn ports(&self) -> Ports<Store, Queues, Bus, Clock, Payloads> {
        self.system.ports(self.queues.clone())
    }

    /// An operator's service on this world, running its current catalogue.
    pub fn operator(&self) -> Operator<Store, Queues, Bus, Clock, Payloads> {
        self.system.operator(self.queues.clone())
    }

    /// The queues' load, as the supervisor and the door read it.
    pub fn load(&self) -> Load {
        self.system.load.clone()
    }

    pub async fn submit(&self, key: &str) -> Result<Accepted> {
        self.submission.submit(key, order_body(key).as_bytes()).await
    }

    /// Every queue the system uses.
    pub fn destinations(&self) -> Vec<Destination> {
        self.system.destinations()
    }

    /// Delivers every message visible now, once, to its consumer; handled messages are deleted,
    /// failed ones are left to come back after their visibility timeout. Returns how many were
    /// delivered.
    pub async fn pump(&mut self) -> usize {
        let mut delivered = 0;
        for dest in self.destinations() {
            loop {
                let batch = self.queues.receive(&dest, 10);
                if batch.is_empty() {
                    break;
                }
                for d in batch {
                    delivered += 1;
                    let incoming =
                        Incoming { message_id: &d.message_id, receive_count: d.receive_count };
                    if self.deliver(&dest, incoming, &d.body).await {
                        self.queues.delete(&dest, &d.receipt).unwrap();
                    }
                }
            }
        }
        delivered
    }

    /// Handles one message body as the function behind `dest` would; true if it may be deleted.
    pub async fn deliver(
        &mut self,
        dest: &Destination,
        incoming: Incoming<'_>,
        body: &str,
    ) -> bool {
        let Ok(message) = Message::decode(body) else { return false };
        match (dest, &message) {
            (Destination::Agent(name), Message::Request(request)) => {
                match self.agents[name].handle(request, incoming).await {
                    Ok(outcome) => {
                        self.agent_outcomes.push(outcome);
                        true
                    }
                    Err(_) => false,
                }
            }
            (Destination::Agent(name), Message::Elements(request)) => {
                match self.agents[name].handle_elements(request, incoming).await {
                    Ok(ended) => {
                        self.agent_outcomes.extend(ended.into_iter().map(|(_, o)| o));
                        true
                    }
                    Err(_) => false,
                }
            }
            (Destination::Scheduler | Destination::Replies, _) => {
                match self.scheduler.handle(&message, incoming).await {
                    Ok(handled) => {
                        self.handled.push((kind(&message).into(), handled));
                        true
                    }
                    Err(_) => false,
                }
            }
            _ => false,
        }
    }

    /// Receives one message from `dest` and delivers it, deleting it if it was handled.
    /// Returns whether it was handled; panics if the queue has nothing visible.
    pub async fn step(&mut self, dest: &Destination) -> bool {
        let d = self.queues.receive(dest, 1).pop().expect("a visible message");
        let incoming = Incoming { message_id: &d.message_id, receive_count: d.receive_count };
        let handled = self.deliver(dest, incoming, &d.body).await;
        if handled {
            self.queues.delete(dest, &d.receipt).unwrap();
        }
        handled
    }

    /// Pumps until no message is visible.
    pub async fn settle(&mut self) {
        for _ in 0..100 {
            if self.pump().await == 0 {
                return;
            }
        }
        panic!("the system did not settle in 100 rounds");
    }

    /// Lets time pass in steps, sweeping and pumping, until every order is terminal (and its
    /// alert, if any, confirmed) or `limit` passes.
    pub async fn run_for(&mut self, limit: Duration) {
        let step = Duration::from_secs(5);
        let mut waited = Duration::ZERO;
        loop {
            self.settle().await;
            if self.all_finished() || waited >= limit {
                return;
            }
            self.clock.advance(step);
            waited += step;
            self.sweep().await;
        }
    }

    /// One run of the supervisor: its sweep, then its tending of the services.
    pub async fn sweep(&self) -> SweepReport {
        let report = self.supervisor.sweep().await.unwrap();
        self.supervisor.tend(&self.book, report.stalled.is_none()).await.unwrap();
        report
    }

    pub async fn tend(&self) -> ServicesReport {
        self.supervisor.tend(&self.book, true).await.unwrap()
    }

    pub fn all_finished(&self) -> bool {
        self.store.records().iter().all(|r| r.is_terminal() && r.complete_by.is_none())
    }

    pub fn state(&self, id: OrderId) -> StateRecord {
        self.store.peek(id).unwrap()
    }

    pub fn alerts(&self) -> Vec<serde_json::Value> {
        self.bus.of_type(ALERT_DETAIL_TYPE)
    }

    pub fn statuses(&self, id: OrderId) -> Vec<String> {
        self.bus
            .of_type(STATUS_DETAIL_TYPE)
            .into_iter()
            .filter(|e| e["order_id"] == id.to_string())
            .map(|e| e["status"].as_str().unwrap().to_owned())
            .collect()
    }

    /// The ledger key of a step of an order, as the agent sends it.
    pub fn key(id: OrderId, step: &str, direction: &str) -> String {
        format!("{id}/{step}/{direction}")
    }
}

fn kind(m: &Message) -> &'static str {
    match m {
        Message::Start(_) => "start",
        Message::Request(_) => "request",
        Message::Reply(_) => "reply",
        Message::ChildEnded(_) => "child_ended",
        Message::Elements(_) => "elements",
        Message::ElementsReply(_) => "elements_reply",
        Message::Event(_) => "event",
    }
}

/// A valid order body, varied by key so different keys give different orders.
pub fn order_body(key: &str) -> String {
    let quantity = 1 + key.len() % 5;
    format!(
        r#"{{"customer_id":"c-{}","currency":"EUR","items":[{{"sku":"BOOK-1","quantity":{quantity},"unit_price":1250}}],
            "ship_to":{{"name":"Ada","line1":"1 Main St","city":"Paris","postal_code":"75001","country":"FR"}}}}"#,
        key.len()
    )
}
