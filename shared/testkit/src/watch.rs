//! A service as its calls reach it: each call checked against the services' book (nothing but
//! its probe reaches a held action) and against what the service declared (no second, however
//! aligned, holds more calls than its rate, nor are more in flight than its concurrency), and
//! where calls take time, the time they take to travel and be answered.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sas_engine::health::hold_key;
use sas_engine::memory::{MemoryServiceBook, SplitMix};
use sas_engine::pace::{self, Limits};
use sas_engine::ports::{Clock, RemoteCall, RemoteFault, RemoteService};
use sas_engine::services::FRESH;
use sas_engine::{OrderId, Timestamp};

use crate::world::{Timeline, lock};

/// What reached the services while their records said they were held.
#[derive(Debug, Default)]
pub struct Watch {
    /// Per hold (a service's, or one action's, by [`hold_key`]): since when the last seen
    /// began, and how many of its probes went.
    pub probes: HashMap<String, (Timestamp, u64)>,
    /// Per action (by [`hold_key`]): when a call of it was last answered (done or refused).
    pub answered: HashMap<String, Timestamp>,
    /// Probes that reached a held service.
    pub probed: u64,
    /// Calls in the first [`FRESH`] of a hold: the guard may still go by a read from before it.
    pub late: u64,
    /// Calls that reached a held service and were not its probe.
    pub intruders: Vec<String>,
    /// Calls that reached a service while its agent held another of its actions.
    pub beside_holds: u64,
    /// Calls numbered as they reach their service.
    pub calls: u64,
    /// Per service: when the calls that reached it within the last second came.
    pub received: HashMap<String, VecDeque<Timestamp>>,
    /// Per service: the calls it is working on, by number, with when their callers stop
    /// waiting (a call whose caller gave up no longer takes a place of the agent's).
    pub open: HashMap<String, Vec<(u64, Timestamp)>>,
    /// Calls past what their service declared, in calls a second or in flight.
    pub overruns: Vec<String>,
    /// Calls that reached a service with declared limits; of them, those that filled its
    /// second (the last call the rate allows), and those that took its last place in flight.
    pub limited_calls: u64,
    pub full_seconds: u64,
    pub full_places: u64,
    /// Calls that reached a service while a rate learned from its 429s was in force.
    pub learned_calls: u64,
    /// Whether the last answer to each key was a 429.
    pub throttled: HashMap<String, bool>,
    /// Each order's actions a service refused for good.
    pub refused: HashSet<(OrderId, String)>,
}

/// The longest a service takes to answer a call, on the seeds whose services are paced.
pub const ANSWER_TIME: Duration = Duration::from_millis(800);

/// An agent's remote service, watched against the services' book and what the service
/// declared, as the service sees its calls when they reach it: a call that reaches the
/// service while its record says it is held, and is not the probe its guard claimed in the
/// record, is noted (the guard decides on a read at most [`FRESH`] old, so a call within that
/// of the hold's start is let pass); so is a call past the service's declared rate, in any
/// second however aligned, or past its declared concurrency. On the seeds whose services are
/// paced, calls take time: each reaches its service up to [`pace::TRAVEL_JITTER`] after it
/// leaves (the room the turns leave for it), and is answered up to [`ANSWER_TIME`] later; an
/// answer that comes once its caller stopped waiting is a timeout.
#[derive(Clone, Debug)]
pub struct Watched<R> {
    pub remote: R,
    pub book: Arc<MemoryServiceBook>,
    pub service: String,
    pub clock: Timeline,
    pub watch: Arc<Mutex<Watch>>,
    pub limits: Limits,
    /// The draws of calls' travel and answer times, where calls take time.
    pub times: Option<Arc<SplitMix>>,
}

impl<R: RemoteService> RemoteService for Watched<R> {
    async fn call(&self, call: &RemoteCall) -> std::result::Result<serde_json::Value, RemoteFault> {
        let travel = self.times.as_ref().map_or(Duration::ZERO, |times| {
            let travel = pace::TRAVEL_JITTER.mul_f64(times.unit());
            Duration::from_millis(travel.as_millis() as u64)
        });
        if !travel.is_zero() {
            self.clock.sleep(travel).await;
        }
        let number = self.received(call, travel);
        let mut answer = self.remote.call(call).await;
        if let Some(times) = &self.times {
            self.clock.sleep(ANSWER_TIME.mul_f64(times.unit())).await;
            if self.clock.now() >= call.deadline {
                answer = Err(RemoteFault::Transient("timeout".into()));
            }
        }
        let mut watch = lock(&self.watch);
        if let Some(open) = watch.open.get_mut(&self.service) {
            open.retain(|(n, _)| *n != number);
        }
        let throttled = matches!(answer, Err(RemoteFault::Throttled { .. }));
        watch.throttled.insert(call.idempotency_key.clone(), throttled);
        if matches!(answer, Ok(_) | Err(RemoteFault::Permanent(_))) {
            let action = hold_key(&self.service, Some(&call.action));
            watch.answered.insert(action, self.clock.now());
        }
        if let Err(RemoteFault::Permanent(_)) = &answer {
            watch.refused.insert((call.order_id, call.action.clone()));
        }
        answer
    }
}

impl<R> Watched<R> {
    /// Notes a call as it reaches the service, `travel` after it left; returns its number.
    fn received(&self, call: &RemoteCall, travel: Duration) -> u64 {
        let now = self.clock.now();
        let left = now.minus(travel);
        let mut guard = lock(&self.watch);
        let watch = &mut *guard;
        let record = self.book.records().into_iter().find(|r| r.service == self.service);
        watch.learned_calls +=
            u64::from(record.as_ref().is_some_and(|r| r.learned_at(now).is_some()));
        let beside = |(on, hold): (Option<&str>, &sas_engine::health::Hold)| {
            hold.by.is_none() && on.is_some_and(|a| a != call.action)
        };
        if record.as_ref().is_some_and(|r| r.holds().any(beside)) {
            watch.beside_holds += 1;
        }
        // The hold that stops a call of this action, if any: the whole service's or the
        // action's own. A call of another action is none of its business.
        if let Some((on, hold)) = record.as_ref().and_then(|r| r.holding(&call.action)) {
            let held = hold_key(&self.service, on);
            let seen = watch.probes.entry(held.clone()).or_insert((hold.since, 0));
            if seen.0 != hold.since {
                *seen = (hold.since, 0);
            }
            if hold.probes > seen.1 {
                seen.1 = hold.probes;
                watch.probed += 1;
            } else if left < hold.since.plus(FRESH) {
                watch.late += 1;
            } else {
                watch.intruders.push(format!(
                    "{held} was called for {} of {} while held since {} s before, and not as its probe",
                    call.action,
                    call.order_id,
                    hold.since.until(now).as_secs()
                ));
            }
        }
        watch.calls += 1;
        let number = watch.calls;
        let received = watch.received.entry(self.service.clone()).or_default();
        let second_ago = now.minus(Duration::from_secs(1));
        while received.front().is_some_and(|t| *t <= second_ago) {
            received.pop_front();
        }
        received.push_back(now);
        let (in_second, first) = (received.len(), received[0]);
        let open = watch.open.entry(self.service.clone()).or_default();
        open.retain(|(_, until)| *until > now);
        open.push((number, call.deadline));
        let in_flight = open.len();
        if self.limits.is_none() {
            return number;
        }
        watch.limited_calls += 1;
        if let Some(rate) = self.limits.per_second.map(|r| r as usize) {
            watch.full_seconds += u64::from(in_second == rate);
            if in_second > rate {
                watch.overruns.push(format!(
                    "{} received {in_second} calls within a second ({} ms from the first to {} of {}), more than the {rate} it declared",
                    self.service,
                    first.until(now).as_millis(),
                    call.action,
                    call.order_id,
                ));
            }
        }
        if let Some(places) = self.limits.in_flight.map(|p| p as usize) {
            watch.full_places += u64::from(in_flight == places);
            if in_flight > places {
                watch.overruns.push(format!(
                    "{} had {in_flight} calls in flight at once ({} of {} the last), more than the {places} it declared",
                    self.service, call.action, call.order_id,
                ));
            }
        }
        number
    }
}
