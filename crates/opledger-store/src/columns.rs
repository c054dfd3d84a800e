//! What both backends share about reading rows: the read statements (`$n` placeholders work on
//! SQLite and PostgreSQL alike) and the checked conversions between column and model types.

use crate::chain::Hash;
use crate::model::StreamId;

/// `SELECT <every event column> FROM events <tail>`, so the column order that the backends'
/// row decoders rely on is written once.
macro_rules! select_events {
    ($tail:literal) => {
        concat!(
            "SELECT position, stream_id, version, event_id, event_type, schema_version, ",
            "payload, metadata, recorded_at, prev_hash, hash FROM events ",
            $tail
        )
    };
}

pub(crate) const READ_STREAM: &str =
    select_events!("WHERE stream_id = $1 AND version >= $2 ORDER BY version LIMIT $3");
pub(crate) const READ_ALL: &str = select_events!("WHERE position >= $1 ORDER BY position LIMIT $2");
pub(crate) const READ_HEAD: &str =
    "SELECT last_position, last_hash FROM ledger_head WHERE ledger_id = 1";
pub(crate) const STREAM_VERSION: &str = "SELECT version FROM streams WHERE stream_id = $1";
pub(crate) const LIST_STREAMS: &str = "SELECT stream_id, stream_type, version, created_at \
     FROM streams WHERE stream_id > $1 ORDER BY stream_id LIMIT $2";

/// A non-negative integer column (position, version) as the model's `u64`.
pub(crate) fn to_u64(value: i64, column: &'static str) -> Result<u64, sqlx::Error> {
    u64::try_from(value).map_err(|e| sqlx::Error::ColumnDecode {
        index: column.into(),
        source: Box::new(e),
    })
}

/// A position or version the store computed from the databases' own columns, for a 64-bit
/// signed integer column. Never a caller's value: that goes through [`lower_bound`].
pub(crate) fn to_i64(value: u64) -> i64 {
    i64::try_from(value).expect("positions and versions fit in a signed 64-bit column")
}

/// A caller's first position or version (`>= from`) for a 64-bit signed integer column, or
/// `None` when it is beyond every value the column holds: such a read finds nothing.
pub(crate) fn lower_bound(from: u64) -> Option<i64> {
    i64::try_from(from).ok()
}

pub(crate) fn to_hash(bytes: &[u8], column: &'static str) -> Result<Hash, sqlx::Error> {
    Hash::from_slice(bytes).ok_or_else(|| sqlx::Error::ColumnDecode {
        index: column.into(),
        source: format!("expected 32 bytes, found {}", bytes.len()).into(),
    })
}

pub(crate) fn to_stream_id(id: String) -> Result<StreamId, sqlx::Error> {
    StreamId::new(id).map_err(|e| sqlx::Error::ColumnDecode {
        index: "stream_id".into(),
        source: Box::new(e),
    })
}

pub(crate) fn to_schema_version(value: i64) -> Result<u32, sqlx::Error> {
    u32::try_from(value).map_err(|e| sqlx::Error::ColumnDecode {
        index: "schema_version".into(),
        source: Box::new(e),
    })
}

/// A read limit as a SQL parameter.
pub(crate) fn limit_param(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// Every event in position order, for a verifier that streams through the ledger in one query.
pub(crate) const SCAN_EVENTS: &str = select_events!("ORDER BY position");
/// Events from `$1` to `$2`, in position order.
pub(crate) const READ_RANGE: &str =
    select_events!("WHERE position >= $1 AND position <= $2 ORDER BY position LIMIT $3");
/// The second pass of a verification, as queries that return only what is wrong, so that the
/// database checks every event in its own code and hands nothing over for a healthy ledger. They
/// walk indexes with a lookup per stream: no sort, no hash table, flat memory.
///
/// `streams` rows that disagree with their events: the row's version, and the number, first and
/// last version of the stream's events (one index range per stream, grouped in the rows' order).
/// None means every stream's events are versions `1..=n` (they are unique by the `(stream_id,
/// version)` constraint) and its row says `n`.
pub(crate) const STREAM_ROWS: &str = "SELECT s.stream_id, s.version, count(e.version), \
     min(e.version), max(e.version) FROM streams s LEFT JOIN events e ON e.stream_id = s.stream_id \
     GROUP BY s.stream_id, s.version \
     HAVING max(e.version) IS NULL OR s.version <> max(e.version) \
       OR count(e.version) <> max(e.version) OR min(e.version) <> 1";
/// One stream's versions and positions in version order, to find where a stream that disagrees
/// goes wrong.
pub(crate) const STREAM_EVENTS: &str =
    "SELECT version, position FROM events WHERE stream_id = $1 ORDER BY version";
/// The position of one stream's event at one version.
pub(crate) const EVENT_POSITION: &str =
    "SELECT position FROM events WHERE stream_id = $1 AND version = $2";
/// Streams with events but no `streams` row, with their first event's position.
pub(crate) const STREAMS_MISSING: &str = "SELECT e.stream_id, e.position FROM events e \
     WHERE e.version = 1 AND NOT EXISTS (SELECT 1 FROM streams s WHERE s.stream_id = e.stream_id)";
/// How many streams there are.
pub(crate) const COUNT_STREAMS: &str = "SELECT count(*) FROM streams";
/// The first event at or after `$1`: its position and when it was recorded.
pub(crate) const POSITION_TIME: &str =
    "SELECT position, recorded_at FROM events WHERE position >= $1 ORDER BY position LIMIT 1";
