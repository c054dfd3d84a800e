//! `opledger replay --until <time|position>`: every read model as of a past moment, built into a
//! separate SQLite file for analysts (`opledger_projections::replay`).
//!
//! A time means the last event recorded at or before it. The live ledger is opened read-only
//! and never touched; the file is built beside its final name and renamed into place once
//! complete, so a failed replay leaves nothing half-built. It never goes onto the ledger itself
//! (by whatever path), its journal files, another ledger or a file no replay made.

use std::io::IsTerminal;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use opledger_projections::replay::{self, Existing, ReplayInfo};
use opledger_server::{Clock, SystemClock};
use opledger_store::{LedgerReader, Position};

use crate::BadUsage;
use crate::database::{open_reader, redact};
use crate::output::{Output, timestamp};

#[derive(Debug, clap::Args)]
pub(crate) struct Replay {
    /// The moment to replay to: an RFC 3339 time (2026-01-31T12:00:00Z; the last event recorded
    /// at or before it) or a ledger position (a whole number from 1).
    #[arg(long, value_name = "TIME|POSITION", value_parser = parse_until)]
    until: Until,
    /// The SQLite file to build [default: replay-<position>.db in the current directory].
    #[arg(long, value_name = "FILE.db")]
    into: Option<PathBuf>,
    /// Replace the file if an earlier replay made it (never a ledger or another file).
    #[arg(long)]
    force: bool,
}

/// The moment a replay stops at, as given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Until {
    Position(Position),
    Time(DateTime<Utc>),
}

fn parse_until(text: &str) -> Result<Until, String> {
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return match text.parse::<Position>() {
            Ok(0) => Err("positions start at 1".to_owned()),
            Ok(position) => Ok(Until::Position(position)),
            Err(_) => Err(format!("position {text} is too large")),
        };
    }
    DateTime::parse_from_rfc3339(text)
        .map(|time| Until::Time(time.with_timezone(&Utc)))
        .map_err(|_| {
            format!(
                "`{text}` is neither an RFC 3339 time (like 2026-01-31T12:00:00Z) nor a position (a whole number from 1)"
            )
        })
}

impl Replay {
    pub(crate) async fn run(self, url: &str) -> anyhow::Result<()> {
        let reader = open_reader(url).await?;
        let position = self.position(&reader).await?;
        let into = self
            .into
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("replay-{position}.db")));
        let partial = partial_path(&into);
        check_target(reader.sqlite_file().as_deref(), &into, &partial, self.force).await?;
        remove_if_present(&partial)?;
        let info = ReplayInfo {
            requested: match &self.until {
                Until::Position(p) => p.to_string(),
                Until::Time(t) => timestamp(*t),
            },
            source: redact(url),
            tool_version: env!("CARGO_PKG_VERSION").to_owned(),
            built_at: SystemClock.now(),
        };
        let show = std::io::stderr().is_terminal();
        let mut progress = |at: Position| {
            if show {
                eprint!("\rreplayed {at} of {position} events");
            }
        };
        let projections = opledger_projections::builtin();
        let built = replay::replay(
            &reader,
            &projections,
            position,
            &partial,
            &info,
            &mut progress,
        )
        .await;
        if show {
            eprintln!();
        }
        reader.close().await;
        let built = match built {
            Ok(built) => built,
            Err(error) => {
                let _ = std::fs::remove_file(&partial);
                return Err(error).context("the replay failed; nothing was written");
            }
        };
        std::fs::File::open(&partial)
            .and_then(|file| file.sync_all())
            .and_then(|()| std::fs::rename(&partial, &into))
            .with_context(|| format!("cannot move the replay into {}", into.display()))?;

        let mut out = Output::stdout();
        out.line(format_args!(
            "replayed {} events (positions 1..={}, the last recorded at {}, hash {}) into {} in {:.2} s ({:.0} events/s)",
            built.events,
            built.until,
            timestamp(built.until_time),
            built.until_hash,
            into.display(),
            built.seconds,
            if built.seconds > 0.0 {
                built.events as f64 / built.seconds
            } else {
                0.0
            }
        ))?;
        out.line(format_args!("{:<32}  {:>10}", "TABLE", "ROWS"))?;
        for (table, rows) in &built.tables {
            out.line(format_args!("{table:<32}  {rows:>10}"))?;
        }
        out.line(format_args!("{:<32}  {:>10}", "replay_info", 1))?;
        Ok(out.finish()?)
    }

    /// The position to replay to: as given, or the last one recorded at or before the time.
    async fn position(&self, reader: &LedgerReader) -> anyhow::Result<Position> {
        let head = reader.head().await?;
        if head.position == 0 {
            bail!("the ledger is empty: there is nothing to replay");
        }
        match self.until {
            Until::Position(position) if position > head.position => Err(BadUsage(format!(
                "--until {position} is beyond the ledger's head at position {}",
                head.position
            ))
            .into()),
            Until::Position(position) => Ok(position),
            Until::Time(time) => match reader.last_position_at(time, head.position).await? {
                0 => {
                    let first = reader.read_range(1, 1, 1).await?;
                    let first = first
                        .first()
                        .map_or_else(|| "?".to_owned(), |e| timestamp(e.recorded_at));
                    Err(BadUsage(format!(
                        "no event was recorded at or before {}: the first was recorded at {first}",
                        timestamp(time)
                    ))
                    .into())
                }
                position => Ok(position),
            },
        }
    }
}

/// Refuses to build where a replay must never write: onto the ledger being replayed (by any
/// path: another spelling, a hard or symbolic link) or its journal files, onto any opledger
/// ledger, or onto a file an earlier replay did not make; `--force` replaces only an earlier
/// replay. `partial` is checked too, since a leftover there is removed.
async fn check_target(
    ledger: Option<&Path>,
    into: &Path,
    partial: &Path,
    force: bool,
) -> anyhow::Result<()> {
    let choose = "choose another file with --into";
    if let Some(ledger) = ledger {
        for path in [into, partial] {
            if is_ledger_file(ledger, path) {
                return Err(BadUsage(format!(
                    "{} is the ledger being replayed or one of its journal files: a replay never \
                     writes over its ledger, even with --force; {choose}",
                    path.display()
                ))
                .into());
            }
        }
    }
    let refused = |what: String| Err(BadUsage(format!("{what}; {choose}")).into());
    match replay::inspect(into).await {
        Existing::Absent => {}
        Existing::Replay if force => {}
        Existing::Replay => {
            return Err(BadUsage(format!(
                "{} exists; choose another file with --into, or pass --force to replace it",
                into.display()
            ))
            .into());
        }
        Existing::Ledger => {
            return refused(format!(
                "{} holds an opledger ledger: a replay never overwrites a ledger, even with \
                 --force",
                into.display()
            ));
        }
        Existing::Other => {
            return refused(format!(
                "{} exists and is not a replay: --force replaces only a file an earlier replay \
                 made",
                into.display()
            ));
        }
    }
    match replay::inspect(partial).await {
        Existing::Absent | Existing::Replay => Ok(()),
        Existing::Ledger | Existing::Other => refused(format!(
            "{} is in the way (the replay is built there first, and it is not what an earlier \
             replay left): move it away",
            partial.display()
        )),
    }
}

/// Whether writing `path` would write the SQLite ledger at `ledger`, or its write-ahead log,
/// shared memory or rollback journal: the same file by another path (after resolving `.`, `..`
/// and symbolic links), or a hard link to one of them.
fn is_ledger_file(ledger: &Path, path: &Path) -> bool {
    let Ok(ledger) = std::fs::canonicalize(ledger) else {
        return false;
    };
    let files: Vec<PathBuf> = ["", "-wal", "-shm", "-journal"]
        .iter()
        .map(|suffix| {
            let mut name = ledger.as_os_str().to_owned();
            name.push(suffix);
            PathBuf::from(name)
        })
        .collect();
    let resolved = std::fs::canonicalize(path).ok().or_else(|| {
        // Not there yet: where it would be created.
        let parent = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        Some(std::fs::canonicalize(parent).ok()?.join(path.file_name()?))
    });
    if resolved.is_some_and(|resolved| files.contains(&resolved)) {
        return true;
    }
    let Ok(target) = std::fs::metadata(path) else {
        return false;
    };
    files.iter().any(|file| {
        std::fs::metadata(file)
            .is_ok_and(|file| (file.dev(), file.ino()) == (target.dev(), target.ino()))
    })
}

/// Where the file is built before it is renamed into place: beside it, so the rename is atomic.
fn partial_path(into: &Path) -> PathBuf {
    let mut name = into.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    into.with_file_name(name)
}

fn remove_if_present(path: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("cannot remove {}", path.display()))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn until_is_a_position_or_a_time() {
        assert_eq!(parse_until("42"), Ok(Until::Position(42)));
        assert_eq!(
            parse_until("2026-01-31T12:00:00+01:00"),
            Ok(Until::Time(
                DateTime::from_timestamp(1_769_857_200, 0).expect("time")
            ))
        );
        assert!(parse_until("0").unwrap_err().contains("start at 1"));
        assert!(parse_until("yesterday").unwrap_err().contains("RFC 3339"));
        assert!(parse_until("-3").is_err());
        assert!(parse_until("99999999999999999999999").is_err());
    }
}
