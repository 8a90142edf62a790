//! Time as a value. `core` never reads a clock: callers pass `now`.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Milliseconds since the Unix epoch (UTC).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Timestamp(pub i64);

impl Timestamp {
    pub const MAX: Timestamp = Timestamp(i64::MAX);

    pub const fn from_millis(ms: i64) -> Timestamp {
        Timestamp(ms)
    }

    pub const fn from_secs(s: i64) -> Timestamp {
        Timestamp(s.saturating_mul(1000))
    }

    pub const fn millis(self) -> i64 {
        self.0
    }

    pub fn plus_secs(self, s: i64) -> Timestamp {
        Timestamp(self.0.saturating_add(s.saturating_mul(1000)))
    }

    pub fn plus_millis(self, ms: i64) -> Timestamp {
        Timestamp(self.0.saturating_add(ms))
    }

    /// Whole seconds from `earlier` to `self`, zero if `earlier` is later.
    pub fn secs_since(self, earlier: Timestamp) -> i64 {
        (self.0.saturating_sub(earlier.0)).max(0) / 1000
    }

    /// The seconds billed from `earlier` to here: a started second counts in full (what the
    /// ledger charges; 300 ms is one second).
    pub fn billed_secs_since(self, earlier: Timestamp) -> i64 {
        (self.0.saturating_sub(earlier.0))
            .max(0)
            .saturating_add(999)
            / 1000
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}
