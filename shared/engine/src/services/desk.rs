//! The operators' desk for the services: what each deployed service's state is (open, held by
//! its agent and probed, or held by an operator), how many orders wait for it, what it is
//! declared to accept, the rate learned from its throttling and what it uses of those now, and
//! the hold and release an operator gives by hand (a maintenance window), recorded with who
//! and why.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::health::{Release, ServiceRecord};
use crate::ids::AgentName;
use crate::pace::{Limits, Usage};
use crate::ports::{Clock, HeldIndex, Pace, Saved, ServiceBook};
use crate::time::Timestamp;

/// One service as operators see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ServiceView {
    pub service: String,
    /// `open` or `held`.
    pub state: &'static str,
    /// Held by its agent: one call goes to it now and then as a probe, and the first answered
    /// opens it. An operator's hold is not probed.
    pub probing: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_since: Option<Timestamp>,
    /// Who held it (`None`: its agent) and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Probes sent during this hold, and when the next may go.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_probe: Option<Timestamp>,
    /// The passing fault that made its agent's last hold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_fault: Option<String>,
    /// How its last hold ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub released: Option<Release>,
    /// Orders waiting for it.
    pub waiting: u64,
    /// What it is declared to accept (calls a second, calls in flight).
    pub limits: Limits,
    /// The calls a second its agent learned from its throttling and keeps to while that is
    /// below the declared rate; absent once forgotten.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub learned_per_second: Option<u32>,
    /// What it uses of its limits now; only for a service with a declared or learned limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_use: Option<Usage>,
    /// Until when it asked to be left alone (a throttled call's `Retry-After`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quiet_until: Option<Timestamp>,
}

impl ServiceView {
    fn of(record: &ServiceRecord, waiting: u64, now: Timestamp) -> ServiceView {
        let hold = record.held.as_ref();
        ServiceView {
            service: record.service.clone(),
            state: if hold.is_some() { "held" } else { "open" },
            probing: hold.is_some_and(|h| h.by.is_none()),
            held_since: hold.map(|h| h.since),
            held_by: hold.and_then(|h| h.by.clone()),
            reason: hold.map(|h| h.reason.clone()),
            probes: hold.map(|h| h.probes),
            next_probe: hold.filter(|h| h.by.is_none()).map(|h| h.next_probe),
            last_fault: record.last_fault.clone(),
            released: record.released.clone(),
            waiting,
            limits: Limits::NONE,
            learned_per_second: record.learned_at(now),
            in_use: None,
            quiet_until: record.quiet_at(now),
        }
    }
}

/// Why an operator's hold or release changed nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeskRefusal {
    #[error("no agent {service:?} is deployed: one of {deployed}")]
    Unknown { service: String, deployed: String },
    #[error("{service} is open: there is no hold to release")]
    NotHeld { service: String },
    #[error("{service} is already held by {by}, for the same reason")]
    AlreadyHeld { service: String, by: String },
}

impl DeskRefusal {
    /// A stable name for the refusal.
    pub fn code(&self) -> &'static str {
        match self {
            DeskRefusal::Unknown { .. } => "unknown_service",
            DeskRefusal::NotHeld { .. } => "not_held",
            DeskRefusal::AlreadyHeld { .. } => "already_held",
        }
    }
}

/// The desk, over the services' book and the index of orders waiting for them.
#[derive(Debug)]
pub struct ServiceDesk<G, X, C> {
    pub book: G,
    pub index: X,
    pub clock: C,
    /// The deployed agents: the services there are.
    pub agents: Vec<AgentName>,
    /// What each limited service is declared to accept, by agent.
    pub limits: BTreeMap<String, Limits>,
}

impl<G: ServiceBook + Pace, X: HeldIndex, C: Clock> ServiceDesk<G, X, C> {
    /// Every deployed service, in the order of the agents.
    pub async fn list(&self) -> Result<Vec<ServiceView>> {
        let records = self.book.all().await?;
        let mut views = Vec::with_capacity(self.agents.len());
        for agent in &self.agents {
            let record = records
                .iter()
                .find(|r| r.service == agent.as_str())
                .cloned()
                .unwrap_or_else(|| ServiceRecord::open(agent.as_str(), self.clock.now()));
            let waiting = self.index.count_held(agent.as_str()).await?;
            views.push(self.view(&record, waiting).await?);
        }
        Ok(views)
    }

    /// Holds `service` by hand: its agent calls it no more (no probe either) until an operator
    /// releases it; the orders that reach it wait, and the supervisor announces the hold.
    pub async fn hold(
        &self,
        service: &str,
        by: &str,
        reason: &str,
    ) -> Result<std::result::Result<ServiceView, DeskRefusal>> {
        self.change(service, |r, now| match r.hold_by(now, by, reason) {
            Some(next) => Ok(next),
            None => Err(DeskRefusal::AlreadyHeld { service: service.into(), by: by.into() }),
        })
        .await
    }

    /// Releases `service`, whoever held it: the supervisor resumes the orders that waited.
    pub async fn release(
        &self,
        service: &str,
        by: &str,
        reason: &str,
    ) -> Result<std::result::Result<ServiceView, DeskRefusal>> {
        self.change(service, |r, now| {
            r.release_by(now, by, reason).ok_or(DeskRefusal::NotHeld { service: service.into() })
        })
        .await
    }

    async fn view(&self, record: &ServiceRecord, waiting: u64) -> Result<ServiceView> {
        let now = self.clock.now();
        let mut view = ServiceView::of(record, waiting, now);
        let limits = self.limits.get(&record.service).copied().unwrap_or(Limits::NONE);
        view.limits = limits;
        if !limits.is_none() || view.learned_per_second.is_some() {
            view.in_use = Some(self.book.usage(&record.service, now).await?);
        }
        Ok(view)
    }

    async fn change(
        &self,
        service: &str,
        change: impl Fn(&ServiceRecord, Timestamp) -> std::result::Result<ServiceRecord, DeskRefusal>,
    ) -> Result<std::result::Result<ServiceView, DeskRefusal>> {
        if !self.agents.iter().any(|a| a.as_str() == service) {
            let deployed: Vec<&str> = self.agents.iter().map(AgentName::as_str).collect();
            return Ok(Err(DeskRefusal::Unknown {
                service: service.to_owned(),
                deployed: deployed.join(", "),
            }));
        }
        // An agent may write between the read and the write: read again and retry a few times.
        for _ in 0..5 {
            let now = self.clock.now();
            let record = match self.book.load(service).await? {
                Some(record) => record,
                None => ServiceRecord::open(service, now),
            };
            let next = match change(&record, now) {
                Ok(next) => next,
                Err(refused) => return Ok(Err(refused)),
            };
            if self.book.save(&next).await? == Saved::Saved {
                let waiting = self.index.count_held(service).await?;
                return Ok(Ok(self.view(&next, waiting).await?));
            }
        }
        Err(Error::unavailable("services", format!("{service}: its record kept changing")))
    }
}
