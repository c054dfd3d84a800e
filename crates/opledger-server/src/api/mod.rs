//! The read API under `/v1`: operations by id, state and user, any stream's events, the
//! reconciliation queue and the projections' status, as JSON, for operators and their tools.
//!
//! - Every data route needs `Authorization: Bearer <admin token>` (the token named by
//!   `[api] admin_token_env`, compared in constant time); without it, 401 with a
//!   `WWW-Authenticate: Bearer` challenge. The operations API (`POST /v1/operations`, `GET
//!   /v1/operations/{id}` and its events) also takes a client's token (`[[api.clients]]`), for
//!   its own bot's operations only; a client's token elsewhere is 403. Without a token
//!   configured the API is off and its data routes answer 404 saying how to turn it on: no token
//!   can open an API that has none.
//! - `GET /v1/openapi.json` is the OpenAPI document of all of it, generated from the handlers
//!   themselves (`utoipa`), so a route cannot be served undocumented. It is served without the
//!   token, also when the API is off: it holds no data, and a client needs it to learn how to
//!   authenticate.
//! - Errors are JSON (`{"error", "message", "parameter"?}`): 400 naming a bad or unknown
//!   parameter, 404 for an unknown id, stream or route, 503 when storage cannot be read.
//!
//! The read routes only read. The routes that write go through the unit of work like a command:
//! `POST /v1/operations` (`submit.rs`) and `POST /v1/buttons` (`buttons.rs`) through the
//! intake's, `POST /v1/operations/{id}/resolution` (`resolution.rs`, admin token only) through
//! the very function of `opledger reconcile resolve`, recorded with the operator's name.

mod auth;
mod buttons;
mod error;
mod events;
mod operations;
mod params;
mod read_models;
mod resolution;
mod submit;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, Request};
use axum::http::{Method, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::{Router, middleware};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{IntoResponses, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub(crate) use auth::ApiTokens;
pub(crate) use error::{ApiError, ErrorBody};

use crate::app::AppState;

/// The errors any data route may answer, for the OpenAPI document.
#[allow(
    dead_code,
    reason = "only the OpenAPI document uses it: handlers answer with `ApiError`"
)]
#[derive(IntoResponses)]
pub(crate) enum ReadErrors {
    /// A query or path parameter is malformed or unknown; `parameter` names it.
    #[response(status = 400)]
    BadParameter(#[to_schema] ErrorBody),
    /// No admin token, or a wrong one (with a `WWW-Authenticate: Bearer` challenge).
    #[response(status = 401)]
    Unauthorized(#[to_schema] ErrorBody),
    /// The operation or stream does not exist, or the read API is off (`api_disabled`: no
    /// `[api] admin_token_env` is configured).
    #[response(status = 404)]
    NotFound(#[to_schema] ErrorBody),
    /// Storage cannot be read right now; retry later (`Retry-After` says when).
    #[response(status = 503)]
    Unavailable(#[to_schema] ErrorBody),
}

/// The document's fixed parts; the paths come from the handlers.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "opledger read API",
        description = "Operations, events, the reconciliation queue and the projections of an \
            opledger ledger, and the operations API for a bot's own handlers. Every route but \
            this document needs `Authorization: Bearer <token>`: the admin token (the one held \
            by the environment variable that `[api] admin_token_env` names), or for the \
            operations API a client's token (`[[api.clients]]`), which opens only its bot's \
            operations."
    ),
    modifiers(&AdminTokenScheme),
    components(schemas(ErrorBody)),
    tags(
        (name = "operations", description = "Business operations and their events."),
        (name = "streams", description = "Any stream's events."),
        (name = "reconciliation", description = "Operations waiting for a person."),
        (name = "projections", description = "Read models: version, checkpoint, lag."),
        (name = "meta", description = "This document."),
    )
)]
struct Document;

/// Declares the `admin_token` security scheme the routes name.
struct AdminTokenScheme;

impl utoipa::Modify for AdminTokenScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "admin_token",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
        // A client's token ([[api.clients]]): only the operations API, for its own bot.
        components.add_security_scheme(
            "client_token",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// The routes that need a token, answered within [`READ_TIMEOUT`] (the admin's, or for the
/// operations API a client's: each handler says which it takes).
fn guarded() -> OpenApiRouter<Arc<AppState>> {
    OpenApiRouter::with_openapi(Document::openapi())
        .routes(routes!(operations::list, submit::submit))
        .routes(routes!(operations::events))
        .routes(routes!(resolution::resolve))
        .routes(routes!(buttons::issue))
        .routes(routes!(events::stream))
        .routes(routes!(read_models::reconciliation))
        .routes(routes!(read_models::projections))
}

/// The routes that need a token and may wait longer than [`READ_TIMEOUT`] (each of their reads
/// is bounded by it).
fn waiting() -> OpenApiRouter<Arc<AppState>> {
    OpenApiRouter::new().routes(routes!(operations::get))
}

/// The routes open to anyone who can reach the listen address.
fn open() -> OpenApiRouter<Arc<AppState>> {
    OpenApiRouter::new().routes(routes!(document))
}

/// The OpenAPI document of the read API (what `GET /v1/openapi.json` serves).
pub fn openapi() -> utoipa::openapi::OpenApi {
    guarded().merge(waiting()).merge(open()).into_openapi()
}

/// How long a data route waits for storage before it answers 503 (a JSON error, before the
/// server's own request timeout cuts the request off without one).
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The answer when storage does not answer within [`READ_TIMEOUT`].
fn slow_storage() -> ApiError {
    ApiError::Unavailable(format!(
        "storage did not answer within {} s; retry later",
        READ_TIMEOUT.as_secs()
    ))
}

/// The `/v1` routes, guarded by the admin token in `state`.
pub(crate) fn router(state: Arc<AppState>) -> Router<Arc<AppState>> {
    let guarded = guarded()
        .route_layer(middleware::from_fn(within_time))
        .merge(waiting())
        .route_layer(middleware::from_fn_with_state(state, auth::authenticate));
    let (router, document) = guarded.merge(open()).split_for_parts();
    let json = match document.to_pretty_json() {
        Ok(json) => json,
        Err(error) => {
            // Serialising a document built from literals cannot fail; say so if it ever does.
            tracing::error!(%error, "the OpenAPI document could not be serialised");
            String::from("{}")
        }
    };
    router
        .route("/v1/{*rest}", any(no_such_route))
        .route("/v1", any(no_such_route))
        .layer(Extension(OpenApiJson(Arc::from(json))))
}

/// Answers 503 when a read takes longer than [`READ_TIMEOUT`] (storage unreachable).
async fn within_time(request: Request, next: Next) -> Response {
    match tokio::time::timeout(READ_TIMEOUT, next.run(request)).await {
        Ok(response) => response,
        Err(_) => slow_storage().into_response(),
    }
}

/// The serialised document, shared by every request.
#[derive(Clone, Debug)]
struct OpenApiJson(Arc<str>);

/// This document: the read API in OpenAPI 3.1. Served without the token.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    operation_id = "openapi",
    tag = "meta",
    responses(
        (status = 200, description = "The OpenAPI document.", content_type = "application/json"),
    ),
)]
async fn document(Extension(OpenApiJson(json)): Extension<OpenApiJson>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        json.to_string(),
    )
        .into_response()
}

/// Any other path under `/v1`.
async fn no_such_route(method: Method, uri: Uri) -> ApiError {
    ApiError::NotFound(format!(
        "no route `{method} {}`; GET /v1/openapi.json lists the routes",
        uri.path()
    ))
}
