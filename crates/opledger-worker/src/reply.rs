//! Replies: once an operation is terminal, the user is told through the Bot API.
//!
//! A reply is an ambiguous effect of its own (`sendMessage` has no idempotency): it is recorded
//! as started before it is sent, a definite refusal is retried or given up, flood control's
//! `retry_after` is honoured, and a reply whose outcome is unknown is never sent again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use chrono::TimeDelta;
use opledger_config::ReplyTemplate;
use opledger_domain::ReplyStatus;
use opledger_domain::operation::{OperationCommand, OperationEvent, ReconcileOutcome};
use opledger_telegram::{BotApi, BotApiError};
use serde_json::Value;
use tokio::time::Instant;

use crate::worker::{Action, Appended, StepError, View, Worker};

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

    /// Takes the reply step of a terminal operation whose reply is due.
    pub(crate) async fn reply(
        &self,
        worker: &Worker,
        action: &Action,
        view: &mut View,
    ) -> Result<(), StepError> {
        let Some(chat_id) = view.received.chat_id else {
            return Ok(());
        };
        match view.state.reply {
            ReplyStatus::InFlight { .. } => {
                // Due while in flight: its sender died. Telegram may have it; never resend.
                let unknown = OperationCommand::RecordReplyUnknown {
                    reason: "the worker sending the reply stopped before recording its outcome"
                        .to_owned(),
                };
                worker.append(view, unknown).await?;
                return Ok(());
            }
            ReplyStatus::NotStarted | ReplyStatus::RetryScheduled { .. } => {}
            ReplyStatus::Sent | ReplyStatus::Failed | ReplyStatus::Unknown => return Ok(()),
        }
        let Some(api) = self.bots.get(&view.received.bot) else {
            let failed = OperationCommand::RecordReplyFailed {
                reason: format!("bot `{}` is not configured any more", view.received.bot),
                retry_at: None,
            };
            worker
                .append_all(view, [OperationCommand::StartReply, failed])
                .await?;
            return Ok(());
        };
        let text = text(action, view);
        self.pace(chat_id).await;
        if !matches!(
            worker.append(view, OperationCommand::StartReply).await?,
            Appended::Done
        ) {
            return Ok(());
        }
        opledger_ledger::failpoint::crash("worker-after-reply-started");
        let sent = api.send_message(chat_id, &text).await;
        let now = worker.now();
        let command = match sent {
            Ok(message) => OperationCommand::RecordReplySent {
                message_id: Some(message.message_id),
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
                let retry = transient && view.state.reply_attempts < MAX_REPLY_ATTEMPTS;
                let backoff = TimeDelta::seconds(1 << view.state.reply_attempts.min(8));
                OperationCommand::RecordReplyFailed {
                    reason: error.to_string(),
                    retry_at: retry.then(|| now + backoff),
                }
            }
            Err(error) => OperationCommand::RecordReplyUnknown {
                reason: error.to_string(),
            },
        };
        // If the sweep recorded the reply as unknown meanwhile, its record stands.
        worker.append(view, command).await?;
        Ok(())
    }

    /// Waits for this chat's next free slot and takes it.
    async fn pace(&self, chat_id: i64) {
        let slot = {
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
        };
        tokio::time::sleep_until(slot).await;
    }
}

/// The reply's text: the action's template for how the operation ended, filled in; if a value
/// it needs is missing (a result field the service did not return), the default text for that
/// outcome rather than no reply at all.
pub(crate) fn text(action: &Action, view: &View) -> String {
    let received = &view.received;
    let reply = &action.config.reply;
    let operation_id = received.operation_id.to_string();
    let (template, external_id, result, error) = match &view.ending {
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
