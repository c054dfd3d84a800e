//! The worker loop: due operations in, one decided append per step out.
//!
//! For each due operation the worker reads its stream (the read model only says where to look)
//! and takes the step its state calls for:
//! - received, a due retry, or a claim whose lease expired with nothing sent: claim it
//!   (`Claimed` at the version read: of two racing workers one wins), record `ExternalCallSent`,
//!   then call the effector and record what came back;
//! - a claim whose lease expired after `ExternalCallSent` (its worker died or hung): the
//!   unknown-outcome path, never a second blind call;
//! - terminal, with a reply due: send the reply, itself an ambiguous effect.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use futures_util::StreamExt;
use opledger_config::{ActionConfig, Config, ReplyPlaceholder};
use opledger_domain::operation::{
    Confirmed, ConfirmedVia, OperationCommand, OperationEvent, Received, TransitionRejected,
    decide, evolve,
};
use opledger_domain::{Causation, DomainEvent, EventMetadata, Operation, Status, delivery_stream};
use opledger_ledger::{Clock, LedgerError, expected, request};
use opledger_projections::operation_status::{self, OperationStatusRow};
use opledger_store::{AnyStore, EventStore, StoreError, StreamId};
use opledger_telegram::BotApi;
use tokio::sync::{Notify, Semaphore};

use crate::backoff::Backoff;
use crate::effector::{CallOutcome, EffectRequest, Effector, LookupOutcome, NoEffect, Success};
use crate::http::HttpEffector;
use crate::reply::Replier;

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// This worker's id, recorded in its claims: unique among the workers sharing a ledger.
    pub id: String,
    /// How many operations it works on at once.
    pub concurrency: usize,
    /// The longest it sleeps without looking for due operations (it is also woken by appends
    /// to the ledger and by the earliest known due time).
    pub idle_poll: Duration,
    /// Added to the effector's time (call plus lookup) to make a claim's lease.
    pub lease_margin: Duration,
    /// The delay before a transient failure is tried again.
    pub backoff: Backoff,
    /// Whether to send replies to users (a worker may leave them to others).
    pub replies: bool,
    /// The least time between two replies to one chat (Telegram allows about one per second).
    pub reply_interval: Duration,
}

impl WorkerOptions {
    /// Defaults for a worker named `id`.
    pub fn new(id: impl Into<String>) -> Self {
        WorkerOptions {
            id: id.into(),
            concurrency: 4,
            idle_poll: Duration::from_secs(1),
            lease_margin: Duration::from_secs(10),
            backoff: Backoff::default(),
            replies: true,
            reply_interval: Duration::from_secs(1),
        }
    }
}

/// Why the worker could not start or go on.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("cannot set up the bot api client of bot `{bot}`: {source}")]
    BotApi {
        bot: String,
        #[source]
        source: opledger_telegram::BotApiError,
    },
    #[error(transparent)]
    Client(#[from] crate::http::ClientError),
    #[error("no action named `{0}` is configured, so no effector can be set for it")]
    UnknownAction(String),
    #[error("the worker's concurrency must be at least 1")]
    NoConcurrency,
    #[error("cannot read the due operations: {0}")]
    Read(#[from] operation_status::ReadError),
}

/// Why one step on one operation did not complete; the operation stays due and is looked at
/// again.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StepError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(
        "operation stream `{0}` does not start with Received; the ledger is not one this worker can act on"
    )]
    NotAnOperation(String),
    #[error("invalid stream id: {0}")]
    StreamId(#[from] opledger_store::InvalidRequest),
}

impl From<StoreError> for StepError {
    fn from(error: StoreError) -> Self {
        StepError::Ledger(LedgerError::Store(error))
    }
}

/// One configured action as the worker runs it.
#[derive(Debug, Clone)]
pub(crate) struct Action {
    pub(crate) config: Arc<ActionConfig>,
    pub(crate) effector: Arc<dyn Effector>,
}

/// Takes due operations through their lifecycle; see the module documentation.
#[derive(Debug, Clone)]
pub struct Worker {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: AnyStore,
    clock: Arc<dyn Clock>,
    actions: HashMap<String, Action>,
    action_names: Vec<String>,
    replier: Replier,
    options: WorkerOptions,
    /// Operations a task of this worker is working on: never two tasks on one operation.
    in_flight: Mutex<HashSet<String>>,
    /// Operations listed as due on which the last step found nothing to do (or failed), left
    /// alone until the instant given, so that a stale or unworkable row cannot make the loop
    /// spin.
    resting: Mutex<HashMap<String, tokio::time::Instant>>,
}

/// The outcome of one append attempt.
pub(crate) enum Appended {
    /// Committed; the state moved on.
    Done,
    /// Another writer moved the stream first; the step was not taken.
    Lost,
    /// The domain refused the command in the current state.
    Refused(opledger_domain::Rejection),
}

/// An operation as the worker sees it: its state, the request that started it, how it ended.
pub(crate) struct View {
    pub(crate) stream: StreamId,
    pub(crate) state: Operation,
    pub(crate) received: Received,
    /// The last terminal event, for the reply.
    pub(crate) ending: Option<OperationEvent>,
}

impl Worker {
    /// A worker for the actions of `config` (HTTP effectors as configured, none for actions
    /// without one) on `store`.
    pub fn new(
        config: &Config,
        store: AnyStore,
        clock: Arc<dyn Clock>,
        options: WorkerOptions,
    ) -> Result<Self, WorkerError> {
        if options.concurrency == 0 {
            return Err(WorkerError::NoConcurrency);
        }
        let http = HttpEffector::client()?;
        let mut actions = HashMap::new();
        for action in &config.actions {
            let effector: Arc<dyn Effector> = match &action.effector {
                Some(effector) => Arc::new(HttpEffector::new(
                    http.clone(),
                    effector,
                    result_fields(action),
                )),
                None => Arc::new(NoEffect),
            };
            actions.insert(
                action.name.clone(),
                Action {
                    config: Arc::new(action.clone()),
                    effector,
                },
            );
        }
        let mut bots = HashMap::new();
        let bot_http = BotApi::http_client().map_err(|source| WorkerError::BotApi {
            bot: String::new(),
            source,
        })?;
        for bot in &config.bots {
            let api = BotApi::new(&bot.api_base_url, bot.token.clone(), bot_http.clone())
                .map_err(|source| WorkerError::BotApi {
                    bot: bot.name.clone(),
                    source,
                })?
                .with_request_timeout(Duration::from_secs(10));
            bots.insert(bot.name.clone(), api);
        }
        let mut action_names: Vec<String> = actions.keys().cloned().collect();
        action_names.sort();
        let replier = Replier::new(bots, options.reply_interval);
        Ok(Worker {
            inner: Arc::new(Inner {
                store,
                clock,
                actions,
                action_names,
                replier,
                options,
                in_flight: Mutex::new(HashSet::new()),
                resting: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// Replaces the effector of `action`: an in-process side effect in library use.
    ///
    /// Call it before the worker runs; a worker already shared keeps its effectors.
    pub fn with_effector(
        mut self,
        action: &str,
        effector: Arc<dyn Effector>,
    ) -> Result<Self, WorkerError> {
        let inner = Arc::get_mut(&mut self.inner)
            .expect("with_effector is called before the worker is shared");
        let entry = inner
            .actions
            .get_mut(action)
            .ok_or_else(|| WorkerError::UnknownAction(action.to_owned()))?;
        entry.effector = effector;
        Ok(self)
    }

    /// This worker's id.
    pub fn id(&self) -> &str {
        &self.inner.options.id
    }

    /// Works until `shutdown` completes, then lets the operations in hand finish their step
    /// and returns.
    pub async fn run(&self, shutdown: impl Future<Output = ()> + Send) {
        let inner = &self.inner;
        if inner.action_names.is_empty() {
            // No action is configured: nothing can ever be due for this worker.
            shutdown.await;
            return;
        }
        let permits = Arc::new(Semaphore::new(inner.options.concurrency));
        let finished = Arc::new(Notify::new());
        let queue = Arc::new(Queue::default());
        let mut head = inner.store.subscribe();
        let mut tasks = tokio::task::JoinSet::new();
        tokio::pin!(shutdown);
        // Rows waiting for a task: enough that a task finishing a call finds the next operation
        // at hand (to commit the outcome and the next claim together), few enough to stay fresh.
        let capacity = inner.options.concurrency.saturating_mul(2);
        let page = u32::try_from(inner.options.concurrency.saturating_mul(4)).unwrap_or(u32::MAX);
        loop {
            let now = inner.clock.now();
            let mut queued = 0usize;
            if queue.len() < capacity {
                match operation_status::due(
                    inner.store.reader(),
                    now,
                    &inner.action_names,
                    inner.options.replies,
                    page,
                )
                .await
                {
                    Ok(mut rows) => {
                        spread(&inner.options.id, &mut rows);
                        for row in rows {
                            if queue.len() >= capacity {
                                break;
                            }
                            if inner.take(&row.operation_id) {
                                queue.push(row);
                                queued += 1;
                            }
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, "cannot read the due operations; trying again");
                    }
                }
            }
            while !queue.is_empty() {
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    break;
                };
                let worker = self.clone();
                let queue = Arc::clone(&queue);
                let finished = Arc::clone(&finished);
                tasks.spawn(async move {
                    worker.drain(&queue, &finished).await;
                    drop(permit);
                    finished.notify_one();
                });
            }
            while tasks.try_join_next().is_some() {}
            if queued > 0 {
                continue;
            }
            let wait = self.idle_wait(now).await;
            tokio::select! {
                () = &mut shutdown => {
                    // Rows not started are given back; the tasks finish what they hold.
                    for row in queue.take_all() {
                        inner.release(&row.operation_id);
                    }
                    return self.finish(tasks).await;
                }
                _ = head.changed() => {}
                () = finished.notified() => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One task's work: operations from the queue until it is empty. A call's outcome is kept
    /// until the next operation's claim, so both go in one commit; it is committed alone when
    /// there is no next operation to claim.
    async fn drain(&self, queue: &Queue, finished: &Notify) {
        let mut carry: Option<Pending> = None;
        while let Some(row) = queue.pop() {
            finished.notify_one();
            // Released even if the step panics, so the operation is not stranded here.
            let release = Release {
                inner: Arc::clone(&self.inner),
                operation_id: row.operation_id.clone(),
            };
            carry = self.step_carrying(&row, carry).await;
            drop(release);
        }
        if let Some(pending) = carry {
            self.flush(pending).await;
        }
    }

    /// Looks at every operation due now, `concurrency` at a time, and returns how many it
    /// looked at; for tests and one-shot runs.
    pub async fn run_due(&self) -> Result<usize, WorkerError> {
        let inner = &self.inner;
        let mut rows = operation_status::due(
            inner.store.reader(),
            inner.clock.now(),
            &inner.action_names,
            inner.options.replies,
            u32::MAX,
        )
        .await?;
        spread(&inner.options.id, &mut rows);
        let count = rows.len();
        futures_util::stream::iter(rows)
            .for_each_concurrent(inner.options.concurrency, |row| async move {
                if self.inner.take(&row.operation_id) {
                    self.step(&row).await;
                    self.inner.release(&row.operation_id);
                }
            })
            .await;
        Ok(count)
    }

    async fn finish(&self, mut tasks: tokio::task::JoinSet<()>) {
        while tasks.join_next().await.is_some() {}
    }

    /// How long to sleep with nothing to do: until the earliest due time, at most `idle_poll`.
    async fn idle_wait(&self, now: DateTime<Utc>) -> Duration {
        let inner = &self.inner;
        let next = operation_status::next_due(
            inner.store.reader(),
            &inner.action_names,
            inner.options.replies,
        )
        .await;
        // Operations due already were just skipped (in hand, or resting): their tasks' ends
        // and new appends wake the loop, so only a future due time shortens the sleep.
        let until_next = match next {
            Ok(Some(at)) if at > now => (at - now).to_std().unwrap_or(inner.options.idle_poll),
            _ => inner.options.idle_poll,
        };
        until_next.clamp(Duration::from_millis(5), inner.options.idle_poll)
    }

    /// Takes the step one due operation calls for; failures are logged and the operation stays
    /// due.
    async fn step(&self, row: &OperationStatusRow) {
        if let Some(pending) = self.step_carrying(row, None).await {
            self.flush(pending).await;
        }
    }

    /// Commits a call's outcome on its own; failures are logged (the lease then runs out and
    /// the unknown-outcome path applies).
    async fn flush(&self, mut pending: Pending) {
        if let Err(error) = self
            .record_outcome(&mut pending.view, pending.command)
            .await
        {
            tracing::warn!(
                operation_id = %pending.view.received.operation_id,
                %error,
                "a call's outcome could not be recorded; the operation will be swept"
            );
        }
    }

    /// Takes the step `row` calls for, committing `carry` (a previous call's outcome) with
    /// this operation's claim when there is one, or alone first; returns this operation's own
    /// call outcome if it made a call.
    async fn step_carrying(
        &self,
        row: &OperationStatusRow,
        carry: Option<Pending>,
    ) -> Option<Pending> {
        let mut carry = carry;
        let result = self.try_step(row, &mut carry).await;
        if let Some(pending) = carry.take() {
            self.flush(pending).await;
        }
        match result {
            Ok(Stepped::Called(pending)) => return Some(*pending),
            Ok(Stepped::Done) => {}
            Ok(Stepped::Nothing) => self
                .inner
                .rest(&row.operation_id, self.inner.options.idle_poll),
            Err(error) => {
                tracing::warn!(
                    operation_id = %row.operation_id,
                    %error,
                    "operation step failed; it stays due"
                );
                self.inner
                    .rest(&row.operation_id, self.inner.options.idle_poll);
            }
        }
        None
    }

    /// Takes the step the operation's stream calls for. `carry`, a previous call's outcome, is
    /// committed with this operation's claim, or alone before any other step.
    async fn try_step(
        &self,
        row: &OperationStatusRow,
        carry: &mut Option<Pending>,
    ) -> Result<Stepped, StepError> {
        let Some(action) = self.inner.actions.get(&row.action).cloned() else {
            return Ok(Stepped::Nothing);
        };
        let mut view = self.load(StreamId::new(row.stream_id.clone())?).await?;
        let now = self.inner.clock.now();
        let lease_expired = view.state.claim.as_ref().is_some_and(|c| !c.is_live(now));
        let claimable = match view.state.status {
            Status::Received => true,
            Status::RetryScheduled => view.state.retry_at.is_none_or(|at| at <= now),
            Status::Claimed => lease_expired,
            _ => false,
        };
        if claimable {
            return self.attempt(&action, view, carry.take()).await;
        }
        if let Some(pending) = carry.take() {
            self.flush(pending).await;
        }
        match view.state.status {
            Status::CallSent if lease_expired => {
                let reason = "the worker holding the claim stopped before recording the call's \
                              outcome (its lease expired)"
                    .to_owned();
                let command = self.unknown_command(&action, &view, reason).await;
                self.record_outcome(&mut view, command).await?;
            }
            status
                if status.is_terminal()
                    && self.inner.options.replies
                    && row.due_at.is_some_and(|at| at <= now) =>
            {
                self.inner.replier.reply(self, &action, &mut view).await?;
            }
            _ => return Ok(Stepped::Nothing),
        }
        Ok(Stepped::Done)
    }

    /// Claim (with `carry` in the same commit), record the call, call; returns the call's
    /// outcome, decided and not yet committed.
    async fn attempt(
        &self,
        action: &Action,
        mut view: View,
        carry: Option<Pending>,
    ) -> Result<Stepped, StepError> {
        let now = self.inner.clock.now();
        let effector_time = action.effector.timeout().saturating_mul(2);
        let lease = TimeDelta::from_std(effector_time + self.inner.options.lease_margin)
            .unwrap_or(TimeDelta::MAX);
        let claim = OperationCommand::Claim {
            worker: self.inner.options.id.clone(),
            lease_until: now + lease,
        };
        let sent = OperationCommand::RecordCallSent {
            worker: self.inner.options.id.clone(),
        };
        // A crash between the claim and the request is resolved without a person when the
        // effector honours the key or has a lookup, so then the claim and the call's record are
        // one commit. Otherwise the claim is committed alone first: a worker that dies before
        // the call is recorded leaves a claim another worker takes over when its lease runs
        // out, rather than an unknown outcome for a person.
        let together = action.effector.resolves_unknown_outcomes();
        let first = if together {
            vec![claim, sent.clone()]
        } else {
            vec![claim]
        };
        let claimed = match carry {
            Some(pending) => self.append_with(pending, &mut view, first).await?,
            None => self.append_all(&mut view, first).await?,
        };
        if !matches!(claimed, Appended::Done) {
            return Ok(Stepped::Nothing);
        }
        if !together {
            opledger_ledger::failpoint::crash("worker-after-claimed");
            if !matches!(self.append(&mut view, sent).await?, Appended::Done) {
                return Ok(Stepped::Nothing);
            }
        }
        opledger_ledger::failpoint::crash("worker-after-call-sent");
        let request = effect_request(&view);
        let outcome = action.effector.call(&request).await;
        opledger_ledger::failpoint::crash("worker-after-response");
        let now = self.inner.clock.now();
        let command = match outcome {
            CallOutcome::Succeeded(success) => confirm(success, ConfirmedVia::Response),
            CallOutcome::Rejected { reason } => OperationCommand::Fail { reason },
            CallOutcome::NotDone {
                reason,
                retry_after,
            } => OperationCommand::ScheduleRetry {
                at: now + self.delay(&view, retry_after),
                reason,
                // Nothing left: a retry cannot repeat an effect.
                same_key: true,
            },
            CallOutcome::Unknown { reason } => self.unknown_command(action, &view, reason).await,
        };
        Ok(Stepped::Called(Box::new(Pending { view, command })))
    }

    /// Commits a pending outcome and the claim commands of `view` in one append; if either
    /// stream moved meanwhile, each is decided again and committed on its own.
    async fn append_with(
        &self,
        pending: Pending,
        view: &mut View,
        commands: Vec<OperationCommand>,
    ) -> Result<Appended, StepError> {
        let Pending {
            view: mut done,
            command: outcome,
        } = pending;
        let now = self.inner.clock.now();
        let outcome_events = match decide(&done.state, &outcome, now) {
            Ok(events) if !events.is_empty() => events,
            // Refused or nothing to append: the usual path records it (or its refusal).
            _ => {
                self.record_outcome(&mut done, outcome).await?;
                return self.append_all(view, commands).await;
            }
        };
        let (claim_events, state) = match decide_all(&view.state, commands.clone(), now) {
            Ok(decided) => decided,
            Err(rejection) => {
                self.record_outcome(&mut done, outcome).await?;
                return Ok(Appended::Refused(rejection));
            }
        };
        let requests = vec![
            request(
                done.stream.clone(),
                expected(done.state.version),
                &outcome_events,
                &self.metadata(&done),
            )?,
            request(
                view.stream.clone(),
                expected(view.state.version),
                &claim_events,
                &self.metadata(view),
            )?,
        ];
        match self.inner.store.append(requests).await {
            Ok(_) => {
                view.state = state;
                Ok(Appended::Done)
            }
            Err(StoreError::VersionConflict { .. }) => {
                self.record_outcome(&mut done, outcome).await?;
                *view = self.load(view.stream.clone()).await?;
                self.append_all(view, commands).await
            }
            Err(error) => Err(error.into()),
        }
    }

    /// After a call whose outcome is unknown: retry only with a key the service honours, else
    /// look up, else leave it to a person. Never a blind repeat.
    async fn unknown_command(
        &self,
        action: &Action,
        view: &View,
        reason: String,
    ) -> OperationCommand {
        let effector = &action.effector;
        if effector.honours_idempotency_key() {
            return OperationCommand::ScheduleRetry {
                at: self.inner.clock.now() + self.delay(view, None),
                reason: format!(
                    "{reason}; retrying with the same idempotency key, which the service honours"
                ),
                same_key: true,
            };
        }
        let request = effect_request(view);
        match effector.lookup(&request).await {
            LookupOutcome::Found(success) => confirm(success, ConfirmedVia::Lookup),
            LookupOutcome::Absent => OperationCommand::ScheduleRetry {
                at: self.inner.clock.now() + self.delay(view, None),
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

    /// Records what became of a call. If another worker moved the operation meanwhile (its
    /// sweep after our lease ran out), the outcome is decided again on the new state; if the
    /// domain refuses it there, the refusal and the late outcome are recorded for a person.
    async fn record_outcome(
        &self,
        view: &mut View,
        command: OperationCommand,
    ) -> Result<(), StepError> {
        for _ in 0..4 {
            match self.append(view, command.clone()).await? {
                Appended::Done => return Ok(()),
                Appended::Lost => *view = self.load(view.stream.clone()).await?,
                Appended::Refused(rejection) => {
                    tracing::warn!(
                        operation_id = %view.received.operation_id,
                        %rejection,
                        "a late call outcome was refused; recording it for the audit trail"
                    );
                    let record = TransitionRejected {
                        command: command.kind().as_str().to_owned(),
                        status: view.state.status.as_str().to_owned(),
                        reason: format!(
                            "{rejection}; the late outcome was: {}",
                            describe(&command)
                        ),
                    };
                    let event: OperationEvent = record.into();
                    self.append_events(view, vec![event]).await?;
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    fn delay(&self, view: &View, retry_after: Option<Duration>) -> TimeDelta {
        let delay = self.inner.options.backoff.delay(
            &view.received.operation_id.to_string(),
            view.state.claims,
            retry_after,
        );
        TimeDelta::from_std(delay).unwrap_or(TimeDelta::MAX)
    }

    /// Reads an operation's stream.
    pub(crate) async fn load(&self, stream: StreamId) -> Result<View, StepError> {
        let recorded = self.inner.store.read_stream(&stream, 1, usize::MAX).await?;
        let mut state = Operation::default();
        let mut received = None;
        let mut ending = None;
        for event in &recorded {
            let event = OperationEvent::from_stored(
                &event.event_type,
                event.schema_version,
                &event.payload,
            )
            .map_err(|source| LedgerError::Decode {
                stream: stream.to_string(),
                source,
            })?;
            match &event {
                OperationEvent::Received(r) if received.is_none() => received = Some(r.clone()),
                event if ends(event) => ending = Some(event.clone()),
                _ => {}
            }
            state = evolve(state, &event);
        }
        let received = received.ok_or_else(|| StepError::NotAnOperation(stream.to_string()))?;
        Ok(View {
            stream,
            state,
            received,
            ending,
        })
    }

    /// Decides `command` on the view's state and appends the result at the version read.
    pub(crate) async fn append(
        &self,
        view: &mut View,
        command: OperationCommand,
    ) -> Result<Appended, StepError> {
        self.append_all(view, [command]).await
    }

    /// Decides `commands` one after the other on the view's state and appends all their
    /// events in one commit at the version read; refused as a whole if any is refused.
    pub(crate) async fn append_all(
        &self,
        view: &mut View,
        commands: impl IntoIterator<Item = OperationCommand>,
    ) -> Result<Appended, StepError> {
        match decide_all(&view.state, commands, self.inner.clock.now()) {
            Ok((events, _)) if events.is_empty() => Ok(Appended::Done),
            Ok((events, _)) => self.append_events(view, events).await,
            Err(rejection) => Ok(Appended::Refused(rejection)),
        }
    }

    async fn append_events(
        &self,
        view: &mut View,
        events: Vec<OperationEvent>,
    ) -> Result<Appended, StepError> {
        let append = request(
            view.stream.clone(),
            expected(view.state.version),
            &events,
            &self.metadata(view),
        )?;
        match self.inner.store.append(vec![append]).await {
            Ok(_) => {
                for event in &events {
                    if ends(event) {
                        view.ending = Some(event.clone());
                    }
                    view.state = evolve(std::mem::take(&mut view.state), event);
                }
                Ok(Appended::Done)
            }
            Err(StoreError::VersionConflict { .. }) => Ok(Appended::Lost),
            Err(error) => Err(error.into()),
        }
    }

    /// The metadata of the worker's events on an operation: caused by this worker, correlated
    /// with the update that started the operation.
    fn metadata(&self, view: &View) -> EventMetadata {
        EventMetadata {
            causation: Causation::Worker {
                worker: self.inner.options.id.clone(),
            },
            correlation: delivery_stream(&view.received.bot, view.received.update_id).ok(),
        }
    }

    pub(crate) fn now(&self) -> DateTime<Utc> {
        self.inner.clock.now()
    }
}

impl Inner {
    fn take(&self, operation_id: &str) -> bool {
        {
            let mut resting = self
                .resting
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let now = tokio::time::Instant::now();
            match resting.get(operation_id) {
                Some(until) if *until > now => return false,
                Some(_) => {
                    resting.remove(operation_id);
                }
                None => {}
            }
        }
        self.in_flight
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(operation_id.to_owned())
    }

    /// Leaves an operation alone for `pause`.
    fn rest(&self, operation_id: &str, pause: Duration) {
        let mut resting = self
            .resting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = tokio::time::Instant::now();
        if resting.len() > 10_000 {
            resting.retain(|_, until| *until > now);
        }
        resting.insert(operation_id.to_owned(), now + pause);
    }

    fn release(&self, operation_id: &str) {
        self.in_flight
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(operation_id);
    }
}

/// Gives an operation back when its step ends, however it ends.
struct Release {
    inner: Arc<Inner>,
    operation_id: String,
}

impl Drop for Release {
    fn drop(&mut self) {
        self.inner.release(&self.operation_id);
    }
}

/// Due operations taken by this worker and waiting for a task.
#[derive(Debug, Default)]
struct Queue {
    rows: Mutex<std::collections::VecDeque<OperationStatusRow>>,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::VecDeque<OperationStatusRow>> {
        self.rows
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn push(&self, row: OperationStatusRow) {
        self.lock().push_back(row);
    }

    fn pop(&self) -> Option<OperationStatusRow> {
        self.lock().pop_front()
    }

    fn len(&self) -> usize {
        self.lock().len()
    }

    fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn take_all(&self) -> Vec<OperationStatusRow> {
        self.lock().drain(..).collect()
    }
}

/// What a step did.
enum Stepped {
    /// Nothing was due on the stream (a stale row, or another worker holds it).
    Nothing,
    /// A step was taken and committed.
    Done,
    /// A call was made; its outcome is decided and not yet committed.
    Called(Box<Pending>),
}

/// A call's outcome, decided and not yet committed.
struct Pending {
    view: View,
    command: OperationCommand,
}

/// Decides `commands` one after the other from `state`: their events and the state after them.
fn decide_all(
    state: &Operation,
    commands: impl IntoIterator<Item = OperationCommand>,
    now: DateTime<Utc>,
) -> Result<(Vec<OperationEvent>, Operation), opledger_domain::Rejection> {
    let mut state = state.clone();
    let mut events = Vec::new();
    for command in commands {
        for event in decide(&state, &command, now)? {
            state = evolve(state, &event);
            events.push(event);
        }
    }
    Ok((events, state))
}

/// Whether `event` ends an operation (what its reply answers).
fn ends(event: &OperationEvent) -> bool {
    matches!(
        event,
        OperationEvent::Confirmed(_) | OperationEvent::Failed(_) | OperationEvent::Reconciled(_)
    )
}

/// Orders a page of due operations by a hash of this worker's id and the operation, so that
/// workers sharing a ledger start on different operations instead of racing for the same one.
fn spread(worker: &str, rows: &mut [OperationStatusRow]) {
    use std::hash::{DefaultHasher, Hash, Hasher};
    rows.sort_by_cached_key(|row| {
        let mut hasher = DefaultHasher::new();
        worker.hash(&mut hasher);
        row.operation_id.hash(&mut hasher);
        hasher.finish()
    });
}

/// The top-level answer fields an action's confirmed reply uses.
fn result_fields(action: &ActionConfig) -> Vec<String> {
    let mut fields: Vec<String> = action
        .reply
        .confirmed
        .placeholders()
        .filter_map(|p| match p {
            ReplyPlaceholder::Result(path) => path.split('.').next().map(str::to_owned),
            _ => None,
        })
        .collect();
    fields.sort();
    fields.dedup();
    fields
}

fn effect_request(view: &View) -> EffectRequest {
    let received = &view.received;
    EffectRequest {
        operation_id: received.operation_id.to_string(),
        action: received.action.clone(),
        business_key: received.business_key.clone(),
        params: received.params.clone(),
        chat_id: received.chat_id,
        user_id: received.user_id,
        attempt: view.state.claims,
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

/// A command's outcome in words, for a recorded refusal.
fn describe(command: &OperationCommand) -> String {
    match command {
        OperationCommand::Confirm(c) => format!(
            "confirmed via {:?}, external id {}",
            c.via,
            c.external_id.as_deref().unwrap_or("none")
        ),
        OperationCommand::Fail { reason } => format!("failed: {reason}"),
        OperationCommand::ScheduleRetry { reason, .. } => format!("retry: {reason}"),
        OperationCommand::MarkForReconciliation { reason } => {
            format!("needs reconciliation: {reason}")
        }
        other => other.kind().as_str().to_owned(),
    }
}
