//! The embedded ledger: [`Builder`] opens it, [`Opledger`] records, submits and reads, and
//! [`Running`] is its worker, hand-over, read models and pollers until shutdown.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use opledger_config::Config;
use opledger_projections::operation_status::{self, Filter, OperationStatusRow};
use opledger_projections::{Projector, ProjectorOptions};
use opledger_server::intake::{Started, Submission};
use opledger_server::{App, Recorded, SystemClock};
use opledger_store::{AnyOptions, AnyStore, EventStore};
use opledger_worker::{Effector, Forwarder, ForwarderOptions, Worker, WorkerOptions};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use toml::{Table, Value};

use crate::declare::{Action, Bot, Secrets};
use crate::error::Error;
use crate::handlers::{HandedUpdates, Handlers};

/// The name submissions of the embedding program are recorded under, as their cause.
const CLIENT: &str = "embedded";

/// Opens an embedded ledger: bots and actions from TOML, from code, or both.
#[derive(Debug)]
pub struct Builder {
    url: Option<String>,
    toml: Table,
    /// The secrets the TOML's `*_env` keys name, as `env` gave them.
    env: Secrets,
    bots: Vec<Bot>,
    actions: Vec<Action>,
    effectors: HashMap<String, Arc<dyn Effector>>,
    worker_id: Option<String>,
    concurrency: Option<usize>,
    lease_margin: Option<Duration>,
}

impl Builder {
    pub(crate) fn new() -> Builder {
        Builder {
            url: None,
            toml: Table::new(),
            env: Secrets::default(),
            bots: Vec::new(),
            actions: Vec::new(),
            effectors: HashMap::new(),
            worker_id: None,
            concurrency: None,
            lease_margin: None,
        }
    }

    /// The ledger's database: `sqlite://bot.db` (created if missing) or
    /// `postgres://user@host/db`. Without it, the TOML's `[storage] url`, else
    /// `sqlite://opledger.db`.
    pub fn ledger(mut self, url: impl Into<String>) -> Builder {
        self.url = Some(url.into());
        self
    }

    /// A configuration in the service's TOML (`docs/config.md`); bots and actions declared in
    /// code are added to its own. `env` resolves the `*_env` keys that name secrets (pass
    /// `|name| std::env::var(name).ok()` for the process environment).
    pub fn toml(
        mut self,
        text: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Builder, Error> {
        self.toml = text.parse::<Table>().map_err(|e| {
            Error::Toml(e.to_string().lines().next().unwrap_or_default().to_owned())
        })?;
        let mut names = Vec::new();
        env_names(&Value::Table(self.toml.clone()), &mut names);
        for name in names {
            if let Some(value) = env(&name) {
                self.env.insert(name, value);
            }
        }
        Ok(self)
    }

    /// Declares a bot.
    pub fn bot(mut self, bot: Bot) -> Builder {
        self.bots.push(bot);
        self
    }

    /// Declares an action.
    pub fn action(mut self, action: Action) -> Builder {
        self.actions.push(action);
        self
    }

    /// The in-process effect of `action`: an [`Effector`] (or [`effect_fn`](crate::effect_fn)),
    /// under the worker's contract: recorded before it is called, never called again after an
    /// unknown outcome unless it honours the idempotency key, else looked up, else left to an
    /// operator.
    pub fn effector(
        mut self,
        action: impl Into<String>,
        effector: impl Effector + 'static,
    ) -> Builder {
        self.effectors.insert(action.into(), Arc::new(effector));
        self
    }

    /// The worker's id, recorded in its claims (default: random per process). Workers that
    /// share a ledger need distinct ids.
    pub fn worker_id(mut self, id: impl Into<String>) -> Builder {
        self.worker_id = Some(id.into());
        self
    }

    /// How many operations the worker carries out at once (default 4).
    pub fn concurrency(mut self, operations: usize) -> Builder {
        self.concurrency = Some(operations);
        self
    }

    /// How long past an effect's timeout (or a handler's) a claim stays leased before a worker
    /// may take the operation (or the update) over, after a crash (default 10 s for effects, 5 s
    /// for handlers). Shorter recovers sooner; it must exceed the clock skew between instances.
    pub fn lease_margin(mut self, margin: Duration) -> Builder {
        self.lease_margin = Some(margin);
        self
    }

    /// Checks the configuration, opens (and migrates) the ledger.
    pub async fn open(self) -> Result<Opledger, Error> {
        let Builder {
            url,
            mut toml,
            env,
            bots,
            actions,
            effectors,
            worker_id,
            concurrency,
            lease_margin,
        } = self;
        let mut secrets = env;
        append(
            &mut toml,
            "bots",
            bots.iter().map(|b| b.to_toml(&mut secrets)),
        );
        append(&mut toml, "actions", actions.iter().map(Action::to_toml));
        mark_in_process(&mut toml, &effectors)?;
        if let Some(url) = &url {
            let mut storage = Table::new();
            storage.insert("url".into(), url.clone().into());
            toml.insert("storage".into(), storage.into());
        }
        let lookup = |name: &str| secrets.get(name);
        let config = Config::parse(&toml.to_string(), &lookup)?;
        let store = {
            let options = AnyOptions {
                inline: opledger_projections::inline(),
                ..AnyOptions::default()
            };
            AnyStore::open(config.storage.url.expose_secret(), options).await?
        };
        let app = App::build(&config, store.clone());
        let id = worker_id.unwrap_or_else(|| {
            let random = uuid::Uuid::new_v4().simple().to_string();
            format!("embedded-{}-{}", std::process::id(), &random[..8])
        });
        Ok(Opledger {
            inner: Arc::new(Inner {
                config,
                store,
                app,
                effectors,
                handlers: Arc::default(),
                worker_id: id,
                concurrency: concurrency.unwrap_or(4),
                lease_margin,
            }),
        })
    }
}

/// The values of every `*_env` key: the environment variables the configuration reads.
fn env_names(value: &Value, names: &mut Vec<String>) {
    match value {
        Value::Table(table) => {
            for (key, value) in table {
                match value {
                    Value::String(name) if key.ends_with("_env") => names.push(name.clone()),
                    other => env_names(other, names),
                }
            }
        }
        Value::Array(values) => values.iter().for_each(|v| env_names(v, names)),
        _ => {}
    }
}

fn append(toml: &mut Table, key: &str, entries: impl Iterator<Item = Table>) {
    let list = toml.entry(key).or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(list) = list {
        list.extend(entries.map(Value::Table));
    }
}

/// An action (of the TOML text or declared in code) whose effector the program registered runs
/// in process (with a `url` too, the parse refuses the pair, naming the key); an effector for
/// no declared action is refused.
fn mark_in_process(
    toml: &mut Table,
    effectors: &HashMap<String, Arc<dyn Effector>>,
) -> Result<(), Error> {
    let mut declared = Vec::new();
    if let Some(Value::Array(actions)) = toml.get_mut("actions") {
        for action in actions.iter_mut().filter_map(Value::as_table_mut) {
            let Some(name) = action
                .get("name")
                .and_then(Value::as_str)
                .map(str::to_owned)
            else {
                continue;
            };
            if effectors.contains_key(&name)
                && let Value::Table(effector) = action
                    .entry("effector")
                    .or_insert_with(|| Value::Table(Table::new()))
            {
                effector.insert("in_process".into(), true.into());
            }
            declared.push(name);
        }
    }
    match effectors.keys().find(|name| !declared.contains(name)) {
        Some(name) => Err(Error::UnknownAction(name.clone())),
        None => Ok(()),
    }
}

/// An embedded ledger. Cheap to clone; share it with the bot's handlers.
#[derive(Debug, Clone)]
pub struct Opledger {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: Config,
    store: AnyStore,
    app: App,
    effectors: HashMap<String, Arc<dyn Effector>>,
    handlers: Arc<Handlers>,
    worker_id: String,
    concurrency: usize,
    lease_margin: Option<Duration>,
}

/// An operation as the ledger shows it now (the `operation_status` read model, kept in the
/// same transaction as every append).
pub type Operation = OperationStatusRow;

/// A request to start (or find) an operation: an action and its parameters, for a user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submit {
    bot: String,
    action: String,
    params: BTreeMap<String, String>,
    user_id: Option<i64>,
    chat_id: Option<i64>,
    update_id: i64,
}

impl Submit {
    /// `action` of `bot`, without parameters yet.
    pub fn new(bot: impl Into<String>, action: impl Into<String>) -> Submit {
        Submit {
            bot: bot.into(),
            action: action.into(),
            params: BTreeMap::new(),
            user_id: None,
            chat_id: None,
            update_id: 0,
        }
    }

    /// One of the action's parameters.
    pub fn param(mut self, name: impl Into<String>, value: impl Into<String>) -> Submit {
        self.params.insert(name.into(), value.into());
        self
    }

    /// The user who asked (`{user_id}` in the business key).
    pub fn user(mut self, user_id: i64) -> Submit {
        self.user_id = Some(user_id);
        self
    }

    /// The chat the worker sends the action's reply to, once the operation ends (at most
    /// once). Without it no reply is sent: answer the user yourself with the outcome.
    pub fn reply_in(mut self, chat_id: i64) -> Submit {
        self.chat_id = Some(chat_id);
        self
    }

    /// The update that caused it, recorded as the operation's correlation.
    pub fn update(mut self, update_id: i64) -> Submit {
        self.update_id = update_id;
        self
    }
}

/// What [`Opledger::run`] found: the operation as it stands when it settled (or when the wait
/// ended), and whether this request started it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The request started the operation (a new business key), rather than joined it.
    pub started: bool,
    /// The operation with this business key was started with other parameters: this request's
    /// were refused (recorded as a key conflict), and `operation` is the existing one.
    pub conflict: bool,
    /// The operation.
    pub operation: Operation,
}

impl Outcome {
    /// Confirmed by the effect (or by a lookup): `operation.external_id` is its result.
    pub fn is_confirmed(&self) -> bool {
        self.operation.status == "confirmed"
    }

    /// Settled: confirmed, failed, or decided by an operator (`reconciled`); otherwise the
    /// wait ended first and the worker is still at it.
    pub fn is_settled(&self) -> bool {
        self.operation.is_settled()
    }
}

impl Opledger {
    /// Declare bots and actions, then [`Builder::open`].
    pub fn builder() -> Builder {
        Builder::new()
    }

    /// The configuration, as checked.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Records one raw update body (Telegram's exact bytes) for `bot`: `Ok` means committed
    /// (or committed before: a duplicate), so Telegram may be answered. What it started,
    /// joined or refused is in the [`Recorded`].
    pub async fn record(&self, bot: &str, body: &[u8]) -> Result<Recorded, Error> {
        Ok(self.inner.app.intake().record(bot, body).await?.recorded)
    }

    /// Starts `submit`'s operation, or finds the one with its business key (same key, other
    /// parameters: [`Started::KeyConflict`], nothing started). The worker carries it out.
    pub async fn submit(&self, submit: Submit) -> Result<Started, Error> {
        let submission = Submission {
            client: CLIENT.to_owned(),
            bot: submit.bot,
            action: submit.action,
            params: submit.params,
            chat_id: submit.chat_id,
            user_id: submit.user_id,
            update_id: submit.update_id,
        };
        Ok(self.inner.app.intake().submit(&submission).await?)
    }

    /// [`Opledger::submit`], then [`Opledger::wait`] up to `timeout` for its outcome.
    ///
    /// A key conflict is returned as the existing operation, with `conflict: true`.
    pub async fn run(&self, submit: Submit, timeout: Duration) -> Result<Outcome, Error> {
        let (started, conflict, id) = match self.submit(submit).await? {
            Started::New(link) => (true, false, link.operation_id.to_string()),
            Started::Joined(link) => (false, false, link.operation_id.to_string()),
            Started::KeyConflict { operation_id, .. } => (false, true, operation_id.to_string()),
        };
        let operation = self.wait(&id, timeout).await?;
        Ok(Outcome {
            started,
            conflict,
            operation,
        })
    }

    /// A one-time button for `user_id`: its token (the button's `callback_data`). The first
    /// click on it by that user before `valid_for` ends starts `action` with `params`, once;
    /// the worker then replies in `chat_id`, if given.
    pub async fn button(
        &self,
        bot: &str,
        action: &str,
        user_id: i64,
        chat_id: Option<i64>,
        params: BTreeMap<String, String>,
        valid_for: Duration,
    ) -> Result<String, Error> {
        let intake = self.inner.app.intake();
        let expires_at = intake.clock().now()
            + chrono::TimeDelta::from_std(valid_for).unwrap_or(chrono::TimeDelta::MAX);
        Ok(intake
            .issue_button(bot, action, user_id, chat_id, params, expires_at)
            .await?)
    }

    /// The operation with `id`, as it stands.
    pub async fn operation(&self, id: &str) -> Result<Option<Operation>, Error> {
        Ok(operation_status::get(self.inner.store.reader(), id).await?)
    }

    /// Waits up to `timeout` until the operation is settled (confirmed, failed or reconciled),
    /// and returns it as it stands then.
    pub async fn wait(&self, id: &str, timeout: Duration) -> Result<Operation, Error> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut head = self.inner.store.subscribe();
        loop {
            let operation = self
                .operation(id)
                .await?
                .ok_or_else(|| Error::UnknownOperation(id.to_owned()))?;
            let now = tokio::time::Instant::now();
            if operation.is_settled() || now >= deadline {
                return Ok(operation);
            }
            // This process's commits wake the wait; another instance's are seen by polling.
            tokio::select! {
                _ = head.changed() => {}
                () = tokio::time::sleep((deadline - now).min(Duration::from_millis(250))) => {}
            }
        }
    }

    /// The user's most recent operations with `bot`, newest first (what `/status` shows).
    pub async fn operations_of(
        &self,
        bot: &str,
        user_id: i64,
        limit: u32,
    ) -> Result<Vec<Operation>, Error> {
        let filter = Filter {
            status: None,
            bot: Some(bot.to_owned()),
            user_id: Some(user_id),
            limit,
        };
        Ok(operation_status::list(self.inner.store.reader(), &filter).await?)
    }

    /// opledger's HTTP routes, to merge into the program's own `axum::Router`: the webhooks
    /// (`/telegram/{bot}/webhook`), `/v1` (behind its tokens), `/metrics`, `/healthz` and
    /// `/readyz`.
    pub fn router(&self) -> axum::Router {
        self.inner.app.router()
    }

    /// The updates of `bot` as they are handed over, for handlers other than teloxide's (see
    /// [`Handed`](crate::Handed)). The bot must be declared with [`Bot::handlers`].
    pub fn handlers(&self, bot: &str) -> Result<HandedUpdates, Error> {
        let declared = self
            .inner
            .config
            .bot(bot)
            .ok_or_else(|| Error::UnknownBot(bot.to_owned()))?;
        let in_process = declared
            .forward
            .as_ref()
            .is_some_and(|forward| forward.target == opledger_config::ForwardTarget::InProcess);
        if !in_process {
            return Err(Error::NoHandlers(bot.to_owned()));
        }
        Ok(self.inner.handlers.attach(bot))
    }

    /// Starts the worker (with the in-process effectors), the hand-over of updates to the
    /// handlers, the read models and the pollers of bots in poll mode, in the background.
    /// Serve [`Opledger::router`] yourself, or use [`Opledger::serve`].
    pub async fn start(&self) -> Result<Running, Error> {
        let inner = &self.inner;
        let mut options = WorkerOptions::new(inner.worker_id.clone());
        options.concurrency = inner.concurrency;
        options.effectors = inner.effectors.clone();
        let mut forwarding = ForwarderOptions::new(inner.worker_id.clone());
        if let Some(margin) = inner.lease_margin {
            options.lease_margin = margin;
            forwarding.lease_margin = margin;
        }
        let worker = Worker::new(
            &inner.config,
            inner.store.clone(),
            Arc::new(SystemClock),
            options,
        )?;
        forwarding.handover =
            Some(Arc::clone(&inner.handlers) as Arc<dyn opledger_worker::Handover>);
        let forwarder = Forwarder::new(
            &inner.config,
            inner.store.clone(),
            Arc::new(SystemClock),
            forwarding,
        )?;
        let mut projector = Projector::new(
            inner.store.clone(),
            opledger_projections::builtin(),
            ProjectorOptions {
                runner: inner.worker_id.clone(),
                ..ProjectorOptions::default()
            },
        );
        projector.prepare().await?;
        let (stop, stopped) = watch::channel(false);
        let until = |mut stopped: watch::Receiver<bool>| async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        };
        let mut tasks = vec![
            tokio::spawn({
                let until = until(stopped.clone());
                async move { worker.run(until).await }
            }),
            tokio::spawn(projector.run(until(stopped.clone()))),
        ];
        if let Some(forwarder) = forwarder {
            let until = until(stopped.clone());
            tasks.push(tokio::spawn(async move { forwarder.run(until).await }));
        }
        tasks.extend(inner.app.spawn_pollers(stopped));
        Ok(Running {
            stop,
            tasks,
            store: inner.store.clone(),
        })
    }

    /// [`Opledger::start`], and serves [`Opledger::router`] on `listener` until `shutdown`
    /// resolves; then finishes in-flight requests, polls and work, and closes the ledger.
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), Error> {
        let running = self.start().await?;
        let app = App::build(&self.inner.config, self.inner.store.clone());
        let served = app
            .run(listener, async move {
                shutdown.await;
                running.stop_work().await;
            })
            .await;
        served.map_err(Error::Serve)
    }
}

/// The embedded ledger's background work, until [`Running::shutdown`].
#[derive(Debug)]
pub struct Running {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    store: AnyStore,
}

impl Running {
    /// Stops polling, forwarding and the worker (each finishes the step it is in: a call
    /// started is recorded), lets the read models stop, and closes the ledger. Call it last:
    /// the ledger takes no more writes after it.
    pub async fn shutdown(self) {
        let store = self.store.clone();
        self.stop_work().await;
        store.close().await;
    }

    async fn stop_work(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}
