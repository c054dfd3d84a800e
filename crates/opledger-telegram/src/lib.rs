//! Telegram at opledger's edge: the tolerant update envelope, command normalization, and a Bot
//! API client that never leaks the bot token.
//!
//! - [`parse_update`] turns the exact bytes Telegram sent into an [`Update`]: the `update_id`, the
//!   kind (unknown kinds included), the chat, user and date an action needs, a normalized
//!   [`Command`], the [`CallbackQuery`] fields, and the SHA-256 digest of the bytes. Anything that is
//!   not JSON or has no integer `update_id` becomes a [`Quarantine`] that holds the digest and size,
//!   never the body.
//! - [`BotApi`] calls the handful of Bot API methods opledger needs and sorts every failure into a
//!   [`BotApiError`] that tells whether the call certainly did not happen
//!   ([`BotApiError::is_definitely_not_delivered`]) or may have.
//! - [`form_data_fields`] reads the `multipart/form-data` form in which aiogram puts a Bot API
//!   call into its webhook answer.
//!
//! Architecture invariants: this crate keeps no message text beyond the parsed command; no error,
//! log line, `Debug` output or panic of this crate contains the bot token.

mod bot_api;
mod command;
mod error;
mod form_data;
/// Fuzz target bodies, shared with the corpus replay tests; not an API.
#[doc(hidden)]
pub mod fuzzing;
mod update;

pub use bot_api::{
    BotApi, InlineButton, InlineKeyboard, RawUpdate, SentMessage, SetWebhook, WebhookInfo,
};
pub use command::{Command, MAX_COMMAND_NAME_CHARS, NORMALIZATION_VERSION};
pub use error::{BotApiError, Quarantine, QuarantineReason};
pub use form_data::form_data_fields;
pub use update::{
    CallbackQuery, KNOWN_KINDS, MAX_OTHER_KIND_CHARS, Update, UpdateKind, parse_update,
};
