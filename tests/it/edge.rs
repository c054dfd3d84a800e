//! The HTTP edge holds on its own, as if no proxy stood in front (issue 15, item 2: D3, D10,
//! D12), driven over raw TCP like a hostile or careless client: silent and slow connections are
//! cut off, idle ones make room at the connection limit while authenticated deliveries and
//! health probes keep theirs, a small file descriptor limit does not keep deliveries out, a
//! declared oversize body is refused at once and a malformed one with 400, and a flood of
//! wrong secrets writes a line per interval, not one each.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::app::{Backend, Ledger, SECRET, TOKEN, TestApp, message};
use crate::support::serving::{Serving, opledger, write_config};
use crate::support::{opledger_bin, sqlite_url};

/// How long a connection that should be closed may take to be closed, past its deadline.
const SLACK: Duration = Duration::from_secs(3);

/// A raw client connection.
struct Raw {
    stream: TcpStream,
}

impl Raw {
    async fn connect(address: SocketAddr) -> Raw {
        Raw {
            stream: TcpStream::connect(address).await.expect("connect"),
        }
    }

    async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes).await
    }

    /// Sends a request and reads its answer's status (the answer's body is read by its
    /// `Content-Length`, so the connection can carry another request).
    async fn request(&mut self, request: &[u8]) -> u16 {
        self.send(request).await.expect("send the request");
        self.answer().await.expect("an answer")
    }

    /// Reads one answer; its status, or `None` if the connection closed first.
    async fn answer(&mut self) -> Option<u16> {
        let mut head = Vec::new();
        let mut byte = [0_u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match tokio::time::timeout(Duration::from_secs(10), self.stream.read(&mut byte)).await {
                Ok(Ok(1)) => head.push(byte[0]),
                Ok(_) => return None,
                Err(_) => panic!("no answer within 10 s"),
            }
        }
        let head = String::from_utf8(head).expect("a text head");
        let status = head.split(' ').nth(1)?.parse().ok()?;
        let length: usize = head
            .lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())?
            })
            .unwrap_or(0);
        let mut body = vec![0_u8; length];
        self.stream.read_exact(&mut body).await.ok()?;
        Some(status)
    }

    /// Waits up to `patience` for the server to close the connection; how long it took, or
    /// `None` if it stayed open. Whatever the server sends meanwhile is skipped.
    async fn closed_within(&mut self, patience: Duration) -> Option<Duration> {
        let start = Instant::now();
        let mut buffer = [0_u8; 1024];
        loop {
            let left = patience.checked_sub(start.elapsed())?;
            match tokio::time::timeout(left, self.stream.read(&mut buffer)).await {
                Err(_) => return None,
                Ok(Ok(0) | Err(_)) => return Some(start.elapsed()),
                Ok(Ok(_)) => {}
            }
        }
    }
}

/// A webhook request for the test bot with `secret`, carrying `body`.
fn delivery(secret: &str, body: &[u8]) -> Vec<u8> {
    let mut request = format!(
        "POST /telegram/shop/webhook HTTP/1.1\r\nhost: opledger\r\n\
         content-type: application/json\r\nx-telegram-bot-api-secret-token: {secret}\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    request
}

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nhost: opledger\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn silent_slow_and_idle_connections_are_cut_off() {
    let ledger = Ledger::create(Backend::Sqlite).await.expect("SQLite");
    let app = TestApp::spawn(
        &ledger,
        &config_with_server("header_read_timeout_ms = 400\nidle_timeout_ms = 2500\n"),
    )
    .await;
    let started = Instant::now();
    // A connection that sends nothing.
    let mut silent = Raw::connect(app.address).await;
    // A connection that sends a head a byte at a time, never finishing it.
    let mut slow = Raw::connect(app.address).await;
    slow.send(b"POST /telegram/shop/webhook HTTP/1.1\r\n")
        .await
        .expect("send");
    let trickle = tokio::spawn(async move {
        for _ in 0..100 {
            if slow.send(b"x").await.is_err() {
                return Some(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        slow.closed_within(Duration::from_millis(1)).await
    });
    let silent_closed = silent.closed_within(SLACK).await;
    let silent_closed = silent_closed.expect("a silent connection is closed");
    assert!(
        silent_closed >= Duration::from_millis(350),
        "not before the header-read timeout: {silent_closed:?}"
    );
    let slow_closed = trickle
        .await
        .expect("the trickle")
        .expect("a slow head is cut off");
    assert!(
        slow_closed < Duration::from_millis(400) + SLACK,
        "bytes trickling in do not keep a head alive: {slow_closed:?}"
    );

    // A keep-alive connection may wait between requests for the idle timeout, longer than the
    // header-read timeout, and is closed after it.
    let mut idle = Raw::connect(app.address).await;
    assert_eq!(idle.request(HEALTHZ).await, 200);
    assert_eq!(
        idle.closed_within(Duration::from_millis(1500)).await,
        None,
        "open past the header-read timeout while idle"
    );
    assert_eq!(idle.request(HEALTHZ).await, 200, "and still serving");
    let closed = idle
        .closed_within(Duration::from_millis(2500) + SLACK)
        .await
        .expect("an idle connection is closed after the idle timeout");
    assert!(closed >= Duration::from_millis(2000), "{closed:?}");
    app.stop().await;
}

/// The test configuration (the bot `shop`) with extra `[server]` keys: `config` appends its
/// extra text after the bot, where `[server]` keys cannot go.
fn config_with_server(keys: &str) -> opledger_config::Config {
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n{keys}\
         [[bots]]\nname = \"shop\"\ntoken_env = \"SHOP_TOKEN\"\n\
         webhook_secret_env = \"SHOP_SECRET\"\n"
    );
    let env = |name: &str| match name {
        "SHOP_TOKEN" => Some(TOKEN.to_owned()),
        "SHOP_SECRET" => Some(SECRET.to_owned()),
        _ => None,
    };
    opledger_config::Config::parse(&text, &env).expect("test config")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn at_the_limit_idle_connections_make_room_and_authenticated_ones_keep_theirs() {
    let ledger = Ledger::create(Backend::Sqlite).await.expect("SQLite");
    let app = TestApp::spawn(&ledger, &config_with_server("connection_limit = 16\n")).await;
    // Telegram's keep-alive connection, authenticated by its first delivery.
    let mut telegram = Raw::connect(app.address).await;
    let first = message(1, 1_790_000_000, "hello");
    assert_eq!(telegram.request(&delivery(SECRET, &first)).await, 200);
    // Forty connections that send nothing, more than the limit.
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(Raw::connect(app.address).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A new delivery and a probe get in at once, long before any timeout.
    let started = Instant::now();
    let mut fresh = Raw::connect(app.address).await;
    let second = message(2, 1_790_000_001, "hello again");
    assert_eq!(fresh.request(&delivery(SECRET, &second)).await, 200);
    let mut probe = Raw::connect(app.address).await;
    assert_eq!(probe.request(HEALTHZ).await, 200);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // The authenticated connection was kept.
    let third = message(3, 1_790_000_002, "third");
    assert_eq!(telegram.request(&delivery(SECRET, &third)).await, 200);
    let mut closed = 0;
    for connection in &mut idle {
        if connection
            .closed_within(Duration::from_millis(50))
            .await
            .is_some()
        {
            closed += 1;
        }
    }
    assert!(
        closed >= 40 - 14,
        "idle connections made room: {closed} closed"
    );
    assert_eq!(
        app.count("UpdateReceived").await,
        3,
        "every delivery recorded"
    );
    let metrics = app
        .http
        .get(format!("http://{}/metrics", app.address))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    let evicted: u64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("opledger_http_refusals_total{reason=\"evicted\"} "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("the evictions are counted: {metrics}"));
    assert!(evicted >= 26, "{evicted}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_reserved_slots_are_kept_for_connections_that_vouch_for_themselves() {
    let ledger = Ledger::create(Backend::Sqlite).await.expect("SQLite");
    // 16 slots, 2 of them reserved; the header-read timeout is long, so only the reserve's
    // probation closes the connections below.
    let app = TestApp::spawn(&ledger, &config_with_server("connection_limit = 16\n")).await;
    // Fourteen probes fill the ordinary slots; they have vouched and cannot be evicted.
    let mut probes = Vec::new();
    for _ in 0..14 {
        let mut probe = Raw::connect(app.address).await;
        assert_eq!(probe.request(HEALTHZ).await, 200);
        probes.push(probe);
    }
    // A silent connection in a reserved slot is closed after its probation (2 s), not after
    // the 10 s header-read timeout.
    let mut silent = Raw::connect(app.address).await;
    let closed = silent
        .closed_within(Duration::from_secs(2) + SLACK)
        .await
        .expect("a silent connection leaves its reserved slot");
    assert!(closed >= Duration::from_millis(1500), "{closed:?}");
    // One that is refused is answered, then closed.
    let mut refused = Raw::connect(app.address).await;
    let body = message(1, 1_790_000_000, "hi");
    assert_eq!(refused.request(&delivery("wrong-secret", &body)).await, 401);
    assert!(
        refused.closed_within(SLACK).await.is_some(),
        "closed after its answer"
    );
    // An authenticated delivery keeps its reserved slot.
    let mut telegram = Raw::connect(app.address).await;
    assert_eq!(telegram.request(&delivery(SECRET, &body)).await, 200);
    assert_eq!(telegram.closed_within(Duration::from_secs(3)).await, None);
    let again = message(2, 1_790_000_001, "hi again");
    assert_eq!(telegram.request(&delivery(SECRET, &again)).await, 200);
    for probe in &mut probes {
        assert_eq!(
            probe.request(HEALTHZ).await,
            200,
            "the probes kept their slots"
        );
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_oversize_declared_body_is_refused_at_once_and_a_malformed_one_with_400() {
    let ledger = Ledger::create(Backend::Sqlite).await.expect("SQLite");
    let app = TestApp::spawn(&ledger, &config_with_server("body_limit_bytes = 65536\n")).await;
    // A declared length over the limit: 413 before a byte of the body is sent.
    let mut oversize = Raw::connect(app.address).await;
    let started = Instant::now();
    let status = oversize
        .request(
            format!(
                "POST /telegram/shop/webhook HTTP/1.1\r\nhost: opledger\r\n\
                 x-telegram-bot-api-secret-token: {SECRET}\r\ncontent-length: 2000000\r\n\r\n"
            )
            .as_bytes(),
        )
        .await;
    assert_eq!(status, 413);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // A chunked body whose chunk size is not hexadecimal.
    let mut malformed = Raw::connect(app.address).await;
    let status = malformed
        .request(
            format!(
                "POST /telegram/shop/webhook HTTP/1.1\r\nhost: opledger\r\n\
                 x-telegram-bot-api-secret-token: {SECRET}\r\ntransfer-encoding: chunked\r\n\r\n\
                 zz\r\n{{\"update_id\": 1}}\r\n0\r\n\r\n"
            )
            .as_bytes(),
        )
        .await;
    assert_eq!(status, 400);
    // A chunked body over the limit is still 413.
    let mut big = Raw::connect(app.address).await;
    let chunk = "x".repeat(40_000);
    let status = big
        .request(
            format!(
                "POST /telegram/shop/webhook HTTP/1.1\r\nhost: opledger\r\n\
                 x-telegram-bot-api-secret-token: {SECRET}\r\ntransfer-encoding: chunked\r\n\r\n\
                 {len:x}\r\n{chunk}\r\n{len:x}\r\n{chunk}\r\n0\r\n\r\n",
                len = chunk.len()
            )
            .as_bytes(),
        )
        .await;
    assert_eq!(status, 413);
    assert!(app.events().await.is_empty(), "nothing was stored");
    app.stop().await;
}

/// The real binary under a file descriptor limit of 256: 300 connections that send nothing
/// used to exhaust it, so that every delivery and `/healthz` timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn under_a_small_descriptor_limit_idle_connections_keep_no_delivery_out() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = write_config(
        dir.path(),
        "opledger.toml",
        "[server]\nlisten = \"127.0.0.1:0\"\n[[bots]]\nname = \"shop\"\n\
         token_env = \"SHOP_TOKEN\"\nwebhook_secret_env = \"SHOP_SECRET\"\n",
    );
    let mut limited = std::process::Command::new("prlimit");
    limited
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("SHOP_TOKEN", TOKEN)
        .env("SHOP_SECRET", SECRET)
        .arg("--nofile=256:256")
        .arg("--")
        .arg(opledger_bin())
        .arg("--config")
        .arg(&path)
        .arg("--database-url")
        .arg(sqlite_url(&dir.path().join("ledger.db")));
    let mut serving = Serving::start(limited);
    let address = serving.address().await;
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(Raw::connect(address).await);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let mut telegram = Raw::connect(address).await;
    let body = message(1, 1_790_000_000, "hello");
    assert_eq!(telegram.request(&delivery(SECRET, &body)).await, 200);
    let mut probe = Raw::connect(address).await;
    assert_eq!(probe.request(HEALTHZ).await, 200);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    drop(idle);
    let status = serving.terminate().await;
    assert_eq!(status.code(), Some(0), "stderr: {}", serving.stderr());
    assert!(
        serving.stderr().contains("connection_limit lowered"),
        "the lowered limit is said: {}",
        serving.stderr()
    );
}

/// A flood of wrong secrets writes a line per interval with the count and the address, not a
/// line each (20,000 of them used to write 20,000 lines).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_wrong_secrets_is_logged_as_counts_per_interval() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = write_config(
        dir.path(),
        "opledger.toml",
        "[server]\nlisten = \"127.0.0.1:0\"\n[[bots]]\nname = \"shop\"\n\
         token_env = \"SHOP_TOKEN\"\nwebhook_secret_env = \"SHOP_SECRET\"\n",
    );
    let mut command = opledger(&[("SHOP_TOKEN", TOKEN), ("SHOP_SECRET", SECRET)]);
    command
        .arg("--config")
        .arg(&path)
        .arg("--database-url")
        .arg(sqlite_url(&dir.path().join("ledger.db")));
    let mut serving = Serving::start(command);
    let address = serving.address().await;
    let started = Instant::now();
    const FLOOD: usize = 2000;
    let mut senders = Vec::new();
    for sender in 0..4 {
        senders.push(tokio::spawn(async move {
            let mut raw = Raw::connect(address).await;
            let body = message(1, 1_790_000_000, "hi");
            for _ in 0..FLOOD / 4 {
                let status = raw
                    .request(&delivery(&format!("wrong-{sender}"), &body))
                    .await;
                assert_eq!(status, 401);
            }
        }));
    }
    for sender in senders {
        sender.await.expect("a sender");
    }
    let status = serving.terminate().await;
    assert_eq!(status.code(), Some(0), "stderr: {}", serving.stderr());
    // The first line at once, one per 10 s interval, and the rest at shutdown.
    let most = 2 + usize::try_from(started.elapsed().as_secs() / 10).expect("small");
    let stderr = serving.stderr();
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("webhook request refused without the right secret"))
        .collect();
    assert!(
        (1..=most).contains(&lines.len()),
        "a line per interval: {} lines\n{stderr}",
        lines.len()
    );
    let counted: usize = lines
        .iter()
        .map(|line| {
            line.split("(401): ")
                .nth(1)
                .and_then(|rest| rest.split([' ', ',']).next())
                .and_then(|count| count.parse::<usize>().ok())
                .unwrap_or_else(|| panic!("a count in `{line}`"))
        })
        .sum();
    assert_eq!(counted, FLOOD, "every refusal counted: {stderr}");
    assert!(
        lines
            .iter()
            .all(|line| line.contains("from 127.0.0.1 (") && line.contains("(shop)")),
        "the lines name the bot and the client address: {stderr}"
    );
    assert!(
        !stderr.contains("wrong-0"),
        "what was presented is never logged"
    );
}
