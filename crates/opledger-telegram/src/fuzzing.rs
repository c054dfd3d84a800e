//! The bodies of the fuzz targets of this crate (`fuzz/`), shared with the corpus replay tests
//! (`tests/it/fuzz_corpus.rs`) so that CI checks every corpus input against the same invariants
//! without nightly. Each function takes arbitrary bytes and panics when an invariant breaks; it
//! is not an API.

use reqwest::StatusCode;
use serde_json::Value;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use unicode_normalization::UnicodeNormalization;

use crate::bot_api::{self, Envelope, RawUpdate};
use crate::command::{self, Command, MAX_COMMAND_NAME_CHARS};
use crate::error::{BotApiError, QuarantineReason};
use crate::update::{KNOWN_KINDS, MAX_OTHER_KIND_CHARS, Update, UpdateKind, parse_update};

/// Target `update_envelope`, Telegram's half: [`parse_update`] classifies every body the way an
/// independent JSON reading does, the `update_id` round-trips, the digest and size are those of
/// the bytes, the derived fields are consistent, and re-serializing the JSON changes nothing
/// but the digest and size. Returns the update, for the intake half.
pub fn update_envelope(data: &[u8]) -> Option<Update> {
    let digest = hex::encode(Sha256::digest(data));
    let parsed = parse_update(data);
    let raw = RawUpdate {
        bytes: data.to_vec(),
    };
    assert_eq!(
        raw.parse(),
        parsed,
        "a polled update parses like a webhook body"
    );
    assert_eq!(
        format!("{raw:?}"),
        format!("RawUpdate {{ size: {}, .. }}", data.len()),
        "a raw update's Debug shows its size only"
    );

    let value: Result<Value, _> = serde_json::from_slice(data);
    let expected = match &value {
        Err(_) => Err(QuarantineReason::NotJson),
        Ok(value) => match value.as_object() {
            None => Err(QuarantineReason::NotAnObject),
            Some(object) => object
                .get("update_id")
                .and_then(Value::as_i64)
                .ok_or(QuarantineReason::NoUpdateId),
        },
    };
    let update = match parsed {
        Err(quarantine) => {
            assert_eq!(Err(quarantine.reason), expected);
            assert_eq!(
                (quarantine.digest.as_str(), quarantine.size),
                (digest.as_str(), data.len())
            );
            assert_eq!(
                quarantine.to_string(),
                format!(
                    "update quarantined because {}: record its digest and size, acknowledge it, \
                     do not process it",
                    quarantine.reason
                ),
                "a quarantine's message never shows the body"
            );
            return None;
        }
        Ok(update) => update,
    };
    assert_eq!(Ok(update.update_id), expected, "the update_id round-trips");
    assert_eq!(
        (update.digest.as_str(), update.size),
        (digest.as_str(), data.len())
    );
    check_derived(&update);

    // The same JSON written differently is the same update.
    let rewritten = serde_json::to_vec(value.as_ref().expect("parsed above")).expect("serializes");
    let again = parse_update(&rewritten).expect("a re-serialized update still parses");
    assert_eq!(
        Update {
            digest: update.digest.clone(),
            size: update.size,
            ..again
        },
        update,
        "re-serializing the JSON changes only the digest and size"
    );
    Some(update)
}

fn check_derived(update: &Update) {
    match &update.kind {
        UpdateKind::Other(key) => {
            assert!(key.chars().count() <= MAX_OTHER_KIND_CHARS, "{key:?}");
            assert!(!KNOWN_KINDS.contains(&key.as_str()) && key != "update_id");
            if key.chars().count() < MAX_OTHER_KIND_CHARS {
                assert_eq!(UpdateKind::from_key(key), update.kind);
            }
            assert_eq!(update.kind.as_str(), format!("other:{key}"));
        }
        UpdateKind::Empty => assert_eq!(update.kind.as_str(), "none"),
        known => {
            assert!(KNOWN_KINDS.contains(&known.as_str().as_ref()));
            assert_eq!(&UpdateKind::from_key(&known.as_str()), known);
        }
    }
    if let Some(date) = update.message_date {
        assert!(date.timestamp() > 0, "a date is after 1970: {date}");
    }
    if let Some(command) = &update.text_command {
        assert!(
            matches!(
                update.kind,
                UpdateKind::Message | UpdateKind::BusinessMessage
            ),
            "commands come from messages only: {:?}",
            update.kind
        );
        check_command(command);
    }
    if let Some(callback) = &update.callback {
        assert_eq!(update.kind, UpdateKind::CallbackQuery);
        assert_eq!(callback.chat_id, update.chat_id);
        assert_eq!(callback.from_user_id, update.user_id);
    }
}

/// What every normalized command satisfies, and that normalizing it again changes nothing.
fn check_command(command: &Command) {
    let Command {
        name,
        args,
        mention,
    } = command;
    assert!(!name.is_empty() && name.chars().count() <= MAX_COMMAND_NAME_CHARS);
    assert!(
        !name.contains(char::is_whitespace) && !name.contains('@'),
        "{name:?}"
    );
    assert!(
        mention
            .as_ref()
            .is_none_or(|m| !m.is_empty() && !m.contains(char::is_whitespace))
    );
    assert!(
        args.iter()
            .all(|a| !a.is_empty() && !a.contains(char::is_whitespace)),
        "{args:?}"
    );
    let again = Command::parse(&format!("/{}", command.normalized()))
        .expect("a normalized command parses again");
    assert_eq!(
        (&again.name, &again.args),
        (name, args),
        "normalization is stable"
    );
    let spelled = match mention {
        Some(mention) => format!("/{name}@{mention} {}", args.join(" ")),
        None => format!("/{name} {}", args.join(" ")),
    };
    assert_eq!(&Command::parse(&spelled).expect("parses again"), command);
}

/// The length of the bot-command entity `command` puts on its text, picked by the first byte.
fn entity_length(selector: u8, text: &str) -> Option<Value> {
    let word = text.split(char::is_whitespace).next().unwrap_or_default();
    let word_units = word.encode_utf16().count() as u64;
    match selector % 4 {
        0 => None,
        1 => Some(word_units.into()),
        2 => Some(u64::from(selector / 4).into()),
        _ => Some(Value::from(-i64::from(selector))),
    }
}

/// Target `command`, Telegram's half: the first byte picks a `bot_command` entity (none, the
/// first word's length, a byte's worth, a negative one), the rest is the text. A command read
/// from the text is well formed, stable under re-normalization, the same for the NFC and NFD
/// spellings, and the same whether read from `text` or `caption`, with or without an entity
/// that covers the first word exactly.
pub fn command(data: &[u8]) -> Option<Command> {
    let (selector, text) = data.split_first().map_or((0, &[][..]), |(s, t)| (*s, t));
    let text = String::from_utf8_lossy(text);
    let parsed = Command::parse(&text);
    if let Some(command) = &parsed {
        assert!(text.starts_with('/'));
        check_command(command);
    }
    let nfc = Command::parse(&text.nfc().collect::<String>()).map(|c| c.normalized());
    let nfd = Command::parse(&text.nfd().collect::<String>()).map(|c| c.normalized());
    assert_eq!(nfc, nfd, "NFC and NFD spellings are one command");
    assert_eq!(
        nfc,
        parsed.as_ref().map(Command::normalized),
        "NFC input changes nothing"
    );

    assert_eq!(
        command::from_message(&serde_json::json!({ "text": text })),
        parsed
    );
    assert_eq!(
        command::from_message(&serde_json::json!({ "caption": text })),
        parsed
    );
    let length = entity_length(selector, &text);
    let message = match &length {
        None => serde_json::json!({ "text": text, "entities": [] }),
        Some(length) => serde_json::json!({
            "text": text,
            "entities": [{ "type": "bot_command", "offset": 0, "length": length }],
        }),
    };
    let from_entity = command::from_message(&message);
    match (length, selector % 4) {
        (None, _) => assert_eq!(from_entity, None, "entities without a command: no command"),
        (Some(_), 1) if !text.is_empty() => assert_eq!(from_entity, parsed),
        _ => {
            if let Some(command) = &from_entity {
                check_command(command);
            }
        }
    }
    parsed
}

const METHODS: [&str; 4] = [
    "getUpdates",
    "getWebhookInfo",
    "sendMessage",
    "answerCallbackQuery",
];

/// Target `bot_api_answer`: bytes 0–1 are the HTTP status (100–999), byte 2 the `Retry-After`
/// header (0: none), byte 3 the method, the rest the body. Every answer is classified (no
/// panic), a result is the exact bytes of the body's `result`, errors belong to the method,
/// say nothing of the body but Telegram's description, and an answer that is not Telegram's
/// with a 5xx status never counts as "certainly not delivered". The method's result is then
/// decoded as the client does.
pub fn bot_api_answer(data: &[u8]) {
    let [a, b, retry, method, body @ ..] = data else {
        return;
    };
    let status = StatusCode::from_u16(100 + u16::from_be_bytes([*a, *b]) % 900)
        .expect("100-999 is a valid status");
    let retry_after = (*retry != 0).then(|| u64::from(*retry - 1));
    let method = METHODS[usize::from(*method) % METHODS.len()];
    let answer = bot_api::interpret(method, status, retry_after, body);
    // Telegram's envelope as the client reads it (a JSON parse would differ: the client skips
    // fields it does not read, invalid UTF-8 in them included).
    let envelope: Option<Envelope> = serde_json::from_slice(body).ok();
    let ok = envelope
        .as_ref()
        .and_then(|e| e.ok.as_ref())
        .and_then(Value::as_bool);
    match answer {
        Ok(result) => {
            assert_eq!(ok, Some(true), "a result comes only with ok: true");
            let text = result.get();
            assert!(
                body.windows(text.len()).any(|w| w == text.as_bytes()),
                "the result is the body's exact bytes"
            );
            decode_result(method, &result);
        }
        Err(error) => check_error(method, status, body, envelope.as_ref(), &error),
    }
}

fn check_error(
    method: &str,
    status: StatusCode,
    body: &[u8],
    envelope: Option<&Envelope>,
    error: &BotApiError,
) {
    assert_eq!(error.method(), Some(method));
    let shown = error.to_string();
    match error {
        BotApiError::Decode { detail, .. } => {
            assert!(
                is_decode_detail(detail),
                "a decode error quotes nothing: {detail}"
            );
        }
        BotApiError::Api {
            code, description, ..
        } => {
            let from_body = envelope
                .and_then(|e| e.description.as_ref())
                .and_then(Value::as_str);
            assert!(
                from_body == Some(description.as_str())
                    || description == "no description"
                    || *description
                        == format!("http status {} without a telegram answer", status.as_u16()),
                "the description is telegram's or ours: {description:?}"
            );
            assert_eq!(
                error.is_definitely_not_delivered(),
                (400..500).contains(code) && *code != 408
            );
        }
        BotApiError::Conflict { .. }
        | BotApiError::RetryAfter { .. }
        | BotApiError::ChatMigrated { .. }
        | BotApiError::Unauthorized { .. } => assert!(error.is_definitely_not_delivered()),
        other => panic!("an answer cannot mean {other:?}"),
    }
    let object = body.trim_ascii_start().starts_with(b"{");
    if status.is_server_error() && !(object && envelope.is_some()) {
        assert!(
            !error.is_definitely_not_delivered(),
            "a 5xx answer without telegram's envelope may have taken effect: {shown}"
        );
    }
}

/// What [`bot_api_answer`] allows a decode error to say: a category and a position, or one of
/// the fixed sentences.
fn is_decode_detail(detail: &str) -> bool {
    let fixed = [
        "the answer says ok but has no result",
        "the answer has no ok field",
        "the sent message has no integer message_id",
    ];
    if fixed.contains(&detail) {
        return true;
    }
    let categories = [
        "i/o error",
        "invalid json",
        "unexpected json shape",
        "truncated json",
    ];
    categories.iter().any(|category| {
        detail
            .strip_prefix(category)
            .and_then(|rest| rest.strip_prefix(" at line "))
            .and_then(|rest| rest.split_once(" column "))
            .is_some_and(|(line, column)| {
                line.parse::<u64>().is_ok() && column.parse::<u64>().is_ok()
            })
    })
}

/// Decodes a successful call's result the way the client's method does.
fn decode_result(method: &str, result: &RawValue) {
    match method {
        "getUpdates" => match bot_api::raw_updates(result) {
            Ok(updates) => {
                for update in updates {
                    let text = std::str::from_utf8(&update.bytes).expect("json text");
                    assert!(
                        result.get().contains(text),
                        "each update is its exact bytes"
                    );
                    update_envelope(&update.bytes);
                }
            }
            Err(error) => check_decode(method, &error),
        },
        "getWebhookInfo" => match bot_api::webhook_info(result, &Default::default()) {
            Ok(info) => {
                assert!(info.last_error_date.is_none_or(|d| d.timestamp() > 0));
            }
            Err(error) => check_decode(method, &error),
        },
        "sendMessage" => match bot_api::sent_message(result) {
            Ok(sent) => {
                let value: Value = serde_json::from_str(result.get()).expect("json");
                assert_eq!(
                    value.get("message_id").and_then(Value::as_i64),
                    Some(sent.message_id)
                );
            }
            Err(error) => check_decode(method, &error),
        },
        _ => {}
    }
}

fn check_decode(method: &str, error: &BotApiError) {
    let BotApiError::Decode { detail, .. } = error else {
        panic!("a result that cannot be read is a decode error: {error:?}");
    };
    assert_eq!(error.method(), Some(method));
    assert!(is_decode_detail(detail), "{detail}");
    assert!(!error.is_definitely_not_delivered());
}
