//! What the asynchronous built-in projections share: reading an event's envelope (category,
//! metadata), passing a page's rows to the database in one statement, and reading rows back
//! (decoded for both backends at once through `opledger_store::EitherRow`).
//!
//! A page's rows reach the database in a few statements, never one statement per row: on
//! SQLite a JSON array of rows expanded by `jsonb_each`, or (for many rows) bound multi-row
//! `VALUES`; `jsonb_each`, not `json_each`: it parses the array once and hands each row to
//! `->>` as binary JSON, where `json_each` hands it over as text that every `->>` parses again
//! (15 times per row for `user_operations`, which then cost more than the rest of its page); on PostgreSQL one array per column expanded by `UNNEST`, or (for many rows) `COPY`.
//! Times are microseconds since the Unix epoch on SQLite (like the ledger's) and `timestamptz`
//! on PostgreSQL.

use chrono::{DateTime, Utc};
use opledger_domain::EventMetadata;
use opledger_store::chain::Link;

/// The part of a stream id before its first `-`: `op`, `update`, `cb`, `recent`, `quarantine`.
pub(crate) fn category(stream_id: &str) -> &str {
    stream_id.split_once('-').map_or(stream_id, |(c, _)| c)
}

/// The event's metadata, when it is opledger's (events appended by other writers may carry any
/// JSON object).
pub(crate) fn metadata(link: &Link<'_>) -> Option<EventMetadata> {
    EventMetadata::from_bytes(link.metadata).ok()
}

/// The most parameters one SQLite statement binds here (SQLite allows 32 766).
pub(crate) const SQLITE_PARAMETERS: usize = 16_000;

/// The most rows one SQLite statement inserts: at 14 columns, 14 000 parameters, below SQLite's
/// limit of 32 766.
pub(crate) const SQLITE_ROWS_PER_STATEMENT: usize = 1000;

/// Whether a multi-row statement of `rows` rows is kept prepared on its connection: only the
/// full chunks, whose text is always the same. A statement per remainder length would fill the
/// connection's statement cache with big programs (memory that grows with the ledger's size).
pub(crate) fn kept_prepared(rows: usize) -> bool {
    rows == SQLITE_ROWS_PER_STATEMENT
}

/// `{head} VALUES (?, …), …` for `rows` rows of `columns` parameters each: a multi-row insert
/// whose values are bound, the fastest way to load rows into SQLite (JSON would be parsed once
/// per column).
pub(crate) fn sqlite_values(head: &str, columns: usize, rows: usize) -> String {
    let row = format!("({})", vec!["?"; columns].join(", "));
    let mut sql = String::with_capacity(head.len() + 8 + rows * (row.len() + 2));
    sql.push_str(head);
    sql.push_str(" VALUES ");
    for i in 0..rows {
        if i > 0 {
            sql.push_str(", ");
        }
        sql.push_str(&row);
    }
    sql
}

/// Rows in PostgreSQL's `COPY … FROM STDIN` text format: the fastest way to load many rows
/// (several times faster than an `INSERT` of arrays). Fields are tab-separated, rows end with a
/// newline, NULL is `\N`, and backslash, tab, newline and carriage return in text are escaped.
#[derive(Debug, Default)]
pub(crate) struct CopyText {
    buffer: Vec<u8>,
    /// Whether the row being written has a field already.
    in_row: bool,
}

impl CopyText {
    fn separate(&mut self) {
        if self.in_row {
            self.buffer.push(b'\t');
        }
        self.in_row = true;
    }

    /// A text field, or NULL.
    pub(crate) fn text(&mut self, value: Option<&str>) -> &mut Self {
        self.separate();
        match value {
            None => self.buffer.extend_from_slice(b"\\N"),
            Some(text)
                if !text
                    .bytes()
                    .any(|b| matches!(b, b'\\' | b'\t' | b'\n' | b'\r')) =>
            {
                self.buffer.extend_from_slice(text.as_bytes());
            }
            Some(text) => {
                for &byte in text.as_bytes() {
                    match byte {
                        b'\\' => self.buffer.extend_from_slice(b"\\\\"),
                        b'\t' => self.buffer.extend_from_slice(b"\\t"),
                        b'\n' => self.buffer.extend_from_slice(b"\\n"),
                        b'\r' => self.buffer.extend_from_slice(b"\\r"),
                        other => self.buffer.push(other),
                    }
                }
            }
        }
        self
    }

    /// An integer field, or NULL.
    pub(crate) fn int(&mut self, value: Option<i64>) -> &mut Self {
        self.separate();
        match value {
            None => self.buffer.extend_from_slice(b"\\N"),
            Some(n) => {
                use std::io::Write;
                let _ = write!(self.buffer, "{n}");
            }
        }
        self
    }

    /// A `timestamptz` field, to the microsecond, in UTC.
    pub(crate) fn time(&mut self, value: DateTime<Utc>) -> &mut Self {
        use chrono::{Datelike, Timelike};
        use std::io::Write;
        self.separate();
        let _ = write!(
            self.buffer,
            "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:06}+00",
            value.year(),
            value.month(),
            value.day(),
            value.hour(),
            value.minute(),
            value.second(),
            value.timestamp_subsec_micros()
        );
        self
    }

    /// Ends the row.
    pub(crate) fn end_row(&mut self) {
        self.buffer.push(b'\n');
        self.in_row = false;
    }

    /// Sends the rows with `COPY {target} FROM STDIN` (`target`: the table and its columns).
    pub(crate) async fn copy(
        self,
        conn: &mut sqlx::PgConnection,
        target: &str,
    ) -> Result<u64, sqlx::Error> {
        if self.buffer.is_empty() {
            return Ok(0);
        }
        let mut copy = conn
            .copy_in_raw(&format!("COPY {target} FROM STDIN"))
            .await?;
        copy.send(self.buffer).await?;
        copy.finish().await
    }
}

/// A read model could not be read: the database is unreachable, or the projection's tables do
/// not exist yet.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot read the `{model}` read model: {source}; check that the database is reachable and \
     that the projection is built (`opledger projections list`)"
)]
pub struct ReadError {
    /// The read model's name.
    pub model: &'static str,
    #[source]
    pub source: sqlx::Error,
}

/// Wraps a database error of `model`'s read.
pub(crate) fn read_error(model: &'static str) -> impl Fn(sqlx::Error) -> ReadError {
    move |source| ReadError { model, source }
}

/// A stored count or position read back as an unsigned number.
pub(crate) fn unsigned<T: TryFrom<i64>>(value: i64, column: &'static str) -> Result<T, sqlx::Error>
where
    T::Error: std::error::Error + Send + Sync + 'static,
{
    T::try_from(value).map_err(|e| sqlx::Error::ColumnDecode {
        index: column.into(),
        source: Box::new(e),
    })
}

/// A stored unsigned number (position, version, count) as the databases' signed 64-bit integer.
pub(crate) fn signed(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A `LIMIT` for a read: at least 1.
pub(crate) fn limit(limit: u32) -> i64 {
    i64::from(limit.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_are_the_part_before_the_first_dash() {
        assert_eq!(category("op-coupon-spring:42"), "op");
        assert_eq!(category("update-shop--5"), "update");
        assert_eq!(category("quarantine-shop"), "quarantine");
        assert_eq!(category("plain"), "plain");
    }

    #[test]
    fn values_are_one_group_of_parameters_per_row() {
        assert_eq!(
            sqlite_values("INSERT INTO t (a, b)", 2, 3),
            "INSERT INTO t (a, b) VALUES (?, ?), (?, ?), (?, ?)"
        );
    }

    #[test]
    fn copy_text_escapes_what_would_break_a_row() {
        let mut copy = CopyText::default();
        copy.text(Some("a\tb\\c\nd\re"))
            .text(None)
            .int(Some(-5))
            .int(None)
            .time(DateTime::from_timestamp_micros(1_790_000_000_000_042).unwrap());
        copy.end_row();
        copy.text(Some("x"));
        copy.end_row();
        assert_eq!(
            String::from_utf8(copy.buffer).unwrap(),
            "a\\tb\\\\c\\nd\\re\t\\N\t-5\t\\N\t2026-09-21 14:13:20.000042+00\nx\n"
        );
    }
}
