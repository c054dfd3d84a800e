//! The `EventStore` trait every backend implements, and the head watch that wakes readers.

use std::future::Future;

use tokio::sync::watch;

use crate::error::StoreError;
use crate::model::{
    AppendRequest, Appended, Head, Position, RecordedEvent, StreamId, StreamInfo, StreamVersion,
};

/// An append-only, globally ordered, hash-chained event log with optimistic concurrency per
/// stream.
///
/// Guarantees every backend proves with the conformance suite (`tests/it/conformance`):
/// - all requests of one `append` call commit together or not at all;
/// - a request whose expected version does not match fails with
///   [`StoreError::VersionConflict`] and uses no position;
/// - positions are gapless and in commit order, so a reader that remembers the last position it
///   saw never skips an event;
/// - events are never updated or deleted (the database itself refuses);
/// - every event's hash links it to its predecessor (see [`crate::chain`]).
pub trait EventStore: Send + Sync {
    /// Appends events to one or more streams atomically.
    fn append(
        &self,
        requests: Vec<AppendRequest>,
    ) -> impl Future<Output = Result<Appended, StoreError>> + Send;

    /// Events of one stream with `version >= from_version`, in version order, at most `limit`.
    fn read_stream(
        &self,
        stream: &StreamId,
        from_version: StreamVersion,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<RecordedEvent>, StoreError>> + Send;

    /// Events with `position >= from`, in position order, at most `limit`.
    fn read_all(
        &self,
        from: Position,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<RecordedEvent>, StoreError>> + Send;

    /// The last committed position and hash (position 0 and the genesis hash when empty).
    fn head(&self) -> impl Future<Output = Result<Head, StoreError>> + Send;

    /// A stream's current version; 0 if it does not exist.
    fn stream_version(
        &self,
        stream: &StreamId,
    ) -> impl Future<Output = Result<StreamVersion, StoreError>> + Send;

    /// Streams in id order, starting after `after`, at most `limit`.
    fn list_streams(
        &self,
        after: Option<&StreamId>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<StreamInfo>, StoreError>> + Send;

    /// A wake-up for new events. It is a hint: readers still query by position, and also poll
    /// now and then, because another process may append to the same database.
    fn subscribe(&self) -> HeadWatch;
}

/// Wakes a reader when this process commits new events.
///
/// The value is the last position this process saw committed. It can lag behind the database
/// (other processes) and it never skips ahead of it, so it only ever says "look again".
#[derive(Clone, Debug)]
pub struct HeadWatch {
    receiver: watch::Receiver<Position>,
}

impl HeadWatch {
    pub(crate) fn new(receiver: watch::Receiver<Position>) -> Self {
        Self { receiver }
    }

    /// The last position this process knows to be committed.
    pub fn latest(&self) -> Position {
        *self.receiver.borrow()
    }

    /// Waits until a position after the last one this watch returned is committed and returns
    /// it; `None` once the store is closed.
    pub async fn changed(&mut self) -> Option<Position> {
        self.receiver.changed().await.ok()?;
        Some(*self.receiver.borrow_and_update())
    }
}
