//! What the ledger keeps of text that came from outside (ADR 0010).
//!
//! PostgreSQL's `text` cannot hold U+0000, SQLite's can, and JSON can carry it (`\u0000`) from
//! any user, service or API. So that no input can poison an append (and make Telegram retry a
//! chat forever) or stall a read model, and so that a ledger's events and hash chain never depend
//! on its backend, every edge keeps outside text as [`storable`] makes it, before deciding
//! anything with it: U+0000 becomes U+FFFD (the replacement character, which says "a character
//! was here that could not be kept"). Every other character is kept as it came, so text without
//! U+0000 is untouched, byte for byte. Events written before this rule may still hold U+0000
//! (on SQLite, or on PostgreSQL where only a read model refused it): [`from_stored_json`], which
//! every event and metadata decoding goes through, reads them as if written under it, so no
//! read model stalls on them and every reader sees the same text.

use std::borrow::Cow;

use serde::de::DeserializeOwned;
use serde_json::Value;

/// The one character a backend refuses in text.
const REFUSED: char = '\0';
/// What it is kept as.
const REPLACEMENT: char = '\u{FFFD}';

/// `text` as the ledger keeps it: U+0000 replaced by U+FFFD; borrowed when nothing changes.
pub fn storable(text: &str) -> Cow<'_, str> {
    if text.contains(REFUSED) {
        Cow::Owned(text.replace(REFUSED, &REPLACEMENT.to_string()))
    } else {
        Cow::Borrowed(text)
    }
}

/// [`storable`] for an owned string: no copy when nothing changes.
pub fn storable_string(text: String) -> String {
    match storable(&text) {
        Cow::Borrowed(_) => text,
        Cow::Owned(replaced) => replaced,
    }
}

/// [`storable`] applied to every string of a JSON value, object keys included.
pub fn storable_value(value: Value) -> Value {
    match value {
        Value::String(text) => Value::String(storable_string(text)),
        Value::Array(items) => Value::Array(items.into_iter().map(storable_value).collect()),
        Value::Object(fields) => Value::Object(
            fields
                .into_iter()
                .map(|(key, value)| (storable_string(key), storable_value(value)))
                .collect(),
        ),
        other => other,
    }
}

/// Reads stored JSON (an event's payload or metadata) with every string [`storable`]. Only a
/// payload that spells `\u0000` takes the slower way through a [`Value`]; the bytes stay as
/// they were stored and hashed.
pub(crate) fn from_stored_json<T: DeserializeOwned>(bytes: &[u8]) -> serde_json::Result<T> {
    const ESCAPED_NUL: &[u8] = br"\u0000";
    if bytes.windows(ESCAPED_NUL.len()).any(|w| w == ESCAPED_NUL) {
        let value: Value = serde_json::from_slice(bytes)?;
        serde_json::from_value(storable_value(value))
    } else {
        serde_json::from_slice(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn nul_becomes_the_replacement_character_and_nothing_else_changes() {
        assert_eq!(storable("spr\0ing"), "spr\u{FFFD}ing");
        assert_eq!(storable("\0\0"), "\u{FFFD}\u{FFFD}");
        assert!(matches!(storable("plain \u{7} text ü"), Cow::Borrowed(_)));
        assert_eq!(storable_string("ext-1\0x".to_owned()), "ext-1\u{FFFD}x");
        let value = serde_json::json!({"a\u{0}": ["x\u{0}", 1, {"b": "\u{0}"}], "n": null});
        assert_eq!(
            storable_value(value),
            serde_json::json!({"a\u{FFFD}": ["x\u{FFFD}", 1, {"b": "\u{FFFD}"}], "n": null})
        );
    }

    #[test]
    fn stored_json_is_read_storable() {
        let read: std::collections::BTreeMap<String, String> =
            from_stored_json(br#"{"k\u0000":"a\u0000b","plain":"x\\u0000"}"#).expect("JSON");
        assert_eq!(read["k\u{FFFD}"], "a\u{FFFD}b");
        assert_eq!(read["plain"], "x\\u0000", "an escaped backslash is no NUL");
    }

    proptest! {
        #[test]
        fn storable_text_has_no_nul_and_is_a_fixed_point(text in any::<String>()) {
            let once = storable(&text).into_owned();
            prop_assert!(!once.contains('\0'));
            prop_assert_eq!(storable(&once), Cow::Borrowed(once.as_str()));
            prop_assert_eq!(once.chars().count(), text.chars().count());
            if !text.contains('\0') {
                prop_assert_eq!(once, text);
            }
        }
    }
}
