//! `decide`: the Operation's rules, consulting the transition table before any guard.

use chrono::{DateTime, Utc};

use super::command::{CommandKind, OperationCommand};
use super::event::{
    Claimed, ExternalCallSent, Failed, KeyConflictRecorded, MarkedForReconciliation,
    OperationEvent, Received, ReplyFailed, ReplyOutcomeUnknown, ReplyRetryScheduled, ReplySent,
    ReplyStarted, RetryScheduled,
};
use super::state::{Operation, ReplyStatus, Status, evolve};
use super::table::Transition;
use crate::error::{NameKind, Rejection};
use crate::ids::{OperationId, validate_name};

/// Decides which events `command` appends to the operation at `now`, or why it is refused.
///
/// The (status, command) pair is looked up in [`TRANSITIONS`](super::TRANSITIONS) first; the
/// guards run only for pairs the table allows, and the result must match one of its rows.
/// An empty `Ok` means the command is accepted and nothing needs appending (an idempotent join).
pub fn decide(
    state: &Operation,
    command: &OperationCommand,
    now: DateTime<Utc>,
) -> Result<Vec<OperationEvent>, Rejection> {
    let kind = command.kind();
    if !Transition::is_allowed(state.status, kind) {
        return Err(refusal(state.status, kind));
    }
    let events = guard(state, command, now)?;

    // The table is the whole truth: a move it does not list is refused whatever the guards said.
    let to = events.iter().fold(state.clone(), evolve).status;
    let listed = match events.as_slice() {
        [] => Transition::find(state.status, kind, None, to).is_some(),
        [event] => Transition::find(state.status, kind, Some(event.kind()), to).is_some(),
        _ => false,
    };
    if listed {
        Ok(events)
    } else {
        Err(Rejection::NotAllowed {
            status: state.status,
            command: kind,
        })
    }
}

/// The most helpful rejection for a pair the table does not allow.
fn refusal(status: Status, command: CommandKind) -> Rejection {
    let on_effect_path = matches!(
        command,
        CommandKind::Claim
            | CommandKind::RecordCallSent
            | CommandKind::Confirm
            | CommandKind::Fail
            | CommandKind::ScheduleRetry
            | CommandKind::MarkForReconciliation
            | CommandKind::Reconcile
    );
    match status {
        _ if status.is_terminal() && on_effect_path => Rejection::Terminal { status },
        Status::NeedsReconciliation if on_effect_path => Rejection::NeedsReconciliation,
        Status::CallSent if matches!(command, CommandKind::Claim | CommandKind::RecordCallSent) => {
            Rejection::CallOutcomeUnknown
        }
        _ => Rejection::NotAllowed { status, command },
    }
}

/// The guards of each command, for a pair the table allows.
fn guard(
    state: &Operation,
    command: &OperationCommand,
    now: DateTime<Utc>,
) -> Result<Vec<OperationEvent>, Rejection> {
    let refused = || refusal(state.status, command.kind());
    let event = match command {
        OperationCommand::Receive(received) => return receive(state, received),
        OperationCommand::Claim {
            worker,
            lease_until,
        } => {
            if worker.is_empty() {
                return Err(invalid("worker must not be empty"));
            }
            if *lease_until <= now {
                return Err(invalid("lease_until must be after now"));
            }
            match (state.status, &state.claim, state.retry_at) {
                (Status::Received, _, _) => {}
                (Status::RetryScheduled, _, Some(at)) if now < at => {
                    return Err(Rejection::NotDue { at });
                }
                (Status::RetryScheduled, _, _) => {}
                (Status::Claimed, Some(claim), _) if claim.is_live(now) => {
                    return Err(Rejection::AlreadyClaimed {
                        worker: claim.worker.clone(),
                        lease_until: claim.lease_until,
                    });
                }
                (Status::Claimed, _, _) => {}
                _ => return Err(refused()),
            }
            Claimed {
                worker: worker.clone(),
                lease_until: *lease_until,
                attempt: state.claims.saturating_add(1),
            }
            .into()
        }
        OperationCommand::RecordCallSent { worker } => {
            let (Some(claim), Some(operation_id)) = (&state.claim, state.operation_id) else {
                return Err(refused());
            };
            if claim.worker != *worker {
                return Err(Rejection::NotClaimHolder {
                    holder: claim.worker.clone(),
                    worker: worker.clone(),
                });
            }
            if !claim.is_live(now) {
                return Err(Rejection::LeaseExpired {
                    lease_until: claim.lease_until,
                });
            }
            ExternalCallSent {
                worker: worker.clone(),
                attempt: claim.attempt,
                idempotency_key: operation_id.to_string(),
            }
            .into()
        }
        OperationCommand::Confirm(confirmed) => confirmed.clone().into(),
        OperationCommand::Fail { reason } => Failed {
            reason: reason.clone(),
            attempts: state.claims,
        }
        .into(),
        OperationCommand::ScheduleRetry {
            at,
            reason,
            same_key,
        } => {
            if state.status == Status::CallSent && !same_key {
                return Err(Rejection::BlindRetryForbidden);
            }
            if state.claims >= state.max_attempts {
                Failed {
                    reason: format!("gave up after {} attempts: {reason}", state.claims),
                    attempts: state.claims,
                }
                .into()
            } else {
                RetryScheduled {
                    at: *at,
                    attempt: state.claims,
                    reason: reason.clone(),
                    same_key: *same_key,
                }
                .into()
            }
        }
        OperationCommand::MarkForReconciliation { reason } => MarkedForReconciliation {
            reason: reason.clone(),
            attempt: state.claims,
        }
        .into(),
        OperationCommand::Reconcile(reconciled) => {
            if reconciled.operator.is_empty() {
                return Err(invalid("operator must not be empty"));
            }
            reconciled.clone().into()
        }
        OperationCommand::StartReply => {
            match state.reply {
                ReplyStatus::NotStarted => {}
                ReplyStatus::RetryScheduled { at } if now < at => {
                    return Err(Rejection::ReplyNotDue { at });
                }
                ReplyStatus::RetryScheduled { .. } => {}
                ReplyStatus::InFlight { attempt } => {
                    return Err(Rejection::ReplyInFlight { attempt });
                }
                ReplyStatus::Sent => return Err(Rejection::ReplyAlreadySent),
                ReplyStatus::Failed => return Err(Rejection::ReplyGaveUp),
                // Never a second ReplyStarted after an unknown outcome: it could double the reply.
                ReplyStatus::Unknown => return Err(Rejection::ReplyOutcomeUnknown),
            }
            ReplyStarted {
                attempt: state.reply_attempts.saturating_add(1),
            }
            .into()
        }
        OperationCommand::RecordReplySent { message_id } => {
            reply_in_flight(state)?;
            ReplySent {
                message_id: *message_id,
            }
            .into()
        }
        OperationCommand::RecordReplyFailed { reason, retry_at } => {
            reply_in_flight(state)?;
            match retry_at {
                Some(at) => ReplyRetryScheduled {
                    at: *at,
                    reason: reason.clone(),
                }
                .into(),
                None => ReplyFailed {
                    reason: reason.clone(),
                }
                .into(),
            }
        }
        OperationCommand::RecordReplyUnknown { reason } => {
            reply_in_flight(state)?;
            ReplyOutcomeUnknown {
                reason: reason.clone(),
            }
            .into()
        }
    };
    Ok(vec![event])
}

/// A new request starts the operation; a repeat joins it or records a key conflict.
fn receive(state: &Operation, received: &Received) -> Result<Vec<OperationEvent>, Rejection> {
    if state.status != Status::New {
        if received.fingerprint == state.fingerprint {
            return Ok(Vec::new());
        }
        return Ok(vec![
            KeyConflictRecorded {
                update_id: received.update_id,
                bot: received.bot.clone(),
                fingerprint: received.fingerprint.clone(),
                existing_fingerprint: state.fingerprint.clone(),
            }
            .into(),
        ]);
    }
    if validate_name(NameKind::Action, &received.action).is_err() {
        return Err(invalid(
            "action must be 1 to 64 characters from a-z, 0-9 and _",
        ));
    }
    if validate_name(NameKind::Bot, &received.bot).is_err() {
        return Err(invalid(
            "bot must be 1 to 64 characters from a-z, 0-9 and _",
        ));
    }
    if received.business_key.is_empty() {
        return Err(invalid("business_key must not be empty"));
    }
    if received.operation_id != OperationId::new(&received.action, &received.business_key) {
        return Err(invalid(
            "operation_id must be the id of the action and business key",
        ));
    }
    if received.max_attempts == 0 {
        return Err(invalid("max_attempts must be at least 1"));
    }
    Ok(vec![received.clone().into()])
}

fn reply_in_flight(state: &Operation) -> Result<(), Rejection> {
    match state.reply {
        ReplyStatus::InFlight { .. } => Ok(()),
        reply => Err(Rejection::ReplyNotInFlight { reply }),
    }
}

fn invalid(reason: &'static str) -> Rejection {
    Rejection::InvalidCommand { reason }
}
