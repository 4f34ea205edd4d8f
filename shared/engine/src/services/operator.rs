//! Operator commands applied to one order: cancel, redrive (forward or its compensation),
//! pause and resume; and the answers to steps that wait for a callback, given by the party
//! outside with the step's token, or by an operator on its behalf.
//!
//! A command is an input of the state machine like any message: the record is read, the
//! machine decides, the new record is written on the condition that it is still the one read,
//! and the side effects follow. A command carries an id chosen by the caller; the same id sent
//! again (a retried HTTP call, a script run twice) is applied once, and a command that does
//! not fit the order's state is refused with the state named and nothing written.

use std::time::Duration;

use tracing::info;

use super::effects::Ports;
use crate::error::{Error, Result};
use crate::ids::OrderId;
use crate::machine::{Answer, Decision, Input, Refused, decide};
use crate::payload::NoPayloads;
use crate::ports::{Clock, EventBus, Outbox, Payloads, Read, Saved, StateStore};
use crate::state::{CommandKind, StateRecord};

/// Longest command id, caller and reason accepted, in characters.
pub const MAX_COMMAND_ID_LEN: usize = 64;
pub const MAX_CALLER_LEN: usize = 256;
pub const MAX_REASON_LEN: usize = 300;

/// Writes tried before a command gives up on an order that keeps changing under it. Each lost
/// race means the order moved on its own; a handful is already unusual.
const COMMAND_TRIES: usize = 5;

/// A validated operator command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command {
    pub kind: CommandKind,
    /// Chosen by the caller, the same on every retry of one intent.
    pub id: String,
    /// Who gave it: the caller's authenticated identity.
    pub by: String,
    /// Why, in the operator's words.
    pub reason: String,
    /// How long after it the steps it frees start: zero, but for a bulk command, which
    /// spreads its orders over time ([`crate::services::bulk`]).
    pub after: Duration,
}

impl Command {
    /// Checks the parts of a command; nothing about the order is looked at yet.
    pub fn new(kind: CommandKind, id: &str, by: &str, reason: &str) -> Result<Command> {
        let bad = |m: String| Err(Error::InvalidCommand(m));
        if id.is_empty() || id.chars().count() > MAX_COMMAND_ID_LEN {
            return bad(format!("the command id must have 1 to {MAX_COMMAND_ID_LEN} characters"));
        }
        if !id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b)) {
            return bad(
                "the command id may only contain A-Z, a-z, 0-9, '-', '_', '.' and ':'".into()
            );
        }
        let by = by.trim();
        if by.is_empty() || by.chars().count() > MAX_CALLER_LEN || by.chars().any(char::is_control)
        {
            return bad("the caller's identity is missing or malformed".into());
        }
        if reason.trim().is_empty() {
            return bad("a reason is required: it is kept in the order's timeline".into());
        }
        // Counted as sent, as the API's schema counts it.
        if reason.chars().count() > MAX_REASON_LEN {
            return bad(format!("the reason must be at most {MAX_REASON_LEN} characters"));
        }
        if reason.chars().any(char::is_control) {
            return bad("the reason must not contain control characters".into());
        }
        Ok(Command {
            kind,
            id: id.to_owned(),
            by: by.to_owned(),
            reason: reason.trim().to_owned(),
            after: Duration::ZERO,
        })
    }

    fn input(&self) -> Input<'_> {
        Input::Command {
            command: self.kind,
            id: &self.id,
            by: &self.by,
            reason: &self.reason,
            after: self.after,
        }
    }
}

/// Longest token accepted; the tokens the engine hands out are 40 characters.
pub const MAX_TOKEN_LEN: usize = 128;

/// A validated answer to a step that waits for a callback.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answering {
    pub step: String,
    /// The token the step's announcement carried; `None` for an operator, whose access to
    /// the operators' API is the authority.
    pub token: Option<String>,
    pub answer: Answer,
    /// Who answered: the caller's authenticated identity.
    pub by: String,
    /// Why; required to refuse.
    pub reason: String,
}

impl Answering {
    /// Checks the parts of an answer; nothing about the order is looked at yet.
    pub fn new(
        step: &str,
        token: Option<&str>,
        answer: Answer,
        by: &str,
        reason: &str,
    ) -> Result<Answering> {
        let bad = |m: String| Err(Error::InvalidCommand(m));
        if step.is_empty() || step.len() > 64 {
            return bad("the step name must have 1 to 64 characters".into());
        }
        if let Some(token) = token
            && (token.is_empty()
                || token.len() > MAX_TOKEN_LEN
                || !token.bytes().all(|b| b.is_ascii_alphanumeric()))
        {
            return bad(format!(
                "the token must be 1 to {MAX_TOKEN_LEN} letters and digits, as announced"
            ));
        }
        let by = by.trim();
        if by.is_empty() || by.chars().count() > MAX_CALLER_LEN || by.chars().any(char::is_control)
        {
            return bad("the caller's identity is missing or malformed".into());
        }
        if answer == Answer::Refuse && reason.trim().is_empty() {
            return bad("a reason is required to refuse: it is kept on the step".into());
        }
        if reason.chars().count() > MAX_REASON_LEN || reason.chars().any(char::is_control) {
            return bad(format!(
                "the reason must be at most {MAX_REASON_LEN} characters, without control characters"
            ));
        }
        Ok(Answering {
            step: step.to_owned(),
            token: token.map(str::to_owned),
            answer,
            by: by.to_owned(),
            reason: reason.trim().to_owned(),
        })
    }

    fn input(&self) -> Input<'_> {
        Input::Answer {
            step: &self.step,
            token: self.token.as_deref(),
            answer: &self.answer,
            by: &self.by,
            reason: &self.reason,
        }
    }
}

/// What a command did: it changed the order now, had been applied before, or does not fit
/// the order's state (nothing was written; the refusal names the state).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    Now,
    Before,
    Refused(Refused),
}

/// What a command did, with the order as it stands after it (as it is, if refused).
#[derive(Clone, Debug, PartialEq)]
pub struct Commanded {
    pub applied: Applied,
    pub record: StateRecord,
}

/// The operator service, over its ports.
#[derive(Debug)]
pub struct Operator<S, Q, B, C, P = NoPayloads> {
    ports: Ports<S, Q, B, C, P>,
}

impl<S: StateStore, Q: Outbox, B: EventBus, C: Clock, P: Payloads> Operator<S, Q, B, C, P> {
    pub fn new(ports: Ports<S, Q, B, C, P>) -> Self {
        Operator { ports }
    }

    /// Applies `command` to the order, or says why not ([`Applied::Refused`]). `None` if
    /// there is no such order.
    pub async fn command(&self, order_id: OrderId, command: &Command) -> Result<Option<Commanded>> {
        let what = command.kind.as_str();
        self.settle(order_id, command.input(), what, &command.by).await
    }

    /// Applies `answer` to the step it names, or says why not ([`Applied::Refused`]): a
    /// repeated, late or forged answer changes nothing. `None` if there is no such order.
    pub async fn answer(&self, order_id: OrderId, answer: &Answering) -> Result<Option<Commanded>> {
        self.settle(order_id, answer.input(), answer.answer.as_str(), &answer.by).await
    }

    async fn settle(
        &self,
        order_id: OrderId,
        input: Input<'_>,
        what: &str,
        by: &str,
    ) -> Result<Option<Commanded>> {
        for _ in 0..COMMAND_TRIES {
            let Some(record) = self.ports.store.load(order_id, Read::Consistent).await? else {
                return Ok(None);
            };
            let ctx = self.ports.ctx(&record)?;
            match decide(&record, input, &ctx) {
                Decision::Apply(t) => {
                    if self.ports.save(&record, &t.next).await? == Saved::Conflict {
                        continue;
                    }
                    info!(%order_id, correlation_id = %record.correlation_id,
                          command = what, by = %by,
                          state = t.next.process_state.as_str(), "operator command applied");
                    self.ports.perform(&t.next, &t.effects).await?;
                    return Ok(Some(Commanded { applied: Applied::Now, record: t.next }));
                }
                Decision::Replay(effects) => {
                    self.ports.perform(&record, &effects).await?;
                    return Ok(Some(Commanded { applied: Applied::Before, record }));
                }
                Decision::Ignore(_) => {
                    return Ok(Some(Commanded { applied: Applied::Before, record }));
                }
                Decision::Refuse(refused) => {
                    return Ok(Some(Commanded { applied: Applied::Refused(refused), record }));
                }
                Decision::Illegal(why) => {
                    return Err(Error::Corrupt { order_id, reason: format!("{why:?}") });
                }
            }
        }
        Err(Error::unavailable(
            "state store",
            "the order kept changing under the command; try again",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_is_checked_as_the_api_schema_states() {
        let new = |reason: &str| Command::new(CommandKind::Cancel, "c-1", "arn:ops", reason);
        assert_eq!(new("  customer called ").unwrap().reason, "customer called");
        assert!(new(&"r".repeat(MAX_REASON_LEN)).is_ok());
        // The limit counts the characters as sent, padding included.
        assert!(new(&format!(" {}", "r".repeat(MAX_REASON_LEN))).is_err());
        for bad in ["", "   ", "line\nbreak", "\u{7}"] {
            assert!(matches!(new(bad), Err(Error::InvalidCommand(_))), "{bad:?}");
        }
        assert!(Command::new(CommandKind::Cancel, "bad id", "arn:ops", "why").is_err());
        assert!(Command::new(CommandKind::Cancel, "c-1", " ", "why").is_err());
    }
}
