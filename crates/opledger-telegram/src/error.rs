//! What can go wrong at the Telegram edge: an update body that cannot be read
//! ([`Quarantine`]) and a Bot API call that did not succeed ([`BotApiError`]). No message here ever
//! contains the bot token or the body of an update.

use opledger_domain::text::Redactor;

/// Why an update body was set aside instead of recorded.
///
/// The intake still answers 200 for these (Telegram would only re-send the same bytes), and keeps a
/// quarantine record with the digest and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum QuarantineReason {
    /// The body is not valid JSON (or nests deeper than the JSON parser allows).
    #[error("the body is not json")]
    NotJson,
    /// The body is JSON, but not an object.
    #[error("the body is json but not an object")]
    NotAnObject,
    /// The object has no `update_id`, or it is not an integer that fits an `i64`.
    #[error("the body has no integer update_id")]
    NoUpdateId,
}

impl QuarantineReason {
    /// A stable, machine-readable name for records and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::NotJson => "not_json",
            Self::NotAnObject => "not_an_object",
            Self::NoUpdateId => "no_update_id",
        }
    }
}

/// An update body that could not be read as an update.
///
/// It exists so that the caller can keep a durable note of what arrived (its digest and size)
/// without keeping the body, which may hold user text or garbage of any size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "update quarantined because {reason}: record its digest and size, acknowledge it, do not process it"
)]
pub struct Quarantine {
    /// What is wrong with the body.
    pub reason: QuarantineReason,
    /// Lower-case hex SHA-256 of the exact bytes received.
    pub digest: String,
    /// Number of bytes received.
    pub size: usize,
}

/// A Bot API call that did not succeed.
///
/// The variants are named for what the caller does next; the one question every caller must answer
/// is whether the call may have taken effect, which [`BotApiError::is_definitely_not_delivered`]
/// answers. Messages never contain the bot token: transport errors are stored without their URL.
#[derive(Debug, thiserror::Error)]
pub enum BotApiError {
    /// The bot token contains characters a Telegram token never has, so it cannot be put in a URL
    /// safely.
    #[error(
        "the bot token has characters a telegram token never has (allowed: letters, digits, `:`, `_`, `-`): check the bot token"
    )]
    InvalidToken,
    /// The Bot API base URL is unusable.
    #[error("the bot api base url is invalid ({detail}): give a url like https://api.telegram.org")]
    InvalidBaseUrl {
        /// What is wrong with it (never the URL itself, which may carry credentials).
        detail: &'static str,
    },
    /// The HTTP client could not be built (see `BotApi::http_client`).
    #[error("could not build the http client for the bot api: check the tls setup of this build")]
    HttpClient {
        /// The HTTP client's error.
        #[source]
        source: reqwest::Error,
    },
    /// The call was refused before sending because an argument would make Telegram discard or
    /// reject something.
    #[error("refused to call {method}: {detail}")]
    InvalidArgument {
        /// The Bot API method.
        method: &'static str,
        /// What is wrong with the argument.
        detail: String,
    },
    /// Telegram answered with an error the other variants do not cover.
    #[error("telegram rejected {method} with error {code}: {description}")]
    Api {
        /// The Bot API method.
        method: &'static str,
        /// Telegram's `error_code` (or the HTTP status when the answer had none).
        code: i64,
        /// Telegram's `description`.
        description: String,
    },
    /// Flood control: Telegram refused the call and asks to wait.
    #[error("telegram refused {method} because of flood control: wait {seconds} s, then try again")]
    RetryAfter {
        /// The Bot API method.
        method: &'static str,
        /// `parameters.retry_after` (or the `Retry-After` header).
        seconds: u64,
    },
    /// The group became a supergroup; the call must be repeated with the new chat id.
    #[error(
        "telegram refused {method} because the chat moved to {migrate_to_chat_id}: use the new chat id"
    )]
    ChatMigrated {
        /// The Bot API method.
        method: &'static str,
        /// `parameters.migrate_to_chat_id`.
        migrate_to_chat_id: i64,
    },
    /// 409: a webhook is set while polling, or another process polls with the same token.
    #[error(
        "telegram refused {method} because another consumer of this bot is active ({description}): stop the other poller, or delete the webhook before polling"
    )]
    Conflict {
        /// The Bot API method.
        method: &'static str,
        /// Telegram's `description`, which says which of the two it is.
        description: String,
    },
    /// 401: Telegram does not accept the token.
    #[error("telegram refused the bot token for {method}: check the bot token")]
    Unauthorized {
        /// The Bot API method.
        method: &'static str,
    },
    /// The request was sent but no answer came in time: it may or may not have taken effect.
    #[error("no answer from the bot api to {method} in time: it may or may not have taken effect")]
    Timeout {
        /// The Bot API method.
        method: &'static str,
    },
    /// No connection could be made: nothing was sent.
    #[error(
        "could not connect to the bot api for {method}, nothing was sent: check the base url and the network"
    )]
    Unreachable {
        /// The Bot API method.
        method: &'static str,
    },
    /// The connection failed after it was made: the call may or may not have taken effect.
    #[error(
        "the connection to the bot api failed during {method}: it may or may not have taken effect"
    )]
    Transport {
        /// The Bot API method.
        method: &'static str,
        /// The HTTP client's error, stripped of its URL (which contains the token).
        #[source]
        source: reqwest::Error,
    },
    /// Telegram answered, but the answer could not be read.
    #[error(
        "could not read the bot api's answer to {method} ({detail}): it may or may not have taken effect"
    )]
    Decode {
        /// The Bot API method.
        method: &'static str,
        /// What could not be read (never the answer's content).
        detail: String,
    },
}

impl BotApiError {
    /// Whether the call certainly did not take effect, so repeating it cannot duplicate anything.
    ///
    /// True when nothing was sent (bad arguments, no connection) or Telegram refused the call (4xx
    /// answers, flood control, conflicts, a bad token). False when the outcome is unknown: a
    /// timeout, a connection that broke after sending, a 5xx answer, an answer that could not be
    /// read, and 408 (a request timeout reported by something in between).
    pub fn is_definitely_not_delivered(&self) -> bool {
        match self {
            Self::InvalidToken
            | Self::InvalidBaseUrl { .. }
            | Self::HttpClient { .. }
            | Self::InvalidArgument { .. }
            | Self::RetryAfter { .. }
            | Self::ChatMigrated { .. }
            | Self::Conflict { .. }
            | Self::Unauthorized { .. }
            | Self::Unreachable { .. } => true,
            Self::Api { code, .. } => (400..500).contains(code) && *code != 408,
            Self::Timeout { .. } | Self::Transport { .. } | Self::Decode { .. } => false,
        }
    }

    /// The error with every secret `redactor` knows scrubbed from Telegram's descriptions, the
    /// only texts in it that come from outside (ADR 0011).
    pub fn redacted(self, redactor: &Redactor) -> Self {
        match self {
            Self::Api {
                method,
                code,
                description,
            } => Self::Api {
                method,
                code,
                description: redactor.kept_string(description),
            },
            Self::Conflict {
                method,
                description,
            } => Self::Conflict {
                method,
                description: redactor.kept_string(description),
            },
            other => other,
        }
    }

    /// The Bot API method the error belongs to, if a call was attempted.
    pub fn method(&self) -> Option<&'static str> {
        match self {
            Self::InvalidToken | Self::InvalidBaseUrl { .. } | Self::HttpClient { .. } => None,
            Self::InvalidArgument { method, .. }
            | Self::Api { method, .. }
            | Self::RetryAfter { method, .. }
            | Self::ChatMigrated { method, .. }
            | Self::Conflict { method, .. }
            | Self::Unauthorized { method }
            | Self::Timeout { method }
            | Self::Unreachable { method }
            | Self::Transport { method, .. }
            | Self::Decode { method, .. } => Some(method),
        }
    }
}
