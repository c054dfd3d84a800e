//! Where an append's time goes, in this process: how long each call waited in the group
//! commit's queue before its batch began, and how long that batch took to write and commit.
//!
//! A slow acknowledgement is one of the two, and they have different causes: a long wait means
//! the batch ahead was slow, the writer's upkeep between batches took long (SQLite finishing a
//! checkpoint), or the queue was long (a crowd, or background work's appends sharing the
//! writer); a long write means the database was slow to run the batch or to make
//! it durable (its CPU shared with other work, a disk stalling its sync). Operators read both
//! from `/metrics`, the load benchmark reports their tail at a quarter of the closed-loop rate.
//!
//! Fixed buckets and atomic counters: recording is a few relaxed additions per call on the
//! appender's path, and a snapshot never blocks it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The upper bounds of the buckets, in seconds: from a quarter of a millisecond (a batch on an
/// idle machine) to seconds (a stalled disk). Values above the last go in a `+Inf` bucket.
pub const BUCKETS: [f64; 17] = [
    0.000_25, 0.000_5, 0.001, 0.002, 0.003, 0.005, 0.007_5, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5,
];

/// One histogram of durations with the fixed [`BUCKETS`].
#[derive(Debug, Default)]
struct Histogram {
    /// One count per bucket, the last for values above every bound.
    counts: [AtomicU64; BUCKETS.len() + 1],
    sum_micros: AtomicU64,
}

impl Histogram {
    fn observe(&self, duration: Duration) {
        let seconds = duration.as_secs_f64();
        let bucket = BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(BUCKETS.len());
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(duration.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    fn snapshot(&self) -> Latencies {
        Latencies {
            counts: self
                .counts
                .iter()
                .map(|count| count.load(Ordering::Relaxed))
                .collect(),
            sum: Duration::from_micros(self.sum_micros.load(Ordering::Relaxed)),
        }
    }
}

/// The append timings of one store (shared by its clones and [`for_background`] handles).
///
/// [`for_background`]: crate::AnyStore::for_background
#[derive(Debug, Default)]
pub struct AppendTimings {
    wait: Histogram,
    write: Histogram,
    /// Batches written (transactions committed); each append is one value of each histogram.
    batches: AtomicU64,
}

impl AppendTimings {
    /// Records one batch of `calls`: each call's wait (from when it was queued until `began`)
    /// and the batch's write (from `began` to `ended`), once per call, since every caller waits
    /// for it.
    pub(crate) fn record_batch(
        &self,
        queued: impl IntoIterator<Item = std::time::Instant>,
        began: std::time::Instant,
        ended: std::time::Instant,
    ) {
        let write = ended.saturating_duration_since(began);
        self.batches.fetch_add(1, Ordering::Relaxed);
        for queued in queued {
            self.wait.observe(began.saturating_duration_since(queued));
            self.write.observe(write);
        }
    }

    /// How many batches were written so far: with the appends (either histogram's count), how
    /// many appends a commit carried.
    pub fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }

    /// Each call's wait in the queue until its batch began, so far.
    pub fn wait(&self) -> Latencies {
        self.wait.snapshot()
    }

    /// Each call's batch write, from its start to its commit, so far.
    pub fn write(&self) -> Latencies {
        self.write.snapshot()
    }
}

/// A snapshot of one histogram: counts per bucket of [`BUCKETS`] (not cumulative), the last
/// for values above every bound, and the sum of the values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Latencies {
    pub counts: Vec<u64>,
    pub sum: Duration,
}

impl Latencies {
    /// How many values were recorded.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The values recorded since `earlier`, a snapshot of the same histogram.
    pub fn since(&self, earlier: &Latencies) -> Latencies {
        Latencies {
            counts: self
                .counts
                .iter()
                .zip(&earlier.counts)
                .map(|(now, then)| now.saturating_sub(*then))
                .collect(),
            sum: self.sum.saturating_sub(earlier.sum),
        }
    }

    /// The upper bound of the bucket that holds the `quantile` (0 to 1) of the values, in
    /// seconds: the value is at most that. Infinite when it lies above every bound; `None` when
    /// nothing was recorded.
    pub fn quantile_bound(&self, quantile: f64) -> Option<f64> {
        let count = self.count();
        if count == 0 {
            return None;
        }
        // The rank of the value, 1-based: the smallest that covers the quantile.
        let rank = ((quantile.clamp(0.0, 1.0) * count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (bucket, counted) in self.counts.iter().enumerate() {
            seen += counted;
            if seen >= rank {
                return Some(BUCKETS.get(bucket).copied().unwrap_or(f64::INFINITY));
            }
        }
        Some(f64::INFINITY)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn ms(millis: f64) -> Duration {
        Duration::from_micros((millis * 1e3).round() as u64)
    }

    /// Each call's wait is its own, the batch's write is counted once per call, and a value
    /// on a bound falls in that bound's bucket.
    #[test]
    fn a_batch_records_each_calls_wait_and_its_write_once_per_call() {
        let timings = AppendTimings::default();
        let began = Instant::now();
        let queued = [began - ms(1.0), began - ms(4.0), began];
        timings.record_batch(queued, began, began + ms(7.0));

        let wait = timings.wait();
        assert_eq!(wait.count(), 3);
        // 0 ms and 1 ms in the buckets up to 0.25 ms and 1 ms; 4 ms in the one up to 5 ms.
        assert_eq!(wait.counts[0], 1);
        assert_eq!(wait.counts[2], 1);
        assert_eq!(wait.counts[5], 1);
        assert_eq!(wait.sum, ms(5.0));

        let write = timings.write();
        assert_eq!(write.count(), 3);
        assert_eq!(write.counts[6], 3, "7 ms is in the bucket up to 7.5 ms");
        assert_eq!(write.sum, ms(21.0));
        assert_eq!(timings.batches(), 1, "three appends, one commit");
    }

    /// The quantile's bucket bound, from a difference of two snapshots: what a run saw, not
    /// what came before it.
    #[test]
    fn a_quantile_is_the_bound_of_its_bucket_over_the_values_since_a_snapshot() {
        let timings = AppendTimings::default();
        let began = Instant::now();
        // Before: slow writes, which the difference leaves out.
        for _ in 0..50 {
            timings.record_batch([began], began, began + ms(40.0));
        }
        let before = timings.write();
        for _ in 0..98 {
            timings.record_batch([began], began, began + ms(0.8));
        }
        timings.record_batch([began], began, began + ms(12.0));
        timings.record_batch([began], began, began + ms(3_000.0));

        let run = timings.write().since(&before);
        assert_eq!(run.count(), 100);
        assert_eq!(run.quantile_bound(0.5), Some(0.001));
        assert_eq!(run.quantile_bound(0.98), Some(0.001));
        assert_eq!(run.quantile_bound(0.99), Some(0.015));
        assert_eq!(run.quantile_bound(1.0), Some(f64::INFINITY));
        assert_eq!(AppendTimings::default().wait().quantile_bound(0.99), None);
    }
}
