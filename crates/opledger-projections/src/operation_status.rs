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
use opledger_store::chain::Link;
use opledger_store::inline::{
    InlineProjection, InlineWriter, PgQuery, PgWrite, Planned, ProjectionError,
};
use opledger_store::{EitherRow, ReadPool, TextList, Time, either};
use serde::Serialize;
use sqlx::PgConnection;

use crate::projection::{Backend, Conn, Definition, Projection};

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
    /// Whether the operation is settled (confirmed, failed or reconciled): its outcome no
    /// longer changes.
    pub fn is_settled(&self) -> bool {
        Status::ALL
            .iter()
            .any(|s| s.as_str() == self.status && s.is_terminal())
    }

    /// When a worker must look at a terminal operation: if it has a chat to reply to and no
    /// reply was started yet, from when the operation was received, so that its reply keeps
    /// the operation's place in the worker's line (earliest due first): under a backlog it
    /// goes before operations received after it, instead of after all of them (ADR 0026);
    /// never otherwise.
    fn reply_due(&self) -> Option<DateTime<Utc>> {
        (self.chat_id.is_some() && self.reply == "not_started").then_some(self.created_at)
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
                row.due_at = row.reply_due();
            }
            OperationEvent::Failed(e) => {
                row.status = status(Status::Failed);
                row.last_error = Some(e.reason.clone());
                row.lease_until = None;
                row.due_at = row.reply_due();
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
                    row.due_at = row.reply_due();
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

/// The columns an upsert overwrites (all but the identity and creation ones).
const UPDATED: &str = "status = excluded.status, attempts = excluded.attempts, \
     worker = excluded.worker, lease_until = excluded.lease_until, due_at = excluded.due_at, \
     external_id = excluded.external_id, last_error = excluded.last_error, \
     reply = excluded.reply, key_conflicts = excluded.key_conflicts, \
     updated_at = excluded.updated_at, version = excluded.version, \
     last_position = excluded.last_position";

/// A row as a JSON array in column order, times as microseconds since the Unix epoch (written
/// straight out, without building a JSON value first).
struct JsonRow<'a>(&'a OperationStatusRow);

impl Serialize for JsonRow<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let row = self.0;
        let micros = |t: Option<DateTime<Utc>>| t.map(|t| t.timestamp_micros());
        let mut seq = serializer.serialize_seq(Some(20))?;
        seq.serialize_element(&row.operation_id)?;
        seq.serialize_element(&row.stream_id)?;
        seq.serialize_element(&row.action)?;
        seq.serialize_element(&row.business_key)?;
        seq.serialize_element(&row.bot)?;
        seq.serialize_element(&row.chat_id)?;
        seq.serialize_element(&row.user_id)?;
        seq.serialize_element(&row.status)?;
        seq.serialize_element(&row.attempts)?;
        seq.serialize_element(&row.worker)?;
        seq.serialize_element(&micros(row.lease_until))?;
        seq.serialize_element(&micros(row.due_at))?;
        seq.serialize_element(&row.external_id)?;
        seq.serialize_element(&row.last_error)?;
        seq.serialize_element(&row.reply)?;
        seq.serialize_element(&row.key_conflicts)?;
        seq.serialize_element(&row.created_at.timestamp_micros())?;
        seq.serialize_element(&row.updated_at.timestamp_micros())?;
        seq.serialize_element(&row.version)?;
        seq.serialize_element(&row.last_position)?;
        seq.end()
    }
}

fn rows_json(rows: &[OperationStatusRow]) -> Result<String, serde_json::Error> {
    serde_json::to_string(&rows.iter().map(JsonRow).collect::<Vec<_>>())
}

fn decode_row(row: &impl EitherRow) -> Result<OperationStatusRow, sqlx::Error> {
    let count = |value: i32, column: &'static str| {
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
    let time = |time: Option<Time>| time.map(|t| t.0);
    Ok(OperationStatusRow {
        operation_id: row.try_get(0)?,
        stream_id: row.try_get(1)?,
        action: row.try_get(2)?,
        business_key: row.try_get(3)?,
        bot: row.try_get(4)?,
        chat_id: row.try_get(5)?,
        user_id: row.try_get(6)?,
        status: row.try_get(7)?,
        attempts: count(row.try_get(8)?, "attempts")?,
        worker: row.try_get(9)?,
        lease_until: time(row.try_get(10)?),
        due_at: time(row.try_get(11)?),
        external_id: row.try_get(12)?,
        last_error: row.try_get(13)?,
        reply: row.try_get(14)?,
        key_conflicts: count(row.try_get(15)?, "key_conflicts")?,
        created_at: row.try_get::<Time>(16)?.0,
        updated_at: row.try_get::<Time>(17)?.0,
        version: position(row.try_get(18)?, "version")?,
        last_position: position(row.try_get(19)?, "last_position")?,
    })
}

/// The statements that fold a batch into one version's table: the rows a batch continues are
/// read by one statement for both backends; they are written back by a bulk upsert of each
/// backend's own (a JSON array expanded by `jsonb_each` on SQLite, one array per column expanded
/// by `unnest` on PostgreSQL).
#[derive(Debug)]
struct Statements {
    sqlite_select: String,
    postgres_select: String,
    sqlite_upsert: String,
    postgres_upsert: String,
}

impl Statements {
    /// The statements for the table named `table` (`operation_status`, `operation_status@v2`).
    fn for_table(table: &str) -> Statements {
        let table = format!("\"{}\"", table.replace('"', "\"\""));
        let select = |backend: Backend| {
            let streams = backend.in_list("stream_id", "$1");
            format!("SELECT {COLUMNS} FROM {table} WHERE {streams}")
        };
        Statements {
            sqlite_select: select(Backend::Sqlite),
            postgres_select: select(Backend::Postgres),
            // SQLite keeps integers and microsecond times; the JSON array's elements map one to
            // one.
            sqlite_upsert: format!(
                "INSERT INTO {table} ({COLUMNS}) SELECT value ->> 0, value ->> 1, value ->> 2, \
                 value ->> 3, value ->> 4, value ->> 5, value ->> 6, value ->> 7, value ->> 8, \
                 value ->> 9, value ->> 10, value ->> 11, value ->> 12, value ->> 13, \
                 value ->> 14, value ->> 15, value ->> 16, value ->> 17, value ->> 18, \
                 value ->> 19 FROM jsonb_each($1) WHERE true \
                 ON CONFLICT (operation_id) DO UPDATE SET {UPDATED}"
            ),
            postgres_upsert: postgres_upsert(&table, 1, "true"),
        }
    }

    fn select(&self, backend: Backend) -> &str {
        match backend {
            Backend::Sqlite => &self.sqlite_select,
            Backend::Postgres => &self.postgres_select,
        }
    }
}

/// The PostgreSQL upsert of rows given as one typed array per column (no JSON to build or
/// parse), its parameters numbered from `$first`, writing where the SQL condition `when` holds.
fn postgres_upsert(table: &str, first: usize, when: &str) -> String {
    const TYPES: [&str; 20] = [
        "text",
        "text",
        "text",
        "text",
        "text",
        "int8",
        "int8",
        "text",
        "int4",
        "text",
        "timestamptz",
        "timestamptz",
        "text",
        "text",
        "text",
        "int4",
        "timestamptz",
        "timestamptz",
        "int8",
        "int8",
    ];
    let arrays: Vec<String> = TYPES
        .iter()
        .enumerate()
        .map(|(i, t)| format!("${}::{t}[]", first + i))
        .collect();
    format!(
        "INSERT INTO {table} ({COLUMNS}) SELECT * FROM unnest({}) WHERE {when} \
         ON CONFLICT (operation_id) DO UPDATE SET {UPDATED}",
        arrays.join(", ")
    )
}

/// The statements for the live table, which the store runs inside every append: made once.
fn live() -> &'static Statements {
    static LIVE: std::sync::OnceLock<Statements> = std::sync::OnceLock::new();
    LIVE.get_or_init(|| Statements::for_table(NAME))
}

/// The projection's name, also its live table's.
pub const NAME: &str = "operation_status";

/// Folds a batch into the table the statements name: reads the rows of the streams that do not
/// start in the batch, folds, and writes every changed row in one statement.
async fn apply(
    mut conn: Conn<'_>,
    statements: &Statements,
    events: &[Link<'_>],
) -> Result<(), ProjectionError> {
    let batch = operation_events(events);
    if batch.is_empty() {
        return Ok(());
    }
    let needed = needing_rows(&batch);
    let mut stored = HashMap::new();
    if !needed.is_empty() {
        let sql = sqlx::AssertSqlSafe(statements.select(conn.backend()));
        let rows = either!(conn.reborrow(), c => sqlx::query(sql)
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
        Conn::Sqlite(c) => {
            sqlx::query(sqlx::AssertSqlSafe(statements.sqlite_upsert.as_str()))
                .bind(rows_json(&rows)?)
                .execute(c)
                .await?;
        }
        Conn::Postgres(c) => upsert_postgres(c, &statements.postgres_upsert, &rows).await?,
    }
    Ok(())
}

/// Writes rows with PostgreSQL's `unnest` upsert.
async fn upsert_postgres(
    connection: &mut PgConnection,
    upsert: &str,
    rows: &[OperationStatusRow],
) -> Result<(), sqlx::Error> {
    bind_rows(sqlx::query(sqlx::AssertSqlSafe(upsert)), rows)
        .execute(connection)
        .await?;
    Ok(())
}

/// Binds `rows` as the upsert's twenty arrays, in column order.
fn bind_rows<'q>(query: PgQuery<'q>, rows: &'q [OperationStatusRow]) -> PgQuery<'q> {
    let c = PgColumns::of(rows);
    query
        .bind(c.operation_id)
        .bind(c.stream_id)
        .bind(c.action)
        .bind(c.business_key)
        .bind(c.bot)
        .bind(c.chat_id)
        .bind(c.user_id)
        .bind(c.status)
        .bind(c.attempts)
        .bind(c.worker)
        .bind(c.lease_until)
        .bind(c.due_at)
        .bind(c.external_id)
        .bind(c.last_error)
        .bind(c.reply)
        .bind(c.key_conflicts)
        .bind(c.created_at)
        .bind(c.updated_at)
        .bind(c.version)
        .bind(c.last_position)
}

/// Rows as one array per column, for PostgreSQL's `unnest`.
#[derive(Default)]
struct PgColumns<'a> {
    operation_id: Vec<&'a str>,
    stream_id: Vec<&'a str>,
    action: Vec<&'a str>,
    business_key: Vec<&'a str>,
    bot: Vec<&'a str>,
    chat_id: Vec<Option<i64>>,
    user_id: Vec<Option<i64>>,
    status: Vec<&'a str>,
    attempts: Vec<i32>,
    worker: Vec<Option<&'a str>>,
    lease_until: Vec<Option<DateTime<Utc>>>,
    due_at: Vec<Option<DateTime<Utc>>>,
    external_id: Vec<Option<&'a str>>,
    last_error: Vec<Option<&'a str>>,
    reply: Vec<&'a str>,
    key_conflicts: Vec<i32>,
    created_at: Vec<DateTime<Utc>>,
    updated_at: Vec<DateTime<Utc>>,
    version: Vec<i64>,
    last_position: Vec<i64>,
}

impl<'a> PgColumns<'a> {
    fn of(rows: &'a [OperationStatusRow]) -> Self {
        let mut c = PgColumns::default();
        let int = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
        let big = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        for row in rows {
            c.operation_id.push(&row.operation_id);
            c.stream_id.push(&row.stream_id);
            c.action.push(&row.action);
            c.business_key.push(&row.business_key);
            c.bot.push(&row.bot);
            c.chat_id.push(row.chat_id);
            c.user_id.push(row.user_id);
            c.status.push(&row.status);
            c.attempts.push(int(row.attempts));
            c.worker.push(row.worker.as_deref());
            c.lease_until.push(row.lease_until);
            c.due_at.push(row.due_at);
            c.external_id.push(row.external_id.as_deref());
            c.last_error.push(row.last_error.as_deref());
            c.reply.push(&row.reply);
            c.key_conflicts.push(int(row.key_conflicts));
            c.created_at.push(row.created_at);
            c.updated_at.push(row.updated_at);
            c.version.push(big(row.version));
            c.last_position.push(big(row.last_position));
        }
        c
    }
}

/// The schema for the live table and its version-1 index names, as tables created before the
/// registry have them.
fn live_schema(backend: Backend) -> String {
    let (tables, indexes) = OperationStatus.schema().render(backend, NAME, NAME);
    format!("{tables}\n{indexes}")
}

impl InlineProjection for OperationStatus {
    fn name(&self) -> &'static str {
        NAME
    }

    /// Creates the table only when it is missing: after a blue/green flip the live table's
    /// indexes carry another version's names, and creating them again would duplicate them.
    /// (DDL: each backend looks the table up and serializes creators its own way.)
    fn install<'a>(&'a self, connection: Conn<'a>) -> BoxFuture<'a, Result<(), ProjectionError>> {
        Box::pin(crate::db::install_live(connection, NAME, live_schema))
    }

    fn apply<'a>(
        &'a self,
        connection: Conn<'a>,
        events: &'a [Link<'a>],
    ) -> BoxFuture<'a, Result<(), ProjectionError>> {
        Box::pin(apply(connection, live(), events))
    }

    fn writer(&self) -> Option<Box<dyn InlineWriter>> {
        Some(Box::<Planner>::default())
    }
}

/// How many rows a writer's planner holds at most; past that it forgets them all (the next
/// batches read the rows they continue).
const HELD_ROWS: usize = 20_000;

/// A PostgreSQL writer's planner for the live table (ADR 0016): the rows its committed batches
/// wrote, by stream, each as of the stream version it was written at. A batch that continues a
/// stream whose row it holds at the version the batch continues from needs no read; one it does
/// not hold is read first (outside the transaction, and used only at that version).
#[derive(Debug, Default)]
struct Planner {
    rows: HashMap<String, OperationStatusRow>,
    /// What the last plan wrote, until the writer says whether it committed.
    planned: Vec<OperationStatusRow>,
}

impl Planner {
    async fn plan_batch(
        &mut self,
        connection: &mut PgConnection,
        events: &[Link<'_>],
    ) -> Result<Planned, ProjectionError> {
        self.planned.clear();
        let batch = operation_events(events);
        if batch.is_empty() {
            return Ok(Planned::Nothing);
        }
        // The version each continued stream must have been at for the batch to follow it.
        let continued: HashMap<&str, u64> = batch
            .iter()
            .filter(|(_, links)| links.first().is_some_and(|l| l.event_type != "Received"))
            .map(|(stream, links)| (*stream, links[0].version.saturating_sub(1)))
            .collect();
        let mut stored = HashMap::new();
        let mut unknown = Vec::new();
        for (&stream, &version) in &continued {
            match self.rows.get(stream) {
                Some(row) if row.version == version => {
                    stored.insert(stream.to_owned(), row.clone());
                }
                _ => unknown.push(stream),
            }
        }
        if !unknown.is_empty() {
            let rows = sqlx::query(sqlx::AssertSqlSafe(live().postgres_select.as_str()))
                .bind(TextList(&unknown))
                .try_map(|row| decode_row(&row))
                .fetch_all(&mut *connection)
                .await?;
            for row in rows {
                if continued.get(row.stream_id.as_str()) != Some(&row.version) {
                    // The stream moved elsewhere (another instance): the append will say so.
                    return Ok(Planned::Unknown);
                }
                stored.insert(row.stream_id.clone(), row);
            }
            if stored.len() < continued.len() {
                // A row is missing: the transaction's fold reports it.
                return Ok(Planned::Unknown);
            }
        }
        let rows = fold(batch, stored)?;
        self.planned.clone_from(&rows);
        Ok(Planned::Write(Box::new(PlannedRows(rows))))
    }
}

impl InlineWriter for Planner {
    fn plan<'a>(
        &'a mut self,
        connection: &'a mut PgConnection,
        events: &'a [Link<'a>],
    ) -> BoxFuture<'a, Result<Planned, ProjectionError>> {
        Box::pin(self.plan_batch(connection, events))
    }

    fn committed(&mut self) {
        if self.rows.len() + self.planned.len() > HELD_ROWS {
            self.rows.clear();
        }
        for row in self.planned.drain(..) {
            // A settled operation with nothing due is not expected to move again.
            if row.is_settled() && row.due_at.is_none() {
                self.rows.remove(&row.stream_id);
            } else {
                self.rows.insert(row.stream_id.clone(), row);
            }
        }
    }

    fn discarded(&mut self) {
        self.planned.clear();
    }
}

/// Rows planned for the live table, written in the append's statement.
struct PlannedRows(Vec<OperationStatusRow>);

impl PgWrite for PlannedRows {
    fn statement(&self, first: usize, written: &str) -> String {
        postgres_upsert(&crate::db::quoted(NAME), first, written)
    }

    fn parameters(&self) -> usize {
        20
    }

    fn bind<'q>(&'q self, query: PgQuery<'q>) -> PgQuery<'q> {
        bind_rows(query, &self.0)
    }
}

impl Projection for OperationStatus {
    fn definition(&self) -> Definition {
        // 2: a terminal operation's reply is due from when it was received (ADR 0026).
        Definition::new(NAME, 2, SQLITE_SCHEMA, POSTGRES_SCHEMA).inline()
    }

    fn apply<'a>(
        &'a self,
        conn: Conn<'a>,
        table: &'a str,
        events: &'a [Link<'a>],
    ) -> BoxFuture<'a, Result<(), ProjectionError>> {
        Box::pin(async move {
            if table == NAME {
                return apply(conn, live(), events).await;
            }
            apply(conn, &Statements::for_table(table), events).await
        })
    }

    fn forget_stream<'a>(
        &'a self,
        conn: Conn<'a>,
        table: &'a str,
        stream: &'a str,
    ) -> Option<BoxFuture<'a, Result<(), ProjectionError>>> {
        Some(Box::pin(async move {
            let sql = format!(
                "DELETE FROM \"{}\" WHERE stream_id = $1",
                table.replace('"', "\"\"")
            );
            either!(conn, c => {
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(stream)
                    .execute(c)
                    .await?;
            });
            Ok(())
        }))
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
    let sql = format!(
        "SELECT {COLUMNS} FROM operation_status \
         WHERE ($1 IS NULL OR status = $1) AND ($2 IS NULL OR bot = $2) \
         AND ($3 IS NULL OR user_id = $3) \
         ORDER BY updated_at DESC, operation_id LIMIT $4"
    );
    let limit = i64::from(filter.limit.max(1));
    let rows = either!(pool, p => sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(&filter.status)
        .bind(&filter.bot)
        .bind(filter.user_id)
        .bind(limit)
        .try_map(|row| decode_row(&row))
        .fetch_all(p)
        .await?);
    Ok(rows)
}

/// One operation by id.
pub async fn get(
    pool: ReadPool<'_>,
    operation_id: &str,
) -> Result<Option<OperationStatusRow>, ReadError> {
    let sql = format!("SELECT {COLUMNS} FROM operation_status WHERE operation_id = $1");
    let row = either!(pool, p => sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(operation_id)
        .try_map(|row| decode_row(&row))
        .fetch_optional(p)
        .await?);
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
    let sql = due_sql(pool.backend(), replies);
    let rows = either!(pool, p => sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(Time(now))
        .bind(TextList(actions))
        .bind(limit)
        .try_map(|row| decode_row(&row))
        .fetch_all(p)
        .await?);
    Ok(rows)
}

/// The statement [`due`] runs: `$1` the time, `$2` the actions, `$3` the limit (for `EXPLAIN`
/// in tests and diagnostics).
pub fn due_sql(backend: Backend, replies: bool) -> String {
    format!(
        "SELECT {COLUMNS} FROM operation_status \
         WHERE due_at IS NOT NULL AND due_at <= $1 AND {} {} \
         ORDER BY due_at LIMIT $3",
        backend.in_list("action", "$2"),
        without_terminal(replies)
    )
}

/// When the next operation of `actions` becomes due, if any is waiting: how long a worker with
/// nothing to do may sleep.
pub async fn next_due(
    pool: ReadPool<'_>,
    actions: &[String],
    replies: bool,
) -> Result<Option<DateTime<Utc>>, ReadError> {
    let sql = format!(
        "SELECT min(due_at) FROM operation_status WHERE due_at IS NOT NULL AND {} {}",
        pool.backend().in_list("action", "$1"),
        without_terminal(replies)
    );
    let at: Option<Time> = either!(pool, p => sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(TextList(actions))
        .fetch_one(p)
        .await?);
    Ok(at.map(|at| at.0))
}
