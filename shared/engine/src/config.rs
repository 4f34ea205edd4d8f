//! Engine configuration: every tunable with its default, read once at cold start.
//!
//! [`EngineConfig::from_lookup`] reads the settings from any key-value source (the process
//! environment in a Lambda function, a map in tests); an unset key takes its default, a
//! malformed one is an error that names it.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::error::Error;
use crate::events::StatusKinds;
use crate::pace::{Limits, MAX_IN_FLIGHT, MAX_RATE};
use crate::retry::{RetryPolicy, WaitPolicy};
use crate::workflow::{MAX_HOLD, MIN_HOLD};

/// Tunables of the scheduler, supervisor and agents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Expired leases of one step after which the supervisor stops retrying it and the order
    /// is compensated (or, with nothing to undo, set to Error). Default 3; at least 1.
    /// Env `FAILURE_THRESHOLD`.
    pub failure_threshold: u32,
    /// Extra wait before a step whose lease expired is tried again; grows with the failure
    /// count. Defaults 5 s and 300 s. Env `RETRY_WAIT_BASE_SECONDS`, `RETRY_WAIT_MAX_SECONDS`.
    pub wait: WaitPolicy,
    /// Time the scheduler has to claim a Pending order before the supervisor treats its start
    /// message as lost. Default 30 s. Env `CLAIM_GRACE_SECONDS`.
    pub claim_grace: Duration,
    /// How long a published-but-unconfirmed alert waits before the supervisor publishes it
    /// again. Default 120 s. Env `ALERT_RETRY_SECONDS`.
    pub alert_retry_after: Duration,
    /// Orders a second the stack is sized for, from which the sweep limit follows.
    /// Default 50; from 1 to [`MAX_EXPECTED_RATE`]. Env `EXPECTED_ORDERS_PER_SECOND`.
    pub expected_rate: u32,
    /// Shards of the expiry index: entries are written to them and the supervisor reads them
    /// all. [`INDEX_SHARDS`], whatever the rate; fewer only in tests.
    pub index_shards: u16,
    /// Most expired records the supervisor handles in one sweep, all shards together; the rest
    /// wait for the next sweep ([`Scale::sweep_limit`]).
    pub sweep_limit: usize,
    /// Status event kinds published. Default `terminal` (processed, compensated, failed).
    /// Env `STATUS_EVENTS`: `terminal`, `all`, `none` or a comma-separated list.
    pub status_events: StatusKinds,
    /// Backoff of an agent's retries of its remote service. Defaults 200 ms, 5 s, 8 calls.
    /// Env `AGENT_RETRY_INITIAL_MS`, `AGENT_RETRY_MAX_MS`, `AGENT_MAX_CALLS`.
    pub agent_retry: RetryPolicy,
    /// Entries kept in an order's timeline (the first, and the latest). Default 16.
    /// Env `TIMELINE_LIMIT`.
    pub timeline_limit: usize,
    /// Longest a new order may expect its messages to wait in the queues, all of them
    /// together, before the door refuses it (503 with Retry-After). Default 60 s; at least
    /// 1 s. Env `MAX_QUEUE_WAIT_SECONDS`.
    pub max_queue_wait: Duration,
    /// How long after it failed an order may still be redriven. A redrive reuses the keys of
    /// steps whose outcome is unknown, so that the service answers what it did; past the time
    /// the services remember keys, it could do such a step twice. Default 24 hours.
    /// Env `REDRIVE_WINDOW_SECONDS`.
    pub redrive_window: Duration,
    /// How long an order is kept once it ended and needs nobody (processed with nothing left
    /// to acknowledge, or cancelled): after that the store forgets it, and its key may be used
    /// again. `None`: kept for ever. Orders in Error or paused are kept until an operator ends
    /// them. At least [`MIN_RETENTION`], as long as the queues keep a message, so that a late
    /// one finds its order. Default 30 days. Env `ORDER_RETENTION_DAYS` (0: for ever).
    pub retention: Option<Duration>,
    /// How long a step may wait for its service while the service is held, before that counts
    /// as its failure, for steps and workflows that name no `max_hold_seconds`. Default 6
    /// hours; from 1 minute to 1 day. Env `MAX_HOLD_SECONDS`.
    pub max_hold: Duration,
    /// When an agent holds an action of its service, how it probes it while held, how fast
    /// the orders that waited resume, and when the operators are told a hold goes on.
    /// Env `HOLD_AFTER_FAILURES`, `HOLD_WINDOW_SECONDS`, `PROBE_EVERY_SECONDS`,
    /// `RESUME_PER_SECOND`, `HOLD_ALERT_AFTER_SECONDS`.
    pub hold: HoldPolicy,
    /// What each limited service accepts, by agent: calls a second and calls in flight, kept
    /// by its agent's executions together and by the supervisor when it resumes the orders
    /// that waited for it. Env `SERVICE_RATES` and `SERVICE_CONCURRENCY`, each a list of
    /// `agent=n` entries separated by commas; an agent in neither has no limit.
    pub limits: BTreeMap<String, Limits>,
    /// Whether tenants share the queues and the door fairly ([`crate::fair`]): every message
    /// carries its order's tenant as its group, and the door expects a tenant's order to wait
    /// behind its tenant's part of the backlog. Default on. Env `FAIR_QUEUES`: `on` or `off`.
    pub fair_queues: bool,
}

/// Shards of the expiry index. DynamoDB places each on one of the index's partitions, where
/// it cannot be told to, and a new index has only a few partitions: with many more shards
/// than partitions, every partition gets close to its share of the writes however the shards
/// fall, and no partition of a new stack is full before the index as a whole is. The same
/// for every declared rate, so that a stack whose rate changes never leaves an entry on a
/// shard nobody reads; a sweep reads them all, each query costing half a read unit.
pub const INDEX_SHARDS: u16 = 128;

/// Queries of an index's shards in flight at once, wherever every shard is read (a sweep, an
/// operator's listing): enough that all of them take a few round trips, few enough that a
/// small function opens few connections.
pub const SHARD_QUERIES_AT_ONCE: usize = 16;

/// Shards on the busiest of `partitions` partitions, when DynamoDB places `shards` of them
/// each on any partition alike, in at least `share` of the placements: with `share` 0.99, what
/// one new index in a hundred meets at worst. The writes that partition takes against its
/// 1,000 units a second bound a new index, until DynamoDB splits its busiest partitions.
pub fn busiest_partition(shards: u16, partitions: u16, share: f64) -> u16 {
    let k = usize::from(shards);
    let p = partitions.max(1);
    // No partition holds more than m: k!/p^k times the coefficient of x^k in
    // (1 + x + x^2/2! + ... + x^m/m!)^p.
    let within = |m: usize| {
        let terms: Vec<f64> = (0..=m.min(k))
            .scan(1.0, |t, j| {
                if j > 0 {
                    *t /= j as f64;
                }
                Some(*t)
            })
            .collect();
        let mut poly = vec![0.0; k + 1];
        poly[0] = 1.0;
        for _ in 0..p {
            let mut next = vec![0.0; k + 1];
            for (i, a) in poly.iter().enumerate().filter(|(_, a)| **a != 0.0) {
                for (j, t) in terms.iter().enumerate().take(k - i + 1) {
                    next[i + j] += a * t;
                }
            }
            poly = next;
        }
        poly[k] * (1..=k).map(|i| i as f64 / f64::from(p)).product::<f64>()
    };
    (shards.div_ceil(p).max(1)..=shards)
        .find(|&m| within(usize::from(m)) >= share)
        .unwrap_or(shards)
}

/// The shortest a stack keeps an order that ended: as long as SQS keeps a message.
pub const MIN_RETENTION: Duration = Duration::from_secs(14 * 24 * 3600);

/// The highest rate a stack may declare: about what one table takes at its default quota of
/// 40,000 write units a second.
pub const MAX_EXPECTED_RATE: u32 = 8_000;

/// Sweeps in which the supervisor repairs every lease of a minute of orders at the declared
/// rate, should they all expire at once (a regional hiccup, a function down for a minute).
pub const RECOVERY_SWEEPS: u32 = 5;

/// What follows from the orders a second a stack expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scale {
    /// Records one sweep repairs at most: a minute of orders over [`RECOVERY_SWEEPS`].
    pub sweep_limit: usize,
}

impl Scale {
    /// The scale of a stack that expects `orders_per_second` (clamped to 1 and
    /// [`MAX_EXPECTED_RATE`]).
    pub fn for_rate(orders_per_second: u32) -> Scale {
        let rate = orders_per_second.clamp(1, MAX_EXPECTED_RATE);
        Scale { sweep_limit: (rate * 60).div_ceil(RECOVERY_SWEEPS) as usize }
    }
}

/// When a service's action is held, how it is probed while held, how the orders that waited
/// for it resume, and when the operators hear that a hold goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldPolicy {
    /// Passing faults in a row (timeouts, 5xx, 429, refused connections) of one action's
    /// calls, met by one of the agent's executions, after which the action is held for
    /// every execution. Default 5.
    pub after_failures: u32,
    /// The faults must come within this long of the first of them; a fault after a quieter
    /// spell starts the count again. Default 60 s.
    pub window: Duration,
    /// While held, one call of the action at most this often goes to the service as a probe
    /// (across all the agent's executions); the first that is answered opens it. Default 10 s.
    pub probe_every: Duration,
    /// Orders a second the supervisor resumes for a hold that ended, spread over the minute
    /// between its sweeps, and the calls a second the resumed orders make of the service
    /// across all the agent's executions, so that the orders that waited reach it at a pace
    /// it takes rather than all at once. Default 10; from 1 to 1000.
    pub resume_per_second: u32,
    /// A hold that lasts this long is announced once more, with what its probes last met, so
    /// that a hold that does not end is looked at. Default 10 minutes; at least 1 minute.
    pub alert_after: Duration,
}

/// Orders a second a stack expects unless it declares otherwise: what the template's default
/// pollers take with room to spare.
const DEFAULT_RATE: u32 = 50;

impl Default for HoldPolicy {
    fn default() -> Self {
        HoldPolicy {
            after_failures: 5,
            window: Duration::from_secs(60),
            probe_every: Duration::from_secs(10),
            resume_per_second: 10,
            alert_after: Duration::from_secs(600),
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        let scale = Scale::for_rate(DEFAULT_RATE);
        EngineConfig {
            failure_threshold: 3,
            wait: WaitPolicy::default(),
            claim_grace: Duration::from_secs(30),
            alert_retry_after: Duration::from_secs(120),
            expected_rate: DEFAULT_RATE,
            index_shards: INDEX_SHARDS,
            sweep_limit: scale.sweep_limit,
            status_events: StatusKinds::default(),
            agent_retry: RetryPolicy::default(),
            timeline_limit: 16,
            max_queue_wait: Duration::from_secs(60),
            redrive_window: Duration::from_secs(24 * 3600),
            retention: Some(Duration::from_secs(30 * 24 * 3600)),
            max_hold: Duration::from_secs(6 * 3600),
            hold: HoldPolicy::default(),
            limits: BTreeMap::new(),
            fair_queues: true,
        }
    }
}

impl EngineConfig {
    /// Reads the configuration from `lookup` (for example `|k| std::env::var(k).ok()`).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, Error> {
        let d = EngineConfig::default();
        let expected_rate = parse(&lookup, "EXPECTED_ORDERS_PER_SECOND", d.expected_rate)?;
        if !(1..=MAX_EXPECTED_RATE).contains(&expected_rate) {
            return Err(Error::Config(format!(
                "EXPECTED_ORDERS_PER_SECOND must be from 1 to {MAX_EXPECTED_RATE}"
            )));
        }
        let scale = Scale::for_rate(expected_rate);
        let retention_days = d.retention_days();
        let config = EngineConfig {
            failure_threshold: parse(&lookup, "FAILURE_THRESHOLD", d.failure_threshold)?,
            wait: WaitPolicy {
                base: secs(&lookup, "RETRY_WAIT_BASE_SECONDS", d.wait.base)?,
                max: secs(&lookup, "RETRY_WAIT_MAX_SECONDS", d.wait.max)?,
            },
            claim_grace: secs(&lookup, "CLAIM_GRACE_SECONDS", d.claim_grace)?,
            alert_retry_after: secs(&lookup, "ALERT_RETRY_SECONDS", d.alert_retry_after)?,
            expected_rate,
            index_shards: d.index_shards,
            sweep_limit: scale.sweep_limit,
            status_events: match lookup("STATUS_EVENTS") {
                Some(v) => v.parse()?,
                None => d.status_events,
            },
            agent_retry: RetryPolicy {
                initial_delay: millis(
                    &lookup,
                    "AGENT_RETRY_INITIAL_MS",
                    d.agent_retry.initial_delay,
                )?,
                max_delay: millis(&lookup, "AGENT_RETRY_MAX_MS", d.agent_retry.max_delay)?,
                max_calls: parse(&lookup, "AGENT_MAX_CALLS", d.agent_retry.max_calls)?,
            },
            timeline_limit: parse(&lookup, "TIMELINE_LIMIT", d.timeline_limit)?,
            max_queue_wait: secs(&lookup, "MAX_QUEUE_WAIT_SECONDS", d.max_queue_wait)?,
            redrive_window: secs(&lookup, "REDRIVE_WINDOW_SECONDS", d.redrive_window)?,
            retention: match parse(&lookup, "ORDER_RETENTION_DAYS", retention_days)? {
                0 => None,
                days => Some(Duration::from_secs(days.saturating_mul(24 * 3600))),
            },
            max_hold: secs(&lookup, "MAX_HOLD_SECONDS", d.max_hold)?,
            hold: HoldPolicy {
                after_failures: parse(&lookup, "HOLD_AFTER_FAILURES", d.hold.after_failures)?,
                window: secs(&lookup, "HOLD_WINDOW_SECONDS", d.hold.window)?,
                probe_every: secs(&lookup, "PROBE_EVERY_SECONDS", d.hold.probe_every)?,
                resume_per_second: parse(&lookup, "RESUME_PER_SECOND", d.hold.resume_per_second)?,
                alert_after: secs(&lookup, "HOLD_ALERT_AFTER_SECONDS", d.hold.alert_after)?,
            },
            limits: limits(&lookup)?,
            fair_queues: match lookup("FAIR_QUEUES").as_deref() {
                None | Some("on") => true,
                Some("off") => false,
                Some(other) => {
                    return Err(Error::Config(format!(
                        "FAIR_QUEUES must be on or off, not {other:?}"
                    )));
                }
            },
        };
        config.validate()?;
        Ok(config)
    }

    /// The retention in whole days, 0 for ever.
    fn retention_days(&self) -> u64 {
        self.retention.map_or(0, |r| r.as_secs() / (24 * 3600))
    }

    /// What `agent`'s service accepts.
    pub fn limits_of(&self, agent: &str) -> Limits {
        self.limits.get(agent).copied().unwrap_or(Limits::NONE)
    }

    /// Rejects settings that would break the engine's guarantees.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: &str| Err(Error::Config(m.to_owned()));
        if self.failure_threshold == 0 {
            return bad("FAILURE_THRESHOLD must be at least 1");
        }
        if self.retention.is_some_and(|r| r < MIN_RETENTION) {
            return bad(
                "ORDER_RETENTION_DAYS must be 0 (for ever) or at least 14: the queues keep a message 14 days, and a late one must find its order",
            );
        }
        if !(1..=INDEX_SHARDS).contains(&self.index_shards) {
            return bad(&format!("the expiry index takes from 1 to {INDEX_SHARDS} shards"));
        }
        if self.sweep_limit == 0 {
            return bad("the sweep limit must be at least 1");
        }
        if self.wait.base > self.wait.max {
            return bad("RETRY_WAIT_BASE_SECONDS must not exceed RETRY_WAIT_MAX_SECONDS");
        }
        if self.wait.max > Duration::from_secs(900) {
            // Start messages carry the wait as an SQS delay, which is at most 15 minutes.
            return bad("RETRY_WAIT_MAX_SECONDS must be at most 900");
        }
        if !(MIN_HOLD..=MAX_HOLD).contains(&self.max_hold) {
            return bad("MAX_HOLD_SECONDS must be from 60 to 86400");
        }
        if !(1..=1000).contains(&self.hold.resume_per_second) {
            return bad("RESUME_PER_SECOND must be from 1 to 1000");
        }
        if self.hold.alert_after < Duration::from_secs(60) {
            return bad("HOLD_ALERT_AFTER_SECONDS must be at least 60");
        }
        if self.hold.after_failures == 0 {
            return bad("HOLD_AFTER_FAILURES must be at least 1");
        }
        if self.hold.window.is_zero() || self.hold.probe_every.is_zero() {
            return bad("HOLD_WINDOW_SECONDS and PROBE_EVERY_SECONDS must be at least 1");
        }
        if self.agent_retry.max_calls == 0 {
            return bad("AGENT_MAX_CALLS must be at least 1");
        }
        if self.timeline_limit < 2 {
            return bad("TIMELINE_LIMIT must be at least 2");
        }
        if self.max_queue_wait < Duration::from_secs(1) {
            return bad("MAX_QUEUE_WAIT_SECONDS must be at least 1");
        }
        Ok(())
    }
}

/// The services' limits from `SERVICE_RATES` and `SERVICE_CONCURRENCY`.
fn limits(lookup: &impl Fn(&str) -> Option<String>) -> Result<BTreeMap<String, Limits>, Error> {
    let mut all: BTreeMap<String, Limits> = BTreeMap::new();
    for (key, most) in [("SERVICE_RATES", MAX_RATE), ("SERVICE_CONCURRENCY", MAX_IN_FLIGHT)] {
        let list = lookup(key).unwrap_or_default();
        for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let bad = || {
                Error::Config(format!(
                    "{key}: {item:?} must be agent=n, n a whole number from 1 to {most}"
                ))
            };
            let (agent, value) = item.split_once('=').ok_or_else(bad)?;
            // An agent's own entry is `agent=` where the list has none for it.
            if value.trim().is_empty() {
                continue;
            }
            let n = value.trim().parse::<u32>().map_err(|_| bad())?;
            if !(1..=most).contains(&n) {
                return Err(bad());
            }
            let limits = all.entry(agent.trim().to_owned()).or_default();
            match key {
                "SERVICE_RATES" => limits.per_second = Some(n),
                _ => limits.in_flight = Some(n),
            }
        }
    }
    Ok(all)
}

fn parse<T: std::str::FromStr>(
    lookup: &impl Fn(&str) -> Option<String>,
    key: &str,
    default: T,
) -> Result<T, Error> {
    match lookup(key) {
        None => Ok(default),
        Some(v) => v
            .trim()
            .parse()
            .map_err(|_| Error::Config(format!("{key}={v:?} is not a valid number"))),
    }
}

fn secs(
    lookup: &impl Fn(&str) -> Option<String>,
    key: &str,
    default: Duration,
) -> Result<Duration, Error> {
    parse(lookup, key, default.as_secs()).map(Duration::from_secs)
}

fn millis(
    lookup: &impl Fn(&str) -> Option<String>,
    key: &str,
    default: Duration,
) -> Result<Duration, Error> {
    parse(lookup, key, u64::try_from(default.as_millis()).unwrap_or(u64::MAX))
        .map(Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn from(pairs: &[(&str, &str)]) -> Result<EngineConfig, Error> {
        let map: HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        EngineConfig::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn each_service_s_limits_come_from_its_entries_and_a_bad_one_is_named() {
        let c = from(&[
            ("SERVICE_RATES", "payment=5, shipping=20"),
            ("SERVICE_CONCURRENCY", "payment=3"),
        ])
        .unwrap();
        assert_eq!(c.limits_of("payment"), Limits { per_second: Some(5), in_flight: Some(3) });
        assert_eq!(c.limits_of("shipping"), Limits { per_second: Some(20), in_flight: None });
        assert_eq!(c.limits_of("inventory"), Limits::NONE);
        // An agent's own entry where the list has none for it.
        let own = from(&[("SERVICE_RATES", "inventory="), ("SERVICE_CONCURRENCY", "inventory=")]);
        assert_eq!(own.unwrap().limits_of("inventory"), Limits::NONE);
        for bad in ["payment=0", "payment=five", "payment", "payment=501"] {
            let err = from(&[("SERVICE_RATES", bad)]).unwrap_err().to_string();
            assert!(err.contains("SERVICE_RATES") && err.contains(bad), "{err}");
        }
    }

    #[test]
    fn orders_are_kept_for_ever_or_at_least_as_long_as_the_queues_keep_a_message() {
        let days = |d: &str| from(&[("ORDER_RETENTION_DAYS", d)]).map(|c| c.retention);
        assert_eq!(days("0").unwrap(), None);
        assert_eq!(days("30").unwrap(), Some(Duration::from_secs(30 * 86_400)));
        assert_eq!(days("14").unwrap(), Some(MIN_RETENTION));
        let err = days("7").unwrap_err().to_string();
        assert!(err.contains("ORDER_RETENTION_DAYS") && err.contains("14"), "{err}");
    }

    #[test]
    fn unset_keys_take_the_documented_defaults() {
        assert_eq!(from(&[]).unwrap(), EngineConfig::default());
    }

    #[test]
    fn keys_are_read_and_bad_values_are_named() {
        let c = from(&[("FAILURE_THRESHOLD", "5"), ("STATUS_EVENTS", "all")]).unwrap();
        assert_eq!(c.failure_threshold, 5);
        let err = from(&[("CLAIM_GRACE_SECONDS", "soon")]).unwrap_err().to_string();
        assert!(err.contains("CLAIM_GRACE_SECONDS"), "{err}");
        let err = from(&[("FAILURE_THRESHOLD", "0")]).unwrap_err().to_string();
        assert!(err.contains("FAILURE_THRESHOLD"), "{err}");
        let err = from(&[("RETRY_WAIT_BASE_SECONDS", "600")]).unwrap_err().to_string();
        assert!(err.contains("must not exceed"), "{err}");
    }

    #[test]
    fn the_busiest_partition_is_what_one_placement_in_a_hundred_exceeds() {
        // Worked out apart; drawing random placements agrees.
        for (shards, partitions, most) in
            [(8, 6, 5), (32, 16, 8), (64, 12, 13), (128, 4, 46), (128, 12, 22)]
        {
            assert_eq!(
                busiest_partition(shards, partitions, 0.99),
                most,
                "{shards} on {partitions}"
            );
        }
        // However they fall, one partition holds at least its share, and all at most.
        assert_eq!(busiest_partition(8, 1, 0.99), 8);
        assert_eq!(busiest_partition(128, 128, 0.0), 1);
        assert!(busiest_partition(128, 12, 0.5) < busiest_partition(128, 12, 0.99));
    }

    #[test]
    fn the_sweep_limit_follows_from_the_declared_rate_and_the_shards_do_not() {
        let c = from(&[("EXPECTED_ORDERS_PER_SECOND", "2000")]).unwrap();
        assert_eq!((c.expected_rate, c.index_shards, c.sweep_limit), (2000, INDEX_SHARDS, 24_000));
        assert_eq!(from(&[]).unwrap().index_shards, INDEX_SHARDS);
        // A minute of leases at the declared rate is repaired in RECOVERY_SWEEPS sweeps.
        for rate in [1, 100, 250, 251, 1000, 2000, MAX_EXPECTED_RATE] {
            let scale = Scale::for_rate(rate);
            assert!(scale.sweep_limit * RECOVERY_SWEEPS as usize >= rate as usize * 60);
        }
        for bad in ["0", "8001", "many"] {
            let err = from(&[("EXPECTED_ORDERS_PER_SECOND", bad)]).unwrap_err().to_string();
            assert!(err.contains("EXPECTED_ORDERS_PER_SECOND"), "{err}");
        }
    }
}
