//! The RepeatGuard aggregate: a sliding window over one user's repeats of one command.
//!
//! Lives in `recent-{bot}-{chat}-{user}-{normalized command}` (see [`crate::ids`]). An action
//! with a repeat window gives its operations an epoch: a command whose message `date` is within
//! the window of the last one seen in the current epoch joins that epoch (and its operation);
//! one that comes later opens the next epoch, and so a new operation. The window slides: every
//! repeat inside it moves its end. Time is always the message's own `date`, never the receipt
//! time, so a retried delivery is judged exactly as the first was. A late update whose `date` is
//! earlier than the last one seen joins the current epoch: the past never opens a new operation.

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregate::Aggregate;
use crate::error::RepeatGuardRejection;
use crate::event::domain_events;

domain_events! {
    /// Everything that can happen to one user's repeats of one command.
    pub enum RepeatGuardEvent / RepeatGuardEventKind {
        /// The command was seen, in this epoch.
        CommandSeen,
    }
}

/// The command was seen; `epoch` says which operation it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandSeen {
    /// The update that carried it.
    pub update_id: i64,
    /// The message's own `date`.
    pub message_date: DateTime<Utc>,
    /// 1 for the first; one more each time the window had passed.
    pub epoch: u32,
}

/// What intake asks of a guard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepeatGuardCommand {
    /// The command arrived in a message dated `message_date`.
    See {
        /// The update that carried it.
        update_id: i64,
        /// The message's own `date`.
        message_date: DateTime<Utc>,
        /// How long after the last command seen a repeat still joins its epoch.
        window: TimeDelta,
    },
}

/// One user's repeats of one command.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepeatGuard {
    /// The current epoch; 0 before any event.
    pub epoch: u32,
    /// The latest message date seen in the current epoch: the window ends `window` after it.
    pub last_seen: Option<DateTime<Utc>>,
    /// How many events were applied: the expected version of the next append.
    pub version: u64,
}

impl RepeatGuard {
    /// Rebuilds a guard from its stream's events.
    pub fn replay<'a>(events: impl IntoIterator<Item = &'a RepeatGuardEvent>) -> Self {
        events.into_iter().fold(Self::default(), evolve)
    }
}

/// Decides which epoch a command belongs to. `now` is not used: windows are measured with the
/// message's own date.
pub fn decide(
    state: &RepeatGuard,
    command: &RepeatGuardCommand,
    _now: DateTime<Utc>,
) -> Result<Vec<RepeatGuardEvent>, RepeatGuardRejection> {
    let RepeatGuardCommand::See {
        update_id,
        message_date,
        window,
    } = command;
    if *window <= TimeDelta::zero() {
        return Err(RepeatGuardRejection::InvalidCommand {
            reason: "window must be positive",
        });
    }
    let epoch = match state.last_seen {
        Some(last) if *message_date <= last + *window => state.epoch,
        _ => state.epoch.saturating_add(1),
    };
    Ok(vec![
        CommandSeen {
            update_id: *update_id,
            message_date: *message_date,
            epoch,
        }
        .into(),
    ])
}

/// Applies one event to the state.
pub fn evolve(mut state: RepeatGuard, event: &RepeatGuardEvent) -> RepeatGuard {
    state.version += 1;
    let RepeatGuardEvent::CommandSeen(seen) = event;
    state.last_seen = if seen.epoch == state.epoch {
        state.last_seen.max(Some(seen.message_date))
    } else {
        Some(seen.message_date)
    };
    state.epoch = seen.epoch;
    state
}

impl Aggregate for RepeatGuard {
    const STREAM_CATEGORY: &'static str = "recent";

    type Event = RepeatGuardEvent;
    type Command = RepeatGuardCommand;
    type Rejection = RepeatGuardRejection;

    fn decide(
        &self,
        command: &RepeatGuardCommand,
        now: DateTime<Utc>,
    ) -> Result<Vec<RepeatGuardEvent>, RepeatGuardRejection> {
        decide(self, command, now)
    }

    fn evolve(self, event: &RepeatGuardEvent) -> Self {
        evolve(self, event)
    }

    fn version(&self) -> u64 {
        self.version
    }
}
