//! Checking a ledger's integrity from its rows alone: gapless positions, an unbroken hash chain,
//! deterministic event ids, time that never goes back, contiguous stream versions, and a head row
//! and `streams` table that agree with the events.
//!
//! [`verify`] goes through a whole ledger with flat memory, in two passes that run at once, each
//! on its own connection in its own read-only snapshot:
//! 1. position order ([`ChainCheck`]), streamed from one query: positions `1, 2, 3, …` without a
//!    gap, each event's `prev_hash` equal to its predecessor's hash, each hash recomputed from
//!    the event's fields ([`crate::chain`]), each event id derived from its stream and version,
//!    `recorded_at` never decreasing, the last event equal to the head row, and optionally a hash
//!    kept elsewhere ([`Checkpoint`]); a reader task fetches the next events while the current
//!    ones are checked;
//! 2. per stream, inside the database: queries that walk the `(stream_id, version)` index with
//!    a lookup per stream and return only what is wrong (a stream whose events are not versions
//!    `1..=n`, a `streams` row that disagrees with its events, events without a `streams` row),
//!    so a healthy ledger hands nothing over; a stream that disagrees is then read in version
//!    order to name the first event out of sequence.
//!
//! Neither pass keeps more than the current chunk of events, so memory does not grow with the
//! ledger. What is reported is the broken link with the lowest position of both passes.
//!
//! [`Verifier`] is the same first pass plus each stream's version in a map, for tests that hold
//! a small ledger in memory.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use futures_util::TryStreamExt;
use sqlx::{Executor, Row};
use tokio::sync::{mpsc, oneshot};

use crate::backend::Backend;
use crate::chain::Hash;
use crate::columns::{
    COUNT_STREAMS, EVENT_POSITION, SCAN_EVENTS, STREAM_EVENTS, STREAM_ROWS, STREAMS_MISSING, to_u64,
};
use crate::either;
use crate::error::StoreError;
use crate::model::{Head, Position, RecordedEvent, StreamVersion, event_id};
use crate::read::{event_from_row, read_head};
use crate::reader::LedgerReader;

/// The first thing found wrong, with the position where it shows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Broken {
    #[error(
        "position {expected} is missing: the event after position {} is at position {found} (events were removed or reordered)",
        expected - 1
    )]
    PositionGap { expected: Position, found: Position },
    #[error(
        "event {position} does not link to its predecessor: its prev_hash is not the hash of event {} (events were removed, inserted or reordered)",
        position - 1
    )]
    BrokenLink { position: Position },
    #[error("event {position} was altered: its stored hash does not match its content")]
    HashMismatch { position: Position },
    #[error("event {position} has an event id that does not derive from its stream and version")]
    EventId { position: Position },
    #[error("event {position} was recorded before event {}: time goes back", position - 1)]
    TimeOrder { position: Position },
    #[error(
        "event {position} is version {found} of stream `{stream}`, expected version {expected}"
    )]
    VersionGap {
        position: Position,
        stream: String,
        expected: StreamVersion,
        found: StreamVersion,
    },
    #[error(
        "event {position} is version {version} of stream `{stream}`, out of sequence: version {missing} of that stream is missing"
    )]
    VersionMissing {
        position: Position,
        stream: String,
        version: StreamVersion,
        missing: StreamVersion,
    },
    #[error("event {position} repeats version {version} of stream `{stream}`")]
    DuplicateVersion {
        position: Position,
        stream: String,
        version: StreamVersion,
    },
    #[error("stream `{stream}` has events (the first at position {position}) but no streams row")]
    StreamMissing { position: Position, stream: String },
    #[error(
        "the streams table says stream `{stream}` is at version {table}, but its events end at version {events}{}",
        position.map(|p| format!(" (event {p} is beyond the table's version)")).unwrap_or_default()
    )]
    StreamVersion {
        position: Option<Position>,
        stream: String,
        table: StreamVersion,
        events: StreamVersion,
    },
    #[error("the ledger head says position {head_position}, but the events end at {last}")]
    HeadPosition {
        head_position: Position,
        last: Position,
    },
    #[error("the ledger head's hash does not match the hash of event {position}")]
    HeadHash { position: Position },
    #[error(
        "event {position} has hash {found}, not the {expected} kept for it: the history up to it was rewritten"
    )]
    CheckpointMismatch {
        position: Position,
        expected: Hash,
        found: Hash,
    },
    #[error(
        "a hash was kept for position {position}, but the events end at {last}: the history was cut short"
    )]
    CheckpointMissing { position: Position, last: Position },
}

impl Broken {
    /// The lowest position where the damage shows; `None` when it has none of its own (a stream
    /// whose last events are gone: the gap they left shows in the chain).
    pub fn position(&self) -> Option<Position> {
        match self {
            Broken::PositionGap { expected, .. } => Some(*expected),
            Broken::BrokenLink { position }
            | Broken::HashMismatch { position }
            | Broken::EventId { position }
            | Broken::TimeOrder { position }
            | Broken::VersionGap { position, .. }
            | Broken::VersionMissing { position, .. }
            | Broken::DuplicateVersion { position, .. }
            | Broken::StreamMissing { position, .. }
            | Broken::HeadHash { position }
            | Broken::CheckpointMismatch { position, .. } => Some(*position),
            Broken::StreamVersion { position, .. } => *position,
            Broken::HeadPosition {
                head_position,
                last,
            } => Some((*head_position).min(*last) + 1),
            Broken::CheckpointMissing { last, .. } => Some(last + 1),
        }
    }

    /// A stable snake_case name of what is wrong, for scripts.
    pub fn kind(&self) -> &'static str {
        match self {
            Broken::PositionGap { .. } => "position_gap",
            Broken::BrokenLink { .. } => "broken_link",
            Broken::HashMismatch { .. } => "hash_mismatch",
            Broken::EventId { .. } => "event_id",
            Broken::TimeOrder { .. } => "time_order",
            Broken::VersionGap { .. } => "version_gap",
            Broken::VersionMissing { .. } => "version_missing",
            Broken::DuplicateVersion { .. } => "duplicate_version",
            Broken::StreamMissing { .. } => "stream_missing",
            Broken::StreamVersion { .. } => "stream_version",
            Broken::HeadPosition { .. } => "head_position",
            Broken::HeadHash { .. } => "head_hash",
            Broken::CheckpointMismatch { .. } => "checkpoint_mismatch",
            Broken::CheckpointMissing { .. } => "checkpoint_missing",
        }
    }

    /// Whichever of two breaks shows at the lower position (the first on a tie).
    pub fn lowest(a: Option<Broken>, b: Option<Broken>) -> Option<Broken> {
        match (a, b) {
            (Some(a), Some(b)) => {
                let key = |x: &Broken| x.position().unwrap_or(Position::MAX);
                Some(if key(&b) < key(&a) { b } else { a })
            }
            (a, b) => a.or(b),
        }
    }
}

/// A hash the ledger must hold at a position, kept somewhere else (`opledger audit head`), so
/// that a rewrite of the whole chain, which leaves every link consistent, is still detected.
/// Written `POSITION:HASH`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    pub position: Position,
    pub hash: Hash,
}

impl fmt::Display for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.position, self.hash)
    }
}

impl From<Head> for Checkpoint {
    fn from(head: Head) -> Self {
        Checkpoint {
            position: head.position,
            hash: head.hash,
        }
    }
}

/// A `POSITION:HASH` that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "expected POSITION:HASH (a position of at least 1, a colon and 64 hex digits, as `opledger audit head` prints it), found `{0}`"
)]
pub struct BadCheckpoint(String);

impl FromStr for Checkpoint {
    type Err = BadCheckpoint;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || BadCheckpoint(text.to_owned());
        let (position, hash) = text.trim().split_once(':').ok_or_else(bad)?;
        let position: Position = position.parse().map_err(|_| bad())?;
        let bytes = hex::decode(hash).map_err(|_| bad())?;
        let hash = Hash::from_slice(&bytes).ok_or_else(bad)?;
        if position == 0 {
            return Err(bad());
        }
        Ok(Checkpoint { position, hash })
    }
}

/// The first pass: events fed in position order, from a known start.
#[derive(Debug, Clone)]
pub struct ChainCheck {
    first: Position,
    next: Position,
    prev: Hash,
    recorded_at: i64,
    checkpoint: Option<Checkpoint>,
}

impl Default for ChainCheck {
    fn default() -> Self {
        Self::new()
    }
}

impl ChainCheck {
    /// A check expecting the ledger's first event.
    pub fn new() -> Self {
        Self::starting_at(1, Hash::GENESIS)
    }

    /// A check expecting the event at `position` whose predecessor's hash is `prev` (an export
    /// of a range).
    pub fn starting_at(position: Position, prev: Hash) -> Self {
        Self {
            first: position,
            next: position,
            prev,
            recorded_at: i64::MIN,
            checkpoint: None,
        }
    }

    /// Also checks that the event at the checkpoint's position has its hash.
    pub fn with_checkpoint(mut self, checkpoint: Option<Checkpoint>) -> Self {
        self.checkpoint = checkpoint;
        self
    }

    /// Checks the next event.
    pub fn check(&mut self, event: &RecordedEvent) -> Result<(), Broken> {
        let position = event.position;
        if position != self.next {
            return Err(Broken::PositionGap {
                expected: self.next,
                found: position,
            });
        }
        if event.prev_hash != self.prev {
            return Err(Broken::BrokenLink { position });
        }
        if event.link().seal(&self.prev) != event.hash {
            return Err(Broken::HashMismatch { position });
        }
        if event.event_id != event_id(&event.stream_id, event.version) {
            return Err(Broken::EventId { position });
        }
        let recorded_at = event.recorded_at.timestamp_micros();
        if recorded_at < self.recorded_at {
            return Err(Broken::TimeOrder { position });
        }
        if let Some(checkpoint) = self.checkpoint
            && checkpoint.position == position
            && checkpoint.hash != event.hash
        {
            return Err(Broken::CheckpointMismatch {
                position,
                expected: checkpoint.hash,
                found: event.hash,
            });
        }
        self.recorded_at = recorded_at;
        self.prev = event.hash;
        self.next += 1;
        Ok(())
    }

    /// How many events passed.
    pub fn checked(&self) -> u64 {
        self.next - self.first
    }

    /// The last event that passed (the starting point before any did).
    pub fn last(&self) -> Head {
        Head {
            position: self.next - 1,
            hash: self.prev,
        }
    }

    /// Once every event passed: the checkpoint's position must have been seen.
    pub fn finish(&self) -> Result<(), Broken> {
        match self.checkpoint {
            Some(checkpoint) if checkpoint.position >= self.next => {
                Err(Broken::CheckpointMissing {
                    position: checkpoint.position,
                    last: self.next - 1,
                })
            }
            _ => Ok(()),
        }
    }

    /// Once every event passed: the ledger's head row must name the last event and its hash.
    pub fn finish_at(&self, head: &Head) -> Result<(), Broken> {
        self.finish()?;
        let last = self.last();
        if head.position != last.position {
            return Err(Broken::HeadPosition {
                head_position: head.position,
                last: last.position,
            });
        }
        if head.hash != last.hash {
            return Err(Broken::HeadHash {
                position: head.position,
            });
        }
        Ok(())
    }
}

/// What [`verify`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verification {
    /// The `ledger_head` row of the snapshot verified.
    pub head: Head,
    /// Events that passed the first pass (all of them when nothing is broken).
    pub events: u64,
    /// Streams in the `streams` table.
    pub streams: u64,
    /// The broken link with the lowest position, if any.
    pub broken: Option<Broken>,
}

/// Events handed from the reader task to the checks at a time.
const CHUNK: usize = 2048;
/// Chunks read ahead of the checks.
const AHEAD: usize = 4;

/// Verifies the whole ledger behind `reader` (see the module documentation) with flat memory;
/// `checkpoint` is a hash kept elsewhere that the ledger must hold. `Err` only when the ledger
/// cannot be read; what is broken is in [`Verification::broken`].
///
/// The two passes run at once, each on its own connection in its own read-only snapshot, so that
/// they use two cores (two server processes on PostgreSQL). Each snapshot is consistent in
/// itself (events, head and streams rows of one moment), and the ledger only grows, so each
/// pass's findings hold; the head reported is the first pass's.
pub async fn verify(
    reader: &LedgerReader,
    checkpoint: Option<Checkpoint>,
) -> Result<Verification, StoreError> {
    let started = std::time::Instant::now();
    let streams = tokio::spawn(check_streams(reader.clone()));
    let (head_tx, head_rx) = oneshot::channel();
    let (events_tx, mut events_rx) = mpsc::channel(AHEAD);
    let scan = tokio::spawn(scan_events(reader.clone(), head_tx, events_tx));

    let head = match head_rx.await {
        Ok(head) => head?,
        Err(_) => {
            return Err(match scan.await {
                Ok(()) => StoreError::storage(
                    "verifying the ledger",
                    std::io::Error::other("the reader stopped without a head"),
                ),
                Err(e) => StoreError::storage("verifying the ledger", e),
            });
        }
    };
    let mut chain = ChainCheck::new().with_checkpoint(checkpoint);
    let mut chain_broken = None;
    'events: while let Some(chunk) = events_rx.recv().await {
        for event in &chunk? {
            if let Err(broken) = chain.check(event) {
                chain_broken = Some(broken);
                break 'events;
            }
        }
    }
    // Dropping the receiver tells the reader to stop.
    drop(events_rx);
    if chain_broken.is_none() {
        chain_broken = chain.finish_at(&head).err();
    }
    let chain_seconds = started.elapsed().as_secs_f64();
    scan.await
        .map_err(|e| StoreError::storage("verifying the ledger", e))?;
    let (stream_count, streams_broken) = streams
        .await
        .map_err(|e| StoreError::storage("verifying the ledger", e))??;
    tracing::debug!(
        events = chain.checked(),
        chain_seconds,
        seconds = started.elapsed().as_secs_f64(),
        "verified the ledger"
    );
    Ok(Verification {
        head,
        events: chain.checked(),
        streams: stream_count,
        broken: Broken::lowest(chain_broken, streams_broken),
    })
}

/// The first pass's reader: in one snapshot, the head, then every event in position order, in
/// chunks, until the checks hang up. A read error goes where the checks are waiting, so that a
/// failed read is never mistaken for the ledger's end.
async fn scan_events(
    reader: LedgerReader,
    head: oneshot::Sender<Result<Head, StoreError>>,
    events: mpsc::Sender<Result<Vec<RecordedEvent>, StoreError>>,
) {
    let mut head = Some(head);
    let begin = snapshot_begin(reader.backend());
    let result = either!(&reader, pool => {
        snapshot!(pool, begin, |connection| {
            scan_events_on!(connection, head, events)
        })
    });
    if let Err(error) = result {
        let error = reader.classify("verifying the ledger", error);
        match head.take() {
            Some(head) => {
                let _ = head.send(Err(error));
            }
            None => {
                let _ = events.send(Err(error)).await;
            }
        }
    }
}

/// The second pass, whole: the queries that return what is wrong with the streams (see
/// [`STREAM_ROWS`]), in one snapshot; the number of streams and the lowest break.
async fn check_streams(reader: LedgerReader) -> Result<(u64, Option<Broken>), StoreError> {
    let mut found = Vec::new();
    let mut streams = 0;
    let begin = snapshot_begin(reader.backend());
    let result = either!(&reader, pool => {
        snapshot!(pool, begin, |connection| {
            check_streams_on!(connection, streams, found)
        })
    });
    result.map_err(|e| reader.classify("verifying the ledger's streams", e))?;
    let broken = found
        .into_iter()
        .fold(None, |lowest, broken| Broken::lowest(lowest, Some(broken)));
    Ok((streams, broken))
}

/// A read-only snapshot on PostgreSQL. The scans follow the indexes (position; stream and
/// version) instead of sorting or hashing the whole ledger, which would need memory or disk in
/// proportion to it.
const PG_SNAPSHOT: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; \
     SET LOCAL enable_sort = off; SET LOCAL enable_hashagg = off; \
     SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off; SET LOCAL jit = off";

/// How a snapshot begins: where the backends differ in taking it (on SQLite a deferred
/// `BEGIN`, whose first read takes the snapshot).
fn snapshot_begin(backend: Backend) -> &'static str {
    match backend {
        Backend::Sqlite => "BEGIN",
        Backend::Postgres => PG_SNAPSHOT,
    }
}

/// Runs `$body` with a connection of `$pool` inside a read transaction begun by `$begin` (on
/// SQLite a deferred `BEGIN`: its first read takes the snapshot every later read sees), then
/// ends it; a connection left in doubt is closed rather than returned to the pool.
macro_rules! snapshot {
    ($pool:expr, $begin:expr, |$connection:ident| $body:block) => {
        async {
            let mut pooled = $pool.acquire().await?;
            sqlx::raw_sql($begin).execute(&mut *pooled).await?;
            let result: Result<(), sqlx::Error> = async {
                let $connection = &mut *pooled;
                $body
            }
            .await;
            if result.is_err() || pooled.execute("ROLLBACK").await.is_err() {
                pooled.close_on_drop();
            }
            result
        }
        .await
    };
}
use snapshot;

/// The first pass's reads on one connection (see [`scan_events`]).
macro_rules! scan_events_on {
    ($connection:ident, $head:ident, $events:ident) => {{
        let head_row = read_head((&mut *$connection).into()).await?;
        let Some(sender) = $head.take() else {
            return Ok(());
        };
        if sender.send(Ok(head_row)).is_err() {
            return Ok(());
        }
        let mut rows = sqlx::query(SCAN_EVENTS).fetch(&mut *$connection);
        let mut chunk = Vec::with_capacity(CHUNK);
        while let Some(row) = rows.try_next().await? {
            chunk.push(event_from_row(&row)?);
            if chunk.len() == CHUNK {
                let full = std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK));
                if $events.send(Ok(full)).await.is_err() {
                    return Ok(());
                }
            }
        }
        if !chunk.is_empty() {
            let _ = $events.send(Ok(chunk)).await;
        }
        Ok(())
    }};
}
use scan_events_on;

/// The second pass's queries on one connection (see [`check_streams`]).
macro_rules! check_streams_on {
    ($connection:ident, $streams:ident, $found:ident) => {{
        let mut disagreeing = Vec::new();
        let mut rows = sqlx::query(STREAM_ROWS).fetch(&mut *$connection);
        while let Some(row) = rows.try_next().await? {
            let stream: String = row.try_get(0)?;
            let table = to_u64(row.try_get(1)?, "version")?;
            let events = to_u64(row.try_get(2)?, "count")?;
            let first = to_u64(row.try_get::<Option<i64>, _>(3)?.unwrap_or(0), "version")?;
            let last = to_u64(row.try_get::<Option<i64>, _>(4)?.unwrap_or(0), "version")?;
            disagreeing.push((stream, table, events, first, last));
        }
        drop(rows);
        // Only streams that disagree are looked at closer, one at a time.
        for (stream, table, events, first, last) in disagreeing {
            if events > 0 && (events != last || first != 1) {
                let mut expected = 1;
                let mut lowest: Option<Broken> = None;
                let mut rows = sqlx::query(STREAM_EVENTS)
                    .bind(&stream)
                    .fetch(&mut *$connection);
                while let Some(row) = rows.try_next().await? {
                    let version = to_u64(row.try_get(0)?, "version")?;
                    let position = to_u64(row.try_get(1)?, "position")?;
                    let broken = if version < expected {
                        Some(Broken::DuplicateVersion {
                            position,
                            stream: stream.clone(),
                            version,
                        })
                    } else if version > expected {
                        Some(Broken::VersionMissing {
                            position,
                            stream: stream.clone(),
                            version,
                            missing: expected,
                        })
                    } else {
                        None
                    };
                    lowest = Broken::lowest(lowest, broken);
                    expected = version + 1;
                }
                drop(rows);
                $found.extend(lowest);
                continue;
            }
            // The events are 1..=last; the row says otherwise. Where the events go beyond
            // what the row says, if they do.
            let beyond: Option<i64> = if table < last {
                sqlx::query_scalar(EVENT_POSITION)
                    .bind(&stream)
                    .bind(crate::columns::to_i64(table + 1))
                    .fetch_optional(&mut *$connection)
                    .await?
            } else {
                None
            };
            $found.push(Broken::StreamVersion {
                position: beyond.map(|p| to_u64(p, "position")).transpose()?,
                stream,
                table,
                events: last,
            });
        }
        let mut rows = sqlx::query(STREAMS_MISSING).fetch(&mut *$connection);
        while let Some(row) = rows.try_next().await? {
            $found.push(Broken::StreamMissing {
                stream: row.try_get(0)?,
                position: to_u64(row.try_get(1)?, "position")?,
            });
        }
        drop(rows);
        let count: i64 = sqlx::query_scalar(COUNT_STREAMS)
            .fetch_one(&mut *$connection)
            .await?;
        $streams = to_u64(count, "count")?;
        Ok(())
    }};
}
use check_streams_on;

/// Verifies events fed in position order, counting each stream's version in memory: for tests
/// and small ledgers (memory grows with the number of streams). [`verify`] streams instead.
#[derive(Debug, Default)]
pub struct Verifier {
    chain: ChainCheck,
    versions: HashMap<String, StreamVersion>,
}

impl Verifier {
    /// A verifier expecting the ledger's first event.
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks the next event.
    pub fn check(&mut self, event: &RecordedEvent) -> Result<(), Broken> {
        self.chain.check(event)?;
        let last = self
            .versions
            .get(event.stream_id.as_str())
            .copied()
            .unwrap_or(0);
        if event.version != last + 1 {
            return Err(Broken::VersionGap {
                position: event.position,
                stream: event.stream_id.to_string(),
                expected: last + 1,
                found: event.version,
            });
        }
        self.versions
            .insert(event.stream_id.as_str().to_owned(), event.version);
        Ok(())
    }

    /// Checks that the events seen end where the ledger head says, and returns how many there
    /// were.
    pub fn finish(self, head: &Head) -> Result<Position, Broken> {
        self.chain.finish_at(head)?;
        Ok(self.chain.last().position)
    }

    /// Each stream's version as counted from its events.
    pub fn stream_versions(&self) -> &HashMap<String, StreamVersion> {
        &self.versions
    }
}

#[cfg(test)]
mod tests {
    use sqlx::{ConnectOptions, Connection, Executor};

    use super::*;
    use crate::model::{AppendRequest, ExpectedVersion, NewEvent, StreamId};
    use crate::store::EventStore;
    use crate::{SqliteOptions, SqliteStore};

    /// A SQLite ledger of three streams of three events each, interleaved: stream `s-k` has its
    /// version `v` at position `3 * (v - 1) + k + 1`.
    async fn ledger(dir: &std::path::Path) -> String {
        let url = format!("sqlite://{}", dir.join("ledger.db").display());
        let store = SqliteStore::open(&url, SqliteOptions::default())
            .await
            .expect("open");
        for _ in 0..3 {
            for k in 0..3 {
                let event = NewEvent::new("Tested", 1, crate::empty_object());
                let stream = StreamId::new(format!("s-{k}")).expect("stream id");
                store
                    .append(vec![AppendRequest::new(
                        stream,
                        ExpectedVersion::Any,
                        vec![event],
                    )])
                    .await
                    .expect("append");
            }
        }
        store.close().await;
        url
    }

    /// Runs `sql` on the ledger with the append-only triggers dropped, then the second pass.
    async fn streams_after(sql: &str) -> (u64, Option<Broken>) {
        let dir = tempfile::tempdir().expect("temporary directory");
        let url = ledger(dir.path()).await;
        let mut raw = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(dir.path().join("ledger.db"))
            .connect()
            .await
            .expect("connect");
        raw.execute(
            "DROP TRIGGER events_refuse_update; DROP TRIGGER events_refuse_delete; \
             DROP TRIGGER streams_refuse_delete; DROP TRIGGER streams_forward_only",
        )
        .await
        .expect("drop the triggers");
        raw.execute(sqlx::AssertSqlSafe(sql.to_owned()))
            .await
            .expect("tamper");
        raw.close().await.expect("close");
        let reader = LedgerReader::open(&url).await.expect("open read-only");
        let found = check_streams(reader.clone()).await.expect("check");
        reader.close().await;
        found
    }

    #[tokio::test]
    async fn the_second_pass_finds_nothing_in_a_healthy_ledger() {
        assert_eq!(streams_after("SELECT 1").await, (3, None));
    }

    #[tokio::test]
    async fn a_version_out_of_sequence_is_found_at_its_position() {
        // Stream s-1's version 2 (position 5) becomes version 12: versions 1, 3, 12.
        let (_, broken) = streams_after("UPDATE events SET version = 12 WHERE position = 5").await;
        assert_eq!(
            broken,
            Some(Broken::VersionMissing {
                position: 5,
                stream: "s-1".into(),
                version: 12,
                missing: 4
            })
        );
    }

    #[tokio::test]
    async fn a_repeated_version_is_found_at_its_position() {
        // Stream s-0's version 3 (position 7) becomes a second version 2: versions 1, 2, 2.
        let (_, broken) = streams_after(
            // Only a table without the (stream_id, version) constraint can hold it.
            "DROP TRIGGER ledger_head_matches_events; \
             CREATE TABLE copy AS SELECT * FROM events; DROP TABLE events; \
             ALTER TABLE copy RENAME TO events; \
             CREATE INDEX events_by_stream ON events (stream_id, version); \
             UPDATE events SET version = 2 WHERE position = 7",
        )
        .await;
        assert!(
            matches!(
                broken,
                Some(Broken::DuplicateVersion { position: 4 | 7, ref stream, version: 2 })
                    if stream == "s-0"
            ),
            "{broken:?}"
        );
    }

    #[tokio::test]
    async fn streams_rows_that_disagree_are_found() {
        let (_, broken) =
            streams_after("UPDATE streams SET version = 2 WHERE stream_id = 's-2'").await;
        assert_eq!(
            broken,
            Some(Broken::StreamVersion {
                position: Some(9),
                stream: "s-2".into(),
                table: 2,
                events: 3
            })
        );
        let (_, broken) = streams_after("DELETE FROM streams WHERE stream_id = 's-1'").await;
        assert_eq!(
            broken,
            Some(Broken::StreamMissing {
                position: 2,
                stream: "s-1".into()
            })
        );
    }
}
