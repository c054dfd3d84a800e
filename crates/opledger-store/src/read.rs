//! The read half of the store, written once for both backends: one stream, the global order,
//! the head, a stream's version, the list of streams, and the rows they decode from. The
//! statements are in [`crate::columns`]; [`SqliteStore`](crate::SqliteStore),
//! [`PgStore`](crate::PgStore) and [`LedgerReader`](crate::LedgerReader) read through here.

use chrono::{DateTime, Utc};
use futures_util::{Stream, TryStreamExt};

use crate::backend::{Backend, Conn, EitherRow, ReadPool, Time};
use crate::columns::{
    LIST_STREAMS, POSITION_TIME, READ_ALL, READ_HEAD, READ_RANGE, READ_STREAM, STREAM_VERSION,
    limit_param, lower_bound, to_hash, to_i64, to_schema_version, to_stream_id, to_u64,
};
use crate::either;
use crate::error::StoreError;
use crate::model::{Head, Position, RecordedEvent, StreamId, StreamInfo, StreamVersion};
use crate::{postgres, sqlite};

/// Sorts a database error of `backend` into "retry later" and "bug or corruption".
pub(crate) fn classify(
    backend: Backend,
    operation: &'static str,
    error: sqlx::Error,
) -> StoreError {
    match backend {
        Backend::Sqlite => sqlite::classify(operation, error),
        Backend::Postgres => postgres::classify(operation, error),
    }
}

/// The head row ([`READ_HEAD`]) as a [`Head`].
pub(crate) fn head_from_row(row: &impl EitherRow) -> Result<Head, sqlx::Error> {
    Ok(Head {
        position: to_u64(row.try_get(0)?, "last_position")?,
        hash: to_hash(&row.try_get::<Vec<u8>>(1)?, "last_hash")?,
    })
}

/// An event row (every column, in the order `select_events!` lists them) as a [`RecordedEvent`].
pub(crate) fn event_from_row(row: &impl EitherRow) -> Result<RecordedEvent, sqlx::Error> {
    Ok(RecordedEvent {
        position: to_u64(row.try_get(0)?, "position")?,
        stream_id: to_stream_id(row.try_get(1)?)?,
        version: to_u64(row.try_get(2)?, "version")?,
        event_id: row.try_get(3)?,
        event_type: row.try_get(4)?,
        // An `integer` on PostgreSQL; the store never writes one beyond it on SQLite.
        schema_version: to_schema_version(row.try_get::<i32>(5)?.into())?,
        payload: row.try_get(6)?,
        metadata: row.try_get(7)?,
        recorded_at: row.try_get::<Time>(8)?.0,
        prev_hash: to_hash(&row.try_get::<Vec<u8>>(9)?, "prev_hash")?,
        hash: to_hash(&row.try_get::<Vec<u8>>(10)?, "hash")?,
    })
}

/// The last committed position and hash, read on `connection` (inside its transaction, if any).
pub(crate) async fn read_head(connection: Conn<'_>) -> Result<Head, sqlx::Error> {
    either!(connection, c => head_from_row(&sqlx::query(READ_HEAD).fetch_one(c).await?))
}

/// The head, read on a connection of `pool`.
pub(crate) async fn pool_head(pool: ReadPool<'_>) -> Result<Head, sqlx::Error> {
    either!(pool, p => read_head((&mut *p.acquire().await?).into()).await)
}

/// The head, from a connection of `pool`.
pub(crate) async fn head(pool: ReadPool<'_>) -> Result<Head, StoreError> {
    pool_head(pool)
        .await
        .map_err(|e| classify(pool.backend(), "reading the head", e))
}

/// Events of one stream with `version >= from_version`, in version order, at most `limit`.
pub(crate) async fn read_stream(
    pool: ReadPool<'_>,
    stream: &StreamId,
    from_version: StreamVersion,
    limit: usize,
) -> Result<Vec<RecordedEvent>, StoreError> {
    let Some(from_version) = lower_bound(from_version) else {
        return Ok(Vec::new());
    };
    either!(pool, p => sqlx::query(READ_STREAM)
        .bind(stream.as_str())
        .bind(from_version)
        .bind(limit_param(limit))
        .try_map(|row| event_from_row(&row))
        .fetch_all(p)
        .await)
    .map_err(|e| classify(pool.backend(), "reading a stream", e))
}

/// Events with `position >= from`, in position order, at most `limit`: the hot path of every
/// follower, decoded as the rows stream in.
pub(crate) async fn read_all(
    pool: ReadPool<'_>,
    from: Position,
    limit: usize,
) -> Result<Vec<RecordedEvent>, StoreError> {
    let Some(from) = lower_bound(from) else {
        return Ok(Vec::new());
    };
    let mut events = Vec::with_capacity(limit.min(4096));
    either!(pool, p => decode_events(
        sqlx::query(READ_ALL)
            .bind(from)
            .bind(limit_param(limit))
            .fetch(p),
        &mut events,
    )
    .await)
    .map_err(|e| classify(pool.backend(), "reading events", e))?;
    Ok(events)
}

/// Events with `from <= position <= to`, in position order, at most `limit`.
pub(crate) async fn read_range(
    pool: ReadPool<'_>,
    from: Position,
    to: Position,
    limit: usize,
) -> Result<Vec<RecordedEvent>, StoreError> {
    let Some(from) = lower_bound(from) else {
        return Ok(Vec::new());
    };
    let (to, limit) = (to_i64(to.min(i64::MAX as u64)), limit_param(limit));
    let mut events = Vec::new();
    either!(pool, p => decode_events(
        sqlx::query(READ_RANGE).bind(from).bind(to).bind(limit).fetch(p),
        &mut events,
    )
    .await)
    .map_err(|e| classify(pool.backend(), "reading events", e))?;
    Ok(events)
}

/// Decodes event rows into `events` as they stream in.
async fn decode_events<R: EitherRow>(
    mut rows: impl Stream<Item = Result<R, sqlx::Error>> + Unpin,
    events: &mut Vec<RecordedEvent>,
) -> Result<(), sqlx::Error> {
    while let Some(row) = rows.try_next().await? {
        events.push(event_from_row(&row)?);
    }
    Ok(())
}

/// A stream's version; 0 for a stream that does not exist.
pub(crate) async fn stream_version(
    pool: ReadPool<'_>,
    stream: &StreamId,
) -> Result<StreamVersion, StoreError> {
    let failed = |e| classify(pool.backend(), "reading a stream version", e);
    let version: Option<i64> = either!(pool, p => sqlx::query_scalar(STREAM_VERSION)
        .bind(stream.as_str())
        .fetch_optional(p)
        .await)
    .map_err(failed)?;
    to_u64(version.unwrap_or(0), "version").map_err(failed)
}

/// Streams with ids after `after`, in id order, at most `limit`.
pub(crate) async fn list_streams(
    pool: ReadPool<'_>,
    after: Option<&StreamId>,
    limit: usize,
) -> Result<Vec<StreamInfo>, StoreError> {
    either!(pool, p => sqlx::query(LIST_STREAMS)
        .bind(after.map_or("", StreamId::as_str))
        .bind(limit_param(limit))
        .try_map(|row| {
            Ok(StreamInfo {
                stream_id: to_stream_id(EitherRow::try_get(&row, 0)?)?,
                category: EitherRow::try_get(&row, 1)?,
                version: to_u64(EitherRow::try_get(&row, 2)?, "version")?,
                created_at: EitherRow::try_get::<Time>(&row, 3)?.0,
            })
        })
        .fetch_all(p)
        .await)
    .map_err(|e| classify(pool.backend(), "listing streams", e))
}

/// The first event at or after `position`: its position and when it was recorded.
pub(crate) async fn time_at(
    pool: ReadPool<'_>,
    position: Position,
) -> Result<Option<(Position, DateTime<Utc>)>, StoreError> {
    let Some(position) = lower_bound(position) else {
        return Ok(None);
    };
    let row: Option<(i64, Time)> = either!(pool, p => sqlx::query_as(POSITION_TIME)
        .bind(position)
        .fetch_optional(p)
        .await)
    .map_err(|e| classify(pool.backend(), "reading when an event was recorded", e))?;
    Ok(row.map(|(p, at)| (u64::try_from(p).unwrap_or(0), at.0)))
}

/// The read methods of [`EventStore`](crate::EventStore), for an implementation whose read pool
/// is `$pool` (an expression of `$self`): every store reads through the functions above.
macro_rules! event_store_reads {
    ($self:ident => $pool:expr) => {
        async fn read_stream(
            &$self,
            stream: &$crate::StreamId,
            from_version: $crate::StreamVersion,
            limit: usize,
        ) -> Result<Vec<$crate::RecordedEvent>, $crate::StoreError> {
            $crate::read::read_stream($pool, stream, from_version, limit).await
        }

        async fn read_all(
            &$self,
            from: $crate::Position,
            limit: usize,
        ) -> Result<Vec<$crate::RecordedEvent>, $crate::StoreError> {
            $crate::read::read_all($pool, from, limit).await
        }

        async fn head(&$self) -> Result<$crate::Head, $crate::StoreError> {
            $crate::read::head($pool).await
        }

        async fn stream_version(
            &$self,
            stream: &$crate::StreamId,
        ) -> Result<$crate::StreamVersion, $crate::StoreError> {
            $crate::read::stream_version($pool, stream).await
        }

        async fn list_streams(
            &$self,
            after: Option<&$crate::StreamId>,
            limit: usize,
        ) -> Result<Vec<$crate::StreamInfo>, $crate::StoreError> {
            $crate::read::list_streams($pool, after, limit).await
        }
    };
}
pub(crate) use event_store_reads;
