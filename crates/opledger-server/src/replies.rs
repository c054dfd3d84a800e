//! What the bot answers at intake, where answering is pure: `/help` from configuration,
//! `/status` and repeated requests from read models, usage for malformed commands, and the
//! question of an action that asks first, with its one-time *Confirm* / *Cancel* keyboard.
//! Asking twice gives the same answer and starts nothing. Replies about an operation's outcome are the
//! worker's job, tracked as effects.
//!
//! `/status` reads `user_operations`, an asynchronous read model: before answering it waits a
//! little ([`STATUS_FRESHNESS`]) for the projection to apply the `/status` update itself, so the
//! answer includes everything the user did before asking; if the projection is late, it answers
//! from what is there.

use std::time::Duration;

use opledger_config::ActionConfig;
use opledger_domain::callback_token::cancel_data;
use opledger_projections::operation_status::{self, OperationStatusRow};
use opledger_projections::registry;
use opledger_projections::user_operations::{self, UserOperation};
use opledger_store::AnyStore;
use opledger_telegram::{InlineButton, InlineKeyboard};

use crate::intake::{Receipt, Recorded, Route};

/// How many operations `/status` lists.
const STATUS_LIMIT: u32 = 5;

/// How long `/status` waits for `user_operations` to catch up with the update it answers (at
/// most; the service waits less when its request timeout is short).
pub const STATUS_FRESHNESS: Duration = Duration::from_secs(2);

/// A message to send to a chat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub chat_id: i64,
    pub text: String,
    /// Buttons under the message (a confirmation's), if any.
    pub keyboard: Option<InlineKeyboard>,
}

impl Answer {
    /// The answer as a Bot API call riding on a webhook response (`sendMessage`).
    pub fn webhook_call(&self) -> serde_json::Value {
        let mut call = serde_json::json!({
            "method": "sendMessage",
            "chat_id": self.chat_id,
            "text": self.text,
        });
        if let Some(keyboard) = &self.keyboard {
            call["reply_markup"] = serde_json::to_value(keyboard).unwrap_or_default();
        }
        call
    }
}

/// What the *Confirm* button of a confirmation says.
pub const CONFIRM: &str = "Confirm";
/// What its *Cancel* button says.
pub const CANCEL: &str = "Cancel";
/// What a *Cancel* click is answered with.
pub const CANCELLED: &str = "Cancelled: nothing was done.";

/// A confirmation's keyboard: *Confirm* carries the token (a click starts the action, once),
/// *Cancel* the token's cancel data (a click cancels it).
pub fn confirmation(token: &str) -> InlineKeyboard {
    let button = |text: &str, callback_data: String| InlineButton {
        text: text.to_owned(),
        callback_data,
    };
    InlineKeyboard {
        inline_keyboard: vec![vec![
            button(CONFIRM, token.to_owned()),
            button(CANCEL, cancel_data(token)),
        ]],
    }
}

/// Why an answer could not be read; the update stays recorded, only the answer is lost.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    #[error(transparent)]
    OperationStatus(#[from] operation_status::ReadError),
}

/// The answer an accepted update deserves at intake, if any. A `/status` answer first waits up
/// to `freshness` for its read model to apply the update.
pub async fn answer(
    store: &AnyStore,
    bot: &str,
    actions: &[&ActionConfig],
    recorded: &Recorded,
    freshness: Duration,
) -> Result<Option<Answer>, AnswerError> {
    let Recorded::Accepted {
        position,
        chat_id: Some(chat_id),
        user_id,
        route,
        ..
    } = recorded
    else {
        return Ok(None);
    };
    let mut keyboard = None;
    let text = match route {
        Route::Confirm {
            token, question, ..
        } => {
            keyboard = Some(confirmation(token));
            question.clone()
        }
        Route::Cancelled => CANCELLED.to_owned(),
        Route::Help => help(actions),
        Route::Usage { action } => match actions.iter().find(|a| a.name == *action) {
            Some(
                action @ ActionConfig {
                    command: Some(command),
                    ..
                },
            ) => format!("Usage: {}", usage(command, action)),
            _ => return Ok(None),
        },
        Route::Status { operation_id } => {
            wait_for_status(store, *position, freshness).await;
            status(store, bot, *user_id, operation_id.as_deref()).await
        }
        Route::Joined(link) => {
            // The inline read model: it already holds the operation the update joined.
            match operation_status::get(store.reader(), &link.operation_id.to_string()).await? {
                Some(row) => format!(
                    "You asked for this already: {}.",
                    describe(&Described::from(&row)).trim_end_matches('.')
                ),
                None => return Ok(None),
            }
        }
        Route::KeyConflict { .. } => "You already made this request with other details; the \
             first one stands. Send /status to see it."
            .to_owned(),
        Route::TokenRefused { .. } => "This button can no longer be used.".to_owned(),
        Route::Nothing | Route::Started(_) => return Ok(None),
    };
    Ok(Some(Answer {
        chat_id: *chat_id,
        text,
        keyboard,
    }))
}

/// The id of the button click an update carries, when it is one that deserves an
/// `answerCallbackQuery` (accepted or a duplicate; never a collision or a quarantined body).
///
/// Telegram shows a progress indicator on the button until the query is answered, so every
/// click is answered at once, best effort, with the pure answer's text as a notice when there
/// is one; the outcome reply comes from the worker.
pub fn callback_to_answer(receipt: &Receipt) -> Option<&str> {
    match receipt.recorded {
        Recorded::Accepted { .. } | Recorded::Duplicate { .. } => {
            receipt.callback_query_id.as_deref()
        }
        Recorded::Collision { .. } | Recorded::Quarantined { .. } => None,
    }
}

/// `/help`: the bot's commands, from configuration (actions without a command are not listed).
pub fn help(actions: &[&ActionConfig]) -> String {
    let mut lines = vec!["Commands:".to_owned()];
    let mut sorted: Vec<(&str, &ActionConfig)> = actions
        .iter()
        .filter_map(|a| Some((a.command.as_deref()?, *a)))
        .collect();
    sorted.sort_by_key(|(command, _)| *command);
    lines.extend(sorted.iter().map(|(command, a)| usage(command, a)));
    lines.push("/status: your recent requests (or /status <id> for one)".to_owned());
    lines.push("/help: this list".to_owned());
    lines.join("\n")
}

/// `/coupon <campaign>`.
fn usage(command: &str, action: &ActionConfig) -> String {
    let mut usage = format!("/{command}");
    for param in &action.params {
        usage.push_str(&format!(" <{param}>"));
    }
    usage
}

/// Waits (at most `freshness`) until `user_operations` has applied the ledger up to `position`;
/// if it has not by then, or the registry cannot be read, `/status` answers from what the read
/// model holds.
async fn wait_for_status(store: &AnyStore, position: u64, freshness: Duration) {
    match registry::wait_for(store, user_operations::NAME, position, freshness).await {
        Ok(true) => {}
        Ok(false) => tracing::debug!(
            position,
            "user_operations is behind; /status answers from what it holds"
        ),
        Err(error) => tracing::warn!(
            %error,
            "cannot read the projection registry; /status answers from what it holds"
        ),
    }
}

/// What `/status` says when its read model cannot be read.
pub const STATUS_UNAVAILABLE: &str =
    "I cannot look up your requests right now; please try again in a minute.";

/// What `/status` says to someone without requests.
pub const NO_REQUESTS: &str = "You have no requests yet. Send /help to see what you can ask for.";

/// What `/status <id>` says for an id that is not one of the user's operations.
pub const NO_SUCH_REQUEST: &str = "No request with that id.";

/// `/status`: the user's recent operations (from `user_operations`), or one of theirs by id, in
/// plain words. Another user's operation is answered like an unknown id. A read model that
/// cannot be read is said kindly (and logged).
pub async fn status(
    store: &AnyStore,
    bot: &str,
    user_id: Option<i64>,
    operation_id: Option<&str>,
) -> String {
    let pool = store.reader();
    let read = match (operation_id, user_id) {
        (Some(id), _) => {
            let id = id.trim().to_ascii_lowercase();
            user_operations::get(pool, &id).await.map(|row| {
                // Only the user's own operations are shown.
                match row.filter(|r| r.bot == bot && user_id.is_some() && r.user_id == user_id) {
                    Some(row) => describe(&Described::from(&row)),
                    None => NO_SUCH_REQUEST.to_owned(),
                }
            })
        }
        (None, None) => Ok(NO_REQUESTS.to_owned()),
        (None, Some(user_id)) => user_operations::recent(pool, bot, user_id, STATUS_LIMIT)
            .await
            .map(|rows| {
                if rows.is_empty() {
                    NO_REQUESTS.to_owned()
                } else {
                    rows.iter()
                        .map(|row| describe(&Described::from(row)))
                        .collect::<Vec<_>>()
                        .join("\n")
                }
            }),
    };
    read.unwrap_or_else(|error| {
        tracing::warn!(bot, %error, "cannot answer /status");
        STATUS_UNAVAILABLE.to_owned()
    })
}

/// What an answer says about one operation, from either read model.
#[derive(Debug)]
struct Described<'a> {
    operation_id: &'a str,
    action: &'a str,
    business_key: &'a str,
    status: &'a str,
    resolution: Option<&'a str>,
    external_id: Option<&'a str>,
    last_error: Option<&'a str>,
}

impl<'a> From<&'a UserOperation> for Described<'a> {
    fn from(row: &'a UserOperation) -> Self {
        Described {
            operation_id: &row.operation_id,
            action: &row.action,
            business_key: &row.business_key,
            status: &row.status,
            resolution: row.resolution.as_deref(),
            external_id: row.external_id.as_deref(),
            last_error: row.last_error.as_deref(),
        }
    }
}

impl<'a> From<&'a OperationStatusRow> for Described<'a> {
    fn from(row: &'a OperationStatusRow) -> Self {
        Described {
            operation_id: &row.operation_id,
            action: &row.action,
            business_key: &row.business_key,
            status: &row.status,
            resolution: None,
            external_id: row.external_id.as_deref(),
            last_error: row.last_error.as_deref(),
        }
    }
}

/// One operation in a line: what, state in plain words, and its id for `/status <id>`.
fn describe(row: &Described<'_>) -> String {
    format!(
        "{} {}: {} ({})",
        row.action,
        visible_key(row.business_key),
        plain(row.status, row.resolution, row.external_id, row.last_error),
        row.operation_id
    )
}

/// The business key without the repeat guard's epoch suffix.
fn visible_key(key: &str) -> &str {
    key.rsplit_once('#').map_or(key, |(key, _)| key)
}

/// A state in words a user understands, with the shop's id once done and the reason once
/// failed. `resolution` is what a person decided about a reconciled operation.
pub fn plain(
    status: &str,
    resolution: Option<&str>,
    external_id: Option<&str>,
    last_error: Option<&str>,
) -> String {
    let done = || match external_id {
        Some(id) => format!("done: {id}"),
        None => "done".to_owned(),
    };
    match (status, resolution) {
        ("received", _) => "received, waiting to start".to_owned(),
        ("claimed" | "call_sent", _) => "in progress".to_owned(),
        ("retry_scheduled", _) => "waiting to retry".to_owned(),
        ("needs_reconciliation", _) => "checking with the shop".to_owned(),
        ("confirmed", _) | ("reconciled", Some("succeeded")) => done(),
        ("failed", _) => match last_error {
            Some(reason) => format!("failed: {reason}"),
            None => "failed".to_owned(),
        },
        ("reconciled", Some("failed")) => "not done: a person checked with the shop".to_owned(),
        ("reconciled", _) => "resolved by a person".to_owned(),
        _ => "unknown".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_is_said_in_plain_words() {
        let cases = [
            ("received", None, None, None, "received, waiting to start"),
            ("claimed", None, None, None, "in progress"),
            ("call_sent", None, None, None, "in progress"),
            (
                "retry_scheduled",
                None,
                None,
                Some("503"),
                "waiting to retry",
            ),
            (
                "needs_reconciliation",
                None,
                None,
                Some("timeout"),
                "checking with the shop",
            ),
            ("confirmed", None, Some("cpn_1"), None, "done: cpn_1"),
            ("confirmed", None, None, None, "done"),
            (
                "failed",
                None,
                None,
                Some("out of stock"),
                "failed: out of stock",
            ),
            (
                "reconciled",
                Some("succeeded"),
                Some("crm-1"),
                None,
                "done: crm-1",
            ),
            (
                "reconciled",
                Some("failed"),
                None,
                Some("timeout"),
                "not done: a person checked with the shop",
            ),
            ("reconciled", None, None, None, "resolved by a person"),
            ("something_new", None, None, None, "unknown"),
        ];
        for (status, resolution, external_id, last_error, expected) in cases {
            assert_eq!(
                plain(status, resolution, external_id, last_error),
                expected,
                "{status}"
            );
        }
    }

    #[test]
    fn a_confirmation_rides_on_the_webhook_answer_with_its_two_buttons() {
        let token = "t1_00112233445566778899aabbccddeeff";
        let answer = Answer {
            chat_id: 7,
            text: "Issue a coupon for spring?".to_owned(),
            keyboard: Some(confirmation(token)),
        };
        assert_eq!(
            answer.webhook_call(),
            serde_json::json!({
                "method": "sendMessage",
                "chat_id": 7,
                "text": "Issue a coupon for spring?",
                "reply_markup": { "inline_keyboard": [[
                    { "text": "Confirm", "callback_data": token },
                    { "text": "Cancel", "callback_data": format!("{token}-cancel") },
                ]] },
            })
        );
        let plain = Answer {
            keyboard: None,
            ..answer
        };
        assert!(plain.webhook_call().get("reply_markup").is_none());
    }

    #[test]
    fn the_repeat_guards_epoch_is_not_shown() {
        assert_eq!(visible_key("spring:42#3"), "spring:42");
        assert_eq!(visible_key("spring:42"), "spring:42");
    }
}
