//! The simulated service without its HTTP: one call in, one outcome and a latency out, with
//! the ledger and the statistics updated. Time comes in as seconds since the service started,
//! so outage windows are tested without waiting.
//!
//! A call meets the faults in this order, and the first that fires decides:
//!
//! 1. an outage window covering `now` (503, nothing applied);
//! 2. throttling (429, nothing applied);
//! 3. a transient fault (503, nothing applied);
//! 4. the ledger: a `do` of an undone step is refused (tombstone); a key already applied
//!    answers its recorded output (or, with `forget_keys`, takes effect again);
//! 5. a denial of the caller (403, nothing applied) or a permanent refusal of the key (422,
//!    nothing applied), only for keys not yet applied, since a service that did something
//!    says so rather than declining it afterwards;
//! 6. the effect is applied; then the answer may be lost (503, effect in place).
//!
//! Infrastructure faults (1 to 3) come before the ledger because they happen in front of the
//! service's logic: a replay can be throttled too. A lost answer can hit a replay as well.
//! The latency applies to every call, whatever its outcome.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::faults::FaultConfig;
use crate::ledger::{Call, Check, Ledger};

/// What became of one call.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The effect was applied now; this is its output.
    Applied(Value),
    /// The key had already been applied; this is the recorded output.
    Replayed(Value),
    /// Refused for good; nothing applied.
    Permanent(String),
    /// The caller was refused (its grant or credentials); nothing applied.
    Denied(String),
    /// A `do` of a step already undone; refused for good, nothing applied.
    Tombstoned,
    /// Failed transiently; nothing applied.
    Transient,
    /// Throttled; nothing applied.
    Throttled,
    /// Applied (or replayed), but the answer is lost: the caller sees a transient fault.
    LostAnswer,
    /// The service is in an outage window; nothing applied.
    Outage,
}

impl Outcome {
    /// The outcome's name, as counted in [`Counts`]: `ok`, `replayed`, `permanent`, `denied`,
    /// `tombstoned`, `transient`, `throttled`, `lost_answer` or `outage`.
    pub fn kind(&self) -> &'static str {
        match self {
            Outcome::Applied(_) => "ok",
            Outcome::Replayed(_) => "replayed",
            Outcome::Permanent(_) => "permanent",
            Outcome::Denied(_) => "denied",
            Outcome::Tombstoned => "tombstoned",
            Outcome::Transient => "transient",
            Outcome::Throttled => "throttled",
            Outcome::LostAnswer => "lost_answer",
            Outcome::Outage => "outage",
        }
    }
}

/// The outcome of a call and how long the service takes to give it.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    pub outcome: Outcome,
    /// How long to wait before answering. The effect, if any, is already in the ledger: a
    /// caller that gives up in the meantime still leaves it in place, as with a real service
    /// that is slow to answer.
    pub latency: Duration,
    /// A file whose existence holds the answer back (see [`crate::faults::Faults::hold_while`]).
    pub hold_while: Option<String>,
}

/// Calls counted by outcome. All zero by default.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Every call.
    pub total: u64,
    /// Applied now (no-op undos included).
    pub ok: u64,
    pub replayed: u64,
    pub permanent: u64,
    pub denied: u64,
    pub transient: u64,
    pub throttled: u64,
    pub lost_answer: u64,
    pub outage: u64,
    pub tombstoned: u64,
    /// The most calls that arrived within one second (whole seconds since the service
    /// started), whatever their outcome.
    pub busiest_second: u64,
}

impl Counts {
    fn count(&mut self, outcome: &Outcome) {
        self.total += 1;
        let slot = match outcome {
            Outcome::Applied(_) => &mut self.ok,
            Outcome::Replayed(_) => &mut self.replayed,
            Outcome::Permanent(_) => &mut self.permanent,
            Outcome::Denied(_) => &mut self.denied,
            Outcome::Tombstoned => &mut self.tombstoned,
            Outcome::Transient => &mut self.transient,
            Outcome::Throttled => &mut self.throttled,
            Outcome::LostAnswer => &mut self.lost_answer,
            Outcome::Outage => &mut self.outage,
        };
        *slot += 1;
    }
}

/// Calls counted by outcome, over all actions and for each. Serialized flat, with the
/// per-action counts under `actions`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    #[serde(flatten)]
    pub all: Counts,
    pub actions: BTreeMap<String, Counts>,
    /// Calls counted by outcome for every key that met a fault (a refusal, an outage, a
    /// transient fault, throttling or a lost answer), so that a failed step can be traced to
    /// what the service did to it. Keys that only ever succeeded are not kept.
    #[serde(skip)]
    pub faulted_keys: BTreeMap<String, Counts>,
    /// Calls so far in the current second, over all actions and for each: (second, calls).
    #[serde(skip)]
    seconds: BTreeMap<Option<String>, (u64, u64)>,
}

impl Stats {
    /// Counts a call of `action` arriving at `now_s`, in its second; returns how many calls
    /// of the action that second holds with it.
    fn arrive(&mut self, action: &str, now_s: f64) -> u64 {
        let second = now_s.max(0.0).floor() as u64;
        let mut count = |scope: Option<String>| {
            let slot = self.seconds.entry(scope).or_insert((second, 0));
            if slot.0 != second {
                *slot = (second, 0);
            }
            slot.1 += 1;
            slot.1
        };
        let all = count(None);
        let own = count(Some(action.to_owned()));
        self.all.busiest_second = self.all.busiest_second.max(all);
        let counts = self.actions.entry(action.to_owned()).or_default();
        counts.busiest_second = counts.busiest_second.max(own);
        own
    }
}

/// The service: fault configuration, ledger and statistics. Starts empty with the given
/// configuration.
#[derive(Clone, Debug, Default)]
pub struct Simulator {
    config: FaultConfig,
    ledger: Ledger,
    stats: Stats,
}

impl Simulator {
    /// A service with this (already validated) configuration and nothing done yet.
    pub fn new(config: FaultConfig) -> Self {
        Simulator { config, ledger: Ledger::default(), stats: Stats::default() }
    }

    /// Serves one call arriving `now_s` seconds after the service started.
    pub fn handle(&mut self, call: &Call, now_s: f64) -> Answer {
        let faults = self.config.for_action(&call.action);
        let nth = self.ledger.note_call(&call.key);
        let draws = faults.draws(&call.key, nth);
        let this_second = self.stats.arrive(&call.action, now_s);
        let outcome = if faults.in_outage(now_s) {
            Outcome::Outage
        } else if faults.beyond_rate(this_second) || faults.throttles(&draws) {
            Outcome::Throttled
        } else if faults.fails_transiently(&draws) {
            Outcome::Transient
        } else {
            match self.ledger.check(call) {
                Check::Tombstoned => Outcome::Tombstoned,
                // Deduplication off: the known key takes effect again.
                Check::Replay(_) if faults.forget_keys => {
                    let bytes = faults.output_bytes;
                    Outcome::Applied(self.ledger.apply_padded(call, false, bytes, now_s))
                }
                Check::Replay(_) if faults.loses_answer(&draws) => Outcome::LostAnswer,
                Check::Replay(output) => Outcome::Replayed(output),
                Check::New { .. } if faults.denied => Outcome::Denied(format!(
                    "AccessDenied: the caller may not {} (simulated denial)",
                    call.action
                )),
                Check::New { .. } if faults.refuses(&call.key, call.direction) => {
                    Outcome::Permanent(format!(
                        "{} refused (simulated permanent fault)",
                        call.action
                    ))
                }
                Check::New { noop } => {
                    let output = self.ledger.apply_padded(call, noop, faults.output_bytes, now_s);
                    if faults.loses_answer(&draws) {
                        Outcome::LostAnswer
                    } else {
                        Outcome::Applied(output)
                    }
                }
            }
        };
        self.stats.all.count(&outcome);
        self.stats.actions.entry(call.action.clone()).or_default().count(&outcome);
        let faulted = !matches!(outcome, Outcome::Applied(_) | Outcome::Replayed(_));
        if faulted || self.stats.faulted_keys.contains_key(&call.key) {
            self.stats.faulted_keys.entry(call.key.clone()).or_default().count(&outcome);
        }
        Answer { outcome, latency: faults.latency(&draws), hold_while: faults.hold_while }
    }

    /// The configuration in force.
    pub fn config(&self) -> &FaultConfig {
        &self.config
    }

    /// Replaces the configuration (already validated); the ledger and statistics stay.
    pub fn set_config(&mut self, config: FaultConfig) {
        self.config = config;
    }

    /// The effects applied so far.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// The calls counted so far.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Empties the ledger and the statistics; the configuration stays.
    pub fn reset(&mut self) {
        self.ledger.clear();
        self.stats = Stats::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::{Faults, FaultsOverride, Outage};
    use crate::ledger::Direction;
    use serde_json::json;

    fn call(step: &str, action: &str, direction: Direction) -> Call {
        Call {
            key: format!("order-1/{step}/{}", direction.as_str()),
            order_id: "order-1".into(),
            action: action.into(),
            direction,
            outputs: serde_json::Value::Null,
            order_bytes: 0,
            input_bytes: 0,
        }
    }

    fn charge() -> Call {
        call("charge", "charge-payment", Direction::Do)
    }

    fn refund() -> Call {
        call("charge", "refund-payment", Direction::Undo)
    }

    fn with(default: Faults) -> Simulator {
        Simulator::new(FaultConfig { default, ..FaultConfig::default() })
    }

    #[test]
    fn a_service_that_forgets_keys_applies_a_repeated_key_again() {
        let mut sim = with(Faults { forget_keys: true, ..Faults::default() });
        sim.handle(&charge(), 0.0);
        let again = sim.handle(&charge(), 0.0);
        assert_eq!(again.outcome, Outcome::Applied(json!({"ref": "charge-payment-1"})));
        assert_eq!(sim.ledger().max_applications(), 2);
    }

    #[test]
    fn a_held_action_says_so_in_its_answer_and_others_do_not() {
        let held = FaultsOverride { hold_while: Some("/tmp/hold".into()), ..Default::default() };
        let config = FaultConfig {
            actions: [("charge-payment".to_owned(), held)].into(),
            ..FaultConfig::default()
        };
        let mut sim = Simulator::new(config);
        assert_eq!(sim.handle(&charge(), 0.0).hold_while.as_deref(), Some("/tmp/hold"));
        assert_eq!(sim.handle(&refund(), 0.0).hold_while, None);
    }

    #[test]
    fn a_perfect_service_applies_once_and_replays() {
        let mut sim = Simulator::default();
        let first = sim.handle(&charge(), 0.0);
        assert_eq!(first.outcome, Outcome::Applied(json!({"ref": "charge-payment-1"})));
        assert_eq!(first.latency, Duration::ZERO);
        let again = sim.handle(&charge(), 0.0);
        assert_eq!(again.outcome, Outcome::Replayed(json!({"ref": "charge-payment-1"})));
        assert_eq!(sim.ledger().max_applications(), 1);
        assert_eq!(
            (sim.stats().all.ok, sim.stats().all.replayed, sim.stats().all.total),
            (1, 1, 2)
        );
    }

    #[test]
    fn undo_semantics_follow_the_ledger() {
        let mut sim = Simulator::default();
        let noop = sim.handle(&refund(), 0.0).outcome;
        assert_eq!(noop, Outcome::Applied(json!({"ref": "refund-payment-1", "noop": true})));
        assert_eq!(sim.handle(&charge(), 0.0).outcome, Outcome::Tombstoned);
        assert_eq!(sim.stats().all.tombstoned, 1);
        assert!(sim.ledger().effect(&charge().key).is_none());
    }

    #[test]
    fn outages_refuse_everything_inside_the_window_only() {
        let mut sim = with(Faults {
            outages: vec![Outage { start_s: 10.0, end_s: 20.0 }],
            ..Faults::default()
        });
        assert_eq!(sim.handle(&charge(), 10.0).outcome, Outcome::Outage);
        assert_eq!(sim.handle(&charge(), 19.5).outcome, Outcome::Outage);
        assert!(sim.ledger().effects().is_empty());
        assert!(matches!(sim.handle(&charge(), 20.0).outcome, Outcome::Applied(_)));
        // A replay during an outage is refused too: the service is down, not forgetful.
        assert_eq!(sim.handle(&charge(), 15.0).outcome, Outcome::Outage);
        assert_eq!(sim.ledger().calls(&charge().key), 4);
        assert_eq!(sim.stats().all.outage, 3);
    }

    #[test]
    fn transient_and_throttled_calls_apply_nothing() {
        let mut sim = with(Faults { transient_rate: 1.0, ..Faults::default() });
        assert_eq!(sim.handle(&charge(), 0.0).outcome, Outcome::Transient);
        sim.set_config(FaultConfig {
            default: Faults { throttle_rate: 1.0, transient_rate: 1.0, ..Faults::default() },
            ..FaultConfig::default()
        });
        // Throttling is decided first.
        assert_eq!(sim.handle(&charge(), 0.0).outcome, Outcome::Throttled);
        assert!(sim.ledger().effects().is_empty());
        assert_eq!((sim.stats().all.transient, sim.stats().all.throttled), (1, 1));
    }

    #[test]
    fn a_rate_limit_throttles_the_calls_beyond_it_in_each_second_and_the_busiest_is_counted() {
        let mut sim = Simulator::new(FaultConfig {
            actions: [(
                "charge-payment".to_owned(),
                FaultsOverride { max_per_second: Some(2), ..FaultsOverride::default() },
            )]
            .into(),
            ..FaultConfig::default()
        });
        let charge = |i: usize| {
            let mut c = call(&format!("charge-{i}"), "charge-payment", Direction::Do);
            c.order_id = format!("o{i}");
            c
        };
        let outcomes: Vec<&str> = [0.1, 0.5, 0.9, 1.0, 1.2]
            .iter()
            .enumerate()
            .map(|(i, at)| sim.handle(&charge(i), *at).outcome.kind())
            .collect();
        assert_eq!(
            outcomes,
            ["ok", "ok", "throttled", "ok", "ok"],
            "two a second, per whole second"
        );
        // Another action has no limit, and counts in its own second.
        for at in [1.3, 1.4, 1.5] {
            assert_eq!(
                sim.handle(&refund(), at).outcome.kind(),
                if at == 1.3 { "ok" } else { "replayed" }
            );
        }
        let stats = sim.stats();
        assert_eq!(
            stats.actions["charge-payment"].busiest_second, 3,
            "the refused call arrived too"
        );
        assert_eq!(stats.actions["refund-payment"].busiest_second, 3);
        assert_eq!(stats.all.busiest_second, 5, "second 1: two charges and three refunds");
        assert_eq!(stats.actions["charge-payment"].throttled, 1);
        assert_eq!(sim.ledger().effects().len(), 5);
        let refused = FaultConfig::from_json(r#"{"default":{"max_per_second":0}}"#).unwrap_err();
        assert!(refused.to_string().contains("max_per_second must be at least 1"), "{refused}");
    }

    #[test]
    fn a_lost_answer_applies_and_the_retry_gets_the_output() {
        let mut sim = with(Faults { lost_answer_rate: 1.0, ..Faults::default() });
        assert_eq!(sim.handle(&charge(), 0.0).outcome, Outcome::LostAnswer);
        assert!(sim.ledger().effect(&charge().key).is_some());
        sim.set_config(FaultConfig::default());
        let retry = sim.handle(&charge(), 0.0).outcome;
        assert_eq!(retry, Outcome::Replayed(json!({"ref": "charge-payment-1"})));
        assert_eq!(sim.ledger().max_applications(), 1);
        assert_eq!(sim.stats().all.lost_answer, 1);
    }

    #[test]
    fn a_permanent_refusal_sticks_to_the_key_and_spares_undos() {
        let mut sim = with(Faults { permanent_rate: 1.0, ..Faults::default() });
        for _ in 0..3 {
            assert!(matches!(sim.handle(&charge(), 0.0).outcome, Outcome::Permanent(_)));
        }
        assert!(sim.ledger().effects().is_empty());
        // The undo of the refused step is a no-op, not refused.
        let undo = sim.handle(&refund(), 0.0).outcome;
        assert_eq!(undo, Outcome::Applied(json!({"ref": "refund-payment-1", "noop": true})));
    }

    #[test]
    fn a_permanent_refusal_can_hit_undos_when_asked() {
        let mut sim =
            with(Faults { permanent_rate: 1.0, permanent_undo: true, ..Faults::default() });
        assert!(matches!(sim.handle(&refund(), 0.0).outcome, Outcome::Permanent(_)));
        assert!(sim.ledger().effects().is_empty());
    }

    #[test]
    fn a_denied_caller_gets_403_for_new_keys_and_its_answers_for_those_applied() {
        let mut sim = Simulator::default();
        sim.handle(&charge(), 0.0);
        sim.set_config(FaultConfig {
            default: Faults { denied: true, ..Faults::default() },
            ..FaultConfig::default()
        });
        assert!(matches!(sim.handle(&charge(), 0.0).outcome, Outcome::Replayed(_)));
        assert!(matches!(sim.handle(&refund(), 0.0).outcome, Outcome::Denied(_)));
        assert_eq!((sim.stats().all.denied, sim.ledger().effects().len()), (1, 1));
    }

    #[test]
    fn a_key_already_applied_is_not_refused_afterwards() {
        let mut sim = Simulator::default();
        sim.handle(&charge(), 0.0);
        sim.set_config(FaultConfig {
            default: Faults { permanent_rate: 1.0, ..Faults::default() },
            ..FaultConfig::default()
        });
        assert!(matches!(sim.handle(&charge(), 0.0).outcome, Outcome::Replayed(_)));
    }

    #[test]
    fn with_a_partial_permanent_rate_retries_get_the_same_answer() {
        let mut sim = with(Faults { permanent_rate: 0.5, seed: 7, ..Faults::default() });
        for order in 0..40 {
            let c = Call { key: format!("order-{order}/charge/do"), ..charge() };
            let first = matches!(sim.handle(&c, 0.0).outcome, Outcome::Permanent(_));
            let second = matches!(sim.handle(&c, 0.0).outcome, Outcome::Permanent(_));
            assert_eq!(first, second, "{}", c.key);
        }
        let s = &sim.stats().all;
        assert!(s.permanent > 0 && s.ok > 0, "{s:?}");
        assert_eq!(s.ok, s.replayed);
    }

    #[test]
    fn overrides_apply_to_their_action_only() {
        let mut config = FaultConfig::default();
        config.actions.insert(
            "ship".into(),
            FaultsOverride { transient_rate: Some(1.0), ..Default::default() },
        );
        let mut sim = Simulator::new(config);
        assert!(matches!(sim.handle(&charge(), 0.0).outcome, Outcome::Applied(_)));
        let ship = call("ship", "ship", Direction::Do);
        assert_eq!(sim.handle(&ship, 0.0).outcome, Outcome::Transient);
        assert_eq!(sim.stats().actions["ship"].transient, 1);
        assert_eq!(sim.stats().actions["charge-payment"].ok, 1);
    }

    #[test]
    fn every_call_gets_its_latency_whatever_the_outcome() {
        let mut sim = with(Faults { latency_ms: 250, transient_rate: 1.0, ..Faults::default() });
        let answer = sim.handle(&charge(), 0.0);
        assert_eq!(answer.outcome, Outcome::Transient);
        assert_eq!(answer.latency, Duration::from_millis(250));
    }

    #[test]
    fn the_same_calls_with_the_same_seed_give_the_same_outcomes() {
        let faults = Faults {
            transient_rate: 0.3,
            throttle_rate: 0.1,
            lost_answer_rate: 0.2,
            permanent_rate: 0.2,
            latency_jitter_ms: 100,
            seed: 11,
            ..Faults::default()
        };
        // What a call got, without the reference number, which depends on the interleaving.
        let kind = |answer: &Answer| {
            let outcome = match &answer.outcome {
                Outcome::Applied(output) => format!("applied noop={}", output["noop"]),
                Outcome::Replayed(output) => format!("replayed noop={}", output["noop"]),
                other => format!("{other:?}"),
            };
            (outcome, answer.latency)
        };
        let run = |order_of_orders: &[u32]| {
            let mut sim = with(faults.clone());
            let mut seen = BTreeMap::new();
            for &o in order_of_orders {
                for attempt in 0..3 {
                    let c = Call { key: format!("order-{o}/charge/do"), ..charge() };
                    seen.insert((o, attempt), kind(&sim.handle(&c, 0.0)));
                }
            }
            seen
        };
        let ordered = run(&[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(ordered, run(&[5, 3, 8, 1, 4, 7, 2, 6]));
        // And the knobs did something.
        let outcomes: std::collections::BTreeSet<&str> =
            ordered.values().map(|(o, _)| o.split(['(', ' ']).next().unwrap_or_default()).collect();
        assert!(outcomes.len() >= 3, "{outcomes:?}");
    }

    #[test]
    fn outcome_names_are_the_names_of_their_counts() {
        let outcomes = [
            Outcome::Applied(json!({})),
            Outcome::Replayed(json!({})),
            Outcome::Permanent("no".into()),
            Outcome::Tombstoned,
            Outcome::Transient,
            Outcome::Throttled,
            Outcome::LostAnswer,
            Outcome::Outage,
        ];
        for outcome in outcomes {
            let mut counts = Counts::default();
            counts.count(&outcome);
            let shown = serde_json::to_value(&counts).unwrap();
            assert_eq!(shown[outcome.kind()], json!(1), "{outcome:?}");
        }
    }

    #[test]
    fn every_key_that_met_a_fault_is_traced() {
        let mut sim = with(Faults {
            outages: vec![Outage { start_s: 0.0, end_s: 1.0 }],
            ..Faults::default()
        });
        sim.handle(&charge(), 0.5);
        sim.handle(&charge(), 2.0);
        sim.handle(&refund(), 2.0);
        let keys = &sim.stats().faulted_keys;
        assert_eq!(keys.len(), 1, "the refund never met a fault");
        let charged = &keys[&charge().key];
        assert_eq!((charged.outage, charged.ok, charged.total), (1, 1, 2));
    }

    #[test]
    fn reset_empties_the_ledger_and_the_stats_but_keeps_the_faults() {
        let mut sim = with(Faults { latency_ms: 5, ..Faults::default() });
        sim.handle(&charge(), 0.0);
        sim.reset();
        assert!(sim.ledger().effects().is_empty());
        assert_eq!(sim.stats(), &Stats::default());
        assert_eq!(sim.config().default.latency_ms, 5);
    }
}
