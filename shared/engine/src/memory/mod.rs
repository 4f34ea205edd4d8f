//! In-memory ports with the semantics of the services they stand for.
//!
//! They are for the engine's unit tests and the deterministic simulation, so they are exact
//! where the engine's correctness depends on it: conditional writes fail when the condition
//! does not hold, a transaction writes all or nothing, the expiry index is sparse and can lag
//! behind the table, a queue message that is not deleted comes back after its visibility
//! timeout and goes to a dead-letter queue after too many receives, and the bus can reject part
//! of a batch. Faults can be injected into each.

mod clock;
mod store;

pub use clock::{ManualClock, SeqIds, SplitMix};
pub use store::{MemoryStore, StoreStats};
