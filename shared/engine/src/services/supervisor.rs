//! The supervisor: sweeps the expiry index for leases that ran out and acts on each with one
//! conditional write: retry later, compensate, or give up with an alert.
//!
//! Index entries are only hints (the index is eventually consistent): each record is re-read
//! and the decision is made on what the table says, then written on the condition that the
//! record is still exactly that. Two supervisors sweeping at once therefore never both act on a
//! record: the second write fails its condition.

use std::sync::Arc;

use futures_util::future::join_all;
use tracing::{debug, warn};

use super::Handled;
use super::effects::Effector;
use crate::config::EngineConfig;
use crate::error::Result;
use crate::machine::{Ctx, Decision, Input, decide};
use crate::ports::{
    Clock, EventBus, Expected, ExpiryIndex, IndexEntry, Outbox, Read, Saved, StateStore,
};
use crate::workflow::Workflow;

/// What one sweep did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SweepReport {
    /// Index entries returned by the queries.
    pub found: usize,
    /// Records changed by this supervisor.
    pub acted: usize,
    /// Entries with nothing to do (not expired after all, moved on, finished).
    pub ignored: usize,
    /// Records another writer changed first.
    pub lost_races: usize,
    /// Records that could not be handled; they stay in the index for the next sweep.
    pub errors: usize,
}

/// The supervisor, over its ports.
#[derive(Debug)]
pub struct Supervisor<S, X, Q, B, C> {
    ports: Effector<S, Q, B, C>,
    index: X,
}

impl<S: StateStore, X: ExpiryIndex, Q: Outbox, B: EventBus, C: Clock> Supervisor<S, X, Q, B, C> {
    pub fn new(
        store: S,
        index: X,
        outbox: Q,
        bus: B,
        clock: C,
        config: Arc<EngineConfig>,
        workflow: Arc<Workflow>,
    ) -> Self {
        Supervisor { ports: Effector { store, outbox, bus, clock, config, workflow }, index }
    }

    /// One sweep over every shard, at most `sweep_limit` records in all. Shards are queried and
    /// handled concurrently. Fails only if no shard could be queried at all.
    pub async fn sweep(&self) -> Result<SweepReport> {
        let now = self.ports.clock.now();
        let shards = self.ports.config.index_shards;
        // An even share per shard keeps one busy shard from starving the others.
        let per_shard = self.ports.config.sweep_limit.div_ceil(usize::from(shards)).max(1);
        let results =
            join_all((0..shards).map(|shard| self.sweep_shard(shard, now, per_shard))).await;

        let mut report = SweepReport::default();
        let mut first_error = None;
        let mut failed_shards = 0;
        for result in results {
            match result {
                Ok(r) => {
                    report.found += r.found;
                    report.acted += r.acted;
                    report.ignored += r.ignored;
                    report.lost_races += r.lost_races;
                    report.errors += r.errors;
                }
                Err(e) => {
                    failed_shards += 1;
                    report.errors += 1;
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) if failed_shards == usize::from(shards) => Err(e),
            _ => Ok(report),
        }
    }

    async fn sweep_shard(
        &self,
        shard: u16,
        now: crate::time::Timestamp,
        limit: usize,
    ) -> Result<SweepReport> {
        let entries = self.index.expired(shard, now, limit).await?;
        let mut report = SweepReport { found: entries.len(), ..SweepReport::default() };
        for entry in entries {
            match self.handle(entry).await {
                Ok(Handled::Applied | Handled::Replayed) => report.acted += 1,
                Ok(Handled::LostRace) => report.lost_races += 1,
                Ok(_) => report.ignored += 1,
                Err(e) => {
                    warn!(order_id = %entry.order_id, error = %e, "could not handle an expired record");
                    report.errors += 1;
                }
            }
        }
        Ok(report)
    }

    /// Handles one index entry: re-read, decide, write conditionally, then act.
    pub async fn handle(&self, entry: IndexEntry) -> Result<Handled> {
        let Some(record) = self.ports.store.load(entry.order_id, Read::Consistent).await? else {
            return Ok(Handled::UnknownOrder);
        };
        let ctx = Ctx {
            now: self.ports.clock.now(),
            config: &self.ports.config,
            workflow: &self.ports.workflow,
        };
        match decide(&record, Input::Expire { complete_by: entry.complete_by }, &ctx) {
            Decision::Apply(t) => {
                if self.ports.store.save(&t.next, Expected::of(&record)).await? == Saved::Conflict {
                    return Ok(Handled::LostRace);
                }
                debug!(order_id = %entry.order_id, state = t.next.process_state.as_str(),
                       failures = t.next.failure_count, "expired lease handled");
                self.ports.perform(&t.next, &t.effects).await?;
                Ok(Handled::Applied)
            }
            Decision::Replay(_) => Ok(Handled::Ignored(crate::machine::Ignored::Moved)),
            Decision::Ignore(why) => Ok(Handled::Ignored(why)),
            Decision::Illegal(why) => Ok(Handled::Illegal(why)),
        }
    }
}
