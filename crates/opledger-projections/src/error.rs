//! What running, registering and rebuilding projections may fail with.

use opledger_store::StoreError;
use opledger_store::inline::ProjectionError;

use crate::registry::RegistryError;

/// Why a projection could not be registered, advanced or rebuilt. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum ProjectorError {
    #[error(transparent)]
    Registry(#[from] RegistryError),

    #[error("cannot read the ledger: {0}")]
    Store(#[from] StoreError),

    #[error("cannot write read models: {0}; check that the database is reachable and retry")]
    Database(#[from] sqlx::Error),

    /// The projection's code refused a page: a bug in the projection or an event it cannot read.
    /// Its checkpoint did not move.
    #[error(
        "projection `{name}` cannot apply events {from}..={to}: {source}; its checkpoint stays \
         at {at}: fix the projection (or the event) and restart"
    )]
    Apply {
        name: String,
        from: u64,
        to: u64,
        at: u64,
        #[source]
        source: ProjectionError,
    },

    /// The ledger's positions are not contiguous: tampering or corruption. Nothing is skipped.
    #[error(
        "the ledger has a gap: expected position {expected}, found {found}; nothing after it is \
         applied; run `opledger audit verify`"
    )]
    Gap { expected: u64, found: u64 },

    #[error("no projection named `{name}`; known: {known}")]
    Unknown { name: String, known: String },

    #[error(
        "{name} aggregates across streams, so one stream cannot be rebuilt alone; rebuild it \
         whole (`opledger projections rebuild {name}`)"
    )]
    WholeOnly { name: String },

    #[error(
        "a rebuild of `{name}` is already running in another process; wait for it to finish \
         (`opledger projections list` shows its progress)"
    )]
    RebuildRunning { name: String },

    /// Another process moved the version this one was building or running: only one may.
    #[error(
        "another process advanced `{name}` v{version} meanwhile (a second rebuild or runner); \
         this one stopped without writing; run one at a time"
    )]
    Superseded { name: String, version: u32 },

    #[error(
        "`{name}` is an inline read model but its table is missing: open the ledger with \
         opledger's inline read models (opledger_projections::inline())"
    )]
    InlineMissing { name: String },

    #[error(
        "`{name}` is not registered yet; start `opledger serve`, or rebuild it whole first \
         (`opledger projections rebuild {name}`)"
    )]
    NotRegistered { name: String },
}
