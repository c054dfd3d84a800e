//! `POST /v1/operations/{id}/resolution`: an operator's decision about an operation waiting for
//! reconciliation, over HTTP. It is `opledger reconcile resolve` — the same function
//! ([`crate::reconcile::resolve`]), the same `Reconciled` event caused by the operator, the same
//! refusals — for the admin token only.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use opledger_domain::operation::Reconciled;
use opledger_ledger::LedgerError;
use serde::Deserialize;
use utoipa::ToSchema;

use crate::api::auth::{Admin, Caller};
use crate::api::error::ApiError;
use crate::api::operations::{self, OperationView};
use crate::app::AppState;
use crate::reconcile::{self, Outcome, ReconcileError};

/// A person's decision, recorded with their name and reason for the audit trail.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResolutionRequest {
    /// `succeeded` and `failed` end the operation (its reply follows); `retry` makes it due
    /// now, to be called again with the same operation id as idempotency key.
    outcome: Outcome,
    /// The external service's id for what it did; only with `succeeded`.
    #[schema(example = "crm-77")]
    #[serde(default)]
    external_id: Option<String>,
    /// Who decides (not empty).
    #[schema(example = "alice")]
    operator: String,
    /// Why: what was checked, where (not empty).
    #[schema(example = "found the coupon in the CRM")]
    note: String,
}

/// Records a person's decision about an operation waiting for reconciliation.
#[utoipa::path(
    post,
    path = "/v1/operations/{id}/resolution",
    operation_id = "resolve_operation",
    tag = "reconciliation",
    params(
        ("id" = String, Path, format = Uuid, description = "The operation's id (a UUID)."),
    ),
    request_body = ResolutionRequest,
    responses(
        (status = 200, description = "The decision was recorded (a `Reconciled` event caused by the operator): the operation as it stands now, `reconciled`, or `retry_scheduled` for `retry`.", body = OperationView),
        (status = 400, description = "The body is not a decision (an unknown outcome, an empty operator or note, an external id without `succeeded`), or the id is not a UUID; nothing was changed.", body = crate::api::ErrorBody),
        (status = 401, description = "No token, or a wrong one.", body = crate::api::ErrorBody),
        (status = 403, description = "A client's token: only the admin token decides.", body = crate::api::ErrorBody),
        (status = 404, description = "No operation has this id, or the API is off (`api_disabled`).", body = crate::api::ErrorBody),
        (status = 409, description = "The operation is not waiting for reconciliation (`not_waiting`; `status` says where it stands); nothing was changed.", body = crate::api::ErrorBody),
        (status = 503, description = "Storage cannot take it now; retry (the operation is then found resolved, or resolved once).", body = crate::api::ErrorBody),
    ),
    security(("admin_token" = [])),
)]
pub(crate) async fn resolve(
    _: Admin,
    State(state): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Json<ResolutionRequest>, JsonRejection>,
) -> Result<Json<OperationView>, ApiError> {
    let id = operations::operation_id(path)?;
    let Json(request) = body.map_err(|e| ApiError::BadBody(e.body_text()))?;
    let decision = Reconciled {
        outcome: request.outcome.into(),
        external_id: request.external_id,
        operator: request.operator,
        note: request.note,
    };
    let now = state.intake.clock().now();
    let resolved = reconcile::resolve(state.intake.store(), &id, decision, now)
        .await
        .map_err(refused)?;
    // The operation's row is kept inside the append's transaction: it shows the decision.
    let row = operations::row(&state, &Caller::Admin, &resolved.operation_id).await?;
    Ok(Json(row.into()))
}

/// What a refused decision answers.
fn refused(error: ReconcileError) -> ApiError {
    match error {
        ReconcileError::UnknownOperation { operation_id } => ApiError::NotFound(format!(
            "no operation has the id `{operation_id}`; nothing was changed"
        )),
        ReconcileError::NotWaiting {
            operation_id,
            status,
        } => ApiError::NotWaiting {
            operation_id,
            status: status.as_str().to_owned(),
        },
        error @ (ReconcileError::MissingOperator
        | ReconcileError::MissingNote
        | ReconcileError::EmptyExternalId
        | ReconcileError::ExternalIdWithoutSuccess { .. }) => ApiError::BadBody(error.to_string()),
        error @ ReconcileError::Contended { .. } => ApiError::Unavailable(error.to_string()),
        ReconcileError::Read(error) => error.into(),
        ReconcileError::Ledger(LedgerError::Store(error)) => error.into(),
        // The domain refused what the checks and the status allowed, or the ledger holds what
        // this binary cannot read: a bug or corruption, not the caller's to fix.
        error @ (ReconcileError::Refused { .. } | ReconcileError::Ledger(_)) => {
            ApiError::Internal(error.to_string())
        }
    }
}
