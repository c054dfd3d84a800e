//! Lifecycle benchmark: operations/s through Received → Claimed → ExternalCallSent → Confirmed.
//!
//! N distinct `/coupon spring` updates (each from another user, so each starts an operation)
//! enter through the real intake (`Intake::record`: the delivery stream, the operation's
//! `Received`, the hash chain and the inline `operation_status` row, in one append) from C
//! concurrent tasks, while the real `Worker` (concurrency C, HTTP effector, replies off) claims
//! each one, records `ExternalCallSent`, POSTs to an instant fake service on loopback (201 with
//! `{"id", "code"}`) and records `Confirmed`. The clock starts before the first update and stops
//! when every operation is `confirmed`: ops/s = N / that time. The time the intake alone took is
//! reported beside it. Every (backend, C) pair runs on a fresh ledger: an SQLite file in a
//! temporary directory (`synchronous=FULL`), or a scratch PostgreSQL database created on the
//! server and dropped at the end. Afterwards it checks that every operation is `confirmed`, that
//! the ledger holds exactly one `Claimed`, `ExternalCallSent` and `Confirmed` per operation, and
//! that the fake service saw exactly one request per operation, under its operation id; it
//! panics otherwise (also if no operation is confirmed for `OPLEDGER_BENCH_STALL_SECONDS`).
//!
//! The peer harness in `../shared/bench/` (`bench/peer-cqrs-es.sh`) measures the same lifecycle
//! through cqrs-es + postgres-es as N operations × (Receive, Claim, Confirm) with C tasks; run
//! both with the same `OPS` and `CONCURRENCY` and compare ratios.
//!
//! `cargo bench -p opledger-cli --bench lifecycle`
//!
//! Knobs (environment): `OPS` (operations per run, default 5000), `CONCURRENCY` (comma- or
//! space-separated, default `1,8,32`), `BACKENDS` (or `OPLEDGER_BENCH_BACKENDS`, default
//! `sqlite,postgres`), `OPLEDGER_BENCH_PG_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`), `OPLEDGER_BENCH_STALL_SECONDS` (default 60),
//! `OPLEDGER_BENCH_PHASED=1` (a diagnostic: record every update first, then start the worker and
//! time it alone; seconds is then intake plus worker).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use opledger_config::Config;
use opledger_projections::operation_status::{self, Filter};
use opledger_server::{Intake, Recorded, Route, SystemClock};
use opledger_store::{AnyOptions, AnyStore, ReadPool, either};
use opledger_worker::{Worker, WorkerOptions};
use sqlx::{ConnectOptions, Connection, Executor};

const BOT: &str = "shop";

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

fn env_text(names: &[&str], default: &str) -> String {
    names
        .iter()
        .find_map(|name| std::env::var(name).ok())
        .unwrap_or_else(|| default.to_owned())
}

/// A `/coupon spring` command from user `n` (distinct users: distinct business keys).
fn update(n: u64) -> Vec<u8> {
    let user = 2_000_000 + n;
    serde_json::to_vec(&serde_json::json!({
        "update_id": 300_000_000 + n,
        "message": {
            "message_id": n + 1,
            "date": 1_790_000_000 + n / 1000,
            "chat": { "id": user, "type": "private" },
            "from": { "id": user, "is_bot": false, "first_name": "Bench" },
            "text": "/coupon spring",
            "entities": [{ "type": "bot_command", "offset": 0, "length": 7 }],
        }
    }))
    .expect("JSON")
}

/// The instant external service: every POST is a creation, answered 201 at once; requests are
/// counted per `Idempotency-Key`.
struct FakeService {
    addr: SocketAddr,
    requests: Arc<Mutex<HashMap<String, u32>>>,
    /// Every POST answered so far.
    served: Arc<AtomicU64>,
    server: tokio::task::JoinHandle<()>,
}

impl FakeService {
    async fn start() -> FakeService {
        let requests: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
        let served = Arc::new(AtomicU64::new(0));
        let next = served.clone();
        let app = Router::new().route(
            "/coupons",
            post({
                let requests = requests.clone();
                move |headers: HeaderMap| {
                    let (requests, next) = (requests.clone(), next.clone());
                    async move { create(&requests, &next, &headers) }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake service");
        let addr = listener.local_addr().expect("the fake service's address");
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .await
                .expect("the fake service serves");
        });
        FakeService {
            addr,
            requests,
            served,
            server,
        }
    }

    fn requests(&self) -> HashMap<String, u32> {
        self.requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    fn stop(self) {
        self.server.abort();
    }
}

fn create(
    requests: &Mutex<HashMap<String, u32>>,
    next: &AtomicU64,
    headers: &HeaderMap,
) -> Response {
    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) else {
        return (StatusCode::BAD_REQUEST, "missing Idempotency-Key").into_response();
    };
    *requests
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(key.to_owned())
        .or_default() += 1;
    let n = next.fetch_add(1, Ordering::Relaxed) + 1;
    (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        format!(r#"{{"id":"cpn_{n}","code":"SAVE-{n}"}}"#),
    )
        .into_response()
}

/// One bot, one `/coupon <campaign>` action whose effector is the fake service. The Bot API
/// base URL points at a closed loopback port: replies are off, and nothing may reach Telegram.
/// The action's effector: whether the fake service is declared to honour `Idempotency-Key`
/// (`OPLEDGER_BENCH_HONOURS_KEY=1`), which lets the worker commit its claim and the call's
/// record together; by default it does not, and they are two commits.
fn config(service: SocketAddr) -> Config {
    let honours = env_text(&["OPLEDGER_BENCH_HONOURS_KEY"], "0") == "1";
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n\
         [[bots]]\nname = \"{BOT}\"\ntoken_env = \"BENCH_TOKEN\"\n\
         webhook_secret_env = \"BENCH_SECRET\"\napi_base_url = \"http://127.0.0.1:9\"\n\
         [[actions]]\nname = \"coupon\"\nbot = \"{BOT}\"\ncommand = \"coupon\"\n\
         params = [\"campaign\"]\nkey = \"{{campaign}}:{{user_id}}\"\n\
         [actions.effector]\nurl = \"http://{service}/coupons\"\n\
         honours_idempotency_key = {honours}\n\
         [actions.reply]\nconfirmed = \"Your coupon: {{result.code}}\"\n"
    );
    let env: HashMap<&str, &str> = HashMap::from([
        ("BENCH_TOKEN", "123456:BENCH-token_abcdefghijklmnop"),
        ("BENCH_SECRET", "bench-webhook-secret_0123456789"),
    ]);
    Config::parse(&text, &|name| env.get(name).map(|v| (*v).to_owned()))
        .expect("the benchmark's configuration is valid")
}

/// `SELECT <key>, count(*) … GROUP BY <key>` on the ledger's read pool.
async fn counts(pool: ReadPool<'_>, sql: &'static str) -> BTreeMap<String, i64> {
    let rows: Vec<(String, i64)> =
        either!(pool, p => sqlx::query_as(sql).fetch_all(p).await).expect("count rows");
    rows.into_iter().collect()
}

async fn statuses(store: &AnyStore) -> BTreeMap<String, i64> {
    counts(
        store.reader(),
        "SELECT status, count(*) FROM operation_status GROUP BY status",
    )
    .await
}

async fn event_types(store: &AnyStore) -> BTreeMap<String, i64> {
    counts(
        store.reader(),
        "SELECT event_type, count(*) FROM events GROUP BY event_type",
    )
    .await
}

async fn confirmed(store: &AnyStore) -> i64 {
    let sql = "SELECT count(*) FROM operation_status WHERE status = 'confirmed'";
    either!(store.reader(), p => sqlx::query_scalar(sql).fetch_one(p).await)
        .expect("count confirmed operations")
}

struct Measured {
    backend: &'static str,
    concurrency: usize,
    operations: u64,
    elapsed: Duration,
    intake: Duration,
    /// With `OPLEDGER_BENCH_PHASED`: the worker alone, from its start until all are confirmed.
    worker: Option<Duration>,
    events: i64,
    /// Receive → confirm per operation (database clock), p50 and p99.
    p50: Duration,
    p99: Duration,
}

/// Runs `worker` until `stopped` fires.
fn spawn_worker(
    (worker, stopped): (Worker, tokio::sync::oneshot::Receiver<()>),
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        worker
            .run(async move {
                let _ = stopped.await;
            })
            .await;
    })
}

/// One measured run on a fresh ledger at `url`.
async fn run(
    backend: &'static str,
    url: &str,
    concurrency: usize,
    operations: u64,
    phased: bool,
) -> Measured {
    let stall = Duration::from_secs(env_number("OPLEDGER_BENCH_STALL_SECONDS", 60));
    let service = FakeService::start().await;
    let config = config(service.addr);
    let options = AnyOptions {
        inline: opledger_projections::inline(),
        ..AnyOptions::default()
    };
    let store = AnyStore::open(url, options).await.expect("open the ledger");
    let clock = Arc::new(SystemClock);
    let intake = Arc::new(Intake::new(&config, store.clone(), clock.clone()));
    let mut worker_options = WorkerOptions::new("bench-worker");
    worker_options.concurrency = concurrency;
    worker_options.replies = false;
    let worker =
        Worker::new(&config, store.clone(), clock, worker_options).expect("build the worker");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut idle = Some((worker, stopped));
    let mut running = None;
    if !phased {
        running = idle.take().map(spawn_worker);
    }
    let bodies: Arc<Vec<Vec<u8>>> = Arc::new((0..operations).map(update).collect());

    eprintln!("{backend}, concurrency {concurrency}: {operations} operations...");
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let senders: Vec<_> = (0..concurrency)
        .map(|_| {
            let (intake, next, bodies) = (intake.clone(), next.clone(), bodies.clone());
            tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let Some(body) = bodies.get(n as usize) else {
                        break;
                    };
                    match intake
                        .record(BOT, body)
                        .await
                        .map(|receipt| receipt.recorded)
                    {
                        Ok(Recorded::Accepted {
                            route: Route::Started(_),
                            ..
                        }) => {}
                        other => panic!("update {n} did not start an operation: {other:?}"),
                    }
                }
            })
        })
        .collect();
    for sender in senders {
        sender.await.expect("intake task");
    }
    let intake_elapsed = started.elapsed();
    let worker_started = Instant::now();
    if let Some(worker) = idle.take() {
        running = Some(spawn_worker(worker));
    }

    // Wait for the service to see N requests (free to watch), then for the last confirmations
    // (a count on the ledger, polled only for that short tail so as not to load the database).
    let target = i64::try_from(operations).expect("operations fit in i64");
    let mut last = (u64::MAX, Instant::now());
    loop {
        let served = service.served();
        let done = if served >= operations {
            let done = confirmed(&store).await;
            if done >= target {
                break;
            }
            operations + u64::try_from(done).unwrap_or(0)
        } else {
            served
        };
        if done != last.0 {
            last = (done, Instant::now());
        } else if last.1.elapsed() > stall {
            panic!(
                "{backend}, concurrency {concurrency}: no progress for {stall:?}; statuses {:?}; \
                 events {:?}; the service saw {served} requests",
                statuses(&store).await,
                event_types(&store).await,
            );
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed();
    let worker_elapsed = worker_started.elapsed();
    let _ = stop.send(());
    if let Some(running) = running {
        running.await.expect("the worker stops");
    }

    // Every operation confirmed, exactly once each step, and exactly one request each.
    let statuses = statuses(&store).await;
    assert_eq!(
        statuses,
        BTreeMap::from([("confirmed".to_owned(), target)]),
        "{backend}, concurrency {concurrency}: every operation ends confirmed"
    );
    let events = event_types(&store).await;
    for step in [
        "UpdateReceived",
        "Received",
        "Claimed",
        "ExternalCallSent",
        "Confirmed",
    ] {
        assert_eq!(
            events.get(step).copied(),
            Some(target),
            "{backend}, concurrency {concurrency}: one {step} per operation; events {events:?}"
        );
    }
    let rows = operation_status::list(
        store.reader(),
        &Filter {
            limit: u32::try_from(operations).expect("operations fit in u32"),
            ..Filter::default()
        },
    )
    .await
    .expect("list operations");
    let requests = service.requests();
    let ids: HashSet<&str> = rows.iter().map(|r| r.operation_id.as_str()).collect();
    let keys: HashSet<&str> = requests.keys().map(String::as_str).collect();
    let repeated: Vec<_> = requests.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        rows.len() == operations as usize && ids == keys && repeated.is_empty(),
        "{backend}, concurrency {concurrency}: the service must see exactly one request per \
         operation under its id: {} operations, {} keys, {} requests, repeated {repeated:?}",
        rows.len(),
        keys.len(),
        requests.values().sum::<u32>(),
    );
    let mut latencies: Vec<Duration> = rows
        .iter()
        .map(|r| (r.updated_at - r.created_at).to_std().unwrap_or_default())
        .collect();
    latencies.sort_unstable();
    let at = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];

    store.close().await;
    service.stop();
    Measured {
        backend,
        concurrency,
        operations,
        elapsed,
        intake: intake_elapsed,
        worker: phased.then_some(worker_elapsed),
        events: events.values().sum(),
        p50: at(0.50),
        p99: at(0.99),
    }
}

/// A scratch PostgreSQL database, dropped (with its connections) when this value is.
struct ScratchDatabase {
    admin: sqlx::postgres::PgConnectOptions,
    name: String,
    url: String,
}

impl ScratchDatabase {
    async fn create(admin_url: &str, suffix: &str) -> Result<ScratchDatabase, sqlx::Error> {
        let admin: sqlx::postgres::PgConnectOptions =
            admin_url.parse().expect("OPLEDGER_BENCH_PG_URL is a URL");
        let mut connection = admin.connect().await?;
        let name = format!("opledger_lifecycle_{}_{suffix}", std::process::id());
        connection
            .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await?;
        connection.close().await?;
        let (base, query) = admin_url
            .split_once('?')
            .map_or((admin_url, None), |(b, q)| (b, Some(q)));
        let base = base.rsplit_once('/').map_or(base, |(base, _)| base);
        let url = match query {
            Some(query) => format!("{base}/{name}?{query}"),
            None => format!("{base}/{name}"),
        };
        Ok(ScratchDatabase { admin, name, url })
    }
}

impl Drop for ScratchDatabase {
    fn drop(&mut self) {
        let admin = self.admin.clone();
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        // Drop cannot await: drop the database from a thread with its own small runtime.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let mut connection = admin.connect().await?;
                connection.execute(sqlx::AssertSqlSafe(sql)).await?;
                connection.close().await
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop scratch database {}: {dropped:?}", self.name);
        }
    }
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("run with `cargo bench -p opledger-cli --bench lifecycle`");
        return;
    }
    let operations = env_number("OPS", 5000).max(1);
    let concurrencies: Vec<usize> = env_text(&["CONCURRENCY"], "1,8,32")
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().expect("CONCURRENCY is a list of numbers"))
        .filter(|c| *c > 0)
        .collect();
    let backends = env_text(&["BACKENDS", "OPLEDGER_BENCH_BACKENDS"], "sqlite,postgres");
    let phased = env_number("OPLEDGER_BENCH_PHASED", 0) != 0;
    let admin = std::env::var("OPLEDGER_BENCH_PG_URL")
        .unwrap_or("postgres://postgres@127.0.0.1:5432/postgres".into());

    let mut results = Vec::new();
    if backends.contains("sqlite") {
        for &c in &concurrencies {
            let dir = tempfile::tempdir().expect("temporary directory");
            let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
            results.push(run("SQLite", &url, c, operations, phased).await);
        }
    }
    if backends.contains("postgres") {
        for &c in &concurrencies {
            match ScratchDatabase::create(&admin, &c.to_string()).await {
                Ok(database) => {
                    results.push(run("PostgreSQL", &database.url, c, operations, phased).await);
                }
                Err(error) => {
                    println!("PostgreSQL skipped: cannot create a database on {admin}: {error}");
                    break;
                }
            }
        }
    }

    println!(
        "\nlifecycle: Received → Claimed → ExternalCallSent → Confirmed, each operation entering \
         through the intake (delivery stream, hash chain, inline operation_status) and carried \
         out by the worker against an instant HTTP service; C intake tasks and worker \
         concurrency C\n"
    );
    if phased {
        println!(
            "phased (diagnostic): every update recorded first, then the worker started and timed \
             alone; seconds = intake + worker\n"
        );
    }
    println!(
        "| backend | concurrency | operations | seconds | ops/s | intake s | intake ops/s | \
         worker-alone ops/s | events | receive→confirm p50 ms | p99 ms |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for m in &results {
        let n = m.operations as f64;
        println!(
            "| {} | {} | {} | {:.2} | {:.0} | {:.2} | {:.0} | {} | {} | {:.1} | {:.1} |",
            m.backend,
            m.concurrency,
            m.operations,
            m.elapsed.as_secs_f64(),
            n / m.elapsed.as_secs_f64(),
            m.intake.as_secs_f64(),
            n / m.intake.as_secs_f64(),
            m.worker
                .map_or("-".to_owned(), |w| format!("{:.0}", n / w.as_secs_f64())),
            m.events,
            m.p50.as_secs_f64() * 1e3,
            m.p99.as_secs_f64() * 1e3,
        );
    }
}
