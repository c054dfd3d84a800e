//! The CallbackToken aggregate: one-time tokens carried by inline buttons.
//!
//! A token lives in the stream `cb-{token}`. It is issued for one user with an expiry and is
//! used at most once: consumed (a click that starts its action) or cancelled (the *Cancel*
//! button of a confirmation, [`cancel_data`]); every refused click (used already, another user,
//! expired, never issued) is recorded as `TokenRejected` and starts nothing.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregate::Aggregate;
use crate::error::{IssueRejection, NameKind};
use crate::event::domain_events;
use crate::ids::{MAX_TOKEN_LEN, OperationId, validate_name, validate_token};

/// How many random bytes [`mint_token`] takes: 128 bits, beyond guessing.
pub const TOKEN_RANDOM_BYTES: usize = 16;

/// The prefix of minted tokens; it names the format so that a later one can differ.
pub const TOKEN_PREFIX: &str = "t1_";

/// Mints a token from random bytes the caller drew (the domain has no random source).
///
/// The token is `t1_` followed by the bytes in lower-case hex: 35 URL-safe bytes, within the
/// 64 bytes of Telegram's `callback_data`.
pub fn mint_token(random: &[u8; TOKEN_RANDOM_BYTES]) -> String {
    let token = format!("{TOKEN_PREFIX}{}", hex::encode(random));
    debug_assert!(token.len() <= MAX_TOKEN_LEN);
    token
}

/// What follows a token in the callback data of its *Cancel* button (see [`cancel_data`]).
pub const CANCEL_SUFFIX: &str = "-cancel";

/// The callback data of the *Cancel* button that goes with `token`'s button: a click on it
/// cancels the token, so that a later click on the token itself is refused. A minted token
/// (35 bytes) and the suffix fit Telegram's 64 bytes of `callback_data`.
pub fn cancel_data(token: &str) -> String {
    format!("{token}{CANCEL_SUFFIX}")
}

/// What a click asks of a token, read from its callback data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Click<'a> {
    /// The token's own button: consume it, and start its action.
    Use(&'a str),
    /// The *Cancel* button that goes with the token: cancel it.
    Cancel(&'a str),
}

impl<'a> Click<'a> {
    /// The click that `data` carries, if it names one of our tokens (minted with
    /// [`TOKEN_PREFIX`]); any other callback data belongs to the bot's own buttons. The token
    /// is not validated here: its stream id is.
    pub fn read(data: &'a str) -> Option<Self> {
        if !data.starts_with(TOKEN_PREFIX) {
            return None;
        }
        Some(match data.strip_suffix(CANCEL_SUFFIX) {
            Some(token) => Click::Cancel(token),
            None => Click::Use(data),
        })
    }

    /// The token the click names.
    pub fn token(&self) -> &'a str {
        match self {
            Click::Use(token) | Click::Cancel(token) => token,
        }
    }

    /// The command the click is, by `user_id` in update `update_id`.
    pub fn command(&self, user_id: i64, update_id: i64) -> CallbackTokenCommand {
        match self {
            Click::Use(_) => CallbackTokenCommand::Consume { user_id, update_id },
            Click::Cancel(_) => CallbackTokenCommand::Cancel { user_id, update_id },
        }
    }
}

domain_events! {
    /// Everything that can happen to one button token.
    pub enum CallbackTokenEvent / CallbackTokenEventKind {
        /// The token was issued; always the first event of a token that works.
        TokenIssued,
        /// The token's one click was accepted.
        TokenConsumed,
        /// The token was cancelled by its user (a confirmation's *Cancel*): it starts nothing,
        /// now or later.
        TokenCancelled,
        /// A click was refused and recorded; it starts nothing.
        TokenRejected,
    }
}

/// A token was issued for one user's button.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenIssued {
    /// The token, as carried in `callback_data`.
    pub token: String,
    /// The action a click asks for.
    pub action: String,
    /// The operation the button belongs to, when there is one.
    pub operation_id: Option<OperationId>,
    /// The only user whose click counts.
    pub user_id: i64,
    /// The chat the button was sent to.
    pub chat_id: Option<i64>,
    /// When the token stops working.
    pub expires_at: DateTime<Utc>,
    /// The parameters a click carries into the action.
    pub payload: BTreeMap<String, String>,
}

/// The token's one click was accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenConsumed {
    /// The user who clicked.
    pub user_id: i64,
    /// The update that carried the click.
    pub update_id: i64,
}

/// The token was cancelled by its user: a later click on it is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenCancelled {
    /// The user who clicked *Cancel*.
    pub user_id: i64,
    /// The update that carried the click.
    pub update_id: i64,
}

/// Why a click was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenRejection {
    /// The token was consumed before.
    AlreadyConsumed,
    /// The token was cancelled before.
    Cancelled,
    /// The token was issued for another user.
    WrongUser,
    /// The token expired.
    Expired,
    /// No such token was issued (forged or stale `callback_data`).
    NotIssued,
}

/// A click was refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRejected {
    /// Why.
    pub reason: TokenRejection,
    /// The user who clicked.
    pub user_id: i64,
    /// The update that carried the click.
    pub update_id: i64,
}

/// What the bot and intake ask of a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallbackTokenCommand {
    /// Issue the token; refused if the stream has any history.
    Issue(TokenIssued),
    /// A user clicked the button.
    Consume {
        /// The user who clicked.
        user_id: i64,
        /// The update that carried the click.
        update_id: i64,
    },
    /// A user clicked the *Cancel* button that goes with the token.
    Cancel {
        /// The user who clicked.
        user_id: i64,
        /// The update that carried the click.
        update_id: i64,
    },
}

/// Where a token stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum TokenStatus {
    /// Not issued (the stream is empty or holds only refused clicks).
    #[default]
    NotIssued,
    /// Issued and not consumed.
    Issued,
    /// Consumed.
    Consumed,
    /// Cancelled.
    Cancelled,
}

/// One token's state: what a click's decision needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallbackToken {
    /// Where the token stands.
    pub status: TokenStatus,
    /// The user it was issued for.
    pub user_id: Option<i64>,
    /// When it expires.
    pub expires_at: Option<DateTime<Utc>>,
    /// The update whose click consumed (or cancelled) it.
    pub consumed_by_update: Option<i64>,
    /// How many clicks were refused.
    pub rejections: u32,
    /// How many events were applied: the expected version of the next append.
    pub version: u64,
}

impl CallbackToken {
    /// Rebuilds a token from its stream's events.
    pub fn replay<'a>(events: impl IntoIterator<Item = &'a CallbackTokenEvent>) -> Self {
        events.into_iter().fold(Self::default(), evolve)
    }
}

/// Decides what a command appends at `now`.
///
/// A click (`Consume` or `Cancel`) always appends one event, accepted or refused; the checks
/// run in this order: not issued, wrong user, already consumed, cancelled, expired. Only a
/// malformed or repeated `Issue` is an `Err`.
pub fn decide(
    state: &CallbackToken,
    command: &CallbackTokenCommand,
    now: DateTime<Utc>,
) -> Result<Vec<CallbackTokenEvent>, IssueRejection> {
    let event = match command {
        CallbackTokenCommand::Issue(issued) => {
            if let Some(expires_at) = state.expires_at {
                return Err(IssueRejection::AlreadyIssued { expires_at });
            }
            if state.version > 0 {
                return Err(IssueRejection::NotFresh);
            }
            if validate_token(&issued.token).is_err() {
                return Err(invalid(
                    "token must be 1 to 64 bytes from A-Z, a-z, 0-9, _ and -",
                ));
            }
            if validate_name(NameKind::Action, &issued.action).is_err() {
                return Err(invalid(
                    "action must be 1 to 64 characters from a-z, 0-9 and _",
                ));
            }
            if issued.expires_at <= now {
                return Err(invalid("expires_at must be after now"));
            }
            issued.clone().into()
        }
        CallbackTokenCommand::Consume { user_id, update_id }
        | CallbackTokenCommand::Cancel { user_id, update_id } => {
            let (user_id, update_id) = (*user_id, *update_id);
            let refusal = match (state.status, state.user_id, state.expires_at) {
                (TokenStatus::NotIssued, _, _) => Some(TokenRejection::NotIssued),
                (_, Some(owner), _) if owner != user_id => Some(TokenRejection::WrongUser),
                (TokenStatus::Consumed, _, _) => Some(TokenRejection::AlreadyConsumed),
                (TokenStatus::Cancelled, _, _) => Some(TokenRejection::Cancelled),
                (_, _, Some(expires_at)) if now >= expires_at => Some(TokenRejection::Expired),
                _ => None,
            };
            match (refusal, command) {
                (Some(reason), _) => TokenRejected {
                    reason,
                    user_id,
                    update_id,
                }
                .into(),
                (None, CallbackTokenCommand::Cancel { .. }) => {
                    TokenCancelled { user_id, update_id }.into()
                }
                (None, _) => TokenConsumed { user_id, update_id }.into(),
            }
        }
    };
    Ok(vec![event])
}

/// Applies one event to the state.
pub fn evolve(mut state: CallbackToken, event: &CallbackTokenEvent) -> CallbackToken {
    state.version += 1;
    match event {
        CallbackTokenEvent::TokenIssued(e) => {
            state.status = TokenStatus::Issued;
            state.user_id = Some(e.user_id);
            state.expires_at = Some(e.expires_at);
        }
        CallbackTokenEvent::TokenConsumed(e) => {
            state.status = TokenStatus::Consumed;
            state.consumed_by_update = Some(e.update_id);
        }
        CallbackTokenEvent::TokenCancelled(e) => {
            state.status = TokenStatus::Cancelled;
            state.consumed_by_update = Some(e.update_id);
        }
        CallbackTokenEvent::TokenRejected(_) => {
            state.rejections = state.rejections.saturating_add(1);
        }
    }
    state
}

fn invalid(reason: &'static str) -> IssueRejection {
    IssueRejection::InvalidCommand { reason }
}

impl Aggregate for CallbackToken {
    const STREAM_CATEGORY: &'static str = "cb";

    type Event = CallbackTokenEvent;
    type Command = CallbackTokenCommand;
    type Rejection = IssueRejection;

    fn decide(
        &self,
        command: &CallbackTokenCommand,
        now: DateTime<Utc>,
    ) -> Result<Vec<CallbackTokenEvent>, IssueRejection> {
        decide(self, command, now)
    }

    fn evolve(self, event: &CallbackTokenEvent) -> Self {
        evolve(self, event)
    }

    fn version(&self) -> u64 {
        self.version
    }
}
