//! The read side's core on both backends: the asynchronous runner (catching up under concurrent
//! appends, a second runner caught by the compare-and-set, a runner killed mid-page), blue/green
//! rebuilds while appends continue (inline `operation_status`, flipped under the ledger's write
//! lock, and an asynchronous projection), a changed definition rebuilt at start, targeted
//! rebuilds of one stream, PostgreSQL takeover between two `opledger serve` processes, and
//! `opledger projections`.
//!
//! Most tests use `Positions`, a projection defined here that writes one row per event keyed by
//! its position (a skip leaves a hole) and adds up a count per stream in a second table (a
//! double apply counts twice; and a flip renames more than one table).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use futures_util::future::BoxFuture;
use opledger_domain::operation::{
    Claimed, Confirmed, ConfirmedVia, ExternalCallSent, OperationEvent, Received,
};
use opledger_domain::{Causation, EventMetadata, OperationId, fingerprint, operation_stream};
use opledger_ledger::request;
use opledger_projections::operation_status::{self, Filter, OperationStatus, OperationStatusRow};
use opledger_projections::rebuild::{self, RebuildOptions};
use opledger_projections::registry::{self, State};
use opledger_projections::{
    Backend as DbBackend, Conn, Definition, Projection, Projector, ProjectorError,
    ProjectorOptions, definition_hash,
};
use opledger_store::chain::Link;
use opledger_store::inline::ProjectionError;
use opledger_store::{
    AnyStore, AppendRequest, EventStore, ExpectedVersion, NewEvent, Priority, ReadPool,
    RecordedEvent, StreamId,
};
use sqlx::Connection;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::support::app::{Backend, Ledger, on_both_backends};

const NAME: &str = "it_positions";
const PATIENCE: Duration = Duration::from_secs(30);

// ---- the test projection ----

/// Pauses `apply` forever (inside its transaction, after writing) on the page holding `at`.
#[derive(Debug)]
struct Pause {
    at: u64,
    entered: Notify,
}

/// One row per event keyed by position, and a count per stream.
#[derive(Debug, Clone)]
struct Positions {
    code_version: u32,
    forgettable: bool,
    pause: Option<Arc<Pause>>,
}

fn positions() -> Positions {
    Positions {
        code_version: 1,
        forgettable: true,
        pause: None,
    }
}

const SQLITE: &str = "CREATE TABLE \"{table}\" (position INTEGER PRIMARY KEY, \
     stream_id TEXT NOT NULL, version INTEGER NOT NULL, event_type TEXT NOT NULL);\n\
     CREATE TABLE \"{table}_streams\" (stream_id TEXT PRIMARY KEY, events INTEGER NOT NULL, \
     last_position INTEGER NOT NULL);\n\
     -- indexes\n\
     CREATE INDEX \"{index}_by_stream\" ON \"{table}\" (stream_id, version);\n";
const POSTGRES: &str = "CREATE TABLE \"{table}\" (position bigint PRIMARY KEY, \
     stream_id text NOT NULL, version bigint NOT NULL, event_type text NOT NULL);\n\
     CREATE TABLE \"{table}_streams\" (stream_id text PRIMARY KEY, events bigint NOT NULL, \
     last_position bigint NOT NULL);\n\
     -- indexes\n\
     CREATE INDEX \"{index}_by_stream\" ON \"{table}\" (stream_id, version);\n";

impl Projection for Positions {
    fn definition(&self) -> Definition {
        Definition::new(NAME, self.code_version, SQLITE, POSTGRES).with_tables(&["", "_streams"])
    }

    fn apply<'a>(
        &'a self,
        conn: Conn<'a>,
        table: &'a str,
        events: &'a [Link<'a>],
    ) -> BoxFuture<'a, Result<(), ProjectionError>> {
        Box::pin(async move {
            let rows: Vec<_> = events
                .iter()
                .map(|l| serde_json::json!([l.position, l.stream_id, l.version, l.event_type]))
                .collect();
            let mut streams: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
            for l in events {
                let entry = streams.entry(l.stream_id).or_default();
                entry.0 += 1;
                entry.1 = l.position;
            }
            let streams: Vec<_> = streams
                .into_iter()
                .map(|(s, (n, last))| serde_json::json!([s, n, last]))
                .collect();
            let rows = serde_json::Value::from(rows).to_string();
            let streams = serde_json::Value::from(streams).to_string();
            match conn {
                Conn::Sqlite(c) => {
                    sqlx::query(sqlx::AssertSqlSafe(format!(
                        "INSERT INTO \"{table}\" (position, stream_id, version, event_type) \
                         SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3 \
                         FROM json_each($1) WHERE true ON CONFLICT (position) DO NOTHING"
                    )))
                    .bind(rows)
                    .execute(&mut *c)
                    .await?;
                    sqlx::query(sqlx::AssertSqlSafe(format!(
                        "INSERT INTO \"{table}_streams\" AS s (stream_id, events, last_position) \
                         SELECT value ->> 0, value ->> 1, value ->> 2 FROM json_each($1) \
                         WHERE true ON CONFLICT (stream_id) DO UPDATE \
                         SET events = s.events + excluded.events, \
                         last_position = excluded.last_position"
                    )))
                    .bind(streams)
                    .execute(&mut *c)
                    .await?;
                }
                Conn::Postgres(c) => {
                    sqlx::query(sqlx::AssertSqlSafe(format!(
                        "INSERT INTO \"{table}\" (position, stream_id, version, event_type) \
                         SELECT (r->>0)::bigint, r->>1, (r->>2)::bigint, r->>3 \
                         FROM jsonb_array_elements($1::jsonb) AS r \
                         ON CONFLICT (position) DO NOTHING"
                    )))
                    .bind(rows)
                    .execute(&mut *c)
                    .await?;
                    sqlx::query(sqlx::AssertSqlSafe(format!(
                        "INSERT INTO \"{table}_streams\" AS s (stream_id, events, last_position) \
                         SELECT r->>0, (r->>1)::bigint, (r->>2)::bigint \
                         FROM jsonb_array_elements($1::jsonb) AS r \
                         ON CONFLICT (stream_id) DO UPDATE \
                         SET events = s.events + excluded.events, \
                         last_position = excluded.last_position"
                    )))
                    .bind(streams)
                    .execute(&mut *c)
                    .await?;
                }
            }
            if let Some(pause) = &self.pause
                && events.iter().any(|l| l.position == pause.at)
            {
                pause.entered.notify_one();
                std::future::pending::<()>().await;
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
        if !self.forgettable {
            return None;
        }
        Some(Box::pin(async move {
            let rows = format!("DELETE FROM \"{table}\" WHERE stream_id = $1");
            let counts = format!("DELETE FROM \"{table}_streams\" WHERE stream_id = $1");
            match conn {
                Conn::Sqlite(c) => {
                    for sql in [rows, counts] {
                        sqlx::query(sqlx::AssertSqlSafe(sql))
                            .bind(stream)
                            .execute(&mut *c)
                            .await?;
                    }
                }
                Conn::Postgres(c) => {
                    for sql in [rows, counts] {
                        sqlx::query(sqlx::AssertSqlSafe(sql))
                            .bind(stream)
                            .execute(&mut *c)
                            .await?;
                    }
                }
            }
            Ok(())
        }))
    }
}

// ---- helpers ----

/// Runs a query returning rows of `(i64, String, i64, String)` or `(String, i64, i64)`.
macro_rules! fetch {
    ($pool:expr, $sql:expr, $ty:ty) => {
        match $pool {
            ReadPool::Sqlite(pool) => sqlx::query_as::<_, $ty>(sqlx::AssertSqlSafe($sql))
                .fetch_all(pool)
                .await
                .expect("query"),
            ReadPool::Postgres(pool) => sqlx::query_as::<_, $ty>(sqlx::AssertSqlSafe($sql))
                .fetch_all(pool)
                .await
                .expect("query"),
        }
    };
}

async fn execute(pool: ReadPool<'_>, sql: &str) -> u64 {
    match pool {
        ReadPool::Sqlite(pool) => sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(pool)
            .await
            .expect("statement")
            .rows_affected(),
        ReadPool::Postgres(pool) => sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(pool)
            .await
            .expect("statement")
            .rows_affected(),
    }
}

type PositionRow = (i64, String, i64, String);
type StreamRow = (String, i64, i64);

async fn position_rows(store: &AnyStore) -> Vec<PositionRow> {
    fetch!(
        store.reader(),
        format!(
            "SELECT position, stream_id, version, event_type FROM \"{NAME}\" ORDER BY position"
        ),
        PositionRow
    )
}

async fn stream_rows(store: &AnyStore) -> Vec<StreamRow> {
    fetch!(
        store.reader(),
        format!(
            "SELECT stream_id, events, last_position FROM \"{NAME}_streams\" ORDER BY stream_id"
        ),
        StreamRow
    )
}

async fn all_events(store: &AnyStore) -> Vec<RecordedEvent> {
    let mut events = Vec::new();
    loop {
        let page = store
            .read_all(events.len() as u64 + 1, 10_000)
            .await
            .expect("read");
        if page.is_empty() {
            return events;
        }
        events.extend(page);
    }
}

/// What a fresh replay gives: one row per event, and a count per stream.
async fn expected_positions(store: &AnyStore) -> (Vec<PositionRow>, Vec<StreamRow>) {
    let events = all_events(store).await;
    let rows = events
        .iter()
        .map(|e| {
            (
                e.position as i64,
                e.stream_id.to_string(),
                e.version as i64,
                e.event_type.clone(),
            )
        })
        .collect();
    let mut streams: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for e in &events {
        let entry = streams.entry(e.stream_id.to_string()).or_default();
        entry.0 += 1;
        entry.1 = e.position as i64;
    }
    let streams = streams
        .into_iter()
        .map(|(s, (n, last))| (s, n, last))
        .collect();
    (rows, streams)
}

/// Asserts the test projection's live tables equal a fresh replay of the whole ledger.
async fn assert_positions_replayed(store: &AnyStore) {
    let (rows, streams) = expected_positions(store).await;
    let actual = position_rows(store).await;
    assert_eq!(actual.len(), rows.len(), "one row per event");
    assert_eq!(actual, rows, "the rows equal a fresh replay");
    assert_eq!(
        stream_rows(store).await,
        streams,
        "the counts equal a replay"
    );
}

/// What a fresh replay of `operation_status` gives, by operation id.
pub(crate) async fn expected_status(store: &AnyStore) -> Vec<OperationStatusRow> {
    let events = all_events(store).await;
    let mut rows: HashMap<String, OperationStatusRow> = HashMap::new();
    for event in &events {
        if !event.stream_id.as_str().starts_with("op-") {
            continue;
        }
        let key = event.stream_id.to_string();
        let row = OperationStatusRow::apply(rows.remove(&key), &event.link()).expect("fold");
        rows.insert(key, row);
    }
    let mut rows: Vec<_> = rows.into_values().collect();
    rows.sort_by(|a, b| a.operation_id.cmp(&b.operation_id));
    rows
}

pub(crate) async fn status_rows(store: &AnyStore) -> Vec<OperationStatusRow> {
    let mut rows = operation_status::list(
        store.reader(),
        &Filter {
            limit: 1_000_000,
            ..Filter::default()
        },
    )
    .await
    .expect("list operation_status");
    rows.sort_by(|a, b| a.operation_id.cmp(&b.operation_id));
    rows
}

/// Appends `count` events in calls of 1–3 to a handful of streams of `appender`.
async fn append_events(store: AnyStore, appender: usize, count: usize) {
    let mut written = 0;
    let mut call = 0;
    while written < count {
        let n = (1 + call % 3).min(count - written);
        let stream = StreamId::new(format!("it-{appender}-{}", call % 7)).expect("stream id");
        let events = (0..n)
            .map(|i| {
                NewEvent::new(
                    "Noted",
                    1,
                    serde_json::value::to_raw_value(&serde_json::json!({ "n": written + i }))
                        .expect("JSON"),
                )
            })
            .collect();
        store
            .append(vec![AppendRequest::new(
                stream,
                ExpectedVersion::Any,
                events,
            )])
            .await
            .expect("append");
        written += n;
        call += 1;
    }
}

/// Appends `count` whole operation lifecycles (received, claimed, call sent, confirmed), each
/// event its own append so that streams interleave with other appenders'.
async fn lifecycles(store: AnyStore, appender: usize, count: usize) {
    for i in 0..count {
        lifecycle(&store, appender, i).await;
    }
}

async fn lifecycle(store: &AnyStore, appender: usize, i: usize) {
    let key = format!("a{appender}-{i}");
    let stream = StreamId::new(operation_stream("coupon", &key).expect("stream")).expect("id");
    let params = BTreeMap::from([("campaign".to_owned(), "spring".to_owned())]);
    let id = OperationId::new("coupon", &key);
    let worker = format!("w{appender}");
    let steps = [
        OperationEvent::Received(Received {
            operation_id: id,
            action: "coupon".to_owned(),
            business_key: key.clone(),
            fingerprint: fingerprint("coupon", &params),
            params,
            bot: "shop".to_owned(),
            chat_id: Some(1_000 + i as i64),
            user_id: Some(1_000 + i as i64),
            update_id: i as i64,
            message_date: None,
            max_attempts: 3,
        }),
        OperationEvent::Claimed(Claimed {
            worker: worker.clone(),
            lease_until: Utc::now() + TimeDelta::minutes(1),
            attempt: 1,
        }),
        OperationEvent::ExternalCallSent(ExternalCallSent {
            worker: worker.clone(),
            attempt: 1,
            idempotency_key: id.to_string(),
        }),
        OperationEvent::Confirmed(Confirmed {
            external_id: Some(format!("ext-{key}")),
            result: BTreeMap::new(),
            response_digest: None,
            via: ConfirmedVia::Response,
        }),
    ];
    let metadata = EventMetadata::caused_by(Causation::Worker { worker });
    for (version, event) in steps.iter().enumerate() {
        let expected = if version == 0 {
            ExpectedVersion::NoStream
        } else {
            ExpectedVersion::Exact(version as u64)
        };
        let append = request(
            stream.clone(),
            expected,
            std::slice::from_ref(event),
            &metadata,
        )
        .expect("request");
        store.append(vec![append]).await.expect("append");
    }
}

/// Appenders that keep going until stopped.
struct Appenders {
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Appenders {
    fn start(store: &AnyStore, generic: usize, operations: usize) -> Appenders {
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for a in 0..generic {
            let (store, stop) = (store.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let mut round = 0;
                while !stop.load(Ordering::Relaxed) {
                    append_events(store.clone(), 100 + a * 1000 + round, 5).await;
                    round += 1;
                }
            }));
        }
        for a in 0..operations {
            let (store, stop) = (store.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    lifecycle(&store, 100 + a, i).await;
                    i += 1;
                }
            }));
        }
        Appenders { stop, tasks }
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.expect("an appender");
        }
    }
}

fn options() -> ProjectorOptions {
    ProjectorOptions {
        poll_interval: Duration::from_millis(100),
        lock_interval: Duration::from_millis(300),
        ..ProjectorOptions::default()
    }
}

/// A runner of `projections` in the background, stopped (or aborted) by the test.
struct Running {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: JoinHandle<()>,
    runner: String,
}

impl Running {
    fn start(
        store: &AnyStore,
        projections: Vec<Arc<dyn Projection>>,
        options: ProjectorOptions,
    ) -> Running {
        let runner = options.runner.clone();
        Running::run(Projector::new(store.clone(), projections, options), runner)
    }

    fn run(projector: Projector, runner: String) -> Running {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(projector.run(async move {
            let _ = stopped.await;
        }));
        Running {
            stop: Some(stop),
            task,
            runner,
        }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.await.expect("the runner");
    }
}

async fn head(store: &AnyStore) -> u64 {
    store.head().await.expect("head").position
}

async fn caught_up(store: &AnyStore, name: &str) {
    let head = head(store).await;
    assert!(
        registry::wait_for(store, name, head, PATIENCE)
            .await
            .expect("read the registry"),
        "{name} caught up with {head}; registry: {:?}",
        registry::list(store).await
    );
}

async fn active(store: &AnyStore, name: &str) -> registry::Checkpoint {
    registry::rows(store.reader())
        .await
        .expect("registry")
        .into_iter()
        .find(|r| r.name == name && r.state == State::Active)
        .unwrap_or_else(|| panic!("{name} has an active version"))
}

/// Tables whose names carry a version (`x@vN`): none may remain after a flip.
async fn versioned_tables(store: &AnyStore) -> Vec<String> {
    let rows: Vec<(String,)> = match store.reader() {
        // Both files: the ledger's, and the read models' own, attached to every reader.
        ReadPool::Sqlite(pool) => sqlx::query_as(
            "SELECT name FROM main.sqlite_master WHERE type = 'table' AND name LIKE '%@v%' \
             UNION ALL SELECT name FROM read_models.sqlite_master \
             WHERE type = 'table' AND name LIKE '%@v%'",
        )
        .fetch_all(pool)
        .await
        .expect("tables"),
        ReadPool::Postgres(pool) => sqlx::query_as(
            "SELECT tablename::text FROM pg_tables WHERE schemaname = current_schema() \
             AND tablename LIKE '%@v%'",
        )
        .fetch_all(pool)
        .await
        .expect("tables"),
    };
    rows.into_iter().map(|(n,)| n).collect()
}

/// A connection of the test's own, as another process would have.
enum Other {
    Sqlite(sqlx::SqliteConnection),
    Postgres(sqlx::PgConnection),
}

impl Other {
    async fn connect(ledger: &Ledger) -> Other {
        match ledger {
            Ledger::Postgres(database) => Other::Postgres(database.connect().await),
            _ => Other::Sqlite(
                sqlx::SqliteConnection::connect(&ledger.url())
                    .await
                    .expect("connect"),
            ),
        }
    }

    /// The same where an asynchronous projection lives: on SQLite the read models' own file
    /// beside the ledger (ADR 0014).
    async fn read_models(ledger: &Ledger) -> Other {
        match ledger {
            Ledger::Postgres(_) => Other::connect(ledger).await,
            _ => {
                let url = ledger.url();
                let path = url.strip_prefix("sqlite://").expect("a SQLite URL");
                let path = opledger_store::read_models::path_for(std::path::Path::new(path));
                Other::Sqlite(
                    sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
                        .await
                        .expect("connect"),
                )
            }
        }
    }

    fn begin(&self) -> &'static str {
        match self {
            Other::Sqlite(_) => "BEGIN IMMEDIATE",
            Other::Postgres(_) => "BEGIN",
        }
    }

    async fn execute(&mut self, sql: &str) -> u64 {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self {
            Other::Sqlite(c) => sqlx::raw_sql(sql)
                .execute(c)
                .await
                .expect("sql")
                .rows_affected(),
            Other::Postgres(c) => sqlx::raw_sql(sql)
                .execute(c)
                .await
                .expect("sql")
                .rows_affected(),
        }
    }

    fn conn(&mut self) -> Conn<'_> {
        match self {
            Other::Sqlite(c) => Conn::Sqlite(c),
            Other::Postgres(c) => Conn::Postgres(c),
        }
    }
}

fn backend_of(store: &AnyStore) -> DbBackend {
    match store.reader() {
        ReadPool::Sqlite(_) => DbBackend::Sqlite,
        ReadPool::Postgres(_) => DbBackend::Postgres,
    }
}

async fn cli(url: &str, args: &[&str]) -> std::process::Output {
    let url = url.to_owned();
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        crate::support::opledger(&url, &args)
    })
    .await
    .expect("run opledger")
}

fn arc(p: Positions) -> Vec<Arc<dyn Projection>> {
    vec![Arc::new(p)]
}

// ---- 1. catching up ----

on_both_backends!(
    the_runner_catches_up_under_concurrent_appends,
    a_second_runner_is_detected_by_the_compare_and_set,
    a_runner_killed_mid_page_resumes_without_double_applying,
    rebuilds_while_appends_continue_equal_a_fresh_replay,
    a_gap_in_the_ledger_stops_the_runner_instead_of_skipping,
    an_interrupted_rebuild_resumes_where_it_stopped,
    a_changed_definition_is_rebuilt_at_start,
    a_targeted_rebuild_repairs_one_stream_only,
    the_cli_lists_and_rebuilds,
);

async fn the_runner_catches_up_under_concurrent_appends(backend: Backend) {
    let Some(ledger) = Ledger::create(backend).await else {
        return;
    };
    let store = ledger.open().await;
    append_events(store.clone(), 0, 30).await;
    let running = Running::start(&store, arc(positions()), options());
    let appenders: Vec<_> = (1..=4)
        .map(|a| tokio::spawn(append_events(store.clone(), a, 150)))
        .collect();
    for appender in appenders {
        appender.await.expect("appender");
    }
    caught_up(&store, NAME).await;
    assert_positions_replayed(&store).await;
    let row = active(&store, NAME).await;
    assert_eq!(row.runner.as_deref(), Some(running.runner.as_str()));
    assert_eq!(row.position, head(&store).await);
    let status = registry::list(&store).await.expect("list");
    let listed = status.iter().find(|s| s.name == NAME).expect("listed");
    assert_eq!((listed.lag, listed.inline), (0, false));
    running.stop().await;
    store.close().await;
}

/// With intake first and a crowd of updates in flight, a page on PostgreSQL waits up to
/// `Priority::CROWDED_PAGE_WAIT` (ADR 0025), not the 50 ms it waits for an update or two; once
/// the crowd has gone the runner catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_crowded_intake_holds_the_pages_back_until_it_eases() {
    let Some(ledger) = Ledger::create(Backend::Postgres).await else {
        return;
    };
    let store = ledger.open().await;
    append_events(store.clone(), 0, 30).await;
    let priority = store.priority().clone();
    priority.put_foreground_first(true);
    let crowd: Vec<_> = (0..Priority::CROWD)
        .map(|_| priority.foreground())
        .collect();
    let running = Running::start(&store, arc(positions()), options());
    tokio::time::sleep(Duration::from_millis(400)).await;
    let held = registry::checkpoint(store.reader(), NAME)
        .await
        .expect("registry");
    assert!(
        held.unwrap_or(0) == 0,
        "no page while the crowd is there: {held:?}"
    );
    drop(crowd);
    caught_up(&store, NAME).await;
    assert_positions_replayed(&store).await;
    running.stop().await;
    store.close().await;
}

// ---- 2. a second runner, a killed runner ----

async fn a_second_runner_is_detected_by_the_compare_and_set(backend: Backend) {
    let Some(ledger) = Ledger::create(backend).await else {
        return;
    };
    let store = ledger.open().await;
    append_events(store.clone(), 0, 40).await;
    let first = Running::start(&store, arc(positions()), options());
    caught_up(&store, NAME).await;
    first.stop().await;
    append_events(store.clone(), 1, 25).await;
    let from = active(&store, NAME).await.position;
    let to = head(&store).await;
    assert!(to > from);

    // Another runner: it moves the checkpoint and applies the same events in its own open
    // transaction, and commits only once the runner under test has read the same page.
    let events = store.read_all(from + 1, 1000).await.expect("read");
    let links: Vec<_> = events.iter().map(RecordedEvent::link).collect();
    let second = options();
    let runner = second.runner.clone();
    let mut second = Projector::new(store.clone(), arc(positions()), second);
    second.prepare().await.expect("prepare");
    let mut other = Other::read_models(&ledger).await;
    other.execute(other.begin()).await;
    let moved = other
        .execute(&format!(
            "UPDATE projection_checkpoints SET position = {to}, runner = 'other' \
             WHERE name = '{NAME}' AND state = 'active' AND position = {from}"
        ))
        .await;
    assert_eq!(moved, 1);
    positions()
        .apply(other.conn(), NAME, &links)
        .await
        .expect("the other applies the page");
    let second = Running::run(second, runner);
    // The runner reads the page after `from` and blocks on the other's transaction (the row
    // lock on PostgreSQL, the write lock on SQLite); then its compare-and-set finds the
    // checkpoint moved, and it rolls back instead of applying the page twice (which would
    // count those events twice).
    tokio::time::sleep(Duration::from_millis(700)).await;
    other.execute("COMMIT").await;
    append_events(store.clone(), 2, 10).await;
    caught_up(&store, NAME).await;
    assert_positions_replayed(&store).await;
    assert_eq!(
        active(&store, NAME).await.runner.as_deref(),
        Some(second.runner.as_str()),
        "the second runner follows the other's checkpoint and applies what came after"
    );
    second.stop().await;
    store.close().await;
}

async fn a_runner_killed_mid_page_resumes_without_double_applying(backend: Backend) {
    let Some(ledger) = Ledger::create(backend).await else {
        return;
    };
    let store = ledger.open().await;
    append_events(store.clone(), 0, 100).await;
    let pause = Arc::new(Pause {
        at: 50,
        entered: Notify::new(),
    });
    let paused = Positions {
        pause: Some(pause.clone()),
        ..positions()
    };
    let killed = Running::start(
        &store,
        arc(paused),
        ProjectorOptions {
            page_size: 20,
            ..options()
        },
    );
    tokio::time::timeout(PATIENCE, pause.entered.notified())
        .await
        .expect("the runner reaches the page holding position 50");
    // Killed in the middle of the page 41..=60: its rows are written but not committed.
    killed.task.abort();
    let _ = killed.task.await;
    assert_eq!(active(&store, NAME).await.position, 40);
    assert_eq!(
        position_rows(&store).await.len(),
        40,
        "the cut page left nothing"
    );

    let resumed = Running::start(&store, arc(positions()), options());
    caught_up(&store, NAME).await;
    assert_positions_replayed(&store).await;
    resumed.stop().await;
    store.close().await;
}

async fn a_gap_in_the_ledger_stops_the_runner_instead_of_skipping(backend: Backend) {
    let Some(ledger) = Ledger::create(backend).await else {
        return;
    };
    let store = ledger.open().await;
    append_events(store.clone(), 0, 50).await;
    // Tampering: event 30 removed behind the database's back.
    let mut other = Other::connect(&ledger).await;
    match backend {
        Backend::Sqlite => {
            other.execute("DROP TRIGGER events_refuse_delete").await;
            other
                .execute("DELETE FROM events WHERE position = 30")
                .await;
        }
        Backend::Postgres => {
            other
                .execute("ALTER TABLE events DISABLE TRIGGER events_refuse_update_delete")
                .await;
            other
                .execute("DELETE FROM events WHERE position = 30")
                .await;
            other
                .execute("ALTER TABLE events ENABLE TRIGGER events_refuse_update_delete")
                .await;
        }
    }
    let running = Running::start(
        &store,
        arc(positions()),
        ProjectorOptions {
            page_size: 10,
            ..options()
        },
    );
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while registry::checkpoint(store.reader(), NAME)
        .await
        .expect("read")
        != Some(20)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the runner applied 1..=20"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // It keeps retrying the page after 20, and keeps finding the gap.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        active(&store, NAME).await.position,
        20,
        "nothing past the gap"
    );
    assert_eq!(position_rows(&store).await.len(), 20);
    let listed = registry::list(&store).await.expect("list");
    let lag = listed.iter().find(|s| s.name == NAME).expect("listed").lag;
    assert_eq!(lag, 30, "the stall shows as lag");
    running.stop().await;
    store.close().await;
}

async fn an_interrupted_rebuild_resumes_where_it_stopped(backend: Backend) {
    let Some(ledger) = Ledger::create(backend).await else {
        return;
    };
    let store = ledger.open().await;
    append_events(store.clone(), 0, 300).await;
    let running = Running::start(&store, arc(positions()), options());
    caught_up(&store, NAME).await;
    let pause = Arc::new(Pause {
        at: 150,
        entered: Notify::new(),
    });
    let paused = Positions {
        pause: Some(pause.clone()),
        ..positions()
    };
    let small = RebuildOptions {
        page_size: 50,
        ..RebuildOptions::default()
    };
    let first = {
        let (store, small) = (store.clone(), small.clone());
        tokio::spawn(async move { rebuild::rebuild(&store, &paused, &small, &|_| {}).await })
    };
    tokio::time::timeout(PATIENCE, pause.entered.notified())
        .await
        .expect("the rebuild reaches position 150");
    if backend == Backend::Postgres {
        // Another rebuild of the same projection is refused while the first holds its lock.
        let second = rebuild::rebuild(&store, &positions(), &small, &|_| {})
            .await
            .expect_err("refused");
        assert!(
            matches!(second, ProjectorError::RebuildRunning { .. }),
            "{second}"
        );
        assert!(second.to_string().contains("already running"), "{second}");
    }
    first.abort();
    assert!(first.await.is_err(), "the first rebuild was cut off");
    let building = registry::rows(store.reader())
        .await
        .expect("registry")
        .into_iter()
        .find(|r| r.name == NAME && r.state == State::Building)
        .expect("the interrupted version is left building");
    assert_eq!((building.version, building.position), (2, 100));

    // PostgreSQL releases the cut-off rebuild's session lock once its server process has seen
    // the connection close, which may come a moment after the abort.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let report = loop {
        match rebuild::rebuild(&store, &positions(), &small, &|_| {}).await {
            Err(ProjectorError::RebuildRunning { .. })
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => break other.expect("the rebuild resumes"),
        }
    };
    assert_eq!(report.version, 2, "the same version, resumed");
    assert_eq!(report.events, head(&store).await - 100, "{report:?}");
    caught_up(&store, NAME).await;
    assert_positions_replayed(&store).await;
    assert_eq!(versioned_tables(&store).await, Vec::<String>::new());
    running.stop().await;
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_runner_whose_lock_connection_breaks_takes_the_lock_again() {
    let Some(ledger) = Ledger::create(Backend::Postgres).await else {
        return;
    };
    let store = ledger.open().await;
    append_events(store.clone(), 0, 20).await;
    let running = Running::start(&store, arc(positions()), options());
    caught_up(&store, NAME).await;
    let mut admin = Other::connect(&ledger).await;
    let holder = || async {
        let Ledger::Postgres(database) = &ledger else {
            unreachable!("PostgreSQL")
        };
        let mut c = database.connect().await;
        let pid: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND objsubid = 2 AND database = (SELECT oid FROM pg_database \
             WHERE datname = current_database()) \
             AND objid::bigint = (hashtext($1)::bigint + 4294967296) % 4294967296",
        )
        .bind(NAME)
        .fetch_optional(&mut c)
        .await
        .expect("pg_locks");
        pid
    };
    let before = holder().await.expect("the runner holds its lock");
    admin
        .execute(&format!("SELECT pg_terminate_backend({before})"))
        .await;
    append_events(store.clone(), 1, 20).await;
    caught_up(&store, NAME).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match holder().await {
            Some(pid) if pid != before => break,
            other => assert!(
                tokio::time::Instant::now() < deadline,
                "the lock is taken again on a new connection: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    append_events(store.clone(), 2, 20).await;
    caught_up(&store, NAME).await;
    assert_positions_replayed(&store).await;
    running.stop().await;
    store.close().await;
}

// ---- 3. rebuilds while appends continue ----

async fn rebuilds_while_appends_continue_equal_a_fresh_replay(backend: Backend) {
    let Some(ledger) = Ledger::create(backend).await else {
        return;
    };
    let store = ledger.open().await;
    let seed: Vec<_> = (0..3)
        .map(|a| tokio::spawn(lifecycles(store.clone(), a, 40)))
        .collect();
    for task in seed {
        task.await.expect("seed");
    }
    append_events(store.clone(), 0, 200).await;
    let running = Running::start(
        &store,
        vec![Arc::new(OperationStatus), Arc::new(positions())],
        options(),
    );
    caught_up(&store, NAME).await;

    let appenders = Appenders::start(&store, 2, 3);
    let small = RebuildOptions {
        page_size: 100,
        flip_gap: 50,
        ..RebuildOptions::default()
    };
    let before = head(&store).await;
    // Twice: each flip swaps the live table under the store's appends.
    for version in [2, 3] {
        let report = rebuild::rebuild(&store, &OperationStatus, &small, &|_| {})
            .await
            .expect("rebuild operation_status");
        assert_eq!(report.version, version);
        assert!(report.position >= before, "{report:?}");
    }
    let report = rebuild::rebuild(&store, &positions(), &small, &|_| {})
        .await
        .expect("rebuild the async projection");
    assert_eq!(report.version, 2);
    // Appends went on through both rebuilds and flips.
    assert!(head(&store).await > before);
    appenders.stop().await;

    caught_up(&store, NAME).await;
    assert_eq!(status_rows(&store).await, expected_status(&store).await);
    assert_positions_replayed(&store).await;
    for (name, version) in [(operation_status::NAME, 3), (NAME, 2)] {
        let rows: Vec<_> = registry::rows(store.reader())
            .await
            .expect("registry")
            .into_iter()
            .filter(|r| r.name == name)
            .collect();
        assert_eq!(rows.len(), 1, "only the new version is live: {rows:?}");
        assert_eq!((rows[0].version, rows[0].state), (version, State::Active));
    }
    assert_eq!(versioned_tables(&store).await, Vec::<String>::new());
    // The live table keeps working for the store's inline updates after the flip.
    lifecycle(&store, 99, 0).await;
    assert_eq!(status_rows(&store).await, expected_status(&store).await);
    running.stop().await;
    store.close().await;
}

// ---- 4. a changed definition ----

async fn a_changed_definition_is_rebuilt_at_start(backend: Backend) {
    let Some(ledger) = Ledger::create(backend).await else {
        return;
    };
    let store = ledger.open().await;
    lifecycles(store.clone(), 0, 10).await;
    append_events(store.clone(), 0, 60).await;
    let first = Running::start(
        &store,
        vec![Arc::new(OperationStatus), Arc::new(positions())],
        options(),
    );
    caught_up(&store, NAME).await;
    first.stop().await;
    let db = backend_of(&store);

    // The async projection's code changed: `prepare` plans its rebuild, `run` does it in the
    // background and flips.
    let changed = Positions {
        code_version: 2,
        ..positions()
    };
    let wanted = definition_hash(&changed, db);
    assert_ne!(active(&store, NAME).await.definition_hash, wanted);
    let mut projector = Projector::new(store.clone(), arc(changed.clone()), options());
    projector.prepare().await.expect("prepare");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(projector.run(async move {
        let _ = stopped.await;
    }));
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while active(&store, NAME).await.definition_hash != wanted {
        assert!(tokio::time::Instant::now() < deadline, "rebuilt in time");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(active(&store, NAME).await.version, 2);
    append_events(store.clone(), 1, 20).await;
    caught_up(&store, NAME).await;
    assert_positions_replayed(&store).await;
    let _ = stop.send(());
    task.await.expect("runner");

    // The inline projection's stored definition differs (as after an upgrade): `prepare`
    // rebuilds it before returning, so the service never starts on old tables. A row lost
    // from the live table shows the rebuild happened.
    execute(
        store.projection_pool(),
        "UPDATE projection_checkpoints SET definition_hash = 'from an older release' \
         WHERE name = 'operation_status' AND state = 'active'",
    )
    .await;
    let lost = execute(
        store.projection_pool(),
        "DELETE FROM operation_status WHERE operation_id IN \
         (SELECT operation_id FROM operation_status ORDER BY operation_id LIMIT 1)",
    )
    .await;
    assert_eq!(lost, 1);
    assert_ne!(status_rows(&store).await, expected_status(&store).await);
    let mut projector = Projector::new(store.clone(), vec![Arc::new(OperationStatus)], options());
    projector.prepare().await.expect("prepare rebuilds inline");
    let live = active(&store, operation_status::NAME).await;
    assert_eq!(live.version, 2);
    assert_eq!(live.definition_hash, definition_hash(&OperationStatus, db));
    assert_eq!(status_rows(&store).await, expected_status(&store).await);
    store.close().await;
}

// ---- 5. targeted rebuilds ----

async fn a_targeted_rebuild_repairs_one_stream_only(backend: Backend) {
    let Some(ledger) = Ledger::create(backend).await else {
        return;
    };
    let store = ledger.open().await;
    lifecycles(store.clone(), 0, 5).await;
    append_events(store.clone(), 0, 40).await;
    let running = Running::start(
        &store,
        vec![Arc::new(OperationStatus), Arc::new(positions())],
        options(),
    );
    caught_up(&store, NAME).await;

    // Two damaged operations; only one is repaired.
    let expected = expected_status(&store).await;
    let (repaired, left) = (&expected[0].stream_id, &expected[1].stream_id);
    for stream in [repaired, left] {
        execute(
            store.projection_pool(),
            &format!(
                "UPDATE operation_status SET status = 'failed', attempts = 99 \
                 WHERE stream_id = '{stream}'"
            ),
        )
        .await;
    }
    let report = rebuild::rebuild_stream(
        &store,
        &OperationStatus,
        &StreamId::new(repaired.clone()).expect("id"),
    )
    .await
    .expect("targeted rebuild");
    assert_eq!(report.events, 4);
    let rows = status_rows(&store).await;
    let find = |stream: &str| rows.iter().find(|r| r.stream_id == stream).expect("row");
    assert_eq!(
        find(repaired),
        expected
            .iter()
            .find(|r| &r.stream_id == repaired)
            .expect("expected")
    );
    assert_eq!(
        (find(left).status.as_str(), find(left).attempts),
        ("failed", 99)
    );

    // The async projection (in the read models' own file on SQLite): a stream's rows lost, and
    // its count wrong.
    let stream = "it-0-3";
    execute(
        store.read_model_pool(),
        &format!("DELETE FROM \"{NAME}\" WHERE stream_id = '{stream}'"),
    )
    .await;
    execute(
        store.read_model_pool(),
        &format!("UPDATE \"{NAME}_streams\" SET events = 0 WHERE stream_id = '{stream}'"),
    )
    .await;
    let report = rebuild::rebuild_stream(&store, &positions(), &StreamId::new(stream).expect("id"))
        .await
        .expect("targeted rebuild");
    assert!(report.events > 0);
    assert_positions_replayed(&store).await;

    // A projection that cannot forget a stream is refused, and says what to do.
    let whole = Positions {
        forgettable: false,
        ..positions()
    };
    let refused = rebuild::rebuild_stream(&store, &whole, &StreamId::new(stream).expect("id"))
        .await
        .expect_err("refused");
    assert!(
        matches!(refused, ProjectorError::WholeOnly { .. }),
        "{refused}"
    );
    assert!(
        refused.to_string().contains("rebuild it whole"),
        "{refused}"
    );
    assert_positions_replayed(&store).await;
    running.stop().await;
    store.close().await;
}

// ---- 6. takeover between two processes on PostgreSQL ----

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_another_instance_takes_over_a_dead_runner() {
    use crate::support::serving::{Serving, opledger, write_config};
    let Some(ledger) = Ledger::create(Backend::Postgres).await else {
        return;
    };
    let store = ledger.open().await;
    lifecycles(store.clone(), 0, 10).await;
    let dir = tempfile::tempdir().expect("temporary directory");
    let config = write_config(
        dir.path(),
        "opledger.toml",
        "[server]\nlisten = \"127.0.0.1:0\"\n",
    );
    let url = ledger.url();
    let start = || {
        let mut command = opledger(&[("OPLEDGER_DATABASE_URL", url.as_str())]);
        command.arg("--config").arg(&config);
        Serving::start(command)
    };
    let mut one = start();
    let mut two = start();
    one.address().await;
    two.address().await;
    let name = opledger_projections::builtin()
        .into_iter()
        .find(|p| !p.inline())
        .expect("an asynchronous built-in projection")
        .name();
    caught_up(&store, name).await;
    let holder = active(&store, name)
        .await
        .runner
        .expect("a runner advanced it");
    let pid = holder.rsplit(':').next().expect("host:pid").to_owned();
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());

    lifecycles(store.clone(), 1, 10).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let row = active(&store, name).await;
        if row.runner.as_deref() != Some(holder.as_str()) && row.position == head(&store).await {
            let survivor = row.runner.expect("runner");
            let pid = survivor.rsplit(':').next().expect("pid");
            let alive = std::process::Command::new("kill")
                .args(["-0", pid])
                .status()
                .expect("kill -0");
            assert!(alive.success(), "{survivor} is the other, live process");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the other instance took over within seconds: {row:?}\none: {}\ntwo: {}",
            one.stderr(),
            two.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(one);
    drop(two);
    store.close().await;
}

// ---- 7. the command line ----

async fn the_cli_lists_and_rebuilds(backend: Backend) {
    use crate::support::{stderr, stdout};
    let Some(ledger) = Ledger::create(backend).await else {
        return;
    };
    let url = ledger.url();
    let store = ledger.open().await;
    lifecycles(store.clone(), 0, 6).await;
    let head = head(&store).await;
    store.close().await;

    let listed = cli(&url, &["projections", "list"]).await;
    assert!(listed.status.success(), "{}", stderr(&listed));
    let text = stdout(&listed);
    assert!(text.starts_with("NAME"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("operation_status") && l.contains("unregistered")),
        "{text}"
    );

    let rebuilt = cli(
        &url,
        &["projections", "rebuild", "operation_status", "--json"],
    )
    .await;
    assert!(rebuilt.status.success(), "{}", stderr(&rebuilt));
    let report: serde_json::Value =
        serde_json::from_str(stdout(&rebuilt).trim()).expect("one JSON object");
    assert_eq!(report["projection"], "operation_status");
    assert_eq!(report["version"], 2, "registered as v1, rebuilt as v2");
    assert_eq!(report["events"], head);
    assert!(report["events_per_sec"].as_f64().expect("a rate") > 0.0);
    assert!(report["peak_rss_bytes"].as_u64().expect("bytes") > 0);
    assert!(report["seconds"].is_number());

    let plain = cli(&url, &["projections", "rebuild", "operation_status"]).await;
    assert!(plain.status.success(), "{}", stderr(&plain));
    assert!(
        stdout(&plain).starts_with("rebuilt operation_status v3: "),
        "{}",
        stdout(&plain)
    );

    let listed = cli(&url, &["projections", "list", "--json"]).await;
    assert!(listed.status.success(), "{}", stderr(&listed));
    let rows: Vec<serde_json::Value> = stdout(&listed)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON lines"))
        .collect();
    let status = rows
        .iter()
        .find(|r| r["name"] == "operation_status")
        .expect("listed");
    assert_eq!(status["version"], 3);
    assert_eq!(status["state"], "active");
    assert_eq!(status["inline"], true);
    assert_eq!(status["lag"], 0);
    assert_eq!(status["checkpoint"], head);
    assert!(status["runner"].as_str().is_some_and(|r| r.contains(':')));

    let stream = operation_stream("coupon", "a0-2").expect("stream");
    let one = cli(
        &url,
        &[
            "projections",
            "rebuild",
            "operation_status",
            "--stream",
            &stream,
        ],
    )
    .await;
    assert!(one.status.success(), "{}", stderr(&one));
    assert!(
        stdout(&one).contains("4 events up to position"),
        "{}",
        stdout(&one)
    );

    let unknown = cli(&url, &["projections", "rebuild", "nosuch"]).await;
    assert_eq!(unknown.status.code(), Some(2), "a usage error");
    let err = stderr(&unknown);
    assert!(
        err.contains("nosuch") && err.contains("operation_status"),
        "names the known ones: {err}"
    );

    if let Some(whole) = opledger_projections::builtin().into_iter().find(|p| {
        // A built-in that aggregates across streams (metrics) cannot rebuild one stream.
        p.name() == "metrics"
    }) {
        let refused = cli(
            &url,
            &[
                "projections",
                "rebuild",
                whole.name(),
                "--stream",
                "op-anything",
            ],
        )
        .await;
        assert_eq!(refused.status.code(), Some(1));
        assert!(
            stderr(&refused).contains("rebuild it whole"),
            "{}",
            stderr(&refused)
        );
    }
}
