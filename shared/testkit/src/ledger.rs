//! The ledger of effects: what a team's agents (through the fakes its test gives them) and the
//! stand-ins for its HTTP services did to the world, in the order they did it, and what the
//! business demands of it: no effect in place twice, no effect undone that is not in place, a
//! processed order's effects all in place, an undone order's all gone, undone in reverse
//! dependency order.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use sas_engine::ports::RemoteCall;
use sas_engine::workflow::Workflow;
use sas_engine::{Direction, OrderId, Timestamp};

use crate::world::lock;

/// One entry of the ledger: an effect taking place, or being undone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Effect {
    /// What took effect, as the agent names it ("bucket tenants-acme", "charge ch_12").
    pub name: String,
    pub order_id: OrderId,
    /// The step whose call did it (for an undo, the step it undoes).
    pub step: String,
    /// `Do` for an effect taking place, `Undo` for one taken back.
    pub direction: Direction,
    /// The idempotency key of the call.
    pub key: String,
    /// When, on the run's clock.
    pub at: Timestamp,
}

/// The ledger of one seed's run, shared by every fake of the run. Cloning it shares it.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    entries: Arc<Mutex<Vec<Effect>>>,
    /// The run's clock, set by the kit before any call.
    now: Arc<Mutex<Option<sas_engine::memory::ManualClock>>>,
}

impl Ledger {
    /// Records that `call` made `effect` take place.
    pub fn apply(&self, call: &RemoteCall, effect: impl Into<String>) {
        self.record(call, effect.into(), Direction::Do);
    }

    /// Records that `call` took `effect` back.
    pub fn undo(&self, call: &RemoteCall, effect: impl Into<String>) {
        self.record(call, effect.into(), Direction::Undo);
    }

    /// Every entry, in the order they were recorded.
    pub fn effects(&self) -> Vec<Effect> {
        lock(&self.entries).clone()
    }

    /// The effects in place now (applied and not undone), by name, with the order that
    /// applied each.
    pub fn in_place(&self) -> HashMap<String, OrderId> {
        let mut now = HashMap::new();
        for e in lock(&self.entries).iter() {
            match e.direction {
                Direction::Do => now.insert(e.name.clone(), e.order_id),
                Direction::Undo => now.remove(&e.name),
            };
        }
        now
    }

    pub(crate) fn len(&self) -> usize {
        lock(&self.entries).len()
    }

    pub(crate) fn set_clock(&self, clock: sas_engine::memory::ManualClock) {
        *lock(&self.now) = Some(clock);
    }

    fn record(&self, call: &RemoteCall, name: String, direction: Direction) {
        use sas_engine::ports::Clock;
        let at = lock(&self.now).as_ref().map_or(Timestamp::EPOCH, |c| c.now());
        let step = step_of(&call.idempotency_key).to_owned();
        let key = call.idempotency_key.clone();
        lock(&self.entries).push(Effect {
            name,
            order_id: call.order_id,
            step,
            direction,
            key,
            at,
        });
    }

    /// The entries from `from` on, checked against those before: none applies an effect in
    /// place, none undoes one that is not, none undoes another order's effect.
    pub(crate) fn check_since(&self, from: usize) -> Result<(), (OrderId, String)> {
        let entries = lock(&self.entries);
        let mut in_place: HashMap<&str, &Effect> = HashMap::new();
        for (n, e) in entries.iter().enumerate() {
            match e.direction {
                Direction::Do => {
                    if let Some(first) = in_place.get(e.name.as_str()).filter(|_| n >= from) {
                        return Err((
                            e.order_id,
                            format!(
                                "{} took effect twice: by {} of {} (key {}), and again by {} of {} (key {}), never undone in between",
                                e.name,
                                first.step,
                                first.order_id,
                                first.key,
                                e.step,
                                e.order_id,
                                e.key
                            ),
                        ));
                    }
                    in_place.insert(&e.name, e);
                }
                Direction::Undo => match in_place.remove(e.name.as_str()) {
                    None if n >= from => {
                        return Err((
                            e.order_id,
                            format!(
                                "{} was undone by {} of {} (key {}) while not in place: undone twice, or never done",
                                e.name, e.step, e.order_id, e.key
                            ),
                        ));
                    }
                    Some(done) if done.order_id != e.order_id && n >= from => {
                        return Err((
                            e.order_id,
                            format!(
                                "{} was undone by {} of {}, but {} of {} made it",
                                e.name, e.step, e.order_id, done.step, done.order_id
                            ),
                        ));
                    }
                    _ => {}
                },
            }
        }
        Ok(())
    }

    /// What an order that ended so must have left: everything it did in place if it
    /// `kept` it (processed), nothing if not (undone, cancelled) but the effects of the steps
    /// `listed` for the operators to undo by hand; and an undone order undid a step's effects
    /// only once every step depending on it had its own undone, but for the steps whose undo
    /// failed (`late`), which an operator's redrive undoes after.
    pub(crate) fn check_end(
        &self,
        order: OrderId,
        workflow: &Workflow,
        kept: bool,
        listed: &[String],
        late: &[String],
    ) -> Result<(), String> {
        let entries = lock(&self.entries);
        let mine: Vec<&Effect> = entries.iter().filter(|e| e.order_id == order).collect();
        let mut in_place: HashMap<&str, &Effect> = HashMap::new();
        for e in &mine {
            match e.direction {
                Direction::Do => in_place.insert(&e.name, e),
                Direction::Undo => in_place.remove(e.name.as_str()),
            };
        }
        if kept {
            // The last run of each step is what a processed order keeps: an effect undone by
            // a compensation that an operator's redrive ran again is in place again.
            let undone = mine.iter().enumerate().filter(|(n, u)| {
                u.direction == Direction::Undo
                    && !mine[n + 1..]
                        .iter()
                        .any(|d| d.direction == Direction::Do && d.step == u.step)
            });
            let undone: Vec<&&Effect> = undone.map(|(_, u)| u).collect();
            if let Some(u) = undone.first() {
                return Err(format!(
                    "processed, but {} (done by {}) was undone at {} and not done again",
                    u.name, u.step, u.at
                ));
            }
            return Ok(());
        }
        let unlisted = in_place.values().filter(|e| !listed.contains(&e.step));
        if let Some(left) = unlisted.min_by_key(|e| e.at) {
            return Err(format!(
                "undone, but {} (done by {} at {}, key {}) is still in place, and not on the operators' list",
                left.name, left.step, left.at, left.key
            ));
        }
        // The last compensation: the undos after the last effect done.
        let last_do = mine.iter().rposition(|e| e.direction == Direction::Do);
        let undos: Vec<&&Effect> = mine
            .iter()
            .skip(last_do.map_or(0, |n| n + 1))
            .filter(|e| e.direction == Direction::Undo)
            .collect();
        for (n, earlier) in undos.iter().enumerate() {
            let after: HashSet<&str> = downstream_all(workflow, &earlier.step);
            let out_of_order = undos[n + 1..]
                .iter()
                .find(|l| after.contains(l.step.as_str()) && !late.contains(&l.step));
            if let Some(late) = out_of_order {
                return Err(format!(
                    "{} (of {}) was undone before {} (of {}), though {} depends on {}: undos go in reverse dependency order",
                    earlier.name, earlier.step, late.name, late.step, late.step, earlier.step
                ));
            }
        }
        Ok(())
    }
}

/// The step a call's idempotency key names: `<order>/<step>/...`.
pub(crate) fn step_of(key: &str) -> &str {
    key.split('/').nth(1).unwrap_or(key)
}

/// Every step that depends on `step`, directly or through others.
fn downstream_all<'a>(workflow: &'a Workflow, step: &str) -> HashSet<&'a str> {
    let mut found: HashSet<&str> = HashSet::new();
    let mut next: Vec<&str> = workflow.downstream(step).into_iter().collect();
    while let Some(s) = next.pop() {
        if found.insert(s) {
            next.extend(workflow.downstream(s));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use sas_engine::ids::step_key;
    use sas_engine::order::Order;

    const WORKFLOW: &str = r#"{"name": "w", "version": 1, "steps": [
        {"name": "a", "agent": "x", "budget_seconds": 5, "compensation": {"action": "undo-a", "budget_seconds": 5}},
        {"name": "b", "agent": "x", "budget_seconds": 5, "depends_on": ["a"],
         "compensation": {"action": "undo-b", "budget_seconds": 5}}]}"#;

    fn call(order: OrderId, step: &str, direction: Direction) -> RemoteCall {
        RemoteCall {
            order_id: order,
            action: step.to_owned(),
            direction,
            idempotency_key: step_key(order, step, direction, 0),
            order: Order(serde_json::json!({})),
            input: None,
            outputs: Default::default(),
            deadline: Timestamp::EPOCH,
        }
    }

    fn workflow() -> Workflow {
        Workflow::from_json(WORKFLOW, &Workflow::agents_in(WORKFLOW)).unwrap()
    }

    #[test]
    fn an_effect_in_place_twice_or_undone_twice_is_named_with_both_keys() {
        let (ledger, order) =
            (Ledger::default(), "6d6c3a0f-62d2-5ab7-bc33-e182e1459fbf".parse::<OrderId>().unwrap());
        ledger.apply(&call(order, "a", Direction::Do), "bucket b-1");
        ledger.apply(&call(order, "a", Direction::Do), "bucket b-1");
        let (_, twice) = ledger.check_since(0).unwrap_err();
        assert!(twice.starts_with("bucket b-1 took effect twice"), "{twice}");

        let (ledger, order) =
            (Ledger::default(), "6d6c3a0f-62d2-5ab7-bc33-e182e1459fbf".parse::<OrderId>().unwrap());
        ledger.apply(&call(order, "a", Direction::Do), "bucket b-1");
        ledger.undo(&call(order, "a", Direction::Undo), "bucket b-1");
        assert!(ledger.check_since(0).is_ok());
        ledger.undo(&call(order, "a", Direction::Undo), "bucket b-1");
        let (_, again) = ledger.check_since(2).unwrap_err();
        assert!(again.contains("undone twice, or never done"), "{again}");
    }

    #[test]
    fn an_undo_before_the_undo_of_a_step_depending_on_it_breaks_the_order() {
        let (ledger, order) =
            (Ledger::default(), "6d6c3a0f-62d2-5ab7-bc33-e182e1459fbf".parse::<OrderId>().unwrap());
        ledger.apply(&call(order, "a", Direction::Do), "bucket");
        ledger.apply(&call(order, "b", Direction::Do), "domain");
        ledger.undo(&call(order, "a", Direction::Undo), "bucket");
        ledger.undo(&call(order, "b", Direction::Undo), "domain");
        let broken = ledger.check_end(order, &workflow(), false, &[], &[]).unwrap_err();
        assert!(broken.contains("reverse dependency order"), "{broken}");

        let (ledger, order) =
            (Ledger::default(), "6d6c3a0f-62d2-5ab7-bc33-e182e1459fbf".parse::<OrderId>().unwrap());
        ledger.apply(&call(order, "a", Direction::Do), "bucket");
        ledger.apply(&call(order, "b", Direction::Do), "domain");
        ledger.undo(&call(order, "b", Direction::Undo), "domain");
        ledger.undo(&call(order, "a", Direction::Undo), "bucket");
        assert_eq!(ledger.check_end(order, &workflow(), false, &[], &[]), Ok(()));
        let kept = ledger.check_end(order, &workflow(), true, &[], &[]).unwrap_err();
        // An undo that failed, redriven by an operator, comes after the undos it should
        // have preceded.
        let (ledger, order) = (Ledger::default(), order);
        ledger.apply(&call(order, "a", Direction::Do), "bucket");
        ledger.apply(&call(order, "b", Direction::Do), "domain");
        ledger.undo(&call(order, "a", Direction::Undo), "bucket");
        ledger.undo(&call(order, "b", Direction::Undo), "domain");
        assert_eq!(ledger.check_end(order, &workflow(), false, &[], &["b".into()]), Ok(()));
        assert!(kept.starts_with("processed, but domain"), "{kept}");
    }

    #[test]
    fn an_effect_left_by_an_undone_order_is_fine_only_on_the_operators_list() {
        let (ledger, order) =
            (Ledger::default(), "6d6c3a0f-62d2-5ab7-bc33-e182e1459fbf".parse::<OrderId>().unwrap());
        ledger.apply(&call(order, "a", Direction::Do), "bucket");
        let left = ledger.check_end(order, &workflow(), false, &[], &[]).unwrap_err();
        assert!(left.contains("still in place, and not on the operators' list"), "{left}");
        assert_eq!(ledger.check_end(order, &workflow(), false, &["a".into()], &[]), Ok(()));
    }
}
