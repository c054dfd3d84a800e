//! Point-in-time replays: every projection built "as of" a ledger position into a separate
//! SQLite file, for analysts (`opledger replay --until`).
//!
//! The ledger is only read (through a read-only [`LedgerReader`]); the file gets each
//! projection's tables under their canonical names (rendered from the projection's SQLite schema
//! with its own name), filled by the same [`Projection::apply`] the live runner uses, with events
//! `1..=until` applied in pages, one transaction per page, and indexed at the end. A
//! `replay_info` table says what the file is: the position, its hash and time, the source
//! ledger, when it was built and by which projections. While applying, the events' hash chain
//! is checked, so a replay is never built silently from a damaged ledger.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, SecondsFormat, Utc};
use opledger_store::chain::Link;
use opledger_store::inline::ProjectionError;
use opledger_store::verify::{Broken, ChainCheck};
use opledger_store::{LedgerReader, Position, RecordedEvent, StoreError};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection, SqliteConnection};

use crate::projection::{Backend, Conn, Projection, definition_hash};

/// Events applied per transaction.
const PAGE: usize = 2000;

/// What the file's `replay_info` row says besides what the replay computes.
#[derive(Clone, Debug)]
pub struct ReplayInfo {
    /// `--until` as the analyst gave it (a time or a position).
    pub requested: String,
    /// The source ledger's URL, without its password.
    pub source: String,
    /// The version of opledger building the file.
    pub tool_version: String,
    /// Now, from the caller's clock.
    pub built_at: DateTime<Utc>,
}

/// What a replay built.
#[derive(Clone, Debug, PartialEq)]
pub struct Replayed {
    /// The last position applied (the `--until` position).
    pub until: Position,
    /// The hash of the event at `until`.
    pub until_hash: String,
    /// When the event at `until` was recorded.
    pub until_time: DateTime<Utc>,
    /// Events applied: `until`.
    pub events: u64,
    /// Each projection table and its rows, in the projections' order.
    pub tables: Vec<(String, u64)>,
    pub seconds: f64,
}

/// Why a replay failed. The partly built file is the caller's to remove.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("cannot read the ledger: {0}")]
    Read(#[from] StoreError),
    #[error("the ledger ends at position {head}, before position {until}")]
    BeyondHead { until: Position, head: Position },
    #[error("the ledger is damaged: {0}; run `opledger audit verify` for the whole picture")]
    Broken(#[from] Broken),
    #[error("cannot write the replay file: {0}")]
    Write(#[from] sqlx::Error),
    #[error("projection `{name}` cannot apply the events {from}..={to}: {source}")]
    Apply {
        name: &'static str,
        from: Position,
        to: Position,
        #[source]
        source: ProjectionError,
    },
}

/// Builds every projection of `projections` as of position `until` into a new SQLite file at
/// `path` (which must not exist), reading the ledger through `reader`. `progress` is told the
/// last position applied after each page.
pub async fn replay(
    reader: &LedgerReader,
    projections: &[Arc<dyn Projection>],
    until: Position,
    path: &Path,
    info: &ReplayInfo,
    progress: &mut (dyn FnMut(Position) + Send),
) -> Result<Replayed, ReplayError> {
    let started = Instant::now();
    let head = reader.head().await?;
    if until > head.position || until == 0 {
        return Err(ReplayError::BeyondHead {
            until,
            head: head.position,
        });
    }
    let mut file = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        // The file is built once and renamed into place by the caller: no journal to keep it
        // consistent through a crash, and nothing to flush until the end.
        .journal_mode(SqliteJournalMode::Memory)
        .synchronous(SqliteSynchronous::Off)
        .connect()
        .await?;
    // First, so that even a file left half-built by a crash says it is a replay's.
    sqlx::raw_sql(INFO_SCHEMA).execute(&mut file).await?;
    let mut indexes = Vec::new();
    for projection in projections {
        let name = projection.name();
        let (tables, index) = projection.schema().render(Backend::Sqlite, name, name);
        sqlx::raw_sql(sqlx::AssertSqlSafe(tables))
            .execute(&mut file)
            .await?;
        indexes.push(index);
    }

    let mut pages = reader.read_ahead(1, until, PAGE);
    let mut chain = ChainCheck::new();
    let mut last: Option<RecordedEvent> = None;
    while let Some(page) = pages.recv().await {
        let page = page?;
        for event in &page {
            chain.check(event)?;
        }
        let links: Vec<Link<'_>> = page.iter().map(RecordedEvent::link).collect();
        let (from, to) = (page[0].position, page[page.len() - 1].position);
        let mut transaction = file.begin().await?;
        for projection in projections {
            projection
                .apply(Conn::Sqlite(&mut transaction), projection.name(), &links)
                .await
                .map_err(|source| ReplayError::Apply {
                    name: projection.name(),
                    from,
                    to,
                    source,
                })?;
        }
        transaction.commit().await?;
        progress(to);
        last = page.into_iter().last();
    }
    // A ledger cut short between the head read and the pages would end early.
    let last = match last {
        Some(event) if event.position == until => event,
        other => {
            return Err(ReplayError::Broken(Broken::PositionGap {
                expected: other.map_or(1, |e| e.position + 1),
                found: until + 1,
            }));
        }
    };

    for index in indexes {
        sqlx::raw_sql(sqlx::AssertSqlSafe(index))
            .execute(&mut file)
            .await?;
    }
    let mut tables = Vec::new();
    for projection in projections {
        for suffix in projection.tables() {
            let table = format!("{}{suffix}", projection.name());
            let count: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT count(*) FROM \"{table}\""
            )))
            .fetch_one(&mut file)
            .await?;
            tables.push((table, u64::try_from(count).unwrap_or(0)));
        }
    }
    let replayed = Replayed {
        until,
        until_hash: last.hash.to_hex(),
        until_time: last.recorded_at,
        events: chain.checked(),
        tables,
        seconds: started.elapsed().as_secs_f64(),
    };
    write_info(&mut file, projections, &replayed, info).await?;
    file.close().await?;
    Ok(replayed)
}

/// What a file a replay would write is now, so that a replay never writes over a ledger or a
/// file it did not make (`--force` replaces only an earlier replay).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Existing {
    /// Nothing is there.
    Absent,
    /// A file a replay made, finished or left half-built: it has a `replay_info` table.
    Replay,
    /// An opledger ledger: it has a `ledger_head` table.
    Ledger,
    /// Anything else: another SQLite database, a file that is not one, a directory.
    Other,
}

/// Looks at `path` without changing it: the connection is read-only and immutable, so SQLite
/// takes no lock and creates no journal, write-ahead log or shared-memory file beside it.
pub async fn inspect(path: &Path) -> Existing {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Existing::Absent,
        Err(_) => return Existing::Other,
        Ok(_) => {}
    }
    let Ok(mut file) = SqliteConnectOptions::new()
        .filename(path)
        .read_only(true)
        .immutable(true)
        .connect()
        .await
    else {
        return Existing::Other;
    };
    let tables: Result<Vec<String>, _> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table' \
         AND name IN ('ledger_head', 'replay_info')",
    )
    .fetch_all(&mut file)
    .await;
    let _ = file.close().await;
    match tables {
        Ok(tables) if tables.iter().any(|t| t == "ledger_head") => Existing::Ledger,
        Ok(tables) if tables.iter().any(|t| t == "replay_info") => Existing::Replay,
        _ => Existing::Other,
    }
}

const INFO_SCHEMA: &str = "CREATE TABLE replay_info (
    -- The last ledger position applied: the replay shows the read models as of this event.
    until_position   INTEGER NOT NULL,
    -- That event's hash, to check against the ledger (`opledger audit verify --expect-head`).
    until_hash       TEXT    NOT NULL,
    -- When that event was recorded (RFC 3339, UTC).
    until_time       TEXT    NOT NULL,
    -- `--until` as given: a time or a position.
    requested        TEXT    NOT NULL,
    events           INTEGER NOT NULL,
    -- The source ledger's URL, without its password.
    source           TEXT    NOT NULL,
    built_at         TEXT    NOT NULL,
    opledger_version TEXT    NOT NULL,
    -- JSON: each projection's name, code version and definition hash.
    projections      TEXT    NOT NULL
)";

async fn write_info(
    file: &mut SqliteConnection,
    projections: &[Arc<dyn Projection>],
    replayed: &Replayed,
    info: &ReplayInfo,
) -> Result<(), sqlx::Error> {
    let definitions: Vec<serde_json::Value> = projections
        .iter()
        .map(|p| {
            serde_json::json!({
                "name": p.name(),
                "code_version": p.code_version(),
                "definition_hash": definition_hash(p.as_ref(), Backend::Sqlite),
            })
        })
        .collect();
    let time = |t: DateTime<Utc>| t.to_rfc3339_opts(SecondsFormat::Micros, true);
    sqlx::query(
        "INSERT INTO replay_info (until_position, until_hash, until_time, requested, events, \
         source, built_at, opledger_version, projections) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(i64::try_from(replayed.until).unwrap_or(i64::MAX))
    .bind(&replayed.until_hash)
    .bind(time(replayed.until_time))
    .bind(&info.requested)
    .bind(i64::try_from(replayed.events).unwrap_or(i64::MAX))
    .bind(&info.source)
    .bind(time(info.built_at))
    .bind(&info.tool_version)
    .bind(serde_json::Value::Array(definitions).to_string())
    .execute(file)
    .await?;
    Ok(())
}
