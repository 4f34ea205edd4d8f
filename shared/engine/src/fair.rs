//! Fair shares between tenants: whose an order is, the group its messages are delivered by, and
//! the part of the door a tenant may take while the queues are long.
//!
//! Every order belongs to a tenant: the value of its workflow's `fairness.tenant` pointer, or
//! else the caller that submitted it. Every message about the order carries its [`group`]: the
//! tenant, with [`PRIORITY`] appended for an order its workflow's `fairness.priority` pointer
//! marks. The SQS adapter sends it as the message's `MessageGroupId`, which makes a standard
//! queue a fair queue: while one group holds more than its share of the consumers, SQS hands
//! the consumers the other groups' messages first, so a tenant's burst makes its own orders
//! wait, not the others'. A priority order is a group of its own, small while its tenant's
//! bulk is not: it goes ahead of that bulk, and a tenant that marks every order a priority has
//! gained nothing. The in-memory queues deliver by the same rule ([`Noise`]).
//!
//! What fair queues do not do is keep the door: a backlog the noisy tenant made is the whole
//! queue's depth, and the door would refuse everyone's orders for it. The door keeps, by
//! tenant, the orders it let in that may still be waiting ([`Shares`]), and expects a tenant's
//! order to wait only its tenant's part of the backlog.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde_json::Value;

use crate::ids::Owner;
use crate::order::{Rejection, token_at};
use crate::time::Timestamp;

/// What a priority order's group has after its tenant.
pub const PRIORITY: &str = "#priority";
/// Longest group SQS takes as a `MessageGroupId`.
pub const MAX_GROUP_LEN: usize = 128;
/// Longest tenant kept as it is in a group; a longer one (an IAM role's ARN may be) is kept as
/// a hash of itself.
pub const MAX_TENANT_LEN: usize = MAX_GROUP_LEN - PRIORITY.len();
/// Longest tenant value read from an order's input, in bytes.
pub const MAX_VALUE_LEN: usize = 256;

/// A workflow's `fairness`, checked: where its orders' tenant and priority are in the input.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fairness {
    /// A JSON pointer relative to the input, and as written (`/input/tenant_id`). `None`: the
    /// caller is the tenant.
    pub tenant: Option<(String, String)>,
    /// A JSON pointer relative to the input to a boolean; `true` marks a priority order.
    pub priority: Option<(String, String)>,
}

impl Fairness {
    /// The group of an order with `input`, submitted by `owner` (`asked`: the caller marked it
    /// a priority); or why the input names no tenant.
    pub fn group_of(&self, input: &Value, owner: &Owner, asked: bool) -> Result<String, Rejection> {
        let tenant = match &self.tenant {
            None => owner.as_str().to_owned(),
            Some((pointer, declared)) => {
                let missing = format!(
                    "the workflow shares the stack by {declared} (fairness.tenant): it is missing"
                );
                token_at(input, pointer, ("tenant", "a tenant"), MAX_VALUE_LEN, missing)?
            }
        };
        let priority = self
            .priority
            .as_ref()
            .and_then(|(pointer, _)| input.pointer(pointer))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        Ok(group(&tenant, priority || asked))
    }
}

/// The group of `tenant`'s orders, or of its priority orders: printable ASCII, at most
/// [`MAX_GROUP_LEN`] characters, as SQS takes a `MessageGroupId`. A tenant that cannot be one as
/// it is becomes `~` and a hash of it.
pub fn group(tenant: &str, priority: bool) -> String {
    let plain = tenant.len() <= MAX_TENANT_LEN
        && !tenant.starts_with('~')
        && !tenant.ends_with(PRIORITY)
        && tenant.bytes().all(|b| b.is_ascii_graphic());
    let mut group = if plain {
        tenant.to_owned()
    } else {
        format!("~{:016x}", sas_rng::fnv1a(tenant.as_bytes()))
    };
    if priority {
        group.push_str(PRIORITY);
    }
    group
}

/// The tenant part of `group`: its priority orders' group and its other orders' are one tenant.
pub fn tenant_of(group: &str) -> &str {
    group.strip_suffix(PRIORITY).unwrap_or(group)
}

/// The shortest an order let in counts among its tenant's orders ahead of newcomers: what its
/// steps take besides waiting in the queues.
pub const SHARE_FLOOR: Duration = Duration::from_secs(5);
/// How long the consumers' time a group took counts, halving every so long.
pub const SHARE_HALF_LIFE: Duration = Duration::from_secs(60);
/// Most groups whose time a queue remembers; the least busy are forgotten first.
const MAX_TENANTS: usize = 10_000;

/// The orders one door let in that may still be in the queues, by tenant: each counts until the
/// wait it was let in with has passed (at least [`SHARE_FLOOR`]). An order of a tenant under
/// its share is let in with a short wait and soon stops counting; the orders of the tenant
/// that made the backlog count as long as the backlog is expected to last. Orders refused
/// never count: they are not in the queues, whatever their clients do next.
#[derive(Clone, Debug, Default)]
pub struct Shares {
    /// Orders still counted, by tenant.
    counts: HashMap<String, u64>,
    total: u64,
    /// When they stop counting: (the second, the tenant) and how many.
    until: BTreeMap<(i64, String), u64>,
}

impl Shares {
    /// Notes that an order of `tenant` was let in at `now`, expected to wait `wait` in the
    /// queues.
    pub fn admitted(&mut self, tenant: &str, now: Timestamp, wait: Duration) {
        let until = (now.plus(wait.max(SHARE_FLOOR)).as_millis() + 999).div_euclid(1000);
        *self.until.entry((until, tenant.to_owned())).or_default() += 1;
        *self.counts.entry(tenant.to_owned()).or_default() += 1;
        self.total += 1;
    }

    /// The part of the queues' backlog an order of `tenant` waits behind, from 0 to 1: its
    /// tenant's part of the orders still counted, over an even share of the tenants that have
    /// any (itself among them). Fair queues hand a tenant under its share its messages ahead of
    /// the others', so its orders wait behind its own alone; a door that let in one tenant only
    /// has it wait behind the whole backlog, which is that tenant's.
    pub fn part(&mut self, tenant: &str, now: Timestamp) -> f64 {
        let second = now.as_millis().div_euclid(1000);
        while let Some(entry) = self.until.first_entry() {
            if entry.key().0 > second {
                break;
            }
            let ((_, gone), n) = entry.remove_entry();
            self.total -= n;
            if let Some(c) = self.counts.get_mut(&gone) {
                *c -= n;
                if *c == 0 {
                    self.counts.remove(&gone);
                }
            }
        }
        let own = self.counts.get(tenant).copied().unwrap_or(0);
        if own == 0 || self.total == 0 {
            return 0.0;
        }
        (own as f64 / self.total as f64 * self.counts.len() as f64).min(1.0)
    }
}

fn decayed(count: f64, at: Timestamp, now: Timestamp) -> f64 {
    let age = at.until(now).as_secs_f64();
    count * 0.5f64.powf(age / SHARE_HALF_LIFE.as_secs_f64())
}

/// Fair delivery, as SQS fair queues decide it: which groups are noisy, from what each holds
/// in flight and how much of the consumers' time it took lately. A group is noisy when it holds
/// more than [`NOISY_SHARE`] of the messages in flight and at least [`NOISY_IN_FLIGHT`] of
/// them, or took more than [`NOISY_SHARE`] of the consumers' time; a noisy group's messages go
/// after every quiet group's, the noisy with the fewest in flight first.
#[derive(Clone, Debug, Default)]
pub struct Noise {
    /// Consumer time taken lately, by group, decaying as [`SHARE_HALF_LIFE`].
    busy: HashMap<String, (f64, Timestamp)>,
}

/// A group's share of the messages in flight, or of the consumers' time, above which it is noisy.
pub const NOISY_SHARE: f64 = 0.1;
/// Fewest messages in flight a group holds to be noisy by its share of them.
pub const NOISY_IN_FLIGHT: usize = 30;

impl Noise {
    /// Notes that a message of `group` took a consumer `took` until `now`: at least a
    /// millisecond, so that consumers whose time is not measured still count what they took.
    pub fn worked(&mut self, group: &str, took: Duration, now: Timestamp) {
        let took = took.max(Duration::from_millis(1)).as_secs_f64();
        let (c, at) = self.busy.get(group).copied().unwrap_or((0.0, now));
        self.busy.insert(group.to_owned(), (decayed(c, at, now) + took, now));
        if self.busy.len() > MAX_TENANTS {
            self.busy.retain(|_, (c, at)| decayed(*c, *at, now) > 0.001);
        }
    }

    /// The groups noisy now, given how many messages each holds in flight.
    pub fn noisy<'a>(
        &self,
        in_flight: &HashMap<&'a str, usize>,
        now: Timestamp,
    ) -> std::collections::HashSet<&'a str> {
        let flying: usize = in_flight.values().sum();
        let busy: HashMap<&str, f64> =
            self.busy.iter().map(|(g, (c, at))| (g.as_str(), decayed(*c, *at, now))).collect();
        let total: f64 = busy.values().sum();
        // One group alone is no one's neighbour.
        let groups = in_flight.len().max(busy.values().filter(|c| **c > 0.0).count());
        if groups < 2 {
            return Default::default();
        }
        in_flight
            .iter()
            .filter(|(group, n)| {
                let by_flight = **n >= NOISY_IN_FLIGHT && **n as f64 > NOISY_SHARE * flying as f64;
                let by_time =
                    total > 0.0 && busy.get(**group).copied().unwrap_or(0.0) > NOISY_SHARE * total;
                by_flight || by_time
            })
            .map(|(group, _)| *group)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: u64) -> Timestamp {
        Timestamp::from_millis(1_000_000 + s as i64 * 1000)
    }

    #[test]
    fn a_group_is_the_tenant_as_sqs_takes_it() {
        assert_eq!(group("acme", false), "acme");
        assert_eq!(group("acme", true), "acme#priority");
        assert_eq!(tenant_of("acme#priority"), "acme");
        assert_eq!(tenant_of("acme"), "acme");
        let arn = format!("arn:aws:sts::123456789012:assumed-role/{}/session", "r".repeat(200));
        let long = group(&arn, false);
        assert!(long.starts_with('~') && long.len() == 17, "{long}");
        assert_eq!(group(&arn, false), long, "the same tenant, the same group");
        assert!(group(&arn, true).len() <= MAX_GROUP_LEN);
        for odd in ["has space", "é", "~mimic", "x#priority"] {
            assert!(group(odd, false).starts_with('~'), "{odd}");
        }
    }

    #[test]
    fn the_tenant_is_read_from_the_input_or_is_the_caller() {
        let owner = Owner::anonymous();
        let by_caller = Fairness::default();
        assert_eq!(by_caller.group_of(&serde_json::json!({}), &owner, false).unwrap(), "anonymous");
        // The caller may mark an order a priority, whatever its workflow declares.
        let asked = by_caller.group_of(&serde_json::json!({}), &owner, true).unwrap();
        assert_eq!(asked, "anonymous#priority");
        let declared = Fairness {
            tenant: Some(("/tenant".into(), "/input/tenant".into())),
            priority: Some(("/rush".into(), "/input/rush".into())),
        };
        let input = serde_json::json!({"tenant": "t-1", "rush": true});
        assert_eq!(declared.group_of(&input, &owner, false).unwrap(), "t-1#priority");
        let input = serde_json::json!({"tenant": 7});
        assert_eq!(declared.group_of(&input, &owner, false).unwrap(), "7");
        assert_eq!(declared.group_of(&input, &owner, true).unwrap(), "7#priority");
        let err = declared.group_of(&serde_json::json!({"rush": true}), &owner, false).unwrap_err();
        assert_eq!(err.errors[0].field, "/tenant");
        assert!(err.to_string().contains("fairness.tenant"), "{err}");
    }

    #[test]
    fn a_tenant_under_its_share_waits_behind_its_own_part_of_the_backlog() {
        let mut shares = Shares::default();
        assert_eq!(shares.part("alone", at(0)), 0.0, "nothing let in: nothing ahead");
        // A burst let in with a minute's wait; four tenants at one a second, each let in with
        // its part of that minute.
        for _ in 0..300 {
            shares.admitted("bulk", at(0), Duration::from_secs(60));
        }
        for s in 0..30 {
            for quiet in ["q1", "q2", "q3", "q4"] {
                let part = shares.part(quiet, at(s));
                assert!(part < 0.1, "{quiet} at {s} s: {part}");
                shares.admitted(quiet, at(s), Duration::from_secs(60).mul_f64(part));
            }
        }
        assert_eq!(shares.part("bulk", at(30)), 1.0, "the bulk waits behind its own backlog");
        // Once the backlog's time has passed, the bulk counts no more.
        assert_eq!(shares.part("bulk", at(61)), 0.0);
        // Alone, a tenant's part is the whole.
        let mut one = Shares::default();
        one.admitted("only", at(0), Duration::from_secs(30));
        assert_eq!(one.part("only", at(1)), 1.0);
        // Even tenants each wait behind the whole backlog: they made it together.
        let mut even = Shares::default();
        for _ in 0..10 {
            even.admitted("a", at(0), Duration::from_secs(30));
            even.admitted("b", at(0), Duration::from_secs(30));
        }
        assert!((even.part("a", at(10)) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_group_holding_more_than_its_share_of_consumers_is_noisy() {
        let mut noise = Noise::default();
        let flights = HashMap::from([("bulk", 40usize), ("q1", 1), ("q2", 1)]);
        let noisy = noise.noisy(&flights, at(0));
        assert_eq!(noisy.into_iter().collect::<Vec<_>>(), vec!["bulk"]);
        // Fewer than 30 in flight: noisy only by the time it takes.
        let flights = HashMap::from([("bulk", 9usize), ("q1", 1)]);
        assert!(noise.noisy(&flights, at(0)).is_empty());
        noise.worked("bulk", Duration::from_secs(9), at(0));
        noise.worked("q1", Duration::from_millis(300), at(0));
        let noisy = noise.noisy(&flights, at(1));
        assert!(noisy.contains("bulk") && !noisy.contains("q1"), "{noisy:?}");
        // Alone, never noisy.
        let alone = Noise::default();
        assert!(alone.noisy(&HashMap::from([("bulk", 100usize)]), at(1)).is_empty());
    }
}
