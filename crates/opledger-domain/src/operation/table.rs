//! The Operation's transition table: which command may move which status, as data.

use super::command::CommandKind;
use super::event::OperationEventKind;
use super::state::Status;

use CommandKind as C;
use OperationEventKind as E;
use Status as S;

/// One legal move of an operation: in status `from`, command `command` may append `event`
/// (or nothing, when `None`) and leave the operation in status `to`, when `when` holds.
///
/// It exists so that the rules can be read, rendered and tested exhaustively as a table rather
/// than recovered from the branches of `decide`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Transition {
    /// The status before the command.
    pub from: Status,
    /// The command's kind.
    pub command: CommandKind,
    /// The event appended, or `None` when the command is an idempotent no-op.
    pub event: Option<OperationEventKind>,
    /// The status after the event.
    pub to: Status,
    /// The guard that picks this row, in words.
    pub when: &'static str,
}

impl Transition {
    /// Whether the table has any row for `command` in `status`.
    pub fn is_allowed(status: Status, command: CommandKind) -> bool {
        TRANSITIONS
            .iter()
            .any(|t| t.from == status && t.command == command)
    }

    /// The row that describes an observed move, if there is one.
    pub fn find(
        from: Status,
        command: CommandKind,
        event: Option<OperationEventKind>,
        to: Status,
    ) -> Option<&'static Transition> {
        TRANSITIONS
            .iter()
            .find(|t| t.from == from && t.command == command && t.event == event && t.to == to)
    }
}

const fn row(
    from: Status,
    command: CommandKind,
    event: Option<OperationEventKind>,
    to: Status,
    when: &'static str,
) -> Transition {
    Transition {
        from,
        command,
        event,
        to,
        when,
    }
}

const SAME_FINGERPRINT: &str = "same fingerprint: the request joins, nothing is appended";
const OTHER_FINGERPRINT: &str = "different fingerprint: the first request stands";
const REPLY_STARTABLE: &str = "reply not started, or its retry is due";
const REPLY_IN_FLIGHT: &str = "reply in flight";
const REPLY_RETRY: &str = "reply in flight, retry_at given";
const REPLY_GIVE_UP: &str = "reply in flight, no retry_at";

/// Every legal move of an [`Operation`](super::Operation).
///
/// `decide` looks the (status, command) pair up here first and refuses the command when no row
/// has it; only then do the guards (lease, due time, worker, attempts, reply state) pick a row.
/// `decide` also checks that what it produced matches a row, so the table is the whole truth.
/// A `—` event means the command is accepted and nothing is appended.
///
#[doc = include_str!("transitions.md")]
#[rustfmt::skip]
pub const TRANSITIONS: &[Transition] = &[
    row(S::New, C::Receive, Some(E::Received), S::Received, "always"),
    row(S::Received, C::Receive, None, S::Received, SAME_FINGERPRINT),
    row(S::Received, C::Receive, Some(E::KeyConflictRecorded), S::Received, OTHER_FINGERPRINT),
    row(S::Claimed, C::Receive, None, S::Claimed, SAME_FINGERPRINT),
    row(S::Claimed, C::Receive, Some(E::KeyConflictRecorded), S::Claimed, OTHER_FINGERPRINT),
    row(S::CallSent, C::Receive, None, S::CallSent, SAME_FINGERPRINT),
    row(S::CallSent, C::Receive, Some(E::KeyConflictRecorded), S::CallSent, OTHER_FINGERPRINT),
    row(S::RetryScheduled, C::Receive, None, S::RetryScheduled, SAME_FINGERPRINT),
    row(S::RetryScheduled, C::Receive, Some(E::KeyConflictRecorded), S::RetryScheduled, OTHER_FINGERPRINT),
    row(S::NeedsReconciliation, C::Receive, None, S::NeedsReconciliation, SAME_FINGERPRINT),
    row(S::NeedsReconciliation, C::Receive, Some(E::KeyConflictRecorded), S::NeedsReconciliation, OTHER_FINGERPRINT),
    row(S::Confirmed, C::Receive, None, S::Confirmed, SAME_FINGERPRINT),
    row(S::Confirmed, C::Receive, Some(E::KeyConflictRecorded), S::Confirmed, OTHER_FINGERPRINT),
    row(S::Failed, C::Receive, None, S::Failed, SAME_FINGERPRINT),
    row(S::Failed, C::Receive, Some(E::KeyConflictRecorded), S::Failed, OTHER_FINGERPRINT),
    row(S::Reconciled, C::Receive, None, S::Reconciled, SAME_FINGERPRINT),
    row(S::Reconciled, C::Receive, Some(E::KeyConflictRecorded), S::Reconciled, OTHER_FINGERPRINT),
    row(S::Received, C::Claim, Some(E::Claimed), S::Claimed, "lease_until after now"),
    row(S::RetryScheduled, C::Claim, Some(E::Claimed), S::Claimed, "the retry is due (now at or after its time)"),
    row(S::Claimed, C::Claim, Some(E::Claimed), S::Claimed, "the lease expired and nothing was sent under it"),
    row(S::Claimed, C::RecordCallSent, Some(E::ExternalCallSent), S::CallSent, "by the claim holder, lease live"),
    row(S::CallSent, C::Confirm, Some(E::Confirmed), S::Confirmed, "always"),
    row(S::Claimed, C::Fail, Some(E::Failed), S::Failed, "always (nothing was sent)"),
    row(S::CallSent, C::Fail, Some(E::Failed), S::Failed, "always (the service refused)"),
    row(S::Claimed, C::ScheduleRetry, Some(E::RetryScheduled), S::RetryScheduled, "claims below max_attempts"),
    row(S::Claimed, C::ScheduleRetry, Some(E::Failed), S::Failed, "max_attempts claims used: gives up"),
    row(S::CallSent, C::ScheduleRetry, Some(E::RetryScheduled), S::RetryScheduled, "same_key, claims below max_attempts"),
    row(S::CallSent, C::ScheduleRetry, Some(E::Failed), S::Failed, "same_key, max_attempts claims used: gives up"),
    row(S::CallSent, C::MarkForReconciliation, Some(E::MarkedForReconciliation), S::NeedsReconciliation, "always"),
    row(S::NeedsReconciliation, C::Reconcile, Some(E::Reconciled), S::Reconciled, "outcome succeeded or failed"),
    row(S::NeedsReconciliation, C::Reconcile, Some(E::Reconciled), S::RetryScheduled, "outcome retry: due now, same operation id"),
    row(S::Confirmed, C::StartReply, Some(E::ReplyStarted), S::Confirmed, REPLY_STARTABLE),
    row(S::Confirmed, C::RecordReplySent, Some(E::ReplySent), S::Confirmed, REPLY_IN_FLIGHT),
    row(S::Confirmed, C::RecordReplyFailed, Some(E::ReplyRetryScheduled), S::Confirmed, REPLY_RETRY),
    row(S::Confirmed, C::RecordReplyFailed, Some(E::ReplyFailed), S::Confirmed, REPLY_GIVE_UP),
    row(S::Confirmed, C::RecordReplyUnknown, Some(E::ReplyOutcomeUnknown), S::Confirmed, REPLY_IN_FLIGHT),
    row(S::Failed, C::StartReply, Some(E::ReplyStarted), S::Failed, REPLY_STARTABLE),
    row(S::Failed, C::RecordReplySent, Some(E::ReplySent), S::Failed, REPLY_IN_FLIGHT),
    row(S::Failed, C::RecordReplyFailed, Some(E::ReplyRetryScheduled), S::Failed, REPLY_RETRY),
    row(S::Failed, C::RecordReplyFailed, Some(E::ReplyFailed), S::Failed, REPLY_GIVE_UP),
    row(S::Failed, C::RecordReplyUnknown, Some(E::ReplyOutcomeUnknown), S::Failed, REPLY_IN_FLIGHT),
    row(S::Reconciled, C::StartReply, Some(E::ReplyStarted), S::Reconciled, REPLY_STARTABLE),
    row(S::Reconciled, C::RecordReplySent, Some(E::ReplySent), S::Reconciled, REPLY_IN_FLIGHT),
    row(S::Reconciled, C::RecordReplyFailed, Some(E::ReplyRetryScheduled), S::Reconciled, REPLY_RETRY),
    row(S::Reconciled, C::RecordReplyFailed, Some(E::ReplyFailed), S::Reconciled, REPLY_GIVE_UP),
    row(S::Reconciled, C::RecordReplyUnknown, Some(E::ReplyOutcomeUnknown), S::Reconciled, REPLY_IN_FLIGHT),
];

/// Renders the table as Markdown, the form included in the documentation of [`TRANSITIONS`].
pub fn render_markdown() -> String {
    let mut out = String::from("| from | command | event | to | when |\n|---|---|---|---|---|\n");
    for t in TRANSITIONS {
        let event = t.event.map_or("—", OperationEventKind::as_str);
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            t.from, t.command, event, t.to, t.when
        ));
    }
    out
}
