//! Retry and wait policies, as plain values.
//!
//! Two different waits exist in the pattern. An agent retries a transient fault of its remote
//! service within one lease ([`RetryPolicy`], exponential backoff with full jitter, never past
//! CompleteBy). The supervisor, when a lease expired, waits longer before the scheduler tries
//! the step again ([`WaitPolicy`], growing with the failure count).

use std::time::Duration;

/// Exponential backoff with full jitter for an agent's calls to its remote service.
///
/// The n-th retry (n = 1, 2, ...) waits a uniformly random time in
/// `[0, min(max_delay, initial_delay * 2^(n-1))]`. Full jitter spreads the retries of many
/// agents that failed together, so a recovering service is not hit by a synchronised wave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Upper bound of the first retry's delay. Default 200 ms.
    pub initial_delay: Duration,
    /// Cap on any single delay. Default 5 s.
    pub max_delay: Duration,
    /// Calls to the remote service per request, the first included. Default 8. The agent also
    /// stops when the next delay would end after CompleteBy, whichever comes first.
    pub max_calls: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            initial_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
            max_calls: 8,
        }
    }
}

impl RetryPolicy {
    /// The delay before retry number `retry` (1-based), given `unit`, a random number in [0, 1).
    pub fn delay(&self, retry: u32, unit: f64) -> Duration {
        let ceiling = exponential(self.initial_delay, self.max_delay, retry);
        ceiling.mul_f64(unit.clamp(0.0, 1.0))
    }
}

/// How much longer the supervisor waits before a step is tried again after its lease expired.
///
/// After the n-th expiry the order waits `min(max, base * 2^(n-1))` before the scheduler may
/// claim it again. No jitter: the supervisor's sweeps already spread records over time, and a
/// deterministic wait keeps an order's history easy to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitPolicy {
    /// Wait after the first expiry. Default 5 s.
    pub base: Duration,
    /// Cap on the wait. Default 300 s.
    pub max: Duration,
}

impl Default for WaitPolicy {
    fn default() -> Self {
        WaitPolicy { base: Duration::from_secs(5), max: Duration::from_secs(300) }
    }
}

impl WaitPolicy {
    /// The wait after the expiry that brought the failure count to `failure_count` (1-based).
    pub fn wait(&self, failure_count: u32) -> Duration {
        exponential(self.base, self.max, failure_count.max(1))
    }
}

fn exponential(base: Duration, max: Duration, n: u32) -> Duration {
    let factor = 2u32.saturating_pow(n.saturating_sub(1).min(31));
    base.saturating_mul(factor).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delays_grow_are_capped_and_jittered() {
        let p = RetryPolicy::default();
        assert_eq!(p.delay(1, 0.999_999).as_millis(), 199);
        assert_eq!(p.delay(3, 0.5), Duration::from_millis(400));
        assert_eq!(p.delay(40, 0.5), Duration::from_millis(2500));
        assert_eq!(p.delay(2, 0.0), Duration::ZERO);
    }

    #[test]
    fn supervisor_wait_grows_with_failures_up_to_the_cap() {
        let w = WaitPolicy::default();
        let waits: Vec<u64> = (1..=8).map(|n| w.wait(n).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(w.wait(u32::MAX), w.max);
        assert_eq!(w.wait(0), w.base);
    }
}
