//! The supervisor function's handler: per scheduled invocation, one sweep of the expiry index,
//! then the services tended (holds announced, the orders of a service open again resumed
//! while the queues flow), then a slice of each bulk command driven (while the queues flow),
//! then the orders of the schedules' times started.

pub mod settings;

use std::time::Duration;

use sas_engine::load::LoadSource;
use sas_engine::ports::{
    BulkBook, Clock, EventBus, ExpiryIndex, HeldIndex, Ids, OrderFinder, Outbox, Payloads,
    ServiceBook, StateStore,
};
use sas_engine::services::{Starter, Supervisor, SweepReport};
use tracing::{info, warn};

/// Runs one sweep, tends the services of `book`, starts the orders of the schedules' times
/// within `look_back`, and returns the sweep's report (all three are logged). Fails only when
/// no shard could be queried; records that failed individually stay expired for the next
/// sweep, services that could not be tended are tended then, and so are times not started.
pub async fn handle<S, X, Q, B, C, L, G, P, I, U>(
    supervisor: &Supervisor<S, X, Q, B, C, L, P>,
    book: &G,
    starter: &Starter<S, Q, B, C, I, U, P>,
    look_back: Duration,
) -> Result<SweepReport, sas_engine::Error>
where
    S: StateStore + OrderFinder + BulkBook + Clone,
    X: ExpiryIndex + HeldIndex,
    Q: Outbox + Clone,
    B: EventBus + Clone,
    C: Clock + Clone,
    L: LoadSource,
    G: ServiceBook,
    P: Payloads + Clone,
    I: Ids,
    U: LoadSource,
{
    let swept = supervisor.sweep().await;
    let flowing = matches!(&swept, Ok(report) if report.stalled.is_none());
    match supervisor.tend(book, flowing).await {
        Ok(r) => info!(
            held = r.held,
            announced = r.announced,
            resumed = r.resumed,
            errors = r.errors,
            "services tended"
        ),
        Err(e) => warn!(error = %e, "could not read the services' health"),
    }
    if flowing {
        match supervisor.drive_bulk(supervisor.store()).await {
            Ok(jobs) => {
                for job in jobs {
                    info!(job = %job.id, applied = job.tally.applied, refused = job.tally.refused,
                          finished = job.finished, "bulk command driven");
                }
            }
            Err(e) => warn!(error = %e, "the bulk commands go on at the next sweep"),
        }
    }
    match starter.look_back(look_back).await {
        // Said only when a time came: most sweeps find none.
        Ok(started) if !started.is_empty() => {
            let made = started.iter().filter(|s| s.outcome.as_ref().is_ok_and(|a| a.created));
            let refused = started.iter().filter(|s| s.outcome.is_err()).count();
            info!(looked_at = started.len(), started = made.count(), refused, "schedules done");
        }
        Ok(_) => {}
        Err(e) => warn!(error = %e, "the schedules' times are started at the next sweep"),
    }
    let report = swept?;
    info!(
        horizon_ms = report.horizon_ms,
        stalled = report.stalled.as_deref(),
        found = report.found,
        acted = report.acted,
        ignored = report.ignored,
        lost_races = report.lost_races,
        errors = report.errors,
        "sweep done"
    );
    Ok(report)
}
