//! Orders that start without a client: on an event that matches a pattern a workflow
//! declares, or at the times of a schedule it declares. Each start is keyed by what started
//! it (the event's id, the schedule's time), so a start delivered or looked at twice makes one
//! order.

use std::time::Duration;

use serde_json::Value;

use crate::time::Timestamp;

pub mod pattern;
pub mod schedule;

pub use pattern::Pattern;
pub use schedule::Schedule;

/// `source` of every event the system publishes (status events, alerts). They never start an
/// order, lest an order's events start more: the stack's start rule takes every source but
/// this one, and a pattern that only this source matches is refused when its workflow loads.
pub const OWN_SOURCE: &str = "sas.orders";

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

/// The shortest look back over the schedules' times: a sweep up to this late starts the
/// orders of the times it passed.
pub const MIN_LOOK_BACK: Duration = Duration::from_secs(5 * 60);

/// How far back each sweep of a supervisor swept on `sweep` looks for the schedules' times:
/// two of its longest gaps, so that a sweep missed or failed loses no time, and never less
/// than [`MIN_LOOK_BACK`].
pub fn look_back(sweep: &Schedule, now: Timestamp) -> Duration {
    (sweep.longest_gap(now) * 2).max(MIN_LOOK_BACK)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_looks_back_over_two_of_its_gaps_and_never_less_than_five_minutes() {
        let now = Timestamp::from_millis(1_800_000_000_000);
        let back = |sweep: &str| look_back(&Schedule::parse(sweep, None).unwrap(), now);
        assert_eq!(back("rate(1 minute)"), MIN_LOOK_BACK);
        assert_eq!(back("rate(10 minutes)"), Duration::from_secs(20 * 60));
        assert_eq!(back("rate(1 hour)"), Duration::from_secs(2 * 3600));
        // Every 5 minutes from 08:00 to 17:55, Monday to Friday: the weekend is the longest gap.
        let weekdays = back("cron(0/5 8-17 ? * MON-FRI *)");
        assert_eq!(weekdays, Duration::from_secs(2 * (2 * 24 + 14) * 3600 + 2 * 5 * 60));
    }
}
