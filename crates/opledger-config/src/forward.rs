//! `[bots.forward]`: the gateway to a bot's own webhook (ADR 0012), or the hand-over to the
//! handlers of a Rust program that embeds opledger (ADR 0013). opledger records and dedups each
//! update, answers Telegram, then forwards the exact bytes to `url` until the bot answers 2xx
//! (or hands them to the in-process handlers until they are done with them).

use std::time::Duration;

use secrecy::SecretString;
use url::Url;

use crate::error::ConfigError;
use crate::raw::RawForward;
use crate::template::http_url;
use crate::values::{in_range, webhook_secret};

/// Default time one attempt may take (Telegram waits about 60 s; bots answer in well under 10).
const DEFAULT_FORWARD_TIMEOUT_MS: i64 = 10_000;
/// Default age after which an unacknowledged update is given up: Telegram's own 24 h.
const DEFAULT_GIVE_UP_AFTER_SECS: i64 = 86_400;

/// Which updates go to the bot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardUpdates {
    /// Every recorded update.
    All,
    /// Those opledger did not answer itself (its actions, `/status`, `/help`, its buttons).
    Unhandled,
}

/// Where forwarded updates go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForwardTarget {
    /// The bot's own webhook (`url`, http or https): a POST of the exact bytes, until it
    /// answers 2xx.
    Webhook(Url),
    /// The handlers of the Rust program that embeds opledger (`in_process = true`): the exact
    /// bytes through the hand-over that program registers, until its handlers are done.
    InProcess,
}

/// A bot's gateway: where its updates go and how.
#[derive(Debug, Clone)]
pub struct ForwardConfig {
    /// The bot's webhook, or the embedding program's handlers.
    pub target: ForwardTarget,
    /// The environment variable the secret was read from.
    pub secret_env: Option<String>,
    /// Sent as `X-Telegram-Bot-Api-Secret-Token`, so an unchanged bot keeps checking it.
    pub secret: Option<SecretString>,
    /// Which updates are forwarded; default [`ForwardUpdates::Unhandled`].
    pub updates: ForwardUpdates,
    /// How long one attempt may take; default 10 s, 100 ms to 60 s.
    pub timeout: Duration,
    /// How long an update may wait for the bot's 2xx before it is given up; default 24 h,
    /// 1 s to 7 days.
    pub give_up_after: Duration,
}

impl ForwardConfig {
    pub(crate) fn from_raw(
        bot: usize,
        raw: RawForward,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let key = |field: &str| format!("bots[{bot}].forward.{field}");
        let target = match (raw.url, raw.in_process) {
            (Some(_), Some(true)) => {
                return Err(ConfigError::key_problem(
                    key("in_process"),
                    "cannot be combined with url: updates go either to the bot's webhook or to \
                     the handlers of the program that embeds opledger; remove one of the two",
                ));
            }
            (Some(text), _) => ForwardTarget::Webhook(
                http_url(&text).map_err(|problem| ConfigError::key_problem(key("url"), problem))?,
            ),
            (None, Some(true)) => ForwardTarget::InProcess,
            (None, _) => {
                return Err(ConfigError::key_problem(
                    key("url"),
                    "is required: the bot's own webhook, e.g. \"http://127.0.0.1:8081/webhook\" \
                     (or `in_process = true` in a Rust program that embeds opledger)",
                ));
            }
        };
        let (secret_env, secret) = match raw.secret_env {
            None => (None, None),
            Some(var) => {
                let secret = webhook_secret(&key("secret_env"), &var, env)?;
                (Some(var), Some(secret))
            }
        };
        let updates = match raw.updates.as_deref() {
            None | Some("unhandled") => ForwardUpdates::Unhandled,
            Some("all") => ForwardUpdates::All,
            Some(other) => {
                return Err(ConfigError::key_problem(
                    key("updates"),
                    format!("must be \"all\" or \"unhandled\", not {other:?}"),
                ));
            }
        };
        let timeout = in_range(
            &key("timeout_ms"),
            raw.timeout_ms,
            DEFAULT_FORWARD_TIMEOUT_MS,
            100..=60_000,
            " milliseconds",
        )?;
        let give_up_after = in_range(
            &key("give_up_after_secs"),
            raw.give_up_after_secs,
            DEFAULT_GIVE_UP_AFTER_SECS,
            1..=604_800,
            " seconds (Telegram itself gives up after 86400)",
        )?;
        Ok(ForwardConfig {
            target,
            secret_env,
            secret,
            updates,
            timeout: Duration::from_millis(timeout.unsigned_abs()),
            give_up_after: Duration::from_secs(give_up_after.unsigned_abs()),
        })
    }
}
