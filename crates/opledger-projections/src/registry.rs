//! The projection registry: which version of each read model is live, how far each version has
//! applied the ledger, and who advanced it last (`projection_checkpoints`, schema in
//! `projections/checkpoints/`).
//!
//! One row per version of a projection: `active` (the live one; its tables carry the
//! projection's name), `building` (a blue/green rebuild; its tables are `name@vN`), `retired`
//! (flipped away; its tables are gone). A version's `position` is the last ledger position its
//! tables reflect; it only moves by a compare-and-set in the same transaction as the events it
//! accounts for, so a crash never double-applies and a second runner is detected
//! (see `docs/adr/0008-blue-green-projections.md`).
//!
//! Readers (the HTTP API, metrics, tests) use [`list`], [`checkpoint`] and [`wait_for`].

use std::time::Duration;

use chrono::{DateTime, Utc};
use opledger_store::{AnyStore, Backend, Conn, EitherRow, ReadPool, StoreError, Time, either};
use serde::Serialize;

use crate::db::{self, missing_table};

/// The SQLite schema (`projections/checkpoints/sqlite.sql`).
pub const SQLITE_SCHEMA: &str = include_str!("../../../projections/checkpoints/sqlite.sql");
/// The PostgreSQL schema (`projections/checkpoints/postgres.sql`).
pub const POSTGRES_SCHEMA: &str = include_str!("../../../projections/checkpoints/postgres.sql");

/// The lifecycle of one version of a projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Being rebuilt into `name@vN` tables while the active version serves.
    Building,
    /// The live version: its tables carry the projection's name.
    Active,
    /// Flipped away; its tables are dropped.
    Retired,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Building => "building",
            State::Active => "active",
            State::Retired => "retired",
        }
    }

    fn parse(text: &str) -> Option<State> {
        match text {
            "building" => Some(State::Building),
            "active" => Some(State::Active),
            "retired" => Some(State::Retired),
            _ => None,
        }
    }
}

/// One row of the registry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Checkpoint {
    pub name: String,
    pub version: u32,
    pub state: State,
    /// Kept by the store inside every append (its position is then the ledger's head).
    pub inline: bool,
    pub definition_hash: String,
    /// The last ledger position this version's tables reflect.
    pub position: u64,
    /// The process that last advanced it.
    pub runner: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Checkpoint {
    /// The name of this version's main table: the projection's name once active, `name@vN`
    /// while it is being built.
    pub fn table(&self) -> String {
        table_name(&self.name, self.version, self.state)
    }

    /// The prefix of this version's index names, which never changes.
    pub fn index_prefix(&self) -> String {
        index_prefix(&self.name, self.version)
    }
}

/// The main table of version `version` of `name` in `state`.
pub fn table_name(name: &str, version: u32, state: State) -> String {
    match state {
        State::Active => name.to_owned(),
        State::Building | State::Retired => format!("{name}@v{version}"),
    }
}

/// The prefix of version `version`'s index names: the bare name for version 1 (so that tables
/// created before the registry keep their index names), `name@vN` after.
pub fn index_prefix(name: &str, version: u32) -> String {
    if version <= 1 {
        name.to_owned()
    } else {
        format!("{name}@v{version}")
    }
}

/// What `opledger projections list`, the read API and the metrics show for one version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProjectionStatus {
    pub name: String,
    pub version: u32,
    /// `active` or `building`.
    pub state: String,
    /// Kept inside every append: always caught up.
    pub inline: bool,
    /// The last ledger position applied (the head, for an active inline projection).
    pub checkpoint: u64,
    /// The ledger's last position.
    pub head: u64,
    /// `head - checkpoint`.
    pub lag: u64,
    pub definition_hash: String,
    /// The process that last advanced it.
    pub runner: Option<String>,
    pub updated_at: Option<DateTime<Utc>>,
}

/// The registry could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error(
        "cannot use the projection registry (projection_checkpoints): {0}; check that the \
         database is reachable and retry"
    )]
    Database(#[from] sqlx::Error),
    #[error("cannot read the ledger head: {0}")]
    Store(#[from] StoreError),
    #[error(
        "the projection registry has a row it cannot read ({name} v{version}: {reason}); \
         was it edited by hand?"
    )]
    Corrupt {
        name: String,
        version: i64,
        reason: String,
    },
}

/// Creates the registry's table if missing. Takes a writable pool (the store's
/// `projection_pool()`); safe to run from several processes at once.
pub async fn install(pool: ReadPool<'_>) -> Result<(), RegistryError> {
    let mut tx = db::begin(pool).await?;
    // DDL: the backends create the table their own way.
    match tx.conn() {
        Conn::Sqlite(c) => {
            sqlx::raw_sql(SQLITE_SCHEMA).execute(c).await?;
        }
        Conn::Postgres(c) => {
            // Concurrent `CREATE TABLE IF NOT EXISTS` may still collide on PostgreSQL.
            lock_registry(Conn::Postgres(&mut *c)).await?;
            let exists: bool =
                sqlx::query_scalar("SELECT to_regclass('projection_checkpoints') IS NOT NULL")
                    .fetch_one(&mut *c)
                    .await?;
            if !exists {
                sqlx::raw_sql(POSTGRES_SCHEMA).execute(c).await?;
            }
        }
    }
    tx.commit().await?;
    Ok(())
}

/// Every active and building version, by name then version. Empty when the registry was never
/// installed.
pub async fn rows(pool: ReadPool<'_>) -> Result<Vec<Checkpoint>, RegistryError> {
    let result = either!(pool, p => select_visible((&mut *p.acquire().await?).into(), None).await);
    match result {
        Err(RegistryError::Database(e)) if missing_table(&e) => Ok(Vec::new()),
        other => other,
    }
}

/// Every active and building version with its checkpoint, the head and the lag.
pub async fn list(store: &AnyStore) -> Result<Vec<ProjectionStatus>, RegistryError> {
    list_in(store.reader()).await
}

/// [`list`] on any pool of the ledger's database, a read-only one too (`LedgerReader::pool`).
pub async fn list_in(pool: ReadPool<'_>) -> Result<Vec<ProjectionStatus>, RegistryError> {
    let rows = rows(pool).await?;
    // The head is read after the checkpoints, so a lag is never negative.
    let head = match pool {
        ReadPool::Sqlite(pool) => head(Conn::Sqlite(&mut *pool.acquire().await?)).await?,
        ReadPool::Postgres(pool) => head(Conn::Postgres(&mut *pool.acquire().await?)).await?,
    };
    Ok(rows
        .into_iter()
        .map(|row| {
            let checkpoint = if row.inline && row.state == State::Active {
                head
            } else {
                row.position.min(head)
            };
            ProjectionStatus {
                name: row.name,
                version: row.version,
                state: row.state.as_str().to_owned(),
                inline: row.inline,
                checkpoint,
                head,
                lag: head - checkpoint,
                definition_hash: row.definition_hash,
                runner: row.runner,
                updated_at: Some(row.updated_at),
            }
        })
        .collect())
}

/// The active version's checkpoint of `name` (for an inline projection: the head), or `None`
/// if it is not registered yet.
pub async fn checkpoint(pool: ReadPool<'_>, name: &str) -> Result<Option<u64>, RegistryError> {
    let result = either!(pool, p => active_position((&mut *p.acquire().await?).into(), name).await);
    match result {
        Err(RegistryError::Database(e)) if missing_table(&e) => Ok(None),
        other => other,
    }
}

async fn active_position(mut conn: Conn<'_>, name: &str) -> Result<Option<u64>, RegistryError> {
    let rows = select_visible(conn.reborrow(), Some(name)).await?;
    let Some(active) = rows.into_iter().find(|r| r.state == State::Active) else {
        return Ok(None);
    };
    if active.inline {
        return Ok(Some(head(conn).await?));
    }
    Ok(Some(active.position))
}

/// Waits until the active version of `name` has applied the ledger up to `position`: `true`
/// once it has, `false` if `timeout` passed first.
pub async fn wait_for(
    store: &AnyStore,
    name: &str,
    position: u64,
    timeout: Duration,
) -> Result<bool, RegistryError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if checkpoint(store.reader(), name)
            .await?
            .is_some_and(|at| at >= position)
        {
            return Ok(true);
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ---- inside transactions: what the runner and rebuilds use ----

const COLUMNS: &str = "name, version, state, inline, definition_hash, position, runner, \
     created_at, updated_at";

/// The database clock, as each backend stores registry times ([`Time`]).
fn now(backend: Backend) -> &'static str {
    match backend {
        Backend::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)",
        Backend::Postgres => "clock_timestamp()",
    }
}

/// A version as the `integer` column holds it.
fn version_param(version: u32) -> i32 {
    i32::try_from(version).unwrap_or(i32::MAX)
}

fn decode(row: &impl EitherRow) -> Result<Checkpoint, RegistryError> {
    let name: String = row.try_get(0)?;
    let version: i32 = row.try_get(1)?;
    let corrupt = |reason: &str| RegistryError::Corrupt {
        name: name.clone(),
        version: version.into(),
        reason: reason.to_owned(),
    };
    let state: String = row.try_get(2)?;
    Ok(Checkpoint {
        version: u32::try_from(version).map_err(|_| corrupt("bad version"))?,
        state: State::parse(&state).ok_or_else(|| corrupt("unknown state"))?,
        inline: row.try_get(3)?,
        definition_hash: row.try_get(4)?,
        position: u64::try_from(row.try_get::<i64>(5)?)
            .map_err(|_| corrupt("negative position"))?,
        runner: row.try_get(6)?,
        created_at: row.try_get::<Time>(7)?.0,
        updated_at: row.try_get::<Time>(8)?.0,
        name,
    })
}

/// The active and building rows, of one projection or all.
pub(crate) async fn select(
    conn: Conn<'_>,
    name: Option<&str>,
) -> Result<Vec<Checkpoint>, RegistryError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM projection_checkpoints \
         WHERE state <> 'retired' AND ($1 IS NULL OR name = $1) ORDER BY name, version"
    );
    either!(conn, c => sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(name)
        .fetch_all(c)
        .await?
        .iter()
        .map(decode)
        .collect())
}

/// The rows a reader sees: [`select`], but on a SQLite reading connection (the store's read
/// pool, a `LedgerReader`) from both files: the inline projections' rows from the ledger's, the
/// asynchronous ones' from the read models' file attached beside it (`opledger_store::
/// read_models`). Where that file is not attached (a writer's connection, or no such file yet),
/// the connection's own table.
async fn select_visible(
    mut conn: Conn<'_>,
    name: Option<&str>,
) -> Result<Vec<Checkpoint>, RegistryError> {
    if let Conn::Sqlite(c) = &mut conn {
        let sql = format!(
            "SELECT {COLUMNS} FROM (\
                 SELECT {COLUMNS} FROM main.projection_checkpoints WHERE inline = 1 \
                 UNION ALL \
                 SELECT {COLUMNS} FROM {schema}.projection_checkpoints WHERE inline = 0) \
             WHERE state <> 'retired' AND ($1 IS NULL OR name = $1) ORDER BY name, version",
            schema = opledger_store::read_models::SCHEMA
        );
        match sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(name)
            .fetch_all(&mut **c)
            .await
        {
            Ok(rows) => return rows.iter().map(decode).collect(),
            Err(error) if missing_table(&error) => {}
            Err(error) => return Err(error.into()),
        }
    }
    select(conn, name).await
}

/// The highest version ever registered for `name` (retired ones included); 0 if none.
pub(crate) async fn last_version(conn: Conn<'_>, name: &str) -> Result<u32, RegistryError> {
    const SQL: &str =
        "SELECT COALESCE(MAX(version), 0) FROM projection_checkpoints WHERE name = $1";
    let version: i32 = either!(conn, c => sqlx::query_scalar(SQL).bind(name).fetch_one(c).await?);
    u32::try_from(version).map_err(|_| RegistryError::Corrupt {
        name: name.to_owned(),
        version: version.into(),
        reason: "bad version".to_owned(),
    })
}

/// A new row.
#[derive(Debug)]
pub(crate) struct NewRow<'a> {
    pub(crate) name: &'a str,
    pub(crate) version: u32,
    pub(crate) state: State,
    pub(crate) inline: bool,
    pub(crate) definition_hash: &'a str,
    pub(crate) position: u64,
    pub(crate) runner: &'a str,
}

pub(crate) async fn insert(conn: Conn<'_>, row: &NewRow<'_>) -> Result<(), RegistryError> {
    let sql = format!(
        "INSERT INTO projection_checkpoints (name, version, state, inline, definition_hash, \
         position, runner, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, {now}, {now})",
        now = now(conn.backend())
    );
    either!(conn, c => sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(row.name)
        .bind(version_param(row.version))
        .bind(row.state.as_str())
        .bind(row.inline)
        .bind(row.definition_hash)
        .bind(to_i64(row.position))
        .bind(row.runner)
        .execute(c)
        .await
        .map(drop)?);
    Ok(())
}

/// The compare-and-set that moves a version's checkpoint from `old` to `new`: `false` if the row
/// is not at `old` in `state` any more (another runner advanced it, or a flip retired it). On
/// PostgreSQL it also locks the row until the transaction ends.
pub(crate) async fn advance(
    conn: Conn<'_>,
    name: &str,
    version: u32,
    state: State,
    old: u64,
    new: u64,
    runner: &str,
) -> Result<bool, RegistryError> {
    let sql = format!(
        "UPDATE projection_checkpoints SET position = $1, runner = $2, updated_at = {now} \
         WHERE name = $3 AND version = $4 AND state = $5 AND position = $6",
        now = now(conn.backend())
    );
    let done = either!(conn, c => sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(to_i64(new))
        .bind(runner)
        .bind(name)
        .bind(version_param(version))
        .bind(state.as_str())
        .bind(to_i64(old))
        .execute(c)
        .await?
        .rows_affected());
    Ok(done == 1)
}

/// Moves a version from one state to another (and its position, if given): `false` if it was not
/// in `from`. On PostgreSQL it also locks the row until the transaction ends.
pub(crate) async fn set_state(
    conn: Conn<'_>,
    name: &str,
    version: u32,
    from: State,
    to: State,
    runner: &str,
) -> Result<bool, RegistryError> {
    let sql = format!(
        "UPDATE projection_checkpoints SET state = $1, runner = $2, updated_at = {now} \
         WHERE name = $3 AND version = $4 AND state = $5",
        now = now(conn.backend())
    );
    let done = either!(conn, c => sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(to.as_str())
        .bind(runner)
        .bind(name)
        .bind(version_param(version))
        .bind(from.as_str())
        .execute(c)
        .await?
        .rows_affected());
    Ok(done == 1)
}

/// Locks a version's row for the rest of the transaction (PostgreSQL; on SQLite the
/// transaction's write lock already excludes everyone) and returns its position, or `None` if
/// it is not in `state`.
pub(crate) async fn hold(
    conn: Conn<'_>,
    name: &str,
    version: u32,
    state: State,
) -> Result<Option<u64>, RegistryError> {
    let lock = match conn.backend() {
        Backend::Sqlite => "",
        Backend::Postgres => " FOR UPDATE",
    };
    let sql = format!(
        "SELECT position FROM projection_checkpoints \
         WHERE name = $1 AND version = $2 AND state = $3{lock}"
    );
    let position: Option<i64> = either!(conn, c => sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(name)
        .bind(version_param(version))
        .bind(state.as_str())
        .fetch_optional(c)
        .await?);
    Ok(position.map(|p| u64::try_from(p).unwrap_or(0)))
}

/// Serializes changes to the registry's shape (registrations, new versions, flips) across
/// processes for the rest of the transaction: PostgreSQL's transaction advisory lock; SQLite's
/// `BEGIN IMMEDIATE` already does it.
pub(crate) async fn lock_registry(conn: Conn<'_>) -> Result<(), RegistryError> {
    if let Conn::Postgres(c) = conn {
        sqlx::query("SELECT pg_advisory_xact_lock($1, 0)")
            .bind(LOCK_CLASS)
            .execute(c)
            .await?;
    }
    Ok(())
}

/// The first key of every advisory lock the projections take (`'opld'` in ASCII); the second
/// is 0 for the registry and `hashtext(name)` for a projection's runner.
pub(crate) const LOCK_CLASS: i32 = 0x6f70_6c64;

/// The ledger's last position, read on `conn` (inside the caller's transaction).
pub(crate) async fn head(conn: Conn<'_>) -> Result<u64, RegistryError> {
    const SQL: &str = "SELECT last_position FROM ledger_head WHERE ledger_id = 1";
    let position: i64 = either!(conn, c => sqlx::query_scalar(SQL).fetch_one(c).await?);
    Ok(u64::try_from(position).unwrap_or(0))
}

/// Takes the ledger's write lock inside the caller's transaction, so that no append commits
/// until it ends, and returns the head: on SQLite the transaction's `BEGIN IMMEDIATE` holds it
/// already; on PostgreSQL the `ledger_head` row is locked like the store's writer does. (The
/// backends take the lock their own ways.)
pub(crate) async fn lock_ledger(conn: Conn<'_>) -> Result<u64, RegistryError> {
    const SQL: &str = "SELECT last_position FROM ledger_head WHERE ledger_id = 1 FOR UPDATE";
    match conn {
        Conn::Sqlite(c) => head(Conn::Sqlite(c)).await,
        Conn::Postgres(c) => {
            let position: i64 = sqlx::query_scalar(SQL).fetch_one(c).await?;
            Ok(u64::try_from(position).unwrap_or(0))
        }
    }
}

fn to_i64(position: u64) -> i64 {
    i64::try_from(position).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_name_their_tables_and_indexes() {
        assert_eq!(
            table_name("audit_trail", 3, State::Building),
            "audit_trail@v3"
        );
        assert_eq!(table_name("audit_trail", 3, State::Active), "audit_trail");
        assert_eq!(index_prefix("operation_status", 1), "operation_status");
        assert_eq!(index_prefix("operation_status", 2), "operation_status@v2");
    }
}
