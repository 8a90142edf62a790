//! The two column types whose storage differs between the databases, each one Rust type that
//! both encode and decode:
//!
//! - [`DbTime`]: a [`Timestamp`] (integer milliseconds). SQLite stores the integer; PostgreSQL
//!   a TIMESTAMPTZ (microsecond precision, so whole milliseconds round-trip exactly).
//! - [`DbId`]: a job, attempt or API-token id. SQLite stores the hyphenated lowercase text;
//!   PostgreSQL a native UUID.

use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, PgValueRef, Postgres};
use sqlx::sqlite::{Sqlite, SqliteArgumentsBuffer, SqliteTypeInfo, SqliteValueRef};
use sqlx::{Decode, Encode, Type};
use switchyard_core::Timestamp;
use uuid::Uuid;

/// A timestamp as a column.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DbTime(pub Timestamp);

/// A UUID id as a column.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DbId(pub Uuid);

type Tz = chrono::DateTime<chrono::Utc>;

/// The latest instant chrono holds (PostgreSQL goes further), in whole milliseconds: the end
/// of year 262142. Later times — `Timestamp::MAX`, which a service's expected end is — are
/// stored as this and read back as `Timestamp::MAX`.
const TS_MAX_MS: i64 = 8_210_266_876_799_999;
/// The start of year 1 (PostgreSQL holds back to 4713 BC): earlier times are stored as this
/// and read back as `Timestamp(i64::MIN)`. The broker has no use for either extreme but as
/// "never" and "always".
const TS_MIN_MS: i64 = -62_135_596_800_000;

impl DbTime {
    /// As TIMESTAMPTZ, clamped to what chrono holds.
    pub fn to_tz(self) -> Tz {
        let ms = self.0.millis().clamp(TS_MIN_MS, TS_MAX_MS);
        Tz::from_timestamp_millis(ms).unwrap_or(if ms < 0 { Tz::MIN_UTC } else { Tz::MAX_UTC })
    }

    pub fn from_tz(t: Tz) -> DbTime {
        DbTime(match t.timestamp_millis() {
            ms if ms >= TS_MAX_MS => Timestamp::MAX,
            ms if ms <= TS_MIN_MS => Timestamp(i64::MIN),
            ms => Timestamp(ms),
        })
    }
}

impl Type<Sqlite> for DbTime {
    fn type_info() -> SqliteTypeInfo {
        <i64 as Type<Sqlite>>::type_info()
    }
    fn compatible(ty: &SqliteTypeInfo) -> bool {
        <i64 as Type<Sqlite>>::compatible(ty)
    }
}

impl Encode<'_, Sqlite> for DbTime {
    fn encode_by_ref(&self, buf: &mut SqliteArgumentsBuffer) -> Result<IsNull, BoxDynError> {
        <i64 as Encode<Sqlite>>::encode(self.0.millis(), buf)
    }
}

impl<'r> Decode<'r, Sqlite> for DbTime {
    fn decode(value: SqliteValueRef<'r>) -> Result<Self, BoxDynError> {
        Ok(DbTime(Timestamp(<i64 as Decode<Sqlite>>::decode(value)?)))
    }
}

impl Type<Postgres> for DbTime {
    fn type_info() -> PgTypeInfo {
        <Tz as Type<Postgres>>::type_info()
    }
    fn compatible(ty: &PgTypeInfo) -> bool {
        <Tz as Type<Postgres>>::compatible(ty)
    }
}

impl Encode<'_, Postgres> for DbTime {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        <Tz as Encode<Postgres>>::encode(self.to_tz(), buf)
    }
}

impl<'r> Decode<'r, Postgres> for DbTime {
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        Ok(DbTime::from_tz(<Tz as Decode<Postgres>>::decode(value)?))
    }
}

impl Type<Sqlite> for DbId {
    fn type_info() -> SqliteTypeInfo {
        <String as Type<Sqlite>>::type_info()
    }
    fn compatible(ty: &SqliteTypeInfo) -> bool {
        <String as Type<Sqlite>>::compatible(ty)
    }
}

impl Encode<'_, Sqlite> for DbId {
    fn encode_by_ref(&self, buf: &mut SqliteArgumentsBuffer) -> Result<IsNull, BoxDynError> {
        <String as Encode<Sqlite>>::encode(self.0.to_string(), buf)
    }
}

impl<'r> Decode<'r, Sqlite> for DbId {
    fn decode(value: SqliteValueRef<'r>) -> Result<Self, BoxDynError> {
        let text = <&str as Decode<Sqlite>>::decode(value)?;
        Ok(DbId(
            Uuid::parse_str(text).map_err(|e| format!("bad uuid {text:?}: {e}"))?,
        ))
    }
}

impl Type<Postgres> for DbId {
    fn type_info() -> PgTypeInfo {
        <Uuid as Type<Postgres>>::type_info()
    }
    fn compatible(ty: &PgTypeInfo) -> bool {
        <Uuid as Type<Postgres>>::compatible(ty)
    }
}

impl Encode<'_, Postgres> for DbId {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        <Uuid as Encode<Postgres>>::encode(self.0, buf)
    }
}

impl<'r> Decode<'r, Postgres> for DbId {
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        Ok(DbId(<Uuid as Decode<Postgres>>::decode(value)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_past_what_chrono_holds_read_back_as_the_extremes() {
        let far = DbTime(Timestamp::MAX);
        assert_eq!(DbTime::from_tz(far.to_tz()), far);
        let early = DbTime(Timestamp(i64::MIN));
        assert_eq!(DbTime::from_tz(early.to_tz()), early);
        let now = DbTime(Timestamp(1_764_000_000_123));
        assert_eq!(DbTime::from_tz(now.to_tz()), now);
    }
}
