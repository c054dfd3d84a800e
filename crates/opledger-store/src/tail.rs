//! Following the ledger: read pages in position order from a cursor, and wait for new events
//! when caught up.

use std::time::Duration;

use crate::error::{PositionGap, StoreError};
use crate::model::{Position, RecordedEvent};
use crate::store::{EventStore, HeadWatch};

/// A cursor over the global order that never skips an event.
///
/// It relies on the store's guarantee that positions are gapless and in commit order, and checks
/// it: an event whose position is not the next expected one is reported as
/// [`StoreError::Storage`] with a [`PositionGap`] source instead of being skipped.
#[derive(Debug)]
pub struct Tail<S> {
    store: S,
    next: Position,
    watch: HeadWatch,
    poll_interval: Duration,
}

impl<S: EventStore> Tail<S> {
    /// A tail whose first event will be the one at `from` (position 0 and 1 both mean "from the
    /// start").
    pub fn new(store: S, from: Position) -> Self {
        let watch = store.subscribe();
        Self {
            store,
            next: from.max(1),
            watch,
            poll_interval: Duration::from_millis(500),
        }
    }

    /// How often to look for events appended by other processes, which this process's wake-ups
    /// do not cover.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// The position of the next event this tail will return.
    pub fn next_position(&self) -> Position {
        self.next
    }

    /// The next events in order, at most `limit`; `None` if none arrived within `wait`.
    pub async fn next_page_within(
        &mut self,
        limit: usize,
        wait: Duration,
    ) -> Result<Option<Vec<RecordedEvent>>, StoreError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let events = self.store.read_all(self.next, limit).await?;
            if !events.is_empty() {
                for (event, expected) in events.iter().zip(self.next..) {
                    if event.position != expected {
                        return Err(StoreError::storage(
                            "following the ledger",
                            PositionGap {
                                expected,
                                found: event.position,
                            },
                        ));
                    }
                }
                self.next += events.len() as Position;
                return Ok(Some(events));
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let nap = self.poll_interval.min(deadline - now);
            tokio::select! {
                woke = self.watch.changed() => {
                    if woke.is_none() {
                        // The store closed its appender; only polling is left.
                        tokio::time::sleep(nap).await;
                    }
                }
                () = tokio::time::sleep(nap) => {}
            }
        }
    }

    /// The next events in order, at most `limit`, waiting as long as it takes.
    pub async fn next_page(&mut self, limit: usize) -> Result<Vec<RecordedEvent>, StoreError> {
        loop {
            if let Some(events) = self
                .next_page_within(limit, Duration::from_secs(3600))
                .await?
            {
                return Ok(events);
            }
        }
    }
}
