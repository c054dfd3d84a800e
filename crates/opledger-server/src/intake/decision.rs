//! The intake decision: what one parsed update appends and where it goes, a pure function of
//! the states of the streams it touches (ADR 0009).
//!
//! The update's delivery stream (`update-{bot}-{update_id}`) is judged first. A repeat within
//! the retention window (the same body, or another body under the same id) is only noted, at any
//! version, and routed nowhere. Anything else is routed: an action command starts its operation
//! (`Received`) or joins it, a repeat of the same key with other parameters records a
//! `KeyConflictRecorded`, an action with a repeat window records `CommandSeen` on its guard and
//! gives its operation the guard's epoch, and a button click consumes its token and starts the
//! token's action. An action that asks for confirmation (`confirm`) starts nothing on its
//! command: the command issues a one-time token instead, whose *Confirm* button is the token
//! (a click starts the action, once) and whose *Cancel* button cancels it. Then the delivery is
//! decided, once, with the operation the route started or joined, and staged first:
//! `UpdateReceived` comes before everything it led to.
//!
//! Public so that a caller which batches its own appends (the rebuild benchmark's generator)
//! records updates with the very decision [`super::Intake::record`] runs: [`Rules`] from the
//! configuration, an [`Arrival`], a [`Snapshot`] of the streams' states and [`Changes`] in;
//! [`decide`] stages the appends and answers what the update [`Decided`]. [`quarantine`] is the
//! same for a body that is not an update. No I/O here.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use chrono::{DateTime, TimeDelta, Utc};
use opledger_config::{ActionConfig, Config, ConfirmConfig, ForwardUpdates};
use opledger_domain::callback_token::{
    self, CallbackToken, CallbackTokenCommand, CallbackTokenEvent, Click, TOKEN_RANDOM_BYTES,
    TokenIssued, TokenRejection, mint_token,
};
use opledger_domain::delivery::{self, Delivery, DeliveryCommand, DeliveryEvent, raw_attachment};
use opledger_domain::operation::{self, OperationCommand, OperationEvent, Received};
use opledger_domain::quarantine::{BodyQuarantined, QuarantineEvent, quarantine_stream};
use opledger_domain::repeat_guard::{self, RepeatGuard, RepeatGuardCommand, RepeatGuardEvent};
use opledger_domain::{
    Causation, DeliveryRejection, DomainEvent, EventMetadata, IdError, IssueRejection, Operation,
    OperationId, OperationLink, Rejection, RepeatGuardRejection, callback_stream, delivery_stream,
    fingerprint, operation_stream, repeat_guard_stream,
};
use opledger_ledger::{Changes, Snapshot, StreamState, Undecided};
use opledger_store::{ExpectedVersion, InvalidRequest, StreamId, StreamVersion};
use opledger_telegram::{CallbackQuery, Command, Quarantine, Update};

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
    /// `/help` (or `/start`): answered from configuration.
    Help,
    /// `/status` (with an optional operation id): answered from read models.
    Status { operation_id: Option<String> },
    /// A button click that was refused (already used, cancelled, another user, expired,
    /// unknown).
    TokenRefused { reason: String },
    /// A command of an action that asks first: a one-time token was issued for the user's
    /// *Confirm* (the token) and *Cancel* buttons, to be sent with `question`.
    Confirm {
        action: String,
        token: String,
        question: String,
    },
    /// A confirmation's *Cancel*: its token is cancelled, nothing was started.
    Cancelled,
}

impl Route {
    /// The operation the update started or joined, which its delivery records.
    fn link(&self) -> Option<OperationLink> {
        match self {
            Route::Started(link) | Route::Joined(link) => Some(link.clone()),
            _ => None,
        }
    }

    fn usage(action: &ActionConfig) -> Self {
        Route::Usage {
            action: action.name.clone(),
        }
    }
}

/// Why the domain refused an update or a token; nothing was recorded. None of these is cured
/// by retrying: each says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IntakeRejection {
    /// The delivery refused the update's record (a malformed update or configuration).
    #[error("by the update's delivery: {0}")]
    Delivery(#[from] DeliveryRejection),
    /// The operation refused the request.
    #[error("by the operation: {0}")]
    Operation(#[from] Rejection),
    /// The repeat guard refused the command.
    #[error("by the repeat guard: {0}")]
    RepeatGuard(#[from] RepeatGuardRejection),
    /// The token refused to be issued.
    #[error("by the token: {0}")]
    Token(#[from] IssueRejection),
    /// An operation was asked of an action the bot does not have.
    #[error("bot `{bot}` has no action named `{action}`: use one of the actions configured for it")]
    NoSuchAction { bot: String, action: String },
    /// An operation's parameters do not fit its action.
    #[error("the parameters do not fit action `{action}`: {problem}")]
    Parameters { action: String, problem: String },
    /// A token was asked for an action the configuration does not have.
    #[error("no action named `{0}` is configured: issue tokens for one of the configured actions")]
    UnknownAction(String),
    /// A stream id could not be built from the configuration and the update.
    #[error(transparent)]
    Id(#[from] IdError),
    /// A stream id the store would refuse (too long, a control character).
    #[error("invalid stream id: {0}")]
    StreamId(#[from] InvalidRequest),
    /// The domain decided something intake has no route for.
    #[error(
        "the domain decided {decided} where intake expects {expected}: this is a bug, please report it"
    )]
    Unexpected {
        expected: &'static str,
        decided: &'static str,
    },
}

/// The decision's refusal, in the unit of work's terms.
fn rejected(rejection: impl Into<IntakeRejection>) -> Undecided<IntakeRejection> {
    Undecided::Rejected(rejection.into())
}

fn unexpected(
    expected: &'static str,
    decided: Option<&impl DomainEvent>,
) -> Undecided<IntakeRejection> {
    rejected(IntakeRejection::Unexpected {
        expected,
        decided: decided.map_or("nothing", DomainEvent::event_type),
    })
}

fn stream_id(id: Result<String, IdError>) -> Result<StreamId, Undecided<IntakeRejection>> {
    StreamId::new(id.map_err(rejected)?).map_err(rejected)
}

/// What intake decides with besides the update: the configuration's routes and policies.
#[derive(Debug)]
pub struct Rules {
    /// Each bot's actions by command.
    commands: HashMap<String, HashMap<String, Arc<ActionConfig>>>,
    /// Every action by name: a button's token names the action its click starts.
    actions: HashMap<String, Arc<ActionConfig>>,
    /// How long an update id counts as the same update after its epoch's first receipt.
    retention: TimeDelta,
    /// Whether a first receipt keeps the raw body (`store_raw_updates`).
    store_raw_updates: bool,
    /// The bots with a gateway to their own webhook, and which updates it forwards.
    gateways: HashMap<String, ForwardUpdates>,
}

impl Rules {
    /// The routes and policies of `config`.
    pub fn new(config: &Config) -> Self {
        let actions: HashMap<String, Arc<ActionConfig>> = config
            .actions
            .iter()
            .map(|a| (a.name.clone(), Arc::new(a.clone())))
            .collect();
        let commands = config
            .bots
            .iter()
            .map(|bot| {
                let commands = actions
                    .values()
                    .filter(|a| a.bot == bot.name)
                    .filter_map(|a| Some((a.command.clone()?, a.clone())))
                    .collect();
                (bot.name.clone(), commands)
            })
            .collect();
        Rules {
            commands,
            actions,
            retention: TimeDelta::from_std(config.server.dedup_retention).unwrap_or(TimeDelta::MAX),
            store_raw_updates: config.server.store_raw_updates,
            gateways: config
                .bots
                .iter()
                .filter_map(|bot| Some((bot.name.clone(), bot.forward.as_ref()?.updates)))
                .collect(),
        }
    }

    /// Whether an update of `bot` that went `route` is forwarded to the bot's own webhook.
    fn forwards(&self, bot: &str, route: &Route) -> bool {
        match self.gateways.get(bot) {
            None => false,
            Some(ForwardUpdates::All) => true,
            Some(ForwardUpdates::Unhandled) => *route == Route::Nothing,
        }
    }

    /// Whether `bot` has a gateway: then `/start` and `/help` are the bot's own to answer.
    fn has_gateway(&self, bot: &str) -> bool {
        self.gateways.contains_key(bot)
    }

    /// Whether `bot` is configured.
    pub fn serves(&self, bot: &str) -> bool {
        self.commands.contains_key(bot)
    }

    pub(super) fn action_for(&self, bot: &str, command: &str) -> Option<&ActionConfig> {
        self.commands.get(bot)?.get(command).map(AsRef::as_ref)
    }

    /// `bot`'s action named `action`, if `params` are its parameters, each of them (not empty)
    /// and no other: what a client may ask for.
    pub(super) fn fitting(
        &self,
        bot: &str,
        action: &str,
        params: &BTreeMap<String, String>,
    ) -> Result<&ActionConfig, IntakeRejection> {
        let Some(action) = self.actions.get(action).filter(|a| a.bot == bot) else {
            return Err(IntakeRejection::NoSuchAction {
                bot: bot.to_owned(),
                action: action.to_owned(),
            });
        };
        let problem = |problem: String| IntakeRejection::Parameters {
            action: action.name.clone(),
            problem,
        };
        let declared = |name: &String| action.params.contains(name);
        if let Some(extra) = params.keys().find(|name| !declared(name)) {
            return Err(problem(format!(
                "`{extra}` is not one of its parameters ({})",
                action.params.join(", ")
            )));
        }
        if let Some(missing) = action
            .params
            .iter()
            .find(|name| params.get(*name).is_none_or(String::is_empty))
        {
            return Err(problem(format!("`{missing}` is missing or empty")));
        }
        Ok(action)
    }
}

/// One parsed update, arriving for `bot` at `now`.
#[derive(Debug, Clone, Copy)]
pub struct Arrival<'a> {
    pub bot: &'a str,
    pub update: &'a Update,
    /// The body as received; the ledger keeps it only when the operator opted in.
    pub raw: &'a [u8],
    pub now: DateTime<Utc>,
    /// Random bytes the shell drew for this update: the token of a confirmation it asks for is
    /// minted from them (the decision has no random source of its own).
    pub token_seed: [u8; TOKEN_RANDOM_BYTES],
}

impl Arrival<'_> {
    /// The delivery's command, with the operation the update led to.
    fn record(
        &self,
        rules: &Rules,
        operation: Option<OperationLink>,
        raw_body: Option<String>,
        forward: bool,
    ) -> DeliveryCommand {
        let update = self.update;
        DeliveryCommand::RecordUpdate {
            bot: self.bot.to_owned(),
            update_id: update.update_id,
            kind: update.kind.as_str().into_owned(),
            digest: update.digest.clone(),
            size: update.size as u64,
            chat_id: update.chat_id,
            user_id: update.user_id,
            message_date: update.message_date,
            received_at: self.now,
            operation,
            retention: rules.retention,
            raw_body,
            forward,
        }
    }
}

/// What an update decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decided {
    /// A new update (or its id reused after the retention window: a new epoch), and its route.
    Accepted { epoch: u32, route: Route },
    /// The same update again within the retention window: noted.
    Duplicate,
    /// Another body under an id seen within the retention window: noted, not processed.
    Collision,
}

/// Decides what `arrival` appends, staging it in `changes`.
pub fn decide(
    rules: &Rules,
    arrival: &Arrival<'_>,
    snapshot: &Snapshot,
    changes: &mut Changes,
) -> Result<Decided, Undecided<IntakeRejection>> {
    let Arrival {
        bot, update, now, ..
    } = *arrival;
    let stream = stream_id(delivery_stream(bot, update.update_id))?;
    let metadata = EventMetadata::caused_by(Causation::Update {
        bot: bot.to_owned(),
        update_id: update.update_id,
    })
    .correlated_with(stream.as_str());
    let delivery: Delivery = snapshot.state(&stream)?;

    if delivery.repeats(now, rules.retention) {
        let events = delivery::decide(&delivery, &arrival.record(rules, None, None, false), now)
            .map_err(rejected)?;
        let decided = match events.first() {
            Some(DeliveryEvent::DuplicateDeliveryObserved(_)) => Decided::Duplicate,
            Some(DeliveryEvent::UpdateIdCollision(_)) => Decided::Collision,
            other => return Err(unexpected("a duplicate or a collision", other)),
        };
        // A note that depends on nothing but the epoch: repeats never race each other.
        changes.note(&stream, &events, &metadata);
        return Ok(decided);
    }

    let router = Router {
        rules,
        arrival,
        metadata: &metadata,
        snapshot,
    };
    let mut routed = Changes::default();
    let route = router.route(&mut routed)?;
    let raw_body = rules
        .store_raw_updates
        .then(|| String::from_utf8_lossy(arrival.raw).into_owned());
    let forward = rules.forwards(bot, &route);
    let events = delivery::decide(
        &delivery,
        &arrival.record(rules, route.link(), raw_body, forward),
        now,
    )
    .map_err(rejected)?;
    let Some(DeliveryEvent::UpdateReceived(received)) = events.first() else {
        return Err(unexpected("a first receipt", events.first()));
    };
    let epoch = received.epoch;
    changes.decided(&stream, &delivery, &events, &metadata);
    if forward {
        // The exact bytes the bot is owed, beside the history until it acknowledges them.
        changes.attach(&stream, raw_attachment(epoch), arrival.raw.to_vec());
    }
    changes.extend(routed);
    Ok(Decided::Accepted { epoch, route })
}

/// Routes one update: where it goes, and what it stages besides its delivery.
struct Router<'a> {
    rules: &'a Rules,
    arrival: &'a Arrival<'a>,
    metadata: &'a EventMetadata,
    snapshot: &'a Snapshot,
}

impl Router<'_> {
    fn route(&self, changes: &mut Changes) -> Result<Route, Undecided<IntakeRejection>> {
        let update = self.arrival.update;
        if let Some(command) = &update.text_command {
            match command.name.as_str() {
                "help" | "start" if !self.rules.has_gateway(self.arrival.bot) => {
                    return Ok(Route::Help);
                }
                "status" => {
                    return Ok(Route::Status {
                        operation_id: command.args.first().cloned(),
                    });
                }
                name => {
                    if let Some(action) = self.rules.action_for(self.arrival.bot, name) {
                        let Some(params) = bind_params(&action.params, &command.args) else {
                            return Ok(Route::usage(action));
                        };
                        return self.action(action, params, Some(command), changes);
                    }
                }
            }
        }
        if let Some(callback) = &update.callback {
            return self.click(callback, changes);
        }
        Ok(Route::Nothing)
    }

    /// Starts or joins the operation an action's parameters name. `command` is the command
    /// that asked (a click has none, and no repeat guard).
    fn action(
        &self,
        action: &ActionConfig,
        params: BTreeMap<String, String>,
        command: Option<&Command>,
        changes: &mut Changes,
    ) -> Result<Route, Undecided<IntakeRejection>> {
        let Arrival {
            bot, update, now, ..
        } = *self.arrival;
        let origin = Origin {
            bot,
            update_id: update.update_id,
            chat_id: update.chat_id,
            user_id: update.user_id,
            message_date: update.message_date,
            now,
        };
        let Ok(mut key) = origin.key(action, &params) else {
            return Ok(Route::usage(action));
        };
        if let (Some(confirm), Some(_)) = (&action.confirm, command) {
            return self.ask(action, confirm, key, params, changes);
        }
        if let (Some(window), Some(command)) = (action.repeat_window, command) {
            let stream = stream_id(repeat_guard_stream(
                bot,
                update.chat_id,
                update.user_id,
                &command.normalized(),
            ))?;
            let guard: RepeatGuard = self.snapshot.state(&stream)?;
            let see = RepeatGuardCommand::See {
                update_id: update.update_id,
                // Windows are measured with the message's own date; a message always has one,
                // the receipt time is only a fallback for odd updates.
                message_date: update.message_date.unwrap_or(now),
                window: TimeDelta::from_std(window).unwrap_or(TimeDelta::MAX),
            };
            let seen = repeat_guard::decide(&guard, &see, now).map_err(rejected)?;
            let Some(RepeatGuardEvent::CommandSeen(first)) = seen.first() else {
                return Err(unexpected("CommandSeen", seen.first()));
            };
            key = format!("{key}#{}", first.epoch);
            changes.decided(&stream, &guard, &seen, self.metadata);
        }
        let started = origin.start(action, key, params, self.snapshot, self.metadata, changes)?;
        Ok(match started {
            Started::New(link) => Route::Started(link),
            Started::Joined(link) => Route::Joined(link),
            Started::KeyConflict { operation_id, .. } => Route::KeyConflict { operation_id },
        })
    }

    /// Asks the user to confirm the operation `key` names: issues a one-time token for them,
    /// whose click starts the action with `params` (as a button's would), and the question to
    /// send with it. Nothing is started: a command without a user to ask goes nowhere.
    fn ask(
        &self,
        action: &ActionConfig,
        confirm: &ConfirmConfig,
        key: String,
        params: BTreeMap<String, String>,
        changes: &mut Changes,
    ) -> Result<Route, Undecided<IntakeRejection>> {
        let Arrival {
            update,
            now,
            token_seed,
            ..
        } = *self.arrival;
        let Some(user_id) = update.user_id else {
            return Ok(Route::Nothing);
        };
        let operation_id = OperationId::new(&action.name, &key);
        let value = |name: &str| match name {
            "operation_id" => Some(operation_id.to_string()),
            "action" => Some(action.name.clone()),
            param => params.get(param).cloned(),
        };
        let Ok(question) = confirm.question.render(&value) else {
            return Ok(Route::usage(action));
        };
        let token = mint_token(&token_seed);
        let issued = TokenIssued {
            token: token.clone(),
            action: action.name.clone(),
            operation_id: Some(operation_id),
            user_id,
            chat_id: update.chat_id,
            expires_at: now + TimeDelta::from_std(confirm.expiry).unwrap_or(TimeDelta::weeks(1)),
            payload: params,
        };
        let stream = stream_id(callback_stream(&token))?;
        let state: CallbackToken = self.snapshot.state(&stream)?;
        let events = callback_token::decide(&state, &CallbackTokenCommand::Issue(issued), now)
            .map_err(rejected)?;
        changes.decided(&stream, &state, &events, self.metadata);
        Ok(Route::Confirm {
            action: action.name.clone(),
            token,
            question,
        })
    }

    /// Consumes a button's token (or cancels it, for a confirmation's *Cancel*); an accepted
    /// click starts the token's action.
    fn click(
        &self,
        callback: &CallbackQuery,
        changes: &mut Changes,
    ) -> Result<Route, Undecided<IntakeRejection>> {
        let Arrival { update, now, .. } = *self.arrival;
        let Some(data) = callback.data.as_deref() else {
            return Ok(Route::Nothing);
        };
        // Only our own tokens (minted with the token prefix) name a stream; any other callback
        // data belongs to the bot's own buttons and is not ours to judge.
        let Some(click) = Click::read(data) else {
            return Ok(Route::Nothing);
        };
        let Ok(stream) = callback_stream(click.token()) else {
            return Ok(Route::Nothing);
        };
        let stream = StreamId::new(stream).map_err(rejected)?;
        let Some(user_id) = update.user_id else {
            return Ok(Route::Nothing);
        };
        // A token is issued before anyone clicks it: assuming its stream new would be wrong.
        let token: IssuedToken = self.snapshot.read(&stream)?;
        let command = click.command(user_id, update.update_id);
        let events = callback_token::decide(&token.state, &command, now).map_err(rejected)?;
        match events.first() {
            Some(CallbackTokenEvent::TokenCancelled(_)) => {
                changes.decided(&stream, &token, &events, self.metadata);
                Ok(Route::Cancelled)
            }
            Some(CallbackTokenEvent::TokenConsumed(_)) => {
                changes.decided(&stream, &token, &events, self.metadata);
                let Some(issued) = &token.issued else {
                    return Ok(Route::Nothing);
                };
                let Some(action) = self.rules.actions.get(&issued.action) else {
                    return Ok(Route::Nothing);
                };
                self.action(action, issued.payload.clone(), None, changes)
            }
            Some(CallbackTokenEvent::TokenRejected(rejected)) => {
                // A refusal no later event can undo (the token is used up or cancelled, is
                // another user's, or has expired) is a note, like a duplicate delivery, so that
                // clicks refused at once do not race each other into 503s. A token not issued
                // (yet) depends on the version read.
                let expected = match rejected.reason {
                    TokenRejection::NotIssued => token.expected(),
                    _ => ExpectedVersion::Any,
                };
                changes.append(&stream, expected, &events, self.metadata);
                Ok(Route::TokenRefused {
                    reason: reason_name(rejected.reason),
                })
            }
            other => Err(unexpected(
                "a consumed, a cancelled or a refused click",
                other,
            )),
        }
    }
}

/// Where a request for an operation came from: what its `Received` records.
#[derive(Debug, Clone, Copy)]
struct Origin<'a> {
    bot: &'a str,
    update_id: i64,
    chat_id: Option<i64>,
    user_id: Option<i64>,
    message_date: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
}

/// What asking for an operation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Started {
    /// A new business key: the operation was received.
    New(OperationLink),
    /// The same key with the same parameters: the operation that exists.
    Joined(OperationLink),
    /// The same key with other parameters: recorded as a conflict, nothing started.
    KeyConflict {
        operation_id: OperationId,
        /// The refused request's fingerprint.
        fingerprint: String,
        /// The fingerprint the operation was received with.
        existing_fingerprint: String,
    },
}

impl Origin<'_> {
    /// The business key the action's template makes of the parameters and the origin.
    fn key(
        &self,
        action: &ActionConfig,
        params: &BTreeMap<String, String>,
    ) -> Result<String, opledger_config::RenderError> {
        let lookup = |name: &str| -> Option<String> {
            match name {
                "user_id" => self.user_id.map(|v| v.to_string()),
                "chat_id" => self.chat_id.map(|v| v.to_string()),
                "bot" => Some(self.bot.to_owned()),
                "action" => Some(action.name.clone()),
                param => params.get(param).cloned(),
            }
        };
        action.key.render(&lookup)
    }

    /// Stages the operation `key` names: received when new, joined or a conflict when it
    /// exists.
    fn start(
        &self,
        action: &ActionConfig,
        key: String,
        params: BTreeMap<String, String>,
        snapshot: &Snapshot,
        metadata: &EventMetadata,
        changes: &mut Changes,
    ) -> Result<Started, Undecided<IntakeRejection>> {
        let stream = stream_id(operation_stream(&action.name, &key))?;
        let operation_id = OperationId::new(&action.name, &key);
        let state: Operation = snapshot.state(&stream)?;
        let received = Received {
            operation_id,
            action: action.name.clone(),
            business_key: key,
            fingerprint: fingerprint(&action.name, &params),
            params,
            bot: self.bot.to_owned(),
            chat_id: self.chat_id,
            user_id: self.user_id,
            update_id: self.update_id,
            message_date: self.message_date,
            max_attempts: action.effector.as_ref().map_or(1, |e| e.max_attempts),
        };
        let events = operation::decide(&state, &OperationCommand::Receive(received), self.now)
            .map_err(rejected)?;
        let link = |joined| OperationLink {
            action: action.name.clone(),
            operation_id,
            stream: stream.to_string(),
            joined,
        };
        let started = match events.first() {
            None => Started::Joined(link(true)),
            Some(OperationEvent::Received(_)) => Started::New(link(false)),
            Some(OperationEvent::KeyConflictRecorded(conflict)) => Started::KeyConflict {
                operation_id,
                fingerprint: conflict.fingerprint.clone(),
                existing_fingerprint: conflict.existing_fingerprint.clone(),
            },
            other => return Err(unexpected("a receipt or a key conflict", other)),
        };
        changes.decided(&stream, &state, &events, metadata);
        Ok(started)
    }
}

/// An operation asked for through the operations API, by one of its clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    /// The client's configured name, recorded as the cause.
    pub client: String,
    /// The bot the operation is for (the client's).
    pub bot: String,
    /// The action's configured name.
    pub action: String,
    /// The action's parameters, each of them and no other.
    pub params: BTreeMap<String, String>,
    /// The chat to reply to, when there is one.
    pub chat_id: Option<i64>,
    /// The user who asked, when known.
    pub user_id: Option<i64>,
    /// The update that caused it.
    pub update_id: i64,
}

/// Decides what a submission appends: its operation, started, joined or in conflict.
pub(super) fn submit(
    rules: &Rules,
    submission: &Submission,
    now: DateTime<Utc>,
    snapshot: &Snapshot,
    changes: &mut Changes,
) -> Result<Started, Undecided<IntakeRejection>> {
    let bot = submission.bot.as_str();
    let action = rules
        .fitting(bot, &submission.action, &submission.params)
        .map_err(rejected)?;
    let problem = |problem: String| {
        rejected(IntakeRejection::Parameters {
            action: action.name.clone(),
            problem,
        })
    };
    let origin = Origin {
        bot,
        update_id: submission.update_id,
        chat_id: submission.chat_id,
        user_id: submission.user_id,
        message_date: None,
        now,
    };
    let key = origin
        .key(action, &submission.params)
        .map_err(|error| problem(format!("its business key cannot be made: {error}")))?;
    let metadata = EventMetadata::caused_by(Causation::Client {
        client: submission.client.clone(),
    })
    .correlated_with(stream_id(delivery_stream(bot, submission.update_id))?.as_str());
    origin.start(
        action,
        key,
        submission.params.clone(),
        snapshot,
        &metadata,
        changes,
    )
}

/// A refusal's name as the ledger writes it (`already_consumed`, ...).
fn reason_name(reason: TokenRejection) -> String {
    serde_json::to_value(reason)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// A button's token as a click's decision needs it: the aggregate's state, and the issue whose
/// action and payload an accepted click starts (the aggregate does not keep them).
#[derive(Debug, Clone, Default)]
pub(super) struct IssuedToken {
    state: CallbackToken,
    issued: Option<TokenIssued>,
}

impl StreamState for IssuedToken {
    type Event = CallbackTokenEvent;

    fn apply(mut self, event: &CallbackTokenEvent) -> Self {
        if let (None, CallbackTokenEvent::TokenIssued(issued)) = (&self.issued, event) {
            self.issued = Some(issued.clone());
        }
        self.state = callback_token::evolve(self.state, event);
        self
    }

    fn version(&self) -> StreamVersion {
        self.state.version
    }
}

/// Stages what the ledger keeps of a body that is not an update (its digest and size, never
/// the body), as a note on the bot's quarantine stream; returns the reason.
pub fn quarantine(
    bot: &str,
    quarantine: &Quarantine,
    now: DateTime<Utc>,
    changes: &mut Changes,
) -> Result<String, Undecided<IntakeRejection>> {
    let stream = stream_id(quarantine_stream(bot))?;
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
    changes.note(&stream, &[event], &metadata);
    Ok(reason)
}

/// Issues a one-time button token for one of the configured actions, on its new stream.
pub(super) fn issue(
    rules: &Rules,
    issued: &TokenIssued,
    now: DateTime<Utc>,
    snapshot: &Snapshot,
    changes: &mut Changes,
) -> Result<(), Undecided<IntakeRejection>> {
    if !rules.actions.contains_key(&issued.action) {
        return Err(rejected(IntakeRejection::UnknownAction(
            issued.action.clone(),
        )));
    }
    let stream = stream_id(callback_stream(&issued.token))?;
    let token: CallbackToken = snapshot.state(&stream)?;
    let events = callback_token::decide(&token, &CallbackTokenCommand::Issue(issued.clone()), now)
        .map_err(rejected)?;
    let metadata = EventMetadata::caused_by(Causation::System {
        component: "tokens".to_owned(),
    });
    changes.decided(&stream, &token, &events, &metadata);
    Ok(())
}

/// Binds a command's arguments to an action's parameters in order; the last parameter takes
/// the rest of the arguments. `None` when an argument is missing.
pub(super) fn bind_params(params: &[String], args: &[String]) -> Option<BTreeMap<String, String>> {
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
