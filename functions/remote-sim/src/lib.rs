//! A simulated remote business service, for the demo and the tests: one HTTP server that
//! serves every action of the order workflow (`reserve-inventory`, `charge-payment`, `ship`,
//! their undos, and any other name) with an idempotency ledger and configurable faults.
//!
//! [`ledger`] and [`sim`] hold the service's logic and know nothing of HTTP; [`faults`] holds
//! the knobs and the decisions they lead to; [`http`] maps it all onto routes. The binary
//! (`remote-sim`) serves the router locally or, inside Lambda, behind a function URL.

pub mod faults;
pub mod http;
pub mod ledger;
pub mod sim;

pub use faults::{FaultConfig, Faults, FaultsOverride, Outage};
pub use http::{App, ArrivedAt, router};
pub use ledger::{Call, Direction, Effect, Ledger};
pub use sim::{Answer, Outcome, Simulator, Stats};
