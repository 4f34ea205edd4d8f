//! The supervisor: sweeps the expiry index for leases that ran out and acts on each with one
//! conditional write: retry later, compensate, or give up with an alert.
//!
//! Index entries are only hints (the index is eventually consistent): each record is re-read
//! and the decision is made on what the table says, then written on the condition that the
//! record is still exactly that. Two supervisors sweeping at once therefore never both act on a
//! record: the second write fails its condition.
//!
//! A late message is not a lost one. Before it sweeps, the supervisor reads how long messages
//! currently wait in the queues ([`crate::load`]) and looks only at leases that ran out longer
//! ago than that horizon: the others may only be waiting for their messages, and are neither
//! read nor written. While a queue holds messages that no consumer takes, it judges nothing.
//!
//! It also tends the services ([`Supervisor::tend`]): one alert for each hold (of a service or
//! of one of its actions), each release and each hold that lasts past the operators'
//! threshold, and, for a hold that ended, the orders that waited for it resumed at the stack's
//! `RESUME_PER_SECOND`, spread over the minute until its next sweep. An alert, too, is
//! written before it is sent: the supervisor records on the service's record that it
//! announces the change, so that two supervisors tending at once publish it once.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::{StreamExt, stream};
use tracing::{Instrument, debug, error, info_span, warn};

use super::Handled;
use super::effects::Ports;
use super::{Operator, bulk};
use crate::OrderId;
use crate::bulk::BulkJob;
use crate::config::SHARD_QUERIES_AT_ONCE;
use crate::error::{Error, Result};
use crate::events::{BusEvent, ServiceEvent};
use crate::health::{ServiceRecord, hold_key};
use crate::load::{Horizon, LoadSource};
use crate::machine::{Decision, Input, decide};
use crate::mutants::{self, Mutant};
use crate::payload::NoPayloads;
use crate::ports::{
    BulkBook, Clock, EventBus, ExpiryIndex, HeldIndex, IndexEntry, OrderFinder, Outbox, Payloads,
    Read, Saved, ServiceBook, StateStore,
};
use crate::time::Timestamp;

/// What one sweep did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SweepReport {
    /// How long past its CompleteBy a lease was left alone, its messages possibly still
    /// waiting in a queue.
    pub horizon_ms: u64,
    /// A queue that held messages nobody took: nothing was judged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stalled: Option<String>,
    /// Index entries returned by the queries.
    pub found: usize,
    /// Records changed by this supervisor.
    pub acted: usize,
    /// Entries with nothing to do (not expired after all, moved on, finished).
    pub ignored: usize,
    /// Records the machine cannot judge (corrupt, or naming a step the workflow lost); each is
    /// logged as an error.
    pub illegal: usize,
    /// Records another writer changed first.
    pub lost_races: usize,
    /// Records that could not be handled; they stay in the index for the next sweep.
    pub errors: usize,
    /// How long the oldest order the index holds has been worked on without a break; absent if
    /// a shard could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oldest_ms: Option<u64>,
}

/// Expired records one sweep handles at once.
const REPAIRS_AT_ONCE: usize = 32;

/// The time over which the orders a sweep resumes are spread: until the next sweep.
pub const RESUME_SPREAD: Duration = Duration::from_secs(60);
/// Most bulk jobs a sweep reads; the finished ones among them are kept for their reports.
const BULK_JOBS_READ: usize = 100;

/// Alerts of one service published at once: what one `PutEvents` takes.
const MAX_SERVICE_ALERTS: usize = 10;

/// What one tending of the services did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ServicesReport {
    /// Services held now.
    pub held: usize,
    /// Holds and releases announced to the operators.
    pub announced: usize,
    /// Orders resumed for services open again.
    pub resumed: usize,
    /// Orders or services that could not be handled; tried again at the next sweep (an alert
    /// that could not be published, once `ALERT_RETRY_SECONDS` have passed).
    pub errors: usize,
}

/// The supervisor, over its ports.
#[derive(Debug)]
pub struct Supervisor<S, X, Q, B, C, L, P = NoPayloads> {
    ports: Ports<S, Q, B, C, P>,
    index: X,
    load: L,
}

impl<S, X, Q, B, C, L, P> Supervisor<S, X, Q, B, C, L, P>
where
    S: StateStore,
    X: ExpiryIndex,
    Q: Outbox,
    B: EventBus,
    C: Clock,
    L: LoadSource,
    P: Payloads,
{
    /// `load` tells how long messages wait in the queues.
    pub fn new(ports: Ports<S, Q, B, C, P>, index: X, load: L) -> Self {
        Supervisor { ports, index, load }
    }

    /// One sweep over every shard, at most `sweep_limit` records in all, the longest expired
    /// first. Each shard is read once, [`SHARD_QUERIES_AT_ONCE`] at a time, for what is due
    /// by the longest a lease can last: how long the oldest order has been worked on comes from
    /// all of it, and what has expired is its head. Records are handled [`REPAIRS_AT_ONCE`] at
    /// a time. Fails if the queues' load cannot be read (without it a late message cannot be
    /// told from a lost one), or if no shard could be read at all.
    pub async fn sweep(&self) -> Result<SweepReport> {
        let now = self.ports.clock.now();
        let config = &self.ports.config;
        let shards = config.index_shards;
        // Read before anything can stop the sweep: an order held up by a stalled queue is
        // exactly what the oldest order's age must show.
        let due_by = now.plus(config.claim_grace + config.wait.max + crate::workflow::MAX_BUDGET);
        let reads: Vec<Result<Vec<IndexEntry>>> = stream::iter(0..shards)
            .map(|shard| self.index.due(shard, due_by))
            .buffer_unordered(SHARD_QUERIES_AT_ONCE)
            .collect()
            .await;
        let oldest_ms = oldest(&reads, now);
        let load = self.load.load(now).await?;
        let horizon = match load.horizon(&self.ports.catalogue) {
            _ if mutants::on(Mutant::NoHorizon) => Duration::ZERO,
            Horizon::Within(horizon) => horizon,
            Horizon::Stalled(queue) => {
                warn!(queue = %queue.name(), "messages wait and nobody takes them: no lease is judged");
                return Ok(SweepReport {
                    stalled: Some(queue.name()),
                    oldest_ms,
                    ..SweepReport::default()
                });
            }
        };
        let cutoff = now.minus(horizon);
        // Each shard gives at most twice its even share of the limit, since leases do not
        // expire evenly over the shards; the limit itself bounds the repairs.
        let limit = config.sweep_limit;
        let per_shard = (2 * limit).div_ceil(usize::from(shards)).max(1);

        let horizon_ms = u64::try_from(horizon.as_millis()).unwrap_or(u64::MAX);
        let mut report = SweepReport { horizon_ms, oldest_ms, ..SweepReport::default() };
        let mut first_error = None;
        let mut entries = Vec::new();
        for result in reads {
            match result {
                // Earliest due first.
                Ok(due) => entries.extend(
                    due.into_iter().take_while(|e| e.complete_by <= cutoff).take(per_shard),
                ),
                Err(e) => {
                    report.errors += 1;
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error.filter(|_| report.errors == usize::from(shards)) {
            return Err(e);
        }
        if entries.len() > limit {
            entries.sort_by_key(|entry| entry.complete_by);
            entries.truncate(limit);
        }
        report.found = entries.len();
        // Side by side, a bounded number at once: a minute of a busy stack's leases is repaired
        // well within the supervisor's timeout, without a burst of calls on the tables.
        let mut handled = stream::iter(entries)
            .map(|entry| async move { (entry.order_id, self.handle(entry, horizon).await) })
            .buffer_unordered(REPAIRS_AT_ONCE);
        while let Some((order_id, result)) = handled.next().await {
            match result {
                Ok(Handled::Applied | Handled::Replayed) => report.acted += 1,
                Ok(Handled::LostRace) => report.lost_races += 1,
                Ok(Handled::Illegal(_)) => report.illegal += 1,
                Ok(_) => report.ignored += 1,
                Err(e) => {
                    warn!(%order_id, error = %e, "could not handle an expired record");
                    report.errors += 1;
                }
            }
        }
        crate::metrics::swept(report.found, report.acted, report.lost_races);
        Ok(report)
    }

    /// Handles one index entry: re-read, decide, write conditionally, then act. `horizon` is
    /// how long past its CompleteBy the record's messages may still be waiting in a queue.
    pub async fn handle(&self, entry: IndexEntry, horizon: Duration) -> Result<Handled> {
        // What is logged about a record names its order and correlation id, as the handling
        // of a message does.
        let span = info_span!(
            "record",
            order_id = %entry.order_id,
            correlation_id = tracing::field::Empty
        );
        self.judge(entry, horizon).instrument(span).await
    }

    async fn judge(&self, entry: IndexEntry, horizon: Duration) -> Result<Handled> {
        let input = Input::Expire { complete_by: entry.complete_by, horizon };
        self.act(entry.order_id, input).await
    }

    /// Re-reads the order, decides `input` on it, and writes and acts on the decision.
    async fn act(&self, order_id: OrderId, input: Input<'_>) -> Result<Handled> {
        let Some(record) = self.ports.store.load(order_id, Read::Consistent).await? else {
            return Ok(Handled::UnknownOrder);
        };
        tracing::Span::current().record("correlation_id", record.correlation_id.as_str());
        let ctx = match self.ports.ctx(&record) {
            Ok(ctx) => ctx,
            // Its workflow's version was removed: nothing can judge it until it is back.
            Err(e @ Error::WorkflowGone { .. }) => {
                error!(%order_id, error = %e, "a record the supervisor found cannot be judged");
                return Ok(Handled::Illegal(crate::machine::Illegal::Corrupt {
                    reason: e.to_string(),
                }));
            }
            Err(e) => return Err(e),
        };
        match decide(&record, input, &ctx) {
            Decision::Apply(t) => {
                if self.ports.save(&record, &t.next).await? == Saved::Conflict {
                    return Ok(Handled::LostRace);
                }
                debug!(%order_id, state = t.next.process_state.as_str(),
                       failures = t.next.failure_count, "record handled");
                self.ports.perform(&t.next, &t.effects).await?;
                Ok(Handled::Applied)
            }
            // Only a queue message can be seen again, and an expiry is none: the machine never
            // replays one. Were it to, the record has moved on from what the entry saw.
            Decision::Replay(_) => Ok(Handled::Ignored(crate::machine::Ignored::Moved)),
            Decision::Ignore(why) => Ok(Handled::Ignored(why)),
            // The machine's remedy for an illegal expiry is a report: there is no message to
            // set aside, and the record stays in the index for a look.
            Decision::Illegal(why) => {
                error!(%order_id, ?why, "a record the supervisor found cannot be judged");
                Ok(Handled::Illegal(why))
            }
            Decision::Refuse(why) => Ok(Handled::Illegal(crate::machine::Illegal::Corrupt {
                reason: format!("an expiry was refused: {why}"),
            })),
        }
    }
}

impl<S, X, Q, B, C, L, P> Supervisor<S, X, Q, B, C, L, P>
where
    S: StateStore,
    X: ExpiryIndex + HeldIndex,
    Q: Outbox,
    B: EventBus,
    C: Clock,
    L: LoadSource,
    P: Payloads,
{
    /// Tends every service of `book`: announces each hold, each release and each hold that
    /// lasted past `HOLD_ALERT_AFTER_SECONDS` once, and, if `resume`, resumes the orders that
    /// wait for a hold that ended, at most `RESUME_PER_SECOND` a second for the service (or
    /// its declared rate, if lower). A supervisor whose sweep found the queues stalled, or
    /// could not read them, resumes nothing: orders sent into queues nobody takes from would
    /// only add to what waits there.
    /// The store the supervisor works on, which keeps the bulk commands too.
    pub fn store(&self) -> &S {
        &self.ports.store
    }

    /// Drives the bulk commands not finished ([`crate::bulk`]): together, as many orders as
    /// the minute until the next sweep takes at `RESUME_PER_SECOND`, the pace at which held
    /// orders go on, shared evenly among the jobs. Called only while the queues flow, as
    /// resuming is: a redrive of thousands of orders must not add to a backlog. Returns the
    /// jobs as they stand after this sweep's slice; a job that could not be driven is driven
    /// at the next sweep.
    pub async fn drive_bulk<K: BulkBook>(&self, book: &K) -> Result<Vec<BulkJob>>
    where
        S: OrderFinder + Clone,
        Q: Clone,
        B: Clone,
        C: Clone,
        P: Clone,
    {
        let running: Vec<BulkJob> =
            book.jobs(BULK_JOBS_READ).await?.into_iter().filter(|j| !j.finished).collect();
        if running.is_empty() {
            return Ok(Vec::new());
        }
        let config = &self.ports.config;
        let per_second = (usize::try_from(config.hold.resume_per_second).unwrap_or(usize::MAX)
            / running.len())
        .max(1);
        let budget = per_second.saturating_mul(RESUME_SPREAD.as_secs() as usize);
        let operator = Operator::new(self.ports.clone());
        let now = self.ports.clock.now();
        let mut driven = Vec::new();
        for job in running {
            let store = &self.ports.store;
            let slice = bulk::Slice { orders: budget, per_second };
            match bulk::advance(store, book, &operator, &job.id, slice, now, config.index_shards)
                .await
            {
                Ok(Some(job)) => driven.push(job),
                Ok(None) => {}
                Err(e) => {
                    warn!(job = %job.id, error = %e, "a bulk command goes on at the next sweep")
                }
            }
        }
        Ok(driven)
    }

    pub async fn tend<G: ServiceBook>(&self, book: &G, resume: bool) -> Result<ServicesReport> {
        let mut report = ServicesReport::default();
        for record in book.all().await? {
            if record.is_held() {
                report.held += 1;
            }
            // One count per scope and sweep: orders a hold that ended has not resumed yet
            // still wait.
            let waiting = self.waiting(&record).await;
            let counted = waiting.as_ref().map_or(0, |w| w.values().sum());
            crate::metrics::service_state(&record.service, record.is_held(), counted);
            let record = self.overdue(book, record).await;
            if record.unannounced() {
                let announced = match waiting {
                    Ok(waiting) => self.announce(book, &record, &waiting).await,
                    Err(e) => Err(e),
                };
                match announced {
                    Ok(n) => report.announced += n,
                    Err(e) => {
                        warn!(service = %record.service, error = %e, "could not announce the service's holds");
                        report.errors += 1;
                    }
                }
            }
            if resume {
                self.resume(&record, &mut report).await;
            }
        }
        Ok(report)
    }

    /// The orders waiting for each of `record`'s scopes, by hold key.
    async fn waiting(&self, record: &ServiceRecord) -> Result<BTreeMap<String, u64>> {
        let mut waiting = BTreeMap::new();
        for (on, _) in record.scopes() {
            let key = hold_key(&record.service, on);
            let count = self.index.count_held(&key).await?;
            waiting.insert(key, count);
        }
        Ok(waiting)
    }

    /// `record` with its holds past the operators' threshold marked to be announced once
    /// more; as it was if none is, or if another writer got there first (the next sweep
    /// looks again).
    async fn overdue<G: ServiceBook>(&self, book: &G, record: ServiceRecord) -> ServiceRecord {
        let now = self.ports.clock.now();
        let Some(next) = record.overdue(now, self.ports.config.hold.alert_after) else {
            return record;
        };
        match book.save(&next).await {
            Ok(Saved::Saved) => next,
            Ok(Saved::Conflict) => record,
            Err(e) => {
                warn!(service = %record.service, error = %e, "could not mark a hold overdue");
                record
            }
        }
    }

    /// Publishes the alerts of `record`'s changes not yet announced, with the orders
    /// `waiting` for each, once: it first records that it announces them (until
    /// `ALERT_RETRY_SECONDS` from now), then publishes, then records them announced. Returns
    /// how many it published. A supervisor that loses the first write to another (tending at
    /// once, or an agent's write) leaves the alerts to it, or to the next sweep; one that
    /// fails to publish, to the first sweep after its time.
    async fn announce<G: ServiceBook>(
        &self,
        book: &G,
        record: &ServiceRecord,
        waiting: &BTreeMap<String, u64>,
    ) -> Result<usize> {
        let now = self.ports.clock.now();
        let until = now.plus(self.ports.config.alert_retry_after);
        let Some(taken) = record.announcing(now, until) else { return Ok(0) };
        if book.save(&taken).await? == Saved::Conflict {
            return Ok(0);
        }
        let service = taken.service.clone();
        let events: Vec<ServiceEvent> = taken
            .scopes()
            .filter(|(_, scope)| scope.unannounced)
            .filter_map(|(on, _)| {
                let waiting = waiting.get(&hold_key(&service, on)).copied().unwrap_or(0);
                ServiceEvent::of(&taken, on, waiting)
            })
            // One PutEvents takes ten: the others are announced at the next sweep.
            .take(MAX_SERVICE_ALERTS)
            .collect();
        let batch: Vec<BusEvent> = events.iter().map(BusEvent::service).collect();
        let published = self.ports.bus.publish(&batch).await?;
        let sent: Vec<String> = events
            .iter()
            .enumerate()
            .filter(|(i, _)| !published.failed.iter().any(|(f, _)| f == i))
            .map(|(_, e)| e.event_id.clone())
            .collect();
        if !mutants::on(Mutant::AnnouncementUnrecorded) {
            // Recorded on what it wrote, or on what an agent wrote since (a probe taken keeps
            // the announcement under way); a scope that changed since keeps its change.
            let mut current = taken;
            for _ in 0..5 {
                let Some(done) = current.announced(self.ports.clock.now(), &sent) else { break };
                if book.save(&done).await? == Saved::Saved {
                    break;
                }
                match book.load(&service).await? {
                    Some(latest) => current = latest,
                    None => break,
                }
            }
        }
        if let Some((_, reason)) = published.failed.first() {
            return Err(Error::PublishFailed {
                failed: published.failed.len(),
                total: batch.len(),
                first_reason: reason.clone(),
            });
        }
        Ok(sent.len())
    }

    /// Resumes the orders waiting for `record`'s holds that ended: for each scope open (and
    /// not under a hold of the whole service), as many as the minute until the next sweep
    /// takes at `RESUME_PER_SECOND` (or at the service's declared or learned rate if that is
    /// lower), the service's scopes together; for each hold of its agent whose probe is due,
    /// one, which carries the probe. Their start messages are spread over the minute, no more
    /// in any second than the rate: SQS delays messages by whole seconds.
    async fn resume(&self, record: &ServiceRecord, report: &mut ServicesReport) {
        let config = &self.ports.config;
        let now = self.ports.clock.now();
        let service = record.service.as_str();
        let rate = record.rate_at(config.limits_of(service).per_second, now);
        let per_second = config.hold.resume_per_second.min(rate.unwrap_or(u32::MAX)).max(1);
        let per_second = usize::try_from(per_second).unwrap_or(usize::MAX);
        let mut room = per_second.saturating_mul(RESUME_SPREAD.as_secs() as usize);
        let mut resumed = 0usize;
        for (on, scope) in record.scopes() {
            let only = match &scope.held {
                // Nothing of a service held as a whole goes but its own probe.
                _ if on.is_some() && record.whole.held.is_some() => continue,
                None if mutants::on(Mutant::NoResume) => continue,
                None => room,
                // Only a call probes a hold: with every order waiting, one of them goes, as
                // the probe the agent is due.
                Some(hold) if hold.by.is_none() && hold.next_probe <= now => room.min(1),
                Some(_) => continue,
            };
            if only == 0 {
                break;
            }
            let key = hold_key(service, on);
            let waiting = match self.index.held(&key, only).await {
                Ok(waiting) => waiting,
                Err(e) => {
                    warn!(held = %key, error = %e, "could not read the orders waiting for a hold");
                    report.errors += 1;
                    continue;
                }
            };
            for order_id in waiting {
                let delay = Duration::from_secs((resumed / per_second) as u64);
                match self.act(order_id, Input::Resume { on: &key, delay }).await {
                    Ok(Handled::Applied) => {
                        report.resumed += 1;
                        resumed += 1;
                        room = room.saturating_sub(1);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        warn!(%order_id, error = %e, "could not resume an order");
                        report.errors += 1;
                    }
                }
            }
        }
    }
}

/// How long the system has been working on the oldest order in the index without a break (0 if
/// it holds none; see [`crate::state::StateRecord::watched_since`]), from every shard's `reads`,
/// recorded as a metric. `None`, and nothing recorded, if a shard could not be read: a partial
/// figure could hide the very order it is for. An order due later than any step's lease can
/// last (its claim grace, longest retry wait and longest budget) is waiting for a time or an
/// answer, and is not among them; nor is one whose every lease waits so, until its wait ends.
fn oldest(reads: &[Result<Vec<IndexEntry>>], now: Timestamp) -> Option<u64> {
    let mut oldest: Option<Timestamp> = None;
    for read in reads {
        match read {
            Ok(due) => oldest = oldest.into_iter().chain(due.iter().map(|e| e.watched_since)).min(),
            Err(e) => {
                warn!(error = %e, "could not read the oldest order being watched");
                return None;
            }
        }
    }
    let age = oldest.map_or(Duration::ZERO, |at| at.until(now));
    crate::metrics::oldest_in_flight(age);
    Some(u64::try_from(age.as_millis()).unwrap_or(u64::MAX))
}
