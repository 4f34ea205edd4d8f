//! The Scheduler Agent Supervisor engine.
//!
//! Everything the submission, scheduler, agent and supervisor functions decide lives here, as
//! plain Rust over small ports; the Lambda functions are thin shells that decode an event, call
//! a service, and encode its answer. Nothing in this crate knows about AWS.
//!
//! # Layout
//!
//! - Domain: [`order`] (what an acceptable order is), [`workflow`] (steps as data), [`ids`]
//!   (order ids, idempotency keys), [`time`].
//! - State: [`state`] (the record and its invariants) and [`machine`] (the one transition
//!   function: every state change is decided there); [`health`] (each service's, open or
//!   held), [`pace`] (each service's declared rate and concurrency) and [`keys`] (how many
//!   orders of one key may run at once, and the line of those waiting).
//! - Services: [`services`] (submission, scheduler, agent, supervisor, status), each generic over
//!   the [`ports`] it needs.
//! - Messages and events: [`message`] (queue envelopes), [`events`] (status events and alerts),
//!   [`payload`] (large inputs and outputs, kept outside both).
//! - Policy: [`config`] (every tunable, with defaults), [`retry`], [`load`] (queue waits and
//!   depths, and what the supervisor and the door make of them), [`fair`] (tenants: the group
//!   their messages are delivered by, and their part of the door).
//! - [`metrics`]: what the services count and time, through the `metrics` facade.
//! - [`mutants`]: guards broken on purpose, switched on only by tests.
//! - `memory` (feature `memory`): in-memory ports with the semantics of DynamoDB, SQS and
//!   EventBridge, for tests, the simulations and tools; production builds leave it out.
//!
//! # Guarantees
//!
//! Every state change is a conditional write of a record read just before, expecting its
//! process state, attempt and revision. Messages carry the attempt that produced them, so a
//! message from an older lease can change nothing. Side effects (sending, publishing) happen
//! after the write that decides them; a crash in between is repaired by the redelivery of the
//! message that caused the write, or by the supervisor when the lease expires.

pub mod bulk;
pub mod catalogue;
pub mod config;
pub mod error;
pub mod events;
pub mod fair;
pub mod health;
pub mod ids;
pub mod keys;
pub mod load;
pub mod machine;
#[cfg(feature = "memory")]
pub mod memory;
pub mod message;
pub mod metrics;
pub mod mutants;
pub mod order;
pub mod pace;
pub mod payload;
pub mod ports;
pub mod retry;
pub mod services;
pub mod starts;
pub mod state;
pub mod time;
pub mod workflow;

pub use error::{Error, Result};
pub use ids::{AgentName, Direction, IdempotencyKey, OrderId, Owner};
pub use time::Timestamp;
