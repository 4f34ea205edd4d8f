//! An agent's guard on its service: before each call it asks whether the call's action (and
//! the service) is open and has room for the call, and after it tells what came of the call,
//! so that the agent holds an action after passing faults in a row of its calls and, while it
//! is held, sends it nothing but one probe at a time (an action that answers goes on while
//! another is held); paces the calls of orders resumed after a hold at the stack's resume
//! rate across all the agent's executions, so that a service that comes back is not met by
//! every order that waited for it at once; keeps within the service's declared rate and
//! concurrency across all the agent's executions ([`crate::pace`]); leaves it alone for as
//! long as it asked when it throttled a call; and, once it throttled one, keeps to a rate
//! learned from its throttling ([`crate::health::Learned`]), below any declared one, so that a
//! service whose limit nobody declared, or declared too high, is not pressed into throttling
//! again and again.
//!
//! The guard reads the service's record at most once a second per execution (the decision to
//! stop calling may lag that much behind another execution's hold, which costs a few calls at
//! most), and writes it only when something changes: a hold, a probe taken, a hold ended. It
//! counts the faults it meets in a row itself, so that faults that pass cost no write, and
//! holds the service for every execution once its count reaches the policy's. Should the
//! record or the pace be unreadable, the guard lets calls through: the state of its
//! bookkeeping must never be what stops a working service from being called (a service
//! pressed too hard then throttles, and the guard hears that).
//!
//! A call that cannot have its turn before its budget ends (the turns up to it are taken,
//! every place in flight is taken, or the service asked to be left alone until after it) is
//! not made: the request is kept back until there is room, and its lease does not burn.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use tracing::{info, warn};

use crate::config::HoldPolicy;
use crate::health::{CUT_WAVE, Calling, QUIET_STEP, ServiceRecord, Streak, hold_key};
use crate::mutants::{self, Mutant};
use crate::pace::{self, Booked, Limits, MAX_MISSED_TURNS, PLACE_POLL, Place, TURN_SLACK, Usage};
use crate::ports::{Clock, Pace, Saved, ServiceBook};
use crate::time::Timestamp;

/// What the service's name is followed by in the key of the turns its resumed calls take
/// ([`Pace::take_turn`]): no agent's name holds a `/`.
const RESUMED: &str = "/resumed";

/// How long a record read stays good enough to decide on.
pub const FRESH: Duration = Duration::from_secs(1);

/// A call is given its turn only if this much of its budget is left once it starts.
pub const CALL_ROOM: Duration = Duration::from_secs(1);

/// The longest a call asks for its turn ahead of now, however long the last turn took to
/// write: one slow write must not delay the calls after it by more.
const MAX_LEAD: Duration = Duration::from_secs(1);

/// The longest a throttled call's `Retry-After` keeps the service quiet.
pub const MAX_QUIET: Duration = Duration::from_secs(900);

/// A throttle lowers the rate only if its execution met this many among its last
/// [`THROTTLE_SAMPLE`] calls (and within [`SAMPLE_SPAN`]).
pub const THROTTLES_TO_CUT: usize = 3;

/// The calls whose throttles are counted towards a cut.
pub const THROTTLE_SAMPLE: usize = 20;

/// Throttles older than this count towards no cut, however few calls came since.
pub const SAMPLE_SPAN: Duration = Duration::from_secs(60);

/// The most calls an execution keeps note of: twice the highest rate's second.
const MAX_NOTED: usize = 2 * crate::pace::MAX_RATE as usize;

/// One execution's recent calls and the throttles among them: the rate its calls went at when
/// none was in force, and whether the service throttles often enough to mean they go too fast.
#[derive(Debug, Default)]
struct Recent {
    /// When the calls of the last second, and at least the last [`THROTTLE_SAMPLE`], went.
    calls: VecDeque<Timestamp>,
    /// Throttles since the oldest of the sample's calls.
    throttles: VecDeque<Timestamp>,
}

impl Recent {
    fn call(&mut self, now: Timestamp) {
        self.calls.push_back(now);
        let second_ago = now.minus(Duration::from_secs(1));
        while self.calls.len() > MAX_NOTED
            || (self.calls.len() > THROTTLE_SAMPLE
                && self.calls.front().is_some_and(|t| *t <= second_ago))
        {
            self.calls.pop_front();
        }
    }

    fn throttle(&mut self, now: Timestamp) {
        self.throttles.push_back(now);
        let sample_from = self.calls.iter().rev().nth(THROTTLE_SAMPLE - 1).copied();
        let oldest = sample_from.map_or(now.minus(SAMPLE_SPAN), |t| t.max(now.minus(SAMPLE_SPAN)));
        while self.throttles.front().is_some_and(|t| *t < oldest) {
            self.throttles.pop_front();
        }
    }

    /// Whether the throttles are many enough to lower the rate.
    fn crowded(&self) -> bool {
        self.throttles.len() >= THROTTLES_TO_CUT
    }

    /// The calls of the second up to `now`.
    fn per_second(&self, now: Timestamp) -> u32 {
        let second_ago = now.minus(Duration::from_secs(1));
        let count = self.calls.iter().rev().take_while(|t| **t > second_ago).count();
        u32::try_from(count).unwrap_or(u32::MAX)
    }
}

/// What the guard says of the next call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// The service is open and has room: call it now, and hand the pass back when done.
    Call(Pass),
    /// The call's action (or, in a record from before holds were per action, the whole
    /// service) is held by its agent, and this call is its probe: `on` names what it probes
    /// (`None`: the whole service).
    Probe { pass: Pass, on: Option<String> },
    /// The call's action, or the whole service, is held: do not call it.
    Held(Holding),
    /// The service has no room for the call before its budget ends: keep the request back
    /// until `until`.
    Busy { until: Timestamp },
}

/// A hold that stops a call: why, and what it is on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding {
    pub reason: String,
    /// The action held; `None`: the whole service.
    pub on: Option<String>,
}

impl Holding {
    fn of(on: Option<&str>, hold: &crate::health::Hold) -> Holding {
        Holding { reason: hold.reason.clone(), on: on.map(str::to_owned) }
    }
}

/// What an admitted call holds until it is over: its place in flight, if the service's
/// concurrency is limited.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    place: Option<Place>,
}

/// The book of an agent that keeps no guard: it knows no service and writes nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoBook;

impl Pace for NoBook {
    async fn take_turn(
        &self,
        _: &str,
        _: Duration,
        now: Timestamp,
        _: Timestamp,
    ) -> crate::error::Result<Booked> {
        Ok(Booked::Start(now))
    }
    async fn enter(
        &self,
        _: &str,
        _: u32,
        _: Timestamp,
        until: Timestamp,
    ) -> crate::error::Result<Option<Place>> {
        Ok(Some(Place { slot: 0, until }))
    }
    async fn leave(&self, _: &str, _: Place) -> crate::error::Result<()> {
        Ok(())
    }
    async fn usage(&self, _: &str, _: Timestamp) -> crate::error::Result<Usage> {
        Ok(Usage::default())
    }
}

impl ServiceBook for NoBook {
    async fn load(&self, _: &str) -> crate::error::Result<Option<ServiceRecord>> {
        Ok(None)
    }
    async fn all(&self) -> crate::error::Result<Vec<ServiceRecord>> {
        Ok(Vec::new())
    }
    async fn save(&self, _: &ServiceRecord) -> crate::error::Result<Saved> {
        Ok(Saved::Conflict)
    }
}

/// One agent's guard on its service.
#[derive(Debug)]
pub struct Guard<G, C> {
    book: G,
    clock: C,
    service: String,
    policy: HoldPolicy,
    limits: Limits,
    seen: Mutex<Option<(Timestamp, ServiceRecord)>>,
    /// The passing faults this execution met in a row, per action.
    streaks: Mutex<BTreeMap<String, Streak>>,
    /// How long this execution's last turn took to write.
    lead: Mutex<Duration>,
    /// This execution's recent calls and the throttles among them.
    recent: Mutex<Recent>,
}

impl<G: ServiceBook + Pace, C: Clock> Guard<G, C> {
    /// The guard of `service`, keeping its record in `book`.
    pub fn new(book: G, clock: C, service: &str, policy: HoldPolicy) -> Self {
        Guard {
            book,
            clock,
            service: service.to_owned(),
            policy,
            limits: Limits::NONE,
            seen: Mutex::new(None),
            streaks: Mutex::new(BTreeMap::new()),
            lead: Mutex::new(Duration::ZERO),
            recent: Mutex::new(Recent::default()),
        }
    }

    /// The same guard, keeping its service within `limits`.
    pub fn limited(self, limits: Limits) -> Self {
        Guard { limits, ..self }
    }

    /// Whether to call the service for `action`, for a call that must be over by `deadline`;
    /// `resumed`: the call is an order's first since it waited for a hold, and takes its turn
    /// at the resume rate. It may wait (for the second its call is counted in, a place in
    /// flight, or the end of a quiet the service asked for) before it answers.
    pub async fn admit(&self, action: &str, deadline: Timestamp, resumed: bool) -> Admission {
        let record = self.current().await;
        let holding = match mutants::on(Mutant::ProbeOfAnotherAction) {
            true => record.holds().next(),
            false => record.holding(action),
        };
        let probe = match holding {
            None => None,
            Some((on, hold)) => {
                let now = self.clock.now();
                let taken = match record.probe(now, on, &self.policy) {
                    Some(next) => self.write(next).await,
                    None => false,
                };
                if !taken {
                    return Admission::Held(Holding::of(on, hold));
                }
                info!(service = %self.service, held = %hold_key(&self.service, on), "probing what is held");
                Some(on.map(str::to_owned))
            }
        };
        let now = self.clock.now();
        if let Some(until) = record.quiet_at(now) {
            if until.plus(CALL_ROOM) > deadline {
                return Admission::Busy { until };
            }
            self.clock.sleep(now.until(until)).await;
        }
        let place = match self.limits.in_flight {
            Some(limit) => match self.place(limit, deadline).await {
                Ok(place) => place,
                Err(busy) => return busy,
            },
            None => None,
        };
        // A wait for a quiet's end, a place or a turn may outlast the read the call was let
        // through on: an action held meanwhile by another execution is not called. A call with
        // a turn looks while it waits for it, so that the read does not make it late.
        let recheck = probe.is_none().then_some(action);
        let mut turned = false;
        if resumed && probe.is_none() {
            let key = format!("{}{RESUMED}", self.service);
            let per_second = self.policy.resume_per_second;
            if let Err(busy) = self.turn(&key, per_second, deadline, recheck, false).await {
                self.done(Pass { place }).await;
                return busy;
            }
            turned = true;
        }
        if let Some(per_second) = self.rate(&record, self.clock.now()) {
            if let Err(busy) = self.turn(&self.service, per_second, deadline, recheck, true).await {
                self.done(Pass { place }).await;
                return busy;
            }
            turned = true;
        }
        let pass = Pass { place };
        if let Some(on) = probe {
            self.called();
            return Admission::Probe { pass, on };
        }
        if !turned && let Err(held) = self.still_open(action).await {
            self.done(pass).await;
            return held;
        }
        self.called();
        Admission::Call(pass)
    }

    /// The calls a second every execution keeps to (see [`ServiceRecord::rate_at`]).
    fn rate(&self, record: &ServiceRecord, now: Timestamp) -> Option<u32> {
        record.rate_at(self.limits.per_second, now)
    }

    /// Notes a call going now among this execution's recent calls.
    fn called(&self) {
        let now = self.clock.now();
        self.recent.lock().unwrap_or_else(|e| e.into_inner()).call(now);
    }

    /// Whether `action` is still open, as read within the last [`FRESH`].
    async fn still_open(&self, action: &str) -> Result<(), Admission> {
        let record = self.current().await;
        match record.holding(action) {
            Some((on, hold)) => Err(Admission::Held(Holding::of(on, hold))),
            None => Ok(()),
        }
    }

    /// A place in flight, waiting for one until too little of the budget would be left.
    async fn place(&self, limit: u32, deadline: Timestamp) -> Result<Option<Place>, Admission> {
        loop {
            let now = self.clock.now();
            match self.book.enter(&self.service, limit, now, deadline).await {
                Ok(Some(place)) => return Ok(Some(place)),
                Ok(None) if now.plus(PLACE_POLL + CALL_ROOM) > deadline => {
                    return Err(Admission::Busy { until: now.plus(Duration::from_secs(1)) });
                }
                Ok(None) => self.clock.sleep(PLACE_POLL).await,
                Err(e) => {
                    warn!(service = %self.service, error = %e, "the places in flight are unreadable: the call goes");
                    return Ok(None);
                }
            }
        }
    }

    /// Takes the call's turn among those of `key` (the service's, or its resumed calls') and
    /// waits for it. The turn asked for starts no sooner than the last turn took to write, so
    /// that the call is not late for it from the start; a call late all the same takes
    /// another turn, and after [`MAX_MISSED_TURNS`] is kept back, unless `exact` is false (a
    /// pace rather than the service's limit: the resume rate), when it goes late. With
    /// `recheck` (the call's action), the service's record is looked at [`FRESH`] before the
    /// turn (or at once if it is nearer): a hold found ends the wait, and no read stands
    /// between the turn and the call.
    async fn turn(
        &self,
        key: &str,
        per_second: u32,
        deadline: Timestamp,
        recheck: Option<&str>,
        exact: bool,
    ) -> Result<(), Admission> {
        let latest = deadline.minus(CALL_ROOM);
        // A pace keeps to its rate, no more: the supervisor sends the resumed orders at it, so
        // that spaced wider their turns would fall behind them.
        let spacing = match exact {
            true => pace::spacing(per_second),
            false => Duration::from_millis(1000 / u64::from(per_second.max(1))),
        };
        for _ in 0..=MAX_MISSED_TURNS {
            let asked = self.clock.now();
            let lead = *self.lead.lock().unwrap_or_else(|e| e.into_inner());
            let start = match self.book.take_turn(key, spacing, asked.plus(lead), latest).await {
                Ok(Booked::Start(start)) => start,
                Ok(Booked::TooLate { next }) => return Err(Admission::Busy { until: next }),
                Err(e) => {
                    warn!(service = %self.service, error = %e, "the service's turns are unreadable: the call goes");
                    return match recheck {
                        Some(action) => self.still_open(action).await,
                        None => Ok(()),
                    };
                }
            };
            let taken = self.clock.now();
            *self.lead.lock().unwrap_or_else(|e| e.into_inner()) = asked.until(taken).min(MAX_LEAD);
            if let Some(action) = recheck {
                let look = start.minus(FRESH);
                if look > taken {
                    self.clock.sleep(taken.until(look)).await;
                }
                self.still_open(action).await?;
            }
            let now = self.clock.now();
            if start > now {
                self.clock.sleep(now.until(start)).await;
            }
            let late = start.until(self.clock.now());
            if late <= TURN_SLACK || !exact {
                if exact {
                    crate::metrics::service_rate_limit(per_second);
                }
                return Ok(());
            }
            info!(service = %self.service, late_ms = late.as_millis() as u64, "the call got to its turn late: it takes another");
        }
        Err(Admission::Busy { until: self.clock.now().plus(spacing) })
    }

    /// The call is over: its place in flight is free.
    pub async fn done(&self, pass: Pass) {
        if let Some(place) = pass.place
            && let Err(e) = self.book.leave(&self.service, place).await
        {
            // The place frees itself at its `until`.
            warn!(service = %self.service, error = %e, "a place in flight could not be given back");
        }
    }

    /// The service throttled a call: no execution calls it for `retry_after` (a second if it
    /// said nothing). If this execution met [`THROTTLES_TO_CUT`] throttles among its last
    /// [`THROTTLE_SAMPLE`] calls, every execution then keeps to a lower rate, learned again
    /// from there ([`crate::health::Learned`]); fewer are taken for chance (a service with a
    /// quota shared with others, a cold instance), which the quiet answers. Returns whether
    /// the throttle counts towards a hold: one that lowered the rate, or came within
    /// [`CUT_WAVE`] of its lowering (a call made at the rate before), does not, since the
    /// lower rate has not been tried yet; throttles that persist at the lowered rates do.
    pub async fn throttled(&self, retry_after: Option<Duration>) -> bool {
        let now = self.clock.now();
        let until = now.plus(retry_after.unwrap_or(QUIET_STEP).min(MAX_QUIET));
        let (crowded, counted) = {
            let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            recent.throttle(now);
            (recent.crowded(), recent.per_second(now).max(1))
        };
        let cut = |r: &ServiceRecord| {
            crowded.then(|| self.rate(r, now).map_or(Calling::Counted(counted), Calling::InForce))
        };
        self.change(|r| r.throttled(now, until, cut(r))).await;
        let learned = self.current().await.learned;
        if let Some(cut) = learned.filter(|l| l.at == now) {
            info!(service = %self.service, per_second = cut.per_second, "the service throttled calls often: every execution keeps to a lower rate");
        }
        if learned.is_some_and(|l| l.at.plus(CUT_WAVE) > now) {
            // The calls to come go at the lowered rate: throttles before it do not count
            // towards the next cut.
            self.recent.lock().unwrap_or_else(|e| e.into_inner()).throttles.clear();
        }
        // This execution waits even if the write did not land.
        if let Some((_, seen)) = self.seen.lock().unwrap_or_else(|e| e.into_inner()).as_mut()
            && seen.quiet_until.is_none_or(|q| q < until)
        {
            seen.quiet_until = Some(until);
        }
        learned.is_none_or(|l| l.at.plus(CUT_WAVE) <= now)
    }

    /// A call of `action` got an answer (done or refused): what it called works. `probe`: the
    /// call was the probe of that hold (`Some(None)`: of the whole service), which it ends.
    pub async fn answered(&self, action: &str, probe: Option<Option<&str>>) {
        self.streaks.lock().unwrap_or_else(|e| e.into_inner()).remove(action);
        let Some(on) = probe else { return };
        let now = self.clock.now();
        if self.change(|r| r.answered(now, on, true)).await {
            info!(service = %self.service, held = %hold_key(&self.service, on), "the probe was answered: open again");
        }
    }

    /// A call of `action` met a passing fault (`counts`: one that counts towards a hold);
    /// `probe`, as for [`Guard::answered`]: the hold goes on, and records the fault. Returns
    /// the hold the action is under now, if it is held.
    pub async fn fault(
        &self,
        action: &str,
        reason: &str,
        counts: bool,
        probe: Option<Option<&str>>,
    ) -> Option<Holding> {
        let now = self.clock.now();
        let policy = self.policy;
        if let Some(on) = probe {
            self.change(|r| r.probe_failed(now, on, reason)).await;
        } else if counts {
            let faults = {
                let mut streaks = self.streaks.lock().unwrap_or_else(|e| e.into_inner());
                streaks.entry(action.to_owned()).or_default().fault(now, &policy)
            };
            if faults >= policy.after_failures {
                self.change(|r| r.hold(now, action, faults, reason, &policy)).await;
            }
        }
        self.holding(action, reason).await
    }

    /// The hold `action` is under now, if any, said where operators look.
    async fn holding(&self, action: &str, reason: &str) -> Option<Holding> {
        let record = self.current().await;
        let holding = record.holding(action).map(|(on, hold)| Holding::of(on, hold));
        if let Some(holding) = &holding {
            let held = hold_key(&self.service, holding.on.as_deref());
            warn!(service = %self.service, %held, %reason, "held");
        }
        holding
    }

    /// The last lease of a step ran out of tries on passing faults of `action` alone (the last:
    /// `reason`): rather than let them fail the step, the action is held now, whatever the
    /// count in a row, and its probes tell when it answers again. An execution that met fewer
    /// than [`HoldPolicy::after_failures`] (its share of the calls, under load, or just started)
    /// would otherwise fail the order for an outage. Returns the hold the action is under.
    pub async fn hold_at_last(&self, action: &str, reason: &str) -> Option<Holding> {
        let now = self.clock.now();
        let faults = self
            .streaks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(action)
            .map_or(1, |s| s.faults().max(1));
        self.change(|r| r.hold(now, action, faults, reason, &self.policy)).await;
        self.holding(action, reason).await
    }

    fn remember(&self, record: ServiceRecord) {
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = Some((self.clock.now(), record));
    }

    /// The record, as read within the last [`FRESH`] or read now.
    async fn current(&self) -> ServiceRecord {
        let now = self.clock.now();
        let fresh = {
            let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            seen.as_ref().filter(|(at, _)| at.plus(FRESH) > now).map(|(_, r)| r.clone())
        };
        match fresh {
            Some(record) => record,
            None => self.read().await,
        }
    }

    async fn read(&self) -> ServiceRecord {
        match self.book.load(&self.service).await {
            Ok(found) => {
                let record =
                    found.unwrap_or_else(|| ServiceRecord::open(&self.service, self.clock.now()));
                self.remember(record.clone());
                record
            }
            Err(e) => {
                warn!(service = %self.service, error = %e, "the service's record is unreadable: calls go through");
                // Taken as open for as long as a read is, so that a table that fails is asked
                // once a second, not before every call.
                let record = ServiceRecord::open(&self.service, self.clock.now());
                self.remember(record.clone());
                record
            }
        }
    }

    /// Applies `change` to the record and writes the result, trying once more on a fresh read
    /// if another execution wrote first. Returns whether a write landed.
    async fn change(&self, change: impl Fn(&ServiceRecord) -> Option<ServiceRecord>) -> bool {
        let record = self.current().await;
        let Some(next) = change(&record) else { return false };
        if self.write(next).await {
            return true;
        }
        let record = self.read().await;
        match change(&record) {
            Some(next) => self.write(next).await,
            None => false,
        }
    }

    /// Writes `next` on the condition of its version; remembers what it wrote, or forgets the
    /// stale record so that the next question reads it again.
    async fn write(&self, next: ServiceRecord) -> bool {
        match self.book.save(&next).await {
            Ok(Saved::Saved) => {
                self.remember(next);
                true
            }
            Ok(Saved::Conflict) => {
                *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = None;
                false
            }
            Err(e) => {
                warn!(service = %self.service, error = %e, "the service's record could not be written");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Timestamp = Timestamp::from_millis(1_767_225_600_000);

    fn at(ms: u64) -> Timestamp {
        T0.plus(Duration::from_millis(ms))
    }

    #[test]
    fn throttles_lower_the_rate_only_when_they_are_frequent_among_the_last_calls() {
        let mut recent = Recent::default();
        // One throttle in twenty calls, twice: chance.
        for k in 0..40 {
            recent.call(at(k * 100));
            if k % 20 == 19 {
                recent.throttle(at(k * 100 + 50));
            }
        }
        assert!(!recent.crowded());
        // Three within the last twenty calls: the calls go too fast.
        recent.throttle(at(4_000));
        assert!(!recent.crowded());
        recent.throttle(at(4_001));
        assert!(recent.crowded());
        // Twenty calls on, those three are out of the sample.
        for k in 0..20 {
            recent.call(at(5_000 + k * 100));
        }
        recent.throttle(at(7_000));
        assert!(!recent.crowded());
        // Throttles a minute old count for nothing, however few calls came since.
        recent.throttle(at(7_001));
        recent.throttle(at(7_000 + SAMPLE_SPAN.as_millis() as u64 + 1));
        assert!(!recent.crowded());
    }

    #[test]
    fn the_rate_counted_is_the_calls_of_the_last_second() {
        let mut recent = Recent::default();
        for k in 0..50 {
            recent.call(at(k * 40));
        }
        assert_eq!(recent.per_second(at(49 * 40)), 25);
        assert_eq!(recent.per_second(at(10_000)), 0);
        assert!(recent.calls.len() >= THROTTLE_SAMPLE, "the sample is kept");
    }
}
