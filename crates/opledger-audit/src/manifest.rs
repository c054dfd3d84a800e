//! `manifest.json`, which seals an export: the range and count of its events, the hashes at both
//! ends of the exported chain, and the SHA-256 of the events file.

use std::path::{Path, PathBuf};

use opledger_store::{Hash, Position};
use serde::{Deserialize, Serialize};

use crate::error::AuditError;
use crate::events_file::{Format, parse_hash};
use crate::verdict::ExportBroken;

/// The manifest's `format`.
pub const MANIFEST_FORMAT: &str = "opledger-audit-export";
/// The manifest's `format_version`.
pub const MANIFEST_VERSION: u32 = 1;
/// The manifest's name in an export folder.
pub const MANIFEST_FILE: &str = "manifest.json";

/// What `manifest.json` says about an export (its fields in the order they are written).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always [`MANIFEST_FORMAT`].
    pub format: String,
    /// Always [`MANIFEST_VERSION`].
    pub format_version: u32,
    /// The events file, beside the manifest.
    pub events_file: String,
    pub encoding: Format,
    pub from: Position,
    pub to: Position,
    pub count: u64,
    /// The `prev_hash` of the event at `from`: where the exported chain hangs on.
    pub first_prev_hash: String,
    pub first_hash: String,
    pub last_hash: String,
    /// SHA-256 of the events file's bytes, hex.
    pub events_sha256: String,
    /// The ledger's head when the export was made.
    pub ledger_head: ManifestHead,
    pub exported_at: String,
    /// The ledger's URL, without its password.
    pub source: String,
    /// The opledger that wrote the export.
    pub tool: String,
}

/// The ledger's head in a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestHead {
    pub position: Position,
    pub hash: String,
}

/// The manifest's hash fields, read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seal {
    pub(crate) first_prev: Hash,
    pub(crate) first: Hash,
    pub(crate) last: Hash,
}

impl Manifest {
    /// Reads `dir/manifest.json`.
    pub fn read(dir: &Path) -> Result<Manifest, AuditError> {
        let path = dir.join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&path).map_err(|source| AuditError::NoManifest {
            path: path.clone(),
            dir: dir.to_owned(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|source| AuditError::NotAManifest { path, source })
    }

    /// Writes `dir/manifest.json` (pretty-printed, with a final newline) and returns its path.
    pub fn write(&self, dir: &Path) -> Result<PathBuf, AuditError> {
        let path = dir.join(MANIFEST_FILE);
        let mut text = serde_json::to_string_pretty(self)?;
        text.push('\n');
        std::fs::write(&path, text).map_err(|source| AuditError::Write {
            path: path.clone(),
            source,
        })?;
        Ok(path)
    }

    /// Checks what the manifest says about itself (format, events file, range) and reads its
    /// hashes; what is wrong is a verdict on the export.
    pub(crate) fn seal(&self) -> Result<Seal, ExportBroken> {
        let bad = |reason: String| ExportBroken::Manifest(reason);
        if self.format != MANIFEST_FORMAT || self.format_version != MANIFEST_VERSION {
            return Err(bad(format!(
                "format `{}` version {} is not `{MANIFEST_FORMAT}` version {MANIFEST_VERSION}",
                self.format, self.format_version
            )));
        }
        if self.events_file != self.encoding.file_name() {
            return Err(bad(format!(
                "events_file `{}` is not `{}`",
                self.events_file,
                self.encoding.file_name()
            )));
        }
        if self.from == 0 || self.to < self.from {
            return Err(bad(format!(
                "the range {}..={} is empty",
                self.from, self.to
            )));
        }
        let hash = |text: &str, field: &str| {
            parse_hash(text).ok_or_else(|| bad(format!("{field} is not 64 hex digits")))
        };
        Ok(Seal {
            first_prev: hash(&self.first_prev_hash, "first_prev_hash")?,
            first: hash(&self.first_hash, "first_hash")?,
            last: hash(&self.last_hash, "last_hash")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        let hash = |byte: u8| hex::encode([byte; 32]);
        Manifest {
            format: MANIFEST_FORMAT.into(),
            format_version: MANIFEST_VERSION,
            events_file: "events.csv".into(),
            encoding: Format::Csv,
            from: 11,
            to: 20,
            count: 10,
            first_prev_hash: hash(1),
            first_hash: hash(2),
            last_hash: hash(3),
            events_sha256: hash(4),
            ledger_head: ManifestHead {
                position: 25,
                hash: hash(5),
            },
            exported_at: "2026-03-01T09:00:00.000000Z".into(),
            source: "postgres://auditor:***@db/ledger".into(),
            tool: "opledger 0.1.0".into(),
        }
    }

    #[test]
    fn a_manifest_round_trips_in_its_documented_layout() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = manifest().write(dir.path()).expect("write");
        let text = std::fs::read_to_string(&path).expect("read");
        let keys: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("  \"")?.split('"').next())
            .collect();
        assert_eq!(
            keys,
            [
                "format",
                "format_version",
                "events_file",
                "encoding",
                "from",
                "to",
                "count",
                "first_prev_hash",
                "first_hash",
                "last_hash",
                "events_sha256",
                "ledger_head",
                "exported_at",
                "source",
                "tool"
            ]
        );
        assert!(text.contains("\"encoding\": \"csv\",\n") && text.ends_with("}\n"));
        assert_eq!(Manifest::read(dir.path()).expect("read"), manifest());
        let seal = manifest().seal().expect("a valid manifest");
        assert_eq!(seal.first_prev, Hash::from_slice(&[1; 32]).unwrap());
        assert_eq!(seal.last, Hash::from_slice(&[3; 32]).unwrap());
    }

    #[test]
    fn a_manifest_that_contradicts_itself_is_a_broken_export() {
        let broken = |change: fn(&mut Manifest)| {
            let mut manifest = manifest();
            change(&mut manifest);
            manifest.seal().expect_err("broken").to_string()
        };
        assert_eq!(
            broken(|m| m.format_version = 2),
            "the manifest: format `opledger-audit-export` version 2 is not `opledger-audit-export` version 1"
        );
        assert_eq!(
            broken(|m| m.encoding = Format::Jsonl),
            "the manifest: events_file `events.csv` is not `events.jsonl`"
        );
        assert_eq!(
            broken(|m| m.to = 10),
            "the manifest: the range 11..=10 is empty"
        );
        assert_eq!(
            broken(|m| m.first_hash = "00".into()),
            "the manifest: first_hash is not 64 hex digits"
        );
        let dir = tempfile::tempdir().expect("temporary directory");
        std::fs::write(dir.path().join(MANIFEST_FILE), "{\"format\": 1}").expect("write");
        assert!(matches!(
            Manifest::read(dir.path()),
            Err(AuditError::NotAManifest { .. })
        ));
    }
}
