//! Orders that start without a client: on an event that matches a pattern a workflow
//! declares, or at the times of a schedule it declares. Each start is keyed by what started
//! it (the event's id, the schedule's time), so a start delivered or looked at twice makes one
//! order.

use serde_json::Value;

use crate::time::Timestamp;

pub mod pattern;
pub mod schedule;

pub use pattern::Pattern;
pub use schedule::Schedule;

/// What starts orders of a workflow without a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Start {
    /// Each event that matches `pattern`, with the value at the JSON pointer `input` of the
    /// event as the order's input (`/detail` by default).
    Event { pattern: Pattern, input: String },
    /// Each time `schedule` names, with `input` as the order's input.
    Schedule { schedule: Schedule, input: Value },
}

/// A start a workflow declares: the workflow, and its place among the workflow's starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Declared {
    pub workflow: String,
    pub index: usize,
    pub start: Start,
}

/// The key of the order of `workflow` that the event `event_id` starts: the event's id as it
/// is where a key can hold it, its digest where it cannot.
pub fn event_key(workflow: &str, event_id: &str) -> String {
    let fits = event_id.len() <= 64
        && !event_id.is_empty()
        && event_id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
    let id = if fits { event_id.to_owned() } else { digest(event_id) };
    format!("event-{workflow}-{id}")
}

/// The key of the order that a workflow's schedule `index` starts for its time `at`.
pub fn schedule_key(workflow: &str, index: usize, at: Timestamp) -> String {
    format!("schedule-{workflow}-{index}-{}", at.as_millis())
}

fn digest(text: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(text.as_bytes()).iter().take(16).map(|b| format!("{b:02x}")).collect()
}
