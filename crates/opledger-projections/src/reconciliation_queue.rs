//! `reconciliation_queue`: the operations waiting for a person. An operation enters when it is
//! `MarkedForReconciliation` (with the reason, the claims used and when) and leaves with the
//! next event that moves it (`Reconciled`, or any later outcome); refused requests and late
//! workers recorded meanwhile leave it waiting. Listed oldest first; the age is computed when
//! read, so the rows never change with time.
//!
//! A mark names neither the action nor the user, and it comes long after the operation's
//! `Received`, so what every `Received` said is kept in `{table}_ops` and copied into the queue
//! by the statement that adds a row.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use opledger_domain::DomainEvent;
use opledger_domain::operation::OperationEvent;
use opledger_store::chain::Link;
use opledger_store::inline::ProjectionError;
use opledger_store::{EitherRow, ReadPool, TextList, Time, either};
use serde::Serialize;
use sqlx::{PgConnection, SqliteConnection};

use crate::projection::{Conn, Definition, Projection, in_category};
use crate::rows::{self, read_error, signed};

pub use crate::rows::ReadError;

/// The projection's name and its active table's.
pub const NAME: &str = "reconciliation_queue";

/// The SQLite schema (`projections/reconciliation_queue/sqlite.sql`).
pub const SQLITE_SCHEMA: &str =
    include_str!("../../../projections/reconciliation_queue/sqlite.sql");
/// The PostgreSQL schema (`projections/reconciliation_queue/postgres.sql`).
pub const POSTGRES_SCHEMA: &str =
    include_str!("../../../projections/reconciliation_queue/postgres.sql");

/// The events after which an operation no longer waits for a person.
const LEAVES: &[&str] = &[
    "Reconciled",
    "Confirmed",
    "Failed",
    "RetryScheduled",
    "Claimed",
    "ExternalCallSent",
];

/// The reconciliation queue projection.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReconciliationQueue;

/// An operation waiting for a person.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReconciliationItem {
    pub operation_id: String,
    pub stream_id: String,
    pub action: String,
    pub business_key: String,
    pub bot: String,
    pub chat_id: Option<i64>,
    pub user_id: Option<i64>,
    /// Why the outcome is unknown, as the worker recorded it.
    pub reason: String,
    /// The claim under which the call was sent.
    pub attempts: u32,
    /// When it was marked for reconciliation.
    pub marked_at: DateTime<Utc>,
}

impl ReconciliationItem {
    /// How long it has waited at `now`, in seconds (never negative).
    pub fn age_secs(&self, now: DateTime<Utc>) -> f64 {
        ((now - self.marked_at)
            .num_microseconds()
            .unwrap_or(i64::MAX) as f64
            / 1e6)
            .max(0.0)
    }
}

/// Why a page could not be folded into the queue.
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
        "{missing} operation(s) marked for reconciliation have no Received in \
         reconciliation_queue; rebuild it (`opledger projections rebuild reconciliation_queue`)"
    )]
    MissingOperation { missing: u64 },
}

/// What a `Received` said, kept in `{table}_ops`.
#[derive(Debug)]
struct Started {
    stream_id: String,
    operation_id: String,
    action: String,
    business_key: String,
    bot: String,
    chat_id: Option<i64>,
    user_id: Option<i64>,
}

/// A mark that is still waiting at the end of a page.
#[derive(Debug)]
struct Marked {
    reason: String,
    attempts: u32,
    marked_at: DateTime<Utc>,
    position: u64,
}

/// What a page does to the queue.
#[derive(Debug, Default)]
struct Changes {
    started: Vec<Started>,
    /// Streams that wait at the end of the page, with their mark.
    waiting: Vec<(String, Marked)>,
    /// Streams that no longer wait (or never did in this page but may have before).
    left: Vec<String>,
}

fn changes(events: &[Link<'_>]) -> Result<Changes, FoldError> {
    // Per stream, its state at the end of the page: Some(mark) waiting, None left.
    let mut last: HashMap<&str, Option<Marked>> = HashMap::new();
    let mut order: Vec<&str> = Vec::new();
    let mut started = Vec::new();
    let decode = |link: &Link<'_>| {
        OperationEvent::from_stored(link.event_type, link.schema_version, link.payload).map_err(
            |source| FoldError::Decode {
                position: link.position,
                stream: link.stream_id.to_owned(),
                source,
            },
        )
    };
    for link in events {
        if !in_category(link.stream_id, "op") {
            continue;
        }
        let state = match link.event_type {
            "Received" => {
                if let OperationEvent::Received(e) = decode(link)? {
                    started.push(Started {
                        stream_id: link.stream_id.to_owned(),
                        operation_id: e.operation_id.to_string(),
                        action: e.action,
                        business_key: e.business_key,
                        bot: e.bot,
                        chat_id: e.chat_id,
                        user_id: e.user_id,
                    });
                }
                continue;
            }
            "MarkedForReconciliation" => match decode(link)? {
                OperationEvent::MarkedForReconciliation(e) => Some(Marked {
                    reason: e.reason,
                    attempts: e.attempt,
                    marked_at: link.recorded_at(),
                    position: link.position,
                }),
                _ => continue,
            },
            other if LEAVES.contains(&other) => None,
            _ => continue,
        };
        if last.insert(link.stream_id, state).is_none() {
            order.push(link.stream_id);
        }
    }
    let mut changes = Changes {
        started,
        ..Changes::default()
    };
    for stream in order {
        match last.remove(stream).flatten() {
            Some(mark) => changes.waiting.push((stream.to_owned(), mark)),
            None => changes.left.push(stream.to_owned()),
        }
    }
    Ok(changes)
}

impl Projection for ReconciliationQueue {
    fn definition(&self) -> Definition {
        Definition::new(NAME, 1, SQLITE_SCHEMA, POSTGRES_SCHEMA).with_tables(&["", "_ops"])
    }

    fn apply<'a>(
        &'a self,
        conn: Conn<'a>,
        table: &'a str,
        events: &'a [Link<'a>],
    ) -> BoxFuture<'a, Result<(), ProjectionError>> {
        Box::pin(async move {
            let changes = changes(events)?;
            let added = apply(conn, table, &changes).await?;
            let expected = changes.waiting.len() as u64;
            if added < expected {
                return Err(FoldError::MissingOperation {
                    missing: expected - added,
                }
                .into());
            }
            Ok(())
        })
    }

    fn forget_stream<'a>(
        &'a self,
        conn: Conn<'a>,
        table: &'a str,
        stream: &'a str,
    ) -> Option<BoxFuture<'a, Result<(), ProjectionError>>> {
        Some(Box::pin(async move {
            let statements = [
                format!("DELETE FROM \"{table}\" WHERE stream_id = $1"),
                format!("DELETE FROM \"{table}_ops\" WHERE stream_id = $1"),
            ];
            either!(conn, c => {
                for sql in statements {
                    sqlx::query(sqlx::AssertSqlSafe(sql))
                        .bind(stream)
                        .execute(&mut *c)
                        .await?;
                }
            });
            Ok(())
        }))
    }
}

const OPS_COLUMNS: &str = "stream_id, operation_id, action, business_key, bot, chat_id, user_id";
const OPS_UPDATED: &str = "operation_id = excluded.operation_id, action = excluded.action, \
     business_key = excluded.business_key, bot = excluded.bot, chat_id = excluded.chat_id, \
     user_id = excluded.user_id";
const COLUMNS: &str = "stream_id, operation_id, action, business_key, bot, chat_id, user_id, \
     reason, attempts, marked_at, position";
const UPDATED: &str = "reason = excluded.reason, attempts = excluded.attempts, \
     marked_at = excluded.marked_at, position = excluded.position";

/// Applies a page's changes; returns how many queue rows it added or updated. The rows that
/// leave go in one statement for both backends; the rows that come are upserted in bulk each
/// backend's own way.
async fn apply(mut conn: Conn<'_>, table: &str, changes: &Changes) -> Result<u64, sqlx::Error> {
    if !changes.started.is_empty() {
        match conn.reborrow() {
            Conn::Sqlite(c) => add_started_sqlite(c, table, &changes.started).await?,
            Conn::Postgres(c) => add_started_postgres(c, table, &changes.started).await?,
        }
    }
    if !changes.left.is_empty() {
        let streams = conn.backend().in_list("stream_id", "$1");
        let sql = format!("DELETE FROM \"{table}\" WHERE {streams}");
        either!(conn.reborrow(), c => sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(TextList(&changes.left))
            .execute(c)
            .await
            .map(drop)?);
    }
    if changes.waiting.is_empty() {
        return Ok(0);
    }
    match conn {
        Conn::Sqlite(c) => add_waiting_sqlite(c, table, &changes.waiting).await,
        Conn::Postgres(c) => add_waiting_postgres(c, table, &changes.waiting).await,
    }
}

async fn add_started_sqlite(
    conn: &mut SqliteConnection,
    table: &str,
    started: &[Started],
) -> Result<(), sqlx::Error> {
    let rows: Vec<serde_json::Value> = started
        .iter()
        .map(|s| {
            serde_json::json!([
                s.stream_id,
                s.operation_id,
                s.action,
                s.business_key,
                s.bot,
                s.chat_id,
                s.user_id
            ])
        })
        .collect();
    let sql = format!(
        "INSERT INTO \"{table}_ops\" ({OPS_COLUMNS}) SELECT value ->> 0, value ->> 1, \
         value ->> 2, value ->> 3, value ->> 4, value ->> 5, value ->> 6 FROM jsonb_each($1) \
         WHERE true ON CONFLICT (stream_id) DO UPDATE SET {OPS_UPDATED}"
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(serde_json::Value::Array(rows).to_string())
        .execute(&mut *conn)
        .await?;
    Ok(())
}

async fn add_started_postgres(
    conn: &mut PgConnection,
    table: &str,
    started: &[Started],
) -> Result<(), sqlx::Error> {
    let text = |f: fn(&Started) -> String| started.iter().map(f).collect::<Vec<_>>();
    let sql = format!(
        "INSERT INTO \"{table}_ops\" ({OPS_COLUMNS}) SELECT * FROM UNNEST($1::text[], \
         $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::bigint[]) \
         ON CONFLICT (stream_id) DO UPDATE SET {OPS_UPDATED}"
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(text(|s| s.stream_id.clone()))
        .bind(text(|s| s.operation_id.clone()))
        .bind(text(|s| s.action.clone()))
        .bind(text(|s| s.business_key.clone()))
        .bind(text(|s| s.bot.clone()))
        .bind(started.iter().map(|s| s.chat_id).collect::<Vec<_>>())
        .bind(started.iter().map(|s| s.user_id).collect::<Vec<_>>())
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Adds or updates the queue rows of the streams that wait; returns how many it wrote.
async fn add_waiting_sqlite(
    conn: &mut SqliteConnection,
    table: &str,
    waiting: &[(String, Marked)],
) -> Result<u64, sqlx::Error> {
    let rows: Vec<serde_json::Value> = waiting
        .iter()
        .map(|(stream, m)| {
            serde_json::json!([
                stream,
                m.reason,
                m.attempts,
                m.marked_at.timestamp_micros(),
                m.position
            ])
        })
        .collect();
    let sql = format!(
        "INSERT INTO \"{table}\" ({COLUMNS}) SELECT o.stream_id, o.operation_id, o.action, \
         o.business_key, o.bot, o.chat_id, o.user_id, r.value ->> 1, r.value ->> 2, \
         r.value ->> 3, r.value ->> 4 FROM jsonb_each($1) AS r \
         JOIN \"{table}_ops\" AS o ON o.stream_id = r.value ->> 0 WHERE true \
         ON CONFLICT (stream_id) DO UPDATE SET {UPDATED}"
    );
    let done = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(serde_json::Value::Array(rows).to_string())
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected())
}

/// Adds or updates the queue rows of the streams that wait; returns how many it wrote.
async fn add_waiting_postgres(
    conn: &mut PgConnection,
    table: &str,
    waiting: &[(String, Marked)],
) -> Result<u64, sqlx::Error> {
    let sql = format!(
        "INSERT INTO \"{table}\" ({COLUMNS}) SELECT o.stream_id, o.operation_id, o.action, \
         o.business_key, o.bot, o.chat_id, o.user_id, r.reason, r.attempts, r.marked_at, \
         r.position FROM UNNEST($1::text[], $2::text[], $3::integer[], $4::timestamptz[], \
         $5::bigint[]) AS r (stream_id, reason, attempts, marked_at, position) \
         JOIN \"{table}_ops\" AS o ON o.stream_id = r.stream_id \
         ON CONFLICT (stream_id) DO UPDATE SET {UPDATED}"
    );
    let done = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(waiting.iter().map(|(s, _)| s.clone()).collect::<Vec<_>>())
        .bind(
            waiting
                .iter()
                .map(|(_, m)| m.reason.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            waiting
                .iter()
                .map(|(_, m)| i32::try_from(m.attempts).unwrap_or(i32::MAX))
                .collect::<Vec<_>>(),
        )
        .bind(waiting.iter().map(|(_, m)| m.marked_at).collect::<Vec<_>>())
        .bind(
            waiting
                .iter()
                .map(|(_, m)| signed(m.position))
                .collect::<Vec<_>>(),
        )
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected())
}

fn decode_item(row: &impl EitherRow) -> Result<ReconciliationItem, sqlx::Error> {
    Ok(ReconciliationItem {
        stream_id: row.try_get(0)?,
        operation_id: row.try_get(1)?,
        action: row.try_get(2)?,
        business_key: row.try_get(3)?,
        bot: row.try_get(4)?,
        chat_id: row.try_get(5)?,
        user_id: row.try_get(6)?,
        reason: row.try_get(7)?,
        attempts: rows::unsigned(i64::from(row.try_get::<i32>(8)?), "attempts")?,
        marked_at: row.try_get::<Time>(9)?.0,
    })
}

/// The operations waiting for a person, oldest mark first, at most `limit`.
pub async fn list(pool: ReadPool<'_>, limit: u32) -> Result<Vec<ReconciliationItem>, ReadError> {
    let sql = format!(
        "SELECT stream_id, operation_id, action, business_key, bot, chat_id, user_id, \
         reason, attempts, marked_at FROM \"{NAME}\" \
         ORDER BY marked_at, operation_id LIMIT $1"
    );
    let limit = rows::limit(limit);
    either!(pool, p => sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(limit)
        .try_map(|row| decode_item(&row))
        .fetch_all(p)
        .await)
    .map_err(read_error(NAME))
}
