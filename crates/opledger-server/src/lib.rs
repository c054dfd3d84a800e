//! opledger's service: Telegram intake (webhook and long polling) that records every update
//! durably and deduplicated before acknowledging it.
//!
//! - [`intake`]: the intake transaction, one atomic multi-stream append per update (a pure
//!   decision run by the ledger's unit of work).
//! - [`app`]: [`App::build`] (config and store in, router and pollers out) and [`App::run`]
//!   (serve until shutdown, then finish in-flight work and close the store).
//! - `edge`: the accept loop, connection limit and timeouts; `refusals`: sampled logging of
//!   what the edge refuses.
//! - `webhook`: the answer table of `POST /telegram/{bot}/webhook`; `poll`: `getUpdates` loops.
//! - [`api`]: the read API under `/v1` (admin bearer token, OpenAPI document); [`metrics`]:
//!   `/metrics` (OpenMetrics text); `health`: `/healthz` and `/readyz`.
//! - [`reconcile`]: the reconciliation queue and an operator's decision about one of its
//!   operations, shared by `opledger reconcile` and `POST /v1/operations/{id}/resolution`.
//! - [`replies`]: pure answers (`/help`, `/status`, usage) computed from configuration and read
//!   models.
//!
//! Architecture invariant: the service acknowledges an update (2xx, or the next `getUpdates`
//! offset) only after its events are committed, and never calls an external service from the
//! intake path.

pub mod api;
pub mod app;
mod edge;
mod health;
pub mod intake;
pub mod metrics;
mod poll;
pub mod reconcile;
mod refusals;
pub mod replies;
mod webhook;

pub use app::{App, Counters, allowed_updates};
pub use intake::{Intake, IntakeError, IntakeRejection, Receipt, Recorded, Route};
pub use opledger_ledger::LedgerError;
pub use opledger_ledger::clock;
pub use opledger_ledger::{Clock, ManualClock, SystemClock};
pub use webhook::SECRET_HEADER;
