//! `opledger timeline OP`: one operation's history, in ledger order; or one update's
//! (`update-{bot}-{update_id}`: its receipt, repeats and, behind a gateway, every attempt to
//! forward it to the bot).
//!
//! Every event of the operation's stream with its position, time and version, what it said (the
//! fields that move its state: attempt, worker, lease, external id, reason, reply …; digests and
//! fingerprints are left out), who or what caused it (the update, a worker, an operator, the
//! system) and the update it is correlated with. The delivery events of the updates named in
//! those correlations (`UpdateReceived`, `DuplicateDeliveryObserved`, …) are merged in, since
//! they are a few reads away. The ledger is opened read-only.

use anyhow::bail;
use opledger_projections::operation_status;
use opledger_store::{LedgerReader, RecordedEvent, StreamId};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::database::open_reader;
use crate::output::{Output, timestamp};

#[derive(Debug, clap::Args)]
pub(crate) struct Timeline {
    /// The operation: its id (a UUID, as `opledger ops` lists it) or its stream id (`op-…`); or
    /// an update's stream id (`update-{bot}-{update_id}`).
    #[arg(value_name = "OP")]
    operation: String,
    /// Print JSON Lines (one object per event) instead of a table.
    #[arg(long)]
    json: bool,
}

/// Payload fields that say nothing about the operation's state, left out of the details.
const NOISE: &[&str] = &[
    "operation_id",
    "idempotency_key",
    "fingerprint",
    "existing_fingerprint",
    "digest",
    "first_digest",
    "new_digest",
    "response_digest",
    "body",
];

/// Events read per page of a stream.
const PAGE: usize = 1000;

/// One line of the timeline.
#[derive(Serialize)]
struct Entry {
    position: u64,
    recorded_at: String,
    stream_id: String,
    version: u64,
    event_type: String,
    /// What the event said, without digests and fingerprints.
    details: Map<String, Value>,
    /// Who or what caused it, as the metadata says (`{"kind": "worker", "worker": …}`).
    cause: Value,
    /// The update the event belongs to (`update-{bot}-{update_id}`).
    correlation: Value,
}

impl Timeline {
    /// The table of one operation's history; `operation` is its id or stream id.
    pub(crate) fn of(operation: String) -> Timeline {
        Timeline {
            operation,
            json: false,
        }
    }

    pub(crate) async fn run(self, url: &str) -> anyhow::Result<()> {
        let reader = open_reader(url).await?;
        let stream = self.stream(&reader).await?;
        let events = read_stream(&reader, &stream).await?;
        if events.is_empty() {
            bail!(self.unknown());
        }
        let mut entries: Vec<Entry> = events.iter().map(entry).collect();
        let is_update = stream.as_str().starts_with("update-");
        if !is_update {
            entries.extend(deliveries(&reader, &stream, &entries).await?);
        }
        entries.sort_by_key(|e| e.position);
        reader.close().await;

        let mut out = Output::stdout();
        if self.json {
            for entry in &entries {
                if !out.line(format_args!("{}", serde_json::to_string(entry)?))? {
                    break;
                }
            }
            return Ok(out.finish()?);
        }
        // The stream's first event, `Received`, names the operation.
        let field = |name: &str| {
            payload_field(&events[0], name)
                .map(|v| text(&v))
                .unwrap_or_else(|| "?".to_owned())
        };
        if is_update {
            out.line(format_args!(
                "update {}  bot {}  kind {}  stream {stream}",
                field("update_id"),
                field("bot"),
                field("kind"),
            ))?;
        } else {
            out.line(format_args!(
                "operation {}  action {}  key {}  stream {stream}",
                field("operation_id"),
                field("action"),
                field("business_key"),
            ))?;
        }
        out.line(format_args!(
            "{:>10}  {:<27}  {:<24}  {:<26}  {:<22}  {:<24}  DETAILS",
            "POSITION", "RECORDED_AT", "STREAM@VERSION", "EVENT", "CAUSE", "CORRELATION"
        ))?;
        for entry in &entries {
            let place = if entry.stream_id == stream.as_str() {
                format!("@{}", entry.version)
            } else {
                format!("{}@{}", entry.stream_id, entry.version)
            };
            let details: Vec<String> = entry
                .details
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| format!("{k}={}", text(v)))
                .collect();
            let line = format_args!(
                "{:>10}  {:<27}  {:<24}  {:<26}  {:<22}  {:<24}  {}",
                entry.position,
                entry.recorded_at,
                place,
                entry.event_type,
                cause(&entry.cause),
                entry.correlation.as_str().unwrap_or("-"),
                details.join(" ")
            );
            if !out.line(line)? {
                break;
            }
        }
        Ok(out.finish()?)
    }

    fn unknown(&self) -> String {
        format!(
            "no operation `{}` in this ledger; list operations with `opledger ops`",
            self.operation
        )
    }

    /// The operation's stream: given as `op-…`, or looked up by operation id.
    async fn stream(&self, reader: &LedgerReader) -> anyhow::Result<StreamId> {
        let operation = self.operation.trim();
        if operation.starts_with("op-") || operation.starts_with("update-") {
            return StreamId::new(operation)
                .map_err(|e| anyhow::anyhow!("{}: {e}", self.unknown()));
        }
        let Ok(id) = uuid::Uuid::parse_str(operation) else {
            bail!(
                "`{operation}` is neither an operation id (a UUID) nor an operation stream id (op-…); list operations with `opledger ops`"
            );
        };
        let row = operation_status::get(reader.pool(), &id.hyphenated().to_string()).await?;
        match row {
            Some(row) => Ok(StreamId::new(row.stream_id)?),
            None => bail!(self.unknown()),
        }
    }
}

async fn read_stream(
    reader: &LedgerReader,
    stream: &StreamId,
) -> anyhow::Result<Vec<RecordedEvent>> {
    let mut events: Vec<RecordedEvent> = Vec::new();
    loop {
        let page = reader
            .read_stream(stream, events.len() as u64 + 1, PAGE)
            .await?;
        let done = page.len() < PAGE;
        events.extend(page);
        if done {
            return Ok(events);
        }
    }
}

fn payload_field(event: &RecordedEvent, name: &str) -> Option<Value> {
    serde_json::from_slice::<Value>(&event.payload)
        .ok()?
        .get(name)
        .cloned()
}

fn entry(event: &RecordedEvent) -> Entry {
    let mut details = match serde_json::from_slice::<Value>(&event.payload) {
        Ok(Value::Object(map)) => map,
        Ok(other) => Map::from_iter([("payload".to_owned(), other)]),
        Err(_) => Map::from_iter([(
            "payload".to_owned(),
            Value::String(String::from_utf8_lossy(&event.payload).into_owned()),
        )]),
    };
    details.retain(|key, _| !NOISE.contains(&key.as_str()));
    let metadata = serde_json::from_slice::<Value>(&event.metadata).unwrap_or(Value::Null);
    Entry {
        position: event.position,
        recorded_at: timestamp(event.recorded_at),
        stream_id: event.stream_id.to_string(),
        version: event.version,
        event_type: event.event_type.clone(),
        details,
        cause: metadata.get("causation").cloned().unwrap_or(Value::Null),
        correlation: metadata.get("correlation").cloned().unwrap_or(Value::Null),
    }
}

/// The delivery events of the updates the operation's events are correlated with: each
/// update's `UpdateReceived` that names this operation, and what happened to that receipt later
/// in the same epoch (duplicates, collisions, the raw body's storage).
async fn deliveries(
    reader: &LedgerReader,
    stream: &StreamId,
    entries: &[Entry],
) -> anyhow::Result<Vec<Entry>> {
    let mut updates: Vec<&str> = entries
        .iter()
        .filter_map(|e| e.correlation.as_str())
        .filter(|c| c.starts_with("update-"))
        .collect();
    updates.sort_unstable();
    updates.dedup();
    let mut found = Vec::new();
    for update in updates {
        let Ok(update) = StreamId::new(update) else {
            continue;
        };
        let mut epochs = Vec::new();
        for event in read_stream(reader, &update).await? {
            let entry = entry(&event);
            let epoch = entry.details.get("epoch").and_then(Value::as_u64);
            let ours = if event.event_type == "UpdateReceived" {
                let names_us = entry
                    .details
                    .get("operation")
                    .and_then(|o| o.get("stream"))
                    .and_then(Value::as_str)
                    == Some(stream.as_str());
                if names_us {
                    epochs.push(epoch);
                }
                names_us
            } else {
                epochs.contains(&epoch)
            };
            if ours {
                found.push(entry);
            }
        }
    }
    Ok(found)
}

/// A causation in a few words: `update shop/17`, `worker w-1`, `operator alice`, `client
/// shop_handlers`, `system intake`.
fn cause(causation: &Value) -> String {
    let field = |name: &str| causation.get(name).map(text).unwrap_or_default();
    match causation.get("kind").and_then(Value::as_str) {
        Some("update") => format!("update {}/{}", field("bot"), field("update_id")),
        Some("worker") => format!("worker {}", field("worker")),
        Some("operator") => format!("operator {}", field("operator")),
        Some("client") => format!("client {}", field("client")),
        Some("system") => format!("system {}", field("component")),
        Some(other) => other.to_owned(),
        None => "-".to_owned(),
    }
}

/// A value as it reads in a table: strings without quotes unless they hold spaces, the rest as
/// compact JSON.
fn text(value: &Value) -> String {
    match value {
        Value::String(s) if !s.is_empty() && !s.contains(char::is_whitespace) => s.clone(),
        other => other.to_string(),
    }
}
