//! opledger's worker: takes due operations with a leased claim, records `ExternalCallSent`
//! before any request leaves, classifies what came back, and never repeats a call whose outcome
//! is unknown unless the service honours the idempotency key.
//!
//! - [`worker`]: [`Worker`], the loop over due operations and the steps of their lifecycle
//!   (claim, call, outcome, the unknown-outcome path, the lease-expiry sweep).
//! - [`effector`]: the [`Effector`] trait and what it answers; [`http`]: the built-in
//!   [`HttpEffector`].
//! - `reply`: replies to users through the Bot API, an ambiguous effect of their own.
//! - [`backoff`]: when a transient failure is tried again.
//! - [`reconcile`]: an operator's resolution of an operation waiting for reconciliation.
//!
//! Architecture invariant: `ExternalCallSent` is committed before a request leaves, and a call
//! whose outcome is unknown is repeated only when the effector honours the idempotency key.

pub mod backoff;
pub mod effector;
pub mod http;
pub mod reconcile;
mod reply;
pub mod worker;

pub use backoff::Backoff;
pub use effector::{CallOutcome, EffectRequest, Effector, LookupOutcome, NoEffect, Success};
pub use http::{HttpEffector, IDEMPOTENCY_KEY};
pub use worker::{Worker, WorkerError, WorkerOptions};
