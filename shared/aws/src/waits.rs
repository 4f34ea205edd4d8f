//! The wait gauge on DynamoDB: one item per consumer process and queue in the queue-waits
//! table, replaced by the process's next report, and read whole.
//!
//! # Items
//!
//! Key `Queue` (S, the queue's name: `scheduler`, `replies`, `agent:<name>`) and `Reporter`
//! (S, the process). `WaitMs`, `At`, `Until` and `Expires` (N, epoch ms), `Rate` (N, messages
//! per second), and `ExpiresAt` (N, epoch seconds), the table's time-to-live attribute, an
//! hour after the report stops mattering, so the reports of processes long gone are deleted.
//!
//! # Cost
//!
//! A consumer writes its report at most every 5 s while messages wait a second or more, and
//! once a minute otherwise, and only while it takes messages: an idle system writes nothing.
//! A read is one eventually consistent `Scan` of a table that holds a few items per live
//! process; the door reads it at most every 5 s per container, the supervisor once a sweep.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::AttributeValue;
use sas_engine::ports::{Destination, WaitGauge, WaitReport};
use sas_engine::{Error, Result, Timestamp};

use crate::errors::classify;

const SERVICE: &str = "dynamodb";
/// How long DynamoDB keeps a report after it stopped mattering, before deleting it.
const KEEP_AFTER_EXPIRY: Duration = Duration::from_secs(3600);

/// The [`WaitGauge`] port on a DynamoDB table.
#[derive(Clone, Debug)]
pub struct DynamoWaits {
    client: Client,
    table: String,
}

impl DynamoWaits {
    pub fn new(client: Client, table: String) -> Self {
        DynamoWaits { client, table }
    }
}

impl WaitGauge for DynamoWaits {
    async fn report(&self, r: &WaitReport) -> Result<()> {
        let ttl = r.expires.plus(KEEP_AFTER_EXPIRY).as_millis() / 1000;
        let item = HashMap::from([
            ("Queue".to_owned(), AttributeValue::S(r.queue.name())),
            ("Reporter".to_owned(), AttributeValue::S(r.reporter.clone())),
            ("WaitMs".to_owned(), number(r.wait.as_millis())),
            ("Rate".to_owned(), number(format!("{:.3}", r.rate))),
            ("At".to_owned(), number(r.at.as_millis())),
            ("Until".to_owned(), number(r.until.as_millis())),
            ("Expires".to_owned(), number(r.expires.as_millis())),
            ("ExpiresAt".to_owned(), number(ttl)),
        ]);
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| classify(SERVICE, e))?;
        Ok(())
    }

    async fn reports(&self, now: Timestamp) -> Result<Vec<WaitReport>> {
        let mut reports = Vec::new();
        let mut pages = self
            .client
            .scan()
            .table_name(&self.table)
            // Only what still matters comes back (the scan reads, and bills, the rest too).
            .filter_expression("Expires > :now")
            .expression_attribute_values(":now", number(now.as_millis()))
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| classify(SERVICE, e))?;
            for item in page.items() {
                reports.push(from_item(item)?);
            }
        }
        Ok(reports)
    }
}

fn from_item(item: &HashMap<String, AttributeValue>) -> Result<WaitReport> {
    let text = |name: &str| -> Result<&str> {
        item.get(name)
            .and_then(|v| v.as_s().ok())
            .map(String::as_str)
            .ok_or_else(|| malformed(name))
    };
    let num = |name: &str| -> Result<f64> {
        item.get(name)
            .and_then(|v| v.as_n().ok())
            .and_then(|n| n.parse::<f64>().ok())
            .filter(|n| n.is_finite())
            .ok_or_else(|| malformed(name))
    };
    let queue = text("Queue")?;
    let millis = |name: &str| num(name).map(|n| Timestamp::from_millis(n as i64));
    Ok(WaitReport {
        queue: Destination::parse(queue).ok_or_else(|| malformed("Queue"))?,
        reporter: text("Reporter")?.to_owned(),
        wait: Duration::from_millis(num("WaitMs")?.max(0.0) as u64),
        rate: num("Rate")?.max(0.0),
        at: millis("At")?,
        until: millis("Until")?,
        expires: millis("Expires")?,
    })
}

fn malformed(attribute: &str) -> Error {
    Error::rejected(SERVICE, format!("queue-wait report without a valid {attribute}"))
}

fn number(n: impl ToString) -> AttributeValue {
    AttributeValue::N(n.to_string())
}
