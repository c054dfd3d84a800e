//! `metrics`: what operators watch, as a read model. Counters of what the ledger noted
//! (duplicate deliveries, update id collisions, key conflicts, quarantined bodies, refused
//! transitions) in `{table}`, and every operation's current state and since when in
//! `{table}_ops`, aggregated when read ([`snapshot`]): counts by state, and the age of the
//! oldest operation waiting to be claimed and of the oldest claim.
//!
//! Rejected webhook secrets are not here: nothing is written to the ledger for them, so the
//! service exports its own process counter. The counters add up across streams, so the
//! projection can only be rebuilt whole (`forget_stream` is `None`).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use opledger_domain::DomainEvent;
use opledger_domain::operation::{OperationEvent, ReconcileOutcome, Status};
use opledger_store::chain::Link;
use opledger_store::inline::ProjectionError;
use opledger_store::{Backend, EitherRow, ReadPool, Time, either};
use serde::Serialize;
use sqlx::{PgConnection, SqliteConnection};

use crate::projection::{Conn, Definition, Projection};
use crate::rows::{category, read_error};

pub use crate::rows::ReadError;

/// The projection's name and its active table's.
pub const NAME: &str = "metrics";

/// The SQLite schema (`projections/metrics/sqlite.sql`).
pub const SQLITE_SCHEMA: &str = include_str!("../../../projections/metrics/sqlite.sql");
/// The PostgreSQL schema (`projections/metrics/postgres.sql`).
pub const POSTGRES_SCHEMA: &str = include_str!("../../../projections/metrics/postgres.sql");

/// The counters, by the event type that counts in them.
const COUNTERS: &[(&str, &str)] = &[
    ("DuplicateDeliveryObserved", "duplicates_observed"),
    ("UpdateIdCollision", "update_id_collisions"),
    ("KeyConflictRecorded", "key_conflicts"),
    ("BodyQuarantined", "quarantined"),
    ("TransitionRejected", "transitions_rejected"),
    // The gateway's (no ledger before them holds these events, so the fold of an older ledger
    // is unchanged and needs no new version).
    ("UpdateForwarded", "updates_forwarded"),
    ("ForwardFailed", "forward_failures"),
    ("ForwardGivenUp", "forwards_given_up"),
];

/// Every state an operation can be in, in the order a snapshot lists them.
const STATES: &[Status] = &[
    Status::Received,
    Status::Claimed,
    Status::CallSent,
    Status::RetryScheduled,
    Status::NeedsReconciliation,
    Status::Confirmed,
    Status::Failed,
    Status::Reconciled,
];

/// The metrics projection.
#[derive(Clone, Copy, Debug, Default)]
pub struct Metrics;

/// The metrics at one moment.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MetricsSnapshot {
    /// Operations per state (every state, zeros included), in lifecycle order.
    pub by_state: Vec<(String, u64)>,
    /// How long the oldest operation waiting to be claimed (received, or a retry scheduled) has
    /// been in that state, in seconds; `None` when none waits.
    pub oldest_pending_age_secs: Option<f64>,
    /// How long the oldest claimed operation (claimed, or its call sent) has been in that
    /// state, in seconds; `None` when none is claimed.
    pub oldest_claimed_age_secs: Option<f64>,
    /// Deliveries of an update seen before (acknowledged, nothing started).
    pub duplicates_observed: u64,
    /// Update ids seen again with another body (not processed).
    pub update_id_collisions: u64,
    /// Requests with an existing business key and other parameters (refused).
    pub key_conflicts: u64,
    /// Authenticated webhook bodies that were not updates.
    pub quarantined: u64,
    /// Stale or late commands refused and recorded.
    pub transitions_rejected: u64,
    /// Updates a gateway's bot acknowledged.
    pub updates_forwarded: u64,
    /// Attempts to forward an update that failed.
    pub forward_failures: u64,
    /// Updates a gateway gave up forwarding.
    pub forwards_given_up: u64,
}

/// Why a page could not be folded into the metrics.
#[derive(Debug, thiserror::Error)]
#[error("event {position} of `{stream}` cannot be read: {source}")]
pub struct FoldError {
    position: u64,
    stream: String,
    #[source]
    source: opledger_domain::DecodeError,
}

/// The state an event puts its operation in, if it changes it.
fn new_status(link: &Link<'_>) -> Result<Option<Status>, FoldError> {
    let status = match link.event_type {
        "Received" => Status::Received,
        "Claimed" => Status::Claimed,
        "ExternalCallSent" => Status::CallSent,
        "Confirmed" => Status::Confirmed,
        "Failed" => Status::Failed,
        "RetryScheduled" => Status::RetryScheduled,
        "MarkedForReconciliation" => Status::NeedsReconciliation,
        "Reconciled" => {
            let event =
                OperationEvent::from_stored(link.event_type, link.schema_version, link.payload)
                    .map_err(|source| FoldError {
                        position: link.position,
                        stream: link.stream_id.to_owned(),
                        source,
                    })?;
            match event {
                OperationEvent::Reconciled(e) if e.outcome == ReconcileOutcome::Retry => {
                    Status::RetryScheduled
                }
                _ => Status::Reconciled,
            }
        }
        _ => return Ok(None),
    };
    Ok(Some(status))
}

/// What a page adds to the counters, and each changed operation's state at its end.
#[derive(Debug, Default)]
struct Changes {
    counters: Vec<(&'static str, i64)>,
    /// (stream, status, since), one per stream.
    ops: Vec<(String, Status, DateTime<Utc>)>,
}

fn changes(events: &[Link<'_>]) -> Result<Changes, FoldError> {
    let mut counts = [0_i64; COUNTERS.len()];
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut ops: Vec<(String, Status, DateTime<Utc>)> = Vec::new();
    for link in events {
        if let Some(i) = COUNTERS.iter().position(|(ty, _)| *ty == link.event_type) {
            counts[i] += 1;
        }
        if category(link.stream_id) != "op" {
            continue;
        }
        if let Some(status) = new_status(link)? {
            let at = link.recorded_at();
            match index.get(link.stream_id) {
                Some(&i) => ops[i] = (link.stream_id.to_owned(), status, at),
                None => {
                    index.insert(link.stream_id, ops.len());
                    ops.push((link.stream_id.to_owned(), status, at));
                }
            }
        }
    }
    Ok(Changes {
        counters: COUNTERS
            .iter()
            .zip(counts)
            .filter(|(_, n)| *n > 0)
            .map(|((_, name), n)| (*name, n))
            .collect(),
        ops,
    })
}

impl Projection for Metrics {
    fn definition(&self) -> Definition {
        Definition::new(NAME, 1, SQLITE_SCHEMA, POSTGRES_SCHEMA).with_tables(&["", "_ops"])
    }

    fn apply<'a>(
        &'a self,
        conn: Conn<'a>,
        table: &'a str,
        events: &'a [Link<'a>],
    ) -> BoxFuture<'a, Result<(), ProjectionError>> {
        Box::pin(async move {
            let changes = changes(events)?;
            // The counters and states are upserted in bulk, each backend its own way.
            match conn {
                Conn::Sqlite(c) => apply_sqlite(c, table, &changes).await?,
                Conn::Postgres(c) => apply_postgres(c, table, &changes).await?,
            }
            Ok(())
        })
    }
}

const ADD: &str = "ON CONFLICT (name) DO UPDATE SET value = c.value + excluded.value";
const OPS_UPDATED: &str =
    "ON CONFLICT (stream_id) DO UPDATE SET status = excluded.status, since = excluded.since";

async fn apply_sqlite(
    conn: &mut SqliteConnection,
    table: &str,
    changes: &Changes,
) -> Result<(), sqlx::Error> {
    if !changes.counters.is_empty() {
        let rows: Vec<serde_json::Value> = changes
            .counters
            .iter()
            .map(|(name, n)| serde_json::json!([name, n]))
            .collect();
        let sql = format!(
            "INSERT INTO \"{table}\" AS c (name, value) SELECT value ->> 0, value ->> 1 \
             FROM jsonb_each($1) WHERE true {ADD}"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(serde_json::Value::Array(rows).to_string())
            .execute(&mut *conn)
            .await?;
    }
    if !changes.ops.is_empty() {
        let rows: Vec<serde_json::Value> = changes
            .ops
            .iter()
            .map(|(stream, status, since)| {
                serde_json::json!([stream, status.as_str(), since.timestamp_micros()])
            })
            .collect();
        let sql = format!(
            "INSERT INTO \"{table}_ops\" (stream_id, status, since) SELECT value ->> 0, \
             value ->> 1, value ->> 2 FROM jsonb_each($1) WHERE true {OPS_UPDATED}"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(serde_json::Value::Array(rows).to_string())
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

async fn apply_postgres(
    conn: &mut PgConnection,
    table: &str,
    changes: &Changes,
) -> Result<(), sqlx::Error> {
    if !changes.counters.is_empty() {
        let sql = format!(
            "INSERT INTO \"{table}\" AS c (name, value) SELECT * FROM UNNEST($1::text[], \
             $2::bigint[]) {ADD}"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(
                changes
                    .counters
                    .iter()
                    .map(|(name, _)| (*name).to_owned())
                    .collect::<Vec<_>>(),
            )
            .bind(changes.counters.iter().map(|(_, n)| *n).collect::<Vec<_>>())
            .execute(&mut *conn)
            .await?;
    }
    if !changes.ops.is_empty() {
        let sql = format!(
            "INSERT INTO \"{table}_ops\" (stream_id, status, since) SELECT * FROM \
             UNNEST($1::text[], $2::text[], $3::timestamptz[]) {OPS_UPDATED}"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(
                changes
                    .ops
                    .iter()
                    .map(|(s, ..)| s.clone())
                    .collect::<Vec<_>>(),
            )
            .bind(
                changes
                    .ops
                    .iter()
                    .map(|(_, status, _)| status.as_str().to_owned())
                    .collect::<Vec<_>>(),
            )
            .bind(changes.ops.iter().map(|(.., at)| *at).collect::<Vec<_>>())
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// One statement, so that every number comes from the same moment: states counted, the
/// counters, and the oldest waiting and claimed operations' `since`.
fn snapshot_sql(backend: Backend) -> String {
    // A NULL of the time column's type (PostgreSQL types a bare NULL as text).
    let no_time = match backend {
        Backend::Sqlite => "NULL",
        Backend::Postgres => "NULL::timestamptz",
    };
    let ops = format!("\"{NAME}_ops\"");
    format!(
        "SELECT 'state', status, count(*), {no_time} FROM {ops} GROUP BY status \
         UNION ALL SELECT 'counter', name, value, {no_time} FROM \"{NAME}\" \
         UNION ALL SELECT 'pending', '', 0, min(since) FROM {ops} \
         WHERE status IN ('received', 'retry_scheduled') \
         UNION ALL SELECT 'claimed', '', 0, min(since) FROM {ops} \
         WHERE status IN ('claimed', 'call_sent')"
    )
}

/// One row of the snapshot statement.
struct Part {
    kind: String,
    name: String,
    value: i64,
    since: Option<DateTime<Utc>>,
}

fn decode_part(row: &impl EitherRow) -> Result<Part, sqlx::Error> {
    Ok(Part {
        kind: row.try_get(0)?,
        name: row.try_get(1)?,
        value: row.try_get(2)?,
        since: row.try_get::<Option<Time>>(3)?.map(|t| t.0),
    })
}

/// The metrics as of `now` (which the ages are measured from).
pub async fn snapshot(
    pool: ReadPool<'_>,
    now: DateTime<Utc>,
) -> Result<MetricsSnapshot, ReadError> {
    let sql = snapshot_sql(pool.backend());
    let parts = either!(pool, p => sqlx::query(sqlx::AssertSqlSafe(sql))
        .try_map(|row| decode_part(&row))
        .fetch_all(p)
        .await)
    .map_err(read_error(NAME))?;
    let age = |since: DateTime<Utc>| {
        ((now - since).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6).max(0.0)
    };
    let count = |value: i64| u64::try_from(value).unwrap_or(0);
    let mut snapshot = MetricsSnapshot {
        by_state: STATES.iter().map(|s| (s.as_str().to_owned(), 0)).collect(),
        oldest_pending_age_secs: None,
        oldest_claimed_age_secs: None,
        duplicates_observed: 0,
        update_id_collisions: 0,
        key_conflicts: 0,
        quarantined: 0,
        transitions_rejected: 0,
        updates_forwarded: 0,
        forward_failures: 0,
        forwards_given_up: 0,
    };
    for part in parts {
        match part.kind.as_str() {
            "state" => match snapshot.by_state.iter_mut().find(|(s, _)| *s == part.name) {
                Some((_, n)) => *n = count(part.value),
                None => snapshot.by_state.push((part.name, count(part.value))),
            },
            "counter" => {
                let slot = match part.name.as_str() {
                    "duplicates_observed" => &mut snapshot.duplicates_observed,
                    "update_id_collisions" => &mut snapshot.update_id_collisions,
                    "key_conflicts" => &mut snapshot.key_conflicts,
                    "quarantined" => &mut snapshot.quarantined,
                    "transitions_rejected" => &mut snapshot.transitions_rejected,
                    "updates_forwarded" => &mut snapshot.updates_forwarded,
                    "forward_failures" => &mut snapshot.forward_failures,
                    "forwards_given_up" => &mut snapshot.forwards_given_up,
                    _ => continue,
                };
                *slot = count(part.value);
            }
            "pending" => snapshot.oldest_pending_age_secs = part.since.map(age),
            "claimed" => snapshot.oldest_claimed_age_secs = part.since.map(age),
            _ => {}
        }
    }
    Ok(snapshot)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link<'a>(position: u64, stream: &'a str, event_type: &'a str) -> Link<'a> {
        Link {
            position,
            stream_id: stream,
            version: position,
            event_type,
            schema_version: 1,
            payload: b"{}",
            metadata: b"{}",
            recorded_at_micros: 1_790_000_000_000_000 + position as i64,
        }
    }

    #[test]
    fn a_page_counts_noted_events_and_keeps_each_operations_last_state() {
        let events = [
            link(1, "update-shop-1", "UpdateReceived"),
            link(2, "op-coupon-a", "Received"),
            link(3, "update-shop-1", "DuplicateDeliveryObserved"),
            link(4, "update-shop-1", "DuplicateDeliveryObserved"),
            link(5, "op-coupon-a", "Claimed"),
            link(6, "op-coupon-a", "ReplyStarted"),
            link(7, "quarantine-shop", "BodyQuarantined"),
        ];
        let changes = changes(&events).unwrap();
        assert_eq!(
            changes.counters,
            [("duplicates_observed", 2), ("quarantined", 1)]
        );
        assert_eq!(changes.ops.len(), 1);
        assert_eq!(changes.ops[0].1, Status::Claimed);
        assert_eq!(changes.ops[0].2, events[4].recorded_at());
    }
}
