//! Concurrency keys on DynamoDB: the keys table, one partition per key (`Key`, S: the
//! `<group>/<value>` of [`sas_engine::keys`]), sorted by `Entry` (S).
//!
//! - `Entry = places`: the key's running orders. `Running` (M) maps each place to when it was
//!   taken (N, epoch ms); `Limit` (N) the limit its last admission kept to, for operators;
//!   `Version` (N) is what every write names. A write is one `UpdateItem`
//!   on the condition `Version = :read` (or no item, for the first), so two admissions that
//!   read the same places cannot both take the last one. The item is never deleted: a version
//!   that started over could let a writer whose read is old take a place twice.
//! - `Entry = line#<position>`: one order waiting, at [`Queued::position`] (accepted time, id,
//!   run), so a query of the partition gives the line in order. Written and deleted without a
//!   condition: an entry is the same whoever writes it, and the places item decides who runs.
//!
//! A key with orders running carries `BusyShard` (N) and `BusySince` (N: since when it has had
//! orders running without a break), the keys of the sparse index `ByBusyKey` that lists busy
//! keys for operators. `BusySince` is set only when the key becomes busy and both go when it
//! becomes idle, so the index is written twice per busy spell, not at every admission.

use std::collections::HashMap;

use futures_util::StreamExt;

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure, Select};
use sas_engine::config::SHARD_QUERIES_AT_ONCE;
use sas_engine::keys::{Queued, Slots};
use sas_engine::ports::{BusyKey, KeyIndex, Saved};
use sas_engine::{Error, Result, Timestamp};

use super::{DynamoStore, Item, SERVICE, number, parse_number, string};
use crate::errors::classify;

/// Name of the index of keys with orders running; the template defines it with the same name.
pub const BUSY_INDEX: &str = "ByBusyKey";
/// Shards of [`BUSY_INDEX`]: keys spread over them by a hash of their name. Many more than
/// the index has partitions, so that however DynamoDB places them each partition takes about
/// its share of the keys' busy spells (as the expiry index's shards). Only an operator's
/// listing reads them all.
pub const BUSY_SHARDS: u16 = 128;

const PLACES: &str = "places";
const LINE: &str = "line#";

/// The shard of [`BUSY_INDEX`] that `key` is listed in: FNV-1a of its bytes, stable across
/// builds (the standard library's hasher promises no such thing).
pub fn busy_shard(key: &str) -> u16 {
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    u16::try_from(hash % u64::from(BUSY_SHARDS)).unwrap_or(0)
}

impl DynamoStore {
    fn entry_key(key: &str, entry: String) -> Item {
        HashMap::from([
            ("Key".to_owned(), AttributeValue::S(key.to_owned())),
            ("Entry".to_owned(), AttributeValue::S(entry)),
        ])
    }

    pub(super) async fn read_slots(&self, key: &str) -> Result<Slots> {
        let out = self
            .client
            .get_item()
            .table_name(&self.keys_table)
            .set_key(Some(Self::entry_key(key, PLACES.to_owned())))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| classify(SERVICE, e))?;
        match out.item() {
            None => Ok(Slots::empty(key)),
            Some(item) => slots_from_item(key, item),
        }
    }

    pub(super) async fn write_slots(&self, next: &Slots) -> Result<Saved> {
        let newest = next.running.values().max().copied().unwrap_or(Timestamp::from_millis(0));
        let mut update = self
            .client
            .update_item()
            .table_name(&self.keys_table)
            .set_key(Some(Self::entry_key(&next.key, PLACES.to_owned())))
            .expression_attribute_values(":running", running_value(next))
            .expression_attribute_values(":version", number(next.version))
            .expression_attribute_values(":limit", number(next.limit));
        update = if next.running.is_empty() {
            update.update_expression(
                "SET #running = :running, #version = :version, #limit = :limit \
                 REMOVE BusyShard, BusySince",
            )
        } else {
            // The place just taken is the newest: when an idle key takes one, it is busy since.
            update
                .update_expression(
                    "SET #running = :running, #version = :version, #limit = :limit, \
                     BusyShard = :shard, \
                     BusySince = if_not_exists(BusySince, :since)",
                )
                .expression_attribute_values(":shard", number(busy_shard(&next.key)))
                .expression_attribute_values(":since", number(newest.as_millis()))
        };
        update = match next.version {
            0 => return Err(Error::Config(format!("places of {} written at version 0", next.key))),
            1 => update.condition_expression("attribute_not_exists(#version)"),
            read => update
                .condition_expression("#version = :read")
                .expression_attribute_values(":read", number(read - 1)),
        };
        let result = update
            .expression_attribute_names("#running", "Running")
            .expression_attribute_names("#version", "Version")
            .expression_attribute_names("#limit", "Limit")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::None)
            .send()
            .await;
        match result {
            Ok(_) => Ok(Saved::Saved),
            Err(SdkError::ServiceError(e))
                if matches!(e.err(), UpdateItemError::ConditionalCheckFailedException(_)) =>
            {
                Ok(Saved::Conflict)
            }
            Err(e) => Err(classify(SERVICE, e)),
        }
    }

    pub(super) async fn put_in_line(&self, key: &str, queued: &Queued) -> Result<()> {
        let mut item = Self::entry_key(key, format!("{LINE}{}", queued.position()));
        item.insert("OrderId".to_owned(), AttributeValue::S(queued.order_id.to_string()));
        item.insert("Run".to_owned(), number(queued.run));
        item.insert("Since".to_owned(), number(queued.since.as_millis()));
        item.insert("Attempt".to_owned(), number(queued.attempt));
        item.insert("CorrelationId".to_owned(), AttributeValue::S(queued.correlation_id.clone()));
        if let Some(group) = &queued.group {
            item.insert("Group".to_owned(), AttributeValue::S(group.clone()));
        }
        self.client
            .put_item()
            .table_name(&self.keys_table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| classify(SERVICE, e))?;
        Ok(())
    }

    /// Every item of `KeysTable` under the partition `key` whose entry begins with `prefix`,
    /// read consistently, page after page.
    pub(super) async fn entries(&self, key: &str, prefix: &str) -> Result<Vec<Item>> {
        let mut items = Vec::new();
        let mut start = None;
        loop {
            let out = self
                .client
                .query()
                .table_name(&self.keys_table)
                .key_condition_expression("#key = :key AND begins_with(#entry, :prefix)")
                .expression_attribute_names("#key", "Key")
                .expression_attribute_names("#entry", "Entry")
                .expression_attribute_values(":key", AttributeValue::S(key.to_owned()))
                .expression_attribute_values(":prefix", AttributeValue::S(prefix.to_owned()))
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| classify(SERVICE, e))?;
            items.extend(out.items().iter().cloned());
            start = out.last_evaluated_key;
            if start.is_none() {
                return Ok(items);
            }
        }
    }

    pub(super) async fn read_line(&self, key: &str, limit: usize) -> Result<Vec<Queued>> {
        let mut line = Vec::new();
        let mut start = None;
        while line.len() < limit {
            let out = self
                .client
                .query()
                .table_name(&self.keys_table)
                .key_condition_expression("#key = :key AND begins_with(#entry, :line)")
                .expression_attribute_names("#key", "Key")
                .expression_attribute_names("#entry", "Entry")
                .expression_attribute_values(":key", AttributeValue::S(key.to_owned()))
                .expression_attribute_values(":line", AttributeValue::S(LINE.to_owned()))
                .consistent_read(true)
                .limit(i32::try_from(limit - line.len()).unwrap_or(i32::MAX))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| classify(SERVICE, e))?;
            for item in out.items() {
                line.push(queued_from_item(item)?);
            }
            start = out.last_evaluated_key;
            if start.is_none() {
                break;
            }
        }
        Ok(line)
    }

    pub(super) async fn count_ahead(&self, key: &str, position: &str) -> Result<u32> {
        let mut ahead = 0_u32;
        let mut start = None;
        loop {
            let out = self
                .client
                .query()
                .table_name(&self.keys_table)
                .key_condition_expression("#key = :key AND #entry BETWEEN :first AND :before")
                .expression_attribute_names("#key", "Key")
                .expression_attribute_names("#entry", "Entry")
                .expression_attribute_values(":key", AttributeValue::S(key.to_owned()))
                .expression_attribute_values(":first", AttributeValue::S(LINE.to_owned()))
                .expression_attribute_values(
                    ":before",
                    AttributeValue::S(format!("{LINE}{position}")),
                )
                // BETWEEN takes in the order's own entry: it is not ahead of itself.
                .filter_expression("#entry <> :before")
                .select(Select::Count)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| classify(SERVICE, e))?;
            ahead = ahead.saturating_add(u32::try_from(out.count()).unwrap_or(0));
            start = out.last_evaluated_key;
            if start.is_none() {
                return Ok(ahead);
            }
        }
    }

    pub(super) async fn out_of_line(&self, key: &str, queued: &Queued) -> Result<()> {
        self.client
            .delete_item()
            .table_name(&self.keys_table)
            .set_key(Some(Self::entry_key(key, format!("{LINE}{}", queued.position()))))
            .send()
            .await
            .map_err(|e| classify(SERVICE, e))?;
        Ok(())
    }
}

impl KeyIndex for DynamoStore {
    async fn busy_keys(&self, limit: usize) -> Result<Vec<BusyKey>> {
        let page = i32::try_from(limit.clamp(1, 1000)).unwrap_or(1000);
        // The longest busy of each shard, then of all: a key listed is never passed over for
        // a key busy for less time. A few shards at a time.
        let mut shards = futures_util::stream::iter(0..BUSY_SHARDS)
            .map(|shard| {
                self.client
                    .query()
                    .table_name(&self.keys_table)
                    .index_name(BUSY_INDEX)
                    .key_condition_expression("BusyShard = :shard")
                    .expression_attribute_values(":shard", number(shard))
                    .limit(page)
                    .send()
            })
            .buffer_unordered(SHARD_QUERIES_AT_ONCE);
        let mut busy = Vec::new();
        while let Some(out) = shards.next().await {
            let out = out.map_err(|e| classify(SERVICE, e))?;
            for item in out.items() {
                let key = string(item, "Key")?.to_owned();
                let since = Timestamp::from_millis(parse_number(item, "BusySince")?);
                busy.push(BusyKey { key, since });
            }
        }
        busy.sort_by(|a, b| (a.since, &a.key).cmp(&(b.since, &b.key)));
        busy.truncate(limit);
        Ok(busy)
    }
}

fn running_value(slots: &Slots) -> AttributeValue {
    AttributeValue::M(
        slots.running.iter().map(|(place, at)| (place.clone(), number(at.as_millis()))).collect(),
    )
}

fn slots_from_item(key: &str, item: &Item) -> Result<Slots> {
    let corrupt = |why: String| Error::rejected(SERVICE, format!("places of {key}: {why}"));
    let running = match item.get("Running") {
        None => Default::default(),
        Some(AttributeValue::M(map)) => map
            .iter()
            .map(|(place, at)| {
                let at = at.as_n().ok().and_then(|n| n.parse().ok());
                let at = at.ok_or_else(|| corrupt(format!("place {place} without a time")))?;
                Ok((place.clone(), Timestamp::from_millis(at)))
            })
            .collect::<Result<_>>()?,
        Some(_) => return Err(corrupt("Running is not a map".into())),
    };
    Ok(Slots {
        key: key.to_owned(),
        running,
        limit: parse_number(item, "Limit").unwrap_or(0),
        version: parse_number(item, "Version")?,
    })
}

fn queued_from_item(item: &Item) -> Result<Queued> {
    let raw = string(item, "OrderId")?;
    Ok(Queued {
        order_id: raw
            .parse()
            .map_err(|_| Error::rejected(SERVICE, format!("line entry of order {raw:?}")))?,
        run: parse_number(item, "Run")?,
        since: Timestamp::from_millis(parse_number(item, "Since")?),
        attempt: parse_number(item, "Attempt")?,
        correlation_id: string(item, "CorrelationId")?.to_owned(),
        group: item.get("Group").and_then(|v| v.as_s().ok()).cloned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_spread_over_every_shard_and_stay_where_they_are() {
        let shards: std::collections::BTreeSet<u16> =
            (0..2000).map(|n| busy_shard(&format!("customer/c-{n}"))).collect();
        assert_eq!(shards.len(), usize::from(BUSY_SHARDS));
        assert_eq!(busy_shard("customer/c-1"), busy_shard("customer/c-1"));
        // Pinned: an index entry written by one build is found by the next.
        assert_eq!(busy_shard(""), u16::try_from(0xcbf2_9ce4_8422_2325_u64 % 128).unwrap());
    }

    #[test]
    fn places_survive_the_round_trip_through_an_item() {
        let mut slots = Slots::empty("customer/c-1");
        slots.running.insert("a.0".into(), Timestamp::from_millis(5));
        slots.version = 3;
        slots.limit = 2;
        let item = Item::from([
            ("Running".to_owned(), running_value(&slots)),
            ("Version".to_owned(), number(3)),
            ("Limit".to_owned(), number(2)),
        ]);
        assert_eq!(slots_from_item("customer/c-1", &item).unwrap(), slots);
    }
}
