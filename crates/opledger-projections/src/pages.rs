//! The last page of the ledger that a [`crate::Projector`] read, shared by its projections.
//!
//! Every asynchronous projection follows the same global order, and they mostly stand at the
//! same position: each woken by the same appends, each reading the same events. [`Pages`]
//! keeps the last page read, so that the others take their page from it instead of reading and
//! decoding the same rows again (one read of the ledger per page, not one per projection).
//! Committed events never change, so a kept page is never stale: a projection served from it
//! may get fewer events than were committed since (the rest comes with its next page), never
//! other ones. A position the kept page does not hold (a projection behind the others, or one
//! ahead of it) is read from the store, and that page is kept instead.

use std::future::Future;
use std::ops::{Deref, Range};
use std::sync::Arc;

use opledger_store::RecordedEvent;

use crate::error::ProjectorError;

/// The last page read (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct Pages {
    /// Held across a read, so that projections woken together read the ledger once.
    last: tokio::sync::Mutex<Option<Arc<Vec<RecordedEvent>>>>,
}

/// Contiguous events from one position: part of a kept page.
#[derive(Debug)]
pub(crate) struct Page {
    events: Arc<Vec<RecordedEvent>>,
    range: Range<usize>,
}

impl Deref for Page {
    type Target = [RecordedEvent];

    fn deref(&self) -> &[RecordedEvent] {
        &self.events[self.range.clone()]
    }
}

impl Pages {
    /// The events from `from` on, at most `limit`: from the kept page if it holds `from`, else
    /// from `read(from, limit)`, whose page (contiguous from `from`) is kept if not empty.
    pub(crate) async fn page<F, R>(
        &self,
        from: u64,
        limit: usize,
        read: R,
    ) -> Result<Page, ProjectorError>
    where
        R: FnOnce(u64, usize) -> F,
        F: Future<Output = Result<Vec<RecordedEvent>, ProjectorError>>,
    {
        let mut last = self.last.lock().await;
        if let Some(events) = last.as_ref()
            && let Some(range) = holding(events, from, limit)
        {
            return Ok(Page {
                events: Arc::clone(events),
                range,
            });
        }
        let events = Arc::new(read(from, limit).await?);
        let range = 0..events.len();
        if !events.is_empty() {
            *last = Some(Arc::clone(&events));
        }
        Ok(Page { events, range })
    }
}

/// Where `from` and the at most `limit` events after it lie in `events`, if `from` is there.
fn holding(events: &[RecordedEvent], from: u64, limit: usize) -> Option<Range<usize>> {
    let first = events.first()?.position;
    let start = usize::try_from(from.checked_sub(first)?).ok()?;
    if start >= events.len() {
        return None;
    }
    Some(start..events.len().min(start.saturating_add(limit)))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use chrono::DateTime;
    use opledger_store::{Hash, StreamId, event_id};

    use super::*;

    /// A ledger of events at positions `1..=head` behind a [`Pages`], counting the reads.
    struct Fixture {
        head: Mutex<u64>,
        reads: AtomicUsize,
        pages: Pages,
    }

    impl Fixture {
        fn new(head: u64) -> Self {
            Self {
                head: Mutex::new(head),
                reads: AtomicUsize::new(0),
                pages: Pages::default(),
            }
        }

        /// Appends events up to `head`.
        fn grow(&self, head: u64) {
            *self.head.lock().unwrap() = head;
        }

        /// The positions of the page from `from`, read as the store reads them if not kept.
        async fn page(&self, from: u64, limit: usize) -> Vec<u64> {
            let head = *self.head.lock().unwrap();
            let page = self
                .pages
                .page(from, limit, |from, limit| {
                    self.reads.fetch_add(1, Ordering::SeqCst);
                    let end = head.min(from + limit as u64 - 1);
                    std::future::ready(Ok((from..=end).map(event).collect()))
                })
                .await
                .expect("a page");
            page.iter().map(|e| e.position).collect()
        }

        fn reads(&self) -> usize {
            self.reads.load(Ordering::SeqCst)
        }
    }

    fn event(position: u64) -> RecordedEvent {
        let stream_id = StreamId::new(format!("s-{position}")).expect("a stream id");
        RecordedEvent {
            position,
            event_id: event_id(&stream_id, 1),
            stream_id,
            version: 1,
            event_type: "Tested".into(),
            schema_version: 1,
            payload: b"{}".to_vec(),
            metadata: b"{}".to_vec(),
            recorded_at: DateTime::UNIX_EPOCH,
            prev_hash: Hash([0; 32]),
            hash: Hash([0; 32]),
        }
    }

    #[tokio::test]
    async fn projections_at_the_same_position_read_the_ledger_once() {
        let ledger = Fixture::new(10);
        for _ in 0..4 {
            assert_eq!(ledger.page(1, 100).await, (1..=10).collect::<Vec<_>>());
        }
        assert_eq!(ledger.reads(), 1);
    }

    #[tokio::test]
    async fn a_position_inside_the_kept_page_gets_the_rest_of_it_up_to_the_limit() {
        let ledger = Fixture::new(10);
        ledger.page(3, 100).await;
        assert_eq!(ledger.page(5, 100).await, (5..=10).collect::<Vec<_>>());
        assert_eq!(ledger.page(4, 2).await, vec![4, 5]);
        assert_eq!(ledger.reads(), 1);
    }

    #[tokio::test]
    async fn a_position_outside_the_kept_page_is_read_and_that_page_is_kept() {
        let ledger = Fixture::new(10);
        ledger.page(5, 3).await; // 5..=7 kept
        assert_eq!(ledger.page(2, 3).await, vec![2, 3, 4]);
        assert_eq!(ledger.page(8, 3).await, vec![8, 9, 10]);
        assert_eq!(ledger.reads(), 3);
        // The last page read is the one kept.
        assert_eq!(ledger.page(9, 3).await, vec![9, 10]);
        assert_eq!(ledger.reads(), 3);
    }

    #[tokio::test]
    async fn past_the_kept_page_the_ledger_is_read_again_and_an_empty_page_is_not_kept() {
        let ledger = Fixture::new(4);
        ledger.page(1, 100).await;
        // Caught up: nothing after 4 yet, and the empty answers do not replace 1..=4.
        assert!(ledger.page(5, 100).await.is_empty());
        assert!(ledger.page(5, 100).await.is_empty());
        assert_eq!(ledger.reads(), 3);
        assert_eq!(ledger.page(2, 100).await, vec![2, 3, 4]);
        assert_eq!(ledger.reads(), 3);
        // Events appended since are read, not missed because a shorter page was kept.
        ledger.grow(6);
        assert_eq!(ledger.page(5, 100).await, vec![5, 6]);
        assert_eq!(ledger.reads(), 4);
    }

    #[tokio::test]
    async fn a_failed_read_keeps_nothing_and_reports_the_error() {
        let ledger = Fixture::new(3);
        let failed = ledger
            .pages
            .page(1, 10, |expected, _| {
                std::future::ready(Err(ProjectorError::Gap {
                    expected,
                    found: expected + 1,
                }))
            })
            .await;
        assert!(matches!(
            failed,
            Err(ProjectorError::Gap { expected: 1, .. })
        ));
        assert_eq!(ledger.page(1, 10).await, vec![1, 2, 3]);
        assert_eq!(ledger.reads(), 1);
    }
}
