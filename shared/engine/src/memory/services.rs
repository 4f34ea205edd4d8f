//! The services' health records and limited services' paces in memory, with DynamoDB's
//! conditional writes: a save lands only on the version it expects, a turn or a place in
//! flight is taken by one caller only, and every read is consistent.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::error::Result;
use crate::health::ServiceRecord;
use crate::pace::{self, Booked, Place, Usage};
use crate::ports::{Pace, Saved, ServiceBook};
use crate::time::Timestamp;

/// One record per service. Clones do not share: share it behind an `Arc`.
#[derive(Debug, Default)]
pub struct MemoryServiceBook {
    records: Mutex<BTreeMap<String, ServiceRecord>>,
    writes: Mutex<u64>,
    paces: Mutex<BTreeMap<String, Paced>>,
}

/// One limited service's next free turn and places.
#[derive(Debug, Default)]
struct Paced {
    next: Option<Timestamp>,
    places: BTreeMap<u32, Timestamp>,
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

impl MemoryServiceBook {
    fn paced<T>(&self, service: &str, f: impl FnOnce(&mut Paced) -> T) -> T {
        let mut paces = self.paces.lock().unwrap_or_else(|e| e.into_inner());
        let result = f(paces.entry(service.to_owned()).or_default());
        *self.writes.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        result
    }
}

impl Pace for MemoryServiceBook {
    async fn take_turn(
        &self,
        service: &str,
        spacing: Duration,
        now: Timestamp,
        latest: Timestamp,
    ) -> Result<Booked> {
        Ok(self.paced(service, |p| {
            let turn = pace::turn(p.next, now, spacing);
            if turn.start > latest {
                return Booked::TooLate { next: turn.start };
            }
            p.next = Some(turn.next);
            Booked::Start(turn.start)
        }))
    }

    async fn enter(
        &self,
        service: &str,
        limit: u32,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<Option<Place>> {
        Ok(self.paced(service, |p| {
            let slot = pace::free_place(&p.places, limit, now)?;
            p.places.insert(slot, until);
            Some(Place { slot, until })
        }))
    }

    async fn leave(&self, service: &str, place: Place) -> Result<()> {
        self.paced(service, |p| {
            if p.places.get(&place.slot) == Some(&place.until) {
                p.places.remove(&place.slot);
            }
        });
        Ok(())
    }

    async fn usage(&self, service: &str, now: Timestamp) -> Result<Usage> {
        let paces = self.paces.lock().unwrap_or_else(|e| e.into_inner());
        Ok(paces.get(service).map_or_else(Usage::default, |p| Usage::at(now, p.next, &p.places)))
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
