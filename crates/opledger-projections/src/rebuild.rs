//! Blue/green rebuilds and targeted rebuilds of one stream.
//!
//! A whole rebuild builds version N of a projection into `name@vN` tables from position 0 while
//! the active version keeps serving: it folds pages under the new version's own checkpoint
//! (compare-and-set, like the runner), reading the next page while it applies the current one;
//! creates the indexes once caught up; then flips in one transaction: it applies the last events
//! up to the head, drops the old version's tables, renames the new ones to the projection's
//! name and marks the old version retired and the new one active. For an inline projection
//! (`operation_status`, kept by the store inside every append) the flip holds the ledger's write
//! lock, so no append lands between the last event applied and the flip; it is kept short by
//! catching up to within a page of the head first.
//!
//! A targeted rebuild repairs one stream in the live tables: in one transaction that holds the
//! checkpoint row (and, for an inline projection, the ledger's write lock), it forgets what the
//! stream contributed and applies the stream's events again up to the checkpoint.
//!
//! See `docs/adr/0008-blue-green-projections.md`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use opledger_store::{
    AnyStore, Either, EventStore, OwnedConn, RecordedEvent, StreamId, Txn, either,
};
use tokio::sync::mpsc;

use crate::db::{self, quoted};
use crate::error::ProjectorError;
use crate::projection::{Backend, Conn, Projection, definition_hash};
use crate::registry::{self, RegistryError, State, index_prefix, table_name};

/// How a rebuild runs.
#[derive(Clone, Debug)]
pub struct RebuildOptions {
    /// Events per page (one transaction each).
    pub page_size: usize,
    /// Who is rebuilding, recorded in the registry's `runner` column.
    pub runner: String,
    /// How close to the head the rebuild gets before it flips: the events left are applied
    /// inside the flip, under the ledger's write lock for an inline projection.
    pub flip_gap: u64,
}

impl Default for RebuildOptions {
    fn default() -> Self {
        Self {
            page_size: 20_000,
            runner: crate::runner::default_runner_id(),
            flip_gap: 500,
        }
    }
}

/// What a rebuild is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Applying pages from position 0.
    Folding,
    /// Creating the indexes on the filled tables.
    Indexing,
    /// Applying the last events and swapping the tables.
    Flipping,
}

/// A rebuild's progress, reported after every page.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    pub phase: Phase,
    /// The last position applied.
    pub position: u64,
    /// The ledger's head, as last read.
    pub head: u64,
    /// Events applied by this run.
    pub events: u64,
    pub elapsed: Duration,
}

impl Progress {
    /// Events applied per second so far.
    pub fn events_per_sec(&self) -> f64 {
        let seconds = self.elapsed.as_secs_f64();
        if seconds > 0.0 {
            self.events as f64 / seconds
        } else {
            0.0
        }
    }
}

/// What a finished rebuild did.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RebuildReport {
    pub projection: String,
    /// The version now active.
    pub version: u32,
    /// Events applied (from position 0, or from where an interrupted rebuild stopped).
    pub events: u64,
    /// The head position the new version reflects at the flip.
    pub position: u64,
    pub seconds: f64,
    pub events_per_sec: f64,
}

/// Rebuilds `projection` blue/green (see the module documentation) and returns once the new
/// version is active. `progress` is called after every page.
///
/// A rebuild interrupted by a crash or a shutdown leaves its `building` version; the next
/// rebuild of the same definition resumes it where it stopped.
pub async fn rebuild(
    store: &AnyStore,
    projection: &dyn Projection,
    options: &RebuildOptions,
    progress: &(dyn Fn(&Progress) + Send + Sync),
) -> Result<RebuildReport, ProjectorError> {
    let started = Instant::now();
    let pool = db::pool_for(store, projection);
    registry::install(pool).await?;
    crate::runner::register(store, projection, &options.runner).await?;
    let mut conn = OwnedConn::detach(pool).await?;
    let result = rebuild_on(&mut conn, store, projection, options, progress, started).await;
    if let Err(error) = conn.close().await {
        tracing::debug!(%error, "closing a projection connection failed");
    }
    result
}

async fn rebuild_on(
    conn: &mut OwnedConn,
    store: &AnyStore,
    projection: &dyn Projection,
    options: &RebuildOptions,
    progress: &(dyn Fn(&Progress) + Send + Sync),
    started: Instant,
) -> Result<RebuildReport, ProjectorError> {
    let name = projection.name();
    let backend = conn.backend();
    // One rebuild per projection at a time among PostgreSQL instances: a session lock held
    // until this connection closes (a crashed rebuild's lock goes with its connection).
    if let Either::Postgres(c) = conn {
        let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, hashtext($2))")
            .bind(REBUILD_LOCK_CLASS)
            .bind(name)
            .fetch_one(&mut *c)
            .await?;
        if !got {
            return Err(ProjectorError::RebuildRunning {
                name: name.to_owned(),
            });
        }
    }
    // Read models are disposable, so their rebuild need not wait for the disk on every page:
    // a crash loses at most the last pages, and their checkpoint with them.
    let relaxed = match backend {
        Backend::Sqlite => "PRAGMA synchronous = NORMAL",
        Backend::Postgres => "SET synchronous_commit = off",
    };
    raw(conn.conn(), relaxed).await?;
    let hash = definition_hash(projection, backend);
    let (version, start) = begin_version(conn, projection, &hash, &options.runner).await?;
    let table = table_name(name, version, State::Building);
    let mut state = Fold {
        name,
        version,
        table: &table,
        position: start,
        events: 0,
        head: store.head().await?.position,
        head_read: Instant::now(),
        started,
    };
    tracing::info!(
        projection = name,
        version,
        from = start,
        head = state.head,
        "rebuilding"
    );

    // Fold from the checkpoint, reading the next page while applying this one.
    let (pages, mut received) = mpsc::channel(1);
    let reader = AbortOnDrop(tokio::spawn(read_ahead(
        store.clone(),
        start + 1,
        options.page_size,
        pages,
    )));
    while let Some(page) = received.recv().await {
        let page = page?;
        state
            .apply(conn, projection, &page, &options.runner)
            .await?;
        state.report(store, Phase::Folding, progress).await?;
    }
    drop(reader);

    // Indexes, once the rows are in (faster than maintaining them row by row).
    let (_, indexes) = projection
        .schema()
        .render(backend, &table, &index_prefix(name, version));
    state.report(store, Phase::Indexing, progress).await?;
    {
        let mut txn = db::begin_on(conn.conn()).await?;
        if registry::hold(txn.conn(), name, version, State::Building)
            .await?
            .is_none_or(|at| at != state.position)
        {
            return Err(state.superseded());
        }
        let indexes = idempotent_indexes(&indexes);
        if !indexes.trim().is_empty() {
            raw(txn.conn(), &indexes).await?;
        }
        txn.commit().await?;
    }

    // Catch up to within `flip_gap` of the head, with the indexes in place.
    loop {
        let head = store.head().await?.position;
        if head.saturating_sub(state.position) <= options.flip_gap {
            break;
        }
        let page = read_page(store, state.position + 1, options.page_size).await?;
        if page.is_empty() {
            break;
        }
        state
            .apply(conn, projection, &page, &options.runner)
            .await?;
        state.report(store, Phase::Folding, progress).await?;
    }

    state.report(store, Phase::Flipping, progress).await?;
    let mut attempt = 0;
    let position = loop {
        match flip(conn, store, projection, &mut state, options).await {
            // It gave way to appends (see `flip`): try again, a little later each time.
            Err(error) if gave_way(&error) && attempt < FLIP_ATTEMPTS => {
                attempt += 1;
                tracing::debug!(projection = name, attempt, "the flip gave way to appends");
                tokio::time::sleep(Duration::from_millis(10 * attempt)).await;
            }
            result => break result?,
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    tracing::info!(
        projection = name,
        version,
        position,
        seconds,
        "rebuilt and flipped"
    );
    Ok(RebuildReport {
        projection: name.to_owned(),
        version,
        events: state.events,
        position,
        seconds,
        events_per_sec: if seconds > 0.0 {
            state.events as f64 / seconds
        } else {
            0.0
        },
    })
}

/// The first key of the session advisory lock a rebuild holds on PostgreSQL.
const REBUILD_LOCK_CLASS: i32 = registry::LOCK_CLASS + 2;

/// A rebuild in progress.
struct Fold<'a> {
    name: &'a str,
    version: u32,
    table: &'a str,
    position: u64,
    events: u64,
    head: u64,
    head_read: Instant,
    started: Instant,
}

impl Fold<'_> {
    async fn apply(
        &mut self,
        conn: &mut OwnedConn,
        projection: &dyn Projection,
        page: &[RecordedEvent],
        runner: &str,
    ) -> Result<(), ProjectorError> {
        let mut txn = db::begin_on(conn.conn()).await?;
        let applied = apply_page(
            &mut txn,
            projection,
            self.table,
            self.version,
            State::Building,
            self.position,
            page,
            runner,
        )
        .await?;
        let Some(position) = applied else {
            return Err(self.superseded());
        };
        txn.commit().await?;
        self.events += position - self.position;
        self.position = position;
        Ok(())
    }

    async fn report(
        &mut self,
        store: &AnyStore,
        phase: Phase,
        progress: &(dyn Fn(&Progress) + Send + Sync),
    ) -> Result<(), ProjectorError> {
        if self.head_read.elapsed() >= Duration::from_secs(1) || self.position > self.head {
            self.head = store.head().await?.position;
            self.head_read = Instant::now();
        }
        progress(&Progress {
            phase,
            position: self.position,
            head: self.head.max(self.position),
            events: self.events,
            elapsed: self.started.elapsed(),
        });
        Ok(())
    }

    fn superseded(&self) -> ProjectorError {
        ProjectorError::Superseded {
            name: self.name.to_owned(),
            version: self.version,
        }
    }
}

/// Starts version N (tables without indexes, a `building` row at position 0), or resumes the
/// `building` version of the same definition that an earlier rebuild left; a `building` version
/// of another definition is discarded. Returns the version and its position.
async fn begin_version(
    conn: &mut OwnedConn,
    projection: &dyn Projection,
    hash: &str,
    runner: &str,
) -> Result<(u32, u64), ProjectorError> {
    let name = projection.name();
    let backend = conn.backend();
    let mut txn = db::begin_on(conn.conn()).await?;
    registry::lock_registry(txn.conn()).await?;
    let rows = registry::select(txn.conn(), Some(name)).await?;
    if let Some(building) = rows.iter().find(|r| r.state == State::Building) {
        if building.definition_hash == hash {
            txn.commit().await?;
            return Ok((building.version, building.position));
        }
        registry::set_state(
            txn.conn(),
            name,
            building.version,
            State::Building,
            State::Retired,
            runner,
        )
        .await?;
        drop_tables(txn.conn(), projection, &building.table()).await?;
    }
    let version = registry::last_version(txn.conn(), name).await? + 1;
    let table = table_name(name, version, State::Building);
    drop_tables(txn.conn(), projection, &table).await?;
    let (tables, _) = projection
        .schema()
        .render(backend, &table, &index_prefix(name, version));
    raw(txn.conn(), &tables).await?;
    registry::insert(
        txn.conn(),
        &registry::NewRow {
            name,
            version,
            state: State::Building,
            inline: projection.inline(),
            definition_hash: hash,
            position: 0,
            runner,
        },
    )
    .await?;
    txn.commit().await?;
    Ok((version, 0))
}

/// How many times a flip that gave way to appends is tried again before the rebuild fails.
const FLIP_ATTEMPTS: u64 = 50;

/// How long a flip of an inline projection on PostgreSQL waits for any lock before it gives
/// way: far below the server's `deadlock_timeout`, so an append is never the one chosen.
const FLIP_LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '100ms'";

/// Whether a flip failed because it waited too long for a lock (`lock_not_available`).
fn gave_way(error: &ProjectorError) -> bool {
    let database = match error {
        ProjectorError::Database(e) | ProjectorError::Registry(RegistryError::Database(e)) => e,
        _ => return false,
    };
    database
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "55P03")
}

/// The flip: in one transaction, apply the events left up to the head (holding the ledger's
/// write lock for an inline projection), retire the active version and drop its tables, rename
/// the new version's tables to the projection's name, and mark it active. Returns the position
/// the new active version reflects.
///
/// On PostgreSQL an inline projection's live tables are locked before the ledger's head, in the
/// order an append that writes them in its own statement takes them (ADR 0016). An append that
/// took the head first (in a transaction) may then wait for the tables the flip holds: the flip
/// waits at most [`FLIP_LOCK_TIMEOUT`] for any lock, gives way, and is tried again.
async fn flip(
    conn: &mut OwnedConn,
    store: &AnyStore,
    projection: &dyn Projection,
    state: &mut Fold<'_>,
    options: &RebuildOptions,
) -> Result<u64, ProjectorError> {
    let name = projection.name();
    let runner = options.runner.as_str();
    let mut txn = db::begin_on(conn.conn()).await?;
    let postgres_inline = projection.inline() && txn.conn().backend() == Backend::Postgres;
    if postgres_inline {
        raw(txn.conn(), FLIP_LOCK_TIMEOUT).await?;
    }
    registry::lock_registry(txn.conn()).await?;
    if postgres_inline {
        lock_live_tables(txn.conn(), projection, name).await?;
    }
    // (An asynchronous projection's file has no ledger head: any head read now will do, its
    // runner goes on from wherever the flip leaves it.)
    let head = if projection.inline() {
        registry::lock_ledger(txn.conn()).await?
    } else {
        store.head().await?.position
    };
    // With the write lock held no append commits, so reading the events left through the
    // store's readers sees them all.
    let mut position = state.position;
    let mut events = 0;
    while position < head {
        let limit = usize::try_from(head - position)
            .unwrap_or(usize::MAX)
            .min(options.page_size);
        let page = read_page(store, position + 1, limit).await?;
        if page.is_empty() {
            break;
        }
        let Some(at) = apply_page(
            &mut txn,
            projection,
            state.table,
            state.version,
            State::Building,
            position,
            &page,
            runner,
        )
        .await?
        else {
            return Err(state.superseded());
        };
        events += at - position;
        position = at;
    }
    if registry::hold(txn.conn(), name, state.version, State::Building)
        .await?
        .is_none_or(|at| at != position)
    {
        return Err(state.superseded());
    }
    let rows = registry::select(txn.conn(), Some(name)).await?;
    if let Some(active) = rows.iter().find(|r| r.state == State::Active) {
        // Locks the old version's row first (as its runner's page transactions do), then its
        // tables, so a runner mid-page finishes before they go.
        registry::set_state(
            txn.conn(),
            name,
            active.version,
            State::Active,
            State::Retired,
            runner,
        )
        .await?;
    }
    drop_tables(txn.conn(), projection, name).await?;
    for suffix in projection.tables() {
        let sql = format!(
            "ALTER TABLE {} RENAME TO {}",
            quoted(&format!("{}{suffix}", state.table)),
            quoted(&format!("{name}{suffix}"))
        );
        raw(txn.conn(), &sql).await?;
    }
    if !registry::set_state(
        txn.conn(),
        name,
        state.version,
        State::Building,
        State::Active,
        runner,
    )
    .await?
    {
        return Err(state.superseded());
    }
    txn.commit().await?;
    state.position = position;
    state.events += events;
    Ok(position)
}

/// Locks the live tables of `projection` (those that exist) against every other use until the
/// transaction ends.
async fn lock_live_tables(
    conn: Conn<'_>,
    projection: &dyn Projection,
    name: &str,
) -> Result<(), ProjectorError> {
    let Conn::Postgres(c) = conn else {
        return Ok(());
    };
    for suffix in projection.tables() {
        let table = quoted(&format!("{name}{suffix}"));
        let exists: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
            .bind(&table)
            .fetch_one(&mut *c)
            .await?;
        if exists.is_some() {
            let lock = format!("LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE");
            sqlx::raw_sql(sqlx::AssertSqlSafe(lock))
                .execute(&mut *c)
                .await?;
        }
    }
    Ok(())
}

/// What a targeted rebuild did.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StreamRebuild {
    pub projection: String,
    pub version: u32,
    pub stream: String,
    /// The stream's events applied again.
    pub events: u64,
    /// The checkpoint they were applied up to.
    pub position: u64,
}

/// Rebuilds what one stream contributed to the active version of `projection`: in one
/// transaction holding its checkpoint row (and the ledger's write lock, for an inline one),
/// forgets the stream and applies its events again up to the checkpoint. Refused
/// ([`ProjectorError::WholeOnly`]) for a projection that aggregates across streams.
pub async fn rebuild_stream(
    store: &AnyStore,
    projection: &dyn Projection,
    stream: &StreamId,
) -> Result<StreamRebuild, ProjectorError> {
    let name = projection.name();
    let pool = db::pool_for(store, projection);
    let mut txn = db::begin(pool).await?;
    if projection
        .forget_stream(txn.conn(), name, stream.as_str())
        .is_none()
    {
        return Err(ProjectorError::WholeOnly {
            name: name.to_owned(),
        });
    }
    let head = if projection.inline() {
        Some(registry::lock_ledger(txn.conn()).await?)
    } else {
        None
    };
    let rows = registry::select(txn.conn(), Some(name))
        .await
        .or_else(|e| match e {
            registry::RegistryError::Database(e) if db::missing_table(&e) => Ok(Vec::new()),
            e => Err(e),
        })?;
    let Some(active) = rows.into_iter().find(|r| r.state == State::Active) else {
        return Err(ProjectorError::NotRegistered {
            name: name.to_owned(),
        });
    };
    let Some(at) = registry::hold(txn.conn(), name, active.version, State::Active).await? else {
        return Err(ProjectorError::Superseded {
            name: name.to_owned(),
            version: active.version,
        });
    };
    let position = head.unwrap_or(at);
    let Some(forget) = projection.forget_stream(txn.conn(), name, stream.as_str()) else {
        return Err(ProjectorError::WholeOnly {
            name: name.to_owned(),
        });
    };
    forget.await.map_err(|source| ProjectorError::Apply {
        name: name.to_owned(),
        from: 0,
        to: position,
        at: position,
        source,
    })?;
    let mut events = 0;
    let mut from = 1;
    loop {
        let page: Vec<RecordedEvent> = store
            .read_stream(stream, from, 1_000)
            .await?
            .into_iter()
            .filter(|e| e.position <= position)
            .collect();
        let Some(last) = page.last() else { break };
        from = last.version + 1;
        let links: Vec<_> = page.iter().map(RecordedEvent::link).collect();
        projection
            .apply(txn.conn(), name, &links)
            .await
            .map_err(|source| ProjectorError::Apply {
                name: name.to_owned(),
                from: links.first().map_or(0, |l| l.position),
                to: last.position,
                at: position,
                source,
            })?;
        events += page.len() as u64;
    }
    txn.commit().await?;
    Ok(StreamRebuild {
        projection: name.to_owned(),
        version: active.version,
        stream: stream.as_str().to_owned(),
        events,
        position,
    })
}

// ---- shared with the runner ----

/// Applies one page inside `txn`: first the compare-and-set that moves the version's checkpoint
/// from `old` to the page's last position, then the projection's statements. `None` if the
/// checkpoint was not at `old` (another runner, or a flip): nothing was applied.
#[allow(
    clippy::too_many_arguments,
    reason = "one page's full context, in one place"
)]
pub(crate) async fn apply_page(
    txn: &mut Txn<'_>,
    projection: &dyn Projection,
    table: &str,
    version: u32,
    state: State,
    old: u64,
    page: &[RecordedEvent],
    runner: &str,
) -> Result<Option<u64>, ProjectorError> {
    let Some(last) = page.last() else {
        return Ok(Some(old));
    };
    let new = last.position;
    if !registry::advance(
        txn.conn(),
        projection.name(),
        version,
        state,
        old,
        new,
        runner,
    )
    .await?
    {
        return Ok(None);
    }
    let links: Vec<_> = page.iter().map(RecordedEvent::link).collect();
    projection
        .apply(txn.conn(), table, &links)
        .await
        .map_err(|source| ProjectorError::Apply {
            name: projection.name().to_owned(),
            from: old + 1,
            to: new,
            at: old,
            source,
        })?;
    Ok(Some(new))
}

/// The events from `from` on, at most `limit`, checked to be contiguous: a gap is reported,
/// never skipped.
pub(crate) async fn read_page(
    store: &AnyStore,
    from: u64,
    limit: usize,
) -> Result<Vec<RecordedEvent>, ProjectorError> {
    let events = store.read_all(from, limit).await?;
    for (event, expected) in events.iter().zip(from..) {
        if event.position != expected {
            return Err(ProjectorError::Gap {
                expected,
                found: event.position,
            });
        }
    }
    Ok(events)
}

/// Reads pages ahead of the applier until a page comes back short (caught up).
async fn read_ahead(
    store: AnyStore,
    mut from: u64,
    page_size: usize,
    pages: mpsc::Sender<Result<Vec<RecordedEvent>, ProjectorError>>,
) {
    loop {
        match read_page(&store, from, page_size).await {
            Ok(page) if page.is_empty() => return,
            Ok(page) => {
                let short = page.len() < page_size;
                from += page.len() as u64;
                if pages.send(Ok(page)).await.is_err() || short {
                    return;
                }
            }
            Err(error) => {
                let _ = pages.send(Err(error)).await;
                return;
            }
        }
    }
}

/// Aborts a spawned task when dropped (a rebuild that stops early stops its reader).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Drops a version's tables (`table` and its suffixed siblings), if they exist.
pub(crate) async fn drop_tables(
    mut conn: Conn<'_>,
    projection: &dyn Projection,
    table: &str,
) -> Result<(), ProjectorError> {
    for suffix in projection.tables() {
        let sql = format!(
            "DROP TABLE IF EXISTS {}",
            quoted(&format!("{table}{suffix}"))
        );
        raw(conn.reborrow(), &sql).await?;
    }
    Ok(())
}

/// Runs SQL text (several statements) inside the caller's transaction.
pub(crate) async fn raw(conn: Conn<'_>, sql: &str) -> Result<(), sqlx::Error> {
    let sql = sqlx::AssertSqlSafe(sql.to_owned());
    either!(conn, c => sqlx::raw_sql(sql).execute(c).await.map(drop))
}

/// Index statements that may run twice (a rebuild resumed after creating them).
fn idempotent_indexes(sql: &str) -> String {
    sql.replace("CREATE INDEX IF NOT EXISTS ", "CREATE INDEX ")
        .replace("CREATE UNIQUE INDEX IF NOT EXISTS ", "CREATE UNIQUE INDEX ")
        .replace("CREATE INDEX ", "CREATE INDEX IF NOT EXISTS ")
        .replace("CREATE UNIQUE INDEX ", "CREATE UNIQUE INDEX IF NOT EXISTS ")
}

/// The projection named `name` among `projections`, or an error listing the known ones.
pub fn find(
    projections: &[Arc<dyn Projection>],
    name: &str,
) -> Result<Arc<dyn Projection>, ProjectorError> {
    projections
        .iter()
        .find(|p| p.name() == name)
        .cloned()
        .ok_or_else(|| ProjectorError::Unknown {
            name: name.to_owned(),
            known: projections
                .iter()
                .map(|p| p.name())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_statements_become_idempotent_once() {
        let sql = "CREATE INDEX \"a\" ON t (x);\nCREATE UNIQUE INDEX IF NOT EXISTS \"b\" ON t (y);";
        assert_eq!(
            idempotent_indexes(sql),
            "CREATE INDEX IF NOT EXISTS \"a\" ON t (x);\n\
             CREATE UNIQUE INDEX IF NOT EXISTS \"b\" ON t (y);"
        );
    }
}
