//! The worker's handle on one operation, and the small pure decisions staged on it.
//!
//! [`View`] is what the worker folds from an operation's stream (its state, the `Received` that
//! started it, how it ended): a [`StreamState`], so the unit of work loads it, holds it and
//! decides on it again after a lost race. [`Handle`] is a view of a stream known to hold an
//! operation. [`Operations`] is the worker's side of the ledger: it loads handles and commits
//! decisions on them through the unit of work, with this worker as their cause. Every commit
//! of the worker, its replies and reconciliation goes through [`Ledger::unit_of_work`].

use std::convert::Infallible;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use opledger_domain::operation::{
    OperationCommand, OperationEvent, Received, TransitionRejected, decide, evolve,
};
use opledger_domain::{Causation, EventMetadata, Operation, Rejection, delivery_stream};
use opledger_ledger::{
    Changes, Clock, Ledger, LoadError, Snapshot, StreamState, Undecided, UnitError, UnitOfWork,
};
use opledger_store::{AnyStore, StreamId, StreamVersion};

/// What the worker folds from an operation's stream: more than the aggregate keeps, because the
/// call needs the request and the reply needs how the operation ended.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// The operation's state, as the domain decides on it.
    pub state: Operation,
    /// The request that started the operation (`None` until the stream holds one).
    pub received: Option<Arc<Received>>,
    /// The last terminal event, for the reply.
    pub ending: Option<Arc<OperationEvent>>,
}

impl StreamState for View {
    type Event = OperationEvent;

    fn apply(mut self, event: &OperationEvent) -> Self {
        match event {
            OperationEvent::Received(r) if self.received.is_none() => {
                self.received = Some(Arc::new(r.clone()));
            }
            event if ends(event) => self.ending = Some(Arc::new(event.clone())),
            _ => {}
        }
        self.state = evolve(self.state, event);
        self
    }

    fn version(&self) -> StreamVersion {
        self.state.version
    }
}

/// One operation as the worker holds it between commits: its stream and what its last read or
/// commit left, known to start with `Received`.
#[derive(Debug, Clone)]
pub(crate) struct Handle {
    stream: StreamId,
    view: View,
    received: Arc<Received>,
}

impl Handle {
    /// The handle on `stream`, whose events folded into `view`.
    pub(crate) fn new(stream: StreamId, view: View) -> Result<Self, StepError> {
        let received = view
            .received
            .clone()
            .ok_or_else(|| StepError::NotAnOperation(stream.to_string()))?;
        Ok(Handle {
            stream,
            view,
            received,
        })
    }

    pub(crate) fn stream(&self) -> &StreamId {
        &self.stream
    }

    pub(crate) fn view(&self) -> &View {
        &self.view
    }

    pub(crate) fn state(&self) -> &Operation {
        &self.view.state
    }

    /// The request that started the operation.
    pub(crate) fn received(&self) -> &Received {
        &self.received
    }

    /// The last terminal event, for the reply.
    pub(crate) fn ending(&self) -> Option<&OperationEvent> {
        self.view.ending.as_deref()
    }

    /// Takes in what a commit on the handle's stream left.
    pub(crate) fn advance(&mut self, view: View) {
        self.view = view;
    }
}

/// Why one step on one operation did not complete; the operation stays due and is looked at
/// again.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StepError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Commit(#[from] UnitError<Infallible>),
    #[error(
        "operation stream `{0}` does not start with Received; the ledger is not one this worker can act on"
    )]
    NotAnOperation(String),
    #[error("invalid stream id: {0}")]
    StreamId(#[from] opledger_store::InvalidRequest),
}

/// What became of commands committed on a handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Applied {
    /// Committed (or nothing was to commit); the handle moved on.
    Done,
    /// Not taken: the domain refused on the latest state, or the state the step was planned on
    /// is gone (another writer moved the operation).
    Declined,
}

/// The worker's side of the ledger: handles loaded, and decisions on them committed through
/// the unit of work, caused by this worker. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Operations {
    ledger: Ledger,
    worker: String,
    clock: Arc<dyn Clock>,
}

impl Operations {
    pub(crate) fn new(store: AnyStore, worker: String, clock: Arc<dyn Clock>) -> Self {
        Operations {
            ledger: Ledger::new(store),
            worker,
            clock,
        }
    }

    pub(crate) fn store(&self) -> &AnyStore {
        self.ledger.store()
    }

    /// This worker's id.
    pub(crate) fn worker(&self) -> &str {
        &self.worker
    }

    pub(crate) fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    /// A unit of work on the ledger, for decisions over more than one handle.
    pub(crate) fn unit_of_work(&self) -> UnitOfWork<'_> {
        self.ledger.unit_of_work()
    }

    /// Reads an operation's stream (one read).
    pub(crate) async fn load(&self, stream: StreamId) -> Result<Handle, StepError> {
        let view = self.ledger.load::<View>(&stream).await?;
        Handle::new(stream, view)
    }

    /// The metadata of this worker's events on an operation: caused by this worker, correlated
    /// with the update that started the operation.
    pub(crate) fn metadata(&self, handle: &Handle) -> EventMetadata {
        metadata(&self.worker, handle.received())
    }

    /// Decides `commands` on the handle's state and commits them, reading nothing first. After
    /// a lost race they are decided again on the fresh state, if `still` holds there (the part
    /// of the state the step was planned on is unchanged), else declined.
    pub(crate) async fn commit(
        &self,
        handle: &mut Handle,
        commands: &[OperationCommand],
        still: impl Fn(&Operation) -> bool,
    ) -> Result<Applied, StepError> {
        let now = self.now();
        let metadata = self.metadata(handle);
        let stream = handle.stream.clone();
        let committed = self
            .ledger
            .unit_of_work()
            .knowing(stream.clone(), handle.view.clone())
            .run(|snapshot, changes| {
                decide_commands(snapshot, changes, &stream, commands, &still, now, &metadata)
            })
            .await?;
        Ok(match committed.value {
            Some(view) => {
                handle.advance(view);
                Applied::Done
            }
            None => Applied::Declined,
        })
    }
}

/// The metadata of `worker`'s events on the operation `received` started.
pub fn metadata(worker: &str, received: &Received) -> EventMetadata {
    EventMetadata {
        causation: Causation::Worker {
            worker: worker.to_owned(),
        },
        correlation: delivery_stream(&received.bot, received.update_id).ok(),
    }
}

/// Decides `commands` one after the other from `view`: their events and the view after them;
/// refused as a whole if any is refused.
pub fn decide_all(
    view: &View,
    commands: &[OperationCommand],
    now: DateTime<Utc>,
) -> Result<(Vec<OperationEvent>, View), Rejection> {
    let mut view = view.clone();
    let mut events = Vec::new();
    for command in commands {
        for event in decide(&view.state, command, now)? {
            view = view.apply(&event);
            events.push(event);
        }
    }
    Ok((events, view))
}

/// Stages `commands` on `stream`, decided on `view`: the view after them, or the domain's
/// refusal with nothing staged.
pub fn stage(
    changes: &mut Changes,
    stream: &StreamId,
    view: &View,
    commands: &[OperationCommand],
    now: DateTime<Utc>,
    metadata: &EventMetadata,
) -> Result<View, Rejection> {
    let (events, after) = decide_all(view, commands, now)?;
    changes.decided(stream, view, &events, metadata);
    Ok(after)
}

/// The decision of [`Operations::commit`]: `commands` on the stream's current view, if `still`
/// holds there; `None` when declined.
fn decide_commands(
    snapshot: &Snapshot,
    changes: &mut Changes,
    stream: &StreamId,
    commands: &[OperationCommand],
    still: &dyn Fn(&Operation) -> bool,
    now: DateTime<Utc>,
    metadata: &EventMetadata,
) -> Result<Option<View>, Undecided<Infallible>> {
    let view: View = snapshot.state(stream)?;
    if !still(&view.state) {
        return Ok(None);
    }
    Ok(stage(changes, stream, &view, commands, now, metadata).ok())
}

/// Stages a call's outcome on `view`. If the domain refuses it there (another worker moved the
/// operation after this one's lease ran out), stages instead a `TransitionRejected` recording
/// the refusal and the late outcome, for a person to see; returns that refusal.
pub fn stage_outcome(
    changes: &mut Changes,
    stream: &StreamId,
    view: &View,
    command: &OperationCommand,
    now: DateTime<Utc>,
    metadata: &EventMetadata,
) -> Option<Rejection> {
    match stage(
        changes,
        stream,
        view,
        std::slice::from_ref(command),
        now,
        metadata,
    ) {
        Ok(_) => None,
        Err(rejection) => {
            let record: OperationEvent = TransitionRejected {
                command: command.kind().as_str().to_owned(),
                status: view.state.status.as_str().to_owned(),
                reason: format!("{rejection}; the late outcome was: {}", describe(command)),
            }
            .into();
            changes.decided(stream, view, &[record], metadata);
            Some(rejection)
        }
    }
}

/// Whether `event` ends an operation (what its reply answers).
fn ends(event: &OperationEvent) -> bool {
    matches!(
        event,
        OperationEvent::Confirmed(_) | OperationEvent::Failed(_) | OperationEvent::Reconciled(_)
    )
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

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use chrono::TimeDelta;
    use opledger_domain::OperationId;
    use opledger_domain::ReplyStatus;
    use opledger_domain::operation::{
        Claimed, Confirmed, ConfirmedVia, ExternalCallSent, MarkedForReconciliation,
        ReplyRetryScheduled, ReplyStarted,
    };
    use opledger_store::{EventStore, ExpectedVersion};

    use super::*;

    pub(crate) fn now() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).expect("a time")
    }

    /// The request of a `coupon` operation on `business_key`.
    pub(crate) fn received(business_key: &str) -> Received {
        Received {
            operation_id: OperationId::new("coupon", business_key),
            action: "coupon".to_owned(),
            business_key: business_key.to_owned(),
            fingerprint: "f".to_owned(),
            params: BTreeMap::new(),
            bot: "shop".to_owned(),
            chat_id: Some(7),
            user_id: Some(7),
            update_id: 41,
            message_date: None,
            max_attempts: 3,
        }
    }

    pub(crate) fn stream(business_key: &str) -> StreamId {
        StreamId::new(
            opledger_domain::operation_stream("coupon", business_key).expect("a stream name"),
        )
        .expect("a stream id")
    }

    /// `worker`'s claim, live for a minute from [`now`].
    pub(crate) fn claimed(worker: &str, attempt: u32) -> OperationEvent {
        Claimed {
            worker: worker.to_owned(),
            lease_until: now() + TimeDelta::minutes(1),
            attempt,
        }
        .into()
    }

    /// Received, claimed by `worker` and the call recorded as sent.
    pub(crate) fn called(business_key: &str, worker: &str) -> Vec<OperationEvent> {
        let received = received(business_key);
        let sent = ExternalCallSent {
            worker: worker.to_owned(),
            attempt: 1,
            idempotency_key: received.operation_id.to_string(),
        };
        vec![received.into(), claimed(worker, 1), sent.into()]
    }

    /// A configuration with one bot, `shop` (its Bot API on a loopback port where nothing
    /// listens), and one action, `coupon`, with no effector.
    pub(crate) fn config() -> opledger_config::Config {
        opledger_config::Config::parse(
            "[[bots]]\nname = \"shop\"\ntoken_env = \"T\"\nwebhook_secret_env = \"S\"\n\
             api_base_url = \"http://127.0.0.1:9\"\n\
             [[actions]]\nname = \"coupon\"\nbot = \"shop\"\ncommand = \"coupon\"\nkey = \"{user_id}\"\n",
            &|name| Some(if name == "T" { "123456:test-token" } else { "secret" }.to_owned()),
        )
        .expect("config")
    }

    /// The worker `w1`'s side of a fresh SQLite ledger in a temporary directory, at [`now`].
    pub(crate) async fn operations() -> (tempfile::TempDir, Operations) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
        let store = AnyStore::open(&url, opledger_store::AnyOptions::default())
            .await
            .unwrap();
        let clock = Arc::new(opledger_ledger::ManualClock::new(now()));
        (dir, Operations::new(store, "w1".to_owned(), clock))
    }

    /// Appends `events` to `stream` at `version`, as another worker would.
    pub(crate) async fn append(
        ops: &Operations,
        stream: &StreamId,
        version: u64,
        events: &[OperationEvent],
    ) {
        let metadata = metadata("w2", &received("x"));
        let expected = opledger_ledger::expected(version);
        let request = opledger_ledger::request(stream.clone(), expected, events, &metadata);
        ops.store().append(vec![request.unwrap()]).await.unwrap();
    }

    pub(crate) fn confirm() -> OperationCommand {
        OperationCommand::Confirm(Confirmed {
            external_id: Some("x-1".to_owned()),
            result: BTreeMap::new(),
            response_digest: None,
            via: ConfirmedVia::Response,
        })
    }

    fn view_of(events: &[OperationEvent]) -> View {
        events.iter().fold(View::default(), View::apply)
    }

    fn metadata_of(business_key: &str) -> EventMetadata {
        metadata("w1", &received(business_key))
    }

    #[test]
    fn a_view_keeps_the_request_that_started_it_and_how_it_ended() {
        let mut events = called("a", "w1");
        let (confirmed, _) = decide_all(&view_of(&events), &[confirm()], now()).unwrap();
        events.extend(confirmed);
        let view = view_of(&events);
        assert_eq!(view.version(), 4);
        assert_eq!(view.received.as_deref(), Some(&received("a")));
        assert!(matches!(
            view.ending.as_deref(),
            Some(OperationEvent::Confirmed(_))
        ));
        let handle = Handle::new(stream("a"), view).unwrap();
        assert_eq!(handle.received(), &received("a"));
        assert!(matches!(
            Handle::new(stream("b"), View::default()),
            Err(StepError::NotAnOperation(_))
        ));
    }

    #[test]
    fn the_worker_s_events_are_caused_by_it_and_correlated_with_the_delivery() {
        let metadata = metadata_of("a");
        assert_eq!(
            metadata.causation,
            Causation::Worker {
                worker: "w1".to_owned()
            }
        );
        assert_eq!(
            metadata.correlation,
            Some(delivery_stream("shop", 41).unwrap())
        );
    }

    /// A confirmation staged as a call's outcome on operation `a` holding `events`.
    fn confirm_on(events: &[OperationEvent]) -> (Option<Rejection>, Changes) {
        let mut changes = Changes::default();
        let view = view_of(events);
        let refused = stage_outcome(
            &mut changes,
            &stream("a"),
            &view,
            &confirm(),
            now(),
            &metadata_of("a"),
        );
        (refused, changes)
    }

    #[test]
    fn an_outcome_is_staged_at_the_version_it_was_decided_on() {
        let (refused, changes) = confirm_on(&called("a", "w1"));
        assert!(refused.is_none());
        let (expected, events) = changes.staged::<OperationEvent>(&stream("a")).unwrap();
        assert_eq!(expected, ExpectedVersion::Exact(3));
        assert!(matches!(events.as_slice(), [OperationEvent::Confirmed(_)]));
    }

    #[test]
    fn a_late_outcome_the_domain_refuses_is_recorded_with_what_it_said() {
        // The sweep marked the operation for a person after this worker's lease ran out.
        let mut events = called("a", "w1");
        events.push(
            MarkedForReconciliation {
                reason: "swept".to_owned(),
                attempt: 1,
            }
            .into(),
        );
        let (refused, changes) = confirm_on(&events);
        let rejection = refused.expect("refused");
        assert_eq!(rejection, Rejection::NeedsReconciliation);
        let (expected, staged) = changes.staged::<OperationEvent>(&stream("a")).unwrap();
        assert_eq!(expected, ExpectedVersion::Exact(4));
        assert_eq!(
            staged,
            vec![OperationEvent::from(TransitionRejected {
                command: "confirm".to_owned(),
                status: "needs_reconciliation".to_owned(),
                reason: format!(
                    "{rejection}; the late outcome was: confirmed via Response, external id x-1"
                ),
            })]
        );
    }

    #[test]
    fn a_commit_decided_again_declines_when_the_state_it_was_planned_on_is_gone() {
        // A reply started as attempt 1; by the time its outcome is decided again, attempt 2 is
        // in flight (another worker's): attempt 1's outcome must not land on it.
        let mut events = view_events_with_reply("a", 2);
        let snapshot = Snapshot::new().given::<View>(stream("a"), &events);
        let planned = ReplyStatus::InFlight { attempt: 1 };
        let unknown = OperationCommand::RecordReplyUnknown {
            reason: "stopped".to_owned(),
        };
        let mut changes = Changes::default();
        let decided = decide_commands(
            &snapshot,
            &mut changes,
            &stream("a"),
            std::slice::from_ref(&unknown),
            &|state| state.reply == planned,
            now(),
            &metadata_of("a"),
        )
        .unwrap();
        assert!(decided.is_none());
        assert!(changes.is_empty());

        // While attempt 1 is still the one in flight, it is decided and staged.
        events.truncate(events.len() - 2);
        let snapshot = Snapshot::new().given::<View>(stream("a"), &events);
        let decided = decide_commands(
            &snapshot,
            &mut changes,
            &stream("a"),
            &[unknown],
            &|state| state.reply == planned,
            now(),
            &metadata_of("a"),
        )
        .unwrap();
        assert_eq!(
            decided.map(|view| view.state.reply),
            Some(ReplyStatus::Unknown)
        );
        assert_eq!(changes.streams(), vec![&stream("a")]);
    }

    #[test]
    fn a_commit_the_domain_refuses_declines_and_stages_nothing() {
        // Another worker's live claim: a claim decided on it is refused.
        let mut events = vec![received("a").into()];
        events.push(claimed("w2", 1));
        let snapshot = Snapshot::new().given::<View>(stream("a"), &events);
        let claim = OperationCommand::Claim {
            worker: "w1".to_owned(),
            lease_until: now() + TimeDelta::minutes(1),
        };
        let mut changes = Changes::default();
        let decided = decide_commands(
            &snapshot,
            &mut changes,
            &stream("a"),
            &[claim],
            &|_| true,
            now(),
            &metadata_of("a"),
        )
        .unwrap();
        assert!(decided.is_none());
        assert!(changes.is_empty());
    }

    /// A confirmed operation whose reply attempts up to `attempts` were started, each but the
    /// last refused for sure and due again; the last is in flight.
    fn view_events_with_reply(business_key: &str, attempts: u32) -> Vec<OperationEvent> {
        let mut events = called(business_key, "w1");
        let (confirmed, _) = decide_all(&view_of(&events), &[confirm()], now()).unwrap();
        events.extend(confirmed);
        events.push(ReplyStarted { attempt: 1 }.into());
        for attempt in 2..=attempts {
            events.push(
                ReplyRetryScheduled {
                    at: now(),
                    reason: "unreachable".to_owned(),
                }
                .into(),
            );
            events.push(ReplyStarted { attempt }.into());
        }
        events
    }
}
