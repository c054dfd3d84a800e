//! `POST /v1/operations`: a bot's own handler asks for an operation by action and parameters.
//! The business key comes from the action's template; a new key starts the operation (201), the
//! same key with the same parameters answers the one that exists (200), the same key with other
//! parameters is a conflict (409, nothing started). From then on the worker, the replies,
//! reconciliation and `/status` treat it exactly as an operation a command started.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::ToSchema;

use crate::api::auth::Caller;
use crate::api::error::ApiError;
use crate::api::operations::{self, OperationView};
use crate::app::AppState;
use crate::intake::{IntakeError, IntakeRejection, Started, Submission};
use opledger_domain::text::storable_string;
use opledger_ledger::UnitError;

/// What a handler asks for.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct OperationRequest {
    /// The configured action's name.
    #[schema(example = "coupon")]
    action: String,
    /// Each of the action's parameters, and no other, as non-empty strings.
    #[schema(example = json!({"campaign": "spring"}))]
    params: BTreeMap<String, String>,
    /// The bot it is for. A client's token implies its bot (naming another is refused); the
    /// admin token must name one.
    #[schema(example = "shop")]
    #[serde(default)]
    bot: Option<String>,
    /// The chat the outcome is replied to, if any.
    #[serde(default)]
    chat_id: Option<i64>,
    /// The user who asked, if known (what `/status` lists it under, and `{user_id}` in keys).
    #[serde(default)]
    user_id: Option<i64>,
    /// The Telegram update that caused the request (its `update_id`), recorded as what asked
    /// first and linking the operation to the update's delivery in the timeline.
    #[schema(minimum = 0)]
    update_id: i64,
}

/// Starts, or finds, the operation a request names.
#[utoipa::path(
    post,
    path = "/v1/operations",
    operation_id = "submit_operation",
    tag = "operations",
    request_body = OperationRequest,
    responses(
        (status = 201, description = "A new business key: the operation was started.", body = OperationView,
            headers(("Location" = String, description = "The operation's URL."))),
        (status = 200, description = "The same business key with the same parameters: the operation that exists.", body = OperationView),
        (status = 400, description = "The body is not a request for one of the bot's actions with its parameters; nothing was started.", body = crate::api::ErrorBody),
        (status = 401, description = "No token, or a wrong one.", body = crate::api::ErrorBody),
        (status = 404, description = "The API is off (`api_disabled`).", body = crate::api::ErrorBody),
        (status = 409, description = "The same business key with other parameters: nothing was started; `conflict` names the operation and both fingerprints.", body = crate::api::ErrorBody),
        (status = 503, description = "Storage cannot take it now; retry (nothing, or the same operation, was started).", body = crate::api::ErrorBody),
    ),
    security(("admin_token" = []), ("client_token" = [])),
)]
pub(crate) async fn submit(
    caller: Caller,
    State(state): State<Arc<AppState>>,
    body: Result<Json<OperationRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(request) = body.map_err(|e| ApiError::BadBody(e.body_text()))?;
    if request.update_id < 0 {
        return Err(ApiError::BadBody(format!(
            "`update_id` must be a Telegram update id (0 or more), not {}",
            request.update_id
        )));
    }
    let (client, bot) = client_and_bot(&caller, request.bot)?;
    let submission = Submission {
        client,
        bot,
        action: request.action,
        params: kept(request.params),
        chat_id: request.chat_id,
        user_id: request.user_id,
        update_id: request.update_id,
    };
    let started = state.intake.submit(&submission).await.map_err(refused)?;
    let (status, link) = match started {
        Started::New(link) => (StatusCode::CREATED, link),
        Started::Joined(link) => (StatusCode::OK, link),
        Started::KeyConflict {
            operation_id,
            fingerprint,
            existing_fingerprint,
        } => {
            return Err(ApiError::KeyConflict {
                operation_id: operation_id.to_string(),
                fingerprint,
                existing_fingerprint,
            });
        }
    };
    // The operation's row is kept inside the append's transaction: it is there now.
    let id = link.operation_id.to_string();
    let view: OperationView = operations::row(&state, &caller, &id).await?.into();
    let location = format!("/v1/operations/{id}");
    Ok((status, [(header::LOCATION, location)], Json(view)).into_response())
}

/// The client's name and the bot a request is for: a client's own (naming another is refused),
/// or the one the admin names.
pub(crate) fn client_and_bot(
    caller: &Caller,
    named: Option<String>,
) -> Result<(String, String), ApiError> {
    match (caller, named) {
        (Caller::Client(client), None) => Ok((client.name.clone(), client.bot.clone())),
        (Caller::Client(client), Some(bot)) if bot == client.bot => Ok((client.name.clone(), bot)),
        (Caller::Client(client), Some(bot)) => Err(ApiError::BadBody(format!(
            "this client may only act for bot `{}`, not `{bot}`",
            client.bot
        ))),
        (Caller::Admin, Some(bot)) => Ok(("admin".to_owned(), bot)),
        (Caller::Admin, None) => Err(ApiError::BadBody(
            "name the `bot` it is for (a client's token implies it)".to_owned(),
        )),
    }
}

/// Parameters as both backends can store them (ADR 0010): they are text from outside.
pub(crate) fn kept(params: BTreeMap<String, String>) -> BTreeMap<String, String> {
    params
        .into_iter()
        .map(|(name, value)| (storable_string(name), storable_string(value)))
        .collect()
}

/// What a refused request answers.
pub(crate) fn refused(error: IntakeError) -> ApiError {
    match error {
        IntakeError::UnknownBot(bot) => {
            ApiError::BadBody(format!("no bot named `{bot}` is configured"))
        }
        IntakeError::Unit(UnitError::Rejected(
            rejection @ (IntakeRejection::NoSuchAction { .. }
            | IntakeRejection::Parameters { .. }
            | IntakeRejection::StreamId(_)
            | IntakeRejection::Id(_)),
        )) => ApiError::BadBody(rejection.to_string()),
        IntakeError::Unit(unit) if unit.is_transient() => {
            ApiError::Unavailable(format!("the operation could not be recorded: {unit}"))
        }
        IntakeError::Unit(unit) => {
            ApiError::Internal(format!("the operation could not be recorded: {unit}"))
        }
    }
}
