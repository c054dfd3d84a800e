//! The event store conformance suite: every backend runs these same functions, unchanged, through
//! `conformance_suite!`. A backend only says how to create an isolated database, open a store on
//! it, and run raw SQL beside the store.

pub(crate) mod postgres;
pub(crate) mod sqlite;

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use futures_util::future::join_all;
use opledger_store::{
    AppendRequest, Appended, EventStore, ExpectedVersion, GroupCommitOptions, InvalidRequest,
    LedgerReader, NewEvent, RecordedEvent, StoreError, StreamId, Tail, verify::Verifier,
};

/// What the suite needs from a backend.
pub(crate) trait Backend: Sized + Send + Sync + 'static {
    type Store: EventStore + Clone + Send + Sync + 'static;

    /// A fresh, empty, isolated database; `None` only when the backend's server is not available
    /// outside CI (the caller prints that the tests were skipped).
    async fn create() -> Option<Self>;

    /// Opens a store on this database (again after [`Backend::close`]).
    async fn open(&self, group_commit: GroupCommitOptions) -> Self::Store;

    /// Closes a store: commits what is queued and releases its connections.
    async fn close(store: Self::Store);

    /// Runs SQL beside the store, as a careless operator or an attacker would.
    async fn execute_raw(&self, sql: &str) -> Result<u64, sqlx::Error>;

    /// The database URL, for child processes.
    fn url(&self) -> String;
}

/// Declares one `#[tokio::test]` per conformance function for a backend.
macro_rules! conformance_suite {
    ($backend:ty) => {
        conformance_suite!(@tests $backend;
            concurrent_no_stream_appends_have_one_winner,
            stale_exact_version_is_rejected,
            any_appends_whatever_the_version,
            conflict_on_a_missing_stream_reports_version_zero,
            multi_stream_append_is_atomic_and_contiguous,
            multi_stream_append_with_one_conflict_writes_nothing,
            conflict_does_not_fail_other_calls_in_its_batch,
            tailing_reader_sees_every_position_once_in_order,
            history_refuses_update_and_delete,
            hash_chain_recomputes_from_the_table,
            data_survives_close_and_reopen,
            aborted_appends_leave_no_partial_append_and_no_gap,
            killed_writer_process_leaves_no_partial_append_and_no_gap,
            concurrent_processes_share_one_gapless_ledger,
            reads_page_by_position_and_by_version,
            reads_beyond_the_largest_column_value_find_nothing,
            invalid_requests_write_nothing,
            subscription_wakes_on_new_events,
            recorded_at_comes_from_the_database_and_never_decreases,
            streams_are_listed_in_id_order,
        );
    };
    (@tests $backend:ty; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let Some(backend) = <$backend as $crate::conformance::Backend>::create().await else {
                    return;
                };
                $crate::conformance::$name(&backend).await;
            }
        )*
    };
}
pub(crate) use conformance_suite;

fn stream(id: &str) -> StreamId {
    StreamId::new(id).expect("test stream ids are valid")
}

fn event(n: u64) -> NewEvent {
    NewEvent::from_serialize(
        "Tested",
        1,
        &serde_json::json!({ "n": n, "text": "naïve ünïcode ✓" }),
        &serde_json::json!({ "causation": { "kind": "system", "component": "conformance" } }),
    )
    .expect("test events serialize")
}

fn request(id: &str, expected: ExpectedVersion, events: u64) -> AppendRequest {
    AppendRequest::new(stream(id), expected, (0..events).map(event).collect())
}

async fn append_one<S: EventStore>(
    store: &S,
    id: &str,
    expected: ExpectedVersion,
    events: u64,
) -> Result<Appended, StoreError> {
    store.append(vec![request(id, expected, events)]).await
}

/// Reads the whole ledger and checks every invariant a reader relies on: positions `1..=head`
/// without a gap, an unbroken hash chain ending at the head, contiguous stream versions and
/// deterministic event ids, and stream versions that match the events. Returns the events.
pub(crate) async fn assert_consistent<S: EventStore>(store: &S) -> Vec<RecordedEvent> {
    let mut verifier = Verifier::new();
    let mut events = Vec::new();
    loop {
        let page = store
            .read_all(events.len() as u64 + 1, 997)
            .await
            .expect("read_all");
        if page.is_empty() {
            break;
        }
        for event in &page {
            verifier
                .check(event)
                .unwrap_or_else(|broken| panic!("{broken}"));
        }
        events.extend(page);
    }
    let counted: BTreeMap<String, u64> = verifier
        .stream_versions()
        .iter()
        .map(|(s, v)| (s.clone(), *v))
        .collect();
    let head = store.head().await.expect("head");
    verifier
        .finish(&head)
        .unwrap_or_else(|broken| panic!("{broken}"));
    let mut listed = BTreeMap::new();
    let mut after: Option<StreamId> = None;
    loop {
        let page = store
            .list_streams(after.as_ref(), 500)
            .await
            .expect("list_streams");
        let Some(last) = page.last() else { break };
        after = Some(last.stream_id.clone());
        for info in page {
            assert_eq!(info.category, info.stream_id.category());
            listed.insert(info.stream_id.to_string(), info.version);
        }
    }
    assert_eq!(listed, counted, "stream versions must match the events");
    events
}

/// Every `pair-…-a` stream has its `pair-…-b` partner with both of its events, and the reverse:
/// a call that wrote two streams was never half written.
pub(crate) async fn assert_pairs_complete<S: EventStore>(store: &S) -> usize {
    let mut versions = BTreeMap::new();
    let mut after: Option<StreamId> = None;
    loop {
        let page = store
            .list_streams(after.as_ref(), 500)
            .await
            .expect("list_streams");
        let Some(last) = page.last() else { break };
        after = Some(last.stream_id.clone());
        for info in page {
            versions.insert(info.stream_id.to_string(), info.version);
        }
    }
    let mut pairs = 0;
    for (id, version) in &versions {
        if let Some(base) = id.strip_suffix("-a") {
            assert_eq!(*version, 1, "{id}");
            assert_eq!(
                versions.get(&format!("{base}-b")),
                Some(&2),
                "{id} without its partner"
            );
            pairs += 1;
        } else if let Some(base) = id.strip_suffix("-b") {
            assert_eq!(
                versions.get(&format!("{base}-a")),
                Some(&1),
                "{id} without its partner"
            );
        }
    }
    pairs
}

/// A reader that follows the ledger from position 1 with a [`Tail`] (as projections will) until
/// it has seen `total` events, and returns the positions it saw, in the order it saw them (a
/// page may take it past `total`).
fn follow<S: EventStore + 'static>(store: S, total: u64) -> tokio::task::JoinHandle<Vec<u64>> {
    follow_from(store, 1, total)
}

/// Like [`follow`], from position `from` up to and including position `last`.
fn follow_from<S: EventStore + 'static>(
    store: S,
    from: u64,
    last: u64,
) -> tokio::task::JoinHandle<Vec<u64>> {
    tokio::spawn(async move {
        let mut tail = Tail::new(store, from).poll_interval(Duration::from_millis(20));
        let mut seen = Vec::new();
        while tail.next_position() <= last {
            let page = tail
                .next_page_within(333, Duration::from_secs(60))
                .await
                .expect("tail")
                .expect("events keep coming while the writers run");
            seen.extend(page.iter().map(|e| e.position));
        }
        seen
    })
}

pub(crate) fn pair_call(tag: &str, i: u64) -> Vec<AppendRequest> {
    vec![
        request(&format!("pair-{tag}-{i}-a"), ExpectedVersion::NoStream, 1),
        request(&format!("pair-{tag}-{i}-b"), ExpectedVersion::NoStream, 2),
    ]
}

pub(crate) async fn concurrent_no_stream_appends_have_one_winner<B: Backend>(backend: &B) {
    let store = backend.open(GroupCommitOptions::default()).await;
    let results = join_all((0..64).map(|n| {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .append(vec![AppendRequest::new(
                    stream("op-coupon-race"),
                    ExpectedVersion::NoStream,
                    vec![event(n)],
                )])
                .await
        })
    }))
    .await;
    let mut winners = 0;
    for result in results {
        match result.expect("task") {
            Ok(appended) => {
                winners += 1;
                assert_eq!(appended.positions, 1..=1);
            }
            Err(StoreError::VersionConflict {
                stream: s,
                expected,
                actual,
            }) => {
                assert_eq!(s, stream("op-coupon-race"));
                assert_eq!(expected, ExpectedVersion::NoStream);
                assert_eq!(actual, 1);
            }
            Err(other) => panic!("a loser must get a version conflict, got {other}"),
        }
    }
    assert_eq!(winners, 1);
    // No loser burned a position: the next event is at position 2.
    assert_eq!(store.head().await.unwrap().position, 1);
    let next = append_one(&store, "op-other", ExpectedVersion::NoStream, 1)
        .await
        .unwrap();
    assert_eq!(next.positions, 2..=2);
    assert_consistent(&store).await;
    B::close(store).await;
}

pub(crate) async fn stale_exact_version_is_rejected<B: Backend>(backend: &B) {
    let store = backend.open(GroupCommitOptions::default()).await;
    append_one(&store, "op-s", ExpectedVersion::NoStream, 2)
        .await
        .unwrap();
    let stale = append_one(&store, "op-s", ExpectedVersion::Exact(1), 1).await;
    assert!(
        matches!(
            stale,
            Err(StoreError::VersionConflict {
                actual: 2,
                expected: ExpectedVersion::Exact(1),
                ..
            })
        ),
        "{stale:?}"
    );
    let again = append_one(&store, "op-s", ExpectedVersion::NoStream, 1).await;
    assert!(matches!(
        again,
        Err(StoreError::VersionConflict { actual: 2, .. })
    ));
    let fresh = append_one(&store, "op-s", ExpectedVersion::Exact(2), 1)
        .await
        .unwrap();
    assert_eq!(fresh.streams, vec![(stream("op-s"), 3)]);
    assert_eq!(fresh.positions, 3..=3);
    assert_eq!(store.stream_version(&stream("op-s")).await.unwrap(), 3);
    assert_consistent(&store).await;
    B::close(store).await;
}

pub(crate) async fn any_appends_whatever_the_version<B: Backend>(backend: &B) {
    let store = backend.open(GroupCommitOptions::default()).await;
    let first = append_one(&store, "op-any", ExpectedVersion::Any, 2)
        .await
        .unwrap();
    assert_eq!(first.streams, vec![(stream("op-any"), 2)]);
    let second = append_one(&store, "op-any", ExpectedVersion::Any, 1)
        .await
        .unwrap();
    assert_eq!(second.streams, vec![(stream("op-any"), 3)]);
    let events = store.read_stream(&stream("op-any"), 1, 10).await.unwrap();
    let versions: Vec<u64> = events.iter().map(|e| e.version).collect();
    assert_eq!(versions, vec![1, 2, 3]);
    assert_consistent(&store).await;
    B::close(store).await;
}

pub(crate) async fn conflict_on_a_missing_stream_reports_version_zero<B: Backend>(backend: &B) {
    let store = backend.open(GroupCommitOptions::default()).await;
    let result = append_one(&store, "op-missing", ExpectedVersion::Exact(3), 1).await;
    assert!(
        matches!(result, Err(StoreError::VersionConflict { actual: 0, .. })),
        "{result:?}"
    );
    assert_eq!(
        store.stream_version(&stream("op-missing")).await.unwrap(),
        0
    );
    assert_eq!(store.head().await.unwrap().position, 0);
    B::close(store).await;
}

pub(crate) async fn multi_stream_append_is_atomic_and_contiguous<B: Backend>(backend: &B) {
    let store = backend.open(GroupCommitOptions::default()).await;
    append_one(&store, "op-existing", ExpectedVersion::NoStream, 1)
        .await
        .unwrap();
    let appended = store
        .append(vec![
            request("update-shop-7", ExpectedVersion::NoStream, 1),
            request("op-existing", ExpectedVersion::Exact(1), 2),
        ])
        .await
        .unwrap();
    assert_eq!(appended.positions, 2..=4);
    assert_eq!(
        appended.streams,
        vec![(stream("update-shop-7"), 1), (stream("op-existing"), 3)]
    );
    let events = assert_consistent(&store).await;
    let order: Vec<(String, u64)> = events
        .iter()
        .map(|e| (e.stream_id.to_string(), e.version))
        .collect();
    assert_eq!(
        order,
        vec![
            ("op-existing".into(), 1),
            ("update-shop-7".into(), 1),
            ("op-existing".into(), 2),
            ("op-existing".into(), 3),
        ],
        "events keep request order"
    );
    B::close(store).await;
}

pub(crate) async fn multi_stream_append_with_one_conflict_writes_nothing<B: Backend>(backend: &B) {
    let store = backend.open(GroupCommitOptions::default()).await;
    append_one(&store, "op-taken", ExpectedVersion::NoStream, 1)
        .await
        .unwrap();
    let result = store
        .append(vec![
            request("update-shop-8", ExpectedVersion::NoStream, 1),
            request("op-taken", ExpectedVersion::NoStream, 1),
        ])
        .await;
    assert!(
        matches!(&result, Err(StoreError::VersionConflict { stream: s, actual: 1, .. }) if *s == stream("op-taken")),
        "{result:?}"
    );
    assert_eq!(
        store
            .stream_version(&stream("update-shop-8"))
            .await
            .unwrap(),
        0
    );
    assert_eq!(store.head().await.unwrap().position, 1);
    // The position the failed call did not use goes to the next append.
    let next = append_one(&store, "update-shop-8", ExpectedVersion::NoStream, 1)
        .await
        .unwrap();
    assert_eq!(next.positions, 2..=2);
    assert_consistent(&store).await;
    B::close(store).await;
}

pub(crate) async fn conflict_does_not_fail_other_calls_in_its_batch<B: Backend>(backend: &B) {
    // Hold the batch open until all 32 calls are in, so they share one transaction.
    let store = backend
        .open(GroupCommitOptions {
            max_batch_calls: 32,
            max_wait: Duration::from_secs(5),
            ..GroupCommitOptions::default()
        })
        .await;
    let results = join_all((0..32u64).map(|i| {
        let store = store.clone();
        tokio::spawn(async move {
            if i % 2 == 0 {
                append_one(
                    &store,
                    &format!("op-good-{i}"),
                    ExpectedVersion::NoStream,
                    1,
                )
                .await
            } else {
                append_one(&store, &format!("op-bad-{i}"), ExpectedVersion::Exact(7), 1).await
            }
        })
    }))
    .await;
    let mut committed_at = HashSet::new();
    for (i, result) in results.into_iter().enumerate() {
        match result.expect("task") {
            Ok(appended) if i % 2 == 0 => {
                committed_at.insert(appended.recorded_at);
            }
            Err(StoreError::VersionConflict { actual: 0, .. }) if i % 2 == 1 => {}
            other => panic!("call {i}: unexpected {other:?}"),
        }
    }
    assert_eq!(
        committed_at.len(),
        1,
        "the good calls committed in one batch"
    );
    assert_eq!(store.head().await.unwrap().position, 16);
    assert_consistent(&store).await;
    B::close(store).await;
}

pub(crate) async fn tailing_reader_sees_every_position_once_in_order<B: Backend>(backend: &B) {
    const WRITERS: u64 = 8;
    const EACH: u64 = 1000;
    let store = backend.open(GroupCommitOptions::default()).await;
    let reader = follow(store.clone(), WRITERS * EACH);
    let writers = join_all((0..WRITERS).map(|w| {
        let store = store.clone();
        tokio::spawn(async move {
            for version in 0..EACH {
                let expected = if version == 0 {
                    ExpectedVersion::NoStream
                } else {
                    ExpectedVersion::Exact(version)
                };
                append_one(&store, &format!("op-writer-{w}"), expected, 1)
                    .await
                    .expect("sequential appends of one writer never conflict");
            }
        })
    }))
    .await;
    for writer in writers {
        writer.expect("writer");
    }
    let seen = reader.await.expect("reader");
    let expected: Vec<u64> = (1..=WRITERS * EACH).collect();
    assert!(
        seen == expected,
        "the tailing reader saw a gap, a repeat or a reordering"
    );
    assert_eq!(store.head().await.unwrap().position, WRITERS * EACH);
    assert_consistent(&store).await;
    B::close(store).await;
}

pub(crate) async fn history_refuses_update_and_delete<B: Backend>(backend: &B) {
    let store = backend.open(GroupCommitOptions::default()).await;
    append_one(&store, "op-kept", ExpectedVersion::NoStream, 2)
        .await
        .unwrap();
    let before = assert_consistent(&store).await;
    for sql in [
        "UPDATE events SET event_type = 'Tampered' WHERE position = 1",
        "UPDATE events SET payload = payload WHERE position = 2",
        "DELETE FROM events WHERE position = 2",
        "DELETE FROM events",
        // Streams rows keep their id and only move forward, so no event loses its stream.
        "DELETE FROM streams",
        "UPDATE streams SET stream_id = 'op-renamed'",
        "UPDATE streams SET version = 1 WHERE stream_id = 'op-kept'",
        // The head names the last event; it cannot be moved back or removed.
        "UPDATE ledger_head SET last_position = 1",
        "DELETE FROM ledger_head",
    ] {
        let result = backend.execute_raw(sql).await;
        assert!(result.is_err(), "the database accepted `{sql}`");
        let message = result.unwrap_err().to_string();
        assert!(
            message.contains("opledger"),
            "`{sql}` failed for another reason: {message}"
        );
    }
    assert_eq!(assert_consistent(&store).await, before);
    assert_eq!(store.stream_version(&stream("op-kept")).await.unwrap(), 2);
    B::close(store).await;
}

pub(crate) async fn hash_chain_recomputes_from_the_table<B: Backend>(backend: &B) {
    let store = backend.open(GroupCommitOptions::default()).await;
    join_all((0..20u64).map(|i| {
        let store = store.clone();
        async move { store.append(pair_call("chain", i)).await.unwrap() }
    }))
    .await;
    append_one(&store, "op-big", ExpectedVersion::Any, 150)
        .await
        .unwrap();
    let events = assert_consistent(&store).await;
    assert_eq!(events.len(), 20 * 3 + 150);
    // Independently of the verifier: each link seals the stored fields onto its predecessor.
    let mut prev = opledger_store::Hash::GENESIS;
    for event in &events {
        assert_eq!(event.prev_hash, prev);
        assert_eq!(
            event.link().seal(&prev),
            event.hash,
            "position {}",
            event.position
        );
        prev = event.hash;
    }
    assert_eq!(store.head().await.unwrap().hash, prev);
    // Payloads and metadata come back as the exact bytes that were appended.
    assert_eq!(events[0].payload, event(0).payload.get().as_bytes());
    assert_eq!(events[0].metadata, event(0).metadata.get().as_bytes());
    B::close(store).await;
}

pub(crate) async fn data_survives_close_and_reopen<B: Backend>(backend: &B) {
    let store = backend.open(GroupCommitOptions::default()).await;
    store.append(pair_call("reopen", 1)).await.unwrap();
    append_one(&store, "op-reopen", ExpectedVersion::NoStream, 2)
        .await
        .unwrap();
    let before = assert_consistent(&store).await;
    B::close(store).await;

    let store = backend.open(GroupCommitOptions::default()).await;
    assert_eq!(assert_consistent(&store).await, before);
    let more = append_one(&store, "op-reopen", ExpectedVersion::Exact(2), 1)
        .await
        .unwrap();
    assert_eq!(more.positions, 6..=6);
    assert_eq!(more.streams, vec![(stream("op-reopen"), 3)]);
    let after = assert_consistent(&store).await;
    assert_eq!(after[..5], before[..]);
    B::close(store).await;
}

pub(crate) async fn aborted_appends_leave_no_partial_append_and_no_gap<B: Backend>(backend: &B) {
    let store = backend.open(GroupCommitOptions::default()).await;
    for round in 0..12u64 {
        let tasks: Vec<_> = (0..6u64)
            .map(|caller| {
                let store = store.clone();
                tokio::spawn(async move {
                    for i in 0.. {
                        let _ = store
                            .append(pair_call(&format!("abort{round}x{caller}"), i))
                            .await;
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(3 + round * 4)).await;
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
    }
    B::close(store).await;

    // Also drop a whole runtime, appender and all, in the middle of its appends: the store below
    // is opened inside that runtime, so its appender task dies with it.
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                let store = backend.open(GroupCommitOptions::default()).await;
                let tasks: Vec<_> = (0..4u64)
                    .map(|caller| {
                        let store = store.clone();
                        tokio::spawn(async move {
                            for i in 0.. {
                                let _ = store.append(pair_call(&format!("rt{caller}"), i)).await;
                            }
                        })
                    })
                    .collect();
                tokio::time::sleep(Duration::from_millis(40)).await;
                drop(tasks);
            });
            runtime.shutdown_timeout(Duration::ZERO);
        });
    });

    let store = backend.open(GroupCommitOptions::default()).await;
    let pairs = assert_pairs_complete(&store).await;
    assert!(pairs > 0, "some appends committed before the aborts");
    assert_consistent(&store).await;
    B::close(store).await;
}

pub(crate) async fn killed_writer_process_leaves_no_partial_append_and_no_gap<B: Backend>(
    backend: &B,
) {
    for round in 0..3 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_opledger-testkit"))
            .args(["append", "--url", &backend.url(), "--callers", "8", "--tag"])
            .arg(format!("kill{round}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start opledger-testkit");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        // Kill it while it is busy appending: after it reported 100 committed calls.
        loop {
            let line = lines
                .next()
                .expect("the child reports progress before it is killed")
                .expect("read child output");
            if line == "committed 100" {
                break;
            }
        }
        child.kill().expect("SIGKILL the child");
        let status = child.wait().expect("wait for the child");
        assert!(!status.success(), "the child was killed, not finished");
    }
    let store = backend.open(GroupCommitOptions::default()).await;
    let pairs = assert_pairs_complete(&store).await;
    assert!(
        pairs >= 300,
        "each child committed at least 100 calls, found {pairs}"
    );
    assert_consistent(&store).await;
    // The ledger takes new appends after the crashes.
    store.append(pair_call("after-kill", 0)).await.unwrap();
    assert_consistent(&store).await;
    B::close(store).await;
}

pub(crate) async fn concurrent_processes_share_one_gapless_ledger<B: Backend>(backend: &B) {
    const CALLS: u64 = 150;
    const CALLERS: u64 = 4;
    const HOT: u64 = 3;
    let store = backend.open(GroupCommitOptions::default()).await;
    // A reader in this process follows the ledger while two other processes write to it. Each
    // pair call writes three events; the racing appends to the hot streams add some more.
    let reader = follow(store.clone(), 2 * CALLERS * CALLS * 3);
    let children: Vec<_> = ["procA", "procB"]
        .into_iter()
        .map(|tag| {
            Command::new(env!("CARGO_BIN_EXE_opledger-testkit"))
                .args(["append", "--url", &backend.url(), "--tag", tag])
                .args(["--callers", &CALLERS.to_string()])
                .args(["--calls", &CALLS.to_string()])
                .args(["--hot-streams", &HOT.to_string()])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("start opledger-testkit")
        })
        .collect();
    let mut hot_committed = 0;
    for child in children {
        let output = tokio::task::spawn_blocking(move || child.wait_with_output())
            .await
            .expect("join")
            .expect("wait for the child");
        assert!(output.status.success(), "a writer process failed");
        let stdout = String::from_utf8(output.stdout).expect("UTF-8");
        let summary: serde_json::Value =
            serde_json::from_str(stdout.lines().last().expect("a summary line")).expect("JSON");
        assert_eq!(summary["committed"], CALLERS * CALLS, "{summary}");
        assert_eq!(
            summary["unavailable"], 0,
            "writers wait for each other: {summary}"
        );
        let hot = summary["hot_committed"].as_u64().expect("a count");
        let conflicts = summary["conflicts"].as_u64().expect("a count");
        assert_eq!(
            hot + conflicts,
            CALLERS * CALLS,
            "each racing append won or lost: {summary}"
        );
        hot_committed += hot;
    }
    let mut seen = reader.await.expect("reader");
    let head = store.head().await.unwrap().position;
    assert_eq!(head, 2 * CALLERS * CALLS * 3 + hot_committed);
    seen.extend(
        follow_from(store.clone(), seen.len() as u64 + 1, head)
            .await
            .expect("reader"),
    );
    let expected: Vec<u64> = (1..=head).collect();
    assert!(
        seen == expected,
        "the reader saw a gap, a repeat or a reordering"
    );
    assert_eq!(
        assert_pairs_complete(&store).await as u64,
        2 * CALLERS * CALLS
    );
    // Losers wrote nothing: the hot streams hold exactly the winners' events.
    let mut hot_versions = 0;
    for k in 0..HOT {
        hot_versions += store
            .stream_version(&stream(&format!("hot-{k}")))
            .await
            .unwrap();
    }
    assert_eq!(hot_versions, hot_committed);
    assert_consistent(&store).await;
    B::close(store).await;
}

pub(crate) async fn reads_page_by_position_and_by_version<B: Backend>(backend: &B) {
    let store = backend.open(GroupCommitOptions::default()).await;
    for i in 0..10u64 {
        store
            .append(vec![request(
                &format!("op-page-{}", i % 2),
                ExpectedVersion::Any,
                1,
            )])
            .await
            .unwrap();
    }
    let page: Vec<u64> = store
        .read_all(4, 3)
        .await
        .unwrap()
        .iter()
        .map(|e| e.position)
        .collect();
    assert_eq!(page, vec![4, 5, 6]);
    let from_zero: Vec<u64> = store
        .read_all(0, 2)
        .await
        .unwrap()
        .iter()
        .map(|e| e.position)
        .collect();
    assert_eq!(from_zero, vec![1, 2]);
    assert!(store.read_all(11, 5).await.unwrap().is_empty());
    let odd = store.read_stream(&stream("op-page-1"), 2, 3).await.unwrap();
    let got: Vec<(u64, u64)> = odd.iter().map(|e| (e.version, e.position)).collect();
    assert_eq!(got, vec![(2, 4), (3, 6), (4, 8)]);
    assert!(
        store
            .read_stream(&stream("op-none"), 1, 5)
            .await
            .unwrap()
            .is_empty()
    );
    B::close(store).await;
}

/// Positions and versions are `u64` in the model and signed 64-bit integers in both databases: a
/// read from beyond `i64::MAX` (a client's `from_version`, `opledger events --from`) finds no
/// event, as a read beyond the head does, and is not an error.
pub(crate) async fn reads_beyond_the_largest_column_value_find_nothing<B: Backend>(backend: &B) {
    let store = backend.open(GroupCommitOptions::default()).await;
    append_one(&store, "op-far", ExpectedVersion::NoStream, 3)
        .await
        .unwrap();
    let reader = LedgerReader::open(&backend.url())
        .await
        .expect("open read-only");
    let beyond = [1u64 << 63, (1u64 << 63) + 1, u64::MAX];
    for from in beyond {
        assert!(store.read_all(from, 10).await.unwrap().is_empty(), "{from}");
        let far = store.read_stream(&stream("op-far"), from, 10).await;
        assert!(far.unwrap().is_empty(), "{from}");
        assert!(
            reader.read_all(from, 10).await.unwrap().is_empty(),
            "{from}"
        );
        assert!(
            reader
                .read_range(from, u64::MAX, 10)
                .await
                .unwrap()
                .is_empty(),
            "{from}"
        );
        let far = reader.read_stream(&stream("op-far"), from, 10).await;
        assert!(far.unwrap().is_empty(), "{from}");
    }
    // The largest value the columns hold is an ordinary bound.
    let last = i64::MAX as u64;
    assert!(store.read_all(last, 10).await.unwrap().is_empty());
    assert_eq!(reader.read_range(1, u64::MAX, 10).await.unwrap().len(), 3);
    assert_eq!(
        reader
            .last_position_at(chrono::Utc::now(), u64::MAX)
            .await
            .unwrap(),
        3
    );
    reader.close().await;
    B::close(store).await;
}

pub(crate) async fn invalid_requests_write_nothing<B: Backend>(backend: &B) {
    let store = backend.open(GroupCommitOptions::default()).await;
    let empty = store.append(vec![]).await;
    assert!(matches!(
        empty,
        Err(StoreError::InvalidRequest(InvalidRequest::NoRequests))
    ));
    let no_events = store
        .append(vec![AppendRequest::new(
            stream("op-x"),
            ExpectedVersion::Any,
            vec![],
        )])
        .await;
    assert!(matches!(
        no_events,
        Err(StoreError::InvalidRequest(InvalidRequest::NoEvents { .. }))
    ));
    let twice = store
        .append(vec![
            request("op-x", ExpectedVersion::Any, 1),
            request("op-x", ExpectedVersion::Any, 1),
        ])
        .await;
    assert!(matches!(
        twice,
        Err(StoreError::InvalidRequest(
            InvalidRequest::DuplicateStream { .. }
        ))
    ));
    assert_eq!(store.head().await.unwrap().position, 0);
    B::close(store).await;
}

pub(crate) async fn subscription_wakes_on_new_events<B: Backend>(backend: &B) {
    let store = backend.open(GroupCommitOptions::default()).await;
    let mut watch = store.subscribe();
    assert_eq!(watch.latest(), 0);
    let writer = tokio::spawn({
        let store = store.clone();
        async move { append_one(&store, "op-wake", ExpectedVersion::NoStream, 3).await }
    });
    let woke = tokio::time::timeout(Duration::from_secs(10), watch.changed())
        .await
        .expect("woken within 10 s");
    assert_eq!(woke, Some(3));
    writer.await.unwrap().unwrap();
    B::close(store).await;
}

pub(crate) async fn recorded_at_comes_from_the_database_and_never_decreases<B: Backend>(
    backend: &B,
) {
    let store = backend.open(GroupCommitOptions::default()).await;
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_micros() as i64;
    for i in 0..30u64 {
        append_one(
            &store,
            &format!("op-time-{}", i % 3),
            ExpectedVersion::Any,
            1,
        )
        .await
        .unwrap();
    }
    let events = assert_consistent(&store).await;
    for pair in events.windows(2) {
        assert!(pair[0].recorded_at <= pair[1].recorded_at);
    }
    let skew = (events[0].recorded_at.timestamp_micros() - started).abs() / 1_000_000;
    assert!(
        skew < 60,
        "recorded_at is the database's clock, {skew} s away from ours"
    );
    B::close(store).await;
}

pub(crate) async fn streams_are_listed_in_id_order<B: Backend>(backend: &B) {
    let store = backend.open(GroupCommitOptions::default()).await;
    for i in (0..25u64).rev() {
        append_one(
            &store,
            &format!("cb-token{i:02}"),
            ExpectedVersion::NoStream,
            1,
        )
        .await
        .unwrap();
    }
    let first = store.list_streams(None, 10).await.unwrap();
    let second = store
        .list_streams(Some(&first[9].stream_id), 10)
        .await
        .unwrap();
    let third = store
        .list_streams(Some(&second[9].stream_id), 10)
        .await
        .unwrap();
    let ids: Vec<String> = first
        .iter()
        .chain(&second)
        .chain(&third)
        .map(|s| s.stream_id.to_string())
        .collect();
    let expected: Vec<String> = (0..25).map(|i| format!("cb-token{i:02}")).collect();
    assert_eq!(ids, expected);
    assert!(first.iter().all(|s| s.category == "cb" && s.version == 1));
    B::close(store).await;
}
