//! `opledger audit`: prove that the history is untouched.
//!
//! - `verify` recomputes the whole hash chain and checks positions, stream versions, event ids,
//!   the head row and the `streams` table (`opledger_audit::verify_ledger`), or, with
//!   `--export DIR`, re-verifies an export offline, without any database
//!   (`opledger_audit::verify_export`);
//! - `export` writes a range of events, every stored field with payload and metadata as their
//!   exact bytes, and a manifest that seals the file (`opledger_audit::export`; `docs/audit.md`
//!   describes the format and how anyone can check it without opledger);
//! - `head` prints the current head (position and hash) to keep somewhere else, so that
//!   `verify --expect-head` detects even a rewrite of the whole chain.
//!
//! A broken ledger or export is an error (exit code 1) that names the first broken link. This
//! module parses the arguments and prints; the work is `opledger_audit`'s.

use std::path::PathBuf;

use opledger_audit::{Checkpoint, ExportOptions, Format, Report};
use opledger_server::SystemClock;

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
    /// `audit verify` of the whole ledger, printed as text.
    pub(crate) fn verify() -> Audit {
        Audit::Verify(VerifyArgs::default())
    }

    pub(crate) async fn run(self, url: &str) -> anyhow::Result<()> {
        match self {
            Audit::Verify(args) => match &args.export {
                Some(dir) => print(
                    &opledger_audit::verify_export(dir, args.expect_head)?,
                    &args,
                ),
                None => {
                    let reader = open_reader(url).await?;
                    let report = opledger_audit::verify_ledger(&reader, args.expect_head).await?;
                    reader.close().await;
                    print(&report, &args)
                }
            },
            Audit::Export(args) => export(url, args).await,
            Audit::Head(args) => head(url, &args).await,
        }
    }
}

#[derive(Debug, Default, clap::Args)]
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

/// Prints a verification's report, then ends with its verdict: a broken link is an error
/// (exit code 1), a kept head the export cannot answer for a usage error (exit code 2).
fn print(report: &impl Report, args: &VerifyArgs) -> anyhow::Result<()> {
    let mut out = Output::stdout();
    if args.json {
        out.line(format_args!("{}", report.to_json(peak_rss_bytes())?))?;
    } else {
        for line in report.ok_lines() {
            out.line(format_args!("{line}"))?;
        }
    }
    out.finish()?;
    match report.broken() {
        None => Ok(()),
        Some(link) if link.bad_request => Err(BadUsage(link.to_string()).into()),
        Some(link) => Err(link.into()),
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

async fn export(url: &str, args: ExportArgs) -> anyhow::Result<()> {
    let options = ExportOptions {
        from: args.from,
        to: args.to,
        format: args.format,
        out: args.out,
        force: args.force,
        source: redact(url),
        tool: format!("opledger {}", env!("CARGO_PKG_VERSION")),
    };
    let reader = open_reader(url).await?;
    let exported = opledger_audit::export(&reader, &options, &SystemClock).await;
    reader.close().await;
    let exported = exported.map_err(|error| match error.is_usage() {
        true => anyhow::Error::new(BadUsage(error.to_string())),
        false => error.into(),
    })?;
    let mut out = Output::stdout();
    out.line(format_args!(
        "exported {} events (positions {}..={}) to {} in {:.2} s ({:.0} events/s)",
        exported.count,
        exported.from,
        exported.to,
        exported.events_path.display(),
        exported.seconds,
        exported.events_per_sec()
    ))?;
    out.line(format_args!(
        "manifest: {}; check it anywhere with: opledger audit verify --export {}",
        exported.manifest_path.display(),
        options.out.display()
    ))?;
    out.finish()?;
    Ok(())
}
