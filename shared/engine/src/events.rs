//! What the system tells the outside world: status events for the submitting application and
//! alerts for operators.
//!
//! Both go through the [`EventBus`](crate::ports::EventBus) port. Status events are optional
//! and chosen by kind (each one costs money on AWS); alerts are not optional. Every event has
//! a deterministic id, so a consumer can drop the rare duplicate that a crash between publishing
//! and recording can cause.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::ids::OrderId;
use crate::state::{Cause, ProcessState, StateRecord};
use crate::time::Timestamp;

/// `detail-type` of status events.
pub const STATUS_DETAIL_TYPE: &str = "OrderStatusChanged";
/// `detail-type` of operator alerts.
pub const ALERT_DETAIL_TYPE: &str = "OrderNeedsAttention";
/// `detail-type` of the alerts that a service was held or opened again.
pub const SERVICE_DETAIL_TYPE: &str = "ServiceHoldChanged";
/// `detail-type` of the announcements of steps that wait for an answer from outside.
pub const CALLBACK_DETAIL_TYPE: &str = "StepAwaitsAnswer";

/// The kinds of status event an order goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StatusKind {
    /// Accepted by submission.
    Received,
    /// Claimed by the scheduler (each claim, including after a retry).
    Processing,
    /// One step completed.
    StepDone,
    /// Undoing the completed steps has begun.
    Compensating,
    /// Every step completed: terminal.
    Processed,
    /// The order failed and every completed step was undone: terminal.
    Compensated,
    /// The order failed and could not be fully undone, or nothing was done: terminal.
    Failed,
    /// An operator cancelled the order and every completed step was undone: terminal.
    Cancelled,
}

impl StatusKind {
    pub const ALL: [StatusKind; 8] = [
        StatusKind::Received,
        StatusKind::Processing,
        StatusKind::StepDone,
        StatusKind::Compensating,
        StatusKind::Processed,
        StatusKind::Compensated,
        StatusKind::Failed,
        StatusKind::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StatusKind::Received => "received",
            StatusKind::Processing => "processing",
            StatusKind::StepDone => "step_done",
            StatusKind::Compensating => "compensating",
            StatusKind::Processed => "processed",
            StatusKind::Compensated => "compensated",
            StatusKind::Failed => "failed",
            StatusKind::Cancelled => "cancelled",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            StatusKind::Processed
                | StatusKind::Compensated
                | StatusKind::Failed
                | StatusKind::Cancelled
        )
    }
}

/// Which status event kinds are published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusKinds(BTreeSet<StatusKind>);

impl Default for StatusKinds {
    /// Only the terminal kinds: one event per order, whatever happens to it.
    fn default() -> Self {
        StatusKinds(StatusKind::ALL.into_iter().filter(|k| k.is_terminal()).collect())
    }
}

impl StatusKinds {
    pub fn none() -> Self {
        StatusKinds(BTreeSet::new())
    }

    pub fn all() -> Self {
        StatusKinds(StatusKind::ALL.into_iter().collect())
    }

    pub fn contains(&self, kind: StatusKind) -> bool {
        self.0.contains(&kind)
    }
}

impl FromStr for StatusKinds {
    type Err = Error;

    /// `terminal`, `all`, `none`, or a comma-separated list of kinds (`received,processed`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "terminal" => Ok(StatusKinds::default()),
            "all" => Ok(StatusKinds::all()),
            "none" | "" => Ok(StatusKinds::none()),
            list => {
                list.split(',')
                    .map(|k| {
                        let k = k.trim();
                        StatusKind::ALL.into_iter().find(|c| c.as_str() == k).ok_or_else(|| {
                            Error::Config(format!("unknown status event kind {k:?}"))
                        })
                    })
                    .collect::<Result<_, _>>()
                    .map(StatusKinds)
            }
        }
    }
}

/// A status change of one order, for the application that submitted it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusEvent {
    pub order_id: OrderId,
    /// The order's workflow and the version it runs.
    #[serde(default)]
    pub workflow: String,
    #[serde(default)]
    pub workflow_version: u32,
    pub status: StatusKind,
    /// The step concerned, for `step_done`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    pub attempt: u64,
    pub at: Timestamp,
    pub correlation_id: String,
}

/// An order that needs an operator: it ended in `Error`, or it was processed with a step whose
/// failure its workflow only reports. It carries what the operator needs to act without
/// opening anything else first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alert {
    /// Deterministic: the same failure of the same order always has the same id (an order
    /// redriven and failing again gets a new one, and so does an undo of a processed order
    /// that leaves something to undo by hand).
    pub alert_id: String,
    pub order_id: OrderId,
    /// The order's workflow and the version it runs.
    #[serde(default)]
    pub workflow: String,
    #[serde(default)]
    pub workflow_version: u32,
    /// How the order ended: `Error`, or `Processed` when only reported failures are left.
    #[serde(default = "error_state")]
    pub state: ProcessState,
    /// Why the order stopped; for a processed order, its first reported failure.
    pub cause: Cause,
    /// The failures of steps the order went on without, each naming its step: what an
    /// operator may have to finish by hand.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reported: Vec<Cause>,
    /// The step that failed; none for an order cancelled by an operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_step: Option<String>,
    /// Steps that were done and have been undone.
    #[serde(default)]
    pub undone: Vec<String>,
    /// Whether every completed step was undone (nothing is left for the operator to revert).
    pub fully_compensated: bool,
    /// Steps whose effects may still be in place and must be checked and reverted by hand.
    pub needs_manual_undo: Vec<String>,
    pub failure_count: u32,
    /// How many times the order had been redriven before this failure.
    #[serde(default)]
    pub redrives: u32,
    pub at: Timestamp,
    pub correlation_id: String,
    /// The operator's CLI command that shows the order with its timeline.
    #[serde(default)]
    pub show_command: String,
    /// The command that runs the order again once the cause is fixed: a redrive of its
    /// compensation if an undo failed, of the order otherwise; none for a processed order.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub redrive_command: String,
}

/// A step that waits for an answer from outside the stack (a person's approval, a partner's
/// webhook): what the party that gives it needs. Whoever receives it can answer for the
/// step, so the rule that routes it should reach only that party.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Callback {
    pub order_id: OrderId,
    pub workflow: String,
    pub workflow_version: u32,
    pub step: String,
    /// Counts for this wait of this step only, once.
    pub token: String,
    /// The step fails unless it is answered, or a heartbeat is sent, by then.
    pub answer_by: Timestamp,
    pub timeout_seconds: u64,
    /// Where to answer, on the orders API: `POST` it with `/complete`, `/refuse` or
    /// `/heartbeat` appended.
    pub answer_path: String,
    /// The order's input, and the outputs of the steps it depends on.
    pub order: serde_json::Value,
    #[serde(default)]
    pub outputs: std::collections::BTreeMap<String, serde_json::Value>,
    pub at: Timestamp,
    pub correlation_id: String,
}

fn error_state() -> ProcessState {
    ProcessState::Error
}

/// One entry for the bus: what it is, a deterministic id, and its JSON detail.
#[derive(Clone, PartialEq, Eq)]
pub struct BusEvent {
    pub id: String,
    pub detail_type: &'static str,
    pub detail: String,
}

impl fmt::Debug for BusEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The detail can be large; its id says which event it is.
        f.debug_struct("BusEvent")
            .field("id", &self.id)
            .field("detail_type", &self.detail_type)
            .finish()
    }
}

impl BusEvent {
    pub fn status(
        record: &StateRecord,
        status: StatusKind,
        step: Option<String>,
        at: Timestamp,
    ) -> BusEvent {
        let event = StatusEvent {
            order_id: record.order_id,
            workflow: record.workflow.clone(),
            workflow_version: record.workflow_version,
            status,
            step,
            attempt: record.attempt,
            at,
            correlation_id: record.correlation_id.clone(),
        };
        let id = match &event.step {
            Some(step) => {
                format!("{}/{}/{step}/{}", record.order_id, status.as_str(), record.attempt)
            }
            None => format!("{}/{}/{}", record.order_id, status.as_str(), record.attempt),
        };
        BusEvent { id, detail_type: STATUS_DETAIL_TYPE, detail: to_json(&event) }
    }

    /// The announcement of a callback; announced again (after a lost write) with the same id.
    pub fn callback(callback: &Callback, attempt: u64) -> BusEvent {
        BusEvent {
            id: format!("{}/callback/{}/{attempt}", callback.order_id, callback.step),
            detail_type: CALLBACK_DETAIL_TYPE,
            detail: to_json(callback),
        }
    }

    pub fn service(event: &ServiceEvent) -> BusEvent {
        BusEvent {
            id: event.event_id.clone(),
            detail_type: SERVICE_DETAIL_TYPE,
            detail: to_json(event),
        }
    }

    pub fn alert(alert: &Alert) -> BusEvent {
        BusEvent {
            id: alert.alert_id.clone(),
            detail_type: ALERT_DETAIL_TYPE,
            detail: to_json(alert),
        }
    }
}

/// An alert for operators about a hold of a service or of one of its actions: one when it
/// begins, one when it ends, and one more if it lasts past the operators' threshold
/// ([`crate::config::HoldPolicy::alert_after`]), whatever the number of orders that wait.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceEvent {
    /// Deterministic: the same hold, release or overdue hold always has the same id.
    pub event_id: String,
    pub service: String,
    /// The action held or released; absent: the whole service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// `held`, `open`, or `still_held` (a hold that has lasted past the operators'
    /// threshold).
    pub state: String,
    /// When the hold began.
    pub held_since: Timestamp,
    /// When it ended, for `open`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_at: Option<Timestamp>,
    /// Who held or released it: an operator, or `None` for the agent (a release by a probe).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Probes that reached it during the hold so far (or in all, for `open`).
    #[serde(default)]
    pub probes: u64,
    /// For a hold that goes on: the fault its probes last met.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe: Option<String>,
    /// Orders waiting for it when the alert was made.
    pub waiting: u64,
}

impl ServiceEvent {
    /// The alert owed for the change of `record`'s scope `on` (`None`: the whole service), if
    /// it was ever held; `waiting`: the orders that wait for it.
    pub fn of(
        record: &crate::health::ServiceRecord,
        on: Option<&str>,
        waiting: u64,
    ) -> Option<ServiceEvent> {
        let scope = record.scope(on)?;
        let event_id = crate::health::event_id(&record.service, on, &scope.event_key()?);
        let mut event = ServiceEvent {
            event_id,
            service: record.service.clone(),
            action: on.map(str::to_owned),
            state: String::new(),
            held_since: Timestamp::from_millis(0),
            released_at: None,
            by: None,
            reason: String::new(),
            probes: 0,
            last_probe: None,
            waiting,
        };
        match (&scope.held, &scope.released) {
            (Some(hold), _) => {
                event.state = if hold.overdue { "still_held" } else { "held" }.into();
                event.held_since = hold.since;
                event.by = hold.by.clone();
                event.reason = hold.reason.clone();
                event.probes = hold.probes;
                event.last_probe = hold.last_probe.clone();
            }
            (None, Some(release)) => {
                event.state = "open".into();
                event.held_since = release.held_since;
                event.released_at = Some(release.at);
                event.by = release.by.clone();
                event.reason = release.reason.clone();
                event.probes = release.probes;
            }
            (None, None) => return None,
        }
        Some(event)
    }
}

fn to_json<T: Serialize>(value: &T) -> String {
    // Serialising these plain structs cannot fail: no maps with non-string keys, no floats.
    serde_json::to_string(value).unwrap_or_default()
}

/// What the bus said about a batch: the positions it did not accept, with its reasons.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PublishReport {
    pub failed: Vec<(usize, String)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_kinds_parse() {
        assert_eq!("terminal".parse::<StatusKinds>().unwrap(), StatusKinds::default());
        let k: StatusKinds = "received, processed".parse().unwrap();
        assert!(k.contains(StatusKind::Received) && k.contains(StatusKind::Processed));
        assert!(!k.contains(StatusKind::Failed));
        assert!(
            "received,sent".parse::<StatusKinds>().unwrap_err().to_string().contains("\"sent\"")
        );
        assert!(!StatusKinds::default().contains(StatusKind::StepDone));
        assert!(StatusKinds::default().contains(StatusKind::Compensated));
    }
}
