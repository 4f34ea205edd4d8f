//! A service's declared limits, and the bookkeeping every execution of its agent shares to keep
//! within them: calls per second (a tally of the calls taken in one whole second) and calls in
//! flight (numbered places, each taken until the end of its call's budget).
//!
//! The functions here are pure: they say what to write given what was read, and the
//! [`Pace`](crate::ports::Pace) port makes each write conditional on what it read, so that two
//! executions never take the same call of a second or the same place. A place whose call is
//! past its budget is free again: an execution that died holding one gives it back by the
//! clock, not by a cleanup.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::time::Timestamp;

/// A call taken in a second starts no later than this into it, so that it reaches the service
/// within the second it was counted in; past it, the next second is taken.
pub const LATE_IN_SECOND: Duration = Duration::from_millis(500);

/// How often a call that waits for a place in flight asks again.
pub const PLACE_POLL: Duration = Duration::from_millis(100);

/// What a service accepts, as its agent declares it: `None` is no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Calls a second, across every execution of the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_second: Option<u32>,
    /// Calls in flight at once, across every execution of the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<u32>,
}

impl Limits {
    /// No limit: the agent keeps no tally and takes no place, and writes nothing for it.
    pub const NONE: Limits = Limits { per_second: None, in_flight: None };

    pub fn is_none(&self) -> bool {
        self.per_second.is_none() && self.in_flight.is_none()
    }
}

/// The whole second (since the epoch) that `at` falls in.
pub fn second_of(at: Timestamp) -> i64 {
    at.as_millis().div_euclid(1000)
}

/// The start of `second`.
pub fn start_of(second: i64) -> Timestamp {
    Timestamp::from_millis(second.saturating_mul(1000))
}

/// The first second a call asked for at `now` may be counted in: this one, unless too little
/// of it is left for the call to reach the service within it.
pub fn first_second(now: Timestamp) -> i64 {
    let second = second_of(now);
    let into = Duration::from_millis(u64::try_from(now.as_millis() - second * 1000).unwrap_or(0));
    if into < LATE_IN_SECOND { second } else { second + 1 }
}

/// The calls taken in one second of a service's rate: what its tally holds. The tally only
/// moves forward, to the latest second any execution took a call in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tally {
    pub second: i64,
    pub taken: u32,
}

/// How to take a call in a second, given the tally last read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Take {
    /// Count one more in the tally's second, if it still has `taken` calls.
    Add { second: i64, taken: u32 },
    /// Start the tally at `second` with this call, if it is still at an earlier second (or
    /// was never written).
    Start { second: i64 },
    /// The tally is at `second` or later and full, or ahead: try this later second.
    Later(i64),
}

/// What to write to take a call in `second` at a rate of `per_second`, given `tally`.
pub fn take(tally: Option<Tally>, second: i64, per_second: u32) -> Take {
    match tally {
        Some(t) if t.second > second => Take::Later(t.second),
        Some(t) if t.second == second && t.taken >= per_second => Take::Later(second + 1),
        Some(t) if t.second == second => Take::Add { second, taken: t.taken },
        _ => Take::Start { second },
    }
}

/// A place in flight, taken until `until`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Place {
    pub slot: u32,
    pub until: Timestamp,
}

/// The first of `limit` places free at `now`, given when each taken one ends (by slot).
pub fn free_place(taken: &BTreeMap<u32, Timestamp>, limit: u32, now: Timestamp) -> Option<u32> {
    (0..limit).find(|slot| taken.get(slot).is_none_or(|until| *until <= now))
}

/// What a service uses of its limits at one moment, for operators.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Calls taken in the current second.
    pub this_second: u32,
    /// Places taken by calls still within their budget.
    pub in_flight: u32,
}

impl Usage {
    /// The usage at `now`, from the tally and the places as read.
    pub fn at(now: Timestamp, tally: Option<Tally>, places: &BTreeMap<u32, Timestamp>) -> Usage {
        let second = second_of(now);
        Usage {
            this_second: tally.filter(|t| t.second == second).map_or(0, |t| t.taken),
            in_flight: u32::try_from(places.values().filter(|until| **until > now).count())
                .unwrap_or(u32::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_late_in_its_second_is_counted_in_the_next() {
        let s = 1_767_225_600;
        assert_eq!(first_second(Timestamp::from_millis(s * 1000 + 499)), s);
        assert_eq!(first_second(Timestamp::from_millis(s * 1000 + 500)), s + 1);
    }

    #[test]
    fn a_tally_fills_its_second_then_sends_calls_to_the_next_and_never_goes_back() {
        assert_eq!(take(None, 10, 5), Take::Start { second: 10 });
        let at = |second, taken| Some(Tally { second, taken });
        assert_eq!(take(at(9, 5), 10, 5), Take::Start { second: 10 });
        assert_eq!(take(at(10, 4), 10, 5), Take::Add { second: 10, taken: 4 });
        assert_eq!(take(at(10, 5), 10, 5), Take::Later(11));
        assert_eq!(take(at(12, 1), 10, 5), Take::Later(12));
    }

    #[test]
    fn a_place_past_its_call_is_free_again() {
        let now = Timestamp::from_millis(10_000);
        let mut taken = BTreeMap::new();
        taken.insert(0, Timestamp::from_millis(20_000));
        taken.insert(1, Timestamp::from_millis(9_000));
        assert_eq!(free_place(&taken, 2, now), Some(1));
        taken.insert(1, Timestamp::from_millis(11_000));
        assert_eq!(free_place(&taken, 2, now), None);
        assert_eq!(free_place(&taken, 3, now), Some(2));
        let usage = Usage::at(now, Some(Tally { second: 10, taken: 3 }), &taken);
        assert_eq!(usage, Usage { this_second: 3, in_flight: 2 });
    }
}
