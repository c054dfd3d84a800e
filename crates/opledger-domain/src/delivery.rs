//! The Delivery aggregate: receipt-level dedup of one Telegram update.
//!
//! A delivery lives in the stream `update-{bot}-{update_id}`. Telegram delivers each update at
//! least once, so the same id arrives again after any non-2xx answer or timeout; the second
//! arrival must be acknowledged and must start nothing. Telegram also restarts ids after a week
//! of silence, so an id seen again after the retention window opens a new epoch.
//!
//! | state | same digest | different digest |
//! |---|---|---|
//! | no stream | `UpdateReceived` (epoch 1) | `UpdateReceived` (epoch 1) |
//! | within retention of the epoch's first receipt | `DuplicateDeliveryObserved` | `UpdateIdCollision` |
//! | after the retention window | `UpdateReceived` (next epoch) | `UpdateReceived` (next epoch) |
//!
//! A first receipt is followed by `RawUpdateStored` only when the operator opted in to keeping
//! raw bodies (they hold message text). When the bot has a gateway, the epoch's forwarding to
//! the bot's own webhook follows on the same stream ([`crate::forward`]).

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregate::Aggregate;
use crate::error::{DeliveryRejection, NameKind};
use crate::event::domain_events;
pub use crate::forward::{
    AnswerCallFailed, AnswerCallSent, AnswerCallStarted, AnswerStart, ForwardCommand,
    ForwardFailed, ForwardGivenUp, ForwardStarted, Forwarding, UpdateForwarded,
};
use crate::ids::{OperationId, validate_name};

domain_events! {
    /// Everything that can happen to one update id of one bot.
    pub enum DeliveryEvent / DeliveryEventKind {
        /// The update was received for the first time in an epoch.
        UpdateReceived,
        /// The same update arrived again; acknowledged, nothing started.
        DuplicateDeliveryObserved,
        /// A different body arrived under an id seen within the retention window; not processed.
        UpdateIdCollision,
        /// The raw body of the update, kept only when the operator opted in.
        RawUpdateStored,
        /// An attempt to forward the update to the bot's webhook started.
        ForwardStarted,
        /// The bot acknowledged the update.
        UpdateForwarded,
        /// An attempt to forward failed; another is due.
        ForwardFailed,
        /// Forwarding was given up.
        ForwardGivenUp,
        /// The bot's answer held a Bot API call, which is being carried out.
        AnswerCallStarted,
        /// That call succeeded.
        AnswerCallSent,
        /// That call failed, or its outcome is unknown.
        AnswerCallFailed,
    }
}

/// The operation an update started or joined, written in the same atomic append.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationLink {
    /// The action's name.
    pub action: String,
    /// The operation's id.
    pub operation_id: OperationId,
    /// The operation's stream id.
    pub stream: String,
    /// Whether the operation existed already (the update joined it, nothing new started).
    pub joined: bool,
}

/// An update was received and acknowledged; the first event of each epoch.
///
/// It keeps the fields an action needs and a digest of the raw body, never the body itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateReceived {
    /// The bot's configured name.
    pub bot: String,
    /// Telegram's `update_id`.
    pub update_id: i64,
    /// 1 for the first receipt; one more each time the id is reused after the retention window.
    pub epoch: u32,
    /// The update's kind: `message`, `callback_query`, ..., or `other:<key>` for unknown ones.
    pub kind: String,
    /// Hex SHA-256 of the raw body.
    pub digest: String,
    /// The raw body's size in bytes.
    pub size: u64,
    /// The chat it came from, when there is one.
    pub chat_id: Option<i64>,
    /// The user who sent it, when known.
    pub user_id: Option<i64>,
    /// The message's own `date`, when it had a message.
    pub message_date: Option<DateTime<Utc>>,
    /// When the receiving server got it, by that server's clock.
    pub received_at: DateTime<Utc>,
    /// The operation it started or joined, if it asked for an action.
    pub operation: Option<OperationLink>,
    /// Whether it is to be forwarded to the bot's own webhook (the gateway); absent when not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forward: bool,
}

/// The same update arrived again within the retention window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DuplicateDeliveryObserved {
    /// The epoch it duplicates.
    pub epoch: u32,
    /// Hex SHA-256 of the repeated body (equal to the first).
    pub digest: String,
    /// When the receiving server got the repeat.
    pub received_at: DateTime<Utc>,
}

/// A different body arrived under an update id seen within the retention window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateIdCollision {
    /// The epoch it collides with.
    pub epoch: u32,
    /// The digest received first.
    pub first_digest: String,
    /// The digest of the new body.
    pub new_digest: String,
    /// When the receiving server got it.
    pub received_at: DateTime<Utc>,
}

/// The raw body of an update, kept in the ledger only when the operator opted in
/// (`store_raw_updates = true`): it holds message text, which the ledger otherwise never stores.
/// Appended right after the epoch's `UpdateReceived`, in the same append.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RawUpdateStored {
    /// The epoch whose body this is.
    pub epoch: u32,
    /// The body as received (UTF-8; Telegram sends JSON).
    pub body: String,
}

/// The name of the attachment (bytes beside the history, ADR 0012) that holds the raw body of
/// `epoch` for the gateway until the bot acknowledged it or it was given up.
pub fn raw_attachment(epoch: u32) -> String {
    format!("raw:{epoch}")
}

/// What intake asks of a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryCommand {
    /// An update arrived; the fields of [`UpdateReceived`] without the epoch, which is decided.
    RecordUpdate {
        /// The bot's configured name.
        bot: String,
        /// Telegram's `update_id`.
        update_id: i64,
        /// The update's kind.
        kind: String,
        /// Hex SHA-256 of the raw body.
        digest: String,
        /// The raw body's size in bytes.
        size: u64,
        /// The chat it came from.
        chat_id: Option<i64>,
        /// The user who sent it.
        user_id: Option<i64>,
        /// The message's own `date`.
        message_date: Option<DateTime<Utc>>,
        /// When the receiving server got it.
        received_at: DateTime<Utc>,
        /// The operation it started or joined.
        operation: Option<OperationLink>,
        /// How long an id counts as the same update after its epoch's first receipt.
        retention: TimeDelta,
        /// The raw body, when the operator opted in to keeping it: a first receipt then also
        /// appends [`RawUpdateStored`].
        raw_body: Option<String>,
        /// Whether the update is to be forwarded to the bot's webhook.
        forward: bool,
    },
    /// A step of forwarding the current epoch's update ([`crate::forward`]).
    Forward(ForwardCommand),
}

/// One update id's state: what dedup needs to judge the next arrival.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delivery {
    /// The current epoch; 0 before any event.
    pub epoch: u32,
    /// The digest of the current epoch's first receipt.
    pub digest: String,
    /// When the current epoch's first receipt arrived.
    pub first_received_at: Option<DateTime<Utc>>,
    /// Duplicates observed, across all epochs.
    pub duplicates: u32,
    /// Collisions observed, across all epochs.
    pub collisions: u32,
    /// The current epoch's forwarding to the bot's webhook.
    pub forwarding: Forwarding,
    /// How many events were applied: the expected version of the next append.
    pub version: u64,
}

impl Delivery {
    /// Rebuilds a delivery from its stream's events.
    pub fn replay<'a>(events: impl IntoIterator<Item = &'a DeliveryEvent>) -> Self {
        events.into_iter().fold(Self::default(), evolve)
    }

    /// Whether an arrival at `now` repeats the current epoch's update (a duplicate or a
    /// collision): it is within `retention` of the epoch's first receipt. An arrival that does
    /// not repeat opens an epoch.
    pub fn repeats(&self, now: DateTime<Utc>, retention: TimeDelta) -> bool {
        self.first_received_at
            .is_some_and(|first| now - first < retention)
    }
}

/// Decides what an arrival appends at `now`: a first receipt, a duplicate, a collision or a new
/// epoch. The window is measured from the epoch's first receipt.
pub fn decide(
    state: &Delivery,
    command: &DeliveryCommand,
    now: DateTime<Utc>,
) -> Result<Vec<DeliveryEvent>, DeliveryRejection> {
    let DeliveryCommand::RecordUpdate {
        forward,
        bot,
        update_id,
        kind,
        digest,
        size,
        chat_id,
        user_id,
        message_date,
        received_at,
        operation,
        retention,
        raw_body,
    } = command
    else {
        let DeliveryCommand::Forward(command) = command else {
            unreachable!("the other command is matched above")
        };
        if state.epoch == 0 {
            return Err(DeliveryRejection::Forward(
                crate::error::ForwardRejection::NotForwarded,
            ));
        }
        return crate::forward::decide(&state.forwarding, state.epoch, command, now)
            .map_err(DeliveryRejection::Forward);
    };
    if validate_name(NameKind::Bot, bot).is_err() {
        return Err(invalid(
            "bot must be 1 to 64 characters from a-z, 0-9 and _",
        ));
    }
    if kind.is_empty() {
        return Err(invalid("kind must not be empty"));
    }
    if digest.is_empty() {
        return Err(invalid("digest must not be empty"));
    }
    if *retention <= TimeDelta::zero() {
        return Err(invalid("retention must be positive"));
    }

    if state.repeats(now, *retention) {
        let event = if *digest == state.digest {
            DuplicateDeliveryObserved {
                epoch: state.epoch,
                digest: digest.clone(),
                received_at: *received_at,
            }
            .into()
        } else {
            UpdateIdCollision {
                epoch: state.epoch,
                first_digest: state.digest.clone(),
                new_digest: digest.clone(),
                received_at: *received_at,
            }
            .into()
        };
        return Ok(vec![event]);
    }
    // The epoch is 0 before the first receipt.
    let epoch = state.epoch.saturating_add(1);
    let mut events = vec![
        UpdateReceived {
            bot: bot.clone(),
            update_id: *update_id,
            epoch,
            kind: kind.clone(),
            digest: digest.clone(),
            size: *size,
            chat_id: *chat_id,
            user_id: *user_id,
            message_date: *message_date,
            received_at: *received_at,
            operation: operation.clone(),
            forward: *forward,
        }
        .into(),
    ];
    if let Some(body) = raw_body {
        events.push(
            RawUpdateStored {
                epoch,
                body: body.clone(),
            }
            .into(),
        );
    }
    Ok(events)
}

/// Applies one event to the state.
pub fn evolve(mut state: Delivery, event: &DeliveryEvent) -> Delivery {
    state.version += 1;
    match event {
        DeliveryEvent::UpdateReceived(e) => {
            state.epoch = e.epoch;
            state.digest.clone_from(&e.digest);
            state.first_received_at = Some(e.received_at);
            state.forwarding = Forwarding {
                wanted: e.forward,
                received_at: Some(e.received_at),
                ..Forwarding::default()
            };
        }
        DeliveryEvent::DuplicateDeliveryObserved(_) => {
            state.duplicates = state.duplicates.saturating_add(1);
        }
        DeliveryEvent::UpdateIdCollision(_) => {
            state.collisions = state.collisions.saturating_add(1);
        }
        DeliveryEvent::RawUpdateStored(_) => {}
        forwarding => crate::forward::evolve(&mut state.forwarding, forwarding),
    }
    state
}

fn invalid(reason: &'static str) -> DeliveryRejection {
    DeliveryRejection::InvalidCommand { reason }
}

impl Aggregate for Delivery {
    const STREAM_CATEGORY: &'static str = "update";

    type Event = DeliveryEvent;
    type Command = DeliveryCommand;
    type Rejection = DeliveryRejection;

    fn decide(
        &self,
        command: &DeliveryCommand,
        now: DateTime<Utc>,
    ) -> Result<Vec<DeliveryEvent>, DeliveryRejection> {
        decide(self, command, now)
    }

    fn evolve(self, event: &DeliveryEvent) -> Self {
        evolve(self, event)
    }

    fn version(&self) -> u64 {
        self.version
    }
}
