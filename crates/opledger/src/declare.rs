//! Bots and actions declared in code. They become the same configuration a TOML file gives
//! (`[[bots]]`, `[[actions]]`), checked by the same `Config::parse`, so that a declaration
//! the service would refuse is refused here with the same one-line message naming the key.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use toml::{Table, Value};

/// Which updates of a bot go to the program's handlers (see [`Bot::handlers`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Updates {
    /// Every recorded update.
    All,
    /// Those opledger did not answer itself: not a command of a declared action, `/status`,
    /// `/help`, or a click on one of its buttons.
    Unhandled,
}

/// A bot, as `[[bots]]` declares it.
///
/// ```
/// use std::time::Duration;
/// use opledger::{Bot, Updates};
///
/// let bot = Bot::polling("shop", "123456:token-from-botfather")
///     .handlers(Updates::All)
///     .handler_timeout(Duration::from_secs(30));
/// # let _ = bot;
/// ```
#[derive(Debug, Clone)]
pub struct Bot {
    name: String,
    token: SecretString,
    webhook_secret: Option<SecretString>,
    api_base_url: Option<String>,
    poll_timeout: Option<Duration>,
    handlers: Option<Updates>,
    handler_timeout: Option<Duration>,
    give_up_after: Option<Duration>,
}

impl Bot {
    /// A bot whose updates opledger fetches with `getUpdates` (long polling); the offset moves
    /// only past updates that are committed.
    pub fn polling(name: impl Into<String>, token: impl Into<String>) -> Bot {
        Bot::new(name.into(), token.into(), None)
    }

    /// A bot whose updates Telegram posts to `/telegram/{name}/webhook` with `secret` in
    /// `X-Telegram-Bot-Api-Secret-Token`; answered 200 only after they are committed. Mount
    /// [`Opledger::router`](crate::Opledger::router) to receive them.
    pub fn webhook(
        name: impl Into<String>,
        token: impl Into<String>,
        secret: impl Into<String>,
    ) -> Bot {
        Bot::new(
            name.into(),
            token.into(),
            Some(SecretString::from(secret.into())),
        )
    }

    fn new(name: String, token: String, webhook_secret: Option<SecretString>) -> Bot {
        Bot {
            name,
            token: SecretString::from(token),
            webhook_secret,
            api_base_url: None,
            poll_timeout: None,
            handlers: None,
            handler_timeout: None,
            give_up_after: None,
        }
    }

    /// Where the Bot API is (default `https://api.telegram.org`): a local Bot API server, or a
    /// fake one in tests.
    pub fn api_base_url(mut self, url: impl Into<String>) -> Bot {
        self.api_base_url = Some(url.into());
        self
    }

    /// How long one `getUpdates` waits for updates (default 25 s).
    pub fn poll_timeout(mut self, timeout: Duration) -> Bot {
        self.poll_timeout = Some(timeout);
        self
    }

    /// Hands the bot's recorded updates to the program's handlers (a teloxide dispatcher
    /// through `opledger::teloxide`, feature `teloxide`, or
    /// [`Opledger::handlers`](crate::Opledger::handlers)): each once it is committed, per chat
    /// in order with one in flight, again after a failure or a crash until the handlers are
    /// done with it.
    pub fn handlers(mut self, updates: Updates) -> Bot {
        self.handlers = Some(updates);
        self
    }

    /// How long the handlers may take with one update before the hand-over counts as failed
    /// and the update is handed over again (default 10 s, 100 ms to 60 s).
    pub fn handler_timeout(mut self, timeout: Duration) -> Bot {
        self.handler_timeout = Some(timeout);
        self
    }

    /// How old an update may get before it is no longer handed over (default 24 h).
    pub fn give_up_after(mut self, age: Duration) -> Bot {
        self.give_up_after = Some(age);
        self
    }

    /// The bot's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The `[[bots]]` entry, its secrets behind environment variable names that `secrets`
    /// holds.
    pub(crate) fn to_toml(&self, secrets: &mut Secrets) -> Table {
        let mut bot = Table::new();
        bot.insert("name".into(), self.name.clone().into());
        bot.insert("token_env".into(), secrets.put(&self.token).into());
        match &self.webhook_secret {
            Some(secret) => {
                bot.insert("mode".into(), "webhook".into());
                bot.insert("webhook_secret_env".into(), secrets.put(secret).into());
            }
            None => {
                bot.insert("mode".into(), "poll".into());
            }
        }
        if let Some(url) = &self.api_base_url {
            bot.insert("api_base_url".into(), url.clone().into());
        }
        if let Some(timeout) = self.poll_timeout {
            bot.insert("poll_timeout_secs".into(), seconds(timeout));
        }
        if let Some(updates) = self.handlers {
            let mut forward = Table::new();
            forward.insert("in_process".into(), true.into());
            let updates = match updates {
                Updates::All => "all",
                Updates::Unhandled => "unhandled",
            };
            forward.insert("updates".into(), updates.into());
            if let Some(timeout) = self.handler_timeout {
                forward.insert("timeout_ms".into(), millis(timeout));
            }
            if let Some(age) = self.give_up_after {
                forward.insert("give_up_after_secs".into(), seconds(age));
            }
            bot.insert("forward".into(), forward.into());
        }
        bot
    }
}

/// A business action, as `[[actions]]` declares it: what one operation does, at most once per
/// business key.
///
/// ```
/// use opledger::Action;
///
/// let coupon = Action::new("coupon", "shop")
///     .params(["campaign"])
///     .key("{user_id}:{campaign}")
///     .reply_confirmed("Your coupon for {campaign}: {external_id}");
/// # let _ = coupon;
/// ```
#[derive(Debug, Clone)]
pub struct Action {
    name: String,
    bot: String,
    command: Option<String>,
    params: Vec<String>,
    key: Option<String>,
    repeat_window: Option<Duration>,
    confirm: Option<(String, Option<Duration>)>,
    http: HttpEffect,
    max_attempts: Option<u32>,
    confirmed: Option<String>,
    failed: Option<String>,
}

/// `[actions.effector]`'s HTTP keys, each as given (the parse says what does not go together).
#[derive(Debug, Clone, Default)]
struct HttpEffect {
    url: Option<String>,
    timeout: Option<Duration>,
    honours_idempotency_key: Option<bool>,
    lookup_url: Option<String>,
}

impl Action {
    /// The action `name` of `bot`. Give it a [`key`](Action::key); its effect is either an
    /// in-process [`Effector`](crate::Effector) registered with
    /// [`Builder::effector`](crate::Builder::effector) or an HTTP call ([`Action::calls`]).
    pub fn new(name: impl Into<String>, bot: impl Into<String>) -> Action {
        Action {
            name: name.into(),
            bot: bot.into(),
            command: None,
            params: Vec::new(),
            key: None,
            repeat_window: None,
            confirm: None,
            http: HttpEffect::default(),
            max_attempts: None,
            confirmed: None,
            failed: None,
        }
    }

    /// The command (without its slash) that starts the action from a chat, its arguments
    /// being the params in order. Without one, only the program ([`Opledger::submit`]), a
    /// button or the operations API starts it.
    ///
    /// [`Opledger::submit`]: crate::Opledger::submit
    pub fn command(mut self, command: impl Into<String>) -> Action {
        self.command = Some(command.into());
        self
    }

    /// The parameters' names, in order.
    pub fn params<I, S>(mut self, params: I) -> Action
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.params = params.into_iter().map(Into::into).collect();
        self
    }

    /// The business key template (e.g. `"{user_id}:{campaign}"`): requests with the same key
    /// are one operation, whatever the number of updates, clicks or retries.
    pub fn key(mut self, template: impl Into<String>) -> Action {
        self.key = Some(template.into());
        self
    }

    /// The same user's same command within `window` joins the operation it started; after it,
    /// starts a new one.
    pub fn repeat_window(mut self, window: Duration) -> Action {
        self.repeat_window = Some(window);
        self
    }

    /// Answers the command with `question` and one-time *Confirm* / *Cancel* buttons; only the
    /// first *Confirm* (within `expiry`, default 10 minutes) starts the operation.
    pub fn confirm(mut self, question: impl Into<String>, expiry: Option<Duration>) -> Action {
        self.confirm = Some((question.into(), expiry));
        self
    }

    /// The effect is a JSON POST to `url` (with `Idempotency-Key`).
    pub fn calls(mut self, url: impl Into<String>) -> Action {
        self.http.url = Some(url.into());
        self
    }

    /// The service called honours `Idempotency-Key`: a call whose outcome is unknown is made
    /// again with the same key. With [`Action::calls`] (an in-process effector says its own).
    pub fn honours_idempotency_key(mut self) -> Action {
        self.http.honours_idempotency_key = Some(true);
        self
    }

    /// Where to ask what became of a call whose outcome is unknown (a template with
    /// `{operation_id}`). With [`Action::calls`].
    pub fn lookup_url(mut self, template: impl Into<String>) -> Action {
        self.http.lookup_url = Some(template.into());
        self
    }

    /// How long one HTTP call may take (default 2 s). With [`Action::calls`]; an in-process
    /// effector says its own.
    pub fn timeout(mut self, timeout: Duration) -> Action {
        self.http.timeout = Some(timeout);
        self
    }

    /// How many claims an operation may use before a transient failure is final (default 5).
    pub fn max_attempts(mut self, attempts: u32) -> Action {
        self.max_attempts = Some(attempts);
        self
    }

    /// The reply when the operation is confirmed (placeholders: the params, `{external_id}`,
    /// `{operation_id}`, ...); sent by the worker, at most once, to the chat the operation
    /// was started from.
    pub fn reply_confirmed(mut self, template: impl Into<String>) -> Action {
        self.confirmed = Some(template.into());
        self
    }

    /// The reply when the operation failed (`{error}` among the placeholders).
    pub fn reply_failed(mut self, template: impl Into<String>) -> Action {
        self.failed = Some(template.into());
        self
    }

    /// The action's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The `[[actions]]` entry.
    pub(crate) fn to_toml(&self) -> Table {
        let mut action = Table::new();
        action.insert("name".into(), self.name.clone().into());
        action.insert("bot".into(), self.bot.clone().into());
        if let Some(command) = &self.command {
            action.insert("command".into(), command.clone().into());
        }
        let params = self.params.iter().cloned().map(Value::from).collect();
        action.insert("params".into(), Value::Array(params));
        if let Some(key) = &self.key {
            action.insert("key".into(), key.clone().into());
        }
        if let Some(window) = self.repeat_window {
            action.insert("repeat_window_secs".into(), seconds(window));
        }
        if let Some((question, expiry)) = &self.confirm {
            action.insert("confirm".into(), question.clone().into());
            if let Some(expiry) = expiry {
                action.insert("confirm_expiry_secs".into(), seconds(*expiry));
            }
        }
        let mut effector = Table::new();
        let http = &self.http;
        if let Some(url) = &http.url {
            effector.insert("url".into(), url.clone().into());
        }
        if let Some(timeout) = http.timeout {
            effector.insert("timeout_ms".into(), millis(timeout));
        }
        if let Some(honours) = http.honours_idempotency_key {
            effector.insert("honours_idempotency_key".into(), honours.into());
        }
        if let Some(lookup) = &http.lookup_url {
            effector.insert("lookup_url".into(), lookup.clone().into());
        }
        if let Some(attempts) = self.max_attempts {
            effector.insert("max_attempts".into(), i64::from(attempts).into());
        }
        if !effector.is_empty() {
            action.insert("effector".into(), effector.into());
        }
        let mut reply = Table::new();
        if let Some(text) = &self.confirmed {
            reply.insert("confirmed".into(), text.clone().into());
        }
        if let Some(text) = &self.failed {
            reply.insert("failed".into(), text.clone().into());
        }
        if !reply.is_empty() {
            action.insert("reply".into(), reply.into());
        }
        action
    }
}

/// Secrets given in code, under generated environment variable names: the configuration
/// names a variable for every secret and never holds one.
#[derive(Debug, Default)]
pub(crate) struct Secrets {
    values: Vec<(String, SecretString)>,
}

impl Secrets {
    fn put(&mut self, secret: &SecretString) -> String {
        let name = format!("OPLEDGER_EMBEDDED_SECRET_{}", self.values.len());
        self.values.push((name.clone(), secret.clone()));
        name
    }

    pub(crate) fn insert(&mut self, name: String, value: String) {
        self.values.push((name, SecretString::from(value)));
    }

    pub(crate) fn get(&self, name: &str) -> Option<String> {
        self.values
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, secret)| secret.expose_secret().to_owned())
    }
}

fn seconds(duration: Duration) -> Value {
    Value::Integer(i64::try_from(duration.as_secs()).unwrap_or(i64::MAX))
}

fn millis(duration: Duration) -> Value {
    Value::Integer(i64::try_from(duration.as_millis()).unwrap_or(i64::MAX))
}
