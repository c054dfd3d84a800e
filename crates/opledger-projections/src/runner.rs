//! The asynchronous runner ([`Projector`]): keeps every asynchronous projection's active version
//! caught up with the ledger, registers projections, and rebuilds those whose definition
//! changed.
//!
//! For each asynchronous projection a task reads the page after the active version's checkpoint
//! (contiguous positions: a gap stops it, nothing is skipped; the projections share the last page
//! read, `pages.rs`, so that those at the same position read it once), then in ONE transaction moves the
//! checkpoint with a compare-and-set (`… WHERE position = $old`) and applies the page. A crash
//! rolls both back, so nothing is applied twice; a compare-and-set that finds the checkpoint
//! moved means another runner (or a flip) got there first: the page is rolled back and the
//! runner reloads. It wakes on this process's appends and polls for other processes'.
//!
//! On PostgreSQL one instance at a time runs each projection: a session advisory lock on a
//! dedicated connection, held while running and checked every second; the others try again
//! every second, so one takes over within seconds of the holder's death. On SQLite the
//! compare-and-set alone protects.
//!
//! At [`Projector::prepare`] every projection is registered (`projection_checkpoints`); one whose
//! stored definition hash differs from the code's is rebuilt blue/green: an inline one before
//! the service starts (the store would otherwise write new rows into old tables), an asynchronous
//! one in the background by [`Projector::run`] while its old version keeps serving (its runner
//! pauses meanwhile, since the new code may not fit the old tables).

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use opledger_store::{AnyStore, Either, EventStore, Priority};
use sqlx::PgConnection;
use tokio::task::JoinSet;

use crate::db::{self, quoted};
use crate::error::ProjectorError;
use crate::pages::Pages;
use crate::projection::{Conn, Projection, definition_hash};
use crate::rebuild::{self, RebuildOptions, apply_page, read_page};
use crate::registry::{self, Checkpoint, State, index_prefix};

/// How the runner works.
#[derive(Clone, Debug)]
pub struct ProjectorOptions {
    /// This process's name in the registry's `runner` column (e.g. `host:pid`).
    pub runner: String,
    /// Events per page when following the ledger.
    pub page_size: usize,
    /// How often to look for events appended by other processes.
    pub poll_interval: Duration,
    /// How long a caught-up runner lets new events gather before it reads them: one page then
    /// holds many group-commit batches, so each read model commits a few times a second under
    /// load instead of once per append (each commit costs a transaction, a compare-and-set and
    /// a page read). It bounds how far behind the read model is, not how much.
    pub batch_delay: Duration,
    /// How often a PostgreSQL instance that does not hold a projection's lock tries again, and
    /// how often the holder checks its lock connection.
    pub lock_interval: Duration,
    /// How rebuilds run (their runner name is `runner`).
    pub rebuild: RebuildOptions,
}

impl Default for ProjectorOptions {
    fn default() -> Self {
        let runner = default_runner_id();
        Self {
            rebuild: RebuildOptions {
                runner: runner.clone(),
                ..RebuildOptions::default()
            },
            runner,
            page_size: 1_000,
            poll_interval: Duration::from_millis(500),
            batch_delay: Duration::from_millis(50),
            lock_interval: Duration::from_secs(1),
        }
    }
}

/// A runner name unique within this process: `pid<pid>-<n>`.
pub fn default_runner_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!(
        "pid{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Keeps asynchronous projections caught up (see the module documentation).
#[derive(Debug)]
pub struct Projector {
    store: AnyStore,
    projections: Vec<Arc<dyn Projection>>,
    options: ProjectorOptions,
    prepared: bool,
    /// Asynchronous projections whose definition changed, rebuilt by `run`.
    to_rebuild: HashSet<&'static str>,
}

impl Projector {
    /// A runner for `projections` (usually [`crate::builtin()`]) on `store`.
    pub fn new(
        store: AnyStore,
        projections: Vec<Arc<dyn Projection>>,
        mut options: ProjectorOptions,
    ) -> Self {
        options.rebuild.runner.clone_from(&options.runner);
        Self {
            store,
            projections,
            options,
            prepared: false,
            to_rebuild: HashSet::new(),
        }
    }

    /// Registers every projection and rebuilds inline ones whose definition changed; asynchronous
    /// ones whose definition changed are rebuilt by [`Projector::run`].
    pub async fn prepare(&mut self) -> Result<(), ProjectorError> {
        registry::install(self.store.projection_pool()).await?;
        registry::install(self.store.read_model_pool()).await?;
        for projection in &self.projections {
            if !projection.inline() {
                retire_moved(&self.store, projection.as_ref(), &self.options.runner).await?;
            }
        }
        for projection in &self.projections {
            let active = register(&self.store, projection.as_ref(), &self.options.runner).await?;
            if active.definition_hash == self.hash(projection.as_ref()) {
                continue;
            }
            if projection.inline() {
                self.rebuild_inline(projection.as_ref()).await?;
            } else {
                tracing::info!(
                    projection = projection.name(),
                    "the definition changed; rebuilding it in the background while version {} \
                     serves",
                    active.version
                );
                self.to_rebuild.insert(projection.name());
            }
        }
        self.prepared = true;
        Ok(())
    }

    fn hash(&self, projection: &dyn Projection) -> String {
        definition_hash(projection, self.store.projection_pool().backend())
    }

    /// Rebuilds an inline projection before the service starts; if another instance is already
    /// rebuilding it, waits for that one.
    async fn rebuild_inline(&self, projection: &dyn Projection) -> Result<(), ProjectorError> {
        let name = projection.name();
        tracing::warn!(
            projection = name,
            "the definition changed; rebuilding it before the service starts"
        );
        let log = |p: &rebuild::Progress| {
            tracing::debug!(
                projection = name,
                position = p.position,
                head = p.head,
                "rebuild"
            );
        };
        loop {
            match rebuild::rebuild(&self.store, projection, &self.options.rebuild, &log).await {
                Ok(_) => return Ok(()),
                Err(ProjectorError::RebuildRunning { .. } | ProjectorError::Superseded { .. }) => {
                    let wanted = self.hash(projection);
                    let rows = registry::rows(self.store.reader()).await?;
                    if rows.iter().any(|r| {
                        r.name == name && r.state == State::Active && r.definition_hash == wanted
                    }) {
                        return Ok(());
                    }
                    tokio::time::sleep(self.options.lock_interval).await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Runs every asynchronous projection until `shutdown` resolves (preparing first if
    /// [`Projector::prepare`] was not called). Failures are logged and retried; a projection
    /// that keeps failing stalls (its lag grows) while the others go on.
    pub async fn run(mut self, shutdown: impl Future<Output = ()> + Send) {
        let work = async {
            while !self.prepared {
                if let Err(error) = self.prepare().await {
                    tracing::error!(%error, "cannot prepare the projections; retrying in 5 s");
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
            }
            let mut tasks = JoinSet::new();
            let shared = Arc::new(Shared {
                store: self.store.clone(),
                options: self.options.clone(),
                pages: Pages::default(),
            });
            for projection in &self.projections {
                if projection.inline() {
                    continue;
                }
                let rebuild = self.to_rebuild.contains(projection.name());
                tasks.spawn(follow(shared.clone(), projection.clone(), rebuild));
            }
            while tasks.join_next().await.is_some() {}
        };
        // Stopping drops the tasks wherever they are: a page transaction cut off is rolled
        // back with its compare-and-set, so nothing is half-applied.
        tokio::select! {
            () = work => {}
            () = shutdown => {}
        }
    }
}

#[derive(Debug)]
struct Shared {
    store: AnyStore,
    options: ProjectorOptions,
    /// The last page read, which the other projections take theirs from.
    pages: Pages,
}

/// Follows one projection until stopped.
async fn follow(shared: Arc<Shared>, projection: Arc<dyn Projection>, mut rebuild: bool) {
    let name = projection.name();
    let mut lock = Lock::default();
    let mut failures = 0u32;
    loop {
        let outcome = drive(
            &shared,
            projection.as_ref(),
            &mut rebuild,
            &mut lock,
            &mut failures,
        )
        .await;
        let pause = match outcome {
            Ok(Stop::LockLost) => {
                tracing::warn!(
                    projection = name,
                    "lost the projection's lock; re-acquiring"
                );
                failures = 0;
                Duration::ZERO
            }
            Ok(Stop::NotHolder) => shared.options.lock_interval,
            Err(error) => {
                failures = failures.saturating_add(1);
                let pause = Duration::from_millis(500)
                    .saturating_mul(2u32.saturating_pow(failures.min(6)))
                    .min(Duration::from_secs(30));
                tracing::error!(
                    projection = name,
                    %error,
                    retry_in_ms = pause.as_millis() as u64,
                    "projection runner failed"
                );
                pause
            }
        };
        tokio::time::sleep(pause).await;
    }
}

/// Why [`drive`] returned without an error.
enum Stop {
    /// Another instance holds the projection's lock.
    NotHolder,
    /// The lock's connection broke.
    LockLost,
}

/// The PostgreSQL session lock that makes one instance at a time run a projection.
#[derive(Debug, Default)]
struct Lock {
    connection: Option<PgConnection>,
    held: bool,
    checked: Option<Instant>,
}

/// The first key of a runner's advisory lock.
const RUNNER_LOCK_CLASS: i32 = registry::LOCK_CLASS + 1;

impl Lock {
    /// Tries to take the lock for `name` (PostgreSQL only); `true` if this runner holds it.
    async fn acquire(&mut self, store: &AnyStore, name: &str) -> Result<bool, ProjectorError> {
        let pool = match store.projection_pool() {
            Either::Sqlite(_) => return Ok(true),
            Either::Postgres(pool) => pool,
        };
        if self.held {
            return Ok(true);
        }
        if self.connection.is_none() {
            self.connection = Some(sqlx::pool::PoolConnection::detach(pool.acquire().await?));
        }
        let connection = self.connection.as_mut().expect("connected above");
        let got = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, hashtext($2))")
            .bind(RUNNER_LOCK_CLASS)
            .bind(name)
            .fetch_one(connection)
            .await;
        match got {
            Ok(got) => {
                self.held = got;
                self.checked = Some(Instant::now());
                if got {
                    tracing::info!(projection = name, "running this projection here");
                }
                Ok(got)
            }
            Err(error) => {
                self.connection = None;
                Err(error.into())
            }
        }
    }

    /// Whether the lock's connection still answers (checked at most every `interval`).
    async fn alive(&mut self, interval: Duration) -> bool {
        let Some(connection) = self.connection.as_mut() else {
            return !self.held;
        };
        if self.checked.is_some_and(|at| at.elapsed() < interval) {
            return true;
        }
        let ok = sqlx::query("SELECT 1").execute(connection).await.is_ok();
        self.checked = Some(Instant::now());
        if !ok {
            self.connection = None;
            self.held = false;
        }
        ok
    }
}

/// Runs one projection while this runner holds its lock: rebuilds it first if asked (and its
/// active version still has another definition), then applies pages after its checkpoint.
/// `failures` (the consecutive failures that set the backoff) is reset by every page applied.
async fn drive(
    shared: &Shared,
    projection: &dyn Projection,
    rebuild: &mut bool,
    lock: &mut Lock,
    failures: &mut u32,
) -> Result<Stop, ProjectorError> {
    let store = &shared.store;
    let options = &shared.options;
    let name = projection.name();
    if !lock.acquire(store, name).await? {
        return Ok(Stop::NotHolder);
    }
    let wanted = definition_hash(projection, store.projection_pool().backend());
    let mut active = register(store, projection, &options.runner).await?;
    if active.definition_hash != wanted && *rebuild {
        let log = |p: &rebuild::Progress| {
            tracing::debug!(
                projection = name,
                position = p.position,
                head = p.head,
                "rebuild"
            );
        };
        rebuild::rebuild(store, projection, &options.rebuild, &log).await?;
        *rebuild = false;
        active = register(store, projection, &options.runner).await?;
    }
    let mut watch = store.subscribe();
    let mut warned = false;
    let mut file_warned = false;
    loop {
        if !lock.alive(options.lock_interval).await {
            return Ok(Stop::LockLost);
        }
        if let Some(lost) = store.read_model_file_lost() {
            // Pages applied now would go into a file no one opens again; the ledger goes on.
            if !file_warned {
                tracing::error!(projection = name, "{lost}");
                file_warned = true;
            }
            tokio::time::sleep(options.poll_interval).await;
            continue;
        }
        if active.definition_hash != wanted {
            // The live version was built by other code: its tables may not fit this code.
            // Wait for a rebuild (here after a restart, or by `opledger projections rebuild`).
            if !warned {
                tracing::warn!(
                    projection = name,
                    version = active.version,
                    "the live version's definition differs from this binary's; paused until \
                     it is rebuilt (`opledger projections rebuild {name}`)"
                );
                warned = true;
            }
            tokio::time::sleep(options.poll_interval).await;
            active = register(store, projection, &options.runner).await?;
            continue;
        }
        // This process's intake goes first: the page waits its turn. Under a flood of updates
        // the read models fall behind, and catch up when it eases. On PostgreSQL a crowd holds
        // them back up to a second (ADR 0025): their rows cost the database server's CPU,
        // which no nice value of this process lowers; on SQLite that work is done below intake
        // already (ADR 0023), and deferring it only moved it into what follows the flood.
        let turn = match store {
            Either::Postgres(_) => store.priority().page().await,
            Either::Sqlite(_) => store.priority().background(Priority::WAIT).await,
        };
        let page = shared
            .pages
            .page(active.position + 1, options.page_size, |from, limit| {
                read_page(store, from, limit)
            })
            .await?;
        if page.is_empty() {
            drop(turn);
            tokio::select! {
                woke = watch.changed() => {
                    if woke.is_none() {
                        tokio::time::sleep(options.poll_interval).await;
                    }
                }
                () = tokio::time::sleep(options.poll_interval) => {}
            }
            tokio::time::sleep(options.batch_delay).await;
            continue;
        }
        let short = page.len() < options.page_size;
        let mut txn = db::begin_page(db::pool_for(store, projection)).await?;
        let applied = apply_page(
            &mut txn,
            projection,
            name,
            active.version,
            State::Active,
            active.position,
            &page,
            &options.runner,
        )
        .await?;
        match applied {
            Some(position) => {
                txn.commit().await?;
                drop(turn);
                active.position = position;
                warned = false;
                *failures = 0;
                if short {
                    // Caught up: let the next events gather (see `batch_delay`).
                    tokio::time::sleep(options.batch_delay).await;
                }
            }
            None => {
                drop(txn);
                let before = active.version;
                active = register(store, projection, &options.runner).await?;
                if active.version == before {
                    if !warned {
                        tracing::warn!(
                            projection = name,
                            version = before,
                            runner = active.runner.as_deref().unwrap_or("?"),
                            "another runner advanced this projection; following its checkpoint"
                        );
                        warned = true;
                    }
                } else {
                    tracing::info!(
                        projection = name,
                        from = before,
                        to = active.version,
                        "a rebuild flipped the projection; following the new version"
                    );
                }
            }
        }
    }
}

/// Makes sure `projection` has an active version and returns it. A first registration creates
/// its tables (with their canonical names) at position 0; an inline projection's existing table
/// (kept by the store, so current) is registered at the head.
pub(crate) async fn register(
    store: &AnyStore,
    projection: &dyn Projection,
    runner: &str,
) -> Result<Checkpoint, ProjectorError> {
    let name = projection.name();
    let pool = db::pool_for(store, projection);
    let backend = pool.backend();
    let existing = registry::rows(store.reader()).await?;
    if let Some(active) = existing
        .into_iter()
        .find(|r| r.name == name && r.state == State::Active)
    {
        return Ok(active);
    }
    registry::install(pool).await?;
    let mut txn = db::begin(pool).await?;
    registry::lock_registry(txn.conn()).await?;
    let rows = registry::select(txn.conn(), Some(name)).await?;
    if let Some(active) = rows.into_iter().find(|r| r.state == State::Active) {
        return Ok(active);
    }
    let hash = definition_hash(projection, backend);
    let version = registry::last_version(txn.conn(), name).await? + 1;
    let position = if projection.inline() {
        if !table_exists(txn.conn(), name).await? {
            return Err(ProjectorError::InlineMissing {
                name: name.to_owned(),
            });
        }
        registry::head(txn.conn()).await?
    } else {
        rebuild::drop_tables(txn.conn(), projection, name).await?;
        let (tables, indexes) =
            projection
                .schema()
                .render(backend, name, &index_prefix(name, version));
        rebuild::raw(txn.conn(), &tables).await?;
        rebuild::raw(txn.conn(), &indexes).await?;
        0
    };
    registry::insert(
        txn.conn(),
        &registry::NewRow {
            name,
            version,
            state: State::Active,
            inline: projection.inline(),
            definition_hash: &hash,
            position,
            runner,
        },
    )
    .await?;
    txn.commit().await?;
    tracing::info!(projection = name, version, position, "registered");
    let rows = registry::rows(store.reader()).await?;
    rows.into_iter()
        .find(|r| r.name == name && r.state == State::Active)
        .ok_or_else(|| ProjectorError::NotRegistered {
            name: name.to_owned(),
        })
}

/// Retires the versions of an asynchronous projection still registered in a SQLite ledger's
/// own file (where they lived before they got a file of their own, ADR 0014) and drops their
/// tables, so that readers, who look in the ledger's file first, find the ones in the read
/// models' file; there they are rebuilt from position 0. On PostgreSQL both are one database.
async fn retire_moved(
    store: &AnyStore,
    projection: &dyn Projection,
    runner: &str,
) -> Result<(), ProjectorError> {
    let pool = store.projection_pool();
    if !matches!(pool, Either::Sqlite(_)) {
        return Ok(());
    }
    let name = projection.name();
    let mut txn = db::begin(pool).await?;
    let rows = match registry::select(txn.conn(), Some(name)).await {
        Ok(rows) => rows,
        Err(registry::RegistryError::Database(e)) if db::missing_table(&e) => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    if rows.is_empty() {
        return Ok(());
    }
    for row in rows {
        registry::set_state(
            txn.conn(),
            name,
            row.version,
            row.state,
            State::Retired,
            runner,
        )
        .await?;
        rebuild::drop_tables(txn.conn(), projection, &row.table()).await?;
    }
    txn.commit().await?;
    tracing::info!(
        projection = name,
        "moved to the read models' own file; rebuilding it there"
    );
    Ok(())
}

/// Whether `table` exists: each backend looks in its own catalog.
async fn table_exists(conn: Conn<'_>, table: &str) -> Result<bool, sqlx::Error> {
    match conn {
        Conn::Sqlite(c) => {
            sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = $1)",
            )
            .bind(table)
            .fetch_one(c)
            .await
        }
        Conn::Postgres(c) => {
            sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
                .bind(quoted(table))
                .fetch_one(c)
                .await
        }
    }
}
