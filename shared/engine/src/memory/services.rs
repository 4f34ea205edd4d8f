//! The services' health records in memory, with DynamoDB's conditional writes: a save lands
//! only on the version it expects, and every read is consistent.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::error::Result;
use crate::health::ServiceRecord;
use crate::ports::{Saved, ServiceBook};

/// One record per service. Clones do not share: share it behind an `Arc`.
#[derive(Debug, Default)]
pub struct MemoryServiceBook {
    records: Mutex<BTreeMap<String, ServiceRecord>>,
    writes: Mutex<u64>,
}

impl MemoryServiceBook {
    /// Every record as it stands, for tests: a plain read, outside any async port.
    pub fn records(&self) -> Vec<ServiceRecord> {
        self.records.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }

    /// Writes that landed, for tests and cost estimates.
    pub fn writes(&self) -> u64 {
        *self.writes.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ServiceBook for MemoryServiceBook {
    async fn load(&self, service: &str) -> Result<Option<ServiceRecord>> {
        Ok(self.records.lock().unwrap_or_else(|e| e.into_inner()).get(service).cloned())
    }

    async fn all(&self) -> Result<Vec<ServiceRecord>> {
        Ok(self.records.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect())
    }

    async fn save(&self, next: &ServiceRecord) -> Result<Saved> {
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        let stored = records.get(&next.service).map_or(0, |r| r.version);
        if next.version != stored + 1 {
            return Ok(Saved::Conflict);
        }
        records.insert(next.service.clone(), next.clone());
        *self.writes.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        Ok(Saved::Saved)
    }
}
