//! Every error and rejection of the domain, named for what the caller does next.

use std::fmt;

use chrono::{DateTime, Utc};

use crate::operation::{
    CommandKind, Operation, OperationCommand, OperationEvent, ReplyStatus, Status,
    TransitionRejected,
};

/// Why stored event bytes could not be read back.
///
/// A store that meets one must stop replaying that stream: skipping an event would build a
/// wrong state.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The type name belongs to no event this build knows.
    #[error("unknown event type {event_type:?}: run a build that knows it")]
    UnknownEventType {
        /// The stored type name.
        event_type: String,
    },
    /// The payload was written with a schema version this build cannot read.
    #[error(
        "unsupported schema version {schema_version} of event type {event_type} \
         (this build reads version {supported}): run a build that knows it"
    )]
    UnsupportedSchemaVersion {
        /// The stored type name.
        event_type: String,
        /// The stored schema version.
        schema_version: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// The payload does not match its type's schema.
    #[error(
        "payload of event type {event_type} does not match its schema: the ledger may be damaged"
    )]
    BadPayload {
        /// The stored type name.
        event_type: String,
        /// What serde_json found.
        #[source]
        source: serde_json::Error,
    },
    /// The metadata does not match its schema.
    #[error("event metadata does not match its schema: the ledger may be damaged")]
    BadMetadata {
        /// What serde_json found.
        #[source]
        source: serde_json::Error,
    },
}

/// Which kind of name an [`IdError::InvalidName`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NameKind {
    /// A bot's configured name.
    Bot,
    /// An action's configured name.
    Action,
    /// An operations API client's configured name.
    Client,
}

impl fmt::Display for NameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NameKind::Bot => "bot",
            NameKind::Action => "action",
            NameKind::Client => "client",
        })
    }
}

/// Why a stream id could not be built; the input is a configuration or caller mistake.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// A bot or action name is not 1 to 64 characters of `[a-z0-9_]`.
    #[error("{kind} name {name:?} is invalid: use 1 to 64 characters from a-z, 0-9 and _")]
    InvalidName {
        /// Which name.
        kind: NameKind,
        /// The name as given.
        name: String,
    },
    /// The business key is empty.
    #[error("business key is empty: fix the action's key template")]
    EmptyBusinessKey,
    /// A callback token is malformed (it came from a button press, or was minted wrongly).
    #[error("callback token is invalid: {reason}")]
    InvalidToken {
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// Why an [`Operation`] refused a command.
///
/// A refusal changes nothing. The caller may record it with [`Rejection::to_event`] so that a
/// late worker, update or operator leaves a trace; each message says what to do next.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// The transition table has no row for this command in this status.
    #[error("{command} is not allowed while the operation is {status}: reload it and decide again")]
    NotAllowed {
        /// The operation's status.
        status: Status,
        /// The refused command's kind.
        command: CommandKind,
    },
    /// The command itself is malformed.
    #[error("invalid command: {reason}; fix the caller, retrying will not help")]
    InvalidCommand {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Another claim is live; a second live claim is impossible.
    #[error("the operation is claimed by {worker} until {lease_until}: leave it to that worker")]
    AlreadyClaimed {
        /// The worker holding the claim.
        worker: String,
        /// When its lease lapses.
        lease_until: DateTime<Utc>,
    },
    /// A scheduled retry is not due yet.
    #[error("the operation is not due before {at}: claim it from then")]
    NotDue {
        /// When it becomes due.
        at: DateTime<Utc>,
    },
    /// A call was sent and its outcome is unknown.
    #[error(
        "an external call was sent and its outcome is unknown: resolve it by confirming, \
         retrying with the same key, a lookup or reconciliation, never by claiming or sending again"
    )]
    CallOutcomeUnknown,
    /// The operation's outcome is final.
    #[error("the operation is {status}, which is final: answer with its result")]
    Terminal {
        /// The terminal status.
        status: Status,
    },
    /// The operation waits for a person.
    #[error("the operation waits for reconciliation: a person must resolve it")]
    NeedsReconciliation,
    /// Another worker holds the claim.
    #[error("the claim is held by {holder}, not {worker}: stop working on this operation")]
    NotClaimHolder {
        /// The worker holding the claim.
        holder: String,
        /// The worker that asked.
        worker: String,
    },
    /// The caller's lease lapsed before it sent anything.
    #[error("the lease ended at {lease_until}: do not send the call, claim the operation again")]
    LeaseExpired {
        /// When the lease lapsed.
        lease_until: DateTime<Utc>,
    },
    /// A retry after a sent call without an honoured key or a lookup.
    #[error(
        "a call was sent and the retry would not reuse an honoured idempotency key: \
         use a lookup or mark the operation for reconciliation"
    )]
    BlindRetryForbidden,
    /// A reply attempt is in flight.
    #[error("reply attempt {attempt} is in flight: wait for its outcome")]
    ReplyInFlight {
        /// The attempt in flight.
        attempt: u32,
    },
    /// The reply's retry is not due yet.
    #[error("the reply may not be retried before {at}: start it from then")]
    ReplyNotDue {
        /// When it may start.
        at: DateTime<Utc>,
    },
    /// The reply was sent.
    #[error("the reply was already sent: nothing to do")]
    ReplyAlreadySent,
    /// The reply was given up.
    #[error(
        "the reply was given up: nothing more will be sent, the result stays visible in /status"
    )]
    ReplyGaveUp,
    /// The reply's outcome is unknown; resending could double it.
    #[error(
        "the reply's outcome is unknown: it is never resent automatically, a person must check the chat"
    )]
    ReplyOutcomeUnknown,
    /// An outcome was reported for a reply that is not in flight.
    #[error(
        "no reply is in flight (the reply is {reply}): start a reply before recording its outcome"
    )]
    ReplyNotInFlight {
        /// Where the reply stands.
        reply: ReplyStatus,
    },
}

impl Rejection {
    /// The `TransitionRejected` event that records this refusal of `command` on `state`.
    ///
    /// Append it only to an existing stream, at the version `state` was read at.
    pub fn to_event(&self, state: &Operation, command: &OperationCommand) -> OperationEvent {
        TransitionRejected {
            command: command.kind().as_str().to_owned(),
            status: state.status.as_str().to_owned(),
            reason: self.to_string(),
        }
        .into()
    }
}

/// Why a Delivery refused to record an update; the command is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryRejection {
    /// The command itself is malformed.
    #[error("invalid update record: {reason}; fix the caller, retrying will not help")]
    InvalidCommand {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A forwarding step does not fit where the forwarding stands.
    #[error(transparent)]
    Forward(ForwardRejection),
}

/// Why a forwarding step was refused: usually another forwarder got there first, which is
/// fine; the step is simply not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForwardRejection {
    #[error("this update is not to be forwarded")]
    NotForwarded,
    #[error("this update was acknowledged by the bot or given up already")]
    Done,
    #[error("attempt {attempt} is in flight until {lease_until}")]
    InFlight {
        attempt: u32,
        lease_until: chrono::DateTime<chrono::Utc>,
    },
    #[error("the next attempt is due at {retry_at}")]
    NotDue {
        retry_at: chrono::DateTime<chrono::Utc>,
    },
    #[error("attempt {attempt} is not the attempt in flight")]
    NoSuchAttempt { attempt: u32 },
    #[error("the update, received at {since}, is not old enough to give up")]
    NotOldEnough {
        since: chrono::DateTime<chrono::Utc>,
    },
    #[error("no answer call is in flight")]
    NoAnswerInFlight,
    #[error("invalid forwarding step: {0}; fix the caller")]
    Invalid(&'static str),
}

/// Why a RepeatGuard refused a command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RepeatGuardRejection {
    /// The command itself is malformed.
    #[error("invalid repeat check: {reason}; fix the caller, retrying will not help")]
    InvalidCommand {
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// Why a CallbackToken refused to be issued. A refused click is not an error: it is recorded
/// as a `TokenRejected` event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IssueRejection {
    /// The token was issued before.
    #[error("the token was already issued and expires at {expires_at}: mint a new token")]
    AlreadyIssued {
        /// The first issue's expiry.
        expires_at: DateTime<Utc>,
    },
    /// Clicks on the token were refused before it was issued.
    #[error("the token already has refused clicks recorded: mint a new token")]
    NotFresh,
    /// The command itself is malformed.
    #[error("invalid token issue: {reason}; fix the caller, retrying will not help")]
    InvalidCommand {
        /// What is wrong with it.
        reason: &'static str,
    },
}
