//! The gateway's forwarder (ADR 0012): each recorded update a bot's `[bots.forward]` selects
//! goes to the bot's own webhook, with the exact bytes Telegram sent, at least once until the
//! bot answers 2xx.
//!
//! The loop reads each lane's first row of `forward_queue` that is due (one update per chat in
//! flight, in ledger order; other chats in parallel) and takes one step on the update's
//! delivery stream, through the unit of work:
//! - too old: `ForwardGivenUp`, and the raw body's attachment is deleted;
//! - else `ForwardStarted` (its append at the stream's version is the claim: of two instances
//!   sharing a ledger, one wins), then the POST with `X-Opledger-Update-Id` and
//!   `X-Opledger-Attempt`, then `UpdateForwarded` (the attachment deleted in the same append) or
//!   `ForwardFailed` with the next attempt's time.
//!
//! A bot with `in_process = true` (ADR 0013) is the same, with the POST replaced by a
//! [`Handover`] to the handlers of the program that embeds opledger: done is the 2xx.
//!
//! A 2xx answer holding a Bot API call (`{"method": "sendMessage", ...}`) is carried out as a
//! tracked reply: `AnswerCallStarted` is committed with `UpdateForwarded`, before the call, and
//! the call's outcome after it; a call started whose outcome was never recorded (the process
//! died) is swept as unknown after [`ANSWER_LEASE`], never made again.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use futures_util::future::BoxFuture;
use opledger_config::{Config, ForwardConfig, ForwardTarget};
use opledger_domain::delivery::{AnswerStart, ForwardCommand, raw_attachment};
use opledger_domain::text::Redactor;
use opledger_domain::{
    Causation, Delivery, DeliveryCommand, DeliveryEvent, DeliveryRejection, EventMetadata,
    ForwardRejection,
};
use opledger_ledger::{Clock, Ledger, Undecided, UnitError};
use opledger_projections::forward_queue::{self, ForwardRow};
use opledger_store::{AnyStore, EventStore, StoreError, StreamId};
use opledger_telegram::BotApi;
use reqwest::header::CONTENT_TYPE;
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, Semaphore};

use crate::backoff::Backoff;

/// The header that carries the update's id on each attempt.
pub const UPDATE_ID_HEADER: &str = "x-opledger-update-id";
/// The header that carries the attempt's number (1, 2, ...): a bot sees a repeat as a higher one.
pub const ATTEMPT_HEADER: &str = "x-opledger-attempt";
/// The header Telegram puts the webhook secret in, presented to the bot the same way.
const SECRET_HEADER: &str = "x-telegram-bot-api-secret-token";
/// Methods a bot's answer may not make opledger call: they would take the bot's updates away
/// from the gateway, or end the bot's session.
const REFUSED_METHODS: &[&str] = &[
    "getUpdates",
    "setWebhook",
    "deleteWebhook",
    "logOut",
    "close",
];
/// How long an answer's Bot API call may stay started without an outcome before the sweep
/// presumes its caller died and records it unknown (never a second call); far longer than the
/// call's own timeout.
pub const ANSWER_LEASE: TimeDelta = TimeDelta::seconds(60);
/// The most of an answer the forwarder reads: a method call is small.
const ANSWER_LIMIT: usize = 1 << 20;

/// How many due rows one read of the queue takes at most.
const PAGE: u32 = 512;

/// An update handed to the in-process handlers of a program that embeds opledger (a bot whose
/// `[bots.forward]` says `in_process = true`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandedUpdate {
    /// The bot it was sent to.
    pub bot: String,
    /// Telegram's `update_id`.
    pub update_id: i64,
    /// 1 the first time; more when an earlier hand-over failed, timed out or was cut short by
    /// the end of the process.
    pub attempt: u32,
    /// The exact bytes Telegram sent.
    pub body: Vec<u8>,
}

/// Where the forwarder hands the updates of in-process bots: the embedding program's handlers.
///
/// The same contract as a bot's webhook: `Ok` (the handlers are done with the update) is
/// recorded as `UpdateForwarded` and the update is never handed over again; `Err`, a panic of
/// the future, or no answer within the bot's `timeout_ms` is a failed attempt, handed over
/// again later (with a higher `attempt`), as is an update whose process died before the
/// answer was recorded.
pub trait Handover: Send + Sync + std::fmt::Debug {
    /// Hands `update` to the handlers and resolves once they are done with it.
    fn hand_over(&self, update: HandedUpdate) -> BoxFuture<'_, Result<(), String>>;
}

/// How a forwarder runs.
#[derive(Debug, Clone)]
pub struct ForwarderOptions {
    /// This forwarder's id, recorded in its attempts: unique among those sharing a ledger.
    pub id: String,
    /// How many lanes (chats) it forwards at once.
    pub concurrency: usize,
    /// The longest it sleeps without looking (appends to the ledger wake it too).
    pub idle_poll: Duration,
    /// Added to an attempt's timeout to make its lease.
    pub lease_margin: Duration,
    /// The delay before a failed attempt is tried again.
    pub backoff: Backoff,
    /// The handlers of the bots whose updates go to this program (`in_process = true`); the
    /// forwarder refuses to start without them when such a bot is configured.
    pub handover: Option<Arc<dyn Handover>>,
}

impl ForwarderOptions {
    /// Defaults for a forwarder named `id`.
    pub fn new(id: impl Into<String>) -> Self {
        ForwarderOptions {
            id: id.into(),
            concurrency: 32,
            idle_poll: Duration::from_millis(500),
            lease_margin: Duration::from_secs(5),
            backoff: Backoff {
                base: Duration::from_millis(250),
                cap: Duration::from_secs(5),
            },
            handover: None,
        }
    }
}

/// Why a forwarder could not start.
#[derive(Debug, thiserror::Error)]
pub enum ForwarderError {
    #[error("cannot set up the http client of the gateway: {0}")]
    Client(#[source] reqwest::Error),
    #[error("cannot set up the bot api client of bot `{bot}`: {source}")]
    BotApi {
        bot: String,
        #[source]
        source: opledger_telegram::BotApiError,
    },
    #[error("the forwarder's concurrency must be at least 1")]
    NoConcurrency,
    /// A bot hands its updates to in-process handlers, and this program has none.
    #[error(
        "bot `{0}` hands its updates to in-process handlers ([bots.forward] in_process = true), \
         which only a Rust program embedding opledger has; give the bot's webhook as \
         [bots.forward] url instead"
    )]
    NoHandover(String),
}

/// One bot's gateway.
#[derive(Debug)]
struct Gateway {
    config: ForwardConfig,
    api: BotApi,
    target: Target,
}

/// Where one bot's updates go.
#[derive(Debug)]
enum Target {
    Webhook(reqwest::Url),
    /// The embedding program's handlers.
    Handlers(Arc<dyn Handover>),
}

/// Forwards updates to the bots' own webhooks; see the module documentation.
#[derive(Debug, Clone)]
pub struct Forwarder {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    ledger: Ledger,
    clock: Arc<dyn Clock>,
    http: reqwest::Client,
    gateways: HashMap<String, Gateway>,
    bots: Vec<String>,
    redactor: Redactor,
    options: ForwarderOptions,
    /// Delivery streams a task of this forwarder holds: never two tasks on one.
    in_hand: Mutex<HashSet<String>>,
}

/// What one step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forwarded {
    /// The bot acknowledged the update on this attempt.
    Acknowledged { attempt: u32 },
    /// The attempt failed; another is due.
    Failed { attempt: u32 },
    /// Given up: too old.
    GivenUp,
    /// Nothing to do (another forwarder has it, or it is not due).
    Nothing,
}

impl Forwarder {
    /// A forwarder for the bots of `config` that have `[bots.forward]`; `None` if none has.
    pub fn new(
        config: &Config,
        store: AnyStore,
        clock: Arc<dyn Clock>,
        options: ForwarderOptions,
    ) -> Result<Option<Self>, ForwarderError> {
        if options.concurrency == 0 {
            return Err(ForwarderError::NoConcurrency);
        }
        let redactor = config.redactor();
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(ForwarderError::Client)?;
        let bot_http = BotApi::http_client().map_err(|source| ForwarderError::BotApi {
            bot: String::new(),
            source,
        })?;
        let mut gateways = HashMap::new();
        for bot in &config.bots {
            let Some(forward) = &bot.forward else {
                continue;
            };
            let api = BotApi::new(&bot.api_base_url, bot.token.clone(), bot_http.clone())
                .map_err(|source| ForwarderError::BotApi {
                    bot: bot.name.clone(),
                    source,
                })?
                .with_request_timeout(Duration::from_secs(10))
                .redacting(&redactor);
            let target = match &forward.target {
                ForwardTarget::Webhook(url) => Target::Webhook(url.clone()),
                ForwardTarget::InProcess => Target::Handlers(
                    options
                        .handover
                        .clone()
                        .ok_or_else(|| ForwarderError::NoHandover(bot.name.clone()))?,
                ),
            };
            gateways.insert(
                bot.name.clone(),
                Gateway {
                    config: forward.clone(),
                    api,
                    target,
                },
            );
        }
        if gateways.is_empty() {
            return Ok(None);
        }
        let mut bots: Vec<String> = gateways.keys().cloned().collect();
        bots.sort();
        Ok(Some(Forwarder {
            inner: Arc::new(Inner {
                ledger: Ledger::new(store),
                clock,
                http,
                gateways,
                bots,
                redactor,
                options,
                in_hand: Mutex::new(HashSet::new()),
            }),
        }))
    }

    /// Forwards until `shutdown` resolves; the attempts in hand finish first.
    pub async fn run(&self, shutdown: impl Future<Output = ()> + Send) {
        let inner = &self.inner;
        let permits = Arc::new(Semaphore::new(inner.options.concurrency));
        let finished = Arc::new(Notify::new());
        let mut head = inner.ledger.store().subscribe();
        let mut tasks = tokio::task::JoinSet::new();
        tokio::pin!(shutdown);
        // Due rows in hand, waiting for a task: reading the queue costs more than one step, so
        // a page serves many steps (each row is a different lane's first: they never wait on
        // each other). A row taken here is in hand until its step ends.
        let mut queue: VecDeque<ForwardRow> = VecDeque::new();
        loop {
            if queue.len() < inner.options.concurrency {
                match self.due(inner.clock.now(), PAGE).await {
                    Ok(rows) => queue.extend(rows.into_iter().filter(|r| inner.take(&r.stream_id))),
                    Err(error) => {
                        tracing::warn!(%error, "cannot read the forward queue; trying again");
                    }
                }
            }
            let mut started = 0usize;
            while !queue.is_empty() {
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    break;
                };
                let Some(row) = queue.pop_front() else {
                    break;
                };
                started += 1;
                let forwarder = self.clone();
                let finished = Arc::clone(&finished);
                tasks.spawn(async move {
                    forwarder.step_row(&row).await;
                    forwarder.inner.release(&row.stream_id);
                    drop(permit);
                    finished.notify_one();
                });
            }
            while tasks.try_join_next().is_some() {}
            if started > 0 && queue.is_empty() {
                continue;
            }
            tokio::select! {
                () = &mut shutdown => break,
                _ = head.changed() => {}
                () = finished.notified() => {}
                () = tokio::time::sleep(inner.options.idle_poll) => {}
            }
        }
        for row in queue {
            inner.release(&row.stream_id);
        }
        while tasks.join_next().await.is_some() {}
    }

    /// The due rows (each lane's first) and the answers whose caller died.
    async fn due(&self, now: DateTime<Utc>, page: u32) -> Result<Vec<ForwardRow>, String> {
        let reader = self.inner.ledger.store().reader();
        let mut rows = forward_queue::due(reader, now, &self.inner.bots, page)
            .await
            .map_err(|e| e.to_string())?;
        let stale = forward_queue::stale_answers(reader, now, page)
            .await
            .map_err(|e| e.to_string())?;
        rows.extend(
            stale
                .into_iter()
                .filter(|row| self.inner.gateways.contains_key(&row.bot)),
        );
        Ok(rows)
    }

    /// Takes every due step once (tests and tools): the outcome of each row's step.
    pub async fn run_due(&self) -> Result<Vec<(String, Forwarded)>, String> {
        let rows = self.due(self.inner.clock.now(), u32::MAX).await?;
        let mut done = Vec::with_capacity(rows.len());
        for row in rows {
            if self.inner.take(&row.stream_id) {
                let outcome = self.step_row(&row).await;
                self.inner.release(&row.stream_id);
                done.push((row.stream_id, outcome));
            }
        }
        Ok(done)
    }

    async fn step_row(&self, row: &ForwardRow) -> Forwarded {
        let result = if row.state == "answering" {
            self.sweep_answer(row).await.map(|()| Forwarded::Nothing)
        } else {
            self.step(row).await
        };
        result.unwrap_or_else(|error| {
            tracing::warn!(stream = %row.stream_id, %error, "forwarding step failed; it stays due");
            Forwarded::Nothing
        })
    }

    /// One step on the update `row` names: give up, or one attempt.
    async fn step(&self, row: &ForwardRow) -> Result<Forwarded, StepError> {
        let inner = &self.inner;
        let Some(gateway) = inner.gateways.get(&row.bot) else {
            return Ok(Forwarded::Nothing);
        };
        let stream =
            StreamId::new(row.stream_id.clone()).map_err(|e| StepError::Id(e.to_string()))?;
        let now = inner.clock.now();
        let max_age = TimeDelta::from_std(gateway.config.give_up_after).unwrap_or(TimeDelta::MAX);
        if now - row.received_at >= max_age {
            let command = ForwardCommand::GiveUp { max_age };
            return match self.commit(&stream, command, Detach::Raw).await? {
                Some(_) => {
                    tracing::warn!(stream = %row.stream_id, "forwarding given up: too old");
                    Ok(Forwarded::GivenUp)
                }
                None => Ok(Forwarded::Nothing),
            };
        }
        let lease = gateway.config.timeout + inner.options.lease_margin;
        let lease_until = now + TimeDelta::from_std(lease).unwrap_or(TimeDelta::MAX);
        let start = ForwardCommand::Start {
            forwarder: inner.options.id.clone(),
            lease_until,
        };
        let Some((delivery, events)) = self.commit(&stream, start, Detach::None).await? else {
            return Ok(Forwarded::Nothing);
        };
        let Some(DeliveryEvent::ForwardStarted(started)) = events.first() else {
            return Ok(Forwarded::Nothing);
        };
        let attempt = started.attempt;
        let body = self.raw_body(&stream, delivery.epoch).await?;
        let began = Instant::now();
        let answer = match body {
            Some(body) => match &gateway.target {
                Target::Webhook(url) => self.post(gateway, url, row.update_id, attempt, body).await,
                Target::Handlers(handover) => {
                    let update = HandedUpdate {
                        bot: row.bot.clone(),
                        update_id: row.update_id,
                        attempt,
                        body,
                    };
                    self.hand_over(gateway, handover.as_ref(), update).await
                }
            },
            None => Err(AttemptError {
                status: None,
                error: "the update's raw body is gone from the ledger's attachments (restored \
                        from a copy without them?); it cannot be forwarded"
                    .to_owned(),
            }),
        };
        let elapsed_ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
        match answer {
            Ok((status, call)) => {
                let answer = call.as_ref().map(|c| AnswerStart {
                    method: c.method.clone(),
                    digest: c.digest.clone(),
                    lease_until: inner.clock.now() + ANSWER_LEASE,
                });
                let acknowledge = ForwardCommand::Acknowledge {
                    attempt,
                    status,
                    elapsed_ms,
                    answer,
                };
                let committed = self.commit(&stream, acknowledge, Detach::Raw).await?;
                if let (Some(_), Some(call)) = (committed, call) {
                    self.carry_out(gateway, &stream, call).await?;
                }
                Ok(Forwarded::Acknowledged { attempt })
            }
            Err(failure) => {
                let delay = inner.options.backoff.delay(&row.stream_id, attempt, None);
                let retry_at =
                    inner.clock.now() + TimeDelta::from_std(delay).unwrap_or(TimeDelta::MAX);
                tracing::debug!(stream = %row.stream_id, attempt, error = %failure.error, "forward attempt failed");
                let fail = ForwardCommand::Fail {
                    attempt,
                    status: failure.status,
                    error: failure.error,
                    retry_at,
                };
                self.commit(&stream, fail, Detach::None).await?;
                Ok(Forwarded::Failed { attempt })
            }
        }
    }

    /// The exact bytes Telegram sent for `epoch`: the attachment, else the `RawUpdateStored` of
    /// a ledger that keeps raw updates.
    async fn raw_body(&self, stream: &StreamId, epoch: u32) -> Result<Option<Vec<u8>>, StepError> {
        let store = self.inner.ledger.store();
        if let Some(body) = store.attachment(stream, &raw_attachment(epoch)).await? {
            return Ok(Some(body));
        }
        let recorded = store.read_stream(stream, 1, usize::MAX).await?;
        for event in recorded.iter().rev() {
            if let Ok(DeliveryEvent::RawUpdateStored(raw)) =
                <DeliveryEvent as opledger_domain::DomainEvent>::from_stored(
                    &event.event_type,
                    event.schema_version,
                    &event.payload,
                )
                && raw.epoch == epoch
            {
                return Ok(Some(raw.body.into_bytes()));
            }
        }
        Ok(None)
    }

    /// One POST to the bot's webhook: its 2xx status and the method call its answer holds, or
    /// why it failed.
    async fn post(
        &self,
        gateway: &Gateway,
        url: &reqwest::Url,
        update_id: i64,
        attempt: u32,
        body: Vec<u8>,
    ) -> Result<(u16, Option<AnswerCall>), AttemptError> {
        let mut request = self
            .inner
            .http
            .post(url.clone())
            .timeout(gateway.config.timeout)
            .header(CONTENT_TYPE, "application/json")
            .header(UPDATE_ID_HEADER, update_id.to_string())
            .header(ATTEMPT_HEADER, attempt.to_string())
            .body(body);
        if let Some(secret) = &gateway.config.secret {
            use opledger_config::ExposeSecret;
            request = request.header(SECRET_HEADER, secret.expose_secret());
        }
        let response = request.send().await.map_err(|e| AttemptError {
            status: None,
            error: self.describe(&e),
        })?;
        let status = response.status();
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim_start().to_owned());
        if !status.is_success() {
            return Err(AttemptError {
                status: Some(status.as_u16()),
                error: format!("the bot answered {status}"),
            });
        }
        // The answer is read only for a method call; a body that does not arrive in time
        // still leaves the update acknowledged (the status said so).
        let call = match content_type {
            Some(content_type) if AnswerCall::may_hold_one(&content_type) => {
                match response.bytes().await {
                    Ok(bytes) if bytes.len() <= ANSWER_LIMIT => {
                        AnswerCall::parse(&content_type, &bytes)
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        Ok((status.as_u16(), call))
    }

    /// One hand-over to the embedding program's handlers: done (as if the bot had answered
    /// 200, with no method call), or why not.
    async fn hand_over(
        &self,
        gateway: &Gateway,
        handover: &dyn Handover,
        update: HandedUpdate,
    ) -> Result<(u16, Option<AnswerCall>), AttemptError> {
        let timeout = gateway.config.timeout;
        let handed = std::panic::AssertUnwindSafe(handover.hand_over(update));
        match tokio::time::timeout(timeout, futures_util::FutureExt::catch_unwind(handed)).await {
            Ok(Ok(Ok(()))) => Ok((200, None)),
            Ok(Ok(Err(error))) => Err(AttemptError {
                status: None,
                error: self.inner.redactor.kept_string(error),
            }),
            Ok(Err(_panic)) => Err(AttemptError {
                status: None,
                error: "the in-process handlers panicked".to_owned(),
            }),
            Err(_elapsed) => Err(AttemptError {
                status: None,
                error: format!(
                    "the in-process handlers did not finish within {} ms ([bots.forward] \
                     timeout_ms)",
                    timeout.as_millis()
                ),
            }),
        }
    }

    /// A transport error in words: its kind and its causes, never the URL, secrets out.
    fn describe(&self, error: &reqwest::Error) -> String {
        let mut text = if error.is_timeout() {
            "no answer in time".to_owned()
        } else if error.is_connect() {
            "cannot connect".to_owned()
        } else {
            "the request failed".to_owned()
        };
        let mut source = std::error::Error::source(error);
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        self.inner.redactor.redact(&text).into_owned()
    }

    /// Carries out the bot's answer call, whose start is committed, and records its outcome.
    async fn carry_out(
        &self,
        gateway: &Gateway,
        stream: &StreamId,
        call: AnswerCall,
    ) -> Result<(), StepError> {
        let outcome = if REFUSED_METHODS.contains(&call.method.as_str()) {
            ForwardCommand::AnswerFailed {
                error: format!(
                    "{} is not carried out from a webhook answer behind the gateway: it would \
                     take the updates away from opledger",
                    call.method
                ),
                known: true,
            }
        } else {
            match gateway.api.call_answer(&call.method, &call.params).await {
                Ok(result) => ForwardCommand::AnswerSent {
                    message_id: serde_json::from_str::<serde_json::Value>(result.get())
                        .ok()
                        .and_then(|v| v.get("message_id")?.as_i64()),
                },
                Err(error) => ForwardCommand::AnswerFailed {
                    known: error.is_definitely_not_delivered(),
                    error: opledger_domain::text::storable_string(error.to_string()),
                },
            }
        };
        self.commit(stream, outcome, Detach::None).await?;
        Ok(())
    }

    /// An answer call started by a process that died before recording its outcome: unknown,
    /// never made again.
    async fn sweep_answer(&self, row: &ForwardRow) -> Result<(), StepError> {
        let stream =
            StreamId::new(row.stream_id.clone()).map_err(|e| StepError::Id(e.to_string()))?;
        let command = ForwardCommand::AnswerFailed {
            error: "the process carrying it out stopped before recording its outcome; it is not \
                    made again"
                .to_owned(),
            known: false,
        };
        self.commit(&stream, command, Detach::None).await?;
        Ok(())
    }

    /// Decides `command` on the delivery and commits it (deleting the raw body's attachment
    /// with it when asked): the state it was decided on and the events, or `None` when the
    /// domain refused the step (another forwarder took it, or it is not due).
    async fn commit(
        &self,
        stream: &StreamId,
        command: ForwardCommand,
        detach: Detach,
    ) -> Result<Option<(Delivery, Vec<DeliveryEvent>)>, StepError> {
        let inner = &self.inner;
        let metadata = EventMetadata::caused_by(Causation::Worker {
            worker: inner.options.id.clone(),
        })
        .correlated_with(stream.as_str());
        let command = DeliveryCommand::Forward(command);
        let now = inner.clock.now();
        let committed = inner
            .ledger
            .unit_of_work()
            .run(|snapshot, changes| {
                let delivery: Delivery = snapshot.read(stream)?;
                let events = opledger_domain::delivery::decide(&delivery, &command, now)
                    .map_err(Undecided::Rejected)?;
                changes.decided(stream, &delivery, &events, &metadata);
                if let Detach::Raw = detach {
                    changes.detach(stream, raw_attachment(delivery.epoch));
                }
                Ok((delivery, events))
            })
            .await;
        match committed {
            Ok(committed) => Ok(Some(committed.value)),
            Err(UnitError::Rejected(DeliveryRejection::Forward(rejection))) => {
                tracing::debug!(stream = %stream, %rejection, "forwarding step not taken");
                if matches!(rejection, ForwardRejection::Invalid(_)) {
                    return Err(StepError::Refused(rejection.to_string()));
                }
                Ok(None)
            }
            Err(UnitError::Contended { .. }) => Ok(None),
            Err(error) => Err(StepError::Commit(error.to_string())),
        }
    }
}

/// Whether a step's commit deletes the raw body's attachment.
#[derive(Debug, Clone, Copy)]
enum Detach {
    None,
    Raw,
}

/// A Bot API call a bot put in its webhook answer.
#[derive(Debug, Clone)]
struct AnswerCall {
    method: String,
    params: serde_json::Map<String, serde_json::Value>,
    /// Hex SHA-256 of the answer's bytes.
    digest: String,
}

impl AnswerCall {
    /// Whether an answer of `content_type` may hold a call: JSON, or a form (aiogram's).
    fn may_hold_one(content_type: &str) -> bool {
        let media_type = content_type.to_ascii_lowercase();
        media_type.starts_with("application/json") || media_type.starts_with("multipart/form-data")
    }

    /// The call in an answer of `content_type`, if it holds one: a JSON object
    /// (`{"method": "...", ...}`) or, as aiogram answers, a `multipart/form-data` form with a
    /// `method` field (its values text, which the Bot API takes as it takes JSON).
    fn parse(content_type: &str, bytes: &[u8]) -> Option<AnswerCall> {
        let form = content_type
            .to_ascii_lowercase()
            .starts_with("multipart/form-data");
        let mut params = if form {
            opledger_telegram::form_data_fields(content_type, bytes)?
                .into_iter()
                .map(|(name, value)| (name, serde_json::Value::String(value)))
                .collect()
        } else {
            let serde_json::Value::Object(params) = serde_json::from_slice(bytes).ok()? else {
                return None;
            };
            params
        };
        let serde_json::Value::String(method) = params.remove("method")? else {
            return None;
        };
        Some(AnswerCall {
            method: opledger_domain::text::storable_string(method),
            params,
            digest: hex::encode(Sha256::digest(bytes)),
        })
    }
}

/// Why one attempt failed.
#[derive(Debug)]
struct AttemptError {
    status: Option<u16>,
    error: String,
}

/// Why a step could not be taken; it stays due.
#[derive(Debug, thiserror::Error)]
enum StepError {
    #[error("invalid delivery stream id: {0}")]
    Id(String),
    #[error("cannot read the update: {0}")]
    Store(#[from] StoreError),
    #[error("cannot record the step: {0}")]
    Commit(String),
    #[error("the domain refused the step: {0}")]
    Refused(String),
}

impl Inner {
    fn take(&self, stream: &str) -> bool {
        self.in_hand
            .lock()
            .expect("the in-hand set is never poisoned")
            .insert(stream.to_owned())
    }

    fn release(&self, stream: &str) {
        self.in_hand
            .lock()
            .expect("the in-hand set is never poisoned")
            .remove(stream);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_with_a_method_is_a_call() {
        let call = AnswerCall::parse(
            "application/json",
            br#"{"method":"sendMessage","chat_id":1,"text":"hi"}"#,
        )
        .expect("a call");
        assert_eq!(call.method, "sendMessage");
        assert_eq!(call.params.get("chat_id"), Some(&serde_json::json!(1)));
        assert!(!call.params.contains_key("method"));
        assert_eq!(call.digest.len(), 64);
    }

    #[test]
    fn a_form_with_a_method_is_a_call_of_text_fields() {
        let body =
            b"--Bnd\r\nContent-Disposition: form-data; name=\"method\"\r\n\r\nsendMessage\r\n\
            --Bnd\r\nContent-Disposition: form-data; name=\"chat_id\"\r\n\r\n42\r\n--Bnd--\r\n";
        let call = AnswerCall::parse("multipart/form-data; boundary=Bnd", body).expect("a call");
        assert_eq!(call.method, "sendMessage");
        assert_eq!(call.params.get("chat_id"), Some(&serde_json::json!("42")));
        assert_eq!(call.params.len(), 1);
        assert!(AnswerCall::may_hold_one(
            "Multipart/Form-Data; boundary=Bnd"
        ));
        assert!(!AnswerCall::may_hold_one("text/plain"));
        let no_method =
            b"--Bnd\r\nContent-Disposition: form-data; name=\"chat_id\"\r\n\r\n42\r\n--Bnd--";
        assert!(AnswerCall::parse("multipart/form-data; boundary=Bnd", no_method).is_none());
    }

    #[test]
    fn other_answers_are_no_call() {
        for body in [
            &b""[..],
            b"ok",
            b"[]",
            br#"{"ok":true}"#,
            br#"{"method":7}"#,
        ] {
            assert!(
                AnswerCall::parse("application/json", body).is_none(),
                "{body:?}"
            );
        }
    }
}
