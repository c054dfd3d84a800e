//! The asynchronous built-in read models (`audit_trail`, `reconciliation_queue`,
//! `user_operations`, `metrics`) over real lifecycles, on both backends: updates enter through
//! the webhook, the worker calls a fake service, a person reconciles; then the tests apply the
//! projections themselves (one transaction per page on the store's projection pool, as the
//! runner does), so they depend on nothing but `Projection::apply`, and check the rows, that
//! forgetting a stream and applying it again changes nothing, and that any split of the ledger
//! into pages gives the same tables.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{TimeDelta, Utc};
use opledger_config::Config;
use opledger_domain::operation::{
    OperationCommand, OperationEvent, ReconcileOutcome, Reconciled, TransitionRejected, decide,
};
use opledger_domain::{Causation, EventMetadata, Operation};
use opledger_ledger::{expected, load, request};
use opledger_projections::audit_trail::{self, AuditEntry, AuditTrail};
use opledger_projections::metrics::{self, Metrics};
use opledger_projections::reconciliation_queue::{self, ReconciliationQueue};
use opledger_projections::user_operations::{self, UserOperations};
use opledger_projections::{Backend as ProjectionBackend, Conn, Projection};
use opledger_server::{Clock, ManualClock};
use opledger_store::{AnyStore, EventStore, ReadPool, RecordedEvent, StreamId};
use opledger_worker::Worker;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};

use crate::support::app::{
    Backend, Ledger, SECRET, TOKEN, TestApp, message_from, on_both_backends,
};
use crate::support::fake_service::{Behaviour, FakeService};
use crate::support::fake_telegram::FakeTelegram;

/// The four asynchronous projections.
pub(crate) fn projections() -> Vec<Arc<dyn Projection>> {
    vec![
        Arc::new(AuditTrail),
        Arc::new(ReconciliationQueue),
        Arc::new(UserOperations),
        Arc::new(Metrics),
    ]
}

fn backend_of(pool: ReadPool<'_>) -> ProjectionBackend {
    match pool {
        ReadPool::Sqlite(_) => ProjectionBackend::Sqlite,
        ReadPool::Postgres(_) => ProjectionBackend::Postgres,
    }
}

/// Runs SQL text (several statements) on the projection pool.
async fn execute(store: &AnyStore, sql: &str) {
    let sql = sqlx::AssertSqlSafe(sql.to_owned());
    match store.projection_pool() {
        ReadPool::Sqlite(pool) => sqlx::raw_sql(sql).execute(pool).await.map(drop),
        ReadPool::Postgres(pool) => sqlx::raw_sql(sql).execute(pool).await.map(drop),
    }
    .expect("run SQL on the projection pool");
}

/// Drops a projection's tables named after `table`, if they exist.
pub(crate) async fn drop_tables(store: &AnyStore, projection: &dyn Projection, table: &str) {
    for suffix in projection.tables() {
        execute(store, &format!("DROP TABLE IF EXISTS \"{table}{suffix}\"")).await;
    }
}

/// Creates a projection's tables (and indexes) named after `table`, dropping old ones first.
pub(crate) async fn install(store: &AnyStore, projection: &dyn Projection, table: &str) {
    drop_tables(store, projection, table).await;
    let backend = backend_of(store.projection_pool());
    let (tables, indexes) = projection.schema().render(backend, table, table);
    execute(store, &tables).await;
    execute(store, &indexes).await;
}

/// Applies one page inside its own transaction.
async fn apply_page(
    store: &AnyStore,
    projection: &dyn Projection,
    table: &str,
    page: &[RecordedEvent],
) {
    let links: Vec<_> = page.iter().map(RecordedEvent::link).collect();
    match store.projection_pool() {
        ReadPool::Sqlite(pool) => {
            let mut tx = pool.begin().await.expect("begin");
            projection
                .apply(Conn::Sqlite(&mut tx), table, &links)
                .await
                .expect("apply a page");
            tx.commit().await.expect("commit");
        }
        ReadPool::Postgres(pool) => {
            let mut tx = pool.begin().await.expect("begin");
            projection
                .apply(Conn::Postgres(&mut tx), table, &links)
                .await
                .expect("apply a page");
            tx.commit().await.expect("commit");
        }
    }
}

/// Applies the ledger's events at positions `from..=to` in pages of the given sizes (the last
/// size repeats).
pub(crate) async fn apply_range(
    store: &AnyStore,
    projection: &dyn Projection,
    table: &str,
    from: u64,
    to: u64,
    sizes: &[usize],
) {
    let mut next = from;
    let mut sizes = sizes
        .iter()
        .copied()
        .chain(std::iter::repeat(sizes.last().copied().unwrap_or(100)));
    while next <= to {
        let size = sizes.next().expect("sizes repeat").max(1);
        let mut page = store.read_all(next, size).await.expect("read a page");
        page.retain(|e| e.position <= to);
        let Some(last) = page.last() else { break };
        next = last.position + 1;
        apply_page(store, projection, table, &page).await;
    }
}

/// Every row of a table as text, sorted: for comparing two tables row for row.
pub(crate) async fn dump(store: &AnyStore, table: &str) -> Vec<String> {
    let mut rows: Vec<String> = match store.projection_pool() {
        ReadPool::Sqlite(pool) => {
            let columns: Vec<String> =
                sqlx::query_scalar("SELECT name FROM pragma_table_info($1) ORDER BY cid")
                    .bind(table)
                    .fetch_all(pool)
                    .await
                    .expect("columns");
            assert!(!columns.is_empty(), "table {table} exists");
            let list = columns
                .iter()
                .map(|c| format!("\"{c}\""))
                .collect::<Vec<_>>()
                .join(", ");
            let sql = format!("SELECT json_array({list}) FROM \"{table}\"");
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_all(pool)
                .await
                .expect("rows")
        }
        ReadPool::Postgres(pool) => {
            let sql = format!("SELECT row_to_json(t)::text FROM \"{table}\" AS t");
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_all(pool)
                .await
                .expect("rows")
        }
    };
    rows.sort();
    rows
}

/// All the tables of a projection named after `table`, dumped.
pub(crate) async fn dump_all(
    store: &AnyStore,
    projection: &dyn Projection,
    table: &str,
) -> Vec<Vec<String>> {
    let mut all = Vec::new();
    for suffix in projection.tables() {
        all.push(dump(store, &format!("{table}{suffix}")).await);
    }
    all
}

/// A service with the worker, a fake coupon shop and a fake Bot API, on either backend.
pub(crate) struct World {
    pub(crate) ledger: Ledger,
    pub(crate) app: TestApp,
    pub(crate) service: FakeService,
    _telegram: FakeTelegram,
    config: Config,
}

/// `coupon`: one per campaign and user; `gift`: one per user whatever the campaign (a second
/// campaign is a key conflict); `poll`: one per campaign whoever asks (another user's other
/// choice is a key conflict caused by that user). None honours the key nor has a lookup, so an unknown outcome
/// goes to a person.
fn world_config(service: &FakeService, telegram: &FakeTelegram, server: &str) -> Config {
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n{server}\
         [[bots]]\nname = \"shop\"\ntoken_env = \"SHOP_TOKEN\"\n\
         webhook_secret_env = \"SHOP_SECRET\"\napi_base_url = \"{api}\"\n\
         [[actions]]\nname = \"coupon\"\nbot = \"shop\"\ncommand = \"coupon\"\n\
         params = [\"campaign\"]\nkey = \"{{campaign}}:{{user_id}}\"\n\
         [actions.effector]\nurl = \"{url}\"\ntimeout_ms = 300\nmax_attempts = 3\n\
         [[actions]]\nname = \"gift\"\nbot = \"shop\"\ncommand = \"gift\"\n\
         params = [\"campaign\"]\nkey = \"{{user_id}}\"\n\
         [actions.effector]\nurl = \"{url}\"\ntimeout_ms = 300\n\
         [[actions]]\nname = \"poll\"\nbot = \"shop\"\ncommand = \"poll\"\n\
         params = [\"campaign\", \"choice\"]\nkey = \"{{campaign}}\"\n\
         [actions.effector]\nurl = \"{url}\"\ntimeout_ms = 300\n",
        api = telegram.base_url(),
        url = service.url(),
    );
    let env: HashMap<&str, &str> = HashMap::from([("SHOP_TOKEN", TOKEN), ("SHOP_SECRET", SECRET)]);
    Config::parse(&text, &|name| env.get(name).map(|v| (*v).to_owned())).expect("test config")
}

impl World {
    pub(crate) async fn start(backend: Backend) -> Option<World> {
        Self::start_with(backend, "").await
    }

    /// A world whose configuration has `server` (TOML lines) in its `[server]` table.
    pub(crate) async fn start_with(backend: Backend, server: &str) -> Option<World> {
        let ledger = Ledger::create(backend).await?;
        let service = FakeService::start(false).await;
        let telegram = FakeTelegram::start(TOKEN).await;
        let config = world_config(&service, &telegram, server);
        // Due times come from the database's clock; the manual one runs a little ahead.
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

    pub(crate) fn worker(&self, id: &str) -> Worker {
        self.app.worker(&self.config, id, 1)
    }

    pub(crate) async fn say(&self, update_id: i64, user: i64, text: &str) {
        let response = self
            .app
            .deliver(message_from(update_id, 1_790_000_000, user, text))
            .await;
        assert_eq!(response.status(), 200, "the update is acknowledged");
    }

    /// Appends `event` to `stream` as `worker` would (a late worker's refused outcome).
    async fn append_as_worker(&self, stream: &str, worker: &str, event: OperationEvent) {
        let stream = StreamId::new(stream.to_owned()).expect("stream id");
        let state: Operation = load(&self.app.store, &stream).await.expect("load");
        let metadata = EventMetadata::caused_by(Causation::Worker {
            worker: worker.to_owned(),
        });
        let append = request(stream, expected(state.version), &[event], &metadata).expect("req");
        self.app.store.append(vec![append]).await.expect("append");
    }

    /// A claim by `worker` that then died.
    async fn ghost_claim(&self, stream: &str, worker: &str) {
        let stream = StreamId::new(stream.to_owned()).expect("stream id");
        let state: Operation = load(&self.app.store, &stream).await.expect("load");
        let command = OperationCommand::Claim {
            worker: worker.to_owned(),
            lease_until: self.app.clock.now() + TimeDelta::seconds(60),
        };
        let events = decide(&state, &command, self.app.clock.now()).expect("claim");
        let metadata = EventMetadata::caused_by(Causation::Worker {
            worker: worker.to_owned(),
        });
        let append = request(stream, expected(state.version), &events, &metadata).expect("req");
        self.app.store.append(vec![append]).await.expect("append");
    }
}

/// The operations of the scenario, by their streams.
const SPRING: &str = "op-coupon-spring:7";
const SUMMER: &str = "op-coupon-summer:8";
const GIFT: &str = "op-gift-9";
const WINTER: &str = "op-coupon-winter:10";
const POLL: &str = "op-poll-spring";

/// A ledger after a day of real lifecycles, and the store on it (the service stopped).
pub(crate) struct Driven {
    _ledger: Ledger,
    pub(crate) store: AnyStore,
}

/// Drives: user 7's coupon confirmed and replied; user 8's coupon sent, the service failed
/// after acting (unknown outcome) → waiting for a person; update 1 delivered again (duplicate)
/// and its id reused with another body (collision); user 9's gift asked twice with other
/// campaigns (key conflict), left received; a body that is not an update (quarantine); a late
/// worker's refused outcome on user 7's coupon; user 10's coupon claimed by a worker that died;
/// user 11's poll, which user 12 asks for with another choice (key conflict).
/// Then stops the service and reopens the ledger with nothing running on it.
async fn drive(backend: Backend) -> Option<Driven> {
    let world = World::start(backend).await?;
    let worker = world.worker("w1");
    world.say(1, 7, "/coupon spring").await;
    worker.run_due().await.expect("confirm");
    worker.run_due().await.expect("reply");
    world.service.script([Behaviour::CreateThenFail(500)]);
    world.say(2, 8, "/coupon summer").await;
    worker.run_due().await.expect("unknown outcome");
    world.say(1, 7, "/coupon spring").await;
    world.say(1, 7, "/help").await;
    world.say(3, 9, "/gift spring").await;
    world.say(4, 9, "/gift autumn").await;
    assert_eq!(world.app.deliver(b"not json".to_vec()).await.status(), 200);
    world
        .append_as_worker(
            SPRING,
            "late",
            OperationEvent::TransitionRejected(TransitionRejected {
                command: "confirm".to_owned(),
                status: "confirmed".to_owned(),
                reason: "already confirmed".to_owned(),
            }),
        )
        .await;
    world.say(5, 10, "/coupon winter").await;
    world.ghost_claim(WINTER, "ghost").await;
    world.say(6, 11, "/poll spring yes").await;
    world.say(7, 12, "/poll spring no").await;
    let World { ledger, app, .. } = world;
    app.stop().await;
    let store = ledger.open().await;
    Some(Driven {
        _ledger: ledger,
        store,
    })
}

async fn head(store: &AnyStore) -> u64 {
    store.head().await.expect("head").position
}

/// Builds the four projections under their canonical names and applies `1..=to`.
async fn build_canonical(store: &AnyStore, to: u64) {
    for projection in projections() {
        install(store, projection.as_ref(), projection.name()).await;
        apply_range(store, projection.as_ref(), projection.name(), 1, to, &[50]).await;
    }
}

/// Applies `from..=to` to the canonical tables.
async fn catch_up(store: &AnyStore, from: u64, to: u64) {
    for projection in projections() {
        apply_range(
            store,
            projection.as_ref(),
            projection.name(),
            from,
            to,
            &[50],
        )
        .await;
    }
}

async fn event_at(store: &AnyStore, stream: &str, event_type: &str) -> RecordedEvent {
    let stream = StreamId::new(stream.to_owned()).expect("stream id");
    store
        .read_stream(&stream, 1, 100)
        .await
        .expect("read the stream")
        .into_iter()
        .find(|e| e.event_type == event_type)
        .unwrap_or_else(|| panic!("{event_type} in {stream}"))
}

fn actors(entries: &[AuditEntry]) -> Vec<(String, String, Option<String>)> {
    entries
        .iter()
        .map(|e| {
            (
                e.event_type.clone(),
                e.actor_kind.clone(),
                e.actor_id.clone(),
            )
        })
        .collect()
}

fn actor(kind: &str, id: &str) -> (String, Option<String>) {
    (kind.to_owned(), Some(id.to_owned()))
}

on_both_backends!(
    read_models_follow_real_lifecycles,
    forgetting_a_stream_and_applying_it_again_changes_nothing,
);

async fn read_models_follow_real_lifecycles(backend: Backend) {
    let Some(driven) = drive(backend).await else {
        return;
    };
    let store = &driven.store;
    let before = head(store).await;
    build_canonical(store, before).await;
    let reader = store.reader();
    let spring = event_at(store, SPRING, "Received").await;
    let Ok(OperationEvent::Received(received)) = opledger_domain::DomainEvent::from_stored(
        &spring.event_type,
        spring.schema_version,
        &spring.payload,
    ) else {
        panic!("a Received")
    };
    let spring_id = received.operation_id.to_string();

    // The audit trail: every event once, with who caused it.
    let day = TimeDelta::days(1);
    let all = audit_trail::between(reader, Utc::now() - day, Utc::now() + day, 10_000)
        .await
        .expect("read the audit trail");
    assert_eq!(all.len() as u64, before, "one row per event");
    assert!(all.windows(2).all(|w| w[0].position + 1 == w[1].position));
    let trail = audit_trail::by_operation(reader, &spring_id, 100)
        .await
        .expect("by operation");
    let expected: Vec<(&str, (String, Option<String>))> = vec![
        ("UpdateReceived", actor("update", "1")),
        ("Received", actor("update", "1")),
        ("Claimed", actor("worker", "w1")),
        ("ExternalCallSent", actor("worker", "w1")),
        ("Confirmed", actor("worker", "w1")),
        ("ReplyStarted", actor("worker", "w1")),
        ("ReplySent", actor("worker", "w1")),
        ("DuplicateDeliveryObserved", actor("update", "1")),
        ("UpdateIdCollision", actor("update", "1")),
        ("TransitionRejected", actor("worker", "late")),
    ];
    let got = actors(&trail);
    assert_eq!(
        got.iter()
            .map(|(t, k, i)| (t.as_str(), (k.clone(), i.clone())))
            .collect::<Vec<_>>(),
        expected,
        "{trail:#?}"
    );
    for entry in &trail {
        assert_eq!(
            (entry.bot.as_deref(), entry.user_id, entry.chat_id),
            (Some("shop"), Some(7), Some(7)),
            "{entry:?}"
        );
    }
    assert_eq!(trail[1].correlation.as_deref(), Some("update-shop-1"));
    assert!(trail[4].summary.contains("cpn_1"), "{}", trail[4].summary);
    // A key conflict is the conflicting update's, in the operation it names.
    let gift_trail = audit_trail::by_user(reader, 9, 100).await.expect("by user");
    let conflict = gift_trail
        .iter()
        .find(|e| e.event_type == "KeyConflictRecorded")
        .expect("the key conflict");
    assert_eq!(conflict.stream_id, GIFT);
    assert_eq!(
        (conflict.actor_kind.as_str(), conflict.actor_id.as_deref()),
        ("update", Some("4"))
    );
    assert!(conflict.operation_id.is_some());
    assert_eq!(
        gift_trail
            .iter()
            .map(|e| e.stream_id.as_str())
            .collect::<Vec<_>>(),
        ["update-shop-3", GIFT, "update-shop-4", GIFT],
        "the user's events, in order"
    );
    assert_eq!(
        audit_trail::by_chat(reader, 9, 100).await.expect("by chat"),
        gift_trail
    );
    // Another user's conflicting request is theirs, in the operation of the first.
    let other = audit_trail::by_user(reader, 12, 100)
        .await
        .expect("by user");
    assert_eq!(
        other
            .iter()
            .map(|e| (e.stream_id.as_str(), e.event_type.as_str()))
            .collect::<Vec<_>>(),
        [
            ("update-shop-7", "UpdateReceived"),
            (POLL, "KeyConflictRecorded")
        ]
    );
    let poll_id = all
        .iter()
        .find(|e| e.stream_id == POLL)
        .and_then(|e| e.operation_id.clone())
        .expect("the poll's operation");
    assert_eq!(other[1].operation_id.as_ref(), Some(&poll_id));
    let poll: Vec<_> = audit_trail::by_operation(reader, &poll_id, 100)
        .await
        .expect("by operation")
        .into_iter()
        .map(|e| (e.event_type, e.user_id))
        .collect();
    assert_eq!(
        poll,
        [
            ("UpdateReceived".to_owned(), Some(11)),
            ("Received".to_owned(), Some(11)),
            ("KeyConflictRecorded".to_owned(), Some(12)),
        ]
    );
    let quarantined = all
        .iter()
        .find(|e| e.event_type == "BodyQuarantined")
        .expect("the quarantined body");
    assert_eq!(
        (
            quarantined.actor_kind.as_str(),
            quarantined.actor_id.as_deref(),
            quarantined.bot.as_deref(),
            quarantined.operation_id.as_deref(),
            quarantined.category.as_str(),
        ),
        ("system", Some("intake"), Some("shop"), None, "quarantine")
    );
    assert!(
        quarantined.summary.contains("not_json") && quarantined.summary.contains("8 bytes"),
        "{}",
        quarantined.summary
    );
    let first = all.first().expect("rows");
    let narrow = audit_trail::between(reader, first.recorded_at, first.recorded_at, 10)
        .await
        .expect("an empty range");
    assert!(narrow.is_empty(), "the end of a range is excluded");

    // The reconciliation queue: user 8's coupon waits for a person.
    let marked = event_at(store, SUMMER, "MarkedForReconciliation").await;
    let queue = reconciliation_queue::list(reader, 10)
        .await
        .expect("the queue");
    assert_eq!(queue.len(), 1, "{queue:#?}");
    let waiting = &queue[0];
    assert_eq!(waiting.stream_id, SUMMER);
    assert_eq!(
        (waiting.action.as_str(), waiting.business_key.as_str()),
        ("coupon", "summer:8")
    );
    assert_eq!(
        (waiting.bot.as_str(), waiting.user_id, waiting.chat_id),
        ("shop", Some(8), Some(8))
    );
    assert_eq!(waiting.attempts, 1);
    assert!(waiting.reason.contains("500"), "{}", waiting.reason);
    assert_eq!(waiting.marked_at, marked.recorded_at);
    assert_eq!(
        waiting.age_secs(marked.recorded_at + TimeDelta::seconds(90)),
        90.0
    );

    // What /status shows.
    let mine = user_operations::recent(reader, "shop", 7, 5)
        .await
        .expect("recent");
    assert_eq!(mine.len(), 1);
    assert_eq!(
        (
            mine[0].status.as_str(),
            mine[0].external_id.as_deref(),
            mine[0].attempts
        ),
        ("confirmed", Some("cpn_1"), 1)
    );
    assert_eq!(mine[0].operation_id, spring_id);
    assert_eq!(mine[0].created_at, spring.recorded_at);
    let summer = user_operations::recent(reader, "shop", 8, 5)
        .await
        .expect("recent");
    assert_eq!(summer[0].status, "needs_reconciliation");
    assert!(
        summer[0]
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("500"))
    );
    let gift = user_operations::recent_in_chat(reader, "shop", 9, 5)
        .await
        .expect("per chat");
    assert_eq!(
        (
            gift.len(),
            gift[0].status.as_str(),
            gift[0].business_key.as_str()
        ),
        (1, "received", "9")
    );
    assert!(
        user_operations::recent(reader, "other", 7, 5)
            .await
            .expect("another bot")
            .is_empty()
    );
    assert_eq!(
        user_operations::get(reader, &spring_id)
            .await
            .expect("get")
            .as_ref(),
        Some(&mine[0])
    );

    // Metrics: states, counters, ages.
    let gift_received = event_at(store, GIFT, "Received").await;
    let ghost = event_at(store, WINTER, "Claimed").await;
    let now = ghost.recorded_at + TimeDelta::seconds(100);
    let snapshot = metrics::snapshot(reader, now).await.expect("metrics");
    let states: HashMap<&str, u64> = snapshot
        .by_state
        .iter()
        .map(|(s, n)| (s.as_str(), *n))
        .collect();
    assert_eq!(
        states,
        HashMap::from([
            ("received", 2),
            ("claimed", 1),
            ("call_sent", 0),
            ("retry_scheduled", 0),
            ("needs_reconciliation", 1),
            ("confirmed", 1),
            ("failed", 0),
            ("reconciled", 0),
        ])
    );
    let micros = |d: TimeDelta| d.num_microseconds().unwrap() as f64 / 1e6;
    assert_eq!(
        snapshot.oldest_pending_age_secs,
        Some(micros(now - gift_received.recorded_at)),
        "the gift waits since it was received (its key conflict changed nothing)"
    );
    assert_eq!(snapshot.oldest_claimed_age_secs, Some(100.0));
    assert_eq!(
        (
            snapshot.duplicates_observed,
            snapshot.update_id_collisions,
            snapshot.key_conflicts,
            snapshot.quarantined,
            snapshot.transitions_rejected
        ),
        (1, 1, 2, 1, 1)
    );

    // A person resolves user 8's coupon: it leaves the queue, and the audit names them.
    let summer_id = summer[0].operation_id.clone();
    let resolved = opledger_server::reconcile::resolve(
        store,
        &summer_id,
        Reconciled {
            outcome: ReconcileOutcome::Succeeded,
            external_id: Some("crm-1".to_owned()),
            operator: "alice".to_owned(),
            note: "found it in the shop's admin".to_owned(),
        },
        Utc::now(),
    )
    .await
    .expect("resolve");
    catch_up(store, before + 1, head(store).await).await;
    assert!(
        reconciliation_queue::list(reader, 10)
            .await
            .expect("the queue")
            .is_empty(),
        "resolved: out of the queue"
    );
    let summer = user_operations::get(reader, &summer_id)
        .await
        .expect("get")
        .expect("the row");
    assert_eq!(
        (
            summer.status.as_str(),
            summer.resolution.as_deref(),
            summer.external_id.as_deref()
        ),
        ("reconciled", Some("succeeded"), Some("crm-1"))
    );
    assert_eq!(summer.last_position, resolved.position);
    let decision = audit_trail::by_operation(reader, &summer_id, 100)
        .await
        .expect("by operation")
        .pop()
        .expect("rows");
    assert_eq!(
        (
            decision.event_type.as_str(),
            decision.actor_kind.as_str(),
            decision.actor_id.as_deref(),
            decision.user_id
        ),
        ("Reconciled", "operator", Some("alice"), Some(8))
    );
    assert!(
        decision.summary.contains("found it"),
        "{}",
        decision.summary
    );
    let snapshot = metrics::snapshot(reader, now).await.expect("metrics");
    let states: HashMap<&str, u64> = snapshot
        .by_state
        .iter()
        .map(|(s, n)| (s.as_str(), *n))
        .collect();
    assert_eq!(
        (states["needs_reconciliation"], states["reconciled"]),
        (0, 1)
    );
    store.close().await;
}

async fn forgetting_a_stream_and_applying_it_again_changes_nothing(backend: Backend) {
    let Some(driven) = drive(backend).await else {
        return;
    };
    let store = &driven.store;
    let to = head(store).await;
    for projection in projections() {
        let table = format!("{}@v900", projection.name());
        install(store, projection.as_ref(), &table).await;
        apply_range(store, projection.as_ref(), &table, 1, to, &[17]).await;
        let original = dump_all(store, projection.as_ref(), &table).await;
        // Operations, updates, and a stream that does not exist.
        for stream in [
            SPRING,
            SUMMER,
            GIFT,
            "update-shop-1",
            "update-shop-4",
            "cb-none",
        ] {
            let events = store
                .read_stream(&StreamId::new(stream.to_owned()).unwrap(), 1, 1000)
                .await
                .expect("read the stream");
            let links: Vec<_> = events.iter().map(RecordedEvent::link).collect();
            let mut tx = store_begin(store).await;
            let forgot = tx.try_forget(projection.as_ref(), &table, stream).await;
            if forgot && !links.is_empty() {
                projection
                    .apply(tx.conn(), &table, &links)
                    .await
                    .expect("apply again");
            }
            tx.commit().await;
            assert_eq!(
                forgot,
                projection.name() != "metrics",
                "only metrics aggregates across streams"
            );
            assert_eq!(
                dump_all(store, projection.as_ref(), &table).await,
                original,
                "{} after forgetting and re-applying {stream}",
                projection.name()
            );
        }
        // Forgetting without applying again does remove the stream's rows (user 8's coupon
        // has rows in every table of these projections).
        if projection.name() != "metrics" {
            let mut tx = store_begin(store).await;
            assert!(tx.try_forget(projection.as_ref(), &table, SUMMER).await);
            tx.commit().await;
            let now = dump_all(store, projection.as_ref(), &table).await;
            for (table_now, table_before) in now.iter().zip(&original) {
                assert!(
                    table_now.len() < table_before.len(),
                    "{}: the stream's rows are gone from every table",
                    projection.name()
                );
            }
        }
    }
    store.close().await;
}

/// A transaction on the projection pool of either backend.
enum Tx {
    Sqlite(sqlx::Transaction<'static, sqlx::Sqlite>),
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
}

async fn store_begin(store: &AnyStore) -> Tx {
    match store.projection_pool() {
        ReadPool::Sqlite(pool) => Tx::Sqlite(pool.begin().await.unwrap()),
        ReadPool::Postgres(pool) => Tx::Postgres(pool.begin().await.unwrap()),
    }
}

impl Tx {
    fn conn(&mut self) -> Conn<'_> {
        match self {
            Tx::Sqlite(tx) => Conn::Sqlite(tx),
            Tx::Postgres(tx) => Conn::Postgres(tx),
        }
    }

    /// Forgets `stream` if the projection can; whether it could.
    async fn try_forget(&mut self, projection: &dyn Projection, table: &str, stream: &str) -> bool {
        match projection.forget_stream(self.conn(), table, stream) {
            Some(forget) => {
                forget.await.expect("forget");
                true
            }
            None => false,
        }
    }

    async fn commit(self) {
        match self {
            Tx::Sqlite(tx) => tx.commit().await.unwrap(),
            Tx::Postgres(tx) => tx.commit().await.unwrap(),
        }
    }
}

/// Any split of the ledger into pages gives the same tables as one page per event: generated
/// splits (proptest), each applied into fresh tables and compared row for row.
fn page_splits_do_not_change_the_tables(backend: Backend) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a runtime");
    let Some(driven) = runtime.block_on(drive(backend)) else {
        return;
    };
    let store = &driven.store;
    let to = runtime.block_on(head(store));
    let reference: Vec<Vec<Vec<String>>> = runtime.block_on(async {
        let mut all = Vec::new();
        for projection in projections() {
            let table = format!("{}@v1000", projection.name());
            install(store, projection.as_ref(), &table).await;
            apply_range(store, projection.as_ref(), &table, 1, to, &[1]).await;
            all.push(dump_all(store, projection.as_ref(), &table).await);
        }
        all
    });
    assert!(
        reference[0][0].len() as u64 == to,
        "one audit row per event"
    );
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 12,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let sizes = proptest::collection::vec(1usize..40, 1..12);
    let case = std::cell::Cell::new(0);
    runner
        .run(&sizes, |sizes| {
            case.set(case.get() + 1);
            let tables = runtime.block_on(async {
                let mut all = Vec::new();
                for projection in projections() {
                    let table = format!("{}@v{}", projection.name(), 1000 + case.get());
                    install(store, projection.as_ref(), &table).await;
                    apply_range(store, projection.as_ref(), &table, 1, to, &sizes).await;
                    all.push(dump_all(store, projection.as_ref(), &table).await);
                    drop_tables(store, projection.as_ref(), &table).await;
                }
                all
            });
            proptest::prop_assert_eq!(&tables, &reference, "pages of {:?}", sizes);
            Ok(())
        })
        .expect("every split gives the same tables");
    // The whole ledger in one page, too.
    let whole = runtime.block_on(async {
        let mut all = Vec::new();
        for projection in projections() {
            let table = format!("{}@v999", projection.name());
            install(store, projection.as_ref(), &table).await;
            apply_range(store, projection.as_ref(), &table, 1, to, &[100_000]).await;
            all.push(dump_all(store, projection.as_ref(), &table).await);
        }
        all
    });
    assert_eq!(whole, reference);
    runtime.block_on(store.close());
}

#[test]
fn page_splits_do_not_change_the_tables_sqlite() {
    page_splits_do_not_change_the_tables(Backend::Sqlite);
}

#[test]
fn page_splits_do_not_change_the_tables_postgres() {
    page_splits_do_not_change_the_tables(Backend::Postgres);
}
