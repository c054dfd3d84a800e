//! `POST /v1/buttons`: a one-time button for the bot's own inline keyboards. The answer's
//! `callback_data` (at most 64 bytes, as Telegram allows) names a token bound to an action, its
//! parameters, one user and an expiry; the click arrives through opledger's webhook or poller
//! and starts the operation once. A second click, another user's, a late or a forged one is
//! answered and starts nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::api::auth::Caller;
use crate::api::error::ApiError;
use crate::api::submit::{client_and_bot, kept, refused};
use crate::app::AppState;

/// How long a button stays valid when the request does not say.
const DEFAULT_EXPIRY_SECS: u32 = 3600;
/// The longest a button may stay valid: a week, the ledger's longest dedup window.
const MAX_EXPIRY_SECS: u32 = 7 * 24 * 3600;

/// The button a handler asks for.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ButtonRequest {
    /// The configured action a click starts.
    #[schema(example = "coupon")]
    action: String,
    /// Each of the action's parameters, and no other, as non-empty strings.
    #[schema(example = json!({"campaign": "spring"}))]
    params: BTreeMap<String, String>,
    /// The one Telegram user whose click counts.
    user_id: i64,
    /// The chat the outcome is replied to, if any.
    #[serde(default)]
    chat_id: Option<i64>,
    /// Seconds until the button expires, 1 to 604800 (a week); default 3600.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 604_800)]
    expires_in_secs: Option<u32>,
    /// The bot it is for. A client's token implies its bot; the admin token must name one.
    #[serde(default)]
    bot: Option<String>,
}

/// A button's token.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Button {
    /// Put this in the inline keyboard button's `callback_data` (at most 64 bytes).
    #[schema(example = "t1_00112233445566778899aabbccddeeff")]
    callback_data: String,
    /// After this, a click is answered as expired and starts nothing.
    expires_at: DateTime<Utc>,
}

/// Issues a one-time button.
#[utoipa::path(
    post,
    path = "/v1/buttons",
    operation_id = "issue_button",
    tag = "operations",
    request_body = ButtonRequest,
    responses(
        (status = 201, description = "The button's token, recorded before this answer.", body = Button),
        (status = 400, description = "The body is not a button for one of the bot's actions with its parameters; nothing was issued.", body = crate::api::ErrorBody),
        (status = 401, description = "No token, or a wrong one.", body = crate::api::ErrorBody),
        (status = 404, description = "The API is off (`api_disabled`).", body = crate::api::ErrorBody),
        (status = 503, description = "Storage cannot take it now; retry.", body = crate::api::ErrorBody),
    ),
    security(("admin_token" = []), ("client_token" = [])),
)]
pub(crate) async fn issue(
    caller: Caller,
    State(state): State<Arc<AppState>>,
    body: Result<Json<ButtonRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<Button>), ApiError> {
    let Json(request) = body.map_err(|e| ApiError::BadBody(e.body_text()))?;
    let (_, bot) = client_and_bot(&caller, request.bot)?;
    let seconds = request.expires_in_secs.unwrap_or(DEFAULT_EXPIRY_SECS);
    if !(1..=MAX_EXPIRY_SECS).contains(&seconds) {
        return Err(ApiError::BadBody(format!(
            "`expires_in_secs` must be 1 to {MAX_EXPIRY_SECS} (a week), not {seconds}"
        )));
    }
    let expires_at = state.intake.clock().now() + TimeDelta::seconds(seconds.into());
    let token = state
        .intake
        .issue_button(
            &bot,
            &request.action,
            request.user_id,
            request.chat_id,
            kept(request.params),
            expires_at,
        )
        .await
        .map_err(refused)?;
    Ok((
        StatusCode::CREATED,
        Json(Button {
            callback_data: token,
            expires_at,
        }),
    ))
}
