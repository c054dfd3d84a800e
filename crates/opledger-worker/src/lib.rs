//! opledger's worker: takes due operations with a leased claim, records `ExternalCallSent`
//! before any request leaves, classifies what came back, and never repeats a call whose outcome
//! is unknown unless the service honours the idempotency key.
//!
//! - [`worker`]: [`Worker`], the loop over due operations: the queue its tasks drain, the
//!   operations in hand and at rest, and which step each operation's stream calls for.
//! - `call`: the call step (claim, `ExternalCallSent`, the effector's call, its outcome kept
//!   until the task's next claim) and the unknown-outcome path the lease sweep takes too.
//! - `reply`: replies to users through the Bot API, an ambiguous effect of their own.
//! - `handle`: the worker's handle on one operation (a `StreamState` the unit of work loads and
//!   holds) and the pure decisions staged on it; every commit of the crate goes through
//!   `Ledger::unit_of_work` and its one retry policy.
//! - [`effector`]: the [`Effector`] trait and what it answers; [`http`]: the built-in
//!   [`HttpEffector`].
//! - [`backoff`]: when a transient failure is tried again.
//! - [`forward`]: [`Forwarder`], the gateway: each update a bot's `[bots.forward]` selects, to
//!   the bot's own webhook, one per chat at a time, until it answers 2xx (ADR 0012).
//! - [`decision`]: the pure decisions of the steps above, for callers that batch their own
//!   appends.
//!
//! Modules use only those below them: `worker` → `call`, `reply` → `handle`. (An operator's
//! resolution of an operation waiting for reconciliation is `opledger_server::reconcile`, shared
//! by the CLI and the admin API.)
//!
//! Architecture invariant: `ExternalCallSent` is committed before a request leaves, and a call
//! whose outcome is unknown is repeated only when the effector honours the idempotency key.

pub mod backoff;
mod call;
pub mod decision;
pub mod effector;
pub mod forward;
/// Fuzz target bodies, shared with the corpus replay tests; not an API.
#[doc(hidden)]
pub mod fuzzing;
mod handle;
pub mod http;
mod reply;
pub mod worker;

pub use backoff::Backoff;
pub use effector::{CallOutcome, EffectRequest, Effector, LookupOutcome, NoEffect, Success};
pub use forward::{Forwarder, ForwarderError, ForwarderOptions, HandedUpdate, Handover};
pub use http::{HttpEffector, IDEMPOTENCY_KEY};
pub use worker::{Worker, WorkerError, WorkerOptions};
