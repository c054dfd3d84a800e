//! The Operation aggregate: one business action, from request to outcome and reply.
//!
//! An operation lives in the stream `op-{action}-{business key}`. Its life, with the events that
//! move it (see [`TRANSITIONS`] for the complete table):
//!
//! ```text
//! Received ──claim──▶ Claimed ──send──▶ CallSent ──ok──▶ Confirmed               (terminal)
//!    ▲                  │  │               │  └──refused──▶ Failed               (terminal)
//!    │   lease expired, │  │               ├──key honoured / lookup: absent──▶ RetryScheduled
//!    │   nothing sent   │  │               └──neither──▶ NeedsReconciliation ──person──▶ Reconciled
//!    └──────────────────┘  └──transient failure──▶ RetryScheduled ──due──▶ claim again
//!                                 (or Failed once max_attempts claims were used)
//! ```
//!
//! Once terminal, the reply to the user is tracked as its own effect (`ReplyStarted` before
//! `sendMessage`, then sent, retry, failed or unknown); an unknown reply is never resent.

mod command;
mod decide;
mod event;
mod state;
mod table;

pub use command::{CommandKind, OperationCommand, fingerprint};
pub use decide::decide;
pub use event::{
    Claimed, Confirmed, ConfirmedVia, ExternalCallSent, Failed, KeyConflictRecorded,
    MarkedForReconciliation, OperationEvent, OperationEventKind, Received, ReconcileOutcome,
    Reconciled, ReplyFailed, ReplyOutcomeUnknown, ReplyRetryScheduled, ReplySent, ReplyStarted,
    RetryScheduled, TransitionRejected,
};
pub use state::{Claim, Operation, ReplyStatus, Status, evolve};
pub use table::{TRANSITIONS, Transition, render_markdown};

use chrono::{DateTime, Utc};

use crate::aggregate::Aggregate;
use crate::error::Rejection;

impl Aggregate for Operation {
    const STREAM_CATEGORY: &'static str = "op";

    type Event = OperationEvent;
    type Command = OperationCommand;
    type Rejection = Rejection;

    fn decide(
        &self,
        command: &OperationCommand,
        now: DateTime<Utc>,
    ) -> Result<Vec<OperationEvent>, Rejection> {
        decide(self, command, now)
    }

    fn evolve(self, event: &OperationEvent) -> Self {
        evolve(self, event)
    }

    fn version(&self) -> u64 {
        self.version
    }
}
