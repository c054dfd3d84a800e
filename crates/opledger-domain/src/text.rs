//! What the ledger keeps of text that came from outside: storable on both backends (ADR 0010),
//! and without any secret this process knows (ADR 0011).
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
//!
//! A service can echo what it was sent: a Bot API error that quotes the request's path quotes
//! the bot token. [`Redactor`] knows the configured secrets and replaces each one in an external
//! text before the text is kept anywhere (an event, a log line, a command's output).

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use secrecy::{ExposeSecret, SecretString};
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
    Redactor::default().kept_value(value)
}

/// What a secret is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Replaces the secrets it knows (bot tokens, webhook secrets, admin tokens, credentials in
/// URLs) in text received from outside, each as written and percent-encoded (a path can be
/// echoed either way). Cheap to clone; its `Debug` shows only how many secrets it knows.
#[derive(Clone, Default)]
pub struct Redactor {
    /// Every form to replace, longest first, so that a secret containing another is replaced
    /// whole.
    forms: Arc<[SecretString]>,
}

impl Redactor {
    /// A redactor of `secrets` (empty ones are ignored: they match nothing).
    pub fn new<'a>(secrets: impl IntoIterator<Item = &'a SecretString>) -> Redactor {
        Redactor::default().with(secrets)
    }

    /// This redactor and `secrets` too.
    pub fn with<'a>(&self, secrets: impl IntoIterator<Item = &'a SecretString>) -> Redactor {
        let mut forms: Vec<String> = self
            .forms
            .iter()
            .map(|form| form.expose_secret().to_owned())
            .collect();
        for secret in secrets {
            let secret = secret.expose_secret();
            if secret.is_empty() {
                continue;
            }
            forms.push(secret.to_owned());
            forms.push(percent_encoded(secret));
        }
        forms.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        forms.dedup();
        Redactor {
            forms: forms.into_iter().map(SecretString::from).collect(),
        }
    }

    /// `text` with every known secret replaced by [`REDACTED`]; borrowed when none occurs.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut text = Cow::Borrowed(text);
        for form in self.forms.iter() {
            let form = form.expose_secret();
            if text.contains(form) {
                text = Cow::Owned(text.replace(form, REDACTED));
            }
        }
        text
    }

    /// An external text as it may be kept anywhere: [`storable`] and redacted.
    pub fn kept(&self, text: &str) -> String {
        self.redact(&storable(text)).into_owned()
    }

    /// [`Redactor::kept`] for an owned string: no copy when nothing changes.
    pub fn kept_string(&self, text: String) -> String {
        match self.redact(&text) {
            Cow::Borrowed(_) => storable_string(text),
            Cow::Owned(redacted) => storable_string(redacted),
        }
    }

    /// [`Redactor::kept`] applied to every string of a JSON value, object keys included.
    pub fn kept_value(&self, value: Value) -> Value {
        match value {
            Value::String(text) => Value::String(self.kept_string(text)),
            Value::Array(items) => {
                Value::Array(items.into_iter().map(|v| self.kept_value(v)).collect())
            }
            Value::Object(fields) => Value::Object(
                fields
                    .into_iter()
                    .map(|(key, value)| (self.kept_string(key), self.kept_value(value)))
                    .collect(),
            ),
            other => other,
        }
    }
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redactor")
            .field("forms", &self.forms.len())
            .finish()
    }
}

/// `text` with every byte but RFC 3986's unreserved characters percent-encoded.
fn percent_encoded(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Reads stored JSON (an event's payload or metadata) with every string [`storable`]. Only a
/// payload that spells `\u0000` takes the slower way through a [`Value`]; the bytes stay as
/// they were stored and hashed.
pub(crate) fn from_stored_json<T: DeserializeOwned>(bytes: &[u8]) -> serde_json::Result<T> {
    // Every event is decoded by several read models: a vectorised search, not a byte-by-byte
    // comparison of every window.
    if memchr::memmem::find(bytes, br"\u0000").is_some() {
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

    #[test]
    fn known_secrets_are_redacted_as_written_and_percent_encoded() {
        let token = SecretString::from("123456:TOKEN-abc");
        let secret = SecretString::from("hook_secret");
        let redactor = Redactor::new([&token]).with([&secret, &SecretString::from("")]);
        assert_eq!(
            redactor.redact("Not Found: /bot123456:TOKEN-abc/sendMessage"),
            "Not Found: /bot[redacted]/sendMessage"
        );
        assert_eq!(
            redactor.redact("GET /bot123456%3ATOKEN-abc/x?s=hook_secret"),
            "GET /bot[redacted]/x?s=[redacted]"
        );
        assert!(matches!(redactor.redact("nothing here"), Cow::Borrowed(_)));
        assert_eq!(redactor.kept("a\0hook_secret"), "a\u{FFFD}[redacted]");
        assert_eq!(
            redactor.kept_value(serde_json::json!({"hook_secret": ["x hook_secret"]})),
            serde_json::json!({"[redacted]": ["x [redacted]"]})
        );
        let shown = format!("{redactor:?}");
        assert!(
            !shown.contains("TOKEN") && !shown.contains("hook"),
            "{shown}"
        );
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
