//! `opledger events`: print the ledger's events in global order, or one stream's events.

use anyhow::Context;
use opledger_store::{RecordedEvent, StreamId};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::database;
use crate::output::{Output, timestamp};

/// Events fetched per read.
const PAGE: u64 = 1000;

#[derive(Debug, clap::Args)]
pub(crate) struct Events {
    /// Only this stream's events; `--from` is then a stream version.
    #[arg(long, value_name = "ID")]
    stream: Option<String>,
    /// The first global position (or stream version, with --stream) to print.
    #[arg(long, value_name = "POS", default_value_t = 1)]
    from: u64,
    /// Print at most N events.
    #[arg(long, value_name = "N")]
    limit: Option<u64>,
    /// Print JSON Lines (one object per event) instead of a table.
    #[arg(long)]
    json: bool,
}

/// One event as a JSON Lines record. Payload and metadata are embedded as the exact JSON that
/// was stored.
#[derive(Serialize)]
struct EventLine<'a> {
    position: u64,
    stream_id: &'a str,
    version: u64,
    event_id: String,
    event_type: &'a str,
    schema_version: u32,
    payload: &'a RawValue,
    metadata: &'a RawValue,
    recorded_at: String,
    prev_hash: String,
    hash: String,
}

impl Events {
    pub(crate) async fn run(self, url: &str) -> anyhow::Result<()> {
        let stream = self
            .stream
            .as_deref()
            .map(StreamId::new)
            .transpose()
            .context("invalid --stream")?;
        let store = database::open_reader(url).await?;
        let mut out = Output::stdout();
        if !self.json {
            out.line(format_args!(
                "{:>10}  {:<27}  {:<28}  STREAM@VERSION",
                "POSITION", "RECORDED_AT", "TYPE"
            ))?;
        }
        let mut next = self.from;
        let mut left = self.limit.unwrap_or(u64::MAX);
        'pages: while left > 0 {
            let page = usize::try_from(left.min(PAGE)).unwrap_or(usize::MAX);
            let events = match &stream {
                Some(stream) => store.read_stream(stream, next, page).await?,
                None => store.read_all(next, page).await?,
            };
            let Some(last) = events.last() else { break };
            next = if stream.is_some() {
                last.version + 1
            } else {
                last.position + 1
            };
            left -= events.len() as u64;
            for event in &events {
                if !self.print(&mut out, event)? {
                    break 'pages;
                }
            }
        }
        out.finish()?;
        store.close().await;
        Ok(())
    }

    fn print(&self, out: &mut Output, event: &RecordedEvent) -> anyhow::Result<bool> {
        if !self.json {
            return Ok(out.line(format_args!(
                "{:>10}  {:<27}  {:<28}  {}@{}",
                event.position,
                timestamp(event.recorded_at),
                event.event_type,
                event.stream_id,
                event.version
            ))?);
        }
        let payload = raw_json(&event.payload, event, "payload")?;
        let metadata = raw_json(&event.metadata, event, "metadata")?;
        let line = EventLine {
            position: event.position,
            stream_id: event.stream_id.as_str(),
            version: event.version,
            event_id: event.event_id.to_string(),
            event_type: &event.event_type,
            schema_version: event.schema_version,
            payload: &payload,
            metadata: &metadata,
            recorded_at: timestamp(event.recorded_at),
            prev_hash: event.prev_hash.to_hex(),
            hash: event.hash.to_hex(),
        };
        Ok(out.line(format_args!("{}", serde_json::to_string(&line)?))?)
    }
}

fn raw_json(bytes: &[u8], event: &RecordedEvent, field: &str) -> anyhow::Result<Box<RawValue>> {
    let text = std::str::from_utf8(bytes)
        .ok()
        .and_then(|text| RawValue::from_string(text.to_owned()).ok());
    text.with_context(|| {
        format!(
            "the {field} of the event at position {} is not valid JSON: the ledger was altered outside opledger",
            event.position
        )
    })
}
