//! A simulated business service behind the [`RemoteService`] port, with a ledger of the
//! effects it applied, so a test can tell whether any effect took place twice.
//!
//! It keeps the semantics a well-behaved real service offers and the engine relies on: it
//! deduplicates on the idempotency key (a repeated key returns the first answer and applies
//! nothing), an undo leaves a tombstone so a late `do` of the same step is refused instead of
//! re-applying what was compensated, and an undo of something never done is a successful no-op.
//! Its refusals are decisions about new keys, and are kept: a key that already took effect is
//! answered with its recorded output, a key once refused is refused again with the same reason
//! (as Stripe replays a declined charge for its key), and a call whose key is still being worked
//! on by an earlier call is told to come back (a transient fault, as Stripe's 409).
//! And it has the faults a real one has, scripted per action: unavailability, refusal, an
//! answer lost after the effect was applied, and slowness that outlasts the caller's deadline
//! while the effect still lands. Over time it can also go down ([`Outage`]): for a spell it
//! fails every call of some actions with a passing fault, or every other few seconds (a
//! flapping service), and may come back slowly, failing a share of calls that falls to none.
//! It can throttle ([`Throttle`]): answer 429 with a `Retry-After` to calls above a rate of
//! its own, whatever its agent declared, and to a share of the others at random. A call an
//! outage fails or a throttle turns away applies nothing and leaves the script to the calls
//! they let through.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use sas_rng::SplitMix;
use serde_json::json;

use crate::ids::{Direction, OrderId};
use crate::ports::{Clock, RemoteCall, RemoteFault, RemoteService};
use crate::time::Timestamp;

/// What the service does with one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Applies the effect and answers.
    Succeed,
    /// Answers with a transient fault; nothing is applied.
    Transient,
    /// Refuses for good with this reason; nothing is applied.
    Permanent(String),
    /// Applies the effect, then the answer is lost: the caller sees a transient fault.
    ApplyThenLoseAnswer,
    /// Takes this long, then behaves as `Succeed`; if that ends at or after the caller's
    /// deadline, the effect is still applied but the caller sees a timeout.
    Slow(Duration),
    /// Applies the effect and answers an output of about this many bytes of JSON.
    Large(usize),
    /// Applies the effect and answers more than a step may return.
    Oversize,
}

/// One effect applied by the service.
#[derive(Clone, Debug, PartialEq)]
pub struct LedgerEntry {
    /// The idempotency key of the call that applied it.
    pub key: String,
    pub order_id: OrderId,
    pub action: String,
    pub direction: Direction,
    /// How many times the effect took place: every application is counted. Deduplication
    /// keeps it at 1; a service whose deduplication is off ([`MemoryRemote::forget_keys`])
    /// applies a repeated key again.
    pub applications: u32,
    /// What the service answered when it applied the effect, and answers to every repeat.
    pub output: serde_json::Value,
}

/// How many calls met each scripted fault.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteFaults {
    pub transient: u32,
    pub permanent: u32,
    pub lost_answers: u32,
    /// Slow calls that outlasted the caller's deadline, their effect applied all the same.
    pub timeouts: u32,
    /// Effects applied with an answer larger than a step may return.
    pub oversize: u32,
    /// Effects applied with an answer too large to carry in a message, to be stored.
    pub large: u32,
    /// Calls that were handed a stored reference where a value belongs, or an undo handed
    /// something other than what its step answered: what an agent must never let through.
    pub misread: u32,
    /// Calls an [`Outage`] failed.
    pub outage: u32,
    /// Calls an [`Outage`] with a refusal refused.
    pub denied: u32,
    /// Calls a [`Throttle`] turned away with a 429.
    pub throttled: u32,
}

/// How the service throttles calls of `actions`: those above `per_second` in any second,
/// however aligned (counting the calls it took, not those it turned away), and `per_mille` in
/// a thousand of the others, drawn from `seed`. Each is answered 429 with `retry_after`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Throttle {
    pub actions: Vec<String>,
    /// The most calls it takes in a second; `None`: no rate of its own.
    pub per_second: Option<u32>,
    pub per_mille: u32,
    /// What its 429 asks for; `None`: it does not say, as some services do not.
    pub retry_after: Option<Duration>,
    pub seed: u64,
}

/// A throttle at work: when it took its last calls, and its draws.
struct Throttling {
    throttle: Throttle,
    taken: VecDeque<Timestamp>,
    draws: SplitMix,
}

impl Throttling {
    /// Whether a call at `now` is turned away; a call taken is counted.
    fn turns_away(&mut self, now: Timestamp) -> bool {
        let second_ago = now.minus(Duration::from_secs(1));
        while self.taken.front().is_some_and(|t| *t <= second_ago) {
            self.taken.pop_front();
        }
        let full = self.throttle.per_second.is_some_and(|n| self.taken.len() >= n as usize);
        let drawn = self.draws.unit() * 1000.0 < f64::from(self.throttle.per_mille);
        if full || drawn {
            return true;
        }
        self.taken.push_back(now);
        false
    }
}

/// A spell during which the service fails calls of `actions` with a passing fault, whatever
/// their script: from `from` until `until` (every call, or, `flapping`, in turns of that long
/// down then up), then, for `recovery`, a share of them falling evenly from all to none. With
/// a `refusal`, the calls it fails are refused for good instead, with that reason (a grant
/// taken away: access denied), but for the keys the service applied already, which it answers
/// as it did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outage {
    pub actions: Vec<String>,
    pub from: Timestamp,
    pub until: Timestamp,
    /// Down and up in turns of this long, down first; `None`: down throughout.
    pub flapping: Option<Duration>,
    /// How long after `until` the service takes to answer every call again.
    pub recovery: Duration,
    /// The reason the calls are refused for, when they are refused rather than failed.
    pub refusal: Option<String>,
}

impl Outage {
    /// Whether the call of `action` at `now` fails; `debt` carries the shares of calls owed
    /// failures while the service recovers, so that the share failed is exact, not drawn.
    fn fails(&self, action: &str, now: Timestamp, debt: &mut u64) -> bool {
        if now < self.from || !self.actions.iter().any(|a| a == action) {
            return false;
        }
        if now < self.until {
            let Some(turn) = self.flapping.filter(|t| !t.is_zero()) else { return true };
            return (self.from.until(now).as_millis() / turn.as_millis()) % 2 == 0;
        }
        let since = self.until.until(now);
        if since >= self.recovery {
            return false;
        }
        // Per mille of calls still failing, falling evenly to none.
        let left = self.recovery - since;
        *debt += u64::try_from(left.as_millis() * 1000 / self.recovery.as_millis()).unwrap_or(0);
        if *debt >= 1000 {
            *debt -= 1000;
            return true;
        }
        false
    }
}

/// A scripted business service with an effect ledger.
pub struct MemoryRemote<C> {
    clock: C,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    scripts: HashMap<String, VecDeque<Behaviour>>,
    // In the order applied, with an index by key.
    ledger: Vec<LedgerEntry>,
    by_key: HashMap<String, usize>,
    calls: HashMap<String, u32>,
    // Keys whose slow call has not finished yet.
    in_progress: std::collections::HashSet<String>,
    // Keys refused for good, with the reason given.
    refused: HashMap<String, String>,
    faults: RemoteFaults,
    next_ref: u64,
    // Deduplication off: a repeated key applies its effect again.
    forgetful: bool,
    // Each outage, with the calls it failed and its debt of failures while it recovers.
    outages: Vec<(Outage, u32, u64)>,
    throttles: Vec<Throttling>,
}

impl<C: Clock> MemoryRemote<C> {
    /// A service that succeeds at everything until scripted otherwise.
    pub fn new(clock: C) -> Self {
        MemoryRemote { clock, state: Mutex::new(State::default()) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends behaviours for calls of `action`: each call takes the next one, and once they
    /// run out calls succeed.
    pub fn script(&self, action: &str, behaviours: impl IntoIterator<Item = Behaviour>) {
        self.state().scripts.entry(action.to_owned()).or_default().extend(behaviours);
    }

    /// Drops what is left of `action`'s script: its calls succeed from now on.
    pub fn unscript(&self, action: &str) {
        self.state().scripts.remove(action);
    }

    /// Takes the service down as `outage` says, whatever the scripts of its actions.
    pub fn outage(&self, outage: Outage) {
        self.state().outages.push((outage, 0, 0));
    }

    /// Ends every outage now, recovery included: from now on only the scripts fail calls.
    pub fn end_outages(&self) {
        let now = self.clock.now();
        for (outage, _, _) in &mut self.state().outages {
            outage.from = outage.from.min(now);
            outage.until = outage.until.min(now);
            outage.recovery = Duration::ZERO;
        }
    }

    /// Throttles calls as `throttle` says, whatever the scripts of its actions.
    pub fn throttle(&self, throttle: Throttle) {
        let draws = SplitMix::seeded(throttle.seed);
        self.state().throttles.push(Throttling { throttle, taken: VecDeque::new(), draws });
    }

    /// Ends every throttle now: from now on the service takes every call it is up to.
    pub fn end_throttling(&self) {
        self.state().throttles.clear();
    }

    /// Every outage given, in order, with how many calls it failed.
    pub fn outages(&self) -> Vec<(Outage, u32)> {
        self.state().outages.iter().map(|(o, failed, _)| (o.clone(), *failed)).collect()
    }

    /// How many calls carried `key`, including those that failed or came too late.
    pub fn calls(&self, key: &str) -> u32 {
        self.state().calls.get(key).copied().unwrap_or(0)
    }

    /// How many times the effect of `key` took place: 0 or 1, unless deduplication is broken.
    pub fn applications(&self, key: &str) -> u32 {
        let state = self.state();
        state.by_key.get(key).and_then(|&at| state.ledger.get(at)).map_or(0, |e| e.applications)
    }

    /// The most applications of any one key; a test asserts it is at most 1.
    pub fn max_applications(&self) -> u32 {
        self.state().ledger.iter().map(|e| e.applications).max().unwrap_or(0)
    }

    /// Turns deduplication off, as a broken service would have it: a repeated key applies its
    /// effect again. For tests that must show their checks catch a double effect.
    pub fn forget_keys(&self) {
        self.state().forgetful = true;
    }

    /// The effects in place, as the business counts them, whatever keys they came with: for
    /// each order and each `(action, undo action)` pair in `steps`, the applications of the
    /// action minus the applications of its undo that undid something (an undo of nothing is a
    /// no-op). 1 is a step in effect, 0 one never done or undone; anything else is wrong.
    pub fn in_place(&self, steps: &[(String, Option<String>)]) -> HashMap<(OrderId, String), i64> {
        let mut counts: HashMap<(OrderId, String), i64> = HashMap::new();
        for e in &self.state().ledger {
            if e.output.get("noop").is_some() {
                continue;
            }
            let step = steps.iter().find(|(action, undo)| match e.direction {
                Direction::Do => *action == e.action,
                Direction::Undo => undo.as_deref() == Some(e.action.as_str()),
            });
            if let Some((action, _)) = step {
                let sign = if e.direction == Direction::Do { 1 } else { -1 };
                *counts.entry((e.order_id, action.clone())).or_default() +=
                    sign * i64::from(e.applications);
            }
        }
        counts
    }

    /// Whether the effect of `key` took place (a no-op undo counts: it is recorded).
    pub fn applied(&self, key: &str) -> bool {
        self.state().by_key.contains_key(key)
    }

    /// How many calls met each scripted fault so far.
    pub fn faults(&self) -> RemoteFaults {
        self.state().faults
    }

    /// Every effect, in the order applied.
    pub fn ledger(&self) -> Vec<LedgerEntry> {
        self.state().ledger.clone()
    }

    /// How many effects the ledger holds; it only ever grows.
    pub fn ledger_len(&self) -> usize {
        self.state().ledger.len()
    }
}

impl State {
    /// Carries out the call's effect once per key, as the service's own logic would.
    fn apply(&mut self, call: &RemoteCall) -> Result<serde_json::Value, RemoteFault> {
        self.apply_answering(call, 0)
    }

    /// Counts a call whose values are not whole: a reference to a stored value passed on as
    /// it is, or an undo told something other than what its step answered.
    fn check_values(&mut self, call: &RemoteCall) {
        let referred = std::iter::once(call.order.input())
            .chain(call.input.iter())
            .chain(call.outputs.values())
            .any(crate::payload::is_reference);
        let undo_misinformed = call.direction == Direction::Undo
            && call.input.as_ref().is_some_and(|input| {
                let done = call
                    .idempotency_key
                    .rsplit_once('/')
                    .map(|(step, _)| format!("{step}/{}", Direction::Do.as_str()));
                let answered = done.and_then(|k| self.by_key.get(&k)).map(|&at| &self.ledger[at]);
                answered.is_some_and(|entry| &entry.output != input)
            });
        if referred || undo_misinformed {
            self.faults.misread += 1;
        }
    }

    /// As [`State::apply`], a new effect answering `padding` bytes more than it would.
    fn apply_answering(
        &mut self,
        call: &RemoteCall,
        padding: usize,
    ) -> Result<serde_json::Value, RemoteFault> {
        self.check_values(call);
        let key = call.idempotency_key.as_str();
        // The step's other direction shares everything in the key up to the last '/'.
        let counterpart = |direction: Direction| {
            key.rsplit_once('/').map(|(step, _)| format!("{step}/{}", direction.as_str()))
        };
        let noop = match call.direction {
            Direction::Do => {
                // Checked before deduplication: once a step is compensated, every `do` of it is
                // refused, whether or not an earlier one went through.
                if counterpart(Direction::Undo).is_some_and(|k| self.by_key.contains_key(&k)) {
                    return Err(RemoteFault::Permanent("cancelled: already compensated".into()));
                }
                false
            }
            Direction::Undo => {
                !counterpart(Direction::Do).is_some_and(|k| self.by_key.contains_key(&k))
            }
        };
        if let Some(&at) = self.by_key.get(key) {
            let forgetful = self.forgetful;
            let effect = &mut self.ledger[at];
            if forgetful {
                effect.applications += 1;
            }
            return Ok(effect.output.clone());
        }
        self.next_ref += 1;
        let reference = format!("{}-{}", call.action, self.next_ref);
        let mut output = if noop {
            json!({ "ref": reference, "noop": true })
        } else {
            json!({ "ref": reference })
        };
        if padding > 0 {
            output["statement"] = "x".repeat(padding).into();
        }
        self.by_key.insert(key.to_owned(), self.ledger.len());
        self.ledger.push(LedgerEntry {
            key: key.to_owned(),
            order_id: call.order_id,
            action: call.action.clone(),
            direction: call.direction,
            applications: 1,
            output: output.clone(),
        });
        Ok(output)
    }
}

fn transient(reason: &str) -> RemoteFault {
    RemoteFault::Transient(reason.to_owned())
}

impl<C: Clock> RemoteService for MemoryRemote<C> {
    async fn call(&self, call: &RemoteCall) -> Result<serde_json::Value, RemoteFault> {
        let behaviour = {
            let mut state = self.state();
            *state.calls.entry(call.idempotency_key.clone()).or_default() += 1;
            if call.deadline <= self.clock.now() {
                // The caller gives up before sending, so the script is left for real calls.
                return Err(transient("deadline passed"));
            }
            let now = self.clock.now();
            let known = state.by_key.contains_key(&call.idempotency_key);
            let down = state.outages.iter_mut().find_map(|(o, failed, debt)| {
                o.fails(&call.action, now, debt).then_some((failed, o.refusal.clone()))
            });
            match down {
                Some((failed, None)) => {
                    *failed += 1;
                    state.faults.outage += 1;
                    return Err(transient("unavailable: outage"));
                }
                Some((failed, Some(reason))) if !known => {
                    *failed += 1;
                    state.faults.denied += 1;
                    return Err(RemoteFault::Permanent(reason));
                }
                Some((_, Some(_))) => return state.apply(call),
                None => {}
            }
            let turned_away = state
                .throttles
                .iter_mut()
                .find(|t| t.throttle.actions.contains(&call.action))
                .and_then(|t| t.turns_away(now).then_some(t.throttle.retry_after));
            if let Some(retry_after) = turned_away {
                state.faults.throttled += 1;
                let reason = "429 Too Many Requests".to_owned();
                return Err(RemoteFault::Throttled { reason, retry_after });
            }
            if state.in_progress.contains(&call.idempotency_key) {
                return Err(transient("a call with this key is in progress"));
            }
            if let Some(reason) = state.refused.get(&call.idempotency_key) {
                return Err(RemoteFault::Permanent(reason.clone()));
            }
            let scripted = state
                .scripts
                .get_mut(&call.action)
                .and_then(VecDeque::pop_front)
                .unwrap_or(Behaviour::Succeed);
            match scripted {
                // Refusing is a decision about a new action: a known key gets its answer.
                Behaviour::Permanent(_) if state.by_key.contains_key(&call.idempotency_key) => {
                    Behaviour::Succeed
                }
                other => other,
            }
        };
        match behaviour {
            Behaviour::Succeed => self.state().apply(call),
            Behaviour::Transient => {
                self.state().faults.transient += 1;
                Err(transient("unavailable"))
            }
            Behaviour::Permanent(reason) => {
                let mut state = self.state();
                state.faults.permanent += 1;
                state.refused.insert(call.idempotency_key.clone(), reason.clone());
                Err(RemoteFault::Permanent(reason))
            }
            Behaviour::Large(bytes) => {
                let mut state = self.state();
                state.faults.large += 1;
                state.apply_answering(call, bytes)
            }
            Behaviour::Oversize => {
                let mut state = self.state();
                state.faults.oversize += 1;
                state.apply_answering(call, crate::payload::MAX_PAYLOAD_LEN)
            }
            Behaviour::ApplyThenLoseAnswer => {
                let mut state = self.state();
                state.faults.lost_answers += 1;
                let _lost = state.apply(call);
                Err(transient("answer lost"))
            }
            Behaviour::Slow(duration) => {
                self.state().in_progress.insert(call.idempotency_key.clone());
                self.clock.sleep(duration).await;
                let mut state = self.state();
                state.in_progress.remove(&call.idempotency_key);
                let answer = state.apply(call);
                if call.deadline <= self.clock.now() {
                    // The service finished after the caller stopped waiting: the effect is in
                    // place, but all the caller knows is that it timed out.
                    state.faults.timeouts += 1;
                    Err(transient("timeout"))
                } else {
                    answer
                }
            }
        }
    }
}

impl<C> fmt::Debug for MemoryRemote<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("MemoryRemote").field("ledger", &state.ledger).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{IdempotencyKey, step_key};
    use crate::memory::ManualClock;
    use crate::order::Order;
    use crate::time::Timestamp;

    fn order_id() -> OrderId {
        OrderId::for_key(&IdempotencyKey::parse("order-1").unwrap())
    }

    fn order() -> Order {
        let body = json!({
            "customer_id": "cust-42",
            "currency": "EUR",
            "items": [{"sku": "BOOK-1", "quantity": 2, "unit_price": 1250}],
            "ship_to": {"name": "Ada Lovelace", "line1": "12 St James's Square",
                        "city": "London", "postal_code": "SW1Y 4JH", "country": "GB"}
        });
        Order(body)
    }

    fn setup() -> (ManualClock, MemoryRemote<ManualClock>) {
        let clock = ManualClock::default();
        (clock.clone(), MemoryRemote::new(clock))
    }

    /// A call of step `charge`, with a deadline a minute after `now`.
    fn call(direction: Direction, now: Timestamp) -> RemoteCall {
        RemoteCall {
            order_id: order_id(),
            action: match direction {
                Direction::Do => "charge".into(),
                Direction::Undo => "refund".into(),
            },
            direction,
            idempotency_key: step_key(order_id(), "charge", direction, 0),
            order: order(),
            input: None,
            outputs: Default::default(),
            deadline: now.plus(Duration::from_secs(60)),
        }
    }

    fn do_key() -> String {
        step_key(order_id(), "charge", Direction::Do, 0)
    }

    fn undo_key() -> String {
        step_key(order_id(), "charge", Direction::Undo, 0)
    }

    #[tokio::test]
    async fn a_repeated_key_answers_the_same_and_applies_once() {
        let (clock, remote) = setup();
        let first = remote.call(&call(Direction::Do, clock.now())).await.unwrap();
        assert_eq!(first, json!({ "ref": "charge-1" }));
        let again = remote.call(&call(Direction::Do, clock.now())).await.unwrap();
        assert_eq!(again, first);
        assert_eq!(remote.calls(&do_key()), 2);
        assert_eq!(remote.applications(&do_key()), 1);
        assert_eq!(remote.max_applications(), 1);
        assert!(remote.applied(&do_key()));
        let ledger = remote.ledger();
        assert_eq!(ledger.len(), 1);
        assert_eq!((ledger[0].action.as_str(), ledger[0].direction), ("charge", Direction::Do));
        assert_eq!(ledger[0].order_id, order_id());
    }

    #[tokio::test]
    async fn an_undo_tombstones_the_step_against_a_late_do() {
        let (clock, remote) = setup();
        let undo = remote.call(&call(Direction::Undo, clock.now())).await.unwrap();
        assert_eq!(undo, json!({ "ref": "refund-1", "noop": true }));
        let late = remote.call(&call(Direction::Do, clock.now())).await.unwrap_err();
        assert_eq!(late, RemoteFault::Permanent("cancelled: already compensated".into()));
        assert!(!remote.applied(&do_key()));
        assert_eq!(remote.calls(&do_key()), 1);
        assert_eq!(remote.ledger().len(), 1);
    }

    #[tokio::test]
    async fn an_undo_after_a_do_is_a_real_compensation_and_blocks_repeats() {
        let (clock, remote) = setup();
        remote.call(&call(Direction::Do, clock.now())).await.unwrap();
        let undo = remote.call(&call(Direction::Undo, clock.now())).await.unwrap();
        assert_eq!(undo, json!({ "ref": "refund-2" }));
        assert!(remote.call(&call(Direction::Do, clock.now())).await.is_err());
        assert_eq!(remote.ledger().len(), 2);
        assert_eq!(remote.max_applications(), 1);
    }

    #[tokio::test]
    async fn a_lost_answer_leaves_the_effect_and_a_retry_gets_it() {
        let (clock, remote) = setup();
        remote.script("charge", [Behaviour::ApplyThenLoseAnswer]);
        let lost = remote.call(&call(Direction::Do, clock.now())).await.unwrap_err();
        assert_eq!(lost, RemoteFault::Transient("answer lost".into()));
        assert!(remote.applied(&do_key()));
        let retry = remote.call(&call(Direction::Do, clock.now())).await.unwrap();
        assert_eq!(retry, json!({ "ref": "charge-1" }));
        assert_eq!(remote.applications(&do_key()), 1);
    }

    #[tokio::test]
    async fn a_slow_call_past_its_deadline_times_out_but_still_applies() {
        let (clock, remote) = setup();
        remote.script(
            "charge",
            [Behaviour::Slow(Duration::from_secs(60)), Behaviour::Slow(Duration::from_secs(5))],
        );
        let c = call(Direction::Do, clock.now());
        let err = remote.call(&c).await.unwrap_err();
        assert_eq!(err, RemoteFault::Transient("timeout".into()));
        assert!(remote.applied(&do_key()));
        assert_eq!(clock.now(), c.deadline);

        let within = call(Direction::Do, clock.now());
        assert_eq!(remote.call(&within).await.unwrap(), json!({ "ref": "charge-1" }));
        assert_eq!(remote.applications(&do_key()), 1);
    }

    #[tokio::test]
    async fn a_call_past_its_deadline_does_nothing_and_keeps_the_script() {
        let (clock, remote) = setup();
        remote.script("charge", [Behaviour::Transient]);
        let c = call(Direction::Do, clock.now());
        clock.set(c.deadline);
        assert_eq!(
            remote.call(&c).await.unwrap_err(),
            RemoteFault::Transient("deadline passed".into())
        );
        assert_eq!(remote.calls(&do_key()), 1);
        assert!(!remote.applied(&do_key()));
        let fresh = call(Direction::Do, clock.now());
        assert_eq!(
            remote.call(&fresh).await.unwrap_err(),
            RemoteFault::Transient("unavailable".into())
        );
    }

    #[tokio::test]
    async fn a_script_plays_in_order_then_calls_succeed() {
        let (clock, remote) = setup();
        remote.script("charge", [Behaviour::Transient]);
        remote.script("charge", [Behaviour::Permanent("card declined".into())]);
        remote.script("refund", [Behaviour::Transient]);
        let c = call(Direction::Do, clock.now());
        assert_eq!(
            remote.call(&c).await.unwrap_err(),
            RemoteFault::Transient("unavailable".into())
        );
        assert_eq!(
            remote.call(&c).await.unwrap_err(),
            RemoteFault::Permanent("card declined".into())
        );
        assert!(!remote.applied(&do_key()));
        // The refusal stands for that key; a new key is a new decision.
        assert_eq!(
            remote.call(&c).await.unwrap_err(),
            RemoteFault::Permanent("card declined".into())
        );
        assert_eq!(remote.calls(&do_key()), 3);
        let other = RemoteCall { idempotency_key: format!("{}-other", do_key()), ..c.clone() };
        assert_eq!(remote.call(&other).await.unwrap(), json!({ "ref": "charge-1" }));
        assert!(!remote.applied(&undo_key()));
        assert_eq!(remote.calls(&undo_key()), 0);
        assert_eq!(remote.applications("unknown"), 0);
    }

    #[tokio::test]
    async fn a_refusal_is_only_ever_for_a_new_key() {
        let (clock, remote) = setup();
        remote.script("charge", [Behaviour::ApplyThenLoseAnswer]);
        remote.script("charge", [Behaviour::Permanent("card declined".into())]);
        let c = call(Direction::Do, clock.now());
        assert!(remote.call(&c).await.is_err());
        // The charge went through: a retry learns so, whatever the service would say to a
        // new charge.
        assert_eq!(remote.call(&c).await.unwrap(), json!({ "ref": "charge-1" }));
    }

    /// A clock whose sleeps last until the test lets them end.
    struct GatedClock {
        clock: ManualClock,
        gate: tokio::sync::Notify,
    }

    impl Clock for GatedClock {
        fn now(&self) -> Timestamp {
            self.clock.now()
        }
        async fn sleep(&self, duration: Duration) {
            self.gate.notified().await;
            self.clock.advance(duration);
        }
    }

    #[tokio::test]
    async fn a_call_meeting_a_slow_one_with_its_key_is_told_to_come_back() {
        let clock = std::sync::Arc::new(GatedClock {
            clock: ManualClock::default(),
            gate: tokio::sync::Notify::new(),
        });
        let remote = std::sync::Arc::new(MemoryRemote::new(clock.clone()));
        remote.script("charge", [Behaviour::Slow(Duration::from_secs(90))]);
        remote.script("charge", [Behaviour::Permanent("card declined".into())]);
        let c = call(Direction::Do, clock.now());
        let slow = tokio::spawn({
            let (remote, c) = (remote.clone(), c.clone());
            async move { remote.call(&c).await }
        });
        tokio::task::yield_now().await;
        assert_eq!(
            remote.call(&c).await.unwrap_err(),
            RemoteFault::Transient("a call with this key is in progress".into())
        );
        clock.gate.notify_one();
        assert!(slow.await.unwrap().is_err(), "the first call outlasted its deadline");
        // The refusal in the script was not used up by the call that met the slow one, and it
        // does not apply to a key that took effect.
        let retry = call(Direction::Do, clock.now());
        assert_eq!(remote.call(&retry).await.unwrap(), json!({ "ref": "charge-1" }));
    }

    #[tokio::test]
    async fn an_outage_fails_every_call_then_a_falling_share_and_leaves_the_script() {
        let (clock, remote) = setup();
        let start = clock.now();
        remote.script("charge", [Behaviour::Permanent("card declined".into())]);
        remote.outage(Outage {
            actions: vec!["charge".into()],
            from: start.plus(Duration::from_secs(10)),
            until: start.plus(Duration::from_secs(20)),
            flapping: None,
            recovery: Duration::from_secs(10),
            refusal: None,
        });
        clock.advance(Duration::from_secs(10));
        let other = RemoteCall { action: "ship".into(), ..call(Direction::Do, clock.now()) };
        let other = RemoteCall { idempotency_key: "ship-1".into(), ..other };
        assert!(remote.call(&other).await.is_ok(), "another action is not down");
        for _ in 0..3 {
            let down = remote.call(&call(Direction::Do, clock.now())).await.unwrap_err();
            assert_eq!(down, RemoteFault::Transient("unavailable: outage".into()));
        }
        // Half-way through its recovery, every other call fails; the first it lets through
        // meets the script the outage left alone.
        clock.advance(Duration::from_secs(15));
        let mut seen = Vec::new();
        for n in 0..4 {
            let mut c = call(Direction::Do, clock.now());
            c.idempotency_key = format!("{}-{n}", do_key());
            seen.push(match remote.call(&c).await {
                Ok(_) => "ok",
                Err(RemoteFault::Permanent(_)) => "refused",
                Err(RemoteFault::Transient(_)) => "down",
                Err(RemoteFault::Throttled { .. }) => "throttled",
            });
        }
        assert_eq!(seen, ["refused", "down", "ok", "down"]);
        assert_eq!((remote.faults().outage, remote.outages()[0].1), (5, 5));
        assert!(!remote.applied(&do_key()), "a call an outage failed applies nothing");
    }

    #[tokio::test]
    async fn a_refusing_spell_refuses_new_keys_for_good_and_answers_the_known_ones() {
        let (clock, remote) = setup();
        let start = clock.now();
        let applied = call(Direction::Do, clock.now());
        remote.call(&applied).await.unwrap();
        remote.outage(Outage {
            actions: vec!["charge".into()],
            from: start,
            until: start.plus(Duration::from_secs(60)),
            flapping: None,
            recovery: Duration::ZERO,
            refusal: Some("AccessDenied".into()),
        });
        let mut new = call(Direction::Do, clock.now());
        new.idempotency_key = format!("{}-new", do_key());
        assert_eq!(
            remote.call(&new).await.unwrap_err(),
            RemoteFault::Permanent("AccessDenied".into())
        );
        assert_eq!(remote.call(&applied).await.unwrap(), json!({ "ref": "charge-1" }));
        // Once it is over, the key refused during it goes through: nothing was decided of it.
        clock.advance(Duration::from_secs(60));
        new.deadline = clock.now().plus(Duration::from_secs(60));
        assert!(remote.call(&new).await.is_ok());
        assert_eq!((remote.faults().denied, remote.outages()[0].1), (1, 1));
    }

    #[tokio::test]
    async fn a_flapping_service_is_down_and_up_in_turns_until_its_outages_end() {
        let (clock, remote) = setup();
        let start = clock.now();
        remote.outage(Outage {
            actions: vec!["charge".into()],
            from: start,
            until: start.plus(Duration::from_secs(60)),
            flapping: Some(Duration::from_secs(2)),
            recovery: Duration::from_secs(60),
            refusal: None,
        });
        let mut seen = Vec::new();
        for _ in 0..4 {
            seen.push(remote.call(&call(Direction::Do, clock.now())).await.is_ok());
            clock.advance(Duration::from_secs(2));
        }
        assert_eq!(seen, [false, true, false, true]);
        remote.end_outages();
        assert!(remote.call(&call(Direction::Do, clock.now())).await.is_ok());
        assert_eq!(remote.faults().outage, 2);
    }

    #[tokio::test]
    async fn a_throttle_turns_away_calls_above_its_rate_and_a_share_at_random() {
        let (clock, remote) = setup();
        remote.script("charge", [Behaviour::Permanent("card declined".into())]);
        let after = Some(Duration::from_secs(2));
        let throttle = Throttle {
            actions: vec!["charge".into()],
            per_second: Some(2),
            per_mille: 0,
            retry_after: after,
            seed: 1,
        };
        remote.throttle(throttle.clone());
        let keyed = |n: u32| {
            let mut c = call(Direction::Do, clock.now());
            c.idempotency_key = format!("{}-{n}", do_key());
            c
        };
        let refused = remote.call(&keyed(0)).await.unwrap_err();
        assert!(matches!(refused, RemoteFault::Permanent(_)), "the script, after the throttle");
        clock.advance(Duration::from_millis(600));
        assert!(remote.call(&keyed(1)).await.is_ok());
        let too_many = remote.call(&keyed(2)).await.unwrap_err();
        let reason = "429 Too Many Requests".to_owned();
        assert_eq!(too_many, RemoteFault::Throttled { reason, retry_after: after });
        assert!(!remote.applied(&keyed(2).idempotency_key), "a call turned away applies nothing");
        // The first call leaves the second the service counts in.
        clock.advance(Duration::from_millis(400));
        assert!(remote.call(&keyed(3)).await.is_ok());
        assert!(remote.call(&keyed(4)).await.is_err());

        remote.end_throttling();
        remote.throttle(Throttle { per_second: None, per_mille: 1000, ..throttle });
        assert!(matches!(remote.call(&keyed(5)).await, Err(RemoteFault::Throttled { .. })));
        remote.end_throttling();
        assert!(remote.call(&keyed(5)).await.is_ok());
        assert_eq!(remote.faults().throttled, 3);
    }

    #[test]
    fn the_remote_can_be_shared_between_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<MemoryRemote<ManualClock>>();
    }

    #[tokio::test]
    async fn effects_in_place_are_counted_per_step_whatever_their_keys() {
        let (clock, remote) = setup();
        let steps = [("charge".to_owned(), Some("refund".to_owned()))];
        let in_place = |remote: &MemoryRemote<ManualClock>| {
            remote.in_place(&steps).get(&(order_id(), "charge".to_owned())).copied().unwrap_or(0)
        };
        // An undo of nothing is a no-op: nothing in place, nothing owed.
        remote.call(&call(Direction::Undo, clock.now())).await.unwrap();
        assert_eq!(in_place(&remote), 0);

        let (clock, remote) = setup();
        remote.call(&call(Direction::Do, clock.now())).await.unwrap();
        remote.call(&call(Direction::Do, clock.now())).await.unwrap();
        assert_eq!(in_place(&remote), 1, "a repeated key is one charge");
        // The same step under another key is a second charge, which no key-based count sees.
        let mut rekeyed = call(Direction::Do, clock.now());
        rekeyed.idempotency_key = step_key(order_id(), "charge", Direction::Do, 1);
        remote.call(&rekeyed).await.unwrap();
        assert_eq!(remote.max_applications(), 1);
        assert_eq!(in_place(&remote), 2);
        // Refunding the first run leaves one in place.
        remote.call(&call(Direction::Undo, clock.now())).await.unwrap();
        assert_eq!(in_place(&remote), 1);
    }

    #[tokio::test]
    async fn a_service_that_forgets_keys_applies_a_repeat_again_and_it_shows() {
        let (clock, remote) = setup();
        remote.forget_keys();
        let first = remote.call(&call(Direction::Do, clock.now())).await.unwrap();
        let again = remote.call(&call(Direction::Do, clock.now())).await.unwrap();
        assert_eq!(again, first);
        assert_eq!(remote.applications(&do_key()), 2);
        let steps = [("charge".to_owned(), Some("refund".to_owned()))];
        assert_eq!(remote.in_place(&steps)[&(order_id(), "charge".to_owned())], 2);
    }
}
