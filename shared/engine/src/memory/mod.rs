//! In-memory ports with the semantics of the services they stand for.
//!
//! They are for the engine's unit tests and the deterministic simulation, so they are exact
//! where the engine's correctness depends on it: conditional writes fail when the condition
//! does not hold, a transaction writes all or nothing, the expiry index is sparse and can lag
//! behind the table, a queue message that is not deleted comes back after its visibility
//! timeout and goes to a dead-letter queue after too many receives, and the bus can reject part
//! of a batch. Faults can be injected into each. The queues also report their depths, and the
//! wait gauge keeps one report per consumer and queue, as their AWS adapters do.

mod bus;
mod clock;
mod queue;
mod remote;
mod store;
mod waits;

pub use bus::{ENTRY_FAILURE, MAX_PUBLISH_BATCH, MAX_PUBLISH_BYTES, MemoryBus};
pub use clock::{ManualClock, SeqIds, SplitMix};
pub use queue::{
    Delivery, MAX_BODY_BYTES, MAX_DELAY, MAX_RECEIVE_BATCH, MAX_VISIBILITY_TIMEOUT, MemoryQueues,
    QueueSettings,
};
pub use remote::{Behaviour, LedgerEntry, MemoryRemote, RemoteFaults};
pub use store::{MemoryStore, StoreStats};
pub use waits::MemoryWaits;
