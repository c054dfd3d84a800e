//! Verifying an export without any database (`opledger audit verify --export DIR`): the
//! manifest, then every record in order through the same chain check as a ledger's
//! ([`ChainCheck`]), then the count, both end hashes and the file's SHA-256.

use std::path::{Path, PathBuf};
use std::time::Instant;

use opledger_store::Head;
use opledger_store::verify::ChainCheck;
use serde::Serialize;

use crate::error::AuditError;
use crate::events_file::{EventsReader, ExportedEvent};
use crate::manifest::Manifest;
use crate::verdict::{BrokenLink, Checkpoint, ExportBroken, HashAt, Report, rate};

/// What verifying an export found, and how long it took.
#[derive(Debug)]
pub struct ExportReport {
    /// The export folder.
    pub dir: PathBuf,
    pub manifest: Manifest,
    /// Records that passed the chain check.
    pub events: u64,
    /// The last record that passed.
    pub last: Option<Head>,
    /// The first thing found wrong.
    pub broken: Option<ExportBroken>,
    pub seconds: f64,
}

/// Verifies the export in `dir`; `expect_head` is a hash kept elsewhere for a position inside
/// the export. `Err` only when the folder's files cannot be read (or the manifest is not one);
/// what is wrong with the export is in [`ExportReport::broken`].
pub fn verify_export(
    dir: &Path,
    expect_head: Option<Checkpoint>,
) -> Result<ExportReport, AuditError> {
    let started = Instant::now();
    let manifest = Manifest::read(dir)?;
    let (events, last, broken) = check(dir, &manifest, expect_head)?;
    Ok(ExportReport {
        dir: dir.to_owned(),
        manifest,
        events,
        last,
        broken,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Checks the events file against the manifest, record by record, then as a whole: how many
/// records passed, the last one, and the first thing wrong.
fn check(
    dir: &Path,
    manifest: &Manifest,
    expect: Option<Checkpoint>,
) -> Result<(u64, Option<Head>, Option<ExportBroken>), AuditError> {
    let seal = match manifest.seal() {
        Ok(seal) => seal,
        Err(broken) => return Ok((0, None, Some(broken))),
    };
    if let Some(checkpoint) = expect
        && !(manifest.from..=manifest.to).contains(&checkpoint.position)
    {
        let outside = ExportBroken::CheckpointOutside {
            position: checkpoint.position,
            from: manifest.from,
            to: manifest.to,
        };
        return Ok((0, None, Some(outside)));
    }
    let mut file = EventsReader::open(&dir.join(&manifest.events_file), manifest.encoding)?;
    let mut chain = ChainCheck::starting_at(manifest.from, seal.first_prev).with_checkpoint(expect);
    let mut first_hash = None;
    let broken = file.each(|line, record| {
        let position = manifest.from + chain.checked();
        let event = match record.and_then(ExportedEvent::decode) {
            Ok(event) => event,
            Err(reason) => {
                return Some(ExportBroken::Unreadable {
                    line,
                    position,
                    reason,
                });
            }
        };
        if let Err(broken) = chain.check(&event) {
            return Some(ExportBroken::Chain(broken));
        }
        first_hash.get_or_insert(event.hash);
        None
    })?;
    // The digest covers the whole file, even what follows a broken record.
    let digest = file.finish()?;
    let events = chain.checked();
    let last = (events > 0).then(|| chain.last());
    let broken = broken
        .or_else(|| chain.finish().err().map(ExportBroken::Chain))
        .or_else(|| {
            (events != manifest.count || manifest.count != manifest.to - manifest.from + 1)
                .then_some(ExportBroken::Count {
                    manifest: manifest.count,
                    found: events,
                    from: manifest.from,
                    to: manifest.to,
                })
        })
        .or_else(|| {
            (first_hash != Some(seal.first)).then_some(ExportBroken::EndHash {
                which: "first",
                position: manifest.from,
            })
        })
        .or_else(|| {
            (chain.last().hash != seal.last).then_some(ExportBroken::EndHash {
                which: "last",
                position: manifest.to,
            })
        })
        .or_else(|| {
            (digest != manifest.events_sha256).then(|| ExportBroken::Digest {
                manifest: manifest.events_sha256.clone(),
                found: digest.clone(),
            })
        });
    Ok((events, last, broken))
}

/// `opledger audit verify --export DIR --json`.
#[derive(Serialize)]
struct ExportJson {
    ok: bool,
    export: String,
    from: u64,
    to: u64,
    events: u64,
    seconds: f64,
    events_per_sec: f64,
    peak_rss_bytes: Option<u64>,
    last: Option<HashAt>,
    broken: Option<BrokenLink>,
}

impl Report for ExportReport {
    fn to_json(&self, peak_rss_bytes: Option<u64>) -> serde_json::Result<String> {
        let broken = self.broken();
        serde_json::to_string(&ExportJson {
            ok: broken.is_none(),
            export: self.dir.display().to_string(),
            from: self.manifest.from,
            to: self.manifest.to,
            events: self.events,
            seconds: self.seconds,
            events_per_sec: rate(self.events, self.seconds),
            peak_rss_bytes,
            last: self.last.map(HashAt::from),
            broken,
        })
    }

    fn ok_lines(&self) -> Vec<String> {
        if self.broken.is_some() {
            return Vec::new();
        }
        let Manifest {
            from,
            to,
            first_prev_hash,
            last_hash,
            ..
        } = &self.manifest;
        vec![format!(
            "ok: the export in {} holds positions {from}..={to} ({} events), every hash recomputed from {first_prev_hash} to {last_hash}, and its SHA-256 matches the manifest",
            self.dir.display(),
            self.events,
        )]
    }

    fn broken(&self) -> Option<BrokenLink> {
        let broken = self.broken.as_ref()?;
        Some(BrokenLink::new(
            format!("the export in {}", self.dir.display()),
            broken,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events_file::Format;
    use crate::export::tests::{clock, ledger, options};
    use crate::export::{ExportOptions, export};
    use crate::verdict::{Broken, Finding};

    /// Exports a ledger of 20 events in `format`, changes its events file with `tamper`, and
    /// verifies it.
    async fn tampered(format: Format, tamper: impl FnOnce(&mut Vec<String>)) -> ExportReport {
        let dir = tempfile::tempdir().expect("temporary directory");
        let reader = ledger(dir.path(), 20).await;
        let out = dir.path().join("export");
        let options = ExportOptions {
            format,
            ..options(out.clone(), 1, None)
        };
        let exported = export(&reader, &options, &clock()).await.expect("export");
        reader.close().await;
        let text = std::fs::read_to_string(&exported.events_path).expect("read");
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        tamper(&mut lines);
        std::fs::write(&exported.events_path, lines.join("\n") + "\n").expect("write");
        verify_export(&out, None).expect("an export that can be read")
    }

    /// Changes one base64 character of a record's payload into another.
    fn change_payload(line: &mut String) {
        let start = line.find("eyJ").expect("a payload") + 3;
        let replacement = if &line[start..=start] == "A" {
            "B"
        } else {
            "A"
        };
        line.replace_range(start..=start, replacement);
    }

    #[tokio::test]
    async fn an_untouched_export_verifies_in_both_formats() {
        for format in [Format::Jsonl, Format::Csv] {
            let report = tampered(format, |_| {}).await;
            assert!(report.broken.is_none(), "{format:?}: {:?}", report.broken);
            assert_eq!(report.events, 20);
            assert_eq!(report.last.map(|h| h.position), Some(20));
            assert!(report.ok_lines()[0].starts_with("ok: the export in "));
            assert!(report.to_json(None).unwrap().starts_with(r#"{"ok":true,"#));
        }
    }

    #[tokio::test]
    async fn a_changed_byte_is_the_altered_event() {
        let report = tampered(Format::Jsonl, |lines| change_payload(&mut lines[7])).await;
        assert!(matches!(
            report.broken,
            Some(ExportBroken::Chain(Broken::HashMismatch { position: 8 }))
        ));
        let link = report.broken().expect("broken");
        assert_eq!((link.position, link.kind), (Some(8), "hash_mismatch"));
        assert!(link.to_string().ends_with(
            "is broken at position 8: event 8 was altered: its stored hash does not match its content"
        ));
        assert!(report.ok_lines().is_empty());
        // In CSV, line 1 is the header.
        let report = tampered(Format::Csv, |lines| change_payload(&mut lines[3])).await;
        assert_eq!(report.broken.as_ref().and_then(Finding::position), Some(3));
    }

    #[tokio::test]
    async fn removed_lines_are_a_gap_or_a_short_count() {
        let report = tampered(Format::Jsonl, |lines| drop(lines.remove(14))).await;
        assert!(matches!(
            report.broken,
            Some(ExportBroken::Chain(Broken::PositionGap {
                expected: 15,
                found: 16
            }))
        ));
        let report = tampered(Format::Jsonl, |lines| drop(lines.pop())).await;
        assert!(
            matches!(
                report.broken,
                Some(ExportBroken::Count {
                    manifest: 20,
                    found: 19,
                    ..
                })
            ),
            "{:?}",
            report.broken
        );
        assert_eq!(report.broken().unwrap().position, Some(20));
    }

    #[tokio::test]
    async fn a_change_every_record_survives_is_caught_by_the_digest() {
        let report = tampered(Format::Jsonl, |lines| lines[3].push(' ')).await;
        assert!(matches!(report.broken, Some(ExportBroken::Digest { .. })));
        assert_eq!(report.broken().unwrap().position, None);
    }

    #[tokio::test]
    async fn an_unreadable_record_is_named_by_its_line() {
        let report = tampered(Format::Jsonl, |lines| lines[4].truncate(20)).await;
        assert!(
            matches!(
                report.broken,
                Some(ExportBroken::Unreadable {
                    line: 5,
                    position: 5,
                    ..
                })
            ),
            "{:?}",
            report.broken
        );
    }
}
