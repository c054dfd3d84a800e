//! A secret echoed back from outside (issue 15, D6), through the real binary on both backends:
//! a Bot API (or a proxy in front of it) that answers 404 with the request's path in its
//! description quotes the bot token. Before ADR 0011 that description reached the append-only
//! ledger (`ReplyFailed.reason`), the log and the output of `webhook info` and `webhook set`. Now
//! every text received from outside passes `Redactor`, which knows the configured secrets, before
//! it is kept anywhere.

use std::path::Path;
use std::time::{Duration, Instant};

use opledger_store::EventStore;
use reqwest::StatusCode;
use serde_json::Value;

use crate::support::app::{Backend, Ledger, message_from, on_both_backends};
use crate::support::fake_service::FakeService;
use crate::support::fake_telegram::{FakeMode, FakeTelegram};
use crate::support::serving::{PATIENCE, Serving, opledger, run, write_coupon_config};
use crate::support::{stderr, stdout};

/// A bot token the fake Bot API echoes in its errors.
const CANARY_TOKEN: &str = "987654:ECHOED-canary-token_x";
/// The webhook secret, which must not appear either.
const CANARY_SECRET: &str = "ECHOEDcanarySecret9";

on_both_backends!(a_secret_echoed_by_the_bot_api_reaches_no_event_log_or_output);

/// Asserts that neither canary is in `text`, naming where it was found.
fn assert_clean(place: &str, text: &str) {
    for canary in [
        CANARY_TOKEN,
        CANARY_SECRET,
        "ECHOED-canary",
        "ECHOED%3Acanary",
    ] {
        assert!(
            !text.contains(canary),
            "{place} contains `{canary}`:\n{text}"
        );
    }
}

async fn a_secret_echoed_by_the_bot_api_reaches_no_event_log_or_output(backend: Backend) {
    let started = Instant::now();
    let Some(ledger) = Ledger::create(backend).await else {
        return;
    };
    let service = FakeService::start(false).await;
    let telegram = FakeTelegram::start(CANARY_TOKEN).await;
    telegram.set_mode(FakeMode::NotFoundEchoingPath);
    let dir = tempfile::tempdir().expect("a directory");
    let config = write_coupon_config(dir.path(), &ledger, &telegram, &service, "");
    let env = [
        ("OPLEDGER_CONFIG", config.as_str()),
        ("SHOP_TOKEN", CANARY_TOKEN),
        ("SHOP_SECRET", CANARY_SECRET),
        ("OPLEDGER_LOG", "trace"),
        ("OPLEDGER_TEST_WORKER_MS", "50"),
    ];

    // The service: a coupon is created, and its reply is refused with the token echoed.
    let mut serving = Serving::start(opledger(&env));
    let address = serving.address().await;
    let answer = reqwest::Client::new()
        .post(format!("http://{address}/telegram/shop/webhook"))
        .header("content-type", "application/json")
        .header("x-telegram-bot-api-secret-token", CANARY_SECRET)
        .body(message_from(1, 1_790_000_000, 7, "/coupon spring"))
        .send()
        .await
        .expect("the webhook answers");
    assert_eq!(answer.status(), StatusCode::OK);
    let store = ledger.open().await;
    let deadline = Instant::now() + PATIENCE;
    let reason = loop {
        let events = store.read_all(1, 10_000).await.expect("read the ledger");
        if let Some(failed) = events.iter().find(|e| e.event_type == "ReplyFailed") {
            let payload: Value = serde_json::from_slice(&failed.payload).expect("JSON");
            break payload["reason"].as_str().expect("a reason").to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no ReplyFailed; stderr: {}",
            serving.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        telegram.calls("sendMessage").len() == 1,
        "the reply was tried once"
    );
    assert!(
        reason.contains("error 404") && reason.contains("/bot[redacted]/sendMessage"),
        "Telegram's description is kept, without the token: {reason}"
    );
    let mut ledger_text = String::new();
    for event in store.read_all(1, 10_000).await.expect("read the ledger") {
        ledger_text.push_str(&String::from_utf8_lossy(&event.payload));
        ledger_text.push_str(&String::from_utf8_lossy(&event.metadata));
        ledger_text.push('\n');
    }
    assert_clean("the ledger", &ledger_text);
    store.close().await;
    let status = serving.terminate().await;
    assert_eq!(status.code(), Some(0), "stderr: {}", serving.stderr());
    assert!(
        serving.stderr().contains("bot api call failed"),
        "the refusal was logged, so the log's silence means something"
    );
    assert_clean("serve stdout", &serving.stdout());
    assert_clean("serve stderr", &serving.stderr());

    // The webhook commands print Telegram's refusal, without the token.
    let url = "https://example.test/telegram/shop/webhook";
    for (method, args) in [
        ("getWebhookInfo", vec!["webhook", "info", "--bot", "shop"]),
        (
            "setWebhook",
            vec!["webhook", "set", "--bot", "shop", "--url", url],
        ),
    ] {
        let output = webhook(&env, dir.path(), &args).await;
        assert!(!output.status.success(), "{method} fails");
        let err = stderr(&output);
        let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
        assert!(
            errors.len() == 1
                && errors[0].contains(&format!("/bot[redacted]/{method}"))
                && errors[0].contains("error 404"),
            "{method}: one error line with Telegram's description: {errors:?}"
        );
        assert_clean(&format!("{method}: stdout"), &stdout(&output));
        assert_clean(&format!("{method}: stderr"), &err);
    }
    assert_eq!(telegram.calls("getWebhookInfo").len(), 1);
    assert_eq!(telegram.calls("setWebhook").len(), 1);
    eprintln!("{backend:?}: {:?}", started.elapsed());
}

/// `opledger webhook …` with the service's environment.
async fn webhook(env: &[(&str, &str)], dir: &Path, args: &[&str]) -> std::process::Output {
    let mut command = opledger(env);
    command.current_dir(dir).args(args);
    run(command).await
}
