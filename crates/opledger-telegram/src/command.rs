//! Bot commands (`/coupon@ShopBot spring`) read from a message and normalized, so that the same
//! request typed differently (case, `@botname`, extra spaces, composed or decomposed accents) yields
//! the same stream id and fingerprint.

use opledger_domain::text::storable;
use serde_json::Value;
use unicode_normalization::UnicodeNormalization;

/// Version of the normalization rules below. Normalized commands end up in stream ids and
/// fingerprints, so any change to the rules must bump it (and keep the old rules readable).
pub const NORMALIZATION_VERSION: u32 = 1;

/// Longest command name accepted, in characters, after normalization: Telegram's own limit for
/// bot commands. A longer name is not a command of any bot, so the text is not treated as one
/// (truncating it instead could make it match a configured 32-character command).
pub const MAX_COMMAND_NAME_CHARS: usize = 32;

/// A bot command as the user meant it, normalized.
///
/// It exists so that intake never has to keep the message text: the command is the only part of
/// a message's text opledger keeps by default.
///
/// Normalization (version [`NORMALIZATION_VERSION`]):
/// - `name`: the word after `/`, without the `@botname` suffix, lower-cased, NFC;
/// - `mention`: the `@botname` suffix without `@`, lower-cased, NFC (`None` when absent or empty);
/// - `args`: the rest of the text split on runs of Unicode whitespace, each part NFC (case kept:
///   codes and names may be case-sensitive).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Command {
    /// Command name without `/` and `@botname`, e.g. `coupon`.
    pub name: String,
    /// Arguments, e.g. `["spring"]`.
    pub args: Vec<String>,
    /// Bot username the command was addressed to (`/start@shopbot`), lower-case, without `@`.
    pub mention: Option<String>,
}

impl Command {
    /// Reads a command from text that has no entities: it must start with `/`; the command word
    /// ends at the first whitespace.
    ///
    /// Also the way to normalize a configured command (`Command::parse("/Coupon")`), so that
    /// configuration and updates follow the same rules.
    pub fn parse(text: &str) -> Option<Command> {
        if !text.starts_with('/') {
            return None;
        }
        let end = first_whitespace(text);
        from_parts(&text[..end], &text[end..])
    }

    /// `"{name} {arg1} {arg2}"`: the canonical form used in stream ids and fingerprints. The
    /// mention is left out: `/start` and `/start@bot` are the same request.
    pub fn normalized(&self) -> String {
        let mut out = self.name.clone();
        for arg in &self.args {
            out.push(' ');
            out.push_str(arg);
        }
        out
    }
}

/// Reads the command of a Bot API `Message` object, if its text (or caption) starts with one.
///
/// With entities, the text must start with a `bot_command` entity (offset 0); without entities
/// (hand-written or old payloads), it must start with `/`. Anything unexpected yields `None`.
pub(crate) fn from_message(message: &Value) -> Option<Command> {
    let (text, entities) = match message.get("text").and_then(Value::as_str) {
        Some(text) => (text, message.get("entities")),
        None => (
            message.get("caption").and_then(Value::as_str)?,
            message.get("caption_entities"),
        ),
    };
    let end = match entities.and_then(Value::as_array) {
        Some(entities) => {
            let entity = entities.iter().find(|e| {
                e.get("type").and_then(Value::as_str) == Some("bot_command")
                    && e.get("offset").and_then(Value::as_i64) == Some(0)
            })?;
            let by_entity = entity
                .get("length")
                .and_then(Value::as_u64)
                .and_then(|length| utf16_to_byte_index(text, length));
            // The command word never spans whitespace, whatever the entity says.
            let word = first_whitespace(text);
            by_entity.map_or(word, |end| end.min(word))
        }
        None => first_whitespace(text),
    };
    from_parts(&text[..end], &text[end..])
}

/// Builds the command from its word (`/name@bot`) and the text after it, as the ledger can keep
/// them (`opledger_domain::text::storable`): every part of a command is stored.
fn from_parts(word: &str, rest: &str) -> Option<Command> {
    let (word, rest) = (storable(word), storable(rest));
    let body = word.strip_prefix('/')?;
    let (name, mention) = match body.split_once('@') {
        Some((name, mention)) => (name, Some(mention)),
        None => (body, None),
    };
    let name = lower_nfc(name);
    if name.is_empty() || name.chars().count() > MAX_COMMAND_NAME_CHARS {
        return None;
    }
    let mention = mention.map(lower_nfc).filter(|m| !m.is_empty());
    let args = rest.split_whitespace().map(|a| a.nfc().collect()).collect();
    Some(Command {
        name,
        args,
        mention,
    })
}

fn lower_nfc(s: &str) -> String {
    s.to_lowercase().nfc().collect()
}

/// Byte index of the first whitespace character, or the length of the text.
fn first_whitespace(text: &str) -> usize {
    text.find(char::is_whitespace).unwrap_or(text.len())
}

/// Converts a length in UTF-16 code units (how Telegram measures entities) into a byte index of
/// `text`, if it falls on a character boundary inside the text.
fn utf16_to_byte_index(text: &str, utf16_len: u64) -> Option<usize> {
    if utf16_len == 0 {
        return None;
    }
    let mut units: u64 = 0;
    for (index, c) in text.char_indices() {
        if units == utf16_len {
            return Some(index);
        }
        if units > utf16_len {
            return None;
        }
        units += c.len_utf16() as u64;
    }
    (units == utf16_len).then_some(text.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn cmd(name: &str, args: &[&str], mention: Option<&str>) -> Command {
        Command {
            name: name.to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            mention: mention.map(str::to_owned),
        }
    }

    #[test]
    fn mention_is_stripped_and_everything_is_normalized() {
        assert_eq!(
            Command::parse("/Coupon@ShopBot   spring"),
            Some(cmd("coupon", &["spring"], Some("shopbot")))
        );
    }

    #[test]
    fn any_unicode_whitespace_run_separates_arguments() {
        let c = Command::parse("/order\t 2\u{00A0}\u{3000}pizza\n\nlarge ").expect("a command");
        assert_eq!(c, cmd("order", &["2", "pizza", "large"], None));
        assert_eq!(c.normalized(), "order 2 pizza large");
    }

    #[test]
    fn argument_case_is_kept() {
        assert_eq!(
            Command::parse("/redeem AbC-123").map(|c| c.args),
            Some(vec!["AbC-123".to_owned()])
        );
    }

    #[test]
    fn nfc_and_nfd_spellings_normalize_equally() {
        let nfc = Command::parse("/Caf\u{00E9} cr\u{00E8}me").expect("a command");
        let nfd = Command::parse("/Cafe\u{0301} cre\u{0300}me").expect("a command");
        assert_eq!(nfc, nfd);
        assert_eq!(nfc.normalized(), "caf\u{00E9} cr\u{00E8}me");
    }

    #[test]
    fn not_commands() {
        for text in ["", "hello", " /start", "/", "/@bot", "/ start"] {
            assert_eq!(Command::parse(text), None, "{text:?}");
        }
    }

    #[test]
    fn empty_mention_is_none() {
        assert_eq!(Command::parse("/start@"), Some(cmd("start", &[], None)));
    }

    #[test]
    fn names_longer_than_telegram_allows_are_not_commands() {
        let longest = format!("/{}", "a".repeat(MAX_COMMAND_NAME_CHARS));
        assert!(Command::parse(&longest).is_some());
        let too_long = format!("/{}", "a".repeat(MAX_COMMAND_NAME_CHARS + 1));
        assert_eq!(Command::parse(&too_long), None);
    }

    #[test]
    fn bot_command_entity_bounds_the_command_word() {
        let message = json!({
            "text": "/coupon,spring sale",
            "entities": [{"type": "bot_command", "offset": 0, "length": 7}]
        });
        assert_eq!(
            from_message(&message),
            Some(cmd("coupon", &[",spring", "sale"], None))
        );
    }

    #[test]
    fn entity_length_counts_utf16_units() {
        // `ё` is one UTF-16 unit but two bytes; the entity covers `/ёлка@bot`.
        let message = json!({
            "text": "/ёлка@bot x",
            "entities": [{"type": "bot_command", "offset": 0, "length": 9}]
        });
        assert_eq!(
            from_message(&message),
            Some(cmd("ёлка", &["x"], Some("bot")))
        );
    }

    #[test]
    fn a_broken_entity_length_falls_back_to_the_first_word() {
        for length in [json!(0), json!(500), json!("7"), json!(-1)] {
            let message = json!({
                "text": "/start now",
                "entities": [{"type": "bot_command", "offset": 0, "length": length}]
            });
            assert_eq!(from_message(&message), Some(cmd("start", &["now"], None)));
        }
    }

    #[test]
    fn entities_without_a_leading_bot_command_mean_no_command() {
        let message = json!({
            "text": "/start",
            "entities": [{"type": "bold", "offset": 0, "length": 6}]
        });
        assert_eq!(from_message(&message), None);
        let later = json!({
            "text": "hi /start",
            "entities": [{"type": "bot_command", "offset": 3, "length": 6}]
        });
        assert_eq!(from_message(&later), None);
    }

    #[test]
    fn text_without_entities_needs_a_slash() {
        assert_eq!(
            from_message(&json!({"text": "/start"})),
            Some(cmd("start", &[], None))
        );
        assert_eq!(from_message(&json!({"text": "start"})), None);
    }

    #[test]
    fn caption_is_read_when_there_is_no_text() {
        let message = json!({
            "caption": "/Upload now",
            "caption_entities": [{"type": "bot_command", "offset": 0, "length": 7}]
        });
        assert_eq!(from_message(&message), Some(cmd("upload", &["now"], None)));
    }

    #[test]
    fn wrong_types_mean_no_command() {
        assert_eq!(from_message(&json!({"text": 5})), None);
        assert_eq!(from_message(&json!({})), None);
        assert_eq!(from_message(&json!(null)), None);
        // Entities of the wrong type are as good as missing.
        assert_eq!(
            from_message(&json!({"text": "/go", "entities": "nope"})),
            Some(cmd("go", &[], None))
        );
    }

    /// Text that exercises the tricky corners: case, `@`, many whitespace kinds, combining marks,
    /// precomposed letters, characters whose lower case is longer (`İ`), and the sharp s.
    fn tricky_text() -> impl Strategy<Value = String> {
        proptest::string::string_regex(
            "/[a-zA-Z0-9_@ \t\n\u{00A0}\u{2000}\u{3000}\u{0301}\u{0300}\u{00E9}\u{00C9}\u{0130}\u{00DF}\u{1E9E}\u{01C5}\u{03A3}\u{FB01}]{0,40}",
        )
        .expect("a valid regex")
    }

    proptest! {
        #[test]
        fn normalization_is_idempotent(text in prop_oneof![tricky_text(), any::<String>().prop_map(|s| format!("/{s}"))]) {
            if let Some(first) = Command::parse(&text) {
                let again = Command::parse(&format!("/{}", first.normalized()))
                    .expect("a normalized command parses again");
                prop_assert_eq!(&again.name, &first.name);
                prop_assert_eq!(&again.args, &first.args);
                prop_assert_eq!(again.normalized(), first.normalized());
            }
        }

        #[test]
        fn nfc_and_nfd_inputs_normalize_equally(text in prop_oneof![tricky_text(), any::<String>().prop_map(|s| format!("/{s}"))]) {
            let nfc: String = text.nfc().collect();
            let nfd: String = text.nfd().collect();
            let a = Command::parse(&nfc).map(|c| c.normalized());
            let b = Command::parse(&nfd).map(|c| c.normalized());
            prop_assert_eq!(a, b);
        }
    }
}
