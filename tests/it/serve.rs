//! `opledger serve` and the commands around it, run as the real binary the way an operator runs
//! them (issue 4 §3, §8, §9; DESIGN §2 guarantee 10, §9): a bad configuration stops the start
//! with exit code 2 and one line naming the key; without a configuration the service starts on
//! SQLite and says that no bot is configured; SIGTERM stops it cleanly; bot tokens, webhook
//! secrets and message text never reach its output (nor the ledger, unless raw updates are kept
//! on purpose); `webhook set|info` talk to the configured Bot API; `ops` lists operations.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

use crate::support::app::{Backend, COUPON, Ledger, SECRET, TOKEN, TestApp, config, message};
use crate::support::fake_telegram::{FakeMode, FakeTelegram, FakeWebhook};
use crate::support::serving::{PATIENCE, Serving, ledger_events, opledger, run, write_config};
use crate::support::{sqlite_url, stderr, stdout};

/// A bot token that must never appear in any output or in the ledger.
const CANARY_TOKEN: &str = "123456:CANARY-BOT-TOKEN-xyz";
/// A webhook secret that must never appear in any output or in the ledger.
const CANARY_SECRET: &str = "CANARYSECRETabc123";
/// Message text that must never appear in any output, nor in the ledger unless raw updates are
/// kept.
const PRIVATE_TEXT: &str = "my private text 123";

/// Asserts a failure with exactly one line on stderr, starting with `error:` and containing
/// every needle, and with exit code `code` when one is given.
fn assert_one_line_error(output: &Output, code: Option<i32>, needles: &[&str]) {
    let err = stderr(output);
    assert!(!output.status.success(), "a failure; stderr: {err}");
    if let Some(code) = code {
        assert_eq!(output.status.code(), Some(code), "exit code; stderr: {err}");
    }
    assert_eq!(err.lines().count(), 1, "one line, got: {err}");
    assert!(err.starts_with("error: "), "{err}");
    for needle in needles {
        assert!(err.contains(needle), "expected `{needle}` in: {err}");
    }
}

/// A configuration that is fine apart from what a case breaks.
const BOT: &str = "[[bots]]\nname = \"shop\"\ntoken_env = \"SHOP_TOKEN\"\n\
    webhook_secret_env = \"SHOP_SECRET\"\n";

/// One way to get the configuration wrong: its file, its environment, and what the error names.
struct BadConfig<'a> {
    case: &'a str,
    text: String,
    env: &'a [(&'a str, &'a str)],
    needles: &'a [&'a str],
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_configuration_stops_serve_with_code_2_and_one_line_naming_the_key() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let ledger = dir.path().join("ledger.db");
    let duplicate = COUPON.replace("name = \"coupon\"", "name = \"voucher\"");
    let both = [("SHOP_TOKEN", TOKEN), ("SHOP_SECRET", SECRET)];
    let cases = [
        BadConfig {
            case: "unknown key",
            text: format!("[server]\nlisten = \"127.0.0.1:0\"\nlisten_port = 8081\n{BOT}"),
            env: &both,
            needles: &["config key `server.listen_port`", "unknown key"],
        },
        BadConfig {
            case: "missing environment variable",
            text: format!("{BOT}{COUPON}"),
            env: &[("SHOP_SECRET", SECRET)],
            needles: &["config key `bots[0].token_env`", "SHOP_TOKEN", "is not set"],
        },
        BadConfig {
            case: "malformed template",
            text: format!(
                "{BOT}{}",
                COUPON.replace("{campaign}:{user_id}", "{campaign")
            ),
            env: &both,
            needles: &["config key `actions[0].key`", "unclosed `{`"],
        },
        BadConfig {
            case: "in-process handlers",
            text: format!("{BOT}[bots.forward]\nin_process = true\n"),
            env: &both,
            needles: &[
                "config key `bots[0].forward.in_process`",
                "embeds opledger",
                "[bots.forward] url",
            ],
        },
        BadConfig {
            case: "in-process effect",
            text: format!(
                "{BOT}{}",
                COUPON.replace("url = \"http://127.0.0.1:9/coupons\"", "in_process = true")
            ),
            env: &both,
            needles: &[
                "config key `actions[0].effector.in_process`",
                "[actions.effector] url",
            ],
        },
        BadConfig {
            case: "duplicate command",
            text: format!("{BOT}{COUPON}{duplicate}"),
            env: &both,
            needles: &[
                "config key `actions[1].command`",
                "duplicate command `/coupon`",
            ],
        },
    ];
    for BadConfig {
        case,
        text,
        env,
        needles,
    } in cases
    {
        let path = write_config(dir.path(), "bad.toml", &text);
        let mut command = opledger(env);
        command
            .current_dir(dir.path())
            .arg("--config")
            .arg(&path)
            .arg("--database-url")
            .arg(sqlite_url(&ledger))
            .arg("serve");
        let output = run(command).await;
        assert_one_line_error(&output, Some(2), needles);
        assert!(
            stdout(&output).is_empty(),
            "{case}: nothing served: {}",
            stdout(&output)
        );
        assert!(
            !ledger.exists(),
            "{case}: stopped before opening the ledger"
        );
        for (_, value) in env {
            assert!(!stderr(&output).contains(value), "{case}: no secret echoed");
        }
    }
}

/// A SIGTERM sent the moment the service says where it serves stops it gracefully: the signal
/// handlers are in place before that line. (They were installed when the server first polled
/// its shutdown future, which under load could come after the line, and the signal killed it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_right_after_the_serving_line_stops_serve_gracefully() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = any_port_config(dir.path());
    for _ in 0..5 {
        let mut command = opledger(&[]);
        command.current_dir(dir.path()).arg("--config").arg(&path);
        let mut serving = Serving::start(command);
        serving.address().await;
        stops_gracefully_on_sigterm(&mut serving).await;
    }
}

/// With intake first (the default) the read models run on a thread of their own, nicer than
/// the service's threads (ADR 0023), on both backends; with `--no-intake-priority` on the
/// service's runtime. Either way the service stops cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_its_read_models_on_a_thread_below_intake() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = any_port_config(dir.path());
    let cases: [(Backend, &[&str], bool); 4] = [
        (Backend::Sqlite, &[], true),
        (Backend::Sqlite, &["--no-intake-priority"], false),
        (Backend::Postgres, &[], true),
        (Backend::Postgres, &["--no-intake-priority"], false),
    ];
    for (backend, args, below) in cases {
        let Some(ledger) = Ledger::create(backend).await else {
            continue;
        };
        let mut command = opledger(&[]);
        command
            .current_dir(dir.path())
            .arg("--config")
            .arg(&path)
            .arg("--database-url")
            .arg(ledger.url())
            .arg("serve")
            .args(args);
        let mut serving = Serving::spawn(command);
        let address = serving.address().await;
        // The service answers only after it started its read models.
        let healthz = reqwest::get(format!("http://{address}/healthz"))
            .await
            .expect("healthz answers");
        assert_eq!(healthz.status(), StatusCode::OK);
        let threads = threads(serving.pid());
        let service = threads
            .iter()
            .find(|t| t.id == serving.pid())
            .expect("the main thread")
            .nice;
        // The kernel keeps 15 bytes of a thread's name.
        let read_models: Vec<&Task> = threads
            .iter()
            .filter(|t| t.name == "opledger-read-m")
            .collect();
        if below {
            assert_eq!(read_models.len(), 1, "{backend:?} {args:?}: {threads:?}");
            assert_eq!(read_models[0].nice, (service + 10).min(19), "{threads:?}");
        } else {
            assert!(read_models.is_empty(), "{backend:?} {args:?}: {threads:?}");
            assert!(threads.iter().all(|t| t.nice == service), "{threads:?}");
        }
        stops_gracefully_on_sigterm(&mut serving).await;
    }
}

/// A thread of a process, from `/proc`.
#[derive(Debug)]
struct Task {
    id: u32,
    name: String,
    nice: i32,
}

/// The threads of process `pid` with their names and nice values.
fn threads(pid: u32) -> Vec<Task> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("/proc/<pid>/task");
    tasks
        .map(|task| {
            let task = task.expect("task entry").path();
            let id = task
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.parse().ok())
                .expect("a thread id");
            let name = std::fs::read_to_string(task.join("comm")).expect("comm");
            let stat = std::fs::read_to_string(task.join("stat")).expect("stat");
            // Fields after the name's closing parenthesis: state is the 3rd field, nice the 19th.
            let after = &stat[stat.rfind(')').expect("(comm)") + 1..];
            let nice = after
                .split_whitespace()
                .nth(16)
                .and_then(|n| n.parse().ok())
                .expect("the nice field");
            Task {
                id,
                name: name.trim_end().to_owned(),
                nice,
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_without_a_bot_starts_on_sqlite_answers_healthz_and_stops_on_sigterm() {
    let http = reqwest::Client::new();

    let dir = tempfile::tempdir().expect("temporary directory");
    let path = any_port_config(dir.path());
    let mut command = opledger(&[]);
    command.current_dir(dir.path()).arg("--config").arg(&path);
    let mut serving = Serving::start(command);
    let address = serving.address().await;
    assert!(address.ip().is_loopback(), "{address}");
    let notice = serving
        .line("no bot is configured yet")
        .await
        .expect("the notice");
    assert!(notice.contains("[[bots]]"), "it says what to do: {notice}");
    assert!(
        serving
            .stdout()
            .contains("with the ledger sqlite://opledger.db"),
        "{}",
        serving.stdout()
    );
    assert!(
        dir.path().join("opledger.db").exists(),
        "the default ledger"
    );
    let health = http
        .get(format!("http://{address}/healthz"))
        .send()
        .await
        .expect("healthz answers");
    assert_eq!(health.status(), StatusCode::OK);
    assert_eq!(health.text().await.expect("a body"), "ok");
    let webhook = http
        .post(format!("http://{address}/telegram/shop/webhook"))
        .header("x-telegram-bot-api-secret-token", SECRET)
        .body(message(1, 1_790_000_000, "hello"))
        .send()
        .await
        .expect("the webhook answers");
    assert_eq!(
        webhook.status(),
        StatusCode::NOT_FOUND,
        "no bot, no webhook"
    );
    stops_gracefully_on_sigterm(&mut serving).await;
    assert_eq!(
        serving.stderr(),
        "",
        "a clean stop logs nothing at the default level"
    );

    // No configuration at all: the defaults, including the fixed port 8080. Only if that port
    // is free on this machine; otherwise the refusal must be the clear one-line error.
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut command = opledger(&[]);
    command.current_dir(dir.path());
    let mut serving = Serving::start(command);
    match serving
        .line("opledger is serving on http://127.0.0.1:8080 with the ledger sqlite://opledger.db")
        .await
    {
        Ok(_) => {
            serving
                .line("no bot is configured yet")
                .await
                .expect("the notice");
            assert!(
                dir.path().join("opledger.db").exists(),
                "the default ledger"
            );
            let health = http
                .get("http://127.0.0.1:8080/healthz")
                .send()
                .await
                .expect("healthz answers");
            assert_eq!(health.status(), StatusCode::OK);
            let status = serving.terminate().await;
            assert_eq!(status.code(), Some(0), "stderr: {}", serving.stderr());
            assert!(serving.stdout().contains("opledger stopped"));
        }
        Err(status) => {
            eprintln!("port 8080 is taken on this machine; checked the refusal instead");
            let err = serving.stderr();
            assert_eq!(status.code(), Some(1), "{err}");
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(
                err.starts_with("error: cannot listen on 127.0.0.1:8080")
                    && err.contains("[server] listen"),
                "{err}"
            );
        }
    }
}

/// The canary configuration: webhook bot `shop` (whose Bot API is `api`), poll bot `poller`
/// (polling `poll_api`), both with the canary token, and the coupon action.
fn canary_config(ledger: &Path, api: &str, poll_api: &str, store_raw_updates: bool) -> String {
    format!(
        "[storage]\nurl = \"{}\"\n\
         [server]\nlisten = \"127.0.0.1:0\"\nstore_raw_updates = {store_raw_updates}\n\
         shutdown_grace_ms = 2000\n\
         [[bots]]\nname = \"shop\"\ntoken_env = \"SHOP_TOKEN\"\n\
         webhook_secret_env = \"SHOP_SECRET\"\napi_base_url = \"{api}\"\n\
         [[bots]]\nname = \"poller\"\ntoken_env = \"SHOP_TOKEN\"\nmode = \"poll\"\n\
         api_base_url = \"{poll_api}\"\npoll_timeout_secs = 1\n{COUPON}",
        sqlite_url(ledger)
    )
}

const CANARY_ENV: &[(&str, &str)] = &[
    ("SHOP_TOKEN", CANARY_TOKEN),
    ("SHOP_SECRET", CANARY_SECRET),
    ("OPLEDGER_LOG", "trace"),
];

/// Sends SIGTERM and checks that `serve` stopped as asked: exit code 0, "opledger stopped".
async fn stops_gracefully_on_sigterm(serving: &mut Serving) {
    let status = serving.terminate().await;
    assert_eq!(status.code(), Some(0), "stderr: {}", serving.stderr());
    assert!(
        serving.stdout().contains("opledger stopped"),
        "{}",
        serving.stdout()
    );
}

/// A configuration that only moves the port to any free one: the rest is the defaults.
fn any_port_config(dir: &Path) -> std::path::PathBuf {
    write_config(dir, "opledger.toml", "[server]\nlisten = \"127.0.0.1:0\"\n")
}

/// Waits until `check` holds; fails after [`PATIENCE`].
async fn wait_for(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Drives the webhook and the poller of a canary service through every kind of answer, with
/// the private text in the bodies wherever it can be.
async fn drive(address: SocketAddr, poll_api: &FakeTelegram) {
    let http = reqwest::Client::new();
    let url = format!("http://{address}/telegram/shop/webhook");
    let post = |secret: Option<&str>, body: Vec<u8>| {
        let mut request = http.post(&url).body(body);
        if let Some(secret) = secret {
            request = request.header("x-telegram-bot-api-secret-token", secret);
        }
        async move { request.send().await.expect("the service answers").status() }
    };
    let t = 1_790_000_000;
    let text = |id: i64, words: &str| message(id, t + id, words);
    let right = Some(CANARY_SECRET);
    let cases: Vec<(&str, Option<&str>, Vec<u8>, StatusCode)> = vec![
        (
            "a command",
            right,
            text(1, "/coupon spring"),
            StatusCode::OK,
        ),
        (
            "its duplicate",
            right,
            text(1, "/coupon spring"),
            StatusCode::OK,
        ),
        ("private text", right, text(2, PRIVATE_TEXT), StatusCode::OK),
        (
            "a collision",
            right,
            text(2, &format!("{PRIVATE_TEXT} again")),
            StatusCode::OK,
        ),
        (
            "a command with private arguments",
            right,
            text(3, &format!("/help {PRIVATE_TEXT}")),
            StatusCode::OK,
        ),
        ("a usage answer", right, text(4, "/coupon"), StatusCode::OK),
        (
            "quarantine",
            right,
            format!("not json: {PRIVATE_TEXT}").into_bytes(),
            StatusCode::OK,
        ),
        (
            "a wrong secret",
            Some("CANARYSECRETabc124"),
            text(5, PRIVATE_TEXT),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "no secret",
            None,
            text(6, PRIVATE_TEXT),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "an oversized body",
            right,
            text(7, &format!("{PRIVATE_TEXT} {}", "x".repeat(1_100_000))),
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
    ];
    for (case, secret, body, expected) in cases {
        assert_eq!(post(secret, body).await, expected, "{case}");
    }
    // The poller: private text, and /help answered through the token's URL.
    poll_api.push_update(message(900, t, PRIVATE_TEXT));
    poll_api.push_update(message(901, t + 1, "/help"));
    wait_for("the poller's answer and confirmation", || {
        poll_api.calls("sendMessage").len() == 1 && poll_api.confirmed_offset() == Some(902)
    })
    .await;
}

/// Asserts that none of the canaries (and, when `text` is set, not the private text) is in
/// `output`, naming where it was found.
fn assert_clean(place: &str, output: &str, text: bool) {
    for canary in [CANARY_TOKEN, CANARY_SECRET, "CANARY-BOT-TOKEN"] {
        assert!(
            !output.contains(canary),
            "{place} contains the canary `{canary}`:\n{output}"
        );
    }
    if text {
        assert!(
            !output.contains(PRIVATE_TEXT),
            "{place} contains message text:\n{output}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_secret_and_no_message_text_reaches_the_logs_or_the_ledger() {
    let refusing = FakeTelegram::start(CANARY_TOKEN).await;
    refusing.set_mode(FakeMode::Unauthorized);
    let poll_api = FakeTelegram::start(CANARY_TOKEN).await;
    let dir = tempfile::tempdir().expect("temporary directory");
    let ledger = dir.path().join("ledger.db");
    let path = write_config(
        dir.path(),
        "canary.toml",
        &canary_config(&ledger, &refusing.base_url(), &poll_api.base_url(), false),
    );
    let mut logs = Vec::new();

    let mut command = opledger(CANARY_ENV);
    command.arg("--config").arg(&path);
    let mut serving = Serving::start(command);
    let address = serving.address().await;
    drive(address, &poll_api).await;
    let status = serving.terminate().await;
    assert_eq!(status.code(), Some(0), "stderr: {}", serving.stderr());
    logs.push(("serve stdout".to_owned(), serving.stdout()));
    logs.push(("serve stderr".to_owned(), serving.stderr()));
    assert!(
        serving.stderr().contains("TRACE") && serving.stderr().contains("DEBUG"),
        "the logs were on at trace level, so their silence means something"
    );
    assert!(
        serving
            .stderr()
            .contains("update id reused with a different body"),
        "the collision was logged"
    );
    assert!(
        serving.stderr().contains("quarantined a body"),
        "the quarantine was logged"
    );

    // The webhook commands, with Telegram refusing the token and with nothing listening.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        listener.local_addr().expect("its address")
    };
    let unreachable = write_config(
        dir.path(),
        "unreachable.toml",
        &canary_config(
            &ledger,
            &format!("http://{closed}"),
            &poll_api.base_url(),
            false,
        ),
    );
    let webhook_commands: Vec<(&str, &Path, Vec<&str>, &str)> = vec![
        (
            "webhook info, token refused",
            &path,
            vec!["webhook", "info", "--bot", "shop"],
            "telegram refused the bot token for getWebhookInfo",
        ),
        (
            "webhook set, token refused",
            &path,
            vec![
                "webhook",
                "set",
                "--bot",
                "shop",
                "--url",
                "https://example.test/telegram/shop/webhook",
            ],
            "telegram refused the bot token for setWebhook",
        ),
        (
            "webhook info, nothing listening",
            &unreachable,
            vec!["webhook", "info", "--bot", "shop"],
            "could not connect to the bot api for getWebhookInfo",
        ),
    ];
    for (case, config, args, error) in webhook_commands {
        let mut command = opledger(CANARY_ENV);
        command.arg("--config").arg(config).args(&args);
        let output = run(command).await;
        assert!(!output.status.success(), "{case} fails");
        let err = stderr(&output);
        // Trace logs surround it; the error itself is one line of its own.
        let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
        assert!(
            errors.len() == 1 && errors[0].contains(error),
            "{case}: one error line that says what happened: {errors:?}"
        );
        logs.push((format!("{case}: stdout"), stdout(&output)));
        logs.push((format!("{case}: stderr"), err));
    }
    assert!(
        refusing.calls("getWebhookInfo").len() == 1 && refusing.calls("setWebhook").len() == 1,
        "the refusing Bot API was called with the right token"
    );
    for (place, output) in &logs {
        assert_clean(place, output, true);
    }

    let (events, text) = ledger_events(&ledger).await;
    assert_clean("the ledger", &text, true);
    let types: Vec<&str> = events
        .iter()
        .filter_map(|e| e["event_type"].as_str())
        .collect();
    for expected in [
        "UpdateReceived",
        "Received",
        "DuplicateDeliveryObserved",
        "UpdateIdCollision",
        "BodyQuarantined",
    ] {
        assert!(types.contains(&expected), "{expected} in {types:?}");
    }
    assert!(
        !types.contains(&"RawUpdateStored"),
        "not kept unless asked for"
    );
    let streams: Vec<&str> = events
        .iter()
        .filter_map(|e| e["stream_id"].as_str())
        .collect();
    assert!(streams.contains(&"update-poller-900"), "{streams:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kept_raw_updates_hold_the_text_in_the_ledger_and_never_in_the_logs() {
    let api = FakeTelegram::start(CANARY_TOKEN).await;
    let poll_api = FakeTelegram::start(CANARY_TOKEN).await;
    let dir = tempfile::tempdir().expect("temporary directory");
    let ledger = dir.path().join("ledger.db");
    let path = write_config(
        dir.path(),
        "raw.toml",
        &canary_config(&ledger, &api.base_url(), &poll_api.base_url(), true),
    );
    let mut command = opledger(CANARY_ENV);
    command.arg("--config").arg(&path);
    let mut serving = Serving::start(command);
    let address = serving.address().await;
    drive(address, &poll_api).await;
    let status = serving.terminate().await;
    assert_eq!(status.code(), Some(0), "stderr: {}", serving.stderr());
    assert_clean("serve stdout", &serving.stdout(), true);
    assert_clean("serve stderr", &serving.stderr(), true);

    let (events, text) = ledger_events(&ledger).await;
    assert_clean("the ledger", &text, false);
    let raw: Vec<(&str, &str)> = events
        .iter()
        .filter(|e| e["event_type"] == "RawUpdateStored")
        .map(|e| {
            (
                e["stream_id"].as_str().expect("a stream"),
                e["payload"]["body"].as_str().expect("a body"),
            )
        })
        .collect();
    let with_text: Vec<&str> = raw
        .iter()
        .filter(|(_, body)| body.contains(PRIVATE_TEXT))
        .map(|(stream, _)| *stream)
        .collect();
    assert_eq!(
        with_text,
        ["update-shop-2", "update-shop-3", "update-poller-900"],
        "the text is kept with its first receipt, from the webhook and from polling"
    );
    // Only first receipts keep a body: not duplicates, collisions, quarantines or refusals.
    assert_eq!(raw.len(), 6, "{raw:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_set_and_info_talk_to_the_configured_bot_api() {
    let api = FakeTelegram::start(TOKEN).await;
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = write_config(
        dir.path(),
        "opledger.toml",
        &format!(
            "[[bots]]\nname = \"shop\"\ntoken_env = \"SHOP_TOKEN\"\n\
             webhook_secret_env = \"SHOP_SECRET\"\napi_base_url = \"{}/\"\n\
             max_connections = 17\n{COUPON}",
            api.base_url()
        ),
    );
    let env = [("SHOP_TOKEN", TOKEN), ("SHOP_SECRET", SECRET)];
    let url = "https://example.test/telegram/shop/webhook";

    let mut command = opledger(&env);
    command
        .arg("--config")
        .arg(&path)
        .args(["webhook", "set", "--bot", "shop", "--url", url]);
    let set = run(command).await;
    assert!(set.status.success(), "{}", stderr(&set));
    assert_eq!(
        api.webhook(),
        Some(FakeWebhook {
            url: url.to_owned(),
            secret_token: Some(SECRET.to_owned()),
            allowed_updates: Some(vec!["message".to_owned(), "callback_query".to_owned()]),
            max_connections: Some(17),
        })
    );
    let calls = api.calls("setWebhook");
    assert_eq!(calls.len(), 1);
    assert!(
        calls[0].get("drop_pending_updates").is_none(),
        "pending updates are users' actions: kept unless asked: {}",
        calls[0]
    );
    let out = stdout(&set);
    assert!(out.contains(url) && out.contains("SHOP_SECRET"), "{out}");
    assert!(out.contains("message, callback_query"), "{out}");

    api.push_update(message(1, 1_790_000_000, "waiting"));
    api.push_update(message(2, 1_790_000_001, "waiting too"));
    let mut command = opledger(&env);
    command
        .arg("--config")
        .arg(&path)
        .args(["webhook", "info", "--bot", "shop"]);
    let info = run(command).await;
    assert!(info.status.success(), "{}", stderr(&info));
    let out = stdout(&info);
    assert!(out.lines().any(|l| l == format!("url: {url}")), "{out}");
    assert!(out.lines().any(|l| l == "pending_update_count: 2"), "{out}");
    assert!(out.lines().any(|l| l == "last_error: none"), "{out}");
    assert!(out.lines().any(|l| l == "max_connections: 17"), "{out}");
    assert!(
        out.lines()
            .any(|l| l == "allowed_updates: message, callback_query"),
        "{out}"
    );

    for output in [&set, &info] {
        for secret in [TOKEN, SECRET] {
            assert!(!stdout(output).contains(secret), "{}", stdout(output));
            assert!(!stderr(output).contains(secret), "{}", stderr(output));
        }
    }
    assert_eq!(api.unauthorized_calls(), 0, "every call carried the token");

    // A bot that is not configured is named in a clear error.
    let mut command = opledger(&env);
    command
        .arg("--config")
        .arg(&path)
        .args(["webhook", "info", "--bot", "other"]);
    let unknown = run(command).await;
    assert_one_line_error(&unknown, None, &["no bot named `other`", "shop"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ops_lists_operations_by_state() {
    let ledger = Ledger::create(Backend::Sqlite).await.expect("SQLite");
    let app = TestApp::spawn(&ledger, &config(COUPON)).await;
    for (id, user, text) in [(1, 42, "/coupon spring"), (2, 42, "hello")] {
        let body = crate::support::app::message_from(id, 1_790_000_000 + id, user, text);
        assert_eq!(app.deliver(body).await.status(), StatusCode::OK);
    }
    let received = app
        .events()
        .await
        .into_iter()
        .find(|e| e.event_type == "Received")
        .expect("an operation");
    let received: Value = serde_json::from_slice(&received.payload).expect("JSON");
    app.stop().await;

    let ops = |args: &[&str]| {
        let mut command = opledger(&[]);
        command
            .arg("--database-url")
            .arg(ledger.url())
            .arg("ops")
            .args(args);
        run(command)
    };
    let listed = ops(&["--state", "received", "--json"]).await;
    assert!(listed.status.success(), "{}", stderr(&listed));
    let rows: Vec<Value> = stdout(&listed)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(rows.len(), 1, "{}", stdout(&listed));
    let row = &rows[0];
    assert_eq!(row["operation_id"], received["operation_id"]);
    assert_eq!(row["stream_id"], "op-coupon-spring:42");
    assert_eq!(row["action"], "coupon");
    assert_eq!(row["business_key"], "spring:42");
    assert_eq!(row["bot"], "shop");
    assert_eq!(row["user_id"], 42);
    assert_eq!(row["status"], "received");
    assert_eq!(row["attempts"], 0);

    let table = ops(&["--state", "received"]).await;
    let table = stdout(&table);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 2, "a header and one row: {table}");
    assert!(
        lines[0].contains("STATE") && lines[0].contains("OPERATION"),
        "{table}"
    );
    assert!(
        lines[1].contains("received") && lines[1].contains("coupon spring:42"),
        "{table}"
    );

    let none = ops(&["--state", "confirmed", "--json"]).await;
    assert!(none.status.success(), "{}", stderr(&none));
    assert_eq!(stdout(&none), "", "nothing confirmed yet");

    // A state that does not exist is a usage error: exit code 2, naming the valid ones.
    let bogus = ops(&["--state", "bogus"]).await;
    let err = stderr(&bogus);
    assert_eq!(bogus.status.code(), Some(2), "{err}");
    assert!(err.starts_with("error: invalid value 'bogus'"), "{err}");
    for state in ["received", "needs_reconciliation", "confirmed"] {
        assert!(err.contains(state), "{err}");
    }
    assert_eq!(stdout(&bogus), "");
}
