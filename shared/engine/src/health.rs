//! A service's health: open, or held (by its agent after passing faults in a row, or by an
//! operator for a maintenance window), with one probe at a time while its agent holds it.
//!
//! There is one [`ServiceRecord`] per service (one agent, one service), whatever the number of
//! orders and of the agent's executions. Each method here is pure: it returns the record to
//! write, or `None` when nothing changes, and every write is conditional on the version that
//! was read ([`ServiceBook::save`](crate::ports::ServiceBook::save)). Each execution counts
//! the faults it meets in a row itself ([`Streak`]) and writes only the hold they make: the
//! normal path, faults that pass included, writes nothing.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::HoldPolicy;
use crate::message::{MAX_REASON_LEN, truncate};
use crate::pace::MAX_RATE;
use crate::time::Timestamp;

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
    /// Set while the service is held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<Hold>,
    /// The passing fault that made the agent's last hold, for operators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fault: Option<String>,
    /// How the last hold ended, for operators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<Release>,
    /// The last hold or release is not yet announced to the operators: the supervisor
    /// publishes one alert for it, then clears this.
    #[serde(default)]
    pub unannounced: bool,
    /// A supervisor is announcing the last change, and no other does before this time: it
    /// records this before it publishes, so that two supervisors tending at once publish one
    /// alert, and one that dies before it records the alert sent leaves it to the first sweep
    /// after this.
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

/// A hold on a service.
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
}

/// How a hold ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Release {
    pub at: Timestamp,
    /// Since when the service had been held.
    pub held_since: Timestamp,
    /// The operator who released it; `None`: a probe succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Probes sent during the hold: the only calls that reached the service while it was
    /// held.
    #[serde(default)]
    pub probes: u64,
}

impl ServiceRecord {
    /// A service nothing is known of yet: open.
    pub fn open(service: &str, now: Timestamp) -> ServiceRecord {
        ServiceRecord {
            service: service.to_owned(),
            version: 0,
            held: None,
            last_fault: None,
            released: None,
            unannounced: false,
            announcing: None,
            quiet_until: None,
            learned: None,
            changed_at: now,
        }
    }

    fn next(&self, now: Timestamp) -> ServiceRecord {
        ServiceRecord { version: self.version + 1, changed_at: now, ..self.clone() }
    }

    /// The next record, with a change (a hold or a release) to announce: whatever announcement
    /// was under way was for the change before.
    fn changed(&self, now: Timestamp) -> ServiceRecord {
        ServiceRecord { unannounced: true, announcing: None, ..self.next(now) }
    }

    /// The agent holds the open service after `faults` passing faults in a row, the last for
    /// `reason`. `None` if it is held already.
    pub fn hold(
        &self,
        now: Timestamp,
        faults: u32,
        reason: &str,
        policy: &HoldPolicy,
    ) -> Option<ServiceRecord> {
        if self.held.is_some() {
            return None;
        }
        let mut next = self.changed(now);
        next.last_fault = Some(truncate(reason, MAX_REASON_LEN));
        let reason = format!("{faults} passing faults in a row, the last: {reason}");
        next.held = Some(Hold {
            since: now,
            reason: truncate(&reason, MAX_REASON_LEN),
            by: None,
            next_probe: now.plus(policy.probe_every),
            probes: 0,
        });
        Some(next)
    }

    /// A call that got an answer (done, or refused for good: either way the service works).
    /// A probe's answer ends its agent's hold; any other changes nothing.
    pub fn answered(&self, now: Timestamp, probe: bool) -> Option<ServiceRecord> {
        match &self.held {
            None => None,
            Some(hold) if hold.by.is_none() && probe => {
                let mut next = self.changed(now);
                next.released = Some(Release {
                    at: now,
                    held_since: hold.since,
                    by: None,
                    reason: String::new(),
                    probes: hold.probes,
                });
                next.held = None;
                Some(next)
            }
            Some(_) => None,
        }
    }

    /// The next probe of a service its agent holds, taken by whoever writes this first: `None`
    /// if the service is open, held by an operator, or probed too recently.
    pub fn probe(&self, now: Timestamp, policy: &HoldPolicy) -> Option<ServiceRecord> {
        let hold = self.held.as_ref()?;
        if hold.by.is_some() || hold.next_probe > now {
            return None;
        }
        let mut next = self.next(now);
        let held = next.held.as_mut()?;
        held.next_probe = now.plus(policy.probe_every);
        held.probes += 1;
        Some(next)
    }

    /// An operator holds the service (a maintenance window): its agent calls it no more, and
    /// no probe goes, until an operator releases it. An agent's hold becomes the operator's.
    pub fn hold_by(&self, now: Timestamp, by: &str, reason: &str) -> Option<ServiceRecord> {
        if self.held.as_ref().is_some_and(|h| h.by.as_deref() == Some(by) && h.reason == reason) {
            return None;
        }
        let mut next = self.changed(now);
        let since = self.held.as_ref().map_or(now, |h| h.since);
        next.held = Some(Hold {
            since,
            reason: truncate(reason, MAX_REASON_LEN),
            by: Some(by.to_owned()),
            next_probe: now,
            probes: self.held.as_ref().map_or(0, |h| h.probes),
        });
        Some(next)
    }

    /// An operator releases the service, whoever held it. `None` if it is open.
    pub fn release_by(&self, now: Timestamp, by: &str, reason: &str) -> Option<ServiceRecord> {
        let hold = self.held.as_ref()?;
        let mut next = self.changed(now);
        next.released = Some(Release {
            at: now,
            held_since: hold.since,
            by: Some(by.to_owned()),
            reason: truncate(reason, MAX_REASON_LEN),
            probes: hold.probes,
        });
        next.held = None;
        Some(next)
    }

    /// A supervisor takes the announcement of the last change until `until`. `None` if there
    /// is nothing to announce, or another supervisor is announcing it and its time has not
    /// run out.
    pub fn announcing(&self, now: Timestamp, until: Timestamp) -> Option<ServiceRecord> {
        if !self.unannounced || self.announcing.is_some_and(|t| t > now) {
            return None;
        }
        Some(ServiceRecord { announcing: Some(until), ..self.next(now) })
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

    /// The hold or release was announced.
    pub fn announced(&self, now: Timestamp) -> Option<ServiceRecord> {
        self.unannounced.then(|| ServiceRecord {
            unannounced: false,
            announcing: None,
            ..self.next(now)
        })
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

    fn held(policy: &HoldPolicy) -> ServiceRecord {
        ServiceRecord::open("payment", T0).hold(at(4), 5, "503", policy).unwrap()
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
    fn a_hold_is_written_once_and_an_open_service_writes_nothing_on_an_answer() {
        let policy = HoldPolicy::default();
        let open = ServiceRecord::open("payment", T0);
        assert_eq!(open.answered(at(1), false), None, "the normal path costs nothing");
        let r = held(&policy);
        let hold = r.held.clone().unwrap();
        assert_eq!((hold.since, hold.next_probe, hold.by), (at(4), at(14), None));
        assert_eq!(hold.reason, "5 passing faults in a row, the last: 503");
        assert!(r.unannounced && r.version == 1);
        assert_eq!(r.hold(at(5), 5, "503", &policy), None, "held already");
    }

    #[test]
    fn one_probe_at_a_time_goes_to_a_held_service_and_its_success_ends_the_hold() {
        let policy = HoldPolicy::default();
        let r = held(&policy);
        assert_eq!(r.probe(at(13), &policy), None, "too early");
        let probing = r.probe(at(14), &policy).unwrap();
        assert_eq!(probing.held.as_ref().unwrap().next_probe, at(24));
        assert_eq!(probing.probe(at(20), &policy), None, "the next waits its turn");
        // An answer that is not the probe's (a call that began before the hold) ends nothing.
        assert_eq!(probing.answered(at(15), false), None);
        let open = probing.answered(at(15), true).unwrap();
        assert!(open.held.is_none() && open.unannounced);
        let released = open.released.clone().unwrap();
        assert_eq!((released.held_since, released.at, released.by), (at(4), at(15), None));
        let quiet = open.announced(at(16)).unwrap();
        assert!(!quiet.unannounced);
        assert_eq!(quiet.announced(at(17)), None);
    }

    #[test]
    fn one_supervisor_at_a_time_announces_a_change_until_its_time_runs_out() {
        let policy = HoldPolicy::default();
        let r = held(&policy);
        let taken = r.announcing(at(5), at(125)).unwrap();
        assert_eq!(taken.announcing, Some(at(125)));
        assert_eq!(taken.announcing(at(6), at(126)), None, "another supervisor announces it");
        // A probe taken meanwhile keeps the announcement under way.
        let probing = taken.probe(at(14), &policy).unwrap();
        assert_eq!(probing.announcing, Some(at(125)));
        let done = probing.announced(at(15)).unwrap();
        assert!(!done.unannounced && done.announcing.is_none());
        assert_eq!(done.announcing(at(16), at(136)), None, "nothing left to announce");
        // A supervisor that died announcing leaves it to the first sweep after its time.
        assert!(taken.announcing(at(125), at(245)).is_some());
        // A new change is announced afresh, whatever was under way.
        let released = probing.answered(at(20), true).unwrap();
        assert!(released.unannounced && released.announcing.is_none());
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

    #[test]
    fn an_operator_s_hold_takes_no_probe_and_ends_only_by_an_operator() {
        let policy = HoldPolicy::default();
        let r = ServiceRecord::open("payment", T0);
        assert_eq!(r.release_by(at(1), "ops", "x"), None, "nothing to release");
        let held = r.hold_by(at(1), "ops", "maintenance until 02:00").unwrap();
        assert_eq!(held.hold_by(at(2), "ops", "maintenance until 02:00"), None);
        assert_eq!(held.probe(at(100), &policy), None);
        assert_eq!(held.answered(at(100), true), None);
        let open = held.release_by(at(200), "ops", "done").unwrap();
        let released = open.released.unwrap();
        assert_eq!((released.by.as_deref(), released.held_since), (Some("ops"), at(1)));
    }
}
