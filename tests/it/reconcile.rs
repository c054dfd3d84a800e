//! `opledger reconcile list` and `opledger reconcile resolve`, driven through the real binary on
//! both backends (issue 5 §6; DESIGN §2 guarantee 6): the queue shows every operation whose
//! outcome is unknown, and a person's decision is one audited `Reconciled` event, appended only
//! to an operation that waits for it.

use std::collections::BTreeMap;
use std::process::Output;

use chrono::{DateTime, TimeDelta, Utc};
use opledger_domain::operation::{
    self, Operation, OperationCommand, OperationEvent, Received, ReconcileOutcome, Reconciled,
    Status, evolve, fingerprint,
};
use opledger_domain::{Causation, DomainEvent, EventMetadata, OperationId, operation_stream};
use opledger_server::reconcile::{self, ReconcileError};
use opledger_server::{Clock, SystemClock};
use opledger_store::{
    AnyStore, AppendRequest, EventStore, ExpectedVersion, NewEvent, RecordedEvent, StreamId,
};
use serde_json::{Value, json};

use crate::support::app::{Backend, Ledger, on_both_backends};
use crate::support::{opledger, stderr, stdout};

on_both_backends!(
    list_shows_waiting_operations_with_their_reason_and_age,
    resolving_as_succeeded_appends_the_operators_decision,
    resolving_an_operation_that_no_longer_waits_fails_and_appends_nothing,
    resolving_as_retry_makes_the_operation_due_now_under_the_same_id,
    an_unknown_operation_id_is_a_clear_error,
    a_decision_without_operator_or_reason_is_refused,
    of_operators_deciding_at_once_exactly_one_is_recorded,
);

/// Why the worker marked the test operations.
const REASON: &str = "timeout after the request was sent; the service honours no idempotency \
                      key and has no lookup";

/// An operation of the test ledger.
struct Op {
    id: String,
    stream: StreamId,
}

/// `events` decided on `state` as one append at its version, caused by `causation`.
fn append_request(
    stream: &StreamId,
    state: &Operation,
    events: &[OperationEvent],
    causation: Causation,
) -> AppendRequest {
    let metadata =
        serde_json::value::to_raw_value(&EventMetadata::caused_by(causation)).expect("metadata");
    let events = events
        .iter()
        .map(|event| {
            let payload = String::from_utf8(event.to_payload().expect("payload")).expect("UTF-8");
            NewEvent::new(
                event.event_type(),
                event.schema_version(),
                serde_json::value::RawValue::from_string(payload).expect("JSON"),
            )
            .with_metadata(metadata.clone())
        })
        .collect();
    let expected = match state.version {
        0 => ExpectedVersion::NoStream,
        version => ExpectedVersion::Exact(version),
    };
    AppendRequest::new(stream.clone(), expected, events)
}

/// Decides `command` on the operation and appends what the domain decided; returns the new state.
async fn act(
    store: &AnyStore,
    stream: &StreamId,
    state: Operation,
    command: OperationCommand,
    causation: Causation,
    now: DateTime<Utc>,
) -> Operation {
    let events = operation::decide(&state, &command, now).expect("the domain accepts");
    store
        .append(vec![append_request(stream, &state, &events, causation)])
        .await
        .expect("append");
    events.iter().fold(state, evolve)
}

/// Starts a `coupon` operation for `key` (chat and user 42); when `unknown` is set, a worker
/// then claims it, sends the call and marks it for reconciliation, as after a timeout.
async fn operation(store: &AnyStore, key: &str, unknown: bool) -> Op {
    let now = SystemClock.now();
    let params = BTreeMap::from([("campaign".to_owned(), "spring".to_owned())]);
    let id = OperationId::new("coupon", key);
    let stream = StreamId::new(operation_stream("coupon", key).expect("stream id")).unwrap();
    let received = Received {
        operation_id: id,
        action: "coupon".to_owned(),
        business_key: key.to_owned(),
        fingerprint: fingerprint("coupon", &params),
        params,
        bot: "shop".to_owned(),
        chat_id: Some(42),
        user_id: Some(42),
        update_id: 1,
        message_date: None,
        max_attempts: 3,
    };
    let update = Causation::Update {
        bot: "shop".to_owned(),
        update_id: 1,
    };
    let worker = || Causation::Worker {
        worker: "worker-1".to_owned(),
    };
    let mut state = Operation::default();
    state = act(
        store,
        &stream,
        state,
        OperationCommand::Receive(received),
        update,
        now,
    )
    .await;
    if unknown {
        let claim = OperationCommand::Claim {
            worker: "worker-1".to_owned(),
            lease_until: now + TimeDelta::seconds(30),
        };
        state = act(store, &stream, state, claim, worker(), now).await;
        let sent = OperationCommand::RecordCallSent {
            worker: "worker-1".to_owned(),
        };
        state = act(store, &stream, state, sent, worker(), now).await;
        let mark = OperationCommand::MarkForReconciliation {
            reason: REASON.to_owned(),
        };
        state = act(store, &stream, state, mark, worker(), now).await;
        assert_eq!(state.status, Status::NeedsReconciliation);
    }
    Op {
        id: id.to_string(),
        stream,
    }
}

/// A ledger holding one operation waiting for reconciliation (`spring:42`) and one just received
/// (`summer:42`), written through a store that is closed again before the binary runs.
async fn ledger_with_a_waiting_operation(backend: Backend) -> Option<(Ledger, Op, Op)> {
    let ledger = Ledger::create(backend).await?;
    let store = ledger.open().await;
    let waiting = operation(&store, "spring:42", true).await;
    let received = operation(&store, "summer:42", false).await;
    store.close().await;
    Some((ledger, waiting, received))
}

async fn stream_events(ledger: &Ledger, stream: &StreamId) -> Vec<RecordedEvent> {
    let store = ledger.open().await;
    let events = store.read_stream(stream, 1, 1000).await.expect("read");
    store.close().await;
    events
}

async fn head(ledger: &Ledger) -> u64 {
    let store = ledger.open().await;
    let head = store.head().await.expect("head").position;
    store.close().await;
    head
}

fn json_lines(output: &Output) -> Vec<Value> {
    assert!(output.status.success(), "{}", stderr(output));
    stdout(output)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

/// The operation's row in `opledger ops --json`.
fn ops_row(ledger: &Ledger, id: &str) -> Value {
    json_lines(&opledger(&ledger.url(), &["ops", "--json"]))
        .into_iter()
        .find(|row| row["operation_id"] == id)
        .unwrap_or_else(|| panic!("operation {id} in `opledger ops`"))
}

/// Exactly one line on stderr, starting with `error:` and containing `needle`, and `code`.
fn assert_one_line_error(output: &Output, code: i32, needle: &str) {
    let err = stderr(output);
    assert_eq!(output.status.code(), Some(code), "{err}");
    assert_eq!(err.lines().count(), 1, "one line, got: {err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(needle), "expected `{needle}` in: {err}");
    assert_eq!(stdout(output), "", "nothing on stdout");
}

fn resolve(ledger: &Ledger, id: &str, args: &[&str]) -> Output {
    let mut all = vec!["reconcile", "resolve", id];
    all.extend_from_slice(args);
    opledger(&ledger.url(), &all)
}

async fn list_shows_waiting_operations_with_their_reason_and_age(backend: Backend) {
    let Some((ledger, waiting, received)) = ledger_with_a_waiting_operation(backend).await else {
        return;
    };
    // Let it wait a little, so that its age is not zero.
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;

    let before = SystemClock.now();
    let rows = json_lines(&opledger(&ledger.url(), &["reconcile", "list", "--json"]));
    let after = SystemClock.now();
    assert_eq!(rows.len(), 1, "only the waiting operation: {rows:?}");
    let row = &rows[0];
    assert_eq!(row["operation_id"], waiting.id.as_str());
    assert_eq!(row["stream_id"], waiting.stream.as_str());
    assert_eq!(row["action"], "coupon");
    assert_eq!(row["business_key"], "spring:42");
    assert_eq!(row["bot"], "shop");
    assert_eq!(row["chat_id"], 42);
    assert_eq!(row["user_id"], 42);
    assert_eq!(row["attempts"], 1);
    assert_eq!(row["reason"], REASON);
    let updated_at: DateTime<Utc> =
        serde_json::from_value(row["updated_at"].clone()).expect("updated_at is a time");
    let age = row["age_seconds"].as_i64().expect("age_seconds");
    assert!(age >= 1, "it has waited over a second: {row}");
    assert!(
        (before - updated_at).num_seconds() <= age && age <= (after - updated_at).num_seconds(),
        "age is the time since the last change: {row}"
    );
    assert_ne!(row["operation_id"], received.id.as_str());

    let table = stdout(&opledger(&ledger.url(), &["reconcile", "list"]));
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 2, "a header and one row: {table}");
    for column in ["AGE", "ATTEMPTS", "OPERATION", "CHAT", "USER", "REASON"] {
        assert!(lines[0].contains(column), "{column} in {table}");
    }
    assert!(lines[1].contains(&waiting.id), "{table}");
    assert!(
        lines[1].contains(&format!("coupon spring:42: {REASON}")),
        "{table}"
    );
    let shown_age = lines[1].split_whitespace().next().expect("an age");
    let seconds: i64 = shown_age
        .strip_suffix('s')
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("an age in seconds, got {shown_age}: {table}"));
    assert!(seconds >= 1, "{table}");
}

async fn resolving_as_succeeded_appends_the_operators_decision(backend: Backend) {
    let Some((ledger, waiting, _)) = ledger_with_a_waiting_operation(backend).await else {
        return;
    };
    let head_before = head(&ledger).await;

    let output = resolve(
        &ledger,
        &waiting.id,
        &[
            "--outcome",
            "succeeded",
            "--external-id",
            "crm-77",
            "--operator",
            "alice",
            "--note",
            "found the coupon in the CRM",
        ],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let said = stdout(&output);
    assert!(
        said.starts_with(&format!(
            "operation {} reconciled: succeeded (external id crm-77) by alice",
            waiting.id
        )),
        "{said}"
    );

    let events = stream_events(&ledger, &waiting.stream).await;
    let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(
        types,
        [
            "Received",
            "Claimed",
            "ExternalCallSent",
            "MarkedForReconciliation",
            "Reconciled"
        ]
    );
    let last = events.last().expect("an event");
    assert_eq!(last.position, head_before + 1, "one event appended");
    let payload: Value = serde_json::from_slice(&last.payload).expect("JSON");
    assert_eq!(
        payload,
        json!({
            "outcome": "succeeded",
            "external_id": "crm-77",
            "operator": "alice",
            "note": "found the coupon in the CRM",
        })
    );
    let metadata = EventMetadata::from_bytes(&last.metadata).expect("metadata");
    assert_eq!(
        metadata.causation,
        Causation::Operator {
            operator: "alice".to_owned()
        }
    );

    let row = ops_row(&ledger, &waiting.id);
    assert_eq!(row["status"], "reconciled");
    assert_eq!(row["external_id"], "crm-77");
    let queue = json_lines(&opledger(&ledger.url(), &["reconcile", "list", "--json"]));
    assert!(queue.is_empty(), "nothing waits any more: {queue:?}");
}

async fn resolving_an_operation_that_no_longer_waits_fails_and_appends_nothing(backend: Backend) {
    let Some((ledger, waiting, received)) = ledger_with_a_waiting_operation(backend).await else {
        return;
    };
    let decision = [
        "--outcome",
        "failed",
        "--operator",
        "alice",
        "--note",
        "the CRM has no coupon",
    ];
    let first = resolve(&ledger, &waiting.id, &decision);
    assert!(first.status.success(), "{}", stderr(&first));
    let head_before = head(&ledger).await;

    // A second decision, by someone else who did not see the first.
    let again = resolve(
        &ledger,
        &waiting.id,
        &[
            "--outcome",
            "succeeded",
            "--operator",
            "bob",
            "--note",
            "found it after all",
        ],
    );
    assert_one_line_error(
        &again,
        1,
        &format!(
            "operation {} is reconciled, not waiting for reconciliation; nothing was changed",
            waiting.id
        ),
    );
    // An operation that was never marked is refused the same way.
    let never = resolve(&ledger, &received.id, &decision);
    assert_one_line_error(
        &never,
        1,
        &format!("operation {} is received, not waiting", received.id),
    );
    assert_eq!(head(&ledger).await, head_before, "nothing was appended");
    let row = ops_row(&ledger, &waiting.id);
    assert_eq!(row["status"], "reconciled");
    assert_eq!(row["external_id"], Value::Null);
}

async fn resolving_as_retry_makes_the_operation_due_now_under_the_same_id(backend: Backend) {
    let Some((ledger, waiting, _)) = ledger_with_a_waiting_operation(backend).await else {
        return;
    };
    let before = SystemClock.now();
    let output = resolve(
        &ledger,
        &waiting.id,
        &[
            "--outcome",
            "retry",
            "--operator",
            "bob",
            "--note",
            "the service says it never saw the request",
        ],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let said = stdout(&output);
    assert!(
        said.starts_with(&format!(
            "operation {} reconciled: retry by bob",
            waiting.id
        )),
        "{said}"
    );
    assert!(said.contains("same operation id"), "{said}");

    let row = ops_row(&ledger, &waiting.id);
    assert_eq!(row["status"], "retry_scheduled");
    assert_eq!(row["operation_id"], waiting.id.as_str());
    let due_at: DateTime<Utc> =
        serde_json::from_value(row["due_at"].clone()).expect("due_at is set");
    assert!(
        due_at <= SystemClock.now() && due_at >= before - TimeDelta::seconds(5),
        "due now: {row}"
    );

    // The stream says the same: due now, and the next call goes out under the same id.
    let events = stream_events(&ledger, &waiting.stream).await;
    let last = events.last().expect("an event");
    assert_eq!(last.event_type, "Reconciled");
    let decoded: Vec<OperationEvent> = events
        .iter()
        .map(|e| {
            OperationEvent::from_stored(&e.event_type, e.schema_version, &e.payload).expect("event")
        })
        .collect();
    let state = Operation::replay(&decoded);
    assert_eq!(state.status, Status::RetryScheduled);
    assert_eq!(state.retry_at, None, "due now");
    let now = SystemClock.now();
    let claim = OperationCommand::Claim {
        worker: "worker-2".to_owned(),
        lease_until: now + TimeDelta::seconds(30),
    };
    let claimed = operation::decide(&state, &claim, now).expect("claimable now");
    let state = claimed.iter().fold(state, evolve);
    let sent = OperationCommand::RecordCallSent {
        worker: "worker-2".to_owned(),
    };
    match operation::decide(&state, &sent, now)
        .expect("the call may leave")
        .as_slice()
    {
        [OperationEvent::ExternalCallSent(sent)] => {
            assert_eq!(sent.idempotency_key, waiting.id, "the same idempotency key");
            assert_eq!(sent.attempt, 2);
        }
        other => panic!("expected ExternalCallSent, got {other:?}"),
    }
}

async fn an_unknown_operation_id_is_a_clear_error(backend: Backend) {
    let Some((ledger, _, _)) = ledger_with_a_waiting_operation(backend).await else {
        return;
    };
    let head_before = head(&ledger).await;
    let unknown = OperationId::new("coupon", "autumn:42").to_string();
    let output = resolve(
        &ledger,
        &unknown,
        &[
            "--outcome",
            "failed",
            "--operator",
            "alice",
            "--note",
            "n/a",
        ],
    );
    assert_one_line_error(
        &output,
        1,
        &format!("no operation has the id {unknown}: check it against `opledger reconcile list`"),
    );
    let garbage = resolve(
        &ledger,
        "not-an-id",
        &[
            "--outcome",
            "failed",
            "--operator",
            "alice",
            "--note",
            "n/a",
        ],
    );
    assert_one_line_error(&garbage, 1, "no operation has the id not-an-id");
    assert_eq!(head(&ledger).await, head_before, "nothing was appended");
}

async fn a_decision_without_operator_or_reason_is_refused(backend: Backend) {
    let Some((ledger, waiting, _)) = ledger_with_a_waiting_operation(backend).await else {
        return;
    };
    let head_before = head(&ledger).await;

    // Usage errors: clap refuses them with exit code 2.
    let no_operator = resolve(
        &ledger,
        &waiting.id,
        &["--outcome", "succeeded", "--note", "checked"],
    );
    let err = stderr(&no_operator);
    assert_eq!(no_operator.status.code(), Some(2), "{err}");
    assert!(err.contains("--operator"), "{err}");
    let no_note = resolve(
        &ledger,
        &waiting.id,
        &["--outcome", "succeeded", "--operator", "alice"],
    );
    assert_eq!(no_note.status.code(), Some(2), "{}", stderr(&no_note));
    assert!(stderr(&no_note).contains("--note"), "{}", stderr(&no_note));
    let bad_outcome = resolve(
        &ledger,
        &waiting.id,
        &["--outcome", "maybe", "--operator", "alice", "--note", "x"],
    );
    let err = stderr(&bad_outcome);
    assert_eq!(bad_outcome.status.code(), Some(2), "{err}");
    for outcome in ["succeeded", "failed", "retry"] {
        assert!(err.contains(outcome), "{err}");
    }

    // Given but empty, or contradictory: refused with a reason, exit code 1.
    let blank_operator = resolve(
        &ledger,
        &waiting.id,
        &[
            "--outcome",
            "failed",
            "--operator",
            " ",
            "--note",
            "checked",
        ],
    );
    assert_one_line_error(&blank_operator, 1, "the operator is empty");
    let blank_note = resolve(
        &ledger,
        &waiting.id,
        &["--outcome", "failed", "--operator", "alice", "--note", ""],
    );
    assert_one_line_error(&blank_note, 1, "the note is empty");
    let contradiction = resolve(
        &ledger,
        &waiting.id,
        &[
            "--outcome",
            "retry",
            "--external-id",
            "crm-1",
            "--operator",
            "alice",
            "--note",
            "checked",
        ],
    );
    assert_one_line_error(
        &contradiction,
        1,
        "an external id goes only with the outcome succeeded, not retry",
    );

    assert_eq!(head(&ledger).await, head_before, "nothing was appended");
    assert_eq!(
        ops_row(&ledger, &waiting.id)["status"],
        "needs_reconciliation"
    );
}

/// Racing decisions are decided on the stream and appended at the version they were decided on:
/// the first wins, every other one reloads, finds the operation resolved and changes nothing.
async fn of_operators_deciding_at_once_exactly_one_is_recorded(backend: Backend) {
    let Some((ledger, waiting, _)) = ledger_with_a_waiting_operation(backend).await else {
        return;
    };
    let store = ledger.open().await;
    let decisions = (0..8).map(|i| {
        let decision = Reconciled {
            outcome: if i % 2 == 0 {
                ReconcileOutcome::Succeeded
            } else {
                ReconcileOutcome::Failed
            },
            external_id: None,
            operator: format!("operator-{i}"),
            note: "checked".to_owned(),
        };
        reconcile::resolve(&store, &waiting.id, decision, SystemClock.now())
    });
    let results = futures_util::future::join_all(decisions).await;
    let winners: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    assert_eq!(winners[0].status, Status::Reconciled);
    for result in &results {
        match result {
            Ok(_) => {}
            Err(ReconcileError::NotWaiting { status, .. }) => {
                assert_eq!(*status, Status::Reconciled);
            }
            Err(other) => panic!("expected not waiting, got {other}"),
        }
    }
    let events = store
        .read_stream(&waiting.stream, 1, 100)
        .await
        .expect("read");
    let reconciled = events
        .iter()
        .filter(|e| e.event_type == "Reconciled")
        .count();
    assert_eq!(reconciled, 1, "one decision recorded");
    assert_eq!(
        events.last().expect("an event").position,
        winners[0].position
    );
    store.close().await;
}
