//! The validated configuration and the rules that turn the file's text into it.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use opledger_domain::NameKind;
use opledger_domain::ids::validate_name;
use opledger_domain::text::Redactor;
use secrecy::{ExposeSecret, SecretString};
use url::Url;

use crate::error::{ConfigError, List};
use crate::raw::{
    self, RawAction, RawApi, RawBot, RawClient, RawEffector, RawReply, RawServer, RawStorage,
};
use crate::template::{
    ConfirmTemplate, KeyTemplate, RESERVED_PARAM_NAMES, ReplyKind, ReplyTemplate, UrlTemplate,
    http_url,
};
use crate::values::{in_range, read_secret, webhook_secret};

/// Commands answered by built-in pure queries; no action may take them.
pub const RESERVED_COMMANDS: [&str; 2] = ["help", "status"];

/// Telegram's rule for bot commands: 1 to 32 characters.
const MAX_COMMAND_LEN: usize = 32;

/// The shortest admin token accepted: shorter ones can be guessed.
const MIN_ADMIN_TOKEN_LEN: usize = 16;
/// The longest admin token accepted (it travels in a header).
const MAX_ADMIN_TOKEN_LEN: usize = 512;

const DEFAULT_STORAGE_URL: &str = "sqlite://opledger.db";
const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8080);
const DEFAULT_BODY_LIMIT_BYTES: i64 = 1024 * 1024;
const DEFAULT_REQUEST_TIMEOUT_MS: i64 = 10_000;
const DEFAULT_SHUTDOWN_GRACE_MS: i64 = 10_000;
const DEFAULT_DEDUP_RETENTION_HOURS: i64 = 72;
const DEFAULT_CONNECTION_LIMIT: i64 = 512;
const DEFAULT_HEADER_READ_TIMEOUT_MS: i64 = 10_000;
const DEFAULT_IDLE_TIMEOUT_MS: i64 = 60_000;
const DEFAULT_API_BASE_URL: &str = "https://api.telegram.org";
const DEFAULT_POLL_TIMEOUT_SECS: i64 = 30;
const DEFAULT_MAX_CONNECTIONS: i64 = 40;
const DEFAULT_EFFECTOR_TIMEOUT_MS: i64 = 2_000;
const DEFAULT_MAX_ATTEMPTS: i64 = 5;
/// How long a confirmation's buttons work when `confirm_expiry_secs` is not given: ten minutes.
const DEFAULT_CONFIRM_EXPIRY_SECS: i64 = 600;

/// The whole configuration of one opledger process, validated.
///
/// It exists so that every check happens once, at start: a process holding a `Config` has every
/// secret it needs, every name, template and URL is well formed, and every action names a bot.
/// It is built by the CLI from the file's text and the environment, and passed explicitly;
/// tests may build it directly. Its `Debug` output never shows a secret.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the ledger lives.
    pub storage: StorageConfig,
    /// The HTTP server: webhook intake, read API, health.
    pub server: ServerConfig,
    /// The read API under `/v1`: on only when an admin token is configured.
    pub api: ApiConfig,
    /// The Telegram bots served, names unique.
    pub bots: Vec<BotConfig>,
    /// Commands mapped to business actions; each names one of `bots`.
    pub actions: Vec<ActionConfig>,
}

impl Default for Config {
    /// The configuration without a file: SQLite at `opledger.db`, listening on
    /// `127.0.0.1:8080`, no bots and no actions.
    fn default() -> Self {
        Config {
            storage: StorageConfig::default(),
            server: ServerConfig::default(),
            api: ApiConfig::default(),
            bots: Vec::new(),
            actions: Vec::new(),
        }
    }
}

impl Config {
    /// Parses and validates a configuration file's text.
    ///
    /// `env` looks up an environment variable by name; it is called only for the variables the
    /// file names in `*_env` keys. The first problem found is returned, naming its key.
    pub fn parse(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let raw = raw::parse(text)?;
        let storage = match raw.storage {
            Some(storage) => StorageConfig::from_raw(storage)?,
            None => StorageConfig::default(),
        };
        let server = match raw.server {
            Some(server) => ServerConfig::from_raw(server)?,
            None => ServerConfig::default(),
        };
        let mut bots: Vec<BotConfig> = Vec::with_capacity(raw.bots.len());
        for (i, bot) in raw.bots.into_iter().enumerate() {
            let bot = BotConfig::from_raw(i, bot, env)?;
            if let Some(first) = bots.iter().position(|b| b.name == bot.name) {
                return Err(ConfigError::key_problem(
                    format!("bots[{i}].name"),
                    format!(
                        "duplicate bot name `{}` (also bots[{first}].name); give each bot its own name",
                        bot.name
                    ),
                ));
            }
            bots.push(bot);
        }

        let mut actions: Vec<ActionConfig> = Vec::with_capacity(raw.actions.len());
        for (i, action) in raw.actions.into_iter().enumerate() {
            let action = ActionConfig::from_raw(i, action, &bots)?;
            if let Some(first) = actions.iter().position(|a| a.name == action.name) {
                return Err(ConfigError::key_problem(
                    format!("actions[{i}].name"),
                    format!(
                        "duplicate action name `{}` (also actions[{first}].name); action names \
                         must be unique because they name the operations' streams",
                        action.name
                    ),
                ));
            }
            if let Some(command) = &action.command
                && let Some(first) = actions
                    .iter()
                    .position(|a| a.bot == action.bot && a.command.as_ref() == Some(command))
            {
                return Err(ConfigError::key_problem(
                    format!("actions[{i}].command"),
                    format!(
                        "duplicate command `/{command}` for bot `{}` (also actions[{first}], action \
                         `{}`); give each action of a bot its own command",
                        action.bot, actions[first].name
                    ),
                ));
            }
            actions.push(action);
        }

        let api = match raw.api {
            Some(api) => ApiConfig::from_raw(api, &bots, env)?,
            None => ApiConfig::default(),
        };

        Ok(Config {
            storage,
            server,
            api,
            bots,
            actions,
        })
    }

    /// Scrubs every secret of this configuration (bot tokens, webhook secrets, the admin token,
    /// passwords in effector URLs) from text received from outside, before it is kept in an
    /// event, a log line or a command's output (ADR 0011).
    pub fn redactor(&self) -> Redactor {
        let url_passwords: Vec<SecretString> = self
            .actions
            .iter()
            .filter_map(|action| action.effector.as_ref()?.url.as_ref()?.password())
            .map(SecretString::from)
            .collect();
        Redactor::new(
            self.bots
                .iter()
                .flat_map(|bot| {
                    std::iter::once(&bot.token)
                        .chain(bot.webhook_secret.as_ref())
                        .chain(bot.forward.as_ref().and_then(|f| f.secret.as_ref()))
                })
                .chain(self.api.admin_token.as_ref())
                .chain(&url_passwords),
        )
    }

    /// The bot named `name`.
    pub fn bot(&self, name: &str) -> Option<&BotConfig> {
        self.bots.iter().find(|b| b.name == name)
    }

    /// The action named `name`.
    pub fn action(&self, name: &str) -> Option<&ActionConfig> {
        self.actions.iter().find(|a| a.name == name)
    }

    /// The action that `/command` (without the slash) starts on `bot`.
    pub fn action_for_command(&self, bot: &str, command: &str) -> Option<&ActionConfig> {
        self.actions
            .iter()
            .find(|a| a.bot == bot && a.command.as_deref() == Some(command))
    }
}

/// Where the ledger is stored.
#[derive(Debug, Clone)]
pub struct StorageConfig {
    /// The database URL; `sqlite:…` or `postgres://…`.
    pub url: StorageUrl,
}

impl Default for StorageConfig {
    /// SQLite in `opledger.db` in the working directory.
    fn default() -> Self {
        StorageConfig {
            url: StorageUrl {
                url: SecretString::from(DEFAULT_STORAGE_URL),
                backend: StorageBackend::Sqlite,
            },
        }
    }
}

impl StorageConfig {
    fn from_raw(raw: RawStorage) -> Result<Self, ConfigError> {
        let Some(url) = raw.url else {
            return Err(ConfigError::key_problem(
                "storage.url",
                "is required when [storage] is present; write e.g. \"sqlite://opledger.db\" or \
                 \"postgres://user@host/db\", or remove [storage] for the SQLite default",
            ));
        };
        Ok(StorageConfig {
            url: StorageUrl::new(&url)?,
        })
    }
}

/// Which database a [`StorageUrl`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StorageBackend {
    /// An embedded SQLite file (`sqlite:`).
    Sqlite,
    /// A PostgreSQL server (`postgres://` or `postgresql://`).
    Postgres,
}

/// A database URL, which may carry a password.
///
/// It exists so that the password cannot be printed by accident: `Debug` and `Display` show
/// the URL with its password replaced by `***`, and the full text needs
/// [`StorageUrl::expose_secret`].
#[derive(Clone)]
pub struct StorageUrl {
    url: SecretString,
    backend: StorageBackend,
}

impl StorageUrl {
    /// Checks a database URL; the error names the key `storage.url`.
    pub fn new(url: &str) -> Result<StorageUrl, ConfigError> {
        let problem = |p: String| ConfigError::key_problem("storage.url", p);
        let backend = if url.starts_with("sqlite:") {
            StorageBackend::Sqlite
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            StorageBackend::Postgres
        } else if url.is_empty() {
            return Err(problem(
                "is empty; write e.g. \"sqlite://opledger.db\" or \"postgres://user@host/db\""
                    .to_owned(),
            ));
        } else {
            // Only the scheme is shown: the rest may hold a password.
            let scheme = url.split_once(':').map(|(s, _)| s).filter(|s| {
                !s.is_empty()
                    && s.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
            });
            let found =
                scheme.map_or_else(|| "it has no scheme".to_owned(), |s| format!("not `{s}:`"));
            return Err(problem(format!(
                "must start with `sqlite:`, `postgres://` or `postgresql://` ({found})"
            )));
        };
        if backend == StorageBackend::Postgres {
            let parsed = Url::parse(url)
                .map_err(|e| problem(format!("is not a valid PostgreSQL URL: {e}")))?;
            if parsed.host_str().is_none_or(str::is_empty) {
                return Err(problem(
                    "is not a valid PostgreSQL URL: it names no host".to_owned(),
                ));
            }
        }
        Ok(StorageUrl {
            url: SecretString::from(url),
            backend,
        })
    }

    /// The full URL, password included: pass it to the store only.
    pub fn expose_secret(&self) -> &str {
        self.url.expose_secret()
    }

    /// Which database it names.
    pub fn backend(&self) -> StorageBackend {
        self.backend
    }

    /// The URL with any password (in the user info or a `password` query parameter) replaced
    /// by `***`, fit for messages and logs.
    pub fn redacted(&self) -> String {
        let text = self.url.expose_secret();
        let Ok(mut url) = Url::parse(text) else {
            // SQLite URLs such as `sqlite::memory:` need not parse; they hold no password.
            return if self.backend == StorageBackend::Sqlite {
                text.to_owned()
            } else {
                "postgres://***".to_owned()
            };
        };
        if url.password().is_some() && url.set_password(Some("***")).is_err() {
            return format!("{}://***", url.scheme());
        }
        if url.query_pairs().any(|(k, _)| k == "password") {
            let pairs: Vec<(String, String)> = url
                .query_pairs()
                .map(|(k, v)| {
                    let v = if k == "password" {
                        "***".to_owned()
                    } else {
                        v.into_owned()
                    };
                    (k.into_owned(), v)
                })
                .collect();
            url.query_pairs_mut().clear().extend_pairs(pairs);
        }
        url.to_string()
    }
}

impl fmt::Debug for StorageUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("StorageUrl").field(&self.redacted()).finish()
    }
}

impl fmt::Display for StorageUrl {
    /// The redacted URL.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// The HTTP server's settings.
///
/// Its limits follow from Telegram's delivery rules (see `docs/config.md`): answers must come
/// well inside Telegram's 60 s, and a repeated `update_id` is judged within a window that outlives
/// Telegram's 24 h of retries but ends before ids may restart after a week of silence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Where to listen; default `127.0.0.1:8080` (loopback: exposing it is a choice).
    pub listen: SocketAddr,
    /// The largest request body accepted; default 1 MiB, from 64 KiB to 16 MiB.
    pub body_limit_bytes: usize,
    /// How long one request may take; default 10 s, from 100 ms to 30 s.
    pub request_timeout: Duration,
    /// How long shutdown waits for in-flight work; default 10 s, at most 10 min.
    pub shutdown_grace: Duration,
    /// How long a repeated `update_id` counts as a duplicate; default 72 h, from 25 h to 167 h.
    pub dedup_retention: Duration,
    /// Whether message text and other raw update content is stored; default false.
    pub store_raw_updates: bool,
    /// The most connections served at once; default 512, from 16 to 65 536 (lowered at start
    /// to what the process's file descriptor limit leaves room for).
    pub connection_limit: usize,
    /// How long a client may take to send a request's head (from connecting, or from its first
    /// byte after a pause) and to take an answer; default 10 s, from 100 ms to 60 s.
    pub header_read_timeout: Duration,
    /// How long a connection may wait silently between requests; default 60 s, from 100 ms to
    /// 10 min.
    pub idle_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: DEFAULT_LISTEN,
            body_limit_bytes: usize::try_from(DEFAULT_BODY_LIMIT_BYTES).unwrap_or(usize::MAX),
            request_timeout: millis(DEFAULT_REQUEST_TIMEOUT_MS),
            shutdown_grace: millis(DEFAULT_SHUTDOWN_GRACE_MS),
            dedup_retention: hours(DEFAULT_DEDUP_RETENTION_HOURS),
            store_raw_updates: false,
            connection_limit: usize::try_from(DEFAULT_CONNECTION_LIMIT).unwrap_or(usize::MAX),
            header_read_timeout: millis(DEFAULT_HEADER_READ_TIMEOUT_MS),
            idle_timeout: millis(DEFAULT_IDLE_TIMEOUT_MS),
        }
    }
}

impl ServerConfig {
    fn from_raw(raw: RawServer) -> Result<Self, ConfigError> {
        let listen = match raw.listen {
            None => DEFAULT_LISTEN,
            Some(text) => text.parse().map_err(|_| {
                ConfigError::key_problem(
                    "server.listen",
                    format!(
                        "`{text}` is not an IP address with a port; write e.g. \"127.0.0.1:8080\" \
                         (host names are not resolved)"
                    ),
                )
            })?,
        };
        let body_limit_bytes = in_range(
            "server.body_limit_bytes",
            raw.body_limit_bytes,
            DEFAULT_BODY_LIMIT_BYTES,
            64 * 1024..=16 * 1024 * 1024,
            " bytes; Telegram updates are a few KiB, and a refused update blocks its chat",
        )?;
        let request_timeout_ms = in_range(
            "server.request_timeout_ms",
            raw.request_timeout_ms,
            DEFAULT_REQUEST_TIMEOUT_MS,
            100..=30_000,
            " ms; Telegram waits at most 60 s for an answer, so stay well under it",
        )?;
        let shutdown_grace_ms = in_range(
            "server.shutdown_grace_ms",
            raw.shutdown_grace_ms,
            DEFAULT_SHUTDOWN_GRACE_MS,
            0..=600_000,
            " ms",
        )?;
        let dedup_retention_hours = in_range(
            "server.dedup_retention_hours",
            raw.dedup_retention_hours,
            DEFAULT_DEDUP_RETENTION_HOURS,
            25..=167,
            " hours: more than 24 (Telegram retries an update for up to 24 h) and less than 168 \
             (update ids may restart at random after a week of silence)",
        )?;
        let connection_limit = in_range(
            "server.connection_limit",
            raw.connection_limit,
            DEFAULT_CONNECTION_LIMIT,
            16..=65_536,
            " connections; each holds a file descriptor, and some of the limit is kept for \
             authenticated deliveries and health probes",
        )?;
        let header_read_timeout_ms = in_range(
            "server.header_read_timeout_ms",
            raw.header_read_timeout_ms,
            DEFAULT_HEADER_READ_TIMEOUT_MS,
            100..=60_000,
            " ms; a client slower than this to send a request's head or take an answer is cut \
             off, and Telegram sends its requests at once",
        )?;
        let idle_timeout_ms = in_range(
            "server.idle_timeout_ms",
            raw.idle_timeout_ms,
            DEFAULT_IDLE_TIMEOUT_MS,
            100..=600_000,
            " ms; an idle connection holds a file descriptor",
        )?;
        Ok(ServerConfig {
            listen,
            body_limit_bytes: usize::try_from(body_limit_bytes).unwrap_or(usize::MAX),
            request_timeout: millis(request_timeout_ms),
            shutdown_grace: millis(shutdown_grace_ms),
            dedup_retention: hours(dedup_retention_hours),
            store_raw_updates: raw.store_raw_updates.unwrap_or(false),
            connection_limit: usize::try_from(connection_limit).unwrap_or(usize::MAX),
            header_read_timeout: millis(header_read_timeout_ms),
            idle_timeout: millis(idle_timeout_ms),
        })
    }
}

/// The API's settings (`[api]`).
///
/// The API under `/v1` shows operations, events and queues to operators, so its read routes
/// answer only requests that carry the admin token (`Authorization: Bearer …`). Clients
/// (`[[api.clients]]`, a bot's own handlers) hold tokens of their own, each scoped to one bot:
/// they may start and read that bot's operations and nothing else. Without any token configured
/// the API is off. Every token is read from the environment variable its `*_env` key names, like
/// every other secret.
#[derive(Debug, Clone, Default)]
pub struct ApiConfig {
    /// The environment variable the admin token was read from, for messages.
    pub admin_token_env: Option<String>,
    /// The admin token; `None` turns the read API off. Never log it.
    pub admin_token: Option<SecretString>,
    /// The operations API's clients.
    pub clients: Vec<ApiClient>,
}

/// One client of the operations API (`[[api.clients]]`): a bot's own handlers.
#[derive(Debug, Clone)]
pub struct ApiClient {
    /// Its name, recorded as the cause of what it starts.
    pub name: String,
    /// The one bot whose operations it may start and read.
    pub bot: String,
    /// The environment variable its token was read from, for messages.
    pub token_env: String,
    /// Its bearer token. Never log it.
    pub token: SecretString,
}

impl ApiConfig {
    /// `bots` are the configured bots a client may be scoped to.
    fn from_raw(
        raw: RawApi,
        bots: &[BotConfig],
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let (admin_token_env, admin_token) = match raw.admin_token_env {
            Some(var) => {
                let token = api_token(
                    "api.admin_token_env",
                    &var,
                    ("the read API's admin token", "admin token"),
                    env,
                )?;
                (Some(var), Some(token))
            }
            None => (None, None),
        };
        let mut clients: Vec<ApiClient> = Vec::with_capacity(raw.clients.len());
        for (i, raw) in raw.clients.into_iter().enumerate() {
            let client = ApiClient::from_raw(i, raw, bots, env)?;
            let same_name = clients.iter().position(|c| c.name == client.name);
            if let Some(first) = same_name {
                return Err(ConfigError::key_problem(
                    format!("api.clients[{i}].name"),
                    format!(
                        "duplicate client name `{}` (also api.clients[{first}].name); give each \
                         client its own name",
                        client.name
                    ),
                ));
            }
            let secret = client.token.expose_secret();
            let shared = clients
                .iter()
                .position(|c| c.token.expose_secret() == secret)
                .map(|first| format!("api.clients[{first}]"))
                .or_else(|| {
                    admin_token
                        .as_ref()
                        .filter(|t| t.expose_secret() == secret)
                        .map(|_| "the admin token".to_owned())
                });
            if let Some(other) = shared {
                return Err(ConfigError::key_problem(
                    format!("api.clients[{i}].token_env"),
                    format!(
                        "environment variable `{}` holds the same token as {other}; give each \
                         client a token of its own, apart from the admin token, so that one can \
                         be revoked without the other",
                        client.token_env
                    ),
                ));
            }
            clients.push(client);
        }
        Ok(ApiConfig {
            admin_token_env,
            admin_token,
            clients,
        })
    }
}

impl ApiClient {
    fn from_raw(
        i: usize,
        raw: RawClient,
        bots: &[BotConfig],
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let key = |field: &str| format!("api.clients[{i}].{field}");
        let name = required(
            &key("name"),
            raw.name,
            "give the client a name of a-z, 0-9 and _, e.g. \"shop_handlers\"",
        )?;
        validate_name(NameKind::Client, &name)
            .map_err(|e| ConfigError::key_problem(key("name"), e.to_string()))?;
        if name == "admin" {
            return Err(ConfigError::key_problem(
                key("name"),
                "`admin` is reserved for what the admin token starts; give the client another name",
            ));
        }
        let bot = required(
            &key("bot"),
            raw.bot,
            "name the one configured bot whose operations this client may start and read",
        )?;
        if !bots.iter().any(|b| b.name == bot) {
            let known: Vec<&str> = bots.iter().map(|b| b.name.as_str()).collect();
            return Err(ConfigError::key_problem(
                key("bot"),
                format!(
                    "no bot named `{bot}` is configured; use one of: {}",
                    if known.is_empty() {
                        "(none: add a [[bots]] table)".to_owned()
                    } else {
                        known.join(", ")
                    }
                ),
            ));
        }
        let token_env = required(
            &key("token_env"),
            raw.token_env,
            "name the environment variable that holds the client's token, e.g. \"SHOP_API_TOKEN\"",
        )?;
        let token = api_token(
            &key("token_env"),
            &token_env,
            ("the client's API token", "client token"),
            env,
        )?;
        Ok(ApiClient {
            name,
            bot,
            token_env,
            token,
        })
    }
}

/// An API token from the environment variable `var`: long enough not to be guessed, and
/// visible ASCII, since it travels in a header. `what` says what it is in a sentence and in a
/// word.
fn api_token(
    key: &str,
    var: &str,
    (what, noun): (&str, &str),
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<SecretString, ConfigError> {
    let token = read_secret(key, var, what, env)?;
    let text = token.expose_secret();
    let valid = (MIN_ADMIN_TOKEN_LEN..=MAX_ADMIN_TOKEN_LEN).contains(&text.len())
        && text.bytes().all(|b| b.is_ascii_graphic());
    if !valid {
        return Err(ConfigError::key_problem(
            key,
            format!(
                "environment variable `{var}` does not hold a usable {noun}; use \
                 {MIN_ADMIN_TOKEN_LEN} to {MAX_ADMIN_TOKEN_LEN} visible ASCII characters \
                 without spaces, e.g. the output of `openssl rand -hex 32`"
            ),
        ));
    }
    Ok(token)
}

/// How a bot receives its updates; Telegram allows one or the other, never both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BotMode {
    /// Telegram POSTs updates to `/telegram/{bot}/webhook` (the default).
    #[default]
    Webhook,
    /// opledger calls `getUpdates` (long polling).
    Poll,
}

impl BotMode {
    /// The name used in the file: `webhook` or `poll`.
    pub fn as_str(self) -> &'static str {
        match self {
            BotMode::Webhook => "webhook",
            BotMode::Poll => "poll",
        }
    }
}

impl fmt::Display for BotMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One Telegram bot served by this process, with its secrets already read.
#[derive(Debug, Clone)]
pub struct BotConfig {
    /// The bot's name: `[a-z0-9_]`, 1 to 64 characters; it appears in stream ids and in the
    /// webhook path `/telegram/{name}/webhook`.
    pub name: String,
    /// The environment variable the token was read from, for messages.
    pub token_env: String,
    /// The bot token. It is part of every Bot API URL: never log such a URL.
    pub token: SecretString,
    /// The environment variable the webhook secret was read from.
    pub webhook_secret_env: Option<String>,
    /// The webhook secret (`secret_token`), compared with the
    /// `X-Telegram-Bot-Api-Secret-Token` header. Always present when `mode` is `Webhook`.
    pub webhook_secret: Option<SecretString>,
    /// The Bot API's base URL without a trailing slash; default `https://api.telegram.org`.
    pub api_base_url: String,
    /// Webhook or long polling; default webhook.
    pub mode: BotMode,
    /// `getUpdates` long-poll timeout; default 30 s, at most 50 s.
    pub poll_timeout: Duration,
    /// `max_connections` for `setWebhook`; default 40, 1 to 100.
    pub max_connections: u8,
    /// The gateway to the bot's own webhook (`[bots.forward]`), if it has one.
    pub forward: Option<crate::forward::ForwardConfig>,
}

impl BotConfig {
    fn from_raw(
        i: usize,
        raw: RawBot,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let key = |field: &str| format!("bots[{i}].{field}");
        let name = required(
            &key("name"),
            raw.name,
            "give the bot a name of a-z, 0-9 and _, e.g. \"shop\"",
        )?;
        validate_name(NameKind::Bot, &name)
            .map_err(|e| ConfigError::key_problem(key("name"), e.to_string()))?;

        let token_env = required(
            &key("token_env"),
            raw.token_env,
            "name the environment variable that holds the bot token, e.g. \"SHOP_BOT_TOKEN\"",
        )?;
        let token = read_secret(&key("token_env"), &token_env, "the bot token", env)?;
        if !token
            .expose_secret()
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b":_-".contains(&b))
        {
            return Err(ConfigError::key_problem(
                key("token_env"),
                format!(
                    "environment variable `{token_env}` does not hold a bot token (a token has \
                     only A-Z, a-z, 0-9, :, _ and -); export it with the token @BotFather gave"
                ),
            ));
        }

        let mode = match raw.mode.as_deref() {
            None | Some("webhook") => BotMode::Webhook,
            Some("poll") => BotMode::Poll,
            Some(other) => {
                return Err(ConfigError::key_problem(
                    key("mode"),
                    format!("must be \"webhook\" or \"poll\", not {other:?}"),
                ));
            }
        };

        let (webhook_secret_env, webhook_secret) = match raw.webhook_secret_env {
            None if mode == BotMode::Webhook => {
                return Err(ConfigError::key_problem(
                    key("webhook_secret_env"),
                    "is required when mode is \"webhook\"; name the environment variable that \
                     holds the webhook secret, e.g. \"SHOP_WEBHOOK_SECRET\"",
                ));
            }
            None => (None, None),
            Some(var) => {
                let secret = webhook_secret(&key("webhook_secret_env"), &var, env)?;
                (Some(var), Some(secret))
            }
        };

        let api_base_url = match raw.api_base_url {
            None => DEFAULT_API_BASE_URL.to_owned(),
            Some(text) => api_base_url(&text)
                .map_err(|problem| ConfigError::key_problem(key("api_base_url"), problem))?,
        };
        let poll_timeout = in_range(
            &key("poll_timeout_secs"),
            raw.poll_timeout_secs,
            DEFAULT_POLL_TIMEOUT_SECS,
            0..=50,
            " seconds",
        )?;
        let max_connections = in_range(
            &key("max_connections"),
            raw.max_connections,
            DEFAULT_MAX_CONNECTIONS,
            1..=100,
            " (Telegram's range for setWebhook)",
        )?;

        Ok(BotConfig {
            name,
            token_env,
            token,
            webhook_secret_env,
            webhook_secret,
            api_base_url,
            mode,
            poll_timeout: Duration::from_secs(poll_timeout.unsigned_abs()),
            max_connections: u8::try_from(max_connections).unwrap_or(u8::MAX),
            forward: raw
                .forward
                .map(|forward| crate::forward::ForwardConfig::from_raw(i, forward, env))
                .transpose()?,
        })
    }
}

/// Checks a Bot API base URL and returns it without a trailing slash.
fn api_base_url(text: &str) -> Result<String, String> {
    let url = http_url(text)?;
    if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
        return Err(
            "must be only a scheme, host and optional port, e.g. \"https://api.telegram.org\" \
             (opledger appends /bot<token>/<method> itself)"
                .to_owned(),
        );
    }
    Ok(url.origin().ascii_serialization())
}

/// A business action: the command that starts it, how its business key is made, what it calls
/// and what it answers.
#[derive(Debug, Clone)]
pub struct ActionConfig {
    /// The action's name: `[a-z0-9_]`, unique; it appears in operation stream ids.
    pub name: String,
    /// The bot whose command starts it.
    pub bot: String,
    /// The command without its slash: `[a-z0-9_]`, 1 to 32 characters, unique per bot. `None`:
    /// no command starts it; only the operations API, a button or an embedding program does.
    pub command: Option<String>,
    /// The command's positional arguments' names, in order.
    pub params: Vec<String>,
    /// The business key: requests with the same key are one operation.
    pub key: KeyTemplate,
    /// The sliding window in which the same user's same command joins the operation it started;
    /// after it, the command starts a new operation. `None` (the default,
    /// `repeat_window_secs = 0`) means no repeat guard: one key, one operation, forever.
    pub repeat_window: Option<Duration>,
    /// The question the command is answered with, on *Confirm* / *Cancel* buttons, before the
    /// operation starts; `None` (the default) starts it at once.
    pub confirm: Option<ConfirmConfig>,
    /// The external call; `None` means the action calls nothing out.
    pub effector: Option<EffectorConfig>,
    /// What the user is told when the operation ends.
    pub reply: ReplyConfig,
}

/// An action's confirmation: its command is answered with `question` and one-time *Confirm* /
/// *Cancel* buttons for the user who sent it; only the first *Confirm* before `expiry` starts
/// the operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfirmConfig {
    /// What the user is asked.
    pub question: ConfirmTemplate,
    /// How long the buttons work; default 10 minutes.
    pub expiry: Duration,
}

impl ConfirmConfig {
    /// The confirmation of action `i` from its `confirm` and `confirm_expiry_secs` keys, or
    /// `None` without a question.
    fn from_raw(
        i: usize,
        question: Option<String>,
        expiry_secs: Option<i64>,
        params: &[String],
        repeat_window: Option<Duration>,
    ) -> Result<Option<Self>, ConfigError> {
        let key = |field: &str| format!("actions[{i}].{field}");
        let Some(text) = question else {
            return match expiry_secs {
                Some(_) => Err(ConfigError::key_problem(
                    key("confirm_expiry_secs"),
                    "is set without `confirm`; write the question the command asks, or remove it",
                )),
                None => Ok(None),
            };
        };
        let question = ConfirmTemplate::parse(&text, params)
            .map_err(|e| ConfigError::key_problem(key("confirm"), e.to_string()))?;
        if repeat_window.is_some() {
            // A *Confirm* starts the operation the token names; the repeat guard's epoch belongs
            // to the command, which the click is not.
            return Err(ConfigError::key_problem(
                key("confirm"),
                "cannot be combined with `repeat_window_secs`; confirm once-only actions, or \
                 drop one of the two",
            ));
        }
        let expiry_secs = in_range(
            &key("confirm_expiry_secs"),
            expiry_secs,
            DEFAULT_CONFIRM_EXPIRY_SECS,
            1..=604_800,
            " seconds (a week at most)",
        )?;
        Ok(Some(ConfirmConfig {
            question,
            expiry: Duration::from_secs(expiry_secs.unsigned_abs()),
        }))
    }
}

impl ActionConfig {
    fn from_raw(i: usize, raw: RawAction, bots: &[BotConfig]) -> Result<Self, ConfigError> {
        let key = |field: &str| format!("actions[{i}].{field}");
        let name = required(
            &key("name"),
            raw.name,
            "give the action a name of a-z, 0-9 and _, e.g. \"coupon\"",
        )?;
        validate_name(NameKind::Action, &name)
            .map_err(|e| ConfigError::key_problem(key("name"), e.to_string()))?;

        let bot = required(
            &key("bot"),
            raw.bot,
            "name the bot whose command starts this action",
        )?;
        if !bots.iter().any(|b| b.name == bot) {
            let names: Vec<&str> = bots.iter().map(|b| b.name.as_str()).collect();
            let advice = if names.is_empty() {
                "no bot is configured; add a [[bots]] entry".to_owned()
            } else {
                format!("configured bots: {}", List(&names))
            };
            return Err(ConfigError::key_problem(
                key("bot"),
                format!("names no configured bot `{bot}`; {advice}"),
            ));
        }

        if let Some(command) = &raw.command {
            check_command(command).map_err(|p| ConfigError::key_problem(key("command"), p))?;
        } else if raw.confirm.is_some() {
            return Err(ConfigError::key_problem(
                key("confirm"),
                "needs a command: the confirmation answers the action's command; add `command` \
                 (without its slash, e.g. \"coupon\") or issue buttons with POST /v1/buttons",
            ));
        }
        let command = raw.command;

        let mut params: Vec<String> = Vec::with_capacity(raw.params.len());
        for (j, param) in raw.params.into_iter().enumerate() {
            let param_key = format!("actions[{i}].params[{j}]");
            let valid = !param.is_empty()
                && param.len() <= 64
                && param
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !valid {
                return Err(ConfigError::key_problem(
                    param_key,
                    format!(
                        "param name {param:?} is invalid: use 1 to 64 characters from a-z, 0-9 and _"
                    ),
                ));
            }
            if RESERVED_PARAM_NAMES.contains(&param.as_str()) {
                return Err(ConfigError::key_problem(
                    param_key,
                    format!(
                        "`{param}` is a built-in placeholder name, so a template could not tell \
                         them apart; give the param another name"
                    ),
                ));
            }
            if let Some(first) = params.iter().position(|p| *p == param) {
                return Err(ConfigError::key_problem(
                    param_key,
                    format!(
                        "duplicate param `{param}` (also params[{first}]); name each param once"
                    ),
                ));
            }
            params.push(param);
        }

        let key_text = required(
            &key("key"),
            raw.key,
            "write the business key template, e.g. \"{campaign}:{user_id}\"",
        )?;
        let key_template = KeyTemplate::parse(&key_text, &params)
            .map_err(|e| ConfigError::key_problem(key("key"), e.to_string()))?;

        let repeat_window_secs = in_range(
            &key("repeat_window_secs"),
            raw.repeat_window_secs,
            0,
            0..=86_400,
            " seconds (0 turns the repeat guard off; use the business key for once-only)",
        )?;
        let repeat_window = (repeat_window_secs > 0)
            .then(|| Duration::from_secs(repeat_window_secs.unsigned_abs()));

        let confirm = ConfirmConfig::from_raw(
            i,
            raw.confirm,
            raw.confirm_expiry_secs,
            &params,
            repeat_window,
        )?;
        let effector = raw
            .effector
            .map(|e| EffectorConfig::from_raw(i, e))
            .transpose()?;
        let reply = match raw.reply {
            Some(reply) => ReplyConfig::from_raw(i, reply, &params)?,
            None => ReplyConfig::default(),
        };

        Ok(ActionConfig {
            name,
            bot,
            command,
            params,
            key: key_template,
            repeat_window,
            confirm,
            effector,
            reply,
        })
    }
}

fn check_command(command: &str) -> Result<(), String> {
    if let Some(rest) = command.strip_prefix('/') {
        return Err(format!(
            "write the command without its slash: \"{rest}\", not \"{command}\""
        ));
    }
    let valid = !command.is_empty()
        && command.len() <= MAX_COMMAND_LEN
        && command
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !valid {
        return Err(format!(
            "command {command:?} is invalid: Telegram commands are 1 to 32 characters from \
             a-z, 0-9 and _"
        ));
    }
    if RESERVED_COMMANDS.contains(&command) {
        return Err(format!(
            "`/{command}` is reserved for the built-in query that answers it; choose another command"
        ));
    }
    Ok(())
}

/// The call an action makes, and how its unknown outcomes are resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectorConfig {
    /// Where the JSON POST goes (http or https); `None` with `in_process = true`: the effect is
    /// a function of the Rust program that embeds opledger, which registers it with the worker
    /// (and says itself whether it honours the key, has a lookup and how long it may take).
    pub url: Option<Url>,
    /// How long one call may take; default 2 s, from 1 ms to 5 min.
    pub timeout: Duration,
    /// Whether the service honours `Idempotency-Key`, which makes a retry after an unknown
    /// outcome safe; default false.
    pub honours_idempotency_key: bool,
    /// Where to ask what became of a call whose outcome is unknown.
    pub lookup_url: Option<UrlTemplate>,
    /// How many claims an operation may use before a transient failure is final; default 5,
    /// 1 to 100.
    pub max_attempts: u32,
}

impl EffectorConfig {
    fn from_raw(i: usize, raw: RawEffector) -> Result<Self, ConfigError> {
        let key = |field: &str| format!("actions[{i}].effector.{field}");
        let url = if raw.in_process == Some(true) {
            let said_by_the_effector = [
                ("url", raw.url.is_some()),
                ("timeout_ms", raw.timeout_ms.is_some()),
                (
                    "honours_idempotency_key",
                    raw.honours_idempotency_key.is_some(),
                ),
                ("lookup_url", raw.lookup_url.is_some()),
            ];
            if let Some((field, _)) = said_by_the_effector.iter().find(|(_, given)| *given) {
                return Err(ConfigError::key_problem(
                    key(field),
                    "cannot be combined with in_process = true: an in-process effector says \
                     itself how it is called (the `Effector` trait); remove the key",
                ));
            }
            None
        } else {
            let url_text = required(
                &key("url"),
                raw.url,
                "write the URL the action POSTs to, e.g. \"http://127.0.0.1:9000/coupons\" (or \
                 in_process = true in a Rust program that embeds opledger)",
            )?;
            Some(
                http_url(&url_text)
                    .map_err(|problem| ConfigError::key_problem(key("url"), problem))?,
            )
        };
        let timeout_ms = in_range(
            &key("timeout_ms"),
            raw.timeout_ms,
            DEFAULT_EFFECTOR_TIMEOUT_MS,
            1..=300_000,
            " ms",
        )?;
        let lookup_url = raw
            .lookup_url
            .map(|text| UrlTemplate::parse(&text))
            .transpose()
            .map_err(|e| ConfigError::key_problem(key("lookup_url"), e.to_string()))?;
        let max_attempts = in_range(
            &key("max_attempts"),
            raw.max_attempts,
            DEFAULT_MAX_ATTEMPTS,
            1..=100,
            "",
        )?;
        Ok(EffectorConfig {
            url,
            timeout: millis(timeout_ms),
            honours_idempotency_key: raw.honours_idempotency_key.unwrap_or(false),
            lookup_url,
            max_attempts: u32::try_from(max_attempts).unwrap_or(u32::MAX),
        })
    }
}

/// The replies sent when an operation ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyConfig {
    /// Sent when the operation is confirmed; default `Done.`
    pub confirmed: ReplyTemplate,
    /// Sent when it failed; default `Sorry, that did not work: {error}`.
    pub failed: ReplyTemplate,
}

impl Default for ReplyConfig {
    fn default() -> Self {
        ReplyConfig {
            confirmed: ReplyTemplate::default_confirmed(),
            failed: ReplyTemplate::default_failed(),
        }
    }
}

impl ReplyConfig {
    fn from_raw(i: usize, raw: RawReply, params: &[String]) -> Result<Self, ConfigError> {
        let parse = |field: &str, text: Option<String>, kind: ReplyKind| match text {
            None => Ok(match kind {
                ReplyKind::Confirmed => ReplyTemplate::default_confirmed(),
                ReplyKind::Failed => ReplyTemplate::default_failed(),
            }),
            Some(text) => ReplyTemplate::parse(&text, kind, params).map_err(|e| {
                ConfigError::key_problem(format!("actions[{i}].reply.{field}"), e.to_string())
            }),
        };
        Ok(ReplyConfig {
            confirmed: parse("confirmed", raw.confirmed, ReplyKind::Confirmed)?,
            failed: parse("failed", raw.failed, ReplyKind::Failed)?,
        })
    }
}

fn required<T>(key: &str, value: Option<T>, advice: &str) -> Result<T, ConfigError> {
    value.ok_or_else(|| ConfigError::key_problem(key, format!("is required; {advice}")))
}

fn millis(ms: i64) -> Duration {
    Duration::from_millis(ms.unsigned_abs())
}

fn hours(h: i64) -> Duration {
    Duration::from_secs(h.unsigned_abs() * 3600)
}
