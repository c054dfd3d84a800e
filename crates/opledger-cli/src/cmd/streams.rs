//! `opledger streams`: list streams with their versions, in id order.

use opledger_store::StreamId;
use serde::Serialize;

use crate::database;
use crate::output::{Output, timestamp};

const PAGE: usize = 1000;

#[derive(Debug, clap::Args)]
pub(crate) struct Streams {
    /// Only streams of this category (the part of the id before the first `-`, e.g. `op`).
    #[arg(long)]
    category: Option<String>,
    /// Print at most N streams.
    #[arg(long, value_name = "N")]
    limit: Option<usize>,
    /// Print JSON Lines instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct StreamLine<'a> {
    stream_id: &'a str,
    category: &'a str,
    version: u64,
    created_at: String,
}

impl Streams {
    pub(crate) async fn run(self, url: &str) -> anyhow::Result<()> {
        let store = database::open_reader(url).await?;
        let mut out = Output::stdout();
        if !self.json {
            out.line(format_args!(
                "{:<27}  {:>8}  STREAM",
                "CREATED_AT", "VERSION"
            ))?;
        }
        let mut after: Option<StreamId> = None;
        let mut left = self.limit.unwrap_or(usize::MAX);
        'pages: while left > 0 {
            let streams = store.list_streams(after.as_ref(), PAGE).await?;
            let Some(last) = streams.last() else { break };
            after = Some(last.stream_id.clone());
            for stream in &streams {
                if self
                    .category
                    .as_ref()
                    .is_some_and(|c| *c != stream.category)
                {
                    continue;
                }
                let created_at = timestamp(stream.created_at);
                let open = if self.json {
                    let line = StreamLine {
                        stream_id: stream.stream_id.as_str(),
                        category: &stream.category,
                        version: stream.version,
                        created_at,
                    };
                    out.line(format_args!("{}", serde_json::to_string(&line)?))?
                } else {
                    out.line(format_args!(
                        "{created_at:<27}  {:>8}  {}",
                        stream.version, stream.stream_id
                    ))?
                };
                left -= 1;
                if !open || left == 0 {
                    break 'pages;
                }
            }
        }
        out.finish()?;
        store.close().await;
        Ok(())
    }
}
