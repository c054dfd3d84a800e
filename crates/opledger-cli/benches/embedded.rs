//! The embedded path (the `opledger` crate in a teloxide bot) next to `opledger serve`, on SQLite,
//! in one run (issue 13's figures). Each phase runs on a fresh ledger with `senders` closed
//! loops of distinct text updates (one chat each), for 1 and 64 senders:
//! - **serve, intake**: `opledger serve` without a gateway; a loop's step is the webhook's 200;
//! - **serve, gateway**: `opledger serve` forwarding to an instant upstream on loopback; a step
//!   ends when the upstream has the update (record + forward);
//! - **embedded, record**: `Opledger::record` in process, nothing handed over;
//! - **embedded, teloxide**: `Opledger::record`, and a step ends when a real teloxide
//!   `Dispatcher` (fed by `opledger::teloxide::dispatching`) ran a no-op handler on the update
//!   (record + dispatch).
//!
//! `cargo bench -p opledger-cli --bench embedded`; knobs: `OPLEDGER_LOAD_SECONDS` (per phase,
//! default 8).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::HeaderMap;
use opledger::{Bot, Opledger, Updates};
use teloxide::dispatching::UpdateHandler;
use teloxide::prelude::*;
use tokio::sync::oneshot;

#[path = "common/latency.rs"]
mod latency;
#[path = "common/serving.rs"]
mod serving;
use latency::{ms, percentile};

const SECRET: &str = "embedded-bench-secret";
const TOKEN: &str = "1:embedded-bench";

/// Waiters for updates to reach the bot, by update id.
type Waiters = Arc<Mutex<HashMap<u64, oneshot::Sender<()>>>>;

fn arrived(waiters: &Waiters, id: u64) {
    if let Some(waiter) = waiters.lock().expect("not poisoned").remove(&id) {
        let _ = waiter.send(());
    }
}

/// A text message from user `n` in their own chat.
fn update(n: u64) -> Vec<u8> {
    let user = 1_000_000 + n;
    serde_json::to_vec(&serde_json::json!({
        "update_id": 300_000_000 + n,
        "message": {
            "message_id": n, "date": 1_790_000_000,
            "chat": { "id": user, "type": "private" },
            "from": { "id": user, "is_bot": false, "first_name": "Load" },
            "text": "hello, bot",
        }
    }))
    .expect("JSON")
}

/// A loopback server: the bot's webhook for the gateway (noting arrivals), and `getMe` for
/// teloxide's dispatcher.
async fn loopback(waiters: Waiters) -> String {
    let app = axum::Router::new()
        .route(
            "/webhook",
            axum::routing::post(move |headers: HeaderMap, _body: Bytes| {
                let waiters = Arc::clone(&waiters);
                async move {
                    let id = headers
                        .get("x-opledger-update-id")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<u64>().ok());
                    if let Some(id) = id {
                        arrived(&waiters, id);
                    }
                    ""
                }
            }),
        )
        .route(
            "/{bot}/{method}",
            axum::routing::post(|| async {
                axum::Json(serde_json::json!({"ok": true, "result": {
                    "id": 1, "is_bot": true, "first_name": "Bench", "username": "bench_bot",
                    "can_join_groups": true, "can_read_all_group_messages": false,
                    "supports_inline_queries": false, "has_main_web_app": false
                }}))
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    format!("http://{address}")
}

/// What one phase measured.
struct Row {
    phase: &'static str,
    senders: u64,
    done: u64,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

/// `senders` loops each doing `step(n)` for distinct `n` until `seconds` passed.
async fn closed_loop<F, Fut>(senders: u64, seconds: u64, step: F) -> (Vec<Duration>, Duration)
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let step = Arc::new(step);
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for _ in 0..senders {
        let (step, next) = (Arc::clone(&step), Arc::clone(&next));
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < until {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let began = Instant::now();
                step(n).await;
                latencies.push(began.elapsed());
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("a sender"));
    }
    (latencies, started.elapsed())
}

/// Waits for update `n` to reach the bot (at most 30 s: a lost update fails the bench).
async fn reaches_bot(waiters: &Waiters, n: u64) -> oneshot::Receiver<()> {
    let (sender, receiver) = oneshot::channel();
    waiters
        .lock()
        .expect("not poisoned")
        .insert(300_000_000 + n, sender);
    receiver
}

async fn arrival(receiver: oneshot::Receiver<()>) {
    tokio::time::timeout(Duration::from_secs(30), receiver)
        .await
        .expect("the update reaches the bot within 30 s")
        .expect("the waiter is kept");
}

async fn serve_phase(senders: u64, seconds: u64, gateway: bool) -> Row {
    let dir = tempfile::tempdir().expect("a scratch folder");
    let waiters = Waiters::default();
    let base = loopback(Arc::clone(&waiters)).await;
    let forward = if gateway {
        format!("[bots.forward]\nurl = \"{base}/webhook\"\nupdates = \"all\"\n")
    } else {
        String::new()
    };
    let service = serving::Service::start(
        dir.path(),
        &format!(
            "[storage]\nurl = \"sqlite://{}\"\n[server]\nlisten = \"127.0.0.1:0\"\n\
             [[bots]]\nname = \"shop\"\ntoken_env = \"LOAD_TOKEN\"\n\
             webhook_secret_env = \"LOAD_SECRET\"\napi_base_url = \"http://127.0.0.1:9\"\n\
             {forward}",
            dir.path().join("ledger.db").display()
        ),
        &[("LOAD_TOKEN", TOKEN), ("LOAD_SECRET", SECRET)],
    );
    let client = reqwest::Client::new();
    let url = format!("{}/telegram/shop/webhook", service.base);
    let (latencies, elapsed) = closed_loop(senders, seconds, move |n| {
        let (client, url, waiters) = (client.clone(), url.clone(), Arc::clone(&waiters));
        async move {
            let arrived = reaches_bot(&waiters, n).await;
            let answer = client
                .post(&url)
                .header("x-telegram-bot-api-secret-token", SECRET)
                .header("content-type", "application/json")
                .body(update(n))
                .send()
                .await
                .expect("the webhook answers");
            assert!(answer.status().is_success(), "{}", answer.status());
            if gateway {
                arrival(arrived).await;
            }
        }
    })
    .await;
    service.stop();
    Row {
        phase: if gateway {
            "serve, gateway (record + forward)"
        } else {
            "serve, intake (record)"
        },
        senders,
        done: latencies.len() as u64,
        elapsed,
        latencies,
    }
}

async fn embedded_phase(senders: u64, seconds: u64, teloxide: bool) -> Row {
    let dir = tempfile::tempdir().expect("a scratch folder");
    let waiters = Waiters::default();
    let base = loopback(Arc::clone(&waiters)).await;
    let mut bot = Bot::webhook("shop", TOKEN, SECRET).api_base_url("http://127.0.0.1:9");
    if teloxide {
        bot = bot.handlers(Updates::All);
    }
    let ledger = Opledger::builder()
        .ledger(format!(
            "sqlite://{}",
            dir.path().join("ledger.db").display()
        ))
        .bot(bot)
        .open()
        .await
        .expect("open the embedded ledger");
    let dispatcher = if teloxide {
        let seen = Arc::clone(&waiters);
        let handler: UpdateHandler<std::convert::Infallible> =
            dptree::endpoint(move |update: Update| {
                arrived(&seen, u64::from(update.id.0));
                async { Ok(()) }
            });
        let (listener, handler) = opledger::teloxide::dispatching(&ledger, "shop", handler)
            .expect("the bot hands its updates over");
        let telegram = teloxide::Bot::new(TOKEN).set_api_url(base.parse().expect("a URL"));
        let mut dispatcher = Dispatcher::builder(telegram, handler).build();
        let token = dispatcher.shutdown_token();
        let task = tokio::spawn(async move {
            dispatcher
                .dispatch_with_listener(listener, LoggingErrorHandler::new())
                .await;
        });
        Some((token, task))
    } else {
        None
    };
    let running = ledger.start().await.expect("start the embedded ledger");
    let record = ledger.clone();
    let (latencies, elapsed) = closed_loop(senders, seconds, move |n| {
        let (ledger, waiters) = (record.clone(), Arc::clone(&waiters));
        async move {
            let arrived = reaches_bot(&waiters, n).await;
            ledger.record("shop", &update(n)).await.expect("recorded");
            if teloxide {
                arrival(arrived).await;
            }
        }
    })
    .await;
    if let Some((token, task)) = dispatcher {
        if let Ok(stopping) = token.shutdown() {
            stopping.await;
        }
        let _ = task.await;
    }
    running.shutdown().await;
    Row {
        phase: if teloxide {
            "embedded, teloxide (record + dispatch)"
        } else {
            "embedded, record"
        },
        senders,
        done: latencies.len() as u64,
        elapsed,
        latencies,
    }
}

#[tokio::main]
async fn main() {
    let seconds = std::env::var("OPLEDGER_LOAD_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let mut rows = Vec::new();
    for senders in [1, 64] {
        rows.push(serve_phase(senders, seconds, false).await);
        rows.push(embedded_phase(senders, seconds, false).await);
        rows.push(serve_phase(senders, seconds, true).await);
        rows.push(embedded_phase(senders, seconds, true).await);
    }
    println!("\n| phase (SQLite) | senders | updates/s | p50 ms | p99 ms |");
    println!("|---|---:|---:|---:|---:|");
    for row in &mut rows {
        row.latencies.sort();
        println!(
            "| {} | {} | {:.0} | {} | {} |",
            row.phase,
            row.senders,
            row.done as f64 / row.elapsed.as_secs_f64(),
            ms(percentile(&row.latencies, 0.50)),
            ms(percentile(&row.latencies, 0.99)),
        );
    }
}
