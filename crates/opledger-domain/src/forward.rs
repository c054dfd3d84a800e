//! Forwarding one update to the bot's own webhook (the gateway, ADR 0012), as events of the
//! update's delivery stream: each attempt is recorded before it leaves, at least once until the
//! bot answers 2xx, given up after a configured age. A Bot API call the bot put in its 2xx
//! answer ("reply in the webhook response") is carried out once: recorded as started in the
//! same append as the acknowledgement, never repeated once its outcome is unknown.
//!
//! | state of the epoch | `Start` | `Acknowledge` | `Fail` | `GiveUp` |
//! |---|---|---|---|---|
//! | not to be forwarded | refused | refused | refused | refused |
//! | waiting (no attempt, or a failed one due) | `ForwardStarted` | refused | refused | `ForwardGivenUp` once old enough |
//! | a failed attempt not yet due | refused | refused | refused | `ForwardGivenUp` once old enough |
//! | an attempt in flight, lease live | refused | `UpdateForwarded` | `ForwardFailed` (that attempt only) | refused |
//! | an attempt in flight, lease expired | `ForwardStarted` (next attempt) | `UpdateForwarded` | `ForwardFailed` | `ForwardGivenUp` once old enough |
//! | acknowledged or given up | refused | refused | refused | refused |
//!
//! A late 2xx of an earlier attempt still acknowledges: the bot has the update.

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

use crate::error::ForwardRejection;

/// An attempt to forward the update was started; recorded before the request leaves, so its
/// append at the stream's version is also the claim (of two forwarders, one wins).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardStarted {
    /// The epoch of the update forwarded.
    pub epoch: u32,
    /// 1 for the first attempt, one more each time.
    pub attempt: u32,
    /// Who forwards it (an instance's worker id).
    pub forwarder: String,
    /// Until when no other forwarder starts another attempt.
    pub lease_until: DateTime<Utc>,
}

/// The bot answered 2xx: it has the update; nothing more is forwarded for this epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateForwarded {
    pub epoch: u32,
    /// The attempt the bot answered.
    pub attempt: u32,
    /// The HTTP status it answered with.
    pub status: u16,
    /// How long that attempt took, in milliseconds.
    pub elapsed_ms: u64,
}

/// An attempt failed (an answer other than 2xx, a timeout, no connection); another is due at
/// `retry_at`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardFailed {
    pub epoch: u32,
    pub attempt: u32,
    /// The HTTP status, when the bot answered.
    pub status: Option<u16>,
    /// What went wrong, secrets removed.
    pub error: String,
    pub retry_at: DateTime<Utc>,
}

/// Not forwarded: the update waited longer than the configured age (Telegram's own is 24 h).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardGivenUp {
    pub epoch: u32,
    /// Attempts made.
    pub attempts: u32,
    /// Why, in a sentence.
    pub reason: String,
}

/// The bot's 2xx answer held a Bot API method call; opledger carries it out. Recorded with the
/// acknowledgement, before the call leaves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerCallStarted {
    pub epoch: u32,
    /// The Bot API method (`sendMessage`, ...).
    pub method: String,
    /// Hex SHA-256 of the call's body as the bot answered it (the body itself may hold message
    /// text, which the ledger does not keep).
    pub digest: String,
    /// Until when its caller may record the outcome; after that a sweep records it unknown.
    pub lease_until: DateTime<Utc>,
}

/// The Bot API call a bot's answer holds, as its start is recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnswerStart {
    pub method: String,
    pub digest: String,
    pub lease_until: DateTime<Utc>,
}

/// The answer's method call succeeded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerCallSent {
    pub epoch: u32,
    pub method: String,
    /// The message it sent, when the method sends one.
    pub message_id: Option<i64>,
}

/// The answer's method call failed or its outcome is unknown; it is never sent again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerCallFailed {
    pub epoch: u32,
    pub method: String,
    /// What went wrong, secrets removed.
    pub error: String,
    /// Whether Telegram refused it (`true`), or nobody knows whether it was carried out.
    pub known: bool,
}

/// What the forwarder asks of an update's delivery stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForwardCommand {
    /// Start the next attempt, leased to `forwarder` until `lease_until`.
    Start {
        forwarder: String,
        lease_until: DateTime<Utc>,
    },
    /// The bot answered `attempt` with 2xx; `answer` is the method call it returned, if any.
    Acknowledge {
        attempt: u32,
        status: u16,
        elapsed_ms: u64,
        answer: Option<AnswerStart>,
    },
    /// `attempt` failed; try again at `retry_at`.
    Fail {
        attempt: u32,
        status: Option<u16>,
        error: String,
        retry_at: DateTime<Utc>,
    },
    /// Give up if the update has waited at least `max_age` since it was received.
    GiveUp { max_age: TimeDelta },
    /// The answer's method call succeeded.
    AnswerSent { message_id: Option<i64> },
    /// The answer's method call failed (`known`) or its outcome is unknown.
    AnswerFailed { error: String, known: bool },
}

/// The forwarding of the current epoch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Forwarding {
    /// Whether this epoch's update is to be forwarded (decided at receipt).
    pub wanted: bool,
    /// When the epoch's update was received.
    pub received_at: Option<DateTime<Utc>>,
    /// Attempts started.
    pub attempts: u32,
    /// The attempt in flight and its lease.
    pub in_flight: Option<(u32, DateTime<Utc>)>,
    /// When the next attempt is due after a failure.
    pub retry_at: Option<DateTime<Utc>>,
    /// Acknowledged or given up: nothing more is forwarded.
    pub done: bool,
    /// The answer's method call: `Some(method)` while started and not finished.
    pub answer_in_flight: Option<String>,
}

/// The events that the forwarding `command` appends to epoch `epoch`, at `now`.
pub fn decide(
    state: &Forwarding,
    epoch: u32,
    command: &ForwardCommand,
    now: DateTime<Utc>,
) -> Result<Vec<crate::DeliveryEvent>, ForwardRejection> {
    use ForwardCommand as C;
    if !state.wanted {
        return Err(ForwardRejection::NotForwarded);
    }
    let live_lease = state
        .in_flight
        .filter(|(_, lease_until)| *lease_until > now);
    match command {
        C::AnswerSent { message_id } => {
            let method = state
                .answer_in_flight
                .clone()
                .ok_or(ForwardRejection::NoAnswerInFlight)?;
            return Ok(vec![
                AnswerCallSent {
                    epoch,
                    method,
                    message_id: *message_id,
                }
                .into(),
            ]);
        }
        C::AnswerFailed { error, known } => {
            let method = state
                .answer_in_flight
                .clone()
                .ok_or(ForwardRejection::NoAnswerInFlight)?;
            return Ok(vec![
                AnswerCallFailed {
                    epoch,
                    method,
                    error: error.clone(),
                    known: *known,
                }
                .into(),
            ]);
        }
        _ if state.done => return Err(ForwardRejection::Done),
        _ => {}
    }
    match command {
        C::Start {
            forwarder,
            lease_until,
        } => {
            if let Some((attempt, lease_until)) = live_lease {
                return Err(ForwardRejection::InFlight {
                    attempt,
                    lease_until,
                });
            }
            if let Some(retry_at) = state.retry_at.filter(|at| *at > now) {
                return Err(ForwardRejection::NotDue { retry_at });
            }
            if *lease_until <= now {
                return Err(ForwardRejection::Invalid("the lease must end after now"));
            }
            Ok(vec![
                ForwardStarted {
                    epoch,
                    attempt: state.attempts + 1,
                    forwarder: forwarder.clone(),
                    lease_until: *lease_until,
                }
                .into(),
            ])
        }
        C::Acknowledge {
            attempt,
            status,
            elapsed_ms,
            answer,
        } => {
            if *attempt == 0 || *attempt > state.attempts {
                return Err(ForwardRejection::NoSuchAttempt { attempt: *attempt });
            }
            let mut events = vec![
                UpdateForwarded {
                    epoch,
                    attempt: *attempt,
                    status: *status,
                    elapsed_ms: *elapsed_ms,
                }
                .into(),
            ];
            if let Some(answer) = answer {
                events.push(
                    AnswerCallStarted {
                        epoch,
                        method: answer.method.clone(),
                        digest: answer.digest.clone(),
                        lease_until: answer.lease_until,
                    }
                    .into(),
                );
            }
            Ok(events)
        }
        C::Fail {
            attempt,
            status,
            error,
            retry_at,
        } => match state.in_flight {
            Some((current, _)) if current == *attempt => Ok(vec![
                ForwardFailed {
                    epoch,
                    attempt: *attempt,
                    status: *status,
                    error: error.clone(),
                    retry_at: *retry_at,
                }
                .into(),
            ]),
            _ => Err(ForwardRejection::NoSuchAttempt { attempt: *attempt }),
        },
        C::GiveUp { max_age } => {
            if let Some((attempt, lease_until)) = live_lease {
                return Err(ForwardRejection::InFlight {
                    attempt,
                    lease_until,
                });
            }
            let received_at = state.received_at.unwrap_or(now);
            if now - received_at < *max_age {
                return Err(ForwardRejection::NotOldEnough { since: received_at });
            }
            let hours = max_age.num_seconds() as f64 / 3600.0;
            Ok(vec![
                ForwardGivenUp {
                    epoch,
                    attempts: state.attempts,
                    reason: format!(
                        "the bot did not acknowledge it within {hours:.2} h of its receipt \
                         ({} attempts)",
                        state.attempts
                    ),
                }
                .into(),
            ])
        }
        C::AnswerSent { .. } | C::AnswerFailed { .. } => unreachable!("handled above"),
    }
}

/// Applies one forwarding event to the state.
pub(crate) fn evolve(state: &mut Forwarding, event: &crate::DeliveryEvent) {
    use crate::DeliveryEvent as E;
    match event {
        E::ForwardStarted(e) => {
            state.attempts = state.attempts.max(e.attempt);
            state.in_flight = Some((e.attempt, e.lease_until));
            state.retry_at = None;
        }
        E::UpdateForwarded(_) => {
            state.in_flight = None;
            state.retry_at = None;
            state.done = true;
        }
        E::ForwardFailed(e) => {
            if state
                .in_flight
                .is_some_and(|(attempt, _)| attempt == e.attempt)
            {
                state.in_flight = None;
            }
            state.retry_at = Some(e.retry_at);
        }
        E::ForwardGivenUp(_) => {
            state.in_flight = None;
            state.retry_at = None;
            state.done = true;
        }
        E::AnswerCallStarted(e) => state.answer_in_flight = Some(e.method.clone()),
        E::AnswerCallSent(_) | E::AnswerCallFailed(_) => state.answer_in_flight = None,
        _ => {}
    }
}
