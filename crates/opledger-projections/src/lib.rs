//! opledger's read models: deterministic folds of the ledger into tables.
//!
//! A projection never calls anything outside the database, so rebuilding it from the ledger
//! repeats nothing. Its tables' schemas live in the top-level `projections/` folder, one file per
//! backend. Inline projections ([`operation_status::OperationStatus`]) are applied by the store
//! inside every append transaction.
//!
//! Architecture invariant: a projection's fold is pure and the same code serves inline updates
//! and rebuilds.

pub mod operation_status;

use std::sync::Arc;

use opledger_store::InlineProjections;

/// The inline projections every opledger store keeps.
pub fn inline() -> InlineProjections {
    vec![Arc::new(operation_status::OperationStatus)]
}
