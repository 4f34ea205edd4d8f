//! The crate's one error type.
//!
//! Outcomes that are part of normal operation (a failed write condition, a stale reply, an
//! order rejected by validation) are not errors of the system: conditions and staleness are
//! typed outcomes of the ports and of the state machine. What remains here is what a caller
//! must react to, and every variant says whether trying again can help.

use crate::OrderId;
use crate::ids::InvalidId;
use crate::order::Rejection;

/// A boxed source error from an adapter, kept so that logs show the whole chain.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong in the engine and its ports.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The order failed validation; nothing was written.
    #[error("invalid order: {0}")]
    InvalidOrder(#[from] Rejection),

    /// The idempotency key is malformed; nothing was written.
    #[error("invalid idempotency key: {0}")]
    InvalidKey(&'static str),

    /// The authorizer named the caller in a way that cannot own orders; nothing was written.
    #[error("invalid caller: {0}")]
    InvalidCaller(String),

    /// The idempotency key was already used for a different order; nothing was written.
    #[error("idempotency key already used for a different order ({existing})")]
    KeyReused { existing: OrderId },

    /// A workflow definition is unusable; detected when it is loaded, never at run time.
    #[error("invalid workflow: {0}")]
    InvalidWorkflow(String),

    /// Configuration is missing or malformed; the message names the setting.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// A queue message could not be understood. Retrying cannot help: it is a poison message.
    #[error("invalid message: {0}")]
    InvalidMessage(String),

    /// The order runs a version of its workflow this deployment no longer has (its file was
    /// removed). Retrying cannot help until that version is deployed again.
    #[error(
        "order {order_id} runs {workflow} version {version}, which this deployment does not have: deploy that version again (keep its file in shared/workflows/) to go on with the order"
    )]
    WorkflowGone { order_id: OrderId, workflow: String, version: u32 },

    /// A stored record does not satisfy the engine's invariants (hand-edited, or written by
    /// an incompatible version). Retrying cannot help; an operator must look.
    #[error("corrupt record for order {order_id}: {reason}")]
    Corrupt { order_id: OrderId, reason: String },

    /// A dependency is temporarily unable to serve (throttling, 5xx, timeout, connection).
    /// The same call may succeed later.
    #[error("{service} unavailable: {source}")]
    Unavailable {
        service: &'static str,
        #[source]
        source: BoxError,
    },

    /// Another writer changed the order at each of `tries` tries to write it (siblings' ends,
    /// replies, a sweep, all at once): the message is worth handling again soon, once they
    /// are through.
    #[error("order {order_id} met another writer {tries} times")]
    Contended { order_id: OrderId, tries: usize },

    /// A dependency refused the call in a way that retrying will not change (permissions,
    /// malformed request, missing resource).
    #[error("{service} refused the call: {source}")]
    Rejected {
        service: &'static str,
        #[source]
        source: BoxError,
    },

    /// The queues are too long for a new order to be served in time: it was refused, nothing
    /// was written, and the client should come back after `retry_after`.
    #[error("overloaded: a new order would wait about {}s in the queues, most on the {busiest} queue", expected_wait.as_secs())]
    Overloaded {
        busiest: String,
        expected_wait: std::time::Duration,
        retry_after: std::time::Duration,
    },

    /// An operator command is malformed (its id, reason or caller); nothing was written.
    #[error("invalid command: {0}")]
    InvalidCommand(String),

    /// Some events of a batch were not accepted by the event bus.
    #[error("{failed} of {total} events were not published: {first_reason}")]
    PublishFailed { failed: usize, total: usize, first_reason: String },
}

impl Error {
    /// Whether the failed operation may succeed if tried again unchanged. Handlers use this to
    /// decide between reporting a message for redelivery and sending it to a dead-letter queue.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Unavailable { .. }
                | Error::Contended { .. }
                | Error::PublishFailed { .. }
                | Error::Overloaded { .. }
        )
    }

    /// Wraps a transient adapter failure.
    pub fn unavailable(service: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Unavailable { service, source: source.into() }
    }

    /// Wraps a permanent adapter failure.
    pub fn rejected(service: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Rejected { service, source: source.into() }
    }
}

/// Shorthand used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<InvalidId> for Error {
    fn from(e: InvalidId) -> Error {
        match e {
            InvalidId::OrderId(_) => Error::InvalidMessage(e.to_string()),
            InvalidId::Caller(reason) => Error::InvalidCaller(reason),
            InvalidId::Key(reason) => Error::InvalidKey(reason),
        }
    }
}
