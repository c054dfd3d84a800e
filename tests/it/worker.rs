//! The worker in-process on both backends: updates enter through the real webhook, the worker
//! (built as `opledger serve` builds it, on the service's manual clock) calls a fake service on
//! loopback and replies through a fake Bot API. Each test drives one path of the effector's
//! classification, the lease-expiry sweep, or a race, and checks the ledger and what the
//! service saw.

use std::collections::HashMap;
use std::time::Duration;

use std::sync::Arc;

use chrono::{TimeDelta, Utc};
use opledger_config::Config;
use opledger_domain::operation::{OperationCommand, decide};
use opledger_domain::{Causation, EventMetadata, Operation};
use opledger_ledger::{expected, load, request};
use opledger_projections::operation_status::{self, Filter, OperationStatusRow};
use opledger_server::{Clock, ManualClock};
use opledger_store::{EventStore, Priority, StreamId};
use opledger_worker::{
    Backoff, CallOutcome, EffectRequest, Effector, LookupOutcome, Success, Worker, WorkerOptions,
};
use serde_json::Value;

use crate::support::app::{Backend, Ledger, TOKEN, TestApp, message_from, on_both_backends};
use crate::support::fake_service::{Behaviour, FakeService, LookupMode};
use crate::support::fake_telegram::FakeTelegram;

/// How the test's coupon action calls the service.
#[derive(Clone, Copy)]
struct Setup {
    honours_key: bool,
    lookup: bool,
    timeout_ms: u64,
    max_attempts: u32,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            honours_key: false,
            lookup: false,
            timeout_ms: 300,
            max_attempts: 5,
        }
    }
}

struct World {
    _ledger: Ledger,
    app: TestApp,
    service: FakeService,
    telegram: FakeTelegram,
    config: Config,
}

impl World {
    async fn start(backend: Backend, effector: Setup) -> Option<World> {
        let service = FakeService::start(effector.honours_key).await;
        Self::start_with(backend, effector, service, None).await
    }

    /// A world whose effector URL is `url` instead of the fake service's.
    async fn start_with(
        backend: Backend,
        effector: Setup,
        service: FakeService,
        url: Option<String>,
    ) -> Option<World> {
        let ledger = Ledger::create(backend).await?;
        let telegram = FakeTelegram::start(TOKEN).await;
        let lookup = if effector.lookup {
            format!("lookup_url = \"{}\"\n", service.lookup_url())
        } else {
            String::new()
        };
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n\
             [[bots]]\nname = \"shop\"\ntoken_env = \"SHOP_TOKEN\"\n\
             webhook_secret_env = \"SHOP_SECRET\"\napi_base_url = \"{api}\"\n\
             [[actions]]\nname = \"coupon\"\nbot = \"shop\"\ncommand = \"coupon\"\n\
             params = [\"campaign\"]\nkey = \"{{campaign}}:{{user_id}}\"\n\
             [actions.effector]\nurl = \"{url}\"\ntimeout_ms = {timeout}\n\
             honours_idempotency_key = {honours}\nmax_attempts = {attempts}\n{lookup}\
             [actions.reply]\nconfirmed = \"Your coupon: {{result.code}}\"\n\
             failed = \"Sorry: {{error}}\"\n",
            api = telegram.base_url(),
            url = url.unwrap_or_else(|| service.url()),
            timeout = effector.timeout_ms,
            honours = effector.honours_key,
            attempts = effector.max_attempts,
        );
        let env: HashMap<&str, &str> = HashMap::from([
            ("SHOP_TOKEN", TOKEN),
            ("SHOP_SECRET", crate::support::app::SECRET),
        ]);
        let config = Config::parse(&text, &|name| env.get(name).map(|v| (*v).to_owned()))
            .expect("test config");
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

    fn worker(&self, id: &str, concurrency: usize) -> Worker {
        self.worker_on(id, concurrency, self.app.clock.clone())
    }

    fn worker_on(&self, id: &str, concurrency: usize, clock: Arc<dyn Clock>) -> Worker {
        self.worker_with(id, concurrency, clock, |_| {})
    }

    fn worker_with(
        &self,
        id: &str,
        concurrency: usize,
        clock: Arc<dyn Clock>,
        tweak: impl FnOnce(&mut WorkerOptions),
    ) -> Worker {
        let mut options = WorkerOptions::new(id);
        options.concurrency = concurrency;
        options.backoff = Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
        };
        options.lease_margin = Duration::from_secs(5);
        options.reply_interval = Duration::from_millis(1);
        tweak(&mut options);
        Worker::new(&self.config, self.app.store.clone(), clock, options).expect("build the worker")
    }

    /// `/coupon <campaign>` from `user`, delivered through the webhook.
    async fn ask(&self, update_id: i64, user: i64, campaign: &str) {
        let body = message_from(
            update_id,
            1_790_000_000,
            user,
            &format!("/coupon {campaign}"),
        );
        let response = self.app.deliver(body).await;
        assert_eq!(response.status(), 200, "the update is acknowledged");
    }

    async fn operations(&self) -> Vec<OperationStatusRow> {
        operation_status::list(
            self.app.store.reader(),
            &Filter {
                limit: 10_000,
                ..Filter::default()
            },
        )
        .await
        .expect("read operation_status")
    }

    async fn only_operation(&self) -> OperationStatusRow {
        let mut rows = self.operations().await;
        assert_eq!(rows.len(), 1, "one operation: {rows:#?}");
        rows.remove(0)
    }

    /// The event types of an operation's stream, in order.
    async fn history(&self, row: &OperationStatusRow) -> Vec<String> {
        self.stream_events(row)
            .await
            .into_iter()
            .map(|(event_type, _)| event_type)
            .collect()
    }

    async fn stream_events(&self, row: &OperationStatusRow) -> Vec<(String, Value)> {
        self.recorded(row)
            .await
            .into_iter()
            .map(|e| {
                let payload: Value = serde_json::from_slice(&e.payload).expect("payload");
                (e.event_type, payload)
            })
            .collect()
    }

    /// The ledger position of the first `event_type` event on `row`'s stream.
    async fn position_of(&self, row: &OperationStatusRow, event_type: &str) -> Option<u64> {
        self.recorded(row)
            .await
            .into_iter()
            .find(|e| e.event_type == event_type)
            .map(|e| e.position)
    }

    /// The events of `row`'s stream as recorded, in order.
    async fn recorded(&self, row: &OperationStatusRow) -> Vec<opledger_store::RecordedEvent> {
        let stream = StreamId::new(row.stream_id.clone()).expect("stream id");
        self.app
            .store
            .read_stream(&stream, 1, 1000)
            .await
            .expect("read the stream")
    }

    fn advance(&self, seconds: i64) {
        self.app.clock.advance(TimeDelta::seconds(seconds));
    }

    /// Appends what a worker that then died would have appended: `commands`, as `ghost`.
    async fn ghost(&self, row: &OperationStatusRow, commands: Vec<OperationCommand>) {
        let stream = StreamId::new(row.stream_id.clone()).expect("stream id");
        let metadata = EventMetadata::caused_by(Causation::Worker {
            worker: "ghost".to_owned(),
        });
        for command in commands {
            let state: Operation = load(&self.app.store, &stream).await.expect("load");
            let events =
                decide(&state, &command, self.app.clock.now()).expect("the ghost's command");
            let append = request(stream.clone(), expected(state.version), &events, &metadata)
                .expect("request");
            self.app.store.append(vec![append]).await.expect("append");
        }
    }

    async fn stop(self) {
        self.app.stop().await;
    }
}

fn ghost_claim(world: &World, lease_secs: i64) -> OperationCommand {
    OperationCommand::Claim {
        worker: "ghost".to_owned(),
        lease_until: world.app.clock.now() + TimeDelta::seconds(lease_secs),
    }
}

on_both_backends!(
    a_confirmed_call_is_sent_once_with_the_operation_id_and_replied,
    a_refusal_fails_at_once_and_is_never_retried,
    nothing_sent_is_retried_with_backoff_then_given_up,
    overload_is_retried_no_earlier_than_retry_after,
    an_unknown_outcome_is_retried_only_with_a_key_the_service_honours,
    an_unknown_outcome_is_confirmed_by_lookup,
    a_lookup_that_finds_nothing_retries_with_the_same_operation_id,
    an_unknown_outcome_without_key_or_lookup_goes_to_a_person,
    a_failing_lookup_goes_to_a_person,
    an_expired_claim_with_nothing_sent_is_claimed_again,
    an_expired_claim_after_the_call_was_sent_is_never_called_again,
    racing_workers_claim_each_operation_once,
    an_in_process_effector_follows_the_same_contract,
    replies_to_one_chat_are_paced,
    an_outcome_whose_stream_moved_is_committed_apart_from_the_next_claim,
    a_reply_refused_by_flood_control_waits_for_retry_after,
    a_reply_whose_sender_died_is_never_sent_again,
    a_failed_operation_is_replied_with_the_failure,
    a_reply_keeps_its_operation_s_place_ahead_of_operations_received_after_it,
);

async fn a_confirmed_call_is_sent_once_with_the_operation_id_and_replied(backend: Backend) {
    let Some(world) = World::start(backend, Setup::default()).await else {
        return;
    };
    world.ask(1, 7, "spring").await;
    let worker = world.worker("w1", 2);
    worker.run_due().await.expect("work");
    let row = world.only_operation().await;
    assert_eq!(row.status, "confirmed");
    assert_eq!(row.external_id.as_deref(), Some("cpn_1"));
    assert_eq!(
        world.service.requests(),
        HashMap::from([(row.operation_id.clone(), 1)]),
        "one request, keyed by the operation id"
    );
    let body = world.service.body(&row.operation_id).expect("a JSON body");
    assert_eq!(body["operation_id"], row.operation_id);
    assert_eq!(body["action"], "coupon");
    assert_eq!(body["business_key"], "spring:7");
    assert_eq!(body["params"]["campaign"], "spring");
    assert_eq!(body["chat_id"], 7);
    assert_eq!(body["user_id"], 7);

    worker.run_due().await.expect("reply");
    let sent = world.telegram.calls("sendMessage");
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["chat_id"], 7);
    assert_eq!(sent[0]["text"], "Your coupon: SAVE-1");
    assert_eq!(
        world.history(&world.only_operation().await).await,
        [
            "Received",
            "Claimed",
            "ExternalCallSent",
            "Confirmed",
            "ReplyStarted",
            "ReplySent"
        ]
    );
    // Nothing is left to do: more rounds call nothing and send nothing.
    world.advance(3600);
    worker.run_due().await.expect("idle");
    assert_eq!(world.service.total_requests(), 1);
    assert_eq!(world.telegram.calls("sendMessage").len(), 1);
    let events = world.stream_events(&row).await;
    let confirmed = &events[3].1;
    assert_eq!(confirmed["via"], "response");
    assert_eq!(confirmed["result"]["code"], "SAVE-1");
    assert_eq!(
        confirmed["response_digest"].as_str().map(str::len),
        Some(64),
        "the answer's digest is kept"
    );
    world.stop().await;
}

async fn a_refusal_fails_at_once_and_is_never_retried(backend: Backend) {
    let Some(world) = World::start(backend, Setup::default()).await else {
        return;
    };
    world.service.script([Behaviour::Refuse {
        status: 422,
        retry_after: None,
    }]);
    world.ask(1, 7, "spring").await;
    let worker = world.worker("w1", 1);
    worker.run_due().await.expect("work");
    let row = world.only_operation().await;
    assert_eq!(row.status, "failed");
    world.advance(3600);
    worker.run_due().await.expect("work");
    worker.run_due().await.expect("work");
    assert_eq!(world.service.total_requests(), 1, "a 4xx is never retried");
    assert_eq!(
        world.history(&row).await[..4],
        ["Received", "Claimed", "ExternalCallSent", "Failed"]
    );
    world.stop().await;
}

async fn nothing_sent_is_retried_with_backoff_then_given_up(backend: Backend) {
    // A port nobody listens on: every connection is refused, so nothing is ever sent.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address")
    };
    let service = FakeService::start(false).await;
    let effector = Setup {
        max_attempts: 3,
        ..Setup::default()
    };
    let url = Some(format!("http://{closed}/coupons"));
    let Some(world) = World::start_with(backend, effector, service, url).await else {
        return;
    };
    world.ask(1, 7, "spring").await;
    let worker = world.worker("w1", 1);
    worker.run_due().await.expect("work");
    let row = world.only_operation().await;
    assert_eq!(row.status, "retry_scheduled");
    let first_due = row.due_at.expect("a retry time");
    let delay = first_due - world.app.clock.now();
    assert!(
        delay >= TimeDelta::milliseconds(500) && delay <= TimeDelta::seconds(1),
        "first backoff within [base/2, base]: {delay}"
    );
    // Not due yet: nothing happens.
    worker.run_due().await.expect("work");
    assert_eq!(world.only_operation().await.attempts, 1);
    world.advance(60);
    worker.run_due().await.expect("work");
    let row = world.only_operation().await;
    assert_eq!((row.status.as_str(), row.attempts), ("retry_scheduled", 2));
    world.advance(60);
    worker.run_due().await.expect("work");
    let row = world.only_operation().await;
    assert_eq!(row.status, "failed", "{row:?}");
    assert!(
        row.last_error.as_deref().is_some_and(
            |e| e.contains("gave up after 3 attempts") && e.contains("nothing was sent")
        ),
        "{:?}",
        row.last_error
    );
    world.stop().await;
}

async fn overload_is_retried_no_earlier_than_retry_after(backend: Backend) {
    let Some(world) = World::start(backend, Setup::default()).await else {
        return;
    };
    world.service.script([Behaviour::Refuse {
        status: 429,
        retry_after: Some(30),
    }]);
    world.ask(1, 7, "spring").await;
    let worker = world.worker("w1", 1);
    worker.run_due().await.expect("work");
    let row = world.only_operation().await;
    assert_eq!(row.status, "retry_scheduled");
    world.advance(20);
    worker.run_due().await.expect("work");
    assert_eq!(world.service.total_requests(), 1, "Retry-After is honoured");
    world.advance(11);
    worker.run_due().await.expect("work");
    let row = world.only_operation().await;
    assert_eq!(row.status, "confirmed");
    assert_eq!(world.service.creations().values().sum::<usize>(), 1);
    world.stop().await;
}

async fn an_unknown_outcome_is_retried_only_with_a_key_the_service_honours(backend: Backend) {
    let effector = Setup {
        honours_key: true,
        ..Setup::default()
    };
    let Some(world) = World::start(backend, effector).await else {
        return;
    };
    world
        .service
        .script([Behaviour::CreateThenHang(Duration::from_secs(3))]);
    world.ask(1, 7, "spring").await;
    let worker = world.worker("w1", 1);
    worker.run_due().await.expect("work");
    let row = world.only_operation().await;
    assert_eq!(row.status, "retry_scheduled", "{row:?}");
    let events = world.stream_events(&row).await;
    assert_eq!(events[3].0, "RetryScheduled");
    assert_eq!(events[3].1["same_key"], true);
    world.advance(60);
    worker.run_due().await.expect("work");
    let row = world.only_operation().await;
    assert_eq!(row.status, "confirmed");
    assert_eq!(
        world.service.requests(),
        HashMap::from([(row.operation_id.clone(), 2)]),
        "the retry carried the same key"
    );
    assert_eq!(
        world.service.creations(),
        HashMap::from([(row.operation_id.clone(), 1)]),
        "one effective creation"
    );
    world.stop().await;
}

async fn an_unknown_outcome_is_confirmed_by_lookup(backend: Backend) {
    let effector = Setup {
        lookup: true,
        ..Setup::default()
    };
    let Some(world) = World::start(backend, effector).await else {
        return;
    };
    world
        .service
        .script([Behaviour::CreateThenHang(Duration::from_secs(3))]);
    world.ask(1, 7, "spring").await;
    let worker = world.worker("w1", 1);
    worker.run_due().await.expect("work");
    let row = world.only_operation().await;
    assert_eq!(row.status, "confirmed");
    assert_eq!(row.external_id.as_deref(), Some("cpn_1"));
    assert_eq!(world.service.total_requests(), 1, "never a second POST");
    assert_eq!(world.service.lookups(), 1);
    let events = world.stream_events(&row).await;
    assert_eq!(events[3].0, "Confirmed");
    assert_eq!(events[3].1["via"], "lookup");
    world.stop().await;
}

async fn a_lookup_that_finds_nothing_retries_with_the_same_operation_id(backend: Backend) {
    let effector = Setup {
        lookup: true,
        ..Setup::default()
    };
    let Some(world) = World::start(backend, effector).await else {
        return;
    };
    world
        .service
        .script([Behaviour::Hang(Duration::from_secs(3))]);
    world.ask(1, 7, "spring").await;
    let worker = world.worker("w1", 1);
    worker.run_due().await.expect("work");
    let row = world.only_operation().await;
    assert_eq!(row.status, "retry_scheduled");
    world.advance(60);
    worker.run_due().await.expect("work");
    let row = world.only_operation().await;
    assert_eq!(row.status, "confirmed");
    assert_eq!(
        world.service.requests(),
        HashMap::from([(row.operation_id.clone(), 2)])
    );
    assert_eq!(world.service.creations().values().sum::<usize>(), 1);
    world.stop().await;
}

async fn an_unknown_outcome_without_key_or_lookup_goes_to_a_person(backend: Backend) {
    let Some(world) = World::start(backend, Setup::default()).await else {
        return;
    };
    world.service.script([Behaviour::CreateThenFail(500)]);
    world.ask(1, 7, "spring").await;
    let worker = world.worker("w1", 1);
    worker.run_due().await.expect("work");
    let row = world.only_operation().await;
    assert_eq!(row.status, "needs_reconciliation");
    assert!(
        row.last_error.as_deref().is_some_and(|e| e.contains("500")),
        "{:?}",
        row.last_error
    );
    world.advance(24 * 3600);
    worker.run_due().await.expect("work");
    assert_eq!(world.service.total_requests(), 1, "never repeated blindly");
    assert!(
        world.telegram.calls("sendMessage").is_empty(),
        "no reply yet"
    );
    world.stop().await;
}

async fn a_failing_lookup_goes_to_a_person(backend: Backend) {
    let effector = Setup {
        lookup: true,
        ..Setup::default()
    };
    let Some(world) = World::start(backend, effector).await else {
        return;
    };
    world.service.set_lookup(LookupMode::Broken);
    world
        .service
        .script([Behaviour::CreateThenHang(Duration::from_secs(3))]);
    world.ask(1, 7, "spring").await;
    let worker = world.worker("w1", 1);
    worker.run_due().await.expect("work");
    let row = world.only_operation().await;
    assert_eq!(row.status, "needs_reconciliation");
    assert_eq!(world.service.total_requests(), 1);
    assert_eq!(world.service.lookups(), 1);
    world.stop().await;
}

async fn an_expired_claim_with_nothing_sent_is_claimed_again(backend: Backend) {
    let Some(world) = World::start(backend, Setup::default()).await else {
        return;
    };
    world.ask(1, 7, "spring").await;
    let row = world.only_operation().await;
    world.ghost(&row, vec![ghost_claim(&world, 30)]).await;
    let worker = world.worker("w1", 1);
    worker.run_due().await.expect("work");
    assert_eq!(world.service.total_requests(), 0, "the ghost's lease holds");
    world.advance(31);
    worker.run_due().await.expect("work");
    let row = world.only_operation().await;
    assert_eq!((row.status.as_str(), row.attempts), ("confirmed", 2));
    assert_eq!(world.service.total_requests(), 1);
    world.stop().await;
}

async fn an_expired_claim_after_the_call_was_sent_is_never_called_again(backend: Backend) {
    let Some(world) = World::start(backend, Setup::default()).await else {
        return;
    };
    world.ask(1, 7, "spring").await;
    let row = world.only_operation().await;
    world
        .ghost(
            &row,
            vec![
                ghost_claim(&world, 30),
                OperationCommand::RecordCallSent {
                    worker: "ghost".to_owned(),
                },
            ],
        )
        .await;
    let worker = world.worker("w1", 1);
    worker.run_due().await.expect("work");
    assert_eq!(world.only_operation().await.status, "call_sent");
    world.advance(31);
    worker.run_due().await.expect("work");
    let row = world.only_operation().await;
    assert_eq!(row.status, "needs_reconciliation");
    assert_eq!(world.service.total_requests(), 0, "no blind repeat");
    world.stop().await;
}

async fn racing_workers_claim_each_operation_once(backend: Backend) {
    let Some(world) = World::start(backend, Setup::default()).await else {
        return;
    };
    for user in 1..=40 {
        world.ask(user, user, "race").await;
    }
    let a = world.worker("a", 8);
    let b = world.worker("b", 8);
    let (ra, rb) = tokio::join!(a.run_due(), b.run_due());
    ra.expect("a works");
    rb.expect("b works");
    // Whatever one worker lost, the next round finishes.
    a.run_due().await.expect("a works");
    let rows = world.operations().await;
    assert_eq!(rows.len(), 40);
    for row in &rows {
        assert_eq!(row.status, "confirmed", "{row:?}");
        let claims = world
            .history(row)
            .await
            .iter()
            .filter(|t| *t == "Claimed")
            .count();
        assert_eq!(claims, 1, "one claim per operation: {row:?}");
    }
    assert!(world.service.requests().values().all(|n| *n == 1));
    assert_eq!(world.service.total_requests(), 40);
    world.stop().await;
}

async fn a_reply_refused_by_flood_control_waits_for_retry_after(backend: Backend) {
    let Some(world) = World::start(backend, Setup::default()).await else {
        return;
    };
    world.telegram.script_send_message_retry_after(5);
    world.ask(1, 7, "spring").await;
    let worker = world.worker("w1", 1);
    worker.run_due().await.expect("call");
    worker.run_due().await.expect("reply refused");
    let row = world.only_operation().await;
    assert_eq!(row.reply, "retry_scheduled");
    world.advance(3);
    worker.run_due().await.expect("too early");
    assert_eq!(world.telegram.calls("sendMessage").len(), 1);
    world.advance(3);
    worker.run_due().await.expect("reply");
    assert_eq!(world.only_operation().await.reply, "sent");
    assert_eq!(world.telegram.calls("sendMessage").len(), 2);
    world.stop().await;
}

async fn a_reply_whose_sender_died_is_never_sent_again(backend: Backend) {
    let Some(world) = World::start(backend, Setup::default()).await else {
        return;
    };
    world.ask(1, 7, "spring").await;
    let worker = world.worker("w1", 1);
    worker.run_due().await.expect("call");
    let row = world.only_operation().await;
    world.ghost(&row, vec![OperationCommand::StartReply]).await;
    worker.run_due().await.expect("in flight elsewhere");
    assert!(world.telegram.calls("sendMessage").is_empty());
    world.advance(61);
    worker.run_due().await.expect("sweep");
    let row = world.only_operation().await;
    assert_eq!(row.reply, "unknown");
    world.advance(3600);
    worker.run_due().await.expect("idle");
    assert!(
        world.telegram.calls("sendMessage").is_empty(),
        "a reply that may have arrived is never sent again"
    );
    world.stop().await;
}

async fn a_failed_operation_is_replied_with_the_failure(backend: Backend) {
    let Some(world) = World::start(backend, Setup::default()).await else {
        return;
    };
    world.service.script([Behaviour::Refuse {
        status: 409,
        retry_after: None,
    }]);
    world.ask(1, 7, "spring").await;
    let worker = world.worker("w1", 1);
    worker.run_due().await.expect("call");
    worker.run_due().await.expect("reply");
    let sent = world.telegram.calls("sendMessage");
    assert_eq!(sent.len(), 1);
    let text = sent[0]["text"].as_str().unwrap_or_default();
    assert!(
        text.starts_with("Sorry: ") && text.contains("409"),
        "{text}"
    );
    world.stop().await;
}

/// How many operations the concurrency tests carry out.
const MANY: i64 = 1000;

/// Records `/coupon bulk` from `MANY` users straight through the intake.
async fn ask_many(world: &World) {
    for user in 1..=MANY {
        let update = message_from(user, 1_790_000_000, user, "/coupon bulk");
        world
            .app
            .intake()
            .record("shop", &update)
            .await
            .expect("record the update");
    }
}

/// Waits until every operation is confirmed.
async fn all_confirmed(world: &World) -> Vec<OperationStatusRow> {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let rows = world.operations().await;
        if rows.len() == usize::try_from(MANY).unwrap()
            && rows.iter().all(|r| r.status == "confirmed")
        {
            return rows;
        }
        let pending: Vec<_> = rows
            .iter()
            .filter(|r| r.status != "confirmed")
            .take(3)
            .collect();
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {MANY} operations, some not confirmed: {pending:#?}",
            rows.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs `worker` in the background until `stop` is sent.
/// Waits until every operation is confirmed (30 s at most).
async fn until_all_confirmed(world: &World) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !world
        .operations()
        .await
        .iter()
        .all(|row| row.status == "confirmed")
    {
        assert!(std::time::Instant::now() < deadline, "not carried out");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn spawn_run(
    worker: Worker,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        worker
            .run(async move {
                let _ = stopped.await;
            })
            .await;
    });
    (stop, running)
}

/// Every operation has exactly one effective creation at the service.
fn assert_one_creation_each(world: &World, rows: &[OperationStatusRow]) {
    let creations = world.service.creations();
    for row in rows {
        assert_eq!(
            creations.get(&row.operation_id),
            Some(&1),
            "one creation for {}",
            row.operation_id
        );
    }
    assert_eq!(creations.len(), rows.len(), "no creation under another key");
}

/// Four worker tasks in one process on SQLite, with the real clock and transient refusals
/// (503s, retried with backoff) mixed in: every operation ends confirmed, created once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_worker_tasks_on_sqlite_carry_out_a_thousand_operations_once() {
    let Some(world) = World::start(Backend::Sqlite, Setup::default()).await else {
        return;
    };
    world.service.script((0..50).map(|_| Behaviour::Refuse {
        status: 503,
        retry_after: None,
    }));
    ask_many(&world).await;
    let worker = world.worker_on("solo", 4, Arc::new(opledger_server::SystemClock));
    let (stop, running) = spawn_run(worker);
    let rows = all_confirmed(&world).await;
    let _ = stop.send(());
    running.await.expect("the worker stops");
    assert_one_creation_each(&world, &rows);
    assert_eq!(
        world.service.total_requests(),
        rows.len() + 50,
        "one request per operation plus one per refusal"
    );
    world.stop().await;
}

/// Two `opledger worker` processes on one PostgreSQL ledger: every operation ends confirmed,
/// created once, whichever process took it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_worker_processes_on_postgres_carry_out_a_thousand_operations_once() {
    use crate::support::serving::{opledger, write_config};
    let Some(world) = World::start(Backend::Postgres, Setup::default()).await else {
        return;
    };
    ask_many(&world).await;
    let dir = tempfile::tempdir().expect("a directory");
    let config = write_config(
        dir.path(),
        "opledger.toml",
        &format!(
            "[storage]\nurl = \"{ledger}\"\n\
             [[bots]]\nname = \"shop\"\ntoken_env = \"SHOP_TOKEN\"\n\
             webhook_secret_env = \"SHOP_SECRET\"\napi_base_url = \"{api}\"\n\
             [[actions]]\nname = \"coupon\"\nbot = \"shop\"\ncommand = \"coupon\"\n\
             params = [\"campaign\"]\nkey = \"{{campaign}}:{{user_id}}\"\n\
             [actions.effector]\nurl = \"{url}\"\ntimeout_ms = 2000\n",
            ledger = world._ledger.url(),
            api = world.telegram.base_url(),
            url = world.service.url(),
        ),
    );
    let config = config.to_str().expect("a UTF-8 path").to_owned();
    let env = [
        ("OPLEDGER_CONFIG", config.as_str()),
        ("SHOP_TOKEN", TOKEN),
        ("SHOP_SECRET", crate::support::app::SECRET),
        ("OPLEDGER_TEST_WORKER_MS", "50"),
    ];
    let spawn = |id: &str| {
        opledger(&env)
            .args([
                "worker",
                "--worker-concurrency",
                "4",
                "--no-replies",
                "--worker-id",
                id,
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start opledger worker")
    };
    let mut processes = [spawn("p1"), spawn("p2")];
    let rows = all_confirmed(&world).await;
    for process in &mut processes {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &process.id().to_string()])
            .status();
        let status = process.wait().expect("the worker ends");
        assert!(
            status.success(),
            "a worker stops cleanly on SIGTERM: {status}"
        );
    }
    assert_one_creation_each(&world, &rows);
    assert_eq!(world.service.total_requests(), rows.len());
    world.stop().await;
}

/// An in-process effector (library use): it acts, then reports an unknown outcome, and its
/// lookup finds what it did. The worker treats it exactly like the HTTP one.
#[derive(Debug, Default)]
struct InProcess {
    calls: std::sync::Mutex<Vec<EffectRequest>>,
    done: std::sync::Mutex<HashMap<String, String>>,
}

impl Effector for InProcess {
    fn call<'a>(
        &'a self,
        request: &'a EffectRequest,
    ) -> futures_util::future::BoxFuture<'a, CallOutcome> {
        Box::pin(async move {
            self.calls.lock().unwrap().push(request.clone());
            self.done
                .lock()
                .unwrap()
                .insert(request.operation_id.clone(), "in-process-1".to_owned());
            CallOutcome::Unknown {
                reason: "the process lost the answer".to_owned(),
            }
        })
    }

    fn honours_idempotency_key(&self) -> bool {
        false
    }

    fn has_lookup(&self) -> bool {
        true
    }

    fn lookup<'a>(
        &'a self,
        request: &'a EffectRequest,
    ) -> futures_util::future::BoxFuture<'a, LookupOutcome> {
        Box::pin(async move {
            match self.done.lock().unwrap().get(&request.operation_id) {
                Some(id) => LookupOutcome::Found(Success {
                    external_id: Some(id.clone()),
                    ..Success::default()
                }),
                None => LookupOutcome::Absent,
            }
        })
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(1)
    }
}

async fn an_in_process_effector_follows_the_same_contract(backend: Backend) {
    let Some(world) = World::start(backend, Setup::default()).await else {
        return;
    };
    world.ask(1, 7, "spring").await;
    let effector = Arc::new(InProcess::default());
    let worker = world
        .worker("w1", 1)
        .with_effector("coupon", effector.clone())
        .expect("the coupon action exists");
    worker.run_due().await.expect("work");
    let row = world.only_operation().await;
    assert_eq!(row.status, "confirmed");
    assert_eq!(row.external_id.as_deref(), Some("in-process-1"));
    let calls = effector.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 1, "called once, never repeated blindly");
    assert_eq!(calls[0].operation_id, row.operation_id);
    assert_eq!(calls[0].attempt, 1);
    assert_eq!(
        world.service.total_requests(),
        0,
        "the HTTP effector was replaced"
    );
    let events = world.stream_events(&row).await;
    assert_eq!(events[3].1["via"], "lookup");
    assert!(
        world
            .worker("w2", 1)
            .with_effector("no_such_action", effector)
            .is_err(),
        "an effector for an unknown action is refused"
    );
    world.stop().await;
}

async fn replies_to_one_chat_are_paced(backend: Backend) {
    let Some(world) = World::start(backend, Setup::default()).await else {
        return;
    };
    // Two operations of one user in one chat, and one of another user.
    world.ask(1, 7, "spring").await;
    world.ask(2, 7, "summer").await;
    world.ask(3, 8, "spring").await;
    let interval = Duration::from_millis(400);
    let worker = world.worker_with("w1", 4, world.app.clock.clone(), |options| {
        options.reply_interval = interval;
    });
    worker.run_due().await.expect("calls");
    let started = std::time::Instant::now();
    worker.run_due().await.expect("replies");
    let elapsed = started.elapsed();
    assert_eq!(world.telegram.calls("sendMessage").len(), 3);
    assert!(
        elapsed >= interval,
        "the second reply to chat 7 waited for its slot: {elapsed:?}"
    );
    world.stop().await;
}

/// An effector that, during its first call, moves that operation's stream (as a late worker's
/// recorded refusal would), so the worker's commit of the outcome together with its next claim
/// meets a version conflict and must fall back to committing each on its own.
#[derive(Debug)]
struct MovesItsStream {
    store: opledger_store::AnyStore,
    calls: std::sync::Mutex<Vec<String>>,
}

impl Effector for MovesItsStream {
    fn call<'a>(
        &'a self,
        request: &'a EffectRequest,
    ) -> futures_util::future::BoxFuture<'a, CallOutcome> {
        Box::pin(async move {
            let first = {
                let mut calls = self.calls.lock().unwrap();
                calls.push(request.operation_id.clone());
                calls.len() == 1
            };
            if first {
                let stream = StreamId::new(
                    opledger_domain::operation_stream(&request.action, &request.business_key)
                        .expect("a stream id"),
                )
                .expect("a stream id");
                let state: Operation = load(&self.store, &stream).await.expect("load");
                let refusal: opledger_domain::operation::OperationEvent =
                    opledger_domain::operation::TransitionRejected {
                        command: "claim".to_owned(),
                        status: "call_sent".to_owned(),
                        reason: "a late worker's claim, refused".to_owned(),
                    }
                    .into();
                let metadata = EventMetadata::caused_by(Causation::Worker {
                    worker: "late".to_owned(),
                });
                let append = request_for(&stream, state.version, &[refusal], &metadata);
                self.store.append(vec![append]).await.expect("append");
            }
            CallOutcome::Succeeded(Success {
                external_id: Some(format!("x-{}", request.operation_id)),
                ..Success::default()
            })
        })
    }

    fn honours_idempotency_key(&self) -> bool {
        true
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(1)
    }
}

fn request_for(
    stream: &StreamId,
    version: u64,
    events: &[opledger_domain::operation::OperationEvent],
    metadata: &EventMetadata,
) -> opledger_store::AppendRequest {
    request(stream.clone(), expected(version), events, metadata).expect("a request")
}

async fn an_outcome_whose_stream_moved_is_committed_apart_from_the_next_claim(backend: Backend) {
    let Some(world) = World::start(backend, Setup::default()).await else {
        return;
    };
    world.ask(1, 7, "spring").await;
    world.ask(2, 8, "spring").await;
    let effector = Arc::new(MovesItsStream {
        store: world.app.store.clone(),
        calls: std::sync::Mutex::new(Vec::new()),
    });
    let worker = world
        .worker_with("w1", 1, world.app.clock.clone(), |options| {
            options.replies = false;
        })
        .with_effector("coupon", effector.clone())
        .expect("the coupon action exists");
    let (stop, running) = spawn_run(worker);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let rows = loop {
        let rows = world.operations().await;
        if rows.iter().all(|r| r.status == "confirmed") {
            break rows;
        }
        assert!(std::time::Instant::now() < deadline, "{rows:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let _ = stop.send(());
    running.await.expect("the worker stops");
    assert_eq!(rows.len(), 2);
    assert_eq!(effector.calls.lock().unwrap().len(), 2, "one call each");
    let first = effector.calls.lock().unwrap()[0].clone();
    let moved = rows
        .iter()
        .find(|r| r.operation_id == first)
        .expect("the first operation");
    assert_eq!(
        world.history(moved).await,
        [
            "Received",
            "Claimed",
            "ExternalCallSent",
            "TransitionRejected",
            "Confirmed"
        ],
        "the outcome was decided again on the moved stream and committed"
    );
    for row in &rows {
        let claims = world
            .history(row)
            .await
            .iter()
            .filter(|t| *t == "Claimed")
            .count();
        assert_eq!(claims, 1, "{row:?}");
    }
    world.stop().await;
}

/// With intake first (`opledger serve`'s default) and a crowd of updates being recorded all
/// along, the worker still carries every operation out, at most one step per wait, and commits
/// a call's outcome before it waits, rather than holding it until the next claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowded_intake_slows_the_worker_but_never_stops_it_or_holds_an_outcome_back() {
    let Some(world) = World::start(Backend::Sqlite, Setup::default()).await else {
        return;
    };
    world.ask(1, 7, "spring").await;
    world.ask(2, 8, "spring").await;
    let priority = world.app.store.priority().clone();
    priority.put_foreground_first(true);
    let intake: Vec<_> = (0..Priority::CROWD)
        .map(|_| priority.foreground())
        .collect();
    let worker = world.worker_with("w1", 1, Arc::new(opledger_server::SystemClock), |options| {
        options.replies = false;
    });
    let started = std::time::Instant::now();
    let (stop, running) = spawn_run(worker);
    let deadline = started + Duration::from_secs(30);
    let mut outcome_alone = false;
    loop {
        let rows = world.operations().await;
        let statuses: Vec<&str> = rows.iter().map(|r| r.status.as_str()).collect();
        // The second operation not called yet (received, or claimed with the first one's
        // record, ADR 0020): the first outcome did not wait for the second's next commit.
        if statuses.contains(&"confirmed")
            && (statuses.contains(&"received") || statuses.contains(&"claimed"))
        {
            outcome_alone = true;
        }
        if statuses.iter().all(|s| *s == "confirmed") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{rows:#?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = started.elapsed();
    drop(intake);
    let _ = stop.send(());
    running.await.expect("the worker stops");
    assert!(
        took >= Duration::from_millis(100),
        "each of the two steps waited its turn: {took:?}"
    );
    assert!(
        outcome_alone,
        "the first outcome was committed before the wait, not with the second's next commit"
    );
    assert_eq!(world.service.total_requests(), 2);
    world.stop().await;
}

/// With intake first but room to spare (an update or two in flight all along, no crowd), the
/// worker does not wait for quiet moments between its steps (ADR 0021): six operations, one
/// task, done well within the 300 ms that one step per [`Priority::WAIT`] would take.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intake_with_room_to_spare_does_not_hold_the_worker_back() {
    let Some(world) = World::start(Backend::Sqlite, Setup::default()).await else {
        return;
    };
    for user in 1..=6 {
        world.ask(user, 6 + user, "spring").await;
    }
    let priority = world.app.store.priority().clone();
    priority.put_foreground_first(true);
    let intake = [priority.foreground(), priority.foreground()];
    assert!(priority.holds_back() && !priority.crowded());
    let worker = world.worker_with("w1", 1, Arc::new(opledger_server::SystemClock), |options| {
        options.replies = false;
    });
    let started = std::time::Instant::now();
    let (stop, running) = spawn_run(worker);
    until_all_confirmed(&world).await;
    let took = started.elapsed();
    let _ = stop.send(());
    running.await.expect("the worker stops");
    drop(intake);
    assert!(
        took < Priority::WAIT * 5,
        "six steps without waiting for a quiet moment took {took:?}"
    );
    assert_eq!(world.service.total_requests(), 6);
    world.stop().await;
}

/// Where the claim and the call's record are two commits (no key honoured, no lookup), the
/// record carries the claim of the operation the task takes up next (ADR 0020): that one is
/// then called after one commit of its own, its record, and every operation is still called
/// once, after its record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_s_record_carries_the_claim_of_the_task_s_next_operation() {
    let Some(world) = World::start(Backend::Sqlite, Setup::default()).await else {
        return;
    };
    world.ask(1, 7, "spring").await;
    world.ask(2, 8, "spring").await;
    let worker = world.worker_with("w1", 1, Arc::new(opledger_server::SystemClock), |options| {
        options.replies = false;
    });
    let (stop, running) = spawn_run(worker);
    until_all_confirmed(&world).await;
    let _ = stop.send(());
    running.await.expect("the worker stops");
    let mut streams = Vec::new();
    for row in world.operations().await {
        let stream = StreamId::new(row.stream_id.clone()).expect("stream id");
        let events = world.app.store.read_stream(&stream, 1, 100).await;
        let events: Vec<(String, u64)> = events
            .expect("read the stream")
            .into_iter()
            .map(|e| (e.event_type, e.position))
            .collect();
        let types: Vec<&str> = events.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(
            types,
            ["Received", "Claimed", "ExternalCallSent", "Confirmed"]
        );
        streams.push(events);
    }
    // Both were queued for the one task before it started: the first one's record carried the
    // second one's claim, in the same append.
    streams.sort_by_key(|events| events[1].1);
    let (first, second) = (&streams[0], &streams[1]);
    assert_eq!(
        second[1].1,
        first[2].1 + 1,
        "the second claim right after the first record: {streams:?}"
    );
    assert_eq!(world.service.total_requests(), 2, "each called once");
    world.stop().await;
}

/// A reply keeps its operation's place in the worker's line (ADR 0026): an operation that ends
/// while operations received after it wait is replied to among the worker's first steps, not
/// after all of them (before, its reply was due from when it ended, behind the whole backlog).
async fn a_reply_keeps_its_operation_s_place_ahead_of_operations_received_after_it(
    backend: Backend,
) {
    const LATER: i64 = 10;
    let Some(world) = World::start(backend, Setup::default()).await else {
        return;
    };
    world.ask(1, 7, "spring").await;
    let first = world.only_operation().await;
    for n in 0..LATER {
        world.ask(2 + n, 100 + n, "spring").await;
    }
    // The first operation ends after the others arrived (refused by a worker that then died).
    world
        .ghost(
            &first,
            vec![
                ghost_claim(&world, 30),
                OperationCommand::Fail {
                    reason: "sold out".to_owned(),
                },
            ],
        )
        .await;
    let (stop, running) = spawn_run(world.worker("w1", 1));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while world.telegram.calls("sendMessage").len() < usize::try_from(LATER + 1).unwrap() {
        assert!(
            std::time::Instant::now() < deadline,
            "not every reply went out"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = stop.send(());
    running.await.expect("the worker stops");
    let replied = world
        .position_of(&first, "ReplyStarted")
        .await
        .expect("the first operation was replied to");
    let mut calls_before = 0;
    for row in world.operations().await {
        if row.operation_id == first.operation_id {
            continue;
        }
        let claimed = world.position_of(&row, "Claimed").await.expect("claimed");
        if claimed < replied {
            calls_before += 1;
        }
    }
    assert!(
        calls_before <= LATER / 2,
        "{calls_before} of the {LATER} later operations were called before the first one's reply"
    );
    world.stop().await;
}
