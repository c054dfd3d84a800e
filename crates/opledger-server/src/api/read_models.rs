//! `/v1/reconciliation` (the operations waiting for a person, from the `reconciliation_queue`
//! read model) and `/v1/projections` (every read model's version, checkpoint and lag, from the
//! projection registry).

use std::sync::Arc;

use axum::Json;
use axum::extract::{RawQuery, State};
use chrono::{DateTime, Utc};
use opledger_projections::reconciliation_queue::{self, ReconciliationItem};
use opledger_projections::registry::{self, ProjectionStatus};
use serde::Serialize;
use utoipa::ToSchema;

use crate::api::ReadErrors;
use crate::api::auth::Admin;
use crate::api::error::ApiError;
use crate::api::params::Params;
use crate::app::AppState;
use crate::health;

/// Waiting operations listed when `limit` is not given.
const DEFAULT_LIMIT: u32 = 100;
/// The most waiting operations one answer lists.
const MAX_LIMIT: u32 = 1000;

/// An operation waiting for a person to say what became of its call.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WaitingOperation {
    pub(crate) operation_id: String,
    pub(crate) stream_id: String,
    pub(crate) action: String,
    pub(crate) business_key: String,
    pub(crate) bot: String,
    pub(crate) chat_id: Option<i64>,
    pub(crate) user_id: Option<i64>,
    /// Why the outcome is unknown, as the worker recorded it.
    pub(crate) reason: String,
    /// The claim under which the call was sent.
    pub(crate) attempts: u32,
    /// When it was marked for reconciliation.
    pub(crate) marked_at: DateTime<Utc>,
    /// How long it has waited when this answer was made, in seconds.
    pub(crate) age_secs: f64,
}

impl WaitingOperation {
    fn new(item: ReconciliationItem, now: DateTime<Utc>) -> Self {
        WaitingOperation {
            age_secs: item.age_secs(now),
            operation_id: item.operation_id,
            stream_id: item.stream_id,
            action: item.action,
            business_key: item.business_key,
            bot: item.bot,
            chat_id: item.chat_id,
            user_id: item.user_id,
            reason: item.reason,
            attempts: item.attempts,
            marked_at: item.marked_at,
        }
    }
}

/// The reconciliation queue, oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ReconciliationQueue {
    pub(crate) operations: Vec<WaitingOperation>,
    /// The limit applied (after capping).
    pub(crate) limit: u32,
    /// The ledger position the queue reflects (its projection's checkpoint); absent before the
    /// projection first ran.
    pub(crate) checkpoint: Option<u64>,
}

/// Operations waiting for reconciliation, oldest first; resolve them with `opledger reconcile
/// resolve`.
#[utoipa::path(
    get,
    path = "/v1/reconciliation",
    operation_id = "reconciliation_queue",
    tag = "reconciliation",
    params(
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 4_294_967_295_u32, description = "At most this many, 1 to 1000 (larger values, up to \
            4294967295, are capped); default 100."),
    ),
    responses(
        (status = 200, description = "The queue, oldest first.", body = ReconciliationQueue),
        ReadErrors,
    ),
    security(("admin_token" = [])),
)]
pub(crate) async fn reconciliation(
    _: Admin,
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> Result<Json<ReconciliationQueue>, ApiError> {
    let params = Params::parse(query.as_deref(), &["limit"])?;
    let limit = params.limit(DEFAULT_LIMIT, MAX_LIMIT)?;
    let store = state.intake.store();
    // The checkpoint first: the rows read after it reflect at least that position.
    let checkpoint = registry::checkpoint(store.reader(), reconciliation_queue::NAME).await?;
    let items = reconciliation_queue::list(store.reader(), limit).await?;
    let now = state.intake.clock().now();
    Ok(Json(ReconciliationQueue {
        operations: items
            .into_iter()
            .map(|item| WaitingOperation::new(item, now))
            .collect(),
        limit,
        checkpoint,
    }))
}

/// One version of a read model.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ProjectionView {
    #[schema(example = "audit_trail")]
    pub(crate) name: String,
    pub(crate) version: u32,
    /// `active` (serving reads) or `building` (a blue/green rebuild).
    #[schema(example = "active")]
    pub(crate) state: String,
    /// Kept inside every append, so always caught up.
    pub(crate) inline: bool,
    /// The last ledger position applied.
    pub(crate) checkpoint: u64,
    /// The ledger's last position when read.
    pub(crate) head: u64,
    /// `head - checkpoint`: events not applied yet.
    pub(crate) lag: u64,
    /// The hash of the definition (name, code version, schema) the tables were built with.
    pub(crate) definition_hash: String,
    /// The process that last advanced it.
    pub(crate) runner: Option<String>,
    /// When its checkpoint last moved (or a runner took it over).
    pub(crate) updated_at: Option<DateTime<Utc>>,
    /// Behind the head with a checkpoint that has not moved for a minute: no runner applies
    /// the ledger (`/readyz` fails meanwhile).
    pub(crate) stalled: bool,
}

/// Every read model's versions.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ProjectionList {
    /// The ledger's last position when read.
    pub(crate) head: u64,
    pub(crate) projections: Vec<ProjectionView>,
}

/// Every read model: version, state, checkpoint, lag, runner, and whether it is stalled.
#[utoipa::path(
    get,
    path = "/v1/projections",
    operation_id = "projections",
    tag = "projections",
    responses(
        (status = 200, description = "Every active and building projection version.", body = ProjectionList),
        ReadErrors,
    ),
    security(("admin_token" = [])),
)]
pub(crate) async fn projections(
    _: Admin,
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> Result<Json<ProjectionList>, ApiError> {
    Params::parse(query.as_deref(), &[])?;
    let store = state.intake.store();
    let rows = registry::list(store).await?;
    let now = state.intake.clock().now();
    let mut projections = Vec::with_capacity(rows.len());
    let mut head = 0;
    for row in rows {
        let stalled = health::stall(store, &row, now).await?.is_some();
        head = head.max(row.head);
        projections.push(view(row, stalled));
    }
    if projections.is_empty() {
        head = opledger_store::EventStore::head(store).await?.position;
    }
    Ok(Json(ProjectionList { head, projections }))
}

fn view(row: ProjectionStatus, stalled: bool) -> ProjectionView {
    ProjectionView {
        name: row.name,
        version: row.version,
        state: row.state,
        inline: row.inline,
        checkpoint: row.checkpoint,
        head: row.head,
        lag: row.lag,
        definition_hash: row.definition_hash,
        runner: row.runner,
        updated_at: row.updated_at,
        stalled,
    }
}
