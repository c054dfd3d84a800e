//! Transactions on the projections' own connections, of either backend: what the registry, the
//! runner and rebuilds share.
//!
//! Every write transaction on SQLite begins with `BEGIN IMMEDIATE` (never a deferred transaction
//! that would have to upgrade its lock, which fails at once when another connection wrote in
//! between); on PostgreSQL a plain `BEGIN` with a `lock_timeout`.

use std::time::Duration;

use opledger_store::ReadPool;
use sqlx::pool::PoolConnection;
use sqlx::{Connection, PgConnection, Postgres, Sqlite, SqliteConnection, Transaction};

use crate::projection::{Backend, Conn};

/// How long a projection transaction on PostgreSQL waits for a lock (a table being flipped, the
/// ledger's head) before giving up and retrying later.
pub(crate) const PG_LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// An open write transaction; rolled back when dropped without [`Txn::commit`].
#[derive(Debug)]
pub(crate) enum Txn<'c> {
    Sqlite(Transaction<'c, Sqlite>),
    Postgres(Transaction<'c, Postgres>),
}

impl Txn<'_> {
    /// The connection inside the transaction, for statements and [`crate::Projection::apply`].
    pub(crate) fn conn(&mut self) -> Conn<'_> {
        match self {
            Txn::Sqlite(tx) => Conn::Sqlite(tx),
            Txn::Postgres(tx) => Conn::Postgres(tx),
        }
    }

    pub(crate) async fn commit(self) -> Result<(), sqlx::Error> {
        match self {
            Txn::Sqlite(tx) => tx.commit().await,
            Txn::Postgres(tx) => tx.commit().await,
        }
    }
}

/// The statement that begins a projection transaction on PostgreSQL.
fn pg_begin() -> String {
    format!(
        "BEGIN; SET LOCAL lock_timeout = '{}ms'",
        PG_LOCK_TIMEOUT.as_millis()
    )
}

/// Begins a write transaction on a connection of `pool` (the store's projection pool).
pub(crate) async fn begin(pool: ReadPool<'_>) -> Result<Txn<'static>, sqlx::Error> {
    Ok(match pool {
        ReadPool::Sqlite(pool) => Txn::Sqlite(pool.begin_with("BEGIN IMMEDIATE").await?),
        ReadPool::Postgres(pool) => {
            Txn::Postgres(pool.begin_with(sqlx::AssertSqlSafe(pg_begin())).await?)
        }
    })
}

/// A connection of either backend taken out of a pool for a long job (a rebuild), with session
/// settings of its own; closed rather than returned when the job ends.
#[derive(Debug)]
pub(crate) enum Owned {
    Sqlite(SqliteConnection),
    Postgres(PgConnection),
}

impl Owned {
    /// Takes a connection out of `pool` for good.
    pub(crate) async fn detach(pool: ReadPool<'_>) -> Result<Owned, sqlx::Error> {
        Ok(match pool {
            ReadPool::Sqlite(pool) => Owned::Sqlite(PoolConnection::detach(pool.acquire().await?)),
            ReadPool::Postgres(pool) => {
                Owned::Postgres(PoolConnection::detach(pool.acquire().await?))
            }
        })
    }

    pub(crate) fn backend(&self) -> Backend {
        match self {
            Owned::Sqlite(_) => Backend::Sqlite,
            Owned::Postgres(_) => Backend::Postgres,
        }
    }

    /// Runs session statements (pragmas, settings) outside any transaction.
    pub(crate) async fn execute(&mut self, sql: &'static str) -> Result<(), sqlx::Error> {
        match self {
            Owned::Sqlite(c) => sqlx::raw_sql(sql).execute(c).await.map(drop),
            Owned::Postgres(c) => sqlx::raw_sql(sql).execute(c).await.map(drop),
        }
    }

    /// Begins a write transaction on this connection.
    pub(crate) async fn begin(&mut self) -> Result<Txn<'_>, sqlx::Error> {
        Ok(match self {
            Owned::Sqlite(c) => Txn::Sqlite(c.begin_with("BEGIN IMMEDIATE").await?),
            Owned::Postgres(c) => {
                Txn::Postgres(c.begin_with(sqlx::AssertSqlSafe(pg_begin())).await?)
            }
        })
    }

    pub(crate) async fn close(self) {
        let closed = match self {
            Owned::Sqlite(c) => c.close().await,
            Owned::Postgres(c) => c.close().await,
        };
        if let Err(error) = closed {
            tracing::debug!(%error, "closing a projection connection failed");
        }
    }
}

/// The backend of a pool.
pub(crate) fn backend(pool: ReadPool<'_>) -> Backend {
    match pool {
        ReadPool::Sqlite(_) => Backend::Sqlite,
        ReadPool::Postgres(_) => Backend::Postgres,
    }
}

/// Quotes an identifier (`audit_trail@v3` → `"audit_trail@v3"`); names are `[a-z_]+` with an
/// optional `@vN`, so there is nothing to escape, but a stray quote is doubled all the same.
pub(crate) fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Whether a database error says a table does not exist (a registry not installed yet).
pub(crate) fn missing_table(error: &sqlx::Error) -> bool {
    error.as_database_error().is_some_and(|e| {
        e.code().as_deref() == Some("42P01") || e.message().contains("no such table")
    })
}
