//! What the engine counts and times, through the `metrics` facade. The function that runs a
//! service installs a recorder (on Lambda, one that prints CloudWatch's embedded metric
//! format); without one, as in the simulation, every call here does nothing.
//!
//! Names are fixed here, and every label takes a handful of values (a step, an outcome, a
//! queue), so that each metric stays a few CloudWatch series: the cost of a metric is per
//! series, not per sample. Times come from the services' injected clock, so a test with a
//! manual clock sees exact durations.

use std::sync::OnceLock;
use std::time::Duration;

use crate::state::{Happening, StateRecord, TimelineEntry};
use crate::time::Timestamp;

/// Orders written by submission (a repeated request with the same key is not counted again).
pub const ORDERS_ACCEPTED: &str = "OrdersAccepted";
/// Requests to submit refused, by `reason` (the API's error code).
pub const ORDERS_REFUSED: &str = "OrdersRefused";
/// Orders that reached an end, by `outcome`: processed, compensated, failed, cancelled.
pub const ORDERS_ENDED: &str = "OrdersEnded";
/// Seconds from acceptance (or the latest redrive) to the end, by `outcome`.
pub const TIME_TO_TERMINAL: &str = "TimeToTerminal";
/// Seconds from when a step (or its undo) was leased to its reply, waits in queues included,
/// by `step` and `outcome`: done, refused, undone, undo_failed.
pub const STEP_DURATION: &str = "StepDuration";
/// Seconds one call to a remote service took, by `outcome`: ok, refused, transient.
pub const REMOTE_CALL_DURATION: &str = "RemoteCallDuration";
/// How an agent finished with a request, by `outcome`: replied, expired, gave_up.
pub const AGENT_REQUESTS: &str = "AgentRequests";
/// Leases the supervisor found expired, by `counted`: yes if the expiry counted against the
/// step's FailureCount, no if waiting messages explained it.
pub const LEASE_EXPIRIES: &str = "LeaseExpiries";
/// Expired records a sweep found (one sample per sweep).
pub const SWEEP_SIZE: &str = "SweepSize";
/// Records a sweep reset, compensated or failed.
pub const SUPERVISOR_RESETS: &str = "SupervisorResets";
/// Records a sweep lost to another writer (the scheduler got there first).
pub const SWEEP_RACES_LOST: &str = "SweepRacesLost";
/// Seconds since the oldest order the supervisor watches (in flight, or failed with its alert
/// not yet confirmed) was accepted; 0 when there is none. One sample per sweep, stalled or not.
pub const OLDEST_IN_FLIGHT_AGE: &str = "OldestInFlightAge";
/// Messages waiting in a queue, one sample each time its depth is read, by `queue`.
pub const QUEUE_BACKLOG: &str = "QueueBacklog";
/// Seconds a message sent now would wait in a queue, by `queue`.
pub const QUEUE_WAIT: &str = "QueueWait";

/// One sample per service at each of the supervisor's sweeps: 1 while the service is held,
/// 0 while it is open, by `service`.
pub const SERVICE_HELD: &str = "ServiceHeld";
/// Orders waiting for a held service, one sample per service at each sweep, by `service`.
pub const SERVICE_WAITING: &str = "ServiceWaiting";
/// A limited service's declared rate, one sample per call that takes a turn: drawn beside its
/// calls a second.
pub const SERVICE_RATE_LIMIT: &str = "ServiceRateLimit";

/// Every metric's name: what the stack's alarms and dashboards may read.
pub const NAMES: [&str; 17] = [
    SERVICE_HELD,
    SERVICE_WAITING,
    SERVICE_RATE_LIMIT,
    ORDERS_ACCEPTED,
    ORDERS_REFUSED,
    ORDERS_ENDED,
    TIME_TO_TERMINAL,
    STEP_DURATION,
    REMOTE_CALL_DURATION,
    AGENT_REQUESTS,
    LEASE_EXPIRIES,
    SWEEP_SIZE,
    SUPERVISOR_RESETS,
    SWEEP_RACES_LOST,
    OLDEST_IN_FLIGHT_AGE,
    QUEUE_BACKLOG,
    QUEUE_WAIT,
];

/// Describes every metric to the installed recorder, with its unit. Call once, after
/// installing it.
pub fn describe() {
    use metrics::Unit::{Count, Seconds};
    let counts = [
        (ORDERS_ACCEPTED, "orders written by submission"),
        (ORDERS_REFUSED, "submissions refused, by reason"),
        (ORDERS_ENDED, "orders ended, by outcome"),
        (AGENT_REQUESTS, "requests an agent finished with, by outcome"),
        (LEASE_EXPIRIES, "expired leases, by whether they counted"),
        (SWEEP_SIZE, "expired records found by one sweep"),
        (SUPERVISOR_RESETS, "records a sweep acted on"),
        (SWEEP_RACES_LOST, "records a sweep lost to another writer"),
    ];
    for (name, what) in counts {
        metrics::describe_counter!(name, Count, what);
    }
    metrics::describe_histogram!(QUEUE_BACKLOG, Count, "messages waiting in a queue, when read");
    metrics::describe_histogram!(SERVICE_HELD, Count, "1 while a service is held, 0 while open");
    metrics::describe_histogram!(SERVICE_WAITING, Count, "orders waiting for a held service");
    metrics::describe_histogram!(SERVICE_RATE_LIMIT, Count, "a limited service's declared rate");
    let times = [
        (TIME_TO_TERMINAL, "time from acceptance to the end"),
        (STEP_DURATION, "time from a step's lease to its reply"),
        (REMOTE_CALL_DURATION, "time of one call to a remote service"),
        (QUEUE_WAIT, "expected wait of a message sent now"),
        (OLDEST_IN_FLIGHT_AGE, "age of the oldest order being watched"),
    ];
    for (name, what) in times {
        metrics::describe_histogram!(name, Seconds, what);
    }
}

/// Counts and times what a saved transition from `before` to `after` did, from the timeline
/// entries it added.
pub fn saved(before: &StateRecord, after: &StateRecord) {
    let added = added_entries(&before.timeline, &after.timeline);
    let first_new = after.timeline.len() - added.len();
    let mut ended = false;
    for (offset, entry) in added.iter().enumerate() {
        let earlier = &after.timeline[..first_new + offset];
        match entry.what {
            Happening::LeaseExpired => {
                let counted = if after.failure_count > before.failure_count { "yes" } else { "no" };
                metrics::counter!(LEASE_EXPIRIES, "counted" => counted).increment(1);
            }
            Happening::StepDone
            | Happening::StepFailed
            | Happening::StepUndone
            | Happening::UndoFailed => {
                let Some(step) = entry.step.clone() else { continue };
                if let Some(started) = run_start(earlier, &step) {
                    let outcome = step_outcome(entry.what);
                    metrics::histogram!(STEP_DURATION, "step" => step, "outcome" => outcome)
                        .record(seconds(started, entry.at));
                }
            }
            Happening::Processed
            | Happening::Compensated
            | Happening::Failed
            | Happening::Cancelled => {
                let outcome = end_outcome(entry.what);
                let started = earlier
                    .iter()
                    .rev()
                    .find(|e| matches!(e.what, Happening::Received | Happening::Redriven))
                    .map_or(after.created_at, |e| e.at);
                metrics::histogram!(TIME_TO_TERMINAL, "outcome" => outcome)
                    .record(seconds(started, entry.at));
                metrics::counter!(ORDERS_ENDED, "outcome" => outcome).increment(1);
                ended = true;
            }
            _ => {}
        }
    }
    if ended && let Some(print) = PRINT_NOW.get() {
        print();
    }
}

/// What prints the metrics recorded so far, set by the function's wiring (see [`print_ends_at_once`]).
static PRINT_NOW: OnceLock<fn()> = OnceLock::new();

/// Has `print` called right after a saved write that ended an order has been counted, rather
/// than when the invocation ends.
///
/// What the end counts promise: each order that ends is counted once, by the invocation
/// whose write ended it, and never otherwise (a redelivered message that finds the order
/// ended counts nothing). An invocation that dies between that write and the printing of its
/// lines (killed, crashed, timed out) loses them, so `OrdersEnded` can fall short of the
/// table, never exceed it. Printing at once shrinks that window from the rest of the
/// invocation (its sends, other messages of its batch) to the write's answer on its way back.
pub fn print_ends_at_once(print: fn()) {
    let _ = PRINT_NOW.set(print);
}

/// An order was written by submission.
pub fn accepted() {
    metrics::counter!(ORDERS_ACCEPTED).increment(1);
}

/// A submission was refused for `reason`, one of the API's error codes.
pub fn refused(reason: &str) {
    metrics::counter!(ORDERS_REFUSED, "reason" => reason.to_owned()).increment(1);
}

/// One call to a remote service, and how it ended.
pub fn remote_call(outcome: &'static str, took: Duration) {
    metrics::histogram!(REMOTE_CALL_DURATION, "outcome" => outcome).record(took.as_secs_f64());
}

/// How an agent finished with a request.
pub fn agent_finished(outcome: &'static str) {
    metrics::counter!(AGENT_REQUESTS, "outcome" => outcome).increment(1);
}

/// A service's state, as the supervisor found it.
pub fn service_state(service: &str, held: bool, waiting: u64) {
    let service = service.to_owned();
    metrics::histogram!(SERVICE_HELD, "service" => service.clone())
        .record(f64::from(u8::from(held)));
    metrics::histogram!(SERVICE_WAITING, "service" => service).record(waiting as f64);
}

/// A call of a limited service took its turn.
pub fn service_rate_limit(per_second: u32) {
    metrics::histogram!(SERVICE_RATE_LIMIT).record(f64::from(per_second));
}

/// What one sweep found and did.
pub fn swept(found: usize, acted: usize, lost_races: usize) {
    metrics::counter!(SWEEP_SIZE).increment(found as u64);
    metrics::counter!(SUPERVISOR_RESETS).increment(acted as u64);
    metrics::counter!(SWEEP_RACES_LOST).increment(lost_races as u64);
}

/// How long ago the oldest order being watched was accepted.
pub fn oldest_in_flight(age: Duration) {
    metrics::histogram!(OLDEST_IN_FLIGHT_AGE).record(age.as_secs_f64());
}

/// One queue's backlog (if it was read) and expected wait, as just read.
pub fn queue_load(queue: String, waiting: Option<f64>, expected_wait: Duration) {
    if let Some(waiting) = waiting {
        // A sample per read, not a gauge: a gauge would be printed again after every
        // invocation, read or not.
        metrics::histogram!(QUEUE_BACKLOG, "queue" => queue.clone()).record(waiting);
    }
    metrics::histogram!(QUEUE_WAIT, "queue" => queue).record(expected_wait.as_secs_f64());
}

/// The entries of `after` that `before` does not have. The timeline only grows at its end
/// (trimming drops entries after the first), so they follow the last entry the two share.
fn added_entries<'a>(before: &[TimelineEntry], after: &'a [TimelineEntry]) -> &'a [TimelineEntry] {
    match before.last() {
        None => after,
        Some(last) => match after.iter().rposition(|e| e == last) {
            Some(i) => &after[i + 1..],
            // Nothing shared: a record that did not come from `before`; count nothing.
            None => &[],
        },
    }
}

/// When `step` was first leased in its current run: its earliest claim since the entry that
/// began the run, or, when the step was leased in the same write that ended the step before
/// it (or began compensation), that entry's time.
fn run_start(earlier: &[TimelineEntry], step: &str) -> Option<Timestamp> {
    let mut claimed = None;
    for e in earlier.iter().rev() {
        match e.what {
            Happening::Claimed if e.step.as_deref() == Some(step) => claimed = Some(e.at),
            Happening::StepDone
            | Happening::StepFailed
            | Happening::StepUndone
            | Happening::UndoFailed
            | Happening::CompensationStarted
            | Happening::Received
            | Happening::Resumed
            | Happening::Redriven => return claimed.or(Some(e.at)),
            _ => {}
        }
    }
    claimed
}

fn step_outcome(what: Happening) -> &'static str {
    match what {
        Happening::StepDone => "done",
        Happening::StepFailed => "refused",
        Happening::StepUndone => "undone",
        _ => "undo_failed",
    }
}

fn end_outcome(what: Happening) -> &'static str {
    match what {
        Happening::Processed => "processed",
        Happening::Compensated => "compensated",
        Happening::Cancelled => "cancelled",
        _ => "failed",
    }
}

fn seconds(from: Timestamp, to: Timestamp) -> f64 {
    from.until(to).as_secs_f64()
}
