//! The gateway (issue 12 §1, ADR 0012) on both backends: updates recorded by the real service
//! reach a fake bot's own webhook with Telegram's exact bytes, once per update whatever Telegram
//! repeats, one per chat at a time in the order received, retried while the bot fails and given
//! up after the configured age; a Bot API call in the bot's answer is carried out once and never
//! made again when its outcome is unknown. Two real processes on one PostgreSQL ledger keep each
//! chat's order.

use std::collections::HashMap;
use std::time::Duration;

use chrono::TimeDelta;
use opledger_config::Config;
use opledger_domain::delivery::raw_attachment;
use opledger_store::{EventStore, StreamId};
use opledger_worker::forward::Forwarded;
use opledger_worker::{Backoff, Forwarder, ForwarderOptions};

use crate::support::app::{
    Backend, Ledger, SECRET, TOKEN, TestApp, message_from, on_both_backends,
};
use crate::support::fake_bot::{BotMode, FakeBot};
use crate::support::fake_telegram::FakeTelegram;

/// The secret the gateway shows the bot.
const UPSTREAM_SECRET: &str = "CANARY-upstream-secret_0123456789";

struct World {
    _ledger: Ledger,
    app: TestApp,
    bot: FakeBot,
    telegram: FakeTelegram,
    config: Config,
}

impl World {
    /// A service whose bot `shop` forwards `updates` (all or unhandled) to a fake bot, gives up
    /// after `give_up_secs`, and has a `coupon` action of its own.
    async fn start(backend: Backend, updates: &str, give_up_secs: u64) -> Option<World> {
        let ledger = Ledger::create(backend).await?;
        let bot = FakeBot::start().await;
        let telegram = FakeTelegram::start(TOKEN).await;
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n\
             [[bots]]\nname = \"shop\"\ntoken_env = \"BOT_TOKEN\"\n\
             webhook_secret_env = \"BOT_SECRET\"\napi_base_url = \"{telegram}\"\n\
             [bots.forward]\nurl = \"{bot}\"\nsecret_env = \"UPSTREAM\"\nupdates = \"{updates}\"\n\
             timeout_ms = 2000\ngive_up_after_secs = {give_up_secs}\n\
             [[actions]]\nname = \"coupon\"\nbot = \"shop\"\ncommand = \"coupon\"\n\
             params = [\"campaign\"]\nkey = \"{{campaign}}:{{user_id}}\"\n",
            telegram = telegram.base_url(),
            bot = bot.url(),
        );
        let env: HashMap<&str, &str> = HashMap::from([
            ("BOT_TOKEN", TOKEN),
            ("BOT_SECRET", SECRET),
            ("UPSTREAM", UPSTREAM_SECRET),
        ]);
        let config = Config::parse(&text, &|name| env.get(name).map(|v| (*v).to_owned()))
            .expect("test config");
        let app = TestApp::spawn(&ledger, &config).await;
        Some(World {
            _ledger: ledger,
            app,
            bot,
            telegram,
            config,
        })
    }

    /// A forwarder on the service's ledger and manual clock, retrying after a second.
    fn forwarder(&self, id: &str) -> Forwarder {
        let mut options = ForwarderOptions::new(id);
        options.backoff = Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(1),
        };
        options.idle_poll = Duration::from_millis(20);
        Forwarder::new(
            &self.config,
            self.app.store.clone(),
            self.app.clock.clone(),
            options,
        )
        .expect("build the forwarder")
        .expect("the bot has a gateway")
    }

    async fn deliver(&self, body: &[u8]) {
        let answer = self.app.deliver(body.to_vec()).await;
        assert_eq!(answer.status(), 200, "Telegram's delivery is acknowledged");
    }

    async fn types_of(&self, update_id: i64) -> Vec<String> {
        let stream = StreamId::new(format!("update-shop-{update_id}")).expect("a stream id");
        self.app
            .store
            .read_stream(&stream, 1, 1000)
            .await
            .expect("read the delivery")
            .into_iter()
            .map(|e| e.event_type)
            .collect()
    }

    async fn attachment(&self, update_id: i64) -> Option<Vec<u8>> {
        let stream = StreamId::new(format!("update-shop-{update_id}")).expect("a stream id");
        self.app
            .store
            .attachment(&stream, &raw_attachment(1))
            .await
            .expect("read the attachment")
    }
}

/// An update of chat `chat` with odd spacing, so that only the exact bytes compare equal.
fn spaced(update_id: i64, chat: i64, text: &str) -> Vec<u8> {
    let compact =
        String::from_utf8(message_from(update_id, 1_790_000_000, chat, text)).expect("utf-8");
    compact
        .replacen("{\"update_id\":", "{ \"update_id\" :  ", 1)
        .into_bytes()
}

on_both_backends!(
    forwards_the_exact_bytes_once_with_headers,
    a_redelivery_never_reaches_the_bot_twice,
    a_failing_bot_gets_each_chat_in_order_when_it_is_back,
    an_update_is_given_up_after_the_configured_age,
    unhandled_leaves_out_what_opledger_answered,
    a_call_in_the_answer_is_carried_out_once,
    an_answer_call_whose_outcome_is_unknown_is_never_made_again,
    a_refused_method_in_the_answer_is_not_called,
    forwarding_shows_in_metrics_and_the_timeline,
    in_poll_mode_the_bot_still_gets_webhooks,
    attachments_exist_exactly_with_their_appends,
);

async fn forwards_the_exact_bytes_once_with_headers(backend: Backend) {
    let Some(world) = World::start(backend, "all", 86_400).await else {
        return;
    };
    let body = spaced(501, 7, "hello there");
    world.deliver(&body).await;
    assert_eq!(
        world.attachment(501).await.as_deref(),
        Some(&body[..]),
        "the raw body waits beside the history until the bot has it"
    );
    let outcomes = world.forwarder("fwd-1").run_due().await.expect("forward");
    assert_eq!(
        outcomes,
        vec![(
            "update-shop-501".to_owned(),
            Forwarded::Acknowledged { attempt: 1 }
        )]
    );
    let received = world.bot.received();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].body, body, "the exact bytes Telegram sent");
    assert_eq!(received[0].update_id, Some(501));
    assert_eq!(received[0].attempt, Some(1));
    assert_eq!(received[0].secret.as_deref(), Some(UPSTREAM_SECRET));
    assert_eq!(
        world.types_of(501).await,
        ["UpdateReceived", "ForwardStarted", "UpdateForwarded"]
    );
    assert_eq!(
        world.attachment(501).await,
        None,
        "deleted once acknowledged"
    );
    // The history keeps the digest, never the body (store_raw_updates is off).
    let events = world.app.events().await;
    assert!(
        events
            .iter()
            .all(|e| !String::from_utf8_lossy(&e.payload).contains("hello there")),
        "the message text is not in the ledger"
    );
    assert!(
        world
            .forwarder("fwd-1")
            .run_due()
            .await
            .expect("forward")
            .is_empty()
    );
}

async fn a_redelivery_never_reaches_the_bot_twice(backend: Backend) {
    let Some(world) = World::start(backend, "all", 86_400).await else {
        return;
    };
    let body = spaced(601, 7, "twice");
    world.deliver(&body).await;
    world.deliver(&body).await;
    let forwarder = world.forwarder("fwd-1");
    let running = {
        let forwarder = forwarder.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        (
            stop,
            tokio::spawn(async move {
                forwarder
                    .run(async move {
                        let _ = stopped.await;
                    })
                    .await;
            }),
        )
    };
    // Twenty concurrent repeats while the forwarder runs.
    let repeats: Vec<_> = (0..20).map(|_| world.deliver(&body)).collect();
    futures_util::future::join_all(repeats).await;
    wait_for(|| world.bot.acknowledged().len() == 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (stop, task) = running;
    let _ = stop.send(());
    task.await.expect("the forwarder stops");
    assert_eq!(
        world.bot.received().len(),
        1,
        "one delivery reached the bot"
    );
    assert_eq!(world.app.count("DuplicateDeliveryObserved").await, 21);
    assert_eq!(world.app.count("ForwardStarted").await, 1);
}

async fn a_failing_bot_gets_each_chat_in_order_when_it_is_back(backend: Backend) {
    let Some(world) = World::start(backend, "all", 86_400).await else {
        return;
    };
    world.bot.set_mode(BotMode::Status(503));
    // Three updates of chat 1 and two of chat 2, interleaved as Telegram delivered them.
    let order = [(701, 1), (702, 2), (703, 1), (704, 2), (705, 1)];
    for (update_id, chat) in order {
        world.deliver(&spaced(update_id, chat, "queued")).await;
    }
    let forwarder = world.forwarder("fwd-1");
    let outcomes = forwarder.run_due().await.expect("forward");
    assert_eq!(
        outcomes,
        vec![
            (
                "update-shop-701".to_owned(),
                Forwarded::Failed { attempt: 1 }
            ),
            (
                "update-shop-702".to_owned(),
                Forwarded::Failed { attempt: 1 }
            ),
        ],
        "only each chat's first update is tried"
    );
    assert!(
        forwarder.run_due().await.expect("forward").is_empty(),
        "nothing is due before the backoff"
    );
    world.bot.set_mode(BotMode::Ok);
    world.app.clock.advance(TimeDelta::seconds(2));
    for _ in 0..10 {
        if forwarder.run_due().await.expect("forward").is_empty() {
            break;
        }
    }
    let acknowledged = world.bot.acknowledged();
    let ids_of = |chat: i64| -> Vec<i64> {
        acknowledged
            .iter()
            .filter(|r| r.chat_id == Some(chat))
            .filter_map(|r| r.update_id)
            .collect()
    };
    assert_eq!(ids_of(1), [701, 703, 705], "chat 1 in the order received");
    assert_eq!(ids_of(2), [702, 704], "chat 2 in the order received");
    let first = acknowledged
        .iter()
        .find(|r| r.update_id == Some(701))
        .expect("701");
    assert_eq!(first.attempt, Some(2), "a repeat carries a higher attempt");
    assert_eq!(world.app.count("ForwardFailed").await, 2);
    assert_eq!(world.app.count("UpdateForwarded").await, 5);
}

async fn an_update_is_given_up_after_the_configured_age(backend: Backend) {
    let Some(world) = World::start(backend, "all", 60).await else {
        return;
    };
    world.bot.set_mode(BotMode::Status(500));
    world.deliver(&spaced(801, 3, "too late")).await;
    world.deliver(&spaced(802, 3, "next")).await;
    let forwarder = world.forwarder("fwd-1");
    forwarder.run_due().await.expect("forward");
    world.app.clock.advance(TimeDelta::seconds(61));
    world.bot.set_mode(BotMode::Ok);
    let outcomes = forwarder.run_due().await.expect("forward");
    assert_eq!(
        outcomes,
        vec![("update-shop-801".to_owned(), Forwarded::GivenUp)],
        "the old head is given up, which frees its chat"
    );
    assert_eq!(
        world.types_of(801).await,
        [
            "UpdateReceived",
            "ForwardStarted",
            "ForwardFailed",
            "ForwardGivenUp"
        ]
    );
    assert_eq!(
        world.attachment(801).await,
        None,
        "the body is deleted when given up"
    );
    // 802 is as old: it is given up too, never forwarded late.
    assert_eq!(
        forwarder.run_due().await.expect("forward"),
        vec![("update-shop-802".to_owned(), Forwarded::GivenUp)]
    );
    assert!(world.bot.acknowledged().is_empty());
}

async fn unhandled_leaves_out_what_opledger_answered(backend: Backend) {
    let Some(world) = World::start(backend, "unhandled", 86_400).await else {
        return;
    };
    world
        .deliver(&message_from(901, 1_790_000_000, 5, "/coupon spring"))
        .await;
    world
        .deliver(&message_from(902, 1_790_000_000, 5, "just text"))
        .await;
    world
        .deliver(&message_from(903, 1_790_000_000, 5, "/start"))
        .await;
    world
        .deliver(&message_from(904, 1_790_000_000, 5, "/status"))
        .await;
    world.forwarder("fwd-1").run_due().await.expect("forward");
    world.forwarder("fwd-1").run_due().await.expect("forward");
    let forwarded: Vec<i64> = world
        .bot
        .received()
        .iter()
        .filter_map(|r| r.update_id)
        .collect();
    assert_eq!(
        forwarded,
        [902, 903],
        "its own action and /status are opledger's; text and the bot's /start are the bot's"
    );
}

async fn a_call_in_the_answer_is_carried_out_once(backend: Backend) {
    let Some(world) = World::start(backend, "all", 86_400).await else {
        return;
    };
    world.bot.set_mode(BotMode::Answer(
        r#"{"method":"sendMessage","chat_id":9,"text":"answered in the webhook"}"#.to_owned(),
    ));
    world.deliver(&spaced(1001, 9, "hi")).await;
    let forwarder = world.forwarder("fwd-1");
    forwarder.run_due().await.expect("forward");
    forwarder.run_due().await.expect("forward");
    let sent = world.telegram.calls("sendMessage");
    assert_eq!(sent.len(), 1, "carried out once: {sent:?}");
    assert_eq!(sent[0]["text"], "answered in the webhook");
    assert_eq!(sent[0]["chat_id"], 9);
    assert_eq!(
        world.types_of(1001).await,
        [
            "UpdateReceived",
            "ForwardStarted",
            "UpdateForwarded",
            "AnswerCallStarted",
            "AnswerCallSent"
        ]
    );
    let events = world.app.events().await;
    assert!(
        events
            .iter()
            .all(|e| !String::from_utf8_lossy(&e.payload).contains("answered in the webhook")),
        "the answer's text is not in the ledger"
    );
}

async fn an_answer_call_whose_outcome_is_unknown_is_never_made_again(backend: Backend) {
    let Some(world) = World::start(backend, "all", 86_400).await else {
        return;
    };
    // A forwarder died between committing the call's start and making it: simulated by
    // committing the acknowledgement and the start as its step would, without the call.
    world.deliver(&spaced(1101, 9, "hi")).await;
    let stream = StreamId::new("update-shop-1101").expect("a stream id");
    let ledger = opledger_ledger::Ledger::new(world.app.store.clone());
    let now = opledger_ledger::Clock::now(world.app.clock.as_ref());
    for command in [
        opledger_domain::delivery::ForwardCommand::Start {
            forwarder: "dead".to_owned(),
            lease_until: now + TimeDelta::seconds(30),
        },
        opledger_domain::delivery::ForwardCommand::Acknowledge {
            attempt: 1,
            status: 200,
            elapsed_ms: 3,
            answer: Some(opledger_domain::delivery::AnswerStart {
                method: "sendMessage".to_owned(),
                digest: "0".repeat(64),
                lease_until: now + opledger_worker::forward::ANSWER_LEASE,
            }),
        },
    ] {
        let command = opledger_domain::DeliveryCommand::Forward(command);
        ledger
            .unit_of_work()
            .run(|snapshot, changes| {
                let delivery: opledger_domain::Delivery = snapshot.read(&stream)?;
                let events = opledger_domain::delivery::decide(&delivery, &command, now)
                    .map_err(opledger_ledger::Undecided::Rejected)?;
                changes.decided(
                    &stream,
                    &delivery,
                    &events,
                    &opledger_domain::EventMetadata::caused_by(
                        opledger_domain::Causation::Worker {
                            worker: "dead".to_owned(),
                        },
                    ),
                );
                Ok(())
            })
            .await
            .expect("commit");
    }
    let forwarder = world.forwarder("fwd-2");
    assert!(
        forwarder.run_due().await.expect("forward").is_empty(),
        "within its lease the call is left alone"
    );
    world.app.clock.advance(TimeDelta::seconds(61));
    forwarder.run_due().await.expect("forward");
    forwarder.run_due().await.expect("forward");
    assert!(
        world.telegram.calls("sendMessage").is_empty(),
        "never made again"
    );
    assert!(
        world.bot.received().is_empty(),
        "an acknowledged update is not forwarded again"
    );
    assert_eq!(
        world.types_of(1101).await.last().map(String::as_str),
        Some("AnswerCallFailed")
    );
}

async fn a_refused_method_in_the_answer_is_not_called(backend: Backend) {
    let Some(world) = World::start(backend, "all", 86_400).await else {
        return;
    };
    world.bot.set_mode(BotMode::Answer(
        r#"{"method":"setWebhook","url":"https://elsewhere.example"}"#.to_owned(),
    ));
    world.deliver(&spaced(1201, 9, "hi")).await;
    world.forwarder("fwd-1").run_due().await.expect("forward");
    assert!(world.telegram.calls("setWebhook").is_empty());
    assert_eq!(
        world.types_of(1201).await.last().map(String::as_str),
        Some("AnswerCallFailed")
    );
}

async fn forwarding_shows_in_metrics_and_the_timeline(backend: Backend) {
    let Some(world) = World::start(backend, "all", 86_400).await else {
        return;
    };
    world.bot.set_mode(BotMode::Status(502));
    world.deliver(&spaced(1301, 4, "waiting")).await;
    let forwarder = world.forwarder("fwd-1");
    forwarder.run_due().await.expect("forward");
    world.app.clock.advance(TimeDelta::seconds(30));
    let metrics_url = format!("http://{}/metrics", world.app.address);
    let mut text = String::new();
    for _ in 0..100 {
        text = world
            .app
            .http
            .get(&metrics_url)
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text");
        if text.contains("opledger_forward_failures_total 1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(text.contains("opledger_forward_failures_total 1"), "{text}");
    assert!(
        text.contains("opledger_forward_waiting_updates{bot=\"shop\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("opledger_forward_failing_updates{bot=\"shop\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("opledger_oldest_unforwarded_update_age_seconds{bot=\"shop\"} 30"),
        "the gateway's lag by the service's clock: {text}"
    );
    let timeline =
        crate::support::opledger(&world._ledger.url(), &["timeline", "update-shop-1301"]);
    let out = crate::support::stdout(&timeline);
    assert!(
        timeline.status.success(),
        "{out}{}",
        crate::support::stderr(&timeline)
    );
    assert!(out.contains("update 1301  bot shop"), "{out}");
    assert!(
        out.contains("ForwardStarted") && out.contains("ForwardFailed"),
        "{out}"
    );
    assert!(out.contains("the bot answered 502"), "{out}");
    assert!(!out.contains(UPSTREAM_SECRET));
}

async fn in_poll_mode_the_bot_still_gets_webhooks(backend: Backend) {
    let Some(ledger) = Ledger::create(backend).await else {
        return;
    };
    let bot = FakeBot::start().await;
    let telegram = FakeTelegram::start(TOKEN).await;
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshutdown_grace_ms = 1000\n\
         [[bots]]\nname = \"shop\"\ntoken_env = \"BOT_TOKEN\"\nmode = \"poll\"\n\
         api_base_url = \"{telegram}\"\npoll_timeout_secs = 1\n\
         [bots.forward]\nurl = \"{bot}\"\nupdates = \"all\"\n",
        telegram = telegram.base_url(),
        bot = bot.url(),
    );
    let config = Config::parse(&text, &|name| {
        (name == "BOT_TOKEN").then(|| TOKEN.to_owned())
    })
    .expect("test config");
    let app = TestApp::spawn(&ledger, &config).await;
    let bodies: Vec<Vec<u8>> = (1..=3).map(|i| spaced(1400 + i, 8, "polled")).collect();
    for body in &bodies {
        telegram.push_update(body.clone());
    }
    // Telegram repeats the first one (its offset was not confirmed yet, say).
    telegram.push_update(bodies[0].clone());
    let mut options = ForwarderOptions::new("fwd-poll");
    options.idle_poll = Duration::from_millis(20);
    let forwarder = Forwarder::new(&config, app.store.clone(), app.clock.clone(), options)
        .expect("build")
        .expect("a gateway");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        forwarder
            .run(async move {
                let _ = stopped.await;
            })
            .await;
    });
    wait_for(|| bot.acknowledged().len() >= 3).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = stop.send(());
    task.await.expect("the forwarder stops");
    let received = bot.received();
    let got: Vec<&[u8]> = received.iter().map(|r| r.body.as_slice()).collect();
    let want: Vec<&[u8]> = bodies.iter().map(Vec::as_slice).collect();
    assert_eq!(
        got, want,
        "each polled update once, in order, as Telegram sent it"
    );
    app.stop().await;
}

/// Two `opledger serve` processes on one PostgreSQL ledger, Telegram's deliveries spread over
/// both: every update reaches the bot once, each chat's in the order received, never two of one
/// chat at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_processes_on_one_postgres_ledger_keep_each_chat_in_order() {
    let Some(ledger) = Ledger::create(Backend::Postgres).await else {
        return;
    };
    let bot = FakeBot::start().await;
    bot.set_mode(BotMode::Slow(Duration::from_millis(15)));
    let telegram = FakeTelegram::start(TOKEN).await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let text = format!(
        "[storage]\nurl = \"{url}\"\n[server]\nlisten = \"127.0.0.1:0\"\n\
         [[bots]]\nname = \"shop\"\ntoken_env = \"SHOP_TOKEN\"\n\
         webhook_secret_env = \"SHOP_SECRET\"\napi_base_url = \"{api}\"\n\
         [bots.forward]\nurl = \"{bot}\"\nupdates = \"all\"\ntimeout_ms = 5000\n",
        url = ledger.url(),
        api = telegram.base_url(),
        bot = bot.url(),
    );
    let config = crate::support::serving::write_config(dir.path(), "opledger.toml", &text);
    let env = [
        ("SHOP_TOKEN", TOKEN),
        ("SHOP_SECRET", SECRET),
        ("OPLEDGER_TEST_WORKER_MS", "20"),
    ];
    let start = || {
        let mut command = crate::support::serving::opledger(&env);
        command.arg("--config").arg(&config);
        crate::support::serving::Serving::start(command)
    };
    let (mut first, mut second) = (start(), start());
    let addresses = [first.address().await, second.address().await];
    let http = reqwest::Client::new();
    let chats = [11_i64, 12, 13, 14, 15];
    let mut sent: HashMap<i64, Vec<i64>> = HashMap::new();
    let mut update_id = 5000;
    for round in 0..6 {
        // Each chat's next update, all chats at once, each to one of the two processes.
        let deliveries = chats.iter().enumerate().map(|(i, &chat)| {
            update_id += 1;
            sent.entry(chat).or_default().push(update_id);
            let address = addresses[(i + round) % 2];
            let body = message_from(update_id, 1_790_000_000, chat, "both");
            let http = http.clone();
            async move {
                let answer = http
                    .post(format!("http://{address}/telegram/shop/webhook"))
                    .header("x-telegram-bot-api-secret-token", SECRET)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .expect("the service answers");
                assert_eq!(answer.status(), 200);
            }
        });
        futures_util::future::join_all(deliveries).await;
    }
    wait_for(|| bot.acknowledged().len() >= 30).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.terminate().await;
    second.terminate().await;
    let received = bot.received();
    assert_eq!(received.len(), 30, "each update once: {received:?}");
    for (chat, ids) in &sent {
        let got: Vec<i64> = received
            .iter()
            .filter(|r| r.chat_id == Some(*chat))
            .filter_map(|r| r.update_id)
            .collect();
        assert_eq!(&got, ids, "chat {chat} in the order received");
    }
    assert_eq!(
        bot.max_in_flight_per_chat(),
        1,
        "never two of one chat at once"
    );
    let stdout = first.stdout() + &second.stdout();
    assert!(stdout.contains("gateway forwarding to"), "{stdout}");
}

/// The store's attachments (ADR 0012): written only with an accepted append, deleted only by
/// one, the later word in one batch winning, and never part of the hash chain.
async fn attachments_exist_exactly_with_their_appends(backend: Backend) {
    use opledger_store::{AppendRequest, Attachment, ExpectedVersion, NewEvent};
    let Some(ledger) = Ledger::create(backend).await else {
        return;
    };
    let store = ledger.open().await;
    let s = StreamId::new("test-1").expect("a stream id");
    let event = || {
        NewEvent::from_serialize("Tested", 1, &serde_json::json!({}), &serde_json::json!({}))
            .expect("an event")
    };
    let with = |expected, attach: &[(&str, &[u8])], detach: &[&str]| {
        let mut request = AppendRequest::new(s.clone(), expected, vec![event()]);
        request.attach = attach
            .iter()
            .map(|(name, body)| Attachment {
                name: (*name).to_owned(),
                body: body.to_vec(),
            })
            .collect();
        request.detach = detach.iter().map(|n| (*n).to_owned()).collect();
        request
    };
    store
        .append(vec![with(
            ExpectedVersion::NoStream,
            &[("a", b"\x00bytes\xff")],
            &[],
        )])
        .await
        .expect("append");
    assert_eq!(
        store.attachment(&s, "a").await.expect("read").as_deref(),
        Some(&b"\x00bytes\xff"[..]),
        "any bytes, exactly"
    );
    // A call refused for its version writes no attachment.
    let refused = store
        .append(vec![with(
            ExpectedVersion::Exact(7),
            &[("b", b"never")],
            &[],
        )])
        .await;
    assert!(refused.is_err());
    assert_eq!(store.attachment(&s, "b").await.expect("read"), None);
    // Concurrent calls share a batch: the later word on a name wins.
    let (first, second) = tokio::join!(
        store.append(vec![with(ExpectedVersion::Any, &[("c", b"one")], &[])]),
        store.append(vec![with(ExpectedVersion::Any, &[], &["a"])]),
    );
    first.expect("append");
    second.expect("append");
    assert_eq!(
        store.attachment(&s, "a").await.expect("read"),
        None,
        "detached"
    );
    assert_eq!(
        store.attachment(&s, "c").await.expect("read").as_deref(),
        Some(&b"one"[..])
    );
    let events = store.read_all(1, 100).await.expect("read");
    assert_eq!(events.len(), 3, "the refused call appended nothing");
    assert!(
        events.iter().all(|e| e.payload == b"{}"),
        "attachments are not in the history"
    );
    store.close().await;
}

async fn wait_for(condition: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !condition() {
        assert!(std::time::Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
