//! The file's shape as TOML gives it, before validation, and the mapping of TOML errors to keys.
//!
//! Every value is optional here so that a missing key is reported by validation with advice,
//! not by serde; `deny_unknown_fields` makes a misspelt key an error instead of a silent default.

use serde::Deserialize;
use serde_path_to_error::{Path, Segment};

use crate::error::{ConfigError, escape_controls};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    pub(crate) storage: Option<RawStorage>,
    pub(crate) server: Option<RawServer>,
    pub(crate) api: Option<RawApi>,
    #[serde(default)]
    pub(crate) bots: Vec<RawBot>,
    #[serde(default)]
    pub(crate) actions: Vec<RawAction>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawStorage {
    pub(crate) url: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServer {
    pub(crate) listen: Option<String>,
    pub(crate) body_limit_bytes: Option<i64>,
    pub(crate) request_timeout_ms: Option<i64>,
    pub(crate) shutdown_grace_ms: Option<i64>,
    pub(crate) dedup_retention_hours: Option<i64>,
    pub(crate) store_raw_updates: Option<bool>,
    pub(crate) connection_limit: Option<i64>,
    pub(crate) header_read_timeout_ms: Option<i64>,
    pub(crate) idle_timeout_ms: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawApi {
    pub(crate) admin_token_env: Option<String>,
    #[serde(default)]
    pub(crate) clients: Vec<RawClient>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawClient {
    pub(crate) name: Option<String>,
    pub(crate) bot: Option<String>,
    pub(crate) token_env: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBot {
    pub(crate) name: Option<String>,
    pub(crate) token_env: Option<String>,
    pub(crate) webhook_secret_env: Option<String>,
    pub(crate) api_base_url: Option<String>,
    pub(crate) mode: Option<String>,
    pub(crate) poll_timeout_secs: Option<i64>,
    pub(crate) max_connections: Option<i64>,
    pub(crate) forward: Option<RawForward>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawForward {
    pub(crate) url: Option<String>,
    pub(crate) in_process: Option<bool>,
    pub(crate) secret_env: Option<String>,
    pub(crate) updates: Option<String>,
    pub(crate) timeout_ms: Option<i64>,
    pub(crate) give_up_after_secs: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAction {
    pub(crate) name: Option<String>,
    pub(crate) bot: Option<String>,
    pub(crate) command: Option<String>,
    #[serde(default)]
    pub(crate) params: Vec<String>,
    pub(crate) key: Option<String>,
    pub(crate) repeat_window_secs: Option<i64>,
    pub(crate) confirm: Option<String>,
    pub(crate) confirm_expiry_secs: Option<i64>,
    pub(crate) effector: Option<RawEffector>,
    pub(crate) reply: Option<RawReply>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEffector {
    pub(crate) url: Option<String>,
    pub(crate) in_process: Option<bool>,
    pub(crate) timeout_ms: Option<i64>,
    pub(crate) honours_idempotency_key: Option<bool>,
    pub(crate) lookup_url: Option<String>,
    pub(crate) max_attempts: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawReply {
    pub(crate) confirmed: Option<String>,
    pub(crate) failed: Option<String>,
}

/// The keys each table accepts, for the advice after an unknown key.
fn known_keys(table: &[&str]) -> &'static str {
    match table {
        [] => "storage, server, api, bots, actions",
        ["storage"] => "url",
        ["server"] => {
            "listen, body_limit_bytes, request_timeout_ms, shutdown_grace_ms, \
             dedup_retention_hours, store_raw_updates, connection_limit, header_read_timeout_ms, \
             idle_timeout_ms"
        }
        ["api"] => "admin_token_env, clients",
        ["api", "clients"] => "name, bot, token_env",
        ["bots"] => {
            "name, token_env, webhook_secret_env, api_base_url, mode, poll_timeout_secs, \
             max_connections, forward"
        }
        ["bots", "forward"] => {
            "url, in_process, secret_env, updates, timeout_ms, give_up_after_secs"
        }
        ["actions"] => {
            "name, bot, command, params, key, repeat_window_secs, confirm, confirm_expiry_secs, \
             effector, reply"
        }
        ["actions", "effector"] => {
            "url, in_process, timeout_ms, honours_idempotency_key, lookup_url, max_attempts"
        }
        ["actions", "reply"] => "confirmed, failed",
        _ => "see docs/config.md",
    }
}

/// Reads the file into its raw shape, mapping every TOML or type error to one line.
pub(crate) fn parse(text: &str) -> Result<RawConfig, ConfigError> {
    let deserializer =
        toml::Deserializer::parse(text).map_err(|error| syntax_error(text, &error))?;
    serde_path_to_error::deserialize(deserializer).map_err(|error| {
        let path = error.path().clone();
        let message = error.into_inner().message().to_owned();
        key_error(&path, &message)
    })
}

fn syntax_error(text: &str, error: &toml::de::Error) -> ConfigError {
    let start = error.span().map_or(0, |span| span.start).min(text.len());
    let before = text.get(..start).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    let message = one_line(error.message());
    ConfigError::Syntax {
        line,
        column,
        problem: escape_controls(format!("invalid TOML: {message}; fix the file's syntax")),
    }
}

/// A TOML message on one line: its lines joined with "; ".
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// Formats a serde path the way the messages and docs write keys: `bots[1].token_env`.
fn key_path(segments: &[&Segment]) -> String {
    let mut key = String::new();
    for segment in segments {
        match segment {
            Segment::Seq { index } => key.push_str(&format!("[{index}]")),
            Segment::Map { key: name } | Segment::Enum { variant: name } => {
                if !key.is_empty() {
                    key.push('.');
                }
                key.push_str(name);
            }
            Segment::Unknown => key.push_str(".?"),
        }
    }
    key
}

fn key_error(path: &Path, message: &str) -> ConfigError {
    let segments: Vec<&Segment> = path.iter().collect();
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let name = rest.split('`').next().unwrap_or_default();
        // The path may or may not already end at the unknown key; make sure it does.
        let ends_at_name =
            matches!(segments.last(), Some(Segment::Map { key }) if key.as_str() == name);
        let parent = if ends_at_name {
            &segments[..segments.len() - 1]
        } else {
            &segments[..]
        };
        let table: Vec<&str> = parent
            .iter()
            .filter_map(|s| match s {
                Segment::Map { key } => Some(key.as_str()),
                _ => None,
            })
            .collect();
        let mut key = key_path(parent);
        if !key.is_empty() {
            key.push('.');
        }
        key.push_str(name);
        let problem = match name {
            "token" | "webhook_secret" | "admin_token" | "password" | "secret" => format!(
                "unknown key; secrets never go in the config file: name the environment \
                 variable that holds it with `{name}_env` (keys allowed here: {})",
                known_keys(&table)
            ),
            _ => format!(
                "unknown key; check its spelling (keys allowed here: {})",
                known_keys(&table)
            ),
        };
        return ConfigError::key_problem(key, problem);
    }
    let key = key_path(&segments);
    let key = if key.is_empty() {
        "(top level)".to_owned()
    } else {
        key
    };
    ConfigError::key_problem(key, type_problem(message))
}

/// Rewrites serde's "invalid type" messages without the value found, which could be anything
/// the operator typed; other messages pass through on one line.
fn type_problem(message: &str) -> String {
    if message.starts_with("invalid type:")
        && let Some((_, expected)) = message.rsplit_once(", expected ")
    {
        let expected = match expected {
            "i64" | "an integer" => "an integer",
            "a boolean" => "true or false",
            "a string" => "a string",
            "a sequence" => "an array",
            e if e.starts_with("struct ") => "a table",
            e => e,
        };
        return format!("has the wrong type; it must be {expected}");
    }
    one_line(message)
}
