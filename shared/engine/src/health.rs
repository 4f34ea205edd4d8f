//! A service's health: open, or held (by its agent after passing faults in a row, or by an
//! operator for a maintenance window), with one probe at a time while its agent holds it.
//!
//! There is one [`ServiceRecord`] per service (one agent, one service), whatever the number of
//! orders and of the agent's executions. Each method here is pure: it returns the record to
//! write, or `None` when nothing changes, and every write is conditional on the version that
//! was read ([`ServiceBook::save`](crate::ports::ServiceBook::save)). The normal path writes
//! nothing: a call that succeeds on an open service with no faults counted leaves the record
//! alone.

use serde::{Deserialize, Serialize};

use crate::config::HoldPolicy;
use crate::message::{MAX_REASON_LEN, truncate};
use crate::time::Timestamp;

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
    /// Passing faults in a row while open, and when the first of them came.
    #[serde(default)]
    pub faults: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub faults_since: Option<Timestamp>,
    /// The last passing fault seen, for operators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fault: Option<String>,
    /// How the last hold ended, for operators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<Release>,
    /// The last hold or release is not yet announced to the operators: the supervisor
    /// publishes one alert for it, then clears this.
    #[serde(default)]
    pub unannounced: bool,
    pub changed_at: Timestamp,
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
}

impl ServiceRecord {
    /// A service nothing is known of yet: open.
    pub fn open(service: &str, now: Timestamp) -> ServiceRecord {
        ServiceRecord {
            service: service.to_owned(),
            version: 0,
            held: None,
            faults: 0,
            faults_since: None,
            last_fault: None,
            released: None,
            unannounced: false,
            changed_at: now,
        }
    }

    fn next(&self, now: Timestamp) -> ServiceRecord {
        ServiceRecord { version: self.version + 1, changed_at: now, ..self.clone() }
    }

    /// A passing fault of a call to the open service: counted, and the service held once the
    /// faults in a row reach the policy's count within its window. A fault of a probe, or of
    /// a call that started before the hold, changes nothing.
    pub fn fault(
        &self,
        now: Timestamp,
        reason: &str,
        policy: &HoldPolicy,
    ) -> Option<ServiceRecord> {
        if self.held.is_some() {
            return None;
        }
        let mut next = self.next(now);
        let fresh = self.faults_since.is_none_or(|t| t.plus(policy.window) < now);
        if fresh {
            next.faults = 1;
            next.faults_since = Some(now);
        } else {
            next.faults += 1;
        }
        next.last_fault = Some(truncate(reason, MAX_REASON_LEN));
        if next.faults >= policy.after_failures {
            let reason = format!("{} passing faults in a row, the last: {reason}", next.faults);
            next.held = Some(Hold {
                since: now,
                reason: truncate(&reason, MAX_REASON_LEN),
                by: None,
                next_probe: now.plus(policy.probe_every),
                probes: 0,
            });
            next.faults = 0;
            next.faults_since = None;
            next.unannounced = true;
        }
        Some(next)
    }

    /// A call that got an answer (done, or refused for good: either way the service works).
    /// On an open service with no fault counted, nothing is written; a probe's success ends
    /// its agent's hold.
    pub fn answered(&self, now: Timestamp, probe: bool) -> Option<ServiceRecord> {
        match &self.held {
            None if self.faults == 0 => None,
            None => {
                let mut next = self.next(now);
                next.faults = 0;
                next.faults_since = None;
                Some(next)
            }
            Some(hold) if hold.by.is_none() && probe => {
                let mut next = self.next(now);
                next.released = Some(Release {
                    at: now,
                    held_since: hold.since,
                    by: None,
                    reason: String::new(),
                });
                next.held = None;
                next.unannounced = true;
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
        let mut next = self.next(now);
        let since = self.held.as_ref().map_or(now, |h| h.since);
        next.held = Some(Hold {
            since,
            reason: truncate(reason, MAX_REASON_LEN),
            by: Some(by.to_owned()),
            next_probe: now,
            probes: self.held.as_ref().map_or(0, |h| h.probes),
        });
        next.faults = 0;
        next.faults_since = None;
        next.unannounced = true;
        Some(next)
    }

    /// An operator releases the service, whoever held it. `None` if it is open.
    pub fn release_by(&self, now: Timestamp, by: &str, reason: &str) -> Option<ServiceRecord> {
        let hold = self.held.as_ref()?;
        let mut next = self.next(now);
        next.released = Some(Release {
            at: now,
            held_since: hold.since,
            by: Some(by.to_owned()),
            reason: truncate(reason, MAX_REASON_LEN),
        });
        next.held = None;
        next.unannounced = true;
        Some(next)
    }

    /// The hold or release was announced.
    pub fn announced(&self, now: Timestamp) -> Option<ServiceRecord> {
        self.unannounced.then(|| ServiceRecord { unannounced: false, ..self.next(now) })
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

    #[test]
    fn faults_in_a_row_within_the_window_hold_the_service_and_an_answer_starts_the_count_again() {
        let policy = HoldPolicy::default();
        let mut r = ServiceRecord::open("payment", T0);
        for s in 0..4 {
            r = r.fault(at(s), "503", &policy).unwrap();
            assert!(r.held.is_none());
        }
        let answered = r.answered(at(4), false).unwrap();
        assert_eq!((answered.faults, answered.version), (0, 5));
        // Nothing to write once the count is clear: the normal path costs nothing.
        assert_eq!(answered.answered(at(5), false), None);

        // Faults spread wider than the window do not add up.
        let mut r = ServiceRecord::open("payment", T0);
        for s in [0, 61, 122, 183, 244] {
            r = r.fault(at(s), "503", &policy).unwrap();
        }
        assert_eq!((r.faults, r.held.is_none()), (1, true));

        let mut r = ServiceRecord::open("payment", T0);
        for s in 0..5 {
            r = r.fault(at(s), "503 Service Unavailable", &policy).unwrap();
        }
        let hold = r.held.clone().unwrap();
        assert_eq!((hold.since, hold.next_probe, hold.by), (at(4), at(14), None));
        assert_eq!(hold.reason, "5 passing faults in a row, the last: 503 Service Unavailable");
        assert!(r.unannounced);
        assert_eq!(r.fault(at(5), "503", &policy), None, "a fault while held changes nothing");
    }

    #[test]
    fn one_probe_at_a_time_goes_to_a_held_service_and_its_success_ends_the_hold() {
        let policy = HoldPolicy::default();
        let mut r = ServiceRecord::open("payment", T0);
        for s in 0..5 {
            r = r.fault(at(s), "503", &policy).unwrap();
        }
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
