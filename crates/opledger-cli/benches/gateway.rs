//! Gateway and operations API benchmark of `opledger serve` (issue 12's figures), on SQLite and
//! PostgreSQL, each phase against a fresh ledger and a fresh process:
//! - **intake**: 64 concurrent senders POST distinct text updates (one chat each) to the webhook
//!   of a bot without a gateway, as fast as acknowledged: acks/s, p50/p99 of the ack;
//! - **gateway**: the same to a bot with `[bots.forward]` to an instant upstream on loopback
//!   (answers 200 at once): acks/s, updates/s the upstream received, and p50/p99 from the
//!   sender's request to the upstream receiving the update;
//! - **gateway, paced**: the same at a fixed rate below what the forwarder sustains
//!   (`OPLEDGER_GATEWAY_RATE`, default 200/s): the latency Telegram → bot without a backlog;
//! - **operations API**: 64 concurrent clients `POST /v1/operations` (distinct keys, an action
//!   without an effector): requests/s, p50/p99.
//!
//! `cargo bench -p opledger-cli --bench gateway`
//!
//! Knobs (environment): `OPLEDGER_LOAD_SECONDS` (per phase, default 10), `OPLEDGER_LOAD_SENDERS`
//! (default 64), `OPLEDGER_BENCH_PG_URL` (default the local server; a scratch database per phase
//! is created and dropped), `OPLEDGER_BENCH_BACKENDS` (default `sqlite,postgres`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::HeaderMap;
use sqlx::{Connection, Executor};

const SECRET: &str = "gateway-bench-secret";
const CLIENT: &str = "gateway-bench-client-token-0123456789";

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A text message from user `n` in their own chat: nothing opledger answers itself.
fn update(n: u64) -> Vec<u8> {
    let user = 1_000_000 + n;
    serde_json::to_vec(&serde_json::json!({
        "update_id": 200_000_000 + n,
        "message": {
            "message_id": n,
            "date": 1_790_000_000 + n / 1000,
            "chat": { "id": user, "type": "private" },
            "from": { "id": user, "is_bot": false, "first_name": "Load" },
            "text": "hello, bot",
        }
    }))
    .expect("JSON")
}

/// When each update reached the upstream, by update id.
type Arrivals = Arc<Mutex<HashMap<u64, Instant>>>;

/// The bot's own webhook: 200 at once, noting when each update arrived.
async fn upstream() -> (String, Arrivals) {
    let arrivals: Arrivals = Arc::default();
    let seen = Arc::clone(&arrivals);
    let app = axum::Router::new().route(
        "/webhook",
        axum::routing::post(move |headers: HeaderMap, _body: Bytes| {
            let seen = Arc::clone(&seen);
            async move {
                if let Some(id) = headers
                    .get("x-opledger-update-id")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok())
                {
                    seen.lock()
                        .expect("not poisoned")
                        .entry(id)
                        .or_insert_with(Instant::now);
                }
                ""
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    (format!("http://{address}/webhook"), arrivals)
}

#[path = "common/latency.rs"]
mod latency;
#[path = "common/serving.rs"]
mod serving;
use latency::{ms, percentile};
use serving::Service;

/// `opledger serve` with bot `shop` (forwarding to `forward`, if given), a client of the
/// operations API and an action `lead` without an effector, on `storage_url`.
fn start(dir: &std::path::Path, storage_url: &str, forward: Option<&str>) -> Service {
    let gateway = forward.map_or_else(String::new, |url| {
        format!("[bots.forward]\nurl = \"{url}\"\nupdates = \"all\"\n")
    });
    Service::start(
        dir,
        &format!(
            "[storage]\nurl = \"{storage_url}\"\n[server]\nlisten = \"127.0.0.1:0\"\n\
             [api]\nadmin_token_env = \"LOAD_ADMIN\"\n\
             [[api.clients]]\nname = \"handlers\"\nbot = \"shop\"\ntoken_env = \"LOAD_CLIENT\"\n\
             [[bots]]\nname = \"shop\"\ntoken_env = \"LOAD_TOKEN\"\n\
             webhook_secret_env = \"LOAD_SECRET\"\napi_base_url = \"http://127.0.0.1:9\"\n\
             {gateway}\
             [[actions]]\nname = \"lead\"\nbot = \"shop\"\ncommand = \"lead\"\n\
             params = [\"name\"]\nkey = \"{{name}}\"\n"
        ),
        &[
            ("LOAD_TOKEN", "1:load"),
            ("LOAD_SECRET", SECRET),
            ("LOAD_ADMIN", "gateway-bench-admin-token-0123456789"),
            ("LOAD_CLIENT", CLIENT),
        ],
    )
}

/// What senders measured: per request its number, when it was sent and how long the answer
/// took.
struct Sent {
    requests: Vec<(u64, Instant, Duration)>,
    elapsed: Duration,
    errors: u64,
}

/// `senders` tasks each send the next request as soon as the previous one is answered as
/// `ok` says; `request(client, n)` builds request `n`.
async fn closed_loop(
    senders: u64,
    seconds: u64,
    request: impl Fn(&reqwest::Client, u64) -> reqwest::RequestBuilder + Send + Sync + 'static,
    ok: fn(reqwest::StatusCode) -> bool,
) -> Sent {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(senders as usize)
        .build()
        .expect("client");
    let request = Arc::new(request);
    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let tasks: Vec<_> = (0..senders)
        .map(|_| {
            let (client, request, next, errors) = (
                client.clone(),
                Arc::clone(&request),
                Arc::clone(&next),
                Arc::clone(&errors),
            );
            tokio::spawn(async move {
                let mut requests = Vec::new();
                while Instant::now() < deadline {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let sent = Instant::now();
                    match request(&client, n).send().await {
                        Ok(response) if ok(response.status()) => {
                            let _ = response.bytes().await;
                            requests.push((n, sent, sent.elapsed()));
                        }
                        _ => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                requests
            })
        })
        .collect();
    let mut requests = Vec::new();
    for task in tasks {
        requests.extend(task.await.expect("sender"));
    }
    Sent {
        requests,
        elapsed: started.elapsed(),
        errors: errors.load(Ordering::Relaxed),
    }
}

/// Requests sent at a fixed `rate` whatever the answers do (open loop), for `seconds`.
async fn paced(
    rate: f64,
    seconds: u64,
    request: impl Fn(&reqwest::Client, u64) -> reqwest::RequestBuilder + Send + Sync + 'static,
) -> Sent {
    let client = reqwest::Client::builder().build().expect("client");
    let request = Arc::new(request);
    let interval = Duration::from_secs_f64(1.0 / rate);
    let started = Instant::now();
    let total = (rate * seconds as f64) as u64;
    let mut tasks = Vec::with_capacity(total as usize);
    for n in 0..total {
        tokio::time::sleep_until((started + interval.mul_f64(n as f64)).into()).await;
        let (client, request) = (client.clone(), Arc::clone(&request));
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            match request(&client, n).send().await {
                Ok(response) if response.status().is_success() => {
                    let _ = response.bytes().await;
                    Some((n, sent, sent.elapsed()))
                }
                _ => None,
            }
        }));
    }
    let mut requests = Vec::new();
    let mut errors = 0;
    for task in tasks {
        match task.await.expect("request") {
            Some(request) => requests.push(request),
            None => errors += 1,
        }
    }
    Sent {
        requests,
        elapsed: started.elapsed(),
        errors,
    }
}

/// One table row.
struct Row {
    backend: &'static str,
    phase: &'static str,
    rate: f64,
    p50: Duration,
    p99: Duration,
    forwarded: Option<(f64, Duration, Duration)>,
    errors: u64,
}

fn webhook(base: &str) -> impl Fn(&reqwest::Client, u64) -> reqwest::RequestBuilder + use<> {
    let url = format!("{base}/telegram/shop/webhook");
    move |client, n| {
        client
            .post(&url)
            .header("x-telegram-bot-api-secret-token", SECRET)
            .header("content-type", "application/json")
            .body(update(n))
    }
}

async fn intake_phase(backend: &'static str, url: &str, dir: &std::path::Path) -> Row {
    let (seconds, senders) = knobs();
    let service = start(dir, url, None);
    let sent = closed_loop(senders, seconds, webhook(&service.base), |s| s.is_success()).await;
    service.stop();
    let mut acks: Vec<Duration> = sent.requests.iter().map(|r| r.2).collect();
    acks.sort_unstable();
    Row {
        backend,
        phase: "intake (no gateway)",
        rate: acks.len() as f64 / sent.elapsed.as_secs_f64(),
        p50: percentile(&acks, 0.5),
        p99: percentile(&acks, 0.99),
        forwarded: None,
        errors: sent.errors,
    }
}

async fn gateway_phase(
    backend: &'static str,
    url: &str,
    dir: &std::path::Path,
    rate: Option<f64>,
) -> Row {
    let (seconds, senders) = knobs();
    let (upstream, arrivals) = upstream().await;
    let service = start(dir, url, Some(&upstream));
    let sent = match rate {
        None => closed_loop(senders, seconds, webhook(&service.base), |s| s.is_success()).await,
        Some(rate) => paced(rate, seconds, webhook(&service.base)).await,
    };
    // Then wait for the forwarder to drain what was acknowledged.
    let drain = Instant::now();
    while arrivals.lock().expect("not poisoned").len() < sent.requests.len()
        && drain.elapsed() < Duration::from_secs(120)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let forwarding_time = sent.elapsed + drain.elapsed();
    service.stop();
    let arrivals = arrivals.lock().expect("not poisoned").clone();
    let mut acks: Vec<Duration> = sent.requests.iter().map(|r| r.2).collect();
    acks.sort_unstable();
    let mut to_bot: Vec<Duration> = sent
        .requests
        .iter()
        .filter_map(|(n, at, _)| Some(arrivals.get(&(200_000_000 + n))?.duration_since(*at)))
        .collect();
    to_bot.sort_unstable();
    Row {
        backend,
        phase: if rate.is_some() {
            "gateway, paced (OPLEDGER_GATEWAY_RATE/s)"
        } else {
            "gateway to an instant upstream"
        },
        rate: acks.len() as f64 / sent.elapsed.as_secs_f64(),
        p50: percentile(&acks, 0.5),
        p99: percentile(&acks, 0.99),
        forwarded: Some((
            to_bot.len() as f64 / forwarding_time.as_secs_f64(),
            percentile(&to_bot, 0.5),
            percentile(&to_bot, 0.99),
        )),
        errors: sent.errors + (sent.requests.len() - to_bot.len()) as u64,
    }
}

async fn operations_phase(backend: &'static str, url: &str, dir: &std::path::Path) -> Row {
    let (seconds, senders) = knobs();
    let service = start(dir, url, None);
    let endpoint = format!("{}/v1/operations", service.base);
    let request = move |client: &reqwest::Client, n: u64| {
        client
            .post(&endpoint)
            .bearer_auth(CLIENT)
            .json(&serde_json::json!({
                "action": "lead",
                "params": { "name": format!("lead-{n}") },
                "chat_id": 1_000_000 + n,
                "user_id": 1_000_000 + n,
                "update_id": 300_000_000 + n,
            }))
    };
    let sent = closed_loop(senders, seconds, request, |s| s.as_u16() == 201).await;
    service.stop();
    let mut latencies: Vec<Duration> = sent.requests.iter().map(|r| r.2).collect();
    latencies.sort_unstable();
    Row {
        backend,
        phase: "POST /v1/operations",
        rate: latencies.len() as f64 / sent.elapsed.as_secs_f64(),
        p50: percentile(&latencies, 0.5),
        p99: percentile(&latencies, 0.99),
        forwarded: None,
        errors: sent.errors,
    }
}

fn knobs() -> (u64, u64) {
    (
        env_number("OPLEDGER_LOAD_SECONDS", 10),
        env_number("OPLEDGER_LOAD_SENDERS", 64),
    )
}

/// A fresh ledger per phase: a new SQLite file, or a scratch PostgreSQL database.
struct Scratch {
    url: String,
    dir: tempfile::TempDir,
    drop_database: Option<(String, String)>,
}

async fn scratch(backend: &str, phase: usize) -> Option<Scratch> {
    let dir = tempfile::tempdir().expect("temporary directory");
    if backend == "SQLite" {
        let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
        return Some(Scratch {
            url,
            dir,
            drop_database: None,
        });
    }
    let admin = std::env::var("OPLEDGER_BENCH_PG_URL")
        .unwrap_or("postgres://postgres@127.0.0.1:5432/postgres".into());
    let name = format!("opledger_gateway_{}_{phase}", std::process::id());
    let mut connection = match sqlx::postgres::PgConnection::connect(&admin).await {
        Ok(connection) => connection,
        Err(error) => {
            println!("PostgreSQL skipped: cannot connect to {admin}: {error}");
            return None;
        }
    };
    connection
        .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .await
        .expect("create database");
    let url = match admin.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{name}"),
        None => admin.clone(),
    };
    Some(Scratch {
        url,
        dir,
        drop_database: Some((admin, name)),
    })
}

async fn drop_scratch(scratch: Scratch) {
    if let Some((admin, name)) = scratch.drop_database {
        let mut connection = sqlx::postgres::PgConnection::connect(&admin)
            .await
            .expect("connect");
        connection
            .execute(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE {name} WITH (FORCE)"
            )))
            .await
            .expect("drop database");
    }
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("run with `cargo bench -p opledger-cli --bench gateway`");
        return;
    }
    let backends = std::env::var("OPLEDGER_BENCH_BACKENDS").unwrap_or("sqlite,postgres".into());
    let mut rows = Vec::new();
    for (backend, key) in [("SQLite", "sqlite"), ("PostgreSQL", "postgres")] {
        if !backends.to_lowercase().contains(key) {
            continue;
        }
        for phase in 0..4 {
            let Some(scratch) = scratch(backend, phase).await else {
                break;
            };
            eprintln!("{backend}: phase {phase}...");
            let row = match phase {
                0 => intake_phase(backend, &scratch.url, scratch.dir.path()).await,
                1 => gateway_phase(backend, &scratch.url, scratch.dir.path(), None).await,
                2 => {
                    let rate = env_number("OPLEDGER_GATEWAY_RATE", 200) as f64;
                    gateway_phase(backend, &scratch.url, scratch.dir.path(), Some(rate)).await
                }
                _ => operations_phase(backend, &scratch.url, scratch.dir.path()).await,
            };
            rows.push(row);
            drop_scratch(scratch).await;
        }
    }
    let (seconds, senders) = knobs();
    println!("\nopledger serve: {senders} concurrent senders for {seconds} s per phase\n");
    println!(
        "| backend | phase | req/s (acked) | ack p50 ms | ack p99 ms | forwarded/s | to bot p50 ms | to bot p99 ms | errors |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for row in &rows {
        let (forwarded, p50, p99) = row.forwarded.map_or_else(
            || ("".to_owned(), "".to_owned(), "".to_owned()),
            |(rate, p50, p99)| (format!("{rate:.0}"), ms(p50), ms(p99)),
        );
        println!(
            "| {} | {} | {:.0} | {} | {} | {forwarded} | {p50} | {p99} | {} |",
            row.backend,
            row.phase,
            row.rate,
            ms(row.p50),
            ms(row.p99),
            row.errors
        );
    }
}
