//! The call step (ADR 0007): claim, record `ExternalCallSent`, call the effector, decide its
//! outcome; and the unknown-outcome path (honoured key, else lookup, else a person), which the
//! sweep of leases run out after `ExternalCallSent` takes too.
//!
//! A call's outcome is kept ([`Pending`]) until the task's next commit and committed with it:
//! one decision over both streams, both states handed in, so the commit reads nothing unless a
//! stream moved. The outcome is staged whatever becomes of the rest.
//!
//! Where the claim and the call's record are two commits (no key honoured, no lookup), the
//! record of this call carries the claim of the operation the task takes up next
//! ([`Lookahead`]), and that one's record carries this one's outcome and the claim after it: in
//! a steady stream, one commit per operation, as where the claim and the record are one. The
//! guarantee is unchanged: an operation is never called before its record is committed, and one
//! claimed with nothing recorded is taken over when its lease runs out.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use futures_util::future::BoxFuture;
use opledger_config::ActionConfig;
use opledger_domain::operation::Claim;
use opledger_domain::operation::{Confirmed, ConfirmedVia, OperationCommand, Status};
use opledger_domain::text::Redactor;
use opledger_domain::{EventMetadata, Rejection};
use opledger_ledger::{Changes, Snapshot, Undecided, UnitError};
use opledger_store::{StoreError, StreamId};

use crate::backoff::Backoff;
use crate::effector::{CallOutcome, EffectRequest, Effector, LookupOutcome, Success};
use crate::handle::{Applied, Handle, Operations, StepError, View, stage, stage_outcome};

/// How long a call's outcome is retried while storage fails before the worker gives it up to
/// the sweep (see [`Calls::flush`]).
const FLUSH_PATIENCE: Duration = Duration::from_secs(60);

/// One configured action as the worker runs it.
#[derive(Debug, Clone)]
pub(crate) struct Action {
    pub(crate) config: Arc<ActionConfig>,
    pub(crate) effector: Arc<dyn Effector>,
}

/// A call's outcome, decided and not yet committed.
pub(crate) struct Pending {
    handle: Handle,
    command: OperationCommand,
}

#[cfg(test)]
impl Pending {
    /// `command`, decided on `handle` and not yet committed.
    pub(crate) fn new(handle: Handle, command: OperationCommand) -> Self {
        Pending { handle, command }
    }
}

/// The operation a task takes up after the one it is calling, taken from the worker's queue
/// early so that its claim can ride with this call's record (see the module documentation).
pub(crate) trait Lookahead: Send {
    /// The next operation's handle and effector if its state calls for a claim at `now` and
    /// it is not claimed by this task yet; takes it from the queue first if the task holds
    /// none (`None` when the queue is empty).
    fn claimable(
        &mut self,
        now: DateTime<Utc>,
    ) -> BoxFuture<'_, Option<(Handle, Arc<dyn Effector>)>>;

    /// Its claim was committed: the view after it.
    fn claimed(&mut self, view: View);
}

/// Takes operations through their calls; see the module documentation.
#[derive(Debug)]
pub(crate) struct Calls {
    ops: Operations,
    backoff: Backoff,
    lease_margin: Duration,
    /// Scrubs the configured secrets from every effector answer before it is kept (ADR 0011).
    redactor: Redactor,
}

impl Calls {
    /// Calls whose lease is the effector's time plus `lease_margin`, retried after `backoff`.
    pub(crate) fn new(ops: Operations, backoff: Backoff, lease_margin: Duration) -> Self {
        Calls {
            ops,
            backoff,
            lease_margin,
            redactor: Redactor::default(),
        }
    }

    /// These calls, keeping effector answers without the secrets `redactor` knows.
    pub(crate) fn redacting(mut self, redactor: Redactor) -> Self {
        self.redactor = redactor;
        self
    }

    /// Claims the operation (with `carry`, a previous call's outcome, in the same commit) unless
    /// `claimed` says that a previous call's record carried its claim already, records the call
    /// (with the claim of `next`'s operation when it can ride along) and calls; returns the
    /// call's outcome, decided and not yet committed, or `None` when the claim was lost.
    pub(crate) async fn attempt(
        &self,
        action: &Action,
        mut handle: Handle,
        mut carry: Option<Pending>,
        claimed: bool,
        next: Option<&mut dyn Lookahead>,
    ) -> Result<Option<Pending>, StepError> {
        let now = self.ops.now();
        let worker = self.ops.worker().to_owned();
        let effector = action.effector.as_ref();
        if !claimed {
            let first = claim_commands(effector, &worker, now, self.lease_margin);
            if self
                .commit_carrying(&mut handle, &first, carry.take())
                .await?
                == Applied::Declined
            {
                return Ok(None);
            }
        }
        if claimed || !effector.resolves_unknown_outcomes() {
            opledger_ledger::failpoint::crash("worker-after-claimed");
            if self.record_sent(&mut handle, carry, next).await? == Applied::Declined {
                return Ok(None);
            }
        }
        opledger_ledger::failpoint::crash("worker-after-call-sent");
        let request = effect_request(&handle);
        // Every answer is kept storable and without a known secret, whatever the effector (ADRs
        // 0010, 0011).
        let outcome = action.effector.call(&request).await.kept(&self.redactor);
        opledger_ledger::failpoint::crash("worker-after-response");
        let now = self.ops.now();
        let command = match answered(outcome, |after| now + self.delay(&handle, after)) {
            Ok(command) => command,
            Err(unknown) => self.unknown_command(action, &handle, unknown).await,
        };
        Ok(Some(Pending { handle, command }))
    }

    /// Commits the call's record on `handle` while the claim the step was planned under is
    /// still there, with `carry`'s outcome and the claim of `next`'s operation (when it is a
    /// claimable call of its own whose claim is committed alone) in the same append.
    async fn record_sent(
        &self,
        handle: &mut Handle,
        carry: Option<Pending>,
        next: Option<&mut dyn Lookahead>,
    ) -> Result<Applied, StepError> {
        let worker = self.ops.worker().to_owned();
        let ours = handle.state().claim.clone();
        let sent = OperationCommand::RecordCallSent {
            worker: worker.clone(),
        };
        let carry = match carry {
            // A stream is staged once per commit: an outcome on this very stream goes first.
            Some(pending) if pending.handle.stream() == handle.stream() => {
                self.flush(pending).await;
                None
            }
            carry => carry,
        };
        let now = self.ops.now();
        let mut next = next;
        let upcoming = match next.as_deref_mut() {
            Some(next) => next.claimable(now).await,
            None => None,
        };
        let upcoming = upcoming.filter(|(up, effector)| {
            !effector.resolves_unknown_outcomes()
                && up.stream() != handle.stream()
                && carry
                    .as_ref()
                    .is_none_or(|pending| pending.handle.stream() != up.stream())
        });
        if carry.is_none() && upcoming.is_none() {
            // Decided again after a lost race only while the claim is still the one taken.
            return self
                .ops
                .commit(handle, &[sent], |state| state.claim == ours)
                .await;
        }
        let claim = upcoming.as_ref().map(|(up, effector)| {
            (
                up,
                claim_commands(effector.as_ref(), &worker, now, self.lease_margin),
            )
        });
        let decision = SentWithClaim {
            current: handle.stream(),
            sent: &sent,
            ours: ours.as_ref(),
            current_metadata: self.ops.metadata(handle),
            done: carry.as_ref().map(|pending| {
                (
                    pending.handle.stream(),
                    &pending.command,
                    self.ops.metadata(&pending.handle),
                )
            }),
            next: claim
                .as_ref()
                .map(|(up, commands)| (up.stream(), commands.as_slice(), self.ops.metadata(up))),
            now,
        };
        let mut unit = self
            .ops
            .unit_of_work()
            .knowing(handle.stream().clone(), handle.view().clone());
        if let Some(pending) = &carry {
            unit = unit.knowing(
                pending.handle.stream().clone(),
                pending.handle.view().clone(),
            );
        }
        if let Some((up, _)) = &claim {
            unit = unit.knowing(up.stream().clone(), up.view().clone());
        }
        let committed = match unit
            .run(|snapshot, changes| decision.decide(snapshot, changes))
            .await
        {
            Ok(committed) => committed,
            Err(error) => {
                // The outcome must not be lost with the record: its call happened. It is
                // recorded on its own (retried while storage recovers); the rest is not.
                if let Some(pending) = carry {
                    self.flush(pending).await;
                }
                return Err(error.into());
            }
        };
        let Decided {
            sent,
            refused,
            claimed,
        } = committed.value;
        if let (Some(rejection), Some(pending)) = (refused, &carry) {
            warn_refused(&pending.handle, &rejection);
        }
        if let (Some(view), Some(next)) = (claimed, next) {
            next.claimed(view);
        }
        Ok(match sent {
            Some(view) => {
                handle.advance(view);
                Applied::Done
            }
            None => Applied::Declined,
        })
    }

    /// Commits `commands` (a claim, or a reply's start) on `handle`, with `carry`'s outcome in
    /// the same append.
    pub(crate) async fn commit_carrying(
        &self,
        handle: &mut Handle,
        commands: &[OperationCommand],
        carry: Option<Pending>,
    ) -> Result<Applied, StepError> {
        let pending = match carry {
            // The outcome of a call on this very stream is committed first (a stream is staged
            // once per commit); the claim then finds the stream moved and is decided again.
            Some(pending) if pending.handle.stream() == handle.stream() => {
                self.flush(pending).await;
                None
            }
            carry => carry,
        };
        let Some(pending) = pending else {
            // The domain judges a claim on the fresh state after a lost race: it refuses the
            // winner's live claim.
            return self.ops.commit(handle, commands, |_| true).await;
        };
        let now = self.ops.now();
        let decision = OutcomeWithClaim {
            done: pending.handle.stream(),
            outcome: &pending.command,
            done_metadata: self.ops.metadata(&pending.handle),
            next: handle.stream(),
            claim: commands,
            next_metadata: self.ops.metadata(handle),
            now,
        };
        let committed = self
            .ops
            .unit_of_work()
            .knowing(
                pending.handle.stream().clone(),
                pending.handle.view().clone(),
            )
            .knowing(handle.stream().clone(), handle.view().clone())
            .run(|snapshot, changes| decision.decide(snapshot, changes))
            .await;
        let committed = match committed {
            Ok(committed) => committed,
            Err(error) => {
                // The outcome must not be lost with the claim: the call happened. It is
                // recorded on its own (retried while storage recovers); the claim is not.
                self.flush(pending).await;
                return Err(error.into());
            }
        };
        let (refused, claimed) = committed.value;
        if let Some(rejection) = refused {
            warn_refused(&pending.handle, &rejection);
        }
        Ok(match claimed {
            Some(view) => {
                handle.advance(view);
                Applied::Done
            }
            None => Applied::Declined,
        })
    }

    /// The sweep of a claim whose lease ran out after `ExternalCallSent`: its worker died or
    /// hung, so the outcome is unknown. Never a second blind call.
    pub(crate) async fn sweep(
        &self,
        action: &Action,
        handle: &mut Handle,
    ) -> Result<(), StepError> {
        let reason = "the worker holding the claim stopped before recording the call's outcome \
                      (its lease expired)"
            .to_owned();
        let command = self.unknown_command(action, handle, reason).await;
        self.record(handle, &command).await
    }

    /// Commits a call's outcome on its own. Storage that fails for a while (a full disk, a
    /// restarting server) is waited out for up to [`FLUSH_PATIENCE`], with growing pauses: the
    /// call happened, and its outcome is worth more than the task's time. Only then, or when the
    /// store is closing, is the failure logged; the lease then runs out and the unknown-outcome
    /// path applies.
    pub(crate) async fn flush(&self, mut pending: Pending) {
        let started = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(50);
        loop {
            let error = match self.record(&mut pending.handle, &pending.command).await {
                Ok(()) => return,
                Err(error) => error,
            };
            // Only what passes by itself: a store that is closing, or whose ledger file is gone,
            // does not come back in this process.
            let retryable = matches!(
                &error,
                StepError::Commit(
                    UnitError::Contended { .. } | UnitError::Store(StoreError::Unavailable { .. })
                )
            );
            if !retryable || started.elapsed() + pause > FLUSH_PATIENCE {
                tracing::warn!(
                    operation_id = %pending.handle.received().operation_id,
                    %error,
                    "a call's outcome could not be recorded; the operation will be swept"
                );
                return;
            }
            tracing::debug!(%error, "recording a call's outcome again after a storage failure");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    /// Records what became of a call. If another worker moved the operation meanwhile (its
    /// sweep after our lease ran out), the outcome is decided again on the new state; if the
    /// domain refuses it there, the refusal and the late outcome are recorded for a person.
    async fn record(
        &self,
        handle: &mut Handle,
        command: &OperationCommand,
    ) -> Result<(), StepError> {
        let now = self.ops.now();
        let metadata = self.ops.metadata(handle);
        let stream = handle.stream().clone();
        let committed = self
            .ops
            .unit_of_work()
            .knowing(stream.clone(), handle.view().clone())
            .run(|snapshot, changes| -> Result<_, Undecided<Infallible>> {
                let view: View = snapshot.state(&stream)?;
                Ok(stage_outcome(
                    changes, &stream, &view, command, now, &metadata,
                ))
            })
            .await?;
        if let Some(rejection) = committed.value {
            warn_refused(handle, &rejection);
        }
        Ok(())
    }

    /// After a call whose outcome is unknown: retry only with a key the service honours, else
    /// look up, else leave it to a person. Never a blind repeat.
    async fn unknown_command(
        &self,
        action: &Action,
        handle: &Handle,
        reason: String,
    ) -> OperationCommand {
        let effector = &action.effector;
        let resolution = if effector.honours_idempotency_key() {
            Resolution::KeyHonoured
        } else {
            Resolution::Lookup(
                effector
                    .lookup(&effect_request(handle))
                    .await
                    .kept(&self.redactor),
            )
        };
        unknown_outcome(
            reason,
            resolution,
            self.ops.now() + self.delay(handle, None),
        )
    }

    fn delay(&self, handle: &Handle, retry_after: Option<Duration>) -> TimeDelta {
        let delay = self.backoff.delay(
            &handle.received().operation_id.to_string(),
            handle.state().claims,
            retry_after,
        );
        TimeDelta::from_std(delay).unwrap_or(TimeDelta::MAX)
    }
}

/// The commands of a call step's first commit for `worker` at `now`: the claim, leased for
/// twice the effector's time plus `lease_margin`, with the call's record when the effector
/// resolves unknown outcomes itself (it honours the key or has a lookup).
///
/// A crash between the claim and the request is then resolved without a person, so the claim
/// and the call's record are one commit. Otherwise the claim is committed alone first (the
/// call's record follows as a commit of its own): a worker that dies before the call is
/// recorded leaves a claim another worker takes over when its lease runs out, rather than an
/// unknown outcome for a person.
pub fn claim_commands(
    effector: &dyn Effector,
    worker: &str,
    now: DateTime<Utc>,
    lease_margin: Duration,
) -> Vec<OperationCommand> {
    let effector_time = effector.timeout().saturating_mul(2);
    let lease = TimeDelta::from_std(effector_time + lease_margin).unwrap_or(TimeDelta::MAX);
    let claim = OperationCommand::Claim {
        worker: worker.to_owned(),
        lease_until: now + lease,
    };
    if effector.resolves_unknown_outcomes() {
        let sent = OperationCommand::RecordCallSent {
            worker: worker.to_owned(),
        };
        vec![claim, sent]
    } else {
        vec![claim]
    }
}

/// What the worker records for the effector's answer to a call; `retry_at` says when a call
/// that was not done is tried again, given the service's `Retry-After`. An unknown outcome is
/// `Err` with its reason: what becomes of it is [`unknown_outcome`]'s to say.
pub fn answered(
    outcome: CallOutcome,
    retry_at: impl FnOnce(Option<Duration>) -> DateTime<Utc>,
) -> Result<OperationCommand, String> {
    Ok(match outcome {
        CallOutcome::Succeeded(success) => confirm(success, ConfirmedVia::Response),
        CallOutcome::Rejected { reason } => OperationCommand::Fail { reason },
        CallOutcome::NotDone {
            reason,
            retry_after,
        } => OperationCommand::ScheduleRetry {
            at: retry_at(retry_after),
            reason,
            // Nothing left: a retry cannot repeat an effect.
            same_key: true,
        },
        CallOutcome::Unknown { reason } => return Err(reason),
    })
}

/// How an unknown outcome can be settled without a blind repeat.
#[derive(Debug)]
pub enum Resolution {
    /// The service honours the idempotency key: the call is repeated with it.
    KeyHonoured,
    /// It does not; the service's lookup answered this.
    Lookup(LookupOutcome),
}

/// What the worker records after a call whose outcome is unknown (`reason`): a retry (at
/// `retry_at`) only with a key the service honours or after a lookup that found nothing, the
/// effect when the lookup found it, else a person's reconciliation. Never a blind repeat.
pub fn unknown_outcome(
    reason: String,
    resolution: Resolution,
    retry_at: DateTime<Utc>,
) -> OperationCommand {
    let lookup = match resolution {
        Resolution::KeyHonoured => {
            return OperationCommand::ScheduleRetry {
                at: retry_at,
                reason: format!(
                    "{reason}; retrying with the same idempotency key, which the service honours"
                ),
                same_key: true,
            };
        }
        Resolution::Lookup(lookup) => lookup,
    };
    match lookup {
        LookupOutcome::Found(success) => confirm(success, ConfirmedVia::Lookup),
        LookupOutcome::Absent => OperationCommand::ScheduleRetry {
            at: retry_at,
            reason: format!("{reason}; the lookup found nothing under the operation id"),
            same_key: true,
        },
        LookupOutcome::Failed { reason: lookup } => OperationCommand::MarkForReconciliation {
            reason: format!("{reason}; the lookup failed too ({lookup})"),
        },
        LookupOutcome::Unsupported => OperationCommand::MarkForReconciliation {
            reason: format!(
                "{reason}; the service does not honour the idempotency key and has no \
                 lookup, so a person must check"
            ),
        },
    }
}

/// One decision over two streams: a call's outcome on the operation it was made for, and the
/// next operation's claim (ADR 0007).
#[derive(Debug)]
pub struct OutcomeWithClaim<'a> {
    /// The operation the call was made for.
    pub done: &'a StreamId,
    /// What the worker records of the call.
    pub outcome: &'a OperationCommand,
    pub done_metadata: EventMetadata,
    /// The operation claimed next.
    pub next: &'a StreamId,
    /// The claim's commands ([`claim_commands`]).
    pub claim: &'a [OperationCommand],
    pub next_metadata: EventMetadata,
    pub now: DateTime<Utc>,
}

impl OutcomeWithClaim<'_> {
    /// Stages the outcome (or, refused on the current state, its `TransitionRejected` record)
    /// and the claim if the domain accepts it. Returns the outcome's refusal, if any, and the
    /// next operation's view after its claim (`None`: the claim is lost, nothing is staged for
    /// it, the outcome still is).
    pub fn decide(
        &self,
        snapshot: &Snapshot,
        changes: &mut Changes,
    ) -> Result<(Option<Rejection>, Option<View>), Undecided<Infallible>> {
        let done: View = snapshot.state(self.done)?;
        let next: View = snapshot.state(self.next)?;
        let refused = stage_outcome(
            changes,
            self.done,
            &done,
            self.outcome,
            self.now,
            &self.done_metadata,
        );
        let claimed = stage(
            changes,
            self.next,
            &next,
            self.claim,
            self.now,
            &self.next_metadata,
        )
        .ok();
        Ok((refused, claimed))
    }
}

/// One decision over up to three streams: the call's record on the operation about to be
/// called (while `ours`, the claim the step was planned under, is still there), a previous
/// call's outcome, and the next operation's claim.
#[derive(Debug)]
struct SentWithClaim<'a> {
    current: &'a StreamId,
    sent: &'a OperationCommand,
    ours: Option<&'a Claim>,
    current_metadata: EventMetadata,
    done: Option<(&'a StreamId, &'a OperationCommand, EventMetadata)>,
    next: Option<(&'a StreamId, &'a [OperationCommand], EventMetadata)>,
    now: DateTime<Utc>,
}

/// What [`SentWithClaim`] staged.
#[derive(Debug)]
struct Decided {
    /// The called operation's view after its record; `None`: declined, nothing staged for it.
    sent: Option<View>,
    /// The outcome's refusal (recorded as a `TransitionRejected`), if any.
    refused: Option<Rejection>,
    /// The next operation's view after its claim; `None`: the claim is lost or not asked for.
    claimed: Option<View>,
}

impl SentWithClaim<'_> {
    /// Stages the record if the claim is still ours and the domain accepts it, the outcome (or
    /// its refusal's record) whatever becomes of the rest, and the claim if the domain accepts
    /// it.
    fn decide(
        &self,
        snapshot: &Snapshot,
        changes: &mut Changes,
    ) -> Result<Decided, Undecided<Infallible>> {
        let current: View = snapshot.state(self.current)?;
        let sent = if current.state.claim.as_ref() == self.ours {
            stage(
                changes,
                self.current,
                &current,
                std::slice::from_ref(self.sent),
                self.now,
                &self.current_metadata,
            )
            .ok()
        } else {
            None
        };
        let refused = match &self.done {
            Some((stream, outcome, metadata)) => {
                let done: View = snapshot.state(stream)?;
                stage_outcome(changes, stream, &done, outcome, self.now, metadata)
            }
            None => None,
        };
        let claimed = match &self.next {
            Some((stream, claim, metadata)) => {
                let next: View = snapshot.state(stream)?;
                stage(changes, stream, &next, claim, self.now, metadata).ok()
            }
            None => None,
        };
        Ok(Decided {
            sent,
            refused,
            claimed,
        })
    }
}

fn warn_refused(handle: &Handle, rejection: &Rejection) {
    tracing::warn!(
        operation_id = %handle.received().operation_id,
        %rejection,
        "a late call outcome was refused; recording it for the audit trail"
    );
}

/// Whether the operation's state calls for a claim at `now`: new, a retry that is due, or a
/// claim whose lease ran out with nothing sent.
pub(crate) fn claimable(state: &opledger_domain::Operation, now: DateTime<Utc>) -> bool {
    match state.status {
        Status::Received => true,
        Status::RetryScheduled => state.retry_at.is_none_or(|at| at <= now),
        Status::Claimed => state.claim.as_ref().is_some_and(|c| !c.is_live(now)),
        _ => false,
    }
}

fn effect_request(handle: &Handle) -> EffectRequest {
    let received = handle.received();
    EffectRequest {
        operation_id: received.operation_id.to_string(),
        action: received.action.clone(),
        business_key: received.business_key.clone(),
        params: received.params.clone(),
        chat_id: received.chat_id,
        user_id: received.user_id,
        attempt: handle.state().claims,
    }
}

fn confirm(success: Success, via: ConfirmedVia) -> OperationCommand {
    OperationCommand::Confirm(Confirmed {
        external_id: success.external_id,
        result: success.result,
        response_digest: success.response_digest,
        via,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use opledger_domain::operation::OperationEvent;
    use opledger_ledger::StreamState;
    use opledger_store::{EventStore, ExpectedVersion};

    use super::*;
    use crate::handle::tests::{
        append, called, claimed, confirm, now, operations, received, stream,
    };
    use crate::handle::{Applied, metadata};

    fn claim() -> OperationCommand {
        OperationCommand::Claim {
            worker: "w1".to_owned(),
            lease_until: now() + TimeDelta::minutes(1),
        }
    }

    /// The decision of `a`'s confirmation with `b`'s claim, `b` holding `next`.
    fn decide_with(next: &[OperationEvent]) -> (Option<Rejection>, Option<View>, Changes) {
        let (a, b) = (stream("a"), stream("b"));
        let snapshot = Snapshot::new()
            .given::<View>(a.clone(), &called("a", "w1"))
            .given::<View>(b.clone(), next);
        let (outcome, claims) = (confirm(), [claim()]);
        let decision = OutcomeWithClaim {
            done: &a,
            outcome: &outcome,
            done_metadata: metadata("w1", &received("a")),
            next: &b,
            claim: &claims,
            next_metadata: metadata("w1", &received("b")),
            now: now(),
        };
        let mut changes = Changes::default();
        let (refused, claimed) = decision.decide(&snapshot, &mut changes).unwrap();
        (refused, claimed, changes)
    }

    fn found() -> Success {
        Success {
            external_id: Some("x-1".to_owned()),
            result: BTreeMap::new(),
            response_digest: None,
        }
    }

    /// An effector that takes 25 s at most and honours the key or not.
    #[derive(Debug)]
    struct Slow(bool);

    impl Effector for Slow {
        fn call<'a>(
            &'a self,
            _: &'a EffectRequest,
        ) -> futures_util::future::BoxFuture<'a, CallOutcome> {
            Box::pin(async { CallOutcome::Succeeded(found()) })
        }

        fn honours_idempotency_key(&self) -> bool {
            self.0
        }

        fn timeout(&self) -> Duration {
            Duration::from_secs(25)
        }
    }

    #[test]
    fn the_claim_carries_the_call_s_record_only_when_unknown_outcomes_resolve_themselves() {
        // Leased for twice the effector's time plus the margin: a minute.
        let margin = Duration::from_secs(10);
        let claimed = |effector: &Slow| claim_commands(effector, "w1", now(), margin);
        let sent = OperationCommand::RecordCallSent {
            worker: "w1".to_owned(),
        };
        assert_eq!(claimed(&Slow(true)), vec![claim(), sent]);
        assert_eq!(claimed(&Slow(false)), vec![claim()]);
    }

    #[test]
    fn a_call_s_answer_is_recorded_as_what_it_says_and_an_unknown_one_is_left_to_the_path() {
        let at = now() + TimeDelta::seconds(7);
        let asked = Some(Duration::from_secs(3));
        let not_done = CallOutcome::NotDone {
            reason: "HTTP 503".to_owned(),
            retry_after: asked,
        };
        let retry = answered(not_done, |after| {
            assert_eq!(after, asked, "the service's wait is the caller's to honour");
            at
        });
        let expected = OperationCommand::ScheduleRetry {
            at,
            reason: "HTTP 503".to_owned(),
            same_key: true,
        };
        assert_eq!(retry, Ok(expected));
        let rejected = CallOutcome::Rejected {
            reason: "HTTP 422".to_owned(),
        };
        let fail = OperationCommand::Fail {
            reason: "HTTP 422".to_owned(),
        };
        assert_eq!(answered(rejected, |_| at), Ok(fail));
        let confirmed = answered(CallOutcome::Succeeded(found()), |_| at);
        assert_eq!(confirmed, Ok(confirm_via(ConfirmedVia::Response)));
        let unknown = CallOutcome::Unknown {
            reason: "timed out".to_owned(),
        };
        assert_eq!(answered(unknown, |_| at), Err("timed out".to_owned()));
    }

    fn confirm_via(via: ConfirmedVia) -> OperationCommand {
        OperationCommand::Confirm(Confirmed {
            external_id: Some("x-1".to_owned()),
            result: BTreeMap::new(),
            response_digest: None,
            via,
        })
    }

    #[test]
    fn an_unknown_outcome_is_retried_only_with_an_honoured_key_or_after_a_lookup_found_nothing() {
        let at = now() + TimeDelta::seconds(5);
        let decide = |resolution| unknown_outcome("timed out".to_owned(), resolution, at);
        let retried = |command: &OperationCommand| matches!(command, OperationCommand::ScheduleRetry { at: a, same_key: true, .. } if *a == at);
        assert!(retried(&decide(Resolution::KeyHonoured)));
        assert!(retried(&decide(Resolution::Lookup(LookupOutcome::Absent))));
        assert_eq!(
            decide(Resolution::Lookup(LookupOutcome::Found(found()))),
            confirm_via(ConfirmedVia::Lookup)
        );
        let failed = LookupOutcome::Failed {
            reason: "HTTP 503".to_owned(),
        };
        for lookup in [failed, LookupOutcome::Unsupported] {
            let command = decide(Resolution::Lookup(lookup));
            assert!(
                matches!(command, OperationCommand::MarkForReconciliation { ref reason } if reason.starts_with("timed out; ")),
                "{command:?}"
            );
        }
    }

    #[test]
    fn an_outcome_and_the_next_claim_are_one_decision_over_both_streams() {
        let (refused, claimed, changes) = decide_with(&[received("b").into()]);
        assert!(refused.is_none());
        assert_eq!(claimed.map(|view| view.state.status), Some(Status::Claimed));
        let (a, b) = (stream("a"), stream("b"));
        assert_eq!(changes.streams(), vec![&a, &b], "the outcome first");
        let (expected, _) = changes.staged::<OperationEvent>(&b).unwrap();
        assert_eq!(expected, ExpectedVersion::Exact(1));
    }

    #[test]
    fn a_claim_that_lost_stages_nothing_and_the_outcome_is_still_staged() {
        let (refused, claimed, changes) = decide_with(&[received("b").into(), claimed("w2", 1)]);
        assert!(refused.is_none());
        assert!(claimed.is_none());
        assert_eq!(changes.streams(), vec![&stream("a")]);
    }

    async fn calls() -> (tempfile::TempDir, Calls) {
        let (dir, ops) = operations().await;
        (
            dir,
            Calls::new(ops, Backoff::default(), Duration::from_secs(10)),
        )
    }

    /// Operation `a` with a call sent, `b` received; `a`'s outcome pending and `b` read.
    async fn two_operations(calls: &Calls) -> (Pending, Handle) {
        append(&calls.ops, &stream("a"), 0, &called("a", "w1")).await;
        append(&calls.ops, &stream("b"), 0, &[received("b").into()]).await;
        let pending = Pending {
            handle: calls.ops.load(stream("a")).await.unwrap(),
            command: confirm(),
        };
        (pending, calls.ops.load(stream("b")).await.unwrap())
    }

    async fn types(calls: &Calls, stream: &StreamId) -> Vec<String> {
        let events = calls.ops.store().read_stream(stream, 1, 100).await.unwrap();
        events.into_iter().map(|e| e.event_type).collect()
    }

    #[tokio::test]
    async fn an_outcome_is_committed_with_the_next_claim_in_one_append() {
        let (_dir, calls) = calls().await;
        let (a, b) = (stream("a"), stream("b"));
        let (pending, mut next) = two_operations(&calls).await;
        let head = calls.ops.store().head().await.unwrap().position;
        let applied = calls
            .commit_carrying(&mut next, &[claim()], Some(pending))
            .await
            .unwrap();
        assert_eq!(applied, Applied::Done);
        assert_eq!(next.state().status, Status::Claimed);
        assert_eq!(next.view().version(), 2);
        let a_events = calls.ops.store().read_stream(&a, 4, 1).await.unwrap();
        let b_events = calls.ops.store().read_stream(&b, 2, 1).await.unwrap();
        assert_eq!(a_events[0].event_type, "Confirmed");
        assert_eq!(b_events[0].event_type, "Claimed");
        assert_eq!(
            (a_events[0].position, b_events[0].position),
            (head + 1, head + 2),
            "one append: the outcome, then the claim"
        );
    }

    #[tokio::test]
    async fn a_claim_that_lost_the_race_declines_and_the_late_outcome_is_still_committed() {
        let (_dir, calls) = calls().await;
        let (a, b) = (stream("a"), stream("b"));
        let (pending, mut next) = two_operations(&calls).await;
        // Another worker claims the next operation after this one read it.
        append(&calls.ops, &b, 1, &[claimed("w2", 1)]).await;
        let applied = calls
            .commit_carrying(&mut next, &[claim()], Some(pending))
            .await
            .unwrap();
        assert_eq!(applied, Applied::Declined);
        assert_eq!(
            types(&calls, &a).await,
            ["Received", "Claimed", "ExternalCallSent", "Confirmed"]
        );
        assert_eq!(types(&calls, &b).await, ["Received", "Claimed"]);
        let winner = calls.ops.load(b).await.unwrap();
        assert_eq!(winner.state().claim.as_ref().unwrap().worker, "w2");
    }

    #[tokio::test]
    async fn the_call_is_not_recorded_under_a_claim_that_is_not_ours_any_more() {
        let (_dir, calls) = calls().await;
        let a = stream("a");
        append(&calls.ops, &a, 0, &[received("a").into()]).await;
        let mut handle = calls.ops.load(a.clone()).await.unwrap();
        let applied = calls
            .commit_carrying(&mut handle, &[claim()], None)
            .await
            .unwrap();
        assert_eq!(applied, Applied::Done);
        let ours = handle.state().claim.clone();
        // A claim was taken since under the same worker id (another process configured with
        // it): the domain alone would let this worker record its call under that claim.
        append(&calls.ops, &a, 2, &[claimed("w1", 2)]).await;
        let sent = OperationCommand::RecordCallSent {
            worker: "w1".to_owned(),
        };
        let recorded = calls
            .ops
            .commit(&mut handle, &[sent], |state| state.claim == ours)
            .await
            .unwrap();
        assert_eq!(recorded, Applied::Declined);
        assert_eq!(types(&calls, &a).await, ["Received", "Claimed", "Claimed"]);
    }

    /// A task's next operation as the call step sees it, for tests: `handle`, offered with
    /// `effector` until it is claimed.
    struct Next {
        handle: Handle,
        effector: Arc<dyn Effector>,
        claimed: Option<View>,
    }

    impl Lookahead for Next {
        fn claimable(
            &mut self,
            now: DateTime<Utc>,
        ) -> BoxFuture<'_, Option<(Handle, Arc<dyn Effector>)>> {
            let offer = (self.claimed.is_none() && claimable(self.handle.state(), now))
                .then(|| (self.handle.clone(), Arc::clone(&self.effector)));
            Box::pin(async move { offer })
        }

        fn claimed(&mut self, view: View) {
            self.claimed = Some(view);
        }
    }

    /// `a` called with its outcome pending, `b` claimed by this worker with nothing sent, `c`
    /// received and read, offered next with an effector that honours the key (`honours`) or not.
    async fn three_operations(calls: &Calls, honours: bool) -> (Pending, Handle, Next) {
        let (pending, mut b) = two_operations(calls).await;
        assert_eq!(
            calls
                .commit_carrying(&mut b, &[claim()], None)
                .await
                .unwrap(),
            Applied::Done
        );
        append(&calls.ops, &stream("c"), 0, &[received("c").into()]).await;
        let next = Next {
            handle: calls.ops.load(stream("c")).await.unwrap(),
            effector: Arc::new(Slow(honours)),
            claimed: None,
        };
        (pending, b, next)
    }

    /// `three_operations`, then `race` (a stream, the version it expects, an event) appended by
    /// another writer, then `b`'s record with `a`'s outcome and `c` offered next.
    async fn record_after(
        calls: &Calls,
        honours: bool,
        race: Option<(&str, u64, OperationEvent)>,
    ) -> (Applied, Handle, Next) {
        let (pending, mut b, mut next) = three_operations(calls, honours).await;
        if let Some((key, version, event)) = race {
            append(&calls.ops, &stream(key), version, &[event]).await;
        }
        let applied = calls
            .record_sent(&mut b, Some(pending), Some(&mut next))
            .await
            .unwrap();
        (applied, b, next)
    }

    #[tokio::test]
    async fn a_call_s_record_carries_the_outcome_before_it_and_the_next_claim_in_one_append() {
        let (_dir, calls) = calls().await;
        let (applied, b, next) = record_after(&calls, false, None).await;
        let head = calls.ops.store().head().await.unwrap().position;
        assert_eq!(applied, Applied::Done);
        assert_eq!(b.state().status, Status::CallSent);
        let claimed = next.claimed.expect("the next operation is claimed");
        assert_eq!(claimed.state.status, Status::Claimed);
        assert_eq!(claimed.state.claim.as_ref().unwrap().worker, "w1");
        let positions = |stream: StreamId, version| {
            let calls = &calls;
            async move {
                let events = calls.ops.store().read_stream(&stream, version, 1).await;
                let event = events.unwrap().remove(0);
                (event.event_type, event.position)
            }
        };
        assert_eq!(
            [
                positions(stream("b"), 3).await,
                positions(stream("a"), 4).await,
                positions(stream("c"), 2).await,
            ],
            [
                ("ExternalCallSent".to_owned(), head - 2),
                ("Confirmed".to_owned(), head - 1),
                ("Claimed".to_owned(), head),
            ],
            "one append: the record, the outcome, the next claim"
        );
    }

    #[tokio::test]
    async fn a_next_claim_lost_to_another_worker_leaves_the_record_and_the_outcome_committed() {
        let (_dir, calls) = calls().await;
        // Another worker claims `c` after this one read it.
        let race = ("c", 1, claimed("w2", 1));
        let (applied, _, next) = record_after(&calls, false, Some(race)).await;
        assert_eq!(applied, Applied::Done);
        assert!(next.claimed.is_none(), "the claim is lost");
        assert_eq!(
            types(&calls, &stream("a")).await,
            ["Received", "Claimed", "ExternalCallSent", "Confirmed"]
        );
        assert_eq!(
            types(&calls, &stream("b")).await,
            ["Received", "Claimed", "ExternalCallSent"]
        );
        assert_eq!(types(&calls, &stream("c")).await, ["Received", "Claimed"]);
    }

    #[tokio::test]
    async fn a_record_under_a_claim_taken_since_is_declined_and_the_outcome_still_committed() {
        let (_dir, calls) = calls().await;
        // A claim taken since under the same worker id (another process configured with it).
        let race = ("b", 2, claimed("w1", 2));
        let (applied, _, _) = record_after(&calls, false, Some(race)).await;
        assert_eq!(applied, Applied::Declined, "never called under that claim");
        assert_eq!(
            types(&calls, &stream("b")).await,
            ["Received", "Claimed", "Claimed"]
        );
        assert_eq!(
            types(&calls, &stream("a")).await,
            ["Received", "Claimed", "ExternalCallSent", "Confirmed"]
        );
    }

    #[tokio::test]
    async fn an_operation_whose_claim_carries_its_record_is_not_claimed_ahead() {
        let (_dir, calls) = calls().await;
        let (applied, _, next) = record_after(&calls, true, None).await;
        assert_eq!(applied, Applied::Done);
        assert!(
            next.claimed.is_none(),
            "its claim and record are one commit of its own"
        );
        assert_eq!(types(&calls, &stream("c")).await, ["Received"]);
        assert_eq!(
            types(&calls, &stream("a")).await,
            ["Received", "Claimed", "ExternalCallSent", "Confirmed"]
        );
    }

    #[tokio::test]
    async fn an_operation_claimed_ahead_is_called_after_one_commit_of_its_own() {
        let (_dir, calls) = calls().await;
        let (_, _, mut next) = record_after(&calls, false, None).await;
        let mut c = next.handle.clone();
        c.advance(next.claimed.take().unwrap());
        let config = crate::handle::tests::config();
        let action = Action {
            config: Arc::new(config.actions[0].clone()),
            effector: Arc::new(Slow(false)),
        };
        let head = calls.ops.store().head().await.unwrap().position;
        let outcome = calls
            .attempt(&action, c, None, true, None)
            .await
            .unwrap()
            .expect("called under the claim taken ahead");
        assert_eq!(
            calls.ops.store().head().await.unwrap().position,
            head + 1,
            "the record alone: no second claim"
        );
        calls.flush(outcome).await;
        assert_eq!(
            types(&calls, &stream("c")).await,
            ["Received", "Claimed", "ExternalCallSent", "Confirmed"]
        );
    }
}
