//! Concurrency per key: at most `limit` orders of one key (a customer, an account, a device,
//! read from the order's input) run at once, from their first step to their end, waits and
//! compensation included; the others wait in line, in the order they were accepted.
//!
//! A key's running orders and its line are kept apart from the orders' records
//! ([`crate::ports::KeyBook`]):
//!
//! - [`Slots`]: one small item per key, the places taken (each by one run of one order), written
//!   only with a condition on the version read. Taking a place never makes more than `limit`.
//! - The line: one entry per waiting order, read oldest first with a consistent read.
//!
//! An order of a keyed workflow is created waiting ([`Slot`] not admitted): no step holds a
//! lease, and its CompleteBy is when the supervisor looks at it again. Whoever handles its
//! start message first admits, from the head of the line, as many orders as places are free
//! ([`plan`]); an order starts only once its own place is taken, read back consistently. An
//! order gives its place back in the write after the one that ended it, and the next in line
//! are admitted then, and a third write records it given back: until then the ended order
//! stays in the expiry index, and the supervisor gives its place back if its handler died
//! before it could. A place left behind all the same (a place written for an order that
//! ended meanwhile) is found when the key is full and the orders waiting look again: the
//! records of the places' orders are read, and the places of those that ended are taken back
//! ([`ended_places`]). A place names the order's run (its redrives), so a place of an
//! order that ended is never confused with the place of the same order redriven.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::OrderId;
use crate::order::{Rejection, token_at};
use crate::state::StateRecord;
use crate::time::Timestamp;

/// Most orders of one key that may run at once: a key's places are one small item.
pub const MAX_LIMIT: u32 = 100;
/// Longest key value, in bytes: a key is part of a DynamoDB key.
pub const MAX_VALUE_LEN: usize = 256;
/// Longest `max_wait_seconds`: a waiting order is kept as long as a redrive may come.
pub const MAX_WAIT: Duration = Duration::from_secs(30 * 24 * 3600);
/// A position after every entry of a line: the orders ahead of it are the whole line.
pub const END_OF_LINE: &str = "~";
/// How soon a waiting order is looked at again at first; the interval grows with its wait.
pub const FIRST_LOOK: Duration = Duration::from_secs(60);
/// The longest interval between two looks at a waiting order.
pub const LAST_LOOK: Duration = Duration::from_secs(15 * 60);
/// How long a place must have been taken before a full key's waiting orders check whether
/// its order ended: an order that ended gives its place back within moments, and checking
/// costs a read of each place's order.
pub const CHECK_PLACES_AFTER: Duration = Duration::from_secs(60);
/// How long after an order ended the supervisor gives its place back, if the write that
/// records it given back has not come by then.
pub const RELEASE_CHECK: Duration = Duration::from_secs(60);

/// What a newcomer does when its key has no free place or orders already waiting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnConflict {
    /// Waits in line, and starts when a place frees (the default).
    #[default]
    Queue,
    /// Ends at once, without running, cancelled with the cause `key_busy`: for work that a
    /// run already under way makes pointless (a refresh, a sync).
    Skip,
}

/// A workflow's `concurrency`, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Concurrency {
    /// Where the key is in the input: a JSON pointer relative to the input.
    pub pointer: String,
    /// As written in the file (`/input/customer_id`).
    pub declared: String,
    pub limit: u32,
    /// Orders of workflows naming the same group share their keys.
    pub group: String,
    pub max_wait: Option<Duration>,
    pub on_conflict: OnConflict,
}

impl Concurrency {
    /// The key of an order with `input`: `<group>/<value>`; or why the input has none.
    pub fn key_of(&self, input: &Value) -> Result<String, Rejection> {
        let missing = format!(
            "the workflow runs one order at a time per {} (concurrency.key): it is missing",
            self.declared
        );
        let what = ("key", "a concurrency key");
        let value = token_at(input, &self.pointer, what, MAX_VALUE_LEN, missing)?;
        Ok(format!("{}/{value}", self.group))
    }
}

/// An order's standing with its key, kept on its record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slot {
    /// `<group>/<value>`.
    pub key: String,
    /// The run it waits or runs for: 0 at first, one more each time it joins the line again
    /// (a redrive, an undo of a processed order).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub run: u32,
    /// When it joined the line: its place in it.
    pub since: Timestamp,
    /// It holds a place among the key's running orders, and runs.
    #[serde(default, skip_serializing_if = "is_false")]
    pub admitted: bool,
    /// It ended, and its place was given back: until then the ended order stays in the
    /// expiry index, so that the supervisor gives the place back if its handler could not.
    #[serde(default, skip_serializing_if = "is_false")]
    pub released: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Slot {
    /// The name of the place this run of `order_id` takes: `<order id>.<run>`.
    pub fn place(&self, order_id: OrderId) -> String {
        format!("{order_id}.{}", self.run)
    }

    /// When a waiting order is looked at again, at `now`: sooner while its wait is short,
    /// never later than the end of its `max_wait`.
    pub fn next_look(&self, now: Timestamp, max_wait: Option<Duration>) -> Timestamp {
        let waited = self.since.until(now);
        let look = now.plus((waited / 4).clamp(FIRST_LOOK, LAST_LOOK));
        match max_wait {
            Some(wait) => look.min(self.since.plus(wait)).max(now),
            None => look,
        }
    }
}

/// The places of one key: who runs, since when, and the version every write expects.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slots {
    pub key: String,
    /// Place ([`Slot::place`]) to when it was taken.
    pub running: BTreeMap<String, Timestamp>,
    /// The limit the last admission kept to (0 before any): what operators are shown.
    #[serde(default)]
    pub limit: u32,
    /// 0 while nothing was ever written for the key.
    pub version: u64,
}

impl Slots {
    /// The places of `key` before anything was written of it.
    pub fn empty(key: &str) -> Slots {
        Slots { key: key.to_owned(), running: BTreeMap::new(), limit: 0, version: 0 }
    }

    /// The order a place is taken by: the id before its run.
    pub fn order_of(place: &str) -> Option<OrderId> {
        place.rsplit_once('.').and_then(|(id, _)| id.parse().ok())
    }
}

/// One order waiting in a key's line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Queued {
    pub order_id: OrderId,
    pub run: u32,
    pub since: Timestamp,
    /// The attempt its start message must name.
    pub attempt: u64,
    pub correlation_id: String,
    /// The group its start message carries ([`crate::fair`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

impl Queued {
    /// The entry of `record`, waiting with `slot`.
    pub fn of(record: &StateRecord, slot: &Slot) -> Queued {
        Queued {
            order_id: record.order_id,
            run: slot.run,
            since: slot.since,
            attempt: record.attempt,
            correlation_id: record.correlation_id.clone(),
            group: record.group.clone(),
        }
    }

    /// Its place in the line: accepted earlier comes first, ties broken by id.
    pub fn position(&self) -> String {
        format!("{:015}#{}#{}", self.since.as_millis(), self.order_id, self.run)
    }

    /// The place it takes once admitted.
    pub fn place(&self) -> String {
        format!("{}.{}", self.order_id, self.run)
    }
}

/// What admitting from the head of a line writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The places after the admission, to write expecting `slots.version`.
    pub next: Slots,
    /// The orders admitted, oldest first.
    pub admitted: Vec<Queued>,
    /// Entries of orders that already held their place (an admission that died before it
    /// took them out of the line): they leave the line, nothing else.
    pub stale: Vec<Queued>,
}

/// Admits the head of `line` (oldest first, as read) into the free places of `slots`, at
/// `now`; `None` if nothing changes.
pub fn plan(slots: &Slots, line: &[Queued], limit: u32, now: Timestamp) -> Option<Plan> {
    let mut next = slots.clone();
    next.version += 1;
    next.limit = limit;
    let (mut admitted, mut stale) = (Vec::new(), Vec::new());
    for queued in line {
        if next.running.contains_key(&queued.place()) {
            stale.push(queued.clone());
            continue;
        }
        // A place of an earlier run of the same order, never given back: that run ended, since
        // an order runs one run at a time.
        let earlier: Vec<String> = next
            .running
            .keys()
            .filter(|p| Slots::order_of(p) == Some(queued.order_id))
            .cloned()
            .collect();
        for place in earlier {
            next.running.remove(&place);
        }
        if next.running.len() >= limit as usize {
            break;
        }
        next.running.insert(queued.place(), now);
        admitted.push(queued.clone());
    }
    if admitted.is_empty() && stale.is_empty() {
        return None;
    }
    Some(Plan { next, admitted, stale })
}

/// The places of `slots` whose orders ended (or moved on to another run), given each place's
/// order as read now (`None`: no such order).
pub fn ended_places<'a>(
    slots: &'a Slots,
    records: &[(OrderId, Option<StateRecord>)],
) -> Vec<&'a String> {
    slots
        .running
        .keys()
        .filter(|place| {
            let Some(id) = Slots::order_of(place) else { return true };
            match records.iter().find(|(o, _)| *o == id).map(|(_, r)| r) {
                // Not read: left as it is.
                None => false,
                Some(None) => true,
                Some(Some(record)) => match &record.slot {
                    Some(slot) => slot.place(id) != **place || record.process_state.is_terminal(),
                    None => true,
                },
            }
        })
        .collect()
}

/// Where a waiting order stands in its key's line, as `sas show` tells it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Standing {
    pub key: String,
    /// As the key's places last recorded it; 0 if they never did.
    pub limit: u32,
    /// Orders of the key running now.
    pub running: u32,
    /// 1 for the next order to start.
    pub position: u32,
    pub since: Timestamp,
}

impl std::fmt::Display for Standing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nth = match (self.position % 10, self.position % 100) {
            (1, n) if n != 11 => "st",
            (2, n) if n != 12 => "nd",
            (3, n) if n != 13 => "rd",
            _ => "th",
        };
        write!(f, "{}: {} running", self.key, self.running)?;
        if self.limit > 0 {
            write!(f, " of {}", self.limit)?;
        }
        write!(f, ", this order {}{nth} in line", self.position)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queued(n: u128, since: i64) -> Queued {
        Queued {
            order_id: OrderId::from_uuid(uuid::Uuid::from_u128(n)),
            run: 0,
            since: Timestamp::from_millis(since),
            attempt: 0,
            correlation_id: String::new(),
            group: None,
        }
    }

    #[test]
    fn admission_takes_the_head_of_the_line_into_free_places_only() {
        let now = Timestamp::from_millis(9_000);
        let mut slots = Slots::empty("customer/c-1");
        slots.running.insert(queued(7, 0).place(), Timestamp::from_millis(1));
        let line = [queued(1, 10), queued(2, 20), queued(3, 30)];
        let plan = plan(&slots, &line, 2, now).unwrap();
        assert_eq!(plan.admitted, vec![queued(1, 10)]);
        assert_eq!(plan.next.running.len(), 2);
        assert_eq!(plan.next.version, 1);
        assert!(super::plan(&plan.next, &line[1..], 2, now).is_none(), "full: nothing changes");
    }

    #[test]
    fn an_entry_whose_order_holds_its_place_only_leaves_the_line() {
        let now = Timestamp::from_millis(9_000);
        let mut slots = Slots::empty("k/1");
        slots.running.insert(queued(1, 10).place(), now);
        let plan = plan(&slots, &[queued(1, 10), queued(2, 20)], 1, now).unwrap();
        assert_eq!(plan.stale, vec![queued(1, 10)]);
        assert!(plan.admitted.is_empty());
    }

    #[test]
    fn an_order_admitted_again_leaves_the_place_of_its_earlier_run() {
        let now = Timestamp::from_millis(9_000);
        let mut slots = Slots::empty("k/1");
        slots.running.insert(queued(1, 10).place(), now);
        let mut again = queued(1, 500);
        again.run = 1;
        let plan = plan(&slots, &[again.clone()], 1, now).unwrap();
        assert_eq!(plan.admitted, vec![again.clone()]);
        assert_eq!(plan.next.running.keys().collect::<Vec<_>>(), vec![&again.place()]);
    }

    #[test]
    fn the_line_is_in_order_of_acceptance_whatever_the_ids() {
        let (a, b) = (queued(9, 1_000), queued(1, 2_000));
        assert!(a.position() < b.position());
        assert!(queued(1, 99).position() < queued(1, 100).position());
    }

    #[test]
    fn a_waiting_order_is_looked_at_less_often_the_longer_it_waits_and_at_its_max_wait() {
        let since = Timestamp::from_millis(0);
        let slot = Slot { key: "k/1".into(), run: 0, since, admitted: false, released: false };
        assert_eq!(slot.next_look(since, None), since.plus(FIRST_LOOK));
        let late = since.plus(Duration::from_secs(7200));
        assert_eq!(slot.next_look(late, None), late.plus(LAST_LOOK));
        let wait = Duration::from_secs(90);
        assert_eq!(
            slot.next_look(since.plus(Duration::from_secs(60)), Some(wait)),
            since.plus(wait)
        );
    }

    #[test]
    fn standing_reads_as_a_place_in_line() {
        let s = Standing {
            key: "customer/c-1".into(),
            limit: 1,
            running: 1,
            position: 2,
            since: Timestamp::from_millis(0),
        };
        assert_eq!(s.to_string(), "customer/c-1: 1 running of 1, this order 2nd in line");
        let unknown = Standing { limit: 0, position: 13, ..s };
        assert_eq!(unknown.to_string(), "customer/c-1: 1 running, this order 13th in line");
    }
}
