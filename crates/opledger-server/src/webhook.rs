//! `POST /telegram/{bot}/webhook`: Telegram's deliveries, answered by the table of DESIGN §6.
//!
//! | situation | answer |
//! |---|---|
//! | secret header missing or wrong (constant-time compare) | 401, nothing stored |
//! | body over the limit (declared or sent) | 413 (at once when declared), nothing stored |
//! | body malformed or cut short (bad chunked encoding) | 400, nothing stored |
//! | right secret, not an update (not JSON, no integer `update_id`) | 200, quarantine record |
//! | new update (any kind, known or not) | 200 after the commit |
//! | same update again / same id, other body, within retention | 200, noted |
//! | storage failure, timeout, shutting down | 503, nothing half written |
//!
//! Never 410: answering 410 long enough makes Telegram delete the webhook. A 2xx answer may carry
//! a `sendMessage` for pure answers (`/help`, `/status`, a confirmation's question and its
//! keyboard); nothing that must be known to have happened is sent that way.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use secrecy::ExposeSecret;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::app::AppState;
use crate::edge;
use crate::refusals::Refusal;

/// The header Telegram puts the webhook secret in.
pub const SECRET_HEADER: &str = "x-telegram-bot-api-secret-token";

/// A bot's webhook secret, kept as a digest so that comparing takes the same time whatever the
/// candidate's length and content.
#[derive(Clone)]
pub(crate) struct WebhookSecret {
    digest: [u8; 32],
}

impl WebhookSecret {
    pub(crate) fn new(secret: &secrecy::SecretString) -> Self {
        Self {
            digest: Sha256::digest(secret.expose_secret().as_bytes()).into(),
        }
    }

    /// Whether the request carries the secret.
    fn admits(&self, headers: &HeaderMap) -> bool {
        let Some(candidate) = headers.get(SECRET_HEADER) else {
            return false;
        };
        let candidate: [u8; 32] = Sha256::digest(candidate.as_bytes()).into();
        candidate.ct_eq(&self.digest).into()
    }
}

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookSecret(..)")
    }
}

/// Receives one delivery.
pub(crate) async fn receive(
    State(state): State<Arc<AppState>>,
    Path(bot): Path<String>,
    request: Request,
) -> Response {
    if state.shutting_down.load(Ordering::SeqCst) {
        return unavailable();
    }
    let Some(secret) = state.webhooks.get(&bot) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    if !secret.admits(request.headers()) {
        state
            .counters
            .rejected_secrets
            .fetch_add(1, Ordering::Relaxed);
        // Sampled: a flood of these writes a line per interval, not one each.
        let client = edge::client_address(&request);
        state
            .edge
            .refusals
            .note(Refusal::WebhookSecret, client, Some(&bot));
        return StatusCode::UNAUTHORIZED.into_response();
    }
    edge::vouch(&request);
    let body = match read_body(request, state.body_limit).await {
        Ok(body) => body,
        Err(status) => return status.into_response(),
    };
    let receipt = match state.intake.record(&bot, &body).await {
        Ok(receipt) => receipt,
        Err(error) => {
            if error.is_storage() {
                tracing::warn!(bot, %error, "update not recorded; answering 503 so Telegram retries");
            } else {
                tracing::error!(bot, %error, "update not recorded; answering 503 so Telegram retries");
            }
            return unavailable();
        }
    };
    // Crash tests abort here: committed, not yet answered.
    opledger_ledger::failpoint::crash("intake-after-commit");
    state.count(&receipt.recorded);
    // Pure answers ride on the response (Telegram runs the method it names): a click gets
    // `answerCallbackQuery` with the answer as its notice, anything else `sendMessage`. If
    // reading them fails, the update is recorded anyway.
    let answer = state.answer(&bot, &receipt.recorded).await;
    if let Some(callback_query_id) = crate::replies::callback_to_answer(&receipt) {
        let mut call = serde_json::json!({
            "method": "answerCallbackQuery",
            "callback_query_id": callback_query_id,
        });
        if let Some(answer) = answer {
            call["text"] = answer.text.into();
        }
        return Json(call).into_response();
    }
    match answer {
        Some(answer) => Json(answer.webhook_call()).into_response(),
        None => StatusCode::OK.into_response(),
    }
}

/// The body, at most `limit` bytes: 413 at once, before reading anything, when the declared
/// length is over the limit, and once the limit is passed otherwise; 400 when the body is
/// malformed (bad chunked encoding) or cut short. A body too slow to arrive is cut off by the
/// request timeout (503, so Telegram retries).
async fn read_body(request: Request, limit: usize) -> Result<Bytes, StatusCode> {
    let declared = HttpBody::size_hint(request.body()).lower();
    if usize::try_from(declared).map_or(true, |declared| declared > limit) {
        return Err(StatusCode::PAYLOAD_TOO_LARGE);
    }
    axum::body::to_bytes(request.into_body(), limit)
        .await
        .map_err(|error| {
            if error.into_inner().is::<http_body_util::LengthLimitError>() {
                StatusCode::PAYLOAD_TOO_LARGE
            } else {
                StatusCode::BAD_REQUEST
            }
        })
}

fn unavailable() -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, Body::empty()).into_response()
}
