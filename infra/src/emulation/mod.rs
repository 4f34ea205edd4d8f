//! The local stack: AWS emulated on loopback. What `template.yaml` declares is created on an
//! AWS API emulator, each function runs as its real binary behind a local Runtime API, and its
//! event sources, HTTP API and calls to AWS go through local stand-ins that behave as AWS does.
//!
//! - [`template`], [`foreach`]: the template parsed and evaluated, its loops expanded.
//! - [`aws`], [`emulator`], [`provision`]: clients for the endpoints, moto started, the
//!   template's resources created.
//! - [`functions`], [`runtime_api`], [`processes`]: the functions declared, served their events
//!   and run as local processes.
//! - [`sources`], [`gateway`]: SQS mappings and schedules; the HTTP API and function URLs.
//! - [`proxy`]: between the functions and the emulators: routing, counting, access checks and
//!   injected faults.
//! - [`local`]: all of it together; [`sam_local`]: the `--env-vars` file for `sam local`.

pub mod aws;
pub mod emulator;
pub mod foreach;
pub mod functions;
pub mod gateway;
pub mod identity_pool;
pub mod local;
pub mod processes;
pub mod provision;
pub mod proxy;
pub mod runtime_api;
pub mod sam_local;
pub mod sources;
pub mod template;
