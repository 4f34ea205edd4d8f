//! A service's declared limits, and the bookkeeping every execution of its agent shares to keep
//! within them: calls per second (each call's turn, spaced from the one before) and calls in
//! flight (numbered places, each taken until the end of its call's budget).
//!
//! A rate is kept by spacing calls, not by counting them in seconds: the shared record holds
//! when the next turn begins, and each call takes the turn at or after now and moves it on by
//! [`spacing`]. However a service aligns the seconds it counts in, one of them never holds more
//! calls than its rate, even when the calls travel to it in a little more or less time than
//! each other ([`TRAVEL_JITTER`]), where counting calls per second of one's own clock lets two
//! seconds' calls meet in one of the service's. A call never waits for a turn beyond its
//! budget: it is kept back instead.
//!
//! The functions here are pure: they say what to write given what was read, and the
//! [`Pace`](crate::ports::Pace) port makes each write conditional on what it read, so that two
//! executions never take the same turn or the same place. A place whose call is past its budget
//! is free again: an execution that died holding one gives it back by the clock, not by a
//! cleanup.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::mutants::{self, Mutant};
use crate::time::Timestamp;

/// How much more or less time than each other two calls may take to reach the service (and be
/// counted by it), which the spacing of turns leaves room for: a busy host, a network's
/// queues and the service's own scheduling each delay some calls more than others. A service
/// is so called at 1 / 1.2 of its declared rate at most (5 calls a second declared: one every
/// 240 ms).
pub const TRAVEL_JITTER: Duration = Duration::from_millis(200);

/// How long after its turn began a call may still go. A call that gets to its turn later
/// (writing the turn took long, or its host woke it late) takes another: gone late, it could
/// reach the service with the calls of the turns after its own. This slack is half the
/// [`TRAVEL_JITTER`] the spacing leaves room for; the other half is for the journey.
pub const TURN_SLACK: Duration = Duration::from_millis(100);

/// How many turns a call lets pass before it is kept back instead: a host too busy to keep a
/// turn would only be given more work by asking for one again and again.
pub const MAX_MISSED_TURNS: u32 = 3;

/// How often a call that waits for a place in flight asks again.
pub const PLACE_POLL: Duration = Duration::from_millis(100);

/// The highest rate a service may declare: each call's turn is one write to one item, and one
/// item takes about a thousand writes a second.
pub const MAX_RATE: u32 = 500;

/// The most calls in flight a service may declare.
pub const MAX_IN_FLIGHT: u32 = 10_000;

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
    /// No limit: the agent keeps no turns and takes no place, and writes nothing for it.
    pub const NONE: Limits = Limits { per_second: None, in_flight: None };

    pub fn is_none(&self) -> bool {
        self.per_second.is_none() && self.in_flight.is_none()
    }
}

/// The time between two calls' turns at `per_second`: a second and the travel jitter, shared
/// out, so that any second of the service's holds at most `per_second` calls. Rounded up to the
/// millisecond, the unit turns are kept in: a share cut to the millisecond below loses a little
/// at every turn, and a second's turns together would lose up to all of the jitter's room.
pub fn spacing(per_second: u32) -> Duration {
    let travel =
        if mutants::on(Mutant::SpacingWithoutTravel) { Duration::ZERO } else { TRAVEL_JITTER };
    let shared = (Duration::from_secs(1) + travel).as_millis();
    let each = shared.div_ceil(u128::from(per_second.max(1)));
    Duration::from_millis(u64::try_from(each).unwrap_or(u64::MAX))
}

/// The turn a call asking at `now` gets when the next free turn is `next` (`None`: no call
/// was ever taken).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Turn {
    /// When the call may start.
    pub start: Timestamp,
    /// The next free turn once this one is taken.
    pub next: Timestamp,
}

/// The turn of a call asking at `now`, spaced `spacing` from the one before.
pub fn turn(next: Option<Timestamp>, now: Timestamp, spacing: Duration) -> Turn {
    let start = next.map_or(now, |next| next.max(now));
    Turn { start, next: start.plus(spacing) }
}

/// What asking for a turn came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Booked {
    /// The call's turn starts then.
    Start(Timestamp),
    /// The next free turn, `next`, starts after the latest the call could take: nothing taken.
    TooLate { next: Timestamp },
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
    /// How far ahead the turns are taken: the wait of a call asking now, in milliseconds.
    pub booked_ahead_ms: u64,
    /// Places taken by calls still within their budget.
    pub in_flight: u32,
}

impl Usage {
    /// The usage at `now`, from the next free turn and the places as read.
    pub fn at(now: Timestamp, next: Option<Timestamp>, places: &BTreeMap<u32, Timestamp>) -> Usage {
        let ahead = next.map_or(Duration::ZERO, |next| now.until(next));
        Usage {
            booked_ahead_ms: u64::try_from(ahead.as_millis()).unwrap_or(u64::MAX),
            in_flight: u32::try_from(places.values().filter(|until| **until > now).count())
                .unwrap_or(u32::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_are_spaced_so_that_no_second_however_aligned_holds_more_than_the_rate() {
        let d = spacing(5);
        assert_eq!(d, Duration::from_millis(240));
        let t0 = Timestamp::from_millis(1_000_000);
        let mut next = None;
        let mut starts = Vec::new();
        for _ in 0..50 {
            let t = turn(next, t0, d);
            starts.push(t.start.as_millis());
            next = Some(t.next);
        }
        // Every window of a second, at any offset, arrivals late by up to the jitter.
        for offset in (t0.as_millis()..t0.as_millis() + 10_000).step_by(7) {
            for late in [0, TRAVEL_JITTER.as_millis() as i64] {
                let within = starts
                    .iter()
                    .enumerate()
                    .filter(|(k, s)| {
                        let arrives = **s + if k % 2 == 0 { late } else { 0 };
                        (offset..offset + 1000).contains(&arrives)
                    })
                    .count();
                assert!(within <= 5, "{within} calls in the second from {offset}");
            }
        }
        // A call asking after an idle spell starts at once.
        let later = t0.plus(Duration::from_secs(60));
        assert_eq!(turn(next, later, d).start, later);
    }

    #[test]
    fn turns_back_to_back_leave_the_whole_jitter_room_at_every_rate() {
        // Turns are kept in whole milliseconds: a spacing cut to the millisecond below would
        // let `per_second + 1` calls closer together than a second and the jitter (at 250 a
        // second, 4 ms instead of 4.8 leaves no room at all).
        let t0 = Timestamp::from_millis(1_000_000);
        for per_second in 1..=MAX_RATE {
            let d = spacing(per_second);
            let mut next = None;
            let mut starts = Vec::new();
            for _ in 0..=per_second {
                let t = turn(next, t0, d);
                starts.push(t.start);
                next = Some(t.next);
            }
            let span = starts[0].until(starts[per_second as usize]);
            assert!(
                span >= Duration::from_secs(1) + TRAVEL_JITTER,
                "{per_second} a second: {} calls within {span:?}",
                per_second + 1
            );
        }
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
        let usage = Usage::at(now, Some(Timestamp::from_millis(12_500)), &taken);
        assert_eq!(usage, Usage { booked_ahead_ms: 2_500, in_flight: 2 });
    }
}
