//! Instants and durations as the engine sees them.
//!
//! The engine never reads a clock: every service takes the time from the [`Clock`] port, so
//! timeouts are tested by moving a manual clock. Instants are whole milliseconds since the Unix
//! epoch, which is also how they are stored (a number sorts correctly in an index).
//!
//! [`Clock`]: crate::ports::Clock

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A point in time, in milliseconds since 1970-01-01T00:00:00Z.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(i64);

impl Timestamp {
    /// The epoch itself; useful as a base for test clocks.
    pub const EPOCH: Timestamp = Timestamp(0);

    pub const fn from_millis(millis: i64) -> Self {
        Timestamp(millis)
    }

    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// This instant moved forward by `d`, saturating instead of overflowing.
    pub fn plus(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_add(millis_of(d)))
    }

    /// This instant moved back by `d`, saturating instead of overflowing.
    pub fn minus(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_sub(millis_of(d)))
    }

    /// Time from `self` until `later`; zero when `later` is not after `self`.
    pub fn until(self, later: Timestamp) -> Duration {
        Duration::from_millis(u64::try_from(later.0.saturating_sub(self.0)).unwrap_or(0))
    }

    /// RFC 3339 with millisecond precision, for APIs and logs.
    pub fn to_rfc3339(self) -> String {
        match chrono::DateTime::from_timestamp_millis(self.0) {
            Some(t) => t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            None => format!("{}ms", self.0),
        }
    }
}

fn millis_of(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_and_never_goes_negative() {
        let t = Timestamp::from_millis(1_000);
        assert_eq!(t.plus(Duration::from_secs(1)).as_millis(), 2_000);
        assert_eq!(t.minus(Duration::from_secs(2)).as_millis(), -1_000);
        assert_eq!(t.until(Timestamp::from_millis(500)), Duration::ZERO);
        assert_eq!(t.until(Timestamp::from_millis(1_250)), Duration::from_millis(250));
        assert_eq!(Timestamp::from_millis(i64::MAX).plus(Duration::MAX).as_millis(), i64::MAX);
    }

    #[test]
    fn formats_as_rfc3339_millis() {
        assert_eq!(Timestamp::from_millis(1_500).to_rfc3339(), "1970-01-01T00:00:01.500Z");
    }
}
