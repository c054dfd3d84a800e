//! `/v1/operations`: operations by state, bot and user, one by id, and an operation's events,
//! from the inline `operation_status` read model and the operation's stream.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use chrono::{DateTime, Utc};
use opledger_domain::NameKind;
use opledger_domain::ids::validate_name;
use opledger_domain::operation::Status;
use opledger_projections::operation_status::{self, Filter, OperationStatusRow};
use opledger_store::EventStore;
use serde::Serialize;
use utoipa::ToSchema;

use crate::api::ReadErrors;
use crate::api::auth::{Admin, Caller};
use crate::api::error::ApiError;
use crate::api::events::{self, EventPage};
use crate::api::params::{Params, quote};
use crate::app::AppState;

/// Operations listed when `limit` is not given.
const DEFAULT_LIMIT: u32 = 50;
/// The most operations one answer lists.
const MAX_LIMIT: u32 = 500;
/// How often a waiting `GET /v1/operations/{id}` looks again when nothing wakes it (another
/// instance may be the one that settles the operation).
const WAIT_POLL: Duration = Duration::from_millis(200);

/// One operation as the read API shows it: the `operation_status` row.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct OperationView {
    /// The operation's id (a UUID), also the idempotency key sent to the external service.
    #[schema(example = "5b0f3e0a-8c1e-5d0e-9a55-1a3c0c6e2f11")]
    pub(crate) operation_id: String,
    /// The operation's stream, `op-{action}-{business key}`.
    #[schema(example = "op-coupon-spring:42")]
    pub(crate) stream_id: String,
    pub(crate) action: String,
    pub(crate) business_key: String,
    pub(crate) bot: String,
    pub(crate) chat_id: Option<i64>,
    pub(crate) user_id: Option<i64>,
    /// The state: `received`, `claimed`, `call_sent`, `retry_scheduled`,
    /// `needs_reconciliation`, `confirmed`, `failed` or `reconciled`.
    #[schema(example = "confirmed")]
    pub(crate) status: String,
    /// Claims so far.
    pub(crate) attempts: u32,
    /// The worker holding or last holding the claim.
    pub(crate) worker: Option<String>,
    pub(crate) lease_until: Option<DateTime<Utc>>,
    /// When it is due for a worker: workers take due operations earliest first (a reply not
    /// started yet is due from when the operation was received); absent once nothing is left
    /// to do.
    pub(crate) due_at: Option<DateTime<Utc>>,
    pub(crate) external_id: Option<String>,
    pub(crate) last_error: Option<String>,
    /// The reply's state: `not_started`, `in_flight`, `retry_scheduled`, `sent`, `failed`,
    /// `unknown`.
    pub(crate) reply: String,
    /// Requests with the same business key and other parameters, refused.
    pub(crate) key_conflicts: u32,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) updated_at: DateTime<Utc>,
    /// The operation stream's version this row reflects.
    pub(crate) version: u64,
    /// The ledger position of the last event applied.
    pub(crate) last_position: u64,
}

impl From<OperationStatusRow> for OperationView {
    fn from(row: OperationStatusRow) -> Self {
        OperationView {
            operation_id: row.operation_id,
            stream_id: row.stream_id,
            action: row.action,
            business_key: row.business_key,
            bot: row.bot,
            chat_id: row.chat_id,
            user_id: row.user_id,
            status: row.status,
            attempts: row.attempts,
            worker: row.worker,
            lease_until: row.lease_until,
            due_at: row.due_at,
            external_id: row.external_id,
            last_error: row.last_error,
            reply: row.reply,
            key_conflicts: row.key_conflicts,
            created_at: row.created_at,
            updated_at: row.updated_at,
            version: row.version,
            last_position: row.last_position,
        }
    }
}

/// A list of operations, most recently updated first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct OperationList {
    pub(crate) operations: Vec<OperationView>,
    /// The limit applied (after capping).
    pub(crate) limit: u32,
}

/// The states an operation can be listed by.
fn states() -> impl Iterator<Item = &'static str> {
    Status::ALL
        .iter()
        .filter(|s| **s != Status::New)
        .map(|s| s.as_str())
}

/// Operations, most recently updated first, filtered by state, bot and user.
#[utoipa::path(
    get,
    path = "/v1/operations",
    operation_id = "list_operations",
    tag = "operations",
    params(
        ("state" = Option<String>, Query, description = "Only operations in this state: \
            received, claimed, call_sent, retry_scheduled, needs_reconciliation, confirmed, \
            failed or reconciled."),
        ("bot" = Option<String>, Query, description = "Only this bot's operations."),
        ("user_id" = Option<i64>, Query, description = "Only this Telegram user's operations."),
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 4_294_967_295_u32, description = "At most this many, 1 to 500 (larger values, up to \
            4294967295, are capped); default 50."),
    ),
    responses(
        (status = 200, description = "The operations.", body = OperationList),
        ReadErrors,
    ),
    security(("admin_token" = [])),
)]
pub(crate) async fn list(
    _: Admin,
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> Result<Json<OperationList>, ApiError> {
    let params = Params::parse(query.as_deref(), &["state", "bot", "user_id", "limit"])?;
    let status = params.text("state").map(str::to_owned);
    if let Some(status) = &status
        && !states().any(|s| s == status)
    {
        return Err(ApiError::bad(
            "state",
            format!(
                "unknown state {}; use one of {}",
                quote(status),
                states().collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    let bot = params.text("bot").map(str::to_owned);
    if let Some(bot) = &bot
        && validate_name(NameKind::Bot, bot).is_err()
    {
        return Err(ApiError::bad(
            "bot",
            format!(
                "{} is not a bot name (1 to 64 characters of a-z, 0-9 and _)",
                quote(bot)
            ),
        ));
    }
    let user_id = params.parsed::<i64>("user_id", "an integer (a Telegram user id)")?;
    let limit = params.limit(DEFAULT_LIMIT, MAX_LIMIT)?;
    let filter = Filter {
        status,
        bot,
        user_id,
        limit,
    };
    let rows = operation_status::list(state.intake.store().reader(), &filter).await?;
    Ok(Json(OperationList {
        operations: rows.into_iter().map(OperationView::from).collect(),
        limit,
    }))
}

/// Reads the `id` path parameter: an operation id is a UUID.
pub(crate) fn operation_id(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(id) = path.map_err(|e| ApiError::bad("id", e.body_text()))?;
    uuid::Uuid::try_parse(&id).map_err(|_| {
        ApiError::bad(
            "id",
            format!("{} is not an operation id (a UUID)", quote(&id)),
        )
    })?;
    Ok(id)
}

/// The operation's row, or 404 (also when `caller` may not see it: a client learns nothing of
/// another bot's operations, not even that they exist).
pub(crate) async fn row(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<OperationStatusRow, ApiError> {
    let read = operation_status::get(state.intake.store().reader(), id);
    let row = tokio::time::timeout(super::READ_TIMEOUT, read)
        .await
        .map_err(|_| super::slow_storage())??;
    row.filter(|row| caller.may_read(&row.bot))
        .ok_or_else(|| ApiError::NotFound(format!("no operation has the id `{id}`")))
}

/// One operation; with `wait`, once it is settled (confirmed, failed or reconciled) or the wait
/// is over, whichever comes first, so that a handler can answer its user with the outcome.
#[utoipa::path(
    get,
    path = "/v1/operations/{id}",
    operation_id = "get_operation",
    tag = "operations",
    params(
        ("id" = String, Path, format = Uuid, description = "The operation's id (a UUID)."),
        ("wait" = Option<i64>, Query, minimum = 0, maximum = 4_294_967_295_u32, description = "Wait up to this many \
            seconds for the operation to settle (confirmed, failed or reconciled) before \
            answering; capped a second under the server's request timeout (9 s by default). \
            Default 0: answer at once."),
    ),
    responses(
        (status = 200, description = "The operation (settled, or as it was when the wait ended).", body = OperationView),
        ReadErrors,
    ),
    security(("admin_token" = []), ("client_token" = [])),
)]
pub(crate) async fn get(
    caller: Caller,
    State(state): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Json<OperationView>, ApiError> {
    let params = Params::parse(query.as_deref(), &["wait"])?;
    let id = operation_id(path)?;
    let wait = params.parsed::<u32>("wait", "a number of seconds from 0")?;
    let wait = Duration::from_secs(wait.unwrap_or(0).into()).min(state.longest_wait);
    let deadline = tokio::time::Instant::now() + wait;
    // Commits of this process wake the wait; another instance's are seen by polling.
    let mut head = state.intake.store().subscribe();
    loop {
        let row = row(&state, &caller, &id).await?;
        let now = tokio::time::Instant::now();
        if row.is_settled() || now >= deadline {
            return Ok(Json(row.into()));
        }
        let poll = (deadline - now).min(WAIT_POLL);
        tokio::select! {
            _ = head.changed() => {}
            () = tokio::time::sleep(poll) => {}
        }
    }
}

/// The events of an operation's stream, in version order, payloads and metadata as JSON.
#[utoipa::path(
    get,
    path = "/v1/operations/{id}/events",
    operation_id = "operation_events",
    tag = "operations",
    params(
        ("id" = String, Path, format = Uuid, description = "The operation's id (a UUID)."),
        ("from_version" = Option<i64>, Query, minimum = 1, maximum = 9_223_372_036_854_775_807_i64, description = "The first stream version to \
            return, from 1 (the default)."),
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 4_294_967_295_u32, description = "At most this many events, 1 to 1000 \
            (larger values, up to 4294967295, are capped); default 1000."),
    ),
    responses(
        (status = 200, description = "The operation's events.", body = EventPage),
        ReadErrors,
    ),
    security(("admin_token" = []), ("client_token" = [])),
)]
pub(crate) async fn events(
    caller: Caller,
    State(state): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Json<EventPage>, ApiError> {
    let params = Params::parse(query.as_deref(), events::PARAMS)?;
    let id = operation_id(path)?;
    let row = row(&state, &caller, &id).await?;
    let stream = opledger_store::StreamId::new(row.stream_id.clone())
        .map_err(|e| ApiError::Internal(format!("operation {id} names a bad stream: {e}")))?;
    Ok(Json(events::page(&state, &stream, &params).await?))
}
