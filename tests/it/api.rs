//! The read side's HTTP surfaces, driven over HTTP like a client on both backends (issue 6 §6):
//! the read API under `/v1` behind the admin bearer token, its OpenAPI document, `/metrics` in
//! the OpenMetrics text format, `/healthz` and `/readyz`. Updates enter through the real webhook,
//! the real worker carries operations out against a fake service on loopback, and the real
//! projection runner keeps the asynchronous read models.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use opledger_config::Config;
use opledger_projections::operation_status::{self, Filter, OperationStatusRow};
use opledger_projections::{Projector, ProjectorOptions, registry};
use opledger_server::{Clock, ManualClock};
use opledger_store::{EventStore, StreamId};
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, WWW_AUTHENTICATE};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::support::app::{
    Backend, Ledger, SECRET, TOKEN, TestApp, message_from, on_both_backends,
};
use crate::support::fake_service::{Behaviour, FakeService};
use crate::support::fake_telegram::FakeTelegram;
use crate::support::postgres::PrivateCluster;
use crate::support::serving::{Serving, opledger, write_config};

/// The admin token the tests configure; a canary, so that a leak is found by searching for it.
const ADMIN_TOKEN: &str = "CANARY-admin-token_0123456789abcdef";
/// A wrong token that shares most of the right one.
const WRONG_TOKEN: &str = "CANARY-admin-token_0123456789abcdeX";

/// Every `/v1` route, as documented; `{id}` and `{stream_id}` are path parameters.
const ROUTES: &[&str] = &[
    "/v1/operations",
    "/v1/operations/{id}",
    "/v1/operations/{id}/events",
    "/v1/streams/{stream_id}/events",
    "/v1/reconciliation",
    "/v1/projections",
    "/v1/openapi.json",
];

/// The routes that only take a POST (the operations API's and an operator's decision;
/// `/v1/operations` takes both).
const POST_ROUTES: &[&str] = &["/v1/buttons", RESOLUTION];

/// An operator's decision: a POST for the admin token only.
const RESOLUTION: &str = "/v1/operations/{id}/resolution";

/// The asynchronous projections the runner keeps.
const ASYNC_PROJECTIONS: &[&str] = &[
    "audit_trail",
    "reconciliation_queue",
    "user_operations",
    "metrics",
];

/// A service (with its projection runner) and the coupon action calling a fake service, with a
/// fake Bot API for replies.
struct World {
    _ledger: Ledger,
    app: TestApp,
    service: FakeService,
    _telegram: FakeTelegram,
    config: Config,
    projector: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
}

/// The test configuration; with `api`, the read API is on with [`ADMIN_TOKEN`].
fn config(api: bool, service: &FakeService, telegram: &FakeTelegram) -> Config {
    let api = if api {
        "[api]\nadmin_token_env = \"OPLEDGER_ADMIN_TOKEN\"\n"
    } else {
        ""
    };
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nrequest_timeout_ms = 8000\n{api}\
         [[bots]]\nname = \"shop\"\ntoken_env = \"SHOP_TOKEN\"\n\
         webhook_secret_env = \"SHOP_SECRET\"\napi_base_url = \"{telegram}\"\n\
         [[actions]]\nname = \"coupon\"\nbot = \"shop\"\ncommand = \"coupon\"\n\
         params = [\"campaign\"]\nkey = \"{{campaign}}:{{user_id}}\"\n\
         [actions.effector]\nurl = \"{url}\"\ntimeout_ms = 500\nmax_attempts = 3\n",
        telegram = telegram.base_url(),
        url = service.url(),
    );
    let env: HashMap<&str, &str> = HashMap::from([
        ("SHOP_TOKEN", TOKEN),
        ("SHOP_SECRET", SECRET),
        ("OPLEDGER_ADMIN_TOKEN", ADMIN_TOKEN),
    ]);
    Config::parse(&text, &|name| env.get(name).map(|v| (*v).to_owned())).expect("test config")
}

impl World {
    async fn start(backend: Backend) -> Option<World> {
        Self::start_with(backend, true).await
    }

    async fn start_with(backend: Backend, api: bool) -> Option<World> {
        let ledger = Ledger::create(backend).await?;
        Some(Self::on(ledger, api).await)
    }

    async fn on(ledger: Ledger, api: bool) -> World {
        let service = FakeService::start(false).await;
        let telegram = FakeTelegram::start(TOKEN).await;
        let config = config(api, &service, &telegram);
        // Times in the ledger come from the database's clock; the service's manual clock starts
        // a little ahead of it and moves only when a test says.
        let clock = Arc::new(ManualClock::new(Utc::now() + TimeDelta::seconds(5)));
        let app = TestApp::spawn_with_clock(&ledger, &config, clock).await;
        World {
            _ledger: ledger,
            app,
            service,
            _telegram: telegram,
            config,
            projector: None,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.app.address)
    }

    /// GETs `path` with an `Authorization` header of `authorization`, if any.
    async fn get_with(&self, path: &str, authorization: Option<&str>) -> reqwest::Response {
        let mut request = self.app.http.get(self.url(path));
        if let Some(authorization) = authorization {
            request = request.header("authorization", authorization);
        }
        request.send().await.expect("the service answers")
    }

    /// GETs `path` with the admin token.
    async fn get(&self, path: &str) -> reqwest::Response {
        self.get_with(path, Some(&format!("Bearer {ADMIN_TOKEN}")))
            .await
    }

    /// GETs `path` with the admin token; the status and the JSON body.
    async fn json(&self, path: &str) -> (StatusCode, Value) {
        let response = self.get(path).await;
        let status = response.status();
        let text = response.text().await.expect("a body");
        assert!(
            !text.contains(ADMIN_TOKEN),
            "{path} echoes the token: {text}"
        );
        let body = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{path} answers JSON ({e}): {text}"));
        (status, body)
    }

    /// GETs `path` with the admin token and expects 200.
    async fn ok(&self, path: &str) -> Value {
        let (status, body) = self.json(path).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        body
    }

    /// `/coupon <campaign>` from `user`, through the webhook.
    async fn ask(&self, update_id: i64, user: i64, campaign: &str) {
        let body = message_from(
            update_id,
            1_790_000_000,
            user,
            &format!("/coupon {campaign}"),
        );
        assert_eq!(self.app.deliver(body).await.status(), StatusCode::OK);
    }

    /// Carries out every due operation once.
    async fn work(&self) {
        let worker = self.app.worker(&self.config, "w1", 1);
        worker.run_due().await.expect("work");
    }

    async fn operation(&self, business_key: &str) -> OperationStatusRow {
        operation_status::list(
            self.app.store.reader(),
            &Filter {
                limit: 1000,
                ..Filter::default()
            },
        )
        .await
        .expect("read operation_status")
        .into_iter()
        .find(|row| row.business_key == business_key)
        .unwrap_or_else(|| panic!("an operation for {business_key}"))
    }

    /// Starts another projection runner in the background (after the service's stopped).
    fn run_projections(&mut self) {
        let options = ProjectorOptions {
            poll_interval: Duration::from_millis(20),
            ..ProjectorOptions::default()
        };
        let projector = Projector::new(
            self.app.store.clone(),
            opledger_projections::builtin(),
            options,
        );
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(projector.run(async move {
            let _ = stopped.await;
        }));
        self.projector = Some((stop, task));
    }

    /// Waits until every asynchronous projection has applied the whole ledger.
    async fn caught_up(&self) {
        let head = self.app.store.head().await.expect("head").position;
        for name in ASYNC_PROJECTIONS {
            assert!(
                registry::wait_for(&self.app.store, name, head, Duration::from_secs(30))
                    .await
                    .expect("read the registry"),
                "{name} caught up with position {head}"
            );
        }
    }

    async fn stop(mut self) {
        if let Some((stop, task)) = self.projector.take() {
            let _ = stop.send(());
            task.await.expect("the runner stops");
        }
        self.app.stop().await;
    }
}

/// Every route with real values for its path parameters.
fn concrete_routes(operation_id: &str, stream_id: &str) -> Vec<String> {
    ROUTES
        .iter()
        .map(|route| {
            route
                .replace("{id}", operation_id)
                .replace("{stream_id}", stream_id)
        })
        .collect()
}

on_both_backends!(
    every_data_route_answers_401_without_the_right_token,
    without_a_configured_token_the_api_is_off,
    operations_by_id_state_and_user,
    events_of_an_operation_and_of_any_stream_page_by_page,
    bad_parameters_are_refused_naming_the_parameter,
    unknown_ids_and_routes_are_404,
    the_reconciliation_queue_shows_waiting_operations_with_their_age,
    projections_show_their_checkpoint_and_lag,
    the_openapi_document_parses_and_describes_every_route,
    metrics_are_openmetrics_text_with_the_known_counts,
    readyz_is_200_normally_and_503_when_storage_is_closed,
    readyz_is_503_while_a_projection_is_stalled,
    the_documented_bounds_of_parameters_are_the_enforced_ones,
);

async fn every_data_route_answers_401_without_the_right_token(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    world.ask(1, 7, "spring").await;
    let row = world.operation("spring:7").await;
    let routes = concrete_routes(&row.operation_id, &row.stream_id);
    let mut refused = 0;
    for route in routes.iter().filter(|r| !r.ends_with("openapi.json")) {
        for (authorization, challenge) in [
            (None, "Bearer realm=\"opledger\""),
            (
                Some(format!("Bearer {WRONG_TOKEN}")),
                "Bearer realm=\"opledger\", error=\"invalid_token\"",
            ),
            // An empty token (HTTP trims the space): no token at all.
            (Some("Bearer ".to_owned()), "Bearer realm=\"opledger\""),
            (
                Some(format!("Basic {ADMIN_TOKEN}")),
                "Bearer realm=\"opledger\"",
            ),
            (Some(ADMIN_TOKEN.to_owned()), "Bearer realm=\"opledger\""),
        ] {
            let response = world.get_with(route, authorization.as_deref()).await;
            assert_eq!(
                response.status(),
                StatusCode::UNAUTHORIZED,
                "{route} with {authorization:?}"
            );
            assert_eq!(
                response
                    .headers()
                    .get(WWW_AUTHENTICATE)
                    .map(|v| v.to_str().unwrap()),
                Some(challenge),
                "{route} with {authorization:?}"
            );
            let headers = format!("{:?}", response.headers());
            let text = response.text().await.expect("a body");
            for leak in [ADMIN_TOKEN, WRONG_TOKEN] {
                assert!(
                    !text.contains(leak) && !headers.contains(leak),
                    "{route}: {text}"
                );
            }
            let body: Value = serde_json::from_str(&text).expect("a JSON error");
            assert_eq!(body["error"], "unauthorized", "{route}: {body}");
            assert!(
                body["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("Authorization: Bearer")),
                "says how to authenticate: {body}"
            );
            refused += 1;
        }
        // The right token opens it.
        let (status, _) = world.json(route).await;
        assert_eq!(status, StatusCode::OK, "{route} with the token");
    }
    // The document holds no data and needs no token.
    let document = world.get_with("/v1/openapi.json", None).await;
    assert_eq!(document.status(), StatusCode::OK);

    let metrics = scrape(&world).await;
    assert_eq!(
        metrics.value("opledger_api_rejected_tokens_total", &[]),
        f64::from(refused),
        "every refusal is counted"
    );
    world.stop().await;
}

async fn without_a_configured_token_the_api_is_off(backend: Backend) {
    let Some(world) = World::start_with(backend, false).await else {
        return;
    };
    world.ask(1, 7, "spring").await;
    let row = world.operation("spring:7").await;
    for route in concrete_routes(&row.operation_id, &row.stream_id)
        .iter()
        .filter(|r| !r.ends_with("openapi.json"))
    {
        for authorization in [None, Some(format!("Bearer {ADMIN_TOKEN}"))] {
            let response = world.get_with(route, authorization.as_deref()).await;
            assert_eq!(response.status(), StatusCode::NOT_FOUND, "{route}");
            let body: Value = response.json().await.expect("a JSON error");
            assert_eq!(body["error"], "api_disabled", "{route}: {body}");
            assert!(
                body["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("[api] admin_token_env")),
                "says how to turn it on: {body}"
            );
        }
    }
    let document = world.get_with("/v1/openapi.json", None).await;
    assert_eq!(
        document.status(),
        StatusCode::OK,
        "the document is still served"
    );
    world.stop().await;
}

async fn operations_by_id_state_and_user(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    world.ask(1, 7, "spring").await;
    world.work().await;
    world.ask(2, 8, "summer").await;
    world.ask(3, 7, "autumn").await;
    let spring = world.operation("spring:7").await;
    let summer = world.operation("summer:8").await;
    let autumn = world.operation("autumn:7").await;
    assert_eq!(spring.status, "confirmed");
    let as_json = |row: &OperationStatusRow| serde_json::to_value(row).expect("JSON");

    // One by id: the read model's row, field for field.
    let one = world
        .ok(&format!("/v1/operations/{}", spring.operation_id))
        .await;
    assert_eq!(one, as_json(&spring));
    assert_eq!(one["status"], "confirmed");
    assert_eq!(one["external_id"], "cpn_1");

    let keys = |body: &Value| -> Vec<String> {
        body["operations"]
            .as_array()
            .expect("a list")
            .iter()
            .map(|op| op["business_key"].as_str().expect("a key").to_owned())
            .collect()
    };
    let all = world.ok("/v1/operations").await;
    assert_eq!(
        keys(&all),
        ["autumn:7", "summer:8", "spring:7"],
        "newest first"
    );
    assert_eq!(all["limit"], 50);
    assert_eq!(all["operations"][1], as_json(&summer));
    for (query, expected) in [
        ("?state=received", vec!["autumn:7", "summer:8"]),
        ("?state=confirmed", vec!["spring:7"]),
        ("?state=failed", vec![]),
        ("?user_id=7", vec!["autumn:7", "spring:7"]),
        ("?user_id=7&state=received", vec!["autumn:7"]),
        ("?user_id=9", vec![]),
        ("?bot=shop&limit=2", vec!["autumn:7", "summer:8"]),
        ("?bot=other", vec![]),
        (
            "?state=&bot=&user_id=&limit=",
            vec!["autumn:7", "summer:8", "spring:7"],
        ),
    ] {
        let body = world.ok(&format!("/v1/operations{query}")).await;
        assert_eq!(keys(&body), expected, "{query}");
    }
    let capped = world.ok("/v1/operations?limit=100000").await;
    assert_eq!(capped["limit"], 500, "a large limit is capped");
    assert_eq!(
        world
            .ok(&format!("/v1/operations/{}", autumn.operation_id))
            .await,
        as_json(&autumn)
    );
    world.stop().await;
}

async fn events_of_an_operation_and_of_any_stream_page_by_page(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    world.ask(1, 7, "spring").await;
    world.work().await;
    let spring = world.operation("spring:7").await;
    let stream = StreamId::new(spring.stream_id.clone()).unwrap();
    let stored = world
        .app
        .store
        .read_stream(&stream, 1, 1000)
        .await
        .expect("read the stream");
    let types: Vec<&str> = stored.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(
        types[..4],
        ["Received", "Claimed", "ExternalCallSent", "Confirmed"],
        "{types:?}"
    );
    let expected: Vec<Value> = stored
        .iter()
        .map(|e| {
            json!({
                "position": e.position,
                "stream_id": e.stream_id.as_str(),
                "version": e.version,
                "event_id": e.event_id.to_string(),
                "event_type": e.event_type,
                "schema_version": e.schema_version,
                "payload": serde_json::from_slice::<Value>(&e.payload).unwrap(),
                "metadata": serde_json::from_slice::<Value>(&e.metadata).unwrap(),
                "recorded_at": serde_json::to_value(e.recorded_at).unwrap(),
                "prev_hash": e.prev_hash.to_hex(),
                "hash": e.hash.to_hex(),
            })
        })
        .collect();

    let page = world
        .ok(&format!("/v1/operations/{}/events", spring.operation_id))
        .await;
    assert_eq!(page["stream_id"], spring.stream_id.as_str());
    assert_eq!(page["stream_version"], stored.len());
    assert_eq!(page["events"], Value::Array(expected.clone()));
    assert_eq!(page["next_from_version"], Value::Null);
    assert_eq!(page["events"][0]["event_type"], "Received");
    assert_eq!(
        page["events"][0]["payload"]["operation_id"],
        spring.operation_id.as_str()
    );
    assert_eq!(
        page["events"][0]["metadata"]["causation"]["update_id"], 1,
        "who caused it: {}",
        page["events"][0]["metadata"]
    );

    // The same stream by its id, two events at a time.
    let mut from = Some(1);
    let mut seen = Vec::new();
    while let Some(version) = from {
        let page = world
            .ok(&format!(
                "/v1/streams/{}/events?from_version={version}&limit=2",
                spring.stream_id
            ))
            .await;
        let events = page["events"].as_array().expect("events").clone();
        assert!(events.len() <= 2);
        seen.extend(events);
        from = page["next_from_version"].as_u64();
    }
    assert_eq!(seen, expected, "every event once, in order");
    let past_the_end = world
        .ok(&format!(
            "/v1/streams/{}/events?from_version=1000",
            spring.stream_id
        ))
        .await;
    assert_eq!(past_the_end["events"], json!([]));
    assert_eq!(past_the_end["next_from_version"], Value::Null);

    // A delivery's stream.
    let delivery = world.ok("/v1/streams/update-shop-1/events").await;
    assert_eq!(delivery["events"][0]["event_type"], "UpdateReceived");
    assert_eq!(delivery["events"][0]["stream_id"], "update-shop-1");
    world.stop().await;
}

async fn bad_parameters_are_refused_naming_the_parameter(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    world.ask(1, 7, "spring").await;
    let row = world.operation("spring:7").await;
    let id = &row.operation_id;
    let long_stream = "x".repeat(300);
    let cases: Vec<(String, &str, &str)> = vec![
        (
            "/v1/operations?state=bogus".into(),
            "state",
            "unknown state `bogus`; use one of received",
        ),
        (
            "/v1/operations?user_id=seven".into(),
            "user_id",
            "must be an integer",
        ),
        (
            "/v1/operations?limit=0".into(),
            "limit",
            "must be an integer from 1 to 500",
        ),
        (
            "/v1/operations?limit=-5".into(),
            "limit",
            "must be an integer from 1 to 500",
        ),
        ("/v1/operations?limit=ten".into(), "limit", "not `ten`"),
        (
            "/v1/operations?bot=Shop!".into(),
            "bot",
            "is not a bot name",
        ),
        (
            "/v1/operations?status=failed".into(),
            "status",
            "unknown query parameter; this route takes state, bot, user_id, limit",
        ),
        (
            "/v1/operations?limit=1&limit=2".into(),
            "limit",
            "given more than once",
        ),
        (
            "/v1/operations/not-a-uuid".into(),
            "id",
            "is not an operation id",
        ),
        (
            "/v1/operations/not-a-uuid/events".into(),
            "id",
            "is not an operation id",
        ),
        (
            format!("/v1/operations/{id}?limit=1"),
            "limit",
            "this route takes wait",
        ),
        (
            format!("/v1/operations/{id}/events?from_version=0"),
            "from_version",
            "must be an integer from 1",
        ),
        (
            format!("/v1/operations/{id}/events?from_version=first"),
            "from_version",
            "not `first`",
        ),
        (
            format!("/v1/streams/{}/events?limit=many", row.stream_id),
            "limit",
            "from 1 to 1000",
        ),
        (
            format!("/v1/streams/{long_stream}/events"),
            "stream_id",
            "is not a stream id",
        ),
        (
            "/v1/reconciliation?limit=0".into(),
            "limit",
            "from 1 to 1000",
        ),
        (
            "/v1/reconciliation?state=x".into(),
            "state",
            "this route takes limit",
        ),
        (
            "/v1/projections?limit=5".into(),
            "limit",
            "this route takes no query parameters",
        ),
    ];
    for (path, parameter, says) in cases {
        let (status, body) = world.json(&path).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        assert_eq!(body["error"], "bad_parameter", "{path}: {body}");
        assert_eq!(body["parameter"], parameter, "{path}: {body}");
        let message = body["message"].as_str().expect("a message");
        assert!(
            message.starts_with(&format!("parameter `{parameter}`: ")) && message.contains(says),
            "{path}: {message}"
        );
    }
    world.stop().await;
}

async fn unknown_ids_and_routes_are_404(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    world.ask(1, 7, "spring").await;
    let unknown = "00000000-0000-5000-8000-000000000000";
    for (path, says) in [
        (
            format!("/v1/operations/{unknown}"),
            format!("no operation has the id `{unknown}`"),
        ),
        (
            format!("/v1/operations/{unknown}/events"),
            format!("no operation has the id `{unknown}`"),
        ),
        (
            "/v1/streams/op-coupon-never:1/events".to_owned(),
            "no stream is named `op-coupon-never:1`".to_owned(),
        ),
        (
            "/v1/nothing".to_owned(),
            "no route `GET /v1/nothing`".to_owned(),
        ),
        ("/v1".to_owned(), "no route `GET /v1`".to_owned()),
    ] {
        let (status, body) = world.json(&path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
        assert_eq!(body["error"], "not_found", "{path}: {body}");
        assert!(
            body["message"].as_str().is_some_and(|m| m.contains(&says)),
            "{path}: {body}"
        );
    }
    world.stop().await;
}

async fn the_reconciliation_queue_shows_waiting_operations_with_their_age(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    // The service creates the coupon, then fails: the outcome is unknown, and without a key it
    // honours or a lookup, a person must decide.
    world.service.script([Behaviour::CreateThenFail(500)]);
    world.ask(1, 7, "spring").await;
    world.work().await;
    world.ask(2, 8, "summer").await;
    let waiting = world.operation("spring:7").await;
    assert_eq!(waiting.status, "needs_reconciliation");
    world.caught_up().await;
    let checkpoint = world.app.store.head().await.expect("head").position;

    let queue = world.ok("/v1/reconciliation").await;
    assert_eq!(queue["limit"], 100);
    assert_eq!(queue["checkpoint"], checkpoint);
    let operations = queue["operations"].as_array().expect("a list");
    assert_eq!(operations.len(), 1, "only the waiting operation: {queue}");
    let item = &operations[0];
    assert_eq!(item["operation_id"], waiting.operation_id.as_str());
    assert_eq!(item["stream_id"], waiting.stream_id.as_str());
    assert_eq!(item["action"], "coupon");
    assert_eq!(item["business_key"], "spring:7");
    assert_eq!(item["bot"], "shop");
    assert_eq!(item["chat_id"], 7);
    assert_eq!(item["user_id"], 7);
    assert_eq!(item["attempts"], 1);
    assert_eq!(
        item["reason"],
        waiting.last_error.clone().expect("a reason").as_str()
    );
    let marked_at: DateTime<Utc> =
        serde_json::from_value(item["marked_at"].clone()).expect("a time");
    let age = |now: DateTime<Utc>| (now - marked_at).num_microseconds().unwrap() as f64 / 1e6;
    assert_eq!(item["age_secs"].as_f64(), Some(age(world.app.clock.now())));

    // The age is computed when read.
    world.app.clock.advance(TimeDelta::seconds(100));
    let later = world.ok("/v1/reconciliation?limit=5").await;
    assert_eq!(later["limit"], 5);
    let aged = later["operations"][0]["age_secs"].as_f64().expect("an age");
    assert_eq!(aged, age(world.app.clock.now()));
    assert!(aged >= 100.0, "{aged}");
    world.stop().await;
}

async fn projections_show_their_checkpoint_and_lag(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    world.ask(1, 7, "spring").await;
    world.ask(2, 8, "summer").await;
    world.caught_up().await;
    let head = world.app.store.head().await.expect("head").position;
    let body = world.ok("/v1/projections").await;
    assert_eq!(body["head"], head);
    let listed: BTreeMap<String, Value> = body["projections"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|p| (p["name"].as_str().expect("a name").to_owned(), p.clone()))
        .collect();
    let names: BTreeSet<&str> = listed.keys().map(String::as_str).collect();
    let mut expected: BTreeSet<&str> = ASYNC_PROJECTIONS.iter().copied().collect();
    expected.insert("operation_status");
    expected.insert("forward_queue");
    assert_eq!(names, expected);
    for (name, projection) in &listed {
        assert_eq!(projection["state"], "active", "{name}");
        assert_eq!(projection["checkpoint"], head, "{name}");
        assert_eq!(projection["head"], head, "{name}");
        assert_eq!(projection["lag"], 0, "{name}");
        assert_eq!(projection["stalled"], false, "{name}");
        assert_eq!(
            projection["inline"],
            name == "operation_status" || name == "forward_queue",
            "{name}"
        );
        assert_eq!(
            projection["definition_hash"].as_str().map(str::len),
            Some(64),
            "{name}: {projection}"
        );
    }
    world.stop().await;
}

async fn the_openapi_document_parses_and_describes_every_route(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    world.ask(1, 7, "spring").await;
    world.caught_up().await;
    let row = world.operation("spring:7").await;

    let response = world.get_with("/v1/openapi.json", None).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response
            .headers()
            .get(CONTENT_TYPE)
            .map(|v| v.to_str().unwrap()),
        Some("application/json")
    );
    let text = response.text().await.expect("a body");
    let spec = oas3::from_json(&text).expect("an OpenAPI 3.1 document");
    spec.validate_version()
        .expect("a supported OpenAPI version");
    assert!(spec.openapi.starts_with("3."), "{}", spec.openapi);
    let paths = spec.paths.clone().expect("paths");
    let documented: BTreeSet<&str> = paths.keys().map(String::as_str).collect();
    let routed: BTreeSet<&str> = ROUTES.iter().chain(POST_ROUTES).copied().collect();
    assert_eq!(
        documented, routed,
        "every route is documented, and only those"
    );

    let schemes = &spec
        .components
        .as_ref()
        .expect("components")
        .security_schemes;
    let scheme = serde_json::to_value(schemes.get("admin_token").expect("the admin_token scheme"))
        .expect("JSON");
    assert_eq!(
        (&scheme["type"], &scheme["scheme"]),
        (&json!("http"), &json!("bearer")),
        "{scheme}"
    );

    let mut operation_ids = BTreeSet::new();
    for (path, item) in &paths {
        let methods: Vec<_> = item.methods().into_iter().collect();
        let names: Vec<&str> = methods.iter().map(|(m, _)| m.as_str()).collect();
        let expected: &[&str] = if path == "/v1/operations" {
            &["GET", "POST"]
        } else if POST_ROUTES.contains(&path.as_str()) {
            &["POST"]
        } else {
            &["GET"]
        };
        assert_eq!(names, expected, "{path}: its methods");
        for (method, operation) in &methods {
            let id = operation.operation_id.clone().expect("an operation id");
            assert!(operation_ids.insert(id), "{path}: a unique operation id");
            let responses = operation.responses(&spec);
            let security = serde_json::to_value(&operation.security).expect("JSON");
            // The operations API: a client's token opens it too.
            let for_clients = (method.as_str() == "POST" && path != RESOLUTION)
                || path == "/v1/operations/{id}"
                || path == "/v1/operations/{id}/events";
            let statuses: &[&str] = if path == "/v1/buttons" {
                &["201", "400", "401", "404", "503"]
            } else if path == RESOLUTION {
                &["200", "400", "401", "403", "404", "409", "503"]
            } else if method.as_str() == "POST" {
                &["200", "201", "400", "401", "404", "409", "503"]
            } else {
                &["200", "400", "401", "404", "503"]
            };
            if path == "/v1/openapi.json" {
                assert_eq!(security, json!([]), "{path} needs no token");
                assert!(responses.contains_key("200"), "{path}: 200 documented");
            } else {
                let schemes = if for_clients {
                    json!([{"admin_token": []}, {"client_token": []}])
                } else {
                    json!([{"admin_token": []}])
                };
                assert_eq!(security, schemes, "{method} {path}");
                for status in statuses {
                    assert!(
                        responses.contains_key(*status),
                        "{method} {path}: {status} documented"
                    );
                }
            }
            // Every parameter in the path is declared, and every schema reference resolves.
            for parameter in operation.parameters(&spec).expect("parameters resolve") {
                if matches!(parameter.location, oas3::spec::ParameterIn::Path) {
                    assert!(path.contains(&format!("{{{}}}", parameter.name)), "{path}");
                }
            }
            for (status, response) in &responses {
                for (media, content) in &response.content {
                    if let Some(schema) = &content.schema {
                        schema
                            .resolve(&spec)
                            .unwrap_or_else(|e| panic!("{path} {status} {media}: {e}"));
                    }
                }
            }
        }
        // And the documented path is served (a POST-only one is driven by operations_api.rs).
        if POST_ROUTES.contains(&path.as_str()) {
            continue;
        }
        let concrete = path
            .replace("{id}", &row.operation_id)
            .replace("{stream_id}", &row.stream_id);
        let (status, body) = world.json(&concrete).await;
        assert_eq!(status, StatusCode::OK, "{concrete}: {body}");
    }
    assert_eq!(
        serde_json::from_str::<Value>(&text).expect("JSON"),
        serde_json::to_value(opledger_server::api::openapi()).expect("JSON"),
        "the served document is the library's"
    );
    world.stop().await;
}

/// One scrape, parsed.
struct Scrape {
    text: String,
    /// Sample name and its labels, sorted, to value.
    samples: BTreeMap<(String, Vec<(String, String)>), f64>,
}

impl Scrape {
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let mut labels: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        labels.sort();
        *self
            .samples
            .get(&(name.to_owned(), labels.clone()))
            .unwrap_or_else(|| panic!("no sample {name}{labels:?} in:\n{}", self.text))
    }
}

async fn scrape(world: &World) -> Scrape {
    let response = world.get_with("/metrics", None).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response
            .headers()
            .get(CONTENT_TYPE)
            .map(|v| v.to_str().unwrap()),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    let text = response.text().await.expect("a body");
    let samples = parse_openmetrics(&text);
    Scrape { text, samples }
}

/// Parses the OpenMetrics text format strictly: every line is a `# HELP`, `# TYPE` or `# UNIT`
/// of a family named once, or a sample of the family declared before it, and `# EOF` ends it.
fn parse_openmetrics(text: &str) -> BTreeMap<(String, Vec<(String, String)>), f64> {
    fn valid_name(name: &str) -> bool {
        let mut chars = name.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }
    let body = text
        .strip_suffix("# EOF\n")
        .unwrap_or_else(|| panic!("ends with `# EOF`:\n{text}"));
    let mut families: HashMap<String, String> = HashMap::new();
    let mut current: Option<(String, String)> = None;
    let mut samples = BTreeMap::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (keyword, name, value) = (
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
            );
            assert!(valid_name(name), "a metric name: {line}");
            match keyword {
                "TYPE" => {
                    assert!(
                        [
                            "counter",
                            "gauge",
                            "info",
                            "stateset",
                            "histogram",
                            "summary",
                            "unknown"
                        ]
                        .contains(&value),
                        "a type: {line}"
                    );
                    assert!(
                        families.insert(name.to_owned(), value.to_owned()).is_none(),
                        "declared once: {line}"
                    );
                    current = Some((name.to_owned(), value.to_owned()));
                }
                "HELP" => assert!(!value.is_empty(), "help text: {line}"),
                "UNIT" => assert!(name.ends_with(&format!("_{value}")), "unit suffix: {line}"),
                _ => panic!("an unknown descriptor: {line}"),
            }
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("a sample: {line}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("a number: {line}"));
        let (name, labels) = match series.split_once('{') {
            None => (series, Vec::new()),
            Some((name, rest)) => {
                let inner = rest
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("closed labels: {line}"));
                let mut labels = Vec::new();
                for pair in inner.split(',') {
                    let (key, quoted) = pair
                        .split_once('=')
                        .unwrap_or_else(|| panic!("a label: {line}"));
                    assert!(valid_name(key), "a label name: {line}");
                    let value = quoted
                        .strip_prefix('"')
                        .and_then(|v| v.strip_suffix('"'))
                        .unwrap_or_else(|| panic!("a quoted label value: {line}"));
                    labels.push((key.to_owned(), value.to_owned()));
                }
                labels.sort();
                (name, labels)
            }
        };
        let (family, kind) = current
            .as_ref()
            .unwrap_or_else(|| panic!("a sample after its TYPE: {line}"));
        let expected: Vec<String> = match kind.as_str() {
            "counter" => vec![format!("{family}_total"), format!("{family}_created")],
            "histogram" => ["bucket", "sum", "count"]
                .map(|suffix| format!("{family}_{suffix}"))
                .to_vec(),
            _ => vec![family.clone()],
        };
        assert!(
            expected.iter().any(|expected| expected == name),
            "{name} belongs to {family} ({kind})"
        );
        assert!(
            samples.insert((name.to_owned(), labels), value).is_none(),
            "one sample per series: {line}"
        );
    }
    for family in families.keys() {
        assert!(family.starts_with("opledger_"), "{family} has the prefix");
    }
    samples
}

async fn metrics_are_openmetrics_text_with_the_known_counts(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    world.ask(1, 7, "spring").await;
    world.work().await;
    world.ask(2, 8, "summer").await;
    world.ask(3, 9, "autumn").await;
    // Telegram delivers update 2 again, and someone without the secret knocks twice.
    world
        .app
        .deliver(message_from(2, 1_790_000_000, 8, "/coupon summer"))
        .await;
    for secret in [None, Some("not-the-secret")] {
        let response = world
            .app
            .deliver_with_secret(secret, message_from(9, 1_790_000_000, 9, "/coupon x"))
            .await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    }

    world.caught_up().await;
    let head = world.app.store.head().await.expect("head").position;
    let metrics = scrape(&world).await;
    for canary in [ADMIN_TOKEN, SECRET, TOKEN, "summer", "autumn"] {
        assert!(
            !metrics.text.contains(canary),
            "`{canary}` in:\n{}",
            metrics.text
        );
    }
    assert_eq!(metrics.value("opledger_storage_readable", &[]), 1.0);
    assert_eq!(
        metrics.value("opledger_webhook_rejected_secrets_total", &[]),
        2.0
    );
    assert_eq!(
        metrics.value("opledger_duplicate_deliveries_total", &[]),
        1.0
    );
    assert_eq!(
        metrics.value("opledger_intake_updates_total", &[("outcome", "duplicate")]),
        1.0
    );
    assert_eq!(
        metrics.value("opledger_intake_updates_total", &[("outcome", "accepted")]),
        3.0
    );
    assert_eq!(
        metrics.value("opledger_intake_updates_total", &[("outcome", "collision")]),
        0.0
    );
    assert_eq!(
        metrics.value("opledger_operations", &[("state", "received")]),
        2.0
    );
    assert_eq!(
        metrics.value("opledger_operations", &[("state", "confirmed")]),
        1.0
    );
    assert_eq!(
        metrics.value("opledger_operations", &[("state", "failed")]),
        0.0
    );
    assert_eq!(
        metrics.value("opledger_reconciliation_queue_operations", &[]),
        0.0
    );
    assert_eq!(
        metrics.value("opledger_update_id_collisions_total", &[]),
        0.0
    );
    assert_eq!(metrics.value("opledger_key_conflicts_total", &[]), 0.0);
    assert_eq!(metrics.value("opledger_quarantined_bodies_total", &[]), 0.0);
    assert_eq!(
        metrics.value("opledger_transitions_rejected_total", &[]),
        0.0
    );
    assert_eq!(
        metrics.value("opledger_ledger_head_position", &[]),
        head as f64
    );
    assert_eq!(
        metrics.value("opledger_oldest_claimed_operation_age_seconds", &[]),
        0.0
    );
    let pending = metrics.value("opledger_oldest_pending_operation_age_seconds", &[]);
    assert!(pending > 0.0, "two operations wait: {pending}");
    for name in [
        "operation_status",
        "audit_trail",
        "reconciliation_queue",
        "user_operations",
        "metrics",
    ] {
        let labels = [("projection", name), ("state", "active")];
        assert_eq!(
            metrics.value("opledger_projection_lag_events", &labels),
            0.0,
            "{name}"
        );
        assert_eq!(
            metrics.value("opledger_projection_checkpoint_position", &labels),
            head as f64,
            "{name}"
        );
    }
    for histogram in [
        "opledger_append_wait_seconds",
        "opledger_append_write_seconds",
    ] {
        assert_append_histogram(&metrics, histogram);
    }
    let count =
        |metrics: &Scrape, histogram: &str| metrics.value(&format!("{histogram}_count"), &[]);

    let batches = |metrics: &Scrape| metrics.value("opledger_append_batches_total", &[]);
    assert!(
        (1.0..=count(&metrics, "opledger_append_wait_seconds")).contains(&batches(&metrics)),
        "a batch holds one append or more"
    );

    // One more update is one more append call, waited for and written once, in one batch of
    // its own (nothing else appends meanwhile).
    world.ask(4, 10, "winter").await;
    let after = scrape(&world).await;
    assert_eq!(batches(&after), batches(&metrics) + 1.0);
    for histogram in [
        "opledger_append_wait_seconds",
        "opledger_append_write_seconds",
    ] {
        assert_append_histogram(&after, histogram);
        assert_eq!(
            count(&after, histogram),
            count(&metrics, histogram) + 1.0,
            "{histogram}"
        );
    }
    world.stop().await;
}

/// An append histogram as Prometheus reads one: cumulative buckets ending in `+Inf`, which
/// holds every value counted, with a positive sum of them once any was.
fn assert_append_histogram(metrics: &Scrape, histogram: &str) {
    let count = metrics.value(&format!("{histogram}_count"), &[]);
    assert!(
        count >= 4.0,
        "{histogram}: the four updates' appends at least: {count}"
    );
    let bucket = |le: &str| metrics.value(&format!("{histogram}_bucket"), &[("le", le)]);
    assert_eq!(bucket("+Inf"), count, "{histogram}");
    let mut previous = 0.0;
    for le in ["0.001", "0.01", "0.1", "1.0", "2.5", "+Inf"] {
        let cumulative = bucket(le);
        assert!(cumulative >= previous, "{histogram}: {le} is cumulative");
        previous = cumulative;
    }
    let sum = metrics.value(&format!("{histogram}_sum"), &[]);
    assert!(sum >= 0.0, "{histogram}: {sum}");
    if histogram.ends_with("write_seconds") {
        assert!(sum > 0.0, "a write takes time: {sum}");
    }
}

async fn readyz_is_200_normally_and_503_when_storage_is_closed(backend: Backend) {
    let Some(mut world) = World::start(backend).await else {
        return;
    };
    let healthz = world.get_with("/healthz", None).await;
    assert_eq!(healthz.status(), StatusCode::OK);
    world.ask(1, 7, "spring").await;
    world
        .app
        .deliver_with_secret(None, message_from(2, 1_790_000_000, 7, "/coupon x"))
        .await;
    world.caught_up().await;
    let ready = world.get_with("/readyz", None).await;
    assert_eq!(ready.status(), StatusCode::OK);
    assert_eq!(
        ready.json::<Value>().await.expect("JSON"),
        json!({"ready": true, "problems": []})
    );

    world.app.stop_projections().await;
    world.app.store.close().await;
    let down = world.get_with("/readyz", None).await;
    assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = down.json().await.expect("JSON");
    assert_eq!(body["ready"], false);
    let problems = body["problems"].as_array().expect("problems");
    assert_eq!(problems.len(), 1, "{body}");
    assert!(
        problems[0]
            .as_str()
            .is_some_and(|p| p.starts_with("storage unreachable: ")),
        "{body}"
    );
    let alive = world.get_with("/healthz", None).await;
    assert_eq!(alive.status(), StatusCode::OK, "the process is still up");
    // The metrics still come, with the process's own counters, and say storage is unreadable.
    let metrics = scrape(&world).await;
    assert_eq!(metrics.value("opledger_storage_readable", &[]), 0.0);
    assert_eq!(
        metrics.value("opledger_webhook_rejected_secrets_total", &[]),
        1.0
    );
    assert!(
        !metrics.text.contains("opledger_ledger_head_position"),
        "nothing read from storage is made up:\n{}",
        metrics.text
    );
    world.stop().await;
}

async fn readyz_is_503_while_a_projection_is_stalled(backend: Backend) {
    let Some(mut world) = World::start(backend).await else {
        return;
    };
    // The runner dies; updates keep coming.
    world.app.stop_projections().await;
    world.ask(1, 7, "spring").await;
    let ready = world.get_with("/readyz", None).await;
    assert_eq!(
        ready.status(),
        StatusCode::OK,
        "lag that is seconds old is not a stall: {}",
        ready.text().await.unwrap_or_default()
    );

    world.app.clock.advance(TimeDelta::seconds(61));
    let stalled = world.get_with("/readyz", None).await;
    assert_eq!(stalled.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = stalled.json().await.expect("JSON");
    let problems: Vec<&str> = body["problems"]
        .as_array()
        .expect("problems")
        .iter()
        .map(|p| p.as_str().expect("text"))
        .collect();
    assert_eq!(problems.len(), ASYNC_PROJECTIONS.len(), "{body}");
    for name in ASYNC_PROJECTIONS {
        assert!(
            problems.iter().any(
                |p| p.starts_with(&format!("projection {name} v1 is stalled: 2 events behind"))
            ),
            "{name} in {problems:?}"
        );
    }
    let listed = world.ok("/v1/projections").await;
    for projection in listed["projections"].as_array().expect("a list") {
        let inline = projection["inline"] == true;
        assert_eq!(projection["stalled"], !inline, "{projection}");
    }

    // A runner comes back and catches up: ready again.
    world.run_projections();
    world.caught_up().await;
    let ready = world.get_with("/readyz", None).await;
    assert_eq!(ready.status(), StatusCode::OK);
    world.stop().await;
}

/// PostgreSQL stopped under a running service: `/readyz` says storage is unreachable, within
/// its time limit, and is ready again once the server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readyz_follows_a_postgres_server_that_stops_and_returns() {
    let Some(cluster) = tokio::task::spawn_blocking(PrivateCluster::start)
        .await
        .expect("the cluster task")
        .map(Arc::new)
    else {
        return;
    };
    let world = World::on(Ledger::Url(cluster.url()), true).await;
    assert_eq!(
        world.get_with("/readyz", None).await.status(),
        StatusCode::OK
    );

    let stop = cluster.clone();
    tokio::task::spawn_blocking(move || stop.stop())
        .await
        .expect("stop PostgreSQL");
    let started = std::time::Instant::now();
    let down = world.get_with("/readyz", None).await;
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "answered within its limit: {:?}",
        started.elapsed()
    );
    assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = down.json().await.expect("JSON");
    assert!(
        body["problems"][0]
            .as_str()
            .is_some_and(|p| p.starts_with("storage unreachable")),
        "{body}"
    );
    let (status, error) = world.json("/v1/operations").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{error}");
    assert_eq!(error["error"], "unavailable");

    let start = cluster.clone();
    tokio::task::spawn_blocking(move || start.start_server())
        .await
        .expect("start PostgreSQL");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let status = world.get_with("/readyz", None).await.status();
        if status == StatusCode::OK {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "ready again: {status}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    world.stop().await;
}

/// The real binary, logging at trace level, never writes the admin token (nor a wrong one a
/// client sent) to its output, and its read API works with the token from the environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_admin_token_never_reaches_the_logs() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let ledger = dir.path().join("ledger.db");
    let path = write_config(
        dir.path(),
        "api.toml",
        &format!(
            "[storage]\nurl = \"sqlite://{}\"\n[server]\nlisten = \"127.0.0.1:0\"\n\
             [api]\nadmin_token_env = \"OPLEDGER_ADMIN_TOKEN\"\n",
            ledger.display()
        ),
    );
    let mut command = opledger(&[
        ("OPLEDGER_ADMIN_TOKEN", ADMIN_TOKEN),
        ("OPLEDGER_LOG", "trace"),
    ]);
    command.arg("--config").arg(&path);
    let mut serving = Serving::start(command);
    let address = serving.address().await;
    let http = reqwest::Client::new();
    let get = |path: &str, token: Option<&str>| {
        let mut request = http.get(format!("http://{address}{path}"));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send()
    };
    let right = get("/v1/operations", Some(ADMIN_TOKEN))
        .await
        .expect("answer");
    assert_eq!(right.status(), StatusCode::OK);
    let body: Value = right.json().await.expect("JSON");
    assert_eq!(body["operations"], json!([]));
    for token in [None, Some(WRONG_TOKEN)] {
        let refused = get("/v1/projections", token).await.expect("answer");
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    }
    assert_eq!(
        get("/readyz", None).await.expect("answer").status(),
        StatusCode::OK
    );
    let metrics = get("/metrics", None).await.expect("answer");
    assert_eq!(metrics.status(), StatusCode::OK);
    let text = metrics.text().await.expect("text");
    assert!(
        text.contains("opledger_api_rejected_tokens_total 2"),
        "{text}"
    );

    let status = serving.terminate().await;
    assert_eq!(status.code(), Some(0), "stderr: {}", serving.stderr());
    let (out, err) = (serving.stdout(), serving.stderr());
    assert!(
        err.contains("DEBUG"),
        "the logs were verbose, so their silence means something: {err}"
    );
    assert!(
        err.contains("read API request refused"),
        "the refusals were logged"
    );
    for (place, output) in [("stdout", &out), ("stderr", &err)] {
        for canary in [ADMIN_TOKEN, WRONG_TOKEN, "CANARY"] {
            assert!(
                !output.contains(canary),
                "{place} contains `{canary}`:\n{output}"
            );
        }
    }
}

/// Issue 15 D11 (and D5 at the parameter layer): what the OpenAPI document declares about a
/// parameter is what the API does. `limit` is 1 to 4294967295 (values above a route's maximum
/// are capped), `from_version` 1 to 2^63 - 1 (a larger one used to panic in the store and drop
/// the connection), `{id}` a UUID; outside those, a JSON 400 naming the parameter.
async fn the_documented_bounds_of_parameters_are_the_enforced_ones(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    world.ask(1, 7, "spring").await;
    world.caught_up().await;
    let row = world.operation("spring:7").await;
    let text = world
        .get_with("/v1/openapi.json", None)
        .await
        .text()
        .await
        .expect("a body");
    let document: Value = serde_json::from_str(&text).expect("JSON");
    let parameter = |path: &str, name: &str| -> Value {
        document["paths"][path]["get"]["parameters"]
            .as_array()
            .expect("parameters")
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("{path} declares {name}"))["schema"]
            .clone()
    };
    for path in [
        "/v1/operations",
        "/v1/operations/{id}/events",
        "/v1/streams/{stream_id}/events",
        "/v1/reconciliation",
    ] {
        let limit = parameter(path, "limit");
        assert_eq!(
            (&limit["minimum"], &limit["maximum"]),
            (&json!(1), &json!(4_294_967_295_u64)),
            "{path}: {limit}"
        );
    }
    for path in [
        "/v1/operations/{id}/events",
        "/v1/streams/{stream_id}/events",
    ] {
        let from = parameter(path, "from_version");
        assert_eq!(
            (&from["minimum"], &from["maximum"]),
            (&json!(1), &json!(i64::MAX)),
            "{path}: {from}"
        );
    }
    for path in ["/v1/operations/{id}", "/v1/operations/{id}/events"] {
        assert_eq!(parameter(path, "id")["format"], "uuid", "{path}");
    }

    let events = format!("/v1/operations/{}/events", row.operation_id);
    let stream = format!("/v1/streams/{}/events", row.stream_id);
    for path in [&events, &stream] {
        for (query, parameter) in [
            ("from_version=9223372036854775808", "from_version"),
            ("from_version=18446744073709551615", "from_version"),
            ("from_version=0", "from_version"),
            ("limit=4294967296", "limit"),
            ("limit=0", "limit"),
        ] {
            let (status, body) = world.json(&format!("{path}?{query}")).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{path}?{query}: {body}");
            assert_eq!(body["error"], "bad_parameter", "{path}?{query}: {body}");
            assert_eq!(body["parameter"], parameter, "{path}?{query}: {body}");
        }
        let last = world
            .ok(&format!(
                "{path}?from_version=9223372036854775807&limit=4294967295"
            ))
            .await;
        assert_eq!(last["events"], json!([]), "{path}: past the end is empty");
    }
    let capped = world.ok("/v1/operations?limit=4294967295").await;
    assert_eq!(capped["limit"], 500);
    let (status, body) = world.json("/v1/operations?limit=4294967296").await;
    assert_eq!(
        (status, &body["parameter"]),
        (StatusCode::BAD_REQUEST, &json!("limit"))
    );
    world.stop().await;
}
