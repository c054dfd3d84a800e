//! The bearer tokens that guard `/v1`: `Authorization: Bearer <token>`, compared in constant
//! time against the admin token and every client's. The admin token opens every route; a
//! client's token (`[[api.clients]]`) opens only the operations API, for its own bot. Tokens are
//! never logged, echoed or kept in clear beyond configuration.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use opledger_config::ApiConfig;
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::api::error::ApiError;
use crate::app::AppState;
use crate::edge;
use crate::refusals::Refusal;

/// A token kept as a digest, so that comparing takes the same time whatever the candidate's
/// length and content (as the webhook secret is).
#[derive(Clone)]
struct TokenDigest([u8; 32]);

impl TokenDigest {
    fn new(token: &SecretString) -> Self {
        Self(Sha256::digest(token.expose_secret().as_bytes()).into())
    }

    fn matches(&self, candidate: &[u8; 32]) -> bool {
        bool::from(candidate.ct_eq(&self.0))
    }
}

/// Who a request authenticated as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Caller {
    /// The admin token: every route.
    Admin,
    /// A client of the operations API: its bot's operations, nothing else.
    Client(Arc<Client>),
}

/// A client as its token names it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Client {
    /// Its configured name, recorded as the cause of what it starts.
    pub(crate) name: String,
    /// The one bot whose operations it may start and read.
    pub(crate) bot: String,
}

impl Caller {
    /// Whether the caller may see an operation of `bot`.
    pub(crate) fn may_read(&self, bot: &str) -> bool {
        match self {
            Caller::Admin => true,
            Caller::Client(client) => client.bot == bot,
        }
    }
}

/// The tokens `/v1` admits; none configured turns the API off.
#[derive(Clone, Default)]
pub(crate) struct ApiTokens {
    admin: Option<TokenDigest>,
    clients: Vec<(TokenDigest, Arc<Client>)>,
}

/// What a request's `Authorization` header says.
#[derive(Debug, PartialEq, Eq)]
enum Presented {
    /// No header, or not a bearer token.
    Nothing,
    /// A bearer token that is none of ours.
    Wrong,
    /// One of ours.
    Right(Caller),
}

impl ApiTokens {
    pub(crate) fn new(api: &ApiConfig) -> Self {
        Self {
            admin: api.admin_token.as_ref().map(TokenDigest::new),
            clients: api
                .clients
                .iter()
                .map(|c| {
                    let client = Client {
                        name: c.name.clone(),
                        bot: c.bot.clone(),
                    };
                    (TokenDigest::new(&c.token), Arc::new(client))
                })
                .collect(),
        }
    }

    /// Whether any token is configured (else the API is off).
    fn any(&self) -> bool {
        self.admin.is_some() || !self.clients.is_empty()
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
        let candidate: [u8; 32] = Sha256::digest(token.trim_ascii()).into();
        // Every digest is compared, so the time taken does not say which one matched.
        let mut found = None;
        if self
            .admin
            .as_ref()
            .is_some_and(|admin| admin.matches(&candidate))
        {
            found = Some(Caller::Admin);
        }
        for (digest, client) in &self.clients {
            if digest.matches(&candidate) && found.is_none() {
                found = Some(Caller::Client(client.clone()));
            }
        }
        found.map_or(Presented::Wrong, Presented::Right)
    }
}

impl std::fmt::Debug for ApiTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiTokens")
            .field("admin", &self.admin.is_some())
            .field("clients", &self.clients.len())
            .finish()
    }
}

/// Lets a request through to `/v1` only with one of the configured tokens, and tells the
/// handler who it is ([`Caller`]); answers 404 when no token is configured (the API is off) and
/// 401 with a `WWW-Authenticate: Bearer` challenge otherwise.
pub(crate) async fn authenticate(
    State(state): State<Arc<AppState>>,
    mut request: Request,
    next: Next,
) -> Response {
    if !state.api_tokens.any() {
        return ApiError::Disabled.into_response();
    }
    let (refused, reason) = match state.api_tokens.check(request.headers()) {
        Presented::Right(caller) => {
            edge::vouch(&request);
            request.extensions_mut().insert(caller);
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

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        parts.extensions.get::<Caller>().cloned().ok_or_else(|| {
            ApiError::Internal("a /v1 route was served without authentication: a bug".into())
        })
    }
}

/// The admin, as a handler's argument: a client's token is refused with 403.
#[derive(Debug)]
pub(crate) struct Admin;

impl<S: Send + Sync> FromRequestParts<S> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Caller::from_request_parts(parts, state).await? {
            Caller::Admin => Ok(Admin),
            Caller::Client(_) => Err(ApiError::Forbidden),
        }
    }
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
        let token = tokens("0123456789abcdef-token", "client-token-0123456789");
        assert_eq!(token.check(&HeaderMap::new()), Presented::Nothing);
        for right in [
            "Bearer 0123456789abcdef-token",
            "bearer 0123456789abcdef-token",
            "BEARER  0123456789abcdef-token ",
        ] {
            assert_eq!(
                token.check(&headers(right.as_bytes())),
                Presented::Right(Caller::Admin),
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

    /// The tokens of an admin and of one client of bot `shop`.
    fn tokens(admin: &str, client: &str) -> ApiTokens {
        let api = ApiConfig {
            admin_token_env: Some("ADMIN".into()),
            admin_token: Some(SecretString::from(admin)),
            clients: vec![opledger_config::ApiClient {
                name: "handlers".into(),
                bot: "shop".into(),
                token_env: "CLIENT".into(),
                token: SecretString::from(client),
            }],
        };
        ApiTokens::new(&api)
    }

    #[test]
    fn a_client_token_names_its_client_and_bot() {
        let tokens = tokens("0123456789abcdef-token", "client-token-0123456789");
        let Presented::Right(Caller::Client(client)) =
            tokens.check(&headers(b"Bearer client-token-0123456789"))
        else {
            panic!("the client's token is admitted as the client");
        };
        assert_eq!(
            (client.name.as_str(), client.bot.as_str()),
            ("handlers", "shop")
        );
        let caller = Caller::Client(client);
        assert!(caller.may_read("shop") && !caller.may_read("other"));
        assert!(Caller::Admin.may_read("other"));
    }

    #[test]
    fn debug_shows_no_token() {
        let tokens = tokens("CANARY-token-0123456789", "CANARY-client-0123456789");
        assert_eq!(
            format!("{tokens:?}"),
            "ApiTokens { admin: true, clients: 1 }"
        );
    }
}
