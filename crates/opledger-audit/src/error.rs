//! What can go wrong while exporting or reading an export, as opposed to what a verification
//! finds broken (that is a verdict: [`crate::verdict`]).

use std::io;
use std::path::PathBuf;

use opledger_store::{InvalidRequest, Position, StoreError};

/// Why an export could not be written, or an export folder could not be read.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The ledger could not be read; its message says what to do.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// There is nothing to export.
    #[error("the ledger is empty: there is nothing to export")]
    EmptyLedger,
    /// The range asked for ends beyond the ledger's head: a usage error.
    #[error("--to {to} is beyond the ledger's head at position {head}")]
    BeyondHead { to: Position, head: Position },
    /// The range asked for is empty: a usage error.
    #[error("--from {from} is after --to {to}")]
    FromAfterTo { from: Position, to: Position },
    /// A position inside the range is missing from the ledger: verify it.
    #[error(
        "position {expected} is missing from the ledger (found {found} after it); run `opledger audit verify`"
    )]
    LedgerGap { expected: Position, found: Position },
    /// The ledger's events stop before the end of the range: verify it.
    #[error("the ledger ends at position {last}, before --to {to}")]
    LedgerEnds { last: Position, to: Position },
    /// The export folder has files and replacing them was not asked for.
    #[error(
        "{} is not empty; choose an empty folder, or pass --force to replace an export there",
        dir.display()
    )]
    FolderNotEmpty { dir: PathBuf },
    #[error("cannot create the folder {}", dir.display())]
    CreateFolder {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot replace {name}")]
    Replace {
        name: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("cannot create {}", path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The folder has no manifest: probably not an export.
    #[error(
        "cannot read {}; is {} an export made by `opledger audit export`?",
        path.display(),
        dir.display()
    )]
    NoManifest {
        path: PathBuf,
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The manifest is not JSON of the manifest's shape.
    #[error("{} is not an opledger export manifest", path.display())]
    NotAManifest {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// Reading or writing the events file failed midway (the system's message says why).
    #[error(transparent)]
    Io(#[from] io::Error),
    /// Encoding a JSON Lines record failed (only when writing fails).
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// Encoding a CSV record failed (only when writing fails).
    #[error(transparent)]
    Csv(#[from] csv::Error),
}

impl AuditError {
    /// Whether the request, not the ledger or the disk, is wrong (the CLI's exit code 2).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            AuditError::BeyondHead { .. } | AuditError::FromAfterTo { .. }
        )
    }
}

/// Why one record of an events file cannot be read back into an event.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The line is not a JSON object of the record's fields.
    #[error("{0}")]
    Json(serde_json::Error),
    /// The row is not a CSV record of the record's fields.
    #[error("{0}")]
    Csv(csv::Error),
    #[error("{field} is not 64 hex digits")]
    Hash { field: &'static str },
    #[error("recorded_at_micros is out of range")]
    MicrosOutOfRange,
    #[error("recorded_at {text} is not recorded_at_micros {micros}")]
    TimeDisagrees { text: String, micros: i64 },
    #[error("stream_id: {0}")]
    StreamId(InvalidRequest),
    #[error("event_id is not a UUID")]
    EventId,
    #[error("payload_base64: {0}")]
    Payload(base64::DecodeError),
    #[error("metadata_base64: {0}")]
    Metadata(base64::DecodeError),
}
