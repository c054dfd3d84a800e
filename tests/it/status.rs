//! `/status` in the bot, on both backends: answered from the asynchronous `user_operations`
//! read model (kept by the projection runner beside the service), in plain words per
//! state; `/status <id>` shows one of the user's own operations and nobody else's; asking again
//! gives the same answer and appends only the update's delivery; the answer waits (briefly) for
//! the read model to catch up, answers from what is there when it does not, and says so kindly
//! when it cannot be read at all.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{TimeDelta, Utc};
use opledger_domain::operation::{OperationCommand, ReconcileOutcome, Reconciled, decide};
use opledger_domain::{Causation, EventMetadata, Operation};
use opledger_ledger::{expected, load, request};
use opledger_projections::user_operations::{self, UserOperations};
use opledger_projections::{Projector, ProjectorOptions, registry};
use opledger_server::replies::{self, NO_REQUESTS, NO_SUCH_REQUEST, STATUS_FRESHNESS};
use opledger_server::{Clock, Recorded, Route};
use opledger_store::{AnyStore, EventStore, StreamId};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::read_models::World;
use crate::support::app::{Backend, Ledger, message_from, on_both_backends};
use crate::support::fake_service::Behaviour;

/// A projection runner keeping `user_operations`, started by a test that stopped the service's
/// own.
struct Runner {
    stop: oneshot::Sender<()>,
    handle: JoinHandle<()>,
}

impl Runner {
    fn start(store: &AnyStore) -> Runner {
        let options = ProjectorOptions {
            poll_interval: Duration::from_millis(50),
            ..ProjectorOptions::default()
        };
        let projector = Projector::new(store.clone(), vec![Arc::new(UserOperations)], options);
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(projector.run(async move {
            let _ = stopped.await;
        }));
        Runner { stop, handle }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.handle.await.expect("the runner stops");
    }
}

/// Sends `text` from `user` through the webhook and returns the text of the answer.
async fn ask(world: &World, update_id: i64, user: i64, text: &str) -> String {
    let response = world
        .app
        .deliver(message_from(update_id, 1_790_000_000, user, text))
        .await;
    assert_eq!(response.status(), 200);
    let answer: serde_json::Value = response.json().await.expect("a JSON answer");
    assert_eq!(answer["method"], "sendMessage", "{answer}");
    assert_eq!(answer["chat_id"], user);
    answer["text"].as_str().expect("a text").to_owned()
}

/// A `/status` answer's lines by business key: `coupon spring:7: done: cpn_1 (id)` gives
/// `spring:7` → (`done: cpn_1`, `id`).
fn lines(answer: &str) -> Vec<(String, String, String)> {
    answer
        .lines()
        .map(|line| {
            let rest = line.strip_prefix("coupon ").expect("an action first");
            let (key, rest) = rest.split_once(": ").expect("the key");
            let (words, id) = rest.rsplit_once(" (").expect("the id");
            (
                key.to_owned(),
                words.to_owned(),
                id.trim_end_matches(')').to_owned(),
            )
        })
        .collect()
}

fn words_for(answer: &str, key: &str) -> String {
    lines(answer)
        .into_iter()
        .find(|(k, ..)| k == key)
        .map(|(_, words, _)| words)
        .unwrap_or_else(|| panic!("{key} in {answer}"))
}

/// Appends a claim by a worker that then died.
async fn ghost_claim(world: &World, stream: &str) {
    let stream = StreamId::new(stream.to_owned()).expect("stream id");
    let store = &world.app.store;
    let state: Operation = load(store, &stream).await.expect("load");
    let now = world.app.clock.now();
    let command = OperationCommand::Claim {
        worker: "ghost".to_owned(),
        lease_until: now + TimeDelta::seconds(60),
    };
    let events = decide(&state, &command, now).expect("claim");
    let metadata = EventMetadata::caused_by(Causation::Worker {
        worker: "ghost".to_owned(),
    });
    let append = request(stream, expected(state.version), &events, &metadata).expect("request");
    store.append(vec![append]).await.expect("append");
}

on_both_backends!(
    status_says_each_state_in_plain_words,
    status_with_an_id_shows_only_the_users_own_operation,
    status_answers_the_same_and_starts_nothing,
    status_waits_for_the_read_model_to_catch_up,
    status_answers_from_what_is_there_when_the_read_model_is_late,
    status_waits_less_than_a_short_request_timeout,
    status_says_kindly_when_it_cannot_read,
);

async fn status_says_each_state_in_plain_words(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    let worker = world.worker("w1");
    world.say(1, 7, "/coupon spring").await;
    worker.run_due().await.expect("confirm");
    world.service.script([Behaviour::CreateThenFail(500)]);
    world.say(2, 7, "/coupon summer").await;
    worker.run_due().await.expect("unknown outcome");
    world.service.script([Behaviour::Refuse {
        status: 422,
        retry_after: None,
    }]);
    world.say(3, 7, "/coupon autumn").await;
    worker.run_due().await.expect("refused");
    world.service.script([Behaviour::Refuse {
        status: 503,
        retry_after: Some(600),
    }]);
    world.say(4, 7, "/coupon winter").await;
    worker.run_due().await.expect("overloaded");
    world.say(5, 7, "/coupon fall").await;

    let answer = ask(&world, 6, 7, "/status").await;
    assert_eq!(lines(&answer).len(), 5, "{answer}");
    assert_eq!(words_for(&answer, "spring:7"), "done: cpn_1");
    assert_eq!(words_for(&answer, "summer:7"), "checking with the shop");
    assert_eq!(words_for(&answer, "winter:7"), "waiting to retry");
    assert_eq!(words_for(&answer, "fall:7"), "received, waiting to start");
    let autumn = lines(&answer)
        .into_iter()
        .find(|(k, ..)| k == "autumn:7")
        .expect("autumn");
    let row = user_operations::get(world.app.store.reader(), &autumn.2)
        .await
        .expect("read")
        .expect("the row");
    let reason = row.last_error.expect("a reason");
    assert!(reason.contains("422"), "{reason}");
    assert_eq!(autumn.1, format!("failed: {reason}"));
    // The most recently changed first.
    assert_eq!(lines(&answer)[0].0, "fall:7", "{answer}");

    // A worker takes the last one; a person finds the unknown one done.
    ghost_claim(&world, "op-coupon-fall:7").await;
    let summer = lines(&answer)
        .into_iter()
        .find(|(k, ..)| k == "summer:7")
        .expect("summer")
        .2;
    opledger_server::reconcile::resolve(
        &world.app.store,
        &summer,
        Reconciled {
            outcome: ReconcileOutcome::Succeeded,
            external_id: Some("crm-1".to_owned()),
            operator: "alice".to_owned(),
            note: "found in the shop's admin".to_owned(),
        },
        Utc::now(),
    )
    .await
    .expect("resolve");
    let answer = ask(&world, 7, 7, "/status").await;
    assert_eq!(words_for(&answer, "fall:7"), "in progress");
    assert_eq!(words_for(&answer, "summer:7"), "done: crm-1");
    world.app.stop().await;
}

async fn status_with_an_id_shows_only_the_users_own_operation(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    world.say(1, 7, "/coupon spring").await;
    world.worker("w1").run_due().await.expect("confirm");
    let list = ask(&world, 2, 7, "/status").await;
    let (_, _, id) = lines(&list).pop().expect("one operation");
    assert_eq!(ask(&world, 3, 7, &format!("/status {id}")).await, list);
    assert_eq!(
        ask(&world, 4, 7, &format!("/status {}", id.to_uppercase())).await,
        list,
        "ids are read in any case"
    );
    assert_eq!(
        ask(&world, 5, 8, &format!("/status {id}")).await,
        NO_SUCH_REQUEST,
        "another user's operation is not shown"
    );
    assert_eq!(
        ask(&world, 6, 7, "/status 00000000-0000-0000-0000-000000000000").await,
        NO_SUCH_REQUEST
    );
    assert_eq!(
        ask(&world, 7, 8, "/status").await,
        NO_REQUESTS,
        "nothing yet, said kindly"
    );
    world.app.stop().await;
}

async fn status_answers_the_same_and_starts_nothing(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    world.say(1, 7, "/coupon spring").await;
    world.worker("w1").run_due().await.expect("confirm");
    world.worker("w1").run_due().await.expect("reply");
    let store = &world.app.store;
    let before = store.head().await.expect("head").position;
    let first = ask(&world, 2, 7, "/status").await;
    let (_, _, id) = lines(&first).pop().expect("one operation");
    let asks = [
        (3, "/status".to_owned()),
        (4, "/status".to_owned()),
        (5, format!("/status {id}")),
        (6, format!("/status {id}")),
    ];
    for (update_id, text) in &asks {
        assert_eq!(ask(&world, *update_id, 7, text).await, first);
    }
    let after = store.read_all(before + 1, 1000).await.expect("read");
    let appended: Vec<(String, String)> = after
        .iter()
        .map(|e| (e.stream_id.to_string(), e.event_type.clone()))
        .collect();
    let expected: Vec<(String, String)> = (2..=6)
        .map(|n| (format!("update-shop-{n}"), "UpdateReceived".to_owned()))
        .collect();
    assert_eq!(
        appended, expected,
        "only the deliveries of the /status updates"
    );
    for event in &after {
        let payload: serde_json::Value = serde_json::from_slice(&event.payload).unwrap();
        assert!(payload["operation"].is_null(), "nothing started or joined");
    }
    world.app.stop().await;
}

async fn status_waits_for_the_read_model_to_catch_up(backend: Backend) {
    let Some(mut world) = World::start(backend).await else {
        return;
    };
    // The service's runner stops before anything happens: user_operations stays empty.
    world.app.stop_projections().await;
    world.say(1, 7, "/coupon spring").await;
    world.worker("w1").run_due().await.expect("confirm");
    // A runner starts while the /status answer waits, and the answer has what the user did
    // before asking.
    let world = Arc::new(world);
    let asking = tokio::spawn({
        let world = world.clone();
        async move { ask(&world, 2, 7, "/status").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!asking.is_finished(), "the answer waits for the read model");
    let runner = Runner::start(&world.app.store);
    let answer = asking.await.expect("the answer");
    assert_eq!(words_for(&answer, "spring:7"), "done: cpn_1", "{answer}");
    runner.stop().await;
    let world = Arc::into_inner(world).expect("the only owner");
    world.app.stop().await;
}

async fn status_answers_from_what_is_there_when_the_read_model_is_late(backend: Backend) {
    let Some(world) = World::start(backend).await else {
        return;
    };
    world.say(1, 7, "/coupon spring").await;
    world.worker("w1").run_due().await.expect("confirm");
    let store = &world.app.store;
    let head = store.head().await.expect("head").position;
    assert!(
        registry::wait_for(store, user_operations::NAME, head, Duration::from_secs(10))
            .await
            .expect("the registry"),
        "the runner catches up"
    );
    // An update the read model will not reach in time (its position is far ahead).
    let recorded = Recorded::Accepted {
        position: head + 1_000,
        update_id: 99,
        epoch: 1,
        kind: "message".to_owned(),
        chat_id: Some(7),
        user_id: Some(7),
        route: Route::Status { operation_id: None },
    };
    let started = Instant::now();
    let answer = replies::answer(store, "shop", &[], &recorded, STATUS_FRESHNESS)
        .await
        .expect("an answer")
        .expect("a text");
    let waited = started.elapsed();
    assert!(
        waited >= STATUS_FRESHNESS && waited < STATUS_FRESHNESS + Duration::from_secs(3),
        "waited {waited:?}"
    );
    assert_eq!(words_for(&answer.text, "spring:7"), "done: cpn_1");
    world.app.stop().await;
}

async fn status_waits_less_than_a_short_request_timeout(backend: Backend) {
    let Some(mut world) = World::start_with(backend, "request_timeout_ms = 1000\n").await else {
        return;
    };
    world.say(1, 7, "/coupon spring").await;
    let store = world.app.store.clone();
    let head = store.head().await.expect("head").position;
    assert!(
        registry::wait_for(&store, user_operations::NAME, head, Duration::from_secs(10))
            .await
            .expect("the registry")
    );
    // The read model stops following: the /status update is never applied in time.
    world.app.stop_projections().await;
    let started = Instant::now();
    let answer = ask(&world, 2, 7, "/status").await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "answered within the request timeout, not with a 503"
    );
    assert_eq!(words_for(&answer, "spring:7"), "received, waiting to start");
    world.app.stop().await;
}

async fn status_says_kindly_when_it_cannot_read(backend: Backend) {
    let Some(ledger) = Ledger::create(backend).await else {
        return;
    };
    // A ledger whose user_operations was never built.
    let store = ledger.open().await;
    let answer = replies::status(&store, "shop", Some(7), None).await;
    assert_eq!(answer, replies::STATUS_UNAVAILABLE);
    store.close().await;
}
