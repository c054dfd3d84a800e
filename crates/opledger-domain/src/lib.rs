//! The pure domain model of opledger: aggregates, their events and the rules that decide them.
//!
//! opledger makes a Telegram bot's side effects happen once: the same business event, delivered
//! any number of times, produces one outcome, and an external call whose outcome is unknown is
//! never repeated blindly. This crate holds the rules of that promise and nothing else.
//!
//! **Architecture invariant: this crate is pure.** It does no I/O, has no async code and never
//! reads a clock (chrono is built without its `clock` feature, so `Utc::now()` does not exist
//! here). Every decision is a function of the current state, a command and a `now` passed in by
//! the caller, which makes each rule testable with fixed times and no store.
//!
//! # Aggregates
//!
//! Each aggregate lives in one event stream and exposes the same shape (see [`Aggregate`]):
//! `decide(&state, &command, now) -> Result<Vec<Event>, Rejection>` and
//! `evolve(state, &event) -> state`. Replaying a stream's events through `evolve` rebuilds the
//! state; the store's expected version turns a `decide` into an atomic compare-and-append.
//!
//! | stream id ([`ids`]) | aggregate | first event | why it exists |
//! |---|---|---|---|
//! | `update-{bot}-{update_id}` | [`Delivery`] | `UpdateReceived` | receipt-level dedup of a Telegram update |
//! | `op-{action}-{business key}` | [`Operation`] | `Received` | one per business action; its version is the lock |
//! | `cb-{token}` | [`CallbackToken`] | `TokenIssued` | one-time button tokens, consumed at most once |
//! | `recent-{bot}-{chat}-{user}-{command}` | [`RepeatGuard`] | `CommandSeen` | sliding window over a user repeating a command |
//! | `quarantine-{bot}` | (none) | `BodyQuarantined` | authenticated bodies that are not updates: digest and size only |
//!
//! The [`Operation`]'s legal moves are data: [`TRANSITIONS`] is consulted before any guard, and
//! the tests prove that no sequence of commands reaches two terminal events, a second live claim
//! or an external call after a terminal event.
//!
//! # Events as a contract
//!
//! Every event enum implements [`DomainEvent`]: a stable PascalCase type name, a schema version
//! and a JSON payload of the variant's own struct. The payload bytes are what the store hashes,
//! so their shape is pinned by snapshot tests. [`EventMetadata`] says who or what caused an
//! event; the store adds the time it was recorded, the domain never stamps it.

pub mod aggregate;
pub mod callback_token;
pub mod delivery;
pub mod error;
pub mod event;
pub mod forward;
pub mod ids;
pub mod operation;
pub mod quarantine;
pub mod repeat_guard;
pub mod text;

pub use aggregate::Aggregate;
pub use callback_token::{CallbackToken, CallbackTokenCommand, CallbackTokenEvent, TokenStatus};
pub use delivery::{Delivery, DeliveryCommand, DeliveryEvent, OperationLink};
pub use error::{
    DecodeError, DeliveryRejection, ForwardRejection, IdError, IssueRejection, NameKind, Rejection,
    RepeatGuardRejection,
};
pub use event::{Causation, DomainEvent, EventMetadata, SCHEMA_VERSION};
pub use ids::{
    OperationId, callback_stream, delivery_stream, operation_stream, repeat_guard_stream,
};
pub use operation::{
    Claim, CommandKind, Operation, OperationCommand, OperationEvent, ReplyStatus, Status,
    TRANSITIONS, Transition, fingerprint,
};
pub use repeat_guard::{RepeatGuard, RepeatGuardCommand, RepeatGuardEvent};
