//! An agent's guard on its service: before each call it asks whether the service is open, and
//! after it tells what came of the call, so that the agent holds the service after passing
//! faults in a row and, while it is held, sends it nothing but one probe at a time.
//!
//! The guard reads the service's record at most once a second per execution (the decision to
//! stop calling may lag that much behind another execution's hold, which costs a few calls at
//! most), and writes it only when something changes: a hold, a probe taken, a hold ended. It
//! counts the faults it meets in a row itself, so that faults that pass cost no write, and
//! holds the service for every execution once its count reaches the policy's. Should the record be unreadable, the guard lets calls through: the state of its
//! bookkeeping must never be what stops a working service from being called.

use std::sync::Mutex;
use std::time::Duration;

use tracing::{info, warn};

use crate::config::HoldPolicy;
use crate::health::{ServiceRecord, Streak};
use crate::ports::{Clock, Saved, ServiceBook};
use crate::time::Timestamp;

/// How long a record read stays good enough to decide on.
pub const FRESH: Duration = Duration::from_secs(1);

/// What the guard says of the next call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// The service is open: call it.
    Call,
    /// The service is held, and this call is its probe.
    Probe,
    /// The service is held: do not call it.
    Held { reason: String },
}

/// The book of an agent that keeps no guard: it knows no service and writes nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoBook;

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
    seen: Mutex<Option<(Timestamp, ServiceRecord)>>,
    streak: Mutex<Streak>,
}

impl<G: ServiceBook, C: Clock> Guard<G, C> {
    /// The guard of `service`, keeping its record in `book`.
    pub fn new(book: G, clock: C, service: &str, policy: HoldPolicy) -> Self {
        Guard {
            book,
            clock,
            service: service.to_owned(),
            policy,
            seen: Mutex::new(None),
            streak: Mutex::new(Streak::default()),
        }
    }

    /// Whether to call the service now.
    pub async fn admit(&self) -> Admission {
        let record = self.current().await;
        let Some(hold) = &record.held else { return Admission::Call };
        let now = self.clock.now();
        if let Some(next) = record.probe(now, &self.policy)
            && self.write(next).await
        {
            info!(service = %self.service, "probing the held service");
            return Admission::Probe;
        }
        Admission::Held { reason: hold.reason.clone() }
    }

    /// The call got an answer (done or refused): the service works.
    pub async fn answered(&self, probe: bool) {
        self.streak.lock().unwrap_or_else(|e| e.into_inner()).clear();
        if !probe {
            return;
        }
        let now = self.clock.now();
        if self.change(|r| r.answered(now, true)).await {
            info!(service = %self.service, "the probe was answered: the service is open again");
        }
    }

    /// The call met a passing fault. Returns whether the service is now held.
    pub async fn fault(&self, reason: &str) -> bool {
        let now = self.clock.now();
        let policy = self.policy;
        let faults = self.streak.lock().unwrap_or_else(|e| e.into_inner()).fault(now, &policy);
        if faults >= policy.after_failures {
            self.change(|r| r.hold(now, faults, reason, &policy)).await;
        }
        let held = self.current().await.held.is_some();
        if held {
            warn!(service = %self.service, %reason, "the service is held");
        }
        held
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
