//! Proves a team's own workflow: its workflow files, its Rust agents and stand-ins for its
//! HTTP services, run through the engine in memory, seed after seed, under the faults the
//! engine's own simulation injects, and every order's end and every effect checked.

pub mod faults;
pub mod world;

pub use faults::{Fault, Faults};
pub use world::{Crashes, Crashy, Timeline};
