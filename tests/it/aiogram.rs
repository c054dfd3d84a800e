//! opledger in front of a real bot framework (issue 12, "Tests with a real bot framework"): the
//! example aiogram 3 bot (`examples/aiogram-bot`) in webhook mode behind the real `opledger serve`
//! (`[bots.forward]`), talking to the fake Bot API, with a fake CRM as the `lead` action's
//! effector, on both backends. Deliveries are sent as Telegram sends them; what aiogram saw is
//! read from the bot's own record (one line per request, with opledger's headers), what was
//! said to users from the fake Bot API, and what happened from the ledger through `/v1`.
//!
//! Skipped (with a message) without `OPLEDGER_TEST_AIOGRAM_PYTHON`, failed under CI.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::support::aiogram::{AiogramBot, BotSettings, Received, free_port, python};
use crate::support::app::{Backend, Ledger, SECRET, TOKEN, click, message_from, on_both_backends};
use crate::support::fake_service::FakeService;
use crate::support::fake_telegram::FakeTelegram;
use crate::support::serving::{PATIENCE, Serving, deliver, opledger, write_config};

const ADMIN_TOKEN: &str = "CANARY-admin-token_0123456789abcdef";
/// The aiogram bot's client token (`[[api.clients]]` for bot `shop`).
const SHOP_CLIENT: &str = "CANARY-shop-client_0123456789abcdef";
/// Another bot's handlers.
const OTHER_CLIENT: &str = "CANARY-other-client_0123456789abcdef";
/// What opledger presents to the bot as `X-Telegram-Bot-Api-Secret-Token`.
const UPSTREAM_SECRET: &str = "upstream-secret_0123456789";
/// How the bot answers `/start`.
const GREETING: &str = "Hello! Send /lead NAME to leave your contact, or /offer for a call back.";

/// How a test wants its world.
#[derive(Debug, Clone, Copy)]
struct Options {
    /// `[bots.forward] give_up_after_secs`.
    give_up_after_secs: u64,
    /// The bot waits this long before answering each request.
    answer_delay_ms: u64,
    /// Whether the bot runs from the start.
    bot_running: bool,
    /// Crash points armed in the first `opledger serve`.
    failpoints: Option<&'static str>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            give_up_after_secs: 600,
            answer_delay_ms: 0,
            bot_running: true,
            failpoints: None,
        }
    }
}

/// A ledger, the fake Bot API, the fake CRM, the aiogram bot and `opledger serve` in front of it.
struct World {
    _ledger: Ledger,
    telegram: FakeTelegram,
    crm: FakeService,
    bot: AiogramBot,
    opledger: Serving,
    address: SocketAddr,
    config: String,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

/// Starts `opledger serve` with the configuration file `config` and the secrets it names,
/// `failpoints` armed when given; checks that it serves on `address`.
async fn serve(config: &str, address: SocketAddr, failpoints: Option<&str>) -> Serving {
    let mut env = vec![
        ("OPLEDGER_CONFIG", config),
        ("BOT_TOKEN", TOKEN),
        ("BOT_SECRET", SECRET),
        ("UPSTREAM_SECRET", UPSTREAM_SECRET),
        ("ADMIN_TOKEN", ADMIN_TOKEN),
        ("SHOP_CLIENT", SHOP_CLIENT),
        ("OTHER_CLIENT", OTHER_CLIENT),
        ("OPLEDGER_TEST_WORKER_MS", "50"),
    ];
    if let Some(failpoints) = failpoints {
        env.push(("FAILPOINTS", failpoints));
    }
    let mut serving = Serving::start(opledger(&env));
    assert_eq!(serving.address().await, address, "serving where configured");
    serving
}

impl World {
    async fn start(backend: Backend, options: Options) -> Option<World> {
        let python = python()?;
        let ledger = Ledger::create(backend).await?;
        let telegram = FakeTelegram::start(TOKEN).await;
        let crm = FakeService::start(false).await;
        let dir = tempfile::tempdir().expect("a directory");
        let address = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut bot = AiogramBot::new(
            python,
            dir.path(),
            BotSettings {
                token: TOKEN.to_owned(),
                secret: UPSTREAM_SECRET.to_owned(),
                opledger_url: format!("http://{address}"),
                client_token: SHOP_CLIENT.to_owned(),
                telegram_base: telegram.base_url(),
                answer_delay_ms: options.answer_delay_ms,
            },
        );
        if options.bot_running {
            bot.spawn();
        }
        let text = format!(
            "[storage]\nurl = \"{ledger}\"\n\
             [server]\nlisten = \"{address}\"\nrequest_timeout_ms = 10000\n\
             [api]\nadmin_token_env = \"ADMIN_TOKEN\"\n\
             [[api.clients]]\nname = \"shop_bot\"\nbot = \"shop\"\ntoken_env = \"SHOP_CLIENT\"\n\
             [[api.clients]]\nname = \"other_bot\"\nbot = \"other\"\ntoken_env = \"OTHER_CLIENT\"\n\
             [[bots]]\nname = \"shop\"\ntoken_env = \"BOT_TOKEN\"\n\
             webhook_secret_env = \"BOT_SECRET\"\napi_base_url = \"{telegram}\"\n\
             [bots.forward]\nurl = \"{forward}\"\nsecret_env = \"UPSTREAM_SECRET\"\n\
             updates = \"unhandled\"\ntimeout_ms = 5000\ngive_up_after_secs = {give_up}\n\
             [[bots]]\nname = \"other\"\ntoken_env = \"BOT_TOKEN\"\n\
             webhook_secret_env = \"BOT_SECRET\"\napi_base_url = \"{telegram}\"\n\
             [[actions]]\nname = \"lead\"\nbot = \"shop\"\ncommand = \"crm_lead\"\n\
             params = [\"name\"]\nkey = \"{{name}}:{{user_id}}\"\n\
             [actions.effector]\nurl = \"{crm}\"\ntimeout_ms = 300\nlookup_url = \"{lookup}\"\n\
             [actions.reply]\nconfirmed = \"Thanks, {{name}}: we will call you back.\"\n\
             [[actions]]\nname = \"other_lead\"\nbot = \"other\"\ncommand = \"lead\"\n\
             params = [\"name\"]\nkey = \"{{name}}:{{user_id}}\"\n\
             [actions.effector]\nurl = \"{crm}\"\ntimeout_ms = 300\n",
            ledger = ledger.url(),
            telegram = telegram.base_url(),
            forward = bot.webhook_url(),
            give_up = options.give_up_after_secs,
            crm = crm.leads_url(),
            lookup = crm.leads_lookup_url(),
        );
        let config = write_config(dir.path(), "opledger.toml", &text)
            .to_str()
            .expect("a UTF-8 path")
            .to_owned();
        let serving = serve(&config, address, options.failpoints).await;
        let mut world = World {
            _ledger: ledger,
            telegram,
            crm,
            bot,
            opledger: serving,
            address,
            config,
            http: reqwest::Client::new(),
            _dir: dir,
        };
        if options.bot_running {
            world.bot.ready().await;
        }
        Some(world)
    }

    /// Starts `opledger serve` again on the same ledger and address (after it died).
    async fn restart(&mut self) {
        self.opledger = serve(&self.config, self.address, None).await;
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    /// Delivers an update and expects it acknowledged.
    async fn acknowledged(&self, update: &[u8]) {
        assert_eq!(
            deliver(self.address, update).await,
            Some(200),
            "Telegram's delivery is acknowledged"
        );
    }

    /// The status and JSON body of a GET with `token`; no answer echoes a token.
    async fn get(&self, token: &str, path: &str) -> (StatusCode, Value) {
        let response = self
            .http
            .get(self.url(path))
            .bearer_auth(token)
            .send()
            .await
            .expect("opledger answers");
        let status = response.status();
        let text = response.text().await.expect("a body");
        for secret in [ADMIN_TOKEN, SHOP_CLIENT, OTHER_CLIENT, UPSTREAM_SECRET] {
            assert!(!text.contains(secret), "a secret in an answer: {text}");
        }
        let body = serde_json::from_str(&text).unwrap_or_else(|e| panic!("JSON ({e}): {text}"));
        (status, body)
    }

    /// Every operation, as the admin lists them.
    async fn operations(&self) -> Vec<Value> {
        let (status, body) = self.get(ADMIN_TOKEN, "/v1/operations?limit=500").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body["operations"].as_array().cloned().expect("a list")
    }

    /// The events of the delivery stream of `update_id`.
    async fn delivery_events(&self, update_id: i64) -> Vec<Value> {
        let path = format!("/v1/streams/update-shop-{update_id}/events?limit=1000");
        let (status, body) = self.get(ADMIN_TOKEN, &path).await;
        if status == StatusCode::NOT_FOUND {
            return Vec::new();
        }
        assert_eq!(status, StatusCode::OK, "{body}");
        body["events"].as_array().cloned().expect("a list")
    }

    /// Waits until the delivery stream of `update_id` holds an event of `event_type`.
    async fn wait_for_delivery_event(&self, update_id: i64, event_type: &str) -> Vec<Value> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let events = self.delivery_events(update_id).await;
            if events.iter().any(|e| e["event_type"] == event_type) {
                return events;
            }
            assert!(
                Instant::now() < deadline,
                "no {event_type} for update {update_id}: {events:#?}\nstderr: {}",
                self.opledger.stderr()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The texts of the `sendMessage` calls the fake Bot API received, in order.
    fn sent_texts(&self) -> Vec<String> {
        self.telegram
            .calls("sendMessage")
            .iter()
            .map(|call| call["text"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    /// Waits until `sendMessage` was called with a text that `matches`; the calls so far.
    async fn wait_for_message(&self, what: &str, matches: impl Fn(&str) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let calls = self.telegram.calls("sendMessage");
            if calls
                .iter()
                .any(|c| matches(c["text"].as_str().unwrap_or_default()))
            {
                return calls;
            }
            assert!(
                Instant::now() < deadline,
                "no sendMessage {what}; calls: {:#?}\nopledger: {}\nthe bot: {}",
                self.telegram.all_calls(),
                self.opledger.stderr(),
                self.bot.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the one operation is settled; returns it.
    async fn settled_operation(&self) -> Value {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let operations = self.operations().await;
            if let [operation] = operations.as_slice()
                && matches!(
                    operation["status"].as_str(),
                    Some("confirmed" | "failed" | "needs_reconciliation")
                )
            {
                return operation.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no settled operation: {operations:#?}\nstderr: {}",
                self.opledger.stderr()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// SHA-256 of `bytes`, hex, as the bot records bodies.
fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Now, in Unix seconds (message dates).
fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Asserts that `received` is exactly one request, the first attempt, with the right secret and
/// headers and the exact bytes Telegram sent.
fn once_as_sent(received: &[Received], update_id: i64, sent: &[u8]) {
    assert_eq!(received.len(), 1, "update {update_id} once: {received:#?}");
    let request = &received[0];
    assert!(request.secret_ok, "the upstream secret: {request:?}");
    assert_eq!(
        request.header_update_id.as_deref(),
        Some(update_id.to_string().as_str())
    );
    assert_eq!(request.attempt(), 1, "{request:?}");
    assert_eq!(
        request.sha256,
        sha256(sent),
        "the exact bytes Telegram sent"
    );
    assert!(
        request
            .content_type
            .as_deref()
            .is_some_and(|t| t.starts_with("application/json")),
        "{request:?}"
    );
}

on_both_backends!(
    a_repeated_delivery_reaches_aiogram_once,
    updates_wait_while_aiogram_is_down_and_arrive_in_each_chats_order,
    an_update_the_bot_never_takes_is_given_up_and_recorded,
    a_kill_during_forwarding_loses_nothing_and_repeats_carry_a_higher_attempt,
    a_lead_delivered_and_sent_twice_creates_one_lead,
    a_crash_after_the_crm_answered_never_creates_a_second_lead,
    start_answered_in_the_webhook_response_is_sent_once,
    a_button_from_the_bot_double_clicked_starts_one_operation,
    a_client_token_opens_only_its_own_bots_operations,
);

async fn a_repeated_delivery_reaches_aiogram_once(backend: Backend) {
    let Some(world) = World::start(backend, Options::default()).await else {
        return;
    };
    let world = Arc::new(world);
    let first = message_from(10, now(), 42, "hello");
    world.acknowledged(&first).await;
    world.acknowledged(&first).await;
    let second = message_from(11, now(), 42, "hello again");
    let deliveries: Vec<_> = (0..20)
        .map(|_| {
            let (world, second) = (world.clone(), second.clone());
            tokio::spawn(async move { deliver(world.address, &second).await })
        })
        .collect();
    for delivery in deliveries {
        assert_eq!(delivery.await.expect("a delivery"), Some(200));
    }
    // A later update of the same chat is forwarded after the earlier ones (one in flight per
    // chat, in order): once it arrived, any repeat would have arrived before it.
    let marker = message_from(12, now(), 42, "marker");
    world.acknowledged(&marker).await;
    let received = world
        .bot
        .wait_until("the marker", |r| r.iter().any(|r| r.update_id == Some(12)))
        .await;
    once_as_sent(&world.bot.received_for(10), 10, &first);
    once_as_sent(&world.bot.received_for(11), 11, &second);
    let order: Vec<_> = received.iter().filter_map(|r| r.update_id).collect();
    assert_eq!(order, [10, 11, 12], "in the order Telegram delivered them");
    for update_id in [10, 11] {
        let events = world
            .wait_for_delivery_event(update_id, "UpdateForwarded")
            .await;
        let forwarded = events
            .iter()
            .filter(|e| e["event_type"] == "UpdateForwarded")
            .count();
        assert_eq!(forwarded, 1, "update {update_id}: {events:#?}");
    }
}

async fn updates_wait_while_aiogram_is_down_and_arrive_in_each_chats_order(backend: Backend) {
    let Some(mut world) = World::start(backend, Options::default()).await else {
        return;
    };
    world.bot.stop().await;
    // 50 updates across 5 chats, interleaved, each acknowledged while the bot is down.
    let mut sent: BTreeMap<i64, Vec<(i64, Vec<u8>)>> = BTreeMap::new();
    for n in 0..50 {
        let (update_id, chat) = (100 + n, 1000 + n % 5);
        let update = message_from(update_id, now(), chat, &format!("message {n}"));
        world.acknowledged(&update).await;
        sent.entry(chat).or_default().push((update_id, update));
    }
    // The bot is down: the first update of each chat fails and waits; nothing else is tried.
    for first in 100..105 {
        world.wait_for_delivery_event(first, "ForwardFailed").await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for waiting in 105..150 {
        let events = world.delivery_events(waiting).await;
        assert!(
            !events.iter().any(|e| e["event_type"] == "ForwardStarted"),
            "update {waiting} waits behind its chat's first: {events:#?}"
        );
    }
    world.bot.start().await;
    let received = world
        .bot
        .wait_until("all 50 updates", |r| {
            (100..150).all(|id| r.iter().any(|r| r.update_id == Some(id)))
        })
        .await;
    for (chat, updates) in &sent {
        let arrived: Vec<_> = received
            .iter()
            .filter(|r| r.chat_id == Some(*chat))
            .collect();
        let order: Vec<_> = arrived.iter().filter_map(|r| r.update_id).collect();
        let expected: Vec<_> = updates.iter().map(|(id, _)| *id).collect();
        assert_eq!(order, expected, "chat {chat}: each once, in the order sent");
        for ((_, bytes), request) in updates.iter().zip(&arrived) {
            assert!(request.secret_ok);
            assert_eq!(request.sha256, sha256(bytes), "the exact bytes");
        }
        // The chat's first update was tried while the bot was down.
        assert!(arrived[0].attempt() > 1, "{:?}", arrived[0]);
    }
}

async fn an_update_the_bot_never_takes_is_given_up_and_recorded(backend: Backend) {
    let options = Options {
        give_up_after_secs: 2,
        bot_running: false,
        ..Options::default()
    };
    let Some(mut world) = World::start(backend, options).await else {
        return;
    };
    let lost = message_from(200, now(), 42, "nobody takes this");
    world.acknowledged(&lost).await;
    let events = world.wait_for_delivery_event(200, "ForwardGivenUp").await;
    assert!(
        events.iter().any(|e| e["event_type"] == "ForwardFailed"),
        "it was tried before it was given up: {events:#?}"
    );
    // The given-up update no longer holds its chat back, and is not forwarded any more.
    world.bot.start().await;
    let later = message_from(201, now(), 42, "a later one");
    world.acknowledged(&later).await;
    world
        .bot
        .wait_until("the later update", |r| {
            r.iter().any(|r| r.update_id == Some(201))
        })
        .await;
    assert!(world.bot.received_for(200).is_empty(), "given up: not sent");
}

async fn a_kill_during_forwarding_loses_nothing_and_repeats_carry_a_higher_attempt(
    backend: Backend,
) {
    let options = Options {
        answer_delay_ms: 800,
        ..Options::default()
    };
    let Some(mut world) = World::start(backend, options).await else {
        return;
    };
    let mut sent = BTreeMap::new();
    for n in 0..9 {
        let (update_id, chat) = (300 + n, 2000 + n % 3);
        let update = message_from(update_id, now(), chat, &format!("message {n}"));
        world.acknowledged(&update).await;
        sent.insert(update_id, update);
    }
    // The bot holds the first requests for 800 ms: kill -9 opledger while they are in flight.
    world
        .bot
        .wait_until("a first request", |r| !r.is_empty())
        .await;
    let status = world.opledger.kill().await;
    assert_eq!(status.signal(), Some(9), "killed: {status}");
    world.restart().await;
    let received = world
        .bot
        .wait_until("every acknowledged update", |r| {
            sent.keys()
                .all(|id| r.iter().any(|r| r.update_id == Some(*id)))
        })
        .await;
    let mut repeated = 0;
    for (update_id, bytes) in &sent {
        let requests: Vec<_> = received
            .iter()
            .filter(|r| r.update_id == Some(*update_id))
            .collect();
        for request in &requests {
            assert!(request.secret_ok);
            assert_eq!(request.sha256, sha256(bytes), "the same update every time");
            assert_eq!(
                request.header_update_id.as_deref(),
                Some(update_id.to_string().as_str())
            );
        }
        let attempts: Vec<_> = requests.iter().map(|r| r.attempt()).collect();
        assert!(
            attempts.windows(2).all(|w| w[0] < w[1]),
            "update {update_id}: each repeat has a higher attempt: {attempts:?}"
        );
        repeated += requests.len() - 1;
    }
    assert!(
        repeated >= 1,
        "the requests in flight at the kill were repeated: {received:#?}"
    );
}

async fn a_lead_delivered_and_sent_twice_creates_one_lead(backend: Backend) {
    let Some(world) = World::start(backend, Options::default()).await else {
        return;
    };
    let lead = message_from(400, now(), 7, "/lead Ada");
    world.acknowledged(&lead).await;
    world.acknowledged(&lead).await;
    let answered = |text: &str| text.starts_with("Lead Ada is in the CRM");
    world.wait_for_message("about the lead", answered).await;
    // The user sends it again: the same business key, the same operation, the same answer.
    let again = message_from(401, now(), 7, "/lead Ada");
    world.acknowledged(&again).await;
    let deadline = Instant::now() + PATIENCE;
    while world.sent_texts().iter().filter(|t| answered(t)).count() < 2 {
        assert!(Instant::now() < deadline, "{:?}", world.sent_texts());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let answers: Vec<_> = world
        .sent_texts()
        .into_iter()
        .filter(|t| answered(t))
        .collect();
    assert_eq!(answers.len(), 2, "one answer per update: {answers:?}");
    assert_eq!(answers[0], answers[1], "the same lead: {answers:?}");
    let operations = world.operations().await;
    assert_eq!(operations.len(), 1, "{operations:#?}");
    let id = operations[0]["operation_id"].as_str().unwrap();
    assert_eq!(operations[0]["business_key"], "Ada:7");
    assert_eq!(
        world.crm.creations().get(id),
        Some(&1),
        "one lead at the CRM"
    );
    assert_eq!(world.crm.total_requests(), 1);
    assert_eq!(world.bot.received_for(400).len(), 1);
    assert_eq!(world.bot.received_for(401).len(), 1);
}

async fn a_crash_after_the_crm_answered_never_creates_a_second_lead(backend: Backend) {
    let options = Options {
        failpoints: Some("worker-after-response=return"),
        ..Options::default()
    };
    let Some(mut world) = World::start(backend, options).await else {
        return;
    };
    let lead = message_from(500, now(), 7, "/lead Ada");
    world.acknowledged(&lead).await;
    // aiogram starts the operation; the worker calls the CRM, which creates the lead, and the
    // process aborts before the answer is recorded.
    let status = world.opledger.exit().await;
    assert_eq!(
        status.signal(),
        Some(6),
        "aborted at the crash point: {status}"
    );
    assert_eq!(world.crm.total_requests(), 1, "the CRM was called");
    world.restart().await;
    // The forward is repeated, the handler asks again (the same operation), the lookup finds
    // the lead; the user is answered with it, once per delivery of theirs.
    let operation = world.settled_operation().await;
    assert_eq!(operation["status"], "confirmed", "{operation:#?}");
    let again = message_from(501, now(), 7, "/lead Ada");
    world.acknowledged(&again).await;
    world
        .wait_for_message("about the lead", |t| {
            t.starts_with("Lead Ada is in the CRM")
        })
        .await;
    let id = operation["operation_id"].as_str().unwrap();
    assert_eq!(world.crm.creations().get(id), Some(&1), "one lead");
    assert_eq!(world.crm.total_requests(), 1, "never called again");
    assert_eq!(world.operations().await.len(), 1);
    // The forward in flight at the crash was repeated, as a later attempt.
    let repeats = world.bot.received_for(500);
    assert!(
        repeats.len() >= 2 && repeats.windows(2).all(|w| w[0].attempt() < w[1].attempt()),
        "{repeats:#?}"
    );
}

async fn start_answered_in_the_webhook_response_is_sent_once(backend: Backend) {
    let Some(world) = World::start(backend, Options::default()).await else {
        return;
    };
    let start = message_from(600, now(), 42, "/start");
    world.acknowledged(&start).await;
    world.acknowledged(&start).await;
    let events = world.wait_for_delivery_event(600, "AnswerCallSent").await;
    let calls = world.telegram.calls("sendMessage");
    assert_eq!(calls.len(), 1, "{calls:#?}");
    assert_eq!(calls[0]["text"], GREETING);
    assert!(
        calls[0]["chat_id"] == json!(42) || calls[0]["chat_id"] == json!("42"),
        "{calls:#?}"
    );
    let started = events
        .iter()
        .filter(|e| e["event_type"] == "AnswerCallStarted")
        .count();
    assert_eq!(started, 1, "{events:#?}");
    // Nothing more follows.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(world.telegram.calls("sendMessage").len(), 1);
    once_as_sent(&world.bot.received_for(600), 600, &start);
}

async fn a_button_from_the_bot_double_clicked_starts_one_operation(backend: Backend) {
    let Some(world) = World::start(backend, Options::default()).await else {
        return;
    };
    world
        .acknowledged(&message_from(700, now(), 7, "/offer"))
        .await;
    let calls = world
        .wait_for_message("with the offer", |t| t == "Shall we call you back?")
        .await;
    let offer = calls
        .iter()
        .find(|c| c["text"] == "Shall we call you back?")
        .unwrap();
    // The keyboard is the bot's, as aiogram wrote it (JSON text in a form, or JSON).
    let markup = match &offer["reply_markup"] {
        Value::String(text) => serde_json::from_str(text).expect("a keyboard as JSON text"),
        other => other.clone(),
    };
    let data = markup["inline_keyboard"][0][0]["callback_data"]
        .as_str()
        .unwrap_or_else(|| panic!("a button: {offer:#?}"))
        .to_owned();
    assert!(data.len() <= 64, "{data}");
    // A double click: one operation, one lead, one reply from opledger.
    world.acknowledged(&click(701, 7, &data)).await;
    world.acknowledged(&click(702, 7, &data)).await;
    let operation = world.settled_operation().await;
    assert_eq!(operation["status"], "confirmed", "{operation:#?}");
    assert_eq!(operation["business_key"], "Test:7");
    world
        .wait_for_message("thanking", |t| t == "Thanks, Test: we will call you back.")
        .await;
    let id = operation["operation_id"].as_str().unwrap();
    assert_eq!(world.crm.creations().get(id), Some(&1));
    assert_eq!(world.crm.total_requests(), 1);
    let thanks = world
        .sent_texts()
        .iter()
        .filter(|t| t.starts_with("Thanks"))
        .count();
    assert_eq!(thanks, 1);
    // opledger answered the clicks itself; they are not the bot's to handle.
    let marker = message_from(703, now(), 7, "marker");
    world.acknowledged(&marker).await;
    world
        .bot
        .wait_until("the marker", |r| r.iter().any(|r| r.update_id == Some(703)))
        .await;
    assert!(world.bot.received_for(701).is_empty());
    assert!(world.bot.received_for(702).is_empty());
}

async fn a_client_token_opens_only_its_own_bots_operations(backend: Backend) {
    let Some(world) = World::start(backend, Options::default()).await else {
        return;
    };
    // The aiogram bot starts a lead of shop's with its token; another bot's handlers start one
    // of theirs.
    world
        .acknowledged(&message_from(800, now(), 7, "/lead Ada"))
        .await;
    world
        .wait_for_message("about the lead", |t| t.starts_with("Lead Ada"))
        .await;
    let shop = world.operations().await[0]["operation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let response = world
        .http
        .post(world.url("/v1/operations"))
        .bearer_auth(OTHER_CLIENT)
        .json(&json!({
            "action": "other_lead", "params": { "name": "Eve" }, "user_id": 8, "update_id": 1
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let other: Value = response.json().await.unwrap();
    let other = other["operation_id"].as_str().unwrap().to_owned();

    for (token, own, foreign) in [(SHOP_CLIENT, &shop, &other), (OTHER_CLIENT, &other, &shop)] {
        let (status, body) = world.get(token, &format!("/v1/operations/{own}")).await;
        assert_eq!(status, StatusCode::OK, "its own: {body}");
        for path in [
            format!("/v1/operations/{foreign}"),
            format!("/v1/operations/{foreign}/events"),
        ] {
            let (status, body) = world.get(token, &path).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
        }
        for path in [
            "/v1/operations",
            "/v1/reconciliation",
            "/v1/projections",
            "/v1/streams/update-shop-800/events",
        ] {
            let (status, body) = world.get(token, path).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
        }
    }
    // Nor may a client start another bot's action.
    let response = world
        .http
        .post(world.url("/v1/operations"))
        .bearer_auth(SHOP_CLIENT)
        .json(&json!({
            "action": "other_lead", "params": { "name": "Eve" }, "user_id": 7, "update_id": 2
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(world.operations().await.len(), 2);
}
