//! A small Telegram Bot API client: long polling, webhook set-up, replies and callback answers,
//! with every failure sorted by whether the call may have taken effect, and the bot token kept out
//! of every error, log line and `Debug` output.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use opledger_domain::text::{Redactor, storable};
use reqwest::StatusCode;
use reqwest::header::RETRY_AFTER;
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use url::Url;

use crate::error::{BotApiError, Quarantine};
use crate::update::{Update, parse_update};

/// Default time allowed for one Bot API call, and the margin added to a long poll's own timeout.
const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A Telegram Bot API client bound to one bot.
///
/// It exists to keep the token in one place: the token is only ever put into request URLs, and
/// every error is stripped of its URL, so nothing this client returns or prints contains it.
///
/// Build the `reqwest::Client` with redirects disabled (see [`BotApi::http_client`]): a redirect
/// would carry the token's URL to another place, and do not enable reqwest's verbose connection
/// logging, which prints request lines.
#[derive(Clone)]
pub struct BotApi {
    /// Base URL without a trailing slash, e.g. `https://api.telegram.org`.
    base: String,
    token: SecretString,
    http: reqwest::Client,
    request_timeout: Duration,
    /// Scrubs the token (and the other secrets it was given) from every text Telegram sends
    /// back before it leaves this client: an error may echo the request's path.
    redactor: Redactor,
}

impl fmt::Debug for BotApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only the origin: the base URL could carry credentials, and the token is never shown.
        let origin = Url::parse(&self.base)
            .map(|url| url.origin().ascii_serialization())
            .unwrap_or_default();
        f.debug_struct("BotApi")
            .field("origin", &origin)
            .field("token", &"[redacted]")
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

/// The exact JSON text of one update as `getUpdates` returned it.
///
/// It exists so that a polled update is digested and recorded on its own bytes, exactly like a
/// webhook body. Its `Debug` shows only the size: the bytes may hold user text.
#[derive(Clone, PartialEq, Eq)]
pub struct RawUpdate {
    /// The update's JSON text, byte for byte as it appeared in the answer.
    pub bytes: Vec<u8>,
}

impl RawUpdate {
    /// Reads the update (see [`parse_update`]).
    pub fn parse(&self) -> Result<Update, Quarantine> {
        parse_update(&self.bytes)
    }
}

impl fmt::Debug for RawUpdate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawUpdate")
            .field("size", &self.bytes.len())
            .finish_non_exhaustive()
    }
}

/// The arguments of `setWebhook` that opledger uses.
///
/// `drop_pending_updates` discards user actions waiting in Telegram's queue: set it only when an
/// operator asked for it explicitly.
#[derive(Debug, Clone)]
pub struct SetWebhook {
    /// HTTPS URL Telegram will post updates to.
    pub url: String,
    /// Sent back by Telegram in `X-Telegram-Bot-Api-Secret-Token`: 1–256 of `A-Z a-z 0-9 _ -`.
    pub secret_token: SecretString,
    /// Kinds to receive. An empty list means "all kinds except `chat_member`, `message_reaction`
    /// and `message_reaction_count`".
    pub allowed_updates: Vec<String>,
    /// Simultaneous connections Telegram may open (1–100; Telegram's default is 40).
    pub max_connections: Option<u32>,
    /// Drop the updates waiting in Telegram's queue. Only on an operator's explicit request.
    pub drop_pending_updates: bool,
}

/// Telegram's view of the webhook (`getWebhookInfo`).
///
/// Read tolerantly: a missing or mistyped field is empty rather than an error, because this is
/// read when something already looks wrong.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WebhookInfo {
    /// Webhook URL; empty when no webhook is set (long polling).
    pub url: String,
    /// Whether a self-signed certificate was uploaded.
    pub has_custom_certificate: bool,
    /// Updates waiting for delivery.
    pub pending_update_count: u64,
    /// IP address Telegram uses for the webhook.
    pub ip_address: Option<String>,
    /// Last failed delivery; a date that keeps growing means delivery still fails.
    pub last_error_date: Option<DateTime<Utc>>,
    /// Telegram's description of the last failed delivery.
    pub last_error_message: Option<String>,
    /// Last error while synchronizing with Telegram's data centers.
    pub last_synchronization_error_date: Option<DateTime<Utc>>,
    /// Maximum simultaneous connections.
    pub max_connections: Option<u32>,
    /// Kinds the bot is subscribed to, if set.
    pub allowed_updates: Option<Vec<String>>,
}

impl WebhookInfo {
    /// Reads the answer, every text as it may be shown: storable and without a known secret.
    fn from_value(value: &Value, redactor: &Redactor) -> WebhookInfo {
        let string = |key: &str| {
            value
                .get(key)
                .and_then(Value::as_str)
                .map(|text| redactor.kept(text))
        };
        let date = |key: &str| {
            value
                .get(key)
                .and_then(Value::as_i64)
                .filter(|seconds| *seconds > 0)
                .and_then(|seconds| DateTime::from_timestamp(seconds, 0))
        };
        WebhookInfo {
            url: string("url").unwrap_or_default(),
            has_custom_certificate: value
                .get("has_custom_certificate")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            pending_update_count: value
                .get("pending_update_count")
                .and_then(Value::as_u64)
                .unwrap_or(0),
            ip_address: string("ip_address"),
            last_error_date: date("last_error_date"),
            last_error_message: string("last_error_message"),
            last_synchronization_error_date: date("last_synchronization_error_date"),
            max_connections: value
                .get("max_connections")
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok()),
            allowed_updates: value
                .get("allowed_updates")
                .and_then(Value::as_array)
                .map(|kinds| {
                    kinds
                        .iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                }),
        }
    }
}

/// What opledger keeps of a sent message: its id, to refer to it later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SentMessage {
    /// Telegram's id of the sent message.
    pub message_id: i64,
}

/// How errors of [`BotApi::call_answer`] name the call (its method is the bot's choice).
pub(crate) const ANSWER_CALL: &str = "the bot's answer call";

#[derive(Serialize)]
struct GetUpdatesBody<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    offset: Option<i64>,
    limit: u8,
    timeout: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    allowed_updates: Option<&'a [String]>,
}

#[derive(Serialize)]
struct SetWebhookBody<'a> {
    url: &'a str,
    secret_token: &'a str,
    allowed_updates: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    max_connections: Option<u32>,
    #[serde(skip_serializing_if = "is_false")]
    drop_pending_updates: bool,
}

#[derive(Serialize)]
struct DeleteWebhookBody {
    #[serde(skip_serializing_if = "is_false")]
    drop_pending_updates: bool,
}

/// An inline keyboard under a message (`reply_markup`): rows of buttons whose clicks come back
/// as callback queries carrying their `callback_data`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InlineKeyboard {
    /// The rows, top to bottom, each a list of buttons left to right.
    pub inline_keyboard: Vec<Vec<InlineButton>>,
}

/// One button of an [`InlineKeyboard`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InlineButton {
    /// Its label.
    pub text: String,
    /// What a click sends back: 1 to 64 bytes, as Telegram allows.
    pub callback_data: String,
}

#[derive(Serialize)]
struct SendMessageBody<'a> {
    chat_id: i64,
    text: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reply_markup: Option<&'a InlineKeyboard>,
}

#[derive(Serialize)]
struct AnswerCallbackQueryBody<'a> {
    callback_query_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
}

#[derive(Serialize)]
struct NoArguments {}

fn is_false(value: &bool) -> bool {
    !value
}

/// Telegram's answer envelope. Everything but `result` is read tolerantly, so that an odd error
/// answer is still classified by its status.
#[derive(Deserialize)]
pub(crate) struct Envelope {
    #[serde(default)]
    pub(crate) ok: Option<Value>,
    #[serde(default)]
    pub(crate) result: Option<Box<RawValue>>,
    #[serde(default)]
    pub(crate) error_code: Option<Value>,
    #[serde(default)]
    pub(crate) description: Option<Value>,
    #[serde(default)]
    pub(crate) parameters: Option<Value>,
}

impl BotApi {
    /// A client for the bot with `token`, calling `{base_url}/bot{token}/{method}`.
    ///
    /// `base_url` is `https://api.telegram.org`, a local Bot API server, or a fake on loopback in
    /// tests; a trailing slash is ignored.
    pub fn new(
        base_url: &str,
        token: SecretString,
        http: reqwest::Client,
    ) -> Result<Self, BotApiError> {
        let url = Url::parse(base_url).map_err(|_| BotApiError::InvalidBaseUrl {
            detail: "not an absolute url",
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(BotApiError::InvalidBaseUrl {
                detail: "the scheme is not http or https",
            });
        }
        if url.cannot_be_a_base() || url.host().is_none() {
            return Err(BotApiError::InvalidBaseUrl {
                detail: "it has no host",
            });
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(BotApiError::InvalidBaseUrl {
                detail: "it has a query or a fragment",
            });
        }
        // A token with other characters could change the URL's structure (`/`, `?`, `#`) or be
        // percent-encoded into something Telegram would not recognise.
        let secret = token.expose_secret();
        if secret.is_empty()
            || !secret
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, ':' | '_' | '-'))
        {
            return Err(BotApiError::InvalidToken);
        }
        Ok(BotApi {
            base: url.as_str().trim_end_matches('/').to_owned(),
            redactor: Redactor::new([&token]),
            token,
            http,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        })
    }

    /// Scrubs the secrets `redactor` knows too (the whole configuration's, see
    /// `Config::redactor`) from what Telegram sends back; the token always is.
    pub fn redacting(mut self, redactor: &Redactor) -> Self {
        self.redactor = redactor.with([&self.token]);
        self
    }

    /// An HTTP client suited to the Bot API: no redirects (they would carry the token elsewhere)
    /// and a bounded connection time.
    pub fn http_client() -> Result<reqwest::Client, BotApiError> {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| BotApiError::HttpClient {
                source: e.without_url(),
            })
    }

    /// Sets how long one call may take (default 30 s). A long poll may take its own timeout plus
    /// this.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// `getUpdates`: the next batch of updates, each as its exact bytes.
    ///
    /// Passing `offset` confirms every update with a lower id: pass it only once the previous
    /// batch is durably stored. `limit` is clamped to Telegram's 1–100. A negative offset (which
    /// makes Telegram forget updates) is refused: dropping updates is for an operator, through
    /// [`BotApi::delete_webhook`] with `drop_pending_updates`.
    #[tracing::instrument(level = "debug", skip_all, fields(offset = ?offset, limit = limit, timeout_secs = timeout_secs))]
    pub async fn get_updates(
        &self,
        offset: Option<i64>,
        limit: u8,
        timeout_secs: u32,
        allowed_updates: Option<&[String]>,
    ) -> Result<Vec<RawUpdate>, BotApiError> {
        const METHOD: &str = "getUpdates";
        if offset.is_some_and(|offset| offset < 0) {
            return Err(BotApiError::InvalidArgument {
                method: METHOD,
                detail: "a negative offset makes telegram forget updates; use an offset above the last stored update_id".to_owned(),
            });
        }
        let body = GetUpdatesBody {
            offset,
            limit: limit.clamp(1, 100),
            timeout: timeout_secs,
            allowed_updates,
        };
        // The HTTP timeout must outlast Telegram's long poll, or every quiet poll would fail.
        let timeout = Duration::from_secs(u64::from(timeout_secs)) + self.request_timeout;
        let result = self.call(METHOD, &body, timeout).await?;
        raw_updates(&result)
    }

    /// `setWebhook`: Telegram will post updates to `req.url` with `req.secret_token`.
    #[tracing::instrument(level = "debug", skip_all)]
    pub async fn set_webhook(&self, req: &SetWebhook) -> Result<(), BotApiError> {
        const METHOD: &str = "setWebhook";
        let secret = req.secret_token.expose_secret();
        if secret.is_empty()
            || secret.len() > 256
            || !secret
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
        {
            return Err(BotApiError::InvalidArgument {
                method: METHOD,
                detail: "the secret token must be 1-256 characters of A-Z, a-z, 0-9, `_` and `-`"
                    .to_owned(),
            });
        }
        let body = SetWebhookBody {
            url: &req.url,
            secret_token: secret,
            allowed_updates: &req.allowed_updates,
            max_connections: req.max_connections,
            drop_pending_updates: req.drop_pending_updates,
        };
        self.call(METHOD, &body, self.request_timeout).await?;
        Ok(())
    }

    /// `getWebhookInfo`: Telegram's view of the webhook and its delivery errors.
    #[tracing::instrument(level = "debug", skip_all)]
    pub async fn get_webhook_info(&self) -> Result<WebhookInfo, BotApiError> {
        const METHOD: &str = "getWebhookInfo";
        let result = self
            .call(METHOD, &NoArguments {}, self.request_timeout)
            .await?;
        webhook_info(&result, &self.redactor)
    }

    /// `deleteWebhook`, needed before long polling. `drop_pending_updates` discards user actions
    /// waiting in Telegram's queue: only on an operator's explicit request.
    #[tracing::instrument(level = "debug", skip_all, fields(drop_pending_updates = drop_pending_updates))]
    pub async fn delete_webhook(&self, drop_pending_updates: bool) -> Result<(), BotApiError> {
        let body = DeleteWebhookBody {
            drop_pending_updates,
        };
        self.call("deleteWebhook", &body, self.request_timeout)
            .await?;
        Ok(())
    }

    /// `sendMessage` with plain text. Telegram offers no idempotency for it: after a
    /// [`BotApiError::Timeout`] the message may or may not have been sent.
    pub async fn send_message(&self, chat_id: i64, text: &str) -> Result<SentMessage, BotApiError> {
        self.send_message_with(chat_id, text, None).await
    }

    /// `sendMessage` with plain text and, when given, an inline keyboard under it; as
    /// [`BotApi::send_message`], the message may or may not have been sent after a timeout.
    #[tracing::instrument(level = "debug", skip_all, fields(chat_id = chat_id))]
    pub async fn send_message_with(
        &self,
        chat_id: i64,
        text: &str,
        keyboard: Option<&InlineKeyboard>,
    ) -> Result<SentMessage, BotApiError> {
        const METHOD: &str = "sendMessage";
        let body = SendMessageBody {
            chat_id,
            text,
            reply_markup: keyboard,
        };
        let result = self.call(METHOD, &body, self.request_timeout).await?;
        sent_message(&result)
    }

    /// `answerCallbackQuery`: stops the client's progress indicator, optionally with a notice.
    /// Useless after about 150 s, when Telegram answers "query is too old".
    #[tracing::instrument(level = "debug", skip_all)]
    pub async fn answer_callback_query(
        &self,
        callback_query_id: &str,
        text: Option<&str>,
    ) -> Result<(), BotApiError> {
        let body = AnswerCallbackQueryBody {
            callback_query_id,
            text,
        };
        self.call("answerCallbackQuery", &body, self.request_timeout)
            .await?;
        Ok(())
    }

    /// Carries out a Bot API call a bot returned in its webhook answer (`{"method": ..., ...}`):
    /// `method` with `params` as its JSON body, once. Errors name it as [`ANSWER_CALL`]; the
    /// caller records the method itself. The result is returned as Telegram gave it.
    #[tracing::instrument(level = "debug", skip_all)]
    pub async fn call_answer(
        &self,
        method: &str,
        params: &serde_json::Map<String, Value>,
    ) -> Result<Box<RawValue>, BotApiError> {
        if method.is_empty()
            || method.len() > 64
            || !method.bytes().all(|b| b.is_ascii_alphanumeric())
        {
            return Err(BotApiError::Decode {
                method: ANSWER_CALL,
                detail: "the method name is not a Bot API method name (letters and digits)"
                    .to_owned(),
            });
        }
        self.call_named(method, ANSWER_CALL, params, self.request_timeout)
            .await
    }

    /// `{base}/bot{token}/{method}`. The result must never be formatted or logged.
    fn method_url(&self, method: &str) -> Result<Url, BotApiError> {
        let url = format!("{}/bot{}/{method}", self.base, self.token.expose_secret());
        Url::parse(&url).map_err(|_| BotApiError::InvalidBaseUrl {
            detail: "it cannot be joined with the bot token and method",
        })
    }

    /// Posts `body` as JSON and returns the envelope's `result`, or the classified failure.
    async fn call<B: Serialize + ?Sized>(
        &self,
        method: &'static str,
        body: &B,
        timeout: Duration,
    ) -> Result<Box<RawValue>, BotApiError> {
        self.call_named(method, method, body, timeout).await
    }

    /// [`BotApi::call`] of `url_method`, with errors naming `method`.
    async fn call_named<B: Serialize + ?Sized>(
        &self,
        url_method: &str,
        method: &'static str,
        body: &B,
        timeout: Duration,
    ) -> Result<Box<RawValue>, BotApiError> {
        let url = self.method_url(url_method)?;
        let outcome = async {
            let response = self
                .http
                .post(url)
                .json(body)
                .timeout(timeout)
                .send()
                .await
                .map_err(|e| transport_error(method, e))?;
            let status = response.status();
            let retry_after = response
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok());
            let bytes = response
                .bytes()
                .await
                .map_err(|e| transport_error(method, e))?;
            tracing::debug!(method, status = status.as_u16(), "bot api answered");
            interpret(method, status, retry_after, &bytes)
        }
        .await;
        // Telegram's descriptions are kept (in the ledger, logs, output): never with a secret.
        let outcome = outcome.map_err(|error| error.redacted(&self.redactor));
        if let Err(error) = &outcome {
            // The error's Display never contains the token.
            tracing::debug!(method, %error, "bot api call failed");
        }
        outcome
    }
}

/// The updates of a `getUpdates` result, each as its exact bytes.
pub(crate) fn raw_updates(result: &RawValue) -> Result<Vec<RawUpdate>, BotApiError> {
    let updates: Vec<Box<RawValue>> =
        serde_json::from_str(result.get()).map_err(|e| decode_error("getUpdates", &e))?;
    Ok(updates
        .into_iter()
        .map(|raw| RawUpdate {
            bytes: raw.get().as_bytes().to_vec(),
        })
        .collect())
}

/// The webhook's state in a `getWebhookInfo` result.
pub(crate) fn webhook_info(
    result: &RawValue,
    redactor: &Redactor,
) -> Result<WebhookInfo, BotApiError> {
    let value: Value =
        serde_json::from_str(result.get()).map_err(|e| decode_error("getWebhookInfo", &e))?;
    Ok(WebhookInfo::from_value(&value, redactor))
}

/// The sent message of a `sendMessage` result.
pub(crate) fn sent_message(result: &RawValue) -> Result<SentMessage, BotApiError> {
    const METHOD: &str = "sendMessage";
    let value: Value = serde_json::from_str(result.get()).map_err(|e| decode_error(METHOD, &e))?;
    let message_id = value
        .get("message_id")
        .and_then(Value::as_i64)
        .ok_or_else(|| BotApiError::Decode {
            method: METHOD,
            detail: "the sent message has no integer message_id".to_owned(),
        })?;
    Ok(SentMessage { message_id })
}

/// Sorts a failed send by whether anything can have reached Telegram. The URL (with the token) is
/// stripped first.
fn transport_error(method: &'static str, error: reqwest::Error) -> BotApiError {
    let error = error.without_url();
    if error.is_connect() {
        BotApiError::Unreachable { method }
    } else if error.is_timeout() {
        BotApiError::Timeout { method }
    } else {
        BotApiError::Transport {
            method,
            source: error,
        }
    }
}

/// Describes a JSON error by category and position only: the message of a data error can quote
/// the answer, which may hold user text.
fn decode_error(method: &'static str, error: &serde_json::Error) -> BotApiError {
    use serde_json::error::Category;
    let category = match error.classify() {
        Category::Io => "i/o error",
        Category::Syntax => "invalid json",
        Category::Data => "unexpected json shape",
        Category::Eof => "truncated json",
    };
    BotApiError::Decode {
        method,
        detail: format!(
            "{category} at line {} column {}",
            error.line(),
            error.column()
        ),
    }
}

/// Reads Telegram's answer: the `result` of a successful call, or the classified error.
pub(crate) fn interpret(
    method: &'static str,
    status: StatusCode,
    retry_after_header: Option<u64>,
    body: &[u8],
) -> Result<Box<RawValue>, BotApiError> {
    let envelope = match serde_json::from_slice::<Envelope>(body) {
        Ok(envelope) => envelope,
        Err(e) if status.is_success() => return Err(decode_error(method, &e)),
        Err(_) => {
            return Err(classify(
                method,
                i64::from(status.as_u16()),
                format!("http status {} without a telegram answer", status.as_u16()),
                retry_after_header,
                None,
            ));
        }
    };
    match envelope.ok.as_ref().and_then(Value::as_bool) {
        Some(true) => envelope.result.ok_or_else(|| BotApiError::Decode {
            method,
            detail: "the answer says ok but has no result".to_owned(),
        }),
        None if status.is_success() => Err(BotApiError::Decode {
            method,
            detail: "the answer has no ok field".to_owned(),
        }),
        Some(false) | None => {
            let code = envelope
                .error_code
                .as_ref()
                .and_then(Value::as_i64)
                .unwrap_or_else(|| i64::from(status.as_u16()));
            // Kept in the ledger when a reply fails: as storable as any text from outside.
            let description = storable(
                envelope
                    .description
                    .as_ref()
                    .and_then(Value::as_str)
                    .unwrap_or("no description"),
            )
            .into_owned();
            let parameters = envelope.parameters.as_ref();
            let retry_after = parameters
                .and_then(|p| p.get("retry_after"))
                .and_then(Value::as_u64)
                .or(retry_after_header);
            let migrate_to = parameters
                .and_then(|p| p.get("migrate_to_chat_id"))
                .and_then(Value::as_i64);
            Err(classify(method, code, description, retry_after, migrate_to))
        }
    }
}

fn classify(
    method: &'static str,
    code: i64,
    description: String,
    retry_after: Option<u64>,
    migrate_to_chat_id: Option<i64>,
) -> BotApiError {
    match (code, retry_after, migrate_to_chat_id) {
        (401, _, _) => BotApiError::Unauthorized { method },
        (409, _, _) => BotApiError::Conflict {
            method,
            description,
        },
        (429, Some(seconds), _) => BotApiError::RetryAfter { method, seconds },
        (_, _, Some(migrate_to_chat_id)) => BotApiError::ChatMigrated {
            method,
            migrate_to_chat_id,
        },
        _ => BotApiError::Api {
            method,
            code,
            description,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, body: &str) -> Result<Box<RawValue>, BotApiError> {
        interpret(
            "sendMessage",
            StatusCode::from_u16(status).expect("a valid status"),
            None,
            body.as_bytes(),
        )
    }

    #[test]
    fn success_returns_the_exact_result() {
        let result = answer(200, r#"{"ok":true,"result":{ "message_id" : 5 }}"#).expect("ok");
        assert_eq!(result.get(), r#"{ "message_id" : 5 }"#);
    }

    #[test]
    fn telegram_errors_are_classified() {
        let cases = [
            (
                429,
                r#"{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 7","parameters":{"retry_after":7}}"#,
                "RetryAfter",
            ),
            (
                409,
                r#"{"ok":false,"error_code":409,"description":"Conflict: terminated by other getUpdates request"}"#,
                "Conflict",
            ),
            (
                401,
                r#"{"ok":false,"error_code":401,"description":"Unauthorized"}"#,
                "Unauthorized",
            ),
            (
                400,
                r#"{"ok":false,"error_code":400,"description":"Bad Request: group chat was upgraded to a supergroup chat","parameters":{"migrate_to_chat_id":-1001234567890}}"#,
                "ChatMigrated",
            ),
            (
                400,
                r#"{"ok":false,"error_code":400,"description":"Bad Request: chat not found"}"#,
                "Api",
            ),
            (502, "<html>bad gateway</html>", "Api"),
            (429, "", "Api"),
            (401, "nope", "Unauthorized"),
            (200, "<html>", "Decode"),
            (200, r#"{"ok":true}"#, "Decode"),
            (200, r#"{"result":true}"#, "Decode"),
        ];
        for (status, body, expected) in cases {
            let error = answer(status, body).expect_err("an error");
            let shown = format!("{error:?}");
            assert!(shown.starts_with(expected), "{status} {body}: {shown}");
        }
    }

    #[test]
    fn retry_after_header_counts_when_parameters_lack_it() {
        let error = interpret("sendMessage", StatusCode::TOO_MANY_REQUESTS, Some(3), b"")
            .expect_err("an error");
        assert!(matches!(error, BotApiError::RetryAfter { seconds: 3, .. }));
    }

    #[test]
    fn delivery_certainty() {
        let not_delivered = [
            answer(
                400,
                r#"{"ok":false,"error_code":400,"description":"Bad Request"}"#,
            ),
            answer(
                403,
                r#"{"ok":false,"error_code":403,"description":"Forbidden: bot was blocked by the user"}"#,
            ),
            answer(
                429,
                r#"{"ok":false,"error_code":429,"description":"x","parameters":{"retry_after":1}}"#,
            ),
            answer(
                409,
                r#"{"ok":false,"error_code":409,"description":"Conflict"}"#,
            ),
            answer(
                401,
                r#"{"ok":false,"error_code":401,"description":"Unauthorized"}"#,
            ),
        ];
        for error in not_delivered {
            let error = error.expect_err("an error");
            assert!(error.is_definitely_not_delivered(), "{error:?}");
        }
        let unknown = [
            answer(
                500,
                r#"{"ok":false,"error_code":500,"description":"Internal Server Error"}"#,
            ),
            answer(502, "bad gateway"),
            answer(408, ""),
            answer(200, "{"),
        ];
        for error in unknown {
            let error = error.expect_err("an error");
            assert!(!error.is_definitely_not_delivered(), "{error:?}");
        }
        assert!(BotApiError::Unreachable { method: "m" }.is_definitely_not_delivered());
        assert!(!BotApiError::Timeout { method: "m" }.is_definitely_not_delivered());
    }

    #[test]
    fn decode_errors_do_not_quote_the_answer() {
        let error = answer(200, r#"{"ok":true,"result":"private words"}"#)
            .map(|r| serde_json::from_str::<Vec<Box<RawValue>>>(r.get()))
            .expect("ok")
            .map_err(|e| decode_error("getUpdates", &e))
            .expect_err("not an array");
        assert!(!format!("{error}").contains("private words"), "{error}");
    }

    #[test]
    fn base_url_and_token_are_checked() {
        let http = reqwest::Client::new();
        let token = || SecretString::from("123:abc-DEF_9");
        for bad in [
            "",
            "127.0.0.1:80",
            "ftp://x",
            "http://x/?a=1",
            "http://x/#f",
            "mailto:a@b",
        ] {
            assert!(
                matches!(
                    BotApi::new(bad, token(), http.clone()),
                    Err(BotApiError::InvalidBaseUrl { .. })
                ),
                "{bad}"
            );
        }
        for bad in [
            "",
            "123:abc/def",
            "123:abc?x",
            "12 3:abc",
            "123:äbc",
            "123:a%2F",
        ] {
            let error = BotApi::new("http://127.0.0.1:1", SecretString::from(bad), http.clone())
                .expect_err("a bad token");
            assert!(matches!(error, BotApiError::InvalidToken));
        }
        let api = BotApi::new("http://127.0.0.1:1/prefix/", token(), http).expect("valid");
        assert_eq!(
            api.method_url("getMe").expect("a url").as_str(),
            "http://127.0.0.1:1/prefix/bot123:abc-DEF_9/getMe"
        );
    }
}
