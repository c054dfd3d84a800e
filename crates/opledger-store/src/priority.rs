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
//! The worker's steps are work someone waits for too (a coupon, a reply): they yield only to
//! a crowded foreground ([`Priority::uncrowded`]: [`Priority::CROWD`] units in flight at once,
//! until [`Priority::CROWDED_FOR`] after the crowd broke up), so that the worker keeps up
//! whenever intake has room to spare. Waiting for every quiet moment instead held it to about
//! one step per task per wait under any steady stream of updates: on PostgreSQL ~270
//! operations/s (~100 with the read models on) while 1,700–2,500 updates/s arrived, a quarter
//! of what intake takes, so it fell behind for good (ADR 0021).
//! The read models' pages yield to any foreground work in flight ([`Priority::page`]): a page
//! covers up to a thousand events, so they keep up with few turns. On PostgreSQL, while the
//! foreground is crowded, a page waits up to a second, not [`Priority::WAIT`]: under a flood
//! the read models' work (the database server's CPU above all) moves to when it eases, and
//! they fall behind meanwhile by what arrives, catching up within seconds after (ADR 0025).
//!
//! It is off until [`Priority::put_foreground_first`] turns it on (`opledger serve` does): it
//! trades throughput for latency. Background work that waits is work done later, one unit at
//! a time, so the end-to-end rate of operations drops where intake and worker share a
//! process (the lifecycle benchmark: 14–26% on PostgreSQL) while acknowledgements get faster.
//!
//! The priority is per process: another process's intake on the same PostgreSQL database does
//! not hold this process's worker back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

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
    /// When the last crowd broke up (fell below [`Priority::CROWD`] units in flight), in
    /// microseconds since `epoch` (0: never). A crowd still there is read from `in_flight`.
    crowded_at: AtomicU64,
    epoch: Instant,
}

impl Shared {
    /// Microseconds since `epoch`, never 0.
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// How long the foreground stays crowded from now: zero when it is not.
    fn crowded_for(&self) -> Duration {
        if self.in_flight.load(Ordering::Acquire) >= Priority::CROWD {
            return Priority::CROWDED_FOR;
        }
        let at = self.crowded_at.load(Ordering::Acquire);
        if at == 0 {
            return Duration::ZERO;
        }
        let until = at.saturating_add(duration_micros(Priority::CROWDED_FOR));
        Duration::from_micros(until.saturating_sub(self.now()))
    }
}

fn duration_micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
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
    /// Whether foreground work was still in flight (or crowded) when the turn came: the wait
    /// ran out.
    pub fn busy(&self) -> bool {
        self.busy
    }

    /// A turn that did not wait: it runs beside any other.
    fn at_once() -> Self {
        Turn {
            _one_at_a_time: None,
            busy: false,
        }
    }

    /// A turn after a wait: it runs while no other unit that waited does.
    async fn after_waiting(shared: &Shared, busy: bool) -> Self {
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

impl Default for Priority {
    fn default() -> Self {
        Self {
            shared: Arc::new(Shared {
                on: AtomicBool::new(false),
                in_flight: AtomicUsize::new(0),
                quiet: Notify::new(),
                one_at_a_time: Arc::new(Semaphore::new(1)),
                crowded_at: AtomicU64::new(0),
                epoch: Instant::now(),
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

    /// Foreground units in flight at once that make the foreground crowded: updates arrive
    /// faster than they are recorded and queue up. Four fifths of the 40 connections Telegram
    /// opens to a webhook by default: a flood fills them, while at a quarter of what intake can
    /// take a few updates are in flight at a time (the load benchmark's 64 senders: all of them
    /// at full speed, rarely more than 20 paced at a quarter).
    pub const CROWD: usize = 32;

    /// The longest a read model's page on PostgreSQL waits for its turn while the foreground
    /// is crowded ([`Priority::page`]).
    pub const CROWDED_PAGE_WAIT: Duration = Duration::from_secs(1);

    /// How long the foreground counts as crowded after it last was: longer than one round of
    /// a full group commit, so that a flood does not look quiet between two batches.
    pub const CROWDED_FOR: Duration = Duration::from_millis(20);

    /// Turns the priority on (or off again): from now on background work waits its turn
    /// (the read models' pages while any foreground work is in flight, the worker's steps
    /// while the foreground is crowded).
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

    /// Whether background work that should yield only to a crowded foreground would have to
    /// wait now: the priority is on and [`Priority::CROWD`] foreground units were in flight at
    /// once within the last [`Priority::CROWDED_FOR`].
    pub fn crowded(&self) -> bool {
        self.shared.on.load(Ordering::Acquire) && !self.shared.crowded_for().is_zero()
    }

    /// Waits for the turn of a background unit that yields only to a crowded foreground (the
    /// worker's steps: work someone waits for too, which must keep up whenever intake has room
    /// to spare): at once unless [`Priority::crowded`], else when the crowd has gone, or after
    /// `longest`, whichever comes first; a unit that had to wait then runs while no other such
    /// unit does.
    pub async fn uncrowded(&self, longest: Duration) -> Turn {
        if !self.crowded() {
            return Turn::at_once();
        }
        let deadline = Instant::now() + longest;
        let busy = loop {
            let left = self.shared.crowded_for();
            if left.is_zero() {
                break false;
            }
            if Instant::now() + left >= deadline {
                tokio::time::sleep_until(deadline).await;
                break self.crowded();
            }
            tokio::time::sleep(left).await;
        };
        Turn::after_waiting(&self.shared, busy).await
    }

    /// Waits for the turn of a read model's page on PostgreSQL (ADR 0025): as
    /// [`Priority::background`] for at most [`Priority::WAIT`], or for at most
    /// [`Priority::CROWDED_PAGE_WAIT`] while the foreground is [`Priority::crowded`].
    pub async fn page(&self) -> Turn {
        let longest = if self.crowded() {
            Self::CROWDED_PAGE_WAIT
        } else {
            Self::WAIT
        };
        self.background(longest).await
    }

    /// Waits for a background task's turn: at once while the priority is off or no foreground
    /// work is in flight, else when there is none any more, or after `longest` (the read models
    /// wait [`Priority::WAIT`]), whichever comes first; a unit that had to wait then runs while
    /// no other such unit does.
    pub async fn background(&self, longest: Duration) -> Turn {
        let shared = &self.shared;
        let quiet = shared.quiet.notified();
        tokio::pin!(quiet);
        // Registered before the count is read, so the last guard's wake-up cannot fall between.
        quiet.as_mut().enable();
        if !self.holds_back() {
            return Turn::at_once();
        }
        let busy = tokio::time::timeout(longest, quiet).await.is_err();
        Turn::after_waiting(shared, busy).await
    }
}

impl Drop for Foreground {
    fn drop(&mut self) {
        let shared = &self.shared;
        match shared.in_flight.fetch_sub(1, Ordering::AcqRel) {
            1 => shared.quiet.notify_waiters(),
            // The crowd breaks up: it counts as crowded for `CROWDED_FOR` from now.
            n if n == Priority::CROWD => {
                shared.crowded_at.store(shared.now(), Ordering::Release);
            }
            _ => {}
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
        let waiting = waiting(&priority, false, MINUTE);
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
        let second = waiting(&priority, false, Duration::from_millis(50));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!second.is_finished(), "the first unit still holds its turn");
        drop(first);
        assert!(second.await.expect("task").0);
        drop(busy);
    }

    /// A task waiting for a turn (at most `longest`), as the worker does when `crowd_only`,
    /// else as the read models do: whether the turn came busy, and after how long.
    fn waiting(
        priority: &Priority,
        crowd_only: bool,
        longest: Duration,
    ) -> tokio::task::JoinHandle<(bool, Duration)> {
        let priority = priority.clone();
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let turn = if crowd_only {
                priority.uncrowded(longest).await
            } else {
                priority.background(longest).await
            };
            (turn.busy(), started.elapsed())
        })
    }

    /// `units` foreground units in flight until the guards are dropped.
    fn foreground_units(priority: &Priority, units: usize) -> Vec<Foreground> {
        (0..units).map(|_| priority.foreground()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn work_that_yields_to_a_crowd_goes_at_once_while_intake_has_room_to_spare() {
        let priority = first();
        let few = foreground_units(&priority, Priority::CROWD - 1);
        assert!(priority.holds_back(), "foreground work is in flight");
        assert!(!priority.crowded(), "but fewer than a crowd");
        let started = tokio::time::Instant::now();
        let first = priority.uncrowded(MINUTE).await;
        let second = priority.uncrowded(MINUTE).await;
        assert!(
            !first.busy() && !second.busy(),
            "both ran together, at once"
        );
        assert_eq!(started.elapsed(), Duration::ZERO);
        drop(few);
    }

    #[tokio::test(start_paused = true)]
    async fn a_crowd_holds_such_work_back_until_it_has_been_gone_a_while() {
        let priority = first();
        let crowd = foreground_units(&priority, Priority::CROWD);
        assert!(priority.crowded());
        let waiting = waiting(&priority, true, MINUTE);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiting.is_finished(), "the crowd is still there");
        drop(crowd);
        let one_left = priority.foreground();
        assert!(
            priority.crowded(),
            "a crowd that just broke up still counts"
        );
        let (busy, waited) = waiting.await.expect("task");
        assert!(!busy, "its turn came because the crowd had gone");
        assert_eq!(waited, Duration::from_secs(1) + Priority::CROWDED_FOR);
        assert!(!priority.crowded(), "one unit in flight is no crowd");
        drop(one_left);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lasting_crowd_holds_such_work_back_no_longer_than_it_says_one_unit_at_a_time() {
        let priority = first();
        let crowd = foreground_units(&priority, Priority::CROWD);
        let started = tokio::time::Instant::now();
        let first = priority.uncrowded(Duration::from_millis(50)).await;
        assert!(first.busy());
        assert_eq!(started.elapsed(), Duration::from_millis(50));
        let second = waiting(&priority, true, Duration::from_millis(50));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!second.is_finished(), "the first unit still holds its turn");
        drop(first);
        assert!(second.await.expect("task").0);
        drop(crowd);
    }

    #[tokio::test(start_paused = true)]
    async fn a_page_waits_longer_for_a_crowd_than_for_an_update_or_two() {
        let priority = first();
        let few = foreground_units(&priority, Priority::CROWD - 1);
        let started = tokio::time::Instant::now();
        assert!(priority.page().await.busy());
        assert_eq!(started.elapsed(), Priority::WAIT);
        let crowd = foreground_units(&priority, 1);
        let started = tokio::time::Instant::now();
        assert!(priority.page().await.busy());
        assert_eq!(started.elapsed(), Priority::CROWDED_PAGE_WAIT);
        // A crowd that goes quiet lets the page go at once.
        let page = {
            let priority = priority.clone();
            tokio::spawn(async move { priority.page().await.busy() })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!page.is_finished(), "the crowd is still there");
        drop((few, crowd));
        assert!(!page.await.expect("task"), "its turn came with the quiet");
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
        let crowd = foreground_units(&priority, Priority::CROWD);
        assert!(!priority.crowded());
        assert!(!priority.uncrowded(MINUTE).await.busy());
        assert!(!priority.page().await.busy());
        assert_eq!(started.elapsed(), Duration::ZERO);
        drop((busy, crowd));
    }
}
