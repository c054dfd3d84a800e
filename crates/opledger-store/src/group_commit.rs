//! Group commit: one appender task per store collects concurrent append calls and commits them in
//! one transaction, then answers every caller with its own result.
//!
//! Serialized appends with durable commits make the commit (an fsync) the bottleneck; batching
//! pays for it once per batch instead of once per call. No artificial delay is needed: while one
//! batch commits, the next one fills up. `max_wait` can add a delay for very bursty loads.
//!
//! On PostgreSQL the appender runs on a thread of its own, with a single-threaded runtime (ADR
//! 0022): every append waits for the batch before it, so the moment between one batch's answer
//! and the next batch's send is on every caller's path. On the service's runtime that moment
//! waited for a worker thread busy with HTTP, and the writer's socket was polled by whichever
//! thread got round to it; on its own thread the answer wakes the appender at once.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tracing::Instrument;

use crate::batch;
use crate::error::StoreError;
use crate::model::{AppendRequest, Appended, Position};
use crate::priority::Priority;
use crate::store::HeadWatch;
use crate::timings::AppendTimings;

/// Limits of one group-commit batch.
#[derive(Clone, Debug)]
pub struct GroupCommitOptions {
    /// Most append calls in one transaction.
    pub max_batch_calls: usize,
    /// Most events in one transaction; also the most events one call may hold.
    pub max_batch_events: usize,
    /// How long the appender waits for more calls after the first one of a batch arrived.
    /// Zero (the default) adds no latency: batches form while the previous one commits.
    pub max_wait: Duration,
    /// Calls that may wait in the queue before callers are slowed down (back-pressure).
    pub queue_capacity: usize,
}

impl Default for GroupCommitOptions {
    fn default() -> Self {
        Self {
            max_batch_calls: 512,
            max_batch_events: 10_000,
            max_wait: Duration::ZERO,
            queue_capacity: 4096,
        }
    }
}

/// What one committed batch answers: one result per call, and the new head position if the
/// batch wrote anything.
#[derive(Debug)]
pub(crate) struct BatchOutcome {
    pub(crate) results: Vec<Result<Appended, StoreError>>,
    pub(crate) head: Option<Position>,
}

/// What a backend provides to the appender: writing one batch in one transaction.
pub(crate) trait BatchWriter: Send + 'static {
    /// Writes the accepted calls of `calls` in one transaction. `Ok` holds one result per call
    /// (a conflict fails only its own call); `Err` means nothing was written, for anyone.
    fn write(
        &mut self,
        calls: &[Vec<AppendRequest>],
    ) -> impl Future<Output = Result<BatchOutcome, StoreError>> + Send;

    /// Upkeep between batches, after the last one's callers were answered (SQLite finishes a
    /// checkpoint here when asked to). Nothing by default.
    fn between_batches(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Releases the writer's connection.
    fn close(self) -> impl Future<Output = ()> + Send;
}

enum Message {
    Append {
        requests: Vec<AppendRequest>,
        reply: oneshot::Sender<Result<Appended, StoreError>>,
        /// When the call was queued ([`AppendTimings`]).
        queued: std::time::Instant,
    },
    Close {
        done: oneshot::Sender<()>,
    },
}

/// The callers' side of the appender task. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Appender {
    queue: mpsc::Sender<Message>,
    head: watch::Receiver<Position>,
    max_events: usize,
    priority: Priority,
    timings: Arc<AppendTimings>,
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Message::Append { requests, .. } => write!(f, "Append({} requests)", requests.len()),
            Message::Close { .. } => f.write_str("Close"),
        }
    }
}

impl Appender {
    /// Starts the appender as a task on the current tokio runtime (the SQLite writer: its
    /// connection runs on sqlx's own thread, so the appender only hands work over and waits;
    /// a thread of its own measured slower, ADR 0022).
    ///
    /// `head` carries the last committed position this process knows of; the appender advances
    /// it after each commit (other tasks, such as a PostgreSQL listener, may advance it too).
    pub(crate) fn spawn<W: BatchWriter>(
        writer: W,
        head: watch::Sender<Position>,
        options: GroupCommitOptions,
    ) -> Self {
        let (appender, run) = Self::new(writer, head, options);
        tokio::spawn(run);
        appender
    }

    /// Starts the appender on a thread of its own (`opledger-appender`), with a single-threaded
    /// runtime that lives as long as the appender: until [`Appender::close`], or until every
    /// handle is dropped (the PostgreSQL writer, ADR 0022). A writer whose I/O waits on a
    /// runtime's reactor (a socket) must open its connection there, on its first batch, not
    /// before. `head` as for [`Appender::spawn`].
    ///
    /// Fails only if the thread or its runtime cannot be made (the process is out of threads or
    /// file descriptors).
    pub(crate) fn spawn_on_own_thread<W: BatchWriter>(
        writer: W,
        head: watch::Sender<Position>,
        options: GroupCommitOptions,
    ) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        // The caller's subscriber, which may be a test's or an embedder's scoped one.
        let dispatch = tracing::dispatcher::get_default(Clone::clone);
        let (appender, run) = Self::new(writer, head, options);
        std::thread::Builder::new()
            .name("opledger-appender".to_owned())
            .spawn(move || {
                tracing::dispatcher::with_default(&dispatch, || runtime.block_on(run));
            })?;
        Ok(appender)
    }

    /// The handle, and the appender's loop to run wherever it runs.
    fn new<W: BatchWriter>(
        writer: W,
        head: watch::Sender<Position>,
        options: GroupCommitOptions,
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let (queue, receiver) = mpsc::channel(options.queue_capacity.max(1));
        let max_events = options.max_batch_events;
        let head_receiver = head.subscribe();
        let timings = Arc::new(AppendTimings::default());
        let run = run(writer, receiver, head, options, Arc::clone(&timings))
            .instrument(tracing::info_span!("appender"));
        let appender = Self {
            queue,
            head: head_receiver,
            max_events,
            priority: Priority::default(),
            timings,
        };
        (appender, run)
    }

    pub(crate) async fn append(
        &self,
        requests: Vec<AppendRequest>,
    ) -> Result<Appended, StoreError> {
        batch::validate(&requests, self.max_events)?;
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Message::Append {
                requests,
                reply,
                queued: std::time::Instant::now(),
            })
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    pub(crate) fn subscribe(&self) -> HeadWatch {
        HeadWatch::new(self.head.clone())
    }

    /// The priority of this process's foreground work over its background work on the store.
    pub(crate) fn priority(&self) -> &Priority {
        &self.priority
    }

    /// Where this store's appends spent their time in this process.
    pub(crate) fn timings(&self) -> &AppendTimings {
        &self.timings
    }

    /// Commits every call queued before this one, then stops the task and releases its
    /// connection. Later appends fail with [`StoreError::Closed`].
    pub(crate) async fn close(&self) {
        let (done, finished) = oneshot::channel();
        if self.queue.send(Message::Close { done }).await.is_ok() {
            let _ = finished.await;
        }
    }
}

/// Moves the known head forward to `position` (never back), waking subscribers if it moved.
pub(crate) fn advance(head: &watch::Sender<Position>, position: Position) {
    head.send_if_modified(|known| {
        let advanced = position > *known;
        if advanced {
            *known = position;
        }
        advanced
    });
}

/// The batch being formed: its calls, and for each call its caller's reply and when it was
/// queued.
#[derive(Default)]
struct Batch {
    calls: Vec<Vec<AppendRequest>>,
    replies: Vec<oneshot::Sender<Result<Appended, StoreError>>>,
    queued: Vec<std::time::Instant>,
}

/// Adds one queued message to the batch being formed; returns how many events it added.
fn take(message: Message, batch: &mut Batch, closing: &mut Option<oneshot::Sender<()>>) -> usize {
    match message {
        Message::Append {
            requests,
            reply,
            queued,
        } => {
            let events = requests.iter().map(|r| r.events.len()).sum();
            batch.calls.push(requests);
            batch.replies.push(reply);
            batch.queued.push(queued);
            events
        }
        Message::Close { done } => {
            *closing = Some(done);
            0
        }
    }
}

async fn run<W: BatchWriter>(
    mut writer: W,
    mut queue: mpsc::Receiver<Message>,
    head: watch::Sender<Position>,
    options: GroupCommitOptions,
    timings: Arc<AppendTimings>,
) {
    let mut batch = Batch::default();
    let mut closing = None;
    while closing.is_none() {
        let Some(first) = queue.recv().await else {
            break;
        };
        let mut events = take(first, &mut batch, &mut closing);
        let deadline = tokio::time::Instant::now() + options.max_wait;
        while closing.is_none()
            && batch.calls.len() < options.max_batch_calls
            && events < options.max_batch_events
        {
            let next = match queue.try_recv() {
                Ok(message) => Some(message),
                Err(_) if options.max_wait.is_zero() => None,
                Err(_) => tokio::time::timeout_at(deadline, queue.recv())
                    .await
                    .ok()
                    .flatten(),
            };
            match next {
                Some(message) => events += take(message, &mut batch, &mut closing),
                None => break,
            }
        }
        if batch.calls.is_empty() {
            continue;
        }
        let began = std::time::Instant::now();
        let written = writer.write(&batch.calls).await;
        timings.record_batch(batch.queued.drain(..), began, std::time::Instant::now());
        match written {
            Ok(BatchOutcome {
                results,
                head: new_head,
            }) => {
                if let Some(new_head) = new_head {
                    advance(&head, new_head);
                }
                for (reply, result) in batch.replies.drain(..).zip(results) {
                    // A caller that went away (its task was aborted) no longer needs the answer;
                    // its append committed or not as a whole either way.
                    let _ = reply.send(result);
                }
            }
            Err(error) => {
                tracing::warn!(%error, calls = batch.calls.len(), "append batch failed");
                for reply in batch.replies.drain(..) {
                    let _ = reply.send(Err(error.clone()));
                }
            }
        }
        batch.calls.clear();
        writer.between_batches().await;
    }
    queue.close();
    // Calls that raced with Close are answered, not dropped silently.
    while let Ok(message) = queue.try_recv() {
        if let Message::Append { reply, .. } = message {
            let _ = reply.send(Err(StoreError::Closed));
        }
    }
    writer.close().await;
    if let Some(done) = closing {
        let _ = done.send(());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc as sync;

    use super::*;
    use crate::model::{ExpectedVersion, NewEvent, StreamId};

    /// Answers every call as written, telling on which thread each batch ran and when the
    /// appender closed it.
    struct Recording {
        threads: sync::Sender<Option<String>>,
        closed: sync::Sender<()>,
    }

    impl BatchWriter for Recording {
        async fn write(
            &mut self,
            calls: &[Vec<AppendRequest>],
        ) -> Result<BatchOutcome, StoreError> {
            let thread = std::thread::current().name().map(str::to_owned);
            let _ = self.threads.send(thread);
            let written = || Appended {
                positions: 1..=1,
                streams: Vec::new(),
                recorded_at: chrono::Utc::now(),
            };
            Ok(BatchOutcome {
                results: calls.iter().map(|_| Ok(written())).collect(),
                head: Some(1),
            })
        }

        async fn close(self) {
            let _ = self.closed.send(());
        }
    }

    fn recording() -> (
        Recording,
        sync::Receiver<Option<String>>,
        sync::Receiver<()>,
    ) {
        let (threads, ran_on) = sync::channel();
        let (closed, was_closed) = sync::channel();
        (Recording { threads, closed }, ran_on, was_closed)
    }

    fn one_event() -> Vec<AppendRequest> {
        let payload = serde_json::value::to_raw_value(&serde_json::json!({})).expect("json");
        vec![AppendRequest::new(
            StreamId::new("op-coupon-1").expect("a stream id"),
            ExpectedVersion::Any,
            vec![NewEvent::new("Received", 1, payload)],
        )]
    }

    const PATIENCE: Duration = Duration::from_secs(5);

    /// On a thread of its own, batches run on `opledger-appender` whatever runtime the caller
    /// is on, callers get their answers, and the last handle dropped stops it (its writer
    /// closed), with no `close` call.
    #[tokio::test]
    async fn an_appender_on_its_own_thread_writes_there_and_stops_with_its_last_handle() {
        let (writer, ran_on, closed) = recording();
        let (head, _) = watch::channel(0);
        let appender = Appender::spawn_on_own_thread(writer, head, GroupCommitOptions::default())
            .expect("an appender thread");
        let appended = appender.append(one_event()).await.expect("appended");
        assert_eq!(appended.positions, 1..=1);
        assert_eq!(
            ran_on.recv_timeout(PATIENCE).expect("a batch"),
            Some("opledger-appender".to_owned())
        );
        let handle = appender.clone();
        drop(appender);
        handle
            .append(one_event())
            .await
            .expect("a clone still appends");
        drop(handle);
        closed
            .recv_timeout(PATIENCE)
            .expect("the writer is closed once every handle is gone");
    }

    /// As a task, batches run on the caller's runtime (here the test's one thread).
    #[tokio::test]
    async fn an_appender_task_writes_on_the_callers_runtime() {
        let (writer, ran_on, closed) = recording();
        let (head, _) = watch::channel(0);
        let appender = Appender::spawn(writer, head, GroupCommitOptions::default());
        appender.append(one_event()).await.expect("appended");
        let test_thread = std::thread::current().name().map(str::to_owned);
        assert_eq!(ran_on.recv_timeout(PATIENCE).expect("a batch"), test_thread);
        appender.close().await;
        closed.try_recv().expect("closed by close");
    }
}
