//! Bulk commands ([`crate::bulk`]): asked for with the count the caller was shown, and refused
//! with the count of now if the listing changed since; then applied by a driver a slice at a
//! time, each order through the operator's own command, and reported as they go.

use std::time::Duration;

use crate::bulk::{BulkFilter, BulkJob, MAX_BULK, Outcome, Tally};
use crate::error::{Error, Result};
use crate::ports::{
    BulkBook, Clock, Counted, EventBus, OrderFinder, Outbox, Payloads, Saved, StateStore,
};
use crate::services::{Applied, Command, Operator};
use crate::time::Timestamp;

/// Most pages of its listing one slice of a bulk command reads.
const PAGES_PER_SLICE: usize = 20;

/// A bulk command as asked for.
#[derive(Clone, Debug)]
pub struct Ask {
    pub command: Command,
    pub filter: BulkFilter,
    /// How many orders the caller was shown the listing holds.
    pub expected: u64,
}

/// What came of asking.
#[derive(Clone, Debug, PartialEq)]
pub enum Started {
    /// The job was made; it goes from the next drive.
    New(BulkJob),
    /// The same command id asked for the same thing before: that job, as it stands.
    Existing(BulkJob),
    /// The listing holds another count than the caller was shown: nothing was made.
    Changed { count: Counted },
    /// More orders match than one job may take: nothing was made.
    TooMany { count: Counted },
}

/// Makes the job `ask` asks for, unless the listing changed under it.
pub async fn start<F, K>(
    finder: &F,
    book: &K,
    ask: Ask,
    now: Timestamp,
    shards: u16,
) -> Result<Started>
where
    F: OrderFinder,
    K: BulkBook,
{
    let job = BulkJob {
        id: ask.command.id.clone(),
        command: ask.command.kind,
        filter: ask.filter,
        by: ask.command.by,
        reason: ask.command.reason,
        expected: ask.expected,
        as_of: now,
        created_at: now,
        updated_at: now,
        cursor: None,
        round: 0,
        tally: Tally::default(),
        refusals: Vec::new(),
        finished: false,
    };
    if let Some(earlier) = book.job(&job.id).await? {
        return same_or_refused(earlier, &job);
    }
    let count = finder.count(&job.filter.query(now, shards, 1, None), MAX_BULK).await?;
    if count.capped {
        return Ok(Started::TooMany { count });
    }
    if count.orders != job.expected {
        return Ok(Started::Changed { count });
    }
    if book.create_job(&job).await? {
        return Ok(Started::New(job));
    }
    // Made a moment ago by a retry of this very ask.
    match book.job(&job.id).await? {
        Some(earlier) => same_or_refused(earlier, &job),
        None => Err(Error::unavailable("bulk jobs", "the job was made and is not found yet")),
    }
}

fn same_or_refused(earlier: BulkJob, asked: &BulkJob) -> Result<Started> {
    if earlier.same_ask(asked) {
        Ok(Started::Existing(earlier))
    } else {
        Err(Error::InvalidCommand(format!(
            "the command id {:?} was used for another bulk command ({} on {:?})",
            asked.id,
            earlier.command.as_str(),
            earlier.filter.list
        )))
    }
}

/// How much of a job one drive takes.
#[derive(Clone, Copy, Debug)]
pub struct Slice {
    /// Most orders commanded.
    pub orders: usize,
    /// The steps each order's command frees start this many orders a second (SQS delays
    /// messages by whole seconds), as the orders a hold's end resumes do, so that a slice of
    /// thousands reaches the services at a pace and not at once.
    pub per_second: usize,
}

/// Applies the command of job `id` to at most `slice.orders` more orders of its listing, and
/// saves how far it went. Returns the job as it stands (as another driver saved it, if one saved
/// first), or `None` if there is no such job. An error leaves the slice unsaved: the next
/// drive takes it again, and each order already commanded answers "applied before".
pub async fn advance<F, K, S, Q, B, C, P>(
    finder: &F,
    book: &K,
    operator: &Operator<S, Q, B, C, P>,
    id: &str,
    slice: Slice,
    now: Timestamp,
    shards: u16,
) -> Result<Option<BulkJob>>
where
    F: OrderFinder,
    K: BulkBook,
    S: StateStore,
    Q: Outbox,
    B: EventBus,
    C: Clock,
    P: Payloads,
{
    let Some(mut job) = book.job(id).await? else { return Ok(None) };
    if job.finished || slice.orders == 0 {
        return Ok(Some(job));
    }
    let mut command = Command::new(job.command, &job.id, &job.by, &job.reason)?;
    let round = job.round;
    let mut left = slice.orders;
    let mut commanded = 0usize;
    let mut pages = 0;
    // A filter that matches few of the orders a listing reads may make short pages: the job goes
    // on from its cursor at the next sweep rather than reading on.
    while left > 0 && !job.finished && pages < PAGES_PER_SLICE {
        pages += 1;
        let page = finder.find(&job.next_page(now, shards, left)).await?;
        for listed in &page.orders {
            if listed.entered > job.as_of {
                job.record(listed.order_id, Outcome::Newer);
                continue;
            }
            command.after = Duration::from_secs((commanded / slice.per_second.max(1)) as u64);
            commanded += 1;
            let outcome = match operator.command(listed.order_id, &command).await? {
                None => Outcome::Gone,
                Some(done) => match done.applied {
                    Applied::Now => Outcome::Applied,
                    Applied::Before => Outcome::Before,
                    Applied::Refused(refused) => Outcome::Refused(refused.code()),
                },
            };
            job.record(listed.order_id, outcome);
            left = left.saturating_sub(1);
        }
        job.finished = page.next.is_none();
        job.cursor = page.next;
    }
    job.round += 1;
    job.updated_at = now;
    match book.save_job(&job, round).await? {
        Saved::Saved => Ok(Some(job)),
        Saved::Conflict => book.job(id).await,
    }
}
