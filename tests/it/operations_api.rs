//! The operations API for a bot's own handlers (issue 12 §2), over HTTP on both backends:
//! `POST /v1/operations` with a client's token starts an operation once per business key
//! (201, then 200; 409 with both fingerprints for other parameters; nothing for a bad request),
//! the real worker carries it out against a fake service, `GET /v1/operations/{id}?wait=` waits
//! for its outcome, and a client's token opens nothing but its own bot's operations.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use opledger_config::Config;
use opledger_server::ManualClock;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::app::{Backend, Ledger, SECRET, TOKEN, TestApp, click, on_both_backends};
use crate::support::fake_service::FakeService;
use crate::support::fake_telegram::FakeTelegram;

pub(crate) const ADMIN_TOKEN: &str = "CANARY-admin-token_0123456789abcdef";
/// The shop bot's handlers.
pub(crate) const SHOP_CLIENT: &str = "CANARY-shop-client_0123456789abcdef";
/// Another bot's handlers.
const OTHER_CLIENT: &str = "CANARY-other-client_0123456789abcdef";

/// A service with two bots, a client for each, `coupon` (`{campaign}:{user_id}`) and `lead`
/// (`{phone}`: one lead per phone number whatever the name) calling a fake service (shared with
/// `resolution_api.rs`).
pub(crate) struct World {
    pub(crate) ledger: Ledger,
    pub(crate) app: TestApp,
    pub(crate) service: FakeService,
    _telegram: FakeTelegram,
    config: Config,
}

impl World {
    pub(crate) async fn start(backend: Backend) -> Option<World> {
        let ledger = Ledger::create(backend).await?;
        let service = FakeService::start(false).await;
        let telegram = FakeTelegram::start(TOKEN).await;
        let effector = format!(
            "[actions.effector]\nurl = \"{}\"\ntimeout_ms = 500\nmax_attempts = 3\n",
            service.url()
        );
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nrequest_timeout_ms = 8000\n\
             [api]\nadmin_token_env = \"ADMIN\"\n\
             [[api.clients]]\nname = \"shop_handlers\"\nbot = \"shop\"\ntoken_env = \"SHOP_CLIENT\"\n\
             [[api.clients]]\nname = \"other_handlers\"\nbot = \"other\"\ntoken_env = \"OTHER_CLIENT\"\n\
             [[bots]]\nname = \"shop\"\ntoken_env = \"BOT_TOKEN\"\n\
             webhook_secret_env = \"BOT_SECRET\"\napi_base_url = \"{telegram}\"\n\
             [[bots]]\nname = \"other\"\ntoken_env = \"BOT_TOKEN\"\n\
             webhook_secret_env = \"BOT_SECRET\"\napi_base_url = \"{telegram}\"\n\
             [[actions]]\nname = \"coupon\"\nbot = \"shop\"\ncommand = \"coupon\"\n\
             params = [\"campaign\"]\nkey = \"{{campaign}}:{{user_id}}\"\n{effector}\
             [[actions]]\nname = \"lead\"\nbot = \"shop\"\ncommand = \"lead\"\n\
             params = [\"name\", \"phone\"]\nkey = \"{{phone}}\"\n{effector}",
            telegram = telegram.base_url(),
        );
        let env: HashMap<&str, &str> = HashMap::from([
            ("BOT_TOKEN", TOKEN),
            ("BOT_SECRET", SECRET),
            ("ADMIN", ADMIN_TOKEN),
            ("SHOP_CLIENT", SHOP_CLIENT),
            ("OTHER_CLIENT", OTHER_CLIENT),
        ]);
        let config = Config::parse(&text, &|name| env.get(name).map(|v| (*v).to_owned()))
            .expect("test config");
        let clock = Arc::new(ManualClock::new(Utc::now() + TimeDelta::seconds(5)));
        let app = TestApp::spawn_with_clock(&ledger, &config, clock).await;
        Some(World {
            ledger,
            app,
            service,
            _telegram: telegram,
            config,
        })
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.app.address)
    }

    /// The status and JSON body of `request` sent with `token`; no answer echoes a token.
    pub(crate) async fn send(
        &self,
        request: reqwest::RequestBuilder,
        token: &str,
    ) -> (StatusCode, Value) {
        let response = request
            .bearer_auth(token)
            .send()
            .await
            .expect("the service answers");
        let status = response.status();
        let text = response.text().await.expect("a body");
        for secret in [ADMIN_TOKEN, SHOP_CLIENT, OTHER_CLIENT] {
            assert!(!text.contains(secret), "a token in an answer: {text}");
        }
        let body = serde_json::from_str(&text).unwrap_or_else(|e| panic!("JSON ({e}): {text}"));
        (status, body)
    }

    async fn post(&self, token: &str, body: &Value) -> (StatusCode, Value) {
        let request = self.app.http.post(self.url("/v1/operations")).json(body);
        self.send(request, token).await
    }

    pub(crate) async fn get(&self, token: &str, path: &str) -> (StatusCode, Value) {
        self.send(self.app.http.get(self.url(path)), token).await
    }

    /// Every operation, as the admin lists them.
    pub(crate) async fn operations(&self) -> Vec<Value> {
        let (status, body) = self.get(ADMIN_TOKEN, "/v1/operations?limit=500").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body["operations"].as_array().cloned().expect("a list")
    }

    /// Carries out every due operation once.
    pub(crate) async fn work(&self) {
        let worker = self.app.worker(&self.config, "w1", 1);
        worker.run_due().await.expect("work");
    }
}

/// A `lead` for `name` at `phone`, caused by update `update_id` from user 7 in their chat.
fn lead(name: &str, phone: &str, update_id: i64) -> Value {
    json!({
        "action": "lead",
        "params": { "name": name, "phone": phone },
        "chat_id": 7,
        "user_id": 7,
        "update_id": update_id,
    })
}

on_both_backends!(
    a_business_key_starts_one_operation_and_the_worker_carries_it_out,
    concurrent_requests_for_one_key_start_one_operation,
    a_request_that_does_not_fit_is_refused_and_starts_nothing,
    a_client_token_opens_only_its_own_bots_operations,
    a_button_from_the_api_starts_its_operation_once,
    a_nul_in_parameters_is_kept_as_both_backends_can_store_it,
);

async fn a_business_key_starts_one_operation_and_the_worker_carries_it_out(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    let (status, first) = world.post(SHOP_CLIENT, &lead("Ada", "+100", 41)).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert_eq!(first["status"], "received", "{first}");
    assert_eq!(first["business_key"], "+100");
    assert_eq!(
        (first["bot"].as_str(), first["user_id"].as_i64()),
        (Some("shop"), Some(7))
    );
    let id = first["operation_id"].as_str().expect("an id").to_owned();

    // Asked again (a retried handler, the same update twice): the same operation.
    let (status, again) = world.post(SHOP_CLIENT, &lead("Ada", "+100", 42)).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["operation_id"], id.as_str());

    // The same key with other parameters: a conflict naming both fingerprints; nothing new.
    let (status, conflict) = world.post(SHOP_CLIENT, &lead("Bob", "+100", 43)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{conflict}");
    assert_eq!(conflict["error"], "key_conflict");
    assert_eq!(conflict["conflict"]["operation_id"], id.as_str());
    let (existing, asked) = (
        conflict["conflict"]["existing_fingerprint"]
            .as_str()
            .unwrap(),
        conflict["conflict"]["fingerprint"].as_str().unwrap(),
    );
    assert!(
        existing.len() == 64 && asked.len() == 64 && existing != asked,
        "{conflict}"
    );
    assert_eq!(world.operations().await.len(), 1, "one operation");

    // The worker carries it out as if a command had asked: one call, under its id.
    let waiting = {
        let http = world.app.http.clone();
        let url = world.url(&format!("/v1/operations/{id}?wait=7"));
        tokio::spawn(async move {
            let response = http.get(url).bearer_auth(SHOP_CLIENT).send().await.unwrap();
            (response.status(), response.json::<Value>().await.unwrap())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    world.work().await;
    let (status, settled) = waiting.await.expect("the wait answers");
    assert_eq!(status, StatusCode::OK, "{settled}");
    assert_eq!(
        settled["status"], "confirmed",
        "the wait ended with the outcome: {settled}"
    );
    assert_eq!(world.service.requests().get(&id), Some(&1), "one call");
    assert_eq!(world.service.total_requests(), 1);

    // Without `wait`, at once; the events name the client as the cause, correlated with the
    // update it named.
    let (status, now) = world
        .get(SHOP_CLIENT, &format!("/v1/operations/{id}"))
        .await;
    assert_eq!(
        (status, now["status"].as_str()),
        (StatusCode::OK, Some("confirmed"))
    );
    let (status, events) = world
        .get(SHOP_CLIENT, &format!("/v1/operations/{id}/events"))
        .await;
    assert_eq!(status, StatusCode::OK, "{events}");
    let first_event = &events["events"][0];
    assert_eq!(first_event["event_type"], "Received");
    assert_eq!(
        first_event["metadata"]["causation"],
        json!({ "kind": "client", "client": "shop_handlers" })
    );
    assert_eq!(first_event["metadata"]["correlation"], "update-shop-41");
    world.app.stop().await;
}

async fn concurrent_requests_for_one_key_start_one_operation(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    let world = Arc::new(world);
    let requests: Vec<_> = (0..20)
        .map(|i| {
            let world = world.clone();
            tokio::spawn(
                async move { world.post(SHOP_CLIENT, &lead("Ada", "+200", 100 + i)).await },
            )
        })
        .collect();
    let mut statuses = Vec::new();
    let mut ids = std::collections::BTreeSet::new();
    for request in requests {
        let (status, body) = request.await.expect("a request");
        ids.insert(body["operation_id"].as_str().map(str::to_owned));
        statuses.push(status);
    }
    let created = statuses
        .iter()
        .filter(|s| **s == StatusCode::CREATED)
        .count();
    let found = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!((created, found), (1, 19), "{statuses:?}");
    assert_eq!(ids.len(), 1, "one operation id: {ids:?}");
    assert_eq!(world.operations().await.len(), 1);
    world.work().await;
    assert_eq!(
        world.service.total_requests(),
        1,
        "one call for twenty requests"
    );
    let world = Arc::into_inner(world).expect("the requests are done");
    world.app.stop().await;
}

async fn a_request_that_does_not_fit_is_refused_and_starts_nothing(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    let cases: Vec<(Value, &str)> = vec![
        (
            json!({ "action": "nope", "params": {}, "update_id": 1 }),
            "no action named `nope`",
        ),
        (
            json!({ "action": "lead", "params": { "name": "Ada" }, "update_id": 1 }),
            "`phone` is missing or empty",
        ),
        (
            json!({ "action": "lead", "params": { "name": "Ada", "phone": "1", "x": "y" }, "update_id": 1 }),
            "`x` is not one of its parameters",
        ),
        (
            json!({ "action": "lead", "params": { "name": "Ada", "phone": "1" } }),
            "update_id",
        ),
        (
            json!({ "action": "lead", "params": { "name": "Ada", "phone": "1" }, "update_id": -1 }),
            "`update_id` must be a Telegram update id",
        ),
        (
            json!({ "action": "lead", "params": { "name": "Ada", "phone": "1" }, "update_id": 1, "colour": "red" }),
            "colour",
        ),
        (
            json!({ "action": "lead", "params": { "name": "Ada", "phone": "1" }, "update_id": 1, "bot": "other" }),
            "may only act for bot `shop`",
        ),
        // coupon's key needs the user.
        (
            json!({ "action": "coupon", "params": { "campaign": "spring" }, "update_id": 1 }),
            "business key cannot be made",
        ),
    ];
    for (body, says) in cases {
        let (status, answer) = world.post(SHOP_CLIENT, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} -> {answer}");
        assert_eq!(answer["error"], "bad_request", "{answer}");
        let message = answer["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{body}: {message}");
    }
    let raw = world
        .app
        .http
        .post(world.url("/v1/operations"))
        .bearer_auth(SHOP_CLIENT)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), StatusCode::BAD_REQUEST);
    // The admin names the bot; without one it is told to.
    let (status, answer) = world.post(ADMIN_TOKEN, &lead("Ada", "+300", 1)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("name the `bot` it is for")
    );
    assert!(world.operations().await.is_empty(), "nothing was started");
    assert_eq!(world.app.count("Received").await, 0);
    world.app.stop().await;
}

async fn a_client_token_opens_only_its_own_bots_operations(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    let (status, started) = world.post(SHOP_CLIENT, &lead("Ada", "+400", 5)).await;
    assert_eq!(status, StatusCode::CREATED, "{started}");
    let id = started["operation_id"].as_str().unwrap().to_owned();
    let stream = started["stream_id"].as_str().unwrap().to_owned();

    // Another bot's client: the operation does not exist for it, and it cannot start one of
    // shop's actions.
    for path in [
        format!("/v1/operations/{id}"),
        format!("/v1/operations/{id}/events"),
    ] {
        let (status, body) = world.get(OTHER_CLIENT, &path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
    }
    let (status, body) = world.post(OTHER_CLIENT, &lead("Eve", "+401", 6)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("bot `other` has no action named `lead`")
    );

    // No client reaches the operator's routes.
    for path in [
        "/v1/operations".to_owned(),
        "/v1/reconciliation".to_owned(),
        "/v1/projections".to_owned(),
        format!("/v1/streams/{stream}/events"),
    ] {
        for token in [SHOP_CLIENT, OTHER_CLIENT] {
            let (status, body) = world.get(token, &path).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
            assert_eq!(body["error"], "forbidden");
        }
        let (status, body) = world.get(ADMIN_TOKEN, &path).await;
        assert_eq!(status, StatusCode::OK, "the admin reads {path}: {body}");
    }
    // The admin may start an operation for a bot it names, and reads every bot's.
    let mut asked = lead("Ada", "+402", 7);
    asked["bot"] = json!("shop");
    let (status, body) = world.post(ADMIN_TOKEN, &asked).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, _) = world
        .get(ADMIN_TOKEN, &format!("/v1/operations/{id}"))
        .await;
    assert_eq!(status, StatusCode::OK);
    world.app.stop().await;
}

async fn a_button_from_the_api_starts_its_operation_once(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    let button = |user: i64, expires: u32| {
        json!({
            "action": "coupon",
            "params": { "campaign": "spring" },
            "user_id": user,
            "chat_id": user,
            "expires_in_secs": expires,
        })
    };
    let request = |body: Value| world.app.http.post(world.url("/v1/buttons")).json(&body);
    let (status, issued) = world.send(request(button(7, 600)), SHOP_CLIENT).await;
    assert_eq!(status, StatusCode::CREATED, "{issued}");
    let data = issued["callback_data"]
        .as_str()
        .expect("callback data")
        .to_owned();
    assert!(
        data.len() <= 64 && data.starts_with("t1_"),
        "fits callback_data: {data}"
    );

    // A double click and another user's click: one operation, for the user it was issued to.
    for (update_id, user) in [(500, 7), (501, 7), (502, 8)] {
        let response = world.app.deliver(click(update_id, user, &data)).await;
        assert_eq!(response.status(), StatusCode::OK);
    }
    let operations = world.operations().await;
    assert_eq!(operations.len(), 1, "{operations:?}");
    assert_eq!(operations[0]["business_key"], "spring:7");
    assert_eq!(world.app.count("TokenConsumed").await, 1);
    assert_eq!(world.app.count("TokenRejected").await, 2);

    // An expired button starts nothing.
    let (status, late) = world.send(request(button(9, 1)), SHOP_CLIENT).await;
    assert_eq!(status, StatusCode::CREATED, "{late}");
    world.app.clock.advance(TimeDelta::seconds(5));
    let late = late["callback_data"].as_str().unwrap().to_owned();
    assert_eq!(
        world.app.deliver(click(503, 9, &late)).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        world.operations().await.len(),
        1,
        "the late click started nothing"
    );
    assert_eq!(world.app.count("TokenRejected").await, 3);

    // A button that does not fit the action, or of another bot's client, is not issued.
    let mut wrong = button(7, 600);
    wrong["params"] = json!({ "season": "spring" });
    for (body, token, says) in [
        (wrong, SHOP_CLIENT, "`season` is not one of its parameters"),
        (
            button(7, 0),
            SHOP_CLIENT,
            "`expires_in_secs` must be 1 to 604800",
        ),
        (
            button(7, 600),
            OTHER_CLIENT,
            "bot `other` has no action named `coupon`",
        ),
    ] {
        let (status, answer) = world.send(request(body), token).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
        assert!(
            answer["message"].as_str().unwrap().contains(says),
            "{answer}"
        );
    }
    assert_eq!(world.app.count("TokenIssued").await, 2);
    world.app.stop().await;
}

/// U+0000, which PostgreSQL cannot store, is kept as U+FFFD (ADR 0010): the request is
/// answered, never a 503 that a retrying handler would repeat forever.
async fn a_nul_in_parameters_is_kept_as_both_backends_can_store_it(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    let (status, started) = world
        .post(SHOP_CLIENT, &lead("A\u{0}da", "+5\u{0}00", 60))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{started}");
    assert_eq!(started["business_key"], "+5\u{FFFD}00");
    let (status, again) = world
        .post(SHOP_CLIENT, &lead("A\u{0}da", "+5\u{0}00", 61))
        .await;
    assert_eq!(status, StatusCode::OK, "the same operation again: {again}");
    world.work().await;
    let id = started["operation_id"].as_str().unwrap();
    let (_, settled) = world
        .get(SHOP_CLIENT, &format!("/v1/operations/{id}"))
        .await;
    assert_eq!(settled["status"], "confirmed", "{settled}");
    world.app.stop().await;
}
