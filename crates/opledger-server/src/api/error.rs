//! The read API's errors and their one mapping to HTTP: a status code and a JSON body
//! `{"error": code, "message": text, "parameter": name?}` whose message says what went wrong and
//! what to do. No message carries a secret: the admin token is never echoed, and storage errors
//! carry no URL.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use opledger_projections::operation_status;
use opledger_projections::registry::RegistryError;
use opledger_store::StoreError;
use serde::Serialize;
use utoipa::ToSchema;

/// The `WWW-Authenticate` challenge of a request without a token (RFC 6750).
const CHALLENGE: &str = "Bearer realm=\"opledger\"";
/// The challenge of a request whose token is wrong (RFC 6750 §3.1).
const CHALLENGE_INVALID: &str = "Bearer realm=\"opledger\", error=\"invalid_token\"";

/// Why a read API request was refused or failed; each variant is one status code.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiError {
    /// No `Authorization: Bearer` header: 401.
    #[error(
        "this route needs the admin token: send `Authorization: Bearer <token>` with the token \
         from the environment variable that [api] admin_token_env names"
    )]
    MissingToken,
    /// A client's token on a route only the admin token opens: 403.
    #[error(
        "this route needs the admin token; a client's token ([[api.clients]]) may only start its \
         bot's operations (POST /v1/operations), issue its one-time buttons (POST /v1/buttons) \
         and read its operations (GET /v1/operations/{{id}} and its events)"
    )]
    Forbidden,
    /// The request's body is not what the route takes: 400, nothing done.
    #[error("the request body is not valid: {0}")]
    BadBody(String),
    /// The same business key with other parameters: 409, nothing started.
    #[error(
        "operation {operation_id} already exists under this business key with other parameters \
         (fingerprint {existing_fingerprint}, asked {fingerprint}); nothing was started: use \
         another key, or the parameters it was started with"
    )]
    KeyConflict {
        operation_id: String,
        fingerprint: String,
        existing_fingerprint: String,
    },
    /// An operator's decision about an operation that is not waiting for one: 409, nothing
    /// changed.
    #[error(
        "operation {operation_id} is {status}, not waiting for reconciliation; nothing was \
         changed: see its events for who settled it"
    )]
    NotWaiting {
        operation_id: String,
        status: String,
    },
    /// A bearer token that is not the admin token: 401.
    #[error(
        "the admin token is wrong: send `Authorization: Bearer <token>` with the token from the \
         environment variable that [api] admin_token_env names"
    )]
    WrongToken,
    /// No admin token is configured, so the API is off: 404.
    #[error(
        "the read API is off: set [api] admin_token_env to the name of an environment variable \
         holding an admin token (16 to 512 visible ASCII characters) and restart opledger"
    )]
    Disabled,
    /// A query or path parameter is malformed or unknown: 400.
    #[error("parameter `{parameter}`: {problem}")]
    BadParameter { parameter: String, problem: String },
    /// The operation, stream or route does not exist: 404.
    #[error("{0}")]
    NotFound(String),
    /// The ledger or a read model cannot be read now: 503, retry later. The text says what
    /// could not be read and why.
    #[error("{0}")]
    Unavailable(String),
    /// Something the ledger holds cannot be shown (a bug or corruption): 500.
    #[error("{0}")]
    Internal(String),
}

/// The body of every error answer.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ErrorBody {
    /// A stable code: `unauthorized`, `forbidden`, `api_disabled`, `bad_parameter`,
    /// `bad_request`, `not_found`, `key_conflict`, `not_waiting`, `unavailable`, `internal`.
    #[schema(example = "bad_parameter")]
    pub(crate) error: &'static str,
    /// What went wrong and what to do, for a person.
    #[schema(
        example = "parameter `limit`: must be an integer from 1 to 500 (larger values, up to 4294967295, are capped), not `ten`"
    )]
    pub(crate) message: String,
    /// The parameter at fault, for `bad_parameter`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "limit")]
    pub(crate) parameter: Option<String>,
    /// For `key_conflict`: the operation that holds the key, and both fingerprints.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) conflict: Option<Conflict>,
    /// For `not_waiting`: where the operation stands (`confirmed`, `reconciled`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "reconciled")]
    pub(crate) status: Option<String>,
}

/// The operation a conflicting request collided with.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Conflict {
    pub(crate) operation_id: String,
    /// The fingerprint of the parameters the operation was started with.
    pub(crate) existing_fingerprint: String,
    /// The fingerprint of the refused request's parameters.
    pub(crate) fingerprint: String,
}

impl ApiError {
    pub(crate) fn bad(parameter: impl Into<String>, problem: impl Into<String>) -> Self {
        ApiError::BadParameter {
            parameter: parameter.into(),
            problem: problem.into(),
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            ApiError::MissingToken | ApiError::WrongToken => StatusCode::UNAUTHORIZED,
            ApiError::Disabled | ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::BadParameter { .. } | ApiError::BadBody(_) => StatusCode::BAD_REQUEST,
            ApiError::Forbidden => StatusCode::FORBIDDEN,
            ApiError::KeyConflict { .. } | ApiError::NotWaiting { .. } => StatusCode::CONFLICT,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn code(&self) -> &'static str {
        match self {
            ApiError::MissingToken | ApiError::WrongToken => "unauthorized",
            ApiError::Disabled => "api_disabled",
            ApiError::BadParameter { .. } => "bad_parameter",
            ApiError::BadBody(_) => "bad_request",
            ApiError::Forbidden => "forbidden",
            ApiError::KeyConflict { .. } => "key_conflict",
            ApiError::NotWaiting { .. } => "not_waiting",
            ApiError::NotFound(_) => "not_found",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::Internal(_) => "internal",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            ApiError::Unavailable(_) => tracing::warn!(error = %self, "read API request failed"),
            ApiError::Internal(_) => tracing::error!(error = %self, "read API request failed"),
            _ => {}
        }
        let body = ErrorBody {
            error: self.code(),
            message: self.to_string(),
            parameter: match &self {
                ApiError::BadParameter { parameter, .. } => Some(parameter.clone()),
                _ => None,
            },
            conflict: match &self {
                ApiError::KeyConflict {
                    operation_id,
                    fingerprint,
                    existing_fingerprint,
                } => Some(Conflict {
                    operation_id: operation_id.clone(),
                    existing_fingerprint: existing_fingerprint.clone(),
                    fingerprint: fingerprint.clone(),
                }),
                _ => None,
            },
            status: match &self {
                ApiError::NotWaiting { status, .. } => Some(status.clone()),
                _ => None,
            },
        };
        let mut response = (self.status(), Json(body)).into_response();
        let challenge = match self {
            ApiError::MissingToken => Some(CHALLENGE),
            ApiError::WrongToken => Some(CHALLENGE_INVALID),
            _ => None,
        };
        if let Some(challenge) = challenge {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
        }
        if matches!(response.status(), StatusCode::SERVICE_UNAVAILABLE) {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        }
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            // The store's own message ends with what to do ("retry later", "open it again").
            StoreError::Unavailable { .. }
            | StoreError::Closed
            | StoreError::LedgerFileLost { .. } => ApiError::Unavailable(error.to_string()),
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl From<operation_status::ReadError> for ApiError {
    fn from(error: operation_status::ReadError) -> Self {
        ApiError::Unavailable(format!("{error}; retry later"))
    }
}

impl From<RegistryError> for ApiError {
    fn from(error: RegistryError) -> Self {
        match error {
            RegistryError::Store(store) => store.into(),
            // Its message says to check the database and retry.
            RegistryError::Database(_) => ApiError::Unavailable(error.to_string()),
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl From<opledger_projections::reconciliation_queue::ReadError> for ApiError {
    fn from(error: opledger_projections::reconciliation_queue::ReadError) -> Self {
        // Its message says what to check.
        ApiError::Unavailable(error.to_string())
    }
}
