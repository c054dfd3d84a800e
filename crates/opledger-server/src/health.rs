//! `/healthz` and `/readyz`: whether the process is up, and whether it can serve.
//!
//! `/healthz` answers 200 as long as the process answers at all (a liveness probe: restart it
//! when this fails). `/readyz` answers 200 only when the ledger's files are still the ones
//! opened (SQLite: none deleted or replaced), its head can be read and no projection is stalled,
//! and 503 with a JSON body listing what is wrong otherwise, also while the service shuts down
//! (a readiness probe: send no traffic while this fails).
//!
//! A projection version is *stalled* when it is behind the head, its checkpoint has not moved
//! for [`STALL_AFTER`], and the first event it has not applied has waited that long too. Lag
//! alone is normal (a runner applies what was just appended within milliseconds, and catches up
//! a backlog page by page while its checkpoint moves); a checkpoint that stands still while
//! events wait means no runner is applying them (crashed, lost its lock, failing on an event),
//! and the read API, `/status` and the metrics go stale. `/readyz` counts the active versions
//! only: a rebuild that stopped halfway leaves the active version serving (`/v1/projections`
//! shows every version's state).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, TimeDelta, Utc};
use opledger_projections::registry::{self, ProjectionStatus};
use opledger_store::{AnyStore, EventStore, StoreError};
use serde::Serialize;

use crate::app::AppState;

/// How long a lagging projection's checkpoint may stand still before it counts as stalled.
///
/// A live runner moves its checkpoint within a second of an append (it wakes on every commit
/// and polls for other processes' appends), a page of a large backlog takes well under a
/// second, and on PostgreSQL another instance takes over a dead runner's projection within a
/// few seconds. A minute leaves room for all of these and for a slow database, and is still
/// short next to what an operator would call "stale".
pub(crate) const STALL_AFTER: Duration = Duration::from_secs(60);

/// How long `/readyz` waits for the database before it calls storage unreachable: a probe must
/// answer, and a database that takes this long cannot serve anyway.
const CHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// `GET /healthz`: the process is up.
pub(crate) async fn healthz() -> &'static str {
    "ok"
}

/// The body of a `/readyz` answer.
#[derive(Debug, Serialize)]
struct Readiness {
    /// Whether the service can serve.
    ready: bool,
    /// What is wrong, one sentence each; empty when ready.
    problems: Vec<String>,
}

/// `GET /readyz`: 200 when storage is reachable and no projection is stalled; 503 otherwise.
pub(crate) async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    let problems = if state.shutting_down.load(Ordering::SeqCst) {
        vec!["the service is shutting down".to_owned()]
    } else {
        let now = state.intake.clock().now();
        match tokio::time::timeout(CHECK_TIMEOUT, problems(state.intake.store(), now)).await {
            Ok(problems) => problems,
            Err(_) => vec![format!(
                "storage unreachable: the database did not answer within {} s",
                CHECK_TIMEOUT.as_secs()
            )],
        }
    };
    let ready = problems.is_empty();
    if !ready {
        tracing::warn!(problems = %problems.join("; "), "not ready");
    }
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(Readiness { ready, problems })).into_response()
}

/// What keeps the service from serving at `now`.
async fn problems(store: &AnyStore, now: DateTime<Utc>) -> Vec<String> {
    // A ledger file deleted or replaced still answers reads, from a file no one will open again.
    if let Err(error) = store.check_files() {
        return vec![error.to_string()];
    }
    if let Err(error) = store.head().await {
        return vec![format!("storage unreachable: {error}")];
    }
    let projections = match registry::list(store).await {
        Ok(projections) => projections,
        Err(error) => return vec![format!("projections unreadable: {error}")],
    };
    let mut problems = Vec::new();
    // Only the versions that serve reads count: a rebuild that stopped halfway leaves the
    // active version serving, and `/v1/projections` shows it as stalled.
    for projection in projections.iter().filter(|p| p.state == "active") {
        match stall(store, projection, now).await {
            Ok(None) => {}
            Ok(Some(stall)) => problems.push(stall.to_string()),
            Err(error) => return vec![format!("storage unreachable: {error}")],
        }
    }
    problems
}

/// A projection that stopped applying the ledger.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Stall {
    name: String,
    version: u32,
    lag: u64,
    checkpoint: u64,
    /// How long its checkpoint has stood still.
    idle: TimeDelta,
}

impl std::fmt::Display for Stall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "projection {} v{} is stalled: {} events behind the head, its checkpoint at \
             position {} has not moved for {} s; check the runner's log (`opledger projections \
             list` shows who ran it last)",
            self.name,
            self.version,
            self.lag,
            self.checkpoint,
            self.idle.num_seconds()
        )
    }
}

/// Whether `projection` is stalled at `now` (see the module documentation).
pub(crate) async fn stall(
    store: &AnyStore,
    projection: &ProjectionStatus,
    now: DateTime<Utc>,
) -> Result<Option<Stall>, StoreError> {
    let Some(updated_at) = projection.updated_at else {
        return Ok(None);
    };
    if !standing_still(projection.lag, updated_at, None, now) {
        return Ok(None);
    }
    // The checkpoint stood still; but if the events it has not applied are new, the runner
    // may simply not have woken yet.
    let Some(waiting) = store
        .read_all(projection.checkpoint + 1, 1)
        .await?
        .into_iter()
        .next()
    else {
        return Ok(None);
    };
    if !standing_still(projection.lag, updated_at, Some(waiting.recorded_at), now) {
        return Ok(None);
    }
    Ok(Some(Stall {
        name: projection.name.clone(),
        version: projection.version,
        lag: projection.lag,
        checkpoint: projection.checkpoint,
        idle: now - updated_at,
    }))
}

/// The rule itself: events wait (`lag > 0`), the checkpoint last moved at `moved_at`, and the
/// first waiting event was recorded at `waiting_since` (when known); stalled once both are
/// older than [`STALL_AFTER`] at `now`.
fn standing_still(
    lag: u64,
    moved_at: DateTime<Utc>,
    waiting_since: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> bool {
    let limit = TimeDelta::from_std(STALL_AFTER).unwrap_or(TimeDelta::MAX);
    lag > 0 && now - moved_at > limit && waiting_since.is_none_or(|since| now - since > limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_checkpoint_standing_still_while_old_events_wait_is_a_stall() {
        let now = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let ago = |secs: i64| Some(now - TimeDelta::seconds(secs));
        // (lag, checkpoint moved, first waiting event, stalled)
        let cases = [
            (0, 3600, None, false),    // caught up, however long ago it moved
            (5, 30, ago(30), false),   // moving
            (5, 60, ago(61), false),   // exactly the limit is not past it
            (5, 3600, ago(2), false),  // idle for an hour, woken by a new event just now
            (5, 3600, ago(61), true),  // events wait while nothing moves
            (5, 61, ago(3600), true),  // an old backlog, and the runner stopped
            (5, 30, ago(3600), false), // an old backlog being worked through
        ];
        for (lag, moved, waiting, stalled) in cases {
            let moved_at = now - TimeDelta::seconds(moved);
            assert_eq!(
                standing_still(lag, moved_at, waiting, now),
                stalled,
                "lag {lag}, moved {moved} s ago, waiting since {waiting:?}"
            );
        }
    }
}
