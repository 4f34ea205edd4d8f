//! Observing a run: what the functions report and what reaches a dead-letter queue, gathered
//! as CloudWatch and X-Ray would, and shown to an operator.
//!
//! - [`metrics`]: the embedded-metric lines the functions print, added up.
//! - [`traces`]: the trace segments they send, received as X-Ray's daemon would.
//! - [`dead_letters`]: what reaches a dead-letter queue, reported as it arrives.
//! - [`view`]: charts and tables on a page, served live or written as a report.
//! - [`cpu`]: the processor time each part of the local stack spends.

pub mod cpu;
pub mod dead_letters;
pub mod metrics;
pub mod traces;
pub mod view;
