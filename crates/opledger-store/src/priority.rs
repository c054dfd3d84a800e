//! Who goes first on a ledger shared inside one process: foreground work, which someone is
//! waiting on (an update to acknowledge, an operation to accept), before background work that
//! can wait (the worker's steps, the read models' pages).
//!
//! Both kinds share the one writer, the read pools and the machine's cores. Background work
//! that runs flat out while updates arrive takes their turn in every group commit and their
//! share of the CPU: acknowledgements slow down and their tail grows. So a background task
//! asks for its turn before each unit of work; it gets it at once while no foreground work is
//! in flight, else when the last one finishes, and at the latest after the longest wait it
//! names, so that it always progresses (at least one unit per such wait per task, however busy
//! the intake). Units that had to wait run one at a time, so that those woken by the same quiet
//! moment do not all fall on the next update together.
//!
//! It is off until [`Priority::put_foreground_first`] turns it on (`opledger serve` does): it
//! trades throughput for latency. Background work that waits is work done later, one unit at
//! a time, so the end-to-end rate of operations drops where intake and worker share a
//! process (the lifecycle benchmark: 14–26% on PostgreSQL) while acknowledgements get faster.
//!
//! The priority is per process: another process's intake on the same PostgreSQL database does
//! not hold this process's worker back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// The priority of foreground over background work on one store. Cheap to clone; clones share
/// the count.
#[derive(Clone, Debug)]
pub struct Priority {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    on: AtomicBool,
    in_flight: AtomicUsize,
    quiet: Notify,
    /// Background units that had to wait go one at a time: those woken by the same quiet
    /// moment do not all fall on the next update together.
    one_at_a_time: Arc<Semaphore>,
}

/// A background unit's turn, from [`Priority::background`] until it is dropped: hold it while
/// the unit runs.
#[derive(Debug)]
#[must_use = "hold the turn while the background unit runs"]
pub struct Turn {
    _one_at_a_time: Option<OwnedSemaphorePermit>,
    busy: bool,
}

impl Turn {
    /// Whether foreground work was still in flight when the turn came (the wait ran out).
    pub fn busy(&self) -> bool {
        self.busy
    }
}

impl Default for Priority {
    fn default() -> Self {
        Self {
            shared: Arc::new(Shared {
                on: AtomicBool::new(false),
                in_flight: AtomicUsize::new(0),
                quiet: Notify::new(),
                one_at_a_time: Arc::new(Semaphore::new(1)),
            }),
        }
    }
}

/// Foreground work in flight, from [`Priority::foreground`] until it is dropped.
#[derive(Debug)]
#[must_use = "foreground work is in flight only while the guard is held"]
pub struct Foreground {
    shared: Arc<Shared>,
}

impl Priority {
    /// The longest the worker's steps and the read models' pages wait for their turn: under a
    /// flood of updates each of their tasks still does a unit this often.
    pub const WAIT: Duration = Duration::from_millis(50);

    /// Turns the priority on (or off again): from now on background work waits its turn.
    pub fn put_foreground_first(&self, on: bool) {
        self.shared.on.store(on, Ordering::Release);
    }

    /// Marks foreground work in flight until the guard is dropped.
    pub fn foreground(&self) -> Foreground {
        self.shared.in_flight.fetch_add(1, Ordering::AcqRel);
        Foreground {
            shared: Arc::clone(&self.shared),
        }
    }

    /// How many foreground units are in flight now.
    fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Acquire)
    }

    /// Whether background work asking now would have to wait: the priority is on and
    /// foreground work is in flight.
    pub fn holds_back(&self) -> bool {
        self.shared.on.load(Ordering::Acquire) && self.in_flight() > 0
    }

    /// Waits for a background task's turn: at once while the priority is off or no foreground
    /// work is in flight, else when there is none any more, or after `longest` (the worker and
    /// the read models wait [`Priority::WAIT`]), whichever comes first; a unit that had to wait
    /// then runs while no other such unit does.
    pub async fn background(&self, longest: Duration) -> Turn {
        let shared = &self.shared;
        let quiet = shared.quiet.notified();
        tokio::pin!(quiet);
        // Registered before the count is read, so the last guard's wake-up cannot fall between.
        quiet.as_mut().enable();
        if !self.holds_back() {
            return Turn {
                _one_at_a_time: None,
                busy: false,
            };
        }
        let busy = tokio::time::timeout(longest, quiet).await.is_err();
        let permit = Arc::clone(&shared.one_at_a_time)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        Turn {
            _one_at_a_time: Some(permit),
            busy,
        }
    }
}

impl Drop for Foreground {
    fn drop(&mut self) {
        if self.shared.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.shared.quiet.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    fn first() -> Priority {
        let priority = Priority::default();
        priority.put_foreground_first(true);
        priority
    }

    #[tokio::test(start_paused = true)]
    async fn background_work_goes_at_once_while_no_foreground_work_is_in_flight() {
        let priority = first();
        let started = tokio::time::Instant::now();
        let first = priority.background(MINUTE).await;
        drop(priority.foreground());
        let second = priority.background(MINUTE).await;
        assert!(
            !first.busy() && !second.busy(),
            "both ran together, at once"
        );
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn background_work_waits_for_the_last_foreground_unit_to_finish() {
        let priority = first();
        let first = priority.foreground();
        let second = priority.clone().foreground();
        let waiting = tokio::spawn({
            let priority = priority.clone();
            async move {
                let started = tokio::time::Instant::now();
                let turn = priority.background(MINUTE).await;
                (turn.busy(), started.elapsed())
            }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(first);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            !waiting.is_finished(),
            "one foreground unit is still in flight"
        );
        assert_eq!(priority.in_flight(), 1);
        drop(second);
        let (busy, waited) = waiting.await.expect("task");
        assert!(!busy, "its turn came because the foreground went quiet");
        assert_eq!(waited, Duration::from_secs(2));
        assert_eq!(priority.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn background_work_waits_no_longer_than_it_says_however_busy_the_foreground() {
        let priority = first();
        let _busy = priority.foreground();
        let started = tokio::time::Instant::now();
        for _ in 0..3 {
            assert!(priority.background(Duration::from_millis(50)).await.busy());
        }
        assert_eq!(started.elapsed(), Duration::from_millis(150));
        assert!(priority.background(Duration::ZERO).await.busy());
        assert_eq!(started.elapsed(), Duration::from_millis(150));
    }

    #[tokio::test(start_paused = true)]
    async fn units_that_waited_run_one_at_a_time() {
        let priority = first();
        let busy = priority.foreground();
        assert!(priority.holds_back());
        let first = priority.background(Duration::from_millis(50)).await;
        let second = tokio::spawn({
            let priority = priority.clone();
            async move { priority.background(Duration::from_millis(50)).await.busy() }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!second.is_finished(), "the first unit still holds its turn");
        drop(first);
        assert!(second.await.expect("task"));
        drop(busy);
    }

    #[tokio::test(start_paused = true)]
    async fn off_it_never_holds_background_work_back() {
        let priority = Priority::default();
        let busy = priority.foreground();
        let started = tokio::time::Instant::now();
        let first = priority.background(MINUTE).await;
        let second = priority.background(MINUTE).await;
        assert!(!first.busy() && !second.busy());
        assert!(!priority.holds_back());
        assert_eq!(started.elapsed(), Duration::ZERO);
        drop(busy);
    }
}
