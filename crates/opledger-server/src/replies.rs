//! What the bot answers at intake, where answering is pure: `/help` from configuration,
//! `/status` and repeated requests from read models, usage for malformed commands. Asking twice
//! gives the same answer and starts nothing. Replies about an operation's outcome are the
//! worker's job, tracked as effects.

use opledger_config::ActionConfig;
use opledger_projections::operation_status::{self, Filter, OperationStatusRow, ReadError};
use opledger_store::AnyStore;

use crate::intake::{Recorded, Route};

/// How many operations `/status` lists.
const STATUS_LIMIT: u32 = 5;

/// A message to send to a chat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub chat_id: i64,
    pub text: String,
}

/// The answer an accepted update deserves at intake, if any.
pub async fn answer(
    store: &AnyStore,
    bot: &str,
    actions: &[&ActionConfig],
    recorded: &Recorded,
) -> Result<Option<Answer>, ReadError> {
    let Recorded::Accepted {
        chat_id: Some(chat_id),
        user_id,
        route,
        ..
    } = recorded
    else {
        return Ok(None);
    };
    let text = match route {
        Route::Help => help(actions),
        Route::Usage { action } => match actions.iter().find(|a| a.name == *action) {
            Some(action) => format!("Usage: {}", usage(action)),
            None => return Ok(None),
        },
        Route::Status { operation_id } => {
            status(store, bot, *user_id, operation_id.as_deref()).await?
        }
        Route::Joined(link) => {
            match operation_status::get(store.reader(), &link.operation_id.to_string()).await? {
                Some(row) => format!(
                    "You asked for this already: {}.",
                    describe(&row).trim_end_matches('.')
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
    }))
}

/// The id of the button click an update carries, when it is one that deserves an
/// `answerCallbackQuery` (accepted or a duplicate; never a collision or a quarantined body).
///
/// Telegram shows a progress indicator on the button until the query is answered, so every
/// click is answered at once, best effort, with the pure answer's text as a notice when there
/// is one; the outcome reply comes from the worker.
pub fn callback_to_answer(recorded: &Recorded, raw: &[u8]) -> Option<String> {
    let kind_allows = match recorded {
        Recorded::Accepted { kind, .. } => kind == "callback_query",
        Recorded::Duplicate { .. } => true,
        Recorded::Collision { .. } | Recorded::Quarantined { .. } => false,
    };
    if !kind_allows {
        return None;
    }
    opledger_telegram::parse_update(raw)
        .ok()
        .and_then(|update| update.callback)
        .map(|callback| callback.id)
        .filter(|id| !id.is_empty())
}

/// `/help`: the bot's commands, from configuration.
pub fn help(actions: &[&ActionConfig]) -> String {
    let mut lines = vec!["Commands:".to_owned()];
    let mut sorted: Vec<_> = actions.to_vec();
    sorted.sort_by(|a, b| a.command.cmp(&b.command));
    lines.extend(sorted.iter().map(|a| usage(a)));
    lines.push("/status: your recent requests (or /status <id> for one)".to_owned());
    lines.push("/help: this list".to_owned());
    lines.join("\n")
}

/// `/coupon <campaign>`.
fn usage(action: &ActionConfig) -> String {
    let mut usage = format!("/{}", action.command);
    for param in &action.params {
        usage.push_str(&format!(" <{param}>"));
    }
    usage
}

/// `/status`: the user's recent operations, or one by id, in plain words.
pub async fn status(
    store: &AnyStore,
    bot: &str,
    user_id: Option<i64>,
    operation_id: Option<&str>,
) -> Result<String, ReadError> {
    if let Some(id) = operation_id {
        let row = operation_status::get(store.reader(), id).await?;
        // Only the user's own operations are shown.
        return Ok(match row.filter(|r| r.bot == bot && r.user_id == user_id) {
            Some(row) => describe(&row),
            None => "No request with that id.".to_owned(),
        });
    }
    let Some(user_id) = user_id else {
        return Ok("No requests yet.".to_owned());
    };
    let rows = operation_status::list(
        store.reader(),
        &Filter {
            bot: Some(bot.to_owned()),
            user_id: Some(user_id),
            limit: STATUS_LIMIT,
            ..Filter::default()
        },
    )
    .await?;
    if rows.is_empty() {
        return Ok("No requests yet.".to_owned());
    }
    Ok(rows.iter().map(describe).collect::<Vec<_>>().join("\n"))
}

/// One operation in a line: what, state in plain words, and its id for `/status <id>`.
fn describe(row: &OperationStatusRow) -> String {
    format!(
        "{} {}: {} ({})",
        row.action,
        visible_key(&row.business_key),
        plain(&row.status),
        row.operation_id
    )
}

/// The business key without the repeat guard's epoch suffix.
fn visible_key(key: &str) -> &str {
    key.rsplit_once('#').map_or(key, |(key, _)| key)
}

/// A status in words a user understands.
pub fn plain(status: &str) -> &'static str {
    match status {
        "received" => "received, waiting to start",
        "claimed" | "call_sent" => "in progress",
        "retry_scheduled" => "waiting to try again",
        "needs_reconciliation" => "checking with the shop",
        "confirmed" => "done",
        "failed" => "failed",
        "reconciled" => "resolved by a person",
        _ => "unknown",
    }
}
