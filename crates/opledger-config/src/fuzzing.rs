//! The bodies of the configuration's fuzz targets (`fuzz/`), shared with the corpus replay tests
//! (`tests/it/fuzz_corpus.rs`) so that CI checks every corpus input against the same invariants
//! without nightly. Each function takes arbitrary bytes and panics when an invariant breaks; it
//! is not an API.

use url::Url;

use crate::config::{Config, RESERVED_COMMANDS};
use crate::template::{
    KEY_UPDATE_FIELDS, KeyTemplate, ReplyKind, ReplyPlaceholder, ReplyTemplate, Template,
    UrlTemplate,
};

/// What every environment variable holds in [`config`]: a value fit for every secret (a bot
/// token, a webhook secret, an admin token), so that it must never show.
const SECRET: &str = "Zq9SecretValue0123456789";

/// The fake environment of [`config`]: variables whose name starts with `MISSING` are unset,
/// `BAD` ones hold a value no secret accepts (which must not show either), the rest [`SECRET`].
fn env(name: &str) -> Option<String> {
    if name.starts_with("MISSING") {
        None
    } else if name.starts_with("BAD") {
        Some(format!("{SECRET} \u{1b}[2J"))
    } else {
        Some(SECRET.to_owned())
    }
}

/// Target `config`: the bytes are a configuration file's text. Every refusal is one line
/// without control characters naming a key or a line; no message and no `Debug` output shows a
/// secret or the storage URL's password; an accepted configuration holds only valid actions
/// (a configured bot, a command of `a-z 0-9 _` unique per bot, a key over its params and the
/// update fields, replies that parse again to the same template).
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let hidden = |shown: &str, what: &str| {
        if !text.contains(SECRET) {
            assert!(!shown.contains(SECRET), "{what} shows a secret: {shown}");
        }
    };
    let config = match Config::parse(text, &env) {
        Err(error) => {
            let shown = error.to_string();
            assert!(
                !shown.chars().any(char::is_control),
                "a refusal is one line without control characters: {shown:?}"
            );
            assert!(
                shown.starts_with("config key `") || shown.starts_with("config file line "),
                "a refusal names its key or line: {shown}"
            );
            hidden(&shown, "a refusal");
            hidden(&format!("{error:?}"), "a refusal's Debug");
            return;
        }
        Ok(config) => config,
    };
    let shown = format!("{config:?}");
    hidden(&shown, "the configuration's Debug");
    let url = config.storage.url.expose_secret();
    if Url::parse(url).is_ok_and(|u| u.password().is_some()) {
        let redacted = config.storage.url.redacted();
        let masked = Url::parse(&redacted)
            .ok()
            .and_then(|u| u.password().map(str::to_owned));
        assert_eq!(
            masked.as_deref(),
            Some("***"),
            "the password shows: {redacted}"
        );
    }
    for action in &config.actions {
        assert!(
            config.bot(&action.bot).is_some(),
            "{} names a bot",
            action.name
        );
        if let Some(command) = &action.command {
            assert_eq!(
                config
                    .action_for_command(&action.bot, command)
                    .map(|a| &a.name),
                Some(&action.name),
                "one action per command and bot"
            );
            assert!(!RESERVED_COMMANDS.contains(&command.as_str()));
            assert!(
                command
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            );
        } else {
            assert!(action.confirm.is_none(), "a confirmation needs a command");
        }
        let mut placeholders = action.key.placeholders().peekable();
        assert!(placeholders.peek().is_some(), "a key has a placeholder");
        for name in placeholders {
            assert!(KEY_UPDATE_FIELDS.contains(&name) || action.params.iter().any(|p| p == name));
        }
        for reply in [&action.reply.confirmed, &action.reply.failed] {
            let again = ReplyTemplate::parse(reply.as_str(), reply.kind(), &action.params)
                .expect("an accepted reply parses again");
            assert_eq!(&again, reply);
        }
    }
}

/// The params the templates of [`template`] are checked against.
const PARAMS: [&str; 2] = ["campaign", "topic"];

/// Target `template`: byte 0 picks the kind (plain, business key, confirmed or failed reply,
/// lookup URL), the rest is the template's text. A template parses to what it says: written
/// back with its placeholders in braces and its literal braces doubled it parses to the same
/// segments; a key's placeholders are its params and update fields and a missing or empty
/// value is refused; a reply's placeholders are classified by its kind; a lookup URL filled
/// with any operation id stays an http(s) URL of the same origin and path length.
pub fn template(data: &[u8]) {
    let [kind, text @ ..] = data else {
        return;
    };
    let text = String::from_utf8_lossy(text);
    let Ok(template) = Template::parse(&text) else {
        assert!(KeyTemplate::parse(&text, &PARAMS).is_err());
        assert!(ReplyTemplate::parse(&text, ReplyKind::Confirmed, &PARAMS).is_err());
        assert!(UrlTemplate::parse(&text).is_err());
        return;
    };
    assert_eq!(template.as_str(), text);
    check_round_trip(&template);
    match kind % 5 {
        0 => {}
        1 => check_key(&text),
        2 => check_reply(&text, ReplyKind::Confirmed),
        3 => check_reply(&text, ReplyKind::Failed),
        _ => check_url(&text),
    }
}

/// A character absent from `text`, to mark where placeholders begin and end.
fn marker(text: &str) -> char {
    ('\u{E000}'..='\u{F8FF}')
        .find(|c| !text.contains(*c))
        .expect("a private-use character absent from the text")
}

/// Writes `template` back from what it renders to (literals with doubled braces, placeholders
/// in braces) and checks that this source parses to the same template.
fn check_round_trip(template: &Template) {
    let mark = marker(template.as_str());
    let rendered = template
        .render(&|name| Some(format!("{mark}{name}{mark}")))
        .expect("every placeholder has a value");
    let mut source = String::new();
    for (i, part) in rendered.split(mark).enumerate() {
        if i % 2 == 0 {
            source.push_str(&part.replace('{', "{{").replace('}', "}}"));
        } else {
            assert!(
                !part.is_empty()
                    && part.split('.').all(|p| {
                        !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                    }),
                "a placeholder's name is parts of A-Z a-z 0-9 _ joined by dots: {part:?}"
            );
            source.push('{');
            source.push_str(part);
            source.push('}');
        }
    }
    let again = Template::parse(&source).expect("the written-back template parses");
    assert_eq!(
        again.render(&|name| Some(format!("{mark}{name}{mark}"))),
        Ok(rendered),
        "the written-back template is the same"
    );
    assert!(again.placeholders().eq(template.placeholders()));
}

fn check_key(text: &str) {
    let Ok(key) = KeyTemplate::parse(text, &PARAMS) else {
        return;
    };
    let names: Vec<&str> = key.placeholders().collect();
    assert!(!names.is_empty(), "a key has a placeholder");
    for name in &names {
        assert!(
            KEY_UPDATE_FIELDS.contains(name) || PARAMS.contains(name),
            "{name}"
        );
    }
    let filled = key
        .render(&|name| Some(format!("<{name}>")))
        .expect("every value given");
    assert!(names.iter().all(|n| filled.contains(&format!("<{n}>"))));
    let first = names[0];
    assert!(
        key.render(&|name| (name != first).then(|| "v".to_owned()))
            .is_err()
    );
    let empty = key.render(&|name| {
        Some(if name == first {
            String::new()
        } else {
            "v".to_owned()
        })
    });
    assert!(empty.is_err(), "an empty value is refused");
}

fn check_reply(text: &str, kind: ReplyKind) {
    let Ok(reply) = ReplyTemplate::parse(text, kind, &PARAMS) else {
        return;
    };
    assert!(!text.trim().is_empty());
    assert_eq!(reply.kind(), kind);
    for placeholder in reply.placeholders() {
        match placeholder {
            ReplyPlaceholder::Result(_) | ReplyPlaceholder::ExternalId => {
                assert_eq!(kind, ReplyKind::Confirmed);
            }
            ReplyPlaceholder::Error => assert_eq!(kind, ReplyKind::Failed),
            ReplyPlaceholder::Param(name) => assert!(PARAMS.contains(&name), "{name}"),
            ReplyPlaceholder::OperationId | ReplyPlaceholder::Action => {}
        }
    }
}

/// Operation ids a lookup URL is filled with: a real one and hostile ones (never empty: an
/// operation id is a UUID, and an empty value next to a `.` would make a dot segment).
const OPERATION_IDS: [&str; 4] = [
    "0b9f1f0e-8f43-5d3a-9a57-3b1c2a6f5e44",
    "../../admin?x=1#frag",
    "a/b\\c d%2F@evil.example:80",
    "\u{0}\u{1b}[2J\u{FEFF}é",
];

fn check_url(text: &str) {
    let Ok(url) = UrlTemplate::parse(text) else {
        return;
    };
    let sample = url
        .render(OPERATION_IDS[0])
        .expect("a real operation id renders");
    assert!(matches!(sample.scheme(), "http" | "https"));
    assert!(sample.host().is_some() && sample.username().is_empty() && sample.password().is_none());
    // A template may put the id into the host on purpose; operation ids are UUIDs.
    let in_host = sample
        .host_str()
        .is_some_and(|h| h.contains(OPERATION_IDS[0]));
    for id in &OPERATION_IDS[1..] {
        let Ok(other) = url.render(id) else {
            continue;
        };
        if in_host {
            continue;
        }
        assert_eq!(other.origin(), sample.origin(), "{id:?} changed the origin");
        assert_eq!(
            other.path_segments().map(Iterator::count),
            sample.path_segments().map(Iterator::count),
            "{id:?} changed the path's length"
        );
        assert_eq!(other.fragment().is_some(), sample.fragment().is_some());
    }
}
