//! Deterministic stream ids and operation ids, derived only from stable inputs.
//!
//! A retry of the same update or the same business action must land on the same stream, so no
//! id here ever depends on the receipt time or a random number.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::error::{IdError, NameKind};

/// The longest bot or action name, in bytes. It keeps room in a bounded stream id for the key.
pub const MAX_NAME_LEN: usize = 64;

/// The longest operation stream id, in bytes; longer business keys are hashed.
pub const MAX_OPERATION_STREAM_LEN: usize = 200;

/// How many hex characters of the key's SHA-256 a hashed operation stream id keeps (128 bits).
const KEY_HASH_HEX_LEN: usize = 32;

/// Separates a hashed key's readable prefix from its hash; a key containing it is always hashed.
const HASH_MARKER: char = '~';

/// The namespace of every [`OperationId`]. Changing it would change every id ever issued.
pub const OPERATION_NAMESPACE: Uuid = Uuid::from_u128(0x66943fff_f64d_4c5e_86e7_6f32c885e861);

/// The stable id of one business action, sent to external services as the `Idempotency-Key`.
///
/// It is a UUIDv5 of the action and the business key, so every instance, every retry and every
/// replay computes the same id for the same action without coordination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OperationId(Uuid);

impl OperationId {
    /// The id of `action` on `business_key`: UUIDv5 over `"{action}\0{business_key}"`.
    pub fn new(action: &str, business_key: &str) -> Self {
        let name = format!("{action}\u{0}{business_key}");
        Self(Uuid::new_v5(&OPERATION_NAMESPACE, name.as_bytes()))
    }

    /// Wraps an id read from elsewhere (a CLI argument, a projection row).
    pub fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    /// The underlying UUID.
    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl fmt::Display for OperationId {
    /// Hyphenated lower-case UUID, the form sent as `Idempotency-Key`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

/// Checks a bot or action name: 1 to [`MAX_NAME_LEN`] bytes of ASCII `[a-z0-9_]`.
///
/// Names become parts of stream ids separated by `-`, so a name must never contain one.
pub fn validate_name(kind: NameKind, name: &str) -> Result<(), IdError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if valid {
        Ok(())
    } else {
        Err(IdError::InvalidName {
            kind,
            name: name.to_owned(),
        })
    }
}

/// The Delivery stream of one Telegram update: `update-{bot}-{update_id}`.
pub fn delivery_stream(bot: &str, update_id: i64) -> Result<String, IdError> {
    validate_name(NameKind::Bot, bot)?;
    Ok(format!("update-{bot}-{update_id}"))
}

/// The Operation stream of one business action: `op-{action}-{business_key}`.
///
/// The key is used as it is when the whole id fits in [`MAX_OPERATION_STREAM_LEN`] bytes and the
/// key has no control character and no `~`. Otherwise the key is replaced by a readable prefix
/// (control characters and `~` removed, cut at a character boundary so that the id fits),
/// then `~`, then the first 32 hex characters of the SHA-256 of the full key. A plain key never
/// contains `~` and a hashed one always does, so two different keys never share a stream.
pub fn operation_stream(action: &str, business_key: &str) -> Result<String, IdError> {
    validate_name(NameKind::Action, action)?;
    if business_key.is_empty() {
        return Err(IdError::EmptyBusinessKey);
    }
    Ok(bounded(format!("op-{action}-"), business_key))
}

/// The RepeatGuard stream of one user's repeats of one command:
/// `recent-{bot}-{chat}-{user}-{normalized command}` (`-` for a missing chat or user), with
/// the command shortened and hashed like an operation's key when the id would be too long.
pub fn repeat_guard_stream(
    bot: &str,
    chat_id: Option<i64>,
    user_id: Option<i64>,
    normalized_command: &str,
) -> Result<String, IdError> {
    validate_name(NameKind::Bot, bot)?;
    if normalized_command.is_empty() {
        return Err(IdError::EmptyBusinessKey);
    }
    let id = |v: Option<i64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
    let head = format!("recent-{bot}-{}-{}-", id(chat_id), id(user_id));
    Ok(bounded(head, normalized_command))
}

/// `head` followed by `key` when that fits in [`MAX_OPERATION_STREAM_LEN`] bytes and the key has
/// no control character and no `~`; otherwise by a readable prefix of the key (control
/// characters and `~` removed, cut at a character boundary), `~`, and the first 32 hex
/// characters of the key's SHA-256.
fn bounded(head: String, key: &str) -> String {
    let fits = head.len() + key.len() <= MAX_OPERATION_STREAM_LEN;
    let plain = !key.chars().any(|c| c.is_control() || c == HASH_MARKER);
    if fits && plain {
        return head + key;
    }
    let hash = hex::encode(Sha256::digest(key.as_bytes()));
    let budget = MAX_OPERATION_STREAM_LEN - head.len() - HASH_MARKER.len_utf8() - KEY_HASH_HEX_LEN;
    let mut id = head;
    let mut used = 0;
    for c in key.chars().filter(|c| !c.is_control() && *c != HASH_MARKER) {
        if used + c.len_utf8() > budget {
            break;
        }
        used += c.len_utf8();
        id.push(c);
    }
    id.push(HASH_MARKER);
    id.push_str(&hash[..KEY_HASH_HEX_LEN]);
    id
}

/// The CallbackToken stream of one button token: `cb-{token}`.
pub fn callback_stream(token: &str) -> Result<String, IdError> {
    validate_token(token)?;
    Ok(format!("cb-{token}"))
}

/// The longest callback token: Telegram's `callback_data` holds 1 to 64 bytes.
pub const MAX_TOKEN_LEN: usize = 64;

/// Checks a callback token: 1 to [`MAX_TOKEN_LEN`] bytes of URL-safe ASCII `[A-Za-z0-9_-]`.
///
/// Tokens arrive in `callback_data` from anyone who can press a button, so they are checked
/// before they name a stream.
pub fn validate_token(token: &str) -> Result<(), IdError> {
    if token.is_empty() || token.len() > MAX_TOKEN_LEN {
        return Err(IdError::InvalidToken {
            reason: "it must be 1 to 64 bytes long",
        });
    }
    if !token
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(IdError::InvalidToken {
            reason: "it may only contain A-Z, a-z, 0-9, _ and -",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashed_stream_budget_leaves_room_for_a_prefix() {
        let longest_head = "op-".len() + MAX_NAME_LEN + "-".len();
        assert!(longest_head + 1 + KEY_HASH_HEX_LEN < MAX_OPERATION_STREAM_LEN);
    }
}
