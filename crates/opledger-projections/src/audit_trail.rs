//! `audit_trail`: one row per event of the ledger, saying who or what caused it (an update, a
//! worker, an operator, opledger itself), the operation, bot, user and chat it concerns, and a
//! short summary; read by operation, user, chat or time.
//!
//! Most events do not name their operation, user or chat themselves (a worker's `Claimed` names
//! only the worker). A stream's first event does (`Received`, `UpdateReceived`, `TokenIssued`),
//! so the projection keeps what it said in `{table}_streams`, one row per such stream, and fills
//! later events from it: from their own stream's row, and, for events an update caused, from
//! the row of that update's stream (`correlation`). A page reads the rows it needs (its own
//! streams', then the correlations' it still lacks) and writes its events and the contexts it
//! started, a few statements per page and never one per event; memory stays flat whatever the
//! ledger's size. The audit trail is the biggest read model (a row per event), so its rows are
//! loaded the fastest way each backend has: bound multi-row `VALUES` on SQLite, `COPY` on
//! PostgreSQL.
//!
//! Message text never reaches the summaries: a stored raw body is summarised by its size.

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use opledger_domain::callback_token::TokenRejection;
use opledger_domain::operation::{ConfirmedVia, OperationEvent, ReconcileOutcome};
use opledger_domain::quarantine::QuarantineEvent;
use opledger_domain::{
    CallbackTokenEvent, Causation, DeliveryEvent, DomainEvent, EventMetadata, RepeatGuardEvent,
};
use opledger_store::chain::Link;
use opledger_store::inline::ProjectionError;
use opledger_store::{EitherRow, ReadPool, Time, either};
use serde::Serialize;
use sqlx::{PgConnection, SqliteConnection};

use crate::projection::{Conn, Definition, Projection};
use crate::rows::{
    self, CopyText, SQLITE_PARAMETERS, SQLITE_ROWS_PER_STATEMENT, category, kept_prepared,
    read_error, signed, sqlite_values,
};

pub use crate::rows::ReadError;

/// The projection's name and its active table's.
pub const NAME: &str = "audit_trail";

/// The SQLite schema (`projections/audit_trail/sqlite.sql`).
pub const SQLITE_SCHEMA: &str = include_str!("../../../projections/audit_trail/sqlite.sql");
/// The PostgreSQL schema (`projections/audit_trail/postgres.sql`).
pub const POSTGRES_SCHEMA: &str = include_str!("../../../projections/audit_trail/postgres.sql");

/// The longest summary kept, in bytes.
const SUMMARY_MAX: usize = 200;

/// The audit trail projection.
#[derive(Clone, Copy, Debug, Default)]
pub struct AuditTrail;

impl Projection for AuditTrail {
    fn definition(&self) -> Definition {
        Definition::new(NAME, 1, SQLITE_SCHEMA, POSTGRES_SCHEMA).with_tables(&["", "_streams"])
    }

    fn apply<'a>(
        &'a self,
        conn: Conn<'a>,
        table: &'a str,
        events: &'a [Link<'a>],
    ) -> BoxFuture<'a, Result<(), ProjectionError>> {
        Box::pin(async move {
            if events.is_empty() {
                return Ok(());
            }
            // Rows are loaded the fastest way each backend has (see the module documentation).
            match conn {
                Conn::Sqlite(c) => apply_sqlite(c, table, events).await,
                Conn::Postgres(c) => apply_postgres(c, table, events).await,
            }
        })
    }

    /// A stream's rows are found by a scan (targeted rebuilds are rare, and an index of stream
    /// ids would slow every append's page).
    fn forget_stream<'a>(
        &'a self,
        conn: Conn<'a>,
        table: &'a str,
        stream: &'a str,
    ) -> Option<BoxFuture<'a, Result<(), ProjectionError>>> {
        Some(Box::pin(async move {
            let rows = format!("DELETE FROM \"{table}\" WHERE stream_id = $1");
            let streams = format!("DELETE FROM \"{table}_streams\" WHERE stream_id = $1");
            either!(conn, c => {
                for sql in [rows, streams] {
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

/// What a stream's first event said about it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct StreamContext {
    operation_id: Option<String>,
    bot: Option<String>,
    user_id: Option<i64>,
    chat_id: Option<i64>,
}

/// What an event says about itself, decoded from its payload.
#[derive(Debug, Default)]
struct Facts {
    operation_id: Option<String>,
    bot: Option<String>,
    user_id: Option<i64>,
    chat_id: Option<i64>,
    summary: String,
    /// The event (re)starts its stream's context: `Received`, `UpdateReceived`, `TokenIssued`.
    starts: bool,
}

/// One row of the audit trail, as written and as read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AuditEntry {
    pub position: u64,
    pub recorded_at: DateTime<Utc>,
    pub stream_id: String,
    /// The stream's category: `op`, `update`, `cb`, `recent`, `quarantine`.
    pub category: String,
    pub version: u64,
    pub event_type: String,
    /// The operation the event belongs to or names, when there is one.
    pub operation_id: Option<String>,
    pub bot: Option<String>,
    pub user_id: Option<i64>,
    pub chat_id: Option<i64>,
    /// Who or what caused the event: `update`, `worker`, `operator`, `system`, or `unknown`.
    pub actor_kind: String,
    /// The update id, the worker's id, the operator's name or the component's name.
    pub actor_id: Option<String>,
    /// The originating update's stream, when there is one.
    pub correlation: Option<String>,
    /// What happened, in a line.
    pub summary: String,
}

/// Who or what caused an event, from its metadata.
fn actor(metadata: Option<&EventMetadata>) -> (&'static str, Option<String>) {
    match metadata.map(|m| &m.causation) {
        Some(Causation::Update { update_id, .. }) => ("update", Some(update_id.to_string())),
        Some(Causation::Worker { worker }) => ("worker", Some(worker.clone())),
        Some(Causation::Operator { operator }) => ("operator", Some(operator.clone())),
        Some(Causation::Client { client }) => ("client", Some(client.clone())),
        Some(Causation::System { component }) => ("system", Some(component.clone())),
        None => ("unknown", None),
    }
}

/// Cuts a summary at a character boundary.
fn bounded(mut text: String) -> String {
    if text.len() > SUMMARY_MAX {
        let mut end = SUMMARY_MAX;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Decodes an event by its stream's category into what it says about itself.
fn facts(link: &Link<'_>) -> Facts {
    let (ty, version, payload) = (link.event_type, link.schema_version, link.payload);
    let decoded = match category(link.stream_id) {
        "op" => OperationEvent::from_stored(ty, version, payload).map(operation_facts),
        "update" => DeliveryEvent::from_stored(ty, version, payload).map(delivery_facts),
        "cb" => CallbackTokenEvent::from_stored(ty, version, payload).map(token_facts),
        "recent" => RepeatGuardEvent::from_stored(ty, version, payload).map(|e| match e {
            RepeatGuardEvent::CommandSeen(e) => Facts {
                summary: format!("command seen in update {} (epoch {})", e.update_id, e.epoch),
                ..Facts::default()
            },
        }),
        "quarantine" => QuarantineEvent::from_stored(ty, version, payload).map(|e| match e {
            QuarantineEvent::BodyQuarantined(e) => Facts {
                summary: format!("body quarantined: {} ({} bytes)", e.reason, e.size),
                ..Facts::default()
            },
        }),
        _ => {
            return Facts {
                summary: ty.to_owned(),
                ..Facts::default()
            };
        }
    };
    decoded.unwrap_or_else(|error| Facts {
        summary: format!("{ty} (payload not readable: {error})"),
        ..Facts::default()
    })
}

fn operation_facts(event: OperationEvent) -> Facts {
    let summary = match &event {
        OperationEvent::Received(e) => {
            return Facts {
                operation_id: Some(e.operation_id.to_string()),
                bot: Some(e.bot.clone()),
                user_id: e.user_id,
                chat_id: e.chat_id,
                summary: format!(
                    "received {} {} from update {}",
                    e.action, e.business_key, e.update_id
                ),
                starts: true,
            };
        }
        OperationEvent::Claimed(e) => format!(
            "claimed by {} (attempt {}, lease until {})",
            e.worker,
            e.attempt,
            time(e.lease_until)
        ),
        OperationEvent::ExternalCallSent(e) => {
            format!("call sent by {} (attempt {})", e.worker, e.attempt)
        }
        OperationEvent::Confirmed(e) => {
            let via = match e.via {
                ConfirmedVia::Response => "response",
                ConfirmedVia::Lookup => "lookup",
            };
            match &e.external_id {
                Some(id) => format!("confirmed: {id} (via {via})"),
                None => format!("confirmed (via {via})"),
            }
        }
        OperationEvent::Failed(e) => format!("failed after {} attempts: {}", e.attempts, e.reason),
        OperationEvent::RetryScheduled(e) => format!(
            "retry at {} (attempt {} failed: {})",
            time(e.at),
            e.attempt,
            e.reason
        ),
        OperationEvent::MarkedForReconciliation(e) => format!(
            "marked for reconciliation (attempt {}): {}",
            e.attempt, e.reason
        ),
        OperationEvent::Reconciled(e) => {
            let outcome = match e.outcome {
                ReconcileOutcome::Succeeded => "succeeded",
                ReconcileOutcome::Failed => "failed",
                ReconcileOutcome::Retry => "retry",
            };
            match &e.external_id {
                Some(id) => format!("reconciled {outcome} ({id}) by {}: {}", e.operator, e.note),
                None => format!("reconciled {outcome} by {}: {}", e.operator, e.note),
            }
        }
        OperationEvent::KeyConflictRecorded(e) => {
            return Facts {
                bot: Some(e.bot.clone()),
                summary: format!(
                    "key conflict: update {} asked with other parameters",
                    e.update_id
                ),
                ..Facts::default()
            };
        }
        OperationEvent::TransitionRejected(e) => {
            format!("rejected {} while {}: {}", e.command, e.status, e.reason)
        }
        OperationEvent::ReplyStarted(e) => format!("reply started (attempt {})", e.attempt),
        OperationEvent::ReplySent(_) => "reply sent".to_owned(),
        OperationEvent::ReplyRetryScheduled(e) => {
            format!("reply retry at {}: {}", time(e.at), e.reason)
        }
        OperationEvent::ReplyFailed(e) => format!("reply failed: {}", e.reason),
        OperationEvent::ReplyOutcomeUnknown(e) => format!("reply outcome unknown: {}", e.reason),
    };
    Facts {
        summary,
        ..Facts::default()
    }
}

fn delivery_facts(event: DeliveryEvent) -> Facts {
    match event {
        DeliveryEvent::UpdateReceived(e) => {
            let led_to = match &e.operation {
                Some(link) if link.joined => format!(", joined {}", link.stream),
                Some(link) => format!(", started {}", link.stream),
                None => String::new(),
            };
            Facts {
                operation_id: e.operation.map(|link| link.operation_id.to_string()),
                bot: Some(e.bot),
                user_id: e.user_id,
                chat_id: e.chat_id,
                summary: format!(
                    "update {} received ({}, epoch {}){led_to}",
                    e.update_id, e.kind, e.epoch
                ),
                starts: true,
            }
        }
        DeliveryEvent::DuplicateDeliveryObserved(e) => Facts {
            summary: format!("duplicate delivery (epoch {})", e.epoch),
            ..Facts::default()
        },
        DeliveryEvent::UpdateIdCollision(e) => Facts {
            summary: format!(
                "update id collision (epoch {}): another body under the same id",
                e.epoch
            ),
            ..Facts::default()
        },
        DeliveryEvent::RawUpdateStored(e) => Facts {
            summary: format!("raw body stored ({} bytes)", e.body.len()),
            ..Facts::default()
        },
        other => Facts {
            summary: forward_summary(&other),
            ..Facts::default()
        },
    }
}

/// One line for a step of forwarding an update to the bot's webhook.
fn forward_summary(event: &DeliveryEvent) -> String {
    match event {
        DeliveryEvent::ForwardStarted(e) => format!(
            "forward attempt {} started by {} (lease until {})",
            e.attempt,
            e.forwarder,
            time(e.lease_until)
        ),
        DeliveryEvent::UpdateForwarded(e) => format!(
            "forwarded: the bot answered {} to attempt {} in {} ms",
            e.status, e.attempt, e.elapsed_ms
        ),
        DeliveryEvent::ForwardFailed(e) => format!(
            "forward attempt {} failed: {}; next at {}",
            e.attempt,
            e.error,
            time(e.retry_at)
        ),
        DeliveryEvent::ForwardGivenUp(e) => format!("forwarding given up: {}", e.reason),
        DeliveryEvent::AnswerCallStarted(e) => {
            format!("the bot's answer calls {}: started", e.method)
        }
        DeliveryEvent::AnswerCallSent(e) => format!("the bot's {} was carried out", e.method),
        DeliveryEvent::AnswerCallFailed(e) if e.known => {
            format!("the bot's {} was refused: {}", e.method, e.error)
        }
        DeliveryEvent::AnswerCallFailed(e) => format!(
            "the bot's {} has an unknown outcome, not sent again: {}",
            e.method, e.error
        ),
        DeliveryEvent::UpdateReceived(_)
        | DeliveryEvent::DuplicateDeliveryObserved(_)
        | DeliveryEvent::UpdateIdCollision(_)
        | DeliveryEvent::RawUpdateStored(_) => String::new(),
    }
}

fn token_facts(event: CallbackTokenEvent) -> Facts {
    match event {
        CallbackTokenEvent::TokenIssued(e) => Facts {
            operation_id: e.operation_id.map(|id| id.to_string()),
            user_id: Some(e.user_id),
            chat_id: e.chat_id,
            summary: format!(
                "button token issued for {} (expires {})",
                e.action,
                time(e.expires_at)
            ),
            starts: true,
            ..Facts::default()
        },
        CallbackTokenEvent::TokenConsumed(e) => Facts {
            user_id: Some(e.user_id),
            summary: format!("button clicked (update {})", e.update_id),
            ..Facts::default()
        },
        CallbackTokenEvent::TokenCancelled(e) => Facts {
            user_id: Some(e.user_id),
            summary: format!("cancelled by its user (update {})", e.update_id),
            ..Facts::default()
        },
        CallbackTokenEvent::TokenRejected(e) => {
            let reason = match e.reason {
                TokenRejection::AlreadyConsumed => "already used",
                TokenRejection::Cancelled => "cancelled",
                TokenRejection::WrongUser => "another user's button",
                TokenRejection::Expired => "expired",
                TokenRejection::NotIssued => "never issued",
            };
            Facts {
                user_id: Some(e.user_id),
                summary: format!("click refused: {reason} (update {})", e.update_id),
                ..Facts::default()
            }
        }
    }
}

/// The bot a stream id names, for streams whose id starts with it.
fn bot_of_stream(stream_id: &str) -> Option<String> {
    match category(stream_id) {
        "update" | "recent" | "quarantine" => stream_id
            .split('-')
            .nth(1)
            .filter(|b| !b.is_empty())
            .map(str::to_owned),
        _ => None,
    }
}

/// One event, decoded, before its stream's context fills it in.
struct Pending<'l> {
    link: &'l Link<'l>,
    metadata: Option<EventMetadata>,
    facts: Facts,
}

impl Pending<'_> {
    fn correlation(&self) -> Option<&str> {
        self.metadata
            .as_ref()
            .and_then(|m| m.correlation.as_deref())
            .filter(|c| *c != self.link.stream_id)
    }
}

/// Decodes a page, and names the streams whose context must be read from the table before
/// anything else: the events' own streams that the page does not start before them.
fn decode<'l>(events: &'l [Link<'l>]) -> (Vec<Pending<'l>>, Vec<String>) {
    let mut started: HashSet<&str> = HashSet::new();
    let mut needed: Vec<String> = Vec::new();
    let mut asked: HashSet<&str> = HashSet::new();
    let mut pending = Vec::with_capacity(events.len());
    for link in events {
        let item = Pending {
            link,
            metadata: rows::metadata(link),
            facts: facts(link),
        };
        if item.facts.starts {
            started.insert(link.stream_id);
        } else if !started.contains(link.stream_id) && asked.insert(link.stream_id) {
            needed.push(link.stream_id.to_owned());
        }
        pending.push(item);
    }
    (pending, needed)
}

/// Whether the fold will look at the context of an event's correlation (the update that caused
/// it), given the event's own stream's context: for what an update caused (its user and chat
/// come first), and for whatever neither the event nor its own stream says.
fn wants_correlation(item: &Pending<'_>, own: Option<&StreamContext>) -> bool {
    if item.correlation().is_none() {
        return false;
    }
    let facts = &item.facts;
    let causing_bot = matches!(
        item.metadata.as_ref().map(|m| &m.causation),
        Some(Causation::Update { .. })
    );
    let own = own.cloned().unwrap_or_default();
    (causing_bot && (facts.user_id.is_none() || facts.chat_id.is_none()))
        || (facts.operation_id.is_none() && own.operation_id.is_none())
        || (facts.bot.is_none() && !causing_bot && own.bot.is_none())
        || (facts.user_id.is_none() && own.user_id.is_none())
        || (facts.chat_id.is_none() && own.chat_id.is_none())
}

/// The correlations whose context must be read from the table: those the fold will look at
/// and the page does not start before it does. Walks the page as the fold does, so that it asks
/// for exactly what the fold uses, whatever the page's bounds.
fn correlations_needed(
    pending: &[Pending<'_>],
    stored: &HashMap<String, StreamContext>,
) -> Vec<String> {
    let mut started: HashMap<&str, StreamContext> = HashMap::new();
    let mut needed: Vec<String> = Vec::new();
    let mut asked: HashSet<&str> = HashSet::new();
    for item in pending {
        let stream = item.link.stream_id;
        if item.facts.starts {
            started.insert(stream, context_of(&item.facts));
        }
        let own = started.get(stream).or_else(|| stored.get(stream));
        if !wants_correlation(item, own) {
            continue;
        }
        let Some(correlation) = item.correlation() else {
            continue;
        };
        if !started.contains_key(correlation)
            && !stored.contains_key(correlation)
            && asked.insert(correlation)
        {
            needed.push(correlation.to_owned());
        }
    }
    needed
}

/// The context a stream-starting event gives its stream.
fn context_of(facts: &Facts) -> StreamContext {
    StreamContext {
        operation_id: facts.operation_id.clone(),
        bot: facts.bot.clone(),
        user_id: facts.user_id,
        chat_id: facts.chat_id,
    }
}

/// A stream whose context a page (re)started, as it stands after the page.
#[derive(Debug)]
struct Changed {
    stream: String,
    context: StreamContext,
    /// Started at its first event: no row exists for it yet.
    new: bool,
}

/// Folds a decoded page into its rows and the streams' contexts as they stand after it.
fn fold<'l>(
    pending: Vec<Pending<'l>>,
    mut contexts: HashMap<String, StreamContext>,
) -> (Vec<AuditEntry>, Vec<Changed>) {
    // Each stream once: an upsert may not touch one row twice. With each, whether the page
    // starts it at its first event (its row cannot exist yet).
    let mut changed: Vec<(String, bool)> = Vec::new();
    let mut changed_set: HashSet<&str> = HashSet::new();
    let mut entries = Vec::with_capacity(pending.len());
    for item in pending {
        let link = item.link;
        let (actor_kind, actor_id) = actor(item.metadata.as_ref());
        let correlation = item.metadata.as_ref().and_then(|m| m.correlation.clone());
        let causing_bot = match item.metadata.as_ref().map(|m| &m.causation) {
            Some(Causation::Update { bot, .. }) => Some(bot.clone()),
            _ => None,
        };
        let facts = item.facts;
        if facts.starts {
            let context = context_of(&facts);
            contexts.insert(link.stream_id.to_owned(), context);
            if changed_set.insert(link.stream_id) {
                changed.push((link.stream_id.to_owned(), link.version == 1));
            }
        }
        let empty = StreamContext::default();
        let own = contexts.get(link.stream_id).unwrap_or(&empty);
        let related = correlation
            .as_deref()
            .and_then(|c| contexts.get(c))
            .unwrap_or(&empty);
        // An update's own user and chat come first for what it caused (a conflicting request
        // is attributed to whoever sent it, not to the operation's first requester).
        let (first, second) = if actor_kind == "update" {
            (related, own)
        } else {
            (own, related)
        };
        entries.push(AuditEntry {
            position: link.position,
            recorded_at: link.recorded_at(),
            stream_id: link.stream_id.to_owned(),
            category: category(link.stream_id).to_owned(),
            version: link.version,
            event_type: link.event_type.to_owned(),
            operation_id: facts
                .operation_id
                .or_else(|| own.operation_id.clone())
                .or_else(|| related.operation_id.clone()),
            bot: facts
                .bot
                .or(causing_bot)
                .or_else(|| own.bot.clone())
                .or_else(|| related.bot.clone())
                .or_else(|| bot_of_stream(link.stream_id)),
            user_id: facts.user_id.or(first.user_id).or(second.user_id),
            chat_id: facts.chat_id.or(first.chat_id).or(second.chat_id),
            actor_kind: actor_kind.to_owned(),
            actor_id,
            correlation,
            summary: bounded(facts.summary),
        });
    }
    let contexts = changed
        .into_iter()
        .map(|(stream, new)| {
            let context = contexts.remove(&stream).unwrap_or_default();
            Changed {
                stream,
                context,
                new,
            }
        })
        .collect();
    (entries, contexts)
}

/// The stored columns. The category is not stored: it is the start of the stream id.
const COLUMNS: &str = "position, recorded_at, stream_id, version, event_type, operation_id, \
     bot, user_id, chat_id, actor_kind, actor_id, correlation, summary";

const STREAM_COLUMNS: &str = "stream_id, operation_id, bot, user_id, chat_id";

const STREAM_UPDATES: &str = "operation_id = excluded.operation_id, bot = excluded.bot, \
     user_id = excluded.user_id, chat_id = excluded.chat_id";

fn decode_context(row: &impl EitherRow) -> Result<(String, StreamContext), sqlx::Error> {
    Ok((
        row.try_get(0)?,
        StreamContext {
            operation_id: row.try_get(1)?,
            bot: row.try_get(2)?,
            user_id: row.try_get(3)?,
            chat_id: row.try_get(4)?,
        },
    ))
}

/// Reads the stored contexts of `streams` into `contexts`.
async fn read_contexts_sqlite(
    conn: &mut SqliteConnection,
    table: &str,
    streams: &[String],
    contexts: &mut HashMap<String, StreamContext>,
) -> Result<(), sqlx::Error> {
    if streams.is_empty() {
        return Ok(());
    }
    for chunk in streams.chunks(SQLITE_PARAMETERS) {
        let sql = format!(
            "SELECT {STREAM_COLUMNS} FROM \"{table}_streams\" WHERE stream_id IN ({})",
            vec!["?"; chunk.len()].join(", ")
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for stream in chunk {
            query = query.bind(stream.as_str());
        }
        // Lists of every length: not kept prepared (see `rows::kept_prepared`).
        let query = query.persistent(false);
        for row in &query.fetch_all(&mut *conn).await? {
            let (stream, context) = decode_context(row)?;
            contexts.insert(stream, context);
        }
    }
    Ok(())
}

/// Reads the stored contexts of `streams` into `contexts`.
async fn read_contexts_postgres(
    conn: &mut PgConnection,
    table: &str,
    streams: &[String],
    contexts: &mut HashMap<String, StreamContext>,
) -> Result<(), sqlx::Error> {
    if streams.is_empty() {
        return Ok(());
    }
    let sql = format!("SELECT {STREAM_COLUMNS} FROM \"{table}_streams\" WHERE stream_id = ANY($1)");
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(streams)
        .fetch_all(&mut *conn)
        .await?;
    for row in &rows {
        let (stream, context) = decode_context(row)?;
        contexts.insert(stream, context);
    }
    Ok(())
}

async fn apply_sqlite(
    conn: &mut SqliteConnection,
    table: &str,
    events: &[Link<'_>],
) -> Result<(), ProjectionError> {
    let (pending, own) = decode(events);
    let mut contexts = HashMap::new();
    read_contexts_sqlite(conn, table, &own, &mut contexts).await?;
    let correlations = correlations_needed(&pending, &contexts);
    read_contexts_sqlite(conn, table, &correlations, &mut contexts).await?;
    let (entries, changed) = fold(pending, contexts);
    for chunk in entries.chunks(SQLITE_ROWS_PER_STATEMENT) {
        let head = format!("INSERT INTO \"{table}\" ({COLUMNS})");
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sqlite_values(&head, 13, chunk.len())));
        for e in chunk {
            query = query
                .bind(signed(e.position))
                .bind(e.recorded_at.timestamp_micros())
                .bind(e.stream_id.as_str())
                .bind(signed(e.version))
                .bind(e.event_type.as_str())
                .bind(e.operation_id.as_deref())
                .bind(e.bot.as_deref())
                .bind(e.user_id)
                .bind(e.chat_id)
                .bind(e.actor_kind.as_str())
                .bind(e.actor_id.as_deref())
                .bind(e.correlation.as_deref())
                .bind(e.summary.as_str());
        }
        query
            .persistent(kept_prepared(chunk.len()))
            .execute(&mut *conn)
            .await?;
    }
    for chunk in changed.chunks(SQLITE_ROWS_PER_STATEMENT) {
        let head = format!("INSERT INTO \"{table}_streams\" ({STREAM_COLUMNS})");
        let sql = format!(
            "{} ON CONFLICT (stream_id) DO UPDATE SET {STREAM_UPDATES}",
            sqlite_values(&head, 5, chunk.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for Changed {
            stream, context: c, ..
        } in chunk
        {
            query = query
                .bind(stream.as_str())
                .bind(c.operation_id.as_deref())
                .bind(c.bot.as_deref())
                .bind(c.user_id)
                .bind(c.chat_id);
        }
        query
            .persistent(kept_prepared(chunk.len()))
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

async fn apply_postgres(
    conn: &mut PgConnection,
    table: &str,
    events: &[Link<'_>],
) -> Result<(), ProjectionError> {
    let (pending, own) = decode(events);
    let mut contexts = HashMap::new();
    read_contexts_postgres(conn, table, &own, &mut contexts).await?;
    let correlations = correlations_needed(&pending, &contexts);
    read_contexts_postgres(conn, table, &correlations, &mut contexts).await?;
    let (entries, changed) = fold(pending, contexts);
    let mut rows = CopyText::default();
    for e in &entries {
        rows.int(Some(signed(e.position)))
            .time(e.recorded_at)
            .text(Some(&e.stream_id))
            .int(Some(signed(e.version)))
            .text(Some(&e.event_type))
            .text(e.operation_id.as_deref())
            .text(e.bot.as_deref())
            .int(e.user_id)
            .int(e.chat_id)
            .text(Some(&e.actor_kind))
            .text(e.actor_id.as_deref())
            .text(e.correlation.as_deref())
            .text(Some(&e.summary))
            .end_row();
    }
    rows.copy(conn, &format!("\"{table}\" ({COLUMNS})")).await?;
    // Streams started at their first event are new rows; the others (an update id's next
    // epoch) replace what is stored.
    let (new, restarted): (Vec<&Changed>, Vec<&Changed>) = changed.iter().partition(|c| c.new);
    let mut rows = CopyText::default();
    for c in &new {
        rows.text(Some(&c.stream))
            .text(c.context.operation_id.as_deref())
            .text(c.context.bot.as_deref())
            .int(c.context.user_id)
            .int(c.context.chat_id)
            .end_row();
    }
    rows.copy(conn, &format!("\"{table}_streams\" ({STREAM_COLUMNS})"))
        .await?;
    if !restarted.is_empty() {
        let sql = format!(
            "INSERT INTO \"{table}_streams\" ({STREAM_COLUMNS}) SELECT * FROM UNNEST($1::text[], \
             $2::text[], $3::text[], $4::bigint[], $5::bigint[]) \
             ON CONFLICT (stream_id) DO UPDATE SET {STREAM_UPDATES}"
        );
        let text =
            |f: fn(&Changed) -> Option<String>| restarted.iter().map(|c| f(c)).collect::<Vec<_>>();
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(text(|c| Some(c.stream.clone())))
            .bind(text(|c| c.context.operation_id.clone()))
            .bind(text(|c| c.context.bot.clone()))
            .bind(
                restarted
                    .iter()
                    .map(|c| c.context.user_id)
                    .collect::<Vec<_>>(),
            )
            .bind(
                restarted
                    .iter()
                    .map(|c| c.context.chat_id)
                    .collect::<Vec<_>>(),
            )
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

fn decode_entry(row: &impl EitherRow) -> Result<AuditEntry, sqlx::Error> {
    let stream_id: String = row.try_get(2)?;
    Ok(AuditEntry {
        position: rows::unsigned(row.try_get::<i64>(0)?, "position")?,
        recorded_at: row.try_get::<Time>(1)?.0,
        category: category(&stream_id).to_owned(),
        stream_id,
        version: rows::unsigned(row.try_get::<i64>(3)?, "version")?,
        event_type: row.try_get(4)?,
        operation_id: row.try_get(5)?,
        bot: row.try_get(6)?,
        user_id: row.try_get(7)?,
        chat_id: row.try_get(8)?,
        actor_kind: row.try_get(9)?,
        actor_id: row.try_get(10)?,
        correlation: row.try_get(11)?,
        summary: row.try_get(12)?,
    })
}

/// A filter of the audit trail: one column equal to a value, or a time range.
enum Filter<'a> {
    Operation(&'a str),
    User(i64),
    Chat(i64),
    Between(DateTime<Utc>, DateTime<Utc>),
}

/// An operation's rows, in two parts: those outside its own stream, by the partial index of
/// operation ids (its predicate repeated verbatim, so that both backends use it); and those of
/// its own stream, the bulk, at the positions of that stream's events, found through the inline
/// operation_status (the stream id) and the ledger's (stream_id, version) index
/// (`projections/audit_trail`). The parts are disjoint: only the operation's stream starts with
/// `op-` and names it.
const BY_OPERATION: &str = "\
    SELECT * FROM \"audit_trail\" \
        WHERE operation_id = $1 AND substr(stream_id, 1, 3) <> 'op-' \
    UNION ALL \
    SELECT * FROM \"audit_trail\" \
        WHERE operation_id = $1 AND position IN (SELECT position FROM events WHERE stream_id = \
            (SELECT stream_id FROM operation_status WHERE operation_id = $1))";

async fn select(
    pool: ReadPool<'_>,
    filter: Filter<'_>,
    limit: u32,
) -> Result<Vec<AuditEntry>, ReadError> {
    let rows = match filter {
        Filter::Operation(_) => format!("({BY_OPERATION}) AS rows"),
        Filter::User(_) => format!("\"{NAME}\" WHERE user_id = $1"),
        Filter::Chat(_) => format!("\"{NAME}\" WHERE chat_id = $1"),
        Filter::Between(..) => {
            format!("\"{NAME}\" WHERE recorded_at >= $1 AND recorded_at < $2")
        }
    };
    let limit_param = if matches!(filter, Filter::Between(..)) {
        "$3"
    } else {
        "$2"
    };
    let sql = format!("SELECT {COLUMNS} FROM {rows} ORDER BY position LIMIT {limit_param}");
    let limit = rows::limit(limit);
    either!(pool, p => {
        let query = sqlx::query(sqlx::AssertSqlSafe(sql));
        let query = match filter {
            Filter::Operation(id) => query.bind(id.to_owned()),
            Filter::User(id) | Filter::Chat(id) => query.bind(id),
            Filter::Between(from, until) => query.bind(Time(from)).bind(Time(until)),
        };
        query
            .bind(limit)
            .try_map(|row| decode_entry(&row))
            .fetch_all(p)
            .await
    })
    .map_err(read_error(NAME))
}

/// One operation's events and the events that name it (the updates that asked for it), oldest
/// first, at most `limit`.
pub async fn by_operation(
    pool: ReadPool<'_>,
    operation_id: &str,
    limit: u32,
) -> Result<Vec<AuditEntry>, ReadError> {
    select(pool, Filter::Operation(operation_id), limit).await
}

/// The events concerning one user, oldest first, at most `limit`.
pub async fn by_user(
    pool: ReadPool<'_>,
    user_id: i64,
    limit: u32,
) -> Result<Vec<AuditEntry>, ReadError> {
    select(pool, Filter::User(user_id), limit).await
}

/// The events concerning one chat, oldest first, at most `limit`.
pub async fn by_chat(
    pool: ReadPool<'_>,
    chat_id: i64,
    limit: u32,
) -> Result<Vec<AuditEntry>, ReadError> {
    select(pool, Filter::Chat(chat_id), limit).await
}

/// The events recorded from `from` (inclusive) until `until` (exclusive), oldest first, at most
/// `limit`.
pub async fn between(
    pool: ReadPool<'_>,
    from: DateTime<Utc>,
    until: DateTime<Utc>,
    limit: u32,
) -> Result<Vec<AuditEntry>, ReadError> {
    select(pool, Filter::Between(from, until), limit).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_summaries_are_cut_at_a_character_boundary() {
        let text = "é".repeat(150);
        let cut = bounded(text);
        assert!(cut.len() <= SUMMARY_MAX + '…'.len_utf8());
        assert!(cut.ends_with('…'));
        assert_eq!(bounded("short".to_owned()), "short");
    }

    #[test]
    fn streams_named_after_a_bot_give_it() {
        assert_eq!(bot_of_stream("quarantine-shop").as_deref(), Some("shop"));
        assert_eq!(bot_of_stream("update-shop-12").as_deref(), Some("shop"));
        assert_eq!(
            bot_of_stream("recent-shop-1-2-coupon").as_deref(),
            Some("shop")
        );
        assert_eq!(bot_of_stream("op-coupon-x"), None);
    }
}
