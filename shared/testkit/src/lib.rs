//! Proves a team's own workflow: its workflow files, its Rust agents and stand-ins for its
//! HTTP services, run through the engine in memory, seed after seed, under the faults the
//! engine's own simulation injects, and every order's end and every effect checked.

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
