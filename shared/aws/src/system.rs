//! The real clock, identifiers and randomness.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sas_engine::Timestamp;
use sas_engine::ports::{Clock, Ids, Random};
use sas_rng::SplitMix;

/// Wall-clock time; sleeps on the tokio timer.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let millis = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
        Timestamp::from_millis(i64::try_from(millis).unwrap_or(i64::MAX))
    }

    async fn sleep(&self, duration: Duration) {
        tokio::time::sleep(duration).await;
    }
}

/// Random (version 4) UUIDs.
#[derive(Clone, Copy, Debug, Default)]
pub struct UuidIds;

impl Ids for UuidIds {
    fn new_id(&self) -> String {
        uuid::Uuid::new_v4().to_string()
    }
}

/// Jitter for retries: a fast generator seeded once per process from the system's randomness.
/// Not for anything secret.
#[derive(Debug)]
pub struct Jitter(SplitMix);

impl Default for Jitter {
    fn default() -> Self {
        let seed = uuid::Uuid::new_v4().as_u64_pair().0;
        Jitter(SplitMix::seeded(seed))
    }
}

impl Random for Jitter {
    fn unit(&self) -> f64 {
        self.0.unit()
    }
}
