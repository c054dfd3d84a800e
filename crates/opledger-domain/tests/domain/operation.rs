//! Given/when/then tables for the Operation: every transition row and every rejection.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use opledger_domain::operation::{
    CommandKind, Failed, KeyConflictRecorded, MarkedForReconciliation, OperationCommand,
    OperationEvent, ReconcileOutcome, ReplyFailed, ReplyOutcomeUnknown, ReplyRetryScheduled,
    ReplySent, ReplyStatus, Status, TRANSITIONS, Transition, TransitionRejected, render_markdown,
};
use opledger_domain::{Operation, OperationId, Rejection};

use crate::fixtures::*;
use crate::harness::given;

/// What a case expects from `decide`.
enum Expect {
    Events(Vec<OperationEvent>),
    Reject(Rejection),
}

struct Case {
    name: String,
    given: Vec<OperationEvent>,
    command: OperationCommand,
    now: DateTime<Utc>,
    expect: Expect,
}

fn accept(
    name: impl Into<String>,
    given: Vec<OperationEvent>,
    command: OperationCommand,
    now: DateTime<Utc>,
    events: Vec<OperationEvent>,
) -> Case {
    Case {
        name: name.into(),
        given,
        command,
        now,
        expect: Expect::Events(events),
    }
}

fn reject(
    name: impl Into<String>,
    given: Vec<OperationEvent>,
    command: OperationCommand,
    now: DateTime<Utc>,
    rejection: Rejection,
) -> Case {
    Case {
        name: name.into(),
        given,
        command,
        now,
        expect: Expect::Reject(rejection),
    }
}

fn with(
    mut events: Vec<OperationEvent>,
    more: impl IntoIterator<Item = OperationEvent>,
) -> Vec<OperationEvent> {
    events.extend(more);
    events
}

fn claim(worker: &str, lease_until: i64) -> OperationCommand {
    OperationCommand::Claim {
        worker: worker.to_owned(),
        lease_until: t(lease_until),
    }
}

fn call(worker: &str) -> OperationCommand {
    OperationCommand::RecordCallSent {
        worker: worker.to_owned(),
    }
}

fn retry(at: i64, same_key: bool) -> OperationCommand {
    OperationCommand::ScheduleRetry {
        at: t(at),
        reason: "connection refused".to_owned(),
        same_key,
    }
}

fn accepted_cases() -> Vec<Case> {
    let mut cases = vec![accept(
        "a new request starts the operation",
        vec![],
        OperationCommand::Receive(received()),
        t(0),
        vec![received().into()],
    )];
    for &status in &Status::ALL[1..] {
        cases.push(accept(
            format!("a repeat with the same fingerprint joins a {status} operation"),
            history(status),
            OperationCommand::Receive(received()),
            t(5),
            vec![],
        ));
        cases.push(accept(
            format!("other parameters under the key of a {status} operation are recorded"),
            history(status),
            OperationCommand::Receive(received_other()),
            t(5),
            vec![
                KeyConflictRecorded {
                    update_id: UPDATE_ID + 1,
                    bot: BOT.to_owned(),
                    fingerprint: received_other().fingerprint,
                    existing_fingerprint: received().fingerprint,
                }
                .into(),
            ],
        ));
    }
    cases.extend([
        accept(
            "a received operation is claimed as attempt 1",
            history(Status::Received),
            claim(W1, 60),
            t(0),
            vec![claimed(W1, 60, 1)],
        ),
        accept(
            "a due retry is claimed as the next attempt",
            history(Status::RetryScheduled),
            claim(W2, 160),
            t(100),
            vec![claimed(W2, 160, 2)],
        ),
        accept(
            "a claim whose lease expired with nothing sent is taken over",
            history(Status::Claimed),
            claim(W2, 130),
            t(60),
            vec![claimed(W2, 130, 2)],
        ),
        accept(
            "an operation put back by reconciliation is claimed at once",
            with(
                history(Status::NeedsReconciliation),
                [reconciled(ReconcileOutcome::Retry).into()],
            ),
            claim(W2, 500),
            t(400),
            vec![claimed(W2, 500, 2)],
        ),
        accept(
            "the claim holder records the call before sending it",
            history(Status::Claimed),
            call(W1),
            t(10),
            vec![call_sent(W1, 1)],
        ),
        accept(
            "the service's answer confirms the operation",
            history(Status::CallSent),
            OperationCommand::Confirm(confirmed()),
            t(20),
            vec![confirmed().into()],
        ),
        accept(
            "a failure known before sending fails the operation",
            history(Status::Claimed),
            OperationCommand::Fail {
                reason: "card declined".to_owned(),
            },
            t(10),
            vec![failed("card declined", 1)],
        ),
        accept(
            "a refusal by the service fails the operation",
            history(Status::CallSent),
            OperationCommand::Fail {
                reason: "card declined".to_owned(),
            },
            t(20),
            vec![failed("card declined", 1)],
        ),
        accept(
            "a transient failure before sending schedules a retry",
            history(Status::Claimed),
            retry(40, false),
            t(10),
            vec![retry_scheduled(40, 1, false)],
        ),
        accept(
            "a transient failure on the last attempt gives up",
            vec![received_with(1).into(), claimed(W1, 60, 1)],
            retry(40, false),
            t(10),
            vec![failed("gave up after 1 attempts: connection refused", 1)],
        ),
        accept(
            "an unknown outcome with an honoured key schedules a retry",
            history(Status::CallSent),
            retry(40, true),
            t(20),
            vec![retry_scheduled(40, 1, true)],
        ),
        accept(
            "an unknown outcome on the last attempt gives up even with an honoured key",
            vec![
                received_with(1).into(),
                claimed(W1, 60, 1),
                call_sent(W1, 1),
            ],
            retry(40, true),
            t(20),
            vec![failed("gave up after 1 attempts: connection refused", 1)],
        ),
        accept(
            "an unknown outcome without a safe path goes to a person",
            history(Status::CallSent),
            OperationCommand::MarkForReconciliation {
                reason: "timeout after 10s, no lookup configured".to_owned(),
            },
            t(20),
            vec![marked(1)],
        ),
        accept(
            "a person confirms the operation happened",
            history(Status::NeedsReconciliation),
            OperationCommand::Reconcile(reconciled(ReconcileOutcome::Succeeded)),
            t(300),
            vec![reconciled(ReconcileOutcome::Succeeded).into()],
        ),
        accept(
            "a person decides the operation did not happen",
            history(Status::NeedsReconciliation),
            OperationCommand::Reconcile(reconciled(ReconcileOutcome::Failed)),
            t(300),
            vec![reconciled(ReconcileOutcome::Failed).into()],
        ),
        accept(
            "a person sends the operation back to be tried again",
            history(Status::NeedsReconciliation),
            OperationCommand::Reconcile(reconciled(ReconcileOutcome::Retry)),
            t(300),
            vec![reconciled(ReconcileOutcome::Retry).into()],
        ),
    ]);
    for status in [Status::Confirmed, Status::Failed, Status::Reconciled] {
        let in_flight = with(history(status), [reply_started(1)]);
        cases.extend([
            accept(
                format!("the reply of a {status} operation starts"),
                history(status),
                OperationCommand::StartReply,
                t(300),
                vec![reply_started(1)],
            ),
            accept(
                format!("a due reply retry of a {status} operation starts"),
                with(history(status), [reply_started(1), reply_retry(330)]),
                OperationCommand::StartReply,
                t(330),
                vec![reply_started(2)],
            ),
            accept(
                format!("the reply of a {status} operation is sent"),
                in_flight.clone(),
                OperationCommand::RecordReplySent {
                    message_id: Some(501),
                },
                t(301),
                vec![
                    ReplySent {
                        message_id: Some(501),
                    }
                    .into(),
                ],
            ),
            accept(
                format!("a reply of a {status} operation refused for now is retried later"),
                in_flight.clone(),
                OperationCommand::RecordReplyFailed {
                    reason: "429 too many requests, retry after 5".to_owned(),
                    retry_at: Some(t(330)),
                },
                t(301),
                vec![
                    ReplyRetryScheduled {
                        at: t(330),
                        reason: "429 too many requests, retry after 5".to_owned(),
                    }
                    .into(),
                ],
            ),
            accept(
                format!("a reply of a {status} operation refused for good is given up"),
                in_flight.clone(),
                OperationCommand::RecordReplyFailed {
                    reason: "403 bot was blocked by the user".to_owned(),
                    retry_at: None,
                },
                t(301),
                vec![
                    ReplyFailed {
                        reason: "403 bot was blocked by the user".to_owned(),
                    }
                    .into(),
                ],
            ),
            accept(
                format!("a reply of a {status} operation with no answer is unknown"),
                in_flight,
                OperationCommand::RecordReplyUnknown {
                    reason: "timeout after 10s".to_owned(),
                },
                t(311),
                vec![
                    ReplyOutcomeUnknown {
                        reason: "timeout after 10s".to_owned(),
                    }
                    .into(),
                ],
            ),
        ]);
    }
    cases
}

fn rejected_cases() -> Vec<Case> {
    let confirmed_with = |more: Vec<OperationEvent>| with(history(Status::Confirmed), more);
    let mut wrong_id = received();
    wrong_id.operation_id = OperationId::new(ACTION, "another key");
    let mut no_attempts = received();
    no_attempts.max_attempts = 0;
    let mut bad_action = received();
    bad_action.action = "Coupon-Code".to_owned();
    let mut no_operator = reconciled(ReconcileOutcome::Succeeded);
    no_operator.operator = String::new();
    let invalid = |reason| Rejection::InvalidCommand { reason };

    vec![
        reject(
            "nothing but a request can start an operation",
            vec![],
            claim(W1, 60),
            t(0),
            Rejection::NotAllowed {
                status: Status::New,
                command: CommandKind::Claim,
            },
        ),
        reject(
            "a confirmation without a sent call is refused",
            history(Status::Received),
            OperationCommand::Confirm(confirmed()),
            t(0),
            Rejection::NotAllowed {
                status: Status::Received,
                command: CommandKind::Confirm,
            },
        ),
        reject(
            "no reply before the outcome",
            history(Status::Claimed),
            OperationCommand::StartReply,
            t(0),
            Rejection::NotAllowed {
                status: Status::Claimed,
                command: CommandKind::StartReply,
            },
        ),
        reject(
            "a lease must end after now",
            history(Status::Received),
            claim(W1, 0),
            t(0),
            invalid("lease_until must be after now"),
        ),
        reject(
            "a claim needs a worker",
            history(Status::Received),
            claim("", 60),
            t(0),
            invalid("worker must not be empty"),
        ),
        reject(
            "the operation id must be derived from action and key",
            vec![],
            OperationCommand::Receive(wrong_id),
            t(0),
            invalid("operation_id must be the id of the action and business key"),
        ),
        reject(
            "an operation needs at least one attempt",
            vec![],
            OperationCommand::Receive(no_attempts),
            t(0),
            invalid("max_attempts must be at least 1"),
        ),
        reject(
            "an action name must fit in a stream id",
            vec![],
            OperationCommand::Receive(bad_action),
            t(0),
            invalid("action must be 1 to 64 characters from a-z, 0-9 and _"),
        ),
        reject(
            "a reconciliation names its operator",
            history(Status::NeedsReconciliation),
            OperationCommand::Reconcile(no_operator),
            t(300),
            invalid("operator must not be empty"),
        ),
        reject(
            "a second live claim is impossible",
            history(Status::Claimed),
            claim(W2, 120),
            t(59),
            Rejection::AlreadyClaimed {
                worker: W1.to_owned(),
                lease_until: t(60),
            },
        ),
        reject(
            "the holder cannot stack a second claim either",
            history(Status::Claimed),
            claim(W1, 120),
            t(30),
            Rejection::AlreadyClaimed {
                worker: W1.to_owned(),
                lease_until: t(60),
            },
        ),
        reject(
            "a retry is not claimed before it is due",
            history(Status::RetryScheduled),
            claim(W2, 160),
            t(99),
            Rejection::NotDue { at: t(100) },
        ),
        reject(
            "a sent call is never re-claimed, even after its lease",
            history(Status::CallSent),
            claim(W2, 2_000),
            t(1_000),
            Rejection::CallOutcomeUnknown,
        ),
        reject(
            "a sent call is never sent again",
            history(Status::CallSent),
            call(W1),
            t(10),
            Rejection::CallOutcomeUnknown,
        ),
        reject(
            "a confirmed operation is not claimed again",
            history(Status::Confirmed),
            claim(W2, 200),
            t(100),
            Rejection::Terminal {
                status: Status::Confirmed,
            },
        ),
        reject(
            "no call after a failure",
            history(Status::Failed),
            call(W1),
            t(10),
            Rejection::Terminal {
                status: Status::Failed,
            },
        ),
        reject(
            "no second terminal event",
            history(Status::Reconciled),
            OperationCommand::Confirm(confirmed()),
            t(400),
            Rejection::Terminal {
                status: Status::Reconciled,
            },
        ),
        reject(
            "an operation waiting for a person is not claimed",
            history(Status::NeedsReconciliation),
            claim(W2, 200),
            t(100),
            Rejection::NeedsReconciliation,
        ),
        reject(
            "an operation waiting for a person is not retried",
            history(Status::NeedsReconciliation),
            retry(200, true),
            t(100),
            Rejection::NeedsReconciliation,
        ),
        reject(
            "only the claim holder sends",
            history(Status::Claimed),
            call(W2),
            t(10),
            Rejection::NotClaimHolder {
                holder: W1.to_owned(),
                worker: W2.to_owned(),
            },
        ),
        reject(
            "nothing is sent under an expired lease",
            history(Status::Claimed),
            call(W1),
            t(60),
            Rejection::LeaseExpired { lease_until: t(60) },
        ),
        reject(
            "no blind retry after a sent call",
            history(Status::CallSent),
            retry(40, false),
            t(20),
            Rejection::BlindRetryForbidden,
        ),
        reject(
            "one reply in flight at a time",
            confirmed_with(vec![reply_started(1)]),
            OperationCommand::StartReply,
            t(305),
            Rejection::ReplyInFlight { attempt: 1 },
        ),
        reject(
            "a reply retry waits for its time",
            confirmed_with(vec![reply_started(1), reply_retry(330)]),
            OperationCommand::StartReply,
            t(329),
            Rejection::ReplyNotDue { at: t(330) },
        ),
        reject(
            "a sent reply is not sent again",
            confirmed_with(vec![
                reply_started(1),
                ReplySent { message_id: None }.into(),
            ]),
            OperationCommand::StartReply,
            t(400),
            Rejection::ReplyAlreadySent,
        ),
        reject(
            "a given-up reply stays given up",
            confirmed_with(vec![
                reply_started(1),
                ReplyFailed {
                    reason: "403".to_owned(),
                }
                .into(),
            ]),
            OperationCommand::StartReply,
            t(400),
            Rejection::ReplyGaveUp,
        ),
        reject(
            "a reply with an unknown outcome is never resent",
            confirmed_with(vec![
                reply_started(1),
                ReplyOutcomeUnknown {
                    reason: "timeout".to_owned(),
                }
                .into(),
            ]),
            OperationCommand::StartReply,
            t(4_000),
            Rejection::ReplyOutcomeUnknown,
        ),
        reject(
            "no reply outcome without a reply in flight",
            history(Status::Confirmed),
            OperationCommand::RecordReplySent {
                message_id: Some(1),
            },
            t(300),
            Rejection::ReplyNotInFlight {
                reply: ReplyStatus::NotStarted,
            },
        ),
        reject(
            "an unknown reply cannot be turned into a retry",
            confirmed_with(vec![
                reply_started(1),
                ReplyOutcomeUnknown {
                    reason: "timeout".to_owned(),
                }
                .into(),
            ]),
            OperationCommand::RecordReplyFailed {
                reason: "429".to_owned(),
                retry_at: Some(t(500)),
            },
            t(400),
            Rejection::ReplyNotInFlight {
                reply: ReplyStatus::Unknown,
            },
        ),
    ]
}

/// The variant's name; the exhaustive match makes a new variant fail to compile here.
fn variant(rejection: &Rejection) -> &'static str {
    match rejection {
        Rejection::NotAllowed { .. } => "NotAllowed",
        Rejection::InvalidCommand { .. } => "InvalidCommand",
        Rejection::AlreadyClaimed { .. } => "AlreadyClaimed",
        Rejection::NotDue { .. } => "NotDue",
        Rejection::CallOutcomeUnknown => "CallOutcomeUnknown",
        Rejection::Terminal { .. } => "Terminal",
        Rejection::NeedsReconciliation => "NeedsReconciliation",
        Rejection::NotClaimHolder { .. } => "NotClaimHolder",
        Rejection::LeaseExpired { .. } => "LeaseExpired",
        Rejection::BlindRetryForbidden => "BlindRetryForbidden",
        Rejection::ReplyInFlight { .. } => "ReplyInFlight",
        Rejection::ReplyNotDue { .. } => "ReplyNotDue",
        Rejection::ReplyAlreadySent => "ReplyAlreadySent",
        Rejection::ReplyGaveUp => "ReplyGaveUp",
        Rejection::ReplyOutcomeUnknown => "ReplyOutcomeUnknown",
        Rejection::ReplyNotInFlight { .. } => "ReplyNotInFlight",
    }
}

const ALL_REJECTIONS: &[&str] = &[
    "NotAllowed",
    "InvalidCommand",
    "AlreadyClaimed",
    "NotDue",
    "CallOutcomeUnknown",
    "Terminal",
    "NeedsReconciliation",
    "NotClaimHolder",
    "LeaseExpired",
    "BlindRetryForbidden",
    "ReplyInFlight",
    "ReplyNotDue",
    "ReplyAlreadySent",
    "ReplyGaveUp",
    "ReplyOutcomeUnknown",
    "ReplyNotInFlight",
];

#[test]
fn every_transition_row_is_exercised() {
    let mut hit: BTreeSet<usize> = BTreeSet::new();
    for case in accepted_cases() {
        let Expect::Events(expected) = case.expect else {
            unreachable!("accepted cases expect events")
        };
        let from = Operation::replay(&case.given).status;
        let kind = case.command.kind();
        let event = expected.first().map(OperationEvent::kind);
        let after = given::<Operation>(case.given)
            .when(case.command, case.now)
            .then(expected);
        let row = TRANSITIONS
            .iter()
            .position(|t| {
                t.from == from && t.command == kind && t.event == event && t.to == after.status
            })
            .unwrap_or_else(|| {
                panic!(
                    "{}: no row for {from} {kind} {event:?} {}",
                    case.name, after.status
                )
            });
        hit.insert(row);
    }
    let missed: Vec<_> = (0..TRANSITIONS.len())
        .filter(|i| !hit.contains(i))
        .map(|i| TRANSITIONS[i])
        .collect();
    assert!(missed.is_empty(), "rows never exercised: {missed:#?}");
}

#[test]
fn every_rejection_variant_is_exercised() {
    let mut seen = BTreeSet::new();
    for case in rejected_cases() {
        let Expect::Reject(expected) = case.expect else {
            unreachable!("rejected cases expect a rejection")
        };
        seen.insert(variant(&expected));
        let message = expected.to_string();
        assert!(
            message.starts_with(|c: char| c.is_lowercase()) && !message.ends_with('.'),
            "{}: message style: {message}",
            case.name
        );
        given::<Operation>(case.given)
            .when(case.command, case.now)
            .then_reject(expected);
    }
    let all: BTreeSet<_> = ALL_REJECTIONS.iter().copied().collect();
    assert_eq!(seen, all);
}

#[test]
fn every_pair_outside_the_table_is_rejected() {
    for &status in Status::ALL {
        for &kind in CommandKind::ALL {
            if Transition::is_allowed(status, kind) {
                continue;
            }
            let (state, result) = given::<Operation>(history(status))
                .when(sample_command(kind), t(50))
                .result();
            assert_eq!(state.status, status);
            assert!(
                result.is_err(),
                "{kind} in {status} was accepted: {result:?}"
            );
        }
    }
}

#[test]
fn the_table_keeps_its_promises() {
    let mut seen = BTreeSet::new();
    for row in TRANSITIONS {
        assert!(
            seen.insert((row.from, row.command, row.event, row.to)),
            "duplicate row {row:?}"
        );
        assert!(!row.when.is_empty());
        if row.from.is_terminal() {
            assert!(row.to.is_terminal(), "a terminal status is left: {row:?}");
            assert!(
                !matches!(
                    row.event,
                    Some(
                        opledger_domain::operation::OperationEventKind::ExternalCallSent
                            | opledger_domain::operation::OperationEventKind::Claimed
                    )
                ),
                "a side effect after a terminal status: {row:?}"
            );
        }
        if row.from == Status::New {
            assert_eq!(row.command, CommandKind::Receive);
        }
        if row.event.is_none() {
            assert_eq!(row.from, row.to);
        }
    }
}

#[test]
fn the_documented_table_is_the_table() {
    assert_eq!(
        render_markdown(),
        include_str!("../../src/operation/transitions.md"),
        "regenerate src/operation/transitions.md from operation::render_markdown()"
    );
}

#[test]
fn a_rejection_is_recorded_without_changing_the_status() {
    let state = Operation::replay(&history(Status::Confirmed));
    let command = claim(W2, 200);
    let rejection = opledger_domain::operation::decide(&state, &command, t(100))
        .expect_err("terminal operations are not claimed");
    let event = rejection.to_event(&state, &command);
    assert_eq!(
        event,
        TransitionRejected {
            command: "claim".to_owned(),
            status: "confirmed".to_owned(),
            reason: "the operation is confirmed, which is final: answer with its result".to_owned(),
        }
        .into()
    );
    let after = opledger_domain::operation::evolve(state.clone(), &event);
    assert_eq!(after.status, state.status);
    assert_eq!(after.version, state.version + 1);
}

#[test]
fn an_idempotent_join_appends_nothing_and_changes_nothing() {
    let state = Operation::replay(&history(Status::CallSent));
    let events = given::<Operation>(history(Status::CallSent))
        .when(OperationCommand::Receive(received()), t(30))
        .then(vec![]);
    assert_eq!(events, state);
}

#[test]
fn the_call_carries_the_operation_id_as_idempotency_key() {
    let events = opledger_domain::operation::decide(
        &Operation::replay(&history(Status::Claimed)),
        &call(W1),
        t(1),
    )
    .expect("holder with a live lease");
    let [OperationEvent::ExternalCallSent(sent)] = events.as_slice() else {
        panic!("one ExternalCallSent, got {events:?}")
    };
    assert_eq!(sent.idempotency_key, operation_id().to_string());
}

#[test]
fn attempts_count_across_retries_and_give_up_at_the_limit() {
    let mut events: Vec<OperationEvent> = vec![received_with(2).into()];
    let mut state = Operation::replay(&events);
    let steps = [
        (claim(W1, 30), 0),
        (retry(60, false), 10),
        (claim(W2, 120), 60),
        (retry(200, false), 70),
    ];
    for (command, now) in steps {
        let produced = opledger_domain::operation::decide(&state, &command, t(now))
            .unwrap_or_else(|r| panic!("{command:?} at {now}: {r}"));
        for event in &produced {
            state = opledger_domain::operation::evolve(state, event);
        }
        events.extend(produced);
    }
    assert_eq!(state.status, Status::Failed);
    assert_eq!(state.claims, 2);
    assert_eq!(
        events.last(),
        Some(&OperationEvent::Failed(Failed {
            reason: "gave up after 2 attempts: connection refused".to_owned(),
            attempts: 2,
        }))
    );
    assert!(!events.iter().any(|e| matches!(
        e,
        OperationEvent::MarkedForReconciliation(MarkedForReconciliation { .. })
    )));
}
