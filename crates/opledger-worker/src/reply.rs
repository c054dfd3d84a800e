//! Replies: once an operation is terminal, the user is told through the Bot API.
//!
//! A reply is an ambiguous effect of its own (`sendMessage` has no idempotency): it is recorded
//! as started before it is sent, a definite refusal is retried or given up, flood control's
//! `retry_after` is honoured, and a reply whose outcome is unknown is never sent again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use futures_util::future::BoxFuture;
use opledger_config::{ActionConfig, ReplyTemplate};
use opledger_domain::operation::{OperationCommand, OperationEvent, ReconcileOutcome};
use opledger_domain::{Operation, ReplyStatus};
use opledger_telegram::{BotApi, BotApiError};
use serde_json::Value;
use tokio::time::Instant;

use crate::handle::{Applied, Handle, Operations, StepError};

/// How many times a reply that certainly did not arrive is tried before giving up.
const MAX_REPLY_ATTEMPTS: u32 = 5;

/// Sends replies, at most one per `interval` to each chat from this process.
#[derive(Debug)]
pub(crate) struct Replier {
    bots: HashMap<String, BotApi>,
    interval: Duration,
    /// The next free slot per chat.
    slots: Mutex<HashMap<i64, Instant>>,
}

impl Replier {
    pub(crate) fn new(bots: HashMap<String, BotApi>, interval: Duration) -> Self {
        Replier {
            bots,
            interval,
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// Takes the reply step of a terminal operation whose reply is due, for `action`, its start
    /// committed through `start`.
    pub(crate) async fn reply(
        &self,
        ops: &Operations,
        action: &ActionConfig,
        handle: &mut Handle,
        start: &mut dyn Start,
    ) -> Result<(), StepError> {
        let Some(chat_id) = handle.received().chat_id else {
            return Ok(());
        };
        let reply = handle.state().reply;
        match reply {
            ReplyStatus::InFlight { .. } => {
                // Due while in flight: its sender died. Telegram may have it; never resend.
                // Only this attempt is given up: one started since is another worker's.
                let unknown = OperationCommand::RecordReplyUnknown {
                    reason: "the worker sending the reply stopped before recording its outcome"
                        .to_owned(),
                };
                ops.commit(handle, &[unknown], |state| state.reply == reply)
                    .await?;
                return Ok(());
            }
            ReplyStatus::NotStarted | ReplyStatus::RetryScheduled { .. } => {}
            ReplyStatus::Sent | ReplyStatus::Failed | ReplyStatus::Unknown => return Ok(()),
        }
        let Some(api) = self.bots.get(&handle.received().bot) else {
            let failed = OperationCommand::RecordReplyFailed {
                reason: format!("bot `{}` is not configured any more", handle.received().bot),
                retry_at: None,
            };
            ops.commit(handle, &[OperationCommand::StartReply, failed], |_| true)
                .await?;
            return Ok(());
        };
        let text = text(action, handle);
        let slot = self.slot(chat_id);
        if slot > Instant::now() {
            // Nothing carried waits with the reply for the chat's slot.
            start.flush().await;
            tokio::time::sleep_until(slot).await;
        }
        // After a lost race the domain judges the start on the fresh state: it refuses a reply
        // another worker started or sent meanwhile.
        let started = start.start(handle, &[OperationCommand::StartReply]).await?;
        if started == Applied::Declined {
            return Ok(());
        }
        opledger_ledger::failpoint::crash("worker-after-reply-started");
        let sent = api.send_message(chat_id, &text).await;
        let state = handle.state();
        let command = reply_outcome(sent.map(|message| message.message_id), state, ops.now());
        // If the sweep recorded the reply as unknown meanwhile, its record stands: after a lost
        // race the outcome is decided again only while this attempt is the one in flight.
        let ours = state.reply;
        ops.commit(handle, &[command], |state| state.reply == ours)
            .await?;
        Ok(())
    }

    /// Takes this chat's next free slot: when the reply may go.
    fn slot(&self, chat_id: i64) -> Instant {
        let mut slots = self
            .slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        if slots.len() > 10_000 {
            slots.retain(|_, next| *next > now);
        }
        let slot = slots.get(&chat_id).copied().unwrap_or(now).max(now);
        slots.insert(chat_id, slot + self.interval);
        slot
    }
}

/// How a reply's start is committed: by the worker, alone or in one append with what its task
/// carries from its previous call (that call's outcome, ADR 0020).
pub(crate) trait Start: Send {
    /// Commits `commands` (the reply's start) on `handle`, with what is carried; `Declined` if
    /// the domain refuses them on the operation's current state (what is carried is committed
    /// all the same).
    fn start<'a>(
        &'a mut self,
        handle: &'a mut Handle,
        commands: &'a [OperationCommand],
    ) -> BoxFuture<'a, Result<Applied, StepError>>;

    /// Commits what is carried now, alone: the step is about to wait.
    fn flush(&mut self) -> BoxFuture<'_, ()>;
}

/// What the worker records of `sendMessage`'s answer (the message's id, or the Bot API's
/// error) to a reply started on `state`, at `now`: sent; refused for sure, and tried again
/// (after flood control's wait, or a short backoff while Telegram was unreachable) or given up;
/// or unknown, never sent again.
pub fn reply_outcome(
    sent: Result<i64, BotApiError>,
    state: &Operation,
    now: DateTime<Utc>,
) -> OperationCommand {
    match sent {
        Ok(message_id) => OperationCommand::RecordReplySent {
            message_id: Some(message_id),
        },
        Err(BotApiError::RetryAfter { seconds, .. }) => {
            let wait = TimeDelta::seconds(i64::try_from(seconds).unwrap_or(i64::MAX).max(1));
            OperationCommand::RecordReplyFailed {
                reason: format!("telegram's flood control asked to wait {seconds} s"),
                retry_at: Some(now + wait),
            }
        }
        Err(error) if error.is_definitely_not_delivered() => {
            let transient = matches!(error, BotApiError::Unreachable { .. });
            let retry = transient && state.reply_attempts < MAX_REPLY_ATTEMPTS;
            let backoff = TimeDelta::seconds(1 << state.reply_attempts.min(8));
            OperationCommand::RecordReplyFailed {
                reason: error.to_string(),
                retry_at: retry.then(|| now + backoff),
            }
        }
        Err(error) => OperationCommand::RecordReplyUnknown {
            reason: error.to_string(),
        },
    }
}

/// The reply's text: the action's template for how the operation ended, filled in; if a value
/// it needs is missing (a result field the service did not return), the default text for that
/// outcome rather than no reply at all.
pub(crate) fn text(action: &ActionConfig, handle: &Handle) -> String {
    let received = handle.received();
    let reply = &action.reply;
    let operation_id = received.operation_id.to_string();
    let (template, external_id, result, error) = match handle.ending() {
        Some(OperationEvent::Confirmed(c)) => (
            &reply.confirmed,
            c.external_id.clone(),
            Some(&c.result),
            None,
        ),
        Some(OperationEvent::Reconciled(r)) if r.outcome == ReconcileOutcome::Succeeded => {
            (&reply.confirmed, r.external_id.clone(), None, None)
        }
        Some(OperationEvent::Failed(f)) => (&reply.failed, None, None, Some(f.reason.clone())),
        _ => (
            &reply.failed,
            None,
            None,
            Some("it could not be completed".to_owned()),
        ),
    };
    let value = |name: &str| -> Option<String> {
        match name {
            "operation_id" => Some(operation_id.clone()),
            "action" => Some(received.action.clone()),
            "external_id" => external_id.clone(),
            "error" => error.clone(),
            _ => match name.strip_prefix("result.") {
                Some(path) => result.and_then(|r| field(r, path)),
                None => received.params.get(name).cloned(),
            },
        }
    };
    template.render(&value).unwrap_or_else(|_| {
        let fallback = match template.kind() {
            opledger_config::ReplyKind::Confirmed => ReplyTemplate::default_confirmed(),
            opledger_config::ReplyKind::Failed => ReplyTemplate::default_failed(),
        };
        fallback
            .render(&value)
            .unwrap_or_else(|_| "Done.".to_owned())
    })
}

/// A (possibly nested, dot-separated) field of a result, as text.
fn field(result: &std::collections::BTreeMap<String, Value>, path: &str) -> Option<String> {
    let mut parts = path.split('.');
    let mut value = result.get(parts.next()?)?;
    for part in parts {
        value = value.get(part)?;
    }
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handle::tests::now;

    fn failed(retry_at: Option<DateTime<Utc>>, reason: String) -> OperationCommand {
        OperationCommand::RecordReplyFailed { reason, retry_at }
    }

    #[test]
    fn a_reply_s_answer_is_recorded_and_only_a_certain_refusal_is_tried_again() {
        let first = Operation::default();
        let sent = OperationCommand::RecordReplySent {
            message_id: Some(42),
        };
        assert_eq!(reply_outcome(Ok(42), &first, now()), sent);

        let flood = BotApiError::RetryAfter {
            method: "sendMessage",
            seconds: 9,
        };
        let waited = failed(
            Some(now() + TimeDelta::seconds(9)),
            "telegram's flood control asked to wait 9 s".to_owned(),
        );
        assert_eq!(reply_outcome(Err(flood), &first, now()), waited);

        let unreachable = || BotApiError::Unreachable {
            method: "sendMessage",
        };
        let reason = unreachable().to_string();
        let again = failed(Some(now() + TimeDelta::seconds(1)), reason.clone());
        assert_eq!(reply_outcome(Err(unreachable()), &first, now()), again);
        let last = Operation {
            reply_attempts: MAX_REPLY_ATTEMPTS,
            ..Operation::default()
        };
        let given_up = failed(None, reason);
        assert_eq!(reply_outcome(Err(unreachable()), &last, now()), given_up);

        let timeout = BotApiError::Timeout {
            method: "sendMessage",
        };
        let unknown = OperationCommand::RecordReplyUnknown {
            reason: timeout.to_string(),
        };
        assert_eq!(reply_outcome(Err(timeout), &first, now()), unknown);
    }
}
