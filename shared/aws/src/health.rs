//! The services' health records on DynamoDB: one item per service in the services table, key
//! `Service` (S), with `Version` (N), the condition of every write, and the record as JSON in
//! `Body` (S). The table holds one small item per agent, so reading it whole is a one-page
//! scan; an agent reads its own item at most once a second per execution, and writes it only
//! when something changes.
//!
//! A service with declared limits has two more items, whose keys cannot be an agent's name:
//! `<service>#rate`, its next free turn (`Next`, epoch milliseconds), and `<service>#flight`,
//! its places in flight (`P<n>`: until when place n is taken, in epoch milliseconds). Each call
//! takes its turn with one update conditional on the turn it read, and its place with one and
//! gives it back with one; each execution remembers what it last read, and takes its turns one
//! at a time, so that its first try is usually the one that lands.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use sas_engine::health::ServiceRecord;
use sas_engine::pace::{self, Booked, Place, Usage};
use sas_engine::ports::{Pace, Saved, ServiceBook};
use sas_engine::{Error, Result, Timestamp};

use crate::dynamo::Item;
use crate::errors::classify;

const SERVICE: &str = "dynamodb";

/// Tries at most this many conditional writes to take one turn or one place. A write fails
/// only when another caller's landed, and each failure reads what is there, so this bounds a
/// call's work under the heaviest contention; a call that runs out is kept back, as if
/// everything were taken.
const TRIES: usize = 32;

/// The services table.
#[derive(Clone, Debug)]
pub struct DynamoServiceBook {
    client: Client,
    table: String,
    /// What this execution last read of each limited service's tally and places.
    seen: Arc<Mutex<Seen>>,
    /// This execution takes one turn at a time: each starts from the turn the one before it
    /// wrote, so that the calls of one batch, asking together, do not write over each other
    /// (only another execution's turn can stand in the way).
    turning: Arc<tokio::sync::Mutex<()>>,
}

#[derive(Debug, Default)]
struct Seen {
    turns: HashMap<String, Timestamp>,
    places: HashMap<String, BTreeMap<u32, Timestamp>>,
}

impl DynamoServiceBook {
    pub fn new(client: Client, table: String) -> Self {
        DynamoServiceBook { client, table, seen: Arc::default(), turning: Arc::default() }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Updates the item `key` as `update` says on `condition`: the item after it, or what
    /// stood in the way (the item as it was) when the condition failed.
    async fn update(
        &self,
        key: String,
        update: &str,
        condition: &str,
        values: Vec<(&str, AttributeValue)>,
        names: Vec<(&str, String)>,
    ) -> Result<std::result::Result<Item, Item>> {
        let mut call = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("Service", AttributeValue::S(key))
            .update_expression(update)
            .condition_expression(condition)
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        for (name, value) in values {
            call = call.expression_attribute_values(name, value);
        }
        for (alias, name) in names {
            call = call.expression_attribute_names(alias, name);
        }
        match call.send().await {
            Ok(out) => Ok(Ok(out.attributes.unwrap_or_default())),
            Err(e) => {
                if let SdkError::ServiceError(failure) = &e
                    && let UpdateItemError::ConditionalCheckFailedException(failed) = failure.err()
                {
                    return Ok(Err(failed.item.clone().unwrap_or_default()));
                }
                Err(classify(SERVICE, e))
            }
        }
    }

    async fn get(&self, key: String) -> Result<Item> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("Service", AttributeValue::S(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| classify(SERVICE, e))?;
        Ok(out.item.unwrap_or_default())
    }
}

fn rate_key(service: &str) -> String {
    format!("{service}#rate")
}

fn flight_key(service: &str) -> String {
    format!("{service}#flight")
}

fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn number_of(item: &Item, name: &str) -> Option<i64> {
    item.get(name).and_then(|v| v.as_n().ok()).and_then(|n| n.parse().ok())
}

fn places_of(item: &Item) -> BTreeMap<u32, Timestamp> {
    item.iter()
        .filter_map(|(name, v)| {
            let slot = name.strip_prefix('P')?.parse().ok()?;
            let until = v.as_n().ok()?.parse().ok()?;
            Some((slot, Timestamp::from_millis(until)))
        })
        .collect()
}

impl Pace for DynamoServiceBook {
    async fn take_turn(
        &self,
        service: &str,
        spacing: Duration,
        now: Timestamp,
        latest: Timestamp,
    ) -> Result<Booked> {
        let _one_at_a_time = self.turning.lock().await;
        let mut seen = self.seen().turns.get(service).copied();
        for _ in 0..TRIES {
            let turn = pace::turn(seen, now, spacing);
            // The next free turn only moves on: if it was too late when read, it still is.
            if turn.start > latest {
                return Ok(Booked::TooLate { next: turn.start });
            }
            let mut values = vec![(":next", n(turn.next.as_millis()))];
            let condition = match seen {
                None => "attribute_not_exists(#n)",
                Some(seen) => {
                    values.push((":seen", n(seen.as_millis())));
                    "#n = :seen"
                }
            };
            let names = vec![("#n", "Next".to_owned())];
            let landed =
                self.update(rate_key(service), "SET #n = :next", condition, values, names).await?;
            match landed {
                Ok(_) => {
                    self.seen().turns.insert(service.to_owned(), turn.next);
                    return Ok(Booked::Start(turn.start));
                }
                Err(item) => seen = number_of(&item, "Next").map(Timestamp::from_millis),
            }
        }
        // Others kept taking the turn this call aimed at: it waits for the next free one.
        let next = seen.map_or(now, |seen| seen.max(now));
        Ok(Booked::TooLate { next })
    }

    async fn enter(
        &self,
        service: &str,
        limit: u32,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<Option<Place>> {
        let mut places = self.seen().places.get(service).cloned();
        for _ in 0..TRIES {
            let known = match places.take() {
                Some(known) => known,
                None => places_of(&self.get(flight_key(service)).await?),
            };
            let Some(slot) = pace::free_place(&known, limit, now) else {
                self.seen().places.insert(service.to_owned(), known.clone());
                // What this execution saw may be old: a free place is looked for once more
                // in what is there now, and only then is the call told to wait.
                let now_there = places_of(&self.get(flight_key(service)).await?);
                if pace::free_place(&now_there, limit, now).is_none() {
                    self.seen().places.insert(service.to_owned(), now_there);
                    return Ok(None);
                }
                places = Some(now_there);
                continue;
            };
            let values = vec![(":until", n(until.as_millis())), (":now", n(now.as_millis()))];
            let names = vec![("#p", format!("P{slot}"))];
            let condition = "attribute_not_exists(#p) OR #p <= :now";
            let landed = self
                .update(flight_key(service), "SET #p = :until", condition, values, names)
                .await?;
            match landed {
                Ok(item) => {
                    self.seen().places.insert(service.to_owned(), places_of(&item));
                    return Ok(Some(Place { slot, until }));
                }
                Err(item) => places = Some(places_of(&item)),
            }
        }
        Ok(None)
    }

    async fn leave(&self, service: &str, place: Place) -> Result<()> {
        let values = vec![(":until", n(place.until.as_millis()))];
        let names = vec![("#p", format!("P{}", place.slot))];
        // Someone may have taken the place again past its `until`: theirs is left alone.
        let landed =
            self.update(flight_key(service), "REMOVE #p", "#p = :until", values, names).await?;
        let item = match landed {
            Ok(item) | Err(item) => item,
        };
        self.seen().places.insert(service.to_owned(), places_of(&item));
        Ok(())
    }

    async fn usage(&self, service: &str, now: Timestamp) -> Result<Usage> {
        let next = number_of(&self.get(rate_key(service)).await?, "Next");
        let places = places_of(&self.get(flight_key(service)).await?);
        Ok(Usage::at(now, next.map(Timestamp::from_millis), &places))
    }
}

impl ServiceBook for DynamoServiceBook {
    async fn load(&self, service: &str) -> Result<Option<ServiceRecord>> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("Service", AttributeValue::S(service.to_owned()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| classify(SERVICE, e))?;
        out.item.as_ref().map(record_of).transpose()
    }

    async fn all(&self) -> Result<Vec<ServiceRecord>> {
        let mut records = Vec::new();
        let mut start = None;
        loop {
            let out = self
                .client
                .scan()
                .table_name(&self.table)
                .consistent_read(true)
                // Limited services' tallies and places have no record body.
                .filter_expression("attribute_exists(Body)")
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| classify(SERVICE, e))?;
            for item in out.items() {
                records.push(record_of(item)?);
            }
            start = out.last_evaluated_key;
            if start.is_none() {
                records.sort_by(|a, b| a.service.cmp(&b.service));
                return Ok(records);
            }
        }
    }

    async fn save(&self, next: &ServiceRecord) -> Result<Saved> {
        let body = serde_json::to_string(next).map_err(|e| Error::rejected(SERVICE, e))?;
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .item("Service", AttributeValue::S(next.service.clone()))
            .item("Version", AttributeValue::N(next.version.to_string()))
            .item("Body", AttributeValue::S(body))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::None);
        let put = match next.version {
            0 => {
                return Err(Error::rejected(SERVICE, "a service record is written from version 1"));
            }
            1 => put.condition_expression("attribute_not_exists(Service)"),
            v => put
                .condition_expression("Version = :v")
                .expression_attribute_values(":v", AttributeValue::N((v - 1).to_string())),
        };
        match put.send().await {
            Ok(_) => Ok(Saved::Saved),
            Err(SdkError::ServiceError(e))
                if matches!(e.err(), PutItemError::ConditionalCheckFailedException(_)) =>
            {
                Ok(Saved::Conflict)
            }
            Err(e) => Err(classify(SERVICE, e)),
        }
    }
}

fn record_of(item: &Item) -> Result<ServiceRecord> {
    let body = item
        .get("Body")
        .and_then(|v| v.as_s().ok())
        .ok_or_else(|| Error::rejected(SERVICE, "a service item without Body"))?;
    serde_json::from_str(body).map_err(|e| Error::rejected(SERVICE, format!("service record: {e}")))
}
