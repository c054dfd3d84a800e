//! The worker loop: due operations in, one decided commit per step out.
//!
//! The loop reads due operations from `operation_status` into a short queue that its tasks drain
//! (never two tasks on one operation; a row as current as its stream whose step found nothing
//! to do rests a while, one listed before the stream's last commit is only dropped), and
//! looks for more when the queue is down to half. Each operation's stream is read as it is
//! queued (the read model only says where to look), so the task that takes it up does not wait
//! for the read; a read older than the row is done again, and one that went stale in the queue
//! costs the step's commit a version conflict and a decision on the fresh state. The task takes
//! the step the operation's state calls for:
//! - received, a due retry, or a claim whose lease expired with nothing sent: the call step
//!   ([`crate::call`]: claim, `ExternalCallSent`, the call, its outcome, which the task keeps
//!   until its next commit; a call's record may carry the next operation's claim, ADR 0020);
//! - a claim whose lease expired after `ExternalCallSent` (its worker died or hung): the
//!   unknown-outcome path, never a second blind call;
//! - terminal, with a reply due: the reply ([`crate::reply`]), itself an ambiguous effect.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use opledger_config::{ActionConfig, Config, ReplyPlaceholder};
use opledger_domain::Status;
use opledger_domain::operation::OperationCommand;
use opledger_ledger::Clock;
use opledger_projections::operation_status::{self, OperationStatusRow};
use opledger_store::{AnyStore, EventStore, Priority, StreamId};
use opledger_telegram::BotApi;
use tokio::sync::{Notify, Semaphore};

use crate::backoff::Backoff;
use crate::call::{Action, Calls, Lookahead, Pending, claimable};
use crate::effector::{Effector, NoEffect};
use crate::handle::{Applied, Handle, Operations, StepError, View};
use crate::http::HttpEffector;
use crate::reply::{Replier, Start};

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
    /// The in-process effectors of a program that embeds opledger, by action name: required
    /// for every action whose `[actions.effector]` says `in_process = true`.
    pub effectors: HashMap<String, Arc<dyn Effector>>,
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
            effectors: HashMap::new(),
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
    #[error(
        "action `{0}` runs an in-process effect ([actions.effector] in_process = true), which \
         only a Rust program embedding opledger has, and none was given; register it with the \
         worker (`WorkerOptions::effectors`) or give the action an effector url"
    )]
    NoEffector(String),
    #[error("cannot read the due operations: {0}")]
    Read(#[from] operation_status::ReadError),
}

/// Takes due operations through their lifecycle; see the module documentation.
#[derive(Debug, Clone)]
pub struct Worker {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    ops: Operations,
    calls: Calls,
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
                Some(effector) => match &effector.url {
                    Some(url) => Arc::new(HttpEffector::new(
                        http.clone(),
                        url.clone(),
                        effector,
                        result_fields(action),
                    )),
                    None => options
                        .effectors
                        .get(&action.name)
                        .cloned()
                        .ok_or_else(|| WorkerError::NoEffector(action.name.clone()))?,
                },
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
        // Nothing received from outside is kept with a secret in it (ADR 0011).
        let redactor = config.redactor();
        for bot in &config.bots {
            let api = BotApi::new(&bot.api_base_url, bot.token.clone(), bot_http.clone())
                .map_err(|source| WorkerError::BotApi {
                    bot: bot.name.clone(),
                    source,
                })?
                .with_request_timeout(Duration::from_secs(10))
                .redacting(&redactor);
            bots.insert(bot.name.clone(), api);
        }
        let mut action_names: Vec<String> = actions.keys().cloned().collect();
        action_names.sort();
        let replier = Replier::new(bots, options.reply_interval);
        let ops = Operations::new(store, options.id.clone(), clock);
        let calls =
            Calls::new(ops.clone(), options.backoff, options.lease_margin).redacting(redactor);
        Ok(Worker {
            inner: Arc::new(Inner {
                ops,
                calls,
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
        let mut head = inner.ops.store().subscribe();
        let mut tasks = tokio::task::JoinSet::new();
        tokio::pin!(shutdown);
        // Rows waiting for a task: enough that a task finishing a call finds the next operation
        // at hand (to commit the outcome and the next claim together), few enough to stay fresh.
        let capacity = inner.options.concurrency.saturating_mul(2);
        let page = u32::try_from(inner.options.concurrency.saturating_mul(4)).unwrap_or(u32::MAX);
        loop {
            let now = inner.ops.now();
            let mut queued = 0usize;
            // Whether some operation is due now that this loop left alone (in hand, resting, or
            // no room in the queue): then the earliest due time is now, and only a task's end or
            // an append can change what there is to do. The loop looks again only once the
            // queue is down to half: a look lists up to `page` rows, as many of them in hand as
            // there are queued and running, so a look after every row taken would mostly list
            // those again (at concurrency 32, 128 rows read per operation).
            let mut due_now = queue.len() > capacity / 2;
            if !due_now {
                match operation_status::due(
                    inner.ops.store().queue_reader(),
                    now,
                    &inner.action_names,
                    inner.options.replies,
                    page,
                )
                .await
                {
                    Ok(mut rows) => {
                        due_now = !rows.is_empty();
                        spread(&inner.options.id, &mut rows);
                        for row in rows {
                            if queue.len() >= capacity {
                                break;
                            }
                            if inner.take(&row.operation_id) {
                                queue.push(Queued::start(&inner.ops, row));
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
            let wait = if due_now {
                inner.options.idle_poll
            } else {
                self.idle_wait(now).await
            };
            tokio::select! {
                () = &mut shutdown => {
                    // Rows not started are given back; the tasks finish what they hold.
                    for queued in queue.take_all() {
                        queued.loading.abort();
                        inner.release(&queued.row.operation_id);
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
    /// until the task's next commit (the next operation's claim, or its call's record), so both
    /// go in one commit; it is committed alone when there is no next operation. A call's record
    /// may carry the claim of the operation the task takes up next (`Upcoming`), taken from
    /// the queue early for that.
    async fn drain(&self, queue: &Queue, finished: &Notify) {
        let mut carry: Option<Pending> = None;
        let mut upcoming: Option<Upcoming> = None;
        let priority = self.inner.ops.store().priority();
        loop {
            // Intake goes first while updates queue up (`Priority::crowded`, ADR 0021); with
            // room to spare the worker keeps going. A call's outcome is not held while
            // waiting: it is committed now, alone, rather than late.
            let turn = if priority.crowded() {
                if let Some(pending) = carry.take() {
                    self.inner.calls.flush(pending).await;
                }
                Some(priority.uncrowded(Priority::WAIT).await)
            } else {
                None
            };
            let Upcoming {
                row,
                handle,
                release,
                claimed,
            } = match upcoming.take() {
                Some(upcoming) => upcoming,
                None => match self.next_queued(queue, finished).await {
                    Some(upcoming) => upcoming,
                    None => break,
                },
            };
            let mut ahead = Ahead {
                worker: self,
                queue,
                finished,
                slot: &mut upcoming,
            };
            carry = self
                .step_carrying(&row, handle, carry, claimed, Some(&mut ahead))
                .await;
            drop(release);
            drop(turn);
        }
        if let Some(pending) = carry {
            self.inner.calls.flush(pending).await;
        }
    }

    /// The first operation waiting in `queue`, its stream read, in hand until it is dropped.
    async fn next_queued(&self, queue: &Queue, finished: &Notify) -> Option<Upcoming> {
        self.queued_where(queue, finished, |_| true).await
    }

    /// The first operation waiting in `queue` whose row `wanted`, as [`Worker::next_queued`].
    async fn queued_where(
        &self,
        queue: &Queue,
        finished: &Notify,
        wanted: impl Fn(&OperationStatusRow) -> bool,
    ) -> Option<Upcoming> {
        let Queued { row, loading } = queue.pop_where(wanted)?;
        finished.notify_one();
        // Released even if the step panics, so the operation is not stranded here.
        let release = Release {
            inner: Arc::clone(&self.inner),
            operation_id: row.operation_id.clone(),
        };
        let handle = loaded(&self.inner.ops, &row, loading).await;
        Some(Upcoming {
            row,
            handle,
            release,
            claimed: false,
        })
    }

    /// Looks at every operation due now, `concurrency` at a time, and returns how many it
    /// looked at; for tests and one-shot runs.
    pub async fn run_due(&self) -> Result<usize, WorkerError> {
        let inner = &self.inner;
        let mut rows = operation_status::due(
            inner.ops.store().queue_reader(),
            inner.ops.now(),
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
                    let handle = load(&self.inner.ops, &row.stream_id).await;
                    if let Some(pending) = self.step_carrying(&row, handle, None, false, None).await
                    {
                        self.inner.calls.flush(pending).await;
                    }
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
            inner.ops.store().queue_reader(),
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

    /// Takes the step `row` calls for on `handle`, its stream as read (`claimed`: by a previous
    /// call's record, for this task), committing `carry` (a previous call's outcome) with this
    /// operation's claim, call's record or reply's start when there is one, or alone; `next` offers
    /// the operation the task takes up next for a claim with the call's record. Returns this
    /// operation's own call outcome if it made a call. Failures are logged and the operation
    /// stays due.
    async fn step_carrying(
        &self,
        row: &OperationStatusRow,
        handle: Result<Handle, StepError>,
        carry: Option<Pending>,
        claimed: bool,
        next: Option<&mut dyn Lookahead>,
    ) -> Option<Pending> {
        let mut carry = carry;
        // A row listed before its operation's last commit (a look that raced a task's step, or
        // an operation whose outcome was still carried) is not rested: nothing was due on the
        // stream as it is now, and the next look lists its row as it is now.
        let current = handle
            .as_ref()
            .is_ok_and(|handle| handle.state().version == row.version);
        let result = match handle {
            Ok(handle) => self.try_step(row, handle, &mut carry, claimed, next).await,
            Err(error) => Err(error),
        };
        if let Some(pending) = carry.take() {
            self.inner.calls.flush(pending).await;
        }
        match result {
            Ok(Stepped::Called(pending)) => return Some(*pending),
            Ok(Stepped::Done) => {}
            Ok(Stepped::Nothing) if current => self
                .inner
                .rest(&row.operation_id, self.inner.options.idle_poll),
            Ok(Stepped::Nothing) => {}
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
    /// committed with this operation's claim, call's record or reply's start, alone before a
    /// sweep, or left in `carry` for the caller to commit alone.
    async fn try_step(
        &self,
        row: &OperationStatusRow,
        mut handle: Handle,
        carry: &mut Option<Pending>,
        claimed: bool,
        next: Option<&mut dyn Lookahead>,
    ) -> Result<Stepped, StepError> {
        let inner = &self.inner;
        let Some(action) = inner.actions.get(&row.action).cloned() else {
            return Ok(Stepped::Nothing);
        };
        let now = inner.ops.now();
        let state = handle.state();
        if claimed || claimable(state, now) {
            return Ok(
                match inner
                    .calls
                    .attempt(&action, handle, carry.take(), claimed, next)
                    .await?
                {
                    Some(pending) => Stepped::Called(Box::new(pending)),
                    None => Stepped::Nothing,
                },
            );
        }
        let lease_expired = state.claim.as_ref().is_some_and(|c| !c.is_live(now));
        match state.status {
            status
                if status.is_terminal()
                    && inner.options.replies
                    && row.due_at.is_some_and(|at| at <= now) =>
            {
                // The reply's start carries the previous call's outcome, in one append (ADR
                // 0026); what no start took, [`Worker::step_carrying`] commits alone after.
                let mut start = Carrying {
                    calls: &inner.calls,
                    carry,
                };
                inner
                    .replier
                    .reply(&inner.ops, &action.config, &mut handle, &mut start)
                    .await?;
            }
            Status::CallSent if lease_expired => {
                if let Some(pending) = carry.take() {
                    inner.calls.flush(pending).await;
                }
                inner.calls.sweep(&action, &mut handle).await?;
            }
            _ => return Ok(Stepped::Nothing),
        }
        Ok(Stepped::Done)
    }
}

/// A reply's start committed with the outcome of the task's previous call, if it carries one.
struct Carrying<'a, 'c> {
    calls: &'a Calls,
    carry: &'c mut Option<Pending>,
}

impl Start for Carrying<'_, '_> {
    fn start<'a>(
        &'a mut self,
        handle: &'a mut Handle,
        commands: &'a [OperationCommand],
    ) -> futures_util::future::BoxFuture<'a, Result<Applied, StepError>> {
        Box::pin(
            self.calls
                .commit_carrying(handle, commands, self.carry.take()),
        )
    }

    fn flush(&mut self) -> futures_util::future::BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Some(pending) = self.carry.take() {
                self.calls.flush(pending).await;
            }
        })
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

/// Reads the operation stream `stream_id` (one read).
async fn load(ops: &Operations, stream_id: &str) -> Result<Handle, StepError> {
    ops.load(StreamId::new(stream_id.to_owned())?).await
}

/// The stream of `row`'s operation as `loading` read it while the row waited in the queue; read
/// again if that read is older than the row (listed after a commit the read missed).
async fn loaded(
    ops: &Operations,
    row: &OperationStatusRow,
    loading: tokio::task::JoinHandle<Result<Handle, StepError>>,
) -> Result<Handle, StepError> {
    match loading.await {
        Ok(Ok(handle)) if handle.state().version >= row.version => Ok(handle),
        Ok(Err(error)) => Err(error),
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Ok(Ok(_)) | Err(_) => load(ops, &row.stream_id).await,
    }
}

/// An operation in a task's hand: its row, its stream as read, and the guard that gives it
/// back.
struct Upcoming {
    row: OperationStatusRow,
    handle: Result<Handle, StepError>,
    release: Release,
    /// Its claim rode with the record of the task's previous call: it is this task's to call.
    claimed: bool,
}

/// A task's next operation, offered to the call step for a claim with its call's record.
struct Ahead<'a> {
    worker: &'a Worker,
    queue: &'a Queue,
    finished: &'a Notify,
    slot: &'a mut Option<Upcoming>,
}

impl Lookahead for Ahead<'_> {
    fn claimable(
        &mut self,
        now: DateTime<Utc>,
    ) -> futures_util::future::BoxFuture<'_, Option<(Handle, Arc<dyn Effector>)>> {
        Box::pin(async move {
            if self.slot.is_none() {
                // A row still queued means that no other task was free to take it. Replies
                // (due from when their operation was received, ADR 0026) are passed over for an
                // operation to claim, whose claim can then ride on this record.
                *self.slot = self
                    .worker
                    .queued_where(self.queue, self.finished, |row| {
                        [Status::Received, Status::RetryScheduled]
                            .iter()
                            .any(|status| status.as_str() == row.status)
                    })
                    .await;
            }
            let upcoming = self.slot.as_ref()?;
            let handle = upcoming.handle.as_ref().ok()?;
            let action = self.worker.inner.actions.get(&upcoming.row.action)?;
            (!upcoming.claimed && claimable(handle.state(), now))
                .then(|| (handle.clone(), Arc::clone(&action.effector)))
        })
    }

    fn claimed(&mut self, view: View) {
        if let Some(Upcoming {
            handle: Ok(handle),
            claimed,
            ..
        }) = self.slot.as_mut()
        {
            handle.advance(view);
            *claimed = true;
        }
    }
}

/// A due operation taken by this worker, waiting for a task, its stream being read already: the
/// task that takes it up finds the read done instead of waiting for it.
#[derive(Debug)]
struct Queued {
    row: OperationStatusRow,
    loading: tokio::task::JoinHandle<Result<Handle, StepError>>,
}

impl Queued {
    /// `row`, with the read of its stream started.
    fn start(ops: &Operations, row: OperationStatusRow) -> Self {
        let (ops, stream_id) = (ops.clone(), row.stream_id.clone());
        let loading = tokio::spawn(async move { load(&ops, &stream_id).await });
        Queued { row, loading }
    }
}

/// Due operations taken by this worker and waiting for a task.
#[derive(Debug, Default)]
struct Queue {
    rows: Mutex<std::collections::VecDeque<Queued>>,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::VecDeque<Queued>> {
        self.rows
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn push(&self, queued: Queued) {
        self.lock().push_back(queued);
    }

    fn pop_where(&self, wanted: impl Fn(&OperationStatusRow) -> bool) -> Option<Queued> {
        let mut rows = self.lock();
        let at = rows.iter().position(|queued| wanted(&queued.row))?;
        rows.remove(at)
    }

    fn len(&self) -> usize {
        self.lock().len()
    }

    fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn take_all(&self) -> Vec<Queued> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handle::tests::{
        append, called, claimed, config, confirm, now, operations, received, stream,
    };
    use opledger_domain::ReplyStatus;

    /// The row `operation_status` lists for operation `a` at `version`, received.
    fn row(version: u64) -> OperationStatusRow {
        row_of("a", version, "received")
    }

    /// The row `operation_status` lists for operation `key` at `version`, in `status`.
    fn row_of(key: &str, version: u64, status: &str) -> OperationStatusRow {
        OperationStatusRow {
            operation_id: received(key).operation_id.to_string(),
            stream_id: stream(key).to_string(),
            action: "coupon".to_owned(),
            business_key: key.to_owned(),
            bot: "shop".to_owned(),
            chat_id: Some(7),
            user_id: Some(7),
            status: status.to_owned(),
            attempts: 0,
            worker: None,
            lease_until: None,
            due_at: Some(now()),
            external_id: None,
            last_error: None,
            reply: "not_started".to_owned(),
            key_conflicts: 0,
            created_at: now(),
            updated_at: now(),
            version,
            last_position: version,
        }
    }

    /// Worker `w1` for the `coupon` action on `ops`' ledger, at [`now`].
    fn worker(ops: &Operations) -> Worker {
        let clock = Arc::new(opledger_ledger::ManualClock::new(now()));
        Worker::new(
            &config(),
            ops.store().clone(),
            clock,
            WorkerOptions::new("w1"),
        )
        .expect("a worker")
    }

    #[tokio::test]
    async fn a_row_listed_before_its_operation_s_last_commit_is_not_left_to_rest() {
        let (_dir, ops) = operations().await;
        let worker = worker(&ops);
        append(&ops, &stream("a"), 0, &[received("a").into()]).await;
        // Claimed by another worker after a look listed the operation as received.
        append(&ops, &stream("a"), 1, &[claimed("w2", 1)]).await;
        let id = received("a").operation_id.to_string();
        let step = |row: OperationStatusRow| {
            let worker = worker.clone();
            async move {
                let handle = load(&worker.inner.ops, &row.stream_id).await;
                worker
                    .step_carrying(&row, handle, None, false, None)
                    .await
                    .is_none()
            }
        };

        assert!(step(row(1)).await, "nothing to do on the stream as it is");
        assert!(
            worker.inner.take(&id),
            "not resting: the next look lists the row as it is now"
        );
        worker.inner.release(&id);

        assert!(step(row(2)).await);
        assert!(
            !worker.inner.take(&id),
            "a row as current as its stream with nothing to do rests, so the loop cannot spin"
        );
    }

    #[tokio::test]
    async fn a_reply_s_start_carries_the_previous_call_s_outcome_in_one_append() {
        let (_dir, ops) = operations().await;
        let worker = worker(&ops);
        append(&ops, &stream("a"), 0, &called("a", "w1")).await;
        let mut ended = called("b", "w1");
        let OperationCommand::Confirm(confirmed) = confirm() else {
            unreachable!("confirm() confirms")
        };
        ended.push(confirmed.into());
        append(&ops, &stream("b"), 0, &ended).await;
        let carry = Pending::new(ops.load(stream("a")).await.unwrap(), confirm());
        let appends = || ops.store().append_timings().wait().count();
        let before = appends();

        let handle = load(&ops, &stream("b").to_string()).await;
        let listed = row_of("b", 4, "confirmed");
        assert!(
            worker
                .step_carrying(&listed, handle, Some(carry), false, None)
                .await
                .is_none()
        );

        let a = ops.load(stream("a")).await.unwrap();
        let b = ops.load(stream("b")).await.unwrap();
        assert_eq!(
            a.state().status,
            Status::Confirmed,
            "the outcome is recorded"
        );
        assert_ne!(b.state().reply, ReplyStatus::NotStarted, "the reply went");
        assert_eq!(
            appends() - before,
            2,
            "the reply's start with the outcome, then the reply's own outcome"
        );
    }

    #[tokio::test]
    async fn a_queued_row_s_stream_is_read_as_it_is_queued() {
        let (_dir, ops) = operations().await;
        append(&ops, &stream("a"), 0, &[received("a").into()]).await;
        let queued = Queued::start(&ops, row(1));
        let handle = queued.loading.await.unwrap().unwrap();
        assert_eq!(handle.state().version, 1);
        assert_eq!(handle.received().business_key, "a");
    }

    #[tokio::test]
    async fn a_read_older_than_its_row_is_done_again_and_one_as_new_is_kept() {
        let (_dir, ops) = operations().await;
        append(&ops, &stream("a"), 0, &[received("a").into()]).await;
        let early = load(&ops, &stream("a").to_string()).await.unwrap();
        // Another worker claims the operation after the read and before the task takes it up.
        append(&ops, &stream("a"), 1, &[claimed("w2", 1)]).await;

        let given = early.clone();
        let listed_after = loaded(&ops, &row(2), tokio::spawn(async move { Ok(given) }))
            .await
            .unwrap();
        assert_eq!(listed_after.state().version, 2, "read again");
        assert_eq!(listed_after.state().claim.as_ref().unwrap().worker, "w2");

        let listed_before = loaded(&ops, &row(1), tokio::spawn(async move { Ok(early) }))
            .await
            .unwrap();
        assert_eq!(
            listed_before.state().version,
            1,
            "kept: the commit's version check and the decision on the fresh state handle it"
        );
    }
}
