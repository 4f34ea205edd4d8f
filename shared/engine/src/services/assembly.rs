//! One system put together: the ports its services share, and each service built from them.
//! The simulations, the end-to-end tests and the cost model all assemble their system here, so
//! that a service gets the same ports and settings wherever it runs; each harness only says
//! what is its own (an outbox that batches, a clock per worker, a remote that misbehaves).

use std::sync::Arc;

use crate::catalogue::Catalogue;
use crate::config::EngineConfig;
use crate::ids::AgentName;
use crate::load::{LoadSource, Unmetered, WaitReporter};
use crate::payload::NoPayloads;
use crate::ports::{
    Clock, Destination, EventBus, ExpiryIndex, Ids, Outbox, Payloads, Random, RemoteService,
    StateStore, WaitGauge,
};

use super::guard::NoBook;
use super::{Agent, Operator, Ports, Scheduler, Starter, Submission, Supervisor};

/// What every service of one system is built from. Each service is given its own outbox,
/// since that is where the harnesses differ most (a submission sends only to the scheduler,
/// a scheduler's batches, a worker's own clock).
#[derive(Clone, Debug)]
pub struct Assembly<S, B, C, W, L, P = NoPayloads> {
    pub store: S,
    pub bus: B,
    pub clock: C,
    pub config: Arc<EngineConfig>,
    pub catalogue: Arc<Catalogue>,
    /// The gauge the scheduler and the agents report their queue waits to.
    pub waits: W,
    /// Where the door and the supervisor read the queues' load.
    pub load: L,
    /// Where large inputs and outputs are kept ([`crate::payload`]).
    pub payloads: P,
}

impl<S: Clone, B: Clone, C: Clone, W: Clone, L: Clone, P: Clone> Assembly<S, B, C, W, L, P> {
    /// The ports of a service that sends through `outbox`.
    pub fn ports<Q>(&self, outbox: Q) -> Ports<S, Q, B, C, P> {
        Ports {
            store: self.store.clone(),
            outbox,
            bus: self.bus.clone(),
            clock: self.clock.clone(),
            config: self.config.clone(),
            catalogue: self.catalogue.clone(),
            payloads: self.payloads.clone(),
        }
    }

    /// The same system seen through another clock: a worker's own, or a supervisor's that
    /// runs ahead.
    pub fn on_clock<K>(&self, clock: K) -> Assembly<S, B, K, W, L, P> {
        Assembly {
            store: self.store.clone(),
            bus: self.bus.clone(),
            clock,
            config: self.config.clone(),
            catalogue: self.catalogue.clone(),
            waits: self.waits.clone(),
            load: self.load.clone(),
            payloads: self.payloads.clone(),
        }
    }

    /// The same system running other workflows: what a deploy changes.
    pub fn running(&self, catalogue: Arc<Catalogue>) -> Self {
        Assembly { catalogue, ..self.clone() }
    }

    pub fn submission<Q, I>(&self, outbox: Q, ids: I) -> Submission<S, Q, B, C, I, L, P>
    where
        S: StateStore,
        Q: Outbox,
        B: EventBus,
        C: Clock,
        I: Ids,
        L: LoadSource,
        P: Payloads,
    {
        Submission::new(self.ports(outbox), ids, self.load.clone())
    }

    /// A starter of the orders the catalogue's workflows start by event and by schedule, through
    /// a submission without a door ([`Unmetered`]).
    pub fn starter<Q, I>(&self, outbox: Q, ids: I) -> Starter<S, Q, B, C, I, Unmetered, P> {
        Starter::unmetered(self.ports(outbox), ids)
    }

    /// A scheduler whose claims and wait reports are signed `owner`.
    pub fn scheduler<Q>(&self, outbox: Q, owner: impl Into<String>) -> Scheduler<S, Q, B, C, W, P>
    where
        S: StateStore,
        Q: Outbox,
        B: EventBus,
        C: Clock,
        W: WaitGauge,
        P: Payloads,
    {
        Scheduler::new(self.ports(outbox), self.waits.clone(), owner.into())
    }

    /// A supervisor that finds expired work in the store's own index.
    pub fn supervisor<Q>(&self, outbox: Q) -> Supervisor<S, S, Q, B, C, L, P>
    where
        S: StateStore + ExpiryIndex,
        Q: Outbox,
        B: EventBus,
        C: Clock,
        L: LoadSource,
        P: Payloads,
    {
        Supervisor::new(self.ports(outbox), self.store.clone(), self.load.clone())
    }

    pub fn operator<Q>(&self, outbox: Q) -> Operator<S, Q, B, C, P>
    where
        S: StateStore,
        Q: Outbox,
        B: EventBus,
        C: Clock,
        P: Payloads,
    {
        Operator::new(self.ports(outbox))
    }

    /// `agent`'s worker on `remote`: it takes requests from the agent's queue, draws its
    /// retries' jitter from `random`, and reports its waits as `reporter`.
    pub fn agent<R, Q, X>(
        &self,
        agent: &AgentName,
        remote: R,
        outbox: Q,
        random: X,
        reporter: impl Into<String>,
    ) -> Agent<R, Q, C, X, W, NoBook, P>
    where
        R: RemoteService,
        Q: Outbox,
        C: Clock,
        X: Random,
        W: WaitGauge,
        P: Payloads,
    {
        Agent::new(
            remote,
            outbox,
            self.clock.clone(),
            random,
            self.config.agent_retry,
            Destination::Agent(agent.clone()),
            WaitReporter::new(self.waits.clone(), reporter.into(), self.config.claim_grace),
        )
        .keeping(self.payloads.clone())
    }

    /// Every queue of the system: the scheduler's two, then each agent's that a workflow of
    /// the catalogue names.
    pub fn destinations(&self) -> Vec<Destination> {
        [Destination::Scheduler, Destination::Replies]
            .into_iter()
            .chain(self.catalogue.agents().into_iter().map(Destination::Agent))
            .collect()
    }
}
