//! An in-memory event bus with the semantics of EventBridge `PutEvents`, behind the
//! [`EventBus`] port.
//!
//! What is kept from EventBridge: a call takes at most 10 entries and about 256 KiB, or is
//! refused whole; and a call that succeeds can still fail some of its entries, which the answer
//! lists by position. The engine must retry exactly those, so partial failure can be injected
//! entry by entry, as can whole calls failing. Accepted events are kept in order for tests to
//! read back.

use std::fmt;
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::events::{BusEvent, PublishReport};
use crate::ports::EventBus;

/// Most entries one `PutEvents` call takes.
pub const MAX_PUBLISH_BATCH: usize = 10;
/// Largest total size of one call's entries, in bytes.
pub const MAX_PUBLISH_BYTES: usize = 256 * 1024;
/// The error code EventBridge gives for an entry it failed to accept.
pub const ENTRY_FAILURE: &str = "InternalFailure";

const SERVICE: &str = "eventbridge";

/// An event bus that records what it accepts.
#[derive(Default)]
pub struct MemoryBus {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    published: Vec<BusEvent>,
    rejecting_entries: usize,
    rejecting_at: Option<usize>,
    failing_calls: usize,
}

impl MemoryBus {
    /// An empty bus with no faults.
    pub fn new() -> Self {
        MemoryBus::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fails the next `n` entries (counted across calls) with [`ENTRY_FAILURE`]: they are not
    /// recorded, and the calls that carried them still succeed. Replaces any count set before.
    pub fn reject_next_entries(&self, n: usize) {
        self.state().rejecting_entries = n;
    }

    /// Fails the entry at `index` of the next call that has one, as [`Self::reject_next_entries`]
    /// fails an entry, whatever the other entries of that call: for a test that must say which
    /// entry of a batch EventBridge refuses.
    pub fn reject_entry_at(&self, index: usize) {
        self.state().rejecting_at = Some(index);
    }

    /// Makes the next `n` calls fail as unavailable, recording nothing. Replaces any count set
    /// before.
    pub fn fail_next_calls(&self, n: usize) {
        self.state().failing_calls = n;
    }

    /// Every accepted event, in the order accepted.
    pub fn published(&self) -> Vec<BusEvent> {
        self.state().published.clone()
    }

    /// The parsed details of the accepted events of one detail type, in order. A detail that is
    /// not JSON (the engine never sends one) appears as a JSON string holding the raw text.
    pub fn of_type(&self, detail_type: &str) -> Vec<serde_json::Value> {
        self.state()
            .published
            .iter()
            .filter(|e| e.detail_type == detail_type)
            .map(|e| {
                serde_json::from_str(&e.detail)
                    .unwrap_or_else(|_| serde_json::Value::String(e.detail.clone()))
            })
            .collect()
    }

    /// How many events were accepted.
    pub fn count(&self) -> usize {
        self.state().published.len()
    }
}

impl EventBus for MemoryBus {
    async fn publish(&self, events: &[BusEvent]) -> Result<PublishReport> {
        if events.len() > MAX_PUBLISH_BATCH {
            return Err(Error::rejected(
                SERVICE,
                format!(
                    "{} entries in one PutEvents call, above the limit of {MAX_PUBLISH_BATCH}",
                    events.len()
                ),
            ));
        }
        // EventBridge counts more than these two fields, but they are all the engine varies.
        let bytes: usize = events.iter().map(|e| e.detail_type.len() + e.detail.len()).sum();
        if bytes > MAX_PUBLISH_BYTES {
            return Err(Error::rejected(
                SERVICE,
                format!("entries total {bytes} bytes, above the limit of {MAX_PUBLISH_BYTES}"),
            ));
        }
        let mut state = self.state();
        if state.failing_calls > 0 {
            state.failing_calls -= 1;
            return Err(Error::unavailable(SERVICE, "injected PutEvents failure"));
        }
        let mut report = PublishReport::default();
        let rejecting_at = state.rejecting_at.filter(|&i| i < events.len());
        if rejecting_at.is_some() {
            state.rejecting_at = None;
        }
        for (index, event) in events.iter().enumerate() {
            if rejecting_at == Some(index) {
                report.failed.push((index, ENTRY_FAILURE.to_owned()));
            } else if state.rejecting_entries > 0 {
                state.rejecting_entries -= 1;
                report.failed.push((index, ENTRY_FAILURE.to_owned()));
            } else {
                state.published.push(event.clone());
            }
        }
        Ok(report)
    }
}

impl fmt::Debug for MemoryBus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state();
        f.debug_struct("MemoryBus")
            .field("published", &state.published.len())
            .field("rejecting_entries", &state.rejecting_entries)
            .field("rejecting_at", &state.rejecting_at)
            .field("failing_calls", &state.failing_calls)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{ALERT_DETAIL_TYPE, STATUS_DETAIL_TYPE};

    fn event(n: usize, detail_type: &'static str) -> BusEvent {
        BusEvent {
            id: format!("e-{n}"),
            detail_type,
            detail: serde_json::json!({ "n": n }).to_string(),
        }
    }

    fn batch(range: std::ops::Range<usize>) -> Vec<BusEvent> {
        range.map(|n| event(n, STATUS_DETAIL_TYPE)).collect()
    }

    fn ids(bus: &MemoryBus) -> Vec<String> {
        bus.published().into_iter().map(|e| e.id).collect()
    }

    #[tokio::test]
    async fn accepted_events_are_kept_in_order_and_readable_by_type() {
        let bus = MemoryBus::new();
        let report = bus
            .publish(&[
                event(1, STATUS_DETAIL_TYPE),
                event(2, ALERT_DETAIL_TYPE),
                event(3, STATUS_DETAIL_TYPE),
            ])
            .await
            .unwrap();
        assert!(report.failed.is_empty());
        assert_eq!(bus.count(), 3);
        assert_eq!(ids(&bus), ["e-1", "e-2", "e-3"]);
        assert_eq!(
            bus.of_type(STATUS_DETAIL_TYPE),
            [serde_json::json!({"n": 1}), serde_json::json!({"n": 3})]
        );
        assert_eq!(bus.of_type(ALERT_DETAIL_TYPE).len(), 1);
        assert!(bus.of_type("Other").is_empty());
    }

    #[tokio::test]
    async fn more_than_ten_events_are_refused_whole() {
        let bus = MemoryBus::new();
        let err = bus.publish(&batch(0..11)).await.unwrap_err();
        assert!(matches!(err, Error::Rejected { .. }), "{err}");
        assert!(!err.is_retryable());
        assert_eq!(bus.count(), 0);
        bus.publish(&batch(0..10)).await.unwrap();
        assert_eq!(bus.count(), 10);
    }

    #[tokio::test]
    async fn an_oversized_batch_is_refused_whole() {
        let bus = MemoryBus::new();
        let mut big = event(1, STATUS_DETAIL_TYPE);
        big.detail = format!("\"{}\"", "x".repeat(MAX_PUBLISH_BYTES));
        assert!(bus.publish(&[big]).await.is_err());
        assert_eq!(bus.count(), 0);
    }

    #[tokio::test]
    async fn rejected_entries_are_reported_by_position_across_calls() {
        let bus = MemoryBus::new();
        bus.reject_next_entries(3);
        let first = bus.publish(&batch(0..2)).await.unwrap();
        assert_eq!(first.failed, [(0, ENTRY_FAILURE.to_owned()), (1, ENTRY_FAILURE.to_owned())]);
        let second = bus.publish(&batch(2..5)).await.unwrap();
        assert_eq!(second.failed, [(0, ENTRY_FAILURE.to_owned())]);
        assert_eq!(ids(&bus), ["e-3", "e-4"]);
        let third = bus.publish(&batch(5..6)).await.unwrap();
        assert!(third.failed.is_empty());
        assert_eq!(bus.count(), 3);
    }

    #[tokio::test]
    async fn an_entry_is_rejected_by_position_in_the_first_call_that_has_it() {
        let bus = MemoryBus::new();
        bus.reject_entry_at(1);
        assert!(bus.publish(&batch(0..1)).await.unwrap().failed.is_empty());
        let report = bus.publish(&batch(1..4)).await.unwrap();
        assert_eq!(report.failed, [(1, ENTRY_FAILURE.to_owned())]);
        assert_eq!(ids(&bus), ["e-0", "e-1", "e-3"]);
        assert!(bus.publish(&batch(4..6)).await.unwrap().failed.is_empty(), "spent");
    }

    #[tokio::test]
    async fn failed_calls_record_nothing_and_spare_the_entry_faults() {
        let bus = MemoryBus::new();
        bus.fail_next_calls(1);
        bus.reject_next_entries(1);
        let err = bus.publish(&batch(0..2)).await.unwrap_err();
        assert!(err.is_retryable(), "{err}");
        assert_eq!(bus.count(), 0);
        let report = bus.publish(&batch(0..2)).await.unwrap();
        assert_eq!(report.failed, [(0, ENTRY_FAILURE.to_owned())]);
        assert_eq!(ids(&bus), ["e-1"]);
    }

    #[test]
    fn the_bus_can_be_shared_between_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<MemoryBus>();
    }
}
