//! Orders started without a client: by an event that matches a pattern a workflow declares,
//! or at the times of a schedule it declares. Each order is keyed by what started it (the
//! event's id, the schedule's time), and goes through the submission as a client's would, so
//! that a start delivered or looked at twice finds the order it made. Their owner is
//! [`Owner::starts`], whose keys no client's can meet.
//!
//! A schedule's times are looked at by every sweep of the supervisor whose window holds them,
//! so that a late or failed sweep loses none; a time this starter already started is skipped
//! without a call for as long as the process lives.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::Value;
use tracing::{info, warn};

use super::effects::Ports;
use super::submission::{Accepted, Submission};
use crate::error::{Error, Result};
use crate::ids::Owner;
use crate::load::{LoadSource, Unmetered};
use crate::ports::{Clock, EventBus, Ids, Outbox, Payloads, StateStore};
use crate::starts::{Declared, Start, event_key, schedule_key};
use crate::time::Timestamp;

/// How one start went.
#[derive(Clone, Debug, PartialEq)]
pub struct Started {
    pub workflow: String,
    pub key: String,
    /// The order (new, or the one the key made before), or why its input was refused: a start
    /// that can never make an order is reported, not tried again.
    pub outcome: std::result::Result<Accepted, String>,
}

/// Starts orders for the starts the workflows declare.
#[derive(Debug)]
pub struct Starter<S, Q, B, C, I, L, P> {
    submission: Submission<S, Q, B, C, I, L, P>,
    starts: Vec<Declared>,
    /// The keys of the schedules' times this process started (or saw refused), by time.
    started: Mutex<HashMap<String, Timestamp>>,
}

impl<S, Q, B, C, I, P> Starter<S, Q, B, C, I, Unmetered, P> {
    /// A starter of the starts `ports`' catalogue declares, through a submission without a
    /// door ([`Unmetered`]): nobody could be told to bring an event or a schedule's time back
    /// later, and the queue an event came through holds it while the system is busy.
    pub fn unmetered(ports: Ports<S, Q, B, C, P>, ids: I) -> Self {
        let starts = ports.catalogue.starts();
        Starter {
            submission: Submission::new(ports, ids, Unmetered),
            starts,
            started: Mutex::default(),
        }
    }
}

impl<S, Q, B, C, I, L, P> Starter<S, Q, B, C, I, L, P>
where
    S: StateStore,
    Q: Outbox,
    B: EventBus,
    C: Clock,
    I: Ids,
    L: LoadSource,
    P: Payloads,
{
    pub fn new(submission: Submission<S, Q, B, C, I, L, P>, starts: Vec<Declared>) -> Self {
        Starter { submission, starts, started: Mutex::default() }
    }

    /// An event from the bus: an order of each workflow one of whose patterns it matches (one
    /// per workflow), keyed by the event's id. An error is a passing one (the store, the
    /// door): the event is to be delivered again, and makes no order twice.
    pub async fn on_event(&self, event: &Value) -> Result<Vec<Started>> {
        let Some(id) = event.get("id").and_then(Value::as_str) else {
            return Err(Error::InvalidMessage("an event without its id".into()));
        };
        let mut started = Vec::new();
        for declared in &self.starts {
            let Start::Event { pattern, input } = &declared.start else { continue };
            let done = started.iter().any(|s: &Started| s.workflow == declared.workflow);
            if done || !pattern.matches(event) {
                continue;
            }
            let key = event_key(&declared.workflow, id);
            let body = event.pointer(input).cloned().unwrap_or(Value::Null);
            let one = self.start(&declared.workflow, key.clone(), &body).await?;
            let found = one.outcome.as_ref().is_ok_and(|a| !a.created);
            if found && crate::mutants::on(crate::mutants::Mutant::EventStartedAgain) {
                self.start(&declared.workflow, format!("{key}-again"), &body).await?;
            }
            started.push(one);
        }
        Ok(started)
    }

    /// Every time of every schedule within `window` of now (see [`Starter::on_schedules`]).
    pub async fn look_back(&self, window: std::time::Duration) -> Result<Vec<Started>> {
        let now = self.submission.now();
        self.on_schedules(now.minus(window), now).await
    }

    /// Every time of every schedule after `after` and at or before `until`: an order each,
    /// keyed by the time. Times this process started before are left out.
    pub async fn on_schedules(&self, after: Timestamp, until: Timestamp) -> Result<Vec<Started>> {
        self.remembered().retain(|_, at| *at > after);
        let mut started = Vec::new();
        for declared in &self.starts {
            let Start::Schedule { schedule, input } = &declared.start else { continue };
            for at in schedule.times(after, until) {
                let key = schedule_key(&declared.workflow, declared.index, at);
                if self.remembered().contains_key(&key) {
                    continue;
                }
                let one = self.start(&declared.workflow, key.clone(), input).await?;
                self.remembered().insert(key, at);
                started.push(one);
            }
        }
        Ok(started)
    }

    fn remembered(&self) -> std::sync::MutexGuard<'_, HashMap<String, Timestamp>> {
        self.started.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn start(&self, workflow: &str, key: String, input: &Value) -> Result<Started> {
        let body = serde_json::to_vec(input).unwrap_or_default();
        let owner = Owner::starts();
        let outcome = match self.submission.submit_to(&owner, Some(workflow), &key, &body).await {
            Ok(accepted) => {
                if accepted.created {
                    info!(%workflow, %key, order_id = %accepted.order_id, "order started");
                }
                Ok(accepted)
            }
            Err(e) if e.is_retryable() => return Err(e),
            Err(e) => {
                warn!(%workflow, %key, error = %e, "a start made no order");
                Err(e.to_string())
            }
        };
        Ok(Started { workflow: workflow.to_owned(), key, outcome })
    }
}
