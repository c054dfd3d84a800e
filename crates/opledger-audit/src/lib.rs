//! Auditing an opledger ledger: exports anyone can check without opledger, their offline
//! verification, and the verdicts every verification reports.
//!
//! - [`export()`] writes a range of events into an events file ([`ExportedEvent`] records, JSON
//!   Lines or CSV: [`Format`]) and a [`Manifest`] that seals it (range, count, first and last
//!   hash, SHA-256 of the file); `docs/audit.md` is the format's reference, with a standalone
//!   verifier;
//! - [`verify_export`] checks such a folder with no database: every record through the same
//!   chain check as a ledger's, then the manifest's seal ([`ExportReport`]);
//! - [`verify_ledger`] runs the store's online check of a whole ledger ([`LedgerReport`]);
//! - [`verdict`]: what either found broken ([`Broken`], [`ExportBroken`]), the first broken link
//!   as it is reported ([`BrokenLink`]), and the [`Report`] both print.
//!
//! The scans themselves (the hash chain, stream versions, the head) belong to the store
//! (`opledger_store::verify`); this crate depends on the store, never the reverse.

mod error;
mod events_file;
mod export;
mod manifest;
mod offline;
mod online;
pub mod verdict;

pub use error::{AuditError, RecordError};
pub use events_file::{ExportedEvent, Format};
pub use export::{ExportOptions, Exported, export};
pub use manifest::{MANIFEST_FILE, MANIFEST_FORMAT, MANIFEST_VERSION, Manifest, ManifestHead};
pub use offline::{ExportReport, verify_export};
pub use online::{LedgerReport, verify_ledger};
pub use verdict::{Broken, BrokenLink, Checkpoint, ExportBroken, Finding, Report};
