//! `operation_status`: one row per operation with its current state, kept inline (in the same
//! transaction as every append to an operation stream), so `/status`, `opledger ops` and the
//! worker's queue of due operations read their own writes.
//!
//! The row is a fold of the operation's events ([`OperationStatusRow::apply`]): the same code
//! updates it inline and rebuilds it from the ledger.

use std::collections::HashMap;

use chrono::{DateTime, TimeDelta, Utc};
use futures_util::future::BoxFuture;
use opledger_domain::operation::{OperationEvent, ReconcileOutcome, Status};
use opledger_domain::{DomainEvent, Operation};
use opledger_store::ReadPool;
use opledger_store::chain::Link;
use opledger_store::inline::{InlineProjection, ProjectionError};
use serde::Serialize;
use sqlx::{PgConnection, Row, SqliteConnection};

/// The SQLite schema (`projections/operation_status/sqlite.sql`).
pub const SQLITE_SCHEMA: &str = include_str!("../../../projections/operation_status/sqlite.sql");
/// The PostgreSQL schema (`projections/operation_status/postgres.sql`).
pub const POSTGRES_SCHEMA: &str =
    include_str!("../../../projections/operation_status/postgres.sql");

/// The category of the streams this projection reads (`op-…`).
const CATEGORY: &str = <Operation as opledger_domain::Aggregate>::STREAM_CATEGORY;

/// One operation's current state, as read models show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OperationStatusRow {
    pub operation_id: String,
    pub stream_id: String,
    pub action: String,
    pub business_key: String,
    pub bot: String,
    pub chat_id: Option<i64>,
    pub user_id: Option<i64>,
    /// The domain's status name (`received`, `claimed`, `call_sent`, ...).
    pub status: String,
    /// Claims so far.
    pub attempts: u32,
    pub worker: Option<String>,
    pub lease_until: Option<DateTime<Utc>>,
    /// When a worker should look at the operation next; `None` once nothing is left to do.
    pub due_at: Option<DateTime<Utc>>,
    pub external_id: Option<String>,
    pub last_error: Option<String>,
    /// The reply's state: `not_started`, `in_flight`, `retry_scheduled`, `sent`, `failed`,
    /// `unknown`.
    pub reply: String,
    /// Requests with the same business key and different parameters, refused.
    pub key_conflicts: u32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The operation stream's version this row reflects.
    pub version: u64,
    /// The ledger position of the last event applied.
    pub last_position: u64,
}

/// Why an event could not be folded into the read model.
#[derive(Debug, thiserror::Error)]
pub enum FoldError {
    #[error("event {position} of `{stream}` cannot be read: {source}")]
    Decode {
        position: u64,
        stream: String,
        #[source]
        source: opledger_domain::DecodeError,
    },
    #[error(
        "event {position} of `{stream}` is not the start of an operation, and the read model has no row for it; rebuild operation_status"
    )]
    MissingRow { position: u64, stream: String },
}

/// How long a reply may stay in flight before the worker's sweep presumes its sender died and
/// records the reply's outcome as unknown. Far longer than a `sendMessage` may take.
pub const REPLY_LEASE: TimeDelta = TimeDelta::seconds(60);

impl OperationStatusRow {
    /// When a worker must look at a terminal operation: now, if it has a chat to reply to and
    /// no reply was started yet; never otherwise.
    fn reply_due(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        (self.chat_id.is_some() && self.reply == "not_started").then_some(at)
    }

    /// Folds one event of the operation's stream into its row; `row` is `None` before the first
    /// event.
    pub fn apply(row: Option<Self>, link: &Link<'_>) -> Result<Self, FoldError> {
        let event = OperationEvent::from_stored(link.event_type, link.schema_version, link.payload)
            .map_err(|source| FoldError::Decode {
                position: link.position,
                stream: link.stream_id.to_owned(),
                source,
            })?;
        let at = link.recorded_at();
        let mut row = match (row, &event) {
            (_, OperationEvent::Received(received)) => OperationStatusRow {
                operation_id: received.operation_id.to_string(),
                stream_id: link.stream_id.to_owned(),
                action: received.action.clone(),
                business_key: received.business_key.clone(),
                bot: received.bot.clone(),
                chat_id: received.chat_id,
                user_id: received.user_id,
                status: Status::Received.as_str().to_owned(),
                attempts: 0,
                worker: None,
                lease_until: None,
                due_at: Some(at),
                external_id: None,
                last_error: None,
                reply: "not_started".to_owned(),
                key_conflicts: 0,
                created_at: at,
                updated_at: at,
                version: link.version,
                last_position: link.position,
            },
            (Some(row), _) => row,
            (None, _) => {
                return Err(FoldError::MissingRow {
                    position: link.position,
                    stream: link.stream_id.to_owned(),
                });
            }
        };
        let status = |s: Status| s.as_str().to_owned();
        match &event {
            OperationEvent::Received(_) => {}
            OperationEvent::Claimed(e) => {
                row.status = status(Status::Claimed);
                row.attempts = e.attempt;
                row.worker = Some(e.worker.clone());
                row.lease_until = Some(e.lease_until);
                // If the lease runs out, the recovery sweep looks at it then.
                row.due_at = Some(e.lease_until);
            }
            OperationEvent::ExternalCallSent(_) => row.status = status(Status::CallSent),
            OperationEvent::Confirmed(e) => {
                row.status = status(Status::Confirmed);
                row.external_id.clone_from(&e.external_id);
                row.lease_until = None;
                row.due_at = row.reply_due(at);
            }
            OperationEvent::Failed(e) => {
                row.status = status(Status::Failed);
                row.last_error = Some(e.reason.clone());
                row.lease_until = None;
                row.due_at = row.reply_due(at);
            }
            OperationEvent::RetryScheduled(e) => {
                row.status = status(Status::RetryScheduled);
                row.last_error = Some(e.reason.clone());
                row.worker = None;
                row.lease_until = None;
                row.due_at = Some(e.at);
            }
            OperationEvent::MarkedForReconciliation(e) => {
                row.status = status(Status::NeedsReconciliation);
                row.last_error = Some(e.reason.clone());
                row.lease_until = None;
                row.due_at = None;
            }
            OperationEvent::Reconciled(e) => {
                row.lease_until = None;
                if e.outcome == ReconcileOutcome::Retry {
                    row.status = status(Status::RetryScheduled);
                    row.worker = None;
                    row.due_at = Some(at);
                } else {
                    row.status = status(Status::Reconciled);
                    row.external_id.clone_from(&e.external_id);
                    row.due_at = row.reply_due(at);
                }
            }
            OperationEvent::KeyConflictRecorded(_) => {
                row.key_conflicts = row.key_conflicts.saturating_add(1);
            }
            OperationEvent::TransitionRejected(_) => {}
            OperationEvent::ReplyStarted(_) => {
                row.reply = "in_flight".to_owned();
                // If no outcome is recorded by then, the sender died: the sweep records the
                // reply's outcome as unknown (never a second sendMessage).
                row.due_at = Some(at + REPLY_LEASE);
            }
            OperationEvent::ReplySent(_) => {
                row.reply = "sent".to_owned();
                row.due_at = None;
            }
            OperationEvent::ReplyRetryScheduled(e) => {
                row.reply = "retry_scheduled".to_owned();
                row.due_at = Some(e.at);
            }
            OperationEvent::ReplyFailed(_) => {
                row.reply = "failed".to_owned();
                row.due_at = None;
            }
            OperationEvent::ReplyOutcomeUnknown(_) => {
                row.reply = "unknown".to_owned();
                row.due_at = None;
            }
        }
        row.updated_at = at;
        row.version = link.version;
        row.last_position = link.position;
        Ok(row)
    }
}

/// The inline projection that keeps `operation_status`.
#[derive(Clone, Copy, Debug, Default)]
pub struct OperationStatus;

/// The events of a batch that concern operations, grouped by stream in position order.
fn operation_events<'a>(events: &'a [Link<'a>]) -> Vec<(&'a str, Vec<&'a Link<'a>>)> {
    let mut by_stream: Vec<(&str, Vec<&Link<'_>>)> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for link in events {
        let category = link
            .stream_id
            .split_once('-')
            .map_or(link.stream_id, |(c, _)| c);
        if category != CATEGORY {
            continue;
        }
        let slot = *index.entry(link.stream_id).or_insert_with(|| {
            by_stream.push((link.stream_id, Vec::new()));
            by_stream.len() - 1
        });
        by_stream[slot].1.push(link);
    }
    by_stream
}

/// Folds a batch into final rows, starting from the rows already stored.
fn fold(
    batch: Vec<(&str, Vec<&Link<'_>>)>,
    mut stored: HashMap<String, OperationStatusRow>,
) -> Result<Vec<OperationStatusRow>, FoldError> {
    batch
        .into_iter()
        .map(|(stream, links)| {
            links
                .into_iter()
                .try_fold(stored.remove(stream), |row, link| {
                    OperationStatusRow::apply(row, link).map(Some)
                })
                .map(|row| row.expect("a stream in the batch has at least one event"))
        })
        .collect()
}

/// The streams of a batch whose rows must be read first: those whose first event in the batch
/// does not start the operation.
fn needing_rows<'a>(batch: &[(&'a str, Vec<&Link<'_>>)]) -> Vec<&'a str> {
    batch
        .iter()
        .filter(|(_, links)| links.first().is_some_and(|l| l.event_type != "Received"))
        .map(|(stream, _)| *stream)
        .collect()
}

const COLUMNS: &str = "operation_id, stream_id, action, business_key, bot, chat_id, user_id, \
     status, attempts, worker, lease_until, due_at, external_id, last_error, reply, \
     key_conflicts, created_at, updated_at, version, last_position";

/// The same columns for reading on PostgreSQL, whose `integer` counters decode as 64-bit like
/// SQLite's.
const PG_COLUMNS: &str = "operation_id, stream_id, action, business_key, bot, chat_id, \
     user_id, status, attempts::bigint, worker, lease_until, due_at, external_id, last_error, \
     reply, key_conflicts::bigint, created_at, updated_at, version, last_position";

/// The columns an upsert overwrites (all but the identity and creation ones).
const UPDATED: &str = "status = excluded.status, attempts = excluded.attempts, \
     worker = excluded.worker, lease_until = excluded.lease_until, due_at = excluded.due_at, \
     external_id = excluded.external_id, last_error = excluded.last_error, \
     reply = excluded.reply, key_conflicts = excluded.key_conflicts, \
     updated_at = excluded.updated_at, version = excluded.version, \
     last_position = excluded.last_position";

/// A row as a JSON array in column order, times as microseconds since the Unix epoch.
fn row_json(row: &OperationStatusRow) -> serde_json::Value {
    let micros = |t: Option<DateTime<Utc>>| t.map(|t| t.timestamp_micros());
    serde_json::json!([
        row.operation_id,
        row.stream_id,
        row.action,
        row.business_key,
        row.bot,
        row.chat_id,
        row.user_id,
        row.status,
        row.attempts,
        row.worker,
        micros(row.lease_until),
        micros(row.due_at),
        row.external_id,
        row.last_error,
        row.reply,
        row.key_conflicts,
        row.created_at.timestamp_micros(),
        row.updated_at.timestamp_micros(),
        row.version,
        row.last_position,
    ])
}

fn rows_json(rows: &[OperationStatusRow]) -> String {
    serde_json::Value::Array(rows.iter().map(row_json).collect()).to_string()
}

/// Reads stored rows from either backend, decoding times the way each stores them.
trait TimeColumn {
    fn time(&self, index: usize) -> Result<Option<DateTime<Utc>>, sqlx::Error>;
}

impl TimeColumn for sqlx::sqlite::SqliteRow {
    fn time(&self, index: usize) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        let micros: Option<i64> = self.try_get(index)?;
        Ok(micros.and_then(DateTime::from_timestamp_micros))
    }
}

impl TimeColumn for sqlx::postgres::PgRow {
    fn time(&self, index: usize) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        self.try_get(index)
    }
}

fn decode_row<R>(row: &R) -> Result<OperationStatusRow, sqlx::Error>
where
    R: Row + TimeColumn,
    usize: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<i64>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let required = |t: Option<DateTime<Utc>>, column: &'static str| {
        t.ok_or_else(|| sqlx::Error::ColumnDecode {
            index: column.into(),
            source: "a required time is missing".into(),
        })
    };
    let count = |value: i64, column: &'static str| {
        u32::try_from(value).map_err(|e| sqlx::Error::ColumnDecode {
            index: column.into(),
            source: Box::new(e),
        })
    };
    let position = |value: i64, column: &'static str| {
        u64::try_from(value).map_err(|e| sqlx::Error::ColumnDecode {
            index: column.into(),
            source: Box::new(e),
        })
    };
    Ok(OperationStatusRow {
        operation_id: row.try_get(0)?,
        stream_id: row.try_get(1)?,
        action: row.try_get(2)?,
        business_key: row.try_get(3)?,
        bot: row.try_get(4)?,
        chat_id: row.try_get(5)?,
        user_id: row.try_get(6)?,
        status: row.try_get(7)?,
        attempts: count(row.try_get::<i64, _>(8)?, "attempts")?,
        worker: row.try_get(9)?,
        lease_until: row.time(10)?,
        due_at: row.time(11)?,
        external_id: row.try_get(12)?,
        last_error: row.try_get(13)?,
        reply: row.try_get(14)?,
        key_conflicts: count(row.try_get::<i64, _>(15)?, "key_conflicts")?,
        created_at: required(row.time(16)?, "created_at")?,
        updated_at: required(row.time(17)?, "updated_at")?,
        version: position(row.try_get(18)?, "version")?,
        last_position: position(row.try_get(19)?, "last_position")?,
    })
}

mod sql {
    //! The statements, per backend.

    /// SQLite keeps integers and microsecond times; the JSON array's elements map one to one.
    pub(super) const SQLITE_SELECT: &str = "SELECT operation_id, stream_id, action, business_key, \
         bot, chat_id, user_id, status, attempts, worker, lease_until, due_at, external_id, \
         last_error, reply, key_conflicts, created_at, updated_at, version, last_position \
         FROM operation_status WHERE stream_id IN (SELECT value FROM json_each($1))";

    pub(super) const SQLITE_UPSERT_HEAD: &str = "INSERT INTO operation_status (";
    pub(super) const SQLITE_UPSERT_VALUES: &str = ") SELECT value ->> 0, value ->> 1, value ->> 2, \
         value ->> 3, value ->> 4, value ->> 5, value ->> 6, value ->> 7, value ->> 8, \
         value ->> 9, value ->> 10, value ->> 11, value ->> 12, value ->> 13, value ->> 14, \
         value ->> 15, value ->> 16, value ->> 17, value ->> 18, value ->> 19 \
         FROM json_each($1) WHERE true ON CONFLICT (operation_id) DO UPDATE SET ";

    pub(super) const POSTGRES_WHERE: &str = " FROM operation_status WHERE stream_id = ANY($1)";

    /// Microseconds since the epoch back to `timestamptz`, exactly (no floating point).
    pub(super) const POSTGRES_UPSERT_HEAD: &str = "INSERT INTO operation_status (";
    pub(super) const POSTGRES_UPSERT_VALUES: &str = ") SELECT r->>0, r->>1, r->>2, r->>3, r->>4, \
         (r->>5)::bigint, (r->>6)::bigint, r->>7, (r->>8)::integer, r->>9, \
         'epoch'::timestamptz + (r->>10)::bigint * interval '1 microsecond', \
         'epoch'::timestamptz + (r->>11)::bigint * interval '1 microsecond', \
         r->>12, r->>13, r->>14, (r->>15)::integer, \
         'epoch'::timestamptz + (r->>16)::bigint * interval '1 microsecond', \
         'epoch'::timestamptz + (r->>17)::bigint * interval '1 microsecond', \
         (r->>18)::bigint, (r->>19)::bigint \
         FROM jsonb_array_elements($1::jsonb) AS r ON CONFLICT (operation_id) DO UPDATE SET ";
}

fn upsert(head: &str, values: &str) -> String {
    format!("{head}{COLUMNS}{values}{UPDATED}")
}

impl InlineProjection for OperationStatus {
    fn name(&self) -> &'static str {
        "operation_status"
    }

    fn install_sqlite<'a>(
        &'a self,
        connection: &'a mut SqliteConnection,
    ) -> BoxFuture<'a, Result<(), ProjectionError>> {
        Box::pin(async move {
            sqlx::raw_sql(SQLITE_SCHEMA).execute(connection).await?;
            Ok(())
        })
    }

    fn install_postgres<'a>(
        &'a self,
        connection: &'a mut PgConnection,
    ) -> BoxFuture<'a, Result<(), ProjectionError>> {
        Box::pin(async move {
            sqlx::raw_sql(POSTGRES_SCHEMA).execute(connection).await?;
            Ok(())
        })
    }

    fn apply_sqlite<'a>(
        &'a self,
        connection: &'a mut SqliteConnection,
        events: &'a [Link<'a>],
    ) -> BoxFuture<'a, Result<(), ProjectionError>> {
        Box::pin(async move {
            let batch = operation_events(events);
            if batch.is_empty() {
                return Ok(());
            }
            let needed = needing_rows(&batch);
            let mut stored = HashMap::new();
            if !needed.is_empty() {
                let ids = serde_json::to_string(&needed)?;
                for row in sqlx::query(sql::SQLITE_SELECT)
                    .bind(ids)
                    .fetch_all(&mut *connection)
                    .await?
                {
                    let row = decode_row(&row)?;
                    stored.insert(row.stream_id.clone(), row);
                }
            }
            let rows = fold(batch, stored)?;
            let statement = upsert(sql::SQLITE_UPSERT_HEAD, sql::SQLITE_UPSERT_VALUES);
            sqlx::query(sqlx::AssertSqlSafe(statement))
                .bind(rows_json(&rows))
                .execute(connection)
                .await?;
            Ok(())
        })
    }

    fn apply_postgres<'a>(
        &'a self,
        connection: &'a mut PgConnection,
        events: &'a [Link<'a>],
    ) -> BoxFuture<'a, Result<(), ProjectionError>> {
        Box::pin(async move {
            let batch = operation_events(events);
            if batch.is_empty() {
                return Ok(());
            }
            let needed = needing_rows(&batch);
            let mut stored = HashMap::new();
            if !needed.is_empty() {
                let select = format!("SELECT {PG_COLUMNS}{}", sql::POSTGRES_WHERE);
                for row in sqlx::query(sqlx::AssertSqlSafe(select))
                    .bind(&needed)
                    .fetch_all(&mut *connection)
                    .await?
                {
                    let row = decode_row(&row)?;
                    stored.insert(row.stream_id.clone(), row);
                }
            }
            let rows = fold(batch, stored)?;
            let statement = upsert(sql::POSTGRES_UPSERT_HEAD, sql::POSTGRES_UPSERT_VALUES);
            sqlx::query(sqlx::AssertSqlSafe(statement))
                .bind(rows_json(&rows))
                .execute(connection)
                .await?;
            Ok(())
        })
    }
}

/// Which operations to list.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub status: Option<String>,
    pub bot: Option<String>,
    pub user_id: Option<i64>,
    /// At most this many, newest first.
    pub limit: u32,
}

/// A read model could not be read; retry, or check the database.
#[derive(Debug, thiserror::Error)]
#[error("cannot read operation_status: {0}")]
pub struct ReadError(#[from] sqlx::Error);

/// Lists operations, most recently updated first.
pub async fn list(
    pool: ReadPool<'_>,
    filter: &Filter,
) -> Result<Vec<OperationStatusRow>, ReadError> {
    let sql = |columns: &str| {
        format!(
            "SELECT {columns} FROM operation_status \
             WHERE ($1 IS NULL OR status = $1) AND ($2 IS NULL OR bot = $2) \
             AND ($3 IS NULL OR user_id = $3) \
             ORDER BY updated_at DESC, operation_id LIMIT $4"
        )
    };
    let limit = i64::from(filter.limit.max(1));
    let rows = match pool {
        ReadPool::Sqlite(pool) => {
            sqlx::query(sqlx::AssertSqlSafe(sql(COLUMNS)))
                .bind(&filter.status)
                .bind(&filter.bot)
                .bind(filter.user_id)
                .bind(limit)
                .try_map(|row: sqlx::sqlite::SqliteRow| decode_row(&row))
                .fetch_all(pool)
                .await?
        }
        ReadPool::Postgres(pool) => {
            sqlx::query(sqlx::AssertSqlSafe(sql(PG_COLUMNS)))
                .bind(&filter.status)
                .bind(&filter.bot)
                .bind(filter.user_id)
                .bind(limit)
                .try_map(|row: sqlx::postgres::PgRow| decode_row(&row))
                .fetch_all(pool)
                .await?
        }
    };
    Ok(rows)
}

/// One operation by id.
pub async fn get(
    pool: ReadPool<'_>,
    operation_id: &str,
) -> Result<Option<OperationStatusRow>, ReadError> {
    let sql =
        |columns: &str| format!("SELECT {columns} FROM operation_status WHERE operation_id = $1");
    let row = match pool {
        ReadPool::Sqlite(pool) => {
            sqlx::query(sqlx::AssertSqlSafe(sql(COLUMNS)))
                .bind(operation_id)
                .try_map(|row: sqlx::sqlite::SqliteRow| decode_row(&row))
                .fetch_optional(pool)
                .await?
        }
        ReadPool::Postgres(pool) => {
            sqlx::query(sqlx::AssertSqlSafe(sql(PG_COLUMNS)))
                .bind(operation_id)
                .try_map(|row: sqlx::postgres::PgRow| decode_row(&row))
                .fetch_optional(pool)
                .await?
        }
    };
    Ok(row)
}

/// Terminal operations are due only for their reply: left out for a worker that sends none,
/// with the predicate of the `operation_status_work_due` index, verbatim, so that the index
/// serves the query.
const NOT_TERMINAL: &str = "AND status NOT IN ('confirmed', 'failed', 'reconciled')";

fn without_terminal(replies: bool) -> &'static str {
    if replies { "" } else { NOT_TERMINAL }
}

/// Operations a worker should look at by `now`, earliest due first: received ones, retries that
/// are due, claims whose lease ran out, and terminal ones whose reply is due.
///
/// Only operations of `actions` are listed, so that an action this worker does not know never
/// blocks the head of the queue; terminal ones (whose reply is due) only with `replies`. The
/// rows are a hint: the worker decides on the operation's stream, and its append's version
/// check settles any race.
pub async fn due(
    pool: ReadPool<'_>,
    now: DateTime<Utc>,
    actions: &[String],
    replies: bool,
    limit: u32,
) -> Result<Vec<OperationStatusRow>, ReadError> {
    let limit = i64::from(limit.max(1));
    let rows = match pool {
        ReadPool::Sqlite(pool) => {
            let sql = format!(
                "SELECT {COLUMNS} FROM operation_status \
                 WHERE due_at IS NOT NULL AND due_at <= $1 \
                 AND action IN (SELECT value FROM json_each($2)) {} \
                 ORDER BY due_at LIMIT $3",
                without_terminal(replies)
            );
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(now.timestamp_micros())
                .bind(serde_json::Value::from(actions.to_vec()).to_string())
                .bind(limit)
                .try_map(|row: sqlx::sqlite::SqliteRow| decode_row(&row))
                .fetch_all(pool)
                .await?
        }
        ReadPool::Postgres(pool) => {
            let sql = format!(
                "SELECT {PG_COLUMNS} FROM operation_status \
                 WHERE due_at IS NOT NULL AND due_at <= $1 AND action = ANY($2) {} \
                 ORDER BY due_at LIMIT $3",
                without_terminal(replies)
            );
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(now)
                .bind(actions)
                .bind(limit)
                .try_map(|row: sqlx::postgres::PgRow| decode_row(&row))
                .fetch_all(pool)
                .await?
        }
    };
    Ok(rows)
}

/// When the next operation of `actions` becomes due, if any is waiting: how long a worker with
/// nothing to do may sleep.
pub async fn next_due(
    pool: ReadPool<'_>,
    actions: &[String],
    replies: bool,
) -> Result<Option<DateTime<Utc>>, ReadError> {
    let at = match pool {
        ReadPool::Sqlite(pool) => {
            let sql = format!(
                "SELECT min(due_at) FROM operation_status WHERE due_at IS NOT NULL \
                 AND action IN (SELECT value FROM json_each($1)) {}",
                without_terminal(replies)
            );
            let micros: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .bind(serde_json::Value::from(actions.to_vec()).to_string())
                .fetch_one(pool)
                .await?;
            micros.and_then(DateTime::from_timestamp_micros)
        }
        ReadPool::Postgres(pool) => {
            let sql = format!(
                "SELECT min(due_at) FROM operation_status WHERE due_at IS NOT NULL \
                 AND action = ANY($1) {}",
                without_terminal(replies)
            );
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .bind(actions)
                .fetch_one(pool)
                .await?
        }
    };
    Ok(at)
}
