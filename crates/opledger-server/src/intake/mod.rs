//! Intake: one Telegram update, recorded durably and deduplicated in one atomic multi-stream
//! append before anyone answers Telegram.
//!
//! [`Intake::record`] parses the body once and hands the update to the pure [`decision`]
//! through the ledger's unit of work (ADR 0009). The first attempt assumes that every stream the
//! update touches is new and reads nothing (ADR 0006): a new request costs no read, and a wrong
//! guess fails atomically with a version conflict, after which the unit of work reads what is
//! there and decides again; never a second operation. What comes back ([`Receipt`]) carries what
//! the webhook and the poller need of the parsed update, so nobody parses it again.

pub mod decision;
/// Fuzz target bodies, shared with the corpus replay tests; not an API.
#[doc(hidden)]
pub mod fuzzing;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use opledger_config::Config;
use opledger_domain::callback_token::{self, TokenIssued};
use opledger_ledger::{Clock, Ledger, UnitError};
use opledger_store::AnyStore;
use opledger_telegram::{Quarantine, parse_update};

use decision::{Arrival, Decided, Rules};
pub use decision::{IntakeRejection, Route, Started, Submission};

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

impl Recorded {
    /// The update's id; a quarantined body has none.
    pub fn update_id(&self) -> Option<i64> {
        match self {
            Recorded::Accepted { update_id, .. }
            | Recorded::Duplicate { update_id }
            | Recorded::Collision { update_id } => Some(*update_id),
            Recorded::Quarantined { .. } => None,
        }
    }
}

/// What recording an update did, with what answering Telegram needs of the parsed update and
/// the ledger does not keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    pub recorded: Recorded,
    /// The id of the button click the update carries (`callback_query.id`), when it is one.
    pub callback_query_id: Option<String>,
}

/// Why an update (or a token) could not be recorded; the webhook answers 503 and Telegram
/// delivers again.
#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    #[error("no bot named `{0}` is configured")]
    UnknownBot(String),
    /// The unit of work committed nothing: the domain refused ([`IntakeRejection`]), the streams
    /// kept changing, or the store failed.
    #[error(transparent)]
    Unit(#[from] UnitError<IntakeRejection>),
}

impl IntakeError {
    /// Whether this is the storage's fault or contention (answer 503 so Telegram retries)
    /// rather than a refusal or a bug.
    pub fn is_storage(&self) -> bool {
        matches!(self, IntakeError::Unit(error) if error.is_transient())
    }
}

/// Records updates: the one place that turns a raw Telegram body into ledger events.
#[derive(Debug)]
pub struct Intake {
    ledger: Ledger,
    clock: Arc<dyn Clock>,
    rules: Rules,
}

impl Intake {
    pub fn new(config: &Config, store: AnyStore, clock: Arc<dyn Clock>) -> Self {
        Self {
            ledger: Ledger::new(store),
            clock,
            rules: Rules::new(config),
        }
    }

    /// The store updates are recorded in.
    pub fn store(&self) -> &AnyStore {
        self.ledger.store()
    }

    /// The service's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Records one raw update body for `bot`. `Ok` means it is durably recorded (or was before):
    /// only then may Telegram be answered 2xx.
    pub async fn record(&self, bot: &str, raw: &[u8]) -> Result<Receipt, IntakeError> {
        // Someone waits for this answer: this process's read models wait their turn, and its
        // worker too while a crowd of updates is in flight (`Priority`).
        let _foreground = self.store().priority().foreground();
        if !self.rules.serves(bot) {
            return Err(IntakeError::UnknownBot(bot.to_owned()));
        }
        let now = self.clock.now();
        let update = match parse_update(raw) {
            Ok(update) => update,
            Err(quarantine) => {
                return Ok(Receipt {
                    recorded: self.quarantine(bot, &quarantine, now).await?,
                    callback_query_id: None,
                });
            }
        };
        let arrival = Arrival {
            bot,
            update: &update,
            raw,
            now,
            // Drawn once, before the unit of work: a decision run again after a conflict
            // mints the same confirmation token.
            token_seed: *uuid::Uuid::new_v4().as_bytes(),
        };
        let committed = self
            .ledger
            .unit_of_work()
            .assume_new()
            .run(|snapshot, changes| decision::decide(&self.rules, &arrival, snapshot, changes))
            .await?;
        let update_id = update.update_id;
        let recorded = match committed.value {
            Decided::Accepted { epoch, route } => Recorded::Accepted {
                position: committed.appended.map_or(0, |a| *a.positions.end()),
                update_id,
                epoch,
                kind: update.kind.as_str().into_owned(),
                chat_id: update.chat_id,
                user_id: update.user_id,
                route,
            },
            Decided::Duplicate => Recorded::Duplicate { update_id },
            Decided::Collision => {
                tracing::warn!(
                    bot,
                    update_id,
                    "update id reused with a different body inside the retention window; not processed"
                );
                Recorded::Collision { update_id }
            }
        };
        let callback_query_id = update
            .callback
            .map(|callback| callback.id)
            .filter(|id| !id.is_empty());
        Ok(Receipt {
            recorded,
            callback_query_id,
        })
    }

    /// Starts (or finds) the operation a client of the operations API asks for. `Ok` means it is
    /// durably recorded: the worker carries it out as if a command had asked.
    pub async fn submit(&self, submission: &Submission) -> Result<Started, IntakeError> {
        let _foreground = self.store().priority().foreground();
        if !self.rules.serves(&submission.bot) {
            return Err(IntakeError::UnknownBot(submission.bot.clone()));
        }
        let now = self.clock.now();
        // A new business key names a new stream: the first attempt reads nothing (ADR 0006).
        let committed = self
            .ledger
            .unit_of_work()
            .assume_new()
            .run(|snapshot, changes| {
                decision::submit(&self.rules, submission, now, snapshot, changes)
            })
            .await?;
        Ok(committed.value)
    }

    /// Records a body that is not an update: its digest and size, never the body.
    async fn quarantine(
        &self,
        bot: &str,
        quarantine: &Quarantine,
        now: DateTime<Utc>,
    ) -> Result<Recorded, IntakeError> {
        let committed = self
            .ledger
            .unit_of_work()
            .run(|_, changes| decision::quarantine(bot, quarantine, now, changes))
            .await?;
        let reason = committed.value;
        tracing::warn!(bot, %reason, size = quarantine.size, "quarantined a body that is not an update");
        Ok(Recorded::Quarantined { reason })
    }

    /// Issues a one-time button token for a client of `bot`, after checking that `action` is
    /// one of the bot's and `payload` its parameters (see [`Intake::issue_token`]).
    pub async fn issue_button(
        &self,
        bot: &str,
        action: &str,
        user_id: i64,
        chat_id: Option<i64>,
        payload: BTreeMap<String, String>,
        expires_at: DateTime<Utc>,
    ) -> Result<String, IntakeError> {
        self.rules
            .fitting(bot, action, &payload)
            .map_err(|rejection| IntakeError::Unit(UnitError::Rejected(rejection)))?;
        self.issue_token(action, user_id, chat_id, payload, expires_at)
            .await
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
        // A token just minted names a new stream: nothing to read.
        self.ledger
            .unit_of_work()
            .assume_new()
            .run(|snapshot, changes| decision::issue(&self.rules, &issued, now, snapshot, changes))
            .await?;
        Ok(token)
    }
}
