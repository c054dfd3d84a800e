//! Writing command output to stdout, so that `opledger events | head` ends quietly.

use std::io::{self, BufWriter, StdoutLock, Write};

use chrono::{DateTime, SecondsFormat, Utc};

/// Buffered stdout. A closed pipe is not an error for a command that prints a listing: the
/// reader has seen enough.
pub(crate) struct Output {
    out: BufWriter<StdoutLock<'static>>,
}

impl Output {
    pub(crate) fn stdout() -> Self {
        Self {
            out: BufWriter::new(io::stdout().lock()),
        }
    }

    /// Writes one line; `Ok(false)` means the reader went away and the command should stop.
    pub(crate) fn line(&mut self, line: std::fmt::Arguments<'_>) -> io::Result<bool> {
        match self
            .out
            .write_fmt(line)
            .and_then(|()| self.out.write_all(b"\n"))
        {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn finish(mut self) -> io::Result<()> {
        match self.out.flush() {
            Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(e),
            _ => Ok(()),
        }
    }
}

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Output")
    }
}

/// RFC 3339 in UTC with microseconds, the form every listing uses.
pub(crate) fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// This process's peak resident memory so far (`VmHWM`), where the system reports it (Linux);
/// long commands print it with their rates.
pub(crate) fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}
