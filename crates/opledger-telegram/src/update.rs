//! The tolerant update envelope: reads the few fields opledger needs from the exact bytes of a
//! Telegram update and accepts everything else, including kinds and fields this version has never
//! heard of and updates that miss fields the Bot API calls required.

use std::borrow::Cow;
use std::fmt;

use chrono::{DateTime, Utc};
use opledger_domain::text::storable;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::command::{self, Command};
use crate::error::{Quarantine, QuarantineReason};

/// Longest field name, in characters, kept in [`UpdateKind::Other`]: an unknown key is stored and
/// shown, so its length is bounded (Telegram's own kinds are at most 25 characters).
pub const MAX_OTHER_KIND_CHARS: usize = 64;

macro_rules! update_kinds {
    ($($variant:ident => $key:literal,)*) => {
        /// Which kind of update this is: the one optional field of Telegram's `Update` object.
        ///
        /// Telegram keeps adding kinds, so an unknown top-level field is a real variant
        /// ([`UpdateKind::Other`]) that intake records like any other, never an error.
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum UpdateKind {
            $(
                #[doc = concat!("`", $key, "`")]
                $variant,
            )*
            /// A top-level field unknown to Bot API 10.1 (its name, cut to
            /// [`MAX_OTHER_KIND_CHARS`] characters); shown as `other:<key>`.
            Other(String),
            /// No field besides `update_id` at all; shown as `none`. Kept apart from `Other` so
            /// that a future kind literally named `none` (`other:none`) stays distinguishable.
            Empty,
        }

        /// Names of the update kinds of Bot API 10.1, in the order of the `Update` type's fields.
        pub const KNOWN_KINDS: &[&str] = &[$($key,)*];

        impl UpdateKind {
            /// The kind a top-level field name stands for: a known kind, or [`UpdateKind::Other`]
            /// (cut to [`MAX_OTHER_KIND_CHARS`] characters).
            pub fn from_key(key: &str) -> UpdateKind {
                match key {
                    $($key => UpdateKind::$variant,)*
                    // Kept in the ledger: as storable as any text from outside.
                    other => UpdateKind::Other(
                        storable(other).chars().take(MAX_OTHER_KIND_CHARS).collect(),
                    ),
                }
            }

            /// `"message"`, `"callback_query"`, ... for known kinds, `"other:<key>"` for unknown
            /// ones, `"none"` for an update without any kind field.
            pub fn as_str(&self) -> Cow<'static, str> {
                match self {
                    $(UpdateKind::$variant => Cow::Borrowed($key),)*
                    UpdateKind::Other(key) => Cow::Owned(format!("other:{key}")),
                    UpdateKind::Empty => Cow::Borrowed("none"),
                }
            }
        }
    };
}

update_kinds! {
    Message => "message",
    EditedMessage => "edited_message",
    ChannelPost => "channel_post",
    EditedChannelPost => "edited_channel_post",
    BusinessConnection => "business_connection",
    BusinessMessage => "business_message",
    EditedBusinessMessage => "edited_business_message",
    DeletedBusinessMessages => "deleted_business_messages",
    GuestMessage => "guest_message",
    MessageReaction => "message_reaction",
    MessageReactionCount => "message_reaction_count",
    InlineQuery => "inline_query",
    ChosenInlineResult => "chosen_inline_result",
    CallbackQuery => "callback_query",
    ShippingQuery => "shipping_query",
    PreCheckoutQuery => "pre_checkout_query",
    PurchasedPaidMedia => "purchased_paid_media",
    Poll => "poll",
    PollAnswer => "poll_answer",
    MyChatMember => "my_chat_member",
    ChatMember => "chat_member",
    ChatJoinRequest => "chat_join_request",
    ChatBoost => "chat_boost",
    RemovedChatBoost => "removed_chat_boost",
    ManagedBot => "managed_bot",
}

impl fmt::Display for UpdateKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.as_str())
    }
}

/// The fields of a pressed inline button that an action needs.
///
/// `data` is the button's `callback_data`: an opaque token opledger put there itself, not user text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallbackQuery {
    /// Query id, needed to answer the query (`answerCallbackQuery`).
    pub id: String,
    /// The button's `callback_data`; `None` for game buttons or a payload without it.
    pub data: Option<String>,
    /// Who pressed the button (in groups, anyone can: check it when the action is personal).
    pub from_user_id: Option<i64>,
    /// Chat of the message carrying the button; `None` for inline-mode messages.
    pub chat_id: Option<i64>,
    /// Id of the message carrying the button, also when that message is inaccessible.
    pub message_id: Option<i64>,
}

/// A Telegram update reduced to what intake and actions need.
///
/// It exists so that the rest of opledger never holds the raw body nor message text: the ledger
/// keeps these fields and the digest. Derived fields are `None` when the payload lacks them or
/// has them with the wrong type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    /// Telegram's `update_id`, read as an exact integer.
    pub update_id: i64,
    /// The kind of update.
    pub kind: UpdateKind,
    /// The chat the update happened in.
    pub chat_id: Option<i64>,
    /// Who caused the update: a user id, or the id of the chat acting as sender (anonymous admins,
    /// channels) when there is no user.
    pub user_id: Option<i64>,
    /// When the event happened. Telegram's `0` ("no date", as in inaccessible messages) is `None`.
    pub message_date: Option<DateTime<Utc>>,
    /// The command at the start of a `message` or `business_message` text or caption.
    pub text_command: Option<Command>,
    /// The pressed button, for `callback_query` updates.
    pub callback: Option<CallbackQuery>,
    /// Lower-case hex SHA-256 of the exact bytes received.
    pub digest: String,
    /// Number of bytes received.
    pub size: usize,
}

/// Reads an update from the exact bytes Telegram sent.
///
/// Accepts any JSON object with an integer `update_id`, whatever else it holds or lacks. Anything
/// else is a [`Quarantine`] carrying the digest and size (never the body).
///
/// The kind is, in this order: the first known kind field present (in Bot API order; Telegram
/// sends at most one); else an unknown field holding an object (alphabetically first), since kinds
/// are objects; else any other unknown field (alphabetically first); else [`UpdateKind::Empty`].
///
/// Commands are read from `message` and `business_message` only: an `edited_message` can be
/// triggered by changes the user did not make and must not repeat a command, channel posts have no
/// user to act for, and other kinds have no command text.
pub fn parse_update(raw: &[u8]) -> Result<Update, Quarantine> {
    let digest = hex::encode(Sha256::digest(raw));
    let size = raw.len();
    let quarantine = |reason| Quarantine {
        reason,
        digest: digest.clone(),
        size,
    };
    let value: Value =
        serde_json::from_slice(raw).map_err(|_| quarantine(QuarantineReason::NotJson))?;
    let object = value
        .as_object()
        .ok_or_else(|| quarantine(QuarantineReason::NotAnObject))?;
    let update_id = object
        .get("update_id")
        .and_then(Value::as_i64)
        .ok_or_else(|| quarantine(QuarantineReason::NoUpdateId))?;

    let (kind, payload) = kind_of(object);
    let payload = payload.unwrap_or(&Value::Null);
    let derived = derive(&kind, payload);
    Ok(Update {
        update_id,
        kind,
        chat_id: derived.chat_id,
        user_id: derived.user_id,
        message_date: derived.date,
        text_command: derived.command,
        callback: derived.callback,
        digest,
        size,
    })
}

/// Picks the kind field (see [`parse_update`]) and returns it with its value.
fn kind_of(object: &Map<String, Value>) -> (UpdateKind, Option<&Value>) {
    if let Some((key, value)) = KNOWN_KINDS
        .iter()
        .find_map(|key| object.get_key_value(*key))
    {
        return (UpdateKind::from_key(key), Some(value));
    }
    // Explicit ordering, so the choice does not depend on serde_json's map order.
    object
        .iter()
        .filter(|(key, _)| *key != "update_id")
        .min_by_key(|(key, value)| (!value.is_object(), key.as_str()))
        .map_or((UpdateKind::Empty, None), |(key, value)| {
            (UpdateKind::from_key(key), Some(value))
        })
}

#[derive(Default)]
struct Derived {
    chat_id: Option<i64>,
    user_id: Option<i64>,
    date: Option<DateTime<Utc>>,
    command: Option<Command>,
    callback: Option<CallbackQuery>,
}

/// Reads chat, user, date, command and callback from the kind's payload, per the Bot API type of
/// that kind.
fn derive(kind: &UpdateKind, p: &Value) -> Derived {
    use UpdateKind as K;
    match kind {
        K::Message | K::BusinessMessage => Derived {
            command: command::from_message(p),
            ..message_like(p)
        },
        K::EditedMessage
        | K::ChannelPost
        | K::EditedChannelPost
        | K::EditedBusinessMessage
        | K::GuestMessage => message_like(p),
        K::BusinessConnection => Derived {
            chat_id: int(p, &["user_chat_id"]),
            user_id: int(p, &["user", "id"]),
            date: date(p, &["date"]),
            ..Derived::default()
        },
        K::DeletedBusinessMessages => Derived {
            chat_id: int(p, &["chat", "id"]),
            ..Derived::default()
        },
        K::MessageReaction => Derived {
            chat_id: int(p, &["chat", "id"]),
            user_id: int(p, &["user", "id"]).or_else(|| int(p, &["actor_chat", "id"])),
            date: date(p, &["date"]),
            ..Derived::default()
        },
        K::MessageReactionCount => Derived {
            chat_id: int(p, &["chat", "id"]),
            date: date(p, &["date"]),
            ..Derived::default()
        },
        K::InlineQuery
        | K::ChosenInlineResult
        | K::ShippingQuery
        | K::PreCheckoutQuery
        | K::PurchasedPaidMedia => Derived {
            user_id: int(p, &["from", "id"]),
            ..Derived::default()
        },
        K::CallbackQuery => Derived {
            chat_id: int(p, &["message", "chat", "id"]),
            user_id: int(p, &["from", "id"]),
            // An inaccessible message has date 0, which `date` turns into `None`.
            date: date(p, &["message", "date"]),
            callback: callback(p),
            ..Derived::default()
        },
        K::PollAnswer => Derived {
            user_id: int(p, &["user", "id"]).or_else(|| int(p, &["voter_chat", "id"])),
            ..Derived::default()
        },
        K::MyChatMember | K::ChatMember | K::ChatJoinRequest => Derived {
            chat_id: int(p, &["chat", "id"]),
            user_id: int(p, &["from", "id"]),
            date: date(p, &["date"]),
            ..Derived::default()
        },
        // The booster is the user behind a boost (absent for some giveaway boosts).
        K::ChatBoost => Derived {
            chat_id: int(p, &["chat", "id"]),
            user_id: int(p, &["boost", "source", "user", "id"]),
            date: date(p, &["boost", "add_date"]),
            ..Derived::default()
        },
        K::RemovedChatBoost => Derived {
            chat_id: int(p, &["chat", "id"]),
            user_id: int(p, &["source", "user", "id"]),
            date: date(p, &["remove_date"]),
            ..Derived::default()
        },
        K::ManagedBot => Derived {
            user_id: int(p, &["user", "id"]),
            ..Derived::default()
        },
        K::Poll | K::Other(_) | K::Empty => Derived::default(),
    }
}

/// The `Message` kinds: the chat, the sender (a user, or the chat that sent on its own behalf),
/// the date.
fn message_like(p: &Value) -> Derived {
    Derived {
        chat_id: int(p, &["chat", "id"]),
        user_id: int(p, &["from", "id"]).or_else(|| int(p, &["sender_chat", "id"])),
        date: date(p, &["date"]),
        ..Derived::default()
    }
}

fn callback(p: &Value) -> Option<CallbackQuery> {
    Some(CallbackQuery {
        id: storable(p.get("id")?.as_str()?).into_owned(),
        data: p
            .get("data")
            .and_then(Value::as_str)
            .map(|data| storable(data).into_owned()),
        from_user_id: int(p, &["from", "id"]),
        chat_id: int(p, &["message", "chat", "id"]),
        message_id: int(p, &["message", "message_id"]),
    })
}

fn at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(value, |v, key| v.get(*key))
}

/// An exact integer: never read through `f64`, so ids near 2^53 and beyond stay exact, and a
/// fractional or out-of-range number is `None`.
fn int(value: &Value, path: &[&str]) -> Option<i64> {
    at(value, path)?.as_i64()
}

/// A Unix time in seconds; `0` and negative values mean "no date".
fn date(value: &Value, path: &[&str]) -> Option<DateTime<Utc>> {
    int(value, path)
        .filter(|seconds| *seconds > 0)
        .and_then(|seconds| DateTime::from_timestamp(seconds, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Update {
        parse_update(text.as_bytes()).expect("an accepted update")
    }

    fn quarantined(text: &[u8]) -> QuarantineReason {
        parse_update(text).expect_err("a quarantined body").reason
    }

    #[test]
    fn bodies_without_an_integer_update_id_are_quarantined() {
        use QuarantineReason::*;
        let cases: &[(&[u8], QuarantineReason)] = &[
            (b"not json", NotJson),
            (b"", NotJson),
            (b"{\"update_id\": 1", NotJson),
            (b"\xff\xfe", NotJson),
            (b"[]", NotAnObject),
            (b"5", NotAnObject),
            (b"\"update_id\"", NotAnObject),
            (b"null", NotAnObject),
            (b"{}", NoUpdateId),
            (b"{\"update_id\": \"5\"}", NoUpdateId),
            (b"{\"update_id\": 1.5}", NoUpdateId),
            (b"{\"update_id\": 5.0}", NoUpdateId),
            (b"{\"update_id\": 1e3}", NoUpdateId),
            (b"{\"update_id\": null}", NoUpdateId),
            (b"{\"update_id\": 9223372036854775808}", NoUpdateId),
            (b"{\"update_id\": 18446744073709551616}", NoUpdateId),
            (
                b"{\"update_id\": 123456789012345678901234567890}",
                NoUpdateId,
            ),
            (b"{\"message\": {\"text\": \"hi\"}}", NoUpdateId),
        ];
        for (body, reason) in cases {
            assert_eq!(
                quarantined(body),
                *reason,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn a_quarantine_keeps_digest_and_size_but_not_the_body() {
        let body = b"{\"secret text\": \"do not keep me\"}";
        let q = parse_update(body).expect_err("no update_id");
        assert_eq!(q.size, body.len());
        assert_eq!(q.digest, hex::encode(Sha256::digest(body)));
        for shown in [format!("{q}"), format!("{q:?}")] {
            assert!(!shown.contains("do not keep me"), "{shown}");
        }
    }

    #[test]
    fn extreme_integer_update_ids_are_exact() {
        assert_eq!(
            parse("{\"update_id\": 9223372036854775807}").update_id,
            i64::MAX
        );
        assert_eq!(parse("{\"update_id\": -1}").update_id, -1);
        assert_eq!(
            parse("{\"update_id\": 9007199254740993}").update_id,
            9_007_199_254_740_993
        );
    }

    #[test]
    fn digest_is_sha256_of_the_exact_bytes() {
        let compact = parse("{\"update_id\":1}");
        let spaced = parse("{ \"update_id\": 1 }");
        assert_eq!(compact.update_id, spaced.update_id);
        assert_ne!(compact.digest, spaced.digest);
        // Computed independently: `printf '{"update_id":1}' | sha256sum`.
        assert_eq!(
            compact.digest,
            "fb6e1dd6334c3500ac3f7b1034dae6c90c82223a7a604c658bb95e03c6408e80"
        );
        assert_eq!(compact.size, 15);
        // A well-known vector: SHA-256 of the empty string.
        assert_eq!(
            parse_update(b"").expect_err("not json").digest,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn unknown_kinds_are_accepted_and_named() {
        let u = parse("{\"update_id\": 7, \"future_thing\": {\"a\": 1}}");
        assert_eq!(u.kind, UpdateKind::Other("future_thing".to_owned()));
        assert_eq!(u.kind.as_str(), "other:future_thing");
        assert_eq!((u.chat_id, u.user_id, u.message_date), (None, None, None));

        // A known kind wins over unknown extra fields.
        let u = parse("{\"update_id\": 7, \"aaa\": {}, \"poll\": {\"id\": \"p\"}}");
        assert_eq!(u.kind, UpdateKind::Poll);

        // Among unknown fields an object wins (kinds are objects), then the alphabetical first.
        let u = parse("{\"update_id\": 7, \"a_flag\": true, \"z_kind\": {}, \"y_kind\": {}}");
        assert_eq!(u.kind.as_str(), "other:y_kind");
        let u = parse("{\"update_id\": 7, \"b\": 1, \"a\": 2}");
        assert_eq!(u.kind.as_str(), "other:a");
    }

    #[test]
    fn an_update_without_any_kind_field_is_accepted_as_none() {
        let u = parse("{\"update_id\": 7}");
        assert_eq!(u.kind, UpdateKind::Empty);
        assert_eq!(u.kind.as_str(), "none");
        assert_eq!(
            parse("{\"update_id\": 7, \"none\": {}}").kind.as_str(),
            "other:none"
        );
    }

    #[test]
    fn long_unknown_keys_are_cut() {
        let key = "k".repeat(300);
        let u = parse(&format!("{{\"update_id\": 1, \"{key}\": {{}}}}"));
        assert_eq!(u.kind, UpdateKind::Other("k".repeat(MAX_OTHER_KIND_CHARS)));
    }

    #[test]
    fn known_kind_names_round_trip() {
        assert_eq!(KNOWN_KINDS.len(), 25);
        for key in KNOWN_KINDS {
            let kind = UpdateKind::from_key(key);
            assert!(!matches!(kind, UpdateKind::Other(_)), "{key}");
            assert_eq!(kind.as_str(), *key);
            assert_eq!(kind.to_string(), *key);
        }
    }

    #[test]
    fn wrong_types_of_optional_fields_make_that_field_none() {
        let u = parse(
            r#"{"update_id": 1, "message": {"chat": {"id": "12"}, "from": {"id": 1.5}, "date": "today", "text": 5}}"#,
        );
        assert_eq!(u.kind, UpdateKind::Message);
        assert_eq!(
            (u.chat_id, u.user_id, u.message_date, u.text_command),
            (None, None, None, None)
        );

        let u = parse(r#"{"update_id": 1, "message": null}"#);
        assert_eq!(u.kind, UpdateKind::Message);
        assert_eq!((u.chat_id, u.user_id), (None, None));

        let u = parse(r#"{"update_id": 1, "callback_query": {"id": 5, "from": {"id": 3}}}"#);
        assert_eq!(u.user_id, Some(3));
        assert_eq!(
            u.callback, None,
            "a query without a string id cannot be answered"
        );
    }

    #[test]
    fn message_date_and_sender_chat() {
        let u = parse(
            r#"{"update_id": 1, "message": {"chat": {"id": -100}, "sender_chat": {"id": -100}, "date": 1700000000, "text": "hello"}}"#,
        );
        assert_eq!(u.user_id, Some(-100));
        assert_eq!(u.message_date, DateTime::from_timestamp(1_700_000_000, 0));
        assert_eq!(u.text_command, None);
    }

    #[test]
    fn callback_on_an_inaccessible_message_has_no_date() {
        let u = parse(
            r#"{"update_id": 1, "callback_query": {"id": "q", "from": {"id": 5}, "chat_instance": "c",
                "message": {"chat": {"id": 9}, "message_id": 44, "date": 0}, "data": "tok"}}"#,
        );
        assert_eq!(u.chat_id, Some(9));
        assert_eq!(u.message_date, None);
        assert_eq!(
            u.callback,
            Some(CallbackQuery {
                id: "q".to_owned(),
                data: Some("tok".to_owned()),
                from_user_id: Some(5),
                chat_id: Some(9),
                message_id: Some(44),
            })
        );
    }

    #[test]
    fn commands_come_from_message_and_business_message_only() {
        for kind in ["message", "business_message"] {
            let u = parse(&format!(
                r#"{{"update_id": 1, "{kind}": {{"chat": {{"id": 1}}, "text": "/Start@Bot  x"}}}}"#
            ));
            assert_eq!(
                u.text_command.map(|c| c.normalized()),
                Some("start x".to_owned()),
                "{kind}"
            );
        }
        for kind in [
            "edited_message",
            "channel_post",
            "edited_channel_post",
            "edited_business_message",
            "guest_message",
        ] {
            let u = parse(&format!(
                r#"{{"update_id": 1, "{kind}": {{"chat": {{"id": 1}}, "text": "/start"}}}}"#
            ));
            assert_eq!(u.text_command, None, "{kind}");
            assert_eq!(u.chat_id, Some(1), "{kind}");
        }
    }

    #[test]
    fn poll_answer_from_an_anonymous_voter_chat() {
        let u = parse(
            r#"{"update_id": 1, "poll_answer": {"poll_id": "p", "voter_chat": {"id": -1001}, "option_ids": [1]}}"#,
        );
        assert_eq!(u.user_id, Some(-1001));
        assert_eq!(u.chat_id, None);
    }
}
