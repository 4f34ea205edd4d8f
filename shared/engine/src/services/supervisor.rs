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
//! It also tends the services ([`Supervisor::tend`]): one alert for each hold and each
//! release, and, for a service open again, the orders that waited for it resumed at the
//! stack's `RESUME_PER_SECOND`, spread over the minute until its next sweep. An alert, too, is
//! written before it is sent: the supervisor records on the service's record that it
//! announces the change, so that two supervisors tending at once publish it once.

use std::time::Duration;

use futures_util::future::join_all;
use futures_util::{StreamExt, stream};
use tracing::{Instrument, debug, error, info_span, warn};

use super::Handled;
use super::effects::Ports;
use crate::OrderId;
use crate::config::MAX_INDEX_SHARDS;
use crate::error::{Error, Result};
use crate::events::{BusEvent, ServiceEvent};
use crate::health::ServiceRecord;
use crate::load::{Horizon, LoadSource};
use crate::machine::{Decision, Input, decide};
use crate::mutants::{self, Mutant};
use crate::payload::NoPayloads;
use crate::ports::{
    Clock, EventBus, ExpiryIndex, HeldIndex, IndexEntry, Outbox, Payloads, Read, Saved,
    ServiceBook, StateStore,
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

    /// One sweep over every shard, about `sweep_limit` records in all. Shards are queried
    /// concurrently, and records handled [`REPAIRS_AT_ONCE`] at a time. Fails if the queues' load cannot be read (without it a late
    /// message cannot be told from a lost one), or if no shard could be queried at all.
    pub async fn sweep(&self) -> Result<SweepReport> {
        let now = self.ports.clock.now();
        // Read before anything can stop the sweep: an order held up by a stalled queue is
        // exactly what this figure must show.
        let oldest_ms = self.oldest(now).await;
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
        // Every shard that may hold an entry is read, and each is given the share of the limit
        // a shard in use needs: shards above those in use hold only what a higher rate wrote.
        let per_shard =
            self.ports.config.sweep_limit.div_ceil(usize::from(self.ports.config.index_shards));
        let queries = join_all(
            (0..MAX_INDEX_SHARDS).map(|shard| self.index.expired(shard, cutoff, per_shard.max(1))),
        )
        .await;

        let horizon_ms = u64::try_from(horizon.as_millis()).unwrap_or(u64::MAX);
        let mut report = SweepReport { horizon_ms, oldest_ms, ..SweepReport::default() };
        let mut first_error = None;
        let mut entries = Vec::new();
        for result in queries {
            match result {
                Ok(found) => entries.extend(found),
                Err(e) => {
                    report.errors += 1;
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error.filter(|_| report.errors == usize::from(MAX_INDEX_SHARDS)) {
            return Err(e);
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

    /// How long the system has been working on the oldest order in the index without a break
    /// (0 if it holds none; see [`crate::state::StateRecord::watched_since`]), recorded as a
    /// metric. `None`, and nothing recorded, if a shard could not be read: a partial figure
    /// could hide the very order it is for. An order due later than any step's lease can last
    /// (its claim grace, longest retry wait and longest budget) is waiting for a time or an
    /// answer, and is left out; so is one whose every lease waits so, until its wait ends.
    async fn oldest(&self, now: Timestamp) -> Option<u64> {
        let config = &self.ports.config;
        let due_by = now.plus(config.claim_grace + config.wait.max + crate::workflow::MAX_BUDGET);
        let results =
            join_all((0..MAX_INDEX_SHARDS).map(|shard| self.index.oldest(shard, due_by))).await;
        let mut oldest: Option<Timestamp> = None;
        for result in results {
            match result {
                Ok(found) => oldest = oldest.into_iter().chain(found).min(),
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
    /// Tends every service of `book`: announces its last hold or release once, and, if
    /// `resume`, resumes the orders that wait for a service open again, at most
    /// `RESUME_PER_SECOND` a second (or its declared rate, if lower). A supervisor whose sweep
    /// found the queues stalled, or could not read them, resumes nothing: orders sent into
    /// queues nobody takes from would only add to what waits there.
    pub async fn tend<G: ServiceBook>(&self, book: &G, resume: bool) -> Result<ServicesReport> {
        let mut report = ServicesReport::default();
        for record in book.all().await? {
            if record.held.is_some() {
                report.held += 1;
            }
            // One count per service and sweep: orders a released service has not resumed yet
            // still wait.
            let waiting = self.index.count_held(&record.service).await;
            let counted = *waiting.as_ref().unwrap_or(&0);
            crate::metrics::service_state(&record.service, record.held.is_some(), counted);
            if record.unannounced {
                let announced = match waiting {
                    Ok(waiting) => self.announce(book, &record, waiting).await,
                    Err(e) => Err(e),
                };
                match announced {
                    Ok(true) => report.announced += 1,
                    Ok(false) => {}
                    Err(e) => {
                        warn!(service = %record.service, error = %e, "could not announce the service's hold");
                        report.errors += 1;
                    }
                }
            }
            match &record.held {
                _ if !resume => {}
                None if mutants::on(Mutant::NoResume) => {}
                None => self.resume(&record, 0, &mut report).await,
                // Only a call probes a held service: with every order waiting, one of them
                // goes, as the probe the agent is due.
                Some(hold) if hold.by.is_none() && hold.next_probe <= self.ports.clock.now() => {
                    self.resume(&record, 1, &mut report).await;
                }
                Some(_) => {}
            }
        }
        Ok(report)
    }

    /// Publishes the alert of the service's last hold or release, with the `waiting` orders,
    /// once: it first records that it announces it (until `ALERT_RETRY_SECONDS` from now),
    /// then publishes, then records it announced. Returns whether it published. A supervisor
    /// that loses the first write to another (tending at once, or an agent's write) leaves the
    /// alert to it, or to the next sweep; one that fails to publish, to the first sweep after
    /// its time.
    async fn announce<G: ServiceBook>(
        &self,
        book: &G,
        record: &ServiceRecord,
        waiting: u64,
    ) -> Result<bool> {
        let now = self.ports.clock.now();
        let until = now.plus(self.ports.config.alert_retry_after);
        let Some(taken) = record.announcing(now, until) else { return Ok(false) };
        if book.save(&taken).await? == Saved::Conflict {
            return Ok(false);
        }
        if let Some(event) = ServiceEvent::of(&taken, waiting) {
            let published = self.ports.bus.publish(&[BusEvent::service(&event)]).await?;
            if let Some((_, reason)) = published.failed.first() {
                return Err(Error::PublishFailed {
                    failed: 1,
                    total: 1,
                    first_reason: reason.clone(),
                });
            }
        }
        if mutants::on(Mutant::AnnouncementUnrecorded) {
            return Ok(true);
        }
        // Recorded on what it wrote, or on what an agent wrote since (a probe taken keeps the
        // announcement under way); a newer change is announced at the next sweep.
        let mut current = taken;
        for _ in 0..5 {
            let Some(done) = current.announced(self.ports.clock.now()) else { break };
            if book.save(&done).await? == Saved::Saved {
                break;
            }
            match book.load(&record.service).await? {
                Some(latest) if latest.announcing == Some(until) => current = latest,
                _ => break,
            }
        }
        Ok(true)
    }

    /// Resumes the orders waiting for `record`'s service: `only` of them (0: as many as the
    /// minute until the next sweep takes at `RESUME_PER_SECOND`, or at the service's declared
    /// or learned rate if that is lower), their start messages spread over it.
    async fn resume(&self, record: &ServiceRecord, only: usize, report: &mut ServicesReport) {
        let config = &self.ports.config;
        let service = record.service.as_str();
        let rate = record.rate_at(config.limits_of(service).per_second, self.ports.clock.now());
        let per_second = u64::from(config.resume_per_second.min(rate.unwrap_or(u32::MAX)).max(1));
        let limit = match only {
            0 => usize::try_from(per_second * RESUME_SPREAD.as_secs()).unwrap_or(usize::MAX),
            n => n,
        };
        let waiting = match self.index.held(service, limit).await {
            Ok(waiting) => waiting,
            Err(e) => {
                warn!(%service, error = %e, "could not read the orders waiting for the service");
                report.errors += 1;
                return;
            }
        };
        for (k, order_id) in waiting.into_iter().enumerate() {
            let delay = Duration::from_millis(k as u64 * 1000 / per_second);
            match self.act(order_id, Input::Resume { service, delay }).await {
                Ok(Handled::Applied) => report.resumed += 1,
                Ok(_) => {}
                Err(e) => {
                    warn!(%order_id, error = %e, "could not resume an order");
                    report.errors += 1;
                }
            }
        }
    }
}
