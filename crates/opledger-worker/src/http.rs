//! The built-in effector: a JSON POST with `Idempotency-Key: <operation id>`, classified by
//! whether the effect may have happened.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::future::BoxFuture;
use opledger_config::{EffectorConfig, UrlTemplate};
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, RETRY_AFTER};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::effector::{CallOutcome, EffectRequest, Effector, LookupOutcome, Success};

/// The header that carries the operation id.
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";

/// How long to wait for a connection; a connect failure means nothing was sent.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Calls an action's HTTP service as its configuration says.
///
/// The answer of a 2xx is kept as: `external_id` from the body's top-level `external_id` or
/// `id` (a string or an integer), `result` with the top-level fields named in `result_fields`
/// (those the action's reply uses), and the SHA-256 of the raw body.
#[derive(Debug, Clone)]
pub struct HttpEffector {
    http: reqwest::Client,
    url: reqwest::Url,
    lookup_url: Option<UrlTemplate>,
    timeout: Duration,
    honours_key: bool,
    result_fields: Vec<String>,
}

/// The HTTP client could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the http client for effectors: {0}")]
pub struct ClientError(#[source] reqwest::Error);

impl HttpEffector {
    /// An HTTP client for effectors: no redirects (a POST must not be re-sent elsewhere), a
    /// bounded connection time.
    pub fn client() -> Result<reqwest::Client, ClientError> {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(ClientError)
    }

    /// The effector of one action's configuration, calling `url` (the configuration's);
    /// `result_fields` are the top-level answer fields to keep in `Confirmed`.
    pub fn new(
        http: reqwest::Client,
        url: reqwest::Url,
        config: &EffectorConfig,
        result_fields: Vec<String>,
    ) -> Self {
        HttpEffector {
            http,
            url,
            lookup_url: config.lookup_url.clone(),
            timeout: config.timeout,
            honours_key: config.honours_idempotency_key,
            result_fields,
        }
    }

    fn success(&self, body: &[u8]) -> Success {
        success(body, &self.result_fields)
    }
}

/// What a 2xx answer's `body` says: its `external_id` (or `id`), the `result_fields` it has, and
/// its digest.
pub(crate) fn success(body: &[u8], result_fields: &[String]) -> Success {
    let digest = hex::encode(Sha256::digest(body));
    let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let field = |name: &str| value.get(name);
    let external_id = field("external_id")
        .or_else(|| field("id"))
        .and_then(|id| match id {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            Value::Number(n) if n.is_i64() || n.is_u64() => Some(n.to_string()),
            _ => None,
        });
    let result: BTreeMap<String, Value> = result_fields
        .iter()
        .filter_map(|name| field(name).map(|v| (name.clone(), v.clone())))
        .collect();
    Success {
        external_id,
        result,
        response_digest: Some(digest),
    }
}

impl Effector for HttpEffector {
    fn call<'a>(&'a self, request: &'a EffectRequest) -> BoxFuture<'a, CallOutcome> {
        Box::pin(async move {
            let sent = self
                .http
                .post(self.url.clone())
                .header(IDEMPOTENCY_KEY, &request.operation_id)
                .timeout(self.timeout)
                .json(request)
                .send()
                .await;
            let response = match sent {
                Ok(response) => response,
                Err(error) => return failed_send(&error),
            };
            let status = response.status();
            let retry_after = retry_after(response.headers());
            let body = match response.bytes().await {
                Ok(body) => body,
                Err(error) if status.is_success() => {
                    return CallOutcome::Unknown {
                        reason: format!(
                            "the service answered {status} but its body could not be read: {}",
                            describe(&error)
                        ),
                    };
                }
                Err(_) => Default::default(),
            };
            classify(status, retry_after, || self.success(&body))
        })
    }

    fn honours_idempotency_key(&self) -> bool {
        self.honours_key
    }

    fn lookup<'a>(&'a self, request: &'a EffectRequest) -> BoxFuture<'a, LookupOutcome> {
        Box::pin(async move {
            let Some(template) = &self.lookup_url else {
                return LookupOutcome::Unsupported;
            };
            let url = match template.render(&request.operation_id) {
                Ok(url) => url,
                Err(error) => {
                    return LookupOutcome::Failed {
                        reason: format!("the lookup url cannot be built: {error}"),
                    };
                }
            };
            let answer = self
                .http
                .get(url)
                .header(IDEMPOTENCY_KEY, &request.operation_id)
                .timeout(self.timeout)
                .send()
                .await;
            let response = match answer {
                Ok(response) => response,
                Err(error) => {
                    return LookupOutcome::Failed {
                        reason: format!("the lookup failed: {}", describe(&error)),
                    };
                }
            };
            let status = response.status();
            if status == StatusCode::NOT_FOUND {
                return LookupOutcome::Absent;
            }
            if !status.is_success() {
                return LookupOutcome::Failed {
                    reason: format!("the lookup answered {status}"),
                };
            }
            match response.bytes().await {
                Ok(body) => LookupOutcome::Found(self.success(&body)),
                Err(error) => LookupOutcome::Failed {
                    reason: format!(
                        "the lookup's answer could not be read: {}",
                        describe(&error)
                    ),
                },
            }
        })
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn has_lookup(&self) -> bool {
        self.lookup_url.is_some()
    }
}

/// What an answered call means.
pub(crate) fn classify(
    status: StatusCode,
    retry_after: Option<Duration>,
    success: impl FnOnce() -> Success,
) -> CallOutcome {
    match status.as_u16() {
        200..=299 => CallOutcome::Succeeded(success()),
        // The service asked us to come back later and did nothing; 408 says the request never
        // reached it whole.
        408 | 429 | 503 => CallOutcome::NotDone {
            reason: format!("the service answered {status}"),
            retry_after,
        },
        400..=499 => CallOutcome::Rejected {
            reason: format!("the service refused the request: {status}"),
        },
        _ => CallOutcome::Unknown {
            reason: format!("the service answered {status}; it may have acted"),
        },
    }
}

/// What a call that got no answer means: nothing sent when no connection was made, unknown
/// otherwise.
fn failed_send(error: &reqwest::Error) -> CallOutcome {
    if error.is_connect() || error.is_builder() {
        CallOutcome::NotDone {
            reason: format!("nothing was sent: {}", describe(error)),
            retry_after: None,
        }
    } else {
        CallOutcome::Unknown {
            reason: format!(
                "the request was sent but no answer came: {}",
                describe(error)
            ),
        }
    }
}

/// An HTTP error in words, without its URL (a lookup URL may hold what the operator wants
/// private, and the error's chain is enough to act on).
fn describe(error: &reqwest::Error) -> String {
    let kind = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "connection failed"
    } else if error.is_body() || error.is_decode() {
        "the body failed"
    } else {
        "transport error"
    };
    let mut text = kind.to_owned();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `Retry-After` in seconds (the HTTP-date form is not honoured: the backoff applies).
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let seconds: u64 = headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds.min(3600)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(code: u16) -> CallOutcome {
        classify(StatusCode::from_u16(code).unwrap(), None, Success::default)
    }

    #[test]
    fn answers_are_classified_by_whether_the_effect_may_have_happened() {
        assert!(matches!(outcome(200), CallOutcome::Succeeded(_)));
        assert!(matches!(outcome(201), CallOutcome::Succeeded(_)));
        assert!(matches!(outcome(400), CallOutcome::Rejected { .. }));
        assert!(matches!(outcome(404), CallOutcome::Rejected { .. }));
        assert!(matches!(outcome(422), CallOutcome::Rejected { .. }));
        assert!(matches!(outcome(408), CallOutcome::NotDone { .. }));
        assert!(matches!(outcome(429), CallOutcome::NotDone { .. }));
        assert!(matches!(outcome(503), CallOutcome::NotDone { .. }));
        assert!(matches!(outcome(500), CallOutcome::Unknown { .. }));
        assert!(matches!(outcome(502), CallOutcome::Unknown { .. }));
        assert!(matches!(outcome(504), CallOutcome::Unknown { .. }));
        assert!(matches!(outcome(302), CallOutcome::Unknown { .. }));
    }

    #[test]
    fn retry_after_is_read_in_seconds_and_capped() {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, "7".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(7)));
        headers.insert(RETRY_AFTER, "999999".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(3600)));
        headers.insert(
            RETRY_AFTER,
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&headers), None);
    }
}
