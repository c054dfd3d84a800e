//! Event store benchmark, SQLite and PostgreSQL: appends through the store at 1, 8 and 64
//! concurrent callers (one event per call) against raw sqlx one-row-per-transaction inserts into
//! a table of the same shape (on PostgreSQL also against the rows an append writes, written
//! alone: the floor of a one-caller append), and `read_all` against a raw ordered SELECT, all
//! measured in one run on one machine. Prints one Markdown table per backend.
//!
//! `cargo bench -p opledger-store --bench store`
//!
//! Knobs (environment): `OPLEDGER_BENCH_SECONDS` per append measurement (default 5),
//! `OPLEDGER_BENCH_READ_EVENTS` ledger size for the read measurements (default 1,000,000),
//! `OPLEDGER_BENCH_DIR` where SQLite files go (default: the system's temp dir),
//! `OPLEDGER_BENCH_PG_URL` the PostgreSQL server (default
//! `postgres://postgres@127.0.0.1:5432/postgres`; it creates and drops its own databases),
//! `OPLEDGER_BENCH_BACKENDS` (default `sqlite,postgres`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use opledger_store::{
    AnyOptions, AnyStore, AppendRequest, EventStore, ExpectedVersion, NewEvent, StreamId,
};
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection, Executor, Row};

/// Telegram update ids have nine digits for a long time; equal lengths keep text order numeric.
const FIRST_UPDATE_ID: u64 = 500_000_000;

const EVENT_COLUMNS: &str = "position, stream_id, version, event_id, event_type, schema_version, \
     payload, metadata, recorded_at, prev_hash, hash";

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

/// A realistic event: an operation's `Received` with a few parameters, and its causation.
fn event(n: u64) -> NewEvent {
    NewEvent::from_serialize(
        "Received",
        1,
        &json!({
            "operation_id": "3f2b6c1e-8a4d-5e7f-9b0c-1d2e3f4a5b6c",
            "action": "coupon",
            "business_key": format!("spring:{n}"),
            "fingerprint": "9c56cc51b374c3ba189210d5b6d4bf57790d351c96c47c02190ecf1e430635ab",
            "params": { "campaign": "spring" },
            "bot": "shop", "chat_id": 123_456_789, "user_id": 987_654_321,
            "update_id": FIRST_UPDATE_ID + n, "max_attempts": 5
        }),
        &json!({ "causation": { "kind": "update", "bot": "shop", "update_id": FIRST_UPDATE_ID + n } }),
    )
    .expect("bench events serialize")
}

/// The stream of the `n`-th measured append: a delivery `update-shop-<update_id>` (update ids
/// rise, as the baselines' keys do), or with `scattered` an operation stream keyed by a business
/// key that lands on a random index page, as user ids do.
fn stream_of(n: u64, scattered: bool) -> String {
    if scattered {
        format!(
            "op-coupon-spring:{}",
            n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20
        )
    } else {
        format!("update-shop-{}", FIRST_UPDATE_ID + n)
    }
}

struct Rate {
    label: String,
    per_second: f64,
    p50: Option<Duration>,
    p99: Option<Duration>,
}

impl Rate {
    fn from_latencies(label: String, mut latencies: Vec<Duration>, elapsed: Duration) -> Self {
        latencies.sort_unstable();
        let at =
            |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
        Rate {
            per_second: latencies.len() as f64 / elapsed.as_secs_f64(),
            p50: Some(at(0.50)),
            p99: Some(at(0.99)),
            label,
        }
    }

    fn throughput(label: String, count: u64, elapsed: Duration) -> Self {
        Rate {
            label,
            per_second: count as f64 / elapsed.as_secs_f64(),
            p50: None,
            p99: None,
        }
    }
}

/// Runs `workers` tasks that each repeat `work(n)` with a fresh `n` until `seconds` pass, and
/// measures every call's latency.
async fn closed_loop<F, Fut>(label: String, workers: u64, seconds: u64, work: F) -> Rate
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let next = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (next, work) = (next.clone(), work.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let call = Instant::now();
                    work(n).await;
                    latencies.push(call.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("worker"));
    }
    Rate::from_latencies(label, latencies, started.elapsed())
}

async fn store_appends(url: &str, callers: u64, seconds: u64, scattered: bool) -> Rate {
    let store = AnyStore::open(url, AnyOptions::default())
        .await
        .expect("open");
    let keys = if scattered {
        ", scattered op-… keys"
    } else {
        ""
    };
    let label = format!("store append, {callers} concurrent caller(s), 1 event/call{keys}");
    let rate = closed_loop(label, callers, seconds, {
        let store = store.clone();
        move |n| {
            let store = store.clone();
            async move {
                let stream = StreamId::new(stream_of(n, scattered)).unwrap();
                store
                    .append(vec![AppendRequest::new(
                        stream,
                        ExpectedVersion::NoStream,
                        vec![event(n)],
                    )])
                    .await
                    .expect("append");
            }
        }
    })
    .await;
    store.close().await;
    rate
}

/// Fills a ledger with `total` events: operations of four events each, 50 streams per call.
async fn fill(url: &str, total: u64) {
    let store = AnyStore::open(url, AnyOptions::default())
        .await
        .expect("open");
    let mut written = 0;
    let mut op = 0;
    while written < total {
        let streams = (200.min(total - written) / 4).max(1);
        let requests = (0..streams)
            .map(|_| {
                op += 1;
                AppendRequest::new(
                    StreamId::new(format!("op-coupon-spring:{op}")).unwrap(),
                    ExpectedVersion::NoStream,
                    (0..4).map(|k| event(op * 4 + k)).collect(),
                )
            })
            .collect();
        written = *store.append(requests).await.expect("fill").positions.end();
    }
    store.close().await;
}

async fn store_read_all(store: &AnyStore, page: usize) -> (Rate, u64) {
    let started = Instant::now();
    let mut next = 1;
    let mut bytes = 0u64;
    loop {
        let events = store.read_all(next, page).await.expect("read_all");
        let Some(last) = events.last() else { break };
        next = last.position + 1;
        bytes += events.iter().map(|e| e.payload.len() as u64).sum::<u64>();
    }
    let elapsed = started.elapsed();
    let label = format!("store read_all, pages of {page}");
    (Rate::throughput(label, next - 1, elapsed), bytes)
}

/// A raw ordered SELECT of every event on `$connection`, decoding each column into owned values
/// as the store does. A macro because the two backends' row types differ.
macro_rules! scan {
    ($connection:expr) => {{
        let started = Instant::now();
        let sql = format!("SELECT {EVENT_COLUMNS} FROM events ORDER BY position");
        let mut rows = sqlx::query(sqlx::AssertSqlSafe(sql)).fetch($connection);
        let (mut count, mut bytes) = (0u64, 0u64);
        while let Some(row) = rows.try_next().await.expect("scan") {
            let _position: i64 = row.get(0);
            let _stream: String = row.get(1);
            let _version: i64 = row.get(2);
            let _type: String = row.get(4);
            let payload: Vec<u8> = row.get(6);
            let _metadata: Vec<u8> = row.get(7);
            let _prev: Vec<u8> = row.get(9);
            let _hash: Vec<u8> = row.get(10);
            bytes += payload.len() as u64;
            count += 1;
        }
        let label = "raw sqlx ordered SELECT of the same rows (baseline)".into();
        (Rate::throughput(label, count, started.elapsed()), bytes)
    }};
}

/// One backend's raw baselines.
trait Baseline {
    /// A fresh, empty database for one measurement.
    async fn fresh(&mut self, name: &str) -> String;
    /// One-row INSERT transactions into a table shaped like `events`, from `connections`
    /// concurrent connections.
    async fn one_row_inserts(&mut self, connections: u64, seconds: u64) -> Rate;
    /// The whole `events` table of the ledger at `url`, in position order, decoded like the
    /// store decodes it.
    async fn ordered_scan(&mut self, url: &str) -> (Rate, u64);
    /// Lets the database finish the background work a bulk load leaves (PostgreSQL's
    /// autovacuum would otherwise compete with the first read measured).
    async fn settle(&mut self, url: &str);
    /// Starts a measurement from a clean server state (PostgreSQL: a checkpoint, so that no
    /// measurement pays for the dirty pages of the one before).
    async fn before_measurement(&mut self);
    /// Where the store's own rows cost more than the raw insert's one row: the rows an append
    /// of one event writes, on the ledger's own schema, with none of the append's reads, locks
    /// or checks, from one connection; the best a one-caller append could do.
    async fn ledger_rows(&mut self, _seconds: u64) -> Option<Rate> {
        None
    }
}

struct SqliteBaseline {
    dir: tempfile::TempDir,
}

impl Baseline for SqliteBaseline {
    async fn fresh(&mut self, name: &str) -> String {
        format!(
            "sqlite://{}",
            self.dir.path().join(format!("{name}.db")).display()
        )
    }

    async fn one_row_inserts(&mut self, connections: u64, seconds: u64) -> Rate {
        assert_eq!(connections, 1, "SQLite has one writer at a time");
        let mut connection = SqliteConnectOptions::new()
            .filename(self.dir.path().join("raw.db"))
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .connect()
            .await
            .expect("connect");
        // The shape of migrations/sqlite's `events` (keys, uniqueness, checks), without the
        // foreign key and triggers, and with no ledger head: nothing orders these inserts.
        connection
            .execute(
                "CREATE TABLE events (position INTEGER PRIMARY KEY, stream_id TEXT NOT NULL, \
                 version INTEGER NOT NULL CHECK (version >= 1), \
                 event_id BLOB NOT NULL CHECK (length(event_id) = 16), event_type TEXT NOT NULL, \
                 schema_version INTEGER NOT NULL, payload BLOB NOT NULL, metadata BLOB NOT NULL, \
                 recorded_at INTEGER NOT NULL, prev_hash BLOB NOT NULL, hash BLOB NOT NULL, \
                 UNIQUE (stream_id, version))",
            )
            .await
            .expect("create table");
        let deadline = Instant::now() + Duration::from_secs(seconds);
        let started = Instant::now();
        let mut latencies = Vec::new();
        let mut n = 0;
        while Instant::now() < deadline {
            let e = event(n);
            let call = Instant::now();
            let mut tx = connection.begin().await.expect("begin");
            sqlx::query(
                "INSERT INTO events (stream_id, version, event_id, event_type, schema_version, \
                 payload, metadata, recorded_at, prev_hash, hash) \
                 VALUES (?, 1, ?, ?, 1, ?, ?, ?, ?, ?)",
            )
            .bind(stream_of(n, false))
            .bind(&uuid::Uuid::from_u128(u128::from(n)).as_bytes()[..])
            .bind(&e.event_type)
            .bind(e.payload.get().as_bytes())
            .bind(e.metadata.get().as_bytes())
            .bind(1_764_000_000_000_000_i64)
            .bind(&[0u8; 32][..])
            .bind(&[1u8; 32][..])
            .execute(&mut *tx)
            .await
            .expect("insert");
            tx.commit().await.expect("commit");
            latencies.push(call.elapsed());
            n += 1;
        }
        let label = "raw sqlx, one-row INSERT per transaction, 1 connection (baseline)".into();
        Rate::from_latencies(label, latencies, started.elapsed())
    }

    async fn ordered_scan(&mut self, url: &str) -> (Rate, u64) {
        let options: SqliteConnectOptions = url.parse().expect("url");
        let mut connection = options.connect().await.expect("connect");
        scan!(&mut connection)
    }

    async fn settle(&mut self, _url: &str) {}

    async fn before_measurement(&mut self) {}
}

struct PgBaseline {
    admin_url: String,
    admin: PgConnectOptions,
    databases: Vec<String>,
    prefix: String,
}

impl PgBaseline {
    async fn connect(url: &str) -> Result<Self, sqlx::Error> {
        let admin: PgConnectOptions = url.parse()?;
        admin.connect().await?.close().await?;
        Ok(Self {
            admin_url: url.to_owned(),
            admin,
            databases: Vec::new(),
            prefix: format!("opledger_bench_{}", std::process::id()),
        })
    }

    async fn drop_databases(&mut self) {
        let mut connection = self.admin.connect().await.expect("connect");
        for name in self.databases.drain(..) {
            let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
            connection
                .execute(sqlx::AssertSqlSafe(sql))
                .await
                .expect("drop");
        }
    }

    /// The admin URL with its database (the last path segment) replaced by `name`.
    fn url_of(&self, name: &str) -> String {
        let (base, query) = self
            .admin_url
            .split_once('?')
            .map_or((self.admin_url.as_str(), None), |(b, q)| (b, Some(q)));
        let authority_end = base.find("://").map_or(0, |i| i + 3);
        let base = match base[authority_end..].rfind('/') {
            Some(slash) => &base[..authority_end + slash],
            None => base,
        };
        match query {
            Some(query) => format!("{base}/{name}?{query}"),
            None => format!("{base}/{name}"),
        }
    }
}

impl Baseline for PgBaseline {
    async fn fresh(&mut self, name: &str) -> String {
        let name = format!("{}_{name}", self.prefix);
        let mut connection = self.admin.connect().await.expect("connect");
        for sql in [
            format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            format!("CREATE DATABASE {name}"),
        ] {
            connection
                .execute(sqlx::AssertSqlSafe(sql))
                .await
                .expect("create database");
        }
        self.databases.push(name.clone());
        self.url_of(&name)
    }

    async fn one_row_inserts(&mut self, connections: u64, seconds: u64) -> Rate {
        let url = self.fresh(&format!("raw{connections}")).await;
        let pool = PgPoolOptions::new()
            .max_connections(connections as u32)
            .min_connections(connections as u32)
            .connect(&url)
            .await
            .expect("connect");
        // The shape of migrations/postgres's `events`, without the foreign key and triggers,
        // positions from a sequence: no ordering lock of any kind.
        pool.execute(
            "CREATE TABLE events (position bigserial PRIMARY KEY, \
             stream_id text COLLATE \"C\" NOT NULL, version bigint NOT NULL CHECK (version >= 1), \
             event_id uuid NOT NULL, event_type text NOT NULL, schema_version integer NOT NULL, \
             payload bytea NOT NULL, metadata bytea NOT NULL, \
             recorded_at timestamptz NOT NULL DEFAULT clock_timestamp(), \
             prev_hash bytea NOT NULL, hash bytea NOT NULL, UNIQUE (stream_id, version))",
        )
        .await
        .expect("create table");
        let label = format!(
            "raw sqlx, one-row INSERT per transaction, {connections} connection(s), no ordering lock"
        );
        closed_loop(label, connections, seconds, move |n| {
            let pool = pool.clone();
            async move {
                let e = event(n);
                let mut tx = pool.begin().await.expect("begin");
                sqlx::query(
                    "INSERT INTO events (stream_id, version, event_id, event_type, schema_version, \
                     payload, metadata, prev_hash, hash) VALUES ($1, 1, $2, $3, 1, $4, $5, $6, $7)",
                )
                .bind(stream_of(n, false))
                .bind(uuid::Uuid::from_u128(u128::from(n)))
                .bind(&e.event_type)
                .bind(e.payload.get().as_bytes())
                .bind(e.metadata.get().as_bytes())
                .bind(&[0u8; 32][..])
                .bind(&[1u8; 32][..])
                .execute(&mut *tx)
                .await
                .expect("insert");
                tx.commit().await.expect("commit");
            }
        })
        .await
    }

    async fn ordered_scan(&mut self, url: &str) -> (Rate, u64) {
        let options: PgConnectOptions = url.parse().expect("url");
        let mut connection = options.connect().await.expect("connect");
        scan!(&mut connection)
    }

    /// One statement per transaction writing what `opledger_append` writes for one event of a
    /// new stream (its `streams` row, its `events` row, the head), with the schema's triggers
    /// (the head's deferred check among them) and nothing else.
    async fn ledger_rows(&mut self, seconds: u64) -> Option<Rate> {
        let url = self.fresh("rows").await;
        AnyStore::open(&url, AnyOptions::default())
            .await
            .expect("migrate")
            .close()
            .await;
        // No ping before each statement: the floor is one round trip.
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .test_before_acquire(false)
            .connect(&url)
            .await
            .expect("connect");
        let label = "the append's rows alone (streams, events, head: one statement per \
                     transaction, no reads or checks), 1 connection (floor)"
            .to_owned();
        let hash = |position: u64| {
            let mut hash = [0u8; 32];
            hash[..8].copy_from_slice(&position.to_be_bytes());
            hash
        };
        Some(
            closed_loop(label, 1, seconds, move |n| {
                let pool = pool.clone();
                async move {
                    // One connection takes n = 0, 1, 2, … in order: the positions stay gapless.
                    let (position, e) = (n + 1, event(n));
                    let stream = stream_of(n, false);
                    sqlx::query(
                        "WITH s AS (INSERT INTO streams (stream_id, stream_type, version, \
                         created_at) VALUES ($2, 'update', 1, now())), \
                         e AS (INSERT INTO events (position, stream_id, version, event_id, \
                         event_type, schema_version, payload, metadata, recorded_at, prev_hash, \
                         hash) VALUES ($1, $2, 1, $3, $4, 1, $5, $6, now(), $7, $8)) \
                         UPDATE ledger_head SET last_position = $1, last_hash = $8, \
                         updated_at = now() WHERE ledger_id = 1",
                    )
                    .bind(i64::try_from(position).expect("position"))
                    .bind(stream)
                    .bind(uuid::Uuid::from_u128(u128::from(n)))
                    .bind(&e.event_type)
                    .bind(e.payload.get().as_bytes())
                    .bind(e.metadata.get().as_bytes())
                    .bind(&hash(n)[..])
                    .bind(&hash(position)[..])
                    .execute(&pool)
                    .await
                    .expect("the append's rows");
                }
            })
            .await,
        )
    }

    async fn settle(&mut self, url: &str) {
        let options: PgConnectOptions = url.parse().expect("url");
        let mut connection = options.connect().await.expect("connect");
        connection
            .execute("VACUUM (ANALYZE) events, streams")
            .await
            .expect("vacuum");
    }

    async fn before_measurement(&mut self) {
        let mut connection = self.admin.connect().await.expect("connect");
        connection.execute("CHECKPOINT").await.expect("checkpoint");
    }
}

fn faster(best: Option<Rate>, candidate: Rate) -> Rate {
    match best {
        Some(best) if best.per_second >= candidate.per_second => best,
        _ => candidate,
    }
}

fn print_table(title: &str, rows: &[(&Rate, &Rate)]) {
    let ms = |d: Option<Duration>| {
        d.map_or_else(String::new, |d| format!("{:.2}", d.as_secs_f64() * 1e3))
    };
    println!("\n{title}\n");
    println!("| measurement | per second | p50 ms | p99 ms | vs its baseline |");
    println!("|---|---:|---:|---:|---:|");
    for (rate, baseline) in rows {
        println!(
            "| {} | {:.0} | {} | {} | {:.2}x |",
            rate.label,
            rate.per_second,
            ms(rate.p50),
            ms(rate.p99),
            rate.per_second / baseline.per_second
        );
    }
}

/// The store's appends and reads against one backend's baselines; returns the target lines.
async fn run<B: Baseline>(
    backend: &str,
    baseline: &mut B,
    raw_connections: &[u64],
    target: f64,
    seconds: u64,
    read_events: u64,
) -> Vec<String> {
    let mut raws = Vec::new();
    for &connections in raw_connections {
        baseline.before_measurement().await;
        raws.push(baseline.one_row_inserts(connections, seconds).await);
    }
    baseline.before_measurement().await;
    let floor = baseline.ledger_rows(seconds).await;
    let mut appends = Vec::new();
    for callers in [1, 8, 64] {
        let url = baseline.fresh(&format!("append{callers}")).await;
        baseline.before_measurement().await;
        appends.push(store_appends(&url, callers, seconds, false).await);
    }
    let url = baseline.fresh("scattered").await;
    baseline.before_measurement().await;
    let scattered = store_appends(&url, 64, seconds, true).await;
    eprintln!("{backend}: filling a ledger with {read_events} events for the read measurements...");
    let url = baseline.fresh("read").await;
    // The reading store is opened on the empty ledger and reads it before the fill, as a
    // long-running service would have: query plans cached while the ledger was empty must not
    // slow it down once it is large.
    let reader = AnyStore::open(&url, AnyOptions::default())
        .await
        .expect("open");
    for _ in 0..10 {
        reader.read_all(1, 1000).await.expect("read_all");
    }
    fill(&url, read_events).await;
    baseline.settle(&url).await;
    // Each read twice, alternating, keeping the faster: both then read from a warm cache.
    let mut raw_scan: Option<Rate> = None;
    let mut read_all: Option<Rate> = None;
    let mut store_bytes = 0;
    for _ in 0..2 {
        let (raw, raw_bytes) = baseline.ordered_scan(&url).await;
        let (store, bytes) = store_read_all(&reader, 1000).await;
        assert_eq!(raw_bytes, bytes, "both reads saw the same payloads");
        store_bytes = bytes;
        raw_scan = Some(faster(raw_scan, raw));
        read_all = Some(faster(read_all, store));
    }
    let (raw_scan, read_all) = (raw_scan.expect("measured"), read_all.expect("measured"));
    reader.close().await;

    let strongest = raws
        .iter()
        .max_by(|a, b| a.per_second.total_cmp(&b.per_second))
        .expect("a baseline");
    let mut rows: Vec<(&Rate, &Rate)> = raws.iter().map(|raw| (raw, strongest)).collect();
    rows.extend(floor.iter().map(|rate| (rate, strongest)));
    rows.extend(appends.iter().map(|rate| (rate, strongest)));
    rows.push((&scattered, strongest));
    rows.push((&raw_scan, &raw_scan));
    rows.push((&read_all, &raw_scan));
    print_table(
        &format!(
            "{backend}: {seconds} s per append measurement; appends compared with the fastest \
             raw insert row; reads over {read_events} events ({} MB of payloads), best of two",
            store_bytes / 1_000_000
        ),
        &rows,
    );
    let at_64 = appends[2].per_second / strongest.per_second;
    let reads = read_all.per_second / raw_scan.per_second;
    let verdict = |met: bool| if met { "met" } else { "MISSED" };
    let alone = appends[0].per_second / raws[0].per_second;
    let mut lines = vec![format!(
        "{backend}: an append at 1 caller >= 0.8x the raw insert at 1 connection: {} ({alone:.2}x)",
        verdict(alone >= 0.8)
    )];
    if let Some(floor) = &floor {
        lines.push(format!(
            "{backend}: the append's rows alone, at 1 connection, reach {:.2}x the raw insert \
             (the most an append at 1 caller could); the append reaches {:.2}x of them",
            floor.per_second / raws[0].per_second,
            appends[0].per_second / floor.per_second
        ));
    }
    lines.extend([
        format!(
            "{backend}: appends at 64 callers >= {target}x the raw rate at {} connection(s): {} ({at_64:.1}x)",
            raw_connections.last().expect("a connection count"),
            verdict(at_64 >= target)
        ),
        format!(
            "{backend}: read_all >= 0.5x the raw scan: {} ({reads:.2}x)",
            verdict(reads >= 0.5)
        ),
    ]);
    lines
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`; anything else (e.g. `cargo test --benches`) only checks that
    // the benchmark builds and starts.
    if !std::env::args().any(|a| a == "--bench") {
        println!("run with `cargo bench -p opledger-store --bench store`");
        return;
    }
    let seconds = env_number("OPLEDGER_BENCH_SECONDS", 5);
    let read_events = env_number("OPLEDGER_BENCH_READ_EVENTS", 1_000_000);
    let backends = std::env::var("OPLEDGER_BENCH_BACKENDS").unwrap_or("sqlite,postgres".into());
    let mut verdicts = Vec::new();

    if backends.contains("sqlite") {
        let dir = match std::env::var_os("OPLEDGER_BENCH_DIR") {
            Some(base) => tempfile::tempdir_in(base),
            None => tempfile::tempdir(),
        }
        .expect("temporary directory");
        let mut sqlite = SqliteBaseline { dir };
        verdicts.extend(
            run(
                "SQLite (WAL, synchronous=FULL)",
                &mut sqlite,
                &[1],
                5.0,
                seconds,
                read_events,
            )
            .await,
        );
    }
    if backends.contains("postgres") {
        let url = std::env::var("OPLEDGER_BENCH_PG_URL")
            .unwrap_or("postgres://postgres@127.0.0.1:5432/postgres".into());
        match PgBaseline::connect(&url).await {
            Ok(mut postgres) => {
                verdicts.extend(
                    run(
                        "PostgreSQL (synchronous_commit=on)",
                        &mut postgres,
                        &[1, 8, 16],
                        2.0,
                        seconds,
                        read_events,
                    )
                    .await,
                );
                postgres.drop_databases().await;
            }
            Err(error) => println!("\nPostgreSQL skipped: cannot connect to {url}: {error}"),
        }
    }
    println!("\ntargets:");
    for verdict in verdicts {
        println!("- {verdict}");
    }
}
