//! `forward_queue`: the updates a gateway still owes a bot's own webhook (ADR 0012), kept inline
//! so that the forwarder reads its own writes: a row appears with an `UpdateReceived` that is to
//! be forwarded, follows its attempts, and leaves when the bot acknowledged the update or it was
//! given up — or, when the bot's answer held a Bot API call, once that call finished.
//!
//! Each lane (a chat, else a user, else the update alone) goes one update at a time in ledger
//! order: [`due`] lists only each lane's first row, and only when it may be tried now.

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use opledger_domain::delivery::DeliveryEvent;
use opledger_domain::{Delivery, DomainEvent};
use opledger_store::chain::Link;
use opledger_store::inline::{InlineProjection, InlineWriter, Planned, ProjectionError};
use opledger_store::{EitherRow, ReadPool, Time, either};
use serde::Serialize;
use sqlx::PgConnection;

use crate::projection::{Backend, Conn, Definition, Projection, in_category};

/// The SQLite schema (`projections/forward_queue/sqlite.sql`).
pub const SQLITE_SCHEMA: &str = include_str!("../../../projections/forward_queue/sqlite.sql");
/// The PostgreSQL schema (`projections/forward_queue/postgres.sql`).
pub const POSTGRES_SCHEMA: &str = include_str!("../../../projections/forward_queue/postgres.sql");

/// The projection's name, also its live table's.
pub const NAME: &str = "forward_queue";

const CATEGORY: &str = <Delivery as opledger_domain::Aggregate>::STREAM_CATEGORY;

/// The read model.
#[derive(Debug, Clone, Copy, Default)]
pub struct ForwardQueue;

/// One update still owed to a bot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ForwardRow {
    pub stream_id: String,
    pub bot: String,
    pub update_id: i64,
    pub epoch: u32,
    /// `chat:<id>`, `user:<id>` or `update:<id>`.
    pub lane: String,
    /// The ledger position of its `UpdateReceived`: the order within a lane.
    pub position: u64,
    pub received_at: DateTime<Utc>,
    /// `waiting`, `in_flight`, `failed` or `answering`.
    pub state: String,
    /// Attempts started.
    pub attempt: u32,
    pub lease_until: Option<DateTime<Utc>>,
    pub retry_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    /// Failed attempts.
    pub failures: u32,
}

/// Why the queue could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read forward_queue: {0}")]
pub struct ReadError(#[from] sqlx::Error);

/// The lane of an update: its chat, else its user, else itself.
pub fn lane(chat_id: Option<i64>, user_id: Option<i64>, update_id: i64) -> String {
    match (chat_id, user_id) {
        (Some(chat), _) => format!("chat:{chat}"),
        (None, Some(user)) => format!("user:{user}"),
        (None, None) => format!("update:{update_id}"),
    }
}

/// Whether an event may change the queue, judged without decoding it: one of a delivery stream,
/// and an `UpdateReceived` only if it is to be forwarded (its payload then says
/// `"forward":true`, serde's compact form).
fn concerns(link: &Link<'_>) -> bool {
    if !in_category(link.stream_id, CATEGORY) {
        return false;
    }
    match link.event_type {
        "UpdateReceived" => link
            .payload
            .windows(FORWARD_FLAG.len())
            .any(|w| w == FORWARD_FLAG),
        "ForwardStarted" | "ForwardFailed" | "UpdateForwarded" | "ForwardGivenUp"
        | "AnswerCallStarted" | "AnswerCallSent" | "AnswerCallFailed" => true,
        _ => false,
    }
}

const FORWARD_FLAG: &[u8] = b"\"forward\":true";

fn statement(template: &str, table: &str) -> String {
    template.replace("{table}", &crate::db::quoted(table))
}

const ENQUEUE: &str = "\
    INSERT INTO {table} (stream_id, bot, update_id, epoch, lane, position, received_at, state, \
                         attempt, failures) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, 'waiting', 0, 0) \
    ON CONFLICT (stream_id) DO UPDATE SET bot = excluded.bot, update_id = excluded.update_id, \
        epoch = excluded.epoch, lane = excluded.lane, position = excluded.position, \
        received_at = excluded.received_at, state = 'waiting', attempt = 0, lease_until = NULL, \
        retry_at = NULL, last_error = NULL, failures = 0";
const STARTED: &str = "\
    UPDATE {table} SET state = 'in_flight', attempt = $2, lease_until = $3, retry_at = NULL \
    WHERE stream_id = $1 AND epoch = $4";
const FAILED: &str = "\
    UPDATE {table} SET \
        state = CASE WHEN attempt = $2 THEN 'failed' ELSE state END, \
        lease_until = CASE WHEN attempt = $2 THEN NULL ELSE lease_until END, \
        retry_at = $3, last_error = $4, failures = failures + 1 \
    WHERE stream_id = $1 AND epoch = $5";
const ACKNOWLEDGED: &str = "\
    UPDATE {table} SET state = 'acknowledged', lease_until = NULL WHERE stream_id = $1 AND epoch = $2";
const ANSWERING: &str = "\
    UPDATE {table} SET state = 'answering', lease_until = $2 WHERE stream_id = $1 AND epoch = $3";
const LEAVE: &str = "DELETE FROM {table} WHERE stream_id = $1 AND epoch = $2";
const LEAVE_ACKNOWLEDGED: &str = "DELETE FROM {table} WHERE state = 'acknowledged'";

fn decode(link: &Link<'_>) -> Result<DeliveryEvent, ProjectionError> {
    DeliveryEvent::from_stored(link.event_type, link.schema_version, link.payload)
        .map_err(|e| Box::new(e) as ProjectionError)
}

/// Folds a batch into `table`, one statement per event that concerns the queue.
async fn apply(
    mut conn: Conn<'_>,
    table: &str,
    events: &[Link<'_>],
) -> Result<(), ProjectionError> {
    let mut acknowledged = false;
    for link in events {
        if !concerns(link) {
            continue;
        }
        let stream = link.stream_id;
        match decode(link)? {
            DeliveryEvent::UpdateReceived(e) => {
                let sql = statement(ENQUEUE, table);
                either!(conn.reborrow(), c => sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(stream)
                    .bind(&e.bot)
                    .bind(e.update_id)
                    .bind(i64::from(e.epoch))
                    .bind(lane(e.chat_id, e.user_id, e.update_id))
                    .bind(i64::try_from(link.position).unwrap_or(i64::MAX))
                    .bind(Time(e.received_at))
                    .execute(c)
                    .await
                    .map(drop)?);
            }
            DeliveryEvent::ForwardStarted(e) => {
                let sql = statement(STARTED, table);
                either!(conn.reborrow(), c => sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(stream)
                    .bind(i64::from(e.attempt))
                    .bind(Time(e.lease_until))
                    .bind(i64::from(e.epoch))
                    .execute(c)
                    .await
                    .map(drop)?);
            }
            DeliveryEvent::ForwardFailed(e) => {
                let sql = statement(FAILED, table);
                either!(conn.reborrow(), c => sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(stream)
                    .bind(i64::from(e.attempt))
                    .bind(Time(e.retry_at))
                    .bind(&e.error)
                    .bind(i64::from(e.epoch))
                    .execute(c)
                    .await
                    .map(drop)?);
            }
            DeliveryEvent::UpdateForwarded(e) => {
                acknowledged = true;
                let sql = statement(ACKNOWLEDGED, table);
                either!(conn.reborrow(), c => sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(stream)
                    .bind(i64::from(e.epoch))
                    .execute(c)
                    .await
                    .map(drop)?);
            }
            DeliveryEvent::AnswerCallStarted(e) => {
                let sql = statement(ANSWERING, table);
                either!(conn.reborrow(), c => sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(stream)
                    .bind(Time(e.lease_until))
                    .bind(i64::from(e.epoch))
                    .execute(c)
                    .await
                    .map(drop)?);
            }
            DeliveryEvent::ForwardGivenUp(e) => {
                leave(conn.reborrow(), table, stream, e.epoch).await?
            }
            DeliveryEvent::AnswerCallSent(e) => {
                leave(conn.reborrow(), table, stream, e.epoch).await?
            }
            DeliveryEvent::AnswerCallFailed(e) => {
                leave(conn.reborrow(), table, stream, e.epoch).await?;
            }
            _ => {}
        }
    }
    if acknowledged {
        // Acknowledged rows whose answer holds no call leave at the end of the batch (a call
        // started in the same append made its row `answering` meanwhile).
        let sql = statement(LEAVE_ACKNOWLEDGED, table);
        either!(conn, c => sqlx::query(sqlx::AssertSqlSafe(sql)).execute(c).await.map(drop)?);
    }
    Ok(())
}

async fn leave(conn: Conn<'_>, table: &str, stream: &str, epoch: u32) -> Result<(), sqlx::Error> {
    let sql = statement(LEAVE, table);
    either!(conn, c => sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(stream)
        .bind(i64::from(epoch))
        .execute(c)
        .await
        .map(drop))?;
    Ok(())
}

fn live_schema(backend: Backend) -> String {
    let (tables, indexes) = ForwardQueue.schema().render(backend, NAME, NAME);
    format!("{tables}\n{indexes}")
}

impl InlineProjection for ForwardQueue {
    fn name(&self) -> &'static str {
        NAME
    }

    fn install<'a>(&'a self, connection: Conn<'a>) -> BoxFuture<'a, Result<(), ProjectionError>> {
        Box::pin(crate::db::install_live(connection, NAME, live_schema))
    }

    fn apply<'a>(
        &'a self,
        connection: Conn<'a>,
        events: &'a [Link<'a>],
    ) -> BoxFuture<'a, Result<(), ProjectionError>> {
        Box::pin(apply(connection, NAME, events))
    }

    fn writer(&self) -> Option<Box<dyn InlineWriter>> {
        Some(Box::new(Planner))
    }
}

/// A PostgreSQL writer's planner for the live table: a batch with nothing forwarded changes
/// nothing here; one with forwarded updates takes the transaction (its statements read rows).
#[derive(Debug)]
struct Planner;

impl InlineWriter for Planner {
    fn plan<'a>(
        &'a mut self,
        _connection: &'a mut PgConnection,
        events: &'a [Link<'a>],
    ) -> BoxFuture<'a, Result<Planned, ProjectionError>> {
        let forwarded = events.iter().any(concerns);
        Box::pin(std::future::ready(Ok(if forwarded {
            Planned::Unknown
        } else {
            Planned::Nothing
        })))
    }

    fn committed(&mut self) {}

    fn discarded(&mut self) {}
}

impl Projection for ForwardQueue {
    fn definition(&self) -> Definition {
        Definition::new(NAME, 1, SQLITE_SCHEMA, POSTGRES_SCHEMA).inline()
    }

    fn apply<'a>(
        &'a self,
        conn: Conn<'a>,
        table: &'a str,
        events: &'a [Link<'a>],
    ) -> BoxFuture<'a, Result<(), ProjectionError>> {
        Box::pin(apply(conn, table, events))
    }
}

const COLUMNS: &str = "stream_id, bot, update_id, epoch, lane, position, received_at, state, \
    attempt, lease_until, retry_at, last_error, failures";

fn decode_row(row: &impl EitherRow) -> Result<ForwardRow, sqlx::Error> {
    let number = |value: i64, column: &'static str| {
        u32::try_from(value).map_err(|e| sqlx::Error::ColumnDecode {
            index: column.into(),
            source: Box::new(e),
        })
    };
    Ok(ForwardRow {
        stream_id: row.try_get(0)?,
        bot: row.try_get(1)?,
        update_id: row.try_get(2)?,
        epoch: number(row.try_get::<i32>(3)?.into(), "epoch")?,
        lane: row.try_get(4)?,
        position: u64::try_from(row.try_get::<i64>(5)?).unwrap_or(0),
        received_at: row.try_get::<Time>(6)?.0,
        state: row.try_get(7)?,
        attempt: number(row.try_get::<i32>(8)?.into(), "attempt")?,
        lease_until: row.try_get::<Option<Time>>(9)?.map(|t| t.0),
        retry_at: row.try_get::<Option<Time>>(10)?.map(|t| t.0),
        last_error: row.try_get(11)?,
        failures: number(row.try_get::<i32>(12)?.into(), "failures")?,
    })
}

/// Each lane's first row, when it may be tried at `now` (waiting, failed and due, or in flight
/// with its lease run out), oldest first, at most `limit`; the bots are `bots` (those this
/// forwarder serves).
pub async fn due(
    pool: ReadPool<'_>,
    now: DateTime<Utc>,
    bots: &[String],
    limit: u32,
) -> Result<Vec<ForwardRow>, ReadError> {
    let bots_in = pool.backend().in_list("q.bot", "$3");
    let sql = format!(
        "SELECT {COLUMNS} FROM {NAME} q \
         WHERE q.state <> 'answering' AND {bots_in} \
           AND q.position = (SELECT MIN(h.position) FROM {NAME} h \
                             WHERE h.bot = q.bot AND h.lane = q.lane AND h.state <> 'answering') \
           AND (q.state = 'waiting' OR (q.state = 'failed' AND q.retry_at <= $1) \
                OR (q.state = 'in_flight' AND q.lease_until <= $1)) \
         ORDER BY q.position LIMIT $2"
    );
    let rows = either!(pool, p => sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(Time(now))
        .bind(i64::from(limit))
        .bind(opledger_store::TextList(bots))
        .try_map(|row| decode_row(&row))
        .fetch_all(p)
        .await?);
    Ok(rows)
}

/// Rows whose answer's call was started and whose lease ran out by `now` without an outcome:
/// their caller died.
pub async fn stale_answers(
    pool: ReadPool<'_>,
    now: DateTime<Utc>,
    limit: u32,
) -> Result<Vec<ForwardRow>, ReadError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM {NAME} WHERE state = 'answering' AND lease_until <= $1 \
         ORDER BY position LIMIT $2"
    );
    let rows = either!(pool, p => sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(Time(now))
        .bind(i64::from(limit))
        .try_map(|row| decode_row(&row))
        .fetch_all(p)
        .await?);
    Ok(rows)
}

/// One row by its delivery stream.
pub async fn get(pool: ReadPool<'_>, stream_id: &str) -> Result<Option<ForwardRow>, ReadError> {
    let sql = format!("SELECT {COLUMNS} FROM {NAME} WHERE stream_id = $1");
    let row = either!(pool, p => sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(stream_id)
        .try_map(|row| decode_row(&row))
        .fetch_optional(p)
        .await?);
    Ok(row)
}

/// What `/metrics` shows of one bot's queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct QueueStats {
    pub bot: String,
    /// Updates not yet acknowledged (nor given up).
    pub waiting: u64,
    /// Of those, the ones with at least one failed attempt.
    pub failing: u64,
    /// When the oldest of them was received.
    pub oldest_received_at: Option<DateTime<Utc>>,
}

/// Per bot with anything waiting: counts and the oldest receipt.
pub async fn stats(pool: ReadPool<'_>) -> Result<Vec<QueueStats>, ReadError> {
    let sql = format!(
        "SELECT bot, COUNT(*), SUM(CASE WHEN failures > 0 THEN 1 ELSE 0 END), MIN(received_at) \
         FROM {NAME} WHERE state <> 'answering' GROUP BY bot ORDER BY bot"
    );
    let rows = either!(pool, p => sqlx::query(sqlx::AssertSqlSafe(sql))
        .try_map(|row| decode_stats(&row))
        .fetch_all(p)
        .await?);
    Ok(rows)
}

fn decode_stats(row: &impl EitherRow) -> Result<QueueStats, sqlx::Error> {
    Ok(QueueStats {
        bot: row.try_get(0)?,
        waiting: u64::try_from(row.try_get::<i64>(1)?).unwrap_or(0),
        failing: u64::try_from(row.try_get::<i64>(2)?).unwrap_or(0),
        oldest_received_at: row.try_get::<Option<Time>>(3)?.map(|t| t.0),
    })
}
