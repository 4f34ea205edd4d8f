//! The actors of the pattern as services over ports. A Lambda handler decodes its event, calls
//! one of these, and encodes the answer; the simulation calls the same code.
//!
//! Scheduler and supervisor share one loop: read the record, [`decide`](crate::machine::decide),
//! write the new record with a condition on the one read, then perform the side effects. A
//! lost condition means another actor got there first, and that actor owns the side effects.

mod agent;
mod assembly;
pub mod bulk;
mod children;
mod desk;
mod effects;
mod fanout;
mod guard;
mod keyring;
mod line;
mod operator;
mod scheduler;
pub mod search;
mod starter;
mod status;
mod submission;
mod supervisor;

pub use agent::{Agent, AgentOutcome};
pub use assembly::Assembly;
pub use desk::{DeskRefusal, HoldView, ServiceDesk, ServiceView};
pub use effects::Ports;
pub use guard::{Admission, FRESH, Guard, NoBook};
pub use keyring::{KeySummary, KeyView, Keyring, MAX_LINE, Placed};
pub use line::standing;
pub use operator::{Answering, Applied, Command, Commanded, Operator};
pub use scheduler::Scheduler;
pub use starter::{Started, Starter};
pub use status::{InLine, OperatorView, OrderView, StatusService, StepOutline, Values, outline};
pub use submission::{Accepted, Asked, Submission};
pub use supervisor::{RESUME_SPREAD, ServicesReport, Supervisor, SweepReport};

use crate::machine::{Ignored, Illegal};

/// What handling one input did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Handled {
    /// A transition was written and its side effects performed.
    Applied,
    /// The transition had been written before (by this same message, whose handler did not
    /// finish); its side effects were performed again.
    Replayed,
    /// Nothing to do.
    Ignored(Ignored),
    /// An input that a correct system never produces; logged, nothing changed.
    Illegal(Illegal),
    /// Another actor changed the record between our read and our write; nothing changed here.
    LostRace,
    /// No state record exists for the order named by the input.
    UnknownOrder,
}
