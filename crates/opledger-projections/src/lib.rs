//! opledger's read models: deterministic folds of the ledger into tables.
//!
//! A projection never calls anything outside the database, so rebuilding it from the ledger
//! repeats nothing. Its tables' schemas live in the top-level `projections/` folder, one file per
//! backend. Inline projections ([`operation_status::OperationStatus`]) are applied by the store
//! inside every append transaction.
//!
//! Architecture invariant: a projection's fold is pure and the same code serves inline updates
//! and rebuilds.

pub mod audit_trail;
mod db;
mod error;
pub mod forward_queue;
pub mod metrics;
pub mod operation_status;
mod pages;
pub mod projection;
pub mod rebuild;
pub mod reconciliation_queue;
pub mod registry;
pub mod replay;
mod rows;
pub mod runner;
pub mod user_operations;

pub use error::ProjectorError;
pub use projection::{Backend, Conn, Definition, Projection, Schema, definition_hash};
pub use runner::{Projector, ProjectorOptions};

use std::sync::Arc;

use opledger_store::InlineProjections;

/// Every read model opledger keeps, inline and asynchronous, in a fixed order: what the
/// runner, `opledger projections`, and `opledger replay` work through.
pub fn builtin() -> Vec<Arc<dyn Projection>> {
    vec![
        Arc::new(operation_status::OperationStatus),
        Arc::new(forward_queue::ForwardQueue),
        Arc::new(audit_trail::AuditTrail),
        Arc::new(reconciliation_queue::ReconciliationQueue),
        Arc::new(user_operations::UserOperations),
        Arc::new(metrics::Metrics),
    ]
}

/// The inline projections every opledger store keeps.
pub fn inline() -> InlineProjections {
    vec![
        Arc::new(operation_status::OperationStatus),
        Arc::new(forward_queue::ForwardQueue),
    ]
}
