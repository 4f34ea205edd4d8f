//! What operators see of concurrency keys ([`crate::keys`]): the keys with orders running,
//! how many wait behind them and since when, and one key's running orders and line in order.
//!
//! Reading changes nothing: cancelling a key's waiting orders is one operator command per
//! order, each recorded with who gave it and why.

use serde::Serialize;

use crate::error::Result;
use crate::ids::OrderId;
use crate::keys::{END_OF_LINE, Slots};
use crate::ports::{KeyIndex, StateStore};
use crate::time::Timestamp;

/// Most orders of a line one view lists.
pub const MAX_LINE: usize = 1000;

/// A key with orders running, as `sas keys` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KeySummary {
    pub key: String,
    /// As the key's places last recorded it.
    pub limit: u32,
    pub running: u32,
    pub waiting: u32,
    /// Since when the key has had orders running without a break.
    pub busy_since: String,
    /// When the order first in line joined it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oldest_waiting_since: Option<String>,
}

/// One key: its running orders and its line, first to start first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KeyView {
    pub key: String,
    pub limit: u32,
    pub running: Vec<Placed>,
    pub waiting: Vec<Placed>,
    /// More orders wait than `waiting` lists.
    pub more_waiting: bool,
}

/// An order running under a key (since it took its place), or waiting (since it joined the
/// line).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Placed {
    pub order_id: OrderId,
    pub since: String,
}

/// Reads keys for operators.
#[derive(Debug)]
pub struct Keyring<S> {
    store: S,
}

impl<S: StateStore + KeyIndex> Keyring<S> {
    pub fn new(store: S) -> Self {
        Keyring { store }
    }

    /// Up to `limit` keys with orders running, the longest busy first.
    pub async fn list(&self, limit: usize) -> Result<Vec<KeySummary>> {
        let mut summaries = Vec::new();
        for busy in self.store.busy_keys(limit).await? {
            let slots = self.store.slots(&busy.key).await?;
            let waiting = self.store.ahead(&busy.key, END_OF_LINE).await?;
            let first = match waiting {
                0 => None,
                _ => self.store.line(&busy.key, 1).await?.first().map(|q| q.since),
            };
            summaries.push(KeySummary {
                limit: slots.limit,
                running: u32::try_from(slots.running.len()).unwrap_or(u32::MAX),
                waiting,
                busy_since: busy.since.to_rfc3339(),
                oldest_waiting_since: first.map(Timestamp::to_rfc3339),
                key: busy.key,
            });
        }
        Ok(summaries)
    }

    /// `key`'s running orders and the first `limit` of its line.
    pub async fn key(&self, key: &str, limit: usize) -> Result<KeyView> {
        let slots = self.store.slots(key).await?;
        let limit = limit.min(MAX_LINE);
        let mut line = self.store.line(key, limit + 1).await?;
        let more_waiting = line.len() > limit;
        line.truncate(limit);
        Ok(KeyView {
            key: key.to_owned(),
            limit: slots.limit,
            running: running(&slots),
            waiting: line
                .into_iter()
                .map(|q| Placed { order_id: q.order_id, since: q.since.to_rfc3339() })
                .collect(),
            more_waiting,
        })
    }
}

fn running(slots: &Slots) -> Vec<Placed> {
    let mut running: Vec<Placed> = slots
        .running
        .iter()
        .filter_map(|(place, at)| {
            let order_id = Slots::order_of(place)?;
            Some(Placed { order_id, since: at.to_rfc3339() })
        })
        .collect();
    running.sort_by(|a, b| a.since.cmp(&b.since));
    running
}
