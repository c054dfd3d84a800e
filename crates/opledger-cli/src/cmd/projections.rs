//! `opledger projections`: the read models' registry (versions, checkpoints, lag) and their
//! blue/green rebuilds, whole or for one stream.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::builder::PossibleValuesParser;
use opledger_projections::rebuild::{self, Phase, Progress, RebuildOptions};
use opledger_projections::registry::{self, ProjectionStatus};
use opledger_projections::{Projection, definition_hash};
use opledger_store::{AnyStore, LedgerReader, StreamId};

use crate::cmd::serve::runner_id;
use crate::database;
use crate::output::{Output, peak_rss_bytes, timestamp};

#[derive(Debug, clap::Subcommand)]
pub(crate) enum Projections {
    /// Every read model with its version, state, checkpoint, the head, lag, and the process
    /// that last advanced it (inline ones are always caught up).
    List {
        /// Print JSON Lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Rebuild a read model from the ledger into new tables while the live ones keep serving,
    /// then swap them in one transaction; with --stream, rebuild only what one stream
    /// contributed, in place.
    Rebuild {
        /// The read model (see `opledger projections list`).
        #[arg(value_name = "NAME", value_parser = PossibleValuesParser::new(names()))]
        name: String,
        /// Only this stream (e.g. op-…), in the live tables.
        #[arg(long, value_name = "ID")]
        stream: Option<String>,
        /// Print one JSON object instead of a line.
        #[arg(long)]
        json: bool,
        /// Events per page (one transaction each); bigger pages rebuild faster and use more
        /// memory.
        #[arg(long, value_name = "N", default_value_t = RebuildOptions::default().page_size)]
        page_size: usize,
    },
}

/// The names of the built-in read models.
fn names() -> Vec<&'static str> {
    opledger_projections::builtin()
        .iter()
        .map(|p| p.name())
        .collect()
}

impl Projections {
    /// Listing opens the ledger read-only; rebuilding writes, so it may create and migrate.
    pub(crate) async fn run(self, url: &str) -> anyhow::Result<()> {
        match self {
            Projections::List { json } => {
                let reader = database::open_reader(url).await?;
                let result = list(&reader, json).await;
                reader.close().await;
                result
            }
            Projections::Rebuild {
                name,
                stream,
                json,
                page_size,
            } => {
                let store = database::open(url).await?;
                let result = match stream {
                    Some(stream) => rebuild_stream(&store, &name, &stream, json).await,
                    None => rebuild(&store, &name, json, page_size.max(1)).await,
                };
                store.close().await;
                result
            }
        }
    }
}

async fn list(reader: &LedgerReader, json: bool) -> anyhow::Result<()> {
    let mut rows = registry::list_in(reader.pool())
        .await
        .context("cannot list the projections")?;
    // Built-in read models not registered yet (no `opledger serve` ran since they were added).
    let backend = reader.backend();
    let head = reader.head().await?.position;
    for projection in opledger_projections::builtin() {
        if rows.iter().any(|r| r.name == projection.name()) {
            continue;
        }
        let checkpoint = if projection.inline() { head } else { 0 };
        rows.push(ProjectionStatus {
            name: projection.name().to_owned(),
            version: 0,
            state: "unregistered".to_owned(),
            inline: projection.inline(),
            checkpoint,
            head,
            lag: head - checkpoint,
            definition_hash: definition_hash(projection.as_ref(), backend),
            runner: None,
            updated_at: None,
        });
    }
    let mut out = Output::stdout();
    if !json {
        out.line(format_args!(
            "{:<22} {:>7}  {:<12} {:>10} {:>10} {:>8}  {:<24} UPDATED",
            "NAME", "VERSION", "STATE", "CHECKPOINT", "HEAD", "LAG", "RUNNER"
        ))?;
    }
    for row in &rows {
        let more = if json {
            out.line(format_args!("{}", serde_json::to_string(row)?))?
        } else {
            let state = if row.inline {
                format!("{} inline", row.state)
            } else {
                row.state.clone()
            };
            out.line(format_args!(
                "{:<22} {:>7}  {:<12} {:>10} {:>10} {:>8}  {:<24} {}",
                row.name,
                row.version,
                state,
                row.checkpoint,
                row.head,
                row.lag,
                row.runner.as_deref().unwrap_or("-"),
                row.updated_at.map_or_else(|| "-".to_owned(), timestamp),
            ))?
        };
        if !more {
            break;
        }
    }
    out.finish()?;
    Ok(())
}

fn find(name: &str) -> anyhow::Result<Arc<dyn Projection>> {
    Ok(rebuild::find(&opledger_projections::builtin(), name)?)
}

async fn rebuild(store: &AnyStore, name: &str, json: bool, page_size: usize) -> anyhow::Result<()> {
    let projection = find(name)?;
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{prefix} [{bar:40}] {pos}/{len} events, {msg} ({elapsed})",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        bar.set_prefix(format!("rebuilding {name}"));
        bar.enable_steady_tick(Duration::from_millis(200));
        bar
    });
    let progress = |p: &Progress| {
        if let Some(bar) = &bar {
            bar.set_length(p.head);
            bar.set_position(p.position);
            let phase = match p.phase {
                Phase::Folding => "folding",
                Phase::Indexing => "indexing",
                Phase::Flipping => "flipping",
            };
            bar.set_message(format!("{:.0} events/s, {phase}", p.events_per_sec()));
        }
    };
    let options = RebuildOptions {
        runner: runner_id(),
        page_size,
        ..RebuildOptions::default()
    };
    let report = rebuild::rebuild(store, projection.as_ref(), &options, &progress).await;
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let report = report.with_context(|| format!("cannot rebuild {name}"))?;
    let rss = peak_rss_bytes();
    let mut out = Output::stdout();
    if json {
        out.line(format_args!(
            "{}",
            serde_json::json!({
                "projection": report.projection,
                "version": report.version,
                "events": report.events,
                "position": report.position,
                "seconds": report.seconds,
                "events_per_sec": report.events_per_sec,
                "peak_rss_bytes": rss,
            })
        ))?;
    } else {
        out.line(format_args!(
            "rebuilt {} v{}: {} events up to position {} in {:.1} s ({:.0} events/s){}",
            report.projection,
            report.version,
            report.events,
            report.position,
            report.seconds,
            report.events_per_sec,
            rss.map_or_else(String::new, |b| format!(
                ", peak RSS {:.1} MiB",
                b as f64 / 1_048_576.0
            )),
        ))?;
    }
    out.finish()?;
    Ok(())
}

async fn rebuild_stream(
    store: &AnyStore,
    name: &str,
    stream: &str,
    json: bool,
) -> anyhow::Result<()> {
    let projection = find(name)?;
    let id = StreamId::new(stream).with_context(|| format!("`{stream}` is not a stream id"))?;
    let started = std::time::Instant::now();
    let report = rebuild::rebuild_stream(store, projection.as_ref(), &id)
        .await
        .with_context(|| format!("cannot rebuild stream {stream} of {name}"))?;
    let seconds = started.elapsed().as_secs_f64();
    let mut out = Output::stdout();
    if json {
        out.line(format_args!(
            "{}",
            serde_json::json!({
                "projection": report.projection,
                "version": report.version,
                "stream": report.stream,
                "events": report.events,
                "position": report.position,
                "seconds": seconds,
                "events_per_sec": if seconds > 0.0 { report.events as f64 / seconds } else { 0.0 },
                "peak_rss_bytes": peak_rss_bytes(),
            })
        ))?;
    } else {
        out.line(format_args!(
            "rebuilt stream {} of {} v{}: {} events up to position {}",
            report.stream, report.projection, report.version, report.events, report.position
        ))?;
    }
    out.finish()?;
    Ok(())
}
