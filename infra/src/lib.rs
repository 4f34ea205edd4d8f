//! Infrastructure tooling: reading `template.yaml` and creating what it declares on any AWS
//! API endpoint (a local emulator, LocalStack, or a real account), then running, checking and
//! watching the whole stack on this machine.
//!
//! The template is the single source of truth: tests and the local stack create their tables,
//! indexes, queues, dead-letter queues, buses and rules from it, so nothing can drift from what
//! `sam deploy` creates. Resource types that have no local equivalent are reported by name.
//!
//! The crate is in five rooms, one per job:
//!
//! - [`emulation`]: AWS emulated on loopback, the local stack: the template read
//!   ([`template`](emulation::template), [`foreach`](emulation::foreach)) and provisioned
//!   ([`aws`](emulation::aws), [`provision`](emulation::provision), [`emulator`](emulation::emulator)),
//!   the functions run as their real binaries ([`functions`](emulation::functions),
//!   [`runtime_api`](emulation::runtime_api), [`processes`](emulation::processes)) and fed by
//!   their event sources ([`sources`](emulation::sources), [`gateway`](emulation::gateway)), the
//!   [`proxy`](emulation::proxy) between them and the emulators, all of it together in
//!   [`local`](emulation::local), and [`sam_local`](emulation::sam_local) to point `sam local` at it.
//! - [`access`]: least privilege and authentication, checked on every local run: each
//!   function's permissions and IAM's verdict ([`policy`](access::policy)), signed and bearer
//!   callers ([`sigv4`](access::sigv4), [`jwt`](access::jwt)) and what each caller may call
//!   ([`callers`](access::callers)).
//! - [`observe`]: what a run shows: the functions' [`metrics`](observe::metrics) and
//!   [`traces`](observe::traces), [`dead_letters`](observe::dead_letters) as they arrive, and the
//!   operator's page ([`view`](observe::view)).
//! - [`demo`]: orders under misbehaving services, with a summary that checks the promises;
//!   [`effects`](demo::effects): what the simulated service's ledger says the business holds.
//! - [`tools`]: what the tool binaries share: the [`workflows`](tools::workflows) checked against
//!   the template and the one price table ([`prices`](tools::prices)).

pub mod access;
pub mod demo;
pub mod emulation;
pub mod observe;
pub mod tools;

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
