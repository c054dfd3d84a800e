//! Load benchmark of `opledger serve`: distinct Telegram updates (each a `/coupon` command from
//! another user, so each starts an operation) POSTed to the real binary's webhook by 64
//! concurrent senders for 20 s, then paced at a quarter of the rate reached (with the worker's
//! backlog, the operations it has not taken up yet, at that phase's start and end); on SQLite
//! (`synchronous=FULL`) and on PostgreSQL; for each of four ways of running `serve` (intake
//! alone, with the worker, with the asynchronous read models, everything), each on a fresh
//! ledger, with the read models' lag at the end. The bot's Bot API is a fake on loopback that
//! answers every reply at once and notes when each arrived: with the worker on, the replies per
//! second in the paced phase and how long after its update each arrived (the user's wait). The
//! raw one-row-per-transaction SQLite insert rate of the store benchmark is measured in the same
//! run. Prints one table of every phase and, per backend, the variants side by side with how
//! busy the cores were and the CPU time per update of the service and the database server.
//!
//! `cargo bench -p opledger-cli --bench load`
//!
//! Knobs (environment): `OPLEDGER_LOAD_SECONDS` (closed-loop phase, default 20),
//! `OPLEDGER_LOAD_SENDERS` (default 64), `OPLEDGER_BENCH_PG_URL` (default the local server; a
//! scratch database is created and dropped per variant), `OPLEDGER_BENCH_BACKENDS` (default
//! `sqlite,postgres`), `OPLEDGER_LOAD_VARIANTS` (e.g. `1,4`: intake only and everything),
//! `OPLEDGER_BENCH_BIN` (another `opledger` binary, e.g. one built from `main`, to compare),
//! `OPLEDGER_LOAD_ROUNDS` (default 1: the variants are run that many times, interleaved, and
//! compared by their medians, since one closed-loop run of intake alone can be 30 % off the next
//! on a shared machine), `OPLEDGER_LOAD_RATE` (N: no closed loop; each variant is paced at N
//! updates/s from a fresh ledger for `OPLEDGER_LOAD_SECONDS`, the latency at a rate the whole
//! service keeps up with).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection, Executor};

const SECRET: &str = "load-bench-secret";

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Update `n` comes from user (and private chat) `USERS + n`.
const USERS: i64 = 1_000_000;

/// A `/coupon spring` command from user `n` (distinct users: distinct business keys).
fn update(n: u64) -> Vec<u8> {
    let user = USERS + n as i64;
    serde_json::to_vec(&serde_json::json!({
        "update_id": 100_000_000 + n,
        "message": {
            "message_id": n,
            "date": 1_790_000_000 + n / 1000,
            "chat": { "id": user, "type": "private" },
            "from": { "id": user, "is_bot": false, "first_name": "Load" },
            "text": "/coupon spring",
            "entities": [{ "type": "bot_command", "offset": 0, "length": 7 }],
        }
    }))
    .expect("JSON")
}

#[path = "common/serving.rs"]
mod serving;

/// The ways `opledger serve` is run, side by side: intake alone, with the worker, with the
/// asynchronous read models, and everything (the default).
const VARIANTS: [(&str, &[&str]); 4] = [
    ("intake only", &["--no-worker", "--no-projections"]),
    ("intake + worker", &["--no-projections"]),
    ("intake + projections", &["--no-worker"]),
    ("everything (default)", &[]),
];

/// When each reply (`sendMessage`) reached the fake Bot API, with the chat it went to.
#[derive(Clone, Default)]
struct Replies(Arc<Mutex<Vec<(i64, Instant)>>>);

impl Replies {
    fn record(&self, body: &[u8]) {
        let chat = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|body| match &body["chat_id"] {
                serde_json::Value::String(chat) => chat.parse().ok(),
                chat => chat.as_i64(),
            });
        if let Some(chat) = chat {
            let at = Instant::now();
            self.0.lock().expect("replies").push((chat, at));
        }
    }

    /// The replies that arrived from `from` to `until`.
    fn between(&self, from: Instant, until: Instant) -> Vec<(i64, Instant)> {
        let replies = self.0.lock().expect("replies");
        replies
            .iter()
            .filter(|(_, at)| (from..=until).contains(at))
            .copied()
            .collect()
    }
}

/// One variant's updates: the next one's number (`update(n)`), and when each was sent.
#[derive(Clone, Default)]
struct Updates {
    next: Arc<AtomicU64>,
    sent: Arc<Mutex<HashMap<u64, Instant>>>,
}

impl Updates {
    fn take(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }
}

/// The worker's replies in the paced phase: how many reached the Bot API per second, and how
/// long after its update had been sent each arrived (the user's wait for the answer; `None`
/// when none arrived).
#[derive(Clone, Copy)]
struct Replied {
    per_second: f64,
    ages: Option<(Duration, Duration)>,
}

impl Replied {
    fn of(replies: &Replies, updates: &Updates, from: Instant, until: Instant) -> Self {
        let arrived = replies.between(from, until);
        let sent = updates.sent.lock().expect("sends");
        let mut ages: Vec<Duration> = arrived
            .iter()
            .filter_map(|(chat, at)| {
                let n = u64::try_from(chat - USERS).ok()?;
                Some(at.saturating_duration_since(*sent.get(&n)?))
            })
            .collect();
        ages.sort_unstable();
        Replied {
            per_second: arrived.len() as f64 / until.duration_since(from).as_secs_f64(),
            ages: (!ages.is_empty()).then(|| (percentile(&ages, 0.50), percentile(&ages, 0.99))),
        }
    }
}

/// A Bot API on loopback that accepts every call (each `sendMessage` gets a new message id), so
/// that the worker's replies are answered at once and never leave the machine; its base URL,
/// and the replies as they arrived.
async fn fake_bot_api() -> (String, Replies) {
    use axum::body::Bytes;
    use axum::extract::Path;
    let sent = Arc::new(AtomicU64::new(0));
    let replies = Replies::default();
    let recorded = replies.clone();
    let app = axum::Router::new().route(
        "/{bot}/{method}",
        axum::routing::any(move |Path((_, method)): Path<(String, String)>, body: Bytes| {
            let id = sent.fetch_add(1, Ordering::Relaxed) + 1;
            if method == "sendMessage" {
                recorded.record(&body);
            }
            async move {
                (
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    format!(
                        r#"{{"ok":true,"result":{{"message_id":{id},"date":0,"chat":{{"id":1,"type":"private"}}}}}}"#
                    ),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the fake Bot API");
    let addr = listener.local_addr().expect("the fake Bot API's address");
    tokio::spawn(async move {
        axum::serve(listener, app)
            .await
            .expect("the fake Bot API serves");
    });
    (format!("http://{addr}"), replies)
}

/// `opledger serve` (with `args`) with bot `shop` (its Bot API at `api`) and the coupon action,
/// on `storage_url`; its webhook URL.
fn start(
    dir: &std::path::Path,
    storage_url: &str,
    api: &str,
    args: &[&str],
) -> (serving::Service, String) {
    let service = serving::Service::start_with(
        dir,
        &format!(
            "[storage]\nurl = \"{storage_url}\"\n[server]\nlisten = \"127.0.0.1:0\"\n\
             [[bots]]\nname = \"shop\"\ntoken_env = \"LOAD_TOKEN\"\n\
             webhook_secret_env = \"LOAD_SECRET\"\napi_base_url = \"{api}\"\n\
             [[actions]]\nname = \"coupon\"\nbot = \"shop\"\ncommand = \"coupon\"\n\
             params = [\"campaign\"]\nkey = \"{{campaign}}:{{user_id}}\"\n"
        ),
        ENV,
        args,
    );
    let url = format!("{}/telegram/shop/webhook", service.base);
    (service, url)
}

const ENV: &[(&str, &str)] = &[("LOAD_TOKEN", "1:load"), ("LOAD_SECRET", SECRET)];

/// The largest lag of an asynchronous read model (`opledger projections list --json`), or
/// `None` when none is registered (the variants without read models).
fn read_model_lag(service: &serving::Service) -> Option<u64> {
    let output = std::process::Command::new(serving::binary())
        .arg("--config")
        .arg(&service.config)
        .args(["projections", "list", "--json"])
        .envs(ENV.iter().copied())
        .env("OPLEDGER_LOG", "error")
        .output()
        .expect("run opledger projections list");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|row| row["inline"] == false && row["state"] == "active")
        .filter_map(|row| row["lag"].as_u64())
        .max()
}

/// A lag the read models are caught up at: one page (`ProjectorOptions::default().page_size`).
const CAUGHT_UP: u64 = 1000;

/// How long after the load stopped the read models' largest lag took to fall to [`CAUGHT_UP`]
/// (the worker may still be working off its backlog, appending meanwhile): `Ok` with the time,
/// `Err(limit)` if it had not by then.
fn catch_up(service: &serving::Service, limit: Duration) -> Result<Duration, Duration> {
    let stopped = Instant::now();
    loop {
        if read_model_lag(service).is_none_or(|lag| lag <= CAUGHT_UP) {
            return Ok(stopped.elapsed());
        }
        if stopped.elapsed() >= limit {
            return Err(limit);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// How many operations the worker has not taken up yet (still `received`).
fn worker_backlog(service: &serving::Service) -> u64 {
    let output = std::process::Command::new(serving::binary())
        .arg("--config")
        .arg(&service.config)
        .args([
            "ops",
            "--state",
            "received",
            "--limit",
            "4000000000",
            "--json",
        ])
        .envs(ENV.iter().copied())
        .env("OPLEDGER_LOG", "error")
        .output()
        .expect("run opledger ops");
    assert!(output.status.success(), "opledger ops failed");
    output
        .stdout
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .count() as u64
}

/// What the load bench reads from the service's `/metrics`: the cumulative bucket counts of its
/// two append histograms (`opledger_append_wait_seconds`, `opledger_append_write_seconds`), by
/// upper bound in seconds, ascending (the last is `+Inf`, every append), the batches it
/// committed (`opledger_append_batches_total`), and the connections its edge refused, by reason
/// (`opledger_http_refusals_total`): what a load generator's errors may come from.
#[derive(Clone, Debug, Default)]
struct Scrape {
    wait: Vec<(f64, u64)>,
    write: Vec<(f64, u64)>,
    batches: u64,
    refusals: Vec<(String, u64)>,
}

impl Scrape {
    /// Appends counted.
    fn appends(&self) -> u64 {
        self.wait.last().map_or(0, |(_, count)| *count)
    }
}

/// The service's `/metrics` now.
async fn scrape(service: &serving::Service) -> Scrape {
    let text = reqwest::get(format!("{}/metrics", service.base))
        .await
        .and_then(reqwest::Response::error_for_status)
        .expect("GET /metrics")
        .text()
        .await
        .expect("the metrics' text");
    let buckets = |histogram: &str| -> Vec<(f64, u64)> {
        let head = format!("{histogram}_bucket{{le=\"");
        text.lines()
            .filter_map(|line| line.strip_prefix(&head))
            .filter_map(|rest| {
                let (le, count) = rest.split_once("\"} ")?;
                let bound = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((bound, count.trim().parse().ok()?))
            })
            .collect()
    };
    let refusals = text
        .lines()
        .filter_map(|line| line.strip_prefix("opledger_http_refusals_total{reason=\""))
        .filter_map(|rest| {
            let (reason, count) = rest.split_once("\"} ")?;
            Some((reason.to_owned(), count.trim().parse().ok()?))
        })
        .collect();
    let batches = text
        .lines()
        .find_map(|line| line.strip_prefix("opledger_append_batches_total "))
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or(0);
    Scrape {
        wait: buckets("opledger_append_wait_seconds"),
        write: buckets("opledger_append_write_seconds"),
        batches,
        refusals,
    }
}

/// The connections refused between two scrapes, by reason, as `reason count` pairs; empty if
/// none was.
fn refused(before: &Scrape, after: &Scrape) -> String {
    after
        .refusals
        .iter()
        .filter_map(|(reason, count)| {
            let earlier = before
                .refusals
                .iter()
                .find(|(r, _)| r == reason)
                .map_or(0, |(_, c)| *c);
            let delta = count.saturating_sub(earlier);
            (delta > 0).then(|| format!("{reason} {delta}"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The upper bound (seconds) of the bucket holding the 99th percentile of the values counted
/// between two scrapes of one histogram; `None` if none was.
fn p99_bound(before: &[(f64, u64)], after: &[(f64, u64)]) -> Option<f64> {
    let counted = |bound: f64, buckets: &[(f64, u64)]| {
        buckets
            .iter()
            .find(|(b, _)| *b == bound)
            .map_or(0, |(_, count)| *count)
    };
    let deltas: Vec<(f64, u64)> = after
        .iter()
        .map(|(bound, count)| (*bound, count.saturating_sub(counted(*bound, before))))
        .collect();
    let total = deltas.last()?.1;
    let rank = (total as f64 * 0.99).ceil().max(1.0) as u64;
    (total > 0).then(|| {
        deltas
            .iter()
            .find(|(_, cumulative)| *cumulative >= rank)
            .map_or(f64::INFINITY, |(bound, _)| *bound)
    })
}

#[derive(Clone)]
struct Measured {
    label: String,
    acks: u64,
    acks_per_second: f64,
    p50: Duration,
    p99: Duration,
    max: Duration,
    errors: u64,
    /// Where the machine's CPU went meanwhile (Linux only).
    cpu: Option<Cpu>,
}

/// The machine's CPU over a phase, from `/proc`: how busy its cores were (this process's share
/// included), and the CPU time spent per acknowledged update by everything but this process
/// (which is the load generator and the fake Bot API), of which by the service itself; the rest
/// is the database server's (PostgreSQL) or the machine's. Whether a variant is slower for want
/// of CPU or for waiting shows here: once every core is busy, acks/s can only be the cores'
/// time over the CPU time per ack.
#[derive(Clone, Copy)]
struct Cpu {
    busy: f64,
    per_ack: Duration,
    service_per_ack: Duration,
}

/// Clock ticks: the machine's busy and total (all cores), this process's and the service's.
#[derive(Clone, Copy)]
struct Ticks {
    busy: u64,
    total: u64,
    own: u64,
    service: u64,
}

/// A process's user and system ticks (`/proc/<pid>/stat`).
fn process_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command's closing parenthesis; utime and stime are the 12th and 13th.
    let ticks: Vec<u64> = stat
        .rsplit_once(')')?
        .1
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    Some(ticks.iter().sum())
}

impl Ticks {
    fn now(service: u32) -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let fields: Vec<u64> = stat
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .map(|f| f.parse().unwrap_or(0))
            .collect();
        // user nice system idle iowait irq softirq steal (guest time is within user).
        let total: u64 = fields.iter().take(8).sum();
        let idle = fields.get(3)? + fields.get(4)?;
        Some(Self {
            busy: total - idle,
            total,
            own: process_ticks("self")?,
            service: process_ticks(&service.to_string())?,
        })
    }

    /// From `self` to `later`, for `acks` updates acknowledged meanwhile.
    fn until(self, later: Option<Self>, acks: f64) -> Option<Cpu> {
        let later = later?;
        // USER_HZ is 100 on every Linux this runs on.
        let per_ack = |ticks: u64| Duration::from_secs_f64(ticks as f64 / 100.0 / acks);
        let total = later.total.checked_sub(self.total)?;
        let busy = later.busy.checked_sub(self.busy)?;
        let others = busy.saturating_sub(later.own.saturating_sub(self.own));
        let service = later.service.checked_sub(self.service)?;
        (total > 0 && acks > 0.0).then(|| Cpu {
            busy: busy as f64 / total as f64,
            per_ack: per_ack(others),
            service_per_ack: per_ack(service),
        })
    }
}

/// The `p` quantile (0 to 1) of `sorted`, which is not empty.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// A phase's figures; `ticks`, read when it began, and `service` give its CPU.
fn summarize(
    label: String,
    mut latencies: Vec<Duration>,
    elapsed: Duration,
    errors: u64,
    (ticks, service): (Option<Ticks>, u32),
) -> Measured {
    let cpu = ticks.and_then(|ticks| ticks.until(Ticks::now(service), latencies.len() as f64));
    latencies.sort_unstable();
    Measured {
        label,
        acks: latencies.len() as u64,
        acks_per_second: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
        max: *latencies.last().expect("some requests"),
        errors,
        cpu,
    }
}

async fn post(client: &reqwest::Client, url: &str, updates: &Updates) -> Result<Duration, ()> {
    let n = updates.take();
    let body = update(n);
    let started = Instant::now();
    updates.sent.lock().expect("sends").insert(n, started);
    let response = client
        .post(url)
        .header("x-telegram-bot-api-secret-token", SECRET)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .map_err(|_| ())?;
    let ok = response.status() == reqwest::StatusCode::OK;
    let _ = response.bytes().await;
    ok.then(|| started.elapsed()).ok_or(())
}

/// `senders` tasks each send the next update as soon as the previous one is acknowledged.
async fn closed_loop(
    url: &str,
    service: u32,
    senders: u64,
    seconds: u64,
    updates: &Updates,
) -> Measured {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(senders as usize)
        .build()
        .expect("client");
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let ticks = Ticks::now(service);
    let errors = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..senders)
        .map(|_| {
            let (client, url, updates, errors) = (
                client.clone(),
                url.to_owned(),
                updates.clone(),
                errors.clone(),
            );
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    match post(&client, &url, &updates).await {
                        Ok(latency) => latencies.push(latency),
                        Err(()) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("sender"));
    }
    summarize(
        format!("{senders} concurrent senders, as fast as acknowledged"),
        latencies,
        started.elapsed(),
        errors.load(Ordering::Relaxed),
        (ticks, service),
    )
}

/// Updates sent at a fixed `rate`, whatever the answers do (open loop), for `seconds`; `why`
/// says where the rate came from.
async fn paced(
    url: &str,
    service: u32,
    (rate, why): (f64, &str),
    seconds: u64,
    updates: &Updates,
) -> Measured {
    let client = reqwest::Client::builder().build().expect("client");
    let interval = Duration::from_secs_f64(1.0 / rate);
    let started = Instant::now();
    let ticks = Ticks::now(service);
    let total = (rate * seconds as f64) as u64;
    let mut tasks = Vec::with_capacity(total as usize);
    for i in 0..total {
        let due = started + interval.mul_f64(i as f64);
        tokio::time::sleep_until(due.into()).await;
        let (client, url, updates) = (client.clone(), url.to_owned(), updates.clone());
        tasks.push(tokio::spawn(
            async move { post(&client, &url, &updates).await },
        ));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    for task in tasks {
        match task.await.expect("request") {
            Ok(latency) => latencies.push(latency),
            Err(()) => errors += 1,
        }
    }
    summarize(
        format!("paced at {rate:.0}/s ({why})"),
        latencies,
        started.elapsed(),
        errors,
        (ticks, service),
    )
}

/// The foundation benchmark's baseline: one-row INSERT transactions, `synchronous=FULL`.
async fn raw_sqlite_rate(dir: &std::path::Path, seconds: u64) -> f64 {
    let mut connection = SqliteConnectOptions::new()
        .filename(dir.join("raw.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .connect()
        .await
        .expect("connect");
    connection
        .execute(
            "CREATE TABLE events (position INTEGER PRIMARY KEY, stream_id TEXT NOT NULL, \
             version INTEGER NOT NULL, payload BLOB NOT NULL, recorded_at INTEGER NOT NULL, \
             UNIQUE (stream_id, version))",
        )
        .await
        .expect("create table");
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut n: u64 = 0;
    while Instant::now() < deadline {
        let mut tx = connection.begin().await.expect("begin");
        sqlx::query(
            "INSERT INTO events (stream_id, version, payload, recorded_at) VALUES (?, 1, ?, 0)",
        )
        .bind(format!("update-shop-{}", 100_000_000 + n))
        .bind(update(n))
        .execute(&mut *tx)
        .await
        .expect("insert");
        tx.commit().await.expect("commit");
        n += 1;
    }
    n as f64 / started.elapsed().as_secs_f64()
}

/// One variant's two phases (or, at a steady rate, its one), the read models' lag at the end and
/// how long they took to catch up after it.
struct Run {
    variant: &'static str,
    /// The closed loop; `None` at a steady rate (`OPLEDGER_LOAD_RATE`).
    full: Option<Measured>,
    paced: Measured,
    lag: Option<u64>,
    /// With the read models: [`catch_up`].
    caught_up: Option<Result<Duration, Duration>>,
    /// With the worker: its backlog over the paced phase.
    backlog: Option<Backlog>,
    /// With the worker: its replies in the paced phase.
    replied: Option<Replied>,
    /// In the paced phase, the bounds of the buckets holding the 99th percentile of each
    /// append's wait for its batch and of its batch's write (seconds): where the time went.
    appends: (Option<f64>, Option<f64>),
    /// In the paced phase, the service's appends and its batches' commits per update
    /// acknowledged then (intake's and the worker's alike): how many transactions an update
    /// costs.
    per_update: Option<(f64, f64)>,
    /// The connections the service's edge refused, by phase and reason (empty if none was).
    refused: String,
}

/// The worker over the paced phase: the operations it had not taken up yet (still `received`)
/// when the phase started and when it ended, and how many it took up per second meanwhile (the
/// backlog it started with and those that arrived, less those left).
#[derive(Clone, Copy)]
struct Backlog {
    start: u64,
    end: u64,
    taken_up_per_second: f64,
}

async fn run_variant(
    name: &str,
    variant: &'static str,
    args: &[&str],
    storage_url: &str,
    (api, replies): (&str, &Replies),
    dir: &std::path::Path,
) -> Run {
    let seconds = env_number("OPLEDGER_LOAD_SECONDS", 20);
    let senders = env_number("OPLEDGER_LOAD_SENDERS", 64);
    let steady = env_number("OPLEDGER_LOAD_RATE", 0);
    let (service, url) = start(dir, storage_url, api, args);
    let started = scrape(&service).await;
    let updates = Updates::default();
    let full = if steady == 0 {
        eprintln!("{name}, {variant}: {senders} senders for {seconds} s...");
        Some(closed_loop(&url, service.pid(), senders, seconds, &updates).await)
    } else {
        None
    };
    let worker = !args.contains(&"--no-worker");
    // Timed from before each count: it reads the operations as they were when it began.
    let before = worker.then(|| (Instant::now(), worker_backlog(&service)));
    let (rate, why, seconds) = match &full {
        Some(full) => (
            full.acks_per_second / 4.0,
            "a quarter of the closed-loop rate",
            seconds.clamp(3, 10),
        ),
        None => (steady as f64, "steady, from a fresh ledger", seconds),
    };
    eprintln!("{name}, {variant}: paced at {rate:.0}/s...");
    let appended = scrape(&service).await;
    let paced_from = Instant::now();
    let paced = paced(&url, service.pid(), (rate, why), seconds, &updates).await;
    let replied = worker.then(|| Replied::of(replies, &updates, paced_from, Instant::now()));
    let since = scrape(&service).await;
    let refused = [
        ("closed loop", refused(&started, &appended)),
        ("paced", refused(&appended, &since)),
    ]
    .into_iter()
    .filter(|(_, refused)| !refused.is_empty())
    .map(|(phase, refused)| format!("{phase}: {refused}"))
    .collect::<Vec<_>>()
    .join("; ");
    if !refused.is_empty() {
        eprintln!("{name}, {variant}: connections the edge refused ({refused})");
    }
    let appends = (
        p99_bound(&appended.wait, &since.wait),
        p99_bound(&appended.write, &since.write),
    );
    let per_update = (paced.acks > 0).then(|| {
        let per = |count: u64| count as f64 / paced.acks as f64;
        (
            per(since.appends().saturating_sub(appended.appends())),
            per(since.batches.saturating_sub(appended.batches)),
        )
    });
    let backlog = before.map(|(began, start)| {
        let elapsed = began.elapsed();
        let end = worker_backlog(&service);
        Backlog {
            start,
            end,
            taken_up_per_second: (start + paced.acks).saturating_sub(end) as f64
                / elapsed.as_secs_f64(),
        }
    });
    let lag = read_model_lag(&service);
    let caught_up = lag.map(|_| catch_up(&service, Duration::from_secs(30)));
    service.stop();
    Run {
        variant,
        full,
        paced,
        replied,
        lag,
        caught_up,
        backlog,
        appends,
        per_update,
        refused,
    }
}

fn row(backend: &str, m: &Measured, baseline: Option<f64>) {
    let ms = |d: Duration| format!("{:.2}", d.as_secs_f64() * 1e3);
    println!(
        "| {backend} | {} | {:.0} | {} | {} | {} | {} | {} |",
        m.label,
        m.acks_per_second,
        ms(m.p50),
        ms(m.p99),
        ms(m.max),
        m.errors,
        baseline.map_or_else(String::new, |b| format!("{:.2}x", m.acks_per_second / b)),
    );
}

/// The median of `values` (the mean of the middle two for an even count); 0 if empty.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The variants side by side: closed-loop acks/s (and its ratio to intake alone), p99 closed
/// loop, p99 at a quarter of the closed-loop rate, the worker's backlog (operations not taken up
/// yet) when that paced phase started and ended, its replies per second in that phase and their
/// age (p50 / p99, from the update to its reply, medians over the rounds), the read models' lag at the end and how long
/// after it they were within a page of the head, and where an append's time went in the paced
/// phase (the service's histograms: the p99 of its wait for its batch, of its batch's write, as
/// the bounds of the buckets that hold them), and the appends and commits per update there.
/// `runs[v][r]` is variant `v` in round `r`; with several rounds every figure is the median over
/// them, the ratio is the median of each round's ratio to that round's intake alone (shown with
/// its lowest and highest), the lag and the catch-up are shown with their largest, and the
/// backlog is the last round's.
fn side_by_side(backend: &str, runs: &[Vec<Run>]) {
    let ms = |seconds: f64| format!("{:.2}", seconds * 1e3);
    let rounds = runs.first().map_or(0, Vec::len);
    let closed = |run: &Run| run.full.as_ref().map(|full| full.acks_per_second);
    let intake: Vec<Option<f64>> = runs
        .first()
        .map(|r| r.iter().map(closed).collect())
        .unwrap_or_default();
    let ratios = |variant: &[Run]| -> Vec<f64> {
        variant
            .iter()
            .zip(&intake)
            .filter_map(|(run, intake)| Some(closed(run)? / (*intake)?))
            .collect()
    };
    // At a steady rate (`OPLEDGER_LOAD_RATE`) there is no closed loop to show or compare.
    let steady = runs.iter().flatten().all(|run| run.full.is_none());
    let paced_p99 = if steady {
        "p99 paced ms"
    } else {
        "p99 at a quarter ms"
    };
    let of = |variant: &[Run], f: &dyn Fn(&Run) -> f64| median(variant.iter().map(f).collect());
    let heading = if rounds > 1 {
        format!("medians of {rounds} interleaved rounds")
    } else {
        "one run".to_owned()
    };
    println!("\n`serve` on {backend}, side by side ({heading}):\n");
    println!(
        "| variant | acks/s | vs intake only | p99 closed loop ms | {paced_p99} | worker backlog paced, start → end (taken up per s) | replies paced per s (age p50 / p99 s) | errors | read-model lag at the end | read models within a page after | cores busy (closed loop / paced) | CPU µs per ack, all but the load generator (of it the service), closed loop (steady: paced) | append p99 paced, wait / write ms (≤ bucket) | appends / commits per update paced |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for variant in runs {
        let Some(last) = variant.last() else { continue };
        let ratio = ratios(variant);
        let spread = if rounds > 1 && !ratio.is_empty() {
            let low = ratio.iter().copied().fold(f64::INFINITY, f64::min);
            let high = ratio.iter().copied().fold(0.0, f64::max);
            format!(" ({low:.2}–{high:.2})")
        } else {
            String::new()
        };
        let lags: Vec<f64> = variant
            .iter()
            .filter_map(|r| r.lag)
            .map(|l| l as f64)
            .collect();
        let catch_ups: Vec<Result<Duration, Duration>> =
            variant.iter().filter_map(|r| r.caught_up).collect();
        let caught_up = if catch_ups.is_empty() {
            "-".to_owned()
        } else {
            let seconds = |c: &Result<Duration, Duration>| match c {
                Ok(d) | Err(d) => d.as_secs_f64(),
            };
            let shown = |c: &Result<Duration, Duration>| match c {
                Ok(d) => format!("{:.1} s", d.as_secs_f64()),
                Err(limit) => format!("> {:.0} s", limit.as_secs_f64()),
            };
            let mut sorted = catch_ups.clone();
            sorted.sort_by(|a, b| seconds(a).total_cmp(&seconds(b)));
            let middle = shown(&sorted[(sorted.len() - 1) / 2]);
            let last = sorted.last().map(shown).unwrap_or_default();
            if rounds == 1 {
                middle
            } else {
                format!("{middle} (max {last})")
            }
        };
        let busy_in = |phase: &dyn Fn(&Run) -> Option<Cpu>| {
            let busy: Vec<f64> = variant.iter().filter_map(phase).map(|c| c.busy).collect();
            match busy.is_empty() {
                true => "-".to_owned(),
                false => format!("{:.0}%", 100.0 * median(busy)),
            }
        };
        let busy = format!(
            "{} / {}",
            busy_in(&|r| r.full.as_ref().and_then(|f| f.cpu)),
            busy_in(&|r| r.paced.cpu)
        );
        let cpu: Vec<Cpu> = variant
            .iter()
            .filter_map(|r| r.full.as_ref().map_or(r.paced.cpu, |f| f.cpu))
            .collect();
        let per_ack = if cpu.is_empty() {
            "-".to_owned()
        } else {
            format!(
                "{:.0} ({:.0})",
                median(cpu.iter().map(|c| c.per_ack.as_secs_f64() * 1e6).collect()),
                median(
                    cpu.iter()
                        .map(|c| c.service_per_ack.as_secs_f64() * 1e6)
                        .collect()
                )
            )
        };
        let bound = |pick: &dyn Fn(&Run) -> Option<f64>| {
            let bounds: Vec<f64> = variant.iter().filter_map(pick).collect();
            match bounds.is_empty() {
                true => "-".to_owned(),
                false => match median(bounds) {
                    b if b.is_infinite() => "> 2500".to_owned(),
                    // Bucket bounds in ms (0.25, 2.5, 7.5, ...) or their mean: no float noise.
                    b => format!("{:.3}", b * 1e3)
                        .trim_end_matches('0')
                        .trim_end_matches('.')
                        .to_owned(),
                },
            }
        };
        let appends = format!("{} / {}", bound(&|r| r.appends.0), bound(&|r| r.appends.1));
        let per_update: Vec<(f64, f64)> = variant.iter().filter_map(|r| r.per_update).collect();
        let per_update = match per_update.is_empty() {
            true => "-".to_owned(),
            false => format!(
                "{:.2} / {:.2}",
                median(per_update.iter().map(|p| p.0).collect()),
                median(per_update.iter().map(|p| p.1).collect())
            ),
        };
        let replied: Vec<Replied> = variant.iter().filter_map(|r| r.replied).collect();
        let replies = if replied.is_empty() {
            "-".to_owned()
        } else {
            let ages: Vec<(Duration, Duration)> = replied.iter().filter_map(|r| r.ages).collect();
            // Milliseconds while the worker keeps up, seconds behind a backlog.
            let age = |pick: fn(&(Duration, Duration)) -> Duration| match median(
                ages.iter().map(|a| pick(a).as_secs_f64()).collect(),
            ) {
                s if s < 1.0 => format!("{:.3}", s),
                s => format!("{s:.1}"),
            };
            let per_second = median(replied.iter().map(|r| r.per_second).collect());
            match ages.is_empty() {
                true => format!("{per_second:.0} (-)"),
                false => format!("{per_second:.0} ({} / {})", age(|a| a.0), age(|a| a.1)),
            }
        };
        // The load generator's errors, with what the edge refused (the rest: timeouts, answers
        // other than 200).
        let errors = |variant: &[Run]| {
            let count: u64 = variant
                .iter()
                .map(|r| r.full.as_ref().map_or(0, |f| f.errors) + r.paced.errors)
                .sum();
            let refused: Vec<&str> = variant
                .iter()
                .map(|r| r.refused.as_str())
                .filter(|refused| !refused.is_empty())
                .collect();
            match refused.is_empty() {
                true => count.to_string(),
                false => format!("{count} (refused: {})", refused.join("; ")),
            }
        };
        let (acks, vs_intake, p99_closed) = if steady {
            ("-".to_owned(), "-".to_owned(), "-".to_owned())
        } else {
            (
                format!("{:.0}", of(variant, &|r| closed(r).unwrap_or(0.0))),
                format!("{:.2}x{spread}", median(ratio)),
                ms(of(variant, &|r| {
                    r.full.as_ref().map_or(0.0, |f| f.p99.as_secs_f64())
                })),
            )
        };
        println!(
            "| {} | {acks} | {vs_intake} | {p99_closed} | {} | {} | {replies} | {} | {} | {caught_up} | {busy} | {per_ack} | {appends} | {per_update} |",
            last.variant,
            ms(of(variant, &|r| r.paced.p99.as_secs_f64())),
            last.backlog.map_or_else(
                || "-".to_owned(),
                |b| format!("{} → {} ({:.0})", b.start, b.end, b.taken_up_per_second)
            ),
            errors(variant),
            match lags.iter().copied().reduce(f64::max) {
                None => "-".to_owned(),
                Some(_) if rounds == 1 => format!("{:.0}", median(lags)),
                Some(max) => format!("{:.0} (max {max:.0})", median(lags)),
            },
        );
    }
    // The targets compare everything with intake only: judged only when both were run.
    let is = |variant: Option<&Vec<Run>>, name: &str| {
        variant.and_then(|v| v.first()).map(|r| r.variant) == Some(name)
    };
    if let Some(everything) = runs.last().filter(|_| {
        !steady
            && is(runs.first(), VARIANTS[0].0)
            && is(runs.last(), VARIANTS[VARIANTS.len() - 1].0)
    }) {
        let ratio = median(ratios(everything));
        let p99 = of(everything, &|r| r.paced.p99.as_secs_f64());
        let bound = if backend == "SQLite" { 5 } else { 10 };
        println!(
            "\ntargets ({backend}): everything >= 0.9x intake only: {} ({ratio:.2}x); p99 at the \
             quarter rate <= {bound} ms: {} ({} ms)",
            if ratio >= 0.9 { "met" } else { "MISSED" },
            if p99 <= bound as f64 / 1e3 {
                "met"
            } else {
                "MISSED"
            },
            ms(p99),
        );
        let per_ack = |variant: &[Run]| {
            let cpu: Vec<f64> = variant
                .iter()
                .filter_map(|r| r.full.as_ref()?.cpu.map(|c| c.per_ack.as_secs_f64()))
                .collect();
            (!cpu.is_empty()).then(|| median(cpu))
        };
        let busy = |variant: &[Run]| {
            median(
                variant
                    .iter()
                    .filter_map(|r| r.full.as_ref()?.cpu.map(|c| c.busy))
                    .collect(),
            )
        };
        if let (Some(intake), Some(intake_cpu), Some(all)) = (
            runs.first(),
            runs.first().and_then(|r| per_ack(r)),
            per_ack(everything),
        ) {
            println!(
                "CPU ({backend}, closed loop): intake only keeps the cores {:.0}% busy and takes \
                 {:.0} µs per ack, everything {:.0}% and {:.0} µs per ack ({:+.0}%)",
                busy(intake) * 100.0,
                intake_cpu * 1e6,
                busy(everything) * 100.0,
                all * 1e6,
                (all / intake_cpu - 1.0) * 100.0,
            );
        }
    }
}

/// A scratch PostgreSQL database on `admin`'s server; its URL.
async fn create_database(connection: &mut sqlx::PgConnection, admin: &str, name: &str) -> String {
    connection
        .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .await
        .expect("create database");
    match admin.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{name}"),
        None => admin.to_owned(),
    }
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("run with `cargo bench -p opledger-cli --bench load`");
        return;
    }
    let backends = std::env::var("OPLEDGER_BENCH_BACKENDS").unwrap_or("sqlite,postgres".into());
    let dir = tempfile::tempdir().expect("temporary directory");
    let raw = raw_sqlite_rate(dir.path(), 5).await;
    let (api, replies) = fake_bot_api().await;
    // `OPLEDGER_LOAD_VARIANTS=1,4` runs only those (1-based, in the order of `VARIANTS`).
    let chosen = std::env::var("OPLEDGER_LOAD_VARIANTS").unwrap_or("1,2,3,4".into());
    let variants: Vec<_> = VARIANTS
        .iter()
        .enumerate()
        .filter(|(i, _)| chosen.split(',').any(|c| c.trim() == (i + 1).to_string()))
        .map(|(_, v)| *v)
        .collect();
    let mut results: Vec<(&str, Vec<Vec<Run>>)> = Vec::new();
    let rounds = env_number("OPLEDGER_LOAD_ROUNDS", 1).max(1);
    let no_runs = || -> Vec<Vec<Run>> { variants.iter().map(|_| Vec::new()).collect() };
    if backends.contains("sqlite") {
        let mut runs = no_runs();
        for round in 0..rounds {
            for (i, (variant, args)) in variants.iter().enumerate() {
                let folder = dir.path().join(format!("sqlite-{round}-{i}"));
                std::fs::create_dir_all(&folder).expect("a folder");
                let url = format!("sqlite://{}", folder.join("ledger.db").display());
                runs[i].push(
                    run_variant("SQLite", variant, args, &url, (&api, &replies), &folder).await,
                );
                // Each variant's files go before the next starts: the disk is shared too.
                let _ = std::fs::remove_dir_all(&folder);
            }
        }
        results.push(("SQLite", runs));
    }
    if backends.contains("postgres") {
        let admin = std::env::var("OPLEDGER_BENCH_PG_URL")
            .unwrap_or("postgres://postgres@127.0.0.1:5432/postgres".into());
        match sqlx::postgres::PgConnection::connect(&admin).await {
            Ok(mut connection) => {
                let mut runs = no_runs();
                for _ in 0..rounds {
                    for (i, (variant, args)) in variants.iter().enumerate() {
                        let name = format!("opledger_load_{}_{i}", std::process::id());
                        let url = create_database(&mut connection, &admin, &name).await;
                        let folder = tempfile::tempdir().expect("temporary directory");
                        let run = run_variant(
                            "PostgreSQL",
                            variant,
                            args,
                            &url,
                            (&api, &replies),
                            folder.path(),
                        );
                        runs[i].push(run.await);
                        connection
                            .execute(sqlx::AssertSqlSafe(format!(
                                "DROP DATABASE {name} WITH (FORCE)"
                            )))
                            .await
                            .expect("drop database");
                    }
                }
                results.push(("PostgreSQL", runs));
            }
            Err(error) => println!("PostgreSQL skipped: cannot connect to {admin}: {error}"),
        }
    }
    println!(
        "\nopledger serve under load: /coupon updates, each from another user (one new operation each)"
    );
    println!(
        "raw SQLite one-row INSERT per transaction (synchronous=FULL), same run: {raw:.0}/s\n"
    );
    println!(
        "| backend | variant: phase | acks/s | p50 ms | p99 ms | max ms | errors | vs raw SQLite |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for (backend, runs) in &results {
        for round in 0..rounds as usize {
            for run in runs.iter().filter_map(|variant| variant.get(round)) {
                let label = |m: &Measured| Measured {
                    label: if rounds > 1 {
                        format!("round {}, {}: {}", round + 1, run.variant, m.label)
                    } else {
                        format!("{}: {}", run.variant, m.label)
                    },
                    ..m.clone()
                };
                if let Some(full) = &run.full {
                    row(backend, &label(full), Some(raw));
                }
                row(backend, &label(&run.paced), None);
            }
        }
    }
    for (backend, runs) in &results {
        side_by_side(backend, runs);
    }
}
