//! A service's health: open, or held, as a whole (by an operator, for a maintenance window) or
//! one action at a time (by its agent, after passing faults in a row of that action's calls,
//! or by an operator), with one probe at a time of each action its agent holds.
//!
//! What is held is what is down: an action that answers is not stopped because another does
//! not, a probe tries the action that is held, and an undo whose own action answers goes on
//! while the forward action waits. There is one [`ServiceRecord`] per service (one agent, one
//! service), whatever the number of orders and of the agent's executions, holding the whole
//! service's [`Scope`] and one per action that was ever held. Each method here is pure: it
//! returns the record to write, or `None` when nothing changes, and every write is conditional
//! on the version that was read ([`ServiceBook::save`](crate::ports::ServiceBook::save)). Each
//! execution counts the faults it meets in a row itself, per action ([`Streak`]), and writes
//! only the hold they make: the normal path, faults that pass included, writes nothing.

use std::collections::BTreeMap;
use std::ops::Not;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::HoldPolicy;
use crate::message::{MAX_REASON_LEN, truncate};
use crate::pace::MAX_RATE;
use crate::time::Timestamp;

/// The name the orders waiting for a hold are listed under: the service's own for a hold of
/// the whole service (`action` `None`), `<service>/<action>` for one action's.
pub fn hold_key(service: &str, action: Option<&str>) -> String {
    match action {
        None => service.to_owned(),
        Some(action) => format!("{service}/{action}"),
    }
}

/// A throttled call makes the service quiet for this long when it says nothing of how long,
/// and a quiet is recorded again only once it reaches this much further.
pub const QUIET_STEP: std::time::Duration = std::time::Duration::from_secs(1);

/// A learned rate goes up by a step each time this passes without a throttled call.
pub const RAISE_EVERY: Duration = Duration::from_secs(10);

/// A learned rate is forgotten once this passes without a throttled call: a service that
/// throttled a burst is called freely again once it has taken everything sent to it for this
/// long, with nothing more written per call.
pub const FORGET_AFTER: Duration = Duration::from_secs(300);

/// Throttled calls within this of the last cut of the learned rate were made before it (at
/// the rate it cut), and cut it no further.
pub const CUT_WAVE: Duration = Duration::from_secs(2);

/// What the system knows of one service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceRecord {
    /// The agent that calls it.
    pub service: String,
    /// One more at every write: the condition of the next.
    pub version: u64,
    /// The service as a whole: held by an operator, or, in a record written before holds were
    /// kept per action, by its agent.
    #[serde(flatten)]
    pub whole: Scope,
    /// The actions that were ever held, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub actions: BTreeMap<String, Scope>,
    /// A supervisor is announcing the changes not yet announced, and no other does before
    /// this time: it records this before it publishes, so that two supervisors tending at once
    /// publish one alert each, and one that dies before it records them sent leaves them to
    /// the first sweep after this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub announcing: Option<Timestamp>,
    /// The service asked to be left alone until then (a 429's `Retry-After`): no execution
    /// calls it before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiet_until: Option<Timestamp>,
    /// The rate its agent learned from the service's throttling, kept by every execution
    /// below any declared one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learned: Option<Learned>,
    pub changed_at: Timestamp,
}

/// What can be held: the whole service, or one of its actions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scope {
    /// Set while it is held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<Hold>,
    /// The passing fault that made the agent's last hold, for operators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fault: Option<String>,
    /// How the last hold ended, for operators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<Release>,
    /// The last change (a hold, a release, a hold that lasted past the operators' threshold)
    /// is not yet announced: the supervisor publishes one alert for it, then clears this.
    #[serde(default)]
    pub unannounced: bool,
}

/// A rate learned from a service that throttled calls: at each throttle that lowers it, three
/// quarters of the rate in force; then, while it throttles no more, a step more at every
/// [`RAISE_EVERY`], so that the rate finds the service's own and follows it as it changes;
/// forgotten after [`FORGET_AFTER`] without a throttle. With no rate in force, it is half the
/// rate one execution counted of its own calls, and doubles at each step until the next
/// throttle, since the rate all executions called at together may have been many times that.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Learned {
    /// Calls a second at `at`.
    pub per_second: u32,
    /// The last throttle that cut it.
    pub at: Timestamp,
    /// Cut from a rate counted by one execution: it doubles at each step.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub doubling: bool,
}

/// The rate calls went at when the service throttled them often, from which a throttle cuts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Calling {
    /// The rate every execution kept to (declared or learned).
    InForce(u32),
    /// No rate was in force: the calls one execution made in the last second.
    Counted(u32),
}

impl Learned {
    /// The rate cut from `calling` at `now`.
    pub fn cut(calling: Calling, now: Timestamp) -> Learned {
        let (per_second, doubling) = match calling {
            Calling::InForce(rate) => ((rate * 3 / 4).max(1), false),
            Calling::Counted(rate) => (rate.div_ceil(2).max(1), true),
        };
        Learned { per_second, at: now, doubling }
    }

    /// The rate in force at `now`; `None` once forgotten.
    pub fn at(&self, now: Timestamp) -> Option<u32> {
        let since = self.at.until(now);
        if since >= FORGET_AFTER {
            return None;
        }
        let steps = u32::try_from(since.as_secs() / RAISE_EVERY.as_secs()).unwrap_or(u32::MAX);
        let rate = if self.doubling {
            self.per_second.saturating_mul(2u32.saturating_pow(steps))
        } else {
            // An eighth of the cut rate more at each step (one at least): a fast service
            // regains its rate in minutes, a slow one creeps up on its limit.
            let step = (self.per_second / 8).max(1);
            self.per_second.saturating_add(steps.saturating_mul(step))
        };
        Some(rate.min(MAX_RATE))
    }
}

/// A hold on a service, or on one of its actions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    pub since: Timestamp,
    pub reason: String,
    /// The operator who held it; `None`: its agent, after passing faults in a row. Only an
    /// operator releases an operator's hold; probes end the agent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// No probe goes before this.
    pub next_probe: Timestamp,
    /// Probes sent so far during this hold.
    #[serde(default)]
    pub probes: u64,
    /// The passing fault the last probe met that differed from the one before: why the hold
    /// goes on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe: Option<String>,
    /// The operators were told that it has lasted past their threshold.
    #[serde(default, skip_serializing_if = "Not::not")]
    pub overdue: bool,
}

/// How a hold ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Release {
    pub at: Timestamp,
    /// Since when it had been held.
    pub held_since: Timestamp,
    /// The operator who released it; `None`: a probe was answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Probes sent during the hold: the only calls that reached it while it was held.
    #[serde(default)]
    pub probes: u64,
}

impl Scope {
    /// The alert this scope's state owes, as a stable name: the same hold, release or overdue
    /// hold always has the same; `None` if it was never held.
    pub fn event_key(&self) -> Option<String> {
        match (&self.held, &self.released) {
            (Some(hold), _) if hold.overdue => {
                Some(format!("held-{}-overdue", hold.since.as_millis()))
            }
            (Some(hold), _) => Some(format!("held-{}", hold.since.as_millis())),
            (None, Some(release)) => Some(format!("open-{}", release.at.as_millis())),
            (None, None) => None,
        }
    }

    /// Ends the hold: released at `now` by `by` (`None`: a probe was answered).
    fn release(&mut self, now: Timestamp, by: Option<&str>, reason: &str) {
        let Some(hold) = self.held.take() else { return };
        self.released = Some(Release {
            at: now,
            held_since: hold.since,
            by: by.map(str::to_owned),
            reason: truncate(reason, MAX_REASON_LEN),
            probes: hold.probes,
        });
        self.unannounced = true;
    }
}

impl ServiceRecord {
    /// A service nothing is known of yet: open.
    pub fn open(service: &str, now: Timestamp) -> ServiceRecord {
        ServiceRecord {
            service: service.to_owned(),
            version: 0,
            whole: Scope::default(),
            actions: BTreeMap::new(),
            announcing: None,
            quiet_until: None,
            learned: None,
            changed_at: now,
        }
    }

    /// The whole service's scope (`action` `None`) or the action's, if it was ever held.
    pub fn scope(&self, action: Option<&str>) -> Option<&Scope> {
        match action {
            None => Some(&self.whole),
            Some(action) => self.actions.get(action),
        }
    }

    fn scope_mut(&mut self, action: Option<&str>) -> &mut Scope {
        match action {
            None => &mut self.whole,
            Some(action) => self.actions.entry(action.to_owned()).or_default(),
        }
    }

    /// Every scope: the whole service's first (`None`), then each action's by name.
    pub fn scopes(&self) -> impl Iterator<Item = (Option<&str>, &Scope)> {
        std::iter::once((None, &self.whole))
            .chain(self.actions.iter().map(|(name, scope)| (Some(name.as_str()), scope)))
    }

    /// Every hold in force, the whole service's first.
    pub fn holds(&self) -> impl Iterator<Item = (Option<&str>, &Hold)> {
        self.scopes().filter_map(|(on, scope)| Some((on, scope.held.as_ref()?)))
    }

    /// Whether anything of the service is held.
    pub fn is_held(&self) -> bool {
        self.holds().next().is_some()
    }

    /// The hold that stops a call of `action`, and what it is on: the whole service's if it
    /// is held, else the action's own.
    pub fn holding(&self, action: &str) -> Option<(Option<&str>, &Hold)> {
        match (&self.whole.held, self.actions.get_key_value(action)) {
            (Some(hold), _) => Some((None, hold)),
            (None, Some((name, scope))) => Some((Some(name.as_str()), scope.held.as_ref()?)),
            (None, None) => None,
        }
    }

    fn next(&self, now: Timestamp) -> ServiceRecord {
        ServiceRecord { version: self.version + 1, changed_at: now, ..self.clone() }
    }

    /// The next record, with a change of `on`'s scope to announce: whatever announcement was
    /// under way is made again with it.
    fn changed(&self, now: Timestamp, on: Option<&str>) -> ServiceRecord {
        let mut next = ServiceRecord { announcing: None, ..self.next(now) };
        next.scope_mut(on).unannounced = true;
        next
    }

    /// The agent holds `action` after `faults` passing faults in a row of its calls, the last
    /// for `reason`. `None` if the action or the whole service is held already.
    pub fn hold(
        &self,
        now: Timestamp,
        action: &str,
        faults: u32,
        reason: &str,
        policy: &HoldPolicy,
    ) -> Option<ServiceRecord> {
        if self.holding(action).is_some() {
            return None;
        }
        let mut next = self.changed(now, Some(action));
        let scope = next.scope_mut(Some(action));
        scope.last_fault = Some(truncate(reason, MAX_REASON_LEN));
        let reason = format!("{faults} passing faults in a row, the last: {reason}");
        scope.held = Some(Hold {
            since: now,
            reason: truncate(&reason, MAX_REASON_LEN),
            by: None,
            next_probe: now.plus(policy.probe_every),
            probes: 0,
            last_probe: None,
            overdue: false,
        });
        Some(next)
    }

    /// A call that got an answer (done, or refused for good: either way what it called
    /// works). The answer of a probe of `on` ends its agent's hold; any other changes nothing.
    pub fn answered(&self, now: Timestamp, on: Option<&str>, probe: bool) -> Option<ServiceRecord> {
        let hold = self.scope(on)?.held.as_ref()?;
        if hold.by.is_some() || !probe {
            return None;
        }
        let mut next = self.changed(now, on);
        next.scope_mut(on).release(now, None, "");
        Some(next)
    }

    /// The next probe of `on`, held by its agent, taken by whoever writes this first: `None`
    /// if it is open, held by an operator, or probed too recently.
    pub fn probe(
        &self,
        now: Timestamp,
        on: Option<&str>,
        policy: &HoldPolicy,
    ) -> Option<ServiceRecord> {
        let hold = self.scope(on)?.held.as_ref()?;
        if hold.by.is_some() || hold.next_probe > now {
            return None;
        }
        let mut next = self.next(now);
        let held = next.scope_mut(on).held.as_mut()?;
        held.next_probe = now.plus(policy.probe_every);
        held.probes += 1;
        Some(next)
    }

    /// The probe of `on` met a passing fault: the hold goes on, and says why. `None` if the
    /// fault is the one recorded already (a probe that fails as the last did writes nothing).
    pub fn probe_failed(
        &self,
        now: Timestamp,
        on: Option<&str>,
        fault: &str,
    ) -> Option<ServiceRecord> {
        let hold = self.scope(on)?.held.as_ref()?;
        let fault = truncate(fault, MAX_REASON_LEN);
        if hold.by.is_some() || hold.last_probe.as_deref() == Some(fault.as_str()) {
            return None;
        }
        let mut next = self.next(now);
        next.scope_mut(on).held.as_mut()?.last_probe = Some(fault);
        Some(next)
    }

    /// An operator holds the whole service (`action` `None`: a maintenance window) or one
    /// action: what it holds is called no more, and no probe goes, until an operator releases
    /// it. An agent's hold of it becomes the operator's.
    pub fn hold_by(
        &self,
        now: Timestamp,
        action: Option<&str>,
        by: &str,
        reason: &str,
    ) -> Option<ServiceRecord> {
        let before = self.scope(action).and_then(|s| s.held.as_ref());
        if before.is_some_and(|h| h.by.as_deref() == Some(by) && h.reason == reason) {
            return None;
        }
        let mut next = self.changed(now, action);
        next.scope_mut(action).held = Some(Hold {
            since: before.map_or(now, |h| h.since),
            reason: truncate(reason, MAX_REASON_LEN),
            by: Some(by.to_owned()),
            next_probe: now,
            probes: before.map_or(0, |h| h.probes),
            last_probe: before.and_then(|h| h.last_probe.clone()),
            overdue: false,
        });
        Some(next)
    }

    /// An operator releases what it names, whoever held it: one action, or the whole service
    /// (`None`) with every action held. `None` if nothing it names is held.
    pub fn release_by(
        &self,
        now: Timestamp,
        action: Option<&str>,
        by: &str,
        reason: &str,
    ) -> Option<ServiceRecord> {
        let mut next = self.next(now);
        let mut released = false;
        let named: Vec<Option<String>> = match action {
            Some(action) => vec![Some(action.to_owned())],
            None => self.scopes().map(|(on, _)| on.map(str::to_owned)).collect(),
        };
        for on in named {
            let scope = next.scope_mut(on.as_deref());
            if scope.held.is_some() {
                scope.release(now, Some(by), reason);
                released = true;
            }
        }
        released.then_some(ServiceRecord { announcing: None, ..next })
    }

    /// Marks every hold that has lasted `after` or longer as overdue, a change to announce:
    /// the operators are told once per hold that it goes on. `None` if none is newly overdue.
    pub fn overdue(&self, now: Timestamp, after: Duration) -> Option<ServiceRecord> {
        let late: Vec<Option<String>> = self
            .holds()
            .filter(|(_, h)| !h.overdue && h.since.plus(after) <= now)
            .map(|(on, _)| on.map(str::to_owned))
            .collect();
        if late.is_empty() {
            return None;
        }
        let mut next = ServiceRecord { announcing: None, ..self.next(now) };
        for on in late {
            let scope = next.scope_mut(on.as_deref());
            if let Some(hold) = scope.held.as_mut() {
                hold.overdue = true;
                scope.unannounced = true;
            }
        }
        Some(next)
    }

    /// Whether a change waits to be announced.
    pub fn unannounced(&self) -> bool {
        self.scopes().any(|(_, s)| s.unannounced)
    }

    /// A supervisor takes the announcement of the changes not yet announced until `until`.
    /// `None` if there is nothing to announce, or another supervisor is announcing them and its
    /// time has not run out.
    pub fn announcing(&self, now: Timestamp, until: Timestamp) -> Option<ServiceRecord> {
        if !self.unannounced() || self.announcing.is_some_and(|t| t > now) {
            return None;
        }
        Some(ServiceRecord { announcing: Some(until), ..self.next(now) })
    }

    /// The alerts in `published` were sent: each scope whose state is still the one announced
    /// is announced; a scope that changed since keeps its change for the next sweep. `None`
    /// if nothing changes.
    pub fn announced(&self, now: Timestamp, published: &[String]) -> Option<ServiceRecord> {
        let done = |on: Option<&str>, scope: &Scope| {
            scope.unannounced
                && scope
                    .event_key()
                    .is_some_and(|key| published.contains(&event_id(&self.service, on, &key)))
        };
        let names: Vec<Option<String>> = self
            .scopes()
            .filter(|(on, scope)| done(*on, scope))
            .map(|(on, _)| on.map(str::to_owned))
            .collect();
        if names.is_empty() && self.announcing.is_none() {
            return None;
        }
        let mut next = self.next(now);
        for on in names {
            next.scope_mut(on.as_deref()).unannounced = false;
        }
        next.announcing = None;
        Some(next)
    }

    /// The service throttled a call and asked not to be called before `until`; `cut`: the
    /// throttles came often enough to mean the calls go too fast, at that rate. The quiet is
    /// recorded if it reaches at least a second past the one recorded, and the learned rate
    /// is cut from `cut` unless it was cut within the last [`CUT_WAVE`]: a burst of throttled
    /// calls writes once. `None` if nothing changes.
    pub fn throttled(
        &self,
        now: Timestamp,
        until: Timestamp,
        cut: Option<Calling>,
    ) -> Option<ServiceRecord> {
        let known = self.quiet_until.unwrap_or(now).max(now);
        let quiet = (until >= known.plus(QUIET_STEP)).then_some(until);
        let cut = match (cut, self.learned) {
            (None, _) => None,
            (Some(_), Some(learned)) if learned.at.plus(CUT_WAVE) > now => None,
            (Some(calling), _) => Some(Learned::cut(calling, now)),
        };
        if quiet.is_none() && cut.is_none() {
            return None;
        }
        Some(ServiceRecord {
            quiet_until: quiet.or(self.quiet_until),
            learned: cut.or(self.learned),
            ..self.next(now)
        })
    }

    /// The rate learned from the service's throttling, in force at `now`.
    pub fn learned_at(&self, now: Timestamp) -> Option<u32> {
        self.learned.and_then(|learned| learned.at(now))
    }

    /// The calls a second every execution keeps to at `now`: the `declared` rate, or the one
    /// learned from the service's throttling if that is lower.
    pub fn rate_at(&self, declared: Option<u32>, now: Timestamp) -> Option<u32> {
        match (declared, self.learned_at(now)) {
            (Some(declared), Some(learned)) => Some(declared.min(learned)),
            (declared, learned) => declared.or(learned),
        }
    }

    /// Until when the service asked to be left alone, if that is after `now`.
    pub fn quiet_at(&self, now: Timestamp) -> Option<Timestamp> {
        self.quiet_until.filter(|until| *until > now)
    }
}

/// The id of the alert for `service`'s scope `on` in the state `key` names
/// ([`Scope::event_key`]): the same change always has the same id, so that a consumer can
/// tell an alert published twice.
pub fn event_id(service: &str, on: Option<&str>, key: &str) -> String {
    match on {
        None => format!("{service}-{key}"),
        Some(action) => format!("{service}-{action}-{key}"),
    }
}

/// The passing faults one execution met in a row, within the policy's window of the first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Streak {
    faults: u32,
    since: Option<Timestamp>,
}

impl Streak {
    /// Counts a fault at `now`, and returns the faults in a row: a fault after a quieter spell
    /// than the window starts the count again.
    pub fn fault(&mut self, now: Timestamp, policy: &HoldPolicy) -> u32 {
        match self.since {
            Some(first) if first.plus(policy.window) >= now => self.faults += 1,
            _ => *self = Streak { faults: 1, since: Some(now) },
        }
        self.faults
    }

    /// The faults in a row so far.
    pub fn faults(&self) -> u32 {
        self.faults
    }

    /// An answer ends the streak.
    pub fn clear(&mut self) {
        *self = Streak::default();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const T0: Timestamp = Timestamp::from_millis(1_767_225_600_000);

    fn at(s: u64) -> Timestamp {
        T0.plus(Duration::from_secs(s))
    }

    const CHARGE: &str = "charge-payment";
    const REFUND: &str = "refund-payment";

    fn held(policy: &HoldPolicy) -> ServiceRecord {
        ServiceRecord::open("payment", T0).hold(at(4), CHARGE, 5, "503", policy).unwrap()
    }

    fn announced_all(r: &ServiceRecord, now: Timestamp) -> ServiceRecord {
        let ids: Vec<String> = r
            .scopes()
            .filter_map(|(on, s)| Some(event_id(&r.service, on, &s.event_key()?)))
            .collect();
        r.announced(now, &ids).unwrap()
    }

    #[test]
    fn faults_in_a_row_within_the_window_make_a_streak_and_an_answer_ends_it() {
        let policy = HoldPolicy::default();
        let mut streak = Streak::default();
        let counts: Vec<u32> = (0..4).map(|s| streak.fault(at(s), &policy)).collect();
        assert_eq!(counts, [1, 2, 3, 4]);
        streak.clear();
        assert_eq!(streak.fault(at(5), &policy), 1);
        // Faults spread wider than the window do not add up.
        let mut streak = Streak::default();
        let counts: Vec<u32> = [0, 61, 122].iter().map(|s| streak.fault(at(*s), &policy)).collect();
        assert_eq!(counts, [1, 1, 1]);
    }

    #[test]
    fn a_hold_is_of_one_action_written_once_and_an_open_service_writes_nothing_on_an_answer() {
        let policy = HoldPolicy::default();
        let open = ServiceRecord::open("payment", T0);
        assert_eq!(
            open.answered(at(1), Some(CHARGE), false),
            None,
            "the normal path costs nothing"
        );
        let r = held(&policy);
        let hold = r.holding(CHARGE).unwrap().1.clone();
        assert_eq!((hold.since, hold.next_probe, hold.by), (at(4), at(14), None));
        assert_eq!(hold.reason, "5 passing faults in a row, the last: 503");
        assert!(r.unannounced() && r.version == 1 && r.is_held());
        assert_eq!(r.hold(at(5), CHARGE, 5, "503", &policy), None, "held already");
        // What is held is what is down: the refund, which answers, is not.
        assert_eq!(r.holding(REFUND), None);
        assert!(r.whole.held.is_none());
        let both = r.hold(at(6), REFUND, 5, "timeout", &policy).unwrap();
        assert_eq!(both.holds().count(), 2);
        assert_eq!(both.holding(REFUND).unwrap().0, Some(REFUND));
    }

    #[test]
    fn one_probe_at_a_time_tries_the_held_action_and_its_answer_ends_that_hold_alone() {
        let policy = HoldPolicy::default();
        let r = held(&policy).hold(at(6), REFUND, 5, "503", &policy).unwrap();
        let on = Some(CHARGE);
        assert_eq!(r.probe(at(13), on, &policy), None, "too early");
        let probing = r.probe(at(14), on, &policy).unwrap();
        assert_eq!(probing.holding(CHARGE).unwrap().1.next_probe, at(24));
        assert_eq!(probing.probe(at(20), on, &policy), None, "the next waits its turn");
        // An answer that is not the probe's (a call that began before the hold) ends nothing.
        assert_eq!(probing.answered(at(15), on, false), None);
        let open = probing.answered(at(15), on, true).unwrap();
        assert!(open.holding(CHARGE).is_none() && open.unannounced());
        let released = open.scope(on).unwrap().released.clone().unwrap();
        assert_eq!((released.held_since, released.at, released.by), (at(4), at(15), None));
        // The refund's hold is its own: still held, probed on its own.
        assert!(open.holding(REFUND).is_some());
        assert!(open.probe(at(16), Some(REFUND), &policy).is_some());
        let quiet = announced_all(&open, at(16));
        assert!(!quiet.unannounced());
        assert_eq!(quiet.announced(at(17), &[]), None);
    }

    #[test]
    fn a_probe_that_fails_says_why_once_per_new_fault() {
        let policy = HoldPolicy::default();
        let probing = held(&policy).probe(at(14), Some(CHARGE), &policy).unwrap();
        let failed = probing.probe_failed(at(15), Some(CHARGE), "403 Forbidden").unwrap();
        assert_eq!(failed.holding(CHARGE).unwrap().1.last_probe.as_deref(), Some("403 Forbidden"));
        assert_eq!(failed.probe_failed(at(25), Some(CHARGE), "403 Forbidden"), None);
        assert!(failed.probe_failed(at(35), Some(CHARGE), "503").is_some());
        assert_eq!(failed.probe_failed(at(35), Some(REFUND), "503"), None, "not held");
    }

    #[test]
    fn one_supervisor_at_a_time_announces_the_changes_until_its_time_runs_out() {
        let policy = HoldPolicy::default();
        let r = held(&policy);
        let taken = r.announcing(at(5), at(125)).unwrap();
        assert_eq!(taken.announcing, Some(at(125)));
        assert_eq!(taken.announcing(at(6), at(126)), None, "another supervisor announces it");
        // A probe taken meanwhile keeps the announcement under way.
        let probing = taken.probe(at(14), Some(CHARGE), &policy).unwrap();
        assert_eq!(probing.announcing, Some(at(125)));
        let done = announced_all(&probing, at(15));
        assert!(!done.unannounced() && done.announcing.is_none());
        assert_eq!(done.announcing(at(16), at(136)), None, "nothing left to announce");
        // A supervisor that died announcing leaves it to the first sweep after its time.
        assert!(taken.announcing(at(125), at(245)).is_some());
        // A new change is announced afresh, whatever was under way.
        let released = probing.answered(at(20), Some(CHARGE), true).unwrap();
        assert!(released.unannounced() && released.announcing.is_none());
        // The alert published was the hold's: the release that came since is still owed.
        let hold_id = event_id("payment", Some(CHARGE), &format!("held-{}", at(4).as_millis()));
        assert_eq!(released.announced(at(21), &[hold_id]), None, "the release is still owed");
        assert_eq!(
            released.scope(Some(CHARGE)).unwrap().event_key().unwrap(),
            format!("open-{}", at(20).as_millis())
        );
    }

    #[test]
    fn a_hold_that_lasts_past_the_threshold_is_announced_once_more() {
        let policy = HoldPolicy::default();
        let r = announced_all(&held(&policy), at(5));
        assert_eq!(r.overdue(at(300), Duration::from_secs(600)), None);
        let late = r.overdue(at(604), Duration::from_secs(600)).unwrap();
        assert!(late.unannounced() && late.holding(CHARGE).unwrap().1.overdue);
        let key = late.scope(Some(CHARGE)).unwrap().event_key().unwrap();
        assert_eq!(key, format!("held-{}-overdue", at(4).as_millis()));
        let told = announced_all(&late, at(605));
        assert_eq!(told.overdue(at(900), Duration::from_secs(600)), None, "told once");
    }

    #[test]
    fn an_operator_s_hold_takes_no_probe_and_ends_only_by_an_operator() {
        let policy = HoldPolicy::default();
        let r = ServiceRecord::open("payment", T0);
        assert_eq!(r.release_by(at(1), None, "ops", "x"), None, "nothing to release");
        let held = r.hold_by(at(1), None, "ops", "maintenance until 02:00").unwrap();
        assert_eq!(held.hold_by(at(2), None, "ops", "maintenance until 02:00"), None);
        assert_eq!(held.probe(at(100), None, &policy), None);
        assert_eq!(held.answered(at(100), None, true), None);
        // The whole service held stops every action, and the agent holds none on top.
        assert_eq!(held.holding(CHARGE).unwrap().0, None);
        assert_eq!(held.hold(at(3), CHARGE, 5, "503", &policy), None);
        let open = held.release_by(at(200), None, "ops", "done").unwrap();
        let released = open.whole.released.unwrap();
        assert_eq!((released.by.as_deref(), released.held_since), (Some("ops"), at(1)));
    }

    #[test]
    fn an_operator_holds_or_releases_one_action_and_a_release_of_the_service_frees_them_all() {
        let policy = HoldPolicy::default();
        let agent_held = held(&policy);
        let refunds = agent_held.hold_by(at(5), Some(REFUND), "ops", "refunds frozen").unwrap();
        assert_eq!(refunds.holding(REFUND).unwrap().1.by.as_deref(), Some("ops"));
        assert_eq!(refunds.probe(at(100), Some(REFUND), &policy), None);
        let charge_only = refunds.release_by(at(6), Some(REFUND), "ops", "thawed").unwrap();
        assert!(charge_only.holding(REFUND).is_none() && charge_only.holding(CHARGE).is_some());
        let all = refunds.release_by(at(7), None, "ops", "all clear").unwrap();
        assert!(!all.is_held());
        for action in [CHARGE, REFUND] {
            let scope = all.scope(Some(action)).unwrap();
            assert!(scope.unannounced);
            assert_eq!(scope.released.as_ref().unwrap().by.as_deref(), Some("ops"));
        }
    }

    #[test]
    fn a_record_written_before_holds_were_per_action_reads_as_a_hold_of_the_whole_service() {
        let old = serde_json::json!({
            "service": "payment", "version": 3, "changed_at": 5,
            "held": {"since": 1, "reason": "5 passing faults", "next_probe": 11, "probes": 2},
            "last_fault": "503", "unannounced": false
        });
        let r: ServiceRecord = serde_json::from_value(old).unwrap();
        let (on, hold) = r.holding(CHARGE).unwrap();
        assert_eq!((on, hold.by.as_ref(), hold.probes), (None, None, 2));
        assert_eq!(r.whole.last_fault.as_deref(), Some("503"));
        let back: ServiceRecord =
            serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn frequent_throttles_lower_the_rate_once_per_wave_and_write_once() {
        let open = ServiceRecord::open("payment", T0);
        assert_eq!(open.learned_at(at(0)), None);
        let lone = open.throttled(at(1), at(2), None).unwrap();
        assert_eq!((lone.quiet_until, lone.learned), (Some(at(2)), None), "a lone throttle");
        let cut = open.throttled(at(1), at(2), Some(Calling::InForce(24))).unwrap();
        assert_eq!(cut.learned, Some(Learned { per_second: 18, at: at(1), doubling: false }));
        assert_eq!(cut.quiet_until, Some(at(2)));
        // The same wave's throttles (calls made at the rate before) neither cut nor write.
        assert_eq!(cut.throttled(at(1), at(2), Some(Calling::InForce(18))), None);
        let t = at(1).plus(CUT_WAVE).minus(Duration::from_millis(1));
        let later = t.plus(Duration::from_secs(5));
        let quieter = cut.throttled(t, later, Some(Calling::InForce(18))).unwrap();
        assert_eq!(quieter.learned, cut.learned, "a longer quiet is written, the rate kept");
        // After the wave, throttles at the lower rate cut again, down to one at least.
        let again = cut.throttled(at(4), at(5), Some(Calling::InForce(18))).unwrap();
        assert_eq!(again.learned, Some(Learned { per_second: 13, at: at(4), doubling: false }));
        let floor = again.throttled(at(10), at(11), Some(Calling::InForce(1))).unwrap();
        assert_eq!(floor.learned_at(at(10)), Some(1));
        // Cut to half a rate only counted, it doubles until the next throttle.
        let counted = open.throttled(at(1), at(2), Some(Calling::Counted(4))).unwrap();
        let rates: Vec<_> = [1, 11, 21, 31].iter().map(|s| counted.learned_at(at(*s))).collect();
        assert_eq!(rates, [Some(2), Some(4), Some(8), Some(16)]);
    }

    #[test]
    fn a_learned_rate_rises_while_the_service_throttles_no_more_and_is_then_forgotten() {
        let slow = Learned { per_second: 3, at: T0, doubling: false };
        let rates: Vec<Option<u32>> = [0, 9, 10, 25, 60].iter().map(|s| slow.at(at(*s))).collect();
        assert_eq!(rates, [Some(3), Some(3), Some(4), Some(5), Some(9)]);
        // A fast service rises by an eighth of its cut rate at each step: 100 to 196 in 80 s.
        let fast = Learned { per_second: 100, at: T0, doubling: false };
        assert_eq!(fast.at(at(80)), Some(196));
        let fastest = Learned { per_second: 400, at: T0, doubling: true };
        assert_eq!(fastest.at(at(290)), Some(MAX_RATE), "never above the highest rate");
        assert_eq!(slow.at(T0.plus(FORGET_AFTER)), None);
    }
}
