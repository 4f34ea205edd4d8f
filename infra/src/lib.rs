//! Infrastructure tooling: reading `template.yaml` and creating what it declares on any AWS
//! API endpoint (a local emulator, LocalStack, or a real account).
//!
//! The template is the single source of truth: tests and the local stack create their tables,
//! indexes, queues, dead-letter queues, buses and rules from it, so nothing can drift from what
//! `sam deploy` creates. Resource types that have no local equivalent are reported by name.
//!
//! - [`template`]: parsing and evaluating the template (parameters, conditions, intrinsics);
//!   [`foreach`]: its `Fn::ForEach` loops expanded.
//! - [`aws`]: SDK clients pointed at the endpoint that serves each service.
//! - [`provision`]: creating its resources.
//! - [`functions`]: the functions a template declares, with their environment and event sources.
//! - [`emulator`]: starting moto's server on loopback.
//! - [`runtime_api`]: the Lambda Runtime API, so real function binaries run locally.
//! - [`processes`]: running those binaries, restarted when they exit; [`metrics`]: the
//!   metric lines they print, added up.
//! - [`sources`]: SQS event source mappings and schedules; [`dead_letters`]: what reaches a
//!   dead-letter queue, reported as it arrives.
//! - [`gateway`]: the HTTP API and function URLs, with their authorizers ([`sigv4`], [`jwt`]).
//! - [`traces`]: the trace segments the functions send, received as X-Ray's daemon would.
//! - [`local`]: all of it together: the local stack; [`sam_local`]: the `--env-vars` file that
//!   points `sam local` at it.
//! - [`proxy`]: the proxy between the functions and the emulators: it routes each service to
//!   its emulator, counts the calls, checks each function's calls against its policy, and
//!   injects the faults AWS produces when asked.
//! - [`policy`]: each function's permissions from the template, what each request needs, and
//!   IAM's verdict: least privilege, checked on every local run.
//! - [`demo`]: orders under misbehaving services, with a summary that checks the promises;
//!   [`effects`]: what the simulated service's ledger says the business holds, per step.
//! - [`workflows`]: the repository's workflow files checked against the template.
//! - [`view`]: what an operator sees of a run: charts and tables on a page, served live or
//!   written as a report.

pub mod aws;
pub mod callers;
pub mod dead_letters;
pub mod demo;
pub mod effects;
pub mod emulator;
pub mod foreach;
pub mod functions;
pub mod gateway;
pub mod jwt;
pub mod local;
pub mod metrics;
pub mod policy;
pub mod prices;
pub mod processes;
pub mod provision;
pub mod proxy;
pub mod runtime_api;
pub mod sam_local;
pub mod sigv4;
pub mod sources;
pub mod template;
pub mod traces;
pub mod view;
pub mod workflows;

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("template: {0}")]
    Template(String),
    #[error("creating {logical_id} ({kind}): {message}")]
    Create { logical_id: String, kind: String, message: String },
    /// Running the stack locally failed (the emulator, a port, a binary, a read-back).
    #[error("local stack: {0}")]
    Local(String),
}
