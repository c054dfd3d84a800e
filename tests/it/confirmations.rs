//! Confirmation buttons from configuration (issue 12 §3), over HTTP on both backends: a command
//! of an action with `confirm` is answered with its question and one-time *Confirm* / *Cancel*
//! buttons and starts nothing; only the first valid *Confirm* starts the operation (the
//! effector is called once); a second *Confirm*, a *Confirm* after *Cancel*, another user's or a
//! late one is answered and starts nothing. In poll mode the question is sent with
//! `sendMessage`, keyboard and all.

use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use futures_util::future::join_all;
use opledger_server::{Clock, ManualClock};
use reqwest::StatusCode;
use serde_json::Value;

use crate::support::app::{
    Backend, Ledger, TOKEN, TestApp, click, config, message, message_from, on_both_backends,
};
use crate::support::fake_service::FakeService;
use crate::support::fake_telegram::FakeTelegram;

on_both_backends!(
    a_command_that_asks_first_is_answered_with_its_question_and_buttons,
    confirm_starts_one_operation_and_the_effector_is_called_once,
    a_double_confirm_starts_one_operation,
    cancel_then_confirm_starts_nothing,
    another_user_s_confirm_starts_nothing,
    a_late_confirm_starts_nothing,
    two_confirmations_of_one_request_start_one_operation,
    a_polled_command_is_asked_with_send_message,
);

/// The user who asks.
const OWNER: i64 = 42;
/// The question `/coupon spring` is asked with.
const QUESTION: &str = "Issue a coupon for spring?";
/// What a refused click is answered with.
const REFUSED: &str = "This button can no longer be used.";

/// `/coupon <campaign>` asking first, with buttons valid for five minutes, calling `service`.
fn coupon(service: &FakeService) -> String {
    format!(
        "[[actions]]\nname = \"coupon\"\nbot = \"shop\"\ncommand = \"coupon\"\n\
         params = [\"campaign\"]\nkey = \"{{campaign}}:{{user_id}}\"\n\
         confirm = \"Issue a coupon for {{campaign}}?\"\nconfirm_expiry_secs = 300\n\
         [actions.effector]\nurl = \"{}\"\ntimeout_ms = 500\nmax_attempts = 3\n",
        service.url()
    )
}

/// The service, a fake shop, and a fake Bot API for the worker's replies.
struct World {
    _ledger: Ledger,
    app: TestApp,
    service: FakeService,
    telegram: FakeTelegram,
    config: opledger_config::Config,
}

impl World {
    async fn start(backend: Backend) -> Option<World> {
        let ledger = Ledger::create(backend).await?;
        let service = FakeService::start(false).await;
        let telegram = FakeTelegram::start(TOKEN).await;
        // `config` appends to the bot's table first: the Bot API the worker replies through.
        let config = config(&format!(
            "api_base_url = \"{}\"\n{}",
            telegram.base_url(),
            coupon(&service)
        ));
        // Due times start from the database's clock (`recorded_at`), so the manual clock starts
        // a little ahead of the real one and moves only when a test says.
        let clock = Arc::new(ManualClock::new(Utc::now() + TimeDelta::seconds(5)));
        let app = TestApp::spawn_with_clock(&ledger, &config, clock).await;
        Some(World {
            _ledger: ledger,
            app,
            service,
            telegram,
            config,
        })
    }

    /// Delivers `/coupon spring` from `user` as update `update_id`; returns the webhook's answer.
    async fn ask(&self, update_id: i64, user: i64) -> Value {
        let body = message_from(update_id, 1_790_000_000, user, "/coupon spring");
        let response = self.app.deliver(body).await;
        assert_eq!(response.status(), StatusCode::OK);
        response.json().await.expect("a JSON answer")
    }

    /// Delivers `/coupon spring` from [`OWNER`] and returns the buttons' callback data, checking
    /// the question.
    async fn asked(&self, update_id: i64) -> Buttons {
        buttons(&self.ask(update_id, OWNER).await)
    }

    /// Delivers a click by `user` on `data`; returns the notice it is answered with.
    async fn press(&self, update_id: i64, user: i64, data: &str) -> Option<String> {
        let response = self.app.deliver(click(update_id, user, data)).await;
        notice(update_id, response).await
    }

    /// Carries out every due operation once; returns how many calls the shop has seen.
    async fn work(&self) -> usize {
        let worker = self.app.worker(&self.config, "w1", 1);
        worker.run_due().await.expect("work");
        self.service.total_requests()
    }

    async fn operations(&self) -> usize {
        self.app.count("Received").await
    }
}

/// The callback data of a confirmation's two buttons.
struct Buttons {
    confirm: String,
    cancel: String,
}

/// The buttons of a webhook answer that asks [`QUESTION`]: one row, *Confirm* then *Cancel*,
/// each fitting Telegram's 64 bytes of callback data.
fn buttons(answer: &Value) -> Buttons {
    assert_eq!(answer["method"], "sendMessage", "{answer}");
    assert_eq!(answer["chat_id"], OWNER);
    assert_eq!(answer["text"], QUESTION);
    let rows = answer["reply_markup"]["inline_keyboard"]
        .as_array()
        .unwrap_or_else(|| panic!("an inline keyboard: {answer}"));
    assert_eq!(rows.len(), 1, "{answer}");
    let row = rows[0].as_array().expect("a row");
    let labels: Vec<&str> = row.iter().map(|b| b["text"].as_str().unwrap()).collect();
    assert_eq!(labels, ["Confirm", "Cancel"]);
    let data: Vec<String> = row
        .iter()
        .map(|b| b["callback_data"].as_str().unwrap().to_owned())
        .collect();
    for data in &data {
        assert!(
            !data.is_empty() && data.len() <= 64,
            "callback_data fits: {data}"
        );
    }
    assert_ne!(data[0], data[1]);
    Buttons {
        confirm: data[0].clone(),
        cancel: data[1].clone(),
    }
}

/// The notice of a click's `answerCallbackQuery` (every click gets one, so that the button
/// stops spinning).
async fn notice(update_id: i64, response: reqwest::Response) -> Option<String> {
    assert_eq!(response.status(), StatusCode::OK, "a click is acknowledged");
    let answer: Value = response.json().await.expect("a JSON answer");
    assert_eq!(answer["method"], "answerCallbackQuery", "{answer}");
    assert_eq!(answer["callback_query_id"], format!("cb{update_id}"));
    answer["text"].as_str().map(str::to_owned)
}

async fn a_command_that_asks_first_is_answered_with_its_question_and_buttons(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    let buttons = world.asked(1).await;
    let events = world.app.events().await;
    let recorded: Vec<(&str, &str)> = events
        .iter()
        .map(|e| (e.event_type.as_str(), e.stream_id.as_str()))
        .collect();
    let token_stream = format!("cb-{}", buttons.confirm);
    assert_eq!(
        recorded,
        [
            ("UpdateReceived", "update-shop-1"),
            ("TokenIssued", token_stream.as_str())
        ],
        "the token is issued with the update's receipt, and nothing is started"
    );
    assert_eq!(
        events[0].recorded_at, events[1].recorded_at,
        "in one commit"
    );
    let issued: Value = serde_json::from_slice(&events[1].payload).expect("JSON");
    assert_eq!(issued["action"], "coupon");
    assert_eq!(issued["user_id"], OWNER);
    assert_eq!(issued["chat_id"], OWNER);
    assert_eq!(
        issued["payload"],
        serde_json::json!({ "campaign": "spring" })
    );
    assert_eq!(
        issued["operation_id"],
        opledger_domain::OperationId::new("coupon", "spring:42").to_string(),
        "the operation a Confirm starts"
    );
    let expires_at: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(issued["expires_at"].clone()).expect("a time");
    assert_eq!(expires_at - world.app.clock.now(), TimeDelta::seconds(300));
    let metadata: Value = serde_json::from_slice(&events[1].metadata).expect("JSON");
    assert_eq!(metadata["causation"]["kind"], "update");
    assert_eq!(metadata["correlation"], "update-shop-1");

    // Telegram delivers the same update again: the same delivery, no second keyboard's token.
    let again = world
        .app
        .deliver(message(1, 1_790_000_000, "/coupon spring"))
        .await;
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(world.app.count("TokenIssued").await, 1);
    assert_eq!(world.work().await, 0, "nothing to do before a Confirm");
    world.app.stop().await;
}

async fn confirm_starts_one_operation_and_the_effector_is_called_once(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    let buttons = world.asked(1).await;
    assert_eq!(world.press(2, OWNER, &buttons.confirm).await, None);
    assert_eq!(world.operations().await, 1);
    let events = world.app.events().await;
    let click: Vec<&str> = events[2..].iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(click, ["UpdateReceived", "TokenConsumed", "Received"]);
    let received: Value = serde_json::from_slice(&events[4].payload).expect("JSON");
    assert_eq!(received["business_key"], "spring:42");
    assert_eq!(received["update_id"], 2, "started by the Confirm");
    assert_eq!(world.work().await, 1, "the effector is called once");
    let id = opledger_domain::OperationId::new("coupon", "spring:42").to_string();
    assert_eq!(world.service.requests().get(&id), Some(&1));
    // The worker's reply reaches the user as for a command (its own step).
    assert_eq!(world.work().await, 1, "and never again");
    let replied = world.telegram.calls("sendMessage");
    assert!(
        replied
            .iter()
            .any(|m| m["chat_id"] == OWNER && m["text"] == "Done."),
        "{replied:?}"
    );
    world.app.stop().await;
}

async fn a_double_confirm_starts_one_operation(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    let buttons = world.asked(1).await;
    // Pressed twice in a row, then eight times at once.
    assert_eq!(world.press(2, OWNER, &buttons.confirm).await, None);
    assert_eq!(
        world.press(3, OWNER, &buttons.confirm).await.as_deref(),
        Some(REFUSED)
    );
    let presses = (0..8).map(|i| world.app.deliver(click(10 + i, OWNER, &buttons.confirm)));
    for (i, response) in join_all(presses).await.into_iter().enumerate() {
        assert_eq!(
            notice(10 + i as i64, response).await.as_deref(),
            Some(REFUSED)
        );
    }
    assert_eq!(world.operations().await, 1, "one operation");
    assert_eq!(world.app.count("TokenConsumed").await, 1);
    assert_eq!(world.app.count("TokenRejected").await, 9);
    assert_eq!(world.work().await, 1, "one call");
    world.app.stop().await;
}

async fn cancel_then_confirm_starts_nothing(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    let buttons = world.asked(1).await;
    assert_eq!(
        world.press(2, OWNER, &buttons.cancel).await.as_deref(),
        Some("Cancelled: nothing was done.")
    );
    assert_eq!(
        world.press(3, OWNER, &buttons.confirm).await.as_deref(),
        Some(REFUSED)
    );
    assert_eq!(
        world.press(4, OWNER, &buttons.cancel).await.as_deref(),
        Some(REFUSED),
        "a second Cancel is refused too"
    );
    let token_stream = format!("cb-{}", buttons.confirm);
    let history: Vec<(String, Value)> = world
        .app
        .events()
        .await
        .iter()
        .filter(|e| e.stream_id.as_str() == token_stream)
        .map(|e| {
            let payload: Value = serde_json::from_slice(&e.payload).expect("JSON");
            (e.event_type.clone(), payload["reason"].clone())
        })
        .collect();
    let cancelled = serde_json::json!("cancelled");
    assert_eq!(
        history,
        [
            ("TokenIssued".to_owned(), Value::Null),
            ("TokenCancelled".to_owned(), Value::Null),
            ("TokenRejected".to_owned(), cancelled.clone()),
            ("TokenRejected".to_owned(), cancelled),
        ]
    );
    assert_eq!(world.operations().await, 0, "nothing started");
    assert_eq!(world.work().await, 0, "nothing called");
    world.app.stop().await;
}

async fn another_user_s_confirm_starts_nothing(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    let buttons = world.asked(1).await;
    // In a group anyone can press the buttons: a stranger's Confirm and Cancel are refused.
    for (update_id, data) in [(2, &buttons.confirm), (3, &buttons.cancel)] {
        assert_eq!(
            world.press(update_id, 7, data).await.as_deref(),
            Some(REFUSED)
        );
    }
    assert_eq!(world.operations().await, 0, "nothing started");
    assert_eq!(world.app.count("TokenCancelled").await, 0);
    assert_eq!(world.work().await, 0);
    // The stranger used nothing up: its user still confirms, once.
    assert_eq!(world.press(4, OWNER, &buttons.confirm).await, None);
    assert_eq!(world.operations().await, 1);
    assert_eq!(world.work().await, 1);
    world.app.stop().await;
}

async fn a_late_confirm_starts_nothing(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    let buttons = world.asked(1).await;
    world.app.clock.advance(TimeDelta::seconds(300));
    assert_eq!(
        world.press(2, OWNER, &buttons.confirm).await.as_deref(),
        Some(REFUSED)
    );
    assert_eq!(world.operations().await, 0, "nothing started");
    assert_eq!(world.work().await, 0);
    world.app.stop().await;
}

/// The user sends the command twice and confirms both questions: the business key makes them
/// one operation, as the command would have.
async fn two_confirmations_of_one_request_start_one_operation(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    let first = world.asked(1).await;
    let second = world.asked(2).await;
    assert_ne!(first.confirm, second.confirm, "each question its own token");
    assert_eq!(world.press(3, OWNER, &first.confirm).await, None);
    let joined = world.press(4, OWNER, &second.confirm).await;
    assert!(
        joined
            .as_deref()
            .is_some_and(|text| text.starts_with("You asked for this already")),
        "{joined:?}"
    );
    assert_eq!(world.operations().await, 1, "one operation");
    assert_eq!(world.work().await, 1, "one call");
    world.app.stop().await;
}

async fn a_polled_command_is_asked_with_send_message(backend: Backend) {
    let Some(ledger) = Ledger::create(backend).await else {
        return;
    };
    let service = FakeService::start(false).await;
    let telegram = FakeTelegram::start(TOKEN).await;
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshutdown_grace_ms = 1000\n\
         [[bots]]\nname = \"shop\"\ntoken_env = \"SHOP_TOKEN\"\nmode = \"poll\"\n\
         api_base_url = \"{}\"\npoll_timeout_secs = 1\n{}",
        telegram.base_url(),
        coupon(&service)
    );
    let config = opledger_config::Config::parse(&text, &|name| {
        (name == "SHOP_TOKEN").then(|| TOKEN.to_owned())
    })
    .expect("test config");
    let app = TestApp::spawn(&ledger, &config).await;
    telegram.push_update(message(1, 1_790_000_000, "/coupon spring"));
    let asked = wait_for(|| telegram.calls("sendMessage").first().cloned()).await;
    let buttons = buttons(&serde_json::json!({
        "method": "sendMessage",
        "chat_id": asked["chat_id"],
        "text": asked["text"],
        "reply_markup": asked["reply_markup"],
    }));
    assert_eq!(app.count("Received").await, 0, "nothing started");

    telegram.push_update(click(2, OWNER, &buttons.confirm));
    telegram.push_update(click(3, OWNER, &buttons.confirm));
    let answers = wait_for(|| {
        let answers = telegram.calls("answerCallbackQuery");
        (answers.len() == 2).then_some(answers)
    })
    .await;
    let refused: Vec<&Value> = answers.iter().filter(|a| a["text"] == REFUSED).collect();
    assert_eq!(
        refused.len(),
        1,
        "the second Confirm is refused: {answers:?}"
    );
    assert_eq!(app.count("Received").await, 1, "one operation");
    app.stop().await;
}

/// Polls `check` until it gives something; fails after 30 s.
async fn wait_for<T>(mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for the fake Bot API's calls"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
