//! One SQL layer for both databases: every [`Store`](super::Store) method is written once, in
//! the files of this folder, and runs on SQLite and PostgreSQL alike.
//!
//! What makes that possible:
//! - Statements use `$N` placeholders, `TRUE`/`FALSE`, `RETURNING`, `UPDATE … FROM`,
//!   `NULLS FIRST`, `CAST(… AS BIGINT)` and `COLLATE "C"`, which both databases accept (SQLite
//!   is given a `C` collation that compares bytes, as PostgreSQL's does). The few fragments that
//!   differ are in the [`Dialect`] table.
//! - Values are bound as a [`Val`] and read back from a [`Row`]; both choose the database's own
//!   encoding at the last moment. Timestamps are [`DbTime`] (integer milliseconds on SQLite,
//!   TIMESTAMPTZ on PostgreSQL) and job, attempt and token ids [`DbId`] (TEXT on SQLite, UUID
//!   on PostgreSQL): see `types.rs`.
//! - A statement runs on a [`Db`] (the pool) or in a [`Tx`] (a transaction), whichever
//!   database it is.
//!
//! What differs per database stays in `sqlite.rs` and `postgres.rs`: opening and migrating,
//! how a writing transaction takes the global write order, batched submissions and heartbeats.

mod access;
mod catalog;
mod events;
mod gateway;
mod instances;
mod jobs;
mod ledger;
mod nodes;
mod plans;
mod policies;
mod rows;
mod runtime;
mod services;
mod spend;
mod types;
mod waste;

pub use gateway::{RouteRow, RoutedService, ServiceTokenRecord, StoredReport};
pub(crate) use rows::*;
pub use runtime::{RuntimeRow, runtime_key};
pub use types::{DbId, DbTime};
pub use waste::{WasteRank, WasteRow, WasteWrite, merge_history};

// What the method files (`use super::*`) share.
use super::postgres;
use super::sqlite;
use super::*;
use crate::rules::gang;
use crate::rules::lease::{self, AttemptState, Requeue, Verdict};
use events::{NodeWorkKept, end_node_work, gang_from_row, requeue_provisioning};
use policies::insert_audit;
use switchyard_core::{Pool, Region};
use switchyard_protocol::agent::{AgentEvent, EventResult, Inventory};

use sqlx::postgres::{PgRow, Postgres};
use sqlx::sqlite::{Sqlite, SqliteRow};
use sqlx::{Decode, PgPool, Row as _, SqlitePool, Type};
use std::borrow::Cow;

pub(crate) use sqlx::AssertSqlSafe;

/// The database a store runs on: the pool of connections.
#[derive(Clone, Debug)]
pub(crate) enum Db {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// The fragments of SQL that differ between the two databases.
#[derive(Debug)]
pub(crate) struct Dialect {
    /// Appended to a `SELECT` whose rows the transaction goes on to update: row locks on
    /// PostgreSQL; nothing on SQLite, whose writing transactions already exclude each other.
    pub for_update: &'static str,
    /// The scalar maximum of two values (`MAX(a, b)` on SQLite, `GREATEST(a, b)` on
    /// PostgreSQL, where `MAX` is only an aggregate).
    pub greatest: &'static str,
    /// The start of the bucket of `period_start` for buckets of the given milliseconds.
    pub time_bucket: fn(i64) -> String,
}

const SQLITE: Dialect = Dialect {
    for_update: "",
    greatest: "MAX",
    time_bucket: |ms| format!("(period_start / {ms}) * {ms}"),
};
const POSTGRES: Dialect = Dialect {
    for_update: " FOR UPDATE",
    greatest: "GREATEST",
    time_bucket: |ms| {
        format!(
            "date_bin(INTERVAL '{ms} milliseconds', period_start, \
             TIMESTAMPTZ '1970-01-01 00:00:00+00')"
        )
    },
};

impl Db {
    pub(crate) fn dialect(&self) -> &'static Dialect {
        match self {
            Db::Sqlite(_) => &SQLITE,
            Db::Postgres(_) => &POSTGRES,
        }
    }

    /// A transaction without the global write lock: for reads, and for writes that are one
    /// atomic statement each (see `postgres.rs`).
    pub(crate) async fn begin(&self) -> StoreResult<Tx> {
        Ok(match self {
            Db::Sqlite(p) => Tx::Sqlite(p.begin().await?),
            Db::Postgres(p) => Tx::Postgres(p.begin().await?),
        })
    }
}

/// An open transaction on either database; rolled back when dropped uncommitted.
pub(crate) enum Tx {
    Sqlite(sqlx::Transaction<'static, Sqlite>),
    Postgres(sqlx::Transaction<'static, Postgres>),
}

impl Tx {
    pub(crate) async fn commit(self) -> StoreResult<()> {
        match self {
            Tx::Sqlite(t) => t.commit().await?,
            Tx::Postgres(t) => t.commit().await?,
        }
        Ok(())
    }
}

/// Where a statement runs: the pool (a connection of its own) or an open transaction.
pub(crate) enum Ex<'c> {
    SqlitePool(&'c SqlitePool),
    PgPool(&'c PgPool),
    SqliteConn(&'c mut sqlx::SqliteConnection),
    PgConn(&'c mut sqlx::PgConnection),
}

impl<'c> From<&'c Db> for Ex<'c> {
    fn from(db: &'c Db) -> Ex<'c> {
        match db {
            Db::Sqlite(p) => Ex::SqlitePool(p),
            Db::Postgres(p) => Ex::PgPool(p),
        }
    }
}

impl<'c> From<&'c mut Tx> for Ex<'c> {
    fn from(tx: &'c mut Tx) -> Ex<'c> {
        match tx {
            Tx::Sqlite(t) => Ex::SqliteConn(t),
            Tx::Postgres(t) => Ex::PgConn(t),
        }
    }
}

/// A value bound to a statement, encoded the database's way when the statement runs.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Val {
    I64(Option<i64>),
    F64(Option<f64>),
    Bool(Option<bool>),
    Text(Option<String>),
    Time(Option<DbTime>),
    Id(Option<DbId>),
}

macro_rules! val_from {
    ($variant:ident: $($t:ty => |$v:ident| $e:expr),* $(,)?) => {
        $(impl From<$t> for Val {
            fn from($v: $t) -> Val {
                Val::$variant($e)
            }
        })*
    };
}

val_from!(I64: i64 => |v| Some(v), Option<i64> => |v| v);
val_from!(F64: f64 => |v| Some(v), Option<f64> => |v| v);
val_from!(Bool: bool => |v| Some(v), Option<bool> => |v| v);
val_from!(Text:
    &str => |v| Some(v.to_string()),
    String => |v| Some(v),
    &String => |v| Some(v.clone()),
    Option<&str> => |v| v.map(str::to_string),
    Option<String> => |v| v,
    &Option<String> => |v| v.clone(),
);
val_from!(Time:
    Timestamp => |v| Some(DbTime(v)),
    Option<Timestamp> => |v| v.map(DbTime),
);
val_from!(Id:
    Uuid => |v| Some(DbId(v)),
    Option<Uuid> => |v| v.map(DbId),
    JobId => |v| Some(DbId(v.0)),
    Option<JobId> => |v| v.map(|j| DbId(j.0)),
    AttemptId => |v| Some(DbId(v.0)),
);

/// SQL text: a literal, or a statement assembled at run time from fixed fragments
/// (`AssertSqlSafe(String)`: every value still bound, never formatted in).
pub(crate) trait SqlText {
    fn text(self) -> Cow<'static, str>;
}

impl SqlText for &'static str {
    fn text(self) -> Cow<'static, str> {
        Cow::Borrowed(self)
    }
}

impl SqlText for AssertSqlSafe<String> {
    fn text(self) -> Cow<'static, str> {
        Cow::Owned(self.0)
    }
}

/// A statement and its bound values.
#[derive(Clone, Debug)]
pub(crate) struct Query {
    sql: Cow<'static, str>,
    args: Vec<Val>,
}

/// A statement whose rows are read as their first column.
pub(crate) struct Scalar<T> {
    query: Query,
    _out: std::marker::PhantomData<fn() -> T>,
}

/// What a statement that returns no rows did.
pub(crate) struct Done(u64);

impl Done {
    pub(crate) fn rows_affected(&self) -> u64 {
        self.0
    }
}

pub(crate) fn query(sql: impl SqlText) -> Query {
    Query {
        sql: sql.text(),
        args: Vec::new(),
    }
}

pub(crate) fn query_scalar<T: Col>(sql: impl SqlText) -> Scalar<T> {
    Scalar {
        query: query(sql),
        _out: std::marker::PhantomData,
    }
}

macro_rules! bind_all {
    ($q:expr, $args:expr) => {{
        let mut q = $q;
        for v in $args {
            q = match v {
                Val::I64(x) => q.bind(*x),
                Val::F64(x) => q.bind(*x),
                Val::Bool(x) => q.bind(*x),
                Val::Text(x) => q.bind(x.as_deref()),
                Val::Time(x) => q.bind(*x),
                Val::Id(x) => q.bind(*x),
            };
        }
        q
    }};
}

macro_rules! run {
    ($self:ident, $ex:expr, $method:ident, |$r:ident| $wrap:expr) => {{
        let sql = AssertSqlSafe(&*$self.sql);
        match $ex.into() {
            Ex::SqlitePool(p) => {
                let $r = bind_all!(sqlx::query::<Sqlite>(sql), &$self.args)
                    .$method(p)
                    .await?;
                $wrap
            }
            Ex::SqliteConn(c) => {
                let $r = bind_all!(sqlx::query::<Sqlite>(sql), &$self.args)
                    .$method(c)
                    .await?;
                $wrap
            }
            Ex::PgPool(p) => {
                let $r = bind_all!(sqlx::query::<Postgres>(sql), &$self.args)
                    .$method(p)
                    .await?;
                $wrap
            }
            Ex::PgConn(c) => {
                let $r = bind_all!(sqlx::query::<Postgres>(sql), &$self.args)
                    .$method(c)
                    .await?;
                $wrap
            }
        }
    }};
}

impl Query {
    pub(crate) fn bind(mut self, value: impl Into<Val>) -> Query {
        self.args.push(value.into());
        self
    }

    pub(crate) async fn execute<'c>(self, ex: impl Into<Ex<'c>>) -> StoreResult<Done> {
        Ok(Done(run!(self, ex, execute, |r| r.rows_affected())))
    }

    pub(crate) async fn fetch_all<'c>(self, ex: impl Into<Ex<'c>>) -> StoreResult<Vec<Row>> {
        Ok(run!(self, ex, fetch_all, |r| r
            .into_iter()
            .map(Row::from)
            .collect()))
    }

    pub(crate) async fn fetch_optional<'c>(
        self,
        ex: impl Into<Ex<'c>>,
    ) -> StoreResult<Option<Row>> {
        Ok(run!(self, ex, fetch_optional, |r| r.map(Row::from)))
    }

    pub(crate) async fn fetch_one<'c>(self, ex: impl Into<Ex<'c>>) -> StoreResult<Row> {
        Ok(run!(self, ex, fetch_one, |r| Row::from(r)))
    }
}

impl<T: Col> Scalar<T> {
    pub(crate) fn bind(mut self, value: impl Into<Val>) -> Scalar<T> {
        self.query = self.query.bind(value);
        self
    }

    pub(crate) async fn fetch_all<'c>(self, ex: impl Into<Ex<'c>>) -> StoreResult<Vec<T>> {
        let rows = self.query.fetch_all(ex).await?;
        rows.iter().map(|r| r.get_at(0)).collect()
    }

    pub(crate) async fn fetch_optional<'c>(self, ex: impl Into<Ex<'c>>) -> StoreResult<Option<T>> {
        let row = self.query.fetch_optional(ex).await?;
        row.map(|r| r.get_at(0)).transpose()
    }

    pub(crate) async fn fetch_one<'c>(self, ex: impl Into<Ex<'c>>) -> StoreResult<T> {
        self.query.fetch_one(ex).await?.get_at(0)
    }
}

/// A type read from a column the same way on both databases: only these, so that a UUID or a
/// time is read as [`DbId`] or [`DbTime`], never with one database's own encoding (sqlx reads
/// `uuid::Uuid` from SQLite as 16 bytes, which is not how ids are stored there).
pub(crate) trait Col:
    for<'r> Decode<'r, Sqlite> + Type<Sqlite> + for<'r> Decode<'r, Postgres> + Type<Postgres>
{
}

macro_rules! columns {
    ($($t:ty),*) => {
        $(impl Col for $t {}
        impl Col for Option<$t> {})*
    };
}

columns!(i64, f64, bool, String, DbTime, DbId);

/// A row from either database.
pub(crate) enum Row {
    Sqlite(SqliteRow),
    Postgres(PgRow),
}

impl From<SqliteRow> for Row {
    fn from(r: SqliteRow) -> Row {
        Row::Sqlite(r)
    }
}

impl From<PgRow> for Row {
    fn from(r: PgRow) -> Row {
        Row::Postgres(r)
    }
}

impl Row {
    /// The column `col`.
    pub(crate) fn get<T: Col>(&self, col: &str) -> StoreResult<T> {
        Ok(match self {
            Row::Sqlite(r) => r.try_get(col)?,
            Row::Postgres(r) => r.try_get(col)?,
        })
    }

    /// The column at `index` (from 0).
    pub(crate) fn get_at<T: Col>(&self, index: usize) -> StoreResult<T> {
        Ok(match self {
            Row::Sqlite(r) => r.try_get(index)?,
            Row::Postgres(r) => r.try_get(index)?,
        })
    }

    pub(crate) fn time(&self, col: &str) -> StoreResult<Timestamp> {
        Ok(self.get::<DbTime>(col)?.0)
    }

    pub(crate) fn time_opt(&self, col: &str) -> StoreResult<Option<Timestamp>> {
        Ok(self.get::<Option<DbTime>>(col)?.map(|t| t.0))
    }

    pub(crate) fn uuid(&self, col: &str) -> StoreResult<Uuid> {
        Ok(self.get::<DbId>(col)?.0)
    }

    pub(crate) fn uuid_opt(&self, col: &str) -> StoreResult<Option<Uuid>> {
        Ok(self.get::<Option<DbId>>(col)?.map(|t| t.0))
    }

    /// An integer column that must fit a `u32`.
    pub(crate) fn u32(&self, col: &str) -> StoreResult<u32> {
        u32_of(self.get(col)?, col)
    }
}

pub(crate) fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(what.to_string())
}

pub(crate) fn u32_of(v: i64, what: &str) -> StoreResult<u32> {
    u32::try_from(v).map_err(|_| corrupt(format!("{what} out of range: {v}")))
}
