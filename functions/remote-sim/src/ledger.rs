//! The effect ledger: what the simulated service has done, keyed by idempotency key, with the
//! same semantics as the engine's in-memory `MemoryRemote`.
//!
//! - A key takes effect at most once; a repeat answers the output recorded the first time.
//! - Keys look like `{order_id}/{step}/do` and `{order_id}/{step}/undo`: the step is everything
//!   before the last `/`. Once a step's `undo` is recorded, every `do` of that step is refused
//!   for good (a tombstone), whether or not an earlier `do` went through, so a late or retried
//!   `do` never re-applies what was compensated.
//! - An `undo` whose `do` never took effect is recorded as a successful no-op, and still leaves
//!   the tombstone.
//!
//! The ledger also counts the calls of every key, including those that failed or were refused,
//! so a test can tell how often a key was tried as well as how often it took effect.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Which way a call goes: doing a step, or undoing (compensating) it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    Do,
    Undo,
}

impl Direction {
    /// `"do"` or `"undo"`, as in keys and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Do => "do",
            Direction::Undo => "undo",
        }
    }
}

/// One call as the service's own logic sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// The idempotency key: the service deduplicates on it.
    pub key: String,
    pub order_id: String,
    /// The action called (`charge-payment`, ...); it names the reference of the effect.
    pub action: String,
    pub direction: Direction,
    /// The outputs of the order's steps before this one, as the call carried them.
    pub outputs: Value,
    /// How large the order's input it carried was, in bytes of JSON.
    pub order_bytes: u64,
    /// How large the input of an undo (what its step answered) was, in bytes of JSON.
    pub input_bytes: u64,
}

/// One effect applied by the service, as shown by `GET /ledger`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Effect {
    /// The idempotency key of the call that applied it.
    pub key: String,
    pub order_id: String,
    pub action: String,
    pub direction: Direction,
    /// How many times the effect took place, every application counted: 1, unless
    /// deduplication is broken, which is what `max_applications` exists to catch.
    pub applications: u32,
    /// What the service answered when it applied the effect, and answers to every repeat.
    pub output: Value,
    /// How many calls carried this key, including failed and refused ones.
    pub calls: u32,
    /// What the call that applied it carried of the steps before (absent if nothing).
    #[serde(skip_serializing_if = "Value::is_null")]
    pub outputs: Value,
    /// How large the order's input that call carried was, in bytes of JSON.
    pub order_bytes: u64,
    /// For an undo, how large the input it was told (its step's answer) was (0: none).
    #[serde(skip_serializing_if = "is_zero")]
    pub input_bytes: u64,
    /// When it took effect, in seconds since the service started (`started_at_ms` in
    /// `GET /ledger`, milliseconds since the epoch), so that the pace of the effects can be
    /// read from the ledger.
    pub at_s: f64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What the ledger says about a call before anything is applied.
#[derive(Clone, Debug, PartialEq)]
pub enum Check {
    /// A `do` of a step that was already undone: refuse it for good.
    Tombstoned,
    /// The key already took effect: answer the recorded output.
    Replay(Value),
    /// A new key; `noop` is true for an `undo` whose `do` never took effect.
    New { noop: bool },
}

/// The ledger. Empty by default.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    // In the order applied, with an index by key.
    effects: Vec<Effect>,
    by_key: HashMap<String, usize>,
    calls: HashMap<String, u32>,
    // The number of the last reference handed out; references are `{action}-{n}`.
    last_ref: u64,
}

impl Ledger {
    /// Counts one more call carrying `key` and returns how many there have been, this one
    /// included.
    pub fn note_call(&mut self, key: &str) -> u32 {
        let calls = self.calls.entry(key.to_owned()).or_default();
        *calls = calls.saturating_add(1);
        let n = *calls;
        if let Some(effect) = self.by_key.get(key).and_then(|&at| self.effects.get_mut(at)) {
            effect.calls = n;
        }
        n
    }

    /// What the service's logic makes of `call`, without changing anything.
    pub fn check(&self, call: &Call) -> Check {
        // The step's other direction shares everything in the key up to the last '/'.
        let counterpart = |direction: Direction| {
            call.key.rsplit_once('/').map(|(step, _)| format!("{step}/{}", direction.as_str()))
        };
        let noop = match call.direction {
            Direction::Do => {
                // Checked before deduplication: once a step is compensated, every `do` of it is
                // refused, whether or not an earlier one went through.
                if counterpart(Direction::Undo).is_some_and(|k| self.by_key.contains_key(&k)) {
                    return Check::Tombstoned;
                }
                false
            }
            Direction::Undo => {
                !counterpart(Direction::Do).is_some_and(|k| self.by_key.contains_key(&k))
            }
        };
        match self.effect(&call.key) {
            Some(effect) => Check::Replay(effect.output.clone()),
            None => Check::New { noop },
        }
    }

    /// Records an effect and returns its output: `{"ref": "{action}-{n}"}`, with
    /// `"noop": true` for a no-op undo. Every application is counted: the service's logic
    /// ([`Ledger::check`]) applies a key once, and a caller that skipped it and applied a known
    /// key again would show as a second application, answered with the first output.
    pub fn apply(&mut self, call: &Call, noop: bool) -> Value {
        self.apply_padded(call, noop, 0, 0.0)
    }

    /// As [`Ledger::apply`], a new effect answering `padding` more bytes (a document, a
    /// label: an answer larger than a message carries), applied `at_s` seconds after the
    /// service started.
    pub fn apply_padded(&mut self, call: &Call, noop: bool, padding: usize, at_s: f64) -> Value {
        if let Some(&at) = self.by_key.get(&call.key) {
            let effect = &mut self.effects[at];
            effect.applications = effect.applications.saturating_add(1);
            return effect.output.clone();
        }
        self.last_ref += 1;
        let reference = format!("{}-{}", call.action, self.last_ref);
        let mut output = if noop {
            json!({ "ref": reference, "noop": true })
        } else {
            json!({ "ref": reference })
        };
        if padding > 0 {
            output["document"] = "d".repeat(padding).into();
        }
        self.by_key.insert(call.key.clone(), self.effects.len());
        self.effects.push(Effect {
            key: call.key.clone(),
            order_id: call.order_id.clone(),
            action: call.action.clone(),
            direction: call.direction,
            applications: 1,
            output: output.clone(),
            calls: self.calls(&call.key),
            outputs: call.outputs.clone(),
            order_bytes: call.order_bytes,
            input_bytes: call.input_bytes,
            at_s,
        });
        output
    }

    /// The effect of `key`, if it took place.
    pub fn effect(&self, key: &str) -> Option<&Effect> {
        self.by_key.get(key).and_then(|&at| self.effects.get(at))
    }

    /// Every effect, in the order applied.
    pub fn effects(&self) -> &[Effect] {
        &self.effects
    }

    /// How many calls carried `key`; 0 if none.
    pub fn calls(&self, key: &str) -> u32 {
        self.calls.get(key).copied().unwrap_or(0)
    }

    /// The most applications of any one key (0 when empty); a test asserts it is at most 1.
    pub fn max_applications(&self) -> u32 {
        self.effects.iter().map(|e| e.applications).max().unwrap_or(0)
    }

    /// Forgets every effect and call, and restarts the references at 1.
    pub fn clear(&mut self) {
        *self = Ledger::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(action: &str, direction: Direction) -> Call {
        Call {
            outputs: Value::Null,
            order_bytes: 0,
            input_bytes: 0,
            key: format!("order-1/charge/{}", direction.as_str()),
            order_id: "order-1".into(),
            action: action.into(),
            direction,
        }
    }

    /// What the service does with a call that passed the fault checks.
    fn serve(ledger: &mut Ledger, call: &Call) -> Result<Value, &'static str> {
        ledger.note_call(&call.key);
        match ledger.check(call) {
            Check::Tombstoned => Err("tombstoned"),
            Check::Replay(output) => Ok(output),
            Check::New { noop } => Ok(ledger.apply(call, noop)),
        }
    }

    #[test]
    fn a_repeated_key_answers_the_same_and_applies_once() {
        let mut ledger = Ledger::default();
        let charge = call("charge-payment", Direction::Do);
        let first = serve(&mut ledger, &charge).unwrap();
        assert_eq!(first, json!({ "ref": "charge-payment-1" }));
        assert_eq!(serve(&mut ledger, &charge).unwrap(), first);
        assert_eq!(ledger.effects().len(), 1);
        assert_eq!(ledger.max_applications(), 1);
        let effect = ledger.effect("order-1/charge/do").unwrap();
        assert_eq!((effect.calls, effect.applications), (2, 1));
        assert_eq!(effect.order_id, "order-1");
        assert_eq!(effect.direction, Direction::Do);
    }

    #[test]
    fn an_undo_without_its_do_is_a_noop_and_tombstones_the_step() {
        let mut ledger = Ledger::default();
        let undo = serve(&mut ledger, &call("refund-payment", Direction::Undo)).unwrap();
        assert_eq!(undo, json!({ "ref": "refund-payment-1", "noop": true }));
        let late = call("charge-payment", Direction::Do);
        assert_eq!(serve(&mut ledger, &late), Err("tombstoned"));
        assert!(ledger.effect(&late.key).is_none());
        assert_eq!(ledger.calls(&late.key), 1);
        assert_eq!(ledger.effects().len(), 1);
    }

    #[test]
    fn an_undo_after_its_do_compensates_and_blocks_repeats_of_the_do() {
        let mut ledger = Ledger::default();
        let charge = call("charge-payment", Direction::Do);
        serve(&mut ledger, &charge).unwrap();
        let undo = serve(&mut ledger, &call("refund-payment", Direction::Undo)).unwrap();
        assert_eq!(undo, json!({ "ref": "refund-payment-2" }));
        // Even the key that already took effect is refused now, as MemoryRemote does.
        assert_eq!(serve(&mut ledger, &charge), Err("tombstoned"));
        assert_eq!(ledger.effects().len(), 2);
        assert_eq!(ledger.max_applications(), 1);
    }

    #[test]
    fn keys_without_a_step_neither_tombstone_nor_find_their_do() {
        let mut ledger = Ledger::default();
        let undo = Call { key: "flat".into(), ..call("x", Direction::Undo) };
        assert_eq!(ledger.check(&undo), Check::New { noop: true });
        let done = Call { key: "flat-do".into(), ..call("x", Direction::Do) };
        ledger.apply(&undo, true);
        assert_eq!(ledger.check(&done), Check::New { noop: false });
    }

    #[test]
    fn apply_never_records_a_key_twice() {
        let mut ledger = Ledger::default();
        let charge = call("charge-payment", Direction::Do);
        let first = ledger.apply(&charge, false);
        assert_eq!(ledger.apply(&charge, false), first);
        assert_eq!(ledger.effects().len(), 1);
    }

    #[test]
    fn clearing_forgets_everything() {
        let mut ledger = Ledger::default();
        serve(&mut ledger, &call("charge-payment", Direction::Do)).unwrap();
        ledger.clear();
        assert!(ledger.effects().is_empty());
        assert_eq!(ledger.calls("order-1/charge/do"), 0);
        assert_eq!(ledger.max_applications(), 0);
        let again = serve(&mut ledger, &call("charge-payment", Direction::Do)).unwrap();
        assert_eq!(again, json!({ "ref": "charge-payment-1" }));
    }

    #[test]
    fn an_application_that_skipped_the_check_is_counted() {
        let mut ledger = Ledger::default();
        let charge = call("charge-payment", Direction::Do);
        let first = ledger.apply(&charge, false);
        assert_eq!(ledger.apply(&charge, false), first);
        assert_eq!(ledger.max_applications(), 2);
        assert_eq!(ledger.effects().len(), 1);
    }
}
