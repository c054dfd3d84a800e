//! The admin bearer token that guards the read API: `Authorization: Bearer <token>`, compared
//! in constant time. The token is never logged, echoed or kept in clear beyond configuration.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::api::error::ApiError;
use crate::app::AppState;
use crate::edge;
use crate::refusals::Refusal;

/// The admin token, kept as a digest so that comparing takes the same time whatever the
/// candidate's length and content (as the webhook secret is).
#[derive(Clone)]
pub(crate) struct AdminToken {
    digest: [u8; 32],
}

/// What a request's `Authorization` header says.
#[derive(Debug, PartialEq, Eq)]
enum Presented {
    /// No header, or not a bearer token.
    Nothing,
    /// A bearer token that is not the admin token.
    Wrong,
    /// The admin token.
    Right,
}

impl AdminToken {
    pub(crate) fn new(token: &SecretString) -> Self {
        Self {
            digest: Sha256::digest(token.expose_secret().as_bytes()).into(),
        }
    }

    fn check(&self, headers: &HeaderMap) -> Presented {
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return Presented::Nothing;
        };
        let value = value.as_bytes();
        // The scheme is case-insensitive (RFC 7235 §2.1); one or more spaces follow it.
        let Some((scheme, token)) = value.split_at_checked(6) else {
            return Presented::Nothing;
        };
        if !scheme.eq_ignore_ascii_case(b"bearer") || token.first() != Some(&b' ') {
            return Presented::Nothing;
        }
        let token = token.trim_ascii();
        let candidate: [u8; 32] = Sha256::digest(token).into();
        if bool::from(candidate.ct_eq(&self.digest)) {
            Presented::Right
        } else {
            Presented::Wrong
        }
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(..)")
    }
}

/// Lets a request through to the read API only with the admin token; answers 404 when no
/// token is configured (the API is off) and 401 with a `WWW-Authenticate: Bearer` challenge
/// otherwise.
pub(crate) async fn require_admin(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(token) = &state.admin_token else {
        return ApiError::Disabled.into_response();
    };
    let (refused, reason) = match token.check(request.headers()) {
        Presented::Right => {
            edge::vouch(&request);
            return next.run(request).await;
        }
        Presented::Nothing => (ApiError::MissingToken, "no bearer token"),
        Presented::Wrong => (ApiError::WrongToken, "wrong bearer token"),
    };
    state
        .counters
        .rejected_admin_tokens
        .fetch_add(1, Ordering::Relaxed);
    // Sampled, a line per interval; what was presented is never logged.
    let client = edge::client_address(&request);
    state
        .edge
        .refusals
        .note(Refusal::AdminToken, client, Some(reason));
    refused.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(authorization: &[u8]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_bytes(authorization).unwrap(),
        );
        headers
    }

    #[test]
    fn only_the_right_bearer_token_is_admitted() {
        let token = AdminToken::new(&SecretString::from("0123456789abcdef-token"));
        assert_eq!(token.check(&HeaderMap::new()), Presented::Nothing);
        for right in [
            "Bearer 0123456789abcdef-token",
            "bearer 0123456789abcdef-token",
            "BEARER  0123456789abcdef-token ",
        ] {
            assert_eq!(
                token.check(&headers(right.as_bytes())),
                Presented::Right,
                "{right}"
            );
        }
        for nothing in [
            "Basic MDEyMzQ1Njc4OWFiY2RlZi10b2tlbg==",
            "Bearer",
            "Bearer0123456789abcdef-token",
            "0123456789abcdef-token",
        ] {
            assert_eq!(
                token.check(&headers(nothing.as_bytes())),
                Presented::Nothing,
                "{nothing}"
            );
        }
        for wrong in [
            "Bearer 0123456789abcdef-toke",
            "Bearer 0123456789abcdef-token2",
            "Bearer 0123456789ABCDEF-token",
            "Bearer ",
        ] {
            assert_eq!(
                token.check(&headers(wrong.as_bytes())),
                Presented::Wrong,
                "{wrong}"
            );
        }
    }

    #[test]
    fn debug_shows_no_token() {
        let token = AdminToken::new(&SecretString::from("CANARY-token-0123456789"));
        assert_eq!(format!("{token:?}"), "AdminToken(..)");
    }
}
