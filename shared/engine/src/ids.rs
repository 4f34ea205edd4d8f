//! Identifiers: orders, agents, steps, and the idempotency keys derived from them.
//!
//! An order's id is derived from the client's idempotency key (UUID v5), so the store's
//! "create if absent" condition is the whole duplicate check: no separate key table, no extra
//! write. The key a remote service sees for a step is derived from the order id and the step,
//! so it is the same on every retry and every re-dispatch of that step.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Namespace for deriving order ids from client keys. Changing it would give existing keys new
/// order ids, so it is fixed forever.
const ORDER_NAMESPACE: Uuid = Uuid::from_u128(0x5a5d_1f2e_8c1b_4e7a_9b60_3d2f_44c1_7e09);

/// Longest idempotency key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 128;

/// The id of an order and of its state record.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OrderId(Uuid);

impl OrderId {
    /// The order id a client key maps to on an API without authorization (the anonymous
    /// owner's keys).
    pub fn for_key(key: &IdempotencyKey) -> Self {
        OrderId(Uuid::new_v5(&ORDER_NAMESPACE, key.0.as_bytes()))
    }

    /// The order id an owner's key maps to. Keys are the owner's own: two owners may use the
    /// same key for two orders. The anonymous owner's ids are [`OrderId::for_key`]'s, so that an
    /// API that gains authorization keeps the ids of the orders taken before.
    pub fn for_owner_key(owner: &Owner, key: &IdempotencyKey) -> Self {
        if owner.is_anonymous() {
            return OrderId::for_key(key);
        }
        // The owner never holds a NUL (it is refused as a control character), so the pair
        // cannot be spelled two ways.
        let name = format!("{}\0{}", owner.0, key.0);
        OrderId(Uuid::new_v5(&ORDER_NAMESPACE, name.as_bytes()))
    }

    /// The id of the child order that step `step` of `parent` starts in its run `generation`:
    /// the same for every start of that run, so that a start repeated finds the child it made.
    pub fn for_child(parent: OrderId, step: &str, generation: u32) -> Self {
        // A step's name has no NUL, so the parts cannot be spelled two ways.
        let name = format!("child\0{parent}\0{step}\0{generation}");
        OrderId(Uuid::new_v5(&ORDER_NAMESPACE, name.as_bytes()))
    }

    /// The id of the child order that step `step` of `parent` starts for element `element` of
    /// its list in its run `generation`.
    pub fn for_element(parent: OrderId, step: &str, generation: u32, element: u32) -> Self {
        let name = format!("element\0{parent}\0{step}\0{generation}\0{element}");
        OrderId(Uuid::new_v5(&ORDER_NAMESPACE, name.as_bytes()))
    }

    pub fn from_uuid(id: Uuid) -> Self {
        OrderId(id)
    }

    pub fn as_uuid(&self) -> &Uuid {
        &self.0
    }

    /// The expiry-index shard this order's record lives in while it is in flight. Stable for the
    /// life of the record, spread evenly because the id is a hash.
    pub fn shard(&self, shards: u16) -> u16 {
        let shards = u128::from(shards.max(1));
        u16::try_from(self.0.as_u128() % shards).unwrap_or(0)
    }
}

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

impl fmt::Debug for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for OrderId {
    type Err = InvalidId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s).map(OrderId).map_err(|_| InvalidId::OrderId(s.to_owned()))
    }
}

/// An identifier that does not parse. The engine's [`Error`](crate::Error) turns each into
/// the error its callers answer with (a malformed message, a bad caller, a bad key).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidId {
    #[error("not an order id: {0:?}")]
    OrderId(String),
    #[error("{0}")]
    Caller(String),
    #[error("{0}")]
    Key(&'static str),
}

/// Who submitted an order, as the API's authorizer names the caller: an IAM principal's ARN,
/// a JWT's issuer and subject, or `anonymous` on an API without authorization. An order is
/// shown only to its owner, and an owner's idempotency keys are its own.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Owner(String);

/// Longest owner accepted, in bytes (an IAM ARN is at most 2,048 characters; a JWT subject at
/// most 255 by most issuers).
pub const MAX_OWNER_LEN: usize = 2048;

impl Owner {
    const ANONYMOUS: &'static str = "anonymous";
    /// No caller's spelling: an IAM caller's starts with `arn:`, a token's with `jwt:`.
    const STARTS: &'static str = "sas:starts";

    /// The caller on an API without authorization.
    pub fn anonymous() -> Owner {
        Owner(Owner::ANONYMOUS.to_owned())
    }

    /// The owner of the orders that events and schedules start ([`crate::starts`]): their
    /// keys cannot meet a client's.
    pub fn starts() -> Owner {
        Owner(Owner::STARTS.to_owned())
    }

    /// An IAM principal, by the ARN API Gateway's IAM authorizer gives.
    pub fn iam(user_arn: &str) -> Result<Owner, InvalidId> {
        if !user_arn.starts_with("arn:") {
            return Err(InvalidId::Caller(format!("not an ARN: {user_arn:?}")));
        }
        Owner::parse(user_arn)
    }

    /// A JWT's issuer and subject: a subject is unique only within its issuer.
    pub fn jwt(issuer: &str, subject: &str) -> Result<Owner, InvalidId> {
        if issuer.is_empty() || subject.is_empty() {
            return Err(InvalidId::Caller("a token needs an issuer and a subject".into()));
        }
        Owner::parse(&format!("jwt:{issuer}#{subject}"))
    }

    fn parse(raw: &str) -> Result<Owner, InvalidId> {
        if raw.is_empty() || raw.len() > MAX_OWNER_LEN || raw.chars().any(char::is_control) {
            return Err(InvalidId::Caller(format!(
                "a caller is 1 to {MAX_OWNER_LEN} bytes without control characters"
            )));
        }
        Ok(Owner(raw.to_owned()))
    }

    pub fn is_anonymous(&self) -> bool {
        self.0 == Owner::ANONYMOUS
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Owner {
    type Error = InvalidId;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        if value == Owner::ANONYMOUS { Ok(Owner::anonymous()) } else { Owner::parse(&value) }
    }
}

impl From<Owner> for String {
    fn from(o: Owner) -> String {
        o.0
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A client's idempotency key, validated: 1 to 128 characters from `A-Z a-z 0-9 - _ . :`.
/// UUIDs, ULIDs and most hand-made keys fit; whitespace and control characters never do.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub fn parse(raw: &str) -> Result<Self, InvalidId> {
        if raw.is_empty() {
            return Err(InvalidId::Key("must not be empty"));
        }
        if raw.len() > MAX_KEY_LEN {
            return Err(InvalidId::Key("must be at most 128 characters"));
        }
        if !raw.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b)) {
            return Err(InvalidId::Key("may only contain A-Z, a-z, 0-9, '-', '_', '.' and ':'"));
        }
        Ok(IdempotencyKey(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for IdempotencyKey {
    type Error = InvalidId;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        IdempotencyKey::parse(&value)
    }
}

impl From<IdempotencyKey> for String {
    fn from(k: IdempotencyKey) -> String {
        k.0
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// Names an agent, and so the request queue and remote service behind it.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AgentName(String);

impl AgentName {
    pub fn new(name: impl Into<String>) -> Self {
        AgentName(name.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for AgentName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for AgentName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// Which way a step is being driven: its action, or the compensation that undoes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    Do,
    Undo,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Do => "do",
            Direction::Undo => "undo",
        }
    }
}

/// The key a remote service uses to deduplicate one step (or its undo) of one order. It does
/// not contain the attempt: every retry and re-dispatch of the step carries the same key.
///
/// It does contain the step's generation once an operator's redrive has done the step again
/// (`{order}/{step}/r{n}/do`): the first run's keys belong to an action that was undone or
/// refused, and a service answers a known key with what it recorded (or, for a `do` whose
/// `undo` it applied, refuses it for good), so reusing them would report the step done without
/// doing it. Everything before the last `/` names one run of one step for both directions.
pub fn step_key(order: OrderId, step: &str, direction: Direction, generation: u32) -> String {
    match generation {
        0 => format!("{order}/{step}/{}", direction.as_str()),
        n => format!("{order}/{step}/r{n}/{}", direction.as_str()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owners_keys_are_its_own_and_the_anonymous_ids_do_not_change() {
        let key = IdempotencyKey::parse("order-1001").unwrap();
        let ada = Owner::iam("arn:aws:iam::123456789012:user/ada").unwrap();
        let bob = Owner::jwt("https://issuer.example", "bob").unwrap();
        let ids = [&ada, &bob, &Owner::anonymous()].map(|o| OrderId::for_owner_key(o, &key));
        assert!(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2]);
        assert_eq!(ids[2], OrderId::for_key(&key));
        assert_eq!(ids[0], OrderId::for_owner_key(&ada.clone(), &key));
    }

    #[test]
    fn callers_that_cannot_own_orders_are_refused() {
        assert!(Owner::iam("ada").is_err(), "not an ARN");
        assert!(Owner::iam("arn:aws:iam::1:user/a\u{0}b").is_err());
        assert!(Owner::iam(&format!("arn:{}", "x".repeat(MAX_OWNER_LEN))).is_err());
        assert!(Owner::jwt("", "bob").is_err() && Owner::jwt("https://i", "").is_err());
        // Stored and read back as the same owner.
        let ada: Owner = serde_json::from_str("\"arn:aws:iam::1:user/ada\"").unwrap();
        assert_eq!(ada, Owner::iam("arn:aws:iam::1:user/ada").unwrap());
        let anonymous: Owner = serde_json::from_str("\"anonymous\"").unwrap();
        assert!(anonymous.is_anonymous());
    }

    #[test]
    fn order_id_is_a_pure_function_of_the_key() {
        let a = IdempotencyKey::parse("order-2026-0001").unwrap();
        let b = IdempotencyKey::parse("order-2026-0002").unwrap();
        assert_eq!(OrderId::for_key(&a), OrderId::for_key(&a.clone()));
        assert_ne!(OrderId::for_key(&a), OrderId::for_key(&b));
    }

    #[test]
    fn keys_are_validated() {
        assert!(IdempotencyKey::parse("3f1c9a2e-7b7d-4c55-9f0e-2d0d8c1b6a10").is_ok());
        assert!(IdempotencyKey::parse("a:b.c_d-e").is_ok());
        for bad in ["", "has space", "tab\t", "ünïcode", "semi;colon", &"k".repeat(129)] {
            assert!(IdempotencyKey::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(IdempotencyKey::parse(&"k".repeat(128)).is_ok());
    }

    #[test]
    fn shards_cover_the_range_and_are_stable() {
        let mut seen = [0u32; 8];
        for i in 0..800 {
            let key = IdempotencyKey::parse(&format!("k{i}")).unwrap();
            let id = OrderId::for_key(&key);
            let s = id.shard(8);
            assert_eq!(s, id.shard(8));
            seen[usize::from(s)] += 1;
        }
        assert!(seen.iter().all(|&n| n > 50), "uneven shards: {seen:?}");
        assert_eq!(OrderId::for_key(&IdempotencyKey::parse("x").unwrap()).shard(0), 0);
    }

    #[test]
    fn step_keys_differ_by_direction_only() {
        let id = OrderId::for_key(&IdempotencyKey::parse("k").unwrap());
        let key = |d, g| step_key(id, "charge", d, g);
        assert_eq!(key(Direction::Do, 0), key(Direction::Do, 0));
        assert_ne!(key(Direction::Do, 0), key(Direction::Undo, 0));
        assert_eq!(key(Direction::Do, 0), format!("{id}/charge/do"));
    }

    #[test]
    fn a_redriven_run_has_keys_of_its_own_sharing_a_prefix_by_direction() {
        let id = OrderId::for_key(&IdempotencyKey::parse("k").unwrap());
        let (done, undone) =
            (step_key(id, "charge", Direction::Do, 2), step_key(id, "charge", Direction::Undo, 2));
        assert_eq!(done, format!("{id}/charge/r2/do"));
        assert_ne!(done, step_key(id, "charge", Direction::Do, 1));
        assert_eq!(done.rsplit_once('/').unwrap().0, undone.rsplit_once('/').unwrap().0);
    }
}
