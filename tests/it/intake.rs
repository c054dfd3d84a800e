//! The webhook's answer table and intake's dedup guarantees, driven over HTTP like Telegram
//! drives them, on both backends (DESIGN §2 guarantees 1-3 and 7, §6, §11 scenarios 1-3, 6, 7).

use std::time::Duration;

use chrono::TimeDelta;
use futures_util::future::join_all;
use opledger_store::EventStore;
use reqwest::StatusCode;
use sqlx::{Connection, Executor};

use crate::support::app::{
    Backend, COUPON, Ledger, TestApp, config, message, message_from, on_both_backends,
};

on_both_backends!(
    a_missing_or_wrong_secret_is_refused_and_nothing_is_stored,
    an_oversized_body_is_refused_and_nothing_is_stored,
    a_body_that_is_not_an_update_is_quarantined_by_digest_and_size,
    an_unknown_kind_is_recorded_and_acknowledged,
    a_new_update_is_committed_before_the_answer,
    the_same_update_twice_records_one_delivery_and_one_operation,
    the_same_update_32_times_at_once_records_one_delivery_and_one_operation,
    two_updates_with_one_business_key_at_once_make_one_operation,
    the_same_key_with_other_parameters_is_a_recorded_conflict,
    another_body_under_a_recent_id_is_a_collision_and_starts_nothing,
    an_id_seen_before_the_retention_window_opens_a_new_epoch,
    dedup_decisions_survive_a_restart,
    an_old_update_after_a_newer_one_does_not_reopen_the_past,
    help_and_status_are_pure,
    a_malformed_command_gets_usage_and_starts_nothing,
);

async fn setup(backend: Backend, extra: &str) -> Option<(Ledger, TestApp)> {
    let ledger = Ledger::create(backend).await?;
    let app = TestApp::spawn(&ledger, &config(extra)).await;
    Some((ledger, app))
}

async fn a_missing_or_wrong_secret_is_refused_and_nothing_is_stored(backend: Backend) {
    let Some((_ledger, app)) = setup(backend, COUPON).await else {
        return;
    };
    let body = message(1, 1_790_000_000, "/coupon spring");
    for secret in [
        None,
        Some("wrong"),
        Some(""),
        Some("test-webhook-secret_012345678"),
    ] {
        let response = app.deliver_with_secret(secret, body.clone()).await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{secret:?}");
    }
    assert!(app.events().await.is_empty(), "nothing was stored");
    // A bot that is not configured does not exist.
    let response = app
        .http
        .post(app.webhook_url("other"))
        .header(
            "x-telegram-bot-api-secret-token",
            crate::support::app::SECRET,
        )
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    app.stop().await;
}

async fn an_oversized_body_is_refused_and_nothing_is_stored(backend: Backend) {
    let Some((_ledger, app)) = setup(backend, "").await else {
        return;
    };
    // The limit is 1 MiB by default.
    let padding = "x".repeat(1_100_000);
    let body = message(1, 1_790_000_000, &padding);
    let response = app.deliver(body).await;
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(app.events().await.is_empty());
    app.stop().await;
}

async fn a_body_that_is_not_an_update_is_quarantined_by_digest_and_size(backend: Backend) {
    let Some((_ledger, app)) = setup(backend, "").await else {
        return;
    };
    for body in [
        b"this is not json, secret text".to_vec(),
        br#"{"message": {"text": "no update id, secret text"}}"#.to_vec(),
        br#"{"update_id": "7", "text": "secret text"}"#.to_vec(),
    ] {
        let response = app.deliver(body).await;
        assert_eq!(response.status(), StatusCode::OK);
    }
    let events = app.events().await;
    assert_eq!(events.len(), 3);
    for event in &events {
        assert_eq!(event.event_type, "BodyQuarantined");
        assert_eq!(event.stream_id.as_str(), "quarantine-shop");
        let text = String::from_utf8(event.payload.clone()).unwrap();
        assert!(
            !text.contains("secret text"),
            "the body itself is never stored: {text}"
        );
        let payload: serde_json::Value = serde_json::from_slice(&event.payload).unwrap();
        assert_eq!(payload["digest"].as_str().unwrap().len(), 64);
        assert!(payload["size"].as_u64().unwrap() > 0);
    }
    let reasons: Vec<String> = events
        .iter()
        .map(|e| {
            serde_json::from_slice::<serde_json::Value>(&e.payload).unwrap()["reason"].to_string()
        })
        .collect();
    assert_eq!(
        reasons,
        ["\"not_json\"", "\"no_update_id\"", "\"no_update_id\""]
    );
    app.stop().await;
}

async fn an_unknown_kind_is_recorded_and_acknowledged(backend: Backend) {
    let Some((_ledger, app)) = setup(backend, "").await else {
        return;
    };
    let body = br#"{"update_id": 9007199254740991, "brand_new_kind": {"id": 5}}"#;
    let response = app.deliver(body.to_vec()).await;
    assert_eq!(response.status(), StatusCode::OK);
    let events = app.events().await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].stream_id.as_str(), "update-shop-9007199254740991");
    let payload: serde_json::Value = serde_json::from_slice(&events[0].payload).unwrap();
    assert_eq!(payload["kind"], "other:brand_new_kind");
    assert_eq!(payload["update_id"].as_i64(), Some(9_007_199_254_740_991));
    app.stop().await;
}

async fn a_new_update_is_committed_before_the_answer(backend: Backend) {
    let Some((_ledger, app)) = setup(backend, COUPON).await else {
        return;
    };
    let response = app
        .deliver(message(10, 1_790_000_000, "/coupon spring"))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    // The answer came: the events are already there, read through another path.
    let events = app.events().await;
    let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(types, ["UpdateReceived", "Received"]);
    let delivery: serde_json::Value = serde_json::from_slice(&events[0].payload).unwrap();
    assert_eq!(delivery["operation"]["joined"], false);
    assert_eq!(delivery["operation"]["stream"], "op-coupon-spring:42");
    // Both in one commit.
    assert_eq!(events[0].recorded_at, events[1].recorded_at);
    app.stop().await;
}

async fn the_same_update_twice_records_one_delivery_and_one_operation(backend: Backend) {
    let Some((_ledger, app)) = setup(backend, COUPON).await else {
        return;
    };
    let body = message(11, 1_790_000_000, "/coupon spring");
    for _ in 0..2 {
        assert_eq!(app.deliver(body.clone()).await.status(), StatusCode::OK);
    }
    assert_eq!(app.count("UpdateReceived").await, 1);
    assert_eq!(app.count("Received").await, 1);
    assert_eq!(app.count("DuplicateDeliveryObserved").await, 1);
    app.stop().await;
}

async fn the_same_update_32_times_at_once_records_one_delivery_and_one_operation(backend: Backend) {
    let Some((_ledger, app)) = setup(backend, COUPON).await else {
        return;
    };
    let body = message(12, 1_790_000_000, "/coupon spring");
    let answers = join_all((0..32).map(|_| app.deliver(body.clone()))).await;
    for answer in answers {
        assert_eq!(answer.status(), StatusCode::OK);
    }
    assert_eq!(app.count("UpdateReceived").await, 1);
    assert_eq!(app.count("Received").await, 1);
    assert_eq!(app.count("DuplicateDeliveryObserved").await, 31);
    app.stop().await;
}

async fn two_updates_with_one_business_key_at_once_make_one_operation(backend: Backend) {
    let Some((_ledger, app)) = setup(backend, COUPON).await else {
        return;
    };
    // Sixteen different updates (a user pressing send again and again) asking for one coupon.
    let answers = join_all(
        (0..16).map(|i| app.deliver(message(100 + i, 1_790_000_000 + i, "/coupon spring"))),
    )
    .await;
    for answer in answers {
        assert_eq!(answer.status(), StatusCode::OK);
    }
    assert_eq!(
        app.count("UpdateReceived").await,
        16,
        "every update is recorded"
    );
    assert_eq!(app.count("Received").await, 1, "one operation");
    let joined = app
        .events()
        .await
        .iter()
        .filter(|e| e.event_type == "UpdateReceived")
        .filter(|e| {
            serde_json::from_slice::<serde_json::Value>(&e.payload).unwrap()["operation"]["joined"]
                == true
        })
        .count();
    assert_eq!(joined, 15, "the others joined it");
    app.stop().await;
}

async fn the_same_key_with_other_parameters_is_a_recorded_conflict(backend: Backend) {
    // One coupon per user, whatever the campaign: the campaign is a parameter, not the key.
    let action = COUPON.replace("{campaign}:{user_id}", "{user_id}");
    let Some((_ledger, app)) = setup(backend, &action).await else {
        return;
    };
    assert_eq!(
        app.deliver(message(20, 1_790_000_000, "/coupon spring"))
            .await
            .status(),
        200
    );
    let second = app
        .deliver(message(21, 1_790_000_005, "/coupon autumn"))
        .await;
    assert_eq!(second.status(), 200);
    let answer: serde_json::Value = second.json().await.unwrap();
    assert!(
        answer["text"]
            .as_str()
            .unwrap()
            .contains("first one stands"),
        "{answer}"
    );
    assert_eq!(app.count("Received").await, 1);
    assert_eq!(app.count("KeyConflictRecorded").await, 1);
    let events = app.events().await;
    let delivery = events
        .iter()
        .find(|e| e.stream_id.as_str() == "update-shop-21")
        .unwrap();
    let delivery: serde_json::Value = serde_json::from_slice(&delivery.payload).unwrap();
    assert!(
        delivery["operation"].is_null(),
        "a conflicting request joins nothing"
    );
    app.stop().await;
}

async fn another_body_under_a_recent_id_is_a_collision_and_starts_nothing(backend: Backend) {
    let Some((_ledger, app)) = setup(backend, COUPON).await else {
        return;
    };
    assert_eq!(
        app.deliver(message(30, 1_790_000_000, "hello"))
            .await
            .status(),
        200
    );
    app.clock.advance(TimeDelta::hours(71));
    let other = message(30, 1_790_000_100, "/coupon spring");
    assert_eq!(app.deliver(other).await.status(), 200);
    assert_eq!(app.count("UpdateIdCollision").await, 1);
    assert_eq!(
        app.count("Received").await,
        0,
        "a collision is not processed"
    );
    app.stop().await;
}

async fn an_id_seen_before_the_retention_window_opens_a_new_epoch(backend: Backend) {
    let Some((_ledger, app)) = setup(backend, COUPON).await else {
        return;
    };
    assert_eq!(
        app.deliver(message(40, 1_790_000_000, "hello"))
            .await
            .status(),
        200
    );
    // Telegram restarts ids after a week of silence: past the window, the id is a new update.
    app.clock.advance(TimeDelta::hours(73));
    let reused = message(40, 1_790_300_000, "/coupon spring");
    assert_eq!(app.deliver(reused.clone()).await.status(), 200);
    let received: Vec<serde_json::Value> = app
        .events()
        .await
        .iter()
        .filter(|e| e.event_type == "UpdateReceived")
        .map(|e| serde_json::from_slice(&e.payload).unwrap())
        .collect();
    let epochs: Vec<i64> = received
        .iter()
        .map(|r| r["epoch"].as_i64().unwrap())
        .collect();
    assert_eq!(epochs, [1, 2]);
    assert_eq!(app.count("Received").await, 1, "the new epoch is processed");
    // And within the new epoch, a repeat is a duplicate again.
    assert_eq!(app.deliver(reused).await.status(), 200);
    assert_eq!(app.count("DuplicateDeliveryObserved").await, 1);
    app.stop().await;
}

async fn dedup_decisions_survive_a_restart(backend: Backend) {
    let Some(ledger) = Ledger::create(backend).await else {
        return;
    };
    let config = config(COUPON);
    let body = message(50, 1_790_000_000, "/coupon spring");
    let app = TestApp::spawn(&ledger, &config).await;
    assert_eq!(app.deliver(body.clone()).await.status(), 200);
    let clock = app.clock.clone();
    app.stop().await;

    let app = TestApp::spawn_with_clock(&ledger, &config, clock).await;
    assert_eq!(app.deliver(body).await.status(), 200);
    assert_eq!(
        app.deliver(message(51, 1_790_000_001, "/coupon spring"))
            .await
            .status(),
        200
    );
    assert_eq!(app.count("UpdateReceived").await, 2);
    assert_eq!(app.count("DuplicateDeliveryObserved").await, 1);
    assert_eq!(
        app.count("Received").await,
        1,
        "the restarted service joined the operation"
    );
    app.stop().await;
}

async fn an_old_update_after_a_newer_one_does_not_reopen_the_past(backend: Backend) {
    // With a repeat window, a request after the window is a new operation; an old update
    // (dated inside an earlier window) arriving late must not open yet another one.
    let action = COUPON.replace(
        "key = \"{campaign}:{user_id}\"\n",
        "key = \"{campaign}:{user_id}\"\nrepeat_window_secs = 30\n",
    );
    let Some((_ledger, app)) = setup(backend, &action).await else {
        return;
    };
    let t = 1_790_000_000;
    assert_eq!(
        app.deliver(message(60, t, "/coupon spring")).await.status(),
        200
    );
    assert_eq!(
        app.deliver(message(61, t + 20, "/coupon spring"))
            .await
            .status(),
        200
    );
    assert_eq!(
        app.count("Received").await,
        1,
        "a repeat inside the window joins"
    );
    assert_eq!(
        app.deliver(message(62, t + 100, "/coupon spring"))
            .await
            .status(),
        200
    );
    assert_eq!(
        app.count("Received").await,
        2,
        "after the window, a new operation"
    );
    // Delivered late: an update written at t + 5, long before the newest.
    assert_eq!(
        app.deliver(message(59, t + 5, "/coupon spring"))
            .await
            .status(),
        200
    );
    assert_eq!(
        app.count("Received").await,
        2,
        "the late update joins the current operation"
    );
    let streams: Vec<String> = app
        .events()
        .await
        .iter()
        .filter(|e| e.event_type == "Received")
        .map(|e| e.stream_id.to_string())
        .collect();
    assert_eq!(streams, ["op-coupon-spring:42#1", "op-coupon-spring:42#2"]);
    app.stop().await;
}

async fn help_and_status_are_pure(backend: Backend) {
    let Some((_ledger, app)) = setup(backend, COUPON).await else {
        return;
    };
    assert_eq!(
        app.deliver(message(70, 1_790_000_000, "/coupon spring"))
            .await
            .status(),
        200
    );
    let mut answers = Vec::new();
    for (i, text) in ["/help", "/help", "/status", "/status"].iter().enumerate() {
        let response = app
            .deliver(message(71 + i as i64, 1_790_000_010, text))
            .await;
        assert_eq!(response.status(), 200);
        let answer: serde_json::Value = response.json().await.unwrap();
        assert_eq!(answer["method"], "sendMessage");
        assert_eq!(answer["chat_id"], 42);
        answers.push(answer["text"].as_str().unwrap().to_owned());
    }
    assert_eq!(answers[0], answers[1], "the same answer every time");
    assert_eq!(answers[2], answers[3]);
    assert!(answers[0].contains("/coupon <campaign>"), "{}", answers[0]);
    assert!(answers[2].contains("coupon spring"), "{}", answers[2]);
    assert_eq!(
        app.count("Received").await,
        1,
        "no operation from /help or /status"
    );
    // /status <id> shows one of the user's own operations, and nobody else's.
    let operation_id = answers[2]
        .rsplit('(')
        .next()
        .unwrap()
        .trim_end_matches(')')
        .to_owned();
    let own = app
        .deliver(message(
            80,
            1_790_000_020,
            &format!("/status {operation_id}"),
        ))
        .await;
    let own: serde_json::Value = own.json().await.unwrap();
    assert!(
        own["text"]
            .as_str()
            .unwrap()
            .contains("received, waiting to start"),
        "{own}"
    );
    let other = app
        .deliver(message_from(
            81,
            1_790_000_020,
            7,
            &format!("/status {operation_id}"),
        ))
        .await;
    let other: serde_json::Value = other.json().await.unwrap();
    assert_eq!(other["text"], "No request with that id.");
    app.stop().await;
}

async fn a_malformed_command_gets_usage_and_starts_nothing(backend: Backend) {
    let Some((_ledger, app)) = setup(backend, COUPON).await else {
        return;
    };
    let response = app.deliver(message(90, 1_790_000_000, "/coupon")).await;
    assert_eq!(response.status(), 200);
    let answer: serde_json::Value = response.json().await.unwrap();
    assert_eq!(answer["text"], "Usage: /coupon <campaign>");
    assert_eq!(
        app.count("UpdateReceived").await,
        1,
        "the update is recorded"
    );
    assert_eq!(app.count("Received").await, 0);
    app.stop().await;
}

/// While the ledger cannot be written, updates are answered 503 (Telegram retries) and nothing
/// is half written; once it can, the same update is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_locked_sqlite_ledger_answers_503_then_recovers() {
    let ledger = Ledger::create(Backend::Sqlite).await.unwrap();
    let app = TestApp::spawn(&ledger, &config(COUPON)).await;
    // Another process holds the write lock longer than the request may take.
    let mut blocker = ledger.hold_sqlite_write_lock().await;
    let body = message(95, 1_790_000_000, "/coupon spring");
    let response = app.deliver(body.clone()).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    blocker.execute("ROLLBACK").await.unwrap();
    blocker.close().await.unwrap();
    assert_eq!(app.count("UpdateReceived").await, 0, "nothing half written");
    let response = app.deliver(body).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(app.count("UpdateReceived").await, 1);
    assert_eq!(app.count("Received").await, 1);
    app.stop().await;
}

/// Shutting down lets the append in flight finish and be answered, and gives no 2xx to what
/// comes after.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_finishes_in_flight_appends_and_acknowledges_nothing_new() {
    let ledger = Ledger::create(Backend::Sqlite).await.unwrap();
    let app = TestApp::spawn(&ledger, &config(COUPON)).await;
    // Hold the write lock so that the first update is still being appended at shutdown.
    let mut blocker = ledger.hold_sqlite_write_lock().await;
    let url = app.webhook_url("shop");
    let in_flight = tokio::spawn(
        reqwest::Client::new()
            .post(url.clone())
            .header(
                "x-telegram-bot-api-secret-token",
                crate::support::app::SECRET,
            )
            .body(message(1, 1_790_000_000, "/coupon spring"))
            .send(),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopping = tokio::spawn(app.stop());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let late = reqwest::Client::new()
        .post(&url)
        .header(
            "x-telegram-bot-api-secret-token",
            crate::support::app::SECRET,
        )
        .body(message(2, 1_790_000_000, "hello"))
        .send()
        .await;
    match late {
        Ok(response) => assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE),
        // The listener is closed: a refusal too, never a 2xx.
        Err(error) => assert!(error.is_connect(), "{error}"),
    }
    blocker.execute("ROLLBACK").await.unwrap();
    blocker.close().await.unwrap();
    let answered = in_flight.await.unwrap().unwrap();
    assert_eq!(
        answered.status(),
        StatusCode::OK,
        "the in-flight update was finished"
    );
    stopping.await.unwrap();
    // The service closed its store; reopen the ledger to see what was committed.
    let reopened = ledger.open().await;
    let streams: Vec<String> = reopened
        .read_all(1, 100)
        .await
        .unwrap()
        .iter()
        .map(|e| e.stream_id.to_string())
        .collect();
    assert_eq!(streams, ["update-shop-1", "op-coupon-spring:42"]);
    reopened.close().await;
}
