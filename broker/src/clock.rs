//! The broker's one clock. `core` never reads time; the shell reads it here and passes it in.

use chrono::{DateTime, TimeZone, Utc};
use switchyard_core::Timestamp;

pub fn now() -> Timestamp {
    Timestamp(Utc::now().timestamp_millis())
}

pub fn to_datetime(t: Timestamp) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(t.millis())
        .single()
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

pub fn from_datetime(t: DateTime<Utc>) -> Timestamp {
    Timestamp(t.timestamp_millis())
}
