//! The intake transaction: one Telegram update, recorded durably and deduplicated in one atomic
//! multi-stream append before anyone answers Telegram.
//!
//! An update's delivery stream (`update-{bot}-{update_id}`) gets `UpdateReceived`; in the same
//! append, an action command starts its operation (`Received`, at `NoStream`) or joins it (the
//! delivery records the operation it joined), a repeat of the same key with other parameters
//! records a `KeyConflictRecorded`, a repeat guard records `CommandSeen`, and a button click
//! consumes its token. Every decision is the domain's, made on state read from the ledger; the
//! store's version checks turn a race into a clean retry, never into a second operation.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use chrono::{DateTime, TimeDelta, Utc};
use opledger_config::{ActionConfig, BotConfig, Config};
use opledger_domain::callback_token::{
    self, CallbackToken, CallbackTokenCommand, CallbackTokenEvent, TokenIssued, TokenRejection,
};
use opledger_domain::delivery::{self, Delivery, DeliveryCommand, DeliveryEvent};
use opledger_domain::operation::{self, OperationCommand, OperationEvent, Received};
use opledger_domain::quarantine::{BodyQuarantined, QuarantineEvent, quarantine_stream};
use opledger_domain::repeat_guard::{self, RepeatGuard, RepeatGuardCommand, RepeatGuardEvent};
use opledger_domain::{
    Causation, DomainEvent, EventMetadata, IdError, Operation, OperationId, OperationLink,
    callback_stream, delivery_stream, fingerprint, operation_stream, repeat_guard_stream,
};
use opledger_store::{AnyStore, AppendRequest, EventStore, ExpectedVersion, StoreError, StreamId};
use opledger_telegram::{CallbackQuery, Command, Quarantine, Update, parse_update};

use opledger_ledger::{Clock, LedgerError, expected, load, request};

/// How often one update's decisions are made again after losing a race for a stream.
const MAX_ATTEMPTS: usize = 8;

/// What recording an update did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// A new update (or an id reused after the retention window: a new epoch), and what it led to.
    Accepted {
        /// The ledger position of the update's last event: read models that have applied it
        /// know everything the update did.
        position: u64,
        update_id: i64,
        epoch: u32,
        kind: String,
        chat_id: Option<i64>,
        user_id: Option<i64>,
        route: Route,
    },
    /// The same update again, within the retention window: noted, nothing started.
    Duplicate { update_id: i64 },
    /// Another body under an id seen within the retention window: noted, not processed.
    Collision { update_id: i64 },
    /// An authenticated body that is not an update: its digest and size were recorded.
    Quarantined { reason: String },
}

/// Where an accepted update went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Nothing to do: not a command or a button of ours.
    Nothing,
    /// The update started an operation.
    Started(OperationLink),
    /// The update asked again for an operation that exists; it joined it.
    Joined(OperationLink),
    /// The same business key with other parameters: recorded as a conflict, nothing started.
    KeyConflict { operation_id: OperationId },
    /// A command of an action whose arguments do not make a business key.
    Usage { action: String },
    /// `/help`: answered from configuration.
    Help,
    /// `/status` (with an optional operation id): answered from read models.
    Status { operation_id: Option<String> },
    /// A button click that was refused (already used, another user, expired, unknown).
    TokenRefused { reason: String },
}

impl Route {
    fn link(&self) -> Option<OperationLink> {
        match self {
            Route::Started(link) | Route::Joined(link) => Some(link.clone()),
            _ => None,
        }
    }
}

/// Why an update could not be recorded; the webhook answers 503 and Telegram delivers again.
#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    #[error("no bot named `{0}` is configured")]
    UnknownBot(String),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("the update's streams kept changing under it ({MAX_ATTEMPTS} attempts); retry later")]
    Contended,
    #[error("invalid identifier: {0}")]
    Id(#[from] IdError),
    #[error("invalid stream id: {0}")]
    StreamId(#[from] opledger_store::InvalidRequest),
    #[error("the domain refused the update: {0}")]
    Refused(String),
}

impl From<StoreError> for IntakeError {
    fn from(error: StoreError) -> Self {
        IntakeError::Ledger(LedgerError::Store(error))
    }
}

impl IntakeError {
    /// Whether this is the storage's fault (answer 503 so Telegram retries) rather than a bug.
    pub fn is_storage(&self) -> bool {
        matches!(
            self,
            IntakeError::Ledger(LedgerError::Store(_)) | IntakeError::Contended
        )
    }
}

/// What every routing step of one attempt shares.
#[derive(Clone, Copy)]
struct Context<'a> {
    bot: &'a str,
    update: &'a Update,
    now: DateTime<Utc>,
    metadata: &'a EventMetadata,
    /// Whether to assume that the streams the update touches do not exist yet (first attempt).
    fresh: bool,
}

/// One bot's routing table.
#[derive(Debug)]
struct BotRoutes {
    /// Actions by command.
    actions: HashMap<String, Arc<ActionConfig>>,
}

/// Records updates: the one place that turns a raw Telegram body into ledger events.
#[derive(Debug)]
pub struct Intake {
    store: AnyStore,
    clock: Arc<dyn Clock>,
    retention: TimeDelta,
    store_raw_updates: bool,
    bots: HashMap<String, BotRoutes>,
    actions: HashMap<String, Arc<ActionConfig>>,
}

impl Intake {
    pub fn new(config: &Config, store: AnyStore, clock: Arc<dyn Clock>) -> Self {
        let actions: HashMap<String, Arc<ActionConfig>> = config
            .actions
            .iter()
            .map(|a| (a.name.clone(), Arc::new(a.clone())))
            .collect();
        let bots = config
            .bots
            .iter()
            .map(|bot: &BotConfig| {
                let routes = actions
                    .values()
                    .filter(|a| a.bot == bot.name)
                    .map(|a| (a.command.clone(), a.clone()))
                    .collect();
                (bot.name.clone(), BotRoutes { actions: routes })
            })
            .collect();
        Self {
            store,
            clock,
            retention: TimeDelta::from_std(config.server.dedup_retention).unwrap_or(TimeDelta::MAX),
            store_raw_updates: config.server.store_raw_updates,
            bots,
            actions,
        }
    }

    /// The store updates are recorded in.
    pub fn store(&self) -> &AnyStore {
        &self.store
    }

    /// The service's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Records one raw update body for `bot`. `Ok` means it is durably recorded (or was before):
    /// only then may Telegram be answered 2xx.
    pub async fn record(&self, bot: &str, raw: &[u8]) -> Result<Recorded, IntakeError> {
        let routes = self
            .bots
            .get(bot)
            .ok_or_else(|| IntakeError::UnknownBot(bot.to_owned()))?;
        let now = self.clock.now();
        let update = match parse_update(raw) {
            Ok(update) => update,
            Err(quarantine) => return self.quarantine(bot, &quarantine, now).await,
        };
        let stream = StreamId::new(delivery_stream(bot, update.update_id)?)?;
        let metadata = EventMetadata::caused_by(Causation::Update {
            bot: bot.to_owned(),
            update_id: update.update_id,
        })
        .correlated_with(stream.as_str());
        let raw_body = self
            .store_raw_updates
            .then(|| String::from_utf8_lossy(raw).into_owned());

        // The first attempt assumes a new update; losing the race for its stream means it is
        // not, and the next attempt reads what is there.
        let mut delivery = Delivery::default();
        for attempt in 0..MAX_ATTEMPTS {
            if attempt > 0 {
                delivery = load::<Delivery>(&self.store, &stream).await?;
            }
            let probe = delivery::decide(
                &delivery,
                &record_command(bot, &update, None, now, self.retention, None),
                now,
            )
            .map_err(|e| IntakeError::Refused(e.to_string()))?;
            match probe.first() {
                Some(DeliveryEvent::DuplicateDeliveryObserved(_)) => {
                    // A note that depends on nothing but the epoch: no version race among repeats.
                    let note = request(stream.clone(), ExpectedVersion::Any, &probe, &metadata)?;
                    self.store.append(vec![note]).await?;
                    return Ok(Recorded::Duplicate {
                        update_id: update.update_id,
                    });
                }
                Some(DeliveryEvent::UpdateIdCollision(_)) => {
                    let note = request(stream.clone(), ExpectedVersion::Any, &probe, &metadata)?;
                    self.store.append(vec![note]).await?;
                    tracing::warn!(
                        bot,
                        update_id = update.update_id,
                        "update id reused with a different body inside the retention window; not processed"
                    );
                    return Ok(Recorded::Collision {
                        update_id: update.update_id,
                    });
                }
                _ => {}
            }
            // The first attempt also assumes the update asks for something new: every stream it
            // would create is appended at `NoStream`, so a wrong guess fails atomically and the
            // next attempt reads what exists. A new request thus costs no read at all.
            let context = Context {
                bot,
                update: &update,
                now,
                metadata: &metadata,
                fresh: attempt == 0,
            };
            let (mut requests, route) = self.route(&context, routes).await?;
            let events = delivery::decide(
                &delivery,
                &record_command(
                    bot,
                    &update,
                    route.link(),
                    now,
                    self.retention,
                    raw_body.clone(),
                ),
                now,
            )
            .map_err(|e| IntakeError::Refused(e.to_string()))?;
            let epoch = match events.first() {
                Some(DeliveryEvent::UpdateReceived(received)) => received.epoch,
                _ => return Err(IntakeError::Refused("expected a first receipt".into())),
            };
            requests.insert(
                0,
                request(
                    stream.clone(),
                    expected(delivery.version),
                    &events,
                    &metadata,
                )?,
            );
            match self.store.append(requests).await {
                Ok(appended) => {
                    return Ok(Recorded::Accepted {
                        position: *appended.positions.end(),
                        update_id: update.update_id,
                        epoch,
                        kind: update.kind.as_str().into_owned(),
                        chat_id: update.chat_id,
                        user_id: update.user_id,
                        route,
                    });
                }
                Err(StoreError::VersionConflict { .. }) => continue,
                Err(error) => return Err(error.into()),
            }
        }
        Err(IntakeError::Contended)
    }

    /// Records a body that is not an update: its digest and size, never the body.
    async fn quarantine(
        &self,
        bot: &str,
        quarantine: &Quarantine,
        now: DateTime<Utc>,
    ) -> Result<Recorded, IntakeError> {
        let reason = quarantine.reason.as_str().to_owned();
        let event: QuarantineEvent = BodyQuarantined {
            reason: reason.clone(),
            digest: quarantine.digest.clone(),
            size: quarantine.size as u64,
            received_at: now,
        }
        .into();
        let metadata = EventMetadata::caused_by(Causation::System {
            component: "intake".to_owned(),
        });
        let stream = StreamId::new(quarantine_stream(bot)?)?;
        let note = request(stream, ExpectedVersion::Any, &[event], &metadata)?;
        self.store.append(vec![note]).await?;
        tracing::warn!(bot, %reason, size = quarantine.size, "quarantined a body that is not an update");
        Ok(Recorded::Quarantined { reason })
    }

    /// Decides where an update goes and what it appends besides its delivery.
    async fn route(
        &self,
        context: &Context<'_>,
        routes: &BotRoutes,
    ) -> Result<(Vec<AppendRequest>, Route), IntakeError> {
        let update = context.update;
        if let Some(command) = &update.text_command {
            match command.name.as_str() {
                "help" | "start" => return Ok((Vec::new(), Route::Help)),
                "status" => {
                    return Ok((
                        Vec::new(),
                        Route::Status {
                            operation_id: command.args.first().cloned(),
                        },
                    ));
                }
                name => {
                    if let Some(action) = routes.actions.get(name) {
                        let Some(params) = bind_params(&action.params, &command.args) else {
                            return Ok((Vec::new(), Route::usage(action)));
                        };
                        return self
                            .route_action(context, action, params, Some(command))
                            .await;
                    }
                }
            }
        }
        if let Some(callback) = &update.callback {
            return self.route_click(context, callback).await;
        }
        Ok((Vec::new(), Route::Nothing))
    }

    /// Starts or joins the operation an action's parameters name.
    async fn route_action(
        &self,
        context: &Context<'_>,
        action: &ActionConfig,
        params: BTreeMap<String, String>,
        command: Option<&Command>,
    ) -> Result<(Vec<AppendRequest>, Route), IntakeError> {
        let Context {
            bot,
            update,
            now,
            metadata,
            fresh,
        } = *context;
        let lookup = |name: &str| -> Option<String> {
            match name {
                "user_id" => update.user_id.map(|v| v.to_string()),
                "chat_id" => update.chat_id.map(|v| v.to_string()),
                "bot" => Some(bot.to_owned()),
                "action" => Some(action.name.clone()),
                param => params.get(param).cloned(),
            }
        };
        let Ok(mut key) = action.key.render(&lookup) else {
            return Ok((Vec::new(), Route::usage(action)));
        };
        let mut requests = Vec::new();
        if let (Some(window), Some(command)) = (action.repeat_window, command) {
            let window = TimeDelta::from_std(window).unwrap_or(TimeDelta::MAX);
            let stream = StreamId::new(repeat_guard_stream(
                bot,
                update.chat_id,
                update.user_id,
                &command.normalized(),
            )?)?;
            let guard = if fresh {
                RepeatGuard::default()
            } else {
                load::<RepeatGuard>(&self.store, &stream).await?
            };
            let seen = repeat_guard::decide(
                &guard,
                &RepeatGuardCommand::See {
                    update_id: update.update_id,
                    // Windows are measured with the message's own date; a message always has
                    // one, the receipt time is only a fallback for odd updates.
                    message_date: update.message_date.unwrap_or(now),
                    window,
                },
                now,
            )
            .map_err(|e| IntakeError::Refused(e.to_string()))?;
            let Some(RepeatGuardEvent::CommandSeen(first)) = seen.first() else {
                return Err(IntakeError::Refused("the guard decided nothing".into()));
            };
            key = format!("{key}#{}", first.epoch);
            requests.push(request(stream, expected(guard.version), &seen, metadata)?);
        }

        let stream = StreamId::new(operation_stream(&action.name, &key)?)?;
        let operation_id = OperationId::new(&action.name, &key);
        let state = if fresh {
            Operation::default()
        } else {
            load::<Operation>(&self.store, &stream).await?
        };
        let received = Received {
            operation_id,
            action: action.name.clone(),
            business_key: key,
            fingerprint: fingerprint(&action.name, &params),
            params,
            bot: bot.to_owned(),
            chat_id: update.chat_id,
            user_id: update.user_id,
            update_id: update.update_id,
            message_date: update.message_date,
            max_attempts: action.effector.as_ref().map_or(1, |e| e.max_attempts),
        };
        let events = operation::decide(&state, &OperationCommand::Receive(received), now)
            .map_err(|e| IntakeError::Refused(e.to_string()))?;
        let link = |joined| OperationLink {
            action: action.name.clone(),
            operation_id,
            stream: stream.to_string(),
            joined,
        };
        let route = match events.first() {
            None => Route::Joined(link(true)),
            Some(OperationEvent::Received(_)) => Route::Started(link(false)),
            Some(OperationEvent::KeyConflictRecorded(_)) => Route::KeyConflict { operation_id },
            Some(other) => {
                return Err(IntakeError::Refused(format!(
                    "a request decided {}",
                    other.event_type()
                )));
            }
        };
        if !events.is_empty() {
            requests.push(request(
                stream.clone(),
                expected(state.version),
                &events,
                metadata,
            )?);
        }
        Ok((requests, route))
    }

    /// Consumes a button's token; an accepted click starts the token's action.
    async fn route_click(
        &self,
        context: &Context<'_>,
        callback: &CallbackQuery,
    ) -> Result<(Vec<AppendRequest>, Route), IntakeError> {
        let Context {
            update,
            now,
            metadata,
            ..
        } = *context;
        let Some(data) = callback.data.as_deref() else {
            return Ok((Vec::new(), Route::Nothing));
        };
        // Only our own tokens (minted with the token prefix) name a stream; any other callback
        // data belongs to the bot's own buttons and is not ours to judge.
        if !data.starts_with(callback_token::TOKEN_PREFIX) {
            return Ok((Vec::new(), Route::Nothing));
        }
        let Ok(stream) = callback_stream(data) else {
            return Ok((Vec::new(), Route::Nothing));
        };
        let stream = StreamId::new(stream)?;
        let Some(user_id) = update.user_id else {
            return Ok((Vec::new(), Route::Nothing));
        };
        let recorded = self.store.read_stream(&stream, 1, usize::MAX).await?;
        let history = recorded
            .iter()
            .map(|e| CallbackTokenEvent::from_stored(&e.event_type, e.schema_version, &e.payload))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| LedgerError::Decode {
                stream: stream.to_string(),
                source,
            })?;
        let token = CallbackToken::replay(&history);
        let events = callback_token::decide(
            &token,
            &CallbackTokenCommand::Consume {
                user_id,
                update_id: update.update_id,
            },
            now,
        )
        .map_err(|e| IntakeError::Refused(e.to_string()))?;
        // A refusal no later event can undo (the token is used up, is another user's, or has
        // expired) is a note, like a duplicate delivery: appended at any version, so that clicks
        // refused at once do not race each other into 503s. A consume, and a refusal of a token
        // not issued (yet), depend on the version read.
        let version = match events.first() {
            Some(CallbackTokenEvent::TokenRejected(rejected))
                if rejected.reason != TokenRejection::NotIssued =>
            {
                ExpectedVersion::Any
            }
            _ => expected(token.version),
        };
        let click = request(stream, version, &events, metadata)?;
        match events.first() {
            Some(CallbackTokenEvent::TokenConsumed(_)) => {
                let issued = history.iter().find_map(|e| match e {
                    CallbackTokenEvent::TokenIssued(issued) => Some(issued),
                    _ => None,
                });
                let action = issued.and_then(|issued| self.actions.get(&issued.action));
                let (Some(issued), Some(action)) = (issued, action) else {
                    return Ok((vec![click], Route::Nothing));
                };
                let (mut requests, route) = self
                    .route_action(context, action, issued.payload.clone(), None)
                    .await?;
                requests.insert(0, click);
                Ok((requests, route))
            }
            Some(CallbackTokenEvent::TokenRejected(rejected)) => Ok((
                vec![click],
                Route::TokenRefused {
                    reason: serde_json::to_value(rejected.reason)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default(),
                },
            )),
            _ => Ok((vec![click], Route::Nothing)),
        }
    }

    /// Issues a one-time button token for `user_id`: a click on it by that user, before
    /// `expires_at`, starts `action` with `payload` as its parameters, once.
    pub async fn issue_token(
        &self,
        action: &str,
        user_id: i64,
        chat_id: Option<i64>,
        payload: BTreeMap<String, String>,
        expires_at: DateTime<Utc>,
    ) -> Result<String, IntakeError> {
        if !self.actions.contains_key(action) {
            return Err(IntakeError::Refused(format!("no action named `{action}`")));
        }
        let token = callback_token::mint_token(uuid::Uuid::new_v4().as_bytes());
        let issued = TokenIssued {
            token: token.clone(),
            action: action.to_owned(),
            operation_id: None,
            user_id,
            chat_id,
            expires_at,
            payload,
        };
        let now = self.clock.now();
        let events = callback_token::decide(
            &CallbackToken::default(),
            &CallbackTokenCommand::Issue(issued),
            now,
        )
        .map_err(|e| IntakeError::Refused(e.to_string()))?;
        let metadata = EventMetadata::caused_by(Causation::System {
            component: "tokens".to_owned(),
        });
        let stream = StreamId::new(callback_stream(&token)?)?;
        self.store
            .append(vec![request(
                stream,
                ExpectedVersion::NoStream,
                &events,
                &metadata,
            )?])
            .await?;
        Ok(token)
    }
}

impl Route {
    fn usage(action: &ActionConfig) -> Self {
        Route::Usage {
            action: action.name.clone(),
        }
    }
}

/// Binds a command's arguments to an action's parameters in order; the last parameter takes
/// the rest of the arguments. `None` when an argument is missing.
fn bind_params(params: &[String], args: &[String]) -> Option<BTreeMap<String, String>> {
    if args.len() < params.len() {
        return None;
    }
    let mut bound = BTreeMap::new();
    for (i, param) in params.iter().enumerate() {
        let value = if i + 1 == params.len() {
            args[i..].join(" ")
        } else {
            args[i].clone()
        };
        bound.insert(param.clone(), value);
    }
    Some(bound)
}

fn record_command(
    bot: &str,
    update: &Update,
    operation: Option<OperationLink>,
    now: DateTime<Utc>,
    retention: TimeDelta,
    raw_body: Option<String>,
) -> DeliveryCommand {
    DeliveryCommand::RecordUpdate {
        bot: bot.to_owned(),
        update_id: update.update_id,
        kind: update.kind.as_str().into_owned(),
        digest: update.digest.clone(),
        size: update.size as u64,
        chat_id: update.chat_id,
        user_id: update.user_id,
        message_date: update.message_date,
        received_at: now,
        operation,
        retention,
        raw_body,
    }
}

#[cfg(test)]
mod tests {
    use super::bind_params;

    #[test]
    fn arguments_bind_in_order_and_the_last_takes_the_rest() {
        let params = vec!["campaign".to_owned(), "note".to_owned()];
        let args: Vec<String> = ["spring", "hello", "there"].map(String::from).to_vec();
        let bound = bind_params(&params, &args).unwrap();
        assert_eq!(bound["campaign"], "spring");
        assert_eq!(bound["note"], "hello there");
        assert!(bind_params(&params, &args[..1]).is_none());
        assert!(bind_params(&[], &args).unwrap().is_empty());
    }
}
