//! Transactions on the projections' own connections, of either backend: what the registry, the
//! runner and rebuilds share.
//!
//! Every write transaction on SQLite begins with `BEGIN IMMEDIATE` (never a deferred transaction
//! that would have to upgrade its lock, which fails at once when another connection wrote in
//! between); on PostgreSQL a plain `BEGIN` with a `lock_timeout`. How the lock is taken is where
//! the backends differ; the statements inside are written once.

use std::time::Duration;

use opledger_store::{AnyStore, Backend, Conn, ReadPool, Txn, either};

use crate::projection::Projection;
use sqlx::{AssertSqlSafe, Connection};

/// How long a projection transaction on PostgreSQL waits for a lock (a table being flipped, the
/// ledger's head) before giving up and retrying later.
pub(crate) const PG_LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// The statement that begins a projection's write transaction on `backend`.
fn begin_statement(backend: Backend) -> AssertSqlSafe<String> {
    AssertSqlSafe(match backend {
        Backend::Sqlite => "BEGIN IMMEDIATE".to_owned(),
        Backend::Postgres => format!(
            "BEGIN; SET LOCAL lock_timeout = '{}ms'",
            PG_LOCK_TIMEOUT.as_millis()
        ),
    })
}

/// Begins a write transaction on a connection of `pool` (the store's projection pool); rolled
/// back when dropped without [`Txn::commit`].
pub(crate) async fn begin(pool: ReadPool<'_>) -> Result<Txn<'static>, sqlx::Error> {
    let statement = begin_statement(pool.backend());
    Ok(either!(map pool, p => p.begin_with(statement).await?))
}

/// Begins the transaction of an asynchronous read model's page on a connection of `pool`
/// ([`pool_for`]): like [`begin`], but on PostgreSQL its commit does not wait for the disk
/// (`synchronous_commit = off`; on SQLite the read models' file already commits that way). A
/// crash may lose the last pages applied, always together with the checkpoint that counts
/// them, so nothing is skipped or applied twice; the read model is a little behind, no more.
pub(crate) async fn begin_page(pool: ReadPool<'_>) -> Result<Txn<'static>, sqlx::Error> {
    let mut statement = begin_statement(pool.backend()).0;
    if pool.backend() == Backend::Postgres {
        statement.push_str("; SET LOCAL synchronous_commit = off");
    }
    Ok(either!(map pool, p => p.begin_with(AssertSqlSafe(statement.clone())).await?))
}

/// Begins a write transaction on `conn` (a connection taken out of the pool for a long job).
pub(crate) async fn begin_on(conn: Conn<'_>) -> Result<Txn<'_>, sqlx::Error> {
    let statement = begin_statement(conn.backend());
    Ok(either!(map conn, c => c.begin_with(statement).await?))
}

/// The writable pool where `projection`'s tables and checkpoints live: the ledger's own file
/// (or database) for an inline one, which the store writes in every append; the read models'
/// file beside a SQLite ledger for an asynchronous one (on PostgreSQL the same database).
pub(crate) fn pool_for<'a>(store: &'a AnyStore, projection: &dyn Projection) -> ReadPool<'a> {
    if projection.inline() {
        store.projection_pool()
    } else {
        store.read_model_pool()
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

/// Creates an inline projection's live table `name` (with `schema(backend)`) only when it is
/// missing: after a blue/green flip the live table's indexes carry another version's names, and
/// creating them again would duplicate them. (DDL: each backend looks the table up and
/// serializes creators its own way.)
pub(crate) async fn install_live(
    connection: Conn<'_>,
    name: &str,
    schema: fn(Backend) -> String,
) -> Result<(), opledger_store::inline::ProjectionError> {
    match connection {
        Conn::Sqlite(connection) => {
            let mut tx = connection.begin_with("BEGIN IMMEDIATE").await?;
            let exists: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = $1)",
            )
            .bind(name)
            .fetch_one(&mut *tx)
            .await?;
            if !exists {
                sqlx::raw_sql(AssertSqlSafe(schema(Backend::Sqlite)))
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
        }
        Conn::Postgres(connection) => {
            let mut tx = connection.begin().await?;
            // Instances opening a new database at once would race to create the table.
            sqlx::query("SELECT pg_advisory_xact_lock($1, 0)")
                .bind(crate::registry::LOCK_CLASS)
                .execute(&mut *tx)
                .await?;
            let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
                .bind(name)
                .fetch_one(&mut *tx)
                .await?;
            if !exists {
                sqlx::raw_sql(AssertSqlSafe(schema(Backend::Postgres)))
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
        }
    }
    Ok(())
}
