//! The contract between the worker and whatever performs a side effect: the [`Effector`] trait,
//! what it is asked ([`EffectRequest`]) and what it may answer ([`CallOutcome`],
//! [`LookupOutcome`]).
//!
//! The one question every answer must settle is whether the effect may have happened. The
//! worker turns the answer into the operation's next event; it never repeats a call whose
//! outcome is unknown unless the effector honours the idempotency key.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::Duration;

use futures_util::future::BoxFuture;
use opledger_domain::text::Redactor;
use serde::Serialize;
use serde_json::Value;

/// What an effector is asked to do: one operation's side effect.
///
/// `operation_id` is stable across every attempt: it is the idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EffectRequest {
    /// The operation's id, sent as the `Idempotency-Key`.
    pub operation_id: String,
    /// The configured action's name.
    pub action: String,
    /// The business key the request was deduplicated on.
    pub business_key: String,
    /// The action's parameters.
    pub params: BTreeMap<String, String>,
    /// The chat the request came from, when there was one.
    pub chat_id: Option<i64>,
    /// The user who asked, when known.
    pub user_id: Option<i64>,
    /// The claim under which this call is made, 1 for the first.
    pub attempt: u32,
}

/// The effect happened: what the service said about it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Success {
    /// The service's id for what it did, when it gave one.
    pub external_id: Option<String>,
    /// The answer's fields that replies and later steps need.
    pub result: BTreeMap<String, Value>,
    /// Hex SHA-256 of the raw answer, when there was one.
    pub response_digest: Option<String>,
}

/// What came of one call.
#[derive(Debug, Clone, PartialEq)]
pub enum CallOutcome {
    /// The effect happened.
    Succeeded(Success),
    /// The service refused for good (e.g. a 4xx answer): the effect did not happen and retrying
    /// will not help.
    Rejected {
        /// Why, in words an operator can act on.
        reason: String,
    },
    /// Certainly nothing happened, and trying later may help: no connection could be made, or
    /// the service said it is overloaded (429, 503).
    NotDone {
        /// Why.
        reason: String,
        /// How long the service asked to wait, when it said.
        retry_after: Option<Duration>,
    },
    /// The request may have been acted on: a timeout or a broken connection after it was sent,
    /// or a 5xx answer. Never repeated blindly.
    Unknown {
        /// What happened.
        reason: String,
    },
}

/// What a lookup by operation id found, after an unknown outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum LookupOutcome {
    /// The effect happened.
    Found(Success),
    /// The service says it has nothing under this operation id: the call did not take effect.
    Absent,
    /// The lookup itself failed; the outcome stays unknown.
    Failed {
        /// Why.
        reason: String,
    },
    /// This effector has no lookup.
    Unsupported,
}

impl Success {
    /// The answer as the ledger keeps it (ADRs 0010, 0011): the effect happened, so its answer
    /// cannot be refused; what a backend cannot store is replaced instead, and so is every
    /// secret `redactor` knows.
    pub(crate) fn kept(self, redactor: &Redactor) -> Success {
        Success {
            external_id: self.external_id.map(|id| redactor.kept_string(id)),
            result: self
                .result
                .into_iter()
                .map(|(name, value)| (redactor.kept_string(name), redactor.kept_value(value)))
                .collect(),
            response_digest: self.response_digest.map(|d| redactor.kept_string(d)),
        }
    }
}

impl CallOutcome {
    /// The outcome as the ledger keeps it (see [`Success::kept`]).
    pub(crate) fn kept(self, redactor: &Redactor) -> CallOutcome {
        let kept = |reason: String| redactor.kept_string(reason);
        match self {
            CallOutcome::Succeeded(success) => CallOutcome::Succeeded(success.kept(redactor)),
            CallOutcome::Rejected { reason } => CallOutcome::Rejected {
                reason: kept(reason),
            },
            CallOutcome::NotDone {
                reason,
                retry_after,
            } => CallOutcome::NotDone {
                reason: kept(reason),
                retry_after,
            },
            CallOutcome::Unknown { reason } => CallOutcome::Unknown {
                reason: kept(reason),
            },
        }
    }
}

impl LookupOutcome {
    /// The outcome as the ledger keeps it (see [`Success::kept`]).
    pub(crate) fn kept(self, redactor: &Redactor) -> LookupOutcome {
        match self {
            LookupOutcome::Found(success) => LookupOutcome::Found(success.kept(redactor)),
            LookupOutcome::Failed { reason } => LookupOutcome::Failed {
                reason: redactor.kept_string(reason),
            },
            other => other,
        }
    }
}

/// Something that performs an action's side effect: the built-in [`HttpEffector`], or an
/// in-process implementation in library use.
///
/// Contract: `call` must report [`CallOutcome::Unknown`] whenever the effect may have happened
/// without a confirmation; `honours_idempotency_key` may be true only if a repeated call with
/// the same `operation_id` can never produce a second effect; `lookup`, when supported, must
/// answer [`LookupOutcome::Absent`] only when the effect certainly did not happen.
///
/// [`HttpEffector`]: crate::HttpEffector
pub trait Effector: Send + Sync + Debug {
    /// Performs the effect once.
    fn call<'a>(&'a self, request: &'a EffectRequest) -> BoxFuture<'a, CallOutcome>;

    /// Whether a repeat with the same operation id is safe (deduplicated by the other side).
    fn honours_idempotency_key(&self) -> bool;

    /// Asks whether the effect happened under this operation id.
    fn lookup<'a>(&'a self, request: &'a EffectRequest) -> BoxFuture<'a, LookupOutcome> {
        let _ = request;
        Box::pin(async { LookupOutcome::Unsupported })
    }

    /// How long one call (or lookup) may take at most; the worker's lease covers it.
    fn timeout(&self) -> Duration;

    /// Whether this effector has a lookup (see [`Effector::lookup`]).
    fn has_lookup(&self) -> bool {
        false
    }

    /// Whether an unknown outcome is resolved without a person: by a retry with the honoured
    /// key, or by a lookup.
    fn resolves_unknown_outcomes(&self) -> bool {
        self.honours_idempotency_key() || self.has_lookup()
    }
}

/// The effector of an action that calls nothing out: it succeeds at once, with no result.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoEffect;

impl Effector for NoEffect {
    fn call<'a>(&'a self, _request: &'a EffectRequest) -> BoxFuture<'a, CallOutcome> {
        Box::pin(async { CallOutcome::Succeeded(Success::default()) })
    }

    fn honours_idempotency_key(&self) -> bool {
        true
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(1)
    }
}

#[cfg(test)]
mod tests {
    use opledger_config::SecretString;
    use opledger_domain::text::REDACTED;

    use super::*;

    #[test]
    fn answers_are_kept_storable_and_without_a_known_secret() {
        let redactor = Redactor::new([&SecretString::from("s3cret-key")]);
        let success = Success {
            external_id: Some("ext\0s3cret-key".to_owned()),
            result: BTreeMap::from([("code".to_owned(), Value::from("s3cret-key"))]),
            response_digest: None,
        };
        let CallOutcome::Succeeded(kept) = CallOutcome::Succeeded(success).kept(&redactor) else {
            panic!("still a success");
        };
        assert_eq!(kept.external_id, Some(format!("ext\u{FFFD}{REDACTED}")));
        assert_eq!(kept.result["code"], REDACTED);
        for outcome in [
            CallOutcome::Rejected {
                reason: "refused s3cret-key".to_owned(),
            },
            CallOutcome::Unknown {
                reason: "no answer for s3cret-key".to_owned(),
            },
        ] {
            let kept = format!("{:?}", outcome.kept(&redactor));
            assert!(
                !kept.contains("s3cret") && kept.contains(REDACTED),
                "{kept}"
            );
        }
        let LookupOutcome::Failed { reason } = (LookupOutcome::Failed {
            reason: "lookup of s3cret-key".to_owned(),
        })
        .kept(&redactor) else {
            panic!("still failed");
        };
        assert_eq!(reason, format!("lookup of {REDACTED}"));
    }
}
