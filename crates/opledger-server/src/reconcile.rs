//! Operator reconciliation: the queue of operations whose outcome nobody knows ([`list`]), and a
//! person's decision about one of them ([`resolve`]), appended as a `Reconciled` event.
//!
//! The read model only finds the operation's stream; the decision is made on the stream itself,
//! by the domain's `decide`, through the unit of work, which commits it at the version it was
//! decided on, so a decision can never land on an operation that moved meanwhile. The one
//! implementation behind `opledger reconcile resolve` and `POST /v1/operations/{id}/resolution`:
//! both record the same event with the same cause, the operator.

use chrono::{DateTime, Utc};
use opledger_domain::operation::{
    self, OperationCommand, ReconcileOutcome, Reconciled, Status, evolve,
};
use opledger_domain::text::storable_string;
use opledger_domain::{Causation, EventMetadata, Operation, Rejection};
use opledger_ledger::{Changes, Ledger, LedgerError, Undecided, UnitError};
use opledger_projections::operation_status::{self, Filter, OperationStatusRow, ReadError};
use opledger_store::{AnyStore, ReadPool, StoreError, StreamId};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Why an operation could not be listed or resolved. Nothing was changed, unless a storage
/// error says the outcome is unknown; resolving again is then safe: it finds the operation
/// resolved, or resolves it once.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// No operation has this id.
    #[error(
        "no operation has the id {operation_id}: check it against `opledger reconcile list` or \
         `opledger ops`; nothing was changed"
    )]
    UnknownOperation {
        /// The id as given.
        operation_id: String,
    },
    /// The operation is not in `needs_reconciliation` (already resolved, or never marked).
    #[error(
        "operation {operation_id} is {status}, not waiting for reconciliation; nothing was changed"
    )]
    NotWaiting {
        /// The operation's id.
        operation_id: String,
        /// Where it stands.
        status: Status,
    },
    /// The decision names nobody.
    #[error("the operator is empty: say who decides, for the audit trail; nothing was changed")]
    MissingOperator,
    /// The decision gives no reason.
    #[error("the note is empty: say why, for the audit trail; nothing was changed")]
    MissingNote,
    /// An external id was given empty.
    #[error(
        "the external id is empty: give the service's id, or leave it out; nothing was changed"
    )]
    EmptyExternalId,
    /// An external id says the effect happened, which contradicts the outcome.
    #[error(
        "an external id goes only with the outcome succeeded, not {}: leave it out, or \
         resolve as succeeded; nothing was changed",
        outcome_name(*.outcome)
    )]
    ExternalIdWithoutSuccess {
        /// The outcome given.
        outcome: ReconcileOutcome,
    },
    /// Other writers kept changing the operation between reading it and appending.
    #[error(
        "operation {operation_id} changed {attempts} times while being resolved: try again; \
         nothing was changed"
    )]
    Contended {
        /// The operation's id.
        operation_id: String,
        /// How many decisions were tried.
        attempts: usize,
    },
    /// The domain refused the decision.
    #[error("operation {operation_id} refused the decision: {rejection}")]
    Refused {
        /// The operation's id.
        operation_id: String,
        /// Why.
        rejection: Rejection,
    },
    /// The read model could not be read.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// The ledger could not be read or written; the store's message says what to do.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

impl From<StoreError> for ReconcileError {
    fn from(error: StoreError) -> Self {
        ReconcileError::Ledger(error.into())
    }
}

/// What a person found out, as `opledger reconcile resolve --outcome` and the API's `outcome`
/// spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The effect happened.
    Succeeded,
    /// The effect did not happen and will not.
    Failed,
    /// The effect did not happen: call again, with the same operation id.
    Retry,
}

impl From<Outcome> for ReconcileOutcome {
    fn from(outcome: Outcome) -> Self {
        match outcome {
            Outcome::Succeeded => ReconcileOutcome::Succeeded,
            Outcome::Failed => ReconcileOutcome::Failed,
            Outcome::Retry => ReconcileOutcome::Retry,
        }
    }
}

/// The stable snake_case name of an outcome, as the event's payload spells it.
pub fn outcome_name(outcome: ReconcileOutcome) -> &'static str {
    match outcome {
        ReconcileOutcome::Succeeded => "succeeded",
        ReconcileOutcome::Failed => "failed",
        ReconcileOutcome::Retry => "retry",
    }
}

/// What [`resolve`] appended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The operation's id (for `retry`, also the idempotency key of the next call).
    pub operation_id: String,
    /// The operation's stream.
    pub stream_id: String,
    /// The decision as recorded.
    pub decision: Reconciled,
    /// Where the operation stands now: `reconciled`, or `retry_scheduled` (due now) for `retry`.
    pub status: Status,
    /// The stream's version after the append.
    pub version: u64,
    /// The `Reconciled` event's position in the ledger.
    pub position: u64,
    /// When the ledger recorded it.
    pub recorded_at: DateTime<Utc>,
}

/// Records a person's decision about an operation waiting for reconciliation: appends
/// `Reconciled`, caused by the operator, at the version the decision was made on.
///
/// `succeeded` and `failed` end the operation (its reply follows); `retry` makes it due now, to be
/// claimed again with the same operation id as idempotency key. An operation in any other status
/// is left alone ([`ReconcileError::NotWaiting`]). If another writer changes the stream first,
/// the operation is read and decided again, as the ledger's retry policy allows.
pub async fn resolve(
    store: &AnyStore,
    operation_id: &str,
    decision: Reconciled,
    now: DateTime<Utc>,
) -> Result<Resolved, ReconcileError> {
    let decision = storable(decision);
    check(&decision)?;
    let operation_id = operation_id.trim().to_ascii_lowercase();
    let row = operation_status::get(store.reader(), &operation_id)
        .await?
        .ok_or_else(|| ReconcileError::UnknownOperation {
            operation_id: operation_id.clone(),
        })?;
    let stream = StreamId::new(row.stream_id.clone()).map_err(StoreError::from)?;
    let ledger = Ledger::new(store.clone());
    let committed = ledger
        .unit_of_work()
        .run(|snapshot, changes| {
            let state: Operation = snapshot.state(&stream)?;
            stage_resolution(changes, &stream, &state, &operation_id, &decision, now)
                .map_err(Undecided::Rejected)
        })
        .await
        .map_err(|error| refused(error, &operation_id))?;
    let appended = committed
        .appended
        .expect("a reconcile decision always stages its Reconciled event");
    Ok(Resolved {
        operation_id,
        stream_id: stream.to_string(),
        decision,
        status: committed.value,
        version: appended.streams.first().map_or(0, |(_, version)| *version),
        position: *appended.positions.end(),
        recorded_at: appended.recorded_at,
    })
}

/// Stages a person's `decision` about operation `operation_id` on `stream`, decided on its
/// `state`: `Reconciled`, caused by the operator, at the state's version; returns where the
/// operation stands after it. Pure: [`resolve`] runs it through the unit of work.
pub fn stage_resolution(
    changes: &mut Changes,
    stream: &StreamId,
    state: &Operation,
    operation_id: &str,
    decision: &Reconciled,
    now: DateTime<Utc>,
) -> Result<Status, Refusal> {
    if state.operation_id.map(|id| id.to_string()).as_deref() != Some(operation_id) {
        // The read model names a stream that does not hold this operation: it is stale.
        return Err(Refusal::Stale);
    }
    if state.status != Status::NeedsReconciliation {
        return Err(Refusal::NotWaiting(state.status));
    }
    let metadata = EventMetadata::caused_by(Causation::Operator {
        operator: decision.operator.clone(),
    });
    let command = OperationCommand::Reconcile(decision.clone());
    let events = operation::decide(state, &command, now).map_err(Refusal::Domain)?;
    changes.decided(stream, state, &events, &metadata);
    Ok(events.iter().fold(state.clone(), evolve).status)
}

/// Why a decision was refused on the operation's latest state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The stream does not hold the operation the read model said.
    Stale,
    /// The operation is not waiting for a person.
    NotWaiting(Status),
    /// The domain refused the decision.
    Domain(Rejection),
}

/// The unit of work's outcome as [`ReconcileError`].
fn refused(error: UnitError<Refusal>, operation_id: &str) -> ReconcileError {
    let operation_id = operation_id.to_owned();
    match error {
        UnitError::Rejected(Refusal::Stale) => ReconcileError::UnknownOperation { operation_id },
        UnitError::Rejected(Refusal::NotWaiting(status)) => ReconcileError::NotWaiting {
            operation_id,
            status,
        },
        UnitError::Rejected(Refusal::Domain(rejection)) => ReconcileError::Refused {
            operation_id,
            rejection,
        },
        UnitError::Contended { attempts } => ReconcileError::Contended {
            operation_id,
            attempts,
        },
        UnitError::Store(error) => error.into(),
        UnitError::Unreadable(unreadable) => ReconcileError::Ledger(LedgerError::Decode {
            stream: unreadable.stream,
            source: unreadable.source,
        }),
        UnitError::Encode(error) => ReconcileError::Ledger(LedgerError::Encode(error)),
    }
}

/// The decision as both backends can store it (ADR 0010): its texts come from a person, through
/// a command line or an HTTP body.
fn storable(decision: Reconciled) -> Reconciled {
    Reconciled {
        external_id: decision.external_id.map(storable_string),
        operator: storable_string(decision.operator),
        note: storable_string(decision.note),
        ..decision
    }
}

/// The decision's own checks, before anything is read.
fn check(decision: &Reconciled) -> Result<(), ReconcileError> {
    if decision.operator.trim().is_empty() {
        return Err(ReconcileError::MissingOperator);
    }
    if decision.note.trim().is_empty() {
        return Err(ReconcileError::MissingNote);
    }
    match &decision.external_id {
        Some(id) if id.trim().is_empty() => Err(ReconcileError::EmptyExternalId),
        Some(_) if decision.outcome != ReconcileOutcome::Succeeded => {
            Err(ReconcileError::ExternalIdWithoutSuccess {
                outcome: decision.outcome,
            })
        }
        _ => Ok(()),
    }
}

/// An operation waiting for a person, as the reconciliation queue shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Waiting {
    pub operation_id: String,
    pub stream_id: String,
    pub action: String,
    pub business_key: String,
    pub bot: String,
    pub chat_id: Option<i64>,
    pub user_id: Option<i64>,
    /// Claims used so far.
    pub attempts: u32,
    /// Why the outcome is unknown, as the worker recorded it.
    pub reason: Option<String>,
    /// When the operation last changed: when it was marked, unless a refused request or a late
    /// worker left a trace since.
    pub updated_at: DateTime<Utc>,
    /// How long it has been waiting at the time of listing, in whole seconds.
    pub age_seconds: i64,
}

impl Waiting {
    fn new(row: OperationStatusRow, now: DateTime<Utc>) -> Self {
        Waiting {
            age_seconds: (now - row.updated_at).num_seconds().max(0),
            operation_id: row.operation_id,
            stream_id: row.stream_id,
            action: row.action,
            business_key: row.business_key,
            bot: row.bot,
            chat_id: row.chat_id,
            user_id: row.user_id,
            attempts: row.attempts,
            reason: row.last_error,
            updated_at: row.updated_at,
        }
    }
}

/// The operations in `needs_reconciliation`, at most `limit`, most recently changed first, with
/// their age at `now`, read from `pool` (the store's reader, or a read-only `LedgerReader`'s).
pub async fn list(
    pool: ReadPool<'_>,
    now: DateTime<Utc>,
    limit: u32,
) -> Result<Vec<Waiting>, ReconcileError> {
    let filter = Filter {
        status: Some(Status::NeedsReconciliation.as_str().to_owned()),
        limit,
        ..Filter::default()
    };
    let rows = operation_status::list(pool, &filter).await?;
    Ok(rows.into_iter().map(|row| Waiting::new(row, now)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(outcome: ReconcileOutcome, external_id: Option<&str>) -> Reconciled {
        Reconciled {
            outcome,
            external_id: external_id.map(str::to_owned),
            operator: "alice".to_owned(),
            note: "checked the CRM".to_owned(),
        }
    }

    fn now() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).expect("a time")
    }

    fn stream() -> StreamId {
        StreamId::new(opledger_domain::operation_stream("coupon", "a").unwrap()).unwrap()
    }

    /// Decides `commands` one after the other from `state`, as the worker would have.
    fn given(state: Operation, commands: Vec<OperationCommand>) -> Operation {
        commands.iter().fold(state, |state, command| {
            let events = operation::decide(&state, command, now()).expect("accepted");
            events.iter().fold(state, evolve)
        })
    }

    /// An operation whose call was sent and whose outcome is not known yet.
    fn call_sent() -> Operation {
        let received = opledger_domain::operation::Received {
            operation_id: opledger_domain::OperationId::new("coupon", "a"),
            action: "coupon".to_owned(),
            business_key: "a".to_owned(),
            fingerprint: "f".to_owned(),
            params: std::collections::BTreeMap::new(),
            bot: "shop".to_owned(),
            chat_id: Some(7),
            user_id: Some(7),
            update_id: 41,
            message_date: None,
            max_attempts: 3,
        };
        let claim = OperationCommand::Claim {
            worker: "w1".to_owned(),
            lease_until: now() + chrono::TimeDelta::seconds(30),
        };
        let sent = OperationCommand::RecordCallSent {
            worker: "w1".to_owned(),
        };
        given(
            Operation::default(),
            vec![OperationCommand::Receive(received), claim, sent],
        )
    }

    #[test]
    fn a_resolution_is_staged_only_on_the_operation_waiting_for_it() {
        use opledger_domain::operation::OperationEvent;
        use opledger_store::ExpectedVersion;

        let sent = call_sent();
        let id = sent.operation_id.unwrap().to_string();
        let retry = decision(ReconcileOutcome::Retry, None);
        let mut changes = Changes::default();
        let stage = |changes: &mut Changes, state: &Operation, id: &str| {
            stage_resolution(changes, &stream(), state, id, &retry, now())
        };
        let not_waiting = stage(&mut changes, &sent, &id);
        assert_eq!(not_waiting, Err(Refusal::NotWaiting(Status::CallSent)));
        let marked = given(
            sent,
            vec![OperationCommand::MarkForReconciliation {
                reason: "unknown".to_owned(),
            }],
        );
        let stale = stage(&mut changes, &marked, "another-operation");
        assert_eq!(stale, Err(Refusal::Stale));
        assert!(changes.is_empty());

        let status = stage(&mut changes, &marked, &id);
        assert_eq!(status, Ok(Status::RetryScheduled));
        let (expected, staged) = changes.staged::<OperationEvent>(&stream()).unwrap();
        assert_eq!(expected, ExpectedVersion::Exact(4));
        assert_eq!(staged, vec![OperationEvent::Reconciled(retry.clone())]);
        let metadata = changes.requests()[0].events[0].metadata.get();
        assert!(
            metadata.contains("alice"),
            "caused by the operator: {metadata}"
        );
    }

    #[test]
    fn a_decision_is_kept_as_both_backends_can_store_it() {
        let decision = storable(Reconciled {
            external_id: Some("crm\u{0}1".to_owned()),
            operator: "ali\u{0}ce".to_owned(),
            note: "checked\u{0}".to_owned(),
            ..decision(ReconcileOutcome::Succeeded, None)
        });
        assert_eq!(decision.external_id.as_deref(), Some("crm\u{fffd}1"));
        assert_eq!(decision.operator, "ali\u{fffd}ce");
        assert_eq!(decision.note, "checked\u{fffd}");
    }

    #[test]
    fn a_decision_names_its_operator_and_reason() {
        assert!(check(&decision(ReconcileOutcome::Succeeded, Some("crm-1"))).is_ok());
        assert!(check(&decision(ReconcileOutcome::Retry, None)).is_ok());
        let nobody = Reconciled {
            operator: " ".to_owned(),
            ..decision(ReconcileOutcome::Failed, None)
        };
        assert!(matches!(
            check(&nobody),
            Err(ReconcileError::MissingOperator)
        ));
        let no_reason = Reconciled {
            note: String::new(),
            ..decision(ReconcileOutcome::Failed, None)
        };
        assert!(matches!(
            check(&no_reason),
            Err(ReconcileError::MissingNote)
        ));
    }

    #[test]
    fn an_external_id_goes_only_with_success() {
        assert!(matches!(
            check(&decision(ReconcileOutcome::Succeeded, Some(""))),
            Err(ReconcileError::EmptyExternalId)
        ));
        let error = check(&decision(ReconcileOutcome::Retry, Some("crm-1"))).unwrap_err();
        assert_eq!(
            error.to_string(),
            "an external id goes only with the outcome succeeded, not retry: leave it out, or \
             resolve as succeeded; nothing was changed"
        );
    }

    #[test]
    fn the_unit_of_work_s_outcome_keeps_its_typed_error() {
        let contended = refused(UnitError::Contended { attempts: 8 }, "op-1");
        assert!(matches!(
            contended,
            ReconcileError::Contended { ref operation_id, attempts: 8 } if operation_id == "op-1"
        ));
        assert!(matches!(
            refused(UnitError::Rejected(Refusal::Stale), "op-1"),
            ReconcileError::UnknownOperation { .. }
        ));
        assert!(matches!(
            refused(
                UnitError::Rejected(Refusal::NotWaiting(Status::Confirmed)),
                "op-1"
            ),
            ReconcileError::NotWaiting {
                status: Status::Confirmed,
                ..
            }
        ));
        assert!(matches!(
            refused(
                UnitError::Rejected(Refusal::Domain(Rejection::NeedsReconciliation)),
                "op-1"
            ),
            ReconcileError::Refused {
                rejection: Rejection::NeedsReconciliation,
                ..
            }
        ));
    }
}
