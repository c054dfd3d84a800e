//! Typed errors of the event store. Each variant is named for what the caller does next:
//! reload and decide again (`VersionConflict`), retry later (`Unavailable`), fix the request
//! (`InvalidRequest`), stop and investigate (`Storage`), or put the ledger's file back and
//! restart (`LedgerFileLost`).

use std::error::Error as StdError;
use std::sync::Arc;

use crate::model::{ExpectedVersion, StreamId, StreamVersion};

/// A database error shared by every caller whose append was in the failed batch.
pub type SharedSource = Arc<dyn StdError + Send + Sync + 'static>;

/// Why an event store call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// Another writer got there first. Nothing of this call was written and no position was
    /// used: reload the stream, decide again, and append at the new version.
    #[error(
        "version conflict on stream `{stream}`: expected {expected}, but it is at version {actual}; reload the stream and decide again"
    )]
    VersionConflict {
        stream: StreamId,
        expected: ExpectedVersion,
        actual: StreamVersion,
    },

    /// The database could not be reached or was busy, locked, full or failing I/O. Nothing of
    /// this call was written, with one exception that the message names ("outcome unknown"):
    /// the connection died while committing and the store could not check afterwards. Retrying
    /// the same call with `NoStream` or `Exact` expectations is always safe: if the first attempt
    /// did commit, the retry fails with a version conflict instead of writing twice.
    #[error(
        "event store unavailable while {operation}: {source}; nothing was written, retry later"
    )]
    Unavailable {
        operation: &'static str,
        #[source]
        source: SharedSource,
    },

    /// The database answered something the store cannot explain: a bug or corruption. Do not
    /// retry blindly: stop writing, keep the database file for investigation and report it.
    #[error(
        "event store failed while {operation}: {source}; this is a bug or corruption, not retryable"
    )]
    Storage {
        operation: &'static str,
        #[source]
        source: SharedSource,
    },

    /// The call itself is malformed; nothing was written. Fix the request.
    #[error("invalid append request: {0}")]
    InvalidRequest(#[from] InvalidRequest),

    /// The store was closed by its owner; open it again to continue.
    #[error("the event store is closed; open it again")]
    Closed,

    /// A file of the SQLite ledger was deleted or replaced while this process had it open: an
    /// append would go into a file no one will open again, so none is acknowledged any more
    /// (the last one may have been written there, and was refused). Nothing helps but putting
    /// the ledger back and restarting.
    #[error(
        "the ledger file {} was {change} while opledger had it open, so nothing more is acknowledged; put the ledger back and restart opledger (until then process {pid} still holds the old file under /proc/{pid}/fd)",
        path.display()
    )]
    LedgerFileLost {
        path: std::path::PathBuf,
        change: &'static str,
        pid: u32,
    },
}

impl StoreError {
    /// Whether retrying the same call later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable { .. })
    }

    pub(crate) fn unavailable(
        operation: &'static str,
        source: impl StdError + Send + Sync + 'static,
    ) -> Self {
        StoreError::Unavailable {
            operation,
            source: Arc::new(source),
        }
    }

    pub(crate) fn storage(
        operation: &'static str,
        source: impl StdError + Send + Sync + 'static,
    ) -> Self {
        StoreError::Storage {
            operation,
            source: Arc::new(source),
        }
    }
}

/// What is wrong with an append request. Checked before anything reaches the database.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRequest {
    #[error("an append needs at least one request")]
    NoRequests,
    #[error("the request for stream `{stream}` has no events; send at least one")]
    NoEvents { stream: StreamId },
    #[error("stream `{stream}` appears twice in one append; merge its events into one request")]
    DuplicateStream { stream: StreamId },
    #[error("a stream id must be 1 to 255 bytes long, this one is {len}; hash long keys")]
    StreamIdLength { len: usize },
    #[error("a stream id must not contain control characters")]
    StreamIdControlChar,
    #[error("event type `{event_type}` is invalid: use 1 to 128 printable characters")]
    EventType { event_type: String },
    #[error("schema version {schema_version} is invalid: versions start at 1 and fit in 31 bits")]
    SchemaVersion { schema_version: u32 },
    #[error(
        "the append holds {events} events, more than the limit of {limit}; split it into several appends"
    )]
    TooManyEvents { events: usize, limit: usize },
}

/// Why a store could not be opened. Every message names the problem and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(
        "bad database URL: {reason}; use sqlite://PATH (e.g. sqlite://opledger.db) or postgres://USER@HOST/DB"
    )]
    BadUrl { reason: String },

    /// A read-only open found no file: reading never creates a ledger.
    #[error(
        "there is no ledger at {}: check the path (commands that only read never create one), or create it with `opledger migrate`",
        path.display()
    )]
    Missing { path: std::path::PathBuf },

    #[error(
        "cannot reach the database: {source}; check that it exists, is running and is reachable"
    )]
    Unreachable {
        #[source]
        source: sqlx::Error,
    },

    #[error(
        "the database is read-only: {source}; the ledger must be writable (check file permissions and the disk)"
    )]
    ReadOnly {
        #[source]
        source: sqlx::Error,
    },

    #[error(
        "the database schema is newer than this binary (it has migration {found}, this binary knows up to {known}); upgrade opledger"
    )]
    SchemaTooNew { found: i64, known: i64 },

    #[error("the database is not an opledger ledger or is damaged: {source}")]
    NotALedger {
        #[source]
        source: sqlx::Error,
    },

    /// The read models' file beside a SQLite ledger was made for another ledger.
    #[error(
        "the read models' file {} belongs to another ledger; move it away or delete it (read models are rebuilt from the ledger)",
        path.display()
    )]
    ForeignReadModels { path: std::path::PathBuf },

    /// The read models' file beside a SQLite ledger cannot be opened or written.
    #[error(
        "cannot open or write the read models' file {}: {source}; it must be a writable file in the ledger's folder (read models are rebuilt from the ledger, so a damaged one may be deleted)",
        path.display()
    )]
    ReadModelsUnusable {
        path: std::path::PathBuf,
        #[source]
        source: sqlx::Error,
    },

    #[error("could not install the read model `{name}`: {source}")]
    Projection {
        name: &'static str,
        #[source]
        source: crate::inline::ProjectionError,
    },

    #[error("could not apply the schema migrations: {source}")]
    Migrate {
        #[source]
        source: sqlx::migrate::MigrateError,
    },
}

/// Two consecutive events whose positions are not consecutive: in a ledger whose positions are
/// gapless by construction, that means rows were removed or the store is broken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "positions are not contiguous: expected {expected}, found {found}; the ledger was altered outside opledger"
)]
pub struct PositionGap {
    pub expected: u64,
    pub found: u64,
}
