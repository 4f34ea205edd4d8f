//! The fault knobs: how badly the simulated service behaves, per action, and the decisions
//! they lead to for one call.
//!
//! A [`FaultConfig`] has a `default` set of [`Faults`] and per-action overrides. An override
//! names only the knobs it changes ([`FaultsOverride`]); the others come from `default`, so
//! `{"default": {"latency_ms": 50}, "actions": {"charge-payment": {"permanent_rate": 0.2}}}`
//! keeps the 50 ms for `charge-payment`. Everything is zero (a perfect service) unless set.
//!
//! Decisions are deterministic (see [`sas_rng`]): the permanent refusal of a key depends on
//! the seed and the key alone, so every retry of a refused key is refused again, as a real
//! service that declines a card keeps declining it; per-call faults depend on the seed, the key
//! and the number of the call, so the same calls reproduce the same faults.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ledger::Direction;
use sas_rng::SplitMix;

/// The longest latency (base plus jitter) accepted: 15 minutes, the longest a Lambda function
/// (and so any caller in this project) can wait.
pub const MAX_LATENCY_MS: u64 = 15 * 60 * 1000;
/// The largest document an answer may carry.
pub const MAX_OUTPUT_BYTES: usize = 1024 * 1024;

/// A window of time, in seconds since the server started, during which the service is down:
/// every call gets a transient fault and nothing is applied.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outage {
    /// Start of the window, inclusive.
    pub start_s: f64,
    /// End of the window, exclusive.
    pub end_s: f64,
}

impl Outage {
    /// Whether `now_s` (seconds since start) falls in the window.
    pub fn contains(&self, now_s: f64) -> bool {
        self.start_s <= now_s && now_s < self.end_s
    }
}

/// The fault knobs of one action. Every field defaults to zero, `false` or empty: a service
/// that answers at once and always succeeds. Unknown fields are refused, so a misspelt knob is
/// an error rather than silently ignored.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Base latency of every call, in milliseconds. Default 0.
    pub latency_ms: u64,
    /// Extra latency drawn uniformly from `0..=latency_jitter_ms` per call. Default 0.
    pub latency_jitter_ms: u64,
    /// Probability (0 to 1) that a call fails with a transient fault (503), nothing applied.
    /// Default 0.
    pub transient_rate: f64,
    /// Probability (0 to 1) that a call is throttled (429), nothing applied. Default 0.
    pub throttle_rate: f64,
    /// Probability (0 to 1) that a new idempotency key is refused for good (422), nothing
    /// applied. Decided once per key: every call with that key gets the same answer. Only
    /// `do` calls, unless `permanent_undo`. Default 0.
    pub permanent_rate: f64,
    /// Whether `permanent_rate` also refuses `undo` calls (a compensation that cannot be
    /// done). Default `false`.
    pub permanent_undo: bool,
    /// Whether every call of a new key is answered 403 (the caller's grant or credentials
    /// refused), nothing applied, `do` and `undo` alike: the service answers, so this is no
    /// sign of it being down. A key it applied before is answered as it was. Default `false`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub denied: bool,
    /// Probability (0 to 1) that a successful call applies (or replays) its effect and then
    /// answers 503, as if the answer was lost on the way back. Default 0.
    pub lost_answer_rate: f64,
    /// Windows during which every call gets 503 and nothing is applied. Default none.
    pub outages: Vec<Outage>,
    /// Seed of every random decision. Default 0.
    pub seed: u64,
    /// Whether the service forgets the keys it applied, so that a repeated key takes effect
    /// again (and counts a second application). Its deduplication off: only for showing that
    /// a double-effect check fails. Default `false`.
    pub forget_keys: bool,
    /// A file: while it exists, every call of the action waits before it answers (its effect,
    /// if any, already in place), and the service writes the call's key to `{file}.held`. A
    /// test holds a call on the wire for as long as it needs; for a service on the test's own
    /// machine. Default none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold_while: Option<String>,
    /// The most calls of the action the service takes in one second (counted from its
    /// start, whole seconds): a call beyond them is throttled (429, `Retry-After: 1`), nothing
    /// applied, as a partner's published rate limit. Default none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_per_second: Option<u32>,
    /// How many bytes of a document every new effect's answer carries beside its reference:
    /// an answer larger than a message carries, which the agent stores. Default 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub output_bytes: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Knobs of one action that differ from the default; `None` keeps the default's value.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultsOverride {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_jitter_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transient_rate: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throttle_rate: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permanent_rate: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permanent_undo: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub denied: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost_answer_rate: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outages: Option<Vec<Outage>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forget_keys: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold_while: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_per_second: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<usize>,
}

/// The whole configuration: default knobs, and overrides by action name. The default value
/// is a perfect service for every action.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultConfig {
    /// Knobs of every action without an override, and the base of every override.
    pub default: Faults,
    /// Overrides by action name (`charge-payment`, ...).
    pub actions: BTreeMap<String, FaultsOverride>,
}

/// Why a configuration was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid fault configuration: {0}")]
    Json(#[from] serde_json::Error),
    #[error("invalid fault configuration for {scope}: {problem}")]
    Invalid { scope: String, problem: String },
}

/// The per-call random draws, taken in a fixed order so that enabling one knob does not shift
/// the draws of another.
#[derive(Clone, Copy, Debug)]
pub struct CallDraws {
    throttle: f64,
    transient: f64,
    lost_answer: f64,
    jitter: f64,
}

// Salts that separate the per-key permanent decision from the per-call streams.
const PERMANENT_SALT: u64 = u64::MAX;

impl FaultConfig {
    /// Parses and validates a configuration from JSON.
    pub fn from_json(json: &str) -> Result<FaultConfig, ConfigError> {
        let config: FaultConfig = serde_json::from_str(json)?;
        config.validate()?;
        Ok(config)
    }

    /// Checks that every rate is within 0 to 1, every latency at most [`MAX_LATENCY_MS`] and
    /// every outage window well formed, for the default and each action.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.default.validate("default")?;
        for action in self.actions.keys() {
            self.for_action(action).validate(&format!("action {action:?}"))?;
        }
        Ok(())
    }

    /// The knobs in force for `action`: the default with the action's override on top.
    pub fn for_action(&self, action: &str) -> Faults {
        match self.actions.get(action) {
            Some(o) => self.default.overlaid(o),
            None => self.default.clone(),
        }
    }
}

impl Faults {
    fn overlaid(&self, o: &FaultsOverride) -> Faults {
        let d = self;
        Faults {
            latency_ms: o.latency_ms.unwrap_or(d.latency_ms),
            latency_jitter_ms: o.latency_jitter_ms.unwrap_or(d.latency_jitter_ms),
            transient_rate: o.transient_rate.unwrap_or(d.transient_rate),
            throttle_rate: o.throttle_rate.unwrap_or(d.throttle_rate),
            permanent_rate: o.permanent_rate.unwrap_or(d.permanent_rate),
            permanent_undo: o.permanent_undo.unwrap_or(d.permanent_undo),
            denied: o.denied.unwrap_or(d.denied),
            lost_answer_rate: o.lost_answer_rate.unwrap_or(d.lost_answer_rate),
            outages: o.outages.clone().unwrap_or_else(|| d.outages.clone()),
            seed: o.seed.unwrap_or(d.seed),
            forget_keys: o.forget_keys.unwrap_or(d.forget_keys),
            hold_while: o.hold_while.clone().or_else(|| d.hold_while.clone()),
            max_per_second: o.max_per_second.or(d.max_per_second),
            output_bytes: o.output_bytes.unwrap_or(d.output_bytes),
        }
    }

    fn validate(&self, scope: &str) -> Result<(), ConfigError> {
        let invalid = |problem: String| ConfigError::Invalid { scope: scope.to_owned(), problem };
        let rates = [
            ("transient_rate", self.transient_rate),
            ("throttle_rate", self.throttle_rate),
            ("permanent_rate", self.permanent_rate),
            ("lost_answer_rate", self.lost_answer_rate),
        ];
        for (name, rate) in rates {
            // `contains` is false for NaN, so NaN is refused too.
            if !(0.0..=1.0).contains(&rate) {
                return Err(invalid(format!("{name} must be between 0 and 1, not {rate}")));
            }
        }
        if self.latency_ms.saturating_add(self.latency_jitter_ms) > MAX_LATENCY_MS {
            return Err(invalid(format!(
                "latency_ms + latency_jitter_ms must be at most {MAX_LATENCY_MS}"
            )));
        }
        if self.output_bytes > MAX_OUTPUT_BYTES {
            return Err(invalid(format!("output_bytes must be at most {MAX_OUTPUT_BYTES}")));
        }
        if self.max_per_second == Some(0) {
            return Err(invalid("max_per_second must be at least 1 (or left out)".to_owned()));
        }
        if self.hold_while.as_deref().is_some_and(|f| f.trim().is_empty()) {
            return Err(invalid("hold_while must name a file".to_owned()));
        }
        for w in &self.outages {
            if !(w.start_s.is_finite() && w.end_s.is_finite() && w.start_s <= w.end_s) {
                return Err(invalid(format!(
                    "outage window {}..{} must be finite with start_s <= end_s",
                    w.start_s, w.end_s
                )));
            }
        }
        Ok(())
    }

    /// Whether a call that is the `nth` of its action in its second exceeds the rate limit.
    pub fn beyond_rate(&self, nth: u64) -> bool {
        self.max_per_second.is_some_and(|limit| nth > u64::from(limit))
    }

    /// Whether the service is down at `now_s` seconds since start.
    pub fn in_outage(&self, now_s: f64) -> bool {
        self.outages.iter().any(|w| w.contains(now_s))
    }

    /// Whether this key is refused for good. Depends on the seed and the key only, so the
    /// answer never changes between retries.
    pub fn refuses(&self, key: &str, direction: Direction) -> bool {
        let applies = direction == Direction::Do || self.permanent_undo;
        // The rate is checked first so that a zero rate never consumes a draw.
        applies
            && self.permanent_rate > 0.0
            && SplitMix::for_key(self.seed, key, PERMANENT_SALT).unit() < self.permanent_rate
    }

    /// The random draws of the `nth` call (1-based) carrying `key`.
    pub fn draws(&self, key: &str, nth: u32) -> CallDraws {
        let rng = SplitMix::for_key(self.seed, key, u64::from(nth));
        CallDraws {
            throttle: rng.unit(),
            transient: rng.unit(),
            lost_answer: rng.unit(),
            jitter: rng.unit(),
        }
    }

    /// Whether the call with these draws is throttled.
    pub fn throttles(&self, draws: &CallDraws) -> bool {
        draws.throttle < self.throttle_rate
    }

    /// Whether the call with these draws fails transiently.
    pub fn fails_transiently(&self, draws: &CallDraws) -> bool {
        draws.transient < self.transient_rate
    }

    /// Whether the answer of the call with these draws is lost after the effect.
    pub fn loses_answer(&self, draws: &CallDraws) -> bool {
        draws.lost_answer < self.lost_answer_rate
    }

    /// How long the call with these draws takes before it answers.
    pub fn latency(&self, draws: &CallDraws) -> Duration {
        // Uniform over 0..=jitter: scale to jitter + 1 buckets, and clamp the (impossible with
        // a unit below 1) top bucket overflow.
        let buckets = self.latency_jitter_ms.saturating_add(1) as f64;
        let jitter = ((draws.jitter * buckets) as u64).min(self.latency_jitter_ms);
        Duration::from_millis(self.latency_ms.saturating_add(jitter))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_defaults_to_a_perfect_service() {
        let config = FaultConfig::from_json("{}").unwrap();
        assert_eq!(config, FaultConfig::default());
        let f = config.for_action("charge-payment");
        let draws = f.draws("k", 1);
        assert!(!f.throttles(&draws) && !f.fails_transiently(&draws) && !f.loses_answer(&draws));
        assert!(!f.refuses("k", Direction::Do));
        assert!(!f.in_outage(0.0));
        assert_eq!(f.latency(&draws), Duration::ZERO);
    }

    #[test]
    fn an_override_changes_only_the_knobs_it_names() {
        let config = FaultConfig::from_json(
            r#"{"default": {"latency_ms": 50, "transient_rate": 0.1, "seed": 9},
                "actions": {"charge-payment": {"permanent_rate": 0.2, "seed": 3}}}"#,
        )
        .unwrap();
        let charge = config.for_action("charge-payment");
        assert_eq!(charge.latency_ms, 50);
        assert_eq!(charge.transient_rate, 0.1);
        assert_eq!(charge.permanent_rate, 0.2);
        assert_eq!(charge.seed, 3);
        assert_eq!(config.for_action("ship"), config.default);
        // What was set is what is shown: unset override knobs stay absent.
        let shown = serde_json::to_value(&config).unwrap();
        assert_eq!(
            shown["actions"]["charge-payment"],
            serde_json::json!({"permanent_rate": 0.2, "seed": 3})
        );
    }

    #[test]
    fn bad_configurations_are_refused() {
        for bad in [
            r#"{"default": {"transient_rate": 1.5}}"#,
            r#"{"default": {"throttle_rate": -0.1}}"#,
            r#"{"actions": {"ship": {"lost_answer_rate": 2}}}"#,
            r#"{"default": {"outages": [{"start_s": 5, "end_s": 1}]}}"#,
            r#"{"default": {"latency_ms": 900001}}"#,
            r#"{"default": {"transient_rat": 0.1}}"#,
            r#"{"transient_rate": 0.1}"#,
            r#"{"default": {"seed": -1}}"#,
            "not json",
        ] {
            assert!(FaultConfig::from_json(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn outage_windows_are_half_open() {
        let f =
            Faults { outages: vec![Outage { start_s: 10.0, end_s: 20.0 }], ..Faults::default() };
        assert!(!f.in_outage(9.999));
        assert!(f.in_outage(10.0));
        assert!(f.in_outage(19.999));
        assert!(!f.in_outage(20.0));
    }

    #[test]
    fn permanent_refusal_is_fixed_per_key_and_near_the_rate() {
        let f = Faults { permanent_rate: 0.3, seed: 42, ..Faults::default() };
        let keys: Vec<String> = (0..2000).map(|i| format!("order-{i}/charge/do")).collect();
        let refused: Vec<bool> = keys.iter().map(|k| f.refuses(k, Direction::Do)).collect();
        let again: Vec<bool> = keys.iter().map(|k| f.refuses(k, Direction::Do)).collect();
        assert_eq!(refused, again);
        let share = refused.iter().filter(|&&r| r).count() as f64 / keys.len() as f64;
        assert!((share - 0.3).abs() < 0.05, "share {share}");
        // Another seed refuses other keys.
        let other = Faults { seed: 43, ..f.clone() };
        assert_ne!(
            refused,
            keys.iter().map(|k| other.refuses(k, Direction::Do)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn undos_are_refused_only_when_asked() {
        let mut f = Faults { permanent_rate: 1.0, ..Faults::default() };
        assert!(f.refuses("o/charge/do", Direction::Do));
        assert!(!f.refuses("o/charge/undo", Direction::Undo));
        f.permanent_undo = true;
        assert!(f.refuses("o/charge/undo", Direction::Undo));
    }

    #[test]
    fn rates_of_one_always_fire_and_draws_are_reproducible() {
        let f = Faults {
            throttle_rate: 1.0,
            transient_rate: 1.0,
            lost_answer_rate: 1.0,
            ..Faults::default()
        };
        for nth in 1..50 {
            let d = f.draws("k", nth);
            assert!(f.throttles(&d) && f.fails_transiently(&d) && f.loses_answer(&d));
        }
        let a = Faults::default().draws("k", 3);
        let b = Faults::default().draws("k", 3);
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
    }

    #[test]
    fn latency_is_the_base_plus_bounded_jitter() {
        let f = Faults { latency_ms: 100, latency_jitter_ms: 20, ..Faults::default() };
        let latencies: Vec<Duration> = (1..500).map(|n| f.latency(&f.draws("k", n))).collect();
        let lo = Duration::from_millis(100);
        let hi = Duration::from_millis(120);
        assert!(latencies.iter().all(|l| (lo..=hi).contains(l)));
        assert!(latencies.contains(&lo) && latencies.contains(&hi));
    }
}
