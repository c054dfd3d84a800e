//! The unit of work: the one way to change aggregate state (ADR 0009).
//!
//! A decision is a pure, synchronous function of a [`Snapshot`] (the states of the streams it
//! asks for) that stages events on any number of streams in [`Changes`]. [`UnitOfWork::run`] is
//! its shell: it loads each stream the decision asks for, commits everything staged in one
//! atomic append at the versions the states were read at, and on a version conflict forgets what
//! it read and decides again on fresh states, under one [`RetryPolicy`]. What comes back is typed:
//! the decision's value, or [`UnitError`] (`Rejected` with the domain's own rejection,
//! `Contended`, `Store`, ...).
//!
//! Two starts keep what ADR 0006 and 0007 bought: [`UnitOfWork::assume_new`] lets the first
//! attempt take every stream it has not been told about as new (a new update costs no read: a
//! wrong guess fails atomically with a version conflict), and [`UnitOfWork::knowing`] hands in
//! states the caller already holds (a worker's operation after its last commit), so committing a
//! call's outcome together with the next claim reads nothing either.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;

use opledger_domain::{Aggregate, DecodeError, DomainEvent, EventMetadata};
use opledger_store::{
    AnyStore, AppendRequest, Appended, EventStore, ExpectedVersion, NewEvent, RecordedEvent,
    StoreError, StreamId, StreamVersion,
};

/// A state rebuilt from one stream's events: every aggregate, and views that fold more than an
/// aggregate keeps (the worker's operation handle keeps the request and how it ended).
pub trait StreamState: Default + Clone + Send + Sync + 'static {
    /// The events of the stream.
    type Event: DomainEvent;

    /// Applies one event.
    fn apply(self, event: &Self::Event) -> Self;

    /// How many events were applied: the version the next append expects.
    fn version(&self) -> StreamVersion;

    /// The expected version of an append decided on this state.
    fn expected(&self) -> ExpectedVersion {
        crate::ledger::expected(self.version())
    }
}

impl<A> StreamState for A
where
    A: Aggregate + Send + Sync + 'static,
{
    type Event = A::Event;

    fn apply(self, event: &A::Event) -> Self {
        Aggregate::evolve(self, event)
    }

    fn version(&self) -> StreamVersion {
        Aggregate::version(self)
    }
}

/// Rebuilds a state from a stream's recorded events.
pub fn replay<S: StreamState>(
    stream: &StreamId,
    recorded: &[RecordedEvent],
) -> Result<S, Unreadable> {
    recorded.iter().try_fold(S::default(), |state, event| {
        let event = S::Event::from_stored(&event.event_type, event.schema_version, &event.payload)
            .map_err(|source| Unreadable {
                stream: stream.to_string(),
                source,
            })?;
        Ok(state.apply(&event))
    })
}

/// A stream holds an event this build cannot read: its state cannot be known.
#[derive(Debug, thiserror::Error)]
#[error("stream `{stream}` holds an event this binary cannot read: {source}")]
pub struct Unreadable {
    pub stream: String,
    #[source]
    pub source: DecodeError,
}

type Loaded = Box<dyn Any + Send + Sync>;
type Loader = fn(&StreamId, &[RecordedEvent]) -> Result<Loaded, Unreadable>;

/// The decision asked for a stream the snapshot does not hold: the shell loads it and asks again.
pub struct Unread {
    stream: StreamId,
    type_id: TypeId,
    load: Loader,
}

impl Unread {
    fn of<S: StreamState>(stream: &StreamId) -> Self {
        Unread {
            stream: stream.clone(),
            type_id: TypeId::of::<S>(),
            load: |stream, recorded| Ok(Box::new(replay::<S>(stream, recorded)?)),
        }
    }

    /// The stream to read.
    pub fn stream(&self) -> &StreamId {
        &self.stream
    }
}

impl fmt::Debug for Unread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Unread")
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

/// What a decision sees of the ledger: the state of every stream it asks for.
///
/// A stream the snapshot does not hold answers [`Unread`] (the decision returns it with `?` and
/// is asked again once the stream is read), unless the snapshot assumes new streams: then it is
/// the state's default, at version 0.
#[derive(Default)]
pub struct Snapshot {
    assume_new: bool,
    states: HashMap<(StreamId, TypeId), Loaded>,
}

impl Snapshot {
    /// A snapshot that holds nothing and reads every stream asked for.
    pub fn new() -> Self {
        Snapshot::default()
    }

    /// A snapshot that takes every stream it holds nothing of as new (version 0).
    pub fn assuming_new() -> Self {
        Snapshot {
            assume_new: true,
            ..Snapshot::default()
        }
    }

    /// A snapshot that holds `state` for `stream`.
    pub fn with<S: StreamState>(mut self, stream: StreamId, state: S) -> Self {
        self.insert(stream, state);
        self
    }

    /// A snapshot that holds the state `events` rebuild for `stream` (a test's *given*).
    pub fn given<S: StreamState>(self, stream: StreamId, events: &[S::Event]) -> Self {
        let state = events.iter().fold(S::default(), S::apply);
        self.with(stream, state)
    }

    /// The state of `stream`, or [`Unread`] when it must be read first.
    pub fn state<S: StreamState>(&self, stream: &StreamId) -> Result<S, Unread> {
        match self.held(stream) {
            Some(state) => Ok(state),
            None if self.assume_new => Ok(S::default()),
            None => Err(Unread::of::<S>(stream)),
        }
    }

    /// The state of `stream` as read from the ledger, even on an attempt that assumes new
    /// streams: for a stream that is expected to exist already (a button's token is issued
    /// before anyone clicks it), where assuming it new would be a wrong guess every time.
    pub fn read<S: StreamState>(&self, stream: &StreamId) -> Result<S, Unread> {
        self.held(stream).ok_or_else(|| Unread::of::<S>(stream))
    }

    fn held<S: StreamState>(&self, stream: &StreamId) -> Option<S> {
        let state = self.states.get(&(stream.clone(), TypeId::of::<S>()))?;
        Some(
            state
                .downcast_ref::<S>()
                .expect("states are keyed by their type")
                .clone(),
        )
    }

    fn insert<S: StreamState>(&mut self, stream: StreamId, state: S) {
        self.states
            .insert((stream, TypeId::of::<S>()), Box::new(state));
    }

    /// Forgets every state and stops assuming: after a conflict, everything is read afresh.
    fn forget(&mut self) {
        self.states.clear();
        self.assume_new = false;
    }
}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Snapshot")
            .field("assume_new", &self.assume_new)
            .field(
                "streams",
                &self.states.keys().map(|(s, _)| s).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// The events a decision staged, per stream, to be committed in one atomic append.
#[derive(Debug, Default)]
pub struct Changes {
    requests: Vec<AppendRequest>,
    /// The first event that could not be encoded; the unit of work reports it instead of
    /// committing.
    unencodable: Option<serde_json::Error>,
}

impl Changes {
    /// Stages `events` on `stream`, decided on `state`: the append expects the stream still at
    /// the state's version. Nothing is staged for no events.
    pub fn decided<S: StreamState>(
        &mut self,
        stream: &StreamId,
        state: &S,
        events: &[S::Event],
        metadata: &EventMetadata,
    ) {
        self.append(stream, state.expected(), events, metadata);
    }

    /// Stages `events` on `stream` at any version: a note that depends on nothing but what
    /// no later event can change (a duplicate delivery, a refused click on a used token), so
    /// that notes never race each other.
    pub fn note<E: DomainEvent>(
        &mut self,
        stream: &StreamId,
        events: &[E],
        metadata: &EventMetadata,
    ) {
        self.append(stream, ExpectedVersion::Any, events, metadata);
    }

    /// Stages `events` on `stream` at `expected`.
    pub fn append<E: DomainEvent>(
        &mut self,
        stream: &StreamId,
        expected: ExpectedVersion,
        events: &[E],
        metadata: &EventMetadata,
    ) {
        if events.is_empty() {
            return;
        }
        match crate::ledger::encode(stream.clone(), expected, events, metadata) {
            Ok(request) => self.requests.push(request),
            Err(error) => {
                self.unencodable.get_or_insert(error);
            }
        }
    }

    /// Writes the attachment `name` of `stream` with the events staged on it (staged before):
    /// bytes kept beside the history, durable exactly when those events are (ADR 0012).
    pub fn attach(&mut self, stream: &StreamId, name: impl Into<String>, body: Vec<u8>) {
        if let Some(request) = self.requests.iter_mut().rev().find(|r| &r.stream == stream) {
            request.attach.push(opledger_store::Attachment {
                name: name.into(),
                body,
            });
        }
    }

    /// Deletes the attachment `name` of `stream` with the events staged on it (staged before).
    pub fn detach(&mut self, stream: &StreamId, name: impl Into<String>) {
        if let Some(request) = self.requests.iter_mut().rev().find(|r| &r.stream == stream) {
            request.detach.push(name.into());
        }
    }

    /// Stages everything `later` staged, after what is staged here: a decision that must stage
    /// a stream first although it decides it last (a delivery records the operation its update
    /// started) stages the rest on its own `Changes` and adds them.
    pub fn extend(&mut self, later: Changes) {
        self.requests.extend(later.requests);
        if let Some(error) = later.unencodable {
            self.unencodable.get_or_insert(error);
        }
    }

    /// Whether nothing is staged.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// What is staged, in the order it was staged.
    pub fn requests(&self) -> &[AppendRequest] {
        &self.requests
    }

    /// What is staged, in order, for a caller that commits many decisions in one bigger append
    /// of its own (the rebuild benchmark's generator); or the first event that could not be
    /// encoded. Everything else commits through [`UnitOfWork::run`].
    pub fn into_requests(self) -> Result<Vec<AppendRequest>, serde_json::Error> {
        match self.unencodable {
            Some(error) => Err(error),
            None => Ok(self.requests),
        }
    }

    /// The staged events of `stream` decoded as `E`, with the expected version they were staged
    /// at (a test's *then*).
    pub fn staged<E: DomainEvent>(&self, stream: &StreamId) -> Option<(ExpectedVersion, Vec<E>)> {
        let request = self.requests.iter().find(|r| &r.stream == stream)?;
        let events = request
            .events
            .iter()
            .map(|e: &NewEvent| {
                E::from_stored(&e.event_type, e.schema_version, e.payload.get().as_bytes())
                    .expect("staged events decode as the type they were staged as")
            })
            .collect();
        Some((request.expected, events))
    }

    /// The streams staged, in order.
    pub fn streams(&self) -> Vec<&StreamId> {
        self.requests.iter().map(|r| &r.stream).collect()
    }
}

/// Why a decision could not be made on the snapshot it was given.
#[derive(Debug)]
pub enum Undecided<R> {
    /// It needs a stream the snapshot does not hold.
    Unread(Unread),
    /// The domain refused: nothing is committed and the unit of work ends with this rejection.
    Rejected(R),
}

impl<R> From<Unread> for Undecided<R> {
    fn from(unread: Unread) -> Self {
        Undecided::Unread(unread)
    }
}

/// How often a unit of work decides again after losing a race for a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Commit attempts at most, the first included.
    pub max_attempts: usize,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        // Races are lost to other deciders of the same streams (a repeated update, a second
        // worker); each attempt reads what they wrote, so a handful settles any real contention.
        RetryPolicy { max_attempts: 8 }
    }
}

/// A unit of work that committed (or had nothing to commit).
#[derive(Debug)]
pub struct Committed<T> {
    /// What the decision returned on the attempt that committed.
    pub value: T,
    /// What the store wrote; `None` when the decision staged nothing.
    pub appended: Option<Appended>,
    /// Commit attempts made (0 when nothing was staged).
    pub attempts: usize,
}

/// Why a unit of work committed nothing (except as [`UnitError::Store`] says).
#[derive(Debug, thiserror::Error)]
pub enum UnitError<R> {
    /// The domain refused on the latest states; nothing was committed.
    #[error("refused: {0}")]
    Rejected(R),
    /// Every attempt lost a race for one of its streams; nothing was committed: try again later.
    #[error("the streams kept changing under the decision ({attempts} attempts); try again later")]
    Contended { attempts: usize },
    /// The store failed; its message says whether anything may have been written and what to do.
    #[error(transparent)]
    Store(StoreError),
    /// A stream the decision needs holds an event this build cannot read.
    #[error(transparent)]
    Unreadable(Unreadable),
    /// A decided event could not be encoded: a bug.
    #[error("a decided event could not be encoded: {0}")]
    Encode(serde_json::Error),
}

impl<R> UnitError<R> {
    /// Whether it is the storage's fault or contention (try again later), not a refusal or a bug.
    pub fn is_transient(&self) -> bool {
        match self {
            UnitError::Contended { .. } => true,
            UnitError::Store(error) => !matches!(error, StoreError::InvalidRequest(_)),
            _ => false,
        }
    }

    /// The same error with the rejection mapped.
    pub fn map_rejection<S>(self, f: impl FnOnce(R) -> S) -> UnitError<S> {
        match self {
            UnitError::Rejected(r) => UnitError::Rejected(f(r)),
            UnitError::Contended { attempts } => UnitError::Contended { attempts },
            UnitError::Store(e) => UnitError::Store(e),
            UnitError::Unreadable(e) => UnitError::Unreadable(e),
            UnitError::Encode(e) => UnitError::Encode(e),
        }
    }
}

/// The ledger as deciders see it: the store and the one retry policy. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Ledger {
    store: AnyStore,
    retry: RetryPolicy,
}

impl Ledger {
    /// The ledger on `store`, with the default retry policy.
    pub fn new(store: AnyStore) -> Self {
        Ledger {
            store,
            retry: RetryPolicy::default(),
        }
    }

    /// The same ledger with another retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The store underneath, for reads.
    pub fn store(&self) -> &AnyStore {
        &self.store
    }

    /// A unit of work that reads every stream its decision asks for.
    pub fn unit_of_work(&self) -> UnitOfWork<'_> {
        UnitOfWork {
            ledger: self,
            snapshot: Snapshot::new(),
        }
    }

    /// Replays `stream` into `S`, for readers that decide nothing.
    pub async fn load<S: StreamState>(&self, stream: &StreamId) -> Result<S, LoadError> {
        let recorded = self.store.read_stream(stream, 1, usize::MAX).await?;
        Ok(replay(stream, &recorded)?)
    }
}

/// Why a stream could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Unreadable(#[from] Unreadable),
}

/// One decision, decided and committed; see the module documentation.
#[derive(Debug)]
pub struct UnitOfWork<'l> {
    ledger: &'l Ledger,
    snapshot: Snapshot,
}

impl UnitOfWork<'_> {
    /// On the first attempt, takes every stream not handed in with [`UnitOfWork::knowing`] as
    /// new, reading nothing; a wrong guess costs one version conflict and a second attempt.
    pub fn assume_new(mut self) -> Self {
        self.snapshot.assume_new = true;
        self
    }

    /// Hands in a state the caller holds for `stream` (what its own last commit left), used on
    /// the first attempt instead of a read.
    pub fn knowing<S: StreamState>(mut self, stream: StreamId, state: S) -> Self {
        self.snapshot.insert(stream, state);
        self
    }

    /// Decides with `decide` and commits what it staged; on a version conflict, reads every
    /// stream again and decides again, up to the ledger's retry policy.
    pub async fn run<T, R>(
        mut self,
        mut decide: impl FnMut(&Snapshot, &mut Changes) -> Result<T, Undecided<R>>,
    ) -> Result<Committed<T>, UnitError<R>> {
        let store = &self.ledger.store;
        let max_attempts = self.ledger.retry.max_attempts.max(1);
        let mut attempts = 0;
        loop {
            let mut changes = Changes::default();
            let value = match decide(&self.snapshot, &mut changes) {
                Ok(value) => value,
                Err(Undecided::Rejected(rejection)) => return Err(UnitError::Rejected(rejection)),
                Err(Undecided::Unread(unread)) => {
                    let recorded = store
                        .read_stream(&unread.stream, 1, usize::MAX)
                        .await
                        .map_err(UnitError::Store)?;
                    let state =
                        (unread.load)(&unread.stream, &recorded).map_err(UnitError::Unreadable)?;
                    self.snapshot
                        .states
                        .insert((unread.stream, unread.type_id), state);
                    continue;
                }
            };
            if let Some(error) = changes.unencodable {
                return Err(UnitError::Encode(error));
            }
            if changes.requests.is_empty() {
                return Ok(Committed {
                    value,
                    appended: None,
                    attempts,
                });
            }
            attempts += 1;
            match store.append(changes.requests).await {
                Ok(appended) => {
                    return Ok(Committed {
                        value,
                        appended: Some(appended),
                        attempts,
                    });
                }
                Err(StoreError::VersionConflict { .. }) if attempts < max_attempts => {
                    self.snapshot.forget();
                }
                Err(StoreError::VersionConflict { .. }) => {
                    return Err(UnitError::Contended { attempts });
                }
                Err(error) => return Err(UnitError::Store(error)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use opledger_domain::{Causation, DomainEvent};
    use opledger_store::{AnyOptions, EventStore};

    use super::*;

    /// A one-field event for a counter stream.
    #[derive(Debug, Clone, PartialEq)]
    struct Added(u64);

    impl DomainEvent for Added {
        const EVENT_TYPES: &'static [&'static str] = &["Added"];

        fn event_type(&self) -> &'static str {
            "Added"
        }

        fn schema_version(&self) -> u32 {
            1
        }

        fn to_payload(&self) -> serde_json::Result<Vec<u8>> {
            serde_json::to_vec(&self.0)
        }

        fn from_stored(_: &str, _: u32, payload: &[u8]) -> Result<Self, DecodeError> {
            serde_json::from_slice(payload)
                .map(Added)
                .map_err(|source| DecodeError::BadPayload {
                    event_type: "Added".to_owned(),
                    source,
                })
        }
    }

    #[derive(Debug, Clone, Default, PartialEq)]
    struct Counter {
        total: u64,
        version: u64,
    }

    impl StreamState for Counter {
        type Event = Added;

        fn apply(self, event: &Added) -> Self {
            Counter {
                total: self.total + event.0,
                version: self.version + 1,
            }
        }

        fn version(&self) -> StreamVersion {
            self.version
        }
    }

    /// Refused: the counter would pass its limit.
    #[derive(Debug, PartialEq)]
    struct OverLimit;

    fn metadata() -> EventMetadata {
        EventMetadata::caused_by(Causation::System {
            component: "test".to_owned(),
        })
    }

    fn stream(name: &str) -> StreamId {
        StreamId::new(format!("counter-{name}")).unwrap()
    }

    async fn ledger() -> (tempfile::TempDir, Ledger) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
        let store = AnyStore::open(&url, AnyOptions::default()).await.unwrap();
        (dir, Ledger::new(store))
    }

    /// Adds `by` to every stream, refusing past `limit`; counts its runs.
    fn add(
        streams: &[StreamId],
        by: u64,
        limit: u64,
        runs: &AtomicUsize,
    ) -> impl FnMut(&Snapshot, &mut Changes) -> Result<Vec<u64>, Undecided<OverLimit>> {
        move |snapshot, changes| {
            runs.fetch_add(1, Ordering::SeqCst);
            let mut totals = Vec::new();
            for stream in streams {
                let counter: Counter = snapshot.state(stream)?;
                if counter.total + by > limit {
                    return Err(Undecided::Rejected(OverLimit));
                }
                changes.decided(stream, &counter, &[Added(by)], &metadata());
                totals.push(counter.total + by);
            }
            Ok(totals)
        }
    }

    async fn total(ledger: &Ledger, stream: &StreamId) -> u64 {
        ledger.load::<Counter>(stream).await.unwrap().total
    }

    #[tokio::test]
    async fn a_decision_on_several_streams_commits_once_and_reads_each_stream_once() {
        let (_dir, ledger) = ledger().await;
        let (a, b) = (stream("a"), stream("b"));
        let runs = AtomicUsize::new(0);
        let committed = ledger
            .unit_of_work()
            .run(add(&[a.clone(), b.clone()], 2, 10, &runs))
            .await
            .unwrap();
        // Asked for a, then for b, then decided: three runs, one commit.
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        assert_eq!(committed.attempts, 1);
        assert_eq!(committed.value, vec![2, 2]);
        let appended = committed.appended.unwrap();
        assert_eq!(appended.positions, 1..=2);
        assert_eq!(total(&ledger, &a).await + total(&ledger, &b).await, 4);
    }

    #[tokio::test]
    async fn assuming_new_reads_nothing_and_a_wrong_guess_decides_again_on_what_is_there() {
        let (_dir, ledger) = ledger().await;
        let a = stream("a");
        let runs = AtomicUsize::new(0);
        ledger
            .unit_of_work()
            .assume_new()
            .run(add(std::slice::from_ref(&a), 3, 10, &runs))
            .await
            .unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 1, "a new stream costs no read");

        runs.store(0, Ordering::SeqCst);
        let committed = ledger
            .unit_of_work()
            .assume_new()
            .run(add(std::slice::from_ref(&a), 3, 10, &runs))
            .await
            .unwrap();
        // The guess lost (version conflict), the stream was read, the decision made again.
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        assert_eq!(committed.attempts, 2);
        assert_eq!(committed.value, vec![6]);
        assert_eq!(total(&ledger, &a).await, 6);
    }

    #[tokio::test]
    async fn a_state_handed_in_is_used_without_a_read_and_a_stale_one_is_read_again() {
        let (_dir, ledger) = ledger().await;
        let a = stream("a");
        let runs = AtomicUsize::new(0);
        let stale = Counter::default();
        ledger
            .unit_of_work()
            .knowing(a.clone(), stale.clone())
            .run(add(std::slice::from_ref(&a), 1, 10, &runs))
            .await
            .unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 1);

        runs.store(0, Ordering::SeqCst);
        let committed = ledger
            .unit_of_work()
            .knowing(a.clone(), stale)
            .run(add(std::slice::from_ref(&a), 1, 10, &runs))
            .await
            .unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        assert_eq!(committed.value, vec![2]);
    }

    #[tokio::test]
    async fn a_rejection_is_the_domains_own_and_commits_nothing_on_any_stream() {
        let (_dir, ledger) = ledger().await;
        let (a, b) = (stream("a"), stream("b"));
        let runs = AtomicUsize::new(0);
        ledger
            .unit_of_work()
            .run(add(std::slice::from_ref(&b), 9, 10, &runs))
            .await
            .unwrap();
        let head = ledger.store().head().await.unwrap();
        let error = ledger
            .unit_of_work()
            .run(add(&[a.clone(), b.clone()], 2, 10, &runs))
            .await
            .unwrap_err();
        assert!(matches!(error, UnitError::Rejected(OverLimit)));
        assert!(!error.is_transient());
        assert_eq!(ledger.store().head().await.unwrap(), head);
        assert_eq!(total(&ledger, &a).await, 0);
    }

    #[tokio::test]
    async fn a_conflict_on_one_stream_writes_neither_and_both_are_decided_again() {
        let (_dir, ledger) = ledger().await;
        let (a, b) = (stream("a"), stream("b"));
        let runs = AtomicUsize::new(0);
        ledger
            .unit_of_work()
            .run(add(std::slice::from_ref(&b), 5, 100, &runs))
            .await
            .unwrap();
        runs.store(0, Ordering::SeqCst);
        // Assumes both new; b is not, so the first attempt commits nothing on a either.
        let committed = ledger
            .unit_of_work()
            .assume_new()
            .run(add(&[a.clone(), b.clone()], 1, 100, &runs))
            .await
            .unwrap();
        assert_eq!(committed.attempts, 2);
        assert_eq!(committed.value, vec![1, 6]);
        let a_events = ledger.store().read_stream(&a, 1, 10).await.unwrap();
        assert_eq!(a_events.len(), 1, "the lost attempt wrote nothing on a");
    }

    #[tokio::test]
    async fn a_decision_that_keeps_losing_ends_contended_after_the_policy_s_attempts() {
        let (_dir, ledger) = ledger().await;
        let ledger = ledger.with_retry(RetryPolicy { max_attempts: 3 });
        let a = stream("a");
        let runs = AtomicUsize::new(0);
        ledger
            .unit_of_work()
            .run(add(std::slice::from_ref(&a), 1, 10, &runs))
            .await
            .unwrap();
        // A decision that always expects the stream to be new (it ignores what it read).
        let error = ledger
            .unit_of_work()
            .run(|_, changes| -> Result<(), Undecided<OverLimit>> {
                changes.append(&a, ExpectedVersion::NoStream, &[Added(1)], &metadata());
                Ok(())
            })
            .await
            .unwrap_err();
        assert!(matches!(error, UnitError::Contended { attempts: 3 }));
        assert!(error.is_transient());
    }

    #[tokio::test]
    async fn nothing_staged_commits_nothing() {
        let (_dir, ledger) = ledger().await;
        let committed = ledger
            .unit_of_work()
            .run(|_, _| -> Result<u8, Undecided<OverLimit>> { Ok(7) })
            .await
            .unwrap();
        assert_eq!(committed.value, 7);
        assert!(committed.appended.is_none());
        assert_eq!(committed.attempts, 0);
        assert_eq!(ledger.store().head().await.unwrap().position, 0);
    }

    #[tokio::test]
    async fn a_stream_read_is_read_even_on_an_attempt_that_assumes_new_streams() {
        let (_dir, ledger) = ledger().await;
        let (a, b) = (stream("a"), stream("b"));
        let runs = AtomicUsize::new(0);
        ledger
            .unit_of_work()
            .run(add(std::slice::from_ref(&a), 4, 10, &runs))
            .await
            .unwrap();
        runs.store(0, Ordering::SeqCst);
        // Reads a (it exists), assumes b: one read, then one commit that wins the first time.
        let committed = ledger
            .unit_of_work()
            .assume_new()
            .run(|snapshot, changes| -> Result<u64, Undecided<OverLimit>> {
                runs.fetch_add(1, Ordering::SeqCst);
                let read: Counter = snapshot.read(&a)?;
                let assumed: Counter = snapshot.state(&b)?;
                changes.decided(&a, &read, &[Added(1)], &metadata());
                changes.decided(&b, &assumed, &[Added(read.total)], &metadata());
                Ok(read.total)
            })
            .await
            .unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 2, "one read, one decision");
        assert_eq!((committed.value, committed.attempts), (4, 1));
        assert_eq!(total(&ledger, &a).await, 5);
        assert_eq!(total(&ledger, &b).await, 4);
        assert!(Snapshot::assuming_new().read::<Counter>(&a).is_err());
    }

    #[test]
    fn changes_staged_apart_follow_what_was_staged_first() {
        let (a, b, c) = (stream("a"), stream("b"), stream("c"));
        let mut later = Changes::default();
        later.decided(&b, &Counter::default(), &[Added(2)], &metadata());
        later.note(&c, &[Added(3)], &metadata());
        let mut changes = Changes::default();
        changes.decided(&a, &Counter::default(), &[Added(1)], &metadata());
        changes.extend(later);
        assert_eq!(changes.streams(), vec![&a, &b, &c]);
        assert_eq!(
            changes.staged::<Added>(&c),
            Some((ExpectedVersion::Any, vec![Added(3)]))
        );
    }

    #[test]
    fn staged_events_read_back_as_they_were_decided() {
        let a = stream("a");
        let given = Snapshot::new().given::<Counter>(a.clone(), &[Added(4), Added(1)]);
        let counter: Counter = given.state(&a).unwrap();
        assert_eq!(
            counter,
            Counter {
                total: 5,
                version: 2
            }
        );
        assert!(given.state::<Counter>(&stream("b")).is_err());
        assert_eq!(
            Snapshot::assuming_new().state::<Counter>(&a).unwrap(),
            Counter::default()
        );
        let mut changes = Changes::default();
        changes.decided(&a, &counter, &[Added(2)], &metadata());
        changes.note::<Added>(&stream("b"), &[], &metadata());
        assert_eq!(changes.streams(), vec![&a]);
        assert_eq!(
            changes.staged::<Added>(&a),
            Some((ExpectedVersion::Exact(2), vec![Added(2)]))
        );
    }
}
