//! One-time button tokens (issue 4 §5): a token issued for one user starts its action on that
//! user's first click before it expires, once; a second click, another user's click, a click after
//! expiry and a forged token are recorded as refusals and start nothing. Driven over HTTP like
//! Telegram drives it, on both backends.

use std::collections::BTreeMap;

use chrono::TimeDelta;
use futures_util::future::join_all;
use opledger_server::Clock;
use opledger_store::RecordedEvent;
use reqwest::StatusCode;
use serde_json::Value;

use crate::support::app::{Backend, COUPON, Ledger, TestApp, click, config, on_both_backends};

on_both_backends!(
    a_click_starts_the_token_s_action_once,
    another_user_s_click_is_refused_and_leaves_the_token_to_its_user,
    a_click_after_the_expiry_is_refused,
    callback_data_that_is_not_a_token_only_records_the_delivery,
    a_forged_token_is_refused_as_not_issued,
    the_same_click_delivered_again_consumes_the_token_once,
    a_double_click_at_once_starts_one_operation,
);

/// The user the tokens are issued for.
const OWNER: i64 = 42;
/// The operation a coupon token for the spring campaign starts for [`OWNER`].
const OPERATION_STREAM: &str = "op-coupon-spring:42";
/// What the bot answers to a refused click.
const REFUSED: &str = "This button can no longer be used.";

async fn setup(backend: Backend) -> Option<(Ledger, TestApp)> {
    let ledger = Ledger::create(backend).await?;
    let app = TestApp::spawn(&ledger, &config(COUPON)).await;
    Some((ledger, app))
}

/// Issues a coupon token for the spring campaign to `user`, valid for ten minutes.
async fn issue(app: &TestApp, user: i64) -> String {
    let payload = BTreeMap::from([("campaign".to_owned(), "spring".to_owned())]);
    let expires_at = app.clock.now() + TimeDelta::minutes(10);
    let token = app
        .intake()
        .issue_token("coupon", user, Some(user), payload, expires_at)
        .await
        .expect("issue a token");
    assert!(token.len() <= 64, "a token fits in callback_data: {token}");
    token
}

fn payload(event: &RecordedEvent) -> Value {
    serde_json::from_slice(&event.payload).expect("payloads are JSON")
}

/// The events of one stream, as (type, payload).
async fn stream(app: &TestApp, id: &str) -> Vec<(String, Value)> {
    app.events()
        .await
        .iter()
        .filter(|e| e.stream_id.as_str() == id)
        .map(|e| (e.event_type.clone(), payload(e)))
        .collect()
}

/// Delivers a click and returns the notice the bot answers it with, if any. Every click is
/// answered at once with `answerCallbackQuery` for the click's query id, so that the button
/// stops spinning.
async fn press(app: &TestApp, update_id: i64, user: i64, data: &str) -> Option<String> {
    let response = app.deliver(click(update_id, user, data)).await;
    assert_eq!(response.status(), StatusCode::OK, "a click is acknowledged");
    let body = response.bytes().await.expect("the answer's body");
    let answer: Value = serde_json::from_slice(&body).expect("a JSON answer");
    assert_eq!(answer["method"], "answerCallbackQuery");
    assert_eq!(answer["callback_query_id"], format!("cb{update_id}"));
    answer
        .get("text")
        .map(|text| text.as_str().expect("a text").to_owned())
}

fn rejected(reason: &str, user: i64, update_id: i64) -> (String, Value) {
    (
        "TokenRejected".to_owned(),
        serde_json::json!({ "reason": reason, "user_id": user, "update_id": update_id }),
    )
}

fn consumed(user: i64, update_id: i64) -> (String, Value) {
    (
        "TokenConsumed".to_owned(),
        serde_json::json!({ "user_id": user, "update_id": update_id }),
    )
}

async fn a_click_starts_the_token_s_action_once(backend: Backend) {
    let Some((_ledger, app)) = setup(backend).await else {
        return;
    };
    let token = issue(&app, OWNER).await;
    let token_stream = format!("cb-{token}");

    assert_eq!(
        press(&app, 1, OWNER, &token).await,
        None,
        "nothing to say yet"
    );
    let events = app.events().await;
    let click: Vec<(&str, &str)> = events
        .iter()
        .skip(1)
        .map(|e| (e.event_type.as_str(), e.stream_id.as_str()))
        .collect();
    assert_eq!(
        click,
        [
            ("UpdateReceived", "update-shop-1"),
            ("TokenConsumed", token_stream.as_str()),
            ("Received", OPERATION_STREAM),
        ],
        "the click consumed the token and started the operation"
    );
    assert!(
        events[1..]
            .iter()
            .all(|e| e.recorded_at == events[1].recorded_at),
        "in one commit"
    );
    let received = payload(&events[3]);
    assert_eq!(received["action"], "coupon");
    assert_eq!(received["business_key"], "spring:42");
    assert_eq!(
        received["params"],
        serde_json::json!({ "campaign": "spring" })
    );
    assert_eq!(received["user_id"], OWNER);
    assert_eq!(received["update_id"], 1);
    let delivery = payload(&events[1]);
    assert_eq!(delivery["kind"], "callback_query");
    assert_eq!(delivery["operation"]["stream"], OPERATION_STREAM);
    assert_eq!(delivery["operation"]["joined"], false);

    // A second click, another update: refused, recorded, nothing started.
    assert_eq!(
        press(&app, 2, OWNER, &token).await.as_deref(),
        Some(REFUSED)
    );
    let history = stream(&app, &token_stream).await;
    let types: Vec<&str> = history.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(types, ["TokenIssued", "TokenConsumed", "TokenRejected"]);
    assert_eq!(history[1], consumed(OWNER, 1));
    assert_eq!(history[2], rejected("already_consumed", OWNER, 2));
    assert_eq!(app.count("Received").await, 1, "no second operation");
    assert_eq!(stream(&app, OPERATION_STREAM).await.len(), 1);
    let second = stream(&app, "update-shop-2").await;
    assert_eq!(second.len(), 1);
    assert!(
        second[0].1["operation"].is_null(),
        "the refused click joined nothing"
    );
    app.stop().await;
}

async fn another_user_s_click_is_refused_and_leaves_the_token_to_its_user(backend: Backend) {
    let Some((_ledger, app)) = setup(backend).await else {
        return;
    };
    let token = issue(&app, OWNER).await;
    let token_stream = format!("cb-{token}");
    // In a group anyone can press the button: a stranger's click is not the owner's.
    assert_eq!(press(&app, 10, 7, &token).await.as_deref(), Some(REFUSED));
    assert_eq!(
        stream(&app, &token_stream).await[1..],
        [rejected("wrong_user", 7, 10)]
    );
    assert_eq!(app.count("Received").await, 0, "nothing started");
    assert_eq!(app.count("TokenConsumed").await, 0);

    // The stranger did not use the token up: its user still can, once.
    assert_eq!(press(&app, 11, OWNER, &token).await, None);
    assert_eq!(
        stream(&app, &token_stream).await[1..],
        [rejected("wrong_user", 7, 10), consumed(OWNER, 11)]
    );
    let operation = stream(&app, OPERATION_STREAM).await;
    assert_eq!(operation.len(), 1);
    assert_eq!(operation[0].0, "Received");
    assert_eq!(operation[0].1["user_id"], OWNER);
    assert_eq!(app.count("Received").await, 1);
    app.stop().await;
}

async fn a_click_after_the_expiry_is_refused(backend: Backend) {
    let Some((_ledger, app)) = setup(backend).await else {
        return;
    };
    let token = issue(&app, OWNER).await;
    // The token works until its expiry, not at it.
    app.clock.advance(TimeDelta::minutes(10));
    assert_eq!(
        press(&app, 20, OWNER, &token).await.as_deref(),
        Some(REFUSED)
    );
    assert_eq!(
        stream(&app, &format!("cb-{token}")).await[1..],
        [rejected("expired", OWNER, 20)]
    );
    assert_eq!(app.count("Received").await, 0, "nothing started");
    assert_eq!(app.count("TokenConsumed").await, 0);
    app.stop().await;
}

async fn callback_data_that_is_not_a_token_only_records_the_delivery(backend: Backend) {
    let Some((_ledger, app)) = setup(backend).await else {
        return;
    };
    // Data that is not one of opledger's tokens (the bot's own buttons, without the `t1_` prefix,
    // or outside the token alphabet, or longer than 64 bytes) names no stream: the click is
    // recorded as a delivery and judged by nobody.
    let not_tokens = [
        "buy:5 now!".to_owned(),
        "K0ktLokvzsgvj6+oKquqACIA".to_owned(),
        "x".repeat(65),
        "menu_1".to_owned(),
    ];
    for (i, data) in not_tokens.iter().enumerate() {
        let update_id = 30 + i as i64;
        assert_eq!(press(&app, update_id, OWNER, data).await, None, "{data}");
    }
    let events = app.events().await;
    let recorded: Vec<(&str, &str)> = events
        .iter()
        .map(|e| (e.event_type.as_str(), e.stream_id.as_str()))
        .collect();
    assert_eq!(
        recorded,
        [
            ("UpdateReceived", "update-shop-30"),
            ("UpdateReceived", "update-shop-31"),
            ("UpdateReceived", "update-shop-32"),
            ("UpdateReceived", "update-shop-33"),
        ],
        "deliveries only: no cb- stream, no operation"
    );
    for event in &events {
        let delivery = payload(event);
        assert_eq!(delivery["kind"], "callback_query");
        assert_eq!(delivery["user_id"], OWNER);
        assert!(delivery["operation"].is_null());
    }
    app.stop().await;
}

async fn a_forged_token_is_refused_as_not_issued(backend: Backend) {
    let Some((_ledger, app)) = setup(backend).await else {
        return;
    };
    // Well-formed, never issued (forged or stale callback data): recorded as a refusal, which
    // is then the first event of its cb- stream (docs/events.md §6).
    let forged = "t1_00112233445566778899aabbccddeeff";
    assert_eq!(
        press(&app, 40, OWNER, forged).await.as_deref(),
        Some(REFUSED)
    );
    assert_eq!(
        stream(&app, &format!("cb-{forged}")).await,
        [rejected("not_issued", OWNER, 40)]
    );
    assert_eq!(app.count("Received").await, 0, "nothing started");
    // A refused click does not make the token issuable afterwards by accident: it stays dead.
    assert_eq!(
        press(&app, 41, OWNER, forged).await.as_deref(),
        Some(REFUSED)
    );
    assert_eq!(
        stream(&app, &format!("cb-{forged}")).await[1],
        rejected("not_issued", OWNER, 41)
    );
    app.stop().await;
}

async fn the_same_click_delivered_again_consumes_the_token_once(backend: Backend) {
    let Some((_ledger, app)) = setup(backend).await else {
        return;
    };
    let token = issue(&app, OWNER).await;
    // Telegram re-sends the same update (same update_id, same body) after a lost answer.
    let body = click(50, OWNER, &token);
    for _ in 0..2 {
        assert_eq!(app.deliver(body.clone()).await.status(), StatusCode::OK);
    }
    assert_eq!(
        stream(&app, &format!("cb-{token}")).await[1..],
        [consumed(OWNER, 50)],
        "the repeat is not a second click: no refusal either"
    );
    let delivery: Vec<String> = stream(&app, "update-shop-50")
        .await
        .into_iter()
        .map(|(t, _)| t)
        .collect();
    assert_eq!(delivery, ["UpdateReceived", "DuplicateDeliveryObserved"]);
    assert_eq!(app.count("Received").await, 1);
    assert_eq!(app.count("UpdateReceived").await, 1);
    app.stop().await;
}

async fn a_double_click_at_once_starts_one_operation(backend: Backend) {
    let Some((_ledger, app)) = setup(backend).await else {
        return;
    };
    let token = issue(&app, OWNER).await;
    // One button in a group, pressed at once: eight times by its user (each press its own
    // update) and once each by eight other members.
    let presses = (0..16).map(|i| {
        let user = if i % 2 == 0 { OWNER } else { 1_000 + i };
        app.deliver(click(100 + i, user, &token))
    });
    for answer in join_all(presses).await {
        // Refused clicks are notes, not failures: all are acknowledged, none is left for
        // Telegram to retry (a non-2xx answer would hold back the user's next updates).
        assert_eq!(answer.status(), StatusCode::OK);
    }
    let history = stream(&app, &format!("cb-{token}")).await;
    let count = |event_type: &str, reason: Option<&str>| {
        history
            .iter()
            .filter(|(t, p)| t == event_type && reason.is_none_or(|r| p["reason"] == r))
            .count()
    };
    assert_eq!(count("TokenConsumed", None), 1, "one click wins");
    assert_eq!(count("TokenRejected", Some("already_consumed")), 7);
    assert_eq!(count("TokenRejected", Some("wrong_user")), 8);
    assert_eq!(history.len(), 17, "every click is recorded once");
    let winner = &history
        .iter()
        .find(|(t, _)| t == "TokenConsumed")
        .expect("consumed")
        .1;
    assert_eq!(winner["user_id"], OWNER);
    assert_eq!(app.count("UpdateReceived").await, 16);
    let operation = stream(&app, OPERATION_STREAM).await;
    assert_eq!(operation.len(), 1, "one operation");
    assert_eq!(
        operation[0].1["update_id"], winner["update_id"],
        "started by the winning click"
    );
    app.stop().await;
}
