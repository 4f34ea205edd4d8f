//! What the tool binaries (`check-workflows`, `cost-model`, `sweep-cost`, `list-cost`) share
//! with the rest of the crate.
//!
//! - [`workflows`]: the repository's workflow files checked against the template, and what an
//!   event on the bus starts by them.
//! - [`prices`]: the one price table, used by the cost model and the demo's summary.
//! - [`ceiling`]: how many orders a second one stack takes, from AWS's quotas and what an
//!   order uses of each resource.
//! - [`durations`]: how long each function's invocation lasts on AWS, from its processor time
//!   measured on the local stack and its memory.
//! - [`idle`]: what a stack costs a month with no orders, counted from the template.
//! - [`batches`]: how full a queue mapping's batches are at a given rate.
//! - [`tables`]: state tables filled by hand, for the tools that measure their reads.

pub mod batches;
pub mod ceiling;
pub mod durations;
pub mod idle;
pub mod prices;
pub mod tables;
pub mod workflows;
