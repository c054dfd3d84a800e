//! Writing command output to stdout, so that `opledger events | head` ends quietly, and so that
//! text from users or from outside (business keys, reasons, Telegram's answers) cannot steer the
//! operator's terminal.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io::{self, BufWriter, StdoutLock, Write};

use chrono::{DateTime, SecondsFormat, Utc};

/// Buffered stdout. A closed pipe is not an error for a command that prints a listing: the
/// reader has seen enough.
pub(crate) struct Output {
    out: BufWriter<StdoutLock<'static>>,
    /// The line being written, before it is escaped.
    line: String,
}

impl Output {
    pub(crate) fn stdout() -> Self {
        Self {
            out: BufWriter::new(io::stdout().lock()),
            line: String::new(),
        }
    }

    /// Writes one line, table or JSON, with [`escape`]; `Ok(false)` means the reader went away
    /// and the command should stop.
    pub(crate) fn line(&mut self, line: std::fmt::Arguments<'_>) -> io::Result<bool> {
        self.line.clear();
        self.line
            .write_fmt(line)
            .map_err(|_| io::Error::other("a value could not be formatted"))?;
        match self
            .out
            .write_all(escape(&self.line).as_bytes())
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

/// `text` with every character that could steer a terminal or reorder what it shows written as
/// `\uXXXX`: C0 and C1 controls (ESC starts colour, title and clipboard sequences; BEL; line
/// breaks that would forge rows), DEL, and the bidirectional marks, embeddings, overrides and
/// isolates that make text read in another order than it is stored (U+061C, U+200E, U+200F,
/// U+202A–U+202E, U+2066–U+2069), and the line and paragraph separators.
///
/// The form is JSON's own escape, so a JSON line stays valid JSON with the same value: serde_json
/// escapes C0 controls itself but leaves DEL, C1 and bidirectional characters raw, and none of
/// these characters can appear in its output outside a string.
pub(crate) fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(steers_terminal) {
        return Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if steers_terminal(c) {
            let _ = write!(escaped, "\\u{:04x}", u32::from(c));
        } else {
            escaped.push(c);
        }
    }
    Cow::Owned(escaped)
}

fn steers_terminal(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
                | '\u{2028}'
                | '\u{2029}'
        )
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

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn controls_and_bidi_characters_are_written_visibly() {
        assert_eq!(escape("spring:42"), "spring:42");
        assert_eq!(escape("naïve ✓ 春"), "naïve ✓ 春");
        assert_eq!(escape("\u{1b}]0;PWNED\u{7}"), "\\u001b]0;PWNED\\u0007");
        assert_eq!(
            escape("a\tb\nc\rd\u{7f}"),
            "a\\u0009b\\u000ac\\u000dd\\u007f"
        );
        assert_eq!(escape("\u{9b}31m"), "\\u009b31m");
        assert_eq!(
            escape("\u{202e}gnp.exe\u{2066}\u{2069}\u{200f}\u{2028}"),
            "\\u202egnp.exe\\u2066\\u2069\\u200f\\u2028"
        );
    }

    #[test]
    fn an_escaped_json_line_is_the_same_json() {
        let value = serde_json::json!({ "key": "\u{1b}[2J\u{9b}\u{202e}x\u{7f}\\u001b" });
        let line = serde_json::to_string(&value).unwrap();
        let escaped = escape(&line);
        assert!(!escaped.chars().any(|c| c.is_control() || c == '\u{202e}'));
        let back: serde_json::Value = serde_json::from_str(&escaped).unwrap();
        assert_eq!(back, value);
    }
}
