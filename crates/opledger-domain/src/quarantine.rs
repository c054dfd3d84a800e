//! Quarantine: what the ledger keeps of an authenticated webhook body it cannot read.
//!
//! Telegram's secret proved the body came from Telegram, so it must be acknowledged (a non-2xx
//! answer would block the chat's later updates), but it is not JSON or has no integer
//! `update_id`. The ledger records that it happened, with the body's digest and size only: the
//! body itself is never stored. Stream: `quarantine-{bot}`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::IdError;
use crate::error::NameKind;
use crate::event::domain_events;
use crate::ids::validate_name;

domain_events! {
    /// Everything the quarantine of one bot records.
    pub enum QuarantineEvent / QuarantineEventKind {
        /// An authenticated body that could not be read as an update.
        BodyQuarantined,
    }
}

/// An authenticated body that could not be read as an update; acknowledged, not processed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BodyQuarantined {
    /// Why: `not_json`, `not_an_object` or `no_update_id`.
    pub reason: String,
    /// Hex SHA-256 of the body.
    pub digest: String,
    /// The body's size in bytes.
    pub size: u64,
    /// When the receiving server got it, by that server's clock.
    pub received_at: DateTime<Utc>,
}

/// The quarantine stream of one bot: `quarantine-{bot}`.
pub fn quarantine_stream(bot: &str) -> Result<String, IdError> {
    validate_name(NameKind::Bot, bot)?;
    Ok(format!("quarantine-{bot}"))
}
