//! A clock that only moves when told to, sequential ids, and seeded randomness.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::ports::{Clock, Ids};
use crate::time::Timestamp;

/// A manual clock. `sleep` advances it by the duration and returns at once, so code that waits
/// (an agent's backoff) runs instantly and deterministically in tests. Clones share the time.
#[derive(Clone, Debug)]
pub struct ManualClock {
    now: Arc<Mutex<Timestamp>>,
    /// How far this clone reads ahead of the time it shares (a host whose clock runs fast).
    ahead: Duration,
}

impl ManualClock {
    pub fn at(start: Timestamp) -> Self {
        ManualClock { now: Arc::new(Mutex::new(start)), ahead: Duration::ZERO }
    }

    /// A clone that reads `by` ahead of this clock, and moves with it.
    pub fn ahead_by(&self, by: Duration) -> Self {
        ManualClock { now: self.now.clone(), ahead: self.ahead + by }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(|e| e.into_inner());
        *now = now.plus(by);
    }

    /// Sets the clock; it never moves backwards.
    pub fn set(&self, to: Timestamp) {
        let mut now = self.now.lock().unwrap_or_else(|e| e.into_inner());
        *now = (*now).max(to);
    }
}

impl Default for ManualClock {
    /// Starts at 2026-01-01T00:00:00Z, a readable instant in test output.
    fn default() -> Self {
        ManualClock::at(Timestamp::from_millis(1_767_225_600_000))
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        self.now.lock().unwrap_or_else(|e| e.into_inner()).plus(self.ahead)
    }

    async fn sleep(&self, duration: Duration) {
        self.advance(duration);
    }
}

/// Ids `prefix-1`, `prefix-2`, ...
#[derive(Debug)]
pub struct SeqIds {
    prefix: String,
    next: AtomicU64,
}

impl SeqIds {
    pub fn new(prefix: &str) -> Self {
        SeqIds { prefix: prefix.to_owned(), next: AtomicU64::new(1) }
    }
}

impl Ids for SeqIds {
    fn new_id(&self) -> String {
        format!("{}-{}", self.prefix, self.next.fetch_add(1, Ordering::Relaxed))
    }
}

pub use sas_rng::SplitMix;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manual_clock_moves_only_forward_and_sleep_advances_it() {
        let c = ManualClock::at(Timestamp::from_millis(10));
        futures_util::FutureExt::now_or_never(c.sleep(Duration::from_millis(5))).unwrap();
        assert_eq!(c.now().as_millis(), 15);
        c.set(Timestamp::from_millis(1));
        assert_eq!(c.now().as_millis(), 15);
    }
}
