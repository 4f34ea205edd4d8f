//! Test harness: a moto server started by the tests themselves, and stacks provisioned on it
//! from `template.yaml`, so integration tests exercise the real adapters and handlers against a
//! real AWS API emulator.
//!
//! moto is installed from PyPI into `.venv` at the workspace root on first use (or taken from
//! `MOTO_PYTHON`, a Python that has `moto[server]`). Each test binary starts one server on a
//! free loopback port; every test provisions its own stack with a unique name on it, so tests
//! run in parallel without seeing each other's data.

#![allow(clippy::unwrap_used)] // a harness that cannot set up should fail the test loudly

pub mod browser;
pub mod devtools;
pub mod docs;
pub mod e2e;
pub mod effects;
pub mod stack;

pub use sas_infra::emulation::emulator::{self as moto, Moto};
pub use stack::TestStack;
