//! In-memory ports with the semantics of the services they stand for.
//!
//! They are for the engine's unit tests and the deterministic simulation, so they are exact
//! where the engine's correctness depends on it: conditional writes fail when the condition
//! does not hold, a transaction writes all or nothing, the expiry index is sparse and can lag
//! behind the table, a queue message that is not deleted comes back after its visibility
//! timeout and goes to a dead-letter queue after too many receives, and the bus can reject part
//! of a batch. Faults can be injected into each. The queues also report their depths, and the
//! wait gauge keeps one report per consumer and queue, as their AWS adapters do.

use std::sync::Arc;

use crate::catalogue::Catalogue;
use crate::config::EngineConfig;
use crate::load::Gauges;
use crate::ports::Clock;
use crate::services::Assembly;

mod bus;
mod clock;
mod payloads;
mod queue;
mod remote;
mod services;
mod store;
mod waits;

pub use bus::{ENTRY_FAILURE, MAX_PUBLISH_BATCH, MAX_PUBLISH_BYTES, MemoryBus};
pub use clock::{ManualClock, SeqIds, SplitMix};
pub use payloads::{MemoryPayloads, PayloadStats};
pub use queue::{
    Delivery, MAX_BODY_BYTES, MAX_DELAY, MAX_RECEIVE_BATCH, MAX_VISIBILITY_TIMEOUT, MemoryQueues,
    QueueSettings,
};
pub use remote::{Behaviour, LedgerEntry, MemoryRemote, Outage, RemoteFaults, Throttle};
pub use services::MemoryServiceBook;
pub use store::{MemoryStore, StoreStats};
pub use waits::MemoryWaits;

/// The in-memory ports of one system, all on one clock.
#[derive(Clone, Debug)]
pub struct InMemory<C> {
    pub store: Arc<MemoryStore<C>>,
    pub queues: Arc<MemoryQueues<C>>,
    pub bus: Arc<MemoryBus>,
    pub waits: Arc<MemoryWaits>,
    pub remote: Arc<MemoryRemote<C>>,
    pub payloads: Arc<MemoryPayloads>,
}

/// A system assembled on the in-memory ports, with the load read from their queues.
pub type MemoryAssembly<C> = Assembly<
    Arc<MemoryStore<C>>,
    Arc<MemoryBus>,
    C,
    Arc<MemoryWaits>,
    Gauges<Arc<MemoryWaits>, Arc<MemoryQueues<C>>>,
    Arc<MemoryPayloads>,
>;

impl<C: Clock + Clone> InMemory<C> {
    pub fn new(clock: C) -> Self {
        InMemory {
            store: Arc::new(MemoryStore::new(clock.clone())),
            queues: Arc::new(MemoryQueues::new(clock.clone())),
            bus: Arc::new(MemoryBus::new()),
            waits: Arc::new(MemoryWaits::default()),
            remote: Arc::new(MemoryRemote::new(clock)),
            payloads: Arc::new(MemoryPayloads::default()),
        }
    }

    /// The system on these ports, read on `clock`, running `catalogue`.
    pub fn assembly(
        &self,
        clock: C,
        config: Arc<EngineConfig>,
        catalogue: Arc<Catalogue>,
    ) -> MemoryAssembly<C> {
        Assembly {
            store: self.store.clone(),
            bus: self.bus.clone(),
            clock,
            config,
            catalogue,
            waits: self.waits.clone(),
            load: self.load(),
            payloads: self.payloads.clone(),
        }
    }

    /// The queues' load, as the door and the supervisor read it.
    pub fn load(&self) -> Gauges<Arc<MemoryWaits>, Arc<MemoryQueues<C>>> {
        Gauges { waits: self.waits.clone(), depths: self.queues.clone() }
    }
}
