//! PostgreSQL-only behaviour: the ordering trap that sequence-based stores fall into, connections
//! killed and the server restarted during appends, TRUNCATE, and the CLI on a PostgreSQL URL.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use chrono::{SubsecRound, TimeDelta, Utc};
use opledger_domain::operation::{
    Claimed, ExternalCallSent, OperationEvent, Received, RetryScheduled,
};
use opledger_domain::{Causation, EventMetadata, OperationId, fingerprint};
use opledger_ledger::request;
use opledger_projections::operation_status::OperationStatusRow;
use opledger_store::{
    AnyOptions, AnyStore, AppendRequest, EventStore, ExpectedVersion, NewEvent, PgOptions, PgStore,
    StoreError, StreamId, Tail,
};
use serde_json::json;
use sqlx::{Connection, Executor};

use crate::conformance::{assert_consistent, assert_pairs_complete, pair_call};
use crate::projections::{expected_status, status_rows};
use crate::support::postgres::{PrivateCluster, TestDatabase};
use crate::support::{opledger, stderr, stdout};

fn event(event_type: &str, n: u64) -> NewEvent {
    NewEvent::from_serialize(event_type, 1, &json!({ "n": n }), &json!({})).unwrap()
}

fn one(stream: &str, event_type: &str, n: u64) -> Vec<AppendRequest> {
    vec![AppendRequest::new(
        StreamId::new(stream).unwrap(),
        ExpectedVersion::Any,
        vec![event(event_type, n)],
    )]
}

async fn open(url: &str, options: PgOptions) -> PgStore {
    PgStore::open(url, options).await.expect("open the ledger")
}

/// Waits until `query` (a count) returns at least `at_least`, or fails after 30 s.
async fn wait_for_count(connection: &mut sqlx::PgConnection, query: &'static str, at_least: i64) {
    for _ in 0..3000 {
        let count: i64 = sqlx::query_scalar(query)
            .fetch_one(&mut *connection)
            .await
            .unwrap();
        if count >= at_least {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for `{query}` to reach {at_least}");
}

/// Installs a test-only trigger that makes the insert of any event of type `Held` wait on an
/// advisory lock, and takes that lock. Returns a control connection and the holder of the lock
/// (`SELECT pg_advisory_unlock(4242)` on it releases the held append).
async fn hold_marked_events(database: &TestDatabase) -> (sqlx::PgConnection, sqlx::PgConnection) {
    let mut control = database.connect().await;
    control
        .execute(
            "CREATE FUNCTION hold_marked_events() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN IF NEW.event_type = 'Held' THEN PERFORM pg_advisory_xact_lock(4242); END IF; \
             RETURN NEW; END $$; \
             CREATE TRIGGER hold_marked_events BEFORE INSERT ON events \
             FOR EACH ROW EXECUTE FUNCTION hold_marked_events()",
        )
        .await
        .unwrap();
    let mut holder = database.connect().await;
    holder
        .execute("SELECT pg_advisory_lock(4242)")
        .await
        .unwrap();
    (control, holder)
}

/// Counts appends waiting in the `Held` trigger.
const HELD_WAITING: &str =
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted";

/// Another instance creates a stream after this instance's batch looked at it and before the
/// batch writes: the batch must notice, decide again, and answer a typed conflict (never a
/// storage error, never a second "first" event).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_created_by_another_instance_mid_batch_is_a_conflict() {
    let Some(database) = TestDatabase::create().await else {
        return;
    };
    let first = open(database.url(), PgOptions::default()).await;
    let (mut control, mut holder) = hold_marked_events(&database).await;
    // Instance A creates `update-shop-7` in a transaction held open by its `Held` event.
    let created = tokio::spawn({
        let store = first.clone();
        async move {
            let mut call = one("op-marker", "Held", 0);
            call.push(AppendRequest::new(
                StreamId::new("update-shop-7").unwrap(),
                ExpectedVersion::NoStream,
                vec![event("UpdateReceived", 7)],
            ));
            store.append(call).await
        }
    });
    wait_for_count(&mut control, HELD_WAITING, 1).await;
    // Instance B looks now (the stream does not exist for it yet) and waits for the head.
    let patient = PgOptions {
        lock_timeout: Duration::from_secs(60),
        ..PgOptions::default()
    };
    let second = open(database.url(), patient).await;
    let duplicate = tokio::spawn({
        let store = second.clone();
        async move {
            let request = AppendRequest::new(
                StreamId::new("update-shop-7").unwrap(),
                ExpectedVersion::NoStream,
                vec![event("UpdateReceived", 7)],
            );
            store.append(vec![request]).await
        }
    });
    wait_for_count(
        &mut control,
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
         AND application_name = 'opledger'",
        1,
    )
    .await;
    holder
        .execute("SELECT pg_advisory_unlock(4242)")
        .await
        .unwrap();

    created
        .await
        .unwrap()
        .expect("instance A creates the stream");
    let duplicate = duplicate.await.unwrap();
    assert!(
        matches!(
            duplicate,
            Err(StoreError::VersionConflict { actual: 1, .. })
        ),
        "{duplicate:?}"
    );
    assert_eq!(
        second
            .stream_version(&StreamId::new("update-shop-7").unwrap())
            .await
            .unwrap(),
        1
    );
    assert_consistent(&second).await;
    first.close().await;
    second.close().await;
    holder.close().await.ok();
    control.close().await.ok();
}

/// Each instance's writer decides a batch on what its own commits told it and lets the server
/// check that (one call, `opledger_append`). When another instance moved a stream or the head in
/// between, that knowledge is stale: the batch must be decided again on what the server found,
/// so an expected version that is right now succeeds, a stale one is a conflict with the true
/// version, and the chain stays whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_s_stale_knowledge_is_corrected_by_the_server() {
    let Some(database) = TestDatabase::create().await else {
        return;
    };
    let mut control = database.connect().await;
    control
        .execute(
            "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET track_functions = ''pl''', \
             current_database()); END $$",
        )
        .await
        .unwrap();
    let first = open(database.url(), PgOptions::default()).await;
    let second = open(database.url(), PgOptions::default()).await;
    let shared = StreamId::new("op-shared").unwrap();
    let exact = |version: u64, n: u64| {
        vec![AppendRequest::new(
            shared.clone(),
            ExpectedVersion::Exact(version),
            vec![event("Step", n)],
        )]
    };
    // The first instance's first batch locks and reads; the ones after it use what it knows.
    first.append(one("op-shared", "Step", 1)).await.unwrap();
    first.append(exact(1, 2)).await.unwrap();
    // The second instance moves the stream (version 3) and the head behind the first's back.
    second.append(exact(2, 3)).await.unwrap();
    second.append(one("op-other", "Step", 4)).await.unwrap();
    // The first still believes version 2 and the head at 2.
    let conflict = first.append(exact(2, 5)).await;
    assert!(
        matches!(conflict, Err(StoreError::VersionConflict { actual: 3, .. })),
        "{conflict:?}"
    );
    first.append(exact(3, 6)).await.expect("version 3 is right");
    second
        .append(exact(4, 7))
        .await
        .expect("version 4 is right");
    let appended = first.append(exact(5, 8)).await.expect("version 5 is right");
    assert_eq!(*appended.positions.start(), 7);
    assert_eq!(first.stream_version(&shared).await.unwrap(), 6);
    assert_consistent(&first).await;
    first.close().await;
    second.close().await;
    // The appends after each writer's first went through the function (statistics reach the
    // view a moment after the sessions end).
    let mut calls = 0;
    for _ in 0..100 {
        calls = sqlx::query_scalar::<_, i64>(
            "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_user_functions \
             WHERE funcname = 'opledger_append'",
        )
        .fetch_one(&mut control)
        .await
        .unwrap();
        if calls >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(calls >= 4, "opledger_append was called {calls} times");
    control.close().await.ok();
}

/// One step of operation `op-coupon-spring:1`, at the version `expected`.
fn operation_step(expected: ExpectedVersion, event: OperationEvent) -> Vec<AppendRequest> {
    let stream = StreamId::new("op-coupon-spring:1").unwrap();
    let metadata = EventMetadata::caused_by(Causation::Worker {
        worker: "test".to_owned(),
    });
    vec![request(stream, expected, &[event], &metadata).unwrap()]
}

fn claimed(worker: &str, attempt: u32) -> OperationEvent {
    OperationEvent::Claimed(Claimed {
        worker: worker.to_owned(),
        // As the read model keeps it (microseconds), to compare rows with a fold of the events.
        lease_until: (Utc::now() + TimeDelta::minutes(1)).trunc_subsecs(6),
        attempt,
    })
}

fn call_sent(worker: &str, attempt: u32) -> OperationEvent {
    OperationEvent::ExternalCallSent(ExternalCallSent {
        worker: worker.to_owned(),
        attempt,
        idempotency_key: OperationId::new("coupon", "spring:1").to_string(),
    })
}

/// The last statement of every other session on this database that called the append
/// function.
async fn append_statements(control: &mut sqlx::PgConnection) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT query FROM pg_stat_activity WHERE datname = current_database() \
         AND pid <> pg_backend_pid() AND query LIKE '%opledger_append%'",
    )
    .fetch_all(control)
    .await
    .unwrap()
}

/// `second` claims the operation at version `at` for `worker` behind `first`'s back; then
/// `first`, whose knowledge is stale, records the call (decided again at the version after).
/// Returns the rows, checked to be the fold of the stream.
async fn claimed_elsewhere_then_sent(
    first: &AnyStore,
    second: &AnyStore,
    at: u64,
    worker: &str,
    attempt: u32,
) -> Vec<OperationStatusRow> {
    let claim = operation_step(ExpectedVersion::Exact(at), claimed(worker, attempt));
    second.append(claim).await.unwrap();
    let sent = operation_step(ExpectedVersion::Any, call_sent(worker, attempt));
    first.append(sent).await.unwrap();
    let rows = status_rows(first).await;
    assert_eq!(rows, expected_status(first).await, "the fold of the stream");
    rows
}

/// With the inline read models, a writer that holds the `operation_status` row a batch
/// continues (its own commit wrote it, at the version the batch continues from) sends the
/// append and the row's upsert as one statement (ADR 0016). A row another instance moved since,
/// or a row it planned for a batch the server refused, is never used: it reads the row again,
/// and the row stays the fold of its stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_rows_go_in_the_append_s_statement_and_never_outlive_their_version() {
    let Some(database) = TestDatabase::create().await else {
        return;
    };
    let inline = || AnyOptions {
        inline: opledger_projections::inline(),
        ..AnyOptions::default()
    };
    let first = AnyStore::open(database.url(), inline()).await.unwrap();
    let second = AnyStore::open(database.url(), inline()).await.unwrap();
    let mut control = database.connect().await;
    control
        .execute(
            "CREATE TABLE refuse_claims (refuse boolean); \
             CREATE FUNCTION refuse_claims() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             IF NEW.event_type = 'Claimed' AND EXISTS (SELECT 1 FROM refuse_claims) THEN \
             RAISE EXCEPTION 'refused by the test'; END IF; RETURN NEW; END $$; \
             CREATE TRIGGER refuse_claims BEFORE INSERT ON events \
             FOR EACH ROW EXECUTE FUNCTION refuse_claims()",
        )
        .await
        .unwrap();
    let params = BTreeMap::from([("campaign".to_owned(), "spring".to_owned())]);
    let received = OperationEvent::Received(Received {
        operation_id: OperationId::new("coupon", "spring:1"),
        action: "coupon".to_owned(),
        business_key: "spring:1".to_owned(),
        fingerprint: fingerprint("coupon", &params),
        params,
        bot: "shop".to_owned(),
        chat_id: Some(1),
        user_id: Some(1),
        update_id: 1,
        message_date: None,
        max_attempts: 3,
    });
    // A writer's first batch locks and reads the head; the next is planned.
    first.append(one("misc-1", "Noted", 1)).await.unwrap();
    first
        .append(operation_step(ExpectedVersion::NoStream, received))
        .await
        .unwrap();
    let last = append_statements(&mut control).await;
    assert!(
        last.iter().any(|q| q.starts_with("WITH appended")),
        "the append and its read model's row went as one statement: {last:?}"
    );

    // The second instance claims the operation behind the first's back (version 2). The first
    // holds the row at version 1, and its batch, decided again at version 3 after the server
    // said its knowledge was stale, must continue the claimed row.
    let rows = claimed_elsewhere_then_sent(&first, &second, 1, "second", 1).await;
    assert_eq!(rows[0].worker.as_deref(), Some("second"), "{rows:?}");

    // A batch planned on the row and then refused by the server leaves nothing behind: the row
    // it planned (claimed by `first`, version 5) must not stand for the claim the second
    // instance then records at version 5.
    let retry = OperationEvent::RetryScheduled(RetryScheduled {
        at: Utc::now(),
        attempt: 1,
        reason: "test".to_owned(),
        same_key: false,
    });
    first
        .append(operation_step(ExpectedVersion::Exact(3), retry))
        .await
        .unwrap();
    control
        .execute("INSERT INTO refuse_claims VALUES (true)")
        .await
        .unwrap();
    let refused = first
        .append(operation_step(
            ExpectedVersion::Exact(4),
            claimed("first", 2),
        ))
        .await;
    assert!(refused.is_err(), "{refused:?}");
    control.execute("DELETE FROM refuse_claims").await.unwrap();
    first.append(one("misc-2", "Noted", 2)).await.unwrap();
    let rows = claimed_elsewhere_then_sent(&first, &second, 4, "other", 2).await;
    assert_eq!(
        (rows[0].worker.as_deref(), rows[0].version),
        (Some("other"), 6),
        "{rows:?}"
    );
    first.close().await;
    second.close().await;
    control.close().await.ok();
}

/// One append is held open in the middle of its transaction (a test-only trigger makes its
/// event insert wait on an advisory lock this test holds) after it took position 11. Two other
/// instances append meanwhile. A reader must not see anything past position 10 while the held
/// append is open, and then every position exactly once, in order, the held one first.
///
/// With positions from a sequence, the other appends would commit 12, 13, ... first, and a reader
/// remembering "last seen 13" would skip 11 forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reader_never_passes_an_append_held_open_mid_commit() {
    let Some(database) = TestDatabase::create().await else {
        return;
    };
    let held_store = open(database.url(), PgOptions::default()).await;
    for n in 0..10 {
        held_store
            .append(one("op-warmup", "Warmup", n))
            .await
            .unwrap();
    }
    let (mut control, mut holder) = hold_marked_events(&database).await;
    let held = tokio::spawn({
        let store = held_store.clone();
        async move { store.append(one("op-held", "Held", 0)).await }
    });
    wait_for_count(&mut control, HELD_WAITING, 1).await;

    // Two more instances (as other processes would be), waiting long enough for the head.
    let patient = PgOptions {
        lock_timeout: Duration::from_secs(60),
        ..PgOptions::default()
    };
    let others = [
        open(database.url(), patient.clone()).await,
        open(database.url(), patient).await,
    ];
    let mut writers = Vec::new();
    for (i, store) in others.iter().enumerate() {
        for n in 0..5 {
            let store = store.clone();
            writers.push(tokio::spawn(async move {
                store
                    .append(one(&format!("op-other-{i}-{n}"), "Other", n))
                    .await
            }));
        }
    }
    // Both other instances are now blocked behind the held append's lock on the head row.
    wait_for_count(
        &mut control,
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
         AND application_name = 'opledger'",
        2,
    )
    .await;

    let reader_store = open(database.url(), PgOptions::default()).await;
    let mut tail = Tail::new(reader_store.clone(), 11).poll_interval(Duration::from_millis(10));
    let nothing = tail
        .next_page_within(100, Duration::from_millis(1500))
        .await
        .unwrap();
    assert_eq!(nothing, None, "the reader passed the held position");
    assert_eq!(reader_store.head().await.unwrap().position, 10);

    holder
        .execute("SELECT pg_advisory_unlock(4242)")
        .await
        .unwrap();
    let held = held
        .await
        .unwrap()
        .expect("the held append commits once released");
    assert_eq!(held.positions, 11..=11);
    for writer in writers {
        writer
            .await
            .unwrap()
            .expect("the other appends commit after it");
    }
    let mut seen = Vec::new();
    while seen.len() < 11 {
        let page = tail
            .next_page_within(100, Duration::from_secs(10))
            .await
            .unwrap()
            .expect("the released appends become visible");
        seen.extend(page);
    }
    let positions: Vec<u64> = seen.iter().map(|e| e.position).collect();
    assert_eq!(positions, (11..=21).collect::<Vec<u64>>());
    assert_eq!(seen[0].event_type, "Held");
    assert_consistent(&reader_store).await;
    for store in [held_store, reader_store].iter().chain(&others) {
        store.close().await;
    }
    holder.close().await.ok();
    control.close().await.ok();
}

/// Counts what concurrent writers saw while the test breaks the database under them.
#[derive(Default)]
struct Outcomes {
    committed: AtomicU64,
    unavailable: AtomicU64,
    unexpected: std::sync::Mutex<Vec<String>>,
}

/// Writers that append two-stream calls until `stop`, sorting every answer into `outcomes`.
fn spawn_writers(
    store: &PgStore,
    outcomes: &Arc<Outcomes>,
    stop: &Arc<AtomicBool>,
    tag: &str,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..4)
        .map(|writer| {
            let (store, outcomes, stop) = (store.clone(), outcomes.clone(), stop.clone());
            let tag = format!("{tag}{writer}");
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    match store.append(pair_call(&tag, i)).await {
                        Ok(_) => {
                            outcomes.committed.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(StoreError::Unavailable { .. }) => {
                            outcomes.unavailable.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        Err(other) => outcomes.unexpected.lock().unwrap().push(other.to_string()),
                    }
                    i += 1;
                }
            })
        })
        .collect()
}

async fn wait_for_commits(outcomes: &Outcomes, at_least: u64) {
    for _ in 0..3000 {
        if outcomes.committed.load(Ordering::SeqCst) >= at_least {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("writers did not reach {at_least} commits within 30 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_connections_are_unavailable_and_the_store_recovers() {
    let Some(database) = TestDatabase::create().await else {
        return;
    };
    let name = format!("opledger-kill-{}", std::process::id());
    let options = PgOptions {
        application_name: name.clone(),
        ..PgOptions::default()
    };
    let store = open(database.url(), options).await;
    let (outcomes, stop) = (
        Arc::new(Outcomes::default()),
        Arc::new(AtomicBool::new(false)),
    );
    let writers = spawn_writers(&store, &outcomes, &stop, "kill");
    wait_for_commits(&outcomes, 20).await;

    let mut killer = database.connect().await;
    let mut killed = 0;
    for _ in 0..30 {
        let rows: Vec<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = $1 AND pid <> pg_backend_pid()",
        )
        .bind(&name)
        .fetch_all(&mut killer)
        .await
        .unwrap();
        killed += rows.len();
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert!(killed > 0, "the store's connections were found and killed");
    let before = outcomes.committed.load(Ordering::SeqCst);
    wait_for_commits(&outcomes, before + 20).await;
    stop.store(true, Ordering::SeqCst);
    for writer in writers {
        writer.await.unwrap();
    }
    let unexpected = outcomes.unexpected.lock().unwrap().clone();
    assert!(
        unexpected.is_empty(),
        "only Unavailable may surface: {unexpected:?}"
    );
    assert!(
        outcomes.unavailable.load(Ordering::SeqCst) > 0,
        "killing the writer's connection surfaced as Unavailable"
    );
    // Reads heal too, and nothing was half written.
    assert!(assert_pairs_complete(&store).await > 0);
    assert_consistent(&store).await;
    store.close().await;
    killer.close().await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_server_is_unavailable_then_the_store_continues() {
    let Some(cluster) = tokio::task::spawn_blocking(PrivateCluster::start)
        .await
        .unwrap()
    else {
        return;
    };
    let options = PgOptions {
        connect_timeout: Duration::from_secs(2),
        ..PgOptions::default()
    };
    let store = open(&cluster.url(), options).await;
    let (outcomes, stop) = (
        Arc::new(Outcomes::default()),
        Arc::new(AtomicBool::new(false)),
    );
    let writers = spawn_writers(&store, &outcomes, &stop, "restart");
    wait_for_commits(&outcomes, 20).await;

    let cluster = Arc::new(cluster);
    tokio::task::spawn_blocking({
        let cluster = cluster.clone();
        move || {
            cluster.stop();
            std::thread::sleep(Duration::from_millis(500));
            cluster.start_server();
        }
    })
    .await
    .unwrap();
    let before = outcomes.committed.load(Ordering::SeqCst);
    wait_for_commits(&outcomes, before + 20).await;
    stop.store(true, Ordering::SeqCst);
    for writer in writers {
        writer.await.unwrap();
    }
    let unexpected = outcomes.unexpected.lock().unwrap().clone();
    assert!(
        unexpected.is_empty(),
        "only Unavailable may surface: {unexpected:?}"
    );
    assert!(outcomes.unavailable.load(Ordering::SeqCst) > 0);
    assert!(assert_pairs_complete(&store).await > 0);
    assert_consistent(&store).await;
    store.close().await;
    drop(store);
    drop(cluster);
}

/// Appends by one instance wake the readers of another: `LISTEN/NOTIFY` carries the new head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_instance_s_appends_wake_this_instance_s_readers() {
    let Some(database) = TestDatabase::create().await else {
        return;
    };
    let reader = open(database.url(), PgOptions::default()).await;
    let writer = open(database.url(), PgOptions::default()).await;
    let mut watch = reader.subscribe();
    // The listener connects in the background; append until a notification arrives.
    let woke = tokio::time::timeout(Duration::from_secs(20), async {
        let mut n = 0;
        loop {
            writer.append(one("op-wake", "Woken", n)).await.unwrap();
            n += 1;
            if let Ok(Some(position)) =
                tokio::time::timeout(Duration::from_millis(200), watch.changed()).await
            {
                return position;
            }
        }
    })
    .await
    .expect("a notification from the other instance arrived");
    assert!(woke >= 1);
    assert!(woke <= writer.head().await.unwrap().position);
    reader.close().await;
    writer.close().await;
}

/// Background work on a runtime of its own (the read models' runner on its thread, ADR 0023)
/// reads through the store's background connections: it never waits for a reader the service
/// holds, and never lends the service a connection that its runtime's reactor wakes (which
/// would fail once that runtime stopped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_reads_go_through_connections_of_their_own() {
    let Some(database) = TestDatabase::create().await else {
        return;
    };
    let options = PgOptions {
        read_connections: 1,
        connect_timeout: Duration::from_secs(2),
        ..PgOptions::default()
    };
    let store = open(database.url(), options).await;
    store.append(one("op-background", "Seen", 0)).await.unwrap();
    let held = store.reader().acquire().await.expect("the only reader");
    let background = store.for_background();
    let read = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async { background.read_all(1, 10).await.map(|events| events.len()) })
    })
    .join()
    .expect("the background thread");
    assert_eq!(
        read.expect("a background read while the service holds every reader"),
        1
    );
    drop(held);
    // That runtime is gone; the service's readers still answer.
    for _ in 0..3 {
        assert_eq!(store.read_all(1, 10).await.expect("a read").len(), 1);
    }
    let other = store.for_background();
    assert_eq!(other.read_all(1, 10).await.expect("a read").len(), 1);
    store.close().await;
    assert!(other.reader().is_closed() && other.queue_reader().is_closed());
}

#[tokio::test]
async fn truncate_is_refused() {
    let Some(database) = TestDatabase::create().await else {
        return;
    };
    let store = open(database.url(), PgOptions::default()).await;
    store.append(one("op-kept", "Kept", 0)).await.unwrap();
    let mut connection = database.connect().await;
    for sql in [
        "TRUNCATE events CASCADE",
        "TRUNCATE ledger_head",
        "DELETE FROM ledger_head",
    ] {
        let error = connection.execute(sql).await.expect_err(sql);
        assert!(error.to_string().contains("append-only"), "{sql}: {error}");
    }
    assert_eq!(assert_consistent(&store).await.len(), 1);
    store.close().await;
    connection.close().await.ok();
}

#[tokio::test]
async fn the_cli_migrates_and_prints_a_postgres_ledger() {
    let Some(database) = TestDatabase::create().await else {
        return;
    };
    let migrate = opledger(database.url(), &["migrate"]);
    assert!(migrate.status.success(), "{}", stderr(&migrate));
    assert!(stdout(&migrate).contains("schema version 4, 0 events"));
    let store = open(database.url(), PgOptions::default()).await;
    store.append(one("op-cli", "Received", 7)).await.unwrap();
    store.close().await;
    let events = opledger(database.url(), &["events", "--json"]);
    assert!(events.status.success(), "{}", stderr(&events));
    let line: serde_json::Value = serde_json::from_str(stdout(&events).trim()).unwrap();
    assert_eq!(line["position"], 1);
    assert_eq!(line["stream_id"], "op-cli");
    assert_eq!(line["payload"], json!({ "n": 7 }));
    let streams = opledger(database.url(), &["streams", "--json"]);
    assert!(stdout(&streams).contains("\"stream_id\":\"op-cli\""));

    let mut connection = database.connect().await;
    connection
        .execute(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
             VALUES (99, 'from the future', true, '\\x00', 1)",
        )
        .await
        .unwrap();
    connection.close().await.ok();
    let newer = opledger(database.url(), &["events"]);
    assert!(!newer.status.success());
    assert!(
        stderr(&newer).contains("schema is newer than this binary"),
        "{}",
        stderr(&newer)
    );
}

/// The worker's queue reads find due operations through the queue's partial index from the
/// table's first moment on. Plans made for the parameters before the table's first ANALYZE
/// (its first minute, every benchmark) scanned and sorted all its rows, finished operations
/// included, at every look: about one look per operation taken.
#[tokio::test]
async fn the_workers_queue_reads_stay_on_the_queue_index_before_any_analyze() {
    use crate::support::app::{Backend, Ledger};
    use opledger_projections::operation_status::due_sql;
    use opledger_store::ReadPool;

    let Some(ledger) = Ledger::create(Backend::Postgres).await else {
        return;
    };
    let store = ledger.open().await;
    let ReadPool::Postgres(queue) = store.queue_reader() else {
        panic!("a PostgreSQL ledger reads its queue from PostgreSQL");
    };
    let explain = format!(
        "EXPLAIN {}",
        due_sql(opledger_projections::Backend::Postgres, false)
    );
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
        .bind(Utc::now())
        .bind(vec!["coupon".to_owned()])
        .bind(4_i64)
        .fetch_all(queue)
        .await
        .expect("explain the queue's read");
    let plan = plan.join("\n");
    assert!(plan.contains("operation_status_work_due"), "{plan}");
    assert!(!plan.contains("Seq Scan"), "{plan}");
    store.close().await;
}
