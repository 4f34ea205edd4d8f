//! The operators' desk for the services: what each deployed service's state is (open, or its
//! holds: of the whole service or of one action, by its agent and probed, or by an operator,
//! and what the probes last met), how many orders wait for each, what it is declared to
//! accept, the rate learned from its throttling and what it uses of those now, and the hold
//! and release an operator gives by hand (a maintenance window, of the service or of one
//! action), recorded with who and why.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::error::{Error, Result};
use crate::health::{Release, Scope, ServiceRecord, hold_key};
use crate::ids::AgentName;
use crate::pace::{Limits, Usage};
use crate::ports::{Clock, HeldIndex, Pace, Saved, ServiceBook};
use crate::time::Timestamp;

/// One service as operators see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ServiceView {
    pub service: String,
    /// `open`; `held`: the whole service; or `actions_held`: some of its actions.
    pub state: &'static str,
    /// What of it was ever held, the whole service first, then each action by name: held
    /// now, or how its last hold ended.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub holds: Vec<HoldView>,
    /// Orders waiting for it, whatever holds them.
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

/// A hold of a service, or of one of its actions, as operators see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HoldView {
    /// The action; absent: the whole service.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// `open` or `held`.
    pub state: &'static str,
    /// Held by its agent: one call of it goes now and then as a probe, and the first answered
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
    /// What the probes last met: why the hold goes on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_probe: Option<String>,
    /// The passing fault that made its agent's last hold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_fault: Option<String>,
    /// How its last hold ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub released: Option<Release>,
    /// Orders waiting for it.
    pub waiting: u64,
}

impl HoldView {
    fn of(on: Option<&str>, scope: &Scope, waiting: u64) -> HoldView {
        let hold = scope.held.as_ref();
        HoldView {
            action: on.map(str::to_owned),
            state: if hold.is_some() { "held" } else { "open" },
            probing: hold.is_some_and(|h| h.by.is_none()),
            held_since: hold.map(|h| h.since),
            held_by: hold.and_then(|h| h.by.clone()),
            reason: hold.map(|h| h.reason.clone()),
            probes: hold.map(|h| h.probes),
            next_probe: hold.filter(|h| h.by.is_none()).map(|h| h.next_probe),
            last_probe: hold.and_then(|h| h.last_probe.clone()),
            last_fault: scope.last_fault.clone(),
            released: scope.released.clone(),
            waiting,
        }
    }
}

impl ServiceView {
    fn of(record: &ServiceRecord, holds: Vec<HoldView>, now: Timestamp) -> ServiceView {
        let state = match (record.whole.held.is_some(), record.is_held()) {
            (true, _) => "held",
            (false, true) => "actions_held",
            (false, false) => "open",
        };
        ServiceView {
            service: record.service.clone(),
            state,
            waiting: holds.iter().map(|h| h.waiting).sum(),
            holds,
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
    #[error("no workflow asks {service} for {action:?}: one of {known}")]
    UnknownAction { service: String, action: String, known: String },
    #[error("{held} is open: there is no hold to release")]
    NotHeld { held: String },
    #[error("{held} is already held by {by}, for the same reason")]
    AlreadyHeld { held: String, by: String },
}

impl DeskRefusal {
    /// A stable name for the refusal.
    pub fn code(&self) -> &'static str {
        match self {
            DeskRefusal::Unknown { .. } => "unknown_service",
            DeskRefusal::UnknownAction { .. } => "unknown_action",
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
    /// The actions the workflows ask of each agent ([`crate::catalogue::Catalogue::actions`]):
    /// what of its service an operator may hold alone.
    pub actions: BTreeMap<String, BTreeSet<String>>,
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
            views.push(self.view(&record).await?);
        }
        Ok(views)
    }

    /// Holds `service` by hand, or only its `action`: its agent calls it no more (no probe
    /// either) until an operator releases it; the orders that reach it wait, and the
    /// supervisor announces the hold.
    pub async fn hold(
        &self,
        service: &str,
        action: Option<&str>,
        by: &str,
        reason: &str,
    ) -> Result<std::result::Result<ServiceView, DeskRefusal>> {
        let held = hold_key(service, action);
        self.change(service, action, |r, now| match r.hold_by(now, action, by, reason) {
            Some(next) => Ok(next),
            None => Err(DeskRefusal::AlreadyHeld { held: held.clone(), by: by.into() }),
        })
        .await
    }

    /// Releases `service`, whoever held it, with every action held (or only its `action`):
    /// the supervisor resumes the orders that waited.
    pub async fn release(
        &self,
        service: &str,
        action: Option<&str>,
        by: &str,
        reason: &str,
    ) -> Result<std::result::Result<ServiceView, DeskRefusal>> {
        let held = hold_key(service, action);
        self.change(service, action, |r, now| {
            r.release_by(now, action, by, reason).ok_or(DeskRefusal::NotHeld { held: held.clone() })
        })
        .await
    }

    async fn view(&self, record: &ServiceRecord) -> Result<ServiceView> {
        let now = self.clock.now();
        let mut holds = Vec::new();
        for (on, scope) in record.scopes() {
            let waiting = self.index.count_held(&hold_key(&record.service, on)).await?;
            if scope.held.is_some() || scope.released.is_some() || waiting > 0 {
                holds.push(HoldView::of(on, scope, waiting));
            }
        }
        let mut view = ServiceView::of(record, holds, now);
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
        action: Option<&str>,
        change: impl Fn(&ServiceRecord, Timestamp) -> std::result::Result<ServiceRecord, DeskRefusal>,
    ) -> Result<std::result::Result<ServiceView, DeskRefusal>> {
        if !self.agents.iter().any(|a| a.as_str() == service) {
            let deployed: Vec<&str> = self.agents.iter().map(AgentName::as_str).collect();
            return Ok(Err(DeskRefusal::Unknown {
                service: service.to_owned(),
                deployed: deployed.join(", "),
            }));
        }
        let known = self.actions.get(service);
        if let Some(action) = action
            && !known.is_some_and(|k| k.contains(action))
        {
            let known: Vec<&str> =
                known.iter().flat_map(|k| k.iter()).map(String::as_str).collect();
            return Ok(Err(DeskRefusal::UnknownAction {
                service: service.to_owned(),
                action: action.to_owned(),
                known: known.join(", "),
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
                return Ok(Ok(self.view(&next).await?));
            }
        }
        Err(Error::unavailable("services", format!("{service}: its record kept changing")))
    }
}
