//! The PostgreSQL backend: one ledger shared by several opledger instances.
//!
//! The same guarantees as SQLite, on a server where many processes append at once. Each process has
//! one appender task (group commit) on a dedicated connection.
//!
//! A batch is decided in memory on what the writer's last batches told it (the head, the versions
//! of the streams they touched): the accepted events are sealed onto the hash chain and handed to
//! `opledger_append` (migrations 3 and 4, `postgres/assumed.rs`, ADR 0015), which locks the
//! touched streams that exist, in sorted order, then the head row, checks that knowledge and
//! writes. Without inline read models or attachments that call is the whole transaction: one
//! round trip. When the knowledge is stale (another instance appended), nothing is written and
//! the batch is decided again on what the function found.
//!
//! The locking path does the same in four round trips, reading before it decides: `BEGIN`; one
//! statement that takes the same locks and reads the versions and the head; the decision (a loser
//! is rejected before any position is allocated); one statement that creates the new streams,
//! moves the others, inserts the events, moves the head and notifies; `COMMIT`. It serves a
//! writer's first batch, knowledge that stays stale, and every batch whose calls would all be
//! rejected, so a conflict is only ever answered from versions read under the locks.
//!
//! Every writer takes stream locks before the head, and creates or moves streams only while
//! holding the head, so there is no deadlock, and what a writer reads after taking the head stays
//! true until it commits. Positions are allocated under the head lock, so they are gapless and in
//! commit order, and a reader that remembers the last position it saw never skips an event (the
//! trap that sequence-based stores fall into).
//! `LISTEN/NOTIFY` wakes readers; they still read by position.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions, PgRow};
use sqlx::{ConnectOptions, Connection, Row};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::backend::{Either, ReadPool};
use crate::batch::{Plan, Sealed};
use crate::columns::{to_hash, to_i64, to_stream_id, to_u64};
use crate::error::{OpenError, StoreError};
use crate::group_commit::{Appender, BatchOutcome, BatchWriter, GroupCommitOptions, advance};
use crate::inline::{InlineProjections, PgQuery};
use crate::model::{AppendRequest, Appended, Head, Position, StreamId, StreamVersion};
use crate::priority::Priority;
use crate::read;
use crate::store::{EventStore, HeadWatch};

mod assumed;

/// The schema migrations of the PostgreSQL backend, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");

/// The channel on which every append announces the new head position.
const CHANNEL: &str = "opledger_events";

/// How to open a PostgreSQL ledger.
#[derive(Clone, Debug)]
pub struct PgOptions {
    /// Connections in the read pool.
    pub read_connections: u32,
    /// Connections for asynchronous read models: one per projection runner holds its advisory
    /// lock, plus their transactions.
    pub projection_connections: u32,
    /// How long an append waits for a lock held by another instance before it fails with
    /// [`StoreError::Unavailable`] (`SET LOCAL lock_timeout`).
    pub lock_timeout: Duration,
    /// How long to wait for a connection (connecting, or from the read pool).
    pub connect_timeout: Duration,
    /// Shown in `pg_stat_activity`, so operators can tell opledger's connections apart.
    pub application_name: String,
    pub group_commit: GroupCommitOptions,
    /// Read models updated inside every append transaction.
    pub inline: InlineProjections,
}

impl Default for PgOptions {
    fn default() -> Self {
        Self {
            read_connections: 8,
            projection_connections: 8,
            lock_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(10),
            application_name: "opledger".to_owned(),
            group_commit: GroupCommitOptions::default(),
            inline: InlineProjections::new(),
        }
    }
}

/// An event store in one PostgreSQL database. Cheap to clone; clones share the appender, the
/// read pools and the listener.
#[derive(Clone, Debug)]
pub struct PgStore {
    inner: Arc<Inner>,
    /// Where this handle reads: the store's pools, or for a handle from
    /// [`PgStore::for_background`] pools of its own.
    reads: Reads,
}

#[derive(Debug)]
struct Inner {
    projections: PgPool,
    appender: Appender,
    listener: JoinHandle<()>,
    /// How to open another handle's read pools ([`PgStore::for_background`]).
    reads: ReadOptions,
    /// Every handle's read pools, the store's first: closed with the store.
    opened: std::sync::Mutex<Vec<Reads>>,
}

/// A handle's read pools.
#[derive(Clone, Debug)]
struct Reads {
    readers: PgPool,
    queue: PgPool,
}

impl Reads {
    /// Pools that open their connections when first asked, on the runtime that asks.
    fn lazy(options: &ReadOptions) -> Reads {
        Reads {
            readers: read_pool(options.max, options.acquire_timeout)
                .connect_lazy_with(options.readers.clone()),
            queue: Reads::queue(options),
        }
    }

    /// The worker's queue reads: two connections, opened when first asked.
    fn queue(options: &ReadOptions) -> PgPool {
        read_pool(2, options.acquire_timeout).connect_lazy_with(options.queue.clone())
    }

    async fn close(&self) {
        self.readers.close().await;
        self.queue.close().await;
    }
}

/// What [`Reads`] connect with.
#[derive(Debug)]
struct ReadOptions {
    readers: PgConnectOptions,
    queue: PgConnectOptions,
    max: u32,
    acquire_timeout: Duration,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

impl PgStore {
    /// Opens the ledger at a `postgres://` URL and applies pending migrations (the migrator takes
    /// an advisory lock, so instances starting together do not race).
    pub async fn open(url: &str, options: PgOptions) -> Result<Self, OpenError> {
        let connect = connect_options(url, &options)?;
        let mut setup = tokio::time::timeout(options.connect_timeout, connect.connect())
            .await
            .map_err(|_| OpenError::Unreachable {
                source: sqlx::Error::PoolTimedOut,
            })?
            .map_err(open_error)?;
        migrate(&mut setup).await?;
        for projection in &options.inline {
            projection
                .install((&mut setup).into())
                .await
                .map_err(|source| OpenError::Projection {
                    name: projection.name(),
                    source,
                })?;
        }
        let head = read::read_head((&mut setup).into())
            .await
            .map_err(open_error)?;
        // Readers plan each query for its parameters and the ledger's current size: a generic
        // plan cached while the ledger was small (scan and sort every event) would otherwise
        // outlive the growth, since nothing guarantees an ANALYZE to invalidate it. These
        // queries are simple; planning them costs little.
        let read_options = ReadOptions {
            readers: connect
                .clone()
                .options([("plan_cache_mode", "force_custom_plan")]),
            queue: connect.clone().options(queue_settings()),
            max: options.read_connections.max(1),
            acquire_timeout: options.connect_timeout,
        };
        let readers = read_pool(read_options.max, read_options.acquire_timeout)
            .connect_with(read_options.readers.clone())
            .await
            .map_err(open_error)?;
        // The worker's queue reads (`due`, `next_due`: up to a few rows through a partial index
        // on `due_at`) are planned once per session on their index, like the writer's
        // statements: custom plans made before the table's first ANALYZE (its first minute, and
        // every benchmark) scanned and sorted all of its rows at every look, finished ones
        // included.
        let reads = Reads {
            readers,
            queue: Reads::queue(&read_options),
        };
        // Asynchronous read models write on their own connections (transactions, and a session
        // advisory lock per projection runner), never on the readers'.
        let projections = PgPoolOptions::new()
            .max_connections(options.projection_connections.max(2))
            .acquire_timeout(options.connect_timeout)
            .connect_lazy_with(connect.clone());
        let (head, _) = watch::channel(head.position);
        let listener = tokio::spawn(listen(connect.clone(), head.clone()));
        let settings = writer_settings(options.lock_timeout);
        let writer_connect = connect
            .clone()
            .options(settings.iter().map(|(name, value)| (*name, value.as_str())));
        // The connection that migrated (without the writer's settings, so that instances
        // starting together wait for each other's migration as long as it takes) is done: the
        // writer connects on the appender's own runtime, whose reactor then wakes it when an
        // answer arrives (`group_commit`, ADR 0022).
        if let Err(error) = setup.close().await {
            tracing::debug!(%error, "closing the migration's connection failed");
        }
        let writer = PgWriter {
            connect: writer_connect,
            connection: None,
            planners: assumed::Planners::of(&options.inline),
            inline: options.inline,
            known: assumed::Known::default(),
            last_used: Instant::now(),
        };
        let appender = Appender::spawn_on_own_thread(writer, head, options.group_commit)
            .map_err(|e| open_error(sqlx::Error::Io(e)))?;
        Ok(Self {
            inner: Arc::new(Inner {
                projections,
                appender,
                listener,
                reads: read_options,
                opened: std::sync::Mutex::new(vec![reads.clone()]),
            }),
            reads,
        })
    }

    /// Commits what is queued, then closes the writer, the listener and every handle's read
    /// pools. Appends after this fail with [`StoreError::Closed`].
    pub async fn close(&self) {
        self.inner.appender.close().await;
        self.inner.listener.abort();
        let opened = self
            .inner
            .opened
            .lock()
            .map(|o| o.clone())
            .unwrap_or_default();
        for reads in opened {
            reads.close().await;
        }
        self.inner.projections.close().await;
    }

    /// The read pool, for read models that live in the same database.
    pub fn reader(&self) -> &PgPool {
        &self.reads.readers
    }

    /// The same ledger, whose reads (the read pool's and the queue's) go through connections
    /// of its own, opened as it first needs them: a handle for work that runs on a runtime of
    /// its own (the read models on a thread below the service, ADRs 0023, 0024). A
    /// socket is woken by the reactor of the runtime that opened it, so a connection such work
    /// opened in a shared pool would make the service's reads wait for that thread, and fail
    /// once its runtime stopped. Give each such runtime a handle of its own; its clones share
    /// its pools. Appends and the projection pool are the store's.
    pub fn for_background(&self) -> PgStore {
        let reads = Reads::lazy(&self.inner.reads);
        if let Ok(mut opened) = self.inner.opened.lock() {
            opened.push(reads.clone());
        }
        PgStore {
            inner: Arc::clone(&self.inner),
            reads,
        }
    }

    /// Read-only connections for the worker's queue: which operations are due, and when the
    /// next one will be. Their plans stay on the queue's index (see [`queue_settings`]).
    pub fn queue_reader(&self) -> &PgPool {
        &self.reads.queue
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

    /// Connections for read models kept outside the append transactions (asynchronous
    /// projections, rebuilds, their advisory locks). Never for the ledger's own tables.
    pub fn projection_pool(&self) -> &PgPool {
        &self.inner.projections
    }

    /// The read pool, for the reads both backends share.
    fn pool(&self) -> ReadPool<'_> {
        Either::Postgres(&self.reads.readers)
    }
}

fn connect_options(url: &str, options: &PgOptions) -> Result<PgConnectOptions, OpenError> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(OpenError::BadUrl {
            reason: "a PostgreSQL URL starts with postgres://".into(),
        });
    }
    let connect = PgConnectOptions::from_str(url).map_err(|e| OpenError::BadUrl {
        reason: redacted_reason(&e),
    })?;
    Ok(connect
        .application_name(&options.application_name)
        // Appends are durable when acknowledged, whatever the server's default says.
        .options([("synchronous_commit", "on")]))
}

/// sqlx's URL errors may quote the URL, password included; keep only the kind of problem.
pub(crate) fn redacted_reason(error: &sqlx::Error) -> String {
    match error {
        sqlx::Error::Configuration(source) => {
            let text = source.to_string();
            if text.contains('@') {
                "the URL could not be parsed".to_owned()
            } else {
                text
            }
        }
        _ => "the URL could not be parsed".to_owned(),
    }
}

async fn migrate(connection: &mut PgConnection) -> Result<(), OpenError> {
    use sqlx::migrate::MigrateError;
    match MIGRATOR.run(&mut *connection).await {
        Ok(()) => Ok(()),
        Err(MigrateError::VersionMissing(found)) => {
            let known = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
            Err(OpenError::SchemaTooNew { found, known })
        }
        Err(MigrateError::Execute(source)) => Err(open_error(source)),
        Err(source) => Err(OpenError::Migrate { source }),
    }
}

/// The SQLSTATE of a database error.
fn sqlstate(error: &sqlx::Error) -> Option<String> {
    Some(error.as_database_error()?.code()?.into_owned())
}

pub(crate) fn open_error(source: sqlx::Error) -> OpenError {
    match sqlstate(&source).as_deref() {
        // read_only_sql_transaction: a standby, or default_transaction_read_only.
        Some("25006") => OpenError::ReadOnly { source },
        _ => OpenError::Unreachable { source },
    }
}

/// Whether a database error means "retry later" rather than a bug or corruption.
fn retryable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(_) => sqlstate(error).is_some_and(|code| {
            // 08: connection exception; 53: insufficient resources; 57P0x: shutdown, restart,
            // terminated backend; 58: system (I/O) error; 55P03: lock_timeout; 40001/40P01:
            // serialization failure, deadlock; 25006: read-only (a standby after failover).
            code.starts_with("08")
                || code.starts_with("53")
                || code.starts_with("57P")
                || code.starts_with("58")
                || matches!(code.as_str(), "55P03" | "40001" | "40P01" | "25006")
        }),
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        // A connection killed mid-message surfaces as a protocol error.
        sqlx::Error::Protocol(_) => true,
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

impl EventStore for PgStore {
    async fn append(&self, requests: Vec<AppendRequest>) -> Result<Appended, StoreError> {
        self.inner.appender.append(requests).await
    }

    read::event_store_reads!(self => self.pool());

    fn subscribe(&self) -> HeadWatch {
        self.inner.appender.subscribe()
    }
}

/// Follows `NOTIFY opledger_events` (sent by every instance's appends) and moves the known
/// head forward. A notification is only a hint: when the connection drops, notifications are
/// lost until it is back, and readers fall back on polling by position.
async fn listen(connect: PgConnectOptions, head: watch::Sender<Position>) {
    loop {
        let mut listener = match PgListener::connect_with(
            &PgPoolOptions::new()
                .max_connections(1)
                .connect_lazy_with(connect.clone()),
        )
        .await
        {
            Ok(listener) => listener,
            Err(error) => {
                tracing::debug!(%error, "cannot connect the notification listener; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Err(error) = listener.listen(CHANNEL).await {
            tracing::debug!(%error, "cannot LISTEN; retrying");
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        loop {
            match listener.try_recv().await {
                Ok(Some(notification)) => {
                    if let Ok(position) = notification.payload().parse::<Position>() {
                        advance(&head, position);
                    }
                }
                // The connection was lost and re-established: notifications may be missing.
                Ok(None) => {}
                Err(error) => {
                    tracing::debug!(%error, "notification listener failed; reconnecting");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    break;
                }
            }
        }
    }
}

/// The appender's side of the PostgreSQL backend: one dedicated write connection.
struct PgWriter {
    connect: PgConnectOptions,
    /// `None` after an error: the next batch reconnects, and dropping the broken connection rolls
    /// back whatever the failed batch had begun.
    connection: Option<PgConnection>,
    inline: InlineProjections,
    /// What the last batches told this writer, which the next one assumes.
    known: assumed::Known,
    /// The inline read models' planners, which put their writes in the append's statement.
    planners: assumed::Planners,
    /// When the connection last answered.
    last_used: Instant,
}

impl std::fmt::Debug for PgWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgWriter")
            .field("connected", &self.connection.is_some())
            .finish_non_exhaustive()
    }
}

impl PgWriter {
    /// One try on the writer's connection (a new one if it has none): on what the writer knows
    /// if it can (`postgres/assumed.rs`), else locking and reading first.
    async fn write_once(
        &mut self,
        calls: &[Vec<AppendRequest>],
    ) -> Result<BatchOutcome, BatchError> {
        let connection = match &mut self.connection {
            Some(connection) => connection,
            None => {
                let connection = self
                    .connect
                    .connect()
                    .await
                    .map_err(|e| BatchError::Failed(classify("reconnecting the writer", e)))?;
                self.connection.insert(connection)
            }
        };
        if let Some(outcome) = assumed::write(
            connection,
            &mut self.known,
            &self.inline,
            &mut self.planners,
            calls,
        )
        .await?
        {
            return Ok(outcome);
        }
        write_batch(connection, &mut self.known, &self.inline, calls).await
    }

    /// The connection died while committing, so the batch may or may not be committed. Asks a
    /// new connection whether the batch's last event is there with its hash: then every caller
    /// gets its success; if it is not, nothing was written and they get `Unavailable`. If the
    /// server cannot be asked, the outcome stays unknown (see [`StoreError::Unavailable`]).
    async fn confirm_commit(
        &mut self,
        error: StoreError,
        outcome: BatchOutcome,
        last: Head,
    ) -> Result<BatchOutcome, StoreError> {
        let check = async {
            let mut connection = self.connect.connect().await?;
            let hash: Option<Vec<u8>> =
                sqlx::query_scalar("SELECT hash FROM events WHERE position = $1")
                    .bind(to_i64(last.position))
                    .fetch_optional(&mut connection)
                    .await?;
            Ok::<_, sqlx::Error>((connection, hash))
        };
        match check.await {
            Ok((connection, hash)) => {
                self.connection = Some(connection);
                if hash.as_deref() == Some(&last.hash.as_bytes()[..]) {
                    tracing::info!(
                        position = last.position,
                        "a commit whose answer was lost did commit"
                    );
                    Ok(outcome)
                } else {
                    Err(error)
                }
            }
            Err(check_error) => {
                tracing::warn!(
                    %error, %check_error,
                    "the connection died while committing and the outcome could not be checked"
                );
                Err(StoreError::unavailable(
                    "committing an append (outcome unknown: the commit may have happened)",
                    check_error,
                ))
            }
        }
    }
}

impl BatchWriter for PgWriter {
    async fn write(&mut self, calls: &[Vec<AppendRequest>]) -> Result<BatchOutcome, StoreError> {
        // A connection that sat idle may have died meanwhile (a restarted server, a proxy's
        // timeout). A batch whose one call is its commit could not tell that from a lost
        // answer, so such a connection is asked first.
        if let Some(connection) = &mut self.connection
            && self.last_used.elapsed() > IDLE_CHECK
            && connection.ping().await.is_err()
        {
            self.connection = None;
        }
        let reused = self.connection.is_some();
        let mut result = self.write_once(calls).await;
        // The batch failed at its first statement, before anything was sent that could take
        // effect: it is worth one more try on a new connection.
        if reused && matches!(&result, Err(BatchError::NotStarted(_))) {
            self.connection = None;
            result = self.write_once(calls).await;
        }
        match result {
            Ok(outcome) => {
                self.last_used = Instant::now();
                Ok(outcome)
            }
            Err(BatchError::Failed(error) | BatchError::NotStarted(error)) => {
                self.connection = None;
                self.known.forget_head();
                Err(error)
            }
            Err(BatchError::CommitUnknown {
                error,
                outcome,
                last,
            }) => {
                self.connection = None;
                self.known.forget_head();
                self.confirm_commit(error, outcome, last).await
            }
        }
    }

    async fn close(mut self) {
        if let Some(connection) = self.connection.take()
            && let Err(error) = connection.close().await
        {
            tracing::warn!(%error, "closing the PostgreSQL writer failed");
        }
    }
}

/// Locks the touched streams that exist, in sorted (byte) order, then the head row, and returns
/// the streams' versions (rows tagged 0) and the head with the time this batch's events record
/// (tagged 1: the database clock, never earlier than the previous append's). `UNION ALL` runs its
/// branches in order, so every writer takes stream locks before the head: no deadlock. If the
/// head was held by another instance, the head row read is the one it committed.
const LOCK: &str = "\
    SELECT 0 AS tag, s.stream_id, s.version, NULL::bytea AS hash, NULL::timestamptz AS at \
    FROM (SELECT stream_id, version FROM streams WHERE stream_id = ANY($1) \
          ORDER BY stream_id FOR UPDATE) AS s \
    UNION ALL \
    SELECT 1, NULL, h.last_position, h.last_hash, greatest(h.updated_at, clock_timestamp()) \
    FROM (SELECT last_position, last_hash, updated_at FROM ledger_head WHERE ledger_id = 1 \
          FOR UPDATE) AS h";

/// Creates the new streams, moves the existing ones to their new versions, inserts the events,
/// moves the head to the last event and its hash, and announces the new head: one statement,
/// one round trip.
/// Returns how many streams it created: fewer than asked means another instance created one
/// after this batch looked, so the batch's decisions are stale and it is rolled back and redone.
const WRITE: &str = "\
    WITH created AS ( \
        INSERT INTO streams (stream_id, stream_type, version, created_at) \
        SELECT n.stream_id, n.stream_type, n.version, $11 \
        FROM unnest($12::text[], $13::text[], $14::bigint[]) AS n(stream_id, stream_type, version) \
        ON CONFLICT (stream_id) DO NOTHING \
        RETURNING 1 \
    ), moved AS ( \
        UPDATE streams SET version = v.version \
        FROM unnest($15::text[], $16::bigint[]) AS v(stream_id, version) \
        WHERE streams.stream_id = v.stream_id \
    ), new_events AS ( \
        INSERT INTO events (position, stream_id, version, event_id, event_type, schema_version, \
                            payload, metadata, recorded_at, prev_hash, hash) \
        SELECT e.position, e.stream_id, e.version, e.event_id, e.event_type, e.schema_version, \
               e.payload, e.metadata, $11, e.prev_hash, e.hash \
        FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::uuid[], $5::text[], $6::int4[], \
                    $7::bytea[], $8::bytea[], $9::bytea[], $10::bytea[]) \
             AS e(position, stream_id, version, event_id, event_type, schema_version, \
                  payload, metadata, prev_hash, hash) \
    ), sealed AS ( \
        UPDATE ledger_head SET last_position = $18, last_hash = $17, updated_at = $11 \
        WHERE ledger_id = 1 \
    ) \
    SELECT (SELECT count(*) FROM created), pg_notify('opledger_events', $18::bigint::text)";

/// How many times a batch is redone when another instance created one of its new streams
/// between the batch's look and its write.
const REDO_LIMIT: usize = 5;

/// The longest a writer's connection sits idle before a batch checks that it still answers: a
/// batch that is one statement cannot tell a connection that died while idle (a restarted
/// server) from a lost answer. Under load batches follow each other closer than this and pay
/// nothing; a sparse one pays a round trip.
const IDLE_CHECK: Duration = Duration::from_millis(50);

/// One group-commit batch in one transaction that locks and reads before it decides: begin,
/// lock the existing streams and read their versions, decide every call, advance the head,
/// write, commit. What it read and wrote goes into `known`.
async fn write_batch(
    connection: &mut PgConnection,
    known: &mut assumed::Known,
    inline: &InlineProjections,
    calls: &[Vec<AppendRequest>],
) -> Result<BatchOutcome, BatchError> {
    let streams = crate::batch::streams_of(calls);
    let ids: Vec<&str> = streams.iter().map(|s| s.as_str()).collect();
    for _ in 0..REDO_LIMIT {
        sqlx::raw_sql("BEGIN")
            .execute(&mut *connection)
            .await
            .map_err(|e| BatchError::NotStarted(classify("starting an append", e)))?;
        let rows = sqlx::query(LOCK)
            .bind(&ids)
            .fetch_all(&mut *connection)
            .await
            .map_err(|e| classify("locking streams and the head", e))?;
        let (current, head, recorded_at) =
            decode_lock(&rows).map_err(|e| classify("locking streams and the head", e))?;
        let read = streams.iter().map(|&s| {
            let version = current.get(s).copied().unwrap_or(0);
            (s.clone(), version)
        });
        known.learn(head, recorded_at, recorded_at, read);

        let plan = Plan::decide(calls, &current);
        if plan.event_count() == 0 {
            rollback(connection).await?;
            return Ok(BatchOutcome {
                results: plan.into_rejections(),
                head: None,
            });
        }

        let sealed = plan.seal(head, recorded_at.timestamp_micros());
        let columns = Columns::of(&sealed);
        let query = columns.bind_events(sqlx::query(WRITE)).bind(recorded_at);
        let written = columns
            .bind_streams(query)
            .bind(&sealed.new_head.hash.as_bytes()[..])
            .bind(to_i64(sealed.new_head.position))
            .fetch_one(&mut *connection)
            .await
            .and_then(|row| row.try_get::<i64, _>(0));
        let created = match written {
            Ok(created) => created,
            Err(error) if created_elsewhere(&error) => -1,
            Err(error) => return Err(classify("writing events", error).into()),
        };
        if created != columns.created_id.len() as i64 {
            // Another instance created one of these streams after this batch looked (its
            // snapshot predates that commit): the decisions are stale, so decide again.
            rollback(connection).await?;
            continue;
        }
        if !inline.is_empty() {
            let events: Vec<_> = sealed.rows.iter().map(|row| row.link).collect();
            for projection in inline {
                projection
                    .apply(Either::Postgres(&mut *connection), &events)
                    .await
                    .map_err(|e| crate::inline::failed(projection.name(), e, retryable))?;
            }
        }
        let side = crate::attachments::of(calls, &sealed.results);
        crate::attachments::write(Either::Postgres(&mut *connection), &side)
            .await
            .map_err(|e| classify("writing attachments", e))?;

        let last = sealed.new_head;
        let written = sealed.streams.iter().map(|w| (w.stream.clone(), w.after));
        known.learn(last, recorded_at, recorded_at, written);
        let outcome = BatchOutcome {
            results: sealed.results,
            head: Some(last.position),
        };
        return commit(connection, outcome, last).await;
    }
    Err(BatchError::Failed(StoreError::unavailable(
        "appending",
        Contended {
            attempts: REDO_LIMIT,
        },
    )))
}

/// A unique violation on a stream's versions: the batch wrote an event at a version that another
/// instance committed after this batch read the stream.
fn created_elsewhere(error: &sqlx::Error) -> bool {
    error.as_database_error().is_some_and(|e| {
        e.code().as_deref() == Some("23505")
            && matches!(
                e.constraint(),
                Some("events_stream_id_version_key" | "streams_pkey")
            )
    })
}

/// Commits the batch's transaction; a lost answer leaves its outcome unknown.
async fn commit(
    connection: &mut PgConnection,
    outcome: BatchOutcome,
    last: Head,
) -> Result<BatchOutcome, BatchError> {
    match sqlx::raw_sql("COMMIT").execute(&mut *connection).await {
        Ok(_) => Ok(outcome),
        Err(error) => match classify("committing an append", error) {
            error @ StoreError::Unavailable { .. } => Err(BatchError::CommitUnknown {
                error,
                outcome,
                last,
            }),
            error => Err(BatchError::Failed(error)),
        },
    }
}

async fn rollback(connection: &mut PgConnection) -> Result<(), StoreError> {
    sqlx::raw_sql("ROLLBACK")
        .execute(connection)
        .await
        .map(|_| ())
        .map_err(|e| classify("ending an append", e))
}

/// Other instances kept creating this batch's new streams between its look and its write.
#[derive(Debug, thiserror::Error)]
#[error("other instances created the same new streams {attempts} times in a row")]
struct Contended {
    attempts: usize,
}

/// How a batch failed: at its very first statement (nothing sent that could take effect),
/// before its commit (nothing written), or while committing (unknown).
enum BatchError {
    NotStarted(StoreError),
    Failed(StoreError),
    CommitUnknown {
        error: StoreError,
        outcome: BatchOutcome,
        last: Head,
    },
}

impl From<StoreError> for BatchError {
    fn from(error: StoreError) -> Self {
        BatchError::Failed(error)
    }
}

/// What [`LOCK`] read: the existing streams' versions, the head, and the batch's `recorded_at`.
type Locked = (HashMap<StreamId, StreamVersion>, Head, DateTime<Utc>);

fn decode_lock(rows: &[PgRow]) -> Result<Locked, sqlx::Error> {
    let mut versions = HashMap::with_capacity(rows.len());
    let mut head = None;
    for row in rows {
        if row.try_get::<i32, _>(0)? == 0 {
            let stream = to_stream_id(row.try_get(1)?)?;
            versions.insert(stream, to_u64(row.try_get(2)?, "version")?);
        } else {
            let position = Head {
                position: to_u64(row.try_get(2)?, "last_position")?,
                hash: to_hash(&row.try_get::<Vec<u8>, _>(3)?, "last_hash")?,
            };
            head = Some((position, row.try_get(4)?));
        }
    }
    let (head, recorded_at) = head.ok_or(sqlx::Error::RowNotFound)?;
    Ok((versions, head, recorded_at))
}

/// The batch's events and streams as one array per column, for `unnest`.
struct Columns<'a> {
    position: Vec<i64>,
    stream_id: Vec<&'a str>,
    version: Vec<i64>,
    event_id: Vec<uuid::Uuid>,
    event_type: Vec<&'a str>,
    schema_version: Vec<i32>,
    payload: Vec<&'a [u8]>,
    metadata: Vec<&'a [u8]>,
    prev_hash: Vec<&'a [u8]>,
    hash: Vec<&'a [u8]>,
    /// The streams the batch creates: id, category, version.
    created_id: Vec<&'a str>,
    created_type: Vec<&'a str>,
    created_version: Vec<i64>,
    /// The existing streams it moves, and their new versions.
    moved_id: Vec<&'a str>,
    moved_version: Vec<i64>,
}

impl<'a> Columns<'a> {
    fn of(sealed: &'a Sealed<'a>) -> Self {
        let n = sealed.rows.len();
        let mut columns = Columns {
            position: Vec::with_capacity(n),
            stream_id: Vec::with_capacity(n),
            version: Vec::with_capacity(n),
            event_id: Vec::with_capacity(n),
            event_type: Vec::with_capacity(n),
            schema_version: Vec::with_capacity(n),
            payload: Vec::with_capacity(n),
            metadata: Vec::with_capacity(n),
            prev_hash: Vec::with_capacity(n),
            hash: Vec::with_capacity(n),
            created_id: Vec::new(),
            created_type: Vec::new(),
            created_version: Vec::new(),
            moved_id: Vec::new(),
            moved_version: Vec::new(),
        };
        for row in &sealed.rows {
            let link = &row.link;
            columns.position.push(to_i64(link.position));
            columns.stream_id.push(link.stream_id);
            columns.version.push(to_i64(link.version));
            columns.event_id.push(row.event_id);
            columns.event_type.push(link.event_type);
            columns.schema_version.push(
                i32::try_from(link.schema_version).expect("validated to fit in an integer column"),
            );
            columns.payload.push(link.payload);
            columns.metadata.push(link.metadata);
            columns.prev_hash.push(&row.prev_hash.as_bytes()[..]);
            columns.hash.push(&row.hash.as_bytes()[..]);
        }
        for stream in &sealed.streams {
            if stream.before == 0 {
                columns.created_id.push(stream.stream.as_str());
                columns.created_type.push(stream.stream.category());
                columns.created_version.push(to_i64(stream.after));
            } else {
                columns.moved_id.push(stream.stream.as_str());
                columns.moved_version.push(to_i64(stream.after));
            }
        }
        columns
    }

    /// Binds the ten event columns, in the order the statements unnest them.
    fn bind_events<'q>(&'q self, query: PgQuery<'q>) -> PgQuery<'q> {
        query
            .bind(&self.position)
            .bind(&self.stream_id)
            .bind(&self.version)
            .bind(&self.event_id)
            .bind(&self.event_type)
            .bind(&self.schema_version)
            .bind(&self.payload)
            .bind(&self.metadata)
            .bind(&self.prev_hash)
            .bind(&self.hash)
    }

    /// Binds the created streams' three columns, then the moved streams' two.
    fn bind_streams<'q>(&'q self, query: PgQuery<'q>) -> PgQuery<'q> {
        query
            .bind(&self.created_id)
            .bind(&self.created_type)
            .bind(&self.created_version)
            .bind(&self.moved_id)
            .bind(&self.moved_version)
    }
}

/// The writer connection's session settings (ADR 0015).
///
/// Every statement the writer runs (the append function's, the inline read models') finds its
/// rows through a primary key or a unique index. `enable_seqscan = off` keeps a plan on that
/// index path whatever the tables' sizes were when it was made, so plans can be made once per
/// session: `force_generic_plan`, where the default would plan most statements again at every
/// call (about 8% of the writer backend's CPU, ~20% of an append at one caller).
fn writer_settings(lock_timeout: Duration) -> [(&'static str, String); 3] {
    [
        ("lock_timeout", format!("{}ms", lock_timeout.as_millis())),
        ("enable_seqscan", "off".to_owned()),
        ("plan_cache_mode", "force_generic_plan".to_owned()),
    ]
}

/// The worker's queue connections: read-only, and planned like the writer (index paths, one
/// plan per statement and session), since their statements find a few rows through the queue's
/// partial index, which is the right plan at every size of the table.
fn queue_settings() -> [(&'static str, &'static str); 3] {
    [
        ("default_transaction_read_only", "on"),
        ("enable_seqscan", "off"),
        ("plan_cache_mode", "force_generic_plan"),
    ]
}

/// A read pool's options: `max` connections, each checked only after it idled long enough to
/// have died meanwhile.
fn read_pool(max: u32, acquire_timeout: Duration) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(acquire_timeout)
        // sqlx asks every connection it hands out whether it still answers: a round trip
        // before each read. Only one idle long enough to have died meanwhile (a restarted
        // server) is asked, like the writer's; one that fails is closed, another taken.
        .test_before_acquire(false)
        .before_acquire(|connection, meta| {
            Box::pin(async move {
                if meta.idle_for > IDLE_CHECK {
                    connection.ping().await?;
                }
                Ok(true)
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_without_echoing_passwords() {
        let options = PgOptions::default();
        assert!(matches!(
            connect_options("sqlite://x.db", &options),
            Err(OpenError::BadUrl { .. })
        ));
        assert!(connect_options("postgres://app@127.0.0.1:5432/ledger", &options).is_ok());
        let bad = connect_options("postgres://app:hunter2@127.0.0.1:notaport/x", &options);
        let message = bad.unwrap_err().to_string();
        assert!(!message.contains("hunter2"), "{message}");
    }

    #[test]
    fn the_writer_plans_once_per_session_on_index_paths() {
        let settings = writer_settings(Duration::from_millis(250));
        let value = |name: &str| {
            settings
                .iter()
                .find(|(setting, _)| *setting == name)
                .map(|(_, value)| value.as_str())
        };
        assert_eq!(value("plan_cache_mode"), Some("force_generic_plan"));
        assert_eq!(value("enable_seqscan"), Some("off"));
        assert_eq!(value("lock_timeout"), Some("250ms"));
    }
}
