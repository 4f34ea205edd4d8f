//! The wait gauge in memory: one report per consumer and queue, the latest replacing the one
//! before, as the DynamoDB adapter keeps them (one item per consumer and queue).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::error::Result;
use crate::ports::{Destination, WaitGauge, WaitReport};
use crate::time::Timestamp;

/// Wait reports by (queue, reporter).
#[derive(Debug, Default)]
pub struct MemoryWaits {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    reports: HashMap<(Destination, String), WaitReport>,
    writes: u64,
}

impl MemoryWaits {
    /// Reports written so far, replaced ones included.
    pub fn writes(&self) -> u64 {
        self.lock().writes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl WaitGauge for MemoryWaits {
    async fn report(&self, report: &WaitReport) -> Result<()> {
        let mut state = self.lock();
        state.writes += 1;
        state.reports.insert((report.queue.clone(), report.reporter.clone()), report.clone());
        Ok(())
    }

    async fn reports(&self, now: Timestamp) -> Result<Vec<WaitReport>> {
        let mut reports: Vec<WaitReport> =
            self.lock().reports.values().filter(|r| r.expires > now).cloned().collect();
        // In a stable order, so that a seeded run reads them the same way every time.
        reports.sort_by(|a, b| (&a.queue, &a.reporter).cmp(&(&b.queue, &b.reporter)));
        Ok(reports)
    }
}
