//! The Operation's state, rebuilt from its events by `evolve`.

use std::fmt;

use chrono::{DateTime, Utc};

use super::event::{OperationEvent, ReconcileOutcome};
use crate::ids::OperationId;

/// Where an operation stands in its life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    /// No event yet: the stream does not exist.
    #[default]
    New,
    /// Received and due, never claimed.
    Received,
    /// A worker holds a claim and has sent nothing under it.
    Claimed,
    /// A request left under the current claim; its outcome is unknown.
    CallSent,
    /// Waiting to be claimed again (due from `retry_at`, or now when there is none).
    RetryScheduled,
    /// Waiting for a person.
    NeedsReconciliation,
    /// Done (terminal).
    Confirmed,
    /// Will not happen (terminal).
    Failed,
    /// A person decided it succeeded or failed (terminal).
    Reconciled,
}

impl Status {
    /// Every status, in declaration order.
    pub const ALL: &'static [Status] = &[
        Status::New,
        Status::Received,
        Status::Claimed,
        Status::CallSent,
        Status::RetryScheduled,
        Status::NeedsReconciliation,
        Status::Confirmed,
        Status::Failed,
        Status::Reconciled,
    ];

    /// Whether nothing can change the operation's outcome any more.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Status::Confirmed | Status::Failed | Status::Reconciled
        )
    }

    /// The stable snake_case name used in projections and recorded rejections.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::New => "new",
            Status::Received => "received",
            Status::Claimed => "claimed",
            Status::CallSent => "call_sent",
            Status::RetryScheduled => "retry_scheduled",
            Status::NeedsReconciliation => "needs_reconciliation",
            Status::Confirmed => "confirmed",
            Status::Failed => "failed",
            Status::Reconciled => "reconciled",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where the reply to the user stands; it is tracked apart from the operation's status because
/// it is its own ambiguous side effect, started only once the operation is terminal.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ReplyStatus {
    /// No reply attempt yet.
    #[default]
    NotStarted,
    /// A reply attempt is being sent.
    InFlight {
        /// The attempt's number.
        attempt: u32,
    },
    /// Telegram refused the last attempt for sure; it may be started again from `at`.
    RetryScheduled {
        /// When the next attempt may start.
        at: DateTime<Utc>,
    },
    /// Telegram accepted it.
    Sent,
    /// Given up.
    Failed,
    /// Nobody knows whether it arrived; it is never resent automatically.
    Unknown,
}

impl fmt::Display for ReplyStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplyStatus::NotStarted => f.write_str("not_started"),
            ReplyStatus::InFlight { attempt } => write!(f, "in_flight (attempt {attempt})"),
            ReplyStatus::RetryScheduled { at } => write!(f, "retry_scheduled (at {at})"),
            ReplyStatus::Sent => f.write_str("sent"),
            ReplyStatus::Failed => f.write_str("failed"),
            ReplyStatus::Unknown => f.write_str("unknown"),
        }
    }
}

/// The claim a worker holds on an operation: who, until when, and which attempt it is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Claim {
    /// The worker's id.
    pub worker: String,
    /// When the lease lapses.
    pub lease_until: DateTime<Utc>,
    /// The claim's number, 1 for the first.
    pub attempt: u32,
}

impl Claim {
    /// Whether the lease still holds at `now`.
    pub fn is_live(&self, now: DateTime<Utc>) -> bool {
        now < self.lease_until
    }
}

/// One business action's state: what `decide` needs to judge the next command.
///
/// It is a fold of the stream's events ([`evolve`]); it holds no more than the decisions need.
/// Everything else (parameters, chat, results) stays in the events and the projections.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Operation {
    /// Where the operation stands.
    pub status: Status,
    /// The operation's id, once received.
    pub operation_id: Option<OperationId>,
    /// The action's name, once received.
    pub action: String,
    /// The fingerprint the operation was received with.
    pub fingerprint: String,
    /// How many claims may be used before a transient failure becomes final.
    pub max_attempts: u32,
    /// The current claim, in `Claimed` and `CallSent`.
    pub claim: Option<Claim>,
    /// How many claims were taken so far.
    pub claims: u32,
    /// When a scheduled retry becomes due; `None` in `RetryScheduled` means due now.
    pub retry_at: Option<DateTime<Utc>>,
    /// The reconciliation decision, once a person made one.
    pub reconcile_outcome: Option<ReconcileOutcome>,
    /// Where the reply to the user stands.
    pub reply: ReplyStatus,
    /// How many reply attempts were started.
    pub reply_attempts: u32,
    /// How many events were applied: the expected version of the next append.
    pub version: u64,
}

impl Operation {
    /// Rebuilds an operation from its stream's events.
    pub fn replay<'a>(events: impl IntoIterator<Item = &'a OperationEvent>) -> Self {
        events.into_iter().fold(Self::default(), evolve)
    }
}

/// Applies one event to the state. Total: it never fails and never looks at a clock.
pub fn evolve(mut state: Operation, event: &OperationEvent) -> Operation {
    state.version += 1;
    match event {
        OperationEvent::Received(e) => {
            state.status = Status::Received;
            state.operation_id = Some(e.operation_id);
            state.action.clone_from(&e.action);
            state.fingerprint.clone_from(&e.fingerprint);
            state.max_attempts = e.max_attempts;
        }
        OperationEvent::Claimed(e) => {
            state.status = Status::Claimed;
            state.claims = e.attempt;
            state.retry_at = None;
            state.claim = Some(Claim {
                worker: e.worker.clone(),
                lease_until: e.lease_until,
                attempt: e.attempt,
            });
        }
        OperationEvent::ExternalCallSent(_) => state.status = Status::CallSent,
        OperationEvent::Confirmed(_) => {
            state.status = Status::Confirmed;
            state.claim = None;
        }
        OperationEvent::Failed(_) => {
            state.status = Status::Failed;
            state.claim = None;
        }
        OperationEvent::RetryScheduled(e) => {
            state.status = Status::RetryScheduled;
            state.retry_at = Some(e.at);
            state.claim = None;
        }
        OperationEvent::MarkedForReconciliation(_) => {
            state.status = Status::NeedsReconciliation;
            state.claim = None;
        }
        OperationEvent::Reconciled(e) => {
            state.reconcile_outcome = Some(e.outcome);
            state.claim = None;
            state.status = match e.outcome {
                ReconcileOutcome::Succeeded | ReconcileOutcome::Failed => Status::Reconciled,
                ReconcileOutcome::Retry => {
                    state.retry_at = None;
                    Status::RetryScheduled
                }
            };
        }
        OperationEvent::KeyConflictRecorded(_) | OperationEvent::TransitionRejected(_) => {}
        OperationEvent::ReplyStarted(e) => {
            state.reply = ReplyStatus::InFlight { attempt: e.attempt };
            state.reply_attempts = e.attempt;
        }
        OperationEvent::ReplySent(_) => state.reply = ReplyStatus::Sent,
        OperationEvent::ReplyRetryScheduled(e) => {
            state.reply = ReplyStatus::RetryScheduled { at: e.at };
        }
        OperationEvent::ReplyFailed(_) => state.reply = ReplyStatus::Failed,
        OperationEvent::ReplyOutcomeUnknown(_) => state.reply = ReplyStatus::Unknown,
    }
    state
}
