//! Proves a team's own workflow: its workflow files, its Rust agents and stand-ins for its
//! HTTP services, run through the engine in memory, seed after seed, under the faults the
//! engine's own simulation injects, and every order's end and every effect checked.
//!
//! A team adds the crate as a dev-dependency and writes a plain `#[test]` that builds a
//! [`Kit`]: its workflow files (checked as the stack checks them), each agent's service (its
//! own [`RemoteService`](sas_engine::ports::RemoteService), built afresh for each seed with the
//! seed's [`Ledger`], where its fakes record what took effect), a [`StandIn`] for each HTTP
//! service, the stack's settings by name, the orders' inputs, and assertions of its own on
//! what each seed left ([`End`]). [`Kit::check`] runs the seeds on every core and fails the
//! test with the first broken invariant, the order's timeline and the command that runs that
//! seed alone.
//!
//! The world is the engine simulation's: [`world`] (the ports of a seed, the timeline clock,
//! crashes), [`faults`] (the kinds of fault, switched by `SIM_FAULTS` / `SIM_FAULTS_OFF`),
//! [`hands`] (the dice, the pump that hands consumers their messages, the operators and the
//! party outside) and [`watch`] (what reaches each service, against holds and declared limits).

mod agents;
pub mod faults;
pub mod hands;
pub mod ledger;
mod run;
pub mod watch;
pub mod world;

pub use agents::StandIn;
pub use faults::{Fault, Faults};
pub use ledger::{Effect, Ledger};
pub use run::{End, Ended, Failure, Kit, Report};
pub use sas_engine::state::ProcessState;
pub use world::{Crashes, Crashy, Timeline};
