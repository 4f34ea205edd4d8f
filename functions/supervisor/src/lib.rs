//! The supervisor function's handler: one sweep of the expiry index per scheduled invocation.

pub mod settings;

use sas_engine::load::LoadSource;
use sas_engine::ports::{Clock, EventBus, ExpiryIndex, Outbox, StateStore};
use sas_engine::services::{Supervisor, SweepReport};
use tracing::info;

/// Runs one sweep and returns its report (also logged). Fails only when no shard could be
/// queried; records that failed individually stay expired for the next sweep.
pub async fn handle<S, X, Q, B, C, L>(
    supervisor: &Supervisor<S, X, Q, B, C, L>,
) -> Result<SweepReport, sas_engine::Error>
where
    S: StateStore,
    X: ExpiryIndex,
    Q: Outbox,
    B: EventBus,
    C: Clock,
    L: LoadSource,
{
    let report = supervisor.sweep().await?;
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
