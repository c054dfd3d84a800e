//! The SQLite backend: one file, zero setup, the embedded default.
//!
//! One appender task owns the only write connection and commits group-commit batches inside
//! `BEGIN IMMEDIATE` (never a deferred transaction that upgrades its lock). A small pool of
//! `query_only` connections serves reads concurrently thanks to WAL. Other processes may write
//! to the same file too: `BEGIN IMMEDIATE` and the head row serialize them all. Asynchronous
//! read models live in a second file beside it (`read_models.rs`), which readers attach.

use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection, Executor, Row};

use crate::backend::{Either, ReadPool};
use crate::batch::{Plan, Sealed};
use crate::columns::{to_hash, to_i64, to_stream_id, to_u64};
use crate::error::{OpenError, StoreError};
use crate::group_commit::{Appender, BatchOutcome, BatchWriter, GroupCommitOptions};
use crate::inline::InlineProjections;
use crate::ledger_files::LedgerFiles;
use crate::model::{AppendRequest, Appended, Head, StreamId, StreamVersion};
use crate::priority::Priority;
use crate::read;
use crate::read_models;
use crate::store::{EventStore, HeadWatch};

/// The schema migrations of the SQLite backend, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");

/// How hard a commit waits for the disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// `synchronous=FULL`: an acknowledged append survives power loss. The default.
    #[default]
    Full,
    /// `synchronous=NORMAL`: an acknowledged append survives a process crash, but the last
    /// commits may be lost on power loss. Only by explicit choice.
    Normal,
}

/// How to open a SQLite ledger.
#[derive(Clone, Debug)]
pub struct SqliteOptions {
    pub durability: Durability,
    /// How long a writer waits for another process's write lock before reporting
    /// [`StoreError::Unavailable`].
    pub busy_timeout: Duration,
    /// Connections in the read pool.
    pub read_connections: u32,
    pub group_commit: GroupCommitOptions,
    /// Read models updated inside every append transaction.
    pub inline: InlineProjections,
    /// How often the checkpointer copies committed WAL frames into the database file (the
    /// writer never does it in its commits).
    pub checkpoint_interval: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            durability: Durability::Full,
            busy_timeout: Duration::from_secs(5),
            read_connections: 4,
            group_commit: GroupCommitOptions::default(),
            inline: InlineProjections::new(),
            checkpoint_interval: CHECKPOINT_INTERVAL,
        }
    }
}

/// An event store in one SQLite file. Cheap to clone; clones share the appender and the pool.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    readers: SqlitePool,
    projections: SqlitePool,
    /// The one writable connection on the read models' own file (`read_models.rs`).
    read_models: SqlitePool,
    /// This process writes that file unsynced (taken when the store closes).
    unsynced: std::sync::Mutex<Option<read_models::Unsynced>>,
    /// That file as opened, to notice it deleted or replaced.
    read_model_file: read_models::ReadModelFile,
    appender: Appender,
    checkpointer: tokio::task::JoinHandle<()>,
    files: Arc<LedgerFiles>,
    /// A connection open for as long as the store: SQLite deletes the write-ahead log when the
    /// last connection closes, and the files remembered must stay the ledger's own.
    keeper: tokio::sync::Mutex<Option<SqliteConnection>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.checkpointer.abort();
    }
}

impl SqliteStore {
    /// Opens (creating if missing) the ledger at a `sqlite://PATH` URL and applies pending
    /// migrations.
    pub async fn open(url: &str, options: SqliteOptions) -> Result<Self, OpenError> {
        let connect = connect_options(url, &options)?;
        // The writer never checkpoints in its commits (the checkpointer does, beside it), from
        // its first connection on: with SQLite's automatic checkpoints, the commit that crosses
        // 1,000 frames copies the log back and syncs the database file before it returns, a
        // stall of milliseconds for every append waiting behind it.
        let writer_connect = writer_options(connect.clone().pragma("wal_autocheckpoint", "0"));
        let mut writer = writer_connect.connect().await.map_err(open_error)?;
        migrate(&mut writer).await?;
        for projection in &options.inline {
            projection
                .install((&mut writer).into())
                .await
                .map_err(|source| OpenError::Projection {
                    name: projection.name(),
                    source,
                })?;
        }
        let head = read::read_head((&mut writer).into())
            .await
            .map_err(open_error)?;
        let keeper = connect.connect().await.map_err(open_error)?;
        let files = LedgerFiles::remember(connect.get_filename())
            .map(Arc::new)
            .map_err(|e| open_error(sqlx::Error::Io(e)))?;
        let (read_models, read_model_path, unsynced) =
            read_models::open(&connect, &mut writer).await?;
        let attach = Arc::new(read_model_path.clone());
        let read_model_file = read_models::ReadModelFile::remember(read_model_path)
            .map_err(|e| open_error(sqlx::Error::Io(e)))?;
        let readers = SqlitePoolOptions::new()
            .max_connections(options.read_connections.max(1))
            // A connection to a file does not die while idle: sqlx's check before each read
            // would be a hop to the connection's thread and back for nothing.
            .test_before_acquire(false)
            .after_connect(move |connection, _| {
                let attach = Arc::clone(&attach);
                Box::pin(async move {
                    read_models::attach(connection, &attach).await;
                    Ok(())
                })
            })
            .connect_with(
                connect
                    .clone()
                    .create_if_missing(false)
                    .pragma("query_only", "ON"),
            )
            .await
            .map_err(open_error)?;
        // Inline read models' rebuilds write beside the appender: SQLite serializes their
        // transactions with the appender's (`BEGIN IMMEDIATE`, waiting up to `busy_timeout`).
        // Asynchronous ones write in their own file (`read_models`).
        let projections = SqlitePoolOptions::new()
            .max_connections(2)
            .after_release(|connection, _| Box::pin(ended_cleanly(connection)))
            .connect_lazy_with(connect.clone().create_if_missing(false));
        let finish_checkpoint = Arc::new(AtomicBool::new(false));
        let checkpointer = tokio::spawn(checkpoint(
            connect,
            options.checkpoint_interval,
            Arc::clone(&finish_checkpoint),
        ));
        let writer = SqliteWriter {
            connect: writer_connect,
            finish_checkpoint,
            connection: Some(writer),
            inline: options.inline,
            files: Arc::clone(&files),
        };
        let (head, _) = tokio::sync::watch::channel(head.position);
        let appender = Appender::spawn(writer, head, options.group_commit);
        Ok(Self {
            inner: Arc::new(Inner {
                readers,
                projections,
                read_models,
                unsynced: std::sync::Mutex::new(unsynced),
                read_model_file,
                appender,
                checkpointer,
                files,
                keeper: tokio::sync::Mutex::new(Some(keeper)),
            }),
        })
    }

    /// Commits what is queued, then closes the writer and the read pool. Appends after this fail
    /// with [`StoreError::Closed`].
    pub async fn close(&self) {
        self.inner.appender.close().await;
        self.inner.files.close();
        self.inner.checkpointer.abort();
        self.inner.readers.close().await;
        self.inner.projections.close().await;
        let unsynced = self
            .inner
            .unsynced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        read_models::close(&self.inner.read_models, unsynced).await;
        if let Some(keeper) = self.inner.keeper.lock().await.take()
            && let Err(error) = keeper.close().await
        {
            tracing::debug!(%error, "closing the SQLite keeper connection failed");
        }
    }

    /// `Ok` while the ledger's files (database, WAL, shared memory) are still the ones this
    /// store opened; [`StoreError::LedgerFileLost`] once one was deleted or replaced (see
    /// `ledger_files.rs`). Appends check it themselves; readiness probes ask.
    pub fn check_files(&self) -> Result<(), StoreError> {
        self.inner.files.check()
    }

    /// The read pool (`query_only` connections), for read models that live in the same file.
    pub fn reader(&self) -> &SqlitePool {
        &self.inner.readers
    }

    /// The worker's queue reads go to the read pool: SQLite's planner takes the queue's index
    /// without statistics.
    pub fn queue_reader(&self) -> &SqlitePool {
        &self.inner.readers
    }

    /// This process's foreground work (intake) before its background work (the worker, the
    /// read models) on this store; shared by its clones.
    pub fn priority(&self) -> &Priority {
        self.inner.appender.priority()
    }

    /// Where this store's appends spent their time in this process: waiting for their batch,
    /// and its write; shared by its clones.
    pub fn append_timings(&self) -> &crate::AppendTimings {
        self.inner.appender.timings()
    }

    /// A small pool of writable connections on the ledger's file for the read models kept
    /// inside the append transactions (their registration and rebuilds). Never for the
    /// ledger's own tables.
    pub fn projection_pool(&self) -> &SqlitePool {
        &self.inner.projections
    }

    /// The one writable connection on the read models' own file (`read_models.rs`), for the
    /// asynchronous read models: their tables, their checkpoints, their rebuilds.
    pub fn read_model_pool(&self) -> &SqlitePool {
        &self.inner.read_models
    }

    /// `None` while the read models' file is the one this store opened; else its path and how
    /// it was lost. The ledger goes on without it; the read models are rebuilt in a new file at
    /// the next start.
    pub fn read_model_file_lost(&self) -> Option<(&Path, &'static str)> {
        let file = &self.inner.read_model_file;
        file.lost().map(|change| (file.path(), change))
    }

    /// The read pool, for the reads both backends share.
    fn pool(&self) -> ReadPool<'_> {
        Either::Sqlite(&self.inner.readers)
    }
}

/// Whether a connection given back to the projection pool may be used again: only if its last
/// transaction really ended. On a full disk or an I/O error SQLite rolls a transaction back by
/// itself, so the driver's own `ROLLBACK` fails and the driver still counts the transaction as
/// open: every later `BEGIN` on that connection would fail ("non-zero transaction depth") until
/// a restart. Such a connection is closed instead, and the pool opens a fresh one.
pub(crate) async fn ended_cleanly(connection: &mut SqliteConnection) -> Result<bool, sqlx::Error> {
    // The rollback of a transaction dropped without commit is queued on the connection; the
    // ping runs after it.
    connection.ping().await?;
    let open = connection.is_in_transaction();
    if open {
        tracing::debug!("a projection connection's transaction did not end; closing it");
    }
    Ok(!open)
}

/// How often the checkpointer copies committed WAL frames into the database file, by default.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(50);

/// The log's length (in frames, pages of the database) from which the checkpointer has the
/// writer finish its checkpoint, so that the log restarts from its beginning (SQLite's own
/// automatic checkpoints use the same number).
const RESTART_AFTER_FRAMES: i64 = 1_000;

/// The log's length from which the checkpointer stops leaving the restart to the writer and
/// forces it (readers kept the writer from restarting the log): the log [`WAL_SIZE_LIMIT`]
/// keeps at 4 KiB pages.
const FORCE_RESTART_AFTER_FRAMES: i64 = 4 * RESTART_AFTER_FRAMES;

/// A log longer than this (bytes) is cut back to it when it restarts, so that a burst does not
/// keep its disk space for good (four times the log [`RESTART_AFTER_FRAMES`] keeps at 4 KiB pages).
const WAL_SIZE_LIMIT: u64 = 16 * 1024 * 1024;

/// How long a forced restart may hold new writers back while it waits for readers.
const RESTART_WAIT: Duration = Duration::from_millis(200);

/// Checkpoints the WAL beside the writer, so that no append waits for the bulk of it: with
/// SQLite's automatic checkpoints, the commit that crosses the threshold copies every page back
/// and syncs the database file before it returns, a stall of milliseconds for every append
/// behind it. A `PASSIVE` checkpoint on this task's own connection copies the bulk and never
/// blocks writers or readers.
///
/// The log restarts from its beginning only when the writer begins a transaction on a log that
/// is checkpointed completely, and under a steady stream of appends it never is: frames arrive
/// while the checkpoint copies. A `RESTART` checkpoint here would finish the job by holding new
/// writers back until it gets the write lock, waiting with SQLite's busy handler (sleeps of 1,
/// 2, 5, 10 ms...): a stall of ~20 ms for every append, four times a second under load. So once
/// the log is [`RESTART_AFTER_FRAMES`] long, the checkpointer asks the writer to finish
/// (`finish`): between two batches the writer checkpoints the few frames that came since, on
/// its own connection, and its next commit starts the log over, unless a reader was still
/// reading the log's frames then. If readers keep that from happening until the log is
/// [`FORCE_RESTART_AFTER_FRAMES`] long, the checkpointer forces it with `RESTART` (holding new
/// writers back at most [`RESTART_WAIT`]), so that the log stays bounded (after a full disk was
/// freed, it would otherwise grow until the disk is full again). Any failure (a full disk, I/O)
/// drops the connection; the next round opens a new one.
async fn checkpoint(connect: SqliteConnectOptions, interval: Duration, finish: Arc<AtomicBool>) {
    let connect = connect.busy_timeout(RESTART_WAIT);
    let mut connection = None;
    loop {
        tokio::time::sleep(interval).await;
        if connection.is_none() {
            connection = connect.connect().await.ok();
        }
        let Some(open) = connection.as_mut() else {
            continue;
        };
        if let Err(error) = checkpoint_once(open, &finish).await {
            tracing::debug!(%error, "WAL checkpoint failed; reconnecting");
            connection = None;
        }
    }
}

/// One round of [`checkpoint`]: `PASSIVE`; then, if the log is long, the writer is asked to
/// finish, or, if it is very long, `RESTART`.
async fn checkpoint_once(
    connection: &mut SqliteConnection,
    finish: &AtomicBool,
) -> Result<(), sqlx::Error> {
    // (busy, frames in the log, frames checkpointed)
    let (_, frames, _): (i64, i64, i64) = sqlx::query_as("PRAGMA wal_checkpoint(PASSIVE)")
        .fetch_one(&mut *connection)
        .await?;
    if frames >= FORCE_RESTART_AFTER_FRAMES {
        let (busy, frames, done): (i64, i64, i64) =
            sqlx::query_as("PRAGMA wal_checkpoint(RESTART)")
                .fetch_one(&mut *connection)
                .await?;
        if busy != 0 {
            tracing::debug!(
                frames,
                done,
                "the WAL could not be restarted yet; trying again"
            );
        }
    } else if frames >= RESTART_AFTER_FRAMES {
        finish.store(true, Ordering::Release);
    }
    Ok(())
}

/// Applies the embedded migrations to an open connection, mapping "the database has migrations
/// this binary does not know" to [`OpenError::SchemaTooNew`].
async fn migrate(connection: &mut SqliteConnection) -> Result<(), OpenError> {
    use sqlx::migrate::MigrateError;
    // Two processes opening a new file at once race to create the schema; the loser sees the
    // winner's tables and simply retries.
    let mut attempts = 0;
    loop {
        attempts += 1;
        match MIGRATOR.run(&mut *connection).await {
            Ok(()) => return Ok(()),
            Err(MigrateError::VersionMissing(found)) => {
                let known = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
                return Err(OpenError::SchemaTooNew { found, known });
            }
            Err(MigrateError::Execute(source)) if attempts < 3 => {
                tracing::debug!(%source, "migration raced with another process; retrying");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(MigrateError::Execute(source)) => return Err(open_error(source)),
            Err(source) => return Err(OpenError::Migrate { source }),
        }
    }
}

fn connect_options(url: &str, options: &SqliteOptions) -> Result<SqliteConnectOptions, OpenError> {
    if !(url.starts_with("sqlite:")) {
        return Err(OpenError::BadUrl {
            reason: "a SQLite URL starts with sqlite://".into(),
        });
    }
    if url.contains(":memory:") || url.contains("mode=memory") {
        return Err(OpenError::BadUrl {
            reason: "an in-memory database would lose the ledger on exit".into(),
        });
    }
    let connect = SqliteConnectOptions::from_str(url).map_err(|e| OpenError::BadUrl {
        reason: e.to_string(),
    })?;
    Ok(connect
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(match options.durability {
            Durability::Full => SqliteSynchronous::Full,
            Durability::Normal => SqliteSynchronous::Normal,
        })
        .busy_timeout(options.busy_timeout)
        .pragma("journal_size_limit", WAL_SIZE_LIMIT.to_string())
        .foreign_keys(true))
}

/// What every connection that writes a batch of rows needs beside the ledger's options: its
/// statement journals in memory. A statement that writes many rows inside a transaction (an
/// append's events, a read model's page) keeps the prior content of each page it changes, so
/// that it can undo itself alone; past 64 KiB SQLite spills that journal to a temporary file,
/// an unlinked file on disk that costs a write call per page and is thrown away at the end of
/// the statement (under the load benchmark, as many bytes as the log itself).
pub(crate) fn writer_options(connect: SqliteConnectOptions) -> SqliteConnectOptions {
    connect.pragma("temp_store", "memory")
}

/// SQLite's primary result code of a database error (the low byte of the extended code).
fn primary_code(error: &sqlx::Error) -> Option<i32> {
    let code = error.as_database_error()?.code()?;
    code.parse::<i32>().ok().map(|c| c & 0xff)
}

const SQLITE_BUSY: i32 = 5;
const SQLITE_LOCKED: i32 = 6;
const SQLITE_NOMEM: i32 = 7;
const SQLITE_READONLY: i32 = 8;
const SQLITE_IOERR: i32 = 10;
const SQLITE_CORRUPT: i32 = 11;
const SQLITE_FULL: i32 = 13;
const SQLITE_CANTOPEN: i32 = 14;
const SQLITE_NOTADB: i32 = 26;

pub(crate) fn open_error(source: sqlx::Error) -> OpenError {
    match primary_code(&source) {
        Some(SQLITE_READONLY) => OpenError::ReadOnly { source },
        Some(SQLITE_CORRUPT | SQLITE_NOTADB) => OpenError::NotALedger { source },
        _ => OpenError::Unreachable { source },
    }
}

/// Whether a database error means "retry later" (busy, locked, I/O, full disk, gone) rather than
/// a bug or corruption.
pub(crate) fn retryable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(_) => matches!(
            primary_code(error),
            Some(
                SQLITE_BUSY
                    | SQLITE_LOCKED
                    | SQLITE_NOMEM
                    | SQLITE_READONLY
                    | SQLITE_IOERR
                    | SQLITE_FULL
                    | SQLITE_CANTOPEN
            )
        ),
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        _ => false,
    }
}

/// Sorts a database error into "retry later" and "bug or corruption".
pub(crate) fn classify(operation: &'static str, error: sqlx::Error) -> StoreError {
    if retryable(&error) {
        StoreError::unavailable(operation, error)
    } else {
        StoreError::storage(operation, error)
    }
}

impl EventStore for SqliteStore {
    async fn append(&self, requests: Vec<AppendRequest>) -> Result<Appended, StoreError> {
        self.inner.appender.append(requests).await
    }

    read::event_store_reads!(self => self.pool());

    fn subscribe(&self) -> HeadWatch {
        self.inner.appender.subscribe()
    }
}

/// The appender's side of the SQLite backend: the one write connection.
struct SqliteWriter {
    connect: SqliteConnectOptions,
    /// `None` after an error: the next batch reconnects, so a broken connection heals itself,
    /// and closing it rolls back whatever the failed batch had begun.
    connection: Option<SqliteConnection>,
    inline: InlineProjections,
    files: Arc<LedgerFiles>,
    /// Set by the checkpointer when the log is long: the writer checkpoints what came since
    /// its last round, so that its next commit restarts the log ([`checkpoint`]).
    finish_checkpoint: Arc<AtomicBool>,
}

impl BatchWriter for SqliteWriter {
    async fn write(&mut self, calls: &[Vec<AppendRequest>]) -> Result<BatchOutcome, StoreError> {
        // Never write into a file that is no longer the ledger, nor acknowledge a batch that
        // went into one (deleted or replaced while it committed).
        self.files.check()?;
        let connection = match &mut self.connection {
            Some(connection) => connection,
            None => {
                let connection = self
                    .connect
                    .connect()
                    .await
                    .map_err(|e| classify("reconnecting the writer", e))?;
                self.connection.insert(connection)
            }
        };
        let result = write_batch(connection, &self.inline, calls).await;
        if result.is_err() {
            // The transaction may be open; dropping the connection rolls it back.
            self.connection = None;
        }
        let outcome = result?;
        self.files.check()?;
        Ok(outcome)
    }

    async fn between_batches(&mut self) {
        if !self.finish_checkpoint.swap(false, Ordering::AcqRel) {
            return;
        }
        let Some(connection) = self.connection.as_mut() else {
            return;
        };
        // A failure (a full disk, I/O) leaves the log as it was: the checkpointer asks again.
        if let Err(error) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
            .execute(connection)
            .await
        {
            tracing::debug!(%error, "the writer's checkpoint failed");
        }
    }

    async fn close(mut self) {
        if let Some(connection) = self.connection.take()
            && let Err(error) = connection.close().await
        {
            tracing::warn!(%error, "closing the SQLite writer failed");
        }
    }
}

impl std::fmt::Debug for SqliteWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteWriter")
            .field("connected", &self.connection.is_some())
            .finish_non_exhaustive()
    }
}

/// Round trip 1 of a batch: take the write lock, read the touched streams' versions (`?1`: a
/// JSON array of stream ids) and the ledger head with the database clock. Rows are tagged 0
/// (stream) and 1 (head).
///
/// `recorded_at` is the database clock in microseconds (SQLite's clock has millisecond
/// resolution), never below the previous append's, so time never goes back along positions.
const BEGIN_AND_READ: &str = "\
    BEGIN IMMEDIATE; \
    SELECT 0, stream_id, version FROM streams \
        WHERE stream_id IN (SELECT value FROM json_each(?1)); \
    SELECT 1, last_position, last_hash, \
        MAX(updated_at, CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000) \
        FROM ledger_head WHERE ledger_id = 1";

/// Round trip 2: write stream versions (`?1`), events (`?2`) and the new head, then commit. Rows
/// travel as JSON arrays so that the statement text, and thus the prepared statements, never
/// change with the batch size; payload and metadata travel as JSON strings and are stored as the
/// exact bytes appended. The arrays are expanded by `jsonb_each`, which parses them once: with
/// `json_each` every `->>` parsed its row's text again, payload included. If any statement
/// fails, the rest (COMMIT included) does not run.
const WRITE_AND_COMMIT: &str = "\
    INSERT INTO streams (stream_id, stream_type, version, created_at) \
        SELECT value ->> 0, value ->> 1, value ->> 2, ?3 FROM jsonb_each(?1) WHERE true \
        ON CONFLICT (stream_id) DO UPDATE SET version = excluded.version; \
    INSERT INTO events (position, stream_id, version, event_id, event_type, schema_version, \
                        payload, metadata, recorded_at, prev_hash, hash) \
        SELECT value ->> 0, value ->> 1, value ->> 2, unhex(value ->> 3), value ->> 4, value ->> 5, \
               CAST(value ->> 6 AS BLOB), CAST(value ->> 7 AS BLOB), ?3, \
               unhex(value ->> 8), unhex(value ->> 9) \
        FROM jsonb_each(?2); \
    UPDATE ledger_head SET last_position = ?4, last_hash = unhex(?5), updated_at = ?3 \
        WHERE ledger_id = 1; \
    COMMIT";

/// One group-commit batch in one `BEGIN IMMEDIATE` transaction and two round trips to the
/// database: read the touched streams' versions and the head, decide every call, seal the
/// accepted events onto the chain, write and commit.
async fn write_batch(
    connection: &mut SqliteConnection,
    inline: &InlineProjections,
    calls: &[Vec<AppendRequest>],
) -> Result<BatchOutcome, StoreError> {
    let streams: Vec<&str> = crate::batch::streams_of(calls)
        .into_iter()
        .map(StreamId::as_str)
        .collect();
    let streams = serde_json::to_string(&streams).expect("a list of strings serializes");
    let rows = sqlx::query(BEGIN_AND_READ)
        .bind(streams)
        .fetch_all(&mut *connection)
        .await
        .map_err(|e| classify("reading stream versions", e))?;
    let (current, head, recorded_at) =
        decode_versions_and_head(&rows).map_err(|e| classify("reading stream versions", e))?;

    let plan = Plan::decide(calls, &current);
    if plan.event_count() == 0 {
        connection
            .execute("ROLLBACK")
            .await
            .map_err(|e| classify("ending an append", e))?;
        return Ok(BatchOutcome {
            results: plan.into_rejections(),
            head: None,
        });
    }
    let sealed = plan.seal(head, recorded_at);
    if !inline.is_empty() {
        let events: Vec<_> = sealed.rows.iter().map(|row| row.link).collect();
        for projection in inline {
            projection
                .apply(Either::Sqlite(&mut *connection), &events)
                .await
                .map_err(|e| crate::inline::failed(projection.name(), e, retryable))?;
        }
    }
    let side = crate::attachments::of(calls, &sealed.results);
    crate::attachments::write(Either::Sqlite(&mut *connection), &side)
        .await
        .map_err(|e| classify("writing attachments", e))?;
    let (streams, events) = encode_rows(&sealed);
    sqlx::query(WRITE_AND_COMMIT)
        .bind(streams)
        .bind(events)
        .bind(recorded_at)
        .bind(to_i64(sealed.new_head.position))
        .bind(sealed.new_head.hash.to_hex())
        .execute(&mut *connection)
        .await
        .map_err(|e| classify("writing and committing an append", e))?;
    Ok(BatchOutcome {
        results: sealed.results,
        head: Some(sealed.new_head.position),
    })
}

type VersionsAndHead = (HashMap<StreamId, StreamVersion>, Head, i64);

fn decode_versions_and_head(rows: &[SqliteRow]) -> Result<VersionsAndHead, sqlx::Error> {
    let mut current = HashMap::with_capacity(rows.len());
    let mut head = None;
    for row in rows {
        let tag: i64 = row.try_get(0)?;
        if tag == 0 {
            let stream = to_stream_id(row.try_get(1)?)?;
            current.insert(stream, to_u64(row.try_get(2)?, "version")?);
        } else {
            let hash: Vec<u8> = row.try_get(2)?;
            let position = Head {
                position: to_u64(row.try_get(1)?, "last_position")?,
                hash: to_hash(&hash, "last_hash")?,
            };
            head = Some((position, row.try_get::<i64, _>(3)?));
        }
    }
    let (head, recorded_at) = head.ok_or(sqlx::Error::RowNotFound)?;
    Ok((current, head, recorded_at))
}

/// The batch's stream versions and events as the JSON arrays `WRITE_AND_COMMIT` unpacks.
fn encode_rows(sealed: &Sealed<'_>) -> (String, String) {
    let streams: Vec<(&str, &str, StreamVersion)> = sealed
        .streams
        .iter()
        .map(|w| (w.stream.as_str(), w.stream.category(), w.after))
        .collect();
    let events: Vec<_> = sealed
        .rows
        .iter()
        .map(|row| {
            let link = &row.link;
            (
                link.position,
                link.stream_id,
                link.version,
                hex::encode(row.event_id.as_bytes()),
                link.event_type,
                link.schema_version,
                utf8(link.payload),
                utf8(link.metadata),
                row.prev_hash.to_hex(),
                row.hash.to_hex(),
            )
        })
        .collect();
    (
        serde_json::to_string(&streams).expect("stream rows serialize"),
        serde_json::to_string(&events).expect("event rows serialize"),
    )
}

/// Payload and metadata come from `RawValue`s, which are valid JSON and thus valid UTF-8.
fn utf8(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).expect("raw JSON is UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked() {
        let options = SqliteOptions::default();
        assert!(matches!(
            connect_options("mysql://x", &options),
            Err(OpenError::BadUrl { .. })
        ));
        assert!(matches!(
            connect_options("sqlite::memory:", &options),
            Err(OpenError::BadUrl { .. })
        ));
        assert!(connect_options("sqlite://ledger.db", &options).is_ok());
    }

    /// The writer leaves checkpoints to the checkpointer from its very first connection: with
    /// the checkpointer held off, a log far past SQLite's automatic threshold (1,000 frames)
    /// still holds every frame. (The first connection once kept SQLite's default, and every
    /// commit that crossed the threshold copied the log back and synced the database file
    /// while the appends behind it waited: a stall every ~70 ms at 1,700 updates/s.)
    #[tokio::test]
    async fn the_writer_never_checkpoints_in_its_commits() {
        use crate::model::{ExpectedVersion, NewEvent};
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("ledger.db");
        let options = SqliteOptions {
            checkpoint_interval: Duration::from_secs(3600),
            ..SqliteOptions::default()
        };
        let store = SqliteStore::open(&format!("sqlite://{}", path.display()), options)
            .await
            .expect("open");
        for n in 0..600 {
            let stream = StreamId::new(format!("s-{n}")).expect("stream id");
            let event = NewEvent::new("Tested", 1, crate::empty_object());
            store
                .append(vec![AppendRequest::new(
                    stream,
                    ExpectedVersion::NoStream,
                    vec![event],
                )])
                .await
                .expect("append");
        }
        let mut connection = SqliteConnectOptions::new()
            .filename(&path)
            .connect()
            .await
            .expect("connect");
        let (_, frames, _): (i64, i64, i64) = sqlx::query_as("PRAGMA wal_checkpoint(PASSIVE)")
            .fetch_one(&mut connection)
            .await
            .expect("checkpoint");
        assert!(
            frames > 2 * RESTART_AFTER_FRAMES,
            "the log was checkpointed and restarted by the writer: {frames} frames"
        );
        store.close().await;
    }

    /// The connections that write batches of rows keep their statement journals in memory
    /// (`writer_options`): the read models' writer here, whose pages of thousands of rows
    /// spilled them to temporary files on disk.
    #[tokio::test]
    async fn the_read_models_writer_keeps_its_statement_journals_in_memory() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
        let store = SqliteStore::open(&url, SqliteOptions::default())
            .await
            .expect("open");
        let temp_store: i64 = sqlx::query_scalar("PRAGMA temp_store")
            .fetch_one(store.read_model_pool())
            .await
            .expect("read temp_store");
        assert_eq!(temp_store, 2, "MEMORY");
        store.close().await;
    }

    /// The read models' file is written unsynced (`synchronous=OFF`, read_models.rs) while a
    /// marker with the machine's boot id says so beside it; a clean close syncs it and removes
    /// the marker.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn the_read_models_file_is_written_unsynced_under_a_marker_until_a_synced_close() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
        let markers = || {
            std::fs::read_dir(dir.path())
                .expect("list the folder")
                .map(|entry| entry.expect("an entry").path())
                .filter(|path| {
                    path.file_name()
                        .is_some_and(|n| n.to_string_lossy().contains("-unsynced-"))
                })
                .collect::<Vec<_>>()
        };
        let store = SqliteStore::open(&url, SqliteOptions::default())
            .await
            .expect("open");
        let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(store.read_model_pool())
            .await
            .expect("read synchronous");
        assert_eq!(synchronous, 0, "OFF");
        let written = markers();
        assert_eq!(written.len(), 1, "{written:?}");
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").expect("boot id");
        assert_eq!(
            std::fs::read_to_string(&written[0]).expect("read the marker"),
            boot.trim()
        );
        sqlx::query("CREATE TABLE written (x)")
            .execute(store.read_model_pool())
            .await
            .expect("write the read models' file");
        store.close().await;
        assert_eq!(
            markers(),
            Vec::<std::path::PathBuf>::new(),
            "the marker goes at a synced close"
        );
        let wal = dir.path().join("ledger.read-models.db-wal");
        assert!(
            std::fs::metadata(&wal).ok().is_none_or(|m| m.len() == 0),
            "nothing left in the log"
        );
    }

    /// The bundled SQLite is built as `.cargo/config.toml` asks (`LIBSQLITE3_FLAGS`): without
    /// the memory statistics and the shared page cache, both behind one process-wide mutex that
    /// every connection's thread took for each allocation and each page (bench/README.md).
    #[tokio::test]
    async fn sqlite_is_built_without_its_process_wide_allocation_locks() {
        let mut connection = SqliteConnectOptions::from_str("sqlite::memory:")
            .expect("an in-memory database")
            .connect()
            .await
            .expect("open it");
        let options: Vec<String> = sqlx::query_scalar("PRAGMA compile_options")
            .fetch_all(&mut connection)
            .await
            .expect("read the compile options");
        assert!(
            options.iter().any(|o| o == "DEFAULT_MEMSTATUS=0"),
            "{options:?}"
        );
        assert!(
            !options.iter().any(|o| o == "ENABLE_MEMORY_MANAGEMENT"),
            "{options:?}"
        );
    }
}
