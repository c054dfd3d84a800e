//! Long polling (`mode = "poll"`, issue 4 §6) against a fake Bot API on loopback: every polled
//! update is recorded once, the `getUpdates` offset moves past an update only after it is
//! committed, a crash before the confirmation re-reads and records nothing twice, a graceful stop
//! confirms the last batch, Telegram's 409 is a clear error that polling outlives, and pure
//! answers (`/help`) are sent with `sendMessage`.
//!
//! SQLite is enough for most of these: the poller hands each update to the same intake
//! transaction as the webhook (whose dedup runs on both backends in `intake.rs`), and what is
//! tested here, when the offset moves, does not depend on the store. The main test runs on both
//! backends anyway.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opledger_config::Config;
use opledger_server::App;
use opledger_store::{AnyOptions, AnyStore, EventStore};
use serde_json::{Value, json};

use crate::support::app::{Backend, COUPON, Ledger, TOKEN, TestApp, message, on_both_backends};
use crate::support::fake_telegram::{FakeMode, FakeTelegram, OffsetHook};

on_both_backends!(polled_updates_are_recorded_once_and_confirmed_only_after_their_commit);

/// How long a condition may take before the test fails: generous, since it is only reached
/// when something is wrong.
const PATIENCE: Duration = Duration::from_secs(30);

/// A configuration with one bot `shop` polling `fake` with a 1 s long-poll timeout.
fn poll_config(fake: &FakeTelegram, extra: &str) -> Config {
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshutdown_grace_ms = 1000\n\
         [[bots]]\nname = \"shop\"\ntoken_env = \"SHOP_TOKEN\"\nmode = \"poll\"\n\
         api_base_url = \"{}\"\npoll_timeout_secs = 1\n{extra}",
        fake.base_url()
    );
    let env: HashMap<&str, &str> = HashMap::from([("SHOP_TOKEN", TOKEN)]);
    Config::parse(&text, &|name| env.get(name).map(|v| (*v).to_owned())).expect("test config")
}

/// Waits until `check` holds, polling; fails after [`PATIENCE`].
async fn wait_for<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `update_id`s of the `UpdateReceived` events in the ledger, in order.
async fn received_ids(store: &AnyStore) -> Vec<i64> {
    store
        .read_all(1, 100_000)
        .await
        .expect("read the ledger")
        .iter()
        .filter(|e| e.event_type == "UpdateReceived")
        .map(|e| {
            serde_json::from_slice::<Value>(&e.payload).expect("JSON")["update_id"]
                .as_i64()
                .expect("an update id")
        })
        .collect()
}

async fn count(store: &AnyStore, event_type: &str) -> usize {
    store
        .read_all(1, 100_000)
        .await
        .expect("read the ledger")
        .iter()
        .filter(|e| e.event_type == event_type)
        .count()
}

/// What the ledger held each time the fake saw an offset: `(offset, committed update ids)`.
type Sightings = Arc<Mutex<Vec<(i64, BTreeSet<i64>)>>>;

/// A hook that notes, at the moment the fake sees each offset, which updates are committed.
fn witness(store: AnyStore, sightings: Sightings) -> OffsetHook {
    Arc::new(move |offset| {
        let (store, sightings) = (store.clone(), sightings.clone());
        Box::pin(async move {
            let committed = received_ids(&store).await.into_iter().collect();
            sightings
                .lock()
                .expect("not poisoned")
                .push((offset, committed));
        })
    })
}

/// Asserts that every offset the fake saw confirmed only committed updates.
fn assert_confirmed_only_committed(sightings: &Sightings, pushed: &[i64]) {
    let sightings = sightings.lock().expect("not poisoned");
    assert!(!sightings.is_empty(), "the poller confirmed something");
    for (offset, committed) in sightings.iter() {
        for id in pushed.iter().filter(|id| **id < *offset) {
            assert!(
                committed.contains(id),
                "offset {offset} confirmed update {id} before it was committed (committed: \
                 {committed:?})"
            );
        }
    }
}

async fn polled_updates_are_recorded_once_and_confirmed_only_after_their_commit(backend: Backend) {
    let Some(ledger) = Ledger::create(backend).await else {
        return;
    };
    let fake = FakeTelegram::start(TOKEN).await;
    let app = TestApp::spawn(&ledger, &poll_config(&fake, COUPON)).await;
    let sightings = Sightings::default();
    fake.on_offset(witness(app.store.clone(), sightings.clone()));

    // Two batches, the first with a command that starts an operation.
    let t = 1_790_000_000;
    fake.push_update(message(1_000, t, "/coupon spring"));
    fake.push_update(message(1_001, t + 1, "hello"));
    fake.push_update(message(1_002, t + 2, "/coupon spring"));
    wait_for("the first batch to be recorded", || async {
        received_ids(&app.store).await.len() == 3
    })
    .await;
    fake.push_update(message(1_003, t + 3, "again"));
    fake.push_update(br#"{"update_id": 1004, "brand_new_kind": {"id": 5}}"#.to_vec());
    wait_for("everything to be confirmed", || async {
        fake.confirmed_offset() == Some(1_005)
    })
    .await;
    let pushed = [1_000, 1_001, 1_002, 1_003, 1_004];
    assert_eq!(received_ids(&app.store).await, pushed, "each recorded once");
    assert_eq!(count(&app.store, "DuplicateDeliveryObserved").await, 0);
    assert_eq!(count(&app.store, "Received").await, 1, "one operation");
    assert_eq!(fake.pending_updates(), 0);

    // Polls ask for the kinds opledger handles, with the configured long-poll timeout.
    let polls = fake.calls("getUpdates");
    assert_eq!(
        polls[0]["allowed_updates"],
        json!(["message", "callback_query"])
    );
    assert_eq!(polls[0]["timeout"], 1);
    assert_eq!(polls[0]["limit"], 100);
    assert!(
        polls[0].get("offset").is_none(),
        "no offset before anything is stored"
    );

    app.stop().await;
    // The graceful stop confirmed the last batch without waiting for more.
    let last = fake.calls("getUpdates").pop().expect("polled");
    assert_eq!(last, json!({ "offset": 1_005, "limit": 1, "timeout": 0 }));
    assert_confirmed_only_committed(&sightings, &pushed);
    let offsets: Vec<i64> = sightings.lock().unwrap().iter().map(|(o, _)| *o).collect();
    assert!(
        offsets.windows(2).all(|w| w[0] <= w[1]),
        "the offset never moves back: {offsets:?}"
    );
    assert_eq!(offsets.last(), Some(&1_005));
}

/// A service run on a runtime of its own, so that a test can drop it mid-flight like `kill -9`:
/// every task stops where it is, nothing runs after.
struct Crashable {
    runtime: tokio::runtime::Runtime,
}

impl Crashable {
    async fn start(url: String, config: Config) -> Crashable {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let options = AnyOptions {
            inline: opledger_projections::inline(),
            ..AnyOptions::default()
        };
        // Opened on the service's runtime, so that the store's tasks die with it.
        let (runtime, store) = tokio::task::spawn_blocking(move || {
            let store = runtime.block_on(AnyStore::open(&url, options));
            (runtime, store)
        })
        .await
        .expect("the open task");
        let store = store.expect("open the ledger");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
        listener.set_nonblocking(true).expect("non-blocking");
        let listener = {
            let _entered = runtime.enter();
            tokio::net::TcpListener::from_std(listener).expect("a tokio listener")
        };
        let app = App::build(&config, store);
        runtime.spawn(app.run(listener, std::future::pending()));
        Crashable { runtime }
    }

    fn crash(self) {
        self.runtime.shutdown_background();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crash_before_the_confirmation_re_reads_the_batch_and_records_nothing_twice() {
    let ledger = Ledger::create(Backend::Sqlite).await.expect("SQLite");
    let fake = FakeTelegram::start(TOKEN).await;
    let config = poll_config(&fake, COUPON);
    // Until the crash, every confirmation is held at the fake: the process dies after the
    // batch was committed and before Telegram learnt it.
    let holding = Arc::new(AtomicBool::new(true));
    let held = Arc::new(Mutex::new(Vec::new()));
    fake.on_offset({
        let (holding, held) = (holding.clone(), held.clone());
        Arc::new(move |offset| {
            let hold = holding.load(Ordering::SeqCst);
            if hold {
                held.lock().expect("not poisoned").push(offset);
            }
            Box::pin(async move {
                if hold {
                    std::future::pending::<()>().await;
                }
            })
        })
    });
    // Queued before the service starts, so that its first poll gets the whole batch.
    let t = 1_790_000_000;
    fake.push_update(message(2_000, t, "/coupon spring"));
    fake.push_update(message(2_001, t + 1, "hello"));
    fake.push_update(message(2_002, t + 2, "/help"));
    let crashable = Crashable::start(ledger.url(), config.clone()).await;
    let observer = ledger.open().await;
    wait_for("the batch to be committed", || async {
        received_ids(&observer).await.len() == 3
    })
    .await;
    wait_for("the confirmation to be sent", || async {
        held.lock().unwrap().contains(&2_003)
    })
    .await;
    crashable.crash();
    assert_eq!(fake.confirmed_offset(), None, "nothing was confirmed");
    assert_eq!(fake.pending_updates(), 3, "Telegram still holds the batch");

    // The restarted service is served the same batch again.
    holding.store(false, Ordering::SeqCst);
    let app = TestApp::spawn(&ledger, &config).await;
    wait_for("the batch to be confirmed", || async {
        fake.confirmed_offset() == Some(2_003)
    })
    .await;
    assert_eq!(
        received_ids(&app.store).await,
        [2_000, 2_001, 2_002],
        "no second UpdateReceived"
    );
    assert_eq!(count(&app.store, "DuplicateDeliveryObserved").await, 3);
    assert_eq!(count(&app.store, "Received").await, 1, "one operation");
    let polls = fake.calls("getUpdates");
    let reread = polls.iter().filter(|p| p.get("offset").is_none()).count();
    assert_eq!(
        reread, 2,
        "each process started without an offset and was served the batch"
    );
    app.stop().await;
    observer.close().await;
}

/// Log lines written by the code under test, captured for assertions.
#[derive(Clone, Default)]
struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl CapturedLogs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("not poisoned")).into_owned()
    }
}

impl Write for CapturedLogs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .expect("not poisoned")
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// On a current-thread runtime every task runs on the test's thread, so a thread-local
/// subscriber sees the poller's log lines without touching other tests' logging.
#[tokio::test(flavor = "current_thread")]
async fn a_conflict_is_a_clear_error_and_polling_resumes_when_it_ends() {
    let logs = CapturedLogs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer({
            let logs = logs.clone();
            move || logs.clone()
        })
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let ledger = Ledger::create(Backend::Sqlite).await.expect("SQLite");
    let fake = FakeTelegram::start(TOKEN).await;
    let app = TestApp::spawn(&ledger, &poll_config(&fake, "")).await;
    fake.push_update(message(3_000, 1_790_000_000, "before"));
    wait_for("the first update", || async {
        received_ids(&app.store).await == [3_000]
    })
    .await;

    // Another process starts polling the same bot: Telegram answers 409.
    fake.set_mode(FakeMode::Conflict);
    wait_for("the conflict to be logged", || async {
        logs.text()
            .contains("another consumer of this bot is active")
    })
    .await;
    let text = logs.text();
    let line = text
        .lines()
        .find(|l| l.contains("another consumer of this bot is active"))
        .expect("logged");
    assert!(line.contains("ERROR"), "an error, not a warning: {line}");
    assert!(line.contains("getUpdates"), "{line}");
    assert!(
        line.contains("terminated by other getUpdates request"),
        "{line}"
    );
    assert!(
        line.contains("stop the other poller") && line.contains("delete the webhook"),
        "it says what to do: {line}"
    );
    assert!(
        line.contains("bot=\"shop\"") || line.contains("bot=shop"),
        "{line}"
    );
    let conflicted = fake.calls("getUpdates").len();

    // The other process stops: polling goes on by itself.
    fake.set_mode(FakeMode::Normal);
    fake.push_update(message(3_001, 1_790_000_010, "after"));
    wait_for("the update after the conflict", || async {
        received_ids(&app.store).await == [3_000, 3_001]
    })
    .await;
    assert!(fake.calls("getUpdates").len() > conflicted);
    app.stop().await;
    assert!(!logs.text().contains(TOKEN), "the token is never logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn help_in_poll_mode_is_answered_with_send_message() {
    let ledger = Ledger::create(Backend::Sqlite).await.expect("SQLite");
    let fake = FakeTelegram::start(TOKEN).await;
    let app = TestApp::spawn(&ledger, &poll_config(&fake, COUPON)).await;
    fake.push_update(message(4_000, 1_790_000_000, "/help"));
    fake.push_update(message(4_001, 1_790_000_001, "/coupon"));
    wait_for("two answers", || async {
        fake.calls("sendMessage").len() == 2
    })
    .await;
    let mut sent = fake.calls("sendMessage");
    sent.sort_by_key(|m| m["text"].as_str().map(str::len));
    let usage = &sent[0];
    assert_eq!(usage["chat_id"], 42);
    assert_eq!(usage["text"], "Usage: /coupon <campaign>");
    let help = &sent[1];
    assert_eq!(help["chat_id"], 42);
    let text = help["text"].as_str().expect("a text");
    assert!(text.contains("/coupon <campaign>"), "{text}");
    assert!(text.contains("/help"), "{text}");
    assert_eq!(received_ids(&app.store).await, [4_000, 4_001]);
    assert_eq!(
        count(&app.store, "Received").await,
        0,
        "pure answers start nothing"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_polled_click_is_answered_with_answer_callback_query() {
    let ledger = Ledger::create(Backend::Sqlite).await.expect("SQLite");
    let fake = FakeTelegram::start(TOKEN).await;
    let app = TestApp::spawn(&ledger, &poll_config(&fake, COUPON)).await;
    // A button of another bot's making: recorded, starts nothing, and still answered so that
    // the button stops spinning.
    fake.push_update(crate::support::app::click(5_000, 42, "not-ours"));
    wait_for("the click's answer", || async {
        fake.calls("answerCallbackQuery").len() == 1
    })
    .await;
    let answered = &fake.calls("answerCallbackQuery")[0];
    assert_eq!(answered["callback_query_id"], "cb5000");
    assert!(
        fake.calls("sendMessage").is_empty(),
        "a click is not answered by message"
    );
    assert_eq!(received_ids(&app.store).await, [5_000]);
    app.stop().await;
}
