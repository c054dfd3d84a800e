//! Attachments: bytes beside a stream's history (`attachments` table, migration 0002), written
//! and deleted inside the append transaction of the request that names them, so they exist
//! exactly when the events that mention them do. Not hashed, not exported, not verified: the
//! history holds what proves them (e.g. an update's digest), docs/adr/0012.

use std::collections::BTreeMap;

use crate::backend::{Conn, ReadPool};
use crate::either;
use crate::error::StoreError;
use crate::model::{AppendRequest, Appended, StreamId};
use crate::read::classify;

/// What a batch leaves of each attachment it touches: `Some(body)` written, `None` deleted. The
/// accepted calls count in order, so a later call's word on a name is the last.
pub(crate) type Changes<'a> = BTreeMap<(&'a str, &'a str), Option<&'a [u8]>>;

/// The attachment changes of the batch's accepted calls (`results[i]` is call `i`'s outcome).
pub(crate) fn of<'a>(
    calls: &'a [Vec<AppendRequest>],
    results: &[Result<Appended, StoreError>],
) -> Changes<'a> {
    let mut changes = Changes::new();
    for (call, result) in calls.iter().zip(results) {
        if result.is_err() {
            continue;
        }
        for request in call {
            let stream = request.stream.as_str();
            for name in &request.detach {
                changes.insert((stream, name.as_str()), None);
            }
            for attachment in &request.attach {
                changes.insert(
                    (stream, attachment.name.as_str()),
                    Some(attachment.body.as_slice()),
                );
            }
        }
    }
    changes
}

/// SQLite: writes rows bound as one JSON array of `[stream, name, hex body]`.
const SQLITE_PUT: &str = "\
    INSERT INTO attachments (stream_id, name, body) \
        SELECT value ->> 0, value ->> 1, unhex(value ->> 2) FROM jsonb_each($1) WHERE true \
        ON CONFLICT (stream_id, name) DO UPDATE SET body = excluded.body";
const SQLITE_DELETE: &str = "\
    DELETE FROM attachments WHERE (stream_id, name) IN \
        (SELECT value ->> 0, value ->> 1 FROM jsonb_each($1))";
/// PostgreSQL: the same, bound as arrays.
const POSTGRES_PUT: &str = "\
    INSERT INTO attachments (stream_id, name, body) \
        SELECT * FROM UNNEST($1::text[], $2::text[], $3::bytea[]) \
        ON CONFLICT (stream_id, name) DO UPDATE SET body = excluded.body";
const POSTGRES_DELETE: &str = "\
    DELETE FROM attachments a USING UNNEST($1::text[], $2::text[]) AS d(stream_id, name) \
        WHERE a.stream_id = d.stream_id AND a.name = d.name";

/// Applies `changes` inside the caller's open append transaction.
pub(crate) async fn write(connection: Conn<'_>, changes: &Changes<'_>) -> Result<(), sqlx::Error> {
    if changes.is_empty() {
        return Ok(());
    }
    let (puts, deletes): (Vec<_>, Vec<_>) = changes.iter().partition(|(_, body)| body.is_some());
    match connection {
        crate::Either::Sqlite(c) => {
            if !puts.is_empty() {
                let rows: Vec<[String; 3]> = puts
                    .iter()
                    .map(|((stream, name), body)| {
                        [
                            (*stream).to_owned(),
                            (*name).to_owned(),
                            hex::encode(body.unwrap_or_default()),
                        ]
                    })
                    .collect();
                let rows = serde_json::to_string(&rows).expect("strings serialize");
                sqlx::query(SQLITE_PUT).bind(rows).execute(&mut *c).await?;
            }
            if !deletes.is_empty() {
                let rows: Vec<[&str; 2]> = deletes
                    .iter()
                    .map(|((stream, name), _)| [*stream, *name])
                    .collect();
                let rows = serde_json::to_string(&rows).expect("strings serialize");
                sqlx::query(SQLITE_DELETE)
                    .bind(rows)
                    .execute(&mut *c)
                    .await?;
            }
        }
        crate::Either::Postgres(c) => {
            if !puts.is_empty() {
                let streams: Vec<&str> = puts.iter().map(|((s, _), _)| *s).collect();
                let names: Vec<&str> = puts.iter().map(|((_, n), _)| *n).collect();
                let bodies: Vec<&[u8]> = puts.iter().map(|(_, b)| b.unwrap_or_default()).collect();
                sqlx::query(POSTGRES_PUT)
                    .bind(streams)
                    .bind(names)
                    .bind(bodies)
                    .execute(&mut *c)
                    .await?;
            }
            if !deletes.is_empty() {
                let streams: Vec<&str> = deletes.iter().map(|((s, _), _)| *s).collect();
                let names: Vec<&str> = deletes.iter().map(|((_, n), _)| *n).collect();
                sqlx::query(POSTGRES_DELETE)
                    .bind(streams)
                    .bind(names)
                    .execute(&mut *c)
                    .await?;
            }
        }
    }
    Ok(())
}

const READ: &str = "SELECT body FROM attachments WHERE stream_id = $1 AND name = $2";

/// The attachment `name` of `stream`, if it exists (it was written and not yet deleted).
pub(crate) async fn read(
    pool: ReadPool<'_>,
    stream: &StreamId,
    name: &str,
) -> Result<Option<Vec<u8>>, StoreError> {
    either!(pool, p => sqlx::query_scalar::<_, Vec<u8>>(READ)
        .bind(stream.as_str())
        .bind(name)
        .fetch_optional(p)
        .await)
    .map_err(|e| classify(pool.backend(), "reading an attachment", e))
}
