//! An export's events file: one record per event ([`ExportedEvent`]) in position order, as JSON
//! Lines or CSV ([`Format`]), written and read together with the SHA-256 of its bytes that the
//! manifest seals. `docs/audit.md` is the format's reference.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{DateTime, SecondsFormat, Utc};
use opledger_store::{Hash, Position, RecordedEvent, StreamId};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{AuditError, RecordError};

/// The two formats of an export's events file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// JSON Lines: one object per event.
    Jsonl,
    /// CSV with a header row, quoted where needed (RFC 4180).
    Csv,
}

impl Format {
    /// The events file's name in an export folder.
    pub fn file_name(self) -> &'static str {
        match self {
            Format::Jsonl => "events.jsonl",
            Format::Csv => "events.csv",
        }
    }
}

/// One exported event: every stored field. Payload and metadata are the exact stored bytes in
/// standard base64, so that any tool recomputes the hash from exactly what was hashed;
/// `recorded_at_micros` is the hashed time, `recorded_at` the same instant for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportedEvent {
    pub position: Position,
    pub stream_id: String,
    pub version: u64,
    pub event_id: String,
    pub event_type: String,
    pub schema_version: u32,
    pub payload_base64: String,
    pub metadata_base64: String,
    pub recorded_at: String,
    pub recorded_at_micros: i64,
    pub prev_hash: String,
    pub hash: String,
}

impl ExportedEvent {
    /// The record of a stored event.
    pub fn new(event: &RecordedEvent) -> Self {
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

    /// The event as stored, or what in the record cannot be read. Whether its hash is right is
    /// the chain check's business, not this.
    pub fn decode(self) -> Result<RecordedEvent, RecordError> {
        let hash = |text: &str, field| parse_hash(text).ok_or(RecordError::Hash { field });
        let recorded_at = DateTime::from_timestamp_micros(self.recorded_at_micros)
            .ok_or(RecordError::MicrosOutOfRange)?;
        if timestamp(recorded_at) != self.recorded_at {
            return Err(RecordError::TimeDisagrees {
                text: self.recorded_at,
                micros: self.recorded_at_micros,
            });
        }
        Ok(RecordedEvent {
            position: self.position,
            stream_id: StreamId::new(self.stream_id).map_err(RecordError::StreamId)?,
            version: self.version,
            event_id: self.event_id.parse().map_err(|_| RecordError::EventId)?,
            event_type: self.event_type,
            schema_version: self.schema_version,
            payload: BASE64
                .decode(&self.payload_base64)
                .map_err(RecordError::Payload)?,
            metadata: BASE64
                .decode(&self.metadata_base64)
                .map_err(RecordError::Metadata)?,
            recorded_at,
            prev_hash: hash(&self.prev_hash, "prev_hash")?,
            hash: hash(&self.hash, "hash")?,
        })
    }
}

/// RFC 3339 in UTC with microseconds: the export's form of a time.
pub(crate) fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// 64 hex digits as a hash.
pub(crate) fn parse_hash(text: &str) -> Option<Hash> {
    hex::decode(text)
        .ok()
        .and_then(|bytes| Hash::from_slice(&bytes))
}

/// Computes the SHA-256 of everything written through it.
struct DigestWriter<W> {
    inner: W,
    digest: Sha256,
}

impl<W: Write> Write for DigestWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(buf)?;
        self.digest.update(&buf[..written]);
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Computes the SHA-256 of everything read through it.
struct DigestReader<R> {
    inner: R,
    digest: Sha256,
}

impl<R: Read> Read for DigestReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let read = self.inner.read(buf)?;
        self.digest.update(&buf[..read]);
        Ok(read)
    }
}

type Sink = DigestWriter<BufWriter<File>>;

/// Writes an events file record by record, hashing its bytes on the way.
pub(crate) struct EventsWriter {
    path: PathBuf,
    encoder: Encoder,
}

enum Encoder {
    Jsonl(Sink),
    Csv(Box<csv::Writer<Sink>>),
}

impl EventsWriter {
    /// Creates (or truncates) the events file at `path`.
    pub(crate) fn create(path: PathBuf, format: Format) -> Result<Self, AuditError> {
        let file = File::create(&path).map_err(|source| AuditError::Create {
            path: path.clone(),
            source,
        })?;
        let sink = DigestWriter {
            inner: BufWriter::with_capacity(1 << 20, file),
            digest: Sha256::new(),
        };
        let encoder = match format {
            Format::Jsonl => Encoder::Jsonl(sink),
            Format::Csv => Encoder::Csv(Box::new(csv::Writer::from_writer(sink))),
        };
        Ok(Self { path, encoder })
    }

    pub(crate) fn write(&mut self, record: &ExportedEvent) -> Result<(), AuditError> {
        match &mut self.encoder {
            Encoder::Jsonl(sink) => {
                serde_json::to_writer(&mut *sink, record)?;
                sink.write_all(b"\n")?;
            }
            Encoder::Csv(writer) => writer.serialize(record)?,
        }
        Ok(())
    }

    /// Flushes the file to disk and returns the SHA-256 of its bytes, hex.
    pub(crate) fn finish(self) -> Result<String, AuditError> {
        let mut sink = match self.encoder {
            Encoder::Jsonl(sink) => sink,
            Encoder::Csv(writer) => writer.into_inner().map_err(|e| e.into_error())?,
        };
        sink.flush()?;
        let DigestWriter { inner, digest } = sink;
        inner
            .into_inner()
            .map_err(|e| e.into_error())?
            .sync_all()
            .map_err(|source| AuditError::Write {
                path: self.path,
                source,
            })?;
        Ok(hex::encode(digest.finalize()))
    }
}

/// Reads an events file record by record, hashing its bytes on the way.
pub(crate) struct EventsReader {
    source: DigestReader<BufReader<File>>,
    format: Format,
}

impl EventsReader {
    pub(crate) fn open(path: &Path, format: Format) -> Result<Self, AuditError> {
        let file = File::open(path).map_err(|source| AuditError::Read {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self {
            source: DigestReader {
                inner: BufReader::with_capacity(1 << 20, file),
                digest: Sha256::new(),
            },
            format,
        })
    }

    /// Hands each record, with its line number in the file, to `check` in order, until `check`
    /// returns `Some` (what is wrong, which is returned). `Err` only when the file cannot be
    /// read.
    pub(crate) fn each<B>(
        &mut self,
        mut check: impl FnMut(u64, Result<ExportedEvent, RecordError>) -> Option<B>,
    ) -> Result<Option<B>, AuditError> {
        match self.format {
            Format::Jsonl => {
                let mut lines = BufReader::new(&mut self.source).lines();
                let mut number = 0;
                while let Some(line) = lines.next().transpose()? {
                    number += 1;
                    let record = serde_json::from_str(&line).map_err(RecordError::Json);
                    if let Some(broken) = check(number, record) {
                        return Ok(Some(broken));
                    }
                }
            }
            Format::Csv => {
                let mut records = csv::Reader::from_reader(&mut self.source);
                // Line 1 is the header.
                let mut number = 1;
                for record in records.deserialize() {
                    number += 1;
                    if let Some(broken) = check(number, record.map_err(RecordError::Csv)) {
                        return Ok(Some(broken));
                    }
                }
            }
        }
        Ok(None)
    }

    /// The SHA-256 of the whole file, hex, including what follows a record `each` stopped at.
    pub(crate) fn finish(mut self) -> Result<String, AuditError> {
        io::copy(&mut self.source, &mut io::sink())?;
        Ok(hex::encode(self.source.digest.finalize()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sealed first event, with bytes a JSON parser would not give back as they are.
    fn event() -> RecordedEvent {
        let stream_id = StreamId::new("op-7, \"quoted\"").expect("stream id");
        let mut event = RecordedEvent {
            position: 1,
            event_id: opledger_store::event_id(&stream_id, 1),
            stream_id,
            version: 1,
            event_type: "Received".into(),
            schema_version: 2,
            payload: "{\"b\": 1.0,\n  \"a\":\"\\u00e9\", \"é\": []}"
                .as_bytes()
                .to_vec(),
            metadata: b"{}".to_vec(),
            recorded_at: DateTime::from_timestamp_micros(1_764_000_000_123_456).unwrap(),
            prev_hash: Hash::GENESIS,
            hash: Hash::GENESIS,
        };
        event.hash = event.link().seal(&Hash::GENESIS);
        event
    }

    #[test]
    fn a_record_round_trips_through_both_formats_with_the_exact_bytes() {
        let event = event();
        let record = ExportedEvent::new(&event);
        assert_eq!(record.recorded_at, "2025-11-24T16:00:00.123456Z");

        let line = serde_json::to_string(&record).expect("JSON");
        let back: ExportedEvent = serde_json::from_str(&line).expect("parse");
        assert_eq!(back.decode().expect("decode"), event);

        let mut csv = csv::Writer::from_writer(Vec::new());
        csv.serialize(&record).expect("CSV");
        let bytes = csv.into_inner().expect("flush");
        let back: ExportedEvent = csv::Reader::from_reader(&bytes[..])
            .deserialize()
            .next()
            .expect("a record")
            .expect("parse");
        assert_eq!(back.decode().expect("decode"), event);
    }

    #[test]
    fn a_record_that_disagrees_with_itself_is_unreadable() {
        let record = ExportedEvent::new(&event());
        let unreadable = |change: fn(&mut ExportedEvent)| {
            let mut record = record.clone();
            change(&mut record);
            record.decode().expect_err("unreadable").to_string()
        };
        assert_eq!(
            unreadable(|r| r.recorded_at_micros += 1),
            "recorded_at 2025-11-24T16:00:00.123456Z is not recorded_at_micros 1764000000123457"
        );
        assert_eq!(
            unreadable(|r| r.prev_hash.truncate(10)),
            "prev_hash is not 64 hex digits"
        );
        assert_eq!(
            unreadable(|r| r.event_id = "x".into()),
            "event_id is not a UUID"
        );
        assert!(unreadable(|r| r.payload_base64.push('!')).starts_with("payload_base64: "));
        assert!(
            serde_json::from_str::<ExportedEvent>(r#"{"position":1,"extra":2}"#).is_err(),
            "unknown fields are refused"
        );
    }
}
