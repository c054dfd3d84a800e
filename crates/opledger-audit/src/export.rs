//! Writing an export (`opledger audit export`): a range of events into an events file, then the
//! manifest that seals it, read through a read-only [`LedgerReader`] page by page.

use std::path::{Path, PathBuf};
use std::time::Instant;

use opledger_ledger::Clock;
use opledger_store::{LedgerReader, Position};

use crate::error::AuditError;
use crate::events_file::{EventsWriter, ExportedEvent, Format, timestamp};
use crate::manifest::{MANIFEST_FILE, MANIFEST_FORMAT, MANIFEST_VERSION, Manifest, ManifestHead};
use crate::verdict::rate;

/// Events per read.
const PAGE: usize = 4096;

/// What to export, and where.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// The first position to export (at least 1).
    pub from: Position,
    /// The last position to export; `None`: the head.
    pub to: Option<Position>,
    pub format: Format,
    /// The folder to write into: created if missing, refused if not empty unless `force`.
    pub out: PathBuf,
    /// Write into a folder that is not empty, replacing an earlier export's files there.
    pub force: bool,
    /// The ledger's URL without its password, for the manifest.
    pub source: String,
    /// The program writing the export ("opledger 0.1.0"), for the manifest.
    pub tool: String,
}

/// What an export wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Exported {
    pub from: Position,
    pub to: Position,
    pub count: u64,
    pub events_path: PathBuf,
    pub manifest_path: PathBuf,
    /// From the first event read to the manifest written.
    pub seconds: f64,
}

impl Exported {
    pub fn events_per_sec(&self) -> f64 {
        rate(self.count, self.seconds)
    }
}

/// Exports the events `options.from..=options.to` of the ledger behind `reader` into
/// `options.out` (`events.jsonl` or `events.csv`, then `manifest.json`), with `clock`'s time as
/// `exported_at`. The events must be there without a gap: a ledger that is not whole is not
/// exported.
pub async fn export(
    reader: &LedgerReader,
    options: &ExportOptions,
    clock: &dyn Clock,
) -> Result<Exported, AuditError> {
    let ExportOptions { from, format, .. } = *options;
    let head = reader.head().await?;
    let to = options.to.unwrap_or(head.position);
    if head.position == 0 {
        return Err(AuditError::EmptyLedger);
    }
    if to > head.position {
        return Err(AuditError::BeyondHead {
            to,
            head: head.position,
        });
    }
    if from > to {
        return Err(AuditError::FromAfterTo { from, to });
    }
    prepare_folder(&options.out, options.force)?;
    let started = Instant::now();
    let events_path = options.out.join(format.file_name());
    let mut file = EventsWriter::create(events_path.clone(), format)?;
    let mut pages = reader.read_ahead(from, to, PAGE);
    let (mut count, mut first, mut last) = (0, None, None);
    let mut expected = from;
    while let Some(page) = pages.recv().await {
        for event in page? {
            if event.position != expected {
                return Err(AuditError::LedgerGap {
                    expected,
                    found: event.position,
                });
            }
            expected += 1;
            file.write(&ExportedEvent::new(&event))?;
            count += 1;
            first.get_or_insert((event.prev_hash, event.hash));
            last = Some(event.hash);
        }
    }
    let ends = AuditError::LedgerEnds {
        last: expected - 1,
        to,
    };
    if expected != to + 1 {
        return Err(ends);
    }
    let events_sha256 = file.finish()?;
    let ((first_prev, first_hash), last) = first.zip(last).ok_or(ends)?;
    let manifest = Manifest {
        format: MANIFEST_FORMAT.to_owned(),
        format_version: MANIFEST_VERSION,
        events_file: format.file_name().to_owned(),
        encoding: format,
        from,
        to,
        count,
        first_prev_hash: first_prev.to_hex(),
        first_hash: first_hash.to_hex(),
        last_hash: last.to_hex(),
        events_sha256,
        ledger_head: ManifestHead {
            position: head.position,
            hash: head.hash.to_hex(),
        },
        exported_at: timestamp(clock.now()),
        source: options.source.clone(),
        tool: options.tool.clone(),
    };
    let manifest_path = manifest.write(&options.out)?;
    Ok(Exported {
        from,
        to,
        count,
        events_path,
        manifest_path,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Makes `dir` ready for an export: created if missing; if it has files, refused unless
/// `force`, which removes an earlier export's files.
fn prepare_folder(dir: &Path, force: bool) -> Result<(), AuditError> {
    std::fs::create_dir_all(dir).map_err(|source| AuditError::CreateFolder {
        dir: dir.to_owned(),
        source,
    })?;
    let mut entries = std::fs::read_dir(dir).map_err(|source| AuditError::Read {
        path: dir.to_owned(),
        source,
    })?;
    if entries.next().is_none() {
        return Ok(());
    }
    if !force {
        return Err(AuditError::FolderNotEmpty {
            dir: dir.to_owned(),
        });
    }
    for name in [
        MANIFEST_FILE,
        Format::Jsonl.file_name(),
        Format::Csv.file_name(),
    ] {
        match std::fs::remove_file(dir.join(name)) {
            Err(source) if source.kind() != std::io::ErrorKind::NotFound => {
                return Err(AuditError::Replace { name, source });
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use chrono::DateTime;
    use opledger_ledger::ManualClock;
    use opledger_store::{
        AppendRequest, EventStore, ExpectedVersion, NewEvent, SqliteOptions, SqliteStore, StreamId,
    };

    use super::*;

    /// A SQLite ledger in `dir` with `events` events over three streams, read-only.
    pub(crate) async fn ledger(dir: &Path, events: u64) -> LedgerReader {
        let url = format!("sqlite://{}", dir.join("ledger.db").display());
        let store = SqliteStore::open(&url, SqliteOptions::default())
            .await
            .expect("open");
        for n in 0..events {
            let stream = StreamId::new(format!("s-{}", n % 3)).expect("stream id");
            let payload = serde_json::json!({ "n": n, "text": "naïve, \"quoted\"\nline" });
            let event = NewEvent::from_serialize("Tested", 1, &payload, &serde_json::json!({}))
                .expect("event");
            let request = AppendRequest::new(stream, ExpectedVersion::Any, vec![event]);
            store.append(vec![request]).await.expect("append");
        }
        store.close().await;
        LedgerReader::open(&url).await.expect("open read-only")
    }

    /// Options that export `from..=to` of a test ledger into `out`.
    pub(crate) fn options(out: PathBuf, from: Position, to: Option<Position>) -> ExportOptions {
        ExportOptions {
            from,
            to,
            format: Format::Jsonl,
            out,
            force: false,
            source: "sqlite://ledger.db".into(),
            tool: "opledger test".into(),
        }
    }

    pub(crate) fn clock() -> ManualClock {
        ManualClock::new(DateTime::from_timestamp_micros(1_764_000_000_000_001).unwrap())
    }

    #[tokio::test]
    async fn an_export_writes_the_range_and_a_manifest_that_seals_it() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let reader = ledger(dir.path(), 12).await;
        let events = reader.read_range(1, 12, 100).await.expect("read");
        let out = dir.path().join("export");
        let exported = export(&reader, &options(out.clone(), 4, Some(9)), &clock())
            .await
            .expect("export");
        assert_eq!((exported.from, exported.to, exported.count), (4, 9, 6));
        let lines: Vec<ExportedEvent> = std::fs::read_to_string(&exported.events_path)
            .expect("read")
            .lines()
            .map(|l| serde_json::from_str(l).expect("a record"))
            .collect();
        assert_eq!(
            lines,
            events[3..9]
                .iter()
                .map(ExportedEvent::new)
                .collect::<Vec<_>>()
        );
        let manifest = Manifest::read(&out).expect("manifest");
        assert_eq!(manifest.first_prev_hash, events[2].hash.to_hex());
        assert_eq!(manifest.first_hash, events[3].hash.to_hex());
        assert_eq!(manifest.last_hash, events[8].hash.to_hex());
        assert_eq!(manifest.ledger_head.position, 12);
        assert_eq!(manifest.exported_at, "2025-11-24T16:00:00.000001Z");
        assert_eq!(manifest.source, "sqlite://ledger.db");
        reader.close().await;
    }

    #[tokio::test]
    async fn an_export_refuses_a_range_beyond_the_head_and_a_folder_with_files() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let reader = ledger(dir.path(), 5).await;
        let out = dir.path().join("export");
        let beyond = export(&reader, &options(out.clone(), 1, Some(6)), &clock()).await;
        assert!(
            matches!(&beyond, Err(e @ AuditError::BeyondHead { to: 6, head: 5 }) if e.is_usage())
        );
        let after = export(&reader, &options(out.clone(), 5, Some(4)), &clock()).await;
        assert!(matches!(
            after,
            Err(AuditError::FromAfterTo { from: 5, to: 4 })
        ));
        export(&reader, &options(out.clone(), 1, None), &clock())
            .await
            .expect("export");
        let again = export(&reader, &options(out.clone(), 1, None), &clock()).await;
        assert!(matches!(again, Err(AuditError::FolderNotEmpty { .. })));
        let forced = ExportOptions {
            force: true,
            format: Format::Csv,
            ..options(out.clone(), 2, None)
        };
        export(&reader, &forced, &clock()).await.expect("replace");
        assert!(
            !out.join("events.jsonl").exists(),
            "the earlier export is replaced"
        );
        reader.close().await;
    }
}
