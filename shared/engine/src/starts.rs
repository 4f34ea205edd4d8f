//! Orders that start without a client: on an event that matches a pattern a workflow
//! declares, or at the times of a schedule it declares. Each start is keyed by what started
//! it (the event's id, the schedule's time), so a start delivered or looked at twice makes one
//! order.

pub mod pattern;
pub mod schedule;

pub use pattern::Pattern;
pub use schedule::Schedule;
