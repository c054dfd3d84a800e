//! Fixed times, ids and events shared by the tests: nothing here reads a clock or a random source.

use std::collections::BTreeMap;

use chrono::{DateTime, TimeDelta, Utc};
use opledger_domain::callback_token::{
    CallbackTokenEvent, TokenCancelled, TokenConsumed, TokenIssued, TokenRejected, TokenRejection,
};
use opledger_domain::delivery::{
    AnswerCallFailed, AnswerCallSent, AnswerCallStarted, DeliveryCommand, DeliveryEvent,
    DuplicateDeliveryObserved, ForwardFailed, ForwardGivenUp, ForwardStarted, RawUpdateStored,
    UpdateForwarded, UpdateIdCollision, UpdateReceived,
};
use opledger_domain::operation::{
    Claimed, CommandKind, Confirmed, ConfirmedVia, ExternalCallSent, Failed, KeyConflictRecorded,
    MarkedForReconciliation, OperationCommand, OperationEvent, Received, ReconcileOutcome,
    Reconciled, ReplyFailed, ReplyOutcomeUnknown, ReplyRetryScheduled, ReplySent, ReplyStarted,
    RetryScheduled, Status, TransitionRejected,
};
use opledger_domain::quarantine::{BodyQuarantined, QuarantineEvent};
use opledger_domain::repeat_guard::{CommandSeen, RepeatGuardEvent};
use opledger_domain::{OperationId, OperationLink, fingerprint, operation_stream};

pub(crate) const BOT: &str = "shop";
pub(crate) const ACTION: &str = "coupon";
pub(crate) const KEY: &str = "spring:42:welcome";
pub(crate) const W1: &str = "worker-1";
pub(crate) const W2: &str = "worker-2";
pub(crate) const UPDATE_ID: i64 = 9_007_199_254_740_000;
pub(crate) const USER: i64 = 42;
pub(crate) const CHAT: i64 = -1_001_234_567_890;
pub(crate) const TOKEN: &str = "t1_000102030405060708090a0b0c0d0e0f";

/// 2026-03-01T12:00:00Z plus `seconds`.
pub(crate) fn t(seconds: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_772_366_400 + seconds, 0).expect("in range")
}

pub(crate) fn params() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("campaign".to_owned(), "spring".to_owned()),
        ("user_id".to_owned(), "42".to_owned()),
    ])
}

pub(crate) fn operation_id() -> OperationId {
    OperationId::new(ACTION, KEY)
}

/// The first request, allowing `max_attempts` claims.
pub(crate) fn received_with(max_attempts: u32) -> Received {
    Received {
        operation_id: operation_id(),
        action: ACTION.to_owned(),
        business_key: KEY.to_owned(),
        fingerprint: fingerprint(ACTION, &params()),
        params: params(),
        bot: BOT.to_owned(),
        chat_id: Some(CHAT),
        user_id: Some(USER),
        update_id: UPDATE_ID,
        message_date: Some(t(-2)),
        max_attempts,
    }
}

pub(crate) fn received() -> Received {
    received_with(3)
}

/// The same business key asked for with other parameters.
pub(crate) fn received_other() -> Received {
    let mut other = received();
    other
        .params
        .insert("campaign".to_owned(), "autumn".to_owned());
    other.fingerprint = fingerprint(ACTION, &other.params);
    other.update_id = UPDATE_ID + 1;
    other
}

pub(crate) fn claimed(worker: &str, lease_until: i64, attempt: u32) -> OperationEvent {
    Claimed {
        worker: worker.to_owned(),
        lease_until: t(lease_until),
        attempt,
    }
    .into()
}

pub(crate) fn call_sent(worker: &str, attempt: u32) -> OperationEvent {
    ExternalCallSent {
        worker: worker.to_owned(),
        attempt,
        idempotency_key: operation_id().to_string(),
    }
    .into()
}

pub(crate) fn confirmed() -> Confirmed {
    Confirmed {
        external_id: Some("CPN-7781".to_owned()),
        result: BTreeMap::from([
            ("code".to_owned(), serde_json::json!("SPRING-7781")),
            ("amount".to_owned(), serde_json::json!(15)),
        ]),
        response_digest: Some(
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08".to_owned(),
        ),
        via: ConfirmedVia::Response,
    }
}

pub(crate) fn failed(reason: &str, attempts: u32) -> OperationEvent {
    Failed {
        reason: reason.to_owned(),
        attempts,
    }
    .into()
}

pub(crate) fn retry_scheduled(at: i64, attempt: u32, same_key: bool) -> OperationEvent {
    RetryScheduled {
        at: t(at),
        attempt,
        reason: "connection refused".to_owned(),
        same_key,
    }
    .into()
}

pub(crate) fn marked(attempt: u32) -> OperationEvent {
    MarkedForReconciliation {
        reason: "timeout after 10s, no lookup configured".to_owned(),
        attempt,
    }
    .into()
}

pub(crate) fn reconciled(outcome: ReconcileOutcome) -> Reconciled {
    Reconciled {
        outcome,
        external_id: Some("CPN-7781".to_owned()),
        operator: "alice".to_owned(),
        note: "found in the CRM".to_owned(),
    }
}

pub(crate) fn reply_started(attempt: u32) -> OperationEvent {
    ReplyStarted { attempt }.into()
}

pub(crate) fn reply_retry(at: i64) -> OperationEvent {
    ReplyRetryScheduled {
        at: t(at),
        reason: "429 too many requests, retry after 5".to_owned(),
    }
    .into()
}

/// A history that leaves an operation in `status`: lease 60 s from t(0), retry due at t(100).
pub(crate) fn history(status: Status) -> Vec<OperationEvent> {
    let mut events: Vec<OperationEvent> = Vec::new();
    if status == Status::New {
        return events;
    }
    events.push(received().into());
    match status {
        Status::New | Status::Received => {}
        Status::Claimed => events.push(claimed(W1, 60, 1)),
        Status::CallSent => events.extend([claimed(W1, 60, 1), call_sent(W1, 1)]),
        Status::RetryScheduled => {
            events.extend([claimed(W1, 60, 1), retry_scheduled(100, 1, false)])
        }
        Status::NeedsReconciliation => {
            events.extend([claimed(W1, 60, 1), call_sent(W1, 1), marked(1)]);
        }
        Status::Confirmed => {
            events.extend([claimed(W1, 60, 1), call_sent(W1, 1), confirmed().into()]);
        }
        Status::Failed => events.extend([claimed(W1, 60, 1), failed("card declined", 1)]),
        Status::Reconciled => events.extend([
            claimed(W1, 60, 1),
            call_sent(W1, 1),
            marked(1),
            reconciled(ReconcileOutcome::Succeeded).into(),
        ]),
    }
    events
}

/// A plausible command of each kind, for the exhaustive table check.
pub(crate) fn sample_command(kind: CommandKind) -> OperationCommand {
    match kind {
        CommandKind::Receive => OperationCommand::Receive(received()),
        CommandKind::Claim => OperationCommand::Claim {
            worker: W2.to_owned(),
            lease_until: t(1_000),
        },
        CommandKind::RecordCallSent => OperationCommand::RecordCallSent {
            worker: W1.to_owned(),
        },
        CommandKind::Confirm => OperationCommand::Confirm(confirmed()),
        CommandKind::Fail => OperationCommand::Fail {
            reason: "card declined".to_owned(),
        },
        CommandKind::ScheduleRetry => OperationCommand::ScheduleRetry {
            at: t(200),
            reason: "connection refused".to_owned(),
            same_key: true,
        },
        CommandKind::MarkForReconciliation => OperationCommand::MarkForReconciliation {
            reason: "timeout".to_owned(),
        },
        CommandKind::Reconcile => {
            OperationCommand::Reconcile(reconciled(ReconcileOutcome::Succeeded))
        }
        CommandKind::StartReply => OperationCommand::StartReply,
        CommandKind::RecordReplySent => OperationCommand::RecordReplySent {
            message_id: Some(501),
        },
        CommandKind::RecordReplyFailed => OperationCommand::RecordReplyFailed {
            reason: "chat not found".to_owned(),
            retry_at: None,
        },
        CommandKind::RecordReplyUnknown => OperationCommand::RecordReplyUnknown {
            reason: "timeout".to_owned(),
        },
    }
}

/// One event of every Operation type, with fixed values.
pub(crate) fn every_operation_event() -> Vec<OperationEvent> {
    vec![
        received().into(),
        claimed(W1, 60, 1),
        call_sent(W1, 1),
        confirmed().into(),
        failed("gave up after 3 attempts: connection refused", 3),
        retry_scheduled(100, 1, true),
        marked(1),
        reconciled(ReconcileOutcome::Retry).into(),
        KeyConflictRecorded {
            update_id: UPDATE_ID + 1,
            bot: BOT.to_owned(),
            fingerprint: received_other().fingerprint,
            existing_fingerprint: received().fingerprint,
        }
        .into(),
        TransitionRejected {
            command: "claim".to_owned(),
            status: "confirmed".to_owned(),
            reason: "the operation is confirmed, which is final: answer with its result".to_owned(),
        }
        .into(),
        reply_started(1),
        ReplySent {
            message_id: Some(501),
        }
        .into(),
        reply_retry(130),
        ReplyFailed {
            reason: "403 bot was blocked by the user".to_owned(),
        }
        .into(),
        ReplyOutcomeUnknown {
            reason: "timeout after 10s".to_owned(),
        }
        .into(),
    ]
}

pub(crate) fn link(joined: bool) -> OperationLink {
    OperationLink {
        action: ACTION.to_owned(),
        operation_id: operation_id(),
        stream: operation_stream(ACTION, KEY).expect("valid"),
        joined,
    }
}

pub(crate) const DIGEST_A: &str =
    "3a1b5e2f9c0d4e6a8b7c9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c";
pub(crate) const DIGEST_B: &str =
    "b4c5d6e7f8091a2b3c4d5e6f708192a3b4c3a1b5e2f9c0d4e6a8b7c9d0e1f2a3";

/// An arrival of the update with body digest `digest`, received at `at`.
pub(crate) fn record(digest: &str, at: i64) -> DeliveryCommand {
    DeliveryCommand::RecordUpdate {
        bot: BOT.to_owned(),
        update_id: UPDATE_ID,
        kind: "message".to_owned(),
        digest: digest.to_owned(),
        size: 412,
        chat_id: Some(CHAT),
        user_id: Some(USER),
        message_date: Some(t(at - 1)),
        received_at: t(at),
        operation: Some(link(false)),
        retention: TimeDelta::days(7),
        raw_body: None,
        forward: false,
    }
}

/// The `UpdateReceived` that `record(digest, at)` produces in `epoch`.
pub(crate) fn update_received(digest: &str, at: i64, epoch: u32) -> DeliveryEvent {
    UpdateReceived {
        bot: BOT.to_owned(),
        update_id: UPDATE_ID,
        epoch,
        kind: "message".to_owned(),
        digest: digest.to_owned(),
        size: 412,
        chat_id: Some(CHAT),
        user_id: Some(USER),
        message_date: Some(t(at - 1)),
        received_at: t(at),
        operation: Some(link(false)),
        forward: false,
    }
    .into()
}

/// One event of every Delivery type, with fixed values.
pub(crate) fn every_delivery_event() -> Vec<DeliveryEvent> {
    vec![
        update_received(DIGEST_A, 0, 1),
        DuplicateDeliveryObserved {
            epoch: 1,
            digest: DIGEST_A.to_owned(),
            received_at: t(30),
        }
        .into(),
        UpdateIdCollision {
            epoch: 1,
            first_digest: DIGEST_A.to_owned(),
            new_digest: DIGEST_B.to_owned(),
            received_at: t(45),
        }
        .into(),
        RawUpdateStored {
            epoch: 1,
            body: r#"{"update_id":1,"message":{"text":"/coupon spring"}}"#.to_owned(),
        }
        .into(),
        ForwardStarted {
            epoch: 1,
            attempt: 2,
            forwarder: W1.to_owned(),
            lease_until: t(75),
        }
        .into(),
        UpdateForwarded {
            epoch: 1,
            attempt: 2,
            status: 200,
            elapsed_ms: 12,
        }
        .into(),
        ForwardFailed {
            epoch: 1,
            attempt: 1,
            status: Some(503),
            error: "the bot answered 503 Service Unavailable".to_owned(),
            retry_at: t(62),
        }
        .into(),
        ForwardGivenUp {
            epoch: 1,
            attempts: 9,
            reason: "the bot did not acknowledge it within 24.00 h of its receipt (9 attempts)"
                .to_owned(),
        }
        .into(),
        AnswerCallStarted {
            epoch: 1,
            method: "sendMessage".to_owned(),
            digest: DIGEST_B.to_owned(),
            lease_until: t(130),
        }
        .into(),
        AnswerCallSent {
            epoch: 1,
            method: "sendMessage".to_owned(),
            message_id: Some(77),
        }
        .into(),
        AnswerCallFailed {
            epoch: 1,
            method: "sendMessage".to_owned(),
            error: "no answer from the bot api to the bot's answer call in time".to_owned(),
            known: false,
        }
        .into(),
    ]
}

/// One event of every RepeatGuard type, with fixed values.
pub(crate) fn every_repeat_guard_event() -> Vec<RepeatGuardEvent> {
    vec![
        CommandSeen {
            update_id: 9_007_199_254_740_993,
            message_date: t(5),
            epoch: 2,
        }
        .into(),
    ]
}

/// One event of every quarantine type, with fixed values.
pub(crate) fn every_quarantine_event() -> Vec<QuarantineEvent> {
    vec![
        BodyQuarantined {
            reason: "no_update_id".to_owned(),
            digest: DIGEST_A.to_owned(),
            size: 17,
            received_at: t(1),
        }
        .into(),
    ]
}

/// The token issued for [`USER`], expiring at t(600).
pub(crate) fn token_issued() -> TokenIssued {
    TokenIssued {
        token: TOKEN.to_owned(),
        action: ACTION.to_owned(),
        operation_id: Some(operation_id()),
        user_id: USER,
        chat_id: Some(CHAT),
        expires_at: t(600),
        payload: BTreeMap::from([("choice".to_owned(), "accept".to_owned())]),
    }
}

/// One event of every CallbackToken type, with fixed values.
pub(crate) fn every_token_event() -> Vec<CallbackTokenEvent> {
    vec![
        token_issued().into(),
        TokenConsumed {
            user_id: USER,
            update_id: UPDATE_ID + 5,
        }
        .into(),
        TokenRejected {
            reason: TokenRejection::AlreadyConsumed,
            user_id: USER,
            update_id: UPDATE_ID + 6,
        }
        .into(),
        TokenCancelled {
            user_id: USER,
            update_id: UPDATE_ID + 7,
        }
        .into(),
    ]
}
