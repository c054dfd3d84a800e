//! The commands an Operation decides on, and the fingerprint of a request's parameters.

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use super::event::{Confirmed, Received, Reconciled};

/// What intake, workers and operators ask of an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperationCommand {
    /// A request for the action arrived (a new operation, or a join of an existing one).
    Receive(Received),
    /// A worker wants to take the operation until `lease_until`.
    Claim {
        /// The worker's id.
        worker: String,
        /// When the lease should lapse; must be after `now`.
        lease_until: DateTime<Utc>,
    },
    /// The claim holder is about to send the external request.
    RecordCallSent {
        /// The worker's id; must hold the live claim.
        worker: String,
    },
    /// The external service did it.
    Confirm(Confirmed),
    /// The operation will not happen.
    Fail {
        /// Why.
        reason: String,
    },
    /// The attempt failed and may be tried again from `at`.
    ScheduleRetry {
        /// When the operation becomes due again.
        at: DateTime<Utc>,
        /// Why the attempt failed.
        reason: String,
        /// After a request left: true only when the service honours the idempotency key or a
        /// lookup said nothing happened.
        same_key: bool,
    },
    /// The call's outcome is unknown and no automatic path is safe.
    MarkForReconciliation {
        /// Why the outcome is unknown.
        reason: String,
    },
    /// A person resolved the case.
    Reconcile(Reconciled),
    /// The worker is about to send the reply to the user.
    StartReply,
    /// Telegram accepted the reply.
    RecordReplySent {
        /// Telegram's message id, when it gave one.
        message_id: Option<i64>,
    },
    /// The reply was definitely not delivered: retry from `retry_at`, or give up when `None`.
    RecordReplyFailed {
        /// What went wrong.
        reason: String,
        /// When to try again, if Telegram allows it.
        retry_at: Option<DateTime<Utc>>,
    },
    /// Nobody knows whether the reply arrived.
    RecordReplyUnknown {
        /// What went wrong.
        reason: String,
    },
}

/// The kind of an [`OperationCommand`], without its data: a column of the transition table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CommandKind {
    /// [`OperationCommand::Receive`].
    Receive,
    /// [`OperationCommand::Claim`].
    Claim,
    /// [`OperationCommand::RecordCallSent`].
    RecordCallSent,
    /// [`OperationCommand::Confirm`].
    Confirm,
    /// [`OperationCommand::Fail`].
    Fail,
    /// [`OperationCommand::ScheduleRetry`].
    ScheduleRetry,
    /// [`OperationCommand::MarkForReconciliation`].
    MarkForReconciliation,
    /// [`OperationCommand::Reconcile`].
    Reconcile,
    /// [`OperationCommand::StartReply`].
    StartReply,
    /// [`OperationCommand::RecordReplySent`].
    RecordReplySent,
    /// [`OperationCommand::RecordReplyFailed`].
    RecordReplyFailed,
    /// [`OperationCommand::RecordReplyUnknown`].
    RecordReplyUnknown,
}

impl CommandKind {
    /// Every command kind, in declaration order.
    pub const ALL: &'static [CommandKind] = &[
        CommandKind::Receive,
        CommandKind::Claim,
        CommandKind::RecordCallSent,
        CommandKind::Confirm,
        CommandKind::Fail,
        CommandKind::ScheduleRetry,
        CommandKind::MarkForReconciliation,
        CommandKind::Reconcile,
        CommandKind::StartReply,
        CommandKind::RecordReplySent,
        CommandKind::RecordReplyFailed,
        CommandKind::RecordReplyUnknown,
    ];

    /// The stable snake_case name used in recorded rejections.
    pub fn as_str(self) -> &'static str {
        match self {
            CommandKind::Receive => "receive",
            CommandKind::Claim => "claim",
            CommandKind::RecordCallSent => "record_call_sent",
            CommandKind::Confirm => "confirm",
            CommandKind::Fail => "fail",
            CommandKind::ScheduleRetry => "schedule_retry",
            CommandKind::MarkForReconciliation => "mark_for_reconciliation",
            CommandKind::Reconcile => "reconcile",
            CommandKind::StartReply => "start_reply",
            CommandKind::RecordReplySent => "record_reply_sent",
            CommandKind::RecordReplyFailed => "record_reply_failed",
            CommandKind::RecordReplyUnknown => "record_reply_unknown",
        }
    }
}

impl fmt::Display for CommandKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl OperationCommand {
    /// This command's kind.
    pub fn kind(&self) -> CommandKind {
        match self {
            OperationCommand::Receive(_) => CommandKind::Receive,
            OperationCommand::Claim { .. } => CommandKind::Claim,
            OperationCommand::RecordCallSent { .. } => CommandKind::RecordCallSent,
            OperationCommand::Confirm(_) => CommandKind::Confirm,
            OperationCommand::Fail { .. } => CommandKind::Fail,
            OperationCommand::ScheduleRetry { .. } => CommandKind::ScheduleRetry,
            OperationCommand::MarkForReconciliation { .. } => CommandKind::MarkForReconciliation,
            OperationCommand::Reconcile(_) => CommandKind::Reconcile,
            OperationCommand::StartReply => CommandKind::StartReply,
            OperationCommand::RecordReplySent { .. } => CommandKind::RecordReplySent,
            OperationCommand::RecordReplyFailed { .. } => CommandKind::RecordReplyFailed,
            OperationCommand::RecordReplyUnknown { .. } => CommandKind::RecordReplyUnknown,
        }
    }
}

/// The fingerprint of a request: hex SHA-256 of the action and its decision-relevant parameters.
///
/// Two requests with one business key are the same request exactly when their fingerprints are
/// equal. The encoding is unambiguous: a version tag, then the action, the number of parameters
/// and each key and value, every string preceded by its length as a big-endian `u64`, so no
/// choice of strings can make two different inputs hash the same bytes. Parameters come in key
/// order because they are a `BTreeMap`.
pub fn fingerprint(action: &str, params: &BTreeMap<String, String>) -> String {
    fn put(hasher: &mut Sha256, bytes: &[u8]) {
        hasher.update((bytes.len() as u64).to_be_bytes());
        hasher.update(bytes);
    }
    let mut hasher = Sha256::new();
    put(&mut hasher, b"opledger-fingerprint-v1");
    put(&mut hasher, action.as_bytes());
    hasher.update((params.len() as u64).to_be_bytes());
    for (key, value) in params {
        put(&mut hasher, key.as_bytes());
        put(&mut hasher, value.as_bytes());
    }
    hex::encode(hasher.finalize())
}
