//! `opledger audit`: prove that the history is untouched.
//!
//! - `verify` recomputes the whole hash chain and checks positions, stream versions, event ids,
//!   the head row and the `streams` table (`opledger_store::verify`), or, with `--export DIR`,
//!   re-verifies an export offline, without any database;
//! - `export` writes a range of events, every stored field with payload and metadata as their
//!   exact bytes, and a manifest that seals the file (`docs/audit.md` describes the format and
//!   how anyone can check it without opledger);
//! - `head` prints the current head (position and hash) to keep somewhere else, so that
//!   `verify --expect-head` detects even a rewrite of the whole chain.
//!
//! A broken ledger or export is an error (exit code 1) that names the first broken link.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::DateTime;
use opledger_server::{Clock, SystemClock};
use opledger_store::verify::{self, Broken, ChainCheck, Checkpoint};
use opledger_store::{Hash, Position, RecordedEvent, StreamId};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::BadUsage;
use crate::database::{open_reader, redact};
use crate::output::{Output, peak_rss_bytes, timestamp};

#[derive(Debug, clap::Subcommand)]
pub(crate) enum Audit {
    /// Recompute the hash chain and check positions, stream versions, event ids and the head;
    /// exit with 1 naming the first broken link. With --export, check an export offline.
    Verify(VerifyArgs),
    /// Write events and a manifest that seals them, for keeping or checking elsewhere.
    Export(ExportArgs),
    /// Print the current head (position and hash), to keep somewhere else.
    Head(HeadArgs),
}

impl Audit {
    pub(crate) async fn run(self, url: &str) -> anyhow::Result<()> {
        match self {
            Audit::Verify(args) => match args.export.clone() {
                Some(dir) => verify_export(&dir, &args),
                None => verify_ledger(url, &args).await,
            },
            Audit::Export(args) => export(url, &args).await,
            Audit::Head(args) => head(url, &args).await,
        }
    }
}

#[derive(Debug, clap::Args)]
pub(crate) struct VerifyArgs {
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// A head kept elsewhere (as `opledger audit head` prints it): the ledger must still hold
    /// this hash at this position.
    #[arg(long, value_name = "POSITION:HASH")]
    expect_head: Option<Checkpoint>,
    /// Check the export in DIR (made by `opledger audit export`) instead of the ledger; needs
    /// no database.
    #[arg(long, value_name = "DIR")]
    export: Option<PathBuf>,
}

/// What is broken, for `--json`.
#[derive(Serialize)]
struct BrokenJson {
    position: Option<Position>,
    kind: &'static str,
    message: String,
}

#[derive(Serialize)]
struct HeadJson {
    position: Position,
    hash: String,
}

#[derive(Serialize)]
struct VerifyJson {
    ok: bool,
    events: u64,
    streams: u64,
    seconds: f64,
    events_per_sec: f64,
    peak_rss_bytes: Option<u64>,
    head: HeadJson,
    broken: Option<BrokenJson>,
}

fn rate(events: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        events as f64 / seconds
    } else {
        0.0
    }
}

async fn verify_ledger(url: &str, args: &VerifyArgs) -> anyhow::Result<()> {
    let reader = open_reader(url).await?;
    let started = Instant::now();
    let verification = verify::verify(&reader, args.expect_head).await?;
    let seconds = started.elapsed().as_secs_f64();
    reader.close().await;
    let events_per_sec = rate(verification.events, seconds);
    let mut out = Output::stdout();
    if args.json {
        let json = VerifyJson {
            ok: verification.broken.is_none(),
            events: verification.events,
            streams: verification.streams,
            seconds,
            events_per_sec,
            peak_rss_bytes: peak_rss_bytes(),
            head: HeadJson {
                position: verification.head.position,
                hash: verification.head.hash.to_hex(),
            },
            broken: verification.broken.as_ref().map(|b| BrokenJson {
                position: b.position(),
                kind: b.kind(),
                message: b.to_string(),
            }),
        };
        out.line(format_args!("{}", serde_json::to_string(&json)?))?;
    } else if verification.broken.is_none() {
        out.line(format_args!(
            "ok: {} events in {} streams verified in {seconds:.2} s ({events_per_sec:.0} events/s)",
            verification.events, verification.streams
        ))?;
        out.line(format_args!(
            "head: position {}, hash {}",
            verification.head.position, verification.head.hash
        ))?;
        if let Some(expected) = args.expect_head {
            out.line(format_args!("the kept head {expected} is in the chain"))?;
        }
    }
    out.finish()?;
    match verification.broken {
        None => Ok(()),
        Some(broken) => bail!("{}", broken_message(&broken)),
    }
}

fn broken_message(broken: &Broken) -> String {
    match broken.position() {
        Some(position) => format!("the ledger is broken at position {position}: {broken}"),
        None => format!("the ledger is broken: {broken}"),
    }
}

#[derive(Debug, clap::Args)]
pub(crate) struct HeadArgs {
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

async fn head(url: &str, args: &HeadArgs) -> anyhow::Result<()> {
    let reader = open_reader(url).await?;
    let head = reader.head().await?;
    let recorded_at = match head.position {
        0 => None,
        position => reader
            .read_range(position, position, 1)
            .await?
            .first()
            .map(|event| timestamp(event.recorded_at)),
    };
    reader.close().await;
    let checkpoint = Checkpoint::from(head);
    let mut out = Output::stdout();
    if args.json {
        let json = serde_json::json!({
            "position": head.position,
            "hash": head.hash.to_hex(),
            "recorded_at": recorded_at,
            "checkpoint": checkpoint.to_string(),
        });
        out.line(format_args!("{json}"))?;
    } else {
        out.line(format_args!("position     {}", head.position))?;
        out.line(format_args!("hash         {}", head.hash))?;
        if let Some(recorded_at) = recorded_at {
            out.line(format_args!("recorded_at  {recorded_at}"))?;
        }
        if head.position > 0 {
            out.line(format_args!(
                "keep it elsewhere; check later with: opledger audit verify --expect-head {checkpoint}"
            ))?;
        }
    }
    out.finish()?;
    Ok(())
}

/// The two formats of an export's events file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Format {
    /// JSON Lines: one object per event.
    Jsonl,
    /// CSV with a header row, quoted where needed (RFC 4180).
    Csv,
}

impl Format {
    fn file_name(self) -> &'static str {
        match self {
            Format::Jsonl => "events.jsonl",
            Format::Csv => "events.csv",
        }
    }
}

#[derive(Debug, clap::Args)]
pub(crate) struct ExportArgs {
    /// The first position to export.
    #[arg(long, value_name = "POS", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..))]
    from: u64,
    /// The last position to export [default: the head].
    #[arg(long, value_name = "POS", value_parser = clap::value_parser!(u64).range(1..))]
    to: Option<u64>,
    /// The events file's format.
    #[arg(long, value_enum, default_value_t = Format::Jsonl)]
    format: Format,
    /// The folder to write `events.jsonl` (or `events.csv`) and `manifest.json` into; created
    /// if missing, refused if not empty (unless --force).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Write into a folder that is not empty, replacing an earlier export there.
    #[arg(long)]
    force: bool,
}

/// One exported event: every stored field. Payload and metadata are the exact stored bytes in
/// standard base64, so that any tool recomputes the hash from exactly what was hashed;
/// `recorded_at_micros` is the hashed time, `recorded_at` the same instant for people.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExportedEvent {
    position: Position,
    stream_id: String,
    version: u64,
    event_id: String,
    event_type: String,
    schema_version: u32,
    payload_base64: String,
    metadata_base64: String,
    recorded_at: String,
    recorded_at_micros: i64,
    prev_hash: String,
    hash: String,
}

impl ExportedEvent {
    fn new(event: &RecordedEvent) -> Self {
        ExportedEvent {
            position: event.position,
            stream_id: event.stream_id.to_string(),
            version: event.version,
            event_id: event.event_id.to_string(),
            event_type: event.event_type.clone(),
            schema_version: event.schema_version,
            payload_base64: BASE64.encode(&event.payload),
            metadata_base64: BASE64.encode(&event.metadata),
            recorded_at: timestamp(event.recorded_at),
            recorded_at_micros: event.recorded_at.timestamp_micros(),
            prev_hash: event.prev_hash.to_hex(),
            hash: event.hash.to_hex(),
        }
    }

    /// The event as stored, or what in the line cannot be read.
    fn decode(self) -> Result<RecordedEvent, String> {
        let hash = |text: &str, field: &str| {
            hex::decode(text)
                .ok()
                .and_then(|bytes| Hash::from_slice(&bytes))
                .ok_or_else(|| format!("{field} is not 64 hex digits"))
        };
        let recorded_at = DateTime::from_timestamp_micros(self.recorded_at_micros)
            .ok_or("recorded_at_micros is out of range")?;
        if timestamp(recorded_at) != self.recorded_at {
            return Err(format!(
                "recorded_at {} is not recorded_at_micros {}",
                self.recorded_at, self.recorded_at_micros
            ));
        }
        Ok(RecordedEvent {
            position: self.position,
            stream_id: StreamId::new(self.stream_id).map_err(|e| format!("stream_id: {e}"))?,
            version: self.version,
            event_id: self
                .event_id
                .parse()
                .map_err(|_| "event_id is not a UUID".to_owned())?,
            event_type: self.event_type,
            schema_version: self.schema_version,
            payload: BASE64
                .decode(&self.payload_base64)
                .map_err(|e| format!("payload_base64: {e}"))?,
            metadata: BASE64
                .decode(&self.metadata_base64)
                .map_err(|e| format!("metadata_base64: {e}"))?,
            recorded_at,
            prev_hash: hash(&self.prev_hash, "prev_hash")?,
            hash: hash(&self.hash, "hash")?,
        })
    }
}

/// What `manifest.json` says about an export.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    /// Always [`MANIFEST_FORMAT`].
    format: String,
    format_version: u32,
    /// The events file, beside the manifest.
    events_file: String,
    encoding: Format,
    from: Position,
    to: Position,
    count: u64,
    /// The `prev_hash` of the event at `from`: where the exported chain hangs on.
    first_prev_hash: String,
    first_hash: String,
    last_hash: String,
    /// SHA-256 of the events file's bytes, hex.
    events_sha256: String,
    /// The ledger's head when the export was made.
    ledger_head: ManifestHead,
    exported_at: String,
    /// The ledger's URL, without its password.
    source: String,
    /// The opledger that wrote the export.
    tool: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ManifestHead {
    position: Position,
    hash: String,
}

const MANIFEST_FORMAT: &str = "opledger-audit-export";
const MANIFEST_VERSION: u32 = 1;
const MANIFEST_FILE: &str = "manifest.json";
/// Events per read.
const PAGE: usize = 4096;

/// Computes the SHA-256 of everything written through it.
struct DigestWriter<W> {
    inner: W,
    digest: Sha256,
}

impl<W: Write> Write for DigestWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let written = self.inner.write(buf)?;
        self.digest.update(&buf[..written]);
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Computes the SHA-256 of everything read through it.
struct DigestReader<R> {
    inner: R,
    digest: Sha256,
}

impl<R: Read> Read for DigestReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let read = self.inner.read(buf)?;
        self.digest.update(&buf[..read]);
        Ok(read)
    }
}

/// Writes exported events in one of the formats.
enum Encoder<W: Write> {
    Jsonl(W),
    Csv(Box<csv::Writer<W>>),
}

impl<W: Write> Encoder<W> {
    fn write(&mut self, record: &ExportedEvent) -> anyhow::Result<()> {
        match self {
            Encoder::Jsonl(sink) => {
                serde_json::to_writer(&mut *sink, record)?;
                sink.write_all(b"\n")?;
            }
            Encoder::Csv(writer) => writer.serialize(record)?,
        }
        Ok(())
    }

    /// Flushes what is buffered and hands the sink back.
    fn finish(self) -> anyhow::Result<W> {
        let mut sink = match self {
            Encoder::Jsonl(sink) => sink,
            Encoder::Csv(writer) => writer.into_inner().map_err(|e| e.into_error())?,
        };
        sink.flush()?;
        Ok(sink)
    }
}

/// Makes `dir` ready for an export: created if missing; if it has files, refused unless
/// `force`, which removes an earlier export's files.
fn prepare_folder(dir: &Path, force: bool) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the folder {}", dir.display()))?;
    let mut entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    if entries.next().is_none() {
        return Ok(());
    }
    if !force {
        bail!(
            "{} is not empty; choose an empty folder, or pass --force to replace an export there",
            dir.display()
        );
    }
    for name in [
        MANIFEST_FILE,
        Format::Jsonl.file_name(),
        Format::Csv.file_name(),
    ] {
        match std::fs::remove_file(dir.join(name)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("cannot replace {name}"));
            }
            _ => {}
        }
    }
    Ok(())
}

async fn export(url: &str, args: &ExportArgs) -> anyhow::Result<()> {
    let reader = open_reader(url).await?;
    let head = reader.head().await?;
    let to = args.to.unwrap_or(head.position);
    if head.position == 0 {
        bail!("the ledger is empty: there is nothing to export");
    }
    if to > head.position {
        return Err(BadUsage(format!(
            "--to {to} is beyond the ledger's head at position {}",
            head.position
        ))
        .into());
    }
    if args.from > to {
        return Err(BadUsage(format!("--from {} is after --to {to}", args.from)).into());
    }
    prepare_folder(&args.out, args.force)?;
    let started = Instant::now();
    let path = args.out.join(args.format.file_name());
    let file = File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
    let sink = DigestWriter {
        inner: BufWriter::with_capacity(1 << 20, file),
        digest: Sha256::new(),
    };
    let mut encoder = match args.format {
        Format::Jsonl => Encoder::Jsonl(sink),
        Format::Csv => Encoder::Csv(Box::new(csv::Writer::from_writer(sink))),
    };
    let mut pages = reader.read_ahead(args.from, to, PAGE);
    let (mut count, mut first, mut last) = (0, None, None);
    let mut expected = args.from;
    while let Some(page) = pages.recv().await {
        for event in page? {
            if event.position != expected {
                bail!(
                    "position {expected} is missing from the ledger (found {} after it); run `opledger audit verify`",
                    event.position
                );
            }
            expected += 1;
            encoder.write(&ExportedEvent::new(&event))?;
            count += 1;
            if first.is_none() {
                first = Some((event.prev_hash, event.hash));
            }
            last = Some(event.hash);
        }
    }
    if expected != to + 1 {
        bail!(
            "the ledger ends at position {}, before --to {to}",
            expected - 1
        );
    }
    let DigestWriter { inner, digest } = encoder.finish()?;
    inner
        .into_inner()
        .map_err(|e| e.into_error())?
        .sync_all()
        .with_context(|| format!("cannot write {}", path.display()))?;
    reader.close().await;

    let (first_prev, first_hash) = first.context("no event was exported")?;
    let manifest = Manifest {
        format: MANIFEST_FORMAT.to_owned(),
        format_version: MANIFEST_VERSION,
        events_file: args.format.file_name().to_owned(),
        encoding: args.format,
        from: args.from,
        to,
        count,
        first_prev_hash: first_prev.to_hex(),
        first_hash: first_hash.to_hex(),
        last_hash: last.unwrap_or(first_hash).to_hex(),
        events_sha256: hex::encode(digest.finalize()),
        ledger_head: ManifestHead {
            position: head.position,
            hash: head.hash.to_hex(),
        },
        exported_at: timestamp(SystemClock.now()),
        source: redact(url),
        tool: format!("opledger {}", env!("CARGO_PKG_VERSION")),
    };
    let manifest_path = args.out.join(MANIFEST_FILE);
    let mut text = serde_json::to_string_pretty(&manifest)?;
    text.push('\n');
    std::fs::write(&manifest_path, text)
        .with_context(|| format!("cannot write {}", manifest_path.display()))?;
    let seconds = started.elapsed().as_secs_f64();
    let mut out = Output::stdout();
    out.line(format_args!(
        "exported {count} events (positions {}..={to}) to {} in {seconds:.2} s ({:.0} events/s)",
        args.from,
        path.display(),
        rate(count, seconds)
    ))?;
    out.line(format_args!(
        "manifest: {}; check it anywhere with: opledger audit verify --export {}",
        manifest_path.display(),
        args.out.display()
    ))?;
    out.finish()?;
    Ok(())
}

/// What is wrong with an export.
#[derive(Debug, thiserror::Error)]
enum ExportBroken {
    #[error("the manifest: {0}")]
    Manifest(String),
    #[error("line {line} (position {position}) cannot be read: {reason}")]
    Unreadable {
        line: u64,
        position: Position,
        reason: String,
    },
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
    #[error("position {position} of --expect-head is not in the export (positions {from}..={to})")]
    CheckpointOutside {
        position: Position,
        from: Position,
        to: Position,
    },
}

impl ExportBroken {
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
}

fn read_manifest(dir: &Path) -> anyhow::Result<Manifest> {
    let path = dir.join(MANIFEST_FILE);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "cannot read {}; is {} an export made by `opledger audit export`?",
            path.display(),
            dir.display()
        )
    })?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not an opledger export manifest", path.display()))
}

/// The manifest's hash fields, read.
struct Seal {
    first_prev: Hash,
    first: Hash,
    last: Hash,
}

fn check_manifest(manifest: &Manifest) -> Result<Seal, ExportBroken> {
    let bad = |reason: String| ExportBroken::Manifest(reason);
    if manifest.format != MANIFEST_FORMAT || manifest.format_version != MANIFEST_VERSION {
        return Err(bad(format!(
            "format `{}` version {} is not `{MANIFEST_FORMAT}` version {MANIFEST_VERSION}",
            manifest.format, manifest.format_version
        )));
    }
    if manifest.events_file != manifest.encoding.file_name() {
        return Err(bad(format!(
            "events_file `{}` is not `{}`",
            manifest.events_file,
            manifest.encoding.file_name()
        )));
    }
    if manifest.from == 0 || manifest.to < manifest.from {
        return Err(bad(format!(
            "the range {}..={} is empty",
            manifest.from, manifest.to
        )));
    }
    let hash = |text: &str, field: &str| {
        hex::decode(text)
            .ok()
            .and_then(|bytes| Hash::from_slice(&bytes))
            .ok_or_else(|| bad(format!("{field} is not 64 hex digits")))
    };
    Ok(Seal {
        first_prev: hash(&manifest.first_prev_hash, "first_prev_hash")?,
        first: hash(&manifest.first_hash, "first_hash")?,
        last: hash(&manifest.last_hash, "last_hash")?,
    })
}

/// The outcome of checking an export: events that passed, the last one, and what is broken.
struct ExportCheck {
    events: u64,
    last: Option<(Position, Hash)>,
    broken: Option<ExportBroken>,
}

/// Checks the events file against the manifest, line by line, then as a whole.
fn check_export(
    dir: &Path,
    manifest: &Manifest,
    expect: Option<Checkpoint>,
) -> anyhow::Result<ExportCheck> {
    let seal = match check_manifest(manifest) {
        Ok(seal) => seal,
        Err(broken) => {
            return Ok(ExportCheck {
                events: 0,
                last: None,
                broken: Some(broken),
            });
        }
    };
    if let Some(checkpoint) = expect
        && !(manifest.from..=manifest.to).contains(&checkpoint.position)
    {
        return Ok(ExportCheck {
            events: 0,
            last: None,
            broken: Some(ExportBroken::CheckpointOutside {
                position: checkpoint.position,
                from: manifest.from,
                to: manifest.to,
            }),
        });
    }
    let path = dir.join(&manifest.events_file);
    let file = File::open(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut source = DigestReader {
        inner: BufReader::with_capacity(1 << 20, file),
        digest: Sha256::new(),
    };
    let mut chain = ChainCheck::starting_at(manifest.from, seal.first_prev).with_checkpoint(expect);
    let mut first_hash = None;
    let mut broken = None;
    {
        let mut check = |line: u64, record: Result<ExportedEvent, String>| {
            let position = manifest.from + chain.checked();
            let event = record.and_then(ExportedEvent::decode).map_err(|reason| {
                ExportBroken::Unreadable {
                    line,
                    position,
                    reason,
                }
            })?;
            chain.check(&event).map_err(ExportBroken::Chain)?;
            first_hash.get_or_insert(event.hash);
            Ok::<(), ExportBroken>(())
        };
        match manifest.encoding {
            Format::Jsonl => {
                let mut lines = BufReader::new(&mut source).lines();
                let mut number = 0;
                while let Some(line) = lines.next().transpose()? {
                    number += 1;
                    let record = serde_json::from_str(&line).map_err(|e| e.to_string());
                    if let Err(problem) = check(number, record) {
                        broken = Some(problem);
                        break;
                    }
                }
            }
            Format::Csv => {
                let mut records = csv::Reader::from_reader(&mut source);
                let mut number = 1;
                for record in records.deserialize() {
                    number += 1;
                    let record = record.map_err(|e| e.to_string());
                    if let Err(problem) = check(number, record) {
                        broken = Some(problem);
                        break;
                    }
                }
            }
        }
    }
    // The digest covers the whole file, even what follows a broken line.
    std::io::copy(&mut source, &mut std::io::sink())?;
    let digest = hex::encode(source.digest.finalize());
    let events = chain.checked();
    let last = (events > 0).then(|| (chain.last().position, chain.last().hash));
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
    Ok(ExportCheck {
        events,
        last,
        broken,
    })
}

#[derive(Serialize)]
struct VerifyExportJson {
    ok: bool,
    export: String,
    from: Position,
    to: Position,
    events: u64,
    seconds: f64,
    events_per_sec: f64,
    peak_rss_bytes: Option<u64>,
    last: Option<HeadJson>,
    broken: Option<BrokenJson>,
}

fn verify_export(dir: &Path, args: &VerifyArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let manifest = read_manifest(dir)?;
    let check = check_export(dir, &manifest, args.expect_head)?;
    let seconds = started.elapsed().as_secs_f64();
    let mut out = Output::stdout();
    if args.json {
        let json = VerifyExportJson {
            ok: check.broken.is_none(),
            export: dir.display().to_string(),
            from: manifest.from,
            to: manifest.to,
            events: check.events,
            seconds,
            events_per_sec: rate(check.events, seconds),
            peak_rss_bytes: peak_rss_bytes(),
            last: check.last.map(|(position, hash)| HeadJson {
                position,
                hash: hash.to_hex(),
            }),
            broken: check.broken.as_ref().map(|b| BrokenJson {
                position: b.position(),
                kind: b.kind(),
                message: b.to_string(),
            }),
        };
        out.line(format_args!("{}", serde_json::to_string(&json)?))?;
    } else if check.broken.is_none() {
        out.line(format_args!(
            "ok: the export in {} holds positions {}..={} ({} events), every hash recomputed from {} to {}, and its SHA-256 matches the manifest",
            dir.display(),
            manifest.from,
            manifest.to,
            check.events,
            manifest.first_prev_hash,
            manifest.last_hash
        ))?;
    }
    out.finish()?;
    match check.broken {
        None => Ok(()),
        Some(broken @ ExportBroken::CheckpointOutside { .. }) => Err(BadUsage(format!(
            "cannot check --expect-head against the export in {}: {broken}",
            dir.display()
        ))
        .into()),
        Some(broken) => match broken.position() {
            Some(position) => bail!(
                "the export in {} is broken at position {position}: {broken}",
                dir.display()
            ),
            None => bail!("the export in {} is broken: {broken}", dir.display()),
        },
    }
}
