//! `TestApp`: the service built in-process by `App::build` (as `main` builds it), on a fresh
//! ledger of either backend, listening on a port-0 loopback socket, driven over HTTP like
//! Telegram drives it. The clock is a manual one, so tests cross retention windows at will.

#![allow(
    dead_code,
    reason = "shared test support: each test uses a different part of it"
)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use opledger_config::Config;
use opledger_server::{App, Intake, ManualClock};
use opledger_store::{AnyOptions, AnyStore, EventStore, RecordedEvent};
use opledger_worker::{Backoff, Worker, WorkerOptions};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::support::postgres::TestDatabase;

/// The webhook secret every test bot uses.
pub(crate) const SECRET: &str = "test-webhook-secret_0123456789";
/// The token every test bot uses.
pub(crate) const TOKEN: &str = "123456:TEST-token_abcdefghijklmnop";

/// Which backend a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Sqlite,
    Postgres,
}

/// Where a test's ledger lives; dropped (deleted) with the test.
#[derive(Debug)]
pub(crate) enum Ledger {
    Sqlite(tempfile::TempDir),
    Postgres(Box<TestDatabase>),
    /// A database the test manages itself (e.g. on a private PostgreSQL cluster it stops and
    /// starts), by URL.
    Url(String),
}

impl Ledger {
    /// A fresh ledger, or `None` when PostgreSQL is unreachable outside CI (skipped).
    pub(crate) async fn create(backend: Backend) -> Option<Ledger> {
        match backend {
            Backend::Sqlite => Some(Ledger::Sqlite(
                tempfile::tempdir().expect("temporary directory"),
            )),
            Backend::Postgres => TestDatabase::create()
                .await
                .map(|database| Ledger::Postgres(Box::new(database))),
        }
    }

    pub(crate) fn url(&self) -> String {
        match self {
            Ledger::Sqlite(dir) => format!("sqlite://{}", dir.path().join("ledger.db").display()),
            Ledger::Postgres(database) => database.url().to_owned(),
            Ledger::Url(url) => url.clone(),
        }
    }

    /// Opens a store on this ledger, with opledger's inline read models.
    pub(crate) async fn open(&self) -> AnyStore {
        let options = AnyOptions {
            inline: opledger_projections::inline(),
            ..AnyOptions::default()
        };
        AnyStore::open(&self.url(), options)
            .await
            .expect("open the ledger")
    }

    /// Takes SQLite's write lock from another connection, as a second process would; the lock
    /// is held until the connection runs `ROLLBACK` or closes.
    pub(crate) async fn hold_sqlite_write_lock(&self) -> sqlx::SqliteConnection {
        use sqlx::{ConnectOptions, Executor};
        let Ledger::Sqlite(dir) = self else {
            panic!("only an SQLite ledger has a write lock to hold")
        };
        let mut blocker = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(dir.path().join("ledger.db"))
            .connect()
            .await
            .expect("open a second connection");
        blocker
            .execute("BEGIN EXCLUSIVE")
            .await
            .expect("take the write lock");
        blocker
    }
}

/// A configuration for tests: one webhook bot `shop` with the test secret and token, and the
/// given extra TOML (actions, server keys) appended.
pub(crate) fn config(extra: &str) -> Config {
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n\
         [[bots]]\nname = \"shop\"\ntoken_env = \"SHOP_TOKEN\"\n\
         webhook_secret_env = \"SHOP_SECRET\"\n{extra}"
    );
    let env: HashMap<&str, &str> = HashMap::from([("SHOP_TOKEN", TOKEN), ("SHOP_SECRET", SECRET)]);
    Config::parse(&text, &|name| env.get(name).map(|v| (*v).to_owned())).expect("test config")
}

/// The coupon action most tests use: `/coupon <campaign>`, one per campaign and user.
pub(crate) const COUPON: &str = "[[actions]]\nname = \"coupon\"\nbot = \"shop\"\n\
    command = \"coupon\"\nparams = [\"campaign\"]\nkey = \"{campaign}:{user_id}\"\n\
    [actions.effector]\nurl = \"http://127.0.0.1:9/coupons\"\n";

/// The time the manual clock starts at.
pub(crate) fn start_time() -> DateTime<Utc> {
    DateTime::from_timestamp(1_790_000_000, 0).expect("a valid time")
}

/// A running service.
#[derive(Debug)]
pub(crate) struct TestApp {
    pub(crate) address: SocketAddr,
    pub(crate) store: AnyStore,
    pub(crate) clock: Arc<ManualClock>,
    pub(crate) http: reqwest::Client,
    app: Option<JoinHandle<std::io::Result<()>>>,
    stop: Option<oneshot::Sender<()>>,
    intake: Intake,
    /// The asynchronous read models' runner, as `opledger serve` runs it.
    projector: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
}

impl TestApp {
    /// Builds and starts the service on `ledger` with `config`.
    pub(crate) async fn spawn(ledger: &Ledger, config: &Config) -> TestApp {
        let clock = Arc::new(ManualClock::new(start_time()));
        Self::spawn_with_clock(ledger, config, clock).await
    }

    /// Like [`TestApp::spawn`], with a given clock (to restart with time kept).
    pub(crate) async fn spawn_with_clock(
        ledger: &Ledger,
        config: &Config,
        clock: Arc<ManualClock>,
    ) -> TestApp {
        let store = ledger.open().await;
        // The read models' runner, like `opledger serve`'s: registered before the service
        // answers, then kept caught up in the background.
        let mut projector = opledger_projections::Projector::new(
            store.clone(),
            opledger_projections::builtin(),
            opledger_projections::ProjectorOptions::default(),
        );
        projector.prepare().await.expect("prepare the read models");
        let (stop_projector, projector_stopped) = oneshot::channel();
        let projector = tokio::spawn(projector.run(async move {
            let _ = projector_stopped.await;
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a port");
        let address = listener.local_addr().expect("local address");
        let app = App::build_with_clock(config, store.clone(), clock.clone());
        // An intake over the same store gives tests what Telegram cannot do (issue tokens)
        // while the service runs.
        let intake = Intake::new(config, store.clone(), clock.clone());
        let (stop, stopped) = oneshot::channel();
        let handle = tokio::spawn(app.run(listener, async move {
            let _ = stopped.await;
        }));
        TestApp {
            address,
            store,
            clock,
            http: reqwest::Client::new(),
            app: Some(handle),
            stop: Some(stop),
            intake,
            projector: Some((stop_projector, projector)),
        }
    }

    /// An intake on the service's ledger, for what Telegram cannot do (issuing button tokens).
    pub(crate) fn intake(&self) -> &Intake {
        &self.intake
    }

    pub(crate) fn webhook_url(&self, bot: &str) -> String {
        format!("http://{}/telegram/{bot}/webhook", self.address)
    }

    /// POSTs a body with the right secret, as Telegram would.
    pub(crate) async fn deliver(&self, body: impl Into<Vec<u8>>) -> reqwest::Response {
        self.deliver_with_secret(Some(SECRET), body).await
    }

    /// POSTs a body with the given secret header (or none).
    pub(crate) async fn deliver_with_secret(
        &self,
        secret: Option<&str>,
        body: impl Into<Vec<u8>>,
    ) -> reqwest::Response {
        let mut request = self
            .http
            .post(self.webhook_url("shop"))
            .header("content-type", "application/json")
            .body(body.into());
        if let Some(secret) = secret {
            request = request.header("x-telegram-bot-api-secret-token", secret);
        }
        request.send().await.expect("the service answers")
    }

    /// Every event in the ledger.
    pub(crate) async fn events(&self) -> Vec<RecordedEvent> {
        self.store
            .read_all(1, 100_000)
            .await
            .expect("read the ledger")
    }

    /// A worker `id` on this service's ledger and clock, with `concurrency` tasks, a 1 s retry
    /// backoff (capped at a minute) and replies a millisecond apart, as the tests want it.
    pub(crate) fn worker(&self, config: &Config, id: &str, concurrency: usize) -> Worker {
        let mut options = WorkerOptions::new(id);
        options.concurrency = concurrency;
        options.backoff = Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
        };
        options.reply_interval = Duration::from_millis(1);
        Worker::new(config, self.store.clone(), self.clock.clone(), options)
            .expect("build the worker")
    }

    /// How many events of `event_type` the ledger holds.
    pub(crate) async fn count(&self, event_type: &str) -> usize {
        self.events()
            .await
            .iter()
            .filter(|e| e.event_type == event_type)
            .count()
    }

    /// Stops the read models' runner, as if it had died: the service goes on answering while
    /// the asynchronous read models stop following the ledger.
    pub(crate) async fn stop_projections(&mut self) {
        if let Some((stop, projector)) = self.projector.take() {
            let _ = stop.send(());
            projector.await.expect("the projector task");
        }
    }

    /// Stops the service gracefully and waits for it.
    pub(crate) async fn stop(mut self) {
        self.stop_projections().await;
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(app) = self.app.take() {
            app.await
                .expect("the service task")
                .expect("the service stops cleanly");
        }
        self.store.close().await;
    }
}

/// A message update carrying `text` from user 42 in chat 42, dated `date` (Unix seconds).
pub(crate) fn message(update_id: i64, date: i64, text: &str) -> Vec<u8> {
    message_from(update_id, date, 42, text)
}

/// A message update carrying `text` from `user` in a private chat with them.
pub(crate) fn message_from(update_id: i64, date: i64, user: i64, text: &str) -> Vec<u8> {
    let entities = if text.starts_with('/') {
        let length = text
            .split_whitespace()
            .next()
            .map_or(0, |w| w.encode_utf16().count());
        serde_json::json!([{ "type": "bot_command", "offset": 0, "length": length }])
    } else {
        serde_json::json!([])
    };
    serde_json::to_vec(&serde_json::json!({
        "update_id": update_id,
        "message": {
            "message_id": update_id,
            "date": date,
            "chat": { "id": user, "type": "private" },
            "from": { "id": user, "is_bot": false, "first_name": "Test" },
            "text": text,
            "entities": entities,
        }
    }))
    .expect("JSON")
}

/// A button click on callback data `data` by `user`.
pub(crate) fn click(update_id: i64, user: i64, data: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "update_id": update_id,
        "callback_query": {
            "id": format!("cb{update_id}"),
            "from": { "id": user, "is_bot": false, "first_name": "Test" },
            "chat_instance": "1",
            "message": {
                "message_id": 7,
                "date": 1_790_000_000,
                "chat": { "id": user, "type": "private" },
            },
            "data": data,
        }
    }))
    .expect("JSON")
}

/// Runs an async test body once per backend, as `#[tokio::test]`s named `<name>_sqlite` and
/// `<name>_postgres`.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        $(
            pub(crate) mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn sqlite() {
                    super::$name($crate::support::app::Backend::Sqlite).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn postgres() {
                    super::$name($crate::support::app::Backend::Postgres).await;
                }
            }
        )*
    };
}
pub(crate) use on_both_backends;
