//! The Operation's events: one struct per event, each its own payload.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::event::domain_events;
use crate::ids::OperationId;

domain_events! {
    /// Everything that can happen to an operation, in the order it happened.
    pub enum OperationEvent / OperationEventKind {
        /// A request for the action arrived; always the first event of the stream.
        Received,
        /// A worker took the operation for a lease.
        Claimed,
        /// The external request is about to leave; its outcome is unknown until told otherwise.
        ExternalCallSent,
        /// The external service did it (terminal).
        Confirmed,
        /// The operation will not happen (terminal).
        Failed,
        /// The operation will be tried again at a time.
        RetryScheduled,
        /// The outcome is unknown and cannot be resolved automatically: a person must look.
        MarkedForReconciliation,
        /// A person resolved the case (terminal unless the outcome is retry).
        Reconciled,
        /// The same business key was asked for with different parameters.
        KeyConflictRecorded,
        /// A stale or late command was refused and recorded for audit.
        TransitionRejected,
        /// The reply to the user is about to be sent.
        ReplyStarted,
        /// Telegram accepted the reply.
        ReplySent,
        /// Telegram said the reply was definitely not delivered; it will be tried again.
        ReplyRetryScheduled,
        /// The reply will not be sent.
        ReplyFailed,
        /// Nobody knows whether the reply arrived; it is never resent automatically.
        ReplyOutcomeUnknown,
    }
}

/// A request for a business action arrived and became an operation.
///
/// It holds everything the worker needs to act and to reply, so that nothing has to be read
/// from the original update again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Received {
    /// The operation's id, also its idempotency key.
    pub operation_id: OperationId,
    /// The configured action's name.
    pub action: String,
    /// The business key the action's template produced.
    pub business_key: String,
    /// Hex SHA-256 of the decision-relevant parameters (see [`fingerprint`](super::fingerprint)).
    pub fingerprint: String,
    /// The action's parameters.
    pub params: BTreeMap<String, String>,
    /// The bot that received the request.
    pub bot: String,
    /// The chat to reply to, when there is one.
    pub chat_id: Option<i64>,
    /// The user who asked, when known.
    pub user_id: Option<i64>,
    /// The update that asked first.
    pub update_id: i64,
    /// The message's own `date`, when the update had a message.
    pub message_date: Option<DateTime<Utc>>,
    /// How many claims the operation may use before a transient failure becomes final.
    pub max_attempts: u32,
}

/// A worker took the operation until its lease ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claimed {
    /// The worker's id.
    pub worker: String,
    /// When the claim lapses if the worker says nothing more.
    pub lease_until: DateTime<Utc>,
    /// The number of this claim, 1 for the first.
    pub attempt: u32,
}

/// The external request is about to leave, recorded before it does.
///
/// From here the outcome is unknown until a response, a lookup or a person says otherwise, and
/// the operation can never be claimed again blindly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExternalCallSent {
    /// The worker sending the request.
    pub worker: String,
    /// The claim under which it is sent.
    pub attempt: u32,
    /// The `Idempotency-Key` header value: the operation id.
    pub idempotency_key: String,
}

/// How a confirmation was learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConfirmedVia {
    /// The service's answer to the request.
    Response,
    /// The service's lookup endpoint, after an unknown outcome.
    Lookup,
}

/// The external service did it. Terminal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confirmed {
    /// The service's id for what it did, when it gave one.
    pub external_id: Option<String>,
    /// The fields of the answer that the reply or later steps need.
    pub result: BTreeMap<String, serde_json::Value>,
    /// Hex SHA-256 of the raw response body, when there was one.
    pub response_digest: Option<String>,
    /// How the confirmation was learned.
    pub via: ConfirmedVia,
}

/// The operation will not happen. Terminal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failed {
    /// Why, in words an operator can act on.
    pub reason: String,
    /// How many claims were used.
    pub attempts: u32,
}

/// The operation will be claimed again from a time on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryScheduled {
    /// When it becomes due.
    pub at: DateTime<Utc>,
    /// The claim that failed and is being retried.
    pub attempt: u32,
    /// Why the attempt failed.
    pub reason: String,
    /// Whether the retry reuses the same idempotency key after a request left (always the
    /// operation id; true when the service honours it or a lookup said nothing happened).
    pub same_key: bool,
}

/// The call's outcome is unknown and no safe automatic path exists: a person must decide.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarkedForReconciliation {
    /// Why the outcome is unknown.
    pub reason: String,
    /// The claim under which the call was sent.
    pub attempt: u32,
}

/// What a person decided about an operation in reconciliation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReconcileOutcome {
    /// It happened. Terminal.
    Succeeded,
    /// It did not happen and will not. Terminal.
    Failed,
    /// It did not happen; try again now with the same operation id.
    Retry,
}

/// A person resolved an operation in reconciliation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reconciled {
    /// The decision.
    pub outcome: ReconcileOutcome,
    /// The service's id, when the person found one.
    pub external_id: Option<String>,
    /// Who decided.
    pub operator: String,
    /// Why, for the audit trail.
    pub note: String,
}

/// The same business key was asked for with different parameters; the first request stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyConflictRecorded {
    /// The update that asked with different parameters.
    pub update_id: i64,
    /// The bot that received it.
    pub bot: String,
    /// The fingerprint of the refused request.
    pub fingerprint: String,
    /// The fingerprint the operation was received with.
    pub existing_fingerprint: String,
}

/// A command was refused, recorded so that a late worker or update leaves a trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransitionRejected {
    /// The refused command's kind (`CommandKind::as_str`).
    pub command: String,
    /// The operation's status when it was refused (`Status::as_str`).
    pub status: String,
    /// The rejection's message.
    pub reason: String,
}

/// The reply to the user is about to be sent, recorded before `sendMessage`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyStarted {
    /// The number of this reply attempt, 1 for the first.
    pub attempt: u32,
}

/// Telegram accepted the reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplySent {
    /// Telegram's id of the sent message, when it gave one.
    pub message_id: Option<i64>,
}

/// Telegram said the reply was definitely not delivered (e.g. 429); try again at a time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyRetryScheduled {
    /// When the reply may be started again.
    pub at: DateTime<Utc>,
    /// What Telegram said.
    pub reason: String,
}

/// The reply will not be sent; `/status` still shows the operation's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyFailed {
    /// Why.
    pub reason: String,
}

/// The reply may or may not have arrived (timeout, connection lost); it is never resent blindly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyOutcomeUnknown {
    /// What went wrong.
    pub reason: String,
}
