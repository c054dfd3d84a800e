//! Event store benchmark (SQLite): appends through the store at 1, 8 and 64 concurrent callers
//! against a raw one-row-per-transaction sqlx baseline, and `read_all` against a raw ordered
//! SELECT, all measured in one run on one machine. Prints one Markdown table.
//!
//! `cargo bench -p opledger-store --bench store`
//!
//! Knobs (environment): `OPLEDGER_BENCH_SECONDS` per append measurement (default 5),
//! `OPLEDGER_BENCH_READ_EVENTS` ledger size for the read measurements (default 1,000,000),
//! `OPLEDGER_BENCH_DIR` where the temporary files go (default: the system's temp dir).

use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use opledger_store::{
    AppendRequest, EventStore, ExpectedVersion, NewEvent, SqliteOptions, SqliteStore, StreamId,
};
use serde_json::json;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection, Executor, Row};

/// Telegram update ids have nine digits for a long time; equal lengths keep text order numeric.
const FIRST_UPDATE_ID: u64 = 500_000_000;

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
            "update_id": 500_000_000 + n, "max_attempts": 5
        }),
        &json!({ "causation": { "kind": "update", "bot": "shop", "update_id": 500_000_000 + n } }),
    )
    .expect("bench events serialize")
}

struct Rate {
    label: String,
    per_second: f64,
    p50: Option<Duration>,
    p99: Option<Duration>,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// Stream ids like Telegram deliveries: `update-shop-<update_id>`, update ids rising (what
/// the baseline inserts too), or with `random_keys` operation streams keyed by a scattered
/// business key, which touch a different index page per event.
async fn store_appends(
    dir: &std::path::Path,
    callers: u64,
    seconds: u64,
    random_keys: bool,
) -> Rate {
    let path = dir.join(format!("append-{callers}-{random_keys}.db"));
    let store = SqliteStore::open(
        &format!("sqlite://{}", path.display()),
        SqliteOptions::default(),
    )
    .await
    .expect("open");
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let next = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(FIRST_UPDATE_ID));
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let store = store.clone();
            let next = next.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let id = if random_keys {
                        // A multiplicative hash scatters the keys like user ids do.
                        format!(
                            "op-coupon-spring:{}",
                            i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20
                        )
                    } else {
                        format!("update-shop-{i}")
                    };
                    let stream = StreamId::new(id).unwrap();
                    let call = Instant::now();
                    store
                        .append(vec![AppendRequest::new(
                            stream,
                            ExpectedVersion::NoStream,
                            vec![event(i)],
                        )])
                        .await
                        .expect("append");
                    latencies.push(call.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.unwrap());
    }
    let elapsed = started.elapsed();
    store.close().await;
    latencies.sort_unstable();
    let keys = if random_keys {
        ", scattered op-… keys"
    } else {
        ""
    };
    Rate {
        label: format!("store append, {callers} concurrent caller(s), 1 event/call{keys}"),
        per_second: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50: Some(percentile(&latencies, 0.50)),
        p99: Some(percentile(&latencies, 0.99)),
    }
}

/// The same table shape as `events`, written the naive way: one row per durable transaction.
async fn raw_one_row_inserts(dir: &std::path::Path, seconds: u64) -> Rate {
    let path = dir.join("raw.db");
    let mut connection = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .connect()
        .await
        .expect("connect");
    connection
        .execute(
            "CREATE TABLE events (position INTEGER PRIMARY KEY, stream_id TEXT NOT NULL, \
             version INTEGER NOT NULL, event_id BLOB NOT NULL, event_type TEXT NOT NULL, \
             schema_version INTEGER NOT NULL, payload BLOB NOT NULL, metadata BLOB NOT NULL, \
             recorded_at INTEGER NOT NULL, prev_hash BLOB NOT NULL, hash BLOB NOT NULL, \
             UNIQUE (stream_id, version))",
        )
        .await
        .expect("create table");
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut latencies = Vec::new();
    let mut i: u64 = FIRST_UPDATE_ID;
    while Instant::now() < deadline {
        let e = event(i);
        let call = Instant::now();
        let mut tx = connection.begin().await.expect("begin");
        sqlx::query(
            "INSERT INTO events (position, stream_id, version, event_id, event_type, schema_version, \
             payload, metadata, recorded_at, prev_hash, hash) VALUES (?, ?, 1, ?, ?, 1, ?, ?, ?, ?, ?)",
        )
        .bind((i - FIRST_UPDATE_ID) as i64 + 1)
        .bind(format!("update-shop-{i}"))
        .bind(&uuid::Uuid::from_u128(u128::from(i)).as_bytes()[..])
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
        i += 1;
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    Rate {
        label: "raw sqlx, one-row INSERT per transaction (baseline)".into(),
        per_second: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50: Some(percentile(&latencies, 0.50)),
        p99: Some(percentile(&latencies, 0.99)),
    }
}

/// Fills a ledger with `total` events: operations of four events each, 50 streams per call.
async fn fill(dir: &std::path::Path, total: u64) -> String {
    let url = format!("sqlite://{}", dir.join("read.db").display());
    let store = SqliteStore::open(&url, SqliteOptions::default())
        .await
        .expect("open");
    let per_call = 200;
    let mut written = 0;
    let mut op = 0;
    while written < total {
        let streams = (per_call.min(total - written) / 4).max(1);
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
        let appended = store.append(requests).await.expect("fill");
        written = *appended.positions.end();
    }
    store.close().await;
    url
}

async fn store_read_all(url: &str, page: usize) -> (Rate, u64) {
    let store = SqliteStore::open(url, SqliteOptions::default())
        .await
        .expect("open");
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
    store.close().await;
    let rate = Rate {
        label: format!("store read_all, pages of {page}"),
        per_second: (next - 1) as f64 / elapsed.as_secs_f64(),
        p50: None,
        p99: None,
    };
    (rate, bytes)
}

async fn raw_ordered_scan(url: &str) -> (Rate, u64) {
    let options: SqliteConnectOptions = url.parse().expect("url");
    let mut connection = options.connect().await.expect("connect");
    let started = Instant::now();
    let mut rows = sqlx::query(
        "SELECT position, stream_id, version, event_id, event_type, schema_version, payload, \
         metadata, recorded_at, prev_hash, hash FROM events ORDER BY position",
    )
    .fetch(&mut connection);
    let mut count = 0u64;
    let mut bytes = 0u64;
    while let Some(row) = rows.try_next().await.expect("scan") {
        let _position: i64 = row.get(0);
        let _stream: String = row.get(1);
        let _version: i64 = row.get(2);
        let _id: Vec<u8> = row.get(3);
        let _type: String = row.get(4);
        let _schema: i64 = row.get(5);
        let payload: Vec<u8> = row.get(6);
        let _metadata: Vec<u8> = row.get(7);
        let _at: i64 = row.get(8);
        let _prev: Vec<u8> = row.get(9);
        let _hash: Vec<u8> = row.get(10);
        bytes += payload.len() as u64;
        count += 1;
    }
    let elapsed = started.elapsed();
    let rate = Rate {
        label: "raw sqlx ordered SELECT of the same rows (baseline)".into(),
        per_second: count as f64 / elapsed.as_secs_f64(),
        p50: None,
        p99: None,
    };
    (rate, bytes)
}

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(|| "".into(), |d| format!("{:.2}", d.as_secs_f64() * 1000.0))
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
    let dir = match std::env::var_os("OPLEDGER_BENCH_DIR") {
        Some(base) => tempfile::tempdir_in(base),
        None => tempfile::tempdir(),
    }
    .expect("temporary directory");

    let raw = raw_one_row_inserts(dir.path(), seconds).await;
    let mut appends = Vec::new();
    for callers in [1, 8, 64] {
        appends.push(store_appends(dir.path(), callers, seconds, false).await);
    }
    let scattered = store_appends(dir.path(), 64, seconds, true).await;
    eprintln!("filling a ledger with {read_events} events for the read measurements...");
    let url = fill(dir.path(), read_events).await;
    let (raw_scan, raw_bytes) = raw_ordered_scan(&url).await;
    let (read_all, store_bytes) = store_read_all(&url, 1000).await;
    assert_eq!(raw_bytes, store_bytes, "both reads saw the same payloads");

    println!("\nSQLite event store, synchronous=FULL, WAL; {seconds} s per append measurement\n");
    println!("| measurement | per second | p50 ms | p99 ms | vs baseline |");
    println!("|---|---:|---:|---:|---:|");
    let row = |rate: &Rate, baseline: f64| {
        println!(
            "| {} | {:.0} | {} | {} | {:.2}x |",
            rate.label,
            rate.per_second,
            ms(rate.p50),
            ms(rate.p99),
            rate.per_second / baseline
        );
    };
    row(&raw, raw.per_second);
    for rate in &appends {
        row(rate, raw.per_second);
    }
    row(&scattered, raw.per_second);
    row(&raw_scan, raw_scan.per_second);
    row(&read_all, raw_scan.per_second);
    println!(
        "\nread measurements over {read_events} events ({} MB of payload)",
        store_bytes / 1_000_000
    );
    let at_64 = appends.last().expect("three append rates").per_second / raw.per_second;
    let read_ratio = read_all.per_second / raw_scan.per_second;
    println!(
        "targets: appends at 64 callers >= 5x baseline: {} ({at_64:.1}x); read_all >= 0.5x raw scan: {} ({read_ratio:.2}x)",
        if at_64 >= 5.0 { "met" } else { "MISSED" },
        if read_ratio >= 0.5 { "met" } else { "MISSED" },
    );
}
