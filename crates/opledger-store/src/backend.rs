//! Saying "either backend" one way: one enum for a value of either backend ([`Either`]: a store,
//! a pool, a connection, a transaction), one macro that runs the same code on whichever it holds
//! ([`either!`](crate::either)), a row trait that decodes what both backends decode alike
//! ([`EitherRow`]), and the two column types whose SQL type differs between them ([`Time`],
//! [`TextList`]).
//!
//! A statement that differs only in its types is written once, with `$n` placeholders (SQLite
//! reads them too), and its body is expanded for each backend's concrete types by `either!`, so
//! each still runs on its own driver (ADR 0001: no `sqlx::Any`). The backends keep statements of
//! their own only where they really differ: how the write lock is taken, how positions are
//! allocated, bulk writes and upserts (`jsonb_each` against `UNNEST` and `COPY`), DDL and catalog
//! lookups. Each such place says so.

use chrono::{DateTime, Utc};
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgBindIterExt, PgRow, PgTypeInfo, PgValueRef};
use sqlx::sqlite::{SqliteArgumentsBuffer, SqliteRow, SqliteTypeInfo, SqliteValueRef};
use sqlx::{
    Connection, Decode, Encode, PgConnection, PgPool, Postgres, Sqlite, SqliteConnection,
    SqlitePool, Type,
};

use crate::model::micros_to_datetime;

/// Which database a ledger (and the read models beside it) lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    /// `column IN` the strings bound at `param` as a [`TextList`]: SQLite has no arrays and
    /// expands a JSON array, PostgreSQL compares with `ANY` of an array. Both use the column's
    /// index.
    pub fn in_list(self, column: &str, param: &str) -> String {
        match self {
            Backend::Sqlite => format!("{column} IN (SELECT value FROM json_each({param}))"),
            Backend::Postgres => format!("{column} = ANY({param})"),
        }
    }
}

/// A value of either backend: what [`either!`](crate::either) dispatches on. The aliases name
/// the roles it plays ([`crate::AnyStore`], [`ReadPool`], [`Conn`], [`Txn`], [`OwnedConn`],
/// [`crate::LedgerReader`]).
#[derive(Clone, Copy, Debug)]
pub enum Either<S, P> {
    Sqlite(S),
    Postgres(P),
}

/// Runs the same code on whichever backend an [`Either`] holds: the body is expanded once per
/// backend, so it is type-checked and compiled against each driver's concrete types.
///
/// `either!(value, x => body)` evaluates to `body`; `either!(map value, x => body)` wraps `body`
/// in the same backend's variant (a pool's transaction is a transaction of that backend).
#[macro_export]
macro_rules! either {
    (map $value:expr, $x:pat => $body:expr) => {
        match $value {
            $crate::Either::Sqlite($x) => $crate::Either::Sqlite($body),
            $crate::Either::Postgres($x) => $crate::Either::Postgres($body),
        }
    };
    ($value:expr, $x:pat => $body:expr) => {
        match $value {
            $crate::Either::Sqlite($x) => $body,
            $crate::Either::Postgres($x) => $body,
        }
    };
}

impl<S, P> Either<S, P> {
    /// Which backend this is.
    pub fn backend(&self) -> Backend {
        match self {
            Either::Sqlite(_) => Backend::Sqlite,
            Either::Postgres(_) => Backend::Postgres,
        }
    }

    /// A reference to what is inside, of the same backend.
    pub fn as_ref(&self) -> Either<&S, &P> {
        either!(map self, inner => inner)
    }
}

/// A connection pool of either backend: the store's read pool, or its writable one for read
/// models ([`crate::AnyStore::projection_pool`]).
pub type ReadPool<'a> = Either<&'a SqlitePool, &'a PgPool>;

/// A connection of either backend, often inside a transaction its caller owns.
pub type Conn<'c> = Either<&'c mut SqliteConnection, &'c mut PgConnection>;

/// An open transaction of either backend; rolled back when dropped without [`Txn::commit`].
pub type Txn<'c> = Either<sqlx::Transaction<'c, Sqlite>, sqlx::Transaction<'c, Postgres>>;

/// A connection of either backend owned by its user (taken out of a pool for good).
pub type OwnedConn = Either<SqliteConnection, PgConnection>;

impl<'c> From<&'c mut SqliteConnection> for Conn<'c> {
    fn from(connection: &'c mut SqliteConnection) -> Self {
        Either::Sqlite(connection)
    }
}

impl<'c> From<&'c mut PgConnection> for Conn<'c> {
    fn from(connection: &'c mut PgConnection) -> Self {
        Either::Postgres(connection)
    }
}

impl Conn<'_> {
    /// The same connection, borrowed again for a shorter time.
    pub fn reborrow(&mut self) -> Conn<'_> {
        either!(map self, c => &mut **c)
    }
}

impl Txn<'_> {
    /// The connection inside the transaction.
    pub fn conn(&mut self) -> Conn<'_> {
        either!(map self, tx => &mut **tx)
    }

    pub async fn commit(self) -> Result<(), sqlx::Error> {
        either!(self, tx => tx.commit().await)
    }
}

impl OwnedConn {
    /// Takes a connection out of `pool` for good (it is closed, not returned, when done).
    pub async fn detach(pool: ReadPool<'_>) -> Result<Self, sqlx::Error> {
        Ok(either!(map pool, p => sqlx::pool::PoolConnection::detach(p.acquire().await?)))
    }

    pub fn conn(&mut self) -> Conn<'_> {
        either!(map self, c => c)
    }

    pub async fn close(self) -> Result<(), sqlx::Error> {
        either!(self, c => c.close().await)
    }
}

/// A row of either backend, for decoders written once: `try_get` of a type that both backends
/// decode (integers, text, bytes, booleans, UUIDs, [`Time`], and `Option`s of them).
pub trait EitherRow {
    /// The value of column `index`.
    fn try_get<T>(&self, index: usize) -> Result<T, sqlx::Error>
    where
        T: for<'r> Decode<'r, Sqlite>
            + Type<Sqlite>
            + for<'r> Decode<'r, Postgres>
            + Type<Postgres>;
}

/// Each backend's row decodes through its own driver.
macro_rules! either_row {
    ($($row:ty),*) => {$(
        impl EitherRow for $row {
            fn try_get<T>(&self, index: usize) -> Result<T, sqlx::Error>
            where
                T: for<'r> Decode<'r, Sqlite>
                    + Type<Sqlite>
                    + for<'r> Decode<'r, Postgres>
                    + Type<Postgres>,
            {
                sqlx::Row::try_get(self, index)
            }
        }
    )*};
}
either_row!(SqliteRow, PgRow);

/// A point in time as each backend keeps it: microseconds since the Unix epoch in an `INTEGER`
/// on SQLite (the ledger's unit), `timestamptz` on PostgreSQL. Bind it and decode it on both.
///
/// On SQLite, microseconds beyond what a time can hold decode as the earliest time, as the
/// ledger's own reads always have (a verifier then reports the event, rather than failing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(pub DateTime<Utc>);

impl Type<Sqlite> for Time {
    fn type_info() -> SqliteTypeInfo {
        <i64 as Type<Sqlite>>::type_info()
    }

    fn compatible(ty: &SqliteTypeInfo) -> bool {
        <i64 as Type<Sqlite>>::compatible(ty)
    }
}

impl Encode<'_, Sqlite> for Time {
    fn encode_by_ref(&self, buf: &mut SqliteArgumentsBuffer) -> Result<IsNull, BoxDynError> {
        <i64 as Encode<Sqlite>>::encode(self.0.timestamp_micros(), buf)
    }
}

impl Decode<'_, Sqlite> for Time {
    fn decode(value: SqliteValueRef<'_>) -> Result<Self, BoxDynError> {
        <i64 as Decode<Sqlite>>::decode(value).map(|micros| Time(micros_to_datetime(micros)))
    }
}

impl Type<Postgres> for Time {
    fn type_info() -> PgTypeInfo {
        <DateTime<Utc> as Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        <DateTime<Utc> as Type<Postgres>>::compatible(ty)
    }
}

impl Encode<'_, Postgres> for Time {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        <DateTime<Utc> as Encode<Postgres>>::encode_by_ref(&self.0, buf)
    }
}

impl Decode<'_, Postgres> for Time {
    fn decode(value: PgValueRef<'_>) -> Result<Self, BoxDynError> {
        <DateTime<Utc> as Decode<Postgres>>::decode(value).map(Time)
    }
}

/// Strings bound as one parameter, for [`Backend::in_list`]: a JSON array on SQLite (expanded
/// by `json_each`), a `text[]` on PostgreSQL.
#[derive(Clone, Copy, Debug)]
pub struct TextList<'a, T>(pub &'a [T]);

impl<T: AsRef<str>> TextList<'_, T> {
    /// The strings as a JSON array, written straight out.
    pub fn json(&self) -> String {
        serde_json::to_string(self).expect("strings serialize")
    }
}

impl<T: AsRef<str>> serde::Serialize for TextList<'_, T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(AsRef::as_ref))
    }
}

impl<T> Type<Sqlite> for TextList<'_, T> {
    fn type_info() -> SqliteTypeInfo {
        <String as Type<Sqlite>>::type_info()
    }
}

impl<T: AsRef<str>> Encode<'_, Sqlite> for TextList<'_, T> {
    fn encode_by_ref(&self, buf: &mut SqliteArgumentsBuffer) -> Result<IsNull, BoxDynError> {
        <String as Encode<Sqlite>>::encode(self.json(), buf)
    }
}

impl<T> Type<Postgres> for TextList<'_, T> {
    fn type_info() -> PgTypeInfo {
        <[String] as Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        <[String] as Type<Postgres>>::compatible(ty)
    }
}

impl<T: AsRef<str>> Encode<'_, Postgres> for TextList<'_, T> {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        self.0.iter().map(AsRef::as_ref).bind_iter().encode(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_list_is_a_json_array_on_sqlite() {
        assert_eq!(TextList(&["a", "b\"c"]).json(), r#"["a","b\"c"]"#);
        assert_eq!(TextList::<&str>(&[]).json(), "[]");
        assert_eq!(
            TextList(&["x".to_owned()]).json(),
            serde_json::to_string(&["x"]).unwrap()
        );
    }

    #[test]
    fn lists_are_matched_the_way_each_backend_can() {
        assert_eq!(
            Backend::Sqlite.in_list("stream_id", "$1"),
            "stream_id IN (SELECT value FROM json_each($1))"
        );
        assert_eq!(
            Backend::Postgres.in_list("action", "$2"),
            "action = ANY($2)"
        );
    }
}
