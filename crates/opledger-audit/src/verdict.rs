//! The verifier's verdicts, shared by the online check of a ledger ([`crate::online`]) and the
//! offline check of an export ([`crate::offline`]): what each found broken ([`Broken`] in a
//! ledger, [`ExportBroken`] in an export, both a [`Finding`]), the first broken link as it is
//! reported ([`BrokenLink`]: one JSON object, and the error that names it), and the [`Report`]
//! each check prints as text or JSON.

use std::fmt;

pub use opledger_store::verify::{BadCheckpoint, Broken, Checkpoint};
use opledger_store::{Head, Position};
use serde::Serialize;

use crate::error::RecordError;

/// Something broken that a verification found.
pub trait Finding: fmt::Display {
    /// The lowest position where it shows, if it has one.
    fn position(&self) -> Option<Position>;
    /// A stable snake_case name of what is wrong, for scripts.
    fn kind(&self) -> &'static str;
    /// Whether what was asked cannot be checked against what was verified (a kept head outside
    /// an export's range): the request is wrong, not the history.
    fn is_bad_request(&self) -> bool {
        false
    }
}

impl Finding for Broken {
    fn position(&self) -> Option<Position> {
        Broken::position(self)
    }

    fn kind(&self) -> &'static str {
        Broken::kind(self)
    }
}

/// What is wrong with an export.
#[derive(Debug, thiserror::Error)]
pub enum ExportBroken {
    /// The manifest contradicts itself.
    #[error("the manifest: {0}")]
    Manifest(String),
    #[error("line {line} (position {position}) cannot be read: {reason}")]
    Unreadable {
        line: u64,
        position: Position,
        reason: RecordError,
    },
    /// The exported chain is broken, as a ledger's would be.
    #[error("{0}")]
    Chain(Broken),
    #[error(
        "the manifest says {manifest} events (positions {from}..={to}), the file has {found}: lines were removed or added"
    )]
    Count {
        manifest: u64,
        found: u64,
        from: Position,
        to: Position,
    },
    #[error("the {which} event's hash is not the manifest's {which}_hash")]
    EndHash {
        which: &'static str,
        position: Position,
    },
    #[error(
        "the events file's SHA-256 is {found}, the manifest says {manifest}: the file was changed"
    )]
    Digest { manifest: String, found: String },
    /// The kept head to check is not in the exported range (a bad request).
    #[error("position {position} of --expect-head is not in the export (positions {from}..={to})")]
    CheckpointOutside {
        position: Position,
        from: Position,
        to: Position,
    },
}

impl Finding for ExportBroken {
    fn position(&self) -> Option<Position> {
        match self {
            ExportBroken::Unreadable { position, .. } | ExportBroken::EndHash { position, .. } => {
                Some(*position)
            }
            ExportBroken::Chain(broken) => broken.position(),
            ExportBroken::Count {
                manifest,
                found,
                from,
                ..
            } => Some(from + (*manifest).min(*found)),
            ExportBroken::Manifest(_)
            | ExportBroken::Digest { .. }
            | ExportBroken::CheckpointOutside { .. } => None,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            ExportBroken::Manifest(_) => "manifest",
            ExportBroken::Unreadable { .. } => "unreadable",
            ExportBroken::Chain(broken) => broken.kind(),
            ExportBroken::Count { .. } => "count",
            ExportBroken::EndHash { .. } => "end_hash",
            ExportBroken::Digest { .. } => "digest",
            ExportBroken::CheckpointOutside { .. } => "checkpoint_outside",
        }
    }

    fn is_bad_request(&self) -> bool {
        matches!(self, ExportBroken::CheckpointOutside { .. })
    }
}

/// The first broken link of what was verified, as it is reported: serialized, it is the JSON
/// object under `broken`; as an error, the one line that names it ("the ledger is broken at
/// position 23: position 23 is missing: …").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
pub struct BrokenLink {
    /// What was verified: "the ledger", "the export in DIR".
    #[serde(skip)]
    pub subject: String,
    pub position: Option<Position>,
    pub kind: &'static str,
    pub message: String,
    /// See [`Finding::is_bad_request`].
    #[serde(skip)]
    pub bad_request: bool,
}

impl BrokenLink {
    pub fn new(subject: impl Into<String>, finding: &impl Finding) -> Self {
        Self {
            subject: subject.into(),
            position: finding.position(),
            kind: finding.kind(),
            message: finding.to_string(),
            bad_request: finding.is_bad_request(),
        }
    }
}

impl fmt::Display for BrokenLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self {
            subject, message, ..
        } = self;
        match self.position {
            _ if self.bad_request => {
                write!(f, "cannot check --expect-head against {subject}: {message}")
            }
            Some(position) => write!(f, "{subject} is broken at position {position}: {message}"),
            None => write!(f, "{subject} is broken: {message}"),
        }
    }
}

/// What a verification reports: text lines or one JSON object, and its verdict.
pub trait Report {
    /// One JSON object (`--json`); `peak_rss_bytes` is the process's peak memory, which only the
    /// caller can measure.
    fn to_json(&self, peak_rss_bytes: Option<u64>) -> serde_json::Result<String>;
    /// The lines that say what was verified; none when something is broken (the error says it).
    fn ok_lines(&self) -> Vec<String>;
    /// The first broken link, or `None`: everything verified holds.
    fn broken(&self) -> Option<BrokenLink>;
}

/// A position and its hash, in JSON reports.
#[derive(Debug, Serialize)]
pub(crate) struct HashAt {
    position: Position,
    hash: String,
}

impl From<Head> for HashAt {
    fn from(head: Head) -> Self {
        HashAt {
            position: head.position,
            hash: head.hash.to_hex(),
        }
    }
}

/// Events per second (0 when no time passed).
pub fn rate(events: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        events as f64 / seconds
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_link_names_what_and_where() {
        let gap = Broken::PositionGap {
            expected: 23,
            found: 24,
        };
        let link = BrokenLink::new("the ledger", &gap);
        assert_eq!(
            link.to_string(),
            "the ledger is broken at position 23: position 23 is missing: the event after position 22 is at position 24 (events were removed or reordered)"
        );
        assert_eq!(
            serde_json::to_string(&link).unwrap(),
            format!(r#"{{"position":23,"kind":"position_gap","message":"{gap}"}}"#)
        );
        let digest = ExportBroken::Digest {
            manifest: "ab".into(),
            found: "cd".into(),
        };
        assert_eq!(
            BrokenLink::new("the export in x", &digest).to_string(),
            "the export in x is broken: the events file's SHA-256 is cd, the manifest says ab: the file was changed"
        );
        let outside = ExportBroken::CheckpointOutside {
            position: 30,
            from: 5,
            to: 20,
        };
        let link = BrokenLink::new("the export in x", &outside);
        assert!(link.bad_request);
        assert_eq!(link.kind, "checkpoint_outside");
        assert_eq!(
            link.to_string(),
            "cannot check --expect-head against the export in x: position 30 of --expect-head is not in the export (positions 5..=20)"
        );
    }

    #[test]
    fn a_count_that_disagrees_shows_where_the_shorter_side_ends() {
        let count = |manifest, found| ExportBroken::Count {
            manifest,
            found,
            from: 11,
            to: 20,
        };
        assert_eq!(count(10, 9).position(), Some(20));
        assert_eq!(count(9, 10).position(), Some(20));
        assert_eq!(count(10, 9).kind(), "count");
    }
}
