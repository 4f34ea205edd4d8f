//! The supervisor function's handler: per scheduled invocation, one sweep of the expiry index,
//! then the services tended (holds announced, the orders of a service open again resumed
//! while the queues flow).

pub mod settings;

use sas_engine::load::LoadSource;
use sas_engine::ports::{
    Clock, EventBus, ExpiryIndex, HeldIndex, Outbox, Payloads, ServiceBook, StateStore,
};
use sas_engine::services::{Supervisor, SweepReport};
use tracing::{info, warn};

/// Runs one sweep, then tends the services of `book`, and returns the sweep's report (both are
/// logged). Fails only when no shard could be queried; records that failed individually stay
/// expired for the next sweep, and services that could not be tended are tended then.
pub async fn handle<S, X, Q, B, C, L, G, P>(
    supervisor: &Supervisor<S, X, Q, B, C, L, P>,
    book: &G,
) -> Result<SweepReport, sas_engine::Error>
where
    S: StateStore,
    X: ExpiryIndex + HeldIndex,
    Q: Outbox,
    B: EventBus,
    C: Clock,
    L: LoadSource,
    G: ServiceBook,
    P: Payloads,
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
