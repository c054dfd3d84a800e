//! `user_operations`: every operation with what its user sees of it (state, external id, last
//! error), read per (bot, user) and per (bot, chat), most recently changed first: what the bot's
//! `/status` answers.
//!
//! Asynchronous, unlike `operation_status`: it is kept by the projection runner after the
//! appends, so a reader that needs what an update just did waits for the projection's
//! checkpoint to reach that update's position. Only the events that change what a user sees
//! (the status, the external id, the last error) touch a row; replies, refused requests and
//! late workers leave it alone.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use opledger_domain::operation::{OperationEvent, ReconcileOutcome, Status};
use opledger_domain::{DecodeError, DomainEvent};
use opledger_store::chain::Link;
use opledger_store::inline::ProjectionError;
use opledger_store::{EitherRow, ReadPool, TextList, Time, either};
use serde::Serialize;
use sqlx::{PgConnection, SqliteConnection};

use crate::projection::{Conn, Definition, Projection, in_category};
use crate::rows::{
    self, SQLITE_ROWS_PER_STATEMENT, kept_prepared, read_error, signed, sqlite_values,
};

pub use crate::rows::ReadError;

/// The projection's name and its active table's.
pub const NAME: &str = "user_operations";

/// The SQLite schema (`projections/user_operations/sqlite.sql`).
pub const SQLITE_SCHEMA: &str = include_str!("../../../projections/user_operations/sqlite.sql");
/// The PostgreSQL schema (`projections/user_operations/postgres.sql`).
pub const POSTGRES_SCHEMA: &str = include_str!("../../../projections/user_operations/postgres.sql");

/// The category of the streams this projection reads (`op-…`).
const CATEGORY: &str = "op";

/// The event types that change what a user sees of an operation; the others are skipped
/// without being decoded.
const VISIBLE: &[&str] = &[
    "Received",
    "Claimed",
    "ExternalCallSent",
    "Confirmed",
    "Failed",
    "RetryScheduled",
    "MarkedForReconciliation",
    "Reconciled",
];

/// The user operations projection.
#[derive(Clone, Copy, Debug, Default)]
pub struct UserOperations;

/// One operation as its user sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UserOperation {
    pub operation_id: String,
    pub stream_id: String,
    pub bot: String,
    pub user_id: Option<i64>,
    pub chat_id: Option<i64>,
    pub action: String,
    pub business_key: String,
    /// The domain's status name (`received`, `claimed`, `call_sent`, `retry_scheduled`,
    /// `needs_reconciliation`, `confirmed`, `failed`, `reconciled`).
    pub status: String,
    /// For a reconciled operation, what the person decided: `succeeded` or `failed`.
    pub resolution: Option<String>,
    /// Claims so far.
    pub attempts: u32,
    /// The service's id for what it did, once confirmed (or found by a person).
    pub external_id: Option<String>,
    /// Why the last attempt failed, was retried or needs a person.
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    /// When the status, external id or last error last changed.
    pub updated_at: DateTime<Utc>,
    /// The ledger position of the last event that changed the row.
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
        source: DecodeError,
    },
    #[error(
        "event {position} of `{stream}` is not the start of an operation, and user_operations has \
         no row for it; rebuild user_operations (`opledger projections rebuild user_operations`)"
    )]
    MissingRow { position: u64, stream: String },
}

impl UserOperation {
    /// Folds one event of the operation's stream into its row; `row` is `None` before the first
    /// event. Events that change nothing a user sees return the row as it was.
    pub fn apply(row: Option<Self>, link: &Link<'_>) -> Result<Self, FoldError> {
        let event = OperationEvent::from_stored(link.event_type, link.schema_version, link.payload)
            .map_err(|source| FoldError::Decode {
                position: link.position,
                stream: link.stream_id.to_owned(),
                source,
            })?;
        let at = link.recorded_at();
        let mut row = match (row, &event) {
            (_, OperationEvent::Received(e)) => {
                return Ok(UserOperation {
                    operation_id: e.operation_id.to_string(),
                    stream_id: link.stream_id.to_owned(),
                    bot: e.bot.clone(),
                    user_id: e.user_id,
                    chat_id: e.chat_id,
                    action: e.action.clone(),
                    business_key: e.business_key.clone(),
                    status: Status::Received.as_str().to_owned(),
                    resolution: None,
                    attempts: 0,
                    external_id: None,
                    last_error: None,
                    created_at: at,
                    updated_at: at,
                    last_position: link.position,
                });
            }
            (Some(row), _) => row,
            (None, _) => {
                return Err(FoldError::MissingRow {
                    position: link.position,
                    stream: link.stream_id.to_owned(),
                });
            }
        };
        let status = match &event {
            OperationEvent::Claimed(e) => {
                row.attempts = e.attempt;
                Status::Claimed
            }
            OperationEvent::ExternalCallSent(_) => Status::CallSent,
            OperationEvent::Confirmed(e) => {
                row.external_id.clone_from(&e.external_id);
                Status::Confirmed
            }
            OperationEvent::Failed(e) => {
                row.last_error = Some(e.reason.clone());
                Status::Failed
            }
            OperationEvent::RetryScheduled(e) => {
                row.last_error = Some(e.reason.clone());
                Status::RetryScheduled
            }
            OperationEvent::MarkedForReconciliation(e) => {
                row.last_error = Some(e.reason.clone());
                Status::NeedsReconciliation
            }
            OperationEvent::Reconciled(e) => match e.outcome {
                ReconcileOutcome::Retry => Status::RetryScheduled,
                outcome => {
                    row.resolution = Some(
                        if outcome == ReconcileOutcome::Succeeded {
                            "succeeded"
                        } else {
                            "failed"
                        }
                        .to_owned(),
                    );
                    row.external_id.clone_from(&e.external_id);
                    Status::Reconciled
                }
            },
            _ => return Ok(row),
        };
        row.status = status.as_str().to_owned();
        row.updated_at = at;
        row.last_position = link.position;
        Ok(row)
    }
}

impl Projection for UserOperations {
    fn definition(&self) -> Definition {
        Definition::new(NAME, 1, SQLITE_SCHEMA, POSTGRES_SCHEMA)
    }

    fn apply<'a>(
        &'a self,
        conn: Conn<'a>,
        table: &'a str,
        events: &'a [Link<'a>],
    ) -> BoxFuture<'a, Result<(), ProjectionError>> {
        Box::pin(async move {
            let batch = visible_events(events);
            if batch.is_empty() {
                return Ok(());
            }
            apply(conn, table, batch).await
        })
    }

    fn forget_stream<'a>(
        &'a self,
        conn: Conn<'a>,
        table: &'a str,
        stream: &'a str,
    ) -> Option<BoxFuture<'a, Result<(), ProjectionError>>> {
        Some(Box::pin(async move {
            let sql = format!("DELETE FROM \"{table}\" WHERE stream_id = $1");
            either!(conn, c => sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(stream)
                .execute(c)
                .await
                .map(drop)?);
            Ok(())
        }))
    }
}

/// A page's events that change what users see, grouped by stream in position order.
type Batch<'a> = Vec<(&'a str, Vec<&'a Link<'a>>)>;

fn visible_events<'a>(events: &'a [Link<'a>]) -> Batch<'a> {
    let mut batch: Batch<'a> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for link in events {
        if !in_category(link.stream_id, CATEGORY) || !VISIBLE.contains(&link.event_type) {
            continue;
        }
        let slot = *index.entry(link.stream_id).or_insert_with(|| {
            batch.push((link.stream_id, Vec::new()));
            batch.len() - 1
        });
        batch[slot].1.push(link);
    }
    batch
}

/// The streams whose stored rows a batch needs: those whose first event in it is not
/// `Received`.
fn needing_rows<'a>(batch: &Batch<'a>) -> Vec<&'a str> {
    batch
        .iter()
        .filter(|(_, links)| links.first().is_some_and(|l| l.event_type != "Received"))
        .map(|(stream, _)| *stream)
        .collect()
}

fn fold(
    batch: Batch<'_>,
    mut stored: HashMap<String, UserOperation>,
) -> Result<Vec<UserOperation>, FoldError> {
    batch
        .into_iter()
        .map(|(stream, links)| {
            let mut row = stored.remove(stream);
            for link in links {
                row = Some(UserOperation::apply(row, link)?);
            }
            Ok(row.expect("a stream in the batch has at least one event"))
        })
        .collect()
}

const COLUMNS: &str = "operation_id, stream_id, bot, user_id, chat_id, action, business_key, \
     status, resolution, attempts, external_id, last_error, created_at, updated_at, \
     last_position";

const UPDATED: &str = "status = excluded.status, resolution = excluded.resolution, \
     attempts = excluded.attempts, external_id = excluded.external_id, \
     last_error = excluded.last_error, updated_at = excluded.updated_at, \
     last_position = excluded.last_position";

fn decode_row(row: &impl EitherRow) -> Result<UserOperation, sqlx::Error> {
    Ok(UserOperation {
        operation_id: row.try_get(0)?,
        stream_id: row.try_get(1)?,
        bot: row.try_get(2)?,
        user_id: row.try_get(3)?,
        chat_id: row.try_get(4)?,
        action: row.try_get(5)?,
        business_key: row.try_get(6)?,
        status: row.try_get(7)?,
        resolution: row.try_get(8)?,
        attempts: rows::unsigned(i64::from(row.try_get::<i32>(9)?), "attempts")?,
        external_id: row.try_get(10)?,
        last_error: row.try_get(11)?,
        created_at: row.try_get::<Time>(12)?.0,
        updated_at: row.try_get::<Time>(13)?.0,
        last_position: rows::unsigned(row.try_get::<i64>(14)?, "last_position")?,
    })
}

/// Reads the rows the batch continues, folds, and writes the changed rows back with each
/// backend's bulk upsert.
async fn apply(mut conn: Conn<'_>, table: &str, batch: Batch<'_>) -> Result<(), ProjectionError> {
    let needed = needing_rows(&batch);
    let mut stored = HashMap::new();
    if !needed.is_empty() {
        let streams = conn.backend().in_list("stream_id", "$1");
        let sql = format!("SELECT {COLUMNS} FROM \"{table}\" WHERE {streams}");
        let rows = either!(conn.reborrow(), c => sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(TextList(&needed))
            .try_map(|row| decode_row(&row))
            .fetch_all(c)
            .await?);
        for row in rows {
            stored.insert(row.stream_id.clone(), row);
        }
    }
    let rows = fold(batch, stored)?;
    match conn {
        Conn::Sqlite(c) => upsert_sqlite(c, table, &rows).await?,
        Conn::Postgres(c) => upsert_postgres(c, table, &rows).await?,
    }
    Ok(())
}

/// Bound multi-row `VALUES` (`rows::sqlite_values`): no JSON to build in Rust and to parse
/// again, column by column, in SQLite.
async fn upsert_sqlite(
    conn: &mut SqliteConnection,
    table: &str,
    rows: &[UserOperation],
) -> Result<(), sqlx::Error> {
    for chunk in rows.chunks(SQLITE_ROWS_PER_STATEMENT) {
        let head = format!("INSERT INTO \"{table}\" ({COLUMNS})");
        let sql = format!(
            "{} ON CONFLICT (stream_id) DO UPDATE SET {UPDATED}",
            sqlite_values(&head, 15, chunk.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for r in chunk {
            query = query
                .bind(r.operation_id.as_str())
                .bind(r.stream_id.as_str())
                .bind(r.bot.as_str())
                .bind(r.user_id)
                .bind(r.chat_id)
                .bind(r.action.as_str())
                .bind(r.business_key.as_str())
                .bind(r.status.as_str())
                .bind(r.resolution.as_deref())
                .bind(r.attempts)
                .bind(r.external_id.as_deref())
                .bind(r.last_error.as_deref())
                .bind(r.created_at.timestamp_micros())
                .bind(r.updated_at.timestamp_micros())
                .bind(signed(r.last_position));
        }
        query
            .persistent(kept_prepared(chunk.len()))
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

async fn upsert_postgres(
    conn: &mut PgConnection,
    table: &str,
    rows: &[UserOperation],
) -> Result<(), sqlx::Error> {
    let text = |f: fn(&UserOperation) -> Option<String>| rows.iter().map(f).collect::<Vec<_>>();
    let sql = format!(
        "INSERT INTO \"{table}\" ({COLUMNS}) SELECT * FROM UNNEST($1::text[], $2::text[], \
         $3::text[], $4::bigint[], $5::bigint[], $6::text[], $7::text[], $8::text[], $9::text[], \
         $10::integer[], $11::text[], $12::text[], $13::timestamptz[], $14::timestamptz[], \
         $15::bigint[]) ON CONFLICT (stream_id) DO UPDATE SET {UPDATED}"
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(text(|r| Some(r.operation_id.clone())))
        .bind(text(|r| Some(r.stream_id.clone())))
        .bind(text(|r| Some(r.bot.clone())))
        .bind(rows.iter().map(|r| r.user_id).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.chat_id).collect::<Vec<_>>())
        .bind(text(|r| Some(r.action.clone())))
        .bind(text(|r| Some(r.business_key.clone())))
        .bind(text(|r| Some(r.status.clone())))
        .bind(text(|r| r.resolution.clone()))
        .bind(
            rows.iter()
                .map(|r| i32::try_from(r.attempts).unwrap_or(i32::MAX))
                .collect::<Vec<_>>(),
        )
        .bind(text(|r| r.external_id.clone()))
        .bind(text(|r| r.last_error.clone()))
        .bind(rows.iter().map(|r| r.created_at).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.updated_at).collect::<Vec<_>>())
        .bind(
            rows.iter()
                .map(|r| signed(r.last_position))
                .collect::<Vec<_>>(),
        )
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// One operation's row, found by its stream id through the inline `operation_status`
/// ([`crate::operation_status::NAME`]), which both backends' readers see beside this table.
const OPERATION_CONDITION: &str =
    "stream_id = (SELECT stream_id FROM operation_status WHERE operation_id = $1)";

/// Which rows to read: a (bot, user) or (bot, chat) pair, or one operation.
enum Filter<'a> {
    User(&'a str, i64),
    Chat(&'a str, i64),
    Operation(&'a str),
}

impl Filter<'_> {
    fn condition(&self) -> &'static str {
        match self {
            Filter::User(..) => "bot = $1 AND user_id = $2",
            Filter::Chat(..) => "bot = $1 AND chat_id = $2",
            // Through the inline operation_status (its unique index of operation ids) to the
            // stream id this table is keyed by: no index of random operation ids here.
            Filter::Operation(_) => OPERATION_CONDITION,
        }
    }

    /// The number of the `LIMIT` parameter.
    fn limit_parameter(&self) -> u8 {
        match self {
            Filter::User(..) | Filter::Chat(..) => 3,
            Filter::Operation(_) => 2,
        }
    }
}

macro_rules! bind_filter {
    ($query:expr, $filter:expr) => {
        match $filter {
            Filter::User(bot, id) | Filter::Chat(bot, id) => $query.bind(bot.to_owned()).bind(id),
            Filter::Operation(id) => $query.bind(id.to_owned()),
        }
    };
}

async fn select(
    pool: ReadPool<'_>,
    filter: Filter<'_>,
    limit: u32,
) -> Result<Vec<UserOperation>, ReadError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM \"{NAME}\" WHERE {} \
         ORDER BY updated_at DESC, operation_id LIMIT ${}",
        filter.condition(),
        filter.limit_parameter()
    );
    let limit = rows::limit(limit);
    either!(pool, p => bind_filter!(sqlx::query(sqlx::AssertSqlSafe(sql)), filter)
        .bind(limit)
        .try_map(|row| decode_row(&row))
        .fetch_all(p)
        .await)
    .map_err(read_error(NAME))
}

/// A user's operations with one bot, most recently changed first, at most `limit`.
pub async fn recent(
    pool: ReadPool<'_>,
    bot: &str,
    user_id: i64,
    limit: u32,
) -> Result<Vec<UserOperation>, ReadError> {
    select(pool, Filter::User(bot, user_id), limit).await
}

/// A chat's operations with one bot, most recently changed first, at most `limit`.
pub async fn recent_in_chat(
    pool: ReadPool<'_>,
    bot: &str,
    chat_id: i64,
    limit: u32,
) -> Result<Vec<UserOperation>, ReadError> {
    select(pool, Filter::Chat(bot, chat_id), limit).await
}

/// One operation by id.
pub async fn get(
    pool: ReadPool<'_>,
    operation_id: &str,
) -> Result<Option<UserOperation>, ReadError> {
    Ok(select(pool, Filter::Operation(operation_id), 1)
        .await?
        .into_iter()
        .next())
}
