//! A command for every order a listing holds ("all that match"), kept as a job: what it acts
//! on, as of when it was asked, how far it has gone, and what each order made of it.
//!
//! A job acts on the orders its listing held when it was asked (`as_of`): an order that joins
//! the listing later is counted as newer and left alone. It walks the listing from its newest
//! entry to its oldest with the listing's own cursor, which stays good as acted-on orders
//! leave the listing. Every order gets the job's id as its command id, so a slice applied twice
//! changes nothing the second time; the job's `round` lets two drivers of one job take turns.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ids::OrderId;
use crate::ports::{ListQuery, Listing};
use crate::state::CommandKind;
use crate::time::Timestamp;

/// Most orders one job may act on: a filter that matches more must be narrowed.
pub const MAX_BULK: u64 = 100_000;
/// Refusals kept by order on the job, for its report; beyond them, only counted.
pub const REFUSALS_KEPT: usize = 50;
/// Orders read from the listing at a time.
const PAGE: usize = 100;

/// Which listing a job acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BulkList {
    Failed,
    Paused,
    InFlight,
    Reported,
    AwaitingAnswer,
}

/// A listing and its filters, as an operator's listing takes them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulkFilter {
    pub list: BulkList,
    #[serde(default, deserialize_with = "given", skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    #[serde(default, deserialize_with = "given", skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    #[serde(default, deserialize_with = "given", skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// For an in-flight listing: orders watched for at least this many seconds.
    #[serde(default)]
    pub older_than_s: u64,
}

/// A filter left out is none; one given must be a name (`null` is refused, as the API's
/// schema says).
fn given<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    String::deserialize(d).map(Some)
}

impl BulkFilter {
    /// The listing query for a page of at most `limit` orders after `after`.
    pub fn query(
        &self,
        now: Timestamp,
        shards: u16,
        limit: usize,
        after: Option<String>,
    ) -> ListQuery {
        let listing = match self.list {
            BulkList::Failed => Listing::Failed,
            BulkList::Paused => Listing::Paused,
            BulkList::Reported => Listing::Reported,
            BulkList::AwaitingAnswer => Listing::AwaitingAnswer,
            BulkList::InFlight => {
                Listing::InFlight { older_than: Duration::from_secs(self.older_than_s) }
            }
        };
        ListQuery {
            listing,
            step: self.step.clone(),
            cause: self.cause.clone(),
            workflow: self.workflow.clone(),
            now,
            shards,
            limit: limit.clamp(1, PAGE),
            after,
        }
    }
}

/// What the orders a job reached made of its command.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    /// Applied by this job.
    pub applied: u64,
    /// Applied before, by an earlier run of the same job (or command id).
    pub before: u64,
    /// Refused by the order's state (why, in `refusals`).
    pub refused: u64,
    /// Listed, but gone when acted on (deleted at the end of their retention).
    pub gone: u64,
    /// Listed after the job was asked for: left alone.
    pub newer: u64,
}

impl Tally {
    /// Orders the job acted on, whatever came of it.
    pub fn reached(&self) -> u64 {
        self.applied + self.before + self.refused + self.gone
    }
}

/// An order that refused the command, and why (the code the API answers a refusal with).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    pub order_id: OrderId,
    pub code: String,
}

/// A bulk command and how far it has gone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkJob {
    /// The command id every order gets, chosen by the caller: the same on every retry.
    pub id: String,
    pub command: CommandKind,
    pub filter: BulkFilter,
    /// Who asked, as the API authenticated them, and why.
    pub by: String,
    pub reason: String,
    /// How many orders the listing held when it was asked, as the caller was shown.
    pub expected: u64,
    /// Orders that joined the listing later than this are left alone.
    pub as_of: Timestamp,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// Where the walk of the listing stands: the cursor of the next page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    /// Slices applied so far; a driver saves its slice only if no other saved one first.
    pub round: u64,
    pub tally: Tally,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refusals: Vec<Refusal>,
    /// The walk reached the listing's end.
    pub finished: bool,
}

impl BulkJob {
    /// The query of the next page of at most `limit` orders.
    pub fn next_page(&self, now: Timestamp, shards: u16, limit: usize) -> ListQuery {
        self.filter.query(now, shards, limit, self.cursor.clone())
    }

    /// Records what `order_id` made of the command.
    pub fn record(&mut self, order_id: OrderId, outcome: Outcome) {
        let tally = &mut self.tally;
        match outcome {
            Outcome::Applied => tally.applied += 1,
            Outcome::Before => tally.before += 1,
            Outcome::Gone => tally.gone += 1,
            Outcome::Newer => tally.newer += 1,
            Outcome::Refused(code) => {
                tally.refused += 1;
                if self.refusals.len() < REFUSALS_KEPT {
                    self.refusals.push(Refusal { order_id, code: code.to_owned() });
                }
            }
        }
    }

    /// Whether `other` asks for the same thing: the same command on the same listing, so that
    /// the same id asked for again is the same job.
    pub fn same_ask(&self, other: &BulkJob) -> bool {
        self.command == other.command && self.filter == other.filter
    }
}

/// What one order made of a job's command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Applied,
    Before,
    Refused(&'static str),
    Gone,
    Newer,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_left_out_is_none_and_one_given_as_null_is_refused() {
        let read = |text: &str| serde_json::from_str::<BulkFilter>(text);
        let filter = read(r#"{"list": "awaiting-answer", "step": "fraud-review"}"#).unwrap();
        assert_eq!(
            (filter.list, filter.step.as_deref()),
            (BulkList::AwaitingAnswer, Some("fraud-review"))
        );
        assert_eq!(filter.cause, None);
        assert!(read(r#"{"list": "failed", "cause": null}"#).is_err());
        assert!(read(r#"{"list": "failed", "limit": 3}"#).is_err(), "unknown fields");
    }

    fn job() -> BulkJob {
        let t = Timestamp::from_millis(1_800_000_000_000);
        BulkJob {
            id: "bulk-1".into(),
            command: CommandKind::Cancel,
            filter: BulkFilter {
                list: BulkList::Paused,
                workflow: Some("order-fulfilment".into()),
                step: None,
                cause: None,
                older_than_s: 0,
            },
            by: "arn:ops".into(),
            reason: "supplier gone".into(),
            expected: 3,
            as_of: t,
            created_at: t,
            updated_at: t,
            cursor: None,
            round: 0,
            tally: Tally::default(),
            refusals: Vec::new(),
            finished: false,
        }
    }

    #[test]
    fn a_job_keeps_its_tally_and_the_first_refusals_and_reads_back_as_written() {
        let mut j = job();
        let id = OrderId::from_uuid(uuid::Uuid::nil());
        for _ in 0..REFUSALS_KEPT + 5 {
            j.record(id, Outcome::Refused("finished"));
        }
        j.record(id, Outcome::Applied);
        j.record(id, Outcome::Before);
        j.record(id, Outcome::Gone);
        j.record(id, Outcome::Newer);
        assert_eq!(j.tally.refused, (REFUSALS_KEPT + 5) as u64);
        assert_eq!(j.refusals.len(), REFUSALS_KEPT);
        assert_eq!(j.tally.reached(), (REFUSALS_KEPT + 8) as u64, "the newer one is not reached");
        let text = serde_json::to_string(&j).unwrap();
        assert_eq!(serde_json::from_str::<BulkJob>(&text).unwrap(), j);
        assert!(text.contains(r#""list":"paused""#), "{text}");
    }

    #[test]
    fn a_job_pages_its_listing_with_its_own_filters() {
        let mut j = job();
        j.cursor = Some("c".into());
        let q = j.next_page(j.as_of, 4, 1_000);
        assert_eq!((q.listing, q.limit, q.after.as_deref()), (Listing::Paused, PAGE, Some("c")));
        assert_eq!(q.workflow.as_deref(), Some("order-fulfilment"));
        let mut other = job();
        assert!(j.same_ask(&other));
        other.command = CommandKind::Resume;
        assert!(!j.same_ask(&other));
    }
}
